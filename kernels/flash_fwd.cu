/*
 * kernels/flash_fwd.cu — FlashAttention-2-class forward for the `flash` backend (src/cuda/attn_flash.cu),
 * compiled at run time by NVRTC (src/cuda/nvrtc_cache.cu) for the device's architecture (sm_90a on
 * Hopper) and cached on disk.
 *
 * Variants (-D defines, see kernels/flash_common.cuh and src/cuda/flash_specs.h for the shipped set):
 *   AL_HEAD_DIM 64 | 128 | 256      (d_qk == d_v)
 *   AL_BF16 1 (bf16) | 0 (f16)
 *   AL_MASK_KIND 0 none | 1 causal | 2 window (runtime wl, wr); AL_BOTTOM_RIGHT 0 | 1 (diagonal)
 *   AL_ALIBI 0 | 1
 *   AL_BLOCK_M / AL_BLOCK_N / AL_WARPS (defaults per head dim below; BLOCK_M = 16 * WARPS)
 *   AL_Q_IN_REGS 1: Q fragments held in registers for the whole KV loop (default for d <= 128)
 *   hooks AL_SCORE_MOD / AL_MASK_MOD, AL_VARIANT, AL_BLOCK_MASK 0 | 1 (contract in flash_common.cuh):
 *   with a block mask only the tiles whose block is nonzero are visited (the K/V pipeline runs over
 *   that list), and mask_mod is evaluated only in partial (1) blocks
 * Bench: luajit bench/flash_bench.lua  (checks against cpu and unfused, then TFLOP/s over a sweep)
 *
 * Design (FA2, perf_anchors.md §3.1):
 *   grid (ceil(SQ/BM), H, B), Q-block index fastest so the CTAs of one head share K/V in L2.
 *   Each warp owns 16 query rows and sees the whole K/V tile (split-Q: softmax statistics stay in a
 *   quad of lanes). S = Q K^T and O += P V with mma.sync m16n8k16 (f32 accumulation); operands come
 *   from swizzled shared memory with ldmatrix.x4 (V with .trans); P never leaves registers (the C
 *   fragment of S, packed to 16 bits, is the A fragment of P V).
 *   K and V tiles are double-buffered with cp.async: tile j+1 is in flight while tile j is used;
 *   K(j) and V(j) are separate commit groups so Q K^T starts before V(j) has landed.
 *   Online softmax in log2 units: logits are q.k * (scale * log2 e) (one FMUL; ALiBi and the score
 *   hook add to it), exp2 via ex2.approx, O normalised by 1/l once at the end; LSE = (m + log2 l) ln 2.
 *   Rows with no visible key (fully masked) give O = 0 and LSE = -inf.
 *   Only the KV blocks that intersect the causal/window band of the Q block are visited; the per-
 *   element mask runs only on tiles that cross the band's edge or the sequence end.
 * Shared memory: Q [BM][D] | K [2][BN][D] | V [2][BN][D], 16-bit, rows swizzled (flash_common.cuh).
 */
#include "flash_common.cuh"

#if AL_HEAD_DIM == 64
#define AL_DEF_BN 64
#define AL_DEF_WARPS 4
#elif AL_HEAD_DIM == 128
#define AL_DEF_BN 64
#define AL_DEF_WARPS 4
#else
#define AL_DEF_BN 32
#define AL_DEF_WARPS 4
#endif
#ifndef AL_WARPS
#define AL_WARPS AL_DEF_WARPS
#endif
#ifndef AL_BLOCK_M
#define AL_BLOCK_M (16 * AL_WARPS)
#endif
#ifndef AL_BLOCK_N
#define AL_BLOCK_N AL_DEF_BN
#endif
#ifndef AL_Q_IN_REGS
#define AL_Q_IN_REGS (AL_HEAD_DIM <= 128)
#endif

