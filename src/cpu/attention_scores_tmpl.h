/*
 * cpu/attention_scores_tmpl.h — one row of a key tile turned from scale * q.k into the scores the softmax
 * sees, shared by the CPU forward and backward templates (attention_fwd_tmpl.h, attention_bwd_tmpl.h), so
 * the backward recomputes exactly the forward's P: + the bias (times scale for pre_scale_bias: scale (qk + B)
 * = scale qk + scale B), - ALiBi's slope * |kv - q - diag|, and -inf where the mask drops an element (a band's
 * two ends as ranges, any other mask element by element). Instantiated per REAL / SUF like its includers.
 */
#define SCORES_CAT2(a, b) a##b
#define SCORES_CAT(a, b) SCORES_CAT2(a, b)
#define SCORES_ROW SCORES_CAT(al_attn_scores_row_, SUF)

/* s: the bn scores of query row i against keys j0 .. j0 + bn - 1 of batch bb, query head hh */
static inline void SCORES_ROW(const al_attn_plan *pl, int64_t bb, int64_t hh, int64_t i, int64_t j0, int64_t bn,
                              REAL *s, REAL scale, int pre, int post, int alibi, float slope, int64_t diag,
                              int need_mask) {
    if (pre || post) {
        const REAL f = pre ? scale : (REAL)1;
        for (int64_t c = 0; c < bn; c++) s[c] += f * (REAL)al_attn_bias_at(pl, bb, hh, i, j0 + c);
    }
    if (alibi)
        for (int64_t c = 0; c < bn; c++) {
            int64_t dist = j0 + c - i - diag;
            s[c] -= (REAL)slope * (REAL)(dist < 0 ? -dist : dist);
        }
    if (need_mask) {
        int64_t wlo, whi;
        if (al_attn_row_window(pl, bb, i, j0, bn, &wlo, &whi)) {
            for (int64_t c = 0; c < wlo; c++) s[c] = (REAL)-INFINITY;
            for (int64_t c = whi; c < bn; c++) s[c] = (REAL)-INFINITY;
        } else {
            for (int64_t c = 0; c < bn; c++)
                if (al_attn_masked(pl, bb, hh, i, j0 + c)) s[c] = (REAL)-INFINITY;
        }
    }
}
/* (SCORES_ROW, SCORES_CAT and SCORES_CAT2 are #undef'd at the end of the including template) */
