/*
 * cuda/attn_fused_fp8.cu — the fused backend's FP8 attention: cuDNN's FP8 SDPA forward and backward
 * as composite operation graphs of the plain-C backend API (cudnn_graph.h), with their plan cache.
 * attn_fused.cu routes every plan that carries al_attn_fp8 settings here.
 *
 * The contract is the CPU emulation's (src/cpu/attention_fwd.c, attention_bwd.c: the oracle), slot
 * by slot, so a recipe sees the same scales and amaxes whichever backend ran:
 *   q, k, v   FP8 codes (fwd_format) read as code * qkv_scale_inv (one descale each)
 *   S         P = softmax, quantised with scale[S] before P.V; amax[S] = max P
 *   O         FP8 with scale[O] (given), or current scaling (scale[O] = 0): cuDNN on Hopper writes O
 *             only in FP8, so the O amax is measured by a first run and the graph runs again with
 *             fp8_max / amax / 2^margin (two runs; TE runs current scaling fused only on Blackwell,
 *             where O may be bf16). The caller gets O dequantised into fp8.out_dtype (a separate
 *             pass after the graph), or with fp8_output (out_dtype = the FP8 format) the graph's codes
 *             themselves; amax[O] is the pre-quantisation O.
 *   dO        the float dout quantised with scale[DO] (given, or current from its amax) before the run
 *   dP        the emulation quantises the score gradient dS = P (dP - D) and then multiplies by the
 *             softmax scale; cuDNN's graph multiplies first and quantises after. The graph is fed
 *             scale_dP' = scale[DP] / softmax_scale (descale_dP' = softmax_scale / scale[DP]), which
 *             gives the same FP8 codes and dQ/dK, and amax[DP] = cuDNN's amax / softmax_scale.
 *   dQKV      one scale over dq, dk, dv (given, or current: two runs as for O); dequantised into the
 *             caller's gradient tensors (any strides: packed gradient buffers work).
 *   O (bwd)   the forward's float out re-quantised with the scale the forward used
 *             (fp8.scale_used[O]; else scale[O]; else current), which restores its codes.
 *
 * Graphs (cudnn-frontend's SDPA FP8 nodes; S = [b,h,sq,skv] fp32 virtual, row = [b,h,sq,1]):
 *   forward   matmul(Q, K^T) -> *attn_scale -> *descale_Q -> *descale_K -> [causal: GEN_INDEX row/col,
 *             CMP_GE, select -inf] -> softmax (max, sub, exp, sum, log, add -> Stats, div) = P ->
 *             amax -> Amax_S; P * scale_S (FP8 virtual) -> matmul(., V) -> *descale_S -> *descale_V
 *             -> amax -> Amax_O; -> *scale_O -> O (FP8)
 *   backward  dO*O -> sum -> *descale_dO -> *descale_O = D; matmul(Q, K^T) -> *attn_scale ->
 *             *descale_Q -> *descale_K -> [causal] -> -Stats -> exp = E; E * scale_S (FP8) -> reshape
 *             ^T -> matmul(., dO) [GQA: head-group sum] -> *descale_S -> *descale_dO -> Amax_dV;
 *             *scale_dV -> dV; matmul(dO, V^T) -> *descale_dO -> *descale_V -> -D -> *E ->
 *             *attn_scale -> Amax_dP; *scale_dP (FP8) = dP8; reshape K^T -> K; matmul(dP8, K) ->
 *             *descale_dP -> *descale_K -> Amax_dQ; *scale_dQ -> dQ; reshape dP8^T -> matmul(., Q)
 *             [GQA] -> *descale_dP -> *descale_Q -> Amax_dK; *scale_dK -> dK
 * The scales, descales and amaxes are fp32 [1,1,1,1] tensors in device memory (one small block per
 * call, each at a 16-byte boundary); the softmax scale and -inf are by-value scalars.
 *
 * What is served (supports() gives the reason otherwise): sm_90+, cuDNN >= 9.10.2, FP8 q/k/v of one
 * format with one descale (no per-token descales), d_qk = d_v, d % 16 == 0, d <= 256 (backward:
 * d = 128 on Hopper, <= 128 on Blackwell), bshd/sbhd with any 16-byte aligned strides (packed
 * qkv_layer / kv_layer views as they are), no_mask or causal (top-left; bottom-right only where it
 * coincides with top-left), GQA/MQA, no bias/ALiBi/dropout/sink/padding/window/max_logit, S scale
 * given, O given or current per tensor.
 *
 * Plan cache (cudnn_plan_cache.h): FZ8_CACHE_CAP entries, least recently used evicted, keyed by
 * cuDNN version, device, direction, formats, extents, all strides and the causal flag; a refused
 * graph is cached with its reason. Scales and pointers are not in the key.
 */
#include "cuda/attn_fused_fp8.h"
#include "cuda/host_profile.h"
#include "cuda/cudnn_plan_cache.h"
#include "numeric/fp8_scale.h"
#include "numeric/fp8_delayed.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum uid8 {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF, U_DO, U_DQ, U_DK, U_DV,
    /* fp32 [1,1,1,1] device scalars, U_SC0 + i */
    U_SC0 = 20,
    U_DESC_Q = U_SC0, U_DESC_K, U_DESC_V, U_DESC_S, U_SCALE_S, U_SCALE_O, U_AMAX_S, U_AMAX_O,
    U_DESC_O, U_DESC_DO, U_DESC_DP, U_SCALE_DP, U_SCALE_DQ, U_SCALE_DK, U_SCALE_DV,
    U_AMAX_DP, U_AMAX_DQ, U_AMAX_DK, U_AMAX_DV,
    U_SC_END,
    U_COUNT = 48
};
#define NSC (U_SC_END - U_SC0)
#define SC_SLOT 16              /* bytes per device scalar: cuDNN tensors are declared 16-byte aligned */

enum { R_Q, R_K, R_V, R_O, R_DO, R_DQ, R_DK, R_DV, NROLE };
static const char *role_name[NROLE] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};

#define FZ8_CACHE_CAP 32
#define FZ8_MIN_VERSION 91002

typedef struct f8_key {
    int64_t version, device, backward, fmt, bfmt;
    int64_t b, h, hg, sq, skv, d;
    int64_t str[NROLE][4];      /* logical [b,h,s,d] strides; 0 for roles not in the graph */
    int64_t causal;
} f8_key;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t g_handle[AL_CU_MAX_DEVICES];

static int is_fp8(int32_t dt) { return dt == AL_DTYPE_FP8_E4M3 || dt == AL_DTYPE_FP8_E5M2; }

static_assert(sizeof(f8_key) % sizeof(int64_t) == 0, "f8_key must be whole int64 words (cudnn_plan_cache.h)");

/* The per-device handles of this path (cudnn_graph.cu's al_dnn_handle binds them; g_lock held). */
static al_status get_handle(int32_t dev, cudnnHandle_t *out, cudaStream_t *stream) {
    return al_dnn_handle(g_handle, dev, "attention (fused, fp8)", out, stream);
}

static void key_build(f8_key *k, const al_attn_plan *pl, int backward, const al_tensor *const t[NROLE]) {
    const al_attn_params *p = &pl->p;
    memset(k, 0, sizeof *k);
    k->version = (int64_t)cudnnGetVersion();
    k->device = pl->in.q->device_index;
    k->backward = backward;
    k->fmt = pl->in.q->dtype;
    k->bfmt = backward ? pl->in.fp8->bwd_format : 0;
    k->b = p->b; k->h = p->h; k->hg = p->hg; k->sq = p->sq; k->skv = p->skv; k->d = p->d_qk;
    for (int r = 0; r < NROLE; r++)
        if (t[r]) al_dnn_bhsd_strides(p->qkv_format, t[r], 0, k->str[r]);   /* bshd/sbhd only: no s_ext */
    k->causal = p->window_right == 0;
}

/* ---- graph building ----------------------------------------------------------------------------- */
static const cudnnDataType_t F32 = CUDNN_DATA_FLOAT, I32 = CUDNN_DATA_INT32, BOOL_ = CUDNN_DATA_BOOLEAN;

typedef struct f8_gb {
    al_dnn_graph *g;
    const f8_key *k;
    al_dnn sc, ni;              /* softmax scale, -inf (by value) */
    al_dnn dev[NSC];            /* device scalars, created on first use */
    int64_t sdim[4], sstr[4], rdim[4], rstr[4];
} f8_gb;

