/* cmd_chat.c: `spectra chat -m MODEL`: an interactive conversation (or one
 * fed from a pipe, one user message per line), the replies streamed.
 *
 * Each turn renders the whole conversation through the chat template
 * (spx_chat_render; the model's, --chat-template FILE, or ChatML when the
 * model has none) and feeds only the tokens past the longest prefix the
 * session already holds (the template's text for earlier turns is stable
 * for the templates we know, so that is the new user turn); where the
 * prefix diverges the session is truncated there (a model with recurrent
 * layers, which can only go back to a checkpoint, starts over instead).
 * When the conversation no longer fits the context (with room for -n
 * reply tokens), the oldest turns after the system prompt are dropped,
 * said on stderr, and the conversation is fed again. */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "engine/plan.h"
#include "engine/session.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: spectra chat -m MODEL [options]\n"
            "  Type a message and Enter; a line ending in \\ continues on the next line.\n"
            "  /reset forgets the conversation (the system prompt stays), /exit or end of input quits.\n"
            "  From a pipe, each line is one user message and each reply is printed followed by a newline.\n"
            "  -m MODEL          Hugging Face folder or .trdc file\n"
            "  --system TEXT     system prompt (default: none)\n"
            "  --chat-template FILE  a Jinja chat template instead of the model's (default: the model's\n"
            "                    tokenizer_config.json chat_template; ChatML when it has none)\n"
            "  -n N              reply tokens at most (int >= 1; default 512)\n"
            "  --temp T          temperature (float >= 0; 0 = greedy; default 0.8)\n"
            "  --top-k K         (int >= 0, 0 = off; default 40)\n"
            "  --top-p P         (float in (0, 1]; default 0.95)\n"
            "  --seed S          random seed (uint64; default: from the clock)\n"
            "  --ctx N           context length (int; default: min(model max, 4096)); when the\n"
            "                    conversation outgrows it, the oldest turns are dropped\n"
            "  --kv TYPE         KV cache: f32, f16, q4, k2v2, k3v2, k3v3, k4v4 (default f16)\n"
            "  --threads N       worker threads (default: all CPUs)\n"
            "  --backend B       cpu, cuda or auto (default auto)\n"
            "  --vram-budget MiB device memory the model may use\n" CLI_MMAP_USAGE
            "  -v, --verbose     the rendered prompt of each turn and speed on stderr\n");
}

typedef struct chat {
    spx_model *m;
    spx_session *s;
    spx_template *tmpl;       /* --chat-template, or NULL: the model's */
    cJSON *msgs;              /* the conversation */
    int32_t *hist;            /* the tokens the session holds */
    size_t n_hist, cap_hist;
    spx_sampler_params smp;
    uint64_t rng;
    int64_t n_reply;
    int verbose, tty;
} chat;

/* Room for n tokens in the history (grown geometrically). */
static int hist_reserve(chat *c, size_t n) {
    if (n <= c->cap_hist) return 1;
    size_t cap = c->cap_hist * 2 + 16 > n ? c->cap_hist * 2 + 16 : n;
    int32_t *h = realloc(c->hist, cap * sizeof *h);
    if (!h) return cli_error("out of memory"), 0;
    c->hist = h;
    c->cap_hist = cap;
    return 1;
}

static int hist_set(chat *c, const int32_t *ids, size_t n) {
    if (!hist_reserve(c, n)) return 0;
    memcpy(c->hist, ids, n * sizeof *ids);
    c->n_hist = n;
    return 1;
}

static int add_msg(cJSON *msgs, const char *role, const char *text) {
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddStringToObject(o, "role", role) || !cJSON_AddStringToObject(o, "content", text) ||
        !cJSON_AddItemToArray(msgs, o)) {
        cJSON_Delete(o);
        return cli_error("out of memory"), 0;
    }
    return 1;
}

/* The conversation's prompt tokens (*ids malloc'd). */
static int render(chat *c, int32_t **ids, size_t *n) {
    char *js = cJSON_PrintUnformatted(c->msgs), *text = NULL, err[512];
    size_t len = 0;
    if (!js) return cli_error("out of memory"), 0;
    spx_status st = spx_chat_render(c->m, c->tmpl, js, NULL, 1, &text, &len, err, sizeof err);
    free(js);
    if (st != SPX_OK) return cli_error("chat template: %s", err), 0;
    if (c->verbose) fprintf(stderr, "--- prompt ---\n%s\n--------------\n", text);
    spx_err e;
    spx_err_clear(&e);
    /* the template writes BOS itself where the model wants one: no tokenizer rule on top (as transformers'
     * apply_chat_template(tokenize=True) does) */
    st = spx_tok_encode(c->m->tok, text, len, 0, ids, n, &e);
    free(text);
    if (st != SPX_OK) return cli_fail(&e), 0;
    return 1;
}

