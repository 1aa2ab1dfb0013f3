/* model.h: a loaded model: config, weights (views into mapped files) by
 * slot (model/arch.h), tokenizer, thread pool. The forward pass is in
 * engine/forward.c. */
#ifndef SPX_MODEL_H
#define SPX_MODEL_H

#include "core/err.h"
#include "core/pool.h"
#include "format/chat_info.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "model/arch.h"
#include "model/wmat.h"
#include "spectra.h"

#include <pthread.h>

/* A layer's tensors by slot: w[s] for matrix slots (rows == 0: the layer
 * has none), v[s] for the others (owned float32, NULL: none). Which slots
 * a layer has and their shapes: spx_slot_shape. */
typedef struct spx_layer {
    spx_wmat w[SPX_SL_COUNT];
    float *v[SPX_SL_COUNT];
    spx_wmat *xw[SPX_SL_COUNT];    /* expert slots (mat == 2): [n_xw] owned arrays of views; NULL otherwise */
    int64_t n_xw;                  /* experts per expert slot (cfg.n_experts in a MoE layer, else 0) */
    int64_t kv_index;              /* its layer in the KV cache, -1: no attention */
    int64_t state_off;             /* its recurrent state's offset in the state cache (floats), -1: none */
} spx_layer;

struct spx_trdc;

struct spx_model {
    spx_config cfg;
    spx_layer *layers;            /* [n_layers] */
    spx_wmat embed;               /* [vocab, hidden] */
    spx_wmat lm_head;             /* [vocab, hidden]; == embed when tied */
    float *final_norm;            /* [hidden] */
    float *rope_inv_freq;         /* [head_dim / 2] */
    int64_t state_floats;         /* recurrent state of all layers (floats per sequence) */
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
    struct spx_refine_model *refine; /* weight refinement (refine/attach.h), or NULL */
    uint64_t refine_epoch;           /* counts attach, detach and budget changes (device backends'
                                      * captured passes depend on them) */
    spx_chat_info chat;            /* chat template, BOS/EOS texts (tokenizer_config.json) */
    pthread_mutex_t lock;          /* recursive: every call that computes or changes session state holds it
                                    * (the pool, the backend's buffers and m->err are the model's) */
    void **owned;                  /* blocks the weights' views point into (spx_model_untile_weights) */
    size_t n_owned;
    int weights_private;           /* spx_model_make_resident done: 1 copied map, 2 untiled */
    char *path;
    spx_err err;
};

/* The model's lock (recursive; see api.c's entry points). */
static inline int spx_model_lock_init(spx_model *m) {
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a) != 0) return -1;
    int r = pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    if (r == 0) r = pthread_mutex_init(&m->lock, &a);
    pthread_mutexattr_destroy(&a);
    return r;
}
static inline void spx_model_lock(spx_model *m) { pthread_mutex_lock(&m->lock); }
static inline void spx_model_unlock(spx_model *m) { pthread_mutex_unlock(&m->lock); }

/* Computes the RoPE inverse frequencies for cfg (default, linear, llama3)
 * into out[head_dim/2], in float32 as transformers' rope init functions
 * (which keep inv_freq in float32 for a checkpoint of any dtype). */
void spx_rope_inv_freq(const spx_config *cfg, float *out);

/* Fills m->layers, embed, lm_head, ... from m->st (safetensors) or
 * m->trdc, validating every shape and dtype. */
spx_status spx_model_bind_weights(spx_model *m, spx_err *e);

/* Weight bytes one decoded token reads: every layer matrix, the LM head
 * and one embedding row (norm gains and biases are negligible). */
uint64_t spx_model_bytes_per_token(const spx_model *m);
/* Every tiled quantized matrix (layers, experts, embedding, LM head)
 * repacked row-major into private memory the model owns (huge pages
 * where the OS gives them), its view switched over; the file's pages it
 * read are released. The CPU tables stream row-major weights faster in
 * decode (bench/results/2026-12-04-cpu-resident.md) and sum both layouts
 * alike (the same numbers). *n_done: matrices repacked. On failure the
 * matrices done so far keep their new views (all valid). */
spx_status spx_model_untile_weights(spx_model *m, int64_t *n_done, spx_err *e);
/* Bytes of layer l's matrices as stored (every expert of a MoE layer). */
uint64_t spx_layer_matrix_bytes(const spx_layer *L);
/* Of those, its experts' */
uint64_t spx_layer_expert_bytes(const spx_layer *L);

/* Frees the owned vectors of every layer (the matrices are views). */
void spx_model_free_layers(spx_model *m);

#endif
