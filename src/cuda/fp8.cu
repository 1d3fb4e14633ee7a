/*
 * cuda/fp8.cu — FP8 quantisation kernels of the plugin table (cuda_plugin.h, "FP8" block), the GPU
 * side of src/fp8.c and bit-identical to it: every code is numeric/fp8_scale.h's al_fp8_encode of the
 * double x * scale, every decode is exact, scales follow the same double arithmetic.
 *
 *   amax              grid-stride, per-thread max |x| (float for f32/f16/bf16/fp8, double for f64),
 *                     block reduction (warp shuffles, shared memory), one partial per block, then one
 *                     block combines the partials; NaN-propagating; the result comes back synchronously
 *   fp8_quantize      grid-stride, one element per iteration, x through its strides, out contiguous
 *   fp8_quantize_amax fp8_quantize and amax in one pass (contiguous x), else the two one after the other
 *   fp8_dequantize    the reverse; stored through al_st_f64 (the CPU's al_store_f64 rounding)
 *   fp8_quantize_rows one block per row (grid-stride over rows): block amax, scale, then the row
 *   mxfp8_*           one thread per 32-element block
 * Contiguous operands of the usual dtypes take vectorised variants of amax, quantise and dequantise
 * (16 bytes per load or store, dtype and format as template parameters; see "contiguous fast paths").
 */
#include "cuda/cuda_internal.h"
#include "numeric/fp8_scale.h"
#include "cuda/fp8_fast.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* ---- NaN-propagating max of |x| ------------------------------------------------------------------ */
template <typename C> static __device__ __forceinline__ C al_amax_comb(C m, C a) {
    if (m != m) return m;
    if (a != a) return a;
    return a > m ? a : m;
}

