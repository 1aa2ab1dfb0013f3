/* cu_offload.cu: ping-pong layer offload and its measurements.
 *
 * Ping-pong layer offload: when weights + KV cache + scratch do not fit the
 * device budget (spx_model_params.vram_budget_mb, else free memory minus
 * SPX_PLAN_VRAM_MARGIN; engine/plan.h's memory model), the embedding, LM
 * head, final norm, RoPE table and the first n_resident layers stay in the
 * arena; every other layer's components are copied into pinned host memory
 * with the same layout as in the arena (256-byte aligned offsets from the
 * layer's start, so a layer is one contiguous image and one copy). Each
 * session owns two device slots of the largest image and a copy stream:
 * the copy of streamed layer j + 2 into slot j % 2 waits for the event
 * recorded after the last kernel of layer j; the first kernel of layer j
 * waits for the event recorded after its copy, so copies of the next layer
 * overlap compute of this one. The copy stream forks from the compute
 * stream at the start of a pass and joins it before the LM head, so a pass
 * (and its graph capture) is self-contained. The layers' device pointers are
 * kept as pointers into the pinned image and rebased onto the slot when
 * enqueued. SPECTRA_CUDA_RESIDENT_LAYERS=k forces ping-pong with k layers
 * resident (tests, measurements).
 *
 */
#include "cuda/cu_backend.cuh"

/* ---- ping-pong: copies and events around each streamed layer ------------ */

template <typename T> static T *rebase_ptr(T *p, const uint8_t *img, uint8_t *slot) {
    return p ? (T *)(slot + ((const uint8_t *)p - img)) : p;
}

/* Layer descriptor with its pointers moved from the pinned image img to
 * the slot (offsets are the same in both). */
static cu_layer rebase_layer(const cu_layer &L, const uint8_t *img, uint8_t *slot) {
    cu_layer D = L;
    for (int s = 0; s < SPX_SL_COUNT; s++) {
        spx_dqmat *w = &D.w[s];
        w->codes = rebase_ptr(w->codes, img, slot);
        w->scales = rebase_ptr(w->scales, img, slot);
        w->zeros = rebase_ptr(w->zeros, img, slot);
        w->oidx = rebase_ptr(w->oidx, img, slot);
        w->oval = rebase_ptr(w->oval, img, slot);
        D.v[s] = rebase_ptr(D.v[s], img, slot);
    }
    return D;
}

/* Streamed layer j (layer n_resident + j) lives in slot j % 2. */
static uint8_t *pp_slot(const cu_model *cm, const cu_sess *cs, int64_t j) {
    return cs->pp.slots + (size_t)(j & 1) * cm->slot_bytes;
}

static spx_status pp_copy(const cu_model *cm, cu_sess *cs, int64_t j, spx_err *e) {
    int64_t l = cm->n_resident + j;
    SPX_CUDA_TRY(e, cudaMemcpyAsync(pp_slot(cm, cs, j), cm->host + cm->img_off[l], cm->img_bytes[l],
                                    cudaMemcpyHostToDevice, cs->pp.cp));
    SPX_CUDA_TRY(e, cudaEventRecord(cs->pp.copied[j & 1], cs->pp.cp));
    return SPX_OK;
}

/* Start of a pass: the copy stream forks from the compute stream (so it
 * never overwrites a slot an earlier pass still reads) and fetches the
 * first two streamed layers, overlapping the embedding and the resident
 * layers. */
spx_status cu_pp_begin(const spx_model *m, const cu_model *cm, cu_sess *cs, spx_err *e) {
    int64_t ns = cu_pp_n_stream(m, cm);
    if (ns <= 0 || cs->pp.no_copy) return SPX_OK;
    SPX_CUDA_TRY(e, cudaEventRecord(cs->pp.fork, cs->st));
    SPX_CUDA_TRY(e, cudaStreamWaitEvent(cs->pp.cp, cs->pp.fork, 0));
    for (int64_t j = 0; j < ns && j < 2; j++) SPX_TRY(pp_copy(cm, cs, j, e));
    return SPX_OK;
}

/* Before the first kernel of streamed layer l: wait for its copy (a full
 * dependency: the first kernel is launched without PDL, and every later
 * kernel of the layer starts after it has). */
