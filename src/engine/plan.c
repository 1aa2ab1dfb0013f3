/* plan.c: the execution plan (see plan.h for the memory model and the
 * order of decisions). */
#include "engine/plan.h"
#include "engine/kvcache.h"
#include "engine/memory.h"
#include "engine/session.h"
#include "model/model.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

/* Writes a reason line into dst[SPX_PLAN_REASON_MAX], truncating. */
static void say(char *dst, const char *fmt, ...) SPX_PRINTF(2, 3);
static void say(char *dst, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, SPX_PLAN_REASON_MAX, fmt, ap);
    va_end(ap);
}

/* ---- sizes -------------------------------------------------------------- */

uint64_t spx_plan_layer_bytes(const spx_model *m, int64_t l) {
    if (!m->layers || l < 0 || l >= m->cfg.n_layers) return 0;
    uint64_t floats = 0;
    for (int s = 0; s < SPX_SL_COUNT; s++)
        if (!spx_slots[s].mat) floats += (uint64_t)spx_slot_numel(&m->cfg, l, (spx_slot)s);
    return spx_layer_matrix_bytes(&m->layers[l]) + 4 * floats;
}

uint64_t spx_plan_global_bytes(const spx_model *m) {
    uint64_t b = spx_wmat_bytes(&m->embed) + 4 * (uint64_t)m->cfg.hidden_size;
    if (!m->cfg.tie_embeddings) b += spx_wmat_bytes(&m->lm_head);
    return b;
}

static uint64_t scratch_fixed(const spx_config *c) {
    uint64_t H = (uint64_t)c->hidden_size, I = (uint64_t)c->intermediate_size, V = (uint64_t)c->vocab_size;
    uint64_t qd = (uint64_t)(c->n_heads * c->head_dim), kvd = (uint64_t)(c->n_kv_heads * c->head_dim);
    return 4 * (uint64_t)SPX_BATCH_MAX * (H + (H > qd ? H : qd) + 2 * qd + 2 * kvd + 2 * I + V);
}

uint64_t spx_plan_scratch_bytes(const spx_model *m, int64_t n_ctx) {
    return scratch_fixed(&m->cfg) + 4 * (uint64_t)m->cfg.n_heads * (uint64_t)(n_ctx > 0 ? n_ctx : 0);
}

/* ---- the CUDA backend's sizes (engine/memory.h: what it allocates) ----- */

static uint64_t round_align(uint64_t n) { return (n + SPX_MEM_ALIGN - 1) & ~(uint64_t)(SPX_MEM_ALIGN - 1); }

uint64_t spx_plan_cuda_layer_bytes(const spx_model *m, int64_t l) {
    if (!m->layers || l < 0 || l >= m->cfg.n_layers) return 0;
    return round_align(spx_mem_layer_image(m, l));
}

uint64_t spx_plan_cuda_global_bytes(const spx_model *m) { return round_align(spx_mem_global_image(m)); }

uint64_t spx_plan_cuda_scratch_bytes(const spx_model *m) {
    spx_cuda_scratch s;
    spx_mem_cuda_scratch(&m->cfg, m->state_floats, 1, &s);
    return s.total;
}

bool spx_plan_model_quantized(const spx_model *m) {
    if (!m->layers || m->cfg.n_layers <= 0) return false;
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int s = 0; s < SPX_SL_COUNT; s++)
            if (spx_slots[s].mat && m->layers[l].w[s].rows && m->layers[l].w[s].kind != SPX_WM_QUANT) return false;
    return true;
}

const char *spx_residency_name(spx_residency r) {
    switch (r) {
    case SPX_RES_RESIDENT: return "resident";
    case SPX_RES_PINGPONG: return "ping-pong";
    case SPX_RES_MMAP_STREAM: return "mmap-stream";
    }
    return "?";
}

/* ---- fitting ------------------------------------------------------------ */