template <typename C> static __device__ __forceinline__ C al_block_amax(C v, C *sh) {
    for (int o = 16; o > 0; o >>= 1) v = al_amax_comb<C>(v, __shfl_xor_sync(0xffffffffu, v, o));
    int nw = blockDim.x / 32, lane = threadIdx.x % 32, w = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : (C)0;
    for (int o = 16; o > 0; o >>= 1) v = al_amax_comb<C>(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename C>
__global__ void __launch_bounds__(AL_CU_THREADS) al_amax_kernel(al_td x, int64_t n, double *partial) {
    __shared__ C sh[32];
    C m = (C)0;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        C v = al_ld<C>(x.data, x.dtype, al_td_off1(i, x));
        m = al_amax_comb<C>(m, v < (C)0 ? -v : v);
    }
    m = al_block_amax<C>(m, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = (double)m;
}

/* *res = the max of the partials, or with accumulate max(*res, that) (delayed scaling on the device adds
 * q, k and v's amaxes into one accumulator: the kernels are stream-ordered, so no atomics) */
#define AL_AMAX_FINAL_THREADS 1024   /* (4224 partials at 4x16x4096x128: 256 threads took 9 us, load latency bound) */
__global__ void __launch_bounds__(AL_AMAX_FINAL_THREADS) al_amax_final_kernel(const double *partial, int64_t n, double *res,
                                                                            int accumulate) {
    __shared__ double sh[32];
    double m = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = al_amax_comb<double>(m, partial[i]);
    m = al_block_amax<double>(m, sh);
    if (threadIdx.x == 0) *res = accumulate ? al_amax_comb<double>(*res, m) : m;
}

/* ---- contiguous fast paths --------------------------------------------------------------------------
 * The kernels above take any strides and dtypes through a run-time switch and move one element (one byte
 * for FP8) per thread and iteration: on the H200 they ran at 1/5 - 1/7 of the memory bandwidth (session 6,
 * ncu at 4x16x4096x128 bf16: amax 130 us, quantise 178 us, the FP8 forward's dequantise of O 188 us, where
 * moving the bytes takes ~25 us). For contiguous operands (attention's q, k, v, o) these variants move 16
 * FP8 codes per thread and iteration with 16-byte loads and stores, the dtype and format being template
 * parameters. Every element gets the generic kernels' bits (and the CPU's): the same double arithmetic,
 * then one correct rounding, by the same software functions or by the hardware converters fed through
 * rounding to odd (al_f64_to_f32_odd, numeric/convert.h); the #gpu test in fp8_spec compares them bit for bit.
 * The last partial group of 16 is done element by element by the thread that owns it. */
#define AL_FP8_VEC 16

static inline int al_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* 16 elements of dtype DT at element index 16 v of base into r (bytes), by 16-byte loads */
template <int DT> static __device__ __forceinline__ void al_ld16(const char *base, int64_t v, uint4 *r) {
    constexpr int W = DT == AL_DTYPE_F32 ? 4 : DT == AL_DTYPE_F16 || DT == AL_DTYPE_BF16 ? 2 : 1;   /* uint4s */
    const uint4 *p = (const uint4 *)base + v * W;
#pragma unroll
    for (int j = 0; j < W; j++) r[j] = p[j];
}
template <int DT> static __device__ __forceinline__ void al_st16(char *base, int64_t v, const uint4 *r) {
    constexpr int W = DT == AL_DTYPE_F32 ? 4 : DT == AL_DTYPE_F16 || DT == AL_DTYPE_BF16 ? 2 : 1;
    uint4 *p = (uint4 *)base + v * W;
#pragma unroll
    for (int j = 0; j < W; j++) p[j] = r[j];
}

/* m combined with |x| of the 16 elements loaded at r */
template <int DT, typename C> static __device__ __forceinline__ C al_amax16(const uint4 *r, C m) {
#pragma unroll
    for (int k = 0; k < AL_FP8_VEC; k++) {
        C e = al_ld<C>((const char *)r, DT, k);
        m = al_amax_comb<C>(m, e < (C)0 ? -e : e);
    }
    return m;
}

/* m combined with |x| of elements [i0, n) (a last partial group) */
template <int DT, typename C> static __device__ __forceinline__ C al_amax_tail(const char *x, int64_t i0, int64_t n, C m) {
    for (int64_t i = i0; i < n; i++) {
        C e = al_ld<C>(x, DT, i);
        m = al_amax_comb<C>(m, e < (C)0 ? -e : e);
    }
    return m;
}

template <int DT, typename C>
__global__ void __launch_bounds__(AL_CU_THREADS) al_amax_vec_kernel(const char *x, int64_t n, double *partial) {
    __shared__ C sh[32];
    C m = (C)0;
    const int64_t nv = (n + AL_FP8_VEC - 1) / AL_FP8_VEC, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += stride) {
        if ((v + 1) * AL_FP8_VEC <= n) {
            uint4 r[4];
            al_ld16<DT>(x, v, r);
            m = al_amax16<DT, C>(r, m);
        } else {
            m = al_amax_tail<DT, C>(x, v * AL_FP8_VEC, n, m);
        }
    }
    m = al_block_amax<C>(m, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = (double)m;
}

/* (al_f64_to_f32_odd, numeric/convert.h: rounding to odd, so that the hardware's f32 converters round a
 * double once and correctly) */
/* p rounded once to dtype DT (f32, f16 or bf16) into element k of the registers at r: al_st_f64's bits */
template <int DT> static __device__ __forceinline__ void al_st_half_odd(char *r, int k, double p) {
    if (DT == AL_DTYPE_F32 || p != p) {
        al_st_f64(r, DT, k, p);
    } else if (DT == AL_DTYPE_BF16) {
        ((__nv_bfloat16 *)r)[k] = __float2bfloat16_rn(al_f64_to_f32_odd(p));
    } else {
        ((__half *)r)[k] = __float2half_rn(al_f64_to_f32_odd(p));
    }
}

/* the 16 FP8 codes of the 16 elements loaded at r, times scale */
template <int FMT, int DT> static __device__ __forceinline__ uint4 al_fp8_encode16(const uint4 *r, double scale) {
    uint4 o;
    uint32_t *ow = (uint32_t *)&o;
#pragma unroll
    for (int g = 0; g < AL_FP8_VEC / 4; g++) {
        float f[4];
#pragma unroll
        for (int j = 0; j < 4; j++) f[j] = al_f64_to_f32_odd(al_ld_f64((const char *)r, DT, 4 * g + j) * scale);
        /* the hardware converter (fp8_fast.h: the bits of al_f32_to_e4m3/e5m2, correct for the odd-rounded
         * float); a group holding a NaN goes through the software encoder */
        if (!al_fp8x4_hw<FMT == AL_DTYPE_FP8_E4M3>(f[0], f[1], f[2], f[3], &ow[g])) {
            uint32_t w = 0;
#pragma unroll
            for (int j = 0; j < 4; j++)
                w |= (uint32_t)al_fp8_encode(FMT, al_ld_f64((const char *)r, DT, 4 * g + j) * scale) << (8 * j);
            ow[g] = w;
        }
    }
    return o;
}

/* (every quantise kernel: dscale, when not NULL, is a device pointer to the scale, which replaces the
 * scale argument: delayed scaling on the device, whose scale the host does not know) */
template <int FMT, int DT>
__global__ void __launch_bounds__(AL_CU_THREADS) al_fp8_quant_vec_kernel(uint8_t *out, const char *x, int64_t n,
                                                                        double scale, const double *dscale) {
    if (dscale) scale = *dscale;
    const int64_t nv = (n + AL_FP8_VEC - 1) / AL_FP8_VEC, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += stride) {
        if ((v + 1) * AL_FP8_VEC <= n) {
            uint4 r[4];
            al_ld16<DT>(x, v, r);
            ((uint4 *)out)[v] = al_fp8_encode16<FMT, DT>(r, scale);
        } else {
            for (int64_t i = v * AL_FP8_VEC; i < n; i++) out[i] = al_fp8_encode(FMT, al_ld_f64(x, DT, i) * scale);
        }
    }
}

/* al_fp8_quant_vec_kernel and al_amax_vec_kernel in one pass: x is read once (delayed scaling quantises with
 * the scale chosen before and only records this amax); one amax partial per block, as al_amax_vec_kernel, or
 * with acc every block max'es its amax straight into *acc (delayed scaling on the device: no partials and no
 * final kernel; an amax is >= 0 or NaN, and such doubles order as their unsigned 64-bit patterns, any NaN
 * above +inf, so an integer atomicMax is the NaN-propagating max) */
template <int FMT, int DT>
__global__ void __launch_bounds__(AL_CU_THREADS) al_fp8_quant_amax_vec_kernel(uint8_t *out, const char *x, int64_t n,
                                                                             double scale, const double *dscale,
                                                                             double *partial, double *acc) {
    __shared__ float sh[32];
    if (dscale) scale = *dscale;
    float m = 0.0f;
    const int64_t nv = (n + AL_FP8_VEC - 1) / AL_FP8_VEC, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += stride) {
        if ((v + 1) * AL_FP8_VEC <= n) {
            uint4 r[4];
            al_ld16<DT>(x, v, r);
            m = al_amax16<DT, float>(r, m);
            ((uint4 *)out)[v] = al_fp8_encode16<FMT, DT>(r, scale);
        } else {
            m = al_amax_tail<DT, float>(x, v * AL_FP8_VEC, n, m);
            for (int64_t i = v * AL_FP8_VEC; i < n; i++) out[i] = al_fp8_encode(FMT, al_ld_f64(x, DT, i) * scale);
        }
    }
    m = al_block_amax<float>(m, sh);
    if (threadIdx.x == 0) {
        if (acc) atomicMax((unsigned long long *)acc, (unsigned long long)__double_as_longlong((double)m));
        else partial[blockIdx.x] = (double)m;
    }
}

