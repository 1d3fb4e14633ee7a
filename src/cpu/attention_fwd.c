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

/* The kernels' FP8 view of a call (attention_cpu.h); amax_thr is allocated here, freed by the caller. */
al_status al_attn_f8_setup(const al_attn_plan *pl, al_attn_f8 *f, int nthr) {
    const al_attn_fp8 *x = pl->in.fp8;
    memset(f, 0, sizeof *f);
    f->fwd = x->fwd_format;
    f->bwd = x->bwd_format;
    const int q8 = pl->in.q->dtype == AL_DTYPE_FP8_E4M3 || pl->in.q->dtype == AL_DTYPE_FP8_E5M2;
    f->qkv_dq = q8 ? x->qkv_scale_inv : 1.0;
    const al_tensor *ds[3] = {q8 ? x->q_descale : NULL, q8 ? x->k_descale : NULL, q8 ? x->v_descale : NULL};
    for (int k = 0; k < 3; k++) {
        const al_tensor *d = ds[k];
        if (!d) continue;
        int64_t sb = 0, sr = d->stride[0];
        if (pl->p.qkv_format == AL_ATTN_FORMAT_SBHD) sb = d->stride[1];
        else if (pl->p.qkv_format == AL_ATTN_FORMAT_BSHD) { sb = d->stride[0]; sr = d->stride[1]; }
        f->dsc[k] = (const float *)al_tensor_data_ptr(d);
        f->ds_b[k] = sb;
        f->ds_r[k] = sr;
    }
    f->sS = x->scale[AL_FP8_SLOT_S];
    f->sS_inv = f->sS > 0 ? 1.0 / f->sS : 1.0;
    f->sdP = x->scale[AL_FP8_SLOT_DP];
    f->sdP_inv = f->sdP > 0 ? 1.0 / f->sdP : 1.0;
    f->amax_thr = calloc((size_t)nthr * 6, sizeof(double));
    if (!f->amax_thr) return al_error(AL_ERR_OOM, "attention (cpu, fp8): out of memory");
    return AL_OK;
}

/* Per-thread amaxes of one slot, combined (NaN-propagating). */
double al_attn_f8_amax(const al_attn_f8 *f, int nthr, int slot) {
    double m = 0.0;
    for (int t = 0; t < nthr; t++) m = al_attn_amax_upd(m, f->amax_thr[t * 6 + slot]);
    return m;
}

/* dst (any strides, any float dtype) = quantise -> dequantise of the contiguous f32 src with scale
 * (< 0: a plain copy). rowlen > 0 and per_row: one current scale per row of rowlen elements (pow2m =
 * 2^margin), else one scale. */
al_status al_attn_f8_store(al_tensor *dst, const al_tensor *src, int32_t fmt, double scale, int per_row, int64_t rowlen,
                           double pow2m) {
    const float *x = (const float *)al_tensor_data_ptr(src);
    const double fmax = al_fp8_fmax(fmt);
    const int fp8_dst = (dst->dtype == AL_DTYPE_FP8_E4M3 || dst->dtype == AL_DTYPE_FP8_E5M2) && scale > 0.0;
    al_iter it;
    const int64_t *strides[1] = {dst->stride};
    al_iter_init(&it, dst->ndim, dst->size, 1, strides, &dst->offset);
    double rs = scale, rinv = scale > 0 ? 1.0 / scale : 1.0;
    for (int64_t i = 0; i < it.numel; i++, al_iter_next(&it)) {
        if (per_row && i % rowlen == 0) {
            double m = 0.0;
            for (int64_t k = 0; k < rowlen; k++) m = al_attn_amax_upd(m, (double)x[i + k]);
            rs = al_fp8_current_scale(fmax, m, pow2m);
            rinv = 1.0 / rs;
        }
        double v = (double)x[i];
        /* an FP8 dst (fp8_output) takes the code itself: the store encodes v * rs once (the same rounding
         * al_attn_fq applies before decoding) */
        if (fp8_dst) al_store_f64(dst->data, dst->dtype, it.off[0], v * rs);
        else al_store_f64(dst->data, dst->dtype, it.off[0], rs < 0 ? v : al_attn_fq(fmt, v, rs, rinv));
    }
    return AL_OK;
}

al_status al_cpu_attn_forward(const al_attn_plan *pl, al_tensor *out, al_tensor *lse, al_tensor *max_logit) {
    const al_attn_params *p = &pl->p;
    const al_tensor *q = pl->in.q;
    al_attn_fp8 *fx = pl->in.fp8;
    int64_t osize[4];
    int nd = q->ndim;
    for (int d = 0; d < nd; d++) osize[d] = q->size[d];
    osize[nd - 1] = p->d_v;
    /* FP8: the kernel writes O in f32 into ot; the O slot is quantised from there into out */
    al_tensor ot = {0};
    al_attn_f8 f8 = {0};
    AL_TRY(al_tensor_empty(out, nd, osize, fx ? fx->out_dtype : q->dtype, AL_DEVICE_CPU, 0));
    al_status s = al_tensor_fill_(out, 0.0);
    if (s == AL_OK && fx) {
        s = al_tensor_empty(&ot, nd, osize, AL_DTYPE_F32, AL_DEVICE_CPU, 0);
        if (s == AL_OK) s = al_tensor_fill_(&ot, 0.0);
        if (s == AL_OK) s = al_attn_f8_setup(pl, &f8, al_attn_nthreads());
        else f8.amax_thr = NULL;
    }
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
        const al_tensor *o = fx ? &ot : out;
        const al_attn_f8 *f = fx ? &f8 : NULL;
        s = p->compute_dtype == AL_DTYPE_F64 ? al_attn_fwd_f64(pl, o, (double *)l, mthr, f)
                                             : al_attn_fwd_f32(pl, o, (float *)l, mthr, f);
        al_attn_blas_single_end(saved);
    }
    if (fx && f8.amax_thr) {
        if (s == AL_OK) {
            /* the O slot: amax of the f32 O, then the given, current or per-token scale */
            double am = 0.0;
            s = al_amax(&ot, &am);
            double so = fx->scale[AL_FP8_SLOT_O];
            const double p2 = exp2(fx->margin);
            if (so == 0.0) so = al_fp8_current_scale(al_fp8_fmax(fx->fwd_format), am, p2);
            if (s == AL_OK) s = al_attn_f8_store(out, &ot, fx->fwd_format, so, fx->o_per_token, p->h * p->d_v, p2);
            fx->amax[AL_FP8_SLOT_S] = f8.sS >= 0 ? al_attn_f8_amax(&f8, nthr, AL_FP8_SLOT_S) : 0.0;
            fx->amax[AL_FP8_SLOT_O] = am;
            fx->scale_used[AL_FP8_SLOT_S] = f8.sS >= 0 ? f8.sS : -1.0;
            fx->scale_used[AL_FP8_SLOT_O] = fx->o_per_token ? 0.0 : so;
        }
        free(f8.amax_thr);
    }
    al_tensor_release(&ot);
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
