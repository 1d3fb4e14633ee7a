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
 *   AL_SM90_DQ_ATOMIC 1 (role 0 only; opt-in, slower so far: docs/FLASH.md) makes the dK/dV kernel add dQ
 *                   into an f32 accumulator itself, FA3's five GEMMs, and the dQ kernel is not launched.
 *
 * Specialisations (-D): AL_HEAD_DIM 64 | 128, AL_BF16, AL_MASK_KIND, AL_BOTTOM_RIGHT, AL_SM90_ROLE,
 * AL_SM90_BN (stream rows per tile, 64), AL_SM90_STAGES, AL_SM90_CONSUMERS, AL_SM90_PERSIST (the default
 * kernels: one CTA per SM walking the work items, below). Not here: d = 256, ALiBi.
 * The P step (step 2 of the loop) is lean since session 12 (+24-27% at d = 128; it was the switch
 * AL_SM90_BWD_LEANP, docs/FLASH.md "Reading the SASS"): the dK/dV kernel's lse2 / D columns loaded during
 * the S batch, in both kernels a copy of the step without per-element tests for tiles wholly inside the
 * lengths and band (mask_mod-only variants too, for full blocks), and the dQ kernel's dP issued beside S.
 * Variants (the hooks of kernels/flash_common.cuh, AL_VARIANT, AL_BLOCK_MASK; semantics exactly those of
 * kernels/flash_bwd.cu): a variant build replaces steps 1-5 below, per slice of B90_VN stream columns, by
 * one S + dP batch (both kept in f32), then per element the logit through score_mod (al_fl_logit2,
 * clamped indices), P, the mask (lengths, band, mask_mod where the block is not full), dS = P (dP - D) in
 * f32, AL_CAPTURE_GRAD (dK/dV kernel only, so it runs once per kept element, with grad = dS before
 * score_grad and score = the raw scaled logit), AL_SCORE_MOD_GRAD, and then the slice's k-steps of the RS
 * products. In the dK/dV kernel the accumulator is S^T: rows are keys, columns queries, so the hooks get
 * q_idx = the column and kv_idx = the row, h = the tile's query head. Block masks: warp 0 first compacts
 * the CTA's non-empty stream tiles into a shared-memory list (the dK/dV kernel walks its key block's
 * COLUMN of the mask over the (query head, query tile) pairs, the dQ kernel its query block's ROW over
 * the key tiles), which the producer and the consumers walk: 0 blocks are neither loaded nor computed,
 * 2 blocks skip mask_mod. The host requires block_m % 64 == 0 and block_n % R == 0 (dK/dV) and
 * block_m % R == 0 and block_n % 64 == 0 (dQ), so every tile lies in one block, and at most
 * AL_SM90_BM_LIST stream tiles per CTA.
 * Kernel arguments: the al_flash_params and four TMA maps (src/cuda/flash_sm90_tma.h): own0, own1 (the
 * owned rows, boxes of R rows: K, V for role 0; Q, dO for role 1) and st0, st1 (the streamed tiles,
 * boxes of BN rows: Q, dO for role 0; K, V for role 1).
 * Shared memory (1024-byte aligned): [OWN_BUFS: 2 persistent, else 1] (own0 [D/64][R][64] | own1) |
 * st0 [ST][D/64][BN][64] | st1 | (AL_SM90_DQ_ATOMIC: dS^T [2][R][BN]) | lse2 / D columns [ST][2][BN] f32
 * (B90_STAGE_COLS) | mbarriers (own full / empty [2], stage full / empty [ST]) and the persistent work items
 * [2] | (block mask: the tile list, u16 [AL_SM90_BM_LIST], and its count). The epilogue stages each
 * warpgroup's gradient rows in its own rows of the item's own buffer (b90_frag_to_own).
 * Check / bench: tests/cuda/flash_sm90_bwd_check.cu (both kernels and the pre pass against naive f32
 * gradients, then each kernel's time over the flash_bench shapes); in the library: luajit bench/flash_bench.lua.
 * Status: the default backward on sm_90 (ATTNLAB_FLASH_SM90_BWD=0 switches it off). Variants: compiled
 * with no spills (tests/c/test_nvrtc_kernels.c, test_flash_variant.c); on a GPU test_flash_variant compares
 * them with a double-precision oracle and with the stage-1 backward.
 */
#define AL_FL_BACKWARD 1   /* flash_common.cuh: score_mod and its gradient in the same terms, to share work */
#include "flash_common.cuh"
#include "sm90_common.cuh"

#if AL_ALIBI || AL_HEAD_DIM > 128
#error "flash_bwd_sm90.cu: d <= 128 without ALiBi (the stage-1 backward serves the rest)"
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
/* AL_SM90_DQ_ATOMIC 1 (role 0, d = 128, two consumers, no variant; the host's "dkdvq" kernel): the dK/dV
 * kernel also computes dQ, FA3's five-GEMM backward, instead of the dQ kernel recomputing S and dP (seven).
 * Each warpgroup stores its dS^T fragments (64 keys x 64 queries, 16-bit) into a shared buffer in the
 * 128-byte-swizzled layout TMA gives the tiles; after a named barrier of the two warpgroups, warpgroup w
 * computes dQ[:, 64w, 64w + 64) of the tile = dS (64 queries x 128 keys, MN-major from that buffer) K
 * (the owned K rows, MN-major: box w of own0), and adds it into the f32 accumulator p.dq_acc [B, H, SQ, D]
 * with red.global.add.v2.f32; the host zeroes it (the pre pass) and scales and converts it into dq after
 * (flash_bwd.cu's al_flash_bwd_dq). Two buffers alternate, so one barrier per tile orders both: a
 * warpgroup writes buffer j & 1 again only after the barrier of tile j + 1, which the other passes only
 * when its tile-j product (the last reader) has retired. Not deterministic (atomics); the host keeps the
 * two-kernel backward for `deterministic`. */
#ifndef AL_SM90_DQ_ATOMIC
#define AL_SM90_DQ_ATOMIC 0
#endif
#if AL_SM90_DQ_ATOMIC && (AL_SM90_ROLE != 0 || AL_VARIANT || AL_HEAD_DIM != 128 || AL_SM90_CONSUMERS != 2)
#error "AL_SM90_DQ_ATOMIC: the dK/dV kernel (role 0) at d = 128 with two consumers, no variant"
#endif
/* AL_SM90_PERSIST 1: a persistent kernel (the host launches one CTA per SM) walking the grid's work items in the
 * launch order, the next item taken from the counter p.sched_ctr[role] (zeroed by the host before the launch):
 * the own rows are double-buffered, so the producer loads the next item's K/V (Q/dO) and streams its first tiles
 * while the consumers finish the current one and write its gradients, which go out through the item's own buffer
 * (each warpgroup through its own rows). A CTA a work item paid its prologue (the owned rows' loads before the
 * first product) and its epilogue (the gradient stores) on an idle tensor pipe: ~8% of the causal backward's
 * time at 4x16x4096 (session 15). With a block mask the producer warp compacts each item's tile list (one list
 * per own buffer); variants since session 17. Not with the dQ atomics. */
#ifndef AL_SM90_PERSIST
#define AL_SM90_PERSIST 0
#endif
#if AL_SM90_PERSIST && AL_SM90_DQ_ATOMIC
#error "AL_SM90_PERSIST: not with AL_SM90_DQ_ATOMIC"
#endif
#if AL_BLOCK_MASK && !defined(AL_SM90_BM_LIST)
#error "AL_BLOCK_MASK needs AL_SM90_BM_LIST (the host's bound on stream tiles per CTA)"
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
constexpr int DS_BYTES = AL_SM90_DQ_ATOMIC ? R * BN * 2 : 0;   /* one dS^T buffer [R keys][BN queries] */
constexpr int COL_BYTES = 2 * BN * 4;         /* one stage's lse2 and D columns (role 0, plain path) */
constexpr int OWN_BUFS = AL_SM90_PERSIST ? 2 : 1;   /* own row buffers (own0 | own1 each) */
static_assert(BN == 64, "the S/dP products use the m64n64 wrappers");
}  // namespace b90

/* The sliced variant path (S and dP in f32, VN columns at a time) is needed only where a hook reads the
 * score: score_mod (and its gradient) or a capture gradient. A variant with mask_mod only (and/or a block
 * mask) takes the plain path, which applies mask_mod through al_fl_valid where the block is partial: the
 * sliced path's m64n16/n32 products made causal-through-mask_mod's backward 1.21-1.26x built-in causal. */
/* AL_SM90_LEAN_MOD 1 (the default since session 21, bf16 only; ATTNLAB_VARIANT_DEFINES=AL_SM90_LEAN_MOD=0 gives the
 * sliced path back for measurements): a score_mod without a capture gradient takes the plain path too
 * (B90_LEAN_MOD). On the H200 soft-capping's backward went from 1.27-1.32x the plain kernel (sliced) to
 * 1.08-1.20x (docs/PERFORMANCE.md, session 21). Step 2 computes P from the logit through
 * score_mod and, sharing its tanh / exp, score_grad's factor f = d(logit)/d(score) (score_grad is linear in its
 * grad argument: the chain rule), and packs P (dV's operand, dK/dV kernel only) and P f (zero where masked) in
 * bf16; step 4 is dS = (P f)(dP - D), as the plain path's P (dP - D). Session 14's first version kept f apart from
 * P (16 more registers: 24 bytes spilled at d = 128), evaluated tanh 1.5 times per element (the folded logit) and
 * loaded D from global memory; it was slower than the sliced path (docs/FLASH.md). */
#ifndef AL_SM90_LEAN_MOD
#define AL_SM90_LEAN_MOD 1
#endif
/* AL_BWD_EX2_FMA_EVERY k (an experiment, 0 = off; ATTNLAB_VARIANT_DEFINES): the lean path computes the
 * exponentials of every k-th n8 column group with al_ex2_fma (FMA pipe) instead of ex2.approx (MUFU), as the
 * forward's AL_EX2_FMA_EVERY: a soft-capped element costs the backward a tanh and an exponential on the MUFU in
 * each of its two kernels, against the plain path's exponential alone. On the H200 k = 8 and 4 were 1-4% slower
 * than the default (session 23): the backward is not bound by the MUFU's throughput. */
