/* test_plan.c: the execution plan on synthetic machines (no GPU needed)
 * and the real hardware probe and telemetry sampler on this one.
 *
 * The plan logic runs on a hand-built Llama-3-8B-shaped model (4-bit G32,
 * no outliers, untied head) whose sizes are worked out below by hand; the
 * expected contexts and layer counts are literal numbers from that
 * arithmetic, not from the code under test. A real model (tiny-llama3,
 * compressed here) checks the size accounting against the loader's. */
#include "testlib.h"
#include "engine/plan.h"
#include "engine/probe.h"
#include "model/model.h"
#include "quant/compress.h"
#include "quant/g32.h"
#include "quant/saliency.h"
#include "spectra.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <time.h>

#define MiB ((uint64_t)1 << 20)

/* ---- the hand-built model ---------------------------------------------------
 * H 4096, I 14336, 32 layers, 32 heads, 8 KV heads, head_dim 128, vocab
 * 128256, max context 8192. A 4-bit G32 row of n columns: n/2 code bytes +
 * n/32 fp16 scales + n/64 zero bytes = n * 4.625 / 8:
 *   4096 columns: 2048 + 256 + 64 = 2368 bytes;  14336: 7168 + 896 + 224 = 8288.
 * layer: wq 4096*2368 + wk,wv 2*1024*2368 + wo 4096*2368 + gate,up
 *        2*14336*2368 + down 4096*8288 + norms 2*4096*4
 *      = 9,699,328 + 4,849,664 + 9,699,328 + 67,895,296 + 33,947,648 + 32,768
 *      = 126,124,032
 * global G: embed + head 2*128256*2368 + final norm 4096*4 = 607,436,800
 * weights W = G + 32 * 126,124,032 = 4,643,405,824
 * scratch S0 = 4*128*(H + H + 2*4096 + 2*1024 + 2*14336 + 128256)
 *            = 512 * 175,360 = 89,784,320; plus 4*32 = 128 bytes per token
 * KV per token: f16 2*32*1024*2 = 131,072; q4 2*32*(512+64+16) = 37,888
 * per token with scores: f16 131,200; q4 38,016
 * CUDA (engine/memory.h): every component aligned to 256 bytes with 16
 * bytes of slack after it; all these sizes are multiples of 256, so each
 * component takes 256 bytes more, and an image ends rounded up to 256:
 *   layer: 7 matrices x 3 components + 2 norms = 23: L + 5,888 = 126,129,920
 *   global: embed, head (3 each), final norm, RoPE frequencies (64 floats):
 *           G + 256 + 8 * 256 = 607,439,104
 *   weights: W_dev = G_dev + 32 * L_dev = 4,643,596,544
 * CUDA scratch S0c, the session's buffers (B = 512 tokens):
 *   h 4*512*4096 = 8,388,608; x 4*512*14336 = 29,360,128; q 8,388,608;
 *   k, v 2 * 2,097,152; att 8,388,608; gate, up 2 * 29,360,128;
 *   logits 4*128*128256 = 65,667,072; split-K partials 4*128*32*130 =
 *   2,129,920; fp16 activations 2*512*14336 = 14,680,064; GEMM partials
 *   16*128*14336 = 29,360,128; fp16 weights 2*14336*4096 = 117,440,512;
 *   ids 2,048, pos 4, best 8, split counters 128: 346,720,396
 * CUDA per token: the KV cache only (f16 131,072; q4 37,888)
 * ping-pong fixed: G_dev + 2 * L_dev + S0c = 1,206,419,340 */
#define L_BYTES 126124032ull
#define G_BYTES 607436800ull
#define W_BYTES 4643405824ull
#define S0_BYTES 89784320ull
#define LC_BYTES 126129920ull
#define GC_BYTES 607439104ull
#define WC_BYTES 4643596544ull
#define S0C_BYTES 346720396ull
#define PP_FIXED 1206419340ull

typedef struct big_model {
    spx_model m;
    spx_layer layers[32];
    float dummy[1]; /* the vectors' pointers (sizes come from the config; nothing reads them) */
} big_model;

