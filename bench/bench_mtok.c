/* bench_mtok.c: the cost of one forward pass over M tokens relative to
 * one token, at a fixed context: what a speculative verification of M - 1
 * draft tokens costs on this machine (docs/spec.md). Prints a table of
 * M, the median time over interleaved repetitions and its ratio to M = 1.
 *
 *   build/bench/bench_mtok MODEL [THREADS=2] [CONTEXT=512] [REPS=15]
 *
 * Each repetition runs every M in turn (all logits kept, as a
 * verification does), then truncates back to the context, so a slow
 * moment of a shared machine spreads over all M instead of one. */
#include "spectra.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_mtok MODEL [THREADS=2] [CONTEXT=512] [REPS=15]\n");
        return 2;
    }
    const int threads = argc > 2 ? atoi(argv[2]) : 2, ctx = argc > 3 ? atoi(argv[3]) : 512,
              reps = argc > 4 ? atoi(argv[4]) : 15;
    if (threads < 1 || ctx < 1 || ctx > 1 << 20 || reps < 1 || reps > 1000) {
        fprintf(stderr, "bench_mtok: THREADS >= 1, CONTEXT 1..2^20 and REPS 1..1000 expected\n");
        return 2;
    }
    static const int Ms[] = {1, 2, 3, 4, 5, 6, 8, 9, 12, 16};
    enum { NM = sizeof Ms / sizeof Ms[0], MMAX = 16 };
    spx_model_params mp = {.n_threads = threads};
    spx_model *m = NULL;
    if (spx_model_open(argv[1], &mp, &m) != SPX_OK) {
        fprintf(stderr, "bench_mtok: %s\n", spx_last_error());
        return 1;
    }
    const int64_t V = spx_model_vocab_size(m);
    spx_session_params sp = {.n_ctx = ctx + MMAX};
    spx_session *s = NULL;
    int32_t *ids = malloc((size_t)(ctx + MMAX) * sizeof *ids);
    float *lg = malloc((size_t)(V * MMAX) * sizeof *lg);
    double *t = malloc((size_t)(NM * reps) * sizeof *t);
    if (!ids || !lg || !t || spx_session_new(m, &sp, &s) != SPX_OK) {
        fprintf(stderr, "bench_mtok: %s\n", s ? "out of memory" : spx_model_error(m));
        return 1;
    }
    uint64_t r = 99;
    for (int i = 0; i < ctx + MMAX; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((r >> 33) % (uint64_t)V);
    }
    if (spx_session_eval(s, ids, (size_t)ctx, NULL, 0) != SPX_OK) {
        fprintf(stderr, "bench_mtok: %s\n", spx_session_error(s));
        return 1;
    }
    for (int rep = -1; rep < reps; rep++) /* rep -1: warm-up */
        for (int k = 0; k < NM; k++) {
            double t0 = now();
            if (spx_session_eval(s, ids + ctx, (size_t)Ms[k], lg, 1) != SPX_OK ||
                spx_session_truncate(s, ctx) != SPX_OK) {
                fprintf(stderr, "bench_mtok: %s\n", spx_session_error(s));
                return 1;
            }
            if (rep >= 0) t[k * reps + rep] = now() - t0;
        }
    printf("model %s, %d threads, context %d, %d repetitions\n| M | median ms | x M=1 | per token x M=1 |\n| --- | --- | --- | --- |\n",
           argv[1], threads, ctx, reps);
    double t1 = 0;
    for (int k = 0; k < NM; k++) {
        qsort(t + k * reps, (size_t)reps, sizeof *t, cmp);
        double med = t[k * reps + reps / 2];
        if (k == 0) t1 = med;
        printf("| %d | %.3f | %.2f | %.2f |\n", Ms[k], med * 1e3, med / t1, med / t1 / Ms[k]);
    }
    free(ids);
    free(lg);
    free(t);
    spx_session_free(s);
    spx_model_free(m);
    return 0;
}
