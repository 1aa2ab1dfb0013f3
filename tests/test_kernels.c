/* test_kernels.c: the quantized GEMV/GEMM kernel tables (cpu/qkernels.h)
 * against a double-precision dot of spx_q_dequant_row_f32 rows.
 *
 * For every shape, group size, outlier count and token count: fresh random
 * weights and activations, y poisoned with NaN before each call, rows()
 * called on sub-ranges; every row of [r0, r1) must be written and within
 * tolerance, every other element (other rows, the y_stride padding) must
 * stay NaN. The avx2 table is checked against the double reference with
 * the int8-activation bound below, and against the scalar table; the
 * scalar table against the double reference. Splitting the rows across
 * calls must not change a single bit. Skipped with a note where the CPU
 * lacks AVX2/FMA/F16C.
 *
 * Tiled layout: wherever spx_q_tiled_ok (4-bit G32, cols % 128 == 0), the
 * same matrix repacked by spx_q_tile must give bit-identical y in both
 * tables (the same numbers in the same order; only the addresses differ),
 * on the full range and on ranges that start and end inside a tile. Every
 * row and group holds different random data, so a wrong code, scale or
 * zero offset (row within the tile, its half, item, pair) reads another
 * row's or group's values and changes y. The tiled arrays are separate
 * allocations of their exact sizes, so a read past one is an ASan error
 * in the sanitizer build (one block, as spx_q_tile_alloc makes, would hide
 * a read past the scales in the zeros). */
#include "testlib.h"

#include "core/half.h"
#include "cpu/ops.h"
#include "cpu/qkernels.h"
#include "engine/tuning.h"
#include "quant/g32.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Scalar table: float sums of at most one group (<= 128 terms) combined in
 * double: |err| <= ~G * 2^-24 * sum_c |W^_c x_c|; 1e-5 covers G = 128. */
#define SCALAR_TOL_REL 1e-5
/* int8 activations: per element |x - dx * x8| <= dx * A8_HALF, the 1/2 of
 * round-to-nearest plus the float rounding of x * (127 / max|x|) (127
 * ulps of 2^-23 relative -> < 2e-5; 1e-4 leaves room). dx of a block is
 * max|x| / 127 over its 32 columns, which lie inside one group, so the
 * group's max|x| bounds it. Hence
 *   |y_avx2 - y| <= A8_HALF / 127 * sum_g max|x_g| * sum_{k in g} s_g |q_k - z_g|
 *                 + FP_GAMMA * (sum_c s_g (q_c + z_g) |x_c| + sum_j |ov_j x_j|)
 * where the second term covers float32 accumulation: the kernel adds
 * s*dx*dot and -s*z*dx*sum(x8) as separate float terms (magnitudes up to
 * s*(q+z)*|x| per column) in 8 lanes over cols/256 chunks, each product
 * and sum rounded once: FP_GAMMA_PER_BLOCK * (blocks + 64) with one ulp
 * per step and a factor 2 margin. */
#define A8_HALF (0.5 + 1e-4)
#define FP_ULP 1.1920928955078125e-07 /* 2^-23 */

static double fp_gamma(int64_t cols) { return 2.0 * FP_ULP * (double)(cols / 32 + 64); }

typedef struct tcase {
    spx_qbuf b;
    int64_t rows, cols;
    int group, bits;
    /* per row r, column c: s_g |q - z| and s_g (q + z) (dense part) */
    float *absqz, *sqz;
} tcase;

static uint64_t g_seed = 0x5eed1234abcdULL;

static int make_case(tcase *tc, int64_t rows, int64_t cols, int group, int bits, int64_t n_out) {
    memset(tc, 0, sizeof *tc);
    tc->rows = rows;
    tc->cols = cols;
    tc->group = group;
    tc->bits = bits;
    int32_t *idx = NULL;
    if (n_out) {
        /* distinct sorted random columns */
        uint8_t *pick = calloc((size_t)cols, 1);
        idx = malloc((size_t)n_out * sizeof *idx);
        int64_t got = 0;
        while (got < n_out) {
            int64_t c = (int64_t)(tl_rand_u64(&g_seed) % (uint64_t)cols);
            if (!pick[c]) pick[c] = 1, got++;
        }
        got = 0;
        for (int64_t c = 0; c < cols; c++)
            if (pick[c]) idx[got++] = (int32_t)c;
        free(pick);
    }
    spx_err e;
    spx_err_clear(&e);
    if (spx_qbuf_init(&tc->b, rows, cols, bits, group, idx, n_out, &e) != SPX_OK) {
        fprintf(stderr, "qbuf: %s\n", e.msg);
        free(idx);
        return 0;
    }
    float *w = malloc((size_t)cols * sizeof *w);
    for (int64_t r = 0; r < rows; r++) {
        float rs = 0.02f * (1.0f + 3.0f * tl_rand_uniform(&g_seed));
        for (int64_t c = 0; c < cols; c++) w[c] = rs * tl_rand_normal(&g_seed);
        for (int64_t j = 0; j < n_out; j++) w[idx[j]] *= 20.0f; /* outliers are large */
        /* some one-sided groups (z clamps to 0 or n) */
        if (r % 5 == 1) {
            for (int64_t c = 0; c < group && c < cols; c++) w[c] = fabsf(w[c]);
        }
        spx_qbuf_set_row(&tc->b, r, w, (r & 1) ? SPX_Q_MSE : SPX_Q_MINMAX, NULL);
    }
    free(w);
    free(idx);
    tc->absqz = malloc((size_t)(rows * cols) * sizeof(float));
    tc->sqz = malloc((size_t)(rows * cols) * sizeof(float));
    const spx_qtensor *q = &tc->b.q;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *cr = q->codes + r * tc->b.codes_row_bytes;
        const uint8_t *zr = q->zeros + r * tc->b.zeros_row_bytes;
        for (int64_t c = 0; c < cols; c++) {
            int64_t g = c / group;
            double s = spx_f16_to_f32(q->scales[r * tc->b.n_groups + g]);
            int qc = spx_q_code_get(cr, c, bits, group), z = spx_q_zero_get(zr, g);
            tc->absqz[r * cols + c] = (float)(s * abs(qc - z));
            tc->sqz[r * cols + c] = (float)(s * (qc + z));
        }
    }
    return 1;
}

