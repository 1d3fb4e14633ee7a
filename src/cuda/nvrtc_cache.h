/*
 * cuda/nvrtc_cache.h — run-time compilation of the CUDA C kernels in the kernels/ folder (ARCHITECTURE.md,
 * "kernels"): NVRTC for the device's architecture, an on-disk cubin cache, and an in-memory table of
 * loaded functions per device. Used by the flash backend (attn_flash.cu); any kernel file works.
 *
 *   al_nvrtc_get(dev, file, prefix, opts, nopts, names, nnames, label, fns)
 *       fns[i] = function names[i] of kernels/<file> compiled with opts (-D defines ...) for dev;
 *       prefix (NULL = none): source text compiled in front of the file's (the flash variants'
 *       generated hooks, cuda/flash_specs.h).
 *       1. in-memory table (dev, file, opts, hash of prefix): the functions, no I/O;
 *       2. disk: <cache>/<arch>/<key>.cubin, key = FNV-1a 128 of a format tag, the source (prefix
 *          included),
 *          every *.h / *.cuh beside it, the options, the NVRTC version and the architecture;
 *       3. NVRTC: --gpu-architecture=sm_90a on cc 9.0 (sm_XY elsewhere), -default-device,
 *          -std=c++17, -I<kernel dir>, then opts; the cubin is written to a temp file and renamed
 *          into place (atomic: concurrent processes never see a partial file; the last rename wins
 *          with identical bytes). Compile failures return the NVRTC log in the message.
 *       Each first compile prints one stderr line "attnlab: nvrtc: compiled <label> ... in X ms"
 *       (ATTNLAB_NVRTC_QUIET=1 silences it); al_nvrtc_info reports the counters and timings.
 *   Cache folder: $ATTNLAB_CACHE_DIR, else $XDG_CACHE_HOME/attnlab, else ~/.cache/attnlab (created);
 *   ATTNLAB_NVRTC_NO_DISK_CACHE=1 compiles every specialisation once per process.
 *   Kernel folder (al_nvrtc_kernel_dir): $ATTNLAB_KERNEL_DIR, else the plugin's ../kernels (repo
 *   build with O=.), ../share/attnlab/kernels (installed), the build-time source folder
 *   (AL_KERNEL_SRC_DIR, when the Makefile defines it), ./kernels (the working directory).
 */
#ifndef ATTNLAB_CUDA_NVRTC_CACHE_H
#define ATTNLAB_CUDA_NVRTC_CACHE_H

#include "cuda/cuda_internal.h"
#include <cuda.h>

/* Compile or load; see above. label names the specialisation in messages ("fwd d128 bf16 causal"). */
AL_CU_HIDDEN al_status al_nvrtc_get(int32_t dev, const char *file, const char *prefix, const char *const *opts,
                                    int nopts, const char *const *names, int nnames, const char *label,
                                    CUfunction *fns);
/* One program for al_nvrtc_prefetch: al_nvrtc_get's arguments. */
typedef struct al_nvrtc_prog {
    const char *file, *prefix;
    const char *const *opts;
    int nopts;
    const char *const *names;
    int nnames;
    const char *label;
} al_nvrtc_prog;
/* Compiles those of the n (2..8) programs that are neither loaded nor in the disk cache, each on its own
 * thread, into the disk cache, so that the al_nvrtc_get calls that follow only load them: a call that
 * needs several new kernels (a new variant's backward: the Hopper dK/dV and dQ kernels) waits for the
 * slowest compile instead of their sum. Best effort: does nothing with the disk cache off
 * (ATTNLAB_NVRTC_NO_DISK_CACHE) or ATTNLAB_NVRTC_SERIAL=1, and leaves any failure for al_nvrtc_get to
 * report. Prints the usual "compiled" lines and counts the compiles in al_nvrtc_info. */
AL_CU_HIDDEN void al_nvrtc_prefetch(int32_t dev, const al_nvrtc_prog *progs, int n);
/* Drop one entry of the in-memory table (same arguments as al_nvrtc_get) and unload its module, after
 * waiting for the device (its kernels may still be queued). The caller guarantees that nobody launches
 * the entry's functions afterwards (attn_flash.cu's variant LRU holds its lock across get + launch). */
AL_CU_HIDDEN void al_nvrtc_unload(int32_t dev, const char *file, const char *prefix, const char *const *opts,
                                  int nopts, const char *const *names, int nnames);
/* The architecture string NVRTC targets for dev ("sm_90a"), and its compute capability. */
AL_CU_HIDDEN al_status al_nvrtc_arch(int32_t dev, char *buf, size_t n, int *cc);
/* The folder holding the kernel sources; the message lists every place searched when none has them. */
AL_CU_HIDDEN al_status al_nvrtc_kernel_dir(char *buf, size_t n);
/* Counters and the per-specialisation log as text; returns the number of NVRTC compiles so far. */
AL_CU_HIDDEN int64_t al_nvrtc_info(char *buf, int64_t n);

#endif /* ATTNLAB_CUDA_NVRTC_CACHE_H */
