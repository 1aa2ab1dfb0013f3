/* forward.c: the reference forward pass over a batch of tokens, float32
 * arithmetic on weights of any stored kind, as a sequence of blocks read
 * from the model description (model/arch.h):
 *
 *   h = embed[ids] * embed_mult
 *   per layer l: if mixer[l]: x = rmsnorm(h, mix_norm); h += r * mixer(x)
 *                if ffn[l]:   x = rmsnorm(h, ffn_norm); h += r * ffn(x)
 *   logits = rmsnorm(h, final_norm) Wlm^T / logits_div
 *
 * Blocks (each reads its normed input in s->x [n, H] and leaves its output
 * there):
 *   attention:  q,k,v = x W^T (+b); [per-head qk-norm]; [rope]; append k,v
 *               to the KV cache; causal GQA attention; o_proj
 *   short conv: B, C, u = x Win^T; y = C * conv(B * u) with the conv state;
 *               out_proj (LFM2)
 *   Mamba-2:    z, xBC, dt = x Win^T; xBC = silu(conv(xBC)); y = SSD(x, dt,
 *               B, C) with the SSM state; y = gatednorm(y, z); out_proj
 *   SwiGLU:     down(silu(gate x) * up x);  ReLU^2: down(relu(up x)^2)
 *   MoE:        sum over the router's top-k experts of weight * SwiGLU_e(x)
 *               (+ the shared expert's SwiGLU(x))
 *               (a decode step in neuron-wise refinement mode also adds the
 *               selected neurons' bundles: engine/ffn_neuron.h)
 *
 * Plain and obviously right: this is what every faster backend is checked
 * against (engine/blocks.h: each function below is the meaning of its
 * block kind; spx_blocks_run walks the model's sequence). Matrix products
 * are split over threads by output row; attention by (token, head). */
#include "engine/blocks.h"
#include "engine/ffn_neuron.h"
#include "engine/session.h"
#include "refine/rmat.h"
#include "refine/attach.h"
#include "refine/tier.h"
#include "cpu/ops.h"
#include "cpu/ssm.h"

#include <math.h>
#include <string.h>

/* A pass: n rows (tokens) through the blocks. s is the session whose
 * scratch and kernels run it; row t belongs to session rs[t] at position
 * rpos[t] (rs NULL: every row is s's, at pos0 + t). A session's rows are
 * consecutive at consecutive positions (a segment, seg_end): a plain
 * forward is one segment, a batch step (spx_forward_batch) one per
 * session. Matrix products run over all rows at once; what a session owns
 * (KV rows, recurrent state, attention scratch) is reached through its
 * rows. */
typedef struct {
    spx_session *s;
    const int32_t *ids;
    int64_t n, pos0;
    int want_logits;
    spx_session *const *rs;
    const int64_t *rpos;
    int64_t *job_off; /* attention: [n + 1] first job of each row (rs only) */
} pass;

static spx_session *row_s(const pass *p, int64_t t) { return p->rs ? p->rs[t] : p->s; }
static int64_t row_pos(const pass *p, int64_t t) { return p->rs ? p->rpos[t] : p->pos0 + t; }
/* the end of the segment that starts at row t0 */
static int64_t seg_end(const pass *p, int64_t t0) {
    int64_t t = t0 + 1;
    if (!p->rs) return p->n;
    while (t < p->n && p->rs[t] == p->rs[t0] && p->rpos[t] == p->rpos[t0] + (t - t0)) t++;
    return t;
}

typedef struct {
    const pass *p;
    int64_t kv_layer;
} attn_job;

/* Jobs of (token, KV head, up to attn_gs of its query heads), dealt to
 * the threads in turn: the heads of a job share the KV rows
 * (spx_kv_attend_g reads each row once for all of
 * them); each head's numbers are what a job of its own would give. Each
 * row reads its own session's cache with that session's attn_gs and
 * scratch (a batch's sessions may differ in both). */
