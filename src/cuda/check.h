/*
 * cuda/check.h — error checking for the CUDA plugin: every CUDA runtime and cuBLASLt call goes
 * through one of these macros, which turn a failure into al_error(AL_ERR_CUDA, ...) naming the file,
 * the line, the call and the library's own message.
 *
 *   AL_CUDA_TRY(cudaMemcpyAsync(...));      // returns the error status from the enclosing function
 *   AL_CUBLAS_TRY(cublasLtMatmul(...));
 *   AL_CUDA_LAUNCHED_K("al_fill_kernel");   // after every kernel launch: logs the kernel, cudaGetLastError
 *   st = AL_CUDA_ST(expr);                  // the status only (for paths that must release temporaries)
 */
#ifndef ATTNLAB_CUDA_CHECK_H
#define ATTNLAB_CUDA_CHECK_H

/* src/internal.h has no extern "C" guard of its own: include it with C linkage so that al_error,
 * al_store_f64, ... resolve to the core library's unmangled symbols. */
#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h"
#ifdef __cplusplus
}
#endif
#include <cuda_runtime.h>
#include <cublasLt.h>

/* The launch log (launch_log.cu): a kernel fault is reported asynchronously, by whichever CUDA call
 * comes next (usually a synchronisation), long after its launch returned. Every launch notes its
 * kernel's name in a small process-wide ring, and an error of the asynchronous kind (illegal address,
 * launch failure, device assert, ...) is reported with the kernels launched most recently, newest
 * first, so the message names the kernel that faulted (the newest one, unless several ran since). */
void al_cu_note_launch(const char *kernel);
/* 1 if e is a fault raised by a kernel while it ran (sticky: the CUDA context is unusable after it). */
int al_cu_is_async_fault(cudaError_t e);
/* "al_flash_fwd, al_fill_kernel, ..." (newest first, at most n_max names) into buf; returns buf. */
const char *al_cu_recent_launches(char *buf, size_t n, int n_max);

static inline al_status al_cu_status(cudaError_t e, const char *file, int line, const char *what) {
    if (e == cudaSuccess) return AL_OK;
    if (al_cu_is_async_fault(e)) {
        char names[512];
        return al_error(AL_ERR_CUDA,
                        "asynchronous CUDA error reported by %s (%s:%d): %s (%s); the kernels launched last, newest "
                        "first: %s. The CUDA context is unusable now: restart the process",
                        what, file, line, cudaGetErrorString(e), cudaGetErrorName(e),
                        al_cu_recent_launches(names, sizeof names, 4));
    }
    return al_error(AL_ERR_CUDA, "%s:%d: %s failed: %s (%s)", file, line, what, cudaGetErrorString(e),
                    cudaGetErrorName(e));
}

static inline al_status al_cu_blas_status(cublasStatus_t s, const char *file, int line, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return AL_OK;
    return al_error(AL_ERR_CUDA, "%s:%d: %s failed: %s", file, line, what, cublasLtGetStatusString(s));
}

#define AL_CUDA_ST(expr) al_cu_status((expr), __FILE__, __LINE__, #expr)
#define AL_CUBLAS_ST(expr) al_cu_blas_status((expr), __FILE__, __LINE__, #expr)

#define AL_CUDA_TRY(expr) AL_TRY(AL_CUDA_ST(expr))
#define AL_CUBLAS_TRY(expr) AL_TRY(AL_CUBLAS_ST(expr))

/* After a <<<...>>> launch of `kernel` (its name, a string literal): logs it, then a bad configuration
 * or an earlier asynchronous fault shows up here. */
#define AL_CUDA_LAUNCHED_K(kernel)                                                                         \
    do {                                                                                                   \
        al_cu_note_launch(kernel);                                                                         \
        AL_TRY(al_cu_status(cudaGetLastError(), __FILE__, __LINE__, "launching " kernel));                 \
    } while (0)

#endif /* ATTNLAB_CUDA_CHECK_H */
