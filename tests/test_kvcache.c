/* test_kvcache.c: the fp16 and 4-bit KV caches.
 *  1. Attention over the stored q4 format equals attention over the
 *     dequantized rows (so computing directly on codes is right).
 *  1c. (test_tables) the kernel tables' attention steps against the scalar one.
 *  1b. The CUDA q4 cache's shared math (src/cuda/kvq4_math.h, compiled
 *     here by the C compiler) gives spx_kv_store's bytes exactly: rotation,
 *     scales, zeros, codes, the zero-nibble word updates, the plane layout
 *     and the dequantized rows.
 *  2. End to end on docllama-58m (head_dim 64, 8 layers): logits with f16
 *     and q4 caches against the exact f32 cache, within the tolerances
 *     below, and the same greedy argmax on most positions. */
#include "testlib.h"
#include "core/half.h"
#include "cuda/kvq4_math.h"
#include "cpu/qkernels.h"
#include "engine/kvcache.h"
#include "quant/g32.h"
#include "spectra.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Same math in another order: float rounding only. */
#define TOL_DIRECT 1e-4
/* docllama logits span about +-20. fp16 keeps 11 bits per value
 * (measured: max 0.013, mean 0.0009). q4 keeps 4 bits per group of 32
 * (about 8% relative error per value, Proposition 3), which softmax and
 * the weighted sum of V partly average out (measured on these 256 tokens:
 * max 3.0, mean 0.27, top-1 90%). Bounds: about 2x the measured error, so
 * a real regression (e.g. a wrong zero point: mean error > 1) fails. */
#define TOL_F16_MAXABS 0.05
#define TOL_Q4_MAXABS 6.0
#define TOL_Q4_MEANABS 0.5
#define MIN_Q4_TOP1 0.85

static void test_direct(void) {
    uint64_t rng = 42;
    int64_t hd = 64, nkv = 2, kvd = hd * nkv, n = 37;
    spx_kvcache c;
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_kv_init(&c, SPX_KV_Q4, 1, n, kvd, hd, &e) == SPX_OK, "%s", e.msg);
    float *k = malloc((size_t)(n * kvd) * sizeof(float)), *v = malloc((size_t)(n * kvd) * sizeof(float));
    for (int64_t i = 0; i < n * kvd; i++) {
        k[i] = tl_rand_normal(&rng);
        v[i] = tl_rand_normal(&rng) * 0.5f + 0.1f;
    }
    for (int64_t i = 0; i < n; i++) spx_kv_store(&c, 0, i, k + i * kvd, v + i * kvd);
    float q[64], sc[37], ref[37], out[64], oref[64], p[37];
    for (int i = 0; i < 64; i++) q[i] = tl_rand_normal(&rng);
    /* each stored row as the cache's own reference dequantizes it */
    float deq[128], deqv[37][64];
    for (int64_t i = 0; i < n; i++) {
        spx_kv_dequant_row(&c, 0, i, 0, deq);
        double d = 0, err = 0;
        for (int j = 0; j < 64; j++) {
            d += (double)q[j] * deq[64 + j]; /* head 1 */
            err += fabs(deq[64 + j] - k[i * kvd + 64 + j]);
        }
        ref[i] = (float)(d * 0.125);
        CHECK(err / 64 < 0.25, "stored K row %lld is far from the input (mean abs %g)", (long long)i, err / 64);
        spx_kv_dequant_row(&c, 0, i, 1, deq);
        memcpy(deqv[i], deq + 64, sizeof deqv[i]);
    }
    for (int i = 0; i < 37; i++) sc[i] = NAN;
    spx_kv_scores(&c, NULL, 0, 1, q, 0, n, 0.125f, sc);
    tl_cmp r = tl_compare(sc, ref, (size_t)n, TOL_DIRECT, TOL_DIRECT);
    CHECK(r.ok, "q4 scores over codes differ from dequantized: max %g at %zu", r.max_abs, r.worst);
    for (int i = 0; i < 37; i++) p[i] = tl_rand_uniform(&rng);
    for (int j = 0; j < 64; j++) {
        double a = 0;
        for (int i = 0; i < 37; i++) a += (double)p[i] * deqv[i][j];
        oref[j] = (float)a;
    }
    spx_kv_weighted_v(&c, NULL, 0, 1, p, 0, n, out);
    r = tl_compare(out, oref, 64, TOL_DIRECT, TOL_DIRECT);
    CHECK(r.ok, "q4 weighted V over codes differs: max %g at %zu", r.max_abs, r.worst);
    printf("direct q4 attention: scores and V match the dequantized reference within %.0e\n", TOL_DIRECT);
    CHECK(spx_kv_bytes_per_token(SPX_KV_Q4, 1, 512) * 4 < spx_kv_bytes_per_token(SPX_KV_F16, 1, 512) * 1.2,
          "q4 is about 3.5x smaller than f16");
    spx_kv_free(&c);
    free(k);
    free(v);
    /* head_dim not a multiple of 32: q4 refused with a message */
    spx_err_clear(&e);
    CHECK(spx_kv_init(&c, SPX_KV_Q4, 1, 4, 16, 8, &e) == SPX_ERR_UNSUPPORTED && strstr(e.msg, "head_dim"), "%s", e.msg);
}

