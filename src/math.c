/*
 * math.c — the front door of the Math section of include/attnlab.h: al_unary, al_binary,
 * al_binary_scalar, al_where, al_reduce, al_max_dim, al_softmax, al_matmul.
 *
 * Each function validates (released tensors, dtypes, one device for all operands, dims), broadcasts
 * (al_broadcast_shapes), picks the output dtype, allocates the output (al_tensor_empty), then runs
 * the CPU implementation (src/cpu/) or the CUDA plugin's table (src/cuda_plugin.h), which share one
 * contract: inputs expanded to the output's shape, reductions in keepdim form. Reductions squeeze
 * their keepdim result with a view afterwards. On any failure every temporary is released and the
 * outputs are left zeroed.
 *
 * Output dtypes (floats keep their dtype; FP8 is a storage format, so math on it gives f32):
 *   unary      neg/abs keep the dtype (bool is an error); exp/log/sqrt/tanh on integers give f32
 *   binary     al_promote_dtypes(a, b); div of integers gives f32; comparisons give bool
 *   scalar     the tensor's dtype; an integer tensor with a non-integral scalar (or div) gives f32,
 *              a bool tensor with an integral scalar gives i64; comparisons give bool
 *   where      al_promote_dtypes(a, b)
 *   sum        floats keep the dtype, integers/bool give i64; mean: integers give f32
 *   amax/amin  the input's dtype; max_dim values: the input's dtype, indices: i64
 *   softmax    floats keep the dtype, integers give f32
 *   matmul     al_promote_dtypes(a, b); integer operands are an error
 */
#include "internal.h"
#include "cuda_plugin.h"
#include "cpu/cpu_math.h"

#include <math.h>
#include <stdio.h>

/* ---- names for messages ------------------------------------------------------------------------ */
static const char *unary_name(int32_t op) {
    static const char *n[] = {"neg", "abs", "exp", "log", "sqrt", "tanh"};
    return (op >= 0 && op <= AL_UNARY_TANH) ? n[op] : "unary";
}
static const char *binary_name(int32_t op) {
    static const char *n[] = {"add", "sub", "mul", "div", "maximum", "minimum", "pow",
                              "eq", "ne", "lt", "le", "gt", "ge"};
    return (op >= 0 && op <= AL_BINARY_GE) ? n[op] : "binary";
}
static const char *reduce_name(int32_t op) {
    static const char *n[] = {"sum", "mean", "amax", "amin"};
    return (op >= 0 && op <= AL_REDUCE_AMIN) ? n[op] : "reduce";
}

static const char *dev_str(const al_tensor *t, char *buf, size_t n) {
    if (t->device_type == AL_DEVICE_CPU) snprintf(buf, n, "cpu");
    else snprintf(buf, n, "cuda:%d", (int)t->device_index);
    return buf;
}

static const char *dtype_str(int32_t d) {
    const char *s = al_dtype_name(d);
    return s ? s : "?";
}

/* ---- validation helpers -------------------------------------------------------------------------- */
static al_status check_input(const char *op, const char *arg, const al_tensor *t) {
    if (!t) return al_error(AL_ERR_ARG, "%s: %s must be a tensor, got NULL", op, arg);
    AL_TRY(al_check_tensor(op, arg, t));
    if (t->dtype < 0 || t->dtype >= AL_DTYPE_COUNT)
        return al_error(AL_ERR_ARG, "%s: %s has an unknown dtype code %d", op, arg, (int)t->dtype);
    return AL_OK;
}

/* "add: a is on cpu, b is on cuda:0" */
static al_status check_same_device(const char *op, const char *an, const al_tensor *a, const char *bn,
                                   const al_tensor *b) {
    if (a->device_type == b->device_type &&
        (a->device_type == AL_DEVICE_CPU || a->device_index == b->device_index))
        return AL_OK;
    char da[32], db[32];
    return al_error(AL_ERR_ARG, "%s: %s is on %s, %s is on %s", op, an, dev_str(a, da, sizeof da), bn,
                    dev_str(b, db, sizeof db));
}

