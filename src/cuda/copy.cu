/*
 * cuda/copy.cu — copy (any dtype pair, any strides; src already broadcast to dst's shape with
 * stride 0), fill and arange on one device.
 *
 * copy picks the cheapest correct path:
 *   1. same dtype, both dense              cudaMemcpyAsync device-to-device
 *   2. float dtypes, both dense            a vectorised convert kernel templated on the dtype pair:
 *                                          one 16-byte load of src per thread and iteration, the
 *                                          converted elements stored with the widest aligned vector
 *                                          (falls back to a scalar dense loop when the start
 *                                          addresses are not vector-aligned)
 *                                          f32/f16/bf16 -> FP8 use the hardware converter
 *                                          (cuda/fp8_fast.h: same bits, NaN groups in software)
 *   3. innermost dims differ (transposed,   a tiled transpose through shared memory (64 x 64 tiles,
 *      permuted), both extents >= 8         batch dims outside), converting on the way for any pair
 *   4. same dtype, strided                 a raw element copy (1, 2, 4 or 8 bytes) over coalesced dims
 *   5. anything else                       a strided convert through double (exactly the CPU's
 *                                          al_load_f64 -> al_store_f64 rule), over coalesced dims
 * Conversions are bit-identical to the CPU's: the float path is used only where float holds the
 * source exactly, and tensor_desc.h's stores match src/convert.c rule for rule.
 *
 * fill computes the element's bit pattern once on the host with the core's al_store_f64 (so it is the
 * CPU's bits by construction) and replicates it; arange computes start + i*step with explicitly
 * rounded double ops (no fma contraction, as on the CPU built with -ffp-contract=off).
 */
#include "cuda/cuda_internal.h"
#include "cuda/fp8_fast.h"
#include <type_traits>

unsigned al_cu_grid(int32_t dev, int64_t n) {
    int64_t blocks = (n + AL_CU_THREADS - 1) / AL_CU_THREADS;
    int64_t cap = (int64_t)al_cu_sm_count[dev] * 32;   /* grid-stride beyond this */
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    return (unsigned)blocks;
}

/* ---- dense vectorised convert ------------------------------------------------------------------ */
template <int D> struct al_dt;
template <> struct al_dt<AL_DTYPE_F32> { typedef float T; };
template <> struct al_dt<AL_DTYPE_F64> { typedef double T; };
template <> struct al_dt<AL_DTYPE_F16> { typedef uint16_t T; };
template <> struct al_dt<AL_DTYPE_BF16> { typedef uint16_t T; };
template <> struct al_dt<AL_DTYPE_FP8_E4M3> { typedef uint8_t T; };
template <> struct al_dt<AL_DTYPE_FP8_E5M2> { typedef uint8_t T; };

template <typename T, int N, int A> struct alignas(A) al_vec { T v[N]; };

template <int SD, int DD> struct al_conv_shape {
    typedef typename al_dt<SD>::T S;
    typedef typename al_dt<DD>::T D;
    enum { VEC = 16 / (int)sizeof(S) };
    enum { DBYTES = VEC * (int)sizeof(D), DALIGN = DBYTES < 16 ? DBYTES : 16 };
};

template <int SD, int DD>
static __device__ __forceinline__ void al_conv_one(const char *s, int64_t si, char *d, int64_t di) {
    if (al_td_wide(SD)) al_st_f64(d, DD, di, al_ld_f64(s, SD, si));
    else al_st_f32(d, DD, di, al_ld_f32(s, SD, si));
}

template <int SD, int DD>
__global__ void __launch_bounds__(AL_CU_THREADS) al_convert_vec_kernel(const char *src, char *dst, int64_t nvec) {
    typedef al_conv_shape<SD, DD> SH;
    typedef al_vec<typename SH::S, SH::VEC, 16> SV;
    typedef al_vec<typename SH::D, SH::VEC, SH::DALIGN> DV;
    const SV *sp = (const SV *)src;
    DV *dp = (DV *)dst;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride) {
        SV x = sp[v];
        DV y;
#pragma unroll
        for (int j = 0; j < SH::VEC; j++) al_conv_one<SD, DD>((const char *)x.v, j, (char *)y.v, j);
        dp[v] = y;
    }
}

