/* refine.c: the scalar reference of weight refinement (refine.h): the
 * residual builders (4-bit columns with a per-row MSE scale, and float
 * columns), the per-chunk top-k radix select, the scalar apply that
 * defines the numbers, and the kernel dispatch. The AVX2 apply is in
 * refine_avx2.c and must match the scalar one bit for bit. */
#include "refine/refine.h"
#include "core/half.h"
#include "cpu/qkernels.h"
#include "quant/g32.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const spx_refine_kernels *spx_refine_avx2_table(void); /* refine_avx2.c; NULL off x86 */

/* ======================================================================
 * The per-row scale rule
 * ==================================================================== */

/* code = clamp(roundf(v * inv), -7, 7) (half away from zero); NaN cannot
 * reach here (residuals are checked finite first). Computed without a
 * libm call: after the clamp to [-7.5, 7.5] (which rounds to the same
 * code), t - trunc(t) is exact, so comparing it with +-1/2 is roundf. */
static inline int q4_code(float v, float inv) {
    float t = v * inv;
    if (t > SPX_REFINE_QMAX + 0.5f) t = SPX_REFINE_QMAX + 0.5f;
    if (t < -SPX_REFINE_QMAX - 0.5f) t = -SPX_REFINE_QMAX - 0.5f;
    int q = (int)t; /* toward zero */
    float f = t - (float)q;
    q += (f >= 0.5f) - (f <= -0.5f);
    if (q > SPX_REFINE_QMAX) q = SPX_REFINE_QMAX;
    if (q < -SPX_REFINE_QMAX) q = -SPX_REFINE_QMAX;
    return q;
}

/* sum (res - s q)^2 with the codes q that scale s gives, exactly in double
 * (s q is exact in double: 24 + 3 bits). */
static double row_err(const float *res, int64_t n, float s) {
    float inv = 1.0f / s;
    double err = 0;
    for (int64_t c = 0; c < n; c++) {
        double d = (double)res[c] - (double)s * q4_code(res[c], inv);
        err += d * d;
    }
    return err;
}

/* The candidate s = (a / 7) * t / 16, computed in double then rounded once;
 * 0 when it underflows (or 1/s would overflow), which the search skips. */
static float cand_scale(float a, double t) {
    float s = (float)((double)a * t / (SPX_REFINE_QMAX * 16.0));
    return (s > 0 && isfinite(1.0f / s)) ? s : 0.0f;
}

float spx_refine_q4_row_scale(const float *res, int64_t n) {
    float a = 0;
    for (int64_t c = 0; c < n; c++) a = fmaxf(a, fabsf(res[c]));
    if (!(a > 0)) return 0.0f;
    /* coarse t = 16, 14, .., 2; then t_best + 1, t_best - 1; then
     * t_best + 1/2, t_best - 1/2 (each stage around the best so far at its
     * start); t in (0, 16]; a strictly smaller error replaces the best, so
     * ties keep the earlier candidate */
    double best_t = 0, best_err = INFINITY;
    for (int t = 16; t >= 2; t -= 2) {
        float s = cand_scale(a, t);
        if (s == 0) continue;
        double err = row_err(res, n, s);
        if (err < best_err) best_err = err, best_t = t;
    }
    if (best_t == 0) return 0.0f; /* every candidate underflowed */
    static const double steps[2] = {1.0, 0.5};
    for (int st = 0; st < 2; st++) {
        double t0 = best_t;
        for (int sgn = 1; sgn >= -1; sgn -= 2) {
            double t = t0 + sgn * steps[st];
            if (t <= 0 || t > 16) continue;
            float s = cand_scale(a, t);
            if (s == 0) continue;
            double err = row_err(res, n, s);
            if (err < best_err) best_err = err, best_t = t;
        }
    }
    return cand_scale(a, best_t);
}

void spx_refine_q4_row_codes(const float *res, int64_t n, float s, int8_t *code) {
    if (!(s > 0)) {
        memset(code, 0, (size_t)n);
        return;
    }
    float inv = 1.0f / s;
    for (int64_t c = 0; c < n; c++) code[c] = (int8_t)q4_code(res[c], inv);
}

/* ======================================================================
 * Builders
 * ==================================================================== */

