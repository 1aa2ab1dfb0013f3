/* cu_forward.cu: the CUDA forward pass: the same math as the CPU reference
 * (engine/forward.c), one token through the fused GEMV path, n >= 2
 * through the tensor-core GEMM (see cu_backend.cuh). */
#include "cuda/cu_backend.cuh"

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
static spx_gemv_args gemv_down(const cu_layer *L, cu_sess *cs, bool pair) {
    spx_gemv_args g = gemv_one(L->w[SPX_SL_DOWN], cs->gate, cs->h, L->v[SPX_SL_B_DOWN], SPX_GEMV_ADD);
    g.x2 = L->w[SPX_SL_GATE].tiled && !pair ? cs->up : NULL;
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

/* The prefill GEMM: through cuBLAS (dequantized fp16 scratch) for M >=
 * spx_gemm_cublas_min_m() tokens when it was loaded, else gemm_q4.cu's
 * tensor-core kernel (see gemm_cublas.cuh). */
static cudaError_t run_gemm(const cu_model *cm, const cu_sess *cs, const spx_gemm_args &g, int nsm, cudaStream_t st) {
    if (cs->w16 && g.M >= spx_gemm_cublas_min_m()) return spx_gemm_q4_cublas(cm->cublas, g, cs->w16, cs->w16_elems, st);
    return spx_gemm_q4(g, nsm, st);
}

spx_status cu_enqueue_forward(spx_session *s, int n, int lmode, int n_splits, spx_err *e) {
    const spx_model *m = s->m;
    const cu_model *cm = (const cu_model *)m->be_state;
    cu_sess *cs = (cu_sess *)s->be_state;
    const spx_config *c = &m->cfg;
    cudaStream_t st = cs->st;
    const int64_t H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    const int nh = (int)c->n_heads, nkv = (int)c->n_kv_heads;
    const int64_t qd = nh * hd, kvd = nkv * hd, V = c->vocab_size;
    const float eps = c->rms_eps;
    const int nsm = cm->n_sm;
    const bool pdl = cm->pdl && n == 1; /* the decode chain only */
    /* the decode kernel does rope_store's work (the 4-bit cache too, unless SPECTRA_CUDA_KVQ4_FUSE=0) */
    const bool fuse_rope = n == 1 && (s->kv.type != SPX_KV_Q4 || cm->kvq4_fuse) && spx_attention_decode_fast((int)hd);

    /* a decode GEMV launch in the model's form (cm->gemv_groups) */
    auto dec = [cm](spx_gemv_args g) {
        g.groups = cm->gemv_groups;
        return g;
    };
    SPX_TRY(cu_pp_begin(m, cm, cs, e));
    SPX_CUDA_TRY(e, spx_embed_q4(cm->embed, cs->d_ids, n, cs->h, st, pdl));
    for (int64_t l = 0; l < c->n_layers; l++) {
        const cu_layer *L = &cm->layers[l];
        cu_layer Ls;
        const bool streamed = l >= cm->n_resident;
        if (streamed) {
            SPX_TRY(cu_pp_layer_begin(cm, cs, l, &Ls, e));
            L = &Ls;
        }
        const bool pdl0 = pdl && !streamed; /* the layer's first kernel */
        __half *kc = cs->kc + (size_t)l * (size_t)s->n_ctx * (size_t)kvd;
        __half *vc = cs->vc + (size_t)l * (size_t)s->n_ctx * (size_t)kvd;
        /* attention block */
        if (n == 1) {
            SPX_CUDA_TRY(e, spx_gemv_q4(dec(gemv_qkv(L, cs, eps)), nsm, st, pdl0));
        } else {
            SPX_CUDA_TRY(e, spx_rmsnorm(cs->h, L->v[SPX_SL_MIX_NORM], eps, n, H, NULL, cs->x16, st));
            SPX_CUDA_TRY(e, run_gemm(cm, cs, gemm_one(cs, L->w[SPX_SL_Q], cs->x16, H, cs->q, qd, L->v[SPX_SL_BQ], n, 0), nsm, st));
            SPX_CUDA_TRY(e, run_gemm(cm, cs, gemm_one(cs, L->w[SPX_SL_K], cs->x16, H, cs->k, kvd, L->v[SPX_SL_BK], n, 0), nsm, st));
            SPX_CUDA_TRY(e, run_gemm(cm, cs, gemm_one(cs, L->w[SPX_SL_V], cs->x16, H, cs->v, kvd, L->v[SPX_SL_BV], n, 0), nsm, st));
        }
        spx_rope_args ra;
        memset(&ra, 0, sizeof ra);
        ra.q = cs->q;
        ra.k = cs->k;
        ra.v = cs->v;
        ra.n_tok = n;
        ra.nh = nh;
        ra.nkv = nkv;
        ra.hd = (int)hd;
        ra.inv_freq = cm->inv_freq;
        ra.q_norm = L->v[SPX_SL_Q_NORM];
        ra.k_norm = L->v[SPX_SL_K_NORM];
        ra.eps = eps;
        ra.pos = cs->d_pos;
        ra.kc = kc;
        ra.vc = vc;
        kv_q4_layer(s, cs, l, &ra.kq, &ra.vq, &ra.rot);
        if (!fuse_rope) SPX_CUDA_TRY(e, spx_rope_store(ra, st, pdl));
        spx_attn_args aa;
        memset(&aa, 0, sizeof aa);
        aa.q = cs->q;
        aa.kc = kc;
        aa.vc = vc;
        aa.out = cs->att;
        aa.part = cs->part;
        aa.n_tok = n;
        aa.nh = nh;
        aa.nkv = nkv;
        aa.hd = (int)hd;
        aa.window = (int)c->sliding_window;
        aa.n_splits = n_splits;
        aa.pos = cs->d_pos;
        kv_q4_layer(s, cs, l, &aa.kq, &aa.vq, &aa.rot);
        aa.cnt = cs->attn_cnt;
        if (fuse_rope) { /* the decode kernel does rope_store's work */
            aa.k_new = cs->k;
            aa.v_new = cs->v;
            aa.inv_freq = cm->inv_freq;
            aa.q_norm = L->v[SPX_SL_Q_NORM];
            aa.k_norm = L->v[SPX_SL_K_NORM];
            aa.eps = eps;
        }
        SPX_CUDA_TRY(e, spx_attention(aa, st, pdl));
        if (n == 1) {
            SPX_CUDA_TRY(e, spx_gemv_q4(dec(gemv_one(L->w[SPX_SL_O], cs->att, cs->h, L->v[SPX_SL_BO], SPX_GEMV_ADD)), nsm, st, pdl));
        } else {
            SPX_CUDA_TRY(e, spx_to_half(cs->att, (int64_t)n * qd, cs->x16, st));
            SPX_CUDA_TRY(e, run_gemm(cm, cs, gemm_one(cs, L->w[SPX_SL_O], cs->x16, qd, cs->h, H, L->v[SPX_SL_BO], n, 1), nsm, st));
        }
        /* MLP block */
        if (n == 1) {
            const bool pair = cm->gemv_pair != 0;
            SPX_CUDA_TRY(e, spx_gemv_q4(dec(gemv_gate_up(L, cs, eps, pair)), nsm, st, pdl));
            SPX_CUDA_TRY(e, spx_gemv_q4(dec(gemv_down(L, cs, pair)), nsm, st, pdl));
        } else {
            SPX_CUDA_TRY(e, spx_rmsnorm(cs->h, L->v[SPX_SL_FFN_NORM], eps, n, H, NULL, cs->x16, st));
            SPX_CUDA_TRY(e, run_gemm(cm, cs, gemm_one(cs, L->w[SPX_SL_GATE], cs->x16, H, cs->gate, I, L->v[SPX_SL_B_GATE], n, 0), nsm, st));
            SPX_CUDA_TRY(e, run_gemm(cm, cs, gemm_one(cs, L->w[SPX_SL_UP], cs->x16, H, cs->up, I, L->v[SPX_SL_B_UP], n, 0), nsm, st));
            SPX_CUDA_TRY(e, spx_silu_mul(cs->gate, cs->up, (int64_t)n * I, NULL, cs->x16, st));
            SPX_CUDA_TRY(e, run_gemm(cm, cs, gemm_one(cs, L->w[SPX_SL_DOWN], cs->x16, I, cs->h, H, L->v[SPX_SL_B_DOWN], n, 1), nsm, st));
        }
        if (streamed) SPX_TRY(cu_pp_layer_end(m, cm, cs, l, e));
    }
    SPX_TRY(cu_pp_end(m, cm, cs, e));
    if (lmode == LM_NONE) return SPX_OK;
    if (lmode == LM_ALL && n > 1) { /* chunks of SPX_BATCH_MAX tokens, each copied to the host (never captured) */
        SPX_CUDA_TRY(e, spx_rmsnorm(cs->h, cm->final_norm, eps, n, H, NULL, cs->x16, st));
        for (int t0 = 0; t0 < n; t0 += SPX_BATCH_MAX) {
            const int k = n - t0 < SPX_BATCH_MAX ? n - t0 : SPX_BATCH_MAX;
            SPX_CUDA_TRY(e, run_gemm(cm, cs, gemm_one(cs, cm->lm_head, cs->x16 + (size_t)t0 * (size_t)H, H, cs->logits, V,
                                                 NULL, k, 0),
                                     nsm, st));
            SPX_CUDA_TRY(e, cudaMemcpyAsync(s->logits + (size_t)t0 * (size_t)V, cs->logits, (size_t)k * (size_t)V * 4,
                                            cudaMemcpyDeviceToHost, st));
        }
        return SPX_OK;
    }
    spx_gemv_args g = gemv_one(cm->lm_head, cs->h + (size_t)(n - 1) * (size_t)H, cs->logits, NULL,
                               lmode == LM_ARGMAX ? SPX_GEMV_ARGMAX : SPX_GEMV_STORE);
    g.gain = cm->final_norm;
    g.eps = eps;
    g.best = cs->d_best;
    SPX_CUDA_TRY(e, spx_gemv_q4(dec(g), nsm, st, pdl));
    if (lmode == LM_ARGMAX) SPX_CUDA_TRY(e, spx_argmax_finish(cs->d_best, cs->d_ids, cs->d_pos, st, pdl, cs->ring_d));
    if (lmode == LM_SAMPLE)
        SPX_CUDA_TRY(e, spx_sample_topk(cs->logits, V, cs->d_samp, cs->d_ids, cs->d_pos, st, pdl, cs->ring_d));
    return SPX_OK;
}

spx_status cu_forward(spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e) {
    const cu_model *cm = (const cu_model *)s->m->be_state;
    cu_sess *cs = (cu_sess *)s->be_state;
    const spx_config *c = &s->m->cfg;
    if (n <= 0 || n > SPX_BATCH_MAX_CUDA) return spx_fail(e, SPX_ERR_ARG, "forward: batch of %lld tokens", (long long)n);
    SPX_CUDA_TRY(e, cudaSetDevice(cm->dev));
    memcpy(cs->pin, ids, (size_t)n * 4);
    cs->pin[SPX_BATCH_MAX_CUDA] = (int32_t)s->pos;
    SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->d_ids, cs->pin, (size_t)n * 4, cudaMemcpyHostToDevice, cs->st));
    SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->d_pos, cs->pin + SPX_BATCH_MAX_CUDA, 4, cudaMemcpyHostToDevice, cs->st));
    cs->dev_known = 0;
    cs->pend = 0; /* a step queued ahead ran before this pass (stream order); its KV row is rewritten here */
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

/* One decode step (ending with the argmax, or with the sampler: lmode)
 * captured into *out. */
