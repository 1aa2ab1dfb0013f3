/* cu_session.cu: session_init / session_free of the CUDA backend: the
 * device KV cache, scratch for SPX_BATCH_MAX_CUDA tokens, the decode
 * attention's split counters, pinned step buffers and the ping-pong slots. */
#include "cuda/cu_backend.cuh"

static cudaError_t sess_alloc(cu_sess *cs, void **p, size_t bytes) {
    *p = NULL;
    if (cs->n_allocs >= (int)(sizeof cs->allocs / sizeof cs->allocs[0])) return cudaErrorInvalidValue;
    cudaError_t err = cudaMalloc(p, bytes ? bytes : 1);
    if (err == cudaSuccess) cs->allocs[cs->n_allocs++] = *p;
    return err;
}

static void pp_session_free(cu_sess *cs) {
    cu_pp *p = &cs->pp;
    if (p->cp) cudaStreamSynchronize(p->cp);
    cudaEvent_t *ev[] = {&p->fork, &p->join, &p->copied[0], &p->copied[1], &p->used[0], &p->used[1]};
    for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++)
        if (*ev[i]) cudaEventDestroy(*ev[i]), *ev[i] = NULL;
    if (p->cp) cudaStreamDestroy(p->cp);
    p->cp = NULL; /* the slots are in cs->allocs */
}

/* After the rest of session_init (the device is set). */
static spx_status pp_session_init(spx_session *s, cu_sess *cs, spx_err *e) {
    const cu_model *cm = (const cu_model *)s->m->be_state;
    int64_t ns = cu_pp_n_stream(s->m, cm);
    if (ns <= 0) return SPX_OK;
    cu_pp *p = &cs->pp;
    size_t bytes = cm->slot_bytes * (ns > 1 ? 2 : 1);
    cudaError_t ce = sess_alloc(cs, (void **)&p->slots, bytes);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        return spx_fail(e, SPX_ERR_NOMEM, "ping-pong offload: the two layer slots (%.1f MiB) do not fit on the device: %s",
                        mib(bytes), cudaGetErrorString(ce));
    }
    SPX_CUDA_TRY(e, cudaStreamCreateWithFlags(&p->cp, cudaStreamNonBlocking));
    cudaEvent_t *ev[] = {&p->fork, &p->join, &p->copied[0], &p->copied[1], &p->used[0], &p->used[1]};
    for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++)
        SPX_CUDA_TRY(e, cudaEventCreateWithFlags(ev[i], cudaEventDisableTiming));
    return SPX_OK;
}

void cu_session_free(spx_session *s) {
    cu_sess *cs = (cu_sess *)s->be_state;
    if (!cs) return;
    cu_model *cm = (cu_model *)s->m->be_state;
    cudaSetDevice(cm->dev);
    if (cs->st) cudaStreamSynchronize(cs->st);
    if (cs->have_graph) cudaGraphExecDestroy(cs->graph);
    if (cs->have_graph_s) cudaGraphExecDestroy(cs->graph_s);
    if (cs->pin_samp) cudaFreeHost(cs->pin_samp);
    if (cs->ring) cudaFreeHost(cs->ring);
    for (int i = 0; i < 2; i++)
        if (cs->step_ev[i]) cudaEventDestroy(cs->step_ev[i]);
    pp_session_free(cs);
    cu_rf_session_free(cs);
    cu_kvl_free(cs);
    for (int i = 0; i < cs->n_allocs; i++) cudaFree(cs->allocs[i]);
    if (cs->pin) cudaFreeHost(cs->pin);
    if (cs->st) cudaStreamDestroy(cs->st);
    free(cs);
    s->be_state = NULL;
}