/* One row quantized the way the device does it (kvq4.cuh / rope.cu): per
 * head the FWHT of kvq4_math.h, then per group min/max, scale, zero, codes;
 * packed into the CPU's row format (codes, scales, zeros) with the zero
 * nibbles set through the device's 32-bit word updates on a poisoned row.
 * Groups are visited in a scrambled order, as blocks and warps may run. */
static void device_style_row(const float *x, int64_t kvd, int64_t hd, int rot, uint8_t *row, size_t row_bytes,
                             uint64_t *rng) {
    int64_t ng = kvd / 32, cb = kvd / 2, sb = cb + ng * 2;
    static float xr[16384];
    memcpy(xr, x, (size_t)kvd * sizeof *xr);
    for (int64_t h = 0; h < kvd / hd; h++) spx_kvq4_fwht(xr + h * hd, (int)hd, rot);
    uint32_t zw[64]; /* the zero bytes at byte o0 of these words (the device's rows start anywhere) */
    int o0 = (int)(tl_rand_u64(rng) % 4);
    memset(zw, 0xff, sizeof zw);
    memset(row, 0xff, row_bytes);
    int64_t first = (int64_t)(tl_rand_u64(rng) % (uint64_t)ng);
    for (int64_t i = 0; i < ng; i++) {
        int64_t G = (first + i * 7) % ng; /* 7 is coprime with ng unless ng % 7 == 0 */
        if (ng % 7 == 0) G = (first + i) % ng;
        const float *w = xr + G * 32;
        float mn = w[0], mx = w[0];
        for (int k = 1; k < 32; k++) {
            mn = w[k] < mn ? w[k] : mn;
            mx = w[k] > mx ? w[k] : mx;
        }
        uint16_t sbits = spx_kvq4_scale_bits(mn, mx);
        float s = spx_kvq4_f16_val(sbits);
        int z = spx_kvq4_zero(mn, s), q[32];
        for (int k = 0; k < 32; k++) q[k] = spx_kvq4_code(w[k], s, z);
        for (int k = 0; k < 16; k++) row[G * 16 + k] = (uint8_t)(q[k] | (q[k + 16] << 4));
        memcpy(row + cb + G * 2, &sbits, 2);
        int byte = o0 + (int)(G >> 1), sh;
        uint32_t clear = spx_kvq4_zero_clear((int)G, (int)ng, byte & 3, &sh);
        zw[byte >> 2] = (zw[byte >> 2] & ~clear) | ((uint32_t)z << sh);
    }
    for (int64_t b = 0; b < (ng + 1) / 2; b++) /* little endian */
        row[sb + b] = (uint8_t)(zw[(o0 + b) >> 2] >> (((o0 + b) & 3) * 8));
}

