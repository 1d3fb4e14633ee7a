/*
 * kernels/flash_fwd_sm90.cu — Hopper (sm_90a) forward for the `flash` backend: wgmma + TMA + mbarriers +
 * warp specialisation. A drop-in for al_flash_fwd (kernels/flash_fwd.cu): the same al_flash_params,
 * operand conventions, output and LSE (natural log, -inf for empty rows). Host side:
 * src/cuda/attn_flash_sm90.cu; specialisations and launch shape: src/cuda/flash_sm90_specs.h.
 *
 * Variants (-D defines):
 *   AL_HEAD_DIM 64 | 128 | 256, AL_BF16 1 | 0 (f16)
 *   AL_MASK_KIND 0 none | 1 causal | 2 window (runtime wl, wr); AL_BOTTOM_RIGHT 0 | 1
 *   AL_SM90_BN (key rows per tile: 64 or 128), AL_SM90_STAGES (K/V smem stages),
 *   AL_SM90_CONSUMERS (consumer warpgroups, 64 query rows each; BM = 64 * CONSUMERS)
 *   AL_SM90_ROW0 1: the row blocks start at p.m_row0 (the second launch of a split grid: three consumers take
 *   a head's first rows, two the rest; src/cuda/flash_sm90_specs.h, al_flash_sm90_c3_rows)
 *   Variants: AL_SCORE_MOD (or its folded form AL_SCORE_PRE / AL_SCORE_POST) / AL_MASK_MOD / AL_VARIANT /
 *   AL_BLOCK_MASK / AL_EX2_FMA_EVERY as in kernels/flash_common.cuh (the forward's hooks; the host needs
 *   block_m % BM == 0 and block_n % BN == 0, so a tile lies in one block, or with AL_SM90_BM_SPAN, set for
 *   three consumers, only block_n % BN == 0: a tile's kind combines the block rows it spans). score_mod turns each score
 *   into the hook's value before its constant factor, the max is taken on those, and the factor times
 *   log2 e is the exponent's multiplier (in place of the folded scale * log2 e); mask_mod masks every
 *   tile that is not a full (2) block; 0 blocks are neither loaded nor computed: warp 0 first compacts
 *   the Q block's row of the block mask into a list of non-empty tiles in shared memory (at most
 *   AL_SM90_BM_LIST), which the producer and the consumers walk. AL_SCORE_MOD_MAX (a bounded logit,
 *   bf16): every row's max is that bound, no running max (AL_FL_FIXED_MAX below).
 *   Not here (the host sends it to kernels/flash_fwd.cu): ALiBi.
 * Check / bench: tests/cuda/flash_sm90_check.cu (against the stage-1 kernel and a naive reference).
 *
 * Design (FA3-style, first version):
 *   grid (ceil(SQ/BM), H, B); causal grids visit Q blocks longest-first. 128 * (1 + CONSUMERS) threads.
 *   Warpgroup 0 = producer: setmaxnreg down to 64 (56 with three consumers); one warp loads Q once
 *   and the K/V tiles of the Q block's key range into a STAGES-deep ring with TMA
 *   (cp.async.bulk.tensor.4d, 128-byte swizzle, boxes of 64 columns), each tile completing on its own "full" mbarrier (arrive.expect_tx). The
 *   last, partial tile of a sequence (rows past kv_len) is copied by the warp with ordinary loads
 *   and zero-filled instead: TMA would read the next sequence's rows there (thd, padding), and V
 *   rows must be finite for 0 * V to vanish. K and V have separate full/empty barriers so that
 *   K(j+1) is requested as soon as S(j) is done with K(j).
 *   Warpgroups 1.. = consumers: setmaxnreg up to 216 (152 with three); each owns 64 query rows.
 *     S = Q K^T: wgmma m64nBNk16, A = Q and B = K from shared memory (descriptors, K-major);
 *     mask, online softmax in log2 units with the scale folded into one FFMA per element
 *     (max taken on raw scores; the host requires scale > 0), P packed to 16 bits in registers;
 *     O += P V: wgmma m64nDk16 with A = P from registers (the f32 accumulator layout of S, packed
 *     in pairs, is the A-fragment layout) and B = V from shared memory (MN-major, imm-trans-b).
 *     Each warp's lane 0 arrives on the tile's "empty" barrier after the wgmma that read it retired.
 *   Scheduling (FA3's two steps, session 5): the two consumers ping-pong on named barriers 1 and 2, so
 *   one warpgroup's softmax runs while the other's GEMMs hold the tensor cores (AL_SM90_PINGPONG; with
 *   three consumers, an experiment since session 19, the turns go round barriers 1-3); and
 *   inside a warpgroup S(j+1) = Q K(j+1)^T is issued together with O += P(j) V(j), the softmax of S(j+1)
 *   running while the O product is in flight (AL_SM90_PIPE; off at d = 256, where P(j) beside O's 128
 *   registers spilled). H200, bf16, d = 128: 559-613 -> 602-649 TFLOP/s non-causal, 502-569 -> 544-676
 *   causal (docs/PERFORMANCE.md, session 5). With PIPE, o is rescaled between the S(j+1) and O(j) issues
 *   (FA3's order) and the wait for O(j) is kept below the softmax by al_block_end (ptxas hoisted it above,
 *   so the exponentials waited for the warpgroup's own O product; docs/FLASH.md, "Reading the SASS"):
 *   +2-4% at d = 128 in session 12 (the switch AL_SM90_LATE_WAIT then, since removed).
 *   Epilogue: O / l stored from registers (16-bit pairs), LSE = (m + log2 l) ln 2.
 *   Not yet: TMA stores of O, a persistent tile scheduler, cluster multicast of K/V.
 * Shared memory (from a 1024-byte aligned base): Q [D/64 boxes][BM][64] | K [STAGES][D/64][BN][64] |
 * V [STAGES][D/64][BN][64] | mbarriers | (block mask: the tile list, u16 [AL_SM90_BM_LIST], and its
 * count). Rows past the tensor's extent come back as zeros from TMA.
 */
