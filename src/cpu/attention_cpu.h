/*
 * cpu/attention_cpu.h — helpers shared by the CPU attention forward and backward
 * (attention_fwd.c, attention_bwd.c): strided row access to q/k/v/out in any format and float dtype,
 * the element mask of al_attn_plan (see attention_internal.h), bias lookup, a vectorisable f32 exp,
 * and a guard that keeps OpenBLAS single-threaded inside our OpenMP regions (each of our threads
 * runs its own small GEMMs; a nested BLAS thread pool would only oversubscribe the cores).
 */
#ifndef ATTNLAB_CPU_ATTENTION_CPU_H
#define ATTNLAB_CPU_ATTENTION_CPU_H

#include "attention_internal.h"
#include "numeric/convert.h"
#include "numeric/philox.h"
#include "numeric/fp8_scale.h"

#include <math.h>
#include <stdlib.h>
#include <cblas.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* Tile sizes: BM query rows x BN key rows per GEMM pair. */
#define AL_ATTN_BM 64
#define AL_ATTN_BN 128

/* OpenBLAS's thread-count knobs, when the BLAS in use has them (weak: absent elsewhere). */
extern void openblas_set_num_threads(int) __attribute__((weak));
extern int openblas_get_num_threads(void) __attribute__((weak));
static inline int al_attn_blas_single_begin(void) {
    if (!openblas_set_num_threads || !openblas_get_num_threads) return 0;
    int n = openblas_get_num_threads();
    openblas_set_num_threads(1);
    return n;
}
static inline void al_attn_blas_single_end(int n) {
    if (n > 0 && openblas_set_num_threads) openblas_set_num_threads(n);
}

