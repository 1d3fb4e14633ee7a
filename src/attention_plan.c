/*
 * attention_plan.c — the front door's validation: every al_attn_params field and al_attn_inputs tensor checked
 * against each other (each inconsistency an AL_ERR_ARG naming the argument, what was expected and what was
 * given, before any work), and the pair resolved into an al_attn_plan (attention_internal.h): extents, the
 * window and diagonal as TransformerEngine sets them, per-sequence starts and lengths from cu_seqlens or
 * padding masks, broadcast strides of the masks and the bias, ALiBi slopes, softmax offsets, the FP8 settings
 * and a variant's snippets. One step per function, in order (al_attn_plan_build). The backend registry and the
 * entry points that use the plan are in attention.c.
 */
#include "attention_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- names for messages ----------------------------------------------------------------------------- */
const char *al_attn_format_name(int32_t f) {
    static const char *n[] = {"sbhd", "bshd", "thd"};
    return (f >= 0 && f <= 2) ? n[f] : "?";
}
const char *al_attn_mask_name(int32_t m) {
    static const char *n[] = {"no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
                              "padding_causal_bottom_right", "arbitrary"};
    return (m >= 0 && m <= 6) ? n[m] : "?";
}
static int is_padding_mask(int32_t m) {
    return m == AL_ATTN_MASK_PADDING || m == AL_ATTN_MASK_PADDING_CAUSAL ||
           m == AL_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
}
static int is_causal_mask(int32_t m) {
    return m == AL_ATTN_MASK_CAUSAL || m == AL_ATTN_MASK_PADDING_CAUSAL ||
           m == AL_ATTN_MASK_CAUSAL_BOTTOM_RIGHT || m == AL_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
}

/* ---- validation and planning ------------------------------------------------------------------ */
void al_attn_plan_free(al_attn_plan *pl) {
    if (pl->q_start != pl->small_b) free(pl->q_start);   /* one block holds every int64 array */
    free(pl->q_valid);
    free(pl->kv_valid);
    free(pl->alibi);
    free(pl->softmax_offset);
    memset(pl, 0, sizeof *pl);
}

static al_status check_float(const char *arg, const al_tensor *t) {
    AL_TRY(al_check_tensor("attention", arg, t));
    if (!al_dtype_is_float(t->dtype) || t->dtype == AL_DTYPE_FP8_E4M3 || t->dtype == AL_DTYPE_FP8_E5M2)
        return al_error(AL_ERR_ARG, "attention: %s must be f32, f64, f16 or bf16, got %s", arg,
                        al_dtype_name(t->dtype));
    return AL_OK;
}

int al_attn_is_fp8_dtype(int32_t d) { return d == AL_DTYPE_FP8_E4M3 || d == AL_DTYPE_FP8_E5M2; }

/* q, k, v: high-precision floats, or (with FP8 settings) FP8 of the forward format. */
static al_status check_qkv(const char *arg, const al_tensor *t, const al_attn_fp8 *f8) {
    if (f8 && t && t->storage && al_attn_is_fp8_dtype(t->dtype)) {
        if (t->dtype != f8->fwd_format)
            return al_error(AL_ERR_ARG, "attention: %s is %s but the FP8 forward format is %s", arg, al_dtype_name(t->dtype),
                            al_dtype_name(f8->fwd_format) ? al_dtype_name(f8->fwd_format) : "unknown");
        return AL_OK;
    }
    if (!f8 && t && t->storage && al_attn_is_fp8_dtype(t->dtype))
        return al_error(AL_ERR_ARG, "attention: %s is %s: FP8 inputs need FP8 settings (inputs.fp8, al.fp8 recipes)", arg,
                        al_dtype_name(t->dtype));
    return check_float(arg, t);
}

static const char *slot_name(int i) {
    static const char *n[] = {"QKV", "S", "O", "dO", "dP", "dQKV"};
    return i >= 0 && i < 6 ? n[i] : "?";
}

/* A per-token descale: f32 with shape t.shape[:-2], on t's device. */
static al_status check_descale(const char *arg, const al_tensor *d, const al_tensor *t) {
    char b1[96], b2[96];
    AL_TRY(al_check_tensor("attention", arg, d));
    int ok = d->dtype == AL_DTYPE_F32 && d->ndim == t->ndim - 2 && d->device_type == t->device_type &&
             d->device_index == t->device_index;
    for (int i = 0; ok && i < d->ndim; i++) ok = d->size[i] == t->size[i];
    if (!ok)
        return al_error(AL_ERR_ARG, "attention: fp8.%s must be f32 with the token dims of %s on its device, got %s", arg,
                        al_tensor_describe(t, b1, sizeof b1), al_tensor_describe(d, b2, sizeof b2));
    return AL_OK;
}

