/* fit.c: refinement fitting's statistics and solver (fit.h): the
 * accumulation of G^T and M, a blocked Cholesky factorization and the
 * row-by-row solve of eq. 4, all in double on the thread pool. */
#include "refine/fit.h"
#include "refine/refine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CHOL_NB 64   /* Cholesky block: a panel row is 512 bytes, a 64 x 64 tile 32 KiB */
#define SOLVE_RB 4   /* right-hand sides solved together (each pass over L and G serves 4) */

/* spx_pool_run, or the function on this thread alone when pool is NULL. */
static void run(spx_pool *pool, spx_pool_fn fn, void *arg) {
    if (pool) spx_pool_run(pool, fn, arg);
    else fn(arg, 0, 1);
}

/* Built plain and for AVX2 and chosen by the loader from the CPU (as
 * cpu/ops.c spx_cpu_dot): explicit lanes, so both clones add in the same
 * order and give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FIT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FIT_CLONES
#endif

FIT_CLONES static double dotd(const double *restrict a, const double *restrict b, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    double s = 0;
    for (; i < n; i++) s += a[i] * b[i];
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* y[n] += a x[n] */
FIT_CLONES static void axpyd(double *restrict y, double a, const double *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* ---- statistics ---------------------------------------------------------- */

uint64_t spx_refine_fit_stats_bytes(int64_t cols) { return 2 * (uint64_t)cols * (uint64_t)cols * sizeof(double); }

spx_status spx_refine_fit_stats_init(spx_refine_fit_stats *s, int64_t cols, int64_t k, const uint8_t *skip,
                                     spx_err *e) {
    memset(s, 0, sizeof *s);
    if (cols < 1 || cols > INT32_MAX || k < 1)
        return spx_fail(e, SPX_ERR_ARG, "refinement fit: %lld columns, k %lld (expected cols >= 1, k >= 1)",
                        (long long)cols, (long long)k);
    const size_t n2 = (size_t)cols * (size_t)cols;
    s->cols = cols;
    s->k = k;
    s->gt = calloc(n2, sizeof(double));
    s->m = calloc(n2, sizeof(double));
    if (skip && (s->skip = malloc((size_t)cols))) memcpy(s->skip, skip, (size_t)cols);
    if (!s->gt || !s->m || (skip && !s->skip)) {
        spx_refine_fit_stats_free(s);
        return spx_fail(e, SPX_ERR_NOMEM, "refinement fit: out of memory for the statistics of a %lld-wide input "
                        "(%.1f MiB)", (long long)cols, (double)spx_refine_fit_stats_bytes(cols) / 1048576.0);
    }
    return SPX_OK;
}

void spx_refine_fit_stats_free(spx_refine_fit_stats *s) {
    free(s->gt);
    free(s->m);
    free(s->skip);
    free(s->sel);
    free(s->nsel);
    free(s->xd);
    memset(s, 0, sizeof *s);
}

typedef struct {
    spx_refine_fit_stats *s;
    int64_t T, cap;
} add_job;

/* Thread tid owns rows [j0, j1) of gt and m: every token's selected
 * channels in that range add x_j * x (gt) and x_j * x_p, p <= j (m). */
static void add_task(void *arg, int tid, int nth) {
    const add_job *a = arg;
    spx_refine_fit_stats *s = a->s;
    const int64_t C = s->cols;
    int64_t j0, j1;
    spx_pool_range(C, tid, nth, 8, &j0, &j1);
    for (int64_t t = 0; t < a->T; t++) {
        const int32_t *sel = s->sel + t * a->cap;
        const double *x = s->xd + t * C;
        const int64_t ns = s->nsel[t];
        for (int64_t q = 0; q < ns; q++) {
            const int64_t j = sel[q];
            if (j < j0 || j >= j1) continue;
            const double xj = x[j];
            double *g = s->gt + j * C, *m = s->m + j * C;
            axpyd(g, xj, x, C);
            for (int64_t p = 0; p <= q; p++) m[sel[p]] += xj * x[sel[p]]; /* sel ascending: sel[p] <= j */
        }
    }
}

spx_status spx_refine_fit_stats_add(spx_refine_fit_stats *s, spx_pool *pool, const float *x, int64_t T,
                                    spx_err *e) {
    if (T <= 0) return SPX_OK;
    const int64_t C = s->cols, cap = spx_refine_topk_max(C, SPX_REFINE_CHUNK, s->k);
    if (T > s->scratch_tokens) {
        free(s->sel);
        free(s->nsel);
        free(s->xd);
        s->sel = malloc((size_t)(T * cap) * sizeof *s->sel);
        s->nsel = malloc((size_t)T * sizeof *s->nsel);
        s->xd = malloc((size_t)(T * C) * sizeof *s->xd);
        s->scratch_tokens = s->sel && s->nsel && s->xd ? T : 0;
        if (!s->scratch_tokens)
            return spx_fail(e, SPX_ERR_NOMEM, "refinement fit: out of memory for %lld tokens of %lld channels",
                            (long long)T, (long long)C);
    }
    /* the engine skips the outlier channels only under a whole chunk */
    const uint8_t *skip = s->k < SPX_REFINE_CHUNK ? s->skip : NULL;
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * C;
        for (int64_t i = 0; i < C; i++) {
            if (!isfinite(xt[i]))
                return spx_fail(e, SPX_ERR_ARG, "refinement fit: activation %lld of a token is not finite",
                                (long long)i);
            s->xd[t * C + i] = xt[i];
        }
        s->nsel[t] = spx_refine_topk(xt, C, SPX_REFINE_CHUNK, s->k, skip, s->sel + t * cap);
    }
    add_job a = {s, T, cap};
    run(pool, add_task, &a);
    s->n += T;
    return SPX_OK;
}

