/*
 * fuzz_attn_args.c — libFuzzer target: the DotProductAttention argument checks and the CPU forward
 * (and sometimes backward) on tiny random problems.
 *
 * Each input picks a format (sbhd/bshd/thd, sometimes an invalid code), batch 0..3, sequence lengths
 * 0..5, head counts (h, hg; not always dividing), head dims, dtypes (sometimes mismatched), random
 * cu_seqlens (monotone or not, in or out of range, padded variants), padding/arbitrary masks of
 * random shapes, bias of random shapes and types, ALiBi slopes, softmax types and offsets, windows,
 * dropout, scales (NaN/inf included), the params' given extents, and sometimes a variant (snippets,
 * captures of random shapes and dtypes, block masks of random shapes and block sizes). Invariants:
 *   - al_attn_check fails with a message naming attention, or passes; al_attn_forward agrees with it
 *     (same status class, no crash) and on success returns outputs of the documented shapes whose
 *     values are all finite (lse may be -inf on empty rows), with every temporary released;
 *   - when the forward succeeds, the backward on a random dout also succeeds with finite gradients.
 */
#include "fuzz_common.h"

static al_tensor pool[32];
static int npool;

static al_tensor *mk(fz_in *in, int32_t ndim, const int64_t *size, int32_t dtype) {
    al_tensor *t = &pool[npool];
    if (npool >= 32 || al_tensor_empty(t, ndim, size, dtype, AL_DEVICE_CPU, 0) != AL_OK) return NULL;
    npool++;
    fz_fill(in, t);
    return t;
}

/* Every element finite (f64 read-back). */
static int all_finite(const al_tensor *t, int allow_neg_inf) {
    int64_t n = al_tensor_numel(t);
    if (n == 0) return 1;
    double *v = malloc(sizeof(double) * (size_t)n);
    if (!v) return 1;
    FZ_ASSERT(al_tensor_read_f64(t, v, n) == AL_OK, "read: %s", al_last_error());
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) ok = isfinite(v[i]) || (allow_neg_inf && v[i] == -INFINITY);
    free(v);
    return ok;
}

