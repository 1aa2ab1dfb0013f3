/* cu_refine.cu: weight refinement on the CUDA backend (issue 20,
 * "Delivery / Dedicated GPU"; paper Appendix G): the model's residual
 * columns in pinned, mapped host memory (the backing tier), read zero-copy
 * by the refinement kernels (refine.cuh) that run beside each decode
 * launch's base GEMV on a second stream.
 *
 * Per decode launch (one token; prompts run the base, as on the CPU) whose
 * set has a budget k > 0:
 *   st:  [fork] ------ base GEMV (raw outputs) ------ [wait join] add
 *   rs:  [wait fork] select(x) -> apply (delta) -- [join]
 * The side stream starts when the launch's input exists, so selection and
 * the host reads overlap the GEMV; the add (y += delta, or for a gate/up
 * launch the SwiGLU of the refined raw outputs) runs once both are done.
 * In a captured decode graph the fork and join are graph edges. The
 * selection uses the launch's first matrix's outlier channels as the CPU
 * does (cpu/ops.c refine_prepare): skipped under a whole chunk.
 *
 * Fetch lag (paper section 3.4, Appendix G; spx_refine_rt.cuda_lag, in
 * half-blocks): an output projection's refinement (o, down, a recurrent
 * block's out_proj) is not joined after its GEMV but added to the
 * residual stream d half-blocks later (after the d-th following block),
 * so its selection and host reads overlap the blocks in between; the
 * blocks in between read h without it (the paper's approximation). Every
 * lagged delta still pending is added before the final norm.
 *
 * Fetch lead (paper section 3.4, Appendix G; spx_refine_rt.cuda_lead, in
 * half-blocks d): an attention q/k/v or MLP gate/up launch (input
 * rmsnorm(h) at half-block point t) selects its channels at point
 * max(t - d, 0) from h as it is there, under its own norm, and fetches
 * their columns into device staging while the blocks in between run; at
 * point 0 the launches of points 1 .. d start (a launch at point 0 has
 * lead 0). Per pending lead j (a slot, at most d + 1 in flight):
 *   st:      copy h -> snap[j], [start j] ------ ... ------ [fork] GEMV [wait join] add
 *   rs_lead: [wait start j] select(rmsnorm(snap[j]) * gain) -> fetch [fetched j]
 *   rs:                        [wait fork][wait fetched j] select_x(x) -> apply(staging) [join]
 * The snapshot keeps the selection off h, which st keeps updating in
 * place; select_x takes the launch's real input at the chosen channels
 * and the apply reads the staged columns from device memory (refine.cuh's
 * staging layout), so the delta is today's with another channel set (the
 * same one at k >= a chunk: every channel). A slot is taken by its launch
 * and reused at a later point: st joined its apply in between, and the
 * next fetch into it starts after st's start event, so no event crosses a
 * pass (the captured graph has only edges of its own). The o and down
 * launches (inputs not from the residual stream) and the recurrent
 * blocks' launches keep the path above; lag and lead combine (the
 * snapshot at point p is taken after the lagged deltas due at p joined h).
 * Streamed (ping-pong) layers have no lead: their norm gains are in a
 * slot that may not hold the layer yet at the earlier point.
 *
 * Budgets and the thread-block count are read when a pass is enqueued;
 * the session compares the model's refinement epoch (model.h) before each
 * step and drops its captured graphs when they changed (cu_rf_prepare).
 *
 * Not here (the CPU's alone): the disk tier (--refine-cache), the exact
 * float32 residual of the tests, the neuron-wise MLP mode; each is
 * refused at attach with a message. */
#include "cuda/cu_backend.cuh"
#include "cuda/refine.cuh"

extern "C" {
#include "refine/attach.h"
}

#define DEFAULT_BLOCKS 16

void cu_refine_free(cu_model *cm) {
    cu_refine *r = cm ? cm->ref : NULL;
    if (!r) return;
    if (r->host) cudaFreeHost(r->host);
    if (r->dev) cudaFree(r->dev);
    free(r->mats);
    free(r);
    cm->ref = NULL;
}

extern "C" void cu_refine_detach(spx_model *m) {
    cu_model *cm = (cu_model *)m->be_state;
    if (!cm) return;
    cudaSetDevice(cm->dev);
    cudaDeviceSynchronize(); /* no pass may still read the columns */
    cu_refine_free(cm);
}

