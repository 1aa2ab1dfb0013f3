/* test_kvlow.c: the StrataFlux-KV low-bit cache (engine/kvlow.h).
 *  1. Store and load: every encoded row, resident and refined, against an
 *     encoder written here from kvlow.h's definitions (its own Hadamard
 *     matrix, per-channel / per-token bins); the refined value lies within
 *     half a refinement step of the fp16 input.
 *  2. Selection: spx_kvlow_select against a full sort (ties included).
 *  3. Attention, per type and layout, against double-precision recomputation
 *     from the rows: none selected (frac 0) equals the cache without a tier
 *     exactly; eq. 8 with a fraction selected equals attention recomputed
 *     with the selected groups' refined rows and the others' resident rows
 *     (selection by brute force over resident-key probabilities); all
 *     selected with +8 bits reproduces fp16-KV attention.
 *  4. End to end on docllama-58m (tiny-llama3 in quick mode): logits of a
 *     600-token prompt and of decode steps with k4v4 + 8 refinement bits
 *     on every group equal the fp16 cache's within TOL_E2E; k2v2 without
 *     refinement is further off than with it (the refinement is applied);
 *     truncate then re-feed matches.
 *  5. The file tier (cfg.tier_dir, refine/tier.h's scratch tier): the same
 *     codes as host RAM; identical attention with the wait policy at any
 *     cache size; skip with no cache = the resident path; skip with a
 *     small cache misses, then after the loads matches host RAM; refined
 *     rows read back identically; end to end identical logits (incl.
 *     truncate into an encoded block); a missing folder fails naming it;
 *     --kv-tier alone turns on +4 bits. */
#include "testlib.h"
#include "core/err.h"
#include "core/half.h"
#include "engine/kvcache.h"
#include "engine/kvlow.h"
#include "engine/session.h"
#include "refine/tier.h"
#include "spectra.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* float vs double over the same rows: rounding only */
#define TOL_ATT 2e-4
/* +8 bits on every group: each value within 1/512 of its bin (at 2 bits
 * and these ranges, about 0.003 absolute) of the fp16 one */
#define TOL_ATT_FULL 0.02
/* docllama-58m logits span about +-20; k4v4 + 8 bits on every group
 * differs from fp16 by the refined values' 1/512-bin errors */
#define TOL_E2E 0.05

static float f16r(float x) { return spx_f16_to_f32(spx_f32_to_f16(x)); }

/* y = H x with H[i][j] = (-1)^popcount(i & j) / sqrt(rot), per block */
static void hadamard(const float *x, float *y, int64_t n, int64_t rot) {
    for (int64_t b = 0; b < n; b += rot)
        for (int64_t i = 0; i < rot; i++) {
            double s = 0;
            for (int64_t j = 0; j < rot; j++) s += (__builtin_popcountll((unsigned long long)(i & j)) & 1 ? -1 : 1) * (double)x[b + j];
            y[b + i] = (float)(s / sqrt((double)rot));
        }
}

typedef struct {
    spx_kvlow_cfg cfg;
    int64_t n, hd, nkv, kvd, rot;
    float *k, *v;       /* inputs, fp16-rounded [n][kvd] */
    float *kr, *vr;     /* resident values [n][kvd] (codes' coordinates: rotated for ROT) */
    float *kf, *vf;     /* refined values (same coordinates) */
    float *ks, *vs;     /* each element's bin step */
} ref_cache;

/* element bins of one coordinate set x[cnt] (stride st), b bits */
static void ref_bins(const float *x, int64_t cnt, int64_t st, int b, int rb, float *res, float *ref, float *stp) {
    float lo = x[0], hi = x[0];
    for (int64_t i = 1; i < cnt; i++) {
        lo = fminf(lo, x[i * st]);
        hi = fmaxf(hi, x[i * st]);
    }
    float m = f16r(lo), s = f16r((hi - lo) / (float)((1 << b) - 1));
    for (int64_t i = 0; i < cnt; i++) {
        float u = s > 0 ? (x[i * st] - m) / s : 0;
        long c = s > 0 ? lrintf(u) : 0;
        c = c < 0 ? 0 : c > (1 << b) - 1 ? (1 << b) - 1 : c;
        long j = s > 0 && rb ? (long)floorf((u - (float)c + 0.5f) * (float)(1 << rb)) : 0;
        j = j < 0 ? 0 : rb && j > (1 << rb) - 1 ? (1 << rb) - 1 : j;
        res[i * st] = m + s * (float)c;
        ref[i * st] = rb ? m + s * ((float)c - 0.5f + ((float)j + 0.5f) / (float)(1 << rb)) : res[i * st];
        stp[i * st] = s;
    }
}

