/* test_spec.c: speculative decoding (engine/spec.c, engine/lookup.c).
 *   - the lookup proposer against a brute-force search of the history
 *     (longest n-gram first, latest occurrence, the count thresholds);
 *   - truncate then re-eval gives a fresh session's logits, bit for bit;
 *   - greedy speculation returns plain greedy decoding's tokens exactly,
 *     with the lookup, a drafter that is right, one that is wrong at every
 *     position and one that is right for a few tokens then wrong, on
 *     attention models (fp16 and q4 KV) and hybrids with recurrent layers;
 *   - sampled speculation: the first token's frequencies fit the sampler's
 *     exact distribution and the second token's match plain sampling's
 *     (chi-square tests, each with a false-alarm rate of 1e-3; seeded, so
 *     a run is deterministic). */
#include "testlib.h"
#include "engine/lookup.h"
#include "engine/sampler.h"
#include "spectra.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int quick(void) { return getenv("SPECTRA_TEST_QUICK") != NULL; }

/* ---- proposer vs brute force ------------------------------------------------- */

/* What lookup.h specifies, by scanning the whole history. */
static int32_t brute_draft(const int32_t *h, int64_t N, const spx_spec_params *p, int32_t *draft, int32_t max) {
    for (int32_t n = p->ngram_max; n >= p->ngram_min; n--) {
        if (N < n + 1) continue;
        const int32_t *g = h + N - n;
        int64_t last = -1, count = 0;
        for (int64_t e = n - 1; e <= N - 2; e++)
            if (!memcmp(h + e - n + 1, g, (size_t)n * sizeof *g)) { count++; last = e; }
        if (last < 0) continue;
        int64_t ct = 0;
        for (int64_t e = n - 1; e <= N - 2; e++)
            if (!memcmp(h + e - n + 1, g, (size_t)n * sizeof *g) && h[e + 1] == h[last + 1]) ct++;
        if (count < p->min_count[n - 1] || ct * 100 < (int64_t)p->min_percent[n - 1] * count) continue;
        int64_t k = N - 1 - last;
        if (k > max) k = max;
        memcpy(draft, h + last + 1, (size_t)k * sizeof *draft);
        return (int32_t)k;
    }
    return 0;
}

static void test_proposer(void) {
    uint64_t r = 11;
    const int cases = quick() ? 12 : 40;
    int64_t drafted = 0, mismatches = 0, checks = 0;
    for (int c = 0; c < cases; c++) {
        spx_spec_params p;
        spx_spec_params_default(&p);
        p.ngram_min = 1 + (int)(tl_rand_u64(&r) % 2);
        p.ngram_max = p.ngram_min + (int)(tl_rand_u64(&r) % (SPX_SPEC_NGRAM_LIMIT - p.ngram_min + 1));
        for (int i = 0; i < SPX_SPEC_NGRAM_LIMIT; i++) {
            p.min_count[i] = c % 2 ? 1 : 1 + (int)(tl_rand_u64(&r) % 3);
            p.min_percent[i] = c % 2 ? 0 : (int)(tl_rand_u64(&r) % 101);
        }
        /* small alphabets repeat a lot; some cases copy earlier stretches */
        const int32_t alpha = 2 + (int32_t)(tl_rand_u64(&r) % 12);
        const int64_t N = 200 + (int64_t)(tl_rand_u64(&r) % 1800); /* past the table's first growth */
        int32_t *h = malloc((size_t)N * sizeof *h);
        spx_lookup *lk = spx_lookup_new(&p);
        CHECK(lk != NULL, "lookup_new");
        if (!lk) { free(h); return; }
        for (int64_t i = 0; i < N; i++) {
            if (i > 8 && tl_rand_u64(&r) % 3 == 0) h[i] = h[i - 1 - (int64_t)(tl_rand_u64(&r) % (i < 40 ? i - 1 : 40))];
            else h[i] = (int32_t)(tl_rand_u64(&r) % (uint64_t)alpha) * 7919; /* spread ids */
            CHECK(spx_lookup_push(lk, h[i]) == SPX_OK, "push");
            int32_t max = 1 + (int32_t)(tl_rand_u64(&r) % 12), a[16], b[16];
            int32_t na = spx_lookup_draft(lk, a, max), nb = brute_draft(h, i + 1, &p, b, max);
            checks++;
            if (na != nb || memcmp(a, b, (size_t)na * sizeof *a)) {
                if (mismatches++ < 5)
                    fprintf(stderr, "case %d at %lld: lookup drafted %d tokens, brute force %d\n", c, (long long)i, na, nb);
            }
            drafted += na;
        }
        int64_t nh;
        const int32_t *hh = spx_lookup_history(lk, &nh);
        CHECK(nh == N && !memcmp(hh, h, (size_t)N * sizeof *h), "history kept");
        spx_lookup_clear(lk);
        int32_t d[4];
        CHECK(spx_lookup_draft(lk, d, 4) == 0, "a cleared history drafts nothing");
        spx_lookup_free(lk);
        free(h);
    }
    CHECK(mismatches == 0, "%lld of %lld drafts differ from the brute-force search", (long long)mismatches,
          (long long)checks);
    CHECK(drafted > checks, "the cases drafted (%lld tokens over %lld look-ups): a test that drafts nothing shows nothing",
          (long long)drafted, (long long)checks);
}

