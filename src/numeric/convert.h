/*
 * numeric/convert.h — bit-exact scalar conversions between f32/f64 and the narrow float formats
 * (f16, bf16, OCP FP8 e4m3 and e5m2), shared verbatim by the CPU runtime (C, gcc -std=gnu11) and
 * the CUDA kernels (nvcc, host and device).
 *
 * Every function is `static inline AL_HD` and uses only integer bit manipulation on the IEEE
 * encodings (no float arithmetic, no library calls), so the host and the device produce identical
 * bits for every input.
 *
 * Rules
 *   f16   IEEE binary16. Round to nearest, ties to even; overflow -> +-inf; subnormals exact;
 *         NaN -> quiet NaN keeping the sign and the top 9 payload bits (quiet bit 0x0200 forced).
 *   bf16  Top half of binary32. RNE; overflow -> +-inf; subnormals exact; NaN -> quiet NaN keeping
 *         the sign and the top payload bits (quiet bit 0x0040 forced).
 *   e4m3  OCP 8-bit FP (OFP8) E4M3: bias 7, no infinities, max finite 448 (0x7E), NaN = S.1111.111
 *         (0x7F / 0xFF), min subnormal 2^-9. Encoding is SATURATING: RNE, then any finite result
 *         beyond 448 and +-inf become +-448; NaN -> 0x7F / 0xFF (sign kept).
 *   e5m2  OCP E5M2: bias 15, IEEE-like, inf 0x7C / 0xFC, max finite 57344 (0x7B), NaN decodes from
 *         any of 0x7D..0x7F (and negatives); min subnormal 2^-16. Encoding is SATURATING: RNE, then
 *         overflow and +-inf become +-57344; NaN -> 0x7E / 0xFE (sign kept).
 *   Signed zeros are kept by every encoder; a value that rounds to zero keeps its sign.
 *
 * f64 inputs: ONE rounding, directly from the double (no intermediate f32), for every narrow format
 *   (al_f64_to_f16_bits, _bf16_, _e4m3_, _e5m2_). This matches __double2half / __nv_cvt_double_to_fp8
 *   semantics and avoids double rounding; the same code runs on the GPU, so parity holds. Because
 *   f32 -> f64 is exact, al_f64_to_X(x) == al_f32_to_X(x) for every float x (tested).
 *   f64 -> f32 is the plain C cast (correctly rounded, RNE, on both sides).
 *   Decoding to f64 is exact: decode to f32, then widen.
 *
 * Bit casts: al_f32_as_u32 / al_u32_as_f32 / al_f64_as_u64 / al_u64_as_f64 use __float_as_uint
 * and friends on the device and memcpy on the host (no union type punning).
 */
#ifndef ATTNLAB_NUMERIC_CONVERT_H
#define ATTNLAB_NUMERIC_CONVERT_H

#include <stdint.h>
#ifndef __CUDA_ARCH__
#include <string.h>
#endif

#ifndef AL_HD
#ifdef __CUDACC__
#define AL_HD __host__ __device__
#else
#define AL_HD
#endif
#endif

/* ---- bit casts ------------------------------------------------------------------------------- */
static inline AL_HD uint32_t al_f32_as_u32(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}
static inline AL_HD float al_u32_as_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}
static inline AL_HD uint64_t al_f64_as_u64(double d) {
#ifdef __CUDA_ARCH__
    return (uint64_t)__double_as_longlong(d);
#else
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
#endif
}
static inline AL_HD double al_u64_as_f64(uint64_t u) {
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
#endif
}

/* ---- generic narrowing encoders ----------------------------------------------------------------
 * Target format: mbits explicit mantissa bits, exponent bias `bias` (min normal exponent 1-bias),
 * largest finite code `maxcode` (magnitude), `ovf` = the magnitude code an overflow produces
 * (inf for IEEE-style formats, maxcode for saturating ones).
 *
 * The input magnitude is s * 2^(e - P) with s < 2^(P+1) (P = 23 for f32, 52 for f64); the value is
 * rounded to the target grid at exponent max(e, emin) by dropping `shift` low bits of s with RNE.
 * Packing ((e + bias - 1) << mbits) + r, where r includes the implicit bit, lets a mantissa carry
 * ripple into the exponent; for target subnormals the code is r itself (r == 2^mbits is the min
 * normal). Codes above maxcode overflow. NaN and inf are handled by the callers. */
static inline AL_HD uint32_t al__round_pack32(uint32_t mag, int mbits, int bias, uint32_t maxcode,
                                              uint32_t ovf) {
    int32_t e = (int32_t)(mag >> 23);
    uint32_t s = mag & 0x7FFFFFu;
    if (e == 0) e = 1;          /* f32 subnormal: no implicit bit, exponent -126 */
    else s |= 0x800000u;
    e -= 127;                   /* unbiased exponent */
    int32_t emin = 1 - bias;
    if (e > bias + 1) return ovf;   /* far beyond any finite code; avoids shifting past 32 bits */
    int32_t shift = 23 - mbits + (e < emin ? emin - e : 0);
    uint32_t r;
    if (shift >= 25) {
        r = 0;                  /* s < 2^24 <= half of the dropped range: rounds to zero */
    } else {
        r = s >> shift;
        uint32_t rem = s & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
    }
    uint32_t code = e < emin ? r : ((uint32_t)(e + bias - 1) << mbits) + r;
    return code > maxcode ? ovf : code;
}

