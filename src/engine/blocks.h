/* blocks.h: the block-level interface every backend implements, and the one
 * driver that runs a forward pass as the model description says.
 *
 * A layer is a mixer block (attention, short convolution, Mamba-2) and/or
 * an MLP block (SwiGLU, ReLU^2, mixture of experts), in that order, as cfg->mixer[l] and
 * cfg->ffn[l] (model/model.h) give them; a pass is the embedding, the
 * layers in order, then the final norm and the head. A backend fills one
 * spx_block_ops with a function per kind it runs, on its own pass state
 * (ctx); spx_blocks_run is the only loop over layers. Meaning of each
 * block: the CPU backend's function of that kind (engine/forward.c, the
 * scalar kernels), which also writes the residual add: block(h) =
 * h + residual_mult * f(rmsnorm(h) * gain). A backend may fuse inside a
 * block (norms into GEMVs, the residual add into the last GEMV, launch
 * chains), never across the sequence the driver walks. */
#ifndef SPX_ENGINE_BLOCKS_H
#define SPX_ENGINE_BLOCKS_H

#include "core/err.h"
#include "model/model.h"

typedef enum spx_block_kind {
    SPX_BLK_NONE = 0,
    SPX_BLK_ATTENTION,
    SPX_BLK_SHORTCONV,
    SPX_BLK_MAMBA2,
    SPX_BLK_SWIGLU,
    SPX_BLK_RELU2,
    SPX_BLK_MOE,
    SPX_BLK_KINDS
} spx_block_kind;

/* The block of layer l's mixer / MLP (SPX_BLK_NONE: the layer has none;
 * SPX_BLK_KINDS: a value that is no kind, which run and check refuse). */
spx_block_kind spx_block_mixer(const spx_config *c, int64_t l);
spx_block_kind spx_block_ffn(const spx_config *c, int64_t l);
const char *spx_block_name(spx_block_kind k);

typedef struct spx_block_ops {
    const char *backend; /* for messages */
    /* the embedding of the pass's tokens into the residual stream */
    spx_status (*embed)(void *ctx, spx_err *e);
    /* optional (NULL: nothing): before / after layer l's blocks (a device
     * backend brings a streamed layer's weights in and releases them) */
    spx_status (*layer_begin)(void *ctx, int64_t l, spx_err *e);
    spx_status (*layer_end)(void *ctx, int64_t l, spx_err *e);
    /* block k of layer l; first: it is the layer's first block. NULL: the
     * backend does not run that kind (spx_blocks_check says so at load) */
    spx_status (*block[SPX_BLK_KINDS])(void *ctx, int64_t l, int first, spx_err *e);
    /* the final norm and the head (what it produces is the pass's business) */
    spx_status (*head)(void *ctx, spx_err *e);
} spx_block_ops;

/* One forward pass: embed, every layer's blocks in order, head. */
spx_status spx_blocks_run(const spx_config *c, const spx_block_ops *ops, void *ctx, spx_err *e);
/* SPX_ERR_UNSUPPORTED naming the first layer and block kind ops lacks
 * ("path: layer 3 is a mamba2 block, which the cuda backend does not run"). */
spx_status spx_blocks_check(const spx_config *c, const spx_block_ops *ops, const char *path, spx_err *e);

#endif
