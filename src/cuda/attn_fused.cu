/*
 * cuda/attn_fused.cu — the "fused" attention backend: cuDNN's fused SDPA (flash) kernels reached
 * through composite operation graphs of the plain-C backend API (cudnn_graph.h), forward and backward,
 * f16/bf16, plus the plan cache and the backend's registration. FP8 plans go to attn_fused_fp8.cu.
 *
 * Graphs (UIDs in enum uid below; S = [b,h,sq,skv] fp32 virtual, row = [b,h,sq,1] fp32 virtual):
 *   forward   matmul(Q, K^T) -> *scale -> [+bias] -> [+alibi: (col-row)*slope] -> [padding select]
 *             -> [right bound select] -> [left bound select] -> softmax (max[,max sink], sub, exp,
 *             sum[, + exp(sink-max)], log, add -> Stats, div) -> [dropout: *rng, *1/(1-p)] -> matmul(P, V) -> O
 *   backward  dO*O -> sum -> *(1-p | 1) = softmax_sum; matmul(Q, K^T) -> *scale -> [bias, alibi, padding]
 *             -> -Stats -> [bounds] -> exp = P; [dropout]; reshape P^T -> matmul(P^T, dO) -> dV
 *             (GQA: full-head matmul + head-group sum); matmul(dO, V^T) -> [*mask] -> -softmax_sum ->
 *             *P -> [*1/(1-p)] -> [sum -> dBias] -> *scale = dS; reshape dS^T -> matmul(dS^T, Q) -> dK
 *             (GQA likewise); reshape K^T -> K; matmul(dS, K) -> fp32 dQ accumulator -> identity -> dQ, or
 *             straight into dQ (deterministic / dBias: cuDNN's dP-workspace engine).
 *   The op sequence follows cudnn-frontend 1.23's composite nodes (the pattern cuDNN < 9.21 matches).
 *
 * Tensors are described with their real strides in cuDNN's logical [b,h,s,d] order (K and V of the
 * backward re-described transposed, same memory): a packed qkv buffer is read through its select
 * views and the gradients of a packed input land straight in the packed gradient buffer. thd uses
 * ragged offset tensors (element offsets = padded token start x token stride, one per distinct
 * stride). Stats are cuDNN's [b,h,sq,1] fp32 with strides {h*sq, sq, 1, 1}, which is exactly the
 * plan's lse f32 [b,h,sq]: no conversion; rows past a sequence's length are set to -inf after the run.
 *
 * Plan cache (cudnn_plan_cache.h): FZ_CACHE_CAP entries, least recently used evicted, keyed by
 * everything that changes the graph: cuDNN version, device, direction, dtype, extents, all strides,
 * ragged strides, mask bounds and alignment, padding, bias shape/strides, ALiBi, sink, dropout p,
 * determinism. A failed build is cached too (with its reason), so supports() refuses it cheaply.
 * Scale, dropout scale, seed/offset and pointers are not in the key (by-value or variant pack).
 *
 * Dropout uses cuDNN's own Philox RNG: the mask is reproducible (same seed and offset -> same mask,
 * and the backward regenerates the forward's mask) but it is NOT bit-identical to the CPU's
 * al_attn_dropout_uniform stream.
 */
#include "cuda/cudnn_plan_cache.h"
#include "cuda/host_profile.h"
#include "cuda/attn_fused_fp8.h"   /* FP8 plans (inputs.fp8) are routed to attn_fused_fp8.cu */
extern "C" {   /* the core is C: its backend registry must be linked unmangled */
#include "attention_internal.h"
}
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum uid {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF, U_DO, U_DQ, U_DK, U_DV, U_DQ_ACC, U_SOFTMAX_SUM, U_ONE,
    U_SEQ_Q, U_SEQ_KV, U_BIAS, U_DBIAS, U_SLOPES, U_SEED, U_OFFSET, U_DROP_SCALE, U_DROP_SCALE_INV, U_SINK,
    U_BR_SKV, U_BR_SQ, U_SHIFT_RIGHT, U_LEFT_BOUND,
    U_RAGGED0 = 40,             /* 40..47: ragged offset tensors */
    U_COUNT = 48
};

/* tensor roles */
enum { R_Q, R_K, R_V, R_O, R_DO, R_DQ, R_DK, R_DV, NROLE };
static const char *role_name[NROLE] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};

#define FZ_CACHE_CAP 64
#define FZ_MIN_VERSION 91002    /* 9.10.0/9.10.1 are blocked by cudnn-frontend for f16/bf16 SDPA */

/* ---- the key (all int64, memset to 0 first, compared with memcmp) ------------------------------ */
typedef struct fz_key {
    int64_t version, device, backward, dtype;
    int64_t b, h, hg, sq, skv, dqk, dv;
    int64_t str[NROLE][4];      /* logical [b,h,s,d] strides; 0 for roles not in the graph */
    int64_t rg[NROLE];          /* ragged group of each role (-1: none) */
    int64_t nrg, rg_side[8], rg_stride[8];
    int64_t padding, right, left, bottom_right;   /* right/left: bounds in cuDNN's sense, -1 = none */
    int64_t has_bias, bias_dim[4], bias_str[4];
    int64_t alibi, sink, dropout_bits, deterministic;
} fz_key;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t g_handle[AL_CU_MAX_DEVICES];

static_assert(sizeof(fz_key) % sizeof(int64_t) == 0, "fz_key must be whole int64 words (cudnn_plan_cache.h)");

/* The per-device handles of this path (cudnn_graph.cu's al_dnn_handle binds them; g_lock held). */
static al_status get_handle_stream(int32_t dev, cudnnHandle_t *out, cudaStream_t *stream) {
    return al_dnn_handle(g_handle, dev, "attention (fused)", out, stream);
}

/* What a plan resolves to for the graph. */
typedef struct fz_setup {
    int thd, padding, bottom_right;
    int64_t right, left;        /* cuDNN bounds: right = window_right, left = window_left + 1; -1 = none */
} fz_setup;

static void resolve(const al_attn_plan *pl, fz_setup *s) {
    const al_attn_params *p = &pl->p;
    memset(s, 0, sizeof *s);
    s->thd = p->qkv_format == AL_ATTN_FORMAT_THD;
    /* padding: sequence-length tensors whenever some sequence is shorter than the padded extent */
    s->padding = s->thd;
    for (int64_t i = 0; i < p->b && !s->padding; i++)
        if (pl->q_len[i] != p->sq || pl->kv_len[i] != p->skv) s->padding = 1;
    s->right = p->window_right >= 0 ? p->window_right : -1;
    s->left = p->window_left >= 0 ? p->window_left + 1 : -1;
    /* bottom-right matters only with a bound, and only when some diagonal offset is nonzero
     * (TE downgrades s_q == s_kv bottom-right to top-left the same way) */
    int any_diag = 0;
    for (int64_t i = 0; i < p->b; i++) any_diag |= pl->diag[i] != 0;
    s->bottom_right = pl->bottom_right && any_diag && (s->right >= 0 || s->left >= 0);
}

