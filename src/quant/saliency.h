/* saliency.h: calibration-free channel saliency and the outlier channel
 * choice of SPECTRA (sections 3.1-3.3).
 *
 * For W [rows, cols] = [out_features, in_features] and the gain gamma of the
 * normalisation feeding it (NULL where none precedes it: gamma_j = 1):
 *
 *   S_j   = |gamma_j| * ||W[:, j]||_2                        (input channel j)
 *   kappa = E[(S - mu)^4] / sigma^4   over the K = cols values (population
 *           moments, NOT excess; 0 when sigma = 0: no tail to protect)
 *   r     = clamp(0.01 * (1 + 0.15 * ln(1 + max(0, kappa - 3))), 0.005, 0.03)
 *   count = spx_outlier_count(K, r) = floor(r * K + 1/2)  (round half up,
 *           in double; clamped to [0, K])
 *   idx   = the `count` largest S_j, ties to the lower index, returned
 *           sorted ascending (int32, as stored).
 *
 * Note (Proposition 1): kappa <= K, but the bound is not attained: the
 * largest population kurtosis of K values is K - 2 + 1/(K - 1) (one value
 * apart from K - 1 equal ones), so the paper's "tight" claim is off by 2.
 * The 0.005 floor never binds (r >= 0.01 from the formula).
 *
 * Streaming: the compressor converts one row at a time, so column norms
 * are accumulated row by row into double sums of squares
 * (spx_colnorm_accum) and finished into S (spx_saliency_finish). NaN
 * saliency (non-finite weights) sorts as the largest. */
#ifndef SPX_SALIENCY_H
#define SPX_SALIENCY_H

#include "core/err.h"
#include <stdint.h>

#define SPX_OUTLIER_R_BASE 0.01
#define SPX_OUTLIER_R_MIN 0.005
#define SPX_OUTLIER_R_MAX 0.03

typedef enum spx_outlier_mode {
    SPX_OUTLIERS_OFF = 0,   /* no outlier channels */
    SPX_OUTLIERS_AUTO = 1,  /* kurtosis-adaptive ratio (the rule above) */
    SPX_OUTLIERS_FIXED = 2  /* a given ratio in [0, 1] */
} spx_outlier_mode;

/* acc[j] += row[j]^2 for j < cols (acc: double[cols], zeroed by the caller). */
void spx_colnorm_accum(double *acc, const float *row, int64_t cols);
/* S[j] = |gamma[j]| * sqrt(acc[j]) (gamma NULL: 1). */
void spx_saliency_finish(const double *acc, const float *gamma, int64_t cols, float *S);
/* Whole-matrix convenience: S[cols] from W[rows, cols] (allocates cols
 * doubles). */
spx_status spx_saliency(const float *W, int64_t rows, int64_t cols, const float *gamma, float *S,
                        spx_err *e);

/* Population kurtosis of S[K] (two passes, double); 0 if K < 1 or sigma = 0. */
double spx_kurtosis(const float *S, int64_t K);
/* The adaptive ratio r(kappa) above. */
double spx_outlier_ratio_auto(double kappa);
/* floor(ratio * K + 0.5), clamped to [0, K]; 0 for ratio <= 0 or NaN. */
int64_t spx_outlier_count(int64_t K, double ratio);
/* The `count` most salient channels into idx[count], sorted ascending
 * (ties: lower index wins). O(K log count); no allocation. */
spx_status spx_outlier_select(const float *S, int64_t K, int64_t count, int32_t *idx,
                              spx_err *e);

/* Mode dispatch: idx must hold up to spx_outlier_count(K, 0.03) entries for
 * AUTO, spx_outlier_count(K, ratio) for FIXED (or just K). Writes the count
 * to *n_out and, if kappa_out, the kurtosis (computed for every mode). */
spx_status spx_outliers_choose(const float *S, int64_t K, int mode, double ratio, int32_t *idx,
                               int64_t *n_out, double *kappa_out, spx_err *e);

#endif