/* Everything spx_plan_make works out before deciding. */
typedef struct plan_ctx {
    const spx_hw *hw;
    const spx_model *m;
    const spx_plan_request *req;
    uint64_t W, G, Lmax, S0;
    uint64_t score_bytes; /* per token of context beside the KV cache: the CPU's attention scores; 0 on cuda */
    int64_t kvd;
    int64_t T;          /* target context */
    int64_t cap;        /* context ceiling */
    bool requested;     /* T came from the request */
    int64_t last_min;   /* shortest default context the last level may shrink to */
    spx_kv_type kvs[2]; /* candidate KV types, preferred first */
    int n_kvs;
    uint64_t budget;
    char budget_src[128];
} plan_ctx;

typedef struct level {
    spx_residency res;
    uint64_t fixed; /* bytes in the budget before any context */
} level;

static uint64_t per_token(const plan_ctx *p, spx_kv_type kv) {
    return (uint64_t)spx_kv_bytes_per_token(kv, p->m->cfg.n_attn_layers, p->kvd) + p->score_bytes;
}

/* Largest context with fixed + T * per_token <= budget, capped; 0 if none. */
static int64_t fit_ctx(const plan_ctx *p, uint64_t fixed, spx_kv_type kv) {
    if (fixed >= p->budget) return 0;
    uint64_t t = (p->budget - fixed) / per_token(p, kv);
    return t > (uint64_t)p->cap ? p->cap : (int64_t)t;
}

static bool fits(const plan_ctx *p, uint64_t fixed, spx_kv_type kv, int64_t T) { return fit_ctx(p, fixed, kv) >= T; }

/* Picks the first level and KV type that hold the target context (a
 * default context may shrink; see plan.h). Returns false if none does. */
static bool choose(const plan_ctx *p, const level *lv, int n_lv, int *li, spx_kv_type *kv, int64_t *T) {
    for (int i = 0; i < n_lv; i++) {
        for (int k = 0; k < p->n_kvs; k++)
            if (fits(p, lv[i].fixed, p->kvs[k], p->T)) {
                *li = i, *kv = p->kvs[k], *T = p->T;
                return true;
            }
        if (!p->requested) {
            spx_kv_type best = p->kvs[p->n_kvs - 1];
            int64_t t = fit_ctx(p, lv[i].fixed, best);
            int64_t lo = i == n_lv - 1 ? p->last_min : (p->T < SPX_PLAN_MIN_CTX ? p->T : SPX_PLAN_MIN_CTX);
            if (t >= lo) {
                *li = i, *kv = best, *T = t;
                return true;
            }
        }
    }
    return false;
}

/* The KV and context reasons, common to both backends. */
static void explain_kv_ctx(const plan_ctx *p, spx_plan *o, const char *where) {
    const spx_config *c = &p->m->cfg;
    if (p->req->kv != SPX_KV_DEFAULT)
        say(o->why_kv, "%s: requested (--kv)", spx_kv_type_name(o->kv));
    else if (o->kv == SPX_KV_Q4)
        say(o->why_kv, "q4: f16 KV for %lld tokens (%.1f MiB) does not fit %s; q4 needs %.1f MiB", (long long)o->n_ctx,
            mib((uint64_t)o->n_ctx * spx_kv_bytes_per_token(SPX_KV_F16, c->n_attn_layers, p->kvd)), where, mib(o->kv_bytes));
    else if (p->n_kvs == 1)
        say(o->why_kv, "f16: fits (%.1f MiB); q4 would need head_dim %% 32 == 0 (it is %lld)", mib(o->kv_bytes),
            (long long)c->head_dim);
    else
        say(o->why_kv, "f16: fits (%.1f MiB for %lld tokens; %.1f KiB per token)", mib(o->kv_bytes),
            (long long)o->n_ctx, (double)o->kv_bytes_per_token / 1024.0);

    char beyond[96] = "";
    if (o->n_ctx > c->max_pos)
        snprintf(beyond, sizeof beyond, " (beyond the model's %lld trained positions)", (long long)c->max_pos);
    if (p->requested)
        say(o->why_ctx, "%lld: requested%s; up to %lld fit", (long long)o->n_ctx, beyond, (long long)o->n_ctx_max);
    else if (o->n_ctx < p->T)
        say(o->why_ctx, "%lld: the default %lld does not fit %s with %s KV; the largest that does", (long long)o->n_ctx,
            (long long)p->T, where, spx_kv_type_name(o->kv));
    else
        say(o->why_ctx, "%lld: default (model maximum %lld%s); up to %lld fit (--ctx)", (long long)o->n_ctx,
            (long long)c->max_pos, c->max_pos > SPX_PLAN_DEFAULT_CTX ? ", capped" : "", (long long)o->n_ctx_max);
}

