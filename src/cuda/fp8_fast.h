/*
 * cuda/fp8_fast.h — f32 (and f16 / bf16 through an exact widening) -> OCP FP8 on the device with the
 * hardware converter, giving the same bits as numeric/convert.h's al_f32_to_e4m3 / al_f32_to_e5m2.
 *
 * The software encoders are ~40 integer instructions per element, which caps the dense convert
 * kernel near half of the copy bandwidth. sm_89+ converts two floats per instruction with
 * `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32` (F2FP in SASS), whose rules are convert.h's: round to
 * nearest even, subnormal inputs and outputs exact (no .ftz), finite overflow and +-inf saturate to
 * +-max finite (448 / 57344). Two points are NOT left to the hardware:
 *   NaN     the hardware's NaN code and sign need not be convert.h's (e5m2: 0x7E|sign there); a
 *           group of elements holding any NaN is converted by the software encoders instead (NaNs
 *           are rare: the branch costs nothing on ordinary data);
 *   sign    every result gets the input's sign bit ORed in, so a value that rounds to zero is -0
 *           for a negative input whatever the hardware does with the sign of a zero result (for a
 *           non-zero result the sign bit is already the input's: OR is a no-op).
 * Everything else (RNE ties, the subnormal grid, the saturation thresholds 464 / 61440) is checked
 * against the software encoders over all 2^32 f32 inputs by tests/cuda/fp8_fast_parity.cu (device)
 * and was checked on the host against cuda_fp8.hpp's reference emulation of the instruction.
 * Without sm_89 (the sm_80 build) the functions use the software encoders.
 *
 * f16 and bf16 inputs widen to f32 exactly (cvt.f32.f16 is exact for every non-NaN f16, subnormals
 * included; bf16 is the top half of an f32), so converting the widened float rounds once, as
 * convert.h does (al_st_f32(al_ld_f32(x))).
 */
#ifndef ATTNLAB_CUDA_FP8_FAST_H
#define ATTNLAB_CUDA_FP8_FAST_H

#include <stdint.h>
#include "numeric/convert.h"

#ifdef __CUDACC__
/* Four floats -> four FP8 codes packed little-endian (x0 in the low byte) in *code, E4M3 when
 * E4M3 != 0 else E5M2. Returns 0 (and leaves *code alone) when the hardware path does not apply:
 * any of the four is NaN, or the build target has no FP8 converter. The caller then converts the
 * group with the software encoders, from the source elements themselves. */
template <int E4M3>
static __device__ __forceinline__ int al_fp8x4_hw(float x0, float x1, float x2, float x3, uint32_t *code) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if ((x0 != x0) | (x1 != x1) | (x2 != x2) | (x3 != x3)) return 0;
    unsigned short lo, hi;
    /* cvt d, a, b puts a in the upper byte and b in the lower */
    if (E4M3) {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
    } else {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
    }
    /* the top byte of each input (sign + 7 exponent bits), gathered into one word */
    uint32_t p01 = __byte_perm(__float_as_uint(x0), __float_as_uint(x1), 0x0073);
    uint32_t p23 = __byte_perm(__float_as_uint(x2), __float_as_uint(x3), 0x0073);
    uint32_t signs = __byte_perm(p01, p23, 0x5410) & 0x80808080u;
    *code = ((uint32_t)lo | ((uint32_t)hi << 16)) | signs;
    return 1;
#else
    (void)x0; (void)x1; (void)x2; (void)x3; (void)code;
    return 0;
#endif
}

/* f16 -> f32 for the fast path: exact for every non-NaN f16 (subnormals included). A NaN stays a
 * NaN (its sign and payload may not survive), which sends its group to the software path. */
static __device__ __forceinline__ float al_f16_widen_hw(uint16_t h) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return al_f16_to_f32(h);
#endif
}
#endif /* __CUDACC__ */

#endif /* ATTNLAB_CUDA_FP8_FAST_H */
