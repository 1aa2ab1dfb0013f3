/* cu_backend.cuh: the CUDA backend's internal state and the entry points its
 * files share (the spx_backend table, engine/backend.h, is in cu_step.cu).
 *
 * Files by concern: cu_model.cu (upload, residency, model init/free),
 * cu_session.cu (device KV cache and scratch), cu_forward.cu (the forward
 * pass assembled from the model's layers), cu_offload.cu (ping-pong layer
 * streaming and its measurements), cu_step.cu (decode graphs, the step and
 * queued-ahead protocol).
 *
 *
 * model_init uploads every quantized matrix component by component exactly
 * as laid out in the .trdc map (codes, fp16 scales, packed zero nibbles,
 * outlier indices and values: no re-layout) into one device allocation,
 * plus norm gains, biases and RoPE frequencies as float32. Dense matrices
 * are refused ("compress first"): this backend runs 4-bit G32 .trdc models.
 *
 * session_init allocates the device KV cache (fp16, the CPU's layout, or
 * with --kv q4 the CPU's 4-bit rows split into code/scale/zero planes,
 * kvq4_math.h, or with --kv k2v2 .. k4v4 StrataFlux-KV: the CPU's low-bit
 * arrays and a mapped pinned refinement tier, kvlow_dev.cuh, cu_kvlow.cu:
 * rope_store writes sinks/ring, kvlow_attend.cu and kvlow_refine.cu
 * replace the attention kernels, and one encode launch after the last
 * layer encodes completed blocks, in the decode graph too) and
 * scratch for SPX_BATCH_MAX_CUDA tokens. forward(n) runs the same math as the
 * CPU reference (engine/forward.c): n == 1 through the fused GEMV path
 * (RMSNorm in the GEMV prologue, merged Q/K/V launch, residual adds and
 * SwiGLU in GEMV epilogues, RoPE and the fp16 KV store in the decode
 * attention kernel), n >= 2 through the tensor-core GEMM (n <= 16, the
 * decode-sized passes: gemm_mtok.cuh's few-token kernel). Every
 * kernel reads the position (and the embedding its token ids) from device
 * memory, so step_greedy captures one decode step (ending with the argmax
 * and the position advance on the device) in a CUDA graph once per
 * session and replays it; only the next token id comes back to the host.
 *
 * Ping-pong layer offload (layers streamed from pinned host memory through
 * two device slots): cu_offload.cu.
 *
 * The single-token kernels are chained with programmatic dependent launch
 * (each fetches its first weights before waiting for the previous one);
 * SPECTRA_CUDA_PDL=0 turns that off (for measurements). The decode
 * attention kernel does rope_store's work (q/k norm, RoPE, the store of
 * the token's K/V row, quantized for --kv q4); SPECTRA_CUDA_KVQ4_FUSE=0
 * keeps rope_store's launch for the 4-bit cache (measurements).
 *
 * Limits: one device (the first); KV cache fp16, q4 or low-bit (--kv f32
 * is refused with a message; low-bit needs head_dim 32, 64 or 128);
 * head_dim <= 256; cols <= SPX_GEMV_MAX_COLS.
 * The host-side KV cache and scratch that api.c allocates for every
 * session stay unused here. */
#ifndef SPX_CUDA_CU_BACKEND_CUH
#define SPX_CUDA_CU_BACKEND_CUH

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
#include "engine/blocks.h"
#include "engine/plan.h"
#include "engine/session.h"
#include "engine/memory.h"
#include "quant/g32.h"
}

/* ---- per-model device state ------------------------------------------- */

/* A layer on the device by slot (model/arch.h): w[s] for matrix slots,
 * v[s] for vectors; absent slots are zero / NULL. */
struct cu_layer {
    spx_dqmat w[SPX_SL_COUNT];
    float *v[SPX_SL_COUNT];
};

/* Weight refinement (cu_refine.cu): one refined matrix, by layer and slot. */
struct cu_rmat {
    const uint8_t *codes;  /* device address of its columns in the pinned tier, or NULL: no residual */
    const float *scales;   /* [rows], device */
    const uint8_t *skip;   /* [cols] device outlier flags of this slot's matrix, or NULL */
    int64_t rows, cols, col_stride;
    int set;               /* SPX_RSET_* */
};
struct cu_refine {
    uint8_t *host, *host_d;   /* pinned, mapped: every residual's columns (host and device addresses) */
    size_t host_bytes;
    void *dev;                /* scales and skip flags */
    cu_rmat *mats;            /* [n_layers * SPX_SL_COUNT] */
    int64_t max_cols;
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
    cu_refine *ref;           /* weight refinement, or NULL (cu_refine.cu) */
};

