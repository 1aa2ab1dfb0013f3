/* cu_forward.cu: the CUDA forward pass: the same math as the CPU reference
 * (engine/forward.c), one token through the fused GEMV path, n >= 2
 * through the tensor-core GEMM (n <= 16: the few-token kernel of
 * gemm_mtok.cuh; see cu_backend.cuh and run_gemm). */
#include "cuda/cu_backend.cuh"
#include "cuda/ssm.cuh"
#include "cuda/gemm_mtok.cuh"

/* Weight refinement (cu_refine.cu) runs beside the decode launches: each
 * refined launch forks the side stream before its GEMV and joins it after,
 * adding the selected columns' contribution to the raw outputs. A refined
 * gate/up launch stores gate and up raw (its SwiGLU moves to the join).
 * With fetch lead the q/k/v and gate/up launches' channels were chosen and
 * their columns fetched some half-blocks earlier (lead_point below); the
 * launch takes its slot (cu_rf_lead_take) and forks as before. */

/* ---- the forward pass ---------------------------------------------------- */

/* --kv q4: layer l's K and V caches (kvq4.cuh) and the Hadamard block; with
 * the fp16 cache *k and *v are zeroed, which selects the fp16 kernels. */
static void kv_q4_layer(const spx_session *s, const cu_sess *cs, int64_t l, spx_kvq4 *k, spx_kvq4 *v, int *rot) {
    memset(k, 0, sizeof *k);
    memset(v, 0, sizeof *v);
    *rot = 1;
    if (s->kv.type != SPX_KV_Q4) return;
    const spx_config *c = &s->m->cfg;
    const int64_t kvd = c->n_kv_heads * c->head_dim;
    *k = spx_kvq4_at(cs->kc, l, s->n_ctx, kvd);
    *v = spx_kvq4_at(cs->vc, l, s->n_ctx, kvd);
    *rot = spx_kvq4_rot(c->head_dim, kvd);
}

static spx_gemv_args gemv_one(const spx_dqmat &w, const float *x, float *y, const float *bias, int mode) {
    spx_gemv_args g;
    memset(&g, 0, sizeof g);
    g.w[0] = w;
    g.o[0].y = y;
    g.o[0].bias = bias;
    g.n_mats = 1;
    g.mode = mode;
    g.x = x;
    return g;
}

/* The decode step's GEMV launches of layer L: merged q/k/v on rmsnorm(h);
 * gate/up on rmsnorm(h) and down added into h (below). */
static spx_gemv_args gemv_qkv(const cu_layer *L, cu_sess *cs, float eps) {
    spx_gemv_args g = gemv_one(L->w[SPX_SL_Q], cs->h, cs->q, L->v[SPX_SL_BQ], SPX_GEMV_STORE);
    g.w[1] = L->w[SPX_SL_K];
    g.o[1].y = cs->k;
    g.o[1].bias = L->v[SPX_SL_BK];
    g.w[2] = L->w[SPX_SL_V];
    g.o[2].y = cs->v;
    g.o[2].bias = L->v[SPX_SL_BV];
    g.n_mats = 3;
    g.gain = L->v[SPX_SL_MIX_NORM];
    g.eps = eps;
    return g;
}
/* gate/up and down. Row-major: one fused SwiGLU launch stores the product
 * in gate. Tiled: pair (the two-group form; cm->gemv_pair) stores the
 * product in gate too; else silu(gate) and up are stored apart and the
 * down GEMV's input is their product (x2). */
static spx_gemv_args gemv_gate_up(const cu_layer *L, cu_sess *cs, float eps, bool pair) {
    const bool tl = L->w[SPX_SL_GATE].tiled, apart = tl && !pair;
    spx_gemv_args g = gemv_one(L->w[SPX_SL_GATE], cs->h, cs->gate, L->v[SPX_SL_B_GATE], tl ? SPX_GEMV_STORE : SPX_GEMV_SWIGLU);
    g.w[1] = L->w[SPX_SL_UP];
    g.o[0].silu = apart;
    g.o[1].y = apart ? cs->up : NULL;
    g.o[1].bias = L->v[SPX_SL_B_UP];
    g.n_mats = 2;
    g.gain = L->v[SPX_SL_FFN_NORM];
    g.eps = eps;
    g.pair = tl && pair;
    return g;
}
static spx_gemm_args gemm_one(const cu_sess *cs, const spx_dqmat &w, const __half *x, int64_t ldx, float *y,
                              int64_t ldy, const float *bias, int M, int accumulate) {
    spx_gemm_args g;
    memset(&g, 0, sizeof g);
    g.ws = cs->ws;
    g.ws_floats = cs->ws_floats;
    g.w = w;
    g.x = x;
    g.ldx = ldx;
    g.y = y;
    g.ldy = ldy;
    g.bias = bias;
    g.M = M;
    g.accumulate = accumulate;
    return g;
}

/* The n >= 2 token product: decode-sized passes (n <= SPX_MTOK_MAX_M:
 * speculative verification, batched decode) through gemm_mtok.cu's kernel,
 * which reads each weight once into registers (the same numerics as the
 * prefill GEMM); larger ones through cuBLAS (dequantized fp16 scratch) for
 * M >= spx_gemm_cublas_min_m() tokens when it was loaded, else gemm_q4.cu's
 * tensor-core kernel (see gemm_cublas.cuh). */
static cudaError_t run_gemm(const cu_model *cm, const cu_sess *cs, const spx_gemm_args &g, int nsm, cudaStream_t st) {
    if (spx_gemm_q4_mtok_ok(g)) return spx_gemm_q4_mtok(g, nsm, st);
    if (cs->w16 && g.M >= spx_gemm_cublas_min_m()) return spx_gemm_q4_cublas(cm->cublas, g, cs->w16, cs->w16_elems, st);
    return spx_gemm_q4(g, nsm, st);
}

