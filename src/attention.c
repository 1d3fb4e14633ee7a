/*
 * attention.c — the DotProductAttention front door: parameter defaults, ALiBi / dropout / FP8 helpers, the
 * backend registry with its selection and explanation, and the entry points (check, explain, forward,
 * backward). Validating params against tensors and resolving them into an al_attn_plan (every inconsistency
 * an error before any work) is attention_plan.c's job.
 *
 * Backend selection order (ARCHITECTURE.md): fused, flash, unfused, cpu. GPU backends are registered
 * by the CUDA plugin (al_attn_register_backend); the cpu backend is built in and serves only CPU
 * tensors, so a call with cuda tensors that no GPU backend supports is an error, never a silent CPU
 * run. A backend is forced with params.backend ("cpu", ...) or, when that is empty, the environment
 * variable ATTNLAB_BACKEND; a forced backend that cannot serve the call is an error carrying its
 * reason.
 */
#include "attention_internal.h"
#include "numeric/philox.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- params ----------------------------------------------------------------------------------- */
AL_EXPORT void al_attn_params_init(al_attn_params *p) {
    memset(p, 0, sizeof *p);
    p->qkv_format = AL_ATTN_FORMAT_SBHD;
    p->mask_type = AL_ATTN_MASK_CAUSAL;
    p->window_left = -1;
    p->window_right = -1;
    p->bottom_right_diagonal = -1;
    p->bias_type = AL_ATTN_BIAS_NO_BIAS;
    p->softmax_type = AL_ATTN_SOFTMAX_VANILLA;
    p->compute_dtype = AL_DTYPE_F32;
}

/* ---- ALiBi and dropout helpers ---------------------------------------------------------------- */
/* TE's get_alibi_slopes: the geometric series 2^(-8/n)^k for the closest power of two n, then the
 * interleaved extra set 2^(-4/n)^(1,3,5,...) for the remaining heads. */
AL_EXPORT void al_attn_default_alibi_slopes(int64_t h, float *slopes) {
    if (h <= 0) return;
    int64_t n = 1;
    while (n * 2 <= h) n *= 2;
    double m0 = pow(2.0, -8.0 / (double)n);
    for (int64_t k = 0; k < n; k++) slopes[k] = (float)pow(m0, (double)(k + 1));
    if (n < h) {
        double mh = pow(2.0, -4.0 / (double)n);
        for (int64_t k = 0; k < h - n; k++) slopes[n + k] = (float)pow(mh, (double)(2 * k + 1));
    }
}

/* Dropout uses the shared Philox stream (numeric/philox.h): element idx is kept iff
 * al_philox_uniform_f32(seed, offset, idx) < 1 - p. */
AL_EXPORT float al_attn_dropout_uniform(uint64_t seed, uint64_t offset, uint64_t idx) {
    return al_philox_uniform_f32(seed, offset, idx);
}

/* ---- FP8 settings --------------------------------------------------------------------------------- */
AL_EXPORT void al_attn_fp8_init(al_attn_fp8 *f) {
    if (!f) return;
    memset(f, 0, sizeof *f);
    f->fwd_format = AL_DTYPE_FP8_E4M3;
    f->bwd_format = AL_DTYPE_FP8_E4M3;
    f->out_dtype = AL_DTYPE_F32;
    f->qkv_scale_inv = 1.0;
    for (int i = 0; i < 6; i++) f->scale[i] = 1.0;
}

/* A new call on the same FP8 settings supersedes amaxes still pending from the last call of its direction
 * (the same slots: as a synchronous call overwrites them; the backend's record is released once its copy
 * has landed); those of the other direction are still wanted, so they are settled first. */
static void fp8_take_pending(al_attn_fp8 *f, int backward) {
    if (!f || !f->pending) return;
    al_fp8_pending *p = (al_fp8_pending *)f->pending;
    if (p->owner != f) {   /* a copy of the owner's struct: not ours to settle or release */
        f->pending = NULL;
        return;
    }
    if (p->backward != backward) {
        p->settle(p, f);
        return;
    }
    f->pending = NULL;
    p->drop(p);
}