static void gb_init(f8_gb *b, al_dnn_graph *g, const f8_key *k) {
    memset(b, 0, sizeof *b);
    b->g = g;
    b->k = k;
    int64_t sd[4] = {k->b, k->h, k->sq, k->skv}, ss[4] = {k->h * k->sq * k->skv, k->sq * k->skv, k->skv, 1};
    int64_t rd[4] = {k->b, k->h, k->sq, 1}, rs[4] = {k->h * k->sq, k->sq, 1, 1};
    memcpy(b->sdim, sd, sizeof sd); memcpy(b->sstr, ss, sizeof ss);
    memcpy(b->rdim, rd, sizeof rd); memcpy(b->rstr, rs, sizeof rs);
    b->sc = al_dnn_scalar(g, U_SCALE, F32);
    b->ni = k->causal ? al_dnn_scalar(g, U_NEG_INF, F32) : NULL;
}

static al_dnn dsc(f8_gb *b, int64_t uid) {
    int i = (int)(uid - U_SC0);
    if (!b->dev[i]) b->dev[i] = al_dnn_scalar_dev(b->g, uid, F32);
    return b->dev[i];
}
static al_dnn vs(f8_gb *b, cudnnDataType_t dt) { return al_dnn_virtual(b->g, dt, b->sdim, b->sstr); }
static al_dnn vr(f8_gb *b) { return al_dnn_virtual(b->g, F32, b->rdim, b->rstr); }
/* a virtual [b, hh, s, d] fp32 tensor, dense */
static al_dnn vm(f8_gb *b, int64_t hh, int64_t s, int64_t d) {
    const int64_t dim[4] = {b->k->b, hh, s, d}, str[4] = {hh * s * d, s * d, d, 1};
    return al_dnn_virtual(b->g, F32, dim, str);
}

static al_dnn pw2(f8_gb *b, cudnnPointwiseMode_t m, cudnnDataType_t prec, al_dnn x, al_dnn y, al_dnn out) {
    al_dnn_pointwise(b->g, m, prec, x, y, NULL, out, 0);
    return out;
}
/* x * the device scalar uid, into out (a new fp32 virtual shaped like proto when out is NULL) */
static al_dnn mul_sc(f8_gb *b, al_dnn x, int64_t uid, al_dnn out) {
    return pw2(b, CUDNN_POINTWISE_MUL, F32, x, dsc(b, uid), out);
}

static al_dnn io_tensor(f8_gb *b, int role, int64_t uid, cudnnDataType_t dt, const int64_t dim[4], int transposed) {
    int64_t d[4] = {dim[0], dim[1], dim[2], dim[3]}, s[4];
    memcpy(s, b->k->str[role], sizeof s);
    if (transposed) {
        int64_t t = d[2]; d[2] = d[3]; d[3] = t;
        t = s[2]; s[2] = s[3]; s[3] = t;
    }
    return al_dnn_tensor(b->g, uid, dt, d, s, 0, 0, NULL);
}

/* causal (top-left, right bound 0): keep row >= col, else -inf (the frontend's composite band) */
static al_dnn causal_mask(f8_gb *b, al_dnn s) {
    al_dnn row = vs(b, I32), col = vs(b, I32);
    al_dnn_pointwise(b->g, CUDNN_POINTWISE_GEN_INDEX, F32, s, NULL, NULL, row, 2);
    al_dnn_pointwise(b->g, CUDNN_POINTWISE_GEN_INDEX, F32, s, NULL, NULL, col, 3);
    al_dnn keep = pw2(b, CUDNN_POINTWISE_CMP_GE, BOOL_, row, col, vs(b, BOOL_));
    al_dnn o = vs(b, F32);
    al_dnn_pointwise(b->g, CUDNN_POINTWISE_BINARY_SELECT, F32, s, b->ni, keep, o, 0);
    return o;
}

/* matmul(Q, K^T) -> *attn_scale -> *descale_Q -> *descale_K -> [causal] */
static al_dnn scores(f8_gb *b, al_dnn Q, al_dnn KT) {
    al_dnn s = vs(b, F32);
    al_dnn_matmul(b->g, Q, KT, s, NULL, NULL, NULL);
    s = pw2(b, CUDNN_POINTWISE_MUL, F32, s, b->sc, vs(b, F32));
    s = mul_sc(b, s, U_DESC_Q, vs(b, F32));
    s = mul_sc(b, s, U_DESC_K, vs(b, F32));
    if (b->k->causal) s = causal_mask(b, s);
    return s;
}

/* the frontend's matmul_fp8 tail: acc [GQA: head-group sum into hg heads] -> *descale_a -> *descale_b
 * -> amax -> amax_uid; -> *scale_c -> C */
static void fp8_tail(f8_gb *b, al_dnn acc, int gqa, int64_t s, int64_t d, int64_t desc_a, int64_t desc_b,
                     int64_t scale_c, int64_t amax_uid, al_dnn C) {
    const f8_key *k = b->k;
    int64_t hh = k->h;
    if (gqa) {
        al_dnn r = vm(b, k->hg, s, d);
        al_dnn_reduction(b->g, CUDNN_REDUCE_TENSOR_ADD, acc, r);
        acc = r;
        hh = k->hg;
    }
    al_dnn x = mul_sc(b, acc, desc_a, vm(b, hh, s, d));
    x = mul_sc(b, x, desc_b, vm(b, hh, s, d));
    mul_sc(b, x, scale_c, C);
    al_dnn_amax(b->g, x, amax_uid);
}

static void build_forward(al_dnn_graph *g, const f8_key *k) {
    f8_gb b;
    gb_init(&b, g, k);
    cudnnDataType_t io = al_dnn_fp8_type((int32_t)k->fmt);
    const int64_t qd[4] = {k->b, k->h, k->sq, k->d}, kd[4] = {k->b, k->hg, k->skv, k->d};
    al_dnn Q = io_tensor(&b, R_Q, U_Q, io, qd, 0);
    al_dnn KT = io_tensor(&b, R_K, U_K, io, kd, 1);
    al_dnn V = io_tensor(&b, R_V, U_V, io, kd, 0);
    al_dnn O = io_tensor(&b, R_O, U_O, io, qd, 0);
    al_dnn ST = al_dnn_tensor(g, U_STATS, F32, b.rdim, b.rstr, 0, 0, NULL);

    al_dnn s = scores(&b, Q, KT);
    al_dnn M = vr(&b);
    al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_MAX, s, M);
    al_dnn sm = pw2(&b, CUDNN_POINTWISE_SUB, F32, s, M, vs(&b, F32));
    al_dnn e = vs(&b, F32);
    al_dnn_pointwise(g, CUDNN_POINTWISE_EXP, F32, sm, NULL, NULL, e, 0);
    al_dnn Z = vr(&b);
    al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, Z);
    al_dnn lz = vr(&b);
    al_dnn_pointwise(g, CUDNN_POINTWISE_LOG, F32, Z, NULL, NULL, lz, 0);
    pw2(&b, CUDNN_POINTWISE_ADD, F32, M, lz, ST);
    al_dnn P = pw2(&b, CUDNN_POINTWISE_DIV, F32, e, Z, vs(&b, F32));
    al_dnn_amax(g, P, U_AMAX_S);
    al_dnn P8 = mul_sc(&b, P, U_SCALE_S, vs(&b, io));   /* P in the I/O type (FP8) for the 2nd matmul */

    al_dnn acc = vm(&b, k->h, k->sq, k->d);
    al_dnn_matmul(g, P8, V, acc, NULL, NULL, NULL);
    fp8_tail(&b, acc, 0, k->sq, k->d, U_DESC_S, U_DESC_V, U_SCALE_O, U_AMAX_O, O);
}

/* kfp8: the K re-described from K^T for dP K is typed FP8 instead of fp32 (the frontend's default for a
 * virtual, which the bf16 path uses): the fallback when cuDNN refuses the first form */
