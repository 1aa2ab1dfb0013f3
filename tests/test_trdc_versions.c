/* test_trdc_versions.c: .trdc versions (docs/trdc.md sections 1.1 and 8).
 * A writer gives a file the lowest version that holds its matrices (1:
 * row-major 4-bit, 2: a tiled one, 3: a 2- or 3-bit one); version 1 and 2
 * files with 2- and 3-bit matrices in their packing (group order, 4 or 2
 * codes per byte) still open, from a file and from a buffer, and give the
 * weights their bytes say (decoded here without the library), verify
 * against their stored bytes, convert to version 3 at 3/8 byte per 3-bit
 * code with the same weights, and are refused when labelled version 3.
 * Such files are made from 4-bit carriers whose components have the same
 * sizes, their manifest entries relabelled. */
#include "testlib.h"

#include "core/half.h"
#include "format/trdc.h"
#include "quant/compress.h"
#include "quant/g32.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x5eed7dc4b03ull;

static char *tmp_path(const char *name) {
    static char bufs[4][1024];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, sizeof bufs[0], "%s/%s", tl_tmpdir(), name);
    return b;
}

static void set_u64(uint8_t *b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++) b[at + (size_t)i] = (uint8_t)(v >> (8 * i));
}

/* A quantized matrix with random codes, scales, zero points and outliers
 * (strictly increasing indices), owned by the test. */
typedef struct qt_owned {
    spx_qtensor q;
    uint8_t *codes, *zeros;
    uint16_t *scales, *oval;
    int32_t *oidx;
} qt_owned;

static void *rand_bytes(size_t n) {
    uint8_t *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(tl_rand_u64(&g_rng) >> 29);
    return p;
}

static qt_owned make_quant(int64_t rows, int64_t cols, int bits, int group, int64_t n_out) {
    qt_owned o;
    memset(&o, 0, sizeof o);
    o.codes = rand_bytes((size_t)(rows * spx_q_codes_row_bytes(cols, bits)));
    o.scales = rand_bytes((size_t)(rows * spx_q_groups(cols, group) * 2));
    o.zeros = rand_bytes((size_t)(rows * spx_q_zeros_row_bytes(cols, group)));
    if (n_out > 0) {
        o.oidx = malloc((size_t)n_out * sizeof *o.oidx);
        for (int64_t j = 0; j < n_out; j++) o.oidx[j] = (int32_t)(j * (cols / n_out) + 1);
        o.oval = rand_bytes((size_t)(rows * n_out * 2));
    }
    o.q = (spx_qtensor){rows, cols, bits, group, n_out, o.codes, o.scales, o.zeros, o.oidx, o.oval, SPX_Q_ROWS};
    return o;
}

static void free_quant(qt_owned *o) {
    free(o->codes);
    free(o->scales);
    free(o->zeros);
    free(o->oidx);
    free(o->oval);
}

/* img must fail to open, from a file and from a buffer, with code and a
 * message containing want. */
static void expect_fail(const char *what, const uint8_t *img, size_t len, spx_status code, const char *want) {
    const char *path = tmp_path("refused.trdc");
    CHECK(tl_write(path, img, len) == 0, "write %s", path);
    for (int pass = 0; pass < 2; pass++) {
        spx_err e = {0};
        spx_trdc *f = NULL;
        uint8_t *copy = malloc(len ? len : 1);
        memcpy(copy, img, len);
        spx_status st = pass == 0 ? spx_trdc_open(path, &f, &e) : spx_trdc_open_buffer(copy, len, "refused", &f, &e);
        CHECK(st == code && f == NULL && strstr(e.msg, want), "[%s] pass %d: status %s, message: %s", what, pass,
              spx_status_name(st), e.msg);
        if (pass == 0) printf("  %-34s -> %s\n", what, e.msg);
        spx_trdc_close(f);
        free(copy);
    }
}

