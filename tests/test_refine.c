/* test_refine.c: StrataFlux weight refinement's CPU building blocks
 * (src/refine/refine.h).
 *
 * - Selection: spx_refine_topk against a qsort of each chunk's candidates
 *   by (|x| desc, NaN lowest, index asc) on random inputs with ties, +-0,
 *   infinities, NaN, skip flags, k = 0, 1, .., chunk and beyond, and
 *   chunks that do not divide n.
 * - Builder: every stored code and scale against the row rule applied to
 *   W - W^ computed here from spx_q_dequant_row_f32; padding nibbles and
 *   bytes hold code 0; a tiled base gives the same residual; non-finite
 *   weights and shape mismatches fail with SPX_ERR_ARG; the scale search
 *   is never worse than the plain max scale and close to a fine grid.
 * - End to end against the dense product W x (in double): base = the
 *   scalar reference spx_q_dot_row, plus the unquantized residual over
 *   every channel equals W x within DENSE_TOL_L1; k = 0 and "every column
 *   missing" leave the base bit for bit; the 4-bit residual over every
 *   channel cuts the error of W^ x by more than REDUCTION_MIN (2-, 3- and
 *   4-bit bases), and a ranked partial budget lowers it too.
 * - The avx2 table equals the scalar table bit for bit (random codes
 *   including -8, random column orders, resident and cached column
 *   pointers with misses, row ranges split at odd rows, rows outside the
 *   range left as poisoned). Skipped with a note without AVX2 + FMA. */
#include "testlib.h"

#include "core/half.h"
#include "quant/g32.h"
#include "refine/refine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Unquantized residual over every channel against W x in double. The
 * base's float group sums (G = 32 terms, |err| <= 32 * 2^-24 * their |.|
 * sum, about 2e-6 of sum_c |W_rc x_c|), W^ + fl(W - W^) (2^-24 relative
 * per weight) and the final float roundings all stay below 1e-5 of the
 * row's l1 sum sum_c |W_rc x_c|. */
#define DENSE_TOL_L1 1e-5
/* The 4-bit residual over every channel must cut ||W^ x - W x||_2 by more
 * than this factor. Where it comes from: 15 uniform levels at the
 * MSE-optimal step leave about 1/14 of the rms of a uniform residual and
 * about 1/10 of a Gaussian one; one scale per row must cover every group
 * of the row, and groups holding heavy channels (as here and in real
 * projections) have several times the step of the others, so the row's
 * residual is heavier-tailed than either and the factor lower. 5 is a
 * floor with margin for 2-, 3- and 4-bit bases; a wrong nibble, sign,
 * column or scale gives about 1 or less. (One scale per row is DecDEC's
 * and the format; 8x would need finer scales.) */
#define REDUCTION_MIN 5.0
/* The 4-bit apply against its own definition computed here in double from
 * the decoded codes, base + s_r sum_i x_i q_ri: the float accumulation of
 * up to 2560 products (|err| <= n 2^-24 sum_i |x_i q_ri| in the worst
 * case, about sqrt(n) 2^-24 in practice) stays below 1e-5 of
 * |base| + s_r sum_i |x_i q_ri|. */
#define DECODED_TOL_REL 1e-5
/* The scale search against a fine grid (t = 1/8 .. 16 in steps of 1/8):
 * within 2 % of its best squared error on Gaussian-like rows. */
#define SCALE_GRID_SLACK 1.02

/* ======================================================================
 * Helpers
 * ==================================================================== */

static uint64_t g_rng = 0x5eed2026ull;

/* The reference order: a before b if |a| > |b|, NaN below everything. */
static const float *g_sort_x;
static int cmp_rank(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    float xa = g_sort_x[a], xb = g_sort_x[b];
    int na = isnan(xa), nb = isnan(xb);
    if (na != nb) return na ? 1 : -1;
    if (!na) {
        float fa = fabsf(xa), fb = fabsf(xb);
        if (fa > fb) return -1;
        if (fa < fb) return 1;
    }
    return a < b ? -1 : a > b;
}
static int cmp_i32(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return a < b ? -1 : a > b;
}