/* ---- key ------------------------------------------------------------------------------------------ */
static void key_build(fz_key *k, const al_attn_plan *pl, const fz_setup *su, int backward,
                      const int64_t str[NROLE][4], const int has_role[NROLE]) {
    const al_attn_params *p = &pl->p;
    memset(k, 0, sizeof *k);
    k->version = (int64_t)cudnnGetVersion();
    k->device = pl->in.q->device_index;
    k->backward = backward;
    k->dtype = pl->in.q->dtype;
    k->b = p->b; k->h = p->h; k->hg = p->hg; k->sq = p->sq; k->skv = p->skv; k->dqk = p->d_qk; k->dv = p->d_v;
    for (int r = 0; r < NROLE; r++) {
        k->rg[r] = -1;
        if (!has_role[r]) continue;
        memcpy(k->str[r], str[r], sizeof k->str[r]);
        if (su->thd) {
            int side = (r == R_K || r == R_V || r == R_DK || r == R_DV) ? 1 : 0;
            int64_t g = -1;
            for (int64_t i = 0; i < k->nrg; i++)
                if (k->rg_side[i] == side && k->rg_stride[i] == str[r][2]) g = i;
            if (g < 0) { g = k->nrg++; k->rg_side[g] = side; k->rg_stride[g] = str[r][2]; }
            k->rg[r] = g;
        }
    }
    k->padding = su->padding;
    k->right = su->right;
    k->left = su->left;
    k->bottom_right = su->bottom_right;
    if (p->bias_type == AL_ATTN_BIAS_POST_SCALE && pl->in.bias) {
        const al_tensor *B = pl->in.bias;
        k->has_bias = 1;
        for (int d = 0; d < 4; d++) { k->bias_dim[d] = B->size[d]; k->bias_str[d] = B->size[d] == 1 ? 0 : B->stride[d]; }
    }
    k->alibi = p->bias_type == AL_ATTN_BIAS_ALIBI;
    k->sink = p->softmax_type != AL_ATTN_SOFTMAX_VANILLA;
    double dp = p->dropout_p;
    memcpy(&k->dropout_bits, &dp, sizeof dp);
    k->deterministic = backward && (p->deterministic || k->has_bias);   /* dBias needs the dP-workspace engine */
}

/* ---- graph building --------------------------------------------------------------------------- */
typedef struct fz_gb {
    al_dnn_graph *g;
    const fz_key *k;
    cudnnDataType_t io;
    al_dnn sq_t, skv_t, ni, sc;     /* sequence lengths (or NULL), -inf, scale */
    int64_t sdim[4], sstr[4];       /* S-shaped virtuals */
    int64_t rdim[4], rstr[4];       /* row-shaped virtuals */
    int left_is_int;
} fz_gb;

static const cudnnDataType_t F32 = CUDNN_DATA_FLOAT, I32 = CUDNN_DATA_INT32, BOOL_ = CUDNN_DATA_BOOLEAN,
                             I64 = CUDNN_DATA_INT64;

static al_dnn vs(fz_gb *b, cudnnDataType_t dt) { return al_dnn_virtual(b->g, dt, b->sdim, b->sstr); }
static al_dnn vr(fz_gb *b) { return al_dnn_virtual(b->g, F32, b->rdim, b->rstr); }

static al_dnn pw2(fz_gb *b, cudnnPointwiseMode_t m, cudnnDataType_t prec, al_dnn x, al_dnn y_in, al_dnn out) {
    al_dnn_pointwise(b->g, m, prec, x, y_in, NULL, out, 0);
    return out;
}

static al_dnn gen_index(fz_gb *b, al_dnn s, int64_t axis, cudnnDataType_t prec) {
    al_dnn o = vs(b, I32);
    al_dnn_pointwise(b->g, CUDNN_POINTWISE_GEN_INDEX, prec, s, NULL, NULL, o, axis);
    return o;
}

static al_dnn select_ninf(fz_gb *b, al_dnn s, al_dnn keep) {
    al_dnn o = vs(b, F32);
    al_dnn_pointwise(b->g, CUDNN_POINTWISE_BINARY_SELECT, F32, s, b->ni, keep, o, 0);
    return o;
}

/* bias, ALiBi, padding: the score modifiers applied right after the scale */
static al_dnn score_modifiers(fz_gb *b, al_dnn s) {
    const fz_key *k = b->k;
    if (k->has_bias) {
        al_dnn B = al_dnn_tensor(b->g, U_BIAS, b->io, k->bias_dim, k->bias_str, 0, 0, NULL);
        s = pw2(b, CUDNN_POINTWISE_ADD, F32, s, B, vs(b, F32));
    }
    if (k->alibi) {
        const int64_t sd[4] = {1, k->h, 1, 1}, ss[4] = {k->h, 1, 1, 1};
        al_dnn slopes = al_dnn_tensor(b->g, U_SLOPES, F32, sd, ss, 0, 0, NULL);
        al_dnn row = gen_index(b, s, 2, I32), col = gen_index(b, s, 3, I32);
        al_dnn d = pw2(b, CUDNN_POINTWISE_SUB, I32, col, row, vs(b, I32));
        al_dnn a = pw2(b, CUDNN_POINTWISE_MUL, F32, d, slopes, vs(b, F32));
        s = pw2(b, CUDNN_POINTWISE_ADD, F32, s, a, vs(b, F32));
    }
    if (k->padding) {
        al_dnn row = gen_index(b, s, 2, I32), col = gen_index(b, s, 3, I32);
        al_dnn rm = pw2(b, CUDNN_POINTWISE_CMP_LT, BOOL_, row, b->sq_t, vs(b, BOOL_));
        al_dnn cm = pw2(b, CUDNN_POINTWISE_CMP_LT, BOOL_, col, b->skv_t, vs(b, BOOL_));
        al_dnn m = pw2(b, CUDNN_POINTWISE_LOGICAL_AND, BOOL_, rm, cm, vs(b, BOOL_));
        s = select_ninf(b, s, m);
    }
    return s;
}

/* the diagonal band: right bound (causal, shifted by window_right) then left bound (window_left) */
static al_dnn band_masks(fz_gb *b, al_dnn s) {
    const fz_key *k = b->k;
    if (k->right >= 0) {
        al_dnn row = gen_index(b, s, 2, F32), col = gen_index(b, s, 3, F32);
        if (k->bottom_right) {
            al_dnn skv = k->padding ? b->skv_t : al_dnn_scalar(b->g, U_BR_SKV, I32);
            al_dnn sq = k->padding ? b->sq_t : al_dnn_scalar(b->g, U_BR_SQ, I32);
            row = pw2(b, CUDNN_POINTWISE_ADD, I32, row, skv, vs(b, I32));
            row = pw2(b, CUDNN_POINTWISE_SUB, I32, row, sq, vs(b, I32));
        }
        if (k->right > 0) row = pw2(b, CUDNN_POINTWISE_ADD, I32, row, al_dnn_scalar(b->g, U_SHIFT_RIGHT, I32), vs(b, I32));
        al_dnn keep = pw2(b, CUDNN_POINTWISE_CMP_GE, BOOL_, row, col, vs(b, BOOL_));
        s = select_ninf(b, s, keep);
    }
    if (k->left >= 0) {
        al_dnn row = gen_index(b, s, 2, F32), col = gen_index(b, s, 3, F32);
        if (k->bottom_right && k->padding) {
            b->left_is_int = 1;
            col = pw2(b, CUDNN_POINTWISE_ADD, I32, col, al_dnn_scalar(b->g, U_LEFT_BOUND, I32), vs(b, I32));
            col = pw2(b, CUDNN_POINTWISE_SUB, I32, col, b->skv_t, vs(b, I32));
            col = pw2(b, CUDNN_POINTWISE_ADD, I32, col, b->sq_t, vs(b, I32));
        } else {
            /* top-left: col + left; bottom-right without lengths: col + (left - skv + sq), as floats */
            col = pw2(b, CUDNN_POINTWISE_ADD, F32, col, al_dnn_scalar(b->g, U_LEFT_BOUND, F32), vs(b, F32));
        }
        al_dnn keep = pw2(b, CUDNN_POINTWISE_CMP_GT, BOOL_, col, row, vs(b, BOOL_));
        s = select_ninf(b, s, keep);
    }
    return s;
}

/* the tensors every graph has */
typedef struct fz_io {
    al_dnn ragged[8];
} fz_io;

static al_dnn io_tensor(fz_gb *b, fz_io *io, int role, int64_t uid, const int64_t dim[4], int transposed) {
    const fz_key *k = b->k;
    int64_t d[4] = {dim[0], dim[1], dim[2], dim[3]}, s[4];
    memcpy(s, k->str[role], sizeof s);
    if (transposed) {
        int64_t t = d[2]; d[2] = d[3]; d[3] = t;
        t = s[2]; s[2] = s[3]; s[3] = t;
    }
    return al_dnn_tensor(b->g, uid, b->io, d, s, 0, 0, k->rg[role] >= 0 ? io->ragged[k->rg[role]] : NULL);
}

