/*
 * cuda/cuda_internal.h — declarations shared by the CUDA plugin's files (never exported: every
 * function here has hidden visibility; the plugin's one exported symbol is al_cuda_plugin_init).
 *
 *   plugin.cu      device table, device_info, the api table
 *   allocator.cu   caching allocator and the per-device stream (al_cu_begin sets the device and
 *                  returns its stream: call it first in every entry point)
 *   copy.cu        copy / fill / arange (al_cu_copy is also used for matmul's temporaries)
 *   random.cu elementwise.cu reduce.cu matmul.cu events.cu   the rest of the api table
 */
#ifndef ATTNLAB_CUDA_INTERNAL_H
#define ATTNLAB_CUDA_INTERNAL_H

/* src/internal.h has no extern "C" guard of its own: include it with C linkage so that al_error,
 * al_store_f64, ... resolve to the core library's unmangled symbols. */
#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h"
#ifdef __cplusplus
}
#endif
#include "cuda_plugin.h"
#include "cuda/check.h"
#include "cuda/tensor_desc.h"

#define AL_CU_HIDDEN __attribute__((visibility("hidden")))
#define AL_CU_MAX_DEVICES 16
#define AL_CU_THREADS 256

/* plugin.cu: devices found at init (at most AL_CU_MAX_DEVICES), their SM counts and L2 sizes (bytes, 0 = unknown) */
extern AL_CU_HIDDEN int32_t al_cu_ndev;
extern AL_CU_HIDDEN int32_t al_cu_sm_count[AL_CU_MAX_DEVICES];
extern AL_CU_HIDDEN int64_t al_cu_l2_bytes[AL_CU_MAX_DEVICES];
AL_CU_HIDDEN al_status al_cu_check_dev(const char *op, int32_t dev);

/* allocator.cu */
AL_CU_HIDDEN al_status al_cu_begin(const char *op, int32_t dev, cudaStream_t *stream);
/* amax(x) (max |x|, NaN-propagating, not canonicalised) into *dst in device memory; queued, no sync (fp8.cu) */
AL_CU_HIDDEN al_status al_cu_amax_into(const al_tensor *x, double *dst);
/* the same, max'ed into *dst (NaN wins) when accumulate is set (fp8.cu) */
AL_CU_HIDDEN al_status al_cu_amax_into_ex(const al_tensor *x, double *dst, int accumulate);
/* out (allocated, the FP8 format as dtype) = fp8(x * scale), or fp8(x * *dscale) with dscale (device memory) */
AL_CU_HIDDEN al_status al_cu_fp8_quantize_ex(al_tensor *out, const al_tensor *x, double scale, const double *dscale);
/* out (allocated, the FP8 format as dtype) = fp8(x * scale), scale = *dscale when dscale (device memory) is
 * given; *res (device) = amax(x), or max(*res, amax(x)) with accumulate; one pass when x is dense (fp8.cu) */
AL_CU_HIDDEN al_status al_cu_fp8_quantize_amax_into(al_tensor *out, const al_tensor *x, double scale, const double *dscale,
                                                    double *res, int accumulate);
/* out (allocated) = decode(q) * scale_inv, or decode(q) / (double)(float)*dscale with dscale (device memory) */
AL_CU_HIDDEN al_status al_cu_fp8_dequantize_ex(al_tensor *out, const al_tensor *q, double scale_inv, const double *dscale);
AL_CU_HIDDEN al_status al_cu_malloc(int32_t dev, int64_t nbytes, void **ptr);
/* al_cu_free returns a block to the pool of the calling thread's current stream (temporaries made
 * and dropped inside one call); al_cu_free_on to the pool of the stream it was allocated on. */
AL_CU_HIDDEN void al_cu_free(int32_t dev, void *ptr, int64_t nbytes);
AL_CU_HIDDEN void al_cu_free_on(int32_t dev, void *ptr, int64_t nbytes, void *stream);
AL_CU_HIDDEN void *al_cu_current_stream(int32_t dev);
AL_CU_HIDDEN al_status al_cu_stream_new(void **stream, int32_t dev);
AL_CU_HIDDEN void al_cu_stream_free(int32_t dev, void *stream);
AL_CU_HIDDEN al_status al_cu_stream_set(int32_t dev, void *stream);
AL_CU_HIDDEN al_status al_cu_stream_synchronize(int32_t dev, void *stream);
AL_CU_HIDDEN al_status al_cu_stream_query(int32_t dev, void *stream, int32_t *done);
AL_CU_HIDDEN al_status al_cu_stream_wait_event(int32_t dev, void *stream, void *ev);
AL_CU_HIDDEN int64_t al_cu_memory_reserved(int32_t dev);
AL_CU_HIDDEN al_status al_cu_empty_cache(int32_t dev);
AL_CU_HIDDEN al_status al_cu_synchronize(int32_t dev);
AL_CU_HIDDEN al_status al_cu_memcpy_h2d(int32_t dev, void *dst, const void *src, int64_t nbytes);
AL_CU_HIDDEN al_status al_cu_memcpy_d2h(int32_t dev, void *dst, const void *src, int64_t nbytes);
AL_CU_HIDDEN al_status al_cu_memcpy_d2d(int32_t dev, void *dst, const void *src, int64_t nbytes);