static inline AL_HD uint32_t al__round_pack64(uint64_t mag, int mbits, int bias, uint32_t maxcode,
                                              uint32_t ovf) {
    int32_t e = (int32_t)(mag >> 52);
    uint64_t s = mag & 0xFFFFFFFFFFFFFull;
    if (e == 0) e = 1;
    else s |= 0x10000000000000ull;
    e -= 1023;
    int32_t emin = 1 - bias;
    if (e > bias + 1) return ovf;
    int32_t shift = 52 - mbits + (e < emin ? emin - e : 0);
    uint64_t r;
    if (shift >= 54) {
        r = 0;                  /* s < 2^53 <= half */
    } else {
        r = s >> shift;
        uint64_t rem = s & ((1ull << shift) - 1ull);
        uint64_t half = 1ull << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
    }
    uint64_t code = e < emin ? r : ((uint64_t)(e + bias - 1) << mbits) + r;
    return code > maxcode ? ovf : (uint32_t)code;
}

/* ---- f16 ------------------------------------------------------------------------------------- */
static inline AL_HD uint16_t al_f32_to_f16(float x) {
    uint32_t u = al_f32_as_u32(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t mag = u & 0x7FFFFFFFu;
    if (mag > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((mag >> 13) & 0x03FFu));  /* NaN */
    if (mag == 0x7F800000u) return (uint16_t)(sign | 0x7C00u);
    return (uint16_t)(sign | al__round_pack32(mag, 10, 15, 0x7BFFu, 0x7C00u));
}

static inline AL_HD uint16_t al_f64_to_f16(double x) {
    uint64_t u = al_f64_as_u64(x);
    uint16_t sign = (uint16_t)((u >> 48) & 0x8000u);
    uint64_t mag = u & 0x7FFFFFFFFFFFFFFFull;
    if (mag > 0x7FF0000000000000ull) return (uint16_t)(sign | 0x7E00u | ((mag >> 42) & 0x03FFu));
    if (mag == 0x7FF0000000000000ull) return (uint16_t)(sign | 0x7C00u);
    return (uint16_t)(sign | al__round_pack64(mag, 10, 15, 0x7BFFu, 0x7C00u));
}

/* Generic exact decoder of a small format (sign bit already removed) to f32 bits. */
static inline AL_HD uint32_t al__decode_to_f32(uint32_t mag, int mbits, int bias) {
    uint32_t m = mag & ((1u << mbits) - 1u);
    int32_t e = (int32_t)(mag >> mbits);
    if (e == 0) {
        if (m == 0) return 0;
        e = 1;                                    /* subnormal: normalise */
        while (!(m & (1u << mbits))) { m <<= 1; e--; }
        m &= (1u << mbits) - 1u;
    }
    return ((uint32_t)(e - bias + 127) << 23) | (m << (23 - mbits));
}

static inline AL_HD float al_f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t mag = h & 0x7FFFu;
    if (mag >= 0x7C00u) {
        if (mag == 0x7C00u) return al_u32_as_f32(sign | 0x7F800000u);
        return al_u32_as_f32(sign | 0x7FC00000u | ((mag & 0x03FFu) << 13));       /* quiet NaN */
    }
    return al_u32_as_f32(sign | al__decode_to_f32(mag, 10, 15));
}

