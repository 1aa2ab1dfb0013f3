/* serve_sched.c: `spectra serve`'s scheduler: the one thread that owns the
 * model and the --parallel sessions (serve.h says why).
 *
 * Each turn of its loop: (1) takes the requests submitted since the last
 * turn, renders (chat) and tokenizes each, and refuses it (400: template
 * error, empty prompt, longer than the context) or accepts it into the
 * waiting list; (2) frees the sessions of cancelled requests; (3) starts
 * waiting requests in free sessions; (4) feeds prompts in pieces of the
 * backend's forward chunk (spx_batch_max: the same chunks one whole
 * spx_session_eval would use, so the logits are those of `spectra run`),
 * at most PREFILL_BUDGET tokens a turn so that running streams keep
 * flowing; (5) advances every session that is decoding by one token in
 * one spx_batch_step. A generated token goes through the request's
 * streaming detokenizer (fed the prompt first, as cmd_run does), then the
 * stop strings: text that could still be the start of a stop string is
 * held back until it cannot, so no part of a stop string is ever sent. */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "engine/session.h"
#include "serve.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PREFILL_BUDGET 256 /* prompt tokens fed per turn at most (at least one piece) */

typedef struct slot {
    spx_session *s;
    srv_req *r;           /* NULL: free */
    size_t fed;           /* prompt tokens fed; decoding once fed == r->n_ids */
    spx_tok_stream *ts;
    int32_t last;         /* decoding: the token drawn and not yet fed */
    int32_t prev;         /* the token before it (logprob texts) */
    spx_sampler_params smp;
    uint64_t rng;
    int64_t n_gen;        /* tokens generated (the end-of-sequence token not counted) */
    char *gen;            /* the text generated so far */
    size_t gen_len, gen_cap, emitted; /* gen[0 .. emitted) sent (stream) */
    srv_logprob *lp;      /* per generated token */
    size_t *lp_end;       /* where its text ends in gen */
    size_t n_lp, lp_cap, lp_sent;
} slot;

struct srv_sched {
    spx_model *m;
    srv_sched_opts o;
    srv_metrics *mt;
    int64_t V, n_ctx, piece;
    slot *slots;
    int64_t n_slots;
    pthread_t th;
    int started;
    pthread_mutex_t mu;   /* guards in_*, n_queued, stop */
    pthread_cond_t cv;
    srv_req *in_head, *in_tail;  /* submitted, not yet looked at */
    int64_t n_queued;            /* submitted and not yet in a session */
    int stop;
    /* the thread's own */
    srv_req *wait_head, *wait_tail;
    float *logits;               /* [n_slots, V] */
    spx_session **bs;
    int32_t *bids, *bnext;
    spx_sampler_params *bsmp;
    uint64_t *brng;
    slot **bslot;
    uint64_t seed_seq;
    size_t rr;                   /* round-robin start of the prefill */
};

int64_t srv_sched_n_ctx(const srv_sched *s) { return s->n_ctx; }

/* ---- the client's bytes ------------------------------------------------- */

static void put(srv_req *r, char *s) {
    if (!s) return;
    srv_req_append(r, s, strlen(s));
    free(s);
}

/* A request ends with an error: before it was accepted, an error answer
 * with that status; after (a stream already sent 200), an error event and
 * [DONE] for a stream, the error answer for the rest. */
static void end_error(srv_req *r, int status, const char *msg, const char *param, const char *code) {
    char *js = srv_error_json(status, msg, param, code);
    pthread_mutex_lock(&r->mu);
    int accepted = r->state == SRV_ACCEPTED;
    pthread_mutex_unlock(&r->mu);
    if (accepted && r->p.stream) {
        srv_req_append(r, "data: ", 6);
        if (js) srv_req_append(r, js, strlen(js));
        srv_req_append(r, "\n\ndata: [DONE]\n\n", 16);
        srv_req_set_state(r, SRV_DONE, 0);
    } else {
        pthread_mutex_lock(&r->mu);
        r->out_len = r->out_off = 0; /* nothing was sent */
        pthread_mutex_unlock(&r->mu);
        if (js) srv_req_append(r, js, strlen(js));
        srv_req_set_state(r, SRV_DONE, status);
    }
    free(js);
}