/* FP8 codes decode through a 256-entry table in shared memory (filled with al_fp8_decode: exact) */
/* (every dequantise kernel: dscale, when not NULL, is a device pointer to the scale the codes were made with,
 * and scale_inv becomes 1 / (double)(float)scale, as the host computes the inverse of a used scale) */
template <int FMT, int DT>
__global__ void __launch_bounds__(AL_CU_THREADS) al_fp8_dequant_vec_kernel(char *out, const uint8_t *q, int64_t n,
                                                                          double scale_inv, const double *dscale) {
    __shared__ float lut[256];
    if (dscale) scale_inv = 1.0 / (double)(float)*dscale;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = (float)al_fp8_decode(FMT, (uint8_t)i);
    __syncthreads();
    const int64_t nv = (n + AL_FP8_VEC - 1) / AL_FP8_VEC, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += stride) {
        if ((v + 1) * AL_FP8_VEC <= n) {
            const uint4 c = ((const uint4 *)q)[v];
            const uint8_t *cb = (const uint8_t *)&c;
            uint4 r[4];
#pragma unroll
            for (int k = 0; k < AL_FP8_VEC; k++) al_st_half_odd<DT>((char *)r, k, (double)lut[cb[k]] * scale_inv);
            al_st16<DT>(out, v, r);
        } else {
            for (int64_t i = v * AL_FP8_VEC; i < n; i++) al_st_f64(out, DT, i, al_fp8_decode(FMT, q[i]) * scale_inv);
        }
    }
}

