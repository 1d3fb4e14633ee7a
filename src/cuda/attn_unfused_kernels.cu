/*
 * cuda/attn_unfused_kernels.cu — the kernels of the unfused attention backend (attn_unfused.h) and
 * their launchers. Everything is f32 compute, as the CPU oracle's f32 path:
 *
 *   softmax_fwd   one block per query row (b, h, i) of the materialised score matrix: scale, pre/post
 *                 bias, ALiBi and the element mask of attention_internal.h, then max, sum (with the
 *                 off-by-one / learnable sink), lse, max_logit, and P = exp(s - m) / l with dropout
 *                 (keep/(1-p)) written back in place. Rows past q_rows or padded rows: P = 0, lse -inf.
 *   gather        a q/k/v/dout view (any dtype, any strides, thd starts) -> contiguous f32 [B,heads,S,D],
 *                 zero past each sequence's rows.
 *   scatter       the reverse into a caller's tensor (rows < rows[b]; the caller zero-fills first).
 *   rows_bwd      per query row: Drow = sum dO*O (f64), the lse as f32, the sink gradient term.
 *   ds_bwd        element-wise over [B,H,SQ,SKV]: P = exp(s - lse) recomputed, Z = dropout keep/(1-p),
 *                 dS = P (dPd Z - Drow), PD = P Z (in place of S and dPd).
 *   dbias, doffset  reductions over the broadcast dims, in a fixed order (deterministic).
 *
 * Dropout: element (b, h, i, j) is kept iff al_philox_keep(seed, offset, ((b*H + h)*SQ + i)*SKV + j,
 * 1 - p), numeric/philox.h: the CPU backend's rule, bit for bit.
 */
#include "cuda/attn_unfused.h"
#include "numeric/philox.h"
#include "numeric/fp8_scale.h"

#define UA_BLOCK 256

/* ---- the element rule (attention_internal.h) ---------------------------------------------------- */
/* Is (b, h, i, j) masked out? i < q_rows[b] and j < kv_rows[b] are the caller's. */
static __device__ __forceinline__ bool ua_masked(const al_ua_dev &P, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (P.q_valid && !P.q_valid[b * P.SQ + i]) return true;
    if (P.kv_valid && !P.kv_valid[b * P.SKV + j]) return true;
    const int64_t c = i + P.diag[b];
    if (P.wl >= 0 && j < c - P.wl) return true;
    if (P.wr >= 0 && j > c + P.wr) return true;
    if (P.arb && P.arb[P.arb_off + b * P.arb_s[0] + h * P.arb_s[1] + i * P.arb_s[2] + j * P.arb_s[3]]) return true;
    return false;
}

/* The score of (b, h, i, j) from the raw q.k, or -inf when masked. Explicitly rounded ops (no fma
 * contraction), in the CPU's order. */
static __device__ __forceinline__ float ua_score(const al_ua_dev &P, int64_t b, int64_t h, int64_t i, int64_t j,
                                                 float qk) {
    float s;
    if (P.bias_type == AL_ATTN_BIAS_PRE_SCALE || P.bias_type == AL_ATTN_BIAS_POST_SCALE) {
        float bv = al_ld_f32(P.bias, P.bias_dtype,
                             P.bias_off + b * P.bias_s[0] + h * P.bias_s[1] + i * P.bias_s[2] + j * P.bias_s[3]);
        s = P.bias_type == AL_ATTN_BIAS_PRE_SCALE ? __fmul_rn(__fadd_rn(qk, bv), P.scale)
                                                  : __fadd_rn(__fmul_rn(qk, P.scale), bv);
    } else {
        s = __fmul_rn(qk, P.scale);
    }
    if (P.alibi) {
        int64_t dist = j - i - P.diag[b];
        s = __fsub_rn(s, __fmul_rn(P.alibi[b * P.H + h], (float)(dist < 0 ? -dist : dist)));
    }
    if (ua_masked(P, b, h, i, j)) s = -INFINITY;
    return s;
}

static __device__ __forceinline__ float ua_keep_scale(const al_ua_dev &P, uint64_t idx) {
    return al_philox_keep(P.seed, P.offset, idx, P.keep_prob) ? P.dscale : 0.0f;
}