/* ---- metrics ------------------------------------------------------------ */

static void metrics_gauges(srv_sched *s) {
    int64_t active = 0;
    for (int64_t i = 0; i < s->n_slots; i++) active += s->slots[i].r != NULL;
    pthread_mutex_lock(&s->mu);
    int64_t q = s->n_queued;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->mt->mu);
    s->mt->queue_depth = q;
    s->mt->active = active;
    pthread_mutex_unlock(&s->mt->mu);
}

static void metrics_work(srv_sched *s, double prefill_s, double decode_s, uint64_t prompt, uint64_t gen, int step) {
    srv_metrics *mt = s->mt;
    pthread_mutex_lock(&mt->mu);
    mt->prefill_s += prefill_s;
    mt->decode_s += decode_s;
    mt->prompt_tokens += prompt;
    mt->gen_tokens += gen;
    mt->steps += (uint64_t)step;
    mt->win_busy += prefill_s + decode_s;
    mt->win_tokens += gen;
    if (mt->win_busy >= 1.0) {
        mt->tps = (double)mt->win_tokens / mt->win_busy;
        mt->win_busy = 0;
        mt->win_tokens = 0;
    }
    pthread_mutex_unlock(&mt->mu);
}

/* ---- slots -------------------------------------------------------------- */

static void slot_clear(srv_sched *s, slot *sl) {
    spx_tok_stream_free(sl->ts);
    for (size_t i = 0; i < sl->n_lp; i++) srv_logprob_free(&sl->lp[i]);
    srv_req_release(sl->r);
    sl->ts = NULL;
    sl->r = NULL;
    sl->n_lp = sl->lp_sent = 0;
    sl->gen_len = sl->emitted = 0;
    (void)s;
}

static int gen_append(slot *sl, const char *p, size_t n) {
    if (sl->gen_len + n + 1 > sl->gen_cap) {
        size_t cap = sl->gen_cap ? sl->gen_cap : 1024;
        while (cap < sl->gen_len + n + 1) cap *= 2;
        char *t = realloc(sl->gen, cap);
        if (!t) return 0;
        sl->gen = t;
        sl->gen_cap = cap;
    }
    memcpy(sl->gen + sl->gen_len, p, n);
    sl->gen_len += n;
    sl->gen[sl->gen_len] = 0;
    return 1;
}

/* The earliest stop string in gen[from ..): its position, or -1. */
static int64_t find_stop(const slot *sl, size_t from) {
    const srv_params *p = &sl->r->p;
    int64_t best = -1;
    for (int k = 0; k < p->n_stop; k++) {
        if (sl->gen_len < p->stop_len[k]) continue;
        for (size_t i = from; i + p->stop_len[k] <= sl->gen_len; i++)
            if (!memcmp(sl->gen + i, p->stop[k], p->stop_len[k])) {
                if (best < 0 || (int64_t)i < best) best = (int64_t)i;
                break;
            }
    }
    return best;
}

/* How much of gen may be sent: all but a tail that is a proper prefix of
 * some stop string (it may still grow into one). */
static size_t safe_len(const slot *sl) {
    const srv_params *p = &sl->r->p;
    size_t safe = sl->gen_len;
    for (int k = 0; k < p->n_stop; k++) {
        size_t L = p->stop_len[k];
        size_t lo = sl->gen_len >= L ? sl->gen_len - L + 1 : 0;
        for (size_t i = lo; i < sl->gen_len && i < safe; i++)
            if (!memcmp(sl->gen + i, p->stop[k], sl->gen_len - i)) { safe = i; break; }
    }
    return safe < sl->emitted ? sl->emitted : safe;
}

