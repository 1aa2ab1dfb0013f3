/* backend.cu: the CUDA backend (spx_backend table, engine/backend.h).
 *
 * model_init uploads every quantized matrix component by component exactly
 * as laid out in the .trdc map (codes, fp16 scales, packed zero nibbles,
 * outlier indices and values: no re-layout) into one device allocation,
 * plus norm gains, biases and RoPE frequencies as float32. Dense matrices
 * are refused ("compress first"): this backend runs 4-bit G32 .trdc models.
 *
 * session_init allocates the device KV cache (fp16, the CPU's layout, or
 * with --kv q4 the CPU's 4-bit rows split into code/scale/zero planes,
 * kvq4_math.h) and
 * scratch for SPX_BATCH_MAX_CUDA tokens. forward(n) runs the same math as the
 * CPU reference (engine/forward.c): n == 1 through the fused GEMV path
 * (RMSNorm in the GEMV prologue, merged Q/K/V launch, residual adds and
 * SwiGLU in GEMV epilogues, RoPE and the fp16 KV store in the decode
 * attention kernel), n >= 2 through the tensor-core GEMM. Every
 * kernel reads the position (and the embedding its token ids) from device
 * memory, so step_greedy captures one decode step (ending with the argmax
 * and the position advance on the device) in a CUDA graph once per
 * session and replays it; only the next token id comes back to the host.
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
 * The single-token kernels are chained with programmatic dependent launch
 * (each fetches its first weights before waiting for the previous one);
 * SPECTRA_CUDA_PDL=0 turns that off (for measurements). The decode
 * attention kernel does rope_store's work (q/k norm, RoPE, the store of
 * the token's K/V row, quantized for --kv q4); SPECTRA_CUDA_KVQ4_FUSE=0
 * keeps rope_store's launch for the 4-bit cache (measurements).
 *
 * Limits: one device (the first); KV cache fp16 or q4 (--kv f32 is refused
 * with a message); head_dim <= 256; cols <= SPX_GEMV_MAX_COLS.
 * The host-side KV cache and scratch that api.c allocates for every
 * session stay unused here. */
#include "cuda/act.cuh"
#include "cuda/attention.cuh"
#include "cuda/cuda_check.h"
#include "cuda/embed.cuh"
#include "cuda/gemm_cublas.cuh"
#include "cuda/gemm_q4.cuh"
#include "cuda/gemv_q4.cuh"
#include "cuda/norm.cuh"
#include "cuda/rope.cuh"
#include "cuda/sample.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "core/dtype.h"
#include "engine/backend.h"
#include "engine/plan.h"
#include "engine/session.h"
}

/* ---- per-model device state ------------------------------------------- */

/* A layer on the device by slot (model/arch.h): w[s] for matrix slots,
 * v[s] for vectors; absent slots are zero / NULL. */
struct cu_layer {
    spx_dqmat w[SPX_SL_COUNT];
    float *v[SPX_SL_COUNT];
};

struct cu_model {
    int dev, n_sm;
    bool pdl;                 /* decode kernels use programmatic dependent launch */
    bool kvq4_fuse;           /* --kv q4 decode: RoPE and the row's store in the attention kernel */
    int gemv_groups;          /* spx_gemv_args.groups for every decode GEMV (gemv_groups_for) */
    int gemv_pair;            /* tiled gate/up as spx_gemv_args.pair: with gemv_groups (SPECTRA_GEMV_PAIR=0/1) */
    uint8_t *arena;
    size_t arena_bytes;
    cu_layer *layers;
    spx_dqmat embed, lm_head;
    float *final_norm, *inv_freq;
    void *cublas;             /* cuBLAS handle of the prefill GEMM, or NULL (gemm_q4.cu's kernel) */
    /* ping-pong offload: layers [n_resident, n_layers) stream; their cu_layer
     * pointers point into host (the image of layer l starts at img_off[l]) */
    int64_t n_resident;
    uint8_t *host;            /* pinned */
    size_t host_bytes;
    size_t *img_off, *img_bytes; /* [n_layers]; set for streamed layers */
    size_t slot_bytes;        /* largest streamed image, rounded up to 256 */
    uint64_t stream_bytes;    /* sum of the streamed images: copied per forward pass */
};

/* Two passes over the weights: the first (dry) sizes the arena, the second
 * copies. Every component starts 256-byte aligned. */
struct uploader {
    uint8_t *base;
    size_t off;
    int dry;
    int host;                 /* base is (pinned) host memory: plain copies */
    cudaError_t err;
};

