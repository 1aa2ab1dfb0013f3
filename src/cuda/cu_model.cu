/* cu_model.cu: model_init / model_free of the CUDA backend: every matrix
 * uploaded component by component as laid out in the .trdc map, slot by
 * slot (model/arch.h), into one device allocation; a row-major matrix the
 * tiled layout can hold (a version-1 file, or one written with --layout
 * rows) is tiled on the host on the way (dev_tiled), so the decode GEMV has
 * one fast kernel and the row-major one serves only widths that are not a
 * multiple of 128; the residency decision (resident or ping-pong) from the
 * device budget. */
#include "cuda/cu_backend.cuh"

struct uploader {
    uint8_t *base;
    size_t off;
    int dry;
    int host;                 /* base is (pinned) host memory: plain copies */
    cudaError_t err;
};

/* One component at the next aligned offset (engine/memory.h's layout, which
 * the planner sizes with). */
static void *up_take(uploader *u, const void *src, size_t n) {
    const size_t o = spx_mem_take(&u->off, n);
    if (u->dry) return NULL;
    if (u->host) {
        if (n) memcpy(u->base + o, src, n);
        memset(u->base + o + n, 0, SPX_MEM_SLACK);
    } else if (n && u->err == cudaSuccess) {
        u->err = cudaMemcpy(u->base + o, src, n, cudaMemcpyHostToDevice);
    }
    return u->base + o;
}

static float *up_vec(uploader *u, const float *v, int64_t n) {
    return v ? (float *)up_take(u, v, (size_t)n * sizeof(float)) : NULL;
}

static bool dev_tiled(const spx_qtensor *q) { return spx_mem_dev_tiled(q) != 0; }

static spx_dqmat up_mat(uploader *u, const spx_wmat *w) {
    const spx_qtensor *q = &w->q;
    spx_qtensor tq;
    void *mem = NULL;
    if (q->layout != SPX_Q_TILED && dev_tiled(q)) { /* sizes from the tiled layout; a dry run tiles nothing */
        tq = *q;
        tq.layout = SPX_Q_TILED;
        if (!u->dry) {
            spx_err te;
            const spx_status ts = q->bits == 4 ? spx_q_tile_alloc(q, &tq, &mem, &te) : spx_cu_tile_lowbit(q, &tq, &mem, &te);
            if (ts != SPX_OK && u->err == cudaSuccess) u->err = cudaErrorMemoryAllocation;
        }
        q = &tq;
    }
    spx_dqmat d;
    memset(&d, 0, sizeof d);
    d.rows = q->rows;
    d.cols = q->cols;
    d.n_groups = (int)(q->cols / SPX_CUDA_GROUP);
    d.zrow = (d.n_groups + 1) / 2;
    d.n_out = (int)q->n_outliers;
    d.tiled = q->layout == SPX_Q_TILED;
    d.bits = (int)q->bits;
    size_t parts[5];
    spx_mem_mat_parts(q, parts);
    d.codes = (const uint8_t *)up_take(u, q->codes, parts[0]);
    d.scales = (const __half *)up_take(u, q->scales, parts[1]);
    d.zeros = (const uint8_t *)up_take(u, q->zeros, parts[2]);
    if (d.n_out > 0) {
        d.oidx = (const int32_t *)up_take(u, q->outlier_idx, parts[3]);
        d.oval = (const __half *)up_take(u, q->outlier_val, parts[4]);
    }
    free(mem);
    return d;
}