static void fill_common(const plan_ctx *p, spx_plan *o, const level *lv, spx_kv_type kv, int64_t T) {
    o->residency = lv->res;
    o->kv = kv;
    o->n_ctx = T;
    o->n_ctx_max = fit_ctx(p, lv->fixed, kv);
    if (o->n_ctx_max < T) o->n_ctx_max = T;
    o->kv_bytes_per_token = spx_kv_bytes_per_token(kv, p->m->cfg.n_attn_layers, p->kvd);
    o->kv_bytes = o->kv_bytes_per_token * (uint64_t)T;
    /* a low-bit cache's fp16 sinks and ring, sized by the batch of a forward
     * call (the device's when the plan is cuda's: no CPU scores there) */
    const uint64_t lfix = spx_kv_type_lowbit(kv) ? spx_kvlow_fixed_bytes(p->m->cfg.n_attn_layers, p->kvd,
                                                                         p->score_bytes ? SPX_BATCH_MAX : SPX_BATCH_MAX_CUDA)
                                                 : 0;
    o->kv_bytes += lfix;
    o->scratch_bytes = p->S0 + p->score_bytes * (uint64_t)T;
    o->planned_bytes = lv->fixed + per_token(p, kv) * (uint64_t)T + lfix;
    o->budget = p->budget;
}

/* The error when nothing fits: either the context (naming the largest that
 * would) or the smallest level itself. */
static spx_status no_fit(const plan_ctx *p, const level *lv, int n_lv, spx_err *e, const char *mem) {
    int64_t best = 0;
    int best_l = 0;
    spx_kv_type best_kv = p->kvs[0];
    for (int i = 0; i < n_lv; i++)
        for (int k = 0; k < p->n_kvs; k++) {
            int64_t t = fit_ctx(p, lv[i].fixed, p->kvs[k]);
            if (t > best) best = t, best_l = i, best_kv = p->kvs[k];
        }
    const level *last = &lv[n_lv - 1];
    if (best > 0)
        return spx_fail(e, SPX_ERR_RANGE,
                        "a %lld-token context does not fit the %.1f MiB %s budget (%s) even with %s KV (%.1f MiB); "
                        "the largest that fits is %lld (%s, %s KV): use --ctx %lld",
                        (long long)p->T, mib(p->budget), mem, p->budget_src, spx_kv_type_name(p->kvs[p->n_kvs - 1]),
                        mib(spx_kv_bytes_per_token(p->kvs[p->n_kvs - 1], p->m->cfg.n_attn_layers, p->kvd) * (uint64_t)p->T),
                        (long long)best, spx_residency_name(lv[best_l].res), spx_kv_type_name(best_kv),
                        (long long)best);
    if (last->res == SPX_RES_PINGPONG)
        return spx_fail(e, SPX_ERR_RANGE,
                        "the %.1f MiB VRAM budget (%s) is too small even for ping-pong offload: embedding + LM head "
                        "%.1f MiB, two layer slots 2 x %.1f MiB and scratch %.1f MiB need %.1f MiB before any KV cache "
                        "(%.1f KiB per token of context); raise --vram-budget or use --backend cpu",
                        mib(p->budget), p->budget_src, mib(p->G), mib(p->Lmax), mib(p->S0), mib(last->fixed),
                        (double)per_token(p, p->kvs[p->n_kvs - 1]) / 1024.0);
    return spx_fail(e, SPX_ERR_RANGE,
                    "the %.1f MiB RAM budget (%s) cannot hold the scratch buffers (%.1f MiB) and a KV cache "
                    "(%.1f KiB per token of context) even with the weights streamed from the file",
                    mib(p->budget), p->budget_src, mib(p->S0), (double)per_token(p, p->kvs[p->n_kvs - 1]) / 1024.0);
}