/* Reference selection into out, returns the count. */
static int64_t ref_topk(const float *x, int64_t n, int64_t chunk, int64_t k, const uint8_t *skip, int32_t *out) {
    int64_t w = 0;
    if (k <= 0) return 0;
    int32_t *tmp = malloc((size_t)chunk * sizeof *tmp);
    g_sort_x = x;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        int64_t len = n - c0 < chunk ? n - c0 : chunk, m = 0;
        for (int64_t i = 0; i < len; i++)
            if (!skip || !skip[c0 + i]) tmp[m++] = (int32_t)(c0 + i);
        qsort(tmp, (size_t)m, sizeof *tmp, cmp_rank);
        int64_t take = k < m ? k : m;
        qsort(tmp, (size_t)take, sizeof *tmp, cmp_i32);
        memcpy(out + w, tmp, (size_t)take * sizeof *tmp);
        w += take;
    }
    free(tmp);
    return w;
}

/* Kinds of inputs for the selection tests. */
static float rand_x(int kind) {
    uint64_t u = tl_rand_u64(&g_rng);
    switch (kind) {
    case 0: return tl_rand_normal(&g_rng);
    case 1: { /* few distinct values: many ties, both zeros, inf, NaN */
        static const float v[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 0.5f, INFINITY, -INFINITY, NAN};
        return v[u % 10];
    }
    case 2: /* heavy tails over many binades, some NaN and zeros */
        if (u % 50 == 0) return NAN;
        if (u % 7 == 0) return 0.0f;
        return ldexpf(tl_rand_normal(&g_rng), (int)(u >> 32) % 60 - 30);
    default: /* nearly all equal: ties in the last digit pass */
        return (u % 16 == 0) ? nextafterf(1.0f, 2.0f) : ((u & 32) ? -1.0f : 1.0f);
    }
}

/* A test matrix: W [rows, cols] with per-row and per-channel scales (a few
 * heavy channels, as in real projections), its quantized base with a few
 * outlier columns, optionally tiled. */
typedef struct tmat {
    int64_t rows, cols;
    float *w;
    spx_qbuf qb;
} tmat;

static int tmat_init(tmat *t, int64_t rows, int64_t cols, int bits, int n_out) {
    spx_err e;
    spx_err_clear(&e);
    t->rows = rows;
    t->cols = cols;
    t->w = malloc((size_t)(rows * cols) * sizeof(float));
    int32_t oi[16];
    for (int j = 0; j < n_out; j++) oi[j] = (int32_t)((cols / n_out) * j + 3);
    if (spx_qbuf_init(&t->qb, rows, cols, bits, 32, oi, n_out, &e) != SPX_OK) {
        fprintf(stderr, "qbuf_init: %s\n", e.msg);
        return -1;
    }
    float *chs = malloc((size_t)cols * sizeof(float));
    for (int64_t c = 0; c < cols; c++) chs[c] = (c % 97 == 5) ? 4.0f : 0.5f + tl_rand_uniform(&g_rng);
    for (int64_t r = 0; r < rows; r++) {
        float rs = 0.01f * (0.5f + 2.0f * tl_rand_uniform(&g_rng));
        for (int64_t c = 0; c < cols; c++) t->w[r * cols + c] = rs * chs[c] * tl_rand_normal(&g_rng);
        for (int j = 0; j < n_out; j++) t->w[r * cols + oi[j]] *= 8.0f; /* the outliers are large */
        spx_qbuf_set_row(&t->qb, r, t->w + r * cols, SPX_Q_MSE, NULL);
    }
    free(chs);
    return 0;
}

static void tmat_free(tmat *t) {
    free(t->w);
    spx_qbuf_free(&t->qb);
}

/* Activations with a few large channels. */
static void rand_act(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = tl_rand_normal(&g_rng);
        if (tl_rand_u64(&g_rng) % 64 == 0) x[i] *= 12.0f;
    }
}

/* ======================================================================
 * Selection
 * ==================================================================== */

