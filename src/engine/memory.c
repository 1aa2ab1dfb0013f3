/* memory.c: the CUDA backend's device memory, defined once (memory.h). */
#include "engine/memory.h"
#include "engine/session.h"
#include "model/arch.h"

size_t spx_mem_take(size_t *off, size_t n) {
    size_t o = (*off + SPX_MEM_ALIGN - 1) & ~(size_t)(SPX_MEM_ALIGN - 1);
    *off = o + n + SPX_MEM_SLACK;
    return o;
}

int spx_mem_dev_tiled(const spx_qtensor *q) {
    /* bits 2 and 3 under 4-bit tile16x128's conditions (cuda/lowbit.cuh) */
    return q->layout == SPX_Q_TILED || (q->bits >= 2 && q->bits <= 4 && spx_q_tiled_ok(4, (int)q->group, q->cols));
}

void spx_mem_mat_parts(const spx_qtensor *q, size_t parts[5]) {
    const int layout = spx_mem_dev_tiled(q) ? SPX_Q_TILED : SPX_Q_ROWS;
    parts[0] = (size_t)spx_q_codes_bytes(q->rows, q->cols, (int)q->bits, layout);
    parts[1] = (size_t)spx_q_scales_bytes(q->rows, q->cols, (int)q->group, layout);
    parts[2] = (size_t)spx_q_zeros_bytes(q->rows, q->cols, (int)q->group, layout);
    parts[3] = q->n_outliers > 0 ? (size_t)q->n_outliers * 4 : 0;
    parts[4] = q->n_outliers > 0 ? (size_t)q->rows * (size_t)q->n_outliers * 2 : 0;
}

size_t spx_mem_ssd_work_floats(int64_t H, int64_t P, int64_t N, int64_t T) {
    const int64_t nc = (T + SPX_MEM_SSD_CHUNK - 1) / SPX_MEM_SSD_CHUNK;
    if (nc <= 1) return 0;
    return (size_t)nc * (size_t)H * (size_t)P * (size_t)N + (size_t)T * (size_t)H;
}

static void take_mat(size_t *off, const spx_qtensor *q) {
    size_t p[5];
    spx_mem_mat_parts(q, p);
    for (int i = 0; i < 5; i++)
        if (i < 3 || p[i]) spx_mem_take(off, p[i]);
}

size_t spx_mem_layer_image(const spx_model *m, int64_t l) {
    const spx_layer *L = &m->layers[l];
    size_t off = 0;
    for (int s = 0; s < SPX_SL_COUNT; s++) {
        if (spx_slots[s].mat) {
            if (L->w[s].rows) take_mat(&off, &L->w[s].q);
        } else if (L->v[s]) {
            spx_mem_take(&off, (size_t)spx_slot_numel(&m->cfg, l, (spx_slot)s) * sizeof(float));
        }
    }
    return off;
}

int spx_mem_head_shared(const spx_model *m) {
    return m->lm_head.kind == SPX_WM_QUANT && m->lm_head.q.codes && m->lm_head.q.codes == m->embed.q.codes;
}

size_t spx_mem_global_image(const spx_model *m) {
    size_t off = 0;
    take_mat(&off, &m->embed.q);
    if (!spx_mem_head_shared(m)) take_mat(&off, &m->lm_head.q);
    if (m->final_norm) spx_mem_take(&off, (size_t)m->cfg.hidden_size * sizeof(float));
    if (m->rope_inv_freq) spx_mem_take(&off, (size_t)(m->cfg.head_dim / 2) * sizeof(float));
    return off;
}

void spx_mem_cuda_scratch(const spx_config *c, int64_t state_floats, int with_w16, spx_cuda_scratch *s) {
    const size_t B = SPX_BATCH_MAX_CUDA, H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    const size_t hd = (size_t)c->head_dim, qd = (size_t)c->n_heads * hd, kvd = (size_t)c->n_kv_heads * hd;
    const size_t V = (size_t)c->vocab_size;
    /* the recurrent blocks' widths: the in_proj output (short conv 3 H,
     * Mamba-2 its rows), the out_proj input (Mamba-2 d_inner); a fused
     * gate+up matrix writes 2 I */
    const size_t proj = (size_t)spx_arch_max_proj(c), di = (size_t)spx_arch_max_d_inner(c);
    const size_t I2 = c->gate_up_fused ? 2 * I : I;
    size_t wide = H > qd ? H : qd;
    if (I2 > wide) wide = I2;
    if (proj > wide) wide = proj;
    if (di > wide) wide = di;
    const size_t attw = qd > di ? (qd > H ? qd : H) : di;
    s->wide = wide;
    s->h = B * H * 4;
    s->x = B * wide * 4;
    s->q = B * qd * 4;
    s->k = s->v = B * kvd * 4;
    s->att = B * attw * 4;
    s->gate = B * I2 * 4;
    s->proj = B * proj * 4;
    s->state = s->state_ckpt = (size_t)state_floats * 4;
    s->up = B * I * 4;
    s->logits = (size_t)SPX_BATCH_MAX * V * 4; /* LM_ALL goes in chunks */
    s->part = (size_t)SPX_MEM_PART_TOK_SPLITS * (size_t)c->n_heads * (hd + 2) * 4;
    s->x16 = B * wide * 2;
    s->ws_floats = 4 * (size_t)SPX_BATCH_MAX * wide; /* split-K partials: large M needs few splits */
    s->ws = s->ws_floats * 4;
    /* the largest layer matrix (the LM head goes in row chunks), capped */
    size_t mx = (qd > kvd ? qd : kvd) * H;
    if (H * qd > mx) mx = H * qd;
    if (I2 * H > mx) mx = I2 * H;
    if (proj * H > mx) mx = proj * H;
    if (di * H > mx) mx = di * H;
    if (mx > (size_t)SPX_CUDA_W16_MAX_ELEMS) mx = (size_t)SPX_CUDA_W16_MAX_ELEMS;
    s->w16_elems = with_w16 ? mx : 0;
    s->w16 = s->w16_elems * 2;
    s->ids = B * 4;
    s->pos = 4;
    s->best = 8;
    s->attn_cnt = (size_t)c->n_heads * 4;
    /* every Mamba-2 layer has the config's SSD shape */
    s->ssd = di ? spx_mem_ssd_work_floats(c->ssm_heads, c->ssm_head_dim, c->ssm_state, (int64_t)B) * 4 : 0;
    s->total = s->h + s->x + s->q + s->k + s->v + s->att + s->gate + s->proj + s->state + s->state_ckpt + s->up +
               s->logits + s->part + s->x16 + s->ws + s->w16 + s->ids + s->pos + s->best + s->attn_cnt + s->ssd;
}