/* ---- CPU ---------------------------------------------------------------- */

static void cpu_budget(plan_ctx *p) {
    const spx_hw *hw = p->hw;
    if (p->req->ram_budget_mb > 0) {
        p->budget = (uint64_t)p->req->ram_budget_mb << 20;
        snprintf(p->budget_src, sizeof p->budget_src, "--ram-budget");
        return;
    }
    uint64_t avail = hw->ram_available ? hw->ram_available : hw->ram_total;
    if (!avail) {
        p->budget = UINT64_MAX / 4;
        snprintf(p->budget_src, sizeof p->budget_src, "RAM size unknown: not limited");
        return;
    }
    uint64_t margin = avail / 10 > SPX_PLAN_RAM_MARGIN ? avail / 10 : SPX_PLAN_RAM_MARGIN;
    p->budget = avail > margin ? avail - margin : 0;
    snprintf(p->budget_src, sizeof p->budget_src, "%.0f MiB available - %.0f MiB margin", mib(avail), mib(margin));
}

static spx_status plan_cpu(plan_ctx *p, spx_plan *o, spx_err *e) {
    snprintf(o->backend, sizeof o->backend, "cpu");
    o->gpu = -1;
    cpu_budget(p);
    level lv[2] = {{SPX_RES_RESIDENT, p->W + p->S0}, {SPX_RES_MMAP_STREAM, p->S0}};
    int li;
    spx_kv_type kv;
    int64_t T;
    if (!choose(p, lv, 2, &li, &kv, &T)) return no_fit(p, lv, 2, e, "RAM");
    fill_common(p, o, &lv[li], kv, T);
    o->n_layers_resident = p->m->cfg.n_layers;
    if (lv[li].res == SPX_RES_RESIDENT) {
        say(o->why_residency, "resident in RAM: weights %.1f + KV %.1f + scratch %.1f = %.1f MiB fit in %.1f MiB (%s)",
            mib(p->W), mib(o->kv_bytes), mib(o->scratch_bytes), mib(o->planned_bytes), mib(p->budget), p->budget_src);
        explain_kv_ctx(p, o, "in RAM beside the weights");
    } else {
        o->stream_bytes_per_token = o->read_bytes_per_token;
        say(o->why_residency,
            "mmap-streamed: weights %.1f MiB + KV + scratch exceed the %.1f MiB of RAM (%s); the OS pages the "
            "weights in from the file, up to %.1f MiB read per token",
            mib(p->W), mib(p->budget), p->budget_src, mib(o->stream_bytes_per_token));
        explain_kv_ctx(p, o, "in RAM");
    }
    return SPX_OK;
}

/* ---- CUDA --------------------------------------------------------------- */

static void gpu_budget(plan_ctx *p, const spx_gpu_info *g) {
    if (p->req->vram_budget_mb > 0) {
        p->budget = (uint64_t)p->req->vram_budget_mb << 20;
        snprintf(p->budget_src, sizeof p->budget_src, "--vram-budget%s",
                 p->budget > g->mem_free ? "; more than the GPU has free now" : "");
        return;
    }
    p->budget = g->mem_free > SPX_PLAN_VRAM_MARGIN ? g->mem_free - SPX_PLAN_VRAM_MARGIN : 0;
    snprintf(p->budget_src, sizeof p->budget_src, "GPU %d: %.0f MiB free - %.0f MiB margin", g->index, mib(g->mem_free),
             mib(SPX_PLAN_VRAM_MARGIN));
}

