/*
 * cuda/tensor_desc.h — the tensor descriptor the plugin's kernels take by value, and the device-side
 * element access for every dtype.
 *
 *   al_td: data (storage base), offset, ndim, size[8], stride[8] (elements), dtype. A POD of ~150
 *   bytes: kernels receive it as a parameter, so no device-side allocation is ever needed.
 *
 * Host side:
 *   al_td_from(t)            a descriptor of an al_tensor view
 *   al_td_coalesce(n, tds)   rewrites n descriptors that share one shape into the fewest dims that
 *                            walk the same elements in the same row-major order (extent-1 dims
 *                            dropped, neighbours merged when every operand's strides allow), so the
 *                            index arithmetic in kernels is as cheap as the layouts permit
 *   al_td_dense(t)           1 when a view's elements are contiguous in row-major order
 * Device side:
 *   al_td_off1..4(i, ...)    element offsets (offset included) of row-major index i in 1..4 operands
 *   al_ld_f64 / al_st_f64    load / store one element through double, exactly as the CPU's
 *                            al_load_f64 / al_store_f64 (src/convert.c) do
 *   al_ld_f32 / al_st_f32    the same through float; al_ld_f32 is exact for f32 f16 bf16 fp8 u8 bool
 *                            (use the f64 forms for f64 i32 i64: al_td_wide()), and al_st_f32(v) writes
 *                            exactly what al_st_f64((double)v) writes, for every dtype.
 * All conversions to and from f16/bf16/fp8 go through src/numeric/convert.h (bit-exact, shared with
 * the CPU). Integer stores truncate toward zero and saturate (NaN -> 0); bool stores v != 0.
 */
#ifndef ATTNLAB_CUDA_TENSOR_DESC_H
#define ATTNLAB_CUDA_TENSOR_DESC_H

/* src/internal.h has no extern "C" guard of its own: include it with C linkage so that al_error,
 * al_store_f64, ... resolve to the core library's unmangled symbols. */
#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h"
#ifdef __cplusplus
}
#endif
#include "numeric/convert.h"
#include <cuda_runtime.h>

typedef struct al_td {
    char *data;          /* storage base (device address) */
    int64_t offset;      /* elements */
    int64_t size[AL_MAX_DIMS];
    int64_t stride[AL_MAX_DIMS];
    int32_t ndim;
    int32_t dtype;
} al_td;

/* ---- host helpers ------------------------------------------------------------------------------ */
static inline al_td al_td_from(const al_tensor *t) {
    al_td d;
    memset(&d, 0, sizeof d);
    d.data = (char *)t->data;
    d.offset = t->offset;
    d.ndim = t->ndim;
    d.dtype = t->dtype;
    for (int32_t i = 0; i < t->ndim; i++) {
        d.size[i] = t->size[i];
        d.stride[i] = t->stride[i];
    }
    return d;
}

static inline int64_t al_td_numel(const al_td *t) {
    int64_t n = 1;
    for (int32_t i = 0; i < t->ndim; i++) n *= t->size[i];
    return n;
}

/* 1 when the view's elements are contiguous in row-major order (extent-1 dims ignored). */
static inline int al_td_dense_view(int32_t ndim, const int64_t *size, const int64_t *stride) {
    int64_t expect = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        if (size[d] == 1) continue;
        if (stride[d] != expect) return 0;
        expect *= size[d];
    }
    return 1;
}
static inline int al_td_dense(const al_tensor *t) { return al_td_dense_view(t->ndim, t->size, t->stride); }

/* Coalesce n descriptors of one shape (size[] of tds[0] is taken as the shape of all). */
static inline void al_td_coalesce(int n, al_td *tds) {
    int32_t nd = 0;
    int64_t size[AL_MAX_DIMS] = {0};
    int64_t st[4][AL_MAX_DIMS] = {{0}};
    for (int32_t d = 0; d < tds[0].ndim; d++) {
        if (tds[0].size[d] == 1) continue;
        if (nd > 0) {
            int merge = 1;
            for (int k = 0; k < n; k++)
                if (st[k][nd - 1] != tds[k].stride[d] * tds[0].size[d]) merge = 0;
            if (merge) {
                size[nd - 1] *= tds[0].size[d];
                for (int k = 0; k < n; k++) st[k][nd - 1] = tds[k].stride[d];
                continue;
            }
        }
        size[nd] = tds[0].size[d];
        for (int k = 0; k < n; k++) st[k][nd] = tds[k].stride[d];
        nd++;
    }
    if (nd == 0) {              /* one element: a 1-d view of extent 1 */
        size[0] = 1;
        for (int k = 0; k < n; k++) st[k][0] = 1;
        nd = 1;
    }
    for (int k = 0; k < n; k++) {
        tds[k].ndim = nd;
        for (int32_t d = 0; d < AL_MAX_DIMS; d++) {
            tds[k].size[d] = d < nd ? size[d] : 0;
            tds[k].stride[d] = d < nd ? st[k][d] : 0;
        }
    }
}

