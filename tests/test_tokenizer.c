/* test_tokenizer.c: the tokenizer against references nobody here wrote.
 *
 *  - tokenizers/{qwen3,llama3,llama2}/reference.jsonl (transformers.js):
 *    ids with and without special tokens, decode with and without
 *    skip_special; every row also through the streaming decoder;
 *  - stories260K: llama2.c's encode() (reference/tokenizer.jsonl) and the
 *    prompts of greedy.jsonl, decode back to the text, and llama2.c's
 *    printed text for prompt + greedy continuation;
 *  - docllama-58m: the first 64 input ids (BOS + eval.txt);
 *  - streaming across byte-fallback / byte-level pieces of one character;
 *  - a small handwritten tokenizer for Metaspace, lstrip/rstrip/single_word;
 *  - corrupt tokenizer.json files and invalid UTF-8, which must fail with a
 *    message and no crash. */
#include "format/tokenizer.h"
#include "testlib.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

static spx_tokenizer *load_dir(const char *rel) {
    spx_err e;
    spx_err_clear(&e);
    spx_tokenizer *t = NULL;
    spx_status st = spx_tok_load_dir(tl_shared(rel), &t, NULL, &e);
    CHECK(st == SPX_OK, "loading %s: %s", rel, e.msg);
    return t;
}

/* JSON array of ints -> malloc'd array. */
static int32_t *json_ids(const cJSON *a, size_t *n) {
    *n = 0;
    if (!cJSON_IsArray(a)) return NULL;
    size_t k = (size_t)cJSON_GetArraySize(a);
    int32_t *v = malloc((k ? k : 1) * sizeof *v);
    for (const cJSON *it = a->child; it; it = it->next) v[(*n)++] = (int32_t)it->valuedouble;
    return v;
}

