/* experiment.c: Experiments A (Gaussian matrix vs Proposition 3) and B
 * (heavy input channels) of SPECTRA section 5.7; see experiment.h. */
#include "quant/experiment.h"
#include "core/pool.h"
#include "quant/g32.h"
#include "quant/saliency.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ======================================================================
 * Random numbers
 * ==================================================================== */

uint64_t spx_exp_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double spx_exp_normal(uint64_t *state) {
    /* u1 in (0, 1] so log(u1) is finite; one of the Box-Muller pair. */
    double u1 = (double)((spx_exp_splitmix64(state) >> 11) + 1) * 0x1p-53;
    double u2 = (double)(spx_exp_splitmix64(state) >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Independent stream start for (seed, stream id). */
static uint64_t stream_start(uint64_t seed, uint64_t id) {
    uint64_t s = seed ^ (id * 0xD1B54A32D192ED03ull);
    return spx_exp_splitmix64(&s);
}

void spx_exp_gauss_row(uint64_t seed, int64_t r, int64_t cols, float *out) {
    uint64_t st = stream_start(seed, (uint64_t)r + 1);
    for (int64_t c = 0; c < cols; c++) out[c] = (float)spx_exp_normal(&st);
}

/* ======================================================================
 * Moments of the range of n standard normals
 * ==================================================================== */

#define RQ_H 0.01     /* quadrature step in x and r */
#define RQ_XLO (-8.5) /* phi(x) < 1e-15 outside [-8.5, 8.5] */
#define RQ_XHI 8.5
#define RQ_RMAX 14.0  /* P(range of 32 > 14) is far below 1e-20 */

void spx_exp_range_moments(int n, int64_t mc_groups, uint64_t seed, spx_range_moments *out) {
    memset(out, 0, sizeof *out);
    out->n = n;
    /* Quadrature: Q(t) = P(N > t) on the grid t_i = RQ_XLO + i h, i up to
     * the x range plus RQ_RMAX, so Phi(x + r) - Phi(x) = Q(x) - Q(x + r)
     * without cancellation for large x. Simpson in x and r. */
    int nx = (int)lround((RQ_XHI - RQ_XLO) / RQ_H), nr = (int)lround(RQ_RMAX / RQ_H);
    double *Q = malloc(sizeof(double) * (size_t)(nx + nr + 1));
    if (Q) {
        for (int i = 0; i <= nx + nr; i++) Q[i] = 0.5 * erfc((RQ_XLO + i * RQ_H) / M_SQRT2);
        double e_d = 0, e_d2 = 0;
        for (int k = 0; k <= nr; k++) {
            double inner = 0;
            for (int i = 0; i <= nx; i++) {
                double x = RQ_XLO + i * RQ_H;
                double wx = (i == 0 || i == nx) ? 1 : (i & 1) ? 4 : 2;
                double phi = exp(-0.5 * x * x) / sqrt(2 * M_PI);
                double d = Q[i] - Q[i + k];
                inner += wx * phi * pow(d > 0 ? d : 0, n - 1);
            }
            inner *= RQ_H / 3;
            double tail = 1.0 - n * inner, r = k * RQ_H; /* P(d > r) */
            double wr = (k == 0 || k == nr) ? 1 : (k & 1) ? 4 : 2;
            e_d += wr * tail;
            e_d2 += wr * 2 * r * tail;
        }
        out->e_d = e_d * RQ_H / 3;
        out->e_d2 = e_d2 * RQ_H / 3;
        free(Q);
    } else {
        out->e_d = out->e_d2 = NAN;
    }
    /* Monte Carlo check. */
    uint64_t st = stream_start(seed, 0x5EEDull << 32);
    double s1 = 0, s2 = 0;
    for (int64_t g = 0; g < mc_groups; g++) {
        double lo = INFINITY, hi = -INFINITY;
        for (int k = 0; k < n; k++) {
            double v = spx_exp_normal(&st);
            if (v < lo) lo = v;
            if (v > hi) hi = v;
        }
        s1 += hi - lo;
        s2 += (hi - lo) * (hi - lo);
    }
    out->mc_groups = mc_groups;
    out->mc_e_d = mc_groups ? s1 / (double)mc_groups : NAN;
    out->mc_e_d2 = mc_groups ? s2 / (double)mc_groups : NAN;
}

/* ======================================================================
 * Parallel quantize + measure
 * ==================================================================== */

typedef struct {
    const float *W;          /* [rows, cols] */
    int64_t rows, cols;
    const int32_t *heavy;    /* columns scaled by m on the fly (NULL: none) */
    int64_t n_heavy;
    float m;
    spx_qbuf *qb;
    int method;
    float *scratch;          /* [nthreads, 2 * cols] */
    spx_qmetrics *acc;       /* [nthreads] */
    double *light;           /* [nthreads, 2]: sum e^2, sum w^2 over non-heavy columns */
    const uint8_t *is_heavy; /* [cols] or NULL */
} qjob;

static void qjob_fn(void *ctx, int tid, int nt) {
    qjob *j = ctx;
    int64_t r0, r1;
    spx_pool_range(j->rows, tid, nt, 1, &r0, &r1);
    float *row = j->scratch + (size_t)tid * 2 * (size_t)j->cols, *tmp = row + j->cols;
    spx_qmetrics_init(&j->acc[tid]);
    double le2 = 0, lw2 = 0;
    for (int64_t r = r0; r < r1; r++) {
        memcpy(row, j->W + r * j->cols, sizeof(float) * (size_t)j->cols);
        for (int64_t h = 0; h < j->n_heavy; h++) row[j->heavy[h]] *= j->m;
        spx_qbuf_set_row(j->qb, r, row, j->method, NULL);
        spx_qmetrics_add_row(&j->acc[tid], &j->qb->q, r, row, tmp); /* tmp = W^ row */
        for (int64_t c = 0; c < j->cols; c++) {
            if (j->is_heavy && j->is_heavy[c]) continue;
            double d = (double)row[c] - tmp[c];
            le2 += d * d;
            lw2 += (double)row[c] * row[c];
        }
    }
    j->light[2 * tid] = le2;
    j->light[2 * tid + 1] = lw2;
}

typedef struct {
    float *W;
    int64_t rows, cols;
    uint64_t seed;
} genjob;

static void genjob_fn(void *ctx, int tid, int nt) {
    genjob *g = ctx;
    int64_t r0, r1;
    spx_pool_range(g->rows, tid, nt, 1, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) spx_exp_gauss_row(g->seed, r, g->cols, g->W + r * g->cols);
}

/* Shared state of one experiment run. */
typedef struct {
    spx_pool *pool;
    int nt;
    float *W, *scratch;
    spx_qmetrics *acc;
    double *light;
} exp_ctx;

static void exp_ctx_free(exp_ctx *x) {
    spx_pool_free(x->pool);
    free(x->W);
    free(x->scratch);
    free(x->acc);
    free(x->light);
}

static spx_status exp_ctx_init(exp_ctx *x, uint64_t seed, int64_t rows, int64_t cols, int n_threads,
                               spx_err *e) {
    memset(x, 0, sizeof *x);
    SPX_TRY(spx_pool_new(n_threads, &x->pool, e));
    x->nt = spx_pool_size(x->pool);
    x->W = malloc(sizeof(float) * (size_t)rows * (size_t)cols);
    x->scratch = malloc(sizeof(float) * 2 * (size_t)cols * (size_t)x->nt);
    x->acc = malloc(sizeof(spx_qmetrics) * (size_t)x->nt);
    x->light = malloc(sizeof(double) * 2 * (size_t)x->nt);
    if (!x->W || !x->scratch || !x->acc || !x->light) {
        exp_ctx_free(x);
        return spx_fail(e, SPX_ERR_NOMEM, "experiment: out of memory for a %lld x %lld matrix",
                        (long long)rows, (long long)cols);
    }
    genjob g = {x->W, rows, cols, seed};
    spx_pool_run(x->pool, genjob_fn, &g);
    return SPX_OK;
}

/* Quantizes x->W (heavy columns scaled by m) and measures it; *rel_light
 * (if non-NULL) gets the relative error over the non-heavy columns only. */
static spx_status measure(exp_ctx *x, int64_t rows, int64_t cols, int bits, int group,
                          const int32_t *heavy, int64_t n_heavy, float m, const int32_t *out_idx,
                          int64_t n_out, int method, spx_qreport *rep, double *rel_light,
                          spx_err *e) {
    spx_qbuf qb;
    SPX_TRY(spx_qbuf_init(&qb, rows, cols, bits, group, out_idx, n_out, e));
    uint8_t *is_heavy = NULL;
    if (n_heavy) {
        is_heavy = calloc((size_t)cols, 1);
        if (!is_heavy) {
            spx_qbuf_free(&qb);
            return spx_fail(e, SPX_ERR_NOMEM, "experiment: out of memory");
        }
        for (int64_t h = 0; h < n_heavy; h++) is_heavy[heavy[h]] = 1;
    }
    qjob j = {x->W, rows, cols, heavy, n_heavy, m, &qb, method, x->scratch, x->acc, x->light,
              is_heavy};
    spx_pool_run(x->pool, qjob_fn, &j);
    spx_qmetrics tot;
    spx_qmetrics_init(&tot);
    double le2 = 0, lw2 = 0;
    for (int t = 0; t < x->nt; t++) {
        spx_qmetrics_merge(&tot, &x->acc[t]);
        le2 += x->light[2 * t];
        lw2 += x->light[2 * t + 1];
    }
    spx_qmetrics_report(&tot, rep);
    if (rel_light) *rel_light = lw2 > 0 ? sqrt(le2 / lw2) : 0;
    free(is_heavy);
    spx_qbuf_free(&qb);
    return SPX_OK;
}

/* ======================================================================
 * Experiment A
 * ==================================================================== */

#define EXP_A_MC_GROUPS 200000

spx_status spx_exp_gaussian_run(uint64_t seed, int64_t rows, int64_t cols, int bits, int group,
                                int n_threads, spx_exp_gauss_result *out, spx_err *e) {
    memset(out, 0, sizeof *out);
    SPX_TRY(spx_q_check_params(bits, group, cols, e));
    if (rows <= 0 || rows > (1 << 16) || cols > (1 << 16))
        return spx_fail(e, SPX_ERR_ARG, "experiment: shape %lld x %lld out of range", (long long)rows,
                        (long long)cols);
    out->seed = seed;
    out->rows = rows;
    out->cols = cols;
    out->bits = bits;
    out->group = group;
    exp_ctx x;
    SPX_TRY(exp_ctx_init(&x, seed, rows, cols, n_threads, e));
    spx_status st = measure(&x, rows, cols, bits, group, NULL, 0, 1, NULL, 0, SPX_Q_MINMAX,
                            &out->minmax, NULL, e);
    if (st == SPX_OK)
        st = measure(&x, rows, cols, bits, group, NULL, 0, 1, NULL, 0, SPX_Q_MSE, &out->mse, NULL, e);
    exp_ctx_free(&x);
    if (st != SPX_OK) return st;
    spx_exp_range_moments(group, EXP_A_MC_GROUPS, seed, &out->range);
    double den = ((1 << bits) - 1) * sqrt(12.0);
    out->pred_rel_paper = out->range.e_d / den;
    out->pred_rel = sqrt(out->range.e_d2) / den;
    out->pred_snr_db = -20.0 * log10(out->pred_rel);
    out->pred_cosine = 1.0 / sqrt(1.0 + out->pred_rel * out->pred_rel);
    return SPX_OK;
}

/* ======================================================================
 * Experiment B
 * ==================================================================== */

#define EXP_B_N 1536

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

spx_status spx_exp_heavy_channel(uint64_t seed, int n_threads, spx_exp_heavy_result *out,
                                 spx_err *e) {
    static const double ms[SPX_EXP_HEAVY_NM] = {1, 4, 8, 16, 32, 64};
    const int64_t rows = EXP_B_N, cols = EXP_B_N;
    memset(out, 0, sizeof *out);
    out->seed = seed;
    out->rows = rows;
    out->cols = cols;
    /* The heavy channels: a seeded partial Fisher-Yates shuffle. */
    out->n_heavy = spx_outlier_count(cols, 0.01);
    int32_t perm[EXP_B_N];
    for (int32_t i = 0; i < cols; i++) perm[i] = i;
    uint64_t st = stream_start(seed, 0xB0B0ull << 32);
    for (int64_t i = 0; i < out->n_heavy; i++) {
        int64_t k = i + (int64_t)(spx_exp_splitmix64(&st) % (uint64_t)(cols - i));
        int32_t t = perm[i];
        perm[i] = perm[k];
        perm[k] = t;
    }
    memcpy(out->heavy_idx, perm, sizeof(int32_t) * (size_t)out->n_heavy);
    qsort(out->heavy_idx, (size_t)out->n_heavy, sizeof(int32_t), cmp_i32);

    exp_ctx x;
    SPX_TRY(exp_ctx_init(&x, seed, rows, cols, n_threads, e));
    double acc[EXP_B_N] = {0};
    float S[EXP_B_N];
    int32_t idx[EXP_B_N];
    for (int64_t r = 0; r < rows; r++) spx_colnorm_accum(acc, x.W + r * cols, cols);
    spx_status s = SPX_OK;
    for (int i = 0; i < SPX_EXP_HEAVY_NM && s == SPX_OK; i++) {
        float m = (float)ms[i];
        out->m[i] = ms[i];
        const int32_t *hv = out->heavy_idx;
        int64_t nh = out->n_heavy;
        spx_qreport rep;
        s = measure(&x, rows, cols, 4, (int)cols, hv, nh, m, NULL, 0, SPX_Q_MINMAX, &rep,
                    &out->light_row[i], e);
        out->rel_row[i] = rep.rel_err;
        if (s == SPX_OK)
            s = measure(&x, rows, cols, 4, 32, hv, nh, m, NULL, 0, SPX_Q_MINMAX, &rep,
                        &out->light_g32[i], e);
        out->rel_g32[i] = rep.rel_err;
        /* Saliency of the scaled matrix: column norms scale by m. */
        spx_saliency_finish(acc, NULL, cols, S);
        for (int64_t h = 0; h < nh; h++) S[hv[h]] *= m;
        int64_t n_out = 0;
        if (s == SPX_OK)
            s = spx_outliers_choose(S, cols, SPX_OUTLIERS_AUTO, 0, idx, &n_out, &out->kappa[i], e);
        out->ratio[i] = spx_outlier_ratio_auto(out->kappa[i]);
        out->n_out[i] = n_out;
        for (int64_t h = 0, k = 0; h < nh; h++) {
            while (k < n_out && idx[k] < hv[h]) k++;
            if (k < n_out && idx[k] == hv[h]) out->heavy_caught[i]++;
        }
        if (s == SPX_OK)
            s = measure(&x, rows, cols, 4, 32, hv, nh, m, idx, n_out, SPX_Q_MINMAX, &rep,
                        &out->light_g32_out[i], e);
        out->rel_g32_out[i] = rep.rel_err;
        if (s == SPX_OK)
            s = measure(&x, rows, cols, 4, 32, hv, nh, m, idx, n_out, SPX_Q_MSE, &rep,
                        &out->light_g32_out_mse[i], e);
        out->rel_g32_out_mse[i] = rep.rel_err;
    }
    exp_ctx_free(&x);
    return s;
}
