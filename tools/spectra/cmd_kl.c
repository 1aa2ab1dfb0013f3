/* cmd_kl.c: `spectra kl -m MODEL --ref REF -f TEXT [--ctx N] [--chunks C]
 * [--llama-compat | --score-last L]`: over the windows of windows.h, the
 * PPL of both models, mean KL(ref || model) with its 99th percentile, and
 * top-1 agreement, as llama-perplexity --kl-divergence reports them. The
 * reference and every model are fed each window the same way
 * (eval_window with the same lo), so all of them are scored on the same
 * positions under the same protocol. */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "windows.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra kl -m MODEL --ref REF -f TEXT [options]\n"
               "  -m MODEL        model under test (HF folder or .trdc); repeat for up to 8 models,\n"
               "                  all compared against one evaluation of the reference\n"
               "  --ref REF       reference model (HF folder or .trdc) with the same vocabulary\n"
               "  -f TEXT         UTF-8 text file (tokenized with the reference's tokenizer)\n"
               "  --ctx N         window length (int >= 2; default 512)\n"
               "  --chunks C      number of windows (int >= 1; default: all that fit)\n" CLI_EVAL_SKIP_USAGE
               "  --llama-compat  llama-perplexity's windows (BOS per window, second half scored)\n"
               CLI_EVAL_SCORE_LAST_USAGE
               "                  (the reference and the models alike)\n"
               "  --kv TYPE       KV cache storage of the models: f32, f16, q4 (Group-32 4-bit) or the low-bit k2v2,\n"
               "                  k3v2, k3v3, k4v4 (key/value bits; default f16)\n" CLI_KV_USAGE
               "  --ref-kv TYPE   the reference's KV cache (default f32: exact)\n"
            "  --threads N     worker threads (int, 1..1024; default: all CPUs)\n"
               "  --backend B     for the models under test (the reference runs on cpu): cpu, cuda or auto\n"
               "                  (auto: cuda if built in and a GPU is present; default cpu)\n"
               "  --json          print the result as JSON\n"
               "refinement options apply to the -m before them (the same file may be given twice, with and\n"
               "without, to compare in one run):\n" CLI_REFINE_USAGE);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define KL_MAX_MODELS 8

typedef struct {
    const char *path;
    spx_refine_params refine;
    char label[160];
    spx_model *m;
    spx_session *s;
    float *logits;
    double *kls;
    double nll, kl_sum;
    int64_t same;
} kl_model;

