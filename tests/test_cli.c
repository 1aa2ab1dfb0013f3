/* test_cli.c: the `spectra` command line end to end: exit codes, one-line
 * errors naming the file, and the outputs scripts rely on (ARCHITECTURE.md
 * "Contracts"). Runs the binary named by $SPECTRA_BIN (tests/run.sh). */
#define _POSIX_C_SOURCE 200809L
#include "engine/probe.h"
#include "testlib.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <math.h>
#include <unistd.h>

/* Runs a shell command; returns its exit status and output (stdout and
 * stderr together, malloc'd). */
static int sh(const char *cmd, char **out) {
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while (p && (k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = p ? pclose(p) : -1;
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *bin(void) {
    const char *b = getenv("SPECTRA_BIN");
    return b && *b ? b : "build/spectra";
}

/* the sanitizer pass (tests/run.sh quick): the model-heavy cases run on
 * smaller models (tune_neuron_cases, eval_fixture) */
static int quick(void) { return getenv("SPECTRA_TEST_QUICK") != NULL; }

static void expect(const char *args, int want_rc, const char *want_text) {
    char cmd[3000], *out;
    snprintf(cmd, sizeof cmd, "%s %s", bin(), args);
    int rc = sh(cmd, &out);
    CHECK(rc == want_rc, "`spectra %s` exited %d, expected %d; output:\n%s", args, rc, want_rc, out);
    if (want_text) CHECK(strstr(out, want_text) != NULL, "`spectra %s` output lacks '%s':\n%s", args, want_text, out);
    free(out);
}

/* Two files in tmp generate the same (non-empty) greedy tokens on the cpu. */
static void same_tokens(const char *tmp, const char *f1, const char *f2) {
    char *o[2] = {NULL, NULL}, cmd[3000];
    int rc[2];
    const char *f[2] = {f1, f2};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s run -m %s/%s --ids 1,2,3 -n 12 --temp 0 -q --backend cpu", bin(), tmp, f[i]);
        rc[i] = sh(cmd, &o[i]);
    }
    CHECK(rc[0] == 0 && rc[1] == 0 && strlen(o[0]) > 0 && strcmp(o[0], o[1]) == 0,
          "%s and %s generate differently:\n%s\n%s", f1, f2, o[0], o[1]);
    free(o[0]);
    free(o[1]);
}

/* A JSON number array field "k": [a, b, c, d] of a one-object output. */
static int json_k(const char *out, long long k[4]) {
    const char *at = strchr(out, '{');
    cJSON *j = at ? cJSON_Parse(at) : NULL;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "k");
    int ok = cJSON_GetArraySize(a) == 4;
    for (int i = 0; ok && i < 4; i++) k[i] = (long long)cJSON_GetArrayItem(a, i)->valuedouble;
    cJSON_Delete(j);
    return ok;
}

/* `spectra kl ... --json` (cmd) scores the KL tune recorded (want), to its printed digits. */
static void expect_tune_kl(const char *what, const char *cmd, double want) {
    char *out;
    const int rc = sh(cmd, &out);
    const char *km = strstr(out, "\"kl_mean\": ");
    CHECK(rc == 0 && km && fabs(atof(km + 11) - want) < 2e-6, "%s %s, tune's %.6f:\n%s", what, km ? km + 11 : "?", want,
          out);
    free(out);
}

/* tune's MLP mode (docllama-58m: a gated MLP with neuron bundles and a
 * tokenizer): neuron mode searched, recorded, printed by inspect, applied
 * by run and kl (whose KL is the one tune recorded), overridden by an
 * explicit --refine-mlp. In the sanitizer pass (quick), where docllama-58m
 * took two minutes here, a folder of tiny-qwen3's weights (a gated MLP
 * whose widths take bundles) with stories260K's tokenizer (the same 512
 * ids) on tune_cases' story.txt: the same commands and checks. */
static void tune_neuron_cases(const char *tmp) {
    char a[3000], c[3200], *out, src[600], txt[700];
    const char *dl = src;
    if (quick()) {
        snprintf(src, sizeof src, "%s/qtok", tmp);
        snprintf(txt, sizeof txt, "%s/story.txt", tmp);
        snprintf(c, sizeof c, "mkdir -p %s && cp %s/config.json %s/model.safetensors %s/tokenizer.json "
                 "%s/tokenizer_config.json %s/", src, tl_shared("models/tiny-qwen3"), tl_shared("models/tiny-qwen3"),
                 tl_shared("models/stories260K"), tl_shared("models/stories260K"), src);
        CHECK(system(c) == 0, "%s", c);
    } else {
        snprintf(src, sizeof src, "%s", tl_shared("models/docllama-58m"));
        snprintf(txt, sizeof txt, "%s/eval.txt", src);
    }
    snprintf(a, sizeof a, "compress -m %s -o %s/dl.trdc --refine %s/dl.refine --refine-bundles -q", dl, tmp, tmp);
    expect(a, 0, "neuron bundles of");
    const char *quick = "--ctx 32 --chunks 2 --tokens 8 --rounds 1 --max-trials 2 --ladder 0,4,16 --threads 2";
    snprintf(c, sizeof c, "%s tune -m %s/dl.trdc --refine %s/dl.refine --ref %s -f %s %s --budget 60%% --json",
             bin(), tmp, tmp, dl, txt, quick);
    int rc = sh(c, &out); /* both modes: which wins is this machine's timing */
    CHECK(rc == 0 && strstr(out, "tune: 2 modes (MLP channel and neuron)") && strstr(out, "(neuron)") &&
              strstr(out, "\"mlp\": \"neuron\""),
          "%s: %d\n%s", c, rc, out);
    free(out);
    snprintf(c, sizeof c, "%s tune -m %s/dl.trdc --refine %s/dl.refine --ref %s -f %s %s --budget 70%% --json "
             "--search-mlp neuron", bin(), tmp, tmp, dl, txt, quick);
    rc = sh(c, &out);
    const char *kn_at = strstr(out, "\"kn\": ");
    const long long kn = kn_at ? atoll(kn_at + 6) : -1;
    const char *kl_at = strstr(out, "\"kl\": ");
    const double tune_kl = kl_at ? atof(kl_at + 6) : -1;
    CHECK(rc == 0 && strstr(out, "tune: 1 mode (MLP neuron)") && strstr(out, "\"k\": [") &&
              strstr(out, "\"mlp\": \"neuron\", \"kn\": ") && kn >= 0,
          "%s: %d\n%s", c, rc, out);
    free(out);
    char want[160];
    snprintf(a, sizeof a, "inspect %s/dl.refine", tmp);
    snprintf(want, sizeof want, "MLP neuron kn %lld", kn);
    expect(a, 0, want);
    snprintf(a, sizeof a, "run -m %s/dl.trdc --refine %s/dl.refine --refine-tuned 70%% --ids 1,2 -n 2 --threads 2", tmp,
             tmp);
    snprintf(want, sizeof want, "MLP neuron-wise kn %lld", kn);
    expect(a, 0, want);
    snprintf(c, sizeof c, "%s %s --refine-mlp channel", bin(), a);
    rc = sh(c, &out);
    CHECK(rc == 0 && strstr(out, "tuned budgets") && !strstr(out, "neuron-wise"), "--refine-mlp channel:\n%s", out);
    free(out);
    snprintf(c, sizeof c, "%s kl -m %s/dl.trdc --refine %s/dl.refine --refine-tuned 70%% --ref %s -f %s --ctx 32 "
             "--chunks 2 --threads 2 --json", bin(), tmp, tmp, dl, txt);
    expect_tune_kl("neuron kl", c, tune_kl);
}

static void tune_cases(const char *tmp) {
    char a[3000], c[3200], *out;
    const char *st = tl_shared("models/stories260K");
    snprintf(a, sizeof a, "compress -m %s -o %s/st.trdc --refine %s/st.refine -q", st, tmp, tmp);
    expect(a, 0, "residuals");
    snprintf(a, sizeof a, "%s/story.txt", tmp);
    FILE *f = fopen(a, "w");
    CHECK(f != NULL, "%s", a);
    for (int i = 0; f && i < 40; i++) fprintf(f, "Once upon a time, there was a little girl named Lily. She liked to play. ");
    if (f) fclose(f);
    expect("tune --help", 0, "--budget B");
    const char *quick = "--ctx 32 --chunks 2 --tokens 8 --rounds 1 --max-trials 2 --ladder 0,4,16 --threads 2";
    snprintf(c, sizeof c, "%s tune -m %s/st.trdc --refine %s/st.refine --ref %s -f %s/story.txt %s --budget 50%% --json",
             bin(), tmp, tmp, st, tmp, quick);
    int rc = sh(c, &out);
    long long k[4] = {-1, -1, -1, -1};
    CHECK(rc == 0 && json_k(out, k) && strstr(out, "\"written\": true"), "%s: %d\n%s", c, rc, out);
    /* no bundles and the cpu: one mode, channel-wise, no schedule */
    CHECK(strstr(out, "\"mlp\": \"channel\", \"kn\": 0, \"cuda_blocks\": 0, \"cuda_lag\": 0, \"cuda_lead\": 0") &&
              strstr(out, "tune: 1 mode (MLP channel)"),
          "tune's mode fields:\n%s", out);
    double tune_kl = -1;
    const char *kl_at = strstr(out, "\"kl\": ");
    if (kl_at) tune_kl = atof(kl_at + 6);
    free(out);
    snprintf(a, sizeof a, "inspect %s/st.refine", tmp);
    expect(a, 0, "tuned refinement budgets");
    expect(a, 0, "budget 50%");
    snprintf(a, sizeof a, "inspect --json %s/st.refine", tmp);
    expect(a, 0, "\"tuned\":");
    snprintf(a, sizeof a, "verify %s/st.refine", tmp);
    expect(a, 0, "OK");
    /* run takes the tuned budgets (saying so), --refine-k overrides them */
    char want[160];
    snprintf(want, sizeof want, "k per 1024 q/k/v %lld o %lld gate/up %lld down %lld", k[0], k[1], k[2], k[3]);
    snprintf(a, sizeof a, "run -m %s/st.trdc --refine %s/st.refine --ids 1,2,3 -n 4 --temp 0 --threads 2", tmp, tmp);
    expect(a, 0, "refine: tuned budgets for cpu/");
    expect(a, 0, want);
    snprintf(a, sizeof a, "run -m %s/st.trdc --refine %s/st.refine --refine-k 3 --ids 1,2,3 -n 4 --temp 0 --threads 2",
             tmp, tmp);
    expect(a, 0, "k per 1024 q/k/v 3 o 3 gate/up 3 down 3");
    snprintf(c, sizeof c, "%s %s", bin(), a);
    rc = sh(c, &out);
    CHECK(rc == 0 && !strstr(out, "tuned budgets"), "--refine-k still says tuned:\n%s", out);
    free(out);
    snprintf(a, sizeof a, "run -m %s/st.trdc --refine %s/st.refine --refine-tuned off --ids 1 -n 2 --threads 2", tmp, tmp);
    expect(a, 0, "k per 1024 q/k/v 32 o 32 gate/up 32 down 32");
    snprintf(a, sizeof a, "run -m %s/st.trdc --refine %s/st.refine --refine-tuned 10%% --ids 1 -n 2 --threads 2", tmp, tmp);
    expect(a, 1, "no budgets tuned at or below 10%");
    snprintf(a, sizeof a, "bench -m %s/st.trdc --refine %s/st.refine -p 0 -n 4 -r 1 --threads 2 --json", tmp, tmp);
    expect(a, 0, "\"refine_tuned\": {\"budget\": 0.5,");
    /* another placement of the tier is another platform: no entry, the default */
    snprintf(a, sizeof a, "run -m %s/st.trdc --refine %s/st.refine --refine-cache 1 --ids 1 -n 2 --threads 2", tmp, tmp);
    expect(a, 0, "q/k/v 32 o 32");
    /* kl with the tuned budgets on the tuning windows gives the KL tune recorded */
    snprintf(c, sizeof c, "%s kl -m %s/st.trdc --refine %s/st.refine --ref %s -f %s/story.txt --ctx 32 --chunks 2 "
             "--threads 2 --json", bin(), tmp, tmp, st, tmp);
    expect_tune_kl("kl", c, tune_kl);
    /* --score-last: tune's KL is over the last 8 positions of each window, fed as kl feeds them */
    snprintf(c, sizeof c, "%s tune -m %s/st.trdc --refine %s/st.refine --ref %s -f %s/story.txt %s --budget 50%% --json "
             "--no-write --score-last 8", bin(), tmp, tmp, st, tmp, quick);
    rc = sh(c, &out);
    long long kl8[4] = {-1, -1, -1, -1};
    CHECK(rc == 0 && json_k(out, kl8) && strstr(out, "2 windows of 32 from window 0, last 8 scored one token at a time"),
          "%s: %d\n%s", c, rc, out);
    kl_at = strstr(out, "\"kl\": ");
    const double tune_kl8 = kl_at ? atof(kl_at + 6) : -1;
    free(out);
    snprintf(c, sizeof c, "%s kl -m %s/st.trdc --refine %s/st.refine --refine-k %lld,%lld,%lld,%lld --ref %s -f "
             "%s/story.txt --ctx 32 --chunks 2 --score-last 8 --threads 2 --json", bin(), tmp, tmp, kl8[0], kl8[1],
             kl8[2], kl8[3], st, tmp);
    expect_tune_kl("kl --score-last 8", c, tune_kl8);
    /* refusals: one message, non-zero exit */
    const char *bad[][2] = {{"--budget 0", "--budget '0'"}, {"--budget 100%", "below 100%"},
                            {"--budget 5", "5% is 0.05"}, {"--budget fast", "such as 5%"},
                            {"--refine-k 8", "what tune chooses"}, {"--refine-lag 1", "what tune chooses"},
                            {"--refine-mlp neuron", "--search-mlp"}, {"--search-lag 0.5", "cuda schedule"},
                            {"--search-blocks 8,16", "cuda schedule"}, {"--search-lag 3", "distinct distances"},
                            {"--search-mlp rows", "channel, neuron or both"}, {"--backend metal", "cpu or cuda"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(a, sizeof a, "tune -m %s/st.trdc --refine %s/st.refine --ref %s -f %s/story.txt %s", tmp, tmp, st, tmp,
                 bad[i][0]);
        expect(a, 2, bad[i][1]);
    }
    snprintf(a, sizeof a, "tune -m %s/st.trdc --refine %s/st.refine --ref %s -f %s/story.txt %s --search-mlp neuron", tmp,
             tmp, st, tmp, quick);
    expect(a, 1, "no neuron bundles");
    snprintf(a, sizeof a, "tune -m %s/st.trdc --refine %s/st.refine --ref %s", tmp, tmp, st);
    expect(a, 2, "-f TEXT are required");
    snprintf(a, sizeof a, "tune -m %s/st.trdc --refine %s/st.refine -f %s/story.txt", tmp, tmp, tmp);
    expect(a, 2, "--ref SRC");
    snprintf(a, sizeof a, "tune -m %s/st.trdc --refine %s/q.refine --ref %s -f %s/story.txt %s", tmp, tmp, st, tmp, quick);
    expect(a, 1, "q.refine");
    snprintf(a, sizeof a, "tune -m %s/st.trdc --refine %s/st.trdc --ref %s -f %s/story.txt %s", tmp, tmp, st, tmp, quick);
    expect(a, 1, "not a .refine file");
    snprintf(a, sizeof a, "tune -m %s/st.trdc --refine /no/such/dir/x.refine --ref %s -f %s/story.txt", tmp, st, tmp);
    expect(a, 1, "/no/such/dir/x.refine");
    if (geteuid() != 0) { /* root writes into a read-only directory anyway */
        snprintf(c, sizeof c, "mkdir -p %s/ro && cp %s/st.refine %s/ro/ && chmod 555 %s/ro", tmp, tmp, tmp, tmp);
        CHECK(system(c) == 0, "%s", c);
        snprintf(a, sizeof a, "tune -m %s/st.trdc --refine %s/ro/st.refine --ref %s -f %s/story.txt %s", tmp, tmp, st,
                 tmp, quick);
        expect(a, 1, "directory must be writable");
        snprintf(c, sizeof c, "chmod 755 %s/ro", tmp);
        CHECK(system(c) == 0, "%s", c);
    }
}

/* A number member of the first JSON object in out (NAN when absent); with
 * models: of its "models"[0]. */
static double json_num(const char *out, const char *key, int models) {
    const char *at = strchr(out, '{');
    cJSON *j = at ? cJSON_Parse(at) : NULL;
    const cJSON *o = models ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "models"), 0) : j;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    const double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    cJSON_Delete(j);
    return x;
}