/* What every block of one forward pass shares. */
struct fwd {
    spx_session *s;
    const spx_model *m;
    const cu_model *cm;
    cu_sess *cs;
    const spx_config *c;
    cudaStream_t st;
    int n, nsm, n_splits;
    bool pdl;       /* the decode chain's kernels use PDL */
    bool fuse_rope; /* the decode attention kernel does rope_store's work */
    float eps;
    /* the pass (engine/blocks.h's driver): its output mode, the current
     * layer (its streamed copy in ls when it is streamed) and whether its
     * first kernel may use PDL (not after a ping-pong wait) */
    int lmode;
    int64_t l;
    int hb; /* half-blocks (a layer's mixer, then its MLP) done so far: fetch lag and lead count them */
    bool lead_brk; /* a lead fetch was forked off st after the last kernel: the next block's first kernel has no PDL */
    const cu_layer *L;
    cu_layer ls;
    bool streamed, pdl0;
    /* a batch step (cu_forward_batch): row r is session rs[r]'s token at
     * its position (its cu_sess's d_pos), with its own KV cache and
     * recurrent state; s and cs are rs[0]'s, whose scratch holds the rows.
     * NULL: every row is s's, at consecutive positions. */
    spx_session *const *rs;
};

static cu_sess *row_cs(const fwd &f, int r) { return (cu_sess *)f.rs[r]->be_state; }

/* a decode GEMV launch in the model's form (cm->gemv_groups) */
static spx_gemv_args dec(const fwd &f, spx_gemv_args g) {
    g.groups = f.cm->gemv_groups;
    return g;
}

/* A block's input projection y[n, w.rows] = rmsnorm(h, gain) W^T (+ bias):
 * one token through the GEMV (norm fused into its prologue), a prompt
 * through the GEMM on the fp16 normed rows. */
static spx_status in_proj(const fwd &f, int slot, const float *gain, const float *bias, float *y, bool pdl,
                          spx_err *e) {
    const int64_t H = f.c->hidden_size;
    const spx_dqmat &w = f.L->w[slot];
    if (f.n == 1) {
        const cu_rf_launch rl = {f.l, 1, {slot, 0, 0}, f.cs->h, gain, NULL, f.eps};
        bool on;
        int lead;
        SPX_TRY(cu_rf_lead_take(f.cs, f.hb, rl, &lead, e)); /* a fused gate/up launch may have one */
        SPX_TRY(cu_rf_fork(f.m, f.cm, f.cs, rl, f.st, &on, e, -1, lead));
        spx_gemv_args g = gemv_one(w, f.cs->h, y, bias, SPX_GEMV_STORE);
        g.gain = gain;
        g.eps = f.eps;
        SPX_CUDA_TRY(e, spx_gemv_q4(dec(f, g), f.nsm, f.st, pdl && !on));
        if (on) SPX_TRY(cu_rf_join(f.cs, rl, &y, &w.rows, 1.0f, f.st, e));
    } else {
        SPX_CUDA_TRY(e, spx_rmsnorm(f.cs->h, gain, f.eps, f.n, H, NULL, f.cs->x16, f.st));
        SPX_CUDA_TRY(e, run_gemm(f.cm, f.cs, gemm_one(f.cs, w, f.cs->x16, H, y, w.rows, bias, f.n, 0), f.nsm, f.st));
    }
    return SPX_OK;
}

/* A block's output projection added to the residual stream: h += r (x W^T
 * + bias), x [n, w.cols]; fused into the GEMV / GEMM epilogue when r == 1,
 * else stored and added by spx_cu_axpy. x2: the decode GEMV's input is x *
 * x2 (tiled gate/up stored apart). have16: a prompt's input is already in
 * cs->x16 as fp16 (the SwiGLU kernel wrote it there). */
static spx_status out_proj(const fwd &f, int slot, const float *bias, const float *x, const float *x2,
                           bool have16, spx_err *e) {
    const int64_t H = f.c->hidden_size;
    const float r = f.c->residual_mult;
    cu_sess *cs = f.cs;
    const spx_dqmat &w = f.L->w[slot];
    float *y = r == 1.0f ? cs->h : cs->x;
    if (f.n == 1) {
        const cu_rf_launch rl = {f.l, 1, {slot, 0, 0}, x, NULL, x2, f.eps};
        bool on;
        const int lag = cu_rf_lag_of(f.m), lslot = lag > 0 ? cu_rf_lag_slot(cs) : -1;
        SPX_TRY(cu_rf_fork(f.m, f.cm, cs, rl, f.st, &on, e, lslot));
        if (on && lslot >= 0) { /* fetch lag: added after the lag-th following half-block */
            spx_gemv_args g = gemv_one(w, x, y, bias, r == 1.0f ? SPX_GEMV_ADD : SPX_GEMV_STORE);
            g.x2 = x2;
            SPX_CUDA_TRY(e, spx_gemv_q4(dec(f, g), f.nsm, f.st, f.pdl));
            if (r != 1.0f) SPX_CUDA_TRY(e, spx_cu_axpy(cs->h, cs->x, H, r, f.st));
            cu_rf_lag_push(cs, lslot, f.hb + lag, r);
            return SPX_OK;
        }
        spx_gemv_args g = gemv_one(w, x, y, bias, r == 1.0f ? SPX_GEMV_ADD : SPX_GEMV_STORE);
        g.x2 = x2;
        SPX_CUDA_TRY(e, spx_gemv_q4(dec(f, g), f.nsm, f.st, f.pdl && !on));
        if (r != 1.0f) SPX_CUDA_TRY(e, spx_cu_axpy(cs->h, cs->x, H, r, f.st));
        if (on) SPX_TRY(cu_rf_join(cs, rl, &cs->h, &H, r, f.st, e)); /* h += r (W^ x + bias + delta) */
        return SPX_OK;
    } else {
        if (!have16) SPX_CUDA_TRY(e, spx_to_half(x, (int64_t)f.n * w.cols, cs->x16, f.st));
        SPX_CUDA_TRY(e, run_gemm(f.cm, cs, gemm_one(cs, w, cs->x16, w.cols, y, H, bias, f.n, r == 1.0f), f.nsm, f.st));
    }
    if (r != 1.0f) SPX_CUDA_TRY(e, spx_cu_axpy(cs->h, cs->x, (int64_t)f.n * H, r, f.st));
    return SPX_OK;
}

