/* fuzz_trdc.c: libFuzzer target for the TRDC container reader.
 *
 * Parses the input as a whole .trdc image (spx_trdc_open_buffer, from a
 * 64-byte aligned copy as a map would be). On failure there must be no
 * handle and a message. On success every invariant the reader promises is
 * re-checked: each component is aligned, inside [4096, manifest offset)
 * and of exactly the size its shape implies (for 2-/3-bit codes of a
 * version 1-2 file: that version's packing), dense data and quantized
 * views point at their components (the repacked 2-/3-bit codes of a
 * version 1-2 file: elsewhere, and every byte of them is read), outlier
 * indices are strictly increasing and < cols, names are found again, the
 * config prints; then every CRC is verified (reading every payload byte,
 * so ASan sees any pointer outside the input).
 *
 * Built with -DSPX_TRDC_SEEDGEN instead, this file is a small program that
 * writes valid seed files with the real writer: `seedgen DIR` (used by
 * fuzz/seeds_trdc.sh). */
#include "format/trdc.h"
#include "quant/g32.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SPX_TRDC_SEEDGEN

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_tensor(const spx_trdc *f, const spx_trdc_tensor *t, const uint8_t *base) {
    uint64_t man = spx_trdc_manifest_offset(f), sum = 0;
    if (!t->name || !t->name[0] || spx_trdc_find(f, t->name) != t) __builtin_trap();
    if (t->ndim < 1 || t->ndim > SPX_TRDC_MAX_DIMS || t->numel < 1) __builtin_trap();
    for (int c = 0; c < SPX_TRDC_C_COUNT; c++) {
        const spx_trdc_component *k = &t->comp[c];
        if (!k->present) continue;
        if (k->offset % SPX_TRDC_ALIGN || k->offset < SPX_TRDC_HEADER_SIZE || k->size == 0 ||
            k->offset + k->size > man)
            __builtin_trap();
        sum += k->size;
    }
    if (sum != t->nbytes) __builtin_trap();
    if (t->kind == SPX_TRDC_DENSE) {
        if ((const uint8_t *)t->data != base + t->comp[SPX_TRDC_C_DATA].offset) __builtin_trap();
        if ((uint64_t)t->numel * spx_dtype_size(t->dtype) != t->nbytes) __builtin_trap();
        return;
    }
    if (t->kind == SPX_TRDC_REFINE) { /* a .refine's residual columns */
        if (spx_trdc_contents(f) != SPX_TRDC_CONTENTS_REFINE || spx_trdc_version(f) < 4 || t->ndim != 2 ||
            t->refine.col_stride < (t->shape[0] + 1) / 2 ||
            t->comp[SPX_TRDC_C_CODES].size != (uint64_t)t->shape[1] * (uint64_t)t->refine.col_stride ||
            t->comp[SPX_TRDC_C_SCALES].size != (uint64_t)t->shape[0] * 4 ||
            t->refine.codes != base + t->comp[SPX_TRDC_C_CODES].offset ||
            (const uint8_t *)t->refine.scales != base + t->comp[SPX_TRDC_C_SCALES].offset)
            __builtin_trap();
        return;
    }
    if (spx_trdc_contents(f) != SPX_TRDC_CONTENTS_MODEL) __builtin_trap();
    const spx_qtensor *q = &t->q;
    if (t->ndim != 2 || q->rows != t->shape[0] || q->cols != t->shape[1] || q->cols % q->group)
        __builtin_trap();
    if (q->layout != SPX_Q_ROWS && (q->layout != SPX_Q_TILED || !spx_q_tiled_ok(q->bits, q->group, q->cols) ||
                                    spx_trdc_version(f) < 2))
        __builtin_trap();
    const int legacy = q->bits != 4 && spx_trdc_version(f) < 3;
    const uint64_t cb = legacy ? (uint64_t)(q->rows * spx_q_legacy_codes_row_bytes(q->cols, q->bits))
                               : (uint64_t)spx_q_codes_bytes(q->rows, q->cols, q->bits, q->layout);
    if (cb != t->comp[SPX_TRDC_C_CODES].size ||
        (uint64_t)spx_q_scales_bytes(q->rows, q->cols, q->group, q->layout) != t->comp[SPX_TRDC_C_SCALES].size ||
        (uint64_t)spx_q_zeros_bytes(q->rows, q->cols, q->group, q->layout) != t->comp[SPX_TRDC_C_ZEROS].size)
        __builtin_trap();
    if (legacy) { /* repacked into the handle's memory: all of it readable */
        if (q->codes == base + t->comp[SPX_TRDC_C_CODES].offset) __builtin_trap();
        volatile uint8_t x = 0;
        for (int64_t i = 0; i < spx_q_codes_bytes(q->rows, q->cols, q->bits, q->layout); i++) x ^= q->codes[i];
        (void)x;
    } else if (q->codes != base + t->comp[SPX_TRDC_C_CODES].offset) {
        __builtin_trap();
    }
    if ((const uint8_t *)q->scales != base + t->comp[SPX_TRDC_C_SCALES].offset) __builtin_trap();
    for (int64_t j = 0; j < q->n_outliers; j++)
        if (q->outlier_idx[j] < 0 || q->outlier_idx[j] >= q->cols ||
            (j && q->outlier_idx[j] <= q->outlier_idx[j - 1]))
            __builtin_trap();
    if (q->n_outliers && (uint64_t)(q->rows * q->n_outliers * 2) != t->comp[SPX_TRDC_C_OUTLIER_VAL].size)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    void *mem = NULL;
    if (posix_memalign(&mem, 64, size ? size : 1) != 0) return 0;
    uint8_t *buf = mem;
    if (size) memcpy(buf, data, size);
    spx_err e;
    spx_err_clear(&e);
    spx_trdc *f = NULL;
    if (spx_trdc_open_buffer(buf, size, "fuzz", &f, &e) != SPX_OK) {
        if (f || e.code == SPX_OK || e.msg[0] == '\0') __builtin_trap();
        free(buf);
        return 0;
    }
    if (spx_trdc_manifest_offset(f) + spx_trdc_manifest_size(f) != size) __builtin_trap();
    for (size_t i = 0; i < spx_trdc_count(f); i++) check_tensor(f, spx_trdc_at(f, i), buf);
    if (spx_trdc_at(f, spx_trdc_count(f)) != NULL) __builtin_trap();
    char *cfg = spx_trdc_config_json(f);
    if (!cfg) __builtin_trap();
    free(cfg);
    volatile size_t sink = 0;
    if (spx_trdc_tokenizer_json(f)) sink += strlen(spx_trdc_tokenizer_json(f));
    if (spx_trdc_tokenizer_config_json(f)) sink += strlen(spx_trdc_tokenizer_config_json(f));
    sink += strlen(spx_trdc_generator(f)) + (size_t)spx_trdc_source_bytes(f);
    spx_trdc_verify_report rep;
    spx_err_clear(&e);
    spx_status st = spx_trdc_verify(f, NULL, NULL, NULL, &rep, &e);
    if ((st == SPX_OK) != (rep.n_mismatches == 0) || (st != SPX_OK && st != SPX_ERR_CRC)) __builtin_trap();
    (void)sink;
    spx_trdc_close(f);
    free(buf);
    return 0;
}