#ifndef AL_BWD_EX2_FMA_EVERY
#define AL_BWD_EX2_FMA_EVERY 0
#endif
/* AL_SM90_BWD_EARLY_DP (2, the default since session 28; 0, 1, 3 through ATTNLAB_VARIANT_DEFINES or a kernel folder's
 * edited default): the order of the dK/dV kernel's products and element-wise pass. 0 (the default until session 27):
 * dP^T is issued after step 2 has computed P. Otherwise dP^T = V dO^T goes out right behind S^T, in a commit group
 * of its own (the dQ kernel always did).
 * 1: dP^T runs while step 2 computes P, so step 2's exponentials (and a score_mod's tanh) leave the warpgroup's
 * critical path; dP^T's 32 accumulators are live through step 2, so the D columns are read from the stage's
 * shared-memory copy in step 4 instead of being held from step 1 (session 11's first try, with them held,
 * spilled 156 bytes). 2: S^T and dP^T both retire before one element-wise pass computes P and dS = P (dP - D)
 * (from P in f32, one rounding, where the packed P is unpacked otherwise), and dV += P^T dO and dK += dS^T Q go
 * out in one batch: two waits per tile instead of three, and no P f beside P in the lean path. 3 (FA3's order): as 1,
 * but dV waits for dS and goes out beside dK: two waits per tile, the P step under dP^T. Session 26 (H100, 11 rounds,
 * four runs): mode 2 in the soft-capped kernels alone 1-3% faster than the default at every b, and in every kernel
 * the plain backward 0-3% faster too; mode 3 slower than mode 2 at every b. Session 28 (H100, 11 rounds): every kernel
 * at mode 2 against the default then, plain 415-417 against 400-409 TFLOP/s, soft-capped 365-374 against 361-364;
 * attention_flash_spec and variants_spec passed with every kernel built so (224 / 0), then made the default. Every
 * backward specialisation and generated variant compiles without spills under it (session 27: soft-capping alone
 * spilled 8 bytes at 224 registers, so the lean dK/dV kernel takes 232 under mode 2, AL_SM90_BWD_CONSUMER_REGS below;
 * soft-capping beside a block-masked document mask_mod spilled 4 more, the work-item pointer: B90_ITEM_SMEM in the
 * kernel). */
#ifndef AL_SM90_BWD_EARLY_DP
#define AL_SM90_BWD_EARLY_DP 2
#endif
/* AL_SM90_BWD_DQ_ONE_PASS (an experiment, 0 = off; ATTNLAB_VARIANT_DEFINES, or a kernel folder's edited default): the
 * dQ kernel's counterpart of AL_SM90_BWD_EARLY_DP=2. Its dP is issued beside S already; here both retire before one
 * element-wise pass computes P (P f in the lean path) and dS = P (dP - D) in f32 and packs dS alone, rounded once:
 * the dQ kernel has no use for P itself, so the default's bf16 P (packed in step 2, unpacked in step 4) and its
 * 16 registers go, at the price of step 2 no longer running under dP. Beside mode 2 (session 26, four runs) within
 * -1.5% .. +3% of mode 2 alone: no clear gain. */
#ifndef AL_SM90_BWD_DQ_ONE_PASS
#define AL_SM90_BWD_DQ_ONE_PASS 0
#endif
#if AL_VARIANT && (AL_HAS_CAPTURE_GRAD || (AL_HAS_SCORE_MOD && !(AL_SM90_LEAN_MOD && AL_BF16)))
#define B90_SLICED 1
#else
#define B90_SLICED 0
#endif
#define B90_LEAN_MOD (AL_VARIANT && AL_HAS_SCORE_MOD && !B90_SLICED)
/* AL_SM90_BWD_CONSUMER_REGS (an experiment, ATTNLAB_VARIANT_DEFINES; default 224, and 232 in the lean dK/dV kernel
 * under AL_SM90_BWD_EARLY_DP=2, so that a kernel folder with mode 2 as its default compiles without spills): the
 * consumers' setmaxnreg, the producer warpgroup taking what is left (at most 56; 232 leaves it 40, 240 leaves 24):
 * room for dP^T's accumulators beside the P step (AL_SM90_BWD_EARLY_DP) in the soft-capped kernels. What is left is
 * counted from the registers the CTA holds at launch (LAUNCH_REGS per thread: __launch_bounds__(NT, 1) lets ptxas
 * use 168 of 170 at NT = 384), not from the register file: setmaxnreg.inc waits until the pool has what it asks
 * for, so asking for more than setmaxnreg.dec gave back hangs the kernel (session 24's 232 left the producer 48,
 * 8 x 128 registers too many: its first GPU run never returned, session 25). */
#if B90_LEAN_MOD && AL_SM90_ROLE == 0 && AL_SM90_BWD_EARLY_DP == 2 && !defined(AL_SM90_BWD_CONSUMER_REGS)
#define AL_SM90_BWD_CONSUMER_REGS 232   /* the soft-capped dK/dV kernel under mode 2 spills 8 bytes at 224, none here */
#endif
#ifndef AL_SM90_BWD_CONSUMER_REGS
#define AL_SM90_BWD_CONSUMER_REGS 224
#endif
namespace b90 {
constexpr int CONSUMER_REGS = AL_SM90_BWD_CONSUMER_REGS;
constexpr int LAUNCH_REGS = al_launch_regs(NT);
constexpr int PRODUCER_LEFT = (LAUNCH_REGS * NT - CONSUMER_REGS * 128 * NC) / 128 / 8 * 8;   /* setmaxnreg: x 8 */
constexpr int PRODUCER_REGS = PRODUCER_LEFT < 56 ? PRODUCER_LEFT : 56;
static_assert(CONSUMER_REGS % 8 == 0 && CONSUMER_REGS <= 256 && PRODUCER_REGS >= 24, "setmaxnreg's range");
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * NC <= LAUNCH_REGS * NT,
              "setmaxnreg.inc would wait for registers the CTA does not hold (a hang)");
}  // namespace b90
/* AL_SM90_BWD_PINGPONG (an experiment, 0 = off; ATTNLAB_VARIANT_DEFINES, or a kernel folder's edited default): the
 * two consumer warpgroups take turns to issue their products, as the forward's ping-pong. Both walk the same stream
 * tiles behind the same stage barriers, so without it they run in step: both issue S (and dP), both wait, both
 * compute P at once (a soft-capped element puts a tanh and an exponential on the MUFU: two warpgroups' P steps at
 * once take twice as long) while the tensor cores idle, then both issue dQ. ncu of the soft-capped dQ kernel
 * (2x16x4096x128, session 26): tensor pipe 61% busy, the MUFU 41%, against 81% / 27% in the plain kernel; that
 * lock-step model predicts 61% and 43%. With turns, warpgroup w waits on named barrier 4 + w before each batch of
 * products (a turn) and arrives on the other's after it, so one warpgroup's element-wise steps run under the other's
 * products. Warpgroup 1 opens with an arrive on warpgroup 0's barrier and warpgroup 0 closes with a sync on it,
 * per item, so that arrives and syncs pair up (named barriers 2 and 3 are the epilogue's, 1 the dQ atomics').
 * Measured neutral (H100, session 26): flash_ab's plain and soft-capped backward within 1% either way, outputs and
 * gradients bit-identical (19 cases); soft-capping's backward 0-1.6% faster in bench/variants.lua, within its noise.
 * So the lock-step model was wrong: ncu's stall samples of the soft-capped dQ kernel sit on the element-wise work
 * itself (MUFU queue 11% against 3.5% plain, issue 20%), not on the products' waits (12.5% against 20% plain).
 * In the dK/dV kernel the turns' barriers made ptxas spill 8-88 bytes: the dQ kernel only. */
#ifndef AL_SM90_BWD_PINGPONG
#define AL_SM90_BWD_PINGPONG 0
#endif
#define B90_PP (AL_SM90_BWD_PINGPONG && AL_SM90_ROLE == 1 && !B90_SLICED && AL_SM90_CONSUMERS == 2)
#if B90_PP
#define B90_TURN_BEGIN() al_named_sync(4 + cw, 256)
#define B90_TURN_END() al_named_arrive(5 - cw, 256)
#else
#define B90_TURN_BEGIN() ((void)0)
#define B90_TURN_END() ((void)0)
#endif
/* The dK/dV kernel's plain path gets each query tile's lse2 and D columns from shared memory: the producer warp
 * copies them with cp.async beside the tile's TMA loads (zero-filled past q_len, where P is masked anyway), and
 * the tile's "full" barrier also waits for those copies (32 more arrivals). The consumers used to load them
 * from global memory (32 4-byte loads a thread per tile, issued during S): ncu put 17% of the kernel's warp
 * stall samples on long-scoreboard waits and 5% on LG throttle (causal 4x16x4096x128, session 15). The sliced
 * variant path loads its own, per slice (read from this copy there, ALiBi's d = 128 dK/dV kernel spilled 32 bytes
 * and two soft-capping ones 8, session 15). */
#define B90_STAGE_COLS (AL_SM90_ROLE == 0 && !B90_SLICED)
#define B90_EARLY_DP (B90_STAGE_COLS && AL_SM90_BWD_EARLY_DP && !AL_SM90_DQ_ATOMIC)
#define B90_DQ_ONE_PASS (AL_SM90_ROLE == 1 && !B90_SLICED && AL_SM90_BWD_DQ_ONE_PASS)
#define B90_ONE_PASS ((B90_EARLY_DP && AL_SM90_BWD_EARLY_DP == 2) || B90_DQ_ONE_PASS)
#define B90_DV_WITH_DK (B90_EARLY_DP && AL_SM90_BWD_EARLY_DP == 3)

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

