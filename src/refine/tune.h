/* tune.h: the search of StrataFlux-W's tuner (issue 20; strataflux-paper
 * section 3.5 and Appendix B.7): the refinement configuration with the
 * lowest KL on held-out text whose measured decode slowdown against the
 * base stays within a budget. The measurements are callbacks (the CLI's
 * `spectra tune` times decode and scores windows; tests pass synthetic
 * functions), so the search is plain logic and is tested alone.
 *
 * A configuration is one record, spx_refine_config, with the paper's
 * dimensions as the engine has them: a budget k per projection set
 * (SPX_RSET_*, channels per 1,024); the MLP mode (channel-wise, or
 * neuron-wise with one neuron budget kn in place of the gate/up and down
 * k); and, on a GPU, the schedule: the refinement kernel's thread blocks
 * and the fetch lag / lead in half-blocks. The search's lists:
 *   - modes (spx_tune_params.modes): each candidate mode is a record (MLP
 *     mode, lag, lead) whose budgets the common-k search fills
 *     (spx_refine_config_common); the caller lists the combinations it
 *     can run (the paper: "for each combination of shift distances and
 *     channel-wise or neuron-wise MLP refinement");
 *   - blocks (spx_tune_params.blocks): the thread-block counts tried;
 *   - steps (the greedy phase): the individual budgets raised one at a
 *     time, each set's k, or in neuron mode q/k/v, o and kn (tune.c steps()).
 *
 * The algorithm (the paper's, with the choices it leaves open):
 *   0. Schedule, with two or more block counts: the thread-block count
 *      only changes speed (the same channels are applied), so it is chosen
 *      once, by speed, before the budgets (the paper's "resource
 *      allocation" profile): the first mode's largest feasible common k
 *      (step 1) under the first mode's own block count is the reference
 *      budget (the smallest non-zero ladder value when that is 0); each
 *      block count is measured there and the fastest (ties: the earlier)
 *      is written into every mode. A full k search per block count would
 *      multiply the measurements by their number for a choice that does
 *      not move the KL; a count that is fastest at the reference budget is
 *      taken to stay so at the nearby budgets the later steps reach. Lag
 *      and lead trade speed against KL (a later or earlier residual
 *      stream), so they are modes: each gets its own common k and KL.
 *   1. For each mode, the largest k of the ladder (ascending, from 0) such
 *      that the mode with every set at k (neuron mode: q/k/v and o at k, kn
 *      = round(3 k / 4), the paper's) measures a slowdown <= budget:
 *      binary search over the ladder, taking slowdown as increasing in k
 *      (k = 0 is the base and feasible without a measurement). Each
 *      retained candidate's KL is measured.
 *   2. From the lowest-KL candidate (ties: the earlier mode), rounds of
 *      greedy increases: each step not yet exhausted raises one budget to
 *      the next ladder value above it; a raise whose slowdown exceeds the
 *      budget exhausts that step (slowdown is taken as increasing in every
 *      budget, so it stays infeasible as the others grow); the feasible
 *      raise with the lowest KL is kept if its KL is below the current one,
 *      and the round repeats; the search ends when no raise lowers the KL
 *      or after max_trials raises. The paper keeps every raise that meets
 *      the limit; a raise that does not lower the measured KL (which is
 *      deterministic) would spend speed for nothing, so it is not kept.
 *   3. Confirmation: the configurations kept on the way (the base, the
 *      chosen common k, each kept raise) form a chain; the last is measured
 *      again and kept if this second measurement is within the budget too,
 *      else the one before it, and so on down to the base (feasible by
 *      definition). On a noisy machine a single favourable measurement
 *      would otherwise decide; the recorded slowdown is the confirming one.
 * KL values are memoized per configuration, the block count left out of
 * the key (deterministic, and blocks do not change what is applied);
 * slowdowns are measured afresh each time (noisy; each measurement stands
 * alone). */
#ifndef SPX_REFINE_TUNE_H
#define SPX_REFINE_TUNE_H

#include "core/err.h"
#include "model/arch.h"
#include "spectra.h"
#include <stddef.h>
#include <stdint.h>

typedef struct spx_refine_config {
    int64_t k[SPX_RSET_COUNT]; /* channels per 1,024 per set (SPX_RSET_*); 0: off; neuron mode: gate/up, down 0 */
    int32_t mlp;               /* SPX_REFINE_MLP_CHANNEL or SPX_REFINE_MLP_NEURON */
    int64_t kn;                /* neuron mode: neurons per 1,024 of the intermediate size; 0 otherwise */
    int32_t blocks;            /* GPU: the refinement kernel's thread blocks (0: the backend's default) */
    int32_t lag, lead;         /* GPU: fetch lag (o / down) and lead (q/k/v, gate/up), half-blocks 0..4 */
} spx_refine_config;

/* The mode's configuration (its MLP mode and schedule) with every budget
 * at the common value k: channel mode every set at k; neuron mode q/k/v
 * and o at k, gate/up and down 0, kn = round(3 k / 4). */
spx_refine_config spx_refine_config_common(const spx_refine_config *mode, int64_t k);
/* Equal in every field; the KL memo's key leaves blocks out (speed only). */
int spx_refine_config_eq(const spx_refine_config *a, const spx_refine_config *b, int with_blocks);
/* "k 8,8,16,8", "k 8,8 kn 12 (neuron)", then " blocks 32 lag 0.5 lead 0"
 * when any schedule field is set, into buf; returns buf. */
const char *spx_refine_config_str(const spx_refine_config *c, char *buf, size_t cap);

typedef enum spx_tune_phase {
    SPX_TUNE_COMMON = 0,
    SPX_TUNE_GREEDY = 1,
    SPX_TUNE_BASE = 2,
    SPX_TUNE_CONFIRM = 3,
    SPX_TUNE_SCHEDULE = 4 /* step 0: a block count at the reference budget */
} spx_tune_phase;

/* One measured configuration, as reported to the progress callback. */
typedef struct spx_tune_trial {
    spx_tune_phase phase;
    spx_refine_config c;
    double slowdown; /* fraction (0.05: 5 % slower than the base); NAN when not measured */
    double kl;       /* mean KL; NAN when not measured (infeasible) */
    int feasible;    /* slowdown <= budget */
    int kept;        /* common: the mode's largest feasible k so far; greedy: the raise was kept;
                        confirm: the configuration is the result; schedule: the block count chosen
                        (a summary, slowdown its measurement, kl NAN) */
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
#define SPX_TUNE_MAX_MODES 64 /* 2 MLP modes x 5 lags x 5 leads fit */
#define SPX_TUNE_MAX_BLOCKS 16
#define SPX_TUNE_DEFAULT_TRIALS 24
#define SPX_TUNE_MAX_TRIALS 1000

typedef struct spx_tune_params {
    double budget;              /* slowdown limit, (0, 1) */
    const int64_t *ladder;      /* ascending, ladder[0] == 0; NULL: spx_tune_default_ladder */
    size_t n_ladder;
    const spx_refine_config *modes; /* candidate modes (mlp, lag, lead, blocks; budgets ignored);
                                       NULL: one (channel-wise, no schedule) */
    size_t n_modes;
    const int32_t *blocks;      /* block counts for step 0 (each >= 1); fewer than 2: no step 0,
                                   the modes' own blocks kept */
    size_t n_blocks;
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
 * parameters (budget, ladder not ascending from 0, too many entries, a
 * mode out of range), or
 * the first callback error (returned as it came). */
spx_status spx_refine_tune(const spx_tune_params *p, const spx_tune_ops *ops, spx_tune_result *out, spx_err *e);

#endif
