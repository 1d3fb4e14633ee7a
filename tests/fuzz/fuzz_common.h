/*
 * fuzz_common.h — shared helpers of the libFuzzer targets in tests/fuzz/ (built by `make fuzz`).
 *
 *   fz_in in = {data, size};            a byte reader: fz_u8/fz_int/fz_i64 return 0 when the input ends
 *   fz_check_view(&t, "select")         a successful view must lie inside its storage (bounds computed
 *                                       in 128-bit arithmetic from size/stride/offset), have a sane
 *                                       descriptor, and be readable element by element (ASan watches)
 *   fz_check_failed(st, &out, "narrow") a failed call must leave a message naming the op and a zeroed out
 *   FZ_ASSERT(cond, ...)                prints and abort()s: libFuzzer records the input as a crash
 */
#ifndef ATTNLAB_FUZZ_COMMON_H
#define ATTNLAB_FUZZ_COMMON_H

#include "attnlab.h"
#include "internal.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_ASSERT(cond, ...)                                                            \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "fuzz invariant failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, "\n");                                                      \
            abort();                                                                    \
        }                                                                               \
    } while (0)

typedef struct fz_in {
    const uint8_t *p;
    size_t n;
} fz_in;

static inline uint8_t fz_u8(fz_in *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

/* An integer in [lo, hi] (inclusive; hi - lo < 2^32). */
static inline int64_t fz_int(fz_in *in, int64_t lo, int64_t hi) {
    uint64_t span = (uint64_t)(hi - lo) + 1, v = 0;
    int bytes = span <= 0x100 ? 1 : span <= 0x10000 ? 2 : 4;
    for (int i = 0; i < bytes; i++) v = (v << 8) | fz_u8(in);
    return lo + (int64_t)(v % span);
}

/* A "hostile" int64: mostly small values around 0, sometimes extremes that overflow arithmetic. */
static inline int64_t fz_i64(fz_in *in) {
    static const int64_t special[] = {INT64_MAX, INT64_MIN, INT64_MAX / 2, INT64_MIN / 2, (int64_t)1 << 62,
                                      ((int64_t)1 << 62) + 1, (int64_t)1 << 32, -((int64_t)1 << 32),
                                      INT32_MAX, INT32_MIN, (int64_t)1 << 40, -1};
    uint8_t k = fz_u8(in);
    if (k < 200) return (int64_t)(k % 13) - 3;      /* -3 .. 9 */
    if (k < 240) return special[k % (sizeof special / sizeof special[0])];
    int64_t v = 0;
    for (int i = 0; i < 8; i++) v = (int64_t)(((uint64_t)v << 8) | fz_u8(in));
    return v;
}

static inline int32_t fz_i32(fz_in *in) {
    uint8_t k = fz_u8(in);
    if (k < 220) return (int32_t)(k % 12) - 3;      /* -3 .. 8 */
    static const int32_t special[] = {INT32_MAX, INT32_MIN, 1 << 30, -(1 << 30), 64, -64};
    return special[k % 6];
}

/* Bytes of the storage behind t, from the library's own header (the capacity al_tensor_empty made). */
static inline int64_t fz_storage_bytes(const al_tensor *t) { return t->storage ? t->storage->nbytes : 0; }

/* Every element address of a successful view lies within its storage. */
static inline void fz_check_view(const al_tensor *t, const char *op) {
    FZ_ASSERT(t->storage != NULL, "%s: OK but no storage", op);
    FZ_ASSERT(t->ndim >= 0 && t->ndim <= 8, "%s: ndim %d", op, t->ndim);
    FZ_ASSERT(t->data == t->storage->data, "%s: data is not the storage's base", op);
    int64_t es = al_dtype_size(t->dtype);
    FZ_ASSERT(es > 0, "%s: dtype %d", op, t->dtype);
    FZ_ASSERT(t->storage_numel == fz_storage_bytes(t) / es, "%s: storage_numel %lld vs %lld bytes", op,
              (long long)t->storage_numel, (long long)fz_storage_bytes(t));
    __int128 lo = t->offset, hi = t->offset, numel = 1;
    int empty = 0;
    for (int32_t d = 0; d < t->ndim; d++) empty |= t->size[d] == 0;
    for (int32_t d = 0; d < t->ndim; d++) {
        FZ_ASSERT(t->size[d] >= 0, "%s: negative size %lld at dim %d", op, (long long)t->size[d], d);
        if (empty) { numel = 0; continue; } /* an empty view addresses nothing: its strides may be anything */
        numel *= t->size[d];
        if (numel > ((__int128)1 << 100)) numel = (__int128)1 << 100; /* saturate: only 0 vs >0 matters */
        if (t->size[d] > 0) {
            __int128 reach = (__int128)(t->size[d] - 1) * t->stride[d];
            if (reach < 0) lo += reach; else hi += reach;
        }
    }
    for (int32_t d = t->ndim; d < 8; d++)
        FZ_ASSERT(t->size[d] == 0 && t->stride[d] == 0, "%s: unused dim %d not zeroed", op, d);
    if (numel > 0) {
        FZ_ASSERT(lo >= 0 && hi < t->storage_numel, "%s: view reaches elements [%lld, %lld] of a storage of %lld",
                  op, (long long)lo, (long long)hi, (long long)t->storage_numel);
        /* numel fits int64 (the library computes it in int64) */
        FZ_ASSERT(numel <= INT64_MAX, "%s: numel overflows int64", op);
        /* touch every element when there are few: ASan reports any stray address */
        if (numel <= 4096) {
            double buf[4096];
            al_status st = al_tensor_read_f64(t, buf, (int64_t)numel);
            FZ_ASSERT(st == AL_OK, "%s: reading the view failed: %s", op, al_last_error());
        }
    }
}

/* A failed call: a non-empty message that names op, and a zeroed output descriptor. */
static inline void fz_check_failed(al_status st, const al_tensor *out, const char *op) {
    FZ_ASSERT(st < 0 && st >= AL_ERR_INTERNAL, "%s: status %d", op, (int)st);
    FZ_ASSERT(st != AL_ERR_INTERNAL, "%s: internal error: %s", op, al_last_error());
    const char *m = al_last_error();
    FZ_ASSERT(m && m[0], "%s: failed without a message", op);
    FZ_ASSERT(strstr(m, op) != NULL, "%s: message does not name the op: '%s'", op, m);
    if (out) {
        static const al_tensor zero;
        FZ_ASSERT(memcmp(out, &zero, sizeof zero) == 0, "%s: failed but out is not zeroed", op);
    }
}

/* Random finite values in [-2, 2) from the input bytes (never all zeros: a fixed pattern is mixed in). */
static inline void fz_fill(fz_in *in, al_tensor *t) {
    int64_t n = al_tensor_numel(t);
    if (n <= 0 || n > 1 << 16) return;
    double *v = malloc(sizeof(double) * (size_t)n);
    if (!v) return;
    for (int64_t i = 0; i < n; i++) v[i] = ((double)fz_u8(in) + (double)((i * 37) % 97)) / 88.0 - 2.0;
    al_tensor_write_f64(t, v, n);
    free(v);
}

#endif