#if AL_BF16
/* a packed bf16 pair back to two f32 (exact: bf16 is the top half of an f32) */
AL_DEV void b90_unpack2(al_u32 v, float &lo, float &hi) {
    lo = __uint_as_float(v << 16);
    hi = __uint_as_float(v & 0xffff0000u);
}
#else
/* element-wise product of two packed f16 pairs, rounded once */
AL_DEV al_u32 b90_mul2(al_u32 a, al_u32 b) {
    al_u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#endif

/* The epilogue's row-block path (b90_vec_ok): the gradient's 16-bit rows go through shared memory so that the
 * global stores are 16-byte chunks, a warp writing whole rows, instead of 4-byte column pairs scattered over 8 rows
 * per warp instruction (the pair stores were 5% of the dK/dV kernel's stall samples, mostly LG throttle, session
 * 15). The rows are staged in an own buffer in its TMA layout ([D / 64][R][64] 16-bit values): 16-byte chunk ch of
 * row r at box ch / 8, chunk (ch % 8) ^ (r & 7) of the row's 128 bytes (the fragment writes of 8 rows x 4 column
 * pairs hit 32 distinct banks). */
AL_DEV int b90_vec_ok(const al_flash_op &op) {
    return op.dtype == (AL_BF16 ? AL_FLASH_DT_BF16 : AL_FLASH_DT_F16) && op.sc == 1 &&
           (reinterpret_cast<unsigned long long>(op.ptr) & 15ull) == 0 && (op.sb & 7) == 0 && (op.st & 7) == 0 &&
           (op.sh & 7) == 0;
}
AL_DEV al_u32 b90_own_chunk(al_u32 buf, int row, int ch) {
    return buf + (ch >> 3) * (b90::R * 128) + row * 128 + (((ch & 7) ^ (row & 7)) << 4);
}
/* a warpgroup's accumulator (rows rl, rl + 8 of the CTA's R) times mul into buf; rows with keep[r] == 0 get zeros */
AL_DEV void b90_frag_to_own(al_u32 buf, const float *acc, float mul, int rl, int tq, const int *keep) {
    using namespace b90;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = rl + 8 * r;
#pragma unroll
        for (int t = 0; t < D / 8; t++) {
            const al_u32 v = al_pack2(keep[r] ? acc[t * 4 + 2 * r] * mul : 0.0f, keep[r] ? acc[t * 4 + 2 * r + 1] * mul : 0.0f);
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(b90_own_chunk(buf, row, t) + tq * 4), "r"(v) : "memory");
        }
    }
}
/* buf's rows [r0, r0 + 64) with ok_row(r) to the gradient op at row offset row_off(r) (elements), 16 bytes a
 * thread per step over a warpgroup's threads ct = 0..127 */
template <typename RowOk, typename RowOff>
AL_DEV void b90_own_to_global(al_u32 buf, const al_flash_op &op, int ct, int r0, RowOk ok_row, RowOff row_off) {
    using namespace b90;
    constexpr int CPR = D / 8;                   /* 16-byte chunks per row */
    for (int c = ct; c < 64 * CPR; c += 128) {
        const int row = r0 + c / CPR, ch = c % CPR;
        if (!ok_row(row)) continue;
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(b90_own_chunk(buf, row, ch))
                     : "memory");
        *(uint4 *)((al_u16 *)op.ptr + row_off(row) + ch * 8) = v;
    }
}

/* acc[64 x 64] = A (owned rows of this warpgroup, K-major) * B^T (streamed tile, K-major), over D */
AL_DEV void b90_ss(float *acc, al_u32 own, al_u32 tile) {
    using namespace b90;
    const al_u64 da0 = al_desc_sw128(own, 16, 1024), db0 = al_desc_sw128(tile, 16, 1024);
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const al_u64 da = al_desc_off(da0, (ks >> 2) * (R * 128) + (ks & 3) * 32);
        const al_u64 db = al_desc_off(db0, (ks >> 2) * (BN * 128) + (ks & 3) * 32);
        al_wgmma_ss_n64(acc, da, db, ks > 0);
    }
}

#if B90_SLICED
/* acc[64 x D] += A (16-bit fragments of a 64 x BN accumulator) * tile (BN x D, MN-major), k-steps [k0, k1) */
AL_DEV void b90_rs_part(float *acc, const al_u32 (*pa)[4], al_u32 tile, int k0, int k1) {
    using namespace b90;
    const al_u64 d0 = al_desc_sw128(tile, BN * 128, 1024);
#pragma unroll
    for (int kk = k0; kk < k1; kk++) AL_WG_RS_D(acc, pa[kk], al_desc_off(d0, kk * (16 * 128)));
}
#endif

/* acc[64 x D] += A (16-bit fragments of a 64 x BN accumulator) * tile (BN x D, MN-major) */
AL_DEV void b90_rs(float *acc, const al_u32 (*pa)[4], al_u32 tile) {
    using namespace b90;
    const al_u64 d0 = al_desc_sw128(tile, BN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) AL_WG_RS_D(acc, pa[kk], al_desc_off(d0, kk * (16 * 128)));
}

#if AL_VARIANT
/* The variant path computes S and dP in f32 and runs the hooks on VN stream columns at a time, then adds
 * those columns' k-steps of the RS products, so only one slice of S, dP and their 16-bit fragments is
 * live next to the accumulators. VN = 32, except 16 in the dK/dV kernel at d = 128 with a mask_mod or a
 * capture gradient: there its two 64-register accumulators leave too little room under the consumers' 224
 * registers (VN = 32 spilled 4-200 bytes with those hooks in ptxas), and 64 (the whole tile, m64n64
 * products as the plain path: 20 wgmma per tile instead of 36) in the dQ kernel without a mask_mod (with
 * one, some hooks spilled; soft-capped backward 1.4-2% faster, session 12). Figures:
 * tests/c/test_nvrtc_kernels.c prints them, and checks 0 spills. */
#ifndef B90_VN
#if AL_SM90_ROLE == 0 && AL_HEAD_DIM > 64 && (AL_HAS_MASK_MOD || AL_HAS_CAPTURE_GRAD)
#define B90_VN 16
#elif AL_SM90_ROLE == 1 && !AL_HAS_MASK_MOD
#define B90_VN 64
#else
#define B90_VN 32
#endif
#endif