static void test_device_math(void) {
    uint64_t rng = 7;
    /* shapes whose CPU rows have an even byte count: kvcache.c stores a row's
     * fp16 scales in place, which UBSan (make check's second pass) flags as
     * misaligned for odd counts (kvd / 32 = 1, 2, 5, 9, ...); odd group
     * counts (the unused zero nibble) and heads sharing a zero byte are in */
    struct { int64_t hd, nkv; } sh[] = {{64, 4}, {128, 8}, {32, 3}, {32, 4}, {96, 5}, {256, 2}, {96, 1}, {160, 3},
                                        {256, 40}, {32, 1}, {64, 1}, {32, 5}}; /* the last three: odd row sizes (19, 37, 93 bytes), padded to 4 on the host */
    int n_rows = 0, bad_bytes = 0, bad_deq = 0, bad_fwht = 0;
    for (size_t c_ = 0; c_ < sizeof sh / sizeof sh[0]; c_++) {
        int64_t hd = sh[c_].hd, kvd = hd * sh[c_].nkv, n = 9;
        spx_kvcache c;
        spx_err e;
        spx_err_clear(&e);
        CHECK(spx_kv_init(&c, SPX_KV_Q4, 1, n, kvd, hd, &e) == SPX_OK, "%s", e.msg);
        int rot = spx_kvq4_rot(hd, kvd);
        CHECK(rot == (kvd <= 8192 ? c.rot : 1), "hd %lld kvd %lld: rot %d, kvcache.c %lld", (long long)hd,
              (long long)kvd, rot, (long long)c.rot);
        spx_kvq4_layout lo = spx_kvq4_layout_of(n, kvd);
        size_t rb = (size_t)(lo.code_row + 2 * lo.scale_row + lo.zero_row);
        CHECK(c.row_bytes == ((rb + 3) & ~(size_t)3) && rb * 2 == spx_kv_bytes_per_token(SPX_KV_Q4, 1, kvd) &&
                  (size_t)lo.code_row == c.codes_b && (size_t)(lo.code_row + 2 * lo.scale_row) == c.scales_b,
              "kvd %lld: device row parts %zu bytes, CPU row %zu", (long long)kvd, rb, c.row_bytes);
        CHECK(lo.layer_bytes >= (size_t)n * rb && lo.layer_bytes <= (size_t)n * rb + 1024 && lo.scales_off % 256 == 0 &&
                  lo.zeros_off % 256 == 0 && lo.zeros_off + (size_t)n * (size_t)lo.zero_row + 4 <= lo.layer_bytes,
              "kvd %lld: layout %zu bytes for %zu", (long long)kvd, lo.layer_bytes, (size_t)n * rb);
        float *x = malloc((size_t)kvd * sizeof *x), *d0 = malloc((size_t)kvd * sizeof *d0),
              *d1 = malloc((size_t)kvd * sizeof *d1);
        uint8_t *row = malloc(c.row_bytes);
        for (int64_t p = 0; p < n; p++) {
            for (int64_t i = 0; i < kvd; i++) {
                float v = tl_rand_normal(&rng) * (i % 17 == 3 ? 20.0f : 1.0f) + (i % 64 == 5 ? 8.0f : 0.0f);
                if (p == 1) v = 0.0f;                        /* all-zero groups: floor scale */
                if (p == 2) v = 1.5f;                        /* constant groups */
                if (p == 3) v = fabsf(v) + 3.0f;             /* one-sided groups (z = 0) */
                if (p == 4) v = 1e5f * tl_rand_normal(&rng); /* scales beyond fp16: clamp to 65504 */
                if (p == 5) v = 1e-9f * tl_rand_normal(&rng);
                if (p == 6) v = 0.125f * (float)(i % 31); /* s = 0.25 exactly: w / s = k / 2, ties */
                x[i] = v;
            }
            spx_kv_store(&c, 0, p, x, x);
            const uint8_t *ref = c.k + (size_t)p * c.row_bytes;
            device_style_row(x, kvd, hd, rot, row, c.row_bytes, &rng);
            for (size_t b = 0; b < rb; b++) bad_bytes += row[b] != ref[b]; /* the row's bytes; the host pads to 4 */
            /* the rule alone (rot 1) against g32.c on the unrotated row:
             * catches what the rotation hides, e.g. exact .5 ties (row 6) */
            {
                uint8_t *rq = malloc(c.row_bytes);
                spx_q_quantize_row(x, kvd, NULL, 4, 32, SPX_Q_MINMAX, rq, (uint16_t *)(rq + c.codes_b), rq + c.scales_b);
                device_style_row(x, kvd, hd, 1, row, c.row_bytes, &rng);
                for (size_t b = 0; b < rb; b++) bad_bytes += row[b] != rq[b];
                free(rq);
                device_style_row(x, kvd, hd, rot, row, c.row_bytes, &rng);
            }
            /* dequantization: (q - z) s, rotated back by the same FWHT */
            spx_kv_dequant_row(&c, 0, p, 0, d0);
            for (int64_t i = 0; i < kvd; i++) {
                int64_t g = i / 32, k = i % 32;
                uint16_t sb;
                memcpy(&sb, row + c.codes_b + g * 2, 2);
                int q = (row[g * 16 + k % 16] >> ((k / 16) * 4)) & 15, z = (row[c.scales_b + g / 2] >> ((g & 1) * 4)) & 15;
                d1[i] = (float)(q - z) * spx_kvq4_f16_val(sb);
            }
            for (int64_t h = 0; h < kvd / hd; h++) spx_kvq4_fwht(d1 + h * hd, (int)hd, rot);
            bad_deq += memcmp(d0, d1, (size_t)kvd * sizeof *d0) != 0;
            n_rows++;
        }
        /* the FWHT alone, against kvcache.c's (through a q4 row of a query:
         * spx_kv_scores rotates q; here compare H(H x) = x within rounding
         * and H e_0 = 1/sqrt(rot) on the block) */
        for (int64_t i = 0; i < hd; i++) x[i] = i == 0 ? 1.0f : 0.0f;
        spx_kvq4_fwht(x, (int)hd, rot);
        for (int64_t i = 0; i < hd; i++)
            bad_fwht += x[i] != (i < rot ? 1.0f / sqrtf((float)rot) : 0.0f);
        free(x);
        free(d0);
        free(d1);
        free(row);
        spx_kv_free(&c);
    }
    CHECK(bad_bytes == 0 && bad_deq == 0 && bad_fwht == 0,
          "device q4 math vs kvcache.c over %d rows: %d bytes differ, %d dequantized rows differ, %d FWHT values off",
          n_rows, bad_bytes, bad_deq, bad_fwht);
    printf("device q4 math (cuda/kvq4_math.h): %d rows byte-identical to spx_kv_store\n", n_rows);
}

