/* spectra.h: public C API of the Spectra inference engine.
 *
 * Opaque handles for everything with state; status codes for every failure;
 * a message per handle that names the file, the field and what was wrong.
 * The library never exits or aborts on bad input.
 *
 * Typical use:
 *   spx_model *m; spx_model_open("path/to/hf_dir_or.trdc", NULL, &m);
 *   spx_session *s; spx_session_new(m, NULL, &s);
 *   spx_session_eval(s, ids, n, logits_out);   // logits of the last token
 *   ...
 *   spx_session_free(s); spx_model_free(m);
 *
 * Threads: one model may be shared by sessions used from different
 * threads at once. Every call that runs a pass or changes a session
 * (spx_session_new/free/reset/checkpoint/seek/truncate/eval/step_*,
 * spx_batch_step, spx_spec_step, spx_tokenize, spx_model_refine) holds the
 * model's lock, so passes of one model take turns (batch sessions with
 * spx_batch_step to run them together). The calls on one session (and on
 * one spx_spec) must not overlap. spx_model_open/free are not to race
 * with any other call on that model. spx_last_error() is per thread; a
 * model-level failure (spx_session_new, spx_tokenize) is also put there,
 * since spx_model_error() is shared by the model's threads. Parsed chat
 * templates are immutable and render from any thread.
 */
#ifndef SPECTRA_H
#define SPECTRA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. Values are frozen: new ones are appended. */
typedef enum spx_status {
    SPX_OK = 0,
    SPX_ERR_IO = 1,          /* a file could not be opened, read, written or mapped */
    SPX_ERR_FORMAT = 2,      /* a file is malformed (bad JSON, bad offsets, ...) */
    SPX_ERR_UNSUPPORTED = 3, /* valid input that Spectra does not handle */
    SPX_ERR_NOMEM = 4,       /* an allocation failed */
    SPX_ERR_ARG = 5,         /* a caller passed an invalid argument */
    SPX_ERR_CRC = 6,         /* a checksum did not match */
    SPX_ERR_RANGE = 7,       /* a value (token id, position, size) is out of range */
    SPX_ERR_INTERNAL = 8     /* a bug: please report it */
} spx_status;

const char *spx_status_name(spx_status s);

/* Logging: the library reports progress and warnings only through this
 * callback. level: 0 error, 1 warning, 2 info, 3 debug. Default: none. */
typedef void (*spx_log_fn)(int level, const char *msg, void *user);
void spx_set_log(spx_log_fn fn, void *user);

typedef struct spx_model spx_model;
typedef struct spx_session spx_session;

/* KV cache storage. Values frozen. */
typedef enum spx_kv_type {
    SPX_KV_DEFAULT = 0, /* fp16 */
    SPX_KV_F32 = 1,     /* exact: the reference */
    SPX_KV_F16 = 2,
    SPX_KV_Q4 = 3,      /* Group-32 asymmetric 4-bit (4.625 bits per value) */
    /* StrataFlux-KV resident low-bit caches (key bits / value bits; the
     * first 128 tokens and the block of up to 128 newest stay fp16; bins
     * that nested refinement bits subdivide: docs/kv.md) */
    SPX_KV_K2V2 = 4,
    SPX_KV_K3V2 = 5,
    SPX_KV_K3V3 = 6,
    SPX_KV_K4V4 = 7
} spx_kv_type;

/* Layout of a low-bit cache's codes (docs/kv.md). */
typedef enum spx_kv_layout {
    SPX_KV_LAYOUT_DEFAULT = 0,
    SPX_KV_LAYOUT_KIVI = 1, /* keys per channel over each 128-token block, values per token in groups */
    SPX_KV_LAYOUT_ROT = 2   /* keys and values per token in groups, after a Hadamard rotation of each head */
} spx_kv_layout;