/* Two passes over the weights: the first (dry) sizes the arena, the second
 * copies. Every component starts 256-byte aligned. */
/* ---- per-session device state ------------------------------------------ */

/* LM_ROWS: every row's argmax to d_ids[0 .. n) (n <= SPX_BATCH_MAX), the
 * logits left on the device (cu_forward_argmax) */
enum { LM_NONE = 0, LM_LAST = 1, LM_ALL = 2, LM_ARGMAX = 3, LM_SAMPLE = 4, LM_ROWS = 5 };


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

/* A session's refinement state (cu_refine.cu): the side stream, its fork
 * and join events, the selection and the deltas of the current launch. */
#define CU_RF_LAG_SLOTS 8 /* lagged deltas in flight: at most 2 per half-block of the longest lag (4) */
#define CU_RF_LEAD_SLOTS 5 /* fetches in flight: lead + 1 at most (the next lead targets and the one about to run) */
/* One pending fetch lead (cu_refine.cu): the snapshot of the residual
 * stream it selected from, its selection and staged columns (refine.cuh's
 * staging layout) for the launch of half-block target. */
struct cu_rf_lead {
    float *snap;          /* [lead_rows] */
    int32_t *sel;         /* [SPX_RF_MAX_COLS] selection (chunk c at c * kcap), values in selx, counts in cnt */
    float *selx;
    int *cnt;
    uint8_t *stage_base;  /* lead_stage bytes: the launch's matrices' staging, each 256-byte aligned */
    uint8_t *stage[3];    /* per matrix of the launch (its order), NULL: no residual */
    cudaEvent_t start, fetched; /* st reached the fetch's point; its columns are staged */
    int target;           /* the half-block whose launch applies it; -1: free */
    int64_t l;            /* the target launch's layer and first slot (checked when it is taken) */
    int slot0;
};
struct cu_rf_sess {
    cudaStream_t rs, rs_lag; /* the side streams: joined at once, and lagged (so that a lagged refinement
                              * does not hold up the next launch's on rs) */
    cudaEvent_t fork, join;
    void *buf;
    int32_t *sel;
    float *selx, *delta;
    int *cnt;
    float *d[3];         /* the current launch's delta per matrix, NULL: none */
    uint64_t epoch;      /* the model's refine_epoch its graphs were captured with */
    /* fetch lag: output projections whose refinement is added to h some
     * half-blocks later; slot i's delta at lag_delta + i * lag_rows, done
     * when lag_ev[i] is */
    float *lag_delta;
    int32_t *lag_sel;               /* per slot: the selection (SPX_RF_MAX_COLS entries) and counts */
    float *lag_selx;
    int *lag_cnt;
    int64_t lag_rows;
    cudaEvent_t lag_ev[CU_RF_LAG_SLOTS];
    int lag_due[CU_RF_LAG_SLOTS];   /* half-block after which it is added; -1: free */
    float lag_mult[CU_RF_LAG_SLOTS];
    int lag_next;
    /* fetch lead: n_lead slots (0: no lead) in lead_buf, fetched on rs_lead */
    cudaStream_t rs_lead;
    void *lead_buf;
    size_t lead_bytes, lead_stage; /* lead_buf's size; staging bytes per slot */
    int64_t lead_rows;             /* the snapshot's length: hidden_size */
    int n_lead;
    cu_rf_lead lead[CU_RF_LEAD_SLOTS];
};

/* One decode launch's refinement: layer, the matrices' slots (in launch
 * order) and its input (x; rmsnorm(x) * gain with gain; x * x2 with x2). */
struct cu_rf_launch {
    int64_t l;
    int n;
    int slot[3];
    const float *x, *gain, *x2;
    float eps;
};

/* The session's low-bit KV cache (--kv k2v2 .. k4v4; cu_kvlow.cu, the
 * kernels' layout in kvlow_dev.cuh). */
