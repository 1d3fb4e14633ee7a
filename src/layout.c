/*
 * layout.c — QKV memory layouts: TransformerEngine's 25 layout strings (NVTE_QKV_Layout order),
 * formats and groups; the declarative unpack of a packed qkv_layer/kv_layer into zero-copy select
 * views (TE's _unpack_packed_qkv, validated in TE's order); and the legacy pointer-based detection
 * (TE's get_qkv_layout, same decision order, with attnlab's fixes: offsets relative to the buffer,
 * a non-overlap test for packed matches, no copies).
 *
 * The declared path never calls the detection code: al_qkv_detect counts its calls in a global
 * counter (al_layout_detect_calls) that the tests read before and after unpacking.
 */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>

/* ---- vocabulary ------------------------------------------------------------------------------- */

typedef struct layout_info {
    const char *name;
    int8_t format;     /* al_qkv_format */
    int8_t q_format;   /* SBHD/BSHD/THD */
    int8_t kv_format;
    int8_t group;      /* al_qkv_group */
} layout_info;

enum { F_SBHD = AL_QKV_FORMAT_SBHD, F_BSHD = AL_QKV_FORMAT_BSHD, F_THD = AL_QKV_FORMAT_THD };

/* Index = al_qkv_layout code = NVTE_QKV_Layout value. */
static const layout_info LAYOUTS[AL_QKV_LAYOUT_COUNT] = {
    {"sb3hd", AL_QKV_FORMAT_SBHD, F_SBHD, F_SBHD, AL_QKV_GROUP_3HD},
    {"sbh3d", AL_QKV_FORMAT_SBHD, F_SBHD, F_SBHD, AL_QKV_GROUP_H3D},
    {"sbhd_sb2hd", AL_QKV_FORMAT_SBHD, F_SBHD, F_SBHD, AL_QKV_GROUP_HD_2HD},
    {"sbhd_sbh2d", AL_QKV_FORMAT_SBHD, F_SBHD, F_SBHD, AL_QKV_GROUP_HD_H2D},
    {"sbhd_sbhd_sbhd", AL_QKV_FORMAT_SBHD, F_SBHD, F_SBHD, AL_QKV_GROUP_HD_HD_HD},
    {"bs3hd", AL_QKV_FORMAT_BSHD, F_BSHD, F_BSHD, AL_QKV_GROUP_3HD},
    {"bsh3d", AL_QKV_FORMAT_BSHD, F_BSHD, F_BSHD, AL_QKV_GROUP_H3D},
    {"bshd_bs2hd", AL_QKV_FORMAT_BSHD, F_BSHD, F_BSHD, AL_QKV_GROUP_HD_2HD},
    {"bshd_bsh2d", AL_QKV_FORMAT_BSHD, F_BSHD, F_BSHD, AL_QKV_GROUP_HD_H2D},
    {"bshd_bshd_bshd", AL_QKV_FORMAT_BSHD, F_BSHD, F_BSHD, AL_QKV_GROUP_HD_HD_HD},
    {"t3hd", AL_QKV_FORMAT_THD, F_THD, F_THD, AL_QKV_GROUP_3HD},
    {"th3d", AL_QKV_FORMAT_THD, F_THD, F_THD, AL_QKV_GROUP_H3D},
    {"thd_t2hd", AL_QKV_FORMAT_THD, F_THD, F_THD, AL_QKV_GROUP_HD_2HD},
    {"thd_th2d", AL_QKV_FORMAT_THD, F_THD, F_THD, AL_QKV_GROUP_HD_H2D},
    {"thd_thd_thd", AL_QKV_FORMAT_THD, F_THD, F_THD, AL_QKV_GROUP_HD_HD_HD},
    {"sbhd_bshd_bshd", AL_QKV_FORMAT_SBHD_2BSHD, F_SBHD, F_BSHD, AL_QKV_GROUP_HD_HD_HD},
    {"bshd_sbhd_sbhd", AL_QKV_FORMAT_BSHD_2SBHD, F_BSHD, F_SBHD, AL_QKV_GROUP_HD_HD_HD},
    {"thd_bshd_bshd", AL_QKV_FORMAT_THD_2BSHD, F_THD, F_BSHD, AL_QKV_GROUP_HD_HD_HD},
    {"thd_sbhd_sbhd", AL_QKV_FORMAT_THD_2SBHD, F_THD, F_SBHD, AL_QKV_GROUP_HD_HD_HD},
    {"paged_kv_bshd_bshd_bshd", AL_QKV_FORMAT_BSHD, F_BSHD, F_BSHD, AL_QKV_GROUP_PAGED_KV_HD_HD_HD},
    {"paged_kv_bshd_sbhd_sbhd", AL_QKV_FORMAT_BSHD_2SBHD, F_BSHD, F_SBHD, AL_QKV_GROUP_PAGED_KV_HD_HD_HD},
    {"paged_kv_sbhd_bshd_bshd", AL_QKV_FORMAT_SBHD_2BSHD, F_SBHD, F_BSHD, AL_QKV_GROUP_PAGED_KV_HD_HD_HD},
    {"paged_kv_sbhd_sbhd_sbhd", AL_QKV_FORMAT_SBHD, F_SBHD, F_SBHD, AL_QKV_GROUP_PAGED_KV_HD_HD_HD},
    {"paged_kv_thd_bshd_bshd", AL_QKV_FORMAT_THD_2BSHD, F_THD, F_BSHD, AL_QKV_GROUP_PAGED_KV_HD_HD_HD},
    {"paged_kv_thd_sbhd_sbhd", AL_QKV_FORMAT_THD_2SBHD, F_THD, F_SBHD, AL_QKV_GROUP_PAGED_KV_HD_HD_HD},
};