static spx_status check_shape(int64_t rows, int64_t cols, const char *what, spx_err *e) {
    if (rows < 1 || cols < 1 || cols > INT32_MAX || rows > ((int64_t)1 << 40))
        return spx_fail(e, SPX_ERR_ARG, "%s: shape [%lld, %lld]: expected rows >= 1 and 1 <= cols <= %d", what,
                        (long long)rows, (long long)cols, INT32_MAX);
    return SPX_OK;
}

spx_status spx_refine_q4buf_init(spx_refine_q4buf *b, int64_t rows, int64_t cols, int64_t col_stride,
                                 spx_err *e) {
    memset(b, 0, sizeof *b);
    SPX_TRY(check_shape(rows, cols, "refinement residual", e));
    int64_t cb = spx_refine_col_bytes(rows);
    if (col_stride == 0) col_stride = (cb + 63) / 64 * 64;
    if (col_stride < cb)
        return spx_fail(e, SPX_ERR_ARG, "refinement residual: column stride %lld bytes: expected >= %lld (%lld rows)",
                        (long long)col_stride, (long long)cb, (long long)rows);
    size_t bytes;
    if (__builtin_mul_overflow((size_t)cols, (size_t)col_stride, &bytes))
        return spx_fail(e, SPX_ERR_ARG, "refinement residual [%lld, %lld]: too large", (long long)rows,
                        (long long)cols);
    b->codes = malloc(bytes);
    b->scales = calloc((size_t)rows, sizeof(float));
    if (!b->codes || !b->scales) {
        spx_refine_q4buf_free(b);
        return spx_fail(e, SPX_ERR_NOMEM, "refinement residual [%lld, %lld]: out of memory (%zu bytes)",
                        (long long)rows, (long long)cols, bytes);
    }
    memset(b->codes, SPX_REFINE_ZERO * 0x11, bytes); /* every nibble (padding too) is code 0 */
    b->v = (spx_refine_q4){rows, cols, cb, col_stride, b->codes, b->scales};
    return SPX_OK;
}

void spx_refine_q4buf_free(spx_refine_q4buf *b) {
    free(b->codes);
    free(b->scales);
    memset(b, 0, sizeof *b);
}

/* res[cols] = w - W^[row], checked finite. */
static spx_status residual_row(const spx_qtensor *q, int64_t row, const float *w, float *what, float *res,
                               spx_err *e) {
    spx_q_dequant_row_f32(q, row, what);
    for (int64_t c = 0; c < q->cols; c++) {
        res[c] = w[c] - what[c];
        if (!isfinite(res[c]))
            return spx_fail(e, SPX_ERR_ARG,
                            "refinement residual: row %lld column %lld: W = %g, W^ = %g: expected finite values",
                            (long long)row, (long long)c, (double)w[c], (double)what[c]);
    }
    return SPX_OK;
}

static spx_status check_q(const spx_qtensor *q, int64_t rows, int64_t cols, spx_err *e) {
    if (q->rows != rows || q->cols != cols)
        return spx_fail(e, SPX_ERR_ARG, "refinement residual [%lld, %lld]: quantized matrix is [%lld, %lld]",
                        (long long)rows, (long long)cols, (long long)q->rows, (long long)q->cols);
    return SPX_OK;
}

/* Row r's scale (the row rule) and codes from its values res[cols];
 * code: cols bytes of scratch. */
static void put_row(spx_refine_q4buf *b, int64_t r, const float *res, int8_t *code) {
    const int64_t cols = b->v.cols, stride = b->v.col_stride;
    float s = spx_refine_q4_row_scale(res, cols);
    spx_refine_q4_row_codes(res, cols, s, code);
    b->scales[r] = s;
    int sh = (int)(r & 1) * 4;
    uint8_t keep = (uint8_t)(0xf0u >> sh);
    uint8_t *p = b->codes + (r >> 1);
    for (int64_t c = 0; c < cols; c++, p += stride)
        *p = (uint8_t)((*p & keep) | ((code[c] + SPX_REFINE_ZERO) << sh));
}