/* ---- blocks (the CPU's meaning: engine/forward.c) --------------------------- */

/* A batch step's attention: per row, RoPE and the KV store at its
 * session's position into its session's cache, then one-token attention
 * over that cache (q, k, v and att are the lead's rows). */
static spx_status attention_rows(const fwd &f, int64_t l, spx_err *e) {
    const spx_config *c = f.c;
    const cu_layer *L = f.L;
    cu_sess *cs = f.cs;
    const int64_t hd = c->head_dim, qd = c->n_heads * hd;
    const int nh = (int)c->n_heads, nkv = (int)c->n_kv_heads;
    const int64_t kvd = nkv * hd, kvi = f.m->layers[l].kv_index;
    for (int r = 0; r < f.n; r++) {
        const spx_session *sr = f.rs[r];
        cu_sess *cr = row_cs(f, r);
        __half *kc = cr->kc + (size_t)kvi * (size_t)sr->n_ctx * (size_t)kvd;
        __half *vc = cr->vc + (size_t)kvi * (size_t)sr->n_ctx * (size_t)kvd;
        spx_rope_args ra;
        memset(&ra, 0, sizeof ra);
        ra.q = cs->q + (size_t)r * (size_t)qd;
        ra.k = cs->k + (size_t)r * (size_t)kvd;
        ra.v = cs->v + (size_t)r * (size_t)kvd;
        ra.n_tok = 1;
        ra.nh = nh;
        ra.nkv = nkv;
        ra.hd = (int)hd;
        ra.inv_freq = f.cm->inv_freq;
        ra.q_norm = L->v[SPX_SL_Q_NORM];
        ra.k_norm = L->v[SPX_SL_K_NORM];
        ra.eps = f.eps;
        ra.pos = cr->d_pos;
        ra.kc = kc;
        ra.vc = vc;
        kv_q4_layer(sr, cr, kvi, &ra.kq, &ra.vq, &ra.rot);
        /* the decode kernel does rope_store's work where the one-token step's does */
        const bool fuse = (sr->kv.type != SPX_KV_Q4 || f.cm->kvq4_fuse) && spx_attention_decode_fast((int)hd);
        if (!fuse) SPX_CUDA_TRY(e, spx_rope_store(ra, f.st, false));
        spx_attn_args aa;
        memset(&aa, 0, sizeof aa);
        aa.q = ra.q;
        aa.kc = kc;
        aa.vc = vc;
        aa.out = cs->att + (size_t)r * (size_t)qd;
        aa.part = cr->part;
        aa.n_tok = 1;
        aa.nh = nh;
        aa.nkv = nkv;
        aa.hd = (int)hd;
        aa.window = (int)c->sliding_window;
        aa.scale = c->attn_scale;
        aa.n_splits = cu_splits_for(f.cm, c, 1, sr->pos + 1);
        aa.pos = cr->d_pos;
        kv_q4_layer(sr, cr, kvi, &aa.kq, &aa.vq, &aa.rot);
        aa.cnt = cr->attn_cnt;
        if (fuse) {
            aa.k_new = ra.k;
            aa.v_new = ra.v;
            aa.inv_freq = f.cm->inv_freq;
            aa.q_norm = L->v[SPX_SL_Q_NORM];
            aa.k_norm = L->v[SPX_SL_K_NORM];
            aa.eps = f.eps;
        }
        SPX_CUDA_TRY(e, spx_attention(aa, f.st, false));
    }
    return SPX_OK;
}

