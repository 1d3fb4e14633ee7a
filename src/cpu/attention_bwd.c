/*
 * cpu/attention_bwd.c — the CPU attention backward: zeroes dq/dk/dv through their real strides (so
 * padding, thd gaps and the untouched parts of packed gradient views read 0), runs the recomputing
 * kernel of attention_bwd_tmpl.h in f32 or f64 compute, then reduces the per-thread dbias and
 * d softmax_offset accumulators (in thread order) into freshly allocated tensors.
 */
/* The softmax loops must vectorise (with the if-converted fast exp); -O2's very-cheap vectoriser
 * cost model refuses them, so these kernels are built at O3. */
#pragma GCC optimize("O3")
#include "cpu/attention_cpu.h"

#define REAL float
#define SUF f32
#define GEMM cblas_sgemm
#define EXPR(x) al_attn_expf(x)
#define EXPSUM al_attn_exp_sub_sum
#include "cpu/attention_bwd_tmpl.h"
#undef REAL
#undef SUF
#undef GEMM
#undef EXPR
#undef EXPSUM

#define REAL double
#define SUF f64
#define GEMM cblas_dgemm
#define EXPR(x) exp(x)
#define EXPSUM al_attn_exp_sub_sum_f64
#include "cpu/attention_bwd_tmpl.h"
#undef REAL
#undef SUF
#undef GEMM
#undef EXPR
#undef EXPSUM

al_status al_cpu_attn_backward(const al_attn_plan *pl, const al_tensor *out, const al_tensor *dout,
                               const al_tensor *lse, al_tensor *dq, al_tensor *dk, al_tensor *dv,
                               al_tensor *dbias, al_tensor *d_softmax_offset) {
    const al_attn_params *p = &pl->p;
    AL_TRY(al_tensor_fill_(dq, 0.0));
    AL_TRY(al_tensor_fill_(dk, 0.0));
    AL_TRY(al_tensor_fill_(dv, 0.0));
    const int nthr = al_attn_nthreads();
    double *dbt = NULL, *dot = NULL;
    int64_t dbn = 0;
    al_status s = AL_OK;
    if (dbias && pl->has_grad_bias) {
        dbn = al_tensor_numel(pl->in.bias);
        dbt = calloc((size_t)nthr * (size_t)(dbn > 0 ? dbn : 1), sizeof(double));
        if (!dbt) return al_error(AL_ERR_OOM, "attention_backward (cpu): out of memory for dbias");
    }
    if (d_softmax_offset && p->softmax_type == AL_ATTN_SOFTMAX_LEARNABLE) {
        dot = calloc((size_t)nthr * (size_t)p->h, sizeof(double));
        if (!dot) { free(dbt); return al_error(AL_ERR_OOM, "attention_backward (cpu): out of memory"); }
    }
    /* lse in the compute precision, contiguous (a converted copy when the caller's is not) */
    al_tensor lc = {0};
    const int32_t ldt = p->compute_dtype == AL_DTYPE_F64 ? AL_DTYPE_F64 : AL_DTYPE_F32;
    const void *l;
    if (al_tensor_is_contiguous(lse) && lse->device_type == AL_DEVICE_CPU && lse->dtype == ldt) l = al_tensor_data_ptr(lse);
    else {
        s = al_tensor_to(&lc, lse, ldt, AL_DEVICE_CPU, 0);
        l = s == AL_OK ? al_tensor_data_ptr(&lc) : NULL;
    }
    if (s == AL_OK) {
        int saved = al_attn_blas_single_begin();
        s = p->compute_dtype == AL_DTYPE_F64 ? al_attn_bwd_f64(pl, out, dout, (const double *)l, dq, dk, dv, dbt, dbn, dot)
                                             : al_attn_bwd_f32(pl, out, dout, (const float *)l, dq, dk, dv, dbt, dbn, dot);
        al_attn_blas_single_end(saved);
    }
    al_tensor_release(&lc);
    if (s == AL_OK && dbt) {
        for (int t = 1; t < nthr; t++)
            for (int64_t i = 0; i < dbn; i++) dbt[i] += dbt[(size_t)t * (size_t)dbn + (size_t)i];
        const al_tensor *B = pl->in.bias;
        s = al_tensor_empty(dbias, B->ndim, B->size, B->dtype, AL_DEVICE_CPU, 0);
        if (s == AL_OK) s = al_tensor_write_f64(dbias, dbt, dbn);
    }
    if (s == AL_OK && dot) {
        for (int t = 1; t < nthr; t++)
            for (int64_t i = 0; i < p->h; i++) dot[i] += dot[(size_t)t * (size_t)p->h + (size_t)i];
        int64_t h = p->h;
        s = al_tensor_empty(d_softmax_offset, 1, &h, AL_DTYPE_F32, AL_DEVICE_CPU, 0);
        if (s == AL_OK) s = al_tensor_write_f64(d_softmax_offset, dot, h);
    }
    free(dbt);
    free(dot);
    if (s != AL_OK) {
        if (dbias) al_tensor_release(dbias);
        if (d_softmax_offset) al_tensor_release(d_softmax_offset);
    }
    return s;
}
