/* test_quant.c: the quantization math (src/quant/g32, saliency, metrics,
 * experiment): golden bit-exact packing, the fp16 scale rule, Propositions
 * 2 and 3 as oracles, the fused dot products, outliers, the MSE search,
 * kurtosis and the adaptive outlier ratio, and the tiled layout's repack
 * (spx_q_tile) against the byte positions qtensor.h documents.
 *
 * Inputs are fresh random data (seeded), never zeros; outputs are poisoned
 * before the call that writes them. Tolerances are the named constants
 * below, each with its derivation. */
#include "testlib.h"

#include "core/half.h"
#include "quant/experiment.h"
#include "quant/g32.h"
#include "quant/metrics.h"
#include "quant/saliency.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- tolerances --------------------------------------------------------
 * DOT_RTOL: spx_q_dot_row sums each group's products (q - z) x in float32
 * (<= 31 roundings of 2^-24 relative to sum |terms|, ~1.9e-6), scales in
 * double and rounds the result to float (2^-24): |dot - exact| <= ~2e-6 *
 * sum_c |w^_c x_c|. 1e-5 leaves a 5x margin.
 *
 * PROP3_RTOL: Experiment A, measured relative error vs the prediction
 * sqrt(E[d^2]) / (15 sqrt 12). Derivation: per group the error sum is
 * 32 s^2 / 12 under the uniform-error model, with s = d / 15; sum w^2 is
 * 32 sigma^2, so rel^2 = E[d^2] / (225 * 12): the mean of d^2, not the
 * square of the mean (the paper's E[d] / (15 sqrt 12) = 7.97% is low by
 * the factor sqrt(1 + Var d / E[d]^2) ~ 1.014). The ends of a group are
 * not an exception: wmin and wmax both sit |z + wmin/s| < 1/2 step off the
 * grid, and that offset is ~uniform, so their error variance is s^2/12 too.
 * z is never clamped (a group of 32 N(0,1) is one-sided with probability
 * 2^-31). Error budget: sampling over 131072 groups: the per-group error
 * sum has CV ~0.37 (d^2 varies, CV 0.33; the 32 uniform errors, 0.16), the
 * per-group sum w^2 CV 0.25, so rel has a relative sd of ~0.06%; the fp16
 * rounding of s moves s^2 by at most 2^-10 relative per group (< 0.05% on
 * rel, and unbiased); the uniform model itself is an approximation for a
 * 15-step grid over a Gaussian. 1% covers 10 sd plus the rest; measured
 * agreement is ~0.01%.
 *
 * MSE_GAIN_MIN: the MSE search must lower Group-32 4-bit relative error on
 * N(0,1) by at least 3% (it measures ~5.3%: 8.08% -> 7.65%); at 3 bits by
 * 4% (~7.5%: 17.3% -> 16.0%), at 2 bits by 12% (~18.5%: 40.6% -> 33.1%),
 * where the best step clips far more of a group's range.
 * MSE_EXHAUSTIVE_RTOL: on N(0,1) groups of 32 the search's total squared
 * error is within this factor of the best over every fp16 scale in
 * [0.02, 3] and every zero point (it measures < 1.0005 at 2 and 3 bits; a
 * grid stopping at 0.75 of the range, enough for 4 bits, gives ~1.005 at
 * 2 bits).
 * MSE_TIE_RTOL: per-group squared errors are compared after summing in
 * this file's order; a tie could differ by a few ulps. */
#define DOT_RTOL 1e-5
#define PROP3_RTOL 0.01
#define MSE_GAIN_MIN 0.03
#define MSE_GAIN_MIN_3BIT 0.04
#define MSE_GAIN_MIN_2BIT 0.12
#define MSE_EXHAUSTIVE_RTOL 1.002
#define MSE_TIE_RTOL 1e-12
/* ONESIDED_RATIO: on a one-sided group (all w in [1, 1 + 0.1|N|]) MINMAX
 * clips everything to a grid over [0, range] (error ~1 per weight), the
 * MSE search covers [0, wmax] (error ~ (wmax / n)^2 / 12, n = 3 at 2 bits:
 * ~0.02): at least 20x lower squared error. */
#define ONESIDED_RATIO 0.05
#define KURT_NORMAL_TOL 0.06 /* sd of sample kurtosis ~ sqrt(24 / K) = 0.011 at K = 2e5 */

static const int BITS[3] = {2, 3, 4};
static const int GROUPS[3] = {32, 64, 128};

static float fp16v(uint16_t h) { return spx_f16_to_f32(h); }

/* ======================================================================
 * An independent re-statement of the rule (plain C, no shared code): the
 * library must agree with it bit for bit.
 * ==================================================================== */
static int ref_round(float u, int n) { /* clamp(round half away from zero) */
    float r = roundf(u);
    return r < 0 ? 0 : r > n ? n : (int)r;
}

static void ref_group(const float *w, const uint8_t *fl, int G, int bits, uint16_t *sh, int *z,
                      uint8_t *q) {
    int n = (1 << bits) - 1, any = 0;
    float mn = 0, mx = 0;
    for (int k = 0; k < G; k++) {
        if (fl && fl[k]) continue;
        if (!any || w[k] < mn) mn = w[k];
        if (!any || w[k] > mx) mx = w[k];
        any = 1;
    }
    float s32 = (mx - mn) / (float)n;
    if (s32 < 1e-8f) s32 = 1e-8f;
    uint16_t h = spx_f32_to_f16(s32);
    if (h == 0) h = 1;
    if (h >= 0x7c00) h = 0x7bff;
    float s = fp16v(h);
    *sh = h;
    *z = ref_round(-mn / s, n);
    for (int k = 0; k < G; k++) q[k] = (uint8_t)((fl && fl[k]) ? *z : ref_round(w[k] / s + (float)*z, n));
}

/* ======================================================================
 * Golden vectors
 * ==================================================================== */

/* 1 x 64, two groups of 32, 4 bits, worked by hand:
 * group 0: w_k = (k - 10) / 10: wmin = -1, wmax = 2.1, s32 = 3.1 / 15 =
 *   0.20666666; fp16 -> 0x329d = 0.20666504; z = round(1 / 0.20666504) =
 *   round(4.8387) = 5; q_0 = round(-1/s + 5) = round(0.161) = 0, q_1 =
 *   round(-0.9/s + 5) = round(0.645) = 1, q_16 = round(0.6/s + 5) =
 *   round(7.903) = 8, q_31 = round(2.1/s + 5) = round(15.161) -> 15.
 *   byte k = q_k | q_{k+16} << 4: byte 0 = 0 | 8 << 4 = 0x80.
 * group 1: w_k = 1 - k / 4: wmin = -6.75, wmax = 1, s32 = 7.75 / 15 =
 *   0.51666665; fp16 -> 0x3822 = 0.51660156; z = round(6.75 / 0.5166) =
 *   round(13.066) = 13; q_0 = round(1/s + 13) = round(14.936) = 15.
 * zero byte: z0 = 5 in the low nibble, z1 = 13 in the high: 0xd5. */