/* ---- fixtures --------------------------------------------------------------- */

/* threads: 2 (rows split over threads: what the CLI runs) or 1 (the
 * many short sampling runs, which 2 threads on a loaded machine slow) */
static spx_model *open_fixture(const char *name, int threads) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    spx_model_params mp = {.n_threads = threads};
    spx_model *m = NULL;
    CHECK(spx_model_open(tl_shared(rel), &mp, &m) == SPX_OK, "%s: %s", name, spx_last_error());
    return m;
}

/* A prompt that repeats itself: a random stretch, then its first part
 * again, so lookup drafts from the start. */
static int32_t *make_prompt(int64_t V, int n, uint64_t seed) {
    int32_t *p = malloc((size_t)n * sizeof *p);
    uint64_t r = seed;
    int half = n / 2;
    for (int i = 0; i < n; i++) p[i] = i < half ? (int32_t)(tl_rand_u64(&r) % (uint64_t)V) : p[i - half];
    return p;
}

/* ---- truncate then re-eval ------------------------------------------------ */

static void test_truncate(const char *name, spx_kv_type kv) {
    spx_model *m = open_fixture(name, 2);
    if (!m) return;
    const int64_t V = spx_model_vocab_size(m);
    const int n = 24, cut = 13, extra = 5;
    int32_t *ids = make_prompt(V, n + extra, 5);
    spx_session_params sp = {.n_ctx = 128, .kv = kv};
    spx_session *a = NULL, *b = NULL;
    CHECK(spx_session_new(m, &sp, &a) == SPX_OK && spx_session_new(m, &sp, &b) == SPX_OK, "sessions");
    float *la = malloc((size_t)(V * extra) * sizeof *la), *lb = malloc((size_t)(V * extra) * sizeof *lb);
    if (a && b) {
        /* a: cut tokens, checkpoint, the rest and more, back to the cut,
         * then the other tokens; b: fresh, those tokens only */
        CHECK(spx_session_eval(a, ids, cut, NULL, 0) == SPX_OK, "eval");
        spx_session_checkpoint(a);
        CHECK(spx_session_eval(a, ids + cut, (size_t)(n - cut), NULL, 0) == SPX_OK, "eval");
        CHECK(spx_session_truncate(a, cut) == SPX_OK, "%s: truncate: %s", name, spx_session_error(a));
        CHECK(spx_session_pos(a) == cut, "pos after truncate");
        CHECK(spx_session_eval(a, ids + n, extra, la, 1) == SPX_OK, "re-eval");
        memcpy(ids + cut, ids + n, (size_t)extra * sizeof *ids);
        CHECK(spx_session_eval(b, ids, cut, NULL, 0) == SPX_OK && spx_session_eval(b, ids + cut, extra, lb, 1) == SPX_OK,
              "fresh eval");
        CHECK(!memcmp(la, lb, (size_t)(V * extra) * sizeof *la), "%s kv %d: truncate + re-eval differs from a fresh session (max %g)",
              name, (int)kv, tl_max_diff(la, lb, (size_t)(V * extra)));
    }
    free(la);
    free(lb);
    free(ids);
    spx_session_free(a);
    spx_session_free(b);
    spx_model_free(m);
}