static void test_topk(void) {
    static const int64_t ns[] = {1, 5, 100, 1024, 1500, 3000, 4096};
    static const int64_t chunks[] = {SPX_REFINE_CHUNK, SPX_REFINE_CHUNK_MAX, 100, 7, 1};
    static const int64_t ks[] = {0, 1, 3, 6, 32, 64, 99, 100, 101, 128, 1023, 1024, 2000};
    int64_t nmax = 4096;
    float *x = malloc((size_t)nmax * sizeof(float));
    uint8_t *skip = malloc((size_t)nmax);
    int32_t *got = malloc((size_t)nmax * sizeof(int32_t)), *ref = malloc((size_t)nmax * sizeof(int32_t));
    int cases = 0, bad = 0;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof chunks / sizeof *chunks; b++)
            for (int kind = 0; kind < 4; kind++)
                for (int use_skip = 0; use_skip < 2; use_skip++) {
                    int64_t n = ns[a], chunk = chunks[b];
                    for (int64_t i = 0; i < n; i++) {
                        x[i] = rand_x(kind);
                        skip[i] = use_skip && tl_rand_u64(&g_rng) % 5 == 0;
                    }
                    for (size_t c = 0; c < sizeof ks / sizeof *ks; c++) {
                        int64_t k = ks[c];
                        for (int64_t i = 0; i < n; i++) got[i] = -7;
                        int64_t ng = spx_refine_topk(x, n, chunk, k, use_skip ? skip : NULL, got);
                        int64_t nr = ref_topk(x, n, chunk, k, use_skip ? skip : NULL, ref);
                        cases++;
                        int ok = ng == nr && memcmp(got, ref, (size_t)nr * sizeof *got) == 0 &&
                                 (use_skip || ng == spx_refine_topk_max(n, chunk, k));
                        if (!ok && bad++ < 5)
                            fprintf(stderr, "topk n %lld chunk %lld k %lld kind %d skip %d: got %lld, expected %lld\n",
                                    (long long)n, (long long)chunk, (long long)k, kind, use_skip, (long long)ng,
                                    (long long)nr);
                    }
                }
    CHECK(bad == 0, "%d of %d selections differ from the sort", bad, cases);

    /* a hand case: ties to the lower index, NaN lowest, -0 == 0 */
    const float h[8] = {1.0f, -3.0f, NAN, 3.0f, -0.0f, 0.0f, -3.0f, 2.0f};
    int32_t o[8];
    int64_t m = spx_refine_topk(h, 8, 8, 3, NULL, o);
    CHECK(m == 3 && o[0] == 1 && o[1] == 3 && o[2] == 6, "top 3 of the hand case: %lld [%d %d %d]", (long long)m,
          o[0], o[1], o[2]);
    m = spx_refine_topk(h, 8, 8, 7, NULL, o);
    CHECK(m == 7 && o[0] == 0 && o[1] == 1 && o[2] == 3 && o[3] == 4 && o[4] == 5 && o[5] == 6 && o[6] == 7,
          "top 7 leaves out the NaN (index 2): %lld [%d %d %d ...]", (long long)m, o[0], o[1], o[2]);
    m = spx_refine_topk(h, 8, 8, 6, NULL, o);
    CHECK(m == 6 && o[3] == 4 && o[4] == 6 && o[5] == 7, "top 6 takes -0 (index 4) before +0 (index 5)");
    CHECK(spx_refine_topk(h, 8, 8, 0, NULL, o) == 0, "k = 0 selects nothing");
    CHECK(spx_refine_topk(h, 8, 0, 3, NULL, o) == -1 && spx_refine_topk(h, 8, SPX_REFINE_CHUNK_MAX + 1, 3, NULL, o) == -1,
          "a chunk outside [1, %d] is refused", SPX_REFINE_CHUNK_MAX);
    CHECK(spx_refine_topk_max(2500, 1024, 64) == 3 * 64 && spx_refine_topk_max(2500, 1024, 500) == 1000 + 452 &&
              spx_refine_topk_max(2500, 1024, 1024) == 2500,
          "topk_max");
    free(x);
    free(skip);
    free(got);
    free(ref);
}

/* ======================================================================
 * Builder
 * ==================================================================== */

static double sq_err(const float *res, int64_t n, float s) {
    int8_t *q = malloc((size_t)n);
    spx_refine_q4_row_codes(res, n, s, q);
    double e = 0;
    for (int64_t c = 0; c < n; c++) {
        double d = (double)res[c] - (double)s * q[c];
        e += d * d;
    }
    free(q);
    return e;
}