static spx_status attach_fail(cu_model *cm, spx_err *e) {
    cu_refine_free(cm);
    return e->code;
}

extern "C" spx_status cu_refine_attach(spx_model *m, spx_err *e) {
    cu_model *cm = (cu_model *)m->be_state;
    cu_refine_free(cm);
    SPX_CUDA_TRY(e, cudaSetDevice(cm->dev));
    if (m->refine && m->refine->rt.mlp == SPX_REFINE_MLP_NEURON)
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: neuron-wise MLP refinement (--refine-mlp neuron) runs on the cpu "
                                                "backend; the cuda backend refines channel-wise", m->path);
    const int64_t nl = m->cfg.n_layers;
    cu_refine *r = (cu_refine *)calloc(1, sizeof *r);
    if (r) r->mats = (cu_rmat *)calloc((size_t)(nl * SPX_SL_COUNT), sizeof *r->mats);
    if (!r || !r->mats) {
        free(r);
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    }
    cm->ref = r;
    size_t host = 0, dev = 0;
    for (int64_t l = 0; l < nl; l++)
        for (int s = 0; s < SPX_SL_COUNT; s++) {
            const spx_wmat *w = &m->layers[l].w[s];
            const spx_wmat_refine *ref = w->ref;
            if (!ref) continue;
            if (ref->f32 || !ref->q4.codes) {
                spx_fail(e, SPX_ERR_UNSUPPORTED,
                         "%s: the cuda backend keeps the refinement in pinned host memory; %s (drop --refine-cache, or "
                         "use --backend cpu)", m->path, ref->f32 ? "the exact float32 residual is the CPU's" :
                                                               "reading it from disk through a cache is the CPU's tier");
                return attach_fail(cm, e);
            }
            if (ref->q4.cols > SPX_RF_MAX_COLS || ref->q4.col_stride % 4 || ref->q4.col_stride < 4 * ((ref->q4.rows + 7) / 8)) {
                spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: layer %lld %s: a residual of %lld columns, stride %lld: outside the "
                         "cuda kernels' limits", m->path, (long long)l, spx_slots[s].key, (long long)ref->q4.cols,
                         (long long)ref->q4.col_stride);
                return attach_fail(cm, e);
            }
            host += (size_t)(ref->q4.cols * ref->q4.col_stride);
            dev = (dev + (size_t)ref->q4.rows * 4 + 255) & ~(size_t)255;
        }
    /* the skip flags of every matrix with outliers (a launch's first matrix
     * chooses them, with or without a residual of its own); each array
     * 256-byte aligned, as the upload below places them */
    for (int64_t l = 0; l < nl; l++)
        for (int s = 0; s < SPX_SL_COUNT; s++) {
            const spx_wmat *w = &m->layers[l].w[s];
            if (spx_slots[s].mat && w->kind == SPX_WM_QUANT && w->q.n_outliers > 0 && w->cols <= SPX_RF_MAX_COLS)
                dev = ((dev + (size_t)w->cols) + 255) & ~(size_t)255;
        }
    cudaError_t ce = cudaHostAlloc((void **)&r->host, host ? host : 1, cudaHostAllocMapped | cudaHostAllocPortable);
    if (ce == cudaSuccess) ce = cudaHostGetDevicePointer((void **)&r->host_d, r->host, 0);
    if (ce == cudaSuccess) ce = cudaMalloc(&r->dev, dev ? dev : 1);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        r->host = r->host_d = NULL;
        spx_fail(e, SPX_ERR_NOMEM, "%s: refinement: %.1f MiB of pinned host memory and %.1f MiB on the device: %s",
                 m->path, mib(host), mib(dev), cudaGetErrorString(ce));
        return attach_fail(cm, e);
    }
    r->host_bytes = host;
    size_t ho = 0, doff = 0;
    uint8_t *flags = (uint8_t *)malloc(m->cfg.hidden_size > 0 ? (size_t)SPX_RF_MAX_COLS : 1);
    if (!flags) {
        spx_fail(e, SPX_ERR_NOMEM, "out of memory");
        return attach_fail(cm, e);
    }
    spx_status st = SPX_OK;
    for (int64_t l = 0; l < nl && st == SPX_OK; l++)
        for (int s = 0; s < SPX_SL_COUNT && st == SPX_OK; s++) {
            const spx_wmat *w = &m->layers[l].w[s];
            cu_rmat *cr = &r->mats[l * SPX_SL_COUNT + s];
            if (spx_slots[s].mat && w->kind == SPX_WM_QUANT && w->q.n_outliers > 0 && w->cols <= SPX_RF_MAX_COLS) {
                spx_refine_skip_outliers(&w->q, flags);
                uint8_t *d = (uint8_t *)r->dev + doff;
                ce = cudaMemcpy(d, flags, (size_t)w->cols, cudaMemcpyHostToDevice);
                cr->skip = d;
                doff = (doff + (size_t)w->cols + 255) & ~(size_t)255;
            }
            const spx_wmat_refine *ref = w->ref;
            if (ref && ce == cudaSuccess) {
                const size_t nb = (size_t)(ref->q4.cols * ref->q4.col_stride);
                memcpy(r->host + ho, ref->q4.codes, nb);
                cr->codes = r->host_d + ho;
                ho += nb;
                float *sc = (float *)((uint8_t *)r->dev + doff);
                ce = cudaMemcpy(sc, ref->q4.scales, (size_t)ref->q4.rows * 4, cudaMemcpyHostToDevice);
                cr->scales = sc;
                doff = (doff + (size_t)ref->q4.rows * 4 + 255) & ~(size_t)255;
                cr->rows = ref->q4.rows;
                cr->cols = ref->q4.cols;
                cr->col_stride = ref->q4.col_stride;
                cr->set = ref->set;
                if (ref->q4.cols > r->max_cols) r->max_cols = ref->q4.cols;
            }
            if (ce != cudaSuccess) {
                cudaGetLastError(); /* not left for the next launch's check */
                st = spx_fail(e, SPX_ERR_INTERNAL, "%s: refinement upload: %s", m->path, cudaGetErrorString(ce));
            }
        }
    free(flags);
    if (st != SPX_OK) return attach_fail(cm, e);
    return SPX_OK;
}

