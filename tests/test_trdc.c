/* test_trdc.c: the TRDC container (src/format/trdc.c, docs/trdc.md).
 *
 * 1. Write -> read round trip with fresh random dense (F32/F16/BF16) and
 *    quantized tensors (bits 2/3/4, groups 32/64/128, with and without
 *    outliers): every byte, every field, config/tokenizer/settings, CRC
 *    verification, through both spx_trdc_open and spx_trdc_open_buffer.
 * 2. Handcrafted corrupt files, each made by editing a valid file (header
 *    bytes, payload bytes or manifest text): each must fail cleanly with
 *    the expected status and a message naming the problem.
 * 3. CRC mismatches: open succeeds, verify reports every bad component.
 * 4. Writer failures (abort, bad arguments, invalid JSON, a write error
 *    from a file-size limit standing in for a full disk) leave neither the
 *    final file nor the temp file behind. */
#define _POSIX_C_SOURCE 200809L
#include "testlib.h"

#include "core/util.h"
#include "format/trdc.h"
#include "quant/g32.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static uint64_t g_rng = 0x5eed7dc4b01ull;

static void *rand_bytes(size_t n) {
    uint8_t *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(tl_rand_u64(&g_rng) >> 29);
    return p;
}

/* ---- tensors owned by the test ---------------------------------------- */

typedef struct qt_owned {
    spx_qtensor q;
    uint8_t *codes, *zeros;
    uint16_t *scales, *oval;
    int32_t *oidx;
} qt_owned;