static al_status check_fp8(const al_attn_plan *pl) {
    const al_attn_fp8 *f = pl->in.fp8;
    if (!f) return AL_OK;
    if (!al_attn_is_fp8_dtype(f->fwd_format) || !al_attn_is_fp8_dtype(f->bwd_format))
        return al_error(AL_ERR_ARG, "attention: fp8.fwd_format and fp8.bwd_format must be fp8_e4m3 or fp8_e5m2, got codes %d and %d",
                        f->fwd_format, f->bwd_format);
    if (!al_dtype_is_float(f->out_dtype))
        return al_error(AL_ERR_ARG, "attention: fp8.out_dtype must be f32, f64, f16, bf16 or fwd_format (FP8 output), got code %d",
                        f->out_dtype);
    if (al_attn_is_fp8_dtype(f->out_dtype)) {   /* TE's fp8_output: O's FP8 codes, one per-tensor scale (scale_used[O]) */
        if (f->out_dtype != f->fwd_format)
            return al_error(AL_ERR_ARG, "attention: an FP8 fp8.out_dtype (fp8_output) must be fwd_format %s, got %s",
                            al_dtype_name(f->fwd_format), al_dtype_name(f->out_dtype));
        if (f->o_per_token || f->scale[AL_FP8_SLOT_O] < 0.0)
            return al_error(AL_ERR_ARG, "attention: FP8 output (fp8_output) needs O quantised in the call with one scale (given "
                            "or current per tensor), got %s", f->o_per_token ? "per-token O scaling" : "fp8.scale[O] < 0 "
                            "(O quantised outside the call, by a Lua or MXFP8 recipe)");
    }
    if (!isfinite(f->margin)) return al_error(AL_ERR_ARG, "attention: fp8.margin must be finite, got %g", f->margin);
    if (f->ds) {   /* delayed scaling on the device: every slot delayed, its scale read from ds */
        AL_TRY(al_fp8_ds_check_attn(f, pl->in.q));
        if (f->o_per_token || f->q_descale || f->k_descale || f->v_descale)
            return al_error(AL_ERR_ARG, "attention: fp8.ds (delayed scaling on the device) scales per tensor: per-token "
                            "descales and per-token O scaling do not apply");
        for (int i = 0; i < 6; i++)
            if (!(f->scale[i] > 0.0))
                return al_error(AL_ERR_ARG, "attention: with fp8.ds every fp8.scale[] must say 'given' (> 0; the value is read "
                                "from ds), got scale[%s] = %g", slot_name(i), f->scale[i]);
    }
    for (int i = 0; i < 6; i++) {
        if (!isfinite(f->scale[i]))
            return al_error(AL_ERR_ARG, "attention: fp8.scale[%s] must be finite, got %g", slot_name(i), f->scale[i]);
        if ((i == AL_FP8_SLOT_S || i == AL_FP8_SLOT_DP) && f->scale[i] == 0.0)
            return al_error(AL_ERR_ARG, "attention: fp8.scale[%s] = 0 asks for current scaling, but %s is produced inside the "
                            "kernel, so its scale must be given (delayed scaling, as in TE); use a value < 0 to leave it unquantised",
                            slot_name(i), slot_name(i));
    }
    const al_tensor *q = pl->in.q;
    if (al_attn_is_fp8_dtype(q->dtype)) {
        if (f->q_descale) AL_TRY(check_descale("q_descale", f->q_descale, q));
        if (f->k_descale) AL_TRY(check_descale("k_descale", f->k_descale, pl->in.k));
        if (f->v_descale) AL_TRY(check_descale("v_descale", f->v_descale, pl->in.v));
        if ((!f->q_descale || !f->k_descale || !f->v_descale) && !(f->qkv_scale_inv > 0.0 && isfinite(f->qkv_scale_inv)))
            return al_error(AL_ERR_ARG, "attention: FP8 q, k, v need fp8.qkv_scale_inv > 0 (or per-token descales), got %g",
                            f->qkv_scale_inv);
    } else if (f->q_descale || f->k_descale || f->v_descale) {
        return al_error(AL_ERR_ARG, "attention: fp8.q_descale / k_descale / v_descale apply to FP8 q, k, v; got %s inputs",
                        al_dtype_name(q->dtype));
    }
    return AL_OK;
}

/* Read a cu_seqlens tensor: i32, 1-d, b+1 entries, monotone, starting at 0, last <= limit. */
static al_status read_cu(const char *arg, const al_tensor *t, int64_t b, int64_t limit, const char *limit_what,
                         int64_t *vals) {
    char buf[96];
    AL_TRY(al_check_tensor("attention", arg, t));
    if (t->dtype != AL_DTYPE_I32)
        return al_error(AL_ERR_ARG, "attention: %s must be i32, got %s", arg, al_tensor_describe(t, buf, sizeof buf));
    if (t->ndim != 1 || t->size[0] != b + 1)
        return al_error(AL_ERR_ARG, "attention: %s must have shape [%lld] (batch + 1), got %s", arg,
                        (long long)(b + 1), al_tensor_describe(t, buf, sizeof buf));
    double *d = malloc(sizeof(double) * (size_t)(b + 1));
    if (!d) return al_error(AL_ERR_OOM, "attention: out of memory");
    al_status s = al_tensor_read_f64(t, d, b + 1);
    if (s != AL_OK) { free(d); return al_error_prefix(s, "attention"); }
    for (int64_t i = 0; i <= b; i++) vals[i] = (int64_t)d[i];
    free(d);
    if (vals[0] != 0) return al_error(AL_ERR_ARG, "attention: %s must start at 0, got %lld", arg, (long long)vals[0]);
    for (int64_t i = 0; i < b; i++)
        if (vals[i + 1] < vals[i])
            return al_error(AL_ERR_ARG, "attention: %s must be non-decreasing, got %lld then %lld at index %lld",
                            arg, (long long)vals[i], (long long)vals[i + 1], (long long)(i + 1));
    if (vals[b] > limit)
        return al_error(AL_ERR_ARG, "attention: %s ends at %lld, beyond %s (%lld)", arg, (long long)vals[b],
                        limit_what, (long long)limit);
    return AL_OK;
}

/* A padding mask [b,1,1,s] (u8/bool, True = padded) into validity bytes; returns the count per row. */
static al_status read_padding_mask(const char *arg, const al_tensor *m, int64_t b, int64_t s, uint8_t *valid,
                                   int64_t *len) {
    char buf[96];
    AL_TRY(al_check_tensor("attention", arg, m));
    if (m->dtype != AL_DTYPE_U8 && m->dtype != AL_DTYPE_BOOL)
        return al_error(AL_ERR_ARG, "attention: %s must be u8 or bool (True = masked out), got %s", arg,
                        al_tensor_describe(m, buf, sizeof buf));
    if (m->ndim != 4 || m->size[0] != b || m->size[1] != 1 || m->size[2] != 1 || m->size[3] != s)
        return al_error(AL_ERR_ARG, "attention: padding %s must have shape [%lld,1,1,%lld], got %s", arg,
                        (long long)b, (long long)s, al_tensor_describe(m, buf, sizeof buf));
    double *d = malloc(sizeof(double) * (size_t)(b * s > 0 ? b * s : 1));
    if (!d) return al_error(AL_ERR_OOM, "attention: out of memory");
    al_status st = al_tensor_read_f64(m, d, b * s);
    if (st != AL_OK) { free(d); return al_error_prefix(st, "attention"); }
    for (int64_t bb = 0; bb < b; bb++) {
        len[bb] = 0;
        for (int64_t i = 0; i < s; i++) {
            valid[bb * s + i] = d[bb * s + i] == 0.0;
            len[bb] += valid[bb * s + i];
        }
    }
    free(d);
    return AL_OK;
}