/* The sizes of the CUDA backend's images and buffers (engine/memory.h):
 * the arena holds the global image and then each resident layer's, each
 * from an aligned start; a ping-pong slot holds the largest layer image;
 * the session's buffers need no per-token scratch beside the KV cache. */
static void cuda_sizes(plan_ctx *p) {
    const spx_model *m = p->m;
    p->G = spx_plan_cuda_global_bytes(m);
    p->W = p->G;
    p->Lmax = 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        uint64_t b = spx_plan_cuda_layer_bytes(m, l);
        p->W += b;
        if (b > p->Lmax) p->Lmax = b;
    }
    p->S0 = spx_plan_cuda_scratch_bytes(m);
    p->score_bytes = 0;
}

/* Returns SPX_OK with o filled, or an error; *fallback set when the
 * auto backend should fall back to the CPU instead (detected memory too
 * small), with the reason in why. */
static spx_status plan_gpu(plan_ctx *p, spx_plan *o, bool may_fall_back, bool *fallback, char *why, spx_err *e) {
    const spx_gpu_info *g = &p->hw->gpus[p->req->gpu];
    const spx_config *c = &p->m->cfg;
    snprintf(o->backend, sizeof o->backend, "cuda");
    o->gpu = p->req->gpu;
    gpu_budget(p, g);
    const plan_ctx cpu_sizes = *p; /* the CPU's sizes, for a fall-back */
    cuda_sizes(p);
    o->weight_bytes = p->W, o->global_bytes = p->G, o->layer_bytes_max = p->Lmax;
    level lv[2] = {{SPX_RES_RESIDENT, p->W + p->S0}, {SPX_RES_PINGPONG, p->G + 2 * p->Lmax + p->S0}};
    int li;
    spx_kv_type kv;
    int64_t T;
    if (!choose(p, lv, 2, &li, &kv, &T)) {
        if (may_fall_back) {
            *fallback = true;
            const uint64_t need = lv[1].fixed + per_token(p, p->kvs[p->n_kvs - 1]) * (uint64_t)p->T;
            p->W = cpu_sizes.W, p->G = cpu_sizes.G, p->Lmax = cpu_sizes.Lmax, p->S0 = cpu_sizes.S0;
            p->score_bytes = cpu_sizes.score_bytes; /* the CPU plan that follows counts the CPU's sizes */
            say(why, "cpu: GPU %d (%s) has %.0f MiB free; ping-pong offload with %lld tokens of context needs %.1f MiB",
                g->index, g->name, mib(g->mem_free), (long long)p->T, mib(need));
            return SPX_OK;
        }
        return no_fit(p, lv, 2, e, "VRAM");
    }
    fill_common(p, o, &lv[li], kv, T);
    if (lv[li].res == SPX_RES_RESIDENT) {
        o->n_layers_resident = c->n_layers;
        say(o->why_residency, "resident: weights %.1f + KV %.1f + scratch %.1f = %.1f MiB fit the %.1f MiB budget (%s)",
            mib(p->W), mib(o->kv_bytes), mib(o->scratch_bytes), mib(o->planned_bytes), mib(p->budget), p->budget_src);
        explain_kv_ctx(p, o, "beside the resident weights");
        return SPX_OK;
    }
    /* ping-pong: the layers that fit in what is left stay on the device */
    o->n_slots = 2;
    uint64_t left = p->budget - o->planned_bytes, kept = 0;
    int64_t k = 0;
    while (k < c->n_layers && kept + spx_plan_cuda_layer_bytes(p->m, k) <= left) kept += spx_plan_cuda_layer_bytes(p->m, k++);
    o->n_layers_resident = k;
    o->planned_bytes += kept;
    o->host_pinned_bytes = p->W - p->G - kept;
    o->stream_bytes_per_token = o->host_pinned_bytes;
    double gbps = spx_pcie_gbps(g->pcie_gen_max, g->pcie_width_max);
    char bus[96] = "";
    if (gbps > 0)
        snprintf(bus, sizeof bus, ", >= %.1f ms/token at %.1f GB/s (PCIe Gen%d x%d)",
                 (double)o->stream_bytes_per_token / (gbps * 1e9) * 1e3, gbps, g->pcie_gen_max, g->pcie_width_max);
    uint64_t ram = p->hw->ram_available;
    char warn[96] = "";
    if (p->req->ram_budget_mb > 0) ram = (uint64_t)p->req->ram_budget_mb << 20;
    if (ram && o->host_pinned_bytes > ram)
        snprintf(warn, sizeof warn, "; warning: more than the %.0f MiB of RAM available", mib(ram));
    say(o->why_residency,
        "ping-pong: weights %.1f MiB exceed the %.1f MiB budget (%s); %lld of %lld layers stay resident, %lld "
        "stream through 2 slots of %.1f MiB: %.1f MiB over PCIe per token%s%s",
        mib(p->W), mib(p->budget), p->budget_src, (long long)k, (long long)c->n_layers, (long long)(c->n_layers - k),
        mib(p->Lmax), mib(o->stream_bytes_per_token), bus, warn);
    explain_kv_ctx(p, o, "beside the two layer slots");
    return SPX_OK;
}

