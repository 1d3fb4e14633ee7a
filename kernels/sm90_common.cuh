/*
 * kernels/sm90_common.cuh — Hopper (sm_90a) PTX wrappers for kernels/flash_fwd_sm90.cu, compiled by
 * NVRTC (src/cuda/nvrtc_cache.cu); include after flash_common.cuh (al_u32, AL_DEV, AL_BF16).
 *
 *   al_sm90_tmap / al_sm90_tmaps   CUtensorMap as an opaque 128-byte, 64-byte aligned blob (the host
 *                                  encodes it with cuTensorMapEncodeTiled, src/cuda/flash_sm90_tma.h)
 *   mbarriers                      init, arrive, arrive.expect_tx, try_wait.parity (phase bits); 4-byte
 *                                  cp.async with an arrive on its completion (cp.async.mbarrier.arrive)
 *   TMA                            cp.async.bulk.tensor.4d global -> shared, completing on an mbarrier
 *   wgmma                          fence / commit_group / wait_group, smem matrix descriptors (128-byte
 *                                  swizzle), m64nNk16 f32-accumulating wrappers for N = 64, 128, 256:
 *                                  SS (A and B from smem, both K-major) and RS (A from registers, B
 *                                  MN-major: imm-trans-b = 1)
 *   setmaxnreg                     register reallocation between producer and consumer warpgroups
 *   al_sm90_copy_partial           a cut tile copied by a warp into the TMA layout, zero-filled
 *
 * Descriptor (PTX ISA "matrix descriptor"): bits 0-13 start address >> 4, 16-29 leading-dimension
 * byte offset >> 4, 32-45 stride-dimension byte offset >> 4, 49-51 base offset (0: every tile here
 * starts 1024-byte aligned), 62-63 swizzle mode (1 = 128-byte).
 * The tiles are written by TMA with CU_TENSOR_MAP_SWIZZLE_128B as boxes of [rows][64] 16-bit
 * elements, i.e. 128-byte rows in which 16-byte chunk c of row r sits at chunk c ^ (r & 7); boxes of
 * one tile follow each other (box stride rows * 128 bytes). In CuTe terms:
 *   K-major (Q as A, K as B of S = Q K^T): Swizzle<3,4,3> o ((8,m),(T,2k)):((8T,SBO),(1,T)),
 *       SBO = 1024 (8 rows of 128 bytes), LBO unused (1); a k16 step inside a box adds 32 bytes to the
 *       start address, the next box adds rows * 128.
 *   MN-major (V as B of O = P V, stored [k = key][n = head dim]): Swizzle<3,4,3> o
 *       ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)), LBO = the stride between 64-column boxes (rows * 128),
 *       SBO = 1024 (8 keys); a k16 step adds 16 keys = 2048 bytes.
 */
#ifndef ATTNLAB_SM90_COMMON_CUH
#define ATTNLAB_SM90_COMMON_CUH

typedef unsigned long long al_u64;

#if AL_BF16
#define AL_WG_T "bf16"
#else
#define AL_WG_T "f16"
#endif

struct __align__(64) al_sm90_tmap {
    al_u64 v[16];
};
struct al_sm90_tmaps {
    al_sm90_tmap q, k, v;
};