/* The plugin table for a cuda tensor's device, or an error naming op. */
static al_status cuda_api(const char *op, const al_tensor *t, const al_cuda_api **api) {
    *api = al_cuda_api_get();
    if (!*api) return al_error_prefix(AL_ERR_DEVICE, op);
    return al_cuda_check_device(op, t->device_index);
}

#define NEED_FN(api, fn, op)                                                                        \
    do {                                                                                            \
        if (!(api)->fn)                                                                             \
            return al_error(AL_ERR_UNSUPPORTED, "%s: the CUDA plugin does not implement %s", op, #fn); \
    } while (0)

static int is_float(int32_t d) { return al_dtype_is_float(d) != 0; }
static int is_fp8(int32_t d) { return d == AL_DTYPE_FP8_E4M3 || d == AL_DTYPE_FP8_E5M2; }
/* The dtype float math on d produces: floats keep theirs (FP8 gives f32), integers give f32. */
static int32_t float_result(int32_t d) { return (is_float(d) && !is_fp8(d)) ? d : AL_DTYPE_F32; }

static al_status empty_like_shape(al_tensor *out, int32_t ndim, const int64_t *size, int32_t dtype,
                                  const al_tensor *like) {
    return al_tensor_empty(out, ndim, size, dtype, like->device_type, like->device_index);
}

/* Finish: on success move r into *out, on failure release r and zero *out. */
static al_status finish(al_status st, al_tensor *r, al_tensor *out) {
    if (st == AL_OK) {
        *out = *r;
    } else {
        al_tensor_release(r);
        memset(out, 0, sizeof *out);
    }
    return st;
}

/* ---- unary ------------------------------------------------------------------------------------- */
al_status al_unary(al_tensor *out, int32_t op, const al_tensor *a) {
    if (!out) return al_error(AL_ERR_ARG, "unary: out must not be NULL");
    al_tensor r = {0};
    const char *name = unary_name(op);
    al_status st;
    if (op < 0 || op > AL_UNARY_TANH) {
        st = al_error(AL_ERR_ARG, "unary: unknown op %d (expected 0..%d)", (int)op, (int)AL_UNARY_TANH);
        return finish(st, &r, out);
    }
    if ((st = check_input(name, "a", a)) != AL_OK) return finish(st, &r, out);
    int32_t dt;
    if (op == AL_UNARY_NEG || op == AL_UNARY_ABS) {
        if (a->dtype == AL_DTYPE_BOOL)
            return finish(al_error(AL_ERR_ARG, "%s: a is a bool tensor (expected a number dtype)", name), &r, out);
        dt = is_fp8(a->dtype) ? AL_DTYPE_F32 : a->dtype;
    } else {
        dt = float_result(a->dtype);
    }
    if ((st = empty_like_shape(&r, a->ndim, a->size, dt, a)) != AL_OK) return finish(st, &r, out);
    if (a->device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api;
        if ((st = cuda_api(name, a, &api)) != AL_OK) return finish(st, &r, out);
        if (!api->unary) st = al_error(AL_ERR_UNSUPPORTED, "%s: the CUDA plugin does not implement unary", name);
        else st = api->unary(op, &r, a);
    } else {
        st = al_cpu_unary(op, &r, a);
    }
    return finish(st, &r, out);
}

/* ---- binary ------------------------------------------------------------------------------------ */
static int is_compare(int32_t op) { return op >= AL_BINARY_EQ && op <= AL_BINARY_GE; }

static int32_t binary_result(int32_t op, int32_t da, int32_t db) {
    if (is_compare(op)) return AL_DTYPE_BOOL;
    int32_t p = al_promote_dtypes(da, db);
    if (op == AL_BINARY_DIV && !is_float(p)) return AL_DTYPE_F32;
    return p;
}

al_status al_binary(al_tensor *out, int32_t op, const al_tensor *a, const al_tensor *b) {
    if (!out) return al_error(AL_ERR_ARG, "binary: out must not be NULL");
    al_tensor r = {0}, ea = {0}, eb = {0};
    const char *name = binary_name(op);
    al_status st;
    if (op < 0 || op > AL_BINARY_GE) {
        st = al_error(AL_ERR_ARG, "binary: unknown op %d (expected 0..%d)", (int)op, (int)AL_BINARY_GE);
        return finish(st, &r, out);
    }
    if ((st = check_input(name, "a", a)) != AL_OK || (st = check_input(name, "b", b)) != AL_OK ||
        (st = check_same_device(name, "a", a, "b", b)) != AL_OK)
        return finish(st, &r, out);
    int32_t nd;
    int64_t shape[AL_MAX_DIMS];
    if ((st = al_broadcast_shapes(name, a->ndim, a->size, b->ndim, b->size, &nd, shape)) != AL_OK)
        return finish(st, &r, out);
    int32_t dt = binary_result(op, a->dtype, b->dtype);
    if ((st = empty_like_shape(&r, nd, shape, dt, a)) != AL_OK) goto done;
    if ((st = al_tensor_expand(&ea, a, nd, shape)) != AL_OK) goto done;
    if ((st = al_tensor_expand(&eb, b, nd, shape)) != AL_OK) goto done;
    if (a->device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api;
        if ((st = cuda_api(name, a, &api)) != AL_OK) goto done;
        if (!api->binary) st = al_error(AL_ERR_UNSUPPORTED, "%s: the CUDA plugin does not implement binary", name);
        else st = api->binary(op, &r, &ea, &eb);
    } else {
        st = al_cpu_binary(op, &r, &ea, &eb);
    }
done:
    al_tensor_release(&ea);
    al_tensor_release(&eb);
    return finish(st, &r, out);
}

al_status al_binary_scalar(al_tensor *out, int32_t op, const al_tensor *a, double s, int32_t scalar_first) {
    if (!out) return al_error(AL_ERR_ARG, "binary_scalar: out must not be NULL");
    al_tensor r = {0};
    const char *name = binary_name(op);
    al_status st;
    if (op < 0 || op > AL_BINARY_GE) {
        st = al_error(AL_ERR_ARG, "binary_scalar: unknown op %d (expected 0..%d)", (int)op, (int)AL_BINARY_GE);
        return finish(st, &r, out);
    }
    if ((st = check_input(name, "a", a)) != AL_OK) return finish(st, &r, out);
    int32_t dt;
    if (is_compare(op)) dt = AL_DTYPE_BOOL;
    else if (is_float(a->dtype)) dt = float_result(a->dtype);
    else if (op == AL_BINARY_DIV || !(isfinite(s) && s == floor(s))) dt = AL_DTYPE_F32;
    else dt = a->dtype == AL_DTYPE_BOOL ? AL_DTYPE_I64 : a->dtype;
    if ((st = empty_like_shape(&r, a->ndim, a->size, dt, a)) != AL_OK) return finish(st, &r, out);
    if (a->device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api;
        if ((st = cuda_api(name, a, &api)) != AL_OK) return finish(st, &r, out);
        if (!api->binary_scalar)
            st = al_error(AL_ERR_UNSUPPORTED, "%s: the CUDA plugin does not implement binary_scalar", name);
        else st = api->binary_scalar(op, &r, a, s, scalar_first != 0);
    } else {
        st = al_cpu_binary_scalar(op, &r, a, s, scalar_first != 0);
    }
    return finish(st, &r, out);
}

/* ---- where ------------------------------------------------------------------------------------- */
al_status al_where(al_tensor *out, const al_tensor *cond, const al_tensor *a, const al_tensor *b) {
    if (!out) return al_error(AL_ERR_ARG, "where: out must not be NULL");
    al_tensor r = {0}, ec = {0}, ea = {0}, eb = {0};
    al_status st;
    if ((st = check_input("where", "cond", cond)) != AL_OK || (st = check_input("where", "a", a)) != AL_OK ||
        (st = check_input("where", "b", b)) != AL_OK)
        return finish(st, &r, out);
    if (cond->dtype != AL_DTYPE_BOOL && cond->dtype != AL_DTYPE_U8)
        return finish(al_error(AL_ERR_ARG, "where: cond must be a bool or u8 tensor, got %s", dtype_str(cond->dtype)),
                      &r, out);
    if ((st = check_same_device("where", "cond", cond, "a", a)) != AL_OK ||
        (st = check_same_device("where", "a", a, "b", b)) != AL_OK)
        return finish(st, &r, out);
    int32_t n1, nd;
    int64_t s1[AL_MAX_DIMS], shape[AL_MAX_DIMS];
    if ((st = al_broadcast_shapes("where", cond->ndim, cond->size, a->ndim, a->size, &n1, s1)) != AL_OK ||
        (st = al_broadcast_shapes("where", n1, s1, b->ndim, b->size, &nd, shape)) != AL_OK)
        return finish(st, &r, out);
    int32_t dt = al_promote_dtypes(a->dtype, b->dtype);
    if ((st = empty_like_shape(&r, nd, shape, dt, a)) != AL_OK) goto done;
    if ((st = al_tensor_expand(&ec, cond, nd, shape)) != AL_OK) goto done;
    if ((st = al_tensor_expand(&ea, a, nd, shape)) != AL_OK) goto done;
    if ((st = al_tensor_expand(&eb, b, nd, shape)) != AL_OK) goto done;
    if (a->device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api;
        if ((st = cuda_api("where", a, &api)) != AL_OK) goto done;
        if (!api->where) st = al_error(AL_ERR_UNSUPPORTED, "where: the CUDA plugin does not implement where");
        else st = api->where(&r, &ec, &ea, &eb);
    } else {
        st = al_cpu_where(&r, &ec, &ea, &eb);
    }
done:
    al_tensor_release(&ec);
    al_tensor_release(&ea);
    al_tensor_release(&eb);
    return finish(st, &r, out);
}

/* ---- reductions -------------------------------------------------------------------------------- */
/* Validate a list of 0-based dims into a bit mask; ndims = 0 means every dim. */
static al_status dims_to_mask(const char *op, const al_tensor *a, int32_t ndims, const int32_t *dims,
                              uint32_t *mask) {
    *mask = 0;
    if (ndims < 0 || ndims > a->ndim)
        return al_error(AL_ERR_ARG, "%s: ndims must be 0..%d (a has %d dims), got %d", op, (int)a->ndim,
                        (int)a->ndim, (int)ndims);
    if (ndims == 0) {
        *mask = a->ndim ? (uint32_t)((1u << a->ndim) - 1u) : 0u;
        return AL_OK;
    }
    if (!dims) return al_error(AL_ERR_ARG, "%s: dims must not be NULL when ndims = %d", op, (int)ndims);
    for (int32_t i = 0; i < ndims; i++) {
        int32_t d = dims[i];
        if (d < 0 || d >= a->ndim)
            return al_error(AL_ERR_ARG, "%s: dim %d out of range for a tensor with %d dims (expected 0..%d)", op,
                            (int)d, (int)a->ndim, (int)a->ndim - 1);
        if (*mask & (1u << d)) return al_error(AL_ERR_ARG, "%s: dim %d appears twice in dims", op, (int)d);
        *mask |= 1u << d;
    }
    return AL_OK;
}

/* Replace the keepdim tensor *r by a view without the dims in mask (r is contiguous). */
static al_status squeeze_mask(al_tensor *r, uint32_t mask) {
    int64_t shape[AL_MAX_DIMS];
    int32_t nd = 0;
    for (int32_t d = 0; d < r->ndim; d++)
        if (!(mask & (1u << d))) shape[nd++] = r->size[d];
    if (nd == r->ndim) return AL_OK;
    al_tensor v = {0};
    AL_TRY(al_tensor_view(&v, r, nd, shape));
    al_tensor_release(r);
    *r = v;
    return AL_OK;
}

al_status al_reduce(al_tensor *out, int32_t op, const al_tensor *a, int32_t ndims, const int32_t *dims,
                    int32_t keepdim) {
    if (!out) return al_error(AL_ERR_ARG, "reduce: out must not be NULL");
    al_tensor r = {0};
    const char *name = reduce_name(op);
    al_status st;
    if (op < 0 || op > AL_REDUCE_AMIN)
        return finish(al_error(AL_ERR_ARG, "reduce: unknown op %d (expected 0..%d)", (int)op, (int)AL_REDUCE_AMIN),
                      &r, out);
    if ((st = check_input(name, "a", a)) != AL_OK) return finish(st, &r, out);
    uint32_t mask;
    if ((st = dims_to_mask(name, a, ndims, dims, &mask)) != AL_OK) return finish(st, &r, out);
    int64_t kshape[AL_MAX_DIMS], nred = 1, nout = 1;
    for (int32_t d = 0; d < a->ndim; d++) {
        int red = (mask >> d) & 1u;
        kshape[d] = red ? 1 : a->size[d];
        if (red) nred *= a->size[d];
        else nout *= a->size[d];
    }
    if ((op == AL_REDUCE_AMAX || op == AL_REDUCE_AMIN) && nred == 0 && nout > 0)
        return finish(al_error(AL_ERR_ARG, "%s: cannot reduce over a zero-size dim (a is %s)", name,
                               al_tensor_describe(a, (char[160]){0}, 160)),
                      &r, out);
    int32_t dt;
    if (op == AL_REDUCE_SUM) dt = is_float(a->dtype) ? float_result(a->dtype) : AL_DTYPE_I64;
    else if (op == AL_REDUCE_MEAN) dt = float_result(a->dtype);
    else dt = a->dtype;
    if ((st = empty_like_shape(&r, a->ndim, kshape, dt, a)) != AL_OK) return finish(st, &r, out);
    if (a->device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api;
        if ((st = cuda_api(name, a, &api)) != AL_OK) return finish(st, &r, out);
        if (!api->reduce) st = al_error(AL_ERR_UNSUPPORTED, "%s: the CUDA plugin does not implement reduce", name);
        else st = api->reduce(op, &r, a, mask);
    } else {
        st = al_cpu_reduce(op, &r, a, mask);
    }
    if (st == AL_OK && !keepdim) st = squeeze_mask(&r, mask);
    return finish(st, &r, out);
}

al_status al_max_dim(al_tensor *values, al_tensor *indices, const al_tensor *a, int32_t dim, int32_t keepdim) {
    if (!values || !indices) return al_error(AL_ERR_ARG, "max: values and indices must not be NULL");
    al_tensor rv = {0}, ri = {0};
    al_status st;
    if ((st = check_input("max", "a", a)) != AL_OK) goto fail;
    if (dim < 0 || dim >= a->ndim) {
        st = al_error(AL_ERR_ARG, "max: dim %d out of range for a tensor with %d dims (expected 0..%d)", (int)dim,
                      (int)a->ndim, (int)a->ndim - 1);
        goto fail;
    }
    int64_t kshape[AL_MAX_DIMS];
    int64_t nout = 1;
    for (int32_t d = 0; d < a->ndim; d++) {
        kshape[d] = d == dim ? 1 : a->size[d];
        nout *= kshape[d];
    }
    if (a->size[dim] == 0 && nout > 0) {
        st = al_error(AL_ERR_ARG, "max: dim %d has extent 0: there is no maximum", (int)dim);
        goto fail;
    }
    if ((st = empty_like_shape(&rv, a->ndim, kshape, a->dtype, a)) != AL_OK) goto fail;
    if ((st = empty_like_shape(&ri, a->ndim, kshape, AL_DTYPE_I64, a)) != AL_OK) goto fail;
    if (a->device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api;
        if ((st = cuda_api("max", a, &api)) != AL_OK) goto fail;
        if (!api->max_dim) st = al_error(AL_ERR_UNSUPPORTED, "max: the CUDA plugin does not implement max_dim");
        else st = api->max_dim(&rv, &ri, a, dim);
    } else {
        st = al_cpu_max_dim(&rv, &ri, a, dim);
    }
    if (st == AL_OK && !keepdim) {
        if ((st = squeeze_mask(&rv, 1u << dim)) == AL_OK) st = squeeze_mask(&ri, 1u << dim);
    }
    if (st != AL_OK) goto fail;
    *values = rv;
    *indices = ri;
    return AL_OK;
fail:
    al_tensor_release(&rv);
    al_tensor_release(&ri);
    memset(values, 0, sizeof *values);
    memset(indices, 0, sizeof *indices);
    return st;
}

/* ---- softmax ----------------------------------------------------------------------------------- */
al_status al_softmax(al_tensor *out, const al_tensor *a, int32_t dim, int32_t log) {
    if (!out) return al_error(AL_ERR_ARG, "softmax: out must not be NULL");
    const char *name = log ? "log_softmax" : "softmax";
    al_tensor r = {0};
    al_status st;
    if ((st = check_input(name, "a", a)) != AL_OK) return finish(st, &r, out);
    if (dim < 0 || dim >= a->ndim)
        return finish(al_error(AL_ERR_ARG, "%s: dim %d out of range for a tensor with %d dims (expected 0..%d)", name,
                               (int)dim, (int)a->ndim, (int)a->ndim - 1),
                      &r, out);
    if (a->dtype == AL_DTYPE_BOOL)
        return finish(al_error(AL_ERR_ARG, "%s: a is a bool tensor (expected a number dtype)", name), &r, out);
    if ((st = empty_like_shape(&r, a->ndim, a->size, float_result(a->dtype), a)) != AL_OK) return finish(st, &r, out);
    if (a->device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api;
        if ((st = cuda_api(name, a, &api)) != AL_OK) return finish(st, &r, out);
        if (!api->softmax) st = al_error(AL_ERR_UNSUPPORTED, "%s: the CUDA plugin does not implement softmax", name);
        else st = api->softmax(&r, a, dim, log != 0);
    } else {
        st = al_cpu_softmax(&r, a, dim, log != 0);
    }
    return finish(st, &r, out);
}

/* ---- matmul ------------------------------------------------------------------------------------ */
al_status al_matmul(al_tensor *out, const al_tensor *a, const al_tensor *b) {
    if (!out) return al_error(AL_ERR_ARG, "matmul: out must not be NULL");
    al_tensor r = {0}, ca = {0}, cb = {0}, ea = {0}, eb = {0};
    al_status st;
    char bufa[160], bufb[160];
    if ((st = check_input("matmul", "a", a)) != AL_OK || (st = check_input("matmul", "b", b)) != AL_OK ||
        (st = check_same_device("matmul", "a", a, "b", b)) != AL_OK)
        return finish(st, &r, out);
    if (a->ndim < 1 || b->ndim < 1)
        return finish(al_error(AL_ERR_ARG, "matmul: both operands need at least 1 dim, got a %s and b %s",
                               al_shape_str(a->ndim, a->size, bufa, sizeof bufa),
                               al_shape_str(b->ndim, b->size, bufb, sizeof bufb)),
                      &r, out);
    if (!is_float(a->dtype) || !is_float(b->dtype))
        return finish(al_error(AL_ERR_ARG, "matmul: integer matmul is not supported (a is %s, b is %s)",
                               dtype_str(a->dtype), dtype_str(b->dtype)),
                      &r, out);
    /* NumPy: a 1-d a is a row [1, k], a 1-d b a column [k, 1]; the added dim is dropped at the end */
    int a_vec = a->ndim == 1, b_vec = b->ndim == 1;
    int64_t m = a_vec ? 1 : a->size[a->ndim - 2];
    int64_t k = a->size[a->ndim - 1];
    int64_t kb = b_vec ? b->size[0] : b->size[b->ndim - 2];
    int64_t n = b_vec ? 1 : b->size[b->ndim - 1];
    if (k != kb)
        return finish(al_error(AL_ERR_ARG, "matmul: inner dimensions differ: a %s x b %s (%lld != %lld)",
                               al_shape_str(a->ndim, a->size, bufa, sizeof bufa),
                               al_shape_str(b->ndim, b->size, bufb, sizeof bufb), (long long)k, (long long)kb),
                      &r, out);
    int32_t nba = a_vec ? 0 : a->ndim - 2, nbb = b_vec ? 0 : b->ndim - 2, nb;
    int64_t bshape[AL_MAX_DIMS];
    if ((st = al_broadcast_shapes("matmul", nba, a->size, nbb, b->size, &nb, bshape)) != AL_OK)
        return finish(al_error(AL_ERR_ARG, "matmul: batch dims of a %s and b %s cannot be broadcast",
                               al_shape_str(a->ndim, a->size, bufa, sizeof bufa),
                               al_shape_str(b->ndim, b->size, bufb, sizeof bufb)),
                      &r, out);
    if (nb + 2 > AL_MAX_DIMS)
        return finish(al_error(AL_ERR_ARG, "matmul: the result would have more than %d dims", AL_MAX_DIMS), &r, out);
    int32_t dt = al_promote_dtypes(a->dtype, b->dtype);
    int32_t nd = nb + 2;
    int64_t ashape[AL_MAX_DIMS], b2shape[AL_MAX_DIMS], oshape[AL_MAX_DIMS];
    for (int32_t d = 0; d < nb; d++) ashape[d] = b2shape[d] = oshape[d] = bshape[d];
    ashape[nb] = m; ashape[nb + 1] = k;
    b2shape[nb] = k; b2shape[nb + 1] = n;
    oshape[nb] = m; oshape[nb + 1] = n;

    const al_tensor *pa = a, *pb = b;
    int cuda = a->device_type == AL_DEVICE_CUDA;
    /* the plugin gets operands of the result dtype; the CPU path converts per batch while packing */
    if (cuda && a->dtype != dt) {
        if ((st = al_tensor_to(&ca, a, dt, a->device_type, a->device_index)) != AL_OK) goto done;
        pa = &ca;
    }
    if (cuda && b->dtype != dt) {
        if ((st = al_tensor_to(&cb, b, dt, b->device_type, b->device_index)) != AL_OK) goto done;
        pb = &cb;
    }
    /* a [k] -> [1, k] (a view), b [k] -> [k, 1]; then expand the batch dims */
    {
        al_tensor ua = {0}, ub = {0};
        const al_tensor *qa = pa, *qb = pb;
        if (a_vec) {
            if ((st = al_tensor_unsqueeze(&ua, pa, 0)) != AL_OK) goto done;
            qa = &ua;
        }
        if (b_vec) {
            if ((st = al_tensor_unsqueeze(&ub, pb, 1)) != AL_OK) { al_tensor_release(&ua); goto done; }
            qb = &ub;
        }
        st = al_tensor_expand(&ea, qa, nd, ashape);
        if (st == AL_OK) st = al_tensor_expand(&eb, qb, nd, b2shape);
        al_tensor_release(&ua);
        al_tensor_release(&ub);
        if (st != AL_OK) goto done;
    }
    if ((st = empty_like_shape(&r, nd, oshape, dt, a)) != AL_OK) goto done;
    if (cuda) {
        const al_cuda_api *api;
        if ((st = cuda_api("matmul", a, &api)) != AL_OK) goto done;
        if (!api->matmul) st = al_error(AL_ERR_UNSUPPORTED, "matmul: the CUDA plugin does not implement matmul");
        else st = api->matmul(&r, &ea, &eb);
    } else {
        st = al_cpu_matmul(&r, &ea, &eb);
    }
    if (st == AL_OK && (a_vec || b_vec)) {
        /* drop the added dims: [..., 1, n] -> [..., n], [..., m, 1] -> [..., m] */
        uint32_t mask = 0;
        if (a_vec) mask |= 1u << nb;
        if (b_vec) mask |= 1u << (nb + 1);
        st = squeeze_mask(&r, mask);
    }
done:
    al_tensor_release(&ca);
    al_tensor_release(&cb);
    al_tensor_release(&ea);
    al_tensor_release(&eb);
    return finish(st, &r, out);
}
