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
#include <stdint.h>

struct spx_model;
struct spx_session;

typedef struct spx_backend {
    const char *name; /* "cpu", "cuda" */
    /* Once per model: upload or prepare weights (m->be_state). Required. */
    spx_status (*model_init)(struct spx_model *m, spx_err *e);
    void (*model_free)(struct spx_model *m);
    /* Once per session: KV cache and scratch (s->be_state). Required. */
    spx_status (*session_init)(struct spx_session *s, spx_err *e);
    void (*session_free)(struct spx_session *s);
    /* Runs n (<= SPX_BATCH_MAX) tokens at s->pos and advances s->pos.
     * want_logits as in session.h: logits land in s->logits (host). */
    spx_status (*forward)(struct spx_session *s, const int32_t *ids, int64_t n, int want_logits, spx_err *e);
    /* Optional: feed one token and return the greedy next token without
     * copying logits to the host (device-side argmax; the decode loop's
     * fast path). NULL: forward + host argmax. */
    spx_status (*step_greedy)(struct spx_session *s, int32_t id, int32_t *next, spx_err *e);
} spx_backend;

const spx_backend *spx_backend_cpu(void);
#ifdef SPX_HAVE_CUDA
const spx_backend *spx_backend_cuda(void);
#endif
/* By name ("cpu", "cuda", "auto"); NULL if not compiled in. "auto" picks
 * cuda when compiled in and a device is present, else cpu. */
const spx_backend *spx_backend_find(const char *name);

#endif