/* The logprobs that go with gen[0 .. upto): of the tokens whose text
 * ends by then, and at the end also of those that start before it. */
static size_t lp_upto(const slot *sl, size_t from, size_t upto, int final) {
    size_t l = from;
    while (l < sl->n_lp && (sl->lp_end[l] <= upto || (final && sl->lp[l].offset < upto))) l++;
    return l;
}

/* Streams gen[emitted .. upto) with its logprobs. */
static void emit(slot *sl, size_t upto, int final) {
    srv_req *r = sl->r;
    size_t l0 = sl->lp_sent, l1 = lp_upto(sl, l0, upto, final);
    if (upto <= sl->emitted && l1 == l0) return;
    if (r->p.stream)
        put(r, srv_chunk(r, sl->gen + sl->emitted, upto > sl->emitted ? upto - sl->emitted : 0, sl->lp + l0, l1 - l0,
                         NULL, 0));
    if (upto > sl->emitted) sl->emitted = upto;
    sl->lp_sent = l1;
}

static void finish(srv_sched *s, slot *sl, const char *reason) {
    srv_req *r = sl->r;
    spx_err e;
    spx_err_clear(&e);
    const char *piece;
    size_t plen;
    if (spx_tok_stream_flush(sl->ts, &piece, &plen, &e) == SPX_OK && plen) gen_append(sl, piece, plen);
    int64_t at = find_stop(sl, sl->emitted);
    size_t end = sl->gen_len;
    if (at >= 0) {
        end = (size_t)at;
        reason = "stop";
    }
    if (r->p.stream) {
        emit(sl, end, 1);
        put(r, srv_chunk(r, NULL, 0, NULL, 0, reason, 0));
        if (r->p.include_usage) put(r, srv_usage_chunk(r, (int64_t)r->n_ids, sl->n_gen));
        srv_req_append(r, "data: [DONE]\n\n", 14);
    } else {
        put(r, srv_answer(r, sl->gen, end, sl->lp, lp_upto(sl, 0, end, 1), reason, (int64_t)r->n_ids, sl->n_gen));
    }
    srv_req_set_state(r, SRV_DONE, 200);
    slot_clear(s, sl);
}

/* The text of token id after prev, as a decode of the pair shows it. */
static char *token_text(srv_sched *s, int32_t prev, int32_t id) {
    spx_err e;
    spx_err_clear(&e);
    int32_t pair[2] = {prev, id};
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    if (prev >= 0 && spx_tok_decode(s->m->tok, pair, 2, 0, &a, &la, &e) == SPX_OK &&
        spx_tok_decode(s->m->tok, pair, 1, 0, &b, &lb, &e) == SPX_OK && la >= lb && !memcmp(a, b, lb)) {
        char *t = spx_strdup(a + lb);
        free(a);
        free(b);
        return t;
    }
    free(a);
    free(b);
    a = NULL;
    if (spx_tok_decode(s->m->tok, &id, 1, 0, &a, &la, &e) != SPX_OK) return spx_strdup("");
    return a;
}

