/* lookup.c: the prompt-lookup proposer (lookup.h: index layout and
 * thresholds). */
#include "engine/lookup.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t key;  /* 0: empty */
    int64_t last;  /* n-gram entries: end index of the latest occurrence with a next token */
    uint32_t count;
} lk_slot;

struct spx_lookup {
    int32_t *hist;
    int64_t n, cap;
    lk_slot *tab;
    uint64_t mask; /* table size - 1 (a power of two) */
    int64_t used;
    int32_t nmin, nmax;
    int32_t min_count[SPX_SPEC_NGRAM_LIMIT], min_percent[SPX_SPEC_NGRAM_LIMIT];
};

#define TAB_MIN 1024

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* key of the n tokens at g; pair != 0: of (g, next) */
static uint64_t key_of(const int32_t *g, int32_t n, int pair, int32_t next) {
    uint64_t h = mix(0x9e3779b97f4a7c15ull * (uint64_t)(n + 8 * pair));
    for (int32_t i = 0; i < n; i++) h = mix(h ^ (uint32_t)g[i]);
    if (pair) h = mix(h ^ ((uint64_t)(uint32_t)next << 32) ^ 0x5851f42d4c957f2dull);
    return h ? h : 1;
}

static lk_slot *find(const spx_lookup *lk, uint64_t key) {
    for (uint64_t i = key & lk->mask;; i = (i + 1) & lk->mask)
        if (lk->tab[i].key == key || lk->tab[i].key == 0) return &lk->tab[i];
}

static int grow_tab(spx_lookup *lk) {
    uint64_t size = (lk->mask + 1) * 2;
    lk_slot *old = lk->tab, *nt = calloc(size, sizeof *nt);
    if (!nt) return 0;
    uint64_t old_size = lk->mask + 1;
    lk->tab = nt;
    lk->mask = size - 1;
    for (uint64_t i = 0; i < old_size; i++)
        if (old[i].key) *find(lk, old[i].key) = old[i];
    free(old);
    return 1;
}

spx_lookup *spx_lookup_new(const spx_spec_params *p) {
    spx_lookup *lk = calloc(1, sizeof *lk);
    if (!lk) return NULL;
    lk->tab = calloc(TAB_MIN, sizeof *lk->tab);
    lk->cap = 1024;
    lk->hist = malloc((size_t)lk->cap * sizeof *lk->hist);
    if (!lk->tab || !lk->hist) {
        spx_lookup_free(lk);
        return NULL;
    }
    lk->mask = TAB_MIN - 1;
    lk->nmin = p->ngram_min;
    lk->nmax = p->ngram_max;
    memcpy(lk->min_count, p->min_count, sizeof lk->min_count);
    memcpy(lk->min_percent, p->min_percent, sizeof lk->min_percent);
    return lk;
}

void spx_lookup_free(spx_lookup *lk) {
    if (!lk) return;
    free(lk->tab);
    free(lk->hist);
    free(lk);
}

void spx_lookup_clear(spx_lookup *lk) {
    lk->n = 0;
    lk->used = 0;
    memset(lk->tab, 0, (size_t)(lk->mask + 1) * sizeof *lk->tab);
}

const int32_t *spx_lookup_history(const spx_lookup *lk, int64_t *n) {
    *n = lk->n;
    return lk->hist;
}

spx_status spx_lookup_push(spx_lookup *lk, int32_t tok) {
    if (lk->n == lk->cap) {
        int32_t *nh = realloc(lk->hist, (size_t)lk->cap * 2 * sizeof *nh);
        if (!nh) return SPX_ERR_NOMEM;
        lk->hist = nh;
        lk->cap *= 2;
    }
    /* at most 2 new entries per n: keep the load at or below one half */
    while ((uint64_t)(lk->used + 2 * SPX_SPEC_NGRAM_LIMIT) * 2 > lk->mask + 1)
        if (!grow_tab(lk)) return SPX_ERR_NOMEM;
    const int64_t i = lk->n;
    for (int32_t n = lk->nmin; n <= lk->nmax && n <= i; n++) {
        const int32_t *g = lk->hist + i - n;
        lk_slot *s = find(lk, key_of(g, n, 0, 0));
        if (!s->key) { s->key = key_of(g, n, 0, 0); lk->used++; }
        s->count++;
        s->last = i - 1;
        lk_slot *pr = find(lk, key_of(g, n, 1, tok));
        if (!pr->key) { pr->key = key_of(g, n, 1, tok); lk->used++; }
        pr->count++;
    }
    lk->hist[lk->n++] = tok;
    return SPX_OK;
}

int32_t spx_lookup_draft(const spx_lookup *lk, int32_t *draft, int32_t max) {
    const int64_t N = lk->n;
    if (max <= 0) return 0;
    for (int32_t n = lk->nmax; n >= lk->nmin; n--) {
        if (N < n + 1) continue; /* the suffix and one earlier end at least */
        const int32_t *g = lk->hist + N - n;
        const lk_slot *s = find(lk, key_of(g, n, 0, 0));
        if (!s->key) continue;
        const int64_t e = s->last; /* e <= N - 2 */
        if (e < n - 1 || e > N - 2 || memcmp(lk->hist + e - n + 1, g, (size_t)n * sizeof *g)) continue; /* collision */
        const int32_t t = lk->hist[e + 1];
        const lk_slot *pr = find(lk, key_of(g, n, 1, t));
        const uint64_t cg = s->count, ct = pr->key ? pr->count : 0;
        if (cg < (uint64_t)lk->min_count[n - 1] || ct * 100 < (uint64_t)lk->min_percent[n - 1] * cg) continue;
        int64_t k = N - 1 - e;
        if (k > max) k = max;
        memcpy(draft, lk->hist + e + 1, (size_t)k * sizeof *draft);
        return (int32_t)k;
    }
    return 0;
}
