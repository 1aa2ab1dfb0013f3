/* metrics.h: how far a quantized matrix is from the original, measured
 * streaming row by row with double accumulators (a matrix is never held
 * dequantized whole).
 *
 *   rel_err = ||W - W^||_F / ||W||_F
 *   snr_db  = 20 log10(||W||_F / ||W - W^||_F)      (+inf when exact)
 *   cosine  = <W, W^> / (||W||_F ||W^||_F)
 *   Proposition 2 check: over the non-outlier entries of groups that span
 *   zero (wmin <= 0 <= wmax over the group's non-outlier entries), the
 *   largest |w - w^| / s (s the stored fp16 scale), and the largest excess
 *   over the exact bound 1/2 + spx_q_prop2_slack() of the entry's group
 *   (<= 0 means Proposition 2 holds). The bound is derived for the MINMAX
 *   rule; a tensor quantized with SPX_Q_MSE clips on purpose and may
 *   exceed it.
 *
 * Accumulators from different threads (different rows) merge exactly
 * (sums and maxima), so the result does not depend on how rows were split
 * except for the order of double additions. */
#ifndef SPX_QMETRICS_H
#define SPX_QMETRICS_H

#include "quant/qtensor.h"
#include <stdint.h>

typedef struct spx_qmetrics {
    double sum_w2, sum_e2, sum_h2, sum_wh; /* ||W||^2, ||W-W^||^2, ||W^||^2, <W, W^> */
    int64_t n;                             /* entries seen */
    int64_t n_groups, n_groups_span;       /* groups seen (add_row), of them spanning zero */
    double max_err_over_s;                 /* Proposition 2 ratio, 0 if no spanning group */
    double max_prop2_excess;               /* max(err/s - 1/2 - slack); -inf if none */
    int64_t worst_row, worst_col;          /* where max_err_over_s was seen (-1: none) */
} spx_qmetrics;

typedef struct spx_qreport {
    double rel_err, snr_db, cosine;
    double max_err_over_s, max_prop2_excess;
    int64_t n_groups, n_groups_span;
} spx_qreport;

void spx_qmetrics_init(spx_qmetrics *m);
/* Sums only (no group structure): w[n] against w_hat[n]. */
void spx_qmetrics_add_dense(spx_qmetrics *m, const float *w, const float *w_hat, int64_t n);
/* Row `row` of q against the original w[q->cols]; scratch[q->cols] is the
 * caller's (one per thread). Includes the outlier columns' fp16 values. */
void spx_qmetrics_add_row(spx_qmetrics *m, const spx_qtensor *q, int64_t row, const float *w,
                          float *scratch);
void spx_qmetrics_merge(spx_qmetrics *dst, const spx_qmetrics *src);
void spx_qmetrics_report(const spx_qmetrics *m, spx_qreport *r);

#endif
