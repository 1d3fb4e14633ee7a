/*
 * cuda/elementwise.cu — unary, binary, binary-with-scalar and where, over any strides and dtypes.
 *
 * Operands arrive expanded to out's shape (stride 0 where broadcast). Their dims are coalesced
 * jointly, so a dense operation runs as one flat loop with no index division. Values are computed
 * in float when every operand is f32/f16/bf16/fp8/u8/bool, and in double when any is f64, i32 or
 * i64 (the CPU's generic path computes in double; float results agree within float rounding).
 * Comparisons write 1/0 through the output dtype's store (bool on the front door's outputs).
 * NaN rules follow src/cpu/elementwise.c: maximum/minimum propagate NaN.
 * where reads the condition byte (bool or u8, any non-zero is true) and moves the chosen value
 * through double, which is exact for every dtype but i64 beyond 2^53 (as on the CPU).
 */
#include "cuda/cuda_internal.h"

static __device__ __forceinline__ float al_cu_unary_fn(int32_t op, float x) {
    switch (op) {
    case AL_UNARY_NEG: return -x;
    case AL_UNARY_ABS: return fabsf(x);
    case AL_UNARY_EXP: return expf(x);
    case AL_UNARY_LOG: return logf(x);
    case AL_UNARY_SQRT: return sqrtf(x);
    case AL_UNARY_TANH: return tanhf(x);
    default: return __int_as_float(0x7fc00000);
    }
}
static __device__ __forceinline__ double al_cu_unary_fn(int32_t op, double x) {
    switch (op) {
    case AL_UNARY_NEG: return -x;
    case AL_UNARY_ABS: return fabs(x);
    case AL_UNARY_EXP: return exp(x);
    case AL_UNARY_LOG: return log(x);
    case AL_UNARY_SQRT: return sqrt(x);
    case AL_UNARY_TANH: return tanh(x);
    default: return __longlong_as_double(0x7ff8000000000000ll);
    }
}

static __device__ __forceinline__ float al_pow(float x, float y) { return powf(x, y); }
static __device__ __forceinline__ double al_pow(double x, double y) { return pow(x, y); }

template <typename C> static __device__ __forceinline__ C al_cu_binary_fn(int32_t op, C x, C y) {
    switch (op) {
    case AL_BINARY_ADD: return x + y;
    case AL_BINARY_SUB: return x - y;
    case AL_BINARY_MUL: return x * y;
    case AL_BINARY_DIV: return x / y;
    case AL_BINARY_MAXIMUM: return (x != x) ? x : (y != y) ? y : (x > y ? x : y);
    case AL_BINARY_MINIMUM: return (x != x) ? x : (y != y) ? y : (x < y ? x : y);
    case AL_BINARY_POW: return al_pow(x, y);
    case AL_BINARY_EQ: return (C)(x == y);
    case AL_BINARY_NE: return (C)(x != y);
    case AL_BINARY_LT: return (C)(x < y);
    case AL_BINARY_LE: return (C)(x <= y);
    case AL_BINARY_GT: return (C)(x > y);
    case AL_BINARY_GE: return (C)(x >= y);
    default: return (C)0 / (C)0;
    }
}

template <typename C>
__global__ void __launch_bounds__(AL_CU_THREADS) al_unary_kernel(int32_t op, al_td o, al_td a, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t oo, oa;
        al_td_off2(i, o, a, &oo, &oa);
        al_st(o.data, o.dtype, oo, al_cu_unary_fn(op, al_ld<C>(a.data, a.dtype, oa)));
    }
}

template <typename C>
__global__ void __launch_bounds__(AL_CU_THREADS) al_binary_kernel(int32_t op, al_td o, al_td a, al_td b, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t oo, oa, ob;
        al_td_off3(i, o, a, b, &oo, &oa, &ob);
        al_st(o.data, o.dtype, oo, al_cu_binary_fn<C>(op, al_ld<C>(a.data, a.dtype, oa), al_ld<C>(b.data, b.dtype, ob)));
    }
}