static void attn_task(void *arg, int tid, int nth) {
    const attn_job *j = arg;
    const pass *p = j->p;
    const spx_config *c = &p->s->m->cfg;
    int64_t hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    int64_t group = nh / nkv;
    float scale = c->attn_scale;
    const int64_t total = p->rs ? p->job_off[p->n] : p->n * nkv * ((group + p->s->attn_gs - 1) / p->s->attn_gs);
    int64_t t = 0;
    /* round robin, not ranges: a causal prompt's later tokens have more
     * keys, so contiguous ranges gave the last thread the most work */
    for (int64_t w = tid; w < total; w += nth) {
        spx_session *s;
        int64_t r, gs, parts;
        if (p->rs) {
            while (p->job_off[t + 1] <= w) t++; /* w only grows */
            s = p->rs[t];
            gs = s->attn_gs, parts = (group + gs - 1) / gs, r = w - p->job_off[t];
        } else {
            s = p->s;
            gs = s->attn_gs, parts = (group + gs - 1) / gs;
            t = w / (nkv * parts), r = w % (nkv * parts);
        }
        int64_t kvh = r / parts, h0 = kvh * group + (r % parts) * gs;
        int64_t left = (kvh + 1) * group - h0; /* the group's heads from h0 on */
        int G = (int)(left < gs ? left : gs);
        int64_t pos = row_pos(p, t); /* absolute position of this query */
        int64_t start = 0;
        if (c->sliding_window > 0 && pos - c->sliding_window + 1 > 0) start = pos - c->sliding_window + 1;
        const float *q = p->s->q + t * nh * hd + h0 * hd;
        float *sc = s->scores + (size_t)tid * (size_t)gs * (size_t)s->n_ctx;
        spx_kv_attend_g(&s->kv, p->s->cpu.qk, j->kv_layer, kvh, G, q, hd, start, pos + 1, scale, sc, s->n_ctx,
                        p->s->att + t * nh * hd + h0 * hd, hd,
                        s->kv_work ? s->kv_work + (size_t)tid * s->kv_work_floats : NULL);
    }
}

/* ---- blocks ---------------------------------------------------------------- */

static spx_status attention(const pass *p, const spx_layer *L, spx_err *e) {
    spx_session *s = p->s;
    const spx_model *m = s->m;
    const spx_config *c = &m->cfg;
    const int64_t n = p->n;
    int64_t hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, qd = nh * hd, kvd = nkv * hd;
    {
        const spx_wmat *w[3] = {&L->w[SPX_SL_Q], &L->w[SPX_SL_K], &L->w[SPX_SL_V]};
        float *y[3] = {s->q, s->k, s->v};
        const float *b[3] = {L->v[SPX_SL_BQ], L->v[SPX_SL_BK], L->v[SPX_SL_BV]};
        SPX_TRY(spx_cpu_matmul_n(&s->cpu, 3, w, s->x, n, y, b, e));
    }
    for (int64_t t = 0; t < n; t++) {
        float *q = s->q + t * qd, *k = s->k + t * kvd;
        if (L->v[SPX_SL_Q_NORM]) {
            for (int64_t h = 0; h < nh; h++) spx_cpu_rmsnorm(q + h * hd, q + h * hd, L->v[SPX_SL_Q_NORM], hd, c->rms_eps);
            for (int64_t h = 0; h < nkv; h++) spx_cpu_rmsnorm(k + h * hd, k + h * hd, L->v[SPX_SL_K_NORM], hd, c->rms_eps);
        }
        if (c->rope) {
            spx_cpu_rope(q, nh, hd, row_pos(p, t), m->rope_inv_freq);
            spx_cpu_rope(k, nkv, hd, row_pos(p, t), m->rope_inv_freq);
        }
        spx_kv_store(&row_s(p, t)->kv, L->kv_index, row_pos(p, t), k, s->v + t * kvd);
    }
    attn_job aj = {p, L->kv_index};
    spx_pool_run(m->pool, attn_task, &aj);
    for (int64_t t0 = 0, t1; t0 < n; t0 = t1) { /* blocks complete now are encoded (low-bit types) */
        t1 = seg_end(p, t0);
        SPX_TRY(spx_kv_commit(&row_s(p, t0)->kv, L->kv_index, row_pos(p, t1 - 1) + 1, e));
    }
    return spx_cpu_matmul(&s->cpu, &L->w[SPX_SL_O], s->att, n, s->x, L->v[SPX_SL_BO], e);
}