/* D[64 x 32] (+)= A[64 x 16] (smem desc) * B[16 x 32] (smem desc); both K-major */
AL_DEV void b90_wgmma_ss_n32(float *d, al_u64 da, al_u64 db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." AL_WG_T "." AL_WG_T " {%0, %1, %2, %3, %4, %5, %6, "
                 "%7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(accumulate));
}
/* D[64 x 16] (+)= A[64 x 16] (smem desc) * B[16 x 16] (smem desc); both K-major */
AL_DEV void b90_wgmma_ss_n16(float *d, al_u64 da, al_u64 db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32." AL_WG_T "." AL_WG_T " {%0, %1, %2, %3, %4, %5, %6, "
                 "%7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(accumulate));
}
AL_DEV void b90_fence_regs_vn(float *d) {
#pragma unroll
    for (int i = 0; i < B90_VN / 2; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* acc[64 x VN] = A (owned rows of this warpgroup, K-major) * B^T (rows [r0, r0 + VN) of the streamed tile;
 * r0 a multiple of 8, so the slice starts on a 1024-byte swizzle atom) */
AL_DEV void b90_ss_vn(float *acc, al_u32 own, al_u32 tile, int r0) {
    using namespace b90;
    const al_u64 da0 = al_desc_sw128(own, 16, 1024), db0 = al_desc_sw128(tile, 16, 1024);
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const al_u64 da = al_desc_off(da0, (ks >> 2) * (R * 128) + (ks & 3) * 32);
        const al_u64 db = al_desc_off(db0, (ks >> 2) * (BN * 128) + r0 * 128 + (ks & 3) * 32);
#if B90_VN == 16
        b90_wgmma_ss_n16(acc, da, db, ks > 0);
#elif B90_VN == 32
        b90_wgmma_ss_n32(acc, da, db, ks > 0);
#else
        al_wgmma_ss_n64(acc, da, db, ks > 0);
#endif
    }
}
#endif

/* With a block mask the loops walk a list of the CTA's non-empty stream tiles, compacted once per CTA into
 * shared memory by warp 0 (entry = stream index << 2 | block kind: 1 partial, mask_mod per element; 2
 * full, no mask_mod), as the forward does: a block-mask read in the loops would put a dependent global
 * load on every iteration, empty tiles included, and registers on the 56-register producer. Without a
 * block mask iteration j is stream tile j, every tile partial. */
#if AL_BLOCK_MASK
#define B90_TILE_OF(j) ((int)(bm_list[j] >> 2))
#define B90_KIND_OF(j) ((int)(bm_list[j] & 3u))
#else
#define B90_TILE_OF(j) (j)
#define B90_KIND_OF(j) 1
#endif

/* a compile-time flag passed to a generic lambda (NVRTC has no <type_traits>) */
template <bool B> struct b90_flag { static constexpr bool value = B; };

/* 1 when every element of the box (queries [q_lo, q_hi), keys [k_lo, k_hi), sequence-local) is inside the
 * lengths and the causal/window band, i.e. al_fl_valid(s, i, j, 0) holds for all of it (uniform per tile) */
AL_DEV int b90_box_inside(const al_fl_seq &s, int q_lo, int q_hi, int k_lo, int k_hi) {
    int in = q_hi <= s.q_len && k_hi <= s.kv_len;
#if AL_MASK_KIND != 0
    if (s.wl >= 0) in &= k_lo >= q_hi - 1 + s.diag - s.wl;
    if (s.wr >= 0) in &= k_hi - 1 <= q_lo + s.diag + s.wr;
#endif
    (void)q_lo;
    (void)k_lo;
    return in;
}

/* p.sched_hb (longest items first: the host sets it for causal and for block masks launched last block first,
 * p.m_reverse) is read by the kernels without a window, except variants walking a grid of one CTA per item:
 * there the computed coordinates live in registers where blockIdx was re-read for free, and three causal d = 128
 * variant dK/dV kernels spilled 4-8 bytes with them. A persistent kernel computes them once per item. */
#define B90_SCHED ((!AL_VARIANT || AL_SM90_PERSIST) && AL_MASK_KIND != 2)

#if AL_SM90_ROLE == 0
#define B90_NAME al_flash_bwd_sm90_dkdv
#else
#define B90_NAME al_flash_bwd_sm90_dq
#endif

/* One work item: owned row block bx of head hy (role 0: a kv head, role 1: a q head) of batch b, and the
 * stream tiles the mask lets it see (role 0: nstream = ntile query tiles x the GQA group; role 1: key tiles) */
struct b90_work {
    int b, hk, h;                    /* batch; kv head; q head (role 0: the group's first) */
    int own0, t_lo, ntile, nstream;  /* first owned row; first stream tile; tiles per q head; tiles in all */
    long long q_start, kv_start;     /* thd: the sequence's first token */
    al_fl_seq s;
};
AL_DEV b90_work b90_work_make(const al_flash_params &p, int bx, int hy, int b) {
    using namespace b90;
    b90_work w;
    const int group = p.H / p.HG;
    w.b = b;
    w.q_start = p.q_start ? p.q_start[b] : 0;
    w.kv_start = p.kv_start ? p.kv_start[b] : 0;
    w.own0 = bx * R;
#if AL_SM90_ROLE == 0
    w.hk = hy;                                       /* the stream visits its q heads */
    w.h = hy * group;
    w.s = al_fl_seq_make(p, b, w.h);
    /* queries that can see keys [own0, own_last] (the band's rule solved for i) */
    const int own_last = min(w.own0 + R, w.s.kv_len) - 1;
    int i_lo = 0, i_hi = w.own0 < w.s.kv_len ? w.s.q_len : 0;
#if AL_MASK_KIND != 0
    if (w.s.wr >= 0) i_lo = max(0, w.own0 - w.s.diag - w.s.wr);
    if (w.s.wl >= 0) i_hi = min(i_hi, own_last - w.s.diag + w.s.wl + 1);
#endif
    w.t_lo = i_lo / BN;
    w.ntile = i_hi > i_lo ? (i_hi + BN - 1) / BN - w.t_lo : 0;
    w.nstream = w.ntile * group;                     /* (q head in group, query tile) pairs; block mask: listed */
#else
    w.h = hy;
    w.hk = hy / group;
    w.s = al_fl_seq_make(p, b, w.h);
    const int own_last = min(w.own0 + R, w.s.q_len) - 1;
    int n_lo = 0, n_hi = w.own0 < w.s.q_len ? w.s.kv_len : 0;
#if AL_MASK_KIND != 0
    if (w.s.wl >= 0) n_lo = max(0, w.own0 + w.s.diag - w.s.wl);
    if (w.s.wr >= 0) n_hi = min(n_hi, own_last + w.s.diag + w.s.wr + 1);
#endif
    w.t_lo = n_lo / BN;
    w.nstream = n_hi > n_lo ? (n_hi + BN - 1) / BN - w.t_lo : 0;   /* key tiles; block mask: listed */
    w.ntile = w.nstream;
#endif
    return w;
}
#if AL_SM90_PERSIST
/* work item lin of the nx x ny x B list, in the launch order (the persistent kernels' producer and consumers) */
AL_DEV b90_work b90_work_at(const al_flash_params &p, int lin, int nx, int ny) {
    int x, y, z;
    al_fl_work_coords(B90_SCHED ? p.sched_hb : 0, AL_SM90_ROLE == 1, lin, nx, ny, p.B, x, y, z);
    return b90_work_make(p, x, y, z);
}
#endif

#if AL_BLOCK_MASK
/* The warp's lanes compact work item w's non-empty stream tiles into list / count: the mask's column (role 0:
 * key block own0 against every (query head, query tile)) or row (role 1: query block own0 against every key
 * tile), 32 tiles per ballot. The host keeps nstream <= AL_SM90_BM_LIST. */
AL_DEV void b90_list_tiles(const al_flash_params &p, const b90_work &w, unsigned short *list, int *count, int lane) {
    using namespace b90;
    /* (scalars captured by value: by reference, two extra integer multiplies stayed in the kernel) */
    const int b = w.b, hk = w.hk, h = w.h, ntile = w.ntile, t_lo = w.t_lo, own0 = w.own0, group = p.H / p.HG;
    (void)hk;
    (void)h;
    (void)ntile;
    (void)group;
#if AL_SM90_ROLE == 0
    al_sm90_list_tiles(list, count, w.nstream, lane, [&p, b, hk, group, ntile, t_lo, own0](int j) {
        return al_fl_block(p, b, hk * group + j / ntile, (t_lo + j % ntile) * BN, own0);
    });
#else
    al_sm90_list_tiles(list, count, w.nstream, lane, [&p, b, h, t_lo, own0](int j) {
        return al_fl_block(p, b, h, own0, (t_lo + j) * BN);
    });
#endif
}
#endif

extern "C" __global__ void __launch_bounds__(b90::NT, 1)
    B90_NAME(const __grid_constant__ al_flash_params p, const __grid_constant__ al_sm90_bwd_tmaps tm) {
    using namespace b90;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    const int group = p.H / p.HG;                    /* q heads per kv head (role 1 reads it in b90_work_make) */
    (void)group;
#if AL_SM90_PERSIST
    /* the work list: every (row block, head, batch) in the launch order of p.sched_hb, handed out one item at a
     * time by the counter p.sched_ctr[role] (a CTA takes the next when it starts one) */
    const int nx = ((AL_SM90_ROLE == 0 ? p.SKV : p.SQ) + R - 1) / R, ny = AL_SM90_ROLE == 0 ? p.HG : p.H;
    const int nwork = nx * ny * p.B;
    b90_work w;
#else
    /* causal: the longest blocks first (the dK/dV kernel's first key blocks see the most queries, the dQ
     * kernel's last query blocks the most keys), across heads in L2-sized sections (al_fl_cta_coords) */
    int bx, hy, bz;
    al_fl_cta_coords(B90_SCHED ? p.sched_hb : 0, AL_SM90_ROLE == 1, bx, hy, bz);
    b90_work w = b90_work_make(p, bx, hy, bz);
#endif

    const al_u32 base = (al_smem_addr(smem_raw) + 1023u) & ~1023u;
    const al_u32 sOwn = base;                       /* [OWN_BUFS][own0 | own1] */
#define SO0(ob) (sOwn + (al_u32)(ob) * (2 * OWN_BYTES))
#define SO1(ob) (SO0(ob) + OWN_BYTES)
    const al_u32 sS0 = sOwn + OWN_BUFS * 2 * OWN_BYTES, sS1 = sS0 + ST * ST_BYTES;
    const al_u32 sDS = sS1 + ST * ST_BYTES;          /* AL_SM90_DQ_ATOMIC: two dS^T buffers (else none) */
    const al_u32 sCol = sDS + 2 * DS_BYTES;          /* [ST][lse2 | D][BN] f32 (B90_STAGE_COLS; reserved always) */
    const al_u32 sBar = sCol + ST * COL_BYTES;
    /* own buffer k: loaded (OWN_F: the producer's arrival, with the TMA bytes) and, persistent, free again
     * (OWN_E: lane 0 of every consumer warp, after the item's epilogue); stream stage i: full and empty */
#define OWN_F(k) (sBar + 8u * (k))
#define OWN_E(k) (sBar + 8u * (2 + (k)))
#define BAR_F(i) (sBar + 8u * (4 + (i)))
#define BAR_E(i) (sBar + 8u * (4 + ST + (i)))
    /* the persistent work items [2] (int), after the barriers: written by the producer's lane 0, read by the
     * consumers (published by the OWN_F arrival). Under AL_SM90_BWD_EARLY_DP=2 through their shared-memory address,
     * from sBar where used: the pointer computed here, live across both roles' setmaxnreg, was the one value
     * spilled (4 bytes, stored once, loaded once per item) in soft-capping + document's d = 128 dK/dV kernel there.
     * (Tied to mode 2, the default since session 28, so that the other modes' SASS stays the one they were measured
     * with.) */
#define B90_ITEM_SMEM (AL_SM90_BWD_EARLY_DP == 2)
#define B90_S_ITEM(ob) (sBar + 8u * (4 + 2 * ST) + 4u * (ob))
#if !B90_ITEM_SMEM
    volatile int *s_item = (volatile int *)(smem_raw + (sBar - al_smem_addr(smem_raw)) + 8 * (4 + 2 * ST));
    (void)s_item;
#endif
    if (tid == 0) {
        for (int k = 0; k < OWN_BUFS; k++) {
            al_mbar_init(OWN_F(k), 1);
            al_mbar_init(OWN_E(k), 4 * NC);
        }
        for (int i = 0; i < ST; i++) {
            al_mbar_init(BAR_F(i), B90_STAGE_COLS ? 1 + 32 : 1);   /* + the producer lanes' cp.async arrivals */
            al_mbar_init(BAR_E(i), 4 * NC);   /* lane 0 of every consumer warp */
        }
        al_mbar_init_fence();
#if AL_SM90_ROLE == 0 && !AL_SM90_DQ_ATOMIC
        /* the dQ kernel, launched next with programmatic stream serialisation (the host's
         * al_flash_sm90_bwd_pdl), may start its CTAs on the SMs this grid frees at its end: it reads nothing
         * this kernel writes (dQ recomputes S and dP), and waits for this grid before it exits (below) */
        asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    }
#if AL_BLOCK_MASK
    /* the tile lists after the barriers, one per own buffer (the host's smem size counts 2 AL_SM90_BM_LIST + 16
     * bytes for each): list ob holds the item of own buffer ob. One CTA per item: warp 0 compacts it here;
     * persistent: the producer warp, per item, before it loads the item's rows (its OWN_F arrival publishes
     * the list to the consumers, whose OWN_E arrival after the item frees it again) */
    unsigned short *const bm_base = (unsigned short *)(smem_raw + (sBar - al_smem_addr(smem_raw)) + 8 * (5 + 2 * ST));
#define B90_BM_LIST(ob) (bm_base + (ob) * (AL_SM90_BM_LIST + 8))
#define B90_BM_COUNT(ob) ((int *)(B90_BM_LIST(ob) + AL_SM90_BM_LIST))
#if !AL_SM90_PERSIST
    if (tid < 32) b90_list_tiles(p, w, B90_BM_LIST(0), B90_BM_COUNT(0), tid);
    __syncthreads();
    w.nstream = *B90_BM_COUNT(0);
#else
    __syncthreads();
#endif
#else
    __syncthreads();
#endif

    if (wg == 0) {
        /* ---------------- producer: one warp ---------------- */
        al_reg_dealloc<PRODUCER_REGS>();
        const int warp = tid >> 5, lane = tid & 31;
        if (warp != 0) return;
        if (lane == 0) {
            al_tma_prefetch(&tm.own0);
            al_tma_prefetch(&tm.own1);
            al_tma_prefetch(&tm.st0);
            al_tma_prefetch(&tm.st1);
        }
        int jg = 0;                                  /* stream tiles so far, over the items: ring stage jg % ST */
        for (int it = 0;; it++) {
            const int ob = it % OWN_BUFS;            /* this item's own buffer */
#if AL_SM90_PERSIST
            al_mbar_wait(OWN_E(ob), ((it >> 1) & 1) ^ 1);   /* item it - 2's epilogue is done with it */
            int lin = 0;
            if (lane == 0) {
                lin = atomicAdd(p.sched_ctr + AL_SM90_ROLE, 1);
#if B90_ITEM_SMEM
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(B90_S_ITEM(ob)), "r"(lin) : "memory");
#else
                s_item[ob] = lin;                    /* published to the consumers by the OWN_F arrival below */
#endif
            }
            lin = __shfl_sync(0xffffffffu, lin, 0);
            if (lin >= nwork) {
                if (lane == 0) al_mbar_arrive(OWN_F(ob));   /* the end of the list */
                break;
            }
            w = b90_work_at(p, lin, nx, ny);
#if AL_BLOCK_MASK
            b90_list_tiles(p, w, B90_BM_LIST(ob), B90_BM_COUNT(ob), lane);
            __syncwarp();                            /* the lanes' list entries, before lane 0's OWN_F arrival */
            w.nstream = *(volatile int *)B90_BM_COUNT(ob);
#endif
#endif
#if AL_BLOCK_MASK
            const unsigned short *bm_list = B90_BM_LIST(ob);   /* B90_TILE_OF */
#endif
            const al_fl_seq &s = w.s;
            const int b = w.b, hk = w.hk, h = w.h, own0 = w.own0, t_lo = w.t_lo, ntile = w.ntile, nstream = w.nstream;
            const long long q_start = w.q_start, kv_start = w.kv_start;
            (void)h;
            (void)ntile;
            if (lane == 0) {
                if (nstream > 0) {
                    al_mbar_arrive_tx(OWN_F(ob), 2 * OWN_BYTES);
#if AL_SM90_ROLE == 0
                    const int ob0 = p.k.sb ? b : 0, ob1 = p.v.sb ? b : 0, orow = (int)(kv_start + own0), oh = hk;
#else
                    const int ob0 = p.q.sb ? b : 0, ob1 = p.dout.sb ? b : 0, orow = (int)(q_start + own0), oh = h;
#endif
#pragma unroll
                    for (int x = 0; x < BOXES; x++) {
                        al_tma_load_4d(SO0(ob) + x * (R * 128), &tm.own0, OWN_F(ob), x * 64, orow, oh, ob0);
                        al_tma_load_4d(SO1(ob) + x * (R * 128), &tm.own1, OWN_F(ob), x * 64, orow, oh, ob1);
                    }
                } else {
                    al_mbar_arrive(OWN_F(ob));       /* nothing to stream: the consumers write zeros */
                }
            }
            for (int j = 0; j < nstream; j++, jg++) {
                const int stg = jg % ST, ph = (jg / ST) & 1;
#if AL_SM90_ROLE == 0
                const int hq = hk * group + B90_TILE_OF(j) / ntile;    /* the q head of this tile */
                const int r0 = (t_lo + B90_TILE_OF(j) % ntile) * BN;   /* its first query row */
                const int len = s.q_len, b0 = p.q.sb ? b : 0, b1 = p.dout.sb ? b : 0, th = hq;
                const long long rs = q_start;
#define B90_OP0 p.q
#define B90_OP1 p.dout
#else
                const int r0 = (t_lo + B90_TILE_OF(j)) * BN;           /* first key row */
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
#if B90_STAGE_COLS
                {
                    /* the tile's lse2 and D columns (query rows r0 + c of head hq), two of each per lane */
                    const long long lrow = ((long long)b * p.H + hq) * p.SQ;
                    const al_u32 dc = sCol + stg * COL_BYTES;
#pragma unroll
                    for (int k = 0; k < BN / 32; k++) {
                        const int c = lane + 32 * k, in = r0 + c < len;
                        const long long o = lrow + (in ? r0 + c : 0);
                        al_cp_async4(dc + c * 4, p.lse2 + o, in ? 4 : 0);
                        al_cp_async4(dc + (BN + c) * 4, p.dsum + o, in ? 4 : 0);
                    }
                    al_cp_async_mbar_arrive(BAR_F(stg));
                }
#endif
            }
#if !AL_SM90_PERSIST
            break;
#endif
        }
#if B90_STAGE_COLS
        asm volatile("cp.async.wait_all;\n" ::: "memory");   /* no copy outlives its warp */
#endif
#if AL_SM90_ROLE == 1
        /* launched beside the dK/dV kernel's end (programmatic stream serialisation), this grid completes only
         * after that one: so work queued after the backward sees dK and dV written (a no-op otherwise) */
        if (lane == 0) asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
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
#if !B90_SLICED
    const float sl2 = p.scale_log2;
#endif
    int jg = 0;                                      /* stream tiles so far, over the items: ring stage jg % ST */
    for (int it = 0;; it++) {
        const int ob = it % OWN_BUFS;                    /* this item's own buffer */
        al_mbar_wait(OWN_F(ob), (it / OWN_BUFS) & 1);    /* its rows loaded (or nothing to load) */
#if AL_SM90_PERSIST
        {
#if B90_ITEM_SMEM
            int lin;
            asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(lin) : "r"(B90_S_ITEM(ob)) : "memory");
#else
            const int lin = s_item[ob];
#endif
            if (lin >= nwork) break;                     /* the end of the list */
            w = b90_work_at(p, lin, nx, ny);
#if AL_BLOCK_MASK
            w.nstream = *(volatile int *)B90_BM_COUNT(ob);   /* the producer's list of the item */
#endif
        }
#endif
#if AL_BLOCK_MASK
        const unsigned short *bm_list = B90_BM_LIST(ob);     /* B90_TILE_OF */
#endif
        const al_fl_seq &s = w.s;
        const int b = w.b, hk = w.hk, h = w.h, own0 = w.own0, t_lo = w.t_lo, ntile = w.ntile, nstream = w.nstream;
        const long long q_start = w.q_start, kv_start = w.kv_start;
        (void)hk;
        (void)h;
        (void)ntile;
        (void)q_start;
        (void)kv_start;
        const al_u32 a0 = SO0(ob) + cw * (64 * 128), a1 = SO1(ob) + cw * (64 * 128);

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
        if (B90_PP && cw == 1 && nstream > 0) al_named_arrive(4, 256);   /* warpgroup 0 takes the first turn */
        for (int j = 0; j < nstream; j++, jg++) {
            const int stg = jg % ST, ph = (jg / ST) & 1;
            const al_u32 t0 = sS0 + stg * ST_BYTES, t1 = sS1 + stg * ST_BYTES;
#if AL_SM90_ROLE == 0
            const int hq = hk * group + B90_TILE_OF(j) / ntile;
            const int c0 = (t_lo + B90_TILE_OF(j) % ntile) * BN;   /* first query column of the tile */
            const long long lrow = ((long long)b * p.H + hq) * p.SQ;   /* the sliced path's and dQ atomics' */
            (void)lrow;
#else
            const int c0 = (t_lo + B90_TILE_OF(j)) * BN;   /* first key column */
#endif
            al_mbar_wait(BAR_F(stg), ph);
#if B90_SLICED
            {
                /* the hooks' view of this tile: role 0's rows are keys and its columns queries */
#if AL_SM90_ROLE == 0
                al_fl_seq sv = s;                        /* the hooks' h: this tile's query head */
                sv.h = hq;
                const int q_lo = c0, q_n = BN, k_lo = own0 + cw * 64, k_n = 64;   /* this warpgroup's box */
#else
                const al_fl_seq &sv = s;
                const int q_lo = own0 + cw * 64, q_n = 64, k_lo = c0, k_n = BN;
#endif
                const int mod_on = B90_KIND_OF(j) == 1;  /* a full block (2) keeps what mask_mod keeps */
                /* flash_bwd.cu's rule: per element only where mask_mod runs or the box crosses the lengths/band */
                int need_mask = (AL_HAS_MASK_MOD && mod_on) || k_lo + k_n > sv.kv_len;
#if AL_MASK_KIND != 0
                if (sv.wr >= 0) need_mask |= k_lo + k_n - 1 > q_lo + sv.diag + sv.wr;
                if (sv.wl >= 0) need_mask |= k_lo < q_lo + q_n - 1 + sv.diag - sv.wl;
#endif
                (void)q_lo;
                (void)q_n;
#if AL_SM90_ROLE == 0
                al_u32 pa[BN / 16][4];                   /* P^T, for dV */
#endif
                al_u32 da[BN / 16][4];                   /* dS (dS^T), after score_grad */
#pragma unroll
                for (int h0 = 0; h0 < BN; h0 += B90_VN) {
                    /* V1. S (role 0: S^T = K Q^T) and dP (role 0: dP^T = V dO^T) of stream rows [h0, h0 + VN),
                     * in one batch, both kept in f32 */
                    float sc[B90_VN / 2], dp[B90_VN / 2];
                    al_wg_fence();
                    b90_ss_vn(sc, a0, t0, h0);
                    b90_ss_vn(dp, a1, t1, h0);
                    al_wg_commit();
                    al_wg_wait<0>();
                    b90_fence_regs_vn(sc);
                    b90_fence_regs_vn(dp);

                    /* V2. per element, as flash_bwd.cu: element e of n8 tile t is (owned row own0 + rl + 8 (e >> 1),
                     * column c0 + 8 t + 2 tq + (e & 1)); sc / dp hold the tiles t in [h0 / 8, (h0 + VN) / 8) */
#pragma unroll
                    for (int t = h0 / 8; t < (h0 + B90_VN) / 8; t++) {
                        const int tv = t - h0 / 8;
#if AL_SM90_ROLE == 0
                        float l2c[2], ddc[2], pv[4];
#pragma unroll
                        for (int c = 0; c < 2; c++) {
                            const int i = c0 + t * 8 + tq * 2 + c;
                            const int in = i < s.q_len;
                            l2c[c] = in ? __ldg(p.lse2 + lrow + i) : AL_POS_INF;
                            ddc[c] = in ? __ldg(p.dsum + lrow + i) : 0.0f;
                        }
#endif
                        float dsv[4];
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int orow = own0 + rl + ((e >> 1) << 3), col = c0 + t * 8 + tq * 2 + (e & 1);
#if AL_SM90_ROLE == 0
                            const int i = col, jk = orow;
                            const float l2 = l2c[e & 1], dd = ddc[e & 1];
#else
                            const int i = orow, jk = col;
                            const float l2 = lr[e >> 1], dd = dr[e >> 1];
#endif
                            const float raw = sc[tv * 4 + e];
                            float pe = al_ex2(al_fl_logit2(sv, raw, p.scale, p.scale_log2, 0.0f, i, jk) - l2);
#if AL_HAS_CAPTURE_GRAD && AL_SM90_ROLE == 0
                            const int keep = (!need_mask || al_fl_valid(sv, i, jk, mod_on)) && i < sv.q_len;
                            if (!keep) pe = 0.0f;
#else
                            if (need_mask && !al_fl_valid(sv, i, jk, mod_on)) pe = 0.0f;
#endif
                            float ds = pe * (dp[tv * 4 + e] - dd);
#if AL_HAS_CAPTURE_GRAD && AL_SM90_ROLE == 0
                            /* in this kernel only (the dQ kernel visits the same elements): once per kept element */
                            if (keep) AL_CAPTURE_GRAD(ds, raw * p.scale, sv.b, sv.h, i, jk);
#endif
#if AL_HAS_SCORE_MOD
                            ds = AL_FL_SCORE_GRAD(ds, raw, p.scale, sv.b, sv.h, min(i, sv.q_len - 1),
                                                  min(jk, sv.kv_len - 1));
#endif
#if AL_SM90_ROLE == 0
                            pv[e] = pe;
#endif
                            dsv[e] = ds;
                        }
#if AL_SM90_ROLE == 0
                        pa[t >> 1][(t & 1) * 2 + 0] = al_pack2(pv[0], pv[1]);
                        pa[t >> 1][(t & 1) * 2 + 1] = al_pack2(pv[2], pv[3]);
#endif
                        da[t >> 1][(t & 1) * 2 + 0] = al_pack2(dsv[0], dsv[1]);
                        da[t >> 1][(t & 1) * 2 + 1] = al_pack2(dsv[2], dsv[3]);
                    }

                    /* V3. this slice's k-steps of role 0's dV += P^T dO and dK += dS^T Q, or role 1's dQ += dS K
                     * (waited for here, so the slice's fragments die before the next slice's S and dP: leaving
                     * the wait to the next slice's V1 spilled 44 bytes in the d=128 dK/dV kernel, session 12) */
                    al_wg_fence();
#if AL_SM90_ROLE == 0
                    b90_rs_part(acc0, pa, t1, h0 / 16, (h0 + B90_VN) / 16);
                    b90_rs_part(acc1, da, t0, h0 / 16, (h0 + B90_VN) / 16);
#else
                    b90_rs_part(acc0, da, t0, h0 / 16, (h0 + B90_VN) / 16);
#endif
                    al_wg_commit();
                    al_wg_wait<0>();
                    AL_WG_FENCE_D(acc0);
#if AL_SM90_ROLE == 0
                    AL_WG_FENCE_D(acc1);
                    al_wg_fence_u32<4 * (B90_VN / 16)>(&pa[h0 / 16][0]);
#endif
                    al_wg_fence_u32<4 * (B90_VN / 16)>(&da[h0 / 16][0]);
                }
            }
#else
#if AL_HAS_MASK_MOD
            /* a mask_mod-only variant: the tile's keep bits (element e of n8 tile t: bit 4 t + e), evaluated before
             * S is live, so mask_mod's capture reads do not add to the P step's register peak (there the
             * document mask spilled 4 bytes in the d=128 dK/dV kernel). mask_mod runs in partial blocks (1), not
             * in full ones (2); the hooks' h is the tile's query head (role 0 streams the heads of a GQA group).
             * A full block whose whole box lies inside the lengths (and the band) keeps every element: no per-element
             * loop. Before, it ran on every tile, serially ahead of the S product, and causal through mask_mod + a
             * block mask took 1.17-1.22x built-in causal's backward (ncu, 2x16x8192x128: dK/dV 3.87 vs 2.93 ms). */
            unsigned keep = ~0u;
            const int mod_on = B90_KIND_OF(j) == 1;
#if AL_SM90_ROLE == 0
            const int box_in = b90_box_inside(s, c0, c0 + BN, own0, own0 + R);
#else
            const int box_in = b90_box_inside(s, own0, own0 + R, c0, c0 + BN);
#endif
            if (mod_on || !box_in) {
                keep = 0;
#if AL_SM90_ROLE == 0
                al_fl_seq sv = s;
                sv.h = hq;
#endif
#pragma unroll
                for (int t = 0; t < BN / 8; t++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int orow = own0 + rl + ((e >> 1) << 3), col = c0 + t * 8 + tq * 2 + (e & 1);
#if AL_SM90_ROLE == 0
                        const int ok = col < s.q_len && orow < s.kv_len && al_fl_valid(sv, col, orow, mod_on);
#else
                        const int ok = orow < s.q_len && al_fl_valid(s, orow, col, mod_on);
#endif
                        keep |= (unsigned)ok << (4 * t + e);
                    }
            }
#endif
            /* 1. S (role 0: S^T = K Q^T) */
            float sc[BN / 2];
#if AL_SM90_ROLE == 1 || B90_EARLY_DP
            float dp[BN / 2];
#endif
            B90_TURN_BEGIN();
            al_wg_fence();
            b90_ss(sc, a0, t0);
            al_wg_commit();
#if AL_SM90_ROLE == 1 || B90_EARLY_DP
            /* dP does not depend on P here: issued now, in a commit group of its own, it runs while step 2
             * computes P. ptxas moved the dP issue up between step 2's instructions by itself; with step 2 in two
             * copies behind a branch it could not, and dP waited for P (SASS, session 11). In the dK/dV kernel
             * dP^T beside its two accumulators and the hoisted columns spilled 156 bytes: not there. */
            b90_ss(dp, a1, t1);
            al_wg_commit();
#endif
            B90_TURN_END();
#if AL_SM90_ROLE == 0
            /* this thread's lse2 and D columns, read while S runs from the stage's copy in shared memory
             * (B90_STAGE_COLS), as 8-byte pairs. Loaded in step 2 instead, each through its own 64-bit address, and
             * right before their use behind S's wait, they cost the backward 24-27% (session 12); loaded from global
             * memory here, 17% of the warps' stall samples waited for them (session 15). Columns past q_len hold
             * zeros: every such element is masked in step 2. */
            const float *cs = (const float *)(smem_raw + (sCol + stg * COL_BYTES - al_smem_addr(smem_raw)));
#if !B90_EARLY_DP
            float l2v[BN / 8][2], ddc[BN / 8][2];
#pragma unroll
            for (int t = 0; t < BN / 8; t++) {
                const float2 lv = *(const float2 *)(cs + t * 8 + tq * 2);
                const float2 dv = *(const float2 *)(cs + BN + t * 8 + tq * 2);
                l2v[t][0] = lv.x;
                l2v[t][1] = lv.y;
                ddc[t][0] = dv.x;
                ddc[t][1] = dv.y;
            }
#endif
#if B90_ONE_PASS
            al_wg_wait<0>();                             /* S^T and dP^T retired */
            al_wg_fence_regs_n64(dp);
#elif B90_EARLY_DP
            al_wg_wait<1>();                             /* S retired; dP^T may still run */
#else
            al_wg_wait<0>();
#endif
#elif B90_DQ_ONE_PASS
            al_wg_wait<0>();                             /* S and dP retired */
            al_wg_fence_regs_n64(dp);
#else
            al_wg_wait<1>();                             /* S retired; dP may still run */
#endif
            al_wg_fence_regs_n64(sc);

            /* 2. P (P^T), packed to 16 bits at once (the f32 S dies here: register pressure). Element e of n8
             * tile t is (owned row rl + 8 (e >> 1), column c0 + 8 t + 2 tq + (e & 1)). Compiled twice: all_in
             * (a b90_flag) says every element of the tile is kept, and that copy has no per-element test. */
#if !B90_DQ_ONE_PASS
            al_u32 pa[BN / 16][4];
#endif
#if B90_ONE_PASS
            al_u32 da[BN / 16][4];                       /* dS (role 0: dS^T), computed beside P */
#endif
#if B90_LEAN_MOD
            /* role 0: P f beside P (dV's operand); role 1 needs no P, pa holds P f */
#if AL_SM90_ROLE == 0
#if !B90_ONE_PASS
            al_u32 pf[BN / 16][4];
#endif
            al_fl_seq sm = s;                            /* the hooks' h: this tile's query head */
            sm.h = hq;
#else
            const al_fl_seq &sm = s;
#endif
#endif
            auto p_step = [&](auto all_in) {
#pragma unroll
            for (int t = 0; t < BN / 8; t++) {
                float pe[4];
#if B90_LEAN_MOD && AL_SM90_ROLE == 0
                float fe[4];
#endif
#if B90_EARLY_DP
                /* lse2 (and D) of columns 2 tq, 2 tq + 1 from the stage's copy, here: dP^T's accumulators are live */
                const float2 lcol = *(const float2 *)(cs + t * 8 + tq * 2);
#endif
#if B90_ONE_PASS
                float de[4];
#if AL_SM90_ROLE == 0
                const float2 dcol = *(const float2 *)(cs + BN + t * 8 + tq * 2);
#endif
#endif
#if B90_LEAN_MOD
#if AL_BWD_EX2_FMA_EVERY > 0
                const bool fma_pipe = t % AL_BWD_EX2_FMA_EVERY == 0;   /* (t is a constant once unrolled) */
#else
                const bool fma_pipe = false;
#endif
#endif
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int orow = own0 + rl + ((e >> 1) << 3), col = c0 + t * 8 + tq * 2 + (e & 1);
#if AL_HAS_MASK_MOD
                    const int ok = decltype(all_in)::value || ((keep >> (4 * t + e)) & 1u);
                    (void)orow;
                    (void)col;
#elif AL_SM90_ROLE == 0
                    const int ok = decltype(all_in)::value ||
                                   (col < s.q_len && orow < s.kv_len && al_fl_valid(s, col, orow));
#else
                    const int ok = decltype(all_in)::value || (orow < s.q_len && al_fl_valid(s, orow, col));
#endif
#if AL_SM90_ROLE == 0
#if B90_EARLY_DP
                    const float l2 = (e & 1) ? lcol.y : lcol.x;
#else
                    const float l2 = l2v[t][e & 1];
#endif
#else
                    const float l2 = lr[e >> 1];
#endif
#if B90_LEAN_MOD
#if AL_SM90_ROLE == 0
                    const int qi = col, kj = orow;
#else
                    const int qi = orow, kj = col;
#endif
                    /* one tanh / exp for both: the logit and its gradient in the same terms (AL_FL_BACKWARD) */
                    const float raw = sc[t * 4 + e];
                    const float x2 = al_fl_logit2(sm, raw, p.scale, sl2, 0.0f, qi, kj) - l2;
                    const float pv = fma_pipe ? al_ex2_fma(x2) : al_ex2(x2);
                    const float fv = AL_FL_SCORE_GRAD(1.0f, raw, p.scale, sm.b, sm.h, min(qi, sm.q_len - 1),
                                                      min(kj, sm.kv_len - 1));
#if AL_SM90_ROLE == 0
                    pe[e] = ok ? pv : 0.0f;
                    fe[e] = ok ? pv * fv : 0.0f;
#else
                    pe[e] = ok ? pv * fv : 0.0f;
#endif
#else
                    pe[e] = ok ? al_ex2(fmaf(sc[t * 4 + e], sl2, -l2)) : 0.0f;
#endif
#if B90_ONE_PASS
                    /* dS = P (dP - D) from the f32 P (the lean dK/dV path: P f) */
#if AL_SM90_ROLE == 0
                    const float dd = (e & 1) ? dcol.y : dcol.x;
#else
                    const float dd = dr[e >> 1];
#endif
#if B90_LEAN_MOD && AL_SM90_ROLE == 0
                    de[e] = fe[e] * (dp[t * 4 + e] - dd);
#else
                    de[e] = pe[e] * (dp[t * 4 + e] - dd);
#endif
#endif
                }
#if !B90_DQ_ONE_PASS
                pa[t >> 1][(t & 1) * 2 + 0] = al_pack2(pe[0], pe[1]);
                pa[t >> 1][(t & 1) * 2 + 1] = al_pack2(pe[2], pe[3]);
#endif
#if B90_ONE_PASS
                da[t >> 1][(t & 1) * 2 + 0] = al_pack2(de[0], de[1]);
                da[t >> 1][(t & 1) * 2 + 1] = al_pack2(de[2], de[3]);
#elif B90_LEAN_MOD && AL_SM90_ROLE == 0
                pf[t >> 1][(t & 1) * 2 + 0] = al_pack2(fe[0], fe[1]);
                pf[t >> 1][(t & 1) * 2 + 1] = al_pack2(fe[2], fe[3]);
#endif
            }
            };
            /* the test-free copy: a tile whose whole box lies inside the lengths and the band (a uniform test), or
             * with mask_mod a full block (2) whose box does (keep is all ones there). Without it, causal through
             * mask_mod + a block mask took 1.10-1.13x built-in causal's backward (session 12). */
#if AL_HAS_MASK_MOD
            if (!mod_on && box_in) p_step(b90_flag<true>());
#elif AL_SM90_ROLE == 0
            if (b90_box_inside(s, c0, c0 + BN, own0, own0 + R)) p_step(b90_flag<true>());
#else
            if (b90_box_inside(s, own0, own0 + R, c0, c0 + BN)) p_step(b90_flag<true>());
#endif
            else p_step(b90_flag<false>());

#if B90_DQ_ONE_PASS
            /* 5. dQ += dS K (dS came out of step 2) */
            B90_TURN_BEGIN();
            al_wg_fence();
            b90_rs(acc0, da, t0);
            al_wg_commit();
            B90_TURN_END();
            al_wg_wait<0>();
            AL_WG_FENCE_D(acc0);
            al_wg_fence_u32<4 * (BN / 16)>(&da[0][0]);
#elif B90_ONE_PASS
            /* 3-5 in one batch: dV += P^T dO and dK += dS^T Q (dS came out of step 2) */
            al_wg_fence();
            b90_rs(acc0, pa, t1);
            b90_rs(acc1, da, t0);
            al_wg_commit();
            al_wg_wait<0>();
            AL_WG_FENCE_D(acc0);
            AL_WG_FENCE_D(acc1);
            al_wg_fence_u32<4 * (BN / 16)>(&pa[0][0]);
            al_wg_fence_u32<4 * (BN / 16)>(&da[0][0]);
#else
            /* 3. dP (role 0: dP^T = V dO^T), and role 0's dV += P^T dO in the same batch; the dQ kernel's dP was
             * issued in step 1 */
#if AL_SM90_ROLE == 1 || B90_DV_WITH_DK
            al_wg_wait<0>();
#elif B90_EARLY_DP
            al_wg_fence();
            b90_rs(acc0, pa, t1);
            al_wg_commit();
            al_wg_wait<0>();
#else
            float dp[BN / 2];
            al_wg_fence();
            b90_ss(dp, a1, t1);
            b90_rs(acc0, pa, t1);
            al_wg_commit();
            al_wg_wait<0>();
#endif
            al_wg_fence_regs_n64(dp);
#if AL_SM90_ROLE == 0 && !B90_DV_WITH_DK
            AL_WG_FENCE_D(acc0);
#if B90_LEAN_MOD
            al_wg_fence_u32<4 * (BN / 16)>(&pa[0][0]);   /* dV's operand, retired: step 4 reads P f */
#endif
#endif

            /* 4. dS = P (dP - D). The f32 P died in step 2 to save registers. bf16: in f32 from the packed
             * P (it unpacks exactly), rounded to bf16 once; the first version's bf16 (dP - D) times bf16 P
             * in a bf16 multiply rounded three times and put a dQ element of attention_flash_spec's window
             * (12,0) + padding case 0.019 off, over TE's 0.015. f16 (8x finer rounding, within its 2.5e-3
             * there) keeps the packed f16x2 multiply: unpacking f16 costs registers the d=128 dK/dV kernel
             * does not have (it spilled 32-36 bytes). */
            al_u32 da[BN / 16][4];
#pragma unroll
            for (int t = 0; t < BN / 8; t++)
#pragma unroll
                for (int h2 = 0; h2 < 2; h2++) {         /* h2: row rl (0) or rl + 8 (1) */
#if B90_EARLY_DP
                    const float2 dv = *(const float2 *)(cs + BN + t * 8 + tq * 2);
                    const float d0 = dv.x, d1 = dv.y;
#elif AL_SM90_ROLE == 0
                    const float d0 = ddc[t][0], d1 = ddc[t][1];
#else
                    const float d0 = dr[h2], d1 = dr[h2];
#endif
#if AL_BF16
                    float p0, p1;
#if B90_LEAN_MOD && AL_SM90_ROLE == 0
                    b90_unpack2(pf[t >> 1][(t & 1) * 2 + h2], p0, p1);   /* P f */
#else
                    b90_unpack2(pa[t >> 1][(t & 1) * 2 + h2], p0, p1);
#endif
                    da[t >> 1][(t & 1) * 2 + h2] =
                        al_pack2(p0 * (dp[t * 4 + 2 * h2] - d0), p1 * (dp[t * 4 + 2 * h2 + 1] - d1));
#else
                    const al_u32 g2 = al_pack2(dp[t * 4 + 2 * h2] - d0, dp[t * 4 + 2 * h2 + 1] - d1);
                    da[t >> 1][(t & 1) * 2 + h2] = b90_mul2(pa[t >> 1][(t & 1) * 2 + h2], g2);
#endif
                }
#if !(B90_LEAN_MOD && AL_SM90_ROLE == 0)
            al_wg_fence_u32<4 * (BN / 16)>(&pa[0][0]);
#endif
#if AL_SM90_DQ_ATOMIC
            /* dS^T into buffer j & 1: fragment (t, h2) is key row rl + 8 h2, query columns 8 t + 2 tq (+1), i.e.
             * 16-byte chunk t of a 128-byte row, swizzled to chunk t ^ (row & 7) (8 rows x 4 tq per warp and t:
             * 32 distinct banks) */
            const al_u32 sds = sDS + (j & 1) * DS_BYTES;
#pragma unroll
            for (int t = 0; t < BN / 8; t++)
#pragma unroll
                for (int h2 = 0; h2 < 2; h2++) {
                    const int key = rl + 8 * h2;
                    const al_u32 a = sds + key * 128 + (((t ^ key) & 7) << 4) + tq * 4;
                    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(a), "r"(da[t >> 1][(t & 1) * 2 + h2]) : "memory");
                }
            al_fence_proxy_async();
#endif

            /* 5. role 0: dK += dS^T Q; role 1: dQ += dS K (B90_DV_WITH_DK: dV += P^T dO beside it) */
            B90_TURN_BEGIN();
            al_wg_fence();
#if B90_DV_WITH_DK
            b90_rs(acc0, pa, t1);
#endif
#if AL_SM90_ROLE == 0
            b90_rs(acc1, da, t0);
#else
            b90_rs(acc0, da, t0);
#endif
            al_wg_commit();
            B90_TURN_END();
#if AL_SM90_DQ_ATOMIC
            /* 6. dQ[:, 64 cw, + 64) of this tile = dS K_own, once both warpgroups' dS^T halves are in the buffer
             * and dK's product has retired (with dS's fragments still live beside dQ's 32 accumulators the kernel
             * spilled 12-16 bytes), then added into dq_acc */
            al_wg_wait<0>();
            AL_WG_FENCE_D(acc1);
            al_wg_fence_u32<4 * (BN / 16)>(&da[0][0]);
            float dqp[32];
            al_named_sync(1, 256);
            {
                const al_u64 dd0 = al_desc_sw128(sds, R * 128, 1024);                   /* dS: 64 q x R keys */
                const al_u64 dk0 = al_desc_sw128(SO0(0) + cw * (R * 128), R * 128, 1024);  /* K_own, d box cw */
#pragma unroll
                for (int kk = 0; kk < R / 16; kk++)
                    al_wgmma_ss_n64_tt(dqp, al_desc_off(dd0, kk * (16 * 128)), al_desc_off(dk0, kk * (16 * 128)),
                                       kk > 0);
            }
            al_wg_commit();
#endif
            al_wg_wait<0>();
#if AL_SM90_ROLE == 0
            AL_WG_FENCE_D(acc1);
#else
            AL_WG_FENCE_D(acc0);
#endif
#if B90_DV_WITH_DK
            AL_WG_FENCE_D(acc0);
            al_wg_fence_u32<4 * (BN / 16)>(&pa[0][0]);
#endif
            al_wg_fence_u32<4 * (BN / 16)>(&da[0][0]);
#endif /* B90_ONE_PASS */
#if AL_SM90_DQ_ATOMIC
            al_wg_fence_regs_n64(dqp);
            if (lane == 0) al_mbar_arrive(BAR_E(stg));
            {
                /* element (t, e) of the accumulator: query c0 + 16 wq + g + 8 (e >> 1), d column 64 cw + 8 t + 2 tq
                 * + (e & 1); rows past the sequence hold zeros (P = 0) and are skipped */
                float *qa = p.dq_acc + (lrow + c0) * D + cw * 64 + tq * 2;
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int q = wq * 16 + g + 8 * r;
                    if (c0 + q < s.q_len) {
#pragma unroll
                        for (int t = 0; t < 8; t++)
                            asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(qa + (long long)q * D + t * 8),
                                         "f"(dqp[t * 4 + 2 * r]), "f"(dqp[t * 4 + 2 * r + 1])
                                         : "memory");
                    }
                }
            }
            continue;
