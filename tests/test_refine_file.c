/* test_refine_file.c: the .refine container (docs/trdc.md 2.5, 2.6): a
 * refine4 round trip and a bundle4 one (version 5) through the writer and
 * reader, verify over their checksums, and a list of corrupt files, each refused with a message naming the
 * file and the problem (never a crash: they also run under ASan). */
#include "testlib.h"
#include "format/trdc.h"
#include "refine/bundle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_path[600];

static void write_file(void) {
    snprintf(g_path, sizeof g_path, "%s/r.refine", tl_tmpdir());
    spx_err e;
    spx_err_clear(&e);
    spx_trdc_writer *w = NULL;
    uint8_t c1[5 * 3], c2[4 * 64];
    for (size_t i = 0; i < sizeof c1; i++) c1[i] = (uint8_t)(17 * i + 3);
    for (size_t i = 0; i < sizeof c2; i++) c2[i] = (uint8_t)(5 * i + 1);
    float s1[5] = {0.5f, 0.25f, 1e-3f, 0, 2}, s2[3] = {1, -1, 3};
    CHECK(spx_trdc_writer_open(g_path, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_refine(w, "a.weight", 5, 5, 3, c1, s1, 0xdeadbeefu, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_refine(w, "b.weight", 3, 4, 64, c2, s2, 7, &e) == SPX_OK, "%s", e.msg);
    /* a model tensor in a .refine is refused (and kills the writer) */
    spx_trdc_writer *w2 = NULL;
    char p2[640];
    snprintf(p2, sizeof p2, "%s/bad.refine", tl_tmpdir());
    const int64_t shp[1] = {2};
    const float d[2] = {1, 2};
    CHECK(spx_trdc_writer_open(p2, &w2, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_refine(w2, "a", 2, 2, 1, c1, s1, 0, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_dense(w2, "n", SPX_DT_F32, 1, shp, d, sizeof d, &e) == SPX_ERR_ARG &&
              strstr(e.msg, "model tensor in a .refine"),
          "dense in a .refine: %s", e.msg);
    spx_trdc_writer_abort(w2);
    spx_err_clear(&e);
    CHECK(spx_trdc_writer_add_refine(w, "c", 4, 2, 1, c1, s1, 0, &e) == SPX_ERR_ARG && strstr(e.msg, "not valid"),
          "stride below (rows + 1) / 2: %s", e.msg);
    /* that refusal killed w: start again */
    spx_trdc_writer_abort(w);
    CHECK(spx_trdc_writer_open(g_path, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_refine(w, "a.weight", 5, 5, 3, c1, s1, 0xdeadbeefu, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_refine(w, "b.weight", 3, 4, 64, c2, s2, 7, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_finish(w, "{\"architectures\": [\"LlamaForCausalLM\"]}", NULL, NULL,
                                 "{\"refine\": {\"bits\": 4}}", NULL, &e) == SPX_OK,
          "%s", e.msg);

    spx_trdc *f = NULL;
    CHECK(spx_trdc_open(g_path, &f, &e) == SPX_OK, "open: %s", e.msg);
    if (!f) return;
    CHECK(spx_trdc_version(f) == 4 && spx_trdc_contents(f) == SPX_TRDC_CONTENTS_REFINE, "version %llu contents %d",
          (unsigned long long)spx_trdc_version(f), (int)spx_trdc_contents(f));
    const spx_trdc_tensor *a = spx_trdc_find(f, "a.weight"), *b = spx_trdc_find(f, "b.weight");
    CHECK(a && b && a->kind == SPX_TRDC_REFINE && a->shape[0] == 5 && a->shape[1] == 5 && a->refine.col_stride == 3 &&
              a->refine.has_base_crc && a->refine.base_crc32 == 0xdeadbeefu && b->refine.base_crc32 == 7,
          "refine4 fields");
    CHECK(a && !memcmp(a->refine.codes, c1, sizeof c1) && !memcmp(a->refine.scales, s1, sizeof s1), "a's bytes");
    CHECK(b && !memcmp(b->refine.codes, c2, sizeof c2) && !memcmp(b->refine.scales, s2, sizeof s2), "b's bytes");
    spx_trdc_verify_report rep;
    CHECK(spx_trdc_verify(f, NULL, NULL, NULL, &rep, &e) == SPX_OK && rep.n_mismatches == 0 && rep.n_components == 4, "verify: %s", e.msg);
    spx_trdc_close(f);
}

/* The file with the first `from` of its manifest replaced by `to`
 * (manifest length fixed), written as a new file; the reader's status and
 * message. */
static void expect_bad(const char *what, const char *from, const char *to, spx_status code, const char *want) {
    size_t n = 0;
    uint8_t *img = (uint8_t *)tl_read(g_path, &n);
    CHECK(img && n > 24, "%s: read", what);
    if (!img) return;
    uint64_t ml = 0;
    for (int i = 0; i < 8; i++) ml |= (uint64_t)img[16 + i] << (8 * i);
    const size_t mo = n - (size_t)ml;
    char *man = malloc((size_t)ml + 1);
    memcpy(man, img + mo, (size_t)ml);
    man[ml] = 0;
    char *at = strstr(man, from);
    CHECK(at != NULL, "%s: '%s' not in the manifest", what, from);
    if (!at) {
        free(man), free(img);
        return;
    }
    const size_t nf = strlen(from), nt = strlen(to), nm = (size_t)ml - nf + nt;
    uint8_t *out = malloc(mo + nm);
    memcpy(out, img, mo);
    memcpy(out + mo, man, (size_t)(at - man));
    memcpy(out + mo + (at - man), to, nt);
    memcpy(out + mo + (at - man) + nt, at + nf, (size_t)ml - (size_t)(at - man) - nf);
    for (int i = 0; i < 8; i++) out[16 + i] = (uint8_t)(nm >> (8 * i));
    if (strstr(what, "version 3")) out[8] = 3; /* the header too */
    if (strstr(what, "as version 4")) out[8] = 4;
    char p[640];
    snprintf(p, sizeof p, "%s/bad_%s.refine", tl_tmpdir(), what);
    for (char *c = p + strlen(tl_tmpdir()); *c; c++)
        if (*c == ' ') *c = '_';
    CHECK(tl_write(p, out, mo + nm) == 0, "%s: write", what);
    spx_trdc *f = NULL;
    spx_err e;
    spx_err_clear(&e);
    const spx_status st = spx_trdc_open(p, &f, &e);
    CHECK(st == code && strstr(e.msg, p) && strstr(e.msg, want), "%s: status %d, message '%s' (want '%s')", what,
          (int)st, e.msg, want);
    spx_trdc_close(f);
    free(out), free(man), free(img);
}

/* A .refine with one bundle4 (2 neurons of hidden 3). */
static void write_bundle_file(void) {
    snprintf(g_path, sizeof g_path, "%s/b.refine", tl_tmpdir());
    spx_err e;
    spx_err_clear(&e);
    spx_trdc_writer *w = NULL;
    const int64_t stride = spx_bundle_stride(3);
    uint8_t bd[2 * 128];
    for (size_t i = 0; i < sizeof bd; i++) bd[i] = (uint8_t)(7 * i + 5);
    const float s1[3] = {1, 2, 3}, sb[6] = {0.5f, 0.25f, 2, -1, 1e-4f, 3};
    CHECK(stride == 128, "stride %lld", (long long)stride);
    CHECK(spx_trdc_writer_open(g_path, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_bundles(w, "d.weight.bundles", 2, 3, stride, bd, sb, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_finish(w, "{\"architectures\": [\"LlamaForCausalLM\"]}", NULL, NULL, "{}", NULL, &e) == SPX_OK,
          "%s", e.msg);
    spx_trdc *f = NULL;
    CHECK(spx_trdc_open(g_path, &f, &e) == SPX_OK, "open: %s", e.msg);
    if (!f) return;
    const spx_trdc_tensor *t = spx_trdc_find(f, "d.weight.bundles");
    CHECK(spx_trdc_version(f) == 5 && spx_trdc_contents(f) == SPX_TRDC_CONTENTS_REFINE, "version %llu",
          (unsigned long long)spx_trdc_version(f));
    CHECK(t && t->kind == SPX_TRDC_BUNDLE && t->shape[0] == 2 && t->shape[1] == 3 && t->refine.col_stride == stride &&
              !strcmp(spx_trdc_kind_name(t->kind), "bundle4"),
          "bundle4 fields");
    CHECK(t && !memcmp(t->refine.codes, bd, sizeof bd) && !memcmp(t->refine.scales, sb, sizeof sb), "bundle4 bytes");
    spx_trdc_verify_report rep;
    CHECK(spx_trdc_verify(f, NULL, NULL, NULL, &rep, &e) == SPX_OK && rep.n_components == 2, "verify: %s", e.msg);
    spx_trdc_close(f);
    /* bundles in a model file, and a stride below one bundle, are refused */
    char p2[640];
    snprintf(p2, sizeof p2, "%s/bad2.refine", tl_tmpdir());
    const int64_t shp[1] = {2};
    CHECK(spx_trdc_writer_open(p2, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_dense(w, "n", SPX_DT_F32, 1, shp, s1, 8, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_bundles(w, "b", 2, 3, stride, bd, sb, &e) == SPX_ERR_ARG && strstr(e.msg, "model file"),
          "bundles in a model: %s", e.msg);
    spx_trdc_writer_abort(w);
    spx_err_clear(&e);
    CHECK(spx_trdc_writer_open(p2, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_bundles(w, "b", 2, 3, 71, bd, sb, &e) == SPX_ERR_ARG && strstr(e.msg, "not valid"),
          "stride 71: %s", e.msg);
    spx_trdc_writer_abort(w);
}

int main(void) {
    write_file();
    expect_bad("col stride too small", "\"col_stride\":3", "\"col_stride\":2", SPX_ERR_FORMAT, "col_stride");
    expect_bad("codes size", "\"col_stride\":64", "\"col_stride\":65", SPX_ERR_FORMAT, "has size");
    expect_bad("base crc", "\"base_crc32\":7", "\"base_crc32\":-7", SPX_ERR_FORMAT, "base_crc32");
    expect_bad("refine in a model", "\"contents\":\"refine\"", "\"contents\":\"model\"", SPX_ERR_FORMAT,
               "refine4 in a file whose contents are a model");
    expect_bad("unknown contents", "\"contents\":\"refine\"", "\"contents\":\"weights\"", SPX_ERR_FORMAT,
               "'contents'");
    expect_bad("no contents", "\"contents\":\"refine\",", "", SPX_ERR_FORMAT, "refine4 in a file whose contents are a model");
    expect_bad("version 3", "\"version\":4", "\"version\":3", SPX_ERR_FORMAT, "'contents'");
    expect_bad("a quant kind", "\"kind\":\"refine4\"", "\"kind\":\"quant\"", SPX_ERR_FORMAT,
               "of kind quant in a file whose contents are \"refine\"");
    expect_bad("a missing scales", "\"scales\":", "\"scalez\":", SPX_ERR_FORMAT, "scalez");
    write_bundle_file();
    expect_bad("bundle stride too small", "\"bundle_stride\":128", "\"bundle_stride\":71", SPX_ERR_FORMAT,
               "'bundle_stride' is 71, expected an integer >= 72");
    expect_bad("bundle codes size", "\"bundle_stride\":128", "\"bundle_stride\":136", SPX_ERR_FORMAT, "has size");
    expect_bad("bundle scales size", "\"shape\":[2,3],\"bundle_stride\"", "\"shape\":[2,4],\"bundle_stride\"",
               SPX_ERR_FORMAT, "component 'scales' has size 24, expected 32");
    expect_bad("bundle as version 4", "\"version\":5", "\"version\":4", SPX_ERR_FORMAT, "came with version 5");
    expect_bad("bundle in a model", "\"contents\":\"refine\"", "\"contents\":\"model\"", SPX_ERR_FORMAT,
               "of kind bundle4 in a file whose contents are a model");
    expect_bad("bundle no stride", "\"bundle_stride\":128,", "", SPX_ERR_FORMAT, "'bundle_stride' is");
    expect_bad("bundle kind unknown", "\"kind\":\"bundle4\"", "\"kind\":\"bundle5\"", SPX_ERR_FORMAT,
               "unknown kind 'bundle5'");
    return tl_finish("test_refine_file");
}
