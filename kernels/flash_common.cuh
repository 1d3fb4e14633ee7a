/*
 * kernels/flash_common.cuh — device helpers shared by kernels/flash_fwd.cu and kernels/flash_bwd.cu
 * (compiled at run time by NVRTC, src/cuda/nvrtc_cache.cu; no CUDA headers needed).
 *
 *   specialisation defines   AL_HEAD_DIM (64|128|256), AL_BF16 (1 bf16, 0 f16), AL_MASK_KIND
 *                            (0 none, 1 causal, 2 window), AL_BOTTOM_RIGHT (0|1), AL_ALIBI (0|1)
 *   PTX wrappers             cp.async (16 B, zero-fill), ldmatrix x4 (.trans), mma.sync m16n8k16 with
 *                            f32 accumulation, ex2.approx, bf16x2/f16x2 packing
 *   swizzled tiles           a [rows][AL_HEAD_DIM] 16-bit tile in shared memory: the 16-byte chunk c of
 *                            row r sits at chunk c ^ (r & 7), so the 8 row addresses of one ldmatrix
 *                            phase hit 8 different bank groups (no padding, no conflicts)
 *   masking and scores       al_fl_valid (the plan's exact rule, attention_internal.h) and the hooks
 *
 * Hooks (the variants issue: src/cuda/flash_specs.h's al_flash_variant_source() turns an
 * al_attn_variant's snippets into these macros, prepended to the kernel source; define them before
 * this file is included). Every hook is expanded where an al_fl_seq named `s` is in scope, so
 * AL_CAP / AL_CAP_GRAD work inside any hook expression. b, h, q_idx, kv_idx are 0-based ints: b the
 * batch entry, h the QUERY head, q_idx / kv_idx sequence-local and always in range (q_idx < the
 * sequence's q length, kv_idx < its kv length: the kernels clamp or skip out-of-range tile rows, so
 * a hook may index captured tensors with them without bounds checks).
 *   AL_SCORE_MOD(score, b, h, q_idx, kv_idx)   -> float. score is the scaled logit (natural-log
 *       units, softmax_scale already applied, ALiBi not yet); returns the new logit. Default: score.
 *   AL_SCORE_MOD_GRAD(grad, score, b, h, q_idx, kv_idx) -> float: the backward's d(new)/d(score)
 *       times grad, grad = dL/d(new logit), score the unmodified scaled logit. Default: grad (an
 *       additive modification). Must be defined with AL_SCORE_MOD when it is not additive.
 *   AL_SCORE_PRE(acc, scale, b, h, q_idx, kv_idx) -> float, with AL_SCORE_POST (a float literal > 0):
 *       optional folded form of AL_SCORE_MOD, new logit = AL_SCORE_PRE(...) * AL_SCORE_POST, acc the
 *       raw q.k product, scale softmax_scale. Constant factors on score fold into scale (the compiler
 *       hoists scale * c out of the loops) and AL_SCORE_POST * log2(e) into the softmax's exponent
 *       (one FFMA per element, as without a hook): soft-capping costs one FMUL and a tanh per score
 *       instead of four FMULs and a tanh. Defined only beside AL_SCORE_MOD (attention.c checks). The
 *       backward kernels ignore it where AL_SCORE_MOD_GRAD is defined (AL_FL_BACKWARD, below).
 *   AL_SCORE_MOD_MAX (a float literal): an upper bound of AL_SCORE_MOD's value over every input, at most 64 above
 *       its lower bound (the host defines it only then: al_flash_hooks_of). The Hopper forward at bf16 takes it as
 *       every row's softmax max (AL_FL_FIXED_MAX in flash_fwd_sm90.cu); the other kernels ignore it.
 *   AL_EX2_FMA_EVERY k (0 or unset = off): the Hopper forward computes the exponentials of every k-th
 *       n8 column group of its score tiles with al_ex2_fma (FMA pipe) instead of ex2.approx (MUFU), so
 *       that a score_mod with its own MUFU operation (tanh, exp, log, sqrt) leaves the multi-function
 *       unit less loaded; the generated prelude defines it when the expression holds one.
 *   AL_TANH_FMA_EVERY k (an experiment, bf16; ATTNLAB_VARIANT_DEFINES): the Hopper forward evaluates a
 *       score_mod's tanh in every k-th n8 column group (t % k == k - 1, apart from AL_EX2_FMA_EVERY's) with
 *       al_tanh_fma; the prelude's al_v_tanh macro reads al_fl_mod_pre's al_tanh_fma_now flag.
 *   AL_MASK_MOD(b, h, q_idx, kv_idx)           -> int, nonzero = keep (FlexAttention's mask_mod).
 *       Applied on top of the length/causal/window rule (they compose: an element is kept when both
 *       keep it). Default: 1 (and no per-element cost).
 *   AL_CAPTURE_GRAD(grad, score, b, h, q_idx, kv_idx)  statement(s), backward only: run once for every
 *       KEPT element (inside the lengths, the causal/window band, the block mask and mask_mod) with
 *       grad = dL/d(new logit) (f32, after the softmax backward, before AL_SCORE_MOD_GRAD) and score
 *       the unmodified scaled logit; accumulates into AL_CAP_GRAD(k) with atomicAdd. Default: nothing.
 *   AL_CAP(k)        const void *: capture k's data pointer (params.cap[k], storage offset applied);
 *                    cast and index it yourself with the strides baked into the snippet (only the
 *                    pointer travels), e.g. ((const int *)AL_CAP(0))[b * 4096 + kv_idx].
 *   AL_CAP_GRAD(k)   float *: capture k's gradient accumulator (params.cap_grad[k]), or NULL.
 *   prelude          the variant's optional device helpers, placed first (before this file and the
 *                    hooks, so they see no attnlab types): e.g. static __device__ float f(float x).
 * Each hook body is one macro line (al_flash_variant_source turns newlines into spaces; attention.c
 * rejects // comments in hooks). Hooks may be evaluated for elements that end up masked (score_mod
 * runs on every position of a visited tile, before the mask), but never with out-of-range indices
 * (tile positions past the lengths get clamped indices and are discarded).
 * AL_VARIANT 1 marks a variant specialisation: the kernels then take their params as
 * __grid_constant__ (AL_CAP reads them through a pointer kept in al_fl_seq, without a local copy).
 * AL_BLOCK_MASK 1 (with params.bmask): the forward skips KV tiles whose block is 0 and does not
 * evaluate mask_mod in blocks that are 2 (the length and causal/window tests still run where a tile
 * crosses them); the backward does the same over its (Q tile, KV tile) pairs. A row whose every tile
 * is skipped gets O = 0 and LSE = -inf, like a fully masked row.
 * Defining AL_SCORE_MOD or AL_MASK_MOD switches off the folded scale*log2(e) fast path or the
 * full-tile fast path respectively (the block mask restores the latter for its full blocks).
 * Without any hook defined the kernels are exactly the default specialisations.
 */
