/*
 * tensor_view.c — views: select, narrow, transpose, permute, view/reshape, expand, (un)squeeze,
 * as_strided. Each rewrites a descriptor and retains the storage; none copies data (reshape copies
 * only when no view can express the new shape, and says so through *copied).
 * Dims and indices are 0-based here; the Lua front end converts from 1-based / negative.
 */
#include "internal.h"
#include <stdio.h>

/* Start out as a new reference to t's view (the caller then edits the descriptor). */
static al_status start_view(const char *op, al_tensor *out, const al_tensor *t) {
    if (out) memset(out, 0, sizeof *out);
    if (!out) return al_error(AL_ERR_ARG, "%s: out is NULL", op);
    AL_TRY(al_check_tensor(op, "self", t));
    *out = *t;
    al_storage_retain(out->storage);
    return AL_OK;
}

/* v + 1 for a 1-based message, without overflowing on hostile values (UBSan found dim = INT32_MAX). */
static long long plus1(int64_t v) { return v == INT64_MAX ? (long long)v : (long long)v + 1; }

static al_status check_dim(const char *op, const al_tensor *t, int32_t dim, int32_t extra) {
    if (dim < 0 || dim >= t->ndim + extra)
        return al_error(AL_ERR_ARG, "%s: dim %lld out of range for a tensor with %d dims", op, (long long)dim + 1, t->ndim);
    return AL_OK;
}

static void drop_dim(al_tensor *t, int32_t dim) {
    for (int32_t d = dim; d < t->ndim - 1; d++) {
        t->size[d] = t->size[d + 1];
        t->stride[d] = t->stride[d + 1];
    }
    t->ndim--;
    t->size[t->ndim] = 0;
    t->stride[t->ndim] = 0;
}

/* offset + index * stride without signed overflow. It can only overflow for an empty tensor (an extent
 * of 0 elsewhere lets any stride pass the bounds checks: fuzz_views found stride INT64_MAX); such a view
 * addresses nothing, so its offset stays where it was. */
static int64_t step_offset(int64_t offset, int64_t index, int64_t stride) {
    int64_t step, res;
    if (__builtin_mul_overflow(index, stride, &step) || __builtin_add_overflow(offset, step, &res)) return offset;
    return res;
}

al_status al_tensor_select(al_tensor *out, const al_tensor *t, int32_t dim, int64_t index) {
    AL_TRY(al_check_tensor("select", "self", t));
    if (out) memset(out, 0, sizeof *out);
    AL_TRY(check_dim("select", t, dim, 0));
    if (index < 0 || index >= t->size[dim])
        return al_error(AL_ERR_ARG, "select: index %lld out of range for dim %lld of size %lld", plus1(index),
                        (long long)dim + 1, (long long)t->size[dim]);
    AL_TRY(start_view("select", out, t));
    out->offset = step_offset(out->offset, index, t->stride[dim]);
    drop_dim(out, dim);
    return AL_OK;
}

al_status al_tensor_narrow(al_tensor *out, const al_tensor *t, int32_t dim, int64_t start, int64_t length) {
    AL_TRY(al_check_tensor("narrow", "self", t));
    if (out) memset(out, 0, sizeof *out);
    AL_TRY(check_dim("narrow", t, dim, 0));
    /* length > size - start, not start + length > size: the sum overflows on hostile input (fuzz_views) */
    if (start < 0 || length < 0 || start > t->size[dim] || length > t->size[dim] - start)
        return al_error(AL_ERR_ARG, "narrow: range start %lld length %lld out of range for dim %lld of size %lld",
                        plus1(start), (long long)length, (long long)dim + 1, (long long)t->size[dim]);
    AL_TRY(start_view("narrow", out, t));
    out->offset = step_offset(out->offset, start, t->stride[dim]);
    out->size[dim] = length;
    return AL_OK;
}