/* Whether kernels compute in double for this dtype (float loses information for these). */
static inline AL_HD int al_td_wide(int32_t dtype) {
    return dtype == AL_DTYPE_F64 || dtype == AL_DTYPE_I64 || dtype == AL_DTYPE_I32;
}

#ifdef __CUDACC__
/* ---- device: row-major index -> element offsets ------------------------------------------------- */
/* The outermost coordinate needs no modulo (i < numel), so a 1-d view costs one multiply. */
static __device__ __forceinline__ int64_t al_td_off1(int64_t i, const al_td &a) {
    int64_t o = a.offset;
    for (int32_t d = a.ndim - 1; d > 0; d--) {
        int64_t c = i % a.size[d];
        i /= a.size[d];
        o += c * a.stride[d];
    }
    return o + i * a.stride[0];
}

static __device__ __forceinline__ void al_td_off2(int64_t i, const al_td &a, const al_td &b, int64_t *oa,
                                                  int64_t *ob) {
    int64_t x = a.offset, y = b.offset;
    for (int32_t d = a.ndim - 1; d > 0; d--) {
        int64_t c = i % a.size[d];
        i /= a.size[d];
        x += c * a.stride[d];
        y += c * b.stride[d];
    }
    *oa = x + i * a.stride[0];
    *ob = y + i * b.stride[0];
}

static __device__ __forceinline__ void al_td_off3(int64_t i, const al_td &a, const al_td &b, const al_td &c3,
                                                  int64_t *oa, int64_t *ob, int64_t *oc) {
    int64_t x = a.offset, y = b.offset, z = c3.offset;
    for (int32_t d = a.ndim - 1; d > 0; d--) {
        int64_t c = i % a.size[d];
        i /= a.size[d];
        x += c * a.stride[d];
        y += c * b.stride[d];
        z += c * c3.stride[d];
    }
    *oa = x + i * a.stride[0];
    *ob = y + i * b.stride[0];
    *oc = z + i * c3.stride[0];
}

static __device__ __forceinline__ void al_td_off4(int64_t i, const al_td &a, const al_td &b, const al_td &c3,
                                                  const al_td &e, int64_t *oa, int64_t *ob, int64_t *oc,
                                                  int64_t *oe) {
    int64_t x = a.offset, y = b.offset, z = c3.offset, w = e.offset;
    for (int32_t d = a.ndim - 1; d > 0; d--) {
        int64_t c = i % a.size[d];
        i /= a.size[d];
        x += c * a.stride[d];
        y += c * b.stride[d];
        z += c * c3.stride[d];
        w += c * e.stride[d];
    }
    *oa = x + i * a.stride[0];
    *ob = y + i * b.stride[0];
    *oc = z + i * c3.stride[0];
    *oe = w + i * e.stride[0];
}

/* ---- device: element loads and stores (base = storage base, idx = element offset) --------------- */
static __device__ __forceinline__ double al_ld_f64(const char *base, int32_t dtype, int64_t idx) {
    switch (dtype) {
    case AL_DTYPE_F32: return (double)((const float *)base)[idx];
    case AL_DTYPE_F64: return ((const double *)base)[idx];
    case AL_DTYPE_F16: return al_f16_to_f64(((const uint16_t *)base)[idx]);
    case AL_DTYPE_BF16: return al_bf16_to_f64(((const uint16_t *)base)[idx]);
    case AL_DTYPE_FP8_E4M3: return al_e4m3_to_f64(((const uint8_t *)base)[idx]);
    case AL_DTYPE_FP8_E5M2: return al_e5m2_to_f64(((const uint8_t *)base)[idx]);
    case AL_DTYPE_I32: return (double)((const int32_t *)base)[idx];
    case AL_DTYPE_I64: return (double)((const int64_t *)base)[idx];
    case AL_DTYPE_U8: return (double)((const uint8_t *)base)[idx];
    case AL_DTYPE_BOOL: return ((const uint8_t *)base)[idx] ? 1.0 : 0.0;
    default: return 0.0;
    }
}

static __device__ __forceinline__ float al_ld_f32(const char *base, int32_t dtype, int64_t idx) {
    switch (dtype) {
    case AL_DTYPE_F32: return ((const float *)base)[idx];
    case AL_DTYPE_F64: return (float)((const double *)base)[idx];
    case AL_DTYPE_F16: return al_f16_to_f32(((const uint16_t *)base)[idx]);
    case AL_DTYPE_BF16: return al_bf16_to_f32(((const uint16_t *)base)[idx]);
    case AL_DTYPE_FP8_E4M3: return al_e4m3_to_f32(((const uint8_t *)base)[idx]);
    case AL_DTYPE_FP8_E5M2: return al_e5m2_to_f32(((const uint8_t *)base)[idx]);
    case AL_DTYPE_I32: return (float)((const int32_t *)base)[idx];
    case AL_DTYPE_I64: return (float)((const int64_t *)base)[idx];
    case AL_DTYPE_U8: return (float)((const uint8_t *)base)[idx];
    case AL_DTYPE_BOOL: return ((const uint8_t *)base)[idx] ? 1.0f : 0.0f;
    default: return 0.0f;
    }
}

