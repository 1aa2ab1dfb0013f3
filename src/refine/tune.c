/* tune.c: the tuner's search (see tune.h for the algorithm and its
 * choices). No I/O, no timing: every number comes from the callbacks. */
#include "refine/tune.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const int64_t default_ladder[] = {0, 1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024};

const int64_t *spx_tune_default_ladder(size_t *n) {
    *n = sizeof default_ladder / sizeof default_ladder[0];
    return default_ladder;
}

spx_refine_config spx_refine_config_common(const spx_refine_config *mode, int64_t k) {
    spx_refine_config c = *mode;
    for (int s = 0; s < SPX_RSET_COUNT; s++) c.k[s] = k;
    c.kn = 0;
    if (c.mlp == SPX_REFINE_MLP_NEURON) {
        c.k[SPX_RSET_GATE_UP] = c.k[SPX_RSET_DOWN] = 0;
        c.kn = (3 * k + 2) / 4; /* the paper's round(3 k / 4), as refine_api.c's default */
    }
    return c;
}

const char *spx_refine_config_str(const spx_refine_config *c, char *buf, size_t cap) {
    int n;
    if (c->mlp == SPX_REFINE_MLP_NEURON)
        n = snprintf(buf, cap, "k %lld,%lld kn %lld (neuron)", (long long)c->k[0], (long long)c->k[1], (long long)c->kn);
    else
        n = snprintf(buf, cap, "k %lld,%lld,%lld,%lld", (long long)c->k[0], (long long)c->k[1], (long long)c->k[2],
                     (long long)c->k[3]);
    if (n >= 0 && (size_t)n < cap && (c->blocks || c->lag || c->lead))
        snprintf(buf + n, cap - (size_t)n, " blocks %d lag %g lead %g", (int)c->blocks, 0.5 * c->lag, 0.5 * c->lead);
    return buf;
}

int spx_refine_config_eq(const spx_refine_config *a, const spx_refine_config *b, int with_blocks) {
    for (int s = 0; s < SPX_RSET_COUNT; s++)
        if (a->k[s] != b->k[s]) return 0;
    return a->mlp == b->mlp && a->kn == b->kn && a->lag == b->lag && a->lead == b->lead &&
           (!with_blocks || a->blocks == b->blocks);
}

/* The search's state: parameters, callbacks, the KL memo, the counts. */
#define MEMO_MAX 256
typedef struct tuner {
    const spx_tune_params *p;
    const spx_tune_ops *ops;
    const int64_t *ladder;
    size_t n_ladder;
    spx_refine_config memo_c[MEMO_MAX];
    double memo_kl[MEMO_MAX];
    int n_memo;
    spx_tune_result *r;
} tuner;

static void report(const tuner *t, spx_tune_phase ph, const spx_refine_config *c, double sd, double kl, int feasible,
                   int kept) {
    if (!t->ops->progress) return;
    spx_tune_trial tr = {ph, *c, sd, kl, feasible, kept};
    t->ops->progress(t->ops->user, &tr);
}

static spx_status measure_kl(tuner *t, const spx_refine_config *c, double *kl, spx_err *e) {
    for (int i = 0; i < t->n_memo; i++)
        if (spx_refine_config_eq(&t->memo_c[i], c, 0)) {
            *kl = t->memo_kl[i];
            return SPX_OK;
        }
    SPX_TRY(t->ops->kl(t->ops->user, c, kl, e));
    if (!isfinite(*kl)) return spx_fail(e, SPX_ERR_INTERNAL, "tuner: the KL measurement returned %g", *kl);
    t->r->n_kl++;
    if (t->n_memo < MEMO_MAX) {
        t->memo_c[t->n_memo] = *c;
        t->memo_kl[t->n_memo++] = *kl;
    }
    return SPX_OK;
}

static spx_status measure_slowdown(tuner *t, const spx_refine_config *c, double *sd, spx_err *e) {
    SPX_TRY(t->ops->slowdown(t->ops->user, c, sd, e));
    if (isnan(*sd)) return spx_fail(e, SPX_ERR_INTERNAL, "tuner: the slowdown measurement returned NaN");
    t->r->n_slowdown++;
    return SPX_OK;
}

/* The index in the ladder of the largest value <= k. */
static size_t ladder_at(const tuner *t, int64_t k) {
    size_t i = 0;
    while (i + 1 < t->n_ladder && t->ladder[i + 1] <= k) i++;
    return i;
}

/* Phase 1 for one mode: the largest feasible common k (binary search over
 * ladder indices: lo is known feasible, everything above hi infeasible). */
