/*
 * tensor.c — tensor descriptors: creation, release, queries, fill/arange and host element access.
 *
 * A descriptor (al_tensor) is a view: shape and strides in elements over a refcounted storage.
 * Views are made in tensor_view.c, copies in copy.c.
 */
#include "internal.h"
#include "cuda_plugin.h"
#include <stdio.h>
#include <stdlib.h>

void al_contiguous_strides(int32_t ndim, const int64_t *size, int64_t *stride) {
    int64_t s = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        stride[d] = s;
        /* saturate: an empty shape may have huge extents whose product overflows (found by fuzz_views);
         * the strides of an empty tensor address nothing */
        if (__builtin_mul_overflow(s, size[d] > 0 ? size[d] : 1, &s)) s = INT64_MAX;
    }
}

const char *al_shape_str(int32_t ndim, const int64_t *size, char *buf, size_t n) {
    size_t used = 0;
    used += (size_t)snprintf(buf, n, "[");
    for (int32_t d = 0; d < ndim && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, d ? ",%lld" : "%lld", (long long)size[d]);
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}

const char *al_tensor_describe(const al_tensor *t, char *buf, size_t n) {
    char shape[160];
    if (!t || !t->storage) {
        snprintf(buf, n, "a released tensor");
        return buf;
    }
    al_shape_str(t->ndim, t->size, shape, sizeof shape);
    if (t->device_type == AL_DEVICE_CPU)
        snprintf(buf, n, "%s %s cpu", al_dtype_name(t->dtype), shape);
    else
        snprintf(buf, n, "%s %s cuda:%d", al_dtype_name(t->dtype), shape, t->device_index);
    return buf;
}

al_status al_check_tensor(const char *op, const char *arg, const al_tensor *t) {
    if (!t) return al_error(AL_ERR_ARG, "%s: %s: expected a tensor, got nothing", op, arg);
    if (!t->storage) return al_error(AL_ERR_ARG, "%s: %s: expected a tensor, got a released tensor", op, arg);
    return AL_OK;
}

al_status al_check_same_device(const char *op, const al_tensor *a, const al_tensor *b) {
    if (a->device_type == b->device_type && (a->device_type == AL_DEVICE_CPU || a->device_index == b->device_index))
        return AL_OK;
    char da[32], db[32];
    snprintf(da, sizeof da, a->device_type == AL_DEVICE_CPU ? "cpu" : "cuda:%d", a->device_index);
    snprintf(db, sizeof db, b->device_type == AL_DEVICE_CPU ? "cpu" : "cuda:%d", b->device_index);
    return al_error(AL_ERR_ARG, "%s: expected tensors on one device, got %s and %s (move one with :to())", op, da, db);
}

void al_tensor_init_contiguous(al_tensor *out, al_storage *s, int32_t ndim, const int64_t *size, int32_t dtype) {
    memset(out, 0, sizeof *out);
    al_storage_retain(s);
    out->storage = s;
    out->data = s->data;
    out->ndim = ndim;
    out->dtype = dtype;
    out->device_type = s->device_type;
    out->device_index = s->device_index;
    out->storage_id = s->id;
    out->storage_numel = s->nbytes / al_dtype_size(dtype);
    for (int32_t d = 0; d < ndim; d++) out->size[d] = size[d];
    al_contiguous_strides(ndim, out->size, out->stride);
}

