/* g32.c: scalar reference of Group-wise asymmetric quantization: the
 * MINMAX rule, the MSE search, packing, dequantization and the fused dot
 * products. The numbers are defined in g32.h; every SIMD/CUDA kernel and
 * the compressor are checked against this file. */
#include "quant/g32.h"
#include "core/half.h"
#include "core/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GROUP_MAX SPX_Q_GROUP_MAX /* quantization uses stack buffers of this size */

/* ======================================================================
 * Parameters and the scalar rules
 * ==================================================================== */

spx_status spx_q_check_params(int bits, int group, int64_t cols, spx_err *e) {
    if (bits < 2 || bits > 4)
        return spx_fail(e, SPX_ERR_ARG, "quantization bits %d: expected 2, 3 or 4", bits);
    if (group < 8 || group % 8 != 0)
        return spx_fail(e, SPX_ERR_ARG, "quantization group %d: expected a positive multiple of 8",
                        group);
    if (group > SPX_Q_GROUP_MAX)
        return spx_fail(e, SPX_ERR_ARG, "quantization group %d: at most %d", group, SPX_Q_GROUP_MAX);
    if (bits < 4 && group % 32 != 0)
        return spx_fail(e, SPX_ERR_ARG,
                        "quantization group %d: %d-bit codes are packed in blocks of 32, so the group must be "
                        "a multiple of 32", group, bits);
    if (cols <= 0 || cols % group != 0)
        return spx_fail(e, SPX_ERR_ARG,
                        "quantization: %lld columns is not a positive multiple of the group size %d",
                        (long long)cols, group);
    return SPX_OK;
}

static int params_ok(int bits, int group, int64_t cols) {
    return bits >= 2 && bits <= 4 && group >= 8 && group % 8 == 0 && group <= SPX_Q_GROUP_MAX &&
           (bits == 4 || group % 32 == 0) && cols > 0 && cols % group == 0;
}

/* fp16 bits of a positive float32 scale, kept in (0, 65504]. */
static uint16_t scale_to_f16(float s32) {
    if (!(s32 >= 1e-8f)) s32 = 1e-8f; /* also catches NaN */
    uint16_t h = spx_f32_to_f16(s32);
    if (h >= 0x7c00u) h = SPX_Q_SCALE_F16_MAX; /* s32 >= 65520 rounds to inf */
    if (h == 0) h = SPX_Q_SCALE_F16_MIN;       /* s32 < 2^-25 rounds to 0 */
    return h;
}

float spx_q_scale32(float wmin, float wmax, int bits) {
    float s32 = (wmax - wmin) / (float)((1 << bits) - 1);
    return s32 >= 1e-8f ? s32 : 1e-8f;
}

uint16_t spx_q_scale_f16(float wmin, float wmax, int bits) {
    return scale_to_f16(spx_q_scale32(wmin, wmax, bits));
}

/* clamp(round(u), 0, n) with round half away from zero (= roundf for the
 * u >= 0 that survive the clamp, without a libm call; u + 0.5f would be
 * wrong for u = 0.49999997f); NaN -> 0. */
static inline int round_clamp(float u, int n) {
    if (!(u >= 0.0f)) return 0; /* negative or NaN */
    if (u >= (float)n) return n;
    int i = (int)u;
    return i + (u - (float)i >= 0.5f); /* u - i is exact */
}

int spx_q_zero_point(float wmin, float s, int bits) {
    return round_clamp(-wmin / s, (1 << bits) - 1);
}

double spx_q_prop2_slack(int bits, float s32, uint16_t s_f16) {
    int n = (1 << bits) - 1;
    double s = spx_f16_to_f32(s_f16);
    /* The true range / n is within a factor (1 + 2^-22) of s32 (two float
     * roundings); the float32 evaluation of w/s + z is within 3 * 2^-20. */
    double shrink = (double)s32 * (1.0 + 0x1p-22) / s - 1.0;
    return (shrink > 0 ? n * shrink : 0.0) + 0x1p-18;
}

/* ======================================================================
 * Quantization of one group
 * ==================================================================== */

/* Codes of w under (s, z) (outlier slots get z); returns the squared error
 * sum(imp * (w - (q - z) s)^2) over non-outliers, in double. */