AL_EXPORT void al_attn_fp8_settle(al_attn_fp8 *f) {
    if (!f || !f->pending) return;
    al_fp8_pending *p = (al_fp8_pending *)f->pending;
    if (p->owner != f) {   /* a copy of the owner's struct (see al_fp8_pending): its amaxes stay NaN */
        f->pending = NULL;
        return;
    }
    p->settle(p, f);   /* clears f->pending */
}

/* ---- backend registry ------------------------------------------------------------------------- */
static int32_t cpu_supports(const al_attn_plan *pl, char *reason, size_t n) {
    if (pl->in.q->device_type != AL_DEVICE_CPU) {
        snprintf(reason, n, "tensors are on cuda:%d; the cpu backend serves CPU tensors only", pl->in.q->device_index);
        return 0;
    }
    return 1;
}
static const al_attn_backend cpu_backend = {"cpu", cpu_supports, al_cpu_attn_forward, al_cpu_attn_backward, 1, 0};

enum { SLOT_FUSED, SLOT_FLASH, SLOT_UNFUSED, SLOT_CPU, NSLOTS };
static const char *slot_names[NSLOTS] = {"fused", "flash", "unfused", "cpu"};
static const al_attn_backend *registry[NSLOTS] = {NULL, NULL, NULL, &cpu_backend};

AL_EXPORT al_status al_attn_register_backend(const al_attn_backend *be) {
    if (!be || !be->name) return al_error(AL_ERR_ARG, "al_attn_register_backend: backend must have a name");
    for (int i = 0; i < SLOT_CPU; i++)
        if (strcmp(slot_names[i], be->name) == 0) { registry[i] = be; return AL_OK; }
    return al_error(AL_ERR_ARG, "al_attn_register_backend: name must be fused, flash or unfused, got '%s'", be->name);
}

AL_EXPORT const char *al_attn_backend_name(int32_t i) {
    return (i >= 0 && i < NSLOTS) ? slot_names[i] : NULL;
}

/* The forced backend name ("" = none). */
static const char *forced_name(const al_attn_params *p) {
    if (p->backend[0]) return p->backend;
    const char *e = getenv("ATTNLAB_BACKEND");
    return (e && *e && strcmp(e, "auto") != 0) ? e : "";
}

