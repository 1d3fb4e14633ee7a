/*
 * elementwise.c — CPU element-wise ops over any strides: unary, binary, binary with a scalar, where.
 *
 * Inputs arrive expanded to out's shape (stride 0 where broadcast); out is contiguous. The generic
 * path reads and writes every dtype through double (al_load_f64 / al_store_f64), which is exact for
 * every dtype but i64 beyond 2^53. When all operands are f32 (or all f64) the loops read the values
 * directly, and when they are also dense they become flat loops the compiler vectorises.
 * Work is split across OpenMP threads by ranges of row-major positions.
 */
#include "cpu/cpu_math.h"

#include <math.h>
#include <omp.h>

/* ---- the ops, in double ------------------------------------------------------------------------ */
static inline double unary_f64(int32_t op, double x) {
    switch (op) {
    case AL_UNARY_NEG: return -x;
    case AL_UNARY_ABS: return fabs(x);
    case AL_UNARY_EXP: return exp(x);
    case AL_UNARY_LOG: return log(x);
    case AL_UNARY_SQRT: return sqrt(x);
    case AL_UNARY_TANH: return tanh(x);
    default: return NAN;
    }
}

static inline double binary_f64(int32_t op, double x, double y) {
    switch (op) {
    case AL_BINARY_ADD: return x + y;
    case AL_BINARY_SUB: return x - y;
    case AL_BINARY_MUL: return x * y;
    case AL_BINARY_DIV: return x / y;
    case AL_BINARY_MAXIMUM: return (x != x) ? x : (y != y) ? y : (x > y ? x : y);   /* NaN propagates */
    case AL_BINARY_MINIMUM: return (x != x) ? x : (y != y) ? y : (x < y ? x : y);
    case AL_BINARY_POW: return pow(x, y);
    case AL_BINARY_EQ: return x == y;
    case AL_BINARY_NE: return x != y;
    case AL_BINARY_LT: return x < y;
    case AL_BINARY_LE: return x <= y;
    case AL_BINARY_GT: return x > y;
    case AL_BINARY_GE: return x >= y;
    default: return NAN;
    }
}

/* ---- the same ops on a native float type T, for the same-dtype fast paths ------------------------ */
#define DEFINE_TYPED_OPS(T, SUF, EXP, LOG, SQRT, TANH, POW, FABS)                                    \
    static inline T unary_##SUF(int32_t op, T x) {                                                   \
        switch (op) {                                                                                \
        case AL_UNARY_NEG: return -x;                                                                \
        case AL_UNARY_ABS: return FABS(x);                                                           \
        case AL_UNARY_EXP: return EXP(x);                                                            \
        case AL_UNARY_LOG: return LOG(x);                                                            \
        case AL_UNARY_SQRT: return SQRT(x);                                                          \
        case AL_UNARY_TANH: return TANH(x);                                                          \
        default: return (T)NAN;                                                                      \
        }                                                                                            \
    }                                                                                                \
    static inline T binary_##SUF(int32_t op, T x, T y) {                                             \
        switch (op) {                                                                                \
        case AL_BINARY_ADD: return x + y;                                                            \
        case AL_BINARY_SUB: return x - y;                                                            \
        case AL_BINARY_MUL: return x * y;                                                            \
        case AL_BINARY_DIV: return x / y;                                                            \
        case AL_BINARY_MAXIMUM: return (x != x) ? x : (y != y) ? y : (x > y ? x : y);                \
        case AL_BINARY_MINIMUM: return (x != x) ? x : (y != y) ? y : (x < y ? x : y);                \
        case AL_BINARY_POW: return POW(x, y);                                                        \
        default: return (T)NAN;                                                                      \
        }                                                                                            \
    }

DEFINE_TYPED_OPS(float, f32, expf, logf, sqrtf, tanhf, powf, fabsf)
DEFINE_TYPED_OPS(double, f64d, exp, log, sqrt, tanh, pow, fabs)

static inline int is_arith(int32_t op) { return op >= AL_BINARY_ADD && op <= AL_BINARY_POW; }

static inline int use_threads(int64_t n) { return n >= AL_CPU_PAR_MIN && omp_get_max_threads() > 1; }

/* ---- unary ------------------------------------------------------------------------------------- */
static void unary_generic(int32_t op, al_tensor *out, const al_tensor *a, int64_t lo, int64_t hi) {
    al_iter it;
    al_iter_init(&it, out->ndim, out->size, 2, (const int64_t *[]){out->stride, a->stride},
                 (int64_t[]){out->offset, a->offset});
    al_iter_seek(&it, lo);
    for (int64_t i = lo; i < hi; i++, al_iter_next(&it))
        al_store_f64(out->data, out->dtype, it.off[0], unary_f64(op, al_load_f64(a->data, a->dtype, it.off[1])));
}