static spx_status check_mat(const spx_model *m, const spx_wmat *w, const char *name, spx_err *e) {
    if (w->kind != SPX_WM_QUANT)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: matrix '%s' is dense %s; the cuda backend runs 4-bit .trdc models: compress first "
                        "(spectra compress -m MODEL -o MODEL.trdc)",
                        m->path, name, spx_dtype_name(w->dtype));
    const spx_qtensor *q = &w->q;
    if ((q->bits != 4 && q->bits != 3 && q->bits != 2) || q->group != SPX_CUDA_GROUP)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: matrix '%s' has %d-bit codes in groups of %d; the cuda backend runs 2, 3 and 4 bits in "
                        "groups of 32 (recompress with --group 32)",
                        m->path, name, (int)q->bits, (int)q->group);
    if (q->bits != 4 && !dev_tiled(q))
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: matrix '%s' is [%lld, %lld] with %d-bit codes; the cuda backend runs 2 and 3 bits on "
                        "widths that are a multiple of 128 only (recompress with --bits 4)",
                        m->path, name, (long long)q->rows, (long long)q->cols, (int)q->bits);
    if (q->cols % SPX_CUDA_GROUP || q->cols > SPX_GEMV_MAX_COLS || q->rows >= ((int64_t)1 << 31))
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: matrix '%s' is [%lld, %lld]; the cuda backend needs cols <= %d",
                        m->path, name, (long long)q->rows, (long long)q->cols, SPX_GEMV_MAX_COLS);
    return SPX_OK;
}

/* Whether the decode GEMVs run as blocks of two warp groups sharing one
 * input image (spx_gemv_args.groups): for all of a model's launches or for
 * none, since mixing the two forms in one step costs more than either gains;
 * it pays only when every launch has enough tiles per SM (the 8B shape, not
 * the 1B: bench/gpu/NOTES.md 28). So: every launch tiled with at least 1.9
 * tiles (16 rows) per SM. */
static int gemv_groups_for(const spx_model *m, int n_sm) {
    auto tiles = [](const spx_wmat &w) { return (w.q.rows + 15) / 16; };
    auto ok = [&](int64_t t) { return t * 10 >= (int64_t)n_sm * 19; };
    if (!dev_tiled(&m->lm_head.q) || !ok(tiles(m->lm_head))) return 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const spx_wmat *W = m->layers[l].w;
        for (int s = 0; s < SPX_SL_COUNT; s++)
            if (spx_slots[s].mat && W[s].rows && !dev_tiled(&W[s].q)) return 0;
        if (!ok(tiles(W[SPX_SL_Q]) + tiles(W[SPX_SL_K]) + tiles(W[SPX_SL_V])) || !ok(tiles(W[SPX_SL_O])) ||
            !ok(tiles(W[SPX_SL_GATE]) + tiles(W[SPX_SL_UP])) || !ok(tiles(W[SPX_SL_DOWN])))
            return 0;
    }
    return 1;
}

/* The decode GEMV launches of layer l: q/k/v one launch and separate
 * gate/up one (each set has one width, so one device layout); every other
 * matrix is a launch of its own. Shared memory bounds a launch's outlier
 * count (spx_gemv_q4_fits), so each launch is checked here, at load. */
static spx_status check_launches(const spx_model *m, int64_t l, spx_err *e) {
    const spx_wmat *W = m->layers[l].w;
    const spx_qtensor *q = &W[SPX_SL_Q].q, *k = &W[SPX_SL_K].q, *v = &W[SPX_SL_V].q, *g = &W[SPX_SL_GATE].q,
                      *u = &W[SPX_SL_UP].q;
    const bool attn = W[SPX_SL_Q].rows > 0, sep = W[SPX_SL_GATE].rows > 0; /* separate gate and up */
    bool bad = (attn && !spx_gemv_q4_fits(q->cols, q->n_outliers + k->n_outliers + v->n_outliers)) ||
               (sep && !spx_gemv_q4_fits(g->cols, g->n_outliers + u->n_outliers));
    for (int s = 0; s < SPX_SL_COUNT && !bad; s++) {
        if (!spx_slots[s].mat || !W[s].rows || s == SPX_SL_Q || s == SPX_SL_K || s == SPX_SL_V ||
            (sep && (s == SPX_SL_GATE || s == SPX_SL_UP)))
            continue;
        bad = !spx_gemv_q4_fits(W[s].q.cols, W[s].q.n_outliers);
    }
    if (bad)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: layer %lld: a matrix has more outlier columns than the cuda decode GEMV takes at its "
                        "width (its shared memory); recompress with fewer outliers (spectra compress --outliers)",
                        m->path, (long long)l);
    return SPX_OK;
}

