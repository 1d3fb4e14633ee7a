/*
 * cuda/reduce.cu — reductions over any strides: sum / mean / amax / amin over a dim mask, max along
 * one dim with i64 indices, softmax / log-softmax along one dim, and diff_stats (the CUDA side of
 * al_max_abs_diff / al_rmse / al_allclose).
 *
 * reduce: a's dims split into the kept ("outer", one output each) and the reduced ("inner") dims,
 *   each coalesced. Short inner walks (<= 64 elements) run one thread per output; longer ones run
 *   one block per (output, split): the inner walk is cut into `nsplit` chunks so that even a full
 *   reduction keeps every SM busy; each block reduces its chunk (warp shuffles, then shared memory)
 *   and either stores the result (nsplit == 1) or writes a partial that a final pass combines.
 *   Accumulation in f32 (f64 for f64 / i32 / i64 inputs); amax/amin propagate NaN.
 * max_dim, softmax: one block per row (32 threads for rows up to 1024 elements, else 256), rows
 *   walked grid-stride. max_dim keeps the first maximum and the first NaN (as the CPU does), values
 *   moved through double (exact). softmax: max, sum of exp(x - max), then exp(x - max) * (1/sum) or
 *   x - max - log(sum), in f32 (f64 for f64), like src/cpu/softmax.c.
 * diff_stats: per element, |a-b| under al_allclose's NaN rules, in double; block partials then one
 *   final block; the three results come back with one synchronous copy.
 */
#include "cuda/cuda_internal.h"

/* ---- combining ------------------------------------------------------------------------------- */
template <typename C> static __device__ __forceinline__ C al_red_combine(int32_t op, C x, C y) {
    if (op == AL_REDUCE_SUM || op == AL_REDUCE_MEAN) return x + y;
    if (x != x) return x;
    if (y != y) return y;
    if (op == AL_REDUCE_AMAX) return x > y ? x : y;
    return x < y ? x : y;
}

template <typename C> static __device__ __forceinline__ C al_red_identity(int32_t op) {
    if (op == AL_REDUCE_AMAX) return -(C)INFINITY;
    if (op == AL_REDUCE_AMIN) return (C)INFINITY;
    return (C)0;
}

/* Reduce v over the block (blockDim.x a multiple of 32, at most 1024); the result is valid in
 * every thread. sh must hold 32 values. */
template <typename C> static __device__ __forceinline__ C al_block_reduce(int32_t op, C v, C *sh) {
    for (int o = 16; o > 0; o >>= 1) v = al_red_combine<C>(op, v, __shfl_xor_sync(0xffffffffu, v, o));
    int nw = blockDim.x / 32;
    if (nw == 1) return v;
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    __syncthreads();                 /* sh may still be read from a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : al_red_identity<C>(op);
    for (int o = 16; o > 0; o >>= 1) v = al_red_combine<C>(op, v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- reduce ---------------------------------------------------------------------------------- */
template <typename C>
__global__ void __launch_bounds__(AL_CU_THREADS) al_reduce_thread_kernel(int32_t op, al_td out, al_td a, al_td inner,
                                                                        int64_t nout, int64_t ninner) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < nout; o += stride) {
        int64_t oo, oa;
        al_td_off2(o, out, a, &oo, &oa);
        C acc = al_red_identity<C>(op);
        for (int64_t j = 0; j < ninner; j++) acc = al_red_combine<C>(op, acc, al_ld<C>(a.data, a.dtype, oa + al_td_off1(j, inner)));
        if (op == AL_REDUCE_MEAN) acc = acc / (C)ninner;
        al_st(out.data, out.dtype, oo, acc);
    }
}

/* grid.x = nsplit chunks of the inner walk, grid.y walks the outputs. */
template <typename C>
__global__ void __launch_bounds__(AL_CU_THREADS) al_reduce_block_kernel(int32_t op, al_td out, al_td a, al_td inner,
                                                                       int64_t nout, int64_t ninner, int64_t chunk,
                                                                       C *partial) {
    __shared__ C sh[32];
    int64_t lo = (int64_t)blockIdx.x * chunk, hi = lo + chunk < ninner ? lo + chunk : ninner;
    for (int64_t o = blockIdx.y; o < nout; o += gridDim.y) {
        int64_t oo, oa;
        al_td_off2(o, out, a, &oo, &oa);
        C acc = al_red_identity<C>(op);
        for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x)
            acc = al_red_combine<C>(op, acc, al_ld<C>(a.data, a.dtype, oa + al_td_off1(j, inner)));
        acc = al_block_reduce<C>(op, acc, sh);
        if (threadIdx.x == 0) {
            if (partial) {
                partial[o * gridDim.x + blockIdx.x] = acc;
            } else {
                if (op == AL_REDUCE_MEAN) acc = acc / (C)ninner;
                al_st(out.data, out.dtype, oo, acc);
            }
        }
    }
}