#define UNARY_TYPED(T, SUF)                                                                          \
    static void unary_##SUF##_range(int32_t op, al_tensor *out, const al_tensor *a, int64_t lo,      \
                                    int64_t hi, int dense) {                                         \
        T *o = (T *)out->data;                                                                       \
        const T *x = (const T *)a->data;                                                             \
        if (dense) {                                                                                 \
            o += out->offset;                                                                        \
            x += a->offset;                                                                          \
            for (int64_t i = lo; i < hi; i++) o[i] = unary_##SUF(op, x[i]);                          \
            return;                                                                                  \
        }                                                                                            \
        al_iter it;                                                                                  \
        al_iter_init(&it, out->ndim, out->size, 2, (const int64_t *[]){out->stride, a->stride},      \
                     (int64_t[]){out->offset, a->offset});                                           \
        al_iter_seek(&it, lo);                                                                       \
        for (int64_t i = lo; i < hi; i++, al_iter_next(&it)) o[it.off[0]] = unary_##SUF(op, x[it.off[1]]); \
    }
UNARY_TYPED(float, f32)
UNARY_TYPED(double, f64d)

al_status al_cpu_unary(int32_t op, al_tensor *out, const al_tensor *a) {
    int64_t n = al_tensor_numel(out);
    if (n == 0) return AL_OK;
    int same = out->dtype == a->dtype && (a->dtype == AL_DTYPE_F32 || a->dtype == AL_DTYPE_F64);
    int dense = al_cpu_is_dense(out) && al_cpu_is_dense(a);
    int nt = use_threads(n) ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        al_cpu_range(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (same && a->dtype == AL_DTYPE_F32) unary_f32_range(op, out, a, lo, hi, dense);
        else if (same) unary_f64d_range(op, out, a, lo, hi, dense);
        else unary_generic(op, out, a, lo, hi);
    }
    return AL_OK;
}

/* ---- binary ------------------------------------------------------------------------------------ */
static void binary_generic(int32_t op, al_tensor *out, const al_tensor *a, const al_tensor *b,
                           int64_t lo, int64_t hi) {
    al_iter it;
    al_iter_init(&it, out->ndim, out->size, 3, (const int64_t *[]){out->stride, a->stride, b->stride},
                 (int64_t[]){out->offset, a->offset, b->offset});
    al_iter_seek(&it, lo);
    for (int64_t i = lo; i < hi; i++, al_iter_next(&it)) {
        double x = al_load_f64(a->data, a->dtype, it.off[1]);
        double y = al_load_f64(b->data, b->dtype, it.off[2]);
        al_store_f64(out->data, out->dtype, it.off[0], binary_f64(op, x, y));
    }
}

#define BINARY_TYPED(T, SUF)                                                                         \
    static void binary_##SUF##_range(int32_t op, al_tensor *out, const al_tensor *a,                 \
                                     const al_tensor *b, int64_t lo, int64_t hi, int dense) {        \
        T *o = (T *)out->data;                                                                       \
        const T *x = (const T *)a->data, *y = (const T *)b->data;                                    \
        if (dense) {                                                                                 \
            o += out->offset;                                                                        \
            x += a->offset;                                                                          \
            y += b->offset;                                                                          \
            /* one loop per op so each is a plain vectorisable loop */                               \
            switch (op) {                                                                            \
            case AL_BINARY_ADD: for (int64_t i = lo; i < hi; i++) o[i] = x[i] + y[i]; return;        \
            case AL_BINARY_SUB: for (int64_t i = lo; i < hi; i++) o[i] = x[i] - y[i]; return;        \
            case AL_BINARY_MUL: for (int64_t i = lo; i < hi; i++) o[i] = x[i] * y[i]; return;        \
            case AL_BINARY_DIV: for (int64_t i = lo; i < hi; i++) o[i] = x[i] / y[i]; return;        \
            default: for (int64_t i = lo; i < hi; i++) o[i] = binary_##SUF(op, x[i], y[i]); return;  \
            }                                                                                        \
        }                                                                                            \
        al_iter it;                                                                                  \
        al_iter_init(&it, out->ndim, out->size, 3,                                                   \
                     (const int64_t *[]){out->stride, a->stride, b->stride},                         \
                     (int64_t[]){out->offset, a->offset, b->offset});                                \
        al_iter_seek(&it, lo);                                                                       \
        for (int64_t i = lo; i < hi; i++, al_iter_next(&it))                                         \
            o[it.off[0]] = binary_##SUF(op, x[it.off[1]], y[it.off[2]]);                             \
    }
BINARY_TYPED(float, f32)
BINARY_TYPED(double, f64d)

