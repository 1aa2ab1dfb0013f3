/* serve.h: `spectra serve`, an OpenAI-compatible HTTP server (docs/serve.md).
 *
 * Concurrency design. libmicrohttpd runs in thread-per-connection mode:
 * each HTTP connection has its own thread, which reads and validates a
 * request (serve_req.c) and may block while it waits for the scheduler.
 * ONE scheduler thread (serve_sched.c) owns the model and the --parallel
 * sessions (created once at start, reused through spx_session_reset) and
 * makes every library call on them, tokenization and template rendering
 * included, so the server does not depend on the library's thread safety.
 * A connection thread hands its request to the scheduler through a bounded
 * queue (--queue; full: 503). The scheduler renders and tokenizes each new
 * request, refuses it (400) or accepts it, feeds accepted prompts in
 * 128-token pieces into free sessions (spx_session_eval), and advances all
 * running sessions together, one token each, with spx_batch_step (per-row
 * sampler parameters and RNG; the logits of every row when one of them
 * wants logprobs). Each request has an output buffer guarded by its own
 * mutex and condition variable: the scheduler appends the bytes the client
 * will get (SSE chunks, or the whole JSON body at the end), and the
 * connection thread sends them (MHD_create_response_from_callback for a
 * stream). A connection that goes away sets the request's cancel flag; the
 * scheduler frees its session at its next step. A request is shared by
 * its connection and the scheduler and freed by the last of the two to let
 * it go (a reference count). */
#ifndef SPX_SERVE_H
#define SPX_SERVE_H

#include "spectra.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SRV_MAX_STOP 4
#define SRV_MAX_TOP_LOGPROBS 20

typedef enum srv_endpoint {
    SRV_EP_CHAT = 0,
    SRV_EP_COMPLETIONS,
    SRV_EP_MODELS,
    SRV_EP_HEALTH,
    SRV_EP_METRICS,
    SRV_EP_OTHER,
    SRV_EP_COUNT
} srv_endpoint;
const char *srv_endpoint_path(srv_endpoint ep);

/* A validated generation request (serve_req.c fills it from the body). */
typedef struct srv_params {
    int chat;               /* 1: /v1/chat/completions, 0: /v1/completions */
    char *prompt;           /* completions: the prompt text */
    char *messages_json;    /* chat: the messages array as JSON */
    char *tools_json;       /* chat: the tools array as JSON, or NULL */
    char *model;            /* echoed in the answer */
    int64_t max_tokens;     /* -1: until the end of the context */
    double temperature, top_p;
    int64_t top_k;          /* 0: off */
    int has_seed;
    uint64_t seed;
    char *stop[SRV_MAX_STOP];
    size_t stop_len[SRV_MAX_STOP];
    int n_stop;
    int logprobs;           /* 1: logprobs wanted */
    int top_logprobs;       /* 0 .. SRV_MAX_TOP_LOGPROBS */
    int stream, include_usage;
} srv_params;
void srv_params_free(srv_params *p);

/* A field error: HTTP status, message and the offending parameter. */
typedef struct srv_error {
    int status;
    char param[64];
    char msg[512];
} srv_error;

/* Parses and validates a request body; 0 with *err set on failure. */
int srv_parse_request(const char *body, size_t len, int chat, const char *default_model, srv_params *out,
                      srv_error *err);
/* {"error": {"message", "type", "param", "code"}} (malloc'd); type from the
 * status (400: invalid_request_error, 401: authentication_error, ...). */
char *srv_error_json(int status, const char *msg, const char *param, const char *code);

/* The request states. */
typedef enum srv_state {
    SRV_QUEUED = 0,  /* waiting for the scheduler to look at it */
    SRV_ACCEPTED,    /* the prompt fits: the answer is a 200 (bytes follow in out) */
    SRV_DONE         /* out is complete; status says what it is */
} srv_state;

typedef struct srv_req {
    srv_params p;
    char id[48];
    int64_t created;
    pthread_mutex_t mu; /* guards state, status, out*, refs */
    pthread_cond_t cv;  /* signalled when any of them changes */
    srv_state state;
    int status;         /* HTTP status of the answer (200 unless refused) */
    char *out;          /* bytes for the client; out[out_off .. out_len) not yet sent */
    size_t out_len, out_cap, out_off;
    int refs;
    atomic_int cancelled; /* the client went away */
    struct srv_req *next; /* the scheduler's lists */
    int32_t *ids;         /* the scheduler's: the prompt's tokens */
    size_t n_ids;
} srv_req;

