/* backend.h: how a session's forward pass is executed.
 *
 * The CPU backend (forward.c) is the reference; every other backend is
 * checked against it. A backend is a table of entry points; the engine
 * calls them and never branches on which backend it has. Optional entries
 * may be NULL (documented per entry) and then the engine falls back to a
 * generic path built from the required ones. */
#ifndef SPX_BACKEND_H
#define SPX_BACKEND_H

#include "core/err.h"
#include "engine/tuning.h" /* the SPECTRA_* settings the backends read */
#include "spectra.h"
#include <stdint.h>

struct spx_model;
struct spx_session;

/* Layer offload of a session's model (ping-pong: layers stream from pinned
 * host memory through two device slots on a copy stream while the compute
 * stream runs the other slot), with timings when asked for. */
typedef struct spx_offload_stats {
    int32_t pingpong;                /* 1: some layers stream every forward pass */
    int64_t n_layers, n_layers_resident;
    uint64_t stream_bytes_per_token; /* host-to-device bytes per forward pass (per decoded token) */
    uint64_t pinned_bytes;           /* pinned host memory holding the streamed layers */
    uint64_t slot_bytes;             /* one device slot (the largest streamed layer) */
    /* timings (measured != 0), each per decode step, averaged over n_steps
     * replays of the captured decode graph at positions 1..n_steps: */
    int32_t measured, n_steps;
    double t_step_s;     /* the ping-pong step: copies overlapping compute */
    double t_compute_s;  /* the same step with the copies left out (slots keep stale weights) */
    double t_copy_s;     /* the step's copies alone, back to back on the copy stream */
    double h2d_gbps;     /* stream_bytes_per_token / t_copy_s / 1e9 */
    double hidden_share; /* 1 - (t_step_s - t_compute_s) / t_copy_s, clamped to [0, 1] */
    /* t_compute_s and hidden_share were measured: the streamed layers are of
     * two alternating kinds at most (the compute-alone pass reads each from
     * the slot of its parity, which holds the first streamed layer of that
     * parity); 0 for a hybrid whose streamed layers differ otherwise */
    int32_t uniform;
} spx_offload_stats;

typedef struct spx_backend {
    const char *name; /* "cpu", "cuda" */
    /* Once per model: upload or prepare weights (m->be_state). Required. */
    spx_status (*model_init)(struct spx_model *m, spx_err *e);
    void (*model_free)(struct spx_model *m);
    /* Once per session: KV cache and scratch (s->be_state). Required. */
    spx_status (*session_init)(struct spx_session *s, spx_err *e);
    void (*session_free)(struct spx_session *s);
    /* Runs n (<= max_batch) tokens at s->pos and advances s->pos.
     * want_logits as in session.h: logits land in s->logits (host). */
    spx_status (*forward)(struct spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e);
    /* Optional: feed one token and return the greedy next token without
     * copying logits to the host (device-side argmax; the decode loop's
     * fast path). ahead: the caller will most likely call again with *next
     * at the next position, so the backend may start that step before it
     * returns (and must give the same tokens as without). NULL: forward +
     * host argmax. */
    spx_status (*step_greedy)(struct spx_session *s, int32_t id, int32_t *next, int ahead, spx_err *e);
    /* Optional: the offload state of the session's model; with n_steps > 0
     * and streamed layers also the timings (this overwrites the session's
     * KV cache and resets it to position 0). NULL: every weight resident. */
    spx_status (*offload_stats)(struct spx_session *s, int32_t n_steps, spx_offload_stats *out, spx_err *e);
    /* Tokens per forward call (0: SPX_BATCH_MAX) and whether the session's
     * host scratch and host KV cache are used (the CPU's). */
    int32_t max_batch;
    int32_t device;
    /* Optional: feed one token and return the next one drawn with p and
     * *rng as spx_sample would (the RNG state advances); p is never greedy
     * (temperature > 0, top_k != 1: the API takes step_greedy for those);
     * ahead as for step_greedy (the next call with the same p and the
     * returned *rng).
     * NULL: forward + spx_sample on the host. */
    spx_status (*step_sample)(struct spx_session *s, int32_t id, const spx_sampler_params *p, uint64_t *rng,
                              int ahead, int32_t *next, spx_err *e);
    /* Optional: the recurrent state cache of a device backend (the host
     * copy in s->state is then unused): SPX_STATE_RESET zeroes it,
     * SPX_STATE_CHECKPOINT copies it aside, SPX_STATE_RESTORE copies the
     * checkpoint back; ordered after every call before it. Called only
     * for models with recurrent layers. NULL: the host's s->state. */
    spx_status (*state_op)(struct spx_session *s, int op, spx_err *e);
    /* Optional: weight refinement on a device backend. refine_attach
     * takes m->refine (attached by the engine, every residual resident in
     * memory) to the device after it is bound and fails with a message for
     * what it cannot run; refine_detach drops the device's copy before the
     * engine frees it. NULL: the backend does not refine (the engine
     * refuses refinement on a device backend without them). */
    spx_status (*refine_attach)(struct spx_model *m, spx_err *e);
    void (*refine_detach)(struct spx_model *m);
    /* Optional: a batch step (engine/batch.c): row t is ids[t] fed to s[t]
     * at that session's position, 2 <= n <= batch_rows distinct sessions
     * of one model (checked: room, ids; no weight refinement attached);
     * the rows' logits land in s[0]->logits [n, vocab] (host), or with
     * best set only each row's argmax (the first maximum) in best[n]; each
     * session advances by one. Each row's numbers must be those of a
     * one-token forward of its session alone (on a GPU: to the rounding of
     * its prompt products). SPX_ERR_UNSUPPORTED, before anything runs:
     * these sessions step one by one. NULL: the sessions step one by one. */
    spx_status (*batch_forward)(struct spx_session *const *s, const int32_t *ids, int64_t n, int32_t *best, spx_err *e);
    int32_t batch_rows;
    /* Optional: forward n tokens (checked) and write each row's argmax
     * (the first maximum) to best[n], the logits left on the device. NULL:
     * forward with every row's logits + the host's argmax. */
    spx_status (*forward_argmax)(struct spx_session *s, const int32_t *ids, int64_t n, int32_t *best, spx_err *e);
} spx_backend;

enum { SPX_STATE_RESET = 0, SPX_STATE_CHECKPOINT = 1, SPX_STATE_RESTORE = 2 };

const spx_backend *spx_backend_cpu(void);
#ifdef SPX_HAVE_CUDA
const spx_backend *spx_backend_cuda(void);
#endif
/* By name ("cpu", "cuda", "auto"); NULL if not compiled in. "auto" picks
 * cuda when compiled in and a device is present, else cpu. */
const spx_backend *spx_backend_find(const char *name);
/* The offload state through the backend (see offload_stats above). */
spx_status spx_session_offload_stats(struct spx_session *s, int32_t n_steps, spx_offload_stats *out, spx_err *e);

#endif