spx_status cu_pp_layer_begin(const cu_model *cm, cu_sess *cs, int64_t l, cu_layer *out, spx_err *e) {
    int64_t j = l - cm->n_resident;
    if (cs->pp.no_copy) {
        /* measurement without copies: slot j % 2 holds streamed layer j % 2
         * (measure_offload put it there), so read it with that layer's
         * layout; another layer's descriptor over it would take codes for
         * outlier indices */
        const int64_t lj = cm->n_resident + (j & 1);
        *out = rebase_layer(cm->layers[lj], cm->host + cm->img_off[lj], pp_slot(cm, cs, j));
        return SPX_OK;
    }
    SPX_CUDA_TRY(e, cudaStreamWaitEvent(cs->st, cs->pp.copied[j & 1], 0));
    *out = rebase_layer(cm->layers[l], cm->host + cm->img_off[l], pp_slot(cm, cs, j));
    return SPX_OK;
}

/* After the last kernel of streamed layer l (the down projection: no later
 * kernel reads the slot): its slot takes layer l + 2. */
spx_status cu_pp_layer_end(const spx_model *m, const cu_model *cm, cu_sess *cs, int64_t l, spx_err *e) {
    int64_t j = l - cm->n_resident;
    if (cs->pp.no_copy || j + 2 >= cu_pp_n_stream(m, cm)) return SPX_OK;
    SPX_CUDA_TRY(e, cudaEventRecord(cs->pp.used[j & 1], cs->st));
    SPX_CUDA_TRY(e, cudaStreamWaitEvent(cs->pp.cp, cs->pp.used[j & 1], 0));
    return pp_copy(cm, cs, j + 2, e);
}

/* After the layers: the copy stream joins the compute stream (required to
 * end a capture; in eager mode it orders nothing new). */
spx_status cu_pp_end(const spx_model *m, const cu_model *cm, cu_sess *cs, spx_err *e) {
    if (cu_pp_n_stream(m, cm) <= 0 || cs->pp.no_copy) return SPX_OK;
    SPX_CUDA_TRY(e, cudaEventRecord(cs->pp.join, cs->pp.cp));
    SPX_CUDA_TRY(e, cudaStreamWaitEvent(cs->st, cs->pp.join, 0));
    return SPX_OK;
}

/* Enqueues the forward pass of n tokens (ids in cs->d_ids, position of the
 * first in cs->d_pos) on cs->st. Nothing here reads host state that
 * changes between steps, so it can be captured. */
/* ---- offload measurements ------------------------------------------------ */

/* Mean seconds per replay of g over k decode steps at positions 1..k (one
 * warm-up replay at position 0 first), timed with events on cs->st. */
static spx_status time_graph(cu_sess *cs, cudaGraphExec_t g, int k, cudaEvent_t t0, cudaEvent_t t1, double *sec,
                             spx_err *e) {
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    cs->pin[0] = 0;
    cs->pin[SPX_BATCH_MAX_CUDA] = 0;
    SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->d_ids, cs->pin, 4, cudaMemcpyHostToDevice, cs->st));
    SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->d_pos, cs->pin + SPX_BATCH_MAX_CUDA, 4, cudaMemcpyHostToDevice, cs->st));
    SPX_CUDA_TRY(e, cudaGraphLaunch(g, cs->st));
    SPX_CUDA_TRY(e, cudaEventRecord(t0, cs->st));
    for (int i = 0; i < k; i++) SPX_CUDA_TRY(e, cudaGraphLaunch(g, cs->st));
    SPX_CUDA_TRY(e, cudaEventRecord(t1, cs->st));
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    float ms = 0;
    SPX_CUDA_TRY(e, cudaEventElapsedTime(&ms, t0, t1));
    *sec = (double)ms / 1e3 / k;
    return SPX_OK;
}

