/* cmd_tune.c: `spectra tune -m MODEL.trdc --refine MODEL.refine --ref SRC
 * -f TEXT [--budget 5%]`: StrataFlux-W's tuner on this machine (issue 20;
 * the search is refine/tune.h). It measures, and records in the .refine's
 * manifest for this platform (docs/trdc.md 2.6), the refinement budgets
 * with the lowest KL whose decode slowdown stays within the budget.
 *
 * Measurements (the search's callbacks):
 *   slowdown: `spectra bench -p 0 -n N`'s decode loop (cli_decode_tps) on
 *     one session of the model with the .refine attached in the tier
 *     placement given (RAM, or disk behind --refine-cache); the base is the
 *     same model with every budget 0 (the hook then returns before
 *     selecting, so it costs a few branches a launch), so base and
 *     candidate share weights, pages, threads and cache. One untimed run
 *     of the candidate first (it fills the tier's cache for its budgets),
 *     then R rounds of a base run and a candidate run from the same random
 *     token, their order alternating between rounds; the slowdown is the
 *     median over rounds of base tokens/s / candidate tokens/s - 1 (paired
 *     within a round, so slow drift of a shared machine cancels).
 *   KL: mean KL(ref || model) over the scored positions of the windows
 *     (windows.h; --skip picks them so tuning and evaluation use disjoint
 *     text), the model fed one token a step as generation runs
 *     (eval_window), per position eval_kl_row: the numbers `spectra kl`
 *     prints for the same windows and budgets. The reference's logits of
 *     the scored positions are computed once and kept (chunks x scored x
 *     vocab floats).
 * The search measures its final choice again (tune.h step 3) and records
 * that confirming reading. The ladder stops at the widest refined input
 * (a larger k selects the same channels). The tier placement (RAM or
 * disk, cache size, miss mode, loaders) is part of the platform key: tune
 * once per placement that will be run. Measuring the base as the same
 * model at k = 0 rather than without the .refine keeps one model and one
 * thread pool: two would compete for the cores. */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "format/trdc.h"
#include "refine/attach.h"
#include "refine/tune.h"
#include "windows.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra tune -m MODEL.trdc --refine MODEL.refine --ref SRC -f TEXT [options]\n"
               "  -m MODEL        the compressed model (.trdc)\n"
               "  --refine FILE   its .refine (spectra compress --refine); the result is written into it\n"
               "  --ref SRC       reference for the KL (HF folder or .trdc; the source checkpoint)\n"
               "  -f TEXT         UTF-8 text whose windows score the KL (tokenized with the reference's tokenizer)\n"
               "  --budget B      slowdown budget against the unrefined model: 5%% or 0.05 (above 0, below 100%%;\n"
               "                  default 5%%)\n"
               "  --ctx N         window length (int >= 2; default 512)\n"
               "  --chunks C      windows scored (int >= 1; default 2)\n" CLI_EVAL_SKIP_USAGE
               "  --llama-compat  llama-perplexity's windows (BOS per window, second half scored)\n"
               "  --tokens N      decoded tokens per timed run (int 8..65536; default 64)\n"
               "  --rounds R      base/candidate rounds per slowdown measurement (int 1..100; default 5)\n"
               "  --max-trials T  greedy raises measured at most (int 1..%d; default %d); the choice is then\n"
               "                  measured again, falling back along the kept ones until one confirms\n"
               "  --ladder LIST   budgets tried, ascending from 0 (default 0,1,2,4,8,...,768,1024); values at or\n"
               "                  above the widest refined input (all its channels) count once, as that width\n"
               "  --kv TYPE       KV cache storage: f32, f16 or q4 (default f16)\n"
               "  --threads N     worker threads (int, 1..1024; default: all CPUs)\n"
               "  --no-write      measure and print only; the .refine is not changed\n"
               "  --json          print the result as one JSON object\n"
               "the tier the budgets are tuned for (part of the platform key):\n"
               "  --refine-cache MiB  residual read from disk into an LRU cache of MiB (default 0: mapped in RAM)\n"
               "  --refine-miss M skip (default) or wait\n"
               "  --refine-loaders N  disk loader threads (default 2)\n",
            SPX_TUNE_MAX_TRIALS, SPX_TUNE_DEFAULT_TRIALS);
}