static void gb_init(fz_gb *b, al_dnn_graph *g, const fz_key *k, fz_io *io) {
    memset(b, 0, sizeof *b);
    memset(io, 0, sizeof *io);
    b->g = g;
    b->k = k;
    b->io = k->dtype == AL_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    int64_t sd[4] = {k->b, k->h, k->sq, k->skv}, ss[4] = {k->h * k->sq * k->skv, k->sq * k->skv, k->skv, 1};
    int64_t rd[4] = {k->b, k->h, k->sq, 1}, rs[4] = {k->h * k->sq, k->sq, 1, 1};
    memcpy(b->sdim, sd, sizeof sd); memcpy(b->sstr, ss, sizeof ss);
    memcpy(b->rdim, rd, sizeof rd); memcpy(b->rstr, rs, sizeof rs);
    const int64_t one[4] = {1, 1, 1, 1};
    for (int64_t i = 0; i < k->nrg; i++) {
        int64_t rdm[4] = {k->b + 1, 1, 1, 1};
        io->ragged[i] = al_dnn_tensor(g, U_RAGGED0 + i, I64, rdm, one, 0, 0, NULL);
    }
    if (k->padding) {
        int64_t ld[4] = {k->b, 1, 1, 1};
        b->sq_t = al_dnn_tensor(g, U_SEQ_Q, I32, ld, one, 0, 0, NULL);
        b->skv_t = al_dnn_tensor(g, U_SEQ_KV, I32, ld, one, 0, 0, NULL);
    }
    b->sc = al_dnn_scalar(g, U_SCALE, F32);
    b->ni = (k->padding || k->right >= 0 || k->left >= 0) ? al_dnn_scalar(g, U_NEG_INF, F32) : NULL;
}

static double key_dropout(const fz_key *k) {
    double p;
    memcpy(&p, &k->dropout_bits, sizeof p);
    return p;
}

static al_dnn dropout_mask(fz_gb *b) {
    const int64_t one[4] = {1, 1, 1, 1};
    al_dnn seed = al_dnn_tensor(b->g, U_SEED, I64, one, one, 0, 0, NULL);
    al_dnn off = al_dnn_tensor(b->g, U_OFFSET, I64, one, one, 0, 0, NULL);
    al_dnn r = vs(b, F32);
    al_dnn_rng(b->g, seed, off, r, 1.0 - key_dropout(b->k));
    return r;
}

static void build_forward(al_dnn_graph *g, const fz_key *k, int *left_is_int) {
    fz_gb b;
    fz_io io;
    gb_init(&b, g, k, &io);
    const int64_t qd[4] = {k->b, k->h, k->sq, k->dqk}, kd[4] = {k->b, k->hg, k->skv, k->dqk};
    const int64_t vd[4] = {k->b, k->hg, k->skv, k->dv}, od[4] = {k->b, k->h, k->sq, k->dv};
    int drop = key_dropout(k) > 0.0;
    al_dnn Q = io_tensor(&b, &io, R_Q, U_Q, qd, 0);
    al_dnn KT = io_tensor(&b, &io, R_K, U_K, kd, 1);
    al_dnn V = io_tensor(&b, &io, R_V, U_V, vd, 0);
    al_dnn O = io_tensor(&b, &io, R_O, U_O, od, 0);
    al_dnn ST = al_dnn_tensor(g, U_STATS, F32, b.rdim, b.rstr, 0, 0, NULL);
    al_dnn R = drop ? dropout_mask(&b) : NULL;

    al_dnn s = vs(&b, F32);
    al_dnn_matmul(g, Q, KT, s, b.sq_t, b.skv_t, NULL);
    s = pw2(&b, CUDNN_POINTWISE_MUL, F32, s, b.sc, vs(&b, F32));
    s = score_modifiers(&b, s);
    s = band_masks(&b, s);

    /* softmax with stats (and the sink's extra term in max and denominator) */
    al_dnn sink = NULL;
    if (k->sink) {
        const int64_t sd[4] = {1, k->h, 1, 1}, ss[4] = {k->h, 1, 1, 1};
        sink = al_dnn_tensor(g, U_SINK, F32, sd, ss, 0, 0, NULL);
    }
    al_dnn M = vr(&b);
    if (sink) {
        al_dnn m0 = vr(&b);
        al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_MAX, s, m0);
        pw2(&b, CUDNN_POINTWISE_MAX, F32, m0, sink, M);
    } else {
        al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_MAX, s, M);
    }
    al_dnn sm = pw2(&b, CUDNN_POINTWISE_SUB, F32, s, M, vs(&b, F32));
    al_dnn e = vs(&b, F32);
    al_dnn_pointwise(g, CUDNN_POINTWISE_EXP, F32, sm, NULL, NULL, e, 0);
    al_dnn Z = vr(&b);
    if (sink) {
        al_dnn ss = pw2(&b, CUDNN_POINTWISE_SUB, F32, sink, M, vr(&b));
        al_dnn es = vr(&b);
        al_dnn_pointwise(g, CUDNN_POINTWISE_EXP, F32, ss, NULL, NULL, es, 0);
        al_dnn z0 = vr(&b);
        al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, z0);
        pw2(&b, CUDNN_POINTWISE_ADD, F32, z0, es, Z);
    } else {
        al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, Z);
    }
    al_dnn lz = vr(&b);
    al_dnn_pointwise(g, CUDNN_POINTWISE_LOG, F32, Z, NULL, NULL, lz, 0);
    pw2(&b, CUDNN_POINTWISE_ADD, F32, M, lz, ST);
    al_dnn P;
    if (drop) {
        al_dnn p0 = pw2(&b, CUDNN_POINTWISE_DIV, F32, e, Z, vs(&b, F32));
        al_dnn p1 = pw2(&b, CUDNN_POINTWISE_MUL, F32, p0, R, vs(&b, F32));
        P = pw2(&b, CUDNN_POINTWISE_MUL, F32, p1, al_dnn_scalar(g, U_DROP_SCALE, F32), vs(&b, b.io));
    } else {
        P = pw2(&b, CUDNN_POINTWISE_DIV, F32, e, Z, vs(&b, b.io));   /* P in the I/O type for the 2nd matmul */
    }
    al_dnn_matmul(g, P, V, O, b.sq_t, NULL, b.skv_t);
    *left_is_int = b.left_is_int;
}