spx_status spx_refine_q4_set_rows(spx_refine_q4buf *b, const spx_qtensor *q, const float *w, int64_t ldw,
                                  int64_t r0, int64_t n, spx_err *e) {
    int64_t rows = b->v.rows, cols = b->v.cols;
    SPX_TRY(check_q(q, rows, cols, e));
    if (r0 < 0 || n < 0 || r0 + n > rows || ldw < cols)
        return spx_fail(e, SPX_ERR_ARG, "refinement residual: rows [%lld, %lld) with stride %lld of a [%lld, %lld] matrix",
                        (long long)r0, (long long)(r0 + n), (long long)ldw, (long long)rows, (long long)cols);
    float *what = malloc((size_t)cols * 2 * sizeof(float));
    int8_t *code = malloc((size_t)cols);
    if (!what || !code) {
        free(what);
        free(code);
        return spx_fail(e, SPX_ERR_NOMEM, "refinement residual: out of memory for a row of %lld", (long long)cols);
    }
    float *res = what + cols;
    spx_status st = SPX_OK;
    for (int64_t t = 0; t < n && st == SPX_OK; t++) {
        int64_t r = r0 + t;
        st = residual_row(q, r, w + t * ldw, what, res, e);
        if (st != SPX_OK) break;
        put_row(b, r, res, code);
    }
    free(what);
    free(code);
    return st;
}

spx_status spx_refine_q4_set_values(spx_refine_q4buf *b, const float *c, int64_t ldc, int64_t r0, int64_t n,
                                    spx_err *e) {
    const int64_t rows = b->v.rows, cols = b->v.cols;
    if (r0 < 0 || n < 0 || r0 + n > rows || ldc < cols)
        return spx_fail(e, SPX_ERR_ARG, "refinement values: rows [%lld, %lld) with stride %lld of a [%lld, %lld] matrix",
                        (long long)r0, (long long)(r0 + n), (long long)ldc, (long long)rows, (long long)cols);
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < cols; i++)
            if (!isfinite(c[t * ldc + i]))
                return spx_fail(e, SPX_ERR_ARG, "refinement values: row %lld, column %lld is not finite",
                                (long long)(r0 + t), (long long)i);
    int8_t *code = malloc((size_t)cols);
    if (!code) return spx_fail(e, SPX_ERR_NOMEM, "refinement values: out of memory for a row of %lld", (long long)cols);
    for (int64_t t = 0; t < n; t++) put_row(b, r0 + t, c + t * ldc, code);
    free(code);
    return SPX_OK;
}

spx_status spx_refine_q4_build(spx_refine_q4buf *b, const spx_qtensor *q, const float *w, spx_err *e) {
    SPX_TRY(spx_refine_q4buf_init(b, q->rows, q->cols, 0, e));
    spx_status st = spx_refine_q4_set_rows(b, q, w, q->cols, 0, q->rows, e);
    if (st != SPX_OK) spx_refine_q4buf_free(b);
    return st;
}

spx_status spx_refine_f32_build(spx_refine_f32 *b, const spx_qtensor *q, const float *w, spx_err *e) {
    memset(b, 0, sizeof *b);
    int64_t rows = q->rows, cols = q->cols;
    SPX_TRY(check_shape(rows, cols, "float refinement residual", e));
    size_t n;
    if (__builtin_mul_overflow((size_t)rows, (size_t)cols, &n) || __builtin_mul_overflow(n, sizeof(float), &n))
        return spx_fail(e, SPX_ERR_ARG, "float refinement residual [%lld, %lld]: too large", (long long)rows,
                        (long long)cols);
    b->data = malloc(n);
    float *what = malloc((size_t)cols * 2 * sizeof(float));
    if (!b->data || !what) {
        free(what);
        spx_refine_f32_free(b);
        return spx_fail(e, SPX_ERR_NOMEM, "float refinement residual [%lld, %lld]: out of memory", (long long)rows,
                        (long long)cols);
    }
    b->rows = rows;
    b->cols = cols;
    for (int64_t r = 0; r < rows; r++) {
        spx_status st = residual_row(q, r, w + r * cols, what, what + cols, e);
        if (st != SPX_OK) {
            free(what);
            spx_refine_f32_free(b);
            return st;
        }
        for (int64_t c = 0; c < cols; c++) b->data[c * rows + r] = what[cols + c];
    }
    free(what);
    return SPX_OK;
}