static qt_owned make_quant(int64_t rows, int64_t cols, int bits, int group, int64_t n_out) {
    qt_owned o;
    memset(&o, 0, sizeof o);
    o.codes = rand_bytes((size_t)(rows * spx_q_codes_row_bytes(cols, bits)));
    o.scales = rand_bytes((size_t)(rows * spx_q_groups(cols, group) * 2));
    o.zeros = rand_bytes((size_t)(rows * spx_q_zeros_row_bytes(cols, group)));
    if (n_out > 0) {
        /* a random strictly increasing subset of [0, cols) */
        o.oidx = malloc((size_t)n_out * sizeof *o.oidx);
        int64_t k = 0;
        for (int64_t c = 0; c < cols && k < n_out; c++) {
            int64_t need = n_out - k, left = cols - c;
            if ((int64_t)(tl_rand_u64(&g_rng) % (uint64_t)left) < need) o.oidx[k++] = (int32_t)c;
        }
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

typedef struct dense_owned {
    const char *name;
    spx_dtype dt;
    int ndim;
    int64_t shape[4];
    size_t nbytes;
    void *data;
} dense_owned;

static dense_owned make_dense(const char *name, spx_dtype dt, int ndim, const int64_t *shape) {
    dense_owned d = {name, dt, ndim, {0}, spx_dtype_size(dt), NULL};
    for (int i = 0; i < ndim; i++) {
        d.shape[i] = shape[i];
        d.nbytes *= (size_t)shape[i];
    }
    d.data = rand_bytes(d.nbytes);
    return d;
}

static int file_exists(const char *p) { return access(p, F_OK) == 0; }

static char *tmp_path(const char *name) {
    static char bufs[4][1024];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, sizeof bufs[0], "%s/%s", tl_tmpdir(), name);
    return b;
}

static const char *temp_of(const char *final) {
    static char b[1100];
    snprintf(b, sizeof b, "%s.tmp.%ld", final, (long)getpid());
    return b;
}

/* ======================================================================
 * 1. Round trip
 * ====================================================================== */

static void check_quant_equal(const spx_trdc_tensor *t, const qt_owned *o, const char *name) {
    const spx_qtensor *a = &t->q, *b = &o->q;
    CHECK(t->kind == SPX_TRDC_QUANT, "%s kind", name);
    CHECK(t->ndim == 2 && t->shape[0] == b->rows && t->shape[1] == b->cols, "%s shape", name);
    CHECK(t->numel == b->rows * b->cols, "%s numel", name);
    CHECK(a->rows == b->rows && a->cols == b->cols && a->bits == b->bits && a->group == b->group &&
              a->n_outliers == b->n_outliers,
          "%s q fields", name);
    size_t nc = (size_t)(b->rows * spx_q_codes_row_bytes(b->cols, b->bits));
    size_t ns = (size_t)(b->rows * spx_q_groups(b->cols, b->group) * 2);
    size_t nz = (size_t)(b->rows * spx_q_zeros_row_bytes(b->cols, b->group));
    CHECK(t->comp[SPX_TRDC_C_CODES].size == nc && memcmp(a->codes, b->codes, nc) == 0, "%s codes", name);
    CHECK(t->comp[SPX_TRDC_C_SCALES].size == ns && memcmp(a->scales, b->scales, ns) == 0, "%s scales", name);
    CHECK(t->comp[SPX_TRDC_C_ZEROS].size == nz && memcmp(a->zeros, b->zeros, nz) == 0, "%s zeros", name);
    if (b->n_outliers) {
        size_t ni = (size_t)b->n_outliers * 4, nv = (size_t)(b->rows * b->n_outliers * 2);
        CHECK(memcmp(a->outlier_idx, b->outlier_idx, ni) == 0, "%s outlier_idx", name);
        CHECK(memcmp(a->outlier_val, b->outlier_val, nv) == 0, "%s outlier_val", name);
        CHECK(t->comp[SPX_TRDC_C_OUTLIER_IDX].present && t->comp[SPX_TRDC_C_OUTLIER_VAL].present,
              "%s outlier comps", name);
        CHECK(t->nbytes == nc + ns + nz + ni + nv, "%s nbytes %zu", name, t->nbytes);
    } else {
        CHECK(!a->outlier_idx && !a->outlier_val, "%s no outlier pointers", name);
        CHECK(!t->comp[SPX_TRDC_C_OUTLIER_IDX].present && !t->comp[SPX_TRDC_C_OUTLIER_VAL].present,
              "%s no outlier comps", name);
        CHECK(t->nbytes == nc + ns + nz, "%s nbytes %zu", name, t->nbytes);
    }
    CHECK(!t->comp[SPX_TRDC_C_DATA].present && t->data == NULL, "%s no data", name);
}

static void check_layout(const spx_trdc *f, const uint8_t *base) {
    for (size_t i = 0; i < spx_trdc_count(f); i++) {
        const spx_trdc_tensor *t = spx_trdc_at(f, i);
        for (int c = 0; c < SPX_TRDC_C_COUNT; c++) {
            if (!t->comp[c].present) continue;
            CHECK(t->comp[c].offset % SPX_TRDC_ALIGN == 0, "%s.%s offset %llu not aligned", t->name,
                  spx_trdc_comp_name(c), (unsigned long long)t->comp[c].offset);
            CHECK(t->comp[c].offset + t->comp[c].size <= spx_trdc_manifest_offset(f), "%s end", t->name);
        }
        if (t->kind == SPX_TRDC_DENSE)
            CHECK((const uint8_t *)t->data == base + t->comp[SPX_TRDC_C_DATA].offset, "%s data ptr", t->name);
        else
            CHECK(t->q.codes == base + t->comp[SPX_TRDC_C_CODES].offset, "%s codes ptr", t->name);
    }
}

static const char *k_tok_cfg = "{\"add_bos_token\": true, \"note\": \"quotes \\\" backslash \\\\ "
                               "tab \\t caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80\"}\n";
static const char *k_quant = "{\"bits\": 4, \"group\": 32, \"outliers\": \"auto\", \"method\": \"test\"}";
static const char *k_source = "{\"bytes\": 123456, \"params\": 7890, \"path\": \"/tmp/src\"}";

static void test_roundtrip(void) {
    size_t cfg_len = 0, tok_len = 0;
    char *cfg = tl_read(tl_shared("models/stories260K/config.json"), &cfg_len);
    char *tok = tl_read(tl_shared("models/stories260K/tokenizer.json"), &tok_len);
    CHECK(cfg && tok, "fixtures readable");
    if (!cfg || !tok) return;

    int64_t s1[3] = {3, 5, 7}, s2[1] = {1000}, s3[2] = {17, 33}, s4[2] = {300, 20};
    dense_owned dn[4] = {make_dense("tok_embeddings.weight", SPX_DT_F32, 3, s1),
                         make_dense("norm.weight", SPX_DT_F16, 1, s2),
                         make_dense("odd.bf16", SPX_DT_BF16, 2, s3),
                         make_dense("big.f32", SPX_DT_F32, 2, s4)};
    struct { const char *name; int64_t rows, cols; int bits, group; int64_t nout; double kappa, r; } qs[] = {
        {"layers.0.attention.wq.weight", 5, 64, 4, 32, 0, 2.5, 0.0},
        {"layers.0.attention.wk.weight", 7, 256, 4, 32, 3, 11.75, 3.0 / 256},
        {"layers.0.feed_forward.w1.weight", 3, 128, 2, 64, 0, NAN, NAN},
        {"layers.0.feed_forward.w2.weight", 9, 384, 3, 128, 5, 4.0, 5.0 / 384},
        {"output.weight", 33, 96, 4, 32, 96, 100.0, 1.0},
    };
    enum { NQ = sizeof qs / sizeof qs[0] };
    qt_owned qo[NQ];
    for (int i = 0; i < NQ; i++) qo[i] = make_quant(qs[i].rows, qs[i].cols, qs[i].bits, qs[i].group, qs[i].nout);

    const char *path = tmp_path("rt.trdc");
    spx_err e = {0};
    spx_trdc_writer *w = NULL;
    CHECK(spx_trdc_writer_open(path, &w, &e) == SPX_OK, "writer_open: %s", e.msg);
    if (!w) return;
    CHECK(file_exists(temp_of(path)) && !file_exists(path), "writes to the temp name only");
    /* interleave kinds so components of different kinds sit side by side */
    for (int i = 0; i < 4; i++) {
        CHECK(spx_trdc_writer_add_dense(w, dn[i].name, dn[i].dt, dn[i].ndim, dn[i].shape, dn[i].data,
                                        dn[i].nbytes, &e) == SPX_OK, "add_dense %s: %s", dn[i].name, e.msg);
        if (i < NQ)
            CHECK(spx_trdc_writer_add_quant(w, qs[i].name, &qo[i].q, qs[i].kappa, qs[i].r, &e) == SPX_OK,
                  "add_quant %s: %s", qs[i].name, e.msg);
    }
    for (int i = 4; i < NQ; i++)
        CHECK(spx_trdc_writer_add_quant(w, qs[i].name, &qo[i].q, qs[i].kappa, qs[i].r, &e) == SPX_OK,
              "add_quant %s: %s", qs[i].name, e.msg);
    CHECK(spx_trdc_writer_finish(w, cfg, tok, k_tok_cfg, k_quant, k_source, &e) == SPX_OK, "finish: %s", e.msg);
    CHECK(file_exists(path) && !file_exists(temp_of(path)), "renamed to the final name");

    size_t flen = 0;
    uint8_t *img = (uint8_t *)tl_read(path, &flen);
    /* pass 0: the mapped file; 1: a buffer; 2: the file made resident (a
     * private copy moved over the map: the same views, the same bytes) */
    for (int pass = 0; pass < 3 && img; pass++) {
        spx_trdc *f = NULL;
        spx_err_clear(&e);
        spx_status st = pass != 1 ? spx_trdc_open(path, &f, &e)
                                  : spx_trdc_open_buffer(img, flen, "rt-buffer", &f, &e);
        CHECK(st == SPX_OK && f, "open pass %d: %s", pass, e.msg);
        if (!f) continue;
        CHECK(spx_trdc_resident(f) == (pass == 1), "pass %d: resident %d before", pass, spx_trdc_resident(f));
        if (pass == 2) {
            const void *before = spx_trdc_at(f, 0)->data;
            CHECK(spx_trdc_make_resident(f, &e) == SPX_OK, "make_resident: %s", e.msg);
            CHECK(spx_trdc_make_resident(f, &e) == SPX_OK, "make_resident again: %s", e.msg);
            CHECK(spx_trdc_resident(f) && spx_trdc_at(f, 0)->data == before, "resident at the same address");
        }
        const uint8_t *base = pass != 1 ? spx_trdc_at(f, 0)->data : img;
        if (pass != 1) base -= spx_trdc_at(f, 0)->comp[SPX_TRDC_C_DATA].offset;
        CHECK(spx_trdc_version(f) == 3, "version %llu (2- and 3-bit matrices need version 3)",
              (unsigned long long)spx_trdc_version(f));
        CHECK(spx_trdc_file_size(f) == flen, "file size");
        CHECK(spx_trdc_manifest_offset(f) + spx_trdc_manifest_size(f) == flen, "manifest at end");
        CHECK(memcmp(img, "TRDC4B01", 8) == 0, "magic");
        CHECK(spx_trdc_count(f) == 4 + NQ, "count %zu", spx_trdc_count(f));
        CHECK(!strcmp(spx_trdc_at(f, 0)->name, dn[0].name) && !strcmp(spx_trdc_at(f, 1)->name, qs[0].name),
              "tensors keep the order they were added in");
        for (int i = 0; i < 4; i++) {
            const spx_trdc_tensor *t = spx_trdc_find(f, dn[i].name);
            CHECK(t != NULL, "find %s", dn[i].name);
            if (!t) continue;
            CHECK(t->kind == SPX_TRDC_DENSE && t->dtype == dn[i].dt && t->ndim == dn[i].ndim, "%s fields", dn[i].name);
            for (int d = 0; d < dn[i].ndim; d++) CHECK(t->shape[d] == dn[i].shape[d], "%s shape[%d]", dn[i].name, d);
            CHECK(t->nbytes == dn[i].nbytes && memcmp(t->data, dn[i].data, dn[i].nbytes) == 0, "%s bytes", dn[i].name);
            CHECK(isnan(t->kappa) && isnan(t->r), "%s dense has no kappa/r", dn[i].name);
        }
        for (int i = 0; i < NQ; i++) {
            const spx_trdc_tensor *t = spx_trdc_find(f, qs[i].name);
            CHECK(t != NULL, "find %s", qs[i].name);
            if (!t) continue;
            check_quant_equal(t, &qo[i], qs[i].name);
            CHECK(isnan(qs[i].kappa) ? isnan(t->kappa) : t->kappa == qs[i].kappa, "%s kappa %g", qs[i].name, t->kappa);
            CHECK(isnan(qs[i].r) ? isnan(t->r) : t->r == qs[i].r, "%s r %g", qs[i].name, t->r);
        }
        CHECK(spx_trdc_find(f, "missing.weight") == NULL, "find of an absent name");
        CHECK(spx_trdc_at(f, 4 + NQ) == NULL, "at out of range");
        check_layout(f, base);

        cJSON *cref = cJSON_Parse(cfg);
        CHECK(cJSON_Compare(cref, spx_trdc_config(f), 1), "config equal");
        char *cj = spx_trdc_config_json(f);
        cJSON *cback = cj ? cJSON_Parse(cj) : NULL;
        CHECK(cJSON_Compare(cref, cback, 1), "config_json equal");
        cJSON_Delete(cref);
        cJSON_Delete(cback);
        free(cj);
        CHECK(spx_trdc_tokenizer_json(f) && !strcmp(spx_trdc_tokenizer_json(f), tok), "tokenizer.json");
        CHECK(spx_trdc_tokenizer_config_json(f) && !strcmp(spx_trdc_tokenizer_config_json(f), k_tok_cfg),
              "tokenizer_config.json");
        cJSON *qref = cJSON_Parse(k_quant);
        CHECK(cJSON_Compare(qref, spx_trdc_quant_settings(f), 1), "quantization settings");
        cJSON_Delete(qref);
        CHECK(spx_trdc_source_bytes(f) == 123456, "source bytes %lld", (long long)spx_trdc_source_bytes(f));
        CHECK(!strncmp(spx_trdc_generator(f), "spectra", 7), "generator");

        spx_trdc_verify_report rep;
        spx_err_clear(&e);
        CHECK(spx_trdc_verify(f, NULL, NULL, NULL, &rep, &e) == SPX_OK, "verify: %s", e.msg);
        uint64_t want_bytes = 0;
        size_t ncomp = 0;
        for (size_t i = 0; i < spx_trdc_count(f); i++)
            for (int c = 0; c < SPX_TRDC_C_COUNT; c++)
                if (spx_trdc_at(f, i)->comp[c].present) {
                    ncomp++;
                    want_bytes += spx_trdc_at(f, i)->comp[c].size;
                }
        CHECK(rep.n_tensors == 4 + NQ && rep.n_components == ncomp && rep.bytes_checked == want_bytes &&
                  rep.n_mismatches == 0, "verify report");
        spx_trdc_close(f);
    }
    /* the config is embedded byte for byte */
    CHECK(img && memmem(img, flen, cfg, strlen(cfg)) != NULL, "config.json stored verbatim");
    free(img);

    /* A file with no tensors and no tokenizer is valid too; a config.json
     * with a byte order mark is embedded without it. */
    const char *p2 = tmp_path("empty.trdc");
    spx_err_clear(&e);
    CHECK(spx_trdc_writer_open(p2, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_finish(w, "\xEF\xBB\xBF{\"model_type\":\"none\"}\n", NULL, NULL, NULL, NULL, &e) == SPX_OK,
          "%s", e.msg);
    spx_trdc *f = NULL;
    CHECK(spx_trdc_open(p2, &f, &e) == SPX_OK, "open empty: %s", e.msg);
    if (f) {
        CHECK(spx_trdc_count(f) == 0 && !spx_trdc_tokenizer_json(f) && !spx_trdc_tokenizer_config_json(f) &&
                  spx_trdc_source(f) == NULL && spx_trdc_source_bytes(f) == -1 &&
                  cJSON_GetArraySize(spx_trdc_quant_settings(f)) == 0,
              "empty file fields");
        CHECK(spx_trdc_manifest_offset(f) == SPX_TRDC_HEADER_SIZE, "manifest right after the header");
        CHECK(spx_trdc_verify(f, NULL, NULL, NULL, NULL, &e) == SPX_OK, "verify empty");
        spx_trdc_close(f);
    }

    for (int i = 0; i < 4; i++) free(dn[i].data);
    for (int i = 0; i < NQ; i++) free_quant(&qo[i]);
    free(cfg);
    free(tok);
}

/* ======================================================================
 * 2. Corrupt files
 * ====================================================================== */

/* The base file: "emb" dense F32 [4, 8] (data 128 B @4096) and "w" quant
 * [4, 64] b4 g32 with 2 outliers: codes 128 @8192, scales 16 @12288,
 * zeros 4 @16384, outlier_idx 8 @20480, outlier_val 16 @24576; the
 * manifest starts at 24592. */
static uint8_t *g_img;      /* the valid file */
static size_t g_len;
static uint64_t g_man_off;
static char *g_man;         /* its manifest, NUL-terminated */
static int g_ncase;

static void build_base(void) {
    const char *path = tmp_path("base.trdc");
    spx_err e = {0};
    spx_trdc_writer *w = NULL;
    int64_t s[2] = {4, 8};
    void *emb = rand_bytes(128);
    qt_owned q = make_quant(4, 64, 4, 32, 2);
    q.oidx[0] = 3;
    q.oidx[1] = 40;
    CHECK(spx_trdc_writer_open(path, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_dense(w, "emb", SPX_DT_F32, 2, s, emb, 128, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_quant(w, "w", &q.q, 5.25, 2.0 / 64, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_finish(w, "{\"model_type\":\"llama\",\"hidden_size\":8}", NULL, NULL, k_quant,
                                 "{\"bytes\":4096}", &e) == SPX_OK, "%s", e.msg);
    free(emb);
    free_quant(&q);
    g_img = (uint8_t *)tl_read(path, &g_len);
    spx_trdc *f = NULL;
    CHECK(g_img && spx_trdc_open(path, &f, &e) == SPX_OK, "base opens: %s", e.msg);
    if (!f) exit(tl_finish("test_trdc"));
    g_man_off = spx_trdc_manifest_offset(f);
    CHECK(g_man_off == 24592, "base layout as documented above (manifest at %llu)", (unsigned long long)g_man_off);
    CHECK(spx_trdc_find(f, "w")->comp[SPX_TRDC_C_OUTLIER_IDX].offset == 20480, "outlier_idx offset");
    spx_trdc_close(f);
    size_t ml = g_len - (size_t)g_man_off;
    g_man = malloc(ml + 1);
    memcpy(g_man, g_img + g_man_off, ml);
    g_man[ml] = 0;
}

/* Opens img both from a file and from a buffer: both must fail with code
 * and a message containing want. */
static void expect_fail(const char *what, const uint8_t *img, size_t len, spx_status code, const char *want) {
    char name[64];
    snprintf(name, sizeof name, "corrupt%02d.trdc", g_ncase++);
    const char *path = tmp_path(name);
    CHECK(tl_write(path, img, len) == 0, "write %s", path);
    for (int pass = 0; pass < 2; pass++) {
        spx_err e = {0};
        spx_trdc *f = (spx_trdc *)1;
        uint8_t *copy = NULL;
        spx_status st;
        if (pass == 0) {
            st = spx_trdc_open(path, &f, &e);
        } else {
            copy = malloc(len ? len : 1); /* malloc: 16-byte aligned */
            if (len) memcpy(copy, img, len);
            st = spx_trdc_open_buffer(copy, len, name, &f, &e);
        }
        CHECK(st == code && f == NULL, "[%s] pass %d: status %s (expected %s), msg: %s", what, pass,
              spx_status_name(st), spx_status_name(code), e.msg);
        CHECK(strstr(e.msg, want) != NULL, "[%s] pass %d: message lacks '%s': %s", what, pass, want, e.msg);
        CHECK(strstr(e.msg, pass == 0 ? path : name) != NULL, "[%s] message names the file: %s", what, e.msg);
        if (pass == 0) printf("  %-34s -> %s\n", what, e.msg);
        if (f && f != (spx_trdc *)1) spx_trdc_close(f);
        free(copy);
    }
}

/* The base payload with a new manifest (header length updated). */
static uint8_t *with_manifest(const char *man, size_t mlen, size_t *len) {
    *len = (size_t)g_man_off + mlen;
    uint8_t *b = malloc(*len);
    memcpy(b, g_img, (size_t)g_man_off);
    memcpy(b + g_man_off, man, mlen);
    for (int i = 0; i < 8; i++) b[16 + i] = (uint8_t)((uint64_t)mlen >> (8 * i));
    return b;
}

static void set_u64(uint8_t *b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++) b[at + (size_t)i] = (uint8_t)(v >> (8 * i));
}

/* Replaces the first occurrence of `from` in the manifest with `to`
 * (version != 0: the header's version becomes that). */
static void case_text_v(const char *what, const char *from, const char *to, spx_status code, const char *want,
                        uint64_t version) {
    char *p = strstr(g_man, from);
    CHECK(p != NULL, "[%s] pattern '%s' not in the manifest", what, from);
    if (!p) return;
    size_t a = (size_t)(p - g_man), fl = strlen(from), tl = strlen(to), ml = strlen(g_man);
    char *m = malloc(ml - fl + tl + 1);
    memcpy(m, g_man, a);
    memcpy(m + a, to, tl);
    memcpy(m + a + tl, p + fl, ml - a - fl + 1);
    size_t len;
    uint8_t *img = with_manifest(m, strlen(m), &len);
    if (version) set_u64(img, 8, version);
    expect_fail(what, img, len, code, want);
    free(img);
    free(m);
}

static void case_text(const char *what, const char *from, const char *to, spx_status code, const char *want) {
    case_text_v(what, from, to, code, want, 0);
}

/* Applies fn to the parsed manifest. */
static void case_json(const char *what, void (*fn)(cJSON *), const char *want) {
    cJSON *r = cJSON_Parse(g_man);
    fn(r);
    char *m = cJSON_PrintUnformatted(r);
    size_t len;
    uint8_t *img = with_manifest(m, strlen(m), &len);
    expect_fail(what, img, len, SPX_ERR_FORMAT, want);
    free(img);
    free(m);
    cJSON_Delete(r);
}

static cJSON *tensor_w(cJSON *r) { return cJSON_GetArrayItem(cJSON_GetObjectItem(r, "tensors"), 1); }
static void fn_drop_tensors(cJSON *r) { cJSON_DeleteItemFromObject(r, "tensors"); }
static void fn_tensors_obj(cJSON *r) { cJSON_ReplaceItemInObject(r, "tensors", cJSON_CreateObject()); }
static void fn_tensor_not_obj(cJSON *r) {
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(r, "tensors"), 0, cJSON_CreateString("emb"));
}
static void fn_drop_name(cJSON *r) { cJSON_DeleteItemFromObject(tensor_w(r), "name"); }
static void fn_drop_shape(cJSON *r) { cJSON_DeleteItemFromObject(tensor_w(r), "shape"); }
static void fn_drop_kind(cJSON *r) { cJSON_DeleteItemFromObject(tensor_w(r), "kind"); }
static void fn_drop_bits(cJSON *r) { cJSON_DeleteItemFromObject(tensor_w(r), "bits"); }
static void fn_drop_zeros(cJSON *r) {
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(tensor_w(r), "components"), "zeros");
}
static void fn_drop_comps(cJSON *r) { cJSON_DeleteItemFromObject(tensor_w(r), "components"); }
static void fn_drop_config(cJSON *r) { cJSON_DeleteItemFromObject(r, "config"); }
static void fn_config_array(cJSON *r) { cJSON_ReplaceItemInObject(r, "config", cJSON_CreateArray()); }
static void fn_drop_quant(cJSON *r) { cJSON_DeleteItemFromObject(r, "quantization"); }
static void fn_tok_number(cJSON *r) {
    cJSON *t = cJSON_AddObjectToObject(r, "tokenizer");
    cJSON_AddNumberToObject(t, "tokenizer.json", 7);
}
static void fn_source_string(cJSON *r) { cJSON_ReplaceItemInObject(r, "source", cJSON_CreateString("x")); }
static void fn_too_many_dims(cJSON *r) {
    cJSON *s = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "tensors"), 0), "shape");
    while (cJSON_GetArraySize(s) < 9) cJSON_AddItemToArray(s, cJSON_CreateNumber(1));
}
static void fn_comp_not_obj(cJSON *r) {
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(tensor_w(r), "components"), "codes", cJSON_CreateNumber(8192));
}