static void build_backward(al_dnn_graph *g, const fz_key *k, int *left_is_int) {
    fz_gb b;
    fz_io io;
    gb_init(&b, g, k, &io);
    const int64_t qd[4] = {k->b, k->h, k->sq, k->dqk}, kd[4] = {k->b, k->hg, k->skv, k->dqk};
    const int64_t vd[4] = {k->b, k->hg, k->skv, k->dv}, od[4] = {k->b, k->h, k->sq, k->dv};
    int drop = key_dropout(k) > 0.0, gqa = k->h != k->hg;
    al_dnn Q = io_tensor(&b, &io, R_Q, U_Q, qd, 0);
    al_dnn KT = io_tensor(&b, &io, R_K, U_K, kd, 1);
    al_dnn VT = io_tensor(&b, &io, R_V, U_V, vd, 1);
    al_dnn O = io_tensor(&b, &io, R_O, U_O, od, 0);
    al_dnn dO = io_tensor(&b, &io, R_DO, U_DO, od, 0);
    al_dnn dQ = io_tensor(&b, &io, R_DQ, U_DQ, qd, 0);
    al_dnn dK = io_tensor(&b, &io, R_DK, U_DK, kd, 0);
    al_dnn dV = io_tensor(&b, &io, R_DV, U_DV, vd, 0);
    al_dnn ST = al_dnn_tensor(g, U_STATS, F32, b.rdim, b.rstr, 0, 0, NULL);
    al_dnn SS = al_dnn_tensor(g, U_SOFTMAX_SUM, F32, b.rdim, b.rstr, 0, 0, NULL);
    al_dnn R = drop ? dropout_mask(&b) : NULL;
    al_dnn dscale = drop ? al_dnn_scalar(g, U_DROP_SCALE, F32) : NULL;

    /* softmax_sum = rowsum(dO * O) * (1 - p) */
    const int64_t t0s[4] = {k->h * k->sq * k->dv, k->sq * k->dv, k->h * k->dv, 1};
    al_dnn t0 = al_dnn_virtual(g, F32, od, t0s);
    pw2(&b, CUDNN_POINTWISE_MUL, F32, dO, O, t0);
    al_dnn t1 = vr(&b);
    al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, t0, t1);
    pw2(&b, CUDNN_POINTWISE_MUL, F32, t1, al_dnn_scalar(g, drop ? U_DROP_SCALE_INV : U_ONE, F32), SS);

    /* P = exp(S - stats) */
    al_dnn s = vs(&b, F32);
    al_dnn_matmul(g, Q, KT, s, b.sq_t, b.skv_t, NULL);
    s = pw2(&b, CUDNN_POINTWISE_MUL, F32, s, b.sc, vs(&b, F32));
    s = score_modifiers(&b, s);
    s = pw2(&b, CUDNN_POINTWISE_SUB, F32, s, ST, vs(&b, F32));
    s = band_masks(&b, s);
    al_dnn E = vs(&b, F32);
    al_dnn_pointwise(g, CUDNN_POINTWISE_EXP, F32, s, NULL, NULL, E, 0);
    al_dnn Pd = E;
    if (drop) {
        Pd = pw2(&b, CUDNN_POINTWISE_MUL, F32, Pd, R, vs(&b, F32));
        Pd = pw2(&b, CUDNN_POINTWISE_MUL, F32, Pd, dscale, vs(&b, F32));
    }
    const int64_t td[4] = {k->b, k->h, k->skv, k->sq}, ts[4] = {k->h * k->sq * k->skv, k->sq * k->skv, 1, k->skv};
    al_dnn PT = al_dnn_virtual(g, b.io, td, ts);
    al_dnn_reshape(g, Pd, PT);
    if (!gqa) {
        al_dnn_matmul(g, PT, dO, dV, b.skv_t, NULL, b.sq_t);
    } else {
        const int64_t fd[4] = {k->b, k->h, k->skv, k->dv}, fs[4] = {k->h * k->skv * k->dv, k->skv * k->dv, k->dv, 1};
        al_dnn full = al_dnn_virtual(g, b.io, fd, fs);
        al_dnn_matmul(g, PT, dO, full, b.skv_t, NULL, b.sq_t);
        al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, full, dV);
    }

    /* dS = P * (dP - softmax_sum) * scale */
    al_dnn dp = vs(&b, F32);
    al_dnn_matmul(g, dO, VT, dp, b.sq_t, b.skv_t, NULL);
    if (drop) dp = pw2(&b, CUDNN_POINTWISE_MUL, F32, dp, R, vs(&b, F32));
    dp = pw2(&b, CUDNN_POINTWISE_SUB, F32, dp, SS, vs(&b, F32));
    dp = pw2(&b, CUDNN_POINTWISE_MUL, F32, dp, E, vs(&b, F32));
    if (drop) dp = pw2(&b, CUDNN_POINTWISE_MUL, F32, dp, dscale, vs(&b, F32));
    if (k->has_bias) {
        int64_t ds[4];   /* dBias: contiguous in the bias's shape */
        ds[3] = 1;
        for (int d = 2; d >= 0; d--) ds[d] = ds[d + 1] * k->bias_dim[d + 1];
        al_dnn DB = al_dnn_tensor(g, U_DBIAS, b.io, k->bias_dim, ds, 0, 0, NULL);
        al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, dp, DB);
    }
    al_dnn dS = pw2(&b, CUDNN_POINTWISE_MUL, F32, dp, b.sc, vs(&b, F32));
    al_dnn dST = al_dnn_virtual(g, b.io, td, ts);
    al_dnn_reshape(g, dS, dST);
    if (!gqa) {
        al_dnn_matmul(g, dST, Q, dK, b.skv_t, NULL, b.sq_t);
    } else {
        const int64_t fd[4] = {k->b, k->h, k->skv, k->dqk}, fs[4] = {k->h * k->skv * k->dqk, k->skv * k->dqk, k->dqk, 1};
        al_dnn full = al_dnn_virtual(g, b.io, fd, fs);
        al_dnn_matmul(g, dST, Q, full, b.skv_t, NULL, b.sq_t);
        al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, full, dK);
    }

    /* dQ = dS K */
    int64_t ks[4] = {k->str[R_K][0], k->str[R_K][1], k->str[R_K][2], k->str[R_K][3]};
    al_dnn Kv = al_dnn_tensor(g, g->next_vuid++, F32, kd, ks, 1, 0, k->rg[R_K] >= 0 ? io.ragged[k->rg[R_K]] : NULL);
    al_dnn_reshape(g, KT, Kv);
    if (k->deterministic) {
        al_dnn_matmul(g, dS, Kv, dQ, b.sq_t, NULL, b.skv_t);
    } else {
        const int64_t as[4] = {k->h * k->sq * k->dqk, k->sq * k->dqk, k->dqk, 1};
        al_dnn acc = al_dnn_tensor(g, U_DQ_ACC, F32, qd, as, 0, 0, NULL);
        al_dnn_matmul(g, dS, Kv, acc, b.sq_t, NULL, b.skv_t);
        al_dnn_pointwise(g, CUDNN_POINTWISE_IDENTITY, F32, acc, NULL, NULL, dQ, 0);
    }
    *left_is_int = b.left_is_int;
}

/* ---- cache ---------------------------------------------------------------------------------------- */
/* The graph of key k (one form; cudnn_plan_cache.h). flags: 1 when U_LEFT_BOUND is int32 (bottom-right with
 * sequence lengths). */
static int build_graph(al_dnn_graph *g, const void *key, int attempt, int64_t *flags) {
    const fz_key *k = (const fz_key *)key;
    if (attempt > 0) return 0;
    int left_is_int = 0;
    if (k->backward) build_backward(g, k, &left_is_int);
    else build_forward(g, k, &left_is_int);
    *flags = left_is_int;
    return 1;
}

static al_dnn_cache_slot g_slots[FZ_CACHE_CAP];
static fz_key g_keys[FZ_CACHE_CAP];
static al_dnn_plan_cache g_cache = AL_DNN_PLAN_CACHE(g_slots, g_keys, build_graph);   /* g_lock held */

/* ---- per-call data ------------------------------------------------------------------------------ */
/* Small per-call inputs (sequence lengths, ragged offsets, slopes, sink, seed/offset) staged in one
 * host block and copied with one h2d transfer into one device block. */
typedef struct fz_aux {
    char host[4096];
    char *heap;                 /* used instead of host when larger */
    int64_t used;
    void *dev;
    int64_t dev_bytes;
    int32_t device;
} fz_aux;

static int64_t aux_take(fz_aux *a, int64_t nbytes) {
    int64_t off = (a->used + 15) / 16 * 16;
    a->used = off + nbytes;
    return off;
}
static char *aux_host(fz_aux *a) { return a->heap ? a->heap : a->host; }

static void aux_init(fz_aux *a, int32_t device) {
    a->heap = NULL;
    a->dev = NULL;
    a->used = 0;
    a->dev_bytes = 0;
    a->device = device;
}

static void aux_release(fz_aux *a) {
    if (a->dev) al_cu_free(a->device, a->dev, a->dev_bytes);
    free(a->heap);
    a->dev = NULL;
    a->heap = NULL;
}

typedef struct fz_call {
    const al_attn_plan *pl;
    fz_setup su;
    fz_key key;
    const al_tensor *t[NROLE];
    void *ptr[U_COUNT];
    /* by-value scalars (host memory read by cudnnBackendExecute) */
    float scale, ninf, one, drop_scale, drop_scale_inv, left_f;
    int32_t br_skv, br_sq, shift_right, left_i;
    int64_t off_seq_q, off_seq_kv, off_ragged[8], off_slopes, off_sink, off_seed, off_offset;
} fz_call;

