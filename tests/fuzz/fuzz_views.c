/*
 * fuzz_views.c — libFuzzer target: chains of views over random tensors.
 *
 * Each input builds a base tensor (random dtype, 0..8 dims of extents 0..5), then runs up to 24
 * operations — select, narrow, transpose, permute, view, reshape, expand, unsqueeze, squeeze,
 * as_strided, alias, clone, copy_ — with arguments drawn from the input, many of them hostile (out of
 * range, negative, near INT64_MAX). Invariants:
 *   - every call either fails with a message naming the op and a zeroed output, or returns a view
 *     whose every element address lies within its storage (fz_check_view, 128-bit bounds), which is
 *     then read element by element under ASan;
 *   - refcounts balance: each live descriptor holds exactly one reference, and after releasing
 *     everything the live storage count is back to where it started.
 */
#include "fuzz_common.h"

#define POOL 8

static const int32_t DTYPES[] = {AL_DTYPE_F32, AL_DTYPE_F64, AL_DTYPE_F16, AL_DTYPE_BF16, AL_DTYPE_FP8_E4M3,
                                 AL_DTYPE_I32, AL_DTYPE_I64, AL_DTYPE_U8, AL_DTYPE_BOOL};

/* Count the pool entries sharing s (each holds one reference). */
static int64_t refs_in_pool(al_tensor *pool, al_storage *s) {
    int64_t n = 0;
    for (int i = 0; i < POOL; i++) n += pool[i].storage == s;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    int64_t live0 = al_storage_live_count();
    al_tensor pool[POOL];
    memset(pool, 0, sizeof pool);

    int32_t nd = (int32_t)fz_int(&in, 0, 8);
    int64_t shape[8];
    for (int d = 0; d < nd; d++) shape[d] = fz_int(&in, 0, d < 4 ? 5 : 2);
    int32_t dtype = DTYPES[fz_int(&in, 0, 8)];
    al_status st = al_tensor_empty(&pool[0], nd, shape, dtype, AL_DEVICE_CPU, 0);
    FZ_ASSERT(st == AL_OK, "empty: %s", al_last_error());
    al_tensor_arange_(&pool[0], 1.0, 1.0);
    fz_check_view(&pool[0], "empty");

    int nops = (int)fz_int(&in, 1, 24);
    for (int step = 0; step < nops && in.n > 0; step++) {
        int src = (int)fz_int(&in, 0, POOL - 1), dst = (int)fz_int(&in, 0, POOL - 1);
        if (!pool[src].storage) src = 0;
        if (!pool[src].storage) break;
        al_tensor *t = &pool[src], out;
        memset(&out, 0xAB, sizeof out); /* garbage: the library must overwrite it */
        const char *op = "?";
        int32_t i32s[8];
        int64_t i64s[8], strides[8];
        int32_t n;
        switch (fz_int(&in, 0, 12)) {
        case 0:
            op = "select";
            st = al_tensor_select(&out, t, fz_i32(&in), fz_i64(&in));
            break;
        case 1: {
            op = "narrow";
            int32_t d = fz_i32(&in);
            int64_t s0 = fz_i64(&in);
            st = al_tensor_narrow(&out, t, d, s0, fz_i64(&in));
            break;
        }
        case 2: {
            op = "transpose";
            int32_t a = fz_i32(&in);
            st = al_tensor_transpose(&out, t, a, fz_i32(&in));
            break;
        }
        case 3:
            op = "permute";
            n = fz_u8(&in) < 200 ? t->ndim : (int32_t)fz_int(&in, 0, 8);
            /* mostly a real permutation (a shuffle), sometimes garbage */
            for (int i = 0; i < n; i++) i32s[i] = i;
            for (int i = n - 1; i > 0; i--) {
                int j = (int)fz_int(&in, 0, i), x = i32s[i];
                i32s[i] = i32s[j];
                i32s[j] = x;
            }
            if (n > 0 && fz_u8(&in) > 220) i32s[fz_int(&in, 0, n - 1)] = fz_i32(&in);
            st = al_tensor_permute(&out, t, n, i32s);
            break;
        case 4:
        case 5: {
            int reshape = fz_u8(&in) & 1;
            /* a reshape may copy: keep the copies small (a 2^30-element expanded view is a valid
             * input whose copy is 4 GiB, which libFuzzer's malloc limit reports as a crash) */
            if (reshape && al_tensor_numel(t) > ((int64_t)1 << 24)) reshape = 0;
            op = reshape ? "reshape" : "view";
            n = (int32_t)fz_int(&in, 0, 9) - (fz_u8(&in) > 250 ? 3 : 0); /* -3..9: also bad ndims */
            int32_t nn = n < 0 ? 0 : n > 8 ? 8 : n;
            /* mostly a factorisation of numel, sometimes hostile extents */
            int64_t rest = al_tensor_numel(t);
            for (int i = 0; i < nn; i++) {
                uint8_t k = fz_u8(&in);
                if (k < 160) {
                    int64_t f = 1;
                    for (int64_t c = 2; c <= 5; c++)
                        if (rest % c == 0 && (k >> 4) % 2) { f = c; break; }
                    i64s[i] = i == nn - 1 ? rest : f;
                    if (f) rest /= f;
                } else if (k < 200) {
                    i64s[i] = -1;
                } else {
                    i64s[i] = fz_i64(&in);
                }
            }
            int32_t copied = -1;
            if (reshape) {
                st = al_tensor_reshape(&out, t, n, i64s, &copied);
                if (st == AL_OK) FZ_ASSERT(copied == 0 || copied == 1, "reshape: copied = %d", copied);
                if (st == AL_OK && !copied) FZ_ASSERT(out.storage == t->storage, "reshape: a view must share storage");
            } else {
                st = al_tensor_view(&out, t, n, i64s);
                if (st == AL_OK) FZ_ASSERT(out.storage == t->storage, "view: a view must share storage");
            }
            if (st == AL_OK) FZ_ASSERT(al_tensor_numel(&out) == al_tensor_numel(t), "%s changed numel", op);
            break;
        }
        case 6:
            op = "expand";
            n = (int32_t)fz_int(&in, 0, 9);
            for (int i = 0; i < (n > 8 ? 8 : n); i++) {
                int32_t td = i - (n - t->ndim);
                uint8_t k = fz_u8(&in);
                i64s[i] = k < 120 && td >= 0 ? t->size[td] : k < 160 ? -1 : k < 200 ? fz_int(&in, 0, 4) : fz_i64(&in);
            }
            st = al_tensor_expand(&out, t, n, i64s);
            break;
        case 7:
            op = "unsqueeze";
            st = al_tensor_unsqueeze(&out, t, fz_i32(&in));
            break;
        case 8:
            op = "squeeze";
            st = al_tensor_squeeze(&out, t, fz_i32(&in));
            break;
        case 9: {
            op = "as_strided";
            n = (int32_t)fz_int(&in, 0, 9);
            for (int i = 0; i < (n > 8 ? 8 : n); i++) {
                uint8_t k = fz_u8(&in);
                i64s[i] = k < 200 ? fz_int(&in, 0, 6) : fz_i64(&in);
                k = fz_u8(&in);
                strides[i] = k < 200 ? fz_int(&in, 0, 12) : fz_i64(&in);
            }
            int64_t off = fz_u8(&in) < 200 ? fz_int(&in, 0, 30) : fz_i64(&in);
            st = al_tensor_as_strided(&out, t, n, i64s, strides, off);
            break;
        }
        case 10:
            op = "alias";
            st = al_tensor_alias(&out, t);
            break;
        case 11:
            op = "clone";
            if (al_tensor_numel(t) > ((int64_t)1 << 24)) continue;  /* see reshape */
            st = al_tensor_clone(&out, t);
            if (st == AL_OK) {
                double a, b;
                /* a clone equals its source */
                if (al_tensor_numel(t) > 0 && al_tensor_numel(t) <= 4096) {
                    al_status s2 = al_max_abs_diff(&out, t, &a);
                    FZ_ASSERT(s2 == AL_OK && (a == 0 || isnan(a)), "clone differs: %g (%s)", a, al_last_error());
                }
                (void)b;
            }
            break;
        default: {
            /* copy_ into another live tensor: fails cleanly on shape mismatch or overlap */
            op = "copy_";
            al_tensor *d = pool[dst].storage ? &pool[dst] : &pool[0];
            st = al_tensor_copy_(d, t);
            if (st != AL_OK) fz_check_failed(st, NULL, op);
            else fz_check_view(d, op);
            continue;
        }
        }
        if (st != AL_OK) {
            fz_check_failed(st, &out, op);
            continue;
        }
        fz_check_view(&out, op);
        if (strcmp(op, "clone") != 0 && strcmp(op, "reshape") != 0)
            FZ_ASSERT(out.storage == t->storage, "%s: a view must share its source's storage", op);
        /* refcount: the pool's references plus this new one */
        FZ_ASSERT(al_tensor_storage_refcount(&out) == refs_in_pool(pool, out.storage) + 1,
                  "%s: refcount %lld, expected %lld", op, (long long)al_tensor_storage_refcount(&out),
                  (long long)refs_in_pool(pool, out.storage) + 1);
        al_tensor_release(&pool[dst]);
        pool[dst] = out;
    }
    for (int i = 0; i < POOL; i++) al_tensor_release(&pool[i]);
    FZ_ASSERT(al_storage_live_count() == live0, "storages leaked: %lld live, %lld before",
              (long long)al_storage_live_count(), (long long)live0);
    return 0;
}
