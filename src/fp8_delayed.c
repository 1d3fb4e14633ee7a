/*
 * fp8_delayed.c — delayed scaling kept on the device (al_fp8_ds, include/attnlab.h): per slot an amax history,
 * the scale the next call uses, an accumulator for the amaxes a call reports and the scale used last, in one
 * f64 tensor on the data's device (layout and arithmetic: numeric/fp8_delayed.h).
 *
 * Why: under delayed scaling a step's scales follow from the amaxes of the steps before it. Kept on the host
 * (lua/attnlab/fp8.lua's recipes), every step must first wait for the previous step's amaxes to come back from
 * the GPU, which leaves the GPU idle while the host prepares the step (session 8: the recipe's FP8 forward at
 * 0.70-0.93x bf16 at 4x16x4096). Kept on the device, the quantise kernels and cuDNN's graph read the scales
 * there, add their amaxes to the accumulators, and al_fp8_ds_update folds them into the histories, all queued on
 * the stream: the host never waits (TransformerEngine's amax/scale update works the same way).
 *
 * CPU: the state is host memory and every step runs at once, with the same arithmetic, so the CPU is the oracle
 * of the GPU path and the Lua plumbing is tested without a GPU.
 * Also here: the host-side resolution attention.c uses for backends that read their scales on the host.
 */
#include "internal.h"
#include "attention_internal.h"
#include "cuda_plugin.h"
#include "numeric/fp8_delayed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DS_MAX_HISTORY (1 << 20)

static int is_fp8(int32_t d) { return d == AL_DTYPE_FP8_E4M3 || d == AL_DTYPE_FP8_E5M2; }

static al_status ds_api(const char *op, int32_t dev, const al_cuda_api **api) {
    AL_TRY(al_cuda_check_device(op, dev));
    *api = al_cuda_api_get();
    if (!*api) return al_error_prefix(AL_ERR_DEVICE, op);
    if (!(*api)->fp8_quantize_dev || !(*api)->fp8_ds_update)
        return al_error(AL_ERR_UNSUPPORTED, "%s: the loaded CUDA plugin has no delayed-scaling kernels (rebuild it)", op);
    return AL_OK;
}

static al_status check_ds(const char *op, const al_fp8_ds *ds) {
    if (!ds) return al_error(AL_ERR_ARG, "%s: ds must not be NULL", op);
    if (!ds->state.storage || ds->history_len < 1 || ds->state.dtype != AL_DTYPE_F64 ||
        al_tensor_numel(&ds->state) != AL_FP8_DS_WORDS(ds->history_len))
        return al_error(AL_ERR_ARG, "%s: ds is not initialised (al_fp8_ds_init) or was released", op);
    return AL_OK;
}

/* n doubles at element off of t (contiguous f64) to / from host memory; a GPU copy waits for the stream */
static al_status f64_get(const al_tensor *t, int64_t off, int64_t n, double *host) {
    const double *p = (const double *)al_tensor_data_ptr(t) + off;
    if (t->device_type == AL_DEVICE_CPU) {
        memcpy(host, p, (size_t)n * sizeof(double));
        return AL_OK;
    }
    const al_cuda_api *api;
    AL_TRY(ds_api("fp8 delayed scaling", t->device_index, &api));
    return api->memcpy_d2h(t->device_index, host, p, n * (int64_t)sizeof(double));
}
static al_status f64_put(const al_tensor *t, int64_t off, int64_t n, const double *host) {
    double *p = (double *)al_tensor_data_ptr(t) + off;
    if (t->device_type == AL_DEVICE_CPU) {
        memcpy(p, host, (size_t)n * sizeof(double));
        return AL_OK;
    }
    const al_cuda_api *api;
    AL_TRY(ds_api("fp8 delayed scaling", t->device_index, &api));
    return api->memcpy_h2d(t->device_index, p, host, n * (int64_t)sizeof(double));
}