typedef struct spx_model_params {
    int32_t n_threads;     /* 0: use all online CPUs */
    const char *backend;   /* "cpu", "cuda" or "auto"; NULL: "cpu" */
    int64_t vram_budget_mb;/* cuda: device memory the model may use; 0: free memory - 512 MiB */
    /* cuda memory plan (engine/plan.h): what the sessions will hold beside
     * the weights, so that the layers that do not fit stream instead */
    int64_t n_ctx;         /* context of the sessions to come; 0: min(model maximum, 4096) */
    spx_kv_type kv;        /* their KV cache type; 0: fp16 */
    /* cuda residency. 0: every layer on the device if weights + KV cache +
     * scratch fit the budget, else ping-pong offload with as many layers
     * resident as fit. 1: ping-pong with the first n_layers_resident layers
     * on the device and the others streamed from pinned host memory through
     * two device slots (n_layers_resident >= n_layers: all resident).
     * The environment variable SPECTRA_CUDA_RESIDENT_LAYERS=k forces 1, k. */
    int32_t pingpong;
    int64_t n_layers_resident;
} spx_model_params;

/* Opens an HF folder (config.json + safetensors + tokenizer files) or a
 * .trdc file. On failure *out is NULL; the message is available through
 * spx_last_error() (thread-local) since no handle exists yet. */
spx_status spx_model_open(const char *path, const spx_model_params *p,
                          spx_model **out);
void spx_model_free(spx_model *m);
const char *spx_last_error(void);
const char *spx_model_error(const spx_model *m);
/* A CPU model's .trdc weights into private memory (transparent huge pages
 * where the OS gives them): tiled matrices repacked row-major, which the
 * CPU tables stream faster in decode with the same results; a file with
 * none is copied whole at the map's addresses. Costs the weights' size in
 * RAM no longer shared with other processes. The CLI does it when the
 * plan keeps a CPU model resident (--mmap: not). Idempotent; nothing for
 * an HF folder or a device backend. On failure the model still runs. */
spx_status spx_model_make_resident(spx_model *m);
/* 0: the weights are the file's mapped pages (an HF folder's always);
 * 1: a private copy of the file; 2: private row-major repacks of its
 * tiled matrices (spx_model_make_resident) */
int spx_model_weights_private(const spx_model *m);

int64_t spx_model_vocab_size(const spx_model *m);
int64_t spx_model_max_context(const spx_model *m);
int32_t spx_model_bos_id(const spx_model *m);   /* -1 if none */
int32_t spx_model_eos_id(const spx_model *m);   /* -1 if none */
int spx_model_has_tokenizer(const spx_model *m);

/* Tokenizer. encode: *n_ids in = capacity, out = count needed; returns
 * SPX_ERR_RANGE when the capacity is too small (count still reported).
 * add_special: apply the tokenizer's own BOS/EOS rules (like
 * transformers' encode()). */
spx_status spx_tokenize(spx_model *m, const char *text, size_t len,
                        int add_special, int32_t *ids, size_t *n_ids);

typedef struct spx_session_params {
    int64_t n_ctx;      /* KV cache length; 0: model maximum (capped at 4096) */
    spx_kv_type kv;     /* 0: fp16 */
    /* low-bit KV types only (SPX_KV_K2V2 ..); 0 everywhere: the defaults */
    int32_t kv_group;          /* values per (min, scale) pair along a token's channels; 0: default */
    spx_kv_layout kv_layout;   /* 0: default */
    int32_t kv_refine;         /* nested refinement bits per key and value element (1..8); 0: none */
    double kv_refine_frac;     /* fraction of token groups refined per step; 0: 1/128 */
    int32_t kv_refine_tokens;  /* tokens per refinement group (divides 128); 0: 4 on the CPU, 2 on a GPU */
    /* where the refinement bits live: NULL, host RAM; else a file made in
     * this folder (removed at once, gone with the session) read through an
     * LRU RAM cache (the CPU only); kv_refine then defaults to 4 */
    const char *kv_tier_dir;
    int64_t kv_tier_cache_mb;  /* that cache's budget in MiB; 0: 256 */
    int32_t kv_tier_wait;      /* a record not cached: 0, its group keeps its resident value this step (the
                                * record is loaded in the background); 1, the step waits for it */
} spx_session_params;

spx_status spx_session_new(spx_model *m, const spx_session_params *p,
                           spx_session **out);
void spx_session_free(spx_session *s);
const char *spx_session_error(const spx_session *s);
/* Forgets all tokens (the KV cache is reused, the recurrent state of
 * short-convolution and Mamba-2 layers is zeroed). */
void spx_session_reset(spx_session *s);
int64_t spx_session_pos(const spx_session *s);
/* Remembers the recurrent state at the current position (one checkpoint
 * per session; a later call replaces it). Costs a copy of the state
 * (nothing for a model without recurrent layers). */
