/* rmat.h: weight refinement in the engine (StrataFlux-W, issue 20): a
 * quantized matrix's residual as the forward pass sees it, and the
 * per-model runtime (budgets, kernels, where the columns live).
 *
 * Per decode step (one token, T == 1) and projection launch, the CPU's
 * matmul (cpu/ops.c) selects the input channels once for the launch
 * (spx_refine_topk of its input x, k = the budget of the first matrix's
 * set per chunk of SPX_REFINE_CHUNK; under a whole chunk the first
 * matrix's outlier channels are skipped: their residual is fp16 rounding), looks the selected
 * columns of each refined matrix up (resident in memory, or through the
 * tier's cache, where a miss is skipped or waited for), and each thread
 * adds sum_i x_i C[:, i] to its rows of the base output before the bias.
 * Prompts (T > 1) run the base weights only (the issue leaves it open): a
 * selection is per token, so refining a prompt would read a decode step's
 * columns for every prompt token, while the prompt's own cost is one GEMM
 * over the resident weights.
 *
 * In neuron mode (rt.mlp, refine/bundle.h) the MLP's gate/up and down
 * launches run unrefined here and the CPU MLP block applies the layer's
 * neuron bundles instead (engine/ffn_neuron.h); q/k/v and o stay as above.
 *
 * Numbers: the base output as without refinement, then the apply kernel's
 * operations (refine.h); a budget of 0, a matrix without a residual, or no
 * available column leave the base bits unchanged. */
#ifndef SPX_REFINE_RMAT_H
#define SPX_REFINE_RMAT_H

#include "model/arch.h"
#include "refine/refine.h"
#include "spectra.h"
#include <stdint.h>

struct spx_tier;
struct spx_bundle_layer;

/* One matrix's residual. Exactly one of q4 (with q4.codes NULL when the
 * columns come from the tier, at file_off + i * q4.col_stride) and f32
 * (the exact residual: tests and references) is used. */
typedef struct spx_wmat_refine {
    spx_refine_q4 q4;
    const spx_refine_f32 *f32;
    uint64_t file_off;
    int set; /* SPX_RSET_* (model/arch.h) */
} spx_wmat_refine;

typedef struct spx_refine_stats {
    uint64_t launches;   /* refined launches (decode steps x projection sets; neuron mode: + MLP layers) */
    uint64_t selected;   /* channels selected, over matrices (neuron mode: + neurons) */
    uint64_t applied;    /* of those, columns (bundles) available and applied */
} spx_refine_stats;

typedef struct spx_refine_rt {
    int64_t k[4];                   /* channels per chunk, per SPX_RSET_*; 0: that set off */
    const spx_refine_kernels *kern; /* apply kernel */
    struct spx_tier *tier;          /* NULL: every column in memory (q4.codes) */
    spx_refine_stats st;            /* counted by the matmul hook (one thread at a time) */
    int32_t cuda_blocks;            /* CUDA: thread blocks of the apply kernel (0: its default) */
    int32_t cuda_lag;               /* CUDA: fetch lag of the o / down refinement, in half-blocks (0..4: s = 0..2) */
    int32_t cuda_lead;              /* CUDA: fetch lead of the q/k/v and gate/up refinement, in half-blocks (0..4) */
    /* the MLP's mode: SPX_REFINE_MLP_CHANNEL (the gate/up and down sets
     * above) or SPX_REFINE_MLP_NEURON (refine/bundle.h: the layers'
     * bundles replace those two sets, whose launches then run unrefined) */
    int mlp;
    int64_t kn;                     /* neuron mode: neurons per chunk of SPX_REFINE_CHUNK; 0: off */
    const struct spx_bundle_layer *bundles; /* [n_layers] (an entry with q4.n == 0 and no f32: none), or NULL */
} spx_refine_rt;

/* The channel budget a launch of set `set` uses: k[set], except 0 for the
 * MLP's sets in neuron mode. */
static inline int64_t spx_refine_rt_k(const spx_refine_rt *rt, int set) {
    return rt->mlp == SPX_REFINE_MLP_NEURON && (set == SPX_RSET_GATE_UP || set == SPX_RSET_DOWN) ? 0 : rt->k[set];
}

/* The columns sel[0..n) of a matrix whose column i is col_bytes bytes at
 * file_off + i * col_stride in the tier's file: out[j] the cached bytes
 * (valid until the tier's step ends) or NULL (a miss: skipped, or waited
 * for, as the tier's mode says). Errors: the tier's I/O errors. */
spx_status spx_tier_get_cols(struct spx_tier *t, uint64_t file_off, uint64_t col_stride, uint32_t col_bytes,
                             const int32_t *sel, int64_t n, const uint8_t **out, spx_err *e);

#endif
