/*
 * tests/c/excess.h — the C tests' comparison against an oracle tensor: max over the elements of
 * |a - b| - tol |b| (so <= tol passes), with a NaN in a as +inf and an infinity in b matched exactly.
 * Any dtype and device (al_tensor_read_f64 stages through the host). A read failure (for instance a
 * different number of elements) is +inf, so the caller's check fails. Thread-safe: no harness state.
 */
#ifndef ATTNLAB_TESTS_EXCESS_H
#define ATTNLAB_TESTS_EXCESS_H

#include "attnlab.h"
#include <math.h>
#include <stdlib.h>

static double test_excess(const al_tensor *a, const al_tensor *b, double tol) {
    int64_t n = 1;
    for (int i = 0; i < b->ndim; i++) n *= b->size[i];
    double *x = malloc(sizeof(double) * (size_t)(n ? n : 1)), *y = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double worst = 0;
    if (!x || !y || al_tensor_read_f64(a, x, n) != AL_OK || al_tensor_read_f64(b, y, n) != AL_OK) worst = INFINITY;
    for (int64_t i = 0; i < n && worst < INFINITY; i++) {
        if (isinf(y[i])) {
            if (x[i] != y[i]) worst = INFINITY;
            continue;
        }
        const double e = isnan(x[i]) ? INFINITY : fabs(x[i] - y[i]) - tol * fabs(y[i]);
        if (e > worst) worst = e;
    }
    free(x);
    free(y);
    return worst;
}

#endif /* ATTNLAB_TESTS_EXCESS_H */