void spx_session_checkpoint(spx_session *s);
/* Rewinds to position pos <= the current one: tokens from pos on are
 * forgotten. Attention-only models rewind to any position (the KV rows
 * stay and are overwritten). A model with recurrent layers rewinds only to
 * its checkpoint's position, to 0, or to the current position (the
 * recurrent state is not kept per token); anything else is SPX_ERR_RANGE
 * and leaves the session as it was. Speculation checkpoints before a
 * draft, truncates to the checkpoint and re-feeds the accepted tokens. */
spx_status spx_session_truncate(spx_session *s, int64_t pos);
/* Benchmarks: moves a session at position 0 to pos without computing the
 * positions before it (their KV rows are whatever the cache holds: zeros
 * in a new session), so attention at depth pos can be timed without its
 * prefill. SPX_ERR_RANGE unless the session is at 0 and pos < its context,
 * SPX_ERR_UNSUPPORTED for a model with recurrent layers (no state for the
 * skipped tokens). */
spx_status spx_session_seek(spx_session *s, int64_t pos);

/* Feeds n tokens at the current position. logits: NULL, or [vocab] for the
 * last token, or when all_logits != 0, [n, vocab] for every token. */
spx_status spx_session_eval(spx_session *s, const int32_t *ids, size_t n,
                            float *logits, int all_logits);

/* Feeds one token and returns the most likely next one (greedy decoding);
 * on a GPU backend only the id crosses to the host. */
spx_status spx_session_step_greedy(spx_session *s, int32_t id, int32_t *next);
/* The same, for a decode loop: ahead != 0 says the next call will most
 * likely be this one with *next at the next position, so a GPU backend
 * queues that step before returning and the device never waits for the
 * host's round trip. The tokens are those of spx_session_step_greedy; a
 * call that does not follow on (another token, an eval, a reset) costs at
 * most the one step already queued. */
spx_status spx_session_step_greedy_ahead(spx_session *s, int32_t id, int32_t *next, int ahead);
/* Name of the backend running the model ("cpu", "cuda"). */
const char *spx_model_backend(const spx_model *m);
/* Name of the CPU kernel table the model's CPU work runs on ("scalar",
 * "avx2", "avx512", "amx": the best this CPU runs, or SPECTRA_KERNELS). */
const char *spx_model_cpu_kernels(const spx_model *m);

/* Sampling. temperature <= 0: greedy. top_k <= 0: off. top_p >= 1: off. */
typedef struct spx_sampler_params {
    float temperature;
    int32_t top_k;
    float top_p;
    uint64_t seed;
} spx_sampler_params;
int32_t spx_sample(const float *logits, int64_t vocab,
                   const spx_sampler_params *p, uint64_t *rng_state);
/* Feeds one token and returns the next one drawn as spx_sample(p, rng_state)
 * would from its logits (*rng_state advances the same way). On the CUDA
 * backend the draw happens on the device for 2 <= top_k <= 1024 (only the
 * id and the RNG state cross to the host); greedy parameters take
 * spx_session_step_greedy's path. */
spx_status spx_session_step_sample(spx_session *s, int32_t id, const spx_sampler_params *p, uint64_t *rng_state,
                                   int32_t *next);
/* The same for a decode loop, as spx_session_step_greedy_ahead: ahead != 0
 * says the next call will most likely be this one with *next, the same p
 * and the advanced *rng_state, so a GPU backend queues that draw before
 * returning. The draws are those of spx_session_step_sample. */
spx_status spx_session_step_sample_ahead(spx_session *s, int32_t id, const spx_sampler_params *p, uint64_t *rng_state,
                                         int32_t *next, int ahead);

/* Batched decode: one forward pass over n sessions of one model, each
 * fed one token at its own position with its own caches (the weights are
 * read once for all; docs/spec.md). ids[i] goes to sessions[i]; next[i]
 * is the token that follows it: greedy (smp NULL), or drawn as
 * spx_sample(&smp[i], &rng[i]) would (rng[i] advances). logits: NULL, or
 * [n, vocab] for every session's row. The sessions must be distinct, of
 * one model, each with room for a token; every check runs before anything
 * does (a refused batch leaves every session as it was); errors are in
 * spx_session_error(sessions[0]), naming the session's index. Each
 * session gets the tokens it would get from spx_session_step_greedy /
 * spx_session_step_sample alone (on the CPU also the same logits, bit for
 * bit). A backend without a batched pass (cuda, for now) and a model with
 * weight refinement attached step the sessions one by one. */