static inline int al_attn_nthreads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
static inline int al_attn_thread(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Row accessor: element (b, row, head, d) of a q/k/v/out-like tensor is at
 * off + b*s_b + row*s_row + head*s_h + d*s_d (row = start[b] + i for thd, i otherwise). */
typedef struct al_attn_acc {
    char *base;
    int32_t dtype;
    int64_t off, s_b, s_row, s_h, s_d;
} al_attn_acc;

static inline void al_attn_acc_init(al_attn_acc *a, const al_tensor *t, int32_t fmt) {
    a->base = (char *)t->data;
    a->dtype = t->dtype;
    a->off = t->offset;
    if (fmt == AL_ATTN_FORMAT_THD) {
        a->s_b = 0; a->s_row = t->stride[0]; a->s_h = t->stride[1]; a->s_d = t->stride[2];
    } else if (fmt == AL_ATTN_FORMAT_SBHD) {
        a->s_row = t->stride[0]; a->s_b = t->stride[1]; a->s_h = t->stride[2]; a->s_d = t->stride[3];
    } else {
        a->s_b = t->stride[0]; a->s_row = t->stride[1]; a->s_h = t->stride[2]; a->s_d = t->stride[3];
    }
}

static inline double al_attn_ld(const char *base, int32_t dtype, int64_t i) {
    switch (dtype) {
    case AL_DTYPE_F32: return ((const float *)base)[i];
    case AL_DTYPE_F64: return ((const double *)base)[i];
    case AL_DTYPE_F16: return al_f16_to_f32(((const uint16_t *)base)[i]);
    case AL_DTYPE_BF16: return al_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return al_load_f64(base, dtype, i);
    }
}
static inline void al_attn_st(char *base, int32_t dtype, int64_t i, double v) {
    switch (dtype) {
    case AL_DTYPE_F32: ((float *)base)[i] = (float)v; break;
    case AL_DTYPE_F64: ((double *)base)[i] = v; break;
    case AL_DTYPE_F16: ((uint16_t *)base)[i] = al_f64_to_f16(v); break;
    case AL_DTYPE_BF16: ((uint16_t *)base)[i] = al_f64_to_bf16(v); break;
    default: al_store_f64(base, dtype, i, v); break;
    }
}

/* Is element (b, h, i, j) masked out? (i, j sequence-local; j < kv_rows[b] assumed) */
static inline int al_attn_masked(const al_attn_plan *pl, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (pl->q_valid && !pl->q_valid[b * pl->p.sq + i]) return 1;
    if (pl->kv_valid && !pl->kv_valid[b * pl->p.skv + j]) return 1;
    int64_t c = i + pl->diag[b];
    if (pl->p.window_left >= 0 && j < c - pl->p.window_left) return 1;
    if (pl->p.window_right >= 0 && j > c + pl->p.window_right) return 1;
    if (pl->has_arb) {
        const al_tensor *m = pl->in.attention_mask;
        int64_t o = pl->arb_offset + b * pl->arb_stride[0] + h * pl->arb_stride[1] + i * pl->arb_stride[2] +
                    j * pl->arb_stride[3];
        if (((const uint8_t *)m->data)[o]) return 1;
    }
    return 0;
}

/* Does the tile rows [i0, i0+bm) x cols [j0, j0+bn) need per-element masking? */
static inline int al_attn_tile_needs_mask(const al_attn_plan *pl, int64_t b, int64_t i0, int64_t bm, int64_t j0,
                                          int64_t bn) {
    if (pl->q_valid || pl->kv_valid || pl->has_arb) return 1;
    int64_t d = pl->diag[b];
    if (pl->p.window_left >= 0 && j0 < i0 + bm - 1 + d - pl->p.window_left) return 1;
    if (pl->p.window_right >= 0 && j0 + bn - 1 > i0 + d + pl->p.window_right) return 1;
    return 0;
}

/* Row i of a tile starting at key j0 with bn keys: columns [*lo, *hi) pass the window; returns 1
 * when only the window masks (no validity arrays, no arbitrary mask), so the caller can fill
 * [0, lo) and [hi, bn) with -inf instead of testing every element. */
static inline int al_attn_row_window(const al_attn_plan *pl, int64_t b, int64_t i, int64_t j0, int64_t bn,
                                     int64_t *lo, int64_t *hi) {
    int64_t c = i + pl->diag[b] - j0, l = 0, h = bn;
    if (pl->p.window_left >= 0 && c - pl->p.window_left > l) l = c - pl->p.window_left;
    if (pl->p.window_right >= 0 && c + pl->p.window_right + 1 < h) h = c + pl->p.window_right + 1;
    if (l > bn) l = bn;
    if (h < l) h = l;
    *lo = l; *hi = h;
    return !(pl->q_valid || pl->kv_valid || pl->has_arb);
}

/* The key range [lo, hi) that rows [i0, i0+bm) can see (window bounds, clipped to kv_rows). */
static inline void al_attn_kv_range(const al_attn_plan *pl, int64_t b, int64_t i0, int64_t bm, int64_t *lo,
                                    int64_t *hi) {
    int64_t l = 0, h = pl->kv_rows[b], d = pl->diag[b];
    if (pl->p.window_left >= 0 && i0 + d - pl->p.window_left > l) l = i0 + d - pl->p.window_left;
    if (pl->p.window_right >= 0 && i0 + bm - 1 + d + pl->p.window_right + 1 < h) h = i0 + bm - 1 + d + pl->p.window_right + 1;
    if (l > h) l = h;
    *lo = l; *hi = h;
}

/* Bias value at (b, h, i, j) through the broadcast strides. */
static inline double al_attn_bias_at(const al_attn_plan *pl, int64_t b, int64_t h, int64_t i, int64_t j) {
    const al_tensor *B = pl->in.bias;
    int64_t o = pl->bias_offset + b * pl->bias_stride[0] + h * pl->bias_stride[1] + i * pl->bias_stride[2] +
                j * pl->bias_stride[3];
    return al_attn_ld((const char *)B->data, B->dtype, o);
}

/* Contiguous index of (b, h, i, j) in the bias's own shape (broadcast dims collapse to 0). */
static inline int64_t al_attn_bias_index(const al_attn_plan *pl, int64_t b, int64_t h, int64_t i, int64_t j) {
    const al_tensor *B = pl->in.bias;
    int64_t bb = B->size[0] == 1 ? 0 : b, hh = B->size[1] == 1 ? 0 : h, ii = B->size[2] == 1 ? 0 : i;
    return ((bb * B->size[1] + hh) * B->size[2] + ii) * B->size[3] + j;
}

/* exp for f32, branch-free so loops vectorise: exp(x) = 2^n * p(r), |r| <= ln2/2, degree-6
 * polynomial (relative error ~2e-7); x < -87 gives 0 (so exp(-inf) = 0). */
static inline float al_attn_expf(float x) {
    float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    /* n = round(x / ln2) by the 1.5 * 2^23 trick (no floorf: it would not vectorise on SSE2) */
    float t = xc * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, 4);
    float v = p * s;
    return x < -87.0f ? 0.0f : v;
}

/* max of s[0..n) (-inf for n = 0; no NaNs expected). */
static inline float al_attn_rowmax(const float *s, int64_t n) {
    int64_t c = 0;
    float m = -INFINITY;
#ifdef __SSE2__
    __m128 vm = _mm_set1_ps(-INFINITY);
    for (; c + 4 <= n; c += 4) vm = _mm_max_ps(vm, _mm_loadu_ps(s + c));
    float t[4];
    _mm_storeu_ps(t, vm);
    m = t[0] > t[1] ? t[0] : t[1];
    m = t[2] > m ? t[2] : m;
    m = t[3] > m ? t[3] : m;
#endif
    for (; c < n; c++) m = s[c] > m ? s[c] : m;
    return m;
}
static inline double al_attn_rowmax_f64(const double *s, int64_t n) {
    double m = -INFINITY;
    for (int64_t c = 0; c < n; c++) m = s[c] > m ? s[c] : m;
    return m;
}