#else /* SPX_TRDC_SEEDGEN: writes valid seed files into argv[1] */

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static uint8_t rnd8(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint8_t)g_rng;
}
static void *rnd_buf(size_t n) {
    uint8_t *p = malloc(n ? n : 1);
    for (size_t i = 0; p && i < n; i++) p[i] = rnd8();
    return p;
}

static int add_quant(spx_trdc_writer *w, const char *name, int64_t rows, int64_t cols, int bits,
                     int group, int64_t n_out, int layout, spx_err *e) {
    spx_qtensor q = {rows, cols, bits, group, n_out, NULL, NULL, NULL, NULL, NULL, layout};
    uint8_t *codes = rnd_buf((size_t)spx_q_codes_bytes(rows, cols, bits, layout));
    uint16_t *scales = rnd_buf((size_t)spx_q_scales_bytes(rows, cols, group, layout));
    uint8_t *zeros = rnd_buf((size_t)spx_q_zeros_bytes(rows, cols, group, layout));
    int32_t *idx = malloc((size_t)(n_out ? n_out : 1) * sizeof *idx);
    uint16_t *val = rnd_buf((size_t)(rows * n_out * 2));
    for (int64_t j = 0; j < n_out; j++) idx[j] = (int32_t)(j * (cols / n_out));
    q.codes = codes;
    q.scales = scales;
    q.zeros = zeros;
    q.outlier_idx = idx;
    q.outlier_val = val;
    spx_status st = spx_trdc_writer_add_quant(w, name, &q, 3.5, (double)n_out / (double)cols, e);
    free(codes);
    free(scales);
    free(zeros);
    free(idx);
    free(val);
    return st == SPX_OK;
}

static int add_dense(spx_trdc_writer *w, const char *name, spx_dtype dt, int ndim,
                     const int64_t *shape, spx_err *e) {
    size_t n = spx_dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    void *d = rnd_buf(n);
    spx_status st = spx_trdc_writer_add_dense(w, name, dt, ndim, shape, d, n, e);
    free(d);
    return st == SPX_OK;
}