/* Lay out and fill the aux block for a call, upload it and set the pointers. */
static al_status aux_upload(fz_call *c, fz_aux *a) {
    const al_attn_plan *pl = c->pl;
    const al_attn_params *p = &pl->p;
    const fz_key *k = &c->key;
    int64_t b = p->b;
    aux_init(a, pl->in.q->device_index);
    if (k->padding) {
        c->off_seq_q = aux_take(a, 4 * b);
        c->off_seq_kv = aux_take(a, 4 * b);
    }
    for (int64_t i = 0; i < k->nrg; i++) c->off_ragged[i] = aux_take(a, 8 * (b + 1));
    if (k->alibi) c->off_slopes = aux_take(a, 4 * p->h);
    if (k->sink) c->off_sink = aux_take(a, 4 * p->h);
    if (key_dropout(k) > 0.0) {
        c->off_seed = aux_take(a, 8);
        c->off_offset = aux_take(a, 8);
    }
    if (a->used == 0) return AL_OK;
    if (a->used > (int64_t)sizeof a->host) {
        a->heap = (char *)malloc((size_t)a->used);
        if (!a->heap) return al_error(AL_ERR_OOM, "attention (fused): out of host memory (%lld bytes)", (long long)a->used);
    }
    char *h = aux_host(a);
    if (k->padding) {
        int32_t *sq = (int32_t *)(h + c->off_seq_q), *skv = (int32_t *)(h + c->off_seq_kv);
        for (int64_t i = 0; i < b; i++) { sq[i] = (int32_t)pl->q_len[i]; skv[i] = (int32_t)pl->kv_len[i]; }
    }
    for (int64_t g = 0; g < k->nrg; g++) {
        int64_t *o = (int64_t *)(h + c->off_ragged[g]);
        const int64_t *start = k->rg_side[g] ? pl->kv_start : pl->q_start;
        const int64_t *len = k->rg_side[g] ? pl->kv_len : pl->q_len;
        for (int64_t i = 0; i < b; i++) o[i] = start[i] * k->rg_stride[g];
        o[b] = (b > 0 ? start[b - 1] + len[b - 1] : 0) * k->rg_stride[g];
    }
    if (k->alibi) {
        float *s = (float *)(h + c->off_slopes);
        for (int64_t i = 0; i < p->h; i++) s[i] = pl->alibi[i];
    }
    if (k->sink) {
        float *s = (float *)(h + c->off_sink);
        for (int64_t i = 0; i < p->h; i++) s[i] = pl->softmax_offset[i];
    }
    if (key_dropout(k) > 0.0) {
        int64_t seed = (int64_t)p->dropout_seed, off = (int64_t)p->dropout_offset;
        memcpy(h + c->off_seed, &seed, 8);
        memcpy(h + c->off_offset, &off, 8);
    }
    a->dev_bytes = a->used;
    AL_TRY(al_cu_malloc(a->device, a->dev_bytes, &a->dev));
    AL_TRY(al_cu_memcpy_h2d(a->device, a->dev, h, a->used));
    char *d = (char *)a->dev;
    if (k->padding) { c->ptr[U_SEQ_Q] = d + c->off_seq_q; c->ptr[U_SEQ_KV] = d + c->off_seq_kv; }
    for (int64_t g = 0; g < k->nrg; g++) c->ptr[U_RAGGED0 + g] = d + c->off_ragged[g];
    if (k->alibi) c->ptr[U_SLOPES] = d + c->off_slopes;
    if (k->sink) c->ptr[U_SINK] = d + c->off_sink;
    if (key_dropout(k) > 0.0) { c->ptr[U_SEED] = d + c->off_seed; c->ptr[U_OFFSET] = d + c->off_offset; }
    return AL_OK;
}

/* Scalars every graph may reference (only those in the entry's UID list are passed). */
static void set_scalars(fz_call *c, const al_dnn_cached_plan *e) {
    const al_attn_params *p = &c->pl->p;
    const fz_key *k = &c->key;
    double dp = key_dropout(k);
    c->scale = (float)p->softmax_scale;
    c->ninf = -INFINITY;
    c->one = 1.0f;
    c->drop_scale = dp > 0 ? (float)(1.0 / (1.0 - dp)) : 1.0f;
    c->drop_scale_inv = (float)(1.0 - dp);
    c->br_skv = (int32_t)p->skv;
    c->br_sq = (int32_t)p->sq;
    c->shift_right = (int32_t)(k->right > 0 ? k->right : 0);
    /* e->flags: U_LEFT_BOUND is int32 in this graph (build_graph), else float */
    if (e->flags) c->left_i = (int32_t)k->left;
    else c->left_f = (float)(k->bottom_right ? k->left - p->skv + p->sq : k->left);
    c->ptr[U_SCALE] = &c->scale;
    c->ptr[U_NEG_INF] = &c->ninf;
    c->ptr[U_ONE] = &c->one;
    c->ptr[U_DROP_SCALE] = &c->drop_scale;
    c->ptr[U_DROP_SCALE_INV] = &c->drop_scale_inv;
    c->ptr[U_BR_SKV] = &c->br_skv;
    c->ptr[U_BR_SQ] = &c->br_sq;
    c->ptr[U_SHIFT_RIGHT] = &c->shift_right;
    c->ptr[U_LEFT_BOUND] = e->flags ? (void *)&c->left_i : (void *)&c->left_f;
}

/* The caller's post_scale_bias (U_BIAS): an input of both graphs when the key has a bias. Its
 * address already passed al_dnn_layout_problem() in supports(); its strides are part of the key. */
static void bind_bias(fz_call *c) {
    if (c->key.has_bias) c->ptr[U_BIAS] = al_tensor_data_ptr(c->pl->in.bias);
}

static al_status run_entry(cudnnHandle_t handle, const al_dnn_cached_plan *e, fz_call *c, void *ws) {
    void *ptrs[AL_DNN_MAX_UIDS];
    for (int i = 0; i < e->nuids; i++) {
        int64_t u = e->uids[i];
        ptrs[i] = (u >= 0 && u < U_COUNT) ? c->ptr[u] : NULL;
        if (!ptrs[i])
            return al_error(AL_ERR_INTERNAL, "attention (fused): no data pointer for cuDNN tensor uid %lld", (long long)u);
    }
    return al_dnn_execute(handle, e->plan, e->nuids, e->uids, ptrs, ws);
}

/* ---- small kernels -------------------------------------------------------------------------------- */
/* Rows past a sequence's length get lse = -inf (cuDNN leaves them unwritten). */
__global__ void fz_lse_fixup(float *lse, const int32_t *seq_q, int64_t b, int64_t h, int64_t sq) {
    int64_t n = b * h * sq;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i % sq, bb = i / (h * sq);
        if (row >= seq_q[bb]) lse[i] = -INFINITY;
    }
}

/* d offset_h = -sum_{b,i} exp(offset_h - lse) * Drow, Drow = softmax_sum / (1 - p); empty rows skipped.
 * One block per head, a fixed-order tree reduction (deterministic). */
__global__ void fz_dsink(float *dsink, const float *sink, const float *lse, const float *softmax_sum, float drop_scale,
                         int64_t b, int64_t h, int64_t sq) {
    __shared__ float red[256];
    int64_t hh = blockIdx.x;
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < b * sq; i += blockDim.x) {
        int64_t bb = i / sq, row = i % sq;
        int64_t idx = (bb * h + hh) * sq + row;
        float l = lse[idx];
        if (l == -INFINITY || l != l) continue;
        acc += expf(sink[hh] - l) * softmax_sum[idx] * drop_scale;
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) dsink[hh] = -red[0];
}

/* ---- supports ------------------------------------------------------------------------------------- */
#define NO(...) do { snprintf(reason, n, __VA_ARGS__); return 0; } while (0)

static int roles_ok(const al_attn_plan *pl, char *reason, size_t n) {
    char buf[128];
    const al_tensor *ts[3] = {pl->in.q, pl->in.k, pl->in.v};
    for (int i = 0; i < 3; i++) {
        const char *why = al_dnn_layout_problem(ts[i], buf, sizeof buf);
        if (why) NO("%s: %s", role_name[i], why);
    }
    return 1;
}