/* ---- mbarriers ------------------------------------------------------------------------------------ */
AL_DEV void al_mbar_init(al_u32 bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* makes the initialised barriers visible to the other threads and to the async proxy (TMA) */
AL_DEV void al_mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
AL_DEV void al_mbar_arrive(al_u32 bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
/* one arrival plus tx bytes that the barrier's current phase must also see land */
AL_DEV void al_mbar_arrive_tx(al_u32 bar, al_u32 bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
/* 4 bytes global -> shared with cp.async (bytes = 4, or 0: the word is zero-filled and src not read), and the
 * arrive that the barrier receives once all of this thread's earlier cp.async copies have landed (.noinc: the
 * barrier's expected count must include it) */
AL_DEV void al_cp_async4(al_u32 dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
AL_DEV void al_cp_async_mbar_arrive(al_u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
/* 1 when the phase of parity `parity` has completed. A fresh barrier is in phase 0, and waiting for
 * parity 1 (the phase "before" it) returns at once: producers start waiting on empty slots with 1. */
AL_DEV int al_mbar_try_wait(al_u32 bar, int parity) {
    al_u32 ok;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return (int)ok;
}
AL_DEV void al_mbar_wait(al_u32 bar, int parity) {
    while (!al_mbar_try_wait(bar, parity)) {
    }
}

/* ---- TMA ------------------------------------------------------------------------------------------- */
AL_DEV void al_tma_prefetch(const al_sm90_tmap *m) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((al_u64)m) : "memory");
}
/* box at coordinates (c0 innermost = column, c1 row, c2 head, c3 batch) -> dst; completes tx bytes on bar */
AL_DEV void al_tma_load_4d(al_u32 dst, const al_sm90_tmap *m, al_u32 bar, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
                 "%5, %6}], [%2];\n" ::"r"(dst),
                 "l"((al_u64)m), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
/* ordinary shared-memory stores made visible to the async proxy (wgmma reads) */
AL_DEV void al_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* Named barriers (ids 1..15; 0 is __syncthreads) between warpgroups: `sync` waits until `count` threads
 * (a multiple of 32, both sides counted) have arrived or synced on `id`; `arrive` signals without waiting. */
AL_DEV void al_named_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
AL_DEV void al_named_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }

/* Block masks: one warp (all 32 lanes call it) compacts the n tiles a CTA would walk into list[], in
 * order, keeping the non-empty ones as (tile index << 2 | kind), kind_of(j) giving tile j's block-mask
 * entry (0 empty, 1 partial, 2 full); 32 tiles per ballot. Lane 0 writes the count to *count; the caller
 * syncs the CTA before reading either. list needs room for n entries (the host bounds n). */
template <class KindOf>
AL_DEV void al_sm90_list_tiles(unsigned short *list, int *count, int n, int lane, KindOf kind_of) {
    int cnt = 0;
    for (int j0 = 0; j0 < n; j0 += 32) {
        const int j = j0 + lane;
        const int kind = j < n ? kind_of(j) : 0;
        const unsigned keep = __ballot_sync(0xffffffffu, kind != 0);
        if (kind != 0) list[cnt + __popc(keep & ((1u << lane) - 1u))] = (unsigned short)((j << 2) | kind);
        cnt += __popc(keep);
    }
    if (lane == 0) *count = cnt;
}

/* The warp copies rows [0, valid) of a [ROWS][DIM] 16-bit tile from global memory (row stride st
 * elements) into the 128-byte-swizzled box layout TMA would produce, zero-filling the rest, then makes
 * the stores visible to wgmma. For the tile a sequence's end cuts: TMA would read the next sequence's
 * rows there (thd, padding), and rows that meet 0 in a product must be finite for 0 * x to vanish. */
template <int ROWS, int DIM>
AL_DEV void al_sm90_copy_partial(al_u32 dst, const al_u16 *g, long long st, int valid, int lane) {
    constexpr int CPR = DIM / 8;
    for (int c = lane; c < ROWS * CPR; c += 32) {
        const int r = c / CPR, ch = c % CPR;
        const al_u32 a = dst + (ch >> 3) * (ROWS * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < valid) v = *(const uint4 *)(g + (long long)r * st + ch * 8);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
    }
    al_fence_proxy_async();
    __syncwarp();
}

/* ---- register reallocation ---------------------------------------------------------------------------- */
template <int R> AL_DEV void al_reg_dealloc() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R> AL_DEV void al_reg_alloc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
/* the registers per thread a CTA of nt threads holds at launch (__launch_bounds__(nt, 1); allocated in multiples of
 * 8): setmaxnreg moves registers within this pool only, and setmaxnreg.inc waits until the pool has what it asks
 * for, so a producer / consumer split beyond it hangs (session 25) */
constexpr int al_launch_regs(int nt) { return 65536 / nt / 8 * 8; }

/* ---- wgmma ------------------------------------------------------------------------------------------- */
AL_DEV void al_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
AL_DEV void al_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> AL_DEV void al_wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
/* Ends ptxas's basic block here. ptxas moves a wgmma.wait_group up to the top of its basic block: a wait
 * written after the softmax ran before it, and the softmax then waited for the O product in flight instead
 * of overlapping it (seen in the SASS of flash_fwd_sm90.cu, session 11). A branch ends the block: `never`
 * must be a condition that is false in practice but that the compiler cannot prove false (it would drop
 * the branch), and uniform across the warpgroup (a divergent branch, or one to a trap with a wgmma in
 * flight, made ptxas serialise every wgmma and spill). Its body is harmless should it ever run. */
AL_DEV void al_block_end(bool never) {
    if (never) asm volatile("nanosleep.u32 1;\n" ::: "memory");
}
/* pins 32-bit registers (A fragments) to this point of the instruction stream */
template <int N> AL_DEV void al_wg_fence_u32(al_u32 *r) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}

/* 128-byte-swizzle descriptor of the matrix starting at shared address addr */
AL_DEV al_u64 al_desc_sw128(al_u32 addr, al_u32 lbo, al_u32 sbo) {
    return (al_u64)((addr & 0x3FFFFu) >> 4) | ((al_u64)((lbo >> 4) & 0x3FFFu) << 16) |
           ((al_u64)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

/* The descriptor of base + off from d = al_desc_sw128(base, lbo, sbo) (off a multiple of 16, known at
 * compile time in the unrolled k loops): off >> 4 added to the low word, as CUTLASS's descriptor iterator
 * does. The 14-bit start-address field cannot carry (shared memory ends below 256 KB, so (base + off) >> 4
 * < 2^14), so it is the same descriptor; al_desc_sw128(base + off) per wgmma cost an IADD, a LOP3 / SHF and
 * an R2UR or two each, its mask not foldable by ptxas (2-4% of the kernels' instructions, session 12). */
AL_DEV al_u64 al_desc_off(al_u64 d, al_u32 off) {
    const al_u32 lo = (al_u32)d + (off >> 4), hi = (al_u32)(d >> 32);
    return ((al_u64)hi << 32) | lo;
}

/* D[64 x 64] (+)= A[64 x 16] (smem desc) * B[16 x 64] (smem desc); both K-major */
AL_DEV void al_wgmma_ss_n64(float *d, al_u64 da, al_u64 db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." AL_WG_T "." AL_WG_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(accumulate));
}
/* D[64 x 64] (+)= A[64 x 16] (smem desc) * B[16 x 64] (smem desc); both MN-major (imm-trans-a 1, imm-trans-b 1) */
AL_DEV void al_wgmma_ss_n64_tt(float *d, al_u64 da, al_u64 db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." AL_WG_T "." AL_WG_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(accumulate));
}
/* D[64 x 64] += A[64 x 16] (registers, 4 x 16-bit pairs) * B[16 x 64] (smem desc, MN-major: imm-trans-b 1) */
AL_DEV void al_wgmma_rs_n64_tb(float *d, const al_u32 *a, al_u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." AL_WG_T "." AL_WG_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(1));
}
/* keeps the compiler from moving accesses of the 32 accumulator registers across wgmma fences / waits */
AL_DEV void al_wg_fence_regs_n64(float *d) {
#pragma unroll
    for (int i = 0; i < 32; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* D[64 x 128] (+)= A[64 x 16] (smem desc) * B[16 x 128] (smem desc); both K-major */
AL_DEV void al_wgmma_ss_n128(float *d, al_u64 da, al_u64 db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." AL_WG_T "." AL_WG_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(accumulate));
}
/* D[64 x 128] += A[64 x 16] (registers, 4 x 16-bit pairs) * B[16 x 128] (smem desc, MN-major: imm-trans-b 1) */
AL_DEV void al_wgmma_rs_n128_tb(float *d, const al_u32 *a, al_u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." AL_WG_T "." AL_WG_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(1));
}
/* keeps the compiler from moving accesses of the 64 accumulator registers across wgmma fences / waits */
AL_DEV void al_wg_fence_regs_n128(float *d) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* D[64 x 256] (+)= A[64 x 16] (smem desc) * B[16 x 256] (smem desc); both K-major */
AL_DEV void al_wgmma_ss_n256(float *d, al_u64 da, al_u64 db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." AL_WG_T "." AL_WG_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(da), "l"(db), "r"(accumulate));
}
/* D[64 x 256] += A[64 x 16] (registers, 4 x 16-bit pairs) * B[16 x 256] (smem desc, MN-major: imm-trans-b 1) */
AL_DEV void al_wgmma_rs_n256_tb(float *d, const al_u32 *a, al_u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." AL_WG_T "." AL_WG_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(1));
}
/* keeps the compiler from moving accesses of the 128 accumulator registers across wgmma fences / waits */
AL_DEV void al_wg_fence_regs_n256(float *d) {
#pragma unroll
    for (int i = 0; i < 128; i++) asm volatile("" : "+f"(d[i])::"memory");
}

#endif /* ATTNLAB_SM90_COMMON_CUH */