static void test_golden(void) {
    float w[64];
    for (int k = 0; k < 32; k++) w[k] = (float)(k - 10) * 0.1f;
    for (int k = 0; k < 32; k++) w[32 + k] = 1.0f - 0.25f * (float)k;
    static const uint8_t codes_ref[32] = {
        0x80, 0x81, 0x91, 0x92, 0xa2, 0xa3, 0xb3, 0xb4, 0xc4, 0xc5, 0xd5, 0xd5, 0xe6, 0xe6, 0xf7, 0xf7,
        0x7f, 0x7e, 0x6e, 0x6d, 0x5d, 0x5d, 0x4c, 0x4c, 0x3b, 0x3b, 0x2a, 0x2a, 0x19, 0x19, 0x08, 0x08};
    static const uint8_t q0_ref[32] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5, 6, 6, 7, 7,
                                       8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15};
    static const uint8_t q1_ref[32] = {15, 14, 14, 13, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8,
                                       7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0};
    uint8_t codes[32], zeros[1];
    uint16_t scales[2];
    memset(codes, 0xee, sizeof codes);
    memset(zeros, 0xee, sizeof zeros);
    scales[0] = scales[1] = 0xeeee;
    CHECK(spx_q_quantize_row(w, 64, NULL, 4, 32, SPX_Q_MINMAX, codes, scales, zeros) == SPX_OK, "quantize");
    CHECK(scales[0] == 0x329d, "group 0 scale 0x%04x, expected 0x329d", scales[0]);
    CHECK(scales[1] == 0x3822, "group 1 scale 0x%04x, expected 0x3822", scales[1]);
    CHECK(zeros[0] == 0xd5, "zero byte 0x%02x, expected 0xd5", zeros[0]);
    for (int k = 0; k < 32; k++)
        CHECK(codes[k] == codes_ref[k], "code byte %d: 0x%02x, expected 0x%02x", k, codes[k], codes_ref[k]);
    for (int k = 0; k < 32; k++) {
        CHECK(spx_q_code_get(codes, k, 4, 32) == q0_ref[k], "group 0 code %d", k);
        CHECK(spx_q_code_get(codes, 32 + k, 4, 32) == q1_ref[k], "group 1 code %d", k);
    }
    CHECK(spx_q_zero_get(zeros, 0) == 5 && spx_q_zero_get(zeros, 1) == 13, "zero nibbles");
    /* Dequantized values are (q - z) * s exactly. */
    float out[64];
    for (int i = 0; i < 64; i++) out[i] = NAN;
    spx_q_dequantize_row(codes, scales, zeros, 64, 4, 32, out);
    CHECK(out[0] == -5.0f * fp16v(0x329d), "w^_0 = %g", out[0]);
    CHECK(out[31] == 10.0f * fp16v(0x329d), "w^_31 = %g", out[31]);
    CHECK(out[32] == 2.0f * fp16v(0x3822), "w^_32 = %g", out[32]);
    CHECK(out[63] == -13.0f * fp16v(0x3822), "w^_63 = %g", out[63]);

    /* Three groups: the odd count leaves the high nibble of the last zero
     * byte 0; G = 32 codes are 16 bytes per group. */
    float w3[96];
    uint64_t rs = 11;
    for (int i = 0; i < 96; i++) w3[i] = tl_rand_normal(&rs);
    uint8_t c3[48], z3[2];
    uint16_t s3[3];
    memset(z3, 0xff, sizeof z3);
    spx_q_quantize_row(w3, 96, NULL, 4, 32, SPX_Q_MINMAX, c3, s3, z3);
    CHECK((z3[1] >> 4) == 0, "padding nibble of the zero row is %d", z3[1] >> 4);

    /* Round half away from zero: range 3.75 -> s = 0.25 exactly, z = 0;
     * 0.625 / 0.25 = 2.5 -> 3 (banker's rounding would give 2). */
    float wt[32];
    for (int k = 0; k < 32; k++) wt[k] = 0.125f * (float)(k % 4) + 1.0f;
    wt[0] = 0.0f;
    wt[1] = 3.75f;
    wt[2] = 0.625f;
    spx_q_quantize_row(wt, 32, NULL, 4, 32, SPX_Q_MINMAX, codes, scales, zeros);
    CHECK(scales[0] == 0x3400, "s = 0x%04x, expected 0x3400 (0.25)", scales[0]);
    CHECK(spx_q_code_get(codes, 2, 4, 32) == 3, "2.5 rounds to %d, expected 3", spx_q_code_get(codes, 2, 4, 32));
}

/* s is rounded to fp16 BEFORE the codes: wmin = 0, wmax = 3 gives s32 =
 * 0.2, fp16 0x3266 = 0.19995117. w = 2.8998: w / s32 = 14.499 -> 14, but
 * w / s = 14.5025 -> 15. */
static void test_scale_rounded_first(void) {
    float w[32];
    uint64_t rs = 5;
    for (int k = 0; k < 32; k++) w[k] = 0.5f + tl_rand_uniform(&rs); /* inside (0, 3) */
    w[3] = 0.0f;
    w[7] = 3.0f;
    w[11] = 2.8998f;
    uint8_t codes[16], z;
    uint16_t s;
    spx_q_quantize_row(w, 32, NULL, 4, 32, SPX_Q_MINMAX, codes, &s, &z);
    CHECK(s == 0x3266, "s 0x%04x", s);
    CHECK((z & 15) == 0, "z %d", z & 15);
    float s32 = 3.0f / 15.0f;
    CHECK(ref_round(w[11] / s32, 15) == 14, "with the unrounded scale the code would be 14");
    CHECK(spx_q_code_get(codes, 11, 4, 32) == 15, "code %d, expected 15 (fp16 scale)",
          spx_q_code_get(codes, 11, 4, 32));

    /* Scale edge cases: a constant group (s32 = 1e-8 rounds to fp16 0) gets
     * the smallest subnormal; a huge range saturates at 65504. */
    CHECK(spx_q_scale_f16(0.5f, 0.5f, 4) == SPX_Q_SCALE_F16_MIN, "constant group scale");
    CHECK(spx_q_scale_f16(-1e30f, 1e30f, 4) == SPX_Q_SCALE_F16_MAX, "huge range scale");
    CHECK(spx_q_scale_f16(-3e38f, 3e38f, 4) == SPX_Q_SCALE_F16_MAX, "overflowing range scale");
    for (int k = 0; k < 32; k++) w[k] = 1e-9f * (1.0f + tl_rand_uniform(&rs));
    spx_q_quantize_row(w, 32, NULL, 4, 32, SPX_Q_MINMAX, codes, &s, &z);
    CHECK(s != 0 && s < 0x7c00, "tiny weights: scale 0x%04x > 0", s);

    /* All entries outliers: floor scale, z = 0, every slot q = 0. */
    uint8_t fl[32];
    memset(fl, 1, sizeof fl);
    for (int k = 0; k < 32; k++) w[k] = tl_rand_normal(&rs);
    memset(codes, 0xff, sizeof codes);
    spx_q_quantize_row(w, 32, fl, 4, 32, SPX_Q_MINMAX, codes, &s, &z);
    CHECK(s == SPX_Q_SCALE_F16_MIN && (z & 15) == 0, "all-outlier group: s 0x%04x z %d", s, z & 15);
    for (int k = 0; k < 16; k++) CHECK(codes[k] == 0, "all-outlier code byte %d = 0x%02x", k, codes[k]);

    /* Bad parameters are refused, not crashed on. */
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_q_quantize_row(w, 32, NULL, 5, 32, SPX_Q_MINMAX, codes, &s, &z) == SPX_ERR_ARG, "bits 5");
    CHECK(spx_q_quantize_row(w, 32, NULL, 4, 12, SPX_Q_MINMAX, codes, &s, &z) == SPX_ERR_ARG, "group 12");
    CHECK(spx_q_quantize_row(w, 48, NULL, 4, 32, SPX_Q_MINMAX, codes, &s, &z) == SPX_ERR_ARG, "cols 48");
    CHECK(spx_q_quantize_row(w, 32, NULL, 4, 32, 7, codes, &s, &z) == SPX_ERR_ARG, "method 7");
    CHECK(spx_q_check_params(4, 32, 100, &e) == SPX_ERR_ARG && strstr(e.msg, "100"), "message: %s", e.msg);
}