/* copy.cu */
AL_CU_HIDDEN al_status al_cu_copy(al_tensor *dst, const al_tensor *src);
AL_CU_HIDDEN al_status al_cu_fill(al_tensor *dst, double v);
AL_CU_HIDDEN al_status al_cu_arange(al_tensor *dst, double start, double step);
/* Grid size for a grid-stride loop over n items with AL_CU_THREADS threads per block. */
AL_CU_HIDDEN unsigned al_cu_grid(int32_t dev, int64_t n);

/* random.cu */
AL_CU_HIDDEN al_status al_cu_random(al_tensor *dst, int32_t kind, uint64_t seed, uint64_t offset);

/* elementwise.cu */
AL_CU_HIDDEN al_status al_cu_unary(int32_t op, al_tensor *out, const al_tensor *a);
AL_CU_HIDDEN al_status al_cu_binary(int32_t op, al_tensor *out, const al_tensor *a, const al_tensor *b);
AL_CU_HIDDEN al_status al_cu_binary_scalar(int32_t op, al_tensor *out, const al_tensor *a, double s,
                                           int32_t scalar_first);
AL_CU_HIDDEN al_status al_cu_where(al_tensor *out, const al_tensor *cond, const al_tensor *a, const al_tensor *b);

/* reduce.cu */
AL_CU_HIDDEN al_status al_cu_reduce(int32_t op, al_tensor *out, const al_tensor *a, uint32_t dim_mask);
AL_CU_HIDDEN al_status al_cu_max_dim(al_tensor *values, al_tensor *indices, const al_tensor *a, int32_t dim);
AL_CU_HIDDEN al_status al_cu_softmax(al_tensor *out, const al_tensor *a, int32_t dim, int32_t log);
AL_CU_HIDDEN al_status al_cu_diff_stats(const al_tensor *a, const al_tensor *b, double atol, double rtol,
                                        double *max_abs, double *sum_sq, int64_t *violations);

/* matmul.cu */
AL_CU_HIDDEN al_status al_cu_matmul(al_tensor *out, const al_tensor *a, const al_tensor *b);

/* events.cu */
AL_CU_HIDDEN al_status al_cu_event_new(void **ev, int32_t dev);
AL_CU_HIDDEN void al_cu_event_free(void *ev);
AL_CU_HIDDEN al_status al_cu_event_record(void *ev);
AL_CU_HIDDEN al_status al_cu_event_record_on(void *ev, void *stream);
AL_CU_HIDDEN al_status al_cu_event_synchronize(void *ev);
AL_CU_HIDDEN al_status al_cu_event_elapsed(void *start, void *end, float *ms);

/* fp8.cu: fills the FP8 entries of the api table (amax, quantise, dequantise, per-row, MXFP8) */
AL_CU_HIDDEN void al_cu_fp8_fill_api(al_cuda_api *api);
AL_CU_HIDDEN void al_cu_fp8_ds_fill_api(al_cuda_api *api);   /* fp8_delayed.cu */

/* launch_log.cu: the api's debug_fault test hook (launches a kernel that faults) */
AL_CU_HIDDEN al_status al_cu_debug_fault(int32_t dev);

/* attn_fused.cu: registers the "fused" (cuDNN SDPA) attention backend with the core */
AL_CU_HIDDEN al_status al_cu_attn_fused_register(void);
/* attn_unfused.cu: registers the "unfused" (cuBLASLt + kernels, the GPU reference) backend */
AL_CU_HIDDEN al_status al_cu_attn_unfused_register(void);
/* attn_flash.cu: registers the "flash" backend (our NVRTC-compiled FA2-class kernels) */
AL_CU_HIDDEN al_status al_cu_attn_flash_register(void);

#endif /* ATTNLAB_CUDA_INTERNAL_H */
