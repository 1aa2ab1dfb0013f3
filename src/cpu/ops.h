/* ops.h: the scalar CPU reference operations. Every faster kernel (SIMD,
 * CUDA) is checked against these. Shapes are given as comments:
 * x[T, n] means T rows of n floats, row-major. */
#ifndef SPX_CPU_OPS_H
#define SPX_CPU_OPS_H

#include "core/err.h"
#include "core/pool.h"
#include "cpu/qkernels.h"
#include "model/wmat.h"
#include <stddef.h>
#include <stdint.h>

/* An observer of every matrix product's input (refinement fitting,
 * refine/fit_model.c): called by spx_cpu_matmul_n with the launch's
 * matrices and x[T, w[0]->cols] before the product runs; the pool is free
 * (the observer may run its own work on it). NULL (the default): no call,
 * no cost. */
typedef void (*spx_cpu_observe_fn)(void *user, int n, const struct spx_wmat *const *w, const float *x, int64_t T);

/* What a matrix product needs besides its operands: the thread pool, the
 * quantized kernels chosen for this CPU, and scratch that grows on demand
 * (prepared activations shared by all threads; per-thread row buffers). */
typedef struct spx_cpu_ctx {
    spx_pool *pool;
    const spx_qkernels *qk;
    void *act;
    size_t act_cap;
    uint8_t *scratch;      /* [threads, scratch_stride] */
    size_t scratch_stride;
    /* weight refinement (refine/rmat.h): the model's runtime or NULL, and
     * the one-token launch's selection and column pointers */
    struct spx_refine_rt *refine;
    int32_t *sel;
    const uint8_t **cols;     /* [SPX_MATMUL_MAX][selection capacity] */
    uint8_t *skip;            /* [cols]: the first matrix's outlier channels */
    size_t sel_cap, cols_cap, skip_cap;
    spx_cpu_observe_fn observe; /* NULL, or called with every launch's input */
    void *observe_user;
    /* neuron-wise MLP refinement of a one-token step (engine/ffn_neuron.c):
     * the gate pre-activations and the deltas h' - h [2][intermediate],
     * the selected neurons, and per selected neuron its d and down-residual
     * parts [2][selection capacity] (NULL: the tier missed its bundle) */
    float *nrn;
    int32_t *nsel;
    const uint8_t **nbun;
    size_t nrn_cap, nsel_cap, nbun_cap;
    int64_t n_nsel;
} spx_cpu_ctx;

#define SPX_MATMUL_MAX 32 /* matrices in one spx_cpu_matmul_n / _each launch (a MoE step: gate and up of its experts) */

void spx_cpu_ctx_init(spx_cpu_ctx *c, spx_pool *pool, const spx_qkernels *qk);
void spx_cpu_ctx_free(spx_cpu_ctx *c);

/* y[T, W.rows] = x[T, W.cols] * W^T (+ bias[W.rows] if non-NULL), split
 * across threads by output rows. Dense weights: each thread converts one
 * row at a time (never the whole matrix) and dots it with every token.
 * Quantized weights: the ctx's kernels (fused dequantize-and-dot). */
spx_status spx_cpu_matmul(spx_cpu_ctx *c, const spx_wmat *w, const float *x, int64_t T, float *y,
                          const float *bias, spx_err *e);
/* n products of the same x (same cols, kind and group) in one parallel
 * section: y[k][T, w[k].rows] = x W[k]^T (+ bias[k]); bias entries may be
 * NULL. Fewer thread hand-offs per step (q/k/v, gate/up). */
spx_status spx_cpu_matmul_n(spx_cpu_ctx *c, int n, const spx_wmat *const *w, const float *x, int64_t T,
                            float *const *y, const float *const *bias, spx_err *e);

/* One token through n matrices, each with its own input: y[k][w[k].rows]
 * = x[k] W[k]^T, in one parallel section over all their rows (a MoE
 * step's down projections: one expert's hidden state each). The
 * matrices are of one kind and unrefined; no bias. */
spx_status spx_cpu_matmul_each(spx_cpu_ctx *c, int n, const spx_wmat *const *w, const float *const *x,
                               float *const *y, spx_err *e);

/* out[n] = x[n] / sqrt(mean(x^2) + eps) * gain[n]; out may alias x. */
void spx_cpu_rmsnorm(float *out, const float *x, const float *gain, int64_t n, float eps);

/* RoPE, HF rotate_half convention: element i pairs with i + d/2, angle
 * pos * inv_freq[i]. x[n_heads, d] rotated in place. */
void spx_cpu_rope(float *x, int64_t n_heads, int64_t d, int64_t pos, const float *inv_freq);

/* gate[n] = silu(gate[n]) * up[n] */
void spx_cpu_silu_mul(float *gate, const float *up, int64_t n);

/* In-place softmax of x[n]. */
void spx_cpu_softmax(float *x, int64_t n);

float spx_cpu_dot(const float *a, const float *b, int64_t n);

#endif
