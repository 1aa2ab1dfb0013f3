/* cmd_bench.c: `spectra bench -m MODEL [-p 512] [-n 128] [-r 5]`: prompt
 * (prefill) and generation tokens/s, median with min..max over r runs,
 * weight bytes read per generated token and the achieved GB/s. Random
 * token ids (seeded), so any model works, with or without a tokenizer. */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "engine/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra bench -m MODEL [options]\n"
               "  -m MODEL        Hugging Face folder or .trdc file\n"
               "  -p N            prompt tokens per run (int >= 0; default 512; 0 skips the prompt test)\n"
               "  -n N            generated tokens per run (int >= 0; default 128)\n"
               "  -r N            runs (int 1..100; default 5)\n"
               "  --kv TYPE       KV cache storage: f32, f16 or q4 (default f16)\n"
               "  --threads N     worker threads (int, 1..1024; default: all CPUs)\n"
               "  --backend B     cpu, cuda or auto (auto: cuda if built in and a GPU is present; default cpu)\n"
               "  --json          print one JSON object\n");
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int cmd_bench(int argc, char **argv) {
    const char *model = NULL;
    int64_t np = 512, ng = 128, reps = 5, threads = 0;
    const char *backend = NULL;
    spx_kv_type kv = SPX_KV_F16;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-p")) { if (!cli_int(a, v, 0, 1 << 20, &np)) return 2; }
        else if (!strcmp(a, "-n")) { if (!cli_int(a, v, 0, 1 << 20, &ng)) return 2; }
        else if (!strcmp(a, "-r")) { if (!cli_int(a, v, 1, 100, &reps)) return 2; }
        else if (!strcmp(a, "--kv")) { if (!cli_kv(v, &kv)) return 2; }
        else if (!strcmp(a, "--backend")) { if (!cli_backend(v)) return 2; backend = v; }
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) { if (!cli_int(a, v, 1, 1024, &threads)) return 2; }
        else { cli_error("bench: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (np + ng == 0) { cli_error("bench: nothing to do (-p 0 -n 0)"); return 2; }
    spx_model *m = cli_open_model_on(model, threads, backend);
    if (!m) return 1;
    int rc = 1;
    int64_t V = spx_model_vocab_size(m);
    spx_session *s = NULL;
    spx_session_params sp = {.n_ctx = np + ng + 1, .kv = kv};
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t *ids = malloc((size_t)(np + 1) * sizeof *ids);
    double *pp = calloc((size_t)reps, sizeof *pp), *tg = calloc((size_t)reps, sizeof *tg);
    if (!logits || !ids || !pp || !tg) { cli_error("out of memory"); goto done; }
    if (spx_session_new(m, &sp, &s) != SPX_OK) { cli_error("%s", spx_model_error(m)); goto done; }
    uint64_t rng = 1234;
    /* warm-up: fault in every weight page once, outside the timings */
    int32_t w0 = 1 % (int32_t)V;
    if (spx_session_eval(s, &w0, 1, logits, 0) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
    if (ng > 0 && spx_session_step_greedy(s, w0, &w0) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
    for (int64_t r = 0; r < reps; r++) {
        for (int64_t i = 0; i < np + 1; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((rng >> 33) % (uint64_t)V);
        }
        spx_session_reset(s);
        if (np > 0) {
            double t0 = spx_now();
            if (spx_session_eval(s, ids, (size_t)np, logits, 0) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
            pp[r] = (double)np / (spx_now() - t0);
        }
        spx_session_reset(s); /* generation from a short context, as llama-bench tg */
        if (ng > 0) {
            int32_t id = ids[np];
            double t0 = spx_now();
            for (int64_t i = 0; i < ng; i++) /* greedy: on a GPU only the id crosses to the host */
                if (spx_session_step_greedy(s, id, &id) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
            tg[r] = (double)ng / (spx_now() - t0);
        }
        if (!json) fprintf(stderr, "\rrun %lld/%lld", (long long)(r + 1), (long long)reps);
    }
    if (!json) fputc('\n', stderr);
    qsort(pp, (size_t)reps, sizeof *pp, cmp);
    qsort(tg, (size_t)reps, sizeof *tg, cmp);
    double ppm = pp[reps / 2], tgm = tg[reps / 2];
    uint64_t bpt = spx_model_bytes_per_token(m);
    double gbs = (double)bpt * tgm / 1e9;
    const char *kvn = kv == SPX_KV_F32 ? "f32" : kv == SPX_KV_Q4 ? "q4" : "f16";
    if (json) {
        printf("{\"model\": \"%s\", \"backend\": \"%s\", \"threads\": %d, \"kv\": \"%s\", \"n_prompt\": %lld, \"n_gen\": %lld, \"runs\": %lld, "
               "\"pp_tps_median\": %.3f, \"pp_tps_min\": %.3f, \"pp_tps_max\": %.3f, "
               "\"tg_tps_median\": %.3f, \"tg_tps_min\": %.3f, \"tg_tps_max\": %.3f, "
               "\"weight_bytes_per_token\": %llu, \"tg_gbps\": %.3f, \"kv_bytes_per_token\": %zu}\n",
               model, spx_model_backend(m), spx_pool_size(m->pool), kvn, (long long)np, (long long)ng, (long long)reps, ppm, pp[0],
               pp[reps - 1], tgm, tg[0], tg[reps - 1], (unsigned long long)bpt, gbs,
               spx_kv_bytes_per_token(s->kv.type, m->cfg.n_layers, m->cfg.n_kv_heads * m->cfg.head_dim));
    } else {
        printf("model %s, backend %s, %d threads, kv %s, %lld runs\n", model, spx_model_backend(m), spx_pool_size(m->pool),
               kvn, (long long)reps);
        if (np) printf("  pp%-6lld %9.2f tokens/s  (min %.2f, max %.2f)\n", (long long)np, ppm, pp[0], pp[reps - 1]);
        if (ng)
            printf("  tg%-6lld %9.2f tokens/s  (min %.2f, max %.2f)\n  weights read per token: %.1f MB -> %.2f GB/s\n",
                   (long long)ng, tgm, tg[0], tg[reps - 1], (double)bpt / 1e6, gbs);
    }
    rc = 0;
done:
    free(logits); free(ids); free(pp); free(tg);
    spx_session_free(s);
    spx_model_free(m);
    return rc;
}
