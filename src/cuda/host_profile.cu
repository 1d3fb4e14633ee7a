/* host_profile.cu — the stage accumulators of host_profile.h (ATTNLAB_HOST_PROFILE=1). */
#include "host_profile.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t g_hp_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_hp_on = -1;

static int env_set(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

int al_hprof_on(void) {
    int v = __atomic_load_n(&g_hp_on, __ATOMIC_RELAXED);
    if (v < 0) {
        v = env_set("ATTNLAB_HOST_PROFILE") || env_set("ATTNLAB_FUSED_PROFILE");
        __atomic_store_n(&g_hp_on, v, __ATOMIC_RELAXED);
    }
    return v;
}

double al_hprof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

void al_hprof_add(al_hprof *p, const double *t) {
    pthread_mutex_lock(&g_hp_lock);
    for (int i = 0; i < p->n && i < AL_HPROF_MAX; i++) p->ns[i] += t[i + 1] - t[i];
    p->calls++;
    pthread_mutex_unlock(&g_hp_lock);
}

size_t al_hprof_format(al_hprof *p, char *buf, size_t u, size_t n) {
    pthread_mutex_lock(&g_hp_lock);
    const int64_t calls = p->calls;
    double ns[AL_HPROF_MAX];
    memcpy(ns, p->ns, sizeof ns);
    pthread_mutex_unlock(&g_hp_lock);
    if (!buf || calls <= 0 || u >= n) return u;
    double total = 0;
    for (int i = 0; i < p->n; i++) total += ns[i];
    int w = snprintf(buf + u, n - u, "\nhost profile (ATTNLAB_HOST_PROFILE=1), %s: %lld calls, us per call: total %.2f =",
                     p->what, (long long)calls, total / 1e3 / (double)calls);
    if (w > 0) u += (size_t)w;
    for (int i = 0; i < p->n && u < n; i++) {
        w = snprintf(buf + u, n - u, " %s %.2f", p->names[i], ns[i] / 1e3 / (double)calls);
        if (w > 0) u += (size_t)w;
    }
    return u < n ? u : n - 1;
}