/* s[c] = exp(s[c] - mu) for c < n; returns the sum. SSE2 (4 lanes) with the same polynomial as
 * al_attn_expf, scalar tail. mu may be +inf (then every result is 0). */
static inline float al_attn_exp_sub_sum(float *s, int64_t n, float mu) {
    int64_t c = 0;
    float sum = 0.0f;
#ifdef __SSE2__
    const __m128 vmu = _mm_set1_ps(mu), lo = _mm_set1_ps(-87.0f), hi = _mm_set1_ps(88.0f);
    const __m128 magic = _mm_set1_ps(12582912.0f), l2e = _mm_set1_ps(1.44269504088896341f);
    const __m128 c1 = _mm_set1_ps(0.693359375f), c2 = _mm_set1_ps(-2.12194440e-4f), one = _mm_set1_ps(1.0f);
    __m128 vs = _mm_setzero_ps();
    for (; c + 4 <= n; c += 4) {
        __m128 x = _mm_sub_ps(_mm_loadu_ps(s + c), vmu);
        __m128 xc = _mm_max_ps(_mm_min_ps(x, hi), lo);
        __m128 nn = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(xc, l2e), magic), magic);
        __m128 r = _mm_sub_ps(xc, _mm_mul_ps(nn, c1));
        r = _mm_sub_ps(r, _mm_mul_ps(nn, c2));
        __m128 p = _mm_set1_ps(1.9875691500e-4f);
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.3981999507e-3f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(8.3334519073e-3f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(4.1665795894e-2f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.6666665459e-1f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(5.0000001201e-1f));
        p = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(p, r), r), r), one);
        __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(nn), _mm_set1_epi32(127)), 23);
        __m128 v = _mm_mul_ps(p, _mm_castsi128_ps(e));
        v = _mm_andnot_ps(_mm_cmplt_ps(x, lo), v);
        _mm_storeu_ps(s + c, v);
        vs = _mm_add_ps(vs, v);
    }
    float t[4];
    _mm_storeu_ps(t, vs);
    sum = (t[0] + t[1]) + (t[2] + t[3]);
#endif
    for (; c < n; c++) {
        s[c] = al_attn_expf(s[c] - mu);
        sum += s[c];
    }
    return sum;
}
static inline double al_attn_exp_sub_sum_f64(double *s, int64_t n, double mu) {
    double sum = 0.0;
    for (int64_t c = 0; c < n; c++) {
        s[c] = exp(s[c] - mu);
        sum += s[c];
    }
    return sum;
}

/* ---- FP8 emulation (al_attn_fp8, include/attnlab.h) ------------------------------------------------
 * The kernels' view of an FP8 call: how q/k/v are read (FP8 codes times a scalar or per-token descale)
 * and the in-kernel slots S and dP (scale, or off when < 0). NULL = no FP8: the kernels are unchanged.
 * Each thread keeps its own amax per slot (amax_thr[tid * 6 + slot]), combined by the caller. */
typedef struct al_attn_f8 {
    int32_t fwd, bwd;             /* formats */
    double qkv_dq;                /* scalar descale of FP8 q/k/v (1 for float inputs) */
    const float *dsc[3];          /* per-token descales of q, k, v (element 0 of the view), or NULL */
    int64_t ds_b[3], ds_r[3];     /* their batch and token strides */
    double sS, sS_inv, sdP, sdP_inv;
    double *amax_thr;             /* [nthreads * 6] */
} al_attn_f8;

/* Descale of token (b, row) of q (which = 0), k (1) or v (2). */
static inline double al_attn_f8_desc(const al_attn_f8 *f, int which, int64_t b, int64_t row) {
    if (!f) return 1.0;
    const float *d = f->dsc[which];
    if (!d) return f->qkv_dq;
    return (double)d[b * f->ds_b[which] + row * f->ds_r[which]];
}

/* attention_fwd.c: fill f from plan->in.fp8 (allocates amax_thr: free it); combine one slot's per-thread
 * amaxes; store a contiguous f32 tensor into dst through a quantise -> dequantise (see there). */
al_status al_attn_f8_setup(const al_attn_plan *pl, al_attn_f8 *f, int nthr);
double al_attn_f8_amax(const al_attn_f8 *f, int nthr, int slot);
al_status al_attn_f8_store(al_tensor *dst, const al_tensor *src, int32_t fmt, double scale, int per_row, int64_t rowlen,
                           double pow2m);

/* quantise -> dequantise: decode(encode(v * s)) * inv */
static inline double al_attn_fq(int32_t fmt, double v, double s, double inv) {
    return al_fp8_decode(fmt, al_fp8_encode(fmt, v * s)) * inv;
}
/* NaN-propagating max of |v| into m */
static inline double al_attn_amax_upd(double m, double v) {
    double a = fabs(v);
    if (m != m) return m;
    if (a != a) return a;
    return a > m ? a : m;
}

#endif /* ATTNLAB_CPU_ATTENTION_CPU_H */
