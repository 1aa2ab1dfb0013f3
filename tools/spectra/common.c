/* common.c: helpers shared by the subcommands. */
#include "common.h"
#include "cli.h"
#include "core/util.h"
#include "engine/plan.h"
#include "engine/session.h"
#include "engine/probe.h"

#include <ctype.h>
#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int32_t *cli_parse_ids(const char *s, const char *what, int allow_empty, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        cli_error("%s: out of memory", what);
        return NULL;
    }
    const char *p = s;
    for (;;) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            cli_error("%s: '%.40s' is not a non-negative token id", what, p);
            free(ids);
            return NULL;
        }
        if (k == cap) {
            int32_t *t = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!t) {
                free(ids);
                cli_error("%s: out of memory", what);
                return NULL;
            }
            ids = t;
        }
        ids[k++] = (int32_t)v;
        p = end;
    }
    if (k == 0 && !allow_empty) {
        cli_error("%s: empty list", what);
        free(ids);
        return NULL;
    }
    *n = k;
    return ids;
}

spx_model *cli_open_model(const char *path, int64_t threads) { return cli_open_model_on(path, threads, NULL); }

int cli_backend(const char *s) {
    if (!strcmp(s, "cpu") || !strcmp(s, "cuda") || !strcmp(s, "auto")) return 1;
    cli_error("--backend: expected cpu, cuda or auto, got '%s'", s);
    return 0;
}

spx_model *cli_open_model_on(const char *path, int64_t threads, const char *backend) {
    if (!path) {
        cli_error("no model given (-m MODEL: a Hugging Face folder or a .trdc file)");
        return NULL;
    }
    spx_model_params mp = {.n_threads = (int32_t)threads, .backend = backend};
    spx_model *m = NULL;
    if (spx_model_open(path, &mp, &m) != SPX_OK) {
        cli_error("%s", spx_last_error());
        return NULL;
    }
    return m;
}