static void free_case(tcase *tc) {
    spx_qbuf_free(&tc->b);
    free(tc->absqz);
    free(tc->sqz);
}

typedef struct tstats {
    double worst_ratio_int8; /* max |avx2 - ref| / int8 bound seen */
    double worst_rms;        /* max over cases of ||avx2 - ref|| / ||ref|| */
    char worst_rms_case[160];
    double sum_rms;          /* for the mean over cases */
    int64_t cases;
    double sum_rms_w[5];     /* per code width (index bits): the mean shows the int8 path ran */
    int64_t cases_w[5];
} tstats;
static tstats g_st;

/* A copy of q whose 2-/3-bit padding (the bits of a partial last item no
 * column owns) is all ones: the kernels must not read it as weights. NULL
 * (nothing to poison) for 4-bit codes and whole items. */
static uint8_t *poisoned_codes(const spx_qtensor *q) {
    if (q->bits == 4 || q->cols % SPX_Q_ITEM_COLS == 0) return NULL;
    const int64_t rb = spx_q_codes_row_bytes(q->cols, q->bits);
    uint8_t *used = calloc((size_t)rb, 1), *c = malloc((size_t)(rb * q->rows));
    for (int64_t col = 0; col < q->cols; col++) spx_q_code_set(used, col, q->bits, q->group, (1 << q->bits) - 1);
    for (int64_t r = 0; r < q->rows; r++)
        for (int64_t i = 0; i < rb; i++) c[r * rb + i] = (uint8_t)(q->codes[r * rb + i] | ~used[i]);
    free(used);
    return c;
}

/* Calls k on rows [r0, r1) (pieces of the range, in one or several calls)
 * with y poisoned; checks written / untouched. Returns 1 if the layout
 * checks passed (values are checked by the caller). */
static int run_kernel(const spx_qkernels *k, const spx_qtensor *q, const float *x, int64_t T,
                      float *y, int64_t ys, int64_t r0, int64_t r1, int pieces, const char *what) {
    size_t ab = k->act_bytes(T, q->cols, q->group);
    size_t sb = k->scratch_bytes(T, q->cols, q->group);
    void *act = malloc(ab ? ab : 1), *scratch = malloc(sb ? sb : 1);
    for (int64_t i = 0; i < T * ys; i++) y[i] = NAN;
    k->prepare(x, T, q->cols, q->group, act);
    int64_t n = r1 - r0;
    for (int p = 0; p < pieces; p++) {
        int64_t a = r0 + n * p / pieces, b = r0 + n * (p + 1) / pieces;
        k->rows(q, act, x, T, y, ys, a, b, scratch);
    }
    free(act);
    free(scratch);
    int ok = 1;
    for (int64_t t = 0; t < T && ok; t++)
        for (int64_t r = 0; r < ys; r++) {
            float v = y[t * ys + r];
            int inside = r >= r0 && r < r1;
            if (inside && !isfinite(v)) {
                CHECK(0, "%s: y[t=%lld, r=%lld] not written (rows [%lld, %lld))", what, (long long)t,
                      (long long)r, (long long)r0, (long long)r1);
                ok = 0;
                break;
            }
            if (!inside && !isnan(v)) {
                CHECK(0, "%s: y[t=%lld, r=%lld] written outside rows [%lld, %lld)", what,
                      (long long)t, (long long)r, (long long)r0, (long long)r1);
                ok = 0;
                break;
            }
        }
    if (ok) tl_checks++;
    return ok;
}

/* y of k on [r0, r1) (in `pieces` calls) of the tiled copy qt must equal
 * want (the one-call result on the row-major original) bit for bit. */
static void check_tiled_range(const spx_qkernels *k, const spx_qtensor *qt, const float *x, int64_t T,
                              const float *want, float *y, int64_t ys, int64_t r0, int64_t r1,
                              int pieces, const char *what) {
    char w2[200];
    snprintf(w2, sizeof w2, "%s: %s tiled rows [%lld, %lld) in %d", what, k->name, (long long)r0,
             (long long)r1, pieces);
    if (!run_kernel(k, qt, x, T, y, ys, r0, r1, pieces, w2)) return;
    int64_t bad = -1;
    for (int64_t t = 0; t < T && bad < 0; t++)
        for (int64_t r = r0; r < r1; r++)
            if (memcmp(&y[t * ys + r], &want[t * ys + r], sizeof(float))) {
                bad = t * ys + r;
                break;
            }
    CHECK(bad < 0, "%s: differs from the row-major result at t=%lld r=%lld: %.9g vs %.9g", w2,
          (long long)(bad / ys), (long long)(bad % ys), y[bad], want[bad]);
}