static void case_bytes(const char *what, size_t at, const void *bytes, size_t n, spx_status code, const char *want) {
    uint8_t *b = malloc(g_len);
    memcpy(b, g_img, g_len);
    memcpy(b + at, bytes, n);
    expect_fail(what, b, g_len, code, want);
    free(b);
}

static void test_corrupt(void) {
    build_base();
    if (!g_man) return;
    printf("corrupt files:\n");
    uint8_t *b = malloc(g_len + 64);
    size_t len;

    /* ---- header ---- */
    case_bytes("bad magic", 0, "TRDC4B02", 8, SPX_ERR_FORMAT, "bad magic");
    case_bytes("binary magic", 0, "\x89PNG\r\n\x1a\n", 8, SPX_ERR_FORMAT, "bad magic");
    memcpy(b, g_img, g_len);
    set_u64(b, 8, SPX_TRDC_VERSION + 1);
    expect_fail("unknown version", b, g_len, SPX_ERR_UNSUPPORTED, "version 6 is not supported");
    set_u64(b, 8, 0);
    expect_fail("version 0", b, g_len, SPX_ERR_UNSUPPORTED, "version 0 is not supported");
    set_u64(b, 8, 1);
    set_u64(b, 16, 0);
    expect_fail("manifest length zero", b, g_len, SPX_ERR_FORMAT, "manifest length is 0");
    set_u64(b, 16, g_len - 24 + 1);
    expect_fail("manifest length past EOF", b, g_len, SPX_ERR_FORMAT, "exceeds the");
    set_u64(b, 16, (uint64_t)1 << 62);
    expect_fail("manifest length huge", b, g_len, SPX_ERR_FORMAT, "exceeds the 1073741824-byte limit");
    set_u64(b, 16, UINT64_MAX);
    expect_fail("manifest length 2^64-1", b, g_len, SPX_ERR_FORMAT, "exceeds the");
    set_u64(b, 16, g_len - 24);
    expect_fail("manifest length covers payload", b, g_len, SPX_ERR_FORMAT, "not valid UTF-8");
    expect_fail("file shorter than header", g_img, 10, SPX_ERR_FORMAT, "smaller than the 24-byte");
    expect_fail("empty file", g_img, 0, SPX_ERR_FORMAT, "smaller than the 24-byte");
    expect_fail("header only", g_img, 24, SPX_ERR_FORMAT, "exceeds the 0 bytes after the header");

    /* ---- truncated payload: the manifest moved into the payload area ---- */
    size_t ml = strlen(g_man);
    memcpy(b, g_img, 20000);
    memcpy(b + 20000, g_man, ml);
    set_u64(b, 16, ml);
    expect_fail("truncated payload", b, 20000 + ml, SPX_ERR_FORMAT, "extends past the payload end");

    /* ---- manifest bytes ---- */
    const char *notjson = "{\"format\": TRDC4B01}";
    uint8_t *img = with_manifest(notjson, strlen(notjson), &len);
    expect_fail("manifest not JSON", img, len, SPX_ERR_FORMAT, "not valid JSON");
    free(img);
    img = with_manifest("[1,2,3]", 7, &len);
    expect_fail("manifest an array", img, len, SPX_ERR_FORMAT, "expected a JSON object");
    free(img);
    char *m2 = malloc(ml + 8);
    memcpy(m2, g_man, ml);
    memcpy(m2 + ml, " {}", 3);
    img = with_manifest(m2, ml + 3, &len);
    expect_fail("trailing bytes after JSON", img, len, SPX_ERR_FORMAT, "trailing bytes");
    free(img);
    memcpy(m2, g_man, ml);
    m2[ml / 2] = 0;
    img = with_manifest(m2, ml, &len);
    expect_fail("NUL byte in manifest", img, len, SPX_ERR_FORMAT, "not valid UTF-8");
    free(img);
    free(m2);
    case_text("manifest not UTF-8 (0xff)", "\"generator\":\"spectra\"", "\"generator\":\"spect\xff" "a\"",
              SPX_ERR_FORMAT, "not valid UTF-8 (bad byte 0xff");
    case_text("manifest overlong UTF-8", "\"generator\":\"spectra\"", "\"generator\":\"\xc0\xaf\"",
              SPX_ERR_FORMAT, "not valid UTF-8");
    case_text("manifest UTF-8 surrogate", "\"generator\":\"spectra\"", "\"generator\":\"\xed\xa0\x80\"",
              SPX_ERR_FORMAT, "not valid UTF-8");
    case_text("manifest truncated UTF-8", "\"generator\":\"spectra\"", "\"generator\":\"\xe2\x96\"",
              SPX_ERR_FORMAT, "not valid UTF-8");
    {
        char deep[512] = "\"deep\":";
        for (int i = 0; i < 100; i++) strcat(deep, "[");
        for (int i = 0; i < 100; i++) strcat(deep, "]");
        strcat(deep, ",\"config\":");
        case_text("manifest deeply nested", "\"config\":", deep, SPX_ERR_FORMAT, "nests deeper than 64");
        static char deep2[64000];
        strcpy(deep2, "\"deep\":");
        memset(deep2 + 7, '{', 30000);
        strcpy(deep2 + 7 + 30000, ",\"config\":");
        case_text("manifest 30000 open braces", "\"config\":", deep2, SPX_ERR_FORMAT, "nests deeper than 64");
    }

    /* ---- top-level fields ---- */
    case_text("format field wrong", "\"format\":\"TRDC4B01\"", "\"format\":\"GGUF\"", SPX_ERR_FORMAT,
              "'format' is the string \"GGUF\"");
    case_text("manifest version mismatch", "\"version\":1", "\"version\":2", SPX_ERR_FORMAT,
              "'version' is 2, expected 1");
    case_text("generator not a string", "\"generator\":\"spectra\"", "\"generator\":[]", SPX_ERR_FORMAT,
              "'generator' is an array");
    case_text("duplicate top-level key", "\"version\":1", "\"version\":1,\"version\":1", SPX_ERR_FORMAT,
              "key 'version' twice");
    case_json("missing tensors array", fn_drop_tensors, "'tensors' is missing, expected an array");
    case_json("tensors is an object", fn_tensors_obj, "'tensors' is an object, expected an array");
    case_json("tensor entry not an object", fn_tensor_not_obj, "tensors[0] is the string");
    case_json("missing config", fn_drop_config, "'config' is missing");
    case_json("config is an array", fn_config_array, "'config' is an array");
    case_json("missing quantization", fn_drop_quant, "'quantization' is missing");
    case_json("tokenizer file not a string", fn_tok_number, "tokenizer['tokenizer.json'] is 7");
    case_json("source not an object", fn_source_string, "'source' is the string");

    /* ---- tensor fields ---- */
    case_json("tensor missing name", fn_drop_name, "'name' is missing, expected a string");
    case_text("tensor name empty", "\"name\":\"w\"", "\"name\":\"\"", SPX_ERR_FORMAT, "name is 0 bytes");
    case_text("tensor name a number", "\"name\":\"w\"", "\"name\":5", SPX_ERR_FORMAT, "'name' is 5");
    case_text("duplicate tensor names", "\"name\":\"w\"", "\"name\":\"emb\"", SPX_ERR_FORMAT,
              "duplicate tensor name 'emb' (tensors[0] and tensors[1])");
    case_text("duplicate key in tensor", "\"kind\":\"quant\"", "\"kind\":\"quant\",\"kind\":\"dense\"",
              SPX_ERR_FORMAT, "has the key 'kind' twice");
    case_json("tensor missing kind", fn_drop_kind, "'kind' is missing");
    case_text("unknown kind", "\"kind\":\"quant\"", "\"kind\":\"q5_k\"", SPX_ERR_FORMAT, "unknown kind 'q5_k'");
    case_json("tensor missing shape", fn_drop_shape, "'shape' is missing, expected an array");
    case_text("shape with 0", "\"shape\":[4,8]", "\"shape\":[0,8]", SPX_ERR_FORMAT, "shape[0] is 0");
    case_text("shape negative", "\"shape\":[4,8]", "\"shape\":[4,-8]", SPX_ERR_FORMAT, "shape[1] is -8");
    case_text("shape fractional", "\"shape\":[4,8]", "\"shape\":[4.5,8]", SPX_ERR_FORMAT, "shape[0] is 4.5");
    case_text("shape string", "\"shape\":[4,8]", "\"shape\":[\"4\",8]", SPX_ERR_FORMAT, "shape[0] is the string");
    case_text("shape dim too large", "\"shape\":[4,8]", "\"shape\":[4294967296,8]", SPX_ERR_FORMAT,
              "shape[0] is 4294967296, expected an integer in [1, 2147483647]");
    case_text("shape product overflows", "\"shape\":[4,8]",
              "\"shape\":[2147483647,2147483647,2147483647]", SPX_ERR_FORMAT, "shape product overflows");
    case_text("shape empty", "\"shape\":[4,8]", "\"shape\":[]", SPX_ERR_FORMAT, "shape has 0 dims");
    case_json("shape with 9 dims", fn_too_many_dims, "shape has 9 dims");
    case_text("quant shape rank 3", "\"shape\":[4,64]", "\"shape\":[4,64,1]", SPX_ERR_FORMAT, "shape has 3 dims");
    case_text("unknown dtype", "\"dtype\":\"F32\"", "\"dtype\":\"F8\"", SPX_ERR_FORMAT, "dtype 'F8' is not allowed");
    case_text("integer dtype", "\"dtype\":\"F32\"", "\"dtype\":\"I32\"", SPX_ERR_FORMAT, "dtype 'I32' is not allowed");
    case_text("bits invalid", "\"bits\":4", "\"bits\":5", SPX_ERR_FORMAT, "'bits' is 5, expected 2, 3 or 4");
    case_text("bits 8", "\"bits\":4", "\"bits\":8", SPX_ERR_FORMAT, "'bits' is 8");
    case_json("bits missing", fn_drop_bits, "'bits' is missing");
    case_text("group invalid", "\"group\":32", "\"group\":48", SPX_ERR_FORMAT, "'group' is 48, expected 32, 64 or 128");
    case_text("group 16", "\"group\":32", "\"group\":16", SPX_ERR_FORMAT, "'group' is 16");
    case_text("cols not a multiple of group", "\"shape\":[4,64]", "\"shape\":[4,80]", SPX_ERR_FORMAT,
              "cols 80 is not a multiple of group 32");
    case_text("n_outliers > cols", "\"n_outliers\":2", "\"n_outliers\":65", SPX_ERR_FORMAT,
              "'n_outliers' is 65, expected an integer in [0, cols=64]");
    case_text("n_outliers negative", "\"n_outliers\":2", "\"n_outliers\":-1", SPX_ERR_FORMAT, "'n_outliers' is -1");
    case_text("outlier components with n 0", "\"n_outliers\":2", "\"n_outliers\":0", SPX_ERR_FORMAT,
              "unexpected component 'outlier_idx' for kind quant with n_outliers 0");
    case_text("kappa a string", "\"kappa\":5.25", "\"kappa\":\"high\"", SPX_ERR_FORMAT, "'kappa' is the string");

    /* ---- components ---- */
    case_json("components missing", fn_drop_comps, "'components' is missing");
    case_json("required component missing", fn_drop_zeros, "component 'zeros' is missing");
    case_json("component not an object", fn_comp_not_obj, "component 'codes' is 8192");
    case_text("unknown component", "\"zeros\":", "\"zeroes\":", SPX_ERR_FORMAT, "unexpected component 'zeroes'");
    case_text("data component on quant", "\"codes\":", "\"data\":", SPX_ERR_FORMAT, "unexpected component 'data'");
    case_text("duplicate component", "\"zeros\":{", "\"zeros\":{},\"zeros\":{", SPX_ERR_FORMAT,
              "component 'zeros' appears twice");
    case_text("size mismatch (dense)", "\"size\":128", "\"size\":132", SPX_ERR_FORMAT,
              "component 'data' has size 132, expected 128 for shape [4, 8]");
    case_text("size mismatch (scales)", "\"size\":16", "\"size\":32", SPX_ERR_FORMAT,
              "component 'scales' has size 32, expected 16");
    case_text("size missing", "\"size\":128", "\"bytes\":128", SPX_ERR_FORMAT, "size is missing");
    case_text("offset out of range", "\"offset\":24576", "\"offset\":1048576", SPX_ERR_FORMAT,
              "extends past the payload end 24592");
    case_text("offset near 2^53", "\"offset\":4096", "\"offset\":9007199254736896", SPX_ERR_FORMAT,
              "extends past the payload end");
    case_text("offset above 2^53", "\"offset\":4096", "\"offset\":18446744073709551616", SPX_ERR_FORMAT,
              "offset is 1.8446744073709552e+19, expected an integer in [0, 2^53]");
    case_text("offset negative", "\"offset\":4096", "\"offset\":-4096", SPX_ERR_FORMAT, "offset is -4096");
    case_text("offset 1e999", "\"offset\":4096", "\"offset\":1e999", SPX_ERR_FORMAT, "offset is");
    case_text("offset not aligned", "\"offset\":8192", "\"offset\":8200", SPX_ERR_FORMAT,
              "offset 8200 is not a multiple of 4096");
    case_text("offset inside header", "\"offset\":4096", "\"offset\":0", SPX_ERR_FORMAT, "overlaps the 24-byte header");
    case_text("overlapping components", "\"offset\":8192", "\"offset\":4096", SPX_ERR_FORMAT,
              "components overlap: tensor 'emb' 'data' [4096, 4224) and tensor 'w' 'codes'");
    case_text("crc32 missing", "\"crc32\":", "\"crc\":", SPX_ERR_FORMAT, "crc32 is missing");
    {
        /* crc32 value above 2^32-1: replace the first crc32 value */
        char *p = strstr(g_man, "\"crc32\":");
        char from[40], *q = from;
        for (const char *s = p; *s != ',' && *s != '}'; s++) *q++ = *s;
        *q = 0;
        case_text("crc32 above 2^32", from, "\"crc32\":4294967296", SPX_ERR_FORMAT,
                  "crc32 is 4294967296, expected an integer in [0, 2^32-1]");
    }

    /* ---- payload: outlier indices ---- */
    int32_t idx[2];
    idx[0] = 40, idx[1] = 40;
    case_bytes("outlier_idx not increasing", 20480, idx, 8, SPX_ERR_FORMAT,
               "outlier_idx[1] = 40, expected strictly increasing");
    idx[0] = 40, idx[1] = 3;
    case_bytes("outlier_idx decreasing", 20480, idx, 8, SPX_ERR_FORMAT, "outlier_idx[1] = 3");
    idx[0] = 3, idx[1] = 64;
    case_bytes("outlier_idx >= cols", 20480, idx, 8, SPX_ERR_FORMAT, "outlier_idx[1] = 64");
    idx[0] = -1, idx[1] = 3;
    case_bytes("outlier_idx negative", 20480, idx, 8, SPX_ERR_FORMAT, "outlier_idx[0] = -1");

    /* ---- misaligned buffer is a caller error ---- */
    {
        uint8_t *mis = malloc(g_len + 8);
        memcpy(mis + 4, g_img, g_len);
        spx_err e = {0};
        spx_trdc *f = NULL;
        CHECK(spx_trdc_open_buffer(mis + 4, g_len, "mis", &f, &e) == SPX_ERR_ARG && !f, "misaligned: %s", e.msg);
        free(mis);
    }
    /* ---- a path that is not a file ---- */
    {
        spx_err e = {0};
        spx_trdc *f = NULL;
        CHECK(spx_trdc_open(tl_tmpdir(), &f, &e) == SPX_ERR_IO && !f, "directory: %s", e.msg);
        spx_err_clear(&e);
        CHECK(spx_trdc_open(tmp_path("nope.trdc"), &f, &e) == SPX_ERR_IO && !f, "missing: %s", e.msg);
    }
    free(b);
}

