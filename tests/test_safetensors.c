/* test_safetensors.c: the safetensors reader on the shared models (single
 * file, folder, shards), a write -> read round trip of F32/F16/BF16, and a
 * list of handcrafted corrupt files and folders that must each fail with a
 * message naming the file and the problem. */
#define _POSIX_C_SOURCE 200809L
#include "testlib.h"

#include "core/half.h"
#include "core/util.h"
#include "format/safetensors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------- builders */

/* A safetensors image: 8-byte little-endian `hlen`, `body` (blen bytes),
 * then `dlen` bytes of data (a fixed pattern when data is NULL). */
static uint8_t *make_raw(uint64_t hlen, const char *body, size_t blen, const void *data,
                         size_t dlen, size_t *len) {
    *len = 8 + blen + dlen;
    uint8_t *b = malloc(*len ? *len : 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(b + 8, body, blen);
    for (size_t i = 0; i < dlen; i++)
        b[8 + blen + i] = data ? ((const uint8_t *)data)[i] : (uint8_t)(i * 37 + 11);
    return b;
}

/* A well-formed length prefix for a JSON header plus dlen data bytes. */
static uint8_t *make_image(const char *json, const void *data, size_t dlen, size_t *len) {
    size_t n = strlen(json);
    return make_raw(n, json, n, data, dlen, len);
}

static const char *tmp_path(const char *name) {
    static char bufs[4][1024];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, sizeof bufs[0], "%s/%s", tl_tmpdir(), name);
    return b;
}

static void make_dir(const char *name) {
    CHECK(mkdir(tmp_path(name), 0755) == 0, "mkdir %s", name);
}

static void write_image(const char *rel, const char *json, size_t dlen) {
    size_t len;
    uint8_t *b = make_image(json, NULL, dlen, &len);
    CHECK(tl_write(tmp_path(rel), b, len) == 0, "write %s", rel);
    free(b);
}

static void write_text(const char *rel, const char *text) {
    CHECK(tl_write(tmp_path(rel), text, strlen(text)) == 0, "write %s", rel);
}

/* Opening `path` must fail with a message containing `name` and `word`. */
static void expect_fail_path(const char *path, const char *name, const char *word) {
    spx_err e;
    spx_err_clear(&e);
    spx_st *st = (spx_st *)1;
    spx_status s = spx_st_open(path, &st, &e);
    CHECK(s != SPX_OK, "%s: opened but should fail (%s)", name, word);
    CHECK(st == NULL, "%s: handle not NULL on failure", name);
    CHECK(e.code == s, "%s: error code %d vs status %d", name, e.code, s);
    CHECK(strstr(e.msg, name) != NULL, "%s: message does not name the file: %s", name, e.msg);
    CHECK(strstr(e.msg, word) != NULL, "%s: message lacks '%s': %s", name, word, e.msg);
    if (getenv("SPX_TEST_VERBOSE")) printf("  %s\n", e.msg);
    if (s == SPX_OK) spx_st_free(st);
}

/* ------------------------------------------------------ shared fixtures */