static void build_backward(al_dnn_graph *g, const f8_key *k, int kfp8) {
    f8_gb b;
    gb_init(&b, g, k);
    cudnnDataType_t io = al_dnn_fp8_type((int32_t)k->fmt), bio = al_dnn_fp8_type((int32_t)k->bfmt);
    const int64_t qd[4] = {k->b, k->h, k->sq, k->d}, kd[4] = {k->b, k->hg, k->skv, k->d};
    int gqa = k->h != k->hg;
    al_dnn Q = io_tensor(&b, R_Q, U_Q, io, qd, 0);
    al_dnn KT = io_tensor(&b, R_K, U_K, io, kd, 1);
    al_dnn VT = io_tensor(&b, R_V, U_V, io, kd, 1);
    al_dnn O = io_tensor(&b, R_O, U_O, io, qd, 0);
    al_dnn dO = io_tensor(&b, R_DO, U_DO, bio, qd, 0);
    al_dnn dQ = io_tensor(&b, R_DQ, U_DQ, bio, qd, 0);
    al_dnn dK = io_tensor(&b, R_DK, U_DK, bio, kd, 0);
    al_dnn dV = io_tensor(&b, R_DV, U_DV, bio, kd, 0);
    al_dnn ST = al_dnn_tensor(g, U_STATS, F32, b.rdim, b.rstr, 0, 0, NULL);

    /* D = rowsum(dO * O) * descale_dO * descale_O (the product shaped like dO, as the frontend infers) */
    al_dnn t0 = al_dnn_virtual(g, F32, qd, k->str[R_DO]);
    pw2(&b, CUDNN_POINTWISE_MUL, F32, dO, O, t0);
    al_dnn t1 = vr(&b);
    al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, t0, t1);
    al_dnn t2 = mul_sc(&b, t1, U_DESC_DO, vr(&b));
    al_dnn D = mul_sc(&b, t2, U_DESC_O, vr(&b));

    /* E = exp(S - Stats) */
    al_dnn s = scores(&b, Q, KT);
    s = pw2(&b, CUDNN_POINTWISE_SUB, F32, s, ST, vs(&b, F32));
    al_dnn E = vs(&b, F32);
    al_dnn_pointwise(g, CUDNN_POINTWISE_EXP, F32, s, NULL, NULL, E, 0);

    /* dV = (E * scale_S)^T dO */
    al_dnn P8 = mul_sc(&b, E, U_SCALE_S, vs(&b, io));
    const int64_t td[4] = {k->b, k->h, k->skv, k->sq}, ts[4] = {k->h * k->sq * k->skv, k->sq * k->skv, 1, k->skv};
    al_dnn PT = al_dnn_virtual(g, io, td, ts);
    al_dnn_reshape(g, P8, PT);
    al_dnn accv = vm(&b, k->h, k->skv, k->d);
    al_dnn_matmul(g, PT, dO, accv, NULL, NULL, NULL);
    fp8_tail(&b, accv, gqa, k->skv, k->d, U_DESC_S, U_DESC_DO, U_SCALE_DV, U_AMAX_DV, dV);

    /* dP = (dO V^T * descales - D) * E * attn_scale, quantised with scale_dP */
    al_dnn dp = vs(&b, F32);
    al_dnn_matmul(g, dO, VT, dp, NULL, NULL, NULL);
    dp = mul_sc(&b, dp, U_DESC_DO, vs(&b, F32));
    dp = mul_sc(&b, dp, U_DESC_V, vs(&b, F32));
    dp = pw2(&b, CUDNN_POINTWISE_SUB, F32, dp, D, vs(&b, F32));
    dp = pw2(&b, CUDNN_POINTWISE_MUL, F32, dp, E, vs(&b, F32));
    dp = pw2(&b, CUDNN_POINTWISE_MUL, F32, dp, b.sc, vs(&b, F32));
    al_dnn_amax(g, dp, U_AMAX_DP);
    al_dnn dP8 = mul_sc(&b, dp, U_SCALE_DP, vs(&b, bio));

    /* dQ = dP8 K */
    al_dnn Kv = al_dnn_tensor(g, g->next_vuid++, kfp8 ? io : F32, kd, k->str[R_K], 1, 0, NULL);
    al_dnn_reshape(g, KT, Kv);
    al_dnn accq = vm(&b, k->h, k->sq, k->d);
    al_dnn_matmul(g, dP8, Kv, accq, NULL, NULL, NULL);
    fp8_tail(&b, accq, 0, k->sq, k->d, U_DESC_DP, U_DESC_K, U_SCALE_DQ, U_AMAX_DQ, dQ);

    /* dK = dP8^T Q */
    al_dnn dPT = al_dnn_virtual(g, bio, td, ts);
    al_dnn_reshape(g, dP8, dPT);
    al_dnn acck = vm(&b, k->h, k->skv, k->d);
    al_dnn_matmul(g, dPT, Q, acck, NULL, NULL, NULL);
    fp8_tail(&b, acck, gqa, k->skv, k->d, U_DESC_DP, U_DESC_Q, U_SCALE_DK, U_AMAX_DK, dK);
}

/* ---- cache -------------------------------------------------------------------------------------- */
/* Form 0 of key k's graph; the backward has a fallback form 1 (see build_backward). cudnn_plan_cache.h. */
static int build_graph(al_dnn_graph *g, const void *key, int attempt, int64_t *flags) {
    const f8_key *k = (const f8_key *)key;
    (void)flags;
    if (attempt == 0 && !k->backward) build_forward(g, k);
    else if (attempt <= 1 && k->backward) build_backward(g, k, attempt);
    else return 0;
    return 1;
}

static al_dnn_cache_slot g_slots[FZ8_CACHE_CAP];
static f8_key g_keys[FZ8_CACHE_CAP];
static al_dnn_plan_cache g_cache = AL_DNN_PLAN_CACHE(g_slots, g_keys, build_graph);   /* g_lock held */

