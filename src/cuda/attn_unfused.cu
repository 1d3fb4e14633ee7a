/*
 * cuda/attn_unfused.cu — the `unfused` attention backend: the GPU reference. It serves everything the
 * CPU backend does (every mask, window, bias shape, ALiBi, softmax type, dropout, GQA/MQA, MLA head
 * dims, sbhd/bshd/thd, any strides) for f32, f16 and bf16 tensors on one CUDA device, computing in f32.
 *
 * Forward:  S = Q K^T            cuBLASLt, straight over q's and k's REAL strides (select views of a
 *                                packed buffer included); contiguous f32 copies only when the strides
 *                                are not a BLAS layout or cuBLASLt has no kernel for the alignment
 *           P = masked softmax   one kernel: scale, bias, ALiBi, mask, sink, lse, max_logit, dropout
 *           O = P V              cuBLASLt (V read in place when it is f32, else as an f32 copy)
 *           out <- O             zero-filled first (padding rows, thd gaps), then the valid rows
 * Backward (P recomputed from Q, K and the forward's lse, as the CPU does):
 *           Q, K, V, dO -> contiguous f32 [b, heads, s, d] (zero past each sequence)
 *           S = Q K^T, dPd = dO V^T                       one batched GEMM each
 *           dS = P (dPd Z - rowsum(dO O)), PD = P Z       element-wise (Z: dropout keep / (1-p))
 *           dV = PD^T dO, dQ = scale dS K, dK = scale dS^T Q   one batched GEMM each; GQA sums over the
 *                                query heads of a group by stacking them along the GEMM's K dimension
 *           dq, dk, dv <- zero-filled through their real strides, then the valid rows (so the select
 *                                views of one packed gradient buffer are written in place)
 *           dbias: dS reduced over the bias's broadcast dims; d softmax_offset: -sum exp(o - lse) Drow
 *
 * GQA: query head h reads kv head h / (h / hg). The forward GEMMs are batched either over the batch
 * (one call per query head) or over the kv heads (one call per batch entry and head-in-group,
 * batch stride group * head stride), whichever needs fewer calls; thd is one call per sequence and
 * head-in-group, with each sequence's real length and memory offset.
 *
 * Memory: the f32 score matrix [b, h, sq, skv] is materialised (O(s^2)): once in the forward, twice
 * in the backward (S/dS and dPd/PD), plus O(s) f32 copies. supports() declines when one score matrix
 * would exceed ATTNLAB_UNFUSED_MAX_SCORE_BYTES (default 8 GiB), naming the size.
 */
#include "cuda/attn_unfused.h"
#include "numeric/fp8_scale.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define UA_DEFAULT_MAX_SCORE_BYTES ((int64_t)8 << 30)

static int64_t max_score_bytes(void) {
    const char *e = getenv("ATTNLAB_UNFUSED_MAX_SCORE_BYTES");
    if (e && *e) {
        char *end = NULL;
        double v = strtod(e, &end);
        if (end != e && v > 0) return (int64_t)v;
    }
    return UA_DEFAULT_MAX_SCORE_BYTES;
}

/* ---- supports -------------------------------------------------------------------------------------- */
static int32_t ua_supports(const al_attn_plan *pl, char *reason, size_t n) {
    const al_attn_params *p = &pl->p;
    const al_tensor *q = pl->in.q;
    if (q->device_type != AL_DEVICE_CUDA) {
        snprintf(reason, n, "tensors are on the cpu");
        return 0;
    }
    const int32_t dev = q->device_index;
    if (dev < 0 || dev >= al_cu_ndev) {
        snprintf(reason, n, "device cuda:%d does not exist", dev);
        return 0;
    }
    const int f8 = pl->in.fp8 != NULL;
    const int q8 = q->dtype == AL_DTYPE_FP8_E4M3 || q->dtype == AL_DTYPE_FP8_E5M2;
    if (f8 && p->softmax_type != AL_ATTN_SOFTMAX_VANILLA) {
        snprintf(reason, n, "FP8 with softmax sinks (softmax_type %s) is emulated by the cpu backend only",
                 p->softmax_type == AL_ATTN_SOFTMAX_OFF_BY_ONE ? "off-by-one" : "learnable");
        return 0;
    }
    if (q->dtype != AL_DTYPE_F32 && q->dtype != AL_DTYPE_F16 && q->dtype != AL_DTYPE_BF16 && !(f8 && q8)) {
        snprintf(reason, n, "%s inputs: the unfused backend takes f32, f16 and bf16 (f64 runs on the cpu backend)",
                 al_dtype_name(q->dtype));
        return 0;
    }
    if (p->compute_dtype != AL_DTYPE_F32) {
        snprintf(reason, n, "compute_dtype=%s: the unfused backend computes in f32", al_dtype_name(p->compute_dtype));
        return 0;
    }
    const al_tensor *same[] = {pl->in.k, pl->in.v, pl->in.bias};
    for (int t = 0; t < 3; t++)
        if (same[t] && (same[t]->device_type != AL_DEVICE_CUDA || same[t]->device_index != dev)) {
            snprintf(reason, n, "%s is not on cuda:%d with q", t == 0 ? "k" : t == 1 ? "v" : "core_attention_bias", dev);
            return 0;
        }
    const al_tensor *m = pl->has_arb ? pl->in.attention_mask : NULL;
    if (m && m->device_type == AL_DEVICE_CUDA && m->device_index != dev) {
        snprintf(reason, n, "attention_mask is on cuda:%d, q on cuda:%d", m->device_index, dev);
        return 0;
    }
    const double bytes = 4.0 * (double)p->b * (double)p->h * (double)p->sq * (double)p->skv;
    const int64_t limit = max_score_bytes();
    if (bytes > (double)limit) {
        snprintf(reason, n, "the f32 score matrix [b=%lld,h=%lld,sq=%lld,skv=%lld] needs %.2f GiB (twice that in the "
                 "backward), above the unfused backend's limit of %.2f GiB (ATTNLAB_UNFUSED_MAX_SCORE_BYTES)",
                 (long long)p->b, (long long)p->h, (long long)p->sq, (long long)p->skv, bytes / 1073741824.0,
                 (double)limit / 1073741824.0);
        return 0;
    }
    if (p->b * p->h * p->sq > INT32_MAX) {
        snprintf(reason, n, "b*h*sq = %lld query rows exceed the softmax kernel's grid", (long long)(p->b * p->h * p->sq));
        return 0;
    }
    return 1;
}

