/*
 * cpu/attention_fwd.c — the CPU attention forward (the oracle backend): allocates out (zeroed, so
 * padded rows and thd gaps read 0), lse (-inf) and max_logit, then runs the flash-style tiled
 * kernel of attention_fwd_tmpl.h in f32 (sgemm, fast exp) or f64 (dgemm) compute.
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
#define ROWMAX al_attn_rowmax
#include "cpu/attention_fwd_tmpl.h"
#undef REAL
#undef SUF
#undef GEMM
#undef EXPR
#undef EXPSUM
#undef ROWMAX

#define REAL double
#define SUF f64
#define GEMM cblas_dgemm
#define EXPR(x) exp(x)
#define EXPSUM al_attn_exp_sub_sum_f64
#define ROWMAX al_attn_rowmax_f64
#include "cpu/attention_fwd_tmpl.h"
#undef REAL
#undef SUF
#undef GEMM
#undef EXPR
#undef EXPSUM
#undef ROWMAX

al_status al_cpu_attn_forward(const al_attn_plan *pl, al_tensor *out, al_tensor *lse, al_tensor *max_logit) {
    const al_attn_params *p = &pl->p;
    const al_tensor *q = pl->in.q;
    int64_t osize[4];
    int nd = q->ndim;
    for (int d = 0; d < nd; d++) osize[d] = q->size[d];
    osize[nd - 1] = p->d_v;
    AL_TRY(al_tensor_empty(out, nd, osize, q->dtype, AL_DEVICE_CPU, 0));
    al_status s = al_tensor_fill_(out, 0.0);
    int64_t lsize[3] = {p->b, p->h, p->sq};
    /* lse in the compute precision: f32, or f64 under f64 compute (so f64 gradients stay exact) */
    if (s == AL_OK) s = al_tensor_empty(lse, 3, lsize, p->compute_dtype == AL_DTYPE_F64 ? AL_DTYPE_F64 : AL_DTYPE_F32, AL_DEVICE_CPU, 0);
    if (s == AL_OK) s = al_tensor_fill_(lse, -INFINITY);
    float *mthr = NULL;
    int nthr = al_attn_nthreads();
    if (s == AL_OK && max_logit) {
        int64_t h = p->h;
        s = al_tensor_empty(max_logit, 1, &h, AL_DTYPE_F32, AL_DEVICE_CPU, 0);
        mthr = malloc(sizeof(float) * (size_t)(nthr * h));
        if (s == AL_OK && !mthr) s = al_error(AL_ERR_OOM, "attention_forward (cpu): out of memory");
        for (int64_t i = 0; mthr && i < nthr * h; i++) mthr[i] = -INFINITY;
    }
    if (s == AL_OK) {
        int saved = al_attn_blas_single_begin();
        void *l = al_tensor_data_ptr(lse);
        s = p->compute_dtype == AL_DTYPE_F64 ? al_attn_fwd_f64(pl, out, (double *)l, mthr)
                                             : al_attn_fwd_f32(pl, out, (float *)l, mthr);
        al_attn_blas_single_end(saved);
    }
    if (s == AL_OK && max_logit) {
        float *ml = (float *)al_tensor_data_ptr(max_logit);
        for (int64_t hh = 0; hh < p->h; hh++) {
            float v = -INFINITY;
            for (int t = 0; t < nthr; t++) v = mthr[t * p->h + hh] > v ? mthr[t * p->h + hh] : v;
            ml[hh] = v;
        }
    }
    free(mthr);
    if (s != AL_OK) {
        al_tensor_release(out);
        al_tensor_release(lse);
        if (max_logit) al_tensor_release(max_logit);
    }
    return s;
}
