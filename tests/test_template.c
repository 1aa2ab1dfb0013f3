/* test_template.c: the chat template engine against jinja2.
 *
 * Every template in tests/data/templates (NAME.jinja), plus the chat templates of
 * the Qwen3 and Llama-3 tokenizers in the shared fixtures, is rendered with
 * every conversation of tests/data/templates/conversations.json, and every
 * case of cases.json is rendered too; the same jobs go to
 * tests/data/templates/oracle.py (Python's jinja2 in transformers'
 * apply_chat_template environment) in one batch. Outputs must be equal byte
 * for byte; where jinja2 raises, the engine must fail too (with
 * raise_exception's text in its message when the template raised). Then
 * error cases with their expected status and LINE:COL, limits, and
 * rendering one template from two threads at once.
 *
 * No Python or no jinja2 is a failure (run `make setup`), never a skip. */
#include "testlib.h"

#include "spectra.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TDIR "tests/data/templates"

typedef struct tpl {
    char name[128];
    char *src;
    spx_template *t;
    spx_status parse_st;
    char parse_err[512];
    int agree, total, raised; /* raised: jinja2 raised too */
} tpl;

static tpl g_tpl[64];
static int g_ntpl;

static void add_template(const char *name, const char *src) {
    if (g_ntpl == 64) return;
    tpl *t = &g_tpl[g_ntpl++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->src = strdup(src);
    t->parse_st = spx_template_parse(src, strlen(src), name, &t->t, t->parse_err, sizeof t->parse_err);
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void load_templates(void) {
    DIR *d = opendir(TDIR);
    CHECK(d != NULL, "cannot open %s (run the test from the repository root)", TDIR);
    if (!d) return;
    char *names[64];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 64) {
        size_t l = strlen(de->d_name);
        if (l > 6 && !strcmp(de->d_name + l - 6, ".jinja")) names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_names);
    for (int i = 0; i < n; i++) {
        char path[512], name[128];
        snprintf(path, sizeof path, "%s/%s", TDIR, names[i]);
        snprintf(name, sizeof name, "%.*s", (int)(strlen(names[i]) - 6), names[i]);
        char *src = tl_read(path, NULL);
        CHECK(src != NULL, "cannot read %s", path);
        if (src) add_template(name, src);
        free(src);
        free(names[i]);
    }
    /* the fixtures' own templates (not copied into the repository) */
    const char *fix[] = {"qwen3", "llama3"};
    for (int i = 0; i < 2; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer_config.json", fix[i]);
        char *js = tl_read(tl_shared(rel), NULL);
        CHECK(js != NULL, "cannot read %s", tl_shared(rel));
        if (!js) continue;
        cJSON *j = cJSON_Parse(js);
        cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
        CHECK(cJSON_IsString(ct), "%s has no chat_template string", rel);
        if (cJSON_IsString(ct)) add_template(fix[i], ct->valuestring);
        cJSON_Delete(j);
        free(js);
    }
}

static const char *python(void) { return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3"; }

/* Prints where a and b first differ, with some context. */
static void show_diff(const char *a, size_t na, const char *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "    first difference at byte %zu (ours %zu bytes, jinja2 %zu bytes)\n", i, na, nb);
    for (int k = 0; k < 2; k++) {
        const char *s = k ? b : a;
        size_t n = k ? nb : na;
        fprintf(stderr, "    %s: \"", k ? "jinja2" : "ours  ");
        for (size_t j = from; j < n && j < i + 60; j++) {
            unsigned char c = (unsigned char)s[j];
            if (j == i) fprintf(stderr, "\033[7m");
            if (c == '\n') fprintf(stderr, "\\n");
            else if (c == '\t') fprintf(stderr, "\\t");
            else if (c < 0x20) fprintf(stderr, "\\x%02x", c);
            else fputc(c, stderr);
            if (j == i) fprintf(stderr, "\033[0m");
        }
        fprintf(stderr, "\"\n");
    }
}

typedef struct job {
    int tpl;              /* index into g_tpl, or -1: a case */
    const char *label;
    spx_template *own;    /* a case's template */
    char *ctx;
} job;

static void compare(const job *jb, const spx_template *t, const char *label, const cJSON *res) {
    char *out = NULL, err[1024];
    size_t n = 0;
    spx_status st = spx_template_render(t, jb->ctx, &out, &n, err, sizeof err);
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(res, "ok");
    bool ref_ok = cJSON_IsTrue(ok);
    bool agree = false;
    if (ref_ok && st == SPX_OK) {
        const cJSON *ro = cJSON_GetObjectItemCaseSensitive(res, "out");
        const char *ref = cJSON_IsString(ro) ? ro->valuestring : "";
        size_t rn = strlen(ref);
        agree = n == rn && !memcmp(out, ref, n);
        CHECK(agree, "%s: rendering differs from jinja2", label);
        if (!agree) show_diff(out, n, ref, rn);
    } else if (ref_ok) {
        CHECK(0, "%s: jinja2 renders it, ours fails: %s (%s)", label, err, spx_status_name(st));
    } else {
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(res, "kind");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(res, "msg");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(res, "type");
        const char *m = cJSON_IsString(msg) ? msg->valuestring : "";
        CHECK(st != SPX_OK, "%s: jinja2 raises %s: %s; ours renders %zu bytes", label,
              cJSON_IsString(type) ? type->valuestring : "?", m, n);
        if (st != SPX_OK && cJSON_IsString(kind) && !strcmp(kind->valuestring, "raise")) {
            agree = strstr(err, m) != NULL && st == SPX_ERR_ARG;
            CHECK(agree, "%s: the template raised '%s'; our error is: %s (%s)", label, m, err, spx_status_name(st));
        } else {
            agree = st != SPX_OK;
        }
        if (agree && getenv("SPECTRA_TEMPLATE_VERBOSE"))
            printf("  %s: both raise: jinja2 %s: %s | ours: %s\n", label, cJSON_IsString(type) ? type->valuestring : "?",
                   m, err);
    }
    free(out);
    if (jb->tpl >= 0) {
        g_tpl[jb->tpl].total++;
        g_tpl[jb->tpl].agree += agree;
        g_tpl[jb->tpl].raised += !ref_ok && agree;
    }
}

static void oracle_tests(void) {
    char *cj = tl_read(TDIR "/conversations.json", NULL), *kj = tl_read(TDIR "/cases.json", NULL);
    CHECK(cj && kj, "cannot read %s/conversations.json or cases.json", TDIR);
    cJSON *conv = cJSON_Parse(cj ? cj : ""), *cases = cJSON_Parse(kj ? kj : "");
    free(cj);
    free(kj);
    cJSON *tokens = cJSON_GetObjectItemCaseSensitive(conv, "tokens");
    cJSON *convs = cJSON_GetObjectItemCaseSensitive(conv, "conversations");
    CHECK(cJSON_IsArray(convs) && cJSON_IsArray(cases), "conversations.json / cases.json malformed");
    if (!cJSON_IsArray(convs) || !cJSON_IsArray(cases)) {
        cJSON_Delete(conv);
        cJSON_Delete(cases);
        return;
    }
    int nconv = cJSON_GetArraySize(convs), ncase = cJSON_GetArraySize(cases);
    int njobs = g_ntpl * nconv + ncase;
    job *jobs = calloc((size_t)njobs, sizeof *jobs);
    char **labels = calloc((size_t)njobs, sizeof *labels);
    cJSON *arr = cJSON_CreateArray();
    int k = 0;
    for (int i = 0; i < g_ntpl; i++) {
        cJSON *tok = cJSON_GetObjectItemCaseSensitive(tokens, g_tpl[i].name);
        if (!tok) tok = cJSON_GetObjectItemCaseSensitive(tokens, "default");
        for (int c = 0; c < nconv; c++, k++) {
            cJSON *cv = cJSON_GetArrayItem(convs, c);
            cJSON *ctx = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(cv, "context"), 1);
            for (cJSON *t = tok ? tok->child : NULL; t; t = t->next)
                cJSON_AddItemToObject(ctx, t->string, cJSON_Duplicate(t, 1));
            jobs[k].tpl = i;
            jobs[k].ctx = cJSON_PrintUnformatted(ctx);
            labels[k] = malloc(256);
            snprintf(labels[k], 256, "%.100s × %.100s", g_tpl[i].name,
                     cJSON_GetObjectItemCaseSensitive(cv, "name")->valuestring);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "template", g_tpl[i].src);
            cJSON_AddItemToObject(o, "context", ctx);
            cJSON_AddItemToArray(arr, o);
        }
    }
    for (int c = 0; c < ncase; c++, k++) {
        cJSON *cs = cJSON_GetArrayItem(cases, c);
        const char *src = cJSON_GetObjectItemCaseSensitive(cs, "template")->valuestring;
        cJSON *ctx = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(cs, "context"), 1);
        jobs[k].tpl = -1;
        jobs[k].ctx = cJSON_PrintUnformatted(ctx);
        labels[k] = malloc(256);
        snprintf(labels[k], 256, "case %.200s", cJSON_GetObjectItemCaseSensitive(cs, "name")->valuestring);
        char err[1024];
        spx_status st = spx_template_parse(src, strlen(src), labels[k], &jobs[k].own, err, sizeof err);
        CHECK(st == SPX_OK, "%s: parse failed: %s", labels[k], err);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "template", src);
        cJSON_AddItemToObject(o, "context", ctx);
        cJSON_AddItemToArray(arr, o);
    }
    char jobs_path[512], res_path[512], cmd[2048];
    snprintf(jobs_path, sizeof jobs_path, "%s/jobs.json", tl_tmpdir());
    snprintf(res_path, sizeof res_path, "%s/results.json", tl_tmpdir());
    char *text = cJSON_PrintUnformatted(arr);
    CHECK(tl_write(jobs_path, text, strlen(text)) == 0, "cannot write %s", jobs_path);
    free(text);
    cJSON_Delete(arr);
    snprintf(cmd, sizeof cmd, "%s %s/oracle.py %s %s", python(), TDIR, jobs_path, res_path);
    int rc = system(cmd);
    CHECK(rc == 0, "the jinja2 oracle failed (%s, status %d)", cmd, rc);
    char *rj = rc == 0 ? tl_read(res_path, NULL) : NULL;
    cJSON *res = rj ? cJSON_Parse(rj) : NULL;
    free(rj);
    CHECK(cJSON_GetArraySize(res) == njobs, "the oracle returned %d results for %d jobs", cJSON_GetArraySize(res), njobs);
    for (int i = 0; res && i < njobs && i < cJSON_GetArraySize(res); i++) {
        const cJSON *r = cJSON_GetArrayItem(res, i);
        if (jobs[i].tpl >= 0) {
            tpl *t = &g_tpl[jobs[i].tpl];
            if (!t->t) {
                t->total++;
                CHECK(0, "%s: parse failed: %s (%s)", labels[i], t->parse_err, spx_status_name(t->parse_st));
                continue;
            }
            compare(&jobs[i], t->t, labels[i], r);
        } else if (jobs[i].own) {
            compare(&jobs[i], jobs[i].own, labels[i], r);
        }
    }
    cJSON_Delete(res);
    for (int i = 0; i < g_ntpl; i++)
        printf("  %-46s %2d/%2d conversations agree with jinja2 (%d of them raise in both)\n", g_tpl[i].name,
               g_tpl[i].agree, g_tpl[i].total, g_tpl[i].raised);
    for (int i = 0; i < njobs; i++) {
        free(jobs[i].ctx);
        free(labels[i]);
        spx_template_free(jobs[i].own);
    }
    free(jobs);
    free(labels);
    cJSON_Delete(conv);
    cJSON_Delete(cases);
}