/* ---- sessions ---------------------------------------------------------------- */

void cu_rf_session_free(cu_sess *cs) {
    cu_rf_sess *f = &cs->rf;
    if (f->rs) cudaStreamSynchronize(f->rs);
    if (f->fork) cudaEventDestroy(f->fork);
    if (f->join) cudaEventDestroy(f->join);
    for (int i = 0; i < CU_RF_LAG_SLOTS; i++)
        if (f->lag_ev[i]) cudaEventDestroy(f->lag_ev[i]);
    if (f->rs) cudaStreamDestroy(f->rs);
    if (f->rs_lag) cudaStreamSynchronize(f->rs_lag), cudaStreamDestroy(f->rs_lag);
    if (f->rs_lead) cudaStreamSynchronize(f->rs_lead), cudaStreamDestroy(f->rs_lead);
    for (int i = 0; i < CU_RF_LEAD_SLOTS; i++) {
        if (f->lead[i].start) cudaEventDestroy(f->lead[i].start);
        if (f->lead[i].fetched) cudaEventDestroy(f->lead[i].fetched);
    }
    if (f->lead_buf) cudaFree(f->lead_buf);
    if (f->buf) cudaFree(f->buf);
    memset(f, 0, sizeof *f);
}

/* The widest output of a decode launch (rows over its matrices). */
static int64_t launch_rows_max(const spx_model *m) {
    const spx_config *c = &m->cfg;
    int64_t mx = 0;
    for (int64_t l = 0; l < c->n_layers; l++) {
        int64_t qkv = 0, gu = 0;
        for (int s = 0; s < SPX_SL_COUNT; s++) {
            const spx_wmat *w = &m->layers[l].w[s];
            if (!spx_slots[s].mat || !w->rows) continue;
            if (s == SPX_SL_Q || s == SPX_SL_K || s == SPX_SL_V) qkv += w->rows;
            else if (s == SPX_SL_GATE || s == SPX_SL_UP) gu += w->rows;
            else if (w->rows > mx) mx = w->rows;
        }
        mx = qkv > mx ? qkv : mx;
        mx = gu > mx ? gu : mx;
    }
    return mx;
}

static spx_status rf_session_alloc(const spx_model *m, cu_rf_sess *f, spx_err *e);
static spx_status lead_prepare(const spx_model *m, const cu_model *cm, cu_rf_sess *f, spx_err *e);