/* ---- generation ------------------------------------------------------------- */

/* Plain decoding: the prompt's logits give the first token (spx_sample),
 * then one step per token. */
static int gen_plain(spx_model *m, spx_kv_type kv, const int32_t *prompt, int np, int ng,
                     const spx_sampler_params *smp, uint64_t seed, int32_t *out) {
    const int64_t V = spx_model_vocab_size(m);
    spx_session_params sp = {.n_ctx = np + ng + 40, .kv = kv};
    spx_session *s = NULL;
    float *lg = malloc((size_t)V * sizeof *lg);
    uint64_t rng = seed;
    int ok = spx_session_new(m, &sp, &s) == SPX_OK && spx_session_eval(s, prompt, (size_t)np, lg, 0) == SPX_OK;
    if (ok) out[0] = spx_sample(lg, V, smp, &rng);
    for (int i = 1; ok && i < ng; i++)
        ok = (smp ? spx_session_step_sample(s, out[i - 1], smp, &rng, &out[i])
                  : spx_session_step_greedy(s, out[i - 1], &out[i])) == SPX_OK;
    CHECK(ok, "plain decoding: %s", s ? spx_session_error(s) : spx_model_error(m));
    free(lg);
    spx_session_free(s);
    return ok;
}

typedef struct {
    const int32_t *ref; /* the whole plain sequence: prompt then generated */
    int64_t n_ref;
    int mode;           /* 0 right, 1 wrong at every position, 2 right for (n % 3) tokens then wrong */
    int64_t V;
    int64_t calls;
} oracle;

static int32_t draft_oracle(void *user, const int32_t *hist, int64_t n, int32_t *draft, int32_t max) {
    oracle *o = user;
    o->calls++;
    int32_t k = 0, right = o->mode == 0 ? max : o->mode == 1 ? 0 : (int32_t)(n % 3);
    for (; k < max && n + k < o->n_ref; k++) {
        int32_t t = o->ref[n + k];
        draft[k] = k < right ? t : (int32_t)((t + 1) % o->V);
    }
    return k;
}

static int gen_spec(spx_model *m, spx_kv_type kv, const int32_t *prompt, int np, int ng, const spx_sampler_params *smp,
                    uint64_t seed, const spx_spec_params *pp, spx_draft_fn fn, void *user, int32_t *out,
                    spx_spec_stats *st) {
    const int64_t V = spx_model_vocab_size(m);
    spx_session_params sp = {.n_ctx = np + ng + 40, .kv = kv};
    spx_session *s = NULL;
    spx_spec *sx = NULL;
    float *lg = malloc((size_t)V * sizeof *lg);
    uint64_t rng = seed;
    int ok = spx_session_new(m, &sp, &s) == SPX_OK && spx_session_eval(s, prompt, (size_t)np, lg, 0) == SPX_OK &&
             spx_spec_new(s, pp, &sx) == SPX_OK && spx_spec_history(sx, prompt, (size_t)np) == SPX_OK;
    int n = 0;
    if (ok) out[n++] = spx_sample(lg, V, smp, &rng);
    if (ok) spx_spec_set_drafter(sx, fn, user);
    while (ok && n < ng) {
        size_t got = 0;
        ok = spx_spec_step(sx, out[n - 1], smp, &rng, out + n, (size_t)(ng - n), &got) == SPX_OK;
        n += (int)got;
        ok = ok && got >= 1 && n <= ng && spx_session_pos(s) == np + n - 1;
    }
    CHECK(ok, "speculative decoding: %s (pos %lld, %d tokens)", s ? spx_session_error(s) : spx_model_error(m),
          s ? (long long)spx_session_pos(s) : -1LL, n);
    if (sx) spx_spec_get_stats(sx, st);
    free(lg);
    spx_spec_free(sx);
    spx_session_free(s);
    return ok;
}

