/* model.h: a loaded Llama-family model: config, weights (views into mapped
 * files), tokenizer, thread pool. The forward pass is in forward.c. */
#ifndef SPX_MODEL_H
#define SPX_MODEL_H

#include "core/err.h"
#include "core/pool.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "model/wmat.h"
#include "spectra.h"

typedef struct spx_layer {
    float *attn_norm, *mlp_norm;   /* [hidden] */
    float *q_norm, *k_norm;        /* [head_dim] (Qwen3) or NULL */
    float *bq, *bk, *bv, *bo;      /* biases or NULL */
    float *b_gate, *b_up, *b_down;
    spx_wmat wq, wk, wv, wo;       /* [nh*hd, hidden] [nkv*hd, hidden] x2, [hidden, nh*hd] */
    spx_wmat w_gate, w_up, w_down; /* [inter, hidden] x2, [hidden, inter] */
} spx_layer;

struct spx_trdc;

struct spx_model {
    spx_config cfg;
    spx_layer *layers;            /* [n_layers] */
    spx_wmat embed;               /* [vocab, hidden] */
    spx_wmat lm_head;             /* [vocab, hidden]; == embed when tied */
    float *final_norm;            /* [hidden] */
    float *rope_inv_freq;         /* [head_dim / 2] */
    spx_tokenizer *tok;           /* NULL if the model carries none */
    spx_st *st;                   /* safetensors source, or NULL */
    struct spx_trdc *trdc;        /* .trdc source, or NULL */
    spx_pool *pool;
    const struct spx_backend *be;  /* executes forward passes */
    void *be_state;                /* backend's per-model state (device weights) */
    int64_t vram_budget_mb;        /* from spx_model_params */
    int64_t plan_n_ctx;            /* from spx_model_params: n_ctx, kv, pingpong, n_layers_resident */
    spx_kv_type plan_kv;
    int32_t pingpong;
    int64_t n_layers_resident;
    const struct spx_qkernels *qk; /* CPU kernels for quantized matrices */
    int64_t max_cols;             /* widest matrix input (scratch sizing) */
    char *path;
    spx_err err;
};

/* Computes the RoPE inverse frequencies for cfg (default, linear, llama3)
 * into out[head_dim/2], exactly as transformers' rope init functions. */
void spx_rope_inv_freq(const spx_config *cfg, float *out);

/* Fills m->layers, embed, lm_head, ... from m->st (safetensors) or
 * m->trdc, validating every shape and dtype. */
spx_status spx_model_bind_weights(spx_model *m, spx_err *e);

/* Weight bytes one decoded token reads: every layer matrix, the LM head
 * and one embedding row (norm gains and biases are negligible). */
uint64_t spx_model_bytes_per_token(const spx_model *m);

/* Name of the normalization whose gain feeds `tensor` (for saliency), as
 * data per architecture; NULL when none does (gamma = 1). */
const char *spx_arch_feeding_norm(const spx_config *cfg, const char *tensor, char *buf,
                                  size_t cap);

#endif