/* The model and text of the low-bit KV and --score-last cases, and their
 * sizes. Normally docllama-long (head_dim 64, 8,192 positions) on its
 * eval.txt. In the sanitizer pass (SPECTRA_TEST_QUICK), where one
 * docllama-long token costs about 0.1 s and these cases took most of the
 * pass, stories260K (head_dim 8, so KV groups of 8; 512 positions) on
 * tune_cases' story.txt (about 720 tokens, one line): the same commands
 * and checks, on a model a hundred times smaller. */
typedef struct {
    char model[600], text[640];
    const char *group;         /* the --kv-group the low-bit types need on this model ("" = the default) */
    const char *bad_group[2];  /* a --kv-group this model refuses, and the message */
    int ctx, last;             /* the --score-last window and its N */
} eval_fixture;

static eval_fixture eval_fixture_get(const char *tmp) {
    eval_fixture f;
    const char *m = quick() ? "models/stories260K" : "models/docllama-long";
    snprintf(f.model, sizeof f.model, "%s", tl_shared(m));
    if (quick()) snprintf(f.text, sizeof f.text, "%s/story.txt", tmp);
    else snprintf(f.text, sizeof f.text, "%s/eval.txt", f.model);
    f.group = quick() ? "--kv-group 8" : "";
    f.bad_group[0] = quick() ? "--kv-group 12" : "--kv-group 48";
    f.bad_group[1] = quick() ? "--kv-group 12 must be at least 8 and divide head_dim 8"
                             : "--kv-group 48 must be at least 8 and divide head_dim 64";
    f.ctx = quick() ? 512 : 1024;
    f.last = f.ctx / 4;
    return f;
}