static int seed(const char *dir, const char *name, int variant) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    spx_err e;
    spx_err_clear(&e);
    spx_trdc_writer *w = NULL;
    if (spx_trdc_writer_open(path, &w, &e) != SPX_OK) goto fail;
    int64_t s1[1] = {8}, s2[2] = {2, 3}, s3[3] = {2, 1, 2};
    int ok = 1;
    const char *tok = NULL, *tcfg = NULL, *src = NULL;
    switch (variant) {
    case 0: /* no tensors: the manifest alone */
        break;
    case 1: /* one of each kind, outliers, tokenizer */
        ok = add_dense(w, "norm", SPX_DT_F32, 1, s1, &e) && add_quant(w, "w", 2, 32, 4, 32, 2, SPX_Q_ROWS, &e);
        tok = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"\\u00e9\":1},\"merges\":[]}}";
        tcfg = "{\"add_bos_token\":true}";
        src = "{\"bytes\":1024,\"params\":72}";
        break;
    case 2: /* bits 2 and 3, groups 64 and 128, one outlier; F16 and BF16 */
        ok = add_quant(w, "q2", 1, 64, 2, 64, 0, SPX_Q_ROWS, &e) && add_quant(w, "q3", 1, 128, 3, 128, 1, SPX_Q_ROWS, &e) &&
             add_dense(w, "h", SPX_DT_F16, 2, s2, &e) && add_dense(w, "b", SPX_DT_BF16, 3, s3, &e);
        src = "{\"bytes\":4096}";
        break;
    case 3: /* version 2: a tiled matrix (rows not a multiple of 16) beside a row-major one */
        ok = add_quant(w, "t", 3, 128, 4, 32, 1, SPX_Q_TILED, &e) && add_quant(w, "r", 1, 32, 4, 32, 0, SPX_Q_ROWS, &e);
        break;
    case 4: /* version 3 beside a tiled matrix: 3-bit G32 in a partial item (160 columns), 2-bit G128 */
        ok = add_quant(w, "t", 16, 128, 4, 32, 0, SPX_Q_TILED, &e) && add_quant(w, "q3", 2, 160, 3, 32, 2, SPX_Q_ROWS, &e) &&
             add_quant(w, "q2", 1, 256, 2, 128, 0, SPX_Q_ROWS, &e);
        break;
    case 5: { /* version 4, a .refine: two residuals, an odd row count and a padded stride */
        uint8_t *c1 = rnd_buf(5 * 3), *c2 = rnd_buf(64 * 2);
        float s[5] = {0.5f, 0.25f, 1e-3f, 0, 2};
        ok = c1 && c2 && spx_trdc_writer_add_refine(w, "w1", 5, 5, 3, c1, s, 0x1234abcdu, &e) == SPX_OK &&
             spx_trdc_writer_add_refine(w, "w2", 2, 2, 64, c2, s, 7, &e) == SPX_OK;
        free(c1);
        free(c2);
        break;
    }
    }
    if (!ok) goto fail;
    if (spx_trdc_writer_finish(w, "{\"model_type\":\"llama\",\"hidden_size\":32,\"rope_theta\":10000.0}",
                               tok, tcfg, "{\"bits\":4,\"group\":32,\"outliers\":\"auto\"}", src,
                               &e) != SPX_OK) {
        w = NULL;
        goto fail;
    }
    return 0;
fail:
    spx_trdc_writer_abort(w);
    fprintf(stderr, "seedgen: %s\n", e.msg);
    return 1;
}

/* A version 1 file with a 3-bit [2, 64] G32 matrix in that version's
 * packing (nibbles, the size of 4-bit codes): a 4-bit matrix written
 * normally, relabelled (the text "bits":4 -> "bits":3 and the version). */
static int legacy_seed(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    spx_err e;
    spx_err_clear(&e);
    spx_trdc_writer *w = NULL;
    if (spx_trdc_writer_open(path, &w, &e) != SPX_OK || !add_quant(w, "q3", 2, 64, 4, 32, 1, SPX_Q_ROWS, &e) ||
        spx_trdc_writer_finish(w, "{\"model_type\":\"llama\"}", NULL, NULL, NULL, NULL, &e) != SPX_OK) {
        fprintf(stderr, "seedgen: %s\n", e.msg);
        return 1;
    }
    FILE *fp = fopen(path, "r+b");
    if (!fp) return 1;
    static uint8_t img[1 << 16];
    size_t n = fread(img, 1, sizeof img, fp);
    uint8_t *b = n > 24 ? memmem(img, n, "\"bits\":4", 8) : NULL;
    int rc = 1;
    if (b && img[8] == 1) {
        b[7] = '3';
        rewind(fp);
        rc = fwrite(img, 1, n, fp) == n ? 0 : 1;
    }
    fclose(fp);
    if (rc) fprintf(stderr, "seedgen: %s: could not relabel the matrix\n", path);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: seedgen DIR\n");
        return 2;
    }
    return seed(argv[1], "seed_manifest_only.trdc", 0) | seed(argv[1], "seed_dense_quant.trdc", 1) |
           seed(argv[1], "seed_bits23.trdc", 2) | seed(argv[1], "seed_tiled.trdc", 3) |
           seed(argv[1], "seed_v3_items.trdc", 4) | seed(argv[1], "seed_refine.refine", 5) |
           legacy_seed(argv[1], "seed_v1_bits3.trdc");
}

#endif