/* Index = al_qkv_format code; q and kv parts of each. */
static const struct { const char *name; int8_t q, kv; } FORMATS[AL_QKV_FORMAT_COUNT] = {
    {"sbhd", F_SBHD, F_SBHD},       {"bshd", F_BSHD, F_BSHD},       {"thd", F_THD, F_THD},
    {"bshd_2sbhd", F_BSHD, F_SBHD}, {"sbhd_2bshd", F_SBHD, F_BSHD}, {"thd_2bshd", F_THD, F_BSHD},
    {"thd_2sbhd", F_THD, F_SBHD},
};

static const char *const GROUPS[AL_QKV_GROUP_COUNT] = {
    "3hd", "h3d", "hd_2hd", "hd_h2d", "hd_hd_hd", "paged_kv_hd_hd_hd",
};

static int valid_layout(int32_t l) { return l >= 0 && l < AL_QKV_LAYOUT_COUNT; }

static int name_eq(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != *b) return 0;
    return *a == 0 && *b == 0;
}

const char *al_qkv_layout_name(int32_t layout) { return valid_layout(layout) ? LAYOUTS[layout].name : NULL; }

al_status al_qkv_layout_parse(const char *name, int32_t *layout) {
    if (layout) *layout = AL_QKV_LAYOUT_NONE;
    if (!name || !layout) return al_error(AL_ERR_ARG, "qkv_layout: expected a layout name, got NULL");
    for (int32_t i = 0; i < AL_QKV_LAYOUT_COUNT; i++)
        if (name_eq(name, LAYOUTS[i].name)) {
            *layout = i;
            return AL_OK;
        }
    return al_error(AL_ERR_ARG, "qkv_layout: expected one of TransformerEngine's 25 layouts (sb3hd, bshd_bs2hd, "
                                "thd_thd_thd, paged_kv_bshd_bshd_bshd, ...), got '%s'", name);
}

const char *al_qkv_format_name(int32_t format) {
    return (format >= 0 && format < AL_QKV_FORMAT_COUNT) ? FORMATS[format].name : NULL;
}