/* ======================================================================
 * Every bit width and group size: bit-exact against the reference rule,
 * pack/unpack and code get/set round trips.
 * ==================================================================== */
static void test_roundtrip_all(void) {
    uint64_t rs = 77;
    const int64_t cols = 384; /* 3 x 128, 6 x 64, 12 x 32 */
    float w[384], out[384];
    uint8_t fl[384];
    for (int bi = 0; bi < 3; bi++)
        for (int gi = 0; gi < 3; gi++) {
            int bits = BITS[bi], G = GROUPS[gi], n = (1 << bits) - 1;
            for (int trial = 0; trial < 20; trial++) {
                float scale = powf(10.0f, (float)(trial % 7) - 4.0f);
                for (int64_t c = 0; c < cols; c++) {
                    w[c] = scale * tl_rand_normal(&rs) + (trial % 5 == 4 ? 3.0f * scale : 0.0f);
                    fl[c] = (trial & 1) && tl_rand_uniform(&rs) < 0.05f;
                }
                uint8_t codes[384], zeros[8], q[128];
                uint16_t scales[12];
                memset(codes, 0xa5, sizeof codes);
                spx_q_quantize_row(w, cols, (trial & 1) ? fl : NULL, bits, G, SPX_Q_MINMAX, codes,
                                   scales, zeros);
                int bad = 0;
                for (int64_t g = 0; g < cols / G; g++) {
                    uint16_t sh;
                    int z;
                    ref_group(w + g * G, (trial & 1) ? fl + g * G : NULL, G, bits, &sh, &z, q);
                    if (sh != scales[g] || z != spx_q_zero_get(zeros, g)) bad++;
                    for (int k = 0; k < G; k++)
                        if (spx_q_code_get(codes, g * G + k, bits, G) != q[k]) bad++;
                }
                CHECK(bad == 0, "bits %d group %d trial %d: %d mismatches vs the reference rule", bits, G,
                      trial, bad);
                /* Dequantized = (q - z) s, outlier slots exactly 0. */
                for (int64_t c = 0; c < cols; c++) out[c] = NAN;
                spx_q_dequantize_row(codes, scales, zeros, cols, bits, G, out);
                bad = 0;
                for (int64_t c = 0; c < cols; c++) {
                    int64_t g = c / G;
                    float ref = (float)(spx_q_code_get(codes, c, bits, G) - spx_q_zero_get(zeros, g)) *
                                fp16v(scales[g]);
                    if (out[c] != ref || ((trial & 1) && fl[c] && out[c] != 0.0f)) bad++;
                }
                CHECK(bad == 0, "bits %d group %d: %d dequantized values differ", bits, G, bad);
            }
            /* unpack_group / code_set round trip on random codes. */
            uint8_t qa[128], qb[128], buf[64];
            memset(buf, 0, sizeof buf);
            for (int k = 0; k < G; k++) {
                qa[k] = (uint8_t)(tl_rand_u64(&rs) % (uint64_t)(n + 1));
                spx_q_code_set(buf, k, bits, G, qa[k]);
            }
            memset(qb, 0xff, sizeof qb);
            spx_q_unpack_group(buf, 0, bits, G, qb);
            CHECK(!memcmp(qa, qb, (size_t)G), "bits %d group %d: unpack != set codes", bits, G);
        }
    /* the byte positions of each width: tests/test_qpack.c */
}

/* ======================================================================
 * Proposition 2 on random matrices, through the metrics module.
 * ==================================================================== */
static void test_prop2(void) {
    uint64_t rs = 2024;
    const int64_t rows = 64, cols = 512;
    float *W = malloc(sizeof(float) * rows * cols), *scratch = malloc(sizeof(float) * cols);
    for (int bi = 0; bi < 3; bi++)
        for (int gi = 0; gi < 3; gi++) {
            int bits = BITS[bi], G = GROUPS[gi], n = (1 << bits) - 1;
            for (int sc = 0; sc < 4; sc++) {
                static const float scales[4] = {1e-6f, 1e-2f, 1.0f, 3e3f};
                int32_t oidx[5] = {3, 40, 41, 200, 511};
                int64_t n_out = sc & 1 ? 5 : 0;
                spx_qbuf b;
                spx_err e;
                spx_err_clear(&e);
                CHECK(spx_qbuf_init(&b, rows, cols, bits, G, oidx, n_out, &e) == SPX_OK, "%s", e.msg);
                spx_qmetrics m;
                spx_qmetrics_init(&m);
                for (int64_t r = 0; r < rows; r++) {
                    float *row = W + r * cols;
                    for (int64_t c = 0; c < cols; c++) row[c] = scales[sc] * tl_rand_normal(&rs);
                    spx_qbuf_set_row(&b, r, row, SPX_Q_MINMAX, NULL);
                    spx_qmetrics_add_row(&m, &b.q, r, row, scratch);
                }
                spx_qreport rep;
                spx_qmetrics_report(&m, &rep);
                /* The exact bound for normal fp16 s: 1/2 + n 2^-11 + 2^-18. */
                double bound = 0.5 + n * 0x1p-11 + 0x1p-18;
                CHECK(rep.n_groups_span > rep.n_groups / 2, "spanning groups %lld", (long long)rep.n_groups_span);
                CHECK(rep.max_prop2_excess <= 0, "bits %d G %d scale %g: err/s exceeds its group bound by %g",
                      bits, G, scales[sc], rep.max_prop2_excess);
                if (scales[sc] >= 1e-2f)
                    CHECK(rep.max_err_over_s <= bound, "bits %d G %d: max err/s %.7f > %.7f", bits, G,
                          rep.max_err_over_s, bound);
                spx_qbuf_free(&b);
            }
        }
    /* The slack is needed: fp16 rounds s = 0.2 down to 0.19995117, and a
     * group with z + wmin/s = 0.499 puts wmax at u = 15.0037 + 0.499, so
     * |w - w^| / s = 0.5027 > 1/2, within 1/2 + 15 * 2^-11. */
    float w[32];
    uint64_t r2 = 9;
    float sh = fp16v(0x3266), wmin = -2.501f * sh, wmax = wmin + 3.0f;
    for (int k = 0; k < 32; k++) w[k] = wmin + (wmax - wmin) * tl_rand_uniform(&r2);
    w[5] = wmin;
    w[9] = wmax;
    uint8_t codes[16], z;
    uint16_t s;
    spx_q_quantize_row(w, 32, NULL, 4, 32, SPX_Q_MINMAX, codes, &s, &z);
    float deq[32];
    spx_q_dequantize_row(codes, &s, &z, 32, 4, 32, deq);
    double r = fabs((double)w[9] - deq[9]) / fp16v(s);
    double slack = spx_q_prop2_slack(4, spx_q_scale32(wmin, wmax, 4), s);
    CHECK(s == 0x3266 && (z & 15) == 3, "s 0x%04x z %d", s, z & 15);
    CHECK(r > 0.5 && r <= 0.5 + slack, "err/s %.6f: expected in (0.5, %.6f]", r, 0.5 + slack);
    free(W);
    free(scratch);
}

