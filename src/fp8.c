/*
 * fp8.c — FP8 quantisation over any strides: amax, per-tensor quantise / dequantise, per-row
 * (per-token) current scaling, MXFP8 block quantisation (32-element blocks, E8M0 scales, emulated).
 *
 * Each entry validates, allocates the (contiguous) outputs, then runs the CPU loops below or the CUDA
 * plugin's table (src/cuda/fp8.cu). Both sides use numeric/fp8_scale.h and numeric/convert.h, so they
 * give the same bits: a code is al_fp8_encode(fmt, (double)x * scale), one rounding from the double.
 *
 * CPU: dense inputs take a flat OpenMP loop; other views walk al_iter (one thread). That difference is
 * what al.fp8's combine_and_quantize exploits: a packed QKV buffer is one dense pass, its q/k/v
 * select views are three strided walks (bench/fp8_bench.lua).
 */
#include "internal.h"
#include "cuda_plugin.h"
#include "numeric/fp8_scale.h"

#include <math.h>
#include <stdlib.h>

static int is_fp8(int32_t d) { return d == AL_DTYPE_FP8_E4M3 || d == AL_DTYPE_FP8_E5M2; }
static int is_hp_float(int32_t d) { return al_dtype_is_float(d) && !is_fp8(d); }

AL_EXPORT double al_fp8_max(int32_t format) { return is_fp8(format) ? al_fp8_fmax(format) : 0.0; }

static al_status cuda_api(const char *op, const al_tensor *t, const al_cuda_api **api, int has) {
    AL_TRY(al_cuda_check_device(op, t->device_index));
    *api = al_cuda_api_get();
    if (!*api) return al_error_prefix(AL_ERR_DEVICE, op);
    if (!has) return al_error(AL_ERR_UNSUPPORTED, "%s: the loaded CUDA plugin has no FP8 kernels (rebuild it)", op);
    return AL_OK;
}

/* Dense (row-major contiguous) view? */
static int dense(const al_tensor *t) { return al_tensor_is_contiguous(t) != 0; }

static inline double ld(const al_tensor *t, int64_t off) { return al_load_f64(t->data, t->dtype, off); }

/* ---- amax ------------------------------------------------------------------------------------- */
static inline double amax_combine(double m, double v) {
    double a = fabs(v);
    if (m != m) return m;
    if (a != a) return a;
    return a > m ? a : m;
}

static double cpu_amax(const al_tensor *x) {
    int64_t n = al_tensor_numel(x);
    double m = 0.0;
    if (dense(x)) {
        const char *base = x->data;
        const int64_t o = x->offset;
        const int32_t dt = x->dtype;
        if (dt == AL_DTYPE_F32) {
            const float *p = (const float *)base + o;
            float fm = 0.0f;
            int nan = 0;
#pragma omp parallel for reduction(max : fm) reduction(| : nan) if (n > 65536)
            for (int64_t i = 0; i < n; i++) {
                float a = fabsf(p[i]);
                nan |= a != a;
                fm = a > fm ? a : fm;
            }
            return nan ? (double)NAN : (double)fm;
        }
        int nan = 0;
#pragma omp parallel for reduction(max : m) reduction(| : nan) if (n > 65536)
        for (int64_t i = 0; i < n; i++) {
            double a = fabs(al_load_f64(base, dt, o + i));
            nan |= a != a;
            m = a > m ? a : m;
        }
        return nan ? (double)NAN : m;
    }
    al_iter it;
    const int64_t *strides[1] = {x->stride};
    al_iter_init(&it, x->ndim, x->size, 1, strides, &x->offset);
    for (int64_t i = 0; i < it.numel; i++, al_iter_next(&it)) m = amax_combine(m, ld(x, it.off[0]));
    return m;
}

