/* session.h: internal session state (KV cache and scratch). */
#ifndef SPX_SESSION_H
#define SPX_SESSION_H

#include "cpu/ops.h"
#include "engine/kvcache.h"
#include "model/model.h"

#define SPX_BATCH_MAX 128 /* tokens per forward chunk (scratch sizing) */

struct spx_session {
    spx_model *m;
    int64_t n_ctx;
    int64_t pos;          /* tokens in the KV cache */
    spx_kvcache kv;
    /* scratch for up to SPX_BATCH_MAX tokens */
    float *h, *x, *q, *k, *v, *att, *gate, *up;
    spx_cpu_ctx cpu;      /* pool, kernels, matmul scratch */
    float *scores;        /* [threads, n_ctx] */
    float *logits;        /* [SPX_BATCH_MAX, vocab] */
    void *be_state;       /* backend's per-session state (device KV, graphs) */
    int be_ready;         /* session_init succeeded (session_free owed) */
    spx_err err;
};

enum { SPX_LOGITS_NONE = 0, SPX_LOGITS_LAST = 1, SPX_LOGITS_ALL = 2 };

/* Runs n (<= SPX_BATCH_MAX) tokens at positions pos..pos+n-1. want_logits:
 * SPX_LOGITS_LAST writes the last token's logits to s->logits[0..vocab),
 * SPX_LOGITS_ALL every token's ([n, vocab]); NONE only advances the cache. */
spx_status spx_forward(spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e);
/* The same through the model's backend (what the API calls). */
spx_status spx_session_forward(spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e);

#endif