static spx_wmat qmat(int64_t rows, int64_t cols) {
    spx_wmat w;
    memset(&w, 0, sizeof w);
    w.rows = rows, w.cols = cols, w.kind = SPX_WM_QUANT;
    w.q.rows = rows, w.q.cols = cols, w.q.bits = 4, w.q.group = 32;
    return w;
}

static void make_big(big_model *b) {
    memset(b, 0, sizeof *b);
    spx_config *c = &b->m.cfg;
    c->hidden_size = 4096, c->intermediate_size = 14336, c->n_layers = 32;
    c->n_heads = 32, c->n_kv_heads = 8, c->head_dim = 128, c->vocab_size = 128256, c->max_pos = 8192;
    snprintf(c->arch_name, sizeof c->arch_name, "LlamaForCausalLM");
    c->rope = true, c->attn_scale = 1.0f / sqrtf(128.0f);
    c->embed_mult = c->residual_mult = c->logits_div = 1.0f;
    c->n_attn_layers = 32;
    for (int l = 0; l < 32; l++) {
        c->mixer[l] = SPX_MIX_ATTN, c->ffn[l] = SPX_FFN_SWIGLU;
        spx_layer *L = &b->layers[l];
        L->w[SPX_SL_Q] = qmat(4096, 4096), L->w[SPX_SL_K] = qmat(1024, 4096), L->w[SPX_SL_V] = qmat(1024, 4096);
        L->w[SPX_SL_O] = qmat(4096, 4096);
        L->w[SPX_SL_GATE] = qmat(14336, 4096), L->w[SPX_SL_UP] = qmat(14336, 4096), L->w[SPX_SL_DOWN] = qmat(4096, 14336);
        L->v[SPX_SL_MIX_NORM] = L->v[SPX_SL_FFN_NORM] = b->dummy;
    }
    b->m.final_norm = b->m.rope_inv_freq = b->dummy;
    b->m.layers = b->layers;
    b->m.embed = qmat(128256, 4096);
    b->m.lm_head = qmat(128256, 4096);
}

/* A machine with one 24 GiB GPU (20 GiB free), 64 GiB of RAM, 8 cores. */
static void make_hw(spx_hw *hw) {
    memset(hw, 0, sizeof *hw);
    snprintf(hw->cpu_name, sizeof hw->cpu_name, "Test CPU");
    hw->n_cpus = 16, hw->n_cores = 8;
    hw->ram_total = (uint64_t)64 << 30, hw->ram_available = (uint64_t)60 << 30;
    hw->cuda_built = true;
    hw->n_gpus = 1;
    spx_gpu_info *g = &hw->gpus[0];
    snprintf(g->name, sizeof g->name, "Test GPU");
    g->mem_total = (uint64_t)24 << 30, g->mem_free = (uint64_t)20 << 30;
    g->cc_major = 8, g->cc_minor = 9, g->pcie_gen_max = 4, g->pcie_width_max = 16;
}

static spx_status plan(const spx_hw *hw, const spx_model *m, const spx_plan_request *r, spx_plan *p, spx_err *e) {
    spx_err_clear(e);
    return spx_plan_make(hw, m, r, p, e);
}

static void test_sizes(const spx_model *m) {
    CHECK(spx_plan_layer_bytes(m, 0) == L_BYTES, "layer %llu", (unsigned long long)spx_plan_layer_bytes(m, 0));
    CHECK(spx_plan_global_bytes(m) == G_BYTES, "global %llu", (unsigned long long)spx_plan_global_bytes(m));
    CHECK(spx_plan_scratch_bytes(m, 0) == S0_BYTES, "scratch %llu", (unsigned long long)spx_plan_scratch_bytes(m, 0));
    CHECK(spx_plan_scratch_bytes(m, 10) == S0_BYTES + 1280, "scratch(10)");
    CHECK(spx_plan_cuda_scratch_bytes(m) == S0C_BYTES, "cuda scratch %llu",
          (unsigned long long)spx_plan_cuda_scratch_bytes(m));
    CHECK(spx_plan_cuda_layer_bytes(m, 0) == LC_BYTES, "cuda layer %llu",
          (unsigned long long)spx_plan_cuda_layer_bytes(m, 0));
    CHECK(spx_plan_cuda_global_bytes(m) == GC_BYTES, "cuda global %llu", (unsigned long long)spx_plan_cuda_global_bytes(m));
    CHECK(spx_plan_model_quantized(m), "quantized");
}