static spx_status common_k(tuner *t, const spx_refine_config *mode, spx_refine_config *best, double *best_sd,
                           spx_err *e) {
    size_t lo = 0, hi = t->n_ladder - 1;
    *best = spx_refine_config_common(mode, 0);
    *best_sd = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo + 1) / 2;
        spx_refine_config c = spx_refine_config_common(mode, t->ladder[mid]);
        double sd;
        SPX_TRY(measure_slowdown(t, &c, &sd, e));
        const int ok = sd <= t->p->budget;
        report(t, SPX_TUNE_COMMON, &c, sd, NAN, ok, ok);
        if (ok) {
            lo = mid;
            *best = c;
            *best_sd = sd;
        } else {
            hi = mid - 1;
        }
    }
    return SPX_OK;
}

/* The raises of the greedy phase: one per set; in neuron mode q/k/v, o
 * and the neuron budget kn (in gate/up's place; down has none). */
static int steps(const tuner *t, const spx_refine_config *cur, int step, spx_refine_config *next) {
    if (step >= SPX_RSET_COUNT) return -1; /* no such step */
    const int neuron = cur->mlp == SPX_REFINE_MLP_NEURON;
    if (neuron && step == SPX_RSET_DOWN) return -1;
    *next = *cur;
    int64_t *v = neuron && step == SPX_RSET_GATE_UP ? &next->kn : &next->k[step];
    size_t i = ladder_at(t, *v);
    if (i + 1 >= t->n_ladder) return 0; /* at the top already */
    *v = t->ladder[i + 1];
    return 1;
}
#define N_STEPS SPX_RSET_COUNT