static double group_codes(const float *w, const uint8_t *fl, const float *imp, int G, float s,
                          int z, int n, uint8_t *q) {
    double err = 0;
    for (int k = 0; k < G; k++) {
        if (fl && fl[k]) {
            q[k] = (uint8_t)z;
            continue;
        }
        int c = round_clamp(w[k] / s + (float)z, n);
        q[k] = (uint8_t)c;
        double d = (double)w[k] - (double)(c - z) * (double)s;
        err += (imp ? (double)imp[k] : 1.0) * d * d;
    }
    return err;
}

/* ---- SPX_Q_MSE search --------------------------------------------------
 * The search runs on a compacted copy of the group's non-outlier entries
 * (v[], weights iw[]), padded to a multiple of 8 with v = 0, iw = 0 (which
 * add no error), so the evaluator is branch-free and vectorizes. It uses
 * float32 and a reciprocal multiply; the chosen (s, z) is then re-coded
 * with the exact rule and its exact error compared with MINMAX's, so the
 * result never depends on the search's shortcuts being exact. */
typedef struct {
    float v[GROUP_MAX], iw[GROUP_MAX];
    int m;              /* padded count, multiple of 8 */
    int n;              /* 2^bits - 1 */
    float best_err;
    uint16_t best_s;
    int best_z;
} mse_search;

/* sum iw (v - (q - z) s)^2 with q the nearest code (ties may go either
 * way: fine for a search). */
