/* serve_req.c: `spectra serve`'s requests and answers: the body of a
 * /v1/chat/completions or /v1/completions request parsed and checked field
 * by field (unknown fields and wrong types are 400s naming the field), the
 * OpenAI-style error object, the answer JSON (whole, or as server-sent
 * event chunks), the request object shared by a connection and the
 * scheduler, and the /metrics text. Limits: n must be 1; a prompt is one
 * string (or an array of one); stop takes at most 4 strings. */
#include "serve.h"
#include "core/err.h"
#include "core/util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cJSON_Parse writes a global error position: one parse at a time. */
static pthread_mutex_t parse_mu = PTHREAD_MUTEX_INITIALIZER;

const char *srv_endpoint_path(srv_endpoint ep) {
    static const char *const names[SRV_EP_COUNT] = {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                                    "/health", "/metrics", "other"};
    return ep >= 0 && ep < SRV_EP_COUNT ? names[ep] : "other";
}

void srv_params_free(srv_params *p) {
    free(p->prompt);
    free(p->messages_json);
    free(p->tools_json);
    free(p->model);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    memset(p, 0, sizeof *p);
}

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429:
    case 503: return "server_overloaded";
    case 500: return "server_error";
    default: return "invalid_request_error";
    }
}

char *srv_error_json(int status, const char *msg, const char *param, const char *code) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", error_type(status));
    if (param && *param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static int fail(srv_error *err, int status, const char *param, const char *fmt, ...) SPX_PRINTF(4, 5);
static int fail(srv_error *err, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->status = status;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    return 0;
}

/* An integer-valued JSON number in [lo, hi]. */
static int get_int(const cJSON *v, const char *name, int64_t lo, int64_t hi, int64_t *out, srv_error *err) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return fail(err, 400, name, "'%s' must be an integer", name);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return fail(err, 400, name, "'%s' must be in [%lld, %lld], got %.17g", name, (long long)lo, (long long)hi,
                    v->valuedouble);
    *out = (int64_t)v->valuedouble;
    return 1;
}

static int get_num(const cJSON *v, const char *name, double lo, double hi, int lo_open, double *out, srv_error *err) {
    if (!cJSON_IsNumber(v)) return fail(err, 400, name, "'%s' must be a number", name);
    double x = v->valuedouble;
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return fail(err, 400, name, "'%s' must be in %s%g, %g], got %g", name, lo_open ? "(" : "[", lo, hi, x);
    *out = x;
    return 1;
}

static int get_bool(const cJSON *v, const char *name, int *out, srv_error *err) {
    if (!cJSON_IsBool(v)) return fail(err, 400, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 1;
}

static int get_stop(const cJSON *v, srv_params *p, srv_error *err) {
    if (cJSON_IsString(v)) {
        if (!*v->valuestring) return 1; /* "" stops nothing */
        p->stop[0] = spx_strdup(v->valuestring);
        p->stop_len[0] = strlen(v->valuestring);
        p->n_stop = 1;
        return 1;
    }
    if (!cJSON_IsArray(v)) return fail(err, 400, "stop", "'stop' must be a string or an array of strings");
    int n = cJSON_GetArraySize(v);
    if (n > SRV_MAX_STOP) return fail(err, 400, "stop", "'stop' takes at most %d strings, got %d", SRV_MAX_STOP, n);
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsString(it)) return fail(err, 400, "stop", "'stop' must be a string or an array of strings");
        if (!*it->valuestring) continue;
        p->stop_len[p->n_stop] = strlen(it->valuestring);
        p->stop[p->n_stop++] = spx_strdup(it->valuestring);
    }
    return 1;
}

/* A message's content: a string, null, or an array of {"type": "text",
 * "text": ...} parts (joined). Returns the string (malloc'd) or NULL
 * (error set). */
static char *content_text(const cJSON *c, const char *param, srv_error *err) {
    if (!c || cJSON_IsNull(c)) return spx_strdup("");
    if (cJSON_IsString(c)) return spx_strdup(c->valuestring);
    if (!cJSON_IsArray(c)) {
        fail(err, 400, param, "'%s' must be a string or an array of text parts", param);
        return NULL;
    }
    size_t len = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx)) {
            fail(err, 400, param, "'%s': only parts {\"type\": \"text\", \"text\": STRING} are supported", param);
            return NULL;
        }
        len += strlen(tx->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s) return NULL;
    s[0] = 0;
    len = 0;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t k = strlen(t);
        memcpy(s + len, t, k + 1);
        len += k;
    }
    return s;
}