al_status al_tensor_transpose(al_tensor *out, const al_tensor *t, int32_t dim0, int32_t dim1) {
    AL_TRY(al_check_tensor("transpose", "self", t));
    if (out) memset(out, 0, sizeof *out);
    AL_TRY(check_dim("transpose", t, dim0, 0));
    AL_TRY(check_dim("transpose", t, dim1, 0));
    AL_TRY(start_view("transpose", out, t));
    int64_t s = out->size[dim0], st = out->stride[dim0];
    out->size[dim0] = out->size[dim1];
    out->stride[dim0] = out->stride[dim1];
    out->size[dim1] = s;
    out->stride[dim1] = st;
    return AL_OK;
}

al_status al_tensor_permute(al_tensor *out, const al_tensor *t, int32_t ndim, const int32_t *perm) {
    AL_TRY(al_check_tensor("permute", "self", t));
    if (out) memset(out, 0, sizeof *out);
    if (ndim != t->ndim)
        return al_error(AL_ERR_ARG, "permute: expected %d dims in the permutation, got %d", t->ndim, ndim);
    int seen[AL_MAX_DIMS] = {0};
    for (int32_t i = 0; i < ndim; i++) {
        if (perm[i] < 0 || perm[i] >= ndim)
            return al_error(AL_ERR_ARG, "permute: dim %lld out of range for a tensor with %d dims", (long long)perm[i] + 1, ndim);
        if (seen[perm[i]]++)
            return al_error(AL_ERR_ARG, "permute: dim %d appears twice; expected a permutation of 1..%d",
                            perm[i] + 1, ndim);
    }
    AL_TRY(start_view("permute", out, t));
    for (int32_t i = 0; i < ndim; i++) {
        out->size[i] = t->size[perm[i]];
        out->stride[i] = t->stride[perm[i]];
    }
    return AL_OK;
}

/* Resolve one -1 extent and check the element count; fills newsize. */
static al_status infer_shape(const char *op, const al_tensor *t, int32_t ndim, const int64_t *size, int64_t *newsize) {
    if (ndim < 0 || ndim > AL_MAX_DIMS) return al_error(AL_ERR_ARG, "%s: expected 0 to 8 dims, got %d", op, ndim);
    int32_t infer = -1;
    int64_t known = 1;
    for (int32_t d = 0; d < ndim; d++) {
        if (size[d] == -1) {
            if (infer >= 0) return al_error(AL_ERR_ARG, "%s: only one dim may be -1", op);
            infer = d;
        } else if (size[d] < 0) {
            return al_error(AL_ERR_ARG, "%s: invalid size %lld at dim %d", op, (long long)size[d], d + 1);
        } else {
            if (size[d] > 0 && known > INT64_MAX / size[d]) return al_error(AL_ERR_ARG, "%s: shape overflows", op);
            known *= size[d];
        }
        newsize[d] = size[d];
    }
    int64_t numel = al_tensor_numel(t);
    char a[160], b[160];
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            return al_error(AL_ERR_ARG, "%s: shape %s is invalid for a tensor of %lld elements (%s)", op,
                            al_shape_str(ndim, size, a, sizeof a), (long long)numel,
                            al_shape_str(t->ndim, t->size, b, sizeof b));
        newsize[infer] = numel / known;
    } else if (known != numel) {
        return al_error(AL_ERR_ARG, "%s: shape %s is invalid for a tensor of %lld elements (%s)", op,
                        al_shape_str(ndim, size, a, sizeof a), (long long)numel,
                        al_shape_str(t->ndim, t->size, b, sizeof b));
    }
    return AL_OK;
}

/* PyTorch's stride computation for view(): groups of old dims that are contiguous with each other
 * can be re-split freely. Returns 0 when the new shape cannot be a view. */