al_status al_qkv_format_parse(const char *name, int32_t *format) {
    if (format) *format = -1;
    if (!name || !format) return al_error(AL_ERR_ARG, "qkv_format: expected a format name, got NULL");
    for (int32_t i = 0; i < AL_QKV_FORMAT_COUNT; i++)
        if (name_eq(name, FORMATS[i].name)) {
            *format = i;
            return AL_OK;
        }
    return al_error(AL_ERR_ARG, "qkv_format: expected 'sbhd', 'bshd', 'thd', 'bshd_2sbhd', 'sbhd_2bshd', "
                                "'thd_2bshd' or 'thd_2sbhd', got '%s'", name);
}

const char *al_qkv_group_name(int32_t group) {
    return (group >= 0 && group < AL_QKV_GROUP_COUNT) ? GROUPS[group] : NULL;
}

al_status al_qkv_format_split(int32_t format, int32_t *q_format, int32_t *kv_format) {
    if (format < 0 || format >= AL_QKV_FORMAT_COUNT)
        return al_error(AL_ERR_ARG, "qkv_format: unknown format code %d", format);
    if (q_format) *q_format = FORMATS[format].q;
    if (kv_format) *kv_format = FORMATS[format].kv;
    return AL_OK;
}

int32_t al_qkv_layout_format(int32_t l) { return valid_layout(l) ? LAYOUTS[l].format : -1; }
int32_t al_qkv_layout_q_format(int32_t l) { return valid_layout(l) ? LAYOUTS[l].q_format : -1; }
int32_t al_qkv_layout_kv_format(int32_t l) { return valid_layout(l) ? LAYOUTS[l].kv_format : -1; }
int32_t al_qkv_layout_group(int32_t l) { return valid_layout(l) ? LAYOUTS[l].group : -1; }
int32_t al_qkv_layout_is_paged(int32_t l) {
    return valid_layout(l) && LAYOUTS[l].group == AL_QKV_GROUP_PAGED_KV_HD_HD_HD;
}
int32_t al_qkv_layout_is_packed(int32_t l) { return valid_layout(l) && LAYOUTS[l].group <= AL_QKV_GROUP_HD_H2D; }

int32_t al_qkv_layout_packing(int32_t l) {
    if (!valid_layout(l)) return -1;
    switch (LAYOUTS[l].group) {
    case AL_QKV_GROUP_3HD: case AL_QKV_GROUP_H3D: return 3;
    case AL_QKV_GROUP_HD_2HD: case AL_QKV_GROUP_HD_H2D: return 2;
    default: return 1;
    }
}

int32_t al_qkv_layout_interleave_dim(int32_t l) {
    if (!valid_layout(l)) return -1;
    switch (LAYOUTS[l].group) {
    case AL_QKV_GROUP_3HD: case AL_QKV_GROUP_HD_2HD: return -3;
    case AL_QKV_GROUP_H3D: case AL_QKV_GROUP_HD_H2D: return -2;
    default: return 0;
    }
}

al_status al_qkv_layout_paged(int32_t layout, int32_t *paged) {
    if (paged) *paged = AL_QKV_LAYOUT_NONE;
    if (!valid_layout(layout)) return al_error(AL_ERR_ARG, "qkv_layout_paged: unknown layout code %d", layout);
    if (LAYOUTS[layout].group == AL_QKV_GROUP_PAGED_KV_HD_HD_HD) {
        *paged = layout;
        return AL_OK;
    }
    char name[48];
    snprintf(name, sizeof name, "paged_kv_%s", LAYOUTS[layout].name);
    for (int32_t i = AL_QKV_LAYOUT_PAGED_KV_BSHD_BSHD_BSHD; i < AL_QKV_LAYOUT_COUNT; i++)
        if (strcmp(name, LAYOUTS[i].name) == 0) {
            *paged = i;
            return AL_OK;
        }
    return al_error(AL_ERR_ARG, "qkv_layout_paged: a paged KV cache needs separate q/k/v (sbhd/bshd kv formats), "
                                "and '%s' has no paged_kv_ form", LAYOUTS[layout].name);
}

/* ---- shared helpers --------------------------------------------------------------------------- */

static int rank_of(int32_t plain_format) { return plain_format == F_THD ? 3 : 4; }