static void ref_build(ref_cache *r, const spx_kvlow_cfg *c, int64_t n, int64_t hd, int64_t nkv, uint64_t seed) {
    memset(r, 0, sizeof *r);
    r->cfg = *c;
    r->n = n, r->hd = hd, r->nkv = nkv, r->kvd = hd * nkv;
    r->rot = 1;
    while (r->rot < 256 && hd % (r->rot * 2) == 0) r->rot *= 2;
    size_t N = (size_t)(n * r->kvd);
    float **arr[] = {&r->k, &r->v, &r->kr, &r->vr, &r->kf, &r->vf, &r->ks, &r->vs};
    for (int i = 0; i < 8; i++) *arr[i] = calloc(N, sizeof(float));
    for (size_t i = 0; i < N; i++) {
        /* keys with a few large channels (as real keys have), values plain */
        int64_t ch = (int64_t)(i % (size_t)hd);
        r->k[i] = f16r(tl_rand_normal(&seed) * (ch % 16 == 3 ? 6.0f : 1.0f) + (ch % 16 == 3 ? 2.0f : 0));
        r->v[i] = f16r(tl_rand_normal(&seed));
    }
    float *x = malloc(N * sizeof *x);
    for (int which = 0; which < 2; which++) {
        const float *in = which ? r->v : r->k;
        float *res = which ? r->vr : r->kr, *ref = which ? r->vf : r->kf, *stp = which ? r->vs : r->ks;
        const int b = which ? c->vb : c->kb;
        memcpy(x, in, N * sizeof *x);
        for (int64_t p = 0; p < n; p++) {
            if (c->layout == SPX_KV_LAYOUT_ROT)
                for (int64_t h = 0; h < nkv; h++) hadamard(in + p * r->kvd + h * hd, x + p * r->kvd + h * hd, hd, r->rot);
        }
        for (int64_t p = 0; p < n; p++) /* fp16 regions keep the input (only encoded ones are checked) */
            for (int64_t i = 0; i < r->kvd; i++) res[p * r->kvd + i] = ref[p * r->kvd + i] = x[p * r->kvd + i];
        const int64_t enc_end = n / SPX_KVL_BLOCK * SPX_KVL_BLOCK; /* complete blocks past the sinks */
        for (int64_t P0 = SPX_KVL_BLOCK; P0 < enc_end; P0 += SPX_KVL_BLOCK) {
            if (!which && c->layout == SPX_KV_LAYOUT_KIVI) {
                for (int64_t i = 0; i < r->kvd; i++)
                    ref_bins(x + P0 * r->kvd + i, SPX_KVL_BLOCK, r->kvd, b, c->rb, res + P0 * r->kvd + i,
                             ref + P0 * r->kvd + i, stp + P0 * r->kvd + i);
                continue;
            }
            for (int64_t p = P0; p < P0 + SPX_KVL_BLOCK; p++)
                for (int64_t g = 0; g < r->kvd; g += c->group)
                    ref_bins(x + p * r->kvd + g, c->group, 1, b, c->rb, res + p * r->kvd + g, ref + p * r->kvd + g,
                             stp + p * r->kvd + g);
        }
    }
    free(x);
}

static void ref_free(ref_cache *r) {
    float *arr[] = {r->k, r->v, r->kr, r->vr, r->kf, r->vf, r->ks, r->vs};
    for (int i = 0; i < 8; i++) free(arr[i]);
}

/* the library's cache holding r's rows, stored one at a time with a
 * commit after each (as decode steps do) */
static int lib_build(spx_kvlow *k, const ref_cache *r, int rb_override) {
    spx_kvlow_cfg c = r->cfg;
    if (rb_override >= 0) c.rb = rb_override;
    spx_err e;
    if (spx_kvlow_init(k, &c, 1, r->n + 8, r->kvd, r->hd, 1, &e) != SPX_OK) {
        CHECK(0, "init: %s", e.msg);
        return 0;
    }
    for (int64_t p = 0; p < r->n; p++) {
        spx_kvlow_store(k, 0, p, r->k + p * r->kvd, r->v + p * r->kvd);
        CHECK(spx_kvlow_commit(k, 0, p + 1, NULL) == SPX_OK, "commit at %lld", (long long)p);
    }
    return 1;
}

static const char *cfg_name(const spx_kvlow_cfg *c) {
    static char b[96];
    snprintf(b, sizeof b, "k%dv%d %s group %lld rb %d gt %lld", c->kb, c->vb,
             c->layout == SPX_KV_LAYOUT_ROT ? "rot" : "kivi", (long long)c->group, c->rb, (long long)c->gt);
    return b;
}