int64_t al_fz8_builds(void) {
    pthread_mutex_lock(&g_lock);
    int64_t n = g_cache.builds;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* ---- execution ---------------------------------------------------------------------------------- */
typedef struct f8_run {
    void *ptr[U_COUNT];
    float scale, ninf;
    float sc[NSC];              /* host values of the device scalars (amaxes read back into them) */
    void *dsc;                  /* device block: NSC slots of SC_SLOT bytes */
    void *ws;
    int64_t ws_bytes;
    int32_t dev;
    cudaStream_t stream;        /* the call's stream (the cuDNN handle's) */
    const double *ds_scale;     /* delayed scaling on the device (al_attn_fp8.ds): its scale [6], or NULL */
    double *ds_acc;             /* its accumulators [6] */
    double *ds_used;            /* al_attn_fp8.ds_used's data [6] */
    double softmax_scale;
    int backward;
} f8_run;

static al_status run_alloc(f8_run *r, int32_t dev, cudaStream_t stream, const al_dnn_cached_plan *e) {
    r->dev = dev;
    r->stream = stream;
    AL_TRY(al_cu_malloc(dev, NSC * SC_SLOT, &r->dsc));
    for (int i = 0; i < NSC; i++) r->ptr[U_SC0 + i] = (char *)r->dsc + i * SC_SLOT;
    r->ws_bytes = e->ws;
    if (e->ws > 0) AL_TRY(al_cu_malloc(dev, e->ws, &r->ws));
    r->ptr[U_SCALE] = &r->scale;
    r->ptr[U_NEG_INF] = &r->ninf;
    r->ninf = -INFINITY;
    return AL_OK;
}

static void run_free(f8_run *r) {
    if (r->dsc) al_cu_free(r->dev, r->dsc, NSC * SC_SLOT);
    if (r->ws) al_cu_free(r->dev, r->ws, r->ws_bytes);
    r->dsc = r->ws = NULL;
}

/* The scalars' upload and a deferred call's read-back are one-block kernels, not copies: a cudaMemcpyAsync
 * between two kernels hands the stream to a copy engine and back, and the next kernel starts only after that
 * round trip. Measured on the H200 at 4x16x4096x128 (docs/PERFORMANCE.md, session 8): back-to-back
 * FP8 forwards took 617 us per call by events around a 563 us cuDNN kernel (ncu), with two small copies per
 * call between the kernels. */
typedef struct { float v[NSC]; } f8_sc_vals;

/* the call's scalars (passed by value) into the device block */
__global__ void f8_sc_upload_kernel(char *dsc, f8_sc_vals a) {
    const int i = (int)threadIdx.x;
    if (i < NSC) *(float *)(dsc + i * SC_SLOT) = a.v[i];
}

/* the device block, and amax(dO) when given, into a deferred record's pinned host memory (mapped: the
 * kernel writes it directly; visible to the host once the record's event, recorded after, has completed) */
__global__ void f8_sc_readback_kernel(char *host, const char *dsc, const double *amax_do) {
    const int i = (int)threadIdx.x;
    if (i < NSC) *(volatile float *)(host + i * SC_SLOT) = *(const float *)(dsc + i * SC_SLOT);
    if (i == 0 && amax_do) *(volatile double *)(host + NSC * SC_SLOT) = *amax_do;
}

/* Delayed scaling on the device (al_attn_fp8.ds): the call's scalars computed on the device from ds's scales, with
 * the host path's double arithmetic (so the same floats): forward from ds's QKV, S, O scales, which it records in
 * used; backward from the forward's QKV, S, O (used: ds may have moved on since) and ds's dO, dP, dQKV, which it
 * records in used. One thread: a dozen scalars. */
__global__ void f8_sc_from_ds_kernel(char *dsc, const double *scale, double *used, double a, int backward) {
    if (threadIdx.x != 0) return;
#define W8(u, v) (*(float *)(dsc + ((u) - U_SC0) * SC_SLOT) = (v))
    for (int u = U_SC0; u < U_SC_END; u++) W8(u, 0.0f);   /* (the amax outputs start at 0, as uploaded) */
    if (!backward) {
        for (int i = 0; i < 3; i++) used[i] = scale[i];
    } else {
        for (int i = 3; i < 6; i++) used[i] = scale[i];
    }
    const double sqkv = used[AL_FP8_SLOT_QKV], sS = used[AL_FP8_SLOT_S];
    const float dq = (float)(1.0 / sqkv);
    W8(U_DESC_Q, dq);
    W8(U_DESC_K, dq);
    W8(U_DESC_V, dq);
    W8(U_SCALE_S, (float)sS);
    W8(U_DESC_S, (float)(1.0 / sS));
    if (!backward) {
        W8(U_SCALE_O, (float)used[AL_FP8_SLOT_O]);
    } else {
        const double so = used[AL_FP8_SLOT_O], sdo = used[AL_FP8_SLOT_DO], sdP = used[AL_FP8_SLOT_DP];
        const float g = (float)used[AL_FP8_SLOT_DQKV];
        W8(U_DESC_O, (float)(1.0 / so));
        W8(U_DESC_DO, (float)(1.0 / sdo));
        W8(U_SCALE_DP, (float)(sdP / a));
        W8(U_DESC_DP, (float)(a / sdP));
        W8(U_SCALE_DQ, g);
        W8(U_SCALE_DK, g);
        W8(U_SCALE_DV, g);
    }
#undef W8
}

/* the call's amaxes into ds's accumulators (max, NaN wins), as the host path reports them: forward S and O;
 * backward dP (over the softmax scale, see the header) and the max of dQ, dK, dV (dO's came from its quantise) */
__global__ void f8_sc_to_ds_kernel(double *acc, const char *dsc, double a, int backward) {
    if (threadIdx.x != 0) return;
#define R8(u) ((double)*(const float *)(dsc + ((u) - U_SC0) * SC_SLOT))
    if (!backward) {
        acc[AL_FP8_SLOT_S] = al_fp8_ds_max(acc[AL_FP8_SLOT_S], R8(U_AMAX_S));
        acc[AL_FP8_SLOT_O] = al_fp8_ds_max(acc[AL_FP8_SLOT_O], R8(U_AMAX_O));
    } else {
        acc[AL_FP8_SLOT_DP] = al_fp8_ds_max(acc[AL_FP8_SLOT_DP], R8(U_AMAX_DP) / a);
        const double g = al_fp8_ds_max(al_fp8_ds_max(al_fp8_ds_max(0.0, R8(U_AMAX_DQ)), R8(U_AMAX_DK)), R8(U_AMAX_DV));
        acc[AL_FP8_SLOT_DQKV] = al_fp8_ds_max(acc[AL_FP8_SLOT_DQKV], g);
    }
#undef R8
}

/* ds's scale and accumulator arrays and the caller's used tensor into r (al_attn_fp8.ds set) */
static al_status ds_bind(f8_run *r, const al_attn_fp8 *f, int32_t dev, const char *fn) {
    const al_fp8_ds *ds = f->ds;
    const al_tensor *u = f->ds_used;
    if (!ds->state.storage || ds->state.device_type != AL_DEVICE_CUDA || ds->state.device_index != dev)
        return al_error(AL_ERR_ARG, "%s: fp8.ds must be initialised on cuda:%d (the inputs' device)", fn, dev);
    if (!u || !u->storage || u->dtype != AL_DTYPE_F64 || al_tensor_numel(u) != 6 || !al_tensor_is_contiguous(u) ||
        u->device_type != AL_DEVICE_CUDA || u->device_index != dev)
        return al_error(AL_ERR_ARG, "%s: fp8.ds_used must be a contiguous f64 [6] tensor on cuda:%d when fp8.ds is set", fn, dev);
    double *st = (double *)al_tensor_data_ptr(&ds->state);
    r->ds_scale = st + AL_FP8_DS_SCALE(ds->history_len);
    r->ds_acc = st + AL_FP8_DS_ACC(ds->history_len);
    r->ds_used = (double *)al_tensor_data_ptr(u);
    return AL_OK;
}

static al_status sc_readback(const f8_run *r, char *dhost, const double *amax_do) {
    f8_sc_readback_kernel<<<1, 32, 0, r->stream>>>(dhost, (const char *)r->dsc, amax_do);
    return AL_CUDA_ST(cudaGetLastError());
}

/* upload the scalars, execute, and (unless deferred: then the read-back is the caller's) read the amaxes
 * back, which synchronises the stream */
static al_status run_once(f8_run *r, cudnnHandle_t handle, const al_dnn_cached_plan *e, const char *fn, double *t_exec,
                          int deferred = 0) {
    if (r->ds_scale) {
        f8_sc_from_ds_kernel<<<1, 32, 0, r->stream>>>((char *)r->dsc, r->ds_scale, r->ds_used, r->softmax_scale, r->backward);
    } else {
        f8_sc_vals a;
        for (int i = 0; i < NSC; i++) a.v[i] = r->sc[i];
        f8_sc_upload_kernel<<<1, 32, 0, r->stream>>>((char *)r->dsc, a);
    }
    AL_CUDA_TRY(cudaGetLastError());
    void *ptrs[AL_DNN_MAX_UIDS];
    for (int i = 0; i < e->nuids; i++) {
        int64_t u = e->uids[i];
        ptrs[i] = (u >= 0 && u < U_COUNT) ? r->ptr[u] : NULL;
        if (!ptrs[i]) return al_error(AL_ERR_INTERNAL, "%s: no data pointer for cuDNN tensor uid %lld", fn, (long long)u);
    }
    AL_TRY(al_dnn_execute(handle, e->plan, e->nuids, e->uids, ptrs, r->ws));
    if (t_exec) *t_exec = al_hprof_now();   /* the read-back below waits for the graph */
    if (r->ds_scale) {   /* the amaxes stay on the device, in ds's accumulators */
        f8_sc_to_ds_kernel<<<1, 32, 0, r->stream>>>(r->ds_acc, (const char *)r->dsc, r->softmax_scale, r->backward);
        return AL_CUDA_ST(cudaGetLastError());
    }
    if (deferred) return AL_OK;
    char host[NSC * SC_SLOT];
    AL_TRY(al_cu_memcpy_d2h(r->dev, host, r->dsc, NSC * SC_SLOT));
    for (int i = 0; i < NSC; i++) memcpy(&r->sc[i], host + i * SC_SLOT, sizeof(float));
    return AL_OK;
}

#define SC(u) r.sc[(u) - U_SC0]

/* ---- supports ----------------------------------------------------------------------------------- */
#define NO(...) do { snprintf(reason, n, __VA_ARGS__); return 0; } while (0)

int32_t al_fz8_supports(const al_attn_plan *pl, char *reason, size_t n) {
    const al_attn_params *p = &pl->p;
    const al_attn_fp8 *f = pl->in.fp8;
    const al_tensor *q = pl->in.q, *k = pl->in.k, *v = pl->in.v;
    char buf[128];
    size_t ver = cudnnGetVersion();
    const char *vs_ = al_dnn_version_text();
    if (q->device_type != AL_DEVICE_CUDA)
        NO("tensors are on the CPU; the fused backend's FP8 path (cuDNN %s) serves cuda tensors", vs_);
    if (ver < FZ8_MIN_VERSION) NO("cuDNN %s is older than 9.10.2, the oldest this backend accepts", vs_);
    int32_t dev = q->device_index;
    if (dev < 0 || dev >= al_cu_ndev) NO("device cuda:%d does not exist", dev);
    int cc = al_dnn_cc_major(dev);
    if (cc < 9) NO("cuDNN's FP8 SDPA needs Hopper (sm_90) or newer; cuda:%d is sm_%d.x", dev, cc);
    if (!is_fp8(q->dtype))
        NO("q, k, v are %s, not FP8 codes (a Lua or MXFP8 recipe fake-quantises them); cuDNN's FP8 SDPA on Hopper "
           "takes FP8 q/k/v with one descale each (MXFP8 attention needs Blackwell and cuDNN >= 9.21)", al_dtype_name(q->dtype));
    if (k->dtype != q->dtype || v->dtype != q->dtype)
        NO("q, k, v must share one FP8 format for cuDNN, got %s, %s, %s", al_dtype_name(q->dtype), al_dtype_name(k->dtype),
           al_dtype_name(v->dtype));
    if (f->q_descale || f->k_descale || f->v_descale)
        NO("per-token descales (granularity=token) are not expressible: cuDNN's FP8 SDPA takes one [1,1,1,1] descale per q, k, v");
    if (p->compute_dtype == AL_DTYPE_F64) NO("compute_dtype=f64 is not available in cuDNN (f32 accumulation)");
    if (p->qkv_format == AL_ATTN_FORMAT_THD)
        NO("thd (ragged) layouts are not served by the FP8 path (cuDNN's FP8 ragged support needs >= 9.23, and its FP8 "
           "backward has none on Hopper)");
    if (p->d_qk != p->d_v) NO("cuDNN's FP8 SDPA here needs d_qk = d_v, got d_qk=%lld d_v=%lld", (long long)p->d_qk, (long long)p->d_v);
    if (p->d_qk % 16 || p->d_qk > 256)
        NO("cuDNN's FP8 SDPA forward needs a head dim that is a multiple of 16 and <= 256, got %lld", (long long)p->d_qk);
    if (p->mask_type == AL_ATTN_MASK_ARBITRARY) NO("arbitrary masks are not expressible in cuDNN's SDPA graph");
    int padded = pl->has_padding || pl->q_valid || pl->kv_valid;
    for (int64_t i = 0; i < p->b && !padded; i++) padded = pl->q_len[i] != p->sq || pl->kv_len[i] != p->skv;
    if (padded) NO("padding masks are not served by the FP8 path (no sequence-length tensors in its graph)");
    if (p->window_left >= 0) NO("sliding windows (window_left=%lld) are not served by the FP8 path (cuDNN's FP8 band mask needs >= 9.21)",
                                (long long)p->window_left);
    if (p->window_right > 0) NO("window_right=%lld is not served by the FP8 path (only causal, window_right = 0)", (long long)p->window_right);
    if (p->window_right == 0 && pl->bottom_right) {
        for (int64_t i = 0; i < p->b; i++)
            if (pl->diag[i] != 0) NO("bottom-right causal with s_q != s_kv: cuDNN's FP8 graph supports it only on Blackwell");
    }
    if (p->bias_type != AL_ATTN_BIAS_NO_BIAS)
        NO("cuDNN's FP8 SDPA has no bias or ALiBi (bias_type %s); TE: 'FP8 fused attention does not support pre/post_scale_bias yet'",
           p->bias_type == AL_ATTN_BIAS_ALIBI ? "alibi" : "pre/post_scale_bias");
    if (p->softmax_type != AL_ATTN_SOFTMAX_VANILLA) NO("softmax sinks (softmax_type off-by-one/learnable) are not served by the FP8 path");
    if (p->dropout_p > 0.0)
        NO("dropout (p=%g) with FP8 is declined: cuDNN measures amax_S after the dropout scale and its Philox mask is not "
           "the CPU oracle's stream, so the result could not be checked against the emulation", p->dropout_p);
    if (p->return_max_logit) NO("return_max_logit is not implemented by the fused backend");
    if (!(f->scale[AL_FP8_SLOT_S] > 0.0))
        NO("fp8.scale[S] = %g leaves S unquantised; cuDNN's FP8 P.V reads P in FP8, so S needs a scale", f->scale[AL_FP8_SLOT_S]);
    if (f->o_per_token) NO("per-token O scales are not expressible: cuDNN's FP8 SDPA has one scale_O");
    if (f->scale[AL_FP8_SLOT_O] < 0.0)
        NO("O unquantised (a Lua or MXFP8 recipe quantises O itself) needs a non-FP8 O, which cuDNN writes only on "
           "Blackwell; on Hopper its FP8 SDPA writes O in FP8");
    const al_tensor *ts[3] = {q, k, v};
    for (int i = 0; i < 3; i++) {
        const char *why = al_dnn_layout_problem(ts[i], buf, sizeof buf);
        if (why) NO("%s: %s", role_name[i], why);
    }

    /* the forward graph itself: built (or found) now, so a refusal is reported with cuDNN's words */
    int nd = q->ndim;
    int64_t osize[4], ostr[4];
    for (int d = 0; d < nd; d++) osize[d] = q->size[d];
    osize[nd - 1] = p->d_v;
    al_contiguous_strides(nd, osize, ostr);
    al_tensor ot;
    memset(&ot, 0, sizeof ot);
    ot.ndim = nd;
    for (int d = 0; d < nd; d++) { ot.size[d] = osize[d]; ot.stride[d] = ostr[d]; }
    const al_tensor *t[NROLE] = {q, k, v, &ot, NULL, NULL, NULL, NULL};
    f8_key key;
    key_build(&key, pl, 0, t);
    pthread_mutex_lock(&g_lock);
    cudnnHandle_t handle;
    cudaStream_t stream;
    al_status st = get_handle(dev, &handle, &stream);
    int ok = 0;
    if (st != AL_OK) snprintf(reason, n, "%s", al_last_error());
    else {
        const al_dnn_cached_plan *e = al_dnn_cache_get(&g_cache, &key, handle);
        ok = e->plan != NULL;
        if (!ok) snprintf(reason, n, "cuDNN %s refused the FP8 forward graph: %s", vs_, e->reason);
    }
    pthread_mutex_unlock(&g_lock);
    if (!ok) return 0;
    /* accepted; notes for explain */
    int bwd_ok = cc == 9 ? p->d_qk == 128 : p->d_qk <= 128;
    if (!bwd_ok && pl->backward) {   /* (the backward then goes to the unfused backend's emulation) */
        snprintf(reason, n, "cuDNN's FP8 backward needs d_qk = d_v = %s on sm_%d.x, this call has d=%lld",
                 cc == 9 ? "128" : "<= 128", cc, (long long)p->d_qk);
        return 0;
    }
    size_t used = 0;
    reason[0] = 0;
    if (!bwd_ok)
        used += (size_t)snprintf(reason, n, "note: FP8 forward only (the backward goes to the unfused backend's emulation): cuDNN's "
                                 "FP8 backward needs d_qk = d_v = %s on sm_%d.x, this call has d=%lld",
                                 cc == 9 ? "128" : "<= 128", cc, (long long)p->d_qk);
    if (f->scale[AL_FP8_SLOT_O] == 0.0 && used < n)
        snprintf(reason + used, n - used, "%sO is current-scaled: cuDNN writes FP8 O on Hopper, so the forward runs twice (amax, then scale)",
                 used ? "; " : "note: ");
    return 1;
}
#undef NO

/* ---- deferred amaxes (al_attn_fp8.amax_deferred) ----------------------------------------------------
 * The amaxes a call reports (forward: S, O; backward: dO, dP, dQKV) are written into mapped pinned host
 * memory behind the graph on its stream (f8_sc_readback_kernel), with an event after that, and the call
 * returns: no stream sync, so the GPU goes on with the next queued work while the host prepares more.
 * al_attn_fp8_settle() waits for the event and fills f->amax. Records
 * are pooled (pinned memory and events are costly to create); a dropped record (superseded by a later
 * call on the same f) is handed out again only once its event has completed. */
#define PEND_BYTES (NSC * SC_SLOT + 16)   /* the device scalar block's image, then amax(dO) as a double */
typedef struct f8_pend {
    al_fp8_pending base;        /* first member: al_attn_fp8.pending points here */
    cudaEvent_t done;           /* recorded after the read-back kernel */
    char *host;                 /* pinned and mapped, PEND_BYTES */
    char *dhost;                /* its device address (f8_sc_readback_kernel writes there) */
    double softmax_scale;       /* backward: cuDNN's amax_dP is reported over it */
    int32_t dev;                /* the device its event belongs to */
    struct f8_pend *next;
} f8_pend;

static pthread_mutex_t g_pend_lock = PTHREAD_MUTEX_INITIALIZER;
static f8_pend *g_pend_free;    /* released records; their events may still be pending (dropped ones) */

static float pend_scalar(const f8_pend *q, int uid) {
    float v;
    memcpy(&v, q->host + (uid - U_SC0) * SC_SLOT, sizeof v);
    return v;
}

static void pend_release(f8_pend *q) {
    pthread_mutex_lock(&g_pend_lock);
    q->next = g_pend_free;
    g_pend_free = q;
    pthread_mutex_unlock(&g_pend_lock);
}

/* the max of dQ, dK, dV's amaxes (NaN if any is NaN) */
static double amax_dqkv(float a, float b, float c) {
    const float x[3] = {a, b, c};
    double m = 0.0;
    for (int i = 0; i < 3; i++) {
        if (x[i] != x[i] || m != m) m = NAN;
        else if ((double)x[i] > m) m = (double)x[i];
    }
    return m;
}

static void pend_settle(al_fp8_pending *self, al_attn_fp8 *f) {
    f8_pend *q = (f8_pend *)self;
    f->pending = NULL;
    if (cudaEventSynchronize(q->done) == cudaSuccess) {
        if (!q->base.backward) {
            f->amax[AL_FP8_SLOT_S] = (double)pend_scalar(q, U_AMAX_S);
            f->amax[AL_FP8_SLOT_O] = (double)pend_scalar(q, U_AMAX_O);
        } else {
            double am_do;
            memcpy(&am_do, q->host + NSC * SC_SLOT, sizeof am_do);
            f->amax[AL_FP8_SLOT_DO] = am_do;
            f->amax[AL_FP8_SLOT_DP] = (double)pend_scalar(q, U_AMAX_DP) / q->softmax_scale;
            f->amax[AL_FP8_SLOT_DQKV] = amax_dqkv(pend_scalar(q, U_AMAX_DQ), pend_scalar(q, U_AMAX_DK), pend_scalar(q, U_AMAX_DV));
        }
    }   /* else the stream failed: amax stays NaN, and the next CUDA call reports the error */
    pend_release(q);
}

static void pend_drop(al_fp8_pending *self) { pend_release((f8_pend *)self); }

/* a free record of device dev (the current one) whose last copy has landed, or a new one; for the given
 * direction */
static al_status pend_acquire(f8_pend **out, int32_t dev, int backward) {
    pthread_mutex_lock(&g_pend_lock);
    f8_pend **pp = &g_pend_free, *q = NULL;
    for (; *pp; pp = &(*pp)->next) {
        if ((*pp)->dev != dev) continue;   /* (an event records only on its own device's streams) */
        cudaError_t st = cudaEventQuery((*pp)->done);
        if (st == cudaErrorNotReady) { (void)cudaGetLastError(); continue; }   /* (not an error: clear it) */
        q = *pp;
        *pp = q->next;
        break;
    }
    pthread_mutex_unlock(&g_pend_lock);
    if (!q) {
        q = (f8_pend *)calloc(1, sizeof *q);
        if (!q) return al_error(AL_ERR_OOM, "attention (fused, fp8): out of host memory for a deferred-amax record");
        cudaError_t st = cudaHostAlloc((void **)&q->host, PEND_BYTES, cudaHostAllocPortable | cudaHostAllocMapped);
        if (st == cudaSuccess) st = cudaHostGetDevicePointer((void **)&q->dhost, q->host, 0);
        if (st == cudaSuccess) st = cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming);
        if (st != cudaSuccess) {
            if (q->host) cudaFreeHost(q->host);
            free(q);
            return AL_CUDA_ST(st);
        }
        q->base.settle = pend_settle;
        q->base.drop = pend_drop;
        q->dev = dev;
    }
    q->base.backward = backward;
    *out = q;
    return AL_OK;
}