/* the 16-byte-aligned contiguous data of a coalesced descriptor, or NULL */
static const char *al_td_dense16(const al_td &t, int64_t elem) {
    if (!(t.ndim == 0 || (t.ndim == 1 && t.stride[0] == 1))) return NULL;
    const char *p = t.data + t.offset * elem;
    return al_aligned16(p) ? p : NULL;
}

static int al_fp8_dtype(int32_t d) { return d == AL_DTYPE_FP8_E4M3 || d == AL_DTYPE_FP8_E5M2; }
static int al_half_or_f32(int32_t d) { return d == AL_DTYPE_F32 || d == AL_DTYPE_F16 || d == AL_DTYPE_BF16; }

/* launch K<FMT, DT> over the six (format, dtype) pairs of the fast paths */
#define AL_FP8_DISPATCH(fmt, dt, LAUNCH)                                                         \
    do {                                                                                          \
        if ((fmt) == AL_DTYPE_FP8_E4M3) {                                                         \
            if ((dt) == AL_DTYPE_F32) LAUNCH(AL_DTYPE_FP8_E4M3, AL_DTYPE_F32);                    \
            else if ((dt) == AL_DTYPE_F16) LAUNCH(AL_DTYPE_FP8_E4M3, AL_DTYPE_F16);               \
            else LAUNCH(AL_DTYPE_FP8_E4M3, AL_DTYPE_BF16);                                        \
        } else {                                                                                  \
            if ((dt) == AL_DTYPE_F32) LAUNCH(AL_DTYPE_FP8_E5M2, AL_DTYPE_F32);                    \
            else if ((dt) == AL_DTYPE_F16) LAUNCH(AL_DTYPE_FP8_E5M2, AL_DTYPE_F16);               \
            else LAUNCH(AL_DTYPE_FP8_E5M2, AL_DTYPE_BF16);                                        \
        }                                                                                         \
    } while (0)

static unsigned al_vec_grid(int32_t dev, int64_t n) { return al_cu_grid(dev, (n + AL_FP8_VEC - 1) / AL_FP8_VEC); }

/* amax(x) into *dst (device memory; with accumulate, max(*dst, amax(x))), queued on the current stream */
al_status al_cu_amax_into_ex(const al_tensor *x, double *dst, int accumulate) {
    cudaStream_t s;
    const int32_t dev = x->device_index;
    AL_TRY(al_cu_begin("amax", dev, &s));
    al_td t = al_td_from(x);
    int64_t n = al_td_numel(&t);
    al_td_coalesce(1, &t);
    const char *dense = al_half_or_f32(x->dtype) ? al_td_dense16(t, al_dtype_size(x->dtype)) : NULL;
    unsigned grid = dense ? al_vec_grid(dev, n) : al_cu_grid(dev, n);
    int64_t nbytes = (int64_t)sizeof(double) * (int64_t)grid;   /* one partial per block */
    double *buf = NULL;
    AL_TRY(al_cu_malloc(dev, nbytes, (void **)&buf));
    al_status st;
    if (dense && x->dtype == AL_DTYPE_F32) al_amax_vec_kernel<AL_DTYPE_F32, float><<<grid, AL_CU_THREADS, 0, s>>>(dense, n, buf);
    else if (dense && x->dtype == AL_DTYPE_F16) al_amax_vec_kernel<AL_DTYPE_F16, float><<<grid, AL_CU_THREADS, 0, s>>>(dense, n, buf);
    else if (dense) al_amax_vec_kernel<AL_DTYPE_BF16, float><<<grid, AL_CU_THREADS, 0, s>>>(dense, n, buf);
    else if (al_td_wide(x->dtype)) al_amax_kernel<double><<<grid, AL_CU_THREADS, 0, s>>>(t, n, buf);
    else al_amax_kernel<float><<<grid, AL_CU_THREADS, 0, s>>>(t, n, buf);
    st = AL_CUDA_ST(cudaGetLastError());
    if (st == AL_OK) {
        al_amax_final_kernel<<<1, AL_AMAX_FINAL_THREADS, 0, s>>>(buf, (int64_t)grid, dst, accumulate);
        st = AL_CUDA_ST(cudaGetLastError());
    }
    al_cu_free(dev, buf, nbytes);   /* (stream-ordered: reused only by later work on this stream) */
    return st;
}