/* The low-bit KV flags (docs/kv.md) on eval_fixture's model: perplexity with
 * k2v2 + refinement on every group at +8 bits comes within 0.5 % of f16's
 * PPL while k2v2 alone is further off (the flags reach the cache); the
 * record names the settings; flags that do not apply, and bad values, are
 * usage errors or a clear library message. */
static void kv_lowbit_cases(const char *tmp) {
    const eval_fixture fx = eval_fixture_get(tmp);
    const char *dl = fx.model, *txt = fx.text, *g = fx.group;
    char a[3000], *o[4] = {NULL, NULL, NULL, NULL}, filetier[700], k2[64], k2r[128];
    /* the 4th: the 3rd with its records in a file tier (wait policy, a 1 MiB cache): the same PPL exactly */
    snprintf(k2, sizeof k2, "--kv k2v2 %s", g);
    snprintf(k2r, sizeof k2r, "%s --kv-refine 8 --kv-refine-frac 1", k2);
    snprintf(filetier, sizeof filetier, "%s --kv-tier %s --kv-tier-miss wait --kv-tier-cache 1", k2r, tmp);
    const char *const kv[4] = {"--kv f16", k2, k2r, filetier};
    for (int k = 0; k < 4; k++) {
        char cmd[2000];
        snprintf(cmd, sizeof cmd, "%s perplexity -m %s -f %s --ctx 512 --chunks 1 --threads 2 %s --json 2>&1", bin(), dl,
                 txt, kv[k]);
        CHECK(sh(cmd, &o[k]) == 0, "`%s` failed:\n%s", cmd, o[k]);
    }
    double p16 = json_num(o[0], "ppl", 0), p2 = json_num(o[1], "ppl", 0), p2r = json_num(o[2], "ppl", 0);
    CHECK(fabs(p2r - p16) < 0.005 * p16 && fabs(p2 - p16) > fabs(p2r - p16), "PPL f16 %g, k2v2 %g, k2v2 +8 all %g", p16,
          p2, p2r);
    CHECK(o[2] && strstr(o[2], "refine +8/+8 bits, 1 of 4-token groups"), "no KV record in:\n%s", o[2]);
    CHECK(json_num(o[3], "ppl", 0) == p2r, "PPL with the file tier %g, with host RAM %g", json_num(o[3], "ppl", 0), p2r);
    CHECK(o[3] && strstr(o[3], "in a file (") && strstr(o[3], "1 MiB RAM cache (wait for misses"),
          "no file-tier KV record in:\n%s", o[3]);
    for (int k = 0; k < 4; k++) free(o[k]);
    snprintf(a, sizeof a, "perplexity -m %s -f %s --ctx 64 --chunks 1 %s --kv-tier /nonexistent/kvt", dl, txt, k2);
    expect(a, 1, "/nonexistent/kvt: cannot create a tier file");
    expect("perplexity -m x -f y --kv k2v2 --kv-tier-cache 64", 2, "need --kv-tier DIR");
    expect("perplexity -m x -f y --kv q4 --kv-tier /tmp", 2, "apply to the low-bit KV types");
    expect("perplexity -m x -f y --kv k2v2 --kv-tier /tmp --kv-tier-miss later", 2, "expected skip or wait");
    snprintf(a, sizeof a, "perplexity -m %s -f %s --ctx 64 --chunks 1 --kv-refine 4", dl, txt);
    expect(a, 2, "apply to the low-bit KV types");
    snprintf(a, sizeof a, "perplexity -m %s -f %s --ctx 64 --chunks 1 --kv k2v2 %s", dl, txt, fx.bad_group[0]);
    expect(a, 1, fx.bad_group[1]);
    expect("perplexity -m x -f y --kv k5v5", 2, "expected f32, f16, q4, k2v2");
    expect("perplexity -m x -f y --kv k2v2 --kv-refine-frac 2", 2, "fraction in (0, 1]");
    expect("perplexity -m x -f y --kv k2v2 --kv-layout zig", 2, "kivi or rot");
}

