/*
 * fuzz_layout.c — libFuzzer target: declared packed QKV/KV unpacking (al_qkv_unpack) and legacy layout
 * detection (al_qkv_detect) on random buffers.
 *
 * Each input builds a random buffer (1..6 dims, extents 0..5, sometimes a 3 or 2 planted at the
 * interleave position, sometimes a permuted or narrowed view of it) and a random declaration:
 * qkv_layer / kv_layer + query_layer / separate tensors, qkv_interleave_dim (mostly -3/-2, sometimes
 * garbage), qkv_format (valid codes and garbage), a KV cache flag. Invariants:
 *   - unpack fails with a message naming unpack_qkv and zeroed outputs, or returns q/k/v views inside
 *     their storage, a layout whose name is consistent with the declaration (format, packing count,
 *     interleave dim), and selects of the packed buffer at index 0, 1(, 2);
 *   - detect on q/k/v selects of one buffer (random dim and indices) fails cleanly or returns a valid
 *     layout of the declared format whose packing agrees with *packed;
 *   - refcounts balance.
 */
#include "fuzz_common.h"

static const int32_t DTYPES[] = {AL_DTYPE_F32, AL_DTYPE_F16, AL_DTYPE_BF16, AL_DTYPE_I32};

static void release_all(al_tensor *t, int n) {
    for (int i = 0; i < n; i++) al_tensor_release(&t[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    int64_t live0 = al_storage_live_count();
    al_tensor buf, view, q, k, v, ql;
    memset(&view, 0, sizeof view);
    memset(&ql, 0, sizeof ql);

    int32_t nd = (int32_t)fz_int(&in, 1, 6);
    int64_t shape[8];
    for (int d = 0; d < nd; d++) shape[d] = fz_int(&in, 0, 5);
    int32_t dim = fz_u8(&in) < 230 ? (fz_u8(&in) & 1 ? -3 : -2) : fz_i32(&in);
    int kind = (int)fz_int(&in, 0, 2); /* 0: qkv_layer, 1: kv_layer + query_layer, 2: separate */
    int64_t at = (int64_t)nd + dim; /* (64-bit: dim may be INT32_MAX) */
    if (fz_u8(&in) < 200 && at >= 0 && at < nd) shape[at] = kind == 1 ? 2 : 3;
    int32_t dtype = DTYPES[fz_int(&in, 0, 3)];
    FZ_ASSERT(al_tensor_empty(&buf, nd, shape, dtype, AL_DEVICE_CPU, 0) == AL_OK, "empty: %s", al_last_error());
    al_tensor_arange_(&buf, 0, 1);

    /* the buffer as given, or a permuted / narrowed view of it (non-contiguous packings) */
    al_status st = AL_OK;
    switch (fz_int(&in, 0, 3)) {
    case 0: {
        int32_t perm[8];
        for (int i = 0; i < nd; i++) perm[i] = i;
        for (int i = nd - 1; i > 0; i--) {
            int j = (int)fz_int(&in, 0, i), x = perm[i];
            perm[i] = perm[j];
            perm[j] = x;
        }
        st = al_tensor_permute(&view, &buf, nd, perm);
        break;
    }
    case 1: {
        int32_t d = (int32_t)fz_int(&in, 0, nd - 1);
        int64_t start = fz_int(&in, 0, shape[d]);
        st = al_tensor_narrow(&view, &buf, d, start, fz_int(&in, 0, shape[d] - start));
        break;
    }
    default:
        st = al_tensor_alias(&view, &buf);
    }
    FZ_ASSERT(st == AL_OK, "view of the buffer: %s", al_last_error());

    al_qkv_unpack_args a;
    memset(&a, 0, sizeof a);
    a.qkv_interleave_dim = dim;
    a.qkv_format = fz_u8(&in) < 220 ? (int32_t)fz_int(&in, 0, AL_QKV_FORMAT_COUNT - 1) : fz_i32(&in);
    a.has_kv_cache = fz_u8(&in) > 240;
    if (kind == 0) {
        a.qkv_layer = &view;
    } else {
        /* a query tensor of plausible rank, from the same extents */
        int32_t qnd = fz_u8(&in) < 220 ? nd - 1 : (int32_t)fz_int(&in, 0, 6);
        int64_t qs[8];
        for (int d = 0; d < qnd; d++) {
            int src = d < at ? d : d + 1; /* skip the interleave dim */
            qs[d] = fz_u8(&in) < 220 && src < nd && src >= 0 ? shape[src] : fz_int(&in, 0, 5);
        }
        FZ_ASSERT(al_tensor_empty(&ql, qnd, qs, fz_u8(&in) < 240 ? dtype : AL_DTYPE_F64, AL_DEVICE_CPU, 0) == AL_OK,
                  "empty q: %s", al_last_error());
        if (kind == 1) {
            a.kv_layer = &view;
            a.query_layer = &ql;
        } else {
            a.query_layer = &ql;
            a.key_layer = &view;
            a.value_layer = fz_u8(&in) < 200 ? &view : NULL;
        }
    }
    /* hostile extras: an argument that must be absent */
    if (fz_u8(&in) > 245) a.key_layer = &view;

    int32_t layout = 12345;
    memset(&q, 0xAB, sizeof q);
    memset(&k, 0xAB, sizeof k);
    memset(&v, 0xAB, sizeof v);
    st = al_qkv_unpack(&a, &q, &k, &v, &layout);
    if (st != AL_OK) {
        fz_check_failed(st, &q, "unpack_qkv");
        fz_check_failed(st, &k, "unpack_qkv");
        fz_check_failed(st, &v, "unpack_qkv");
        FZ_ASSERT(layout == AL_QKV_LAYOUT_NONE, "failed unpack left layout %d", layout);
    } else {
        fz_check_view(&q, "unpack q");
        fz_check_view(&k, "unpack k");
        fz_check_view(&v, "unpack v");
        if (a.qkv_layer || a.kv_layer) {
            const char *name = al_qkv_layout_name(layout);
            FZ_ASSERT(name != NULL, "unpack gave layout code %d", layout);
            int packing = a.qkv_layer ? 3 : 2;
            FZ_ASSERT(al_qkv_layout_packing(layout) == packing, "%s: packing %d, declared %d", name,
                      al_qkv_layout_packing(layout), packing);
            FZ_ASSERT(al_qkv_layout_interleave_dim(layout) == dim, "%s: interleave dim %d, declared %d", name,
                      al_qkv_layout_interleave_dim(layout), dim);
            FZ_ASSERT(al_qkv_layout_format(layout) == a.qkv_format, "%s: format %d, declared %d", name,
                      al_qkv_layout_format(layout), a.qkv_format);
            /* the name spells the declaration: the digit sits at len(fmt) + dim + 1 of the packed part */
            const char *fmt = al_qkv_format_name(a.qkv_format);
            size_t fl = strlen(fmt);
            const char *packed_part = packing == 3 ? name : name + fl + 1;
            FZ_ASSERT(packed_part[(int)fl + dim + 1] == (char)('0' + packing), "%s vs format %s dim %d", name, fmt, dim);
            /* k (and q) are selects of the packed buffer: same storage, offsets one step apart */
            FZ_ASSERT(al_tensor_same_storage(&k, &view) && al_tensor_same_storage(&v, &view), "k/v not views of the buffer");
            int32_t pd = view.ndim + dim;
            FZ_ASSERT(v.offset - k.offset == view.stride[pd], "k/v offsets %lld %lld, step %lld", (long long)k.offset,
                      (long long)v.offset, (long long)view.stride[pd]);
            if (a.qkv_layer) FZ_ASSERT(k.offset - q.offset == view.stride[pd], "q/k offsets");
            else FZ_ASSERT(al_tensor_same_storage(&q, &ql), "q is not query_layer");
        } else {
            FZ_ASSERT(layout == AL_QKV_LAYOUT_NONE, "separate inputs gave layout %d", layout);
            FZ_ASSERT(al_tensor_same_storage(&q, a.query_layer) && al_tensor_same_storage(&k, a.key_layer) &&
                          al_tensor_same_storage(&v, a.value_layer), "separate inputs not aliased");
        }
    }
    al_tensor_release(&q);
    al_tensor_release(&k);
    al_tensor_release(&v);

    /* legacy detection over selects of the buffer at a random dim and random indices */
    if (view.ndim >= 2) {
        int32_t sd = (int32_t)fz_int(&in, 0, view.ndim - 1);
        int64_t ext = view.size[sd];
        al_tensor t3[3];
        memset(t3, 0, sizeof t3);
        int ok = ext > 0;
        for (int i = 0; ok && i < 3; i++) {
            int64_t idx = fz_u8(&in) < 200 ? (i < ext ? i : ext - 1) : fz_int(&in, 0, ext - 1);
            ok = al_tensor_select(&t3[i], &view, sd, idx) == AL_OK;
        }
        if (ok) {
            int32_t fmt = fz_u8(&in) < 230 ? (int32_t)fz_int(&in, 0, AL_QKV_FORMAT_COUNT - 1) : fz_i32(&in);
            int32_t packed = -1;
            layout = 12345;
            st = al_qkv_detect(&t3[0], &t3[1], &t3[2], fmt, &layout, &packed);
            if (st != AL_OK) {
                fz_check_failed(st, NULL, "detect_layout");
                FZ_ASSERT(layout == AL_QKV_LAYOUT_NONE && packed == 0, "failed detect left %d/%d", layout, packed);
            } else {
                FZ_ASSERT(al_qkv_layout_name(layout) != NULL, "detect gave code %d", layout);
                FZ_ASSERT(packed == (al_qkv_layout_packing(layout) > 1), "packed %d for %s", packed,
                          al_qkv_layout_name(layout));
                FZ_ASSERT(al_qkv_layout_format(layout) == fmt, "detected %s for format %d", al_qkv_layout_name(layout), fmt);
            }
        }
        release_all(t3, 3);
    }
    al_tensor_release(&view);
    al_tensor_release(&ql);
    al_tensor_release(&buf);
    FZ_ASSERT(al_storage_live_count() == live0, "storages leaked: %lld live, %lld before",
              (long long)al_storage_live_count(), (long long)live0);
    return 0;
}