int cmd_kl(int argc, char **argv) {
    const char *ref = NULL;
    kl_model ms[KL_MAX_MODELS];
    int nm = 0;
    memset(ms, 0, sizeof ms);
    cli_eval_opts o = CLI_EVAL_OPTS_DEFAULT;
    spx_kv_type ref_kv = SPX_KV_F32; /* the reference is exact unless --ref-kv */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        int r = cli_eval_opt(argc, argv, &i, &o);
        if (!r && !strncmp(a, "--refine", 8)) {
            if (nm == 0) { cli_error("kl: %s comes after the -m it applies to", a); return 2; }
            r = cli_refine_opt(argc, argv, &i, &ms[nm - 1].refine);
        }
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(a, "--ref-kv")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_kv(v, &ref_kv)) return 2;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--ref")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "--ref")) ref = v;
            else if (nm == KL_MAX_MODELS) { cli_error("kl: at most %d models", KL_MAX_MODELS); return 2; }
            else {
                cli_refine_defaults(&ms[nm].refine);
                ms[nm++].path = v;
            }
        } else { cli_error("kl: unknown option '%s'", a); usage(stderr); return 2; }
    }
    const char *file = o.file, *backend = o.backend;
    const int64_t ctx = o.ctx, chunks = o.chunks, threads = o.threads;
    const spx_kv_type kv = o.kv;
    const int compat = o.compat, json = o.json;
    if (!cli_kv_check(kv, &o.kvx)) return 2;
    if (!file || !ref || nm == 0) { cli_error("kl: -m MODEL, --ref REF and -f TEXT are required"); usage(stderr); return 2; }
    if (!cli_eval_check(&o, "kl")) return 2;
    int rc = 1;
    eval_windows w = {0};
    spx_session *sr = NULL;
    float *lr = NULL;
    double *pr = NULL, *pm = NULL;
    int32_t *in = NULL, *tg = NULL;
    spx_model *mr = cli_open_model(ref, threads);
    if (!mr) return 1;
    int64_t V = spx_model_vocab_size(mr);
    for (int k = 0; k < nm; k++) {
        if (!(ms[k].m = cli_open_model_on(ms[k].path, threads, backend))) goto done;
        if (!cli_apply_refine(ms[k].m, &ms[k].refine)) goto done;
        spx_refine_info ri;
        spx_model_refine_info(ms[k].m, &ri);
        if (ri.active) {
            char kn[40] = "";
            if (ri.mlp == SPX_REFINE_MLP_NEURON) snprintf(kn, sizeof kn, " neuron kn %lld", (long long)ri.kn);
            snprintf(ms[k].label, sizeof ms[k].label, "%s +refine k %lld,%lld,%lld,%lld%s%s", ms[k].path,
                     (long long)ri.k[0], (long long)ri.k[1], (long long)ri.k[2], (long long)ri.k[3], kn,
                     ri.on_disk ? " disk" : "");
        }
        else snprintf(ms[k].label, sizeof ms[k].label, "%s", ms[k].path);
        if (spx_model_vocab_size(ms[k].m) != V) {
            cli_error("kl: vocabularies differ (%s: %lld, %s: %lld)", ref, (long long)V, ms[k].path,
                      (long long)spx_model_vocab_size(ms[k].m));
            goto done;
        }
    }
    if (!eval_windows_init(&w, mr, file, ctx, chunks, o.skip, compat, o.score_last)) goto done;
    const int64_t lo = eval_windows_lo(&w), rows = ctx - lo; /* logits rows: positions lo .. ctx-1 */
    spx_session_params sp = {.n_ctx = ctx, .kv = kv};
    spx_session_params spr = {.n_ctx = ctx, .kv = ref_kv};
    cli_kv_apply(&o.kvx, &sp);
    lr = malloc((size_t)rows * (size_t)V * sizeof(float));
    pr = malloc((size_t)V * sizeof(double));
    pm = malloc((size_t)V * sizeof(double));
    in = malloc((size_t)ctx * sizeof *in);
    tg = malloc((size_t)ctx * sizeof *tg);
    if (!lr || !pr || !pm || !in || !tg) { cli_error("out of memory"); goto done; }
    if (spx_session_new(mr, &spr, &sr) != SPX_OK) { cli_error("%s", spx_model_error(mr)); goto done; }
    for (int k = 0; k < nm; k++) {
        ms[k].logits = malloc((size_t)rows * (size_t)V * sizeof(float));
        ms[k].kls = malloc((size_t)(w.chunks * ctx) * sizeof(double));
        if (!ms[k].logits || !ms[k].kls) { cli_error("out of memory"); goto done; }
        if (spx_session_new(ms[k].m, &sp, &ms[k].s) != SPX_OK) { cli_error("%s", spx_model_error(ms[k].m)); goto done; }
    }
    double nll_r = 0, t0 = spx_now();
    int64_t scored = 0;
    for (int64_t c = 0; c < w.chunks; c++) {
        int64_t first, count;
        eval_windows_get(&w, c, in, &first, &count, tg);
        /* the reference (no refinement): one prompt at lo 0, as before --score-last */
        if (eval_window(sr, mr, in, ctx, lo, lr) != SPX_OK) { cli_error("%s", spx_session_error(sr)); goto done; }
        for (int k = 0; k < nm; k++) {
            if (eval_window(ms[k].s, ms[k].m, in, ctx, lo, ms[k].logits) != SPX_OK) {
                cli_error("%s", spx_session_error(ms[k].s));
                goto done;
            }
        }
        for (int64_t i = 0; i < count; i++) {
            const float *a = lr + (first - lo + i) * V;
            nll_r -= eval_logprob(a, V, tg[i], pr);
            int32_t top_r = eval_argmax(a, V);
            for (int k = 0; k < nm; k++) {
                const float *b = ms[k].logits + (first - lo + i) * V;
                ms[k].kls[scored + i] = eval_kl_row(pr, top_r, b, V, tg[i], pm, &ms[k].nll, &ms[k].same);
                ms[k].kl_sum += ms[k].kls[scored + i];
            }
        }
        scored += count;
        if (!json) {
            fprintf(stderr, "\r[%lld/%lld] ref PPL %.4f", (long long)(c + 1), (long long)w.chunks, exp(nll_r / (double)scored));
            for (int k = 0; k < nm; k++) fprintf(stderr, " | KL %.5f", ms[k].kl_sum / (double)scored);
            fflush(stderr);
        }
    }
    double secs = spx_now() - t0;
    if (!json) fprintf(stderr, "\n");
    char proto[128];
    cli_eval_protocol(&o, w.chunks, proto, sizeof proto);
    if (json) printf("{\"ref\": \"%s\", \"ppl_ref\": %.6f, \"tokens_scored\": %lld, \"ctx\": %lld, \"chunks\": %lld, "
                     "\"llama_compat\": %s, \"score_last\": %lld, \"seconds\": %.2f, \"models\": [",
                     ref, exp(nll_r / (double)scored), (long long)scored, (long long)ctx, (long long)w.chunks,
                     compat ? "true" : "false", (long long)o.score_last, secs);
    else printf("reference %s: PPL %.4f over %lld scored tokens (%s), %.1f s\n"
                "%-64s %10s %10s %10s %10s %8s\n", ref, exp(nll_r / (double)scored), (long long)scored,
                proto, secs, "model", "PPL", "mean KL", "median KL", "p99 KL", "top-1 %");
    for (int k = 0; k < nm; k++) {
        qsort(ms[k].kls, (size_t)scored, sizeof(double), cmp_double);
        double p99 = ms[k].kls[(size_t)floor(0.99 * (double)(scored - 1))], med = ms[k].kls[(size_t)(scored - 1) / 2];
        double mean = ms[k].kl_sum / (double)scored, top1 = (double)ms[k].same / (double)scored;
        double ppl = exp(ms[k].nll / (double)scored);
        if (json)
            printf("%s{\"model\": \"%s\", \"ppl\": %.6f, \"kl_mean\": %.6f, \"kl_median\": %.6f, \"kl_p99\": %.6f, "
                   "\"kl_max\": %.6f, \"top1\": %.6f}", k ? ", " : "", ms[k].label, ppl, mean, med, p99,
                   ms[k].kls[scored - 1], top1);
        else
            printf("%-64.64s %10.4f %10.6f %10.6f %10.6f %8.2f\n", ms[k].label, ppl, mean, med, p99, 100 * top1);
    }
    if (json) printf("]}\n");
    if (nm > 0) { /* on stderr, with --json too */
        fprintf(stderr, "models' ");
        cli_kv_summary(stderr, ms[0].s);
        fprintf(stderr, "reference's ");
        cli_kv_summary(stderr, sr);
    }
    rc = 0;
done:
    free(lr); free(pr); free(pm); free(in); free(tg);
    for (int k = 0; k < nm; k++) {
        free(ms[k].logits);
        free(ms[k].kls);
        spx_session_free(ms[k].s);
        spx_model_free(ms[k].m);
    }
    spx_session_free(sr);
    eval_windows_free(&w);
    spx_model_free(mr);
    return rc;
}