static void test_greedy(const char *name, spx_kv_type kv) {
    spx_model *m = open_fixture(name, 2);
    if (!m) return;
    const int64_t V = spx_model_vocab_size(m);
    const int np = 48, ng = quick() ? 24 : 64;
    int32_t *prompt = make_prompt(V, np, 3);
    int32_t *ref = malloc((size_t)(np + ng) * sizeof *ref), *got = malloc((size_t)ng * sizeof *got);
    memcpy(ref, prompt, (size_t)np * sizeof *ref);
    if (gen_plain(m, kv, prompt, np, ng, NULL, 0, ref + np)) {
        const char *modes[] = {"lookup", "right", "wrong", "mixed"};
        for (int mode = 0; mode < 4; mode++) {
            spx_spec_params pp;
            spx_spec_params_default(&pp);
            pp.draft_min = 1;
            pp.draft_max = 6;
            pp.stop_below = 0; /* a drafter under test drafts at every step it can */
            if (mode == 0) /* the lookup drafts from any earlier match: more verifications to check */
                for (int k = 0; k < SPX_SPEC_NGRAM_LIMIT; k++) pp.min_count[k] = 1, pp.min_percent[k] = 0;
            oracle o = {ref, np + ng, mode - 1, V, 0};
            spx_spec_stats st = {0};
            memset(got, 0xff, (size_t)ng * sizeof *got);
            if (!gen_spec(m, kv, prompt, np, ng, NULL, 0, &pp, mode ? draft_oracle : NULL, &o, got, &st)) continue;
            int64_t first = -1;
            for (int i = 0; i < ng && first < 0; i++)
                if (got[i] != ref[np + i]) first = i;
            CHECK(first < 0, "%s kv %d, %s drafts: token %lld is %d, plain greedy %d", name, (int)kv, modes[mode],
                  (long long)first, first >= 0 ? got[first] : 0, first >= 0 ? ref[np + first] : 0);
            CHECK(st.tokens == ng - 1, "%s %s: %lld tokens returned, expected %d", name, modes[mode], (long long)st.tokens, ng - 1);
            CHECK(st.verify > 0 && st.drafted > 0, "%s %s: nothing was verified", name, modes[mode]);
            if (mode == 1) CHECK(st.accepted == st.drafted, "%s: right drafts kept %lld of %lld", name, (long long)st.accepted, (long long)st.drafted);
            if (mode == 2) CHECK(st.accepted == 0 && st.verify == ng - 2, "%s: wrong drafts kept %lld (%lld verifications; the last step has no room for a draft)", name,
                                 (long long)st.accepted, (long long)st.verify);
            if (mode == 3) CHECK(st.accepted > 0 && st.accepted < st.drafted, "%s: mixed drafts kept %lld of %lld", name,
                                 (long long)st.accepted, (long long)st.drafted);
        }
    }
    free(prompt);
    free(ref);
    free(got);
    spx_model_free(m);
}

/* ---- sampled speculation ------------------------------------------------------ */

/* The chi-square quantile for a false-alarm rate of 1e-3 (z = 3.0902),
 * Wilson-Hilferty: accurate to about 1 % for df >= 3. */
static double chi2_crit(int df) {
    double z = 3.0902, a = 2.0 / (9.0 * df);
    double c = 1 - a + z * sqrt(a);
    return df * c * c * c;
}

/* Two-sample chi-square over the ids both samples drew, bins with an
 * expected count under 5 pooled into one. Returns the statistic, *df. */
static double chi2_two(const int64_t *a, const int64_t *b, int64_t V, int64_t na, int64_t nb, int *df) {
    double stat = 0, pa = 0, pb = 0;
    int bins = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < V + (pass == 1); i++) {
            double x = pass ? (i < V ? 0 : pa) : (double)a[i], y = pass ? (i < V ? 0 : pb) : (double)b[i];
            if (pass == 0 && x + y == 0) continue;
            double t = x + y, ea = t * na / (na + nb), eb = t * nb / (na + nb);
            if (pass == 0 && (ea < 5 || eb < 5)) { pa += x; pb += y; continue; }
            if (t == 0) continue;
            stat += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
            bins++;
        }
    *df = bins - 1;
    return stat;
}