static void *up_take(uploader *u, const void *src, size_t n) {
    size_t o = (u->off + 255) & ~(size_t)255;
    u->off = o + n + 16; /* slack: the GEMV reads scale/zero words aligned down */
    if (u->dry) return NULL;
    if (u->host) {
        if (n) memcpy(u->base + o, src, n);
        memset(u->base + o + n, 0, 16);
    } else if (n && u->err == cudaSuccess) {
        u->err = cudaMemcpy(u->base + o, src, n, cudaMemcpyHostToDevice);
    }
    return u->base + o;
}

static float *up_vec(uploader *u, const float *v, int64_t n) {
    return v ? (float *)up_take(u, v, (size_t)n * sizeof(float)) : NULL;
}

static spx_dqmat up_mat(uploader *u, const spx_wmat *w) {
    const spx_qtensor *q = &w->q;
    spx_dqmat d;
    memset(&d, 0, sizeof d);
    d.rows = q->rows;
    d.cols = q->cols;
    d.n_groups = (int)(q->cols / SPX_CUDA_GROUP);
    d.zrow = (d.n_groups + 1) / 2;
    d.n_out = (int)q->n_outliers;
    d.tiled = q->layout == SPX_Q_TILED;
    size_t r = (size_t)q->rows;
    d.codes = (const uint8_t *)up_take(u, q->codes, (size_t)spx_q_codes_bytes(q->rows, q->cols, 4, q->layout));
    d.scales = (const __half *)up_take(u, q->scales, (size_t)spx_q_scales_bytes(q->rows, q->cols, 32, q->layout));
    d.zeros = (const uint8_t *)up_take(u, q->zeros, (size_t)spx_q_zeros_bytes(q->rows, q->cols, 32, q->layout));
    if (d.n_out > 0) {
        d.oidx = (const int32_t *)up_take(u, q->outlier_idx, (size_t)d.n_out * 4);
        d.oval = (const __half *)up_take(u, q->outlier_val, r * (size_t)d.n_out * 2);
    }
    return d;
}

static spx_status check_mat(const spx_model *m, const spx_wmat *w, const char *name, spx_err *e) {
    if (w->kind != SPX_WM_QUANT)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: matrix '%s' is dense %s; the cuda backend runs 4-bit .trdc models: compress first "
                        "(spectra compress -m MODEL -o MODEL.trdc)",
                        m->path, name, spx_dtype_name(w->dtype));
    const spx_qtensor *q = &w->q;
    if (q->bits != 4 || q->group != SPX_CUDA_GROUP)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: matrix '%s' has %d-bit codes in groups of %d; the cuda backend runs 4 bits in groups of "
                        "32 (recompress with --bits 4 --group 32)",
                        m->path, name, (int)q->bits, (int)q->group);
    if (q->cols % SPX_CUDA_GROUP || q->cols > SPX_GEMV_MAX_COLS || q->rows >= ((int64_t)1 << 31))
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: matrix '%s' is [%lld, %lld]; the cuda backend needs cols <= %d",
                        m->path, name, (long long)q->rows, (long long)q->cols, SPX_GEMV_MAX_COLS);
    return SPX_OK;
}

/* Whether the decode GEMVs run as blocks of two warp groups sharing one
 * input image (spx_gemv_args.groups): for all of a model's launches or for
 * none, since mixing the two forms in one step costs more than either gains
 * (H200: Llama-3.1-8B 490.1 tok/s all, 486.6 all but the LM head, 481.7
 * none; Llama-3.2-1B, whose O, down and q/k/v launches have fewer tiles than
 * two per SM, 1,798 none, 1,723 all; bench/gpu/NOTES.md 28). So: every launch
 * tiled with at least 1.9 tiles (16 rows) per SM. */
static int gemv_groups_for(const spx_model *m, int n_sm) {
    auto tiles = [](const spx_wmat &w) { return (w.q.rows + 15) / 16; };
    auto ok = [&](int64_t t) { return t * 10 >= (int64_t)n_sm * 19; };
    if (m->lm_head.q.layout != SPX_Q_TILED || !ok(tiles(m->lm_head))) return 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const spx_wmat *W = m->layers[l].w;
        for (int s = 0; s < SPX_SL_COUNT; s++)
            if (W[s].rows && W[s].q.layout != SPX_Q_TILED) return 0;
        if (!ok(tiles(W[SPX_SL_Q]) + tiles(W[SPX_SL_K]) + tiles(W[SPX_SL_V])) || !ok(tiles(W[SPX_SL_O])) ||
            !ok(tiles(W[SPX_SL_GATE]) + tiles(W[SPX_SL_UP])) || !ok(tiles(W[SPX_SL_DOWN])))
            return 0;
    }
    return 1;
}