void spx_refine_f32_free(spx_refine_f32 *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

void spx_refine_f32_apply(const spx_refine_f32 *R, const int32_t *sel, int64_t n_sel, const float *x, float *y,
                          int64_t r0, int64_t r1) {
    if (n_sel <= 0) return;
    for (int64_t r = r0; r < r1; r++) {
        double acc = 0;
        for (int64_t j = 0; j < n_sel; j++) acc += (double)x[sel[j]] * R->data[(int64_t)sel[j] * R->rows + r];
        y[r] = (float)(y[r] + acc);
    }
}

/* ======================================================================
 * Selection: radix select on |x|
 * ==================================================================== */

/* Order-preserving key of |v|: the bits of a non-negative float order as
 * unsigned integers, so |v|'s bits + 1 (inf -> 0x7f800001), and NaN -> 0,
 * below every number. -0 and +0 share key 1. */
static inline uint32_t abs_key(float v) {
    uint32_t u = spx_f32_bits(v) & 0x7fffffffu;
    return u > 0x7f800000u ? 0u : u + 1u;
}

int64_t spx_refine_topk_max(int64_t n, int64_t chunk, int64_t k) {
    if (n <= 0 || chunk <= 0 || k <= 0) return 0;
    if (k >= chunk) return n;
    int64_t full = n / chunk, tail = n % chunk;
    return full * k + (tail < k ? tail : k);
}

/* The first radix digit: bits 30..20 of the key (its exponent and three
 * mantissa bits, so typical activations spread over its bins); the rest
 * of the key goes in two digits of 10 bits over the few keys that share
 * the k-th key's first digit. */
#define D0_SHIFT 20
#define NBIN 2048
#define TRASH NBIN /* pass 0's bin of skipped channels */

/* One chunk x[len] (skip: NULL or len flags), 1 <= k, len <= 
 * SPX_REFINE_CHUNK_MAX: writes the selected indices (+ base) in ascending
 * order to out[k] and returns how many (k, or every candidate if fewer).
 *   pass 0: histogram of the first digit -> the digit d0 of the k-th key;
 *           `need` of the keys with first digit d0 are to be taken.
 *   pass 1: indices with a larger first digit go to out (all taken, in
 *           order); keys with first digit d0 to a list (in order).
 *   list:   the same select on the list's two remaining digits, keeping
 *           the taken keys' indices in order, ties to the lower index.
 *   merge:  the two ascending index lists into out, from the back. */
static int64_t select_chunk(const float *x, int64_t len, const uint8_t *skip, int64_t k, int64_t base,
                            int32_t *out) {
    uint32_t hist[NBIN + 1];
    uint32_t lkey[SPX_REFINE_CHUNK_MAX];
    int32_t lidx[SPX_REFINE_CHUNK_MAX];
    int64_t need = k, w = 0;

    /* pass 0 */
    memset(hist, 0, sizeof hist);
    uint32_t d0 = 0; /* then: the largest first digit counted */
    for (int64_t i = 0; i < len; i++) {
        int sk = skip && skip[i];
        uint32_t dg = sk ? TRASH : abs_key(x[i]) >> D0_SHIFT;
        hist[dg]++;
        d0 = !sk && dg > d0 ? dg : d0;
    }
    if (k >= len - (int64_t)hist[TRASH]) { /* every candidate */
        for (int64_t i = 0; i < len; i++)
            if (!skip || !skip[i]) out[w++] = (int32_t)(base + i);
        return w;
    }
    for (; d0 > 0 && hist[d0] < need; d0--) need -= hist[d0];

    /* pass 1 */
    int64_t ns = 0, nl = 0;
    for (int64_t i = 0; i < len; i++) {
        if (skip && skip[i]) continue;
        uint32_t key = abs_key(x[i]), dg = key >> D0_SHIFT;
        if (dg > d0) {
            out[ns++] = (int32_t)(base + i);
        } else if (dg == d0) {
            lkey[nl] = key;
            lidx[nl++] = (int32_t)(base + i);
        }
    }

    /* the list: digits 19..10 and 9..0. Invariant: `need` (>= 1) of the
     * list's keys whose decided bits (hi) equal prefix are still to be
     * taken, at least that many exist, and keys above them are taken. */
    uint32_t prefix = 0, hi = 0;
    for (int sh = 10;; sh -= 10) {
        memset(hist, 0, 1024 * sizeof *hist);
        uint32_t d = 0;
        for (int64_t j = 0; j < nl; j++)
            if ((lkey[j] & hi) == prefix) {
                uint32_t dg = (lkey[j] >> sh) & 0x3ff;
                hist[dg]++;
                d = dg > d ? dg : d;
            }
        for (; d > 0 && hist[d] < need; d--) need -= hist[d];
        prefix |= d << sh;
        hi |= 0x3ffu << sh;
        if (hist[d] == need || sh == 0) break; /* all of digit d's keys, or the exact k-th key */
    }
    int64_t nt = 0; /* the list's taken indices, compacted in place (in order) */
    for (int64_t j = 0; j < nl; j++) {
        uint32_t kt = lkey[j] & hi;
        if (kt > prefix || (kt == prefix && need > 0)) {
            need -= kt == prefix;
            lidx[nt++] = lidx[j];
        }
    }

    /* merge */
    int64_t i = ns - 1, j = nt - 1;
    for (w = ns + nt - 1; j >= 0; w--) out[w] = (i >= 0 && out[i] > lidx[j]) ? out[i--] : lidx[j--];
    return ns + nt;
}

int64_t spx_refine_topk(const float *x, int64_t n, int64_t chunk, int64_t k, const uint8_t *skip, int32_t *out) {
    if (chunk < 1 || chunk > SPX_REFINE_CHUNK_MAX) return -1;
    if (n <= 0 || k <= 0) return 0;
    int64_t w = 0;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        int64_t len = n - c0 < chunk ? n - c0 : chunk;
        if (!skip && k >= len) { /* the whole chunk */
            for (int64_t i = 0; i < len; i++) out[w++] = (int32_t)(c0 + i);
            continue;
        }
        w += select_chunk(x + c0, len, skip ? skip + c0 : NULL, k, c0, out + w);
    }
    return w;
}