static void check_tiled(const spx_qkernels *k, const spx_qtensor *q, const float *x, int64_t T,
                        const float *want, float *y, int64_t ys, const char *what) {
    spx_qtensor qt;
    spx_err e;
    spx_err_clear(&e);
    uint8_t *codes = malloc((size_t)spx_q_codes_bytes(q->rows, q->cols, 4, SPX_Q_TILED));
    uint16_t *scales = malloc((size_t)spx_q_scales_bytes(q->rows, q->cols, 32, SPX_Q_TILED));
    uint8_t *zeros = malloc((size_t)spx_q_zeros_bytes(q->rows, q->cols, 32, SPX_Q_TILED));
    if (spx_q_tile(q, codes, scales, zeros, &qt, &e) != SPX_OK) {
        CHECK(0, "%s: spx_q_tile: %s", what, e.msg);
        free(codes);
        free(scales);
        free(zeros);
        return;
    }
    int64_t rows = q->rows;
    check_tiled_range(k, &qt, x, T, want, y, ys, 0, rows, 1, what);
    /* 7 pieces: boundaries inside tiles and tile halves for most shapes */
    if (rows >= 7) check_tiled_range(k, &qt, x, T, want, y, ys, 0, rows, 7, what);
    /* starts in the second half of a tile, ends inside a later one */
    if (rows > 11) check_tiled_range(k, &qt, x, T, want, y, ys, 9, rows - 2, 2, what);
    free(codes);
    free(scales);
    free(zeros);
}