/* Broadcast t (ndim <= 4, right-aligned) to [b,h,sq,skv]: strides with 0 on broadcast dims. */
static al_status broadcast4(const char *arg, const al_tensor *t, const int64_t want[4], int64_t stride[4]) {
    char buf[96];
    if (t->ndim < 1 || t->ndim > 4)
        return al_error(AL_ERR_ARG, "attention: %s must have 1 to 4 dims, got %s", arg, al_tensor_describe(t, buf, sizeof buf));
    for (int d = 0; d < 4; d++) {
        int sd = d - (4 - t->ndim);
        if (sd < 0) { stride[d] = 0; continue; }
        if (t->size[sd] == want[d]) stride[d] = want[d] == 1 ? 0 : t->stride[sd];
        else if (t->size[sd] == 1) stride[d] = 0;
        else
            return al_error(AL_ERR_ARG, "attention: %s of shape %s is not broadcastable to [%lld,%lld,%lld,%lld]", arg,
                            al_tensor_describe(t, buf, sizeof buf), (long long)want[0], (long long)want[1],
                            (long long)want[2], (long long)want[3]);
    }
    return AL_OK;
}

static al_status check_given(const char *what, int64_t given, int64_t actual) {
    if (given != 0 && given != actual)
        return al_error(AL_ERR_ARG, "attention: params.%s = %lld does not match the tensors (%lld)", what,
                        (long long)given, (long long)actual);
    return AL_OK;
}

/* ---- variants (al_attn_variant: score_mod / mask_mod snippets for the flash kernels) ---------------- */
enum { VARIANT_MAX_SNIPPET = 64 * 1024 };   /* bytes per snippet: generated code is far shorter */

static al_status check_snippet(const char *field, const char *text, int hook) {
    if (!text) return AL_OK;
    size_t n = strnlen(text, (size_t)VARIANT_MAX_SNIPPET + 1);
    if (n > VARIANT_MAX_SNIPPET)
        return al_error(AL_ERR_ARG, "attention: variant.%s: expected at most %d bytes of CUDA C, given more", field,
                        VARIANT_MAX_SNIPPET);
    /* a hook becomes a one-line macro body (newlines turn into spaces): a // comment would swallow the rest */
    if (hook && strstr(text, "//"))
        return al_error(AL_ERR_ARG, "attention: variant.%s: expected no // comment (the snippet becomes a one-line macro; "
                        "write /* ... */), given \"%.80s\"", field, text);
    return AL_OK;
}

