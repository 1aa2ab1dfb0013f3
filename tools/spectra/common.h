/* common.h: helpers shared by the subcommands (model flags, id lists). */
#ifndef SPX_CLI_COMMON_H
#define SPX_CLI_COMMON_H

#include "spectra.h"
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

/* Parses "1,2,3" or "1 2 3" into a malloc'd array; prints an error and
 * returns NULL on a bad list. */
/* "1, 2 3" as token ids (spaces and/or commas); prints an error naming
 * `what` (the flag) and returns NULL if bad or, unless allow_empty, empty. */
int32_t *cli_parse_ids(const char *s, const char *what, int allow_empty, size_t *n);
/* Opens a model, printing the library's message on failure. */
spx_model *cli_open_model(const char *path, int64_t threads);
/* The same on a named backend ("cpu", "cuda", "auto"; NULL: cpu). */
spx_model *cli_open_model_on(const char *path, int64_t threads, const char *backend);
/* run and bench: the execution plan (engine/plan.h) for the model, then
 * the model opened on the plan's backend with its residency (ping-pong
 * offload), its context and KV type to use for the session. */
typedef struct cli_plan_opts {
    const char *backend;    /* "cpu", "cuda", "auto"; NULL: auto */
    int64_t threads;        /* 0: the pool's default */
    int64_t n_ctx;          /* 0: the plan's default */
    int64_t vram_budget_mb; /* 0: free device memory - margin */
    spx_kv_type kv;         /* SPX_KV_DEFAULT: the plan's choice */
    int quiet;              /* no plan summary on stderr */
    int mmap;               /* --mmap: a resident CPU model keeps the file's mapped pages (default: a private copy) */
} cli_plan_opts;
struct spx_plan;
/* Prints the error and returns NULL on failure. When auto chose cuda and
 * the CUDA backend refuses the model, falls back to the CPU with a note. */
spx_model *cli_open_planned(const char *path, const cli_plan_opts *o, struct spx_plan *plan);
/* The plan's flags, the same on run, chat (and their defaults): --ctx N,
 * --kv TYPE, --backend B, --vram-budget MiB, -t/--threads N, --mmap into o.
 * Returns 1 if argv[*i] was one (its value consumed), 0 if not, -1 after
 * printing an error for a bad value. */
int cli_plan_opt(int argc, char **argv, int *i, cli_plan_opts *o);
/* The sampler's flags: --temp T, --top-k K, --top-p P, --seed S (seed -1:
 * unset). Defaults: cli_sample_defaults. Returns as cli_plan_opt. */
typedef struct cli_sample_opts {
    double temp, top_p;
    int64_t top_k, seed;
} cli_sample_opts;
void cli_sample_defaults(cli_sample_opts *o);
int cli_sample_opt(int argc, char **argv, int *i, cli_sample_opts *o);
/* Checks --backend cpu|cuda|auto; prints an error and returns 0 otherwise. */
int cli_backend(const char *s);
/* Parses --kv f32|f16|q4|k2v2|k3v2|k3v3|k4v4; prints an error and returns 0 otherwise. */
int cli_kv(const char *s, spx_kv_type *out);
/* The low-bit KV cache's flags (docs/kv.md), on every command that takes --kv. */
typedef struct cli_kv_extra {
    int32_t group, layout, refine, tokens; /* 0: the library's defaults */
    double frac;
    const char *tier_dir;                  /* --kv-tier: NULL, host RAM */
    int64_t tier_cache_mb;                 /* 0: the library's default */
    int32_t tier_wait;
} cli_kv_extra;
#define CLI_KV_USAGE \
    "  --kv-group N    low-bit KV: channels per (min, step) pair of a token (8..head_dim; default 32)\n" \
    "  --kv-layout L   low-bit KV: kivi (keys per channel over 128-token blocks; default) or rot (Hadamard, per token)\n" \
    "  --kv-refine B   low-bit KV: nested refinement bits per element (0: off, default without --kv-tier; 1..8)\n" \
    "  --kv-tier DIR   low-bit KV, CPU: the refinement bits in a file made in DIR (removed at once) behind an LRU\n" \
    "                  RAM cache, instead of host RAM; --kv-refine then defaults to 4\n" \
    "  --kv-tier-cache MIB  that cache's budget (default 256)\n" \
    "  --kv-tier-miss skip|wait  a record not cached: its group keeps the resident value this step while it is\n" \
    "                  loaded (skip, default), or the step waits for it\n" \
    "  --kv-refine-frac F  fraction of token groups refined per step (default 1/128 = 0.0078125)\n" \
    "  --kv-refine-group T tokens per refinement group (divides 128; default 4 on the CPU, 2 on a GPU)\n"
