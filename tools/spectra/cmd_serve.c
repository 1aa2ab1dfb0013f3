/* cmd_serve.c: `spectra serve -m MODEL`: an OpenAI-compatible HTTP server
 * (docs/serve.md). Options, the model and the listening socket, then the
 * scheduler (serve_sched.c) and libmicrohttpd (serve_http.c) until SIGINT
 * or SIGTERM; then every request still running gets an error answer and
 * everything is freed. serve.h states the concurrency design. */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "engine/plan.h"
#include "engine/session.h"
#include "serve.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: spectra serve -m MODEL [options]\n"
            "  OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions,\n"
            "  GET /v1/models, GET /health, GET /metrics (docs/serve.md)\n"
            "  -m MODEL        Hugging Face folder or .trdc file (with a tokenizer)\n"
            "  --host H        address to listen on (default 127.0.0.1; 0.0.0.0: every IPv4 interface)\n"
            "  --port P        TCP port (int 0..65535; default 8080; 0: any free port, printed at start)\n"
            "  --parallel N    sessions decoding at once, batched in one forward pass (int 1..64; default 4)\n"
            "  --queue N       requests waiting for a session at most; more: 503 (int 1..100000; default 64)\n"
            "  --ctx N         context length of each session (int; default: min(model max, 4096), shrunk if\n"
            "                  it does not fit)\n"
            "  --threads N     worker threads (int, 1..1024; default: all CPUs)\n"
            "  --backend B     cpu, cuda or auto (default auto, as `spectra run`)\n"
            "  --api-key KEY   require `Authorization: Bearer KEY` on /v1/* (default: none)\n"
            "  --chat-template FILE  Jinja chat template for /v1/chat/completions (default: the model's,\n"
            "                  else ChatML)\n"
            "  --max-body BYTES  largest request body; larger: 413 (int 1024..1073741824; default 8388608)\n"
            "  -q, --quiet     no plan summary at start\n" CLI_MMAP_USAGE);
}

/* A socket bound to host:port and listening; prints the error and
 * returns -1. *bound: the port it got. */
static int listen_on(const char *host, int64_t port, int *bound, char *shown, size_t shown_cap) {
    char ps[16];
    snprintf(ps, sizeof ps, "%lld", (long long)port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc != 0) {
        cli_error("serve: --host %s: %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, err = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) { err = errno; continue; }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        cli_error("serve: cannot listen on %s:%lld: %s%s", host, (long long)port, strerror(err),
                  err == EADDRINUSE ? " (another program has that port: pick another with --port, or 0 for any)" : "");
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char addr[INET6_ADDRSTRLEN] = "?";
    *bound = (int)port;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            const struct sockaddr_in *a4 = (const struct sockaddr_in *)&ss;
            *bound = ntohs(a4->sin_port);
            inet_ntop(AF_INET, &a4->sin_addr, addr, sizeof addr);
            snprintf(shown, shown_cap, "%s", addr);
        } else if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)&ss;
            *bound = ntohs(a6->sin6_port);
            inet_ntop(AF_INET6, &a6->sin6_addr, addr, sizeof addr);
            snprintf(shown, shown_cap, "[%s]", addr);
        }
    }
    return fd;
}

static const char *base_name(const char *path, char *buf, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t i = n;
    while (i > 0 && path[i - 1] != '/') i--;
    snprintf(buf, cap, "%.*s", (int)(n - i), path + i);
    return buf;
}