static void test_sampling(const char *name) {
    spx_model *m = open_fixture(name, 1);
    if (!m) return;
    const int64_t V = spx_model_vocab_size(m);
    /* R rounds of three draws; quick (the sanitizer pass, where a round on
     * tiny-llama3 costs about 0.15 s of ASan-instrumented float32
     * products): 300, still over a dozen pooled bins per test */
    const int np = 16, ng = 4, R = quick() ? 300 : 3000;
    int32_t *prompt = make_prompt(V, np, 9);
    int32_t greedy[4], *ref = malloc((size_t)(np + ng) * sizeof *ref);
    spx_sampler_params smp = {1.0f, 6, 1.0f, 0};
    memcpy(ref, prompt, (size_t)np * sizeof *ref);
    if (!gen_plain(m, SPX_KV_F32, prompt, np, ng, NULL, 0, greedy)) goto out;
    memcpy(ref + np, greedy, sizeof greedy);
    int64_t *f1s = calloc((size_t)V, sizeof *f1s), *f1p = calloc((size_t)V, sizeof *f1p);
    int64_t *f0s = calloc((size_t)V, sizeof *f0s);
    spx_spec_params pp;
    spx_spec_params_default(&pp);
    pp.draft_min = 1;
    pp.draft_max = 3;
    pp.stop_below = 0;
    oracle o = {ref, np + ng, 0, V, 0}; /* drafts the greedy continuation: often kept, often not */
    int64_t kept = 0, drafted = 0;
    for (int r = 0; r < R; r++) {
        int32_t a[4], b[4];
        spx_spec_stats st;
        /* the spec draw starts from a seed of its own (the plain one reuses r) */
        if (!gen_spec(m, SPX_KV_F32, prompt, np, 3, &smp, 0x1000000ull + (uint64_t)r, &pp, draft_oracle, &o, a, &st)) break;
        if (!gen_plain(m, SPX_KV_F32, prompt, np, 3, &smp, (uint64_t)r, b)) break;
        /* a[0] came from the prompt's logits (no speculation); a[1] is the
         * first verified token, a[2] depends on a[1]'s acceptance */
        f0s[a[1]]++;
        f1s[a[2]]++;
        f1p[b[2]]++;
        kept += st.accepted;
        drafted += st.drafted;
    }
    /* a[1]: its distribution given a[0] is not fixed (a[0] varies): compare
     * both positions two-sample against plain draws instead */
    int64_t *f0p = calloc((size_t)V, sizeof *f0p);
    for (int r = 0; r < R; r++) {
        int32_t b[4];
        if (!gen_plain(m, SPX_KV_F32, prompt, np, 2, &smp, 0x2000000ull + (uint64_t)r, b)) break;
        f0p[b[1]]++;
    }
    int df0, df1;
    double c0 = chi2_two(f0s, f0p, V, R, R, &df0), c1 = chi2_two(f1s, f1p, V, R, R, &df1);
    CHECK(df0 >= 3 && c0 < chi2_crit(df0), "%s: second token's frequencies differ from plain sampling: chi2 %.1f, df %d, critical %.1f",
          name, c0, df0, df0 >= 3 ? chi2_crit(df0) : 0.0);
    CHECK(df1 >= 3 && c1 < chi2_crit(df1), "%s: third token's frequencies differ from plain sampling: chi2 %.1f, df %d, critical %.1f",
          name, c1, df1, df1 >= 3 ? chi2_crit(df1) : 0.0);
    CHECK(kept >= R / 100 && kept < drafted, "%s: %lld of %lld drafts kept: the test needs both outcomes", name,
          (long long)kept, (long long)drafted);
    printf("%s sampling: chi2 %.1f (df %d, crit %.1f), %.1f (df %d, crit %.1f); kept %lld of %lld drafts\n", name, c0,
           df0, chi2_crit(df0), c1, df1, chi2_crit(df1), (long long)kept, (long long)drafted);
    free(f0s);
    free(f0p);
    free(f1s);
    free(f1p);
out:
    free(prompt);
    free(ref);
    spx_model_free(m);
}

/* A check that the chi-square test can fail: a draw that skips the
 * residual rule (keeps the draft with probability p(d), else draws from p
 * itself) overweights the draft token; the test must see it. */
