/* experiment.h: Experiments A and B of SPECTRA section 5.7, reproduced on
 * seeded synthetic matrices, with Proposition 3's prediction computed here
 * rather than copied from the paper.
 *
 * A (gaussian): W 2048 x 2048, N(0, 1), quantized Group-32 4-bit (MINMAX,
 * and MSE for comparison); relative Frobenius error, SNR, cosine, the
 * Proposition 2 ratio. Prediction: with d the range of 32 N(0,1) samples,
 * s = d / 15 and an error uniform on [-s/2, s/2] per weight,
 *     rel^2 = E[sum e^2] / E[sum w^2] = E[s^2] / 12 = E[d^2] / (225 * 12),
 * so rel = sqrt(E[d^2]) / (15 sqrt 12). The paper uses E[d]^2 in place of
 * E[d^2] (= E[d]^2 + Var d), which under-predicts (Jensen): both are
 * reported. E[d] and E[d^2] are computed by quadrature of
 * P(d > r) = 1 - n int phi(x) (Phi(x + r) - Phi(x))^(n-1) dx and checked by
 * Monte Carlo.
 *
 * B (heavy-channel): W 1536 x 1536, N(0, 1), with round(1% * 1536) = 15
 * input channels (seeded choice) scaled by m in {1, 4, 8, 16, 32, 64};
 * per-row 4-bit (one group = the whole row), Group-32, and Group-32 with
 * outlier channels chosen by the adaptive rule (saliency with gamma = 1).
 * The relative error is reported over the whole matrix (whose norm grows
 * with m, so errors confined to the light columns shrink) and over the
 * non-heavy columns alone.
 *
 * The matrix is a function of the seed only (each row has its own
 * splitmix64 stream; normals by Box-Muller in double), not of the thread
 * count. Cost: ~0.6 s (A) and ~1.5 s (B) of CPU time, split over the
 * pool's threads. */
#ifndef SPX_EXPERIMENT_H
#define SPX_EXPERIMENT_H

#include "core/err.h"
#include "quant/metrics.h"
#include <stdint.h>

/* splitmix64 step and a standard normal from it (Box-Muller, double). */
uint64_t spx_exp_splitmix64(uint64_t *state);
double spx_exp_normal(uint64_t *state);
/* Row r of the experiments' N(0,1) matrix for this seed: out[cols]. */
void spx_exp_gauss_row(uint64_t seed, int64_t r, int64_t cols, float *out);

/* Moments of the range d of n standard normal samples: quadrature (exact
 * to ~1e-9) and Monte Carlo over mc_groups groups from the seed. */
typedef struct spx_range_moments {
    int n;
    double e_d, e_d2;       /* quadrature */
    double mc_e_d, mc_e_d2; /* Monte Carlo */
    int64_t mc_groups;
} spx_range_moments;
void spx_exp_range_moments(int n, int64_t mc_groups, uint64_t seed, spx_range_moments *out);

typedef struct spx_exp_gauss_result {
    uint64_t seed;
    int64_t rows, cols;
    int bits, group;
    spx_qreport minmax, mse;   /* measured */
    spx_range_moments range;   /* of `group` N(0,1) samples */
    double pred_rel_paper;     /* E[d] / ((2^b - 1) sqrt 12): the paper's formula */
    double pred_rel;           /* sqrt(E[d^2]) / ((2^b - 1) sqrt 12) */
    double pred_snr_db;        /* -20 log10(pred_rel) */
    double pred_cosine;        /* 1 / sqrt(1 + pred_rel^2): error ~ independent of W */
} spx_exp_gauss_result;

/* Experiment A with a given shape (the paper: 2048 x 2048, 4 bits, G32). */
spx_status spx_exp_gaussian_run(uint64_t seed, int64_t rows, int64_t cols, int bits, int group,
                                int n_threads, spx_exp_gauss_result *out, spx_err *e);
static inline spx_status spx_exp_gaussian(uint64_t seed, int n_threads, spx_exp_gauss_result *out,
                                          spx_err *e) {
    return spx_exp_gaussian_run(seed, 2048, 2048, 4, 32, n_threads, out, e);
}

#define SPX_EXP_HEAVY_NM 6
typedef struct spx_exp_heavy_result {
    uint64_t seed;
    int64_t rows, cols, n_heavy;
    int32_t heavy_idx[64];                   /* the scaled channels, sorted */
    double m[SPX_EXP_HEAVY_NM];              /* 1, 4, 8, 16, 32, 64 */
    double rel_row[SPX_EXP_HEAVY_NM];        /* per-row 4-bit */
    double rel_g32[SPX_EXP_HEAVY_NM];        /* Group-32 */
    double rel_g32_out[SPX_EXP_HEAVY_NM];    /* Group-32 + adaptive outliers */
    double rel_g32_out_mse[SPX_EXP_HEAVY_NM];/* the same with SPX_Q_MSE */
    /* The same four errors over the non-heavy columns only (error and norm
     * both restricted to them): what a heavy channel does to the rest. */
    double light_row[SPX_EXP_HEAVY_NM], light_g32[SPX_EXP_HEAVY_NM];
    double light_g32_out[SPX_EXP_HEAVY_NM], light_g32_out_mse[SPX_EXP_HEAVY_NM];
    double kappa[SPX_EXP_HEAVY_NM];          /* saliency kurtosis */
    double ratio[SPX_EXP_HEAVY_NM];          /* adaptive r */
    int64_t n_out[SPX_EXP_HEAVY_NM];         /* outlier channels kept */
    int64_t heavy_caught[SPX_EXP_HEAVY_NM];  /* of them, scaled channels */
} spx_exp_heavy_result;

spx_status spx_exp_heavy_channel(uint64_t seed, int n_threads, spx_exp_heavy_result *out,
                                 spx_err *e);

#endif