/* "-": standard input, to its end (a pipe, a redirect, or a terminal until ^D) */
static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            char *nb = cap < ((size_t)1 << 31) ? realloc(buf, 2 * cap + 1) : NULL;
            if (!nb) {
                free(buf);
                cli_error("standard input: more than 2 GiB, or out of memory");
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (!buf) { cli_error("out of memory"); return NULL; }
    if (ferror(stdin)) {
        free(buf);
        cli_error("standard input: read error");
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

char *cli_read_text(const char *path, size_t *len) {
    if (!strcmp(path, "-")) return read_stdin(len);
    spx_err e;
    spx_err_clear(&e);
    char *buf = NULL;
    if (spx_read_file(path, (size_t)1 << 31, &buf, len, &e) != SPX_OK) {
        cli_fail(&e);
        return NULL;
    }
    return buf;
}

int cli_kv(const char *s, spx_kv_type *out) {
    for (spx_kv_type t = SPX_KV_F32; t <= SPX_KV_K4V4; t++)
        if (!strcmp(s, spx_kv_type_name(t))) {
            *out = t;
            return 1;
        }
    cli_error("--kv: expected f32, f16, q4, k2v2, k3v2, k3v3 or k4v4, got '%s'", s);
    return 0;
}

/* flag names of a table, argv[*i] among them */
static int flag_in(const char *a, const char *const *flags, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (!strcmp(a, flags[k])) return 1;
    return 0;
}

int cli_plan_opt(int argc, char **argv, int *i, cli_plan_opts *o) {
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--mmap")) {
        o->mmap = 1;
        return 1;
    }
    static const char *const flags[] = {"--ctx", "--kv", "--backend", "--vram-budget", "--threads", "-t"};
    if (!flag_in(a, flags, sizeof flags / sizeof flags[0])) return 0;
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (!strcmp(a, "--ctx")) return cli_int(a, v, 1, 1 << 24, &o->n_ctx) ? 1 : -1;
    if (!strcmp(a, "--kv")) return cli_kv(v, &o->kv) ? 1 : -1;
    if (!strcmp(a, "--backend")) {
        if (!cli_backend(v)) return -1;
        o->backend = v;
        return 1;
    }
    if (!strcmp(a, "--vram-budget")) return cli_int(a, v, 1, (int64_t)1 << 40, &o->vram_budget_mb) ? 1 : -1;
    return cli_int(a, v, 1, 1024, &o->threads) ? 1 : -1;
}

void cli_sample_defaults(cli_sample_opts *o) {
    o->temp = 0.8;
    o->top_p = 0.95;
    o->top_k = 40;
    o->seed = -1;
}

int cli_sample_opt(int argc, char **argv, int *i, cli_sample_opts *o) {
    const char *a = argv[*i], *v;
    static const char *const flags[] = {"--temp", "--top-k", "--top-p", "--seed"};
    if (!flag_in(a, flags, sizeof flags / sizeof flags[0])) return 0;
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (!strcmp(a, "--temp")) return cli_float(a, v, 0, 1e6, &o->temp) ? 1 : -1;
    if (!strcmp(a, "--top-k")) return cli_int(a, v, 0, 1 << 24, &o->top_k) ? 1 : -1;
    if (!strcmp(a, "--top-p")) return cli_float(a, v, 1e-9, 1, &o->top_p) ? 1 : -1;
    return cli_int(a, v, 0, INT64_MAX, &o->seed) ? 1 : -1;
}

int cli_kv_opt(int argc, char **argv, int *i, cli_kv_extra *o) {
    const char *a = argv[*i], *v;
    static const char *const flags[] = {"--kv-group",        "--kv-layout", "--kv-refine",     "--kv-refine-frac",
                                        "--kv-refine-group", "--kv-tier",   "--kv-tier-cache", "--kv-tier-miss"};
    if (!flag_in(a, flags, sizeof flags / sizeof flags[0])) return 0;
    if (!(v = cli_value(argc, argv, i))) return -1;
    int64_t x;
    if (!strcmp(a, "--kv-group")) {
        if (!cli_int(a, v, 8, 2048, &x)) return -1;
        o->group = (int32_t)x;
    } else if (!strcmp(a, "--kv-layout")) {
        if (!strcmp(v, "kivi")) o->layout = SPX_KV_LAYOUT_KIVI;
        else if (!strcmp(v, "rot")) o->layout = SPX_KV_LAYOUT_ROT;
        else { cli_error("--kv-layout: expected kivi or rot, got '%s'", v); return -1; }
    } else if (!strcmp(a, "--kv-refine")) {
        if (!cli_int(a, v, 0, 8, &x)) return -1;
        o->refine = (int32_t)x;
    } else if (!strcmp(a, "--kv-tier")) {
        o->tier_dir = v;
    } else if (!strcmp(a, "--kv-tier-cache")) {
        if (!cli_int(a, v, 1, (int64_t)1 << 30, &x)) return -1;
        o->tier_cache_mb = x;
    } else if (!strcmp(a, "--kv-tier-miss")) {
        if (strcmp(v, "skip") && strcmp(v, "wait")) { cli_error("--kv-tier-miss: expected skip or wait, got '%s'", v); return -1; }
        o->tier_wait = !strcmp(v, "wait");
    } else if (!strcmp(a, "--kv-refine-group")) {
        if (!cli_int(a, v, 1, 128, &x)) return -1;
        o->tokens = (int32_t)x;
    } else {
        char *end;
        double f = strtod(v, &end);
        if (*v == 0 || *end || !(f > 0 && f <= 1)) {
            cli_error("--kv-refine-frac: expected a fraction in (0, 1], got '%s'", v);
            return -1;
        }
        o->frac = f;
    }
    return 1;
}

void cli_kv_summary(FILE *f, const spx_session *s) {
    char b[1024];
    spx_kv_describe(&s->kv, b, sizeof b);
    fprintf(f, "%s\n", b);
}

int cli_kv_check(spx_kv_type kv, const cli_kv_extra *o) {
    if (!spx_kv_type_lowbit(kv) && (o->group || o->layout || o->refine > 0 || o->frac > 0 || o->tokens ||
                                    o->tier_dir || o->tier_cache_mb || o->tier_wait)) {
        cli_error("--kv-group, --kv-layout, --kv-refine* and --kv-tier* apply to the low-bit KV types (--kv k2v2, "
                  "k3v2, k3v3, k4v4)");
        return 0;
    }
    if (!o->tier_dir && (o->tier_cache_mb || o->tier_wait)) {
        cli_error("--kv-tier-cache and --kv-tier-miss need --kv-tier DIR (without it the refinement bits stay in "
                  "host RAM)");
        return 0;
    }
    return 1;
}

void cli_kv_apply(const cli_kv_extra *o, spx_session_params *sp) {
    sp->kv_group = o->group;
    sp->kv_layout = (spx_kv_layout)o->layout;
    sp->kv_refine = o->refine;
    sp->kv_refine_frac = o->frac;
    sp->kv_refine_tokens = o->tokens;
    sp->kv_tier_dir = o->tier_dir;
    sp->kv_tier_cache_mb = o->tier_cache_mb;
    sp->kv_tier_wait = o->tier_wait;
}

static void print_plan(const spx_plan *p) {
    char res[96];
    if (p->residency == SPX_RES_PINGPONG)
        snprintf(res, sizeof res, "ping-pong (%lld of %lld layers resident)", (long long)p->n_layers_resident,
                 (long long)p->n_layers);
    else
        snprintf(res, sizeof res, "%s", spx_residency_name(p->residency));
    fprintf(stderr, "plan: %s, kv %s, context %lld; %s\n      %s\n", res, spx_kv_type_name(p->kv), (long long)p->n_ctx,
            p->why_backend, p->why_residency);
}

spx_model *cli_open_planned(const char *path, const cli_plan_opts *o, spx_plan *plan) {
    if (!path) {
        cli_error("no model given (-m MODEL: a Hugging Face folder or a .trdc file)");
        return NULL;
    }
    spx_err e;
    spx_err_clear(&e);
    spx_hw hw;
    if (spx_hw_probe(&hw, &e) != SPX_OK) {
        cli_fail(&e);
        return NULL;
    }
    /* sizes first: the model on the CPU backend maps the file and uploads nothing */
    spx_model *m = cli_open_model_on(path, o->threads, "cpu");
    if (!m) return NULL;
    const char *backend = o->backend ? o->backend : "auto";
    spx_plan_request req = {.backend = backend, .n_ctx = o->n_ctx, .vram_budget_mb = o->vram_budget_mb,
                            .kv = o->kv, .n_threads = (int32_t)o->threads};
    if (spx_plan_make(&hw, m, &req, plan, &e) != SPX_OK) {
        cli_fail(&e);
        spx_model_free(m);
        return NULL;
    }
    if (!strcmp(plan->backend, "cuda")) {
        spx_model_free(m);
        m = NULL;
        spx_model_params mp = {.n_threads = (int32_t)o->threads, .backend = "cuda",
                               .vram_budget_mb = o->vram_budget_mb, .n_ctx = plan->n_ctx, .kv = plan->kv,
                               .pingpong = 1, /* the plan's residency, not the backend's own */
                               .n_layers_resident = plan->n_layers_resident};
        spx_status st = spx_model_open(path, &mp, &m);
        if (st == SPX_ERR_UNSUPPORTED && !strcmp(backend, "auto")) {
            if (!o->quiet) fprintf(stderr, "spectra: note: %s; running on the CPU\n", spx_last_error());
            m = cli_open_model_on(path, o->threads, "cpu");
            req.backend = "cpu";
            if (m && spx_plan_make(&hw, m, &req, plan, &e) != SPX_OK) {
                cli_fail(&e);
                spx_model_free(m);
                return NULL;
            }
        } else if (st != SPX_OK) {
            cli_error("%s", spx_last_error());
            return NULL;
        }
        if (!m) return NULL;
    }
    /* a resident CPU model streams its weights faster from private
     * (huge) pages than from the page cache's */
    if (!strcmp(plan->backend, "cpu") && plan->residency == SPX_RES_RESIDENT && !o->mmap) {
        double t0 = spx_now();
        if (spx_model_make_resident(m) != SPX_OK) {
            if (!o->quiet) fprintf(stderr, "spectra: note: %s; the weights stay mapped\n", spx_model_error(m));
        } else if (!o->quiet && spx_now() - t0 > 1.0) {
            fprintf(stderr, "spectra: weights loaded into private RAM in %.1f s (--mmap: use the file's pages)\n", spx_now() - t0);
        }
    }
    if (!o->quiet) print_plan(plan);
    return m;
}

int cli_file_and_flag(int argc, char **argv, const char *cmd, const char *long_flag, const char *short_flag, int *flag,
                      void (*usage)(FILE *), const char **path) {
    *path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, long_flag) || (short_flag && !strcmp(a, short_flag))) {
            *flag = 1;
        } else if (a[0] == '-' && a[1]) {
            cli_error("%s: unknown option '%s'", cmd, a);
            usage(stderr);
            return 2;
        } else if (*path) {
            cli_error("%s: more than one file given ('%s' and '%s')", cmd, *path, a);
            return 2;
        } else {
            *path = a;
        }
    }
    if (!*path) {
        usage(stderr);
        return 2;
    }
    return -1;
}