/* ---- per-call context ----------------------------------------------------------------------------------- */
typedef struct ua_ctx {
    int32_t dev;
    cudaStream_t s;
    al_ua_dev P;            /* device plan */
    void *blob;             /* device copy of the plan's arrays */
    int64_t blob_bytes;
    al_tensor arb_copy;     /* a device copy of a host arbitrary mask */
    void *ws;               /* cuBLASLt workspace */
    /* temporaries, released together */
    void *tmp[16];
    int64_t tmp_bytes[16];
    int ntmp;
} ua_ctx;

static al_status ua_alloc(ua_ctx *c, int64_t bytes, void **p) {
    *p = NULL;
    if (c->ntmp >= 16) return al_error(AL_ERR_INTERNAL, "attention (unfused): too many temporaries");
    AL_TRY(al_cu_malloc(c->dev, bytes > 0 ? bytes : 1, p));
    c->tmp[c->ntmp] = *p;
    c->tmp_bytes[c->ntmp] = bytes > 0 ? bytes : 1;
    c->ntmp++;
    return AL_OK;
}

static void ua_ctx_release(ua_ctx *c) {
    /* all work is queued on the device's one stream: blocks handed back to the caching allocator are
     * only reused by work queued after this call's kernels (allocator.cu) */
    for (int i = 0; i < c->ntmp; i++) al_cu_free(c->dev, c->tmp[i], c->tmp_bytes[i]);
    c->ntmp = 0;
    if (c->blob) al_cu_free(c->dev, c->blob, c->blob_bytes);
    if (c->ws) al_cu_free(c->dev, c->ws, (int64_t)AL_UA_WORKSPACE_BYTES);
    c->blob = NULL;
    c->ws = NULL;
    al_tensor_release(&c->arb_copy);
}

static int64_t align8(int64_t x) { return (x + 7) & ~(int64_t)7; }

/* Broadcast strides of t (ndim <= 4, right-aligned) onto [b,h,sq,skv] (as attention.c's broadcast4). */
static void broadcast_strides(const al_tensor *t, const int64_t want[4], int64_t st[4]) {
    for (int d = 0; d < 4; d++) {
        int sd = d - (4 - t->ndim);
        st[d] = (sd < 0 || t->size[sd] == 1 || want[d] == 1) ? 0 : t->stride[sd];
    }
}

/* Upload the plan's host arrays and fill c->P. */
static al_status ua_ctx_init(ua_ctx *c, const al_attn_plan *pl) {
    memset(c, 0, sizeof *c);
    const al_attn_params *p = &pl->p;
    c->dev = pl->in.q->device_index;
    AL_TRY(al_cu_begin("attention (unfused)", c->dev, &c->s));
    al_ua_dev *P = &c->P;
    const int64_t B = p->b, H = p->h;
    P->B = B; P->H = H; P->HG = p->hg; P->SQ = p->sq; P->SKV = p->skv; P->DQK = p->d_qk; P->DV = p->d_v;
    P->group = p->hg > 0 ? p->h / p->hg : 1;
    P->wl = p->window_left;
    P->wr = p->window_right;
    P->scale = (float)p->softmax_scale;
    P->bias_type = p->bias_type;
    P->dropout = p->dropout_p > 0.0;
    P->keep_prob = (float)(1.0 - p->dropout_p);
    P->dscale = P->dropout ? (float)(1.0 / (1.0 - p->dropout_p)) : 1.0f;
    P->seed = p->dropout_seed;
    P->offset = p->dropout_offset;

    /* blob layout: 5 int64 arrays [B] | sink_d f64 [H] | alibi f32 [B*H] | sink f32 [H] | q_valid | kv_valid */
    const int64_t o_i64 = 0, o_sinkd = o_i64 + 5 * 8 * B, o_alibi = align8(o_sinkd + 8 * H);
    const int64_t o_sink = align8(o_alibi + 4 * B * H), o_qv = align8(o_sink + 4 * H);
    const int64_t o_kvv = align8(o_qv + B * p->sq), total = align8(o_kvv + B * p->skv);
    char *h = (char *)calloc(1, (size_t)(total > 0 ? total : 8));
    if (!h) return al_error(AL_ERR_OOM, "attention (unfused): out of host memory for the plan");
    int64_t *i64 = (int64_t *)(h + o_i64);
    const int64_t *src[5] = {pl->q_start, pl->kv_start, pl->q_rows, pl->kv_rows, pl->diag};
    for (int a = 0; a < 5; a++) memcpy(i64 + a * B, src[a], sizeof(int64_t) * (size_t)B);
    if (pl->softmax_offset)
        for (int64_t k = 0; k < H; k++) {
            ((double *)(h + o_sinkd))[k] = (double)pl->softmax_offset[k];
            ((float *)(h + o_sink))[k] = (float)pl->softmax_offset[k];
        }
    if (pl->alibi) memcpy(h + o_alibi, pl->alibi, sizeof(float) * (size_t)(B * H));
    if (pl->q_valid) memcpy(h + o_qv, pl->q_valid, (size_t)(B * p->sq));
    if (pl->kv_valid) memcpy(h + o_kvv, pl->kv_valid, (size_t)(B * p->skv));
    c->blob_bytes = total > 0 ? total : 8;
    al_status st = al_cu_malloc(c->dev, c->blob_bytes, &c->blob);
    if (st == AL_OK) st = al_cu_memcpy_h2d(c->dev, c->blob, h, c->blob_bytes);   /* returns once h is staged */
    free(h);
    AL_TRY(st);
    char *d = (char *)c->blob;
    const int64_t *di = (const int64_t *)(d + o_i64);
    P->q_start = di; P->kv_start = di + B; P->q_rows = di + 2 * B; P->kv_rows = di + 3 * B; P->diag = di + 4 * B;
    P->sink_d = pl->softmax_offset ? (const double *)(d + o_sinkd) : NULL;
    P->sink = pl->softmax_offset ? (const float *)(d + o_sink) : NULL;
    P->alibi = pl->alibi ? (const float *)(d + o_alibi) : NULL;
    P->q_valid = pl->q_valid ? (const uint8_t *)(d + o_qv) : NULL;
    P->kv_valid = pl->kv_valid ? (const uint8_t *)(d + o_kvv) : NULL;

    const int64_t want[4] = {B, H, p->sq, p->skv};
    if (pl->has_arb) {
        const al_tensor *m = pl->in.attention_mask;
        if (m->device_type == AL_DEVICE_CUDA) {
            P->arb = (const uint8_t *)m->data;
            P->arb_off = pl->arb_offset;
            memcpy(P->arb_s, pl->arb_stride, sizeof P->arb_s);
        } else {   /* a host mask: one contiguous u8 copy on the device */
            AL_TRY(al_tensor_to(&c->arb_copy, m, AL_DTYPE_U8, AL_DEVICE_CUDA, c->dev));
            P->arb = (const uint8_t *)c->arb_copy.data;
            P->arb_off = c->arb_copy.offset;
            broadcast_strides(&c->arb_copy, want, P->arb_s);
        }
    }
    if (pl->has_grad_bias) {
        const al_tensor *b = pl->in.bias;
        P->bias = (const char *)b->data;
        P->bias_dtype = b->dtype;
        P->bias_off = pl->bias_offset;
        memcpy(P->bias_s, pl->bias_stride, sizeof P->bias_s);
    }
    return al_cu_malloc(c->dev, (int64_t)AL_UA_WORKSPACE_BYTES, &c->ws);
}