static void test_gpu(spx_model *m) {
    spx_hw hw;
    make_hw(&hw);
    spx_plan p;
    spx_err e;

    /* 16 GiB: everything fits; default context min(8192, 4096) */
    spx_plan_request r = {.vram_budget_mb = 16384};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK, "%s", e.msg);
    CHECK(!strcmp(p.backend, "cuda") && p.gpu == 0, "backend %s (%s)", p.backend, p.why_backend);
    CHECK(p.residency == SPX_RES_RESIDENT && p.n_layers_resident == 32 && p.n_slots == 0, "residency %d", (int)p.residency);
    CHECK(p.kv == SPX_KV_F16 && p.n_ctx == 4096, "kv %d ctx %lld", (int)p.kv, (long long)p.n_ctx);
    CHECK(p.n_ctx_max == 8192, "ctx max %lld (capped at the model's 8192)", (long long)p.n_ctx_max);
    CHECK(p.weight_bytes == WC_BYTES, "W %llu", (unsigned long long)p.weight_bytes);
    /* W_dev + S0c + 4096 * 131,072 = 4,643,596,544 + 346,720,396 + 536,870,912 */
    CHECK(p.planned_bytes == 5527187852ull, "planned %llu", (unsigned long long)p.planned_bytes);
    CHECK(p.kv_bytes == 4096ull * 131072, "kv bytes %llu", (unsigned long long)p.kv_bytes);
    CHECK(p.why_backend[0] && p.why_residency[0] && p.why_kv[0] && p.why_ctx[0] && p.why_threads[0], "reasons");
    CHECK(strstr(p.why_residency, "resident") != NULL, "%s", p.why_residency);

    /* 5243 MiB, context 2048: f16 fits; room left: 5243 MiB - W_dev - S0c =
     * 5,497,683,968 - 4,990,316,940 = 507,367,028 = 3870.9 f16 tokens */
    r = (spx_plan_request){.vram_budget_mb = 5243, .n_ctx = 2048};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK, "%s", e.msg);
    CHECK(p.residency == SPX_RES_RESIDENT && p.kv == SPX_KV_F16 && p.n_ctx == 2048, "res %d kv %d", (int)p.residency,
          (int)p.kv);
    CHECK(p.n_ctx_max == 3870, "ctx max %lld, expected 3870", (long long)p.n_ctx_max);

    /* 5243 MiB, default 4096: f16 needs 536,870,912 > 507,367,028, q4
     * 155,189,248 fits: KV switches to q4, weights stay resident;
     * q4 max 507,367,028 / 37,888 = 13391 -> capped 8192 */
    r = (spx_plan_request){.vram_budget_mb = 5243};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK, "%s", e.msg);
    CHECK(p.residency == SPX_RES_RESIDENT && p.kv == SPX_KV_Q4 && p.n_ctx == 4096, "res %d kv %d ctx %lld",
          (int)p.residency, (int)p.kv, (long long)p.n_ctx);
    CHECK(p.kv_bytes == 4096ull * 37888, "q4 kv bytes %llu", (unsigned long long)p.kv_bytes);
    CHECK(p.n_ctx_max == 8192, "ctx max %lld", (long long)p.n_ctx_max);
    CHECK(strstr(p.why_kv, "q4") && strstr(p.why_kv, "f16"), "%s", p.why_kv);

    /* the same with --kv f16 forced: the default context shrinks to 3870 */
    r = (spx_plan_request){.vram_budget_mb = 5243, .kv = SPX_KV_F16};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK, "%s", e.msg);
    CHECK(p.residency == SPX_RES_RESIDENT && p.kv == SPX_KV_F16 && p.n_ctx == 3870, "res %d kv %d ctx %lld",
          (int)p.residency, (int)p.kv, (long long)p.n_ctx);

    /* 2291 MiB: W does not fit -> ping-pong with f16 at 4096. Left after
     * G + 2 slots + S0c + KV: 2,402,287,616 - 1,206,419,340 - 536,870,912 =
     * 658,997,364 = 5.22 layers -> 5 resident, 27 streamed */
    r = (spx_plan_request){.vram_budget_mb = 2291};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK, "%s", e.msg);
    CHECK(!strcmp(p.backend, "cuda") && p.residency == SPX_RES_PINGPONG && p.n_slots == 2, "res %d slots %d",
          (int)p.residency, (int)p.n_slots);
    CHECK(p.kv == SPX_KV_F16 && p.n_ctx == 4096, "kv %d ctx %lld", (int)p.kv, (long long)p.n_ctx);
    CHECK(p.n_layers_resident == 5, "resident layers %lld, expected 5", (long long)p.n_layers_resident);
    CHECK(p.stream_bytes_per_token == 27 * LC_BYTES && p.host_pinned_bytes == 27 * LC_BYTES, "stream %llu",
          (unsigned long long)p.stream_bytes_per_token);
    CHECK(p.planned_bytes == PP_FIXED + 4096ull * 131072 + 5 * LC_BYTES && p.planned_bytes <= p.budget, "planned %llu",
          (unsigned long long)p.planned_bytes);
    /* f16 with only the slots: (2,402,287,616 - 1,206,419,340) / 131,072 = 9123 -> 8192 */
    CHECK(p.n_ctx_max == 8192, "ctx max %lld", (long long)p.n_ctx_max);
    CHECK(strstr(p.why_residency, "ping-pong") && strstr(p.why_residency, "PCIe"), "%s", p.why_residency);

    /* 1267 MiB, default context: ping-pong with f16 at 4096 does not fit,
     * nor q4 (1,206,419,340 + 155,189,248 > 1,328,545,792); the default
     * shrinks to (1,328,545,792 - 1,206,419,340) / 37,888 = 3223 with q4 */
    r = (spx_plan_request){.vram_budget_mb = 1267};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK, "%s", e.msg);
    CHECK(p.residency == SPX_RES_PINGPONG && p.kv == SPX_KV_Q4 && p.n_ctx == 3223 && p.n_layers_resident == 0,
          "res %d kv %d ctx %lld resident %lld", (int)p.residency, (int)p.kv, (long long)p.n_ctx,
          (long long)p.n_layers_resident);
    /* a requested 4096 is an error naming the largest that fits */
    r.n_ctx = 4096;
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_ERR_RANGE && strstr(e.msg, "3223"), "%s", e.msg);

    /* 1043 MiB < 1,206,419,340 bytes for the embedding, head, two slots and
     * scratch: a clear error, not a CPU fallback (the budget was explicit) */
    r = (spx_plan_request){.vram_budget_mb = 1043};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_ERR_RANGE && strstr(e.msg, "too small even for ping-pong") &&
              strstr(e.msg, "two layer slots"),
          "%s", e.msg);

    /* detected budget too small (600 MiB free - 512 MiB margin): auto falls
     * back to the CPU and says why; --backend cuda fails instead */
    spx_hw small = hw;
    small.gpus[0].mem_free = 600 * MiB;
    r = (spx_plan_request){0};
    CHECK(plan(&small, m, &r, &p, &e) == SPX_OK, "%s", e.msg);
    CHECK(!strcmp(p.backend, "cpu") && strstr(p.why_backend, "GPU 0"), "%s: %s", p.backend, p.why_backend);
    CHECK(p.residency == SPX_RES_RESIDENT && p.kv == SPX_KV_F16 && p.n_ctx == 4096, "cpu fallback plan");
    r.backend = "cuda";
    CHECK(plan(&small, m, &r, &p, &e) == SPX_ERR_RANGE, "cuda forced: %s", e.msg);

    /* 1163 MiB: ping-pong leaves 1,219,493,888 - 1,206,419,340 = 13,074,548
     * bytes = 345 q4 tokens. Given as --vram-budget, the default context
     * shrinks to 345; detected (512 + 1163 MiB free), auto prefers the CPU
     * to a context under 1024 */
    r = (spx_plan_request){.vram_budget_mb = 1163};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && !strcmp(p.backend, "cuda") && p.residency == SPX_RES_PINGPONG &&
              p.kv == SPX_KV_Q4 && p.n_ctx == 345,
          "%s ctx %lld: %s", p.backend, (long long)p.n_ctx, e.msg);
    small.gpus[0].mem_free = (512 + 1163) * MiB;
    r = (spx_plan_request){0};
    CHECK(plan(&small, m, &r, &p, &e) == SPX_OK && !strcmp(p.backend, "cpu") && p.n_ctx == 4096, "%s ctx %lld: %s",
          p.backend, (long long)p.n_ctx, p.why_backend);

    /* detected budget: 20 GiB free - 512 MiB -> resident */
    r = (spx_plan_request){0};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && !strcmp(p.backend, "cuda") && p.residency == SPX_RES_RESIDENT &&
              p.budget == ((uint64_t)20 << 30) - 512 * MiB,
          "budget %llu: %s", (unsigned long long)p.budget, e.msg);
}