al_status al_cu_amax_into(const al_tensor *x, double *dst) { return al_cu_amax_into_ex(x, dst, 0); }

static al_status cu_amax(const al_tensor *x, double *amax) {
    double *d = NULL;
    AL_TRY(al_cu_malloc(x->device_index, sizeof(double), (void **)&d));
    al_status st = al_cu_amax_into(x, d);
    if (st == AL_OK) st = al_cu_memcpy_d2h(x->device_index, amax, d, sizeof(double));
    al_cu_free(x->device_index, d, sizeof(double));
    return st;
}

static al_status cu_amax_to(al_tensor *out, const al_tensor *x) {
    int64_t one = 1;
    AL_TRY(al_tensor_empty(out, 1, &one, AL_DTYPE_F64, AL_DEVICE_CUDA, x->device_index));
    al_status st = al_cu_amax_into(x, (double *)al_tensor_data_ptr(out));
    if (st != AL_OK) al_tensor_release(out);
    return st;
}

/* ---- per-tensor quantise / dequantise ------------------------------------------------------------- */
__global__ void __launch_bounds__(AL_CU_THREADS) al_fp8_quant_kernel(uint8_t *out, al_td x, int64_t n, int32_t fmt,
                                                                    double scale, const double *dscale) {
    if (dscale) scale = *dscale;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = al_fp8_encode(fmt, al_ld_f64(x.data, x.dtype, al_td_off1(i, x)) * scale);
}

__global__ void __launch_bounds__(AL_CU_THREADS) al_fp8_dequant_kernel(char *out, int32_t dt, al_td q, int64_t n,
                                                                      double scale_inv, const double *dscale) {
    if (dscale) scale_inv = 1.0 / (double)(float)*dscale;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const uint8_t *b = (const uint8_t *)q.data;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        al_st_f64(out, dt, i, al_fp8_decode(q.dtype, b[al_td_off1(i, q)]) * scale_inv);
}

al_status al_cu_fp8_quantize_ex(al_tensor *out, const al_tensor *x, double scale, const double *dscale) {
    cudaStream_t s;
    const int32_t dev = x->device_index;
    AL_TRY(al_cu_begin("fp8_quantize", dev, &s));
    al_td t = al_td_from(x);
    int64_t n = al_td_numel(&t);
    al_td_coalesce(1, &t);
    const char *dense = al_half_or_f32(x->dtype) ? al_td_dense16(t, al_dtype_size(x->dtype)) : NULL;
    uint8_t *o = (uint8_t *)al_tensor_data_ptr(out);
    if (dense && al_fp8_dtype(out->dtype) && al_aligned16(o)) {
#define AL_QUANT_VEC(F, D) al_fp8_quant_vec_kernel<F, D><<<al_vec_grid(dev, n), AL_CU_THREADS, 0, s>>>(o, dense, n, scale, dscale)
        AL_FP8_DISPATCH(out->dtype, x->dtype, AL_QUANT_VEC);
#undef AL_QUANT_VEC
        AL_CUDA_LAUNCHED_K("al_fp8_quant_vec_kernel");
        return AL_OK;
    }
    al_fp8_quant_kernel<<<al_cu_grid(dev, n), AL_CU_THREADS, 0, s>>>(o, t, n, out->dtype, scale, dscale);
    AL_CUDA_LAUNCHED_K("al_fp8_quant_kernel");
    return AL_OK;
}

static al_status cu_quantize(al_tensor *out, const al_tensor *x, double scale) { return al_cu_fp8_quantize_ex(out, x, scale, NULL); }

/* out (allocated) = fp8(x * scale), scale = *dscale when dscale is given (device memory); *res (device memory)
 * = amax(x), or with accumulate max(*res, amax(x)): one pass for a contiguous x of a half or f32 dtype, else
 * the two kernels one after the other; queued, no sync */