int cli_eval_opt(int argc, char **argv, int *i, cli_eval_opts *o) {
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--llama-compat")) {
        o->compat = 1;
        return 1;
    }
    if (!strcmp(a, "--json")) {
        o->json = 1;
        return 1;
    }
    int r = cli_kv_opt(argc, argv, i, &o->kvx);
    if (r) return r;
    static const char *const valued[] = {"-f", "--ctx", "-c", "--chunks", "--kv", "--backend", "--threads", "-t",
                                         "--skip", "--score-last"};
    if (!flag_in(a, valued, sizeof valued / sizeof valued[0])) return 0;
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (!strcmp(a, "-f")) o->file = v;
    else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) return cli_int(a, v, 2, 1 << 20, &o->ctx) ? 1 : -1;
    else if (!strcmp(a, "--chunks")) return cli_int(a, v, 1, 1 << 30, &o->chunks) ? 1 : -1;
    else if (!strcmp(a, "--skip")) return cli_int(a, v, 0, 1 << 30, &o->skip) ? 1 : -1;
    else if (!strcmp(a, "--score-last")) return cli_int(a, v, 1, 1 << 20, &o->score_last) ? 1 : -1;
    else if (!strcmp(a, "--kv")) return cli_kv(v, &o->kv) ? 1 : -1;
    else if (!strcmp(a, "--backend")) {
        if (!cli_backend(v)) return -1;
        o->backend = v;
    } else return cli_int(a, v, 1, 1024, &o->threads) ? 1 : -1;
    return 1;
}

