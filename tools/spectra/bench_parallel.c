/* bench_parallel.c: `spectra bench --parallel B`: B sessions decoding at
 * once through spx_batch_step (one forward pass per step for all of them),
 * against one stream decoding alone, in the same runs.
 *
 * Per run: each of the B sessions is reset and fed its own -p random
 * prompt (untimed; -p 0: one token), then n batch steps (greedy) are
 * timed: total tokens/s = B n / seconds. Then session 0 alone is reset,
 * fed its prompt again and decodes n tokens by single steps (the decode
 * loop of `bench`): the single stream's tokens/s. Both measurements of a
 * run are taken back to back, so drift on a shared machine hits both; the
 * ratio printed is of the medians over the runs. */
#include "bench_parallel.h"
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "engine/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int prefill(spx_session *s, int64_t np, int64_t V, uint64_t *rng, int32_t *buf, int32_t *last) {
    spx_session_reset(s);
    int64_t n = np > 0 ? np : 1;
    for (int64_t i = 0; i <= n; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (int32_t)((*rng >> 33) % (uint64_t)V);
    }
    if (spx_session_eval(s, buf, (size_t)n, NULL, 0) != SPX_OK) {
        cli_error("%s", spx_session_error(s));
        return 0;
    }
    *last = buf[n];
    return 1;
}

int cli_bench_parallel(spx_model *m, const spx_session_params *sp, int64_t B, int64_t np, int64_t ng, int64_t reps,
                       int json, const char *model) {
    const int64_t V = spx_model_vocab_size(m);
    spx_session **ss = calloc((size_t)B, sizeof *ss);
    int32_t *ids = malloc((size_t)B * sizeof *ids), *buf = malloc((size_t)(np + 2) * sizeof *buf);
    double *tot = calloc((size_t)reps, sizeof *tot), *one = calloc((size_t)reps, sizeof *one);
    int rc = 1;
    if (!ss || !ids || !buf || !tot || !one) { cli_error("out of memory"); goto done; }
    for (int64_t i = 0; i < B; i++)
        if (spx_session_new(m, sp, &ss[i]) != SPX_OK) {
            cli_error("bench --parallel: session %lld of %lld: %s", (long long)i + 1, (long long)B, spx_model_error(m));
            goto done;
        }
    uint64_t rng = 1234;
    for (int64_t r = 0; r < reps; r++) {
        uint64_t r0 = rng; /* session 0's prompt, again for the single stream */
        for (int64_t i = 0; i < B; i++)
            if (!prefill(ss[i], np, V, &rng, buf, &ids[i])) goto done;
        double t0 = spx_now();
        for (int64_t k = 0; k < ng; k++)
            if (spx_batch_step(ss, (size_t)B, ids, NULL, NULL, ids, NULL) != SPX_OK) {
                cli_error("bench --parallel: %s", spx_session_error(ss[0]));
                goto done;
            }
        tot[r] = (double)(B * ng) / (spx_now() - t0);
        int32_t first;
        if (!prefill(ss[0], np, V, &r0, buf, &first) || !cli_decode_tps_here(ss[0], first, ng, &one[r])) goto done;
        if (!json) fprintf(stderr, "\rrun %lld/%lld", (long long)(r + 1), (long long)reps);
    }
    if (!json) fputc('\n', stderr);
    double *ts = malloc((size_t)reps * sizeof *ts), *os = malloc((size_t)reps * sizeof *os);
    if (!ts || !os) { free(ts); free(os); cli_error("out of memory"); goto done; }
    memcpy(ts, tot, (size_t)reps * sizeof *ts);
    memcpy(os, one, (size_t)reps * sizeof *os);
    qsort(ts, (size_t)reps, sizeof *ts, cmp);
    qsort(os, (size_t)reps, sizeof *os, cmp);
    double tm = ts[reps / 2], om = os[reps / 2];
    if (json) {
        printf("{\"model\": \"%s\", \"backend\": \"%s\", \"threads\": %d, \"kv\": \"%s\", \"parallel\": %lld, "
               "\"n_prompt\": %lld, \"n_gen\": %lld, \"runs\": %lld, \"total_tps_median\": %.3f, \"total_tps_min\": %.3f, "
               "\"total_tps_max\": %.3f, \"single_tps_median\": %.3f, \"single_tps_min\": %.3f, \"single_tps_max\": %.3f, "
               "\"total_over_single\": %.4f, \"total_tps\": [",
               model, spx_model_backend(m), spx_pool_size(m->pool), spx_kv_type_name(ss[0]->kv.type),
               (long long)B, (long long)np, (long long)ng, (long long)reps, tm, ts[0], ts[reps - 1], om, os[0],
               os[reps - 1], om > 0 ? tm / om : 0.0);
        for (int64_t r = 0; r < reps; r++) printf("%s%.3f", r ? ", " : "", tot[r]);
        printf("], \"single_tps\": [");
        for (int64_t r = 0; r < reps; r++) printf("%s%.3f", r ? ", " : "", one[r]);
        printf("]}\n");
    } else {
        printf("model %s, backend %s, %d threads, %lld sessions in parallel, prompts of %lld tokens, %lld runs\n", model,
               spx_model_backend(m), spx_pool_size(m->pool), (long long)B, (long long)(np > 0 ? np : 1), (long long)reps);
        printf("  tg%-6lld x %lld  %9.2f tokens/s in all  (min %.2f, max %.2f), %.2f per session\n", (long long)ng,
               (long long)B, tm, ts[0], ts[reps - 1], tm / (double)B);
        printf("  tg%-6lld x 1   %9.2f tokens/s alone   (min %.2f, max %.2f)\n", (long long)ng, om, os[0],
               os[reps - 1]);
        printf("  total / single stream: %.2fx (medians)\n", om > 0 ? tm / om : 0.0);
    }
    free(ts);
    free(os);
    rc = 0;
done:
    for (int64_t i = 0; ss && i < B; i++) spx_session_free(ss[i]);
    free(ss);
    free(ids);
    free(buf);
    free(tot);
    free(one);
    return rc;
}
