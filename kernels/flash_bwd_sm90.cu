/*
 * kernels/flash_bwd_sm90.cu — Hopper (sm_90a) backward for the `flash` backend: wgmma + TMA + mbarriers +
 * warp specialisation, in two kernels built from the forward's patterns (kernels/flash_fwd_sm90.cu)
 * only: SS products with both operands K-major in shared memory (as S = Q K^T) and RS products with A
 * from registers and B MN-major (as O += P V). The stage-1 pre kernel (al_flash_bwd_pre, flash_bwd.cu)
 * runs first and provides lse2 = lse log2(e) (+inf for empty rows) and D = rowsum(dO * O) per query row.
 *
 *   AL_SM90_ROLE 0  al_flash_bwd_sm90_dkdv: a CTA owns R = 64 * CONSUMERS key rows of one kv head and
 *                   streams the (query tile, query head of its GQA group) pairs the mask lets see them:
 *                     S^T = K Q^T, P^T = exp2(S^T scale log2e - lse2), dV += P^T dO,
 *                     dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q
 *                   and writes dK * scale and dV (zeros for rows past the sequence in dense formats).
 *   AL_SM90_ROLE 1  al_flash_bwd_sm90_dq: a CTA owns R query rows of one head and streams key tiles:
 *                     S = Q K^T, P = exp2(S scale log2e - lse2), dP = dO V^T, dS = P (dP - D),
 *                     dQ += dS K
 *                   and writes dQ * scale. Recomputing S and dP here costs two GEMMs (7 instead of 5)
 *                   but needs no dQ atomics and no transposed operand: the backward is deterministic.
 *
 * Variants (-D): AL_HEAD_DIM 64 | 128, AL_BF16, AL_MASK_KIND, AL_BOTTOM_RIGHT, AL_SM90_ROLE,
 * AL_SM90_BN (stream rows per tile, 64), AL_SM90_STAGES, AL_SM90_CONSUMERS. Not here: d = 256, ALiBi,
 * score/mask hooks (the stage-1 backward serves those).
 * Kernel arguments: the al_flash_params and four TMA maps (src/cuda/flash_sm90_tma.h): own0, own1 (the
 * owned rows, boxes of R rows: K, V for role 0; Q, dO for role 1) and st0, st1 (the streamed tiles,
 * boxes of BN rows: Q, dO for role 0; K, V for role 1).
 * Shared memory (1024-byte aligned): own0 [D/64][R][64] | own1 | st0 [ST][D/64][BN][64] | st1 | mbarriers.
 * Status: written in a session without GPU time; opt-in (ATTNLAB_FLASH_SM90_BWD=1) until checked.
 */
#include "flash_common.cuh"
#include "sm90_common.cuh"

#if AL_ALIBI || AL_HAS_SCORE_MOD || AL_HAS_MASK_MOD || AL_HEAD_DIM > 128
#error "flash_bwd_sm90.cu: d <= 128 without ALiBi or hooks (the stage-1 backward serves the rest)"
#endif
#ifndef AL_SM90_ROLE
#define AL_SM90_ROLE 0
#endif
#ifndef AL_SM90_BN
#define AL_SM90_BN 64
#endif
#ifndef AL_SM90_STAGES
#define AL_SM90_STAGES 2
#endif
#ifndef AL_SM90_CONSUMERS
#define AL_SM90_CONSUMERS 2
#endif

namespace b90 {
constexpr int D = AL_HEAD_DIM;
constexpr int BN = AL_SM90_BN;
constexpr int ST = AL_SM90_STAGES;
constexpr int NC = AL_SM90_CONSUMERS;
constexpr int R = 64 * NC;                    /* owned rows per CTA */
constexpr int NT = 128 * (1 + NC);
constexpr int BOXES = D / 64;
constexpr int OWN_BYTES = R * D * 2;
constexpr int ST_BYTES = BN * D * 2;
constexpr int PRODUCER_REGS = 56;
constexpr int CONSUMER_REGS = 224;
static_assert(BN == 64, "the S/dP products use the m64n64 wrappers");
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * NC <= 65536, "register file");
}  // namespace b90