static void test_scale_rule(void) {
    enum { N = 2048 };
    float res[N];
    int worse = 0, far = 0;
    for (int trial = 0; trial < 20; trial++) {
        for (int c = 0; c < N; c++) {
            float v = tl_rand_normal(&g_rng) * 1e-4f;
            if (trial % 2 && c % 300 == 0) v *= 20.0f; /* a few large residuals */
            res[c] = v;
        }
        float a = 0;
        for (int c = 0; c < N; c++) a = fmaxf(a, fabsf(res[c]));
        float s = spx_refine_q4_row_scale(res, N);
        double e = sq_err(res, N, s), emax = sq_err(res, N, a / 7.0f), best = INFINITY;
        for (int t = 1; t <= 128; t++) best = fmin(best, sq_err(res, N, (float)((double)a * t / (7.0 * 128))));
        worse += !(e <= emax * (1 + 1e-12));
        far += !(e <= best * SCALE_GRID_SLACK);
        if (trial == 0) {
            int8_t q[N];
            spx_refine_q4_row_codes(res, N, s, q);
            int range = 1;
            for (int c = 0; c < N; c++) range &= q[c] >= -SPX_REFINE_QMAX && q[c] <= SPX_REFINE_QMAX;
            CHECK(range, "codes outside [-7, 7]");
        }
    }
    CHECK(worse == 0, "%d rows: the searched scale is worse than max|R| / 7", worse);
    CHECK(far == 0, "%d rows: the searched scale is more than %.2fx the fine grid's error", far, SCALE_GRID_SLACK);
    /* the code rule is clamp(roundf(res * (1 / s)), -7, 7), halves away
     * from zero: exact halves, their neighbours and clipped values */
    const float s = 0.37f;
    int8_t q[N];
    for (int c = 0; c < N; c++) {
        float v = s * (float)((int)(tl_rand_u64(&g_rng) % 40) - 20) * 0.5f;
        int nb = (int)(tl_rand_u64(&g_rng) % 3);
        res[c] = nb == 0 ? v : nb == 1 ? nextafterf(v, INFINITY) : nextafterf(v, -INFINITY);
        if (c % 5 == 0) res[c] = s * 1.5f * tl_rand_normal(&g_rng);
    }
    spx_refine_q4_row_codes(res, N, s, q);
    int bad = 0;
    for (int c = 0; c < N; c++) {
        float r = roundf(res[c] * (1.0f / s));
        r = r > 7 ? 7 : r < -7 ? -7 : r;
        bad += q[c] != (int)r;
    }
    CHECK(bad == 0, "%d codes differ from clamp(roundf(res / s))", bad);
    memset(res, 0, sizeof res);
    CHECK(spx_refine_q4_row_scale(res, N) == 0.0f, "an all-zero row has scale 0");
}