spx_status spx_batch_step(spx_session *const *sessions, size_t n, const int32_t *ids, const spx_sampler_params *smp,
                          uint64_t *rng, int32_t *next, float *logits);

/* Speculative decoding (prompt lookup; docs/spec.md). A spx_spec rides on
 * a session: it keeps the session's token history, drafts up to draft_max
 * tokens from an earlier occurrence of the history's last n tokens, feeds
 * the last token and the draft in one forward pass, keeps the longest
 * prefix the model agrees with and rewinds the rest. Greedy: the tokens are
 * those of spx_session_step_greedy, one by one. Sampling: a draft token d is
 * kept with probability p(d), p the distribution spx_sample draws from,
 * else a token is drawn from p without d (renormalised), which leaves the
 * distribution of every token that of spx_sample. Weight refinement is
 * applied to one-token steps only, so while it is attached every step is a
 * plain one (nothing is drafted). */
#define SPX_SPEC_DRAFT_LIMIT 32 /* draft_max at most */
#define SPX_SPEC_NGRAM_LIMIT 4  /* ngram_max at most */
typedef enum spx_spec_kind { SPX_SPEC_OFF = 0, SPX_SPEC_LOOKUP = 1 } spx_spec_kind;
typedef struct spx_spec_params {
    spx_spec_kind kind;     /* OFF: every step a plain one (the same loop, for comparisons) */
    int32_t draft_max;      /* K: tokens drafted per pass at most, 1..SPX_SPEC_DRAFT_LIMIT */
    int32_t draft_min;      /* a shorter draft is not verified (a plain step runs), 1..draft_max */
    int32_t ngram_min;      /* n-gram lengths looked up, longest first: 1 <= min <= max <= 4 */
    int32_t ngram_max;
    int32_t min_count[SPX_SPEC_NGRAM_LIMIT];   /* [n-1]: earlier occurrences an n-gram needs, >= 1 */
    int32_t min_percent[SPX_SPEC_NGRAM_LIMIT]; /* [n-1]: share of them followed by the drafted token, 0..100 */
    /* adaptive K: the cap starts at draft_min; after a pass that kept every draft token it doubles
     * (up to draft_max); after a rejection it becomes the kept count + 1
     * (at least draft_min).
     * Drafting pauses for `pause` tokens when the running acceptance (from
     * 1/2, each pass weighing 1/4) falls below stop_below; then one probe pass decides:
     * its acceptance >= stop_below resumes, else the pause doubles (up to
     * 16 pause); a probe drafts at most draft_min tokens. stop_below 0: never pause. */
    float stop_below;       /* 0..1 */
    int32_t pause;          /* >= 1 */
} spx_spec_params;
/* The defaults (docs/spec.md says how they were chosen). */
void spx_spec_params_default(spx_spec_params *p);

typedef struct spx_spec_stats {
    int64_t passes;       /* forward passes over the weights: plain steps, verifications and re-feeds */
    int64_t verify;       /* of which verifications of a draft */
    int64_t refeeds;      /* of which re-feeds of kept tokens after a rollback (recurrent layers) */
    int64_t drafted;      /* draft tokens verified */
    int64_t accepted;     /* of which kept */
    int64_t tokens;       /* tokens returned */
} spx_spec_stats;

typedef struct spx_spec spx_spec;
/* A drafter other than the lookup (tests, other proposers): writes up to
 * max tokens to draft[] from the history hist[n] (the session's tokens and
 * the one being fed) and returns how many (0..max). */
typedef int32_t (*spx_draft_fn)(void *user, const int32_t *hist, int64_t n, int32_t *draft, int32_t max);

/* Binds speculation to s (which must outlive it). The history starts with
 * nothing: give it the tokens already in s with spx_spec_history. Errors
 * name the field (spx_session_error(s)). */
spx_status spx_spec_new(spx_session *s, const spx_spec_params *p, spx_spec **out);
void spx_spec_free(spx_spec *sp);
/* Appends ids (tokens the caller fed to the session itself: the prompt) to
 * the history. */