#if AL_HEAD_DIM == 64
#define AL_WG_RS_D al_wgmma_rs_n64_tb
#define AL_WG_FENCE_D al_wg_fence_regs_n64
#else
#define AL_WG_RS_D al_wgmma_rs_n128_tb
#define AL_WG_FENCE_D al_wg_fence_regs_n128
#endif

struct al_sm90_bwd_tmaps {
    al_sm90_tmap own0, own1, st0, st1;
};

/* element-wise product of two packed 16-bit pairs, rounded once (sm_90: bf16x2 and f16x2 multiplies) */
AL_DEV al_u32 b90_mul2(al_u32 a, al_u32 b) {
    al_u32 r;
#if AL_BF16
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
#else
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
#endif
    return r;
}

/* acc[64 x 64] = A (owned rows of this warpgroup, K-major) * B^T (streamed tile, K-major), over D */
AL_DEV void b90_ss(float *acc, al_u32 own, al_u32 tile) {
    using namespace b90;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const al_u64 da = al_desc_sw128(own + (ks >> 2) * (R * 128) + (ks & 3) * 32, 16, 1024);
        const al_u64 db = al_desc_sw128(tile + (ks >> 2) * (BN * 128) + (ks & 3) * 32, 16, 1024);
        al_wgmma_ss_n64(acc, da, db, ks > 0);
    }
}

/* acc[64 x D] += A (16-bit fragments of a 64 x BN accumulator) * tile (BN x D, MN-major) */
AL_DEV void b90_rs(float *acc, const al_u32 (*pa)[4], al_u32 tile) {
    using namespace b90;
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) AL_WG_RS_D(acc, pa[kk], al_desc_sw128(tile + kk * (16 * 128), BN * 128, 1024));
}

#if AL_SM90_ROLE == 0
#define B90_NAME al_flash_bwd_sm90_dkdv
#else
#define B90_NAME al_flash_bwd_sm90_dq
#endif

