/* sampler.c: greedy, temperature, top-k and top-p sampling.
 *
 * Order (as transformers' generate): temperature, then top-k, then top-p
 * over the softmax of what is left, then a draw. Greedy ties go to the
 * lowest id (torch.argmax). The RNG is splitmix64 seeded by the caller, so
 * a seed reproduces a run. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>

static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static int cand_desc(const void *a, const void *b) {
    const spx_cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int spx_sampler_greedy(const spx_sampler_params *p) { return !p || p->temperature <= 0 || p->top_k == 1; }

double spx_rng_uniform(uint64_t *rng) { return (double)(next_u64(rng) >> 11) * (1.0 / 9007199254740992.0); }

int64_t spx_sampler_dist(const float *logits, int64_t vocab, const spx_sampler_params *p, spx_cand *c, double *sum_out) {
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

int32_t spx_sample(const float *logits, int64_t vocab, const spx_sampler_params *p, uint64_t *rng) {
    if (spx_sampler_greedy(p)) return argmax(logits, vocab);
    spx_cand *c = malloc((size_t)vocab * sizeof *c);
    if (!c) return argmax(logits, vocab); /* no memory: degrade to greedy */
    double sum;
    int64_t n = spx_sampler_dist(logits, vocab, p, c, &sum);
    double r = spx_rng_uniform(rng) * sum;
    int32_t id = c[n - 1].id;
    double acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += c[i].p;
        if (r < acc) { id = c[i].id; break; }
    }
    free(c);
    return id;
}