/* messages: a non-empty array of {"role": STRING, "content": ..., and
 * optionally name, tool_calls, tool_call_id}; the copy handed to the
 * template has every content as a string. */
static int get_messages(const cJSON *v, srv_params *p, srv_error *err) {
    if (!cJSON_IsArray(v)) return fail(err, 400, "messages", "'messages' must be an array");
    if (cJSON_GetArraySize(v) == 0) return fail(err, 400, "messages", "'messages' must not be empty");
    cJSON *out = cJSON_CreateArray();
    const cJSON *msg;
    int i = 0, ok = 1;
    char param[64];
    cJSON_ArrayForEach(msg, v) {
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(msg)) { ok = fail(err, 400, param, "'%s' must be an object", param); break; }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsString(role)) {
            snprintf(param, sizeof param, "messages[%d].role", i);
            ok = fail(err, 400, param, "'%s' must be a string", param);
            break;
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(out, m);
        const cJSON *f;
        cJSON_ArrayForEach(f, msg) {
            snprintf(param, sizeof param, "messages[%d].%.40s", i, f->string);
            if (!strcmp(f->string, "role")) {
                cJSON_AddStringToObject(m, "role", f->valuestring);
            } else if (!strcmp(f->string, "content")) {
                char *t = content_text(f, param, err);
                if (!t) { ok = 0; break; }
                cJSON_AddStringToObject(m, "content", t);
                free(t);
            } else if (!strcmp(f->string, "name") || !strcmp(f->string, "tool_call_id")) {
                if (!cJSON_IsString(f)) { ok = fail(err, 400, param, "'%s' must be a string", param); break; }
                cJSON_AddItemToObject(m, f->string, cJSON_Duplicate(f, 1));
            } else if (!strcmp(f->string, "tool_calls")) {
                if (!cJSON_IsArray(f)) { ok = fail(err, 400, param, "'%s' must be an array", param); break; }
                cJSON_AddItemToObject(m, f->string, cJSON_Duplicate(f, 1));
            } else {
                ok = fail(err, 400, param, "unknown field '%s'", param);
                break;
            }
        }
        if (!ok) break;
        if (!cJSON_GetObjectItemCaseSensitive(m, "content")) cJSON_AddStringToObject(m, "content", "");
        i++;
    }
    if (ok) p->messages_json = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    return ok;
}