#include "cuda/kvlow_dev.cuh"
struct cu_kvl {
    spx_kvl_dev d;                /* the device arrays and the mapped tier */
    uint8_t *tier_host;           /* pinned tier (cudaHostAllocMapped) */
    unsigned long long *stats_h;  /* pinned: [2] the counters as the last pass left them */
    float *scratch;               /* refinement scratch for tmax tokens */
    int tmax, max_sel, n_splits;  /* slice of a prompt's refinement; most groups one query refines; decode splits */
    int64_t hi;                   /* end of the last pass (host order): truncate detection */
    void *allocs[12];
    int n_allocs;
};

struct cu_sess {
    cudaStream_t st;
    __half *kc, *vc;                 /* [n_attn_layers, n_ctx, kvd]; --kv q4: the bytes of kvq4_math.h's layout */
    float *h, *x, *q, *k, *v, *att, *gate, *up, *logits, *part;
    float *proj;                     /* [B, widest recurrent in_proj output] or NULL */
    float *state, *state_ckpt;       /* the recurrent layers' state cache (m->state_floats) and its checkpoint */
    float *ws;                       /* split-K workspace of the GEMM */
    float *ssd_work;                 /* the chunked SSD scan's scratch (spx_mem_ssd_work_floats for B tokens) or NULL */
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
    cu_kvl *kvl;                     /* --kv k2v2 .. k4v4 (kc, vc unused), else NULL */
    void *allocs[32];                /* every cudaMalloc above, freed in session_free */
    int n_allocs;
    cu_pp pp;                        /* ping-pong offload (see the top of this file) */
    cu_rf_sess rf;                   /* weight refinement */
};

static inline double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

static inline int64_t cu_pp_n_stream(const spx_model *m, const cu_model *cm) { return m->cfg.n_layers - cm->n_resident; }


/* ---- entry points shared by the backend's files ---------------------------- */

spx_status cu_capture_decode(spx_session *s, cu_sess *cs, spx_err *e);
spx_status cu_capture_graph(spx_session *s, cu_sess *cs, cudaGraphExec_t *out, spx_err *e, int lmode = LM_ARGMAX);
spx_status cu_forward(spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e);
void cu_model_free(spx_model *m);
spx_status cu_model_init(spx_model *m, spx_err *e);
spx_status cu_offload_stats(spx_session *s, int32_t n_steps, spx_offload_stats *o, spx_err *e);
void cu_session_free(spx_session *s);
/* The low-bit KV cache (cu_kvlow.cu): init/free with the session; one
 * layer's attention (+ refinement) of the pass's n tokens from cs->q into
 * cs->att; after the pass's layers, the encode of completed blocks; before
 * a pass at p0, the counters and the rewrite a truncate may need. */
spx_status cu_kvl_init(spx_session *s, cu_sess *cs, spx_err *e);
void cu_kvl_free(cu_sess *cs);
spx_status cu_kvl_attention(spx_session *s, cu_sess *cs, int64_t kv_layer, int n, cudaStream_t st, spx_err *e);
spx_status cu_kvl_commit(cu_sess *cs, int n, cudaStream_t st, spx_err *e);
spx_status cu_kvl_before(spx_session *s, cu_sess *cs, int64_t p0, int n, spx_err *e);
spx_status cu_session_init(spx_session *s, spx_err *e);
spx_status cu_state_op(spx_session *s, int op, spx_err *e);
spx_status cu_enqueue_forward(spx_session *s, int n, int lmode, int n_splits, spx_err *e, spx_session *const *rs = NULL);
/* The backend's batch_forward (engine/backend.h): SPX_ERR_UNSUPPORTED,
 * before anything runs, for a session with a low-bit KV cache. */