#define MAX_TRIALS_KEPT 512

typedef struct tune_ctx {
    spx_model *m;
    spx_session *s;
    int64_t V, ctx, tokens, rounds;
    uint64_t rng;
    /* KL: the windows, the reference's logits at their scored positions */
    eval_windows w;
    float *ref_logits;   /* [chunks][count][V] */
    int64_t count;       /* scored positions per window */
    float *logits;       /* [ctx][V] */
    double *pr, *pm;     /* [V] */
    int32_t *in, *tg;    /* [ctx] */
    int32_t *targets;    /* [chunks][count] */
    /* the last slowdown measurement's medians, for the progress line */
    double tps_base, tps_cand;
    spx_tune_trial trials[MAX_TRIALS_KEPT];
    double trial_tps[MAX_TRIALS_KEPT][2];
    int n_trials;
    int json;            /* --json: the result table as JSON (progress stays on stderr) */
} tune_ctx;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, int64_t n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static spx_status set_k(tune_ctx *t, const spx_refine_config *c, spx_err *e) {
    return spx_refine_set_budget(t->m, c->k, e);
}

static int32_t next_token(tune_ctx *t) {
    t->rng = t->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((t->rng >> 33) % (uint64_t)t->V);
}

static spx_status measure_slowdown(void *user, const spx_refine_config *c, double *out, spx_err *e) {
    tune_ctx *t = user;
    const spx_refine_config base = {{0}};
    double ratio[100], tb[100], tc[100], tps;
    SPX_TRY(set_k(t, c, e));
    if (!cli_decode_tps(t->s, next_token(t), t->tokens, &tps)) /* warm-up: the tier's cache, the code paths */
        return spx_fail(e, SPX_ERR_INTERNAL, "decode failed (message above)");
    for (int64_t r = 0; r < t->rounds; r++) {
        const int32_t first = next_token(t);
        for (int j = 0; j < 2; j++) {
            const int cand = (int)((r + j) % 2); /* base first in even rounds, the candidate first in odd ones */
            SPX_TRY(set_k(t, cand ? c : &base, e));
            if (!cli_decode_tps(t->s, first, t->tokens, cand ? &tc[r] : &tb[r]))
                return spx_fail(e, SPX_ERR_INTERNAL, "decode failed (message above)");
        }
        ratio[r] = tb[r] / tc[r];
    }
    *out = median(ratio, t->rounds) - 1;
    t->tps_base = median(tb, t->rounds);
    t->tps_cand = median(tc, t->rounds);
    return SPX_OK;
}

static spx_status measure_kl(void *user, const spx_refine_config *c, double *out, spx_err *e) {
    tune_ctx *t = user;
    SPX_TRY(set_k(t, c, e));
    double sum = 0, nll = 0;
    int64_t same = 0, n = 0;
    for (int64_t k = 0; k < t->w.chunks; k++) {
        int64_t first, count;
        eval_windows_get(&t->w, k, t->in, &first, &count, t->tg);
        if (eval_window(t->s, t->m, t->in, t->ctx, t->logits) != SPX_OK)
            return spx_fail(e, SPX_ERR_INTERNAL, "%s", spx_session_error(t->s));
        for (int64_t i = 0; i < count; i++) {
            const float *a = t->ref_logits + (size_t)(k * t->count + i) * (size_t)t->V;
            eval_logprob(a, t->V, t->tg[i], t->pr);
            sum += eval_kl_row(t->pr, eval_argmax(a, t->V), t->logits + (first + i) * t->V, t->V, t->tg[i], t->pm, &nll,
                               &same);
            n++;
        }
    }
    *out = sum / (double)n;
    return SPX_OK;
}