static void print_ids(const char *what, const int32_t *v, size_t n) {
    fprintf(stderr, "    %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", v[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static int ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

/* Encodes text and compares with ref; returns 1 if equal. */
static int check_encode(spx_tokenizer *t, const char *name, const char *text, size_t len,
                        int add_special, const int32_t *ref, size_t nref) {
    spx_err e;
    spx_err_clear(&e);
    int32_t *ids = NULL;
    size_t n = 0;
    spx_status st = spx_tok_encode(t, text, len, add_special, &ids, &n, &e);
    int ok = st == SPX_OK && ids_equal(ids, n, ref, nref);
    CHECK(ok, "%s: encode(add_special=%d) of \"%.60s\" differs (%s)", name, add_special, text,
          st ? e.msg : "ids");
    if (!ok && st == SPX_OK) {
        print_ids("got", ids, n);
        print_ids("ref", ref, nref);
    }
    free(ids);
    return ok;
}

/* Checks that s[0..n) is made of complete UTF-8 characters. */
static int whole_chars(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (k == 0 || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

/* Streams ids one at a time; the concatenation must equal decode(), and
 * no chunk may end inside a character. Returns 1 if so. */
static int check_stream(spx_tokenizer *t, const char *name, const int32_t *ids, size_t n,
                        int skip) {
    spx_err e;
    spx_err_clear(&e);
    char *whole = NULL;
    size_t wl = 0;
    if (spx_tok_decode(t, ids, n, skip, &whole, &wl, &e) != SPX_OK) {
        CHECK(0, "%s: decode failed: %s", name, e.msg);
        return 0;
    }
    spx_tok_stream *s = NULL;
    CHECK(spx_tok_stream_new(t, skip, &s, &e) == SPX_OK, "%s: stream_new: %s", name, e.msg);
    char *cat = malloc(wl * 2 + 64);
    size_t cl = 0, cap = wl * 2 + 64;
    int ok = 1;
    for (size_t i = 0; i <= n && s; i++) {
        const char *txt;
        size_t len;
        spx_status st = i < n ? spx_tok_stream_push(s, ids[i], &txt, &len, &e)
                              : spx_tok_stream_flush(s, &txt, &len, &e);
        if (st != SPX_OK) {
            CHECK(0, "%s: stream step %zu: %s", name, i, e.msg);
            ok = 0;
            break;
        }
        if (i < n && !whole_chars(txt, len)) {
            CHECK(0, "%s: stream chunk %zu ends inside a UTF-8 character", name, i);
            ok = 0;
        }
        if (cl + len + 1 > cap) {
            cap = (cl + len + 1) * 2;
            cat = realloc(cat, cap);
        }
        memcpy(cat + cl, txt, len);
        cl += len;
    }
    if (ok) {
        ok = cl == wl && !memcmp(cat, whole, wl);
        CHECK(ok, "%s: streamed text (skip=%d) '%.*s' != decode '%s'", name, skip, (int)cl, cat,
              whole);
    }
    spx_tok_stream_free(s);
    free(cat);
    free(whole);
    return ok;
}

static int check_decode(spx_tokenizer *t, const char *name, const int32_t *ids, size_t n, int skip,
                        const char *ref) {
    spx_err e;
    spx_err_clear(&e);
    char *out = NULL;
    size_t len = 0;
    spx_status st = spx_tok_decode(t, ids, n, skip, &out, &len, &e);
    int ok = st == SPX_OK && len == strlen(ref) && !memcmp(out, ref, len);
    CHECK(ok, "%s: decode(skip=%d) gave '%s', expected '%s' (%s)", name, skip, out ? out : "",
          ref, st ? e.msg : "text");
    free(out);
    return ok;
}

/* Calls fn(row) for each JSON line of a file; returns the number of rows. */
static size_t for_each_line(const char *path, void (*fn)(const cJSON *, void *), void *arg) {
    size_t len;
    char *buf = tl_read(path, &len);
    if (!buf) {
        CHECK(0, "cannot read %s", path);
        return 0;
    }
    size_t rows = 0;
    char *p = buf;
    while (*p) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        if (*p) {
            cJSON *row = cJSON_Parse(p);
            CHECK(row != NULL, "%s: row %zu is not JSON", path, rows);
            if (row) fn(row, arg);
            cJSON_Delete(row);
            rows++;
        }
        if (!nl) break;
        p = nl + 1;
    }
    free(buf);
    return rows;
}

/* ------------------------------------------------------------------ */
/* Reference files                                                     */
/* ------------------------------------------------------------------ */

typedef struct {
    spx_tokenizer *t;
    const char *name;
    size_t good;
} ref_ctx;

static void ref_row(const cJSON *row, void *arg) {
    ref_ctx *c = arg;
    const cJSON *text = cJSON_GetObjectItem(row, "text");
    const cJSON *dec = cJSON_GetObjectItem(row, "decoded");
    const cJSON *dss = cJSON_GetObjectItem(row, "decoded_skip_special");
    if (!cJSON_IsString(text) || !cJSON_IsString(dec) || !cJSON_IsString(dss)) {
        CHECK(0, "%s: malformed reference row", c->name);
        return;
    }
    size_t n1, n2;
    int32_t *ids = json_ids(cJSON_GetObjectItem(row, "ids"), &n1);
    int32_t *ids_ns = json_ids(cJSON_GetObjectItem(row, "ids_no_special"), &n2);
    const char *s = text->valuestring;
    int ok = check_encode(c->t, c->name, s, strlen(s), 1, ids, n1);
    ok &= check_encode(c->t, c->name, s, strlen(s), 0, ids_ns, n2);
    ok &= check_decode(c->t, c->name, ids, n1, 0, dec->valuestring);
    ok &= check_decode(c->t, c->name, ids, n1, 1, dss->valuestring);
    ok &= check_stream(c->t, c->name, ids, n1, 0);
    ok &= check_stream(c->t, c->name, ids, n1, 1);
    c->good += ok;
    free(ids);
    free(ids_ns);
}

static void test_reference(const char *name, int32_t bos, int32_t eos) {
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizers/%s", name);
    spx_tokenizer *t = load_dir(rel);
    if (!t) return;
    CHECK(spx_tok_bos(t) == bos, "%s: bos %d, expected %d", name, spx_tok_bos(t), bos);
    CHECK(spx_tok_eos(t) == eos, "%s: eos %d, expected %d", name, spx_tok_eos(t), eos);
    ref_ctx c = {t, name, 0};
    snprintf(rel, sizeof rel, "tokenizers/%s/reference.jsonl", name);
    size_t rows = for_each_line(tl_shared(rel), ref_row, &c);
    CHECK(rows >= 40, "%s: only %zu reference rows", name, rows);
    printf("%s: %zu/%zu reference rows match (encode x2, decode x2, stream x2)\n", name, c.good,
           rows);
    spx_tok_free(t);
}

/* stories260K */
static void stories_tok_row(const cJSON *row, void *arg) {
    ref_ctx *c = arg;
    const char *s = cJSON_GetObjectItem(row, "text")->valuestring;
    size_t n;
    int32_t *ids = json_ids(cJSON_GetObjectItem(row, "ids"), &n);
    int ok = check_encode(c->t, c->name, s, strlen(s), 1, ids, n);
    ok &= check_decode(c->t, c->name, ids, n, 1, s);
    ok &= check_stream(c->t, c->name, ids, n, 1);
    ok &= check_stream(c->t, c->name, ids, n, 0);
    c->good += ok;
    free(ids);
}

static void stories_greedy_row(const cJSON *row, void *arg) {
    ref_ctx *c = arg;
    const char *s = cJSON_GetObjectItem(row, "prompt")->valuestring;
    size_t np, no;
    int32_t *p = json_ids(cJSON_GetObjectItem(row, "prompt_ids"), &np);
    int32_t *o = json_ids(cJSON_GetObjectItem(row, "output_ids"), &no);
    int ok = check_encode(c->t, c->name, s, strlen(s), 1, p, np);
    /* llama2.c's printed text == HF decode(prompt + output, skip) + "\n" */
    int32_t *all = malloc((np + no) * sizeof *all);
    memcpy(all, p, np * sizeof *p);
    memcpy(all + np, o, no * sizeof *o);
    const cJSON *out = cJSON_GetObjectItem(row, "run_c_stdout");
    if (cJSON_IsString(out)) {
        size_t ol = strlen(out->valuestring);
        char *want = malloc(ol + 1);
        memcpy(want, out->valuestring, ol + 1);
        if (ol && want[ol - 1] == '\n') want[ol - 1] = '\0';
        ok &= check_decode(c->t, c->name, all, np + no, 1, want);
        free(want);
    }
    ok &= check_stream(c->t, c->name, all, np + no, 1);
    c->good += ok;
    free(all);
    free(p);
    free(o);
}

static void test_stories(void) {
    spx_tokenizer *t = load_dir("models/stories260K");
    if (!t) return;
    CHECK(spx_tok_vocab_size(t) == 512, "stories260K: vocab %lld", (long long)spx_tok_vocab_size(t));
    CHECK(spx_tok_bos(t) == 1 && spx_tok_eos(t) == 2, "stories260K: bos/eos %d/%d", spx_tok_bos(t),
          spx_tok_eos(t));
    ref_ctx c = {t, "stories260K", 0};
    size_t rows = for_each_line(tl_shared("models/stories260K/reference/tokenizer.jsonl"),
                                stories_tok_row, &c);
    CHECK(rows >= 10, "stories260K: only %zu tokenizer rows", rows);
    printf("stories260K: %zu/%zu tokenizer.jsonl rows match (encode, decode, stream)\n", c.good, rows);
    c.good = 0;
    rows = for_each_line(tl_shared("models/stories260K/reference/greedy.jsonl"), stories_greedy_row, &c);
    CHECK(rows >= 3, "stories260K: only %zu greedy rows", rows);
    printf("stories260K: %zu/%zu greedy.jsonl prompts match (encode, run.c text)\n", c.good, rows);
    spx_tok_free(t);
}

static void test_docllama(void) {
    spx_tokenizer *t = load_dir("models/docllama-58m");
    if (!t) return;
    size_t len, jl;
    char *txt = tl_read(tl_shared("models/docllama-58m/eval.txt"), &len);
    char *js = tl_read(tl_shared("models/docllama-58m/reference.json"), &jl);
    cJSON *ref = js ? cJSON_Parse(js) : NULL;
    size_t nref = 0;
    int32_t *want = ref ? json_ids(cJSON_GetObjectItem(ref, "input_ids"), &nref) : NULL;
    CHECK(txt && want && nref == 64, "docllama: fixtures missing");
    if (txt && want) {
        spx_err e;
        spx_err_clear(&e);
        int32_t *ids = NULL;
        size_t n = 0;
        spx_status st = spx_tok_encode(t, txt, len, 0, &ids, &n, &e);
        CHECK(st == SPX_OK, "docllama: encode eval.txt: %s", e.msg);
        int ok = st == SPX_OK && n + 1 >= nref && want[0] == spx_tok_bos(t) &&
                 !memcmp(ids, want + 1, (nref - 1) * sizeof *ids);
        CHECK(ok, "docllama: BOS + encode(eval.txt) does not start with reference input_ids");
        if (!ok && ids) {
            print_ids("got", ids, n < 63 ? n : 63);
            print_ids("ref", want + 1, nref - 1);
        }
        printf("docllama-58m: eval.txt (%zu bytes) -> %zu tokens; first %zu ids %s\n", len, n,
               nref, ok ? "match" : "DIFFER");
        free(ids);
    }
    free(want);
    cJSON_Delete(ref);
    free(js);
    free(txt);
    spx_tok_free(t);
}

/* ------------------------------------------------------------------ */
/* Streaming of characters split across tokens                         */
/* ------------------------------------------------------------------ */

static void test_stream_split(void) {
    spx_tokenizer *t = load_dir("tokenizers/llama2");
    if (!t) return;
    spx_err e;
    spx_err_clear(&e);
    /* "텍" = ED 85 8D as three byte-fallback tokens (<0xXX> = 3 + byte) */
    int32_t ids[] = {1, 3 + 0xED, 3 + 0x85, 3 + 0x8D, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80};
    CHECK(!strcmp(spx_tok_piece(t, 3 + 0xED), "<0xED>"), "llama2: byte token layout");
    spx_tok_stream *s = NULL;
    CHECK(spx_tok_stream_new(t, 1, &s, &e) == SPX_OK, "stream_new");
    const char *want[] = {"", "", "", "텍", "", "", "", "😀"};
    for (size_t i = 0; s && i < 8; i++) {
        const char *txt;
        size_t len;
        CHECK(spx_tok_stream_push(s, ids[i], &txt, &len, &e) == SPX_OK, "push: %s", e.msg);
        CHECK(len == strlen(want[i]) && !memcmp(txt, want[i], len),
              "byte-fallback stream step %zu: got '%.*s', want '%s'", i, (int)len, txt, want[i]);
    }
    /* an incomplete character at the end comes out as U+FFFD on flush */
    const char *txt;
    size_t len;
    if (s) {
        CHECK(spx_tok_stream_push(s, 3 + 0xE4, &txt, &len, &e) == SPX_OK && len == 0, "held byte");
        CHECK(spx_tok_stream_flush(s, &txt, &len, &e) == SPX_OK && !strcmp(txt, "\xEF\xBF\xBD"),
              "flush of an incomplete character: '%s'", txt);
    }
    spx_tok_stream_free(s);
    int32_t bad[] = {1, 3 + 0xED, 22557, 3 + 0xFF, 3 + 0xE4, 3 + 0xBD, 3 + 0xA0, 28705};
    check_decode(t, "llama2 invalid bytes", bad, 8, 0, "<s>\xEF\xBF\xBD Hello\xEF\xBF\xBD\xE4\xBD\xA0 ");
    check_stream(t, "llama2 invalid bytes", bad, 8, 0);
    check_stream(t, "llama2 invalid bytes", bad, 8, 1);
    int32_t oob[] = {1, 32000};
    char *out = NULL;
    CHECK(spx_tok_decode(t, oob, 2, 0, &out, &len, &e) == SPX_ERR_RANGE && e.msg[0],
          "decode of id 32000 must fail");
    free(out);
    spx_tok_free(t);

    /* byte-level: an emoji spread over three tokens, and clean-up */
    t = load_dir("tokenizers/llama3");
    if (!t) return;
    int32_t *ids3 = NULL;
    size_t n3 = 0;
    const char *texts[] = {"emoji 😀 😂 🎉 👨\u200d👩\u200d👧", "x?.y ?? 0", "a ' s and  n't here .", "I 'm you 've , !"};
    for (size_t i = 0; i < 4; i++) {
        spx_err_clear(&e);
        CHECK(spx_tok_encode(t, texts[i], strlen(texts[i]), 0, &ids3, &n3, &e) == SPX_OK, "%s", e.msg);
        check_stream(t, "llama3 stream", ids3, n3, 0);
        free(ids3);
        ids3 = NULL;
    }
    CHECK(spx_tok_encode(t, "x?.y ?? 0", 9, 0, &ids3, &n3, &e) == SPX_OK, "%s", e.msg);
    check_decode(t, "llama3 clean-up", ids3, n3, 0, "x?.y?? 0");
    free(ids3);
    spx_tok_free(t);
}

/* ------------------------------------------------------------------ */
/* A handwritten tokenizer: Metaspace, lstrip/rstrip, single_word      */
/* ------------------------------------------------------------------ */

static const char SMALL_FMT[] =
    "{\"added_tokens\":[{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":8,\"content\":\"<x>\",\"lstrip\":true,\"rstrip\":true,"
    "\"single_word\":false,\"normalized\":false,\"special\":true},"
    "{\"id\":9,\"content\":\"bb\",\"lstrip\":false,\"rstrip\":false,\"single_word\":true,"
    "\"normalized\":false,\"special\":false}],"
    "\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"%s\",\"split\":false},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"%s\",\"split\":false},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":false,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"\\u2581\":2,\"a\":3,\"b\":4,\"\\u2581a\":5,\"ab\":6,\"\\u2581ab\":7,\"<x>\":8},"
    "\"merges\":[\"\\u2581 a\",[\"a\",\"b\"],\"\\u2581a b\"]}}";

static void small_case(spx_tokenizer *t, const char *text, const int32_t *want, size_t n,
                       const char *decoded) {
    check_encode(t, "small", text, strlen(text), 1, want, n);
    if (decoded) check_decode(t, "small", want, n, 1, decoded);
    check_stream(t, "small", want, n, 1);
    check_stream(t, "small", want, n, 0);
}

static void test_small(void) {
    char json[4096];
    spx_err e;
    spx_err_clear(&e);
    spx_tokenizer *t = NULL;
    snprintf(json, sizeof json, SMALL_FMT, "first", "first");
    CHECK(spx_tok_load(json, strlen(json), NULL, 0, "small", &t, &e) == SPX_OK, "small: %s", e.msg);
    if (!t) return;
    CHECK(spx_tok_bos(t) == 1 && spx_tok_eos(t) == -1, "small: bos/eos");
    CHECK(spx_tok_is_special(t, 8) && !spx_tok_is_special(t, 9) && !spx_tok_is_special(t, 3),
          "small: special flags");
    /* merges by rank: ▁ a b ▁ a b -> ▁a b ▁a b -> ▁ab ▁ab */
    small_case(t, "ab ab", (int32_t[]){1, 7, 7}, 3, "ab ab");
    /* lstrip/rstrip take the spaces; "b" after <x> gets no ▁ (scheme first) */
    small_case(t, "a <x> b", (int32_t[]){1, 5, 8, 4}, 4, "ab");
    /* single_word: "bb" only where no word character touches it */
    small_case(t, "bb abb", (int32_t[]){1, 9, 7, 4}, 4, "bb abb");
    /* unknown characters fuse into one <unk> */
    small_case(t, "zzz", (int32_t[]){1, 2, 0}, 3, NULL);
    small_case(t, "", (int32_t[]){1}, 1, "");
    spx_tok_free(t);
    t = NULL;
    snprintf(json, sizeof json, SMALL_FMT, "always", "always");
    CHECK(spx_tok_load(json, strlen(json), NULL, 0, "small", &t, &e) == SPX_OK, "small: %s", e.msg);
    if (!t) return;
    small_case(t, "a <x> b", (int32_t[]){1, 5, 8, 2, 4}, 5, "a b");
    spx_tok_free(t);
}

/* ------------------------------------------------------------------ */
/* Hostile inputs                                                      */
/* ------------------------------------------------------------------ */

static const char V[] = "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}";

typedef struct {
    const char *what;
    const char *json;
    spx_status code; /* 0: any error */
} bad_case;

static void test_hostile(void) {
    static char deep[300000], deep_seq[8192], buf[64][1024];
    /* 100,000 nested arrays inside "model" */
    size_t k = 0;
    k += (size_t)sprintf(deep + k, "{\"model\":");
    for (int i = 0; i < 100000; i++) deep[k++] = '[';
    for (int i = 0; i < 100000; i++) deep[k++] = ']';
    sprintf(deep + k, "}");
    /* 50 nested normalizer Sequences (valid JSON, too deep for us) */
    k = (size_t)sprintf(deep_seq, "{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"normalizer\":", V);
    for (int i = 0; i < 50; i++) k += (size_t)sprintf(deep_seq + k, "{\"type\":\"Sequence\",\"normalizers\":[");
    k += (size_t)sprintf(deep_seq + k, "{\"type\":\"NFC\"}");
    for (int i = 0; i < 50; i++) k += (size_t)sprintf(deep_seq + k, "]}");
    sprintf(deep_seq + k, "}");
    int b = 0;
#define BAD(fmt, ...) (snprintf(buf[b], sizeof buf[b], fmt, __VA_ARGS__), buf[b++])
    bad_case cases[] = {
        {"not JSON", "this is not json", SPX_ERR_FORMAT},
        {"empty", "", SPX_ERR_FORMAT},
        {"truncated", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":", SPX_ERR_FORMAT},
        {"top-level array", "[1,2,3]", SPX_ERR_FORMAT},
        {"no model", "{\"version\":\"1.0\"}", SPX_ERR_FORMAT},
        {"model is a number", "{\"model\":5}", SPX_ERR_FORMAT},
        {"WordPiece", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", SPX_ERR_UNSUPPORTED},
        {"Unigram", "{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}", SPX_ERR_UNSUPPORTED},
        {"type not a string", "{\"model\":{\"type\":7,\"vocab\":{},\"merges\":[]}}", SPX_ERR_FORMAT},
        {"vocab is an array", "{\"model\":{\"type\":\"BPE\",\"vocab\":[\"a\"],\"merges\":[]}}", SPX_ERR_FORMAT},
        {"no merges", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}", SPX_ERR_FORMAT},
        {"negative id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", SPX_ERR_RANGE},
        {"huge id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":3000000000},\"merges\":[]}}", SPX_ERR_RANGE},
        {"sparse ids", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":4000000},\"merges\":[]}}", SPX_ERR_RANGE},
        {"fractional id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1.5},\"merges\":[]}}", SPX_ERR_RANGE},
        {"id is a string", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"},\"merges\":[]}}", SPX_ERR_FORMAT},
        {"merges not an array", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":{}}}", V), SPX_ERR_FORMAT},
        {"merge of unknown token", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[\"a z\"]}}", V), SPX_ERR_FORMAT},
        {"merge with 3 parts", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[\"a b c\"]}}", V), SPX_ERR_FORMAT},
        {"merge result missing", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[\"b a\"]}}", V), SPX_ERR_FORMAT},
        {"merge is a number", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[5]}}", V), SPX_ERR_FORMAT},
        {"unk not in vocab", BAD("{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<u>\",%s,\"merges\":[]}}", V), SPX_ERR_FORMAT},
        {"dropout", BAD("{\"model\":{\"type\":\"BPE\",\"dropout\":0.1,%s,\"merges\":[]}}", V), SPX_ERR_UNSUPPORTED},
        {"added id out of range", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"added_tokens\":[{\"id\":99999999,\"content\":\"<x>\"}]}", V), SPX_ERR_RANGE},
        {"added id negative", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"added_tokens\":[{\"id\":-3,\"content\":\"<x>\"}]}", V), SPX_ERR_RANGE},
        {"added content number", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"added_tokens\":[{\"id\":3,\"content\":4}]}", V), SPX_ERR_FORMAT},
        {"added_tokens object", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"added_tokens\":{}}", V), SPX_ERR_FORMAT},
        {"flag not bool", BAD("{\"model\":{\"type\":\"BPE\",\"byte_fallback\":\"yes\",%s,\"merges\":[]}}", V), SPX_ERR_FORMAT},
        {"unknown normalizer", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"normalizer\":{\"type\":\"Precompiled\"}}", V), SPX_ERR_UNSUPPORTED},
        {"normalizer w/o type", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"normalizer\":{}}", V), SPX_ERR_FORMAT},
        {"bad regex", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\",\"invert\":false}}", V), SPX_ERR_UNSUPPORTED},
        {"unknown pre-tokenizer", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"}}", V), SPX_ERR_UNSUPPORTED},
        {"unknown decoder", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"decoder\":{\"type\":\"WordPiece\"}}", V), SPX_ERR_UNSUPPORTED},
        {"template id out of range", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"ids\":[77]}}}}", V), SPX_ERR_RANGE},
        {"template unknown name", BAD("{\"model\":{\"type\":\"BPE\",%s,\"merges\":[]},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<q>\"}}],\"special_tokens\":{}}}", V), SPX_ERR_FORMAT},
        {"deep nesting", deep, SPX_ERR_FORMAT},
        {"deep Sequence", deep_seq, SPX_ERR_FORMAT},
    };