template <typename C>
__global__ void __launch_bounds__(AL_CU_THREADS) al_reduce_final_kernel(int32_t op, al_td out, int64_t nout,
                                                                       int64_t ninner, int64_t nsplit, const C *partial) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < nout; o += stride) {
        C acc = al_red_identity<C>(op);
        for (int64_t k = 0; k < nsplit; k++) acc = al_red_combine<C>(op, acc, partial[o * nsplit + k]);
        if (op == AL_REDUCE_MEAN) acc = acc / (C)ninner;
        al_st(out.data, out.dtype, al_td_off1(o, out), acc);
    }
}

template <typename C>
static al_status reduce_launch(int32_t op, int32_t dev, cudaStream_t s, al_td *ot, al_td *it, int64_t nout,
                               int64_t ninner) {
    if (ninner <= 64) {
        al_reduce_thread_kernel<C><<<al_cu_grid(dev, nout), AL_CU_THREADS, 0, s>>>(op, ot[0], ot[1], *it, nout, ninner);
        AL_CUDA_LAUNCHED_K("al_reduce_thread_kernel");
        return AL_OK;
    }
    int64_t target = (int64_t)al_cu_sm_count[dev] * 4;
    int64_t nsplit = nout >= target ? 1 : (target + nout - 1) / nout;
    int64_t max_split = (ninner + 4095) / 4096;          /* chunks of at least 4096 elements */
    if (nsplit > max_split) nsplit = max_split;
    if (nsplit > 1024) nsplit = 1024;
    if (nsplit < 1) nsplit = 1;
    int64_t chunk = (ninner + nsplit - 1) / nsplit;
    unsigned gy = (unsigned)(nout < 65535 ? nout : 65535);
    dim3 grid((unsigned)nsplit, gy);
    if (nsplit == 1) {
        al_reduce_block_kernel<C><<<grid, AL_CU_THREADS, 0, s>>>(op, ot[0], ot[1], *it, nout, ninner, chunk, (C *)NULL);
        AL_CUDA_LAUNCHED_K("al_reduce_block_kernel");
        return AL_OK;
    }
    int64_t pbytes = nout * nsplit * (int64_t)sizeof(C);
    void *partial = NULL;
    AL_TRY(al_cu_malloc(dev, pbytes, &partial));
    al_status st = AL_OK;
    al_reduce_block_kernel<C><<<grid, AL_CU_THREADS, 0, s>>>(op, ot[0], ot[1], *it, nout, ninner, chunk, (C *)partial);
    st = AL_CUDA_ST(cudaGetLastError());
    if (st == AL_OK) {
        al_reduce_final_kernel<C><<<al_cu_grid(dev, nout), AL_CU_THREADS, 0, s>>>(op, ot[0], nout, ninner, nsplit,
                                                                                  (const C *)partial);
        st = AL_CUDA_ST(cudaGetLastError());
    }
    al_cu_free(dev, partial, pbytes);   /* stream-ordered reuse: safe to recycle now */
    return st;
}

al_status al_cu_reduce(int32_t op, al_tensor *out, const al_tensor *a, uint32_t dim_mask) {
    cudaStream_t s;
    int32_t dev = out->device_index;
    AL_TRY(al_cu_begin("reduce", dev, &s));
    if (op < AL_REDUCE_SUM || op > AL_REDUCE_AMIN) return al_error(AL_ERR_ARG, "reduce (cuda): unknown op code %d", op);
    if (a->device_index != dev || out->ndim != a->ndim)
        return al_error(AL_ERR_INTERNAL, "reduce (cuda): out and a disagree on device or ndim");
    for (int32_t d = 0; d < a->ndim; d++)
        if (out->size[d] != (((dim_mask >> d) & 1u) ? 1 : a->size[d]))
            return al_error(AL_ERR_INTERNAL, "reduce (cuda): out is not a's keepdim shape at dim %d", d);
    al_td ot[2] = {al_td_from(out), al_td_from(a)};
    al_td it = al_td_from(a);
    it.offset = 0;
    for (int32_t d = 0; d < a->ndim; d++) {
        int r = (dim_mask >> d) & 1u;
        ot[1].size[d] = r ? 1 : a->size[d];
        it.size[d] = r ? a->size[d] : 1;
    }
    int64_t nout = al_td_numel(&ot[0]), ninner = al_td_numel(&it);
    if (nout == 0) return AL_OK;
    al_td_coalesce(2, ot);
    al_td_coalesce(1, &it);
    if (al_td_wide(a->dtype)) return reduce_launch<double>(op, dev, s, ot, &it, nout, ninner);
    return reduce_launch<float>(op, dev, s, ot, &it, nout, ninner);
}