static void check_case(const spx_qkernels *sc, const spx_qkernels *av, int64_t rows, int64_t cols,
                       int group, int bits, int64_t n_out, int64_t T) {
    tcase tc;
    if (!make_case(&tc, rows, cols, group, bits, n_out)) {
        CHECK(0, "case setup failed");
        return;
    }
    const spx_qtensor *q = &tc.b.q;
    char what[160];
    snprintf(what, sizeof what, "rows %lld cols %lld G%d b%d outliers %lld T %lld", (long long)rows,
             (long long)cols, group, bits, (long long)n_out, (long long)T);
    float *x = malloc((size_t)(T * cols) * sizeof *x);
    for (int64_t i = 0; i < T * cols; i++) {
        x[i] = tl_rand_normal(&g_seed);
        if (tl_rand_uniform(&g_seed) < 0.01f) x[i] *= 30.0f; /* activation spikes */
    }
    /* double reference and tolerances */
    double *ref = malloc((size_t)(T * rows) * sizeof *ref);
    double *tol8 = malloc((size_t)(T * rows) * sizeof *tol8);
    double *tols = malloc((size_t)(T * rows) * sizeof *tols);
    float *wrow = malloc((size_t)cols * sizeof *wrow);
    double gam = fp_gamma(cols);
    for (int64_t r = 0; r < rows; r++) {
        spx_q_dequant_row_f32(q, r, wrow);
        const float *aq = tc.absqz + r * cols, *sq = tc.sqz + r * cols;
        const uint16_t *ov = q->outlier_val + r * n_out;
        for (int64_t t = 0; t < T; t++) {
            const float *xt = x + t * cols;
            double acc = 0, mag = 0, b8 = 0, bfp = 0;
            for (int64_t c = 0; c < cols; c++) {
                acc += (double)wrow[c] * xt[c];
                mag += fabs((double)wrow[c] * xt[c]);
                bfp += (double)sq[c] * fabs(xt[c]);
            }
            for (int64_t g = 0; g < cols / group; g++) {
                double amax = 0, sa = 0;
                for (int64_t k = 0; k < group; k++) {
                    double v = fabs(xt[g * group + k]);
                    if (v > amax) amax = v;
                    sa += aq[g * group + k];
                }
                b8 += amax * sa;
            }
            for (int64_t j = 0; j < n_out; j++)
                bfp += fabs((double)spx_f16_to_f32(ov[j]) * xt[q->outlier_idx[j]]);
            ref[t * rows + r] = acc;
            tol8[t * rows + r] = A8_HALF / 127.0 * b8 + gam * bfp + 1e-30;
            tols[t * rows + r] = SCALAR_TOL_REL * mag + 1e-30;
        }
    }
    int64_t ys = rows + 3; /* padding must stay untouched */
    float *ysc = malloc((size_t)(T * ys) * sizeof *ysc);
    float *yav = malloc((size_t)(T * ys) * sizeof *yav);
    float *ysplit = malloc((size_t)(T * ys) * sizeof *ysplit);
    /* scalar vs double, full range */
    if (run_kernel(sc, q, x, T, ysc, ys, 0, rows, 1, "scalar")) {
        double worst = 0;
        int64_t wi = -1;
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < rows; r++) {
                double err = fabs(ysc[t * ys + r] - ref[t * rows + r]) / tols[t * rows + r];
                if (!(err <= worst)) worst = err, wi = t * rows + r;
            }
        CHECK(worst <= 1.0, "%s: scalar vs double: worst err/tol %.3g at t=%lld r=%lld (got %.9g ref %.9g)",
              what, worst, (long long)(wi / rows), (long long)(wi % rows),
              ysc[(wi / rows) * ys + wi % rows], ref[wi]);
    }
    int tiled = spx_q_tiled_ok(bits, group, cols);
    if (tiled) check_tiled(sc, q, x, T, ysc, ysplit, ys, what);
    if (av) {
        if (run_kernel(av, q, x, T, yav, ys, 0, rows, 1, av->name)) {
            double worst = 0, se = 0, sr = 0;
            int64_t wi = -1;
            for (int64_t t = 0; t < T; t++)
                for (int64_t r = 0; r < rows; r++) {
                    double e = fabs(yav[t * ys + r] - ref[t * rows + r]);
                    double err = e / tol8[t * rows + r];
                    if (!(err <= worst)) worst = err, wi = t * rows + r;
                    se += e * e;
                    sr += ref[t * rows + r] * ref[t * rows + r];
                    /* avx2 vs scalar: both bounds */
                    double es = fabs(yav[t * ys + r] - ysc[t * ys + r]);
                    if (!(es <= tol8[t * rows + r] + tols[t * rows + r])) {
                        CHECK(0, "%s: %s vs scalar at t=%lld r=%lld: %.9g vs %.9g", what, av->name,
                              (long long)t, (long long)r, yav[t * ys + r], ysc[t * ys + r]);
                        t = T;
                        break;
                    }
                }
            CHECK(worst <= 1.0, "%s: %s vs double: worst err/bound %.3g at t=%lld r=%lld (got %.9g ref %.9g)",
                  what, av->name, worst, (long long)(wi / rows), (long long)(wi % rows),
                  yav[(wi / rows) * ys + wi % rows], ref[wi]);
            if (group == 32 || group == 64 || group == 128) { /* the int8 path, not a scalar fallback */
                double rms = sr > 0 ? sqrt(se / sr) : 0;
                if (worst > g_st.worst_ratio_int8) g_st.worst_ratio_int8 = worst;
                if (rms > g_st.worst_rms) {
                    g_st.worst_rms = rms;
                    snprintf(g_st.worst_rms_case, sizeof g_st.worst_rms_case, "%s", what);
                }
                g_st.sum_rms += rms;
                g_st.cases++;
                g_st.sum_rms_w[bits] += rms;
                g_st.cases_w[bits]++;
            }
        }
        /* padding of a partial item set to ones: the same y, bit for bit */
        uint8_t *pc = poisoned_codes(q);
        if (pc) {
            spx_qtensor qp = *q;
            qp.codes = pc;
            if (run_kernel(av, &qp, x, T, ysplit, ys, 0, rows, 1, "poisoned padding")) {
                int same = 1;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t r = 0; r < rows; r++)
                        if (memcmp(&ysplit[t * ys + r], &yav[t * ys + r], sizeof(float))) same = 0;
                CHECK(same, "%s: the padding of the last item changes y", what);
            }
            free(pc);
        }
        /* sub-ranges: a middle piece only, then the whole range in 3 calls;
         * rows must be bit-identical to the one-call result */
        int64_t a = rows / 3, b = rows - rows / 4;
        if (b > a && run_kernel(av, q, x, T, ysplit, ys, a, b, 1, "sub-range")) {
            int same = 1;
            for (int64_t t = 0; t < T; t++)
                for (int64_t r = a; r < b; r++)
                    if (memcmp(&ysplit[t * ys + r], &yav[t * ys + r], sizeof(float))) same = 0;
            CHECK(same, "%s: rows [%lld, %lld) differ from the full-range call", what, (long long)a,
                  (long long)b);
        }
        if (rows >= 3 && run_kernel(av, q, x, T, ysplit, ys, 0, rows, 3, "3 pieces")) {
            int same = 1;
            for (int64_t t = 0; t < T; t++)
                for (int64_t r = 0; r < rows; r++)
                    if (memcmp(&ysplit[t * ys + r], &yav[t * ys + r], sizeof(float))) same = 0;
            CHECK(same, "%s: 3-piece split differs from the one-call result", what);
        }
        /* yav is within the bounds above, so the tiled copy's y is too */
        if (tiled) check_tiled(av, q, x, T, yav, ysplit, ys, what);
    }
    free(x);
    free(ref);
    free(tol8);
    free(tols);
    free(wrow);
    free(ysc);
    free(yav);
    free(ysplit);
    free_case(&tc);
}

static void test_dispatch(void) {
    const spx_qkernels *s = spx_qkernels_scalar();
    CHECK(s && strcmp(s->name, "scalar") == 0, "scalar table");
    CHECK(spx_qkernels_get("scalar") == s, "get(scalar)");
    CHECK(spx_qkernels_get("no-such-kernels") == NULL, "get(unknown) is NULL");
    CHECK(spx_qkernels_get(NULL) == NULL, "get(NULL) is NULL");
    /* SPECTRA_KERNELS is read once, at the first spx_qkernels_best(), from
     * engine/tuning.h's record: reloaded after a setenv */
    setenv("SPECTRA_KERNELS", "scalar", 1);
    spx_tuning_reload();
    const spx_qkernels *b = spx_qkernels_best();
    CHECK(b == s, "SPECTRA_KERNELS=scalar gives %s", b ? b->name : "NULL");
    CHECK(spx_qkernels_best() == b, "best() is stable");
}