/* The FP8 encoders (f32/f16/bf16 -> e4m3/e5m2) through the hardware converter (cuda/fp8_fast.h):
 * one 16-byte load (4 floats or 8 halves) -> one 4- or 8-byte store per thread and iteration. A
 * group of 4 holding a NaN (or a build without FP8 hardware) takes the software encoders. */
template <int SD, int DD> struct al_fp8_fast {
    enum { OK = (DD == AL_DTYPE_FP8_E4M3 || DD == AL_DTYPE_FP8_E5M2) &&
                (SD == AL_DTYPE_F32 || SD == AL_DTYPE_F16 || SD == AL_DTYPE_BF16) };
};

template <int SD> static __device__ __forceinline__ float al_widen_hw(typename al_dt<SD>::T x);
template <> __device__ __forceinline__ float al_widen_hw<AL_DTYPE_F32>(float x) { return x; }
template <> __device__ __forceinline__ float al_widen_hw<AL_DTYPE_BF16>(uint16_t x) {
    return __uint_as_float((uint32_t)x << 16);
}
template <> __device__ __forceinline__ float al_widen_hw<AL_DTYPE_F16>(uint16_t x) { return al_f16_widen_hw(x); }

template <int SD, int DD>
__global__ void __launch_bounds__(AL_CU_THREADS) al_convert_fp8_kernel(const char *src, char *dst, int64_t nvec) {
    typedef al_conv_shape<SD, DD> SH;
    typedef al_vec<typename SH::S, SH::VEC, 16> SV;
    typedef al_vec<uint32_t, SH::VEC / 4, SH::DALIGN> DV;
    const SV *sp = (const SV *)src;
    DV *dp = (DV *)dst;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride) {
        SV x = sp[v];
        DV y;
#pragma unroll
        for (int g = 0; g < SH::VEC / 4; g++) {
            uint32_t c;
            if (!al_fp8x4_hw<DD == AL_DTYPE_FP8_E4M3>(al_widen_hw<SD>(x.v[4 * g]), al_widen_hw<SD>(x.v[4 * g + 1]),
                                                      al_widen_hw<SD>(x.v[4 * g + 2]),
                                                      al_widen_hw<SD>(x.v[4 * g + 3]), &c)) {
                c = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float f = al_ld_f32((const char *)x.v, SD, 4 * g + j);   /* the software decode */
                    uint32_t b = DD == AL_DTYPE_FP8_E4M3 ? al_f32_to_e4m3(f) : al_f32_to_e5m2(f);
                    c |= b << (8 * j);
                }
            }
            y.v[g] = c;
        }
        dp[v] = y;
    }
}

/* Dense scalar convert for [lo, n) (the tail after the vectors, or everything when misaligned). */
template <int SD, int DD>
__global__ void __launch_bounds__(AL_CU_THREADS) al_convert_dense_kernel(const char *src, char *dst, int64_t lo,
                                                                        int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = lo + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        al_conv_one<SD, DD>(src, i, dst, i);
}

template <int SD, int DD>
static al_status launch_convert(int32_t dev, cudaStream_t s, const char *src, char *dst, int64_t n) {
    typedef al_conv_shape<SD, DD> SH;
    int64_t nvec = 0;
    if ((uintptr_t)src % 16 == 0 && (uintptr_t)dst % SH::DALIGN == 0) nvec = n / SH::VEC;
    if (nvec > 0) {
        int64_t blocks = (nvec + AL_CU_THREADS - 1) / AL_CU_THREADS;
        if (blocks > (1 << 20)) blocks = 1 << 20;
        if constexpr (al_fp8_fast<SD, DD>::OK)
            al_convert_fp8_kernel<SD, DD><<<(unsigned)blocks, AL_CU_THREADS, 0, s>>>(src, dst, nvec);
        else
            al_convert_vec_kernel<SD, DD><<<(unsigned)blocks, AL_CU_THREADS, 0, s>>>(src, dst, nvec);
        AL_CUDA_LAUNCHED_K("al_convert_fp8_kernel / al_convert_vec_kernel");
    }
    int64_t lo = nvec * SH::VEC;
    if (lo < n) {
        al_convert_dense_kernel<SD, DD><<<al_cu_grid(dev, n - lo), AL_CU_THREADS, 0, s>>>(src, dst, lo, n);
        AL_CUDA_LAUNCHED_K("al_convert_dense_kernel");
    }
    return AL_OK;
}

