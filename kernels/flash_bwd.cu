/*
 * kernels/flash_bwd.cu — FlashAttention-2-class backward for the `flash` backend (src/cuda/attn_flash.cu),
 * compiled at run time by NVRTC (src/cuda/nvrtc_cache.cu) for the device's architecture and cached.
 *
 * Three kernels in one module (one specialisation = one compile):
 *   al_flash_bwd_pre   d/8 lanes per query row (b, h, i): D_i = sum_d dO*O (f32, out/dout through any
 *                      strides and dtypes), lse2_i = lse_i * log2(e) (+inf for an empty or padded row,
 *                      so that exp2(s - lse2) = 0 there), and zeroes the row's dQ accumulators.
 *   al_flash_bwd       grid (KV blocks | splits, HG, B). A CTA owns one KV block of one kv head and
 *                      loops over the query heads of its GQA group and over the Q blocks that the
 *                      causal/window band lets see it:
 *                        S^T = K Q^T, dP^T = V dO^T         (each warp: 16 kv rows x BM q columns)
 *                        P^T = exp2(S^T scale log2e - lse2), dS^T = P^T (dP^T - D)
 *                        dV += P^T dO, dK += dS^T Q          (registers, whole KV loop: no atomics)
 *                        dQ += dS K                          (dS^T through shared memory; f32 atomics
 *                                                              into dq_acc, or per-split plain adds)
 *                      then writes dK * scale and dV through the caller's real strides and dtype
 *                      (rows past the sequence are written as zeros in dense formats).
 *   al_flash_bwd_dq    dq = scale * sum over splits of dq_acc, in split order, through dq's strides.
 *
 * Deterministic mode (params.deterministic): the grid's x extent is nsplit (<= the number of KV blocks);
 * CTA x handles KV blocks x, x + nsplit, ... in order and accumulates its dQ contributions into its own
 * buffer dq_acc[x] with plain read-add-write (one thread owns each element), so every sum happens in a
 * fixed order; al_flash_bwd_dq adds the buffers in split order. Memory: nsplit * B*H*SQ*D f32.
 * Otherwise nsplit = 1 and every KV block's CTA adds into dq_acc[0] with atomicAdd.
 *
 * Variants: the -D defines of kernels/flash_fwd.cu (AL_HEAD_DIM, AL_BF16, AL_MASK_KIND,
 * AL_BOTTOM_RIGHT, AL_ALIBI, hooks, AL_VARIANT, AL_BLOCK_MASK) plus AL_BWD_BLOCK_M / AL_BWD_BLOCK_N.
 * With a block mask, (Q tile, KV tile) pairs whose block is 0 are skipped and mask_mod runs only in
 * partial (1) blocks; AL_CAPTURE_GRAD runs for every kept element with grad = dS (before score_grad;
 * f32 atomics, so capture gradients are not bit-reproducible even in deterministic mode).
 * Warps: (BLOCK_N / 16) * WS where WS = 2 for d = 256 (two warps share 16 kv rows and split dK/dV along d: each recomputes
 * S^T and dP^T), else 1.
 * Bench: luajit bench/flash_bench.lua (ATTNLAB_FLASH_SM90_BWD=0 for this backward on sm_90); the pre pass is also
 * checked and timed on its own by tests/cuda/flash_sm90_bwd_check.cu.
 * Shared memory: K [BN][D] | V [BN][D] | Q [BM][D] | dO [BM][D] | dS^T [BN][BM] (16-bit, swizzled)
 *                | lse2 [BM] | D [BM] (f32).
 */
#define AL_FL_BACKWARD 1   /* flash_common.cuh: score_mod and its gradient in the same terms, to share work */
#include "flash_common.cuh"

#ifndef AL_BWD_BLOCK_N
#define AL_BWD_BLOCK_N 64
#endif
#ifndef AL_BWD_BLOCK_M
#define AL_BWD_BLOCK_M 32   /* 64 spills 400+ bytes at d=128 (ptxas, sm_90a) */
#endif