static al_status check_variant(al_attn_plan *pl) {
    const al_attn_variant *v = pl->in.variant;
    if (!v) return AL_OK;
    const al_tensor *q = pl->in.q;
    const al_attn_params *p = &pl->p;
    char b1[96], arg[48];
    AL_TRY(check_snippet("score_mod", v->score_mod, 1));
    AL_TRY(check_snippet("score_grad", v->score_grad, 1));
    AL_TRY(check_snippet("mask_mod", v->mask_mod, 1));
    AL_TRY(check_snippet("capture_grad", v->capture_grad, 1));
    AL_TRY(check_snippet("prelude", v->prelude, 0));
    AL_TRY(check_snippet("score_pre", v->score_pre, 1));
    if (v->score_pre && !v->score_mod)
        return al_error(AL_ERR_ARG, "attention: variant.score_pre: expected score_mod beside it (the same function in "
                        "terms of score), given score_pre alone");
    /* an f32 > 0 whose product with log2(e) (the kernels' exponent multiplier) is finite in f32; NaN fails */
    if (v->score_pre && !((float)v->score_post > 0 && isfinite((float)(v->score_post * 1.4426950408889634))))
        return al_error(AL_ERR_ARG, "attention: variant.score_post: expected a finite constant > 0 (an f32 number), "
                        "given %g", v->score_post);
    AL_TRY(check_snippet("score_grad_pre", v->score_grad_pre, 1));
    if (v->score_grad_pre && !(v->score_pre && v->score_grad))
        return al_error(AL_ERR_ARG, "attention: variant.score_grad_pre: expected score_pre and score_grad beside it (the "
                        "folded form of score_grad), given %s", v->score_pre ? "no score_grad" : "no score_pre");
    if (v->score_bounded && !v->score_mod)
        return al_error(AL_ERR_ARG, "attention: variant.score_bounded: expected score_mod beside it (the bounds are the "
                        "new logit's), given score_bounded = %d alone", (int)v->score_bounded);
    if (v->score_bounded && !(isfinite(v->score_lo) && isfinite(v->score_hi) && v->score_lo <= v->score_hi))
        return al_error(AL_ERR_ARG, "attention: variant.score_lo / score_hi: expected finite bounds with score_lo <= "
                        "score_hi, given [%g, %g]", v->score_lo, v->score_hi);
    if (v->score_mufu != 0 && v->score_mufu != 1)
        return al_error(AL_ERR_ARG, "attention: variant.score_mufu: expected 0 or 1, given %d", (int)v->score_mufu);
    if (v->score_mufu && !v->score_mod)
        return al_error(AL_ERR_ARG, "attention: variant.score_mufu: expected score_mod beside it (the hint is about "
                        "score_mod's math), given score_mufu = 1 alone");
    if (v->ncaptures < 0 || v->ncaptures > AL_ATTN_VARIANT_MAX_CAPTURES)
        return al_error(AL_ERR_ARG, "attention: variant.ncaptures: expected 0..%d, given %d", AL_ATTN_VARIANT_MAX_CAPTURES,
                        v->ncaptures);
    for (int k = 0; k < v->ncaptures; k++) {
        const al_tensor *c = v->captures[k];
        snprintf(arg, sizeof arg, "variant.captures[%d]", k);
        AL_TRY(al_check_tensor("attention", arg, c));
        if (c->device_type != q->device_type || (q->device_type == AL_DEVICE_CUDA && c->device_index != q->device_index))
            return al_error(AL_ERR_ARG, "attention: %s: expected a tensor on q's device (%s:%d), given %s", arg,
                            q->device_type == AL_DEVICE_CPU ? "cpu" : "cuda", q->device_index,
                            al_tensor_describe(c, b1, sizeof b1));
        const al_tensor *g = v->capture_grads[k];
        if (!g) continue;
        snprintf(arg, sizeof arg, "variant.capture_grads[%d]", k);
        AL_TRY(al_check_tensor("attention", arg, g));
        if (g->dtype != AL_DTYPE_F32 || !al_tensor_is_contiguous(g) || al_tensor_numel(g) != al_tensor_numel(c) ||
            g->device_type != c->device_type || g->device_index != c->device_index)
            return al_error(AL_ERR_ARG, "attention: %s: expected a contiguous f32 tensor of %lld elements (capture %d's "
                            "numel) on capture %d's device, given %s", arg, (long long)al_tensor_numel(c), k, k,
                            al_tensor_describe(g, b1, sizeof b1));
    }
    const al_tensor *m = v->block_mask;
    if (!m) return AL_OK;
    AL_TRY(al_check_tensor("attention", "variant.block_mask", m));
    if (v->block_m <= 0 || v->block_n <= 0)
        return al_error(AL_ERR_ARG, "attention: variant.block_m / block_n: expected > 0 with a block_mask, given %lld and %lld",
                        (long long)v->block_m, (long long)v->block_n);
    const int64_t mb = (p->sq + v->block_m - 1) / v->block_m, nb = (p->skv + v->block_n - 1) / v->block_n;
    if (m->dtype != AL_DTYPE_U8 || m->ndim != 4 || (m->size[0] != 1 && m->size[0] != p->b) ||
        (m->size[1] != 1 && m->size[1] != p->h) || m->size[2] != mb || m->size[3] != nb)
        return al_error(AL_ERR_ARG, "attention: variant.block_mask: expected u8 [1|%lld, 1|%lld, %lld, %lld] (b, h, "
                        "ceil(sq=%lld / block_m=%lld), ceil(skv=%lld / block_n=%lld)), given %s", (long long)p->b,
                        (long long)p->h, (long long)mb, (long long)nb, (long long)p->sq, (long long)v->block_m,
                        (long long)p->skv, (long long)v->block_n, al_tensor_describe(m, b1, sizeof b1));
    if (m->device_type != q->device_type || (q->device_type == AL_DEVICE_CUDA && m->device_index != q->device_index))
        return al_error(AL_ERR_ARG, "attention: variant.block_mask: expected a tensor on q's device (%s:%d), given %s",
                        q->device_type == AL_DEVICE_CPU ? "cpu" : "cuda", q->device_index, al_tensor_describe(m, b1, sizeof b1));
    for (int d = 0; d < 4; d++) pl->bmask_stride[d] = m->size[d] == 1 ? 0 : m->stride[d];
    return AL_OK;
}

/* ---- building a plan: one step per function, in order (plan_build_inner) ------------------------------ */

/* q, k, v's dtypes and devices, and the parameter codes */
static al_status plan_check_codes(const al_attn_plan *pl) {
    const al_attn_params *p = &pl->p;
    const al_attn_inputs *in = &pl->in;
    AL_TRY(check_qkv("q (query_layer)", in->q, in->fp8));
    AL_TRY(check_qkv("k (key_layer)", in->k, in->fp8));
    AL_TRY(check_qkv("v (value_layer)", in->v, in->fp8));
    if (in->q->dtype != in->k->dtype || in->q->dtype != in->v->dtype)
        return al_error(AL_ERR_ARG, "attention: q, k and v must have one dtype, got %s, %s, %s",
                        al_dtype_name(in->q->dtype), al_dtype_name(in->k->dtype), al_dtype_name(in->v->dtype));
    AL_TRY(al_check_same_device("attention", in->q, in->k));
    AL_TRY(al_check_same_device("attention", in->q, in->v));
    if (p->qkv_format < 0 || p->qkv_format > 2)
        return al_error(AL_ERR_ARG, "attention: qkv_format must be sbhd, bshd or thd (0..2), got %d", p->qkv_format);
    if (p->mask_type < 0 || p->mask_type > 6)
        return al_error(AL_ERR_ARG, "attention: attn_mask_type code %d is not one of 0..6", p->mask_type);
    if (p->bias_type < 0 || p->bias_type > 3)
        return al_error(AL_ERR_ARG, "attention: core_attention_bias_type code %d is not one of 0..3", p->bias_type);
    if (p->softmax_type < 0 || p->softmax_type > 2)
        return al_error(AL_ERR_ARG, "attention: softmax_type code %d is not one of 0..2", p->softmax_type);
    if (p->compute_dtype != AL_DTYPE_F32 && p->compute_dtype != AL_DTYPE_F64)
        return al_error(AL_ERR_ARG, "attention: compute dtype must be f32 or f64, got %s", al_dtype_name(p->compute_dtype));
    if (!(p->dropout_p >= 0.0 && p->dropout_p < 1.0))
        return al_error(AL_ERR_ARG, "attention: attention_dropout must be in [0, 1), got %g", p->dropout_p);
    return AL_OK;
}

/* the shapes: h, hg, d_qk, d_v and b (and, for sbhd / bshd, sq and skv) into p, each checked against a value
 * the caller gave; thd's sq / skv come from cu_seqlens (plan_seqlens) */