spx_status cu_rf_prepare(spx_session *s, cu_sess *cs, spx_err *e) {
    const spx_model *m = s->m;
    const cu_model *cm = (const cu_model *)m->be_state;
    cu_rf_sess *f = &cs->rf;
    if (f->epoch == m->refine_epoch) return SPX_OK;
    /* the captured graphs hold the old budgets (or none): capture again */
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    if (cs->have_graph) cudaGraphExecDestroy(cs->graph), cs->have_graph = 0;
    if (cs->have_graph_s) cudaGraphExecDestroy(cs->graph_s), cs->have_graph_s = 0;
    cs->pend = 0;
    cs->dev_known = 0;
    if (cm->ref && m->refine) {
        if (!f->buf) SPX_TRY(rf_session_alloc(m, f, e));
        SPX_TRY(lead_prepare(m, cm, f, e)); /* failed: tried again at the next pass */
    }
    f->epoch = m->refine_epoch;
    return SPX_OK;
}

/* The first matrix of launch L with a residual, when its set's budget is
 * > 0 (NULL: L is not refined). */
static const cu_rmat *launch_first(const cu_refine *r, const spx_refine_rt *rt, const cu_rf_launch &L) {
    const cu_rmat *first = NULL;
    for (int i = 0; i < L.n && !first; i++) {
        const cu_rmat *c = &r->mats[L.l * SPX_SL_COUNT + L.slot[i]];
        if (c->codes) first = c;
    }
    return first && spx_refine_rt_k(rt, first->set) > 0 ? first : NULL;
}

static int64_t align256(int64_t b) { return (b + 255) & ~(int64_t)255; }

/* The staging of launch L under the current budgets: its bytes (0: not
 * refined) and, with base, each matrix's buffer in it (stage[i], launch
 * order; NULL: no residual), one after the other, 256-byte aligned. */
static int64_t lead_layout(const cu_refine *r, const spx_refine_rt *rt, const cu_rf_launch &L, uint8_t *base,
                           uint8_t *stage[3]) {
    const cu_rmat *first = launch_first(r, rt, L);
    if (!first) return 0;
    const int64_t k = spx_refine_rt_k(rt, first->set), kc = k < SPX_RF_CHUNK ? k : SPX_RF_CHUNK;
    const int64_t E = (first->cols + SPX_RF_CHUNK - 1) / SPX_RF_CHUNK * kc;
    int64_t b = 0;
    for (int i = 0; i < L.n; i++) {
        const cu_rmat *c = &r->mats[L.l * SPX_SL_COUNT + L.slot[i]];
        if (base) stage[i] = c->codes ? base + b : NULL;
        if (c->codes) b += align256(E * c->col_stride);
    }
    return b;
}
static int64_t lead_stage_bytes(const cu_refine *r, const spx_refine_rt *rt, const cu_rf_launch &L) {
    return lead_layout(r, rt, L, NULL, NULL);
}

/* The lead slots for the current lead and budgets: lead + 1 slots of the
 * largest staging of a lead launch (resident layers); kept when they fit,
 * freed without lead (st was synchronized: nothing reads them). */
static spx_status lead_prepare(const spx_model *m, const cu_model *cm, cu_rf_sess *f, spx_err *e) {
    const spx_refine_rt *rt = &m->refine->rt;
    const cu_refine *r = cm->ref;
    const spx_config *c = &m->cfg;
    int64_t stage = 0;
    for (int64_t l = 0; l < c->n_layers && l < cm->n_resident && rt->cuda_lead > 0; l++)
        for (int i = 0; i < 2; i++) {
            const spx_block_kind k = i ? spx_block_ffn(c, l) : spx_block_mixer(c, l);
            const cu_rf_launch L = cu_rf_input_launch(c, &cm->layers[l], l, k, NULL, 0.0f);
            const int64_t b = L.n ? lead_stage_bytes(r, rt, L) : 0;
            stage = b > stage ? b : stage;
        }
    for (int i = 0; i < CU_RF_LEAD_SLOTS; i++) f->lead[i].target = -1;
    f->n_lead = 0;
    if (stage == 0) {
        if (f->lead_buf) cudaFree(f->lead_buf), f->lead_buf = NULL, f->lead_bytes = 0;
        return SPX_OK;
    }
    const int n = rt->cuda_lead + 1 < CU_RF_LEAD_SLOTS ? rt->cuda_lead + 1 : CU_RF_LEAD_SLOTS;
    f->lead_rows = c->hidden_size;
    const size_t sel = (size_t)SPX_RF_MAX_COLS * 4, cnt = 256;
    const size_t snap = (size_t)align256(f->lead_rows * 4);
    const size_t slot = snap + 2 * sel + cnt + (size_t)stage, need = (size_t)n * slot;
    if (need > f->lead_bytes) {
        if (f->lead_buf) cudaFree(f->lead_buf), f->lead_buf = NULL, f->lead_bytes = 0;
        const cudaError_t ce = cudaMalloc(&f->lead_buf, need);
        if (ce != cudaSuccess) {
            cudaGetLastError();
            f->lead_buf = NULL;
            return spx_fail(e, SPX_ERR_NOMEM, "%s: fetch lead %d: %d slots of %.1f MiB staging on the device: %s (a "
                            "smaller --refine-lead or budget)", m->path, (int)rt->cuda_lead, n, mib(slot),
                            cudaGetErrorString(ce));
        }
        f->lead_bytes = need;
    }
    f->lead_stage = (size_t)stage;
    for (int i = 0; i < n; i++) {
        cu_rf_lead *S = &f->lead[i];
        uint8_t *b = (uint8_t *)f->lead_buf + (size_t)i * slot;
        S->snap = (float *)b;
        S->sel = (int32_t *)(b + snap);
        S->selx = (float *)(b + snap + sel);
        S->cnt = (int *)(b + snap + 2 * sel);
        S->stage_base = b + snap + 2 * sel + cnt;
    }
    f->n_lead = n;
    return SPX_OK;
}

