/* plan.h: the execution plan (SPECTRA section 4.6): from what the probe
 * found, the model's sizes and the user's request, decide the backend, where
 * the weights live, the KV cache precision, the context length and the
 * thread count, each with a one-line reason.
 *
 * spx_plan_make() is a pure function of (hw, model, request): it reads no
 * hardware itself, so tests feed it synthetic machines.
 *
 * Memory model (bytes; B = SPX_BATCH_MAX tokens per forward chunk):
 *   layer l   L_l = its seven matrices (4-bit: codes + fp16 scales + packed
 *             zeros + fp16 outlier columns and int32 indices; dense: elements
 *             * dtype size) + its float32 norm gains and biases
 *   global    G   = embedding + LM head (once when tied) + final norm (f32);
 *             always on the device: the fused embedding gathers rows there
 *   weights   W   = G + sum_l L_l
 *   KV(T)     T * spx_kv_bytes_per_token(kv, n_layers, n_kv_heads*head_dim)
 *   scratch   S(T) = 4*B*(H + max(H,qd) + 2*qd + 2*kvd + 2*I + V)   activations, logits
 *                  + 4*n_heads*T                                    attention scores
 *   cuda: L_l, G and S are what the CUDA backend allocates, from the one
 *             definition in engine/memory.h (device images: components
 *             aligned, matrices tiled where the layout holds them; the
 *             session's buffers for SPX_BATCH_MAX_CUDA tokens, no per-token
 *             scratch); the backend asks this planner for its residency
 *             (spx_plan_make with the device's free memory), so the numbers
 *             and the policy live here only
 *   resident:  W + KV(T) + S(T) <= budget
 *   ping-pong: G + 2*max_l L_l + KV(T) + S(T) <= budget; the layers that
 *             still fit in what is left stay resident (from layer 0 on), the
 *             others stream from pinned host memory through the two slots.
 * Budgets: GPU: req->vram_budget_mb, else the device's free memory minus
 * SPX_PLAN_VRAM_MARGIN (CUDA context, library workspaces, fragmentation).
 * CPU: req->ram_budget_mb, else available RAM minus max(SPX_PLAN_RAM_MARGIN,
 * 10%) (the rest of the system keeps working).
 *
 * Decisions, in order:
 *   backend   cuda when the build has CUDA, a GPU was found, every layer
 *             matrix is quantized (a 4-bit .trdc) and the KV type is not a
 *             forced f32 (CPU only); else cpu. --backend forces.
 *   KV / residency / context:
 *             T = requested context, or min(model maximum, 4096).
 *             resident with f16 KV if it fits, else resident with q4 KV (cheaper
 *             than streaming weights every token), else (GPU) ping-pong with
 *             f16, then q4 / (CPU) weights mmap-streamed from the file with the
 *             KV cache in RAM. A forced --kv is used as given. When nothing
 *             fits at T: a requested context is an error that names the
 *             largest one that fits; the default one shrinks to it (to keep
 *             the weights resident only down to 1024 tokens; when streamed,
 *             as far as needed, except that the auto backend on detected
 *             GPU memory falls back to the CPU rather than go below 1024).
 *   n_ctx_max the largest context the chosen residency and KV type leave
 *             room for (ping-pong: with only the two slots), capped at the
 *             model's maximum (or the request, if larger).
 *   threads   requested, else one per physical core (decode is memory-bound;
 *             hyper-threads add little), capped by the cgroup CPU quota. */
#ifndef SPX_PLAN_H
#define SPX_PLAN_H

#include "core/err.h"
#include "engine/kvcache.h" /* spx_kv_type_name */
#include "engine/probe.h"
#include "spectra.h"
#include <stdint.h>

struct spx_model;

#define SPX_PLAN_VRAM_MARGIN ((uint64_t)512 << 20)
#define SPX_PLAN_RAM_MARGIN ((uint64_t)1 << 30)
#define SPX_PLAN_DEFAULT_CTX 4096
/* A default context shrinks down to this to keep the weights resident
 * before streaming them is considered: streaming costs far more speed than
 * a shorter default context costs use. */
#define SPX_PLAN_MIN_CTX 1024
#define SPX_PLAN_MAX_CTX ((int64_t)1 << 24) /* as spx_session_new */
#define SPX_PLAN_REASON_MAX 320