static void test_docllama(void) {
    spx_err e;
    spx_err_clear(&e);
    spx_st *st = NULL;
    spx_status s = spx_st_open(tl_shared("models/docllama-58m"), &st, &e);
    CHECK(s == SPX_OK, "open docllama: %s", e.msg);
    if (s != SPX_OK) return;
    CHECK(spx_st_count(st) == 75, "docllama tensors %zu, expected 75", spx_st_count(st));
    const spx_st_tensor *t = spx_st_find(st, "model.embed_tokens.weight");
    CHECK(t && t->dtype == SPX_DT_BF16 && t->ndim == 2 && t->shape[0] == 32000 &&
              t->shape[1] == 512 && t->numel == 32000 * 512 && t->nbytes == 32768000,
          "embed_tokens wrong");
    CHECK(t && strstr(t->file, "model-00001-of-00002.safetensors"), "embed in shard 1");
    t = spx_st_find(st, "lm_head.weight");
    CHECK(t && t->dtype == SPX_DT_BF16 && t->shape[0] == 32000 && t->shape[1] == 512 &&
              strstr(t->file, "model-00002-of-00002.safetensors"),
          "lm_head wrong");
    t = spx_st_find(st, "model.layers.0.self_attn.k_proj.weight");
    CHECK(t && t->ndim == 2 && t->shape[0] == 256 && t->shape[1] == 512, "k_proj shape");
    t = spx_st_find(st, "model.norm.weight");
    CHECK(t && t->ndim == 1 && t->shape[0] == 512, "norm shape");
    if (t) {
        /* bf16 0x4007, 0x4009, 0x400f read by Python's struct module */
        float row[3];
        spx_st_row_f32(t, 0, 3, row);
        CHECK(row[0] == 2.109375f && row[1] == 2.140625f && row[2] == 2.234375f,
              "norm values %g %g %g", row[0], row[1], row[2]);
        CHECK(spx_st_get_f32(t, 2) == 2.234375f, "get_f32");
    }
    size_t total = 0;
    for (size_t i = 0; i < spx_st_count(st); i++) {
        const spx_st_tensor *u = spx_st_at(st, i);
        total += u->nbytes;
        CHECK(spx_st_find(st, u->name) == u, "find(at(%zu))", i);
        if (i) CHECK(strcmp(spx_st_at(st, i - 1)->name, u->name) < 0, "sorted names");
    }
    CHECK(total == 115885056, "total bytes %zu, index says 115885056", total);
    CHECK(spx_st_at(st, spx_st_count(st)) == NULL, "at past end");
    CHECK(spx_st_find(st, "model.embed_tokens") == NULL, "find prefix");
    CHECK(spx_st_find(st, "") == NULL, "find empty");
    CHECK(spx_st_find(st, "zzz") == NULL, "find past last");
    spx_st_free(st);

    /* the index file itself names the same checkpoint */
    st = NULL;
    s = spx_st_open(tl_shared("models/docllama-58m/model.safetensors.index.json"), &st, &e);
    CHECK(s == SPX_OK, "open docllama index: %s", e.msg);
    CHECK(spx_st_count(st) == 75, "docllama via index: %zu tensors", spx_st_count(st));
    spx_st_free(st);
}

static void test_stories(void) {
    const char *paths[2] = {tl_shared("models/stories260K/model.safetensors"),
                            tl_shared("models/stories260K")};
    for (int k = 0; k < 2; k++) {
        spx_err e;
        spx_err_clear(&e);
        spx_st *st = NULL;
        spx_status s = spx_st_open(paths[k], &st, &e);
        CHECK(s == SPX_OK, "open %s: %s", paths[k], e.msg);
        if (s != SPX_OK) continue;
        CHECK(spx_st_count(st) == 47, "stories260K tensors %zu, expected 47", spx_st_count(st));
        for (size_t i = 0; i < spx_st_count(st); i++)
            CHECK(spx_st_at(st, i)->dtype == SPX_DT_F32, "dtype of %s", spx_st_at(st, i)->name);
        const spx_st_tensor *t = spx_st_find(st, "model.embed_tokens.weight");
        CHECK(t && t->shape[0] == 512 && t->shape[1] == 64, "embed shape");
        if (t) {
            CHECK(spx_st_get_f32(t, 0) == -0.29474878311157227f &&
                      spx_st_get_f32(t, 1) == 0.5618956089019775f &&
                      spx_st_get_f32(t, 2) == 0.1754225343465805f,
                  "embed values");
        }
        t = spx_st_find(st, "model.layers.0.mlp.down_proj.weight");
        CHECK(t && t->shape[0] == 64 && t->shape[1] == 172, "down_proj shape");
        spx_st_free(st);
    }
}

static void test_qwen2(void) {
    spx_err e;
    spx_err_clear(&e);
    spx_st *st = NULL;
    spx_status s = spx_st_open(tl_shared("models/tiny-qwen2"), &st, &e);
    CHECK(s == SPX_OK, "open tiny-qwen2: %s", e.msg);
    if (s != SPX_OK) return;
    CHECK(spx_st_count(st) == 38, "tiny-qwen2 tensors %zu, expected 38", spx_st_count(st));
    CHECK(spx_st_find(st, "lm_head.weight") == NULL, "tied model has no lm_head");
    const spx_st_tensor *t = spx_st_find(st, "model.embed_tokens.weight");
    CHECK(t && t->shape[0] == 512 && t->shape[1] == 128, "embed shape");
    t = spx_st_find(st, "model.layers.0.self_attn.q_proj.bias");
    CHECK(t && t->ndim == 1, "q_proj bias");
    spx_st_free(st);
}

