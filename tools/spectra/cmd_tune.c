/* cmd_tune.c: `spectra tune -m MODEL.trdc --refine MODEL.refine --ref SRC
 * -f TEXT [--budget 5%]`: StrataFlux-W's tuner on this machine (issue 20;
 * the search is refine/tune.h). It measures, and records in the .refine's
 * manifest for this platform (docs/trdc.md 2.6), the refinement
 * configuration with the lowest KL whose decode slowdown stays within the
 * budget: the budgets k per set, the MLP mode (channel-wise, or
 * neuron-wise with kn when the .refine holds neuron bundles and the
 * backend runs them) and, on cuda, the schedule (thread blocks, fetch lag
 * and lead). A dimension the backend refuses (SPX_ERR_UNSUPPORTED when it
 * is set: neuron mode or fetch lead on cuda today) is probed once before
 * the search and left out with a note.
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
 * thread pool: two would compete for the cores. The base of a slowdown
 * pair keeps the candidate's MLP mode and schedule with every budget 0
 * (k = 0 returns before the schedule matters), so switching between them
 * never attaches again. */
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
               CLI_EVAL_SCORE_LAST_USAGE
               "                  (the KL over those positions, the reference fed the same way)\n"
               "  --tokens N      decoded tokens per timed run (int 8..65536; default 64)\n"
               "  --rounds R      base/candidate rounds per slowdown measurement (int 1..100; default 5)\n"
               "  --max-trials T  greedy raises measured at most (int 1..%d; default %d); the choice is then\n"
               "                  measured again, falling back along the kept ones until one confirms\n"
               "  --ladder LIST   budgets tried, ascending from 0 (default 0,1,2,4,8,...,768,1024); values at or\n"
               "                  above the widest refined input (all its channels) count once, as that width\n"
               "  --backend B     cpu (default) or cuda (the platform key's first part)\n"
               "  --search-mlp M  MLP modes searched: channel, neuron or both (default both when the .refine has\n"
               "                  neuron bundles, compress --refine-bundles, and the backend runs them; else channel)\n"
               "  --search-blocks LIST  cuda: refinement thread blocks tried, chosen by speed before the budgets\n"
               "                  (ints 1..4096; default 8,16,32,64; cpu: not searched)\n"
               "  --search-lag LIST   cuda: fetch lags tried, in blocks (0, 0.5, 1, 1.5, 2; default all; cpu: 0)\n"
               "  --search-lead LIST  cuda: fetch leads tried, in blocks (as --search-lag; default all; a backend\n"
               "                  that refuses fetch lead has it left out with a note)\n"
               "  --kv TYPE       KV cache storage: f32, f16 or q4 (default f16)\n"
               "                  or the low-bit k2v2, k3v2, k3v3, k4v4 (docs/kv.md)\n" CLI_KV_USAGE
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
    spx_refine_config applied; /* the mode and schedule the model runs now */
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

/* c on the model: budgets always, mode and schedule when they change
 * (a change may attach again on a device backend) */
static spx_status set_k(tune_ctx *t, const spx_refine_config *c, spx_err *e) {
    if (c->mlp != t->applied.mlp || c->kn != t->applied.kn) {
        SPX_TRY(spx_refine_set_mlp(t->m, c->mlp, c->kn, e));
        t->applied.mlp = c->mlp;
        t->applied.kn = c->kn;
    }
    if (c->blocks != t->applied.blocks || c->lag != t->applied.lag || c->lead != t->applied.lead) {
        SPX_TRY(spx_refine_set_schedule(t->m, c->blocks, c->lag, c->lead, e));
        t->applied.blocks = c->blocks;
        t->applied.lag = c->lag;
        t->applied.lead = c->lead;
    }
    return spx_refine_set_budget(t->m, c->k, e);
}

static int32_t next_token(tune_ctx *t) {
    t->rng = t->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((t->rng >> 33) % (uint64_t)t->V);
}