/* Pick a backend; explain (when buf) writes every verdict. */
static al_status choose(const al_attn_plan *pl, const al_attn_backend **out, char *buf, size_t n) {
    char reason[256];
    size_t used = 0;
    /* GPU backends register when the CUDA plugin loads: make sure it has, for cuda tensors */
    if (pl->in.q->device_type == AL_DEVICE_CUDA && !al_cuda_api_get()) al_clear_error();
#define EMIT(...) do { if (buf && used < n) { int w_ = snprintf(buf + used, n - used, __VA_ARGS__); if (w_ > 0) used += (size_t)w_; } } while (0)
    char pname[17];
    /* at most 16 bytes of params.backend (it need not be NUL-terminated), but never past the end of a
     * shorter string: "" and getenv() strings are shorter than 16 bytes (ASan: global-buffer-overflow) */
    {
        const char *fn = forced_name(&pl->p);
        size_t k = 0;
        while (k < sizeof pname - 1 && fn[k]) { pname[k] = fn[k]; k++; }
        pname[k] = 0;
    }
    int forced = -1;
    if (pname[0]) {
        for (int i = 0; i < NSLOTS; i++) if (strcmp(slot_names[i], pname) == 0) forced = i;
        if (forced < 0)
            return al_error(AL_ERR_ARG, "attention: backend '%s' (from %s) is not one of fused, flash, unfused, cpu", pname,
                            pl->p.backend[0] ? "backend=" : "ATTNLAB_BACKEND");
        EMIT("backend forced to %s (%s)\n", pname, pl->p.backend[0] ? "backend= argument" : "ATTNLAB_BACKEND");
    }
    *out = NULL;
    /* CPU tensors, nothing to explain, nothing forced: only the cpu backend serves CPU tensors (the GPU
     * backends decline them first thing), so ask it alone; a decline falls through to the full loop,
     * which builds the error (bench/host_overhead.lua: skips three supports() and their reason text) */
    if (!buf && forced < 0 && pl->in.q->device_type == AL_DEVICE_CPU && !pl->in.variant && registry[SLOT_CPU] &&
        !(pl->in.fp8 && !registry[SLOT_CPU]->fp8)) {
        reason[0] = 0;
        if (registry[SLOT_CPU]->supports(pl, reason, sizeof reason)) {
            *out = registry[SLOT_CPU];
            return AL_OK;
        }
    }
    const char *forced_reason = NULL;
    char forced_buf[256] = "", flash_reason[256] = "";
    for (int i = 0; i < NSLOTS; i++) {
        /* without an explanation to write, stop at the first backend that serves and ask only a forced
         * backend: no other supports() runs, no reason text is formatted (bench/host_overhead.lua) */
        if (!buf && (*out || (forced >= 0 && i != forced))) continue;
        const al_attn_backend *be = registry[i];
        int ok = 0;
        reason[0] = 0;
        if (pl->in.variant && i != SLOT_FLASH) {
            /* variants are CUDA C snippets for the flash kernels' hooks; nobody else has hooks */
            if (i == SLOT_CPU)
                snprintf(reason, sizeof reason, "variants (score_mod/mask_mod) run on the flash backend; on the "
                         "CPU the Lua front end evaluates them (its oracle), not the C cpu backend");
            else
                snprintf(reason, sizeof reason, "variants (score_mod/mask_mod) run on the flash backend only (the "
                         "%s backend has no hook points)", slot_names[i]);
        } else if (!be) snprintf(reason, sizeof reason, "not available: the CUDA plugin did not register it");
        else {
            if (pl->in.fp8 && !be->fp8) {
                /* FP8 plans go only to backends that judge them (the cpu backend emulates FP8 exactly) */
                if (i == SLOT_FUSED) snprintf(reason, sizeof reason, "FP8 SDPA through cuDNN is not implemented yet");
                else snprintf(reason, sizeof reason, "no FP8 path in the %s backend (the unfused backend emulates FP8 attention "
                              "exactly on the GPU, the cpu backend on the CPU)", slot_names[i]);
                ok = 0;
            } else {
                ok = be->supports(pl, reason, sizeof reason) ? 1 : 0;
            }
        }
        if (forced >= 0 && i != forced) {
            EMIT("  %-8s %s%s\n", slot_names[i], ok ? "skipped: another backend is forced" : "no: ", ok ? "" : reason);
            continue;
        }
        /* a backend may leave "note: ..." in reason when it accepts (a caveat explain shows) */
        const char *note = ok && strncmp(reason, "note: ", 6) == 0 ? reason + 6 : NULL;
        if (ok && !*out) {
            *out = be;
            if (note) EMIT("  %-8s CHOSEN (%s)\n", slot_names[i], note);
            else EMIT("  %-8s CHOSEN\n", slot_names[i]);
        } else if (ok) {
            if (note) EMIT("  %-8s yes (lower preference; %s)\n", slot_names[i], note);
            else EMIT("  %-8s yes (lower preference)\n", slot_names[i]);
        } else {
            EMIT("  %-8s no: %s\n", slot_names[i], reason);
            if (i == forced) { snprintf(forced_buf, sizeof forced_buf, "%s", reason); forced_reason = forced_buf; }
        }
        if (i == SLOT_FLASH && !ok) snprintf(flash_reason, sizeof flash_reason, "%s", reason);
    }
#undef EMIT
    if (!*out) {
        if (forced >= 0)
            return al_error(AL_ERR_UNSUPPORTED, "attention: forced backend '%s' cannot serve this call: %s", pname,
                            forced_reason ? forced_reason : "unsupported");
        if (pl->in.variant)   /* only flash can serve it: its reason is the useful one */
            return al_error(AL_ERR_UNSUPPORTED, "attention: a variant (score_mod/mask_mod) runs on the flash backend "
                            "only, which cannot serve this call: %s", flash_reason[0] ? flash_reason : "not available");
        return al_error(AL_ERR_UNSUPPORTED, "attention: no attention backend is available for this call (%s tensors, "
                        "format %s, mask %s); al.attention.explain{...} lists each backend's reason",
                        pl->in.q->device_type == AL_DEVICE_CPU ? "cpu" : "cuda", al_attn_format_name(pl->p.qkv_format),
                        al_attn_mask_name(pl->p.mask_type));
    }
    return AL_OK;
}