/* ---- errors and positions ----------------------------------------------- */

typedef struct ecase {
    const char *src, *ctx;
    spx_status st;
    const char *where; /* "NAME:LINE:COL" prefix expected */
    const char *text;  /* a part of the message */
} ecase;

static const ecase ECASES[] = {
    {"hello {{ x|frobnicate }}", NULL, SPX_ERR_UNSUPPORTED, "t:1:12:", "unsupported filter 'frobnicate'"},
    {"a\nbb {{ x is frobnicated }}", NULL, SPX_ERR_UNSUPPORTED, "t:2:12:", "unsupported test 'frobnicated'"},
    {"line1\n  {% include 'x.jinja' %}", NULL, SPX_ERR_UNSUPPORTED, "t:2:6:", "include"},
    {"{% extends 'base' %}", NULL, SPX_ERR_UNSUPPORTED, "t:1:4:", "extends"},
    {"x\n\n{% call m() %}{% endcall %}", NULL, SPX_ERR_UNSUPPORTED, "t:3:4:", "call"},
    {"{% filter upper %}x{% endfilter %}", NULL, SPX_ERR_UNSUPPORTED, "t:1:4:", "filter"},
    {"{% with a = 1 %}{% endwith %}", NULL, SPX_ERR_UNSUPPORTED, "t:1:4:", "with"},
    {"{% frob %}", NULL, SPX_ERR_UNSUPPORTED, "t:1:4:", "frob"},
    {"{% for x in y recursive %}{% endfor %}", NULL, SPX_ERR_UNSUPPORTED, "t:1:15:", "recursive"},
    {"é{{ 'x'.format(1) }}", NULL, SPX_ERR_UNSUPPORTED, "t:1:15:", "format"},
    {"{{ cycler(1) }}", NULL, SPX_ERR_UNSUPPORTED, "t:1:10:", "cycler"},
    {"{{ '%s' % 1 }}", NULL, SPX_ERR_UNSUPPORTED, "t:1:9:", "formatting"},
    {"{{ 1 +* 2 }}", NULL, SPX_ERR_FORMAT, "t:1:7:", "syntax error"},
    {"ab\n  {{ x ", NULL, SPX_ERR_FORMAT, "t:2:3:", "'}}'"},
    {"{% if x %}\nunclosed", NULL, SPX_ERR_FORMAT, "t:1:1:", "endif"},
    {"{% for x in y %}{% endif %}", NULL, SPX_ERR_FORMAT, "t:1:20:", "endif"},
    {"{# open comment", NULL, SPX_ERR_FORMAT, "t:1:1:", "comment"},
    {"{{ 'unterminated }}", NULL, SPX_ERR_FORMAT, "t:1:4:", "string"},
    {"{% break %}", NULL, SPX_ERR_FORMAT, "t:1:4:", "outside"},
    {"{{ a $ b }}", NULL, SPX_ERR_FORMAT, "t:1:6:", "'$'"},
    {"{% macro m(a=1, b) %}{% endmacro %}", NULL, SPX_ERR_FORMAT, "t:1:17:", "default"},
    {"x{{ raise_exception('bad role') }}", NULL, SPX_ERR_ARG, "t:1:20:", "bad role"},
    {"\n{{ nope.attr }}", NULL, SPX_ERR_ARG, "t:2:8:", "'nope' is undefined"},
    {"{{ d.a.b }}", "{\"d\": {}}", SPX_ERR_ARG, "t:1:7:", "has no attribute 'a'"},
    {"{{ 1 / 0 }}", NULL, SPX_ERR_ARG, "t:1:6:", "division by zero"},
    {"{% set l = [] %}{{ l.append(1) }}", NULL, SPX_ERR_ARG, "t:1:28:", "unsafe"},
    {"{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}", NULL, SPX_ERR_RANGE, "t:1:21:", "nested deeper"},
    {"{{ x }}", "[1, 2]", SPX_ERR_ARG, "t:", "expected a JSON object"},
    {"{{ x }}", "{\"x\": ", SPX_ERR_ARG, "t:", "invalid JSON"},
    {"{{ range(200000)|list }}", NULL, SPX_ERR_RANGE, "t:1:9:", "MAX_RANGE"},
    {"{{ 9223372036854775807 + 1 }}", NULL, SPX_ERR_UNSUPPORTED, "t:1:24:", "64 bits"},
};