namespace bwd {
constexpr int D = AL_HEAD_DIM;
constexpr int BM = AL_BWD_BLOCK_M;
constexpr int BN = AL_BWD_BLOCK_N;
constexpr int WS = D > 128 ? 2 : 1;        /* warps sharing 16 kv rows (split of dK/dV along d) */
constexpr int NW = (BN / 16) * WS;
constexpr int NT = NW * 32;
constexpr int DW = D / WS;                 /* d columns of dK/dV per warp */
constexpr int CPR = D / 8;
constexpr int KS = D / 16;
constexpr int MT8 = BM / 8;                /* n8 tiles of S^T (q columns) */
constexpr int DT8 = DW / 8;                /* n8 tiles of the warp's dK/dV */
constexpr int DS_CPR = BM / 8;             /* chunks per dS^T row */
constexpr int QG = BM / 16;                /* warp groups over dQ rows */
constexpr int DQ_PARTS = NW / QG;          /* dQ column parts */
constexpr int DQW = D / DQ_PARTS;          /* dQ columns per warp */
constexpr int DQ_CHUNK = DQW < 32 ? DQW : 32;  /* dQ accumulator columns at a time (registers) */
constexpr int KV_BYTES = BN * D * 2;
constexpr int Q_BYTES = BM * D * 2;
constexpr int DS_BYTES = BN * BM * 2;
static_assert(BM % 16 == 0 && BN % 16 == 0, "block sizes must be multiples of 16");
static_assert(DS_CPR == 4 || DS_CPR >= 8, "dS^T rows: 4 or >= 8 chunks (al_swz)");
static_assert(NW % QG == 0, "dQ warp split");
}  // namespace bwd

/* ---- preprocessing --------------------------------------------------------------------------------- */
/* AL_PRE_LANES lanes per query row (8 at d = 64, 16 at 128, 32 at 256), each owning 8 consecutive columns:
 * a row of O and dO in the kernel's 16-bit dtype with unit column stride and 16-byte-aligned rows (the usual
 * case) is read as one 16-byte load per lane of each; any other dtype or stride goes through al_ld_elem.
 * The first version (one warp per row, 2-byte al_ld_elem loads) took 195 us at 4x16x4096x128 bf16 (135 MB
 * read: 0.69 TB/s, ~360 instructions per row; ncu, session 14): 6% of the no-mask backward, 10% of the
 * causal one. */
#define AL_PRE_LANES (AL_HEAD_DIM / 8)
static_assert(AL_PRE_LANES == 8 || AL_PRE_LANES == 16 || AL_PRE_LANES == 32, "pre pass: 8 columns per lane");

/* sum over the 8 column pairs' products of one 16-byte chunk of O and dO (kernel dtype) */
AL_DEV float al_pre_dot8(uint4 a, uint4 g) {
    const al_u32 av[4] = {a.x, a.y, a.z, a.w}, gv[4] = {g.x, g.y, g.z, g.w};
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
#if AL_BF16
        s = fmaf(__uint_as_float(av[k] << 16), __uint_as_float(gv[k] << 16), s);
        s = fmaf(__uint_as_float(av[k] & 0xffff0000u), __uint_as_float(gv[k] & 0xffff0000u), s);
#else
        s = fmaf(al_f16_to_f32((al_u16)(av[k] & 0xffffu)), al_f16_to_f32((al_u16)(gv[k] & 0xffffu)), s);
        s = fmaf(al_f16_to_f32((al_u16)(av[k] >> 16)), al_f16_to_f32((al_u16)(gv[k] >> 16)), s);
#endif
    }
    return s;
}