/* ---- threads, backend, entry point -------------------------------------- */

static void choose_threads(const spx_hw *hw, const spx_plan_request *req, spx_plan *o, bool gpu) {
    if (req->n_threads > 0) {
        o->n_threads = req->n_threads;
        say(o->why_threads, "%d: requested (--threads)", (int)o->n_threads);
        return;
    }
    int32_t n = hw->n_cores > 0 ? hw->n_cores : hw->n_cpus > 0 ? hw->n_cpus : 1;
    const char *what = hw->n_cores > 0 ? "one per physical core" : "one per logical CPU (cores unknown)";
    char extra[96] = "";
    if (hw->cpu_quota > 0 && (double)n > hw->cpu_quota + 0.999) {
        int32_t q = (int32_t)(hw->cpu_quota + 0.999);
        n = q > 0 ? q : 1;
        snprintf(extra, sizeof extra, ", capped by the cgroup CPU quota %.2f", hw->cpu_quota);
        what = "one per CPU of quota";
    }
    o->n_threads = n;
    say(o->why_threads, "%d: %s (%d logical CPUs%s)%s", (int)n, what, (int)hw->n_cpus, extra,
        gpu ? "; host-side work only" : "; decode is memory-bound, hyper-threads add little");
}

/* A blank plan with the model's sizes. */
static void reset_plan(spx_plan *o, const plan_ctx *p) {
    memset(o, 0, sizeof *o);
    o->n_layers = p->m->cfg.n_layers;
    o->weight_bytes = p->W;
    o->global_bytes = p->G;
    o->layer_bytes_max = p->Lmax;
    o->read_bytes_per_token = spx_model_bytes_per_token(p->m);
}