#endif
#endif /* B90_SLICED */
            if (lane == 0) al_mbar_arrive(BAR_E(stg));
        }
        if (B90_PP && cw == 0 && nstream > 0) al_named_sync(4, 256);   /* warpgroup 1's last arrive */

        /* epilogue: through the caller's strides and dtype (dense rows past the sequence: zeros). Gradients in the
         * kernel's 16-bit dtype with unit column stride and 16-byte-aligned rows (the usual case: separate or packed
         * buffers alike) go through shared memory as row blocks of 16-byte stores (b90_frag_to_own /
         * b90_own_to_global; session 15: -1 to -3.5% backward); with 4-byte-aligned rows a column pair per 32-bit
         * store (al_pack2 rounds as al_st_elem does, so all three paths write the same bits); others element by
         * element through al_st_elem's dtype switch */
        const float scale = p.scale;
        /* the row-block path: both gradients (role 0) or dQ in the kernel's dtype with 16-byte aligned rows (uniform).
         * Each warpgroup stages its 64 rows in its own rows of the item's own buffer (own0: dK or dQ, own1: dV),
         * which only its products read: free once its four warps are past their last product (with the dQ atomics
         * the last product reads both warpgroups' K rows: all consumers wait there) */
#if AL_SM90_ROLE == 0
        const int vec = b90_vec_ok(p.dk) && b90_vec_ok(p.dv);
