/*
 * test_math.c — C-level tests of the Math section: broadcasting and promotion rules, al_iter over
 * permuted/expanded views (and al_iter_seek, which threads use to start mid-walk), the CPU ops on
 * strided inputs against loops written here, the comparison helpers' NaN rules, and the error paths
 * (released tensors, bad dims, shape mismatches) with messages that name the function. Every error
 * test also checks that the output is left zeroed and that no storage leaked.
 */
#include "test_main.h"
#include "internal.h"
#include "cpu/cpu_math.h"

#include <math.h>
#include <stdlib.h>

static void rand_tensor(al_tensor *t, int32_t ndim, const int64_t *size, int32_t dtype, uint64_t seed) {
    CHECK_OK(al_tensor_empty(t, ndim, size, dtype, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_random_at_(t, AL_RANDOM_NORMAL, seed, 0));
}

static double *read_all(const al_tensor *t) {
    int64_t n = al_tensor_numel(t);
    double *buf = malloc(sizeof(double) * (size_t)(n ? n : 1));
    CHECK_OK(al_tensor_read_f64(t, buf, n));
    return buf;
}

/* ---- broadcasting and promotion ------------------------------------------------------------------ */
static void test_broadcast_shapes(void) {
    int32_t nd;
    int64_t out[8];
    CHECK_OK(al_broadcast_shapes("add", 3, (int64_t[]){3, 1, 5}, 2, (int64_t[]){4, 5}, &nd, out));
    CHECK(nd == 3 && out[0] == 3 && out[1] == 4 && out[2] == 5, "got nd %d [%lld,%lld,%lld]", nd,
          (long long)out[0], (long long)out[1], (long long)out[2]);
    CHECK_OK(al_broadcast_shapes("add", 0, NULL, 2, (int64_t[]){2, 3}, &nd, out));
    CHECK(nd == 2 && out[0] == 2 && out[1] == 3, "scalar with [2,3] gives nd %d", nd);
    CHECK_OK(al_broadcast_shapes("add", 2, (int64_t[]){1, 0}, 1, (int64_t[]){1}, &nd, out));
    CHECK(nd == 2 && out[0] == 1 && out[1] == 0, "zero extent kept: [%lld,%lld]", (long long)out[0], (long long)out[1]);
    CHECK_ERR(al_broadcast_shapes("mul", 2, (int64_t[]){2, 3}, 1, (int64_t[]){4}, &nd, out), AL_ERR_ARG, "mul:");
    CHECK(strstr(al_last_error(), "[2,3]") && strstr(al_last_error(), "[4]"), "message names both shapes: %s",
          al_last_error());
}

static void test_promote(void) {
    struct { int32_t a, b, want; } cases[] = {
        {AL_DTYPE_F16, AL_DTYPE_BF16, AL_DTYPE_F32}, {AL_DTYPE_F32, AL_DTYPE_F64, AL_DTYPE_F64},
        {AL_DTYPE_F16, AL_DTYPE_F16, AL_DTYPE_F16}, {AL_DTYPE_BF16, AL_DTYPE_F32, AL_DTYPE_F32},
        {AL_DTYPE_I32, AL_DTYPE_F16, AL_DTYPE_F32}, {AL_DTYPE_I64, AL_DTYPE_F64, AL_DTYPE_F64},
        {AL_DTYPE_I32, AL_DTYPE_I64, AL_DTYPE_I64}, {AL_DTYPE_U8, AL_DTYPE_BOOL, AL_DTYPE_U8},
        {AL_DTYPE_FP8_E4M3, AL_DTYPE_F16, AL_DTYPE_F16}, {AL_DTYPE_FP8_E4M3, AL_DTYPE_FP8_E4M3, AL_DTYPE_F32},
        {AL_DTYPE_FP8_E4M3, AL_DTYPE_FP8_E5M2, AL_DTYPE_F32}, {AL_DTYPE_BOOL, AL_DTYPE_BF16, AL_DTYPE_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t got = al_promote_dtypes(cases[i].a, cases[i].b), rev = al_promote_dtypes(cases[i].b, cases[i].a);
        CHECK(got == cases[i].want && rev == cases[i].want, "%s with %s: got %s / %s, want %s",
              al_dtype_name(cases[i].a), al_dtype_name(cases[i].b), al_dtype_name(got), al_dtype_name(rev),
              al_dtype_name(cases[i].want));
    }
}

/* ---- al_iter ------------------------------------------------------------------------------------- */
static void test_iter_permuted_expanded(void) {
    /* t: [2,3,4] contiguous; p = permute(2,0,1) -> [4,2,3]; e: [3] expanded to [4,2,3] (strides 0,0,1) */
    al_tensor t = {0}, p = {0}, v = {0}, e = {0};
    CHECK_OK(al_tensor_empty(&t, 3, (int64_t[]){2, 3, 4}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_permute(&p, &t, 3, (int32_t[]){2, 0, 1}));
    CHECK_OK(al_tensor_empty(&v, 1, (int64_t[]){3}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_expand(&e, &v, 3, (int64_t[]){4, 2, 3}));
    al_iter it;
    al_iter_init(&it, 3, p.size, 2, (const int64_t *[]){p.stride, e.stride}, (int64_t[]){p.offset, e.offset});
    CHECK(it.numel == 24, "numel %lld", (long long)it.numel);
    int64_t pos = 0, bad = 0;
    for (int64_t i = 0; i < 4; i++)
        for (int64_t j = 0; j < 2; j++)
            for (int64_t k = 0; k < 3; k++, pos++, al_iter_next(&it)) {
                /* p[i][j][k] = t[j][k][i] at offset j*12 + k*4 + i; e[i][j][k] = v[k] */
                if (it.off[0] != j * 12 + k * 4 + i || it.off[1] != k) bad++;
            }
    CHECK(bad == 0, "%lld positions with wrong offsets", (long long)bad);
    /* seeking to any position gives the same offsets as walking there */
    for (int64_t target = 0; target < 24; target += 5) {
        al_iter w, s;
        al_iter_init(&w, 3, p.size, 2, (const int64_t *[]){p.stride, e.stride}, (int64_t[]){p.offset, e.offset});
        for (int64_t i = 0; i < target; i++) al_iter_next(&w);
        al_iter_init(&s, 3, p.size, 2, (const int64_t *[]){p.stride, e.stride}, (int64_t[]){p.offset, e.offset});
        al_iter_seek(&s, target);
        CHECK(w.off[0] == s.off[0] && w.off[1] == s.off[1], "seek %lld: walk (%lld,%lld) seek (%lld,%lld)",
              (long long)target, (long long)w.off[0], (long long)w.off[1], (long long)s.off[0], (long long)s.off[1]);
        /* and walking on from a seek stays in step */
        al_iter_next(&w);
        al_iter_next(&s);
        CHECK(target == 23 || (w.off[0] == s.off[0] && w.off[1] == s.off[1]), "next after seek %lld", (long long)target);
    }
    /* a narrowed view carries its storage offset into the walk */
    al_tensor nrw = {0};
    CHECK_OK(al_tensor_narrow(&nrw, &t, 2, 1, 2));
    al_iter_init(&it, 3, nrw.size, 1, (const int64_t *[]){nrw.stride}, (int64_t[]){nrw.offset});
    CHECK(it.off[0] == 1, "first offset %lld", (long long)it.off[0]);
    al_iter_next(&it);
    CHECK(it.off[0] == 2, "second offset %lld", (long long)it.off[0]);
    al_iter_next(&it);
    CHECK(it.off[0] == 5, "third offset (next row) %lld", (long long)it.off[0]);
    al_tensor_release(&nrw);
    al_tensor_release(&t);
    al_tensor_release(&p);
    al_tensor_release(&v);
    al_tensor_release(&e);
}

/* ---- ops on strided inputs ----------------------------------------------------------------------- */
static void test_binary_strided_broadcast(void) {
    /* a: [4,3] transposed to [3,4]; b: [4] broadcast over rows; out = a - b */
    al_tensor a = {0}, at = {0}, b = {0}, out = {0};
    rand_tensor(&a, 2, (int64_t[]){4, 3}, AL_DTYPE_F32, 11);
    rand_tensor(&b, 1, (int64_t[]){4}, AL_DTYPE_F64, 12);
    CHECK_OK(al_tensor_transpose(&at, &a, 0, 1));
    CHECK_OK(al_binary(&out, AL_BINARY_SUB, &at, &b));
    CHECK(out.ndim == 2 && out.size[0] == 3 && out.size[1] == 4, "shape");
    CHECK(out.dtype == AL_DTYPE_F64, "f32 - f64 gives %s", al_dtype_name(out.dtype));
    double *va = read_all(&a), *vb = read_all(&b), *vo = read_all(&out);
    double worst = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            double want = va[j * 3 + i] - vb[j];
            worst = fmax(worst, fabs(vo[i * 4 + j] - want));
        }
    CHECK(worst == 0.0, "max error %g", worst);
    free(va); free(vb); free(vo);
    al_tensor_release(&out);
    /* scalar first: 2 - at, and a comparison giving bool */
    CHECK_OK(al_binary_scalar(&out, AL_BINARY_SUB, &at, 2.0, 1));
    va = read_all(&a); vo = read_all(&out);
    worst = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) worst = fmax(worst, fabs(vo[i * 4 + j] - (double)(2.0f - (float)va[j * 3 + i])));
    CHECK(worst == 0.0 && out.dtype == AL_DTYPE_F32, "2 - a: error %g dtype %s", worst, al_dtype_name(out.dtype));
    free(vo);
    al_tensor_release(&out);
    CHECK_OK(al_binary_scalar(&out, AL_BINARY_GT, &at, 0.0, 0));
    CHECK(out.dtype == AL_DTYPE_BOOL, "gt gives %s", al_dtype_name(out.dtype));
    vo = read_all(&out);
    int wrong = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) wrong += (vo[i * 4 + j] != 0) != (va[j * 3 + i] > 0);
    CHECK(wrong == 0, "%d wrong comparisons", wrong);
    free(va); free(vo);
    al_tensor_release(&out);
    al_tensor_release(&a); al_tensor_release(&at); al_tensor_release(&b);
}

static void test_result_dtypes(void) {
    al_tensor i = {0}, f = {0}, out = {0};
    CHECK_OK(al_tensor_empty(&i, 1, (int64_t[]){5}, AL_DTYPE_I32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_arange_(&i, 1, 2));   /* 1 3 5 7 9 */
    CHECK_OK(al_tensor_empty(&f, 1, (int64_t[]){5}, AL_DTYPE_F16, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_fill_(&f, 0.5));
    CHECK_OK(al_binary(&out, AL_BINARY_DIV, &i, &i));
    CHECK(out.dtype == AL_DTYPE_F32, "i32 / i32 gives %s", al_dtype_name(out.dtype));
    al_tensor_release(&out);
    CHECK_OK(al_binary(&out, AL_BINARY_MUL, &i, &f));
    CHECK(out.dtype == AL_DTYPE_F32, "i32 * f16 gives %s", al_dtype_name(out.dtype));
    double v[5];
    CHECK_OK(al_tensor_read_f64(&out, v, 5));
    CHECK(v[0] == 0.5 && v[4] == 4.5, "values %g %g", v[0], v[4]);
    al_tensor_release(&out);
    CHECK_OK(al_binary_scalar(&out, AL_BINARY_ADD, &i, 3.0, 0));
    CHECK(out.dtype == AL_DTYPE_I32, "i32 + 3 gives %s", al_dtype_name(out.dtype));
    al_tensor_release(&out);
    CHECK_OK(al_binary_scalar(&out, AL_BINARY_ADD, &i, 0.25, 0));
    CHECK(out.dtype == AL_DTYPE_F32, "i32 + 0.25 gives %s", al_dtype_name(out.dtype));
    al_tensor_release(&out);
    CHECK_OK(al_reduce(&out, AL_REDUCE_SUM, &i, 0, NULL, 0));
    CHECK(out.dtype == AL_DTYPE_I64 && out.ndim == 0, "sum of i32 gives %s ndim %d", al_dtype_name(out.dtype), out.ndim);
    CHECK_OK(al_tensor_read_f64(&out, v, 1));
    CHECK(v[0] == 25, "sum %g", v[0]);
    al_tensor_release(&out);
    CHECK_OK(al_unary(&out, AL_UNARY_SQRT, &i));
    CHECK(out.dtype == AL_DTYPE_F32, "sqrt of i32 gives %s", al_dtype_name(out.dtype));
    CHECK_OK(al_tensor_read_f64(&out, v, 5));
    CHECK(fabs(v[1] - sqrt(3.0)) < 1e-6, "sqrt(3) = %g", v[1]);
    al_tensor_release(&out);
    al_tensor_release(&i);
    al_tensor_release(&f);
}

static void test_reduce_dims(void) {
    al_tensor a = {0}, p = {0}, out = {0};
    rand_tensor(&a, 3, (int64_t[]){2, 3, 4}, AL_DTYPE_F64, 21);
    CHECK_OK(al_tensor_permute(&p, &a, 3, (int32_t[]){1, 2, 0}));   /* [3,4,2] */
    double *va = read_all(&a);
    /* sum over dims 0 and 2 of p -> [4] (keepdim [1,4,1]); p[i][j][k] = a[k][i][j] */
    CHECK_OK(al_reduce(&out, AL_REDUCE_SUM, &p, 2, (int32_t[]){0, 2}, 1));
    CHECK(out.ndim == 3 && out.size[0] == 1 && out.size[1] == 4 && out.size[2] == 1, "keepdim shape");
    al_tensor_release(&out);
    CHECK_OK(al_reduce(&out, AL_REDUCE_SUM, &p, 2, (int32_t[]){2, 0}, 0));
    CHECK(out.ndim == 1 && out.size[0] == 4, "shape ndim %d", out.ndim);
    double v[4], worst = 0;
    CHECK_OK(al_tensor_read_f64(&out, v, 4));
    for (int j = 0; j < 4; j++) {
        double s = 0;
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < 2; k++) s += va[k * 12 + i * 4 + j];
        worst = fmax(worst, fabs(v[j] - s));
    }
    CHECK(worst < 1e-12, "sum error %g", worst);
    al_tensor_release(&out);
    /* amax over dim 1 of p and max_dim agree, and the index points at the max */
    al_tensor vals = {0}, idx = {0};
    CHECK_OK(al_reduce(&out, AL_REDUCE_AMAX, &p, 1, (int32_t[]){1}, 0));
    CHECK_OK(al_max_dim(&vals, &idx, &p, 1, 0));
    CHECK(idx.dtype == AL_DTYPE_I64 && idx.ndim == 2 && idx.size[0] == 3 && idx.size[1] == 2, "indices shape/dtype");
    double m[6], mv[6], mi[6];
    CHECK_OK(al_tensor_read_f64(&out, m, 6));
    CHECK_OK(al_tensor_read_f64(&vals, mv, 6));
    CHECK_OK(al_tensor_read_f64(&idx, mi, 6));
    int wrong = 0;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) {
            double best = -INFINITY;
            int arg = -1;
            for (int j = 0; j < 4; j++)
                if (va[k * 12 + i * 4 + j] > best) { best = va[k * 12 + i * 4 + j]; arg = j; }
            wrong += m[i * 2 + k] != best || mv[i * 2 + k] != best || mi[i * 2 + k] != arg;
        }
    CHECK(wrong == 0, "%d wrong maxima", wrong);
    free(va);
    al_tensor_release(&out); al_tensor_release(&vals); al_tensor_release(&idx);
    al_tensor_release(&a); al_tensor_release(&p);
}

static void test_matmul_strided(void) {
    /* a^T with a [5,3] -> [3,5] (CblasTrans path); b [5,4] narrowed columns of a [5,8] with step... */
    al_tensor a = {0}, at = {0}, b0 = {0}, b = {0}, out = {0};
    rand_tensor(&a, 2, (int64_t[]){5, 3}, AL_DTYPE_F32, 31);
    rand_tensor(&b0, 2, (int64_t[]){5, 8}, AL_DTYPE_F32, 32);
    CHECK_OK(al_tensor_transpose(&at, &a, 0, 1));
    /* every other column of b0: strides (8, 2) -> no unit stride, so the packing path */
    CHECK_OK(al_tensor_as_strided(&b, &b0, 2, (int64_t[]){5, 4}, (int64_t[]){8, 2}, 1));
    CHECK_OK(al_matmul(&out, &at, &b));
    CHECK(out.ndim == 2 && out.size[0] == 3 && out.size[1] == 4, "shape");
    double *va = read_all(&a), *vb = read_all(&b0), *vo = read_all(&out), worst = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            double s = 0;
            for (int k = 0; k < 5; k++) s += va[k * 3 + i] * vb[k * 8 + 1 + 2 * j];
            worst = fmax(worst, fabs(vo[i * 4 + j] - s));
        }
    CHECK(worst < 1e-5, "matmul error %g", worst);
    free(va); free(vb); free(vo);
    al_tensor_release(&out);
    al_tensor_release(&a); al_tensor_release(&at); al_tensor_release(&b0); al_tensor_release(&b);
}