static void test_builder(void) {
    spx_err e;
    static const int64_t shapes[][2] = {{37, 256}, {64, 512}, {20, 1024}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        tmat t;
        if (tmat_init(&t, shapes[si][0], shapes[si][1], 4, 3) != 0) return;
        int64_t rows = t.rows, cols = t.cols;
        spx_refine_q4buf b;
        spx_err_clear(&e);
        spx_status st = spx_refine_q4_build(&b, &t.qb.q, t.w, &e);
        CHECK(st == SPX_OK, "build: %s", e.msg);
        if (st != SPX_OK) {
            tmat_free(&t);
            continue;
        }
        CHECK(b.v.col_bytes == (rows + 1) / 2 && b.v.col_stride % 64 == 0 && b.v.col_stride >= b.v.col_bytes,
              "column bytes %lld stride %lld", (long long)b.v.col_bytes, (long long)b.v.col_stride);
        float *what = malloc((size_t)cols * sizeof(float)), *res = malloc((size_t)cols * sizeof(float));
        int8_t *q = malloc((size_t)cols);
        int bad_code = 0, bad_scale = 0, bad_pad = 0;
        for (int64_t r = 0; r < rows; r++) {
            spx_q_dequant_row_f32(&t.qb.q, r, what);
            for (int64_t c = 0; c < cols; c++) res[c] = t.w[r * cols + c] - what[c];
            float s = spx_refine_q4_row_scale(res, cols);
            spx_refine_q4_row_codes(res, cols, s, q);
            bad_scale += memcmp(&s, &b.v.scales[r], 4) != 0;
            for (int64_t c = 0; c < cols; c++) bad_code += spx_refine_code(spx_refine_q4_col(&b.v, c), r) != q[c];
        }
        for (int64_t c = 0; c < cols; c++) {
            const uint8_t *col = spx_refine_q4_col(&b.v, c);
            if (rows & 1) bad_pad += (col[rows / 2] >> 4) != SPX_REFINE_ZERO;
            for (int64_t k = b.v.col_bytes; k < b.v.col_stride; k++) bad_pad += col[k] != 0x88;
        }
        CHECK(bad_scale == 0 && bad_code == 0, "[%lld, %lld]: %d scales, %d codes differ from the row rule",
              (long long)rows, (long long)cols, bad_scale, bad_code);
        CHECK(bad_pad == 0, "[%lld, %lld]: %d padding nibbles/bytes are not code 0", (long long)rows, (long long)cols,
              bad_pad);

        /* a tiled base (4-bit G32, cols % 128 == 0) gives the same residual */
        spx_qtensor tq;
        void *mem = NULL;
        spx_err_clear(&e);
        if (spx_q_tile_alloc(&t.qb.q, &tq, &mem, &e) == SPX_OK) {
            spx_refine_q4buf b2;
            st = spx_refine_q4_build(&b2, &tq, t.w, &e);
            CHECK(st == SPX_OK && memcmp(b2.codes, b.codes, (size_t)(cols * b.v.col_stride)) == 0 &&
                      memcmp(b2.scales, b.scales, (size_t)rows * 4) == 0,
                  "tiled base: residual differs from the row-major base's");
            if (st == SPX_OK) spx_refine_q4buf_free(&b2);
            free(mem);
        } else {
            CHECK(0, "tile: %s", e.msg);
        }

        /* rows filled in two ranges (as two threads would) equal one call */
        spx_refine_q4buf b3;
        spx_err_clear(&e);
        if (spx_refine_q4buf_init(&b3, rows, cols, 0, &e) == SPX_OK) {
            int64_t half = rows / 4 * 2;
            st = spx_refine_q4_set_rows(&b3, &t.qb.q, t.w + half * cols, cols, half, rows - half, &e);
            if (st == SPX_OK) st = spx_refine_q4_set_rows(&b3, &t.qb.q, t.w, cols, 0, half, &e);
            CHECK(st == SPX_OK && memcmp(b3.codes, b.codes, (size_t)(cols * b.v.col_stride)) == 0,
                  "two row ranges differ from one call");
            spx_refine_q4buf_free(&b3);
        }
        free(what);
        free(res);
        free(q);
        spx_refine_q4buf_free(&b);
        tmat_free(&t);
    }

    /* errors */
    tmat t;
    if (tmat_init(&t, 8, 64, 4, 1) != 0) return;
    spx_refine_q4buf b;
    t.w[3 * 64 + 17] = INFINITY;
    spx_err_clear(&e);
    spx_status st = spx_refine_q4_build(&b, &t.qb.q, t.w, &e);
    CHECK(st == SPX_ERR_ARG && strstr(e.msg, "row 3 column 17"), "non-finite weight: %d '%s'", (int)st, e.msg);
    t.w[3 * 64 + 17] = 0;
    spx_err_clear(&e);
    CHECK(spx_refine_q4buf_init(&b, 9, 64, 0, &e) == SPX_OK, "init");
    st = spx_refine_q4_set_rows(&b, &t.qb.q, t.w, 64, 0, 8, &e);
    CHECK(st == SPX_ERR_ARG && strstr(e.msg, "[8, 64]"), "shape mismatch: %d '%s'", (int)st, e.msg);
    spx_refine_q4buf_free(&b);
    spx_err_clear(&e);
    st = spx_refine_q4buf_init(&b, 8, 64, 3, &e);
    CHECK(st == SPX_ERR_ARG, "a column stride below the column's bytes is refused: %d", (int)st);
    tmat_free(&t);
}

/* ======================================================================
 * End to end against W x
 * ==================================================================== */

/* ||y - ref||_2 */
static double l2_diff(const float *y, const double *ref, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
    return sqrt(s);
}