int cli_eval_check(const cli_eval_opts *o, const char *cmd) {
    if (o->score_last && o->compat) {
        cli_error("%s: --score-last and --llama-compat exclude each other (llama-compat scores the second half of "
                  "each window from one prompt)", cmd);
        return 0;
    }
    if (o->score_last >= o->ctx) {
        cli_error("%s: --score-last %lld must be below --ctx %lld (at least one token is the prompt)", cmd,
                  (long long)o->score_last, (long long)o->ctx);
        return 0;
    }
    return 1;
}

void cli_eval_protocol(const cli_eval_opts *o, int64_t chunks, char *buf, size_t size) {
    int n = snprintf(buf, size, "%lld windows of %lld", (long long)chunks, (long long)o->ctx);
    if (n < 0 || (size_t)n >= size) return;
    if (o->compat) snprintf(buf + n, size - (size_t)n, ", llama-compat");
    else if (o->score_last)
        snprintf(buf + n, size - (size_t)n, ", last %lld scored one token at a time", (long long)o->score_last);
}

/* ---- weight refinement options -------------------------------------------- */

void cli_refine_defaults(spx_refine_params *p) {
    memset(p, 0, sizeof *p);
    for (int i = 0; i < 4; i++) p->k[i] = -1;
    p->kn = -1;
    p->mlp = p->cuda_blocks = p->cuda_lag = p->cuda_lead = -1; /* the tuned entry's, else the defaults */
}