static void test_backend_choice(spx_model *m) {
    spx_hw hw;
    make_hw(&hw);
    spx_plan p;
    spx_err e;
    spx_plan_request r = {0};

    hw.cuda_built = false;
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && !strcmp(p.backend, "cpu") && strstr(p.why_backend, "no CUDA"), "%s",
          p.why_backend);
    r.backend = "cuda";
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_ERR_UNSUPPORTED, "cuda in a cpu build: %s", e.msg);

    make_hw(&hw);
    hw.n_gpus = 0;
    snprintf(hw.gpu_note, sizeof hw.gpu_note, "no NVIDIA driver");
    r.backend = NULL;
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && !strcmp(p.backend, "cpu") && strstr(p.why_backend, "no NVIDIA GPU"),
          "%s", p.why_backend);

    make_hw(&hw);
    r.backend = "cpu";
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && !strcmp(p.backend, "cpu") && strstr(p.why_backend, "requested"), "%s",
          p.why_backend);
    r.backend = "tpu";
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_ERR_ARG && strstr(e.msg, "tpu"), "%s", e.msg);

    /* one dense matrix: not a 4-bit model, so cpu */
    spx_wmat keep = m->layers[3].w[SPX_SL_UP];
    m->layers[3].w[SPX_SL_UP].kind = SPX_WM_DENSE;
    m->layers[3].w[SPX_SL_UP].dtype = SPX_DT_BF16;
    r.backend = NULL;
    CHECK(!spx_plan_model_quantized(m), "dense detected");
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && !strcmp(p.backend, "cpu") && strstr(p.why_backend, "dense"), "%s",
          p.why_backend);
    m->layers[3].w[SPX_SL_UP] = keep;

}