/* The common dense all-f32 case: 16-byte vectors (float4), pointers 16-byte aligned. */
__global__ void __launch_bounds__(AL_CU_THREADS) al_binary_f32x4_kernel(int32_t op, float4 *o, const float4 *a,
                                                                       const float4 *b, int64_t nvec) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride) {
        float4 x = a[v], y = b[v], r;
        r.x = al_cu_binary_fn<float>(op, x.x, y.x);
        r.y = al_cu_binary_fn<float>(op, x.y, y.y);
        r.z = al_cu_binary_fn<float>(op, x.z, y.z);
        r.w = al_cu_binary_fn<float>(op, x.w, y.w);
        o[v] = r;
    }
}

template <typename C>
__global__ void __launch_bounds__(AL_CU_THREADS) al_scalar_kernel(int32_t op, al_td o, al_td a, C s, int32_t first,
                                                                 int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t oo, oa;
        al_td_off2(i, o, a, &oo, &oa);
        C x = al_ld<C>(a.data, a.dtype, oa);
        al_st(o.data, o.dtype, oo, first ? al_cu_binary_fn<C>(op, s, x) : al_cu_binary_fn<C>(op, x, s));
    }
}

__global__ void __launch_bounds__(AL_CU_THREADS) al_where_kernel(al_td o, al_td c, al_td a, al_td b, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t oo, oc, oa, ob;
        al_td_off4(i, o, c, a, b, &oo, &oc, &oa, &ob);
        double v = ((const uint8_t *)c.data)[oc] ? al_ld_f64(a.data, a.dtype, oa) : al_ld_f64(b.data, b.dtype, ob);
        al_st_f64(o.data, o.dtype, oo, v);
    }
}

/* Common checks: every operand on out's device, same ndim and extents (the front door expands). */
static al_status check_operand(const char *op, const al_tensor *out, const al_tensor *t, const char *name) {
    if (t->device_type != AL_DEVICE_CUDA || t->device_index != out->device_index)
        return al_error(AL_ERR_INTERNAL, "%s (cuda): %s is not on cuda:%d", op, name, out->device_index);
    if (t->ndim != out->ndim) return al_error(AL_ERR_INTERNAL, "%s (cuda): %s has %d dims, out %d", op, name, t->ndim, out->ndim);
    for (int32_t d = 0; d < out->ndim; d++)
        if (t->size[d] != out->size[d])
            return al_error(AL_ERR_INTERNAL, "%s (cuda): %s extent %lld != out extent %lld at dim %d", op, name,
                            (long long)t->size[d], (long long)out->size[d], d);
    if (al_dtype_size(t->dtype) == 0) return al_error(AL_ERR_ARG, "%s (cuda): %s has unknown dtype code %d", op, name, t->dtype);
    return AL_OK;
}

static int wide_any(const al_tensor *a, const al_tensor *b, const al_tensor *c) {
    return al_td_wide(a->dtype) || (b && al_td_wide(b->dtype)) || (c && al_td_wide(c->dtype));
}

al_status al_cu_unary(int32_t op, al_tensor *out, const al_tensor *a) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("unary", out->device_index, &s));
    if (op < AL_UNARY_NEG || op > AL_UNARY_TANH) return al_error(AL_ERR_ARG, "unary (cuda): unknown op code %d", op);
    AL_TRY(check_operand("unary", out, out, "out"));
    AL_TRY(check_operand("unary", out, a, "a"));
    al_td t[2] = {al_td_from(out), al_td_from(a)};
    int64_t n = al_td_numel(&t[0]);
    if (n == 0) return AL_OK;
    al_td_coalesce(2, t);
    unsigned grid = al_cu_grid(out->device_index, n);
    if (wide_any(out, a, NULL)) al_unary_kernel<double><<<grid, AL_CU_THREADS, 0, s>>>(op, t[0], t[1], n);
    else al_unary_kernel<float><<<grid, AL_CU_THREADS, 0, s>>>(op, t[0], t[1], n);
    AL_CUDA_LAUNCHED_K("al_unary_kernel");
    return AL_OK;
}