/* "K" (every set) or "Kqkv,Ko,Kgateup,Kdown" */
int cli_refine_ks(const char *flag, const char *v, int64_t k[4]) {
    int64_t t[4];
    int n = 0;
    const char *s = v;
    while (n < 4) {
        char *end;
        long long x = strtoll(s, &end, 10);
        if (end == s || x < 0 || x > (1 << 20)) break;
        t[n++] = x;
        if (*end == 0) {
            s = end;
            break;
        }
        if (*end != ',') { n = -1; break; }
        s = end + 1;
    }
    if (*s != 0 || (n != 1 && n != 4)) {
        cli_error("%s '%s': expected channels per 1024 (int >= 0) for every set, or four of them: q/k/v,o,gate/up,down",
                  flag, v);
        return 0;
    }
    for (int i = 0; i < 4; i++) k[i] = t[n == 1 ? 0 : i];
    return 1;
}

int cli_refine_opt(int argc, char **argv, int *i, spx_refine_params *p) {
    const char *a = argv[*i], *v;
    static const char *const valued[] = {"--refine", "--refine-k", "--refine-cache", "--refine-miss", "--refine-loaders",
                                         "--refine-blocks", "--refine-lag", "--refine-lead", "--refine-tuned", "--refine-mlp",
                                         "--refine-kn"};
    if (!flag_in(a, valued, sizeof valued / sizeof valued[0])) return 0;
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (!strcmp(a, "--refine")) p->path = v;
    else if (!strcmp(a, "--refine-k")) return cli_refine_ks(a, v, p->k) ? 1 : -1;
    else if (!strcmp(a, "--refine-tuned")) {
        if (!strcmp(v, "off")) p->tuned = -1;
        else if (!cli_budget(a, v, &p->tuned)) return -1;
    }
    else if (!strcmp(a, "--refine-cache")) return cli_int(a, v, 0, (int64_t)1 << 30, &p->cache_mb) ? 1 : -1;
    else if (!strcmp(a, "--refine-kn")) return cli_int(a, v, 0, 1 << 20, &p->kn) ? 1 : -1;
    else if (!strcmp(a, "--refine-mlp")) {
        if (strcmp(v, "channel") && strcmp(v, "neuron")) {
            cli_error("--refine-mlp '%s': expected channel or neuron", v);
            return -1;
        }
        p->mlp = !strcmp(v, "neuron") ? SPX_REFINE_MLP_NEURON : SPX_REFINE_MLP_CHANNEL;
    } else if (!strcmp(a, "--refine-loaders")) {
        int64_t n;
        if (!cli_int(a, v, 1, 64, &n)) return -1;
        p->n_loaders = (int32_t)n;
    } else if (!strcmp(a, "--refine-blocks")) {
        int64_t n;
        if (!cli_int(a, v, 1, 4096, &n)) return -1;
        p->cuda_blocks = (int32_t)n;
    } else if (!strcmp(a, "--refine-lag") || !strcmp(a, "--refine-lead")) {
        double s;
        if (!cli_float(a, v, 0, 2, &s) || s * 2 != (double)(int)(s * 2)) {
            cli_error("%s '%s': expected 0, 0.5, 1, 1.5 or 2 (blocks)", a, v);
            return -1;
        }
        if (!strcmp(a, "--refine-lag")) p->cuda_lag = (int32_t)(s * 2);
        else p->cuda_lead = (int32_t)(s * 2);
    } else if (!strcmp(v, "skip") || !strcmp(v, "wait")) p->miss_wait = !strcmp(v, "wait");
    else {
        cli_error("--refine-miss '%s': expected skip or wait", v);
        return -1;
    }
    return 1;
}

