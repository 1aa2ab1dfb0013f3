/* backend.c: the CPU backend table and backend selection. */
#include "engine/backend.h"
#include "engine/session.h"

#include <string.h>

static spx_status cpu_model_init(spx_model *m, spx_err *e) { return spx_forward_check(m, e); }
static void cpu_model_free(spx_model *m) {}
static spx_status cpu_session_init(spx_session *s, spx_err *e) { return SPX_OK; }
static void cpu_session_free(spx_session *s) {}

static const spx_backend g_cpu = {
    "cpu", cpu_model_init, cpu_model_free, cpu_session_init, cpu_session_free, spx_forward, NULL, NULL, SPX_BATCH_MAX, 0, NULL, NULL,
    NULL, NULL, /* refinement runs in the matmul (cpu/ops.c) */
    /* 16 rows: the kernels' decode-sized products (cpu/qkernels_avx2.c),
     * whose rows get the bits a one-token product gives */
    spx_forward_batch, 16,
    NULL, /* forward_argmax: the logits are on the host already */
};

const spx_backend *spx_backend_cpu(void) { return &g_cpu; }

#ifdef SPX_HAVE_CUDA
int spx_cuda_device_count(void);
#endif

const spx_backend *spx_backend_find(const char *name) {
    if (!name || !strcmp(name, "cpu")) return &g_cpu;
#ifdef SPX_HAVE_CUDA
    if (!strcmp(name, "cuda")) return spx_backend_cuda();
    if (!strcmp(name, "auto")) return spx_cuda_device_count() > 0 ? spx_backend_cuda() : &g_cpu;
#else
    if (!strcmp(name, "auto")) return &g_cpu;
#endif
    return NULL;
}

int64_t spx_batch_max(const spx_model *m) { return m->be->max_batch > 0 ? m->be->max_batch : SPX_BATCH_MAX; }

spx_status spx_session_forward(spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e) {
    const spx_config *c = &s->m->cfg;
    if (n <= 0 || n > spx_batch_max(s->m)) return spx_fail(e, SPX_ERR_ARG, "forward: batch of %lld tokens", (long long)n);
    if (s->pos + n > s->n_ctx)
        return spx_fail(e, SPX_ERR_RANGE, "context full: %lld tokens in a %lld-token context",
                        (long long)(s->pos + n), (long long)s->n_ctx);
    for (int64_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size)
            return spx_fail(e, SPX_ERR_RANGE, "token id %d out of range (vocabulary %lld)", ids[t],
                            (long long)c->vocab_size);
    return s->m->be->forward(s, ids, n, want_logits, e);
}

spx_status spx_session_forward_argmax(spx_session *s, const int32_t *ids, int64_t n, int32_t *best, spx_err *e) {
    const int64_t V = s->m->cfg.vocab_size;
    if (s->m->be->forward_argmax) {
        /* the checks of spx_session_forward, without running it */
        if (n <= 0 || n > spx_batch_max(s->m)) return spx_fail(e, SPX_ERR_ARG, "forward: batch of %lld tokens", (long long)n);
        if (s->pos + n > s->n_ctx)
            return spx_fail(e, SPX_ERR_RANGE, "context full: %lld tokens in a %lld-token context",
                            (long long)(s->pos + n), (long long)s->n_ctx);
        for (int64_t t = 0; t < n; t++)
            if (ids[t] < 0 || ids[t] >= V)
                return spx_fail(e, SPX_ERR_RANGE, "token id %d out of range (vocabulary %lld)", ids[t], (long long)V);
        return s->m->be->forward_argmax(s, ids, n, best, e);
    }
    SPX_TRY(spx_session_forward(s, ids, n, SPX_LOGITS_ALL, e));
    for (int64_t t = 0; t < n; t++) best[t] = spx_sample(s->logits + (size_t)t * (size_t)V, V, NULL, NULL);
    return SPX_OK;
}

spx_status spx_session_offload_stats(spx_session *s, int32_t n_steps, spx_offload_stats *out, spx_err *e) {
    memset(out, 0, sizeof *out);
    out->n_layers = out->n_layers_resident = s->m->cfg.n_layers;
    if (n_steps < 0) return spx_fail(e, SPX_ERR_ARG, "offload stats: %d steps", (int)n_steps);
    if (!s->m->be->offload_stats) return SPX_OK;
    return s->m->be->offload_stats(s, n_steps, out, e);
}