static void test_cpu(spx_model *m) {
    spx_hw hw;
    make_hw(&hw);
    spx_plan p;
    spx_err e;
    spx_plan_request r = {.backend = "cpu", .ram_budget_mb = 8192};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && p.residency == SPX_RES_RESIDENT && p.kv == SPX_KV_F16, "%s",
          p.why_residency);
    /* 4096 MiB < W: weights streamed; KV + scratch still fit in RAM:
     * (4,294,967,296 - 89,784,320) / 131,200 = 32051 -> capped 8192 */
    r.ram_budget_mb = 4096;
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK, "%s", e.msg);
    CHECK(p.residency == SPX_RES_MMAP_STREAM && p.kv == SPX_KV_F16 && p.n_ctx == 4096 && p.n_ctx_max == 8192,
          "res %d kv %d ctx %lld max %lld", (int)p.residency, (int)p.kv, (long long)p.n_ctx, (long long)p.n_ctx_max);
    CHECK(p.stream_bytes_per_token == spx_model_bytes_per_token(m), "stream bytes");
    CHECK(strstr(p.why_residency, "mmap"), "%s", p.why_residency);
    /* 50 MiB cannot even hold the 85.6 MiB of scratch */
    r.ram_budget_mb = 50;
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_ERR_RANGE && strstr(e.msg, "RAM budget"), "%s", e.msg);

    /* threads: one per physical core; a cgroup quota caps; a request wins */
    r.ram_budget_mb = 8192;
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && p.n_threads == 8, "threads %d", (int)p.n_threads);
    hw.cpu_quota = 2.5;
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && p.n_threads == 3, "threads %d (quota 2.5)", (int)p.n_threads);
    hw.n_cores = 0, hw.cpu_quota = 0;
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && p.n_threads == 16, "threads %d (cores unknown)", (int)p.n_threads);
    r.n_threads = 5;
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && p.n_threads == 5 && strstr(p.why_threads, "requested"), "threads");

    /* q4 KV needs head_dim % 32 == 0 */
    m->cfg.head_dim = 80;
    r = (spx_plan_request){.backend = "cpu", .kv = SPX_KV_Q4};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_ERR_UNSUPPORTED && strstr(e.msg, "head_dim"), "%s", e.msg);
    m->cfg.head_dim = 128;
    /* bad requests */
    r = (spx_plan_request){.n_ctx = -1};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_ERR_ARG, "negative context");
    r = (spx_plan_request){.gpu = 3};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_ERR_ARG, "gpu index");
}