extern "C" __global__ void __launch_bounds__(b90::NT, 1)
    B90_NAME(const __grid_constant__ al_flash_params p, const __grid_constant__ al_sm90_bwd_tmaps tm) {
    using namespace b90;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    const int b = blockIdx.z;
    const int group = p.H / p.HG;
    const long long q_start = p.q_start ? p.q_start[b] : 0;
    const long long kv_start = p.kv_start ? p.kv_start[b] : 0;
#if AL_SM90_ROLE == 0
    const int hk = blockIdx.y;                       /* kv head; the stream visits its q heads */
    const al_fl_seq s = al_fl_seq_make(p, b, hk * group);
    const int own0 = blockIdx.x * R;                 /* first owned key row */
    if (own0 >= p.SKV) return;
    /* queries that can see keys [own0, own_last] (the band's rule solved for i) */
    const int own_last = min(own0 + R, s.kv_len) - 1;
    int i_lo = 0, i_hi = own0 < s.kv_len ? s.q_len : 0;
#if AL_MASK_KIND != 0
    if (s.wr >= 0) i_lo = max(0, own0 - s.diag - s.wr);
    if (s.wl >= 0) i_hi = min(i_hi, own_last - s.diag + s.wl + 1);
#endif
    const int t_lo = i_lo / BN;
    const int ntile = i_hi > i_lo ? (i_hi + BN - 1) / BN - t_lo : 0;
    const int nstream = ntile * group;               /* (q head in group, query tile) pairs */
#else
    const int h = blockIdx.y, hk = h / group;
    const al_fl_seq s = al_fl_seq_make(p, b, h);
    const int own0 = blockIdx.x * R;                 /* first owned query row */
    if (own0 >= p.SQ) return;
    const int own_last = min(own0 + R, s.q_len) - 1;
    int n_lo = 0, n_hi = own0 < s.q_len ? s.kv_len : 0;
#if AL_MASK_KIND != 0
    if (s.wl >= 0) n_lo = max(0, own0 + s.diag - s.wl);
    if (s.wr >= 0) n_hi = min(n_hi, own_last + s.diag + s.wr + 1);
#endif
    const int t_lo = n_lo / BN;
    const int nstream = n_hi > n_lo ? (n_hi + BN - 1) / BN - t_lo : 0;
#endif

    const al_u32 base = (al_smem_addr(smem_raw) + 1023u) & ~1023u;
    const al_u32 sO0 = base, sO1 = sO0 + OWN_BYTES;
    const al_u32 sS0 = sO1 + OWN_BYTES, sS1 = sS0 + ST * ST_BYTES;
    const al_u32 sBar = sS1 + ST * ST_BYTES;
    const al_u32 bar_own = sBar;
#define BAR_F(i) (sBar + 8u * (1 + (i)))
#define BAR_E(i) (sBar + 8u * (1 + ST + (i)))
    if (tid == 0) {
        al_mbar_init(bar_own, 1);
        for (int i = 0; i < ST; i++) {
            al_mbar_init(BAR_F(i), 1);
            al_mbar_init(BAR_E(i), 4 * NC);   /* lane 0 of every consumer warp */
        }
        al_mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        /* ---------------- producer: one warp ---------------- */
        al_reg_dealloc<PRODUCER_REGS>();
        const int warp = tid >> 5, lane = tid & 31;
        if (warp != 0 || nstream == 0) return;   /* nothing to stream: the consumers write zeros */
        if (lane == 0) {
            al_tma_prefetch(&tm.own0);
            al_tma_prefetch(&tm.own1);
            al_tma_prefetch(&tm.st0);
            al_tma_prefetch(&tm.st1);
            al_mbar_arrive_tx(bar_own, 2 * OWN_BYTES);
#if AL_SM90_ROLE == 0
            const int ob = p.k.sb ? b : 0, ob1 = p.v.sb ? b : 0, orow = (int)(kv_start + own0), oh = hk;
#else
            const int ob = p.q.sb ? b : 0, ob1 = p.dout.sb ? b : 0, orow = (int)(q_start + own0), oh = h;
#endif
#pragma unroll
            for (int x = 0; x < BOXES; x++) {
                al_tma_load_4d(sO0 + x * (R * 128), &tm.own0, bar_own, x * 64, orow, oh, ob);
                al_tma_load_4d(sO1 + x * (R * 128), &tm.own1, bar_own, x * 64, orow, oh, ob1);
            }
        }
        for (int j = 0; j < nstream; j++) {
            const int stg = j % ST, ph = (j / ST) & 1;
#if AL_SM90_ROLE == 0
            const int hq = hk * group + j / ntile;                 /* the q head of this tile */
            const int r0 = (t_lo + j % ntile) * BN;                /* its first query row */
            const int len = s.q_len, b0 = p.q.sb ? b : 0, b1 = p.dout.sb ? b : 0, th = hq;
            const long long rs = q_start;
#define B90_OP0 p.q
#define B90_OP1 p.dout
#else
            const int r0 = (t_lo + j) * BN;                        /* first key row */
            const int len = s.kv_len, b0 = p.k.sb ? b : 0, b1 = p.v.sb ? b : 0, th = hk;
            const long long rs = kv_start;
#define B90_OP0 p.k
#define B90_OP1 p.v
#endif
            const al_u32 d0 = sS0 + stg * ST_BYTES, d1 = sS1 + stg * ST_BYTES;
            al_mbar_wait(BAR_E(stg), ph ^ 1);
            if (r0 + BN <= len) {
                if (lane == 0) {
                    al_mbar_arrive_tx(BAR_F(stg), 2 * ST_BYTES);
#pragma unroll
                    for (int x = 0; x < BOXES; x++) {
                        al_tma_load_4d(d0 + x * (BN * 128), &tm.st0, BAR_F(stg), x * 64, (int)(rs + r0), th, b0);
                        al_tma_load_4d(d1 + x * (BN * 128), &tm.st1, BAR_F(stg), x * 64, (int)(rs + r0), th, b1);
                    }
                }
            } else {
                const al_u16 *g0 = (const al_u16 *)B90_OP0.ptr + b * B90_OP0.sb + (rs + r0) * B90_OP0.st +
                                   (long long)th * B90_OP0.sh;
                const al_u16 *g1 = (const al_u16 *)B90_OP1.ptr + b * B90_OP1.sb + (rs + r0) * B90_OP1.st +
                                   (long long)th * B90_OP1.sh;
                al_sm90_copy_partial<BN, D>(d0, g0, B90_OP0.st, len - r0, lane);
                al_sm90_copy_partial<BN, D>(d1, g1, B90_OP1.st, len - r0, lane);
                if (lane == 0) al_mbar_arrive(BAR_F(stg));
            }
        }
        return;
    }
#undef B90_OP0
#undef B90_OP1

    /* ---------------- consumers ---------------- */
    al_reg_alloc<CONSUMER_REGS>();
    const int cw = wg - 1;
    const int wq = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int rl = cw * 64 + wq * 16 + g;            /* this thread's owned rows: own0 + rl and + 8 */
    const al_u32 a0 = sO0 + cw * (64 * 128), a1 = sO1 + cw * (64 * 128);
    const float sl2 = p.scale_log2;

    float acc0[D / 2];                               /* role 0: dV; role 1: dQ */
#pragma unroll
    for (int i = 0; i < D / 2; i++) acc0[i] = 0.0f;
#if AL_SM90_ROLE == 0
    float acc1[D / 2];                               /* role 0: dK */
#pragma unroll
    for (int i = 0; i < D / 2; i++) acc1[i] = 0.0f;
#endif
#if AL_SM90_ROLE == 1
    /* the two rows' lse2 and D (rows past the sequence: lse2 = +inf, so P = 0) */
    float lr[2], dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = own0 + rl + 8 * r;
        const long long o = ((long long)b * p.H + h) * p.SQ + i;
        lr[r] = i < s.q_len ? p.lse2[o] : AL_POS_INF;
        dr[r] = i < s.q_len ? p.dsum[o] : 0.0f;
    }