static void test_store_load(const ref_cache *r) {
    spx_kvlow k;
    if (!lib_build(&k, r, -1)) return;
    float *row = malloc((size_t)r->kvd * sizeof *row), *exp_ = malloc((size_t)r->kvd * sizeof *exp_);
    double worst = 0, worst_ref = 0;
    for (int64_t p = SPX_KVL_BLOCK; p < k.enc[0]; p++)
        for (int value = 0; value < 2; value++)
            for (int refined = 0; refined < 2; refined++) {
                CHECK(spx_kvlow_dequant_row(&k, 0, p, value, refined, row, NULL) == SPX_OK, "dequant %lld", (long long)p);
                const float *src = (refined ? (value ? r->vf : r->kf) : (value ? r->vr : r->kr)) + p * r->kvd;
                if (r->cfg.layout == SPX_KV_LAYOUT_ROT)
                    for (int64_t h = 0; h < r->nkv; h++) hadamard(src + h * r->hd, exp_ + h * r->hd, r->hd, r->rot);
                else memcpy(exp_, src, (size_t)r->kvd * sizeof *exp_);
                for (int64_t i = 0; i < r->kvd; i++) worst = fmax(worst, fabs((double)row[i] - exp_[i]));
                if (refined && r->cfg.rb) /* in model coordinates the bound holds per rotated coordinate only: */
                    for (int64_t i = 0; i < r->kvd && r->cfg.layout == SPX_KV_LAYOUT_KIVI; i++) {
                        const float in = (value ? r->v : r->k)[p * r->kvd + i], s = (value ? r->vs : r->ks)[p * r->kvd + i];
                        worst_ref = fmax(worst_ref, fabs((double)row[i] - in) - s / (double)(1 << (r->cfg.rb + 1)));
                    }
            }
    CHECK(worst < 1e-4, "%s: dequantized rows differ from the reference encoder by %g", cfg_name(&r->cfg), worst);
    CHECK(worst_ref < 1e-4, "%s: a refined value is %g beyond half a refinement step of its input", cfg_name(&r->cfg),
          worst_ref);
    free(row);
    free(exp_);
    spx_kvlow_free(&k);
}

static void test_select(void) {
    uint64_t rng = 7;
    int64_t idx[300], ord[300];
    float sc[300];
    for (int trial = 0; trial < 50; trial++) {
        int64_t n = 1 + (int64_t)(tl_rand_u64(&rng) % 300), n_sel = 1 + (int64_t)(tl_rand_u64(&rng) % (uint64_t)n);
        for (int64_t i = 0; i < n; i++) sc[i] = (float)(tl_rand_u64(&rng) % 17) * 0.25f; /* many ties */
        spx_kvlow_select(sc, n, n_sel, idx);
        for (int64_t i = 0; i < n; i++) ord[i] = i;
        for (int64_t i = 0; i < n; i++) /* full selection sort by (score desc, index asc) */
            for (int64_t j = i + 1; j < n; j++)
                if (sc[ord[j]] > sc[ord[i]] || (sc[ord[j]] == sc[ord[i]] && ord[j] < ord[i])) {
                    int64_t t = ord[i];
                    ord[i] = ord[j];
                    ord[j] = t;
                }
        char in_sel[300] = {0};
        for (int64_t i = 0; i < n_sel; i++) in_sel[idx[i]] = 1;
        int same = 1;
        for (int64_t i = 0; i < n_sel; i++) same &= in_sel[ord[i]];
        CHECK(same, "selection of %lld of %lld differs from the sorted order", (long long)n_sel, (long long)n);
    }
}

/* attention of G heads of KV head kvh at query position n-1 recomputed in
 * double from rows: keys kx, values vx per position (codes' coordinates
 * for encoded positions when rot, rotated query then) */
static void ref_attend(const ref_cache *r, int64_t kvh, int G, const float *q, float scale, const char *sel,
                       int use_fp16_all, float *out) {
    const int64_t hd = r->hd, n = r->n, enc = n / SPX_KVL_BLOCK * SPX_KVL_BLOCK, gt = r->cfg.gt;
    const int rot = r->cfg.layout == SPX_KV_LAYOUT_ROT;
    double *l = malloc((size_t)n * sizeof *l), *o = malloc((size_t)hd * sizeof *o);
    float *qr = malloc((size_t)hd * sizeof *qr), *tmp = malloc((size_t)hd * sizeof *tmp);
    for (int g = 0; g < G; g++) {
        const float *qg = q + g * hd;
        if (rot) hadamard(qg, qr, hd, r->rot);
        double mx = -1e300;
        for (int64_t p = 0; p < n; p++) {
            int encd = !use_fp16_all && p >= SPX_KVL_BLOCK && p < enc;
            int refd = encd && sel && sel[(p - SPX_KVL_BLOCK) / gt];
            const float *kx = (encd ? (refd ? r->kf : r->kr) : r->k) + p * r->kvd + kvh * hd;
            const float *qq = encd && rot ? qr : qg;
            double d = 0;
            for (int64_t i = 0; i < hd; i++) d += (double)qq[i] * kx[i];
            l[p] = d * scale;
            mx = fmax(mx, l[p]);
        }
        double z = 0;
        for (int64_t i = 0; i < hd; i++) o[i] = 0;
        for (int64_t p = 0; p < n; p++) {
            int encd = !use_fp16_all && p >= SPX_KVL_BLOCK && p < enc;
            int refd = encd && sel && sel[(p - SPX_KVL_BLOCK) / gt];
            const float *vx = (encd ? (refd ? r->vf : r->vr) : r->v) + p * r->kvd + kvh * hd;
            if (encd && rot) hadamard(vx, tmp, hd, r->rot), vx = tmp;
            double w = exp(l[p] - mx);
            z += w;
            for (int64_t i = 0; i < hd; i++) o[i] += w * vx[i];
        }
        for (int64_t i = 0; i < hd; i++) out[g * hd + i] = (float)(o[i] / z);
    }
    free(l), free(o), free(qr), free(tmp);
}

