/*
 * cpu/attention_bwd_tmpl.h — body of the CPU attention backward, instantiated by attention_bwd.c for
 * f32 and f64 compute (REAL, SUF, GEMM, EXPR as in attention_fwd_tmpl.h).
 *
 * Recomputing (flash-style) backward from the forward's LSE: tasks are (batch, kv head), so the dK,
 * dV accumulators of a task are private (no races, deterministic with GQA); each task walks the
 * query heads of its group and their BM-row blocks, and per BN-key tile:
 *   S = Q K^T -> scores (as the forward) -> P = exp(s - lse)         (0 where masked)
 *   dPd = dO V^T;  Z = dropout keep / (1-p);  dV += (P Z)^T dO;  dP = dPd Z
 *   dS = P (dP - Drow), Drow = rowsum(dO * O)
 *   dbias += dS (post) or scale dS (pre);  dQ += scale dS K;  dK += scale dS^T Q
 * and the learnable sink gets d offset_h -= sum_i exp(offset_h - lse_i) Drow_i.
 * dbias and d offset are per-thread f64 accumulators summed in thread order afterwards.
 */
#define BWD_CAT2(a, b) a##b
#define BWD_CAT(a, b) BWD_CAT2(a, b)
#define BWD_FN BWD_CAT(al_attn_bwd_, SUF)
#include "cpu/attention_scores_tmpl.h"   /* SCORES_ROW: bias, ALiBi, mask of one row, as the forward */