/* The session's streams, events and the buffers of the launch being
 * refined and of the lag slots (once; sized by the model, not the budgets). */
static spx_status rf_session_alloc(const spx_model *m, cu_rf_sess *f, spx_err *e) {
    SPX_CUDA_TRY(e, cudaStreamCreateWithFlags(&f->rs, cudaStreamNonBlocking));
    SPX_CUDA_TRY(e, cudaStreamCreateWithFlags(&f->rs_lead, cudaStreamNonBlocking));
    for (int i = 0; i < CU_RF_LEAD_SLOTS; i++) {
        SPX_CUDA_TRY(e, cudaEventCreateWithFlags(&f->lead[i].start, cudaEventDisableTiming));
        SPX_CUDA_TRY(e, cudaEventCreateWithFlags(&f->lead[i].fetched, cudaEventDisableTiming));
        f->lead[i].target = -1;
    }
    SPX_CUDA_TRY(e, cudaStreamCreateWithFlags(&f->rs_lag, cudaStreamNonBlocking));
    SPX_CUDA_TRY(e, cudaEventCreateWithFlags(&f->fork, cudaEventDisableTiming));
    SPX_CUDA_TRY(e, cudaEventCreateWithFlags(&f->join, cudaEventDisableTiming));
    const int64_t chunks = (SPX_RF_MAX_COLS + SPX_RF_CHUNK - 1) / SPX_RF_CHUNK;
    const size_t sel = (size_t)SPX_RF_MAX_COLS * 4, cnt = (size_t)chunks * 4;
    const size_t delta = ((size_t)launch_rows_max(m) * 4 + 255) & ~(size_t)255;
    f->lag_rows = m->cfg.hidden_size;
    const size_t lag = (size_t)CU_RF_LAG_SLOTS * (size_t)f->lag_rows * 4;
    const size_t lag_sel = (size_t)CU_RF_LAG_SLOTS * (2 * sel + cnt);
    SPX_CUDA_TRY(e, cudaMalloc(&f->buf, 2 * sel + 256 + cnt + 256 + delta + lag + 256 + lag_sel));
    uint8_t *b = (uint8_t *)f->buf;
    f->sel = (int32_t *)b;
    f->selx = (float *)(b + sel);
    f->cnt = (int *)(b + 2 * sel + 256);
    f->delta = (float *)(b + 2 * sel + 256 + cnt + 256);
    f->lag_delta = (float *)(b + 2 * sel + 256 + cnt + 256 + delta);
    uint8_t *ls = (uint8_t *)f->lag_delta + ((lag + 255) & ~(size_t)255);
    f->lag_sel = (int32_t *)ls;
    f->lag_selx = (float *)(ls + (size_t)CU_RF_LAG_SLOTS * sel);
    f->lag_cnt = (int *)(ls + (size_t)CU_RF_LAG_SLOTS * 2 * sel);
    for (int i = 0; i < CU_RF_LAG_SLOTS; i++) {
        SPX_CUDA_TRY(e, cudaEventCreateWithFlags(&f->lag_ev[i], cudaEventDisableTiming));
        f->lag_due[i] = -1;
    }
    return SPX_OK;
}