/* Truncate toward zero, saturate to [lo, hi_excl), NaN -> 0 (src/convert.c's al__sat_trunc). */
static __device__ __forceinline__ int64_t al_sat_trunc_f64(double v, double lo, double hi_excl, int64_t mn,
                                                           int64_t mx) {
    if (v != v) return 0;
    if (v <= lo) return mn;
    if (v >= hi_excl) return mx;
    return (int64_t)v;
}

static __device__ __forceinline__ void al_st_f64(char *base, int32_t dtype, int64_t idx, double v) {
    switch (dtype) {
    case AL_DTYPE_F32: ((float *)base)[idx] = __double2float_rn(v); break;
    case AL_DTYPE_F64: ((double *)base)[idx] = v; break;
    case AL_DTYPE_F16: ((uint16_t *)base)[idx] = al_f64_to_f16(v); break;
    case AL_DTYPE_BF16: ((uint16_t *)base)[idx] = al_f64_to_bf16(v); break;
    case AL_DTYPE_FP8_E4M3: ((uint8_t *)base)[idx] = al_f64_to_e4m3(v); break;
    case AL_DTYPE_FP8_E5M2: ((uint8_t *)base)[idx] = al_f64_to_e5m2(v); break;
    case AL_DTYPE_I32:
        ((int32_t *)base)[idx] = (int32_t)al_sat_trunc_f64(v, -2147483648.0, 2147483648.0, INT32_MIN, INT32_MAX);
        break;
    case AL_DTYPE_I64:
        ((int64_t *)base)[idx] =
            al_sat_trunc_f64(v, -9223372036854775808.0, 9223372036854775808.0, INT64_MIN, INT64_MAX);
        break;
    case AL_DTYPE_U8: ((uint8_t *)base)[idx] = (uint8_t)al_sat_trunc_f64(v, 0.0, 256.0, 0, 255); break;
    case AL_DTYPE_BOOL: ((uint8_t *)base)[idx] = (uint8_t)(v != 0.0); break;
    default: break;
    }
}

/* Same bits as al_st_f64((double)v): the integer bounds below are exact in float, and every float
 * between them truncates to the same integer as its double. */
static __device__ __forceinline__ void al_st_f32(char *base, int32_t dtype, int64_t idx, float v) {
    switch (dtype) {
    case AL_DTYPE_F32: ((float *)base)[idx] = v; break;
    case AL_DTYPE_F64: ((double *)base)[idx] = (double)v; break;
    case AL_DTYPE_F16: ((uint16_t *)base)[idx] = al_f32_to_f16(v); break;
    case AL_DTYPE_BF16: ((uint16_t *)base)[idx] = al_f32_to_bf16(v); break;
    case AL_DTYPE_FP8_E4M3: ((uint8_t *)base)[idx] = al_f32_to_e4m3(v); break;
    case AL_DTYPE_FP8_E5M2: ((uint8_t *)base)[idx] = al_f32_to_e5m2(v); break;
    case AL_DTYPE_I32:
        ((int32_t *)base)[idx] = v != v ? 0 : v <= -2147483648.0f ? INT32_MIN : v >= 2147483648.0f ? INT32_MAX
                                                                                                    : (int32_t)v;
        break;
    case AL_DTYPE_I64:
        ((int64_t *)base)[idx] = v != v                       ? 0
                                 : v <= -9223372036854775808.0f ? INT64_MIN
                                 : v >= 9223372036854775808.0f  ? INT64_MAX
                                                               : (int64_t)v;
        break;
    case AL_DTYPE_U8: ((uint8_t *)base)[idx] = v != v ? 0 : v <= 0.0f ? 0 : v >= 256.0f ? 255 : (uint8_t)v; break;
    case AL_DTYPE_BOOL: ((uint8_t *)base)[idx] = (uint8_t)(v != 0.0f); break;
    default: break;
    }
}

/* Load/store in a compute type C (float or double). */
template <typename C> __device__ __forceinline__ C al_ld(const char *base, int32_t dtype, int64_t idx);
template <> __device__ __forceinline__ float al_ld<float>(const char *base, int32_t dtype, int64_t idx) {
    return al_ld_f32(base, dtype, idx);
}
template <> __device__ __forceinline__ double al_ld<double>(const char *base, int32_t dtype, int64_t idx) {
    return al_ld_f64(base, dtype, idx);
}
static __device__ __forceinline__ void al_st(char *base, int32_t dtype, int64_t idx, float v) {
    al_st_f32(base, dtype, idx, v);
}
static __device__ __forceinline__ void al_st(char *base, int32_t dtype, int64_t idx, double v) {
    al_st_f64(base, dtype, idx, v);
}
#endif /* __CUDACC__ */

#endif /* ATTNLAB_CUDA_TENSOR_DESC_H */
