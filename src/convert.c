/*
 * convert.c — the exported scalar conversions of attnlab.h ("Conversions") and the host element
 * accessors al_load_f64 / al_store_f64 of internal.h. The bit-level rules live in
 * src/numeric/convert.h, shared with the CUDA kernels.
 *
 * al_store_f64 rules:
 *   f32                 (float)v, round to nearest even, overflow -> inf
 *   f16 bf16 e4m3 e5m2  rounded ONCE directly from the double (numeric/convert.h; FP8 saturating)
 *   i32 i64 u8          truncate toward zero, saturate to the type's range, NaN -> 0
 *   bool                v != 0 (so NaN -> 1), stored as the byte 0 or 1
 */
#include "internal.h"
#include <math.h>
#include "numeric/convert.h"

/* Values handed to Lua must not be NaNs with payloads: LuaJIT NaN-tags its values, and a NaN whose
 * upper bits are all ones reads back as a garbage object (a crash in the REPL). So every float or
 * double that the exported API returns to a caller passes through al_canonical_nan: any NaN becomes
 * the default quiet NaN with the same sign. Tensor storage itself keeps every bit. */
static float canonical_nan_f(float x) { return x != x ? copysignf(__builtin_nanf(""), x) : x; }

AL_EXPORT uint16_t al_f32_to_f16_bits(float x) { return al_f32_to_f16(x); }
AL_EXPORT float al_f16_bits_to_f32(uint16_t h) { return canonical_nan_f(al_f16_to_f32(h)); }
AL_EXPORT uint16_t al_f32_to_bf16_bits(float x) { return al_f32_to_bf16(x); }
AL_EXPORT float al_bf16_bits_to_f32(uint16_t h) { return canonical_nan_f(al_bf16_to_f32(h)); }
AL_EXPORT uint8_t al_f32_to_e4m3_bits(float x) { return al_f32_to_e4m3(x); }
AL_EXPORT float al_e4m3_bits_to_f32(uint8_t v) { return canonical_nan_f(al_e4m3_to_f32(v)); }
AL_EXPORT uint8_t al_f32_to_e5m2_bits(float x) { return al_f32_to_e5m2(x); }
AL_EXPORT float al_e5m2_bits_to_f32(uint8_t v) { return canonical_nan_f(al_e5m2_to_f32(v)); }

AL_EXPORT double al_canonical_nan(double x) { return x != x ? copysign(__builtin_nan(""), x) : x; }

AL_EXPORT double al_load_f64(const void *base, int32_t dtype, int64_t index) {
    switch (dtype) {
    case AL_DTYPE_F32: return (double)((const float *)base)[index];
    case AL_DTYPE_F64: return ((const double *)base)[index];
    case AL_DTYPE_F16: return al_f16_to_f64(((const uint16_t *)base)[index]);
    case AL_DTYPE_BF16: return al_bf16_to_f64(((const uint16_t *)base)[index]);
    case AL_DTYPE_FP8_E4M3: return al_e4m3_to_f64(((const uint8_t *)base)[index]);
    case AL_DTYPE_FP8_E5M2: return al_e5m2_to_f64(((const uint8_t *)base)[index]);
    case AL_DTYPE_I32: return (double)((const int32_t *)base)[index];
    case AL_DTYPE_I64: return (double)((const int64_t *)base)[index];
    case AL_DTYPE_U8: return (double)((const uint8_t *)base)[index];
    case AL_DTYPE_BOOL: return ((const uint8_t *)base)[index] ? 1.0 : 0.0;
    default: return 0.0;
    }
}

/* Truncate toward zero and clamp to [lo, hi]; lo and hi are exactly representable doubles chosen so
 * that every double in range converts without undefined behaviour. NaN -> 0. */
static int64_t al__sat_trunc(double v, double lo, double hi_excl, int64_t min, int64_t max) {
    if (v != v) return 0;
    if (v <= lo) return min;
    if (v >= hi_excl) return max;
    return (int64_t)v;
}

AL_EXPORT void al_store_f64(void *base, int32_t dtype, int64_t index, double v) {
    switch (dtype) {
    case AL_DTYPE_F32: ((float *)base)[index] = (float)v; break;
    case AL_DTYPE_F64: ((double *)base)[index] = v; break;
    case AL_DTYPE_F16: ((uint16_t *)base)[index] = al_f64_to_f16(v); break;
    case AL_DTYPE_BF16: ((uint16_t *)base)[index] = al_f64_to_bf16(v); break;
    case AL_DTYPE_FP8_E4M3: ((uint8_t *)base)[index] = al_f64_to_e4m3(v); break;
    case AL_DTYPE_FP8_E5M2: ((uint8_t *)base)[index] = al_f64_to_e5m2(v); break;
    case AL_DTYPE_I32:
        ((int32_t *)base)[index] =
            (int32_t)al__sat_trunc(v, -2147483648.0, 2147483648.0, INT32_MIN, INT32_MAX);
        break;
    case AL_DTYPE_I64:
        /* -2^63 is representable; anything >= 2^63 saturates. */
        ((int64_t *)base)[index] =
            al__sat_trunc(v, -9223372036854775808.0, 9223372036854775808.0, INT64_MIN, INT64_MAX);
        break;
    case AL_DTYPE_U8:
        ((uint8_t *)base)[index] = (uint8_t)al__sat_trunc(v, 0.0, 256.0, 0, 255);
        break;
    case AL_DTYPE_BOOL: ((uint8_t *)base)[index] = (uint8_t)(v != 0.0); break;
    default: break;
    }
}