/* Key splits of the attention (flash-decoding). A prompt: enough blocks
 * for two per SM. One token (the decode graph, sized for the session's
 * context): one split per 16 key tiles (4 per warp), at least one; on the
 * H200 fewer, longer splits beat one tile per block, the combine pass and
 * the blocks' fixed costs being what a short split pays for. The decode
 * kernels (spx_attention_decode_fast, either cache) instead take one pass
 * of SPX_ATTN_DECODE_KEYS keys per split up to 64 blocks in all, then more
 * passes per block: its last block merges the splits, and that grows with
 * their count (the sweeps: bench/results, 2026-11-30 and NOTES.md). This is the
 * launch's count for the session's context; at position p the kernels run
 * only the splits p needs (attention_internal.cuh ad_active_splits).
 * SPECTRA_CUDA_ATTN_SPLITS=N (benchmarks) sets the count. */
int cu_splits_for(const cu_model *cm, const spx_config *c, int n_tok, int64_t max_keys) {
    int bps = spx_attention_blocks_per_split(n_tok, (int)c->n_heads, (int)c->n_kv_heads);
    int64_t S = (2 * (int64_t)cm->n_sm + bps - 1) / bps;
    int64_t tiles = (max_keys + 31) / 32;
    if (S > tiles) S = tiles;
    if (n_tok == 1 && spx_attention_decode_fast((int)c->head_dim)) {
        S = (max_keys + SPX_ATTN_DECODE_KEYS - 1) / SPX_ATTN_DECODE_KEYS;
        if (S > 64 / bps) S = 64 / bps;
    } else if (n_tok == 1 && S > (tiles + 15) / 16) S = (tiles + 15) / 16;
    if (spx_tuning_get()->cuda_attn_splits > 0) S = spx_tuning_get()->cuda_attn_splits;
    if (S * n_tok > SPX_MEM_PART_TOK_SPLITS) S = SPX_MEM_PART_TOK_SPLITS / n_tok;
    return S < 1 ? 1 : (int)S;
}