/* "(a, b, c)", TE's tuple style, for messages. */
static const char *tuple_str(int32_t n, const int64_t *v, char *buf, size_t len) {
    size_t used = 0;
    used += (size_t)snprintf(buf, len, "(");
    for (int32_t i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)v[i]);
    if (used < len) snprintf(buf + used, len - used, n == 1 ? ",)" : ")");
    return buf;
}

/* ---- the declarative path --------------------------------------------------------------------- */

#define OP "unpack_qkv"

/* Validation of the kv_layer path past TE's own checks (attnlab's extras), q = query_layer. */
static al_status check_kv_extras(const al_tensor *q, const al_tensor *kv, int32_t fmt, int32_t dim) {
    char b1[160], b2[160];
    int32_t qr = rank_of(fmt);
    if (q->ndim != qr)
        return al_error(AL_ERR_ARG, OP ": query_layer must be a %dD tensor for qkv_format='%s' (%s), got %dD "
                                   "(shape %s)", qr, FORMATS[fmt].name,
                        fmt == F_THD ? "[t, h, d]" : fmt == F_BSHD ? "[b, s, h, d]" : "[s, b, h, d]", q->ndim,
                        tuple_str(q->ndim, q->size, b1, sizeof b1));
    if (q->dtype != kv->dtype)
        return al_error(AL_ERR_ARG, OP ": kv_layer must have query_layer's dtype (%s), got %s",
                        al_dtype_name(q->dtype), al_dtype_name(kv->dtype));
    AL_TRY(al_check_same_device(OP " (query_layer, kv_layer)", q, kv));
    int32_t n = kv->ndim;
    int64_t hq = q->size[qr - 2], dq = q->size[qr - 1];
    int64_t hk = dim == -3 ? kv->size[n - 2] : kv->size[n - 3];
    int64_t dk = kv->size[n - 1];
    if (fmt != F_THD) {
        int32_t bdim = fmt == F_BSHD ? 0 : 1;
        if (q->size[bdim] != kv->size[bdim])
            return al_error(AL_ERR_ARG, OP ": query_layer and kv_layer must have the same batch size (dim %d of "
                                       "qkv_format='%s'), got %lld and %lld", bdim + 1, FORMATS[fmt].name,
                            (long long)q->size[bdim], (long long)kv->size[bdim]);
    }
    if (hk <= 0 || hq % hk != 0)
        return al_error(AL_ERR_ARG, OP ": the number of kv heads must divide the number of query heads (GQA), got "
                                   "%lld kv heads in kv_layer %s and %lld query heads in query_layer %s",
                        (long long)hk, tuple_str(n, kv->size, b1, sizeof b1), (long long)hq,
                        tuple_str(q->ndim, q->size, b2, sizeof b2));
    if (dq != dk)
        return al_error(AL_ERR_ARG, OP ": query_layer and kv_layer must have the same head dim (last dim), got %lld "
                                   "and %lld", (long long)dq, (long long)dk);
    return AL_OK;
}

/* Layout code from the declaration: pos = len(fmt) + dim + 1, digit n inserted there, "fmt_" in
 * front for KV (TE §2.3). Built without snprintf and looked up among the 12 packed layouts with
 * plain strcmp: this runs on every declared call (the Lua target is 2 us for the whole call). */
static al_status declared_layout(int32_t fmt, int32_t dim, int n, int32_t *layout) {
    const char *f = FORMATS[fmt].name;
    size_t len = strlen(f), pos = (size_t)((int32_t)len + dim + 1), at = 0;
    char name[32];
    if (n == 2) {
        memcpy(name, f, len);
        name[len] = '_';
        at = len + 1;
    }
    memcpy(name + at, f, pos);
    name[at + pos] = (char)('0' + n);
    memcpy(name + at + pos + 1, f + pos, len - pos + 1); /* with the NUL */
    for (int32_t row = 0; row < 3; row++)
        for (int32_t g = 0; g < 4; g++) {
            int32_t code = row * 5 + g; /* rows sbhd, bshd, thd of groups 3hd, h3d, hd_2hd, hd_h2d */
            if (strcmp(name, LAYOUTS[code].name) == 0) {
                *layout = code;
                return AL_OK;
            }
        }
    return al_error(AL_ERR_INTERNAL, "unpack_qkv: built an unknown layout '%s'", name);
}