/* The decode GEMV launches of layer l: q/k/v one launch and gate/up one,
 * so each set shares a layout; tiled launches (and the down projection's
 * silu(gate) * up input after tiled gate/up) run only on the tensor-core
 * kernels, whose shared memory bounds the outlier count. */
static spx_status check_launches(const spx_model *m, int64_t l, spx_err *e) {
    const spx_wmat *W = m->layers[l].w;
    const spx_qtensor *q = &W[SPX_SL_Q].q, *k = &W[SPX_SL_K].q, *v = &W[SPX_SL_V].q, *g = &W[SPX_SL_GATE].q,
                      *u = &W[SPX_SL_UP].q, *d = &W[SPX_SL_DOWN].q, *o = &W[SPX_SL_O].q;
    if (q->layout != k->layout || q->layout != v->layout || g->layout != u->layout)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: layer %lld mixes tiled and row-major matrices in q/k/v or gate/up; the cuda backend "
                        "needs one layout per set (recompress with spectra compress)",
                        m->path, (long long)l);
    const bool tq = q->layout == SPX_Q_TILED, tg = g->layout == SPX_Q_TILED;
    if ((tq && !spx_gemv_q4_fits(q->cols, q->n_outliers + k->n_outliers + v->n_outliers)) ||
        (o->layout == SPX_Q_TILED && !spx_gemv_q4_fits(o->cols, o->n_outliers)) ||
        (tg && !spx_gemv_q4_fits(g->cols, g->n_outliers + u->n_outliers)) ||
        ((tg || d->layout == SPX_Q_TILED) && !spx_gemv_q4_fits(d->cols, d->n_outliers)))
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: layer %lld: a tiled matrix has more outlier columns than the decode GEMV takes at its "
                        "width (recompress with --layout rows)",
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
    if (m->lm_head.kind == SPX_WM_QUANT && m->lm_head.q.codes == m->embed.q.codes) cm->lm_head = cm->embed;
    else cm->lm_head = up_mat(u, &m->lm_head);
    cm->final_norm = up_vec(u, m->final_norm, c->hidden_size);
    cm->inv_freq = up_vec(u, m->rope_inv_freq, c->head_dim / 2);
    for (int64_t l = 0; l < n_layers; l++) upload_layer(u, m, l, &cm->layers[l]);
}

static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

/* The context the sessions are planned for (the plan's, else min(model
 * maximum, SPX_PLAN_DEFAULT_CTX)), and what a session of T tokens takes
 * on the device beside the weights (KV cache of the planned type, scratch). */
static int64_t planned_ctx(const spx_model *m) {
    const spx_config *c = &m->cfg;
    if (m->plan_n_ctx > 0) return m->plan_n_ctx;
    return c->max_pos > 0 && c->max_pos < SPX_PLAN_DEFAULT_CTX ? c->max_pos : SPX_PLAN_DEFAULT_CTX;
}

static uint64_t session_bytes(const spx_model *m, int64_t T) {
    const spx_config *c = &m->cfg;
    const spx_kv_type kv = m->plan_kv == SPX_KV_DEFAULT ? SPX_KV_F16 : m->plan_kv;
    return (uint64_t)spx_kv_bytes_per_token(kv, c->n_layers, c->n_kv_heads * c->head_dim) * (uint64_t)T +
           spx_plan_cuda_scratch_bytes(m, T);
}

/* Sets cm->n_resident from SPECTRA_CUDA_RESIDENT_LAYERS, the model params,
 * or engine/plan.h's memory model with the real image sizes: every layer if
 * weights + KV(T) + scratch(T) fit the budget, else the first layers that
 * fit beside the globals, two slots of the largest image, KV and scratch.
 * glob: bytes of the global tensors; cm->img_bytes filled. */
