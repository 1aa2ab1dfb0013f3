/* test_refine_fit.c: refinement fitting's math (src/refine/fit.h).
 *
 * - Cholesky: a known 3 x 3 factor and solve; a random 150 x 150 SPD
 *   matrix (over two 64 blocks) on a 2-thread pool: L L^T = A and A x = b
 *   for 5 right-hand sides; an indefinite matrix fails with SPX_ERR_ARG.
 * - Statistics: G^T and M equal a direct sum over tokens of the engine's
 *   selection (spx_refine_topk, two chunks, skip flags) bit for bit, and
 *   skipped channels stay 0.
 * - Fit on synthetic data (W random, a 3-bit G32 base, x correlated through
 *   a few latent factors with a few large channels): the fitted C at the
 *   default lambda lowers E||R x - C z_k(x)||^2 below C = R on the
 *   calibration set (FIT_GAIN_MIN) and on held-out tokens, also after both
 *   are encoded to 4 bits; it minimizes eq. 3 (random perturbations raise
 *   it); lambda -> 0 gives the least-squares C of an independent QR solve;
 *   lambda -> infinity and k = every channel give C = R.
 * - Errors: no token, all-zero activations, a non-finite activation.
 * - The matmul observer (cpu/ops.h) on stories260K compressed to 4 bits:
 *   a prompt of 16 tokens
 *   shows every projection the inputs that 16 decode steps show (within
 *   PROMPT_DECODE_TOL: the batched kernels round differently), which is
 *   why the fit runs its windows as prompts. */
#include "testlib.h"

#include "engine/session.h"
#include "quant/compress.h"
#include "quant/g32.h"
#include "quant/saliency.h"
#include "refine/fit.h"
#include "refine/refine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Double-precision factor and solve of well-conditioned matrices
 * (condition <= ~1e3 here): errors of a few hundred ulps. */
#define CHOL_TOL 1e-10
/* lambda = 1e-9 x the mean diagonal against the unregularized least
 * squares: the bias is about lambda / sigma_min(M) relative (sigma_min of
 * the test's M is above 1e-3 of its mean diagonal), plus QR's rounding. */
#define LS_TOL 1e-4
/* lambda = 1e12 x the mean diagonal: C - R is ~1e-12 of R. */
#define BIG_LAMBDA_TOL 1e-9
/* The fitted C must cut the calibration objective of C = R by at least
 * this factor (the test data's latent correlations make the omitted
 * channels largely predictable from the selected ones; measured about
 * 0.4-0.5 at k = 8 of 64; 0.8 is a floor with margin). */
#define FIT_GAIN_MIN 0.8
/* A prompt's projection inputs against decode steps': the CPU kernels
 * compute each token's row alike either way (measured: identical bits on
 * stories260K and docllama-58m at 4 bits); the tolerance leaves room for
 * a batched kernel that sums in another order: relative l2 per input. */
#define PROMPT_DECODE_TOL 1e-4

static uint64_t g_rng = 0x5eed0f17;

static double *rand_spd(int64_t n) {
    double *b = malloc((size_t)(n * n) * sizeof *b), *a = malloc((size_t)(n * n) * sizeof *a);
    for (int64_t i = 0; i < n * n; i++) b[i] = tl_rand_normal(&g_rng);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = i == j ? (double)n : 0;
            for (int64_t p = 0; p < n; p++) s += b[i * n + p] * b[j * n + p];
            a[i * n + j] = s;
        }
    free(b);
    return a;
}

