/*
 * test_main.h — the tiny C test harness of tests/c/.
 *
 *   static void test_select(void) { ...; CHECK(x == 3, "x is %d", x); CHECK_OK(al_tensor_select(...)); }
 *   int main(void) { RUN(test_select); ...; return SUMMARY("tensor"); }
 *
 * A test (one RUN) passes when none of its CHECKs failed. SUMMARY prints
 * "c-test <name>: N passed, N failed" (scripts/tally.sh adds these lines up) and returns the exit code.
 */
#ifndef ATTNLAB_TEST_MAIN_H
#define ATTNLAB_TEST_MAIN_H

#include "attnlab.h"
#include <stdio.h>
#include <string.h>

static int t_passed, t_failed, t_current_failed;
static const char *t_current = "";

#define CHECK(cond, ...)                                                             \
    do {                                                                             \
        if (!(cond)) {                                                               \
            if (!t_current_failed) fprintf(stderr, "FAIL %s\n", t_current);          \
            t_current_failed = 1;                                                    \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fprintf(stderr, "\n");                                                   \
        }                                                                            \
    } while (0)

/* Expect AL_OK; on failure show the library's message. */
#define CHECK_OK(expr)                                                               \
    do {                                                                             \
        al_status t_st_ = (expr);                                                    \
        CHECK(t_st_ == AL_OK, "%s returned %d: %s", #expr, (int)t_st_, al_last_error()); \
    } while (0)

/* Expect a given failure status whose message contains `needle`. */
#define CHECK_ERR(expr, status, needle)                                              \
    do {                                                                             \
        al_status t_st_ = (expr);                                                    \
        CHECK(t_st_ == (status), "%s returned %d, expected %d (%s)", #expr, (int)t_st_, (int)(status), \
              al_last_error());                                                      \
        CHECK(strstr(al_last_error(), (needle)) != NULL, "message '%s' lacks '%s'", al_last_error(), (needle)); \
    } while (0)

#define RUN(fn)                                   \
    do {                                          \
        t_current = #fn;                          \
        t_current_failed = 0;                     \
        fn();                                     \
        if (t_current_failed) t_failed++;         \
        else t_passed++;                          \
    } while (0)

#define SUMMARY(name) \
    (printf("c-test %s: %d passed, %d failed\n", (name), t_passed, t_failed), t_failed ? 1 : 0)

#endif