static void test_chi2_power(void) {
    const int64_t V = 8;
    const double p[8] = {0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02};
    int64_t good[8] = {0}, bad[8] = {0}, ref[8] = {0};
    uint64_t r = 1;
    const int R = 20000, d = 1;
    for (int i = 0; i < R; i++) {
        double u = spx_rng_uniform(&r), acc = 0;
        int k = 7;
        for (int j = 0; j < 8; j++) if (u < (acc += p[j])) { k = j; break; }
        ref[k]++;
        /* residual rule */
        int g;
        if (spx_rng_uniform(&r) < p[d]) g = d;
        else {
            double w = spx_rng_uniform(&r) * (1 - p[d]);
            acc = 0;
            g = 7;
            for (int j = 0; j < 8; j++) if (j != d && w < (acc += p[j])) { g = j; break; }
        }
        good[g]++;
        int b = d;
        if (spx_rng_uniform(&r) >= p[d]) {
            double w = spx_rng_uniform(&r);
            acc = 0;
            b = 7;
            for (int j = 0; j < 8; j++) if (w < (acc += p[j])) { b = j; break; }
        }
        bad[b]++;
    }
    int dfg, dfb;
    double cg = chi2_two(good, ref, V, R, R, &dfg), cb = chi2_two(bad, ref, V, R, R, &dfb);
    CHECK(cg < chi2_crit(dfg), "the residual rule fails the test: chi2 %.1f >= %.1f", cg, chi2_crit(dfg));
    CHECK(cb > chi2_crit(dfb), "the test misses a wrong rule: chi2 %.1f < %.1f", cb, chi2_crit(dfb));
}

static void test_params(void) {
    spx_model *m = open_fixture("tiny-llama3", 2);
    if (!m) return;
    spx_session *s = NULL;
    CHECK(spx_session_new(m, NULL, &s) == SPX_OK, "session");
    spx_spec_params p;
    spx_spec_params_default(&p);
    spx_spec *sx = NULL;
    p.draft_max = SPX_SPEC_DRAFT_LIMIT + 1;
    CHECK(spx_spec_new(s, &p, &sx) == SPX_ERR_ARG && sx == NULL && strstr(spx_session_error(s), "draft_max"), "%s",
          spx_session_error(s));
    spx_spec_params_default(&p);
    p.ngram_min = 3, p.ngram_max = 2;
    CHECK(spx_spec_new(s, &p, &sx) == SPX_ERR_ARG && strstr(spx_session_error(s), "n-gram"), "%s", spx_session_error(s));
    spx_spec_params_default(&p);
    CHECK(spx_spec_new(s, &p, &sx) == SPX_OK, "defaults");
    int32_t ids[3] = {1, 2, 3}, out[4];
    size_t n;
    CHECK(spx_session_eval(s, ids, 3, NULL, 0) == SPX_OK, "eval");
    /* the history does not hold the session's tokens */
    CHECK(spx_spec_step(sx, 4, NULL, NULL, out, 4, &n) == SPX_ERR_ARG && strstr(spx_session_error(s), "history"), "%s",
          spx_session_error(s));
    CHECK(spx_spec_history(sx, ids, 3) == SPX_OK, "history");
    CHECK(spx_spec_step(sx, 1 << 30, NULL, NULL, out, 4, &n) == SPX_ERR_RANGE, "bad id");
    CHECK(spx_spec_step(sx, 4, NULL, NULL, out, 4, &n) == SPX_OK && n >= 1, "step: %s", spx_session_error(s));
    CHECK(spx_spec_kind_parse("lookup") == SPX_SPEC_LOOKUP && spx_spec_kind_parse("off") == SPX_SPEC_OFF &&
              spx_spec_kind_parse("ngram") == -1, "kind names");
    spx_spec_free(sx);
    spx_session_free(s);
    spx_model_free(m);
}

int main(void) {
    test_proposer();
    test_chi2_power();
    test_params();
    test_truncate("tiny-llama3", SPX_KV_F16);
    test_truncate("tiny-llama3", SPX_KV_Q4);
    test_truncate("tiny-lfm2", SPX_KV_F16);
    test_truncate("tiny-granite4", SPX_KV_F16);
    test_greedy("tiny-llama3", SPX_KV_F16);
    test_greedy("tiny-llama3", SPX_KV_Q4);
    test_greedy("tiny-qwen3", SPX_KV_F16);
    test_greedy("tiny-lfm2", SPX_KV_F16);
    test_greedy("tiny-granite4", SPX_KV_Q4);
    test_greedy("tiny-nemotronh", SPX_KV_F16);
    if (!quick()) test_greedy("docllama-58m", SPX_KV_F16);
    test_sampling("tiny-llama3");
    if (!quick()) test_sampling("tiny-granite4");
    return tl_finish("test_spec");
}
