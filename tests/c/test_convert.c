/*
 * test_convert.c — the bit-exact conversions of src/numeric/convert.h and their exported wrappers.
 *
 * Oracles (independent of the bit manipulation under test):
 *   - decoding: a formula from the bit fields with ldexp;
 *   - encoding: a table of every finite value of the format (built with that formula), a binary
 *     search for the enclosing pair and a comparison with their exact midpoint (ties to the even
 *     code); IEEE overflow (f16/bf16) treats inf as the code after the max, FP8 saturates;
 *   - f16 additionally against the compiler's _Float16 conversions (float and double sources).
 * Set ATTNLAB_EXHAUSTIVE=1 to also sweep all 2^32 f32 inputs for every format (slow, ~1 minute).
 */
#include "test_main.h"
#include "internal.h"          /* al_load_f64, al_store_f64 */
#include "numeric/convert.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* ---- formats -------------------------------------------------------------------------------- */
typedef struct fmt {
    const char *name;
    int bits, ebits, mbits, bias;
    int ieee;          /* 1: exp all-ones is inf/NaN, overflow -> inf; 0: OCP e4m3 (S.1111.111 NaN) */
    int saturate;      /* FP8: overflow -> max finite */
    uint32_t maxcode;  /* largest finite magnitude code */
    uint32_t ovfcode;  /* magnitude code produced by overflow */
    uint32_t nancode;  /* magnitude code of the canonical NaN produced by encoders */
} fmt;

static const fmt F16 = {"f16", 16, 5, 10, 15, 1, 0, 0x7BFF, 0x7C00, 0x7E00};
static const fmt BF16 = {"bf16", 16, 8, 7, 127, 1, 0, 0x7F7F, 0x7F80, 0x7FC0};
static const fmt E4M3 = {"e4m3", 8, 4, 3, 7, 0, 1, 0x7E, 0x7E, 0x7F};
static const fmt E5M2 = {"e5m2", 8, 5, 2, 15, 1, 1, 0x7B, 0x7B, 0x7E};

/* Independent decoder: value of a code from its fields. */
static double ref_decode(const fmt *f, uint32_t code) {
    uint32_t sign = code >> (f->bits - 1);
    uint32_t e = (code >> f->mbits) & ((1u << f->ebits) - 1u);
    uint32_t m = code & ((1u << f->mbits) - 1u);
    uint32_t emax_field = (1u << f->ebits) - 1u;
    double v;
    if (f->ieee && e == emax_field) v = m ? NAN : INFINITY;
    else if (!f->ieee && e == emax_field && m == (1u << f->mbits) - 1u) v = NAN;
    else if (e == 0) v = ldexp((double)m, 1 - f->bias - f->mbits);
    else v = ldexp((double)((1u << f->mbits) + m), (int)e - f->bias - f->mbits);
    return sign ? -v : v;
}

static uint32_t enc32(const fmt *f, float x) {
    if (f == &F16) return al_f32_to_f16_bits(x);
    if (f == &BF16) return al_f32_to_bf16_bits(x);
    if (f == &E4M3) return al_f32_to_e4m3_bits(x);
    return al_f32_to_e5m2_bits(x);
}
static uint32_t enc64(const fmt *f, double x) {
    if (f == &F16) return al_f64_to_f16(x);
    if (f == &BF16) return al_f64_to_bf16(x);
    if (f == &E4M3) return al_f64_to_e4m3(x);
    return al_f64_to_e5m2(x);
}
/* The bit-exact decoders (numeric/convert.h): NaN payloads survive. The exported al_*_bits_to_f32
 * wrappers return payload-free NaNs instead (LuaJIT safety), checked in test_exported_nans. */