static const char *phase_name(spx_tune_phase p) {
    return p == SPX_TUNE_BASE ? "base" : p == SPX_TUNE_COMMON ? "common" : p == SPX_TUNE_GREEDY ? "greedy" : "confirm";
}

/* the search's lines that announce a kept configuration (no measurement of their own) */
static int is_summary(const spx_tune_trial *tr) {
    return (tr->phase == SPX_TUNE_COMMON || tr->phase == SPX_TUNE_GREEDY) && tr->kept && !isnan(tr->kl);
}

static void progress(void *user, const spx_tune_trial *tr) {
    tune_ctx *t = user;
    const int timed = !isnan(tr->slowdown) && tr->phase != SPX_TUNE_BASE && !is_summary(tr);
    if (t->n_trials < MAX_TRIALS_KEPT) {
        t->trials[t->n_trials] = *tr;
        t->trial_tps[t->n_trials][0] = timed ? t->tps_base : NAN;
        t->trial_tps[t->n_trials][1] = timed ? t->tps_cand : NAN;
        t->n_trials++;
    }
    char k[64]; /* progress on stderr, --json or not (the JSON is stdout's) */
    spx_refine_config_str(&tr->c, k, sizeof k);
    if (tr->phase == SPX_TUNE_BASE) fprintf(stderr, "tune: base              KL %.5f\n", tr->kl);
    else if (is_summary(tr))
        fprintf(stderr, "tune: %-6s %-22s KL %.5f  <- %s\n", phase_name(tr->phase), k, tr->kl,
                tr->phase == SPX_TUNE_COMMON ? "largest feasible common k" : "raise kept");
    else {
        fprintf(stderr, "tune: %-6s %-22s slowdown %6.2f%% (%.1f -> %.1f tokens/s) %s", phase_name(tr->phase), k,
                100 * tr->slowdown, t->tps_base, t->tps_cand, tr->feasible ? "within" : "over");
        if (!isnan(tr->kl)) fprintf(stderr, "  KL %.5f", tr->kl);
        if (tr->phase == SPX_TUNE_CONFIRM) fputs(tr->kept ? "  <- confirmed" : "  (falling back)", stderr);
        fputc('\n', stderr);
    }
}

/* "0,1,2,4" */
static int parse_ladder(const char *v, int64_t *out, size_t *n) {
    size_t c = 0;
    int32_t *ids = cli_parse_ids(v, "--ladder", 0, n);
    if (!ids) return 0;
    int ok = *n >= 2 && *n <= SPX_TUNE_MAX_LADDER && ids[0] == 0;
    for (size_t i = 0; i < *n && ok; i++) {
        out[c++] = ids[i];
        ok = ids[i] <= (1 << 20) && (i == 0 || ids[i] > ids[i - 1]);
    }
    free(ids);
    if (!ok) cli_error("--ladder '%s': expected 2..%d budgets, strictly ascending from 0, each <= %d", v,
                       SPX_TUNE_MAX_LADDER, 1 << 20);
    return ok;
}

static int prepare_kl(tune_ctx *t, spx_model *ref, const cli_eval_opts *o) {
    if (!eval_windows_init(&t->w, ref, o->file, o->ctx, o->chunks, o->skip, o->compat)) return 0;
    int64_t first, count;
    eval_windows_get(&t->w, 0, t->in, &first, &count, t->tg);
    t->count = count;
    const size_t rows = (size_t)(t->w.chunks * count);
    t->ref_logits = malloc(rows * (size_t)t->V * sizeof(float));
    if (!t->ref_logits) {
        cli_error("out of memory for the reference's logits (%zu positions x %lld; fewer --chunks)", rows,
                  (long long)t->V);
        return 0;
    }
    spx_session *sr = NULL;
    spx_session_params spr = {.n_ctx = o->ctx, .kv = SPX_KV_F32}; /* the reference is exact */
    if (spx_session_new(ref, &spr, &sr) != SPX_OK) {
        cli_error("%s", spx_model_error(ref));
        return 0;
    }
    int ok = 1;
    for (int64_t k = 0; k < t->w.chunks && ok; k++) {
        eval_windows_get(&t->w, k, t->in, &first, &count, t->tg);
        spx_session_reset(sr);
        if (spx_session_eval(sr, t->in, (size_t)t->ctx, t->logits, 1) != SPX_OK) {
            cli_error("%s", spx_session_error(sr));
            ok = 0;
            break;
        }
        memcpy(t->ref_logits + (size_t)(k * count) * (size_t)t->V, t->logits + first * t->V,
               (size_t)count * (size_t)t->V * sizeof(float));
    }
    spx_session_free(sr);
    return ok;
}

