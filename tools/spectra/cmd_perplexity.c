/* cmd_perplexity.c: `spectra perplexity -m MODEL -f TEXT [--ctx N]
 * [--chunks C] [--score-last L]`: PPL = exp(mean NLL) over the windows of
 * windows.h (their scored positions). */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "windows.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra perplexity -m MODEL -f TEXT [options]\n"
               "  -m MODEL        Hugging Face folder or .trdc file\n"
               "  -f TEXT         UTF-8 text file\n"
               "  --ctx N         window length in tokens (int >= 2; default 512)\n"
               "  --chunks C      number of windows (int >= 1; default: all that fit)\n" CLI_EVAL_SKIP_USAGE
               "  --llama-compat  llama-perplexity's windows (BOS per window, second half scored)\n"
               CLI_EVAL_SCORE_LAST_USAGE
               "  --kv TYPE       KV cache storage: f32, f16, q4 (Group-32 4-bit) or the low-bit k2v2, k3v2, k3v3,\n"
               "                  k4v4 (key/value bits; default f16)\n" CLI_KV_USAGE
            "  --threads N     worker threads (int, 1..1024; default: all CPUs)\n"
               "  --backend B     cpu, cuda or auto (auto: cuda if built in and a GPU is present; default cpu)\n"
               "  --json          print the result as JSON\n" CLI_REFINE_USAGE
               "                  (with refinement, each window is fed one token per step, as generation runs;\n"
               "                  with --score-last its prompt part stays one prompt)\n");
}

int cmd_perplexity(int argc, char **argv) {
    const char *model = NULL;
    cli_eval_opts o = CLI_EVAL_OPTS_DEFAULT;
    spx_refine_params rp;
    cli_refine_defaults(&rp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        int r = cli_eval_opt(argc, argv, &i, &o);
        if (!r) r = cli_refine_opt(argc, argv, &i, &rp);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            model = v;
        } else { cli_error("perplexity: unknown option '%s'", a); usage(stderr); return 2; }
    }
    const char *file = o.file, *backend = o.backend;
    const int64_t ctx = o.ctx, chunks = o.chunks, threads = o.threads;
    const spx_kv_type kv = o.kv;
    const int compat = o.compat, json = o.json;
    if (!cli_kv_check(kv, &o.kvx)) return 2;
    if (!file) { cli_error("perplexity: -f TEXT is required"); usage(stderr); return 2; }
    if (!cli_eval_check(&o, "perplexity")) return 2;
    spx_model *m = cli_open_model_on(model, threads, backend);
    if (!m) return 1;
    if (!cli_apply_refine(m, &rp)) { spx_model_free(m); return 1; }
    eval_windows w;
    if (!eval_windows_init(&w, m, file, ctx, chunks, o.skip, compat, o.score_last)) {
        spx_model_free(m);
        return 1;
    }
    int64_t V = spx_model_vocab_size(m);
    const int64_t lo = eval_windows_lo(&w); /* logits rows: positions lo .. ctx-1 */
    int rc = 1;
    spx_session *s = NULL;
    spx_session_params sp = {.n_ctx = ctx, .kv = kv};
    float *logits = malloc((size_t)(ctx - lo) * (size_t)V * sizeof(float));
    int32_t *in = malloc((size_t)ctx * sizeof *in), *tg = malloc((size_t)ctx * sizeof *tg);
    if (!logits || !in || !tg) { cli_error("out of memory"); goto done; }
    cli_kv_apply(&o.kvx, &sp);
    if (spx_session_new(m, &sp, &s) != SPX_OK) { cli_error("%s", spx_model_error(m)); goto done; }
    double nll = 0, t0 = spx_now();
    int64_t scored = 0;
    for (int64_t k = 0; k < w.chunks; k++) {
        int64_t first, count;
        eval_windows_get(&w, k, in, &first, &count, tg);
        if (eval_window(s, m, in, ctx, lo, logits) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
        for (int64_t i = 0; i < count; i++) nll -= eval_logprob(logits + (first - lo + i) * V, V, tg[i], NULL);
        scored += count;
        if (!json) {
            fprintf(stderr, "\r[%lld/%lld] PPL %.4f  (%.1f tokens/s)", (long long)(k + 1), (long long)w.chunks,
                    exp(nll / (double)scored), (double)((k + 1) * ctx) / (spx_now() - t0));
            fflush(stderr);
        }
    }
    double ppl = exp(nll / (double)scored), secs = spx_now() - t0;
    char proto[128];
    cli_eval_protocol(&o, w.chunks, proto, sizeof proto);
    if (json) /* score_last 0: every position of the protocol scored */
        printf("{\"ppl\": %.6f, \"nll\": %.8f, \"tokens_scored\": %lld, \"ctx\": %lld, \"chunks\": %lld, "
               "\"score_last\": %lld, \"seconds\": %.3f}\n", ppl, nll / (double)scored, (long long)scored,
               (long long)ctx, (long long)w.chunks, (long long)o.score_last, secs);
    else
        printf("\nPPL = %.4f over %lld scored tokens (%s) in %.1f s\n", ppl, (long long)scored, proto, secs);
    if (!json) cli_refine_summary(stderr, m);
    cli_kv_summary(stderr, s); /* with --json too */
    rc = 0;
done:
    free(logits);
    free(in);
    free(tg);
    spx_session_free(s);
    eval_windows_free(&w);
    spx_model_free(m);
    return rc;
}