AL_EXPORT al_status al_amax_tensor(al_tensor *out, const al_tensor *x) {
    if (out) memset(out, 0, sizeof *out);
    AL_TRY(al_check_tensor("amax", "x", x));
    if (!out) return al_error(AL_ERR_ARG, "amax: out (the result tensor) must not be NULL");
    if (!al_dtype_is_float(x->dtype))
        return al_error(AL_ERR_ARG, "amax: x must be a float tensor, got %s", al_dtype_name(x->dtype));
    int64_t one = 1;
    if (x->device_type == AL_DEVICE_CUDA && al_tensor_numel(x) > 0) {
        const al_cuda_api *api;
        AL_TRY(cuda_api("amax", x, &api, 1));
        if (!api->amax_to) return al_error(AL_ERR_UNSUPPORTED, "amax: the loaded CUDA plugin has no FP8 kernels (rebuild it)");
        return api->amax_to(out, x);
    }
    if (x->device_type == AL_DEVICE_CUDA) {   /* no elements: 0, on x's device */
        AL_TRY(al_tensor_empty(out, 1, &one, AL_DTYPE_F64, AL_DEVICE_CUDA, x->device_index));
        al_status s = al_tensor_fill_(out, 0.0);
        if (s != AL_OK) al_tensor_release(out);
        return s;
    }
    double m = al_tensor_numel(x) > 0 ? al_canonical_nan(cpu_amax(x)) : 0.0;
    AL_TRY(al_tensor_empty(out, 1, &one, AL_DTYPE_F64, AL_DEVICE_CPU, 0));
    *(double *)al_tensor_data_ptr(out) = m;
    return AL_OK;
}

AL_EXPORT al_status al_amax(const al_tensor *x, double *amax) {
    AL_TRY(al_check_tensor("amax", "x", x));
    if (!amax) return al_error(AL_ERR_ARG, "amax: amax (the result pointer) must not be NULL");
    if (!al_dtype_is_float(x->dtype))
        return al_error(AL_ERR_ARG, "amax: x must be a float tensor, got %s", al_dtype_name(x->dtype));
    *amax = 0.0;
    if (al_tensor_numel(x) == 0) return AL_OK;
    double m;
    if (x->device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api;
        AL_TRY(cuda_api("amax", x, &api, 1));
        if (!api->amax) return al_error(AL_ERR_UNSUPPORTED, "amax: the loaded CUDA plugin has no FP8 kernels (rebuild it)");
        AL_TRY(api->amax(x, &m));
    } else {
        m = cpu_amax(x);
    }
    *amax = al_canonical_nan(m);
    return AL_OK;
}

/* ---- per-tensor quantise / dequantise ----------------------------------------------------------- */
static void cpu_quantize(al_tensor *out, const al_tensor *x, double scale) {
    const int32_t fmt = out->dtype;
    uint8_t *o = (uint8_t *)al_tensor_data_ptr(out);
    int64_t n = al_tensor_numel(x);
    if (dense(x)) {
        const char *base = x->data;
        const int64_t off = x->offset;
        const int32_t dt = x->dtype;
        if (dt == AL_DTYPE_F32) {
            const float *p = (const float *)base + off;
#pragma omp parallel for if (n > 65536)
            for (int64_t i = 0; i < n; i++) o[i] = al_fp8_encode(fmt, (double)p[i] * scale);
        } else {
#pragma omp parallel for if (n > 65536)
            for (int64_t i = 0; i < n; i++) o[i] = al_fp8_encode(fmt, al_load_f64(base, dt, off + i) * scale);
        }
        return;
    }
    al_iter it;
    const int64_t *strides[1] = {x->stride};
    al_iter_init(&it, x->ndim, x->size, 1, strides, &x->offset);
    for (int64_t i = 0; i < it.numel; i++, al_iter_next(&it)) o[i] = al_fp8_encode(fmt, ld(x, it.off[0]) * scale);
}

static void cpu_dequantize(al_tensor *out, const al_tensor *q, double scale_inv) {
    const int32_t fmt = q->dtype, dt = out->dtype;
    void *o = al_tensor_data_ptr(out);
    const uint8_t *b = (const uint8_t *)q->data;
    if (dense(q)) {
        int64_t n = al_tensor_numel(q);
        const uint8_t *p = b + q->offset;
#pragma omp parallel for if (n > 65536)
        for (int64_t i = 0; i < n; i++) al_store_f64(o, dt, i, al_fp8_decode(fmt, p[i]) * scale_inv);
        return;
    }
    al_iter it;
    const int64_t *strides[1] = {q->stride};
    al_iter_init(&it, q->ndim, q->size, 1, strides, &q->offset);
    for (int64_t i = 0; i < it.numel; i++, al_iter_next(&it))
        al_store_f64(o, dt, i, al_fp8_decode(fmt, b[it.off[0]]) * scale_inv);
}

