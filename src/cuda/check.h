/*
 * cuda/check.h — error checking for the CUDA plugin: every CUDA runtime and cuBLASLt call goes
 * through one of these macros, which turn a failure into al_error(AL_ERR_CUDA, ...) naming the file,
 * the line, the call and the library's own message.
 *
 *   AL_CUDA_TRY(cudaMemcpyAsync(...));      // returns the error status from the enclosing function
 *   AL_CUBLAS_TRY(cublasLtMatmul(...));
 *   AL_CUDA_LAUNCHED();                     // after every kernel launch: cudaGetLastError
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

static inline al_status al_cu_status(cudaError_t e, const char *file, int line, const char *what) {
    if (e == cudaSuccess) return AL_OK;
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

/* After a <<<...>>> launch: a bad configuration or an earlier asynchronous fault shows up here. */
#define AL_CUDA_LAUNCHED() AL_TRY(al_cu_status(cudaGetLastError(), __FILE__, __LINE__, "kernel launch"))

#endif /* ATTNLAB_CUDA_CHECK_H */