/* ======================================================================
 * Dot products, with and without outliers.
 * ==================================================================== */
static void test_dot(void) {
    uint64_t rs = 31337;
    const int64_t rows = 24, cols = 256, ntok = 5;
    float *W = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * ntok * cols);
    float *deq = malloc(sizeof(float) * cols), *dense = malloc(sizeof(float) * cols);
    float *scratch = malloc(sizeof(float) * cols);
    for (int64_t i = 0; i < ntok * cols; i++) x[i] = tl_rand_normal(&rs);
    for (int bi = 0; bi < 3; bi++)
        for (int gi = 0; gi < 3; gi++) {
            int bits = BITS[bi], G = GROUPS[gi];
            int32_t oidx[6] = {0, 17, 31, 32, 100, 255};
            for (int with_out = 0; with_out < 2; with_out++) {
                spx_qbuf b;
                spx_err e;
                spx_err_clear(&e);
                spx_qbuf_init(&b, rows, cols, bits, G, oidx, with_out ? 6 : 0, &e);
                for (int64_t i = 0; i < rows * cols; i++) W[i] = tl_rand_normal(&rs);
                for (int64_t r = 0; r < rows; r++) {
                    if (with_out) /* big values in the outlier columns */
                        for (int j = 0; j < 6; j++) W[r * cols + oidx[j]] *= 50.0f;
                    spx_qbuf_set_row(&b, r, W + r * cols, r & 1 ? SPX_Q_MSE : SPX_Q_MINMAX, NULL);
                }
                double worst = 0;
                int nan = 0, out_bad = 0, zero_bad = 0;
                for (int64_t r = 0; r < rows; r++) {
                    for (int64_t c = 0; c < cols; c++) deq[c] = NAN;
                    spx_q_dequant_row_f32(&b.q, r, deq);
                    spx_q_dequantize_row(b.codes + r * b.codes_row_bytes, b.scales + r * b.n_groups,
                                         b.zeros + r * b.zeros_row_bytes, cols, bits, G, dense);
                    double ref = 0, mag = 0, dref = 0;
                    for (int64_t c = 0; c < cols; c++) {
                        ref += (double)deq[c] * x[c];
                        mag += fabs((double)deq[c] * x[c]);
                        dref += (double)dense[c] * x[c];
                    }
                    /* W x = dense(W) x + sum_j fp16(outlier) x[idx]. */
                    double osum = 0;
                    for (int j = 0; j < b.q.n_outliers; j++) {
                        float v = fp16v(b.outlier_val[r * b.q.n_outliers + j]);
                        osum += (double)v * x[oidx[j]];
                        if (dense[oidx[j]] != 0.0f) zero_bad++;
                        if (deq[oidx[j]] != v || fabs(v - W[r * cols + oidx[j]]) > 1e-3 * fabs(v) + 1e-7)
                            out_bad++;
                    }
                    float got = spx_q_dot_row(&b.q, r, x);
                    if (!isfinite(got)) nan++;
                    double d = fabs(got - ref) / (mag + 1e-30);
                    if (d > worst) worst = d;
                    if (fabs((dref + osum) - ref) > 1e-12 * (mag + 1e-30)) out_bad++;
                    /* Several tokens at once (prefill path), poisoned output. */
                    float outs[2 * 5];
                    for (int i = 0; i < 2 * ntok; i++) outs[i] = NAN;
                    spx_q_dot_rows(&b.q, r, x, ntok, cols, outs, 2, scratch);
                    for (int64_t t = 0; t < ntok; t++) {
                        double rt = 0, mt = 0;
                        for (int64_t c = 0; c < cols; c++) {
                            rt += (double)deq[c] * x[t * cols + c];
                            mt += fabs((double)deq[c] * x[t * cols + c]);
                        }
                        double dt = fabs(outs[2 * t] - rt) / (mt + 1e-30);
                        if (!isfinite(outs[2 * t])) nan++;
                        if (dt > worst) worst = dt;
                    }
                    for (int64_t t = 0; t < ntok; t++) if (!isnan(outs[2 * t + 1])) nan++; /* untouched */
                }
                CHECK(nan == 0, "bits %d G %d: %d non-finite or stray outputs", bits, G, nan);
                CHECK(worst <= DOT_RTOL, "bits %d G %d outliers %d: dot error %.3g of sum|w x| > %g", bits,
                      G, with_out, worst, DOT_RTOL);
                CHECK(out_bad == 0 && zero_bad == 0, "bits %d G %d: outlier slots %d bad, %d non-zero", bits,
                      G, out_bad, zero_bad);
                spx_qbuf_free(&b);
            }
        }
    /* The outlier column is excluded from its group's min/max. */
    float w[32];
    for (int k = 0; k < 32; k++) w[k] = tl_rand_normal(&rs);
    uint8_t fl[32] = {0}, codes[16], z1, z2;
    uint16_t s1, s2;
    spx_q_quantize_row(w, 32, NULL, 4, 32, SPX_Q_MINMAX, codes, &s1, &z1);
    fl[7] = 1;
    w[7] = 1000.0f;
    float wmn = INFINITY, wmx = -INFINITY;
    for (int k = 0; k < 32; k++)
        if (!fl[k]) wmn = fminf(wmn, w[k]), wmx = fmaxf(wmx, w[k]);
    spx_q_quantize_row(w, 32, fl, 4, 32, SPX_Q_MINMAX, codes, &s2, &z2);
    CHECK(s2 == spx_q_scale_f16(wmn, wmx, 4), "outlier left in min/max: s 0x%04x", s2);
    CHECK(spx_q_code_get(codes, 7, 4, 32) == (z2 & 15), "outlier slot code != z");
    free(W);
    free(x);
    free(deq);
    free(dense);
    free(scratch);
}

/* ======================================================================
 * MSE search: never worse per group, better on average.
 * ==================================================================== */
static double group_sq_err(const float *w, const float *deq, const uint8_t *fl, const float *imp, int G) {
    double e = 0;
    for (int k = 0; k < G; k++) {
        if (fl && fl[k]) continue;
        double d = (double)w[k] - deq[k];
        e += (imp ? imp[k] : 1.0) * d * d;
    }
    return e;
}

