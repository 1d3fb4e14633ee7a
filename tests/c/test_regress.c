/*
 * test_regress.c — regression tests for the bugs found by the sanitizers and fuzzers (issue 11,
 * docs/RELIABILITY.md lists each finding). Each test replays the minimised input; some only fail
 * visibly under `make test-asan` (the sanitizers flag the bad access), the rest fail in plain builds.
 */
#include "test_main.h"
#include <math.h>
#include <stdint.h>

static al_tensor mk(int32_t nd, const int64_t *s, int32_t dtype) {
    al_tensor t;
    memset(&t, 0, sizeof t);
    al_tensor_empty(&t, nd, s, dtype, AL_DEVICE_CPU, 0);
    al_tensor_random_at_(&t, AL_RANDOM_NORMAL, 7, 0);
    return t;
}

/* fuzz_views: as_strided's reach (size-1)*stride summed without overflow checks wrapped negative and
 * passed the bounds test, giving a view far outside its storage. */
static void test_as_strided_overflow(void) {
    int64_t n = 16, sz[3] = {2, 2, 2}, st[3] = {(int64_t)1 << 62, (int64_t)1 << 62, (int64_t)1 << 62};
    al_tensor t = mk(1, &n, AL_DTYPE_F32), out;
    CHECK_ERR(al_tensor_as_strided(&out, &t, 3, sz, st, 0), AL_ERR_ARG, "as_strided");
    CHECK(out.storage == NULL, "out not zeroed");
    int64_t sz2[2] = {INT64_MAX / 2, 5}, st2[2] = {0, INT64_MAX / 2};
    CHECK_ERR(al_tensor_as_strided(&out, &t, 2, sz2, st2, 0), AL_ERR_ARG, "as_strided");
    al_tensor_release(&t);
}

/* fuzz_views: narrow's start + length overflowed int64 and passed the range check. */
static void test_narrow_overflow(void) {
    int64_t n = 4;
    al_tensor t = mk(1, &n, AL_DTYPE_F32), out;
    CHECK_ERR(al_tensor_narrow(&out, &t, 0, 2, INT64_MAX), AL_ERR_ARG, "narrow");
    CHECK_ERR(al_tensor_narrow(&out, &t, 0, ((int64_t)1 << 62) + 1, ((int64_t)1 << 62) + 1), AL_ERR_ARG, "narrow");
    CHECK_ERR(al_tensor_narrow(&out, &t, 0, INT64_MAX, 1), AL_ERR_ARG, "narrow");
    CHECK_OK(al_tensor_narrow(&out, &t, 0, 4, 0)); /* the empty range at the end stays valid */
    al_tensor_release(&out);
    al_tensor_release(&t);
}