/* Uploads (or, dry, sizes) layer l's components into *D. */
static void upload_layer(uploader *u, const spx_model *m, int64_t l, cu_layer *D) {
    const spx_layer *L = &m->layers[l];
    for (int s = 0; s < SPX_SL_COUNT; s++) {
        if (spx_slots[s].mat) D->w[s] = L->w[s].rows ? up_mat(u, &L->w[s]) : spx_dqmat{};
        else D->v[s] = up_vec(u, L->v[s], spx_slot_numel(&m->cfg, l, (spx_slot)s));
    }
}

/* Uploads (or, dry, sizes) the global tensors and layers [0, n_layers). */
static void upload_all(uploader *u, const spx_model *m, cu_model *cm, int64_t n_layers) {
    const spx_config *c = &m->cfg;
    cm->embed = up_mat(u, &m->embed);
    if (spx_mem_head_shared(m)) cm->lm_head = cm->embed;
    else cm->lm_head = up_mat(u, &m->lm_head);
    cm->final_norm = up_vec(u, m->final_norm, c->hidden_size);
    cm->inv_freq = up_vec(u, m->rope_inv_freq, c->head_dim / 2);
    for (int64_t l = 0; l < n_layers; l++) upload_layer(u, m, l, &cm->layers[l]);
}

static size_t round256(size_t n) { return (n + SPX_MEM_ALIGN - 1) & ~(size_t)(SPX_MEM_ALIGN - 1); }

/* Sets cm->n_resident from SPECTRA_CUDA_RESIDENT_LAYERS, the model params,
 * or else the planner's decision (engine/plan.h) for this device's free
 * memory, the requested budget, context and KV type: the planner is the
 * only residency policy and sizes with engine/memory.h, as this file
 * uploads. */
static spx_status choose_residency(const spx_model *m, cu_model *cm, size_t free_b, size_t total_b, spx_err *e) {
    const int64_t L = m->cfg.n_layers;
    const spx_tuning *t = spx_tuning_get();
    if (t->cuda_resident_layers != -1) {
        const long long k = t->cuda_resident_layers;
        if (k < 0)
            return spx_fail(e, SPX_ERR_ARG, "SPECTRA_CUDA_RESIDENT_LAYERS='%s': expected a layer count >= 0",
                            t->cuda_resident_layers_text);
        cm->n_resident = k < L ? (int64_t)k : L;
        return SPX_OK;
    }
    if (m->pingpong) {
        int64_t k = m->n_layers_resident;
        cm->n_resident = k < 0 ? 0 : k < L ? k : L;
        return SPX_OK;
    }
    spx_hw hw;
    memset(&hw, 0, sizeof hw);
    hw.cuda_built = true;
    hw.n_gpus = 1;
    hw.gpus[0].index = cm->dev;
    snprintf(hw.gpus[0].name, sizeof hw.gpus[0].name, "cuda device %d", cm->dev);
    hw.gpus[0].mem_free = free_b;
    hw.gpus[0].mem_total = total_b;
    spx_plan_request r;
    memset(&r, 0, sizeof r);
    r.backend = "cuda";
    r.n_ctx = m->plan_n_ctx;
    r.vram_budget_mb = m->vram_budget_mb;
    r.kv = m->plan_kv;
    spx_plan p;
    spx_err pe;
    if (spx_plan_make(&hw, m, &r, &p, &pe) != SPX_OK)
        return spx_fail(e, pe.code == SPX_ERR_RANGE ? SPX_ERR_NOMEM : pe.code, "%s: %s", m->path, pe.msg);
    cm->n_resident = p.n_layers_resident < L ? p.n_layers_resident : L;
    return SPX_OK;
}

void cu_model_free(spx_model *m) {
    cu_model *cm = (cu_model *)m->be_state;
    if (!cm) return;
    cudaSetDevice(cm->dev);
    spx_gemm_cublas_destroy(cm->cublas);
    cu_refine_free(cm);
    if (cm->arena) cudaFree(cm->arena);
    if (cm->host) cudaFreeHost(cm->host);
    free(cm->img_off);
    free(cm->img_bytes);
    free(cm->layers);
    free(cm);
    m->be_state = NULL;
}