/* ---- forward ---------------------------------------------------------------------------------- */
/* host profile of the forward (ATTNLAB_HOST_PROFILE=1, host_profile.h): outputs (O in FP8, LSE), plan (lock, key,
 * cache, scalars and workspace), exec (upload the scalars, cuDNN's execute), readback (the amaxes' copy back,
 * which waits for the graph to finish: GPU time shows up here), dequant (O into the caller's dtype); the means
 * per call end al_fused_info's text */
enum { F8P_OUTPUTS, F8P_PLAN, F8P_EXEC, F8P_READBACK, F8P_DEQUANT, F8P_N };
static al_hprof g_f8_fwd_prof = {"fused fp8 forward", F8P_N, {"outputs", "plan", "exec", "readback", "dequant"}, {0}, 0};

size_t al_fz8_profile_format(char *buf, size_t u, size_t n) { return al_hprof_format(&g_f8_fwd_prof, buf, u, n); }

al_status al_fz8_forward(const al_attn_plan *pl, al_tensor *out, al_tensor *lse, al_tensor *max_logit) {
    const char *fn = "attention (fused, fp8)";
    const al_attn_params *p = &pl->p;
    const al_tensor *q = pl->in.q;
    al_attn_fp8 *f = pl->in.fp8;
    int32_t dev = q->device_index;
    if (max_logit) return al_error(AL_ERR_UNSUPPORTED, "%s: return_max_logit is not implemented", fn);
    int nd = q->ndim;
    int64_t osize[4];
    for (int d = 0; d < nd; d++) osize[d] = q->size[d];
    osize[nd - 1] = p->d_v;
    int64_t lsize[3] = {p->b, p->h, p->sq};
    al_tensor o8;
    memset(&o8, 0, sizeof o8);
    const int prof = al_hprof_on();
    double pt[F8P_N + 1];
    if (prof) pt[0] = al_hprof_now();
    AL_TRY(al_tensor_empty(&o8, nd, osize, q->dtype, AL_DEVICE_CUDA, dev));
    al_status s = al_tensor_empty(lse, 3, lsize, AL_DTYPE_F32, AL_DEVICE_CUDA, dev);
    if (s != AL_OK) { al_tensor_release(&o8); return s; }
    if (prof) pt[F8P_OUTPUTS + 1] = al_hprof_now();

    const al_tensor *t[NROLE] = {q, pl->in.k, pl->in.v, &o8, NULL, NULL, NULL, NULL};
    f8_key key;
    key_build(&key, pl, 0, t);
    f8_run r;
    memset(&r, 0, sizeof r);
    const double sS = f->scale[AL_FP8_SLOT_S], qmax = al_fp8_fmax(q->dtype);
    double so = f->ds ? 1.0 : f->scale[AL_FP8_SLOT_O];   /* (ds: every scale given, read on the device) */
    const al_dnn_cached_plan *e = NULL;
    f8_pend *pend = NULL;
    if (f->ds) {
        s = ds_bind(&r, f, dev, fn);
        r.softmax_scale = p->softmax_scale;
        if (s != AL_OK) {
            al_tensor_release(&o8);
            al_tensor_release(lse);
            return s;
        }
    }
    pthread_mutex_lock(&g_lock);
    cudnnHandle_t handle;
    cudaStream_t stream;
    s = get_handle(dev, &handle, &stream);
    if (s == AL_OK) {
        e = al_dnn_cache_get(&g_cache, &key, handle);
        if (!e->plan) s = al_error(AL_ERR_UNSUPPORTED, "%s: cuDNN refused the FP8 forward graph: %s", fn, e->reason);
    }
    if (s == AL_OK) s = run_alloc(&r, dev, stream, e);
    if (prof) pt[F8P_PLAN + 1] = al_hprof_now();
    int runs = 0;
    if (s == AL_OK) {
        const al_tensor *io[4] = {q, pl->in.k, pl->in.v, &o8};
        for (int i = 0; i < 4; i++) r.ptr[U_Q + i] = al_tensor_data_ptr(io[i]);
        r.ptr[U_STATS] = al_tensor_data_ptr(lse);
        r.scale = (float)p->softmax_scale;
        SC(U_DESC_Q) = SC(U_DESC_K) = SC(U_DESC_V) = (float)f->qkv_scale_inv;
        SC(U_SCALE_S) = (float)sS;
        SC(U_DESC_S) = (float)(1.0 / sS);
        /* current scaling of O: a first run measures amax_O (its O is discarded) */
        SC(U_SCALE_O) = so > 0.0 ? (float)so : 1.0f;
        /* every scale given and the caller can wait: the amaxes follow the graph to pinned memory */
        const int defer = f->amax_deferred && so > 0.0 && !f->ds;
        if (defer) s = pend_acquire(&pend, dev, 0);
        if (s == AL_OK) s = run_once(&r, handle, e, fn, prof ? &pt[F8P_EXEC + 1] : NULL, pend != NULL);
        if (s == AL_OK && pend) {
            s = sc_readback(&r, pend->dhost, NULL);
            if (s == AL_OK) s = AL_CUDA_ST(cudaEventRecord(pend->done, stream));
            if (s != AL_OK && pend) { pend_release(pend); pend = NULL; }
        }
        runs = 1;
        if (s == AL_OK && so == 0.0) {
            runs = 2;
            /* report the amax the scale came from (a rerun could differ in the last bits) */
            float am_o = SC(U_AMAX_O);
            so = al_fp8_current_scale(qmax, (double)am_o, exp2(f->margin));
            SC(U_SCALE_O) = (float)so;
            s = run_once(&r, handle, e, fn, NULL);
            SC(U_AMAX_O) = am_o;
        }
    }
    pthread_mutex_unlock(&g_lock);
    run_free(&r);
    if (prof) pt[F8P_READBACK + 1] = al_hprof_now();
    /* O into the caller's dtype: decode(code) / scale_O, rounded once; fp8_output (out_dtype = the FP8
     * format): the graph's codes are the output, no dequantisation pass */
    if (s == AL_OK && f->out_dtype == q->dtype) {
        *out = o8;
        memset(&o8, 0, sizeof o8);
    } else if (s == AL_OK && f->ds) {   /* O's scale is on the device (the used record) */
        s = al_tensor_empty(out, o8.ndim, o8.size, f->out_dtype, AL_DEVICE_CUDA, dev);
        if (s == AL_OK) s = al_cu_fp8_dequantize_ex(out, &o8, 1.0, r.ds_used + AL_FP8_SLOT_O);
    } else if (s == AL_OK) {
        s = al_fp8_dequantize(out, &o8, 1.0 / (double)(float)so, f->out_dtype);
    }
    al_tensor_release(&o8);
    if (prof && s == AL_OK && runs == 1) {   /* (a current-scaled O runs the graph twice: not profiled) */
        pt[F8P_DEQUANT + 1] = al_hprof_now();
        al_hprof_add(&g_f8_fwd_prof, pt);
    }
    if (s == AL_OK && f->ds) {   /* the amaxes went to ds's accumulators, the scales to ds_used */
        f->amax[AL_FP8_SLOT_S] = f->amax[AL_FP8_SLOT_O] = NAN;
        f->scale_used[AL_FP8_SLOT_S] = f->scale_used[AL_FP8_SLOT_O] = NAN;
    } else if (s == AL_OK) {
        if (pend) {   /* known at al_attn_fp8_settle */
            f->amax[AL_FP8_SLOT_S] = f->amax[AL_FP8_SLOT_O] = NAN;
            pend->base.owner = f;
            f->pending = &pend->base;
        } else {
            f->amax[AL_FP8_SLOT_S] = (double)SC(U_AMAX_S);
            f->amax[AL_FP8_SLOT_O] = (double)SC(U_AMAX_O);
        }
        f->scale_used[AL_FP8_SLOT_S] = sS;
        f->scale_used[AL_FP8_SLOT_O] = so;
    } else {
        if (pend) pend_release(pend);
        al_tensor_release(out);
        al_tensor_release(lse);
    }
    return s;
}