static al_status check_format(const char *op, int32_t format) {
    if (!is_fp8(format))
        return al_error(AL_ERR_ARG, "%s: format must be fp8_e4m3 (%d) or fp8_e5m2 (%d), got %s", op, AL_DTYPE_FP8_E4M3,
                        AL_DTYPE_FP8_E5M2, al_dtype_name(format) ? al_dtype_name(format) : "an unknown dtype code");
    return AL_OK;
}

/* what per-tensor quantisation accepts: a valid x of a high-precision float dtype, an FP8 format, a scale > 0 */
static al_status check_quantize_args(const char *op, const al_tensor *x, int32_t format, double scale) {
    AL_TRY(al_check_tensor(op, "x", x));
    AL_TRY(check_format(op, format));
    if (!is_hp_float(x->dtype))
        return al_error(AL_ERR_ARG, "%s: x must be f32, f64, f16 or bf16, got %s", op, al_dtype_name(x->dtype));
    if (!(scale > 0.0) || !isfinite(scale))
        return al_error(AL_ERR_ARG, "%s: scale must be finite and > 0, got %g", op, scale);
    return AL_OK;
}

AL_EXPORT al_status al_fp8_quantize(al_tensor *out, const al_tensor *x, int32_t format, double scale) {
    if (out) memset(out, 0, sizeof *out);
    if (!out) return al_error(AL_ERR_ARG, "fp8_quantize: out must not be NULL");
    AL_TRY(check_quantize_args("fp8_quantize", x, format, scale));
    AL_TRY(al_tensor_empty(out, x->ndim, x->size, format, x->device_type, x->device_index));
    al_status st = AL_OK;
    if (al_tensor_numel(x) > 0) {
        if (x->device_type == AL_DEVICE_CUDA) {
            const al_cuda_api *api;
            st = cuda_api("fp8_quantize", x, &api, 1);
            if (st == AL_OK) st = api->fp8_quantize ? api->fp8_quantize(out, x, scale)
                                                   : al_error(AL_ERR_UNSUPPORTED, "fp8_quantize: the loaded CUDA plugin has no FP8 kernels (rebuild it)");
        } else {
            cpu_quantize(out, x, scale);
        }
    }
    if (st != AL_OK) al_tensor_release(out);
    return st;
}

AL_EXPORT al_status al_fp8_quantize_amax(al_tensor *out, al_tensor *amax, const al_tensor *x, int32_t format, double scale) {
    if (out) memset(out, 0, sizeof *out);
    if (amax) memset(amax, 0, sizeof *amax);
    if (!out || !amax) return al_error(AL_ERR_ARG, "fp8_quantize_amax: out and amax (the result tensors) must not be NULL");
    AL_TRY(check_quantize_args("fp8_quantize_amax", x, format, scale));
    if (x->device_type != AL_DEVICE_CUDA || al_tensor_numel(x) == 0) {   /* the two calls, one after the other */
        AL_TRY(al_fp8_quantize(out, x, format, scale));
        al_status st = al_amax_tensor(amax, x);
        if (st != AL_OK) al_tensor_release(out);
        return st;
    }
    const al_cuda_api *api;
    AL_TRY(cuda_api("fp8_quantize_amax", x, &api, 1));
    if (!api->fp8_quantize_amax)
        return al_error(AL_ERR_UNSUPPORTED, "fp8_quantize_amax: the loaded CUDA plugin has no FP8 kernels (rebuild it)");
    AL_TRY(al_tensor_empty(out, x->ndim, x->size, format, x->device_type, x->device_index));
    al_status st = api->fp8_quantize_amax(out, amax, x, scale);
    if (st != AL_OK) { al_tensor_release(out); al_tensor_release(amax); }
    return st;
}