/* A q/k/v/out-like tensor in the plan's format as an al_ua_op (start: device array or NULL). */
static al_ua_op ua_op_of(const al_tensor *t, int32_t fmt, const int64_t *start) {
    al_ua_op o;
    o.dtype = t->dtype;
    o.base = (const char *)t->data + t->offset * al_dtype_size(t->dtype);
    if (fmt == AL_ATTN_FORMAT_THD) {
        o.s_b = 0; o.s_r = t->stride[0]; o.s_h = t->stride[1]; o.s_c = t->stride[2];
    } else if (fmt == AL_ATTN_FORMAT_SBHD) {
        o.s_r = t->stride[0]; o.s_b = t->stride[1]; o.s_h = t->stride[2]; o.s_c = t->stride[3];
    } else {
        o.s_b = t->stride[0]; o.s_r = t->stride[1]; o.s_h = t->stride[2]; o.s_c = t->stride[3];
    }
    o.s_tok = o.s_r;
    o.start = start;
    return o;
}

/* A contiguous f32 [B, heads, S, D] temporary as an al_ua_op. */
static al_ua_op ua_op_dense(const float *p, int64_t heads, int64_t S, int64_t D) {
    al_ua_op o;
    o.base = (const char *)p;
    o.dtype = AL_DTYPE_F32;
    o.s_b = heads * S * D; o.s_h = S * D; o.s_r = D; o.s_c = 1; o.s_tok = D;
    o.start = NULL;
    return o;
}

/* Transposed view (rows <-> cols) of an op: the token stride moves with the rows. */
static al_ua_op ua_op_t(al_ua_op o) {
    int64_t r = o.s_r;
    o.s_r = o.s_c;
    o.s_c = r;
    return o;
}

/* D(b, hq) [m x n] = X(b, hq) [m x k] . Y(b, hq / group) [k x n] for every batch entry and query head,
 * as forward GEMMs: X is indexed by query head, Y by kv head, D (contiguous f32, [B, H, SQ, ld]) by
 * query head. Extents: m = query rows, n / k = kv rows when n_kv / k_kv, else n_fixed / k_fixed.
 * start arrays (host) of X, Y: pl->q_start / kv_start when the op is a caller's thd tensor. */
static al_status ua_head_gemms(ua_ctx *c, const al_attn_plan *pl, const al_ua_op *X, const int64_t *x_start,
                               const al_ua_op *Y, const int64_t *y_start, float *D, int64_t ld, int n_kv,
                               int64_t n_fixed, int k_kv, int64_t k_fixed) {
    const al_ua_dev *P = &c->P;
    const int thd = pl->p.qkv_format == AL_ATTN_FORMAT_THD;
    const int64_t B = P->B, H = P->H, HG = P->HG, G = P->group, SQ = P->SQ, SKV = P->SKV;
    const int64_t xe = al_dtype_size(X->dtype), ye = al_dtype_size(Y->dtype);
    const int64_t d_head = SQ * ld;
    al_ua_mat x, y;
    x.dtype = X->dtype; x.rs = X->s_r; x.cs = X->s_c;
    y.dtype = Y->dtype; y.rs = Y->s_r; y.cs = Y->s_c;
    if (!thd && H <= B * G) {
        /* one call per query head, batched over b */
        x.rows = SQ; x.cols = k_kv ? SKV : k_fixed; x.bs = X->s_b;
        y.rows = x.cols; y.cols = n_kv ? SKV : n_fixed; y.bs = Y->s_b;
        for (int64_t hq = 0; hq < H; hq++) {
            x.ptr = X->base + hq * X->s_h * xe;
            y.ptr = Y->base + (hq / G) * Y->s_h * ye;
            AL_TRY(al_ua_gemm(c->dev, c->s, &x, &y, D + hq * d_head, ld, H * d_head, B, 1.0f, 0.0f, c->ws,
                              AL_UA_WORKSPACE_BYTES));
        }
        return AL_OK;
    }
    /* one call per (b, head-in-group g), batched over the kv heads: query head = hk * G + g */
    for (int64_t b = 0; b < B; b++) {
        const int64_t mq = thd ? pl->q_rows[b] : SQ, mk = thd ? pl->kv_rows[b] : SKV;
        x.rows = mq; x.cols = k_kv ? mk : k_fixed; x.bs = G * X->s_h;
        y.rows = x.cols; y.cols = n_kv ? mk : n_fixed; y.bs = Y->s_h;
        if (x.rows == 0 || y.cols == 0) continue;
        const int64_t xo = b * X->s_b + (x_start ? x_start[b] : 0) * X->s_tok;
        const int64_t yo = b * Y->s_b + (y_start ? y_start[b] : 0) * Y->s_tok;
        for (int64_t g = 0; g < G; g++) {
            x.ptr = X->base + (xo + g * X->s_h) * xe;
            y.ptr = Y->base + yo * ye;
            AL_TRY(al_ua_gemm(c->dev, c->s, &x, &y, D + (b * H + g) * d_head, ld, G * d_head, HG, 1.0f, 0.0f, c->ws,
                              AL_UA_WORKSPACE_BYTES));
        }
    }
    return AL_OK;
}

