/*
 * copy.c — copy_ (any dtype, any device, any strides, src broadcast to dst), clone and to().
 *
 * CPU copies convert element by element through the bit-exact conversions of src/numeric/ (same
 * dtype: raw bytes). Copies that cross the host/device boundary stage through contiguous buffers,
 * so the plugin only ever sees same-device copies plus plain memcpys.
 */
#include "internal.h"
#include "cuda_plugin.h"
#include <stdio.h>

/* [lo, hi] byte range touched by a view (hi inclusive); empty views give lo > hi. An empty view may carry
 * any extents and strides in its other dims, so it is ruled out before any product is taken (found by
 * fuzz_views in CI: (2^40 - 1) * INT64_MAX before the empty dim came up); a non-empty view lies inside its
 * storage, so its products cannot overflow. */
static void byte_range(const al_tensor *t, int64_t *lo, int64_t *hi) {
    int64_t es = al_dtype_size(t->dtype), first = t->offset, last = t->offset;
    for (int32_t d = 0; d < t->ndim; d++)
        if (t->size[d] == 0) { *lo = 1; *hi = 0; return; }
    for (int32_t d = 0; d < t->ndim; d++) last += (t->size[d] - 1) * t->stride[d];
    *lo = first * es;
    *hi = last * es + es - 1;
}

static int same_view(const al_tensor *a, const al_tensor *b) {
    if (a->storage != b->storage || a->offset != b->offset || a->ndim != b->ndim || a->dtype != b->dtype) return 0;
    for (int32_t d = 0; d < a->ndim; d++)
        if (a->size[d] != b->size[d] || a->stride[d] != b->stride[d]) return 0;
    return 1;
}

static void cpu_copy(al_tensor *dst, const al_tensor *src) {
    int64_t n = al_tensor_numel(dst), es = al_dtype_size(dst->dtype);
    if (dst->dtype == src->dtype && al_tensor_is_contiguous(dst) && al_tensor_is_contiguous(src) &&
        al_tensor_numel(src) == n) {
        memmove(al_tensor_data_ptr(dst), al_tensor_data_ptr(src), (size_t)(n * es));
        return;
    }
    al_iter it;
    const int64_t *strides[2] = {dst->stride, src->stride};
    const int64_t offs[2] = {dst->offset, src->offset};
    al_iter_init(&it, dst->ndim, dst->size, 2, strides, offs);
    if (dst->dtype == src->dtype) {
        char *d = dst->data;
        const char *s = src->data;
        for (int64_t i = 0; i < n; i++, al_iter_next(&it)) memcpy(d + it.off[0] * es, s + it.off[1] * es, (size_t)es);
        return;
    }
    for (int64_t i = 0; i < n; i++, al_iter_next(&it))
        al_store_f64(dst->data, dst->dtype, it.off[0], al_load_f64(src->data, src->dtype, it.off[1]));
}

/* Upload a contiguous, non-broadcast CPU tensor into a fresh contiguous device tensor. */
static al_status upload(al_tensor *out, const al_tensor *host, int32_t dev) {
    const al_cuda_api *api = al_cuda_api_get();
    AL_TRY(al_tensor_empty(out, host->ndim, host->size, host->dtype, AL_DEVICE_CUDA, dev));
    int64_t nbytes = al_tensor_numel(host) * al_dtype_size(host->dtype);
    al_status st = nbytes ? api->memcpy_h2d(dev, al_tensor_data_ptr(out), al_tensor_data_ptr(host), nbytes) : AL_OK;
    if (st != AL_OK) al_tensor_release(out);
    return st;
}

/* A contiguous host copy of a device tensor (same dtype). */
static al_status download(al_tensor *out, const al_tensor *dev_t) {
    const al_cuda_api *api = al_cuda_api_get();
    al_tensor tmp;
    memset(&tmp, 0, sizeof tmp);
    const al_tensor *src = dev_t;
    if (!al_tensor_is_contiguous(dev_t)) {
        AL_TRY(al_tensor_empty_like(&tmp, dev_t, dev_t->dtype));
        al_status st = api->copy(&tmp, dev_t);
        if (st != AL_OK) { al_tensor_release(&tmp); return st; }
        src = &tmp;
    }
    al_status st = al_tensor_empty(out, dev_t->ndim, dev_t->size, dev_t->dtype, AL_DEVICE_CPU, 0);
    int64_t nbytes = al_tensor_numel(dev_t) * al_dtype_size(dev_t->dtype);
    if (st == AL_OK && nbytes)
        st = api->memcpy_d2h(src->device_index, al_tensor_data_ptr(out), al_tensor_data_ptr(src), nbytes);
    if (st != AL_OK) al_tensor_release(out);
    al_tensor_release(&tmp);
    return st;
}