spx_status spx_refine_tune(const spx_tune_params *p, const spx_tune_ops *ops, spx_tune_result *out, spx_err *e) {
    if (!p || !ops || !out || !ops->slowdown || !ops->kl) return spx_fail(e, SPX_ERR_ARG, "tuner: NULL argument");
    memset(out, 0, sizeof *out);
    if (!(p->budget > 0 && p->budget < 1))
        return spx_fail(e, SPX_ERR_ARG, "tuner: slowdown budget %g: expected a fraction in (0, 1)", p->budget);
    tuner *t = &(tuner){0};
    t->p = p;
    t->ops = ops;
    t->r = out;
    t->ladder = p->ladder;
    t->n_ladder = p->n_ladder;
    if (!t->ladder) t->ladder = spx_tune_default_ladder(&t->n_ladder);
    if (t->n_ladder < 2 || t->n_ladder > SPX_TUNE_MAX_LADDER || t->ladder[0] != 0)
        return spx_fail(e, SPX_ERR_ARG, "tuner: the ladder must start at 0 and have 2..%d values", SPX_TUNE_MAX_LADDER);
    for (size_t i = 1; i < t->n_ladder; i++)
        if (t->ladder[i] <= t->ladder[i - 1])
            return spx_fail(e, SPX_ERR_ARG, "tuner: the ladder must be strictly ascending (%lld after %lld)",
                            (long long)t->ladder[i], (long long)t->ladder[i - 1]);
    const spx_refine_config channel = {0};
    const size_t n_modes = p->modes ? p->n_modes : 1;
    if (n_modes < 1 || n_modes > SPX_TUNE_MAX_MODES)
        return spx_fail(e, SPX_ERR_ARG, "tuner: %zu modes: expected 1..%d", n_modes, SPX_TUNE_MAX_MODES);
    spx_refine_config modes[SPX_TUNE_MAX_MODES]; /* step 0 writes the chosen block count into them */
    for (size_t m = 0; m < n_modes; m++) {
        modes[m] = p->modes ? p->modes[m] : channel;
        const spx_refine_config *c = &modes[m];
        if ((c->mlp != SPX_REFINE_MLP_CHANNEL && c->mlp != SPX_REFINE_MLP_NEURON) || c->blocks < 0 ||
            c->blocks > 4096 || c->lag < 0 || c->lag > 4 || c->lead < 0 || c->lead > 4)
            return spx_fail(e, SPX_ERR_ARG, "tuner: mode %zu (mlp %d, blocks %d, lag %d, lead %d): expected mlp 0 or 1, "
                            "blocks 0..4096, lag and lead 0..4 half-blocks", m, (int)c->mlp, (int)c->blocks,
                            (int)c->lag, (int)c->lead);
    }
    if (p->n_blocks > SPX_TUNE_MAX_BLOCKS || (p->n_blocks && !p->blocks))
        return spx_fail(e, SPX_ERR_ARG, "tuner: %zu block counts: at most %d", p->n_blocks, SPX_TUNE_MAX_BLOCKS);
    for (size_t i = 0; i < p->n_blocks; i++)
        if (p->blocks[i] < 1 || p->blocks[i] > 4096)
            return spx_fail(e, SPX_ERR_ARG, "tuner: block count %d: expected 1..4096", (int)p->blocks[i]);
    const int32_t max_trials = p->max_trials > 0 ? p->max_trials : SPX_TUNE_DEFAULT_TRIALS;
    if (max_trials > SPX_TUNE_MAX_TRIALS)
        return spx_fail(e, SPX_ERR_ARG, "tuner: %d greedy trials: at most %d", (int)max_trials, SPX_TUNE_MAX_TRIALS);

    spx_refine_config base = spx_refine_config_common(&modes[0], 0);
    SPX_TRY(measure_kl(t, &base, &out->kl_base, e));
    report(t, SPX_TUNE_BASE, &base, 0, out->kl_base, 1, 0);

    /* 0. the block count: the fastest at the first mode's common k */
    if (p->n_blocks >= 2) {
        spx_refine_config ref;
        double sd;
        SPX_TRY(common_k(t, &modes[0], &ref, &sd, e));
        if (ref.k[0] == 0) ref = spx_refine_config_common(&modes[0], t->ladder[1]);
        size_t best = 0;
        double best_sd = 0;
        for (size_t i = 0; i < p->n_blocks; i++) {
            ref.blocks = p->blocks[i];
            SPX_TRY(measure_slowdown(t, &ref, &sd, e));
            report(t, SPX_TUNE_SCHEDULE, &ref, sd, NAN, sd <= p->budget, 0);
            if (i == 0 || sd < best_sd) {
                best = i;
                best_sd = sd;
            }
        }
        ref.blocks = p->blocks[best];
        report(t, SPX_TUNE_SCHEDULE, &ref, best_sd, NAN, best_sd <= p->budget, 1);
        for (size_t m = 0; m < n_modes; m++) modes[m].blocks = p->blocks[best];
        base.blocks = p->blocks[best];
    }

    /* 1. each mode's largest feasible common k; the lowest KL among them */
    spx_refine_config cur = base;
    double cur_kl = out->kl_base, cur_sd = 0;
    for (size_t m = 0; m < n_modes; m++) {
        spx_refine_config c;
        double sd, kl;
        SPX_TRY(common_k(t, &modes[m], &c, &sd, e));
        SPX_TRY(measure_kl(t, &c, &kl, e));
        report(t, SPX_TUNE_COMMON, &c, sd, kl, 1, 1);
        if (kl < cur_kl || m == 0) {
            cur = c;
            cur_kl = kl;
            cur_sd = sd;
        }
    }

    /* the chain of kept configurations (step 3) */
    spx_refine_config chain[2 + SPX_TUNE_MAX_TRIALS]; /* the base, the common k, the raises */
    double chain_kl[sizeof chain / sizeof chain[0]];
    int n_chain = 0;
    chain[n_chain] = base;
    chain_kl[n_chain++] = out->kl_base;
    if (!spx_refine_config_eq(&cur, &base, 1)) {
        chain[n_chain] = cur;
        chain_kl[n_chain++] = cur_kl;
    }

    /* 2. greedy raises of individual budgets */
    int exhausted[N_STEPS] = {0};
    for (int32_t trials = 0; trials < max_trials;) {
        int best = -1;
        spx_refine_config best_c = cur;
        double best_kl = cur_kl, best_sd = 0;
        for (int s = 0; s < N_STEPS && trials < max_trials; s++) {
            spx_refine_config next;
            if (exhausted[s] || steps(t, &cur, s, &next) != 1) {
                exhausted[s] = 1;
                continue;
            }
            double sd, kl = NAN;
            SPX_TRY(measure_slowdown(t, &next, &sd, e));
            trials++;
            const int ok = sd <= p->budget;
            if (ok) SPX_TRY(measure_kl(t, &next, &kl, e));
            else exhausted[s] = 1;
            report(t, SPX_TUNE_GREEDY, &next, sd, kl, ok, 0);
            if (ok && kl < best_kl) {
                best = s;
                best_c = next;
                best_kl = kl;
                best_sd = sd;
            }
        }
        if (best < 0) break;
        cur = best_c;
        cur_kl = best_kl;
        cur_sd = best_sd;
        report(t, SPX_TUNE_GREEDY, &cur, cur_sd, cur_kl, 1, 1);
        chain[n_chain] = cur; /* at most one per trial: within the array */
        chain_kl[n_chain++] = cur_kl;
    }

    /* 3. confirmation, down the chain */
    out->best = base;
    out->kl = out->kl_base;
    out->slowdown = 0;
    for (int i = n_chain - 1; i > 0; i--) {
        double sd;
        SPX_TRY(measure_slowdown(t, &chain[i], &sd, e));
        const int ok = sd <= p->budget;
        report(t, SPX_TUNE_CONFIRM, &chain[i], sd, chain_kl[i], ok, ok);
        if (ok) {
            out->best = chain[i];
            out->kl = chain_kl[i];
            out->slowdown = sd;
            break;
        }
    }
    return SPX_OK;
}
