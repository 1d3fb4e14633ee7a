/*
 * internal.h — helpers shared by the runtime's C files (never part of the public API).
 *
 *   - al_error(status, fmt, ...): set the thread-local message and return status, so a failure is
 *     reported in one line: `return al_error(AL_ERR_ARG, "select: index %lld out of range ...", ...)`.
 *   - AL_TRY(expr): propagate a failed status.
 *   - the storage struct and the allocation entry points (CPU memory and CUDA through the plugin).
 *   - al_iter: a row-major walk over the elements of up to 4 same-shape tensors with arbitrary strides.
 */
#ifndef ATTNLAB_INTERNAL_H
#define ATTNLAB_INTERNAL_H

#include "attnlab.h"
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>

#ifdef __cplusplus
extern "C" { /* the CUDA plugin (C++ compiled) links against these C symbols */
#endif

#define AL_MAX_DIMS 8

#if defined(__GNUC__)
#define AL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define AL_EXPORT __attribute__((visibility("default")))
#else
#define AL_PRINTF(a, b)
#define AL_EXPORT
#endif

/* Set the thread-local error message and return status. */
AL_EXPORT al_status al_error(al_status status, const char *fmt, ...) AL_PRINTF(2, 3);
/* Prepend "context: " to the current message (keeps the status). */
AL_EXPORT al_status al_error_prefix(al_status status, const char *context);

#define AL_TRY(expr)                         \
    do {                                     \
        al_status al_try_s_ = (expr);        \
        if (al_try_s_ != AL_OK) return al_try_s_; \
    } while (0)

/* ---- storage ---------------------------------------------------------------------------------- */
struct al_storage {
    void *data;
    int64_t nbytes;
    int64_t id;
    int32_t device_type;
    int32_t device_index;
    int64_t refcount;   /* atomically updated */
    void *stream;       /* cuda: the stream current at allocation (the allocator's pool for it) */
};

/* New storage of nbytes on a device, refcount 1. */
AL_EXPORT al_status al_storage_new(al_storage **out, int64_t nbytes, int32_t device_type, int32_t device_index);
AL_EXPORT void al_storage_retain(al_storage *s);
AL_EXPORT void al_storage_release(al_storage *s);

/* Make `out` a fresh descriptor for a contiguous tensor over existing storage (retains it). */
AL_EXPORT void al_tensor_init_contiguous(al_tensor *out, al_storage *s, int32_t ndim, const int64_t *size,
                                         int32_t dtype);
/* Fill in contiguous strides for size[0..ndim). */
AL_EXPORT void al_contiguous_strides(int32_t ndim, const int64_t *size, int64_t *stride);
/* An empty tensor with the same shape/device as t, with dtype. */
AL_EXPORT al_status al_tensor_empty_like(al_tensor *out, const al_tensor *t, int32_t dtype);
/* "f32 [2,3] cuda:0" style description into buf, for error messages. */
AL_EXPORT const char *al_tensor_describe(const al_tensor *t, char *buf, size_t n);
/* "[2,3,4]" into buf. */
AL_EXPORT const char *al_shape_str(int32_t ndim, const int64_t *size, char *buf, size_t n);
/* Broadcast shapes a and b into out (NumPy rules); error names op. */
AL_EXPORT al_status al_broadcast_shapes(const char *op, int32_t na, const int64_t *sa, int32_t nb,
                                        const int64_t *sb, int32_t *nout, int64_t *sout);
/* Float dtype promotion used by binary ops. */
AL_EXPORT int32_t al_promote_dtypes(int32_t a, int32_t b);

/* ---- element access on the host (all dtypes through double) ----------------------------------- */
AL_EXPORT double al_load_f64(const void *base, int32_t dtype, int64_t index);
/* x, or the default quiet NaN with x's sign when x is a NaN: for every double handed to Lua (LuaJIT
 * cannot hold NaNs with arbitrary payloads; see convert.c). */
AL_EXPORT double al_canonical_nan(double x);
AL_EXPORT void al_store_f64(void *base, int32_t dtype, int64_t index, double v);

/* ---- strided iteration ------------------------------------------------------------------------ */
/* Walks a shape in row-major order, keeping one element offset per operand.
 *   al_iter it; al_iter_init(&it, ndim, size, 2, (const int64_t *[]){a->stride, b->stride},
 *                            (int64_t[]){a->offset, b->offset});
 *   for (int64_t i = 0; i < it.numel; i++, al_iter_next(&it)) use(it.off[0], it.off[1]); */
typedef struct al_iter {
    int32_t ndim, nops;
    int64_t numel;
    int64_t size[AL_MAX_DIMS];
    int64_t stride[4][AL_MAX_DIMS];
    int64_t idx[AL_MAX_DIMS];
    int64_t off[4];
} al_iter;
AL_EXPORT void al_iter_init(al_iter *it, int32_t ndim, const int64_t *size, int32_t nops,
                            const int64_t *const *strides, const int64_t *offsets);
static inline void al_iter_next(al_iter *it) {
    for (int32_t d = it->ndim - 1; d >= 0; d--) {
        if (++it->idx[d] < it->size[d]) {
            for (int32_t k = 0; k < it->nops; k++) it->off[k] += it->stride[k][d];
            return;
        }
        it->idx[d] = 0;
        for (int32_t k = 0; k < it->nops; k++) it->off[k] -= it->stride[k][d] * (it->size[d] - 1);
    }
}

/* ---- CUDA plugin ------------------------------------------------------------------------------ */
struct al_cuda_api;
/* The loaded plugin's function table, or NULL with an error set (AL_ERR_DEVICE) saying why. */
AL_EXPORT const struct al_cuda_api *al_cuda_api_get(void);
/* Validate a device index for a cuda tensor; error names the op. */
AL_EXPORT al_status al_cuda_check_device(const char *op, int32_t device_index);

/* Check that every tensor is on the same device; error names op. */
AL_EXPORT al_status al_check_same_device(const char *op, const al_tensor *a, const al_tensor *b);
/* Check that t is a valid (non-released) tensor; error names op and arg. */
AL_EXPORT al_status al_check_tensor(const char *op, const char *arg, const al_tensor *t);

#ifdef __cplusplus
}
#endif

#endif /* ATTNLAB_INTERNAL_H */