static al_status plan_shapes(al_attn_plan *pl) {
    al_attn_params *p = &pl->p;
    const al_attn_inputs *in = &pl->in;
    char b1[96], b2[96];
    const int thd = p->qkv_format == AL_ATTN_FORMAT_THD;
    const int nd = thd ? 3 : 4;
    const al_tensor *q = in->q, *k = in->k, *v = in->v;
    if (q->ndim != nd || k->ndim != nd || v->ndim != nd)
        return al_error(AL_ERR_ARG, "attention: qkv_format=%s needs %dD q, k, v, got %s, %s and %dD v",
                        al_attn_format_name(p->qkv_format), nd, al_tensor_describe(q, b1, sizeof b1),
                        al_tensor_describe(k, b2, sizeof b2), v->ndim);
    int64_t h = q->size[nd - 2], hg = k->size[nd - 2], dqk = q->size[nd - 1], dv = v->size[nd - 1];
    if (v->size[nd - 2] != hg)
        return al_error(AL_ERR_ARG, "attention: keys and values must have the same head count, got %lld and %lld",
                        (long long)hg, (long long)v->size[nd - 2]);
    if (k->size[nd - 1] != dqk)
        return al_error(AL_ERR_ARG, "attention: queries and keys must have the same head dim (d_qk), got %lld and %lld",
                        (long long)dqk, (long long)k->size[nd - 1]);
    for (int d = 0; d < nd - 1; d++)
        if (k->size[d] != v->size[d])
            return al_error(AL_ERR_ARG, "attention: k.shape[:-1] must equal v.shape[:-1], got %s and %s",
                            al_tensor_describe(k, b1, sizeof b1), al_tensor_describe(v, b2, sizeof b2));
    if (hg <= 0 || h % hg != 0)
        return al_error(AL_ERR_ARG, "attention: num_attention_heads (%lld) must be a multiple of num_gqa_groups (%lld)",
                        (long long)h, (long long)hg);
    if (dqk <= 0 || dv <= 0) return al_error(AL_ERR_ARG, "attention: head dims must be positive, got %lld and %lld",
                                             (long long)dqk, (long long)dv);
    AL_TRY(check_given("h", p->h, h));
    AL_TRY(check_given("hg", p->hg, hg));
    AL_TRY(check_given("d_qk", p->d_qk, dqk));
    AL_TRY(check_given("d_v", p->d_v, dv));
    p->h = h; p->hg = hg; p->d_qk = dqk; p->d_v = dv;

    int64_t b, sq = 0, skv = 0;
    if (thd) {
        if (!is_padding_mask(p->mask_type))
            return al_error(AL_ERR_ARG, "attention: qkv_format=thd needs a padding mask type (padding, padding_causal, "
                            "padding_causal_bottom_right), got %s", al_attn_mask_name(p->mask_type));
        if (!in->cu_seqlens_q || !in->cu_seqlens_kv)
            return al_error(AL_ERR_ARG, "attention: qkv_format=thd needs cu_seqlens_q and cu_seqlens_kv");
        if (in->attention_mask || in->attention_mask_kv)
            return al_error(AL_ERR_ARG, "attention: qkv_format=thd takes padding from cu_seqlens, not attention_mask");
        if (in->cu_seqlens_q->ndim != 1 || in->cu_seqlens_q->size[0] < 2)
            return al_error(AL_ERR_ARG, "attention: cu_seqlens_q must be 1-d with batch + 1 >= 2 entries, got %s",
                            al_tensor_describe(in->cu_seqlens_q, b1, sizeof b1));
        b = in->cu_seqlens_q->size[0] - 1;
    } else {
        int bd = p->qkv_format == AL_ATTN_FORMAT_SBHD ? 1 : 0, sd = 1 - bd;
        b = q->size[bd]; sq = q->size[sd]; skv = k->size[sd];
        if (k->size[bd] != b)
            return al_error(AL_ERR_ARG, "attention: q and k batch sizes differ (%lld and %lld) for qkv_format=%s",
                            (long long)b, (long long)k->size[bd], al_attn_format_name(p->qkv_format));
    }
    AL_TRY(check_given("b", p->b, b));
    p->b = b;
    if (!thd) {
        AL_TRY(check_given("sq", p->sq, sq));
        AL_TRY(check_given("skv", p->skv, skv));
        p->sq = sq; p->skv = skv;
    }
    return AL_OK;
}

/* thd: each side's start and length from cu_seqlens (and cu_seqlens_*_padded), and max_seqlen into p->sq / skv;
 * cu and cup are scratch of b + 1 entries each */
static al_status plan_seqlens_thd(al_attn_plan *pl, int64_t *cu, int64_t *cup) {
    al_attn_params *p = &pl->p;
    const al_attn_inputs *in = &pl->in;
    const int64_t b = p->b;
    for (int side = 0; side < 2; side++) {
        const al_tensor *c = side ? in->cu_seqlens_kv : in->cu_seqlens_q;
        const al_tensor *cp = side ? in->cu_seqlens_kv_padded : in->cu_seqlens_q_padded;
        const char *nm = side ? "cu_seqlens_kv" : "cu_seqlens_q";
        const char *nmp = side ? "cu_seqlens_kv_padded" : "cu_seqlens_q_padded";
        const char *count = side ? "the key tensor's token count" : "the query tensor's token count";
        const int64_t t = side ? in->k->size[0] : in->q->size[0];
        int64_t *start = side ? pl->kv_start : pl->q_start, *len = side ? pl->kv_len : pl->q_len;
        AL_TRY(read_cu(nm, c, b, cp ? INT64_MAX : t, count, cu));
        if (cp) {
            AL_TRY(read_cu(nmp, cp, b, t, count, cup));
            for (int64_t i = 0; i < b; i++)
                if (cu[i + 1] - cu[i] > cup[i + 1] - cup[i])
                    return al_error(AL_ERR_ARG, "attention: sequence %lld has %lld tokens in %s but only %lld slots in %s",
                                    (long long)i, (long long)(cu[i + 1] - cu[i]), nm, (long long)(cup[i + 1] - cup[i]), nmp);
        }
        int64_t mx = 0;
        for (int64_t i = 0; i < b; i++) {
            start[i] = cp ? cup[i] : cu[i];
            len[i] = cu[i + 1] - cu[i];
            if (len[i] > mx) mx = len[i];
        }
        int64_t *given = side ? &p->skv : &p->sq;
        if (*given == 0) *given = mx;
        else if (*given < mx)
            return al_error(AL_ERR_ARG, "attention: max_seqlen_%s = %lld is below the longest sequence (%lld)",
                            side ? "kv" : "q", (long long)*given, (long long)mx);
    }
    return AL_OK;
}