/* ---- forward ------------------------------------------------------------------------------------------ */
static al_status ua_forward_inner(ua_ctx *c, const al_attn_plan *pl, al_tensor *out, al_tensor *lse,
                                  al_tensor *max_logit) {
    const al_attn_params *p = &pl->p;
    const al_tensor *q = pl->in.q, *k = pl->in.k, *v = pl->in.v;
    const int32_t fmt = p->qkv_format;
    const al_ua_dev *P = &c->P;
    const int64_t B = P->B, H = P->H, HG = P->HG, SQ = P->SQ, SKV = P->SKV, DQK = P->DQK, DV = P->DV;

    int64_t osize[4];
    const int nd = q->ndim;
    for (int d = 0; d < nd; d++) osize[d] = q->size[d];
    osize[nd - 1] = DV;
    AL_TRY(al_tensor_empty(out, nd, osize, q->dtype, AL_DEVICE_CUDA, c->dev));
    AL_TRY(al_cu_fill(out, 0.0));
    const int64_t lsize[3] = {B, H, SQ};
    AL_TRY(al_tensor_empty(lse, 3, lsize, AL_DTYPE_F32, AL_DEVICE_CUDA, c->dev));
    if (max_logit) {
        AL_TRY(al_tensor_empty(max_logit, 1, &H, AL_DTYPE_F32, AL_DEVICE_CUDA, c->dev));
        AL_TRY(al_cu_fill(max_logit, -INFINITY));
    }

    float *S, *O;
    AL_TRY(ua_alloc(c, 4 * B * H * SQ * SKV, (void **)&S));
    AL_TRY(ua_alloc(c, 4 * B * H * SQ * DV, (void **)&O));
    AL_CUDA_TRY(cudaMemsetAsync(O, 0, (size_t)(4 * B * H * SQ * DV), c->s));

    /* S = Q K^T over the real strides; contiguous f32 copies when cuBLASLt cannot take them */
    al_ua_op oq = ua_op_of(q, fmt, P->q_start), ok = ua_op_of(k, fmt, P->kv_start), okt = ua_op_t(ok);
    al_status st = ua_head_gemms(c, pl, &oq, pl->q_start, &okt, pl->kv_start, S, SKV, 1, 0, 0, DQK);
    if (st == AL_ERR_UNSUPPORTED) {
        float *Q32, *K32;
        AL_TRY(ua_alloc(c, 4 * B * H * SQ * DQK, (void **)&Q32));
        AL_TRY(ua_alloc(c, 4 * B * HG * SKV * DQK, (void **)&K32));
        AL_TRY(al_ua_gather(c->dev, c->s, &oq, P->q_rows, B, H, SQ, DQK, Q32));
        AL_TRY(al_ua_gather(c->dev, c->s, &ok, P->kv_rows, B, HG, SKV, DQK, K32));
        al_ua_op dq = ua_op_dense(Q32, H, SQ, DQK), dk = ua_op_t(ua_op_dense(K32, HG, SKV, DQK));
        st = ua_head_gemms(c, pl, &dq, NULL, &dk, NULL, S, SKV, 1, 0, 0, DQK);
    }
    AL_TRY(st);

    AL_TRY(al_ua_softmax_fwd(c->dev, c->s, P, S, (float *)al_tensor_data_ptr(lse),
                             max_logit ? (float *)al_tensor_data_ptr(max_logit) : NULL));

    /* O = P V; V in place when it is f32 (and a BLAS layout), else an f32 copy */
    al_ua_op os = ua_op_dense(S, H, SQ, SKV), ov = ua_op_of(v, fmt, P->kv_start);
    st = AL_ERR_UNSUPPORTED;
    if (v->dtype == AL_DTYPE_F32) st = ua_head_gemms(c, pl, &os, NULL, &ov, pl->kv_start, O, DV, 0, DV, 1, 0);
    if (st == AL_ERR_UNSUPPORTED) {
        float *V32;
        AL_TRY(ua_alloc(c, 4 * B * HG * SKV * DV, (void **)&V32));
        AL_TRY(al_ua_gather(c->dev, c->s, &ov, P->kv_rows, B, HG, SKV, DV, V32));
        al_ua_op dv = ua_op_dense(V32, HG, SKV, DV);
        st = ua_head_gemms(c, pl, &os, NULL, &dv, NULL, O, DV, 0, DV, 1, 0);
    }
    AL_TRY(st);

    /* out (zero-filled above) <- the valid rows of O; padded rows of O are zero (P rows are zero) */
    al_ua_op oo = ua_op_of(out, fmt, P->q_start);
    AL_TRY(al_ua_scatter(c->dev, c->s, O, &oo, P->q_rows, B, H, SQ, DV));
    return AL_OK;
}

static al_status ua_forward(const al_attn_plan *pl, al_tensor *out, al_tensor *lse, al_tensor *max_logit) {
    ua_ctx c;
    al_status st = ua_ctx_init(&c, pl);
    if (st == AL_OK) st = ua_forward_inner(&c, pl, out, lse, max_logit);
    ua_ctx_release(&c);
    if (st != AL_OK) {
        st = al_error_prefix(st, "attention_forward (unfused)");
        al_tensor_release(out);
        al_tensor_release(lse);
        if (max_logit) al_tensor_release(max_logit);
    }
    return st;
}