static int compute_view_strides(const al_tensor *t, int32_t ndim, const int64_t *size, int64_t *stride) {
    int64_t numel = al_tensor_numel(t);
    if (numel == 0 || t->ndim == 0) {
        al_contiguous_strides(ndim, size, stride);
        return 1;
    }
    int32_t view_d = ndim - 1;
    int64_t chunk_base_stride = t->stride[t->ndim - 1];
    int64_t tensor_numel = 1, view_numel = 1;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        tensor_numel *= t->size[d];
        if (d == 0 || (t->size[d - 1] != 1 && t->stride[d - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || size[view_d] == 1)) {
                stride[view_d] = view_numel * chunk_base_stride;
                view_numel *= size[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return 0;
            if (d > 0) {
                chunk_base_stride = t->stride[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

al_status al_tensor_view(al_tensor *out, const al_tensor *t, int32_t ndim, const int64_t *size) {
    AL_TRY(al_check_tensor("view", "self", t));
    if (out) memset(out, 0, sizeof *out);
    int64_t newsize[AL_MAX_DIMS] = {0}, newstride[AL_MAX_DIMS] = {0};
    AL_TRY(infer_shape("view", t, ndim, size, newsize));
    if (!compute_view_strides(t, ndim, newsize, newstride)) {
        char a[160], b[160], c[160];
        return al_error(AL_ERR_ARG,
                        "view: shape %s cannot be a view of a tensor with size %s and strides %s "
                        "(use :reshape(), which copies, or :contiguous() first)",
                        al_shape_str(ndim, newsize, a, sizeof a), al_shape_str(t->ndim, t->size, b, sizeof b),
                        al_shape_str(t->ndim, t->stride, c, sizeof c));
    }
    AL_TRY(start_view("view", out, t));
    out->ndim = ndim;
    for (int32_t d = 0; d < AL_MAX_DIMS; d++) {
        out->size[d] = d < ndim ? newsize[d] : 0;
        out->stride[d] = d < ndim ? newstride[d] : 0;
    }
    return AL_OK;
}

al_status al_tensor_reshape(al_tensor *out, const al_tensor *t, int32_t ndim, const int64_t *size, int32_t *copied) {
    AL_TRY(al_check_tensor("reshape", "self", t));
    if (out) memset(out, 0, sizeof *out);
    int64_t newsize[AL_MAX_DIMS] = {0}, newstride[AL_MAX_DIMS] = {0};
    AL_TRY(infer_shape("reshape", t, ndim, size, newsize));
    if (copied) *copied = 0;
    if (compute_view_strides(t, ndim, newsize, newstride)) return al_tensor_view(out, t, ndim, newsize);
    al_tensor c;
    al_status cst = al_tensor_clone(&c, t);
    if (cst != AL_OK) return al_error_prefix(cst, "reshape"); /* e.g. out of memory: name the op (fuzz_views) */
    al_status st = al_tensor_view(out, &c, ndim, newsize);
    al_tensor_release(&c);
    if (st == AL_OK && copied) *copied = 1;
    return st;
}

al_status al_tensor_expand(al_tensor *out, const al_tensor *t, int32_t ndim, const int64_t *size) {
    AL_TRY(al_check_tensor("expand", "self", t));
    if (out) memset(out, 0, sizeof *out);
    if (ndim < t->ndim || ndim > AL_MAX_DIMS)
        return al_error(AL_ERR_ARG, "expand: expected %d to 8 dims, got %d", t->ndim, ndim);
    int64_t ns[AL_MAX_DIMS] = {0}, nst[AL_MAX_DIMS] = {0};
    int32_t lead = ndim - t->ndim;
    for (int32_t d = 0; d < ndim; d++) {
        int32_t td = d - lead;
        int64_t want = size[d];
        if (td < 0) {
            if (want < 0) return al_error(AL_ERR_ARG, "expand: -1 is not allowed for the new leading dim %d", d + 1);
            ns[d] = want;
            nst[d] = 0;
            continue;
        }
        if (want == -1) want = t->size[td];
        if (want == t->size[td]) {
            ns[d] = want;
            nst[d] = t->stride[td];
        } else if (t->size[td] == 1 && want >= 0) {
            ns[d] = want;
            nst[d] = 0;
        } else {
            char a[160], b[160];
            return al_error(AL_ERR_ARG, "expand: cannot expand %s to %s: dim %d has size %lld, not 1",
                            al_shape_str(t->ndim, t->size, a, sizeof a), al_shape_str(ndim, size, b, sizeof b),
                            td + 1, (long long)t->size[td]);
        }
    }
    /* the element count must fit int64 (al_tensor_numel and every loop rely on it; found by fuzz_views) */
    int64_t numel = 1;
    for (int32_t d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(numel, ns[d], &numel)) {
            char a[160];
            return al_error(AL_ERR_ARG, "expand: shape %s overflows the addressable size", al_shape_str(ndim, ns, a, sizeof a));
        }
    AL_TRY(start_view("expand", out, t));
    out->ndim = ndim;
    memcpy(out->size, ns, sizeof ns);
    memcpy(out->stride, nst, sizeof nst);
    return AL_OK;
}

al_status al_tensor_unsqueeze(al_tensor *out, const al_tensor *t, int32_t dim) {
    AL_TRY(al_check_tensor("unsqueeze", "self", t));
    if (out) memset(out, 0, sizeof *out);
    AL_TRY(check_dim("unsqueeze", t, dim, 1));
    if (t->ndim >= AL_MAX_DIMS) return al_error(AL_ERR_ARG, "unsqueeze: a tensor already has the maximum of 8 dims");
    AL_TRY(start_view("unsqueeze", out, t));
    for (int32_t d = out->ndim; d > dim; d--) {
        out->size[d] = out->size[d - 1];
        out->stride[d] = out->stride[d - 1];
    }
    out->size[dim] = 1;
    /* PyTorch's choice, size * stride; any stride serves an extent-1 dim, so 1 where that product
     * overflows (an empty tensor may carry any stride: fuzz_views) */
    int64_t st = 1;
    if (dim < t->ndim && __builtin_mul_overflow(t->size[dim], t->stride[dim], &st)) st = 1;
    out->stride[dim] = st;
    out->ndim++;
    return AL_OK;
}

al_status al_tensor_squeeze(al_tensor *out, const al_tensor *t, int32_t dim) {
    AL_TRY(al_check_tensor("squeeze", "self", t));
    if (out) memset(out, 0, sizeof *out);
    if (dim != -1) AL_TRY(check_dim("squeeze", t, dim, 0));
    AL_TRY(start_view("squeeze", out, t));
    if (dim >= 0) {
        if (out->size[dim] == 1) drop_dim(out, dim);
        return AL_OK;
    }
    for (int32_t d = out->ndim - 1; d >= 0; d--)
        if (out->size[d] == 1) drop_dim(out, d);
    return AL_OK;
}

al_status al_tensor_as_strided(al_tensor *out, const al_tensor *t, int32_t ndim, const int64_t *size,
                               const int64_t *stride, int64_t offset) {
    AL_TRY(al_check_tensor("as_strided", "self", t));
    if (out) memset(out, 0, sizeof *out);
    if (ndim < 0 || ndim > AL_MAX_DIMS) return al_error(AL_ERR_ARG, "as_strided: expected 0 to 8 dims, got %d", ndim);
    if (offset < 0) return al_error(AL_ERR_ARG, "as_strided: negative storage offset %lld", (long long)offset);
    int64_t lo = offset, hi = offset, numel = 1;
    for (int32_t d = 0; d < ndim; d++) {
        if (size[d] < 0) return al_error(AL_ERR_ARG, "as_strided: negative size at dim %d", d + 1);
        if (stride[d] < 0) return al_error(AL_ERR_ARG, "as_strided: negative stride at dim %d", d + 1);
        /* checked arithmetic: a wrapped reach would pass the bounds test below (found by fuzz_views) */
        int64_t reach = 0;
        if (__builtin_mul_overflow(numel, size[d], &numel) ||
            (size[d] > 0 && (__builtin_mul_overflow(size[d] - 1, stride[d], &reach) ||
                             __builtin_add_overflow(hi, reach, &hi))))
            return al_error(AL_ERR_ARG, "as_strided: size and stride at dim %d overflow the addressable range", d + 1);
    }
    if (numel > 0 && (lo < 0 || hi >= t->storage_numel))
        return al_error(AL_ERR_ARG,
                        "as_strided: the view reaches element %lld but the storage holds %lld elements",
                        (long long)hi, (long long)t->storage_numel);
    AL_TRY(start_view("as_strided", out, t));
    out->ndim = ndim;
    out->offset = offset;
    for (int32_t d = 0; d < AL_MAX_DIMS; d++) {
        out->size[d] = d < ndim ? size[d] : 0;
        out->stride[d] = d < ndim ? stride[d] : 0;
    }
    return AL_OK;
}