/* ---- Cholesky ------------------------------------------------------------ */

typedef struct {
    double *a;
    int64_t n, k0, k1; /* the block column [k0, k1) */
} chol_job;

/* Rows i >= k1, in two passes: the panel A[i, k0:k1] (a triangular solve
 * against the diagonal block's L), then the trailing update
 * A[i, j] -= L[i, k0:k1] . L[j, k0:k1] for k1 <= j <= i, which reads other
 * threads' panel rows (hence the second pass). Rows are dealt round-robin:
 * row i's update costs about i, so every thread gets a similar share. */
static void panel_task(void *arg, int tid, int nth) {
    const chol_job *c = arg;
    const int64_t n = c->n, k0 = c->k0, k1 = c->k1;
    for (int64_t i = k1 + tid; i < n; i += nth) {
        double *ai = c->a + i * n;
        for (int64_t j = k0; j < k1; j++) {
            const double *aj = c->a + j * n;
            ai[j] = (ai[j] - dotd(ai + k0, aj + k0, j - k0)) / aj[j];
        }
    }
}

static void update_task(void *arg, int tid, int nth) {
    const chol_job *c = arg;
    const int64_t n = c->n, k0 = c->k0, k1 = c->k1, w = k1 - k0;
    for (int64_t i = k1 + tid; i < n; i += nth) {
        double *ai = c->a + i * n;
        for (int64_t j = k1; j <= i; j++) ai[j] -= dotd(ai + k0, c->a + j * n + k0, w);
    }
}

spx_status spx_chol_factor(double *a, int64_t n, spx_pool *pool, spx_err *e) {
    for (int64_t k0 = 0; k0 < n; k0 += CHOL_NB) {
        const int64_t k1 = k0 + CHOL_NB < n ? k0 + CHOL_NB : n;
        for (int64_t j = k0; j < k1; j++) { /* the diagonal block, unblocked (earlier blocks already applied) */
            double *aj = a + j * n;
            const double d = aj[j] - dotd(aj + k0, aj + k0, j - k0);
            if (!(d > 0) || !isfinite(d))
                return spx_fail(e, SPX_ERR_ARG, "Cholesky: the matrix is not positive definite (pivot %lld of %lld is "
                                "%g)", (long long)j, (long long)n, d);
            aj[j] = sqrt(d);
            for (int64_t i = j + 1; i < k1; i++) {
                double *ai = a + i * n;
                ai[j] = (ai[j] - dotd(ai + k0, aj + k0, j - k0)) / aj[j];
            }
        }
        if (k1 < n) {
            chol_job c = {a, n, k0, k1};
            run(pool, panel_task, &c);
            run(pool, update_task, &c);
        }
    }
    return SPX_OK;
}

void spx_chol_solve_rows(const double *l, int64_t n, double *b, int64_t nrhs) {
    for (int64_t r0 = 0; r0 < nrhs; r0 += SOLVE_RB) {
        const int64_t nb = nrhs - r0 < SOLVE_RB ? nrhs - r0 : SOLVE_RB;
        double *y[SOLVE_RB];
        for (int64_t q = 0; q < nb; q++) y[q] = b + (r0 + q) * n;
        /* L y = b: y_i = (b_i - L[i, :i] . y[:i]) / L_ii (row i of L contiguous) */
        for (int64_t i = 0; i < n; i++) {
            const double *li = l + i * n;
            for (int64_t q = 0; q < nb; q++) y[q][i] = (y[q][i] - dotd(li, y[q], i)) / li[i];
        }
        /* L^T c = y from the last row up: c_i = y_i / L_ii, then y[:i] -= c_i L[i, :i] */
        for (int64_t i = n - 1; i >= 0; i--) {
            const double *li = l + i * n;
            for (int64_t q = 0; q < nb; q++) {
                const double ci = y[q][i] / li[i];
                y[q][i] = ci;
                axpyd(y[q], -ci, li, i);
            }
        }
    }
}

