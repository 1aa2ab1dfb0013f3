/* ffn_neuron.h: the neuron-wise MLP refinement in the CPU backend's gated
 * MLP block (refine/bundle.h, paper eq. 6), for one decode step (T == 1).
 *
 * Called by forward.c's ffn() in this order for a layer whose bundles the
 * runtime uses (spx_ffn_neuron_layer non-NULL):
 *   gate/up launch (g, u; their channel-wise refinement is off)
 *   spx_ffn_neuron_save(g)           keeps g: phi overwrites it with h
 *   h = phi(g) * u
 *   spx_ffn_neuron_select(x, u, h)   selection on |h|, the bundles (memory
 *                                    or tier), and delta_j = h'_j - h_j
 *   down launch (y_q = W^d h; its channel-wise refinement is off)
 *   spx_ffn_neuron_apply(h, y)       y += the selected neurons' update
 * The state between the calls lives in the cpu context (cpu/ops.h).
 *
 * Numbers: k_n = 0, or no bundle available, leave y as the base's bits.
 * A neuron's two row dots are the kernel table's dot (refine.h: 8 fmaf
 * lanes, a fixed sum), on one thread: k_n neurons x 2 x H is small next
 * to the down update (H rows x the selected neurons, twice), which runs
 * on the pool through the table's apply. Scalar and AVX2 tables give the
 * same bits (tests/test_refine.c, test_refine_bundle.c). */
#ifndef SPX_ENGINE_FFN_NEURON_H
#define SPX_ENGINE_FFN_NEURON_H

#include "cpu/ops.h"
#include "refine/bundle.h"

/* Layer l's bundles when this launch refines its MLP neuron-wise (T == 1,
 * neuron mode, kn > 0, the layer has bundles), else NULL. */
const spx_bundle_layer *spx_ffn_neuron_layer(const spx_cpu_ctx *c, int64_t l, int64_t T);
spx_status spx_ffn_neuron_save(spx_cpu_ctx *c, const spx_bundle_layer *B, const float *g, spx_err *e);
spx_status spx_ffn_neuron_select(spx_cpu_ctx *c, const spx_bundle_layer *B, const float *x, const float *u,
                                 const float *h, spx_err *e);
void spx_ffn_neuron_apply(spx_cpu_ctx *c, const spx_bundle_layer *B, const float *h, float *y);

#endif
