/*
 * test_tensor.c — the tensor runtime: creation, refcounting, views, copies, errors, accounting.
 */
#include "test_main.h"
#include "../../src/internal.h"

static void fill_iota(al_tensor *t) {
    int64_t n = al_tensor_numel(t);
    double buf[4096];
    for (int64_t i = 0; i < n; i++) buf[i] = (double)(i * 7 % 13) - 5.5;
    al_tensor_write_f64(t, buf, n);
}

static double at(const al_tensor *t, int64_t i0, int64_t i1, int64_t i2) {
    int64_t idx[3] = {i0, i1, i2};
    int64_t off = t->offset;
    for (int32_t d = 0; d < t->ndim; d++) off += idx[d] * t->stride[d];
    return al_load_f64(t->data, t->dtype, off);
}

static void test_empty_and_release(void) {
    int64_t before = al_storage_live_count(), mem0 = al_memory_in_use(AL_DEVICE_CPU, 0);
    al_tensor t;
    CHECK_OK(al_tensor_empty(&t, 3, (int64_t[]){2, 3, 4}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK(al_tensor_numel(&t) == 24, "numel");
    CHECK(t.stride[0] == 12 && t.stride[1] == 4 && t.stride[2] == 1, "strides");
    CHECK(al_tensor_is_contiguous(&t), "contiguous");
    CHECK(al_memory_in_use(AL_DEVICE_CPU, 0) - mem0 == 96, "96 bytes accounted, got %lld",
          (long long)(al_memory_in_use(AL_DEVICE_CPU, 0) - mem0));
    CHECK(al_storage_live_count() == before + 1, "one live storage");
    al_tensor_release(&t);
    CHECK(t.storage == NULL, "released descriptor zeroed");
    al_tensor_release(&t); /* double release of a zeroed descriptor is a no-op */
    CHECK(al_storage_live_count() == before, "storage freed");
    CHECK(al_memory_in_use(AL_DEVICE_CPU, 0) == mem0, "bytes returned");
}

static void test_empty_errors(void) {
    al_tensor t;
    CHECK_ERR(al_tensor_empty(&t, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, AL_DTYPE_F32, 0, 0), AL_ERR_ARG, "0 to 8 dims");
    CHECK(t.storage == NULL, "out zeroed on error");
    CHECK_ERR(al_tensor_empty(&t, 2, (int64_t[]){3, -1}, AL_DTYPE_F32, 0, 0), AL_ERR_ARG, "non-negative");
    CHECK_ERR(al_tensor_empty(&t, 2, (int64_t[]){INT64_MAX / 2, 4}, AL_DTYPE_F32, 0, 0), AL_ERR_ARG, "overflows");
    CHECK_ERR(al_tensor_empty(&t, 1, (int64_t[]){4}, 42, 0, 0), AL_ERR_ARG, "dtype");
    /* host allocation failure is a status, not a crash: ask for 2^61 bytes */
    CHECK_ERR(al_tensor_empty(&t, 1, (int64_t[]){(int64_t)1 << 58}, AL_DTYPE_F64, 0, 0), AL_ERR_OOM, "out of host memory");
}

static void test_views_share_storage(void) {
    al_tensor t, s, n, tr, p;
    CHECK_OK(al_tensor_empty(&t, 3, (int64_t[]){2, 3, 4}, AL_DTYPE_F64, AL_DEVICE_CPU, 0));
    fill_iota(&t);
    CHECK_OK(al_tensor_select(&s, &t, 1, 2));
    CHECK(s.ndim == 2 && s.size[0] == 2 && s.size[1] == 4 && s.offset == 8, "select shape/offset");
    CHECK(s.stride[0] == 12 && s.stride[1] == 1, "select strides");
    CHECK(al_tensor_storage_refcount(&t) == 2, "view retains storage");
    CHECK(at(&s, 1, 3, 0) == at(&t, 1, 2, 3), "select values");
    CHECK_OK(al_tensor_narrow(&n, &t, 2, 1, 2));
    CHECK(n.size[2] == 2 && n.offset == 1 && at(&n, 1, 2, 1) == at(&t, 1, 2, 2), "narrow");
    CHECK_OK(al_tensor_transpose(&tr, &t, 0, 2));
    CHECK(tr.size[0] == 4 && tr.stride[0] == 1 && at(&tr, 3, 1, 0) == at(&t, 0, 1, 3), "transpose");
    CHECK(!al_tensor_is_contiguous(&tr), "transposed is not contiguous");
    CHECK_OK(al_tensor_permute(&p, &t, 3, (int32_t[]){2, 0, 1}));
    CHECK(p.size[0] == 4 && p.size[1] == 2 && p.size[2] == 3 && at(&p, 2, 1, 0) == at(&t, 1, 0, 2), "permute");
    /* freeing the base while views live is safe */
    al_tensor_release(&t);
    CHECK(at(&s, 0, 1, 0) == (double)((0 * 12 + 2 * 4 + 1) * 7 % 13) - 5.5, "view still readable after base release");
    al_tensor_release(&s);
    al_tensor_release(&n);
    al_tensor_release(&tr);
    CHECK(al_tensor_storage_refcount(&p) == 1, "last view holds the only ref");
    al_tensor_release(&p);
}

static void test_view_errors(void) {
    al_tensor t, o;
    CHECK_OK(al_tensor_empty(&t, 2, (int64_t[]){3, 4}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_ERR(al_tensor_select(&o, &t, 1, 4), AL_ERR_ARG, "select: index 5 out of range for dim 2 of size 4");
    CHECK_ERR(al_tensor_select(&o, &t, 2, 0), AL_ERR_ARG, "dim 3 out of range");
    CHECK_ERR(al_tensor_narrow(&o, &t, 0, 2, 2), AL_ERR_ARG, "narrow");
    CHECK_ERR(al_tensor_permute(&o, &t, 2, (int32_t[]){0, 0}), AL_ERR_ARG, "appears twice");
    CHECK_ERR(al_tensor_view(&o, &t, 1, (int64_t[]){5}), AL_ERR_ARG, "invalid for a tensor of 12 elements");
    CHECK_ERR(al_tensor_expand(&o, &t, 2, (int64_t[]){3, 5}), AL_ERR_ARG, "cannot expand");
    CHECK_ERR(al_tensor_as_strided(&o, &t, 1, (int64_t[]){13}, (int64_t[]){1}, 0), AL_ERR_ARG, "storage holds 12");
    al_tensor released;
    memset(&released, 0, sizeof released);
    CHECK_ERR(al_tensor_select(&o, &released, 0, 0), AL_ERR_ARG, "released tensor");
    al_tensor_release(&t);
}

static void test_view_reshape(void) {
    al_tensor t, tr, v, r;
    int32_t copied = -1;
    CHECK_OK(al_tensor_empty(&t, 3, (int64_t[]){2, 3, 4}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    fill_iota(&t);
    CHECK_OK(al_tensor_view(&v, &t, 2, (int64_t[]){6, -1}));
    CHECK(v.size[1] == 4 && v.stride[0] == 4, "view infers -1");
    al_tensor_release(&v);
    /* a view of a transposed tensor that merges non-adjacent dims is impossible */
    CHECK_OK(al_tensor_transpose(&tr, &t, 1, 2));
    CHECK_ERR(al_tensor_view(&v, &tr, 1, (int64_t[]){24}), AL_ERR_ARG, "cannot be a view");
    /* but splitting the outer dim of the transposed tensor is a view */
    CHECK_OK(al_tensor_view(&v, &tr, 4, (int64_t[]){1, 2, 4, 3}));
    CHECK(v.stride[2] == 1 && v.stride[3] == 4, "view keeps transposed strides");
    al_tensor_release(&v);
    CHECK_OK(al_tensor_reshape(&r, &tr, 1, (int64_t[]){24}, &copied));
    CHECK(copied == 1 && !al_tensor_same_storage(&r, &t), "reshape copied");
    CHECK(al_load_f64(r.data, r.dtype, 1) == at(&t, 0, 1, 0), "reshape copy order is row-major of the view");
    al_tensor_release(&r);
    CHECK_OK(al_tensor_reshape(&r, &t, 1, (int64_t[]){24}, &copied));
    CHECK(copied == 0 && al_tensor_same_storage(&r, &t), "reshape viewed");
    al_tensor_release(&r);
    al_tensor_release(&tr);
    al_tensor_release(&t);
}

static void test_expand_squeeze(void) {
    al_tensor t, e, u, s;
    CHECK_OK(al_tensor_empty(&t, 2, (int64_t[]){3, 1}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_expand(&e, &t, 3, (int64_t[]){2, 3, 5}));
    CHECK(e.stride[0] == 0 && e.stride[2] == 0 && e.stride[1] == 1, "expand strides");
    CHECK_OK(al_tensor_unsqueeze(&u, &t, 0));
    CHECK(u.ndim == 3 && u.size[0] == 1 && u.size[1] == 3, "unsqueeze");
    CHECK_OK(al_tensor_squeeze(&s, &u, -1));
    CHECK(s.ndim == 1 && s.size[0] == 3, "squeeze all");
    al_tensor_release(&s);
    CHECK_OK(al_tensor_unsqueeze(&s, &t, 2));
    CHECK(s.ndim == 3 && s.size[2] == 1 && s.stride[2] == 1, "unsqueeze at the end");
    al_tensor_release(&s);
    al_tensor_release(&u);
    al_tensor_release(&e);
    al_tensor_release(&t);
}

static void test_copy_convert(void) {
    al_tensor a, b, c, tr;
    CHECK_OK(al_tensor_empty(&a, 2, (int64_t[]){3, 5}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    fill_iota(&a);
    CHECK_OK(al_tensor_transpose(&tr, &a, 0, 1));
    CHECK_OK(al_tensor_to(&b, &tr, AL_DTYPE_F64, AL_DEVICE_CPU, 0));
    CHECK(al_tensor_is_contiguous(&b) && b.size[0] == 5, "to() gives contiguous");
    CHECK(at(&b, 4, 2, 0) == at(&a, 2, 4, 0), "transposed copy values");
    CHECK_OK(al_tensor_to(&c, &b, AL_DTYPE_BF16, AL_DEVICE_CPU, 0));
    CHECK(at(&c, 1, 1, 0) == at(&b, 1, 1, 0), "small integers-and-halves survive bf16");
    /* broadcast copy: a row into every row */
    al_tensor row, dst;
    CHECK_OK(al_tensor_select(&row, &a, 0, 1));
    CHECK_OK(al_tensor_empty(&dst, 2, (int64_t[]){4, 5}, AL_DTYPE_F64, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_copy_(&dst, &row));
    CHECK(at(&dst, 3, 4, 0) == at(&a, 1, 4, 0), "broadcast copy");
    /* overlapping copy is refused */
    al_tensor n1, n2;
    CHECK_OK(al_tensor_narrow(&n1, &a, 1, 0, 3));
    CHECK_OK(al_tensor_narrow(&n2, &a, 1, 1, 3));
    CHECK_ERR(al_tensor_copy_(&n1, &n2), AL_ERR_ARG, "overlap");
    /* shape mismatch names both shapes */
    CHECK_ERR(al_tensor_copy_(&dst, &a), AL_ERR_ARG, "[3,5] cannot be broadcast to self of shape [4,5]");
    /* copying to a device that is not there fails cleanly */
    al_tensor g;
    al_status st = al_tensor_to(&g, &a, AL_DTYPE_F32, AL_DEVICE_CUDA, 0);
    if (st != AL_OK) {
        CHECK(st == AL_ERR_DEVICE && g.storage == NULL, "no GPU: device error, out zeroed");
    } else {
        al_tensor back;
        CHECK_OK(al_tensor_to(&back, &g, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
        CHECK(memcmp(back.data, a.data, 60) == 0, "round trip through the GPU");
        al_tensor_release(&back);
        al_tensor_release(&g);
    }
    al_tensor_release(&n1); al_tensor_release(&n2); al_tensor_release(&row); al_tensor_release(&dst);
    al_tensor_release(&a); al_tensor_release(&b); al_tensor_release(&c); al_tensor_release(&tr);
}

static void test_dtype_device_names(void) {
    int32_t d = -1, ty = -1, ix = -1;
    CHECK_OK(al_dtype_parse("bfloat16", &d));
    CHECK(d == AL_DTYPE_BF16, "alias");
    CHECK_ERR(al_dtype_parse("f17", &d), AL_ERR_ARG, "got 'f17'");
    CHECK_OK(al_device_parse("cuda:3", &ty, &ix));
    CHECK(ty == AL_DEVICE_CUDA && ix == 3, "cuda:3");
    CHECK_ERR(al_device_parse("gpu", &ty, &ix), AL_ERR_ARG, "got 'gpu'");
    CHECK(al_dtype_size(AL_DTYPE_FP8_E5M2) == 1 && al_dtype_size(AL_DTYPE_I64) == 8, "sizes");
    CHECK(al_sizeof("al_tensor") == (int64_t)sizeof(al_tensor) && al_sizeof("nope") == -1, "al_sizeof");
}

int main(void) {
    RUN(test_empty_and_release);
    RUN(test_empty_errors);
    RUN(test_views_share_storage);
    RUN(test_view_errors);
    RUN(test_view_reshape);
    RUN(test_expand_squeeze);
    RUN(test_copy_convert);
    RUN(test_dtype_device_names);
    CHECK(al_storage_live_count() == 0, "no storage leaked");
    return SUMMARY("tensor");
}
