/* serve_http.c: `spectra serve`'s HTTP side on libmicrohttpd, in
 * thread-per-connection mode: every connection has its own thread, which
 * may block (on its request's condition variable) while the scheduler
 * works (serve.h). Routing, the API key, the body limit, the GET endpoints,
 * and the answers of the generation endpoints: a whole JSON body, or a
 * stream of server-sent events through MHD_create_response_from_callback.
 * A client that goes away (its socket reports a hang-up while we wait, or
 * a write fails and libmicrohttpd frees the response) cancels its request. */
#include "serve.h"
#include "core/util.h"

#include <microhttpd.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct srv_http {
    struct MHD_Daemon *d;
    srv_sched *s;
    srv_metrics *mt;
    srv_http_opts o;
    atomic_ullong seq; /* request ids */
    atomic_int inflight; /* POST requests from their first call to libmicrohttpd's completion notice */
};

/* One request on a connection (libmicrohttpd's con_cls). */
typedef struct conn {
    srv_endpoint ep;
    int too_big;           /* the body passed --max-body: 413 once read */
    char *body;
    size_t len, cap;
    srv_req *req;          /* a non-streamed request, until the connection is done with it */
} conn;

/* A streamed answer (the response callback's cls). */
typedef struct stream {
    srv_req *r;
    srv_sched *s;
    MHD_socket fd;
} stream;

static int client_gone(MHD_socket fd) {
    if (fd == MHD_INVALID_SOCKET) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static MHD_socket conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : MHD_INVALID_SOCKET;
}

static void cancel(srv_req *r, srv_sched *s) {
    if (!atomic_exchange(&r->cancelled, 1)) srv_sched_wake(s);
}