static void print_result(const tune_ctx *t, const spx_tune_result *r, double budget, const char *platform,
                         const char *written, const char *windows) {
    char k[64];
    if (t->json) {
        printf("{\"platform\": \"%s\", \"budget\": %.6g, \"k\": [%lld, %lld, %lld, %lld], \"slowdown\": %.6f, "
               "\"kl\": %.6f, \"kl_base\": %.6f, \"windows\": \"%s\", \"written\": %s, \"measurements\": "
               "{\"slowdown\": %d, \"kl\": %d}, \"trials\": [",
               platform, budget, (long long)r->best.k[0], (long long)r->best.k[1], (long long)r->best.k[2],
               (long long)r->best.k[3], r->slowdown, r->kl, r->kl_base, windows, written ? "true" : "false",
               (int)r->n_slowdown, (int)r->n_kl);
        for (int i = 0, n = 0; i < t->n_trials; i++) {
            const spx_tune_trial *tr = &t->trials[i];
            if (is_summary(tr)) continue;
            printf("%s{\"phase\": \"%s\", \"k\": [%lld, %lld, %lld, %lld]", n++ ? ", " : "", phase_name(tr->phase),
                   (long long)tr->c.k[0], (long long)tr->c.k[1], (long long)tr->c.k[2], (long long)tr->c.k[3]);
            if (!isnan(tr->slowdown) && tr->phase != SPX_TUNE_BASE)
                printf(", \"slowdown\": %.6f, \"tps_base\": %.3f, \"tps\": %.3f, \"feasible\": %s", tr->slowdown,
                       t->trial_tps[i][0], t->trial_tps[i][1], tr->feasible ? "true" : "false");
            if (!isnan(tr->kl)) printf(", \"kl\": %.6f", tr->kl);
            printf("}");
        }
        printf("]}\n");
        return;
    }
    printf("%-7s %-22s %10s %12s %12s %10s\n", "phase", "budgets", "slowdown", "base tok/s", "cand tok/s", "mean KL");
    for (int i = 0; i < t->n_trials; i++) {
        const spx_tune_trial *tr = &t->trials[i];
        if (is_summary(tr)) continue;
        spx_refine_config_str(&tr->c, k, sizeof k);
        char sd[32] = "-", b[32] = "-", c[32] = "-", kl[32] = "-";
        if (tr->phase != SPX_TUNE_BASE && !isnan(tr->slowdown)) {
            snprintf(sd, sizeof sd, "%.2f%%%s", 100 * tr->slowdown, tr->feasible ? "" : "*");
            snprintf(b, sizeof b, "%.1f", t->trial_tps[i][0]);
            snprintf(c, sizeof c, "%.1f", t->trial_tps[i][1]);
        }
        if (!isnan(tr->kl)) snprintf(kl, sizeof kl, "%.5f", tr->kl);
        printf("%-7s %-22s %10s %12s %12s %10s\n", phase_name(tr->phase), k, sd, b, c, kl);
    }
    spx_refine_config_str(&r->best, k, sizeof k);
    printf("(* over the %g%% budget)\ntuned for %s, budget %g%%: %s, measured slowdown %.2f%%, KL %.5f (base %.5f) "
           "on %s; %d slowdown and %d KL measurements\n",
           100 * budget, platform, 100 * budget, k, 100 * r->slowdown, r->kl, r->kl_base, windows, (int)r->n_slowdown,
           (int)r->n_kl);
    if (written) printf("written to %s\n", written);
    else printf("not written (--no-write)\n");
}