int srv_parse_request(const char *body, size_t len, int chat, const char *default_model, srv_params *p,
                      srv_error *err) {
    memset(p, 0, sizeof *p);
    memset(err, 0, sizeof *err);
    p->chat = chat;
    p->max_tokens = chat ? -1 : 16; /* OpenAI's defaults: chat to the end of the context, completions 16 */
    p->temperature = 1.0;
    p->top_p = 1.0;
    pthread_mutex_lock(&parse_mu);
    cJSON *j = cJSON_ParseWithLength(body, len);
    pthread_mutex_unlock(&parse_mu);
    if (!j) return fail(err, 400, NULL, "the body is not valid JSON");
    int ok = 1, have_body = 0, top_lp_given = 0;
    int64_t iv;
    if (!cJSON_IsObject(j)) { ok = fail(err, 400, NULL, "the body must be a JSON object"); goto done; }
    const cJSON *f;
    cJSON_ArrayForEach(f, j) {
        const char *k = f->string;
        if (cJSON_IsNull(f) && strcmp(k, "messages") && strcmp(k, "prompt")) continue; /* null: absent */
        if (!strcmp(k, "model")) {
            if (!cJSON_IsString(f)) { ok = fail(err, 400, k, "'model' must be a string"); break; }
            free(p->model);
            p->model = spx_strdup(f->valuestring);
        } else if (chat && !strcmp(k, "messages")) {
            if (!(ok = get_messages(f, p, err))) break;
            have_body = 1;
        } else if (chat && !strcmp(k, "tools")) {
            if (!cJSON_IsArray(f)) { ok = fail(err, 400, k, "'tools' must be an array"); break; }
            free(p->tools_json);
            p->tools_json = cJSON_PrintUnformatted(f);
        } else if (!chat && !strcmp(k, "prompt")) {
            const cJSON *s = f;
            if (cJSON_IsArray(f)) {
                if (cJSON_GetArraySize(f) != 1) {
                    ok = fail(err, 400, k, "'prompt' as an array must hold exactly one string (batches are not supported)");
                    break;
                }
                s = cJSON_GetArrayItem(f, 0);
            }
            if (!cJSON_IsString(s)) { ok = fail(err, 400, k, "'prompt' must be a string or an array of one string"); break; }
            free(p->prompt);
            p->prompt = spx_strdup(s->valuestring);
            have_body = 1;
        } else if (!strcmp(k, "max_tokens") || !strcmp(k, "max_completion_tokens")) {
            if (!(ok = get_int(f, k, 0, INT32_MAX, &p->max_tokens, err))) break;
        } else if (!strcmp(k, "temperature")) {
            if (!(ok = get_num(f, k, 0, 2, 0, &p->temperature, err))) break;
        } else if (!strcmp(k, "top_p")) {
            if (!(ok = get_num(f, k, 0, 1, 1, &p->top_p, err))) break;
        } else if (!strcmp(k, "top_k")) {
            if (!(ok = get_int(f, k, 0, INT32_MAX, &p->top_k, err))) break;
        } else if (!strcmp(k, "seed")) {
            if (!(ok = get_int(f, k, INT64_MIN / 2, INT64_MAX / 2, &iv, err))) break;
            p->has_seed = 1;
            p->seed = (uint64_t)iv;
        } else if (!strcmp(k, "stop")) {
            if (!(ok = get_stop(f, p, err))) break;
        } else if (!strcmp(k, "n")) {
            if (!(ok = get_int(f, k, INT32_MIN, INT32_MAX, &iv, err))) break;
            if (iv != 1) { ok = fail(err, 400, k, "only n = 1 is supported, got %lld", (long long)iv); break; }
        } else if (chat && !strcmp(k, "logprobs")) {
            if (!(ok = get_bool(f, k, &p->logprobs, err))) break;
        } else if (chat && !strcmp(k, "top_logprobs")) {
            if (!(ok = get_int(f, k, 0, SRV_MAX_TOP_LOGPROBS, &iv, err))) break;
            p->top_logprobs = (int)iv;
            top_lp_given = 1;
        } else if (!chat && !strcmp(k, "logprobs")) {
            if (!(ok = get_int(f, k, 0, SRV_MAX_TOP_LOGPROBS, &iv, err))) break;
            p->logprobs = 1;
            p->top_logprobs = (int)iv;
        } else if (!strcmp(k, "stream")) {
            if (!(ok = get_bool(f, k, &p->stream, err))) break;
        } else if (!strcmp(k, "stream_options")) {
            if (!cJSON_IsObject(f)) { ok = fail(err, 400, k, "'stream_options' must be an object"); break; }
            const cJSON *g;
            cJSON_ArrayForEach(g, f) {
                if (strcmp(g->string, "include_usage")) {
                    ok = fail(err, 400, "stream_options", "unknown field 'stream_options.%.40s'", g->string);
                    break;
                }
                if (!(ok = get_bool(g, "stream_options.include_usage", &p->include_usage, err))) break;
            }
            if (!ok) break;
        } else if (!strcmp(k, "user")) {
            if (!cJSON_IsString(f)) { ok = fail(err, 400, k, "'user' must be a string"); break; }
        } else {
            ok = fail(err, 400, k, "unknown field '%.100s'", k);
            break;
        }
    }
    if (ok && !have_body)
        ok = fail(err, 400, chat ? "messages" : "prompt", "'%s' is required", chat ? "messages" : "prompt");
    if (ok && top_lp_given && !p->logprobs)
        ok = fail(err, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (ok && !p->model) p->model = spx_strdup(default_model);
done:
    cJSON_Delete(j);
    if (!ok) srv_params_free(p);
    return ok;
}

/* ---- the request object ------------------------------------------------ */

void srv_req_append(srv_req *r, const char *s, size_t n) {
    pthread_mutex_lock(&r->mu);
    if (r->out_len + n + 1 > r->out_cap) {
        size_t cap = r->out_cap ? r->out_cap : 4096;
        while (cap < r->out_len + n + 1) cap *= 2;
        char *t = realloc(r->out, cap);
        if (!t) { pthread_mutex_unlock(&r->mu); return; } /* the client gets a short answer */
        r->out = t;
        r->out_cap = cap;
    }
    memcpy(r->out + r->out_len, s, n);
    r->out_len += n;
    r->out[r->out_len] = 0;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void srv_req_set_state(srv_req *r, srv_state st, int status) {
    pthread_mutex_lock(&r->mu);
    r->state = st;
    if (status) r->status = status;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void srv_req_release(srv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    srv_params_free(&r->p);
    free(r->ids);
    free(r->out);
    free(r);
}

/* ---- answers ----------------------------------------------------------- */

void srv_logprob_free(srv_logprob *l) {
    free(l->tok);
    for (int i = 0; i < l->n_top; i++) free(l->top[i].tok);
    memset(l, 0, sizeof *l);
}

static cJSON *bytes_array(const char *s) {
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

/* chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}]};
 * completions: {tokens, token_logprobs, top_logprobs: [{tok: lp}], text_offset} */
static cJSON *logprobs_json(int chat, const srv_logprob *lps, size_t n) {
    cJSON *o = cJSON_CreateObject();
    if (chat) {
        cJSON *c = cJSON_AddArrayToObject(o, "content");
        for (size_t i = 0; i < n; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "token", lps[i].tok);
            cJSON_AddNumberToObject(e, "logprob", lps[i].lp);
            cJSON_AddItemToObject(e, "bytes", bytes_array(lps[i].tok));
            cJSON *t = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int k = 0; k < lps[i].n_top; k++) {
                cJSON *x = cJSON_CreateObject();
                cJSON_AddStringToObject(x, "token", lps[i].top[k].tok);
                cJSON_AddNumberToObject(x, "logprob", lps[i].top[k].lp);
                cJSON_AddItemToObject(x, "bytes", bytes_array(lps[i].top[k].tok));
                cJSON_AddItemToArray(t, x);
            }
            cJSON_AddItemToArray(c, e);
        }
        cJSON_AddNullToObject(o, "refusal");
    } else {
        cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *lp = cJSON_AddArrayToObject(o, "token_logprobs");
        cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs"), *off = cJSON_AddArrayToObject(o, "text_offset");
        for (size_t i = 0; i < n; i++) {
            cJSON_AddItemToArray(toks, cJSON_CreateString(lps[i].tok));
            cJSON_AddItemToArray(lp, cJSON_CreateNumber(lps[i].lp));
            cJSON *d = cJSON_CreateObject();
            for (int k = 0; k < lps[i].n_top; k++)
                if (!cJSON_GetObjectItemCaseSensitive(d, lps[i].top[k].tok))
                    cJSON_AddNumberToObject(d, lps[i].top[k].tok, lps[i].top[k].lp);
            cJSON_AddItemToArray(top, d);
            cJSON_AddItemToArray(off, cJSON_CreateNumber((double)lps[i].offset));
        }
    }
    return o;
}

static cJSON *answer_head(const srv_req *r, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->p.model ? r->p.model : "");
    return o;
}

/* a string of len bytes (may hold NULs: cut at the first) */
static cJSON *str_n(const char *s, size_t len) {
    char *t = malloc(len + 1);
    if (!t) return cJSON_CreateString("");
    memcpy(t, s, len);
    t[len] = 0;
    cJSON *j = cJSON_CreateString(t);
    free(t);
    return j;
}

static char *sse(cJSON *o) {
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!js) return NULL;
    size_t n = strlen(js);
    char *s = malloc(n + 9);
    if (s) {
        memcpy(s, "data: ", 6);
        memcpy(s + 6, js, n);
        memcpy(s + 6 + n, "\n\n", 3);
    }
    free(js);
    return s;
}

