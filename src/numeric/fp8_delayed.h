/*
 * numeric/fp8_delayed.h — the steps of delayed scaling kept on the device (al_fp8_ds, include/attnlab.h),
 * shared by the CPU (src/fp8_delayed.c) and the CUDA plugin (src/cuda/fp8_delayed.cu), and written to give the
 * bits of al.fp8's host recipes (lua/attnlab/fp8.lua: Recipe:record / compute_scale):
 *
 *   state layout (f64)   history [6][H] (slot s's ring: the amax recorded as number c goes to index c % H),
 *                        scale [6], accumulator [6], last_used [6]
 *   update of slot s     a = accumulator[s]; accumulator[s] = 0; history[s][count % H] = a;
 *                        m = a (most_recent) or the max over the min(count + 1, H) recorded amaxes (max: a NaN
 *                        anywhere wins, as the Lua "max" returns the first NaN it meets);
 *                        last_used[s] = scale[s]; scale[s] = fmax / m / 2^margin, kept when m is 0, inf or NaN
 *
 * Only single IEEE double operations, in the host recipe's order ((fmax / m) / pow2_margin).
 */
#ifndef ATTNLAB_NUMERIC_FP8_DELAYED_H
#define ATTNLAB_NUMERIC_FP8_DELAYED_H

#include <stdint.h>
#include "numeric/convert.h"

/* the arguments of one update, passed by value to the device */
typedef struct al_fp8_ds_step {
    int32_t history_len;
    int32_t algo;            /* AL_FP8_ALGO_MAX (0) or AL_FP8_ALGO_MOST_RECENT (1) */
    uint32_t mask;           /* bit s: update slot s */
    int32_t pad_;
    double pow2_margin;
    double fmax[6];
    int64_t count[6];        /* amaxes slot s had recorded before this update */
} al_fp8_ds_step;

#define AL_FP8_DS_WORDS(H) (6 * (int64_t)(H) + 18)
#define AL_FP8_DS_SCALE(H) (6 * (int64_t)(H))
#define AL_FP8_DS_ACC(H) (6 * (int64_t)(H) + 6)
#define AL_FP8_DS_USED(H) (6 * (int64_t)(H) + 12)

/* the larger of two amaxes, a NaN winning */
static inline AL_HD double al_fp8_ds_max(double m, double a) {
    if (m != m) return m;
    if (a != a) return a;
    return a > m ? a : m;
}

/* the scale an amax gives, or the old one when the amax is 0, inf or NaN (Recipe:compute_scale) */
static inline AL_HD double al_fp8_ds_scale(double old, double m, double fmax, double pow2_margin) {
    if (m != m || !(m > 0.0) || m - m != 0.0) return old;
    return fmax / m / pow2_margin;
}

/* the update of slot s, by one thread (the CPU's; the device spreads the history's max over a warp) */
static inline AL_HD void al_fp8_ds_update_slot(double *st, const al_fp8_ds_step *p, int s) {
    const int64_t H = p->history_len, c = p->count[s];
    double *h = st + s * H, *acc = st + AL_FP8_DS_ACC(H) + s;
    const double a = *acc;
    *acc = 0.0;
    h[c % H] = a;
    double m = a;
    if (p->algo == 0) {
        const int64_t n = c + 1 < H ? c + 1 : H;
        m = 0.0;
        for (int64_t i = 0; i < n; i++) m = al_fp8_ds_max(m, h[i]);
    }
    double *scale = st + AL_FP8_DS_SCALE(H) + s;
    st[AL_FP8_DS_USED(H) + s] = *scale;
    *scale = al_fp8_ds_scale(*scale, m, p->fmax[s], p->pow2_margin);
}

#endif /* ATTNLAB_NUMERIC_FP8_DELAYED_H */