/* A cu_seqlens tensor of b+1 (or a wrong count of) i32 entries: monotone prefix sums mostly. */
static al_tensor *cu_seqlens(fz_in *in, int64_t b, int64_t total) {
    int64_t n = fz_u8(in) < 230 ? b + 1 : fz_int(in, 0, 5);
    al_tensor *t = mk(in, 1, &n, fz_u8(in) < 240 ? AL_DTYPE_I32 : AL_DTYPE_I64);
    if (!t) return NULL;
    double v[8] = {0};
    int64_t acc = 0;
    for (int64_t i = 0; i < n && i < 8; i++) {
        uint8_t k = fz_u8(in);
        if (i > 0) acc += k < 200 ? fz_int(in, 0, total > 0 ? total : 1) : (int64_t)fz_i32(in);
        v[i] = (double)acc;
    }
    if (n <= 8) al_tensor_write_f64(t, v, n);
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    int64_t live0 = al_storage_live_count();
    npool = 0;
    memset(pool, 0, sizeof pool);

    al_attn_params p;
    al_attn_params_init(&p);
    al_attn_inputs inp;
    memset(&inp, 0, sizeof inp);

    p.qkv_format = fz_u8(&in) < 245 ? (int32_t)fz_int(&in, 0, 2) : fz_i32(&in);
    int thd = p.qkv_format == AL_ATTN_FORMAT_THD;
    int64_t b = fz_int(&in, 0, 3), sq = fz_int(&in, 0, 5), skv = fz_u8(&in) < 128 ? sq : fz_int(&in, 0, 5);
    int64_t hg = fz_int(&in, 1, 3), h = fz_u8(&in) < 200 ? hg * fz_int(&in, 1, 2) : fz_int(&in, 0, 4);
    int64_t dqk = fz_int(&in, 1, 4), dv = fz_u8(&in) < 200 ? dqk : fz_int(&in, 0, 4);
    static const int32_t FL[] = {AL_DTYPE_F32, AL_DTYPE_F64, AL_DTYPE_F16, AL_DTYPE_BF16, AL_DTYPE_I32, AL_DTYPE_FP8_E4M3};
    int32_t dt = FL[fz_u8(&in) < 230 ? fz_int(&in, 0, 3) : fz_int(&in, 0, 5)];
    int64_t qs[4] = {1, 1, 1, 1}, ks[4] = {1, 1, 1, 1}, vs[4] = {1, 1, 1, 1};   /* q may get a 4th dim under thd */
    int nd = thd ? 3 : 4;
    int64_t tq = b * sq + fz_int(&in, 0, 2), tkv = b * skv + fz_int(&in, 0, 2);
    if (thd) {
        qs[0] = tq; ks[0] = vs[0] = tkv;
    } else if (p.qkv_format == AL_ATTN_FORMAT_BSHD) {
        qs[0] = ks[0] = vs[0] = b; qs[1] = sq; ks[1] = vs[1] = skv;
    } else {
        qs[1] = ks[1] = vs[1] = b; qs[0] = sq; ks[0] = vs[0] = skv;
    }
    qs[nd - 2] = h; ks[nd - 2] = vs[nd - 2] = hg;
    qs[nd - 1] = ks[nd - 1] = dqk; vs[nd - 1] = dv;
    if (fz_u8(&in) > 240) ks[fz_int(&in, 0, nd - 1)] += 1; /* a mismatched extent */
    int32_t qnd = fz_u8(&in) > 245 ? (int32_t)fz_int(&in, 1, 4) : nd;
    inp.q = mk(&in, qnd, qs, dt);
    inp.k = mk(&in, nd, ks, fz_u8(&in) > 245 ? AL_DTYPE_F64 : dt);
    inp.v = mk(&in, nd, vs, dt);

    p.mask_type = fz_u8(&in) < 245 ? (int32_t)fz_int(&in, 0, 6) : fz_i32(&in);
    if (fz_u8(&in) < 120) {
        p.window_left = fz_int(&in, -2, 4);
        p.window_right = fz_int(&in, -2, 4);
    }
    p.bottom_right_diagonal = (int32_t)fz_int(&in, -1, 1);
    p.bias_type = fz_u8(&in) < 245 ? (int32_t)fz_int(&in, 0, 3) : fz_i32(&in);
    p.softmax_type = fz_u8(&in) < 245 ? (int32_t)fz_int(&in, 0, 2) : fz_i32(&in);
    static const double SCALES[] = {0, 0.5, 1, 2, -1, 0.125, NAN, INFINITY};
    p.softmax_scale = SCALES[fz_int(&in, 0, 7)];
    static const double DROPS[] = {0, 0, 0.1, 0.5, 0.99, 1, -0.1, NAN};
    p.dropout_p = DROPS[fz_int(&in, 0, 7)];
    p.dropout_seed = fz_u8(&in);
    p.compute_dtype = fz_u8(&in) < 240 ? (fz_u8(&in) & 1 ? AL_DTYPE_F64 : AL_DTYPE_F32) : fz_i32(&in);
    p.return_max_logit = fz_u8(&in) & 1;
    switch (fz_int(&in, 0, 7)) { /* hostile backend names, one of them 16 bytes with no NUL */
    case 1: memcpy(p.backend, "cpu", 4); break;
    case 2: memcpy(p.backend, "fused", 6); break;
    case 3: memset(p.backend, 'x', sizeof p.backend); break;
    default: break;
    }
    if (fz_u8(&in) > 230) p.h = fz_int(&in, 0, 5);
    if (fz_u8(&in) > 230) p.b = fz_int(&in, 0, 5);
    if (thd && fz_u8(&in) > 128) p.sq = fz_int(&in, 0, 7);
    if (thd && fz_u8(&in) > 128) p.skv = fz_int(&in, 0, 7);

    /* padding: cu_seqlens (thd or dense) or masks */
    if (thd || fz_u8(&in) > 160) {
        inp.cu_seqlens_q = cu_seqlens(&in, b, thd ? tq / (b ? b : 1) : sq);
        inp.cu_seqlens_kv = fz_u8(&in) < 240 ? cu_seqlens(&in, b, thd ? tkv / (b ? b : 1) : skv) : NULL;
        if (thd && fz_u8(&in) > 200) inp.cu_seqlens_q_padded = cu_seqlens(&in, b, tq / (b ? b : 1) + 1);
        if (thd && fz_u8(&in) > 200) inp.cu_seqlens_kv_padded = cu_seqlens(&in, b, tkv / (b ? b : 1) + 1);
    } else if (fz_u8(&in) > 128) {
        int64_t ms[4] = {b, 1, 1, sq};
        int32_t mnd = 4;
        if (p.mask_type == AL_ATTN_MASK_ARBITRARY || fz_u8(&in) > 200) {
            mnd = (int32_t)fz_int(&in, 1, 4);
            int64_t full[4] = {b, h, sq, skv};
            for (int d = 0; d < mnd; d++) ms[d] = fz_u8(&in) & 1 ? full[4 - mnd + d] : 1;
        }
        inp.attention_mask = mk(&in, mnd, ms, fz_u8(&in) < 240 ? AL_DTYPE_BOOL : AL_DTYPE_F32);
        if (fz_u8(&in) > 180) {
            int64_t mk2[4] = {b, 1, 1, skv};
            inp.attention_mask_kv = mk(&in, 4, mk2, AL_DTYPE_U8);
        }
    }
    if (fz_u8(&in) > 150) {
        int64_t bs[4] = {fz_u8(&in) & 1 ? b : 1, fz_u8(&in) & 1 ? h : 1, fz_u8(&in) & 1 ? sq : 1, skv};
        if (fz_u8(&in) > 240) bs[3] += 1;
        int32_t bnd = fz_u8(&in) > 240 ? (int32_t)fz_int(&in, 1, 4) : 4;
        inp.bias = mk(&in, bnd, bs + (4 - bnd), fz_u8(&in) < 240 ? dt : AL_DTYPE_I32);
    }
    if (fz_u8(&in) > 200) {
        int64_t as[2] = {b, h};
        int32_t and_ = (int32_t)fz_int(&in, 1, 2);
        inp.alibi_slopes = mk(&in, and_, and_ == 1 ? as + 1 : as, fz_u8(&in) < 240 ? AL_DTYPE_F32 : AL_DTYPE_F16);
    }
    if (fz_u8(&in) > 150) {
        int64_t os_ = fz_u8(&in) < 220 ? h : fz_int(&in, 0, 5);
        inp.softmax_offset = mk(&in, 1, &os_, AL_DTYPE_F32);
    }

    /* a variant (score_mod / mask_mod snippets, captures, block mask): validated by the front door and
     * served by the flash backend only, so on this GPU-less machine the forward must fail cleanly */
    al_attn_variant var;
    int with_variant = fz_u8(&in) > 215;
    if (with_variant) {
        memset(&var, 0, sizeof var);
        static const char *SNIP[] = {NULL, "score * 2.0f", "q_idx >= kv_idx", "x // comment", ""};
        var.score_mod = SNIP[fz_int(&in, 0, 4)];
        var.score_grad = fz_u8(&in) & 1 ? SNIP[fz_int(&in, 0, 4)] : NULL;
        var.mask_mod = SNIP[fz_int(&in, 0, 4)];
        if (fz_u8(&in) > 180) {   /* the folded form: needs score_mod, score_post a finite f32 > 0 */
            static const double POST[] = {1.0, 30.0, 0.0, -1.0, 1e300};
            var.score_pre = SNIP[fz_int(&in, 0, 4)];
            var.score_post = POST[fz_int(&in, 0, 4)];
            if (fz_u8(&in) & 1) var.score_grad_pre = SNIP[fz_int(&in, 0, 4)];   /* needs score_pre and score_grad */
        }
        if (fz_u8(&in) > 200) {   /* the logit's bounds: finite, lo <= hi, beside score_mod */
            static const double BOUND[] = {-30.0, 30.0, 0.0, 1e300, -1e300};
            var.score_bounded = fz_u8(&in) & 1 ? 1 : fz_i32(&in);
            var.score_lo = fz_u8(&in) > 240 ? NAN : BOUND[fz_int(&in, 0, 4)];
            var.score_hi = fz_u8(&in) > 240 ? INFINITY : BOUND[fz_int(&in, 0, 4)];
        }
        if (fz_u8(&in) > 220) var.score_mufu = fz_u8(&in) & 1 ? 1 : fz_i32(&in);   /* the hint: 0 / 1, beside score_mod */
        var.ncaptures = fz_u8(&in) < 230 ? (int32_t)fz_int(&in, 0, 3) : fz_i32(&in);
        for (int i = 0; i < 3; i++) {
            int64_t cs = fz_int(&in, 0, 6);
            var.captures[i] = fz_u8(&in) < 220 ? mk(&in, 1, &cs, fz_u8(&in) & 1 ? AL_DTYPE_F32 : AL_DTYPE_I32) : NULL;
            if (fz_u8(&in) > 200) var.capture_grads[i] = mk(&in, 1, &cs, fz_u8(&in) & 1 ? AL_DTYPE_F32 : AL_DTYPE_F64);
        }
        if (fz_u8(&in) > 100) {
            int64_t bm_ = fz_int(&in, -1, 128), bn_ = fz_int(&in, -1, 128);
            var.block_m = bm_;
            var.block_n = bn_;
            int64_t nbq = bm_ > 0 ? (sq + bm_ - 1) / bm_ : 1, nbk = bn_ > 0 ? (skv + bn_ - 1) / bn_ : 1;
            int64_t bms[4] = {fz_u8(&in) & 1 ? b : 1, fz_u8(&in) & 1 ? h : 1, nbq + (fz_u8(&in) > 240), nbk};
            int32_t bnd = fz_u8(&in) > 240 ? (int32_t)fz_int(&in, 1, 4) : 4;
            var.block_mask = mk(&in, bnd, bms + (4 - bnd), fz_u8(&in) < 230 ? AL_DTYPE_U8 : AL_DTYPE_F32);
        }
        inp.variant = &var;
    }

    al_status chk = al_attn_check(&p, &inp);
    if (chk != AL_OK) fz_check_failed(chk, NULL, "attention");
    al_tensor out, lse, ml;
    memset(&out, 0xAB, sizeof out);
    memset(&lse, 0xAB, sizeof lse);
    memset(&ml, 0xAB, sizeof ml);
    al_status st = al_attn_forward(&p, &inp, &out, &lse, &ml);
    if (chk != AL_OK) {
        FZ_ASSERT(st != AL_OK, "check failed (%d) but forward passed", (int)chk);
    }
    FZ_ASSERT(!(with_variant && st == AL_OK), "a variant was served without a GPU (only flash serves variants)");
    if (st != AL_OK) {
        /* forward-only failures (e.g. an unsupported forced backend) must still be clean */
        fz_check_failed(st, &out, "attention");
        fz_check_failed(st, &lse, "attention");
    } else {
        FZ_ASSERT(chk == AL_OK, "forward passed but check failed");
        fz_check_view(&out, "attention out");
        fz_check_view(&lse, "attention lse");
        FZ_ASSERT(out.ndim == inp.q->ndim && out.size[out.ndim - 1] == inp.v->size[inp.v->ndim - 1], "out shape");
        FZ_ASSERT(lse.ndim == 3, "lse ndim %d", lse.ndim);
        FZ_ASSERT(all_finite(&out, 0), "non-finite attention output");
        FZ_ASSERT(all_finite(&lse, 1), "NaN or +inf in lse");
        if (p.return_max_logit) fz_check_view(&ml, "attention max_logit");

        if (fz_u8(&in) > 128) {
            al_tensor dq, dk, dv, db, doff;
            al_tensor *dout = mk(&in, out.ndim, out.size, out.dtype);
            int ok = dout && al_tensor_empty(&dq, inp.q->ndim, inp.q->size, inp.q->dtype, 0, 0) == AL_OK;
            ok = ok && al_tensor_empty(&dk, inp.k->ndim, inp.k->size, inp.k->dtype, 0, 0) == AL_OK;
            ok = ok && al_tensor_empty(&dv, inp.v->ndim, inp.v->size, inp.v->dtype, 0, 0) == AL_OK;
            FZ_ASSERT(ok, "allocating gradients: %s", al_last_error());
            st = al_attn_backward(&p, &inp, &out, dout, &lse, &dq, &dk, &dv, &db, &doff);
            if (st != AL_OK) {
                fz_check_failed(st, &db, "attention");
                /* a forced non-cpu backend has no GPU here: the only allowed failure */
                FZ_ASSERT(p.backend[0] && strcmp(p.backend, "cpu") != 0, "backward failed: %s", al_last_error());
            } else {
                FZ_ASSERT(all_finite(&dq, 0) && all_finite(&dk, 0) && all_finite(&dv, 0), "non-finite gradients");
                al_tensor_release(&db);
                al_tensor_release(&doff);
            }
            al_tensor_release(&dq);
            al_tensor_release(&dk);
            al_tensor_release(&dv);
        }
        al_tensor_release(&out);
        al_tensor_release(&lse);
        if (p.return_max_logit) al_tensor_release(&ml);
    }
    for (int i = 0; i < npool; i++) al_tensor_release(&pool[i]);
    FZ_ASSERT(al_storage_live_count() == live0, "storages leaked: %lld live, %lld before",
              (long long)al_storage_live_count(), (long long)live0);
    return 0;
}