al_status al_tensor_copy_(al_tensor *dst, const al_tensor *src) {
    AL_TRY(al_check_tensor("copy_", "self", dst));
    AL_TRY(al_check_tensor("copy_", "src", src));
    /* a destination whose elements share memory (an expanded view: stride 0 over an extent > 1) has no
     * well-defined result, and a huge one made copy_ loop for hours (found by fuzz_views) */
    for (int32_t d = 0; d < dst->ndim; d++)
        if (dst->stride[d] == 0 && dst->size[d] > 1)
            return al_error(AL_ERR_ARG, "copy_: self has elements that share memory (dim %d is expanded, stride 0); "
                                        "write into a :clone() or :contiguous() copy instead", d + 1);
    al_tensor s;
    if (al_tensor_expand(&s, src, dst->ndim, dst->size) != AL_OK) {
        char a[160], b[160];
        return al_error(AL_ERR_ARG, "copy_: src of shape %s cannot be broadcast to self of shape %s",
                        al_shape_str(src->ndim, src->size, a, sizeof a), al_shape_str(dst->ndim, dst->size, b, sizeof b));
    }
    if (dst->storage == s.storage && !same_view(dst, &s)) {
        int64_t dl, dh, sl, sh;
        byte_range(dst, &dl, &dh);
        byte_range(&s, &sl, &sh);
        if (dl <= dh && sl <= sh && dl <= sh && sl <= dh) {
            al_tensor_release(&s);
            return al_error(AL_ERR_ARG, "copy_: self and src overlap in memory (copy src with :clone() first)");
        }
    }
    al_status st = AL_OK;
    if (al_tensor_numel(dst) == 0) goto done;
    if (dst->device_type == AL_DEVICE_CPU && s.device_type == AL_DEVICE_CPU) {
        cpu_copy(dst, &s);
        goto done;
    }
    const al_cuda_api *api = al_cuda_api_get();
    if (!api) { st = al_error_prefix(AL_ERR_DEVICE, "copy_"); goto done; }
    if (dst->device_type == AL_DEVICE_CUDA && s.device_type == AL_DEVICE_CUDA && dst->device_index == s.device_index) {
        st = api->copy(dst, &s);
        goto done;
    }
    if (s.device_type == AL_DEVICE_CPU) {
        /* host -> device: a contiguous host tensor in dst's dtype, uploaded, then a device copy */
        al_tensor h, d;
        if (al_tensor_is_contiguous(&s) && s.dtype == dst->dtype && al_tensor_numel(src) == al_tensor_numel(dst)) {
            st = al_tensor_alias(&h, &s);
        } else {
            st = al_tensor_empty(&h, dst->ndim, dst->size, dst->dtype, AL_DEVICE_CPU, 0);
            if (st == AL_OK) cpu_copy(&h, &s);
        }
        if (st != AL_OK) goto done;
        st = upload(&d, &h, dst->device_index);
        al_tensor_release(&h);
        if (st != AL_OK) goto done;
        st = api->copy(dst, &d);
        al_tensor_release(&d);
        goto done;
    }
    {
        /* device -> host (or device -> other device, staged through the host) */
        al_tensor h;
        st = download(&h, &s);
        if (st != AL_OK) goto done;
        /* h is contiguous in dst's shape (expanded dims materialised) */
        if (dst->device_type == AL_DEVICE_CPU) {
            cpu_copy(dst, &h);
        } else {
            st = al_tensor_copy_(dst, &h);
        }
        al_tensor_release(&h);
    }
done:
    al_tensor_release(&s);
    return st;
}

al_status al_tensor_clone(al_tensor *out, const al_tensor *t) {
    if (out) memset(out, 0, sizeof *out);
    AL_TRY(al_check_tensor("clone", "self", t));
    al_status st = al_tensor_to(out, t, t->dtype, t->device_type, t->device_index);
    /* name the op the caller called (an out-of-memory message came from "storage:"; found by fuzz_views) */
    if (st != AL_OK) al_error_prefix(st, "clone");
    return st;
}

al_status al_tensor_to(al_tensor *out, const al_tensor *t, int32_t dtype, int32_t device_type, int32_t device_index) {
    if (out) memset(out, 0, sizeof *out);
    AL_TRY(al_check_tensor("to", "self", t));
    if (dtype < 0 || dtype >= AL_DTYPE_COUNT) return al_error(AL_ERR_ARG, "to: unknown dtype code %d", dtype);
    al_status st = al_tensor_empty(out, t->ndim, t->size, dtype, device_type, device_index);
    if (st != AL_OK) return al_error_prefix(st, "to");
    st = al_tensor_copy_(out, t);
    if (st != AL_OK) al_tensor_release(out);
    return st;
}