AL_EXPORT al_status al_fp8_ds_init(al_fp8_ds *ds, int32_t device_type, int32_t device_index, int32_t history_len,
                                   int32_t algo, double pow2_margin, const double fmax[6], const double *history,
                                   const int64_t count[6], const double scale[6]) {
    const char *op = "fp8_ds_init";
    if (!ds) return al_error(AL_ERR_ARG, "%s: ds must not be NULL", op);
    memset(ds, 0, sizeof *ds);
    if (history_len < 1 || history_len > DS_MAX_HISTORY)
        return al_error(AL_ERR_ARG, "%s: history_len must be 1..%d, got %d", op, DS_MAX_HISTORY, history_len);
    if (algo != AL_FP8_ALGO_MAX && algo != AL_FP8_ALGO_MOST_RECENT)
        return al_error(AL_ERR_ARG, "%s: algo must be AL_FP8_ALGO_MAX (0) or AL_FP8_ALGO_MOST_RECENT (1), got %d", op, algo);
    if (!(pow2_margin > 0.0) || !isfinite(pow2_margin))
        return al_error(AL_ERR_ARG, "%s: pow2_margin (2^margin) must be finite and > 0, got %g", op, pow2_margin);
    if (!fmax || !count || !scale) return al_error(AL_ERR_ARG, "%s: fmax, count and scale must not be NULL", op);
    for (int s = 0; s < 6; s++) {
        if (!(fmax[s] > 0.0) || !isfinite(fmax[s]))
            return al_error(AL_ERR_ARG, "%s: fmax[%d] must be finite and > 0, got %g", op, s, fmax[s]);
        if (count[s] < 0) return al_error(AL_ERR_ARG, "%s: count[%d] must be >= 0, got %lld", op, s, (long long)count[s]);
        if (count[s] > 0 && !history)
            return al_error(AL_ERR_ARG, "%s: history must not be NULL when count[%d] = %lld > 0", op, s, (long long)count[s]);
        if (!(scale[s] > 0.0) || !isfinite(scale[s]))
            return al_error(AL_ERR_ARG, "%s: scale[%d] must be finite and > 0, got %g", op, s, scale[s]);
    }
    if (device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api;
        AL_TRY(ds_api(op, device_index, &api));
    } else if (device_type != AL_DEVICE_CPU) {
        return al_error(AL_ERR_ARG, "%s: device_type must be cpu or cuda, got %d", op, device_type);
    }
    const int64_t H = history_len, words = AL_FP8_DS_WORDS(H);
    double *img = calloc((size_t)words, sizeof(double));
    if (!img) return al_error(AL_ERR_OOM, "%s: out of host memory for a history of %d", op, history_len);
    for (int s = 0; s < 6; s++) {
        const int64_t n = count[s] < H ? count[s] : H;
        for (int64_t j = 0; j < n; j++) img[s * H + (count[s] - n + j) % H] = history[s * H + j];
        img[AL_FP8_DS_SCALE(H) + s] = scale[s];
        img[AL_FP8_DS_USED(H) + s] = scale[s];
    }
    al_status st = al_tensor_empty(&ds->state, 1, &words, AL_DTYPE_F64, device_type, device_index);
    if (st == AL_OK) st = f64_put(&ds->state, 0, words, img);
    free(img);
    if (st != AL_OK) {
        al_tensor_release(&ds->state);
        return st;
    }
    ds->history_len = history_len;
    ds->algo = algo;
    ds->pow2_margin = pow2_margin;
    for (int s = 0; s < 6; s++) {
        ds->fmax[s] = fmax[s];
        ds->count[s] = count[s];
    }
    return AL_OK;
}

AL_EXPORT void al_fp8_ds_release(al_fp8_ds *ds) {
    if (!ds) return;
    al_tensor_release(&ds->state);
    memset(ds, 0, sizeof *ds);
}