/* sbhd / bshd: every sequence sq / skv long, unless padding shortens them (cu_seqlens, or a padding attention_mask
 * read into q_valid / kv_valid); cu is scratch of b + 1 entries */
static al_status plan_seqlens_dense(al_attn_plan *pl, int64_t *cu) {
    const al_attn_params *p = &pl->p;
    const al_attn_inputs *in = &pl->in;
    const int64_t b = p->b, sq = p->sq, skv = p->skv;
    if (in->cu_seqlens_q_padded || in->cu_seqlens_kv_padded)
        return al_error(AL_ERR_ARG, "attention: cu_seqlens_q_padded/cu_seqlens_kv_padded apply to qkv_format=thd only");
    for (int64_t i = 0; i < b; i++) { pl->q_len[i] = sq; pl->kv_len[i] = skv; }
    if ((in->cu_seqlens_q || in->cu_seqlens_kv || in->attention_mask) && !pl->has_padding &&
        p->mask_type != AL_ATTN_MASK_ARBITRARY)
        return al_error(AL_ERR_ARG, "attention: attention_mask/cu_seqlens given but attn_mask_type=%s has no padding "
                        "(use padding, padding_causal or padding_causal_bottom_right)", al_attn_mask_name(p->mask_type));
    if (pl->has_padding && (in->cu_seqlens_q || in->cu_seqlens_kv)) {
        if (!in->cu_seqlens_q || !in->cu_seqlens_kv) return al_error(AL_ERR_ARG, "attention: give both cu_seqlens_q and cu_seqlens_kv");
        if (in->attention_mask) return al_error(AL_ERR_ARG, "attention: give padding as attention_mask or as cu_seqlens, not both");
        AL_TRY(read_cu("cu_seqlens_q", in->cu_seqlens_q, b, b * sq, "batch * max_seqlen_q", cu));
        for (int64_t i = 0; i < b; i++) {
            pl->q_len[i] = cu[i + 1] - cu[i];
            if (pl->q_len[i] > sq) return al_error(AL_ERR_ARG, "attention: cu_seqlens_q gives sequence %lld length %lld > sq = %lld", (long long)i, (long long)pl->q_len[i], (long long)sq);
        }
        AL_TRY(read_cu("cu_seqlens_kv", in->cu_seqlens_kv, b, b * skv, "batch * max_seqlen_kv", cu));
        for (int64_t i = 0; i < b; i++) {
            pl->kv_len[i] = cu[i + 1] - cu[i];
            if (pl->kv_len[i] > skv) return al_error(AL_ERR_ARG, "attention: cu_seqlens_kv gives sequence %lld length %lld > skv = %lld", (long long)i, (long long)pl->kv_len[i], (long long)skv);
        }
    } else if (pl->has_padding && in->attention_mask) {
        pl->q_valid = malloc((size_t)(b * sq > 0 ? b * sq : 1));
        pl->kv_valid = malloc((size_t)(b * skv > 0 ? b * skv : 1));
        if (!pl->q_valid || !pl->kv_valid) return al_error(AL_ERR_OOM, "attention: out of memory");
        AL_TRY(read_padding_mask("attention_mask", in->attention_mask, b, sq, pl->q_valid, pl->q_len));
        if (in->attention_mask_kv) {
            AL_TRY(read_padding_mask("attention_mask_kv", in->attention_mask_kv, b, skv, pl->kv_valid, pl->kv_len));
        } else if (sq == skv) {
            memcpy(pl->kv_valid, pl->q_valid, (size_t)(b * sq));
            memcpy(pl->kv_len, pl->q_len, sizeof(int64_t) * (size_t)b);
        } else {
            return al_error(AL_ERR_ARG, "attention: cross-attention (sq=%lld, skv=%lld) with a padding attention_mask needs "
                            "the key-side mask too (attention_mask = {q_mask, kv_mask})", (long long)sq, (long long)skv);
        }
    } else if (in->attention_mask_kv) {
        return al_error(AL_ERR_ARG, "attention: attention_mask_kv given without a padding attention_mask");
    }
    return AL_OK;
}

/* the per-sequence arrays (q_start ... diag: the plan's inline ones for small batches, else one block) filled
 * with each sequence's start, length and rows */
static al_status plan_seqlens(al_attn_plan *pl) {
    const al_attn_params *p = &pl->p;
    const int64_t b = p->b;
    const size_t nb = (size_t)(b > 0 ? b : 1);
    pl->q_start = nb <= AL_ATTN_PLAN_INLINE_B ? pl->small_b : calloc(8 * nb, sizeof(int64_t));
    if (!pl->q_start) return al_error(AL_ERR_OOM, "attention: out of memory");
    pl->kv_start = pl->q_start + nb; pl->q_len = pl->kv_start + nb; pl->kv_len = pl->q_len + nb;
    pl->q_rows = pl->kv_len + nb; pl->kv_rows = pl->q_rows + nb; pl->diag = pl->kv_rows + nb;
    pl->has_padding = is_padding_mask(p->mask_type);
    /* cu_seqlens read as int64: b + 1 entries, and as many for the padded offsets */
    int64_t cu_small[2 * (AL_ATTN_PLAN_INLINE_B + 1)];
    int64_t *cu = nb <= AL_ATTN_PLAN_INLINE_B ? cu_small : malloc(sizeof(int64_t) * 2 * (nb + 1));
    if (!cu) return al_error(AL_ERR_OOM, "attention: out of memory");
    const al_status st = p->qkv_format == AL_ATTN_FORMAT_THD ? plan_seqlens_thd(pl, cu, cu + nb + 1)
                                                              : plan_seqlens_dense(pl, cu);
    if (cu != cu_small) free(cu);
    if (st != AL_OK) return st;
    for (int64_t i = 0; i < b; i++) {
        pl->q_rows[i] = pl->q_valid ? p->sq : pl->q_len[i];
        pl->kv_rows[i] = pl->kv_valid ? p->skv : pl->kv_len[i];
    }
    return AL_OK;
}

