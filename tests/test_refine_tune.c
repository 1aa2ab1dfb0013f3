/* test_refine_tune.c: the tuner (refine/tune.h) and its record in the
 * .refine manifest (docs/trdc.md 2.6).
 *   - the search against synthetic cost and quality models whose answer is
 *     known: the largest feasible common k, greedy raises where they fit
 *     and help, none where they do not help, the base when nothing fits,
 *     noisy measurements, argument and callback errors;
 *   - the other dimensions against a synthetic model of them: neuron mode
 *     winning (and kn raised), the fastest block count chosen by speed
 *     alone, the lag whose larger feasible budget outweighs its KL cost,
 *     every result within the budget; bad modes refused;
 *   - the "tuned" section: written twice (ascending, replacing one budget),
 *     read back, the payload's checksums unchanged, the nearest entry not
 *     above a level picked; the optional mode and schedule written and
 *     read back, an entry without them read with the defaults;
 *     hand-corrupted sections refused with messages;
 *     a model file and a missing file refused, no temp file left behind. */
#define _POSIX_C_SOURCE 200809L
#include "testlib.h"
#include "format/trdc.h"
#include "refine/tune.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- synthetic measurements ------------------------------------------- */

/* slowdown = sum_s cost[s] * k[s] (+ noise); KL = sum_s gain[s] / (1 + k[s]) */
typedef struct model {
    double cost[4], gain[4];
    double noise;      /* amplitude of a deterministic +- jitter */
    uint64_t rng;
    int n_sd, n_kl;
    int fail_after;    /* the slowdown callback fails at this call (0: never) */
} model;

static spx_status sd_fn(void *u, const spx_refine_config *c, double *out, spx_err *e) {
    model *m = u;
    if (m->fail_after && ++m->n_sd >= m->fail_after) return spx_fail(e, SPX_ERR_IO, "synthetic failure");
    if (!m->fail_after) m->n_sd++;
    double s = 0;
    for (int i = 0; i < 4; i++) s += m->cost[i] * (double)c->k[i];
    if (m->noise > 0) s += m->noise * (2 * tl_rand_uniform(&m->rng) - 1);
    *out = s;
    return SPX_OK;
}

static spx_status kl_fn(void *u, const spx_refine_config *c, double *out, spx_err *e) {
    model *m = u;
    m->n_kl++;
    double s = 0;
    for (int i = 0; i < 4; i++) s += m->gain[i] / (1.0 + (double)c->k[i]);
    *out = s;
    return SPX_OK;
}

/* optimistic first measurements: a configuration's first slowdown reads
 * at a tenth of its cost (with uniform_exact, only when its budgets
 * differ), every later one at its cost */
typedef struct optimist {
    model m;
    int uniform_exact;
    spx_refine_config seen[256];
    int n_seen;
} optimist;

static spx_status opt_sd(void *u, const spx_refine_config *c, double *out, spx_err *e) {
    optimist *o = u;
    double s = 0;
    for (int i = 0; i < 4; i++) s += o->m.cost[i] * (double)c->k[i];
    int again = 0;
    for (int i = 0; i < o->n_seen; i++) again |= !memcmp(&o->seen[i], c, sizeof *c);
    if (!again && o->n_seen < 256) o->seen[o->n_seen++] = *c;
    const int uniform = c->k[0] == c->k[1] && c->k[1] == c->k[2] && c->k[2] == c->k[3];
    *out = again || (o->uniform_exact && uniform) ? s : s / 10;
    return SPX_OK;
}

static double slow_of(const model *m, const spx_refine_config *c) {
    double s = 0;
    for (int i = 0; i < 4; i++) s += m->cost[i] * (double)c->k[i];
    return s;
}

static spx_status run(model *m, double budget, spx_tune_result *r, spx_err *e) {
    spx_tune_params p = {.budget = budget};
    spx_tune_ops ops = {.user = m, .slowdown = sd_fn, .kl = kl_fn};
    spx_err_clear(e);
    return spx_refine_tune(&p, &ops, r, e);
}

static int same_k(const spx_refine_config *c, int64_t a, int64_t b, int64_t cc, int64_t d) {
    return c->k[0] == a && c->k[1] == b && c->k[2] == cc && c->k[3] == d;
}