template <int SD>
static int dispatch_convert_dst(int32_t dd, int32_t dev, cudaStream_t s, const char *src, char *dst, int64_t n,
                                al_status *st) {
    switch (dd) {
    case AL_DTYPE_F32: *st = launch_convert<SD, AL_DTYPE_F32>(dev, s, src, dst, n); return 1;
    case AL_DTYPE_F64: *st = launch_convert<SD, AL_DTYPE_F64>(dev, s, src, dst, n); return 1;
    case AL_DTYPE_F16: *st = launch_convert<SD, AL_DTYPE_F16>(dev, s, src, dst, n); return 1;
    case AL_DTYPE_BF16: *st = launch_convert<SD, AL_DTYPE_BF16>(dev, s, src, dst, n); return 1;
    case AL_DTYPE_FP8_E4M3: *st = launch_convert<SD, AL_DTYPE_FP8_E4M3>(dev, s, src, dst, n); return 1;
    case AL_DTYPE_FP8_E5M2: *st = launch_convert<SD, AL_DTYPE_FP8_E5M2>(dev, s, src, dst, n); return 1;
    default: return 0;
    }
}

/* Returns 1 (with *st set) when the dtype pair has a dense kernel, else 0. */
static int dispatch_convert(int32_t sd, int32_t dd, int32_t dev, cudaStream_t s, const char *src, char *dst,
                            int64_t n, al_status *st) {
    switch (sd) {
    case AL_DTYPE_F32: return dispatch_convert_dst<AL_DTYPE_F32>(dd, dev, s, src, dst, n, st);
    case AL_DTYPE_F64: return dispatch_convert_dst<AL_DTYPE_F64>(dd, dev, s, src, dst, n, st);
    case AL_DTYPE_F16: return dispatch_convert_dst<AL_DTYPE_F16>(dd, dev, s, src, dst, n, st);
    case AL_DTYPE_BF16: return dispatch_convert_dst<AL_DTYPE_BF16>(dd, dev, s, src, dst, n, st);
    case AL_DTYPE_FP8_E4M3: return dispatch_convert_dst<AL_DTYPE_FP8_E4M3>(dd, dev, s, src, dst, n, st);
    case AL_DTYPE_FP8_E5M2: return dispatch_convert_dst<AL_DTYPE_FP8_E5M2>(dd, dev, s, src, dst, n, st);
    default: return 0;
    }
}

/* ---- strided paths ----------------------------------------------------------------------------- */
template <typename T>
__global__ void __launch_bounds__(AL_CU_THREADS) al_copy_raw_kernel(al_td d, al_td s, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t od, os;
        al_td_off2(i, d, s, &od, &os);
        ((T *)d.data)[od] = ((const T *)s.data)[os];
    }
}

__global__ void __launch_bounds__(AL_CU_THREADS) al_convert_strided_kernel(al_td d, al_td s, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t od, os;
        al_td_off2(i, d, s, &od, &os);
        al_st_f64(d.data, d.dtype, od, al_ld_f64(s.data, s.dtype, os));
    }
}

/* ---- tiled transpose (innermost dims of dst and src differ) -------------------------------------
 * After coalescing, dim A is the one where dst has stride 1 and dim B the one where src has stride
 * 1 (A != B); the other dims are batch dims. Each block moves 64 x 64 tiles of the (B, A) plane:
 * it reads along B (coalesced in src) into shared memory and writes along A (coalesced in dst), so
 * both sides move whole 128-byte lines instead of one element per line as the gather kernel does.
 * The tile is stored as 32-bit words (64-bit for 8-byte elements) with one word of padding per row,
 * so the column-wise reads of the write phase hit 32 different banks. Dtype pairs convert on the
 * way: through float when the source is not wide, else through double (al_td_wide), the same
 * rule, hence the same bits, as the dense and strided paths. */
#define AL_TP_TILE 64
#define AL_TP_ROWS 8            /* threads per block: 32 x AL_TP_ROWS */