static spx_status choose_residency(const spx_model *m, cu_model *cm, size_t glob, size_t free_b, spx_err *e) {
    const spx_config *c = &m->cfg;
    const int64_t L = c->n_layers;
    uint64_t all = glob, slot = 0;
    for (int64_t l = 0; l < L; l++) {
        all += round256(cm->img_bytes[l]);
        if (round256(cm->img_bytes[l]) > slot) slot = round256(cm->img_bytes[l]);
    }
    const char *env = getenv("SPECTRA_CUDA_RESIDENT_LAYERS");
    if (env && *env) {
        char *end = NULL;
        long long k = strtoll(env, &end, 10);
        if (*end || k < 0)
            return spx_fail(e, SPX_ERR_ARG, "SPECTRA_CUDA_RESIDENT_LAYERS='%s': expected a layer count >= 0", env);
        cm->n_resident = k < L ? (int64_t)k : L;
        return SPX_OK;
    }
    if (m->pingpong) {
        int64_t k = m->n_layers_resident;
        cm->n_resident = k < 0 ? 0 : k < L ? k : L;
        return SPX_OK;
    }
    uint64_t budget;
    char src[96];
    if (m->vram_budget_mb > 0) {
        budget = (uint64_t)m->vram_budget_mb << 20;
        snprintf(src, sizeof src, "the budget");
        if (budget > free_b) {
            budget = free_b;
            snprintf(src, sizeof src, "the budget, capped at the free memory");
        }
    } else {
        budget = free_b > SPX_PLAN_VRAM_MARGIN ? free_b - SPX_PLAN_VRAM_MARGIN : 0;
        snprintf(src, sizeof src, "%.0f MiB free - %.0f MiB margin", mib(free_b), mib(SPX_PLAN_VRAM_MARGIN));
    }
    const int64_t T = planned_ctx(m);
    uint64_t ctx = session_bytes(m, T);
    if (all + ctx <= budget) {
        cm->n_resident = L;
        return SPX_OK;
    }
    uint64_t used = glob + 2 * slot + ctx;
    if (used > budget)
        return spx_fail(e, SPX_ERR_NOMEM,
                        "%s: %.1f MiB of device memory (%s) cannot hold the weights (%.1f MiB) nor ping-pong "
                        "offload: embedding + LM head %.1f MiB, two layer slots 2 x %.1f MiB, KV cache and scratch "
                        "for %lld tokens %.1f MiB need %.1f MiB",
                        m->path, mib(budget), src, mib(all), mib(glob), mib(slot), (long long)T, mib(ctx), mib(used));
    int64_t k = 0;
    while (k < L && used + round256(cm->img_bytes[k]) <= budget) used += round256(cm->img_bytes[k++]);
    cm->n_resident = k;
    return SPX_OK;
}