namespace fwd {
constexpr int D = AL_HEAD_DIM;
constexpr int BM = AL_BLOCK_M;
constexpr int BN = AL_BLOCK_N;
constexpr int NW = AL_WARPS;
constexpr int NT = NW * 32;
constexpr int CPR = D / 8;            /* 16-byte chunks per row */
constexpr int KS = D / 16;            /* k16 steps over the head dim */
constexpr int NT8 = BN / 8;           /* n8 tiles of S */
constexpr int DT8 = D / 8;            /* n8 tiles of O */
constexpr int Q_BYTES = BM * D * 2;
constexpr int KV_BYTES = BN * D * 2;
static_assert(BM == 16 * NW, "each warp owns 16 query rows");
static_assert(BN % 16 == 0 && BN >= 16, "BLOCK_N must be a multiple of 16");
}  // namespace fwd

/* dynamic shared memory: Q_BYTES + 4 * KV_BYTES (the host computes the same; see attn_flash.cu) */
extern "C" __global__ void __launch_bounds__(fwd::NT) al_flash_fwd(AL_KPARAMS p) {
    using namespace fwd;
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int m_block = blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (p.H / p.HG);
    const al_fl_seq s = al_fl_seq_make(p, b, h);
    const int m0 = m_block * BM;
    const long long q_start = p.q_start ? p.q_start[b] : 0;
    const long long kv_start = p.kv_start ? p.kv_start[b] : 0;
    float *lse_row = p.lse + ((long long)b * p.H + h) * p.SQ;

    /* rows of this warp: r0 = m0 + warp*16 + g and r0 + 8 */
    const int r0 = m0 + warp * 16 + g;

    if (m0 >= s.q_len) {     /* past the sequence: lse = -inf (out was zero-filled by the host) */
        for (int i = m0 + tid; i < m0 + BM && i < p.SQ; i += NT) lse_row[i] = AL_NEG_INF;
        return;
    }

    /* the KV range that the band of rows [m0, m_last] can see */
    const int m_last = min(m0 + BM, s.q_len) - 1;
    int n_lo = 0, n_hi = s.kv_len;
#if AL_MASK_KIND != 0
    if (s.wl >= 0) n_lo = max(0, m0 + s.diag - s.wl);
    if (s.wr >= 0) n_hi = min(s.kv_len, m_last + s.diag + s.wr + 1);
#endif
    const int nb_lo = n_lo / BN;
    const int nb_hi = n_hi > n_lo ? (n_hi + BN - 1) / BN : nb_lo;   /* exclusive */
#if AL_BLOCK_MASK
    /* visit only the tiles whose block is not 0: nb_first, then next_tile(nb) (uniform per CTA) */
    auto next_tile = [&](int nb) {
        for (nb++; nb < nb_hi && al_fl_block(p, b, h, m0, nb * BN) == 0; nb++) {}
        return nb;
    };
    const int nb_first = next_tile(nb_lo - 1);
#else
    const int nb_first = nb_lo;
#endif

    const al_u32 sQ = al_smem_addr(smem);
    const al_u32 sK = sQ + Q_BYTES;
    const al_u32 sV = sK + 2 * KV_BYTES;
    const al_u16 *gQ = (const al_u16 *)p.q.ptr + b * p.q.sb + (q_start + m0) * p.q.st + (long long)h * p.q.sh;
    const al_u16 *gK = (const al_u16 *)p.k.ptr + b * p.k.sb + kv_start * p.k.st + (long long)hk * p.k.sh;
    const al_u16 *gV = (const al_u16 *)p.v.ptr + b * p.v.sb + kv_start * p.v.st + (long long)hk * p.v.sh;

    /* prologue: Q, K(nb_first), V(nb_first) as three commit groups */
    al_load_tile<BM, NT>(sQ, gQ, p.q.st, s.q_len - m0, tid);
    al_cp_commit();
    if (nb_first < nb_hi) {
        const int n0 = nb_first * BN;
        al_load_tile<BN, NT>(sK, gK + n0 * p.k.st, p.k.st, s.kv_len - n0, tid);
        al_cp_commit();
        al_load_tile<BN, NT>(sV, gV + n0 * p.v.st, p.v.st, s.kv_len - n0, tid);
        al_cp_commit();
    } else {
        al_cp_commit();
        al_cp_commit();
    }

    float o[DT8][4];
#pragma unroll
    for (int t = 0; t < DT8; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float m_run[2] = {AL_NEG_INF, AL_NEG_INF};
    float l_run[2] = {0.0f, 0.0f};
    const float slope_log2 = p.alibi ? p.alibi[b * p.H + h] * AL_LOG2E : 0.0f;
    (void)slope_log2;

#if AL_Q_IN_REGS
    al_u32 qf[KS][4];
#endif
    /* ldmatrix lane addressing (see flash_common.cuh): A operands (Q rows): row lane%16, chunk +lane/16;
     * B operands from [n][k] storage (K): row (lane%8) + (lane/16)*8, chunk +(lane/8)%2;
     * B operands from [k][n] storage with .trans (V): row (lane%8) + ((lane/8)%2)*8, chunk +lane/16 */
    const int a_row = warp * 16 + (lane & 15), a_ch = lane >> 4;
    const int bk_row = (lane & 7) + ((lane >> 4) << 3), bk_ch = (lane >> 3) & 1;
    const int bv_row = (lane & 7) + (((lane >> 3) & 1) << 3), bv_ch = lane >> 4;

#if AL_BLOCK_MASK
    int it = 0;
    for (int nb = nb_first, nb_next; nb < nb_hi; nb = nb_next, it++) {
        nb_next = next_tile(nb);
        const int bmv = al_fl_block(p, b, h, m0, nb * BN);   /* 1 or 2 here */
        const int stage = it & 1;
        const int n0 = nb * BN;
        if (it > 0) __syncthreads();       /* every warp is done with the other stage's buffers */
        if (nb_next < nb_hi) {
            const int n1 = nb_next * BN;
#else
    /* (the default specialisations: kept textually as before the block mask, so their code is unchanged) */
    for (int nb = nb_lo; nb < nb_hi; nb++) {
        const int stage = (nb - nb_lo) & 1;
        const int n0 = nb * BN;
        if (nb > nb_lo) __syncthreads();   /* every warp is done with the other stage's buffers */
        if (nb + 1 < nb_hi) {
            const int n1 = n0 + BN;
#endif
            al_load_tile<BN, NT>(sK + (stage ^ 1) * KV_BYTES, gK + n1 * p.k.st, p.k.st, s.kv_len - n1, tid);
            al_cp_commit();
            al_load_tile<BN, NT>(sV + (stage ^ 1) * KV_BYTES, gV + n1 * p.v.st, p.v.st, s.kv_len - n1, tid);
            al_cp_commit();
        } else {
            al_cp_commit();
            al_cp_commit();
        }
        al_cp_wait<3>();                   /* Q and K(nb) have landed (V(nb), K/V(nb+1) may be in flight) */
        __syncthreads();
        const al_u32 kbuf = sK + stage * KV_BYTES, vbuf = sV + stage * KV_BYTES;

#if AL_Q_IN_REGS
#if AL_BLOCK_MASK
        if (it == 0) {
#else
        if (nb == nb_lo) {
#endif
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
                al_ldsm_x4(sQ + al_swz<CPR>(a_row, ks * 2 + a_ch), qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3]);
        }
#endif
        /* S = Q K^T */
        float sc[NT8][4];
#pragma unroll
        for (int t = 0; t < NT8; t++) sc[t][0] = sc[t][1] = sc[t][2] = sc[t][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
#if AL_Q_IN_REGS
            const al_u32 *a = qf[ks];
#else
            al_u32 a[4];
            al_ldsm_x4(sQ + al_swz<CPR>(a_row, ks * 2 + a_ch), a[0], a[1], a[2], a[3]);
#endif
#pragma unroll
            for (int np = 0; np < BN / 16; np++) {
                al_u32 b0, b1, b2, b3;
                al_ldsm_x4(kbuf + al_swz<CPR>(np * 16 + bk_row, ks * 2 + bk_ch), b0, b1, b2, b3);
                al_mma(sc[2 * np], a, b0, b1);
                al_mma(sc[2 * np + 1], a, b2, b3);
            }
        }

        /* logits (log2 units), mask, online softmax */
#if AL_BLOCK_MASK
        const int mod_on = bmv == 1;       /* a full block (2) skips mask_mod */
#else
        const int mod_on = 1;
#endif
        int need_mask = (AL_HAS_MASK_MOD && mod_on) || n0 + BN > s.kv_len;
#if AL_MASK_KIND != 0
        if (s.wr >= 0) need_mask |= n0 + BN - 1 > m0 + s.diag + s.wr;
        if (s.wl >= 0) need_mask |= n0 < m0 + BM - 1 + s.diag - s.wl;
#endif
        float mx[2] = {AL_NEG_INF, AL_NEG_INF};
#pragma unroll
        for (int t = 0; t < NT8; t++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = r0 + ((e >> 1) << 3);
                const int j = n0 + t * 8 + tq * 2 + (e & 1);
                float x = al_fl_logit2(s, sc[t][e], p.scale, p.scale_log2, slope_log2, i, j);
                if (need_mask && !al_fl_valid(s, i, j, mod_on)) x = AL_NEG_INF;
                sc[t][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        }
        float corr[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float m_new = fmaxf(m_run[r], mx[r]);
            base[r] = m_new == AL_NEG_INF ? 0.0f : m_new;   /* a row with nothing visible yet */
            corr[r] = al_ex2(m_run[r] - base[r]);            /* ex2(-inf) = 0 */
            m_run[r] = m_new;
            l_run[r] *= corr[r];
        }
#pragma unroll
        for (int t = 0; t < DT8; t++) {
            o[t][0] *= corr[0];
            o[t][1] *= corr[0];
            o[t][2] *= corr[1];
            o[t][3] *= corr[1];
        }
        al_u32 pa[BN / 16][4];
#pragma unroll
        for (int t = 0; t < NT8; t++) {
            const float p0 = al_ex2(sc[t][0] - base[0]), p1 = al_ex2(sc[t][1] - base[0]);
            const float p2 = al_ex2(sc[t][2] - base[1]), p3 = al_ex2(sc[t][3] - base[1]);
            l_run[0] += p0 + p1;
            l_run[1] += p2 + p3;
            pa[t >> 1][(t & 1) * 2 + 0] = al_pack2(p0, p1);
            pa[t >> 1][(t & 1) * 2 + 1] = al_pack2(p2, p3);
        }

        /* O += P V */
        al_cp_wait<2>();                   /* V(nb) has landed */
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                al_u32 b0, b1, b2, b3;
                al_ldsm_x4_t(vbuf + al_swz<CPR>(kk * 16 + bv_row, dp * 2 + bv_ch), b0, b1, b2, b3);
                al_mma(o[2 * dp], pa[kk], b0, b1);
                al_mma(o[2 * dp + 1], pa[kk], b2, b3);
            }
        }
    }
    al_cp_wait<0>();

    /* epilogue: O / l, LSE */
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
        inv[r] = l_run[r] > 0.0f ? 1.0f / l_run[r] : 0.0f;
    }
    al_u16 *gO = (al_u16 *)p.o.ptr + b * p.o.sb + q_start * p.o.st + (long long)h * p.o.sh;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = r0 + r * 8;
        if (i >= p.SQ) continue;
        if (i >= s.q_len) {
            if (tq == 0) lse_row[i] = AL_NEG_INF;
            continue;
        }
        al_u16 *orow = gO + (long long)i * p.o.st;
#pragma unroll
        for (int t = 0; t < DT8; t++)
            *(al_u32 *)(orow + t * 8 + tq * 2) = al_pack2(o[t][2 * r] * inv[r], o[t][2 * r + 1] * inv[r]);
        if (tq == 0)
            lse_row[i] = l_run[r] > 0.0f ? (m_run[r] + __log2f(l_run[r])) * AL_LN2 : AL_NEG_INF;
    }
}