AL_EXPORT al_status al_fp8_dequantize(al_tensor *out, const al_tensor *q, double scale_inv, int32_t dtype) {
    if (out) memset(out, 0, sizeof *out);
    if (!out) return al_error(AL_ERR_ARG, "fp8_dequantize: out must not be NULL");
    AL_TRY(al_check_tensor("fp8_dequantize", "q", q));
    if (!is_fp8(q->dtype))
        return al_error(AL_ERR_ARG, "fp8_dequantize: q must be fp8_e4m3 or fp8_e5m2, got %s", al_dtype_name(q->dtype));
    if (!is_hp_float(dtype))
        return al_error(AL_ERR_ARG, "fp8_dequantize: dtype must be f32, f64, f16 or bf16, got %s",
                        al_dtype_name(dtype) ? al_dtype_name(dtype) : "an unknown code");
    if (!isfinite(scale_inv))
        return al_error(AL_ERR_ARG, "fp8_dequantize: scale_inv must be finite, got %g", scale_inv);
    AL_TRY(al_tensor_empty(out, q->ndim, q->size, dtype, q->device_type, q->device_index));
    al_status st = AL_OK;
    if (al_tensor_numel(q) > 0) {
        if (q->device_type == AL_DEVICE_CUDA) {
            const al_cuda_api *api;
            st = cuda_api("fp8_dequantize", q, &api, 1);
            if (st == AL_OK) st = api->fp8_dequantize ? api->fp8_dequantize(out, q, scale_inv)
                                                     : al_error(AL_ERR_UNSUPPORTED, "fp8_dequantize: the loaded CUDA plugin has no FP8 kernels (rebuild it)");
        } else {
            cpu_dequantize(out, q, scale_inv);
        }
    }
    if (st != AL_OK) al_tensor_release(out);
    return st;
}

/* ---- per-row current scaling ------------------------------------------------------------------- */
static al_status cpu_quantize_rows(al_tensor *out, al_tensor *sinv, const al_tensor *x, int64_t rows, int64_t rowlen,
                                   double pow2_margin) {
    const int32_t fmt = out->dtype;
    const double fmax = al_fp8_fmax(fmt);
    uint8_t *o = (uint8_t *)al_tensor_data_ptr(out);
    float *si = (float *)al_tensor_data_ptr(sinv);
    double *amax = calloc((size_t)(rows > 0 ? rows : 1), sizeof(double));
    if (!amax) return al_error(AL_ERR_OOM, "fp8_quantize_rows: out of memory for %lld row amaxes", (long long)rows);
    double *scale = amax;   /* reused in place: amax -> scale */
    al_iter it;
    const int64_t *strides[1] = {x->stride};
    al_iter_init(&it, x->ndim, x->size, 1, strides, &x->offset);
    for (int64_t i = 0; i < it.numel; i++, al_iter_next(&it)) {
        int64_t r = i / rowlen;
        amax[r] = amax_combine(amax[r], ld(x, it.off[0]));
    }
    for (int64_t r = 0; r < rows; r++) {
        scale[r] = al_fp8_current_scale(fmax, amax[r], pow2_margin);
        si[r] = (float)(1.0 / scale[r]);
    }
    al_iter_init(&it, x->ndim, x->size, 1, strides, &x->offset);
    for (int64_t i = 0; i < it.numel; i++, al_iter_next(&it)) o[i] = al_fp8_encode(fmt, ld(x, it.off[0]) * scale[i / rowlen]);
    free(amax);
    return AL_OK;
}

AL_EXPORT al_status al_fp8_quantize_rows(al_tensor *out, al_tensor *scale_inv, const al_tensor *x, int32_t format,
                                         int32_t row_dims, double margin) {
    if (out) memset(out, 0, sizeof *out);
    if (scale_inv) memset(scale_inv, 0, sizeof *scale_inv);
    if (!out || !scale_inv) return al_error(AL_ERR_ARG, "fp8_quantize_rows: out and scale_inv must not be NULL");
    AL_TRY(al_check_tensor("fp8_quantize_rows", "x", x));
    AL_TRY(check_format("fp8_quantize_rows", format));
    if (!is_hp_float(x->dtype))
        return al_error(AL_ERR_ARG, "fp8_quantize_rows: x must be f32, f64, f16 or bf16, got %s", al_dtype_name(x->dtype));
    if (row_dims < 1 || row_dims > x->ndim)
        return al_error(AL_ERR_ARG, "fp8_quantize_rows: row_dims must be in 1..%d (x's dims), got %d", x->ndim, row_dims);
    if (!isfinite(margin)) return al_error(AL_ERR_ARG, "fp8_quantize_rows: margin must be finite, got %g", margin);
    int32_t lead = x->ndim - row_dims;
    int64_t rows = 1, rowlen = 1;
    for (int32_t d = 0; d < x->ndim; d++) {
        if (d < lead) rows *= x->size[d];
        else rowlen *= x->size[d];
    }
    al_status st = al_tensor_empty(out, x->ndim, x->size, format, x->device_type, x->device_index);
    if (st == AL_OK) st = al_tensor_empty(scale_inv, lead, x->size, AL_DTYPE_F32, x->device_type, x->device_index);
    double p2 = exp2(margin);
    if (st == AL_OK && rows > 0 && rowlen > 0) {
        if (x->device_type == AL_DEVICE_CUDA) {
            const al_cuda_api *api;
            st = cuda_api("fp8_quantize_rows", x, &api, 1);
            if (st == AL_OK) st = api->fp8_quantize_rows ? api->fp8_quantize_rows(out, scale_inv, x, row_dims, p2)
                                                        : al_error(AL_ERR_UNSUPPORTED, "fp8_quantize_rows: the loaded CUDA plugin has no FP8 kernels (rebuild it)");
        } else {
            st = cpu_quantize_rows(out, scale_inv, x, rows, rowlen, p2);
        }
    } else if (st == AL_OK && rows > 0) {
        st = al_tensor_fill_(scale_inv, 1.0);
    }
    if (st != AL_OK) { al_tensor_release(out); al_tensor_release(scale_inv); }
    return st;
}