/* ---- block reductions ------------------------------------------------------------------------------ */
static __device__ __forceinline__ float ua_block_max(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
static __device__ __forceinline__ float ua_block_sum(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ double ua_block_sum_d(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* atomic max on a float initialised to -inf (ordering of IEEE bits: ints for >= 0, reversed uints below) */
static __device__ __forceinline__ void ua_atomic_max(float *addr, float v) {
    if (!(v > -INFINITY)) return;
    if (v >= 0.0f) atomicMax((int *)addr, __float_as_int(v));
    else atomicMin((unsigned int *)addr, __float_as_uint(v));
}

static unsigned ua_grid(int32_t dev, int64_t n) { return al_cu_grid(dev, n); }

/* ---- FP8 emulation helpers (the CPU's al_attn_fq / amax, src/cpu/attention_cpu.h) ------------------------ */
/* quantise -> dequantise of v with scale s (inverse inv), in double as the CPU */
static __device__ __forceinline__ float ua_fq(int32_t fmt, float v, double s, double inv) {
    return (float)(al_fp8_decode(fmt, al_fp8_encode(fmt, (double)v * s)) * inv);
}
/* *acc = max(*acc, m) for an amax m >= 0 or NaN (such doubles order as their unsigned bit patterns) */
static __device__ __forceinline__ void ua_amax_into(double *acc, float m) {
    if (m != 0.0f) atomicMax((unsigned long long *)acc, (unsigned long long)__double_as_longlong((double)fabsf(m)));
}
/* the CPU forward's key tiles (AL_ATTN_BN = 128 columns from the row block's first visible key) */
#define UA_F8_BN 128
#define UA_F8_BM 64

/* ---- forward softmax ------------------------------------------------------------------------------- */
__global__ void __launch_bounds__(UA_BLOCK) ua_softmax_fwd_kernel(al_ua_dev P, float *S, float *lse, float *max_logit) {
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    const int64_t i = row % P.SQ, bh = row / P.SQ, h = bh % P.H, b = bh / P.H;
    float *s = S + row * P.SKV;
    const int64_t kvr = P.kv_rows[b];
    const bool row_ok = i < P.q_rows[b] && !(P.q_valid && !P.q_valid[b * P.SQ + i]);
    if (!row_ok) {
        for (int64_t j = threadIdx.x; j < P.SKV; j += blockDim.x) s[j] = 0.0f;
        if (threadIdx.x == 0) lse[row] = -INFINITY;
        return;
    }
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < P.SKV; j += blockDim.x) {
        float v = j < kvr ? ua_score(P, b, h, i, j, s[j]) : -INFINITY;
        s[j] = v;
        mx = fmaxf(mx, v);
    }
    mx = ua_block_max(mx, sh);               /* the raw row max: max_logit's candidate */
    const float sink = P.sink ? P.sink[h] : 0.0f;
    const float m = P.sink ? fmaxf(mx, sink) : mx;
    const float mu = m == -INFINITY ? 0.0f : m;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < P.SKV; j += blockDim.x) sum += expf(s[j] - mu);
    sum = ua_block_sum(sum, sh);
    const float l = sum + (P.sink ? expf(sink - mu) : 0.0f);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const uint64_t base = (uint64_t)row * (uint64_t)P.SKV;
    const int f8s = P.f8 && P.f8_sS >= 0.0;
    for (int64_t j = threadIdx.x; j < P.SKV; j += blockDim.x) {
        float p = expf(s[j] - mu) * inv;
        if (P.dropout && !f8s) p *= ua_keep_scale(P, base + (uint64_t)j);
        s[j] = p;
    }
    if (f8s) {
        /* The S slot as the CPU emulation reads it (attention_fwd_tmpl.h, after cuDNN's FP8 kernel): P.V takes
         * the unnormalised exp(s - m_t) against the running max m_t of the key tiles seen so far, quantised ->
         * dequantised with scale_S, and O is divided by the full row sum at the end. With the normalised p here,
         * exp(s - m_t) = p / pm_t and the tile's weight exp(m_t - lse) = pm_t, where pm_t is the running max of p
         * over the tiles up to t: so p becomes fq(p / pm_t) * pm_t. The tiles start at the row block's first
         * visible key (al_attn_kv_range: a left window moves it). amax_S = the row's max p. Then dropout. */
        extern __shared__ float tmax[];
        int64_t jlo = 0;
        const int64_t d = P.diag[b], i0 = (i / UA_F8_BM) * UA_F8_BM;
        if (P.wl >= 0 && i0 + d - P.wl > jlo) jlo = i0 + d - P.wl;
        if (jlo > kvr) jlo = kvr;
        const int64_t nt = (P.SKV - jlo + UA_F8_BN - 1) / UA_F8_BN;
        __syncthreads();   /* (every p of the row stored) */
        for (int64_t t = threadIdx.x; t < nt; t += blockDim.x) {
            float m = 0.0f;
            for (int64_t j = jlo + t * UA_F8_BN; j < jlo + (t + 1) * UA_F8_BN && j < P.SKV; j++) m = fmaxf(m, s[j]);
            tmax[t] = m;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float m = 0.0f;
            for (int64_t t = 0; t < nt; t++) tmax[t] = m = fmaxf(m, tmax[t]);
            if (l > 0.0f && mx > -INFINITY) ua_amax_into(&P.f8_amax[0], m);
        }
        __syncthreads();
        const double sS = P.f8_sS, sinv = 1.0 / P.f8_sS;
        for (int64_t j = threadIdx.x; j < P.SKV; j += blockDim.x) {
            float p = s[j];
            if (j >= jlo && p > 0.0f) {
                const float pm = tmax[(j - jlo) / UA_F8_BN];
                p = ua_fq(P.f8_fwd, p / pm, sS, sinv) * pm;
            }
            if (P.dropout) p *= ua_keep_scale(P, base + (uint64_t)j);
            s[j] = p;
        }
    }
    if (threadIdx.x == 0) {
        lse[row] = l > 0.0f ? (float)((double)mu + log((double)l)) : -INFINITY;
        if (max_logit) ua_atomic_max(&max_logit[h], mx);
    }
}

al_status al_ua_softmax_fwd(int32_t dev, cudaStream_t s, const al_ua_dev *P, float *S, float *lse, float *max_logit) {
    const int64_t rows = P->B * P->H * P->SQ;
    if (rows == 0) return AL_OK;
    if (rows > INT32_MAX)
        return al_error(AL_ERR_UNSUPPORTED, "attention (unfused): %lld query rows exceed the grid limit", (long long)rows);
    /* (FP8 S slot: one running max per key tile of the row, in dynamic shared memory) */
    const size_t smem = P->f8 && P->f8_sS >= 0.0 ? sizeof(float) * (size_t)((P->SKV + UA_F8_BN - 1) / UA_F8_BN + 1) : 0;
    if (smem > 48 * 1024)
        return al_error(AL_ERR_UNSUPPORTED, "attention (unfused, fp8): skv = %lld needs %zu bytes of key-tile maxima (48 KiB at most)",
                        (long long)P->SKV, smem);
    ua_softmax_fwd_kernel<<<(unsigned)rows, UA_BLOCK, smem, s>>>(*P, S, lse, max_logit);
    AL_CUDA_LAUNCHED_K("ua_softmax_fwd_kernel");
    return AL_OK;
}

/* ---- gather / scatter ------------------------------------------------------------------------------ */
__global__ void __launch_bounds__(AL_CU_THREADS) ua_gather_kernel(al_ua_op op, const int64_t *rows, int64_t heads,
                                                                  int64_t S, int64_t D, float *dst, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < n; x += stride) {
        int64_t d = x % D, t = x / D, i = t % S;
        t /= S;
        int64_t h = t % heads, b = t / heads;
        float v = 0.0f;
        if (i < rows[b]) {
            int64_t st = op.start ? op.start[b] : 0;
            v = al_ld_f32(op.base, op.dtype, b * op.s_b + h * op.s_h + st * op.s_tok + i * op.s_r + d * op.s_c);
        }
        dst[x] = v;
    }
}