spx_status cu_forward_batch(spx_session *const *ss, const int32_t *ids, int64_t n, int32_t *best, spx_err *e);
/* The backend's forward_argmax (engine/backend.h). */
spx_status cu_forward_argmax(spx_session *s, const int32_t *ids, int64_t n, int32_t *best, spx_err *e);
/* Whether the CUDA blocks run every layer of m (engine/blocks.h; at model open). */
spx_status cu_forward_check(const spx_model *m, spx_err *e);
spx_status cu_pp_begin(const spx_model *m, const cu_model *cm, cu_sess *cs, spx_err *e);
spx_status cu_pp_end(const spx_model *m, const cu_model *cm, cu_sess *cs, spx_err *e);
spx_status cu_pp_layer_begin(const cu_model *cm, cu_sess *cs, int64_t l, cu_layer *out, spx_err *e);
spx_status cu_pp_layer_end(const spx_model *m, const cu_model *cm, cu_sess *cs, int64_t l, spx_err *e);
int cu_splits_for(const cu_model *cm, const spx_config *c, int n_tok, int64_t max_keys);
/* Weight refinement (cu_refine.cu). attach/detach: the backend table's. */
extern "C" spx_status cu_refine_attach(spx_model *m, spx_err *e);
extern "C" void cu_refine_detach(spx_model *m);
void cu_refine_free(cu_model *cm);
void cu_rf_session_free(cu_sess *cs);
/* Before enqueueing passes: session buffers for the model's refinement,
 * and the captured graphs dropped when its budgets changed. */
spx_status cu_rf_prepare(spx_session *s, cu_sess *cs, spx_err *e);
/* Starts a decode launch's refinement on the side stream after what st has
 * enqueued (the launch's input); *on: whether it did (the set's budget > 0
 * and some matrix of the launch has a residual). */
spx_status cu_rf_fork(const spx_model *m, const cu_model *cm, cu_sess *cs, const cu_rf_launch &L, cudaStream_t st,
                      bool *on, spx_err *e, int lag_slot = -1, int lead_slot = -1);
/* Fetch lead (spx_refine_rt cuda_lead, half-blocks; attention q/k/v and
 * MLP gate/up launches of resident layers). cu_rf_input_launch: the
 * decode launch of block kind k of layer l that reads rmsnorm(x) (n = 0:
 * the kind has none that lead serves). cu_rf_lead_start, at a half-block
 * point with x = h as it is there: snapshots it on st and starts on
 * rs_lead the selection of launch L's channels (with L's norm) and the
 * fetch of their columns, for the launch of half-block target (*on: it
 * did; not when L is not refined or no slot is free: the launch then
 * refines as without lead). cu_rf_lead_take, in half-block hb before the
 * launch's cu_rf_fork: the slot to pass it (-1: none), freed for later
 * fetches (st joins its apply before the next point). cu_rf_lead_end,
 * at the end of the pass: st waits for any fetch not taken (nothing may
 * stay forked past a graph capture) and every slot is freed. */
int cu_rf_lead_of(const spx_model *m);
cu_rf_launch cu_rf_input_launch(const spx_config *c, const cu_layer *L, int64_t l, spx_block_kind k, const float *x,
                                float eps);
spx_status cu_rf_lead_start(const spx_model *m, const cu_model *cm, cu_sess *cs, const cu_rf_launch &L, int target,
                            cudaStream_t st, bool *on, spx_err *e);
spx_status cu_rf_lead_take(cu_sess *cs, int hb, const cu_rf_launch &L, int *slot, spx_err *e);
spx_status cu_rf_lead_end(cu_sess *cs, cudaStream_t st, spx_err *e);
/* Fetch lag of an output projection (o, down, out_proj: one matrix into
 * h): the half-blocks its refinement is deferred by (spx_refine_rt
 * cuda_lag), and the slot to fork it into (-1: none free, or no lag).
 * cu_rf_lag_push registers the forked slot as due after half-block due;
 * cu_rf_flush adds (st waits for them) every pending delta due at or
 * before hb, or all with hb < 0 (the end of the pass: nothing may stay
 * forked past a graph capture). */
int cu_rf_lag_of(const spx_model *m);
int cu_rf_lag_slot(cu_sess *cs);
void cu_rf_lag_push(cu_sess *cs, int slot, int due, float mult);
spx_status cu_rf_flush(cu_sess *cs, float *h, int64_t H, int hb, cudaStream_t st, spx_err *e);
/* After the launch's base GEMV: st waits for the refinement and adds
 * mult * delta to y[i] (rows[i]) for each refined matrix i (y[i] NULL: skipped). */
spx_status cu_rf_join(cu_sess *cs, const cu_rf_launch &L, float *const *y, const int64_t *rows, float mult,
                      cudaStream_t st, spx_err *e);
/* A gate/up launch stored raw: gate = silu(gate + dg) * (up + du). */
spx_status cu_rf_join_swiglu(cu_sess *cs, float *gate, const float *up, int64_t n, cudaStream_t st, spx_err *e);

#endif