#else
        const int vec = b90_vec_ok(p.dq);
#endif
        if (vec) {
            int keep[2];
#pragma unroll
            for (int r = 0; r < 2; r++) keep[r] = own0 + rl + 8 * r < (AL_SM90_ROLE == 0 ? s.kv_len : s.q_len);
#if AL_SM90_DQ_ATOMIC
            al_named_sync(1, 128 * NC);
#else
            al_named_sync(2 + cw, 128);
#endif
#if AL_SM90_ROLE == 0
            b90_frag_to_own(SO0(ob), acc1, scale, rl, tq, keep);
            b90_frag_to_own(SO1(ob), acc0, 1.0f, rl, tq, keep);
#else
            b90_frag_to_own(SO0(ob), acc0, scale, rl, tq, keep);
#endif
            al_named_sync(2 + cw, 128);
#if AL_SM90_ROLE == 0
            /* rows past SKV are not there; thd's gaps (rows past kv_len, sb = 0) were zero-filled by the host */
            const auto ok_row = [&](int r) { return own0 + r < p.SKV && (p.k.sb != 0 || own0 + r < s.kv_len); };
            b90_own_to_global(SO0(ob), p.dk, tid & 127, cw * 64, ok_row, [&](int r) {
                return b * p.dk.sb + (kv_start + own0 + r) * p.dk.st + (long long)hk * p.dk.sh; });
            b90_own_to_global(SO1(ob), p.dv, tid & 127, cw * 64, ok_row, [&](int r) {
                return b * p.dv.sb + (kv_start + own0 + r) * p.dv.st + (long long)hk * p.dv.sh; });
#else
            const auto ok_row = [&](int r) { return own0 + r < p.SQ && (p.q.sb != 0 || own0 + r < s.q_len); };
            b90_own_to_global(SO0(ob), p.dq, tid & 127, cw * 64, ok_row, [&](int r) {
                return b * p.dq.sb + (q_start + own0 + r) * p.dq.st + (long long)h * p.dq.sh; });
#endif
        } else {
            /* otherwise: column pairs or elements through the caller's strides and dtype */
            const auto pair_ok = [](const al_flash_op &op, long long o) {
                return op.dtype == (AL_BF16 ? AL_FLASH_DT_BF16 : AL_FLASH_DT_F16) && op.sc == 1 &&
                       ((reinterpret_cast<unsigned long long>(op.ptr) + 2ull * (unsigned long long)o) & 3ull) == 0;
            };
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = own0 + rl + 8 * r;
#if AL_SM90_ROLE == 0
                if (row >= p.SKV || (p.k.sb == 0 && row >= s.kv_len)) continue;   /* thd: gaps were zero-filled */
                const int ok = row < s.kv_len;
                const long long ko = b * p.dk.sb + (kv_start + row) * p.dk.st + (long long)hk * p.dk.sh;
                const long long vo = b * p.dv.sb + (kv_start + row) * p.dv.st + (long long)hk * p.dv.sh;
                if (pair_ok(p.dk, ko + tq * 2) && pair_ok(p.dv, vo + tq * 2)) {
#pragma unroll
                    for (int t = 0; t < D / 8; t++) {
                        const int d = t * 8 + tq * 2;
                        *(al_u32 *)((al_u16 *)p.dk.ptr + ko + d) = al_pack2(ok ? acc1[t * 4 + 2 * r] * scale : 0.0f,
                                                                            ok ? acc1[t * 4 + 2 * r + 1] * scale : 0.0f);
                        *(al_u32 *)((al_u16 *)p.dv.ptr + vo + d) =
                            al_pack2(ok ? acc0[t * 4 + 2 * r] : 0.0f, ok ? acc0[t * 4 + 2 * r + 1] : 0.0f);
                    }
                    continue;
                }
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
                if (pair_ok(p.dq, qo + tq * 2)) {
#pragma unroll
                    for (int t = 0; t < D / 8; t++)
                        *(al_u32 *)((al_u16 *)p.dq.ptr + qo + t * 8 + tq * 2) =
                            al_pack2(ok ? acc0[t * 4 + 2 * r] * scale : 0.0f,
                                     ok ? acc0[t * 4 + 2 * r + 1] * scale : 0.0f);
                    continue;
                }
#pragma unroll
                for (int t = 0; t < D / 8; t++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int d = t * 8 + tq * 2 + e;
                        al_st_elem(p.dq.ptr, p.dq.dtype, qo + d * p.dq.sc, ok ? acc0[t * 4 + 2 * r + e] * scale : 0.0f);
                    }
#endif
            }
        }
#if AL_SM90_PERSIST
        /* the item's own buffer back to the producer: the generic proxy's reads and writes of it ordered before the
         * TMA (async proxy) loads of item it + 2 */
        al_fence_proxy_async();
        __syncwarp();
        if (lane == 0) al_mbar_arrive(OWN_E(ob));
#else
        break;
#endif
    }
#undef SO0
#undef SO1
#undef OWN_F
#undef OWN_E
#undef BAR_F
#undef BAR_E
#if AL_BLOCK_MASK
#undef B90_BM_LIST
#undef B90_BM_COUNT
#endif
}
