/*
 * numeric/detmath.h — deterministic double-precision log and sin/cos(2*pi*t), written so the CPU
 * and the CUDA device produce identical bits (used by the Box-Muller transform in philox.h).
 *
 * Why: glibc's logf/sinf/cosf and CUDA's libdevice differ in the last ulp, so normals drawn through
 * them would not match across devices. These routines use only +, -, *, / and sqrt, each of which
 * is correctly rounded (round-to-nearest-even) in IEEE double on both sides, evaluated in a fixed
 * order with fixed polynomials:
 *   - device: every operation is an explicit intrinsic (__dmul_rn, __dadd_rn, __dsub_rn, __ddiv_rn,
 *     __dsqrt_rn), which nvcc never contracts into an fma, whatever --fmad says;
 *   - host: AL_DMUL passes each product through an empty asm barrier so that gcc cannot fuse it
 *     into an fma even under -ffp-contract=fast with -mfma; build with -ffp-contract=off anyway.
 *     x86-64 SSE2 math (no x87 excess precision) is assumed.
 *
 * Accuracy (measured in tests/c/test_rng.c against glibc over 1e6 arguments each):
 *   al_det_log: fdlibm's e_log.c algorithm (Lg1..Lg7 minimax, ln2 split hi/lo), < 1 ulp.
 *   al_det_sincos_2pi_frac: exact quadrant reduction in integers (the argument is b / 2^nbits of a
 *   turn), one rounding for theta = 2*pi*r, then fdlibm's k_sin/k_cos kernels on |theta| <= pi/4;
 *   error ~1-2 ulp.
 */
#ifndef ATTNLAB_NUMERIC_DETMATH_H
#define ATTNLAB_NUMERIC_DETMATH_H

#include <stdint.h>
#include "numeric/convert.h"   /* AL_HD, bit casts */

#ifdef __CUDA_ARCH__
#define AL_DMUL(a, b) __dmul_rn((a), (b))
#define AL_DADD(a, b) __dadd_rn((a), (b))
#define AL_DSUB(a, b) __dsub_rn((a), (b))
#define AL_DDIV(a, b) __ddiv_rn((a), (b))
#define AL_DSQRT(a) __dsqrt_rn(a)
#else
/* Materialise a rounded product: an fma cannot be formed across the asm. */
static inline double al__dbarrier(double x) {
#if defined(__GNUC__) && defined(__x86_64__)
    __asm__("" : "+x"(x));
#elif defined(__GNUC__) && defined(__aarch64__)
    __asm__("" : "+w"(x));
#endif
    return x;
}
#define AL_DMUL(a, b) al__dbarrier((double)(a) * (double)(b))
#define AL_DADD(a, b) ((double)(a) + (double)(b))
#define AL_DSUB(a, b) ((double)(a) - (double)(b))
#define AL_DDIV(a, b) ((double)(a) / (double)(b))
#define AL_DSQRT(a) __builtin_sqrt(a)   /* IEEE sqrt: correctly rounded */
#endif