static float mse_eval(const mse_search *m, float s, int z) {
    float inv = 1.0f / s, zf = (float)z, nf = (float)m->n;
    float acc[8] = {0};
    for (int k0 = 0; k0 < m->m; k0 += 8) {
        for (int l = 0; l < 8; l++) {
            float w = m->v[k0 + l];
            float u = w * inv + zf;
            u = u < 0.0f ? 0.0f : u;
            u = u > nf ? nf : u;
            float q = (float)(int)(u + 0.5f);
            float d = w - (q - zf) * s;
            acc[l] += m->iw[k0 + l] * d * d;
        }
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void mse_try(mse_search *m, uint16_t s_h, int z) {
    if (z < 0 || z > m->n || s_h == 0 || s_h >= 0x7c00u) return;
    float err = mse_eval(m, spx_f16_to_f32(s_h), z);
    if (err < m->best_err) {
        m->best_err = err;
        m->best_s = s_h;
        m->best_z = z;
    }
}

/* Least-squares scale for the codes that (s, z) gives, z fixed:
 * s' = sum iw v (q - z) / sum iw (q - z)^2; 0 when undefined. */
static float mse_refit(const mse_search *m, float s, int z) {
    float inv = 1.0f / s, zf = (float)z, nf = (float)m->n;
    float num[8] = {0}, den[8] = {0};
    for (int k0 = 0; k0 < m->m; k0 += 8) {
        for (int l = 0; l < 8; l++) {
            float w = m->v[k0 + l];
            float u = w * inv + zf;
            u = u < 0.0f ? 0.0f : u;
            u = u > nf ? nf : u;
            float a = (float)(int)(u + 0.5f) - zf;
            num[l] += m->iw[k0 + l] * w * a;
            den[l] += m->iw[k0 + l] * a * a;
        }
    }
    float N = 0, D = 0;
    for (int l = 0; l < 8; l++) N += num[l], D += den[l];
    return D > 0 && N > 0 ? N / D : 0.0f;
}

/* Search grid: scale factors f = 1.2, 1.17, ..., 0.75 (MSE_GRID of them;
 * down to 0.45 for 2 bits, MSE_GRID_2BIT, whose best step clips much
 * more of a group's range) times the zero-including range / n, each with
 * z0 = round(-f lo / s) and its two neighbours (asymmetric clipping);
 * then least-squares refits of s from the best (z fixed, and z +- 1)
 * while they improve. f > 1 matters: with an integer z a slightly wider
 * step often aligns the grid with both ends better. On N(0,1) groups of
 * 32 and 128 this reaches an exhaustive search over every fp16 s and z to
 * within 0.1% of relative error at every width (bench/results/
 * 2026-12-02-lowbit-formats.md) at ~10x MINMAX's cost. */
#define MSE_GRID 16
#define MSE_GRID_2BIT 26
#define MSE_F_HI 1.2f
#define MSE_F_STEP 0.03f
#define MSE_LOCAL_ITERS 4

static void mse_search_run(mse_search *m, float lo, float hi) {
    const int grid = m->n == 3 ? MSE_GRID_2BIT : MSE_GRID;
    for (int i = 0; i < grid; i++) {
        float f = MSE_F_HI - (float)i * MSE_F_STEP;
        uint16_t s_h = scale_to_f16(f * (hi - lo) / (float)m->n);
        int z0 = round_clamp(-(f * lo) / spx_f16_to_f32(s_h), m->n);
        for (int dz = -1; dz <= 1; dz++) mse_try(m, s_h, z0 + dz);
    }
    for (int it = 0; it < MSE_LOCAL_ITERS; it++) {
        uint16_t s0 = m->best_s;
        int z0 = m->best_z;
        for (int dz = -1; dz <= 1; dz++) {
            if (z0 + dz < 0 || z0 + dz > m->n) continue;
            float s_ls = mse_refit(m, spx_f16_to_f32(s0), z0 + dz);
            if (s_ls > 0) mse_try(m, scale_to_f16(s_ls), z0 + dz);
        }
        if (m->best_s == s0 && m->best_z == z0) break;
    }
}

/* Replaces (*s_h, *z) by the search's choice when it is strictly better
 * under the exact rule; q holds the codes of the result. */
static void quantize_group_mse(const float *w, const uint8_t *fl, const float *imp, int G, int n,
                               float wmin, float wmax, double err_minmax, uint8_t *q,
                               uint16_t *s_h, int *z) {
    /* The grid always contains 0 (z is an integer code), so the range worth
     * covering is the zero-including one; this also repairs one-sided
     * groups, where MINMAX clips everything to [0, range]. */
    float lo = wmin < 0 ? wmin : 0, hi = wmax > 0 ? wmax : 0;
    if (!(hi - lo > 0)) return; /* no non-zero entry: MINMAX is exact */
    mse_search m;
    int c = 0;
    for (int k = 0; k < G; k++) {
        if (fl && fl[k]) continue;
        m.v[c] = w[k];
        m.iw[c++] = imp ? imp[k] : 1.0f;
    }
    for (; c % 8; c++) m.v[c] = m.iw[c] = 0;
    m.m = c;
    m.n = n;
    m.best_s = *s_h;
    m.best_z = *z;
    m.best_err = mse_eval(&m, spx_f16_to_f32(*s_h), *z);
    mse_search_run(&m, lo, hi);
    if (m.best_s == *s_h && m.best_z == *z) return;
    uint8_t q2[GROUP_MAX];
    double err = group_codes(w, fl, imp, G, spx_f16_to_f32(m.best_s), m.best_z, n, q2);
    if (err < err_minmax) {
        *s_h = m.best_s;
        *z = m.best_z;
        memcpy(q, q2, (size_t)G);
    }
}

static void quantize_group(const float *w, const uint8_t *fl, const float *imp, int G, int bits,
                           int method, uint8_t *q, uint16_t *s_out, int *z_out) {
    int n = (1 << bits) - 1;
    float wmin = 0, wmax = 0;
    int any = 0;
    for (int k = 0; k < G; k++) {
        if (fl && fl[k]) continue;
        if (!any) {
            wmin = wmax = w[k];
            any = 1;
        } else {
            if (w[k] < wmin) wmin = w[k];
            if (w[k] > wmax) wmax = w[k];
        }
    }
    uint16_t s_h = spx_q_scale_f16(wmin, wmax, bits);
    float s = spx_f16_to_f32(s_h);
    int z = spx_q_zero_point(wmin, s, bits);
    double err = group_codes(w, fl, imp, G, s, z, n, q);
    if (method == SPX_Q_MSE && err > 0)
        quantize_group_mse(w, fl, imp, G, n, wmin, wmax, err, q, &s_h, &z);
    *s_out = s_h;
    *z_out = z;
}

spx_status spx_q_quantize_row_imp(const float *w, int64_t cols, const uint8_t *is_outlier,
                                  const float *imp, int bits, int group, int method,
                                  uint8_t *codes, uint16_t *scales, uint8_t *zeros) {
    if (!params_ok(bits, group, cols) || (method != SPX_Q_MINMAX && method != SPX_Q_MSE))
        return SPX_ERR_ARG;
    int64_t ng = cols / group;
    uint8_t q[GROUP_MAX];
    memset(zeros, 0, (size_t)spx_q_zeros_row_bytes(cols, group));
    if (bits != 4) memset(codes, 0, (size_t)spx_q_codes_row_bytes(cols, bits)); /* item padding: code 0 */
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * group;
        int z;
        quantize_group(w + c0, is_outlier ? is_outlier + c0 : NULL, imp ? imp + c0 : NULL, group,
                       bits, method, q, &scales[g], &z);
        spx_q_pack_group(codes, g, bits, group, q);
        zeros[g >> 1] |= (uint8_t)(z << ((g & 1) * 4));
    }
    return SPX_OK;
}

spx_status spx_q_quantize_row(const float *w, int64_t cols, const uint8_t *is_outlier, int bits,
                              int group, int method, uint8_t *codes, uint16_t *scales,
                              uint8_t *zeros) {
    return spx_q_quantize_row_imp(w, cols, is_outlier, NULL, bits, group, method, codes, scales,
                                  zeros);
}

/* ======================================================================
 * Dequantization and dot products
 * ==================================================================== */

/* Group g of a row (codes_row) minus z, times s, into o (o[k] for code
 * k). 4-bit reads its bytes in place; bits 2 and 3 unpack the group first
 * (group <= SPX_Q_GROUP_MAX, checked wherever a matrix is made). */
static void dequant_group(const uint8_t *codes_row, int64_t g, int bits, int group, int z, float s, float *o) {
    if (bits == 4) {
        const uint8_t *gc = codes_row + g * (group / 2);
        int B = group / 2;
        for (int k = 0; k < B; k++) {
            o[k] = (float)((gc[k] & 0xf) - z) * s;
            o[k + B] = (float)((gc[k] >> 4) - z) * s;
        }
        return;
    }
    uint8_t q[GROUP_MAX];
    spx_q_unpack_group(codes_row, g, bits, group, q);
    for (int k = 0; k < group; k++) o[k] = (float)(q[k] - z) * s;
}

void spx_q_dequantize_row(const uint8_t *codes, const uint16_t *scales, const uint8_t *zeros,
                          int64_t cols, int bits, int group, float *out) {
    for (int64_t g = 0; g < cols / group; g++)
        dequant_group(codes, g, bits, group, spx_q_zero_get(zeros, g), spx_f16_to_f32(scales[g]),
                      out + g * group);
}

void spx_q_dequant_row_f32(const spx_qtensor *q, int64_t row, float *out) {
    for (int64_t g = 0; g < q->cols / q->group; g++) {
        /* a tiled matrix is 4-bit: its group's 16 bytes read as group 0 of a row */
        const uint8_t *base = q->layout == SPX_Q_TILED ? spx_q_group_codes(q, row, g) : spx_q_row_codes(q, row);
        dequant_group(base, q->layout == SPX_Q_TILED ? 0 : g, q->bits, q->group, spx_q_group_zero(q, row, g),
                      spx_f16_to_f32(spx_q_group_scale(q, row, g)), out + g * q->group);
    }
    const uint16_t *ov = q->outlier_val + row * q->n_outliers;
    for (int64_t j = 0; j < q->n_outliers; j++) out[q->outlier_idx[j]] += spx_f16_to_f32(ov[j]);
}

float spx_q_dot_row(const spx_qtensor *q, int64_t row, const float *x) {
    int group = q->group, bits = q->bits, B = group / 2;
    uint8_t qs[GROUP_MAX];
    double acc = 0;
    for (int64_t g = 0; g < q->cols / group; g++) {
        float z = (float)spx_q_group_zero(q, row, g), a = 0;
        const float *xg = x + g * group;
        if (bits == 4) { /* in place: byte k holds codes k and k + G/2 */
            const uint8_t *gc = spx_q_group_codes(q, row, g);
            for (int k = 0; k < B; k++)
                a += ((float)(gc[k] & 0xf) - z) * xg[k] + ((float)(gc[k] >> 4) - z) * xg[k + B];
        } else { /* the same order: codes k and k + G/2 */
            spx_q_unpack_group(spx_q_row_codes(q, row), g, bits, group, qs);
            for (int k = 0; k < B; k++) a += ((float)qs[k] - z) * xg[k] + ((float)qs[k + B] - z) * xg[k + B];
        }
        acc += (double)spx_f16_to_f32(spx_q_group_scale(q, row, g)) * a;
    }
    const uint16_t *ov = q->outlier_val + row * q->n_outliers;
    for (int64_t j = 0; j < q->n_outliers; j++)
        acc += (double)spx_f16_to_f32(ov[j]) * x[q->outlier_idx[j]];
    return (float)acc;
}

void spx_q_dot_rows(const spx_qtensor *q, int64_t row, const float *x, int64_t n_tok,
                    int64_t x_stride, float *out, int64_t out_stride, float *scratch) {
    spx_q_dequant_row_f32(q, row, scratch);
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * x_stride;
        double acc = 0;
        for (int64_t c = 0; c < q->cols; c++) acc += (double)scratch[c] * xt[c];
        out[t * out_stride] = (float)acc;
    }
}