/* ---- the hooks of a decode launch ---------------------------------------------- */

/* The selection of launch L from input x (L.gain / L.x2 / L.eps as the
 * launch's), into sel / selx / cnt; its budget is first's set's. */
static spx_rf_select_args select_args(const cu_refine *r, const spx_refine_rt *rt, const cu_rmat *first,
                                      const cu_rf_launch &L, const float *x, int32_t *sel, float *selx, int *cnt) {
    const int64_t k = spx_refine_rt_k(rt, first->set);
    spx_rf_select_args sa;
    memset(&sa, 0, sizeof sa);
    sa.x = x, sa.gain = L.gain, sa.x2 = L.x2, sa.eps = L.eps;
    sa.cols = first->cols;
    sa.k = (int)(k < SPX_RF_CHUNK ? k : SPX_RF_CHUNK);
    sa.skip = k < SPX_RF_CHUNK ? r->mats[L.l * SPX_SL_COUNT + L.slot[0]].skip : NULL;
    sa.sel = sel, sa.selx = selx, sa.cnt = cnt;
    return sa;
}

spx_status cu_rf_fork(const spx_model *m, const cu_model *cm, cu_sess *cs, const cu_rf_launch &L, cudaStream_t st,
                      bool *on, spx_err *e, int lag_slot, int lead_slot) {
    *on = false;
    const cu_refine *r = cm->ref;
    const spx_refine_rt *rt = m->refine ? &m->refine->rt : NULL;
    cu_rf_sess *f = &cs->rf;
    const cu_rmat *first = r && rt ? launch_first(r, rt, L) : NULL;
    const cu_rf_lead *S = lead_slot >= 0 ? &f->lead[lead_slot] : NULL;
    if (!first) { /* not refined (a lead was started only for refined launches; joined all the same) */
        if (S) SPX_CUDA_TRY(e, cudaStreamWaitEvent(st, S->fetched, 0));
        return SPX_OK;
    }
    if (!f->buf) return spx_fail(e, SPX_ERR_INTERNAL, "refinement: the session's buffers were not prepared");
    const int64_t cols = first->cols;
    spx_rf_select_args sa = select_args(r, rt, first, L, L.x, f->sel, f->selx, f->cnt);
    spx_rf_apply_args aa;
    memset(&aa, 0, sizeof aa);
    int64_t off = 0;
    for (int i = 0; i < L.n; i++) {
        const cu_rmat *c = &r->mats[L.l * SPX_SL_COUNT + L.slot[i]];
        f->d[i] = NULL;
        if (!c->codes) continue;
        spx_rf_mat &M = aa.m[aa.n_mats++];
        M.codes = S ? S->stage[i] : c->codes, M.scales = c->scales, M.rows = c->rows, M.col_stride = c->col_stride;
        M.delta = lag_slot >= 0 ? f->lag_delta + (size_t)lag_slot * (size_t)f->lag_rows + off : f->delta + off;
        f->d[i] = M.delta;
        off += c->rows;
    }
    aa.staged = S != NULL;
    aa.n_chunks = (int)((cols + SPX_RF_CHUNK - 1) / SPX_RF_CHUNK);
    aa.kcap = sa.k;
    const int blocks = rt->cuda_blocks > 0 ? rt->cuda_blocks : DEFAULT_BLOCKS;
    /* a lagged launch's own selection buffers: the next launch's selection
     * on rs may run before this apply on rs_lag has read them */
    if (lag_slot >= 0) {
        sa.sel = f->lag_sel + (size_t)lag_slot * SPX_RF_MAX_COLS;
        sa.selx = f->lag_selx + (size_t)lag_slot * SPX_RF_MAX_COLS;
        sa.cnt = f->lag_cnt + (size_t)lag_slot * (SPX_RF_MAX_COLS / SPX_RF_CHUNK);
    }
    if (S) sa.sel = S->sel, sa.selx = S->selx, sa.cnt = S->cnt; /* chosen at the lead's point */
    aa.sel = sa.sel, aa.selx = sa.selx, aa.cnt = sa.cnt;
    cudaStream_t rs = lag_slot >= 0 ? f->rs_lag : f->rs;
    SPX_CUDA_TRY(e, cudaEventRecord(f->fork, st));
    SPX_CUDA_TRY(e, cudaStreamWaitEvent(rs, f->fork, 0));
    if (S) { /* the staged columns, and the real input at the chosen channels */
        SPX_CUDA_TRY(e, cudaStreamWaitEvent(rs, S->fetched, 0));
        SPX_CUDA_TRY(e, spx_rf_select_x(sa, rs));
    } else
        SPX_CUDA_TRY(e, spx_rf_select(sa, rs));
    SPX_CUDA_TRY(e, spx_rf_apply(aa, blocks, rs));
    SPX_CUDA_TRY(e, cudaEventRecord(lag_slot >= 0 ? f->lag_ev[lag_slot] : f->join, rs));
    *on = true;
    return SPX_OK;
}