/* Natural log of a positive, finite, normal double (the only arguments Box-Muller passes). */
static inline AL_HD double al_det_log(double x) {
    const double ln2_hi = 6.93147180369123816490e-01; /* 0x3FE62E42FEE00000: k*ln2_hi is exact */
    const double ln2_lo = 1.90821492927058770002e-10; /* 0x3DEA39EF35793C76 */
    const double Lg1 = 6.666666666666735130e-01, Lg2 = 3.999999999940941908e-01,
                 Lg3 = 2.857142874366239149e-01, Lg4 = 2.222219843214978396e-01,
                 Lg5 = 1.818357216161805012e-01, Lg6 = 1.531383769920937332e-01,
                 Lg7 = 1.479819860511658591e-01;
    uint64_t u = al_f64_as_u64(x);
    int32_t k = (int32_t)(u >> 52) - 1023;
    uint64_t mant = u & 0xFFFFFFFFFFFFFull;
    /* m in [sqrt(2)/2, sqrt(2)): m = 1.mant, halved when above sqrt(2) (mantissa 0x6A09E667F3BCD). */
    if (mant > 0x6A09E667F3BCDull) {
        k += 1;
        mant |= 0x3FE0000000000000ull;
    } else {
        mant |= 0x3FF0000000000000ull;
    }
    double m = al_u64_as_f64(mant);
    double f = AL_DSUB(m, 1.0);                 /* exact (Sterbenz) */
    double dk = (double)k;
    double hfsq = AL_DMUL(AL_DMUL(0.5, f), f);
    double s = AL_DDIV(f, AL_DADD(2.0, f));
    double z = AL_DMUL(s, s);
    double w = AL_DMUL(z, z);
    double t1 = AL_DMUL(w, AL_DADD(Lg2, AL_DMUL(w, AL_DADD(Lg4, AL_DMUL(w, Lg6)))));
    double t2 = AL_DMUL(z, AL_DADD(Lg1, AL_DMUL(w, AL_DADD(Lg3, AL_DMUL(w, AL_DADD(Lg5, AL_DMUL(w, Lg7)))))));
    double R = AL_DADD(t2, t1);
    /* log = k*ln2_hi - ((hfsq - (s*(hfsq+R) + k*ln2_lo)) - f) */
    double inner = AL_DADD(AL_DMUL(s, AL_DADD(hfsq, R)), AL_DMUL(dk, ln2_lo));
    return AL_DSUB(AL_DMUL(dk, ln2_hi), AL_DSUB(AL_DSUB(hfsq, inner), f));
}

/* fdlibm kernels on |x| <= pi/4 (tail y = 0). */
static inline AL_HD double al__det_ksin(double x) {
    const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,
                 S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,
                 S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
    double z = AL_DMUL(x, x);
    double r = AL_DADD(S2, AL_DMUL(z, AL_DADD(S3, AL_DMUL(z, AL_DADD(S4, AL_DMUL(z, AL_DADD(S5, AL_DMUL(z, S6))))))));
    double v = AL_DMUL(z, x);
    return AL_DADD(x, AL_DMUL(v, AL_DADD(S1, AL_DMUL(z, r))));
}

static inline AL_HD double al__det_kcos(double x) {
    const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,
                 C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,
                 C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;
    double z = AL_DMUL(x, x);
    double w = AL_DMUL(z, z);
    double r = AL_DADD(AL_DMUL(z, AL_DADD(C1, AL_DMUL(z, AL_DADD(C2, AL_DMUL(z, C3))))),
                       AL_DMUL(AL_DMUL(w, w), AL_DADD(C4, AL_DMUL(z, AL_DADD(C5, AL_DMUL(z, C6))))));
    double hz = AL_DMUL(0.5, z);
    double one_minus = AL_DSUB(1.0, hz);
    /* w + (((1 - w) - hz) + z*r) */
    return AL_DADD(one_minus, AL_DADD(AL_DSUB(AL_DSUB(1.0, one_minus), hz), AL_DMUL(z, r)));
}

/* sin and cos of 2*pi*t with t = b / 2^nbits (0 <= b < 2^nbits, 3 <= nbits <= 60). The quadrant
 * q = round(4t) and the remainder r = t - q/4 in [-1/8, 1/8] are computed exactly in integers. */
static inline AL_HD void al_det_sincos_2pi_frac(uint64_t b, int nbits, double *s, double *c) {
    const double two_pi = 6.28318530717958647692;
    uint64_t q = (b + (1ull << (nbits - 3))) >> (nbits - 2);
    int64_t rem = (int64_t)b - (int64_t)(q << (nbits - 2));
    /* rem * 2^-nbits is exact (|rem| <= 2^(nbits-3)); scale by an exact power of two. */
    double rt = AL_DMUL((double)rem, al_u64_as_f64((uint64_t)(1023 - nbits) << 52));
    double theta = AL_DMUL(rt, two_pi);
    double sn = al__det_ksin(theta), cs = al__det_kcos(theta);
    switch ((unsigned)(q & 3u)) {
    case 0: *s = sn; *c = cs; break;
    case 1: *s = cs; *c = -sn; break;
    case 2: *s = -sn; *c = -cs; break;
    default: *s = -cs; *c = sn; break;
    }
}

#endif /* ATTNLAB_NUMERIC_DETMATH_H */