static void test_end_to_end(int bits) {
    const int64_t rows = 96, cols = 2560; /* 2.5 chunks of 1024 */
    tmat t;
    if (tmat_init(&t, rows, cols, bits, 4) != 0) return;
    const spx_qtensor *q = &t.qb.q;
    spx_err e;
    spx_err_clear(&e);
    spx_refine_f32 rf;
    spx_refine_q4buf r4;
    if (spx_refine_f32_build(&rf, q, t.w, &e) != SPX_OK || spx_refine_q4_build(&r4, q, t.w, &e) != SPX_OK) {
        CHECK(0, "build: %s", e.msg);
        tmat_free(&t);
        return;
    }
    float *x = malloc((size_t)cols * sizeof(float)), *base = malloc((size_t)rows * sizeof(float));
    float *y = malloc((size_t)rows * sizeof(float));
    double *dense = malloc((size_t)rows * sizeof(double)), *l1 = malloc((size_t)rows * sizeof(double));
    int32_t *sel = malloc((size_t)cols * sizeof(int32_t));
    const uint8_t **none = calloc((size_t)cols, sizeof(*none)); /* every column missing */
    uint8_t *skip = malloc((size_t)cols);
    spx_refine_skip_outliers(q, skip);
    const spx_refine_kernels *kt[2] = {spx_refine_kernels_scalar(), spx_refine_kernels_avx2()};
    double ratio_min = INFINITY;
    for (int trial = 0; trial < 3; trial++) {
        rand_act(x, cols);
        for (int64_t r = 0; r < rows; r++) {
            double d = 0, a = 0;
            for (int64_t c = 0; c < cols; c++) {
                d += (double)t.w[r * cols + c] * x[c];
                a += fabs((double)t.w[r * cols + c] * x[c]);
            }
            dense[r] = d;
            l1[r] = a;
            base[r] = spx_q_dot_row(q, r, x);
        }
        /* k = all channels, unquantized residual: the dense product */
        int64_t n = spx_refine_topk(x, cols, SPX_REFINE_CHUNK, SPX_REFINE_CHUNK, NULL, sel);
        CHECK(n == cols, "k = chunk selects every channel: %lld of %lld", (long long)n, (long long)cols);
        memcpy(y, base, (size_t)rows * sizeof(float));
        spx_refine_f32_apply(&rf, sel, n, x, y, 0, rows);
        double worst = 0;
        int64_t wr = 0;
        for (int64_t r = 0; r < rows; r++) {
            double v = fabs(y[r] - dense[r]) / l1[r];
            if (!(v <= worst)) worst = v, wr = r;
        }
        CHECK(worst <= DENSE_TOL_L1, "%d-bit base + float residual, every channel: row %lld off by %.3g of its l1 "
              "(tolerance %.1g; y %.9g, W x %.9g)", bits, (long long)wr, worst, DENSE_TOL_L1, (double)y[wr], dense[wr]);

        /* k = 0: the base, bit for bit, in both variants and tables */
        n = spx_refine_topk(x, cols, SPX_REFINE_CHUNK, 0, NULL, sel);
        memcpy(y, base, (size_t)rows * sizeof(float));
        spx_refine_f32_apply(&rf, sel, n, x, y, 0, rows);
        for (int i = 0; i < 2; i++)
            if (kt[i]) kt[i]->apply(&r4.v, sel, NULL, n, x, y, 0, rows);
        CHECK(n == 0 && memcmp(y, base, (size_t)rows * sizeof(float)) == 0, "k = 0 changed the base");

        /* every channel selected, every column missing: the base, bit for bit */
        n = spx_refine_topk(x, cols, SPX_REFINE_CHUNK, SPX_REFINE_CHUNK, NULL, sel);
        for (int i = 0; i < 2; i++)
            if (kt[i]) kt[i]->apply(&r4.v, sel, none, n, x, y, 0, rows);
        CHECK(memcmp(y, base, (size_t)rows * sizeof(float)) == 0, "all columns missing changed the base");

        /* 4-bit residual, every channel: a large error reduction */
        double e_base = l2_diff(base, dense, rows);
        memcpy(y, base, (size_t)rows * sizeof(float));
        spx_refine_kernels_best()->apply(&r4.v, sel, NULL, n, x, y, 0, rows);
        double e_all = l2_diff(y, dense, rows), worst_dec = 0;
        for (int64_t r = 0; r < rows; r++) {
            double d = 0, a = 0;
            for (int64_t j = 0; j < n; j++) {
                int qv = spx_refine_code(spx_refine_q4_col(&r4.v, sel[j]), r);
                d += (double)x[sel[j]] * qv;
                a += fabs((double)x[sel[j]] * qv);
            }
            double ref = base[r] + (double)r4.v.scales[r] * d;
            double lim = fabs((double)base[r]) + r4.v.scales[r] * a;
            worst_dec = fmax(worst_dec, fabs(y[r] - ref) / lim);
        }
        CHECK(worst_dec <= DECODED_TOL_REL, "%d-bit base: 4-bit apply vs its decoded definition: %.3g (tolerance %.1g)",
              bits, worst_dec, DECODED_TOL_REL);
        ratio_min = fmin(ratio_min, e_base / e_all);
        CHECK(e_all * REDUCTION_MIN < e_base, "%d-bit base: 4-bit residual over every channel: error %.3g vs base "
              "%.3g (reduction %.2fx, expected > %.0fx)", bits, e_all, e_base, e_base / e_all, REDUCTION_MIN);

        /* a ranked budget of 128 per chunk (outliers skipped) helps too */
        n = spx_refine_topk(x, cols, SPX_REFINE_CHUNK, 128, skip, sel);
        memcpy(y, base, (size_t)rows * sizeof(float));
        spx_refine_kernels_best()->apply(&r4.v, sel, NULL, n, x, y, 0, rows);
        double e_k = l2_diff(y, dense, rows);
        CHECK(e_k < e_base && e_k > e_all, "%d-bit base: k = 128 per chunk: error %.3g, expected between %.3g and %.3g",
              bits, e_k, e_all, e_base);
        if (trial == 0)
            printf("%d-bit base: ||W^x - Wx|| %.4g; refined, k = 128/1024: %.4g (%.2fx); every channel: %.4g (%.2fx)\n",
                   bits, e_base, e_k, e_base / e_k, e_all, e_base / e_all);
    }
    free(x);
    free(base);
    free(y);
    free(dense);
    free(l1);
    free(sel);
    free(none);
    free(skip);
    spx_refine_f32_free(&rf);
    spx_refine_q4buf_free(&r4);
    tmat_free(&t);
}