static void test_cholesky(void) {
    spx_err e;
    spx_err_clear(&e);
    /* known: L = [2 0 0; 1 3 0; 0.5 -1 1.5] */
    const double L[9] = {2, 0, 0, 1, 3, 0, 0.5, -1, 1.5};
    double A[9], F[9];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            double s = 0;
            for (int p = 0; p < 3; p++) s += L[i * 3 + p] * L[j * 3 + p];
            A[i * 3 + j] = s;
        }
    memcpy(F, A, sizeof A);
    CHECK(spx_chol_factor(F, 3, NULL, &e) == SPX_OK, "%s", e.msg);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j <= i; j++) CHECK(fabs(F[i * 3 + j] - L[i * 3 + j]) < CHOL_TOL, "L[%d][%d] %g", i, j, F[i * 3 + j]);
    const double x[3] = {1, -2, 0.25};
    double b[3];
    for (int i = 0; i < 3; i++) b[i] = A[i * 3] * x[0] + A[i * 3 + 1] * x[1] + A[i * 3 + 2] * x[2];
    spx_chol_solve_rows(F, 3, b, 1);
    for (int i = 0; i < 3; i++) CHECK(fabs(b[i] - x[i]) < CHOL_TOL, "x[%d] = %g, expected %g", i, b[i], x[i]);

    /* random, blocked, threaded */
    const int64_t n = 150, nrhs = 5;
    double *a = rand_spd(n), *f = malloc((size_t)(n * n) * sizeof *f);
    memcpy(f, a, (size_t)(n * n) * sizeof *f);
    spx_pool *pool = NULL;
    CHECK(spx_pool_new(2, &pool, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_chol_factor(f, n, pool, &e) == SPX_OK, "%s", e.msg);
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j <= i; j++) {
            double s = 0;
            for (int64_t p = 0; p <= j; p++) s += f[i * n + p] * f[j * n + p];
            worst = fmax(worst, fabs(s - a[i * n + j]) / (fabs(a[i * n + j]) + n));
        }
    CHECK(worst < CHOL_TOL, "L L^T differs from A by %g (relative)", worst);
    double *xs = malloc((size_t)(nrhs * n) * sizeof *xs), *bs = malloc((size_t)(nrhs * n) * sizeof *bs);
    for (int64_t i = 0; i < nrhs * n; i++) xs[i] = tl_rand_normal(&g_rng);
    for (int64_t r = 0; r < nrhs; r++)
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int64_t p = 0; p < n; p++) s += a[i * n + p] * xs[r * n + p];
            bs[r * n + i] = s;
        }
    spx_chol_solve_rows(f, n, bs, nrhs);
    worst = 0;
    for (int64_t i = 0; i < nrhs * n; i++) worst = fmax(worst, fabs(bs[i] - xs[i]));
    CHECK(worst < CHOL_TOL, "solve: worst |x - x_ref| %g", worst);
    /* indefinite */
    double bad[4] = {1, 2, 2, 1};
    spx_err_clear(&e);
    CHECK(spx_chol_factor(bad, 2, NULL, &e) == SPX_ERR_ARG && strstr(e.msg, "positive definite"), "indefinite: %s", e.msg);
    spx_pool_free(pool);
    free(a);
    free(f);
    free(xs);
    free(bs);
}