/* ---- backward --------------------------------------------------------------------------------- */
/* dst (caller's float tensor, any strides) = decode(src) * inv */
static al_status store_grad(al_tensor *dst, const al_tensor *src, double inv, const double *dscale) {
    al_tensor tmp;
    memset(&tmp, 0, sizeof tmp);
    /* a contiguous gradient (separate q, k, v) takes the values directly: no temporary and no copy pass (at
     * 4x16x4096x128 bf16 that copy moved 400 MB per backward); strided ones (packed buffers) go through one */
    if (al_tensor_numel(dst) == 0) return AL_OK;
    if (al_tensor_is_contiguous(dst) && dst->device_type == AL_DEVICE_CUDA) return al_cu_fp8_dequantize_ex(dst, src, inv, dscale);
    if (dscale) {   /* (delayed scaling on the device: dst = decode(src) / (double)(float)*dscale) */
        AL_TRY(al_tensor_empty(&tmp, src->ndim, src->size, dst->dtype, AL_DEVICE_CUDA, src->device_index));
        al_status s = al_cu_fp8_dequantize_ex(&tmp, src, 1.0, dscale);
        if (s == AL_OK) s = al_cu_copy(dst, &tmp);
        al_tensor_release(&tmp);
        return s;
    }
    AL_TRY(al_fp8_dequantize(&tmp, src, inv, dst->dtype));
    al_status s = al_cu_copy(dst, &tmp);
    al_tensor_release(&tmp);
    return s;
}