al_status al_ua_gather(int32_t dev, cudaStream_t s, const al_ua_op *op, const int64_t *rows, int64_t B, int64_t heads,
                       int64_t rows_max, int64_t D, float *dst) {
    const int64_t n = B * heads * rows_max * D;
    if (n == 0) return AL_OK;
    ua_gather_kernel<<<ua_grid(dev, n), AL_CU_THREADS, 0, s>>>(*op, rows, heads, rows_max, D, dst, n);
    AL_CUDA_LAUNCHED_K("ua_gather_kernel");
    return AL_OK;
}

__global__ void __launch_bounds__(AL_CU_THREADS) ua_scatter_kernel(const float *src, al_ua_op op, const int64_t *rows,
                                                                   int64_t heads, int64_t S, int64_t D, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    char *base = (char *)op.base;
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < n; x += stride) {
        int64_t d = x % D, t = x / D, i = t % S;
        t /= S;
        int64_t h = t % heads, b = t / heads;
        if (i >= rows[b]) continue;
        int64_t st = op.start ? op.start[b] : 0;
        al_st_f32(base, op.dtype, b * op.s_b + h * op.s_h + st * op.s_tok + i * op.s_r + d * op.s_c, src[x]);
    }
}

al_status al_ua_scatter(int32_t dev, cudaStream_t s, const float *src, const al_ua_op *op, const int64_t *rows,
                        int64_t B, int64_t heads, int64_t rows_max, int64_t D) {
    const int64_t n = B * heads * rows_max * D;
    if (n == 0) return AL_OK;
    ua_scatter_kernel<<<ua_grid(dev, n), AL_CU_THREADS, 0, s>>>(src, *op, rows, heads, rows_max, D, n);
    AL_CUDA_LAUNCHED_K("ua_scatter_kernel");
    return AL_OK;
}