static void test_compare_nan_rules(void) {
    al_tensor a = {0}, b = {0};
    CHECK_OK(al_tensor_empty(&a, 1, (int64_t[]){4}, AL_DTYPE_F64, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_empty(&b, 1, (int64_t[]){4}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    double va[4] = {1.0, NAN, INFINITY, 2.0}, vb[4] = {1.0, NAN, INFINITY, 2.5};
    CHECK_OK(al_tensor_write_f64(&a, va, 4));
    CHECK_OK(al_tensor_write_f64(&b, vb, 4));
    double d, r;
    int32_t close;
    CHECK_OK(al_max_abs_diff(&a, &b, &d));
    CHECK(d == 0.5, "max_abs_diff %g", d);
    CHECK_OK(al_rmse(&a, &b, &r));
    CHECK(fabs(r - sqrt(0.25 / 4)) < 1e-15, "rmse %g", r);
    CHECK_OK(al_allclose(&a, &b, 0.0, 0.2, &close));
    CHECK(close == 1, "0.5 <= 0.2 * 2.5 should be close");
    CHECK_OK(al_allclose(&a, &b, 0.0, 0.1, &close));
    CHECK(close == 0, "0.5 > 0.1 * 2.5 should not be close");
    vb[1] = 3.0;   /* NaN against a number */
    CHECK_OK(al_tensor_write_f64(&b, vb, 4));
    CHECK_OK(al_max_abs_diff(&a, &b, &d));
    CHECK(isnan(d), "NaN vs number gives %g", d);
    CHECK_OK(al_allclose(&a, &b, 1e9, 1e9, &close));
    CHECK(close == 0, "NaN vs number is never close");
    vb[1] = NAN; vb[2] = 5.0;   /* inf against a number fails even with huge tolerances */
    CHECK_OK(al_tensor_write_f64(&b, vb, 4));
    CHECK_OK(al_allclose(&a, &b, 1e9, 1e9, &close));
    CHECK(close == 0, "inf vs 5 is never close");
    al_tensor_release(&a); al_tensor_release(&b);
}

/* ---- error paths --------------------------------------------------------------------------------- */
static int is_zeroed(const al_tensor *t) {
    static const al_tensor zero;
    return memcmp(t, &zero, sizeof zero) == 0;
}

static void test_errors(void) {
    int64_t live = al_storage_live_count();
    al_tensor a = {0}, b = {0}, dead = {0}, out, out2;
    rand_tensor(&a, 2, (int64_t[]){2, 3}, AL_DTYPE_F32, 41);
    rand_tensor(&b, 2, (int64_t[]){4, 5}, AL_DTYPE_F32, 42);

    memset(&out, 0xab, sizeof out);
    CHECK_ERR(al_binary(&out, AL_BINARY_ADD, &a, &dead), AL_ERR_ARG, "add");
    CHECK(strstr(al_last_error(), "released") != NULL, "names a released tensor: %s", al_last_error());
    CHECK(is_zeroed(&out), "out zeroed after failure");
    memset(&out, 0xab, sizeof out);
    CHECK_ERR(al_unary(&out, AL_UNARY_EXP, &dead), AL_ERR_ARG, "exp");
    CHECK(is_zeroed(&out), "out zeroed after failure");
    CHECK_ERR(al_binary(&out, AL_BINARY_MUL, &a, &b), AL_ERR_ARG, "mul: shapes [2,3] and [4,5] cannot be broadcast");
    CHECK(is_zeroed(&out), "out zeroed after failure");
    CHECK_ERR(al_reduce(&out, AL_REDUCE_SUM, &a, 1, (int32_t[]){2}, 0), AL_ERR_ARG, "sum: dim 2 out of range");
    CHECK_ERR(al_reduce(&out, AL_REDUCE_MEAN, &a, 2, (int32_t[]){1, 1}, 0), AL_ERR_ARG, "mean: dim 1 appears twice");
    CHECK_ERR(al_reduce(&out, AL_REDUCE_AMAX, &a, 1, (int32_t[]){-1}, 0), AL_ERR_ARG, "amax: dim -1 out of range");
    memset(&out, 0xab, sizeof out);
    memset(&out2, 0xab, sizeof out2);
    CHECK_ERR(al_max_dim(&out, &out2, &a, 5, 0), AL_ERR_ARG, "max: dim 5 out of range");
    CHECK(is_zeroed(&out) && is_zeroed(&out2), "values and indices zeroed after failure");
    CHECK_ERR(al_softmax(&out, &a, 2, 0), AL_ERR_ARG, "softmax: dim 2");
    CHECK_ERR(al_softmax(&out, &a, 7, 1), AL_ERR_ARG, "log_softmax: dim 7");
    CHECK_ERR(al_matmul(&out, &a, &b), AL_ERR_ARG, "matmul: inner dimensions differ: a [2,3] x b [4,5]");
    CHECK(is_zeroed(&out), "out zeroed after failure");
    CHECK_ERR(al_where(&out, &a, &a, &a), AL_ERR_ARG, "where: cond must be a bool or u8 tensor, got f32");
    al_tensor i = {0};
    CHECK_OK(al_tensor_empty(&i, 2, (int64_t[]){3, 2}, AL_DTYPE_I32, AL_DEVICE_CPU, 0));
    CHECK_ERR(al_matmul(&out, &a, &i), AL_ERR_ARG, "matmul: integer");
    CHECK_ERR(al_unary(&out, 99, &a), AL_ERR_ARG, "unknown op 99");
    al_tensor z = {0};
    CHECK_OK(al_tensor_empty(&z, 2, (int64_t[]){3, 0}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_ERR(al_reduce(&out, AL_REDUCE_AMIN, &z, 1, (int32_t[]){1}, 0), AL_ERR_ARG, "amin: cannot reduce over a zero-size");
    /* a matmul with a batch that cannot broadcast names both shapes */
    al_tensor c = {0}, d = {0};
    CHECK_OK(al_tensor_empty(&c, 3, (int64_t[]){2, 2, 3}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_empty(&d, 3, (int64_t[]){3, 3, 2}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_ERR(al_matmul(&out, &c, &d), AL_ERR_ARG, "matmul: batch dims of a [2,2,3] and b [3,3,2]");
    /* device agreement is checked before any data is touched, so a descriptor that only claims to
     * be on cuda:1 (a by-value copy of a CPU one, never released) tests the message without a GPU */
    al_tensor fake = a;
    fake.device_type = AL_DEVICE_CUDA;
    fake.device_index = 1;
    CHECK_ERR(al_binary(&out, AL_BINARY_ADD, &a, &fake), AL_ERR_ARG, "add: a is on cpu, b is on cuda:1");
    CHECK(is_zeroed(&out), "out zeroed after failure");
    CHECK_ERR(al_matmul(&out, &fake, &a), AL_ERR_ARG, "matmul: a is on cuda:1, b is on cpu");
    al_tensor cnd = {0};
    CHECK_OK(al_tensor_empty(&cnd, 2, (int64_t[]){2, 3}, AL_DTYPE_BOOL, AL_DEVICE_CPU, 0));
    CHECK_ERR(al_where(&out, &cnd, &a, &fake), AL_ERR_ARG, "where: a is on cpu, b is on cuda:1");
    al_tensor_release(&cnd);
    al_tensor_release(&c); al_tensor_release(&d); al_tensor_release(&z); al_tensor_release(&i);
    al_tensor_release(&a);
    al_tensor_release(&b);
    CHECK(al_storage_live_count() == live, "storages leaked: %lld live, %lld before",
          (long long)al_storage_live_count(), (long long)live);
}

static void test_empty_and_scalar(void) {
    /* sums over nothing are 0, matmul with k = 0 gives zeros, 0-d tensors work */
    al_tensor z = {0}, out = {0}, a = {0}, b = {0};
    CHECK_OK(al_tensor_empty(&z, 2, (int64_t[]){3, 0}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_reduce(&out, AL_REDUCE_SUM, &z, 1, (int32_t[]){1}, 0));
    double v[3] = {1, 1, 1};
    CHECK_OK(al_tensor_read_f64(&out, v, 3));
    CHECK(v[0] == 0 && v[1] == 0 && v[2] == 0, "empty sums %g %g %g", v[0], v[1], v[2]);
    al_tensor_release(&out);
    CHECK_OK(al_tensor_empty(&b, 2, (int64_t[]){0, 2}, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_matmul(&out, &z, &b));
    CHECK(out.ndim == 2 && out.size[0] == 3 && out.size[1] == 2, "k=0 matmul shape");
    double w[6];
    CHECK_OK(al_tensor_read_f64(&out, w, 6));
    int nz = 0;
    for (int i = 0; i < 6; i++) nz += w[i] != 0;
    CHECK(nz == 0, "k=0 matmul gives zeros");
    al_tensor_release(&out);
    CHECK_OK(al_tensor_empty(&a, 0, NULL, AL_DTYPE_F64, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_fill_(&a, 2.0));
    CHECK_OK(al_unary(&out, AL_UNARY_SQRT, &a));
    CHECK(out.ndim == 0, "0-d stays 0-d");
    CHECK_OK(al_tensor_read_f64(&out, v, 1));
    CHECK(v[0] == sqrt(2.0), "sqrt(2) = %.17g", v[0]);
    al_tensor_release(&out);
    al_tensor_release(&z); al_tensor_release(&a); al_tensor_release(&b);
}

int main(void) {
    RUN(test_broadcast_shapes);
    RUN(test_promote);
    RUN(test_iter_permuted_expanded);
    RUN(test_binary_strided_broadcast);
    RUN(test_result_dtypes);
    RUN(test_reduce_dims);
    RUN(test_matmul_strided);
    RUN(test_compare_nan_rules);
    RUN(test_errors);
    RUN(test_empty_and_scalar);
    return SUMMARY("math");
}