/* ---- MXFP8 ------------------------------------------------------------------------------------- */
/* Walk the blocks: the iteration shape is x's with extent nb at dim; block position -> element offsets
 * base + j * x.stride[dim] (j < 32, within the extent); output element index = contiguous index. */
static al_status mx_shapes(const char *op, const al_tensor *x, int32_t dim, int64_t *ssize, int64_t *nb) {
    if (dim < 0 || dim >= x->ndim)
        return al_error(AL_ERR_ARG, "%s: dim must be in 0..%d, got %d", op, x->ndim - 1, dim);
    for (int32_t d = 0; d < x->ndim; d++) ssize[d] = x->size[d];
    *nb = (x->size[dim] + 31) / 32;
    ssize[dim] = *nb;
    return AL_OK;
}

static void cpu_mx(al_tensor *out, al_tensor *scales, const al_tensor *x, int32_t dim, int quant) {
    /* quant: out fp8 <- x (scales written); else out float <- x fp8 with scales read */
    const int64_t n = x->size[dim], sd = x->stride[dim];
    int64_t ssize[AL_MAX_DIMS], bstride[AL_MAX_DIMS], ostr[AL_MAX_DIMS], sstr[AL_MAX_DIMS];
    for (int32_t d = 0; d < x->ndim; d++) { ssize[d] = x->size[d]; bstride[d] = x->stride[d]; }
    ssize[dim] = (n + 31) / 32;
    bstride[dim] = 32 * sd;
    al_contiguous_strides(out->ndim, out->size, ostr);
    for (int32_t d = 0; d < scales->ndim; d++) sstr[d] = scales->stride[d];
    const int64_t ostride_dim = ostr[dim];
    ostr[dim] *= 32;
    const int64_t *strides[3] = {bstride, ostr, sstr};
    int64_t offs[3] = {x->offset, 0, scales->offset};
    al_iter it;
    al_iter_init(&it, x->ndim, ssize, 3, strides, offs);
    const int32_t fmt = quant ? out->dtype : x->dtype;
    const double fmax = al_fp8_fmax(fmt);
    uint8_t *sc = (uint8_t *)scales->data;
    for (int64_t bi = 0; bi < it.numel; bi++, al_iter_next(&it)) {
        const int64_t j0 = it.idx[dim] * 32;
        const int64_t len = n - j0 < 32 ? n - j0 : 32;
        if (quant) {
            double m = 0.0;
            for (int64_t j = 0; j < len; j++) m = amax_combine(m, ld(x, it.off[0] + j * sd));
            uint8_t code = al_e8m0_from_amax(m, fmax);
            sc[it.off[2]] = code;
            const double inv = al_e8m0_inverse(code);
            uint8_t *o = (uint8_t *)out->data;
            for (int64_t j = 0; j < len; j++)
                o[it.off[1] + j * ostride_dim] = al_fp8_encode(fmt, ld(x, it.off[0] + j * sd) * inv);
        } else {
            const double v = al_e8m0_value(sc[it.off[2]]);
            const uint8_t *q = (const uint8_t *)x->data;
            for (int64_t j = 0; j < len; j++)
                al_store_f64(out->data, out->dtype, it.off[1] + j * ostride_dim, al_fp8_decode(fmt, q[it.off[0] + j * sd]) * v);
        }
    }
}