/* LFM2 short convolution: proj[t] = [B | C | u], each H wide. */
static spx_status shortconv(const pass *p, const spx_layer *L, spx_err *e) {
    spx_session *s = p->s;
    const spx_config *c = &s->m->cfg;
    const int64_t n = p->n;
    int64_t H = c->hidden_size, R = 3 * H;
    float *proj = s->proj;
    SPX_TRY(spx_cpu_matmul(&s->cpu, &L->w[SPX_SL_CONV_IN], s->x, n, proj, L->v[SPX_SL_CONV_IN_B], e));
    for (int64_t t = 0; t < n; t++) {
        float *B = proj + t * R, *u = B + 2 * H;
        for (int64_t i = 0; i < H; i++) B[i] *= u[i]; /* B * u, in B's place */
    }
    for (int64_t t0 = 0, t1; t0 < n; t0 = t1) { /* each segment with its session's conv state */
        t1 = seg_end(p, t0);
        spx_cpu_conv_causal(proj + t0 * R, R, t1 - t0, H, L->v[SPX_SL_CONV_W], L->v[SPX_SL_CONV_B], c->conv_kernel,
                            row_s(p, t0)->state + L->state_off, 0, proj + t0 * R, R);
    }
    for (int64_t t = 0; t < n; t++) {
        const float *y = proj + t * R, *C = y + H;
        float *o = s->att + t * H;
        for (int64_t i = 0; i < H; i++) o[i] = C[i] * y[i];
    }
    return spx_cpu_matmul(&s->cpu, &L->w[SPX_SL_CONV_OUT], s->att, n, s->x, L->v[SPX_SL_CONV_OUT_B], e);
}

/* Mamba-2: proj[t] = [z (di) | x B C (cd) | dt (heads)]; the conv state
 * [cd, K-1] comes first in the layer's state, the SSM state [heads, P, N]
 * after it. */
static spx_status mamba2(const pass *p, const spx_layer *L, spx_err *e) {
    spx_session *s = p->s;
    const spx_config *c = &s->m->cfg;
    const int64_t n = p->n;
    int64_t di = spx_ssm_d_inner(c), cd = spx_ssm_conv_dim(c), R = spx_ssm_in_rows(c);
    int64_t GN = c->ssm_groups * c->ssm_state;
    float *proj = s->proj;
    SPX_TRY(spx_cpu_matmul(&s->cpu, &L->w[SPX_SL_SSM_IN], s->x, n, proj, L->v[SPX_SL_SSM_IN_B], e));
    spx_ssd_args a = {c->ssm_heads, c->ssm_head_dim, c->ssm_state, c->ssm_groups,
                      L->v[SPX_SL_SSM_A_LOG], L->v[SPX_SL_SSM_D], L->v[SPX_SL_SSM_DT_BIAS], c->ssm_dt_lo, c->ssm_dt_hi};
    for (int64_t t0 = 0, t1; t0 < n; t0 = t1) { /* each segment with its session's conv and SSM state */
        t1 = seg_end(p, t0);
        const int64_t k = t1 - t0;
        float *conv_state = row_s(p, t0)->state + L->state_off;
        float *ssm_state = conv_state + cd * (c->ssm_conv_kernel - 1);
        float *pr = proj + t0 * R, *xbc = pr + di;
        spx_cpu_conv_causal(xbc, R, k, cd, L->v[SPX_SL_SSM_CONV_W], L->v[SPX_SL_SSM_CONV_B], c->ssm_conv_kernel,
                            conv_state, 1, xbc, R);
        const float *dt = pr + di + cd, *B = xbc + di, *C = B + GN;
        if (k == 1) spx_cpu_ssd_step(&a, xbc, dt, B, C, ssm_state, s->att + t0 * di);
        else spx_cpu_ssd_chunked(&a, xbc, dt, B, C, R, k, c->ssm_chunk, ssm_state, s->att + t0 * di, di, s->ssd_work);
    }
    for (int64_t t = 0; t < n; t++)
        spx_cpu_rmsnorm_gated(s->att + t * di, s->att + t * di, proj + t * R, L->v[SPX_SL_SSM_NORM], di,
                              c->ssm_norm_group, c->rms_eps);
    return spx_cpu_matmul(&s->cpu, &L->w[SPX_SL_SSM_OUT], s->att, n, s->x, L->v[SPX_SL_SSM_OUT_B], e);
}