typedef struct al_tp {
    char *dd;                    /* dst storage base */
    const char *sd;              /* src storage base */
    int32_t ddt, sdt;            /* dtypes */
    int64_t nA, nB;              /* extents of the two tiled dims */
    int64_t d_sB, s_sA;          /* dst stride along B, src stride along A (the other strides are 1) */
    int64_t tilesA, tilesB, ntiles;
    int32_t nbd;                 /* batch dims, outermost first */
    int64_t bsize[AL_MAX_DIMS], bsd[AL_MAX_DIMS], bss[AL_MAX_DIMS];
    int64_t doff, soff;          /* element offsets of the views */
} al_tp;

/* Same-dtype move: the raw element, widened to a 32-bit (or kept 64-bit) shared-memory word. */
template <typename T> struct al_tp_raw {
    typedef typename std::conditional<sizeof(T) == 8, uint64_t, uint32_t>::type W;
    static __device__ __forceinline__ W load(const al_tp &p, int64_t i) { return (W)((const T *)p.sd)[i]; }
    static __device__ __forceinline__ void store(const al_tp &p, int64_t i, W v) { ((T *)p.dd)[i] = (T)v; }
};
/* Converting move through the compute type C. */
template <typename C> struct al_tp_conv {
    typedef C W;
    static __device__ __forceinline__ W load(const al_tp &p, int64_t i) { return al_ld<C>(p.sd, p.sdt, i); }
    static __device__ __forceinline__ void store(const al_tp &p, int64_t i, W v) { al_st(p.dd, p.ddt, i, v); }
};

template <class M>
__global__ void __launch_bounds__(32 * AL_TP_ROWS) al_transpose_kernel(const al_tp p) {
    typedef typename M::W W;
    __shared__ W tile[AL_TP_TILE][AL_TP_TILE + 1];   /* [a][b] */
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t t = blockIdx.x; t < p.ntiles; t += gridDim.x) {
        int64_t q = t;
        int64_t a0 = (q % p.tilesA) * AL_TP_TILE;
        q /= p.tilesA;
        int64_t b0 = (q % p.tilesB) * AL_TP_TILE;
        q /= p.tilesB;
        int64_t od = p.doff, os = p.soff;
        for (int32_t k = p.nbd - 1; k >= 0; k--) {
            int64_t c = q % p.bsize[k];
            q /= p.bsize[k];
            od += c * p.bsd[k];
            os += c * p.bss[k];
        }
        /* read: lanes along B (src stride 1), rows along A */
        const int64_t sbase = os + a0 * p.s_sA + b0;
        W r[AL_TP_TILE / AL_TP_ROWS][2];
#pragma unroll
        for (int i = 0; i < AL_TP_TILE / AL_TP_ROWS; i++) {
            int64_t a = a0 + ty + i * AL_TP_ROWS;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int64_t b = b0 + tx + 32 * h;
                if (a < p.nA && b < p.nB) r[i][h] = M::load(p, sbase + (ty + i * AL_TP_ROWS) * p.s_sA + tx + 32 * h);
            }
        }
#pragma unroll
        for (int i = 0; i < AL_TP_TILE / AL_TP_ROWS; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) tile[ty + i * AL_TP_ROWS][tx + 32 * h] = r[i][h];
        __syncthreads();
        /* write: lanes along A (dst stride 1), rows along B */
        const int64_t dbase = od + b0 * p.d_sB + a0;
#pragma unroll
        for (int i = 0; i < AL_TP_TILE / AL_TP_ROWS; i++) {
            int64_t b = b0 + ty + i * AL_TP_ROWS;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int64_t a = a0 + tx + 32 * h;
                if (a < p.nA && b < p.nB)
                    M::store(p, dbase + (ty + i * AL_TP_ROWS) * p.d_sB + tx + 32 * h, tile[tx + 32 * h][ty + i * AL_TP_ROWS]);
            }
        }
        __syncthreads();   /* the tile is reused by the next iteration */
    }
}

/* Builds the tile plan for coalesced descriptors d (dst) and s (src). Returns 0 when the layout
 * is not a transpose worth tiling (no stride-1 dim on one side, the same one on both, or a tiled
 * extent too small for a tile to pay). */