/* ---- max_dim ---------------------------------------------------------------------------------- */
/* (value, index) pairs: the first NaN wins, else the larger value, ties to the smaller index;
 * idx < 0 marks "nothing yet". */
static __device__ __forceinline__ void al_argmax_combine(double *v, int64_t *i, double v2, int64_t i2) {
    if (i2 < 0) return;
    if (*i < 0) { *v = v2; *i = i2; return; }
    int n1 = *v != *v, n2 = v2 != v2;
    int take;
    if (n1 || n2) take = n2 && (!n1 || i2 < *i);
    else take = v2 > *v || (v2 == *v && i2 < *i);
    if (take) { *v = v2; *i = i2; }
}

__global__ void al_max_dim_kernel(al_td vals, al_td idx, al_td a, int64_t rows, int64_t len, int64_t sa) {
    __shared__ double shv[32];
    __shared__ int64_t shi[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t ov, oi, oa;
        al_td_off3(r, vals, idx, a, &ov, &oi, &oa);
        double best = 0.0;
        int64_t arg = -1;
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
            al_argmax_combine(&best, &arg, al_ld_f64(a.data, a.dtype, oa + j * sa), j);
        for (int o = 16; o > 0; o >>= 1) {
            double v2 = __shfl_xor_sync(0xffffffffu, best, o);
            int64_t i2 = __shfl_xor_sync(0xffffffffu, arg, o);
            al_argmax_combine(&best, &arg, v2, i2);
        }
        int nw = blockDim.x / 32, lane = threadIdx.x % 32, w = threadIdx.x / 32;
        if (nw > 1) {
            __syncthreads();
            if (lane == 0) { shv[w] = best; shi[w] = arg; }
            __syncthreads();
            if (w == 0) {
                best = lane < nw ? shv[lane] : 0.0;
                arg = lane < nw ? shi[lane] : -1;
                for (int o = 16; o > 0; o >>= 1) {
                    double v2 = __shfl_xor_sync(0xffffffffu, best, o);
                    int64_t i2 = __shfl_xor_sync(0xffffffffu, arg, o);
                    al_argmax_combine(&best, &arg, v2, i2);
                }
            }
        }
        if (threadIdx.x == 0) {
            al_st_f64(vals.data, vals.dtype, ov, best);
            ((int64_t *)idx.data)[oi] = arg;
        }
    }
}

static unsigned row_threads(int64_t len) { return len <= 1024 ? 32u : (unsigned)AL_CU_THREADS; }
static unsigned row_grid(int32_t dev, int64_t rows, unsigned threads) {
    int64_t cap = (int64_t)al_cu_sm_count[dev] * (threads == 32 ? 32 : 8);
    return (unsigned)(rows < cap ? (rows > 0 ? rows : 1) : cap);
}

al_status al_cu_max_dim(al_tensor *values, al_tensor *indices, const al_tensor *a, int32_t dim) {
    cudaStream_t s;
    int32_t dev = values->device_index;
    AL_TRY(al_cu_begin("max_dim", dev, &s));
    if (dim < 0 || dim >= a->ndim) return al_error(AL_ERR_ARG, "max_dim (cuda): dim %d out of range for %d dims", dim, a->ndim);
    if (indices->dtype != AL_DTYPE_I64) return al_error(AL_ERR_INTERNAL, "max_dim (cuda): indices must be i64");
    if (values->ndim != a->ndim || indices->ndim != a->ndim)
        return al_error(AL_ERR_INTERNAL, "max_dim (cuda): values/indices must be in keepdim form");
    int64_t len = a->size[dim];
    al_td t[3] = {al_td_from(values), al_td_from(indices), al_td_from(a)};
    t[2].size[dim] = 1;
    for (int k = 0; k < 2; k++)
        for (int32_t d = 0; d < a->ndim; d++)
            if (t[k].size[d] != t[2].size[d]) return al_error(AL_ERR_INTERNAL, "max_dim (cuda): output shape mismatch at dim %d", d);
    int64_t rows = al_td_numel(&t[2]);
    if (rows == 0) return AL_OK;
    if (len == 0) return al_error(AL_ERR_ARG, "max_dim (cuda): dim %d has extent 0", dim);
    int64_t sa = a->stride[dim];
    al_td_coalesce(3, t);
    unsigned th = row_threads(len);
    al_max_dim_kernel<<<row_grid(dev, rows, th), th, 0, s>>>(t[0], t[1], t[2], rows, len, sa);
    AL_CUDA_LAUNCHED_K("al_max_dim_kernel");
    return AL_OK;
}

