/*
 * numeric/philox.h — Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy
 * as 1, 2, 3", SC'11; constants of Random123) and the element mapping of attnlab's random fills,
 * shared verbatim by the CPU (src/rng.c) and the CUDA plugin (src/cuda/random.cu), so a fill at a
 * given (seed, offset) gives the same bits on every device.
 *
 * ---- Usage on the device (for src/cuda/random.cu) -------------------------------------------------
 *   #include "numeric/philox.h"        // with -Iinclude -Isrc; pulls in convert.h and detmath.h
 *   __global__ void k(char *base, ..., int32_t dtype, int32_t kind, uint64_t seed, uint64_t offset,
 *                     int64_t n) {
 *       for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
 *           int64_t off = <element offset of row-major index i in the strided view>;
 *           al_random_store(base + off * elsize, dtype, kind, seed, offset, (uint64_t)i);
 *       }
 *   }
 *   - al_random_store is the whole contract: element i (row-major over the view's shape) of a fill at
 *     (seed, offset) depends only on (dtype, kind, seed, offset, i). The core passes (seed, offset);
 *     the plugin never touches the generator state.
 *   - Faster variant (optional): one thread per Philox block — call al_philox4x32_10 once for the
 *     block's counter and derive its 4 (uniform) or 2 (normal, or uniform f64) elements with the
 *     al_philox_*_from_* helpers below; results are identical by construction.
 *   - Compile this translation unit as usual; the double-precision math uses explicit _rn
 *     intrinsics, so --fmad=true/false does not change results (checked: with plain operators and
 *     the default --fmad=true, 0.9% of f64 normals differ from the CPU in the last bit).
 *   - tests/cuda/numeric_parity.cu checks GPU == CPU bits on an H200: all 2^32 f32 inputs of the
 *     four encoders, 2^28 f64 inputs, all decoders, 2^26 elements of every (dtype, kind) fill.
 *
 * ---- Generator ---------------------------------------------------------------------------------------
 *   al_philox4x32_10(ctr[4], key[2], out[4]): 10 rounds; each round
 *     (hi0,lo0) = M0*ctr[0], (hi1,lo1) = M1*ctr[2] (32x32->64),
 *     ctr = { hi1^ctr[1]^key[0], lo1, hi0^ctr[3]^key[1], lo0 },
 *   and the key is bumped by (W0, W1) between rounds. M0=0xD2511F53 M1=0xCD9E8D57 W0=0x9E3779B9
 *   W1=0xBB67AE85. Checked against Random123's kat_vectors.
 *
 * ---- Stream mapping (the contract) --------------------------------------------------------------------
 *   key    = { seed & 0xffffffff, seed >> 32 }
 *   block(c) = philox4x32_10({ c & 0xffffffff, c >> 32, 0, 0 }, key) = r[0..3] for a 64-bit counter c
 *   (counter arithmetic is uint64_t, wrapping modulo 2^64).
 *
 *   uniform, f32 / f16 / bf16 / fp8 (n elements use ceil(n/4) counters):
 *     r = block(offset + i/4)[i % 4];  value = (r >> (32 - d)) * 2^-d  in [0, 1)
 *     d = 24 for f32 (the reference rule: (r >> 8) * 2^-24), 11 for f16, 8 for bf16, 4 for e4m3,
 *     3 for e5m2: the top d bits, so every value is exactly representable in the dtype (no rounding
 *     can produce 1.0). al_philox_uniform_f32 is the d = 24 case.
 *   uniform, f64 (ceil(n/2) counters):
 *     r = block(offset + i/2); j = i % 2;
 *     value = (((uint64_t)r[2j] << 32 | r[2j+1]) >> 11) * 2^-53   (r[2j] is the high word)
 *   normal, f32 / f16 / bf16 / fp8 (ceil(n/2) counters), Box-Muller on the pair (2k, 2k+1):
 *     r = block(offset + i/2);
 *     u1 = ((r[0] >> 8) + 1) * 2^-24   in (0, 1]  (never 0)
 *     t  =  (r[1] >> 8) * 2^-24        in [0, 1)
 *     rad = sqrt(-2 log u1); even i: rad * cos(2 pi t), odd i: rad * sin(2 pi t)
 *     computed in double with detmath.h (deterministic log / sin / cos), rounded once to f32;
 *     f16 / bf16 / fp8 are that f32 value converted by convert.h (RNE; FP8 saturating).
 *   normal, f64 (ceil(n/2) counters): as above with 53-bit uniforms
 *     u1 = ((((uint64_t)r[0] << 32 | r[1]) >> 11) + 1) * 2^-53   in (0, 1]
 *     t  =  (((uint64_t)r[2] << 32 | r[3]) >> 11) * 2^-53        in [0, 1)
 *   dropout: element i is kept iff al_philox_uniform_f32(seed, offset, i) < keep_prob.
 *   A fill of n elements advances the generator by al_philox_counters(dtype, kind, n).
 */