static int32_t fused_supports(const al_attn_plan *pl, char *reason, size_t n) {
    if (pl->in.fp8) {
        /* The FP8 graphs (attn_fused_fp8.cu) passed tests/spec/fp8_fused_spec.lua on an H200 (cuDNN 9.14);
         * ATTNLAB_FUSED_FP8=0 switches them off for automatic selection (A/B against the cpu emulation). */
        const char *e = getenv("ATTNLAB_FUSED_FP8");
        if (e && strcmp(e, "0") == 0 && strcmp(pl->p.backend, "fused") != 0)
            NO("FP8 SDPA through cuDNN is switched off by ATTNLAB_FUSED_FP8=0 (force backend \"fused\" to use it)");
        return al_fz8_supports(pl, reason, n);
    }
    const al_attn_params *p = &pl->p;
    const al_tensor *q = pl->in.q;
    size_t ver = cudnnGetVersion();
    const char *vs_ = al_dnn_version_text();
    if (q->device_type != AL_DEVICE_CUDA) NO("tensors are on the CPU; the fused backend (cuDNN %s) serves cuda tensors", vs_);
    if (ver < FZ_MIN_VERSION) NO("cuDNN %s is older than 9.10.2, the oldest this backend accepts", vs_);
    int32_t dev = q->device_index;
    if (dev < 0 || dev >= al_cu_ndev) NO("device cuda:%d does not exist", dev);
    int cc = al_dnn_cc_major(dev);
    if (cc < 8) NO("cuDNN %s fused attention needs sm_80 or newer; cuda:%d is sm_%d.x", vs_, dev, cc);
    if (q->dtype != AL_DTYPE_F16 && q->dtype != AL_DTYPE_BF16)
        NO("cuDNN %s fused attention takes f16 or bf16, got %s (use unfused or cpu)", vs_, al_dtype_name(q->dtype));
    if (p->compute_dtype == AL_DTYPE_F64) NO("compute_dtype=f64 is not available in cuDNN (f32 accumulation)");
    if (p->d_qk % 8 || p->d_v % 8) NO("head dims must be multiples of 8 for cuDNN, got d_qk=%lld d_v=%lld",
                                     (long long)p->d_qk, (long long)p->d_v);
    int64_t dmax = cc >= 9 ? 256 : 128;
    if (p->d_qk > dmax || p->d_v > dmax)
        NO("cuDNN %s supports head dims up to %lld on sm_%d.x (forward and backward), got d_qk=%lld d_v=%lld", vs_,
           (long long)dmax, cc, (long long)p->d_qk, (long long)p->d_v);
    if (p->mask_type == AL_ATTN_MASK_ARBITRARY) NO("arbitrary masks are not expressible in cuDNN's SDPA graph");
    if (p->bias_type == AL_ATTN_BIAS_PRE_SCALE) NO("pre_scale_bias is not supported by cuDNN's SDPA graph (post_scale_bias is)");
    if (p->return_max_logit) NO("return_max_logit is not implemented by the fused backend");
    if (p->sq == 1 && p->skv == 1) NO("cuDNN's SDPA backward rejects s_q = s_kv = 1");
    if (p->softmax_type != AL_ATTN_SOFTMAX_VANILLA && ver < 91300)
        NO("softmax_type %s (a sink) needs cuDNN >= 9.13, this is %s",
           p->softmax_type == AL_ATTN_SOFTMAX_OFF_BY_ONE ? "off-by-one" : "learnable", vs_);
    /* padding from masks must be right padding (a prefix of valid tokens) */
    for (int side = 0; side < 2; side++) {
        const uint8_t *valid = side ? pl->kv_valid : pl->q_valid;
        if (!valid) continue;
        int64_t s = side ? p->skv : p->sq;
        const int64_t *len = side ? pl->kv_len : pl->q_len;
        for (int64_t bb = 0; bb < p->b; bb++)
            for (int64_t i = 0; i < s; i++)
                if ((valid[bb * s + i] != 0) != (i < len[bb]))
                    NO("the %s padding mask of sequence %lld is not right-padding (cuDNN takes sequence lengths only)",
                       side ? "kv" : "q", (long long)bb);
    }
    fz_setup su;
    resolve(pl, &su);
    if (su.thd && cc < 9 && ver < 91801) NO("thd (ragged) layouts need Hopper or cuDNN >= 9.18.1, this is %s on sm_%d.x", vs_, cc);
    int has_bias = p->bias_type == AL_ATTN_BIAS_POST_SCALE;
    int alibi = p->bias_type == AL_ATTN_BIAS_ALIBI;
    int drop = p->dropout_p > 0.0;
    if (su.bottom_right && (has_bias || alibi || drop))
        NO("cuDNN's bottom-right diagonal does not combine with %s", has_bias ? "a bias" : alibi ? "ALiBi" : "dropout");
    if ((su.bottom_right || su.left >= 0) && !su.padding && p->sq > p->skv)
        NO("cuDNN needs s_q <= s_kv for bottom-right or sliding-window masks without padding (s_q=%lld s_kv=%lld)",
           (long long)p->sq, (long long)p->skv);
    if (su.left >= 0 && su.right < 0 && ver == 91400 && p->skv > 1024)
        NO("cuDNN 9.14.0 has a known bug with a sliding window without a causal bound for s_kv > 1024");
    if (alibi) {
        if (su.right != 0 || su.bottom_right)
            NO("cuDNN's ALiBi needs a causal top-left mask (window_right = 0, no diagonal offset); got window_right=%lld%s",
               (long long)p->window_right, su.bottom_right ? ", bottom-right" : "");
        for (int64_t i = p->h; i < p->b * p->h; i++)
            if (pl->alibi[i] != pl->alibi[i % p->h]) NO("per-batch ALiBi slopes ([b,h]) are not expressible in cuDNN (only [h])");
    }
    if (has_bias) {
        const al_tensor *B = pl->in.bias;
        char buf[128];
        if (!B) NO("post_scale_bias without a bias tensor");
        if (B->dtype != q->dtype) NO("core_attention_bias must have q's dtype (%s) for cuDNN, got %s",
                                     al_dtype_name(q->dtype), al_dtype_name(B->dtype));
        if (B->ndim != 4) NO("core_attention_bias must be 4-d for cuDNN");
        if (B->size[2] == 1 && p->sq > 1) NO("cuDNN cannot produce dbias for a bias broadcast over s_q ([.., .., 1, s_kv])");
        const char *why = al_dnn_layout_problem(B, buf, sizeof buf);
        if (why) NO("core_attention_bias: %s", why);
    }
    if (!roles_ok(pl, reason, n)) return 0;

    /* the forward graph itself: built (or found) now, so a refusal is reported here with cuDNN's words */
    int64_t str[NROLE][4];
    int has[NROLE] = {0};
    int64_t ostr[8];
    int64_t osize[4];
    int nd = q->ndim;
    for (int d = 0; d < nd; d++) osize[d] = q->size[d];
    osize[nd - 1] = p->d_v;
    al_contiguous_strides(nd, osize, ostr);
    al_tensor ot;
    memset(&ot, 0, sizeof ot);
    ot.ndim = nd;
    for (int d = 0; d < nd; d++) { ot.size[d] = osize[d]; ot.stride[d] = ostr[d]; }
    al_dnn_bhsd_strides(p->qkv_format, q, p->sq, str[R_Q]);
    al_dnn_bhsd_strides(p->qkv_format, pl->in.k, p->skv, str[R_K]);
    al_dnn_bhsd_strides(p->qkv_format, pl->in.v, p->skv, str[R_V]);
    al_dnn_bhsd_strides(p->qkv_format, &ot, p->sq, str[R_O]);
    has[R_Q] = has[R_K] = has[R_V] = has[R_O] = 1;
    fz_key k;
    key_build(&k, pl, &su, 0, str, has);
    pthread_mutex_lock(&g_lock);
    cudnnHandle_t handle;
    cudaStream_t stream_unused;
    al_status st = get_handle_stream(dev, &handle, &stream_unused);
    int ok = 0;
    if (st != AL_OK) snprintf(reason, n, "%s", al_last_error());
    else {
        const al_dnn_cached_plan *e = al_dnn_cache_get(&g_cache, &k, handle);
        ok = e->plan != NULL;
        if (!ok) snprintf(reason, n, "cuDNN %s refused the forward graph: %s", vs_, e->reason);
    }
    pthread_mutex_unlock(&g_lock);
    return ok;
}
#undef NO