/* ---- fetch lead ------------------------------------------------------------- */

int cu_rf_lead_of(const spx_model *m) { return m->refine ? m->refine->rt.cuda_lead : 0; }

cu_rf_launch cu_rf_input_launch(const spx_config *c, const cu_layer *L, int64_t l, spx_block_kind k, const float *x,
                                float eps) {
    cu_rf_launch r;
    memset(&r, 0, sizeof r);
    r.l = l, r.x = x, r.eps = eps;
    if (k == SPX_BLK_ATTENTION) {
        r.n = 3, r.slot[0] = SPX_SL_Q, r.slot[1] = SPX_SL_K, r.slot[2] = SPX_SL_V;
        r.gain = L->v[SPX_SL_MIX_NORM];
    } else if (k == SPX_BLK_SWIGLU) {
        if (c->gate_up_fused) r.n = 1, r.slot[0] = SPX_SL_GATE_UP; /* one [2I, H] matrix */
        else r.n = 2, r.slot[0] = SPX_SL_GATE, r.slot[1] = SPX_SL_UP;
        r.gain = L->v[SPX_SL_FFN_NORM];
    }
    return r;
}

spx_status cu_rf_lead_start(const spx_model *m, const cu_model *cm, cu_sess *cs, const cu_rf_launch &L, int target,
                            cudaStream_t st, bool *on, spx_err *e) {
    *on = false;
    cu_rf_sess *f = &cs->rf;
    const cu_refine *r = cm->ref;
    const spx_refine_rt *rt = m->refine ? &m->refine->rt : NULL;
    const cu_rmat *first = r && rt && f->n_lead > 0 ? launch_first(r, rt, L) : NULL;
    if (!first || first->cols > f->lead_rows || lead_stage_bytes(r, rt, L) > (int64_t)f->lead_stage) return SPX_OK;
    cu_rf_lead *S = NULL;
    for (int i = 0; i < f->n_lead && !S; i++)
        if (f->lead[i].target < 0) S = &f->lead[i];
    if (!S) return SPX_OK; /* every slot pending: this launch refines without lead */
    const int64_t cols = first->cols;
    spx_rf_select_args sa = select_args(r, rt, first, L, S->snap, S->sel, S->selx, S->cnt);
    spx_rf_fetch_args fa;
    memset(&fa, 0, sizeof fa);
    for (int i = 0; i < 3; i++) S->stage[i] = NULL;
    lead_layout(r, rt, L, S->stage_base, S->stage);
    for (int i = 0; i < L.n; i++) {
        const cu_rmat *c = &r->mats[L.l * SPX_SL_COUNT + L.slot[i]];
        if (!c->codes) continue;
        spx_rf_mat &M = fa.m[fa.n_mats];
        M.codes = c->codes, M.rows = c->rows, M.col_stride = c->col_stride;
        fa.stage[fa.n_mats++] = S->stage[i];
    }
    fa.sel = S->sel, fa.cnt = S->cnt;
    fa.n_chunks = (int)((cols + SPX_RF_CHUNK - 1) / SPX_RF_CHUNK);
    fa.kcap = sa.k;
    const int blocks = rt->cuda_blocks > 0 ? rt->cuda_blocks : DEFAULT_BLOCKS;
    /* st: the snapshot (h changes in place after this point); rs_lead:
     * everything that reads it and writes the slot (ordered after the slot's
     * previous apply, which st joined before this point) */
    SPX_CUDA_TRY(e, spx_rf_copy(S->snap, L.x, cols, st));
    SPX_CUDA_TRY(e, cudaEventRecord(S->start, st));
    SPX_CUDA_TRY(e, cudaStreamWaitEvent(f->rs_lead, S->start, 0));
    SPX_CUDA_TRY(e, spx_rf_select(sa, f->rs_lead));
    SPX_CUDA_TRY(e, spx_rf_fetch(fa, blocks, f->rs_lead));
    SPX_CUDA_TRY(e, cudaEventRecord(S->fetched, f->rs_lead));
    S->target = target, S->l = L.l, S->slot0 = L.slot[0];
    *on = true;
    return SPX_OK;
}