static void test_end_to_end(void) {
    spx_model *m = NULL;
    spx_model_params mp = {.n_threads = 2};
    CHECK(spx_model_open(tl_shared("models/docllama-58m"), &mp, &m) == SPX_OK, "%s", spx_last_error());
    if (!m) return;
    char *text = tl_read(tl_shared("models/docllama-58m/eval.txt"), NULL);
    size_t n = 4096;
    static int32_t ids[4096];
    CHECK(text && spx_tokenize(m, text, strlen(text) > 4000 ? 4000 : strlen(text), 1, ids, &n) == SPX_OK,
          "tokenize: %s", spx_model_error(m));
    CHECK(n >= 256, "only %zu tokens", n);
    n = 256;
    int64_t V = spx_model_vocab_size(m);
    float *lg[3];
    spx_kv_type types[3] = {SPX_KV_F32, SPX_KV_F16, SPX_KV_Q4};
    for (int k = 0; k < 3; k++) {
        lg[k] = malloc(n * (size_t)V * sizeof(float));
        spx_session *s = NULL;
        spx_session_params sp = {.n_ctx = (int64_t)n, .kv = types[k]};
        CHECK(spx_session_new(m, &sp, &s) == SPX_OK, "session %d", k);
        CHECK(spx_session_eval(s, ids, n, lg[k], 1) == SPX_OK, "eval %d", k);
        spx_session_free(s);
    }
    for (int k = 1; k < 3; k++) {
        double mx = 0, sum = 0;
        int64_t same = 0;
        for (size_t t = 0; t < n; t++) {
            int64_t a = 0, b = 0;
            for (int64_t v = 0; v < V; v++) {
                double d = fabs((double)lg[k][t * V + v] - lg[0][t * V + v]);
                mx = d > mx ? d : mx;
                sum += d;
                if (lg[0][t * V + v] > lg[0][t * V + a]) a = v;
                if (lg[k][t * V + v] > lg[k][t * V + b]) b = v;
            }
            same += a == b;
        }
        double mean = sum / (double)(n * (size_t)V), top1 = (double)same / (double)n;
        printf("docllama %zu tokens, kv %s vs f32: max |dlogit| %.4f, mean %.5f, top-1 same %.1f%%\n", n,
               k == 1 ? "f16" : "q4", mx, mean, 100 * top1);
        if (k == 1) CHECK(mx <= TOL_F16_MAXABS, "f16 KV max error %g > %g", mx, TOL_F16_MAXABS);
        else {
            CHECK(mx <= TOL_Q4_MAXABS, "q4 KV max error %g > %g", mx, TOL_Q4_MAXABS);
            CHECK(mean <= TOL_Q4_MEANABS, "q4 KV mean error %g > %g", mean, TOL_Q4_MEANABS);
            CHECK(top1 >= MIN_Q4_TOP1, "q4 KV top-1 agreement %g < %g", top1, MIN_Q4_TOP1);
        }
    }
    for (int k = 0; k < 3; k++) free(lg[k]);
    free(text);
    spx_model_free(m);
}

/* 1c. Every kernel table's attention steps (qkernels.h: scores_f16,
 * wv_f16, dot_q4g, axpy_q4g) through spx_kv_scores / spx_kv_weighted_v
 * on fp16 and q4 caches (head_dim 64 and 128, head 1 of 2, 300 rows):
 * the table's results against the scalar table's (NULL), within the float
 * rounding of a reordered sum; the scalar table given by name equals NULL
 * bit for bit. */