/* argv[*i] one of them: 1 (value taken), 0 (not one), -1 (bad value, message printed). */
int cli_kv_opt(int argc, char **argv, int *i, cli_kv_extra *o);
/* 0 with a message when they are given for a KV type they do not apply
 * to (a usage error: callers check right after parsing). */
int cli_kv_check(spx_kv_type kv, const cli_kv_extra *o);
/* Into the session parameters (after .kv is set); cli_kv_check ran after
 * parsing, so flags are set only for a low-bit type. */
void cli_kv_apply(const cli_kv_extra *o, spx_session_params *sp);
/* The session's KV cache record (spx_kv_describe) as one line. */
void cli_kv_summary(FILE *f, const spx_session *s);
/* Reads a whole text file (for -f); prints an error and returns NULL. */
char *cli_read_text(const char *path, size_t *len);

/* The arguments of a command that takes one file and one boolean flag
 * (long_flag, or short_flag when not NULL): -1 to go on with *path set,
 * else the exit code (--help: 0; misuse: 2, with a message and the usage
 * on stderr). */
int cli_file_and_flag(int argc, char **argv, const char *cmd, const char *long_flag, const char *short_flag, int *flag,
                      void (*usage)(FILE *), const char **path);

/* The options of the windowed evaluations (perplexity, kl). */
typedef struct cli_eval_opts {
    const char *file, *backend;
    int64_t ctx, chunks, threads;
    spx_kv_type kv;
    int compat, json;
    int64_t skip; /* windows skipped from the start of the text (--skip) */
    cli_kv_extra kvx;
    int64_t score_last; /* --score-last N (windows.h); 0: every position of the protocol scored */
} cli_eval_opts;
#define CLI_EVAL_OPTS_DEFAULT {NULL, NULL, 512, 0, 0, SPX_KV_F16, 0, 0, 0, {0, 0, 0, 0, 0, NULL, 0, 0}, 0}
#define CLI_EVAL_SKIP_USAGE \
    "  --skip S        start at window S (int >= 0; default 0): windows S .. S+C-1 are used\n"
#define CLI_EVAL_SCORE_LAST_USAGE \
    "  --score-last N  long-context protocol: prefill all but the last N tokens of each window as one prompt,\n" \
    "                  feed those N one token per step and score only their N predictions (1 <= N < ctx;\n" \
    "                  not with --llama-compat; default: off)\n"
/* argv[*i] is one of them: 1 (its value taken, *i advanced); not one: 0;
 * a bad or missing value: -1 (message printed). */
int cli_eval_opt(int argc, char **argv, int *i, cli_eval_opts *o);
/* The checks that involve more than one option, after parsing (the order
 * of the flags is free): --score-last below --ctx and not with
 * --llama-compat. 0 with a message naming cmd: a usage error (exit 2). */
int cli_eval_check(const cli_eval_opts *o, const char *cmd);
/* The protocol as the result lines print it, into buf: "8 windows of
 * 1024", then ", llama-compat" or ", last 256 scored one token at a time". */
void cli_eval_protocol(const cli_eval_opts *o, int64_t chunks, char *buf, size_t size);

/* Weight refinement flags (--refine FILE, --refine-k K | Kqkv,Ko,Kgu,Kdown,
 * --refine-cache MiB, --refine-miss skip|wait, --refine-loaders N,
 * --refine-mlp channel|neuron, --refine-kn K), as
 * cli_eval_opt; cli_apply_refine attaches them (1: done or nothing to do;
 * 0: failed, message printed); cli_refine_summary prints one line. */
