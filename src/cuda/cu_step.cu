/* cu_step.cu: decode steps through captured CUDA graphs (greedy and
 * sampled), the queued-ahead protocol, and the backend table. */
#include "cuda/cu_backend.cuh"

spx_status cu_capture_graph(spx_session *s, cu_sess *cs, cudaGraphExec_t *out, spx_err *e, int lmode) {
    SPX_CUDA_TRY(e, cudaStreamBeginCapture(cs->st, cudaStreamCaptureModeRelaxed));
    spx_status st = cu_enqueue_forward(s, 1, lmode, cs->dec_splits, e);
    cudaGraph_t g = NULL;
    cudaError_t ce = cudaStreamEndCapture(cs->st, &g);
    if (st != SPX_OK) {
        if (ce == cudaSuccess && g) cudaGraphDestroy(g);
        return st;
    }
    SPX_CUDA_TRY(e, ce);
    ce = cudaGraphInstantiate(out, g, 0);
    cudaGraphDestroy(g);
    SPX_CUDA_TRY(e, ce);
    return SPX_OK;
}

spx_status cu_capture_decode(spx_session *s, cu_sess *cs, spx_err *e) {
    SPX_TRY(cu_capture_graph(s, cs, &cs->graph, e));
    cs->have_graph = 1;
    return SPX_OK;
}

/* Before a graph step: the input token and position go to the device
 * unless the previous step left exactly them there. */
static spx_status step_input(spx_session *s, cu_sess *cs, int32_t id, spx_err *e) {
    cs->pend = 0; /* a step queued ahead with another input: left to run, superseded (cu_step) */
    if (!cs->dev_known || cs->dev_pos != s->pos || cs->dev_tok != id) {
        cs->pin[0] = id;
        cs->pin[SPX_BATCH_MAX_CUDA] = (int32_t)s->pos;
        SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->d_ids, cs->pin, 4, cudaMemcpyHostToDevice, cs->st));
        SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->d_pos, cs->pin + SPX_BATCH_MAX_CUDA, 4, cudaMemcpyHostToDevice, cs->st));
    }
    cs->dev_known = 0;
    return SPX_OK;
}

/* The decode step (greedy, or sampled on the device), queued one ahead
 * when the caller says it will go on (ahead): the step at position p + 1
 * is launched before step p's token is read, its input being the token
 * (and, sampled, the RNG state) step p leaves on the device, so the GPU
 * runs step after step with no gap for the host's round trip (the wait,
 * the return to the caller, the next launch). The token (and the RNG
 * state) come back through the mapped ring, not copies in the stream,
 * which would sit between the two steps. The next call takes the queued
 * step only if it asks for exactly it: the same kind of step, token,
 * position, sampling parameters and RNG state. Otherwise (or after an
 * eval, a reset) the queued step is left to run: it only wrote the KV row
 * at p + 1, which any later pass at that position rewrites before reading
 * it, and the device's token, position and RNG state, which the next step
 * uploads again. The steps' tokens are those of steps not queued ahead
 * (test_cuda checks it bit for bit). */
static spx_status launch_step(cu_sess *cs, cudaGraphExec_t g, int64_t p, spx_err *e) {
    SPX_CUDA_TRY(e, cudaGraphLaunch(g, cs->st));
    SPX_CUDA_TRY(e, cudaEventRecord(cs->step_ev[p & 1], cs->st));
    return SPX_OK;
}

/* sp: NULL for the greedy step, else the device sampler's parameters
 * (spx_sample_on_device) and *rng its state, advanced on return. */