static spx_status measure_slowdown(void *user, const spx_refine_config *c, double *out, spx_err *e) {
    tune_ctx *t = user;
    spx_refine_config base = spx_refine_config_common(c, 0); /* the candidate's mode and schedule, budgets 0 */
    base.kn = 0;
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
    const int64_t lo = eval_windows_lo(&t->w); /* logits rows: positions lo .. ctx-1 */
    for (int64_t k = 0; k < t->w.chunks; k++) {
        int64_t first, count;
        eval_windows_get(&t->w, k, t->in, &first, &count, t->tg);
        if (eval_window(t->s, t->m, t->in, t->ctx, lo, t->logits) != SPX_OK)
            return spx_fail(e, SPX_ERR_INTERNAL, "%s", spx_session_error(t->s));
        for (int64_t i = 0; i < count; i++) {
            const float *a = t->ref_logits + (size_t)(k * t->count + i) * (size_t)t->V;
            eval_logprob(a, t->V, t->tg[i], t->pr);
            sum += eval_kl_row(t->pr, eval_argmax(a, t->V), t->logits + (first - lo + i) * t->V, t->V, t->tg[i], t->pm, &nll,
                               &same);
            n++;
        }
    }
    *out = sum / (double)n;
    return SPX_OK;
}

static const char *phase_name(spx_tune_phase p) {
    return p == SPX_TUNE_BASE ? "base" : p == SPX_TUNE_COMMON ? "common" : p == SPX_TUNE_GREEDY ? "greedy"
           : p == SPX_TUNE_SCHEDULE ? "blocks" : "confirm";
}

/* the search's lines that announce a kept configuration (no measurement of their own) */
static int is_summary(const spx_tune_trial *tr) {
    return ((tr->phase == SPX_TUNE_COMMON || tr->phase == SPX_TUNE_GREEDY) && tr->kept && !isnan(tr->kl)) ||
           (tr->phase == SPX_TUNE_SCHEDULE && tr->kept);
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
    char k[128]; /* progress on stderr, --json or not (the JSON is stdout's) */
    spx_refine_config_str(&tr->c, k, sizeof k);
    if (tr->phase == SPX_TUNE_BASE) fprintf(stderr, "tune: base              KL %.5f\n", tr->kl);
    else if (tr->phase == SPX_TUNE_SCHEDULE && tr->kept)
        fprintf(stderr, "tune: %-6s %-26s <- the fastest block count at this budget, used from here on\n",
                phase_name(tr->phase), k);
    else if (is_summary(tr))
        fprintf(stderr, "tune: %-6s %-26s KL %.5f  <- %s\n", phase_name(tr->phase), k, tr->kl,
                tr->phase == SPX_TUNE_COMMON ? "largest feasible common k" : "raise kept");
    else {
        fprintf(stderr, "tune: %-6s %-26s slowdown %6.2f%% (%.1f -> %.1f tokens/s) %s", phase_name(tr->phase), k,
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
    if (!eval_windows_init(&t->w, ref, o->file, o->ctx, o->chunks, o->skip, o->compat, o->score_last)) return 0;
    const int64_t lo = eval_windows_lo(&t->w);
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
        /* fed as the candidates are (eval_window; the reference has no refinement: one prompt at lo 0) */
        if (eval_window(sr, ref, t->in, t->ctx, lo, t->logits) != SPX_OK) {
            cli_error("%s", spx_session_error(sr));
            ok = 0;
            break;
        }
        memcpy(t->ref_logits + (size_t)(k * count) * (size_t)t->V, t->logits + (first - lo) * t->V,
               (size_t)count * (size_t)t->V * sizeof(float));
    }
    spx_session_free(sr);
    return ok;
}

/* the configuration's fields as JSON members, after a "k" array */
static void json_config(const spx_refine_config *c) {
    printf("\"k\": [%lld, %lld, %lld, %lld], \"mlp\": \"%s\", \"kn\": %lld, \"cuda_blocks\": %d, \"cuda_lag\": %d, "
           "\"cuda_lead\": %d", (long long)c->k[0], (long long)c->k[1], (long long)c->k[2], (long long)c->k[3],
           c->mlp == SPX_REFINE_MLP_NEURON ? "neuron" : "channel", (long long)c->kn, (int)c->blocks, (int)c->lag,
           (int)c->lead);
}

static void print_result(const tune_ctx *t, const spx_tune_result *r, double budget, const char *platform,
                         const char *written, const char *windows) {
    char k[128];
    if (t->json) {
        printf("{\"platform\": \"%s\", \"budget\": %.6g, ", platform, budget);
        json_config(&r->best);
        printf(", \"slowdown\": %.6f, \"kl\": %.6f, \"kl_base\": %.6f, \"windows\": \"%s\", \"written\": %s, "
               "\"measurements\": {\"slowdown\": %d, \"kl\": %d}, \"trials\": [",
               r->slowdown, r->kl, r->kl_base, windows, written ? "true" : "false", (int)r->n_slowdown, (int)r->n_kl);
        for (int i = 0, n = 0; i < t->n_trials; i++) {
            const spx_tune_trial *tr = &t->trials[i];
            if (is_summary(tr)) continue;
            printf("%s{\"phase\": \"%s\", ", n++ ? ", " : "", phase_name(tr->phase));
            json_config(&tr->c);
            if (!isnan(tr->slowdown) && tr->phase != SPX_TUNE_BASE)
                printf(", \"slowdown\": %.6f, \"tps_base\": %.3f, \"tps\": %.3f, \"feasible\": %s", tr->slowdown,
                       t->trial_tps[i][0], t->trial_tps[i][1], tr->feasible ? "true" : "false");
            if (!isnan(tr->kl)) printf(", \"kl\": %.6f", tr->kl);
            printf("}");
        }
        printf("]}\n");
        return;
    }
    printf("%-7s %-40s %10s %12s %12s %10s\n", "phase", "configuration", "slowdown", "base tok/s", "cand tok/s",
           "mean KL");
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
        printf("%-7s %-40s %10s %12s %12s %10s\n", phase_name(tr->phase), k, sd, b, c, kl);
    }
    spx_refine_config_str(&r->best, k, sizeof k);
    printf("(* over the %g%% budget)\ntuned for %s, budget %g%%: %s, measured slowdown %.2f%%, KL %.5f (base %.5f) "
           "on %s; %d slowdown and %d KL measurements\n",
           100 * budget, platform, 100 * budget, k, 100 * r->slowdown, r->kl, r->kl_base, windows, (int)r->n_slowdown,
           (int)r->n_kl);
    if (written) printf("written to %s\n", written);
    else printf("not written (--no-write)\n");
}