al_status al_cu_fp8_quantize_amax_into(al_tensor *out, const al_tensor *x, double scale, const double *dscale, double *res,
                                       int accumulate) {
    cudaStream_t s;
    const int32_t dev = x->device_index;
    AL_TRY(al_cu_begin("fp8_quantize_amax", dev, &s));
    al_td t = al_td_from(x);
    int64_t n = al_td_numel(&t);
    al_td_coalesce(1, &t);
    const char *dense = al_half_or_f32(x->dtype) ? al_td_dense16(t, al_dtype_size(x->dtype)) : NULL;
    uint8_t *o = (uint8_t *)al_tensor_data_ptr(out);
    al_status st;
    if (dense && al_fp8_dtype(out->dtype) && al_aligned16(o) && accumulate) {
        /* (the blocks max into *res themselves: one kernel) */
#define AL_QUANT_ACC_VEC(F, D) al_fp8_quant_amax_vec_kernel<F, D><<<al_vec_grid(dev, n), AL_CU_THREADS, 0, s>>>(o, dense, n, scale, dscale, NULL, res)
        AL_FP8_DISPATCH(out->dtype, x->dtype, AL_QUANT_ACC_VEC);
#undef AL_QUANT_ACC_VEC
        st = AL_CUDA_ST(cudaGetLastError());
    } else if (dense && al_fp8_dtype(out->dtype) && al_aligned16(o)) {
        const unsigned grid = al_vec_grid(dev, n);
        const int64_t nbytes = (int64_t)sizeof(double) * (int64_t)grid;
        double *partial = NULL;
        st = al_cu_malloc(dev, nbytes, (void **)&partial);
        if (st == AL_OK) {
#define AL_QUANT_AMAX_VEC(F, D) al_fp8_quant_amax_vec_kernel<F, D><<<grid, AL_CU_THREADS, 0, s>>>(o, dense, n, scale, dscale, partial, NULL)
            AL_FP8_DISPATCH(out->dtype, x->dtype, AL_QUANT_AMAX_VEC);
#undef AL_QUANT_AMAX_VEC
            st = AL_CUDA_ST(cudaGetLastError());
            if (st == AL_OK) {
                al_amax_final_kernel<<<1, AL_AMAX_FINAL_THREADS, 0, s>>>(partial, (int64_t)grid, res, accumulate);
                st = AL_CUDA_ST(cudaGetLastError());
            }
            al_cu_free(dev, partial, nbytes);   /* (stream-ordered: reused only by later work on this stream) */
        }
    } else {
        st = al_cu_fp8_quantize_ex(out, x, scale, dscale);
        if (st == AL_OK) st = al_cu_amax_into_ex(x, res, accumulate);
    }
    return st;
}

/* out (allocated by the core) = fp8(x * scale); amax (new f64 [1] on x's device) = amax(x) */
static al_status cu_quantize_amax(al_tensor *out, al_tensor *amax, const al_tensor *x, double scale) {
    int64_t one = 1;
    AL_TRY(al_tensor_empty(amax, 1, &one, AL_DTYPE_F64, AL_DEVICE_CUDA, x->device_index));
    al_status st = al_cu_fp8_quantize_amax_into(out, x, scale, NULL, (double *)al_tensor_data_ptr(amax), 0);
    if (st != AL_OK) al_tensor_release(amax);
    return st;
}

/* out (allocated by the core) = fp8(x * *scale) and *acc = max(*acc, amax(x)) (acc may be NULL: no amax):
 * delayed scaling on the device (src/fp8_delayed.c) */
static al_status cu_quantize_dev(al_tensor *out, const al_tensor *x, const double *scale, double *acc) {
    if (!acc) return al_cu_fp8_quantize_ex(out, x, 1.0, scale);
    return al_cu_fp8_quantize_amax_into(out, x, 1.0, scale, acc, 1);
}