/* ----------------------------------------------------------- round trip */

static void test_round_trip(void) {
    uint64_t rng = 12345;
    enum { NA = 15, NB = 12, NC = 14 };
    float a[NA], b[NB], c[NC], scalar = tl_rand_normal(&rng);
    uint16_t bh[NB], ch[NC];
    for (int i = 0; i < NA; i++) a[i] = tl_rand_normal(&rng);
    for (int i = 0; i < NB; i++) bh[i] = spx_f32_to_f16(b[i] = tl_rand_normal(&rng) * 3);
    for (int i = 0; i < NC; i++) ch[i] = spx_f32_to_bf16(c[i] = tl_rand_normal(&rng) * 100);
    /* data: a [0,60) b [60,84) c [84,112) scalar [112,116) */
    uint8_t data[116];
    memcpy(data, a, 60);
    memcpy(data + 60, bh, 24);
    memcpy(data + 84, ch, 28);
    memcpy(data + 112, &scalar, 4);
    char json[1024];
    int n = snprintf(json, sizeof json,
                     "{\"__metadata__\":{\"format\":\"pt\"},"
                     "\"w.f16\":{\"dtype\":\"F16\",\"shape\":[4,3],\"data_offsets\":[60,84]},"
                     "\"w.f32\":{\"dtype\":\"F32\",\"shape\":[3,5],\"data_offsets\":[0,60]},"
                     "\"w.bf16\":{\"dtype\":\"BF16\",\"shape\":[2,7],\"data_offsets\":[84,112]},"
                     "\"w.scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[112,116]},"
                     "\"w.empty\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[60,60]}}");
    while (n % 8) json[n++] = ' ';   /* pad like the reference writer */
    json[n] = '\0';
    size_t len;
    uint8_t *img = make_image(json, data, sizeof data, &len);
    const char *path = tmp_path("roundtrip.safetensors");
    CHECK(tl_write(path, img, len) == 0, "write");

    for (int via = 0; via < 2; via++) {
        spx_err e;
        spx_err_clear(&e);
        spx_st *st = NULL;
        spx_status s = via ? spx_st_open_buffer(img, len, "rt", &st, &e)
                           : spx_st_open(path, &st, &e);
        CHECK(s == SPX_OK, "round trip open (%d): %s", via, e.msg);
        if (s != SPX_OK) continue;
        CHECK(spx_st_count(st) == 5, "count %zu", spx_st_count(st));
        const spx_st_tensor *t = spx_st_find(st, "w.f32");
        CHECK(t && t->dtype == SPX_DT_F32 && t->ndim == 2 && t->shape[0] == 3 &&
                  t->shape[1] == 5 && t->numel == NA && t->nbytes == 60,
              "w.f32 header");
        if (t)
            for (int i = 0; i < NA; i++)
                CHECK(spx_st_get_f32(t, i) == a[i], "f32[%d]", i);
        t = spx_st_find(st, "w.f16");
        CHECK(t && t->dtype == SPX_DT_F16 && t->numel == NB && t->nbytes == 24, "w.f16 header");
        if (t) {
            float row[NB];
            spx_st_row_f32(t, 3, 6, row);  /* rows 1..2 of [4,3] */
            for (int i = 0; i < NB; i++) {
                float want = spx_f16_to_f32(spx_f32_to_f16(b[i]));
                CHECK(spx_st_get_f32(t, i) == want, "f16[%d]", i);
                CHECK(fabsf(want - b[i]) <= 1e-3f * fabsf(b[i]) + 1e-7f, "f16 rounding %d", i);
                if (i >= 3 && i < 9) CHECK(row[i - 3] == want, "f16 row[%d]", i - 3);
            }
        }
        t = spx_st_find(st, "w.bf16");
        CHECK(t && t->dtype == SPX_DT_BF16 && t->shape[0] == 2 && t->shape[1] == 7, "w.bf16");
        if (t) {
            float row[NC];
            for (int i = 0; i < NC; i++) row[i] = NAN;   /* poison */
            spx_st_row_f32(t, 0, NC, row);
            for (int i = 0; i < NC; i++) {
                float want = spx_bf16_to_f32(spx_f32_to_bf16(c[i]));
                CHECK(row[i] == want && spx_st_get_f32(t, i) == want, "bf16[%d]", i);
                CHECK(fabsf(want - c[i]) <= 4e-3f * fabsf(c[i]), "bf16 rounding %d", i);
            }
        }
        t = spx_st_find(st, "w.scalar");
        CHECK(t && t->ndim == 0 && t->numel == 1 && spx_st_get_f32(t, 0) == scalar, "scalar");
        t = spx_st_find(st, "w.empty");
        CHECK(t && t->ndim == 2 && t->numel == 0 && t->nbytes == 0, "empty tensor");
        CHECK(t && strcmp(t->file, via ? "rt" : path) == 0, "file label %s", t ? t->file : "");
        spx_st_free(st);
    }
    free(img);

    /* A folder whose only *.safetensors file is not model.safetensors. */
    make_dir("onefile");
    img = make_image(json, data, sizeof data, &len);
    CHECK(tl_write(tmp_path("onefile/weights.safetensors"), img, len) == 0, "write");
    write_text("onefile/notes.txt", "not a tensor file");
    spx_err e;
    spx_err_clear(&e);
    spx_st *st = NULL;
    CHECK(spx_st_open(tmp_path("onefile"), &st, &e) == SPX_OK, "only file: %s", e.msg);
    CHECK(spx_st_count(st) == 5, "only file count");
    spx_st_free(st);
    free(img);
}