static void cu_model_free(spx_model *m) {
    cu_model *cm = (cu_model *)m->be_state;
    if (!cm) return;
    cudaSetDevice(cm->dev);
    spx_gemm_cublas_destroy(cm->cublas);
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
    cm->pdl = spx_env_flag("SPECTRA_CUDA_PDL", 1) != 0;              /* benchmarking knob: 0 turns PDL off */
    cm->kvq4_fuse = spx_env_flag("SPECTRA_CUDA_KVQ4_FUSE", 1) != 0; /* 0 keeps rope_store for --kv q4 */

    if (c->head_dim > SPX_ATTN_MAX_HD || c->head_dim % 2 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: head_dim %lld with %lld heads / %lld KV heads; the cuda backend needs an even head_dim <= "
                        "%d and heads a multiple of KV heads",
                        m->path, (long long)c->head_dim, (long long)c->n_heads, (long long)c->n_kv_heads,
                        SPX_ATTN_MAX_HD);
    char nm[160];
    if (!spx_arch_is_llama_blocks(c, nm, sizeof nm))
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: the cuda backend runs attention + SwiGLU layers only and %s; use --backend cpu", m->path, nm);
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
    cm->gemv_pair = spx_env_flag("SPECTRA_GEMV_PAIR", cm->gemv_groups);
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

    /* sizes: the global tensors, then each layer's image from an aligned start */
    uploader u;
    memset(&u, 0, sizeof u);
    u.dry = 1;
    upload_all(&u, m, cm, 0);
    const size_t glob = round256(u.off);
    for (int64_t l = 0; l < n_layers; l++) {
        cu_layer tmp;
        memset(&u, 0, sizeof u);
        u.dry = 1;
        upload_layer(&u, m, l, &tmp);
        cm->img_bytes[l] = u.off;
    }
    size_t free_b = 0, total_b = 0;
    SPX_CUDA_TRY(e, cudaMemGetInfo(&free_b, &total_b));
    SPX_TRY(choose_residency(m, cm, glob, free_b, e));
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

static spx_status cu_model_init(spx_model *m, spx_err *e) {
    cu_model *cm = (cu_model *)calloc(1, sizeof *cm);
    if (!cm) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    m->be_state = cm;
    spx_status st = cu_model_init_inner(m, cm, e);
    if (st != SPX_OK) cu_model_free(m);
    return st;
}

/* ---- per-session device state ------------------------------------------ */

enum { LM_NONE = 0, LM_LAST = 1, LM_ALL = 2, LM_ARGMAX = 3, LM_SAMPLE = 4 };

#define CU_PART_TOK_SPLITS 128 /* n_tok * n_splits bound when splitting */

/* Ping-pong offload state of a session (when its model streams layers):
 * the slots, the copy stream and the events ordering it against the
 * compute stream, all made at session start (events used inside a graph
 * capture must exist before it). */
struct cu_pp {
    cudaStream_t cp;              /* copy stream */
    uint8_t *slots;               /* [n_slots * slot_bytes] */
    cudaEvent_t fork, join;       /* cp starts after, and st continues after, a pass's copies */
    cudaEvent_t copied[2];        /* slot i holds the layer its last copy brought */
    cudaEvent_t used[2];          /* the last kernel reading slot i finished */
    int no_copy;                  /* measurement: compute from the slots as they are (streamed layers 0, 1), no copies */
};

struct cu_sess {
    cudaStream_t st;
    __half *kc, *vc;                 /* [n_layers, n_ctx, kvd]; --kv q4: the bytes of kvq4_math.h's layout */
    float *h, *x, *q, *k, *v, *att, *gate, *up, *logits, *part;
    float *ws;                       /* split-K workspace of the GEMM */
    size_t ws_floats;
    __half *x16;                     /* [B, max(H, qd, I)] */
    __half *w16;                     /* fp16 weight scratch of the cuBLAS prefill GEMM (NULL: gemm_q4.cu's kernel) */
    size_t w16_elems;
    int32_t *d_ids, *d_pos;
    unsigned long long *d_best;
    int *attn_cnt;                   /* [n_heads] the decode attention's split counters (spx_attn_args.cnt) */
    spx_sample_dev *d_samp, *pin_samp; /* sampling parameters and RNG state (device, pinned) */
    cudaGraphExec_t graph_s;           /* the decode step ending with the device sampler */
    int have_graph_s;
    int32_t *pin;                    /* pinned: [B] ids, [B] pos (the next id comes back through ring) */
    cudaGraphExec_t graph;
    int have_graph;
    int dev_known;                   /* device pos/ids[0] mirror the fields below */
    int64_t dev_pos;
    int32_t dev_tok;
    /* Decode steps queued one ahead (cu_step): the argmax or the sampler
     * writes each step's token (and the sampler its RNG state) into ring
     * (mapped pinned memory, 2 x SPX_TOKEN_RING entries) and step_ev[pos & 1]
     * is recorded after the step; pend: the step at pend_pos with input
     * pend_tok is queued, its result not yet read. */
    unsigned long long *ring, *ring_d; /* host and device addresses */
    cudaEvent_t step_ev[2];
    int pend;
    int64_t pend_pos;
    int32_t pend_tok;
    int pend_sampled;                /* the queued step samples, with pend_samp (its parameters and RNG state) */
    spx_sample_dev pend_samp;
    int ahead_ok;                    /* SPECTRA_CUDA_AHEAD=0: never queue a step ahead (measurements) */
    int dec_splits;
    void *allocs[32];                /* every cudaMalloc above, freed in session_free */
    int n_allocs;
    cu_pp pp;                        /* ping-pong offload (see the top of this file) */
};

static cudaError_t sess_alloc(cu_sess *cs, void **p, size_t bytes) {
    *p = NULL;
    if (cs->n_allocs >= (int)(sizeof cs->allocs / sizeof cs->allocs[0])) return cudaErrorInvalidValue;
    cudaError_t err = cudaMalloc(p, bytes ? bytes : 1);
    if (err == cudaSuccess) cs->allocs[cs->n_allocs++] = *p;
    return err;
}

static int64_t pp_n_stream(const spx_model *m, const cu_model *cm) { return m->cfg.n_layers - cm->n_resident; }

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
    int64_t ns = pp_n_stream(s->m, cm);
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

static void cu_session_free(spx_session *s) {
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
    for (int i = 0; i < cs->n_allocs; i++) cudaFree(cs->allocs[i]);
    if (cs->pin) cudaFreeHost(cs->pin);
    if (cs->st) cudaStreamDestroy(cs->st);
    free(cs);
    s->be_state = NULL;
}

/* Key splits of the attention (flash-decoding). A prompt: enough blocks
 * for two per SM. One token (the decode graph, sized for the session's
 * context): one split per 16 key tiles (4 per warp), at least one; on the
 * H200 fewer, longer splits beat one tile per block (8B tg128 at 641 keys:
 * 1 split 412 tok/s, 4: 400, 21: 396; at 8K keys 16 splits 398 against 33:
 * 393), the combine pass and the blocks' fixed costs being what a short
 * split pays for. The decode kernels (spx_attention_decode_fast, either
 * cache) instead take one pass of SPX_ATTN_DECODE_KEYS keys per split up
 * to 64 blocks in all, then more passes per block: its last block merges
 * the splits, and that grows with their count (8B, 8 KV heads, same H200
 * run: 640 keys 2 splits 446.6 tok/s, 3: 450.8, 5: 457.4, 8: 457.4; 8K
 * keys 8 splits 455.3, 12: 447.0, 16: 435.8, 24: 415.0). This is the
 * launch's count for the session's context; at position p the kernels run
 * only the splits p needs (attention.cu ad_active_splits).
 * SPECTRA_CUDA_ATTN_SPLITS=N (benchmarks) sets the count. */
static int splits_for(const cu_model *cm, const spx_config *c, int n_tok, int64_t max_keys) {
    const char *env = getenv("SPECTRA_CUDA_ATTN_SPLITS");
    int bps = spx_attention_blocks_per_split(n_tok, (int)c->n_heads, (int)c->n_kv_heads);
    int64_t S = (2 * (int64_t)cm->n_sm + bps - 1) / bps;
    int64_t tiles = (max_keys + 31) / 32;
    if (S > tiles) S = tiles;
    if (n_tok == 1 && spx_attention_decode_fast((int)c->head_dim)) {
        S = (max_keys + SPX_ATTN_DECODE_KEYS - 1) / SPX_ATTN_DECODE_KEYS;
        if (S > 64 / bps) S = 64 / bps;
    } else if (n_tok == 1 && S > (tiles + 15) / 16) S = (tiles + 15) / 16;
    if (env && atoi(env) > 0) S = atoi(env);
    if (S * n_tok > CU_PART_TOK_SPLITS) S = CU_PART_TOK_SPLITS / n_tok;
    return S < 1 ? 1 : (int)S;
}

static spx_status cu_session_init_inner(spx_session *s, cu_sess *cs, spx_err *e) {
    const spx_model *m = s->m;
    const cu_model *cm = (const cu_model *)m->be_state;
    const spx_config *c = &m->cfg;
    if (s->kv.type != SPX_KV_F16 && s->kv.type != SPX_KV_Q4)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "the cuda backend keeps the KV cache in fp16 (--kv f16) or 4-bit (--kv q4); --kv f32 is not "
                        "supported on the device (use --backend cpu)");
    if (s->n_ctx >= ((int64_t)1 << 31)) return spx_fail(e, SPX_ERR_ARG, "context too large for the cuda backend");
    SPX_CUDA_TRY(e, cudaSetDevice(cm->dev));
    SPX_CUDA_TRY(e, cudaStreamCreateWithFlags(&cs->st, cudaStreamNonBlocking));
    size_t B = SPX_BATCH_MAX_CUDA, H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    size_t hd = (size_t)c->head_dim, qd = (size_t)c->n_heads * hd, kvd = (size_t)c->n_kv_heads * hd;
    size_t V = (size_t)c->vocab_size, L = (size_t)c->n_layers, T = (size_t)s->n_ctx;
    size_t wide = H > qd ? H : qd;
    if (I > wide) wide = I;
    /* q4: kvq4_math.h's planes, spx_kv_bytes_per_token's bytes (+ alignment) */
    size_t kv_bytes = s->kv.type == SPX_KV_Q4 ? L * spx_kvq4_layout_of((int64_t)T, (int64_t)kvd).layer_bytes
                                              : L * T * kvd * 2;
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->kc, kv_bytes));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->vc, kv_bytes));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->h, B * H * 4));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->x, B * wide * 4));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->q, B * qd * 4));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->k, B * kvd * 4));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->v, B * kvd * 4));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->att, B * qd * 4));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->gate, B * I * 4));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->up, B * I * 4));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->logits, (size_t)SPX_BATCH_MAX * V * 4)); /* LM_ALL goes in chunks */
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->part, (size_t)CU_PART_TOK_SPLITS * (size_t)c->n_heads * (hd + 2) * 4));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->x16, B * wide * 2));
    cs->ws_floats = 4 * (size_t)SPX_BATCH_MAX * wide; /* split-K partials: large M needs few splits */
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->ws, cs->ws_floats * 4));
    if (cm->cublas) { /* the largest layer matrix (the LM head goes in row chunks), capped */
        int64_t mx = (int64_t)(qd > kvd ? qd : kvd) * (int64_t)H;
        if ((int64_t)H * (int64_t)qd > mx) mx = (int64_t)H * (int64_t)qd;
        if ((int64_t)I * (int64_t)H > mx) mx = (int64_t)I * (int64_t)H;
        if (mx > SPX_CUDA_W16_MAX_ELEMS) mx = SPX_CUDA_W16_MAX_ELEMS;
        cs->w16_elems = (size_t)mx;
        SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->w16, cs->w16_elems * 2));
    }
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->d_ids, B * 4));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->d_pos, 4));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->d_best, 8));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->attn_cnt, (size_t)c->n_heads * 4));
    SPX_CUDA_TRY(e, cudaMemsetAsync(cs->attn_cnt, 0, (size_t)c->n_heads * 4, cs->st));
    SPX_CUDA_TRY(e, sess_alloc(cs, (void **)&cs->d_samp, sizeof(spx_sample_dev)));
    SPX_CUDA_TRY(e, cudaMallocHost((void **)&cs->pin_samp, sizeof(spx_sample_dev)));
    SPX_CUDA_TRY(e, cudaMallocHost((void **)&cs->pin, (B + 1) * 4));
    SPX_CUDA_TRY(e, cudaHostAlloc((void **)&cs->ring, 2 * SPX_TOKEN_RING * sizeof *cs->ring, cudaHostAllocMapped));
    memset(cs->ring, 0xff, 2 * SPX_TOKEN_RING * sizeof *cs->ring);
    SPX_CUDA_TRY(e, cudaHostGetDevicePointer((void **)&cs->ring_d, cs->ring, 0));
    for (int i = 0; i < 2; i++) SPX_CUDA_TRY(e, cudaEventCreateWithFlags(&cs->step_ev[i], cudaEventDisableTiming));
    {
        const char *env = getenv("SPECTRA_CUDA_AHEAD");
        cs->ahead_ok = !(env && strcmp(env, "0") == 0);
    }
    SPX_CUDA_TRY(e, cudaMemsetAsync(cs->d_best, 0, 8, cs->st));
    SPX_CUDA_TRY(e, cudaMemsetAsync(cs->d_ids, 0, B * 4, cs->st));
    SPX_CUDA_TRY(e, cudaMemsetAsync(cs->d_pos, 0, 4, cs->st));
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    cs->dec_splits = splits_for(cm, c, 1, s->n_ctx);
    return SPX_OK;
}