static void test_mse(void) {
    uint64_t rs = 4242;
    float w[512], d0[512], d1[512], imp[512];
    uint8_t fl[512], c0[512], c1[512], z0[8], z1[8];
    uint16_t s0[16], s1[16];
    double e_mm[5] = {0}, e_mse[5] = {0}; /* by bits: N(0,1), G32 */
    int worse = 0, groups = 0;
    for (int bi = 0; bi < 3; bi++)
        for (int gi = 0; gi < 3; gi++) {
            int bits = BITS[bi], G = GROUPS[gi];
            for (int trial = 0; trial < 60; trial++) {
                int kind = trial % 6; /* normal, laplace-ish, one-sided, outliers, weighted, constant */
                for (int c = 0; c < 512; c++) {
                    float v = tl_rand_normal(&rs);
                    if (kind == 1) v = v * v * v;
                    if (kind == 2) v = 1.0f + 0.1f * fabsf(v);
                    if (kind == 5) v = 0.7f;
                    w[c] = v;
                    fl[c] = kind == 3 && tl_rand_uniform(&rs) < 0.1f;
                    imp[c] = 0.1f + tl_rand_uniform(&rs) * 2;
                }
                const uint8_t *F = kind == 3 ? fl : NULL;
                const float *I = kind == 4 ? imp : NULL;
                spx_q_quantize_row_imp(w, 512, F, I, bits, G, SPX_Q_MINMAX, c0, s0, z0);
                spx_q_quantize_row_imp(w, 512, F, I, bits, G, SPX_Q_MSE, c1, s1, z1);
                spx_q_dequantize_row(c0, s0, z0, 512, bits, G, d0);
                spx_q_dequantize_row(c1, s1, z1, 512, bits, G, d1);
                for (int g = 0; g < 512 / G; g++) {
                    double a = group_sq_err(w + g * G, d0 + g * G, F ? F + g * G : NULL, I ? I + g * G : NULL, G);
                    double b = group_sq_err(w + g * G, d1 + g * G, F ? F + g * G : NULL, I ? I + g * G : NULL, G);
                    groups++;
                    if (b > a * (1 + MSE_TIE_RTOL)) worse++;
                    if (kind == 0 && G == 32) e_mm[bits] += a, e_mse[bits] += b;
                    if (kind == 2 || kind == 5) /* one-sided: MINMAX's grid misses the data */
                        if (!(b < ONESIDED_RATIO * a)) worse++;
                }
                for (int c = 0; c < 512; c++)
                    if (F && F[c] && d1[c] != 0.0f) worse++;
            }
        }
    CHECK(worse == 0, "MSE worse than MINMAX (or outlier slot non-zero) in %d of %d groups", worse, groups);
    static const double gain_min[5] = {0, 0, MSE_GAIN_MIN_2BIT, MSE_GAIN_MIN_3BIT, MSE_GAIN_MIN};
    for (int bits = 2; bits <= 4; bits++) {
        double gain = 1 - sqrt(e_mse[bits] / e_mm[bits]);
        CHECK(gain >= gain_min[bits], "MSE lowers N(0,1) G32 %d-bit relative error by %.2f%% only (at least %.0f%%)",
              bits, 100 * gain, 100 * gain_min[bits]);
    }
}

/* The MSE search against an exhaustive one (every fp16 scale in [0.02, 3]
 * and every zero point, errors as stored) on N(0,1) groups of 32. */
static void test_mse_exhaustive(void) {
    uint64_t rs = 31337;
    enum { NG = 120 };
    for (int bits = 2; bits <= 3; bits++) {
        const int n = (1 << bits) - 1;
        double e_mse = 0, e_best = 0;
        for (int g = 0; g < NG; g++) {
            float w[32], d[32];
            uint8_t c[48], z[1];
            uint16_t sc[1];
            for (int k = 0; k < 32; k++) w[k] = tl_rand_normal(&rs);
            spx_q_quantize_row(w, 32, NULL, bits, 32, SPX_Q_MSE, c, sc, z);
            spx_q_dequantize_row(c, sc, z, 32, bits, 32, d);
            e_mse += group_sq_err(w, d, NULL, NULL, 32);
            double best = INFINITY;
            for (uint16_t h = spx_f32_to_f16(0.02f); h <= spx_f32_to_f16(3.0f); h++) {
                const float sv = fp16v(h);
                for (int zz = 0; zz <= n; zz++) {
                    double e = 0;
                    for (int k = 0; k < 32 && e < best; k++) {
                        const double dd = (double)w[k] - (double)(ref_round(w[k] / sv + (float)zz, n) - zz) * sv;
                        e += dd * dd;
                    }
                    if (e < best) best = e;
                }
            }
            e_best += best;
        }
        CHECK(e_mse <= MSE_EXHAUSTIVE_RTOL * e_best, "%d-bit MSE search: squared error %.6g, exhaustive %.6g (ratio %.5f)",
              bits, e_mse, e_best, e_mse / e_best);
        printf("MSE search vs exhaustive, %d-bit G32: squared error ratio %.5f\n", bits, e_mse / e_best);
    }
}

/* ======================================================================
 * Saliency, kurtosis, ratio, count, selection.
 * ==================================================================== */