/* ---- the real probe and sampler --------------------------------------------- */

static void test_probe(void) {
    spx_hw hw;
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_hw_probe_lib(&hw, "libspectra-no-such-nvml.so.1", &e) == SPX_OK, "%s", e.msg);
    CHECK(hw.n_gpus == 0 && strstr(hw.gpu_note, "not found"), "no NVML: %d GPUs, note '%s'", (int)hw.n_gpus, hw.gpu_note);
    CHECK(spx_hw_probe(&hw, &e) == SPX_OK, "%s", e.msg);
    CHECK(hw.n_cpus >= 1 && hw.ram_total > 0 && hw.ram_available > 0 && hw.page_size >= 4096 && hw.cpu_name[0],
          "cpus %d ram %llu", (int)hw.n_cpus, (unsigned long long)hw.ram_total);
    CHECK(hw.ram_available <= hw.ram_total, "available > total");
    /* this machine has no NVIDIA driver: 0 GPUs, not an error */
    if (strstr(hw.gpu_note, "not found")) CHECK(hw.n_gpus == 0, "GPUs without a driver");
    for (int32_t i = 0; i < hw.n_gpus; i++) CHECK(hw.gpus[i].mem_total > 0, "gpu %d memory", (int)i);
    cJSON *j = spx_hw_json(&hw);
    CHECK(j && cJSON_IsArray(cJSON_GetObjectItem(j, "gpus")) &&
              cJSON_GetArraySize(cJSON_GetObjectItem(j, "gpus")) == hw.n_gpus,
          "hw json");
    cJSON_Delete(j);
    CHECK(spx_pcie_gbps(4, 16) > 31 && spx_pcie_gbps(4, 16) < 32 && spx_pcie_gbps(0, 16) == 0, "pcie");
}

static void test_telemetry(void) {
    spx_telemetry *t = NULL;
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_telemetry_start(-1, &t, &e) == SPX_ERR_ARG && !t, "negative interval");
    spx_err_clear(&e);
    CHECK(spx_telemetry_start(5, &t, &e) == SPX_OK && t, "%s", e.msg);
    if (!t) return;
    /* some CPU work and memory so the numbers move */
    size_t n = (size_t)8 << 20;
    volatile char *buf = malloc(n);
    double until = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    until = ts.tv_sec + ts.tv_nsec * 1e-9 + 0.06;
    for (size_t k = 0; buf; k++) {
        buf[(k * 4096) % n] = (char)k;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (ts.tv_sec + ts.tv_nsec * 1e-9 > until) break;
    }
    spx_tele_sample *s = NULL;
    size_t ns = 0;
    spx_telemetry_stop(t, &s, &ns);
    CHECK(ns >= 3, "%zu samples in 60 ms at 5 ms", ns);
    for (size_t i = 0; i < ns; i++) {
        CHECK(s[i].rss > 0, "sample %zu rss", i);
        if (i) CHECK(s[i].t >= s[i - 1].t && s[i].cpu_user_s + s[i].cpu_sys_s >= s[i - 1].cpu_user_s + s[i - 1].cpu_sys_s,
                     "sample %zu not monotonic", i);
    }
    if (ns) CHECK(s[ns - 1].t >= 0.05 && s[ns - 1].cpu_user_s + s[ns - 1].cpu_sys_s > 0, "last t %g", s[ns - 1].t);
    char *txt = spx_telemetry_json(s, ns);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    CHECK(j && cJSON_IsArray(j) && (size_t)cJSON_GetArraySize(j) == ns, "telemetry json");
    if (j && ns) {
        cJSON *first = cJSON_GetArrayItem(j, 0);
        CHECK(cJSON_IsNumber(cJSON_GetObjectItem(first, "rss_bytes")) && cJSON_IsArray(cJSON_GetObjectItem(first, "gpus")),
              "sample fields");
    }
    cJSON_Delete(j);
    free(txt);
    free(s);
    free((void *)buf);
}