static int al_tp_plan(const al_td *d, const al_td *s, al_tp *p) {
    int32_t A = -1, B = -1;
    for (int32_t k = 0; k < d->ndim; k++) {
        if (d->stride[k] == 1 && A < 0) A = k;
        if (s->stride[k] == 1 && B < 0) B = k;
    }
    if (A < 0 || B < 0 || A == B) return 0;
    if (d->size[A] < 8 || d->size[B] < 8) return 0;
    memset(p, 0, sizeof *p);
    p->dd = d->data;
    p->sd = s->data;
    p->ddt = d->dtype;
    p->sdt = s->dtype;
    p->nA = d->size[A];
    p->nB = d->size[B];
    p->d_sB = d->stride[B];
    p->s_sA = s->stride[A];
    p->doff = d->offset;
    p->soff = s->offset;
    p->tilesA = (p->nA + AL_TP_TILE - 1) / AL_TP_TILE;
    p->tilesB = (p->nB + AL_TP_TILE - 1) / AL_TP_TILE;
    p->ntiles = p->tilesA * p->tilesB;
    for (int32_t k = 0; k < d->ndim; k++) {
        if (k == A || k == B) continue;
        p->bsize[p->nbd] = d->size[k];
        p->bsd[p->nbd] = d->stride[k];
        p->bss[p->nbd] = s->stride[k];
        p->ntiles *= d->size[k];
        p->nbd++;
    }
    return 1;
}

template <class M> static void al_tp_launch(const al_tp &p, cudaStream_t s) {
    int64_t grid = p.ntiles < (1 << 24) ? p.ntiles : (1 << 24);
    al_transpose_kernel<M><<<(unsigned)grid, dim3(32, AL_TP_ROWS), 0, s>>>(p);
}

static al_status al_tp_run(const al_tp &p, int64_t des, cudaStream_t s) {
    if (p.ddt == p.sdt) {
        switch (des) {
        case 1: al_tp_launch<al_tp_raw<uint8_t> >(p, s); break;
        case 2: al_tp_launch<al_tp_raw<uint16_t> >(p, s); break;
        case 4: al_tp_launch<al_tp_raw<uint32_t> >(p, s); break;
        default: al_tp_launch<al_tp_raw<uint64_t> >(p, s); break;
        }
    } else if (al_td_wide(p.sdt)) {
        al_tp_launch<al_tp_conv<double> >(p, s);
    } else {
        al_tp_launch<al_tp_conv<float> >(p, s);
    }
    AL_CUDA_LAUNCHED_K("al_transpose_kernel");
    return AL_OK;
}

al_status al_cu_copy(al_tensor *dst, const al_tensor *src) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("copy", dst->device_index, &s));
    if (src->device_type != AL_DEVICE_CUDA || src->device_index != dst->device_index)
        return al_error(AL_ERR_INTERNAL, "copy (cuda): src is not on cuda:%d", dst->device_index);
    if (src->ndim != dst->ndim)
        return al_error(AL_ERR_INTERNAL, "copy (cuda): src has %d dims, dst %d", src->ndim, dst->ndim);
    for (int32_t d = 0; d < dst->ndim; d++)
        if (src->size[d] != dst->size[d])
            return al_error(AL_ERR_INTERNAL, "copy (cuda): src extent %lld != dst extent %lld at dim %d",
                            (long long)src->size[d], (long long)dst->size[d], d);
    al_td d = al_td_from(dst), sd = al_td_from(src);
    int64_t n = al_td_numel(&d);
    if (n == 0) return AL_OK;
    int64_t des = al_dtype_size(dst->dtype), ses = al_dtype_size(src->dtype);
    if (des == 0 || ses == 0) return al_error(AL_ERR_ARG, "copy (cuda): unknown dtype code %d or %d", dst->dtype, src->dtype);
    int dense = al_td_dense(dst) && al_td_dense(src);
    char *dp = d.data + d.offset * des;
    const char *sp = sd.data + sd.offset * ses;
    if (dense && dst->dtype == src->dtype) {
        if (dp != sp) AL_CUDA_TRY(cudaMemcpyAsync(dp, sp, (size_t)(n * des), cudaMemcpyDeviceToDevice, s));
        return AL_OK;
    }
    if (dense) {
        al_status st = AL_OK;
        if (dispatch_convert(src->dtype, dst->dtype, dst->device_index, s, sp, dp, n, &st)) return st;
    }
    al_td ops[2] = {d, sd};
    al_td_coalesce(2, ops);
    al_tp plan;
    if (al_tp_plan(&ops[0], &ops[1], &plan)) return al_tp_run(plan, des, s);
    unsigned grid = al_cu_grid(dst->device_index, n);
    if (dst->dtype == src->dtype) {
        switch (des) {
        case 1: al_copy_raw_kernel<uint8_t><<<grid, AL_CU_THREADS, 0, s>>>(ops[0], ops[1], n); break;
        case 2: al_copy_raw_kernel<uint16_t><<<grid, AL_CU_THREADS, 0, s>>>(ops[0], ops[1], n); break;
        case 4: al_copy_raw_kernel<uint32_t><<<grid, AL_CU_THREADS, 0, s>>>(ops[0], ops[1], n); break;
        default: al_copy_raw_kernel<uint64_t><<<grid, AL_CU_THREADS, 0, s>>>(ops[0], ops[1], n); break;
        }
    } else {
        al_convert_strided_kernel<<<grid, AL_CU_THREADS, 0, s>>>(ops[0], ops[1], n);
    }
    AL_CUDA_LAUNCHED_K("al_copy_raw_kernel / al_convert_strided_kernel");
    return AL_OK;
}