AL_EXPORT al_status al_attn_check(const al_attn_params *p, const al_attn_inputs *in) {
    al_attn_plan pl;
    AL_TRY(al_attn_plan_build(&pl, p, in));
    al_attn_plan_free(&pl);
    return AL_OK;
}

AL_EXPORT const char *al_attn_explain(const al_attn_params *p, const al_attn_inputs *in, char *buf, int64_t n) {
    al_attn_plan pl;
    if (buf && n > 0) buf[0] = 0;
    if (al_attn_plan_build(&pl, p, in) != AL_OK) return NULL;
    size_t used = 0;
    if (buf && n > 0) {
        snprintf(buf, (size_t)n, "attention %s b=%lld h=%lld hg=%lld sq=%lld skv=%lld d_qk=%lld d_v=%lld mask=%s window=(%lld,%lld)%s\n",
                 al_attn_format_name(pl.p.qkv_format), (long long)pl.p.b, (long long)pl.p.h, (long long)pl.p.hg, (long long)pl.p.sq,
                 (long long)pl.p.skv, (long long)pl.p.d_qk, (long long)pl.p.d_v, al_attn_mask_name(pl.p.mask_type),
                 (long long)pl.p.window_left, (long long)pl.p.window_right, pl.bottom_right ? " bottom_right" : "");
        used = strlen(buf);
        const al_attn_fp8 *f = pl.in.fp8;
        if (f) {
            char sc[6][24];
            for (int i = 0; i < 6; i++) {
                if (i == AL_FP8_SLOT_QKV) snprintf(sc[i], sizeof sc[i], "%s", al_attn_is_fp8_dtype(pl.in.q->dtype)
                                                   ? (f->q_descale ? "per-token" : "given") : "upstream");
                else if (i == AL_FP8_SLOT_O && f->o_per_token) snprintf(sc[i], sizeof sc[i], "per-token");
                else if (f->scale[i] < 0) snprintf(sc[i], sizeof sc[i], "off");
                else if (f->scale[i] == 0) snprintf(sc[i], sizeof sc[i], "current");
                else snprintf(sc[i], sizeof sc[i], "%.6g", f->scale[i]);
            }
            snprintf(buf + used, (size_t)n - used,
                     "fp8: emulated (quantise -> dequantise at every slot, %s compute), q/k/v %s, forward %s, backward %s, "
                     "out %s; scales QKV=%s S=%s O=%s dO=%s dP=%s dQKV=%s; the cpu and unfused backends emulate, the fused backend runs cuDNN's FP8 SDPA\n",
                     pl.p.compute_dtype == AL_DTYPE_F64 ? "f64" : "f32", al_dtype_name(pl.in.q->dtype),
                     al_dtype_name(f->fwd_format), al_dtype_name(f->bwd_format), al_dtype_name(f->out_dtype), sc[0], sc[1],
                     sc[2], sc[3], sc[4], sc[5]);
            used = strlen(buf);
        }
    }
    const al_attn_backend *be = NULL;
    al_status s = choose(&pl, &be, buf ? buf + used : NULL, buf ? (size_t)n - used : 0);
    al_attn_plan_free(&pl);
    if (s != AL_OK) {
        /* keep the per-backend lines and append the verdict */
        if (buf) { size_t u = strlen(buf); snprintf(buf + u, (size_t)n - u, "error: %s\n", al_last_error()); }
        return NULL;
    }
    return be->name;
}