/* ---- a real model ------------------------------------------------------------- */

static void test_real_model(void) {
    char out[600];
    snprintf(out, sizeof out, "%s/tiny-llama3.trdc", tl_tmpdir());
    spx_compress_opts o = {.src_dir = tl_shared("models/tiny-llama3"), .out_path = out, .bits = 4, .group = 32,
                           .outlier_mode = SPX_OUTLIERS_AUTO, .method = SPX_Q_MSE, .n_threads = 2};
    spx_compress_stats st;
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_compress(&o, &st, &e) == SPX_OK, "compress: %s", e.msg);
    if (e.code) return;
    spx_model *m = NULL;
    spx_model_params mp = {.n_threads = 1};
    CHECK(spx_model_open(out, &mp, &m) == SPX_OK, "%s", spx_last_error());
    if (!m) return;
    const spx_config *c = &m->cfg;
    CHECK(spx_plan_model_quantized(m), "the .trdc is quantized");
    /* the loader's per-token bytes = every layer matrix + LM head + one
     * embedding row; ours add the norms and the whole embedding */
    uint64_t sum = 0;
    for (int64_t l = 0; l < c->n_layers; l++) sum += spx_plan_layer_bytes(m, l);
    uint64_t norms = (uint64_t)c->n_layers * 2 * 4 * (uint64_t)c->hidden_size;
    uint64_t G = spx_plan_global_bytes(m);
    uint64_t embed_row = (G - 4 * (uint64_t)c->hidden_size) / 2 / (uint64_t)c->vocab_size; /* untied, same shapes */
    CHECK(!c->tie_embeddings && sum - norms + (G - 4 * (uint64_t)c->hidden_size) / 2 + embed_row ==
                                    spx_model_bytes_per_token(m),
          "layers %llu norms %llu G %llu vs per token %llu", (unsigned long long)sum, (unsigned long long)norms,
          (unsigned long long)G, (unsigned long long)spx_model_bytes_per_token(m));

    spx_hw hw;
    CHECK(spx_hw_probe(&hw, &e) == SPX_OK, "%s", e.msg);
    spx_plan p;
    CHECK(plan(&hw, m, NULL, &p, &e) == SPX_OK, "%s", e.msg);
#ifndef SPX_HAVE_CUDA
    CHECK(!strcmp(p.backend, "cpu"), "backend %s without CUDA", p.backend);
#endif
    CHECK(p.residency == SPX_RES_RESIDENT && p.n_ctx == 2048 && p.kv == SPX_KV_F16, "tiny model on this machine: %s / %s",
          p.why_residency, p.why_ctx);
    /* on a synthetic GPU with a 64 MiB budget it is resident there */
    make_hw(&hw);
    spx_plan_request r = {.vram_budget_mb = 64};
    CHECK(plan(&hw, m, &r, &p, &e) == SPX_OK && !strcmp(p.backend, "cuda") && p.residency == SPX_RES_RESIDENT, "%s %s",
          p.backend, e.msg);
    cJSON *j = spx_plan_json(&p);
    CHECK(j && cJSON_IsString(cJSON_GetObjectItem(j, "residency")) &&
              cJSON_GetObjectItem(j, "n_ctx")->valuedouble == (double)p.n_ctx,
          "plan json");
    cJSON_Delete(j);
    spx_model_free(m);
}

int main(void) {
    big_model *b = malloc(sizeof *b);
    if (!b) return 1;
    make_big(b);
    test_sizes(&b->m);
    test_gpu(&b->m);
    test_backend_choice(&b->m);
    test_cpu(&b->m);
    free(b);
    test_probe();
    test_telemetry();
    test_real_model();
    return tl_finish("test_plan");
}