/* A valid two-shard folder. */
static void test_sharded_ok(void) {
    make_dir("shards");
    write_image("shards/s1.safetensors",
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    write_image("shards/s2.safetensors",
                "{\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
                "\"c\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[8,11]}}", 11);
    write_text("shards/model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":19},\"weight_map\":{\"a\":\"s1.safetensors\","
               "\"b\":\"s2.safetensors\",\"c\":\"s2.safetensors\"}}");
    spx_err e;
    spx_err_clear(&e);
    spx_st *st = NULL;
    spx_status s = spx_st_open(tmp_path("shards"), &st, &e);
    CHECK(s == SPX_OK, "sharded: %s", e.msg);
    if (s == SPX_OK) {
        CHECK(spx_st_count(st) == 3, "sharded count");
        const spx_st_tensor *t = spx_st_find(st, "c");
        CHECK(t && t->dtype == SPX_DT_I8 && t->nbytes == 3 && strstr(t->file, "s2.safetensors"),
              "c");
        spx_st_free(st);
    }
}

/* ------------------------------------------------------- corrupt inputs */

typedef struct bad_case {
    const char *name;     /* file name, also the buffer label */
    const char *json;     /* header text (NULL: raw below) */
    size_t dlen;          /* data bytes after the header */
    const char *word;     /* a word the message must contain */
} bad_case;

#define T(dt, sh, off) "{\"dtype\":\"" dt "\",\"shape\":" sh ",\"data_offsets\":" off "}"