/* fuzz_views: expand accepted shapes whose element count overflows int64 (numel then overflowed). */
static void test_expand_overflow(void) {
    int64_t s11[2] = {1, 1}, big[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
    al_tensor t = mk(2, s11, AL_DTYPE_F32), out;
    CHECK_ERR(al_tensor_expand(&out, &t, 2, big), AL_ERR_ARG, "overflows");
    int64_t ok[2] = {(int64_t)1 << 40, 3};
    CHECK_OK(al_tensor_expand(&out, &t, 2, ok));
    CHECK(al_tensor_numel(&out) == ((int64_t)3 << 40), "numel");
    al_tensor_release(&out);
    al_tensor_release(&t);
}

/* fuzz_views (UBSan): messages printed dim + 1 in int, overflowing for dim = INT32_MAX; contiguous
 * strides of an empty shape with huge extents overflowed. */
static void test_hostile_dims_and_empty_strides(void) {
    int64_t n = 3;
    al_tensor t = mk(1, &n, AL_DTYPE_F32), out;
    CHECK_ERR(al_tensor_select(&out, &t, INT32_MAX, 0), AL_ERR_ARG, "dim 2147483648");
    CHECK_ERR(al_tensor_select(&out, &t, 0, INT64_MAX), AL_ERR_ARG, "select");
    int32_t perm[1] = {INT32_MAX};
    CHECK_ERR(al_tensor_permute(&out, &t, 1, perm), AL_ERR_ARG, "dim 2147483648");
    al_tensor_release(&t);
    int64_t z = 0, shape[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
    al_tensor e = mk(1, &z, AL_DTYPE_F32);
    CHECK_OK(al_tensor_view(&out, &e, 3, shape));
    CHECK(al_tensor_numel(&out) == 0, "numel");
    al_tensor_release(&out);
    al_tensor_release(&e);
}

static al_attn_params bshd_params(void) {
    al_attn_params p;
    al_attn_params_init(&p);
    p.qkv_format = AL_ATTN_FORMAT_BSHD;
    p.mask_type = AL_ATTN_MASK_NO_MASK;
    return p;
}

/* test-asan (busted): choose() memcpy'd 16 bytes from the forced backend name, reading past "" and
 * short getenv() strings. A 16-byte name without a NUL must be read as 16 bytes, no more. */
static void test_backend_name_bounds(void) {
    int64_t s[4] = {1, 2, 1, 4};
    al_tensor q = mk(4, s, AL_DTYPE_F32), k = mk(4, s, AL_DTYPE_F32), v = mk(4, s, AL_DTYPE_F32), out, lse;
    al_attn_params p = bshd_params();
    al_attn_inputs in = {.q = &q, .k = &k, .v = &v};
    CHECK_OK(al_attn_forward(&p, &in, &out, &lse, NULL)); /* backend "" */
    al_tensor_release(&out);
    al_tensor_release(&lse);
    memset(p.backend, 'x', sizeof p.backend);
    CHECK_ERR(al_attn_forward(&p, &in, &out, &lse, NULL), AL_ERR_ARG, "backend 'xxxxxxxxxxxxxxxx' (");
    al_tensor_release(&q);
    al_tensor_release(&k);
    al_tensor_release(&v);
}

/* test-asan (busted): the thd "tokens but only slots" error read cu_seqlens after freeing them. */
static void test_thd_padded_error_after_free(void) {
    int64_t s[3] = {6, 2, 4}, nb = 3;
    al_tensor q = mk(3, s, AL_DTYPE_F32), k = mk(3, s, AL_DTYPE_F32), v = mk(3, s, AL_DTYPE_F32), out, lse;
    al_tensor cu = mk(1, &nb, AL_DTYPE_I32), cup = mk(1, &nb, AL_DTYPE_I32);
    double cuv[3] = {0, 3, 6}, cupv[3] = {0, 2, 6};
    al_tensor_write_f64(&cu, cuv, 3);
    al_tensor_write_f64(&cup, cupv, 3);
    al_attn_params p = bshd_params();
    p.qkv_format = AL_ATTN_FORMAT_THD;
    p.mask_type = AL_ATTN_MASK_PADDING;
    al_attn_inputs in = {.q = &q, .k = &k, .v = &v, .cu_seqlens_q = &cu, .cu_seqlens_kv = &cu, .cu_seqlens_q_padded = &cup};
    CHECK_ERR(al_attn_forward(&p, &in, &out, &lse, NULL), AL_ERR_ARG, "sequence 0 has 3 tokens in cu_seqlens_q but only 2 slots");
    al_tensor_release(&q);
    al_tensor_release(&k);
    al_tensor_release(&v);
    al_tensor_release(&cu);
    al_tensor_release(&cup);
}

/* fuzz_attn_args: ALiBi with batch 0 wrote h default slopes into a 1-float buffer, and read h given
 * slopes into a 0-double buffer (heap overflows). An empty batch is a valid, empty call. */
static void test_alibi_empty_batch(void) {
    int64_t s[4] = {0, 3, 4, 2};
    al_tensor q = mk(4, s, AL_DTYPE_F32), k = mk(4, s, AL_DTYPE_F32), v = mk(4, s, AL_DTYPE_F32), out, lse;
    int64_t h = 4;
    al_tensor slopes = mk(1, &h, AL_DTYPE_F32);
    al_attn_params p = bshd_params();
    p.bias_type = AL_ATTN_BIAS_ALIBI;
    al_attn_inputs in = {.q = &q, .k = &k, .v = &v};
    CHECK_OK(al_attn_forward(&p, &in, &out, &lse, NULL));
    CHECK(al_tensor_numel(&out) == 0, "empty output");
    al_tensor_release(&out);
    al_tensor_release(&lse);
    in.alibi_slopes = &slopes;
    CHECK_OK(al_attn_forward(&p, &in, &out, &lse, NULL));
    al_tensor_release(&out);
    al_tensor_release(&lse);
    al_tensor_release(&slopes);
    al_tensor_release(&q);
    al_tensor_release(&k);
    al_tensor_release(&v);
}

/* fuzz_views (timeout): copy_ into an expanded destination (stride 0) wrote every element of a
 * [2^40]-sized view into one address; such a destination is now an error. */
static void test_copy_into_expanded(void) {
    int64_t one = 1, big = (int64_t)1 << 40;
    al_tensor t = mk(1, &one, AL_DTYPE_F32), e, src = mk(1, &one, AL_DTYPE_F32);
    CHECK_OK(al_tensor_expand(&e, &t, 1, &big));
    CHECK_ERR(al_tensor_copy_(&e, &src), AL_ERR_ARG, "share memory");
    al_tensor_release(&e);
    al_tensor_release(&t);
    al_tensor_release(&src);
}

/* fuzz_views (found in a CI fuzz run): an empty tensor may carry any stride (an extent of 0 elsewhere),
 * so select/narrow's index * stride overflowed (UBSan). The offset of an empty view now stays put. */
static void test_select_on_empty_huge_stride(void) {
    int64_t sz[2] = {9, 0};
    al_tensor base = mk(2, sz, AL_DTYPE_F32), e, s, w;
    /* the descriptor the fuzzer reached through a chain of views, written directly */
    CHECK_OK(al_tensor_alias(&e, &base));
    e.stride[0] = INT64_MAX;
    e.offset = 1;
    CHECK_OK(al_tensor_select(&s, &e, 0, 8));
    CHECK(s.offset == 1 && s.ndim == 1 && s.size[0] == 0, "empty select keeps its offset: %lld", (long long)s.offset);
    CHECK_OK(al_tensor_narrow(&w, &e, 0, 8, 1));
    CHECK(w.offset == 1 && w.size[0] == 1, "empty narrow keeps its offset: %lld", (long long)w.offset);
    al_tensor_release(&s);
    al_tensor_release(&w);
    /* unsqueeze's new stride, size * stride, overflowed the same way */
    al_tensor u;
    e.size[0] = (int64_t)1 << 40;
    CHECK_OK(al_tensor_unsqueeze(&u, &e, 0));
    CHECK(u.ndim == 3 && u.size[0] == 1 && u.stride[1] == INT64_MAX, "unsqueeze of an empty huge-stride view");
    al_tensor_release(&u);
    al_tensor_release(&e);
    al_tensor_release(&base);
}

/* copy_'s overlap check took an empty destination's extent times stride before it reached the empty dim
 * (fuzz_views, a CI run: signed overflow under UBSan); copying into an empty view does nothing */
static void test_copy_into_empty_huge_stride(void) {
    int64_t sz[2] = {4, 0};
    al_tensor base = mk(2, sz, AL_DTYPE_F32), dst, src;
    CHECK_OK(al_tensor_alias(&dst, &base));
    dst.size[0] = (int64_t)1 << 40;
    dst.stride[0] = INT64_MAX;
    CHECK_OK(al_tensor_alias(&src, &base));
    src.size[0] = 1;   /* broadcast over dst's first dim: a different view of the same storage */
    CHECK_OK(al_tensor_copy_(&dst, &src));
    CHECK(al_tensor_numel(&dst) == 0, "the destination stays empty");
    al_tensor_release(&src);
    al_tensor_release(&dst);
    al_tensor_release(&base);
}

int main(void) {
    int64_t live0 = al_storage_live_count();
    RUN(test_as_strided_overflow);
    RUN(test_narrow_overflow);
    RUN(test_expand_overflow);
    RUN(test_hostile_dims_and_empty_strides);
    RUN(test_backend_name_bounds);
    RUN(test_thd_padded_error_after_free);
    RUN(test_alibi_empty_batch);
    RUN(test_copy_into_expanded);
    RUN(test_select_on_empty_huge_stride);
    RUN(test_copy_into_empty_huge_stride);
    if (al_storage_live_count() != live0) {
        fprintf(stderr, "FAIL leak: %lld storages live, %lld before\n", (long long)al_storage_live_count(), (long long)live0);
        t_failed++;
    }
    return SUMMARY("regress");
}
