/*
 * cpu/attention_fwd_tmpl.h — body of the CPU attention forward, instantiated by attention_fwd.c for
 * f32 compute (REAL=float, sgemm, fast exp) and f64 compute (REAL=double, dgemm, libm exp).
 *
 * Flash-style: tasks are (batch, head, query block of BM rows), statically split over OpenMP threads
 * (so consecutive tasks share a (batch, kv head) and each thread converts that head's K and V to
 * contiguous REAL once and reuses them); per task the keys are visited in BN-row tiles:
 *   S = Q K^T (GEMM), scores = scale/bias/ALiBi/mask, online softmax (running max m, sum l),
 *   O = O * exp(m_old - m_new) + P_dropped V (GEMM).
 * Memory per thread: K,V of one head (linear in skv) plus O(BM*BN) tiles.
 * Needs: REAL, SUF, GEMM (cblas_sgemm / cblas_dgemm), EXPR(x), EXPSUM (exp(s - mu) in place, summed),
 * ROWMAX.
 */
#define FWD_CAT2(a, b) a##b
#define FWD_CAT(a, b) FWD_CAT2(a, b)
#define FWD_FN FWD_CAT(al_attn_fwd_, SUF)
#include "cpu/attention_scores_tmpl.h"   /* SCORES_ROW: bias, ALiBi, mask of one row */