static spx_status measure_offload(spx_session *s, cu_sess *cs, int k, cudaEvent_t t0, cudaEvent_t t1,
                                  cudaGraphExec_t *nocopy, spx_offload_stats *o, spx_err *e) {
    const cu_model *cm = (const cu_model *)s->m->be_state;
    /* 1. the ping-pong step, as step_greedy runs it */
    if (!cs->have_graph) SPX_TRY(cu_capture_decode(s, cs, e));
    SPX_TRY(time_graph(cs, cs->graph, k, t0, t1, &o->t_step_s, e));
    /* 2. the same step without the copies: every streamed layer computes
     * from the slot of its parity, which holds streamed layer 0 or 1 (same
     * kinds and shapes; their own outlier counts); not for layers of other
     * kinds (a hybrid's: another layer's slots over an image would read
     * codes as indices) */
    const spx_config *c = &s->m->cfg;
    o->uniform = 1;
    for (int64_t j = 2; j < cu_pp_n_stream(s->m, cm); j++) {
        const int64_t l = cm->n_resident + j, l0 = cm->n_resident + (j & 1);
        if (c->mixer[l] != c->mixer[l0] || c->ffn[l] != c->ffn[l0]) o->uniform = 0;
    }
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    for (int64_t j = 0; j < 2 && j < cu_pp_n_stream(s->m, cm); j++)
        SPX_CUDA_TRY(e, cudaMemcpyAsync(pp_slot(cm, cs, j), cm->host + cm->img_off[cm->n_resident + j],
                                        cm->img_bytes[cm->n_resident + j], cudaMemcpyHostToDevice, cs->st));
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    if (o->uniform) {
        cs->pp.no_copy = 1;
        spx_status st = cu_capture_graph(s, cs, nocopy, e);
        cs->pp.no_copy = 0;
        SPX_TRY(st);
        SPX_TRY(time_graph(cs, *nocopy, k, t0, t1, &o->t_compute_s, e));
    }
    /* 3. the copies alone */
    int64_t ns = cu_pp_n_stream(s->m, cm);
    SPX_CUDA_TRY(e, cudaEventRecord(t0, cs->pp.cp));
    for (int i = 0; i < k; i++)
        for (int64_t j = 0; j < ns; j++)
            SPX_CUDA_TRY(e, cudaMemcpyAsync(pp_slot(cm, cs, j), cm->host + cm->img_off[cm->n_resident + j],
                                            cm->img_bytes[cm->n_resident + j], cudaMemcpyHostToDevice, cs->pp.cp));
    SPX_CUDA_TRY(e, cudaEventRecord(t1, cs->pp.cp));
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->pp.cp));
    float ms = 0;
    SPX_CUDA_TRY(e, cudaEventElapsedTime(&ms, t0, t1));
    o->t_copy_s = (double)ms / 1e3 / k;
    o->h2d_gbps = o->t_copy_s > 0 ? (double)cm->stream_bytes / o->t_copy_s / 1e9 : 0;
    double h = o->t_copy_s > 0 && o->uniform ? 1.0 - (o->t_step_s - o->t_compute_s) / o->t_copy_s : 0;
    o->hidden_share = h < 0 ? 0 : h > 1 ? 1 : h;
    o->n_steps = k;
    o->measured = 1;
    return SPX_OK;
}

spx_status cu_offload_stats(spx_session *s, int32_t n_steps, spx_offload_stats *o, spx_err *e) {
    const cu_model *cm = (const cu_model *)s->m->be_state;
    cu_sess *cs = (cu_sess *)s->be_state;
    int64_t ns = cu_pp_n_stream(s->m, cm);
    o->pingpong = ns > 0;
    o->n_layers = s->m->cfg.n_layers;
    o->n_layers_resident = cm->n_resident;
    o->stream_bytes_per_token = ns > 0 ? cm->stream_bytes : 0;
    o->pinned_bytes = cm->host_bytes;
    o->slot_bytes = ns > 0 ? cm->slot_bytes : 0;
    int64_t k = n_steps;
    if (k > s->n_ctx - 2) k = s->n_ctx - 2;
    if (ns <= 0 || k < 1) return SPX_OK;
    SPX_CUDA_TRY(e, cudaSetDevice(cm->dev));
    cudaEvent_t t0 = NULL, t1 = NULL;
    cudaGraphExec_t nocopy = NULL;
    spx_status st = SPX_OK;
    cudaError_t ce = cudaEventCreate(&t0);
    if (ce == cudaSuccess) ce = cudaEventCreate(&t1);
    if (ce != cudaSuccess) st = spx_cuda_fail(e, ce, "cudaEventCreate", __FILE__, __LINE__);
    else st = measure_offload(s, cs, (int)k, t0, t1, &nocopy, o, e);
    cudaStreamSynchronize(cs->st);
    if (cs->pp.cp) cudaStreamSynchronize(cs->pp.cp);
    if (nocopy) cudaGraphExecDestroy(nocopy);
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    cs->dev_known = 0; /* the device position and token moved; the cache holds the measurement's tokens */
    cs->pend = 0;
    s->pos = 0;
    if (st == SPX_OK) st = cu_state_op(s, SPX_STATE_RESET, e); /* and the recurrent state the measurement's */
    return st;
}