static void test_stats(void) {
    spx_err e;
    spx_err_clear(&e);
    const int64_t C = 1100, T = 7, K = 3; /* chunks of 1024 and 76 */
    uint8_t skip[1100] = {0};
    for (int i = 0; i < 1100; i += 97) skip[i] = 1;
    float *x = malloc((size_t)(T * C) * sizeof *x);
    for (int64_t i = 0; i < T * C; i++) x[i] = tl_rand_normal(&g_rng) * (i % 97 == 0 ? 50.0f : 1.0f);
    spx_refine_fit_stats s;
    spx_pool *pool = NULL;
    CHECK(spx_pool_new(2, &pool, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_refine_fit_stats_init(&s, C, K, skip, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_refine_fit_stats_add(&s, pool, x, 4, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_refine_fit_stats_add(&s, pool, x + 4 * C, T - 4, &e) == SPX_OK, "%s", e.msg);
    CHECK(s.n == T, "n %lld", (long long)s.n);
    double *gt = calloc((size_t)(C * C), sizeof *gt), *m = calloc((size_t)(C * C), sizeof *m);
    int32_t sel[8];
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * C;
        int64_t ns = spx_refine_topk(xt, C, SPX_REFINE_CHUNK, K, skip, sel);
        CHECK(ns == 2 * K, "token %lld: %lld selected", (long long)t, (long long)ns);
        for (int64_t a = 0; a < ns; a++) {
            CHECK(!skip[sel[a]], "a skipped channel %d selected", sel[a]);
            for (int64_t i = 0; i < C; i++) gt[sel[a] * C + i] += (double)xt[sel[a]] * (double)xt[i];
            for (int64_t b = 0; b <= a; b++) m[sel[a] * C + sel[b]] += (double)xt[sel[a]] * (double)xt[sel[b]];
        }
    }
    int64_t bad_g = 0, bad_m = 0;
    for (int64_t j = 0; j < C; j++)
        for (int64_t i = 0; i < C; i++) {
            bad_g += s.gt[j * C + i] != gt[j * C + i];
            if (i <= j) bad_m += s.m[j * C + i] != m[j * C + i];
        }
    CHECK(bad_g == 0 && bad_m == 0, "%lld entries of G^T and %lld of M differ from the direct sums", (long long)bad_g,
          (long long)bad_m);
    double skipped = 0;
    for (int64_t i = 0; i < C; i++) skipped += fabs(s.gt[0 * C + i]) + fabs(s.gt[97 * C + i]);
    CHECK(skipped == 0, "skipped channels' rows of G^T hold %g", skipped);
    spx_refine_fit_stats_free(&s);
    spx_pool_free(pool);
    free(gt);
    free(m);
    free(x);
}

/* ---- the fit on synthetic data ------------------------------------------ */

enum { ROWS = 24, COLS = 64, NTOK = 4000, LATENT = 6, KSEL = 8 };

/* x = u B + 0.3 noise, channels 5, 17, 40 eight times larger */
static void synth_x(float *x, int64_t n, const float *B) {
    for (int64_t t = 0; t < n; t++) {
        float u[LATENT];
        for (int l = 0; l < LATENT; l++) u[l] = tl_rand_normal(&g_rng);
        for (int c = 0; c < COLS; c++) {
            float v = 0.3f * tl_rand_normal(&g_rng);
            for (int l = 0; l < LATENT; l++) v += u[l] * B[l * COLS + c];
            x[t * COLS + c] = (c == 5 || c == 17 || c == 40) ? 8 * v : v;
        }
    }
}

/* mean over tokens of ||R x - C z(x)||^2 (z: the engine's selection at k) */
static double objective(const float *R, const float *Cm, const float *x, int64_t n, int64_t k) {
    double tot = 0;
    int32_t sel[COLS];
    for (int64_t t = 0; t < n; t++) {
        const float *xt = x + t * COLS;
        int64_t ns = spx_refine_topk(xt, COLS, SPX_REFINE_CHUNK, k, NULL, sel);
        for (int r = 0; r < ROWS; r++) {
            double y = 0, c = 0;
            for (int i = 0; i < COLS; i++) y += (double)R[r * COLS + i] * xt[i];
            for (int64_t j = 0; j < ns; j++) c += (double)Cm[r * COLS + sel[j]] * xt[sel[j]];
            tot += (y - c) * (y - c);
        }
    }
    return tot / (double)n;
}

static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d / s);
}

/* The least-squares C (min sum_t ||R x_t - C z_t||^2) by modified
 * Gram-Schmidt QR of Z [n, COLS], independent of fit.c. */
static void least_squares(const float *R, const float *x, int64_t n, int64_t k, float *Cout) {
    double *Z = calloc((size_t)(n * COLS), sizeof *Z), *Y = malloc((size_t)(n * ROWS) * sizeof *Y);
    double Rq[COLS][COLS] = {{0}};
    int32_t sel[COLS];
    for (int64_t t = 0; t < n; t++) {
        const float *xt = x + t * COLS;
        int64_t ns = spx_refine_topk(xt, COLS, SPX_REFINE_CHUNK, k, NULL, sel);
        for (int64_t j = 0; j < ns; j++) Z[t * COLS + sel[j]] = xt[sel[j]];
        for (int r = 0; r < ROWS; r++) {
            double y = 0;
            for (int i = 0; i < COLS; i++) y += (double)R[r * COLS + i] * xt[i];
            Y[t * ROWS + r] = y;
        }
    }
    for (int j = 0; j < COLS; j++) { /* Z's columns made orthonormal in place: Z = Q Rq */
        for (int p = 0; p < j; p++) {
            double d = 0;
            for (int64_t t = 0; t < n; t++) d += Z[t * COLS + p] * Z[t * COLS + j];
            Rq[p][j] = d;
            for (int64_t t = 0; t < n; t++) Z[t * COLS + j] -= d * Z[t * COLS + p];
        }
        double nn = 0;
        for (int64_t t = 0; t < n; t++) nn += Z[t * COLS + j] * Z[t * COLS + j];
        Rq[j][j] = sqrt(nn);
        for (int64_t t = 0; t < n; t++) Z[t * COLS + j] /= Rq[j][j];
    }
    for (int r = 0; r < ROWS; r++) {
        double qy[COLS], c[COLS];
        for (int j = 0; j < COLS; j++) {
            double d = 0;
            for (int64_t t = 0; t < n; t++) d += Z[t * COLS + j] * Y[t * ROWS + r];
            qy[j] = d;
        }
        for (int j = COLS - 1; j >= 0; j--) {
            double v = qy[j];
            for (int p = j + 1; p < COLS; p++) v -= Rq[j][p] * c[p];
            c[j] = v / Rq[j][j];
        }
        for (int j = 0; j < COLS; j++) Cout[r * COLS + j] = (float)c[j];
    }
    free(Z);
    free(Y);
}