AL_EXPORT al_status al_attn_forward(const al_attn_params *p, const al_attn_inputs *in, al_tensor *out,
                                    al_tensor *lse, al_tensor *max_logit) {
    if (out) memset(out, 0, sizeof *out);
    if (lse) memset(lse, 0, sizeof *lse);
    if (max_logit) memset(max_logit, 0, sizeof *max_logit);
    if (!out || !lse) return al_error(AL_ERR_ARG, "attention_forward: out and lse must not be NULL");
    if (in) fp8_take_pending(in->fp8, 0);
    al_attn_plan pl;
    AL_TRY(al_attn_plan_build(&pl, p, in));
    if (pl.p.return_max_logit && !max_logit) {
        al_attn_plan_free(&pl);
        return al_error(AL_ERR_ARG, "attention_forward: return_max_logit is set but max_logit is NULL");
    }
    const al_attn_backend *be;
    al_status s = choose(&pl, &be, NULL, 0);
    al_attn_fp8 *f8 = pl.in.fp8, host8;
    if (s == AL_OK && f8 && f8->ds && !be->fp8_ds) {   /* its scales through the host (al_fp8_ds_resolve) */
        s = al_fp8_ds_resolve(f8, 0, &host8);
        pl.in.fp8 = &host8;
        if (s == AL_OK) s = be->forward(&pl, out, lse, pl.p.return_max_logit ? max_logit : NULL);
        pl.in.fp8 = f8;
        if (s == AL_OK) s = al_fp8_ds_commit(f8, 0, &host8);
        if (s == AL_OK) {
            for (int i = 0; i < 6; i++) f8->amax[i] = host8.amax[i], f8->scale_used[i] = host8.scale_used[i];
        }
    } else if (s == AL_OK) {
        s = be->forward(&pl, out, lse, pl.p.return_max_logit ? max_logit : NULL);
    }
    al_attn_plan_free(&pl);
    if (s != AL_OK) { al_tensor_release(out); al_tensor_release(lse); if (max_logit) al_tensor_release(max_logit); }
    return s;
}

static al_status same_shape(const char *what, const al_tensor *t, const al_tensor *ref) {
    char b1[96], b2[96];
    AL_TRY(al_check_tensor("attention_backward", what, t));
    int ok = t->ndim == ref->ndim;
    for (int d = 0; ok && d < t->ndim; d++) ok = t->size[d] == ref->size[d];
    if (!ok) return al_error(AL_ERR_ARG, "attention_backward: %s must have shape of %s, got %s", what,
                             al_tensor_describe(ref, b1, sizeof b1), al_tensor_describe(t, b2, sizeof b2));
    if (t->device_type != ref->device_type)
        return al_error(AL_ERR_ARG, "attention_backward: %s is on another device than the inputs", what);
    return AL_OK;
}