static void test_tables(void) {
    static const char *names[] = {"scalar", "avx2"};
    uint64_t rng = 77;
    int tested = 0;
    for (int kt = 0; kt < 2; kt++)
        for (int hd = 64; hd <= 128; hd *= 2) {
            const spx_kv_type type = kt ? SPX_KV_Q4 : SPX_KV_F16;
            const int64_t n = 300, kvd = 2 * hd;
            spx_kvcache c;
            spx_err e;
            spx_err_clear(&e);
            if (spx_kv_init(&c, type, 1, n, kvd, hd, &e) != SPX_OK) {
                CHECK(0, "kv init: %s", e.msg);
                continue;
            }
            float *k = malloc((size_t)kvd * sizeof(float)), *v = malloc((size_t)kvd * sizeof(float));
            for (int64_t i = 0; i < n; i++) {
                for (int64_t j = 0; j < kvd; j++) {
                    k[j] = tl_rand_normal(&rng);
                    v[j] = tl_rand_normal(&rng) * 0.5f + 0.1f;
                }
                spx_kv_store(&c, 0, i, k, v);
            }
            float q[128], p[300], s0[300], s1[300], o0[128], o1[128];
            for (int j = 0; j < hd; j++) q[j] = tl_rand_normal(&rng);
            for (int i = 0; i < n; i++) p[i] = tl_rand_uniform(&rng) / (float)n;
            spx_kv_scores(&c, NULL, 0, 1, q, 0, n, 0.125f, s0);
            spx_kv_weighted_v(&c, NULL, 0, 1, p, 0, n, o0);
            for (int t = 0; t < 2; t++) {
                const spx_qkernels *tab = spx_qkernels_get(names[t]);
                if (!tab) continue;
                spx_kv_scores(&c, tab, 0, 1, q, 0, n, 0.125f, s1);
                spx_kv_weighted_v(&c, tab, 0, 1, p, 0, n, o1);
                if (t == 0) {
                    CHECK(memcmp(s0, s1, sizeof(float) * (size_t)n) == 0 && memcmp(o0, o1, sizeof(float) * (size_t)hd) == 0,
                          "%s hd %d: the scalar table by name differs from NULL", kt ? "q4" : "f16", hd);
                } else {
                    tl_cmp r = tl_compare(s1, s0, (size_t)n, TOL_DIRECT, TOL_DIRECT);
                    CHECK(r.ok, "%s hd %d: %s scores differ from scalar: max %g at %zu", kt ? "q4" : "f16", hd, names[t],
                          r.max_abs, r.worst);
                    r = tl_compare(o1, o0, (size_t)hd, TOL_DIRECT, TOL_DIRECT);
                    CHECK(r.ok, "%s hd %d: %s weighted V differs from scalar: max %g at %zu", kt ? "q4" : "f16", hd,
                          names[t], r.max_abs, r.worst);
                    tested++;
                }
                /* three heads sharing KV head 1 (GQA): each is the one-head call, bit for bit */
                float gq[3 * 130], gs[3 * 301], gp[3 * 302], go[3 * 129], one[300];
                for (int i = 0; i < 3 * 130; i++) gq[i] = tl_rand_normal(&rng);
                for (int i = 0; i < 3 * 302; i++) gp[i] = tl_rand_uniform(&rng) / (float)n;
                spx_kv_scores_g(&c, tab, 0, 1, 3, gq, 130, 0, n, 0.125f, gs, 301);
                spx_kv_weighted_v_g(&c, tab, 0, 1, 3, gp, 302, 0, n, go, 129);
                int bad = 0;
                for (int g = 0; g < 3; g++) {
                    spx_kv_scores(&c, tab, 0, 1, gq + g * 130, 0, n, 0.125f, one);
                    bad += memcmp(one, gs + g * 301, sizeof(float) * (size_t)n) != 0;
                    spx_kv_weighted_v(&c, tab, 0, 1, gp + g * 302, 0, n, one);
                    bad += memcmp(one, go + g * 129, sizeof(float) * (size_t)hd) != 0;
                }
                CHECK(bad == 0, "%s hd %d %s: %d of 6 grouped results differ from the one-head calls", kt ? "q4" : "f16",
                      hd, names[t], bad);
            }
            free(k);
            free(v);
            spx_kv_free(&c);
        }
    printf("kernel tables' attention steps: %d cache/table cases against the scalar table\n", tested);
}

int main(void) {
    test_direct();
    test_tables();
    test_device_math();
    test_end_to_end();
    return tl_finish("test_kvcache");
}