static void test_saliency(void) {
    uint64_t rs = 99;
    const int64_t rows = 37, cols = 300;
    float *W = malloc(sizeof(float) * rows * cols), S[300], S2[300], gamma[300];
    for (int64_t i = 0; i < rows * cols; i++) W[i] = tl_rand_normal(&rs);
    for (int64_t c = 0; c < cols; c++) gamma[c] = tl_rand_normal(&rs);
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_saliency(W, rows, cols, gamma, S, &e) == SPX_OK, "saliency");
    double *acc = calloc(cols, sizeof *acc);
    for (int64_t r = 0; r < rows; r++) spx_colnorm_accum(acc, W + r * cols, cols); /* streamed */
    spx_saliency_finish(acc, gamma, cols, S2);
    int bad = 0;
    for (int64_t c = 0; c < cols; c++) {
        double n2 = 0;
        for (int64_t r = 0; r < rows; r++) n2 += (double)W[r * cols + c] * W[r * cols + c];
        double ref = fabs(gamma[c]) * sqrt(n2);
        if (S[c] != S2[c] || fabs(S[c] - ref) > 1e-6 * ref) bad++;
    }
    CHECK(bad == 0, "saliency: %d columns off", bad);
    free(acc);
    free(W);

    /* Kurtosis of known distributions. Constant plus one spike: one
     * standardized value sqrt(K-1), the rest -1/sqrt(K-1), so kappa =
     * ((K-1)^2 + 1/(K-1)) / K = K - 2 + 1/(K-1) (the true maximum; the
     * paper's "kappa = K is attained" is off by 2). */
    enum { KS = 1536 };
    static float v[200000];
    for (int j = 0; j < KS; j++) v[j] = 2.5f;
    v[700] = 9.0f;
    double kap = spx_kurtosis(v, KS), kref = KS - 2 + 1.0 / (KS - 1);
    CHECK(fabs(kap - kref) <= 1e-9 * kref, "spike kurtosis %.9g, expected %.9g", kap, kref);
    CHECK(kap <= KS, "Proposition 1: kappa %.3f <= K", kap);
    for (int j = 0; j < 1000; j++) v[j] = j & 1 ? 3.0f : -1.0f; /* two-point: kappa = 1 */
    CHECK(fabs(spx_kurtosis(v, 1000) - 1.0) < 1e-12, "two-point kurtosis %.12g", spx_kurtosis(v, 1000));
    for (int j = 0; j < 1000; j++) v[j] = 4.0f;
    CHECK(spx_kurtosis(v, 1000) == 0.0, "constant: 0 by definition");
    for (int j = 0; j < 200000; j++) v[j] = tl_rand_normal(&rs);
    CHECK(fabs(spx_kurtosis(v, 200000) - 3.0) < KURT_NORMAL_TOL, "normal kurtosis %.4f", spx_kurtosis(v, 200000));
    for (int j = 0; j < 100001; j++) v[j] = (float)j; /* discrete uniform: 9/5 - 6/(5 (K^2-1)) */
    CHECK(fabs(spx_kurtosis(v, 100001) - 1.8) < 1e-6, "uniform kurtosis %.8f", spx_kurtosis(v, 100001));

    /* r(kappa), including both clamps and the Proposition 1 numbers. */
    CHECK(spx_outlier_ratio_auto(1.0) == 0.01 && spx_outlier_ratio_auto(3.0) == 0.01, "mesokurtic r");
    CHECK(spx_outlier_ratio_auto(NAN) == 0.01, "NaN kappa");
    CHECK(fabs(spx_outlier_ratio_auto(3.0 + M_E - 1.0) - 0.0115) < 1e-15, "r at ln(1+ex) = 1");
    CHECK(fabs(spx_outlier_ratio_auto(1536) - 0.021003) < 5e-6, "r(1536) = %.6f (paper 2.10%%)",
          spx_outlier_ratio_auto(1536));
    CHECK(fabs(spx_outlier_ratio_auto(65536) - 0.026636) < 5e-6, "r(65536) = %.6f (paper 2.66%%)",
          spx_outlier_ratio_auto(65536));
    double kcap = 3.0 + expm1(40.0 / 3.0); /* 0.01 (1 + 0.15 ln(1+x)) = 0.03 */
    CHECK(fabs(spx_outlier_ratio_auto(kcap) - 0.03) < 1e-12, "r at the cap edge");
    CHECK(spx_outlier_ratio_auto(kcap * 10) == 0.03 && spx_outlier_ratio_auto(1e300) == 0.03, "upper clamp");
    CHECK(kcap > 6.1e5 && kcap < 6.3e5, "cap reached at kappa %.4g (paper: ~6.2e5)", kcap);

    /* count = floor(r K + 1/2). */
    CHECK(spx_outlier_count(1536, 0.01) == 15, "15.36 -> 15");
    CHECK(spx_outlier_count(1000, 0.0125) == 13, "12.5 -> 13 (half up)");
    CHECK(spx_outlier_count(100, 0.005) == 1, "0.5 -> 1");
    CHECK(spx_outlier_count(32, 0.01) == 0, "0.32 -> 0");
    CHECK(spx_outlier_count(10, 0) == 0 && spx_outlier_count(10, -1) == 0 && spx_outlier_count(10, NAN) == 0, "r <= 0");
    CHECK(spx_outlier_count(10, 1.0) == 10 && spx_outlier_count(10, 5.0) == 10, "r >= 1");

    /* Selection: largest first, ties to the lower index, sorted output. */
    float s[12] = {1, 5, 3, 5, 2, 9, 5, 0, 9, 1, 5, 4};
    int32_t idx[12];
    for (int i = 0; i < 12; i++) idx[i] = -7;
    CHECK(spx_outlier_select(s, 12, 4, idx, &e) == SPX_OK, "select");
    CHECK(idx[0] == 1 && idx[1] == 3 && idx[2] == 5 && idx[3] == 8, "top-4 = %d %d %d %d", idx[0], idx[1],
          idx[2], idx[3]);
    CHECK(idx[4] == -7, "wrote past count");
    s[11] = NAN;
    spx_outlier_select(s, 12, 1, idx, &e);
    CHECK(idx[0] == 11, "NaN saliency is selected first");
    /* Random check against a brute-force ranking. */
    float big[3000];
    int32_t got[300];
    for (int i = 0; i < 3000; i++) big[i] = (float)(tl_rand_u64(&rs) % 500); /* many ties */
    spx_outlier_select(big, 3000, 300, got, &e);
    int sel_bad = 0;
    for (int i = 0; i < 300; i++) {
        int32_t j = got[i];
        if (i && got[i] <= got[i - 1]) sel_bad++;
        int rank = 0; /* how many channels beat j */
        for (int k = 0; k < 3000; k++)
            if (big[k] > big[j] || (big[k] == big[j] && k < j)) rank++;
        if (rank >= 300) sel_bad++;
    }
    CHECK(sel_bad == 0, "selection: %d wrong", sel_bad);

    /* Modes: 20 channels far out on a tight bulk -> AUTO raises r above 1%
     * and keeps all 20; FIXED takes round(r K); OFF none. */
    int32_t *oi = malloc(sizeof(int32_t) * KS);
    int64_t nout = -1;
    double kk = -1;
    for (int j = 0; j < KS; j++) v[j] = 1.0f + 0.01f * tl_rand_normal(&rs);
    for (int j = 0; j < 20; j++) v[j * 70 + 3] = 50.0f;
    CHECK(spx_outliers_choose(v, KS, SPX_OUTLIERS_AUTO, 0, oi, &nout, &kk, &e) == SPX_OK, "%s", e.msg);
    CHECK(kk > 50 && nout == spx_outlier_count(KS, spx_outlier_ratio_auto(kk)) && nout > 20,
          "auto: kappa %.2f, %lld channels", kk, (long long)nout);
    int caught = 0;
    for (int64_t i = 0; i < nout; i++) caught += oi[i] % 70 == 3 && v[oi[i]] == 50.0f;
    CHECK(caught == 20, "auto kept %d of the 20 spikes", caught);
    CHECK(spx_outliers_choose(v, KS, SPX_OUTLIERS_FIXED, 0.005, oi, &nout, NULL, &e) == SPX_OK && nout == 8,
          "fixed 0.5%%: %lld", (long long)nout);
    CHECK(spx_outliers_choose(v, KS, SPX_OUTLIERS_OFF, 0, oi, &nout, NULL, &e) == SPX_OK && nout == 0, "off");
    spx_err_clear(&e);
    CHECK(spx_outliers_choose(v, KS, SPX_OUTLIERS_FIXED, 1.5, oi, &nout, NULL, &e) == SPX_ERR_ARG, "ratio 1.5");
    free(oi);
}

/* ======================================================================
 * Experiments A and B.
 * ==================================================================== */
static void test_experiment_a(void) {
    spx_exp_gauss_result r;
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_exp_gaussian(123, 2, &r, &e) == SPX_OK, "%s", e.msg);
    /* Quadrature vs Monte Carlo (200000 groups; sd of the d^2 mean ~0.013
     * on 17.6, of the d mean ~0.0016 on 4.14): 0.5% is > 5 sd. */
    CHECK(fabs(r.range.mc_e_d / r.range.e_d - 1) < 0.005, "E[d] %.5f vs MC %.5f", r.range.e_d, r.range.mc_e_d);
    CHECK(fabs(r.range.mc_e_d2 / r.range.e_d2 - 1) < 0.005, "E[d^2] %.5f vs MC %.5f", r.range.e_d2,
          r.range.mc_e_d2);
    /* Regression pin of the quadrature (the paper quotes d = 4.14). */
    CHECK(fabs(r.range.e_d - 4.1393) < 5e-4, "E[d] = %.5f", r.range.e_d);
    double rel = r.minmax.rel_err;
    CHECK(fabs(rel / r.pred_rel - 1) <= PROP3_RTOL, "Prop 3: measured %.5f%% vs predicted %.5f%%", 100 * rel,
          100 * r.pred_rel);
    /* The paper's E[d] form under-predicts by ~1.4%, beyond sampling noise. */
    CHECK(rel > r.pred_rel_paper * 1.007, "measured %.5f%% vs E[d] formula %.5f%%", 100 * rel,
          100 * r.pred_rel_paper);
    CHECK(fabs(r.minmax.snr_db + 20 * log10(rel)) < 1e-9, "SNR consistent with rel err");
    CHECK(fabs(r.minmax.cosine - 1 / sqrt(1 + rel * rel)) < 2e-5, "cosine %.6f", r.minmax.cosine);
    CHECK(r.minmax.max_prop2_excess <= 0 && r.minmax.max_err_over_s > 0.5 &&
              r.minmax.max_err_over_s <= 0.5 + 15 * 0x1p-11 + 0x1p-18,
          "Prop 2 on A: max err/s %.6f", r.minmax.max_err_over_s);
    CHECK(r.mse.rel_err < rel * (1 - MSE_GAIN_MIN), "MSE %.4f%% vs minmax %.4f%%", 100 * r.mse.rel_err,
          100 * rel);
    /* Same numbers whatever the thread count (per-row RNG streams). */
    spx_exp_gauss_result r1;
    spx_exp_gaussian_run(123, 256, 512, 4, 32, 1, &r1, &e);
    spx_exp_gauss_result r3;
    spx_exp_gaussian_run(123, 256, 512, 4, 32, 3, &r3, &e);
    CHECK(fabs(r1.minmax.rel_err - r3.minmax.rel_err) < 1e-12 && fabs(r1.mse.rel_err - r3.mse.rel_err) < 1e-12,
          "thread count changed the result");
}

