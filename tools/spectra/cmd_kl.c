/* cmd_kl.c: `spectra kl -m MODEL --ref REF -f TEXT [--ctx N] [--chunks C]
 * [--llama-compat]`: over the windows of windows.h, the PPL of both models,
 * mean KL(ref || model) with its 99th percentile, and top-1 agreement, as
 * llama-perplexity --kl-divergence reports them. */
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
               "  -m MODEL        model under test (HF folder or .trdc)\n"
               "  --ref REF       reference model (HF folder or .trdc) with the same vocabulary\n"
               "  -f TEXT         UTF-8 text file (tokenized with the reference's tokenizer)\n"
               "  --ctx N         window length (int >= 2; default 512)\n"
               "  --chunks C      number of windows (int >= 1; default: all that fit)\n"
               "  --llama-compat  llama-perplexity's windows (BOS per window, second half scored)\n"
               "  --kv TYPE       KV cache storage: f32, f16 or q4 (Group-32 4-bit; default f16)\n"
            "  --threads N     worker threads (int, 1..1024; default: all CPUs)\n"
               "  --json          print the result as JSON\n");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

int cmd_kl(int argc, char **argv) {
    const char *model = NULL, *ref = NULL, *file = NULL;
    int64_t ctx = 512, chunks = 0, threads = 0;
    spx_kv_type kv = SPX_KV_F16;
    int compat = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--llama-compat")) compat = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--ref")) ref = v;
        else if (!strcmp(a, "-f")) file = v;
        else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) { if (!cli_int(a, v, 2, 1 << 20, &ctx)) return 2; }
        else if (!strcmp(a, "--chunks")) { if (!cli_int(a, v, 1, 1 << 30, &chunks)) return 2; }
        else if (!strcmp(a, "--kv")) { if (!cli_kv(v, &kv)) return 2; }
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) { if (!cli_int(a, v, 1, 1024, &threads)) return 2; }
        else { cli_error("kl: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (!file || !ref) { cli_error("kl: -f TEXT and --ref REF are required"); usage(stderr); return 2; }
    spx_model *mr = cli_open_model(ref, threads);
    if (!mr) return 1;
    spx_model *mm = cli_open_model(model, threads);
    if (!mm) { spx_model_free(mr); return 1; }
    int64_t V = spx_model_vocab_size(mr);
    if (spx_model_vocab_size(mm) != V) {
        cli_error("kl: vocabularies differ (%s: %lld, %s: %lld)", ref, (long long)V, model,
                  (long long)spx_model_vocab_size(mm));
        spx_model_free(mr);
        spx_model_free(mm);
        return 1;
    }
    eval_windows w;
    if (!eval_windows_init(&w, mr, file, ctx, chunks, compat)) { spx_model_free(mr); spx_model_free(mm); return 1; }
    int rc = 1;
    spx_session *sr = NULL, *sm = NULL;
    spx_session_params sp = {.n_ctx = ctx, .kv = kv};
    float *lr = malloc((size_t)ctx * (size_t)V * sizeof(float)), *lm = malloc((size_t)ctx * (size_t)V * sizeof(float));
    double *pr = malloc((size_t)V * sizeof(double)), *pm = malloc((size_t)V * sizeof(double));
    int32_t *in = malloc((size_t)ctx * sizeof *in), *tg = malloc((size_t)ctx * sizeof *tg);
    double *kls = malloc((size_t)(w.chunks * ctx) * sizeof(double));
    if (!lr || !lm || !pr || !pm || !in || !tg || !kls) { cli_error("out of memory"); goto done; }
    if (spx_session_new(mr, &sp, &sr) != SPX_OK) { cli_error("%s", spx_model_error(mr)); goto done; }
    if (spx_session_new(mm, &sp, &sm) != SPX_OK) { cli_error("%s", spx_model_error(mm)); goto done; }
    double nll_r = 0, nll_m = 0, kl_sum = 0, t0 = spx_now();
    int64_t scored = 0, same = 0;
    for (int64_t k = 0; k < w.chunks; k++) {
        int64_t first, count;
        eval_windows_get(&w, k, in, &first, &count, tg);
        spx_session_reset(sr);
        spx_session_reset(sm);
        if (spx_session_eval(sr, in, (size_t)ctx, lr, 1) != SPX_OK) { cli_error("%s", spx_session_error(sr)); goto done; }
        if (spx_session_eval(sm, in, (size_t)ctx, lm, 1) != SPX_OK) { cli_error("%s", spx_session_error(sm)); goto done; }
        for (int64_t i = 0; i < count; i++) {
            const float *a = lr + (first + i) * V, *b = lm + (first + i) * V;
            nll_r -= eval_logprob(a, V, tg[i], pr);
            nll_m -= eval_logprob(b, V, tg[i], pm);
            double kl = 0;
            for (int64_t v = 0; v < V; v++) kl += exp(pr[v]) * (pr[v] - pm[v]);
            kls[scored] = kl > 0 ? kl : 0; /* rounding can give -1e-12 */
            kl_sum += kls[scored];
            same += argmax(a, V) == argmax(b, V);
            scored++;
        }
        if (!json) {
            fprintf(stderr, "\r[%lld/%lld] mean KL %.5f  PPL %.4f / ref %.4f", (long long)(k + 1), (long long)w.chunks,
                    kl_sum / (double)scored, exp(nll_m / (double)scored), exp(nll_r / (double)scored));
            fflush(stderr);
        }
    }
    qsort(kls, (size_t)scored, sizeof *kls, cmp_double);
    double p99 = kls[(size_t)floor(0.99 * (double)(scored - 1))], median = kls[(size_t)(scored - 1) / 2];
    double mean = kl_sum / (double)scored, top1 = (double)same / (double)scored;
    double secs = spx_now() - t0;
    if (json)
        printf("{\"ppl\": %.6f, \"ppl_ref\": %.6f, \"kl_mean\": %.6f, \"kl_median\": %.6f, \"kl_p99\": %.6f, "
               "\"kl_max\": %.6f, \"top1\": %.6f, \"tokens_scored\": %lld, \"ctx\": %lld, \"chunks\": %lld, "
               "\"llama_compat\": %s, \"seconds\": %.2f}\n",
               exp(nll_m / (double)scored), exp(nll_r / (double)scored), mean, median, p99, kls[scored - 1], top1,
               (long long)scored, (long long)ctx, (long long)w.chunks, compat ? "true" : "false", secs);
    else
        printf("\nPPL %.4f (reference %.4f)\nmean KL %.6f  median %.6f  p99 %.6f  max %.6f\n"
               "top-1 agreement %.2f%%  over %lld scored tokens (%lld windows of %lld%s), %.1f s\n",
               exp(nll_m / (double)scored), exp(nll_r / (double)scored), mean, median, p99, kls[scored - 1],
               100 * top1, (long long)scored, (long long)w.chunks, (long long)ctx, compat ? ", llama-compat" : "",
               secs);
    rc = 0;
done:
    free(lr); free(lm); free(pr); free(pm); free(in); free(tg); free(kls);
    spx_session_free(sr);
    spx_session_free(sm);
    eval_windows_free(&w);
    spx_model_free(mr);
    spx_model_free(mm);
    return rc;
}
