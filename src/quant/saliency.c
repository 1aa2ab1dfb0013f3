/* saliency.c: column-norm saliency, kurtosis, the adaptive outlier ratio
 * and top-k channel selection (definitions in saliency.h). */
#include "quant/saliency.h"

#include <math.h>
#include <stdlib.h>

void spx_colnorm_accum(double *acc, const float *row, int64_t cols) {
    for (int64_t j = 0; j < cols; j++) acc[j] += (double)row[j] * (double)row[j];
}

void spx_saliency_finish(const double *acc, const float *gamma, int64_t cols, float *S) {
    for (int64_t j = 0; j < cols; j++) {
        double g = gamma ? fabs((double)gamma[j]) : 1.0;
        S[j] = (float)(g * sqrt(acc[j]));
    }
}

spx_status spx_saliency(const float *W, int64_t rows, int64_t cols, const float *gamma, float *S,
                        spx_err *e) {
    if (rows < 0 || cols <= 0)
        return spx_fail(e, SPX_ERR_ARG, "saliency: bad shape [%lld, %lld]", (long long)rows,
                        (long long)cols);
    double *acc = calloc((size_t)cols, sizeof *acc);
    if (!acc) return spx_fail(e, SPX_ERR_NOMEM, "saliency: out of memory (%lld columns)", (long long)cols);
    for (int64_t r = 0; r < rows; r++) spx_colnorm_accum(acc, W + r * cols, cols);
    spx_saliency_finish(acc, gamma, cols, S);
    free(acc);
    return SPX_OK;
}

double spx_kurtosis(const float *S, int64_t K) {
    if (K < 1) return 0;
    double mu = 0;
    for (int64_t j = 0; j < K; j++) mu += S[j];
    mu /= (double)K;
    double m2 = 0, m4 = 0;
    for (int64_t j = 0; j < K; j++) {
        double d = S[j] - mu, d2 = d * d;
        m2 += d2;
        m4 += d2 * d2;
    }
    m2 /= (double)K;
    m4 /= (double)K;
    if (!(m2 > 0)) return 0;
    return m4 / (m2 * m2);
}

double spx_outlier_ratio_auto(double kappa) {
    double ex = kappa - 3.0;
    if (!(ex > 0)) ex = 0; /* also NaN */
    double r = SPX_OUTLIER_R_BASE * (1.0 + 0.15 * log1p(ex));
    if (r < SPX_OUTLIER_R_MIN) r = SPX_OUTLIER_R_MIN;
    if (r > SPX_OUTLIER_R_MAX) r = SPX_OUTLIER_R_MAX;
    return r;
}

int64_t spx_outlier_count(int64_t K, double ratio) {
    if (K <= 0 || !(ratio > 0)) return 0;
    double c = floor(ratio * (double)K + 0.5);
    if (c >= (double)K) return K;
    return (int64_t)c;
}

/* Order: larger S first, NaN before everything, then lower index. */
static int more_salient(const float *S, int32_t a, int32_t b) {
    float x = S[a], y = S[b];
    int xn = x != x, yn = y != y;
    if (xn != yn) return xn;
    if (!xn && x != y) return x > y;
    return a < b;
}

/* Heap sift-down of a min-heap by saliency order (root = least salient of
 * the kept set). */
static void sift_down(const float *S, int32_t *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && more_salient(S, h[m], h[l])) m = l;
        if (r < n && more_salient(S, h[m], h[r])) m = r;
        if (m == i) return;
        int32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

spx_status spx_outlier_select(const float *S, int64_t K, int64_t count, int32_t *idx,
                              spx_err *e) {
    if (K < 0 || K > INT32_MAX || count < 0 || count > K)
        return spx_fail(e, SPX_ERR_ARG, "outlier selection: %lld of %lld channels", (long long)count,
                        (long long)K);
    if (count == 0) return SPX_OK;
    /* Keep the `count` most salient in a heap whose root is the weakest
     * kept one: O(K log count), no allocation beyond idx. */
    for (int64_t j = 0; j < count; j++) idx[j] = (int32_t)j;
    for (int64_t i = count / 2 - 1; i >= 0; i--) sift_down(S, idx, count, i);
    for (int64_t j = count; j < K; j++) {
        if (more_salient(S, (int32_t)j, idx[0])) {
            idx[0] = (int32_t)j;
            sift_down(S, idx, count, 0);
        }
    }
    qsort(idx, (size_t)count, sizeof *idx, cmp_i32);
    return SPX_OK;
}

spx_status spx_outliers_choose(const float *S, int64_t K, int mode, double ratio, int32_t *idx,
                               int64_t *n_out, double *kappa_out, spx_err *e) {
    *n_out = 0;
    double kappa = spx_kurtosis(S, K);
    if (kappa_out) *kappa_out = kappa;
    int64_t count;
    switch (mode) {
    case SPX_OUTLIERS_OFF: return SPX_OK;
    case SPX_OUTLIERS_AUTO: count = spx_outlier_count(K, spx_outlier_ratio_auto(kappa)); break;
    case SPX_OUTLIERS_FIXED:
        if (!(ratio >= 0 && ratio <= 1))
            return spx_fail(e, SPX_ERR_ARG, "outlier ratio %g: expected a number in [0, 1]", ratio);
        count = spx_outlier_count(K, ratio);
        break;
    default: return spx_fail(e, SPX_ERR_ARG, "outlier mode %d: expected off, auto or fixed", mode);
    }
    SPX_TRY(spx_outlier_select(S, K, count, idx, e));
    *n_out = count;
    return SPX_OK;
}