/* ======================================================================
 * 3. CRC mismatches
 * ====================================================================== */

typedef struct mm_log {
    int n;
    char names[4][64];
    int progress_calls;
    uint64_t last_done, total;
} mm_log;

static void on_mm(void *user, const spx_trdc_tensor *t, spx_trdc_comp c, uint32_t want, uint32_t got) {
    mm_log *l = user;
    if (l->n < 4) snprintf(l->names[l->n], sizeof l->names[0], "%s/%s", t->name, spx_trdc_comp_name(c));
    l->n++;
    (void)want;
    (void)got;
}

static void on_progress(void *user, uint64_t done, uint64_t total) {
    mm_log *l = user;
    CHECK(done >= l->last_done && done <= total, "progress %llu of %llu", (unsigned long long)done,
          (unsigned long long)total);
    l->progress_calls++;
    l->last_done = done;
    l->total = total;
}

static void test_crc(void) {
    if (!g_img) return;
    uint8_t *b = malloc(g_len);
    memcpy(b, g_img, g_len);
    b[8192 + 77] ^= 0x10; /* a bit of w.codes */
    spx_err e = {0};
    spx_trdc *f = NULL;
    CHECK(spx_trdc_open_buffer(b, g_len, "crc1", &f, &e) == SPX_OK, "open succeeds: %s", e.msg);
    if (f) {
        mm_log l = {0};
        spx_trdc_verify_report rep;
        spx_status st = spx_trdc_verify(f, NULL, on_mm, &l, &rep, &e);
        CHECK(st == SPX_ERR_CRC, "verify -> %s", spx_status_name(st));
        CHECK(strstr(e.msg, "tensor 'w' component 'codes'") && strstr(e.msg, "crc1") &&
                  strstr(e.msg, "1 of 6 components"), "message: %s", e.msg);
        printf("crc: %s\n", e.msg);
        CHECK(rep.n_mismatches == 1 && rep.n_components == 6 && l.n == 1 && !strcmp(l.names[0], "w/codes"),
              "report %zu/%zu, callback %d", rep.n_mismatches, rep.n_components, l.n);
        spx_trdc_close(f);
    }
    b[4096 + 5] ^= 0x01;  /* emb.data */
    b[24576 + 15] ^= 0x80; /* w.outlier_val, last byte */
    spx_err_clear(&e);
    CHECK(spx_trdc_open_buffer(b, g_len, "crc3", &f, &e) == SPX_OK, "%s", e.msg);
    if (f) {
        mm_log l = {0};
        spx_trdc_verify_report rep;
        CHECK(spx_trdc_verify(f, on_progress, on_mm, &l, &rep, &e) == SPX_ERR_CRC, "verify");
        CHECK(rep.n_mismatches == 3 && l.n == 3, "all mismatches reported: %zu", rep.n_mismatches);
        CHECK(l.progress_calls == 6 && l.last_done == l.total && l.total == rep.bytes_checked &&
                  l.total == 128 + 128 + 16 + 4 + 8 + 16, "progress %d calls, %llu/%llu", l.progress_calls,
              (unsigned long long)l.last_done, (unsigned long long)l.total);
        CHECK(strstr(e.msg, "tensor 'emb' component 'data'") && strstr(e.msg, "3 of 6"), "first named: %s", e.msg);
        spx_trdc_close(f);
    }
    free(b);
}