/* "0,0.5,1" (blocks, by halves) into half-blocks 0..4 */
static int parse_halves(const char *flag, const char *v, int32_t *out, size_t *n) {
    *n = 0;
    for (const char *p = v; *p && *n < 5;) {
        char *end;
        double x = strtod(p, &end);
        if (end == p || x < 0 || x > 2 || x * 2 != (double)(int)(x * 2) || (*end && *end != ',')) break;
        for (size_t i = 0; i < *n; i++)
            if (out[i] == (int32_t)(x * 2)) goto bad;
        out[(*n)++] = (int32_t)(x * 2);
        p = *end ? end + 1 : end;
        if (!*p) return 1;
    }
bad:
    cli_error("%s '%s': expected a list of distinct distances in blocks, each 0, 0.5, 1, 1.5 or 2", flag, v);
    return 0;
}

/* "8,16,32" into block counts 1..4096 */
static int parse_blocks(const char *v, int32_t *out, size_t *n) {
    int32_t *ids = cli_parse_ids(v, "--search-blocks", 0, n);
    if (!ids) return 0;
    int ok = *n >= 1 && *n <= SPX_TUNE_MAX_BLOCKS;
    for (size_t i = 0; i < *n && ok; i++) ok = ids[i] >= 1 && ids[i] <= 4096 && (out[i] = ids[i]);
    free(ids);
    if (!ok) cli_error("--search-blocks '%s': expected 1..%d block counts, each 1..4096", v, SPX_TUNE_MAX_BLOCKS);
    return ok;
}

/* Drops a dimension the backend refuses: sets it (set: 1 to try, 0 to
 * restore) and returns 1 when it runs, 0 (with a note) when the backend
 * answers SPX_ERR_UNSUPPORTED, -1 on another error (printed). */
