/* blocks.c: the one driver over the model's block sequence (blocks.h). */
#include "engine/blocks.h"

spx_block_kind spx_block_mixer(const spx_config *c, int64_t l) {
    switch (c->mixer[l]) {
    case SPX_MIX_ATTN: return SPX_BLK_ATTENTION;
    case SPX_MIX_CONV: return SPX_BLK_SHORTCONV;
    case SPX_MIX_MAMBA2: return SPX_BLK_MAMBA2;
    case SPX_MIX_NONE: return SPX_BLK_NONE;
    default: return SPX_BLK_KINDS; /* not a kind: refused */
    }
}

spx_block_kind spx_block_ffn(const spx_config *c, int64_t l) {
    switch (c->ffn[l]) {
    case SPX_FFN_SWIGLU: return SPX_BLK_SWIGLU;
    case SPX_FFN_RELU2: return SPX_BLK_RELU2;
    case SPX_FFN_MOE: return SPX_BLK_MOE;
    case SPX_FFN_NONE: return SPX_BLK_NONE;
    default: return SPX_BLK_KINDS;
    }
}

const char *spx_block_name(spx_block_kind k) {
    switch (k) {
    case SPX_BLK_ATTENTION: return "attention";
    case SPX_BLK_SHORTCONV: return "short-convolution";
    case SPX_BLK_MAMBA2: return "mamba2";
    case SPX_BLK_SWIGLU: return "swiglu";
    case SPX_BLK_RELU2: return "relu2";
    case SPX_BLK_MOE: return "mixture-of-experts";
    case SPX_BLK_NONE: return "none";
    default: return "unknown";
    }
}

spx_status spx_blocks_check(const spx_config *c, const spx_block_ops *ops, const char *path, spx_err *e) {
    for (int64_t l = 0; l < c->n_layers; l++) {
        const spx_block_kind k[2] = {spx_block_mixer(c, l), spx_block_ffn(c, l)};
        for (int i = 0; i < 2; i++)
            if (k[i] != SPX_BLK_NONE && (k[i] == SPX_BLK_KINDS || !ops->block[k[i]]))
                return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: layer %lld is a %s block, which the %s backend does not run",
                                path, (long long)l, spx_block_name(k[i]), ops->backend);
    }
    return SPX_OK;
}

spx_status spx_blocks_run(const spx_config *c, const spx_block_ops *ops, void *ctx, spx_err *e) {
    SPX_TRY(ops->embed(ctx, e));
    for (int64_t l = 0; l < c->n_layers; l++) {
        if (ops->layer_begin) SPX_TRY(ops->layer_begin(ctx, l, e));
        const spx_block_kind k[2] = {spx_block_mixer(c, l), spx_block_ffn(c, l)};
        int first = 1;
        for (int i = 0; i < 2; i++) {
            if (k[i] == SPX_BLK_NONE) continue;
            if (k[i] == SPX_BLK_KINDS || !ops->block[k[i]])
                return spx_fail(e, SPX_ERR_UNSUPPORTED, "layer %lld: the %s backend has no %s block", (long long)l,
                                ops->backend, spx_block_name(k[i]));
            SPX_TRY(ops->block[k[i]](ctx, l, first, e));
            first = 0;
        }
        if (ops->layer_end) SPX_TRY(ops->layer_end(ctx, l, e));
    }
    return ops->head(ctx, e);
}