static spx_status cu_model_init_inner(spx_model *m, cu_model *cm, spx_err *e) {
    const spx_config *c = &m->cfg;
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev < 1) {
        cudaGetLastError();
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: no CUDA device is available (%s); use --backend cpu", m->path,
                        ce != cudaSuccess ? cudaGetErrorString(ce) : "device count 0");
    }
    cm->dev = 0;
    SPX_CUDA_TRY(e, cudaSetDevice(cm->dev));
    SPX_CUDA_TRY(e, cudaDeviceGetAttribute(&cm->n_sm, cudaDevAttrMultiProcessorCount, cm->dev));
    const spx_tuning *tune = spx_tuning_get();
    cm->pdl = tune->cuda_pdl != 0;             /* benchmarking knob: SPECTRA_CUDA_PDL=0 turns PDL off */
    cm->kvq4_fuse = tune->cuda_kvq4_fuse != 0; /* SPECTRA_CUDA_KVQ4_FUSE=0 keeps rope_store for --kv q4 */

    if (c->head_dim > SPX_ATTN_MAX_HD || c->head_dim % 2 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: head_dim %lld with %lld heads / %lld KV heads; the cuda backend needs an even head_dim <= "
                        "%d and heads a multiple of KV heads",
                        m->path, (long long)c->head_dim, (long long)c->n_heads, (long long)c->n_kv_heads,
                        SPX_ATTN_MAX_HD);
    SPX_TRY(cu_forward_check(m, e));
    char nm[160];
    SPX_TRY(check_mat(m, &m->embed, spx_arch_embed_name(c), e));
    SPX_TRY(check_mat(m, &m->lm_head, spx_arch_lm_head_name(c), e));
    for (int64_t l = 0; l < c->n_layers; l++) {
        for (int s = 0; s < SPX_SL_COUNT; s++) {
            if (!spx_slots[s].mat || !m->layers[l].w[s].rows) continue;
            spx_slot_tensor_name(c, l, (spx_slot)s, nm, sizeof nm);
            SPX_TRY(check_mat(m, &m->layers[l].w[s], nm, e));
        }
        SPX_TRY(check_launches(m, l, e));
    }
    cm->gemv_groups = gemv_groups_for(m, cm->n_sm);
    /* SPECTRA_GEMV_PAIR (measurements, tests): 0 stores silu(gate) and up apart, 1 pairs them in every model */
    cm->gemv_pair = tune->gemv_pair >= 0 ? tune->gemv_pair : cm->gemv_groups;
    if (m->lm_head.q.layout == SPX_Q_TILED && !spx_gemv_q4_fits(m->lm_head.q.cols, m->lm_head.q.n_outliers))
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: lm_head.weight is tiled with %lld outlier columns, more than the decode GEMV takes at "
                        "width %lld (recompress with --layout rows)",
                        m->path, (long long)m->lm_head.q.n_outliers, (long long)m->lm_head.q.cols);
    const int64_t n_layers = c->n_layers;
    cm->layers = (cu_layer *)calloc((size_t)n_layers, sizeof *cm->layers);
    cm->img_off = (size_t *)calloc((size_t)n_layers, sizeof *cm->img_off);
    cm->img_bytes = (size_t *)calloc((size_t)n_layers, sizeof *cm->img_bytes);
    if (!cm->layers || !cm->img_off || !cm->img_bytes) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");

    /* sizes (engine/memory.h): the global tensors, then each layer's image
     * from an aligned start */
    const size_t glob = round256(spx_mem_global_image(m));
    for (int64_t l = 0; l < n_layers; l++) cm->img_bytes[l] = spx_mem_layer_image(m, l);
    size_t free_b = 0, total_b = 0;
    SPX_CUDA_TRY(e, cudaMemGetInfo(&free_b, &total_b));
    SPX_TRY(choose_residency(m, cm, free_b, total_b, e));
    const int64_t k = cm->n_resident;

    cm->arena_bytes = glob;
    for (int64_t l = 0; l < k; l++) cm->arena_bytes += round256(cm->img_bytes[l]);
    if (cm->arena_bytes > free_b)
        return spx_fail(e, SPX_ERR_NOMEM,
                        "%s: the embedding, LM head and %lld resident layers need %.1f MiB of device memory; %.1f MiB "
                        "are free (a smaller --vram-budget streams more layers)",
                        m->path, (long long)k, mib(cm->arena_bytes), mib(free_b));
    cudaError_t ce2 = cudaMalloc((void **)&cm->arena, cm->arena_bytes);
    if (ce2 != cudaSuccess) {
        cudaGetLastError();
        cm->arena = NULL;
        return spx_fail(e, SPX_ERR_NOMEM, "%s: cudaMalloc of the %.1f MiB weight arena failed: %s", m->path,
                        mib(cm->arena_bytes), cudaGetErrorString(ce2));
    }
    uploader u;
    memset(&u, 0, sizeof u);
    u.dry = 1; /* engine/memory.h sized the arena: the uploader must agree, checked before a byte is copied */
    upload_all(&u, m, cm, k);
    if (u.off > cm->arena_bytes)
        return spx_fail(e, SPX_ERR_INTERNAL, "%s: the weights take %zu bytes, engine/memory.h sized %zu", m->path, u.off,
                        cm->arena_bytes);
    memset(&u, 0, sizeof u);
    u.base = cm->arena;
    upload_all(&u, m, cm, k);
    SPX_CUDA_TRY(e, u.err);

    if (k < n_layers) { /* the streamed layers: one pinned block, an image per layer */
        size_t off = 0;
        cm->slot_bytes = 0;
        cm->stream_bytes = 0;
        for (int64_t l = k; l < n_layers; l++) {
            cm->img_off[l] = off;
            off += round256(cm->img_bytes[l]);
            cm->stream_bytes += cm->img_bytes[l];
            if (round256(cm->img_bytes[l]) > cm->slot_bytes) cm->slot_bytes = round256(cm->img_bytes[l]);
        }
        cm->host_bytes = off;
        ce2 = cudaMallocHost((void **)&cm->host, cm->host_bytes);
        if (ce2 != cudaSuccess) {
            cudaGetLastError();
            cm->host = NULL;
            return spx_fail(e, SPX_ERR_NOMEM,
                            "%s: ping-pong offload: cudaMallocHost of %.1f MiB of pinned host memory for %lld "
                            "streamed layers failed: %s (free RAM, or keep more layers on the device)",
                            m->path, mib(cm->host_bytes), (long long)(n_layers - k), cudaGetErrorString(ce2));
        }
        for (int64_t l = k; l < n_layers; l++) {
            memset(&u, 0, sizeof u);
            u.host = 1;
            u.base = cm->host + cm->img_off[l];
            upload_layer(&u, m, l, &cm->layers[l]);
        }
        spx_log(2, "cuda: ping-pong offload: %lld of %lld layers resident (%.1f MiB), %lld stream from %.1f MiB of "
                   "pinned memory through 2 slots of %.1f MiB",
                (long long)k, (long long)n_layers, mib(cm->arena_bytes), (long long)(n_layers - k),
                mib(cm->host_bytes), mib(cm->slot_bytes));
    }
    SPX_CUDA_TRY(e, spx_gemv_q4_setup(m->max_cols));
    SPX_CUDA_TRY(e, spx_attention_setup());
    cm->cublas = spx_gemm_cublas_create(); /* NULL: prefill stays on gemm_q4.cu's kernel */
    return SPX_OK;
}

spx_status cu_model_init(spx_model *m, spx_err *e) {
    cu_model *cm = (cu_model *)calloc(1, sizeof *cm);
    if (!cm) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    m->be_state = cm;
    spx_status st = cu_model_init_inner(m, cm, e);
    if (st != SPX_OK) cu_model_free(m);
    return st;
}
