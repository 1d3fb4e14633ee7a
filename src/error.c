/*
 * error.c — the thread-local error message behind every al_status.
 *
 * A failing call stores its message here with al_error(); al_last_error() reads it. Messages are
 * truncated to the buffer (1 KiB), never allocated, so reporting an out-of-memory error cannot fail.
 */
#include "internal.h"
#include <stdio.h>

static _Thread_local char g_msg[1024];

const char *al_last_error(void) { return g_msg; }

void al_clear_error(void) { g_msg[0] = '\0'; }

const char *al_version(void) { return "0.1.0"; }

al_status al_error(al_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return status;
}

al_status al_error_prefix(al_status status, const char *context) {
    size_t lc = strlen(context) + 2, lm = strlen(g_msg);
    if (lc >= sizeof g_msg) return status;
    if (lc + lm >= sizeof g_msg) lm = sizeof g_msg - lc - 1;
    memmove(g_msg + lc, g_msg, lm);
    g_msg[lc + lm] = '\0';
    memcpy(g_msg, context, lc - 2);
    g_msg[lc - 2] = ':';
    g_msg[lc - 1] = ' ';
    return status;
}