void spx_refine_skip_outliers(const spx_qtensor *q, uint8_t *skip) {
    memset(skip, 0, (size_t)q->cols);
    for (int64_t j = 0; j < q->n_outliers; j++) skip[q->outlier_idx[j]] = 1;
}

/* ======================================================================
 * Scalar apply: the reference
 * ==================================================================== */

/* Rows are taken in blocks of RB with RB accumulators; each row's numbers
 * are the chain of fmaf over the available columns in sel order, then one
 * multiply and one add (separate statements: no contraction). */
static void scalar_apply(const spx_refine_q4 *R, const int32_t *sel, const uint8_t *const *col, int64_t n_sel,
                         const float *x, float *y, int64_t r0, int64_t r1) {
    int any = 0;
    for (int64_t j = 0; j < n_sel && !any; j++) any = !col || col[j];
    if (!any) return; /* nothing available: y untouched, bit for bit */
    enum { RB = 64 };
    float acc[RB];
    for (int64_t rb = r0; rb < r1; rb += RB) {
        int nr = r1 - rb < RB ? (int)(r1 - rb) : RB;
        for (int t = 0; t < nr; t++) acc[t] = 0.0f;
        for (int64_t j = 0; j < n_sel; j++) {
            const uint8_t *c = col ? col[j] : spx_refine_q4_col(R, sel[j]);
            if (!c) continue;
            float xv = x[sel[j]];
            for (int t = 0; t < nr; t++) acc[t] = fmaf(xv, (float)spx_refine_code(c, rb + t), acc[t]);
        }
        for (int t = 0; t < nr; t++) {
            float p = R->scales[rb + t] * acc[t];
            y[rb + t] = y[rb + t] + p;
        }
    }
}

static float scalar_dot(const uint8_t *codes, const float *x, int64_t n) {
    float a[8] = {0};
    for (int64_t c = 0; c < n; c++) a[c & 7] = fmaf(x[c], (float)spx_refine_code(codes, c), a[c & 7]);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

static const spx_refine_kernels g_scalar = {.name = "scalar", .apply = scalar_apply, .dot = scalar_dot};

const spx_refine_kernels *spx_refine_kernels_scalar(void) { return &g_scalar; }

/* ======================================================================
 * Dispatch
 * ==================================================================== */

const spx_refine_kernels *spx_refine_kernels_avx2(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    const spx_refine_kernels *k = spx_refine_avx2_table();
    if (k && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return k;
#endif
    return NULL;
}

static const spx_refine_kernels *g_best;
static pthread_once_t g_best_once = PTHREAD_ONCE_INIT;

/* The quantized kernels' choice is the engine's one decision about SIMD
 * (SPECTRA_KERNELS and the CPU): scalar there means scalar here. */
static void best_init(void) {
    const spx_refine_kernels *k = NULL;
    if (strcmp(spx_qkernels_best()->name, "scalar") != 0) k = spx_refine_kernels_avx2();
    g_best = k ? k : &g_scalar;
}

const spx_refine_kernels *spx_refine_kernels_best(void) {
    pthread_once(&g_best_once, best_init);
    return g_best;
}
