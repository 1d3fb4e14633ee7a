/*
 * softmax.c — CPU softmax and log-softmax along one dim, over any strides.
 *
 * Numerically stable: x - max(x) before exp. Computed in f32 for f32/f16/bf16 (and other non-f64)
 * inputs and in f64 for f64 input, as include/attnlab.h documents. Each row (all positions of the
 * other dims) is gathered into a small per-thread buffer, so strided rows cost one pass to read.
 * A row that is all -inf gives NaN (0/0), as in PyTorch.
 */
#include "cpu/cpu_math.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#define SOFTMAX_ROWS(T, SUF, EXP, LOG)                                                               \
    static void softmax_rows_##SUF(al_tensor *out, const al_tensor *a, int32_t dim, int32_t is_log,  \
                                   const int64_t *outer, int64_t lo, int64_t hi, T *buf) {           \
        int64_t len = a->size[dim], sa = a->stride[dim], so = out->stride[dim];                      \
        al_iter ot;                                                                                  \
        al_iter_init(&ot, a->ndim, outer, 2, (const int64_t *[]){out->stride, a->stride},            \
                     (int64_t[]){out->offset, a->offset});                                           \
        al_iter_seek(&ot, lo);                                                                       \
        for (int64_t r = lo; r < hi; r++, al_iter_next(&ot)) {                                       \
            if (a->dtype == AL_DTYPE_F32) {                                                          \
                const float *x = (const float *)a->data + ot.off[1];                                 \
                for (int64_t i = 0; i < len; i++) buf[i] = (T)x[i * sa];                             \
            } else if (a->dtype == AL_DTYPE_F64) {                                                   \
                const double *x = (const double *)a->data + ot.off[1];                               \
                for (int64_t i = 0; i < len; i++) buf[i] = (T)x[i * sa];                             \
            } else {                                                                                 \
                for (int64_t i = 0; i < len; i++)                                                    \
                    buf[i] = (T)al_load_f64(a->data, a->dtype, ot.off[1] + i * sa);                  \
            }                                                                                        \
            T m = -(T)INFINITY;                                                                      \
            for (int64_t i = 0; i < len; i++) m = buf[i] > m ? buf[i] : m;                           \
            T sum = 0;                                                                               \
            if (is_log) {                                                                               \
                for (int64_t i = 0; i < len; i++) sum += EXP(buf[i] - m);                            \
                T lse = LOG(sum);                                                                    \
                for (int64_t i = 0; i < len; i++) buf[i] = buf[i] - m - lse;                         \
            } else {                                                                                 \
                for (int64_t i = 0; i < len; i++) { buf[i] = EXP(buf[i] - m); sum += buf[i]; }       \
                T inv = (T)1 / sum;                                                                  \
                for (int64_t i = 0; i < len; i++) buf[i] *= inv;                                     \
            }                                                                                        \
            if (out->dtype == AL_DTYPE_F32) {                                                        \
                float *y = (float *)out->data + ot.off[0];                                           \
                for (int64_t i = 0; i < len; i++) y[i * so] = (float)buf[i];                         \
            } else if (out->dtype == AL_DTYPE_F64) {                                                 \
                double *y = (double *)out->data + ot.off[0];                                         \
                for (int64_t i = 0; i < len; i++) y[i * so] = (double)buf[i];                        \
            } else {                                                                                 \
                for (int64_t i = 0; i < len; i++)                                                    \
                    al_store_f64(out->data, out->dtype, ot.off[0] + i * so, (double)buf[i]);         \
            }                                                                                        \
        }                                                                                            \
    }
SOFTMAX_ROWS(float, f32, expf, logf)
SOFTMAX_ROWS(double, f64, exp, log)

al_status al_cpu_softmax(al_tensor *out, const al_tensor *a, int32_t dim, int32_t is_log) {
    int64_t n = al_tensor_numel(a);
    if (n == 0) return AL_OK;
    int64_t outer[AL_MAX_DIMS];
    for (int32_t d = 0; d < a->ndim; d++) outer[d] = d == dim ? 1 : a->size[d];
    int64_t len = a->size[dim], rows = n / len;
    int wide = a->dtype == AL_DTYPE_F64;
    size_t elem = wide ? sizeof(double) : sizeof(float);
    int nt = (n >= AL_CPU_PAR_MIN && rows > 1) ? omp_get_max_threads() : 1;
    int failed = 0;
#pragma omp parallel num_threads(nt) reduction(| : failed)
    {
        void *buf = malloc((size_t)len * elem);
        if (!buf) {
            failed = 1;
        } else {
            int64_t lo, hi;
            al_cpu_range(rows, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
            if (wide) softmax_rows_f64(out, a, dim, is_log, outer, lo, hi, (double *)buf);
            else softmax_rows_f32(out, a, dim, is_log, outer, lo, hi, (float *)buf);
            free(buf);
        }
    }
    if (failed) return al_error(AL_ERR_OOM, "softmax: cannot allocate a row buffer of %lld elements", (long long)len);
    return AL_OK;
}
