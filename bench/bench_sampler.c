/* bench_sampler.c: the cost of one sampled token against the greedy
 * argmax, per vocabulary and parameter set: median microseconds over
 * interleaved repetitions (each repetition runs every case once, so a
 * slow moment of a shared machine spreads over all), and the ratio to the
 * argmax of the same vocabulary. Logits: normal, std 3 (a peaked model's
 * shape is cheaper for top-p, not for the sort).
 *
 *   build/bench/bench_sampler [REPS=41]
 */
#include "core/util.h"
#include "spectra.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 41;
    if (reps < 1) {
        fprintf(stderr, "usage: bench_sampler [REPS=41]\n");
        return 2;
    }
    const int64_t vocabs[2] = {32000, 128256};
    const spx_sampler_params ps[4] = {{0, 0, 1, 0}, {0.8f, 40, 0.95f, 0}, {0.8f, 0, 0.95f, 0}, {0.8f, 0, 1, 0}};
    const char *names[4] = {"greedy (argmax)", "T 0.8, top-k 40, top-p 0.95", "T 0.8, top-p 0.95", "T 0.8"};
    float *lg[2];
    uint64_t s = 1;
    for (int v = 0; v < 2; v++) {
        lg[v] = malloc((size_t)vocabs[v] * sizeof(float));
        if (!lg[v]) return 1;
        for (int64_t i = 0; i < vocabs[v]; i++) { /* Box-Muller from splitmix-ish draws */
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            double u1 = ((s >> 11) + 1.0) / 9007199254740993.0;
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            double u2 = (s >> 11) / 9007199254740992.0;
            lg[v][i] = (float)(3.0 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
        }
    }
    double *t = malloc(sizeof(double) * 8 * (size_t)reps);
    if (!t) return 1;
    uint64_t rng = 7, sink = 0;
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 2; v++)
            for (int k = 0; k < 4; k++) {
                double t0 = spx_now();
                sink += (uint64_t)spx_sample(lg[v], vocabs[v], &ps[k], &rng);
                t[(v * 4 + k) * reps + r] = spx_now() - t0;
            }
    printf("| vocabulary | sampler | median us | x greedy |\n| ---: | --- | ---: | ---: |\n");
    for (int v = 0; v < 2; v++) {
        double g = 0;
        for (int k = 0; k < 4; k++) {
            double *x = t + (v * 4 + k) * reps;
            qsort(x, (size_t)reps, sizeof *x, cmp);
            double med = x[reps / 2] * 1e6;
            if (k == 0) g = med;
            printf("| %lld | %s | %.1f | %.2f |\n", (long long)vocabs[v], names[k], med, med / g);
        }
    }
    printf("\n(%d repetitions, one thread; checksum %llu)\n", reps, (unsigned long long)sink);
    return 0;
}