static float dec32(const fmt *f, uint32_t c) {
    if (f == &F16) return al_f16_to_f32((uint16_t)c);
    if (f == &BF16) return al_bf16_to_f32((uint16_t)c);
    if (f == &E4M3) return al_e4m3_to_f32((uint8_t)c);
    return al_e5m2_to_f32((uint8_t)c);
}
static float dec32_exported(const fmt *f, uint32_t c) {
    if (f == &F16) return al_f16_bits_to_f32((uint16_t)c);
    if (f == &BF16) return al_bf16_bits_to_f32((uint16_t)c);
    if (f == &E4M3) return al_e4m3_bits_to_f32((uint8_t)c);
    return al_e5m2_bits_to_f32((uint8_t)c);
}

/* Table of the finite non-negative values, indexed by magnitude code 0..maxcode (monotone). */
static double *g_table[4];
static const fmt *g_fmts[4] = {&F16, &BF16, &E4M3, &E5M2};
static double *table_of(const fmt *f) {
    for (int k = 0; k < 4; k++)
        if (g_fmts[k] == f) return g_table[k];
    return NULL;
}

/* Reference encoder of a double (any value), by table search and midpoint comparison. */
static uint32_t ref_encode(const fmt *f, double x) {
    uint32_t sign = signbit(x) ? 1u << (f->bits - 1) : 0u;
    if (isnan(x)) return sign | f->nancode;
    double a = fabs(x);
    const double *t = table_of(f);
    double max = t[f->maxcode];
    if (a >= max) {
        if (f->saturate) return sign | f->maxcode;
        /* IEEE: the next "value" after max is 2^(emax+1), with the inf code (even) */
        double next = ldexp(1.0, (1 << (f->ebits - 1)));
        double mid = (max + next) / 2;
        if (a < mid) return sign | f->maxcode;
        return sign | f->ovfcode;   /* tie: inf code is even, max code is odd */
    }
    uint32_t lo = 0, hi = f->maxcode;   /* t[lo] <= a < t[hi] */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (t[mid] <= a) lo = mid;
        else hi = mid;
    }
    double mid = (t[lo] + t[hi]) / 2;   /* exact: both have few significant bits */
    uint32_t c;
    if (a < mid) c = lo;
    else if (a > mid) c = hi;
    else c = (lo & 1u) ? hi : lo;
    return sign | c;
}

static int is_nan_code(const fmt *f, uint32_t c) { return isnan(ref_decode(f, c)); }

/* Mismatch bookkeeping: count, and print the first few. */
static long g_bad;
#define EXPECT_CODE(f, got, want, x)                                                             \
    do {                                                                                         \
        uint32_t g_ = (got), w_ = (want);                                                        \
        int ok_ = g_ == w_ || (is_nan_code((f), g_) && is_nan_code((f), w_));                    \
        if (!ok_ && g_bad++ < 8)                                                                 \
            fprintf(stderr, "  %s(%.17g = %a): got 0x%x, want 0x%x\n", (f)->name, (double)(x),    \
                    (double)(x), g_, w_);                                                        \
    } while (0)

static void build_tables(void) {
    for (int k = 0; k < 4; k++) {
        const fmt *f = g_fmts[k];
        g_table[k] = malloc(sizeof(double) * (f->maxcode + 1));
        for (uint32_t c = 0; c <= f->maxcode; c++) g_table[k][c] = ref_decode(f, c);
    }
}

/* ---- decoding -------------------------------------------------------------------------------- */
static void check_decode_all(const fmt *f) {
    long bad = 0;
    uint32_t ncodes = 1u << f->bits;
    for (uint32_t c = 0; c < ncodes; c++) {
        double want = ref_decode(f, c);
        float got = dec32(f, c);
        int ok = isnan(want) ? isnan(got) && (signbit(got) != 0) == (c >> (f->bits - 1))
                             : (double)got == want && !signbit(got) == !signbit(want);
        if (!ok && bad++ < 8) fprintf(stderr, "  %s decode 0x%x: got %a want %a\n", f->name, c, got, want);
    }
    CHECK(bad == 0, "%s: %ld of %u codes decode wrongly", f->name, bad, ncodes);
}

