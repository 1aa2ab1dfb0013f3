/* forward.c: the reference forward pass of a Llama-family decoder over a
 * batch of tokens, float32 arithmetic on weights of any stored kind.
 *
 *   h = embed[ids]
 *   per layer: x = rmsnorm(h); q,k,v = x W^T (+b); [qk-norm]; rope(q,k);
 *              append k,v to the cache; a = causal GQA attention; h += a Wo^T
 *              x = rmsnorm(h); h += down(silu(gate x) * up x)
 *   logits = rmsnorm(h) Wlm^T
 *
 * Plain and obviously right: this is what every faster backend is checked
 * against. Matrix products are split over threads by output row;
 * attention by (token, head). */
#include "engine/session.h"
#include "cpu/ops.h"

#include <math.h>
#include <string.h>

typedef struct {
    spx_session *s;
    int64_t layer, n, pos0;
} attn_job;

/* Jobs of (token, KV head, up to attn_gs of its query heads), dealt to
 * the threads in turn: the heads of a job share the KV rows
 * (spx_kv_scores_g / spx_kv_weighted_v_g read each row once for all of
 * them); each head's numbers are what a job of its own would give. */
static void attn_task(void *arg, int tid, int nth) {
    const attn_job *j = arg;
    spx_session *s = j->s;
    const spx_config *c = &s->m->cfg;
    int64_t hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    int64_t group = nh / nkv, gs = s->attn_gs, parts = (group + gs - 1) / gs;
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = s->scores + (size_t)tid * (size_t)gs * (size_t)s->n_ctx;
    /* round robin, not ranges: a causal prompt's later tokens have more
     * keys, so contiguous ranges gave the last thread the most work (3/4
     * of it with two threads) */
    for (int64_t w = tid; w < j->n * nkv * parts; w += nth) {
        int64_t t = w / (nkv * parts), kvh = (w / parts) % nkv, h0 = kvh * group + (w % parts) * gs;
        int64_t left = (kvh + 1) * group - h0; /* the group's heads from h0 on */
        int G = (int)(left < gs ? left : gs);
        int64_t p = j->pos0 + t; /* absolute position of this query */
        int64_t start = 0;
        if (c->sliding_window > 0 && p - c->sliding_window + 1 > 0) start = p - c->sliding_window + 1;
        const float *q = s->q + t * nh * hd + h0 * hd;
        spx_kv_scores_g(&s->kv, s->cpu.qk, j->layer, kvh, G, q, hd, start, p + 1, scale, sc, s->n_ctx);
        for (int g = 0; g < G; g++) s->cpu.qk->softmax(sc + (size_t)g * (size_t)s->n_ctx, p + 1 - start);
        spx_kv_weighted_v_g(&s->kv, s->cpu.qk, j->layer, kvh, G, sc, s->n_ctx, start, p + 1,
                            s->att + t * nh * hd + h0 * hd, hd);
    }
}

spx_status spx_forward(spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e) {
    spx_model *m = s->m;
    const spx_config *c = &m->cfg;
    int64_t H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    int64_t nh = c->n_heads, nkv = c->n_kv_heads, qd = nh * hd, kvd = nkv * hd;
    /* batch size, context room and token ids were checked by
     * spx_session_forward (backend.c) for every backend */
    int64_t pos0 = s->pos;
    for (int64_t t = 0; t < n; t++) spx_wmat_row_f32(&m->embed, ids[t], s->h + t * H);

    for (int64_t l = 0; l < c->n_layers; l++) {
        const spx_layer *L = &m->layers[l];
        for (int64_t t = 0; t < n; t++) spx_cpu_rmsnorm(s->x + t * H, s->h + t * H, L->attn_norm, H, c->rms_eps);
        {
            const spx_wmat *w[3] = {&L->wq, &L->wk, &L->wv};
            float *y[3] = {s->q, s->k, s->v};
            const float *b[3] = {L->bq, L->bk, L->bv};
            SPX_TRY(spx_cpu_matmul_n(&s->cpu, 3, w, s->x, n, y, b, e));
        }
        for (int64_t t = 0; t < n; t++) {
            float *q = s->q + t * qd, *k = s->k + t * kvd;
            if (c->qk_norm) {
                for (int64_t h = 0; h < nh; h++) spx_cpu_rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, c->rms_eps);
                for (int64_t h = 0; h < nkv; h++) spx_cpu_rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, c->rms_eps);
            }
            spx_cpu_rope(q, nh, hd, pos0 + t, m->rope_inv_freq);
            spx_cpu_rope(k, nkv, hd, pos0 + t, m->rope_inv_freq);
            spx_kv_store(&s->kv, l, pos0 + t, k, s->v + t * kvd);
        }
        attn_job aj = {s, l, n, pos0};
        spx_pool_run(m->pool, attn_task, &aj);
        SPX_TRY(spx_cpu_matmul(&s->cpu, &L->wo, s->att, n, s->x, L->bo, e));
        for (int64_t i = 0; i < n * H; i++) s->h[i] += s->x[i];

        for (int64_t t = 0; t < n; t++) spx_cpu_rmsnorm(s->x + t * H, s->h + t * H, L->mlp_norm, H, c->rms_eps);
        {
            const spx_wmat *w[2] = {&L->w_gate, &L->w_up};
            float *y[2] = {s->gate, s->up};
            const float *b[2] = {L->b_gate, L->b_up};
            SPX_TRY(spx_cpu_matmul_n(&s->cpu, 2, w, s->x, n, y, b, e));
        }
        spx_cpu_silu_mul(s->gate, s->up, n * I);
        SPX_TRY(spx_cpu_matmul(&s->cpu, &L->w_down, s->gate, n, s->x, L->b_down, e));
        for (int64_t i = 0; i < n * H; i++) s->h[i] += s->x[i];
    }
    s->pos += n;
    if (want_logits) {
        int64_t first = want_logits == SPX_LOGITS_ALL ? 0 : n - 1;
        for (int64_t t = first; t < n; t++)
            spx_cpu_rmsnorm(s->x + (t - first) * H, s->h + t * H, m->final_norm, H, c->rms_eps);
        SPX_TRY(spx_cpu_matmul(&s->cpu, &m->lm_head, s->x, n - first, s->logits, NULL, e));
    }
    return SPX_OK;
}