AL_EXPORT al_status al_fp8_ds_update(al_fp8_ds *ds, uint32_t slot_mask) {
    const char *op = "fp8_ds_update";
    AL_TRY(check_ds(op, ds));
    if (slot_mask & ~0x3Fu) return al_error(AL_ERR_ARG, "%s: slot_mask must use bits 0..5 (the six slots), got 0x%x", op, slot_mask);
    al_fp8_ds_step p;
    memset(&p, 0, sizeof p);
    p.history_len = ds->history_len;
    p.algo = ds->algo;
    p.mask = slot_mask;
    p.pow2_margin = ds->pow2_margin;
    for (int s = 0; s < 6; s++) {
        p.fmax[s] = ds->fmax[s];
        p.count[s] = ds->count[s];
    }
    double *st = (double *)al_tensor_data_ptr(&ds->state);
    if (ds->state.device_type == AL_DEVICE_CUDA) {
        const al_cuda_api *api;
        AL_TRY(ds_api(op, ds->state.device_index, &api));
        AL_TRY(api->fp8_ds_update(ds->state.device_index, st, &p));
    } else {
        for (int s = 0; s < 6; s++)
            if (slot_mask & (1u << s)) al_fp8_ds_update_slot(st, &p, s);
    }
    for (int s = 0; s < 6; s++)
        if (slot_mask & (1u << s)) ds->count[s]++;
    return AL_OK;
}

AL_EXPORT al_status al_fp8_ds_quantize(al_tensor *out, const al_tensor *x, int32_t format, al_fp8_ds *ds, int32_t slot) {
    const char *op = "fp8_ds_quantize";
    if (out) memset(out, 0, sizeof *out);
    if (!out) return al_error(AL_ERR_ARG, "%s: out must not be NULL", op);
    AL_TRY(al_check_tensor(op, "x", x));
    AL_TRY(check_ds(op, ds));
    if (!is_fp8(format)) return al_error(AL_ERR_ARG, "%s: format must be fp8_e4m3 or fp8_e5m2, got %s", op, al_dtype_name(format));
    if (!al_dtype_is_float(x->dtype) || is_fp8(x->dtype))
        return al_error(AL_ERR_ARG, "%s: x must be f32, f64, f16 or bf16, got %s", op, al_dtype_name(x->dtype));
    if (slot < 0 || slot >= 6) return al_error(AL_ERR_ARG, "%s: slot must be 0..5 (al_fp8_slot), got %d", op, slot);
    if (x->device_type != ds->state.device_type ||
        (x->device_type == AL_DEVICE_CUDA && x->device_index != ds->state.device_index))
        return al_error(AL_ERR_ARG, "%s: x must be on ds's device (%s:%d), got %s:%d", op,
                        ds->state.device_type == AL_DEVICE_CUDA ? "cuda" : "cpu", ds->state.device_index,
                        x->device_type == AL_DEVICE_CUDA ? "cuda" : "cpu", x->device_index);
    const int64_t H = ds->history_len;
    double *st = (double *)al_tensor_data_ptr(&ds->state);
    if (x->device_type == AL_DEVICE_CPU) {   /* the two calls: al_fp8_quantize's codes, al_amax's value */
        double m;
        AL_TRY(al_amax(x, &m));
        AL_TRY(al_fp8_quantize(out, x, format, st[AL_FP8_DS_SCALE(H) + slot]));
        st[AL_FP8_DS_ACC(H) + slot] = al_fp8_ds_max(st[AL_FP8_DS_ACC(H) + slot], m);
        return AL_OK;
    }
    const al_cuda_api *api;
    AL_TRY(ds_api(op, x->device_index, &api));
    AL_TRY(al_tensor_empty(out, x->ndim, x->size, format, AL_DEVICE_CUDA, x->device_index));
    if (al_tensor_numel(x) == 0) return AL_OK;
    al_status s = api->fp8_quantize_dev(out, x, st + AL_FP8_DS_SCALE(H) + slot, st + AL_FP8_DS_ACC(H) + slot);
    if (s != AL_OK) al_tensor_release(out);
    return s;
}