/* ---- backward ----------------------------------------------------------------------------------------- */
static al_status ua_backward_inner(ua_ctx *c, const al_attn_plan *pl, const al_tensor *out, const al_tensor *dout,
                                   const al_tensor *lse, al_tensor *dq, al_tensor *dk, al_tensor *dv,
                                   al_tensor *dbias, al_tensor *d_softmax_offset) {
    const al_attn_params *p = &pl->p;
    const int32_t fmt = p->qkv_format;
    const al_ua_dev *P = &c->P;
    const int64_t B = P->B, H = P->H, HG = P->HG, G = P->group, SQ = P->SQ, SKV = P->SKV, DQK = P->DQK, DV = P->DV;
    const int64_t T = B * HG;                   /* GEMM batch: (b, kv head) */
    char b1[96];
    if (out->device_type != AL_DEVICE_CUDA || dout->device_type != AL_DEVICE_CUDA || lse->device_type != AL_DEVICE_CUDA ||
        dq->device_type != AL_DEVICE_CUDA || dk->device_type != AL_DEVICE_CUDA || dv->device_type != AL_DEVICE_CUDA)
        return al_error(AL_ERR_ARG, "out, dout, lse, dq, dk and dv must be on cuda:%d with q", c->dev);
    if (!al_dtype_is_float(lse->dtype))
        return al_error(AL_ERR_ARG, "lse must be a float tensor, got %s", al_tensor_describe(lse, b1, sizeof b1));

    float *Q32, *K32, *V32, *G32, *A, *Bm, *dQ32, *dK32, *dV32, *Drow, *Lrow;
    double *rowc = NULL;
    AL_TRY(ua_alloc(c, 4 * B * H * SQ * DQK, (void **)&Q32));
    AL_TRY(ua_alloc(c, 4 * T * SKV * DQK, (void **)&K32));
    AL_TRY(ua_alloc(c, 4 * T * SKV * DV, (void **)&V32));
    AL_TRY(ua_alloc(c, 4 * B * H * SQ * DV, (void **)&G32));
    AL_TRY(ua_alloc(c, 4 * B * H * SQ * SKV, (void **)&A));
    AL_TRY(ua_alloc(c, 4 * B * H * SQ * SKV, (void **)&Bm));
    AL_TRY(ua_alloc(c, 4 * B * H * SQ * DQK, (void **)&dQ32));
    AL_TRY(ua_alloc(c, 4 * T * SKV * DQK, (void **)&dK32));
    AL_TRY(ua_alloc(c, 4 * T * SKV * DV, (void **)&dV32));
    AL_TRY(ua_alloc(c, 4 * B * H * SQ, (void **)&Drow));
    AL_TRY(ua_alloc(c, 4 * B * H * SQ, (void **)&Lrow));
    const int learnable = p->softmax_type == AL_ATTN_SOFTMAX_LEARNABLE && d_softmax_offset;
    if (learnable) AL_TRY(ua_alloc(c, 8 * B * H * SQ, (void **)&rowc));
    /* K == 0 GEMMs (empty sequences) leave their outputs untouched: start from zeros */
    AL_CUDA_TRY(cudaMemsetAsync(dQ32, 0, (size_t)(4 * B * H * SQ * DQK), c->s));
    AL_CUDA_TRY(cudaMemsetAsync(dK32, 0, (size_t)(4 * T * SKV * DQK), c->s));
    AL_CUDA_TRY(cudaMemsetAsync(dV32, 0, (size_t)(4 * T * SKV * DV), c->s));
    if (DQK == 0 || DV == 0) {   /* the S / dPd GEMMs below would not write them */
        AL_CUDA_TRY(cudaMemsetAsync(A, 0, (size_t)(4 * B * H * SQ * SKV), c->s));
        AL_CUDA_TRY(cudaMemsetAsync(Bm, 0, (size_t)(4 * B * H * SQ * SKV), c->s));
    }

    /* contiguous f32 copies, zero past each sequence's rows */
    al_ua_op oq = ua_op_of(pl->in.q, fmt, P->q_start), ok = ua_op_of(pl->in.k, fmt, P->kv_start);
    al_ua_op ov = ua_op_of(pl->in.v, fmt, P->kv_start), og = ua_op_of(dout, fmt, P->q_start);
    al_ua_op oo = ua_op_of(out, fmt, P->q_start);
    AL_TRY(al_ua_gather(c->dev, c->s, &oq, P->q_rows, B, H, SQ, DQK, Q32));
    AL_TRY(al_ua_gather(c->dev, c->s, &ok, P->kv_rows, B, HG, SKV, DQK, K32));
    AL_TRY(al_ua_gather(c->dev, c->s, &ov, P->kv_rows, B, HG, SKV, DV, V32));
    AL_TRY(al_ua_gather(c->dev, c->s, &og, P->q_rows, B, H, SQ, DV, G32));
    const int64_t ls[3] = {lse->stride[0], lse->stride[1], lse->stride[2]};
    AL_TRY(al_ua_rows_bwd(c->dev, c->s, P, &oo, &og, (const char *)lse->data, lse->dtype, lse->offset, ls, Drow, Lrow,
                          rowc));

    /* The query heads of one kv group are adjacent in the [B, H, SQ, *] temporaries, so a group is one
     * [G*SQ, *] matrix and every GEMM below is one call batched over T = B*HG. */
    const int64_t GS = G * SQ;
    al_ua_mat x, y;
    void *ws = c->ws;
    const size_t wsb = AL_UA_WORKSPACE_BYTES;
    x.dtype = y.dtype = AL_DTYPE_F32;
    /* S = Q K^T -> A */
    x.ptr = Q32; x.rows = GS; x.cols = DQK; x.rs = DQK; x.cs = 1; x.bs = GS * DQK;
    y.ptr = K32; y.rows = DQK; y.cols = SKV; y.rs = 1; y.cs = DQK; y.bs = SKV * DQK;
    AL_TRY(al_ua_gemm(c->dev, c->s, &x, &y, A, SKV, GS * SKV, T, 1.0f, 0.0f, ws, wsb));
    /* dPd = dO V^T -> Bm */
    x.ptr = G32; x.rows = GS; x.cols = DV; x.rs = DV; x.cs = 1; x.bs = GS * DV;
    y.ptr = V32; y.rows = DV; y.cols = SKV; y.rs = 1; y.cs = DV; y.bs = SKV * DV;
    AL_TRY(al_ua_gemm(c->dev, c->s, &x, &y, Bm, SKV, GS * SKV, T, 1.0f, 0.0f, ws, wsb));
    /* A -> dS (unscaled), Bm -> P Z */
    AL_TRY(al_ua_ds_bwd(c->dev, c->s, P, A, Bm, Lrow, Drow));

    if (dbias && pl->has_grad_bias) {
        const al_tensor *bias = pl->in.bias;
        AL_TRY(al_tensor_empty(dbias, bias->ndim, bias->size, bias->dtype, AL_DEVICE_CUDA, c->dev));
        const double factor = p->bias_type == AL_ATTN_BIAS_PRE_SCALE ? (double)(float)p->softmax_scale : 1.0;
        AL_TRY(al_ua_dbias(c->dev, c->s, P, A, bias->size, factor, (char *)al_tensor_data_ptr(dbias), bias->dtype));
    }
    if (learnable) {
        AL_TRY(al_tensor_empty(d_softmax_offset, 1, &H, AL_DTYPE_F32, AL_DEVICE_CUDA, c->dev));
        AL_TRY(al_ua_doffset(c->dev, c->s, P, rowc, (float *)al_tensor_data_ptr(d_softmax_offset)));
    }

    /* dV = (P Z)^T dO: [SKV, G*SQ] x [G*SQ, DV] */
    x.ptr = Bm; x.rows = SKV; x.cols = GS; x.rs = 1; x.cs = SKV; x.bs = GS * SKV;
    y.ptr = G32; y.rows = GS; y.cols = DV; y.rs = DV; y.cs = 1; y.bs = GS * DV;
    AL_TRY(al_ua_gemm(c->dev, c->s, &x, &y, dV32, DV, SKV * DV, T, 1.0f, 0.0f, ws, wsb));
    /* dQ = scale dS K: [G*SQ, SKV] x [SKV, DQK] */
    x.ptr = A; x.rows = GS; x.cols = SKV; x.rs = SKV; x.cs = 1; x.bs = GS * SKV;
    y.ptr = K32; y.rows = SKV; y.cols = DQK; y.rs = DQK; y.cs = 1; y.bs = SKV * DQK;
    AL_TRY(al_ua_gemm(c->dev, c->s, &x, &y, dQ32, DQK, GS * DQK, T, P->scale, 0.0f, ws, wsb));
    /* dK = scale dS^T Q: [SKV, G*SQ] x [G*SQ, DQK] */
    x.ptr = A; x.rows = SKV; x.cols = GS; x.rs = 1; x.cs = SKV; x.bs = GS * SKV;
    y.ptr = Q32; y.rows = GS; y.cols = DQK; y.rs = DQK; y.cs = 1; y.bs = GS * DQK;
    AL_TRY(al_ua_gemm(c->dev, c->s, &x, &y, dK32, DQK, SKV * DQK, T, P->scale, 0.0f, ws, wsb));

    /* the caller's gradients, through their real strides: zeros everywhere, then the valid rows */
    AL_TRY(al_cu_fill(dq, 0.0));
    AL_TRY(al_cu_fill(dk, 0.0));
    AL_TRY(al_cu_fill(dv, 0.0));
    al_ua_op gq = ua_op_of(dq, fmt, P->q_start), gk = ua_op_of(dk, fmt, P->kv_start), gv = ua_op_of(dv, fmt, P->kv_start);
    AL_TRY(al_ua_scatter(c->dev, c->s, dQ32, &gq, P->q_rows, B, H, SQ, DQK));
    AL_TRY(al_ua_scatter(c->dev, c->s, dK32, &gk, P->kv_rows, B, HG, SKV, DQK));
    AL_TRY(al_ua_scatter(c->dev, c->s, dV32, &gv, P->kv_rows, B, HG, SKV, DV));
    return AL_OK;
}