static spx_status blk_attention(const fwd &f, const cu_layer *L, int64_t l, bool pdl0, spx_err *e) {
    const spx_session *s = f.s;
    const spx_config *c = f.c;
    cu_sess *cs = f.cs;
    const int64_t H = c->hidden_size, hd = c->head_dim;
    const int nh = (int)c->n_heads, nkv = (int)c->n_kv_heads;
    const int64_t kvd = nkv * hd, kvi = f.m->layers[l].kv_index;
    __half *kc = cs->kc + (size_t)kvi * (size_t)s->n_ctx * (size_t)kvd;
    __half *vc = cs->vc + (size_t)kvi * (size_t)s->n_ctx * (size_t)kvd;
    if (f.n == 1) {
        const cu_rf_launch rl = cu_rf_input_launch(c, L, l, SPX_BLK_ATTENTION, cs->h, f.eps);
        bool on;
        int lead;
        SPX_TRY(cu_rf_lead_take(cs, f.hb, rl, &lead, e));
        SPX_TRY(cu_rf_fork(f.m, f.cm, cs, rl, f.st, &on, e, -1, lead));
        spx_gemv_args g = gemv_qkv(L, cs, f.eps);
        SPX_CUDA_TRY(e, spx_gemv_q4(dec(f, g), f.nsm, f.st, pdl0 && !on));
        float *y[3] = {cs->q, cs->k, cs->v};
        const int64_t rows[3] = {L->w[SPX_SL_Q].rows, L->w[SPX_SL_K].rows, L->w[SPX_SL_V].rows};
        if (on) SPX_TRY(cu_rf_join(cs, rl, y, rows, 1.0f, f.st, e));
    } else {
        SPX_CUDA_TRY(e, spx_rmsnorm(cs->h, L->v[SPX_SL_MIX_NORM], f.eps, f.n, H, NULL, cs->x16, f.st));
        const spx_dqmat *w[3] = {&L->w[SPX_SL_Q], &L->w[SPX_SL_K], &L->w[SPX_SL_V]};
        float *y[3] = {cs->q, cs->k, cs->v};
        const float *b[3] = {L->v[SPX_SL_BQ], L->v[SPX_SL_BK], L->v[SPX_SL_BV]};
        for (int i = 0; i < 3; i++)
            SPX_CUDA_TRY(e, run_gemm(f.cm, cs, gemm_one(cs, *w[i], cs->x16, H, y[i], w[i]->rows, b[i], f.n, 0), f.nsm, f.st));
    }
    if (f.rs) {
        SPX_TRY(attention_rows(f, l, e));
        return out_proj(f, SPX_SL_O, L->v[SPX_SL_BO], cs->att, NULL, false, e);
    }
    spx_rope_args ra;
    memset(&ra, 0, sizeof ra);
    ra.q = cs->q;
    ra.k = cs->k;
    ra.v = cs->v;
    ra.n_tok = f.n;
    ra.nh = nh;
    ra.nkv = nkv;
    ra.hd = (int)hd;
    ra.inv_freq = f.cm->inv_freq; /* all zero without RoPE: the identity rotation */
    ra.q_norm = L->v[SPX_SL_Q_NORM];
    ra.k_norm = L->v[SPX_SL_K_NORM];
    ra.eps = f.eps;
    ra.pos = cs->d_pos;
    ra.kc = kc;
    ra.vc = vc;
    kv_q4_layer(s, cs, kvi, &ra.kq, &ra.vq, &ra.rot);
    if (cs->kvl) { /* low-bit: rows to the sinks or the ring, then cu_kvlow.cu's attention */
        const spx_kvl_dev &d = cs->kvl->d;
        ra.kc = d.sink_k + (size_t)kvi * SPX_KVL_BLOCK * (size_t)kvd;
        ra.vc = d.sink_v + (size_t)kvi * SPX_KVL_BLOCK * (size_t)kvd;
        ra.kr = d.ring_k + (size_t)kvi * (size_t)d.ring * (size_t)kvd;
        ra.vr = d.ring_v + (size_t)kvi * (size_t)d.ring * (size_t)kvd;
        ra.ring = (int)d.ring;
        SPX_CUDA_TRY(e, spx_rope_store(ra, f.st, f.pdl));
        SPX_TRY(cu_kvl_attention(f.s, cs, kvi, f.n, f.st, e));
        return out_proj(f, SPX_SL_O, L->v[SPX_SL_BO], cs->att, NULL, false, e);
    }
    if (!f.fuse_rope) SPX_CUDA_TRY(e, spx_rope_store(ra, f.st, f.pdl));
    spx_attn_args aa;
    memset(&aa, 0, sizeof aa);
    aa.q = cs->q;
    aa.kc = kc;
    aa.vc = vc;
    aa.out = cs->att;
    aa.part = cs->part;
    aa.n_tok = f.n;
    aa.nh = nh;
    aa.nkv = nkv;
    aa.hd = (int)hd;
    aa.window = (int)c->sliding_window;
    aa.scale = c->attn_scale;
    aa.n_splits = f.n_splits;
    aa.pos = cs->d_pos;
    kv_q4_layer(s, cs, kvi, &aa.kq, &aa.vq, &aa.rot);
    aa.cnt = cs->attn_cnt;
    if (f.fuse_rope) { /* the decode kernel does rope_store's work */
        aa.k_new = cs->k;
        aa.v_new = cs->v;
        aa.inv_freq = f.cm->inv_freq;
        aa.q_norm = L->v[SPX_SL_Q_NORM];
        aa.k_norm = L->v[SPX_SL_K_NORM];
        aa.eps = f.eps;
    }
    SPX_CUDA_TRY(e, spx_attention(aa, f.st, f.pdl));
    return out_proj(f, SPX_SL_O, L->v[SPX_SL_BO], cs->att, NULL, false, e);
}

/* SwiGLU, separate gate and up: the decode path's fused launches (see
 * gemv_gate_up); a prompt through the GEMM and spx_silu_mul. */
static spx_status blk_swiglu(const fwd &f, const cu_layer *L, bool pdl1, spx_err *e) {
    const spx_config *c = f.c;
    cu_sess *cs = f.cs;
    const int64_t H = c->hidden_size, I = c->intermediate_size;
    if (c->gate_up_fused) { /* one [2I, H] matrix: gate rows then up rows */
        SPX_TRY(in_proj(f, SPX_SL_GATE_UP, L->v[SPX_SL_FFN_NORM], NULL, cs->gate, pdl1, e));
        SPX_CUDA_TRY(e, spx_cu_swiglu_fused(cs->gate, f.n, (int)I, cs->up, f.st));
        return out_proj(f, SPX_SL_DOWN, L->v[SPX_SL_B_DOWN], cs->up, NULL, false, e);
    }
    if (f.n == 1) {
        const cu_rf_launch rl = cu_rf_input_launch(c, L, f.l, SPX_BLK_SWIGLU, cs->h, f.eps);
        bool on;
        int lead;
        SPX_TRY(cu_rf_lead_take(cs, f.hb, rl, &lead, e));
        SPX_TRY(cu_rf_fork(f.m, f.cm, cs, rl, f.st, &on, e, -1, lead));
        const bool pair = f.cm->gemv_pair != 0 && !on;
        spx_gemv_args g = gemv_gate_up(L, cs, f.eps, pair);
        if (on) { /* raw gate and up: the join adds the refinement, then the SwiGLU */
            g.mode = SPX_GEMV_STORE;
            g.o[0].silu = 0;
            g.o[1].y = cs->up;
            g.pair = 0;
        }
        SPX_CUDA_TRY(e, spx_gemv_q4(dec(f, g), f.nsm, f.st, pdl1 && !on));
        if (on) SPX_TRY(cu_rf_join_swiglu(cs, cs->gate, cs->up, I, f.st, e));
        const bool apart = !on && L->w[SPX_SL_GATE].tiled && !pair;
        return out_proj(f, SPX_SL_DOWN, L->v[SPX_SL_B_DOWN], cs->gate, apart ? cs->up : NULL, false, e);
    }
    SPX_CUDA_TRY(e, spx_rmsnorm(cs->h, L->v[SPX_SL_FFN_NORM], f.eps, f.n, H, NULL, cs->x16, f.st));
    SPX_CUDA_TRY(e, run_gemm(f.cm, cs, gemm_one(cs, L->w[SPX_SL_GATE], cs->x16, H, cs->gate, I, L->v[SPX_SL_B_GATE], f.n, 0),
                             f.nsm, f.st));
    SPX_CUDA_TRY(e, run_gemm(f.cm, cs, gemm_one(cs, L->w[SPX_SL_UP], cs->x16, H, cs->up, I, L->v[SPX_SL_B_UP], f.n, 0),
                             f.nsm, f.st));
    SPX_CUDA_TRY(e, spx_silu_mul(cs->gate, cs->up, (int64_t)f.n * I, NULL, cs->x16, f.st)); /* the GEMM's fp16 input */
    return out_proj(f, SPX_SL_DOWN, L->v[SPX_SL_B_DOWN], cs->gate, NULL, true, e);
}