#ifndef ATTNLAB_FLASH_COMMON_CUH
#define ATTNLAB_FLASH_COMMON_CUH

#include "flash_params.h"

#ifndef AL_HEAD_DIM
#error "AL_HEAD_DIM must be defined (64, 128 or 256)"
#endif
#if AL_HEAD_DIM != 64 && AL_HEAD_DIM != 128 && AL_HEAD_DIM != 256
#error "AL_HEAD_DIM must be 64, 128 or 256"
#endif
#ifndef AL_BF16
#define AL_BF16 1
#endif
#ifndef AL_MASK_KIND
#define AL_MASK_KIND 0
#endif
#ifndef AL_BOTTOM_RIGHT
#define AL_BOTTOM_RIGHT 0
#endif
#ifndef AL_ALIBI
#define AL_ALIBI 0
#endif

#ifdef AL_SCORE_MOD
#define AL_HAS_SCORE_MOD 1
#else
#define AL_HAS_SCORE_MOD 0
#define AL_SCORE_MOD(score, b, h, q_idx, kv_idx) (score)
#endif
/* The backward files define AL_FL_BACKWARD before this header. There the logit of a score_mod with a gradient and
 * its gradient must be written in the same terms, so that the compiler merges what they share: soft-capping's tanh
 * becomes one MUFU op per element instead of two (tanh(acc * (scale / 30)) and tanh((acc * scale) / 30) round
 * their arguments differently, so they cannot be merged). With AL_SCORE_GRAD_PRE (score_grad folded as score_pre
 * folds score_mod, session 23) both are folded, as in the forward: soft-capping's logit costs one FMUL, the tanh
 * and one FFMA into the exponent, its gradient one FFMA. Without it both are unfolded (AL_SCORE_MOD of score =
 * acc * scale): the logit then takes two more multiplies per element (scale, then 1 / 30; 30, then log2(e)).
 * AL_FL_SCORE_GRAD(grad, acc, scale, ...) is the gradient in whichever terms the logit uses. */