/* The KV cache's attention steps (scores_f16, wv_f16 over rows of the
 * fp16 cache; dot_q4g, axpy_q4g for the 4-bit cache's groups): the scalar
 * table to the letter of its definition (index order, separate roundings:
 * it is the reference the other backends match), and the avx2 table
 * against a double reference within the float rounding of an n-term sum:
 * first one row of n values, n from 1 to 300 (the 32- and 8-wide loops
 * and their tails), with misaligned starts, then blocks of rows. */
/* softmax: the scalar table's is spx_cpu_softmax to the bit; both within
 * (1e-6 + 1.2e-7 |x - max|) relative of a double softmax (a few ulp for
 * the exp and the float reciprocal, plus what the float subtraction
 * x - max, which both do, costs after the exp), on spreads from 1 to 300
 * (terms below expf's normal range: within 1e-37), lengths 1..300 and a
 * few long ones, misaligned; a NaN input gives NaN everywhere in both. */
static void test_softmax(const spx_qkernels *sc, const spx_qkernels *av) {
    enum { N = 4099 };
    static float x[N + 1], a[N + 1], b[N + 1];
    static double ref[N + 1];
    static const float spreads[] = {1.0f, 8.0f, 40.0f, 300.0f};
    int bad_sc = 0, bad_av = 0, cases = 0;
    double worst = 0;
    for (int64_t n = 1; n <= N; n = n < 40 ? n + 1 : n < 300 ? n + 29 : n * 2 + 3)
        for (int si = 0; si < 4; si++) {
            const int sh = (int)(n % 3); /* misaligned starts */
            float *xa = a + sh, *xb = b + sh;
            for (int64_t i = 0; i < n; i++) x[i] = spreads[si] * tl_rand_normal(&g_seed);
            double mx = -INFINITY, sum = 0;
            for (int64_t i = 0; i < n; i++) mx = fmax(mx, x[i]);
            for (int64_t i = 0; i < n; i++) sum += (ref[i] = exp((double)x[i] - mx));
            memcpy(xa, x, (size_t)n * 4);
            memcpy(xb, x, (size_t)n * 4);
            sc->softmax(xa, n);
            spx_cpu_softmax(xb, n);
            bad_sc += memcmp(xa, xb, (size_t)n * 4) != 0;
            for (int64_t i = 0; i < n; i++) {
                const double r = ref[i] / sum;
                bad_sc += !(fabs((double)xa[i] - r) <= (1e-6 + 1.2e-7 * (mx - x[i])) * r + 1e-37);
            }
            if (av) {
                memcpy(xa, x, (size_t)n * 4);
                av->softmax(xa, n);
                for (int64_t i = 0; i < n; i++) {
                    const double r = ref[i] / sum, d = fabs((double)xa[i] - r);
                    const double tol = (1e-6 + 1.2e-7 * (mx - x[i])) * r + 1e-37;
                    worst = fmax(worst, d / tol);
                    bad_av += !(d <= tol);
                }
            }
            cases++;
        }
    for (int64_t i = 0; i < 21; i++) x[i] = tl_rand_normal(&g_seed);
    x[13] = NAN;
    memcpy(a, x, 21 * 4);
    sc->softmax(a, 21);
    int nan_sc = 0, nan_av = 0;
    for (int i = 0; i < 21; i++) nan_sc += isnan(a[i]) != 0;
    if (av) {
        memcpy(b, x, 21 * 4);
        av->softmax(b, 21);
        for (int i = 0; i < 21; i++) nan_av += isnan(b[i]) != 0;
    }
    CHECK(bad_sc == 0, "scalar softmax: %d differences from spx_cpu_softmax or the bound (%d cases)", bad_sc, cases);
    CHECK(!av || bad_av == 0, "%s softmax: %d elements off (worst %.3g of the bound)", av ? av->name : "", bad_av, worst);
    CHECK(nan_sc == 21 && (!av || nan_av == 21), "softmax with a NaN: %d / %d NaN outputs of 21 (scalar / avx2)", nan_sc,
          nan_av);
    if (av) printf("softmax: %d cases, %s worst %.2f of the bound\n", cases, av->name, worst);
}

