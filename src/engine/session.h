/* session.h: internal session state (KV cache, recurrent state cache,
 * scratch). */
#ifndef SPX_SESSION_H
#define SPX_SESSION_H

#include "cpu/ops.h"
#include "engine/kvcache.h"
#include "model/model.h"

#define SPX_BATCH_MAX 128 /* tokens per forward chunk on the CPU (scratch sizing) */
/* The CUDA backend takes 4x as many per forward call: a prefill GEMM of 512
 * tokens amortizes its weight reads (and, through cuBLAS, the fp16
 * dequantization of each matrix) four times better. */
#define SPX_BATCH_MAX_CUDA 512
/* cap of the CUDA backend's fp16 weight scratch for cuBLAS (elements) */
#define SPX_CUDA_W16_MAX_ELEMS ((int64_t)128 << 20)

struct spx_session {
    spx_model *m;
    int64_t n_ctx;
    int64_t pos;          /* tokens in the KV cache */
    spx_kvcache kv;
    /* scratch for up to spx_batch_max(m) tokens (the CPU backend's; a device
     * backend keeps its own and these stay NULL, except logits) */
    float *h, *x, *q, *k, *v, *att, *gate, *up;
    float *proj;          /* [B, widest recurrent in_proj] (short conv, Mamba-2) or NULL */
    float *ssd_work;      /* the chunked SSD's scratch (Mamba-2) or NULL */
    /* mixture of experts (NULL without MoE layers): [B] rows of router
     * logits [E], an expert's gathered inputs [H], its gate/up outputs
     * [2 Ie] and up [Ie], its outputs [H], the routed sum [H]; the top-k
     * choice per row: experts and weights [B k], and per expert its rows */
    float *moe;
    int32_t *moe_idx;     /* [B k] chosen experts, then [B] rows of the expert at hand */
    float *moe_w;         /* [B k] their weights */
    spx_cpu_ctx cpu;      /* pool, kernels, matmul scratch */
    float *scores;        /* [threads, attn_gs, n_ctx] */
    float *kv_work;       /* [threads, kv_work_floats]: a low-bit KV cache's attention scratch, or NULL */
    size_t kv_work_floats;
    int attn_gs;          /* query heads per attention job (a GQA group's share: the fp16 cache's rows
                           * are read once for them) */
    float *logits;        /* [spx_batch_max(m), vocab] */
    /* The state cache: every recurrent layer's conv and SSM state
     * (m->state_floats floats at layer offsets L->state_off; zero at
     * position 0), beside the KV cache, and one checkpoint of it
     * (spx_session_checkpoint / spx_session_truncate). */
    float *state, *state_ckpt;
    int64_t ckpt_pos;     /* position of the checkpoint, -1: none */
    void *be_state;       /* backend's per-session state (device KV, graphs) */
    int be_ready;         /* session_init succeeded (session_free owed) */
    spx_err err;
};

enum { SPX_LOGITS_NONE = 0, SPX_LOGITS_LAST = 1, SPX_LOGITS_ALL = 2 };

/* Tokens one forward call of the model's backend takes at most. */
int64_t spx_batch_max(const spx_model *m);

/* Runs n (<= spx_batch_max) tokens at positions pos..pos+n-1. want_logits:
 * SPX_LOGITS_LAST writes the last token's logits to s->logits[0..vocab),
 * SPX_LOGITS_ALL every token's ([n, vocab]); NONE only advances the cache. */
spx_status spx_forward(spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e);
/* A batch step on the CPU: row t is ids[t] fed to ss[t] at its position
 * (n distinct sessions of one model, the matrix products shared); the
 * rows' logits land in ss[0]->logits [n, vocab] (best set: also their
 * argmaxes in best[n]) and every session advances by one. The caller (spx_batch_step) checked the arguments. */
spx_status spx_forward_batch(spx_session *const *ss, const int32_t *ids, int64_t n, int32_t *best, spx_err *e);
/* Whether the CPU blocks run every layer of m (engine/blocks.h; at model open). */
spx_status spx_forward_check(const spx_model *m, spx_err *e);
/* The same through the model's backend (what the API calls). */
spx_status spx_session_forward(spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e);
/* Runs n tokens (checked as spx_session_forward) and writes each row's
 * argmax (the first maximum, spx_sample's greedy choice) to best[n]: a
 * greedy verification needs no more (a GPU sends n ids, not n rows of
 * logits). */
spx_status spx_session_forward_argmax(spx_session *s, const int32_t *ids, int64_t n, int32_t *best, spx_err *e);

#endif