al_status al_fz8_backward(const al_attn_plan *pl, const al_tensor *out, const al_tensor *dout, const al_tensor *lse,
                          al_tensor *dq, al_tensor *dk, al_tensor *dv) {
    const char *fn = "attention_backward (fused, fp8)";
    const al_attn_params *p = &pl->p;
    const al_tensor *q = pl->in.q;
    al_attn_fp8 *f = pl->in.fp8;
    int32_t dev = q->device_index;
    int cc = al_dnn_cc_major(dev);
    if (cc == 9 ? p->d_qk != 128 : p->d_qk > 128)
        return al_error(AL_ERR_UNSUPPORTED, "%s: cuDNN's FP8 backward needs d_qk = d_v = %s on sm_%d.x, got d=%lld (the FP8 "
                        "forward ran; the unfused backend emulates this backward on the GPU: backend = \"unfused\")", fn,
                        cc == 9 ? "128" : "<= 128", cc, (long long)p->d_qk);
    const al_tensor *chk[6] = {out, dout, dq, dk, dv, lse};
    const char *chk_name[6] = {"out", "dout", "dq", "dk", "dv", "lse"};
    for (int i = 0; i < 6; i++)
        if (chk[i]->device_type != AL_DEVICE_CUDA || chk[i]->device_index != dev)
            return al_error(AL_ERR_ARG, "%s: %s must be on cuda:%d", fn, chk_name[i], dev);
    if (lse->dtype != AL_DTYPE_F32 || !al_tensor_is_contiguous(lse))
        return al_error(AL_ERR_ARG, "%s: lse must be the forward's contiguous f32 [b,h,sq]", fn);
    /* (ds, delayed scaling on the device: every scale given and read there; 1 stands in for them here) */
    const int ds = f->ds != NULL;
    const double sS = ds ? 1.0 : f->scale[AL_FP8_SLOT_S], sdP = ds ? 1.0 : f->scale[AL_FP8_SLOT_DP];
    double sdo = ds ? 1.0 : f->scale[AL_FP8_SLOT_DO], sg = ds ? 1.0 : f->scale[AL_FP8_SLOT_DQKV];
    f8_run r;
    memset(&r, 0, sizeof r);
    if (ds) {
        AL_TRY(ds_bind(&r, f, dev, fn));
        r.backward = 1;
        r.softmax_scale = p->softmax_scale;
    }
    if (!(sdP > 0.0))
        return al_error(AL_ERR_UNSUPPORTED, "%s: fp8.scale[dP] must be a given scale > 0 (cuDNN quantises dP inside the kernel), got %g", fn, sdP);
    if (sdo < 0.0 || sg < 0.0)
        return al_error(AL_ERR_UNSUPPORTED, "%s: fp8.scale[%s] < 0 (a Lua or MXFP8 recipe quantises it itself) is not expressible: "
                        "cuDNN's FP8 backward reads dO and writes dQ/dK/dV in FP8 with one scale each", fn, sdo < 0.0 ? "dO" : "dQKV");
    const int32_t bfmt = f->bwd_format;
    const double bmax = al_fp8_fmax(bfmt), p2 = exp2(f->margin);
    /* the O the forward wrote, back to its FP8 codes */
    double so = ds ? 1.0 : f->scale_used[AL_FP8_SLOT_O] > 0.0 ? f->scale_used[AL_FP8_SLOT_O] : f->scale[AL_FP8_SLOT_O];
    double am_do = 0.0, am;
    al_status s = AL_OK;
    if (!(so > 0.0)) {
        s = al_amax(out, &am);
        so = al_fp8_current_scale(al_fp8_fmax(q->dtype), am, p2);
    }
    /* every scale given and the caller can wait: amax(dO) stays on the GPU and every amax follows the graph
     * to pinned memory (the deferred-amax record above); else amax(dO) now (a current dO scale needs it) */
    const int defer = f->amax_deferred && so > 0.0 && sdo > 0.0 && sg > 0.0 && !ds;
    al_tensor o8, do8, g8[3], amdo;   /* amdo: amax(dO), f64 [1] on the device (deferred) */
    memset(&o8, 0, sizeof o8);
    memset(&do8, 0, sizeof do8);
    memset(g8, 0, sizeof g8);
    memset(&amdo, 0, sizeof amdo);
    const double *d_amdo = NULL;
    f8_pend *pend = NULL;
    if (s == AL_OK && ds) {   /* dO quantised with ds's scale, its amax into ds's accumulator, in one pass */
        s = al_tensor_empty(&do8, dout->ndim, dout->size, bfmt, AL_DEVICE_CUDA, dev);
        if (s == AL_OK)
            s = al_cu_fp8_quantize_amax_into(&do8, dout, 1.0, r.ds_scale + AL_FP8_SLOT_DO, r.ds_acc + AL_FP8_SLOT_DO, 1);
    } else if (s == AL_OK && defer) {   /* dO quantised with its given scale and measured in one pass */
        s = al_fp8_quantize_amax(&do8, &amdo, dout, bfmt, sdo);
        if (s == AL_OK) d_amdo = (const double *)al_tensor_data_ptr(&amdo);
    } else if (s == AL_OK) {
        s = al_amax(dout, &am_do);
    }
    if (s == AL_OK && sdo == 0.0) sdo = al_fp8_current_scale(bmax, am_do, p2);
    if (s != AL_OK) {
        al_tensor_release(&do8);
        al_tensor_release(&amdo);
        return s;
    }

    al_tensor *gd[3] = {dq, dk, dv};
    /* fp8_output: out already holds O's codes (the graph reads them as they are) */
    if (out->dtype == q->dtype) {
        s = al_tensor_alias(&o8, out);
    } else if (ds) {   /* with the scale the forward used (its used record) */
        s = al_tensor_empty(&o8, out->ndim, out->size, q->dtype, AL_DEVICE_CUDA, dev);
        if (s == AL_OK) s = al_cu_fp8_quantize_ex(&o8, out, 1.0, r.ds_used + AL_FP8_SLOT_O);
    } else {
        s = al_fp8_quantize(&o8, out, q->dtype, so);
    }
    if (s == AL_OK && !defer && !ds) s = al_fp8_quantize(&do8, dout, bfmt, sdo);
    for (int i = 0; i < 3 && s == AL_OK; i++) s = al_tensor_empty(&g8[i], gd[i]->ndim, gd[i]->size, bfmt, AL_DEVICE_CUDA, dev);
    const al_dnn_cached_plan *e = NULL;
    double a = p->softmax_scale;
    if (s == AL_OK) {
        const al_tensor *t[NROLE] = {q, pl->in.k, pl->in.v, &o8, &do8, &g8[0], &g8[1], &g8[2]};
        f8_key key;
        key_build(&key, pl, 1, t);
        pthread_mutex_lock(&g_lock);
        cudnnHandle_t handle;
        cudaStream_t stream;
        s = get_handle(dev, &handle, &stream);
        if (s == AL_OK) {
            e = al_dnn_cache_get(&g_cache, &key, handle);
            if (!e->plan) s = al_error(AL_ERR_UNSUPPORTED, "%s: cuDNN refused the FP8 backward graph: %s", fn, e->reason);
        }
        if (s == AL_OK) s = run_alloc(&r, dev, stream, e);
        if (s == AL_OK) {
            for (int i = 0; i < NROLE; i++) {
                static const int uid_of[NROLE] = {U_Q, U_K, U_V, U_O, U_DO, U_DQ, U_DK, U_DV};
                r.ptr[uid_of[i]] = al_tensor_data_ptr(t[i]);
            }
            r.ptr[U_STATS] = al_tensor_data_ptr(lse);
            r.scale = (float)a;
            SC(U_DESC_Q) = SC(U_DESC_K) = SC(U_DESC_V) = (float)f->qkv_scale_inv;
            SC(U_SCALE_S) = (float)sS;
            SC(U_DESC_S) = (float)(1.0 / sS);
            SC(U_DESC_O) = (float)(1.0 / so);
            SC(U_DESC_DO) = (float)(1.0 / sdo);
            /* the emulation's dP slot is the gradient before the softmax scale (see the header) */
            SC(U_SCALE_DP) = (float)(sdP / a);
            SC(U_DESC_DP) = (float)(a / sdP);
            float g0 = sg > 0.0 ? (float)sg : 1.0f;
            SC(U_SCALE_DQ) = SC(U_SCALE_DK) = SC(U_SCALE_DV) = g0;
            if (defer) s = pend_acquire(&pend, dev, 1);
            if (s == AL_OK) s = run_once(&r, handle, e, fn, NULL, pend != NULL);
            if (s == AL_OK && pend) {
                pend->softmax_scale = a;
                s = sc_readback(&r, pend->dhost, d_amdo);
                if (s == AL_OK) s = AL_CUDA_ST(cudaEventRecord(pend->done, stream));
            }
            if (s == AL_OK && sg == 0.0) {   /* current dQKV scaling: the first run measured the amaxes */
                float am3[3] = {SC(U_AMAX_DQ), SC(U_AMAX_DK), SC(U_AMAX_DV)};
                double m = fmax(fmax((double)am3[0], (double)am3[1]), (double)am3[2]);
                sg = al_fp8_current_scale(bmax, m, p2);
                SC(U_SCALE_DQ) = SC(U_SCALE_DK) = SC(U_SCALE_DV) = (float)sg;
                s = run_once(&r, handle, e, fn, NULL);
                /* report the amaxes the scale came from (dQ may accumulate in another order) */
                SC(U_AMAX_DQ) = am3[0]; SC(U_AMAX_DK) = am3[1]; SC(U_AMAX_DV) = am3[2];
            }
        }
        pthread_mutex_unlock(&g_lock);
        run_free(&r);
    }
    for (int i = 0; i < 3 && s == AL_OK; i++)
        s = store_grad(gd[i], &g8[i], 1.0 / (double)(float)sg, ds ? r.ds_used + AL_FP8_SLOT_DQKV : NULL);
    al_tensor_release(&o8);
    al_tensor_release(&do8);
    for (int i = 0; i < 3; i++) al_tensor_release(&g8[i]);
    al_tensor_release(&amdo);   /* (stream-ordered: its read-back is queued before any reuse) */
    if (s == AL_OK && ds) {   /* the amaxes went to ds's accumulators, the scales to ds_used */
        f->amax[AL_FP8_SLOT_DO] = f->amax[AL_FP8_SLOT_DP] = f->amax[AL_FP8_SLOT_DQKV] = NAN;
        f->scale_used[AL_FP8_SLOT_DO] = f->scale_used[AL_FP8_SLOT_DP] = f->scale_used[AL_FP8_SLOT_DQKV] = NAN;
    } else if (s == AL_OK) {
        if (pend) {   /* known at al_attn_fp8_settle */
            f->amax[AL_FP8_SLOT_DO] = f->amax[AL_FP8_SLOT_DP] = f->amax[AL_FP8_SLOT_DQKV] = NAN;
            pend->base.owner = f;
            f->pending = &pend->base;
        } else {
            f->amax[AL_FP8_SLOT_DO] = am_do;
            f->amax[AL_FP8_SLOT_DP] = (double)SC(U_AMAX_DP) / a;
            f->amax[AL_FP8_SLOT_DQKV] = amax_dqkv(SC(U_AMAX_DQ), SC(U_AMAX_DK), SC(U_AMAX_DV));
        }
        f->scale_used[AL_FP8_SLOT_DO] = sdo;
        f->scale_used[AL_FP8_SLOT_DP] = sdP;
        f->scale_used[AL_FP8_SLOT_DQKV] = sg;
    } else if (pend) {
        pend_release(pend);
    }
    return s;
}
