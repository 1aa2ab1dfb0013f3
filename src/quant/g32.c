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
    if (cols <= 0 || cols % group != 0)
        return spx_fail(e, SPX_ERR_ARG,
                        "quantization: %lld columns is not a positive multiple of the group size %d",
                        (long long)cols, group);
    return SPX_OK;
}

static int params_ok(int bits, int group, int64_t cols) {
    return bits >= 2 && bits <= 4 && group >= 8 && group % 8 == 0 && group <= SPX_Q_GROUP_MAX &&
           cols > 0 && cols % group == 0;
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
 * Packing
 * ==================================================================== */

int spx_q_code_get(const uint8_t *codes_row, int64_t col, int bits, int group) {
    int cpb = spx_q_codes_per_byte(bits), w = 8 / cpb, B = group / cpb;
    int64_t g = col / group;
    int k = (int)(col % group);
    uint8_t byte = codes_row[g * B + k % B];
    return (byte >> ((k / B) * w)) & ((1 << w) - 1);
}

void spx_q_code_set(uint8_t *codes_row, int64_t col, int bits, int group, int q) {
    int cpb = spx_q_codes_per_byte(bits), w = 8 / cpb, B = group / cpb;
    int64_t g = col / group;
    int k = (int)(col % group), sh = (k / B) * w;
    uint8_t *p = &codes_row[g * B + k % B];
    uint8_t mask = (uint8_t)(((1 << w) - 1) << sh);
    *p = (uint8_t)((*p & ~mask) | ((q << sh) & mask));
}

void spx_q_unpack_group(const uint8_t *gcodes, int bits, int group, uint8_t *q) {
    if (bits > 2) {
        int B = group / 2;
        for (int k = 0; k < B; k++) {
            q[k] = gcodes[k] & 0xf;
            q[k + B] = gcodes[k] >> 4;
        }
    } else {
        int B = group / 4;
        for (int k = 0; k < B; k++) {
            uint8_t c = gcodes[k];
            q[k] = c & 3;
            q[k + B] = (c >> 2) & 3;
            q[k + 2 * B] = (c >> 4) & 3;
            q[k + 3 * B] = c >> 6;
        }
    }
}

static void pack_group(const uint8_t *q, int bits, int group, uint8_t *gcodes) {
    if (bits > 2) {
        int B = group / 2;
        for (int k = 0; k < B; k++) gcodes[k] = (uint8_t)(q[k] | (q[k + B] << 4));
    } else {
        int B = group / 4;
        for (int k = 0; k < B; k++)
            gcodes[k] = (uint8_t)(q[k] | (q[k + B] << 2) | (q[k + 2 * B] << 4) | (q[k + 3 * B] << 6));
    }
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

/* Search grid: scale factors f = 1.2, 1.17, ..., 0.75 (MSE_GRID of them)
 * times the zero-including range / n, each with z0 = round(-f lo / s) and
 * its two neighbours (asymmetric clipping); then least-squares refits of
 * s from the best (z fixed, and z +- 1) while they improve. f > 1 matters:
 * with an integer z a slightly wider step often aligns the grid with both
 * ends better. On N(0,1) groups of 32 (4-bit) this reaches within 0.1% of
 * an exhaustive search over every fp16 s and z (7.652% vs 7.643% relative
 * error; MINMAX 8.081%) at ~10x MINMAX's cost. */
#define MSE_GRID 16
#define MSE_F_HI 1.2f
#define MSE_F_STEP 0.03f
#define MSE_LOCAL_ITERS 4

static void mse_search_run(mse_search *m, float lo, float hi) {
    for (int i = 0; i < MSE_GRID; i++) {
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
    int B = group / spx_q_codes_per_byte(bits);
    uint8_t q[GROUP_MAX];
    memset(zeros, 0, (size_t)spx_q_zeros_row_bytes(cols, group));
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * group;
        int z;
        quantize_group(w + c0, is_outlier ? is_outlier + c0 : NULL, imp ? imp + c0 : NULL, group,
                       bits, method, q, &scales[g], &z);
        pack_group(q, bits, group, codes + g * B);
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

/* Group g's codes (B = group / cpb bytes at gc) minus z, times s, into o
 * (o[k] for code k). No buffer, so any group size is safe here. */
static void dequant_group(const uint8_t *gc, int bits, int group, int z, float s, float *o) {
    if (bits > 2) {
        int B = group / 2;
        for (int k = 0; k < B; k++) {
            o[k] = (float)((gc[k] & 0xf) - z) * s;
            o[k + B] = (float)((gc[k] >> 4) - z) * s;
        }
    } else {
        int B = group / 4;
        for (int k = 0; k < B; k++)
            for (int j = 0; j < 4; j++) o[k + j * B] = (float)(((gc[k] >> (2 * j)) & 3) - z) * s;
    }
}

void spx_q_dequantize_row(const uint8_t *codes, const uint16_t *scales, const uint8_t *zeros,
                          int64_t cols, int bits, int group, float *out) {
    int B = group / spx_q_codes_per_byte(bits);
    for (int64_t g = 0; g < cols / group; g++)
        dequant_group(codes + g * B, bits, group, spx_q_zero_get(zeros, g),
                      spx_f16_to_f32(scales[g]), out + g * group);
}

spx_status spx_q_tile(const spx_qtensor *src, uint8_t *codes, uint16_t *scales, uint8_t *zeros,
                      spx_qtensor *dst, spx_err *e) {
    if (src->layout != SPX_Q_ROWS || !spx_q_tiled_ok(src->bits, src->group, src->cols) || src->rows < 1)
        return spx_fail(e, SPX_ERR_ARG,
                        "spx_q_tile: a [%lld, %lld] matrix of %d-bit codes in groups of %d (layout %d) cannot be "
                        "tiled (needs 4 bits, groups of 32, cols a multiple of 128, row-major)",
                        (long long)src->rows, (long long)src->cols, (int)src->bits, (int)src->group,
                        (int)src->layout);
    int64_t sr = spx_q_stored_rows(src->rows, SPX_Q_TILED), ng = spx_q_groups(src->cols, 32);
    *dst = *src;
    dst->codes = codes;
    dst->scales = scales;
    dst->zeros = zeros;
    dst->layout = SPX_Q_TILED;
    memset(zeros, 0, (size_t)spx_q_zeros_bytes(src->rows, src->cols, 32, SPX_Q_TILED));
    for (int64_t r = 0; r < sr; r++)
        for (int64_t g = 0; g < ng; g++) {
            /* the accessors name each slot; dst's arrays are the caller's (writable) */
            uint8_t *gc = (uint8_t *)spx_q_group_codes(dst, r, g);
            int64_t slot = spx_q__tiled_slot(dst, r, g);
            if (r < src->rows) {
                memcpy(gc, spx_q_group_codes(src, r, g), 16);
                scales[2 * slot + ((r >> 3) & 1)] = spx_q_group_scale(src, r, g);
                zeros[slot] |= (uint8_t)(spx_q_group_zero(src, r, g) << ((r & 8) >> 1));
            } else {
                memset(gc, 0, 16);
                scales[2 * slot + ((r >> 3) & 1)] = 0;
            }
        }
    return SPX_OK;
}

spx_status spx_q_tile_alloc(const spx_qtensor *src, spx_qtensor *dst, void **mem, spx_err *e) {
    *mem = NULL;
    if (src->layout != SPX_Q_ROWS || !spx_q_tiled_ok(src->bits, src->group, src->cols) || src->rows < 1)
        return spx_q_tile(src, NULL, NULL, NULL, dst, e); /* its message */
    size_t cb = (size_t)spx_q_codes_bytes(src->rows, src->cols, 4, SPX_Q_TILED);
    size_t sb = (size_t)spx_q_scales_bytes(src->rows, src->cols, 32, SPX_Q_TILED);
    size_t zb = (size_t)spx_q_zeros_bytes(src->rows, src->cols, 32, SPX_Q_TILED);
    uint8_t *m = malloc(cb + sb + zb);
    if (!m)
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory tiling a [%lld, %lld] matrix (%zu bytes)",
                        (long long)src->rows, (long long)src->cols, cb + sb + zb);
    spx_status st = spx_q_tile(src, m, (uint16_t *)(m + cb), m + cb + sb, dst, e);
    if (st != SPX_OK) {
        free(m);
        return st;
    }
    *mem = m;
    return SPX_OK;
}

spx_status spx_q_untile_alloc(const spx_qtensor *src, spx_qtensor *dst, void **mem, spx_err *e) {
    *mem = NULL;
    if (src->layout != SPX_Q_TILED || !spx_q_tiled_ok(src->bits, src->group, src->cols) || src->rows < 1)
        return spx_fail(e, SPX_ERR_ARG, "spx_q_untile_alloc: the [%lld, %lld] matrix is not tiled",
                        (long long)src->rows, (long long)src->cols);
    size_t cb = (size_t)spx_q_codes_bytes(src->rows, src->cols, 4, SPX_Q_ROWS);
    size_t sb = (size_t)spx_q_scales_bytes(src->rows, src->cols, 32, SPX_Q_ROWS);
    size_t zb = (size_t)spx_q_zeros_bytes(src->rows, src->cols, 32, SPX_Q_ROWS);
    uint8_t *m = calloc(1, cb + sb + zb); /* zeroed: the zero nibbles are or-ed in */
    if (!m)
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory untiling a [%lld, %lld] matrix (%zu bytes)",
                        (long long)src->rows, (long long)src->cols, cb + sb + zb);
    *dst = *src;
    dst->codes = m;
    dst->scales = (const uint16_t *)(m + cb);
    dst->zeros = m + cb + sb;
    dst->layout = SPX_Q_ROWS;
    int64_t ng = spx_q_groups(src->cols, 32), zrb = spx_q_zeros_row_bytes(src->cols, 32);
    for (int64_t r = 0; r < src->rows; r++)
        for (int64_t g = 0; g < ng; g++) {
            memcpy(m + r * (src->cols / 2) + g * 16, spx_q_group_codes(src, r, g), 16);
            ((uint16_t *)(m + cb))[r * ng + g] = spx_q_group_scale(src, r, g);
            m[cb + sb + r * zrb + (g >> 1)] |= (uint8_t)(spx_q_group_zero(src, r, g) << ((g & 1) * 4));
        }
    *mem = m;
    return SPX_OK;
}

spx_status spx_q_as_layout(const spx_qtensor *src, int row_major, spx_qtensor *dst, void **mem, spx_err *e) {
    if (!row_major && src->layout == SPX_Q_ROWS && spx_q_tiled_ok(src->bits, src->group, src->cols))
        return spx_q_tile_alloc(src, dst, mem, e);
    if (row_major && src->layout == SPX_Q_TILED) return spx_q_untile_alloc(src, dst, mem, e);
    *dst = *src;
    *mem = NULL;
    return SPX_OK;
}

void spx_q_dequant_row_f32(const spx_qtensor *q, int64_t row, float *out) {
    for (int64_t g = 0; g < q->cols / q->group; g++)
        dequant_group(spx_q_group_codes(q, row, g), q->bits, q->group, spx_q_group_zero(q, row, g),
                      spx_f16_to_f32(spx_q_group_scale(q, row, g)), out + g * q->group);
    const uint16_t *ov = q->outlier_val + row * q->n_outliers;
    for (int64_t j = 0; j < q->n_outliers; j++) out[q->outlier_idx[j]] += spx_f16_to_f32(ov[j]);
}

float spx_q_dot_row(const spx_qtensor *q, int64_t row, const float *x) {
    int group = q->group, bits = q->bits, B = group / spx_q_codes_per_byte(bits);
    double acc = 0;
    for (int64_t g = 0; g < q->cols / group; g++) {
        float z = (float)spx_q_group_zero(q, row, g), a = 0;
        const uint8_t *gc = spx_q_group_codes(q, row, g);
        const float *xg = x + g * group;
        if (bits > 2) {
            for (int k = 0; k < B; k++)
                a += ((float)(gc[k] & 0xf) - z) * xg[k] + ((float)(gc[k] >> 4) - z) * xg[k + B];
        } else {
            for (int k = 0; k < B; k++)
                for (int j = 0; j < 4; j++) a += ((float)((gc[k] >> (2 * j)) & 3) - z) * xg[k + j * B];
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