/* out (allocated) = decode(q) * scale_inv, or with dscale (device memory) decode(q) / (double)(float)*dscale */
al_status al_cu_fp8_dequantize_ex(al_tensor *out, const al_tensor *q, double scale_inv, const double *dscale) {
    cudaStream_t s;
    const int32_t dev = q->device_index;
    AL_TRY(al_cu_begin("fp8_dequantize", dev, &s));
    al_td t = al_td_from(q);
    int64_t n = al_td_numel(&t);
    al_td_coalesce(1, &t);
    const uint8_t *dense = al_fp8_dtype(q->dtype) ? (const uint8_t *)al_td_dense16(t, 1) : NULL;
    char *o = (char *)al_tensor_data_ptr(out);
    if (dense && al_half_or_f32(out->dtype) && al_aligned16(o)) {
#define AL_DEQUANT_VEC(F, D) al_fp8_dequant_vec_kernel<F, D><<<al_vec_grid(dev, n), AL_CU_THREADS, 0, s>>>(o, dense, n, scale_inv, dscale)
        AL_FP8_DISPATCH(q->dtype, out->dtype, AL_DEQUANT_VEC);
#undef AL_DEQUANT_VEC
        AL_CUDA_LAUNCHED_K("al_fp8_dequant_vec_kernel");
        return AL_OK;
    }
    al_fp8_dequant_kernel<<<al_cu_grid(dev, n), AL_CU_THREADS, 0, s>>>(o, out->dtype, t, n, scale_inv, dscale);
    AL_CUDA_LAUNCHED_K("al_fp8_dequant_kernel");
    return AL_OK;
}

static al_status cu_dequantize(al_tensor *out, const al_tensor *q, double scale_inv) {
    return al_cu_fp8_dequantize_ex(out, q, scale_inv, NULL);
}

/* ---- per-row current scaling --------------------------------------------------------------------- */
__global__ void __launch_bounds__(AL_CU_THREADS) al_fp8_rows_kernel(uint8_t *out, float *sinv, al_td x, int64_t rows,
                                                                   int64_t rowlen, int32_t fmt, double p2) {
    __shared__ double sh[32];
    const double fmax = al_fp8_fmax(fmt);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        double m = 0.0;
        for (int64_t k = threadIdx.x; k < rowlen; k += blockDim.x) {
            double v = al_ld_f64(x.data, x.dtype, al_td_off1(r * rowlen + k, x));
            m = al_amax_comb<double>(m, v < 0.0 ? -v : v);
        }
        m = al_block_amax<double>(m, sh);
        const double scale = al_fp8_current_scale(fmax, m, p2);
        if (threadIdx.x == 0) sinv[r] = (float)(1.0 / scale);
        for (int64_t k = threadIdx.x; k < rowlen; k += blockDim.x) {
            int64_t i = r * rowlen + k;
            out[i] = al_fp8_encode(fmt, al_ld_f64(x.data, x.dtype, al_td_off1(i, x)) * scale);
        }
    }
}

static al_status cu_quantize_rows(al_tensor *out, al_tensor *scale_inv, const al_tensor *x, int32_t row_dims, double p2) {
    cudaStream_t s;
    const int32_t dev = x->device_index;
    AL_TRY(al_cu_begin("fp8_quantize_rows", dev, &s));
    al_td t = al_td_from(x);
    int64_t n = al_td_numel(&t), rowlen = 1;
    for (int32_t d = x->ndim - row_dims; d < x->ndim; d++) rowlen *= x->size[d];
    int64_t rows = rowlen ? n / rowlen : 0;
    al_td_coalesce(1, &t);
    int64_t cap = (int64_t)al_cu_sm_count[dev] * 8;
    unsigned grid = (unsigned)(rows < cap ? rows : cap);
    if (grid < 1) grid = 1;
    al_fp8_rows_kernel<<<grid, AL_CU_THREADS, 0, s>>>((uint8_t *)al_tensor_data_ptr(out), (float *)al_tensor_data_ptr(scale_inv),
                                                      t, rows, rowlen, out->dtype, p2);
    AL_CUDA_LAUNCHED_K("al_fp8_rows_kernel");
    return AL_OK;
}

/* ---- MXFP8 ------------------------------------------------------------------------------------ */
/* xb: x with extent nb at dim and stride 32*stride (block bases); ob: the contiguous output likewise;
 * sc: the scales. inner = product of the extents after dim (to recover the block's index along dim). */
