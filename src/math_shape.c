/*
 * math_shape.c — shape and dtype rules shared by the math ops (src/math.c, src/compare.c):
 * NumPy broadcasting of two shapes and the dtype promotion of binary ops.
 *
 * Promotion (documented in include/attnlab.h, Math section):
 *   - floats: f64 > f32 > f16/bf16; f16 with bf16 gives f32. FP8 dtypes are storage formats, not
 *     math formats: they count as "below f16/bf16", and two FP8 operands give f32.
 *   - an integer (or bool) operand combined with a float counts as f32 ("integer tensors are
 *     promoted to f32 when combined with floats"), so i32 + f16 gives f32 and i32 + f64 gives f64.
 *   - integers with integers: i64 > i32 > u8 > bool.
 */
#include "internal.h"

#include <stdio.h>

al_status al_broadcast_shapes(const char *op, int32_t na, const int64_t *sa, int32_t nb,
                              const int64_t *sb, int32_t *nout, int64_t *sout) {
    if (na < 0 || na > AL_MAX_DIMS || nb < 0 || nb > AL_MAX_DIMS)
        return al_error(AL_ERR_ARG, "%s: ndim must be 0..%d, got %d and %d", op, AL_MAX_DIMS, na, nb);
    int32_t n = na > nb ? na : nb;
    int64_t tmp[AL_MAX_DIMS];
    /* align trailing dims: dim i of the result is dim i-(n-na) of a */
    for (int32_t i = 0; i < n; i++) {
        int32_t ia = i - (n - na), ib = i - (n - nb);
        int64_t ea = ia >= 0 ? sa[ia] : 1;
        int64_t eb = ib >= 0 ? sb[ib] : 1;
        if (ea == eb || eb == 1) {
            tmp[i] = ea;
        } else if (ea == 1) {
            tmp[i] = eb;
        } else {
            char bufa[160], bufb[160];
            return al_error(AL_ERR_ARG,
                            "%s: shapes %s and %s cannot be broadcast (dim %d from the end: %lld vs %lld)",
                            op, al_shape_str(na, sa, bufa, sizeof bufa), al_shape_str(nb, sb, bufb, sizeof bufb),
                            (int)(n - i), (long long)ea, (long long)eb);
        }
    }
    for (int32_t i = 0; i < n; i++) sout[i] = tmp[i];
    *nout = n;
    return AL_OK;
}

/* Rank of a float dtype in the promotion lattice (0 = not float). f16 and bf16 share a rank. */
static int float_rank(int32_t d) {
    switch (d) {
    case AL_DTYPE_FP8_E4M3: case AL_DTYPE_FP8_E5M2: return 1;
    case AL_DTYPE_F16: case AL_DTYPE_BF16: return 2;
    case AL_DTYPE_F32: return 3;
    case AL_DTYPE_F64: return 4;
    default: return 0;
    }
}

static int int_rank(int32_t d) {
    switch (d) {
    case AL_DTYPE_BOOL: return 1;
    case AL_DTYPE_U8: return 2;
    case AL_DTYPE_I32: return 3;
    case AL_DTYPE_I64: return 4;
    default: return 0;
    }
}

int32_t al_promote_dtypes(int32_t a, int32_t b) {
    int fa = float_rank(a), fb = float_rank(b);
    if (!fa && !fb) return int_rank(a) >= int_rank(b) ? a : b;
    /* an integer operand counts as f32 */
    if (!fa) { a = AL_DTYPE_F32; fa = 3; }
    if (!fb) { b = AL_DTYPE_F32; fb = 3; }
    if (a == b) return (fa == 1) ? AL_DTYPE_F32 : a;   /* fp8 op fp8 computes (and stores) f32 */
    if (fa != fb) return fa > fb ? a : b;
    /* same rank, different dtypes: f16 with bf16, or e4m3 with e5m2 */
    return AL_DTYPE_F32;
}