#include "flash_common.cuh"
#include "sm90_common.cuh"

#if AL_ALIBI
#error "flash_fwd_sm90.cu: ALiBi is served by flash_fwd.cu"
#endif
#ifndef AL_SM90_BN
#define AL_SM90_BN (AL_HEAD_DIM == 256 ? 64 : 128)
#endif
#ifndef AL_SM90_STAGES
#define AL_SM90_STAGES 2
#endif
#ifndef AL_SM90_CONSUMERS
#define AL_SM90_CONSUMERS 2
#endif
#ifndef AL_SM90_PIPE   /* d = 256: P(j-1) live beside O's 128 registers and S spilled 16 bytes */
#define AL_SM90_PIPE (AL_HEAD_DIM <= 128)
#endif
#ifndef AL_SM90_PINGPONG
#define AL_SM90_PINGPONG (AL_SM90_CONSUMERS >= 2)
#endif
#ifndef AL_SM90_BM_SPAN     /* block masks whose block_m is not a multiple of BM (the host sets it with three consumers) */
#define AL_SM90_BM_SPAN 0
#endif
#ifndef AL_SM90_ROW0        /* a split grid's second launch (the host sets it; no mask, no block mask) */
#define AL_SM90_ROW0 0
#endif
#if AL_SM90_ROW0 && (AL_MASK_KIND != 0 || AL_BLOCK_MASK)
#error "AL_SM90_ROW0: split grids are for kernels without a mask or block mask (the causal orders assume one launch)"
#endif
/* AL_SM90_FWD_PDL 1 (the host's, for both launches of a split grid under ATTNLAB_FLASH_SM90_FWD_PDL=1, an opt-in;
 * src/cuda/flash_sm90_specs.h): the second launch (AL_SM90_ROW0) goes out with programmatic stream serialisation.
 * The first signals its dependents at its start, so the second's CTAs may start as soon as every CTA of the first
 * has started, on the SMs its last wave leaves idle; the second reads nothing the first writes (other rows of O and
 * the LSE), and thread 0 of each of its CTAs waits for the first grid before it exits (F90_PDL_EXIT), so that the
 * second grid completes after the first and work queued behind the forward sees all of it. Thread 0 waits at the end
 * of the producer's loop only: a split grid has no mask and is never thd, so every CTA of its second launch has key
 * tiles (nblk > 0) and rows below q_len; a wait on the early exits too made ptxas spill 16 bytes (soft-capping). */