/* ---- softmax ---------------------------------------------------------------------------------- */
static __device__ __forceinline__ float al_exp(float x) { return expf(x); }
static __device__ __forceinline__ double al_exp(double x) { return exp(x); }
static __device__ __forceinline__ float al_log(float x) { return logf(x); }
static __device__ __forceinline__ double al_log(double x) { return log(x); }

template <typename C>
__global__ void al_softmax_kernel(al_td out, al_td a, int64_t rows, int64_t len, int64_t sa, int64_t so, int32_t is_log) {
    __shared__ C sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t oo, oa;
        al_td_off2(r, out, a, &oo, &oa);
        /* max, ignoring NaN as the CPU's `x > m ? x : m` does */
        C m = -(C)INFINITY;
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
            C x = al_ld<C>(a.data, a.dtype, oa + j * sa);
            m = x > m ? x : m;
        }
        for (int o = 16; o > 0; o >>= 1) {
            C y = __shfl_xor_sync(0xffffffffu, m, o);
            m = y > m ? y : m;
        }
        int nw = blockDim.x / 32, lane = threadIdx.x % 32, w = threadIdx.x / 32;
        if (nw > 1) {
            __syncthreads();
            if (lane == 0) sh[w] = m;
            __syncthreads();
            m = -(C)INFINITY;
            for (int k = 0; k < nw; k++) m = sh[k] > m ? sh[k] : m;
        }
        C sum = 0;
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x) sum += al_exp(al_ld<C>(a.data, a.dtype, oa + j * sa) - m);
        sum = al_block_reduce<C>(AL_REDUCE_SUM, sum, sh);
        if (is_log) {
            C lse = al_log(sum);
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                al_st(out.data, out.dtype, oo + j * so, al_ld<C>(a.data, a.dtype, oa + j * sa) - m - lse);
        } else {
            C inv = (C)1 / sum;
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                al_st(out.data, out.dtype, oo + j * so, al_exp(al_ld<C>(a.data, a.dtype, oa + j * sa) - m) * inv);
        }
        __syncthreads();   /* sh is reused by the next row */
    }
}

al_status al_cu_softmax(al_tensor *out, const al_tensor *a, int32_t dim, int32_t is_log) {
    cudaStream_t s;
    int32_t dev = out->device_index;
    AL_TRY(al_cu_begin("softmax", dev, &s));
    if (dim < 0 || dim >= a->ndim) return al_error(AL_ERR_ARG, "softmax (cuda): dim %d out of range for %d dims", dim, a->ndim);
    if (out->ndim != a->ndim) return al_error(AL_ERR_INTERNAL, "softmax (cuda): out and a differ in ndim");
    for (int32_t d = 0; d < a->ndim; d++)
        if (out->size[d] != a->size[d]) return al_error(AL_ERR_INTERNAL, "softmax (cuda): out and a differ in shape at dim %d", d);
    int64_t len = a->size[dim], sa = a->stride[dim], so = out->stride[dim];
    al_td t[2] = {al_td_from(out), al_td_from(a)};
    t[0].size[dim] = 1;
    t[1].size[dim] = 1;
    int64_t rows = al_td_numel(&t[0]);
    if (rows == 0 || len == 0) return AL_OK;
    al_td_coalesce(2, t);
    unsigned th = row_threads(len), grid = row_grid(dev, rows, th);
    if (a->dtype == AL_DTYPE_F64) al_softmax_kernel<double><<<grid, th, 0, s>>>(t[0], t[1], rows, len, sa, so, is_log);
    else al_softmax_kernel<float><<<grid, th, 0, s>>>(t[0], t[1], rows, len, sa, so, is_log);
    AL_CUDA_LAUNCHED_K("al_softmax_kernel");
    return AL_OK;
}

/* ---- diff_stats -------------------------------------------------------------------------------- */
typedef struct {
    double max_abs, sum_sq;
    unsigned long long violations;
} al_diff_part;

static __device__ __forceinline__ double al_nanmax(double x, double y) {
    if (x != x || y != y) return __longlong_as_double(0x7ff8000000000000ll);
    return x > y ? x : y;
}