spx_status spx_plan_make(const spx_hw *hw, const spx_model *m, const spx_plan_request *req, spx_plan *out, spx_err *e) {
    static const spx_plan_request dflt = {0};
    if (!hw || !m || !out) return spx_fail(e, SPX_ERR_ARG, "spx_plan_make: NULL argument");
    if (!req) req = &dflt;
    memset(out, 0, sizeof *out);
    const spx_config *c = &m->cfg;
    if (c->n_layers <= 0 || !m->layers || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0)
        return spx_fail(e, SPX_ERR_ARG, "plan: the model has no layers bound");
    if (req->n_ctx < 0 || req->n_ctx > SPX_PLAN_MAX_CTX)
        return spx_fail(e, SPX_ERR_ARG, "plan: context %lld is not in [1, %lld]", (long long)req->n_ctx,
                        (long long)SPX_PLAN_MAX_CTX);
    if (req->vram_budget_mb < 0 || req->vram_budget_mb > ((int64_t)1 << 40) || req->ram_budget_mb < 0 ||
        req->ram_budget_mb > ((int64_t)1 << 40))
        return spx_fail(e, SPX_ERR_ARG, "plan: budgets must be in [0, 2^40] MiB");
    if (req->n_threads < 0) return spx_fail(e, SPX_ERR_ARG, "plan: %d threads", (int)req->n_threads);
    if (req->kv < SPX_KV_DEFAULT || req->kv > SPX_KV_K4V4)
        return spx_fail(e, SPX_ERR_ARG, "plan: KV type %d is not one of f32, f16, q4, k2v2, k3v2, k3v3, k4v4",
                        (int)req->kv);

    plan_ctx p = {.hw = hw, .m = m, .req = req};
    p.kvd = c->n_kv_heads * c->head_dim;
    bool q4_ok = c->head_dim % 32 == 0 && c->head_dim / 32 <= 64;
    if (req->kv == SPX_KV_Q4 && !q4_ok)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "--kv q4 needs head_dim to be a multiple of 32 (at most 2048); this model has %lld",
                        (long long)c->head_dim);
    if (req->kv != SPX_KV_DEFAULT)
        p.kvs[p.n_kvs++] = req->kv;
    else {
        p.kvs[p.n_kvs++] = SPX_KV_F16;
        if (q4_ok) p.kvs[p.n_kvs++] = SPX_KV_Q4;
    }
    p.G = spx_plan_global_bytes(m);
    p.W = p.G;
    for (int64_t l = 0; l < c->n_layers; l++) {
        uint64_t b = spx_plan_layer_bytes(m, l);
        p.W += b;
        if (b > p.Lmax) p.Lmax = b;
    }
    p.S0 = scratch_fixed(c);
    p.score_bytes = 4 * (uint64_t)c->n_heads;
    int64_t maxpos = c->max_pos > 0 ? c->max_pos : SPX_PLAN_DEFAULT_CTX;
    p.requested = req->n_ctx > 0;
    p.T = p.requested ? req->n_ctx : (maxpos < SPX_PLAN_DEFAULT_CTX ? maxpos : SPX_PLAN_DEFAULT_CTX);
    p.cap = p.T > maxpos ? p.T : maxpos;
    if (p.cap > SPX_PLAN_MAX_CTX) p.cap = SPX_PLAN_MAX_CTX;
    p.last_min = 1;

    reset_plan(out, &p);

    /* backend */
    const char *b = req->backend ? req->backend : "auto";
    bool is_auto = !strcmp(b, "auto");
    if (!is_auto && strcmp(b, "cpu") && strcmp(b, "cuda"))
        return spx_fail(e, SPX_ERR_ARG, "--backend '%s': expected cpu, cuda or auto", b);
    if (req->gpu < 0 || (hw->n_gpus > 0 && req->gpu >= hw->n_gpus))
        return spx_fail(e, SPX_ERR_ARG, "--gpu %d: this machine has %d GPU(s)", (int)req->gpu, (int)hw->n_gpus);
    bool quant = spx_plan_model_quantized(m);
    char why[SPX_PLAN_REASON_MAX] = "";
    bool use_gpu = false;
    if (!strcmp(b, "cpu")) {
        say(why, "cpu: requested (--backend cpu)");
    } else if (!hw->cuda_built) {
        if (!is_auto)
            return spx_fail(e, SPX_ERR_UNSUPPORTED,
                            "--backend cuda: this build has no CUDA backend (built without SPX_HAVE_CUDA)");
        say(why, "cpu: this build has no CUDA backend%s", hw->n_gpus ? " (a GPU is present: rebuild with CUDA)" : "");
    } else if (hw->n_gpus == 0) {
        if (!is_auto) return spx_fail(e, SPX_ERR_UNSUPPORTED, "--backend cuda: no NVIDIA GPU found (%s)", hw->gpu_note);
        say(why, "cpu: no NVIDIA GPU found (%s)", hw->gpu_note);
    } else if (req->kv == SPX_KV_F32) {
        if (!is_auto)
            return spx_fail(e, SPX_ERR_UNSUPPORTED,
                            "--backend cuda: the CUDA backend keeps the KV cache in f16 or q4; --kv f32 runs on the CPU "
                            "only");
        say(why, "cpu: --kv f32 runs on the CPU only (the CUDA backend keeps f16 or q4 caches)");
    } else if (!quant) {
        if (!is_auto)
            return spx_fail(e, SPX_ERR_UNSUPPORTED,
                            "--backend cuda: the CUDA backend runs 4-bit .trdc models and this one has dense matrices "
                            "(make one with spectra compress)");
        say(why, "cpu: the model's matrices are dense (the CUDA backend runs 4-bit .trdc models: spectra compress)");
    } else {
        use_gpu = true;
    }

    if (use_gpu) {
        const spx_gpu_info *g = &hw->gpus[req->gpu];
        bool fallback = false;
        bool may_fall_back = is_auto && req->vram_budget_mb == 0;
        /* with the CPU to fall back on, a tiny context on the GPU is no gain */
        if (may_fall_back) p.last_min = p.T < SPX_PLAN_MIN_CTX ? p.T : SPX_PLAN_MIN_CTX;
        choose_threads(hw, req, out, true);
        SPX_TRY(plan_gpu(&p, out, may_fall_back, &fallback, why, e));
        if (!fallback) {
            say(out->why_backend, "cuda: GPU %d %s (compute %d.%d, %.0f MiB) and a quantized model", g->index, g->name,
                g->cc_major, g->cc_minor, mib(g->mem_total));
            return SPX_OK;
        }
        /* fall back to the CPU, with the reason in why */
        reset_plan(out, &p);
        p.last_min = 1;
    }
    choose_threads(hw, req, out, false);
    SPX_TRY(plan_cpu(&p, out, e));
    memcpy(out->why_backend, why, sizeof out->why_backend);
    return SPX_OK;
}

