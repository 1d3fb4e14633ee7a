/*
 * reduce.c — CPU reductions over any strides: sum / mean / amax / amin over a set of dims (a bit
 * mask), accumulated in double, and max along one dim with its (0-based, i64) index.
 *
 * out is in keepdim form (a's ndim, reduced dims of extent 1) and contiguous. Each output element
 * is one "outer" position; the reduced dims form the "inner" walk. OpenMP threads take ranges of
 * output elements. NaN propagates through amax/amin/max (the first NaN wins, as in PyTorch).
 */
#include "cpu/cpu_math.h"

#include <math.h>
#include <omp.h>

/* Read element `off` of t as double, with direct loads for the common float dtypes. */
static inline double load(const al_tensor *t, int64_t off) {
    switch (t->dtype) {
    case AL_DTYPE_F32: return ((const float *)t->data)[off];
    case AL_DTYPE_F64: return ((const double *)t->data)[off];
    default: return al_load_f64(t->data, t->dtype, off);
    }
}

/* Shapes of the outer walk (reduced dims set to 1) and the inner walk (kept dims set to 1). */
static void split_shape(const al_tensor *a, uint32_t mask, int64_t *outer, int64_t *inner) {
    for (int32_t d = 0; d < a->ndim; d++) {
        int r = (mask >> d) & 1u;
        outer[d] = r ? 1 : a->size[d];
        inner[d] = r ? a->size[d] : 1;
    }
}

al_status al_cpu_reduce(int32_t op, al_tensor *out, const al_tensor *a, uint32_t dim_mask) {
    int64_t nout = al_tensor_numel(out);
    if (nout == 0) return AL_OK;
    int64_t outer[AL_MAX_DIMS], inner[AL_MAX_DIMS];
    split_shape(a, dim_mask, outer, inner);
    int64_t ninner = 1;
    for (int32_t d = 0; d < a->ndim; d++) ninner *= inner[d];
    int64_t work = nout * (ninner > 0 ? ninner : 1);
    int nt = (work >= AL_CPU_PAR_MIN && nout > 1) ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        al_cpu_range(nout, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        al_iter ot;
        /* out is in keepdim form, so it shares the outer shape with a */
        al_iter_init(&ot, a->ndim, outer, 2, (const int64_t *[]){out->stride, a->stride},
                     (int64_t[]){out->offset, a->offset});
        al_iter_seek(&ot, lo);
        for (int64_t o = lo; o < hi; o++, al_iter_next(&ot)) {
            al_iter it;
            al_iter_init(&it, a->ndim, inner, 1, (const int64_t *[]){a->stride}, (int64_t[]){ot.off[1]});
            double acc;
            if (op == AL_REDUCE_SUM || op == AL_REDUCE_MEAN) {
                acc = 0.0;
                for (int64_t i = 0; i < ninner; i++, al_iter_next(&it)) acc += load(a, it.off[0]);
                if (op == AL_REDUCE_MEAN) acc = acc / (double)ninner;   /* 0/0 = NaN for an empty mean */
            } else {
                int is_max = op == AL_REDUCE_AMAX;
                acc = is_max ? -INFINITY : INFINITY;
                for (int64_t i = 0; i < ninner; i++, al_iter_next(&it)) {
                    double v = load(a, it.off[0]);
                    if (v != v) { acc = v; break; }
                    if (is_max ? v > acc : v < acc) acc = v;
                }
            }
            al_store_f64(out->data, out->dtype, ot.off[0], acc);
        }
    }
    return AL_OK;
}

al_status al_cpu_max_dim(al_tensor *values, al_tensor *indices, const al_tensor *a, int32_t dim) {
    int64_t nout = al_tensor_numel(values);
    if (nout == 0) return AL_OK;
    int64_t outer[AL_MAX_DIMS];
    for (int32_t d = 0; d < a->ndim; d++) outer[d] = d == dim ? 1 : a->size[d];
    int64_t len = a->size[dim], step = a->stride[dim];
    int nt = (nout * len >= AL_CPU_PAR_MIN && nout > 1) ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        al_cpu_range(nout, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        al_iter ot;
        al_iter_init(&ot, a->ndim, outer, 3, (const int64_t *[]){values->stride, indices->stride, a->stride},
                     (int64_t[]){values->offset, indices->offset, a->offset});
        al_iter_seek(&ot, lo);
        for (int64_t o = lo; o < hi; o++, al_iter_next(&ot)) {
            double best = load(a, ot.off[2]);
            int64_t arg = 0;
            if (best == best) {
                for (int64_t i = 1; i < len; i++) {
                    double v = load(a, ot.off[2] + i * step);
                    if (v != v) { best = v; arg = i; break; }
                    if (v > best) { best = v; arg = i; }
                }
            }
            al_store_f64(values->data, values->dtype, ot.off[0], best);
            ((int64_t *)indices->data)[ot.off[1]] = arg;
        }
    }
    return AL_OK;
}