typedef enum spx_residency {
    SPX_RES_RESIDENT = 0,   /* every weight in device memory (cuda) or in RAM (cpu) */
    SPX_RES_PINGPONG = 1,   /* cuda: layers stream from pinned host memory through two device slots */
    SPX_RES_MMAP_STREAM = 2 /* cpu: weights larger than RAM, paged in from the file as they are read */
} spx_residency;

typedef struct spx_plan_request {
    const char *backend;    /* "auto" or NULL, "cpu", "cuda" */
    int64_t n_ctx;          /* 0: min(model maximum, 4096), shrunk if it does not fit */
    int64_t vram_budget_mb; /* MiB of device memory the model may use; 0: free - margin */
    int64_t ram_budget_mb;  /* MiB of RAM; 0: available - margin */
    spx_kv_type kv;         /* SPX_KV_DEFAULT: choose (f16, else q4); else forced */
    int32_t n_threads;      /* 0: choose */
    int32_t gpu;            /* index into hw->gpus */
} spx_plan_request;

typedef struct spx_plan {
    char backend[8];               /* "cpu" or "cuda" */
    int32_t gpu;                   /* index into hw->gpus; -1 on cpu */
    spx_residency residency;
    int64_t n_layers;
    int64_t n_layers_resident;     /* == n_layers unless ping-pong */
    int32_t n_slots;               /* ping-pong device slots (2); 0 otherwise */
    spx_kv_type kv;                /* SPX_KV_F16 or SPX_KV_Q4 (or F32 if forced) */
    int64_t n_ctx;                 /* context the session should allocate */
    int64_t n_ctx_max;             /* largest context this residency and KV type allow */
    int32_t n_threads;
    /* accounting, bytes */
    uint64_t budget;               /* of device memory (cuda) or RAM (cpu) */
    uint64_t weight_bytes;         /* W */
    uint64_t global_bytes;         /* G */
    uint64_t layer_bytes_max;      /* max_l L_l (= one slot) */
    uint64_t kv_bytes_per_token;
    uint64_t kv_bytes;             /* KV(n_ctx) */
    uint64_t scratch_bytes;        /* S(n_ctx) */
    uint64_t planned_bytes;        /* what the plan places in the budgeted memory */
    uint64_t host_pinned_bytes;    /* ping-pong: streamed layers kept in pinned host RAM */
    uint64_t stream_bytes_per_token; /* over PCIe (ping-pong) or from the file (mmap, at most) */
    uint64_t read_bytes_per_token; /* weight bytes one decoded token reads (spx_model_bytes_per_token) */
    /* one line each */
    char why_backend[SPX_PLAN_REASON_MAX];
    char why_residency[SPX_PLAN_REASON_MAX];
    char why_kv[SPX_PLAN_REASON_MAX];
    char why_ctx[SPX_PLAN_REASON_MAX];
    char why_threads[SPX_PLAN_REASON_MAX];
} spx_plan;

/* Bytes of layer l (L_l above) and of the global tensors (G). */
uint64_t spx_plan_layer_bytes(const struct spx_model *m, int64_t l);
uint64_t spx_plan_global_bytes(const struct spx_model *m);
/* Scratch S(T) above. */
uint64_t spx_plan_scratch_bytes(const struct spx_model *m, int64_t n_ctx);
/* The CUDA backend's: a layer's and the global device image (rounded to
 * their aligned starts in the arena) and the session's buffers besides the
 * KV cache (engine/memory.h). */
uint64_t spx_plan_cuda_layer_bytes(const struct spx_model *m, int64_t l);
uint64_t spx_plan_cuda_global_bytes(const struct spx_model *m);
uint64_t spx_plan_cuda_scratch_bytes(const struct spx_model *m);
/* True when every layer matrix is group-quantized (what the CUDA backend runs). */
bool spx_plan_model_quantized(const struct spx_model *m);

/* req may be NULL (all defaults). Fails with SPX_ERR_RANGE when nothing
 * fits (the message gives the sizes and what would), SPX_ERR_ARG /
 * SPX_ERR_UNSUPPORTED for impossible requests (unknown backend, cuda in a
 * build without it, q4 KV with head_dim not a multiple of 32). */
spx_status spx_plan_make(const spx_hw *hw, const struct spx_model *m, const spx_plan_request *req, spx_plan *out,
                         spx_err *e);

const char *spx_residency_name(spx_residency r); /* "resident", "ping-pong", "mmap-stream" */

struct cJSON;
/* The plan as a new JSON object (NULL on out of memory). */
struct cJSON *spx_plan_json(const spx_plan *p);

#endif