#if defined(AL_SCORE_PRE) && !(defined(AL_FL_BACKWARD) && defined(AL_SCORE_MOD_GRAD) && !defined(AL_SCORE_GRAD_PRE))
#define AL_HAS_SCORE_PRE 1
#ifndef AL_SCORE_POST
#define AL_SCORE_POST 1.0f
#endif
#else
#define AL_HAS_SCORE_PRE 0
#endif
#ifndef AL_EX2_FMA_EVERY
#define AL_EX2_FMA_EVERY 0
#endif
#ifndef AL_SCORE_MOD_GRAD
#define AL_SCORE_MOD_GRAD(grad, score, b, h, q_idx, kv_idx) (grad)
#endif
#if AL_HAS_SCORE_PRE && defined(AL_SCORE_GRAD_PRE)
#define AL_FL_SCORE_GRAD(grad, acc, scale, b, h, q_idx, kv_idx) AL_SCORE_GRAD_PRE(grad, acc, scale, b, h, q_idx, kv_idx)
#else
#define AL_FL_SCORE_GRAD(grad, acc, scale, b, h, q_idx, kv_idx) AL_SCORE_MOD_GRAD(grad, (acc) * (scale), b, h, q_idx, kv_idx)
#endif
#ifdef AL_MASK_MOD
#define AL_HAS_MASK_MOD 1
#else
#define AL_HAS_MASK_MOD 0
#define AL_MASK_MOD(b, h, q_idx, kv_idx) 1
#endif
#ifdef AL_CAPTURE_GRAD
#define AL_HAS_CAPTURE_GRAD 1
#else
#define AL_HAS_CAPTURE_GRAD 0
#define AL_CAPTURE_GRAD(grad, score, b, h, q_idx, kv_idx) do { } while (0)
#endif
#ifndef AL_VARIANT
#define AL_VARIANT 0
#endif
#ifndef AL_BLOCK_MASK
#define AL_BLOCK_MASK 0
#endif
#if AL_BLOCK_MASK && !AL_VARIANT
#error "AL_BLOCK_MASK needs AL_VARIANT"
#endif
/* the kernels' parameter: __grid_constant__ in variant builds, where its address is taken (AL_CAP) */
#if AL_VARIANT
#define AL_KPARAMS const __grid_constant__ al_flash_params
#define AL_CAP(k) ((const void *)s.prm->cap[k])
#define AL_CAP_GRAD(k) (s.prm->cap_grad[k])
#else
#define AL_KPARAMS const al_flash_params
#endif

#define AL_DEV static __device__ __forceinline__
#define AL_LOG2E 1.4426950408889634f
#define AL_LN2 0.6931471805599453f
#define AL_NEG_INF (-__int_as_float(0x7f800000))
#define AL_POS_INF (__int_as_float(0x7f800000))

typedef unsigned int al_u32;
typedef unsigned short al_u16;