static spx_status cu_session_init_inner(spx_session *s, cu_sess *cs, spx_err *e) {
    const spx_model *m = s->m;
    const cu_model *cm = (const cu_model *)m->be_state;
    const spx_config *c = &m->cfg;
    if (s->kv.type == SPX_KV_F32)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "the cuda backend keeps the KV cache in fp16 (--kv f16), 4-bit (--kv q4) or low-bit (--kv "
                        "k2v2/k3v2/k3v3/k4v4); --kv f32 runs on the CPU only (--backend cpu)");
    if (s->n_ctx >= ((int64_t)1 << 31)) return spx_fail(e, SPX_ERR_ARG, "context too large for the cuda backend");
    SPX_CUDA_TRY(e, cudaSetDevice(cm->dev));
    SPX_CUDA_TRY(e, cudaStreamCreateWithFlags(&cs->st, cudaStreamNonBlocking));
    /* every buffer's size from engine/memory.h, which the planner budgets with */
    spx_cuda_scratch z;
    spx_mem_cuda_scratch(c, m->state_floats, cm->cublas != NULL, &z);
    const size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim, L = (size_t)c->n_attn_layers, T = (size_t)s->n_ctx;
    /* q4: kvq4_math.h's planes, spx_kv_bytes_per_token's bytes (+ alignment) */
    size_t kv_bytes = s->kv.type == SPX_KV_Q4 ? L * spx_kvq4_layout_of((int64_t)T, (int64_t)kvd).layer_bytes
                                              : L * T * kvd * 2;
    if (s->kv.lowbit) { /* its own arrays (cu_kvlow.cu) */
        SPX_TRY(cu_kvl_init(s, cs, e));
        kv_bytes = 0;
    }
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->kc, kv_bytes));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->vc, kv_bytes));
    /* zeros, not garbage, under positions never written (spx_session_seek's depth) */
    SPX_CUDA_TRY(e, cudaMemsetAsync(cs->kc, 0, kv_bytes, cs->st));
    SPX_CUDA_TRY(e, cudaMemsetAsync(cs->vc, 0, kv_bytes, cs->st));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->h, z.h));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->x, z.x));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->q, z.q));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->k, z.k));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->v, z.v));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->att, z.att));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->gate, z.gate));
    if (z.proj) SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->proj, z.proj));
    if (z.state) { /* the state cache and its checkpoint (zero: position 0) */
        SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->state, z.state));
        SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->state_ckpt, z.state_ckpt));
        SPX_CUDA_TRY(e, cudaMemsetAsync(cs->state, 0, z.state, cs->st));
    }
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->up, z.up));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->logits, z.logits));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->part, z.part));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->x16, z.x16));
    cs->ws_floats = z.ws_floats;
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->ws, z.ws));
    if (z.w16_elems) {
        cs->w16_elems = z.w16_elems;
        SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->w16, z.w16));
    }
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->d_ids, z.ids));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->d_pos, z.pos));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->d_best, z.best));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->attn_cnt, z.attn_cnt));
    if (z.ssd) SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->ssd_work, z.ssd));
    SPX_CUDA_TRY(e, cudaMemsetAsync(cs->attn_cnt, 0, (size_t)c->n_heads * 4, cs->st));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->d_samp, sizeof(spx_sample_dev)));
    SPX_CUDA_TRY(e, cudaMallocHost((void **)&cs->pin_samp, sizeof(spx_sample_dev)));
    SPX_CUDA_TRY(e, cudaMallocHost((void **)&cs->pin, (SPX_BATCH_MAX_CUDA + 1) * 4));
    SPX_CUDA_TRY(e, cudaHostAlloc((void **)&cs->ring, 2 * SPX_TOKEN_RING * sizeof *cs->ring, cudaHostAllocMapped));
    memset(cs->ring, 0xff, 2 * SPX_TOKEN_RING * sizeof *cs->ring);
    SPX_CUDA_TRY(e, cudaHostGetDevicePointer((void **)&cs->ring_d, cs->ring, 0));
    for (int i = 0; i < 2; i++) SPX_CUDA_TRY(e, cudaEventCreateWithFlags(&cs->step_ev[i], cudaEventDisableTiming));
    {
        /* SPECTRA_CUDA_AHEAD=0: never. A step queued ahead and then not taken
         * has advanced the recurrent state, which (unlike a KV row) nothing
         * rewrites: never with one either */
        cs->ahead_ok = spx_tuning_get()->cuda_ahead && m->state_floats == 0;
    }
    SPX_CUDA_TRY(e, cudaMemsetAsync(cs->d_best, 0, 8, cs->st));
    SPX_CUDA_TRY(e, cudaMemsetAsync(cs->d_ids, 0, z.ids, cs->st));
    SPX_CUDA_TRY(e, cudaMemsetAsync(cs->d_pos, 0, 4, cs->st));
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    cs->dec_splits = cu_splits_for(cm, c, 1, s->n_ctx);
    return SPX_OK;
}

spx_status cu_session_init(spx_session *s, spx_err *e) {
    cu_sess *cs = (cu_sess *)calloc(1, sizeof *cs);
    if (!cs) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    s->be_state = cs;
    spx_status st = cu_session_init_inner(s, cs, e);
    if (st == SPX_OK) st = pp_session_init(s, cs, e);
    if (st != SPX_OK) cu_session_free(s);
    return st;
}

/* The state cache lives on the device: the ops run in stream order after
 * every pass enqueued before them (no step is queued ahead for a model
 * with recurrent layers: cs->ahead_ok). */
spx_status cu_state_op(spx_session *s, int op, spx_err *e) {
    cu_sess *cs = (cu_sess *)s->be_state;
    const cu_model *cm = (const cu_model *)s->m->be_state;
    const size_t b = (size_t)s->m->state_floats * 4;
    if (!cs->state) return SPX_OK;
    SPX_CUDA_TRY(e, cudaSetDevice(cm->dev));
    if (op == SPX_STATE_RESET) SPX_CUDA_TRY(e, cudaMemsetAsync(cs->state, 0, b, cs->st));
    else if (op == SPX_STATE_CHECKPOINT)
        SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->state_ckpt, cs->state, b, cudaMemcpyDeviceToDevice, cs->st));
    else SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->state, cs->state_ckpt, b, cudaMemcpyDeviceToDevice, cs->st));
    return SPX_OK;
}