int cli_apply_refine(spx_model *m, const spx_refine_params *p) {
    if (!p->path) return 1;
    if (spx_model_refine(m, p) != SPX_OK) {
        cli_error("%s", spx_model_error(m));
        return 0;
    }
    spx_refine_info r;
    spx_model_refine_info(m, &r);
    if (r.tuned) {
        fprintf(stderr, "refine: tuned budgets for %s (%g%% budget, measured %.1f%% slower, KL %.4f): k = %lld,%lld,%lld,%lld",
                r.platform, 100 * r.tuned_budget, 100 * r.tuned_slowdown, r.tuned_kl, (long long)r.k[0],
                (long long)r.k[1], (long long)r.k[2], (long long)r.k[3]);
        if (r.mlp == SPX_REFINE_MLP_NEURON) fprintf(stderr, ", MLP neuron-wise kn %lld", (long long)r.kn);
        if (r.cuda_blocks || r.cuda_lag || r.cuda_lead)
            fprintf(stderr, ", cuda blocks %d lag %g lead %g", (int)r.cuda_blocks, 0.5 * r.cuda_lag, 0.5 * r.cuda_lead);
        fputc('\n', stderr);
    }
    return 1;
}

int cli_budget(const char *flag, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    int pct = end != s && *end == '%' && end[1] == 0;
    if (errno || end == s || (*end && !pct) || !isfinite(v)) {
        cli_error("%s '%s': expected a slowdown budget such as 5%% or 0.05", flag, s);
        return 0;
    }
    if (pct) v /= 100;
    if (!(v > 0 && v < 1)) {
        cli_error("%s '%s': a slowdown budget must be above 0 and below 100%%%s", flag, s,
                  !pct && v >= 1 && v < 100 ? " (a number without % is a fraction: 5% is 0.05)" : "");
        return 0;
    }
    *out = v;
    return 1;
}

int cli_decode_tps(spx_session *s, int32_t first, int64_t n, double *tps) {
    spx_session_reset(s); /* generation from a short context, as llama-bench tg */
    return cli_decode_tps_here(s, first, n, tps);
}

int cli_decode_tps_here(spx_session *s, int32_t first, int64_t n, double *tps) {
    int32_t id = first;
    double t0 = spx_now();
    for (int64_t i = 0; i < n; i++) /* greedy, a decode loop: on a GPU only the id crosses to the host,
                                     * and the next step is queued before it does */
        if (spx_session_step_greedy_ahead(s, id, &id, i + 1 < n) != SPX_OK) {
            cli_error("%s", spx_session_error(s));
            return 0;
        }
    *tps = (double)n / (spx_now() - t0);
    return 1;
}