static const bad_case bad_json[] = {
    {"not_json.safetensors", "hello, world", 0, "JSON"},
    {"truncated_json.safetensors", "{\"a\":{\"dtype\":\"F32\"", 0, "JSON"},
    {"json_array.safetensors", "[1,2,3]", 0, "array"},
    {"json_string.safetensors", "\"abc\"", 0, "expected an object"},
    {"non_utf8.safetensors", "{\"w\xff\xfe\":" T("F32", "[1]", "[0,4]") "}", 4, "UTF-8"},
    {"overlong_utf8.safetensors", "{\"w\xc0\xaf\":" T("F32", "[1]", "[0,4]") "}", 4, "UTF-8"},
    {"surrogate_utf8.safetensors", "{\"w\xed\xa0\x80\":" T("F32", "[1]", "[0,4]") "}", 4,
     "UTF-8"},
    {"control_byte.safetensors", "{\"w\x01\":" T("F32", "[1]", "[0,4]") "}", 4, "control"},
    {"nul_escape.safetensors", "{\"w\\u0000x\":" T("F32", "[1]", "[0,4]") "}", 4, "NUL"},
    {"trailing.safetensors", "{}  x", 0, "after"},
    {"entry_number.safetensors", "{\"w\":5}", 0, "expected an object"},
    {"no_dtype.safetensors", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype"},
    {"no_shape.safetensors", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "shape"},
    {"no_offsets.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets"},
    {"dtype_number.safetensors", "{\"w\":" T("F32", "[1]", "[0,4]") ",\"v\":{\"dtype\":7,"
     "\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "dtype"},
    {"dtype_twice.safetensors", "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],"
     "\"data_offsets\":[0,4]}}", 4, "twice"},
    {"unknown_dtype.safetensors", "{\"w\":" T("F17", "[1]", "[0,4]") "}", 4, "dtype"},
    {"fp8_dtype.safetensors", "{\"w\":" T("F8_E4M3", "[4]", "[0,4]") "}", 4, "unsupported"},
    {"shape_string.safetensors", "{\"w\":" T("F32", "\"1\"", "[0,4]") "}", 4, "shape"},
    {"negative_dim.safetensors", "{\"w\":" T("F32", "[-1,2]", "[0,8]") "}", 8, "negative"},
    {"fraction_dim.safetensors", "{\"w\":" T("F32", "[1.5]", "[0,4]") "}", 4, "integer"},
    {"string_dim.safetensors", "{\"w\":" T("F32", "[\"2\"]", "[0,8]") "}", 8, "number"},
    {"huge_dim.safetensors", "{\"w\":" T("F32", "[1e300]", "[0,4]") "}", 4, "2^53"},
    {"too_many_dims.safetensors", "{\"w\":" T("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4,
     "dimensions"},
    {"shape_overflow.safetensors", "{\"w\":" T("F32", "[1099511627776,1099511627776]", "[0,4]")
     "}", 4, "overflow"},
    {"bytes_overflow.safetensors", "{\"w\":" T("F64", "[2147483648,2147483648]", "[0,4]")
     "}", 4, "overflow"},
    {"size_mismatch.safetensors", "{\"w\":" T("F32", "[2,2]", "[0,12]") "}", 16, "mismatch"},
    {"offsets_range.safetensors", "{\"w\":" T("F32", "[4]", "[0,16]") "}", 8, "out of range"},
    {"offsets_huge.safetensors", "{\"w\":" T("U8", "[1]", "[9007199254740990,9007199254740991]")
     "}", 8, "out of range"},
    {"offsets_negative.safetensors", "{\"w\":" T("U8", "[1]", "[-1,0]") "}", 8, "negative"},
    {"begin_after_end.safetensors", "{\"w\":" T("U8", "[0]", "[8,0]") "}", 8, "begin"},
    {"offsets_arity1.safetensors", "{\"w\":" T("F32", "[1]", "[0]") "}", 4, "data_offsets"},
    {"offsets_arity3.safetensors", "{\"w\":" T("F32", "[1]", "[0,4,8]") "}", 8,
     "data_offsets"},
    {"offsets_object.safetensors", "{\"w\":" T("F32", "[1]", "{\"a\":0}") "}", 8,
     "data_offsets"},
    {"overlap.safetensors", "{\"a\":" T("F32", "[2]", "[0,8]") ",\"b\":" T("F32", "[2]", "[4,12]")
     "}", 12, "overlap"},
    {"overlap_inside.safetensors", "{\"a\":" T("F32", "[4]", "[0,16]") ",\"b\":" T("U8", "[2]",
     "[4,6]") ",\"c\":" T("U8", "[2]", "[8,10]") "}", 16, "overlap"},
    {"same_range.safetensors", "{\"a\":" T("F32", "[2]", "[0,8]") ",\"b\":" T("F32", "[2]", "[0,8]")
     "}", 8, "overlap"},
    {"duplicate.safetensors", "{\"a\":" T("F32", "[1]", "[0,4]") ",\"a\":" T("F32", "[1]", "[4,8]")
     "}", 8, "duplicate"},
    {"meta_array.safetensors", "{\"__metadata__\":[1],\"a\":" T("F32", "[1]", "[0,4]") "}", 4,
     "__metadata__"},
    {"meta_number.safetensors", "{\"__metadata__\":{\"format\":1}}", 0, "__metadata__"},
    {"meta_twice.safetensors", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "twice"},
};

static void check_buffer_fails(const uint8_t *b, size_t len, const char *name, const char *word) {
    spx_err e;
    spx_err_clear(&e);
    spx_st *st = (spx_st *)1;
    spx_status s = spx_st_open_buffer(b, len, name, &st, &e);
    CHECK(s != SPX_OK, "%s (buffer): accepted", name);
    CHECK(st == NULL, "%s (buffer): handle not NULL", name);
    CHECK(strstr(e.msg, name) && strstr(e.msg, word), "%s (buffer): message '%s' lacks '%s'",
          name, e.msg, word);
    if (getenv("SPX_TEST_VERBOSE")) printf("  %s\n", e.msg);
    if (s == SPX_OK) spx_st_free(st);
}

/* Writes the image to tl_tmpdir()/name, opens it by path and from memory. */
static void check_image_fails(const uint8_t *b, size_t len, const char *name, const char *word) {
    const char *path = tmp_path(name);
    CHECK(tl_write(path, b, len) == 0, "write %s", name);
    expect_fail_path(path, name, word);
    check_buffer_fails(b, len, name, word);
}

static void test_corrupt_files(void) {
    size_t len;
    uint8_t *b;

    /* length prefix problems */
    check_image_fails((const uint8_t *)"", 0, "empty.safetensors", "truncated");
    check_image_fails((const uint8_t *)"\x10\x00\x00", 3, "short.safetensors", "truncated");
    b = make_raw(1000, "{}", 2, NULL, 0, &len);
    check_image_fails(b, len, "hlen_past_end.safetensors", "header length");
    free(b);
    b = make_raw(1ull << 63, "{}", 2, NULL, 0, &len);
    check_image_fails(b, len, "hlen_huge.safetensors", "header length");
    free(b);
    b = make_raw(~0ull, "{}", 2, NULL, 0, &len);
    check_image_fails(b, len, "hlen_max.safetensors", "header length");
    free(b);
    b = make_raw(0, "", 0, NULL, 16, &len);
    check_image_fails(b, len, "hlen_zero.safetensors", "header length");
    free(b);

    /* nesting: 10000 '[' (cJSON would recurse that deep) */
    size_t nd = 10000;
    char *deep = malloc(nd + 1);
    memset(deep, '[', nd);
    deep[nd] = '\0';
    b = make_image(deep, NULL, 0, &len);
    check_image_fails(b, len, "deep.safetensors", "deeper");
    free(b);
    /* deep inside a valid-looking object, with closing brackets */
    size_t m = 0;
    m += (size_t)sprintf(deep + m, "{\"__metadata__\":");
    for (int i = 0; i < 100; i++) deep[m++] = '[';
    for (int i = 0; i < 100; i++) deep[m++] = ']';
    deep[m++] = '}';
    deep[m] = '\0';
    b = make_image(deep, NULL, 0, &len);
    check_image_fails(b, len, "deep_closed.safetensors", "deeper");
    free(b);
    free(deep);

    for (size_t i = 0; i < sizeof bad_json / sizeof bad_json[0]; i++) {
        b = make_image(bad_json[i].json, NULL, bad_json[i].dlen, &len);
        check_image_fails(b, len, bad_json[i].name, bad_json[i].word);
        free(b);
    }

    /* not a regular file / does not exist */
    expect_fail_path(tmp_path("missing.safetensors"), "missing.safetensors", "open");
    spx_err e;
    spx_err_clear(&e);
    spx_st *st = NULL;
    CHECK(spx_st_open(NULL, &st, &e) == SPX_ERR_ARG, "NULL path");
}

static void test_corrupt_folders(void) {
    const char *one = "{\"a\":" T("F32", "[2]", "[0,8]") "}";

    /* index names a shard that does not exist */
    make_dir("idx_missing");
    write_image("idx_missing/s1.safetensors", one, 8);
    write_text("idx_missing/model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    expect_fail_path(tmp_path("idx_missing"), "model.safetensors.index.json", "missing");
    expect_fail_path(tmp_path("idx_missing"), "s2.safetensors", "missing");

    /* index names a tensor its shard lacks */
    make_dir("idx_absent");
    write_image("idx_absent/s1.safetensors", one, 8);
    write_text("idx_absent/model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"s1.safetensors\",\"ghost\":\"s1.safetensors\"}}");
    expect_fail_path(tmp_path("idx_absent"), "model.safetensors.index.json", "not found");
    expect_fail_path(tmp_path("idx_absent"), "ghost", "s1.safetensors");

    /* index puts a tensor in the wrong shard */
    make_dir("idx_wrong");
    write_image("idx_wrong/s1.safetensors",
                "{\"a\":" T("F32", "[1]", "[0,4]") ",\"c\":" T("F32", "[1]", "[4,8]") "}", 8);
    write_image("idx_wrong/s2.safetensors", "{\"b\":" T("F32", "[2]", "[0,8]") "}", 8);
    write_text("idx_wrong/model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"s2.safetensors\",\"b\":\"s2.safetensors\","
               "\"c\":\"s1.safetensors\"}}");
    expect_fail_path(tmp_path("idx_wrong"), "model.safetensors.index.json", "found in");

    /* shard paths that leave the folder */
    make_dir("idx_escape");
    write_image("idx_escape.safetensors", one, 8);
    write_text("idx_escape/model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"../idx_escape.safetensors\"}}");
    expect_fail_path(tmp_path("idx_escape"), "model.safetensors.index.json", "..");
    make_dir("idx_abs");
    write_text("idx_abs/model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"/etc/passwd\"}}");
    expect_fail_path(tmp_path("idx_abs"), "model.safetensors.index.json", "/etc/passwd");

    /* the same tensor in two shards */
    make_dir("idx_dup");
    write_image("idx_dup/s1.safetensors", one, 8);
    write_image("idx_dup/s2.safetensors",
                "{\"b\":" T("F32", "[1]", "[0,4]") ",\"a\":" T("F32", "[1]", "[4,8]") "}", 8);
    write_text("idx_dup/model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    expect_fail_path(tmp_path("idx_dup"), "s2.safetensors", "duplicate");
    expect_fail_path(tmp_path("idx_dup"), "s1.safetensors", "duplicate");

    /* malformed index files */
    struct { const char *dir, *text, *word; } idx[] = {
        {"idx_notjson", "{\"weight_map\":", "JSON"},
        {"idx_nomap", "{\"metadata\":{}}", "weight_map"},
        {"idx_maparr", "{\"weight_map\":[\"s1.safetensors\"]}", "array"},
        {"idx_mapnum", "{\"weight_map\":{\"a\":3}}", "number"},
        {"idx_empty", "{\"weight_map\":{}}", "empty"},
        {"idx_dupkey", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"a\":\"s1.safetensors\"}}",
         "twice"},
        {"idx_utf8", "{\"weight_map\":{\"a\xff\":\"s1.safetensors\"}}", "UTF-8"},
        {"idx_emptyname", "{\"weight_map\":{\"a\":\"\"}}", "shard"},
    };
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++) {
        char rel[256];
        make_dir(idx[i].dir);
        snprintf(rel, sizeof rel, "%s/s1.safetensors", idx[i].dir);
        write_image(rel, one, 8);
        snprintf(rel, sizeof rel, "%s/model.safetensors.index.json", idx[i].dir);
        write_text(rel, idx[i].text);
        expect_fail_path(tmp_path(idx[i].dir), "model.safetensors.index.json", idx[i].word);
    }

    /* a corrupt shard: the message names the shard */
    make_dir("idx_badshard");
    write_image("idx_badshard/s1.safetensors", "{\"a\":" T("F32", "[2]", "[0,9]") "}", 9);
    write_text("idx_badshard/model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"s1.safetensors\"}}");
    expect_fail_path(tmp_path("idx_badshard"), "s1.safetensors", "mismatch");

    /* several files, no index */
    make_dir("two_files");
    write_image("two_files/x.safetensors", one, 8);
    write_image("two_files/y.safetensors", "{\"b\":" T("F32", "[2]", "[0,8]") "}", 8);
    expect_fail_path(tmp_path("two_files"), "two_files", "index");

    /* no safetensors at all */
    make_dir("no_files");
    write_text("no_files/config.json", "{}");
    expect_fail_path(tmp_path("no_files"), "no_files", "safetensors");
}

int main(void) {
    test_docllama();
    test_stories();
    test_qwen2();
    test_round_trip();
    test_sharded_ok();
    test_corrupt_files();
    test_corrupt_folders();
    return tl_finish("test_safetensors");
}