static void test_attention_steps(const spx_qkernels *sc, const spx_qkernels *av) {
    enum { N = 300 };
    static float q[N + 3], out0[N + 3], out1[N + 3], ref_o[N + 3];
    static uint16_t h[N + 3];
    int bad_sc = 0, bad_av = 0, cases = 0, bad_g = 0, g_cases = 0;
    double worst = 0;
    for (int64_t n = 1; n <= N; n += n < 40 ? 1 : 13)
        for (int sh = 0; sh < 3; sh += 2) {
            float *qq = q + sh, *o0 = out0 + sh, *o1 = out1 + sh;
            uint16_t *hh = h + sh + (sh ? 1 : 0);
            double ref = 0, mag = 0;
            float lit = 0;
            const float a = tl_rand_normal(&g_seed);
            for (int64_t j = 0; j < n; j++) {
                qq[j] = tl_rand_normal(&g_seed);
                hh[j] = spx_f32_to_f16(tl_rand_normal(&g_seed));
                const float hv = spx_f16_to_f32(hh[j]);
                ref += (double)qq[j] * hv;
                mag += fabs((double)qq[j] * hv);
                lit += qq[j] * hv;
                o0[j] = o1[j] = tl_rand_normal(&g_seed);
                ref_o[j] = o0[j] + a * hv; /* one rounding of the product, one of the sum */
            }
            float ds;
            sc->scores_f16(qq, 0, 1, hh, n, 1, n, 1.0f, &ds, 0);
            sc->wv_f16(o0, 0, &a, 0, 1, hh, n, 1, n);
            bad_sc += memcmp(&ds, &lit, sizeof ds) != 0;
            for (int64_t j = 0; j < n; j++) bad_sc += memcmp(&o0[j], &ref_o[j], sizeof(float)) != 0;
            if (av) {
                float da;
                av->scores_f16(qq, 0, 1, hh, n, 1, n, 1.0f, &da, 0);
                av->wv_f16(o1, 0, &a, 0, 1, hh, n, 1, n);
                const double tol = (double)n * 6e-8 * mag + 1e-30; /* n * eps(float) * sum |terms| */
                worst = fmax(worst, fabs(da - ref) / tol);
                bad_av += !(fabs(da - ref) <= tol);
                for (int64_t j = 0; j < n; j++) /* a fused multiply-add: within two roundings of ref_o's */
                    bad_av += !(fabs((double)o1[j] - ref_o[j]) <=
                                2.4e-7 * (fabs((double)ref_o[j]) + fabs((double)a * spx_f16_to_f32(hh[j]))));
            }
            cases++;
        }
    /* the 4-bit cache's group steps: every code value in every position */
    for (int rep = 0; rep < 64; rep++) {
        uint8_t cd[16];
        float qg[32], o0[32], o1[32], ro[32];
        for (int k = 0; k < 16; k++) cd[k] = (uint8_t)(tl_rand_u64(&g_seed) & 255);
        if (rep < 16)
            for (int k = 0; k < 16; k++) cd[k] = (uint8_t)((rep + k) % 16 | ((15 - (rep + k) % 16) << 4));
        const float a = tl_rand_normal(&g_seed);
        const int z = (int)(tl_rand_u64(&g_seed) % 16);
        float lit = 0;
        double ref = 0, mag = 0;
        for (int k = 0; k < 32; k++) {
            qg[k] = tl_rand_normal(&g_seed);
            o0[k] = o1[k] = tl_rand_normal(&g_seed);
        }
        for (int k = 0; k < 16; k++) {
            const float lo = (float)(cd[k] & 15), hi = (float)(cd[k] >> 4);
            lit += lo * qg[k] + hi * qg[k + 16];
            ref += (double)lo * qg[k] + (double)hi * qg[k + 16];
            mag += fabs((double)lo * qg[k]) + fabs((double)hi * qg[k + 16]);
            ro[k] = o0[k] + a * (float)((cd[k] & 15) - z);
            ro[k + 16] = o0[k + 16] + a * (float)((cd[k] >> 4) - z);
        }
        float ds;
        sc->dot_q4g(qg, 0, 1, cd, &ds);
        sc->axpy_q4g(o0, 0, &a, 1, z, cd);
        bad_sc += memcmp(&ds, &lit, sizeof ds) != 0 || memcmp(o0, ro, sizeof ro) != 0;
        /* G heads at once (GQA): each head's result is the one-head call's, bit for bit */
        for (int tb = 0; tb < (av ? 2 : 1); tb++) {
            const spx_qkernels *kk = tb ? av : sc;
            enum { GG = 5 };
            float gq[GG * 35], go[GG * 37], ga[GG], gd[GG], one[32], od;
            for (int i = 0; i < GG * 35; i++) gq[i] = tl_rand_normal(&g_seed);
            for (int i = 0; i < GG * 37; i++) go[i] = (float)(i % 5);
            for (int g = 0; g < GG; g++) ga[g] = tl_rand_normal(&g_seed);
            kk->dot_q4g(gq, 35, GG, cd, gd);
            kk->axpy_q4g(go, 37, ga, GG, z, cd);
            for (int g = 0; g < GG; g++) {
                kk->dot_q4g(gq + g * 35, 0, 1, cd, &od);
                for (int k = 0; k < 32; k++) one[k] = (float)((g * 37 + k) % 5);
                kk->axpy_q4g(one, 0, &ga[g], 1, z, cd);
                bad_g += memcmp(&od, &gd[g], sizeof od) != 0 || memcmp(one, go + g * 37, sizeof one) != 0;
            }
            g_cases++;
        }
        if (av) {
            float da;
            av->dot_q4g(qg, 0, 1, cd, &da);
            av->axpy_q4g(o1, 0, &a, 1, z, cd);
            bad_av += !(fabs(da - ref) <= 32 * 6e-8 * mag);
            for (int k = 0; k < 32; k++) {
                const int c = k < 16 ? cd[k] & 15 : cd[k - 16] >> 4;
                bad_av += !(fabs((double)o1[k] - ro[k]) <= 2.4e-7 * (fabs((double)ro[k]) + fabs((double)a * (c - z))));
            }
        }
        cases++;
    }
    /* blocks of n rows of d halves, stride apart: the scalar forms are the
     * one-row definition row by row, the avx2 ones within the rounding
     * bound of the scalar results */
    static const int64_t ds[] = {8, 60, 64, 72, 128, 136, 256};
    static const int64_t ns[] = {1, 3, 7, 8, 9, 16, 23, 100};
    static uint16_t rows[100 * 300];
    static float sq[256], s0[100], s1[100], pr[100], w0[256], w1[256], wr[256];
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int64_t d = ds[di], n = ns[ni], stride = d + 24;
            for (int64_t j = 0; j < d; j++) sq[j] = tl_rand_normal(&g_seed);
            for (int64_t i = 0; i < n * stride; i++) rows[i] = spx_f32_to_f16(tl_rand_normal(&g_seed));
            for (int64_t i = 0; i < n; i++) pr[i] = tl_rand_uniform(&g_seed);
            for (int64_t j = 0; j < d; j++) w0[j] = w1[j] = wr[j] = tl_rand_normal(&g_seed);
            sc->scores_f16(sq, 0, 1, rows, stride, n, d, 0.125f, s0, 0);
            sc->wv_f16(w0, 0, pr, 0, 1, rows, stride, n, d);
            for (int64_t i = 0; i < n; i++) {
                float lit = 0;
                for (int64_t j = 0; j < d; j++) {
                    const float hv = spx_f16_to_f32(rows[i * stride + j]);
                    lit += sq[j] * hv;
                    wr[j] += pr[i] * hv;
                }
                const float e = lit * 0.125f;
                bad_sc += memcmp(&e, &s0[i], sizeof e) != 0;
            }
            bad_sc += memcmp(wr, w0, (size_t)d * sizeof(float)) != 0;
            if (av) {
                av->scores_f16(sq, 0, 1, rows, stride, n, d, 0.125f, s1, 0);
                av->wv_f16(w1, 0, pr, 0, 1, rows, stride, n, d);
                for (int64_t i = 0; i < n; i++) {
                    double mg = 0;
                    for (int64_t j = 0; j < d; j++) mg += fabs((double)sq[j] * spx_f16_to_f32(rows[i * stride + j]));
                    bad_av += !(fabs((double)s1[i] - s0[i]) <= 2 * (double)d * 6e-8 * 0.125 * mg + 1e-30);
                }
                for (int64_t j = 0; j < d; j++) {
                    double mg = fabs((double)w0[j]);
                    for (int64_t i = 0; i < n; i++) mg += fabs((double)pr[i] * spx_f16_to_f32(rows[i * stride + j]));
                    bad_av += !(fabs((double)w1[j] - w0[j]) <= 2 * (double)(n + 1) * 6e-8 * mg);
                }
            }
            /* G heads sharing the rows (GQA): each head's scores and output
             * are the one-head call's, bit for bit, in both tables */
            for (int G = 2; G <= 9; G += G < 5 ? 1 : 4) {
                static float gq[9 * 261], gsc[9 * 107], gp[9 * 103], gw[9 * 263], one[263];
                const int64_t qs = d + 5, os = n + 7, ps = n + 3, ws = d + 7;
                for (int64_t i = 0; i < G * qs; i++) gq[i] = tl_rand_normal(&g_seed);
                for (int64_t i = 0; i < G * ps; i++) gp[i] = tl_rand_uniform(&g_seed);
                for (int tb = 0; tb < (av ? 2 : 1); tb++) {
                    const spx_qkernels *k = tb ? av : sc;
                    for (int64_t i = 0; i < G * ws; i++) gw[i] = (float)(i % 7) - 3.0f;
                    k->scores_f16(gq, qs, G, rows, stride, n, d, 0.125f, gsc, os);
                    k->wv_f16(gw, ws, gp, ps, G, rows, stride, n, d);
                    for (int g = 0; g < G; g++) {
                        k->scores_f16(gq + g * qs, 0, 1, rows, stride, n, d, 0.125f, one, 0);
                        bad_g += memcmp(one, gsc + g * os, (size_t)n * sizeof(float)) != 0;
                        for (int64_t j = 0; j < d; j++) one[j] = (float)((g * ws + j) % 7) - 3.0f;
                        k->wv_f16(one, 0, gp + g * ps, 0, 1, rows, stride, n, d);
                        bad_g += memcmp(one, gw + g * ws, (size_t)d * sizeof(float)) != 0;
                    }
                    g_cases++;
                }
            }
            cases++;
        }
    CHECK(bad_g == 0, "attention steps: %d heads of %d grouped calls differ from one-head calls", bad_g, g_cases);
    CHECK(bad_sc == 0, "attention steps: scalar table differs from its definition in %d values", bad_sc);
    CHECK(bad_av == 0, "attention steps: %s outside the rounding bound in %d values (worst f16 dot %.3g)",
          av ? av->name : "-", bad_av, worst);
    printf("attention steps (f16, q4 groups): %d cases, %s f16 dot worst err / bound %.3f\n", cases, av ? av->name : "-", worst);
}