static spx_status cu_step(spx_session *s, int32_t id, const spx_sampler_params *sp, uint64_t *rng, int ahead,
                          int32_t *next, spx_err *e) {
    const cu_model *cm = (const cu_model *)s->m->be_state;
    cu_sess *cs = (cu_sess *)s->be_state;
    SPX_CUDA_TRY(e, cudaSetDevice(cm->dev));
    SPX_TRY(cu_rf_prepare(s, cs, e)); /* (may drop the graphs: budgets changed) */
    if (!sp && !cs->have_graph) SPX_TRY(cu_capture_decode(s, cs, e));
    if (sp && !cs->have_graph_s) {
        SPX_TRY(cu_capture_graph(s, cs, &cs->graph_s, e, LM_SAMPLE));
        cs->have_graph_s = 1;
    }
    const cudaGraphExec_t g = sp ? cs->graph_s : cs->graph;
    const int64_t p = s->pos;
    spx_sample_dev want; /* the sampler's parameters and state this step asks for */
    memset(&want, 0, sizeof want);
    if (sp) {
        want.temperature = sp->temperature;
        want.top_k = sp->top_k;
        want.top_p = sp->top_p;
        want.rng = *rng;
    }
    const spx_sample_dev &q = cs->pend_samp;
    const int queued = cs->pend && cs->pend_pos == p && cs->pend_tok == id && cs->pend_sampled == (sp != NULL) &&
                       (!sp || (q.temperature == want.temperature && q.top_k == want.top_k && q.top_p == want.top_p &&
                                q.rng == want.rng));
    if (!queued) {
        if (cs->kvl) SPX_TRY(cu_kvl_before(s, cs, p, 1, e));
        SPX_TRY(step_input(s, cs, id, e)); /* (drops a queued step) */
        if (sp) {
            *cs->pin_samp = want;
            SPX_CUDA_TRY(e, cudaMemcpyAsync(cs->d_samp, cs->pin_samp, sizeof(spx_sample_dev), cudaMemcpyHostToDevice,
                                            cs->st));
        }
        SPX_TRY(launch_step(cs, g, p, e));
    }
    cs->pend = 0;
    const int spec = ahead && cs->ahead_ok && p + 1 < s->n_ctx;
    if (spec && cs->kvl) SPX_TRY(cu_kvl_before(s, cs, p + 1, 1, e));
    if (spec) SPX_TRY(launch_step(cs, g, p + 1, e));
    /* step p's pinned inputs were copied before it ran: the next call may rewrite them */
    SPX_CUDA_TRY(e, cudaEventSynchronize(cs->step_ev[p & 1]));
    const volatile unsigned long long *ring = cs->ring;
    const unsigned slot = (uint32_t)p % SPX_TOKEN_RING;
    const unsigned long long v = ring[slot];
    if (v >> 32 != (uint32_t)p || (int64_t)(uint32_t)v >= s->m->cfg.vocab_size)
        return spx_fail(e, SPX_ERR_INTERNAL, "decode step at position %lld: the device reported no token (ring entry %#llx)",
                        (long long)p, v);
    *next = (int32_t)(uint32_t)v;
    if (sp) *rng = ring[SPX_TOKEN_RING + slot];
    s->pos = p + 1;
    if (spec) { /* the device has moved on to p + 2 with a token the host has not seen */
        cs->pend = 1;
        cs->pend_pos = p + 1;
        cs->pend_tok = *next;
        cs->pend_sampled = sp != NULL;
        cs->pend_samp = want;
        cs->pend_samp.rng = sp ? *rng : 0; /* the state the queued draw starts from */
        cs->dev_known = 0;
    } else {
        cs->dev_pos = s->pos;
        cs->dev_tok = *next;
        cs->dev_known = 1;
    }
    return SPX_OK;
}

static spx_status cu_step_greedy(spx_session *s, int32_t id, int32_t *next, int ahead, spx_err *e) {
    return cu_step(s, id, NULL, NULL, ahead, next, e);
}

/* One decode step with temperature / top-k / top-p sampling. On the device
 * (spx_sample_on_device: 2 <= top_k <= 1024) through a second captured
 * graph ending with spx_sample_topk: the parameters and the RNG state go
 * up with the token (pinned, 24 bytes) unless the step was queued ahead,
 * the next id and the advanced state come back through the ring.
 * Otherwise (top-k off or wider) the logits come to the host for
 * spx_sample. (Greedy parameters never get here: spx_session_step_sample
 * takes the greedy step for them.) */
static spx_status cu_step_sample(spx_session *s, int32_t id, const spx_sampler_params *p, uint64_t *rng, int ahead,
                                 int32_t *next, spx_err *e) {
    const int64_t V = s->m->cfg.vocab_size;
    if (!spx_sample_on_device(p->temperature, p->top_k, V)) {
        SPX_TRY(cu_forward(s, &id, 1, SPX_LOGITS_LAST, e));
        *next = spx_sample(s->logits, V, p, rng);
        return SPX_OK;
    }
    return cu_step(s, id, p, rng, ahead, next, e);
}

static const spx_backend g_cuda = {
    "cuda",           cu_model_init, cu_model_free, cu_session_init, cu_session_free, cu_forward, cu_step_greedy,
    cu_offload_stats,
    SPX_BATCH_MAX_CUDA,
    1,
    cu_step_sample,
    cu_state_op,
    cu_refine_attach,
    cu_refine_detach,
    /* rows per batch step: the GEMM's decode-sized products */
    cu_forward_batch,
    16,
    cu_forward_argmax,
};

extern "C" const spx_backend *spx_backend_cuda(void) { return &g_cuda; }

extern "C" int spx_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}
