/* tune.h: the search of StrataFlux-W's tuner (issue 20; strataflux-paper
 * section 3.5 and Appendix B.7): the refinement configuration with the
 * lowest KL on held-out text whose measured decode slowdown against the
 * base stays within a budget. The measurements are callbacks (the CLI's
 * `spectra tune` times decode and scores windows; tests pass synthetic
 * functions), so the search is plain logic and is tested alone.
 *
 * A configuration is one record, spx_refine_config. Its dimensions are the
 * ones the engine has: a budget k per projection set (SPX_RSET_*, channels
 * per 1,024). The search's two lists are where a new dimension goes:
 *   - modes (spx_tune_params.modes): each candidate mode is a record whose
 *     budgets the common-k search fills (spx_refine_config_common), e.g. a
 *     neuron-wise MLP mode or a lead/lag distance is one more record in the
 *     list;
 *   - steps (the greedy phase): the individual budgets raised one at a
 *     time, today each set's k (tune.c steps()).
 *
 * The algorithm (the paper's, with the choices it leaves open):
 *   1. For each mode, the largest k of the ladder (ascending, from 0) such
 *      that the mode with every set at k measures a slowdown <= budget:
 *      binary search over the ladder, taking slowdown as increasing in k
 *      (k = 0 is the base and feasible without a measurement). Each
 *      retained candidate's KL is measured.
 *   2. From the lowest-KL candidate (ties: the earlier mode), rounds of
 *      greedy increases: each step not yet exhausted raises one set's k to
 *      the next ladder value above it; a raise whose slowdown exceeds the
 *      budget exhausts that step (slowdown is taken as increasing in every
 *      k, so it stays infeasible as the others grow); the feasible raise
 *      with the lowest KL is kept if its KL is below the current one, and
 *      the round repeats; the search ends when no raise lowers the KL or
 *      after max_trials raises. The paper keeps every raise that meets the
 *      limit; a raise that does not lower the measured KL (which is
 *      deterministic) would spend speed for nothing, so it is not kept.
   3. Confirmation: the configurations kept on the way (the base, the
      chosen common k, each kept raise) form a chain; the last is measured
      again and kept if this second measurement is within the budget too,
      else the one before it, and so on down to the base (feasible by
      definition). On a noisy machine a single favourable measurement
      would otherwise decide; the recorded slowdown is the confirming one.
 * KL values are memoized per configuration (deterministic); slowdowns are
 * measured afresh each time (noisy; each measurement stands alone). */
#ifndef SPX_REFINE_TUNE_H
#define SPX_REFINE_TUNE_H

#include "core/err.h"
#include "model/arch.h"
#include <stddef.h>
#include <stdint.h>

typedef struct spx_refine_config {
    int64_t k[SPX_RSET_COUNT]; /* channels per 1,024 per set (SPX_RSET_*); 0: off */
} spx_refine_config;

/* The mode's configuration with every budget at the common value k. */
spx_refine_config spx_refine_config_common(const spx_refine_config *mode, int64_t k);
/* "k 8,8,16,8" into buf; returns buf. */
const char *spx_refine_config_str(const spx_refine_config *c, char *buf, size_t cap);

typedef enum spx_tune_phase {
    SPX_TUNE_COMMON = 0,
    SPX_TUNE_GREEDY = 1,
    SPX_TUNE_BASE = 2,
    SPX_TUNE_CONFIRM = 3
} spx_tune_phase;

/* One measured configuration, as reported to the progress callback. */
typedef struct spx_tune_trial {
    spx_tune_phase phase;
    spx_refine_config c;
    double slowdown; /* fraction (0.05: 5 % slower than the base); NAN when not measured */
    double kl;       /* mean KL; NAN when not measured (infeasible) */
    int feasible;    /* slowdown <= budget */
    int kept;        /* common: the mode's largest feasible k so far; greedy: the raise was kept;
                        confirm: the configuration is the result */
} spx_tune_trial;

typedef struct spx_tune_ops {
    void *user;
    /* The decode slowdown of c against the base (no refinement), a fraction. */
    spx_status (*slowdown)(void *user, const spx_refine_config *c, double *out, spx_err *e);
    /* Mean KL of the model with c against the reference on the tuning windows. */
    spx_status (*kl)(void *user, const spx_refine_config *c, double *out, spx_err *e);
    /* Optional: called after every measurement. */
    void (*progress)(void *user, const spx_tune_trial *t);
} spx_tune_ops;

#define SPX_TUNE_MAX_LADDER 64
#define SPX_TUNE_MAX_MODES 16
#define SPX_TUNE_DEFAULT_TRIALS 24
#define SPX_TUNE_MAX_TRIALS 1000

typedef struct spx_tune_params {
    double budget;              /* slowdown limit, (0, 1) */
    const int64_t *ladder;      /* ascending, ladder[0] == 0; NULL: spx_tune_default_ladder */
    size_t n_ladder;
    const spx_refine_config *modes; /* candidate modes; NULL: one (channel-wise, every set) */
    size_t n_modes;
    int32_t max_trials;         /* greedy raises measured at most (<= SPX_TUNE_MAX_TRIALS); 0: SPX_TUNE_DEFAULT_TRIALS */
} spx_tune_params;

typedef struct spx_tune_result {
    spx_refine_config best;
    double slowdown;  /* best's confirming measurement (0 for the base, not measured) */
    double kl;        /* best's KL */
    double kl_base;   /* the base's KL (k = 0 everywhere) */
    int32_t n_slowdown, n_kl; /* measurements taken */
} spx_tune_result;

/* 0, 1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024
 * (1,024: every channel of a chunk); *n its length. */
const int64_t *spx_tune_default_ladder(size_t *n);

/* Runs the search (see the top of this file). Errors: SPX_ERR_ARG for bad
 * parameters (budget, ladder not ascending from 0, too many entries), or
 * the first callback error (returned as it came). */
spx_status spx_refine_tune(const spx_tune_params *p, const spx_tune_ops *ops, spx_tune_result *out, spx_err *e);

#endif