/* Every matmul case of one SIMD table against the scalar table and the
 * double reference (check_case). */
static void test_products(const spx_qkernels *sc, const spx_qkernels *av) {
    memset(&g_st, 0, sizeof g_st);
    /* 300x256, 9x4256 and 5x8448 cross the GEMMs' blocking: row blocks of
     * 64 rows, column chunks of 4096 (4256 / 32 = 133 blocks: a 5-block
     * odd tail; the avx512 table's chunks of 16 blocks end in a 5-block
     * tail too, its quads of 4 in a 1-block one). Tiled (cols % 128 == 0,
     * G32): 128 columns are one item (a 4-block chunk only), 384 one
     * chunk and a one-item tail, 4224 a one-item tail after a column
     * chunk; 17, 20, 33 and 300 rows end in a partial tile, 32x640 in a
     * whole one with a one-item tail (its last scale words are the
     * array's last bytes). */
    static const int64_t shapes[][2] = {{1, 32},    {3, 96},    {7, 160},   {64, 512},  {33, 2048},
                                        {256, 1536}, {300, 256}, {9, 4256}, {5, 8448},  {17, 128},
                                        {20, 384},  {19, 4224}, {32, 640}};
    static const int groups[] = {32, 64, 128};
    /* 33 and 40 reach the amx table's tile products (SPX_AMX_MIN_T = 32
     * tokens and more: whole and partial 16-token tiles) */
    static const int64_t Ts[] = {1, 2, 3, 5, 8, 12, 16, 17, 33, 40};
    /* Bits 2 and 3 (items of 4 blocks, qtensor.h): 32, 96 and 160 columns
     * end in a partial item with 1 or 3 blocks (an odd last block: lane 1
     * cleared), 2048 and 4256 cross the GEMM's column chunks (4256: a
     * 5-block tail, 4 of them in one item); every shape at every width. */
    static const int widths[] = {4, 2, 3};
    /* the sanitizer pass (tests/run.sh quick: SPECTRA_TEST_QUICK) takes the
     * token counts 1 (the GEMV path), 3, 12 (the decode-sized products of
     * 2..16 tokens: whole rows, a tiled matrix in balanced passes of <= 8
     * tokens, here 6 + 6), 17 (the GEMM's blocks: 8 + 8 + 1) and, for the
     * amx table, 40, for CI's time; the normal pass runs every count */
    const int quick = getenv("SPECTRA_TEST_QUICK") != NULL, amx = !strcmp(av->name, "amx");
    for (size_t bi = 0; bi < 3; bi++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (size_t gi = 0; gi < 3; gi++) {
                int64_t rows = shapes[si][0], cols = shapes[si][1];
                int group = groups[gi], bits = widths[bi];
                if (cols % group) continue;
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                    const int64_t T = Ts[ti];
                    if (quick && T != 1 && T != 3 && T != 12 && T != 17 && !(amx && T == 40)) continue;
                    if (T > 17 && !amx && (quick || rows * cols > 300 * 256)) continue; /* the GEMM's blocking is 17's */
                    check_case(sc, av, rows, cols, group, bits, 0, T);
                    check_case(sc, av, rows, cols, group, bits, 1, T);
                    check_case(sc, av, rows, cols, group, bits, cols / 33 + 2, T);
                }
            }
    /* every outlier count up to 3% of 512 columns */
    for (size_t bi = 0; bi < 3; bi++)
        for (int64_t no = 0; no <= 15; no++)
            for (size_t gi = 0; gi < 3; gi++) {
                check_case(sc, av, 64, 512, groups[gi], widths[bi], no, 1);
                check_case(sc, av, 64, 512, groups[gi], widths[bi], no, 5);
                if (amx) check_case(sc, av, 64, 512, groups[gi], widths[bi], no, 33);
            }
    /* group sizes without a fast path: the scalar table's numbers */
    check_case(sc, av, 9, 256, 16, 4, 2, 3);
    check_case(sc, av, 5, 512, 256, 4, 2, 2);
    check_case(sc, av, 5, 512, 256, 3, 2, 2);
    check_case(sc, av, 5, 512, 256, 2, 2, 1);
    check_case(sc, av, 5, 512, 256, 4, 2, 33);

    if (g_st.cases)
        printf("%s int8 path: %lld cases; worst |err| / int8 bound %.3f; ||err|| / ||y||: mean "
               "%.2e, worst %.2e (%s)\n",
               av->name, (long long)g_st.cases, g_st.worst_ratio_int8, g_st.sum_rms / (double)g_st.cases,
               g_st.worst_rms, g_st.worst_rms_case);
    /* Every width takes the int8 path (not the scalar fallback, whose
     * float error is ~1e-7): its activation rounding shows as ~1e-2. */
    for (int b = 2; b <= 4; b++) {
        const double m = g_st.cases_w[b] ? g_st.sum_rms_w[b] / (double)g_st.cases_w[b] : 0;
        printf("  %d-bit: %lld cases, mean ||err|| / ||y|| %.2e\n", b, (long long)g_st.cases_w[b], m);
        CHECK(g_st.cases_w[b] > 0 && m > 1e-4, "%d-bit: the %s table did not run its int8 path (mean err %.2e)", b,
              av->name, m);
    }
}

int main(void) {
    test_dispatch();
    const spx_qkernels *sc = spx_qkernels_scalar();
    /* every SIMD table this CPU runs, each against the scalar reference */
    static const char *const simd[] = {"avx2", "avx512", "amx"};
    for (size_t i = 0; i < sizeof simd / sizeof simd[0]; i++) {
        const spx_qkernels *av = spx_qkernels_get(simd[i]);
        if (!av) {
            printf("note: this CPU (or build, or OS) lacks the %s table's features: not tested\n", simd[i]);
            continue;
        }
        test_attention_steps(sc, av);
        test_softmax(sc, av);
        test_products(sc, av);
    }
    return tl_finish("test_kernels");
}