/* ======================================================================
 * 4. Writer failures
 * ====================================================================== */

static void expect_no_files(const char *what, const char *path) {
    CHECK(!file_exists(path), "[%s] final file exists", what);
    CHECK(!file_exists(temp_of(path)), "[%s] temp file left behind", what);
}

static void test_writer_failures(void) {
    spx_err e = {0};
    spx_trdc_writer *w = NULL;
    int64_t s[2] = {4, 8};
    float data[32];
    for (int i = 0; i < 32; i++) data[i] = tl_rand_normal(&g_rng);
    const char *cfg = "{\"model_type\":\"llama\"}";

    const char *p = tmp_path("abort.trdc");
    CHECK(spx_trdc_writer_open(p, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_dense(w, "a", SPX_DT_F32, 2, s, data, sizeof data, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_bytes(w) == 4096 + 128, "bytes written %llu", (unsigned long long)spx_trdc_writer_bytes(w));
    spx_trdc_writer_abort(w);
    expect_no_files("abort", p);
    spx_trdc_writer_abort(NULL);

    struct {
        const char *what, *want;
        int kind; /* 0 dup name, 1 bad group, 2 unsorted outliers, 3 nbytes, 4 bad dtype, 5 empty name */
    } cases[] = {
        {"duplicate name", "added twice", 0},       {"bad group", "group must be", 1},
        {"unsorted outliers", "strictly increasing", 2}, {"nbytes mismatch", "bytes given, expected 128", 3},
        {"integer dtype", "dtype I32 not allowed", 4},   {"empty name", "name must be 1..", 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        p = tmp_path("bad.trdc");
        spx_err_clear(&e);
        CHECK(spx_trdc_writer_open(p, &w, &e) == SPX_OK, "%s", e.msg);
        CHECK(spx_trdc_writer_add_dense(w, "a", SPX_DT_F32, 2, s, data, sizeof data, &e) == SPX_OK, "%s", e.msg);
        qt_owned q = make_quant(2, 64, 4, cases[i].kind == 1 ? 48 : 32, 2);
        if (cases[i].kind == 1) q.q.group = 48;
        if (cases[i].kind == 2) q.oidx[0] = 50, q.oidx[1] = 10;
        spx_status st;
        switch (cases[i].kind) {
        case 0: st = spx_trdc_writer_add_quant(w, "a", &q.q, 1, 0, &e); break;
        case 1: case 2: st = spx_trdc_writer_add_quant(w, "q", &q.q, 1, 0, &e); break;
        case 3: st = spx_trdc_writer_add_dense(w, "b", SPX_DT_F32, 2, s, data, 100, &e); break;
        case 4: st = spx_trdc_writer_add_dense(w, "b", SPX_DT_I32, 2, s, data, sizeof data, &e); break;
        default: st = spx_trdc_writer_add_dense(w, "", SPX_DT_F32, 2, s, data, sizeof data, &e); break;
        }
        CHECK(st == SPX_ERR_ARG && strstr(e.msg, cases[i].want) && strstr(e.msg, p),
              "[%s] %s: %s", cases[i].what, spx_status_name(st), e.msg);
        CHECK(!file_exists(temp_of(p)), "[%s] temp removed at once", cases[i].what);
        spx_err_clear(&e);
        CHECK(spx_trdc_writer_finish(w, cfg, NULL, NULL, NULL, NULL, &e) != SPX_OK, "[%s] finish after an error fails",
              cases[i].what);
        expect_no_files(cases[i].what, p);
        free_quant(&q);
    }

    /* invalid JSON given to finish */
    const char *bad_json[][2] = {
        {"{\"a\":", "config JSON is not valid JSON"},
        {"[1,2]", "config JSON must be a JSON object"},
        {"{} x", "trailing bytes"},
        {"{\"a\":\"\xff\"}", "not valid UTF-8"},
        {"{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
         "nests deeper than 62 levels"},
    };
    for (size_t i = 0; i < sizeof bad_json / sizeof bad_json[0]; i++) {
        p = tmp_path("badcfg.trdc");
        spx_err_clear(&e);
        CHECK(spx_trdc_writer_open(p, &w, &e) == SPX_OK, "%s", e.msg);
        CHECK(spx_trdc_writer_add_dense(w, "a", SPX_DT_F32, 2, s, data, sizeof data, &e) == SPX_OK, "%s", e.msg);
        CHECK(spx_trdc_writer_finish(w, bad_json[i][0], NULL, NULL, NULL, NULL, &e) == SPX_ERR_ARG &&
                  strstr(e.msg, bad_json[i][1]), "bad config %zu: %s", i, e.msg);
        expect_no_files("bad config", p);
    }
    p = tmp_path("badtok.trdc");
    spx_err_clear(&e);
    CHECK(spx_trdc_writer_open(p, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_finish(w, cfg, "caf\xe9", NULL, NULL, NULL, &e) == SPX_ERR_ARG &&
              strstr(e.msg, "tokenizer.json is not valid UTF-8"), "bad tokenizer: %s", e.msg);
    expect_no_files("bad tokenizer", p);
    spx_err_clear(&e);
    CHECK(spx_trdc_writer_open(p, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_finish(w, cfg, NULL, NULL, "[]", NULL, &e) == SPX_ERR_ARG &&
              strstr(e.msg, "quantization JSON must be a JSON object"), "bad quant settings: %s", e.msg);
    expect_no_files("bad quant settings", p);

    /* cannot create the temp file */
    spx_err_clear(&e);
    p = tmp_path("no/such/dir/x.trdc");
    CHECK(spx_trdc_writer_open(p, &w, &e) == SPX_ERR_IO && !w && strstr(e.msg, p), "no dir: %s", e.msg);

    /* A write error mid-file (a file-size limit stands in for a full disk):
     * one message naming the file, temp removed, nothing at the final path. */
    struct rlimit old, lim;
    if (getrlimit(RLIMIT_FSIZE, &old) == 0) {
        void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
        p = tmp_path("full.trdc");
        spx_err_clear(&e);
        CHECK(spx_trdc_writer_open(p, &w, &e) == SPX_OK, "%s", e.msg);
        lim = old;
        lim.rlim_cur = 16384;
        if (w && setrlimit(RLIMIT_FSIZE, &lim) == 0) {
            int64_t sb[2] = {128, 128};
            void *big = rand_bytes(128 * 128 * 4);
            spx_status st = spx_trdc_writer_add_dense(w, "big", SPX_DT_F32, 2, sb, big, 128 * 128 * 4, &e);
            setrlimit(RLIMIT_FSIZE, &old);
            CHECK(st == SPX_ERR_IO && strstr(e.msg, p) && strstr(e.msg, "writing temp file") &&
                      strstr(e.msg, "partial file was removed"), "write error: %s", e.msg);
            printf("write error: %s\n", e.msg);
            CHECK(!file_exists(temp_of(p)), "temp removed after the write error");
            spx_err_clear(&e);
            CHECK(spx_trdc_writer_add_dense(w, "a", SPX_DT_F32, 2, s, data, sizeof data, &e) == SPX_ERR_ARG,
                  "dead writer refuses more tensors");
            spx_trdc_writer_abort(w);
            expect_no_files("write error", p);
            free(big);
        } else {
            spx_trdc_writer_abort(w);
        }
        signal(SIGXFSZ, prev);
    }
}

/* ======================================================================
 * 5. Layouts (version 2): a tiled matrix round-trips with its layout, the
 *    file is version 2 only when one is tiled, and bad layouts are refused
 * ====================================================================== */

static void test_layouts(void) {
    const char *path = tmp_path("layout.trdc");
    spx_err e = {0};
    /* rows not a multiple of 16, outliers: sizes of the padded tiles */
    qt_owned q = make_quant(20, 256, 4, 32, 3);
    qt_owned r = make_quant(8, 96, 4, 32, 0); /* stays row-major (96 % 128) */
    spx_qtensor tq;
    void *mem = NULL;
    CHECK(spx_q_tile_alloc(&q.q, &tq, &mem, &e) == SPX_OK, "tile: %s", e.msg);
    spx_trdc_writer *w = NULL;
    CHECK(spx_trdc_writer_open(path, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_quant(w, "t", &tq, 1.0, 0.01, &e) == SPX_OK, "add tiled: %s", e.msg);
    CHECK(spx_trdc_writer_add_quant(w, "r", &r.q, 1.0, 0.0, &e) == SPX_OK, "add rows: %s", e.msg);
    /* a tiled tensor the layout cannot hold is refused by the writer (which
     * then removes its file) */
    spx_trdc_writer *w2 = NULL;
    CHECK(spx_trdc_writer_open(tmp_path("layout-bad.trdc"), &w2, &e) == SPX_OK, "%s", e.msg);
    spx_qtensor bad = r.q;
    bad.layout = SPX_Q_TILED;
    CHECK(spx_trdc_writer_add_quant(w2, "bad", &bad, 1.0, 0.0, &e) == SPX_ERR_ARG && strstr(e.msg, "tile16x128"),
          "tiled [8, 96] accepted by the writer: %s", e.msg);
    spx_trdc_writer_abort(w2);
    CHECK(spx_trdc_writer_finish(w, "{\"model_type\":\"llama\"}", NULL, NULL, k_quant, NULL, &e) == SPX_OK, "%s", e.msg);
    spx_trdc *f = NULL;
    CHECK(spx_trdc_open(path, &f, &e) == SPX_OK, "open: %s", e.msg);
    if (f) {
        CHECK(spx_trdc_version(f) == 2, "a file with a tiled matrix is version %llu, expected 2",
              (unsigned long long)spx_trdc_version(f));
        const spx_trdc_tensor *t = spx_trdc_find(f, "t"), *t2 = spx_trdc_find(f, "r");
        CHECK(t && t->q.layout == SPX_Q_TILED && t2 && t2->q.layout == SPX_Q_ROWS, "layouts read back");
        if (t) {
            CHECK(t->comp[SPX_TRDC_C_CODES].size == 32 * 128 && t->comp[SPX_TRDC_C_SCALES].size == 32 * 8 * 2 &&
                      t->comp[SPX_TRDC_C_ZEROS].size == 32 * 4,
                  "tiled sizes (32 stored rows): codes %llu scales %llu zeros %llu",
                  (unsigned long long)t->comp[SPX_TRDC_C_CODES].size, (unsigned long long)t->comp[SPX_TRDC_C_SCALES].size,
                  (unsigned long long)t->comp[SPX_TRDC_C_ZEROS].size);
            CHECK(memcmp(t->q.codes, tq.codes, 32 * 128) == 0 && memcmp(t->q.scales, tq.scales, 32 * 8 * 2) == 0 &&
                      memcmp(t->q.zeros, tq.zeros, 32 * 4) == 0,
                  "tiled bytes as written");
            int same = 1;
            for (int64_t rr = 0; rr < 20; rr++)
                for (int64_t g = 0; g < 8; g++)
                    same &= memcmp(spx_q_group_codes(&t->q, rr, g), spx_q_group_codes(&q.q, rr, g), 16) == 0 &&
                            spx_q_group_scale(&t->q, rr, g) == spx_q_group_scale(&q.q, rr, g) &&
                            spx_q_group_zero(&t->q, rr, g) == spx_q_group_zero(&q.q, rr, g);
            CHECK(same, "every group of the mapped tiled matrix equals the row-major original");
        }
        spx_trdc_close(f);
    }
    free(mem);
    free_quant(&q);
    free_quant(&r);

    /* the base file (version 1, row-major): its quant tensor reads as rows */
    case_text("layout in a version 1 file", "\"bits\":4", "\"layout\":\"rows\",\"bits\":4", SPX_ERR_FORMAT,
              "'layout' appears in a version 1 file");
    uint8_t *b = malloc(g_len);
    memcpy(b, g_img, g_len);
    set_u64(b, 8, 2); /* the same manifest under version 2 needs version 2 there too */
    expect_fail("header 2, manifest 1", b, g_len, SPX_ERR_FORMAT, "expected 2");
    free(b);
}

/* The base file relabelled version 2 (header and manifest), with the
 * manifest text edited: layout errors. */
static void case_v2(const char *what, const char *from, const char *to, const char *want) {
    char *p = strstr(g_man, "\"version\":1");
    CHECK(p != NULL, "manifest version key");
    if (!p) return;
    p[10] = '2';
    case_text_v(what, from, to, SPX_ERR_FORMAT, want, 2);
    p[10] = '1';
}

static void test_layout_errors(void) {
    /* the base "w" is [4, 64]: 64 % 128 != 0, so it cannot be tiled */
    case_v2("layout of a 64-wide matrix", "\"bits\":4", "\"layout\":\"tile16x128\",\"bits\":4", "needs bits 4, group 32");
    case_v2("unknown layout", "\"bits\":4", "\"layout\":\"cols\",\"bits\":4", "expected \"rows\" or \"tile16x128\"");
    case_v2("layout not a string", "\"bits\":4", "\"layout\":7,\"bits\":4", "'layout' is 7");
}

int main(void) {
    test_roundtrip();
    test_corrupt();
    test_crc();
    test_writer_failures();
    test_layouts();
    test_layout_errors();
    free(g_img);
    free(g_man);
    return tl_finish("test_trdc");
}
