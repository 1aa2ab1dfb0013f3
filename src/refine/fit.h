/* fit.h: refinement fitting (StrataFlux, ../shared/spec/strataflux-paper.txt
 * section 3.2.1, equations 3-4): refinement columns C fitted to the
 * activations of a calibration text so that the k selected columns also
 * make up for the channels a decode step leaves out, instead of C = R.
 *
 * Problem. For one projection with residual R = W - W^ [rows, cols] (as
 * refine.h defines it) and z(x) = x with every channel zeroed except the
 * ones spx_refine_topk(x, cols, SPX_REFINE_CHUNK, k, skip) selects (k per
 * chunk of 1,024, the base's outlier channels skipped when k < a chunk:
 * exactly the engine's selection, cpu/ops.c refine_prepare), minimize
 *     f(C) = E_x ||R x - C z(x)||^2 + lambda ||C - R||_F^2          (eq. 3)
 * Gradient: dF/dC = -2 E[(R x - C z) z^T] + 2 lambda (C - R)
 *                 = -2 (R G - C M) + 2 lambda (C - R),
 * with G = E[x z^T] and M = E[z z^T] (both [cols, cols], both depending
 * on k). Setting it to zero:
 *     C (M + lambda I) = R (G + lambda I) = R G + lambda R          (eq. 4)
 * M is positive semi-definite, so for lambda > 0, A = M + lambda I is
 * symmetric positive definite and f strictly convex: the C solving eq. 4
 * is its unique minimizer. Row by row (A is symmetric):
 *     A c_r = G^T r_r + lambda r_r      (c_r, r_r: row r of C, R as columns)
 * solved with one Cholesky factorization A = L L^T per projection input
 * (q/k/v share theirs) and two triangular solves per row.
 * lambda: the mean diagonal of M (the paper's default), which makes the
 * penalty as strong as the average selected channel's energy: scale-free
 * (x -> a x scales M, G and lambda by a^2 and leaves C unchanged).
 * Limits of lambda: -> 0 gives the least-squares C M = R G (when M is
 * invertible: every channel selected at least once, and independent);
 * -> infinity gives C = R. Channels never selected (outliers, dead
 * channels) have G[:, j] = M[j, :] = 0, so c_rj = r_rj: their column stays
 * the residual. k >= the chunk gives z = x, G = M and C = R.
 *
 * Statistics: sums in double over the tokens, divided by their count only
 * when solving; gt[j][i] = sum z_j x_i (G transposed, row j contiguous,
 * so a token adds x_j * x to the rows of its selected channels j) and the
 * lower triangle of M (m[j][p], p <= j). Memory: 2 cols^2 doubles per
 * projection input (16 cols^2 bytes: 4 MiB at 512 wide, 36 MiB at 1,536,
 * 1 GiB at 8,192), plus one factor of the same size while solving.
 * Cost: a token adds n_sel * cols multiply-adds to gt and n_sel^2 / 2 to M;
 * the factorization is cols^3 / 6, the right-hand sides rows * cols^2 and
 * the solves rows * cols^2, all in double on the thread pool.
 *
 * Numbers: the statistics' order of accumulation is fixed per thread
 * count (each thread owns whole rows j); results in double, C rounded to
 * float at the end. No LAPACK: the blocked Cholesky here runs at memory
 * bandwidth for the widths of a small model and within minutes at 8,192. */
#ifndef SPX_REFINE_FIT_H
#define SPX_REFINE_FIT_H

#include "core/err.h"
#include "core/pool.h"
#include <stdint.h>

/* Statistics of one projection input. */
typedef struct spx_refine_fit_stats {
    int64_t cols, k;
    double *gt;      /* [cols][cols]: gt[j][i] = sum over tokens of z_j x_i */
    double *m;       /* [cols][cols]: m[j][p] = sum z_j z_p for p <= j (the upper part unused) */
    int64_t n;       /* tokens added */
    uint8_t *skip;   /* [cols] channels never selected (copied), or NULL */
    int32_t *sel;    /* scratch: per token the selection */
    int64_t *nsel;
    double *xd;      /* scratch: tokens in double */
    int64_t scratch_tokens;
} spx_refine_fit_stats;

/* Bytes spx_refine_fit_stats_init allocates for cols (its two matrices). */
uint64_t spx_refine_fit_stats_bytes(int64_t cols);
/* cols >= 1, k >= 1 channels per chunk; skip: NULL or cols flags (non-zero:
 * never selected; used only when k < SPX_REFINE_CHUNK, as the engine
 * does). SPX_ERR_NOMEM names the bytes. */
spx_status spx_refine_fit_stats_init(spx_refine_fit_stats *s, int64_t cols, int64_t k, const uint8_t *skip,
                                     spx_err *e);
void spx_refine_fit_stats_free(spx_refine_fit_stats *s);
/* Adds the T tokens x[T, cols] (finite) on the pool (NULL: this thread). */
spx_status spx_refine_fit_stats_add(spx_refine_fit_stats *s, spx_pool *pool, const float *x, int64_t T,
                                    spx_err *e);

/* The factor of A = M / n + lambda I for one projection input. */
typedef struct spx_refine_fit_solver {
    int64_t cols;
    double lambda; /* the one used */
    double *l;     /* [cols][cols]: L (lower triangle, row-major) */
} spx_refine_fit_solver;

/* lambda < 0: the default rule, the mean diagonal of M / n; else that
 * value. SPX_ERR_ARG when no token was added or lambda (the rule's) is 0
 * or not finite ("the activations are all zero"); SPX_ERR_NOMEM. */
spx_status spx_refine_fit_factor(const spx_refine_fit_stats *s, double lambda, spx_pool *pool,
                                 spx_refine_fit_solver *out, spx_err *e);
void spx_refine_fit_solver_free(spx_refine_fit_solver *f);
/* The fitted C[rows, cols] (row-major float) for the residual R[rows,
 * cols] (row-major) of a matrix fed by s's input: eq. 4. SPX_ERR_NOMEM. */
spx_status spx_refine_fit_solve(const spx_refine_fit_solver *f, const spx_refine_fit_stats *s, spx_pool *pool,
                                const float *R, int64_t rows, float *C, spx_err *e);

/* Cholesky primitives (exposed for tests). a[n][n] row-major symmetric:
 * its lower triangle is replaced by L with A = L L^T (the upper part is
 * not read or written). SPX_ERR_ARG when A is not positive definite (the
 * message names the pivot). */
spx_status spx_chol_factor(double *a, int64_t n, spx_pool *pool, spx_err *e);
/* b[nrhs][n]: each row replaced by A^-1 times it, given A's factor l. */
void spx_chol_solve_rows(const double *l, int64_t n, double *b, int64_t nrhs);

#endif