#undef BAD
    size_t n = sizeof cases / sizeof cases[0], good = 0;
    for (size_t i = 0; i < n; i++) {
        spx_err e;
        spx_err_clear(&e);
        spx_tokenizer *t = (spx_tokenizer *)&e; /* poisoned: must be reset to NULL */
        spx_status st = spx_tok_load(cases[i].json, strlen(cases[i].json), NULL, 0, "bad.json", &t, &e);
        int ok = st != SPX_OK && t == NULL && e.msg[0] && (!cases[i].code || st == cases[i].code);
        CHECK(ok, "hostile '%s': status %s (%d), message '%s'", cases[i].what, spx_status_name(st),
              (int)st, e.msg);
        if (st == SPX_OK) spx_tok_free(t);
        good += ok;
    }
    /* a valid tokenizer.json with a broken tokenizer_config.json */
    {
        char json[256];
        snprintf(json, sizeof json, "{\"model\":{\"type\":\"BPE\",%s,\"merges\":[\"a b\"]}}", V);
        spx_err e;
        spx_err_clear(&e);
        spx_tokenizer *t = NULL;
        spx_status st = spx_tok_load(json, strlen(json), "{\"bos_token\":", 13, "cfg", &t, &e);
        CHECK(st == SPX_ERR_FORMAT && !t && strstr(e.msg, "tokenizer_config"), "bad config: %s", e.msg);
        good += st == SPX_ERR_FORMAT;
        n++;
        /* and the minimal one works */
        spx_err_clear(&e);
        st = spx_tok_load(json, strlen(json), NULL, 0, "min", &t, &e);
        CHECK(st == SPX_OK, "minimal tokenizer: %s", e.msg);
        int32_t *ids = NULL;
        size_t ni = 0;
        if (t) {
            CHECK(spx_tok_encode(t, "abba", 4, 1, &ids, &ni, &e) == SPX_OK && ni == 3 && ids[0] == 2 &&
                      ids[1] == 1 && ids[2] == 0,
                  "minimal encode");
            free(ids);
            /* invalid UTF-8 input text */
            const char *bad_text[] = {"a\xFF", "\xC3", "\xED\xA0\x80", "\xC0\xAF", "ab\xF4\x90\x80\x80"};
            for (size_t i = 0; i < 5; i++) {
                spx_err_clear(&e);
                ids = NULL;
                st = spx_tok_encode(t, bad_text[i], strlen(bad_text[i]), 1, &ids, &ni, &e);
                CHECK(st == SPX_ERR_ARG && !ids && strstr(e.msg, "UTF-8"), "invalid UTF-8 %zu: %s", i, e.msg);
                good += st == SPX_ERR_ARG;
                n++;
            }
        }
        spx_tok_free(t);
    }
    printf("hostile: %zu/%zu corrupt inputs rejected with a message\n", good, n);
}

int main(void) {
    test_reference("qwen3", -1, 151645);
    test_reference("llama3", 128000, 128001);
    test_reference("llama2", 1, 2);
    test_stories();
    test_docllama();
    test_stream_split();
    test_small();
    test_hostile();
    return tl_finish("test_tokenizer");
}