static al_status ua_backward(const al_attn_plan *pl, const al_tensor *out, const al_tensor *dout, const al_tensor *lse,
                             al_tensor *dq, al_tensor *dk, al_tensor *dv, al_tensor *dbias, al_tensor *d_softmax_offset) {
    ua_ctx c;
    al_status st = ua_ctx_init(&c, pl);
    if (st == AL_OK) st = ua_backward_inner(&c, pl, out, dout, lse, dq, dk, dv, dbias, d_softmax_offset);
    ua_ctx_release(&c);
    if (st != AL_OK) {
        st = al_error_prefix(st, "attention_backward (unfused)");
        if (dbias) al_tensor_release(dbias);
        if (d_softmax_offset) al_tensor_release(d_softmax_offset);
    }
    return st;
}

/* ---- FP8: exact emulation (the CPU's, src/cpu/attention_fwd.c / attention_bwd.c) -----------------------
 * Slot by slot as the cpu backend, so either is the other's oracle: FP8 q, k, v read as code * descale (one
 * qkv_scale_inv, or per-token descales), float q, k, v (MXFP8 recipes quantise them upstream) as they are; the
 * S slot inside the softmax kernel (P.V reads the CPU's tile-wise unnormalised P, quantised -> dequantised) and
 * in the backward's dS kernel with the dP slot; O, dO and dQKV quantised -> dequantised (given, current, or O
 * per token) around the f32 computation, or O handed back as its FP8 codes (fp8_output). The amaxes each call
 * reports and the scales it used go to fp8.amax / scale_used as the CPU's. What differs from the CPU is only
 * the f32 summation order of the GEMMs and the exp's last bit, which can move a value across an FP8 rounding
 * boundary now and then. */

/* *t (f32, token dims then heads and the head dim) times rows (f32, one value per token: t's shape without its
 * last two dims), in f32 (an exact product rounded once, as the CPU's per-token descale); *t is replaced */
static al_status ua_f8_times_rows(al_tensor *t, const al_tensor *rows) {
    al_tensor a, b, m;
    memset(&a, 0, sizeof a); memset(&b, 0, sizeof b); memset(&m, 0, sizeof m);
    al_status st = al_tensor_unsqueeze(&a, rows, rows->ndim);
    if (st == AL_OK) st = al_tensor_unsqueeze(&b, &a, a.ndim);
    if (st == AL_OK) st = al_binary(&m, AL_BINARY_MUL, t, &b);
    al_tensor_release(&a);
    al_tensor_release(&b);
    al_tensor_release(t);
    *t = m;
    return st;
}