static void test_decode_fp8(void) {
    check_decode_all(&E4M3);
    check_decode_all(&E5M2);
    /* spot values of the OCP spec */
    CHECK(al_e4m3_bits_to_f32(0x7E) == 448.0f, "e4m3 max");
    CHECK(al_e4m3_bits_to_f32(0x01) == ldexpf(1, -9), "e4m3 min subnormal");
    CHECK(al_e4m3_bits_to_f32(0x08) == ldexpf(1, -6), "e4m3 min normal");
    CHECK(isnan(al_e4m3_bits_to_f32(0x7F)) && isnan(al_e4m3_bits_to_f32(0xFF)), "e4m3 NaN");
    CHECK(al_e4m3_bits_to_f32(0x78) == 256.0f, "e4m3 0x78 is finite (no inf in e4m3)");
    CHECK(al_e5m2_bits_to_f32(0x7B) == 57344.0f, "e5m2 max");
    CHECK(isinf(al_e5m2_bits_to_f32(0x7C)) && al_e5m2_bits_to_f32(0xFC) < 0, "e5m2 inf");
    CHECK(isnan(al_e5m2_bits_to_f32(0x7D)) && isnan(al_e5m2_bits_to_f32(0x7E)) &&
              isnan(al_e5m2_bits_to_f32(0x7F)) && isnan(al_e5m2_bits_to_f32(0xFD)), "e5m2 NaNs");
    CHECK(al_e5m2_bits_to_f32(0x01) == ldexpf(1, -16), "e5m2 min subnormal");
    CHECK(signbit(al_e4m3_bits_to_f32(0x80)) && al_e4m3_bits_to_f32(0x80) == 0, "e4m3 -0");
}

static void test_decode_f16_bf16(void) {
    check_decode_all(&F16);
    check_decode_all(&BF16);
    CHECK(al_f16_bits_to_f32(0x7BFF) == 65504.0f, "f16 max");
    CHECK(al_f16_bits_to_f32(0x0001) == ldexpf(1, -24), "f16 min subnormal");
    CHECK(al_bf16_bits_to_f32(0x3F80) == 1.0f, "bf16 one");
}

/* Every code decodes and re-encodes (from f32 and from f64) to itself; NaNs to a NaN. */
static void check_roundtrip(const fmt *f) {
    g_bad = 0;
    uint32_t ncodes = 1u << f->bits;
    for (uint32_t c = 0; c < ncodes; c++) {
        float v = dec32(f, c);
        uint32_t want = c;
        if (isnan(v)) want = (c & (1u << (f->bits - 1))) | f->nancode;
        if (isinf(v) && f->saturate) want = (c & (1u << (f->bits - 1))) | f->maxcode;  /* e5m2 inf */
        if (isnan(v) && f->ieee && f->bits == 16) {
            /* f16/bf16 keep the payload and set the quiet bit */
            want = c | (f == &F16 ? 0x0200u : 0x0040u);
            CHECK(enc32(f, v) == want && enc64(f, (double)v) == want, "%s NaN 0x%x -> 0x%x / 0x%x, want 0x%x",
                  f->name, c, enc32(f, v), enc64(f, (double)v), want);
            continue;
        }
        EXPECT_CODE(f, enc32(f, v), want, v);
        EXPECT_CODE(f, enc64(f, (double)v), want, v);
    }
    CHECK(g_bad == 0, "%s: %ld roundtrip mismatches", f->name, g_bad);
}

static void test_roundtrip_all_codes(void) {
    for (int k = 0; k < 4; k++) check_roundtrip(g_fmts[k]);
}

