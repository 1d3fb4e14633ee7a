/*
 * cpu_math.h — the CPU implementations of the Math section (src/cpu/elementwise.c, reduce.c,
 * softmax.c, matmul.c), called by the front door src/math.c after it has validated the arguments.
 *
 * The contract is the CUDA plugin's (src/cuda_plugin.h), so one front door serves both devices:
 *   - element-wise: `out` is a fresh contiguous tensor; inputs are already expanded to out's shape
 *     (stride 0 where broadcast) and may have any strides and any dtypes.
 *   - reductions: `out` has a's ndim with every reduced dim of extent 1 (the keepdim form).
 *   - matmul: a [B..., m, k], b [B..., k, n], out [B..., m, n] contiguous, same ndim >= 2 and
 *     same batch extents (stride 0 where broadcast); float dtypes only.
 * Also a small helper to start an al_iter in the middle of its walk, so OpenMP threads can each
 * take a contiguous range of row-major positions.
 */
#ifndef ATTNLAB_CPU_MATH_H
#define ATTNLAB_CPU_MATH_H

#include "internal.h"

/* Below this many elements a loop runs on one thread (thread start-up would cost more). */
#define AL_CPU_PAR_MIN 32768

al_status al_cpu_unary(int32_t op, al_tensor *out, const al_tensor *a);
al_status al_cpu_binary(int32_t op, al_tensor *out, const al_tensor *a, const al_tensor *b);
al_status al_cpu_binary_scalar(int32_t op, al_tensor *out, const al_tensor *a, double s, int32_t scalar_first);
al_status al_cpu_where(al_tensor *out, const al_tensor *cond, const al_tensor *a, const al_tensor *b);
al_status al_cpu_reduce(int32_t op, al_tensor *out, const al_tensor *a, uint32_t dim_mask);
al_status al_cpu_max_dim(al_tensor *values, al_tensor *indices, const al_tensor *a, int32_t dim);
al_status al_cpu_softmax(al_tensor *out, const al_tensor *a, int32_t dim, int32_t log);
al_status al_cpu_matmul(al_tensor *out, const al_tensor *a, const al_tensor *b);

/* Move an iterator that al_iter_init has just set to position 0 on to row-major position pos. */
static inline void al_iter_seek(al_iter *it, int64_t pos) {
    for (int32_t d = it->ndim - 1; d >= 0 && pos > 0; d--) {
        int64_t e = it->size[d];
        if (e <= 0) break;
        int64_t i = pos % e;
        pos /= e;
        it->idx[d] = i;
        for (int32_t k = 0; k < it->nops; k++) it->off[k] += i * it->stride[k][d];
    }
}

/* Split [0, n) into nthreads ranges; the range of thread t. */
static inline void al_cpu_range(int64_t n, int t, int nthreads, int64_t *lo, int64_t *hi) {
    int64_t chunk = n / nthreads, rem = n % nthreads;
    *lo = t * chunk + (t < rem ? t : rem);
    *hi = *lo + chunk + (t < rem ? 1 : 0);
}

/* 1 when t's strides are the contiguous strides of its shape (extent-1 dims ignored). */
static inline int al_cpu_is_dense(const al_tensor *t) {
    int64_t expect = 1;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        if (t->size[d] != 1 && t->stride[d] != expect) return 0;
        expect *= t->size[d];
    }
    return 1;
}

#endif /* ATTNLAB_CPU_MATH_H */