/* ---- backward: per-row terms ----------------------------------------------------------------------- */
/* One warp per query row. */
__global__ void __launch_bounds__(AL_CU_THREADS) ua_rows_bwd_kernel(al_ua_dev P, al_ua_op o, al_ua_op g,
                                                                    const char *lse_base, int32_t lse_dtype,
                                                                    int64_t lse_off, int64_t l0, int64_t l1, int64_t l2,
                                                                    float *Drow, float *Lrow, double *rowc, int64_t nrows) {
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    const int lane = threadIdx.x & 31;
    for (int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < nrows; row += warps) {
        const int64_t i = row % P.SQ, bh = row / P.SQ, h = bh % P.H, b = bh / P.H;
        double acc = 0.0;
        const bool in_rows = i < P.q_rows[b];
        if (in_rows) {
            const int64_t st = P.q_start[b];
            const int64_t oo = b * o.s_b + h * o.s_h + (st + i) * o.s_tok;
            const int64_t go = b * g.s_b + h * g.s_h + (st + i) * g.s_tok;
            for (int64_t d = lane; d < P.DV; d += 32)
                acc += al_ld_f64(g.base, g.dtype, go + d * g.s_c) * al_ld_f64(o.base, o.dtype, oo + d * o.s_c);
        }
        for (int w = 16; w > 0; w >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, w);
        if (lane == 0) {
            const double L = al_ld_f64(lse_base, lse_dtype, lse_off + b * l0 + h * l1 + i * l2);
            const bool row_ok = in_rows && !(P.q_valid && !P.q_valid[b * P.SQ + i]) && L != -INFINITY;
            Drow[row] = (float)acc;
            Lrow[row] = row_ok ? (float)L : INFINITY;     /* +inf: exp(s - L) = 0 */
            if (rowc) rowc[row] = row_ok ? -exp(P.sink_d[h] - L) * acc : 0.0;
        }
    }
}

al_status al_ua_rows_bwd(int32_t dev, cudaStream_t s, const al_ua_dev *P, const al_ua_op *out, const al_ua_op *dout,
                         const char *lse_base, int32_t lse_dtype, int64_t lse_off, const int64_t ls[3], float *Drow,
                         float *Lrow, double *rowc) {
    const int64_t n = P->B * P->H * P->SQ;
    if (n == 0) return AL_OK;
    ua_rows_bwd_kernel<<<ua_grid(dev, n * 32), AL_CU_THREADS, 0, s>>>(*P, *out, *dout, lse_base, lse_dtype, lse_off, ls[0],
                                                                       ls[1], ls[2], Drow, Lrow, rowc, n);
    AL_CUDA_LAUNCHED_K("ua_rows_bwd_kernel");
    return AL_OK;
}

/* ---- backward: element-wise dS ------------------------------------------------------------------------ */
__global__ void __launch_bounds__(AL_CU_THREADS) ua_ds_bwd_kernel(al_ua_dev P, float *A, float *Bm, const float *Lrow,
                                                                  const float *Drow, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    float am = 0.0f;   /* (FP8: this thread's amax of dS before its quantisation) */
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < n; x += stride) {
        const int64_t j = x % P.SKV, row = x / P.SKV;
        const int64_t i = row % P.SQ, bh = row / P.SQ, h = bh % P.H, b = bh / P.H;
        const float L = Lrow[row];
        float s = -INFINITY;
        if (L != INFINITY && i < P.q_rows[b] && j < P.kv_rows[b]) s = ua_score(P, b, h, i, j, A[x]);
        if (s == -INFINITY) {               /* masked, padded or outside the sequence: never read dPd */
            A[x] = 0.0f;
            Bm[x] = 0.0f;
            continue;
        }
        float p = expf(s - L);
        /* FP8: the S slot (the CPU backward quantises the normalised P), then the dP slot on dS */
        if (P.f8 && P.f8_sS >= 0.0) p = ua_fq(P.f8_fwd, p, P.f8_sS, 1.0 / P.f8_sS);
        const float z = P.dropout ? ua_keep_scale(P, (uint64_t)x) : 1.0f;
        const float g = __fmul_rn(Bm[x], z);
        float ds = __fmul_rn(p, __fsub_rn(g, Drow[row]));
        if (P.f8 && P.f8_sdP >= 0.0) {
            am = ds != ds || am != am ? __int_as_float(0x7fc00000) : fmaxf(am, fabsf(ds));
            ds = ua_fq(P.f8_bwd, ds, P.f8_sdP, 1.0 / P.f8_sdP);
        }
        A[x] = ds;
        Bm[x] = __fmul_rn(p, z);
    }
    if (P.f8 && P.f8_sdP >= 0.0) {   /* amax_dP: the block's, into the accumulator */
        __shared__ float sh[32];
        for (int o = 16; o > 0; o >>= 1) {
            const float w = __shfl_xor_sync(0xffffffffu, am, o);
            am = am != am || w != w ? __int_as_float(0x7fc00000) : fmaxf(am, w);
        }
        const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
        if (lane == 0) sh[wid] = am;
        __syncthreads();
        if (threadIdx.x == 0) {
            float m = 0.0f;
            for (int k = 0; k < nw; k++) m = m != m || sh[k] != sh[k] ? __int_as_float(0x7fc00000) : fmaxf(m, sh[k]);
            ua_amax_into(&P.f8_amax[1], m);
        }
    }
}