char *srv_chunk(const srv_req *r, const char *text, size_t len, const srv_logprob *lps, size_t n_lp, const char *finish,
                int role) {
    const int chat = r->p.chat;
    cJSON *o = answer_head(r, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text || role) cJSON_AddItemToObject(d, "content", str_n(text ? text : "", text ? len : 0));
    } else {
        cJSON_AddItemToObject(c, "text", str_n(text ? text : "", text ? len : 0));
    }
    if (r->p.logprobs && n_lp) cJSON_AddItemToObject(c, "logprobs", logprobs_json(chat, lps, n_lp));
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    if (r->p.include_usage) cJSON_AddNullToObject(o, "usage");
    return sse(o);
}

static cJSON *usage_json(int64_t n_prompt, int64_t n_gen) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(n_prompt + n_gen));
    return u;
}

char *srv_usage_chunk(const srv_req *r, int64_t n_prompt, int64_t n_gen) {
    cJSON *o = answer_head(r, r->p.chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage_json(n_prompt, n_gen));
    return sse(o);
}

char *srv_answer(const srv_req *r, const char *text, size_t len, const srv_logprob *lps, size_t n_lp,
                 const char *finish, int64_t n_prompt, int64_t n_gen) {
    const int chat = r->p.chat;
    cJSON *o = answer_head(r, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddItemToObject(msg, "content", str_n(text, len));
        cJSON_AddNullToObject(msg, "refusal");
    } else {
        cJSON_AddItemToObject(c, "text", str_n(text, len));
    }
    if (r->p.logprobs) cJSON_AddItemToObject(c, "logprobs", logprobs_json(chat, lps, n_lp));
    else cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", finish);
    cJSON_AddItemToObject(o, "usage", usage_json(n_prompt, n_gen));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* ---- metrics ----------------------------------------------------------- */

void srv_metrics_count(srv_metrics *mt, srv_endpoint ep, int status) {
    pthread_mutex_lock(&mt->mu);
    int i = 0;
    while (i < mt->n_req && !(mt->req[i].ep == (int)ep && mt->req[i].status == status)) i++;
    if (i == mt->n_req && mt->n_req < SRV_METRIC_STATUSES) {
        mt->req[i].ep = (int)ep;
        mt->req[i].status = status;
        mt->req[i].n = 0;
        mt->n_req++;
    }
    if (i < mt->n_req) mt->req[i].n++;
    pthread_mutex_unlock(&mt->mu);
}

/* Prometheus text exposition format 0.0.4. */
char *srv_metrics_text(srv_metrics *mt) {
    size_t cap = 8192, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
#define OUT(...) \
    do { \
        int k_ = snprintf(s + n, cap - n, __VA_ARGS__); \
        if (k_ > 0) n += (size_t)k_ < cap - n ? (size_t)k_ : cap - n - 1; \
    } while (0)
    pthread_mutex_lock(&mt->mu);
    OUT("# HELP spectra_requests_total HTTP requests answered, by endpoint and status.\n"
        "# TYPE spectra_requests_total counter\n");
    for (int i = 0; i < mt->n_req; i++)
        OUT("spectra_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", srv_endpoint_path(mt->req[i].ep),
            mt->req[i].status, (unsigned long long)mt->req[i].n);
    OUT("# HELP spectra_prompt_tokens_total Prompt tokens evaluated.\n# TYPE spectra_prompt_tokens_total counter\n"
        "spectra_prompt_tokens_total %llu\n", (unsigned long long)mt->prompt_tokens);
    OUT("# HELP spectra_generated_tokens_total Tokens generated.\n# TYPE spectra_generated_tokens_total counter\n"
        "spectra_generated_tokens_total %llu\n", (unsigned long long)mt->gen_tokens);
    OUT("# HELP spectra_requests_cancelled_total Requests whose client went away before the end.\n"
        "# TYPE spectra_requests_cancelled_total counter\nspectra_requests_cancelled_total %llu\n",
        (unsigned long long)mt->cancelled);
    OUT("# HELP spectra_decode_steps_total Batched decode steps (spx_batch_step calls).\n"
        "# TYPE spectra_decode_steps_total counter\nspectra_decode_steps_total %llu\n", (unsigned long long)mt->steps);
    OUT("# HELP spectra_prefill_seconds_total Seconds spent evaluating prompts.\n"
        "# TYPE spectra_prefill_seconds_total counter\nspectra_prefill_seconds_total %.6f\n", mt->prefill_s);
    OUT("# HELP spectra_decode_seconds_total Seconds spent in decode steps.\n"
        "# TYPE spectra_decode_seconds_total counter\nspectra_decode_seconds_total %.6f\n", mt->decode_s);
    OUT("# HELP spectra_tokens_per_second Generated tokens per second of work (prefill + decode), last window of >= 1 s of it.\n"
        "# TYPE spectra_tokens_per_second gauge\nspectra_tokens_per_second %.3f\n", mt->tps);
    OUT("# HELP spectra_queue_depth Requests waiting for a session.\n# TYPE spectra_queue_depth gauge\n"
        "spectra_queue_depth %lld\n", (long long)mt->queue_depth);
    OUT("# HELP spectra_active_sessions Sessions running a request.\n# TYPE spectra_active_sessions gauge\n"
        "spectra_active_sessions %lld\n", (long long)mt->active);
    OUT("# HELP spectra_sessions Sessions (--parallel).\n# TYPE spectra_sessions gauge\nspectra_sessions %lld\n",
        (long long)mt->parallel);
    OUT("# HELP spectra_uptime_seconds Seconds since the server started.\n# TYPE spectra_uptime_seconds gauge\n"
        "spectra_uptime_seconds %.3f\n", spx_now() - mt->start);
    pthread_mutex_unlock(&mt->mu);
#undef OUT
    return s;
}
