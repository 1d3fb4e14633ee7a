/*
 * numeric/fp8_scale.h — the FP8 scaling arithmetic shared verbatim by the CPU (src/fp8.c, the CPU
 * attention's FP8 emulation) and the CUDA plugin (src/cuda/fp8.cu), so both give the same bits:
 *
 *   al_fp8_encode(fmt, v)     OCP FP8 code of the double v (convert.h: saturating, RNE, one rounding)
 *   al_fp8_decode(fmt, c)     exact value of a code, as a double
 *   al_fp8_fmax(fmt)          448 (E4M3) or 57344 (E5M2)
 *   al_fp8_current_scale(fmax, amax, pow2_margin)
 *                             fmax / amax / 2^margin (pow2_margin = 2^margin, computed once by the
 *                             caller on the host), or 1 when amax is 0, inf or NaN (TE keeps scale 1
 *                             for a tensor with nothing to measure)
 *   al_e8m0_from_amax(amax, fmax)
 *                             the MXFP8 block scale code: the smallest power of two X = 2^e with
 *                             amax <= fmax * X (TE's float_to_e8m0(amax / fmax), rounding the exponent
 *                             up), e clamped to [-127, 127], code = e + 127; 0 for amax = 0; 255 for NaN
 *   al_e8m0_value(code) / al_e8m0_inverse(code)
 *                             2^(code-127) and 2^(127-code) exactly (NaN for 255)
 *
 * Only integer bit manipulation and single IEEE double operations (no FMA-able a*b+c, no libm).
 */
#ifndef ATTNLAB_NUMERIC_FP8_SCALE_H
#define ATTNLAB_NUMERIC_FP8_SCALE_H

#include "numeric/convert.h"

static inline AL_HD uint8_t al_fp8_encode(int32_t fmt, double v) {
    return fmt == 5 /* AL_DTYPE_FP8_E5M2 */ ? al_f64_to_e5m2(v) : al_f64_to_e4m3(v);
}
static inline AL_HD double al_fp8_decode(int32_t fmt, uint8_t c) {
    return fmt == 5 ? al_e5m2_to_f64(c) : al_e4m3_to_f64(c);
}
static inline AL_HD double al_fp8_fmax(int32_t fmt) { return fmt == 5 ? 57344.0 : 448.0; }

static inline AL_HD double al_fp8_current_scale(double fmax, double amax, double pow2_margin) {
    if (!(amax > 0.0) || amax - amax != 0.0) return 1.0;   /* 0, NaN, inf */
    return fmax / amax / pow2_margin;
}

/* 2^e for e in [-1022, 1023], exactly. */
static inline AL_HD double al_pow2i(int32_t e) { return al_u64_as_f64((uint64_t)(e + 1023) << 52); }

static inline AL_HD uint8_t al_e8m0_from_amax(double amax, double fmax) {
    if (amax != amax) return 255;
    if (amax == 0.0) return 0;
    if (amax - amax != 0.0) return 254;                      /* inf: the largest scale */
    double v = amax / fmax;
    uint64_t u = al_f64_as_u64(v);
    int32_t be = (int32_t)((u >> 52) & 0x7FF);
    int32_t e;
    if (be == 0) e = -1022;                                  /* subnormal quotient: clamps below */
    else e = be - 1023 + ((u & 0xFFFFFFFFFFFFFull) ? 1 : 0);  /* ceil(log2 v) */
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}
static inline AL_HD double al_e8m0_value(uint8_t code) {
    return code == 255 ? al_u64_as_f64(0x7FF8000000000000ull) : al_pow2i((int32_t)code - 127);
}
static inline AL_HD double al_e8m0_inverse(uint8_t code) {
    return code == 255 ? al_u64_as_f64(0x7FF8000000000000ull) : al_pow2i(127 - (int32_t)code);
}

#endif /* ATTNLAB_NUMERIC_FP8_SCALE_H */
