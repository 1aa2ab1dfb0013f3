/* cu_kvlow.cu: the CUDA session's low-bit KV cache (kvlow_dev.cuh): its
 * allocation, one layer's attention with refinement, the encode after a
 * pass, the rewrite after a truncate, and the counters.
 *
 * Refinement scratch (lse, stat, keys, selection, accumulators) is sized
 * per token of a call: a decode step uses one token's; a prompt runs its
 * attention and refinement in slices of kvl->tmax tokens (at most
 * SPX_KVL_SCRATCH_MB of scratch), each slice's queries through both
 * passes before the next (every query's selection is its own, as on the
 * CPU). */
#include "cuda/cu_backend.cuh"
#include "cuda/kvlow_dev.cuh"

#define SPX_KVL_SCRATCH_MB 256

static cudaError_t kvl_alloc(cu_kvl *k, void **p, size_t bytes) {
    *p = NULL;
    if (k->n_allocs >= (int)(sizeof k->allocs / sizeof k->allocs[0])) return cudaErrorInvalidValue;
    cudaError_t err = cudaMalloc(p, bytes ? bytes : 16);
    if (err == cudaSuccess) {
        k->allocs[k->n_allocs++] = *p;
        err = cudaMemset(*p, 0, bytes ? bytes : 16); /* no garbage under a probability of 0 (0 * NaN) */
    }
    return err;
}

void cu_kvl_free(cu_sess *cs) {
    cu_kvl *k = cs->kvl;
    if (!k) return;
    for (int i = 0; i < k->n_allocs; i++) cudaFree(k->allocs[i]);
    if (k->tier_host) cudaFreeHost(k->tier_host);
    if (k->stats_h) cudaFreeHost(k->stats_h);
    free(k);
    cs->kvl = NULL;
}

spx_status cu_kvl_init(spx_session *s, cu_sess *cs, spx_err *e) {
    const spx_config *c = &s->m->cfg;
    const spx_kvlow_cfg *lc = &s->kv.low.cfg;
    char why[256];
    if (!spx_kvl_supported(lc, c->head_dim, (int)c->sliding_window, why, sizeof why))
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s (--backend cpu runs it)", why);
    cu_kvl *k = (cu_kvl *)calloc(1, sizeof *k);
    if (!k) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    cs->kvl = k;
    const int64_t kvd = c->n_kv_heads * c->head_dim;
    spx_kvl_sizes z;
    spx_kvl_plan(lc, c->n_attn_layers, s->n_ctx, kvd, c->head_dim, SPX_BATCH_MAX_CUDA, &k->d, &z);
    spx_kvl_dev &d = k->d;
    cudaError_t ce = cudaSuccess;
    void **arr[] = {(void **)&d.sink_k, (void **)&d.sink_v, (void **)&d.ring_k, (void **)&d.ring_v,
                    (void **)&d.ck,     (void **)&d.cv,     (void **)&d.mk,     (void **)&d.mv};
    const size_t by[] = {z.sink, z.sink, z.ring, z.ring, z.ck, z.cv, z.mk, z.mv};
    size_t total = 0;
    for (int i = 0; i < 8 && ce == cudaSuccess; i++) {
        ce = kvl_alloc(k, arr[i], by[i]);
        total += by[i];
    }
    if (ce == cudaSuccess) ce = kvl_alloc(k, (void **)&d.stats, 16);
    if (ce == cudaSuccess) ce = cudaHostAlloc((void **)&k->stats_h, 16, cudaHostAllocDefault);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        return spx_fail(e, SPX_ERR_NOMEM, "the low-bit KV cache (%.1f MiB) does not fit on the device: %s", mib(total),
                        cudaGetErrorString(ce));
    }
    memset(k->stats_h, 0, 16);
    if (lc->rb) {
        ce = cudaHostAlloc((void **)&k->tier_host, z.tier, cudaHostAllocMapped | cudaHostAllocPortable);
        if (ce == cudaSuccess) ce = cudaHostGetDevicePointer((void **)&d.tier, k->tier_host, 0);
        if (ce != cudaSuccess) {
            cudaGetLastError();
            k->tier_host = NULL;
            return spx_fail(e, SPX_ERR_NOMEM, "the KV refinement tier (%.1f MiB of pinned host memory): %s", mib(z.tier),
                            cudaGetErrorString(ce));
        }
        memset(k->tier_host, 0, z.tier);
        d.tier_host = k->tier_host;
        /* refinement scratch for tmax tokens */
        const size_t per = spx_kvl_ref_words_per_token(d, (int)c->n_heads) * 4;
        int64_t tmax = (int64_t)SPX_KVL_SCRATCH_MB * 1024 * 1024 / (int64_t)per;
        if (tmax > SPX_BATCH_MAX_CUDA) tmax = SPX_BATCH_MAX_CUDA;
        if (tmax < 1) tmax = 1;
        k->tmax = (int)tmax;
        ce = kvl_alloc(k, (void **)&k->scratch, per * (size_t)tmax);
        if (ce != cudaSuccess) {
            cudaGetLastError();
            return spx_fail(e, SPX_ERR_NOMEM, "the KV refinement's scratch (%.1f MiB) does not fit on the device: %s",
                            mib(per * (size_t)tmax), cudaGetErrorString(ce));
        }
        /* the most groups a query selects: at the last position */
        const int64_t cand = s->n_ctx > SPX_KVL_BLOCK ? (spx_kvl_enc(s->n_ctx - 1) - SPX_KVL_BLOCK) / lc->gt : 0;
        k->max_sel = (int)spx_kvlow_n_sel(lc->frac, cand);
    }
    int64_t S = (s->n_ctx + SPX_KVL_SPLIT_KEYS - 1) / SPX_KVL_SPLIT_KEYS;
    if (spx_tuning_get()->cuda_attn_splits > 0) S = spx_tuning_get()->cuda_attn_splits;
    k->n_splits = (int)(S < 1 ? 1 : S > 128 ? 128 : S);
    return SPX_OK;
}