#endif
    if (nstream > 0) al_mbar_wait(bar_own, 0);
    for (int j = 0; j < nstream; j++) {
        const int stg = j % ST, ph = (j / ST) & 1;
        const al_u32 t0 = sS0 + stg * ST_BYTES, t1 = sS1 + stg * ST_BYTES;
#if AL_SM90_ROLE == 0
        const int hq = hk * group + j / ntile;
        const int c0 = (t_lo + j % ntile) * BN;      /* first query column of the tile */
        const long long lrow = ((long long)b * p.H + hq) * p.SQ;
#else
        const int c0 = (t_lo + j) * BN;              /* first key column */
#endif
        al_mbar_wait(BAR_F(stg), ph);
        /* 1. S (role 0: S^T = K Q^T) */
        float sc[BN / 2];
        al_wg_fence();
        b90_ss(sc, a0, t0);
        al_wg_commit();
        al_wg_wait<0>();
        al_wg_fence_regs_n64(sc);

        /* 2. P (P^T), packed to 16 bits at once (the f32 S dies here: register pressure). Element e of n8
         * tile t is (owned row rl + 8 (e >> 1), column c0 + 8 t + 2 tq + (e & 1)). */
        al_u32 pa[BN / 16][4];
#if AL_SM90_ROLE == 0
        float ddc[BN / 8][2];                        /* D of this thread's query columns, for step 4 */
#endif
#pragma unroll
        for (int t = 0; t < BN / 8; t++) {
            float pe[4];
#if AL_SM90_ROLE == 0
            float l2c[2];
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int i = c0 + t * 8 + tq * 2 + c;
                const int in = i < s.q_len;
                l2c[c] = in ? __ldg(p.lse2 + lrow + i) : AL_POS_INF;
                ddc[t][c] = in ? __ldg(p.dsum + lrow + i) : 0.0f;
            }
#endif
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int orow = own0 + rl + ((e >> 1) << 3), col = c0 + t * 8 + tq * 2 + (e & 1);
#if AL_SM90_ROLE == 0
                const int ok = col < s.q_len && orow < s.kv_len && al_fl_valid(s, col, orow);
                const float l2 = l2c[e & 1];
#else
                const int ok = orow < s.q_len && al_fl_valid(s, orow, col);
                const float l2 = lr[e >> 1];
#endif
                pe[e] = ok ? al_ex2(fmaf(sc[t * 4 + e], sl2, -l2)) : 0.0f;
            }
            pa[t >> 1][(t & 1) * 2 + 0] = al_pack2(pe[0], pe[1]);
            pa[t >> 1][(t & 1) * 2 + 1] = al_pack2(pe[2], pe[3]);
        }

        /* 3. dP (role 0: dP^T = V dO^T), and role 0's dV += P^T dO in the same batch */
        float dp[BN / 2];
        al_wg_fence();
        b90_ss(dp, a1, t1);