al_status al_tensor_empty(al_tensor *out, int32_t ndim, const int64_t *size, int32_t dtype,
                          int32_t device_type, int32_t device_index) {
    if (!out) return al_error(AL_ERR_ARG, "empty: out is NULL");
    memset(out, 0, sizeof *out);
    if (ndim < 0 || ndim > AL_MAX_DIMS)
        return al_error(AL_ERR_ARG, "empty: expected 0 to 8 dims, got %d", ndim);
    if (dtype < 0 || dtype >= AL_DTYPE_COUNT) return al_error(AL_ERR_ARG, "empty: unknown dtype code %d", dtype);
    if (ndim > 0 && !size) return al_error(AL_ERR_ARG, "empty: size is NULL");
    int64_t esize = al_dtype_size(dtype), numel = 1;
    for (int32_t d = 0; d < ndim; d++) {
        if (size[d] < 0) {
            char shape[160];
            return al_error(AL_ERR_ARG, "empty: expected non-negative sizes, got %s (dim %d is %lld)",
                            al_shape_str(ndim, size, shape, sizeof shape), d + 1, (long long)size[d]);
        }
        if (size[d] > 0 && numel > INT64_MAX / esize / size[d]) {
            char shape[160];
            return al_error(AL_ERR_ARG, "empty: shape %s of %s overflows the addressable size",
                            al_shape_str(ndim, size, shape, sizeof shape), al_dtype_name(dtype));
        }
        numel *= size[d];
    }
    al_storage *s = NULL;
    AL_TRY(al_storage_new(&s, numel * esize, device_type, device_index));
    al_tensor_init_contiguous(out, s, ndim, size, dtype);
    al_storage_release(s); /* out holds the only reference */
    return AL_OK;
}

al_status al_tensor_empty_like(al_tensor *out, const al_tensor *t, int32_t dtype) {
    return al_tensor_empty(out, t->ndim, t->size, dtype, t->device_type, t->device_index);
}

void al_tensor_release(al_tensor *t) {
    if (!t) return;
    al_storage *s = t->storage;
    memset(t, 0, sizeof *t);
    al_storage_release(s);
}

al_status al_tensor_alias(al_tensor *out, const al_tensor *t) {
    if (out) memset(out, 0, sizeof *out);
    AL_TRY(al_check_tensor("alias", "t", t));
    *out = *t;
    al_storage_retain(out->storage);
    return AL_OK;
}

int64_t al_tensor_numel(const al_tensor *t) {
    /* an empty shape may hold huge extents ([0, 2^40, 2^40] is a valid view): check for a zero first,
     * or the running product overflows before it meets the zero (UBSan, fuzz_views) */
    for (int32_t d = 0; d < t->ndim; d++)
        if (t->size[d] == 0) return 0;
    int64_t n = 1;
    for (int32_t d = 0; d < t->ndim; d++) n *= t->size[d];
    return n;
}

int32_t al_tensor_is_contiguous(const al_tensor *t) {
    int64_t expect = 1;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        if (t->size[d] == 1) continue;
        if (t->size[d] == 0) return 1;
        if (t->stride[d] != expect) return 0;
        expect *= t->size[d];
    }
    return 1;
}

void *al_tensor_data_ptr(const al_tensor *t) {
    if (!t || !t->storage) return NULL;
    return (char *)t->data + t->offset * al_dtype_size(t->dtype);
}

int64_t al_tensor_storage_refcount(const al_tensor *t) {
    return (t && t->storage) ? __atomic_load_n(&t->storage->refcount, __ATOMIC_RELAXED) : 0;
}

int32_t al_tensor_same_storage(const al_tensor *a, const al_tensor *b) {
    return a && b && a->storage && a->storage == b->storage;
}

/* ---- fill, arange, host element access ------------------------------------------------------- */