/* one token-slice's refinement buffers */
static spx_kvl_ref_args ref_args(const cu_kvl *k, const spx_kvl_attn_args &a, int nh) {
    spx_kvl_ref_args r;
    memset(&r, 0, sizeof r);
    r.a = a;
    const size_t ng = (size_t)k->d.n_groups, T = (size_t)k->tmax, nkv = (size_t)k->d.nkv;
    float *w = k->scratch;
    r.a.lse = w;
    w += T * nh * ng;
    r.a.stat = w;
    w += T * nh;
    r.keys = (unsigned *)w;
    w += T * nkv * ng;
    r.sel = (int *)w;
    w += T * nkv * ng;
    r.ckey = (unsigned *)w;
    w += T * nkv * ng;
    r.cidx = (int *)w;
    w += T * nkv * ng;
    r.nsel = (int *)w;
    w += T * nkv;
    r.acc = w;
    w += T * nh * (size_t)(k->d.hd + 1);
    r.cnt2 = (int *)w;
    r.max_sel = k->max_sel;
    return r;
}

spx_status cu_kvl_attention(spx_session *s, cu_sess *cs, int64_t kv_layer, int n, cudaStream_t st, spx_err *e) {
    const spx_config *c = &s->m->cfg;
    cu_kvl *k = cs->kvl;
    const int nh = (int)c->n_heads;
    const int64_t qd = (int64_t)nh * c->head_dim;
    spx_kvl_attn_args a;
    memset(&a, 0, sizeof a);
    a.c = k->d;
    a.layer = (int)kv_layer;
    a.part = cs->part;
    a.cnt = cs->attn_cnt;
    a.nh = nh;
    a.window = (int)c->sliding_window;
    a.scale = c->attn_scale;
    a.pos = cs->d_pos;
    a.n_splits = n == 1 ? k->n_splits : 1; /* a prompt: its tokens' blocks fill the device */
    const int T = k->d.rb ? k->tmax : n;
    for (int t0 = 0; t0 < n; t0 += T) {
        a.n_tok = n - t0 < T ? n - t0 : T;
        a.t0 = t0;
        a.q = cs->q + (size_t)t0 * (size_t)qd;
        a.out = cs->att + (size_t)t0 * (size_t)qd;
        if (k->d.rb) {
            spx_kvl_ref_args r = ref_args(k, a, nh);
            SPX_CUDA_TRY(e, spx_kvl_attention(r.a, st));
            SPX_CUDA_TRY(e, spx_kvl_refine(r, st));
        } else
            SPX_CUDA_TRY(e, spx_kvl_attention(a, st));
    }
    return SPX_OK;
}

spx_status cu_kvl_commit(cu_sess *cs, int n, cudaStream_t st, spx_err *e) {
    cu_kvl *k = cs->kvl;
    SPX_CUDA_TRY(e, spx_kvl_encode(k->d, cs->d_pos, n, st));
    if (k->d.rb) SPX_CUDA_TRY(e, cudaMemcpyAsync(k->stats_h, k->d.stats, 16, cudaMemcpyDeviceToHost, st));
    return SPX_OK;
}

/* Before a pass at p0 (host order, before it is enqueued): the counters
 * the last passes left, and the ring rows of [enc(p0), p0) when a
 * truncate went back into a block encoded since and later positions
 * have overwritten those rows (more than ring - 128 positions back):
 * decoded from their codes and refinement as spx_kvlow_truncate does.
 * Rows the ring still holds keep their fp16 values. */
spx_status cu_kvl_before(spx_session *s, cu_sess *cs, int64_t p0, int n, spx_err *e) {
    cu_kvl *k = cs->kvl;
    if (k->d.rb) {
        s->kv.low.stats.groups_refined = k->stats_h[0];
        s->kv.low.stats.bytes_read = k->stats_h[1];
    }
    const int64_t e0 = spx_kvl_enc(p0);
    if (p0 < k->hi && k->hi - k->d.ring > e0 && spx_kvl_enc(k->hi) > e0 && p0 > e0)
        SPX_CUDA_TRY(e, spx_kvl_decode_back(k->d, e0, p0, cs->st));
    k->hi = p0 + n;
    return SPX_OK;
}