static spx_status ffn(spx_session *s, const spx_layer *L, int64_t l, int kind, int64_t n, spx_err *e) {
    const spx_config *c = &s->m->cfg;
    int64_t I = c->intermediate_size;
    const spx_bundle_layer *nb = kind == SPX_FFN_SWIGLU ? spx_ffn_neuron_layer(&s->cpu, l, n) : NULL;
    const float *u = NULL; /* neuron mode: the up outputs, still there after silu_mul */
    if (kind == SPX_FFN_RELU2) {
        SPX_TRY(spx_cpu_matmul(&s->cpu, &L->w[SPX_SL_UP], s->x, n, s->gate, L->v[SPX_SL_B_UP], e));
        for (int64_t i = 0; i < n * I; i++) {
            float r = s->gate[i] > 0 ? s->gate[i] : 0;
            s->gate[i] = r * r;
        }
    } else if (c->gate_up_fused) {
        /* [n, 2I] gate-then-up rows: silu(g) * u in each row's gate half, then
         * compacted to [n, I]; row t moves to [tI, tI + I), below every later
         * row's start (t + 1) 2I, so nothing unread is overwritten */
        SPX_TRY(spx_cpu_matmul(&s->cpu, &L->w[SPX_SL_GATE_UP], s->x, n, s->gate, NULL, e));
        if (nb) SPX_TRY(spx_ffn_neuron_save(&s->cpu, nb, s->gate, e));
        u = s->gate + I; /* n == 1: row 0 does not move, so up stays at [I, 2I) */
        for (int64_t t = 0; t < n; t++) {
            float *g = s->gate + t * 2 * I;
            spx_cpu_silu_mul(g, g + I, I);
            memmove(s->gate + t * I, g, (size_t)I * sizeof(float));
        }
    } else {
        const spx_wmat *w[2] = {&L->w[SPX_SL_GATE], &L->w[SPX_SL_UP]};
        float *y[2] = {s->gate, s->up};
        const float *b[2] = {L->v[SPX_SL_B_GATE], L->v[SPX_SL_B_UP]};
        SPX_TRY(spx_cpu_matmul_n(&s->cpu, 2, w, s->x, n, y, b, e));
        if (nb) SPX_TRY(spx_ffn_neuron_save(&s->cpu, nb, s->gate, e));
        u = s->up;
        spx_cpu_silu_mul(s->gate, s->up, n * I);
    }
    if (nb) SPX_TRY(spx_ffn_neuron_select(&s->cpu, nb, s->x, u, s->gate, e));
    SPX_TRY(spx_cpu_matmul(&s->cpu, &L->w[SPX_SL_DOWN], s->gate, n, s->x, L->v[SPX_SL_B_DOWN], e));
    if (nb) spx_ffn_neuron_apply(&s->cpu, nb, s->gate, s->x);
    return SPX_OK;
}