#if AL_SM90_ROLE == 0
        b90_rs(acc0, pa, t1);
#endif
        al_wg_commit();
        al_wg_wait<0>();
        al_wg_fence_regs_n64(dp);
#if AL_SM90_ROLE == 0
        AL_WG_FENCE_D(acc0);
#endif

        /* 4. dS = P (dP - D) in 16-bit pairs: the packed P times the packed (dP - D) (the f32 P died in
         * step 2 to save registers; dS is rounded to 16 bits for its product anyway) */
        al_u32 da[BN / 16][4];
#pragma unroll
        for (int t = 0; t < BN / 8; t++)
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++) {         /* h2: row rl (0) or rl + 8 (1) */
#if AL_SM90_ROLE == 0
                const float d0 = ddc[t][0], d1 = ddc[t][1];
#else
                const float d0 = dr[h2], d1 = dr[h2];
#endif
                const al_u32 g2 = al_pack2(dp[t * 4 + 2 * h2] - d0, dp[t * 4 + 2 * h2 + 1] - d1);
                da[t >> 1][(t & 1) * 2 + h2] = b90_mul2(pa[t >> 1][(t & 1) * 2 + h2], g2);
            }
        al_wg_fence_u32<4 * (BN / 16)>(&pa[0][0]);

        /* 5. role 0: dK += dS^T Q; role 1: dQ += dS K */
        al_wg_fence();
#if AL_SM90_ROLE == 0
        b90_rs(acc1, da, t0);
#else
        b90_rs(acc0, da, t0);
#endif
        al_wg_commit();
        al_wg_wait<0>();
#if AL_SM90_ROLE == 0
        AL_WG_FENCE_D(acc1);
#else
        AL_WG_FENCE_D(acc0);
#endif
        al_wg_fence_u32<4 * (BN / 16)>(&da[0][0]);
        if (lane == 0) al_mbar_arrive(BAR_E(stg));
    }

    /* epilogue: through the caller's strides and dtype (dense rows past the sequence: zeros) */
    const float scale = p.scale;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = own0 + rl + 8 * r;
#if AL_SM90_ROLE == 0
        if (row >= p.SKV || (p.k.sb == 0 && row >= s.kv_len)) continue;   /* thd: gaps were zero-filled */
        const int ok = row < s.kv_len;
        const long long ko = b * p.dk.sb + (kv_start + row) * p.dk.st + (long long)hk * p.dk.sh;
        const long long vo = b * p.dv.sb + (kv_start + row) * p.dv.st + (long long)hk * p.dv.sh;
#pragma unroll
        for (int t = 0; t < D / 8; t++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = t * 8 + tq * 2 + e;
                al_st_elem(p.dk.ptr, p.dk.dtype, ko + d * p.dk.sc, ok ? acc1[t * 4 + 2 * r + e] * scale : 0.0f);
                al_st_elem(p.dv.ptr, p.dv.dtype, vo + d * p.dv.sc, ok ? acc0[t * 4 + 2 * r + e] : 0.0f);
            }
#else
        if (row >= p.SQ || (p.q.sb == 0 && row >= s.q_len)) continue;
        const int ok = row < s.q_len;
        const long long qo = b * p.dq.sb + (q_start + row) * p.dq.st + (long long)h * p.dq.sh;
#pragma unroll
        for (int t = 0; t < D / 8; t++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = t * 8 + tq * 2 + e;
                al_st_elem(p.dq.ptr, p.dq.dtype, qo + d * p.dq.sc, ok ? acc0[t * 4 + 2 * r + e] * scale : 0.0f);
            }
#endif
    }
#undef BAR_F
#undef BAR_E
}