/* ---- eq. 4 ---------------------------------------------------------------- */

spx_status spx_refine_fit_factor(const spx_refine_fit_stats *s, double lambda, spx_pool *pool,
                                 spx_refine_fit_solver *out, spx_err *e) {
    memset(out, 0, sizeof *out);
    const int64_t C = s->cols;
    if (s->n < 1) return spx_fail(e, SPX_ERR_ARG, "refinement fit: no token reached this %lld-wide input", (long long)C);
    const double inv = 1.0 / (double)s->n;
    if (lambda < 0) {
        double d = 0;
        for (int64_t j = 0; j < C; j++) d += s->m[j * C + j];
        lambda = d * inv / (double)C;
    }
    if (!(lambda > 0) || !isfinite(lambda))
        return spx_fail(e, SPX_ERR_ARG, "refinement fit: lambda %g for a %lld-wide input (the mean diagonal of M_k: "
                        "are its activations all zero?)", lambda, (long long)C);
    out->l = malloc((size_t)C * (size_t)C * sizeof(double));
    if (!out->l)
        return spx_fail(e, SPX_ERR_NOMEM, "refinement fit: out of memory for the factor of a %lld-wide input",
                        (long long)C);
    out->cols = C;
    out->lambda = lambda;
    for (int64_t j = 0; j < C; j++) {
        const double *mj = s->m + j * C;
        double *lj = out->l + j * C;
        for (int64_t p = 0; p <= j; p++) lj[p] = mj[p] * inv;
        lj[j] += lambda;
    }
    spx_status st = spx_chol_factor(out->l, C, pool, e);
    if (st != SPX_OK) spx_refine_fit_solver_free(out);
    return st;
}

void spx_refine_fit_solver_free(spx_refine_fit_solver *f) {
    free(f->l);
    memset(f, 0, sizeof *f);
}

typedef struct {
    const spx_refine_fit_solver *f;
    const spx_refine_fit_stats *s;
    const float *R;
    float *C;
    int64_t rows;
    double *work; /* [threads][2 * SOLVE_RB * cols] */
} solve_job;

/* Blocks of SOLVE_RB rows: b_r = G^T r_r / n + lambda r_r (one pass over
 * gt per block), then A c_r = b_r. */
static void solve_task(void *arg, int tid, int nth) {
    const solve_job *j = arg;
    const int64_t C = j->s->cols, nb = (j->rows + SOLVE_RB - 1) / SOLVE_RB;
    const double inv = 1.0 / (double)j->s->n, lambda = j->f->lambda;
    double *r = j->work + (size_t)tid * 2 * SOLVE_RB * (size_t)C, *b = r + SOLVE_RB * C;
    int64_t q0, q1;
    spx_pool_range(nb, tid, nth, 1, &q0, &q1);
    for (int64_t blk = q0; blk < q1; blk++) {
        const int64_t r0 = blk * SOLVE_RB, n = j->rows - r0 < SOLVE_RB ? j->rows - r0 : SOLVE_RB;
        for (int64_t q = 0; q < n; q++)
            for (int64_t i = 0; i < C; i++) r[q * C + i] = j->R[(r0 + q) * C + i];
        for (int64_t jj = 0; jj < C; jj++) {
            const double *g = j->s->gt + jj * C;
            for (int64_t q = 0; q < n; q++) b[q * C + jj] = dotd(g, r + q * C, C) * inv + lambda * r[q * C + jj];
        }
        spx_chol_solve_rows(j->f->l, C, b, n);
        for (int64_t q = 0; q < n; q++)
            for (int64_t i = 0; i < C; i++) j->C[(r0 + q) * C + i] = (float)b[q * C + i];
    }
}

spx_status spx_refine_fit_solve(const spx_refine_fit_solver *f, const spx_refine_fit_stats *s, spx_pool *pool,
                                const float *R, int64_t rows, float *C, spx_err *e) {
    if (f->cols != s->cols || rows < 1)
        return spx_fail(e, SPX_ERR_ARG, "refinement fit: a factor of width %lld for statistics of width %lld, %lld rows",
                        (long long)f->cols, (long long)s->cols, (long long)rows);
    const int nth = pool ? spx_pool_size(pool) : 1;
    solve_job j = {f, s, R, C, rows, malloc((size_t)nth * 2 * SOLVE_RB * (size_t)s->cols * sizeof(double))};
    if (!j.work) return spx_fail(e, SPX_ERR_NOMEM, "refinement fit: out of memory for the solve");
    run(pool, solve_task, &j);
    free(j.work);
    return SPX_OK;
}