al_status al_tensor_fill_(al_tensor *t, double v) {
    AL_TRY(al_check_tensor("fill_", "self", t));
    if (t->device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api = al_cuda_api_get();
        if (!api) return al_error_prefix(AL_ERR_DEVICE, "fill_");
        return api->fill(t, v);
    }
    const int64_t numel = al_tensor_numel(t);
    if (numel > 0 && al_tensor_is_contiguous(t)) {
        /* one element converted, then its bytes repeated (memset when they are all zero): the attention
         * outputs are filled on every call (bench/host_overhead.lua) */
        const size_t es = (size_t)al_dtype_size(t->dtype), bytes = (size_t)numel * es;
        unsigned char *base = (unsigned char *)al_tensor_data_ptr(t);
        al_store_f64(base, t->dtype, 0, v);
        int zero = 1;
        for (size_t i = 0; i < es; i++) zero &= base[i] == 0;
        if (zero) {
            memset(base, 0, bytes);
        } else {
            size_t have = es;
            while (have < bytes) {
                const size_t k = have < bytes - have ? have : bytes - have;
                memcpy(base + have, base, k);
                have += k;
            }
        }
        return AL_OK;
    }
    al_iter it;
    const int64_t *strides[1] = {t->stride};
    al_iter_init(&it, t->ndim, t->size, 1, strides, &t->offset);
    for (int64_t i = 0; i < it.numel; i++, al_iter_next(&it)) al_store_f64(t->data, t->dtype, it.off[0], v);
    return AL_OK;
}

al_status al_tensor_arange_(al_tensor *t, double start, double step) {
    AL_TRY(al_check_tensor("arange_", "self", t));
    if (t->device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api = al_cuda_api_get();
        if (!api) return al_error_prefix(AL_ERR_DEVICE, "arange_");
        return api->arange(t, start, step);
    }
    al_iter it;
    const int64_t *strides[1] = {t->stride};
    al_iter_init(&it, t->ndim, t->size, 1, strides, &t->offset);
    for (int64_t i = 0; i < it.numel; i++, al_iter_next(&it))
        al_store_f64(t->data, t->dtype, it.off[0], start + (double)i * step);
    return AL_OK;
}

/* Host staging: a contiguous CPU copy of t in t's dtype (alias when t is already such a tensor). */
static al_status host_contiguous(al_tensor *out, const al_tensor *t) {
    if (t->device_type == AL_DEVICE_CPU && al_tensor_is_contiguous(t)) return al_tensor_alias(out, t);
    return al_tensor_to(out, t, t->dtype, AL_DEVICE_CPU, 0);
}

al_status al_tensor_read_f64(const al_tensor *t, double *buf, int64_t n) {
    AL_TRY(al_check_tensor("read_f64", "t", t));
    int64_t numel = al_tensor_numel(t);
    if (n != numel)
        return al_error(AL_ERR_ARG, "read_f64: buffer holds %lld values, tensor has %lld", (long long)n, (long long)numel);
    al_tensor h;
    AL_TRY(host_contiguous(&h, t));
    for (int64_t i = 0; i < numel; i++) buf[i] = al_canonical_nan(al_load_f64(h.data, h.dtype, h.offset + i));
    al_tensor_release(&h);
    return AL_OK;
}

al_status al_tensor_write_f64(al_tensor *t, const double *buf, int64_t n) {
    AL_TRY(al_check_tensor("write_f64", "t", t));
    int64_t numel = al_tensor_numel(t);
    if (n != numel)
        return al_error(AL_ERR_ARG, "write_f64: buffer holds %lld values, tensor has %lld", (long long)n, (long long)numel);
    if (t->device_type == AL_DEVICE_CPU) {
        al_iter it;
        const int64_t *strides[1] = {t->stride};
        al_iter_init(&it, t->ndim, t->size, 1, strides, &t->offset);
        for (int64_t i = 0; i < numel; i++, al_iter_next(&it)) al_store_f64(t->data, t->dtype, it.off[0], buf[i]);
        return AL_OK;
    }
    /* cuda: stage as a contiguous host tensor of t's dtype, then copy_ uploads it */
    al_tensor h;
    AL_TRY(al_tensor_empty(&h, t->ndim, t->size, t->dtype, AL_DEVICE_CPU, 0));
    for (int64_t i = 0; i < numel; i++) al_store_f64(h.data, h.dtype, i, buf[i]);
    al_status st = al_tensor_copy_(t, &h);
    al_tensor_release(&h);
    return st;
}