spx_status cu_rf_lead_take(cu_sess *cs, int hb, const cu_rf_launch &L, int *slot, spx_err *e) {
    cu_rf_sess *f = &cs->rf;
    *slot = -1;
    for (int i = 0; i < f->n_lead; i++) {
        cu_rf_lead *S = &f->lead[i];
        if (S->target != hb) continue;
        if (S->l != L.l || S->slot0 != L.slot[0])
            return spx_fail(e, SPX_ERR_INTERNAL, "fetch lead: half-block %d's fetch was for layer %lld slot %d, taken by "
                            "layer %lld slot %d", hb, (long long)S->l, S->slot0, (long long)L.l, L.slot[0]);
        S->target = -1;
        *slot = i;
        return SPX_OK;
    }
    return SPX_OK;
}

spx_status cu_rf_lead_end(cu_sess *cs, cudaStream_t st, spx_err *e) {
    cu_rf_sess *f = &cs->rf;
    for (int i = 0; i < f->n_lead; i++)
        if (f->lead[i].target >= 0) {
            SPX_CUDA_TRY(e, cudaStreamWaitEvent(st, f->lead[i].fetched, 0));
            f->lead[i].target = -1;
        }
    return SPX_OK;
}

int cu_rf_lag_of(const spx_model *m) { return m->refine ? m->refine->rt.cuda_lag : 0; }

int cu_rf_lag_slot(cu_sess *cs) {
    cu_rf_sess *f = &cs->rf;
    if (!f->buf) return -1;
    for (int i = 0; i < CU_RF_LAG_SLOTS; i++) {
        const int s = (f->lag_next + i) % CU_RF_LAG_SLOTS;
        if (f->lag_due[s] < 0) return s;
    }
    return -1;
}

void cu_rf_lag_push(cu_sess *cs, int slot, int due, float mult) {
    cu_rf_sess *f = &cs->rf;
    f->lag_due[slot] = due;
    f->lag_mult[slot] = mult;
    f->lag_next = (slot + 1) % CU_RF_LAG_SLOTS;
}

spx_status cu_rf_flush(cu_sess *cs, float *h, int64_t H, int hb, cudaStream_t st, spx_err *e) {
    cu_rf_sess *f = &cs->rf;
    if (!f->buf) return SPX_OK;
    /* in the order they were forked (their due order), so that each
     * element's sum is the same whatever the slots' numbering */
    for (;;) {
        int best = -1;
        for (int i = 0; i < CU_RF_LAG_SLOTS; i++)
            if (f->lag_due[i] >= 0 && (hb < 0 || f->lag_due[i] <= hb) && (best < 0 || f->lag_due[i] < f->lag_due[best]))
                best = i;
        if (best < 0) return SPX_OK;
        SPX_CUDA_TRY(e, cudaStreamWaitEvent(st, f->lag_ev[best], 0));
        SPX_CUDA_TRY(e, spx_rf_add(h, f->lag_delta + (size_t)best * (size_t)f->lag_rows, H, f->lag_mult[best], st));
        f->lag_due[best] = -1;
    }
}

spx_status cu_rf_join(cu_sess *cs, const cu_rf_launch &L, float *const *y, const int64_t *rows, float mult,
                      cudaStream_t st, spx_err *e) {
    cu_rf_sess *f = &cs->rf;
    SPX_CUDA_TRY(e, cudaStreamWaitEvent(st, f->join, 0));
    for (int i = 0; i < L.n; i++)
        if (f->d[i] && y[i]) SPX_CUDA_TRY(e, spx_rf_add(y[i], f->d[i], rows[i], mult, st));
    return SPX_OK;
}

spx_status cu_rf_join_swiglu(cu_sess *cs, float *gate, const float *up, int64_t n, cudaStream_t st, spx_err *e) {
    cu_rf_sess *f = &cs->rf;
    SPX_CUDA_TRY(e, cudaStreamWaitEvent(st, f->join, 0));
    SPX_CUDA_TRY(e, spx_rf_add_swiglu(gate, up, f->d[0], f->d[1], n, st));
    return SPX_OK;
}