int cmd_tune(int argc, char **argv) {
    const char *model = NULL, *ref = NULL;
    cli_eval_opts o = CLI_EVAL_OPTS_DEFAULT;
    o.chunks = 2;
    spx_refine_params rp;
    cli_refine_defaults(&rp);
    double budget = SPX_REFINE_TUNED_DEFAULT;
    int64_t tokens = 64, rounds = 5, max_trials = SPX_TUNE_DEFAULT_TRIALS;
    int64_t ladder[SPX_TUNE_MAX_LADDER];
    size_t n_ladder = 0;
    int no_write = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--refine-k") || !strcmp(a, "--refine-tuned")) {
            cli_error("tune: %s is what tune chooses; it takes the tier options only (--refine-cache, --refine-miss, "
                      "--refine-loaders)", a);
            return 2;
        }
        if (!strcmp(a, "--backend") && i + 1 < argc && strcmp(argv[i + 1], "cpu") != 0) {
            cli_error("tune: --backend %s: refinement runs on the cpu backend only", argv[i + 1]);
            return 2;
        }
        int r = cli_eval_opt(argc, argv, &i, &o);
        if (!r) r = cli_refine_opt(argc, argv, &i, &rp);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(a, "--no-write")) { no_write = 1; continue; }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--ref")) ref = v;
        else if (!strcmp(a, "--budget")) { if (!cli_budget(a, v, &budget)) return 2; }
        else if (!strcmp(a, "--tokens")) { if (!cli_int(a, v, 8, 65536, &tokens)) return 2; }
        else if (!strcmp(a, "--rounds")) { if (!cli_int(a, v, 1, 100, &rounds)) return 2; }
        else if (!strcmp(a, "--max-trials")) { if (!cli_int(a, v, 1, SPX_TUNE_MAX_TRIALS, &max_trials)) return 2; }
        else if (!strcmp(a, "--ladder")) { if (!parse_ladder(v, ladder, &n_ladder)) return 2; }
        else { cli_error("tune: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (!model || !rp.path || !ref || !o.file) {
        cli_error("tune: -m MODEL, --refine FILE, --ref SRC and -f TEXT are required");
        usage(stderr);
        return 2;
    }
    spx_err e;
    spx_err_clear(&e);
    /* before minutes of measuring: can the result be written? */
    if (!no_write && spx_trdc_writable_dir(rp.path, &e) != SPX_OK) return cli_fail(&e);
    int rc = 1;
    tune_ctx t;
    memset(&t, 0, sizeof t);
    t.json = o.json;
    t.rng = 1234;
    t.ctx = o.ctx;
    t.tokens = tokens;
    t.rounds = rounds;
    spx_model *mr = NULL;
    char platform[256], windows[256], k[64];
    if (!(t.m = cli_open_model_on(model, o.threads, "cpu"))) goto done;
    rp.tuned = -1; /* tuning starts from nothing */
    for (int s = 0; s < 4; s++) rp.k[s] = 0;
    if (!cli_apply_refine(t.m, &rp)) goto done;
    spx_refine_platform(t.m, &rp, platform, sizeof platform);
    if (!(mr = cli_open_model(ref, o.threads))) goto done;
    t.V = spx_model_vocab_size(t.m);
    if (spx_model_vocab_size(mr) != t.V) {
        cli_error("tune: vocabularies differ (%s: %lld, %s: %lld)", ref, (long long)spx_model_vocab_size(mr), model,
                  (long long)t.V);
        goto done;
    }
    t.logits = malloc((size_t)o.ctx * (size_t)t.V * sizeof(float));
    t.pr = malloc((size_t)t.V * sizeof(double));
    t.pm = malloc((size_t)t.V * sizeof(double));
    t.in = malloc((size_t)o.ctx * sizeof *t.in);
    t.tg = malloc((size_t)o.ctx * sizeof *t.tg);
    if (!t.logits || !t.pr || !t.pm || !t.in || !t.tg) { cli_error("out of memory"); goto done; }
    if (!prepare_kl(&t, mr, &o)) goto done;
    spx_model_free(mr); /* the reference's logits are kept; its weights are not needed any more */
    mr = NULL;
    spx_session_params sp = {.n_ctx = o.ctx > tokens + 2 ? o.ctx : tokens + 2, .kv = o.kv};
    if (spx_session_new(t.m, &sp, &t.s) != SPX_OK) { cli_error("%s", spx_model_error(t.m)); goto done; }
    snprintf(windows, sizeof windows, "%.150s: %lld windows of %lld from window %lld%s", o.file, (long long)t.w.chunks,
             (long long)o.ctx, (long long)o.skip, o.compat ? ", llama-compat" : "");
    fprintf(stderr, "tune: platform %s, budget %g%%, %lld tokens x %lld rounds per timing, KL on %s\n", platform,
                100 * budget, (long long)tokens, (long long)rounds, windows);
    /* budgets above the widest chunk of any refined matrix select the same
     * channels as that width (every one): the ladder stops there */
    if (!n_ladder) {
        const int64_t *dl = spx_tune_default_ladder(&n_ladder);
        memcpy(ladder, dl, n_ladder * sizeof *ladder);
    }
    int64_t width = 1;
    for (int64_t i = 0; i < t.m->refine->n_mats; i++) {
        const int64_t c = t.m->refine->mats[i].q4.cols;
        width = c > width ? c : width;
    }
    width = width < SPX_REFINE_CHUNK ? width : SPX_REFINE_CHUNK;
    size_t kept = 1;
    while (kept < n_ladder && ladder[kept] < width) kept++;
    if (kept < n_ladder) ladder[kept++] = width;
    n_ladder = kept < 2 ? 2 : kept;
    spx_tune_params tp = {.budget = budget, .ladder = ladder, .n_ladder = n_ladder,
                          .max_trials = (int32_t)max_trials};
    spx_tune_ops ops = {.user = &t, .slowdown = measure_slowdown, .kl = measure_kl, .progress = progress};
    spx_tune_result res;
    if (spx_refine_tune(&tp, &ops, &res, &e) != SPX_OK) {
        if (e.code != SPX_ERR_INTERNAL || !strstr(e.msg, "message above")) cli_fail(&e);
        goto done;
    }
    if (!no_write) {
        spx_trdc_tuned en;
        memset(&en, 0, sizeof en);
        snprintf(en.platform, sizeof en.platform, "%s", platform);
        en.budget = budget;
        memcpy(en.k, res.best.k, sizeof en.k);
        en.slowdown = res.slowdown;
        en.kl = res.kl;
        en.kl_base = res.kl_base;
        time_t now = time(NULL);
        struct tm tmv;
        strftime(en.date, sizeof en.date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tmv));
        snprintf(en.windows, sizeof en.windows, "%s", windows);
        spx_model_refine(t.m, NULL); /* the file is replaced: unmap it first */
        if (spx_trdc_set_tuned(rp.path, &en, &e) != SPX_OK) { cli_fail(&e); goto done; }
    }
    spx_refine_config_str(&res.best, k, sizeof k);
    fprintf(stderr, "tune: chose %s (slowdown %.2f%%, KL %.5f, base %.5f)\n", k, 100 * res.slowdown, res.kl,
            res.kl_base);
    print_result(&t, &res, budget, platform, no_write ? NULL : rp.path, windows);
    rc = 0;
done:
    free(t.logits); free(t.pr); free(t.pm); free(t.in); free(t.tg); free(t.ref_logits);
    eval_windows_free(&t.w);
    spx_session_free(t.s);
    spx_model_free(t.m);
    spx_model_free(mr);
    return rc;
}