/* moe() for one token: its k experts in two parallel sections (all gate
 * and up products, which share the input, then the k down products, each
 * of its expert's hidden state; spx_cpu_matmul_each) instead of three per
 * expert, so a step's experts are spread over the threads. The products
 * are the same rows as moe()'s loop computes and the outputs are added in
 * expert index order as there: the same floats. Scratch: s->moe's tail,
 * [k] x (2 Ie + Ie + H). */
static spx_status moe_one(spx_session *s, const spx_layer *L, float *sum, spx_err *e) {
    const spx_config *c = &s->m->cfg;
    const int64_t H = c->hidden_size, E = c->n_experts, k = c->moe_top_k, Ie = c->moe_intermediate;
    float *gu = s->moe + spx_batch_max(s->m) * (E + 3 * H + 3 * Ie), *up = gu + k * 2 * Ie, *y = up + k * Ie;
    int32_t ord[SPX_MATMUL_MAX];
    for (int64_t j = 0; j < k; j++) { /* the chosen experts in index order */
        int64_t q = j;
        while (q > 0 && s->moe_idx[ord[q - 1]] > s->moe_idx[j]) { ord[q] = ord[q - 1]; q--; }
        ord[q] = (int32_t)j;
    }
    const spx_wmat *w[SPX_MATMUL_MAX];
    float *o[SPX_MATMUL_MAX];
    const float *in[SPX_MATMUL_MAX], *b[SPX_MATMUL_MAX] = {NULL};
    for (int64_t j = 0; j < k; j++) {
        const int64_t x_e = s->moe_idx[ord[j]];
        if (c->gate_up_fused) {
            w[j] = &L->xw[SPX_SL_EXP_GATE_UP][x_e];
            o[j] = gu + j * 2 * Ie;
        } else {
            w[2 * j] = &L->xw[SPX_SL_EXP_GATE][x_e];
            w[2 * j + 1] = &L->xw[SPX_SL_EXP_UP][x_e];
            o[2 * j] = gu + j * 2 * Ie;
            o[2 * j + 1] = up + j * Ie;
        }
    }
    SPX_TRY(spx_cpu_matmul_n(&s->cpu, (int)(c->gate_up_fused ? k : 2 * k), w, s->x, 1, o, b, e));
    for (int64_t j = 0; j < k; j++) {
        float *g = gu + j * 2 * Ie;
        spx_cpu_silu_mul(g, c->gate_up_fused ? g + Ie : up + j * Ie, Ie);
        w[j] = &L->xw[SPX_SL_EXP_DOWN][s->moe_idx[ord[j]]];
        in[j] = g;
        o[j] = y + j * H;
    }
    SPX_TRY(spx_cpu_matmul_each(&s->cpu, (int)k, w, in, o, e));
    for (int64_t j = 0; j < k; j++) {
        const float wt = s->moe_w[ord[j]], *yr = y + j * H;
        for (int64_t i = 0; i < H; i++) sum[i] += wt * yr[i];
    }
    return SPX_OK;
}

/* Mixture of experts over s->x [n, H] into s->x. Per row: router logits
 * (float32 products with the float32 router, double sums); the moe_top_k
 * largest (ties to the lower expert, as torch.topk), weighted by their
 * softmax probabilities over all experts, renormalised over the chosen
 * when moe_norm_topk (Granite's softmax of the top-k logits is that
 * same number). Then expert by expert, in index order as transformers
 * adds them: its rows gathered, SwiGLU through its matrices (only the
 * chosen experts' weights are read), each output row added to its row's
 * sum with its weight. A shared expert (moe_shared) is the dense SwiGLU of
 * the same input, added last. */