static void release3(al_tensor *q, al_tensor *k, al_tensor *v) {
    al_tensor_release(q);
    al_tensor_release(k);
    al_tensor_release(v);
}

al_status al_qkv_unpack(const al_qkv_unpack_args *a, al_tensor *q, al_tensor *k, al_tensor *v, int32_t *layout) {
    char b1[160], b2[160];
    if (q) memset(q, 0, sizeof *q);
    if (k) memset(k, 0, sizeof *k);
    if (v) memset(v, 0, sizeof *v);
    if (layout) *layout = AL_QKV_LAYOUT_NONE;
    if (!a || !q || !k || !v || !layout) return al_error(AL_ERR_ARG, OP ": args and outputs must not be NULL");

    static const char *const names[5] = {"qkv_layer", "kv_layer", "query_layer", "key_layer", "value_layer"};
    const al_tensor *given[5] = {a->qkv_layer, a->kv_layer, a->query_layer, a->key_layer, a->value_layer};
    for (int i = 0; i < 5; i++)
        if (given[i] && !given[i]->storage)
            return al_error(AL_ERR_ARG, OP ": %s: expected a tensor, got a released tensor", names[i]);

    /* 1. Nothing packed: q/k/v all required; layout left to detection (TE returns None). */
    if (!a->qkv_layer && !a->kv_layer) {
        for (int i = 2; i < 5; i++)
            if (!given[i])
                return al_error(AL_ERR_ARG, OP ": query_layer, key_layer and value_layer are required unless packed "
                                           "inputs (qkv_layer or kv_layer) are provided; %s is missing", names[i]);
        AL_TRY(al_tensor_alias(q, a->query_layer));
        al_status st = al_tensor_alias(k, a->key_layer);
        if (st == AL_OK) st = al_tensor_alias(v, a->value_layer);
        if (st != AL_OK) release3(q, k, v);
        return st;
    }
    /* 2. */
    if (a->qkv_layer && a->kv_layer)
        return al_error(AL_ERR_ARG, OP ": qkv_layer and kv_layer are mutually exclusive; pass qkv_layer for packed "
                                   "Q, K and V, or kv_layer with query_layer for packed K and V");
    const char *pname = a->qkv_layer ? "qkv_layer" : "kv_layer";
    const al_tensor *p = a->qkv_layer ? a->qkv_layer : a->kv_layer;
    /* 3. */
    if (a->has_kv_cache)
        return al_error(AL_ERR_ARG, OP ": packed inputs (qkv_layer/kv_layer) are not supported with KV caching "
                                   "(inference_params); pass separate query_layer, key_layer and value_layer "
                                   "tensors instead");
    /* 4. */
    int32_t dim = a->qkv_interleave_dim;
    if (dim != -3 && dim != -2)
        return al_error(AL_ERR_ARG, OP ": qkv_interleave_dim must be -3 (e.g. bs3hd) or -2 (e.g. bsh3d), got %d",
                        dim);
    /* 5. The only memory check TE makes; every backend here takes real strides for the rest. */
    if (p->ndim < 1 || p->stride[p->ndim - 1] != 1)
        return al_error(AL_ERR_ARG, OP ": the packed tensor %s must have stride 1 in its last dimension, got "
                                   "strides %s", pname, tuple_str(p->ndim, p->stride, b1, sizeof b1));
    /* attnlab: the layout string is built from qkv_format, which must then be a plain format. */
    int32_t fmt = a->qkv_format;
    if (fmt != F_SBHD && fmt != F_BSHD && fmt != F_THD)
        return al_error(AL_ERR_ARG, OP ": qkv_format must be 'sbhd', 'bshd' or 'thd' with packed inputs, got %s%s%s",
                        al_qkv_format_name(fmt) ? "'" : "code ",
                        al_qkv_format_name(fmt) ? al_qkv_format_name(fmt) : (snprintf(b2, sizeof b2, "%d", fmt), b2),
                        al_qkv_format_name(fmt) ? "'" : "");
    int32_t n = p->ndim;
    if (a->qkv_layer) {
        /* 6. */
        for (int i = 2; i < 5; i++)
            if (given[i])
                return al_error(AL_ERR_ARG, OP ": qkv_layer already packs Q, K and V: query_layer, key_layer and "
                                           "value_layer must be nil (got %s)", names[i]);
        int32_t want = rank_of(fmt) + 1;
        if (n != want)
            return al_error(AL_ERR_ARG, OP ": qkv_layer must be a %dD tensor for qkv_format='%s', got %dD (shape %s)",
                            want, FORMATS[fmt].name, n, tuple_str(n, p->size, b1, sizeof b1));
        if (p->size[n + dim] != 3)
            return al_error(AL_ERR_ARG, OP ": qkv_layer must have size 3 at dim %d (qkv_interleave_dim), got shape %s",
                            dim, tuple_str(n, p->size, b1, sizeof b1));
        AL_TRY(declared_layout(fmt, dim, 3, layout));
        al_status st = al_tensor_select(q, p, n + dim, 0);
        if (st == AL_OK) st = al_tensor_select(k, p, n + dim, 1);
        if (st == AL_OK) st = al_tensor_select(v, p, n + dim, 2);
        if (st != AL_OK) {
            release3(q, k, v);
            *layout = AL_QKV_LAYOUT_NONE;
        }
        return st;
    }
    /* 7. kv_layer */
    if (!a->query_layer)
        return al_error(AL_ERR_ARG, OP ": kv_layer packs only K and V: query_layer is required together with kv_layer");
    if (a->key_layer || a->value_layer)
        return al_error(AL_ERR_ARG, OP ": kv_layer already packs K and V: key_layer and value_layer must be nil "
                                   "(got %s)", a->key_layer ? "key_layer" : "value_layer");
    const al_tensor *ql = a->query_layer;
    if (n != ql->ndim + 1)
        return al_error(AL_ERR_ARG, OP ": kv_layer must have one more dimension than query_layer, got kv_layer %dD "
                                   "(shape %s) and query_layer %dD (shape %s)", n, tuple_str(n, p->size, b1, sizeof b1),
                        ql->ndim, tuple_str(ql->ndim, ql->size, b2, sizeof b2));
    if (n + dim < 0 || p->size[n + dim] != 2)
        return al_error(AL_ERR_ARG, OP ": kv_layer must have size 2 at dim %d (qkv_interleave_dim), got shape %s", dim,
                        tuple_str(n, p->size, b1, sizeof b1));
    AL_TRY(check_kv_extras(ql, p, fmt, dim));
    AL_TRY(declared_layout(fmt, dim, 2, layout));
    al_status st = al_tensor_alias(q, ql);
    if (st == AL_OK) st = al_tensor_select(k, p, n + dim, 0);
    if (st == AL_OK) st = al_tensor_select(v, p, n + dim, 1);
    if (st != AL_OK) {
        release3(q, k, v);
        *layout = AL_QKV_LAYOUT_NONE;
    }
    return st;
}