/* q, k, v of the FP8 plan as f32 tensors (t[i] new) or the caller's float tensors (aliases) */
static al_status ua_f8_inputs(const al_attn_plan *pl, al_tensor t[3]) {
    const al_attn_fp8 *fx = pl->in.fp8;
    const al_tensor *x[3] = {pl->in.q, pl->in.k, pl->in.v};
    const al_tensor *ds[3] = {fx->q_descale, fx->k_descale, fx->v_descale};
    for (int i = 0; i < 3; i++) {
        if (x[i]->dtype != AL_DTYPE_FP8_E4M3 && x[i]->dtype != AL_DTYPE_FP8_E5M2) {   /* (read in f32, as the CPU) */
            if (x[i]->dtype == AL_DTYPE_F32) AL_TRY(al_tensor_alias(&t[i], x[i]));
            else AL_TRY(al_tensor_to(&t[i], x[i], AL_DTYPE_F32, AL_DEVICE_CUDA, x[i]->device_index));
            continue;
        }
        AL_TRY(al_fp8_dequantize(&t[i], x[i], ds[i] ? 1.0 : fx->qkv_scale_inv, AL_DTYPE_F32));
        if (ds[i]) AL_TRY(ua_f8_times_rows(&t[i], ds[i]));   /* one descale per token */
    }
    return AL_OK;
}

/* dst (any strides, dtype) <- src (contiguous f32, dst's shape) quantised -> dequantised with scale (FP8 dst:
 * the codes; scale < 0: a plain copy); per_row: one current scale per token (O per token; pow2m = 2^margin) */
static al_status ua_f8_store(al_tensor *dst, const al_tensor *src, int32_t fmt, double scale, int per_row, double margin) {
    al_tensor c, d;
    memset(&c, 0, sizeof c);
    memset(&d, 0, sizeof d);
    al_status st;
    if (per_row) {   /* rows: the token dims (all but heads and the head dim) */
        al_tensor si;
        memset(&si, 0, sizeof si);
        st = al_fp8_quantize_rows(&c, &si, src, fmt, 2, margin);
        if (st == AL_OK) st = al_fp8_dequantize(&d, &c, 1.0, AL_DTYPE_F32);
        if (st == AL_OK) st = ua_f8_times_rows(&d, &si);
        if (st == AL_OK) st = al_tensor_copy_(dst, &d);
        al_tensor_release(&si);
    } else if (scale < 0.0) {
        st = al_tensor_copy_(dst, src);
    } else if (dst->dtype == fmt) {
        st = al_fp8_quantize(&c, src, fmt, scale);
        if (st == AL_OK) st = al_tensor_copy_(dst, &c);
    } else {
        st = al_fp8_quantize(&c, src, fmt, scale);
        if (st == AL_OK) st = al_fp8_dequantize(&d, &c, 1.0 / scale, dst->dtype);
        if (st == AL_OK) st = al_tensor_copy_(dst, &d);
    }
    al_tensor_release(&c);
    al_tensor_release(&d);
    return st;
}

/* the f8 fields of a context: formats, the S and dP scales, a zeroed amax pair */
static al_status ua_f8_ctx(ua_ctx *c, const al_attn_fp8 *fx) {
    c->P.f8 = 1;
    c->P.f8_fwd = fx->fwd_format;
    c->P.f8_bwd = fx->bwd_format;
    c->P.f8_sS = fx->scale[AL_FP8_SLOT_S];
    c->P.f8_sdP = fx->scale[AL_FP8_SLOT_DP];
    AL_TRY(ua_alloc(c, 2 * (int64_t)sizeof(double), (void **)&c->P.f8_amax));
    AL_CUDA_TRY(cudaMemsetAsync(c->P.f8_amax, 0, 2 * sizeof(double), c->s));
    return AL_OK;
}

static al_status ua_forward_fp8(const al_attn_plan *pl, al_tensor *out, al_tensor *lse, al_tensor *max_logit) {
    al_attn_fp8 *fx = pl->in.fp8;
    al_tensor in[3], o32;
    memset(in, 0, sizeof in);
    memset(&o32, 0, sizeof o32);
    al_attn_plan p2 = *pl;   /* (shares the plan's arrays; only the inputs change) */
    ua_ctx c;
    memset(&c, 0, sizeof c);
    al_status st = ua_f8_inputs(pl, in);
    if (st == AL_OK) {
        p2.in.q = &in[0]; p2.in.k = &in[1]; p2.in.v = &in[2];
        p2.in.fp8 = NULL;
        st = ua_ctx_init(&c, &p2);
    }
    if (st == AL_OK) st = ua_f8_ctx(&c, fx);
    if (st == AL_OK) st = ua_forward_inner(&c, &p2, &o32, lse, max_logit);
    double am[2] = {0.0, 0.0};
    if (st == AL_OK) st = al_cu_memcpy_d2h(c.dev, am, c.P.f8_amax, sizeof am);
    ua_ctx_release(&c);
    /* the O slot: amax of the f32 O, then its given, current or per-token scale */
    double amo = 0.0, so = fx->scale[AL_FP8_SLOT_O];
    const double p2m = exp2(fx->margin);
    if (st == AL_OK) st = al_amax(&o32, &amo);
    if (st == AL_OK && so == 0.0) so = al_fp8_current_scale(al_fp8_fmax(fx->fwd_format), amo, p2m);
    if (st == AL_OK) st = al_tensor_empty(out, o32.ndim, o32.size, fx->out_dtype, AL_DEVICE_CUDA, o32.device_index);
    if (st == AL_OK) st = ua_f8_store(out, &o32, fx->fwd_format, so, fx->o_per_token, fx->margin);
    for (int i = 0; i < 3; i++) al_tensor_release(&in[i]);
    al_tensor_release(&o32);
    if (st != AL_OK) {
        st = al_error_prefix(st, "attention_forward (unfused, fp8)");
        al_tensor_release(out);
        al_tensor_release(lse);
        if (max_logit) al_tensor_release(max_logit);
        return st;
    }
    const double sS = fx->scale[AL_FP8_SLOT_S];
    fx->amax[AL_FP8_SLOT_S] = sS >= 0 ? am[0] : 0.0;
    fx->amax[AL_FP8_SLOT_O] = amo;
    fx->scale_used[AL_FP8_SLOT_S] = sS >= 0 ? sS : -1.0;
    fx->scale_used[AL_FP8_SLOT_O] = fx->o_per_token ? 0.0 : so;
    return AL_OK;
}