static spx_status moe(spx_session *s, const spx_layer *L, int64_t l, int64_t n, spx_err *e) {
    const spx_config *c = &s->m->cfg;
    const int64_t H = c->hidden_size, E = c->n_experts, k = c->moe_top_k, Ie = c->moe_intermediate;
    float *lg = s->moe, *xg = lg + n * E, *gu = xg + n * H, *up = gu + n * 2 * Ie, *y = up + n * Ie, *sum = y + n * H;
    int32_t *sel = s->moe_idx, *rows = sel + n * k;
    const float *R = L->v[SPX_SL_ROUTER];
    for (int64_t t = 0; t < n; t++) {
        const float *x = s->x + t * H;
        float *z = lg + t * E, mx = -INFINITY;
        for (int64_t x_e = 0; x_e < E; x_e++) {
            double d = 0;
            for (int64_t i = 0; i < H; i++) d += (double)x[i] * R[x_e * H + i];
            z[x_e] = (float)d;
            mx = fmaxf(mx, z[x_e]);
        }
        double zs = 0;
        for (int64_t x_e = 0; x_e < E; x_e++) zs += exp((double)z[x_e] - mx);
        double ws = 0;
        for (int64_t j = 0; j < k; j++) { /* the j-th largest: k is small */
            int64_t b = -1;
            for (int64_t x_e = 0; x_e < E; x_e++) {
                int taken = 0;
                for (int64_t q = 0; q < j; q++) taken |= sel[t * k + q] == x_e;
                if (!taken && (b < 0 || z[x_e] > z[b])) b = x_e;
            }
            sel[t * k + j] = (int32_t)b;
            s->moe_w[t * k + j] = (float)(exp((double)z[b] - mx) / zs);
            ws += s->moe_w[t * k + j];
        }
        if (c->moe_norm_topk)
            for (int64_t j = 0; j < k; j++) s->moe_w[t * k + j] = (float)(s->moe_w[t * k + j] / ws);
    }
    memset(sum, 0, (size_t)(n * H) * sizeof *sum);
    if (n == 1 && 2 * k <= SPX_MATMUL_MAX) SPX_TRY(moe_one(s, L, sum, e));
    else for (int64_t x_e = 0; x_e < E; x_e++) {
        int64_t nr = 0;
        for (int64_t t = 0; t < n; t++)
            for (int64_t j = 0; j < k; j++)
                if (sel[t * k + j] == x_e) rows[nr++] = (int32_t)(t * k + j);
        if (!nr) continue;
        for (int64_t r = 0; r < nr; r++) memcpy(xg + r * H, s->x + (rows[r] / k) * H, (size_t)H * sizeof *xg);
        if (c->gate_up_fused) { /* [nr, 2 Ie] gate-then-up rows */
            SPX_TRY(spx_cpu_matmul(&s->cpu, &L->xw[SPX_SL_EXP_GATE_UP][x_e], xg, nr, gu, NULL, e));
            for (int64_t r = 0; r < nr; r++) {
                spx_cpu_silu_mul(gu + r * 2 * Ie, gu + r * 2 * Ie + Ie, Ie);
                memmove(gu + r * Ie, gu + r * 2 * Ie, (size_t)Ie * sizeof *gu);
            }
        } else {
            const spx_wmat *w[2] = {&L->xw[SPX_SL_EXP_GATE][x_e], &L->xw[SPX_SL_EXP_UP][x_e]};
            float *o[2] = {gu, up};
            const float *b[2] = {NULL, NULL};
            SPX_TRY(spx_cpu_matmul_n(&s->cpu, 2, w, xg, nr, o, b, e));
            spx_cpu_silu_mul(gu, up, nr * Ie);
        }
        SPX_TRY(spx_cpu_matmul(&s->cpu, &L->xw[SPX_SL_EXP_DOWN][x_e], gu, nr, y, NULL, e));
        for (int64_t r = 0; r < nr; r++) {
            const float w = s->moe_w[rows[r]], *yr = y + r * H;
            float *o = sum + (rows[r] / k) * H;
            for (int64_t i = 0; i < H; i++) o[i] += w * yr[i];
        }
    }
    if (c->moe_shared) SPX_TRY(ffn(s, L, l, SPX_FFN_SWIGLU, n, e)); /* s->x: the shared expert's output */
    else memset(s->x, 0, (size_t)(n * H) * sizeof *s->x);
    for (int64_t i = 0; i < n * H; i++) s->x[i] += sum[i];
    return SPX_OK;
}