#ifndef ATTNLAB_NUMERIC_PHILOX_H
#define ATTNLAB_NUMERIC_PHILOX_H

#include <stdint.h>
#include "attnlab.h"            /* al_dtype, al_random_kind */
#include "numeric/convert.h"
#include "numeric/detmath.h"

#define AL_PHILOX_M0 0xD2511F53u
#define AL_PHILOX_M1 0xCD9E8D57u
#define AL_PHILOX_W0 0x9E3779B9u
#define AL_PHILOX_W1 0xBB67AE85u

/* Philox4x32 with `rounds` rounds (10 for attnlab; other counts exist for the known-answer tests). */
static inline AL_HD void al_philox4x32_r(int rounds, const uint32_t ctr[4], const uint32_t key[2],
                                         uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < rounds; r++) {
        if (r > 0) { k0 += AL_PHILOX_W0; k1 += AL_PHILOX_W1; }
        uint64_t p0 = (uint64_t)AL_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)AL_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0; c1 = (uint32_t)p1; c2 = n2; c3 = (uint32_t)p0;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

static inline AL_HD void al_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    al_philox4x32_r(10, ctr, key, out);
}

/* The 4 words of the block at 64-bit counter c for seed. */
static inline AL_HD void al_philox_block(uint64_t seed, uint64_t c, uint32_t r[4]) {
    uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0u, 0u};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    al_philox4x32_r(10, ctr, key, r);
}

/* ---- values from words ---------------------------------------------------------------------------- */
/* Top d bits of r as a value in [0, 1) (exact in f32 for d <= 24). */
static inline AL_HD float al_philox_unit_f32(uint32_t r, int d) {
    return (float)(r >> (32 - d)) * al_u32_as_f32((uint32_t)(127 - d) << 23);
}
/* 53 bits of (hi, lo) as a value in [0, 1). */
static inline AL_HD double al_philox_unit_f64(uint32_t hi, uint32_t lo) {
    uint64_t b = (((uint64_t)hi << 32) | lo) >> 11;
    return (double)b * 1.1102230246251565404e-16; /* 2^-53 */
}
/* Uniform mantissa width d per dtype (see the mapping above); 0 for non-float dtypes. */
static inline AL_HD int al_philox_uniform_digits(int32_t dtype) {
    switch (dtype) {
    case AL_DTYPE_F32: return 24;
    case AL_DTYPE_F16: return 11;
    case AL_DTYPE_BF16: return 8;
    case AL_DTYPE_FP8_E4M3: return 4;
    case AL_DTYPE_FP8_E5M2: return 3;
    case AL_DTYPE_F64: return 53;
    default: return 0;
    }
}

/* Box-Muller on one block, f32 resolution: z[0] = cos branch (even i), z[1] = sin branch (odd i). */
static inline AL_HD void al_philox_normal_f32_from_block(const uint32_t r[4], float z[2]) {
    double u1 = (double)((r[0] >> 8) + 1u) * 5.9604644775390625e-08;   /* 2^-24 */
    double rad = AL_DSQRT(AL_DMUL(-2.0, al_det_log(u1)));
    double s, c;
    al_det_sincos_2pi_frac(r[1] >> 8, 24, &s, &c);
    z[0] = (float)AL_DMUL(rad, c);
    z[1] = (float)AL_DMUL(rad, s);
}