spx_status spx_spec_history(spx_spec *sp, const int32_t *ids, size_t n);
/* Replaces the lookup by fn (NULL: back to the lookup). */
void spx_spec_set_drafter(spx_spec *sp, spx_draft_fn fn, void *user);
/* Feeds id and returns the tokens that follow it, out[0 .. *n_out), 1 <=
 * *n_out <= cap: out[*n_out - 1] is not yet fed (it is the next call's id,
 * as with spx_session_step_greedy). smp NULL or greedy parameters: greedy.
 * The history must hold exactly the session's tokens (SPX_ERR_ARG if not:
 * a token fed around it). */
spx_status spx_spec_step(spx_spec *sp, int32_t id, const spx_sampler_params *smp, uint64_t *rng, int32_t *out,
                         size_t cap, size_t *n_out);
void spx_spec_get_stats(const spx_spec *sp, spx_spec_stats *st);
/* "lookup" / "off" <-> kind; -1 for an unknown name. */
const char *spx_spec_kind_name(spx_spec_kind k);
int spx_spec_kind_parse(const char *name);

/* Weight refinement (StrataFlux-W): a compressed model's decode steps add,
 * per projection, the selected input channels' share of the quantization
 * residual, read from a .refine file (spectra compress --refine) that
 * stays mapped in RAM or is read from disk into a bounded cache. Prompts
 * run the base weights. On the cuda backend the file is held in pinned host
 * memory and read by the GPU (no disk tier there). */
typedef struct spx_refine_params {
    const char *path;   /* the .refine file made from the same compression of the same model */
    /* channels per 1,024 input channels for each projection set: 0 q/k/v
     * (and the recurrent blocks' in_proj), 1 o (out_proj), 2 gate/up,
     * 3 down; -1: the default (SPX_REFINE_K_DEFAULT); 0: that set off;
     * >= 1024: every channel */
    int64_t k[4];
    int64_t cache_mb;   /* 0: the file mapped in RAM; > 0: read from disk into an LRU cache of this many MiB */
    int32_t miss_wait;  /* disk: 1 a miss waits for its columns; 0 it is skipped and loaded in the background */
    int32_t n_loaders;  /* disk: loader threads, 0: 2 */
    /* the schedule; -1 in any of the three: the tuned entry's (below), else 0 */
    int32_t cuda_blocks; /* cuda: thread blocks of the refinement kernel beside each GEMV, 0: 16 */
    int32_t cuda_lag;    /* cuda: fetch lag of the o / down refinement in half-blocks, 0..4 (s = 0 .. 2 blocks) */
    int32_t cuda_lead;   /* cuda: fetch lead of the q/k/v and gate/up refinement in half-blocks, 0..4 */
    /* tuned budgets (`spectra tune` records them in the file per platform
     * and slowdown budget): a set whose k is -1 takes the tuned entry's k
     * for this platform (backend, kernel table, threads, tier placement,
     * CPU) when there is one. tuned: the slowdown budget (a fraction) whose
     * entry to take, the largest tuned budget not above it, failing with
     * SPX_ERR_ARG when there is none; 0: SPX_REFINE_TUNED_DEFAULT the same
     * way, or, when every tuned budget is above it, the smallest one (no
     * entry for the platform: SPX_REFINE_K_DEFAULT); < 0: never. The
     * entry is consulted when some k is -1; it then also fills mlp, kn and
     * the schedule where they are -1 (the values it was measured with; a
     * field given explicitly wins, as an explicit k does) */
    double tuned;
#define SPX_REFINE_TUNED_DEFAULT 0.05
    /* the MLP's refinement: SPX_REFINE_MLP_CHANNEL (0: gate/up and down by
     * the k above) or SPX_REFINE_MLP_NEURON (the .refine's neuron bundles,
     * compress --refine-bundles; the gate/up and down budgets are then 0);
     * -1: the tuned entry's, else channel */
    int32_t mlp;
    /* neuron mode: neurons per 1,024 of the intermediate size; -1: a
     * neuron tuned entry's kn, else the paper's round(3 k / 4) of the
     * gate/up budget k; 0: off */
    int64_t kn;
} spx_refine_params;
#define SPX_REFINE_K_DEFAULT 32
#define SPX_REFINE_MLP_CHANNEL 0
#define SPX_REFINE_MLP_NEURON 1
#define SPX_REFINE_TUNED_DEFAULT 0.05
/* Attaches (or, path NULL, detaches) refinement. Fails naming the file
 * when it is not a .refine, was made for another compression (its base
 * checksums differ), or its shapes differ from the model's. */