/* ---- PTX wrappers -------------------------------------------------------------------------------- */
AL_DEV al_u32 al_smem_addr(const void *p) {
    al_u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

/* 16 bytes global -> shared; valid = 0 writes 16 zero bytes and reads nothing */
AL_DEV void al_cp_async16(al_u32 dst, const void *src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
AL_DEV void al_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> AL_DEV void al_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

AL_DEV void al_ldsm_x4(al_u32 addr, al_u32 &r0, al_u32 &r1, al_u32 &r2, al_u32 &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
AL_DEV void al_ldsm_x4_t(al_u32 addr, al_u32 &r0, al_u32 &r1, al_u32 &r2, al_u32 &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* c[4] += A(16x16, 4 regs) * B(16x8, 2 regs), f32 accumulation */
AL_DEV void al_mma(float *c, const al_u32 *a, al_u32 b0, al_u32 b1) {
#if AL_BF16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

AL_DEV float al_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* 2^x on the FMA pipe instead of the multi-function unit (FlashAttention-4's trick): x = n + f with n an
 * integer (rounded by adding 1.5 * 2^23, whose low mantissa bits then hold n) and |f| <= 1/2, 2^f by a
 * degree-5 polynomial (fitted for relative error; 2.2e-7 at most in f32, as ex2.approx's 2^-22.5), and n
 * added to its exponent field. x is clamped at -126 for the arithmetic (-inf, a masked score, would give
 * NaN) and the result is 0 below it: 14 instructions on the FMA and integer pipes for one MUFU operation. */
AL_DEV float al_ex2_fma(float x) {
    const float xc = fmaxf(x, -126.0f);
    const float j = xc + 12582912.0f;
    const float f = xc - (j - 12582912.0f);
    float p = fmaf(1.326697064e-03f, f, 9.675459936e-03f);
    p = fmaf(p, f, 5.550742522e-02f);
    p = fmaf(p, f, 2.402212173e-01f);
    p = fmaf(p, f, 6.931469440e-01f);
    p = fmaf(p, f, 1.000000119e+00f);
    /* below 2^-126 (a masked score's -inf included) the result is 0, as ex2.approx.ftz's: with the clamp alone
     * it was 2^-126, so a row whose every score is masked got l > 0 (output: a mean of V rows, not 0) */
    return x < -126.0f ? 0.0f : __int_as_float(__float_as_int(p) + (__float_as_int(j) << 23));
}

/* tanh on the FMA and integer pipes, for a score_mod's tanh in every k-th column group of the Hopper forward
 * (AL_TANH_FMA_EVERY, an experiment: the prelude's al_v_tanh macro picks it where al_tanh_fma_now is true):
 * tanh x = sign(x) h(u), u = 2^(-2 log2(e) |x|) in (0, 1], h(u) = (1 - u) / (1 + u). u as al_ex2_fma but with a
 * degree-3 polynomial (relative error 7.7e-5; the exponent clamped at -126, where h is 1 within its own error),
 * h by a degree-5 polynomial on [0, 1] (least squares on Chebyshev nodes: absolute error 8.7e-5). tanh's absolute
 * error 1.0e-4 at most, below tanh.approx.f32's (2^-11 relative, ~4.9e-4 near +-1), which is what matters here:
 * P's relative error is the logit's absolute one. 17 instructions for one MUFU operation. */
AL_DEV float al_tanh_fma(float x) {
    float y;   /* max.NaN keeps a NaN x a NaN (fmaxf would make it -126, and tanh(NaN) +-1) */
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(-2.885390082f * fabsf(x)), "f"(-126.0f));
    const float j = y + 12582912.0f;
    const float f = y - (j - 12582912.0f);
    float p = fmaf(5.508868396e-02f, f, 2.426040471e-01f);
    p = fmaf(p, f, 6.932762265e-01f);
    p = fmaf(p, f, 9.999289513e-01f);
    /* u = p 2^n, 2^n built in the exponent field (n in [-126, 0]); a multiply rather than an integer add to p's
     * exponent, so that a NaN p stays NaN */
    const float u = p * __int_as_float((__float_as_int(j) << 23) + 0x3f800000);
    float h = fmaf(-2.153069824e-01f, u, 8.519926667e-01f);
    h = fmaf(h, u, -1.555565715e+00f);
    h = fmaf(h, u, 1.912150860e+00f);
    h = fmaf(h, u, -1.993245363e+00f);
    h = fmaf(h, u, 9.999129176e-01f);
    return copysignf(h, x);
}

/* two floats -> one register of two 16-bit values (lo in the low half), round to nearest even */
AL_DEV al_u32 al_pack2(float lo, float hi) {
    al_u32 r;
#if AL_BF16
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

/* ---- generic element access (the small O(s*d) passes: any dtype, any stride) ---------------------- */
AL_DEV float al_f16_to_f32(al_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
AL_DEV float al_ld_elem(const void *base, int dt, long long i) {
    switch (dt) {
    case AL_FLASH_DT_F32: return ((const float *)base)[i];
    case AL_FLASH_DT_F64: return (float)((const double *)base)[i];
    case AL_FLASH_DT_F16: return al_f16_to_f32(((const al_u16 *)base)[i]);
    default: return __uint_as_float(((unsigned)((const al_u16 *)base)[i]) << 16);
    }
}
AL_DEV void al_st_elem(void *base, int dt, long long i, float v) {
    switch (dt) {
    case AL_FLASH_DT_F32: ((float *)base)[i] = v; break;
    case AL_FLASH_DT_F64: ((double *)base)[i] = (double)v; break;
    case AL_FLASH_DT_F16: {
        al_u16 h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        ((al_u16 *)base)[i] = h;
        break;
    }
    default: {
        al_u16 h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
        ((al_u16 *)base)[i] = h;
        break;
    }
    }
}

/* ---- swizzled tiles ----------------------------------------------------------------------------- */
/* byte offset of 16-byte chunk c of row r in a tile whose rows are ROW_CHUNKS chunks wide: rows of
 * >= 8 chunks XOR with r mod 8; rows of 4 chunks (64 bytes, two rows per 128-byte line) XOR with
 * (r / 2) mod 4, so 8 consecutive rows still cover the 8 bank groups */
template <int ROW_CHUNKS> AL_DEV al_u32 al_swz(int r, int c) {
    static_assert(ROW_CHUNKS == 4 || ROW_CHUNKS % 8 == 0, "swizzled rows are 4 or a multiple of 8 chunks");
    if (ROW_CHUNKS == 4) return (al_u32)(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
    return (al_u32)(r * ROW_CHUNKS * 16 + ((c ^ (r & 7)) << 4));
}

/* cp.async a [ROWS][AL_HEAD_DIM] tile: rows >= valid are zero-filled (never read from memory).
 * g points at the tile's row 0, rows st elements apart. */
template <int ROWS, int NTHREADS>
AL_DEV void al_load_tile(al_u32 s, const al_u16 *g, long long st, int valid, int tid) {
    constexpr int CPR = AL_HEAD_DIM / 8;
    constexpr int TOTAL = ROWS * CPR;
    static_assert(TOTAL % NTHREADS == 0, "tile chunks must divide evenly among the threads");
#pragma unroll
    for (int it = 0; it < TOTAL / NTHREADS; it++) {
        const int c = it * NTHREADS + tid;
        const int r = c / CPR, ch = c % CPR;
        const int ok = r < valid;
        const al_u16 *src = ok ? g + (long long)r * st + ch * 8 : g;
        al_cp_async16(s + al_swz<CPR>(r, ch), src, ok);   /* not read when !ok */
    }
}

/* ---- launch order: which (block, head, batch) a CTA works on --------------------------------------- */
/* p.sched_hb (set per launch by the host, src/cuda/attn_flash_sm90.cu's sched_heads):
 *   0      the grid's own order: blockIdx.x (the row block) fastest, so the blocks of one head run
 *          together and share that head's streamed tiles in L2;
 *   N > 0  longest first, in sections of N (head, batch) pairs taken one after another: inside a
 *          section the blocks go from the longest to the shortest (heavy_high: the grid's last block is
 *          the longest, as a causal forward's or dQ kernel's; else its first, as the dK/dV kernel's),
 *          the section's heads fastest. Causal blocks differ in length up to the sequence's tile count;
 *          in the grid's order the last head's longest block was launched near the end and ran on a
 *          nearly idle GPU (FA3's LPT schedule; the host picks N = four pairs, times a GQA group, where
 *          what they stream fits in L2).
 * y and z are the grid's y (head) and z (batch) coordinates; a bijection of the grid either way. The
 * Hopper kernels pass 0 where their F90_SCHED / B90_SCHED says they do not read it. */
AL_DEV void al_fl_cta_coords(int sched_hb, int heavy_high, int &x, int &y, int &z) {
    const int nx = (int)gridDim.x, ny = (int)gridDim.y;
    if (sched_hb <= 0) {
        x = (int)blockIdx.x;
        y = (int)blockIdx.y;
        z = (int)blockIdx.z;
        return;
    }
    const int nhb = ny * (int)gridDim.z;
    const int lin = (int)blockIdx.x + nx * ((int)blockIdx.y + ny * (int)blockIdx.z);
    const int hb0 = lin / (sched_hb * nx) * sched_hb;   /* the section's first (head, batch) pair */
    const int n = min(sched_hb, nhb - hb0);              /* pairs in this section (the last may be short) */
    const int r = lin - hb0 * nx;
    const int xi = r / n;                                /* 0 = the section's longest blocks */
    const int hb = hb0 + (r - xi * n);
    x = heavy_high ? nx - 1 - xi : xi;
    y = hb % ny;
    z = hb / ny;
}

/* the coordinates of linear work index lin (x fastest) of an nx x ny x nz grid in the same order: the
 * persistent Hopper backward (flash_bwd_sm90.cu, AL_SM90_PERSIST) walks its work items through it. (The
 * grid's version above keeps its own copy of the arithmetic: routed through this one, the forward kernels'
 * SASS changed.) */
AL_DEV void al_fl_work_coords(int sched_hb, int heavy_high, int lin, int nx, int ny, int nz, int &x, int &y, int &z) {
    if (sched_hb <= 0) {
        x = lin % nx;
        y = lin / nx % ny;
        z = lin / nx / ny;
        return;
    }
    const int hb0 = lin / (sched_hb * nx) * sched_hb;
    const int n = min(sched_hb, ny * nz - hb0);
    const int r = lin - hb0 * nx;
    const int xi = r / n;
    const int hb = hb0 + (r - xi * n);
    x = heavy_high ? nx - 1 - xi : xi;
    y = hb % ny;
    z = hb / ny;
}

/* ---- masking: attention_internal.h's rule for one (i, j), i < q_len known ------------------------ */
struct al_fl_seq {
    int b, h;
    int q_len, kv_len;
    int diag;            /* bottom_right ? kv_len - q_len : 0 */
    int wl, wr;          /* -1 = unbounded */
#if AL_VARIANT
    const al_flash_params *prm;   /* AL_CAP / AL_CAP_GRAD / the block mask (the __grid_constant__ params) */
#endif
};

AL_DEV al_fl_seq al_fl_seq_make(const al_flash_params &p, int b, int h) {
    al_fl_seq s;
    s.b = b;
    s.h = h;
    s.q_len = p.q_len ? (int)p.q_len[b] : p.SQ;
    s.kv_len = p.kv_len ? (int)p.kv_len[b] : p.SKV;
#if AL_MASK_KIND == 0
    s.wl = -1;
    s.wr = -1;
#elif AL_MASK_KIND == 1
    s.wl = -1;
    s.wr = 0;
#else
    s.wl = p.wl;
    s.wr = p.wr;
#endif
    s.diag = AL_BOTTOM_RIGHT ? s.kv_len - s.q_len : 0;
#if AL_VARIANT
    s.prm = &p;
#endif
    return s;
}

/* mod = 0: the element lies in a block-mask block that is full (2): mask_mod is not evaluated.
 * mask_mod only sees in-range indices (a row past q_len is never written, so its value is moot). */
AL_DEV int al_fl_valid(const al_fl_seq &s, int i, int j, int mod = 1) {
    int ok = j < s.kv_len;
#if AL_MASK_KIND != 0
    if (s.wl >= 0) ok &= j >= i + s.diag - s.wl;
    if (s.wr >= 0) ok &= j <= i + s.diag + s.wr;
#endif
#if AL_HAS_MASK_MOD
    if (mod && ok && i < s.q_len) ok = (AL_MASK_MOD(s.b, s.h, i, j)) ? 1 : 0;
#endif
    return ok;
}

#if AL_BLOCK_MASK
/* The block-mask entry (0 / 1 / 2) of the tile whose first query row is m0 and first key n0 (both
 * sequence-local; block_m / block_n are multiples of the tiles, so a tile lies in one block). */
AL_DEV int al_fl_block(const al_flash_params &p, int b, int h, int m0, int n0) {
    const long long o = b * p.bm_sb + h * p.bm_sh + (long long)(m0 / p.bm_block_m) * p.bm_sm +
                        (long long)(n0 / p.bm_block_n) * p.bm_sn;
    return (int)__ldg(p.bmask + o);
}
/* The same for a tile of `rows` query rows (clipped to SQ by the caller) that may span several block rows (the
 * three-consumer Hopper forward's 192-row tiles under 128-row blocks, AL_SM90_BM_SPAN): empty (0) if every block it
 * touches is, full (2) if every one is, else partial (1: mask_mod decides per element). Its key columns lie in one
 * block (block_n is a multiple of the tile). */
AL_DEV int al_fl_block_rows(const al_flash_params &p, int b, int h, int m0, int rows, int n0) {
    int any = 0, all_full = 1;
    for (int mb = m0 / p.bm_block_m; mb <= (m0 + rows - 1) / p.bm_block_m; mb++) {
        const int k = al_fl_block(p, b, h, mb * p.bm_block_m, n0);
        any |= k != 0;
        all_full &= k == 2;
    }
    return all_full ? 2 : any ? 1 : 0;
}
#endif

#if AL_HAS_SCORE_MOD
/* With score_mod the logit in log2 units is al_fl_mod_pre(...) * AL_FL_MOD_POST2: the hook's value
 * before its constant factor, and that factor times log2(e) (a compile-time constant), so that a kernel
 * can take the row max on the first and fold the second into its exponent's FFMA. */
#if AL_HAS_SCORE_PRE
#define AL_FL_MOD_POST2 (AL_SCORE_POST * AL_LOG2E)
#else
#define AL_FL_MOD_POST2 AL_LOG2E
#endif
AL_DEV float al_fl_mod_pre(const al_fl_seq &s, float acc, float scale, int i, int j, bool al_tanh_fma_now = false) {
    /* clamped: tile rows/columns past the lengths are masked or discarded, but the hook may index
     * captured tensors with q_idx / kv_idx. al_tanh_fma_now: read by the prelude's al_v_tanh macro under
     * AL_TANH_FMA_EVERY (al_tanh_fma instead of the MUFU tanh); unused otherwise */
    (void)al_tanh_fma_now;
    const int qi = min(i, s.q_len - 1), kj = min(j, s.kv_len - 1);
#if AL_HAS_SCORE_PRE
    return AL_SCORE_PRE(acc, scale, s.b, s.h, qi, kj);
#else
    return AL_SCORE_MOD(acc * scale, s.b, s.h, qi, kj);
#endif
}
#endif

/* the logit of (i, j) in log2 units from the raw q.k product acc */
AL_DEV float al_fl_logit2(const al_fl_seq &s, float acc, float scale, float scale_log2, float slope_log2, int i,
                          int j) {
#if AL_HAS_SCORE_MOD
    float x = al_fl_mod_pre(s, acc, scale, i, j) * AL_FL_MOD_POST2;
#else
    float x = acc * scale_log2;
#endif
#if AL_ALIBI
    int dist = j - i - s.diag;
    x -= slope_log2 * (float)(dist < 0 ? -dist : dist);
#endif
    return x;
}

#endif /* ATTNLAB_FLASH_COMMON_CUH */