/* Box-Muller on one block, f64 resolution. */
static inline AL_HD void al_philox_normal_f64_from_block(const uint32_t r[4], double z[2]) {
    uint64_t b1 = ((((uint64_t)r[0] << 32) | r[1]) >> 11) + 1u;
    double u1 = (double)b1 * 1.1102230246251565404e-16;                 /* 2^-53 */
    double rad = AL_DSQRT(AL_DMUL(-2.0, al_det_log(u1)));
    double s, c;
    al_det_sincos_2pi_frac((((uint64_t)r[2] << 32) | r[3]) >> 11, 53, &s, &c);
    z[0] = AL_DMUL(rad, c);
    z[1] = AL_DMUL(rad, s);
}

/* ---- element i of a fill at (seed, offset) ---------------------------------------------------------- */
static inline AL_HD float al_philox_uniform_f32(uint64_t seed, uint64_t offset, uint64_t i) {
    uint32_t r[4];
    al_philox_block(seed, offset + i / 4u, r);
    return al_philox_unit_f32(r[i % 4u], 24);
}

/* Uniform for a non-f64 float dtype (d from al_philox_uniform_digits). */
static inline AL_HD float al_philox_uniform_digits_f32(uint64_t seed, uint64_t offset, uint64_t i, int d) {
    uint32_t r[4];
    al_philox_block(seed, offset + i / 4u, r);
    return al_philox_unit_f32(r[i % 4u], d);
}

static inline AL_HD double al_philox_uniform_f64(uint64_t seed, uint64_t offset, uint64_t i) {
    uint32_t r[4];
    al_philox_block(seed, offset + i / 2u, r);
    unsigned j = (unsigned)(i % 2u);
    return al_philox_unit_f64(r[2 * j], r[2 * j + 1]);
}

static inline AL_HD float al_philox_normal_f32(uint64_t seed, uint64_t offset, uint64_t i) {
    uint32_t r[4];
    float z[2];
    al_philox_block(seed, offset + i / 2u, r);
    al_philox_normal_f32_from_block(r, z);
    return z[i % 2u];
}

static inline AL_HD double al_philox_normal_f64(uint64_t seed, uint64_t offset, uint64_t i) {
    uint32_t r[4];
    double z[2];
    al_philox_block(seed, offset + i / 2u, r);
    al_philox_normal_f64_from_block(r, z);
    return z[i % 2u];
}

/* Dropout keep test for element i. */
static inline AL_HD int al_philox_keep(uint64_t seed, uint64_t offset, uint64_t i, float keep_prob) {
    return al_philox_uniform_f32(seed, offset, i) < keep_prob;
}

/* Counters consumed by a fill of n elements of dtype with kind. */
static inline AL_HD uint64_t al_philox_counters(int32_t dtype, int32_t kind, uint64_t n) {
    if (kind == AL_RANDOM_UNIFORM && dtype != AL_DTYPE_F64) return n / 4u + (n % 4u != 0);
    return n / 2u + (n % 2u != 0);
}

/* Write element i of a fill into *dst (one element of dtype). Float dtypes only; anything else is
 * left untouched (the caller validates). */
static inline AL_HD void al_random_store(void *dst, int32_t dtype, int32_t kind, uint64_t seed,
                                         uint64_t offset, uint64_t i) {
    if (dtype == AL_DTYPE_F64) {
        *(double *)dst = kind == AL_RANDOM_NORMAL ? al_philox_normal_f64(seed, offset, i)
                                                  : al_philox_uniform_f64(seed, offset, i);
        return;
    }
    float v = kind == AL_RANDOM_NORMAL
                  ? al_philox_normal_f32(seed, offset, i)
                  : al_philox_uniform_digits_f32(seed, offset, i, al_philox_uniform_digits(dtype));
    switch (dtype) {
    case AL_DTYPE_F32: *(float *)dst = v; break;
    case AL_DTYPE_F16: *(uint16_t *)dst = al_f32_to_f16(v); break;
    case AL_DTYPE_BF16: *(uint16_t *)dst = al_f32_to_bf16(v); break;
    case AL_DTYPE_FP8_E4M3: *(uint8_t *)dst = al_f32_to_e4m3(v); break;
    case AL_DTYPE_FP8_E5M2: *(uint8_t *)dst = al_f32_to_e5m2(v); break;
    default: break;
    }
}

#endif /* ATTNLAB_NUMERIC_PHILOX_H */