/* Feeds ids past what the session holds; the last logits to *logits. */
static int feed(chat *c, const int32_t *ids, size_t n, float *logits) {
    size_t k = 0;
    while (k < n && k < c->n_hist && ids[k] == c->hist[k]) k++;
    if (k == n) k = n - 1; /* the last token is fed again: its logits start the reply */
    if (k < c->n_hist && spx_session_truncate(c->s, (int64_t)k) != SPX_OK) {
        spx_session_reset(c->s); /* recurrent layers: back to a checkpoint or 0 only */
        k = 0;
    }
    if (spx_session_eval(c->s, ids + k, n - k, logits, 0) != SPX_OK) return cli_error("%s", spx_session_error(c->s)), 0;
    return hist_set(c, ids, n);
}

/* Drops the oldest turn after a leading system message; 0 when none is left to drop. */
static int drop_oldest(cJSON *msgs) {
    int first = 0;
    cJSON *m0 = cJSON_GetArrayItem(msgs, 0);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m0, "role");
    if (cJSON_IsString(r) && !strcmp(r->valuestring, "system")) first = 1;
    if (cJSON_GetArraySize(msgs) <= first + 1) return 0; /* only the new user message is left */
    cJSON_DeleteItemFromArray(msgs, first);
    /* a turn is a user message and its reply */
    cJSON *next = cJSON_GetArrayItem(msgs, first);
    r = cJSON_GetObjectItemCaseSensitive(next, "role");
    if (cJSON_GetArraySize(msgs) > first + 1 && cJSON_IsString(r) && !strcmp(r->valuestring, "assistant"))
        cJSON_DeleteItemFromArray(msgs, first);
    return 1;
}

static int is_eos(const spx_model *m, int32_t id) {
    if (id == spx_model_eos_id(m)) return 1;
    for (int k = 0; k < m->cfg.n_eos; k++)
        if (id == m->cfg.eos_ids[k]) return 1;
    return 0;
}

/* One user message in, the reply streamed to stdout and added to the conversation. */
static int turn(chat *c, const char *user, float *logits) {
    if (!add_msg(c->msgs, "user", user)) return 0;
    int32_t *ids = NULL;
    size_t n = 0;
    for (;;) {
        if (!render(c, &ids, &n)) return 0;
        if ((int64_t)n + c->n_reply <= c->s->n_ctx || (int64_t)n < c->s->n_ctx / 2) break;
        free(ids);
        ids = NULL;
        if (!drop_oldest(c->msgs)) {
            cJSON_DeleteItemFromArray(c->msgs, cJSON_GetArraySize(c->msgs) - 1);
            return cli_error("chat: the message (%zu prompt tokens with the system prompt) does not fit the "
                             "%lld-token context (--ctx)", n, (long long)c->s->n_ctx), 1;
        }
        fprintf(stderr, "[context full: the oldest turn was dropped]\n");
    }
    double t0 = spx_now();
    if (!feed(c, ids, n, logits)) { free(ids); return 0; }
    free(ids);
    double t1 = spx_now();
    spx_err e;
    spx_err_clear(&e);
    spx_tok_stream *ts = NULL;
    if (spx_tok_stream_new(c->m->tok, 1, &ts, &e) != SPX_OK) return cli_fail(&e), 0;
    char *reply = NULL;
    size_t rlen = 0, rcap = 0;
    int ok = 1;
    int64_t n_done = 0;
    int32_t id = spx_sample(logits, spx_model_vocab_size(c->m), &c->smp, &c->rng);
    for (; n_done < c->n_reply && ok; n_done++) {
        if (is_eos(c->m, id)) break;
        const char *piece;
        size_t plen;
        if (spx_tok_stream_push(ts, id, &piece, &plen, &e) != SPX_OK) { ok = 0, cli_fail(&e); break; }
        if (rlen + plen + 1 > rcap) {
            size_t nc = (rlen + plen + 1) * 2;
            char *nr = realloc(reply, nc);
            if (!nr) { ok = 0, cli_error("out of memory"); break; }
            reply = nr;
            rcap = nc;
        }
        memcpy(reply + rlen, piece, plen);
        rlen += plen;
        fwrite(piece, 1, plen, stdout);
        fflush(stdout);
        if (n_done + 1 == c->n_reply) { n_done++; break; }
        if (spx_session_pos(c->s) >= c->s->n_ctx) {
            fprintf(stderr, "\n[context full: the reply was cut]\n");
            n_done++;
            break;
        }
        int32_t nx;
        if (!hist_reserve(c, c->n_hist + 1)) { ok = 0; break; }
        if (spx_session_step_sample_ahead(c->s, id, &c->smp, &c->rng, &nx, 1) != SPX_OK) {
            ok = 0, cli_error("%s", spx_session_error(c->s));
            break;
        }
        c->hist[c->n_hist++] = id;
        id = nx;
    }
    const char *piece;
    size_t plen;
    if (ok && spx_tok_stream_flush(ts, &piece, &plen, &e) == SPX_OK && plen) {
        char *nr = realloc(reply, rlen + plen + 1);
        if (nr) {
            reply = nr;
            memcpy(reply + rlen, piece, plen);
            rlen += plen;
            fwrite(piece, 1, plen, stdout);
        }
    }
    spx_tok_stream_free(ts);
    printf("\n");
    fflush(stdout);
    if (ok) {
        if (!reply && !(reply = calloc(1, 1))) ok = 0, cli_error("out of memory");
        if (ok) reply[rlen] = 0;
        ok = ok && add_msg(c->msgs, "assistant", reply);
    }
    free(reply);
    double t2 = spx_now();
    if (c->verbose)
        fprintf(stderr, "[prompt %zu tokens in %.2f s; reply %lld tokens in %.2f s, %.1f tokens/s]\n", n, t1 - t0, (long long)n_done, t2 - t1, n_done > 1 ? (double)(n_done - 1) / (t2 - t1) : 0.0);
    return ok;
}