/* --score-last N (windows.h) on eval_fixture's model, window 0 of CTX
 * tokens (docllama-long: 1,024), N = CTX / 4. The oracle is computed here,
 * apart from the windows code: the stream's first tokens from `spectra
 * tokenize --no-special` on a prefix of the text with BOS (config.json of
 * both models: 1) before them, their full-prompt logits from `spectra
 * logits --kv f32`, and the NLL of positions CTX - N .. CTX - 1 predicting
 * stream tokens CTX - N + 1 .. CTX (the last N targets of the window).
 * With an exact (f32) KV cache, one token per step after a CTX - N token
 * prompt equals the prompt pass up to float rounding, so perplexity and kl
 * with --score-last N --kv f32 must give the same PPL to 1e-3 (an
 * off-by-one position or a wrongly fed model moves it by far more). Then
 * the usage errors (exit 2, a message), kl's and tune's included. */
static void score_last_cases(const char *tmp) {
    const eval_fixture fx = eval_fixture_get(tmp);
    const char *dl = fx.model, *txt = fx.text;
    const int CTX = fx.ctx, LAST = fx.last;
    char c[4096], *out;
    /* 150 lines of eval.txt: ~1,760 tokens, so the cut is far beyond token
     * 1,024 (story.txt is one line of about 720 tokens: all of it) */
    snprintf(c, sizeof c, "head -n 150 %s > %s/pre.txt && %s tokenize -m %s --no-special -f %s/pre.txt", txt, tmp, bin(),
             dl, tmp);
    int rc = sh(c, &out);
    int32_t *s = malloc((CTX + 1) * sizeof *s);
    int n = 0;
    s[n++] = 1; /* BOS, once */
    char *p = out, *end;
    while (rc == 0 && n <= CTX) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        s[n++] = (int32_t)v;
        p = end;
    }
    free(out);
    CHECK(n == CTX + 1, "tokenize gave %d of the %d stream tokens needed", n, CTX + 1);
    if (n != CTX + 1) { free(s); return; }
    char *ids = malloc(CTX * 8 + 1), path[600];
    size_t len = 0;
    for (int i = 0; i < CTX; i++) len += (size_t)sprintf(ids + len, "%s%d", i ? "," : "", s[i]);
    snprintf(path, sizeof path, "%s/win.ids", tmp);
    CHECK(tl_write(path, ids, len) == 0, "%s", path);
    free(ids);
    snprintf(c, sizeof c, "%s logits -m %s --ids \"$(cat %s/win.ids)\" --kv f32 --threads 2 -o %s/win.f32", bin(), dl,
             tmp, tmp);
    rc = sh(c, &out);
    CHECK(rc == 0, "%s: %d\n%s", c, rc, out);
    free(out);
    snprintf(path, sizeof path, "%s/win.f32", tmp);
    size_t bytes = 0;
    float *lg = (float *)tl_read(path, &bytes);
    const size_t V = bytes / (CTX * sizeof(float));
    CHECK(lg && V > 0 && bytes == V * CTX * sizeof(float), "%s: %zu bytes", path, bytes);
    double nll = 0;
    for (int t = CTX - LAST; lg && V && t < CTX; t++) { /* position t predicts stream token t + 1 */
        const float *row = lg + (size_t)t * V;
        double mx = -INFINITY, sum = 0;
        for (size_t v = 0; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        for (size_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        nll -= (double)row[s[t + 1]] - mx - log(sum);
    }
    free(lg);
    free(s);
    const double want = exp(nll / LAST);
    char w[128];
    snprintf(w, sizeof w, "--ctx %d --chunks 1 --score-last %d --kv f32 --threads 2", CTX, LAST);
    snprintf(c, sizeof c, "%s perplexity -m %s -f %s %s --json", bin(), dl, txt, w);
    rc = sh(c, &out);
    double got = json_num(out, "ppl", 0);
    CHECK(rc == 0 && fabs(got / want - 1) < 1e-3 && json_num(out, "tokens_scored", 0) == LAST &&
              json_num(out, "score_last", 0) == LAST,
          "perplexity --score-last: PPL %.6f, the logits' %.6f:\n%s", got, want, out);
    free(out);
    snprintf(c, sizeof c, "%s kl -m %s --ref %s -f %s %s --json", bin(), dl, dl, txt, w);
    rc = sh(c, &out);
    got = json_num(out, "ppl_ref", 0);
    const double got_m = json_num(out, "ppl", 1);
    CHECK(rc == 0 && fabs(got / want - 1) < 1e-3 && fabs(got_m / want - 1) < 1e-3 &&
              json_num(out, "tokens_scored", 0) == LAST && json_num(out, "score_last", 0) == LAST &&
              json_num(out, "kl_mean", 1) < 1e-6,
          "kl --score-last: reference PPL %.6f, model %.6f, the logits' %.6f:\n%s", got, got_m, want, out);
    free(out);
    /* the human-readable line names the protocol; without the flag the JSON says 0 */
    snprintf(c, sizeof c, "perplexity -m %s -f %s --ctx 64 --chunks 1 --score-last 16 --threads 2", dl, txt);
    expect(c, 0, "(1 windows of 64, last 16 scored one token at a time)");
    snprintf(c, sizeof c, "perplexity -m %s -f %s --ctx 64 --chunks 1 --threads 2 --json", dl, txt);
    expect(c, 0, "\"score_last\": 0,");
    const char *bad[][2] = {{"--score-last 0", "--score-last: expected an integer in [1,"},
                            {"--score-last 64", "--score-last 64 must be below --ctx 64"},
                            {"--score-last 65", "must be below --ctx"},
                            {"--score-last 16 --llama-compat", "--score-last and --llama-compat exclude each other"},
                            {"--llama-compat --score-last 16", "exclude each other"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(c, sizeof c, "perplexity -m %s -f %s --ctx 64 %s", dl, txt, bad[i][0]);
        expect(c, 2, bad[i][1]);
        snprintf(c, sizeof c, "kl -m %s --ref %s -f %s --ctx 64 %s", dl, dl, txt, bad[i][0]);
        expect(c, 2, bad[i][1]);
    }
    snprintf(c, sizeof c, "tune -m %s/st.trdc --refine %s/st.refine --ref %s -f %s/story.txt --ctx 32 --score-last 32",
             tmp, tmp, tl_shared("models/stories260K"), tmp);
    expect(c, 2, "--score-last 32 must be below --ctx 32");
}

int main(void) {
    char a[3000];
    const char *tmp = tl_tmpdir();
    expect("--help", 0, "compress");
    expect("nosuchcommand", 2, "unknown command");
    const char *cmds[] = {"run", "tokenize", "logits", "perplexity", "kl", "compress", "convert", "inspect", "verify",
                          "audit", "bench", "synth", "experiment"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        snprintf(a, sizeof a, "%s --help", cmds[i]);
        expect(a, 0, "usage:");
    }
    /* errors: one line naming the file, non-zero exit */
    expect("run -m /no/such/model -p hi", 1, "/no/such/model");
    snprintf(a, sizeof a, "run -m %s -p hello", tl_shared("models/tiny-llama3"));
    expect(a, 1, "no tokenizer");
    snprintf(a, sizeof a, "run -m %s --ids 1,2 -n 3 --temp -1", tl_shared("models/tiny-llama3"));
    expect(a, 2, "--temp");
    snprintf(a, sizeof a, "logits -m %s --ids 1,99999 -o %s/x.f32", tl_shared("models/tiny-llama3"), tmp);
    expect(a, 1, "99999");
    snprintf(a, sizeof a, "%s/trunc", tmp);
    char c2[16384];
    snprintf(c2, sizeof c2, "mkdir -p %s && cp %s %s/ && head -c 1000 %s > %s/model.safetensors", a,
             tl_shared("models/tiny-llama3/config.json"), a, tl_shared("models/tiny-llama3/model.safetensors"), a);
    CHECK(system(c2) == 0, "%s", c2);
    snprintf(c2, sizeof c2, "logits -m %s --ids 1 -o %s/y.f32", a, tmp);
    expect(c2, 1, "model.safetensors");
    snprintf(a, sizeof a, "verify %s", tl_shared("models/tiny-llama3/config.json"));
    expect(a, 1, "config.json");

    /* tokenize works on a folder holding only tokenizer files */
    snprintf(a, sizeof a, "tokenize -m %s Hello", tl_shared("tokenizers/llama2"));
    expect(a, 0, "1 22557");
    snprintf(a, sizeof a, "tokenize -m %s --no-special Hello", tl_shared("tokenizers/llama2"));
    expect(a, 0, "22557");

    /* greedy run from ids reproduces transformers' greedy ids (tiny-mistral) */
    snprintf(a, sizeof a,
             "run -m %s --ids 337,411,410,55,150,509,506,494,207,196,324,493,187,56,117,334,33,248,420,215,81,382,133,151"
             " -n 4 --temp 0 -q",
             tl_shared("models/tiny-qwen3"));
    expect(a, 0, "247 247 247 247");

    /* --spec: greedy lookup speculation prints plain greedy's tokens
     * (a prompt that repeats, so drafts are verified); bad values exit 2 */
    {
        const char *ids = "5,6,7,8,9,10,11,12,5,6,7,8,9,10,11,12,5,6,7,8";
        char *o[2] = {NULL, NULL}, cmd[3000];
        int rc[2];
        for (int i = 0; i < 2; i++) {
            snprintf(cmd, sizeof cmd, "%s run -m %s --ids %s -n 40 --temp 0 -q --spec %s --draft-max 4", bin(),
                     tl_shared("models/tiny-llama3"), ids, i ? "lookup" : "off");
            rc[i] = sh(cmd, &o[i]);
        }
        CHECK(rc[0] == 0 && rc[1] == 0 && strlen(o[0]) > 0 && !strcmp(o[0], o[1]), "--spec lookup differs from off:\n%s\n%s",
              o[0], o[1]);
        free(o[0]);
        free(o[1]);
        snprintf(a, sizeof a, "run -m %s --ids %s -n 20 --temp 0 --spec lookup --draft-min 1", tl_shared("models/tiny-llama3"), ids);
        expect(a, 0, "spec lookup: draft 1..8");
        snprintf(a, sizeof a, "run -m %s --ids 1,2 -n 3 --spec ngram", tl_shared("models/tiny-llama3"));
        expect(a, 2, "--spec: expected lookup or off");
        snprintf(a, sizeof a, "run -m %s --ids 1,2 -n 3 --spec lookup --draft-max 2 --draft-min 3", tl_shared("models/tiny-llama3"));
        expect(a, 2, "--draft-min 3 exceeds --draft-max 2");
        snprintf(a, sizeof a, "bench -m %s -p 24 -n 16 -r 1 --spec lookup --json", tl_shared("models/tiny-llama3"));
        expect(a, 0, "\"tokens_per_pass\"");
        snprintf(a, sizeof a, "bench -m %s -p 0 -n 16 -r 1 --spec lookup", tl_shared("models/tiny-llama3"));
        expect(a, 2, "--spec continues the prompt");
    }

    /* compress -> inspect -> verify -> run, with the file's tokenizer */
    snprintf(a, sizeof a, "compress -m %s -o %s/s.trdc -q", tl_shared("models/stories260K"), tmp);
    expect(a, 0, "bits/weight");
    snprintf(a, sizeof a, "tokenize -m %s/s.trdc \"Lily and Tom went to the park.\"", tmp);
    expect(a, 0, "1 317 269 274 287 263 377 267 265 282 295 433 426");
    snprintf(a, sizeof a, "inspect %s/s.trdc", tmp);
    expect(a, 0, "model.layers.0.mlp.gate_proj.weight");
    snprintf(a, sizeof a, "verify %s/s.trdc", tmp);
    expect(a, 0, "OK");
    snprintf(a, sizeof a, "run -m %s/s.trdc -p \"Once upon a time\" -n 8 --temp 0 -q", tmp);
    expect(a, 0, "there was");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 16 -n 8 -r 2 --json", tmp);
    expect(a, 0, "tg_tps_median");
    /* bench names the kernel table; SPECTRA_KERNELS forces one */
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -n 2 -r 1", tmp);
    expect(a, 0, "cpu kernels ");
    /* a resident CPU model runs from a private copy of the weights; --mmap keeps the file's pages */
    expect(a, 0, "weights in private RAM");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -n 2 -r 1 --mmap --json", tmp);
    expect(a, 0, "\"weights_memory\": \"mapped\"");
    snprintf(a, sizeof a, "run -m %s/s.trdc -p \"Once upon a time\" -n 8 --temp 0 -q --mmap", tmp);
    expect(a, 0, "there was");
    {
        char cmd[1024], *o = NULL;
        snprintf(cmd, sizeof cmd, "SPECTRA_KERNELS=scalar %s bench -m %s/s.trdc -p 4 -n 2 -r 1 --json", bin(), tmp);
        int rc = sh(cmd, &o);
        CHECK(rc == 0 && o && strstr(o, "\"cpu_kernels\": \"scalar\""), "SPECTRA_KERNELS=scalar bench: %s", o ? o : "");
        free(o);
    }

    /* weight refinement: compress --refine, then every command that takes it */
    snprintf(a, sizeof a, "compress -m %s -o %s/q.trdc --refine %s/q.refine -q", tl_shared("models/tiny-qwen3"), tmp, tmp);
    expect(a, 0, "residuals");
    snprintf(a, sizeof a, "inspect %s/q.refine", tmp);
    expect(a, 0, "refine4");
    snprintf(a, sizeof a, "verify %s/q.refine", tmp);
    expect(a, 0, "OK");
    snprintf(a, sizeof a, "run -m %s/q.trdc --refine %s/q.refine --refine-k 64 --ids 1,2,3 -n 4 --temp 0", tmp, tmp);
    expect(a, 0, "refinement:");
    /* the cuda schedule flags reach their own fields (the summary names them) */
    snprintf(a, sizeof a, "run -m %s/q.trdc --refine %s/q.refine --refine-lag 1 --refine-lead 0.5 --ids 1,2 -n 2 --temp 0",
             tmp, tmp);
    expect(a, 0, "lag 1, lead 0.5 blocks");
    snprintf(a, sizeof a, "run -m %s/q.trdc --refine %s/q.refine --refine-lead 2 --ids 1,2 -n 2 --temp 0", tmp, tmp);
    expect(a, 0, "lag 0, lead 2 blocks");
    snprintf(a, sizeof a, "bench -m %s/q.trdc --refine %s/q.refine --refine-cache 1 -p 0 -n 8 -r 1 --json", tmp, tmp);
    expect(a, 0, "\"on_disk\": true");
    snprintf(a, sizeof a, "plan -m %s/q.trdc --refine %s/q.refine --refine-k 8,16,32,64", tmp, tmp);
    expect(a, 0, "k per 1024 8,16,32,64");
    snprintf(a, sizeof a, "run -m %s/q.refine -p x", tmp);
    expect(a, 1, "is a .refine file");
    snprintf(a, sizeof a, "run -m %s/q.trdc --refine %s/q.trdc -p x", tmp, tmp);
    expect(a, 1, "not a .refine file");
    snprintf(a, sizeof a, "run -m %s/q.trdc --refine %s/q.refine --refine-k 1,2 -p x", tmp, tmp);
    expect(a, 2, "--refine-k '1,2'");
    snprintf(a, sizeof a, "run -m %s/q.trdc --refine %s/q.refine --refine-miss later -p x", tmp, tmp);
    expect(a, 2, "expected skip or wait");
    /* neuron bundles: compress --refine-bundles, inspect/verify, run/bench/plan neuron-wise, the refusals */
    snprintf(a, sizeof a, "compress -m %s -o %s/q.trdc --refine %s/qb.refine --refine-bundles -q",
             tl_shared("models/tiny-qwen3"), tmp, tmp);
    expect(a, 0, "neuron bundles of");
    snprintf(a, sizeof a, "inspect %s/qb.refine", tmp);
    expect(a, 0, "bundle4");
    snprintf(a, sizeof a, "verify %s/qb.refine", tmp);
    expect(a, 0, "OK");
    snprintf(a, sizeof a, "run -m %s/q.trdc --refine %s/qb.refine --refine-mlp neuron --refine-kn 64 --ids 1,2,3 -n 4 "
                          "--temp 0", tmp, tmp);
    expect(a, 0, "MLP neuron-wise: 64 neurons");
    snprintf(a, sizeof a, "bench -m %s/q.trdc --refine %s/qb.refine --refine-mlp neuron --refine-cache 1 -p 0 -n 8 -r 1 "
                          "--json", tmp, tmp);
    expect(a, 0, "\"mlp\": \"neuron\", \"kn\": 24");
    snprintf(a, sizeof a, "plan -m %s/q.trdc --refine %s/qb.refine --refine-mlp neuron --refine-k 8", tmp, tmp);
    expect(a, 0, "MLP neuron-wise: 6 neurons");
    snprintf(a, sizeof a, "run -m %s/q.trdc --refine %s/q.refine --refine-mlp neuron -p x", tmp, tmp);
    expect(a, 1, "--refine-mlp neuron needs neuron bundles");
    snprintf(a, sizeof a, "run -m %s/q.trdc --refine %s/qb.refine --refine-mlp rows -p x", tmp, tmp);
    expect(a, 2, "expected channel or neuron");
    snprintf(a, sizeof a, "compress -m %s -o %s/q2.trdc --refine-bundles -q", tl_shared("models/tiny-qwen3"), tmp);
    expect(a, 2, "--refine-bundles needs --refine");

    /* refinement fitting (compress --refine --fit): stories260K carries a
     * tokenizer and fits in well under a second */
    {
        const char *st = tl_shared("models/stories260K");
        char txt[600], empty[600], shorttxt[600];
        snprintf(txt, sizeof txt, "%s/fit.txt", tmp);
        snprintf(empty, sizeof empty, "%s/empty.txt", tmp);
        snprintf(shorttxt, sizeof shorttxt, "%s/short.txt", tmp);
        char body[4096] = "";
        for (int i = 0; i < 20; i++) strcat(body, "Once upon a time there was a little girl named Lily. She liked to play. ");
        CHECK(tl_write(txt, body, strlen(body)) == 0 && tl_write(empty, "", 0) == 0 &&
              tl_write(shorttxt, "Once upon a time", 16) == 0, "writing the fit texts");
        snprintf(a, sizeof a, "compress -m %s -o %s/f.trdc --refine %s/f.refine --fit %s --fit-k 8 --fit-ctx 64 "
                 "--fit-tokens 256 -q", st, tmp, tmp, txt);
        expect(a, 0, "fitted residuals");
        snprintf(a, sizeof a, "inspect %s/f.refine", tmp);
        expect(a, 0, "\"fit\":{\"text\":\"fit.txt\"");
        snprintf(a, sizeof a, "inspect %s/f.refine", tmp);
        expect(a, 0, "\"k\":[8,8,8,8]");
        snprintf(a, sizeof a, "verify %s/f.refine", tmp);
        expect(a, 0, "OK");
        snprintf(a, sizeof a, "run -m %s/f.trdc --refine %s/f.refine --refine-k 8 -p \"Once upon a time\" -n 6 --temp 0",
                 tmp, tmp);
        expect(a, 0, "fitted for k 8,8,8,8");
        snprintf(a, sizeof a, "run -m %s/f.trdc --refine %s/f.refine --refine-k 32 --ids 1,2,3 -n 2 --temp 0", tmp, tmp);
        expect(a, 0, "but run at 32,32,32,32");
        snprintf(a, sizeof a, "compress -m %s -o %s/g.trdc --fit %s -q", st, tmp, txt);
        expect(a, 2, "needs --refine");
        snprintf(a, sizeof a, "compress -m %s -o %s/g.trdc --refine %s/g.refine --fit-k 8 -q", st, tmp, tmp);
        expect(a, 2, "need --fit TEXT");
        snprintf(a, sizeof a, "compress -m %s -o %s/g.trdc --refine %s/g.refine --fit %s --fit-k 0 -q", st, tmp, tmp, txt);
        expect(a, 2, "--fit-k");
        snprintf(a, sizeof a, "compress -m %s -o %s/g.trdc --refine %s/g.refine --fit %s/none.txt -q", st, tmp, tmp, tmp);
        expect(a, 1, "none.txt");
        snprintf(a, sizeof a, "compress -m %s -o %s/g.trdc --refine %s/g.refine --fit %s -q", st, tmp, tmp, empty);
        expect(a, 1, "empty");
        snprintf(a, sizeof a, "compress -m %s -o %s/g.trdc --refine %s/g.refine --fit %s --fit-ctx 64 -q", st, tmp, tmp,
                 shorttxt);
        expect(a, 1, "fewer than one window");
        snprintf(a, sizeof a, "%s/g.trdc", tmp);
        CHECK(access(a, F_OK) != 0, "a failed fit left %s behind", a);
    }
    /* spectra tune (stories260K: a tokenizer, and seconds at these settings):
     * the record in the .refine, what inspect/verify/run/kl make of it, and
     * the refusals */
    tune_cases(tmp);
    tune_neuron_cases(tmp);
    kv_lowbit_cases(tmp);  /* after tune_cases: its story.txt (eval_fixture in quick mode) */
    score_last_cases(tmp); /* after tune_cases: its st.trdc, st.refine and story.txt */

    /* layouts: tiny-qwen3 (widths 128 and 384) is stored tiled by default and
     * row-major with --layout rows; both give the same greedy tokens */
    snprintf(a, sizeof a, "compress -m %s -o %s/t.trdc -q", tl_shared("models/tiny-qwen3"), tmp);
    expect(a, 0, "bits/weight");
    snprintf(a, sizeof a, "compress -m %s -o %s/r.trdc -q --layout rows", tl_shared("models/tiny-qwen3"), tmp);
    expect(a, 0, "bits/weight");
    snprintf(a, sizeof a, "compress -m %s -o %s/x.trdc -q --layout cols", tl_shared("models/tiny-qwen3"), tmp);
    expect(a, 2, "--layout: expected tiled or rows");
    snprintf(a, sizeof a, "inspect %s/t.trdc", tmp);
    expect(a, 0, "4/g32/t");
    snprintf(a, sizeof a, "inspect %s/t.trdc", tmp);
    expect(a, 0, "version 2");
    snprintf(a, sizeof a, "inspect %s/r.trdc", tmp);
    expect(a, 0, "version 1");
    same_tokens(tmp, "t.trdc", "r.trdc");

    /* convert: the row-major file tiled and back, without recompressing;
     * the tiled file runs as the compressed one; a bad input is refused */
    snprintf(a, sizeof a, "convert %s/r.trdc -o %s/rt.trdc -q", tmp, tmp);
    expect(a, 0, "matrices now tiled");
    snprintf(a, sizeof a, "inspect %s/rt.trdc", tmp);
    expect(a, 0, "4/g32/t");
    snprintf(a, sizeof a, "convert %s/rt.trdc -o %s/rtr.trdc --layout rows -q", tmp, tmp);
    expect(a, 0, "matrices now row-major");
    snprintf(a, sizeof a, "inspect %s/rtr.trdc", tmp);
    expect(a, 0, "version 1");
    same_tokens(tmp, "t.trdc", "rt.trdc");
    snprintf(a, sizeof a, "plan -m %s/r.trdc", tmp); /* the plan points a row-major file at convert */
    expect(a, 0, "`spectra convert` tiles the rest");
    snprintf(a, sizeof a, "plan -m %s/rt.trdc --json", tmp);
    expect(a, 0, "\"row_major_tileable_matrices\":\t0\n");
    expect(a, 0, "\"SPECTRA_KERNELS\":"); /* the tuning record (engine/tuning.h) */
    snprintf(a, sizeof a, "plan -m %s/rt.trdc", tmp);
    expect(a, 0, "\ntuning    ");
    snprintf(a, sizeof a, "head -c 20000 %s/r.trdc > %s/cut.trdc", tmp, tmp);
    CHECK(system(a) == 0, "truncate");
    snprintf(a, sizeof a, "convert %s/cut.trdc -o %s/cut2.trdc -q", tmp, tmp);
    expect(a, 1, "cut.trdc");
    snprintf(a, sizeof a, "convert %s/r.trdc -q", tmp);
    expect(a, 2, "-o OUT.trdc");

    /* run and bench follow the execution plan and print it (not with -q / --json) */
    snprintf(a, sizeof a, "run -m %s/s.trdc --ids 1,2 -n 2 --temp 0", tmp);
    expect(a, 0, "plan: ");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -n 2 -r 1", tmp);
    expect(a, 0, "plan: ");
    snprintf(a, sizeof a, "run -m %s/s.trdc --ids 1,2 -n 2 --ctx 64 --kv f32 --temp 0", tmp); /* f32: on the cpu, GPU or not */
    expect(a, 0, "kv f32, context 64");
    /* budgets: absurd values are usage errors naming the flag; on the cpu the VRAM budget is moot */
    snprintf(a, sizeof a, "run -m %s/s.trdc --ids 1,2 -n 2 --vram-budget 0", tmp);
    expect(a, 2, "--vram-budget");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -n 2 --vram-budget 99999999999999", tmp);
    expect(a, 2, "--vram-budget");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -n 2 --vram-budget lots", tmp);
    expect(a, 2, "--vram-budget");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 8 -n 8 --ctx 10", tmp);
    expect(a, 2, "--ctx");
    /* -d: decode after 300 positions of context; with the low-bit cache
     * its first complete block is encoded, so refinements are counted */
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 0 -d 300 -n 8 -r 2 --backend cpu --kv k2v2 --kv-group 8 --kv-refine 4", tmp);
    expect(a, 0, "at depth 300");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 0 -d 300 -n 8 -r 2 --backend cpu --kv k2v2 --kv-group 8 --kv-refine 4", tmp);
    expect(a, 0, "refine +4/+4 bits, 0.0078125 of 4-token groups, tier");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 0 -d 300 -n 8 -r 1 --json", tmp);
    expect(a, 0, "\"depth\": 300");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -d 300 -n 0", tmp);
    expect(a, 2, "without generation");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 0 -n 8 --seek", tmp);
    expect(a, 2, "--seek needs -d N");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 0 -d 300 -n 8 -r 1 --seek", tmp);
    expect(a, 0, "at depth 300 (seek: not computed)");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 8 -d 300 -n 8 --ctx 100", tmp);
    expect(a, 2, "max(-p, -d) + -n + 1");
    /* --parallel: B sessions through spx_batch_step beside one alone */
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -n 6 -r 2 --parallel 3", tmp);
    expect(a, 0, "3 sessions in parallel");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -n 6 -r 1 --parallel 4 --json", tmp);
    expect(a, 0, "\"total_over_single\"");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -n 6 --parallel 1", tmp);
    expect(a, 2, "--parallel");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -n 6 --parallel 2 --spec lookup", tmp);
    expect(a, 2, "--parallel does not combine");
    snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -n 0 --parallel 2", tmp);
    expect(a, 2, "give -n N >= 1");
    snprintf(a, sizeof a, "run -m %s/s.trdc --ids 1,2 -n 2 --temp 0 --vram-budget 1 --backend cpu -q", tmp);
    expect(a, 0, NULL);
    /* --backend cuda where there is no GPU (or no CUDA in the build): one clear line */
    spx_hw hw;
    spx_err he;
    spx_err_clear(&he);
    CHECK(spx_hw_probe(&hw, &he) == SPX_OK, "probe: %s", he.msg);
    if (!hw.cuda_built || hw.n_gpus == 0) {
        snprintf(a, sizeof a, "run -m %s/s.trdc --ids 1,2 -n 2 --backend cuda", tmp);
        expect(a, 1, "--backend cuda: ");
        snprintf(a, sizeof a, "bench -m %s/s.trdc -p 4 -n 2 --backend cuda --vram-budget 2048", tmp);
        expect(a, 1, "--backend cuda: ");
    }
    /* bench --json --telemetry: one valid JSON object with the plan and a non-empty sample array */
    {
        char *out;
        snprintf(c2, sizeof c2, "{ %s bench -m %s/s.trdc -p 8 -n 8 -r 2 --json --telemetry 2>/dev/null; }", bin(), tmp);
        int rc = sh(c2, &out);
        CHECK(rc == 0, "%s exited %d:\n%s", c2, rc, out);
        cJSON *j = cJSON_Parse(out);
        CHECK(j != NULL, "bench --json --telemetry: not JSON:\n%s", out);
        const cJSON *tel = cJSON_GetObjectItemCaseSensitive(j, "telemetry");
        CHECK(cJSON_IsArray(tel) && cJSON_GetArraySize(tel) > 0, "bench --json --telemetry: no samples:\n%s", out);
        const cJSON *s0 = cJSON_GetArrayItem(tel, 0);
        CHECK(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(s0, "rss_bytes")), "telemetry sample without rss_bytes");
        CHECK(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "tg_tps_median")), "bench JSON without tg_tps_median");
        CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "residency")), "bench JSON without residency");
        CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "plan")), "bench JSON without the plan");
        const cJSON *tu = cJSON_GetObjectItemCaseSensitive(j, "tuning");
        CHECK(cJSON_IsObject(tu) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(tu, "SPECTRA_KERNELS")),
              "bench JSON without the tuning record");
        cJSON_Delete(j);
        free(out);
    }
    /* a flipped byte: verify fails naming the tensor */
    snprintf(c2, sizeof c2, "printf '\\377' | dd of=%s/s.trdc bs=1 seek=4100 conv=notrunc status=none", tmp);
    CHECK(system(c2) == 0, "%s", c2);
    snprintf(a, sizeof a, "verify %s/s.trdc", tmp);
    expect(a, 1, "MISMATCH");
    return tl_finish("test_cli");
}