AL_EXPORT al_status al_attn_backward(const al_attn_params *p, const al_attn_inputs *in, const al_tensor *out,
                                     const al_tensor *dout, const al_tensor *lse, al_tensor *dq, al_tensor *dk,
                                     al_tensor *dv, al_tensor *dbias, al_tensor *d_softmax_offset) {
    if (dbias) memset(dbias, 0, sizeof *dbias);
    if (d_softmax_offset) memset(d_softmax_offset, 0, sizeof *d_softmax_offset);
    if (!out || !dout || !lse || !dq || !dk || !dv)
        return al_error(AL_ERR_ARG, "attention_backward: out, dout, lse, dq, dk and dv must not be NULL");
    if (in) fp8_take_pending(in->fp8, 1);
    al_attn_plan pl;
    AL_TRY(al_attn_plan_build(&pl, p, in));
    pl.backward = 1;
    al_status s = AL_OK;
    char b1[96];
    int nd = pl.p.qkv_format == AL_ATTN_FORMAT_THD ? 3 : 4;
    /* out/dout: q's shape with d_v as the last extent */
    if ((s = al_check_tensor("attention_backward", "out", out)) != AL_OK) goto done;
    if ((s = al_check_tensor("attention_backward", "dout", dout)) != AL_OK) goto done;
    for (int which = 0; which < 2; which++) {
        const al_tensor *t = which ? dout : out;
        int ok = t->ndim == nd && al_dtype_is_float(t->dtype);
        for (int d = 0; ok && d < nd - 1; d++) ok = t->size[d] == in->q->size[d];
        if (ok) ok = t->size[nd - 1] == pl.p.d_v;
        if (!ok) {
            s = al_error(AL_ERR_ARG, "attention_backward: %s must be a float tensor shaped like q with last extent d_v=%lld, got %s",
                         which ? "dout" : "out", (long long)pl.p.d_v, al_tensor_describe(t, b1, sizeof b1));
            goto done;
        }
    }
    if ((s = al_check_tensor("attention_backward", "lse", lse)) != AL_OK) goto done;
    if ((lse->dtype != AL_DTYPE_F32 && lse->dtype != AL_DTYPE_F64) || lse->ndim != 3 || lse->size[0] != pl.p.b || lse->size[1] != pl.p.h ||
        lse->size[2] != pl.p.sq) {
        s = al_error(AL_ERR_ARG, "attention_backward: lse must be f32/f64 [%lld,%lld,%lld] from the forward, got %s",
                     (long long)pl.p.b, (long long)pl.p.h, (long long)pl.p.sq, al_tensor_describe(lse, b1, sizeof b1));
        goto done;
    }
    if ((s = same_shape("dq", dq, in->q)) != AL_OK) goto done;
    if ((s = same_shape("dk", dk, in->k)) != AL_OK) goto done;
    if ((s = same_shape("dv", dv, in->v)) != AL_OK) goto done;
    if (!al_dtype_is_float(dq->dtype) || !al_dtype_is_float(dk->dtype) || !al_dtype_is_float(dv->dtype)) {
        s = al_error(AL_ERR_ARG, "attention_backward: dq, dk and dv must be float tensors");
        goto done;
    }
    const al_attn_backend *be;
    if ((s = choose(&pl, &be, NULL, 0)) != AL_OK) goto done;
    al_attn_fp8 *f8 = pl.in.fp8, host8;
    if (f8 && f8->ds && !be->fp8_ds) {   /* its scales through the host (al_fp8_ds_resolve) */
        s = al_fp8_ds_resolve(f8, 1, &host8);
        pl.in.fp8 = &host8;
        if (s == AL_OK)
            s = be->backward(&pl, out, dout, lse, dq, dk, dv, pl.has_grad_bias ? dbias : NULL,
                             pl.p.softmax_type == AL_ATTN_SOFTMAX_LEARNABLE ? d_softmax_offset : NULL);
        pl.in.fp8 = f8;
        if (s == AL_OK) s = al_fp8_ds_commit(f8, 1, &host8);
        if (s == AL_OK) {
            for (int i = 0; i < 6; i++) f8->amax[i] = host8.amax[i], f8->scale_used[i] = host8.scale_used[i];
        }
    } else {
        s = be->backward(&pl, out, dout, lse, dq, dk, dv, pl.has_grad_bias ? dbias : NULL,
                         pl.p.softmax_type == AL_ATTN_SOFTMAX_LEARNABLE ? d_softmax_offset : NULL);
    }
done:
    al_attn_plan_free(&pl);
    if (s != AL_OK) {
        if (dbias) al_tensor_release(dbias);
        if (d_softmax_offset) al_tensor_release(d_softmax_offset);
    }
    return s;
}