/* an arbitrary attention_mask, and the window (TE check_set_window_size; Lua warns where TE warns) with the
 * diagonal each sequence's mask is aligned to */
static al_status plan_masks(al_attn_plan *pl) {
    al_attn_params *p = &pl->p;
    const al_attn_inputs *in = &pl->in;
    char b1[96];
    if (p->mask_type == AL_ATTN_MASK_ARBITRARY) {
        if (!in->attention_mask) return al_error(AL_ERR_ARG, "attention: attn_mask_type=arbitrary needs attention_mask");
        if (in->attention_mask_kv) return al_error(AL_ERR_ARG, "attention: attn_mask_type=arbitrary takes one attention_mask");
        if (p->qkv_format == AL_ATTN_FORMAT_THD)
            return al_error(AL_ERR_ARG, "attention: attn_mask_type=arbitrary is not supported with qkv_format=thd");
        const al_tensor *m = in->attention_mask;
        AL_TRY(al_check_tensor("attention", "attention_mask", m));
        if (m->dtype != AL_DTYPE_U8 && m->dtype != AL_DTYPE_BOOL)
            return al_error(AL_ERR_ARG, "attention: attention_mask must be u8 or bool (True = masked out), got %s",
                            al_tensor_describe(m, b1, sizeof b1));
        if (m->device_type != AL_DEVICE_CPU && in->q->device_type == AL_DEVICE_CPU)
            return al_error(AL_ERR_ARG, "attention: attention_mask must be on the device of q");
        int64_t want[4] = {p->b, p->h, p->sq, p->skv};
        AL_TRY(broadcast4("attention_mask", m, want, pl->arb_stride));
        pl->has_arb = 1;
        pl->arb_offset = m->offset;
    } else if (!pl->has_padding && (in->attention_mask || in->attention_mask_kv)) {
        return al_error(AL_ERR_ARG, "attention: attention_mask given but attn_mask_type=%s ignores it", al_attn_mask_name(p->mask_type));
    }
    int64_t wl = p->window_left, wr = p->window_right;
    if (wl < -1 || wr < -1)
        return al_error(AL_ERR_ARG, "attention: window_size entries must be >= -1, got (%lld, %lld)", (long long)wl, (long long)wr);
    if (is_causal_mask(p->mask_type)) {
        if (wl == -1 && wr == -1) wr = 0;                     /* TE: no window -> (-1, 0) */
        else if (wl >= 0 && wr != 0) wr = 0;                  /* TE forces wr = 0 (with a warning) */
        else if (wr != 0)
            return al_error(AL_ERR_ARG, "attention: window_size should be (-1, 0) or (>=0, 0) for attn_mask_type=%s, got (%lld, %lld)",
                            al_attn_mask_name(p->mask_type), (long long)wl, (long long)wr);
        p->bottom_right_diagonal = (p->mask_type == AL_ATTN_MASK_CAUSAL_BOTTOM_RIGHT ||
                                    p->mask_type == AL_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT);
    } else {
        if (wl == -1 && wr == 0) wr = -1;                     /* TE: (-1, 0) -> (-1, -1) (with a warning) */
        else if (!(wl == -1 && wr == -1) && (wl < 0 || wr < 0))
            return al_error(AL_ERR_ARG, "attention: window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type=%s, got (%lld, %lld)",
                            al_attn_mask_name(p->mask_type), (long long)wl, (long long)wr);
        if (p->bottom_right_diagonal < 0) p->bottom_right_diagonal = 1;
    }
    p->window_left = wl; p->window_right = wr;
    pl->bottom_right = p->bottom_right_diagonal ? 1 : 0;
    for (int64_t i = 0; i < p->b; i++) pl->diag[i] = pl->bottom_right ? pl->kv_len[i] - pl->q_len[i] : 0;
    return AL_OK;
}

/* core_attention_bias: [b|1, h|1, sq|1, skv] for pre / post-scale bias, absent otherwise */
static al_status plan_bias(al_attn_plan *pl) {
    const al_attn_params *p = &pl->p;
    const al_tensor *B = pl->in.bias;
    char b1[96];
    if (p->bias_type != AL_ATTN_BIAS_PRE_SCALE && p->bias_type != AL_ATTN_BIAS_POST_SCALE) {
        if (B)
            return al_error(AL_ERR_ARG, "attention: core_attention_bias given but core_attention_bias_type is %s",
                            p->bias_type == 0 ? "no_bias" : "alibi");
        return AL_OK;
    }
    const int64_t b = p->b, h = p->h, sq = p->sq, skv = p->skv;
    if (!B) return al_error(AL_ERR_ARG, "attention: core_attention_bias_type=%s needs core_attention_bias",
                            p->bias_type == 1 ? "pre_scale_bias" : "post_scale_bias");
    AL_TRY(check_float("core_attention_bias", B));
    if (B->ndim != 4 || (B->size[0] != b && B->size[0] != 1) || (B->size[1] != h && B->size[1] != 1) ||
        (B->size[2] != sq && B->size[2] != 1) || B->size[3] != skv)
        return al_error(AL_ERR_ARG, "attention: core_attention_bias must be [b|1, h|1, sq|1, skv] = one of bhss, 1hss, "
                        "b1ss, 11ss, 111s with b=%lld h=%lld sq=%lld skv=%lld, got %s", (long long)b, (long long)h,
                        (long long)sq, (long long)skv, al_tensor_describe(B, b1, sizeof b1));
    if (B->size[2] == 1 && (B->size[0] != 1 || B->size[1] != 1) && sq != 1)
        return al_error(AL_ERR_ARG, "attention: core_attention_bias with sq extent 1 must be 111s ([1,1,1,skv]), got %s",
                        al_tensor_describe(B, b1, sizeof b1));
    if (B->device_type != pl->in.q->device_type) return al_error(AL_ERR_ARG, "attention: core_attention_bias must be on q's device");
    int64_t want[4] = {b, h, sq, skv};
    AL_TRY(broadcast4("core_attention_bias", B, want, pl->bias_stride));
    pl->bias_offset = B->offset;
    pl->has_grad_bias = 1;
    return AL_OK;
}