al_status al_cu_binary(int32_t op, al_tensor *out, const al_tensor *a, const al_tensor *b) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("binary", out->device_index, &s));
    if (op < AL_BINARY_ADD || op > AL_BINARY_GE) return al_error(AL_ERR_ARG, "binary (cuda): unknown op code %d", op);
    AL_TRY(check_operand("binary", out, out, "out"));
    AL_TRY(check_operand("binary", out, a, "a"));
    AL_TRY(check_operand("binary", out, b, "b"));
    int64_t n = 1;
    for (int32_t d = 0; d < out->ndim; d++) n *= out->size[d];
    if (n == 0) return AL_OK;
    if (out->dtype == AL_DTYPE_F32 && a->dtype == AL_DTYPE_F32 && b->dtype == AL_DTYPE_F32 && op <= AL_BINARY_POW &&
        al_td_dense(out) && al_td_dense(a) && al_td_dense(b)) {
        float *po = (float *)al_tensor_data_ptr(out);
        const float *pa = (const float *)al_tensor_data_ptr(a), *pb = (const float *)al_tensor_data_ptr(b);
        if (n % 4 == 0 && (uintptr_t)po % 16 == 0 && (uintptr_t)pa % 16 == 0 && (uintptr_t)pb % 16 == 0) {
            int64_t nvec = n / 4, blocks = (nvec + AL_CU_THREADS - 1) / AL_CU_THREADS;
            if (blocks > (1 << 20)) blocks = 1 << 20;
            al_binary_f32x4_kernel<<<(unsigned)blocks, AL_CU_THREADS, 0, s>>>(op, (float4 *)po, (const float4 *)pa,
                                                                               (const float4 *)pb, nvec);
            AL_CUDA_LAUNCHED_K("al_binary_f32x4_kernel");
            return AL_OK;
        }
    }
    al_td t[3] = {al_td_from(out), al_td_from(a), al_td_from(b)};
    al_td_coalesce(3, t);
    unsigned grid = al_cu_grid(out->device_index, n);
    if (wide_any(out, a, b)) al_binary_kernel<double><<<grid, AL_CU_THREADS, 0, s>>>(op, t[0], t[1], t[2], n);
    else al_binary_kernel<float><<<grid, AL_CU_THREADS, 0, s>>>(op, t[0], t[1], t[2], n);
    AL_CUDA_LAUNCHED_K("al_binary_kernel");
    return AL_OK;
}

al_status al_cu_binary_scalar(int32_t op, al_tensor *out, const al_tensor *a, double sc, int32_t scalar_first) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("binary_scalar", out->device_index, &s));
    if (op < AL_BINARY_ADD || op > AL_BINARY_GE)
        return al_error(AL_ERR_ARG, "binary_scalar (cuda): unknown op code %d", op);
    AL_TRY(check_operand("binary_scalar", out, out, "out"));
    AL_TRY(check_operand("binary_scalar", out, a, "a"));
    al_td t[2] = {al_td_from(out), al_td_from(a)};
    int64_t n = al_td_numel(&t[0]);
    if (n == 0) return AL_OK;
    al_td_coalesce(2, t);
    unsigned grid = al_cu_grid(out->device_index, n);
    if (wide_any(out, a, NULL))
        al_scalar_kernel<double><<<grid, AL_CU_THREADS, 0, s>>>(op, t[0], t[1], sc, scalar_first, n);
    else
        al_scalar_kernel<float><<<grid, AL_CU_THREADS, 0, s>>>(op, t[0], t[1], (float)sc, scalar_first, n);
    AL_CUDA_LAUNCHED_K("al_scalar_kernel");
    return AL_OK;
}

al_status al_cu_where(al_tensor *out, const al_tensor *cond, const al_tensor *a, const al_tensor *b) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("where", out->device_index, &s));
    AL_TRY(check_operand("where", out, out, "out"));
    AL_TRY(check_operand("where", out, cond, "cond"));
    AL_TRY(check_operand("where", out, a, "a"));
    AL_TRY(check_operand("where", out, b, "b"));
    if (al_dtype_size(cond->dtype) != 1)
        return al_error(AL_ERR_ARG, "where (cuda): cond must be bool or u8, got %s", al_dtype_name(cond->dtype));
    al_td t[4] = {al_td_from(out), al_td_from(cond), al_td_from(a), al_td_from(b)};
    int64_t n = al_td_numel(&t[0]);
    if (n == 0) return AL_OK;
    al_td_coalesce(4, t);
    al_where_kernel<<<al_cu_grid(out->device_index, n), AL_CU_THREADS, 0, s>>>(t[0], t[1], t[2], t[3], n);
    AL_CUDA_LAUNCHED_K("al_where_kernel");
    return AL_OK;
}