al_status al_ua_ds_bwd(int32_t dev, cudaStream_t s, const al_ua_dev *P, float *A, float *Bm, const float *Lrow,
                       const float *Drow) {
    const int64_t n = P->B * P->H * P->SQ * P->SKV;
    if (n == 0) return AL_OK;
    ua_ds_bwd_kernel<<<ua_grid(dev, n), AL_CU_THREADS, 0, s>>>(*P, A, Bm, Lrow, Drow, n);
    AL_CUDA_LAUNCHED_K("ua_ds_bwd_kernel");
    return AL_OK;
}

/* ---- backward: reductions -------------------------------------------------------------------------- */
/* One thread per dbias element; the broadcast dims are summed in a fixed order (f64). */
__global__ void __launch_bounds__(AL_CU_THREADS) ua_dbias_kernel(al_ua_dev P, const float *A, int64_t b1, int64_t h1,
                                                                 int64_t s1, double factor, char *dbias, int32_t dtype,
                                                                 int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < n; x += stride) {
        int64_t j = x % P.SKV, t = x / P.SKV;
        const int64_t ii = t % s1;
        t /= s1;
        const int64_t hi = t % h1, bi = t / h1;
        const int64_t blo = b1 == 1 ? 0 : bi, bhi = b1 == 1 ? P.B : bi + 1;
        const int64_t hlo = h1 == 1 ? 0 : hi, hhi = h1 == 1 ? P.H : hi + 1;
        const int64_t ilo = s1 == 1 ? 0 : ii, ihi = s1 == 1 ? P.SQ : ii + 1;
        double acc = 0.0;
        for (int64_t b = blo; b < bhi; b++)
            for (int64_t h = hlo; h < hhi; h++)
                for (int64_t i = ilo; i < ihi; i++) acc += (double)A[((b * P.H + h) * P.SQ + i) * P.SKV + j];
        al_st_f64(dbias, dtype, x, factor * acc);
    }
}

al_status al_ua_dbias(int32_t dev, cudaStream_t s, const al_ua_dev *P, const float *A, const int64_t bsize[4],
                      double factor, char *dbias, int32_t dtype) {
    const int64_t n = bsize[0] * bsize[1] * bsize[2] * bsize[3];
    if (n == 0) return AL_OK;
    ua_dbias_kernel<<<ua_grid(dev, n), AL_CU_THREADS, 0, s>>>(*P, A, bsize[0], bsize[1], bsize[2], factor, dbias, dtype, n);
    AL_CUDA_LAUNCHED_K("ua_dbias_kernel");
    return AL_OK;
}

/* One block per head. */
__global__ void __launch_bounds__(UA_BLOCK) ua_doffset_kernel(al_ua_dev P, const double *rowc, float *d_offset) {
    __shared__ double sh[32];
    const int64_t h = blockIdx.x;
    double acc = 0.0;
    for (int64_t b = 0; b < P.B; b++)
        for (int64_t i = threadIdx.x; i < P.SQ; i += blockDim.x) acc += rowc[(b * P.H + h) * P.SQ + i];
    acc = ua_block_sum_d(acc, sh);
    if (threadIdx.x == 0) d_offset[h] = (float)acc;
}

al_status al_ua_doffset(int32_t dev, cudaStream_t s, const al_ua_dev *P, const double *rowc, float *d_offset) {
    if (P->H == 0) return AL_OK;
    ua_doffset_kernel<<<(unsigned)P->H, UA_BLOCK, 0, s>>>(*P, rowc, d_offset);
    AL_CUDA_LAUNCHED_K("ua_doffset_kernel");
    return AL_OK;
}