void cli_refine_summary(FILE *f, const spx_model *m) {
    spx_refine_info r;
    spx_model_refine_info(m, &r);
    if (!r.active) return;
    fprintf(f, "refinement: %lld matrices, %.1f MiB of residual columns %s; k per 1024 q/k/v %lld o %lld gate/up %lld "
               "down %lld",
            (long long)r.n_mats, (double)r.residual_bytes / 1048576.0,
            r.device ? "in pinned host memory, read by the GPU" : r.on_disk ? "on disk" : "mapped in RAM",
            (long long)r.k[0], (long long)r.k[1], (long long)r.k[2], (long long)r.k[3]);
    if (r.device) /* the device path keeps no counters: what the budgets read */
        fprintf(f, "; %.2f MiB read per token", (double)r.bytes_per_token / 1048576.0);
    else
        fprintf(f, "; %llu launches, %.1f%% of selected columns applied", (unsigned long long)r.launches,
                r.selected ? 100.0 * (double)r.applied / (double)r.selected : 0.0);
    if (r.fit_k[0])
        fprintf(f, "; fitted for k %lld,%lld,%lld,%lld", (long long)r.fit_k[0], (long long)r.fit_k[1],
                (long long)r.fit_k[2], (long long)r.fit_k[3]);
    if (r.cuda_blocks || r.cuda_lag || r.cuda_lead) /* the cuda schedule (the cpu backend has none) */
        fprintf(f, "; cuda blocks %d, lag %g, lead %g blocks", (int)r.cuda_blocks, r.cuda_lag / 2.0, r.cuda_lead / 2.0);
    if (r.mlp == SPX_REFINE_MLP_NEURON)
        fprintf(f, "; MLP neuron-wise: %lld neurons per 1024, bundles in %lld layers", (long long)r.kn,
                (long long)r.n_bundle_layers);
    if (r.on_disk)
        fprintf(f, "; cache %.0f MiB, hit rate %.1f%%, %.1f MiB read (%s), %llu waits %.3f s",
                (double)r.cache_bytes / 1048576.0, r.requests ? 100.0 * (double)r.hits / (double)r.requests : 0.0,
                (double)r.bytes_read / 1048576.0, r.direct ? "O_DIRECT" : "buffered", (unsigned long long)r.waits,
                r.wait_s);
    fputc('\n', f);
}

void cli_spec_defaults(spx_spec_params *p) {
    spx_spec_params_default(p);
    p->kind = SPX_SPEC_OFF; /* docs/spec.md: not on by default on the CPU */
}

int cli_spec_opt(int argc, char **argv, int *i, spx_spec_params *p, int *given) {
    const char *a = argv[*i], *v;
    if (strcmp(a, "--spec") && strcmp(a, "--draft-max") && strcmp(a, "--draft-min")) return 0;
    if (!(v = cli_value(argc, argv, i))) return -1;
    int64_t x;
    if (!strcmp(a, "--spec")) {
        int k = spx_spec_kind_parse(v);
        if (k < 0) { cli_error("--spec: expected lookup or off, got '%s'", v); return -1; }
        p->kind = (spx_spec_kind)k;
        *given = 1;
    } else if (!strcmp(a, "--draft-max")) {
        if (!cli_int(a, v, 1, SPX_SPEC_DRAFT_LIMIT, &x)) return -1;
        p->draft_max = (int32_t)x;
    } else {
        if (!cli_int(a, v, 1, SPX_SPEC_DRAFT_LIMIT, &x)) return -1;
        p->draft_min = (int32_t)x;
    }
    return 1;
}

int cli_spec_check(const spx_spec_params *p) {
    if (p->draft_min > p->draft_max) {
        cli_error("--draft-min %d exceeds --draft-max %d", p->draft_min, p->draft_max);
        return 0;
    }
    return 1;
}

void cli_spec_summary(FILE *f, const spx_spec_params *p, const spx_spec_stats *st) {
    fprintf(f, "spec %s: draft %d..%d, n-grams %d..%d, stop below %.2f, pause %d; %lld drafted, %lld kept (%.1f%%), "
               "%lld tokens in %lld passes (%.2f per pass; %lld verifications, %lld re-feeds)\n",
            spx_spec_kind_name(p->kind), p->draft_min, p->draft_max, p->ngram_min, p->ngram_max, (double)p->stop_below,
            p->pause, (long long)st->drafted, (long long)st->accepted,
            st->drafted ? 100.0 * (double)st->accepted / (double)st->drafted : 0.0, (long long)st->tokens,
            (long long)st->passes, st->passes ? (double)st->tokens / (double)st->passes : 0.0, (long long)st->verify,
            (long long)st->refeeds);
}