static al_status FWD_FN(const al_attn_plan *pl, const al_tensor *out, REAL *lse, float *maxlog_thr, const al_attn_f8 *f8) {
    const al_attn_params *p = &pl->p;
    const int64_t B = p->b, H = p->h, HG = p->hg, SQ = p->sq, SKV = p->skv, DQK = p->d_qk, DV = p->d_v;
    const int64_t group = H / HG;
    const int64_t nqb = (SQ + AL_ATTN_BM - 1) / AL_ATTN_BM;
    const int64_t ntasks = B * H * nqb;
    const REAL scale = (REAL)p->softmax_scale;
    const int pre = p->bias_type == AL_ATTN_BIAS_PRE_SCALE, post = p->bias_type == AL_ATTN_BIAS_POST_SCALE;
    const int alibi = p->bias_type == AL_ATTN_BIAS_ALIBI;
    const double dp = p->dropout_p;
    const float keep_prob = (float)(1.0 - dp);
    const REAL dscale = dp > 0 ? (REAL)(1.0 / (1.0 - dp)) : (REAL)1;
    al_attn_acc aq, ak, av, ao;
    al_attn_acc_init(&aq, pl->in.q, p->qkv_format);
    al_attn_acc_init(&ak, pl->in.k, p->qkv_format);
    al_attn_acc_init(&av, pl->in.v, p->qkv_format);
    al_attn_acc_init(&ao, out, p->qkv_format);
    int failed = 0;
    /* tiny calls run on the calling thread: waking the team costs more than the work (host_overhead.lua) */
    const int par = ntasks > 1 && ntasks * AL_ATTN_BM * (SKV > 0 ? SKV : 1) * (DQK + DV) >= 65536;

#pragma omp parallel if (par)
    {
        const int tid = al_attn_thread();
        int64_t kvmax = SKV > 0 ? SKV : 1;
        /* the thread's five work areas in one allocation (a tiny call is dominated by such costs) */
        const size_t nK = (size_t)(kvmax * DQK), nV = (size_t)(kvmax * DV), nQ = (size_t)(AL_ATTN_BM * DQK),
                     nS = (size_t)(AL_ATTN_BM * AL_ATTN_BN);
        REAL *Kc = malloc(sizeof(REAL) * (nK + nV + nQ + nS + (size_t)(AL_ATTN_BM * DV)));
        REAL *Vc = Kc ? Kc + nK : NULL;
        REAL *Q = Kc ? Vc + nV : NULL;
        REAL *S = Kc ? Q + nQ : NULL;
        REAL *O = Kc ? S + nS : NULL;
        REAL m[AL_ATTN_BM], l[AL_ATTN_BM], raw[AL_ATTN_BM];
        double *am8 = f8 ? f8->amax_thr + (size_t)tid * 6 : NULL;
        float *mthr = maxlog_thr ? maxlog_thr + (size_t)tid * (size_t)H : NULL;
        int64_t cb = -1, ch = -1;
        if (!Kc || !Vc || !Q || !S || !O) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t task = 0; task < ntasks; task++) {
            if (failed) continue;
            const int64_t qb = task % nqb, bh = task / nqb, hh = bh % H, bb = bh / H, hk = hh / group;
            const int64_t i0 = qb * AL_ATTN_BM, qrows = pl->q_rows[bb];
            if (i0 >= qrows) continue;
            const int64_t bm = qrows - i0 < AL_ATTN_BM ? qrows - i0 : AL_ATTN_BM;
            const int64_t kvrows = pl->kv_rows[bb];
            if (bb != cb || hk != ch) {   /* convert this (batch, kv head)'s K and V once */
                for (int64_t j = 0; j < kvrows; j++) {
                    int64_t ko = ak.off + bb * ak.s_b + (pl->kv_start[bb] + j) * ak.s_row + hk * ak.s_h;
                    int64_t vo = av.off + bb * av.s_b + (pl->kv_start[bb] + j) * av.s_row + hk * av.s_h;
                    const double kd8 = al_attn_f8_desc(f8, 1, bb, pl->kv_start[bb] + j), vd8 = al_attn_f8_desc(f8, 2, bb, pl->kv_start[bb] + j);
                    for (int64_t d = 0; d < DQK; d++) Kc[j * DQK + d] = (REAL)(al_attn_ld(ak.base, ak.dtype, ko + d * ak.s_d) * kd8);
                    for (int64_t d = 0; d < DV; d++) Vc[j * DV + d] = (REAL)(al_attn_ld(av.base, av.dtype, vo + d * av.s_d) * vd8);
                }
                cb = bb; ch = hk;
            }
            for (int64_t r = 0; r < bm; r++) {
                int64_t qo = aq.off + bb * aq.s_b + (pl->q_start[bb] + i0 + r) * aq.s_row + hh * aq.s_h;
                const double qd = al_attn_f8_desc(f8, 0, bb, pl->q_start[bb] + i0 + r);
                for (int64_t d = 0; d < DQK; d++) Q[r * DQK + d] = (REAL)(al_attn_ld(aq.base, aq.dtype, qo + d * aq.s_d) * qd);
            }
            const REAL sink = pl->softmax_offset ? (REAL)pl->softmax_offset[hh] : (REAL)0;
            for (int64_t r = 0; r < bm; r++) {
                m[r] = pl->softmax_offset ? sink : (REAL)-INFINITY;
                l[r] = pl->softmax_offset ? (REAL)1 : (REAL)0;
                raw[r] = (REAL)-INFINITY;
            }
            memset(O, 0, sizeof(REAL) * (size_t)(bm * DV));
            int64_t jlo, jhi;
            al_attn_kv_range(pl, bb, i0, bm, &jlo, &jhi);
            const float slope = alibi ? pl->alibi[bb * H + hh] : 0.0f;
            const int64_t diag = pl->diag[bb];
            /* FP8 (S slot): as cuDNN's FP8 flash kernel does, the P that the P.V GEMM reads is the
             * unnormalised exp(s - m) against the running row max of the key tiles seen so far (so its
             * values are <= 1), quantised -> dequantised with the S scale; the row sum l is kept unquantised
             * and O is divided by it at the end. amax_S is the normalised maximum, max_j P = exp(raw - m) / l,
             * as cuDNN reports it. Consequence (measured on an H200 with cuDNN 9.14): a scale_S taken from
             * an amax_S < 1 saturates the largest unnormalised P. */
            for (int64_t j0 = jlo; j0 < jhi; j0 += AL_ATTN_BN) {
                const int64_t bn = jhi - j0 < AL_ATTN_BN ? jhi - j0 : AL_ATTN_BN;
                /* S = scale * Q K^T (the scale rides on the GEMM's alpha) */
                GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)bm, (int)bn, (int)DQK, scale, Q, (int)DQK,
                     Kc + j0 * DQK, (int)DQK, (REAL)0, S, AL_ATTN_BN);
                const int need_mask = al_attn_tile_needs_mask(pl, bb, i0, bm, j0, bn);
                for (int64_t r = 0; r < bm; r++) {
                    REAL *s = S + r * AL_ATTN_BN;
                    const int64_t i = i0 + r;
                    SCORES_ROW(pl, bb, hh, i, j0, bn, s, scale, pre, post, alibi, slope, diag, need_mask);
                    const REAL mt = ROWMAX(s, bn);
                    if (mt > raw[r]) raw[r] = mt;
                    const REAL mnew = mt > m[r] ? mt : m[r];
                    const REAL mu = mnew == (REAL)-INFINITY ? (REAL)0 : mnew;
                    const REAL alpha = EXPR(m[r] - mu);
                    const REAL sum = EXPSUM(s, bn, mu);
                    l[r] = l[r] * alpha + sum;
                    m[r] = mnew;
                    if (alpha != (REAL)1) {
                        REAL *o = O + r * DV;
                        for (int64_t d = 0; d < DV; d++) o[d] *= alpha;
                    }
                    if (f8 && f8->sS >= 0)
                        for (int64_t c = 0; c < bn; c++) s[c] = (REAL)al_attn_fq(f8->fwd, (double)s[c], f8->sS, f8->sS_inv);
                    if (dp > 0) {
                        uint64_t base = (uint64_t)(((bb * H + hh) * SQ + i) * SKV + j0);
                        for (int64_t c = 0; c < bn; c++)
                            s[c] = al_philox_keep(p->dropout_seed, p->dropout_offset, base + (uint64_t)c, keep_prob)
                                       ? s[c] * dscale : (REAL)0;
                    }
                }
                GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)bm, (int)DV, (int)bn, (REAL)1, S, AL_ATTN_BN,
                     Vc + j0 * DV, (int)DV, (REAL)1, O, (int)DV);
            }
            for (int64_t r = 0; r < bm; r++) {
                const int64_t i = i0 + r;
                const int row_ok = !(pl->q_valid && !pl->q_valid[bb * SQ + i]);
                REAL *lrow = lse + (bb * H + hh) * SQ;
                if (!row_ok) { lrow[i] = (REAL)-INFINITY; continue; }   /* padded row: zero output */
                const REAL inv = l[r] > 0 ? (REAL)1 / l[r] : (REAL)0;
                const REAL mu = m[r] == (REAL)-INFINITY ? (REAL)0 : m[r];
                if (f8 && f8->sS >= 0 && l[r] > 0 && raw[r] > (REAL)-INFINITY)
                    am8[AL_FP8_SLOT_S] = al_attn_amax_upd(am8[AL_FP8_SLOT_S], exp((double)(raw[r] - mu)) / (double)l[r]);
                lrow[i] = l[r] > 0 ? (REAL)(mu + log(l[r])) : (REAL)-INFINITY;
                int64_t oo = ao.off + bb * ao.s_b + (pl->q_start[bb] + i) * ao.s_row + hh * ao.s_h;
                for (int64_t d = 0; d < DV; d++) al_attn_st(ao.base, ao.dtype, oo + d * ao.s_d, (double)(O[r * DV + d] * inv));
                if (mthr && raw[r] > mthr[hh]) mthr[hh] = (float)raw[r];
            }
        }
        free(Kc);   /* Vc, Q, S and O live in the same block */
    }
    if (failed) return al_error(AL_ERR_OOM, "attention_forward (cpu): out of memory for the per-thread tiles");
    return AL_OK;
}

#undef FWD_FN
#undef SCORES_ROW
#undef SCORES_CAT
#undef SCORES_CAT2
#undef FWD_CAT
#undef FWD_CAT2