/* ======================================================================
 * avx2 against scalar
 * ==================================================================== */

static void test_avx2(void) {
    const spx_refine_kernels *sc = spx_refine_kernels_scalar(), *av = spx_refine_kernels_avx2();
    CHECK(spx_refine_kernels_best() != NULL, "best table");
    if (!av) {
        printf("note: no AVX2 + FMA here; avx2 refinement table not tested\n");
        return;
    }
    static const int64_t rows_list[] = {1, 2, 63, 64, 65, 130, 200, 519, 4096 + 130}; /* the last: 2 tiles */
    const int64_t cols = 700;
    spx_err e;
    int bad = 0, cases = 0;
    for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++) {
        int64_t rows = rows_list[ri];
        spx_refine_q4buf b;
        spx_err_clear(&e);
        if (spx_refine_q4buf_init(&b, rows, cols, ri % 2 ? 0 : (rows + 1) / 2, &e) != SPX_OK) {
            CHECK(0, "init: %s", e.msg);
            return;
        }
        for (int64_t i = 0; i < cols * b.v.col_stride; i++) b.codes[i] = (uint8_t)tl_rand_u64(&g_rng);
        for (int64_t r = 0; r < rows; r++) b.scales[r] = 1e-3f * tl_rand_uniform(&g_rng);
        /* a copy of the columns elsewhere, as a cache would hold them */
        uint8_t *cache = malloc((size_t)(cols * b.v.col_bytes) + 1);
        for (int64_t c = 0; c < cols; c++)
            memcpy(cache + 1 + c * b.v.col_bytes, spx_refine_q4_col(&b.v, c), (size_t)b.v.col_bytes);
        float *x = malloc((size_t)cols * sizeof(float));
        rand_act(x, cols);
        int32_t *sel = malloc((size_t)cols * sizeof(int32_t));
        const uint8_t **cp = malloc((size_t)cols * sizeof(*cp));
        float *y0 = malloc((size_t)(rows + 2) * sizeof(float)), *y1 = malloc((size_t)(rows + 2) * sizeof(float));
        float *y2 = malloc((size_t)(rows + 2) * sizeof(float));
        for (int trial = 0; trial < 6; trial++) {
            int64_t n = (int64_t)(tl_rand_u64(&g_rng) % (uint64_t)cols) + 1;
            for (int64_t j = 0; j < n; j++) sel[j] = (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)cols); /* any order */
            for (int64_t j = 0; j < n; j++)
                cp[j] = tl_rand_u64(&g_rng) % 4 == 0 ? NULL : cache + 1 + sel[j] * b.v.col_bytes;
            for (int mode = 0; mode < 2; mode++) { /* resident, cached with misses */
                const uint8_t *const *col = mode ? cp : NULL;
                int64_t r0 = rows > 3 ? (int64_t)(tl_rand_u64(&g_rng) % 3) : 0;
                int64_t r1 = rows - (rows > 3 ? (int64_t)(tl_rand_u64(&g_rng) % 3) : 0);
                for (int64_t r = 0; r < rows + 2; r++) {
                    y0[r] = (r & 3) == 1 ? -0.0f : tl_rand_normal(&g_rng);
                    if (r < r0 || r >= r1 || r >= rows) y0[r] = NAN; /* poison outside the range */
                }
                memcpy(y1, y0, (size_t)(rows + 2) * sizeof(float));
                memcpy(y2, y0, (size_t)(rows + 2) * sizeof(float));
                sc->apply(&b.v, sel, col, n, x, y0, r0, r1);
                av->apply(&b.v, sel, col, n, x, y1, r0, r1);
                /* the same range split at an odd row, as two threads would */
                int64_t mid = r0 + (r1 - r0) / 2;
                mid |= 1;
                if (mid > r1) mid = r1;
                av->apply(&b.v, sel, col, n, x, y2, r0, mid);
                av->apply(&b.v, sel, col, n, x, y2, mid, r1);
                cases++;
                size_t sz = (size_t)(rows + 2) * sizeof(float);
                int ok = memcmp(y0, y1, sz) == 0 && memcmp(y0, y2, sz) == 0;
                if (!ok && bad++ < 5) {
                    int64_t r = 0;
                    while (r < rows + 2 && !memcmp(y0 + r, y1 + r, 4) && !memcmp(y0 + r, y2 + r, 4)) r++;
                    fprintf(stderr, "avx2 vs scalar: rows %lld [%lld, %lld) n %lld mode %d: row %lld %.9g %.9g %.9g\n",
                            (long long)rows, (long long)r0, (long long)r1, (long long)n, mode, (long long)r,
                            (double)y0[r], (double)y1[r], (double)y2[r]);
                }
            }
        }
        free(cache);
        free(x);
        free(sel);
        free(cp);
        free(y0);
        free(y1);
        free(y2);
        spx_refine_q4buf_free(&b);
    }
    CHECK(bad == 0, "%d of %d avx2 applies differ from scalar in some bit", bad, cases);
}

