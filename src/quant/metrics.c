/* metrics.c: streaming error metrics of a quantized matrix (metrics.h). */
#include "quant/metrics.h"
#include "core/half.h"
#include "quant/g32.h"

#include <math.h>

void spx_qmetrics_init(spx_qmetrics *m) {
    *m = (spx_qmetrics){0};
    m->max_prop2_excess = -INFINITY;
    m->worst_row = m->worst_col = -1;
}

void spx_qmetrics_add_dense(spx_qmetrics *m, const float *w, const float *w_hat, int64_t n) {
    double w2 = 0, e2 = 0, h2 = 0, wh = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = w[i], b = w_hat[i], d = a - b;
        w2 += a * a;
        e2 += d * d;
        h2 += b * b;
        wh += a * b;
    }
    m->sum_w2 += w2;
    m->sum_e2 += e2;
    m->sum_h2 += h2;
    m->sum_wh += wh;
    m->n += n;
}

void spx_qmetrics_add_row(spx_qmetrics *m, const spx_qtensor *q, int64_t row, const float *w,
                          float *scratch) {
    spx_q_dequant_row_f32(q, row, scratch);
    spx_qmetrics_add_dense(m, w, scratch, q->cols);
    int64_t j = 0; /* next outlier index position (sorted) */
    for (int64_t g = 0; g < q->cols / q->group; g++) {
        int64_t c0 = g * q->group, c1 = c0 + q->group;
        /* Non-outlier min/max of the group. */
        int64_t j0 = j;
        float wmin = 0, wmax = 0;
        int any = 0;
        for (int64_t c = c0; c < c1; c++) {
            if (j < q->n_outliers && q->outlier_idx[j] == c) {
                j++;
                continue;
            }
            if (!any) wmin = wmax = w[c], any = 1;
            else if (w[c] < wmin) wmin = w[c];
            else if (w[c] > wmax) wmax = w[c];
        }
        m->n_groups++;
        if (!any || !(wmin <= 0 && wmax >= 0)) continue;
        m->n_groups_span++;
        uint16_t sh = spx_q_group_scale(q, row, g);
        double s = spx_f16_to_f32(sh);
        double bound = 0.5 + spx_q_prop2_slack(q->bits, spx_q_scale32(wmin, wmax, q->bits), sh);
        int64_t jj = j0;
        for (int64_t c = c0; c < c1; c++) {
            if (jj < q->n_outliers && q->outlier_idx[jj] == c) {
                jj++;
                continue;
            }
            double r = fabs((double)w[c] - (double)scratch[c]) / s;
            if (r > m->max_err_over_s || m->worst_row < 0) {
                m->max_err_over_s = r;
                m->worst_row = row;
                m->worst_col = c;
            }
            if (r - bound > m->max_prop2_excess) m->max_prop2_excess = r - bound;
        }
    }
}

void spx_qmetrics_merge(spx_qmetrics *dst, const spx_qmetrics *src) {
    dst->sum_w2 += src->sum_w2;
    dst->sum_e2 += src->sum_e2;
    dst->sum_h2 += src->sum_h2;
    dst->sum_wh += src->sum_wh;
    dst->n += src->n;
    dst->n_groups += src->n_groups;
    dst->n_groups_span += src->n_groups_span;
    if (src->worst_row >= 0 && (dst->worst_row < 0 || src->max_err_over_s > dst->max_err_over_s)) {
        dst->max_err_over_s = src->max_err_over_s;
        dst->worst_row = src->worst_row;
        dst->worst_col = src->worst_col;
    }
    if (src->max_prop2_excess > dst->max_prop2_excess) dst->max_prop2_excess = src->max_prop2_excess;
}

void spx_qmetrics_report(const spx_qmetrics *m, spx_qreport *r) {
    r->rel_err = m->sum_w2 > 0 ? sqrt(m->sum_e2 / m->sum_w2) : (m->sum_e2 > 0 ? INFINITY : 0.0);
    r->snr_db = m->sum_e2 > 0 ? 10.0 * log10(m->sum_w2 / m->sum_e2) : INFINITY;
    r->cosine = m->sum_w2 > 0 && m->sum_h2 > 0 ? m->sum_wh / sqrt(m->sum_w2 * m->sum_h2) : 0.0;
    r->max_err_over_s = m->max_err_over_s;
    r->max_prop2_excess = m->max_prop2_excess;
    r->n_groups = m->n_groups;
    r->n_groups_span = m->n_groups_span;
}