static void add_residual(float *h, const float *x, int64_t n, float r) {
    if (r == 1.0f)
        for (int64_t i = 0; i < n; i++) h[i] += x[i];
    else
        for (int64_t i = 0; i < n; i++) h[i] += r * x[i];
}

/* ---- the block interface (engine/blocks.h) ----------------------------------- */

/* x = rmsnorm(h) * gain: a block's input */
static void norm_in(const pass *p, const float *gain) {
    const spx_config *c = &p->s->m->cfg;
    const int64_t H = c->hidden_size;
    for (int64_t t = 0; t < p->n; t++) spx_cpu_rmsnorm(p->s->x + t * H, p->s->h + t * H, gain, H, c->rms_eps);
}

/* h += residual_mult * x: a block's output */
static void add_out(const pass *p) { add_residual(p->s->h, p->s->x, p->n * p->s->m->cfg.hidden_size, p->s->m->cfg.residual_mult); }

static spx_status b_embed(void *ctx, spx_err *e) {
    const pass *p = ctx;
    const spx_model *m = p->s->m;
    const int64_t H = m->cfg.hidden_size;
    for (int64_t t = 0; t < p->n; t++) spx_wmat_row_f32(&m->embed, p->ids[t], p->s->h + t * H);
    if (m->cfg.embed_mult != 1.0f)
        for (int64_t i = 0; i < p->n * H; i++) p->s->h[i] *= m->cfg.embed_mult;
    return SPX_OK;
}

#define LAYER(p, l) (&(p)->s->m->layers[l])
/* a mixer block: h += r * mixer(rmsnorm(h) * mix_norm) (the recurrent
 * mixers ignore the positions: their position is their state) */
typedef spx_status (*mixer_fn)(const pass *p, const spx_layer *L, spx_err *e);
static spx_status b_mixer(const pass *p, int64_t l, mixer_fn f, spx_err *e) {
    norm_in(p, LAYER(p, l)->v[SPX_SL_MIX_NORM]);
    SPX_TRY(f(p, LAYER(p, l), e));
    add_out(p);
    return SPX_OK;
}
static spx_status b_attention(void *ctx, int64_t l, int first, spx_err *e) { return b_mixer(ctx, l, attention, e); }
static spx_status b_shortconv(void *ctx, int64_t l, int first, spx_err *e) { return b_mixer(ctx, l, shortconv, e); }
static spx_status b_mamba2(void *ctx, int64_t l, int first, spx_err *e) { return b_mixer(ctx, l, mamba2, e); }
static spx_status b_ffn(const pass *p, int64_t l, int kind, spx_err *e) {
    norm_in(p, LAYER(p, l)->v[SPX_SL_FFN_NORM]);
    SPX_TRY(ffn(p->s, LAYER(p, l), l, kind, p->n, e));
    add_out(p);
    return SPX_OK;
}
static spx_status b_swiglu(void *ctx, int64_t l, int first, spx_err *e) { return b_ffn(ctx, l, SPX_FFN_SWIGLU, e); }
static spx_status b_relu2(void *ctx, int64_t l, int first, spx_err *e) { return b_ffn(ctx, l, SPX_FFN_RELU2, e); }
static spx_status b_moe(void *ctx, int64_t l, int first, spx_err *e) {
    const pass *p = ctx;
    norm_in(p, LAYER(p, l)->v[SPX_SL_FFN_NORM]);
    SPX_TRY(moe(p->s, LAYER(p, l), l, p->n, e));
    add_out(p);
    return SPX_OK;
}