static al_status ua_backward_fp8(const al_attn_plan *pl, const al_tensor *out, const al_tensor *dout, const al_tensor *lse,
                                 al_tensor *dq, al_tensor *dk, al_tensor *dv, al_tensor *dbias, al_tensor *d_softmax_offset) {
    al_attn_fp8 *fx = pl->in.fp8;
    const int32_t dev = pl->in.q->device_index;
    al_tensor in[3], o32, d32, g32[3];
    memset(in, 0, sizeof in);
    memset(&o32, 0, sizeof o32);
    memset(&d32, 0, sizeof d32);
    memset(g32, 0, sizeof g32);
    al_attn_plan p2 = *pl;
    ua_ctx c;
    memset(&c, 0, sizeof c);
    const double p2m = exp2(fx->margin);
    al_status st = ua_f8_inputs(pl, in);
    /* O as the forward left it: FP8 codes (fp8_output) read as code / scale_used[O], a float O as it is */
    if (st == AL_OK && (out->dtype == AL_DTYPE_FP8_E4M3 || out->dtype == AL_DTYPE_FP8_E5M2)) {
        const double so = fx->scale_used[AL_FP8_SLOT_O];
        if (!(so > 0.0))
            st = al_error(AL_ERR_ARG, "out holds FP8 codes (fp8_output), but fp8.scale_used[O] is %g, not the forward's "
                          "per-tensor scale", so);
        else st = al_fp8_dequantize(&o32, out, 1.0 / so, AL_DTYPE_F32);
    } else if (st == AL_OK) {
        st = al_tensor_alias(&o32, out);
    }
    /* dO quantised -> dequantised (given or current scale) into f32 */
    double amdo = 0.0, sdo = fx->scale[AL_FP8_SLOT_DO];
    if (st == AL_OK) st = al_amax(dout, &amdo);
    if (st == AL_OK && sdo == 0.0) sdo = al_fp8_current_scale(al_fp8_fmax(fx->bwd_format), amdo, p2m);
    if (st == AL_OK) st = al_tensor_empty(&d32, dout->ndim, dout->size, AL_DTYPE_F32, AL_DEVICE_CUDA, dev);
    if (st == AL_OK) st = ua_f8_store(&d32, dout, fx->bwd_format, sdo, 0, fx->margin);
    al_tensor *gd[3] = {dq, dk, dv};
    for (int i = 0; i < 3 && st == AL_OK; i++) st = al_tensor_empty(&g32[i], gd[i]->ndim, gd[i]->size, AL_DTYPE_F32, AL_DEVICE_CUDA, dev);
    if (st == AL_OK) {
        p2.in.q = &in[0]; p2.in.k = &in[1]; p2.in.v = &in[2];
        p2.in.fp8 = NULL;
        st = ua_ctx_init(&c, &p2);
    }
    if (st == AL_OK) st = ua_f8_ctx(&c, fx);
    if (st == AL_OK) st = ua_backward_inner(&c, &p2, &o32, &d32, lse, &g32[0], &g32[1], &g32[2], dbias, d_softmax_offset);
    double am[2] = {0.0, 0.0};
    if (st == AL_OK) st = al_cu_memcpy_d2h(c.dev, am, c.P.f8_amax, sizeof am);
    ua_ctx_release(&c);
    /* the dQKV slot: one scale over dq, dk, dv */
    double amg = 0.0, a, sg = fx->scale[AL_FP8_SLOT_DQKV];
    for (int i = 0; i < 3 && st == AL_OK; i++) {
        st = al_amax(&g32[i], &a);
        if (a != a || amg != amg) amg = NAN;
        else if (a > amg) amg = a;
    }
    if (st == AL_OK && sg == 0.0) sg = al_fp8_current_scale(al_fp8_fmax(fx->bwd_format), amg, p2m);
    for (int i = 0; i < 3 && st == AL_OK; i++) st = ua_f8_store(gd[i], &g32[i], fx->bwd_format, sg, 0, fx->margin);
    for (int i = 0; i < 3; i++) {
        al_tensor_release(&in[i]);
        al_tensor_release(&g32[i]);
    }
    al_tensor_release(&o32);
    al_tensor_release(&d32);
    if (st != AL_OK) {
        st = al_error_prefix(st, "attention_backward (unfused, fp8)");
        if (dbias) al_tensor_release(dbias);
        if (d_softmax_offset) al_tensor_release(d_softmax_offset);
        return st;
    }
    const double sdP = fx->scale[AL_FP8_SLOT_DP];
    fx->amax[AL_FP8_SLOT_DO] = amdo;
    fx->scale_used[AL_FP8_SLOT_DO] = sdo;
    fx->amax[AL_FP8_SLOT_DP] = sdP >= 0 ? am[1] : 0.0;
    fx->scale_used[AL_FP8_SLOT_DP] = sdP >= 0 ? sdP : -1.0;
    fx->amax[AL_FP8_SLOT_DQKV] = amg;
    fx->scale_used[AL_FP8_SLOT_DQKV] = sg;
    return AL_OK;
}

static al_status ua_forward_any(const al_attn_plan *pl, al_tensor *out, al_tensor *lse, al_tensor *max_logit) {
    return pl->in.fp8 ? ua_forward_fp8(pl, out, lse, max_logit) : ua_forward(pl, out, lse, max_logit);
}
static al_status ua_backward_any(const al_attn_plan *pl, const al_tensor *out, const al_tensor *dout, const al_tensor *lse,
                                 al_tensor *dq, al_tensor *dk, al_tensor *dv, al_tensor *dbias, al_tensor *d_softmax_offset) {
    return pl->in.fp8 ? ua_backward_fp8(pl, out, dout, lse, dq, dk, dv, dbias, d_softmax_offset)
                      : ua_backward(pl, out, dout, lse, dq, dk, dv, dbias, d_softmax_offset);
}

/* ---- registration --------------------------------------------------------------------------------------- */
/* fp8 = 1: supports() judges FP8 plans (the emulation above); fp8_ds = 0: delayed scaling on the device
 * reaches it through the front door's host resolution */
static const al_attn_backend g_unfused = {"unfused", ua_supports, ua_forward_any, ua_backward_any, 1, 0};

al_status al_cu_attn_unfused_register(void) { return al_attn_register_backend(&g_unfused); }
