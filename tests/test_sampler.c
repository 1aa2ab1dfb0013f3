/* test_sampler.c: the sampler against its reference, the full comparison
 * sort it replaced (kept here): for many vocabularies, logit shapes (random,
 * quantized to many ties, -inf entries, all equal) and parameter sets
 * (temperature, top-k below / at / above the vocabulary, top-p), the
 * candidates (count, ids, weights, sum) must be equal bit for bit, and
 * spx_sample must draw the same ids with the same RNG states over many
 * seeds. */
#include "engine/sampler.h"
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cand_desc(const void *a, const void *b) {
    const spx_cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* the reference: the sampler as it was (sort everything, then cut) */
static int64_t ref_dist(const float *logits, int64_t vocab, const spx_sampler_params *p, spx_cand *c, double *sum_out) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int64_t i = 0; i < vocab; i++) {
        c[i].p = (logits[i] - mx) / p->temperature;
        c[i].id = (int32_t)i;
    }
    qsort(c, (size_t)vocab, sizeof *c, cand_desc);
    int64_t n = vocab;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (c[i].p = expf(c[i].p));
    if (p->top_p > 0 && p->top_p < 1) {
        double cum = 0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            cum += c[i].p / sum;
            if (cum >= p->top_p) { keep = i + 1; break; }
        }
        n = keep;
        sum = 0;
        for (int64_t i = 0; i < n; i++) sum += c[i].p;
    }
    *sum_out = sum;
    return n;
}

static int32_t ref_sample(const float *logits, int64_t vocab, const spx_sampler_params *p, uint64_t *rng, spx_cand *c) {
    double sum;
    int64_t n = ref_dist(logits, vocab, p, c, &sum);
    double r = spx_rng_uniform(rng) * sum;
    int32_t id = c[n - 1].id;
    double acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += c[i].p;
        if (r < acc) { id = c[i].id; break; }
    }
    return id;
}

static uint64_t g_rng = 12345;

static void fill(float *x, int64_t V, int shape) {
    for (int64_t i = 0; i < V; i++) {
        float v = 3.0f * tl_rand_normal(&g_rng);
        if (shape == 1) v = roundf(v * 2) / 2; /* many exact ties */
        if (shape == 2 && tl_rand_u64(&g_rng) % 7 == 0) v = -INFINITY;
        if (shape == 3) v = 1.5f;
        x[i] = v;
    }
    if (shape == 2) x[V / 2] = 0.5f; /* at least one finite */
}

int main(void) {
    const int quick = getenv("SPECTRA_TEST_QUICK") != NULL;
    const int64_t vocabs[] = {1, 2, 7, 100, 1000, 32000, 128256};
    const float temps[] = {0.3f, 0.8f, 1.0f, 1.7f};
    const float top_ps[] = {1.0f, 0.95f, 0.5f, 1e-6f};
    int cases = 0, draws = 0;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
        const int64_t V = vocabs[vi];
        float *lg = malloc((size_t)V * sizeof *lg);
        spx_cand *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
        if (!lg || !a || !b) {
            CHECK(0, "out of memory");
            return tl_finish("test_sampler");
        }
        const int32_t top_ks[] = {0, 1, 2, 40, (int32_t)(V > 1 ? V - 1 : 1), (int32_t)V, (int32_t)V + 5};
        for (int shape = 0; shape < 4; shape++) {
            fill(lg, V, shape);
            for (size_t ti = 0; ti < sizeof temps / sizeof *temps; ti++)
                for (size_t ki = 0; ki < sizeof top_ks / sizeof *top_ks; ki++)
                    for (size_t pi = 0; pi < sizeof top_ps / sizeof *top_ps; pi++) {
                        /* large vocabularies (the reference sorts everything, ~10 ms a call): a few sets */
                        if (V >= 32000 && (shape > 1 || ti != 1 || (ki != 0 && ki != 3 && ki != 5) || pi > 1)) continue;
                        if (quick && V >= 32000 && shape) continue;
                        spx_sampler_params p = {temps[ti], top_ks[ki], top_ps[pi], 0};
                        if (spx_sampler_greedy(&p)) continue;
                        double sa, sb;
                        int64_t na = spx_sampler_dist(lg, V, &p, a, &sa), nb = ref_dist(lg, V, &p, b, &sb);
                        int same = na == nb && sa == sb;
                        for (int64_t i = 0; same && i < na; i++) same = a[i].id == b[i].id && a[i].p == b[i].p;
                        CHECK(same, "V %lld shape %d T %g top_k %d top_p %g: candidates differ (n %lld vs %lld, sum %.17g vs %.17g)",
                              (long long)V, shape, temps[ti], top_ks[ki], top_ps[pi], (long long)na, (long long)nb, sa, sb);
                        cases++;
                        const int n_seeds = V >= 32000 ? 2 : 20;
                        for (int sd = 0; sd < n_seeds; sd++) {
                            uint64_t ra = (uint64_t)sd * 977 + 1, rb = ra;
                            for (int k = 0; k < (V >= 32000 ? 2 : 4); k++) {
                                int32_t ia = spx_sample(lg, V, &p, &ra), ib = ref_sample(lg, V, &p, &rb, b);
                                CHECK(ia == ib && ra == rb, "V %lld shape %d T %g top_k %d top_p %g seed %d draw %d: %d vs %d",
                                      (long long)V, shape, temps[ti], top_ks[ki], top_ps[pi], sd, k, ia, ib);
                                draws++;
                            }
                        }
                    }
        }
        free(lg);
        free(a);
        free(b);
    }
    printf("test_sampler: %d parameter sets, %d draws equal to the full-sort reference\n", cases, draws);
    return tl_finish("test_sampler");
}