static spx_status b_head(void *ctx, spx_err *e) {
    const pass *p = ctx;
    spx_session *s = p->s;
    const spx_model *m = s->m;
    const spx_config *c = &m->cfg;
    const int64_t H = c->hidden_size, n = p->n;
    if (!p->want_logits) return SPX_OK;
    int64_t first = p->want_logits == SPX_LOGITS_ALL ? 0 : n - 1;
    for (int64_t t = first; t < n; t++) spx_cpu_rmsnorm(s->x + (t - first) * H, s->h + t * H, m->final_norm, H, c->rms_eps);
    SPX_TRY(spx_cpu_matmul(&s->cpu, &m->lm_head, s->x, n - first, s->logits, NULL, e));
    if (c->logits_div != 1.0f) {
        int64_t k = (n - first) * c->vocab_size;
        for (int64_t i = 0; i < k; i++) s->logits[i] /= c->logits_div;
    }
    return SPX_OK;
}

static const spx_block_ops cpu_blocks = {
    .backend = "cpu",
    .embed = b_embed,
    .block = {[SPX_BLK_ATTENTION] = b_attention, [SPX_BLK_SHORTCONV] = b_shortconv, [SPX_BLK_MAMBA2] = b_mamba2,
              [SPX_BLK_SWIGLU] = b_swiglu, [SPX_BLK_RELU2] = b_relu2, [SPX_BLK_MOE] = b_moe},
    .head = b_head,
};

spx_status spx_forward_check(const spx_model *m, spx_err *e) { return spx_blocks_check(&m->cfg, &cpu_blocks, m->path, e); }

spx_status spx_forward(spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e) {
    /* batch size, context room and token ids were checked by
     * spx_session_forward (backend.c) for every backend */
    pass p = {s, ids, n, s->pos, want_logits, NULL, NULL, NULL};
    /* the model's refinement as it is now: attached, changed or dropped
     * since the session began (never a pointer to a detached one) */
    s->cpu.refine = spx_refine_runtime(s->m);
    SPX_TRY(spx_blocks_run(&s->m->cfg, &cpu_blocks, &p, e));
    s->pos += n;
    /* the refinement columns this step used are released to the cache */
    if (s->cpu.refine && s->cpu.refine->tier) SPX_TRY(spx_tier_step_end(s->cpu.refine->tier, e));
    SPX_TRY(spx_kv_step_end(&s->kv, e)); /* and the KV cache's file tier's records */
    return SPX_OK;
}

spx_status spx_forward_batch(spx_session *const *ss, const int32_t *ids, int64_t n, int32_t *best, spx_err *e) {
    /* checked by spx_batch_step (engine/batch.c): 1 <= n <= the batch
     * limit, distinct sessions of one model with room, ids in range, no
     * refinement attached (it applies to one-token steps only) */
    spx_session *s = ss[0];
    int64_t rpos[SPX_BATCH_MAX], off[SPX_BATCH_MAX + 1];
    const spx_config *c = &s->m->cfg;
    const int64_t group = c->n_heads / c->n_kv_heads;
    off[0] = 0;
    for (int64_t t = 0; t < n; t++) {
        rpos[t] = ss[t]->pos;
        off[t + 1] = off[t] + c->n_kv_heads * ((group + ss[t]->attn_gs - 1) / ss[t]->attn_gs);
    }
    pass p = {s, ids, n, 0, SPX_LOGITS_ALL, ss, rpos, off};
    s->cpu.refine = NULL;
    SPX_TRY(spx_blocks_run(c, &cpu_blocks, &p, e));
    for (int64_t t = 0; t < n; t++) {
        ss[t]->pos++;
        SPX_TRY(spx_kv_step_end(&ss[t]->kv, e));
        if (best) best[t] = spx_sample(s->logits + (size_t)t * (size_t)c->vocab_size, c->vocab_size, NULL, NULL);
    }
    return SPX_OK;
}