__global__ void __launch_bounds__(AL_CU_THREADS) al_mx_kernel(al_td xb, al_td ob, al_td sc, int64_t nblocks,
                                                             int64_t inner, int64_t nb, int64_t n, int64_t xs,
                                                             int64_t os, int32_t fmt, int quant) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const double fmax = al_fp8_fmax(fmt);
    for (int64_t bi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; bi < nblocks; bi += stride) {
        int64_t ox, oo, os2;
        al_td_off3(bi, xb, ob, sc, &ox, &oo, &os2);
        const int64_t j0 = ((bi / inner) % nb) * 32;
        const int64_t len = n - j0 < 32 ? n - j0 : 32;
        uint8_t *scb = (uint8_t *)sc.data;
        if (quant) {
            double m = 0.0;
            for (int64_t j = 0; j < len; j++) {
                double v = al_ld_f64(xb.data, xb.dtype, ox + j * xs);
                m = al_amax_comb<double>(m, v < 0.0 ? -v : v);
            }
            uint8_t code = al_e8m0_from_amax(m, fmax);
            scb[os2] = code;
            const double inv = al_e8m0_inverse(code);
            uint8_t *o = (uint8_t *)ob.data;
            for (int64_t j = 0; j < len; j++) o[oo + j * os] = al_fp8_encode(fmt, al_ld_f64(xb.data, xb.dtype, ox + j * xs) * inv);
        } else {
            const double v = al_e8m0_value(scb[os2]);
            const uint8_t *q = (const uint8_t *)xb.data;
            for (int64_t j = 0; j < len; j++) al_st_f64(ob.data, ob.dtype, oo + j * os, al_fp8_decode(fmt, q[ox + j * xs]) * v);
        }
    }
}

static al_status cu_mx(const char *op, al_tensor *out, const al_tensor *scales, const al_tensor *x, int32_t dim, int quant) {
    cudaStream_t s;
    const int32_t dev = x->device_index;
    AL_TRY(al_cu_begin(op, dev, &s));
    const int64_t n = x->size[dim], nb = (n + 31) / 32;
    al_td xb = al_td_from(x), ob = al_td_from(out), sc = al_td_from(scales);
    int64_t ostr[AL_MAX_DIMS];
    al_contiguous_strides(out->ndim, out->size, ostr);
    int64_t inner = 1;
    for (int32_t d = dim + 1; d < x->ndim; d++) inner *= x->size[d];
    const int64_t xs = x->stride[dim], os = ostr[dim];
    for (int32_t d = 0; d < x->ndim; d++) {
        xb.size[d] = ob.size[d] = sc.size[d] = d == dim ? nb : x->size[d];
        ob.stride[d] = ostr[d];
    }
    xb.stride[dim] = 32 * xs;
    ob.stride[dim] = 32 * os;
    ob.offset = out->offset;
    int64_t nblocks = al_td_numel(&xb);
    if (nblocks == 0) return AL_OK;
    /* no coalescing: the kernel needs the block index along dim, recovered from the row-major index */
    al_mx_kernel<<<al_cu_grid(dev, nblocks), AL_CU_THREADS, 0, s>>>(xb, ob, sc, nblocks, inner, nb, n, xs, os,
                                                                    quant ? out->dtype : x->dtype, quant);
    AL_CUDA_LAUNCHED_K("al_mx_kernel");
    return AL_OK;
}

static al_status cu_mx_quantize(al_tensor *out, al_tensor *scales, const al_tensor *x, int32_t dim) {
    return cu_mx("mxfp8_quantize", out, scales, x, dim, 1);
}
static al_status cu_mx_dequantize(al_tensor *out, const al_tensor *q, const al_tensor *scales, int32_t dim) {
    return cu_mx("mxfp8_dequantize", out, scales, q, dim, 0);
}

void al_cu_fp8_fill_api(al_cuda_api *api) {
    api->amax = cu_amax;
    api->amax_to = cu_amax_to;
    api->fp8_quantize = cu_quantize;
    api->fp8_quantize_amax = cu_quantize_amax;
    api->fp8_quantize_dev = cu_quantize_dev;
    api->fp8_dequantize = cu_dequantize;
    api->fp8_quantize_rows = cu_quantize_rows;
    api->mxfp8_quantize = cu_mx_quantize;
    api->mxfp8_dequantize = cu_mx_dequantize;
}