/* log-softmax of the raw logits: the chosen token's and the top k's. */
static int logprob_of(srv_sched *s, slot *sl, const float *lg, int32_t id, srv_logprob *out) {
    memset(out, 0, sizeof *out);
    const int64_t V = s->V;
    float mx = lg[0];
    for (int64_t i = 1; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += exp((double)lg[i] - mx);
    const double lse = mx + log(sum);
    out->lp = (double)lg[id] - lse;
    out->tok = token_text(s, sl->prev, id);
    const int k = sl->r->p.top_logprobs;
    int32_t top[SRV_MAX_TOP_LOGPROBS];
    int n = 0;
    for (int64_t i = 0; i < V && k > 0; i++) { /* insertion into the k largest, ties: the lower id first */
        if (n == k && lg[i] <= lg[top[n - 1]]) continue;
        int j = n < k ? n++ : n - 1;
        while (j > 0 && lg[top[j - 1]] < lg[i]) { top[j] = top[j - 1]; j--; }
        top[j] = (int32_t)i;
    }
    for (int j = 0; j < n; j++) {
        out->top[j].lp = (double)lg[top[j]] - lse;
        out->top[j].tok = token_text(s, sl->prev, top[j]);
    }
    out->n_top = n;
    return out->tok != NULL;
}

static int is_eos(const spx_model *m, int32_t id) {
    if (id == spx_model_eos_id(m)) return 1;
    for (int k = 0; k < m->cfg.n_eos; k++)
        if (id == m->cfg.eos_ids[k]) return 1;
    return 0;
}

/* The token drawn for sl (lg: its logits row, or NULL when no logprobs
 * are wanted). Returns 1 when the request goes on. */
static int take(srv_sched *s, slot *sl, int32_t id, const float *lg) {
    srv_req *r = sl->r;
    if (is_eos(s->m, id)) { finish(s, sl, "stop"); return 0; }
    spx_err e;
    spx_err_clear(&e);
    const char *piece;
    size_t plen;
    size_t start = sl->gen_len;
    if (spx_tok_stream_push(sl->ts, id, &piece, &plen, &e) != SPX_OK || !gen_append(sl, piece, plen)) {
        end_error(r, 500, e.msg[0] ? e.msg : "out of memory", NULL, NULL);
        slot_clear(s, sl);
        return 0;
    }
    sl->n_gen++;
    if (r->p.logprobs && lg) {
        if (sl->n_lp == sl->lp_cap) {
            size_t cap = sl->lp_cap ? sl->lp_cap * 2 : 64;
            srv_logprob *a = realloc(sl->lp, cap * sizeof *a);
            if (a) sl->lp = a;
            size_t *b = realloc(sl->lp_end, cap * sizeof *b);
            if (b) sl->lp_end = b;
            if (a && b) sl->lp_cap = cap;
        }
        if (sl->n_lp < sl->lp_cap && logprob_of(s, sl, lg, id, &sl->lp[sl->n_lp])) {
            sl->lp[sl->n_lp].offset = start;
            sl->lp_end[sl->n_lp++] = sl->gen_len;
        }
    }
    sl->prev = id;
    sl->last = id;
    int64_t at = find_stop(sl, sl->emitted);
    if (at >= 0 || (r->p.max_tokens >= 0 && sl->n_gen >= r->p.max_tokens) || spx_session_pos(sl->s) >= s->n_ctx) {
        finish(s, sl, at >= 0 ? "stop" : "length");
        return 0;
    }
    if (r->p.stream) emit(sl, safe_len(sl), 0);
    return 1;
}

/* ---- the turn's steps --------------------------------------------------- */

/* A new request: its prompt as tokens, refused or accepted. */
static void intake(srv_sched *s, srv_req *r) {
    char *text = NULL, err[512] = "";
    size_t len = 0;
    if (r->p.chat) {
        spx_status st = spx_chat_render(s->m, s->o.tmpl, r->p.messages_json, r->p.tools_json, 1, &text, &len, err,
                                        sizeof err);
        if (st != SPX_OK) {
            char msg[700];
            snprintf(msg, sizeof msg, "the chat template failed: %s", err[0] ? err : spx_status_name(st));
            end_error(r, 400, msg, "messages", NULL);
            goto refused;
        }
    } else {
        text = spx_strdup(r->p.prompt);
        len = strlen(text);
    }
    spx_err e;
    spx_err_clear(&e);
    if (spx_tok_encode(s->m->tok, text, len, 1, &r->ids, &r->n_ids, &e) != SPX_OK) {
        end_error(r, 400, e.msg, r->p.chat ? "messages" : "prompt", NULL);
        goto refused;
    }
    if (r->n_ids == 0) {
        end_error(r, 400, "the prompt encodes to no tokens", r->p.chat ? "messages" : "prompt", NULL);
        goto refused;
    }
    if ((int64_t)r->n_ids >= s->n_ctx) {
        char msg[300];
        snprintf(msg, sizeof msg,
                 "This model's maximum context length is %lld tokens. However, your prompt has %zu tokens (the "
                 "prompt and at least one generated token must fit).",
                 (long long)s->n_ctx, r->n_ids);
        end_error(r, 400, msg, r->p.chat ? "messages" : "prompt", "context_length_exceeded");
        goto refused;
    }
    free(text);
    srv_req_set_state(r, SRV_ACCEPTED, 200);
    if (r->p.stream && r->p.chat) put(r, srv_chunk(r, NULL, 0, NULL, 0, NULL, 1));
    r->next = NULL;
    if (s->wait_tail) s->wait_tail->next = r;
    else s->wait_head = r;
    s->wait_tail = r;
    return;
refused:
    free(text);
    pthread_mutex_lock(&s->mu);
    s->n_queued--;
    pthread_mutex_unlock(&s->mu);
    srv_req_release(r);
}

static void cancelled(srv_sched *s, srv_req *r) {
    pthread_mutex_lock(&s->mt->mu);
    s->mt->cancelled++;
    pthread_mutex_unlock(&s->mt->mu);
    srv_req_set_state(r, SRV_DONE, 0);
    (void)s;
}

static void admit(srv_sched *s) {
    for (int64_t i = 0; i < s->n_slots && s->wait_head; i++) {
        slot *sl = &s->slots[i];
        if (sl->r) continue;
        srv_req *r = s->wait_head;
        s->wait_head = r->next;
        if (!s->wait_head) s->wait_tail = NULL;
        pthread_mutex_lock(&s->mu);
        s->n_queued--;
        pthread_mutex_unlock(&s->mu);
        if (atomic_load(&r->cancelled)) {
            cancelled(s, r);
            srv_req_release(r);
            i--;
            continue;
        }
        spx_err e;
        spx_err_clear(&e);
        sl->r = r;
        if (spx_tok_stream_new(s->m->tok, 1, &sl->ts, &e) != SPX_OK) goto fail;
        /* the stream sees the prompt first, as in cmd_run: the continuation
         * decodes as it does inside the whole text */
        for (size_t k = 0; k < r->n_ids; k++)
            if (spx_tok_stream_push(sl->ts, r->ids[k], &(const char *){NULL}, &(size_t){0}, &e) != SPX_OK) goto fail;
        spx_session_reset(sl->s);
        sl->fed = 0;
        sl->n_gen = 0;
        sl->prev = r->ids[r->n_ids - 1];
        sl->smp = (spx_sampler_params){(float)r->p.temperature, (int32_t)r->p.top_k, (float)r->p.top_p, 0};
        if (r->p.has_seed) sl->rng = r->p.seed;
        else {
            uint64_t z = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32) ^ (++s->seed_seq * 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            sl->rng = z ^ (z >> 27);
        }
        sl->smp.seed = sl->rng;
        continue;
    fail:
        end_error(r, 500, e.msg[0] ? e.msg : "out of memory", NULL, NULL);
        slot_clear(s, sl);
    }
}

/* Feeds prompt pieces; a prompt done draws its first token from the
 * logits of its last one, as cmd_run does. */
static void prefill(srv_sched *s) {
    int64_t budget = PREFILL_BUDGET;
    for (int64_t j = 0; j < s->n_slots && budget > 0; j++) {
        slot *sl = &s->slots[(s->rr + (size_t)j) % (size_t)s->n_slots];
        srv_req *r = sl->r;
        if (!r || sl->fed == r->n_ids) continue;
        size_t left = r->n_ids - sl->fed, k = left < (size_t)s->piece ? left : (size_t)s->piece;
        float *lg = s->logits; /* row 0: the decode step after this rewrites it */
        double t0 = spx_now();
        if (spx_session_eval(sl->s, r->ids + sl->fed, k, k == left ? lg : NULL, 0) != SPX_OK) {
            end_error(r, 500, spx_session_error(sl->s), NULL, NULL);
            slot_clear(s, sl);
            continue;
        }
        sl->fed += k;
        budget -= (int64_t)k;
        metrics_work(s, spx_now() - t0, 0, k, 0, 0);
        if (sl->fed < r->n_ids) continue;
        if (r->p.max_tokens == 0) { finish(s, sl, "length"); continue; }
        int32_t id = spx_sample(lg, s->V, &sl->smp, &sl->rng);
        if (!is_eos(s->m, id)) metrics_work(s, 0, 0, 0, 1, 0);
        take(s, sl, id, lg);
    }
    s->rr++;
}

static void decode(srv_sched *s) {
    size_t n = 0;
    int want_logits = 0;
    for (int64_t i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (!sl->r || sl->fed < sl->r->n_ids) continue;
        s->bs[n] = sl->s;
        s->bids[n] = sl->last;
        s->bsmp[n] = sl->smp;
        s->brng[n] = sl->rng;
        s->bslot[n] = sl;
        want_logits |= sl->r->p.logprobs;
        n++;
    }
    if (!n) return;
    int all_greedy = 1;
    for (size_t i = 0; i < n; i++) all_greedy &= s->bsmp[i].temperature <= 0;
    double t0 = spx_now();
    /* all greedy: no sampler arrays (a GPU then returns only the argmax ids) */
    spx_status st = spx_batch_step(s->bs, n, s->bids, all_greedy ? NULL : s->bsmp, all_greedy ? NULL : s->brng,
                                   s->bnext, want_logits ? s->logits : NULL);
    double dt = spx_now() - t0;
    if (st != SPX_OK) {
        const char *msg = spx_session_error(s->bs[0]);
        for (size_t i = 0; i < n; i++) {
            end_error(s->bslot[i]->r, 500, msg, NULL, NULL);
            slot_clear(s, s->bslot[i]);
        }
        return;
    }
    uint64_t gen = 0;
    for (size_t i = 0; i < n; i++) {
        slot *sl = s->bslot[i];
        sl->rng = s->brng[i];
        if (!is_eos(s->m, s->bnext[i])) gen++;
        take(s, sl, s->bnext[i], want_logits ? s->logits + i * (size_t)s->V : NULL);
    }
    metrics_work(s, 0, dt, 0, gen, 1);
}

static int busy(const srv_sched *s) {
    if (s->wait_head) return 1;
    for (int64_t i = 0; i < s->n_slots; i++)
        if (s->slots[i].r) return 1;
    return 0;
}

static void *sched_main(void *arg) {
    srv_sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stop && !s->in_head && !busy(s)) pthread_cond_wait(&s->cv, &s->mu);
        srv_req *in = s->in_head;
        s->in_head = s->in_tail = NULL;
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop) {
            /* shutting down: every request gets an error answer */
            while (in) {
                srv_req *nx = in->next;
                end_error(in, 503, "the server is shutting down", NULL, NULL);
                srv_req_release(in);
                in = nx;
            }
            while (s->wait_head) {
                srv_req *r = s->wait_head;
                s->wait_head = r->next;
                end_error(r, 503, "the server is shutting down", NULL, NULL);
                srv_req_release(r);
            }
            for (int64_t i = 0; i < s->n_slots; i++)
                if (s->slots[i].r) {
                    end_error(s->slots[i].r, 503, "the server is shutting down", NULL, NULL);
                    slot_clear(s, &s->slots[i]);
                }
            break;
        }
        while (in) {
            srv_req *nx = in->next;
            intake(s, in);
            in = nx;
        }
        for (srv_req **pp = &s->wait_head, *prev = NULL; *pp;) { /* cancelled while waiting */
            srv_req *r = *pp;
            if (!atomic_load(&r->cancelled)) { prev = r; pp = &r->next; continue; }
            *pp = r->next;
            if (s->wait_tail == r) s->wait_tail = prev;
            pthread_mutex_lock(&s->mu);
            s->n_queued--;
            pthread_mutex_unlock(&s->mu);
            cancelled(s, r);
            srv_req_release(r);
        }
        for (int64_t i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->r && atomic_load(&sl->r->cancelled)) {
                cancelled(s, sl->r);
                slot_clear(s, sl);
            }
        }
        admit(s);
        prefill(s);
        decode(s);
        metrics_gauges(s);
    }
    metrics_gauges(s);
    return NULL;
}