/* Appends to r->out and wakes the reader (locks r->mu). */
void srv_req_append(srv_req *r, const char *s, size_t n);
/* Sets the state (and the status when != 0), wakes the reader. */
void srv_req_set_state(srv_req *r, srv_state st, int status);
/* Drops one reference; the last frees. */
void srv_req_release(srv_req *r);

/* Counters for /metrics (guarded by their own mutex). */
#define SRV_METRIC_STATUSES 32
typedef struct srv_metrics {
    pthread_mutex_t mu;
    struct { int ep, status; uint64_t n; } req[SRV_METRIC_STATUSES];
    int n_req;
    uint64_t prompt_tokens, gen_tokens, cancelled, steps;
    double prefill_s, decode_s;
    double tps;           /* generated tokens per second of work (prefill and decode) over the last
                           * window of at least 1 s of it */
    double win_busy;      /* the window being filled: its seconds of work and tokens */
    uint64_t win_tokens;
    int64_t queue_depth, active, parallel;
    double start;         /* spx_now() at the start */
    int64_t start_unix;   /* time() then */
} srv_metrics;
void srv_metrics_count(srv_metrics *mt, srv_endpoint ep, int status);
char *srv_metrics_text(srv_metrics *mt);

/* The scheduler (serve_sched.c). */
typedef struct srv_sched srv_sched;
typedef struct srv_sched_opts {
    int64_t parallel;      /* sessions */
    int64_t queue;         /* requests waiting at most */
    int64_t n_ctx;
    spx_kv_type kv;
    const spx_template *tmpl; /* --chat-template, or NULL: the model's */
} srv_sched_opts;
/* Creates the sessions and starts the thread; prints the error and
 * returns NULL on failure. */
srv_sched *srv_sched_start(spx_model *m, const srv_sched_opts *o, srv_metrics *mt);
/* Hands r to the scheduler (taking one reference). 0: refused (queue full
 * or shutting down; *why says which). */
int srv_sched_submit(srv_sched *s, srv_req *r, const char **why);
/* Asks the thread to stop: every request ends (an error answer for those
 * not finished), later submissions are refused; joins the thread. */
void srv_sched_stop(srv_sched *s);
/* Frees the sessions and s (after the HTTP side has stopped: its threads
 * call srv_sched_submit and srv_sched_wake). */
void srv_sched_free(srv_sched *s);
/* Wakes the thread (a request was cancelled). */
void srv_sched_wake(srv_sched *s);
int64_t srv_sched_n_ctx(const srv_sched *s);

/* The HTTP side (serve_http.c). */
typedef struct srv_http srv_http;
typedef struct srv_http_opts {
    int listen_fd;          /* bound and listening */
    const char *api_key;    /* NULL: no auth */
    size_t max_body;
    const char *model_name; /* /v1/models and the default "model" */
    int64_t conn_limit;     /* connections (each a thread) at once */
} srv_http_opts;
srv_http *srv_http_start(const srv_http_opts *o, srv_sched *s, srv_metrics *mt);
void srv_http_stop(srv_http *h);

/* The answer's JSON (serve_req.c), built on the scheduler thread. */
typedef struct srv_lp_top { char *tok; double lp; } srv_lp_top;
typedef struct srv_logprob {
    char *tok;            /* the token's text (special tokens included) */
    double lp;
    int n_top;
    srv_lp_top top[SRV_MAX_TOP_LOGPROBS];
    size_t offset;        /* where its text starts in the completion */
} srv_logprob;
void srv_logprob_free(srv_logprob *l);
/* One SSE event "data: {json}\n\n" (malloc'd). text may be NULL (no
 * content); finish NULL: not the last; role: the chat's first chunk. */
char *srv_chunk(const srv_req *r, const char *text, size_t len, const srv_logprob *lps, size_t n_lp, const char *finish,
                int role);
/* The include_usage chunk. */
char *srv_usage_chunk(const srv_req *r, int64_t n_prompt, int64_t n_gen);
/* The whole non-streamed answer. */
char *srv_answer(const srv_req *r, const char *text, size_t len, const srv_logprob *lps, size_t n_lp,
                 const char *finish, int64_t n_prompt, int64_t n_gen);

#endif