static int probe(tune_ctx *t, const char *what, int neuron) {
    spx_err e;
    spx_err_clear(&e);
    spx_status st = neuron ? spx_refine_set_mlp(t->m, SPX_REFINE_MLP_NEURON, 1, &e)
                           : spx_refine_set_schedule(t->m, 0, 0, 1, &e);
    if (st == SPX_ERR_UNSUPPORTED) {
        fprintf(stderr, "tune: %s not searched: %s\n", what, e.msg);
        return 0;
    }
    if (st != SPX_OK) {
        cli_fail(&e);
        return -1;
    }
    st = neuron ? spx_refine_set_mlp(t->m, SPX_REFINE_MLP_CHANNEL, 0, &e) : spx_refine_set_schedule(t->m, 0, 0, 0, &e);
    if (st != SPX_OK) {
        cli_fail(&e);
        return -1;
    }
    return 1;
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
    const char *search_mlp = NULL;
    int32_t blocks[SPX_TUNE_MAX_BLOCKS] = {8, 16, 32, 64}, lags[5] = {0, 1, 2, 3, 4}, leads[5] = {0, 1, 2, 3, 4};
    size_t n_blocks = 4, n_lags = 5, n_leads = 5;
    int given_blocks = 0, given_lags = 0, given_leads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--refine-k") || !strcmp(a, "--refine-tuned") || !strcmp(a, "--refine-mlp") ||
            !strcmp(a, "--refine-kn") || !strcmp(a, "--refine-blocks") || !strcmp(a, "--refine-lag") ||
            !strcmp(a, "--refine-lead")) {
            cli_error("tune: %s is what tune chooses; it takes the tier options only (--refine-cache, --refine-miss, "
                      "--refine-loaders; restrict the search with --search-mlp, --search-blocks, --search-lag, "
                      "--search-lead)", a);
            return 2;
        }
        if (!strcmp(a, "--backend") && i + 1 < argc && strcmp(argv[i + 1], "cpu") && strcmp(argv[i + 1], "cuda")) {
            cli_error("tune: --backend %s: expected cpu or cuda (the platform key names the backend)", argv[i + 1]);
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
        else if (!strcmp(a, "--search-mlp")) {
            if (strcmp(v, "channel") && strcmp(v, "neuron") && strcmp(v, "both")) {
                cli_error("--search-mlp '%s': expected channel, neuron or both", v);
                return 2;
            }
            search_mlp = v;
        }
        else if (!strcmp(a, "--search-blocks")) { if (!parse_blocks(v, blocks, &n_blocks)) return 2; given_blocks = 1; }
        else if (!strcmp(a, "--search-lag")) { if (!parse_halves(a, v, lags, &n_lags)) return 2; given_lags = 1; }
        else if (!strcmp(a, "--search-lead")) { if (!parse_halves(a, v, leads, &n_leads)) return 2; given_leads = 1; }
        else { cli_error("tune: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (!cli_kv_check(o.kv, &o.kvx)) return 2;
    if (!model || !rp.path || !ref || !o.file) {
        cli_error("tune: -m MODEL, --refine FILE, --ref SRC and -f TEXT are required");
        usage(stderr);
        return 2;
    }
    if (!cli_eval_check(&o, "tune")) return 2;
    const int cuda = o.backend && !strcmp(o.backend, "cuda");
    if (!cuda && (given_blocks || (given_lags && (n_lags > 1 || lags[0])) || (given_leads && (n_leads > 1 || leads[0])))) {
        cli_error("tune: --search-blocks, --search-lag and --search-lead are the cuda schedule (--backend cuda); the cpu "
                  "has none");
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
    char platform[256], windows[256], k[128];
    if (!cuda) n_blocks = 0, n_lags = n_leads = 1, lags[0] = leads[0] = 0;
    if (!(t.m = cli_open_model_on(model, o.threads, cuda ? "cuda" : "cpu"))) goto done;
    rp.tuned = -1; /* tuning starts from nothing */
    for (int s = 0; s < 4; s++) rp.k[s] = 0;
    rp.mlp = SPX_REFINE_MLP_CHANNEL;
    rp.kn = -1;
    rp.cuda_blocks = rp.cuda_lag = rp.cuda_lead = 0;
    if (!cli_apply_refine(t.m, &rp)) goto done;
    /* the modes the backend runs: neuron mode where there are bundles, lead
     * where the backend has it (each probed once) */
    spx_refine_info ri;
    spx_model_refine_info(t.m, &ri);
    int mlps[2] = {SPX_REFINE_MLP_CHANNEL, SPX_REFINE_MLP_NEURON}, n_mlps = 1;
    if (search_mlp && !strcmp(search_mlp, "neuron")) mlps[0] = SPX_REFINE_MLP_NEURON;
    const int want_neuron = search_mlp ? strcmp(search_mlp, "channel") != 0 : ri.n_bundle_layers > 0;
    if (want_neuron && ri.n_bundle_layers == 0) {
        cli_error("tune: --search-mlp %s: %s has no neuron bundles (write them with spectra compress --refine OUT "
                  "--refine-bundles)", search_mlp, rp.path);
        goto done;
    }
    if (want_neuron) {
        const int r = probe(&t, "neuron-wise MLP refinement", 1);
        if (r < 0) goto done;
        if (r == 0 && search_mlp && !strcmp(search_mlp, "neuron")) {
            cli_error("tune: --search-mlp neuron: the %s backend does not run it", cuda ? "cuda" : "cpu");
            goto done;
        }
        if (r == 0) mlps[0] = SPX_REFINE_MLP_CHANNEL, n_mlps = 1;
        else n_mlps = search_mlp && !strcmp(search_mlp, "neuron") ? 1 : 2;
    }
    int any_lead = 0;
    for (size_t i = 0; i < n_leads; i++) any_lead |= leads[i] > 0;
    if (any_lead) {
        const int r = probe(&t, "fetch lead", 0);
        if (r < 0) goto done;
        if (r == 0) n_leads = 1, leads[0] = 0;
    }
    spx_refine_config modes[SPX_TUNE_MAX_MODES];
    size_t n_modes = 0;
    for (size_t d = 0; d < n_leads; d++) /* lead outermost: a change of it attaches again */
        for (size_t g = 0; g < n_lags; g++)
            for (int u = 0; u < n_mlps; u++)
                modes[n_modes++] = (spx_refine_config){.mlp = mlps[u], .lag = lags[g], .lead = leads[d],
                                                       .blocks = n_blocks == 1 ? blocks[0] : 0};
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
    cli_kv_apply(&o.kvx, &sp);
    if (spx_session_new(t.m, &sp, &t.s) != SPX_OK) { cli_error("%s", spx_model_error(t.m)); goto done; }
    char last[64] = ""; /* the text unchanged without --score-last */
    if (o.score_last) snprintf(last, sizeof last, ", last %lld scored one token at a time", (long long)o.score_last);
    snprintf(windows, sizeof windows, "%.150s: %lld windows of %lld from window %lld%s%s", o.file,
             (long long)t.w.chunks, (long long)o.ctx, (long long)o.skip, o.compat ? ", llama-compat" : "", last);
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
    spx_tune_params tp = {.budget = budget, .ladder = ladder, .n_ladder = n_ladder, .modes = modes,
                          .n_modes = n_modes, .blocks = blocks, .n_blocks = n_blocks, .max_trials = (int32_t)max_trials};
    fprintf(stderr, "tune: %zu mode%s (MLP %s%s", n_modes, n_modes == 1 ? "" : "s",
            n_mlps == 2 ? "channel and neuron" : mlps[0] == SPX_REFINE_MLP_NEURON ? "neuron" : "channel",
            cuda ? "" : ")");
    if (cuda) fprintf(stderr, ", %zu lag%s, %zu lead%s), %zu block count%s\n", n_lags, n_lags == 1 ? "" : "s",
                      n_leads, n_leads == 1 ? "" : "s", n_blocks, n_blocks == 1 ? "" : "s");
    else fputc('\n', stderr);
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
        en.mlp = res.best.mlp;
        en.kn = res.best.mlp == SPX_REFINE_MLP_NEURON ? res.best.kn : 0;
        en.cuda_blocks = res.best.blocks;
        en.cuda_lag = res.best.lag;
        en.cuda_lead = res.best.lead;
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