spx_status spx_model_refine(spx_model *m, const spx_refine_params *p);
typedef struct spx_refine_info {
    int32_t active;
    int64_t k[4];
    int64_t n_mats;               /* matrices with a residual */
    int32_t mlp;                  /* SPX_REFINE_MLP_CHANNEL or _NEURON */
    int64_t kn;                   /* neuron mode: neurons per 1,024 */
    int64_t n_bundle_layers;      /* layers with neuron bundles in the .refine */
    uint64_t residual_bytes;      /* of their columns (the tier) */
    uint64_t bytes_per_token;     /* columns the budgets select per decoded token, every matrix */
    uint64_t launches, selected, applied; /* refined launches; channels selected; columns applied */
    int32_t on_disk, direct;      /* the tier reads from disk (with O_DIRECT) */
    uint64_t cache_bytes, requests, hits, bytes_read, waits;
    double wait_s;
    int64_t fit_k[4];             /* a fitted .refine (compress --fit): the k per set it was fitted for; 0: not fitted */
    char platform[256];           /* this platform's key in the file's tuned entries */
    int32_t tuned;                /* 1: some k came from a tuned entry */
    double tuned_budget, tuned_slowdown, tuned_kl; /* that entry's budget, measured slowdown and KL */
    int32_t cuda_blocks, cuda_lag, cuda_lead; /* the schedule in effect (0: the defaults) */
    int32_t device;               /* 1: a device backend reads the tier from pinned host memory; the launch
                                   * counters above are the CPU's and stay 0 there */
} spx_refine_info;
void spx_model_refine_info(const spx_model *m, spx_refine_info *out);


/* Chat templates (src/chat/): the Jinja subset Hugging Face chat templates
 * use, rendered as transformers' apply_chat_template renders them (its
 * environment: trim_blocks, lstrip_blocks, loop controls, its tojson,
 * raise_exception, strftime_now; docs/chat.md). A parsed template is
 * immutable: render it from any number of threads at once.
 * Errors: SPX_ERR_FORMAT for a syntax error, SPX_ERR_UNSUPPORTED for a
 * construct the engine does not implement, SPX_ERR_ARG for a render-time
 * error (raise_exception, a type error); err (errcap > 0) then holds one
 * line "NAME:LINE:COL: message", the position in the template. */
typedef struct spx_template spx_template;
/* name: how messages name the template (a file, "tokenizer_config.json") */
spx_status spx_template_parse(const char *src, size_t len, const char *name, spx_template **out, char *err,
                              size_t errcap);
/* ctx_json: a JSON object whose keys are the template's variables
 * (messages, tools, add_generation_prompt, bos_token, eos_token, any
 * other). *out: malloc'd, NUL-terminated; *out_len its length (may be NULL). */
spx_status spx_template_render(const spx_template *t, const char *ctx_json, char **out, size_t *out_len, char *err,
                               size_t errcap);
void spx_template_free(spx_template *t);

/* The model's chat template: tokenizer_config.json's chat_template (a
 * list of named ones: "default"), NULL when it has none. */
const char *spx_model_chat_template(const spx_model *m);
/* The text of tokenizer_config.json's bos_token / eos_token ("" if none). */
const char *spx_model_bos_text(const spx_model *m);
const char *spx_model_eos_text(const spx_model *m);
/* The prompt for a conversation: t (NULL: the model's own template, or,
 * when it has none, SPX_CHATML_TEMPLATE) rendered with messages_json (a
 * JSON array of {"role", "content", ...}), tools_json (a JSON array or
 * NULL), add_generation_prompt and the model's bos/eos texts. *out as
 * spx_template_render's; errors in err as above. */
#define SPX_CHATML_TEMPLATE                                                                                          \
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + " \
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
spx_status spx_chat_render(const spx_model *m, const spx_template *t, const char *messages_json,
                           const char *tools_json, int add_generation_prompt, char **out, size_t *out_len, char *err,
                           size_t errcap);

#ifdef __cplusplus
}
#endif
#endif