/* the brute-force selection: groups of the encoded region by max over
 * heads of the summed resident-key probabilities, top n_sel by full sort */
static void brute_select(const ref_cache *r, int64_t kvh, int G, const float *q, float scale, char *sel) {
    const int64_t hd = r->hd, n = r->n, enc = n / SPX_KVL_BLOCK * SPX_KVL_BLOCK, gt = r->cfg.gt;
    const int64_t ng = (enc - SPX_KVL_BLOCK) / gt;
    float *gs = calloc((size_t)ng + 1, sizeof *gs), *pr = malloc((size_t)n * G * sizeof *pr);
    for (int g = 0; g < G; g++) {
        float qr[2048];
        if (r->cfg.layout == SPX_KV_LAYOUT_ROT) hadamard(q + g * hd, qr, hd, r->rot);
        double mx = -1e300, z = 0;
        double *l = malloc((size_t)n * sizeof *l);
        for (int64_t p = 0; p < n; p++) {
            int encd = p >= SPX_KVL_BLOCK && p < enc;
            const float *kx = (encd ? r->kr : r->k) + p * r->kvd + kvh * hd, *qq = encd && r->cfg.layout == SPX_KV_LAYOUT_ROT ? qr : q + g * hd;
            double d = 0;
            for (int64_t i = 0; i < hd; i++) d += (double)qq[i] * kx[i];
            l[p] = d * scale;
            mx = fmax(mx, l[p]);
        }
        for (int64_t p = 0; p < n; p++) z += exp(l[p] - mx);
        for (int64_t p = SPX_KVL_BLOCK; p < enc; p++) pr[g * n + p] = (float)(exp(l[p] - mx) / z);
        free(l);
    }
    for (int64_t gi = 0; gi < ng; gi++)
        for (int g = 0; g < G; g++) {
            float s = 0;
            for (int64_t t = 0; t < gt; t++) s += pr[g * n + SPX_KVL_BLOCK + gi * gt + t];
            gs[gi] = g == 0 || s > gs[gi] ? s : gs[gi];
        }
    int64_t n_sel = spx_kvlow_n_sel(r->cfg.frac, ng);
    memset(sel, 0, (size_t)ng + 1);
    for (int64_t k = 0; k < n_sel; k++) { /* repeatedly the best not yet taken */
        int64_t b = -1;
        for (int64_t gi = 0; gi < ng; gi++)
            if (!sel[gi] && (b < 0 || gs[gi] > gs[b])) b = gi;
        if (b >= 0) sel[b] = 1;
    }
    free(gs), free(pr);
}

static void test_attention(const ref_cache *r) {
    const int G = 3;
    const int64_t hd = r->hd, n = r->n;
    const float scale = 1.0f / sqrtf((float)hd);
    uint64_t rng = 99;
    float *q = malloc((size_t)G * hd * sizeof *q), *sc = malloc((size_t)G * n * sizeof *sc);
    float *o1 = malloc((size_t)G * hd * sizeof *o1), *o2 = malloc((size_t)G * hd * sizeof *o2),
          *oref = malloc((size_t)G * hd * sizeof *oref);
    for (int64_t i = 0; i < G * hd; i++) q[i] = tl_rand_normal(&rng) * 1.5f;
    spx_kvlow a, b;
    if (!lib_build(&a, r, 0)) return;
    if (!lib_build(&b, r, -1)) return;
    float *work = malloc(spx_kvlow_work_floats(&b, G) * sizeof *work);
    const int64_t kvh = r->nkv - 1;
    /* none selected = the resident path exactly */
    spx_kvlow_attend(&a, NULL, 0, kvh, G, q, hd, 0, n, scale, sc, n, o1, hd, work);
    b.cfg.frac = 0;
    spx_kvlow_attend(&b, NULL, 0, kvh, G, q, hd, 0, n, scale, sc, n, o2, hd, work);
    CHECK(!memcmp(o1, o2, (size_t)G * hd * sizeof *o1), "%s: refinement with no group selected changed the output",
          cfg_name(&r->cfg));
    ref_attend(r, kvh, G, q, scale, NULL, 0, oref);
    tl_cmp c = tl_compare(o1, oref, (size_t)(G * hd), TOL_ATT, TOL_ATT);
    CHECK(c.ok, "%s: resident attention vs recomputed: max %g", cfg_name(&r->cfg), c.max_abs);
    /* eq. 8 with the configured fraction = recomputation with the selected refined */
    b.cfg.frac = r->cfg.frac;
    char *sel = malloc((size_t)n + 2);
    brute_select(r, kvh, G, q, scale, sel);
    spx_kvlow_attend(&b, NULL, 0, kvh, G, q, hd, 0, n, scale, sc, n, o2, hd, work);
    ref_attend(r, kvh, G, q, scale, sel, 0, oref);
    c = tl_compare(o2, oref, (size_t)(G * hd), TOL_ATT, TOL_ATT);
    CHECK(c.ok, "%s: eq. 8 update vs attention recomputed with the refined groups: max %g", cfg_name(&r->cfg), c.max_abs);
    CHECK(tl_max_diff(o1, o2, (size_t)(G * hd)) > 0, "%s: refinement changed nothing", cfg_name(&r->cfg));
    free(sel), free(work);
    spx_kvlow_free(&a);
    spx_kvlow_free(&b);
    free(q), free(sc), free(o1), free(o2), free(oref);
}