static void test_search(void) {
    spx_err e;
    spx_tune_result r;
    size_t nl;
    const int64_t *lad = spx_tune_default_ladder(&nl);

    /* 1. down is ten times cheaper: common k 16 (16 * 0.0031 = 0.0496 <= 0.06
     * < 32 * 0.0031), then down alone climbs the ladder while it fits
     * (96: 0.0576; 128: 0.0608 is over), every other raise is over */
    model m = {.cost = {0.001, 0.001, 0.001, 0.0001}, .gain = {1, 1, 1, 1}};
    CHECK(run(&m, 0.06, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(same_k(&r.best, 16, 16, 16, 96), "cheap down: got k %lld,%lld,%lld,%lld, expected 16,16,16,96",
          (long long)r.best.k[0], (long long)r.best.k[1], (long long)r.best.k[2], (long long)r.best.k[3]);
    CHECK(fabs(r.slowdown - 0.0576) < 1e-12 && fabs(r.kl - (3.0 / 17 + 1.0 / 97)) < 1e-12 &&
              fabs(r.kl_base - 4) < 1e-12,
          "cheap down: slowdown %g kl %g base %g", r.slowdown, r.kl, r.kl_base);
    CHECK(r.n_kl == m.n_kl && r.n_slowdown == m.n_sd, "counts %d/%d vs %d/%d", r.n_kl, r.n_slowdown, m.n_kl, m.n_sd);

    /* 2. the largest feasible common k over the ladder, for many budgets:
     * uniform costs leave the greedy phase nothing that fits */
    for (double b = 0.003; b < 0.9; b *= 1.7) {
        model u = {.cost = {0.0005, 0.0005, 0.0005, 0.0005}, .gain = {1, 2, 3, 4}};
        CHECK(run(&u, b, &r, &e) == SPX_OK, "%s", e.msg);
        int64_t want = 0;
        for (size_t i = 0; i < nl; i++)
            if (0.002 * (double)lad[i] <= b) want = lad[i];
        int64_t lo = r.best.k[0];
        for (int s = 0; s < 4; s++) lo = r.best.k[s] < lo ? r.best.k[s] : lo;
        CHECK(lo == want, "budget %g: common k %lld, expected %lld", b, (long long)lo, (long long)want);
        CHECK(slow_of(&u, &r.best) <= b + 1e-12, "budget %g: result over the budget", b);
        /* no single raise of the result both fits and lowers KL (the stopping rule) */
        for (int s = 0; s < 4; s++) {
            spx_refine_config c = r.best;
            size_t i = 0;
            while (i + 1 < nl && lad[i] <= c.k[s]) i++;
            if (lad[i] <= c.k[s]) continue;
            c.k[s] = lad[i];
            CHECK(slow_of(&u, &c) > b, "budget %g: raising set %d still fits", b, s);
        }
    }

    /* 3. a set whose refinement does not help (gain 0) is not raised even
     * though it is cheap; the one that helps is */
    model f = {.cost = {0.001, 0.001, 0.00001, 0.0001}, .gain = {1, 1, 0, 1}};
    CHECK(run(&f, 0.06, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(r.best.k[2] == 16 && r.best.k[3] > 16, "flat gate/up: got %lld,%lld,%lld,%lld", (long long)r.best.k[0],
          (long long)r.best.k[1], (long long)r.best.k[2], (long long)r.best.k[3]);

    /* 4. nothing fits at a common k of 1: the base, then single sets */
    model h = {.cost = {0.5, 0.5, 0.5, 0.004}, .gain = {1, 1, 1, 1}};
    CHECK(run(&h, 0.02, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(same_k(&r.best, 0, 0, 0, 4), "expensive: got %lld,%lld,%lld,%lld, expected 0,0,0,4", (long long)r.best.k[0],
          (long long)r.best.k[1], (long long)r.best.k[2], (long long)r.best.k[3]);

    /* 5. noise: whatever is measured, the result was measured within the budget */
    for (uint64_t seed = 1; seed <= 20; seed++) {
        model n = {.cost = {0.001, 0.002, 0.0005, 0.0001}, .gain = {1, 2, 1, 3}, .noise = 0.01, .rng = seed};
        CHECK(run(&n, 0.05, &r, &e) == SPX_OK, "%s", e.msg);
        CHECK(r.slowdown <= 0.05 && r.kl <= r.kl_base, "noisy seed %llu: slowdown %g kl %g base %g",
              (unsigned long long)seed, r.slowdown, r.kl, r.kl_base);
        CHECK(r.n_slowdown <= 5 + SPX_TUNE_DEFAULT_TRIALS, "noisy: %d slowdown measurements", r.n_slowdown);
    }

    /* 6. a search misled by optimistic first measurements: the
     * confirmation falls back along the kept configurations to one whose
     * second measurement fits (with these costs, the base itself) */
    optimist op = {.m = {.cost = {0.01, 0.01, 0.01, 0.01}, .gain = {1, 1, 1, 1}}};
    spx_tune_params po = {.budget = 0.05};
    spx_tune_ops oo = {.user = &op, .slowdown = opt_sd, .kl = kl_fn};
    spx_err_clear(&e);
    CHECK(spx_refine_tune(&po, &oo, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(slow_of(&op.m, &r.best) <= 0.05 && r.slowdown <= 0.05, "optimist: k %lld,%lld,%lld,%lld costs %g",
          (long long)r.best.k[0], (long long)r.best.k[1], (long long)r.best.k[2], (long long)r.best.k[3],
          slow_of(&op.m, &r.best));
    /* the chain was base, common 8 (0.32 truly), raises above it: only the base confirms */
    CHECK(same_k(&r.best, 0, 0, 0, 0) && r.kl == r.kl_base && r.slowdown == 0, "optimist: expected the base, got %lld",
          (long long)r.best.k[0]);
    /* exact common-k measurements, optimistic raises: every raise above the
     * common 16 was kept on its first reading and is over on its second,
     * so the confirmation walks back to the common k */
    optimist op2 = {.m = {.cost = {0.001, 0.001, 0.001, 0.0001}, .gain = {1, 1, 1, 1}}, .uniform_exact = 1};
    oo.user = &op2;
    spx_err_clear(&e);
    CHECK(spx_refine_tune(&po, &oo, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(same_k(&r.best, 16, 16, 16, 16) && fabs(r.slowdown - 0.0496) < 1e-12,
          "optimist 2: k %lld,%lld,%lld,%lld slowdown %g (expected the common 16 at 0.0496: every raise is over)",
          (long long)r.best.k[0], (long long)r.best.k[1], (long long)r.best.k[2], (long long)r.best.k[3], r.slowdown);

    /* 7. refusals and errors */
    model z = {.cost = {0.001, 0.001, 0.001, 0.001}, .gain = {1, 1, 1, 1}};
    CHECK(run(&z, 0, &r, &e) == SPX_ERR_ARG, "budget 0 accepted");
    CHECK(run(&z, 1, &r, &e) == SPX_ERR_ARG, "budget 1 accepted");
    const int64_t bad1[] = {1, 2, 4}, bad2[] = {0, 4, 4};
    spx_tune_ops ops = {.user = &z, .slowdown = sd_fn, .kl = kl_fn};
    spx_tune_params p = {.budget = 0.05, .ladder = bad1, .n_ladder = 3};
    spx_err_clear(&e);
    CHECK(spx_refine_tune(&p, &ops, &r, &e) == SPX_ERR_ARG && strstr(e.msg, "start at 0"), "ladder from 1: %s", e.msg);
    p.ladder = bad2;
    spx_err_clear(&e);
    CHECK(spx_refine_tune(&p, &ops, &r, &e) == SPX_ERR_ARG && strstr(e.msg, "ascending"), "flat ladder: %s", e.msg);
    model x = {.cost = {0.001, 0.001, 0.001, 0.001}, .gain = {1, 1, 1, 1}, .fail_after = 2};
    CHECK(run(&x, 0.05, &r, &e) == SPX_ERR_IO && strstr(e.msg, "synthetic"), "callback error: %d %s", (int)e.code,
          e.msg);
    /* a custom ladder and the trial cap */
    const int64_t lad2[] = {0, 10, 20};
    model c2 = {.cost = {0.001, 0.001, 0.001, 0.0001}, .gain = {1, 1, 1, 1}};
    p = (spx_tune_params){.budget = 0.05, .ladder = lad2, .n_ladder = 3, .max_trials = 1};
    ops.user = &c2;
    spx_err_clear(&e);
    CHECK(spx_refine_tune(&p, &ops, &r, &e) == SPX_OK, "%s", e.msg);
    /* common 10 (0.031; 20 is over), then one raise: q/k/v to 20 (0.041) fits and helps; its confirmation */
    CHECK(same_k(&r.best, 20, 10, 10, 10) && c2.n_sd == 2 + 1 + 1, "custom ladder: k %lld,%lld, %d slowdowns",
          (long long)r.best.k[0], (long long)r.best.k[1], c2.n_sd);
}

/* ---- MLP mode and GPU schedule ----------------------------------------- */

/* channel mode as `model`; neuron mode: q/k/v and o as there, the MLP by
 * kn at ncost / ngain. The schedule scales the slowdown: by bf[] per
 * block count, by 1 / (1 + lag / 2) (a later fetch hides more), and adds
 * lag_kl * lag to the KL (a stale residual stream). */
typedef struct ext {
    model m;
    double ncost, ngain;
    double lag_kl;
    int n_sched_kl; /* KL calls whose configuration differs from an earlier one only in blocks */
    spx_refine_config kl_seen[512];
    int n_kl_seen;
} ext;

static double block_factor(int32_t b) { return b == 8 ? 1.5 : b == 32 ? 0.7 : b == 64 ? 0.9 : 1.0; }

static double ext_slow(const ext *x, const spx_refine_config *c) {
    double s = x->m.cost[0] * (double)c->k[0] + x->m.cost[1] * (double)c->k[1];
    if (c->mlp == SPX_REFINE_MLP_NEURON) s += x->ncost * (double)c->kn;
    else s += x->m.cost[2] * (double)c->k[2] + x->m.cost[3] * (double)c->k[3];
    return s * block_factor(c->blocks) / (1 + 0.5 * c->lag);
}

static double ext_kl(const ext *x, const spx_refine_config *c) {
    double s = x->m.gain[0] / (1.0 + (double)c->k[0]) + x->m.gain[1] / (1.0 + (double)c->k[1]);
    if (c->mlp == SPX_REFINE_MLP_NEURON) s += x->ngain / (1.0 + (double)c->kn);
    else s += x->m.gain[2] / (1.0 + (double)c->k[2]) + x->m.gain[3] / (1.0 + (double)c->k[3]);
    return s + x->lag_kl * c->lag;
}

static spx_status ext_sd_fn(void *u, const spx_refine_config *c, double *out, spx_err *e) {
    ext *x = u;
    x->m.n_sd++;
    *out = ext_slow(x, c);
    return SPX_OK;
}

static spx_status ext_kl_fn(void *u, const spx_refine_config *c, double *out, spx_err *e) {
    ext *x = u;
    x->m.n_kl++;
    for (int i = 0; i < x->n_kl_seen; i++) x->n_sched_kl += spx_refine_config_eq(&x->kl_seen[i], c, 0);
    if (x->n_kl_seen < 512) x->kl_seen[x->n_kl_seen++] = *c;
    *out = ext_kl(x, c);
    return SPX_OK;
}

typedef struct trials {
    int n_sched, n_sched_kept;
    int32_t chosen_blocks;
} trials;

static trials g_trials;
static void ext_progress(void *u, const spx_tune_trial *t) {
    (void)u;
    if (t->phase != SPX_TUNE_SCHEDULE) return;
    g_trials.n_sched++;
    if (t->kept) {
        g_trials.n_sched_kept++;
        g_trials.chosen_blocks = t->c.blocks;
    }
    CHECK(isnan(t->kl), "a block-count trial measured KL");
}

static spx_status ext_run(ext *x, double budget, const spx_refine_config *modes, size_t n_modes, const int32_t *blocks,
                          size_t n_blocks, spx_tune_result *r, spx_err *e) {
    spx_tune_params p = {.budget = budget, .modes = modes, .n_modes = n_modes, .blocks = blocks, .n_blocks = n_blocks};
    spx_tune_ops ops = {.user = x, .slowdown = ext_sd_fn, .kl = ext_kl_fn, .progress = ext_progress};
    memset(&g_trials, 0, sizeof g_trials);
    spx_err_clear(e);
    return spx_refine_tune(&p, &ops, r, e);
}

/* The largest ladder value k whose common configuration of mode fits. */
static int64_t common_of(const ext *x, const spx_refine_config *mode, double budget) {
    size_t nl;
    const int64_t *lad = spx_tune_default_ladder(&nl);
    int64_t best = 0;
    for (size_t i = 0; i < nl; i++) {
        spx_refine_config c = spx_refine_config_common(mode, lad[i]);
        if (ext_slow(x, &c) <= budget) best = lad[i];
    }
    return best;
}

static void test_dimensions(void) {
    spx_err e;
    spx_tune_result r;
    char buf[128];

    /* the common configuration of each mode, and its string */
    const spx_refine_config nm = {.mlp = SPX_REFINE_MLP_NEURON}, ch = {.mlp = SPX_REFINE_MLP_CHANNEL};
    spx_refine_config c = spx_refine_config_common(&nm, 32);
    CHECK(same_k(&c, 32, 32, 0, 0) && c.kn == 24, "neuron common 32: k %lld,%lld,%lld,%lld kn %lld",
          (long long)c.k[0], (long long)c.k[1], (long long)c.k[2], (long long)c.k[3], (long long)c.kn);
    CHECK(!strcmp(spx_refine_config_str(&c, buf, sizeof buf), "k 32,32 kn 24 (neuron)"), "str '%s'", buf);
    c = spx_refine_config_common(&ch, 8);
    c.blocks = 32, c.lag = 1;
    CHECK(!strcmp(spx_refine_config_str(&c, buf, sizeof buf), "k 8,8,8,8 blocks 32 lag 0.5 lead 0"), "str '%s'", buf);

    /* 1. neuron mode wins: its MLP is cheaper per unit of budget and helps
     * more, so its common k is larger and its KL lower; kn is raised */
    ext x = {.m = {.cost = {0.001, 0.001, 0.002, 0.002}, .gain = {1, 1, 2, 2}}, .ncost = 0.0005, .ngain = 4};
    const spx_refine_config two[] = {ch, nm};
    CHECK(ext_run(&x, 0.06, two, 2, NULL, 0, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(r.best.mlp == SPX_REFINE_MLP_NEURON && r.best.k[2] == 0 && r.best.k[3] == 0,
          "neuron cheaper: chose mlp %d k %lld,%lld,%lld,%lld", (int)r.best.mlp, (long long)r.best.k[0],
          (long long)r.best.k[1], (long long)r.best.k[2], (long long)r.best.k[3]);
    CHECK(ext_slow(&x, &r.best) <= 0.06 && r.slowdown <= 0.06, "neuron: over the budget (%g)", ext_slow(&x, &r.best));
    c = spx_refine_config_common(&nm, common_of(&x, &nm, 0.06));
    CHECK(r.best.kn > c.kn && r.kl < ext_kl(&x, &c), "neuron: kn %lld not raised above the common %lld",
          (long long)r.best.kn, (long long)c.kn);
    /* ... and loses when its MLP costs more than channel-wise refinement */
    ext y = {.m = {.cost = {0.001, 0.001, 0.0005, 0.0005}, .gain = {1, 1, 2, 2}}, .ncost = 0.004, .ngain = 4};
    CHECK(ext_run(&y, 0.06, two, 2, NULL, 0, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(r.best.mlp == SPX_REFINE_MLP_CHANNEL && r.best.kn == 0 && ext_slow(&y, &r.best) <= 0.06,
          "neuron dearer: chose mlp %d", (int)r.best.mlp);

    /* 2. block counts: the fastest (32) is chosen by speed and kept for
     * every mode; blocks never cause a KL measurement of their own */
    const int32_t blocks[] = {8, 16, 32, 64};
    ext z = {.m = {.cost = {0.001, 0.001, 0.001, 0.001}, .gain = {1, 1, 1, 1}}};
    spx_refine_config lagged[3] = {ch, ch, ch};
    lagged[1].lag = 2, lagged[2].lag = 4;
    CHECK(ext_run(&z, 0.05, lagged, 3, blocks, 4, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(r.best.blocks == 32 && g_trials.chosen_blocks == 32 && g_trials.n_sched == 5 && g_trials.n_sched_kept == 1,
          "blocks: chose %d (reported %d; %d trials, %d kept)", (int)r.best.blocks, (int)g_trials.chosen_blocks,
          g_trials.n_sched, g_trials.n_sched_kept);
    CHECK(z.n_sched_kl == 0, "%d KL measurements differed from an earlier one only in blocks", z.n_sched_kl);
    CHECK(ext_slow(&z, &r.best) <= 0.05 && r.slowdown <= 0.05, "blocks: over the budget");
    /* 3. lag: without a KL cost the longest lag affords the largest k and wins */
    CHECK(r.best.lag == 4, "free lag: chose %d half-blocks", (int)r.best.lag);
    /* with a KL cost, the mode whose common k has the lowest KL (checked
     * against the modes' own common k) */
    for (int pen = 0; pen < 4; pen++) {
        ext w = {.m = {.cost = {0.001, 0.001, 0.001, 0.001}, .gain = {1, 1, 1, 1}}, .lag_kl = 0.02 * pen};
        CHECK(ext_run(&w, 0.05, lagged, 3, NULL, 0, &r, &e) == SPX_OK, "%s", e.msg);
        int want = 0;
        double best_kl = 1e30;
        for (int m = 0; m < 3; m++) {
            spx_refine_config cm = spx_refine_config_common(&lagged[m], common_of(&w, &lagged[m], 0.05));
            if (ext_kl(&w, &cm) < best_kl) best_kl = ext_kl(&w, &cm), want = lagged[m].lag;
        }
        CHECK(r.best.lag == want && ext_slow(&w, &r.best) <= 0.05 && r.kl <= best_kl,
              "lag KL cost %g: chose lag %d, expected %d (KL %g vs %g)", w.lag_kl, (int)r.best.lag, want, r.kl, best_kl);
    }
    /* one block count: no step 0, the modes' own kept */
    lagged[0].blocks = 64;
    CHECK(ext_run(&z, 0.05, lagged, 1, blocks, 1, &r, &e) == SPX_OK && r.best.blocks == 64 && g_trials.n_sched == 0,
          "one block count: %d, %d trials", (int)r.best.blocks, g_trials.n_sched);

    /* 4. refusals */
    spx_refine_config bad = ch;
    bad.mlp = 2;
    CHECK(ext_run(&z, 0.05, &bad, 1, NULL, 0, &r, &e) == SPX_ERR_ARG && strstr(e.msg, "mode 0"), "mlp 2: %s", e.msg);
    bad = ch;
    bad.lead = 5;
    CHECK(ext_run(&z, 0.05, &bad, 1, NULL, 0, &r, &e) == SPX_ERR_ARG, "lead 5 accepted");
    const int32_t bad_blocks[] = {16, 0};
    CHECK(ext_run(&z, 0.05, &ch, 1, bad_blocks, 2, &r, &e) == SPX_ERR_ARG && strstr(e.msg, "block count 0"),
          "block count 0: %s", e.msg);
}

/* ---- the manifest record ---------------------------------------------- */

static void write_refine(const char *path) {
    spx_err e;
    spx_err_clear(&e);
    spx_trdc_writer *w = NULL;
    uint8_t codes[4 * 2];
    float sc[3] = {0.5f, 1, 2};
    for (size_t i = 0; i < sizeof codes; i++) codes[i] = (uint8_t)(0x88 + i);
    CHECK(spx_trdc_writer_open(path, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_refine(w, "a.weight", 3, 4, 2, codes, sc, 1, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_finish(w, "{\"architectures\": [\"LlamaForCausalLM\"]}", NULL, NULL, "{}", NULL, &e) ==
              SPX_OK,
          "%s", e.msg);
}

static spx_trdc_tuned entry(const char *plat, double budget, int64_t k0) {
    spx_trdc_tuned t;
    memset(&t, 0, sizeof t);
    snprintf(t.platform, sizeof t.platform, "%s", plat);
    t.budget = budget;
    for (int i = 0; i < 4; i++) t.k[i] = k0 + i;
    t.slowdown = budget / 2;
    t.kl = 0.01 * (double)k0;
    t.kl_base = 1;
    snprintf(t.date, sizeof t.date, "2026-12-02T00:00:00Z");
    snprintf(t.windows, sizeof t.windows, "eval.txt: 2 windows of 512 from window 8");
    return t;
}

static int temp_left(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) n += strstr(de->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

/* the file with `from` replaced by `to` (same length) written to out */
static void patch(const char *in, const char *out, const char *from, const char *to) {
    size_t n;
    char *b = tl_read(in, &n);
    char *at = b ? memmem(b, n, from, strlen(from)) : NULL;
    CHECK(at && strlen(from) == strlen(to), "patch '%s' not found", from);
    if (at) memcpy(at, to, strlen(to));
    CHECK(tl_write(out, b, n) == 0, "write %s", out);
    free(b);
}

static void test_manifest(void) {
    char dir[600], path[700], bad[700];
    snprintf(dir, sizeof dir, "%s/tuned", tl_tmpdir());
    snprintf(path, sizeof path, "%s/m.refine", dir);
    snprintf(bad, sizeof bad, "%s/bad.refine", dir);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    write_refine(path);
    spx_err e;
    spx_err_clear(&e);
    spx_trdc *f = NULL;
    CHECK(spx_trdc_open(path, &f, &e) == SPX_OK, "%s", e.msg);
    const uint64_t off0 = f ? spx_trdc_manifest_offset(f) : 0;
    const uint32_t crc0 = f ? spx_trdc_find(f, "a.weight")->comp[SPX_TRDC_C_CODES].crc32 : 0;
    CHECK(f && spx_trdc_tuned_count(f) == 0, "fresh file has tuned entries");
    spx_trdc_close(f);

    CHECK(spx_trdc_writable_dir(path, &e) == SPX_OK, "%s", e.msg);
    spx_trdc_tuned t10 = entry("cpu/avx2/2t/ram/X", 0.10, 20), t5 = entry("cpu/avx2/2t/ram/X", 0.05, 8);
    spx_trdc_tuned t5b = entry("cpu/avx2/2t/ram/X", 0.05, 12), o5 = entry("cpu/avx2/2t/disk-8MiB-skip-2l/X", 0.05, 4);
    CHECK(spx_trdc_set_tuned(path, &t10, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_set_tuned(path, &t5, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_set_tuned(path, &o5, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_set_tuned(path, &t5b, &e) == SPX_OK, "%s", e.msg); /* replaces t5 */
    CHECK(temp_left(dir) == 0, "a temp file was left in %s", dir);
    f = NULL;
    CHECK(spx_trdc_open(path, &f, &e) == SPX_OK, "reopen: %s", e.msg);
    if (f) {
        CHECK(spx_trdc_tuned_count(f) == 3, "%zu entries, expected 3", spx_trdc_tuned_count(f));
        const spx_trdc_tuned *a = spx_trdc_tuned_at(f, 0), *b = spx_trdc_tuned_at(f, 1), *c = spx_trdc_tuned_at(f, 2);
        CHECK(a && b && c && !strcmp(a->platform, t10.platform) && a->budget == 0.05 && a->k[0] == 12 &&
                  a->k[3] == 15 && b->budget == 0.10 && b->k[0] == 20 && !strcmp(c->platform, o5.platform),
              "entries out of order or not replaced");
        CHECK(a && fabs(a->kl - 0.12) < 1e-15 && a->kl_base == 1 && a->slowdown == 0.025 &&
                  !strcmp(a->date, t5b.date) && !strcmp(a->windows, t5b.windows),
              "entry fields");
        /* the nearest budget not above a level */
        CHECK(spx_trdc_tuned_pick(f, t10.platform, 0.07) == a && spx_trdc_tuned_pick(f, t10.platform, 0.10) == b &&
                  spx_trdc_tuned_pick(f, t10.platform, 0.5) == b && !spx_trdc_tuned_pick(f, t10.platform, 0.04) &&
                  !spx_trdc_tuned_pick(f, "cpu/scalar/2t/ram/X", 0.5),
              "pick");
        /* the payload did not move and still verifies */
        CHECK(spx_trdc_manifest_offset(f) == off0 &&
                  spx_trdc_find(f, "a.weight")->comp[SPX_TRDC_C_CODES].crc32 == crc0,
              "payload moved");
        CHECK(spx_trdc_verify(f, NULL, NULL, NULL, NULL, &e) == SPX_OK, "verify: %s", e.msg);
        spx_trdc_close(f);
    }
    /* the optional mode and schedule: a cuda neuron entry (a combination
     * the engine does not run today; the record does not judge) round trips,
     * and the channel entries written without a schedule read as 0 */
    spx_trdc_tuned g5 = entry("cuda/avx2/2t/ram/X", 0.05, 16);
    g5.mlp = SPX_REFINE_MLP_NEURON, g5.kn = 24, g5.k[2] = g5.k[3] = 0;
    g5.cuda_blocks = 32, g5.cuda_lag = 2, g5.cuda_lead = 1;
    CHECK(spx_trdc_set_tuned(path, &g5, &e) == SPX_OK, "%s", e.msg);
    f = NULL;
    CHECK(spx_trdc_open(path, &f, &e) == SPX_OK, "reopen: %s", e.msg);
    if (f) {
        const spx_trdc_tuned *g = spx_trdc_tuned_pick(f, g5.platform, 0.05), *a = spx_trdc_tuned_pick(f, t10.platform, 0.05);
        CHECK(g && g->mlp == SPX_REFINE_MLP_NEURON && g->kn == 24 && g->cuda_blocks == 32 && g->cuda_lag == 2 &&
                  g->cuda_lead == 1 && g->k[0] == 16 && g->k[2] == 0,
              "cuda neuron entry read back wrong");
        CHECK(a && a->mlp == SPX_REFINE_MLP_CHANNEL && a->kn == 0 && a->cuda_blocks == 0 && a->cuda_lag == 0 &&
                  a->cuda_lead == 0, "cpu channel entry: mode fields not the defaults");
        CHECK(spx_trdc_tuned_count(f) == 4, "%zu entries after the cuda one", spx_trdc_tuned_count(f));
        spx_trdc_close(f);
    }
    /* an entry written before the mode existed (no "mlp" key: here renamed
     * to an unknown one, which readers ignore) reads as channel-wise */
    patch(path, bad, "\"mlp\":\"channel\"", "\"xlp\":\"channel\"");
    f = NULL;
    spx_err_clear(&e);
    CHECK(spx_trdc_open(bad, &f, &e) == SPX_OK, "entry without mlp: %s", e.msg);
    if (f) {
        const spx_trdc_tuned *a = spx_trdc_tuned_at(f, 0);
        CHECK(a && a->mlp == SPX_REFINE_MLP_CHANNEL && a->kn == 0 && a->cuda_blocks == 0, "old entry: not the defaults");
        spx_trdc_close(f);
    }
    /* hand-corrupted sections: each refused, naming the file and the field */
    struct { const char *from, *to, *msg; } cases[] = {
        {"\"budget\":0.05", "\"budget\":1.05", "'budget'"},
        {"\"kl_base\":", "\"kl_bas_\":", "'kl_base'"},
        {"\"date\":\"", "\"date\":1", "not valid JSON"},
        {"\"k\":[12,", "\"k\":[-1,", "k[0]"},
        {"\"budget\":0.1,", "\"budget\":.01,", "not valid JSON"},
        {"\"mlp\":\"neuron\"", "\"mlp\":\"neurin\"", "'mlp'"},
        {"\"kn\":24", "\"kx\":24", "needs 'kn'"},
        {"\"kn\":24", "\"kn\":-4", "needs 'kn'"},
        {"\"cuda_lag\":2", "\"cuda_lag\":7", "'cuda_lag'"},
        {"\"cuda_blocks\":32", "\"cuda_blocks\":-1", "'cuda_blocks'"},
        {"\"mlp\":\"channel\",\"windows\":\"eval.txt: 2 windows", "\"mlp\":\"channel\",\"kn\":3,\"windows\":\"eval.txt: 2 ", "belongs to a neuron entry"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        patch(path, bad, cases[i].from, cases[i].to);
        f = NULL;
        spx_err_clear(&e);
        CHECK(spx_trdc_open(bad, &f, &e) == SPX_ERR_FORMAT && strstr(e.msg, "bad.refine") &&
                  strstr(e.msg, cases[i].msg),
              "corrupt tuned %zu (%s): %s", i, cases[i].to, e.msg);
        spx_trdc_close(f);
    }
    /* budgets out of order */
    patch(path, bad, "\"budget\":0.1,", "\"budget\":0.0,");
    f = NULL;
    spx_err_clear(&e);
    CHECK(spx_trdc_open(bad, &f, &e) == SPX_ERR_FORMAT && strstr(e.msg, "budget"), "budget 0 read: %s", e.msg);
    spx_trdc_close(f);
    /* refusals of the writer: a missing file, a bad entry; nothing left behind */
    char missing[720];
    snprintf(missing, sizeof missing, "%s/none.refine", dir);
    spx_err_clear(&e);
    CHECK(spx_trdc_set_tuned(missing, &t10, &e) == SPX_ERR_IO && strstr(e.msg, "none.refine"), "missing: %s", e.msg);
    spx_trdc_tuned wrong = t10;
    wrong.budget = 1;
    spx_err_clear(&e);
    CHECK(spx_trdc_set_tuned(path, &wrong, &e) == SPX_ERR_ARG, "budget 1 written");
    wrong = t10;
    wrong.k[2] = -3;
    spx_err_clear(&e);
    CHECK(spx_trdc_set_tuned(path, &wrong, &e) == SPX_ERR_ARG, "k -3 written");
    wrong = t10;
    wrong.kn = 5; /* kn in a channel entry */
    spx_err_clear(&e);
    CHECK(spx_trdc_set_tuned(path, &wrong, &e) == SPX_ERR_ARG && strstr(e.msg, "mode"), "channel kn written: %s", e.msg);
    wrong = t10;
    wrong.cuda_lead = 5;
    spx_err_clear(&e);
    CHECK(spx_trdc_set_tuned(path, &wrong, &e) == SPX_ERR_ARG, "lead 5 written");
    CHECK(temp_left(dir) == 0, "a temp file was left in %s after a refusal", dir);
    /* a read-only directory (only meaningful when not root: root writes anyway) */
    if (geteuid() != 0) {
        snprintf(cmd, sizeof cmd, "chmod 555 %s", dir);
        CHECK(system(cmd) == 0, "%s", cmd);
        spx_err_clear(&e);
        CHECK(spx_trdc_writable_dir(path, &e) == SPX_ERR_IO && strstr(e.msg, "m.refine"), "read-only dir: %s", e.msg);
        spx_err_clear(&e);
        CHECK(spx_trdc_set_tuned(path, &t10, &e) == SPX_ERR_IO && strstr(e.msg, "writable"), "read-only: %s", e.msg);
        snprintf(cmd, sizeof cmd, "chmod 755 %s", dir);
        CHECK(system(cmd) == 0, "%s", cmd);
    }
}

int main(void) {
    test_search();
    test_dimensions();
    test_manifest();
    return tl_finish("test_refine_tune");
}