/* The version a file of these matrices gets. */
static uint64_t version_of(const spx_qtensor *const *qs, int n) {
    const char *path = tmp_path("version.trdc");
    spx_err e = {0};
    spx_trdc_writer *w = NULL;
    spx_trdc *f = NULL;
    uint64_t v = 0;
    CHECK(spx_trdc_writer_open(path, &w, &e) == SPX_OK, "%s", e.msg);
    for (int i = 0; i < n && w; i++) {
        char name[16];
        snprintf(name, sizeof name, "m%d", i);
        CHECK(spx_trdc_writer_add_quant(w, name, qs[i], NAN, NAN, &e) == SPX_OK, "%s", e.msg);
    }
    CHECK(spx_trdc_writer_finish(w, "{\"model_type\":\"llama\"}", NULL, NULL, NULL, NULL, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_open(path, &f, &e) == SPX_OK, "%s", e.msg);
    if (f) v = spx_trdc_version(f);
    spx_trdc_close(f);
    return v;
}

static void test_versions(void) {
    qt_owned r4 = make_quant(16, 128, 4, 32, 0), b3 = make_quant(4, 256, 3, 32, 2), b2 = make_quant(4, 128, 2, 64, 0);
    spx_qtensor t4;
    void *mem = NULL;
    spx_err e = {0};
    CHECK(spx_q_tile_alloc(&r4.q, &t4, &mem, &e) == SPX_OK, "%s", e.msg);
    const spx_qtensor *a[] = {&r4.q}, *b[] = {&r4.q, &t4}, *c[] = {&r4.q, &b2.q}, *d[] = {&t4, &b3.q, &r4.q};
    CHECK(version_of(a, 1) == 1, "4-bit rows: version 1");
    CHECK(version_of(b, 2) == 2, "a tiled matrix: version 2");
    CHECK(version_of(c, 2) == 3, "a 2-bit matrix: version 3");
    CHECK(version_of(d, 3) == 3, "tiled and 3-bit: version 3");
    free(mem);
    free_quant(&r4);
    free_quant(&b3);
    free_quant(&b2);
}

/* Code k of group g of a row in the version 1-2 packing, decoded here
 * without the library: cpb codes per byte (4 for bits 2, 2 for bits 3),
 * byte g B + k % B, slot k / B, B = group / cpb. */
static int legacy_code(const uint8_t *row, int64_t col, int bits, int group) {
    const int cpb = bits == 2 ? 4 : 2, B = group / cpb, w = 8 / cpb, k = (int)(col % group);
    return (row[(col / group) * B + k % B] >> ((k / B) * w)) & ((1 << w) - 1);
}

/* A version `ver` file with "w2" (2-bit [5, 256] G64, 3 outliers), "w3"
 * (3-bit [6, 384] G32) and "w4" (4-bit) in the packing of versions 1-2,
 * written through 4-bit carriers of the same component sizes (w3: the
 * same shape, codes as nibbles < 8; w2: [5, 128] G32: rows x 128 / 2 code
 * bytes = rows x 256 / 4) whose manifest entries are then relabelled. The
 * carriers' scales are real fp16 numbers, their zero points fit the width. */
static uint8_t *legacy_image(int ver, qt_owned *o2, qt_owned *o3, size_t *len) {
    *o2 = make_quant(5, 128, 4, 32, 3);
    *o3 = make_quant(6, 384, 4, 32, 0);
    qt_owned o4 = make_quant(3, 64, 4, 32, 0);
    qt_owned *os[2] = {o2, o3};
    for (int k = 0; k < 2; k++) {
        spx_qtensor *q = &os[k]->q;
        const int zmask = k == 0 ? 0x33 : 0x77;
        for (int64_t i = 0; i < q->rows * spx_q_groups(q->cols, q->group); i++)
            os[k]->scales[i] = spx_f32_to_f16(0.001f + (float)(tl_rand_u64(&g_rng) % 1000) * 1e-5f);
        for (int64_t i = 0; i < q->rows * spx_q_zeros_row_bytes(q->cols, q->group); i++) os[k]->zeros[i] &= (uint8_t)zmask;
        if (k == 1)
            for (int64_t i = 0; i < q->rows * q->cols / 2; i++) os[k]->codes[i] &= 0x77;
    }
    for (int64_t i = 0; i < o2->q.rows * o2->q.n_outliers; i++) o2->oval[i] = spx_f32_to_f16(0.5f);
    const char *path = tmp_path("legacy-carrier.trdc");
    spx_err e = {0};
    spx_trdc_writer *w = NULL;
    CHECK(spx_trdc_writer_open(path, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_quant(w, "w2", &o2->q, NAN, NAN, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_quant(w, "w3", &o3->q, NAN, NAN, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_quant(w, "w4", &o4.q, NAN, NAN, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_finish(w, "{\"model_type\":\"llama\"}", NULL, NULL, NULL, NULL, &e) == SPX_OK, "%s", e.msg);
    free_quant(&o4);
    size_t fl = 0;
    uint8_t *img = (uint8_t *)tl_read(path, &fl);
    uint64_t ml = 0;
    for (int i = 7; i >= 0; i--) ml = (ml << 8) | img[16 + i];
    size_t off = fl - (size_t)ml;
    char *man = malloc((size_t)ml + 1);
    memcpy(man, img + off, (size_t)ml);
    man[ml] = 0;
    cJSON *r = cJSON_Parse(man), *ts = cJSON_GetObjectItem(r, "tensors");
    cJSON *t2 = cJSON_GetArrayItem(ts, 0), *t3 = cJSON_GetArrayItem(ts, 1);
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(t2, "shape"), 1, cJSON_CreateNumber(256));
    cJSON_ReplaceItemInObject(t2, "bits", cJSON_CreateNumber(2));
    cJSON_ReplaceItemInObject(t2, "group", cJSON_CreateNumber(64));
    cJSON_ReplaceItemInObject(t3, "bits", cJSON_CreateNumber(3));
    cJSON_ReplaceItemInObject(r, "version", cJSON_CreateNumber(ver));
    char *m2 = cJSON_PrintUnformatted(r);
    *len = off + strlen(m2);
    uint8_t *out = malloc(*len);
    memcpy(out, img, off);
    memcpy(out + off, m2, strlen(m2));
    set_u64(out, 8, (uint64_t)ver);
    set_u64(out, 16, strlen(m2));
    cJSON_Delete(r);
    free(m2);
    free(man);
    free(img);
    /* the carriers now describe the legacy tensors' bytes */
    return out;
}

/* Row r of a legacy matrix, dequantized here: (code - z) s, plus outliers. */
static void legacy_row(const qt_owned *o, int64_t cols, int bits, int group, int64_t r, float *out) {
    const uint8_t *cr = o->codes + r * (bits == 2 ? cols / 4 : cols / 2);
    const int64_t ng = cols / group, zrb = (ng + 1) / 2;
    for (int64_t c = 0; c < cols; c++) {
        const int64_t g = c / group;
        const int z = (o->zeros[r * zrb + g / 2] >> (4 * (g & 1))) & 15;
        out[c] = (float)(legacy_code(cr, c, bits, group) - z) * spx_f16_to_f32(o->scales[r * ng + g]);
    }
    for (int64_t j = 0; j < o->q.n_outliers; j++) out[o->oidx[j]] += spx_f16_to_f32(o->oval[r * o->q.n_outliers + j]);
}

/* The matrices of f named w2 and w3 dequantize as the legacy bytes say. */
static void check_legacy_numbers(const spx_trdc *f, const qt_owned *o2, const qt_owned *o3, const char *what) {
    const struct { const char *name; const qt_owned *o; int64_t cols; int bits, group; } m[2] = {
        {"w2", o2, 256, 2, 64}, {"w3", o3, 384, 3, 32}};
    float got[384], want[384];
    for (int k = 0; k < 2; k++) {
        const spx_trdc_tensor *t = spx_trdc_find(f, m[k].name);
        CHECK(t && t->q.bits == m[k].bits && t->q.group == m[k].group && t->q.cols == m[k].cols, "%s: %s fields", what,
              m[k].name);
        if (!t) continue;
        int bad = 0;
        for (int64_t r = 0; r < t->q.rows; r++) {
            spx_q_dequant_row_f32(&t->q, r, got);
            legacy_row(m[k].o, m[k].cols, m[k].bits, m[k].group, r, want);
            bad += memcmp(got, want, (size_t)m[k].cols * sizeof(float)) != 0;
        }
        CHECK(bad == 0, "%s: %s: %d rows dequantize differently from the legacy bytes", what, m[k].name, bad);
    }
}

static void test_legacy(void) {
    for (int ver = 1; ver <= 2; ver++) {
        qt_owned o2, o3;
        size_t len = 0;
        uint8_t *img = legacy_image(ver, &o2, &o3, &len);
        char what[64], name[64];
        snprintf(what, sizeof what, "version %d legacy file", ver);
        snprintf(name, sizeof name, "legacy-v%d.trdc", ver);
        const char *path = tmp_path(name);
        CHECK(tl_write(path, img, len) == 0, "write");
        spx_trdc *f = NULL;
        spx_err e = {0};
        CHECK(spx_trdc_open(path, &f, &e) == SPX_OK, "%s opens: %s", what, e.msg);
        if (f) {
            CHECK(spx_trdc_version(f) == (uint64_t)ver, "%s: version", what);
            const spx_trdc_tensor *t3 = spx_trdc_find(f, "w3");
            CHECK(t3 && t3->comp[SPX_TRDC_C_CODES].size == 6 * 384 / 2, "%s: w3 stores nibbles", what);
            CHECK(t3 && memcmp(t3->q.codes, o3.codes, 16) != 0, "%s: w3's codes are repacked, not the file's nibbles",
                  what);
            check_legacy_numbers(f, &o2, &o3, what);
            CHECK(spx_trdc_verify(f, NULL, NULL, NULL, NULL, &e) == SPX_OK, "%s: verify (the stored bytes): %s", what,
                  e.msg);
            spx_trdc_close(f);
        }
        /* from a buffer too (the fuzzer's entry) */
        uint8_t *copy = malloc(len);
        memcpy(copy, img, len);
        CHECK(spx_trdc_open_buffer(copy, len, "legacy-buffer", &f, &e) == SPX_OK, "%s buffer: %s", what, e.msg);
        if (f) {
            check_legacy_numbers(f, &o2, &o3, what);
            const spx_trdc_tensor *t3 = spx_trdc_find(f, "w3"), *t4 = spx_trdc_find(f, "w4");
            CHECK(t3 && (const uint8_t *)t3->q.codes != copy + t3->comp[SPX_TRDC_C_CODES].offset && t4 &&
                      t4->q.codes == copy + t4->comp[SPX_TRDC_C_CODES].offset,
                  "%s: only the 2-/3-bit codes are copies; 4-bit ones stay in the image", what);
        }
        spx_trdc_close(f);
        free(copy);
        /* rewritten (spectra convert): version 3, 3 / 8 byte per 3-bit code,
         * the same numbers */
        const char *p3 = tmp_path("legacy-v3.trdc");
        size_t changed = 0;
        CHECK(spx_relayout(path, p3, 1, NULL, NULL, &changed, &e) == SPX_OK, "%s relayout: %s", what, e.msg);
        CHECK(spx_trdc_open(p3, &f, &e) == SPX_OK, "%s rewritten: %s", what, e.msg);
        if (f) {
            CHECK(spx_trdc_version(f) == 3, "%s rewritten: version %llu", what, (unsigned long long)spx_trdc_version(f));
            const spx_trdc_tensor *t3 = spx_trdc_find(f, "w3"), *t2 = spx_trdc_find(f, "w2");
            CHECK(t3 && t3->comp[SPX_TRDC_C_CODES].size == 6 * 384 * 3 / 8 && t2 &&
                      t2->comp[SPX_TRDC_C_CODES].size == 5 * 256 / 4,
                  "%s rewritten: codes at their width", what);
            check_legacy_numbers(f, &o2, &o3, "rewritten");
            spx_trdc_close(f);
        }
        /* the same bytes labelled version 3 are refused: the 3-bit codes
         * are the wrong size for the version 3 packing */
        set_u64(img, 8, 3);
        char *mv = (char *)memmem(img, len, "\"version\":", 10);
        if (mv) mv[10] = '3';
        expect_fail("legacy packing labelled version 3", img, len, SPX_ERR_FORMAT, "expected");
        free(img);
        free_quant(&o2);
        free_quant(&o3);
    }
}

int main(void) {
    test_versions();
    test_legacy();
    return tl_finish("test_trdc_versions");
}