/* ---- bf16 ------------------------------------------------------------------------------------ */
static inline AL_HD uint16_t al_f32_to_bf16(float x) {
    uint32_t u = al_f32_as_u32(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);  /* quiet NaN */
    /* RNE on the low 16 bits; a carry ripples into the exponent and reaches inf on overflow. */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* f64 -> f32 rounded to odd: the float next to x toward zero, its last bit set when that is inexact.
 * Rounding this float once more (RNE) to a format with at least two significand bits fewer (bf16, f16,
 * FP8) gives exactly the correctly rounded value of x (rounding to odd: Boldo and Melquiond, "Emulation
 * of FMA and correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008). The GPU's
 * FP8 kernels use it to reach the hardware's f32 converters with one correct rounding (src/cuda/fp8.cu);
 * test_convert checks al_f32_to_X(al_f64_to_f32_odd(x)) == al_f64_to_X(x) for bf16, f16, e4m3, e5m2.
 * Infinities stay, finite values beyond the float range become +-FLT_MAX (odd); NaN is the caller's. */
static inline AL_HD float al_f64_to_f32_odd(double x) {
#ifdef __CUDA_ARCH__
    float f = __double2float_rz(x);
#else
    float f = (float)x;                                       /* RNE; one step back when it rounded away */
    if ((f < 0.0f ? -(double)f : (double)f) > (x < 0.0 ? -x : x)) f = al_u32_as_f32(al_f32_as_u32(f) - 1u);
#endif
    if ((double)f != x) f = al_u32_as_f32(al_f32_as_u32(f) | 1u);
    return f;
}

static inline AL_HD uint16_t al_f64_to_bf16(double x) {
    uint64_t u = al_f64_as_u64(x);
    uint16_t sign = (uint16_t)((u >> 48) & 0x8000u);
    uint64_t mag = u & 0x7FFFFFFFFFFFFFFFull;
    if (mag > 0x7FF0000000000000ull) return (uint16_t)(sign | 0x7FC0u | ((mag >> 45) & 0x7Fu));
    if (mag == 0x7FF0000000000000ull) return (uint16_t)(sign | 0x7F80u);
    return (uint16_t)(sign | al__round_pack64(mag, 7, 127, 0x7F7Fu, 0x7F80u));
}

static inline AL_HD float al_bf16_to_f32(uint16_t h) {
    return al_u32_as_f32((uint32_t)h << 16);      /* exact; NaN payloads pass through */
}

/* ---- FP8 E4M3 (OCP) -------------------------------------------------------------------------- */
static inline AL_HD uint8_t al_f32_to_e4m3(float x) {
    uint32_t u = al_f32_as_u32(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t mag = u & 0x7FFFFFFFu;
    if (mag > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);
    if (mag == 0x7F800000u) return (uint8_t)(sign | 0x7Eu);        /* saturate */
    return (uint8_t)(sign | al__round_pack32(mag, 3, 7, 0x7Eu, 0x7Eu));
}

static inline AL_HD uint8_t al_f64_to_e4m3(double x) {
    uint64_t u = al_f64_as_u64(x);
    uint8_t sign = (uint8_t)((u >> 56) & 0x80u);
    uint64_t mag = u & 0x7FFFFFFFFFFFFFFFull;
    if (mag > 0x7FF0000000000000ull) return (uint8_t)(sign | 0x7Fu);
    if (mag == 0x7FF0000000000000ull) return (uint8_t)(sign | 0x7Eu);
    return (uint8_t)(sign | al__round_pack64(mag, 3, 7, 0x7Eu, 0x7Eu));
}

static inline AL_HD float al_e4m3_to_f32(uint8_t v) {
    uint32_t sign = ((uint32_t)v & 0x80u) << 24;
    uint32_t mag = v & 0x7Fu;
    if (mag == 0x7Fu) return al_u32_as_f32(sign | 0x7FC00000u);
    return al_u32_as_f32(sign | al__decode_to_f32(mag, 3, 7));
}

/* ---- FP8 E5M2 (OCP) -------------------------------------------------------------------------- */
static inline AL_HD uint8_t al_f32_to_e5m2(float x) {
    uint32_t u = al_f32_as_u32(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t mag = u & 0x7FFFFFFFu;
    if (mag > 0x7F800000u) return (uint8_t)(sign | 0x7Eu);
    if (mag == 0x7F800000u) return (uint8_t)(sign | 0x7Bu);        /* saturate */
    return (uint8_t)(sign | al__round_pack32(mag, 2, 15, 0x7Bu, 0x7Bu));
}

static inline AL_HD uint8_t al_f64_to_e5m2(double x) {
    uint64_t u = al_f64_as_u64(x);
    uint8_t sign = (uint8_t)((u >> 56) & 0x80u);
    uint64_t mag = u & 0x7FFFFFFFFFFFFFFFull;
    if (mag > 0x7FF0000000000000ull) return (uint8_t)(sign | 0x7Eu);
    if (mag == 0x7FF0000000000000ull) return (uint8_t)(sign | 0x7Bu);
    return (uint8_t)(sign | al__round_pack64(mag, 2, 15, 0x7Bu, 0x7Bu));
}

static inline AL_HD float al_e5m2_to_f32(uint8_t v) {
    uint32_t sign = ((uint32_t)v & 0x80u) << 24;
    uint32_t mag = v & 0x7Fu;
    if (mag == 0x7Cu) return al_u32_as_f32(sign | 0x7F800000u);
    if (mag > 0x7Cu) return al_u32_as_f32(sign | 0x7FC00000u);
    return al_u32_as_f32(sign | al__decode_to_f32(mag, 2, 15));
}

/* ---- decoding to f64 (exact) ----------------------------------------------------------------- */
static inline AL_HD double al_f16_to_f64(uint16_t h) { return (double)al_f16_to_f32(h); }
static inline AL_HD double al_bf16_to_f64(uint16_t h) { return (double)al_bf16_to_f32(h); }
static inline AL_HD double al_e4m3_to_f64(uint8_t v) { return (double)al_e4m3_to_f32(v); }
static inline AL_HD double al_e5m2_to_f64(uint8_t v) { return (double)al_e5m2_to_f32(v); }

#endif /* ATTNLAB_NUMERIC_CONVERT_H */