static void test_experiment_b(void) {
    spx_exp_heavy_result r;
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_exp_heavy_channel(7, 2, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(r.n_heavy == 15, "15 heavy channels, got %lld", (long long)r.n_heavy);
    /* m = 1 is a plain Gaussian matrix: Group-32 ~ Proposition 3 (8.08%),
     * per-row much worse (the range of 1536 normals is ~6.7, not 4.14). */
    CHECK(fabs(r.rel_g32[0] - 0.0808) < 0.001, "G32 at m = 1: %.4f", r.rel_g32[0]);
    CHECK(r.rel_row[0] > 0.12, "per-row at m = 1: %.4f", r.rel_row[0]);
    for (int i = 1; i < SPX_EXP_HEAVY_NM; i++) {
        CHECK(r.heavy_caught[i] == r.n_heavy, "m = %g: %lld of the heavy channels kept", r.m[i],
              (long long)r.heavy_caught[i]);
        /* With the heavy channels in fp16 the rest is plain Gaussian G32. */
        CHECK(fabs(r.light_g32_out[i] - r.light_g32_out[1]) < 1e-3, "m = %g: non-heavy error %.4f", r.m[i],
              r.light_g32_out[i]);
        CHECK(r.light_g32[i] > r.light_g32[i - 1] && r.light_row[i] >= r.light_row[i - 1],
              "non-heavy error grows with m without outliers");
        CHECK(r.rel_g32_out[i] < r.rel_g32[i] && r.rel_g32_out_mse[i] < r.rel_g32_out[i], "m = %g ordering",
              r.m[i]);
    }
    CHECK(r.light_row[5] > 0.99, "per-row, m = 64: non-heavy weights all but erased (%.4f)", r.light_row[5]);
}

/* ======================================================================
 * Tiled layout: spx_q_tile against qtensor.h's description, restated here
 * independently of the accessors: for row r (tile T = r / 16, i = r % 16)
 * and group g (item k = g / 4, t = g % 4), ti = T * items + k:
 *   codes  + 1024 ti + 64 i + 16 t   (row i < 8 at 64 i, row i + 8 at 512 + 64 i)
 *   scales + 64 ti + 2 (4 (i % 8) + t) + i / 8   (fp16 units)
 *   zeros  + 32 ti + 4 (i % 8) + t, nibble i / 8
 * Padding rows (r >= rows) are zero bytes in all three.
 * ==================================================================== */
static int64_t tref_codes(int64_t items, int64_t r, int64_t g) {
    int64_t ti = (r / 16) * items + g / 4, i = r % 16;
    return 1024 * ti + (i < 8 ? 64 * i : 512 + 64 * (i - 8)) + 16 * (g % 4);
}
static int64_t tref_slot(int64_t items, int64_t r, int64_t g) {
    return 32 * ((r / 16) * items + g / 4) + 4 * (r % 8) + g % 4;
}

static void test_tile(void) {
    uint64_t rs = 0x711ed;
    static const int64_t shapes[][2] = {{20, 256}, {16, 128}, {33, 384}, {1, 128}, {48, 1024}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si][0], cols = shapes[si][1], ng = cols / 32, items = cols / 128;
        int64_t sr = (rows + 15) / 16 * 16;
        int32_t oidx[3] = {5, 77, (int32_t)cols - 1};
        spx_qbuf b;
        spx_err e;
        spx_err_clear(&e);
        if (spx_qbuf_init(&b, rows, cols, 4, 32, oidx, 3, &e) != SPX_OK) {
            CHECK(0, "qbuf: %s", e.msg);
            continue;
        }
        float *w = malloc(sizeof(float) * cols);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++) w[c] = tl_rand_normal(&rs) * (1.0f + (float)(r % 7));
            spx_qbuf_set_row(&b, r, w, SPX_Q_MINMAX, NULL);
        }
        free(w);
        size_t cb = (size_t)spx_q_codes_bytes(rows, cols, 4, SPX_Q_TILED);
        size_t sb = (size_t)spx_q_scales_bytes(rows, cols, 32, SPX_Q_TILED);
        size_t zb = (size_t)spx_q_zeros_bytes(rows, cols, 32, SPX_Q_TILED);
        CHECK(cb == (size_t)(sr * cols / 2) && sb == (size_t)(sr * ng * 2) && zb == (size_t)(sr * ng / 2),
              "%lldx%lld: tiled sizes %zu %zu %zu", (long long)rows, (long long)cols, cb, sb, zb);
        /* poisoned: every byte must be written */
        uint8_t *codes = malloc(cb), *zeros = malloc(zb);
        uint16_t *scales = malloc(sb);
        memset(codes, 0xa5, cb);
        memset(scales, 0xa5, sb);
        memset(zeros, 0xa5, zb);
        spx_qtensor t;
        CHECK(spx_q_tile(&b.q, codes, scales, zeros, &t, &e) == SPX_OK, "spx_q_tile: %s", e.msg);
        CHECK(t.layout == SPX_Q_TILED && t.rows == rows && t.cols == cols && t.bits == 4 && t.group == 32 &&
                  t.codes == codes && t.scales == scales && t.zeros == zeros && t.n_outliers == 3 &&
                  t.outlier_idx == b.q.outlier_idx && t.outlier_val == b.q.outlier_val,
              "%lldx%lld: dst fields", (long long)rows, (long long)cols);
        int bad_acc = 0, bad_ref = 0, bad_pad = 0;
        for (int64_t r = 0; r < sr; r++)
            for (int64_t g = 0; g < ng; g++) {
                const uint8_t *tc = codes + tref_codes(items, r, g);
                int64_t slot = tref_slot(items, r, g);
                uint16_t ts = scales[2 * slot + (r % 16) / 8];
                int tz = (zeros[slot] >> (4 * ((r % 16) / 8))) & 15;
                /* the accessors find the documented positions */
                if (spx_q_group_codes(&t, r, g) != tc || spx_q_group_scale(&t, r, g) != ts ||
                    spx_q_group_zero(&t, r, g) != tz)
                    bad_acc++;
                if (r < rows) {
                    if (memcmp(tc, b.codes + r * b.codes_row_bytes + 16 * g, 16) ||
                        ts != b.scales[r * ng + g] || tz != spx_q_zero_get(b.zeros + r * b.zeros_row_bytes, g))
                        bad_ref++;
                } else {
                    static const uint8_t z16[16];
                    if (memcmp(tc, z16, 16) || ts != 0 || tz != 0) bad_pad++;
                }
            }
        CHECK(bad_acc == 0, "%lldx%lld: %d (row, group) accessors off the documented positions",
              (long long)rows, (long long)cols, bad_acc);
        CHECK(bad_ref == 0, "%lldx%lld: %d (row, group) differ from the row-major original", (long long)rows,
              (long long)cols, bad_ref);
        CHECK(bad_pad == 0, "%lldx%lld: %d padding (row, group) not zero", (long long)rows, (long long)cols,
              bad_pad);
        /* the scalar reference reads the tiled copy to the same bits */
        float *d0 = malloc(sizeof(float) * cols), *d1 = malloc(sizeof(float) * cols);
        float *x = malloc(sizeof(float) * cols);
        for (int64_t c = 0; c < cols; c++) x[c] = tl_rand_normal(&rs);
        int bad_dot = 0;
        for (int64_t r = 0; r < rows; r++) {
            spx_q_dequant_row_f32(&b.q, r, d0);
            spx_q_dequant_row_f32(&t, r, d1);
            float y0 = spx_q_dot_row(&b.q, r, x), y1 = spx_q_dot_row(&t, r, x);
            if (memcmp(d0, d1, sizeof(float) * cols) || memcmp(&y0, &y1, sizeof y0)) bad_dot++;
        }
        CHECK(bad_dot == 0, "%lldx%lld: %d rows dequantize or dot differently tiled", (long long)rows,
              (long long)cols, bad_dot);
        if (rows == 20 && cols == 256) {
            /* hand-computed (items = 2): row 9 group 5 is tile 0, item 1
             * (ti 1), group 1 of it, row 1 of the tile's second half */
            CHECK(spx_q_group_codes(&t, 9, 5) == codes + 1024 * 1 + 512 + 64 * 1 + 16 * 1, "row 9 group 5 codes");
            CHECK(memcmp(codes + 1616, b.codes + 9 * 128 + 5 * 16, 16) == 0, "codes[1616..] = row 9 group 5");
            CHECK(scales[2 * (32 * 1 + 4 * 1 + 1) + 1] == b.scales[9 * 8 + 5], "scales[75] = row 9 group 5");
            CHECK((zeros[37] >> 4) == spx_q_zero_get(b.zeros + 9 * 4, 5), "zeros[37] high = row 9 group 5");
            CHECK((zeros[37] & 15) == spx_q_zero_get(b.zeros + 1 * 4, 5), "zeros[37] low = row 1 group 5");
            /* row 15 group 7: the last 16 bytes of ti 1, its last scale */
            CHECK(memcmp(codes + 2032, b.codes + 15 * 128 + 7 * 16, 16) == 0, "codes[2032..] = row 15 group 7");
            CHECK(scales[127] == b.scales[15 * 8 + 7], "scales[127] = row 15 group 7");
            /* row 17 group 6: tile 1, item 1 (ti 3), row 1 of the first half */
            CHECK(memcmp(codes + 3072 + 64 + 32, b.codes + 17 * 128 + 6 * 16, 16) == 0,
                  "codes[3168..] = row 17 group 6");
            CHECK(scales[2 * (96 + 4 + 2)] == b.scales[17 * 8 + 6], "scales[204] = row 17 group 6");
            CHECK((zeros[102] & 15) == spx_q_zero_get(b.zeros + 17 * 4, 6), "zeros[102] low = row 17 group 6");
            /* rows 20..31 are padding: row 20 group 0 at ti 2, row 4 */
            CHECK(codes[2048 + 256] == 0 && scales[2 * (64 + 16)] == 0 && (zeros[80] & 15) == 0,
                  "row 20 (padding) zero");
        }
        /* spx_q_tile_alloc: the same bytes in one block */
        spx_qtensor t2;
        void *mem = NULL;
        CHECK(spx_q_tile_alloc(&b.q, &t2, &mem, &e) == SPX_OK && mem, "spx_q_tile_alloc: %s", e.msg);
        if (mem)
            CHECK(memcmp(t2.codes, codes, cb) == 0 && memcmp(t2.scales, scales, sb) == 0 &&
                      memcmp(t2.zeros, zeros, zb) == 0 && t2.layout == SPX_Q_TILED,
                  "%lldx%lld: spx_q_tile_alloc differs from spx_q_tile", (long long)rows, (long long)cols);
        /* spx_q_untile_alloc: back to the original row-major bytes (spectra convert --layout rows) */
        if (mem) {
            spx_qtensor r2;
            void *m2 = NULL;
            CHECK(spx_q_untile_alloc(&t2, &r2, &m2, &e) == SPX_OK && m2, "spx_q_untile_alloc: %s", e.msg);
            if (m2)
                CHECK(memcmp(r2.codes, b.codes, (size_t)spx_q_codes_bytes(rows, cols, 4, SPX_Q_ROWS)) == 0 &&
                          memcmp(r2.scales, b.scales, (size_t)spx_q_scales_bytes(rows, cols, 32, SPX_Q_ROWS)) == 0 &&
                          memcmp(r2.zeros, b.zeros, (size_t)spx_q_zeros_bytes(rows, cols, 32, SPX_Q_ROWS)) == 0 &&
                          r2.layout == SPX_Q_ROWS,
                      "%lldx%lld: untiling does not give the original bytes back", (long long)rows, (long long)cols);
            free(m2);
            CHECK(spx_q_untile_alloc(&b.q, &r2, &m2, &e) == SPX_ERR_ARG && m2 == NULL,
                  "spx_q_untile_alloc must refuse a row-major matrix");
        }
        free(mem);
        free(d0);
        free(d1);
        free(x);
        free(codes);
        free(scales);
        free(zeros);
        spx_qbuf_free(&b);
    }
    /* what cannot be tiled: SPX_ERR_ARG, nothing allocated */
    static const struct { int64_t rows, cols; int bits, group; } no[] = {
        {16, 256, 4, 64}, {16, 96, 4, 32}, {16, 256, 3, 32}, {16, 256, 2, 32}, {16, 128, 4, 128}};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        spx_qbuf b;
        spx_err e;
        spx_err_clear(&e);
        if (spx_qbuf_init(&b, no[i].rows, no[i].cols, no[i].bits, no[i].group, NULL, 0, &e) != SPX_OK) {
            CHECK(0, "qbuf: %s", e.msg);
            continue;
        }
        uint8_t buf[8192];
        spx_qtensor t;
        void *mem = (void *)buf;
        spx_err_clear(&e);
        CHECK(spx_q_tile(&b.q, buf, (uint16_t *)buf, buf, &t, &e) == SPX_ERR_ARG && e.code == SPX_ERR_ARG &&
                  e.msg[0],
              "bits %d group %d cols %lld: spx_q_tile must refuse", no[i].bits, no[i].group,
              (long long)no[i].cols);
        CHECK(spx_q_tile_alloc(&b.q, &t, &mem, &e) == SPX_ERR_ARG && mem == NULL,
              "bits %d group %d cols %lld: spx_q_tile_alloc must refuse", no[i].bits, no[i].group,
              (long long)no[i].cols);
        spx_qbuf_free(&b);
    }
    /* nor an already tiled matrix */
    {
        spx_qbuf b;
        spx_err e;
        spx_err_clear(&e);
        spx_qbuf_init(&b, 16, 128, 4, 32, NULL, 0, &e);
        spx_qtensor t = b.q, t2;
        t.layout = SPX_Q_TILED;
        void *mem;
        CHECK(spx_q_tile_alloc(&t, &t2, &mem, &e) == SPX_ERR_ARG && mem == NULL, "tiling a tiled matrix");
        spx_qbuf_free(&b);
    }
}

int main(void) {
    test_golden();
    test_scale_rounded_first();
    test_roundtrip_all();
    test_prop2();
    test_dot();
    test_mse();
    test_mse_exhaustive();
    test_saliency();
    test_experiment_a();
    test_experiment_b();
    test_tile();
    return tl_finish("test_quant");
}