static void error_tests(void) {
    for (size_t i = 0; i < sizeof ECASES / sizeof *ECASES; i++) {
        const ecase *c = &ECASES[i];
        spx_template *t = NULL;
        char err[1024] = "";
        spx_status st = spx_template_parse(c->src, strlen(c->src), "t", &t, err, sizeof err);
        char *out = NULL;
        if (st == SPX_OK) {
            st = spx_template_render(t, c->ctx, &out, NULL, err, sizeof err);
            CHECK(st != SPX_OK || out, "case %zu: no output", i);
        } else {
            CHECK(t == NULL, "case %zu: a failed parse returned a template", i);
        }
        CHECK(st == c->st, "case %zu '%s': status %s, expected %s (%s)", i, c->src, spx_status_name(st),
              spx_status_name(c->st), err);
        CHECK(!strncmp(err, c->where, strlen(c->where)), "case %zu '%s': message '%s' does not start with '%s'", i,
              c->src, err, c->where);
        CHECK(strstr(err, c->text) != NULL, "case %zu '%s': message '%s' does not mention '%s'", i, c->src, err, c->text);
        free(out);
        spx_template_free(t);
    }
}

/* ---- limits, bytes, API, threads ---------------------------------------- */

typedef struct thr {
    const spx_template *t;
    const char *ctx;
    char *out;
    spx_status st;
} thr;