extern "C" __global__ void __launch_bounds__(256) al_flash_bwd_pre(AL_KPARAMS p) {
    constexpr int G = AL_PRE_LANES;
    const long long tg = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int c = threadIdx.x & (G - 1);                 /* this lane's chunk: columns [8c, 8c + 8) */
    const long long rows = (long long)p.B * p.H * p.SQ;
    const int live = tg / G < rows;                      /* dead lanes still join the shuffles */
    const int row = live ? (int)(tg / G) : 0;            /* rows * D * 2 bytes fit in memory: row < 2^31 */
    const int i = row % p.SQ;
    const int bh = row / p.SQ;
    const int b = bh / p.H, h = bh % p.H;
    const int q_len = p.q_len ? (int)p.q_len[b] : p.SQ;
    const long long q_start = p.q_start ? p.q_start[b] : 0;
    float dsum = 0.0f;
    if (live && i < q_len) {
        const long long oo = b * p.o.sb + (q_start + i) * p.o.st + (long long)h * p.o.sh;
        const long long go = b * p.dout.sb + (q_start + i) * p.dout.st + (long long)h * p.dout.sh;
        const int kdt = AL_BF16 ? AL_FLASH_DT_BF16 : AL_FLASH_DT_F16;
        const al_u16 *po = (const al_u16 *)p.o.ptr + oo, *pg = (const al_u16 *)p.dout.ptr + go;
        if (p.o.dtype == kdt && p.dout.dtype == kdt && p.o.sc == 1 && p.dout.sc == 1 &&
            (((unsigned long long)po | (unsigned long long)pg) & 15ull) == 0) {
            dsum = al_pre_dot8(__ldg((const uint4 *)po + c), __ldg((const uint4 *)pg + c));
        } else {
            for (int d = c; d < AL_HEAD_DIM; d += G)
                dsum += al_ld_elem(p.o.ptr, p.o.dtype, oo + d * p.o.sc) *
                        al_ld_elem(p.dout.ptr, p.dout.dtype, go + d * p.dout.sc);
        }
    }
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) dsum += __shfl_xor_sync(0xffffffffu, dsum, off);
    if (!live) return;
    if (c == 0) {
        float lse2 = AL_POS_INF;
        if (i < q_len) {
            const long long lo = b * p.lse_sb + h * p.lse_sh + i * p.lse_si;
            const float l = p.lse_dtype == AL_FLASH_DT_F64 ? (float)((const double *)p.lse_in)[lo]
                                                            : ((const float *)p.lse_in)[lo];
            lse2 = l == AL_NEG_INF ? AL_POS_INF : l * AL_LOG2E;
        }
        p.dsum[row] = dsum;
        p.lse2[row] = lse2;
    }
    const long long split = rows * AL_HEAD_DIM;
    for (int sp = 0; sp < p.nsplit; sp++) {
        float4 *acc = (float4 *)(p.dq_acc + sp * split + (long long)row * AL_HEAD_DIM + 8 * c);
        acc[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        acc[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* ---- dQ conversion ---------------------------------------------------------------------------------- */
/* A lane per 8 consecutive columns of a row (grid-stride): the splits' f32 sums in split order (bit-identical
 * to an element-wise loop), times scale; a dq row in the kernel's 16-bit dtype with unit column stride and a
 * 16-byte-aligned chunk takes one 16-byte store, others al_st_elem per element. The first version (a lane per
 * element, 64-bit divisions) took ~0.2 ms at 4x16x4096x128 (session 13). */
extern "C" __global__ void __launch_bounds__(256) al_flash_bwd_dq(AL_KPARAMS p) {
    constexpr int G = AL_PRE_LANES;
    const long long rows = (long long)p.B * p.H * p.SQ;
    const long long split = rows * AL_HEAD_DIM;
    const int kdt = AL_BF16 ? AL_FLASH_DT_BF16 : AL_FLASH_DT_F16;
    for (long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x; u < rows * G; u += (long long)gridDim.x * blockDim.x) {
        const int row = (int)(u / G), c = (int)(u & (G - 1));
        const int i = row % p.SQ;
        const int bh = row / p.SQ;
        const int b = bh / p.H, h = bh % p.H;
        const int q_len = p.q_len ? (int)p.q_len[b] : p.SQ;
        const long long q_start = p.q_start ? p.q_start[b] : 0;
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = 0.0f;
        if (i < q_len) {
            for (int sp = 0; sp < p.nsplit; sp++) {
                const float4 *a = (const float4 *)(p.dq_acc + sp * split + (long long)row * AL_HEAD_DIM + 8 * c);
                const float4 x0 = a[0], x1 = a[1];
                v[0] += x0.x; v[1] += x0.y; v[2] += x0.z; v[3] += x0.w;
                v[4] += x1.x; v[5] += x1.y; v[6] += x1.z; v[7] += x1.w;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] *= p.scale;
        } else if (p.q_start) {
            continue;     /* thd: rows past the sequence belong to the gaps or the next sequence */
        }
        const long long o = b * p.dq.sb + (q_start + i) * p.dq.st + (long long)h * p.dq.sh + 8 * c * p.dq.sc;
        al_u16 *pq = (al_u16 *)p.dq.ptr + o;
        if (p.dq.dtype == kdt && p.dq.sc == 1 && ((unsigned long long)pq & 15ull) == 0) {
            *(uint4 *)pq = make_uint4(al_pack2(v[0], v[1]), al_pack2(v[2], v[3]), al_pack2(v[4], v[5]), al_pack2(v[6], v[7]));
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) al_st_elem(p.dq.ptr, p.dq.dtype, o + e * p.dq.sc, v[e]);
        }
    }
}

/* ---- main kernel -------------------------------------------------------------------------------------- */
/* dynamic shared memory: 2 * KV_BYTES + 2 * Q_BYTES + DS_BYTES + 2 * BM * 4 */
extern "C" __global__ void __launch_bounds__(bwd::NT) al_flash_bwd(AL_KPARAMS p) {
    using namespace bwd;
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int wr = warp % (BN / 16), wd = warp / (BN / 16);   /* kv row group, d part of dK/dV */
    const int hk = blockIdx.y, b = blockIdx.z;
    const int G = p.H / p.HG;
    const long long q_start = p.q_start ? p.q_start[b] : 0;
    const long long kv_start = p.kv_start ? p.kv_start[b] : 0;
    const int n_blocks = (p.SKV + BN - 1) / BN;
    const long long split_elems = (long long)p.B * p.H * p.SQ * D;
    float *dq_acc = p.dq_acc + (p.deterministic ? (long long)blockIdx.x * split_elems : 0);

    const al_u32 sK = al_smem_addr(smem);
    const al_u32 sV = sK + KV_BYTES;
    const al_u32 sQ = sV + KV_BYTES;
    const al_u32 sO = sQ + Q_BYTES;          /* dO */
    const al_u32 sS = sO + Q_BYTES;          /* dS^T */
    float *s_lse2 = (float *)(smem + 2 * KV_BYTES + 2 * Q_BYTES + DS_BYTES);
    float *s_dsum = s_lse2 + BM;

    /* ldmatrix lane addressing (flash_fwd.cu): A rows / B [n][k] rows / B [k][n] .trans rows */
    const int a_row = (lane & 15), a_ch = lane >> 4;
    const int bk_row = (lane & 7) + ((lane >> 4) << 3), bk_ch = (lane >> 3) & 1;
    const int bv_row = (lane & 7) + (((lane >> 3) & 1) << 3), bv_ch = lane >> 4;
    /* A from [k][m] storage with .trans (dS for dQ): row k (lane%8) + (lane/16)*8, m chunk +(lane/8)%2 */
    const int at_row = (lane & 7) + ((lane >> 4) << 3), at_ch = (lane >> 3) & 1;

    for (int nb = blockIdx.x; nb < n_blocks; nb += gridDim.x) {
        const int n0 = nb * BN;
        al_fl_seq s0 = al_fl_seq_make(p, b, hk * G);
        const int kv_len = s0.kv_len;
        float dk[DT8][4], dv[DT8][4];
#pragma unroll
        for (int t = 0; t < DT8; t++) {
            dk[t][0] = dk[t][1] = dk[t][2] = dk[t][3] = 0.0f;
            dv[t][0] = dv[t][1] = dv[t][2] = dv[t][3] = 0.0f;
        }

        if (n0 < kv_len) {
            __syncthreads();   /* the previous KV block's readers of sK/sV are done */
            const al_u16 *gK = (const al_u16 *)p.k.ptr + b * p.k.sb + (kv_start + n0) * p.k.st + (long long)hk * p.k.sh;
            const al_u16 *gV = (const al_u16 *)p.v.ptr + b * p.v.sb + (kv_start + n0) * p.v.st + (long long)hk * p.v.sh;
            al_load_tile<BN, NT>(sK, gK, p.k.st, kv_len - n0, tid);
            al_load_tile<BN, NT>(sV, gV, p.v.st, kv_len - n0, tid);
            al_cp_commit();
            const int n_last = min(n0 + BN, kv_len) - 1;

            for (int gi = 0; gi < G; gi++) {
                const int h = hk * G + gi;
                const al_fl_seq s = al_fl_seq_make(p, b, h);
                /* the query rows that can see some key of [n0, n_last] */
                int i_lo = 0, i_hi = s.q_len;
#if AL_MASK_KIND != 0
                if (s.wr >= 0) i_lo = max(0, n0 - s.diag - s.wr);
                if (s.wl >= 0) i_hi = min(s.q_len, n_last - s.diag + s.wl + 1);
#endif
                if (i_hi <= i_lo) continue;
                const float slope_log2 = p.alibi ? p.alibi[b * p.H + h] * AL_LOG2E : 0.0f;
                (void)slope_log2;
                const al_u16 *gQ = (const al_u16 *)p.q.ptr + b * p.q.sb + q_start * p.q.st + (long long)h * p.q.sh;
                const al_u16 *gO = (const al_u16 *)p.dout.ptr + b * p.dout.sb + q_start * p.dout.st + (long long)h * p.dout.sh;
                const long long row_base = ((long long)b * p.H + h) * p.SQ;

                for (int mb = i_lo / BM; mb * BM < i_hi; mb++) {
                    const int m0 = mb * BM;
#if AL_BLOCK_MASK
                    const int bmv = al_fl_block(p, b, h, m0, n0);   /* uniform per CTA */
                    if (bmv == 0) continue;                         /* an empty block: skipped */
                    const int mod_on = bmv == 1;                    /* a full block skips mask_mod */
#else
                    const int mod_on = 1;
#endif
                    __syncthreads();   /* readers of sQ, sO, sS and the row stats are done */
                    al_load_tile<BM, NT>(sQ, gQ + m0 * p.q.st, p.q.st, s.q_len - m0, tid);
                    al_load_tile<BM, NT>(sO, gO + m0 * p.dout.st, p.dout.st, s.q_len - m0, tid);
                    al_cp_commit();
                    for (int r = tid; r < BM; r += NT) {
                        const int i = m0 + r;
                        s_lse2[r] = i < p.SQ ? p.lse2[row_base + i] : AL_POS_INF;
                        s_dsum[r] = i < p.SQ ? p.dsum[row_base + i] : 0.0f;
                    }
                    al_cp_wait<0>();
                    __syncthreads();

                    /* S^T = K Q^T and dP^T = V dO^T: this warp's 16 kv rows x BM query columns */
                    float st[MT8][4], dpt[MT8][4];
#pragma unroll
                    for (int t = 0; t < MT8; t++) {
                        st[t][0] = st[t][1] = st[t][2] = st[t][3] = 0.0f;
                        dpt[t][0] = dpt[t][1] = dpt[t][2] = dpt[t][3] = 0.0f;
                    }
#pragma unroll 1   /* rolled: fully unrolled, ptxas hoists the fragment loads and spills */
                    for (int ks = 0; ks < KS; ks++) {
                        al_u32 ak[4], av[4];
                        al_ldsm_x4(sK + al_swz<CPR>(wr * 16 + a_row, ks * 2 + a_ch), ak[0], ak[1], ak[2], ak[3]);
                        al_ldsm_x4(sV + al_swz<CPR>(wr * 16 + a_row, ks * 2 + a_ch), av[0], av[1], av[2], av[3]);
#pragma unroll
                        for (int np = 0; np < BM / 16; np++) {
                            al_u32 b0, b1, b2, b3;
                            al_ldsm_x4(sQ + al_swz<CPR>(np * 16 + bk_row, ks * 2 + bk_ch), b0, b1, b2, b3);
                            al_mma(st[2 * np], ak, b0, b1);
                            al_mma(st[2 * np + 1], ak, b2, b3);
                            al_ldsm_x4(sO + al_swz<CPR>(np * 16 + bk_row, ks * 2 + bk_ch), b0, b1, b2, b3);
                            al_mma(dpt[2 * np], av, b0, b1);
                            al_mma(dpt[2 * np + 1], av, b2, b3);
                        }
                    }

                    /* P^T and dS^T; element (e) of tile t: kv row j, query column i */
                    int need_mask = (AL_HAS_MASK_MOD && mod_on) || n0 + BN > kv_len;
#if AL_MASK_KIND != 0
                    if (s.wr >= 0) need_mask |= n0 + BN - 1 > m0 + s.diag + s.wr;
                    if (s.wl >= 0) need_mask |= n0 < m0 + BM - 1 + s.diag - s.wl;
#endif
                    al_u32 pa[BM / 16][4], da[BM / 16][4];
#pragma unroll
                    for (int t = 0; t < MT8; t++) {
                        float pv[4], dsv[4];
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int j = n0 + wr * 16 + g + ((e >> 1) << 3);
                            const int il = t * 8 + tq * 2 + (e & 1);
                            const int i = m0 + il;
                            const float x = al_fl_logit2(s, st[t][e], p.scale, p.scale_log2, slope_log2, i, j);
                            float pe = al_ex2(x - s_lse2[il]);
#if AL_HAS_CAPTURE_GRAD
                            const int keep = (!need_mask || al_fl_valid(s, i, j, mod_on)) && i < s.q_len;
                            if (!keep) pe = 0.0f;
#else
                            if (need_mask && !al_fl_valid(s, i, j, mod_on)) pe = 0.0f;
#endif
                            pv[e] = pe;
                            float ds = pe * (dpt[t][e] - s_dsum[il]);
#if AL_HAS_CAPTURE_GRAD
                            if (keep) AL_CAPTURE_GRAD(ds, st[t][e] * p.scale, s.b, s.h, i, j);
#endif
#if AL_HAS_SCORE_MOD
                            ds = AL_FL_SCORE_GRAD(ds, st[t][e], p.scale, s.b, s.h, min(i, s.q_len - 1), min(j, kv_len - 1));
#endif
                            dsv[e] = ds;
                        }
                        pa[t >> 1][(t & 1) * 2 + 0] = al_pack2(pv[0], pv[1]);
                        pa[t >> 1][(t & 1) * 2 + 1] = al_pack2(pv[2], pv[3]);
                        da[t >> 1][(t & 1) * 2 + 0] = al_pack2(dsv[0], dsv[1]);
                        da[t >> 1][(t & 1) * 2 + 1] = al_pack2(dsv[2], dsv[3]);
                    }
                    /* dS^T -> shared memory [BN][BM] (the d-part-0 warps own their 16 rows) */
                    if (wd == 0) {
#pragma unroll
                        for (int t = 0; t < MT8; t++) {
#pragma unroll
                            for (int r = 0; r < 2; r++) {
                                const int row = wr * 16 + g + r * 8, col = t * 8 + tq * 2;
                                const al_u32 addr = sS + al_swz<DS_CPR>(row, col >> 3) + (col & 7) * 2;
                                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(da[t >> 1][(t & 1) * 2 + r]));
                            }
                        }
                    }

                    /* dV += P^T dO, dK += dS^T Q over this warp's d columns [wd*DW, wd*DW + DW) */
#pragma unroll
                    for (int kk = 0; kk < BM / 16; kk++) {
#pragma unroll
                        for (int dp = 0; dp < DW / 16; dp++) {
                            const int ch = wd * (DW / 8) + dp * 2 + bv_ch;
                            al_u32 b0, b1, b2, b3;
                            al_ldsm_x4_t(sO + al_swz<CPR>(kk * 16 + bv_row, ch), b0, b1, b2, b3);
                            al_mma(dv[2 * dp], pa[kk], b0, b1);
                            al_mma(dv[2 * dp + 1], pa[kk], b2, b3);
                            al_ldsm_x4_t(sQ + al_swz<CPR>(kk * 16 + bv_row, ch), b0, b1, b2, b3);
                            al_mma(dk[2 * dp], da[kk], b0, b1);
                            al_mma(dk[2 * dp + 1], da[kk], b2, b3);
                        }
                    }
                    __syncthreads();   /* dS^T complete */

                    /* dQ (rows qg*16.., columns [qd*DQW, +DQW)) += dS K, in chunks of DQ_CHUNK columns */
                    const int qg = warp % QG, qd = warp / QG;
#pragma unroll
                    for (int c0 = 0; c0 < DQW; c0 += DQ_CHUNK) {
                        float acc[DQ_CHUNK / 8][4];
#pragma unroll
                        for (int t = 0; t < DQ_CHUNK / 8; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
#pragma unroll
                        for (int kk = 0; kk < BN / 16; kk++) {
                            al_u32 a[4];
                            al_ldsm_x4_t(sS + al_swz<DS_CPR>(kk * 16 + at_row, qg * 2 + at_ch), a[0], a[1], a[2], a[3]);
#pragma unroll
                            for (int dp = 0; dp < DQ_CHUNK / 16; dp++) {
                                al_u32 b0, b1, b2, b3;
                                const int ch = (qd * DQW + c0) / 8 + dp * 2 + bv_ch;
                                al_ldsm_x4_t(sK + al_swz<CPR>(kk * 16 + bv_row, ch), b0, b1, b2, b3);
                                al_mma(acc[2 * dp], a, b0, b1);
                                al_mma(acc[2 * dp + 1], a, b2, b3);
                            }
                        }
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            const int i = m0 + qg * 16 + g + r * 8;
                            if (i >= s.q_len) continue;
                            float *dst = dq_acc + (row_base + i) * D + qd * DQW + c0 + tq * 2;
#pragma unroll
                            for (int t = 0; t < DQ_CHUNK / 8; t++) {
                                if (p.deterministic) {
                                    dst[t * 8] += acc[t][2 * r];
                                    dst[t * 8 + 1] += acc[t][2 * r + 1];
                                } else {
                                    atomicAdd(dst + t * 8, acc[t][2 * r]);
                                    atomicAdd(dst + t * 8 + 1, acc[t][2 * r + 1]);
                                }
                            }
                        }
                    }
                }
            }
            al_cp_wait<0>();
        }

        /* dK (times scale) and dV through their real strides; zeros past the sequence (dense) */
        const int thd = p.kv_start != 0;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int j = n0 + wr * 16 + g + r * 8;
            if (j >= p.SKV || (thd && j >= kv_len)) continue;
            const int ok = j < kv_len;
            const long long ko = b * p.dk.sb + (kv_start + j) * p.dk.st + (long long)hk * p.dk.sh;
            const long long vo = b * p.dv.sb + (kv_start + j) * p.dv.st + (long long)hk * p.dv.sh;
#pragma unroll
            for (int t = 0; t < DT8; t++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int d = wd * DW + t * 8 + tq * 2 + e;
                    al_st_elem(p.dk.ptr, p.dk.dtype, ko + d * p.dk.sc, ok ? dk[t][2 * r + e] * p.scale : 0.0f);
                    al_st_elem(p.dv.ptr, p.dv.dtype, vo + d * p.dv.sc, ok ? dv[t][2 * r + e] : 0.0f);
                }
            }
        }
    }
}