/* Nemotron-H's MLP: down(relu(up x)^2). */
static spx_status blk_relu2(const fwd &f, const cu_layer *L, bool pdl1, spx_err *e) {
    cu_sess *cs = f.cs;
    SPX_TRY(in_proj(f, SPX_SL_UP, L->v[SPX_SL_FFN_NORM], L->v[SPX_SL_B_UP], cs->gate, pdl1, e));
    SPX_CUDA_TRY(e, spx_cu_relu2(cs->gate, (int64_t)f.n * f.c->intermediate_size, f.st));
    return out_proj(f, SPX_SL_DOWN, L->v[SPX_SL_B_DOWN], cs->gate, NULL, false, e);
}

/* LFM2's short convolution: proj rows [B | C | u]; y = C * conv(B * u). */
static spx_status blk_shortconv(const fwd &f, const cu_layer *L, int64_t l, bool pdl0, spx_err *e) {
    const spx_config *c = f.c;
    cu_sess *cs = f.cs;
    const int H = (int)c->hidden_size;
    const int64_t R = 3 * (int64_t)H;
    float *state = cs->state + f.m->layers[l].state_off;
    SPX_TRY(in_proj(f, SPX_SL_CONV_IN, L->v[SPX_SL_MIX_NORM], L->v[SPX_SL_CONV_IN_B], cs->proj, pdl0, e));
    SPX_CUDA_TRY(e, spx_cu_shortconv_gates(cs->proj, f.n, H, f.st));
    for (int r = 0; r < (f.rs ? f.n : 1); r++) /* a batch: each row with its session's state */
        SPX_CUDA_TRY(e, spx_cu_conv_causal(cs->proj + (size_t)r * (size_t)R, R, f.rs ? 1 : f.n, H, L->v[SPX_SL_CONV_W],
                                           L->v[SPX_SL_CONV_B], (int)c->conv_kernel,
                                           f.rs ? row_cs(f, r)->state + f.m->layers[l].state_off : state, 0,
                                           cs->proj + (size_t)r * (size_t)R, R, f.st));
    SPX_CUDA_TRY(e, spx_cu_mul_rows(cs->proj + H, R, cs->proj, R, f.n, H, cs->att, H, f.st));
    return out_proj(f, SPX_SL_CONV_OUT, L->v[SPX_SL_CONV_OUT_B], cs->att, NULL, false, e);
}

/* Mamba-2: proj rows [z (di) | x B C (cd) | dt (heads)]; the layer's state
 * is its conv history [cd, K-1] then its SSM state [heads, P, N]. */
static spx_status blk_mamba2(const fwd &f, const cu_layer *L, int64_t l, bool pdl0, spx_err *e) {
    const spx_config *c = f.c;
    cu_sess *cs = f.cs;
    const int64_t di = spx_ssm_d_inner(c), cd = spx_ssm_conv_dim(c), R = spx_ssm_in_rows(c);
    const int64_t GN = c->ssm_groups * c->ssm_state;
    float *conv_state = cs->state + f.m->layers[l].state_off;
    float *ssm_state = conv_state + cd * (c->ssm_conv_kernel - 1);
    SPX_TRY(in_proj(f, SPX_SL_SSM_IN, L->v[SPX_SL_MIX_NORM], L->v[SPX_SL_SSM_IN_B], cs->proj, pdl0, e));
    float *xbc = cs->proj + di;
    spx_cu_ssd a;
    a.H = (int)c->ssm_heads, a.P = (int)c->ssm_head_dim, a.N = (int)c->ssm_state, a.G = (int)c->ssm_groups;
    a.A_log = L->v[SPX_SL_SSM_A_LOG], a.D = L->v[SPX_SL_SSM_D], a.dt_bias = L->v[SPX_SL_SSM_DT_BIAS];
    a.dt_lo = c->ssm_dt_lo, a.dt_hi = c->ssm_dt_hi;
    const float *dt = cs->proj + di + cd, *B = xbc + di, *C = B + GN;
    if (f.rs) { /* a batch: each row one step with its session's conv and SSM state */
        for (int r = 0; r < f.n; r++) {
            const size_t o = (size_t)r * (size_t)R;
            float *cst = row_cs(f, r)->state + f.m->layers[l].state_off, *sst = cst + cd * (c->ssm_conv_kernel - 1);
            SPX_CUDA_TRY(e, spx_cu_conv_causal(xbc + o, R, 1, (int)cd, L->v[SPX_SL_SSM_CONV_W], L->v[SPX_SL_SSM_CONV_B],
                                               (int)c->ssm_conv_kernel, cst, 1, xbc + o, R, f.st));
            SPX_CUDA_TRY(e, spx_cu_ssd_step(a, xbc + o, dt + o, B + o, C + o, sst, cs->att + (size_t)r * (size_t)di, f.st));
        }
    } else {
        SPX_CUDA_TRY(e, spx_cu_conv_causal(xbc, R, f.n, (int)cd, L->v[SPX_SL_SSM_CONV_W], L->v[SPX_SL_SSM_CONV_B],
                                           (int)c->ssm_conv_kernel, conv_state, 1, xbc, R, f.st));
        if (f.n == 1) SPX_CUDA_TRY(e, spx_cu_ssd_step(a, xbc, dt, B, C, ssm_state, cs->att, f.st));
        else {
            const size_t wf = cs->ssd_work ? spx_mem_ssd_work_floats(a.H, a.P, a.N, f.n) : 0;
            SPX_CUDA_TRY(e, spx_cu_ssd_scan(a, xbc, dt, B, C, R, f.n, ssm_state, cs->att, di, cs->ssd_work, wf, f.st));
        }
    }
    SPX_CUDA_TRY(e, spx_cu_rmsnorm_gated(cs->att, cs->att, di, cs->proj, R, L->v[SPX_SL_SSM_NORM], f.n, (int)di,
                                         (int)c->ssm_norm_group, f.eps, f.st));
    return out_proj(f, SPX_SL_SSM_OUT, L->v[SPX_SL_SSM_OUT_B], cs->att, NULL, false, e);
}