al_status al_cpu_binary(int32_t op, al_tensor *out, const al_tensor *a, const al_tensor *b) {
    int64_t n = al_tensor_numel(out);
    if (n == 0) return AL_OK;
    int32_t t = out->dtype;
    int same = is_arith(op) && a->dtype == t && b->dtype == t && (t == AL_DTYPE_F32 || t == AL_DTYPE_F64);
    int dense = al_cpu_is_dense(out) && al_cpu_is_dense(a) && al_cpu_is_dense(b);
    int nt = use_threads(n) ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        al_cpu_range(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (same && t == AL_DTYPE_F32) binary_f32_range(op, out, a, b, lo, hi, dense);
        else if (same) binary_f64d_range(op, out, a, b, lo, hi, dense);
        else binary_generic(op, out, a, b, lo, hi);
    }
    return AL_OK;
}

/* ---- binary with a scalar ---------------------------------------------------------------------- */
static void scalar_generic(int32_t op, al_tensor *out, const al_tensor *a, double s, int32_t first,
                           int64_t lo, int64_t hi) {
    al_iter it;
    al_iter_init(&it, out->ndim, out->size, 2, (const int64_t *[]){out->stride, a->stride},
                 (int64_t[]){out->offset, a->offset});
    al_iter_seek(&it, lo);
    for (int64_t i = lo; i < hi; i++, al_iter_next(&it)) {
        double x = al_load_f64(a->data, a->dtype, it.off[1]);
        al_store_f64(out->data, out->dtype, it.off[0], first ? binary_f64(op, s, x) : binary_f64(op, x, s));
    }
}

#define SCALAR_TYPED(T, SUF)                                                                         \
    static void scalar_##SUF##_range(int32_t op, al_tensor *out, const al_tensor *a, T s, int first, \
                                     int64_t lo, int64_t hi, int dense) {                            \
        T *o = (T *)out->data;                                                                       \
        const T *x = (const T *)a->data;                                                             \
        if (dense) {                                                                                 \
            o += out->offset;                                                                        \
            x += a->offset;                                                                          \
            if (!first && op == AL_BINARY_ADD) { for (int64_t i = lo; i < hi; i++) o[i] = x[i] + s; return; } \
            if (!first && op == AL_BINARY_MUL) { for (int64_t i = lo; i < hi; i++) o[i] = x[i] * s; return; } \
            if (first) for (int64_t i = lo; i < hi; i++) o[i] = binary_##SUF(op, s, x[i]);           \
            else for (int64_t i = lo; i < hi; i++) o[i] = binary_##SUF(op, x[i], s);                 \
            return;                                                                                  \
        }                                                                                            \
        al_iter it;                                                                                  \
        al_iter_init(&it, out->ndim, out->size, 2, (const int64_t *[]){out->stride, a->stride},      \
                     (int64_t[]){out->offset, a->offset});                                           \
        al_iter_seek(&it, lo);                                                                       \
        for (int64_t i = lo; i < hi; i++, al_iter_next(&it))                                         \
            o[it.off[0]] = first ? binary_##SUF(op, s, x[it.off[1]]) : binary_##SUF(op, x[it.off[1]], s); \
    }
SCALAR_TYPED(float, f32)
SCALAR_TYPED(double, f64d)

al_status al_cpu_binary_scalar(int32_t op, al_tensor *out, const al_tensor *a, double s, int32_t scalar_first) {
    int64_t n = al_tensor_numel(out);
    if (n == 0) return AL_OK;
    int32_t t = out->dtype;
    int same = is_arith(op) && a->dtype == t && (t == AL_DTYPE_F32 || t == AL_DTYPE_F64);
    int dense = al_cpu_is_dense(out) && al_cpu_is_dense(a);
    int nt = use_threads(n) ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        al_cpu_range(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (same && t == AL_DTYPE_F32) scalar_f32_range(op, out, a, (float)s, scalar_first, lo, hi, dense);
        else if (same) scalar_f64d_range(op, out, a, s, scalar_first, lo, hi, dense);
        else scalar_generic(op, out, a, s, scalar_first, lo, hi);
    }
    return AL_OK;
}

/* ---- where ------------------------------------------------------------------------------------- */
al_status al_cpu_where(al_tensor *out, const al_tensor *cond, const al_tensor *a, const al_tensor *b) {
    int64_t n = al_tensor_numel(out);
    if (n == 0) return AL_OK;
    int nt = use_threads(n) ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        al_cpu_range(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        al_iter it;
        al_iter_init(&it, out->ndim, out->size, 4,
                     (const int64_t *[]){out->stride, cond->stride, a->stride, b->stride},
                     (int64_t[]){out->offset, cond->offset, a->offset, b->offset});
        al_iter_seek(&it, lo);
        for (int64_t i = lo; i < hi; i++, al_iter_next(&it)) {
            /* bool and u8 are one byte each: read the byte, any non-zero value is true */
            int c = ((const uint8_t *)cond->data)[it.off[1]] != 0;
            double v = c ? al_load_f64(a->data, a->dtype, it.off[2]) : al_load_f64(b->data, b->dtype, it.off[3]);
            al_store_f64(out->data, out->dtype, it.off[0], v);
        }
    }
    return AL_OK;
}