/* Sharp queries: scaled up, each head's softmax sits on a few tokens, and
 * the refinement moves their logits by many nats. Where the selected
 * groups held nearly all the resident probability and refinement lowers
 * them, the refined normaliser is tiny: computed as 1 + sum (p' - p) it
 * cancelled to zero (inf/NaN outputs, seen at 2 bits on stories260K).
 * The update must still equal recomputation with the refined groups. */
static void test_sharp(const ref_cache *r) {
    if (!r->cfg.rb) return;
    const int G = 3;
    const int64_t hd = r->hd, n = r->n;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = malloc((size_t)G * hd * sizeof *q), *sc = malloc((size_t)G * n * sizeof *sc);
    float *o = malloc((size_t)G * hd * sizeof *o), *oref = malloc((size_t)G * hd * sizeof *oref);
    char *sel = malloc((size_t)n + 2);
    spx_kvlow b;
    if (!lib_build(&b, r, -1)) return;
    float *work = malloc(spx_kvlow_work_floats(&b, G) * sizeof *work);
    static const float gain[] = {6, 12, 24};
    double worst = 0;
    int bad = 0;
    for (int gi = 0; gi < 3; gi++)
        for (uint64_t seed = 1; seed <= 8; seed++) {
            uint64_t rng = 1000 * seed + (uint64_t)gi;
            for (int64_t i = 0; i < G * hd; i++) q[i] = tl_rand_normal(&rng) * gain[gi];
            const int64_t kvh = (int64_t)(seed % (uint64_t)r->nkv);
            brute_select(r, kvh, G, q, scale, sel);
            spx_kvlow_attend(&b, NULL, 0, kvh, G, q, hd, 0, n, scale, sc, n, o, hd, work);
            ref_attend(r, kvh, G, q, scale, sel, 0, oref);
            /* logits of +-100 carry float rounding of about 1e-5 nats each */
            tl_cmp c = tl_compare(o, oref, (size_t)(G * hd), 1e-3, 1e-3);
            if (!c.ok) bad++;
            if (c.nan || c.max_abs > worst) worst = c.nan ? INFINITY : c.max_abs;
        }
    CHECK(!bad, "%s: sharp queries: %d of 24 refined outputs differ from recomputation (max %g)", cfg_name(&r->cfg), bad,
          worst);
    free(work);
    spx_kvlow_free(&b);
    free(q), free(sc), free(o), free(oref), free(sel);
}

/* The file tier (cfg.tier_dir) against host RAM on the same rows and
 * queries: with the wait policy the outputs are identical (same records,
 * same order of work) whatever the cache's size; with the skip policy and
 * no cache every selected group misses, which is the resident path
 * exactly; with a cache that holds the selected records but not the
 * whole tier, the first query misses some, and after the loaders ran the
 * same query is identical to host RAM. */