/* One message from stdin: a line, continued while it ends in a backslash.
 * NULL at the end of input. */
static char *read_message(int tty) {
    char *msg = NULL, *line = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (tty) fputs(len ? ". " : "> ", stderr);
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        int more = got > 0 && line[got - 1] == '\\';
        if (more) line[--got] = 0;
        char *nm = realloc(msg, len + (size_t)got + 2);
        if (!nm) break;
        msg = nm;
        if (len) msg[len++] = '\n';
        memcpy(msg + len, line, (size_t)got + 1);
        len += (size_t)got;
        if (!more) break;
    }
    free(line);
    return msg;
}

int cmd_chat(int argc, char **argv) {
    const char *model = NULL, *system = NULL, *tmpl_file = NULL;
    int64_t n_reply = 512;
    cli_plan_opts po = {.kv = SPX_KV_DEFAULT};
    cli_sample_opts so;
    cli_sample_defaults(&so);
    int verbose = 0, rr;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) verbose = 1;
        else if ((rr = cli_plan_opt(argc, argv, &i, &po)) != 0) { if (rr < 0) return 2; }
        else if ((rr = cli_sample_opt(argc, argv, &i, &so)) != 0) { if (rr < 0) return 2; }
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--system")) system = v;
        else if (!strcmp(a, "--chat-template")) tmpl_file = v;
        else if (!strcmp(a, "-n")) { if (!cli_int(a, v, 1, 1 << 24, &n_reply)) return 2; }
        else { cli_error("chat: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (!model) { cli_error("chat: -m MODEL is required"); usage(stderr); return 2; }
    if (po.n_ctx && po.n_ctx < 16) { cli_error("--ctx: a chat needs at least 16 tokens, got %lld", (long long)po.n_ctx); return 2; }
    chat c;
    memset(&c, 0, sizeof c);
    c.verbose = verbose;
    c.tty = isatty(0);
    c.n_reply = n_reply;
    int rc = 1;
    float *logits = NULL;
    char *msg = NULL;
    if (tmpl_file) { /* before the model: a bad template fails fast */
        size_t len = 0;
        char *src = cli_read_text(tmpl_file, &len), err[512];
        if (!src) return 1;
        spx_status st = spx_template_parse(src, len, tmpl_file, &c.tmpl, err, sizeof err);
        free(src);
        if (st != SPX_OK) return cli_error("%s", err);
    }
    po.quiet = !verbose;
    spx_plan plan;
    if (!(c.m = cli_open_planned(model, &po, &plan))) goto done;
    if (!c.m->tok) { cli_error("%s: the model has no tokenizer (tokenizer.json): chat needs one", model); goto done; }
    if (!tmpl_file && !spx_model_chat_template(c.m))
        fprintf(stderr, "spectra: %s has no chat template; using ChatML (give one with --chat-template FILE)\n", model);
    spx_session_params sp = {.n_ctx = plan.n_ctx, .kv = plan.kv};
    if (spx_session_new(c.m, &sp, &c.s) != SPX_OK) { cli_error("%s", spx_model_error(c.m)); goto done; }
    if (!(logits = malloc((size_t)spx_model_vocab_size(c.m) * sizeof(float))) || !(c.msgs = cJSON_CreateArray())) {
        cli_error("out of memory");
        goto done;
    }
    c.rng = so.seed >= 0 ? (uint64_t)so.seed : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    c.smp = (spx_sampler_params){(float)so.temp, (int32_t)so.top_k, (float)so.top_p, c.rng};
    if (system && !add_msg(c.msgs, "system", system)) goto done;
    if (c.tty) fprintf(stderr, "chat with %s: /reset forgets, /exit quits\n", model);
    rc = 0;
    while ((msg = read_message(c.tty))) {
        if (!strcmp(msg, "/exit") || !strcmp(msg, "/quit")) break;
        if (!strcmp(msg, "/reset")) {
            while (cJSON_GetArraySize(c.msgs) > (system ? 1 : 0)) cJSON_DeleteItemFromArray(c.msgs, cJSON_GetArraySize(c.msgs) - 1);
            spx_session_reset(c.s);
            c.n_hist = 0;
            if (c.tty) fprintf(stderr, "[conversation reset]\n");
        } else if (msg[0] && !turn(&c, msg, logits)) {
            rc = 1;
            break;
        }
        free(msg);
        msg = NULL;
    }
done:
    free(msg);
    free(logits);
    free(c.hist);
    cJSON_Delete(c.msgs);
    spx_session_free(c.s);
    spx_template_free(c.tmpl);
    spx_model_free(c.m);
    return rc;
}
