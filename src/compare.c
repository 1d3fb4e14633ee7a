/*
 * compare.c — comparison helpers for tests and experiments: al_max_abs_diff, al_rmse, al_allclose.
 *
 * The two tensors may have any dtypes and live on any devices; they are broadcast to one shape.
 *   - both on the CPU: compared in place through double, any strides.
 *   - both on one CUDA device with the same dtype: the plugin's diff_stats, no copy to the host.
 *   - otherwise (different devices or dtypes on CUDA): each is copied/converted to a host f64
 *     tensor with al_tensor_to and compared there.
 * NaN rules: two NaNs are equal (difference 0); equal infinities are equal; a NaN against a number
 * makes max_abs_diff and rmse NaN and fails allclose; an infinity against anything else fails
 * allclose whatever the tolerances. An empty comparison is a match (0, 0, true).
 */
#include "internal.h"
#include "cuda_plugin.h"

#include <math.h>

typedef struct {
    double max_abs, sum_sq;
    int64_t violations, count;
} diff_stats;

/* Difference of one pair under the NaN rules: 0 when both NaN or equal, NaN when one is NaN. */
static inline double pair_diff(double x, double y) {
    if (x == y) return 0.0;
    if (x != x && y != y) return 0.0;
    return fabs(x - y);
}

static void host_stats(const al_tensor *a, const al_tensor *b, double atol, double rtol, diff_stats *s) {
    al_iter it;
    al_iter_init(&it, a->ndim, a->size, 2, (const int64_t *[]){a->stride, b->stride},
                 (int64_t[]){a->offset, b->offset});
    int64_t n = al_tensor_numel(a);
    for (int64_t i = 0; i < n; i++, al_iter_next(&it)) {
        double x = al_load_f64(a->data, a->dtype, it.off[0]);
        double y = al_load_f64(b->data, b->dtype, it.off[1]);
        double d = pair_diff(x, y);
        if (d != d || s->max_abs != s->max_abs) s->max_abs = NAN;   /* NaN sticks */
        else if (d > s->max_abs) s->max_abs = d;
        s->sum_sq += d * d;
        /* d is NaN when one side is NaN, inf when one side is infinite: both violate */
        if (!(d == 0.0 || (isfinite(d) && d <= atol + rtol * fabs(y)))) s->violations++;
    }
    s->count = n;
}

static al_status compare(const char *op, const al_tensor *a, const al_tensor *b, double atol, double rtol,
                         diff_stats *s) {
    s->max_abs = 0.0;
    s->sum_sq = 0.0;
    s->violations = 0;
    s->count = 0;
    AL_TRY(al_check_tensor(op, "a", a));
    AL_TRY(al_check_tensor(op, "b", b));
    int32_t nd;
    int64_t shape[AL_MAX_DIMS];
    AL_TRY(al_broadcast_shapes(op, a->ndim, a->size, b->ndim, b->size, &nd, shape));
    int64_t n = 1;
    for (int32_t d = 0; d < nd; d++) n *= shape[d];
    if (n == 0) return AL_OK;

    al_tensor ha = {0}, hb = {0}, ea = {0}, eb = {0};
    al_status st = AL_OK;
    int same_cuda = a->device_type == AL_DEVICE_CUDA && b->device_type == AL_DEVICE_CUDA &&
                    a->device_index == b->device_index && a->dtype == b->dtype;
    const al_cuda_api *api = NULL;
    if (same_cuda) {
        api = al_cuda_api_get();
        if (!api) return al_error_prefix(AL_ERR_DEVICE, op);
        if (!api->diff_stats) same_cuda = 0;
    }
    const al_tensor *pa = a, *pb = b;
    if (!same_cuda && (a->device_type != AL_DEVICE_CPU || b->device_type != AL_DEVICE_CPU)) {
        /* bring both to the host as f64 */
        if ((st = al_tensor_to(&ha, a, AL_DTYPE_F64, AL_DEVICE_CPU, 0)) != AL_OK) goto done;
        if ((st = al_tensor_to(&hb, b, AL_DTYPE_F64, AL_DEVICE_CPU, 0)) != AL_OK) goto done;
        pa = &ha;
        pb = &hb;
    }
    if ((st = al_tensor_expand(&ea, pa, nd, shape)) != AL_OK) goto done;
    if ((st = al_tensor_expand(&eb, pb, nd, shape)) != AL_OK) goto done;
    if (same_cuda) {
        st = api->diff_stats(&ea, &eb, atol, rtol, &s->max_abs, &s->sum_sq, &s->violations);
        s->count = n;
    } else {
        host_stats(&ea, &eb, atol, rtol, s);
    }
done:
    if (st != AL_OK) al_error_prefix(st, op);   /* a failed copy or expand: say which op asked */
    al_tensor_release(&ea);
    al_tensor_release(&eb);
    al_tensor_release(&ha);
    al_tensor_release(&hb);
    return st;
}

al_status al_max_abs_diff(const al_tensor *a, const al_tensor *b, double *result) {
    if (!result) return al_error(AL_ERR_ARG, "max_abs_diff: result must not be NULL");
    *result = 0.0;
    diff_stats s;
    AL_TRY(compare("max_abs_diff", a, b, 0.0, 0.0, &s));
    *result = al_canonical_nan(s.max_abs);
    return AL_OK;
}

al_status al_rmse(const al_tensor *a, const al_tensor *b, double *result) {
    if (!result) return al_error(AL_ERR_ARG, "rmse: result must not be NULL");
    *result = 0.0;
    diff_stats s;
    AL_TRY(compare("rmse", a, b, 0.0, 0.0, &s));
    *result = al_canonical_nan(s.count ? sqrt(s.sum_sq / (double)s.count) : 0.0);
    return AL_OK;
}

al_status al_allclose(const al_tensor *a, const al_tensor *b, double atol, double rtol, int32_t *result) {
    if (!result) return al_error(AL_ERR_ARG, "allclose: result must not be NULL");
    *result = 0;
    if (!(atol >= 0.0) || !(rtol >= 0.0))
        return al_error(AL_ERR_ARG, "allclose: atol and rtol must be >= 0, got atol=%g rtol=%g", atol, rtol);
    diff_stats s;
    AL_TRY(compare("allclose", a, b, atol, rtol, &s));
    *result = s.violations == 0;
    return AL_OK;
}
