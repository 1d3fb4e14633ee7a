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
    /* FP8: dO is quantised -> dequantised into an f32 copy before the kernel; the kernel writes dq, dk,
     * dv in f32 into temporaries, from which the dQKV slot (one scale over all three) is stored */
    al_attn_fp8 *fx = pl->in.fp8;
    /* fp8_output: out holds O's FP8 codes; the kernel reads O as code / scale_used[O] in f64, exactly what a
     * float output held in value (its re-quantisation with the same scale gives back the same codes) */
    al_tensor o64 = {0};
    if (s == AL_OK && (out->dtype == AL_DTYPE_FP8_E4M3 || out->dtype == AL_DTYPE_FP8_E5M2)) {
        const double so = fx ? fx->scale_used[AL_FP8_SLOT_O] : 0.0;
        if (!(so > 0.0))
            s = al_error(AL_ERR_ARG, "attention_backward (cpu): out holds FP8 codes (fp8_output), but fp8.scale_used[O] is %g, "
                         "not the forward's per-tensor scale", so);
        else s = al_fp8_dequantize(&o64, out, 1.0 / so, AL_DTYPE_F64);
        if (s == AL_OK) out = &o64;
    }
    al_attn_f8 f8 = {0};
    al_tensor d8 = {0}, tg[3] = {{0}, {0}, {0}};
    const al_tensor *kdout = dout;
    al_tensor *kq = dq, *kk = dk, *kv = dv;
    double p2 = 1.0;
    if (s == AL_OK && fx) {
        p2 = exp2(fx->margin);
        s = al_attn_f8_setup(pl, &f8, nthr);
        double am = 0.0, sdo = fx->scale[AL_FP8_SLOT_DO];
        if (s == AL_OK) s = al_amax(dout, &am);
        if (s == AL_OK) {
            if (sdo == 0.0) sdo = al_fp8_current_scale(al_fp8_fmax(fx->bwd_format), am, p2);
            fx->amax[AL_FP8_SLOT_DO] = am;
            fx->scale_used[AL_FP8_SLOT_DO] = sdo;
            s = al_tensor_empty(&d8, dout->ndim, dout->size, AL_DTYPE_F32, AL_DEVICE_CPU, 0);
        }
        if (s == AL_OK) {
            float *w = (float *)al_tensor_data_ptr(&d8);
            al_iter it;
            const int64_t *strides[1] = {dout->stride};
            al_iter_init(&it, dout->ndim, dout->size, 1, strides, &dout->offset);
            const double inv = sdo > 0 ? 1.0 / sdo : 1.0;
            for (int64_t i = 0; i < it.numel; i++, al_iter_next(&it)) {
                double v = al_load_f64(dout->data, dout->dtype, it.off[0]);
                w[i] = (float)(sdo < 0 ? v : al_attn_fq(fx->bwd_format, v, sdo, inv));
            }
            kdout = &d8;
        }
        const al_tensor *like[3] = {dq, dk, dv};
        for (int t = 0; t < 3 && s == AL_OK; t++) {
            s = al_tensor_empty(&tg[t], like[t]->ndim, like[t]->size, AL_DTYPE_F32, AL_DEVICE_CPU, 0);
            if (s == AL_OK) s = al_tensor_fill_(&tg[t], 0.0);
        }
        kq = &tg[0]; kk = &tg[1]; kv = &tg[2];
    }
    if (s == AL_OK) {
        int saved = al_attn_blas_single_begin();
        const al_attn_f8 *f = fx ? &f8 : NULL;
        s = p->compute_dtype == AL_DTYPE_F64 ? al_attn_bwd_f64(pl, out, kdout, (const double *)l, kq, kk, kv, dbt, dbn, dot, f)
                                             : al_attn_bwd_f32(pl, out, kdout, (const float *)l, kq, kk, kv, dbt, dbn, dot, f);
        al_attn_blas_single_end(saved);
    }
    if (fx && s == AL_OK) {
        double am = 0.0, a;
        for (int t = 0; t < 3 && s == AL_OK; t++) {
            s = al_amax(&tg[t], &a);
            am = al_attn_amax_upd(am, a);
        }
        double sg = fx->scale[AL_FP8_SLOT_DQKV];
        if (sg == 0.0) sg = al_fp8_current_scale(al_fp8_fmax(fx->bwd_format), am, p2);
        al_tensor *dst[3] = {dq, dk, dv};
        for (int t = 0; t < 3 && s == AL_OK; t++) s = al_attn_f8_store(dst[t], &tg[t], fx->bwd_format, sg, 0, 1, p2);
        fx->amax[AL_FP8_SLOT_DQKV] = am;
        fx->scale_used[AL_FP8_SLOT_DQKV] = sg;
        fx->amax[AL_FP8_SLOT_DP] = f8.sdP >= 0 ? al_attn_f8_amax(&f8, nthr, AL_FP8_SLOT_DP) : 0.0;
        fx->scale_used[AL_FP8_SLOT_DP] = f8.sdP >= 0 ? f8.sdP : -1.0;
    }
    free(f8.amax_thr);
    al_tensor_release(&o64);
    al_tensor_release(&d8);
    for (int t = 0; t < 3; t++) al_tensor_release(&tg[t]);
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