/* ---- start, submit, stop ------------------------------------------------ */

static void sched_free(srv_sched *s) {
    for (int64_t i = 0; s->slots && i < s->n_slots; i++) {
        slot_clear(s, &s->slots[i]);
        spx_session_free(s->slots[i].s);
        free(s->slots[i].gen);
        free(s->slots[i].lp);
        free(s->slots[i].lp_end);
    }
    free(s->slots);
    free(s->logits);
    free(s->bs);
    free(s->bids);
    free(s->bnext);
    free(s->bsmp);
    free(s->brng);
    free(s->bslot);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

srv_sched *srv_sched_start(spx_model *m, const srv_sched_opts *o, srv_metrics *mt) {
    srv_sched *s = calloc(1, sizeof *s);
    if (!s) { cli_error("serve: out of memory"); return NULL; }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->m = m;
    s->o = *o;
    s->mt = mt;
    s->V = spx_model_vocab_size(m);
    s->piece = spx_batch_max(m);
    s->n_slots = o->parallel;
    size_t B = (size_t)o->parallel;
    s->slots = calloc(B, sizeof *s->slots);
    s->logits = malloc(B * (size_t)s->V * sizeof(float));
    s->bs = calloc(B, sizeof *s->bs);
    s->bids = calloc(B, sizeof *s->bids);
    s->bnext = calloc(B, sizeof *s->bnext);
    s->bsmp = calloc(B, sizeof *s->bsmp);
    s->brng = calloc(B, sizeof *s->brng);
    s->bslot = calloc(B, sizeof *s->bslot);
    if (!s->slots || !s->logits || !s->bs || !s->bids || !s->bnext || !s->bsmp || !s->brng || !s->bslot) {
        cli_error("serve: out of memory for %lld sessions", (long long)o->parallel);
        sched_free(s);
        return NULL;
    }
    spx_session_params sp = {.n_ctx = o->n_ctx, .kv = o->kv};
    for (int64_t i = 0; i < s->n_slots; i++)
        if (spx_session_new(m, &sp, &s->slots[i].s) != SPX_OK) {
            cli_error("serve: session %lld of %lld: %s", (long long)i + 1, (long long)o->parallel, spx_model_error(m));
            sched_free(s);
            return NULL;
        }
    s->n_ctx = s->slots[0].s->n_ctx;
    if (pthread_create(&s->th, NULL, sched_main, s) != 0) {
        cli_error("serve: cannot start the scheduler thread");
        sched_free(s);
        return NULL;
    }
    s->started = 1;
    return s;
}

int srv_sched_submit(srv_sched *s, srv_req *r, const char **why) {
    pthread_mutex_lock(&s->mu);
    int ok = 0;
    if (s->stop) *why = "the server is shutting down";
    else if (s->n_queued >= s->o.queue) *why = "the server is busy: the request queue is full (--queue); retry later";
    else {
        pthread_mutex_lock(&r->mu);
        r->refs++;
        pthread_mutex_unlock(&r->mu);
        r->next = NULL;
        if (s->in_tail) s->in_tail->next = r;
        else s->in_head = r;
        s->in_tail = r;
        s->n_queued++;
        pthread_cond_signal(&s->cv);
        ok = 1;
    }
    int64_t q = s->n_queued;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->mt->mu);
    s->mt->queue_depth = q;
    pthread_mutex_unlock(&s->mt->mu);
    return ok;
}

void srv_sched_wake(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_stop(srv_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started) pthread_join(s->th, NULL);
    s->started = 0;
}

void srv_sched_free(srv_sched *s) {
    if (s) sched_free(s);
}