AL_EXPORT al_status al_fp8_ds_read(const al_fp8_ds *ds, double *history, double *scale, double *last_used) {
    AL_TRY(check_ds("fp8_ds_read", ds));
    const int64_t H = ds->history_len, words = AL_FP8_DS_WORDS(H);
    double *img = malloc((size_t)words * sizeof(double));
    if (!img) return al_error(AL_ERR_OOM, "fp8_ds_read: out of host memory");
    al_status st = f64_get(&ds->state, 0, words, img);
    if (st == AL_OK) {
        for (int s = 0; s < 6; s++) {
            const int64_t c = ds->count[s], n = c < H ? c : H;
            if (history) {
                for (int64_t j = 0; j < H; j++) history[s * H + j] = j < n ? img[s * H + (c - n + j) % H] : 0.0;
            }
            if (scale) scale[s] = img[AL_FP8_DS_SCALE(H) + s];
            if (last_used) last_used[s] = img[AL_FP8_DS_USED(H) + s];
        }
    }
    free(img);
    return st;
}

/* ---- attention on a backend that reads its scales on the host ---------------------------------------------
 * Every backend but the fused GPU one takes its FP8 scales from al_attn_fp8's host fields. With fp8.ds set the
 * front door (attention.c) fills a copy of the settings from ds and ds_used here, runs the backend on it, and
 * hands the amaxes it reports back to ds's accumulators and the scales it used to ds_used: on a GPU that reads
 * and writes a few doubles (a wait for the stream: only the fused backend keeps the whole step on the device). */
static al_status check_used(const al_attn_fp8 *f) {
    const al_tensor *u = f->ds_used;
    const al_tensor *st = &f->ds->state;
    if (!u || !u->storage || u->dtype != AL_DTYPE_F64 || al_tensor_numel(u) != 6 || !al_tensor_is_contiguous(u) ||
        u->device_type != st->device_type || (u->device_type == AL_DEVICE_CUDA && u->device_index != st->device_index))
        return al_error(AL_ERR_ARG, "attention: fp8.ds_used must be a contiguous f64 [6] tensor on fp8.ds's device when fp8.ds is set");
    return AL_OK;
}

al_status al_fp8_ds_check_attn(const al_attn_fp8 *f, const al_tensor *q) {
    AL_TRY(check_ds("attention: fp8.ds", f->ds));
    AL_TRY(check_used(f));
    const al_tensor *st = &f->ds->state;
    if (q->device_type != st->device_type || (q->device_type == AL_DEVICE_CUDA && q->device_index != st->device_index))
        return al_error(AL_ERR_ARG, "attention: fp8.ds must be on the inputs' device");
    return AL_OK;
}

al_status al_fp8_ds_resolve(const al_attn_fp8 *f, int backward, al_attn_fp8 *h) {
    *h = *f;
    h->ds = NULL;
    h->ds_used = NULL;
    h->pending = NULL;
    h->amax_deferred = 0;
    double sc[6], used[6];
    const int64_t H = f->ds->history_len;
    AL_TRY(f64_get(&f->ds->state, AL_FP8_DS_SCALE(H), 6, sc));
    if (!backward) {
        for (int i = 0; i < 6; i++) used[i] = sc[i];
    } else {
        AL_TRY(f64_get(f->ds_used, 0, 6, used));   /* the forward's QKV, S, O */
        for (int i = 3; i < 6; i++) used[i] = sc[i];
    }
    h->qkv_scale_inv = 1.0 / used[AL_FP8_SLOT_QKV];
    for (int i = 0; i < 6; i++) h->scale[i] = used[i];
    h->scale_used[AL_FP8_SLOT_O] = used[AL_FP8_SLOT_O];
    return AL_OK;
}

al_status al_fp8_ds_commit(const al_attn_fp8 *f, int backward, const al_attn_fp8 *h) {
    const int lo = backward ? 3 : 0;
    double used[3], acc[6];
    const int64_t H = f->ds->history_len;
    for (int i = 0; i < 3; i++) used[i] = i + lo == AL_FP8_SLOT_QKV ? h->scale[AL_FP8_SLOT_QKV] : h->scale_used[i + lo];
    AL_TRY(f64_put(f->ds_used, lo, 3, used));
    AL_TRY(f64_get(&f->ds->state, AL_FP8_DS_ACC(H), 6, acc));
    for (int i = backward ? 3 : 1; i < lo + 3; i++) acc[i] = al_fp8_ds_max(acc[i], h->amax[i]);
    return f64_put(&f->ds->state, AL_FP8_DS_ACC(H), 6, acc);
}