#undef OP

/* ---- the legacy path: detection --------------------------------------------------------------- */

#define OP "detect_layout"

static int64_t g_detect_calls;

int64_t al_layout_detect_calls(void) { return __atomic_load_n(&g_detect_calls, __ATOMIC_RELAXED); }

static int same_shape(const al_tensor *a, const al_tensor *b, int32_t upto_from_end) {
    if (a->ndim != b->ndim) return 0;
    for (int32_t i = 0; i < a->ndim - upto_from_end; i++)
        if (a->size[i] != b->size[i]) return 0;
    return 1;
}

static int same_strides(const al_tensor *a, const al_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int32_t i = 0; i < a->ndim; i++)
        if (a->stride[i] != b->stride[i]) return 0;
    return 1;
}

/* Would the packed buffer implied by x (one of its selects) with an extra dim of `count` entries and
 * stride `step` address every element once? A sufficient test: sorted by stride, each stride exceeds
 * the furthest reach of the smaller ones. A packing that fails it (views that overlap one another)
 * is not called packed: it is read as separate tensors with real strides. */
static int packing_is_disjoint(const al_tensor *x, int64_t count, int64_t step) {
    int64_t sz[AL_MAX_DIMS + 1], st[AL_MAX_DIMS + 1];
    int m = 0;
    for (int32_t i = 0; i <= x->ndim; i++) {
        int64_t z = i < x->ndim ? x->size[i] : count, s = i < x->ndim ? x->stride[i] : step;
        if (z == 0) return 1; /* empty: nothing to collide */
        if (z == 1) continue;
        if (s <= 0) return 0;
        int k = m++;
        while (k > 0 && st[k - 1] > s) {
            st[k] = st[k - 1];
            sz[k] = sz[k - 1];
            k--;
        }
        st[k] = s;
        sz[k] = z;
    }
    int64_t reach = 0;
    for (int i = 0; i < m; i++) {
        if (st[i] <= reach) return 0;
        reach += (sz[i] - 1) * st[i];
    }
    return 1;
}