static al_status BWD_FN(const al_attn_plan *pl, const al_tensor *out, const al_tensor *dout, const REAL *lse,
                        al_tensor *dq, al_tensor *dk, al_tensor *dv, double *dbias_thr, int64_t dbias_n,
                        double *doff_thr, const al_attn_f8 *f8) {
    const al_attn_params *p = &pl->p;
    const int64_t B = p->b, H = p->h, HG = p->hg, SQ = p->sq, SKV = p->skv, DQK = p->d_qk, DV = p->d_v;
    const int64_t group = H / HG;
    const int64_t ntasks = B * HG;
    const REAL scale = (REAL)p->softmax_scale;
    const int pre = p->bias_type == AL_ATTN_BIAS_PRE_SCALE, post = p->bias_type == AL_ATTN_BIAS_POST_SCALE;
    const int alibi = p->bias_type == AL_ATTN_BIAS_ALIBI;
    const double dp = p->dropout_p;
    const float keep_prob = (float)(1.0 - dp);
    const REAL dscale = dp > 0 ? (REAL)(1.0 / (1.0 - dp)) : (REAL)1;
    al_attn_acc aq, ak, av, ao, ado, adq, adk, adv;
    al_attn_acc_init(&aq, pl->in.q, p->qkv_format);
    al_attn_acc_init(&ak, pl->in.k, p->qkv_format);
    al_attn_acc_init(&av, pl->in.v, p->qkv_format);
    al_attn_acc_init(&ao, out, p->qkv_format);
    al_attn_acc_init(&ado, dout, p->qkv_format);
    al_attn_acc_init(&adq, dq, p->qkv_format);
    al_attn_acc_init(&adk, dk, p->qkv_format);
    al_attn_acc_init(&adv, dv, p->qkv_format);
    const int BM = AL_ATTN_BM, BN = AL_ATTN_BN;
    int failed = 0;

#pragma omp parallel
    {
        const int tid = al_attn_thread();
        int64_t kvmax = SKV > 0 ? SKV : 1;
        REAL *Kc = malloc(sizeof(REAL) * (size_t)(kvmax * DQK));
        REAL *Vc = malloc(sizeof(REAL) * (size_t)(kvmax * DV));
        REAL *dKc = malloc(sizeof(REAL) * (size_t)(kvmax * DQK));
        REAL *dVc = malloc(sizeof(REAL) * (size_t)(kvmax * DV));
        REAL *Q = malloc(sizeof(REAL) * (size_t)(BM * DQK));
        REAL *dQ = malloc(sizeof(REAL) * (size_t)(BM * DQK));
        REAL *dO = malloc(sizeof(REAL) * (size_t)(BM * DV));
        REAL *P = malloc(sizeof(REAL) * (size_t)(BM * BN));
        REAL *PD = malloc(sizeof(REAL) * (size_t)(BM * BN));
        REAL *dP = malloc(sizeof(REAL) * (size_t)(BM * BN));
        REAL Dr[AL_ATTN_BM], L[AL_ATTN_BM];
        double *dbt = dbias_thr ? dbias_thr + (size_t)tid * (size_t)dbias_n : NULL;
        double *dot = doff_thr ? doff_thr + (size_t)tid * (size_t)H : NULL;
        double *am8 = f8 ? f8->amax_thr + (size_t)tid * 6 : NULL;
        if (!Kc || !Vc || !dKc || !dVc || !Q || !dQ || !dO || !P || !PD || !dP) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)   /* static: per-thread dbias sums are reproducible */
        for (int64_t task = 0; task < ntasks; task++) {
            if (failed) continue;
            const int64_t bb = task / HG, hk = task % HG;
            const int64_t kvrows = pl->kv_rows[bb], qrows = pl->q_rows[bb], diag = pl->diag[bb];
            for (int64_t j = 0; j < kvrows; j++) {
                int64_t ko = ak.off + bb * ak.s_b + (pl->kv_start[bb] + j) * ak.s_row + hk * ak.s_h;
                int64_t vo = av.off + bb * av.s_b + (pl->kv_start[bb] + j) * av.s_row + hk * av.s_h;
                const double kd8 = al_attn_f8_desc(f8, 1, bb, pl->kv_start[bb] + j), vd8 = al_attn_f8_desc(f8, 2, bb, pl->kv_start[bb] + j);
                for (int64_t d = 0; d < DQK; d++) Kc[j * DQK + d] = (REAL)(al_attn_ld(ak.base, ak.dtype, ko + d * ak.s_d) * kd8);
                for (int64_t d = 0; d < DV; d++) Vc[j * DV + d] = (REAL)(al_attn_ld(av.base, av.dtype, vo + d * av.s_d) * vd8);
            }
            memset(dKc, 0, sizeof(REAL) * (size_t)(kvrows * DQK));
            memset(dVc, 0, sizeof(REAL) * (size_t)(kvrows * DV));
            for (int64_t hh = hk * group; hh < (hk + 1) * group; hh++) {
                const float slope = alibi ? pl->alibi[bb * H + hh] : 0.0f;
                const REAL *lrow = lse + (bb * H + hh) * SQ;
                for (int64_t i0 = 0; i0 < qrows; i0 += BM) {
                    const int64_t bm = qrows - i0 < BM ? qrows - i0 : BM;
                    int any = 0;
                    for (int64_t r = 0; r < bm; r++) {
                        const int64_t i = i0 + r;
                        int64_t qo = aq.off + bb * aq.s_b + (pl->q_start[bb] + i) * aq.s_row + hh * aq.s_h;
                        int64_t oo = ao.off + bb * ao.s_b + (pl->q_start[bb] + i) * ao.s_row + hh * ao.s_h;
                        int64_t go = ado.off + bb * ado.s_b + (pl->q_start[bb] + i) * ado.s_row + hh * ado.s_h;
                        const double qd = al_attn_f8_desc(f8, 0, bb, pl->q_start[bb] + i);
                        for (int64_t d = 0; d < DQK; d++) Q[r * DQK + d] = (REAL)(al_attn_ld(aq.base, aq.dtype, qo + d * aq.s_d) * qd);
                        double acc = 0;
                        for (int64_t d = 0; d < DV; d++) {
                            double g = al_attn_ld(ado.base, ado.dtype, go + d * ado.s_d);
                            dO[r * DV + d] = (REAL)g;
                            acc += g * al_attn_ld(ao.base, ao.dtype, oo + d * ao.s_d);
                        }
                        int row_ok = !(pl->q_valid && !pl->q_valid[bb * SQ + i]) && lrow[i] != (REAL)-INFINITY;
                        Dr[r] = (REAL)acc;
                        L[r] = row_ok ? (REAL)lrow[i] : (REAL)INFINITY;   /* +inf: exp(s - L) = 0 */
                        any |= row_ok;
                        if (dot && row_ok) dot[hh] -= exp((double)pl->softmax_offset[hh] - (double)lrow[i]) * acc;
                    }
                    memset(dQ, 0, sizeof(REAL) * (size_t)(bm * DQK));
                    int64_t jlo, jhi;
                    al_attn_kv_range(pl, bb, i0, bm, &jlo, &jhi);
                    if (!any) jhi = jlo;
                    for (int64_t j0 = jlo; j0 < jhi; j0 += BN) {
                        const int64_t bn = jhi - j0 < BN ? jhi - j0 : BN;
                        GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)bm, (int)bn, (int)DQK, scale, Q, (int)DQK,
                             Kc + j0 * DQK, (int)DQK, (REAL)0, P, BN);
                        GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)bm, (int)bn, (int)DV, (REAL)1, dO, (int)DV,
                             Vc + j0 * DV, (int)DV, (REAL)0, dP, BN);
                        const int need_mask = al_attn_tile_needs_mask(pl, bb, i0, bm, j0, bn);
                        for (int64_t r = 0; r < bm; r++) {
                            REAL *s = P + r * BN, *pd = PD + r * BN, *g = dP + r * BN;
                            const int64_t i = i0 + r;
                            SCORES_ROW(pl, bb, hh, i, j0, bn, s, scale, pre, post, alibi, slope, diag, need_mask);
                            (void)EXPSUM(s, bn, L[r]);   /* P = exp(s - lse) */
                            if (f8 && f8->sS >= 0)       /* the S slot, exactly as the forward's P.V read it */
                                for (int64_t c = 0; c < bn; c++)
                                    s[c] = (REAL)al_attn_fq(f8->fwd, (double)s[c], f8->sS, f8->sS_inv);
                            if (dp > 0) {
                                uint64_t base = (uint64_t)(((bb * H + hh) * SQ + i) * SKV + j0);
                                for (int64_t c = 0; c < bn; c++) {
                                    REAL z = al_philox_keep(p->dropout_seed, p->dropout_offset, base + (uint64_t)c, keep_prob)
                                                 ? dscale : (REAL)0;
                                    pd[c] = s[c] * z;
                                    g[c] *= z;
                                }
                            } else {
                                memcpy(pd, s, sizeof(REAL) * (size_t)bn);
                            }
                            const REAL dr = Dr[r];
#pragma omp simd
                            for (int64_t c = 0; c < bn; c++) g[c] = s[c] * (g[c] - dr);   /* dS */
                            if (f8 && f8->sdP >= 0)      /* the dP slot: the score gradient feeding dQ, dK */
                                for (int64_t c = 0; c < bn; c++) {
                                    am8[AL_FP8_SLOT_DP] = al_attn_amax_upd(am8[AL_FP8_SLOT_DP], (double)g[c]);
                                    g[c] = (REAL)al_attn_fq(f8->bwd, (double)g[c], f8->sdP, f8->sdP_inv);
                                }
                            if (dbt) {
                                const double f = pre ? (double)scale : 1.0;
                                for (int64_t c = 0; c < bn; c++)
                                    dbt[al_attn_bias_index(pl, bb, hh, i, j0 + c)] += f * (double)g[c];
                            }
#pragma omp simd
                            for (int64_t c = 0; c < bn; c++) g[c] *= scale;
                        }
                        GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)bn, (int)DV, (int)bm, (REAL)1, PD, BN, dO,
                             (int)DV, (REAL)1, dVc + j0 * DV, (int)DV);
                        GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)bm, (int)DQK, (int)bn, (REAL)1, dP, BN,
                             Kc + j0 * DQK, (int)DQK, (REAL)1, dQ, (int)DQK);
                        GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)bn, (int)DQK, (int)bm, (REAL)1, dP, BN, Q,
                             (int)DQK, (REAL)1, dKc + j0 * DQK, (int)DQK);
                    }
                    for (int64_t r = 0; r < bm; r++) {
                        const int64_t i = i0 + r;
                        int64_t o = adq.off + bb * adq.s_b + (pl->q_start[bb] + i) * adq.s_row + hh * adq.s_h;
                        for (int64_t d = 0; d < DQK; d++) al_attn_st(adq.base, adq.dtype, o + d * adq.s_d, (double)dQ[r * DQK + d]);
                    }
                }
            }
            for (int64_t j = 0; j < kvrows; j++) {
                int64_t ko = adk.off + bb * adk.s_b + (pl->kv_start[bb] + j) * adk.s_row + hk * adk.s_h;
                int64_t vo = adv.off + bb * adv.s_b + (pl->kv_start[bb] + j) * adv.s_row + hk * adv.s_h;
                for (int64_t d = 0; d < DQK; d++) al_attn_st(adk.base, adk.dtype, ko + d * adk.s_d, (double)dKc[j * DQK + d]);
                for (int64_t d = 0; d < DV; d++) al_attn_st(adv.base, adv.dtype, vo + d * adv.s_d, (double)dVc[j * DV + d]);
            }
        }
        free(Kc); free(Vc); free(dKc); free(dVc); free(Q); free(dQ); free(dO); free(P); free(PD); free(dP);
    }
    if (failed) return al_error(AL_ERR_OOM, "attention_backward (cpu): out of memory for the per-thread tiles");
    return AL_OK;
}

#undef BWD_FN
#undef SCORES_ROW
#undef SCORES_CAT
#undef SCORES_CAT2
#undef BWD_CAT
#undef BWD_CAT2