#ifndef AL_SM90_FWD_PDL
#define AL_SM90_FWD_PDL 0
#endif
#if AL_SM90_FWD_PDL && AL_SM90_ROW0
#define F90_PDL_EXIT(is_thread0) \
    do { \
        if (is_thread0) asm volatile("griddepcontrol.wait;\n" ::: "memory"); \
    } while (0)
#else
#define F90_PDL_EXIT(is_thread0) ((void)0)
#endif
#ifndef AL_TANH_FMA_EVERY   /* flash_common.cuh: an experiment, off */
#define AL_TANH_FMA_EVERY 0
#endif
#if AL_BLOCK_MASK && !defined(AL_SM90_BM_LIST)
#error "AL_BLOCK_MASK needs AL_SM90_BM_LIST (the host's bound on key tiles per Q block)"
#endif
/* AL_FL_FIXED_MAX: a score_mod whose value is bounded (AL_SCORE_MOD_MAX, the host's proof by interval arithmetic:
 * soft-capping at c lies in [-c, c], and the bounds are at most 64 apart) takes that bound as every row's max
 * instead of a running one: no max over the tile, no shuffles, no correction exponentials and no rescaling of o,
 * so each score goes straight from its hook to its exponential. Every exponential is then between e^-64 and 1 (a
 * logit at the bound), a normal number in f32 and in bf16 (8 exponent bits) alike; not at f16, whose P (5
 * exponent bits) would flush such values to zero, so f16 keeps the running max. */
#if AL_HAS_SCORE_MOD && defined(AL_SCORE_MOD_MAX) && AL_BF16
#define AL_FL_FIXED_MAX 1
#else
#define AL_FL_FIXED_MAX 0
#endif

namespace f90 {
constexpr int D = AL_HEAD_DIM;
constexpr int BN = AL_SM90_BN;
constexpr int ST = AL_SM90_STAGES;
constexpr int NC = AL_SM90_CONSUMERS;
constexpr int BM = 64 * NC;
constexpr int NT = 128 * (1 + NC);
constexpr int BOXES = D / 64;                 /* 64-column TMA boxes per row */
constexpr int Q_BYTES = BM * D * 2;
constexpr int KV_BYTES = BN * D * 2;
/* setmaxnreg budgets (the register file is 64 K 32-bit registers; multiples of 8): with three consumers (512
 * threads) 56 for the producer and 152 for each consumer thread (at 32 the producer's partial-tile copy spilled,
 * FlashAttention-3's 32 / 160 split) */
constexpr int PRODUCER_REGS = NC == 3 ? 56 : 64;
constexpr int CONSUMER_REGS = NC == 3 ? 152 : 216;
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * NC <= al_launch_regs(NT) * NT,
              "setmaxnreg split beyond the CTA's launch registers (a hang)");
constexpr bool PIPE = AL_SM90_PIPE;           /* S(j+1) and O += P(j) V(j) issued together */
constexpr bool PINGPONG = AL_SM90_PINGPONG;   /* the consumers take turns on the tensor cores */
/* score_mod's tanh on the FMA pipe in column groups t with (t + 1) % TANH_FMA_K == 0 (none when off: t < BN / 8) */
constexpr int TANH_FMA_K = AL_TANH_FMA_EVERY > 0 ? AL_TANH_FMA_EVERY : BN;
static_assert(NC == 2 || NC == 3, "two or three consumer warpgroups");
static_assert(!PINGPONG || NC >= 2, "ping-pong needs two or more consumer warpgroups");
static_assert(BN == 64 || BN == 128, "BLOCK_N is 64 or 128");
static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128, 256");
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * NC <= 65536, "register file");
}  // namespace f90

/* the wgmma wrappers for this specialisation's N */
#if AL_SM90_BN == 64
#define AL_WG_SS_S al_wgmma_ss_n64
#define AL_WG_FENCE_S al_wg_fence_regs_n64
#else
#define AL_WG_SS_S al_wgmma_ss_n128
#define AL_WG_FENCE_S al_wg_fence_regs_n128
#endif
#if AL_HEAD_DIM == 64
#define AL_WG_RS_O al_wgmma_rs_n64_tb
#define AL_WG_FENCE_O al_wg_fence_regs_n64
#elif AL_HEAD_DIM == 128
#define AL_WG_RS_O al_wgmma_rs_n128_tb
#define AL_WG_FENCE_O al_wg_fence_regs_n128
#else
#define AL_WG_RS_O al_wgmma_rs_n256_tb
#define AL_WG_FENCE_O al_wg_fence_regs_n256
#endif