/* ---- forward -------------------------------------------------------------------------------------- */
/* ---- host profile of the forward (ATTNLAB_HOST_PROFILE=1, host_profile.h) ------------------------------
 * Issue 5's host-overhead target (<= 5 us per cached call) needs to know where the time goes: fused_forward
 * notes the clock at each stage boundary; al_dnn_execute's own clock readings (al_dnn_prof_ns) split the
 * binding into the variant pack's build and cuDNN's execute ("rest": the remainder of run_entry);
 * al_fused_info appends the means per call. Off: one predictable branch per stage. */
enum { FP_OUTPUTS, FP_SETUP, FP_PLAN, FP_AUX, FP_PACK, FP_EXEC, FP_REST, FP_TAIL, FP_N };
static al_hprof g_fwd_prof = {"fused forward", FP_N, {"outputs", "key", "plan", "aux+ws", "pack", "execute", "rest", "tail"},
                              {0}, 0};

static al_status fused_forward(const al_attn_plan *pl, al_tensor *out, al_tensor *lse, al_tensor *max_logit) {
    if (pl->in.fp8) return al_fz8_forward(pl, out, lse, max_logit);
    const al_attn_params *p = &pl->p;
    const al_tensor *q = pl->in.q;
    int32_t dev = q->device_index;
    if (max_logit) return al_error(AL_ERR_UNSUPPORTED, "attention (fused): return_max_logit is not implemented");
    int nd = q->ndim;
    int64_t osize[4];
    for (int d = 0; d < nd; d++) osize[d] = q->size[d];
    osize[nd - 1] = p->d_v;
    int64_t lsize[3] = {p->b, p->h, p->sq};
    const int prof = al_hprof_on();
    double pt[FP_N + 1];
    if (prof) pt[0] = al_hprof_now();
    AL_TRY(al_tensor_empty(out, nd, osize, q->dtype, AL_DEVICE_CUDA, dev));
    al_status s = al_tensor_empty(lse, 3, lsize, AL_DTYPE_F32, AL_DEVICE_CUDA, dev);
    if (s != AL_OK) { al_tensor_release(out); return s; }
    if (prof) pt[FP_OUTPUTS + 1] = al_hprof_now();

    fz_call *c = (fz_call *)calloc(1, sizeof *c);
    fz_aux *a = (fz_aux *)malloc(sizeof *a);
    if (!c || !a) { free(c); free(a); al_tensor_release(out); al_tensor_release(lse); return al_error(AL_ERR_OOM, "attention (fused): out of memory"); }
    aux_init(a, dev);
    c->pl = pl;
    resolve(pl, &c->su);
    int64_t str[NROLE][4];
    int has[NROLE] = {0};
    c->t[R_Q] = q; c->t[R_K] = pl->in.k; c->t[R_V] = pl->in.v; c->t[R_O] = out;
    for (int r = R_Q; r <= R_O; r++) {
        al_dnn_bhsd_strides(p->qkv_format, c->t[r], (r == R_K || r == R_V) ? p->skv : p->sq, str[r]);
        has[r] = 1;
    }
    key_build(&c->key, pl, &c->su, 0, str, has);
    cudaStream_t stream;
    void *ws = NULL;
    const al_dnn_cached_plan *e = NULL;
    if (prof) pt[FP_SETUP + 1] = al_hprof_now();
    pthread_mutex_lock(&g_lock);
    cudnnHandle_t handle;
    s = get_handle_stream(dev, &handle, &stream);
    if (s == AL_OK) {
        e = al_dnn_cache_get(&g_cache, &c->key, handle);
        if (!e->plan) s = al_error(AL_ERR_UNSUPPORTED, "attention (fused): cuDNN refused the forward graph: %s", e->reason);
    }
    if (prof) pt[FP_PLAN + 1] = al_hprof_now();
    if (s == AL_OK) s = aux_upload(c, a);
    if (s == AL_OK && e->ws > 0) s = al_cu_malloc(dev, e->ws, &ws);
    if (s == AL_OK && c->su.padding)
        s = AL_CUDA_ST(cudaMemsetAsync(al_tensor_data_ptr(out), 0, (size_t)(al_tensor_numel(out) * al_dtype_size(out->dtype)), stream));
    if (prof) pt[FP_AUX + 1] = al_hprof_now();
    if (s == AL_OK) {
        for (int r = R_Q; r <= R_O; r++) c->ptr[U_Q + r] = al_tensor_data_ptr(c->t[r]);
        c->ptr[U_STATS] = al_tensor_data_ptr(lse);
        bind_bias(c);
        set_scalars(c, e);
        const double d0 = prof ? al_dnn_prof_ns[0] : 0.0, d1 = prof ? al_dnn_prof_ns[1] : 0.0;
        s = run_entry(handle, e, c, ws);
        if (prof) {   /* the pack and the execute as stages, run_entry's remainder after them */
            pt[FP_PACK + 1] = pt[FP_AUX + 1] + (al_dnn_prof_ns[0] - d0);
            pt[FP_EXEC + 1] = pt[FP_PACK + 1] + (al_dnn_prof_ns[1] - d1);
        }
    }
    if (prof) pt[FP_REST + 1] = al_hprof_now();
    if (s == AL_OK && c->su.padding) {
        int64_t nrow = p->b * p->h * p->sq;
        if (nrow > 0) {
            fz_lse_fixup<<<al_cu_grid(dev, nrow), AL_CU_THREADS, 0, stream>>>((float *)al_tensor_data_ptr(lse),
                                                                             (const int32_t *)c->ptr[U_SEQ_Q], p->b, p->h, p->sq);
            s = AL_CUDA_ST(cudaGetLastError());
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (ws) al_cu_free(dev, ws, e->ws);
    aux_release(a);
    free(a);
    free(c);
    if (s != AL_OK) { al_tensor_release(out); al_tensor_release(lse); }
    if (prof && s == AL_OK) {
        pt[FP_TAIL + 1] = al_hprof_now();
        al_hprof_add(&g_fwd_prof, pt);
    }
    return s;
}

/* ---- backward ------------------------------------------------------------------------------------- */
static al_status fused_backward(const al_attn_plan *pl, const al_tensor *out, const al_tensor *dout, const al_tensor *lse,
                                al_tensor *dq, al_tensor *dk, al_tensor *dv, al_tensor *dbias, al_tensor *d_softmax_offset) {
    if (pl->in.fp8) return al_fz8_backward(pl, out, dout, lse, dq, dk, dv);
    const al_attn_params *p = &pl->p;
    const al_tensor *q = pl->in.q;
    int32_t dev = q->device_index;
    char buf[128];
    const al_tensor *chk[5] = {out, dq, dk, dv, lse};
    const char *chk_name[5] = {"out", "dq", "dk", "dv", "lse"};
    for (int i = 0; i < 5; i++) {
        if (chk[i]->device_type != AL_DEVICE_CUDA || chk[i]->device_index != dev)
            return al_error(AL_ERR_ARG, "attention_backward (fused): %s must be on cuda:%d", chk_name[i], dev);
    }
    for (int i = 0; i < 4; i++) {
        if (chk[i]->dtype != q->dtype)
            return al_error(AL_ERR_ARG, "attention_backward (fused): %s must have q's dtype %s, got %s", chk_name[i],
                            al_dtype_name(q->dtype), al_dtype_name(chk[i]->dtype));
        const char *why = al_dnn_layout_problem(chk[i], buf, sizeof buf);
        if (why) return al_error(AL_ERR_ARG, "attention_backward (fused): %s: %s", chk_name[i], why);
    }
    if (!al_tensor_is_contiguous(lse)) return al_error(AL_ERR_ARG, "attention_backward (fused): lse must be contiguous [b,h,sq]");

    fz_call *c = (fz_call *)calloc(1, sizeof *c);
    fz_aux *a = (fz_aux *)malloc(sizeof *a);
    if (!c || !a) { free(c); free(a); return al_error(AL_ERR_OOM, "attention_backward (fused): out of memory"); }
    aux_init(a, dev);
    al_tensor dout_c;   /* dout in out's layout when it differs (cuDNN reads dO like O) */
    memset(&dout_c, 0, sizeof dout_c);
    al_status s = AL_OK;
    {
        int64_t so[4], sd[4];
        al_dnn_bhsd_strides(p->qkv_format, out, p->sq, so);
        al_dnn_bhsd_strides(p->qkv_format, dout, p->sq, sd);
        if (dout->dtype != q->dtype || memcmp(so, sd, sizeof so) != 0 || al_dnn_layout_problem(dout, buf, sizeof buf)) {
            s = al_tensor_empty(&dout_c, out->ndim, out->size, q->dtype, AL_DEVICE_CUDA, dev);
            if (s == AL_OK) s = al_cu_copy(&dout_c, dout);
            if (s == AL_OK && al_dnn_layout_problem(&dout_c, buf, sizeof buf))
                s = al_error(AL_ERR_ARG, "attention_backward (fused): out: its layout does not suit cuDNN");
            dout = &dout_c;
        }
    }
    resolve(pl, &c->su);
    c->pl = pl;
    c->t[R_Q] = q; c->t[R_K] = pl->in.k; c->t[R_V] = pl->in.v; c->t[R_O] = out;
    c->t[R_DO] = dout; c->t[R_DQ] = dq; c->t[R_DK] = dk; c->t[R_DV] = dv;
    int64_t str[NROLE][4];
    int has[NROLE];
    for (int r = 0; r < NROLE; r++) {
        int kvside = r == R_K || r == R_V || r == R_DK || r == R_DV;
        al_dnn_bhsd_strides(p->qkv_format, c->t[r], kvside ? p->skv : p->sq, str[r]);
        has[r] = 1;
    }
    key_build(&c->key, pl, &c->su, 1, str, has);
    int learnable = p->softmax_type == AL_ATTN_SOFTMAX_LEARNABLE && d_softmax_offset;
    if (s == AL_OK && c->key.has_bias && dbias) {
        s = al_tensor_empty(dbias, 4, pl->in.bias->size, pl->in.bias->dtype, AL_DEVICE_CUDA, dev);
    }
    if (s == AL_OK && learnable) {
        int64_t h = p->h;
        s = al_tensor_empty(d_softmax_offset, 1, &h, AL_DTYPE_F32, AL_DEVICE_CUDA, dev);
    }
    cudaStream_t stream;
    void *ws = NULL, *acc = NULL, *ssum = NULL, *dbias_tmp = NULL;
    int64_t acc_bytes = p->b * p->h * p->sq * p->d_qk * 4, ssum_bytes = p->b * p->h * p->sq * 4, dbias_bytes = 0;
    const al_dnn_cached_plan *e = NULL;
    pthread_mutex_lock(&g_lock);
    cudnnHandle_t handle;
    if (s == AL_OK) s = get_handle_stream(dev, &handle, &stream);
    if (s == AL_OK) {
        e = al_dnn_cache_get(&g_cache, &c->key, handle);
        if (!e->plan) s = al_error(AL_ERR_UNSUPPORTED, "attention_backward (fused): cuDNN refused the backward graph: %s", e->reason);
    }
    if (s == AL_OK) s = aux_upload(c, a);
    if (s == AL_OK && e->ws > 0) s = al_cu_malloc(dev, e->ws, &ws);
    if (s == AL_OK && !c->key.deterministic) s = al_cu_malloc(dev, acc_bytes > 0 ? acc_bytes : 16, &acc);
    if (s == AL_OK) s = al_cu_malloc(dev, ssum_bytes > 0 ? ssum_bytes : 16, &ssum);
    if (s == AL_OK && c->key.has_bias) {
        if (dbias && dbias->storage) c->ptr[U_DBIAS] = al_tensor_data_ptr(dbias);
        else {   /* the graph writes dBias whether or not the caller wants it */
            dbias_bytes = al_dtype_size(q->dtype);
            for (int d = 0; d < 4; d++) dbias_bytes *= pl->in.bias->size[d];
            s = al_cu_malloc(dev, dbias_bytes, &dbias_tmp);
            c->ptr[U_DBIAS] = dbias_tmp;
        }
    }
    /* cuDNN writes only the rows inside each sequence: padding rows and thd gaps must read 0 */
    if (s == AL_OK && c->su.padding) {
        s = al_cu_fill(dq, 0.0);
        if (s == AL_OK) s = al_cu_fill(dk, 0.0);
        if (s == AL_OK) s = al_cu_fill(dv, 0.0);
        if (s == AL_OK && c->ptr[U_DBIAS])
            s = AL_CUDA_ST(cudaMemsetAsync(c->ptr[U_DBIAS], 0, (size_t)(dbias_bytes ? dbias_bytes : al_tensor_numel(dbias) * al_dtype_size(q->dtype)), stream));
    }
    if (s == AL_OK) {
        for (int r = 0; r < NROLE; r++) {
            static const int uid_of[NROLE] = {U_Q, U_K, U_V, U_O, U_DO, U_DQ, U_DK, U_DV};
            c->ptr[uid_of[r]] = al_tensor_data_ptr(c->t[r]);
        }
        c->ptr[U_STATS] = al_tensor_data_ptr(lse);
        bind_bias(c);   /* the backward graph re-reads the bias to rebuild the scores (dBias is U_DBIAS, above) */
        c->ptr[U_DQ_ACC] = acc;
        c->ptr[U_SOFTMAX_SUM] = ssum;
        set_scalars(c, e);
        s = run_entry(handle, e, c, ws);
    }
    if (s == AL_OK && learnable) {
        fz_dsink<<<(unsigned)p->h, 256, 0, stream>>>((float *)al_tensor_data_ptr(d_softmax_offset), (const float *)c->ptr[U_SINK],
                                                   (const float *)al_tensor_data_ptr(lse), (const float *)ssum, c->drop_scale,
                                                   p->b, p->h, p->sq);
        s = AL_CUDA_ST(cudaGetLastError());
    }
    pthread_mutex_unlock(&g_lock);
    if (ws) al_cu_free(dev, ws, e->ws);
    if (acc) al_cu_free(dev, acc, acc_bytes > 0 ? acc_bytes : 16);
    if (ssum) al_cu_free(dev, ssum, ssum_bytes > 0 ? ssum_bytes : 16);
    if (dbias_tmp) al_cu_free(dev, dbias_tmp, dbias_bytes);
    al_tensor_release(&dout_c);
    aux_release(a);
    free(a);
    free(c);
    if (s != AL_OK) {
        if (dbias) al_tensor_release(dbias);
        if (d_softmax_offset) al_tensor_release(d_softmax_offset);
    }
    return s;
}

/* ---- registration and info ------------------------------------------------------------------------ */
/* fp8 = 1: this backend judges FP8 plans itself (attn_fused_fp8.cu); fp8_ds = 1: and reads fp8.ds on the device */
static const al_attn_backend fused_backend = {"fused", fused_supports, fused_forward, fused_backward, 1, 1};

al_status al_cu_attn_fused_register(void) {
    return al_attn_register_backend(&fused_backend);
}

/* Lua-visible (ffi.load of the plugin): "cudnn=9.19.0 plans=N builds=M". */
extern "C" __attribute__((visibility("default"))) int64_t al_fused_info(char *buf, int64_t n) {
    const char *v = al_dnn_version_text();
    pthread_mutex_lock(&g_lock);
    int cached = al_dnn_cache_plans(&g_cache);
    int64_t builds = g_cache.builds;
    pthread_mutex_unlock(&g_lock);
    if (buf && n > 0) {
        int u = snprintf(buf, (size_t)n, "cudnn=%s cudnn_header=%d.%d.%d plans=%d builds=%lld fp8_builds=%lld", v,
                         CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL, cached, (long long)builds, (long long)al_fz8_builds());
        if (u > 0 && u < n) u = (int)al_hprof_format(&g_fwd_prof, buf, (size_t)u, (size_t)n);   /* ATTNLAB_HOST_PROFILE=1 */
        if (u > 0 && u < n) al_fz8_profile_format(buf, (size_t)u, (size_t)n);
    }
    return builds;
}
