/* sampler.c: greedy, temperature, top-k and top-p sampling.
 *
 * Order (as transformers' generate): temperature, then top-k, then top-p
 * over the softmax of what is left, then a draw. Greedy ties go to the
 * lowest id (torch.argmax). The RNG is splitmix64 seeded by the caller, so
 * a seed reproduces a run. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* The candidates' order, descending weight and ties to the lower id, as
 * one ascending 64-bit key: the weight's bits made order-preserving and
 * inverted (high half), the id (low half). Keys are distinct, so the k
 * smallest are one set whatever the method: a selection then a sort of
 * those k gives the same prefix a sort of everything gives, which keeps
 * every draw that of the full sort (tests/test_sampler.c holds the
 * qsort reference). */
static uint64_t cand_key(float p, int32_t id) {
    union { float f; uint32_t u; } v;
    v.f = p == 0 ? 0.0f : p; /* -0 sorts as +0 (they compare equal) */
    uint32_t a = v.u & 0x80000000u ? ~v.u : v.u | 0x80000000u; /* ascending with the value */
    return (uint64_t)~a << 32 | (uint32_t)id;
}

static void swap64(uint64_t *a, uint64_t *b) {
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/* Moves the k smallest of x[0..n) to x[0..k) (in no order): quickselect,
 * median-of-three pivots. */
static void select_k(uint64_t *x, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (hi > lo) {
        int64_t mid = lo + (hi - lo) / 2;
        if (x[mid] < x[lo]) swap64(&x[mid], &x[lo]);
        if (x[hi] < x[lo]) swap64(&x[hi], &x[lo]);
        if (x[hi] < x[mid]) swap64(&x[hi], &x[mid]);
        const uint64_t piv = x[mid];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (x[i] < piv) i++;
            while (x[j] > piv) j--;
            if (i <= j) swap64(&x[i++], &x[j--]);
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
}

/* Max-heap of keys (the root: the largest, i.e. the worst candidate kept). */
static void heap_down(uint64_t *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l] > h[m]) m = l;
        if (r < n && h[r] > h[m]) m = r;
        if (m == i) return;
        swap64(&h[i], &h[m]);
        i = m;
    }
}

/* The k smallest keys of all vocab logits into h[0..k) (in no order),
 * the same set select_k gives over every key, in one pass that computes a
 * key only where a weight beats the worst kept: weights (l - mx) / T are
 * monotone in l (correctly rounded subtraction and division by T > 0), so
 * a block of 16 logits whose largest gives a weight <= the worst one kept
 * holds nothing better (a later id with an equal weight has a larger
 * key). NaN-free logits only (the caller checks). */
static void heap_top_k(const float *logits, int64_t vocab, float mx, float temp, int64_t k, uint64_t *h) {
    for (int64_t i = 0; i < k; i++) h[i] = cand_key((logits[i] - mx) / temp, (int32_t)i);
    for (int64_t i = k / 2; i-- > 0;) heap_down(h, k, i);
    float worst = (logits[(uint32_t)h[0]] - mx) / temp;
    for (int64_t i = k; i < vocab; i += 16) {
        const int64_t e = i + 16 < vocab ? i + 16 : vocab;
        float bm = logits[i];
        for (int64_t j = i + 1; j < e; j++) bm = logits[j] > bm ? logits[j] : bm;
        if (!((bm - mx) / temp > worst)) continue;
        for (int64_t j = i; j < e; j++) {
            const float w = (logits[j] - mx) / temp;
            if (!(w > worst)) continue;
            const uint64_t key = cand_key(w, (int32_t)j);
            if (key >= h[0]) continue;
            h[0] = key;
            heap_down(h, k, 0);
            worst = (logits[(uint32_t)h[0]] - mx) / temp;
        }
    }
}

static int u64_asc(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts x[0..n) ascending: LSD radix on the high 32 bits in 3 passes of
 * 11 bits (stable, and the input is in id order, so equal weights stay
 * by id); tmp holds n. */
static void radix_sort_hi(uint64_t *x, uint64_t *tmp, int64_t n) {
    for (int shift = 32; shift < 64; shift += 11) {
        int64_t cnt[2049] = {0};
        for (int64_t i = 0; i < n; i++) cnt[((x[i] >> shift) & 2047) + 1]++;
        for (int b = 0; b < 2048; b++) cnt[b + 1] += cnt[b];
        for (int64_t i = 0; i < n; i++) tmp[cnt[(x[i] >> shift) & 2047]++] = x[i];
        uint64_t *t = x;
        x = tmp;
        tmp = t;
    }
    /* three passes: the sorted keys are in what was tmp; copy back */
    memcpy(tmp, x, (size_t)n * sizeof *x);
}

int spx_sampler_greedy(const spx_sampler_params *p) { return !p || p->temperature <= 0 || p->top_k == 1; }

double spx_rng_uniform(uint64_t *rng) { return (double)(next_u64(rng) >> 11) * (1.0 / 9007199254740992.0); }

int64_t spx_sampler_dist(const float *logits, int64_t vocab, const spx_sampler_params *p, spx_cand *c, double *sum_out) {
    float mx = -INFINITY;
    int nan = 0;
    for (int64_t i = 0; i < vocab; i++) {
        mx = logits[i] > mx ? logits[i] : mx;
        nan |= logits[i] != logits[i];
    }
    int64_t n = vocab;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    /* the keys live in c (vocab entries of 8 bytes, malloc'd: aligned for a
     * uint64_t); key[i] is read before c[i] is written over it */
    _Static_assert(sizeof(spx_cand) == sizeof(uint64_t), "a candidate's memory holds its key");
    uint64_t *key = (uint64_t *)(void *)c;
    if (n < vocab && n <= vocab / 8 && !nan) {
        /* a small top-k: one pass, the heap in c[0..k) (the rest of c is never touched) */
        heap_top_k(logits, vocab, mx, p->temperature, n, key);
        qsort(key, (size_t)n, sizeof *key, u64_asc);
    } else {
        for (int64_t i = 0; i < vocab; i++) key[i] = cand_key((logits[i] - mx) / p->temperature, (int32_t)i);
        if (n < vocab) {
            select_k(key, vocab, n);
            qsort(key, (size_t)n, sizeof *key, u64_asc);
        } else {
            uint64_t *tmp = malloc((size_t)vocab * sizeof *tmp);
            if (tmp) radix_sort_hi(key, tmp, vocab);
            else qsort(key, (size_t)vocab, sizeof *key, u64_asc); /* no memory: the same order, slower */
            free(tmp);
        }
    }
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = (int32_t)(uint32_t)key[i];
        c[i].p = (logits[id] - mx) / p->temperature;
        c[i].id = id;
    }
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