AL_EXPORT al_status al_mxfp8_quantize(al_tensor *out, al_tensor *scales, const al_tensor *x, int32_t format, int32_t dim) {
    if (out) memset(out, 0, sizeof *out);
    if (scales) memset(scales, 0, sizeof *scales);
    if (!out || !scales) return al_error(AL_ERR_ARG, "mxfp8_quantize: out and scales must not be NULL");
    AL_TRY(al_check_tensor("mxfp8_quantize", "x", x));
    AL_TRY(check_format("mxfp8_quantize", format));
    if (!is_hp_float(x->dtype))
        return al_error(AL_ERR_ARG, "mxfp8_quantize: x must be f32, f64, f16 or bf16, got %s", al_dtype_name(x->dtype));
    int64_t ssize[AL_MAX_DIMS], nb;
    AL_TRY(mx_shapes("mxfp8_quantize", x, dim, ssize, &nb));
    al_status st = al_tensor_empty(out, x->ndim, x->size, format, x->device_type, x->device_index);
    if (st == AL_OK) st = al_tensor_empty(scales, x->ndim, ssize, AL_DTYPE_U8, x->device_type, x->device_index);
    if (st == AL_OK && al_tensor_numel(x) > 0) {
        if (x->device_type == AL_DEVICE_CUDA) {
            const al_cuda_api *api;
            st = cuda_api("mxfp8_quantize", x, &api, 1);
            if (st == AL_OK) st = api->mxfp8_quantize ? api->mxfp8_quantize(out, scales, x, dim)
                                                     : al_error(AL_ERR_UNSUPPORTED, "mxfp8_quantize: the loaded CUDA plugin has no FP8 kernels (rebuild it)");
        } else {
            cpu_mx(out, scales, x, dim, 1);
        }
    }
    if (st != AL_OK) { al_tensor_release(out); al_tensor_release(scales); }
    return st;
}

AL_EXPORT al_status al_mxfp8_dequantize(al_tensor *out, const al_tensor *q, const al_tensor *scales, int32_t dim,
                                        int32_t dtype) {
    if (out) memset(out, 0, sizeof *out);
    if (!out) return al_error(AL_ERR_ARG, "mxfp8_dequantize: out must not be NULL");
    AL_TRY(al_check_tensor("mxfp8_dequantize", "q", q));
    AL_TRY(al_check_tensor("mxfp8_dequantize", "scales", scales));
    char b1[96], b2[96];
    if (!is_fp8(q->dtype))
        return al_error(AL_ERR_ARG, "mxfp8_dequantize: q must be fp8_e4m3 or fp8_e5m2, got %s", al_dtype_name(q->dtype));
    if (!is_hp_float(dtype))
        return al_error(AL_ERR_ARG, "mxfp8_dequantize: dtype must be f32, f64, f16 or bf16, got %s",
                        al_dtype_name(dtype) ? al_dtype_name(dtype) : "an unknown code");
    int64_t ssize[AL_MAX_DIMS], nb;
    AL_TRY(mx_shapes("mxfp8_dequantize", q, dim, ssize, &nb));
    int ok = scales->dtype == AL_DTYPE_U8 && scales->ndim == q->ndim && scales->device_type == q->device_type &&
             scales->device_index == q->device_index;
    for (int32_t d = 0; ok && d < q->ndim; d++) ok = scales->size[d] == ssize[d];
    if (!ok)
        return al_error(AL_ERR_ARG, "mxfp8_dequantize: scales must be u8 %s on q's device (32-blocks along dim %d of q %s), got %s",
                        al_shape_str(q->ndim, ssize, b1, sizeof b1), dim, al_tensor_describe(q, b2, sizeof b2),
                        al_tensor_describe(scales, b1, sizeof b1));
    AL_TRY(al_tensor_empty(out, q->ndim, q->size, dtype, q->device_type, q->device_index));
    al_status st = AL_OK;
    if (al_tensor_numel(q) > 0) {
        if (q->device_type == AL_DEVICE_CUDA) {
            const al_cuda_api *api;
            st = cuda_api("mxfp8_dequantize", q, &api, 1);
            if (st == AL_OK) st = api->mxfp8_dequantize ? api->mxfp8_dequantize(out, q, scales, dim)
                                                       : al_error(AL_ERR_UNSUPPORTED, "mxfp8_dequantize: the loaded CUDA plugin has no FP8 kernels (rebuild it)");
        } else {
            cpu_mx(out, (al_tensor *)scales, q, dim, 0);
        }
    }
    if (st != AL_OK) al_tensor_release(out);
    return st;
}