/* Waits (r->mu held) up to 100 ms for a change. */
static void wait_a_bit(srv_req *r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

/* Waits until r's state is at least `until`; a client that goes away
 * meanwhile cancels it (then this waits for the scheduler to end it).
 * Returns 0 when the client went away. */
static int wait_state(srv_req *r, srv_state until, MHD_socket fd, srv_sched *s) {
    int alive = 1;
    pthread_mutex_lock(&r->mu);
    while (r->state < until) {
        wait_a_bit(r);
        if (alive && r->state < until && client_gone(fd)) {
            alive = 0;
            pthread_mutex_unlock(&r->mu);
            cancel(r, s);
            pthread_mutex_lock(&r->mu);
            until = SRV_DONE;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return alive;
}

static enum MHD_Result reply(struct MHD_Connection *c, srv_http *h, srv_endpoint ep, int status, const char *ctype,
                             char *body, const char *allow) {
    if (!body) body = spx_strdup("");
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    srv_metrics_count(h->mt, ep, status);
    return ret;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, srv_http *h, srv_endpoint ep, int status, const char *msg,
                                   const char *param, const char *allow) {
    return reply(c, h, ep, status, "application/json", srv_error_json(status, msg, param, NULL), allow);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *st = cls;
    srv_req *r = st->r;
    pthread_mutex_lock(&r->mu);
    while (r->out_off == r->out_len && r->state != SRV_DONE) {
        wait_a_bit(r);
        if (r->out_off == r->out_len && r->state != SRV_DONE && client_gone(st->fd)) {
            pthread_mutex_unlock(&r->mu);
            cancel(r, st->s);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = r->out_len - r->out_off;
    if (n == 0) {
        pthread_mutex_unlock(&r->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (n > max) n = max;
    memcpy(buf, r->out + r->out_off, n);
    r->out_off += n;
    if (r->out_off == r->out_len) r->out_off = r->out_len = 0; /* sent: reuse the buffer */
    pthread_mutex_unlock(&r->mu);
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *st = cls;
    pthread_mutex_lock(&st->r->mu);
    int done = st->r->state == SRV_DONE;
    pthread_mutex_unlock(&st->r->mu);
    if (!done) cancel(st->r, st->s); /* the client went away mid-stream */
    srv_req_release(st->r);
    free(st);
}

static srv_endpoint route(const char *url, const char **method_ok) {
    static const struct { const char *path, *method; srv_endpoint ep; } routes[] = {
        {"/v1/chat/completions", "POST", SRV_EP_CHAT},
        {"/v1/completions", "POST", SRV_EP_COMPLETIONS},
        {"/v1/models", "GET", SRV_EP_MODELS},
        {"/health", "GET", SRV_EP_HEALTH},
        {"/metrics", "GET", SRV_EP_METRICS},
    };
    size_t n = strcspn(url, "?");
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (strlen(routes[i].path) == n && !strncmp(url, routes[i].path, n)) {
            *method_ok = routes[i].method;
            return routes[i].ep;
        }
    return SRV_EP_OTHER;
}

static int auth_ok(struct MHD_Connection *c, const char *key) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!v || strncmp(v, "Bearer ", 7)) return 0;
    v += 7;
    size_t a = strlen(v), b = strlen(key);
    unsigned diff = a != b;
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)v[i] ^ (unsigned char)key[i];
    return diff == 0;
}

static enum MHD_Result get_endpoint(struct MHD_Connection *c, srv_http *h, srv_endpoint ep) {
    char *body;
    if (ep == SRV_EP_HEALTH) return reply(c, h, ep, 200, "application/json", spx_strdup("{\"status\":\"ok\"}"), NULL);
    if (ep == SRV_EP_METRICS)
        return reply(c, h, ep, 200, "text/plain; version=0.0.4; charset=utf-8", srv_metrics_text(h->mt), NULL);
    size_t cap = strlen(h->o.model_name) * 6 + 200;
    body = malloc(cap);
    if (!body) return MHD_NO;
    /* the name is the model file's: escape what JSON needs */
    size_t n = (size_t)snprintf(body, cap, "{\"object\":\"list\",\"data\":[{\"id\":\"");
    for (const unsigned char *p = (const unsigned char *)h->o.model_name; *p; p++)
        n += (size_t)(*p == '"' || *p == '\\' ? snprintf(body + n, cap - n, "\\%c", *p)
                      : *p < 0x20          ? snprintf(body + n, cap - n, "\\u%04x", *p)
                                           : snprintf(body + n, cap - n, "%c", *p));
    snprintf(body + n, cap - n, "\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"spectra\"}]}",
             (long long)h->mt->start_unix);
    return reply(c, h, ep, 200, "application/json", body, NULL);
}

/* The generation endpoints once the body is in. */
static enum MHD_Result generate(struct MHD_Connection *c, srv_http *h, conn *cn) {
    srv_error err;
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return reply_error(c, h, cn->ep, 500, "out of memory", NULL, NULL);
    if (!srv_parse_request(cn->body ? cn->body : "", cn->len, cn->ep == SRV_EP_CHAT, h->o.model_name, &r->p, &err)) {
        free(r);
        return reply_error(c, h, cn->ep, err.status, err.msg, err.param, NULL);
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->status = 200;
    r->created = (int64_t)time(NULL);
    snprintf(r->id, sizeof r->id, "%s-%llx%06llx", r->p.chat ? "chatcmpl" : "cmpl", (unsigned long long)r->created,
             (unsigned long long)(atomic_fetch_add(&h->seq, 1) & 0xffffff));
    const char *why = NULL;
    if (!srv_sched_submit(h->s, r, &why)) {
        srv_req_release(r);
        return reply_error(c, h, cn->ep, 503, why, NULL, NULL);
    }
    MHD_socket fd = conn_fd(c);
    /* accepted (200 follows) or refused (the error answer is in r->out) */
    if (!wait_state(r, SRV_ACCEPTED, fd, h->s)) {
        srv_req_release(r);
        return MHD_NO;
    }
    pthread_mutex_lock(&r->mu);
    int refused = r->state == SRV_DONE && r->status != 200;
    pthread_mutex_unlock(&r->mu);
    if (refused || !r->p.stream) {
        if (!refused && !wait_state(r, SRV_DONE, fd, h->s)) {
            srv_req_release(r);
            return MHD_NO;
        }
        pthread_mutex_lock(&r->mu);
        char *body = r->out ? r->out : spx_strdup("");
        int status = r->status;
        r->out = NULL;
        r->out_len = r->out_cap = r->out_off = 0;
        pthread_mutex_unlock(&r->mu);
        if (atomic_load(&r->cancelled) && status == 200) { /* shut down or cancelled with no answer */
            free(body);
            srv_req_release(r);
            return MHD_NO;
        }
        srv_req_release(r);
        return reply(c, h, cn->ep, status, "application/json", body, NULL);
    }
    stream *st = calloc(1, sizeof *st);
    struct MHD_Response *resp =
        st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free) : NULL;
    if (!resp) {
        free(st);
        cancel(r, h->s);
        srv_req_release(r);
        return MHD_NO;
    }
    st->r = r; /* the reference moves to the stream; stream_free drops it */
    st->s = h->s;
    st->fd = fd;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    srv_metrics_count(h->mt, cn->ep, 200);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    srv_http *h = cls;
    conn *cn = *con_cls;
    if (!cn) {
        const char *want = NULL;
        srv_endpoint ep = route(url, &want);
        if (ep == SRV_EP_OTHER) {
            char msg[512];
            snprintf(msg, sizeof msg, "unknown path '%.200s' (the endpoints: POST /v1/chat/completions, POST "
                     "/v1/completions, GET /v1/models, GET /health, GET /metrics)", url);
            return reply_error(c, h, ep, 404, msg, NULL, NULL);
        }
        if (strcmp(method, want)) {
            char msg[200];
            snprintf(msg, sizeof msg, "%s takes %s, not %.20s", srv_endpoint_path(ep), want, method);
            return reply_error(c, h, ep, 405, msg, NULL, want);
        }
        if (h->o.api_key && (ep == SRV_EP_CHAT || ep == SRV_EP_COMPLETIONS || ep == SRV_EP_MODELS) &&
            !auth_ok(c, h->o.api_key))
            return reply_error(c, h, ep, 401, "invalid or missing API key (Authorization: Bearer KEY)", NULL, NULL);
        if (!strcmp(method, "GET")) return get_endpoint(c, h, ep);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > h->o.max_body) {
            char msg[200];
            snprintf(msg, sizeof msg, "the body of %.30s bytes is larger than the limit of %zu (--max-body)", cl,
                     h->o.max_body);
            return reply_error(c, h, ep, 413, msg, NULL, NULL);
        }
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        atomic_fetch_add(&h->inflight, 1);
        cn->ep = ep;
        *con_cls = cn;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (cn->too_big || cn->len + n > h->o.max_body) {
            cn->too_big = 1;
            return MHD_YES;
        }
        if (cn->len + n + 1 > cn->cap) {
            size_t cap = cn->cap ? cn->cap : 4096;
            while (cap < cn->len + n + 1) cap *= 2;
            char *t = realloc(cn->body, cap);
            if (!t) return MHD_NO;
            cn->body = t;
            cn->cap = cap;
        }
        memcpy(cn->body + cn->len, upload_data, n);
        cn->len += n;
        cn->body[cn->len] = 0;
        return MHD_YES;
    }
    if (cn->too_big) {
        char msg[200];
        snprintf(msg, sizeof msg, "the body is larger than the limit of %zu bytes (--max-body)", h->o.max_body);
        return reply_error(c, h, cn->ep, 413, msg, NULL, NULL);
    }
    return generate(c, h, cn);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    conn *cn = *con_cls;
    srv_http *h = cls;
    if (!cn) return;
    atomic_fetch_sub(&h->inflight, 1);
    free(cn->body);
    free(cn);
    *con_cls = NULL;
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    fputs("spectra: serve: ", stderr);
    vfprintf(stderr, fmt, ap);
}

srv_http *srv_http_start(const srv_http_opts *o, srv_sched *s, srv_metrics *mt) {
    srv_http *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->o = *o;
    h->s = s;
    h->mt = mt;
    atomic_init(&h->seq, 0);
    atomic_init(&h->inflight, 0);
    h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                                MHD_USE_ERROR_LOG,
                            0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, on_log, h,
                            MHD_OPTION_LISTEN_SOCKET, o->listen_fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->conn_limit, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)120, MHD_OPTION_END);
    if (!h->d) {
        free(h);
        return NULL;
    }
    return h;
}

void srv_http_stop(srv_http *h) {
    if (!h) return;
    /* the scheduler has ended every request: let the answers go out (at
     * most 10 s; a client that does not read is cut), then stop */
    for (int i = 0; i < 1000 && atomic_load(&h->inflight) > 0; i++) nanosleep(&(struct timespec){0, 10000000L}, NULL);
    MHD_stop_daemon(h->d);
    free(h);
}