/* ---- the pass -------------------------------------------------------------- */

/* ---- the block interface (engine/blocks.h): the pass ---------------------- */

static spx_status lead_point(fwd &f, spx_err *e);

static spx_status p_embed(void *ctx, spx_err *e) {
    fwd &f = *(fwd *)ctx;
    SPX_TRY(cu_pp_begin(f.m, f.cm, f.cs, e));
    SPX_CUDA_TRY(e, spx_embed_q4(f.cm->embed, f.cs->d_ids, f.n, f.cs->h, f.st, f.pdl));
    if (f.c->embed_mult != 1.0f)
        SPX_CUDA_TRY(e, spx_cu_scale(f.cs->h, (int64_t)f.n * f.c->hidden_size, f.c->embed_mult, 0, f.st));
    return lead_point(f, e); /* point 0 */
}

static spx_status p_layer_begin(void *ctx, int64_t l, spx_err *e) {
    fwd &f = *(fwd *)ctx;
    f.L = &f.cm->layers[l];
    f.l = l;
    f.streamed = l >= f.cm->n_resident;
    if (f.streamed) {
        SPX_TRY(cu_pp_layer_begin(f.cm, f.cs, l, &f.ls, e));
        f.L = &f.ls;
    }
    f.pdl0 = f.pdl && !f.streamed; /* the layer's first kernel */
    return SPX_OK;
}

static spx_status p_layer_end(void *ctx, int64_t l, spx_err *e) {
    fwd &f = *(fwd *)ctx;
    if (f.streamed) SPX_TRY(cu_pp_layer_end(f.m, f.cm, f.cs, l, e));
    return SPX_OK;
}

/* The layer and kind of the pass's half-block t (its t-th block, from 0);
 * false: the pass has fewer. */
static bool block_at(const spx_config *c, int t, int64_t *l, spx_block_kind *k) {
    for (int64_t i = 0, n = 0; i < c->n_layers; i++)
        for (int j = 0; j < 2; j++) {
            const spx_block_kind b = j ? spx_block_ffn(c, i) : spx_block_mixer(c, i);
            if (b == SPX_BLK_NONE) continue;
            if (n++ == t) {
                *l = i, *k = b;
                return true;
            }
        }
    return false;
}

/* Fetch lead at half-block point f.hb (h as the next block reads it, the
 * lagged deltas due here added): the fetches of the launches lead
 * half-blocks ahead start (at point 0 those of points 1 .. lead: a launch
 * at point 0 has lead 0). Resident layers only (cu_refine.cu). */
static spx_status lead_point(fwd &f, spx_err *e) {
    const int d = f.n == 1 && f.cm->ref ? cu_rf_lead_of(f.m) : 0;
    if (d <= 0) return SPX_OK;
    for (int t = f.hb == 0 ? 1 : f.hb + d; t <= f.hb + d; t++) {
        int64_t l;
        spx_block_kind k;
        if (!block_at(f.c, t, &l, &k)) break;
        if (l >= f.cm->n_resident) continue;
        const cu_rf_launch rl = cu_rf_input_launch(f.c, &f.cm->layers[l], l, k, f.cs->h, f.eps);
        bool on = false;
        if (rl.n) SPX_TRY(cu_rf_lead_start(f.m, f.cm, f.cs, rl, t, f.st, &on, e));
        f.lead_brk |= on;
    }
    return SPX_OK;
}

/* After each block: the lagged refinements now due join the residual
 * stream, then the lead fetches of this point start. */
static spx_status half_block_done(fwd &f, spx_err *e) {
    f.hb++;
    if (f.n == 1) SPX_TRY(cu_rf_flush(f.cs, f.cs->h, f.c->hidden_size, f.hb, f.st, e));
    return lead_point(f, e);
}

/* a block's first kernel: PDL as the layer's first (pdl0) or as the
 * chain's, unless a lead fetch forked off st just before it */
static bool pdl_of(fwd &f, int first) {
    const bool p = (first ? f.pdl0 : f.pdl) && !f.lead_brk;
    f.lead_brk = false;
    return p;
}
static spx_status p_attention(void *ctx, int64_t l, int first, spx_err *e) {
    fwd &f = *(fwd *)ctx;
    SPX_TRY(blk_attention(f, f.L, l, pdl_of(f, first), e));
    return half_block_done(f, e);
}
static spx_status p_shortconv(void *ctx, int64_t l, int first, spx_err *e) {
    fwd &f = *(fwd *)ctx;
    SPX_TRY(blk_shortconv(f, f.L, l, pdl_of(f, first), e));
    return half_block_done(f, e);
}
static spx_status p_mamba2(void *ctx, int64_t l, int first, spx_err *e) {
    fwd &f = *(fwd *)ctx;
    SPX_TRY(blk_mamba2(f, f.L, l, pdl_of(f, first), e));
    return half_block_done(f, e);
}
static spx_status p_swiglu(void *ctx, int64_t l, int first, spx_err *e) {
    fwd &f = *(fwd *)ctx;
    SPX_TRY(blk_swiglu(f, f.L, pdl_of(f, first), e));
    return half_block_done(f, e);
}
static spx_status p_relu2(void *ctx, int64_t l, int first, spx_err *e) {
    fwd &f = *(fwd *)ctx;
    SPX_TRY(blk_relu2(f, f.L, pdl_of(f, first), e));
    return half_block_done(f, e);
}