static void *render_thread(void *p) {
    thr *a = p;
    for (int i = 0; i < 20 && a->st == SPX_OK; i++) {
        free(a->out);
        a->out = NULL;
        a->st = spx_template_render(a->t, a->ctx, &a->out, NULL, NULL, 0);
    }
    return NULL;
}

static void misc_tests(void) {
    char err[512];
    spx_template *t = NULL;
    char *out = NULL;
    size_t n = 0;
    /* bytes that are not UTF-8 pass through unchanged */
    const char bad[] = "a\xff\xfe{{ 'b\xc3' }}{{ s }}";
    CHECK(spx_template_parse(bad, sizeof bad - 1, "bytes", &t, err, sizeof err) == SPX_OK, "%s", err);
    CHECK(spx_template_render(t, "{\"s\": \"c\xe2\x82\"}", &out, &n, err, sizeof err) == SPX_OK, "%s", err);
    CHECK(out && n == 8 && !memcmp(out, "a\xff\xfe" "b\xc3" "c\xe2\x82", 8), "bad UTF-8 changed: %zu bytes", n);
    free(out);
    spx_template_free(t);
    /* the output cap */
    const char *big = "{% set s = 'x' * 1000000 %}{% for i in range(70) %}{{ s }}{% endfor %}";
    CHECK(spx_template_parse(big, strlen(big), "big", &t, err, sizeof err) == SPX_OK, "%s", err);
    out = NULL;
    spx_status st = spx_template_render(t, NULL, &out, NULL, err, sizeof err);
    CHECK(st == SPX_ERR_RANGE && strstr(err, "MiB"), "64 MiB cap: %s (%s)", err, spx_status_name(st));
    CHECK(out == NULL, "a failed render left output");
    spx_template_free(t);
    /* a big JSON object: building and reading it stays linear */
    {
        size_t cap = 200000 * 24 + 64, m = 0;
        char *js = malloc(cap);
        m += (size_t)snprintf(js + m, cap - m, "{\"d\": {");
        for (int i = 0; i < 200000; i++) m += (size_t)snprintf(js + m, cap - m, "%s\"k%d\": %d", i ? ", " : "", i, i);
        m += (size_t)snprintf(js + m, cap - m, ", \"k7\": \"dup\"}}");
        const char *src = "{{ d|length }} {{ d.k199999 }} {{ d['k7'] }} {{ d.k0 }}";
        CHECK(spx_template_parse(src, strlen(src), "bigdict", &t, err, sizeof err) == SPX_OK, "%s", err);
        out = NULL;
        CHECK(spx_template_render(t, js, &out, NULL, err, sizeof err) == SPX_OK, "%s", err);
        CHECK(out && !strcmp(out, "200000 199999 dup 0"), "big dict: '%s'", out ? out : "");
        free(out);
        free(js);
        spx_template_free(t);
    }
    /* deep nesting at parse time */
    char deep[1400];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 600; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 600; i++) deep[k++] = ')';
    k += (size_t)snprintf(deep + k, sizeof deep - k, " }}");
    CHECK(spx_template_parse(deep, k, "deep", &t, err, sizeof err) == SPX_ERR_RANGE, "deep nesting: %s", err);
    /* API arguments */
    CHECK(spx_template_parse(NULL, 3, "x", &t, err, sizeof err) == SPX_ERR_ARG, "NULL source accepted");
    CHECK(spx_template_render(NULL, NULL, &out, NULL, err, sizeof err) == SPX_ERR_ARG, "NULL template accepted");
    spx_template_free(NULL);
    CHECK(spx_template_parse("", 0, NULL, &t, err, sizeof err) == SPX_OK, "%s", err);
    CHECK(spx_template_render(t, "{}", &out, &n, err, sizeof err) == SPX_OK && out && n == 0 && !*out, "empty: %s", err);
    free(out);
    spx_template_free(t);
    /* the engine's own fallback template */
    const char *cm = SPX_CHATML_TEMPLATE;
    CHECK(spx_template_parse(cm, strlen(cm), "chatml", &t, err, sizeof err) == SPX_OK, "%s", err);
    CHECK(spx_template_render(t, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"add_generation_prompt\": true}",
                              &out, NULL, err, sizeof err) == SPX_OK, "%s", err);
    CHECK(out && !strcmp(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), "chatml: '%s'", out ? out : "");
    free(out);
    /* one template, two threads */
    const char *ctx = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}], "
                      "\"add_generation_prompt\": false}";
    thr a[2] = {{t, ctx, NULL, SPX_OK}, {t, ctx, NULL, SPX_OK}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, render_thread, &a[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK(a[0].st == SPX_OK && a[1].st == SPX_OK && a[0].out && a[1].out && !strcmp(a[0].out, a[1].out),
          "threads disagree");
    free(a[0].out);
    free(a[1].out);
    spx_template_free(t);
}

int main(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s -c 'import jinja2' >/dev/null 2>&1", python());
    int have = system(cmd) == 0;
    CHECK(have, "Python 3 with jinja2 is needed as the reference (%s): run `make setup` (installs python3-jinja2)",
          python());
    load_templates();
    if (have) oracle_tests();
    error_tests();
    misc_tests();
    for (int i = 0; i < g_ntpl; i++) {
        free(g_tpl[i].src);
        spx_template_free(g_tpl[i].t);
    }
    return tl_finish("test_template");
}