/* ---- fill -------------------------------------------------------------------------------------- */
template <typename T>
__global__ void __launch_bounds__(AL_CU_THREADS) al_fill_kernel(al_td d, T v, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        ((T *)d.data)[al_td_off1(i, d)] = v;
}

al_status al_cu_fill(al_tensor *dst, double v) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("fill_", dst->device_index, &s));
    al_td d = al_td_from(dst);
    int64_t n = al_td_numel(&d), es = al_dtype_size(dst->dtype);
    if (n == 0) return AL_OK;
    if (es == 0) return al_error(AL_ERR_ARG, "fill_ (cuda): unknown dtype code %d", dst->dtype);
    /* the element's bits, by the CPU's own rule */
    uint64_t bits = 0;
    al_store_f64(&bits, dst->dtype, 0, v);
    if (es == 1 && al_td_dense(dst)) {
        AL_CUDA_TRY(cudaMemsetAsync(d.data + d.offset, (int)(bits & 0xFF), (size_t)n, s));
        return AL_OK;
    }
    al_td_coalesce(1, &d);
    unsigned grid = al_cu_grid(dst->device_index, n);
    switch (es) {
    case 1: al_fill_kernel<uint8_t><<<grid, AL_CU_THREADS, 0, s>>>(d, (uint8_t)bits, n); break;
    case 2: al_fill_kernel<uint16_t><<<grid, AL_CU_THREADS, 0, s>>>(d, (uint16_t)bits, n); break;
    case 4: al_fill_kernel<uint32_t><<<grid, AL_CU_THREADS, 0, s>>>(d, (uint32_t)bits, n); break;
    default: al_fill_kernel<uint64_t><<<grid, AL_CU_THREADS, 0, s>>>(d, bits, n); break;
    }
    AL_CUDA_LAUNCHED_K("al_fill_kernel");
    return AL_OK;
}

/* ---- arange ------------------------------------------------------------------------------------ */
__global__ void __launch_bounds__(AL_CU_THREADS) al_arange_kernel(al_td d, double start, double step, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        al_st_f64(d.data, d.dtype, al_td_off1(i, d), __dadd_rn(start, __dmul_rn((double)i, step)));
}

al_status al_cu_arange(al_tensor *dst, double start, double step) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("arange_", dst->device_index, &s));
    al_td d = al_td_from(dst);
    int64_t n = al_td_numel(&d);
    if (n == 0) return AL_OK;
    al_td_coalesce(1, &d);
    al_arange_kernel<<<al_cu_grid(dst->device_index, n), AL_CU_THREADS, 0, s>>>(d, start, step, n);
    AL_CUDA_LAUNCHED_K("al_arange_kernel");
    return AL_OK;
}