#define CLI_REFINE_USAGE                                                                                              \
    "  --refine FILE   weight refinement from FILE (spectra compress --refine; on cuda held in pinned host RAM)\n"   \
    "  --refine-k K    channels per 1024 refined per decode step: one number, or four for q/k/v,o,gate/up,down\n"   \
    "                  (default 32; 0: off; 1024: every channel)\n"                                                 \
    "  --refine-cache MiB  read the residual from disk into an LRU cache of MiB (default 0: mapped in RAM)\n"       \
    "  --refine-miss M skip (default: a miss uses the resident weights, loaded in the background) or wait\n"     \
    "  --refine-loaders N  disk loader threads (default 2)\n"                                                     \
    "  --refine-blocks N   cuda: thread blocks of the refinement kernel beside each GEMV (default 16)\n"    \
    "  --refine-lag S  cuda: add the o/down refinement S blocks later (0, 0.5, 1, 1.5, 2; default 0)\n"                 \
    "  --refine-lead S cuda: select q/k/v and gate/up channels S blocks earlier (0 .. 2 by 0.5; default 0)\n"                 \
    "  --refine-tuned B  take the budgets `spectra tune` recorded in FILE for this platform at slowdown budget B\n" \
    "                  (5%% or 0.05; the largest tuned budget not above B; default 5%%, or the smallest tuned one\n"  \
    "                  when all are above; off: never); --refine-k overrides them\n"              \
    "  --refine-mlp M  channel (default: gate/up and down by their k) or neuron (the .refine's neuron bundles,\n"   \
    "                  compress --refine-bundles; gate/up and down k are then 0)\n"                                  \
    "  --refine-kn K   neuron mode: neurons per 1024 (int >= 0; default round(3k/4) of the gate/up k)\n"
void cli_refine_defaults(spx_refine_params *p);
/* --refine-k's value: "K" (every set) or four, into k (0: message printed). */
int cli_refine_ks(const char *flag, const char *v, int64_t k[4]);
int cli_refine_opt(int argc, char **argv, int *i, spx_refine_params *p);
int cli_apply_refine(spx_model *m, const spx_refine_params *p);
void cli_refine_summary(FILE *f, const spx_model *m);
/* A slowdown budget, "5%" or "0.05", strictly between 0 and 100 %, as a
 * fraction; prints an error naming flag and returns 0 otherwise. */
int cli_budget(const char *flag, const char *s, double *out);

/* The decode loop of `spectra bench -p 0 -n N` (and of `spectra tune`):
 * from a reset session (moved to depth by spx_session_seek when depth > 0), n greedy steps from token `first`, each queueing
 * the next (spx_session_step_greedy_ahead); *tps = n / seconds. Prints
 * the session's error and returns 0 on failure. */
int cli_decode_tps(spx_session *s, int32_t first, int64_t n, double *tps);
/* The same from the session's current position (bench -d: decode at depth). */
int cli_decode_tps_here(spx_session *s, int32_t first, int64_t n, double *tps);

/* Speculative decoding flags (docs/spec.md), on run and bench:
 * --spec lookup|off, --draft-max K, --draft-min K. The record starts as
 * spx_spec_params_default with kind off (the CLI's default, see
 * docs/spec.md); *given is set when --spec appeared. */
/* --mmap (cli_plan_opts.mmap) */
#define CLI_MMAP_USAGE \
    "  --mmap          keep the weights in the file's mapped pages (the page cache, shared between\n" \
    "                  processes); default: copied into private RAM when the CPU plan keeps them resident\n"
#define CLI_SPEC_USAGE \
    "  --spec S        speculative decoding: lookup (drafts from earlier text, verified in one pass) or off\n" \
    "                  (default off)\n" \
    "  --draft-max K   lookup: tokens drafted per pass at most (int 1..32; default 8)\n" \
    "  --draft-min K   lookup: shorter drafts are not verified (int 1..draft-max; default 2)\n"
void cli_spec_defaults(spx_spec_params *p);
/* argv[*i] one of them: 1 (value taken), 0 (not one), -1 (bad value, message printed). */
int cli_spec_opt(int argc, char **argv, int *i, spx_spec_params *p, int *given);
/* 0 with a message when draft-min exceeds draft-max (after parsing). */
int cli_spec_check(const spx_spec_params *p);
/* One line: kind, K, and the counts (drafted, kept, acceptance, tokens per pass). */
void cli_spec_summary(FILE *f, const spx_spec_params *p, const spx_spec_stats *st);

#endif