static void test_file_tier(const ref_cache *r) {
    const int G = 3;
    const int64_t hd = r->hd, n = r->n, kvh = r->nkv - 1;
    const float scale = 1.0f / sqrtf((float)hd);
    uint64_t rng = 1234;
    float *q = malloc((size_t)G * hd * sizeof *q), *sc = malloc((size_t)G * n * sizeof *sc);
    float *oram = malloc((size_t)G * hd * sizeof *oram), *o = malloc((size_t)G * hd * sizeof *o),
          *ores = malloc((size_t)G * hd * sizeof *ores);
    for (int64_t i = 0; i < G * hd; i++) q[i] = tl_rand_normal(&rng) * 1.5f;
    spx_kvlow ram;
    if (!lib_build(&ram, r, -1)) return;
    float *work = malloc(spx_kvlow_work_floats(&ram, G) * sizeof *work);
    spx_kvlow_attend(&ram, NULL, 0, kvh, G, q, hd, 0, n, scale, sc, n, oram, hd, work);
    ram.cfg.frac = 0;
    spx_kvlow_attend(&ram, NULL, 0, kvh, G, q, hd, 0, n, scale, sc, n, ores, hd, work);
    const int64_t cand = (ram.enc[0] - SPX_KVL_BLOCK) / r->cfg.gt, n_sel = spx_kvlow_n_sel(r->cfg.frac, cand);
    struct { int wait; uint64_t cache; const char *what; } cases[] = {
        {1, (uint64_t)1 << 30, "wait, everything cached"},
        {1, ram.gbytes, "wait, a one-record cache"},
        {0, 0, "skip, no cache"},
        {0, (uint64_t)(n_sel + 2) * ram.gbytes, "skip, a cache of the selected records"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        ref_cache rf = *r;
        rf.cfg.tier_dir = tl_tmpdir();
        rf.cfg.tier_cache = cases[ci].cache;
        rf.cfg.tier_wait = cases[ci].wait;
        spx_kvlow f;
        if (!lib_build(&f, &rf, -1)) continue;
        CHECK(f.ft && !f.tier, "%s: no file tier", cases[ci].what);
        CHECK(!memcmp(f.ck, ram.ck, (size_t)ram.n_ctx * ram.krow) && !memcmp(f.cv, ram.cv, (size_t)ram.n_ctx * ram.vrow),
              "%s: codes differ from host RAM's", cases[ci].what);
        spx_kvlow_attend(&f, NULL, 0, kvh, G, q, hd, 0, n, scale, sc, n, o, hd, work);
        const float *want = ci == 2 ? ores : ci == 3 ? NULL : oram;
        if (want)
            CHECK(!memcmp(o, want, (size_t)G * hd * sizeof *o), "%s: output differs from %s (max %g)", cases[ci].what,
                  ci == 2 ? "the resident path" : "host RAM's", tl_max_diff(o, want, (size_t)(G * hd)));
        spx_err e;
        spx_err_clear(&e);
        CHECK(spx_kvlow_error(&f, &e) == SPX_OK && spx_kvlow_step_end(&f, &e) == SPX_OK, "%s: %s", cases[ci].what, e.msg);
        if (ci == 2)
            CHECK(f.stats.groups_missed == (uint64_t)n_sel && f.stats.groups_refined == 0,
                  "%s: %llu of %lld selected groups missed", cases[ci].what, (unsigned long long)f.stats.groups_missed,
                  (long long)n_sel);
        if (ci == 3) {
            CHECK(f.stats.groups_missed > 0, "%s: the first query found every record cached", cases[ci].what);
            spx_tier_drain(f.ft, &e);
            uint64_t missed = f.stats.groups_missed;
            spx_kvlow_attend(&f, NULL, 0, kvh, G, q, hd, 0, n, scale, sc, n, o, hd, work);
            CHECK(f.stats.groups_missed == missed && !memcmp(o, oram, (size_t)G * hd * sizeof *o),
                  "%s: after the loads the same query is not host RAM's (%llu more misses, max %g)", cases[ci].what,
                  (unsigned long long)(f.stats.groups_missed - missed), tl_max_diff(o, oram, (size_t)(G * hd)));
            CHECK(spx_kvlow_step_end(&f, &e) == SPX_OK, "step_end: %s", e.msg);
        }
        /* the rows read back with refinement: host RAM's */
        float *a = malloc((size_t)r->kvd * sizeof *a), *b = malloc((size_t)r->kvd * sizeof *b);
        for (int64_t p = SPX_KVL_BLOCK; p < ram.enc[0]; p += 37) {
            CHECK(spx_kvlow_dequant_row(&f, 0, p, p & 1, 1, a, &e) == SPX_OK &&
                      spx_kvlow_dequant_row(&ram, 0, p, p & 1, 1, b, &e) == SPX_OK &&
                      !memcmp(a, b, (size_t)r->kvd * sizeof *a),
                  "%s: refined row %lld differs from host RAM's: %s", cases[ci].what, (long long)p, e.msg);
        }
        free(a), free(b);
        spx_kvlow_free(&f);
    }
    CHECK(tl_dir_entries(tl_tmpdir()) == 0, "a file tier left a file in %s", tl_tmpdir());
    free(work);
    spx_kvlow_free(&ram);
    free(q), free(sc), free(oram), free(o), free(ores);
}

/* all groups, +8 bits: fp16-KV attention */
static void test_full_refine(const spx_kvlow_cfg *c0, int64_t n, int64_t hd, int64_t nkv) {
    spx_kvlow_cfg c = *c0;
    c.rb = 8;
    c.frac = 1;
    ref_cache r;
    ref_build(&r, &c, n, hd, nkv, 5);
    const int G = 2;
    const float scale = 1.0f / sqrtf((float)hd);
    uint64_t rng = 3;
    float q[2 * 256], o[2 * 256], oref[2 * 256], *sc = malloc((size_t)G * n * sizeof *sc);
    for (int64_t i = 0; i < G * hd; i++) q[i] = tl_rand_normal(&rng);
    spx_kvlow k;
    if (lib_build(&k, &r, -1)) {
        float *work = malloc(spx_kvlow_work_floats(&k, G) * sizeof *work);
        spx_kvlow_attend(&k, NULL, 0, 0, G, q, hd, 0, n, scale, sc, n, o, hd, work);
        ref_attend(&r, 0, G, q, scale, NULL, 1, oref);
        tl_cmp cm = tl_compare(o, oref, (size_t)(G * hd), TOL_ATT_FULL, 0);
        CHECK(cm.ok, "%s: all groups +8 bits vs fp16 attention: max %g", cfg_name(&c), cm.max_abs);
        free(work);
        spx_kvlow_free(&k);
    }
    free(sc);
    ref_free(&r);
}

/* logits of the last prompt token and of `steps` decode steps after it */
static float *run_session(spx_model *m, const spx_session_params *sp, const int32_t *ids, int n_prompt, int steps,
                          int trunc_to) {
    const int64_t V = spx_model_vocab_size(m);
    float *lg = malloc((size_t)(steps + 1) * (size_t)V * sizeof *lg);
    spx_session *s = NULL;
    CHECK(spx_session_new(m, sp, &s) == SPX_OK, "session: %s", spx_model_error(m));
    if (!s) { free(lg); return NULL; }
    int ok = spx_session_eval(s, ids, (size_t)n_prompt, lg, 0) == SPX_OK;
    if (trunc_to >= 0) { /* back to trunc_to, then the same tokens again */
        ok = ok && spx_session_truncate(s, trunc_to) == SPX_OK;
        ok = ok && spx_session_eval(s, ids + trunc_to, (size_t)(n_prompt - trunc_to), lg, 0) == SPX_OK;
    }
    for (int t = 0; ok && t < steps; t++) ok = spx_session_eval(s, ids + n_prompt + t, 1, lg + (size_t)(t + 1) * V, 0) == SPX_OK;
    CHECK(ok, "eval: %s", spx_session_error(s));
    spx_session_free(s);
    return lg;
}

/* name: docllama-58m; in the sanitizer pass (SPECTRA_TEST_QUICK), where
 * its seven 600-token sessions took most of the pass, tiny-llama3
 * (head_dim 32, 2,048 positions, a hundredth of the work per token): the
 * same sessions and checks */
static void test_e2e(const char *name) {
    spx_model *m = NULL;
    spx_model_params mp = {.n_threads = 2, .backend = "cpu"};
    char rel[64];
    snprintf(rel, sizeof rel, "models/%s", name);
    if (spx_model_open(tl_shared(rel), &mp, &m) != SPX_OK) {
        CHECK(0, "open %s: %s", name, spx_last_error());
        return;
    }
    enum { NP = 600, ST = 12 };
    int32_t ids[NP + ST];
    uint64_t rng = 11;
    const uint64_t V = (uint64_t)spx_model_vocab_size(m), span = V > 31000 ? 31000 : V - 1; /* ids 1 .. span */
    for (int i = 0; i < NP + ST; i++) ids[i] = 1 + (int32_t)(tl_rand_u64(&rng) % span);
    const size_t n = (size_t)(ST + 1) * (size_t)spx_model_vocab_size(m);
    spx_session_params f16 = {.n_ctx = NP + ST, .kv = SPX_KV_F16};
    spx_session_params full = {.n_ctx = NP + ST, .kv = SPX_KV_K4V4, .kv_refine = 8, .kv_refine_frac = 1};
    spx_session_params k2 = {.n_ctx = NP + ST, .kv = SPX_KV_K2V2};
    spx_session_params k2r = {.n_ctx = NP + ST, .kv = SPX_KV_K2V2, .kv_refine = 8, .kv_refine_frac = 1};
    float *a = run_session(m, &f16, ids, NP, ST, -1), *b = run_session(m, &full, ids, NP, ST, -1);
    float *c = run_session(m, &k2, ids, NP, ST, -1), *d = run_session(m, &k2r, ids, NP, ST, -1);
    float *t = run_session(m, &full, ids, NP, ST, 450);
    /* the same two with the records in a file tier (wait: identical), one
     * of them through a cache far smaller than the tier */
    spx_session_params k2f = k2r, fullf = full;
    k2f.kv_tier_dir = fullf.kv_tier_dir = tl_tmpdir();
    k2f.kv_tier_wait = fullf.kv_tier_wait = 1;
    k2f.kv_tier_cache_mb = 1;
    float *df = run_session(m, &k2f, ids, NP, ST, -1), *tf = run_session(m, &fullf, ids, NP, ST, 450);
    if (d && df) CHECK(!memcmp(d, df, n * sizeof *d), "k2v2 +8 all: file tier (1 MiB cache) logits differ from host RAM's");
    if (t && tf) CHECK(!memcmp(t, tf, n * sizeof *t), "truncate + re-feed: file tier logits differ from host RAM's");
    free(df), free(tf);
    {
        spx_session *s = NULL;
        spx_session_params bad = {.n_ctx = 512, .kv = SPX_KV_K2V2, .kv_tier_dir = "/nonexistent/spectra-kv"};
        CHECK(spx_session_new(m, &bad, &s) == SPX_ERR_IO && !s && strstr(spx_model_error(m), "/nonexistent/spectra-kv"),
              "a missing tier folder: %s", spx_model_error(m));
        spx_session_params norefine = {.n_ctx = 512, .kv = SPX_KV_K2V2, .kv_tier_dir = tl_tmpdir()};
        CHECK(spx_session_new(m, &norefine, &s) == SPX_OK && s, "--kv-tier alone: %s", spx_model_error(m));
        if (s) CHECK(s->kv.low.cfg.rb == 4 && s->kv.low.ft, "--kv-tier alone: refinement bits %d (expected 4 by default)",
                     s->kv.low.cfg.rb);
        spx_session_free(s);
    }
    if (a && b && c && d && t) {
        double e_full = tl_max_diff(a, b, n), e_k2 = tl_mean_diff(a, c, n), e_k2r = tl_mean_diff(a, d, n);
        double e_tr = tl_max_diff(a, t, n);
        CHECK(e_full < TOL_E2E, "k4v4 +8 bits on every group vs f16 KV: max logit difference %g", e_full);
        CHECK(e_k2r < e_k2 / 4, "k2v2: refinement on every group does not bring it near f16 (mean %g vs %g)", e_k2r, e_k2);
        CHECK(e_tr < TOL_E2E, "truncate into an encoded block and re-feed: max logit difference %g from f16", e_tr);
        printf("e2e: k4v4+8 all vs f16 max %.4f; k2v2 mean %.4f, +8 all %.4f; truncate+refeed max %.4f\n", e_full, e_k2,
               e_k2r, e_tr);
    }
    free(a), free(b), free(c), free(d), free(t);
    /* spx_session_seek (bench -d): only from 0, below n_ctx; the blocks below count as encoded */
    spx_session *s = NULL;
    CHECK(spx_session_new(m, &k2, &s) == SPX_OK, "session: %s", spx_model_error(m));
    if (s) {
        float *lg = malloc((size_t)spx_model_vocab_size(m) * sizeof *lg);
        CHECK(lg && spx_session_eval(s, ids, 1, lg, 0) == SPX_OK, "eval: %s", spx_session_error(s));
        CHECK(spx_session_seek(s, 300) == SPX_ERR_RANGE, "seek from position 1 accepted");
        spx_session_reset(s);
        CHECK(spx_session_seek(s, NP + ST) == SPX_ERR_RANGE, "seek to n_ctx accepted");
        CHECK(spx_session_seek(s, 300) == SPX_OK && spx_session_pos(s) == 300, "seek to 300: %s", spx_session_error(s));
        for (int64_t l = 0; l < s->kv.low.n_layers; l++)
            CHECK(s->kv.low.enc[l] == 256, "seek to 300: layer %lld encoded to %lld, not 256", (long long)l,
                  (long long)s->kv.low.enc[l]);
        CHECK(lg && spx_session_eval(s, ids, 1, lg, 0) == SPX_OK && spx_session_pos(s) == 301, "eval after seek: %s",
              spx_session_error(s));
        int finite = lg != NULL;
        for (int64_t i = 0; lg && i < spx_model_vocab_size(m); i++) finite &= isfinite(lg[i]);
        CHECK(finite, "logits after seek not finite");
        free(lg);
    }
    spx_session_free(s);
    spx_model_free(m);
}

int main(void) {
    test_select();
    static const spx_kv_type types[] = {SPX_KV_K2V2, SPX_KV_K3V2, SPX_KV_K3V3, SPX_KV_K4V4};
    int n_cfg = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int layout = SPX_KV_LAYOUT_KIVI; layout <= SPX_KV_LAYOUT_ROT; layout++)
            for (int gi = 0; gi < 2; gi++) {
                spx_session_params sp = {.kv = types[ti], .kv_layout = (spx_kv_layout)layout, .kv_group = gi ? 64 : 32,
                                         .kv_refine = ti == 1 ? 3 : 4, .kv_refine_frac = 1.0 / 8,
                                         .kv_refine_tokens = gi ? 2 : 4};
                spx_kvlow_cfg c;
                spx_err e;
                spx_err_clear(&e);
                CHECK(spx_kvlow_config(types[ti], &sp, 0, 64, &c, &e) == SPX_OK, "%s", e.msg);
                ref_cache r;
                ref_build(&r, &c, 128 * 4 + 77, 64, 2, 1 + (uint64_t)n_cfg);
                test_store_load(&r);
                test_attention(&r);
                test_sharp(&r);
                if (gi == 0 && c.rb) test_file_tier(&r);
                ref_free(&r);
                if (gi == 0) test_full_refine(&c, 128 * 3 + 5, 64, 1);
                n_cfg++;
            }
    printf("kvlow: %d configurations\n", n_cfg);
    {
        spx_kvlow_cfg c;
        spx_err e;
        spx_err_clear(&e);
        spx_session_params bad = {.kv = SPX_KV_K2V2, .kv_group = 48};
        CHECK(spx_kvlow_config(SPX_KV_K2V2, &bad, 0, 64, &c, &e) == SPX_ERR_ARG && strstr(e.msg, "kv-group"), "%s", e.msg);
        spx_err_clear(&e);
        spx_session_params bad2 = {.kv = SPX_KV_K2V2, .kv_refine_tokens = 3};
        CHECK(spx_kvlow_config(SPX_KV_K2V2, &bad2, 0, 64, &c, &e) == SPX_ERR_ARG && strstr(e.msg, "divide"), "%s", e.msg);
        spx_err_clear(&e);
        CHECK(spx_kvlow_config(SPX_KV_K2V2, NULL, 0, 60, &c, &e) == SPX_ERR_UNSUPPORTED, "%s", e.msg);
    }
    test_e2e(getenv("SPECTRA_TEST_QUICK") ? "tiny-llama3" : "docllama-58m");
    return tl_finish("test_kvlow");
}
