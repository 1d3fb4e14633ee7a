/*
 * cuda_plugin.h — the contract between the core library (no CUDA dependency) and the CUDA plugin
 * lib/libattnlab_cuda.so, which the core loads with dlopen on first use.
 *
 * The plugin exports one symbol, `al_cuda_plugin_init`, that fills an al_cuda_api table. The core
 * validates every argument (shapes, dtypes, devices, broadcasting, output allocation) before it calls
 * the table, so the plugin's functions receive consistent descriptors: they only launch work.
 * Errors: the plugin reports failures with al_error() (exported by the core library, which the
 * plugin links against), naming the CUDA/cuBLAS call and its message.
 *
 * All device work goes to the plugin's current stream for the tensor's device; functions that
 * return data to the host (memcpy_d2h) synchronise.
 */
#ifndef ATTNLAB_CUDA_PLUGIN_H
#define ATTNLAB_CUDA_PLUGIN_H

#include "attnlab.h"
#include "numeric/fp8_delayed.h"

#define AL_CUDA_ABI_VERSION 6

typedef struct al_cuda_api {
    int32_t abi_version;                 /* AL_CUDA_ABI_VERSION */

    /* devices */
    int32_t (*device_count)(void);
    al_status (*device_info)(int32_t dev, char *name, int32_t name_len, int32_t *cc_major,
                             int32_t *cc_minor, int64_t *total_mem);
    al_status (*synchronize)(int32_t dev);
    al_status (*device_attrs)(int32_t dev, int32_t *sm_count, int64_t *l2_bytes, int32_t *smem_per_block_optin);

    /* memory: a caching allocator (freed blocks are kept per size class; no cudaFree on the hot path) */
    /* malloc serves the block from the pool of the calling thread's current stream; free returns it to
     * the pool of the stream it was allocated on (the stream current_stream() named at allocation) */
    al_status (*malloc)(int32_t dev, int64_t nbytes, void **ptr);
    void (*free)(int32_t dev, void *ptr, int64_t nbytes, void *stream);
    int64_t (*memory_reserved)(int32_t dev);
    al_status (*empty_cache)(int32_t dev);
    al_status (*memcpy_h2d)(int32_t dev, void *dst, const void *src, int64_t nbytes);
    al_status (*memcpy_d2h)(int32_t dev, void *dst, const void *src, int64_t nbytes);  /* synchronous */
    al_status (*memcpy_d2d)(int32_t dev, void *dst, const void *src, int64_t nbytes);

    /* element-wise, all operands on one device with dst's shape (broadcast already applied as
     * stride 0), arbitrary strides, any dtypes (conversions bit-identical to the CPU's) */
    al_status (*copy)(al_tensor *dst, const al_tensor *src);
    al_status (*fill)(al_tensor *dst, double v);
    al_status (*arange)(al_tensor *dst, double start, double step);
    al_status (*random)(al_tensor *dst, int32_t kind, uint64_t seed, uint64_t offset);
    al_status (*unary)(int32_t op, al_tensor *out, const al_tensor *a);
    al_status (*binary)(int32_t op, al_tensor *out, const al_tensor *a, const al_tensor *b);
    al_status (*binary_scalar)(int32_t op, al_tensor *out, const al_tensor *a, double s, int32_t scalar_first);
    al_status (*where)(al_tensor *out, const al_tensor *cond, const al_tensor *a, const al_tensor *b);

    /* reductions: out has a's ndim with reduced dims of extent 1 (keepdim form); dim_mask bit d set
     * means dim d is reduced */
    al_status (*reduce)(int32_t op, al_tensor *out, const al_tensor *a, uint32_t dim_mask);
    al_status (*max_dim)(al_tensor *values, al_tensor *indices, const al_tensor *a, int32_t dim);
    al_status (*softmax)(al_tensor *out, const al_tensor *a, int32_t dim, int32_t log);
    /* out [B..., m, n] = a [B..., m, k] x b [B..., k, n]; all three have the same ndim >= 2 and the
     * same batch extents (stride 0 where broadcast); out is contiguous */
    al_status (*matmul)(al_tensor *out, const al_tensor *a, const al_tensor *b);
    /* abs-diff statistics over two same-shape tensors: max |a-b|, sum (a-b)^2, count of elements
     * violating |a-b| <= atol + rtol*|b| (NaN rules as al_allclose) */
    al_status (*diff_stats)(const al_tensor *a, const al_tensor *b, double atol, double rtol,
                            double *max_abs, double *sum_sq, int64_t *violations);

    /* events */
    al_status (*event_new)(void **ev, int32_t dev);
    void (*event_free)(void *ev);
    al_status (*event_record)(void *ev);
    al_status (*event_synchronize)(void *ev);
    al_status (*event_elapsed)(void *start, void *end, float *ms);

    /* streams: a stream handle is the plugin's (a cudaStream_t); NULL means the device's default
     * stream. The current stream is per thread and per device; all work of the thread goes there. */
    void *(*current_stream)(int32_t dev);
    al_status (*stream_new)(void **stream, int32_t dev);
    void (*stream_free)(int32_t dev, void *stream);          /* synchronises it first */
    al_status (*stream_set)(int32_t dev, void *stream);
    al_status (*stream_synchronize)(int32_t dev, void *stream);
    al_status (*stream_query)(int32_t dev, void *stream, int32_t *done);
    al_status (*stream_wait_event)(int32_t dev, void *stream, void *ev);
    al_status (*event_record_on)(void *ev, void *stream);    /* NULL stream: the current one */

    /* FP8 (src/cuda/fp8.cu), bit-identical to src/fp8.c (numeric/fp8_scale.h). The core allocates the
     * outputs (contiguous; out->dtype is the FP8 format or the dequantised dtype); x, q any strides. */
    al_status (*amax)(const al_tensor *x, double *amax);          /* synchronous; NaN-propagating */
    /* out: a new f64 [1] tensor on x's device holding amax(x) (not canonicalised); queued, no sync */
    al_status (*amax_to)(al_tensor *out, const al_tensor *x);
    al_status (*fp8_quantize)(al_tensor *out, const al_tensor *x, double scale);
    /* fp8_quantize and amax_to in one pass: out allocated by the core, amax (f64 [1]) by the plugin */
    al_status (*fp8_quantize_amax)(al_tensor *out, al_tensor *amax, const al_tensor *x, double scale);
    al_status (*fp8_dequantize)(al_tensor *out, const al_tensor *q, double scale_inv);
    /* delayed scaling on the device (src/fp8_delayed.c): out (allocated by the core) = fp8(x * *scale) with
     * the scale read on the device, and *acc = max(*acc, amax(x)) in the same pass (acc may be NULL) */
    al_status (*fp8_quantize_dev)(al_tensor *out, const al_tensor *x, const double *scale, double *acc);
    /* al_fp8_ds_update on the device (numeric/fp8_delayed.h's steps), queued on the current stream */
    al_status (*fp8_ds_update)(int32_t dev, double *state, const al_fp8_ds_step *step);
    /* rows = the leading x->ndim - row_dims dims; scale_inv f32 [rows] (contiguous) */
    al_status (*fp8_quantize_rows)(al_tensor *out, al_tensor *scale_inv, const al_tensor *x, int32_t row_dims,
                                   double pow2_margin);
    /* scales: u8, x's shape with ceil(n/32) at dim (contiguous) */
    al_status (*mxfp8_quantize)(al_tensor *out, al_tensor *scales, const al_tensor *x, int32_t dim);
    al_status (*mxfp8_dequantize)(al_tensor *out, const al_tensor *q, const al_tensor *scales, int32_t dim);

    /* Test hook (tests/c/test_cuda_faults.c only): launches al_debug_fault_kernel on the current stream,
     * which reads an unmapped address, so the next synchronisation reports an asynchronous fault
     * naming it. It ruins the process's CUDA context: call it in a child process. */
    al_status (*debug_fault)(int32_t dev);

    /* An attention backend's counters and log as text into buf (truncated to n; buf may be NULL):
     * backend 0 = fused (cuDNN version, plans cached / built), 1 = flash (NVRTC compiles, cache loads,
     * the specialisations compiled or loaded). Returns plans built (fused) or kernels compiled (flash). */
    int64_t (*backend_info)(int32_t backend, char *buf, int64_t n);
} al_cuda_api;

/* The plugin's one exported entry point. Returns AL_OK and fills api, or an error (no driver, no
 * device, ABI mismatch) with the message set. */
typedef al_status (*al_cuda_plugin_init_fn)(al_cuda_api *api, int32_t core_abi_version);

#endif /* ATTNLAB_CUDA_PLUGIN_H */