/* ---- encoding sweeps ------------------------------------------------------------------------- */
static uint64_t g_rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd64(void) {   /* splitmix64 */
    uint64_t z = (g_rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void check_f32(const fmt *f, float x) {
    uint32_t want = ref_encode(f, x);
    EXPECT_CODE(f, enc32(f, x), want, x);
    EXPECT_CODE(f, enc64(f, (double)x), want, x);
    float nx = -x;
    want = ref_encode(f, nx);
    EXPECT_CODE(f, enc32(f, nx), want, nx);
}
static void check_f64(const fmt *f, double x) {
    EXPECT_CODE(f, enc64(f, x), ref_encode(f, x), x);
    EXPECT_CODE(f, enc64(f, -x), ref_encode(f, -x), -x);
}

/* Around every boundary: each value, each midpoint, the f32 neighbours of both (a few ulps), double
 * neighbours of the midpoint (single rounding from f64), and random points inside each interval. */
static void check_sweep(const fmt *f) {
    g_bad = 0;
    const double *t = table_of(f);
    double max = t[f->maxcode];
    double next = f->saturate ? max * 2 : ldexp(1.0, 1 << (f->ebits - 1));
    for (uint32_t c = 0; c <= f->maxcode; c++) {
        double a = t[c], b = c < f->maxcode ? t[c + 1] : next;
        double mid = (a + b) / 2;
        float pts[3] = {(float)a, (float)mid, (float)b};
        for (int p = 0; p < 3; p++) {
            float x = pts[p];
            if (isinf(x)) continue;
            check_f32(f, x);
            float up = x, dn = x;
            for (int k = 0; k < 3; k++) {
                up = nextafterf(up, INFINITY);
                dn = nextafterf(dn, 0.0f);
                check_f32(f, up);
                check_f32(f, dn);
            }
        }
        check_f64(f, mid);
        check_f64(f, nextafter(mid, INFINITY));
        check_f64(f, nextafter(mid, 0.0));
        for (int k = 0; k < 8; k++) {
            double u = (double)(rnd64() >> 11) * 0x1p-53;
            double x = a + (b - a) * u;
            check_f32(f, (float)x);
            check_f64(f, x);
        }
    }
    CHECK(g_bad == 0, "%s: %ld mismatches in the boundary sweep", f->name, g_bad);
}

static void test_boundary_sweeps(void) {
    for (int k = 0; k < 4; k++) check_sweep(g_fmts[k]);
}

/* Random f32 and f64 bit patterns (all exponents, NaNs and infs included). */
static void test_random_bits(void) {
    for (int k = 0; k < 4; k++) {
        const fmt *f = g_fmts[k];
        g_bad = 0;
        for (int i = 0; i < 2000000; i++) {
            uint64_t r = rnd64();
            float x;
            uint32_t u = (uint32_t)r;
            memcpy(&x, &u, 4);
            EXPECT_CODE(f, enc32(f, x), ref_encode(f, x), x);
            EXPECT_CODE(f, enc64(f, (double)x), ref_encode(f, x), x);
            /* doubles concentrated near the format's range: exponent in [-40, 20] */
            double d = ldexp(1.0 + (double)(r >> 12) * 0x1p-52, (int)(rnd64() % 61) - 40);
            if (r & 1) d = -d;
            EXPECT_CODE(f, enc64(f, d), ref_encode(f, d), d);
            /* and raw double bit patterns */
            double d2;
            memcpy(&d2, &r, 8);
            EXPECT_CODE(f, enc64(f, d2), ref_encode(f, d2), d2);
        }
        CHECK(g_bad == 0, "%s: %ld mismatches over random bit patterns", f->name, g_bad);
    }
}

/* Rounding to odd (al_f64_to_f32_odd) then the float encoder equals the double encoder, for every target
 * (the GPU's vectorised FP8 quantise / dequantise rely on it: src/cuda/fp8.cu). Doubles of every kind:
 * raw bit patterns (infinities, beyond the float range), values near the FP8 / f16 ranges, tiny ones, and
 * representable values nudged by a few ulps of the double (the midpoint neighbourhoods). */
static void test_round_to_odd(void) {
    long bad = 0;
    for (int i = 0; i < 2000000; i++) {
        uint64_t r = rnd64();
        double d;
        switch (i % 4) {
        case 0: memcpy(&d, &r, 8); break;
        case 1: d = ldexp(1.0 + (double)(r >> 12) * 0x1p-52, (int)(rnd64() % 61) - 40); break;
        case 2: d = ldexp(1.0 + (double)(r >> 12) * 0x1p-52, (int)(rnd64() % 320) - 170); break;
        default: d = (double)((int)(rnd64() % 4096) - 2048) / 64.0 + ldexp((double)((int)(rnd64() % 64) - 32), -45); break;
        }
        if (i % 4 != 0 && (r & 1)) d = -d;
        if (d != d) continue;
        const float f = al_f64_to_f32_odd(d);
        int ok = al_f32_to_bf16(f) == al_f64_to_bf16(d) && al_f32_to_f16(f) == al_f64_to_f16(d) &&
                 al_f32_to_e4m3(f) == al_f64_to_e4m3(d) && al_f32_to_e5m2(f) == al_f64_to_e5m2(d);
        if (!ok && bad++ < 5) fprintf(stderr, "round to odd: %.17g -> %.9g differs\n", d, (double)f);
    }
    CHECK(bad == 0, "%ld doubles whose odd-rounded float encodes differently", bad);
    const double edge[] = {1.0 / 0.0, -1.0 / 0.0, 1e300, -1e300, 3.4028235677973366e38, 464.0, 61440.0, 65520.0,
                           0x1p-150, -0x1p-160, 0.0, -0.0};
    for (size_t k = 0; k < sizeof edge / sizeof edge[0]; k++) {
        const float f = al_f64_to_f32_odd(edge[k]);
        CHECK(al_f32_to_bf16(f) == al_f64_to_bf16(edge[k]) && al_f32_to_f16(f) == al_f64_to_f16(edge[k]) &&
                  al_f32_to_e4m3(f) == al_f64_to_e4m3(edge[k]) && al_f32_to_e5m2(f) == al_f64_to_e5m2(edge[k]),
              "round to odd differs at %.17g", edge[k]);
    }
}

/* f16 against the compiler's _Float16 (libgcc soft-float or F16C): float and double sources. */
static void test_f16_vs_compiler(void) {
#if defined(__FLT16_MAX__)
    g_bad = 0;
    for (int i = 0; i < 4000000; i++) {
        uint64_t r = rnd64();
        uint32_t u = (uint32_t)r;
        float x;
        memcpy(&x, &u, 4);
        _Float16 h = (_Float16)x;
        uint16_t hb;
        memcpy(&hb, &h, 2);
        EXPECT_CODE(&F16, al_f32_to_f16_bits(x), hb, x);
        double d = ldexp(1.0 + (double)(r >> 12) * 0x1p-52, (int)(rnd64() % 50) - 30);
        _Float16 hd = (_Float16)d;
        memcpy(&hb, &hd, 2);
        EXPECT_CODE(&F16, al_f64_to_f16(d), hb, d);
        /* decode agrees with the compiler's widening */
        uint16_t c = (uint16_t)(r >> 48);
        memcpy(&h, &c, 2);
        float w = (float)h, g = al_f16_bits_to_f32(c);
        if (!(w == g || (isnan(w) && isnan(g))) && g_bad++ < 8) fprintf(stderr, "  decode 0x%x\n", c);
    }
    CHECK(g_bad == 0, "f16 vs _Float16: %ld mismatches", g_bad);
#else
    fprintf(stderr, "  (no _Float16 in this compiler: the table oracle covers f16)\n");
#endif
}

/* ---- named cases ----------------------------------------------------------------------------- */
static void test_special_cases(void) {
    /* signed zeros */
    CHECK(al_f32_to_f16_bits(-0.0f) == 0x8000 && al_f32_to_f16_bits(0.0f) == 0, "f16 zeros");
    CHECK(al_f32_to_bf16_bits(-0.0f) == 0x8000, "bf16 -0");
    CHECK(al_f32_to_e4m3_bits(-0.0f) == 0x80 && al_f32_to_e5m2_bits(-0.0f) == 0x80, "fp8 -0");
    CHECK(al_f32_to_e4m3_bits(-1e-30f) == 0x80, "tiny negative rounds to -0");
    /* saturation */
    CHECK(al_f32_to_e4m3_bits(1e9f) == 0x7E && al_f32_to_e4m3_bits(-1e9f) == 0xFE, "e4m3 saturates");
    CHECK(al_f32_to_e4m3_bits(INFINITY) == 0x7E && al_f32_to_e4m3_bits(-INFINITY) == 0xFE, "e4m3 inf saturates");
    CHECK(al_f32_to_e4m3_bits(464.0f) == 0x7E, "e4m3: 464 (the midpoint to 480) saturates to 448");
    CHECK(al_f32_to_e4m3_bits(449.0f) == 0x7E, "e4m3 449 -> 448");
    CHECK(al_f32_to_e5m2_bits(INFINITY) == 0x7B && al_f32_to_e5m2_bits(-INFINITY) == 0xFB, "e5m2 inf saturates");
    CHECK(al_f32_to_e5m2_bits(1e6f) == 0x7B, "e5m2 saturates");
    CHECK(al_f32_to_f16_bits(65520.0f) == 0x7C00, "f16: 65520 (tie past max) -> inf");
    CHECK(al_f32_to_f16_bits(65519.99f) == 0x7BFF, "f16: just below the tie -> max");
    CHECK(al_f32_to_bf16_bits(3.4e38f) == 0x7F80, "bf16 overflow -> inf");
    /* NaNs */
    CHECK(al_f32_to_e4m3_bits(NAN) == 0x7F && al_f32_to_e4m3_bits(-NAN) == 0xFF, "e4m3 NaN");
    CHECK(al_f32_to_e5m2_bits(NAN) == 0x7E && al_f32_to_e5m2_bits(-NAN) == 0xFE, "e5m2 NaN");
    CHECK((al_f32_to_f16_bits(NAN) & 0x7E00) == 0x7E00, "f16 quiet NaN");
    float snan;
    uint32_t snan_bits = 0x7F800001u;
    memcpy(&snan, &snan_bits, 4);
    CHECK(al_f32_to_bf16_bits(snan) == 0x7FC0, "bf16: a signalling NaN whose payload is in the low bits stays NaN");
    CHECK(al_f32_to_f16_bits(snan) == 0x7E00, "f16: signalling NaN -> quiet NaN");
    /* ties to even */
    CHECK(al_f32_to_e4m3_bits(1.0625f) == 0x38, "e4m3: 1 + 1/16 ties to 1.0 (even)");
    CHECK(al_f32_to_e4m3_bits(1.1875f) == 0x3A, "e4m3: 1 + 3/16 ties to 1.25 (even)");
    CHECK(al_f32_to_e5m2_bits(1.125f) == 0x3C, "e5m2: 1 + 1/8 ties to 1.0");
    CHECK(al_f32_to_f16_bits(1.0f + 0x1p-11f) == 0x3C00, "f16: 1 + 2^-11 ties to 1");
    CHECK(al_f32_to_bf16_bits(1.0f + 0x1p-8f) == 0x3F80, "bf16: 1 + 2^-8 ties to 1");
    CHECK(al_f32_to_bf16_bits(1.0f + 0x3p-8f) == 0x3F82, "bf16: 1 + 3*2^-8 ties up to even");
    /* subnormals */
    CHECK(al_f32_to_e4m3_bits(0x1p-10f) == 0x00, "e4m3: half the min subnormal ties to 0");
    CHECK(al_f32_to_e4m3_bits(0x1.000002p-10f) == 0x01, "e4m3: just above half -> min subnormal");
    CHECK(al_f32_to_e4m3_bits(0x3p-10f) == 0x02, "e4m3: 1.5 subnormal ulps ties to 2");
    CHECK(al_f32_to_e5m2_bits(0x1p-17f) == 0x00 && al_f32_to_e5m2_bits(0x1.8p-17f) == 0x01, "e5m2 subnormal rounding");
    CHECK(al_f32_to_f16_bits(0x1p-25f) == 0 && al_f32_to_f16_bits(0x1.000002p-25f) == 1, "f16 subnormal rounding");
    CHECK(al_f32_to_f16_bits(0x1.ffcp-15f) == 0x0400, "f16: subnormal rounding up into the min normal");
    CHECK(al_f32_to_bf16_bits(0x1p-140f) == 0x0000, "bf16: far below the min subnormal -> 0");
    CHECK(al_f32_to_bf16_bits(0x1.8p-133f) == 0x0002, "bf16: 1.5 subnormal ulps ties to 2");
    CHECK(al_f32_to_bf16_bits(0x1.01p-134f) == 0x0001, "bf16: just above half the min subnormal -> 1");
    CHECK(al_bf16_bits_to_f32(al_f32_to_bf16_bits(0x1p-133f)) == 0x1p-133f, "bf16 min subnormal survives");
    /* single rounding from f64: a double just above a midpoint must round up, even though the
     * f32 conversion would first land exactly on the midpoint and then tie to even */
    double d = 1.0625 + 0x1p-40;
    CHECK(al_f64_to_e4m3(d) == 0x39, "e4m3 from f64 rounds once (got 0x%x)", al_f64_to_e4m3(d));
    CHECK(al_f32_to_e4m3_bits((float)d) == 0x38, "via f32 the same value ties down");
    d = 1.0 + 0x1p-11 + 0x1p-40;
    CHECK(al_f64_to_f16(d) == 0x3C01, "f16 from f64 rounds once");
    CHECK(al_f64_to_bf16(1.0 + 0x1p-8 + 0x1p-45) == 0x3F81, "bf16 from f64 rounds once");
}

/* al_load_f64 / al_store_f64: every dtype. */
static void test_load_store(void) {
    unsigned char buf[64];
    const double vals[] = {0.3, -2.75, 1e10, -1e10, 300.7, -0.0, 1e-9, 65519.0, NAN, 123456.789};
    for (int dt = 0; dt < AL_DTYPE_COUNT; dt++) {
        for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++) {
            double v = vals[k];
            memset(buf, 0xAB, sizeof buf);
            al_store_f64(buf, dt, 3, v);
            double got = al_load_f64(buf, dt, 3);
            double want;
            switch (dt) {
            case AL_DTYPE_F32: want = (double)(float)v; break;
            case AL_DTYPE_F64: want = v; break;
            case AL_DTYPE_F16: want = ref_decode(&F16, ref_encode(&F16, v)); break;
            case AL_DTYPE_BF16: want = ref_decode(&BF16, ref_encode(&BF16, v)); break;
            case AL_DTYPE_FP8_E4M3: want = ref_decode(&E4M3, ref_encode(&E4M3, v)); break;
            case AL_DTYPE_FP8_E5M2: want = ref_decode(&E5M2, ref_encode(&E5M2, v)); break;
            case AL_DTYPE_I32: want = isnan(v) ? 0 : v >= 2147483647.0 ? 2147483647.0 : v <= -2147483648.0 ? -2147483648.0 : trunc(v); break;
            case AL_DTYPE_I64: want = isnan(v) ? 0 : trunc(v); break;
            case AL_DTYPE_U8: want = isnan(v) ? 0 : v <= 0 ? 0 : v >= 255 ? 255 : trunc(v); break;
            default: want = v != 0 ? 1 : 0; break;
            }
            CHECK(got == want || (isnan(got) && isnan(want)), "dtype %s store %g: load gives %.17g, want %.17g",
                  al_dtype_name(dt), v, got, want);
            /* neighbours untouched */
            int64_t es = al_dtype_size(dt);
            CHECK(buf[2 * es + es - 1] == 0xAB && buf[4 * es] == 0xAB, "dtype %s: neighbours clobbered", al_dtype_name(dt));
        }
    }
    int64_t i64;
    al_store_f64(&i64, AL_DTYPE_I64, 0, 1e19);
    CHECK(i64 == INT64_MAX, "i64 saturates high");
    al_store_f64(&i64, AL_DTYPE_I64, 0, -1e19);
    CHECK(i64 == INT64_MIN, "i64 saturates low");
    al_store_f64(&i64, AL_DTYPE_I64, 0, -7.9);
    CHECK(i64 == -7, "i64 truncates toward zero");
    uint8_t u8;
    al_store_f64(&u8, AL_DTYPE_U8, 0, -3.5);
    CHECK(u8 == 0, "u8 saturates at 0");
    al_store_f64(&u8, AL_DTYPE_BOOL, 0, NAN);
    CHECK(u8 == 1, "bool NaN != 0");
    al_store_f64(&u8, AL_DTYPE_BOOL, 0, -0.0);
    CHECK(u8 == 0, "bool -0 is false");
}

/* Optional: all 2^32 f32 inputs for every format (ATTNLAB_EXHAUSTIVE=1). */
static void test_exhaustive(void) {
    const char *e = getenv("ATTNLAB_EXHAUSTIVE");
    if (!e || strcmp(e, "1") != 0) return;
    for (int k = 0; k < 4; k++) {
        const fmt *f = g_fmts[k];
        long bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
        for (int64_t i = 0; i < (1ll << 32); i++) {
            uint32_t u = (uint32_t)i;
            float x;
            memcpy(&x, &u, 4);
            uint32_t w = ref_encode(f, x), g = enc32(f, x), g2 = enc64(f, (double)x);
            int ok = (g == w || (is_nan_code(f, g) && is_nan_code(f, w))) && g2 == g;
            if (!ok) bad++;
        }
        CHECK(bad == 0, "%s: %ld of 2^32 f32 inputs encode wrongly", f->name, bad);
        fprintf(stderr, "  exhaustive %s: %ld mismatches\n", f->name, bad);
    }
}

/* The exported decoders give every code's value bit-exactly, except NaNs: those come back as the
 * default quiet NaN with the code's sign (no payload), which LuaJIT can hold. */
static void test_exported_nans(void) {
    for (int k = 0; k < 4; k++) {
        const fmt *f = g_fmts[k];
        uint32_t ncodes = 1u << f->bits;
        for (uint32_t c = 0; c < ncodes; c++) {
            float full = dec32(f, c), pub = dec32_exported(f, c);
            uint32_t fb, pb;
            memcpy(&fb, &full, 4);
            memcpy(&pb, &pub, 4);
            if (full == full) {
                CHECK(fb == pb, "%s code 0x%x: exported 0x%08x, exact 0x%08x", f->name, c, pb, fb);
            } else {
                CHECK((pb & 0x7fffffffu) == 0x7fc00000u && (pb >> 31) == (fb >> 31),
                      "%s NaN code 0x%x decodes to 0x%08x, want a payload-free NaN of sign %u", f->name, c, pb, fb >> 31);
            }
            if (t_current_failed) return;
        }
    }
}

int main(void) {
    build_tables();
    RUN(test_exported_nans);
    RUN(test_decode_fp8);
    RUN(test_decode_f16_bf16);
    RUN(test_roundtrip_all_codes);
    RUN(test_boundary_sweeps);
    RUN(test_random_bits);
    RUN(test_round_to_odd);
    RUN(test_f16_vs_compiler);
    RUN(test_special_cases);
    RUN(test_load_store);
    RUN(test_exhaustive);
    for (int k = 0; k < 4; k++) free(g_table[k]);
    return SUMMARY("convert");
}