static void fit_with(const float *R, const float *x, int64_t n, int64_t k, double lambda, float *Cout, double *used) {
    spx_err e;
    spx_err_clear(&e);
    spx_refine_fit_stats s;
    spx_refine_fit_solver f;
    CHECK(spx_refine_fit_stats_init(&s, COLS, k, NULL, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_refine_fit_stats_add(&s, NULL, x, n, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_refine_fit_factor(&s, lambda, NULL, &f, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_refine_fit_solve(&f, &s, NULL, R, ROWS, Cout, &e) == SPX_OK, "%s", e.msg);
    if (used) *used = f.lambda;
    spx_refine_fit_solver_free(&f);
    spx_refine_fit_stats_free(&s);
}

/* The values a 4-bit column encoding of M decodes to. */
static void through_q4(const float *Mv, float *out) {
    spx_err e;
    spx_err_clear(&e);
    spx_refine_q4buf b;
    CHECK(spx_refine_q4buf_init(&b, ROWS, COLS, 0, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_refine_q4_set_values(&b, Mv, COLS, 0, ROWS, &e) == SPX_OK, "%s", e.msg);
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < COLS; i++)
            out[r * COLS + i] = b.scales[r] * (float)spx_refine_code(spx_refine_q4_col(&b.v, i), r);
    spx_refine_q4buf_free(&b);
}

static void test_fit(void) {
    spx_err e;
    spx_err_clear(&e);
    static float W[ROWS * COLS], Wq[COLS], R[ROWS * COLS], Cf[ROWS * COLS], Ct[ROWS * COLS], B[LATENT * COLS];
    for (int i = 0; i < ROWS * COLS; i++) W[i] = 0.05f * tl_rand_normal(&g_rng);
    spx_qbuf qb;
    CHECK(spx_qbuf_init(&qb, ROWS, COLS, 3, 32, NULL, 0, &e) == SPX_OK, "%s", e.msg);
    for (int r = 0; r < ROWS; r++) {
        spx_qbuf_set_row(&qb, r, W + r * COLS, SPX_Q_MSE, NULL);
        spx_q_dequant_row_f32(&qb.q, r, Wq);
        for (int i = 0; i < COLS; i++) R[r * COLS + i] = W[r * COLS + i] - Wq[i];
    }
    spx_qbuf_free(&qb);
    for (int i = 0; i < LATENT * COLS; i++) B[i] = tl_rand_normal(&g_rng);
    float *xc = malloc((size_t)NTOK * COLS * sizeof *xc), *xh = malloc((size_t)NTOK * COLS * sizeof *xh);
    synth_x(xc, NTOK, B);
    synth_x(xh, NTOK, B);

    double lambda = 0;
    fit_with(R, xc, NTOK, KSEL, -1, Cf, &lambda);
    const double f_r = objective(R, R, xc, NTOK, KSEL), f_c = objective(R, Cf, xc, NTOK, KSEL);
    const double h_r = objective(R, R, xh, NTOK, KSEL), h_c = objective(R, Cf, xh, NTOK, KSEL);
    printf("k %d of %d: calibration E||Rx - Cz||^2 %.4g (C = R) -> %.4g (fitted, lambda %.3g); held-out %.4g -> %.4g\n",
           KSEL, COLS, f_r, f_c, lambda, h_r, h_c);
    CHECK(f_c < FIT_GAIN_MIN * f_r, "calibration objective %g, C = R's %g", f_c, f_r);
    CHECK(h_c < h_r, "held-out objective %g, C = R's %g", h_c, h_r);
    float *Rq4 = malloc(sizeof R), *Cq4 = malloc(sizeof R);
    through_q4(R, Rq4);
    through_q4(Cf, Cq4);
    const double h_rq = objective(R, Rq4, xh, NTOK, KSEL), h_cq = objective(R, Cq4, xh, NTOK, KSEL);
    printf("4-bit encoded, held-out: %.4g (C = R) -> %.4g (fitted)\n", h_rq, h_cq);
    CHECK(h_cq < FIT_GAIN_MIN * h_rq, "4-bit: held-out %g, C = R's %g", h_cq, h_rq);

    /* eq. 3 at its minimizer: no random step lowers objective + lambda ||C - R||^2 */
    double fr2 = 0;
    for (int i = 0; i < ROWS * COLS; i++) fr2 += ((double)Cf[i] - R[i]) * ((double)Cf[i] - R[i]);
    const double F0 = f_c + lambda * fr2;
    int lower = 0;
    for (int trial = 0; trial < 8; trial++) {
        for (int i = 0; i < ROWS * COLS; i++) Ct[i] = Cf[i] + 1e-3f * fabsf(R[i] + 1e-3f) * tl_rand_normal(&g_rng);
        double p2 = 0;
        for (int i = 0; i < ROWS * COLS; i++) p2 += ((double)Ct[i] - R[i]) * ((double)Ct[i] - R[i]);
        lower += objective(R, Ct, xc, NTOK, KSEL) + lambda * p2 < F0 * (1 - 1e-9);
    }
    CHECK(lower == 0, "%d of 8 perturbations lowered eq. 3's objective", lower);

    /* lambda -> 0: least squares (at k = 3 KSEL every channel is selected
     * by some token, so M is invertible) */
    float *Cls = malloc(sizeof R);
    least_squares(R, xc, NTOK, 3 * KSEL, Cls);
    fit_with(R, xc, NTOK, 3 * KSEL, 1e-9 * lambda, Ct, NULL);
    double d = rel_diff(Ct, Cls, ROWS * COLS);
    printf("lambda -> 0: relative distance to the QR least squares %.3g\n", d);
    CHECK(d < LS_TOL, "lambda -> 0: relative distance to least squares %g", d);
    /* lambda -> infinity: R */
    fit_with(R, xc, NTOK, KSEL, 1e12 * lambda, Ct, NULL);
    d = rel_diff(Ct, R, ROWS * COLS);
    CHECK(d < BIG_LAMBDA_TOL, "lambda -> infinity: relative distance to R %g", d);
    /* every channel selected: G = M, C = R */
    fit_with(R, xc, NTOK, SPX_REFINE_CHUNK, -1, Ct, NULL);
    d = rel_diff(Ct, R, ROWS * COLS);
    CHECK(d < BIG_LAMBDA_TOL, "k = every channel: relative distance to R %g", d);
    free(Cls);
    free(Rq4);
    free(Cq4);
    free(xc);
    free(xh);
}

static void test_errors(void) {
    spx_err e;
    spx_err_clear(&e);
    spx_refine_fit_stats s;
    spx_refine_fit_solver f;
    CHECK(spx_refine_fit_stats_init(&s, 16, 0, NULL, &e) == SPX_ERR_ARG, "k 0 accepted");
    spx_err_clear(&e);
    CHECK(spx_refine_fit_stats_init(&s, 16, 4, NULL, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_refine_fit_factor(&s, -1, NULL, &f, &e) == SPX_ERR_ARG && strstr(e.msg, "no token"), "no token: %s", e.msg);
    float z[32] = {0};
    spx_err_clear(&e);
    CHECK(spx_refine_fit_stats_add(&s, NULL, z, 2, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_refine_fit_factor(&s, -1, NULL, &f, &e) == SPX_ERR_ARG && strstr(e.msg, "all zero"), "zeros: %s", e.msg);
    z[3] = NAN;
    spx_err_clear(&e);
    CHECK(spx_refine_fit_stats_add(&s, NULL, z, 1, &e) == SPX_ERR_ARG && strstr(e.msg, "not finite"), "NaN: %s", e.msg);
    spx_refine_fit_stats_free(&s);
}

/* Every launch's inputs in call order: the launch's first matrix and x. */
enum { OBS_MAX = 4096, OBS_TOK = 16 };
typedef struct {
    const void *w[OBS_MAX];
    int64_t cols[OBS_MAX];
    float *x[OBS_MAX];
    int n;
} obs_log;

static void obs_record(void *user, int n, const struct spx_wmat *const *w, const float *x, int64_t T) {
    obs_log *o = user;
    for (int64_t t = 0; t < T && o->n < OBS_MAX; t++, o->n++) {
        o->w[o->n] = w[0];
        o->cols[o->n] = w[0]->cols;
        o->x[o->n] = malloc((size_t)w[0]->cols * sizeof(float));
        memcpy(o->x[o->n], x + t * w[0]->cols, (size_t)w[0]->cols * sizeof(float));
    }
}

/* The inputs of launch `w` for token t: the (t+1)-th record of w. */
static const float *obs_find(const obs_log *o, const void *w, int t) {
    for (int i = 0; i < o->n; i++)
        if (o->w[i] == w && t-- == 0) return o->x[i];
    return NULL;
}

static void test_observer(void) {
    /* the quantized model the fit runs: stories260K compressed (4-bit G32) */
    char path[1024];
    snprintf(path, sizeof path, "%s/s.trdc", tl_tmpdir());
    spx_compress_opts co = {0};
    co.src_dir = tl_shared("models/stories260K");
    co.out_path = path;
    co.bits = 4;
    co.group = 32;
    co.outlier_mode = SPX_OUTLIERS_AUTO;
    co.method = SPX_Q_MSE;
    co.n_threads = 2;
    spx_compress_stats cs;
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_compress(&co, &cs, &e) == SPX_OK, "compress: %s", e.msg);
    spx_model_params mp = {0};
    mp.n_threads = 2;
    spx_model *m = NULL;
    spx_session *s = NULL;
    CHECK(spx_model_open(path, &mp, &m) == SPX_OK, "%s: %s", path, spx_last_error());
    if (!m) return;
    CHECK(spx_session_new(m, NULL, &s) == SPX_OK, "%s", spx_model_error(m));
    static obs_log prompt, steps;
    int32_t ids[OBS_TOK];
    for (int i = 0; i < OBS_TOK; i++) ids[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
    s->cpu.observe = obs_record;
    s->cpu.observe_user = &prompt;
    CHECK(spx_session_eval(s, ids, OBS_TOK, NULL, 0) == SPX_OK, "%s", spx_session_error(s));
    spx_session_reset(s);
    s->cpu.observe_user = &steps;
    for (int i = 0; i < OBS_TOK; i++) CHECK(spx_session_eval(s, ids + i, 1, NULL, 0) == SPX_OK, "%s", spx_session_error(s));
    CHECK(prompt.n == steps.n && prompt.n > OBS_TOK * 5, "%d prompt inputs, %d decode inputs", prompt.n, steps.n);
    double worst = 0;
    int missing = 0;
    for (int i = 0; i < steps.n; i++) {
        int t = 0; /* which token of its launch record i is */
        for (int j = 0; j < i; j++) t += steps.w[j] == steps.w[i];
        const float *a = obs_find(&prompt, steps.w[i], t);
        if (!a) { missing++; continue; }
        double d = 0, n2 = 0;
        for (int64_t c = 0; c < steps.cols[i]; c++) {
            d += ((double)a[c] - steps.x[i][c]) * ((double)a[c] - steps.x[i][c]);
            n2 += (double)steps.x[i][c] * steps.x[i][c];
        }
        worst = fmax(worst, sqrt(d / (n2 > 0 ? n2 : 1)));
    }
    printf("observer: %d inputs, prompt vs decode steps worst relative l2 %.3g\n", steps.n, worst);
    CHECK(missing == 0 && worst < PROMPT_DECODE_TOL, "%d inputs missing, worst relative l2 %g", missing, worst);
    s->cpu.observe = NULL;
    const int before = steps.n;
    CHECK(spx_session_eval(s, ids, 1, NULL, 0) == SPX_OK, "%s", spx_session_error(s));
    CHECK(steps.n == before, "observer called while unset");
    for (int i = 0; i < prompt.n; i++) free(prompt.x[i]);
    for (int i = 0; i < steps.n; i++) free(steps.x[i]);
    spx_session_free(s);
    spx_model_free(m);
}

int main(void) {
    test_cholesky();
    test_stats();
    test_fit();
    test_errors();
    test_observer();
    return tl_finish("test_refine_fit");
}