/* With a block mask the loops walk a list of the Q block's non-empty key tiles, built once per CTA in
 * shared memory (entry = tile index << 2 | block kind: 1 partial, mask_mod per element; 2 full, no
 * mask_mod): reading the mask from global memory inside the loops put a dependent load on every
 * iteration, empty tiles included, and cost ~30% of causal-through-mask_mod on the H200. Without a block
 * mask iteration t is tile t, every tile partial (mask_mod, when there is one, runs everywhere). */
#if AL_BLOCK_MASK
#define F90_TILE_OF(t) ((int)(bm_list[t] >> 2))
#define F90_KIND_OF(t) ((int)(bm_list[t] & 3u))
#else
#define F90_TILE_OF(t) (t)
#define F90_KIND_OF(t) 1
#endif

/* p.sched_hb is read by the kernels without a window (whose blocks are alike): computed coordinates live
 * in registers where blockIdx was re-read for free, and d = 256's window kernels spilled 8 bytes with them */
#define F90_SCHED (AL_MASK_KIND != 2)

/* dynamic shared memory: see al_flash_sm90_spec_tiles (src/cuda/flash_sm90_specs.h) */
extern "C" __global__ void __launch_bounds__(f90::NT, 1)
    al_flash_fwd_sm90(const __grid_constant__ al_flash_params p, const __grid_constant__ al_sm90_tmaps tm) {
    using namespace f90;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    /* causal (and block masks whose later rows hold more tiles): the longest rows first, a short tail;
     * with p.sched_hb (causal) across heads too, in L2-sized sections (al_fl_cta_coords) */
    const int heavy_high = AL_MASK_KIND == 1 || (AL_BLOCK_MASK && p.m_reverse);
    const int sched = F90_SCHED ? p.sched_hb : 0;   /* window kernels: the grid's order, longest first per head */
    int m_block, h, b;
    al_fl_cta_coords(sched, heavy_high, m_block, h, b);
    if (sched <= 0 && heavy_high) m_block = (int)gridDim.x - 1 - m_block;
    const int hk = h / (p.H / p.HG);
    const al_fl_seq s = al_fl_seq_make(p, b, h);
#if AL_SM90_ROW0
    const int m0 = p.m_row0 + m_block * BM;   /* a split grid's second launch: its blocks start at row m_row0 */
#else
    const int m0 = m_block * BM;
#endif
    float *lse_row = p.lse + ((long long)b * p.H + h) * p.SQ;

    if (m0 >= s.q_len) {     /* past the sequence: lse = -inf (out was zero-filled by the host) */
        for (int i = m0 + tid; i < m0 + BM && i < p.SQ; i += NT) lse_row[i] = AL_NEG_INF;
        /* (no F90_PDL_EXIT here: a split grid is never thd, so its second launch's blocks all start below sq = q_len) */
        return;
    }
    /* the key range that rows [m0, m_last] can see (as flash_fwd.cu) */
    const int m_last = min(m0 + BM, s.q_len) - 1;
    int n_lo = 0, n_hi = s.kv_len;
#if AL_MASK_KIND != 0
    if (s.wl >= 0) n_lo = max(0, m0 + s.diag - s.wl);
    if (s.wr >= 0) n_hi = min(s.kv_len, m_last + s.diag + s.wr + 1);
#endif
    const int nb_lo = n_lo / BN;
    int nblk = n_hi > n_lo ? (n_hi + BN - 1) / BN - nb_lo : 0;   /* iterations: tiles, or listed tiles */

    const al_u32 base = (al_smem_addr(smem_raw) + 1023u) & ~1023u;
    const al_u32 sQ = base;
    const al_u32 sK = sQ + Q_BYTES;
    const al_u32 sV = sK + ST * KV_BYTES;
    const al_u32 sBar = sV + ST * KV_BYTES;
    /* barriers: q_full | k_full[ST] | v_full[ST] | k_empty[ST] | v_empty[ST] */
    const al_u32 bar_q = sBar;
#define BAR_KF(i) (sBar + 8u * (1 + (i)))
#define BAR_VF(i) (sBar + 8u * (1 + ST + (i)))
#define BAR_KE(i) (sBar + 8u * (1 + 2 * ST + (i)))
#define BAR_VE(i) (sBar + 8u * (1 + 3 * ST + (i)))
    if (tid == 0) {
        al_mbar_init(bar_q, 1);
        for (int i = 0; i < ST; i++) {
            al_mbar_init(BAR_KF(i), 1);
            al_mbar_init(BAR_VF(i), 1);
            al_mbar_init(BAR_KE(i), 4 * NC);   /* lane 0 of every consumer warp */
            al_mbar_init(BAR_VE(i), 4 * NC);
        }
        al_mbar_init_fence();
#if AL_SM90_FWD_PDL && !AL_SM90_ROW0
        asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");   /* the split's second launch may start */
#endif
    }
#if AL_BLOCK_MASK
    /* the list after the barriers (the host's smem size counts 2 AL_SM90_BM_LIST + 16 bytes for it) */
    unsigned short *bm_list = (unsigned short *)(smem_raw + (sBar - al_smem_addr(smem_raw)) + 8 * (1 + 4 * ST));
    int *bm_count = (int *)(bm_list + AL_SM90_BM_LIST);
    if (tid < 32)   /* warp 0 compacts the Q block's row of the block mask */
        al_sm90_list_tiles(bm_list, bm_count, nblk, tid, [&](int j) {
#if AL_SM90_BM_SPAN   /* a Q tile over several block rows (three consumers under 128-row blocks) */
            return al_fl_block_rows(p, b, h, m0, min(BM, p.SQ - m0), (nb_lo + j) * BN);
#else
            return al_fl_block(p, b, h, m0, (nb_lo + j) * BN);
#endif
        });
    __syncthreads();
    nblk = *bm_count;
#else
    __syncthreads();
#endif

    const long long q_start = p.q_start ? p.q_start[b] : 0;
    const long long kv_start = p.kv_start ? p.kv_start[b] : 0;

    if (wg == 0) {
        /* ---------------- producer ---------------- */
        al_reg_dealloc<PRODUCER_REGS>();
        const int warp = tid >> 5, lane = tid & 31;
        if (warp != 0 || nblk == 0) return;
        /* TMA batch coordinate: maps of tensors with sb == 0 (thd) have one batch entry */
        const int qb = p.q.sb ? b : 0, kb = p.k.sb ? b : 0, vb = p.v.sb ? b : 0;
        if (lane == 0) {
            al_tma_prefetch(&tm.q);
            al_tma_prefetch(&tm.k);
            al_tma_prefetch(&tm.v);
            al_mbar_arrive_tx(bar_q, Q_BYTES);
#pragma unroll
            for (int x = 0; x < BOXES; x++) al_tma_load_4d(sQ + x * (BM * 128), &tm.q, bar_q, x * 64, (int)(q_start + m0), h, qb);
        }
        const al_u16 *gK = (const al_u16 *)p.k.ptr + b * p.k.sb + kv_start * p.k.st + (long long)hk * p.k.sh;
        const al_u16 *gV = (const al_u16 *)p.v.ptr + b * p.v.sb + kv_start * p.v.st + (long long)hk * p.v.sh;
        for (int t = 0; t < nblk; t++) {
            const int n0 = (nb_lo + F90_TILE_OF(t)) * BN;
            const int stg = t % ST, ph = (t / ST) & 1;
            const int full = n0 + BN <= s.kv_len;
            const al_u32 kdst = sK + stg * KV_BYTES, vdst = sV + stg * KV_BYTES;
            al_mbar_wait(BAR_KE(stg), ph ^ 1);
            if (full) {
                if (lane == 0) {
                    al_mbar_arrive_tx(BAR_KF(stg), KV_BYTES);
#pragma unroll
                    for (int x = 0; x < BOXES; x++)
                        al_tma_load_4d(kdst + x * (BN * 128), &tm.k, BAR_KF(stg), x * 64, (int)(kv_start + n0), hk, kb);
                }
            } else {
                al_sm90_copy_partial<BN, D>(kdst, gK + (long long)n0 * p.k.st, p.k.st, s.kv_len - n0, lane);
                if (lane == 0) al_mbar_arrive(BAR_KF(stg));
            }
            al_mbar_wait(BAR_VE(stg), ph ^ 1);
            if (full) {
                if (lane == 0) {
                    al_mbar_arrive_tx(BAR_VF(stg), KV_BYTES);
#pragma unroll
                    for (int x = 0; x < BOXES; x++)
                        al_tma_load_4d(vdst + x * (BN * 128), &tm.v, BAR_VF(stg), x * 64, (int)(kv_start + n0), hk, vb);
                }
            } else {
                al_sm90_copy_partial<BN, D>(vdst, gV + (long long)n0 * p.v.st, p.v.st, s.kv_len - n0, lane);
                if (lane == 0) al_mbar_arrive(BAR_VF(stg));
            }
        }
        F90_PDL_EXIT(lane == 0);   /* (warp 0's lane 0, thread 0: every CTA of a split grid's second launch gets here) */
        return;
    }

    /* ---------------- consumers ---------------- */
    al_reg_alloc<CONSUMER_REGS>();
    const int cw = wg - 1;                       /* consumer index: rows m0 + 64 cw .. + 63 */
    const int wq = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int r0 = m0 + cw * 64 + wq * 16 + g;   /* this thread's rows: r0 and r0 + 8 */

    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.0f;
#if AL_FL_FIXED_MAX
    float m_run[2] = {AL_SCORE_MOD_MAX * AL_LOG2E, AL_SCORE_MOD_MAX * AL_LOG2E};   /* the fixed max, log2 units */
#else
    float m_run[2] = {AL_NEG_INF, AL_NEG_INF};   /* running max, log2 units (scaled) */
#endif
    float l_run[2] = {0.0f, 0.0f};               /* this thread's part of the row sums */
    /* the multiplier from the tile's values to log2-unit logits: without score_mod they are the raw q.k
     * products (scale * log2 e), with it the hook's value before its constant factor (al_fl_mod_pre) */
#if AL_HAS_SCORE_MOD
    const float sl2 = AL_FL_MOD_POST2;
#else
    const float sl2 = p.scale_log2;
#endif

    if (nblk > 0) al_mbar_wait(bar_q, 0);
    const al_u32 qa = sQ + cw * (64 * 128);      /* this warpgroup's 64 rows inside each Q box */
    float corr[2] = {1.0f, 1.0f};
    al_u32 pa[BN / 16][4];                       /* P of the previous tile, 16-bit A fragments */
    float sc[BN / 2];                            /* S of this tile; its exponentials after the softmax */

    /* S(j) = Q K(j)^T, issued */
    auto issue_s = [&](int j) {
        const int stg = j % ST, ph = (j / ST) & 1;
        const al_u32 kt = sK + stg * KV_BYTES;
        al_mbar_wait(BAR_KF(stg), ph);
        al_wg_fence();
        const al_u64 da0 = al_desc_sw128(qa, 16, 1024), db0 = al_desc_sw128(kt, 16, 1024);
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            const al_u64 da = al_desc_off(da0, (ks >> 2) * (BM * 128) + (ks & 3) * 32);
            const al_u64 db = al_desc_off(db0, (ks >> 2) * (BN * 128) + (ks & 3) * 32);
            AL_WG_SS_S(sc, da, db, ks > 0);
        }
        al_wg_commit();
    };
    /* O += P(j) V(j), issued (pa holds P(j)) */
    auto issue_o = [&](int j) {
        const int stg = j % ST, ph = (j / ST) & 1;
        al_mbar_wait(BAR_VF(stg), ph);
        al_wg_fence();
        const al_u64 dv0 = al_desc_sw128(sV + stg * KV_BYTES, BN * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            AL_WG_RS_O(o, pa[kk], al_desc_off(dv0, kk * (16 * 128)));
        al_wg_commit();
    };
    /* after O(j) retired: o and pa are free again, V(j)'s stage goes back to the producer */
    auto done_o = [&](int j) {
        AL_WG_FENCE_O(o);
        al_wg_fence_u32<4 * (BN / 16)>(&pa[0][0]);
        if (lane == 0) al_mbar_arrive(BAR_VE(j % ST));
    };
    /* after S(j) retired: score_mod, mask, online softmax; sc becomes P(j) in f32, corr its correction.
     * Accumulator element e of n8 tile t: row r0 + 8 (e >> 1), column n0 + 8 t + 2 tq + (e & 1). */
    auto softmax = [&](int j) {
        AL_WG_FENCE_S(sc);
        if (lane == 0) al_mbar_arrive(BAR_KE(j % ST));
        const int n0 = (nb_lo + F90_TILE_OF(j)) * BN;
        const int blk = F90_KIND_OF(j);
#if AL_HAS_SCORE_MOD
#pragma unroll
        for (int t = 0; t < BN / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[t * 4 + e] = al_fl_mod_pre(s, sc[t * 4 + e], p.scale, r0 + ((e >> 1) << 3),
                                              n0 + t * 8 + tq * 2 + (e & 1),
                                              (t + 1) % TANH_FMA_K == 0);
#endif
        const int mod_on = AL_HAS_MASK_MOD && blk != 2;   /* full blocks keep every element mask_mod would */
        int need_mask = mod_on || n0 + BN > s.kv_len;
#if AL_MASK_KIND != 0
        if (s.wr >= 0) need_mask |= n0 + BN - 1 > m0 + s.diag + s.wr;
        if (s.wl >= 0) need_mask |= n0 < m0 + BM - 1 + s.diag - s.wl;
#endif
        if (need_mask) {
#pragma unroll
            for (int t = 0; t < BN / 8; t++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!al_fl_valid(s, r0 + ((e >> 1) << 3), n0 + t * 8 + tq * 2 + (e & 1), mod_on))
                        sc[t * 4 + e] = AL_NEG_INF;
        }
        float nbase[2];
#if AL_FL_FIXED_MAX
        nbase[0] = nbase[1] = -m_run[0];         /* corr stays 1 */
#else
        float mx[2] = {AL_NEG_INF, AL_NEG_INF};
#pragma unroll
        for (int t = 0; t < BN / 8; t++) {
            mx[0] = fmaxf(mx[0], fmaxf(sc[t * 4 + 0], sc[t * 4 + 1]));
            mx[1] = fmaxf(mx[1], fmaxf(sc[t * 4 + 2], sc[t * 4 + 3]));
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float m_new = fmaxf(m_run[r], mx[r] * sl2);
            const float bse = m_new == AL_NEG_INF ? 0.0f : m_new;   /* nothing visible yet */
            corr[r] = al_ex2(m_run[r] - bse);                       /* ex2(-inf) = 0 */
            nbase[r] = -bse;
            m_run[r] = m_new;
            l_run[r] *= corr[r];
        }
#endif
#pragma unroll
        for (int t = 0; t < BN / 8; t++) {
#if AL_EX2_FMA_EVERY > 0
            const bool fma_pipe = t % AL_EX2_FMA_EVERY == 0;   /* flash_common.cuh, AL_EX2_FMA_EVERY */
#else
            const bool fma_pipe = false;
#endif
            if (fma_pipe) {
                sc[t * 4 + 0] = al_ex2_fma(fmaf(sc[t * 4 + 0], sl2, nbase[0]));
                sc[t * 4 + 1] = al_ex2_fma(fmaf(sc[t * 4 + 1], sl2, nbase[0]));
                sc[t * 4 + 2] = al_ex2_fma(fmaf(sc[t * 4 + 2], sl2, nbase[1]));
                sc[t * 4 + 3] = al_ex2_fma(fmaf(sc[t * 4 + 3], sl2, nbase[1]));
            } else {
                sc[t * 4 + 0] = al_ex2(fmaf(sc[t * 4 + 0], sl2, nbase[0]));
                sc[t * 4 + 1] = al_ex2(fmaf(sc[t * 4 + 1], sl2, nbase[0]));
                sc[t * 4 + 2] = al_ex2(fmaf(sc[t * 4 + 2], sl2, nbase[1]));
                sc[t * 4 + 3] = al_ex2(fmaf(sc[t * 4 + 3], sl2, nbase[1]));
            }
            l_run[0] += sc[t * 4 + 0] + sc[t * 4 + 1];
            l_run[1] += sc[t * 4 + 2] + sc[t * 4 + 3];
        }
    };
    /* o rescaled by the last softmax's correction (not while an O product is in flight: it writes o
     * asynchronously) */
    auto rescale = [&]() {
        if (AL_FL_FIXED_MAX) return;             /* corr is 1 */
#pragma unroll
        for (int t = 0; t < D / 8; t++) {
            o[t * 4 + 0] *= corr[0];
            o[t * 4 + 1] *= corr[0];
            o[t * 4 + 2] *= corr[1];
            o[t * 4 + 3] *= corr[1];
        }
    };
    /* P(j) packed into pa (once O(j-1), which reads pa, retired) */
    auto pack = [&]() {
#pragma unroll
        for (int t = 0; t < BN / 8; t++) {
            pa[t >> 1][(t & 1) * 2 + 0] = al_pack2(sc[t * 4 + 0], sc[t * 4 + 1]);   /* row r0, k = 8 (t & 1) + 2 tq */
            pa[t >> 1][(t & 1) * 2 + 1] = al_pack2(sc[t * 4 + 2], sc[t * 4 + 3]);   /* row r0 + 8, same k */
        }
    };

    /* Ping-pong (PINGPONG): the consumers take turns to issue their GEMMs, in a ring, each handing the
     * tensor cores to the next while it runs its softmax. Warpgroup w waits on named barrier 1 + w before
     * it issues and arrives on the next one's (pp_next) after; the last warpgroup opens with an arrive on
     * warpgroup 0's and leaves out its last arrive, so that every arrive is matched by a sync before the CTA
     * ends. All consumers walk the same nblk tiles, so their turns pair up. With three consumers (BM = 192)
     * a warpgroup's softmax has two other warpgroups' GEMMs to hide under instead of one: the point of
     * that experiment (ATTNLAB_FLASH_SM90_CONSUMERS=3) for MUFU-heavy score_mods.
     * PIPE: iteration j issues S(j) and O += P(j-1) V(j-1) together and runs the softmax of S(j) while the
     * O product is in flight. The prologue (S(0)) and the epilogue (the last O) are peeled off the loop:
     * a wgmma under a branch made ptxas serialise every wgmma of the kernel (C7518, "compiler-inserted
     * WG.DP in divergent path"), which cost 30% on the H200. */
    /* the next consumer's named barrier; the last consumer, which opens, leaves out the final arrive (written out
     * for two consumers: the default kernels' SASS as before the ring) */
    const int pp_next = NC == 2 ? 2 - cw : 1 + (cw + 1) % NC;
    const bool pp_last_arrive = NC == 2 ? cw == 0 : cw != NC - 1;
    if (nblk > 0) {
        if (PINGPONG && cw == NC - 1) al_named_arrive(1, 256);
        if (PINGPONG) al_named_sync(1 + cw, 256);
        issue_s(0);
        if (PINGPONG) al_named_arrive(pp_next, 256);
        al_wg_wait<0>();
        softmax(0);
        rescale();                               /* o is still 0 */
        pack();
        for (int j = 1; j < nblk; j++) {
            if (PINGPONG) al_named_sync(1 + cw, 256);
            if (PIPE) {
                issue_s(j);
                rescale();                       /* by softmax(j-1)'s correction, while S(j) runs */
                issue_o(j - 1);
            } else {
                issue_o(j - 1);
                al_wg_wait<0>();
                done_o(j - 1);
                issue_s(j);
            }
            if (PINGPONG) al_named_arrive(pp_next, 256);
            if (PIPE) al_wg_wait<1>();           /* S(j) retired; O(j-1) may still run */
            else al_wg_wait<0>();
            softmax(j);
            if (PIPE) {
                al_block_end(j == p.SQ);         /* keeps ptxas from hoisting the wait above the softmax */
                al_wg_wait<0>();
                done_o(j - 1);
            }
            if (!PIPE) rescale();
            pack();
        }
        if (PINGPONG) al_named_sync(1 + cw, 256);
        if (PIPE && nblk > 1) rescale();       /* the last softmax's correction */
        issue_o(nblk - 1);
        if (PINGPONG && pp_last_arrive) al_named_arrive(NC == 2 ? 2 : pp_next, 256);
        al_wg_wait<0>();
        done_o(nblk - 1);
    }

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
        for (int t = 0; t < D / 8; t++)
            *(al_u32 *)(orow + t * 8 + tq * 2) = al_pack2(o[t * 4 + 2 * r] * inv[r], o[t * 4 + 2 * r + 1] * inv[r]);
        if (tq == 0) lse_row[i] = l_run[r] > 0.0f ? (m_run[r] + __log2f(l_run[r])) * AL_LN2 : AL_NEG_INF;
    }
#undef BAR_KF
#undef BAR_VF
#undef BAR_KE
#undef BAR_VE
}