int cmd_serve(int argc, char **argv) {
    const char *model = NULL, *host = "127.0.0.1", *api_key = NULL, *tmpl_path = NULL, *backend = NULL;
    int64_t port = 8080, parallel = 4, queue = 64, n_ctx = 0, threads = 0, max_body = 8 << 20;
    int quiet = 0, use_mmap = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--mmap")) use_mmap = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--api-key")) api_key = v;
        else if (!strcmp(a, "--chat-template")) tmpl_path = v;
        else if (!strcmp(a, "--port")) { if (!cli_int(a, v, 0, 65535, &port)) return 2; }
        else if (!strcmp(a, "--parallel")) { if (!cli_int(a, v, 1, 64, &parallel)) return 2; }
        else if (!strcmp(a, "--queue")) { if (!cli_int(a, v, 1, 100000, &queue)) return 2; }
        else if (!strcmp(a, "--ctx")) { if (!cli_int(a, v, 1, 1 << 24, &n_ctx)) return 2; }
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) { if (!cli_int(a, v, 1, 1024, &threads)) return 2; }
        else if (!strcmp(a, "--max-body")) { if (!cli_int(a, v, 1024, (int64_t)1 << 30, &max_body)) return 2; }
        else if (!strcmp(a, "--backend")) { if (!cli_backend(v)) return 2; backend = v; }
        else { cli_error("serve: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (!model) {
        cli_error("serve: no model given (-m MODEL)");
        usage(stderr);
        return 2;
    }
    if (api_key && !*api_key) { cli_error("serve: --api-key: empty key"); return 2; }

    /* SIGINT and SIGTERM wait for sigwait below: blocked before any thread
     * starts (the model's pool included), so every thread inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1, fd = -1;
    spx_template *tmpl = NULL;
    spx_model *m = NULL;
    srv_sched *sched = NULL;
    srv_http *http = NULL;
    srv_metrics mt;
    memset(&mt, 0, sizeof mt);
    pthread_mutex_init(&mt.mu, NULL);
    if (tmpl_path) {
        size_t len;
        char *src = cli_read_text(tmpl_path, &len), err[600] = "";
        if (!src) goto done;
        spx_status st = spx_template_parse(src, len, tmpl_path, &tmpl, err, sizeof err);
        free(src);
        if (st != SPX_OK) {
            cli_error("serve: --chat-template %s: %s", tmpl_path, err[0] ? err : spx_status_name(st));
            goto done;
        }
    }
    cli_plan_opts po = {.backend = backend, .threads = threads, .n_ctx = n_ctx, .quiet = quiet,
                        .mmap = use_mmap};
    spx_plan plan;
    if (!(m = cli_open_planned(model, &po, &plan))) goto done;
    if (!spx_model_has_tokenizer(m)) {
        cli_error("serve: %s has no tokenizer (the server takes text)", model);
        goto done;
    }
    int bound = 0;
    char shown[INET6_ADDRSTRLEN + 2] = "";
    snprintf(shown, sizeof shown, "%s", host);
    if ((fd = listen_on(host, port, &bound, shown, sizeof shown)) < 0) goto done;

    srv_sched_opts so = {.parallel = parallel, .queue = queue, .n_ctx = plan.n_ctx, .kv = plan.kv, .tmpl = tmpl};
    mt.parallel = parallel;
    mt.start = spx_now();
    mt.start_unix = (int64_t)time(NULL);
    if (!(sched = srv_sched_start(m, &so, &mt))) goto done;
    char name[256];
    srv_http_opts ho = {.listen_fd = fd, .api_key = api_key, .max_body = (size_t)max_body,
                        .model_name = base_name(model, name, sizeof name), .conn_limit = queue + parallel + 64};
    if (!(http = srv_http_start(&ho, sched, &mt))) {
        cli_error("serve: libmicrohttpd did not start on %s:%d", shown, bound);
        goto done;
    }
    fd = -1; /* the daemon's now: MHD_stop_daemon closes it */
    fprintf(stderr, "spectra: serving %s at http://%s:%d/v1 (%lld sessions of %lld tokens, %s, %d threads)\n", name,
            shown, bound, (long long)parallel, (long long)srv_sched_n_ctx(sched), spx_model_backend(m),
            spx_pool_size(m->pool));
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "spectra: serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
done:
    srv_sched_stop(sched);  /* every request ends (with an error answer if it was running) */
    srv_http_stop(http);    /* the connections send what they have and close */
    srv_sched_free(sched);  /* after the last connection thread: they reach the scheduler */
    if (fd >= 0) close(fd);
    spx_model_free(m);
    spx_template_free(tmpl);
    pthread_mutex_destroy(&mt.mu);
    return rc;
}