/* Where an interleave dim of stride `step` sits in x = [outer..., h, d] (one select of the packing):
 * -3 (between the outer dims and h: 3hd/2hd), -2 (between h and d: h3d/h2d) or 0 (neither: e.g.
 * consecutive whole tensors, which are separate chunks). TE compares absolute offsets with h*d and d,
 * which only a contiguous buffer at offset 0 meets; ordering by strides is the same decision for
 * that buffer, and also holds for slices, padded rows and buffers at any offset. With one head the
 * two places are the same memory and TE's first match, -3, wins. */
static int32_t interleave_place(const al_tensor *x, int64_t step) {
    int32_t n = x->ndim;
    if (step <= 0) return 0;
    for (int32_t i = 0; i < n - 2; i++)
        if (x->size[i] > 1 && step >= x->stride[i]) return 0;
    int64_t h = x->size[n - 2], sh = x->stride[n - 2];
    if (h == 1 || step > sh) return -3;
    if (step < sh) return -2;
    return 0;
}

al_status al_qkv_detect(const al_tensor *q, const al_tensor *k, const al_tensor *v, int32_t qkv_format,
                        int32_t *layout, int32_t *packed) {
    __atomic_add_fetch(&g_detect_calls, 1, __ATOMIC_RELAXED);
    char b1[160], b2[160];
    if (layout) *layout = AL_QKV_LAYOUT_NONE;
    if (packed) *packed = 0;
    if (!layout || !packed) return al_error(AL_ERR_ARG, OP ": layout and packed must not be NULL");
    AL_TRY(al_check_tensor(OP, "query_layer", q));
    AL_TRY(al_check_tensor(OP, "key_layer", k));
    AL_TRY(al_check_tensor(OP, "value_layer", v));
    int32_t qf, kvf;
    if (qkv_format < 0 || qkv_format >= AL_QKV_FORMAT_COUNT)
        return al_error(AL_ERR_ARG, OP ": qkv_format: unknown format code %d", qkv_format);
    al_qkv_format_split(qkv_format, &qf, &kvf);

    /* TE §1.3 step 1, naming the tensor. */
    const al_tensor *t3[3] = {q, k, v};
    static const char *const names[3] = {"query_layer", "key_layer", "value_layer"};
    for (int i = 0; i < 3; i++) {
        const al_tensor *x = t3[i];
        if (x->ndim < 1 || x->stride[x->ndim - 1] != 1)
            return al_error(AL_ERR_ARG, OP ": q, k and v must have stride 1 in their last dimension, got %s with "
                                       "strides %s (make it contiguous with :contiguous())", names[i],
                            tuple_str(x->ndim, x->stride, b1, sizeof b1));
    }
    /* attnlab: ranks must fit the formats (TE would index wrong dims). */
    for (int i = 0; i < 3; i++) {
        int32_t f = i == 0 ? qf : kvf, r = rank_of(f);
        if (t3[i]->ndim != r)
            return al_error(AL_ERR_ARG, OP ": %s must be a %dD tensor for %s format '%s', got %dD (shape %s)",
                            names[i], r, i == 0 ? "q" : "kv", FORMATS[f].name, t3[i]->ndim,
                            tuple_str(t3[i]->ndim, t3[i]->size, b1, sizeof b1));
    }
    /* TE's predicates (run_iteratively); offsets relative to the first tensor of the packing. */
    int ptrs_qkv = al_tensor_same_storage(q, k) && al_tensor_same_storage(q, v);
    int ptrs_kv = al_tensor_same_storage(k, v);
    int shapes_qkv = same_shape(q, k, 0) && same_shape(q, v, 0);
    int shapes_kv = same_shape(k, v, 1);
    int strides_qkv = same_strides(q, k) && same_strides(q, v);
    int nonempty = al_tensor_numel(q) > 0 && al_tensor_numel(k) > 0;

    if (qf == kvf && nonempty) {
        /* Packed QKV: three selects of one buffer have one storage, shape and strides, and sit at
         * q.offset + i * step. */
        int64_t step = k->offset - q->offset;
        if (ptrs_qkv && strides_qkv && shapes_qkv && v->offset - q->offset == 2 * step) {
            int32_t place = interleave_place(q, step);
            if (place != 0 && packing_is_disjoint(q, 3, step)) {
                static const int32_t L3[3][2] = {{AL_QKV_LAYOUT_SB3HD, AL_QKV_LAYOUT_SBH3D},
                                                 {AL_QKV_LAYOUT_BS3HD, AL_QKV_LAYOUT_BSH3D},
                                                 {AL_QKV_LAYOUT_T3HD, AL_QKV_LAYOUT_TH3D}};
                *layout = L3[qf][place == -3 ? 0 : 1];
                *packed = 1;
                return AL_OK;
            }
        }
        /* Packed KV: TE accepts k/v strides equal up to the head dim ratio; two selects of one
         * buffer have identical shapes and strides, so that is required here. */
        if (ptrs_kv && same_shape(k, v, 0) && same_strides(k, v)) {
            int64_t step2 = v->offset - k->offset;
            int32_t place = interleave_place(k, step2);
            if (place != 0 && packing_is_disjoint(k, 2, step2)) {
                static const int32_t L2[3][2] = {{AL_QKV_LAYOUT_SBHD_SB2HD, AL_QKV_LAYOUT_SBHD_SBH2D},
                                                 {AL_QKV_LAYOUT_BSHD_BS2HD, AL_QKV_LAYOUT_BSHD_BSH2D},
                                                 {AL_QKV_LAYOUT_THD_T2HD, AL_QKV_LAYOUT_THD_TH2D}};
                *layout = L2[qf][place == -3 ? 0 : 1];
                *packed = 1;
                return AL_OK;
            }
        }
    }
    /* Separate q, k, v: any offsets and strides (TE demands canonical offsets, copies, then raises);
     * k and v must still agree on every dim but the head dim. */
    if (!shapes_kv)
        return al_error(AL_ERR_ARG, OP ": key_layer and value_layer must have the same shape except the head dim "
                                   "(last dim), got %s and %s", tuple_str(k->ndim, k->size, b1, sizeof b1),
                        tuple_str(v->ndim, v->size, b2, sizeof b2));
    if (qf == kvf) {
        *layout = qf == F_SBHD ? AL_QKV_LAYOUT_SBHD_SBHD_SBHD
                  : qf == F_BSHD ? AL_QKV_LAYOUT_BSHD_BSHD_BSHD : AL_QKV_LAYOUT_THD_THD_THD;
    } else {
        char name[32];
        snprintf(name, sizeof name, "%s_%s_%s", FORMATS[qf].name, FORMATS[kvf].name, FORMATS[kvf].name);
        if (al_qkv_layout_parse(name, layout) != AL_OK)
            return al_error(AL_ERR_ARG, OP ": qkv_format '%s' has no layout: TransformerEngine's mixed layouts are "
                                       "sbhd_bshd_bshd, bshd_sbhd_sbhd, thd_bshd_bshd and thd_sbhd_sbhd",
                            FORMATS[qkv_format].name);
    }
    return AL_OK;
}

#undef OP