static spx_status p_head(void *ctx, spx_err *e) {
    fwd &f = *(fwd *)ctx;
    spx_session *s = f.s;
    const cu_model *cm = f.cm;
    cu_sess *cs = f.cs;
    const spx_config *c = f.c;
    cudaStream_t st = f.st;
    const int64_t H = c->hidden_size, V = c->vocab_size;
    const int n = f.n, lmode = f.lmode;
    SPX_TRY(cu_pp_end(f.m, cm, cs, e));
    if (cs->kvl) SPX_TRY(cu_kvl_commit(cs, n, st, e)); /* every layer's completed blocks, before the position moves */
    if (f.n == 1) SPX_TRY(cu_rf_flush(cs, cs->h, H, -1, st, e)); /* every lagged refinement, before the final norm */
    if (f.n == 1) SPX_TRY(cu_rf_lead_end(cs, st, e));            /* (none left: every lead was taken) */
    if (lmode == LM_NONE) return SPX_OK;
    const int nsm = cm->n_sm;
    const float eps = f.eps;
    if (lmode == LM_ROWS && n > 1) { /* n <= SPX_BATCH_MAX rows: logits on the device, their argmax to d_ids */
        SPX_CUDA_TRY(e, spx_rmsnorm(cs->h, cm->final_norm, eps, n, H, NULL, cs->x16, st));
        SPX_CUDA_TRY(e, run_gemm(cm, cs, gemm_one(cs, cm->lm_head, cs->x16, H, cs->logits, V, NULL, n, 0), nsm, st));
        SPX_CUDA_TRY(e, spx_argmax_rows(cs->logits, n, V, cs->d_ids, st)); /* (a positive logits_div keeps it) */
        return SPX_OK;
    }
    if (lmode == LM_ALL && n > 1) { /* chunks of SPX_BATCH_MAX tokens, each copied to the host (never captured) */
        SPX_CUDA_TRY(e, spx_rmsnorm(cs->h, cm->final_norm, eps, n, H, NULL, cs->x16, st));
        for (int t0 = 0; t0 < n; t0 += SPX_BATCH_MAX) {
            const int k = n - t0 < SPX_BATCH_MAX ? n - t0 : SPX_BATCH_MAX;
            SPX_CUDA_TRY(e, run_gemm(cm, cs, gemm_one(cs, cm->lm_head, cs->x16 + (size_t)t0 * (size_t)H, H, cs->logits, V,
                                                 NULL, k, 0),
                                     nsm, st));
            if (c->logits_div != 1.0f) SPX_CUDA_TRY(e, spx_cu_scale(cs->logits, (int64_t)k * V, c->logits_div, 1, st));
            SPX_CUDA_TRY(e, cudaMemcpyAsync(s->logits + (size_t)t0 * (size_t)V, cs->logits, (size_t)k * (size_t)V * 4,
                                            cudaMemcpyDeviceToHost, st));
        }
        return SPX_OK;
    }
    /* the argmax of logits / logits_div is the argmax of the logits (a
     * positive divisor): the fused ARGMAX launch skips the division */
    spx_gemv_args g = gemv_one(cm->lm_head, cs->h + (size_t)(n - 1) * (size_t)H, cs->logits, NULL,
                               lmode == LM_ARGMAX ? SPX_GEMV_ARGMAX : SPX_GEMV_STORE); /* (LM_ROWS: one row) */
    g.gain = cm->final_norm;
    g.eps = eps;
    g.best = cs->d_best;
    SPX_CUDA_TRY(e, spx_gemv_q4(dec(f, g), nsm, st, f.pdl));
    if (lmode != LM_ARGMAX && c->logits_div != 1.0f) SPX_CUDA_TRY(e, spx_cu_scale(cs->logits, V, c->logits_div, 1, st));
    if (lmode == LM_ARGMAX) SPX_CUDA_TRY(e, spx_argmax_finish(cs->d_best, cs->d_ids, cs->d_pos, st, f.pdl, cs->ring_d));
    if (lmode == LM_SAMPLE)
        SPX_CUDA_TRY(e, spx_sample_topk(cs->logits, V, cs->d_samp, cs->d_ids, cs->d_pos, st, f.pdl, cs->ring_d));
    if (lmode == LM_ROWS) SPX_CUDA_TRY(e, spx_argmax_rows(cs->logits, 1, V, cs->d_ids, st));
    return SPX_OK;
}

static const spx_block_ops cuda_blocks = {
    "cuda",
    p_embed,
    p_layer_begin,
    p_layer_end,
    {NULL, p_attention, p_shortconv, p_mamba2, p_swiglu, p_relu2, NULL /* moe: not on the device yet */},
    p_head,
};
static_assert(SPX_BLK_ATTENTION == 1 && SPX_BLK_SHORTCONV == 2 && SPX_BLK_MAMBA2 == 3 && SPX_BLK_SWIGLU == 4 &&
                  SPX_BLK_RELU2 == 5 && SPX_BLK_MOE == 6 && SPX_BLK_KINDS == 7,
              "cuda_blocks lists the kinds in engine/blocks.h's order");

spx_status cu_forward_check(const spx_model *m, spx_err *e) { return spx_blocks_check(&m->cfg, &cuda_blocks, m->path, e); }

/* Enqueues one pass of n tokens on the session's stream (captured into the
 * decode graph for n == 1). */
spx_status cu_enqueue_forward(spx_session *s, int n, int lmode, int n_splits, spx_err *e, spx_session *const *rs) {
    const spx_model *m = s->m;
    const cu_model *cm = (const cu_model *)m->be_state;
    cu_sess *cs = (cu_sess *)s->be_state;
    const spx_config *c = &m->cfg;
    fwd f;
    f.s = s, f.m = m, f.cm = cm, f.cs = cs, f.c = c, f.st = cs->st;
    f.n = n, f.nsm = cm->n_sm, f.n_splits = n_splits;
    f.pdl = cm->pdl && n == 1; /* the decode chain only */
    /* the decode kernel does rope_store's work (the 4-bit cache too, unless SPECTRA_CUDA_KVQ4_FUSE=0) */
    f.fuse_rope = n == 1 && !cs->kvl && (s->kv.type != SPX_KV_Q4 || cm->kvq4_fuse) &&
                  spx_attention_decode_fast((int)c->head_dim);
    f.eps = c->rms_eps;
    f.lmode = lmode;
    f.L = NULL;
    f.hb = 0;
    f.lead_brk = false;
    f.streamed = f.pdl0 = false;
    f.rs = rs;
    for (int i = 0; i < CU_RF_LEAD_SLOTS; i++) cs->rf.lead[i].target = -1; /* none from a pass that failed midway */
    return spx_blocks_run(c, &cuda_blocks, &f, e);
}