/* ALiBi's slopes, [b * h] f32: alibi_slopes ([h] or [b, h]) or TE's defaults */
static al_status plan_alibi(al_attn_plan *pl) {
    const al_attn_params *p = &pl->p;
    const al_tensor *s = pl->in.alibi_slopes;
    char b1[96];
    if (p->bias_type != AL_ATTN_BIAS_ALIBI) {
        if (s) return al_error(AL_ERR_ARG, "attention: alibi_slopes given but core_attention_bias_type is not alibi");
        return AL_OK;
    }
    const int64_t b = p->b, h = p->h;
    /* room for h default slopes even when b = 0 (al_attn_default_alibi_slopes writes h; found by fuzz_attn_args) */
    pl->alibi = malloc(sizeof(float) * (size_t)((b > 1 ? b : 1) * (h > 0 ? h : 1)));
    if (!pl->alibi) return al_error(AL_ERR_OOM, "attention: out of memory");
    if (!s) {
        al_attn_default_alibi_slopes(h, pl->alibi);
        for (int64_t i = h; i < b * h; i++) pl->alibi[i] = pl->alibi[i % h];
        return AL_OK;
    }
    AL_TRY(al_check_tensor("attention", "alibi_slopes", s));
    if (s->dtype != AL_DTYPE_F32)
        return al_error(AL_ERR_ARG, "attention: alibi_slopes must be f32, got %s", al_tensor_describe(s, b1, sizeof b1));
    int per_batch = s->ndim == 2 && s->size[0] == b && s->size[1] == h;
    if (!(s->ndim == 1 && s->size[0] == h) && !per_batch)
        return al_error(AL_ERR_ARG, "attention: alibi_slopes must be [h] or [b, h] = [%lld] or [%lld, %lld], got %s",
                        (long long)h, (long long)b, (long long)h, al_tensor_describe(s, b1, sizeof b1));
    /* [h] slopes are read whole even when b = 0 (a heap overflow before; found by fuzz_attn_args) */
    double *d = malloc(sizeof(double) * (size_t)((b > 1 ? b : 1) * h));
    if (!d) return al_error(AL_ERR_OOM, "attention: out of memory");
    const al_status st = al_tensor_read_f64(s, d, per_batch ? b * h : h);
    if (st != AL_OK) { free(d); return al_error_prefix(st, "attention"); }
    for (int64_t i = 0; i < b * h; i++) pl->alibi[i] = (float)d[per_batch ? i : i % h];
    free(d);
    return AL_OK;
}

/* the softmax's offsets per head: 0 (off-by-one) or softmax_offset (learnable); none for vanilla */
static al_status plan_softmax(al_attn_plan *pl) {
    const al_attn_params *p = &pl->p;
    const int64_t h = p->h;
    char b1[96];
    if (p->softmax_type == AL_ATTN_SOFTMAX_VANILLA) return AL_OK;
    pl->softmax_offset = calloc((size_t)h, sizeof(double));
    if (!pl->softmax_offset) return al_error(AL_ERR_OOM, "attention: out of memory");
    if (p->softmax_type != AL_ATTN_SOFTMAX_LEARNABLE) return AL_OK;
    const al_tensor *o = pl->in.softmax_offset;
    if (!o) return al_error(AL_ERR_ARG, "attention: softmax_type=learnable needs softmax_offset [h]");
    AL_TRY(check_float("softmax_offset", o));
    int ok = (o->ndim == 1 && o->size[0] == h) || (o->ndim == 4 && o->size[0] == 1 && o->size[1] == h &&
                                                  o->size[2] == 1 && o->size[3] == 1);
    if (!ok) return al_error(AL_ERR_ARG, "attention: softmax_offset must be [h] = [%lld], got %s", (long long)h,
                             al_tensor_describe(o, b1, sizeof b1));
    double *d = malloc(sizeof(double) * (size_t)h);
    if (!d) return al_error(AL_ERR_OOM, "attention: out of memory");
    const al_status st = al_tensor_read_f64(o, d, h);
    if (st != AL_OK) { free(d); return al_error_prefix(st, "attention"); }
    for (int64_t i = 0; i < h; i++) pl->softmax_offset[i] = d[i];
    free(d);
    return AL_OK;
}

static al_status plan_build_inner(al_attn_plan *pl) {
    al_attn_params *p = &pl->p;
    AL_TRY(plan_check_codes(pl));
    AL_TRY(plan_shapes(pl));
    AL_TRY(plan_seqlens(pl));
    AL_TRY(plan_masks(pl));
    AL_TRY(plan_bias(pl));
    AL_TRY(plan_alibi(pl));
    AL_TRY(plan_softmax(pl));
    AL_TRY(check_fp8(pl));
    AL_TRY(check_variant(pl));
    if (p->softmax_scale == 0.0) p->softmax_scale = 1.0 / sqrt((double)p->d_qk);
    if (!isfinite(p->softmax_scale))
        return al_error(AL_ERR_ARG, "attention: softmax_scale must be finite, got %g", p->softmax_scale);
    return AL_OK;
}

al_status al_attn_plan_build(al_attn_plan *pl, const al_attn_params *p, const al_attn_inputs *in) {
    memset(pl, 0, sizeof *pl);
    if (!p || !in) return al_error(AL_ERR_ARG, "attention: params and inputs must not be NULL");
    if (!in->q || !in->k || !in->v) return al_error(AL_ERR_ARG, "attention: q, k and v are required");
    pl->p = *p;
    pl->in = *in;
    al_status s = plan_build_inner(pl);
    if (s != AL_OK) al_attn_plan_free(pl);
    return s;
}