/* ======================================================================
 * spx_qbuf
 * ==================================================================== */

spx_status spx_qbuf_init(spx_qbuf *b, int64_t rows, int64_t cols, int bits, int group,
                         const int32_t *outlier_idx, int64_t n_outliers, spx_err *e) {
    memset(b, 0, sizeof *b);
    SPX_TRY(spx_q_check_params(bits, group, cols, e));
    if (rows <= 0 || n_outliers < 0 || n_outliers > cols || (n_outliers && !outlier_idx))
        return spx_fail(e, SPX_ERR_ARG, "quantized matrix: rows %lld, outliers %lld of %lld columns",
                        (long long)rows, (long long)n_outliers, (long long)cols);
    for (int64_t j = 0; j < n_outliers; j++)
        if (outlier_idx[j] < 0 || outlier_idx[j] >= cols || (j && outlier_idx[j] <= outlier_idx[j - 1]))
            return spx_fail(e, SPX_ERR_ARG,
                            "outlier index %lld is %d: expected strictly increasing in [0, %lld)",
                            (long long)j, outlier_idx[j], (long long)cols);
    b->codes_row_bytes = spx_q_codes_row_bytes(cols, bits);
    b->zeros_row_bytes = spx_q_zeros_row_bytes(cols, group);
    b->n_groups = spx_q_groups(cols, group);
    size_t r = (size_t)rows, tmp;
    if (!spx_mul_ok(r, (size_t)cols, &tmp) || !spx_mul_ok(r, (size_t)n_outliers + 1, &tmp) ||
        !spx_mul_ok(tmp, 2, &tmp))
        return spx_fail(e, SPX_ERR_ARG, "quantized matrix %lld x %lld: too large", (long long)rows,
                        (long long)cols);
    b->codes = malloc(r * (size_t)b->codes_row_bytes);
    b->scales = malloc(r * (size_t)b->n_groups * sizeof(uint16_t));
    b->zeros = malloc(r * (size_t)b->zeros_row_bytes);
    b->is_outlier = calloc((size_t)cols, 1);
    b->outlier_idx = malloc((size_t)(n_outliers ? n_outliers : 1) * sizeof(int32_t));
    b->outlier_val = malloc(r * (size_t)(n_outliers ? n_outliers : 1) * sizeof(uint16_t));
    if (!b->codes || !b->scales || !b->zeros || !b->is_outlier || !b->outlier_idx || !b->outlier_val) {
        spx_qbuf_free(b);
        return spx_fail(e, SPX_ERR_NOMEM, "quantized matrix %lld x %lld: out of memory",
                        (long long)rows, (long long)cols);
    }
    for (int64_t j = 0; j < n_outliers; j++) {
        b->outlier_idx[j] = outlier_idx[j];
        b->is_outlier[outlier_idx[j]] = 1;
    }
    b->q = (spx_qtensor){rows,      cols,     bits,          group,          n_outliers,
                         b->codes,  b->scales, b->zeros,     b->outlier_idx, b->outlier_val, SPX_Q_ROWS};
    return SPX_OK;
}

void spx_qbuf_free(spx_qbuf *b) {
    if (!b) return;
    free(b->codes);
    free(b->scales);
    free(b->zeros);
    free(b->is_outlier);
    free(b->outlier_idx);
    free(b->outlier_val);
    memset(b, 0, sizeof *b);
}

void spx_qbuf_set_row(spx_qbuf *b, int64_t row, const float *w, int method, const float *imp) {
    const spx_qtensor *q = &b->q;
    spx_q_quantize_row_imp(w, q->cols, q->n_outliers ? b->is_outlier : NULL, imp, q->bits,
                           q->group, method, b->codes + row * b->codes_row_bytes,
                           b->scales + row * b->n_groups, b->zeros + row * b->zeros_row_bytes);
    uint16_t *ov = b->outlier_val + row * q->n_outliers;
    for (int64_t j = 0; j < q->n_outliers; j++) {
        float v = w[b->outlier_idx[j]];
        v = v > 65504.0f ? 65504.0f : v < -65504.0f ? -65504.0f : v;
        ov[j] = spx_f32_to_f16(v);
    }
}