/* Before a pass of n tokens at s->pos: the refinement and low-bit cache
 * state, the ids and the position to the device. */
static spx_status pass_begin(spx_session *s, const cu_model *cm, cu_sess *cs, const int32_t *ids, int64_t n, spx_err *e) {
    SPX_CUDA_TRY(e, cudaSetDevice(cm->dev));
    SPX_TRY(cu_rf_prepare(s, cs, e));
    if (cs->kvl) SPX_TRY(cu_kvl_before(s, cs, s->pos, (int)n, e));
    memcpy(cs->pin, ids, (size_t)n * 4);
    cs->pin[SPX_BATCH_MAX_CUDA] = (int32_t)s->pos;
    SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->d_ids, cs->pin, (size_t)n * 4, cudaMemcpyHostToDevice, cs->st));
    SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->d_pos, cs->pin + SPX_BATCH_MAX_CUDA, 4, cudaMemcpyHostToDevice, cs->st));
    cs->dev_known = 0;
    cs->pend = 0; /* a step queued ahead ran before this pass (stream order); its KV row is rewritten here */
    return SPX_OK;
}

spx_status cu_forward(spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e) {
    const cu_model *cm = (const cu_model *)s->m->be_state;
    cu_sess *cs = (cu_sess *)s->be_state;
    const spx_config *c = &s->m->cfg;
    if (n <= 0 || n > SPX_BATCH_MAX_CUDA) return spx_fail(e, SPX_ERR_ARG, "forward: batch of %lld tokens", (long long)n);
    SPX_TRY(pass_begin(s, cm, cs, ids, n, e));
    int lmode = want_logits == SPX_LOGITS_ALL ? LM_ALL : want_logits == SPX_LOGITS_LAST ? LM_LAST : LM_NONE;
    int splits = cu_splits_for(cm, c, (int)n, s->pos + n);
    SPX_TRY(cu_enqueue_forward(s, (int)n, lmode, splits, e));
    if (lmode == LM_LAST || (lmode == LM_ALL && n == 1)) /* LM_ALL with n > 1 copied its chunks already */
        SPX_CUDA_TRY(e, cudaMemcpyAsync(s->logits, cs->logits, (size_t)c->vocab_size * 4, cudaMemcpyDeviceToHost, cs->st));
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    cs->dev_pos = s->pos;
    cs->dev_tok = ids[0];
    cs->dev_known = 1;
    s->pos += n;
    return SPX_OK;
}

spx_status cu_forward_argmax(spx_session *s, const int32_t *ids, int64_t n, int32_t *best, spx_err *e) {
    const cu_model *cm = (const cu_model *)s->m->be_state;
    cu_sess *cs = (cu_sess *)s->be_state;
    const spx_config *c = &s->m->cfg;
    if (n <= 0 || n > SPX_BATCH_MAX) return spx_fail(e, SPX_ERR_ARG, "forward_argmax: %lld tokens", (long long)n);
    SPX_TRY(pass_begin(s, cm, cs, ids, n, e)); /* (d_ids ends holding the argmaxes) */
    SPX_TRY(cu_enqueue_forward(s, (int)n, LM_ROWS, cu_splits_for(cm, c, (int)n, s->pos + n), e));
    SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->pin, cs->d_ids, (size_t)n * 4, cudaMemcpyDeviceToHost, cs->st));
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    memcpy(best, cs->pin, (size_t)n * 4);
    s->pos += n;
    return SPX_OK;
}

spx_status cu_forward_batch(spx_session *const *ss, const int32_t *ids, int64_t n, int32_t *best, spx_err *e) {
    spx_session *s = ss[0];
    const cu_model *cm = (const cu_model *)s->m->be_state;
    cu_sess *cs = (cu_sess *)s->be_state;
    if (n < 2 || n > SPX_BATCH_MAX_CUDA) return spx_fail(e, SPX_ERR_ARG, "batch forward: %lld rows", (long long)n);
    for (int64_t r = 0; r < n; r++) /* what the per-row blocks do not run: batch.c steps these one by one */
        if (((cu_sess *)ss[r]->be_state)->kvl)
            return spx_fail(e, SPX_ERR_UNSUPPORTED, "batch forward: session %lld has a low-bit KV cache", (long long)r);
    SPX_CUDA_TRY(e, cudaSetDevice(cm->dev));
    for (int64_t r = 0; r < n; r++) {
        /* each session's own work (a step queued ahead, a state copy) is
         * done before the pass reads its caches on the lead's stream; its
         * position goes to its d_pos */
        cu_sess *cr = (cu_sess *)ss[r]->be_state;
        SPX_CUDA_TRY(e, cudaStreamSynchronize(cr->st));
        cr->pend = 0;
        cr->dev_known = 0;
        cr->pin[SPX_BATCH_MAX_CUDA] = (int32_t)ss[r]->pos;
        SPX_CUDA_TRY(e, cudaMemcpyAsync(cr->d_pos, cr->pin + SPX_BATCH_MAX_CUDA, 4, cudaMemcpyHostToDevice, cs->st));
    }
    memcpy(cs->pin, ids, (size_t)n * 4);
    SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->d_ids, cs->pin, (size_t)n * 4, cudaMemcpyHostToDevice, cs->st));
    SPX_TRY(cu_enqueue_forward(s, (int)n, best ? LM_ROWS : LM_ALL, 1, e, ss));
    if (best) SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->pin, cs->d_ids, (size_t)n * 4, cudaMemcpyDeviceToHost, cs->st));
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    if (best) memcpy(best, cs->pin, (size_t)n * 4);
    for (int64_t r = 0; r < n; r++) ss[r]->pos++;
    return SPX_OK;
}

/* One decode step (ending with the argmax, or with the sampler: lmode)
 * captured into *out. */