static __device__ void al_diff_block_reduce(al_diff_part *p, al_diff_part *sh) {
    for (int o = 16; o > 0; o >>= 1) {
        p->max_abs = al_nanmax(p->max_abs, __shfl_xor_sync(0xffffffffu, p->max_abs, o));
        p->sum_sq += __shfl_xor_sync(0xffffffffu, p->sum_sq, o);
        p->violations += __shfl_xor_sync(0xffffffffu, p->violations, o);
    }
    int nw = blockDim.x / 32, lane = threadIdx.x % 32, w = threadIdx.x / 32;
    if (nw == 1) return;
    __syncthreads();
    if (lane == 0) sh[w] = *p;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < nw; k++) {
            p->max_abs = al_nanmax(p->max_abs, sh[k].max_abs);
            p->sum_sq += sh[k].sum_sq;
            p->violations += sh[k].violations;
        }
    }
}

__global__ void __launch_bounds__(AL_CU_THREADS) al_diff_kernel(al_td a, al_td b, double atol, double rtol, int64_t n,
                                                               al_diff_part *parts) {
    __shared__ al_diff_part sh[32];
    al_diff_part p = {0.0, 0.0, 0ull};
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t oa, ob;
        al_td_off2(i, a, b, &oa, &ob);
        double x = al_ld_f64(a.data, a.dtype, oa), y = al_ld_f64(b.data, b.dtype, ob);
        double d = (x == y || (x != x && y != y)) ? 0.0 : fabs(x - y);
        p.max_abs = al_nanmax(p.max_abs, d);
        p.sum_sq = __dadd_rn(p.sum_sq, __dmul_rn(d, d));
        double tol = __dadd_rn(atol, __dmul_rn(rtol, fabs(y)));
        if (!(d == 0.0 || (isfinite(d) && d <= tol))) p.violations++;
    }
    al_diff_block_reduce(&p, sh);
    if (threadIdx.x == 0) parts[blockIdx.x] = p;
}

__global__ void al_diff_final_kernel(const al_diff_part *parts, int64_t nparts, al_diff_part *result) {
    __shared__ al_diff_part sh[32];
    al_diff_part p = {0.0, 0.0, 0ull};
    for (int64_t k = threadIdx.x; k < nparts; k += blockDim.x) {
        p.max_abs = al_nanmax(p.max_abs, parts[k].max_abs);
        p.sum_sq += parts[k].sum_sq;
        p.violations += parts[k].violations;
    }
    al_diff_block_reduce(&p, sh);
    if (threadIdx.x == 0) *result = p;
}

al_status al_cu_diff_stats(const al_tensor *a, const al_tensor *b, double atol, double rtol, double *max_abs,
                           double *sum_sq, int64_t *violations) {
    *max_abs = 0.0;
    *sum_sq = 0.0;
    *violations = 0;
    cudaStream_t s;
    int32_t dev = a->device_index;
    AL_TRY(al_cu_begin("diff_stats", dev, &s));
    if (b->device_type != AL_DEVICE_CUDA || b->device_index != dev || a->ndim != b->ndim)
        return al_error(AL_ERR_INTERNAL, "diff_stats (cuda): a and b differ in device or ndim");
    for (int32_t d = 0; d < a->ndim; d++)
        if (a->size[d] != b->size[d]) return al_error(AL_ERR_INTERNAL, "diff_stats (cuda): a and b differ in shape at dim %d", d);
    al_td t[2] = {al_td_from(a), al_td_from(b)};
    int64_t n = al_td_numel(&t[0]);
    if (n == 0) return AL_OK;
    al_td_coalesce(2, t);
    int64_t nparts = al_cu_grid(dev, n);
    int64_t bytes = (nparts + 1) * (int64_t)sizeof(al_diff_part);
    void *buf = NULL;
    AL_TRY(al_cu_malloc(dev, bytes, &buf));
    al_diff_part *parts = (al_diff_part *)buf, *result = parts + nparts, host;
    al_diff_kernel<<<(unsigned)nparts, AL_CU_THREADS, 0, s>>>(t[0], t[1], atol, rtol, n, parts);
    al_status st = AL_CUDA_ST(cudaGetLastError());
    if (st == AL_OK) {
        al_diff_final_kernel<<<1, AL_CU_THREADS, 0, s>>>(parts, nparts, result);
        st = AL_CUDA_ST(cudaGetLastError());
    }
    if (st == AL_OK) st = AL_CUDA_ST(cudaMemcpyAsync(&host, result, sizeof host, cudaMemcpyDeviceToHost, s));
    if (st == AL_OK) st = AL_CUDA_ST(cudaStreamSynchronize(s));
    al_cu_free(dev, buf, bytes);
    if (st != AL_OK) return st;
    *max_abs = host.max_abs;
    *sum_sq = host.sum_sq;
    *violations = (int64_t)host.violations;
    return AL_OK;
}