/* Every column missing, or nothing selected: y is not written at all, so
 * -0, NaN and every other value keep their bits (y + s * 0 would turn -0
 * into +0). */
static void test_missing(void) {
    enum { ROWS = 130, COLS = 300 };
    spx_err e;
    spx_err_clear(&e);
    spx_refine_q4buf b;
    if (spx_refine_q4buf_init(&b, ROWS, COLS, 0, &e) != SPX_OK) {
        CHECK(0, "init: %s", e.msg);
        return;
    }
    for (int64_t i = 0; i < COLS * b.v.col_stride; i++) b.codes[i] = (uint8_t)tl_rand_u64(&g_rng);
    for (int r = 0; r < ROWS; r++) b.scales[r] = tl_rand_uniform(&g_rng);
    float x[COLS], y[ROWS], y0[ROWS];
    int32_t sel[COLS];
    const uint8_t *none[COLS] = {0};
    rand_act(x, COLS);
    for (int j = 0; j < COLS; j++) sel[j] = j;
    for (int r = 0; r < ROWS; r++) y0[r] = r % 3 == 0 ? -0.0f : r % 3 == 1 ? NAN : tl_rand_normal(&g_rng);
    const spx_refine_kernels *kt[2] = {spx_refine_kernels_scalar(), spx_refine_kernels_avx2()};
    for (int i = 0; i < 2; i++) {
        if (!kt[i]) continue;
        memcpy(y, y0, sizeof y);
        kt[i]->apply(&b.v, sel, none, COLS, x, y, 0, ROWS);
        CHECK(memcmp(y, y0, sizeof y) == 0, "%s: every column missing changed y", kt[i]->name);
        kt[i]->apply(&b.v, sel, NULL, 0, x, y, 0, ROWS);
        CHECK(memcmp(y, y0, sizeof y) == 0, "%s: no column selected changed y", kt[i]->name);
    }
    spx_refine_q4buf_free(&b);
}

int main(void) {
    test_topk();
    test_scale_rule();
    test_builder();
    test_end_to_end(4);
    test_end_to_end(3);
    test_end_to_end(2);
    test_avx2();
    test_missing();
    return tl_finish("test_refine");
}