cJSON *spx_plan_json(const spx_plan *p) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "backend", p->backend);
    cJSON_AddNumberToObject(o, "gpu", p->gpu);
    cJSON_AddStringToObject(o, "residency", spx_residency_name(p->residency));
    cJSON_AddNumberToObject(o, "n_layers", (double)p->n_layers);
    cJSON_AddNumberToObject(o, "n_layers_resident", (double)p->n_layers_resident);
    cJSON_AddNumberToObject(o, "n_slots", p->n_slots);
    cJSON_AddStringToObject(o, "kv", spx_kv_type_name(p->kv));
    cJSON_AddNumberToObject(o, "n_ctx", (double)p->n_ctx);
    cJSON_AddNumberToObject(o, "n_ctx_max", (double)p->n_ctx_max);
    cJSON_AddNumberToObject(o, "n_threads", p->n_threads);
    cJSON_AddNumberToObject(o, "budget_bytes", (double)p->budget);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)p->weight_bytes);
    cJSON_AddNumberToObject(o, "global_bytes", (double)p->global_bytes);
    cJSON_AddNumberToObject(o, "layer_bytes_max", (double)p->layer_bytes_max);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", (double)p->kv_bytes_per_token);
    cJSON_AddNumberToObject(o, "kv_bytes", (double)p->kv_bytes);
    cJSON_AddNumberToObject(o, "scratch_bytes", (double)p->scratch_bytes);
    cJSON_AddNumberToObject(o, "planned_bytes", (double)p->planned_bytes);
    cJSON_AddNumberToObject(o, "host_pinned_bytes", (double)p->host_pinned_bytes);
    cJSON_AddNumberToObject(o, "stream_bytes_per_token", (double)p->stream_bytes_per_token);
    cJSON_AddNumberToObject(o, "read_bytes_per_token", (double)p->read_bytes_per_token);
    cJSON *why = cJSON_AddObjectToObject(o, "reasons");
    if (!why) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddStringToObject(why, "backend", p->why_backend);
    cJSON_AddStringToObject(why, "residency", p->why_residency);
    cJSON_AddStringToObject(why, "kv", p->why_kv);
    cJSON_AddStringToObject(why, "ctx", p->why_ctx);
    cJSON_AddStringToObject(why, "threads", p->why_threads);
    return o;
}