static spx_status cu_session_init(spx_session *s, spx_err *e) {
    cu_sess *cs = (cu_sess *)calloc(1, sizeof *cs);
    if (!cs) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    s->be_state = cs;
    spx_status st = cu_session_init_inner(s, cs, e);
    if (st == SPX_OK) st = pp_session_init(s, cs, e);
    if (st != SPX_OK) cu_session_free(s);
    return st;
}

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
static spx_status pp_begin(const spx_model *m, const cu_model *cm, cu_sess *cs, spx_err *e) {
    int64_t ns = pp_n_stream(m, cm);
    if (ns <= 0 || cs->pp.no_copy) return SPX_OK;
    SPX_CUDA_TRY(e, cudaEventRecord(cs->pp.fork, cs->st));
    SPX_CUDA_TRY(e, cudaStreamWaitEvent(cs->pp.cp, cs->pp.fork, 0));
    for (int64_t j = 0; j < ns && j < 2; j++) SPX_TRY(pp_copy(cm, cs, j, e));
    return SPX_OK;
}

/* Before the first kernel of streamed layer l: wait for its copy (a full
 * dependency: the first kernel is launched without PDL, and every later
 * kernel of the layer starts after it has). */
static spx_status pp_layer_begin(const cu_model *cm, cu_sess *cs, int64_t l, cu_layer *out, spx_err *e) {
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
static spx_status pp_layer_end(const spx_model *m, const cu_model *cm, cu_sess *cs, int64_t l, spx_err *e) {
    int64_t j = l - cm->n_resident;
    if (cs->pp.no_copy || j + 2 >= pp_n_stream(m, cm)) return SPX_OK;
    SPX_CUDA_TRY(e, cudaEventRecord(cs->pp.used[j & 1], cs->st));
    SPX_CUDA_TRY(e, cudaStreamWaitEvent(cs->pp.cp, cs->pp.used[j & 1], 0));
    return pp_copy(cm, cs, j + 2, e);
}

/* After the layers: the copy stream joins the compute stream (required to
 * end a capture; in eager mode it orders nothing new). */
static spx_status pp_end(const spx_model *m, const cu_model *cm, cu_sess *cs, spx_err *e) {
    if (pp_n_stream(m, cm) <= 0 || cs->pp.no_copy) return SPX_OK;
    SPX_CUDA_TRY(e, cudaEventRecord(cs->pp.join, cs->pp.cp));
    SPX_CUDA_TRY(e, cudaStreamWaitEvent(cs->st, cs->pp.join, 0));
    return SPX_OK;
}

/* Enqueues the forward pass of n tokens (ids in cs->d_ids, position of the
 * first in cs->d_pos) on cs->st. Nothing here reads host state that
 * changes between steps, so it can be captured. */
static spx_status enqueue_forward(spx_session *s, int n, int lmode, int n_splits, spx_err *e) {
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
    SPX_TRY(pp_begin(m, cm, cs, e));
    SPX_CUDA_TRY(e, spx_embed_q4(cm->embed, cs->d_ids, n, cs->h, st, pdl));
    for (int64_t l = 0; l < c->n_layers; l++) {
        const cu_layer *L = &cm->layers[l];
        cu_layer Ls;
        const bool streamed = l >= cm->n_resident;
        if (streamed) {
            SPX_TRY(pp_layer_begin(cm, cs, l, &Ls, e));
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
        if (streamed) SPX_TRY(pp_layer_end(m, cm, cs, l, e));
    }
    SPX_TRY(pp_end(m, cm, cs, e));
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

static spx_status cu_forward(spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e) {
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
    int splits = splits_for(cm, c, (int)n, s->pos + n);
    SPX_TRY(enqueue_forward(s, (int)n, lmode, splits, e));
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
static spx_status capture_graph(spx_session *s, cu_sess *cs, cudaGraphExec_t *out, spx_err *e, int lmode = LM_ARGMAX) {
    SPX_CUDA_TRY(e, cudaStreamBeginCapture(cs->st, cudaStreamCaptureModeRelaxed));
    spx_status st = enqueue_forward(s, 1, lmode, cs->dec_splits, e);
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

static spx_status capture_decode(spx_session *s, cu_sess *cs, spx_err *e) {
    SPX_TRY(capture_graph(s, cs, &cs->graph, e));
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
    if (!sp && !cs->have_graph) SPX_TRY(capture_decode(s, cs, e));
    if (sp && !cs->have_graph_s) {
        SPX_TRY(capture_graph(s, cs, &cs->graph_s, e, LM_SAMPLE));
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
    if (!cs->have_graph) SPX_TRY(capture_decode(s, cs, e));
    SPX_TRY(time_graph(cs, cs->graph, k, t0, t1, &o->t_step_s, e));
    /* 2. the same step without the copies: every streamed layer computes
     * from the slot of its parity, which holds streamed layer 0 or 1 (same
     * shapes; their own outlier counts) */
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    for (int64_t j = 0; j < 2 && j < pp_n_stream(s->m, cm); j++)
        SPX_CUDA_TRY(e, cudaMemcpyAsync(pp_slot(cm, cs, j), cm->host + cm->img_off[cm->n_resident + j],
                                        cm->img_bytes[cm->n_resident + j], cudaMemcpyHostToDevice, cs->st));
    SPX_CUDA_TRY(e, cudaStreamSynchronize(cs->st));
    cs->pp.no_copy = 1;
    spx_status st = capture_graph(s, cs, nocopy, e);
    cs->pp.no_copy = 0;
    SPX_TRY(st);
    SPX_TRY(time_graph(cs, *nocopy, k, t0, t1, &o->t_compute_s, e));
    /* 3. the copies alone */
    int64_t ns = pp_n_stream(s->m, cm);
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
    double h = o->t_copy_s > 0 ? 1.0 - (o->t_step_s - o->t_compute_s) / o->t_copy_s : 0;
    o->hidden_share = h < 0 ? 0 : h > 1 ? 1 : h;
    o->n_steps = k;
    o->measured = 1;
    return SPX_OK;
}

static spx_status cu_offload_stats(spx_session *s, int32_t n_steps, spx_offload_stats *o, spx_err *e) {
    const cu_model *cm = (const cu_model *)s->m->be_state;
    cu_sess *cs = (cu_sess *)s->be_state;
    int64_t ns = pp_n_stream(s->m, cm);
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
    return st;
}

static const spx_backend g_cuda = {
    "cuda",           cu_model_init, cu_model_free, cu_session_init, cu_session_free, cu_forward, cu_step_greedy,
    cu_offload_stats,
    SPX_BATCH_MAX_CUDA,
    1,
    cu_step_sample,
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
