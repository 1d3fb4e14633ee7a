/* test_fp8.c — FP8 C API: amax, quantise/dequantise against the scalar encoders, per-row scales, MXFP8
 * block scales, and FP8 attention settings (validation, reported amaxes) on the cpu backend. */
#include "test_main.h"
#include "attention_internal.h"   /* al_fp8_pending: a fake backend record for the deferred-amax rules */
#include <math.h>
#include <stdlib.h>

static void randn(al_tensor *t, int n, const int64_t *shape, uint64_t seed) {
    CHECK_OK(al_tensor_empty(t, n, shape, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_random_at_(t, AL_RANDOM_NORMAL, seed, 0));
}

static void test_amax_strided(void) {
    al_tensor x, v;
    int64_t s[2] = {17, 9};
    randn(&x, 2, s, 1);
    CHECK_OK(al_tensor_transpose(&v, &x, 0, 1));
    const float *p = al_tensor_data_ptr(&x);
    double want = 0, got = -1, got2 = -1;
    for (int i = 0; i < 17 * 9; i++) want = fabs(p[i]) > want ? fabs(p[i]) : want;
    CHECK_OK(al_amax(&v, &got));
    CHECK_OK(al_amax(&x, &got2));
    CHECK(got == want && got2 == want, "amax %g %g want %g", got, got2, want);
    ((float *)al_tensor_data_ptr(&x))[40] = NAN;
    CHECK_OK(al_amax(&v, &got));
    CHECK(got != got, "NaN propagates, got %g", got);
    al_tensor_release(&v);
    al_tensor_release(&x);
}

static void test_quantize_bits(void) {
    al_tensor x, v, q, d;
    int64_t s[3] = {4, 6, 5};
    randn(&x, 3, s, 2);
    CHECK_OK(al_tensor_transpose(&v, &x, 0, 2));   /* [5,6,4] strided */
    const double scale = 77.5;
    for (int fmt = AL_DTYPE_FP8_E4M3; fmt <= AL_DTYPE_FP8_E5M2; fmt++) {
        CHECK_OK(al_fp8_quantize(&q, &v, fmt, scale));
        CHECK_OK(al_fp8_dequantize(&d, &q, 1.0 / scale, AL_DTYPE_F64));
        const float *px = al_tensor_data_ptr(&x);
        const uint8_t *pq = al_tensor_data_ptr(&q);
        const double *pd = al_tensor_data_ptr(&d);
        int bad = 0;
        for (int i = 0; i < 5; i++) for (int j = 0; j < 6; j++) for (int k = 0; k < 4; k++) {
            int o = (i * 6 + j) * 4 + k;
            float xv = px[(k * 6 + j) * 5 + i];
            double dec = fmt == AL_DTYPE_FP8_E4M3 ? al_e4m3_bits_to_f32(pq[o]) : al_e5m2_bits_to_f32(pq[o]);
            if (pd[o] != dec * (1.0 / scale)) bad++;
            double err = fabs(pd[o] - xv), tol = fabs(xv) * (fmt == AL_DTYPE_FP8_E4M3 ? 0.0625 : 0.125) + 1e-3;
            if (err > tol) bad++;
        }
        CHECK(bad == 0, "%d mismatches (format %d)", bad, fmt);
        al_tensor_release(&q);
        al_tensor_release(&d);
    }
    CHECK_ERR(al_fp8_quantize(&q, &v, AL_DTYPE_F16, 1.0), AL_ERR_ARG, "format must be fp8_e4m3");
    CHECK_ERR(al_fp8_quantize(&q, &v, AL_DTYPE_FP8_E4M3, 0.0), AL_ERR_ARG, "scale must be finite and > 0");
    CHECK(q.storage == NULL, "out zeroed on failure");
    al_tensor_release(&v);
    al_tensor_release(&x);
}

/* al_fp8_quantize_amax: al_fp8_quantize's codes and al_amax_tensor's value from one call; NULL results and a
 * bad scale are errors that leave both results zeroed */
static void test_quantize_amax(void) {
    al_tensor x, v, q, a, qr;
    int64_t s[3] = {3, 7, 5};
    randn(&x, 3, s, 5);
    CHECK_OK(al_tensor_transpose(&v, &x, 0, 1));   /* [7,3,5] strided */
    for (int fmt = AL_DTYPE_FP8_E4M3; fmt <= AL_DTYPE_FP8_E5M2; fmt++) {
        CHECK_OK(al_fp8_quantize_amax(&q, &a, &v, fmt, 13.25));
        CHECK_OK(al_fp8_quantize(&qr, &v, fmt, 13.25));
        double want = 0.0;
        CHECK_OK(al_amax(&v, &want));
        CHECK(a.ndim == 1 && a.size[0] == 1 && a.dtype == AL_DTYPE_F64 && *(const double *)al_tensor_data_ptr(&a) == want,
              "amax %g, want %g", *(const double *)al_tensor_data_ptr(&a), want);
        CHECK(q.dtype == fmt && al_tensor_numel(&q) == 105 &&
              memcmp(al_tensor_data_ptr(&q), al_tensor_data_ptr(&qr), 105) == 0, "codes equal to al_fp8_quantize's (format %d)", fmt);
        al_tensor_release(&q); al_tensor_release(&a); al_tensor_release(&qr);
    }
    CHECK_ERR(al_fp8_quantize_amax(&q, NULL, &v, AL_DTYPE_FP8_E4M3, 1.0), AL_ERR_ARG, "out and amax");
    CHECK_ERR(al_fp8_quantize_amax(&q, &a, &v, AL_DTYPE_FP8_E4M3, NAN), AL_ERR_ARG, "scale must be finite and > 0");
    CHECK(q.storage == NULL && a.storage == NULL, "results zeroed on failure");
    al_tensor_release(&v);
    al_tensor_release(&x);
}

static void test_mx_and_rows(void) {
    al_tensor x, q, sc, d, r, si;
    int64_t s[2] = {3, 80};
    randn(&x, 2, s, 3);
    CHECK_OK(al_mxfp8_quantize(&q, &sc, &x, AL_DTYPE_FP8_E4M3, 1));
    CHECK(sc.ndim == 2 && sc.size[1] == 3 && sc.dtype == AL_DTYPE_U8, "scales [3,3] u8");
    const float *px = al_tensor_data_ptr(&x);
    const uint8_t *ps = al_tensor_data_ptr(&sc);
    int bad = 0;
    for (int row = 0; row < 3; row++) for (int b = 0; b < 3; b++) {
        double a = 0;
        for (int j = b * 32; j < 80 && j < b * 32 + 32; j++) a = fabs(px[row * 80 + j]) > a ? fabs(px[row * 80 + j]) : a;
        int e = (int)ps[row * 3 + b] - 127;
        if (!(a <= 448 * ldexp(1, e) && a > 448 * ldexp(1, e - 1))) bad++;
    }
    CHECK(bad == 0, "%d block scales off", bad);
    CHECK_OK(al_mxfp8_dequantize(&d, &q, &sc, 1, AL_DTYPE_F32));
    const float *pd = al_tensor_data_ptr(&d);
    for (int i = 0; i < 240; i++) if (fabsf(pd[i] - px[i]) > 0.0625f * fabsf(px[i]) + 1e-6f) bad++;
    CHECK(bad == 0, "%d dequantised values off", bad);
    CHECK_OK(al_fp8_quantize_rows(&r, &si, &x, AL_DTYPE_FP8_E5M2, 1, 0.0));
    CHECK(si.ndim == 1 && si.size[0] == 3 && si.dtype == AL_DTYPE_F32, "one f32 descale per row");
    al_tensor_release(&r); al_tensor_release(&si); /* a failing call zeroes r/si without releasing (make test-asan: leak) */
    CHECK_ERR(al_fp8_quantize_rows(&r, &si, &x, AL_DTYPE_FP8_E5M2, 3, 0.0), AL_ERR_ARG, "row_dims must be in 1..2");
    al_tensor_release(&r); al_tensor_release(&si);
    al_tensor_release(&q); al_tensor_release(&sc); al_tensor_release(&d); al_tensor_release(&x);
}

/* FP8 attention on CPU tensors: a random packed bshd qkv [b, s, 3, 2, 16] quantised with scale 64, q/k/v its
 * select views, bshd params, FP8 settings with S's scale 448 and the given O scale (in.fp8 left NULL) */
typedef struct {
    al_tensor qkv, q8, q, k, v;
    al_attn_params p;
    al_attn_fp8 f;
    al_attn_inputs in;
} fp8_case;

static void fp8_case_init(fp8_case *c, int64_t b, int64_t sq, uint64_t seed, double scale_o) {
    memset(c, 0, sizeof *c);
    int64_t s[5] = {b, sq, 3, 2, 16};
    randn(&c->qkv, 5, s, seed);
    CHECK_OK(al_fp8_quantize(&c->q8, &c->qkv, AL_DTYPE_FP8_E4M3, 64.0));
    CHECK_OK(al_tensor_select(&c->q, &c->q8, 2, 0));
    CHECK_OK(al_tensor_select(&c->k, &c->q8, 2, 1));
    CHECK_OK(al_tensor_select(&c->v, &c->q8, 2, 2));
    al_attn_params_init(&c->p);
    c->p.qkv_format = AL_ATTN_FORMAT_BSHD;
    al_attn_fp8_init(&c->f);
    c->f.qkv_scale_inv = 1.0 / 64.0;
    c->f.scale[AL_FP8_SLOT_S] = 448.0;
    c->f.scale[AL_FP8_SLOT_O] = scale_o;
    c->in.q = &c->q; c->in.k = &c->k; c->in.v = &c->v;
}

static void fp8_case_release(fp8_case *c) {
    al_tensor_release(&c->q); al_tensor_release(&c->k); al_tensor_release(&c->v);
    al_tensor_release(&c->q8); al_tensor_release(&c->qkv);
}

static void test_attention_fp8(void) {
    fp8_case c;
    fp8_case_init(&c, 2, 40, 4, 0.0);   /* O: current */
    al_attn_params p = c.p;
    al_attn_fp8 f = c.f;
    al_attn_inputs in = c.in;
    al_tensor out, lse;
    CHECK_ERR(al_attn_forward(&p, &in, &out, &lse, NULL), AL_ERR_ARG, "FP8 inputs need FP8 settings");
    in.fp8 = &f;
    CHECK_OK(al_attn_forward(&p, &in, &out, &lse, NULL));
    CHECK(out.dtype == AL_DTYPE_F32, "out in out_dtype");
    CHECK(f.amax[AL_FP8_SLOT_S] > 0 && f.amax[AL_FP8_SLOT_S] <= 1.0, "amax S %g in (0,1]", f.amax[AL_FP8_SLOT_S]);
    CHECK(f.amax[AL_FP8_SLOT_O] > 0 && f.scale_used[AL_FP8_SLOT_O] == 448.0 / f.amax[AL_FP8_SLOT_O], "current O scale");
    al_tensor_release(&out); al_tensor_release(&lse);
    f.scale[AL_FP8_SLOT_S] = 0.0;
    CHECK_ERR(al_attn_forward(&p, &in, &out, &lse, NULL), AL_ERR_ARG, "produced inside the kernel");
    CHECK(al_sizeof("al_attn_fp8") == (int64_t)sizeof(al_attn_fp8), "sizeof row");
    fp8_case_release(&c);
}

/* A stand-in for a backend's deferred-amax record (the fused GPU path's, attn_fused_fp8.cu): counts what the
 * front door asks of it; settle writes a recognisable amax. */
typedef struct {
    al_fp8_pending base;
    int settled, dropped;
} fake_pending;
static void fake_settle(al_fp8_pending *self, al_attn_fp8 *f) {
    ((fake_pending *)self)->settled++;
    f->pending = NULL;
    f->amax[self->backward ? AL_FP8_SLOT_DP : AL_FP8_SLOT_S] = 0.25;
}
static void fake_drop(al_fp8_pending *self) { ((fake_pending *)self)->dropped++; }
static void fake_attach(fake_pending *r, al_attn_fp8 *f, int backward) {
    memset(r, 0, sizeof *r);
    r->base.settle = fake_settle;
    r->base.drop = fake_drop;
    r->base.backward = backward;
    r->base.owner = f;
    f->pending = &r->base;
}

/* al_attn_fp8_settle and the front door's rules for a record left by an earlier call on the same struct: a
 * call of the same direction supersedes it (dropped, not waited for), one of the other direction settles it
 * first, a byte copy of the struct never touches it. On CPU tensors (the cpu emulation fills amax itself). */
static void test_deferred_rules(void) {
    fp8_case c;
    fp8_case_init(&c, 1, 24, 5, 16.0);
    al_attn_params p = c.p;
    al_attn_fp8 f = c.f;
    f.amax_deferred = 1;
    al_attn_inputs in = c.in;
    in.fp8 = &f;
    al_tensor out, lse;

    al_attn_fp8_settle(NULL);                 /* no-ops */
    al_attn_fp8_settle(&f);
    fake_pending r;
    fake_attach(&r, &f, 0);
    al_attn_fp8_settle(&f);
    CHECK(r.settled == 1 && r.dropped == 0 && f.pending == NULL && f.amax[AL_FP8_SLOT_S] == 0.25, "settle: %d %d", r.settled, r.dropped);

    fake_attach(&r, &f, 0);                   /* a forward supersedes a pending forward */
    CHECK_OK(al_attn_forward(&p, &in, &out, &lse, NULL));
    CHECK(r.dropped == 1 && r.settled == 0 && f.pending == NULL, "forward over a forward: dropped %d settled %d", r.dropped, r.settled);
    CHECK(f.amax[AL_FP8_SLOT_S] > 0 && f.amax[AL_FP8_SLOT_S] <= 1.0 && f.amax[AL_FP8_SLOT_S] != 0.25, "the cpu forward's amax S %g",
          f.amax[AL_FP8_SLOT_S]);
    al_tensor_release(&out); al_tensor_release(&lse);

    fake_attach(&r, &f, 1);                   /* a forward settles a pending backward (other slots) */
    f.amax[AL_FP8_SLOT_DP] = NAN;
    CHECK_OK(al_attn_forward(&p, &in, &out, &lse, NULL));
    CHECK(r.settled == 1 && r.dropped == 0 && f.amax[AL_FP8_SLOT_DP] == 0.25, "forward over a backward: settled %d", r.settled);
    al_tensor_release(&out); al_tensor_release(&lse);

    fake_attach(&r, &f, 0);                   /* a byte copy carries the pointer but does not own the record */
    al_attn_fp8 g = f;
    al_attn_fp8_settle(&g);
    CHECK(g.pending == NULL && r.settled == 0 && r.dropped == 0 && f.pending == &r.base, "the copy left the record alone");
    in.fp8 = &g;
    g.pending = &r.base;
    CHECK_OK(al_attn_forward(&p, &in, &out, &lse, NULL));
    CHECK(r.settled == 0 && r.dropped == 0 && f.pending == &r.base, "a call through the copy left the record alone");
    al_tensor_release(&out); al_tensor_release(&lse);
    al_attn_fp8_settle(&f);
    CHECK(r.settled == 1 && f.pending == NULL, "the owner settles it");
    fp8_case_release(&c);
}

int main(void) {
    RUN(test_amax_strided);
    RUN(test_quantize_bits);
    RUN(test_quantize_amax);
    RUN(test_mx_and_rows);
    RUN(test_attention_fp8);
    RUN(test_deferred_rules);
    return SUMMARY("fp8");
}
