/*
 * test_rng.c — Philox4x32-10, the stream mapping of src/numeric/philox.h, the deterministic math of
 * src/numeric/detmath.h and the default generator / random fills of src/rng.c.
 *
 * Oracles: Random123's published known-answer vectors; the mapping rules re-derived here from raw
 * Philox blocks; glibc's log/sin/cos for the Box-Muller math (accuracy, not bits); moments and
 * tail frequencies for the distributions.
 */
#include "test_main.h"
#include "internal.h"
#include "numeric/philox.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

/* ---- known answers --------------------------------------------------------------------------- */
static void test_philox_kat(void) {
    /* Random123 tests/kat_vectors: ctr[4] key[2] -> out[4] */
    static const uint32_t kat[][11] = {
        {10, 0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {10, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
         0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {10, 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
         0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
        {7, 0, 0, 0, 0, 0, 0, 0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48},
        {7, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
         0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662},
        {7, 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
         0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a},
    };
    for (size_t k = 0; k < sizeof kat / sizeof kat[0]; k++) {
        uint32_t out[4];
        al_philox4x32_r((int)kat[k][0], &kat[k][1], &kat[k][5], out);
        CHECK(memcmp(out, &kat[k][7], sizeof out) == 0,
              "philox4x32-%u vector %zu: got %08x %08x %08x %08x", kat[k][0], k, out[0], out[1], out[2], out[3]);
    }
    /* the seed/counter packing of al_philox_block */
    uint32_t a[4], b[4];
    al_philox_block(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, a);
    uint32_t ctr[4] = {0x243f6a88, 0x85a308d3, 0, 0}, key[2] = {0xa4093822, 0x299f31d0};
    al_philox4x32_10(ctr, key, b);
    CHECK(memcmp(a, b, sizeof a) == 0, "al_philox_block packs counter/seed as {lo, hi}");
}

/* ---- mapping rules, re-derived from raw blocks ------------------------------------------------ */
static void raw_block(uint64_t seed, uint64_t c, uint32_t r[4]) {
    uint32_t ctr[4] = {(uint32_t)(c & 0xffffffffu), (uint32_t)(c >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)(seed & 0xffffffffu), (uint32_t)(seed >> 32)};
    al_philox4x32_10(ctr, key, r);
}

static void test_mapping_rules(void) {
    const uint64_t seed = 0x0123456789abcdefull, off = 0xfffffffffffffff0ull;  /* wraps past 2^64 */
    int bad = 0;
    for (uint64_t i = 0; i < 200; i++) {
        uint32_t r[4];
        raw_block(seed, off + i / 4, r);
        float want = (float)ldexp((double)(r[i % 4] >> 8), -24);
        if (al_philox_uniform_f32(seed, off, i) != want) bad++;
        if (al_philox_keep(seed, off, i, 0.7f) != (want < 0.7f)) bad++;
        raw_block(seed, off + i / 2, r);
        uint64_t w = ((uint64_t)r[2 * (i % 2)] << 32) | r[2 * (i % 2) + 1];
        double wantd = ldexp((double)(w >> 11), -53);
        if (al_philox_uniform_f64(seed, off, i) != wantd) bad++;
        /* normals: Box-Muller on (r0, r1) [f32] or (r0r1, r2r3) [f64], checked against glibc */
        double u1 = ldexp((double)((r[0] >> 8) + 1), -24), t = ldexp((double)(r[1] >> 8), -24);
        double z = sqrt(-2 * log(u1)) * (i % 2 ? sin(2 * M_PI * t) : cos(2 * M_PI * t));
        float zf = al_philox_normal_f32(seed, off, i);
        if (fabs((double)zf - z) > 1.5 * ldexp(1, ilogb(z) - 23) + 1e-12) {
            if (bad++ < 5) fprintf(stderr, "  normal f32 %llu: %.9g vs %.9g\n", (unsigned long long)i, zf, z);
        }
        u1 = ldexp((double)(((((uint64_t)r[0] << 32) | r[1]) >> 11) + 1), -53);
        t = ldexp((double)((((uint64_t)r[2] << 32) | r[3]) >> 11), -53);
        z = sqrt(-2 * log(u1)) * (i % 2 ? sin(2 * M_PI * t) : cos(2 * M_PI * t));
        double zd = al_philox_normal_f64(seed, off, i);
        if (fabs(zd - z) > 1e-14 * (1 + fabs(z))) {
            if (bad++ < 5) fprintf(stderr, "  normal f64 %llu: %.17g vs %.17g\n", (unsigned long long)i, zd, z);
        }
    }
    CHECK(bad == 0, "%d mapping mismatches", bad);
    CHECK(al_philox_counters(AL_DTYPE_F32, AL_RANDOM_UNIFORM, 9) == 3, "uniform f32: ceil(9/4)");
    CHECK(al_philox_counters(AL_DTYPE_BF16, AL_RANDOM_UNIFORM, 8) == 2, "uniform bf16: ceil(8/4)");
    CHECK(al_philox_counters(AL_DTYPE_F64, AL_RANDOM_UNIFORM, 9) == 5, "uniform f64: ceil(9/2)");
    CHECK(al_philox_counters(AL_DTYPE_F32, AL_RANDOM_NORMAL, 9) == 5, "normal f32: ceil(9/2)");
    CHECK(al_philox_counters(AL_DTYPE_F16, AL_RANDOM_NORMAL, 0) == 0, "empty fill uses nothing");
}

/* ---- deterministic math accuracy ---------------------------------------------------------------- */
static double ulp_err(double got, double want) {
    if (got == want) return 0;
    return fabs(got - want) / ldexp(1.0, ilogb(want) - 52);
}

static void test_detmath_accuracy(void) {
    uint64_t s = 0x1234567ull;
    double worst_log = 0, worst_sin = 0, worst_cos = 0;
    for (int i = 0; i < 1000000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t b = s >> 11;
        double u = ldexp((double)(b + 1), -53);
        if (i % 3 == 0) u = ldexp(u, -(int)(s & 63));   /* also tiny arguments */
        if (u != 1.0) {
            double e = ulp_err(al_det_log(u), log(u));
            if (e > worst_log) worst_log = e;
        }
        double sn, cs, t = ldexp((double)b, -53);
        al_det_sincos_2pi_frac(b, 53, &sn, &cs);
        /* reference: glibc on a double-double argument 2*pi*t is not available, so compare where the
         * reference is well conditioned and allow for the rounding of 2*pi*t (relative 2^-53). */
        double ws = sin(2 * M_PI * t), wc = cos(2 * M_PI * t);
        double es = fabs(sn - ws) / (ldexp(1.0, -52) * (fabs(ws) + 8 * fabs(wc) * 2 * M_PI * t));
        double ec = fabs(cs - wc) / (ldexp(1.0, -52) * (fabs(wc) + 8 * fabs(ws) * 2 * M_PI * t));
        if (es > worst_sin) worst_sin = es;
        if (ec > worst_cos) worst_cos = ec;
    }
    CHECK(worst_log <= 1.0, "al_det_log worst error %.3f ulp", worst_log);
    CHECK(worst_sin <= 2.0 && worst_cos <= 2.0, "sincos worst scaled error %.3f / %.3f", worst_sin, worst_cos);
    fprintf(stderr, "  detmath: log worst %.3f ulp; sin/cos worst %.3f / %.3f (units of 2^-52 x condition)\n",
            worst_log, worst_sin, worst_cos);
    /* exact points */
    double sn, cs;
    al_det_sincos_2pi_frac(0, 24, &sn, &cs);
    CHECK(sn == 0 && cs == 1, "sincos(0)");
    al_det_sincos_2pi_frac(1u << 22, 24, &sn, &cs);
    CHECK(fabs(sn - 1) < 1e-16 && fabs(cs) < 1e-16, "sincos(pi/2): %g %g", sn, cs);
    al_det_sincos_2pi_frac(3u << 22, 24, &sn, &cs);
    CHECK(fabs(sn + 1) < 1e-16 && fabs(cs) < 1e-16, "sincos(3pi/2): %g %g", sn, cs);
    CHECK(al_det_log(1.0) == 0.0 && fabs(al_det_log(0x1p-53) + 53 * M_LN2) < 1e-14, "log exact points");
}

/* ---- tensors ------------------------------------------------------------------------------------ */
static void fill_at(int32_t dtype, int32_t kind, int64_t n, uint64_t seed, uint64_t off, double *out) {
    al_tensor t;
    int64_t sz[1] = {n};
    CHECK_OK(al_tensor_empty(&t, 1, sz, dtype, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_random_at_(&t, kind, seed, off));
    CHECK_OK(al_tensor_read_f64(&t, out, n));
    al_tensor_release(&t);
}

static void moments(const double *v, int64_t n, double *mean, double *var) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *var = s2 / (n - 1);
}

static void test_uniform_stats(void) {
    const int64_t n = 1000000;
    double *v = malloc(sizeof(double) * n);
    const int32_t dts[] = {AL_DTYPE_F32, AL_DTYPE_F64, AL_DTYPE_F16, AL_DTYPE_BF16};
    for (int k = 0; k < 4; k++) {
        fill_at(dts[k], AL_RANDOM_UNIFORM, n, 0xabcdef12345ull + k, 77, v);
        double lo = 1, hi = 0;
        int64_t below_tenth = 0;
        for (int64_t i = 0; i < n; i++) {
            if (v[i] < lo) lo = v[i];
            if (v[i] > hi) hi = v[i];
            below_tenth += v[i] < 0.1;
        }
        double mean, var;
        moments(v, n, &mean, &var);
        /* grid of 2^-d: mean 0.5 - 2^-(d+1); sd of the mean ~ 0.29/1000 */
        double d = al_philox_uniform_digits(dts[k]);
        double emean = 0.5 - ldexp(0.5, -(int)d), evar = (1.0 - ldexp(1, -2 * (int)d)) / 12;
        CHECK(lo >= 0 && hi < 1, "%s uniform range [%g, %g]", al_dtype_name(dts[k]), lo, hi);
        CHECK(fabs(mean - emean) < 0.0015, "%s uniform mean %g", al_dtype_name(dts[k]), mean);
        CHECK(fabs(var - evar) < 0.0015, "%s uniform var %g (want %g)", al_dtype_name(dts[k]), var, evar);
        CHECK(labs(below_tenth - n / 10) < 1500, "%s uniform: %ld below 0.1", al_dtype_name(dts[k]), (long)below_tenth);
    }
    free(v);
}

static void test_normal_stats(void) {
    const int64_t n = 1000000;
    double *v = malloc(sizeof(double) * n);
    const int32_t dts[] = {AL_DTYPE_F32, AL_DTYPE_F64, AL_DTYPE_BF16};
    for (int k = 0; k < 3; k++) {
        fill_at(dts[k], AL_RANDOM_NORMAL, n, 0x5151ull + k, 3, v);
        double mean, var, m3 = 0, m4 = 0;
        int64_t tail = 0, bad = 0;
        moments(v, n, &mean, &var);
        for (int64_t i = 0; i < n; i++) {
            m3 += v[i] * v[i] * v[i];
            m4 += v[i] * v[i] * v[i] * v[i];
            tail += fabs(v[i]) > 2;
            bad += !isfinite(v[i]);
        }
        m3 /= n;
        m4 /= n;
        CHECK(bad == 0, "%s normal: %ld non-finite", al_dtype_name(dts[k]), (long)bad);
        CHECK(fabs(mean) < 0.005, "%s normal mean %g", al_dtype_name(dts[k]), mean);
        CHECK(fabs(var - 1) < 0.006, "%s normal var %g", al_dtype_name(dts[k]), var);
        CHECK(fabs(m3) < 0.02, "%s normal skew %g", al_dtype_name(dts[k]), m3);
        CHECK(fabs(m4 - 3) < 0.05, "%s normal kurtosis %g", al_dtype_name(dts[k]), m4);
        /* P(|z| > 2) = 0.0455; sd of the count ~ 208 */
        CHECK(labs(tail - 45500) < 1200, "%s normal: %ld beyond 2 sigma", al_dtype_name(dts[k]), (long)tail);
    }
    /* the cos and sin halves are uncorrelated */
    fill_at(AL_DTYPE_F64, AL_RANDOM_NORMAL, n, 99, 0, v);
    double c = 0;
    for (int64_t i = 0; i + 1 < n; i += 2) c += v[i] * v[i + 1];
    c /= n / 2;
    CHECK(fabs(c) < 0.01, "pair correlation %g", c);
    free(v);
}

/* Every dtype through the public fill equals the per-element rule (decoded through the dtype). */
static void test_fill_matches_rule(void) {
    const int64_t n = 257;
    double v[257];
    for (int32_t dt = 0; dt < AL_DTYPE_COUNT; dt++) {
        if (!al_dtype_is_float(dt)) continue;
        for (int32_t kind = 0; kind < 2; kind++) {
            uint64_t seed = 0xfeedfacecafebeefull ^ (uint64_t)(dt * 2 + kind), off = 12345;
            fill_at(dt, kind, n, seed, off, v);
            int bad = 0;
            for (int64_t i = 0; i < n; i++) {
                unsigned char buf[8];
                al_random_store(buf, dt, kind, seed, off, (uint64_t)i);
                double want = al_load_f64(buf, dt, 0);
                /* independent: f32 value then the dtype's conversion */
                double want2;
                if (dt == AL_DTYPE_F64) {
                    want2 = kind ? al_philox_normal_f64(seed, off, i) : al_philox_uniform_f64(seed, off, i);
                } else {
                    float f = kind ? al_philox_normal_f32(seed, off, i)
                                   : al_philox_uniform_digits_f32(seed, off, i, al_philox_uniform_digits(dt));
                    unsigned char b2[8];
                    al_store_f64(b2, dt, 0, (double)f);
                    want2 = al_load_f64(b2, dt, 0);
                }
                if (!(v[i] == want && want == want2)) bad++;
            }
            CHECK(bad == 0, "%s %s: %d elements differ from the rule", al_dtype_name(dt), kind ? "normal" : "uniform", bad);
        }
    }
    /* uniform values of narrow dtypes are on their exact grids */
    fill_at(AL_DTYPE_FP8_E4M3, AL_RANDOM_UNIFORM, n, 1, 0, v);
    int offgrid = 0;
    for (int64_t i = 0; i < n; i++) offgrid += v[i] * 16 != floor(v[i] * 16) || v[i] >= 1;
    CHECK(offgrid == 0, "e4m3 uniform: %d values off the 1/16 grid", offgrid);
}

static void test_same_seed_same_numbers(void) {
    double a[100], b[100], c[100];
    al_manual_seed(42);
    al_tensor t;
    int64_t sz[2] = {10, 10};
    CHECK_OK(al_tensor_empty(&t, 2, sz, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_random_(&t, AL_RANDOM_NORMAL));
    CHECK_OK(al_tensor_read_f64(&t, a, 100));
    CHECK_OK(al_tensor_random_(&t, AL_RANDOM_NORMAL));
    CHECK_OK(al_tensor_read_f64(&t, c, 100));
    al_manual_seed(42);
    CHECK_OK(al_tensor_random_(&t, AL_RANDOM_NORMAL));
    CHECK_OK(al_tensor_read_f64(&t, b, 100));
    CHECK(memcmp(a, b, sizeof a) == 0, "same seed gives the same numbers");
    CHECK(memcmp(a, c, sizeof a) != 0, "the next draw differs");
    al_manual_seed(43);
    CHECK_OK(al_tensor_random_(&t, AL_RANDOM_NORMAL));
    CHECK_OK(al_tensor_read_f64(&t, b, 100));
    int same = 0;
    for (int i = 0; i < 100; i++) same += a[i] == b[i];
    CHECK(same < 3, "another seed gives other numbers (%d equal)", same);
    al_tensor_release(&t);
}

/* A strided view is filled in row-major order of its own shape. */
static void test_strided_views(void) {
    al_tensor base, tr, nar;
    int64_t sz[2] = {6, 10};
    CHECK_OK(al_tensor_empty(&base, 2, sz, AL_DTYPE_F64, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_fill_(&base, -7.0));
    CHECK_OK(al_tensor_transpose(&tr, &base, 0, 1));          /* [10, 6], strides (1, 10) */
    CHECK_OK(al_tensor_narrow(&nar, &tr, 0, 3, 5));           /* rows 3..7 of the transpose */
    const uint64_t seed = 777, off = 9;
    CHECK_OK(al_tensor_random_at_(&nar, AL_RANDOM_UNIFORM, seed, off));
    double got[30], all[60];
    CHECK_OK(al_tensor_read_f64(&nar, got, 30));
    int bad = 0;
    for (int i = 0; i < 30; i++) bad += got[i] != al_philox_uniform_f64(seed, off, (uint64_t)i);
    CHECK(bad == 0, "transposed+narrowed view: %d elements off the row-major mapping", bad);
    /* untouched elements of the base keep their value; touched ones are base[c][r] for r in 3..7 */
    CHECK_OK(al_tensor_read_f64(&base, all, 60));
    int untouched = 0, touched_ok = 0;
    for (int r = 0; r < 6; r++)
        for (int c = 0; c < 10; c++) {
            double x = all[r * 10 + c];
            if (c >= 3 && c < 8) touched_ok += x == got[(c - 3) * 6 + r];
            else untouched += x == -7.0;
        }
    CHECK(touched_ok == 30 && untouched == 30, "element placement: %d touched ok, %d untouched", touched_ok, untouched);
    /* contiguous fill of the same shape gives the same sequence */
    al_tensor cont;
    int64_t csz[2] = {5, 6};
    CHECK_OK(al_tensor_empty(&cont, 2, csz, AL_DTYPE_F64, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_random_at_(&cont, AL_RANDOM_UNIFORM, seed, off));
    double cg[30];
    CHECK_OK(al_tensor_read_f64(&cont, cg, 30));
    CHECK(memcmp(cg, got, sizeof cg) == 0, "contiguous and strided fills of one shape agree");
    /* an expanded view (stride 0) is refused */
    al_tensor one, ex;
    int64_t osz[2] = {1, 4}, esz[2] = {3, 4};
    CHECK_OK(al_tensor_empty(&one, 2, osz, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_expand(&ex, &one, 2, esz));
    CHECK_ERR(al_tensor_random_at_(&ex, AL_RANDOM_UNIFORM, 1, 0), AL_ERR_ARG, "stride 0");
    al_tensor_release(&ex);
    al_tensor_release(&one);
    al_tensor_release(&cont);
    al_tensor_release(&nar);
    al_tensor_release(&tr);
    al_tensor_release(&base);
}

static void test_offset_advance(void) {
    uint64_t seed, off;
    al_manual_seed(0xdead);
    al_rng_get_state(&seed, &off);
    CHECK(seed == 0xdead && off == 0, "manual_seed resets the offset (%llu, %llu)", (unsigned long long)seed,
          (unsigned long long)off);
    const struct { int32_t dt, kind; int64_t n; uint64_t adv; } cases[] = {
        {AL_DTYPE_F32, AL_RANDOM_UNIFORM, 9, 3}, {AL_DTYPE_F16, AL_RANDOM_UNIFORM, 4, 1},
        {AL_DTYPE_F64, AL_RANDOM_UNIFORM, 5, 3}, {AL_DTYPE_F32, AL_RANDOM_NORMAL, 7, 4},
        {AL_DTYPE_F64, AL_RANDOM_NORMAL, 2, 1},  {AL_DTYPE_FP8_E5M2, AL_RANDOM_NORMAL, 1, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        al_tensor t;
        CHECK_OK(al_tensor_empty(&t, 1, &cases[k].n, cases[k].dt, AL_DEVICE_CPU, 0));
        uint64_t before, after;
        al_rng_get_state(NULL, &before);
        CHECK_OK(al_tensor_random_(&t, cases[k].kind));
        al_rng_get_state(NULL, &after);
        CHECK(after - before == cases[k].adv, "case %zu: advanced by %llu, want %llu", k,
              (unsigned long long)(after - before), (unsigned long long)cases[k].adv);
        al_tensor_release(&t);
    }
    /* two fills of 8 continue one fill of 16 */
    double big[16], p1[8], p2[8];
    al_rng_set_state(5, 100);
    fill_at(AL_DTYPE_F32, AL_RANDOM_UNIFORM, 16, 5, 100, big);
    al_tensor t;
    int64_t n8 = 8;
    CHECK_OK(al_tensor_empty(&t, 1, &n8, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_random_(&t, AL_RANDOM_UNIFORM));
    CHECK_OK(al_tensor_read_f64(&t, p1, 8));
    CHECK_OK(al_tensor_random_(&t, AL_RANDOM_UNIFORM));
    CHECK_OK(al_tensor_read_f64(&t, p2, 8));
    CHECK(memcmp(big, p1, sizeof p1) == 0 && memcmp(big + 8, p2, sizeof p2) == 0, "consecutive fills continue the stream");
    al_rng_get_state(&seed, &off);
    CHECK(seed == 5 && off == 104, "set_state/advance: (%llu, %llu)", (unsigned long long)seed, (unsigned long long)off);
    CHECK(al_rng_reserve(10) == 104, "reserve returns the first counter");
    al_rng_get_state(NULL, &off);
    CHECK(off == 114, "reserve advances");
    /* a failed fill consumes nothing */
    al_tensor bad;
    CHECK_OK(al_tensor_empty(&bad, 1, &n8, AL_DTYPE_I32, AL_DEVICE_CPU, 0));
    CHECK_ERR(al_tensor_random_(&bad, AL_RANDOM_UNIFORM), AL_ERR_ARG, "i32");
    al_rng_get_state(NULL, &off);
    CHECK(off == 114, "a refused fill does not advance the generator");
    al_tensor_release(&bad);
    al_tensor_release(&t);
}

static void test_errors(void) {
    al_tensor t;
    int64_t n = 4;
    CHECK_OK(al_tensor_empty(&t, 1, &n, AL_DTYPE_BOOL, AL_DEVICE_CPU, 0));
    CHECK_ERR(al_tensor_random_at_(&t, AL_RANDOM_NORMAL, 1, 0), AL_ERR_ARG, "random_");
    CHECK(strstr(al_last_error(), "bool") != NULL, "message names the dtype: %s", al_last_error());
    al_tensor_release(&t);
    CHECK_OK(al_tensor_empty(&t, 1, &n, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_ERR(al_tensor_random_at_(&t, 7, 1, 0), AL_ERR_ARG, "kind");
    al_tensor_release(&t);
    CHECK_ERR(al_tensor_random_(&t, AL_RANDOM_UNIFORM), AL_ERR_ARG, "released");
    CHECK_ERR(al_tensor_random_(NULL, AL_RANDOM_UNIFORM), AL_ERR_ARG, "random_");
    /* empty tensors are fine and consume nothing */
    int64_t z = 0;
    uint64_t before, after;
    CHECK_OK(al_tensor_empty(&t, 1, &z, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    al_rng_get_state(NULL, &before);
    CHECK_OK(al_tensor_random_(&t, AL_RANDOM_NORMAL));
    al_rng_get_state(NULL, &after);
    CHECK(before == after, "empty fill consumes no counters");
    al_tensor_release(&t);
}

/* Concurrent reservations hand out disjoint ranges. */
#define NTHREADS 4
#define NRES 20000
static uint64_t g_firsts[NTHREADS][NRES];
static void *reserver(void *arg) {
    int k = (int)(intptr_t)arg;
    for (int i = 0; i < NRES; i++) g_firsts[k][i] = al_rng_reserve(3);
    return NULL;
}
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
static void test_reserve_threads(void) {
    al_rng_set_state(1, 1000);
    pthread_t th[NTHREADS];
    for (int k = 0; k < NTHREADS; k++) pthread_create(&th[k], NULL, reserver, (void *)(intptr_t)k);
    for (int k = 0; k < NTHREADS; k++) pthread_join(th[k], NULL);
    uint64_t off;
    al_rng_get_state(NULL, &off);
    CHECK(off == 1000 + 3ull * NTHREADS * NRES, "final offset %llu", (unsigned long long)off);
    qsort(g_firsts, NTHREADS * NRES, sizeof(uint64_t), cmp_u64);
    int overlaps = 0;
    uint64_t *f = &g_firsts[0][0];
    for (int i = 1; i < NTHREADS * NRES; i++) overlaps += f[i] - f[i - 1] != 3;
    CHECK(overlaps == 0 && f[0] == 1000, "%d overlapping reservations", overlaps);
}

static void test_default_state(void) {
    uint64_t seed, off;
    al_rng_get_state(&seed, &off);
    CHECK(seed == 0x5eed && off == 0, "default state (%#llx, %llu)", (unsigned long long)seed, (unsigned long long)off);
}

int main(void) {
    RUN(test_default_state);   /* first: before anything seeds */
    RUN(test_philox_kat);
    RUN(test_mapping_rules);
    RUN(test_detmath_accuracy);
    RUN(test_uniform_stats);
    RUN(test_normal_stats);
    RUN(test_fill_matches_rule);
    RUN(test_same_seed_same_numbers);
    RUN(test_strided_views);
    RUN(test_offset_advance);
    RUN(test_errors);
    RUN(test_reserve_threads);
    return SUMMARY("rng");
}
