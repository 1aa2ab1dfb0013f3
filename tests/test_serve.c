/* test_serve.c: `spectra serve` end to end (docs/serve.md). Compresses
 * docllama-58m once (kept beside the binary as tests/serve-doc.trdc),
 * starts the server on a free loopback port and drives it with the
 * system's curl, raw sockets, and the openai npm client (the scripts in tests/serve,
 * installed into .dev/node by `make setup`; missing is a failure). The
 * answers must equal `spectra run`'s greedy text for the same prompt and
 * token count, alone and with 8 clients at once; stop strings, logprobs,
 * seeds, the bad-input list, a client that goes away mid-stream, /metrics,
 * --api-key and a clean shutdown on SIGTERM (under LSan: no leaks). */
#define _POSIX_C_SOURCE 200809L
#include "testlib.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CTX 512 /* the server's and run's context */

static const char *bin(void) {
    const char *b = getenv("SPECTRA_BIN");
    return b && *b ? b : "build/spectra";
}

static char tmp[512], model[1024], url[256];

/* Runs a shell command; its exit status and stdout (malloc'd). */
static int sh(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 16, n = 0, k;
    char *buf = malloc(cap);
    while (p && (k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = p ? pclose(p) : -1;
    if (out) *out = buf;
    else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* `spectra run ... -q` greedy: its stdout less the final newline (malloc'd). */
static char *run_text(const char *args) {
    char cmd[4096], *out;
    snprintf(cmd, sizeof cmd, "%s run -m %s %s -q --threads 2 --ctx %d 2>/dev/null", bin(), model, args, CTX);
    int rc = sh(cmd, &out);
    CHECK(rc == 0, "`%s` exited %d", cmd, rc);
    size_t n = strlen(out);
    if (n && out[n - 1] == '\n') out[n - 1] = 0;
    return out;
}

/* One HTTP request through curl: the status and the body (malloc'd).
 * body NULL: no body; headers: extra curl arguments. */
static int http(const char *method, const char *base, const char *path, const char *body, const char *headers,
                char **resp) {
    char bodyf[600], outf[600], cmd[4096];
    snprintf(bodyf, sizeof bodyf, "%s/body.json", tmp);
    snprintf(outf, sizeof outf, "%s/resp.txt", tmp);
    if (body) tl_write(bodyf, body, strlen(body));
    snprintf(cmd, sizeof cmd, "curl -s -N --max-time 120 -o %s -w '%%{http_code}' -X %s %s %s%s%s '%s%s'", outf, method,
             headers ? headers : "", body ? "-H 'Content-Type: application/json' --data-binary @" : "",
             body ? bodyf : "", "", base, path);
    char *code;
    sh(cmd, &code);
    int status = atoi(code);
    free(code);
    size_t n;
    *resp = tl_read(outf, &n);
    if (!*resp) *resp = calloc(1, 1);
    return status;
}

static cJSON *json_of(const char *s) { return cJSON_Parse(s); }
static const cJSON *jget(const cJSON *o, const char *path) { /* "a.b.0.c" */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = (*tok >= '0' && *tok <= '9') ? cJSON_GetArrayItem(cur, atoi(tok)) : cJSON_GetObjectItemCaseSensitive(cur, tok);
    return cur;
}
static const char *jstr(const cJSON *o, const char *path) {
    const cJSON *v = jget(o, path);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
static double jnum(const cJSON *o, const char *path) {
    const cJSON *v = jget(o, path);
    return cJSON_IsNumber(v) ? v->valuedouble : -1e300;
}
static int streq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

/* A JSON string literal of s (malloc'd). */
static char *jquote(const char *s) {
    cJSON *j = cJSON_CreateString(s);
    char *q = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return q;
}

/* The text, finish reason and count of an SSE stream's chunks; checks the
 * framing (every event "data: ...\n\n", the last "[DONE]"). */
typedef struct sse_result {
    char text[16384];
    char finish[32];
    int chunks, done, usage_total, role_first, errors;
} sse_result;
static void parse_sse(const char *s, int chat, sse_result *r) {
    memset(r, 0, sizeof *r);
    r->usage_total = -1;
    const char *p = s;
    while (*p) {
        if (strncmp(p, "data: ", 6)) { CHECK(0, "SSE: a line that is not 'data: ': %.80s", p); return; }
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) { CHECK(0, "SSE: an event without its blank line: %.80s", p); return; }
        if (e - p == 6 && !strncmp(p, "[DONE]", 6)) {
            r->done = 1;
            CHECK(e[2] == 0, "SSE: bytes after [DONE]: %.80s", e + 2);
            return;
        }
        char *js = strndup(p, (size_t)(e - p));
        cJSON *j = json_of(js);
        CHECK(j != NULL, "SSE: a chunk that is not JSON: %s", js);
        if (j && jget(j, "error")) r->errors++;
        if (j && !jget(j, "error")) {
            CHECK(streq(jstr(j, "object"), chat ? "chat.completion.chunk" : "text_completion"), "chunk object: %s", js);
            const cJSON *ch = jget(j, "choices.0");
            if (ch) {
                const char *t = chat ? jstr(ch, "delta.content") : jstr(ch, "text");
                if (r->chunks == 0 && chat) r->role_first = streq(jstr(ch, "delta.role"), "assistant");
                if (t) strncat(r->text, t, sizeof r->text - strlen(r->text) - 1);
                if (jstr(ch, "finish_reason")) snprintf(r->finish, sizeof r->finish, "%s", jstr(ch, "finish_reason"));
            }
            if (cJSON_IsObject(jget(j, "usage"))) r->usage_total = (int)jnum(j, "usage.total_tokens");
            r->chunks++;
        }
        cJSON_Delete(j);
        free(js);
        p = e + 2;
    }
}

/* ---- the server process ------------------------------------------------- */

/* Starts `spectra serve ARGS` with stderr into log; waits for its URL line
 * and /health. Returns the pid (url filled), or -1. */
static pid_t serve_start(const char *args, const char *log, char *u, size_t ucap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s serve -m %s %s 2>%s >/dev/null", bin(), model, args, log);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    double t0 = now_s();
    while (now_s() - t0 < 120) {
        size_t n;
        struct stat stl;
        char *s = stat(log, &stl) == 0 ? tl_read(log, &n) : NULL;
        const char *at = s ? strstr(s, "http://") : NULL;
        if (at) {
            size_t k = strcspn(at, " \n");
            snprintf(u, ucap, "%.*s", (int)(k > 3 && !strncmp(at + k - 3, "/v1", 3) ? k - 3 : k), at);
            free(s);
            char *body;
            for (int i = 0; i < 100; i++) {
                int st = http("GET", u, "/health", NULL, NULL, &body);
                free(body);
                if (st == 200) return pid;
                sleep_ms(100);
            }
            CHECK(0, "%s: /health never answered 200", u);
            return pid;
        }
        free(s);
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            char *l = tl_read(log, &n);
            CHECK(0, "spectra serve %s exited before listening:\n%s", args, l ? l : "");
            free(l);
            return -1;
        }
        sleep_ms(50);
    }
    CHECK(0, "spectra serve %s printed no URL", args);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* SIGTERM, then the exit status (-1: killed after the timeout). */
static int serve_stop(pid_t pid, double timeout) {
    if (pid <= 0) return -1;
    kill(pid, SIGTERM);
    double t0 = now_s();
    int status;
    while (now_s() - t0 < timeout) {
        if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        sleep_ms(50);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static long metric(const char *text, const char *name) {
    const char *p = text;
    size_t n = strlen(name);
    while ((p = strstr(p, name))) {
        if ((p == text || p[-1] == '\n') && p[n] == ' ') return atol(p + n + 1);
        p += n;
    }
    return -1;
}

/* ---- the checks ---------------------------------------------------------- */

static void check_error(int status, const char *resp, int want, const char *param, const char *what) {
    cJSON *j = json_of(resp);
    CHECK(status == want, "%s: status %d, expected %d: %s", what, status, want, resp);
    CHECK(j && jstr(j, "error.message") && jstr(j, "error.type") && jget(j, "error.param") && jget(j, "error.code"),
          "%s: not an OpenAI error object: %s", what, resp);
    if (want == 400 || want == 413 || want == 405)
        CHECK(streq(jstr(j, "error.type"), "invalid_request_error"), "%s: error type: %s", what, resp);
    if (param) CHECK(streq(jstr(j, "error.param"), param), "%s: param, expected %s: %s", what, param, resp);
    cJSON_Delete(j);
}

/* A completion, whole and streamed, equals run's text. */
static void completion_equals_run(const char *prompt, int n, const char *want) {
    char body[16384], *resp;
    char *q = jquote(prompt);
    snprintf(body, sizeof body, "{\"model\": \"doc\", \"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0}", q, n);
    int st = http("POST", url, "/v1/completions", body, NULL, &resp);
    cJSON *j = json_of(resp);
    CHECK(st == 200 && j, "completion: %d %s", st, resp);
    CHECK(streq(jstr(j, "choices.0.text"), want), "completion of '%.40s':\n got  [%s]\n want [%s]", prompt,
          jstr(j, "choices.0.text"), want);
    CHECK(streq(jstr(j, "object"), "text_completion") && streq(jstr(j, "model"), "doc"), "completion head: %s", resp);
    CHECK(streq(jstr(j, "choices.0.finish_reason"), "length"), "finish_reason: %s", resp);
    CHECK(jnum(j, "usage.completion_tokens") == n && jnum(j, "usage.prompt_tokens") > 0 &&
              jnum(j, "usage.total_tokens") == jnum(j, "usage.prompt_tokens") + n,
          "usage: %s", resp);
    cJSON_Delete(j);
    free(resp);
    snprintf(body, sizeof body,
             "{\"prompt\": [%s], \"max_tokens\": %d, \"temperature\": 0, \"stream\": true, "
             "\"stream_options\": {\"include_usage\": true}}", q, n);
    st = http("POST", url, "/v1/completions", body, NULL, &resp);
    sse_result r;
    parse_sse(resp, 0, &r);
    CHECK(st == 200 && r.done && r.chunks > 1, "stream: %d, %d chunks, done %d", st, r.chunks, r.done);
    CHECK(!strcmp(r.text, want), "streamed completion of '%.40s':\n got  [%s]\n want [%s]", prompt, r.text, want);
    CHECK(!strcmp(r.finish, "length") && r.usage_total > n, "stream finish '%s', usage %d", r.finish, r.usage_total);
    free(resp);
    free(q);
}

static void stop_cases(const char *want) {
    /* want: run's greedy text, e.g. " supports multiple I/O drivers.\n\nThe PCI ...": the stop word is its
     * first word of 3+ letters past the first 40 % (which word depends on the kernels' rounding) */
    char word[32] = "";
    for (const char *p = want + strlen(want) * 2 / 5; *p && !word[0]; p++) {
        size_t n = 0;
        while (((p[n] | 32) >= 'a' && (p[n] | 32) <= 'z') && n < sizeof word - 1) n++;
        if (n >= 3 && p > want && !(((p[-1] | 32) >= 'a' && (p[-1] | 32) <= 'z'))) memcpy(word, p, n), word[n] = 0;
    }
    const char *cut = word[0] ? strstr(want, word) : NULL;
    CHECK(cut != NULL, "no stop word in the reference text: %s", want);
    if (!cut) return;
    char body[1024], *resp;
    snprintf(body, sizeof body,
             "{\"prompt\": \"The Linux kernel\", \"max_tokens\": 24, \"temperature\": 0, \"stop\": [\"zzz\", \"%s\"]}", word);
    int st = http("POST", url, "/v1/completions", body, NULL, &resp);
    cJSON *j = json_of(resp);
    const char *t = jstr(j, "choices.0.text");
    CHECK(st == 200 && t && strlen(t) == (size_t)(cut - want) && !strncmp(t, want, (size_t)(cut - want)) &&
              streq(jstr(j, "choices.0.finish_reason"), "stop"),
          "stop '%s': %s", word, resp);
    cJSON_Delete(j);
    free(resp);
    /* "I/O dr" straddles the tokens " I", "/", "O", " drivers": nothing of it may be streamed */
    const char *cut2 = strstr(want, "I/O dr");
    CHECK(cut2 != NULL, "reference: %s", want);
    if (!cut2) return;
    snprintf(body, sizeof body,
             "{\"prompt\": \"The Linux kernel\", \"max_tokens\": 24, \"temperature\": 0, \"stop\": \"I/O dr\", "
             "\"stream\": true}");
    st = http("POST", url, "/v1/completions", body, NULL, &resp);
    sse_result r;
    parse_sse(resp, 0, &r);
    CHECK(st == 200 && r.done && strlen(r.text) == (size_t)(cut2 - want) && !strncmp(r.text, want, (size_t)(cut2 - want)) &&
              !strcmp(r.finish, "stop"),
          "streamed stop 'I/O dr': [%s] finish %s", r.text, r.finish);
    CHECK(!strstr(resp, "\"I\"") && !strstr(resp, "\" I\""), "a part of the stop string was streamed:\n%s", resp);
    free(resp);
}

static void logprob_cases(void) {
    char *resp;
    int st = http("POST", url, "/v1/completions",
                  "{\"prompt\": \"The Linux kernel\", \"max_tokens\": 5, \"temperature\": 0, \"logprobs\": 3}", NULL,
                  &resp);
    cJSON *j = json_of(resp);
    const cJSON *lp = jget(j, "choices.0.logprobs");
    int ok = st == 200 && cJSON_GetArraySize(jget(lp, "tokens")) == 5 && cJSON_GetArraySize(jget(lp, "token_logprobs")) == 5 &&
             cJSON_GetArraySize(jget(lp, "top_logprobs")) == 5 && cJSON_GetArraySize(jget(lp, "text_offset")) == 5;
    CHECK(ok, "completion logprobs shape: %s", resp);
    for (int i = 0; ok && i < 5; i++) {
        double l = cJSON_GetArrayItem(jget(lp, "token_logprobs"), i)->valuedouble;
        const cJSON *top = cJSON_GetArrayItem(jget(lp, "top_logprobs"), i);
        double best = -1e300;
        const cJSON *e;
        cJSON_ArrayForEach(e, top) best = e->valuedouble > best ? e->valuedouble : best;
        /* greedy: the chosen token is the most likely one */
        CHECK(l <= 0 && cJSON_GetArraySize(top) >= 1 && cJSON_GetArraySize(top) <= 3 && l == best,
              "token %d: logprob %g, best of the top %g", i, l, best);
    }
    /* the tokens' texts make up the text */
    char joined[1024] = "";
    for (int i = 0; ok && i < 5; i++) strncat(joined, cJSON_GetArrayItem(jget(lp, "tokens"), i)->valuestring, 100);
    CHECK(streq(joined, jstr(j, "choices.0.text")), "tokens [%s] vs text [%s]", joined, jstr(j, "choices.0.text"));
    cJSON_Delete(j);
    free(resp);
    st = http("POST", url, "/v1/chat/completions",
              "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 4, \"temperature\": 0, "
              "\"logprobs\": true, \"top_logprobs\": 2}",
              NULL, &resp);
    j = json_of(resp);
    const cJSON *c = jget(j, "choices.0.logprobs.content");
    ok = st == 200 && cJSON_GetArraySize(c) == (int)jnum(j, "usage.completion_tokens") && cJSON_GetArraySize(c) > 0;
    CHECK(ok, "chat logprobs shape: %s", resp);
    for (int i = 0; ok && i < cJSON_GetArraySize(c); i++) {
        const cJSON *e = cJSON_GetArrayItem(c, i);
        CHECK(jstr(e, "token") && jnum(e, "logprob") <= 0 && cJSON_IsArray(jget(e, "bytes")) &&
                  cJSON_GetArraySize(jget(e, "top_logprobs")) == 2 && jnum(e, "top_logprobs.0.logprob") >= jnum(e, "top_logprobs.1.logprob"),
              "chat logprob entry %d: %s", i, resp);
    }
    cJSON_Delete(j);
    free(resp);
    st = http("POST", url, "/v1/chat/completions",
              "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"top_logprobs\": 21, \"logprobs\": true}", NULL,
              &resp);
    check_error(st, resp, 400, "top_logprobs", "top_logprobs 21");
    free(resp);
}

static void seed_cases(void) {
    char *a, *b;
    const char *body = "{\"prompt\": \"The Linux kernel\", \"max_tokens\": 16, \"temperature\": 1, \"seed\": 7}";
    int s1 = http("POST", url, "/v1/completions", body, NULL, &a);
    int s2 = http("POST", url, "/v1/completions", body, NULL, &b);
    cJSON *ja = json_of(a), *jb = json_of(b);
    char *want = run_text("-p 'The Linux kernel' -n 16 --temp 1 --seed 7 --top-k 0 --top-p 1");
    CHECK(s1 == 200 && s2 == 200 && streq(jstr(ja, "choices.0.text"), jstr(jb, "choices.0.text")),
          "seed 7 twice: %s / %s", a, b);
    CHECK(streq(jstr(ja, "choices.0.text"), want), "seed 7 vs run --seed 7: [%s] [%s]", jstr(ja, "choices.0.text"), want);
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    free(a);
    free(b);
    free(want);
}

static void bad_inputs(void) {
    char *resp;
    int st;
    st = http("POST", url, "/v1/completions", "{\"prompt\": \"x\",", NULL, &resp);
    check_error(st, resp, 400, NULL, "malformed JSON"); free(resp);
    st = http("POST", url, "/v1/completions", "[1, 2]", NULL, &resp);
    check_error(st, resp, 400, NULL, "not an object"); free(resp);
    st = http("POST", url, "/v1/completions", "{\"prompt\": \"x\", \"temperature\": \"hot\"}", NULL, &resp);
    check_error(st, resp, 400, "temperature", "temperature a string"); free(resp);
    st = http("POST", url, "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 2.5}", NULL, &resp);
    check_error(st, resp, 400, "max_tokens", "max_tokens 2.5"); free(resp);
    st = http("POST", url, "/v1/completions", "{\"prompt\": 7}", NULL, &resp);
    check_error(st, resp, 400, "prompt", "prompt a number"); free(resp);
    st = http("POST", url, "/v1/completions", "{\"max_tokens\": 3}", NULL, &resp);
    check_error(st, resp, 400, "prompt", "no prompt"); free(resp);
    st = http("POST", url, "/v1/completions", "{\"prompt\": \"x\", \"frobnicate\": true}", NULL, &resp);
    check_error(st, resp, 400, "frobnicate", "unknown field"); free(resp);
    st = http("POST", url, "/v1/completions", "{\"prompt\": \"x\", \"n\": 2}", NULL, &resp);
    check_error(st, resp, 400, "n", "n 2"); free(resp);
    st = http("POST", url, "/v1/completions", "{\"prompt\": \"x\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", NULL, &resp);
    check_error(st, resp, 400, "stop", "5 stop strings"); free(resp);
    st = http("POST", url, "/v1/completions", "{\"prompt\": \"x\", \"stream_options\": {\"x\": 1}}", NULL, &resp);
    check_error(st, resp, 400, "stream_options", "stream_options.x"); free(resp);
    st = http("POST", url, "/v1/chat/completions", "{\"messages\": []}", NULL, &resp);
    check_error(st, resp, 400, "messages", "empty messages"); free(resp);
    st = http("POST", url, "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": 3}]}", NULL, &resp);
    check_error(st, resp, 400, "messages[0].content", "content a number"); free(resp);
    st = http("POST", url, "/v1/chat/completions", "{\"prompt\": \"x\"}", NULL, &resp);
    check_error(st, resp, 400, "prompt", "chat with a prompt"); free(resp);
    /* larger than --max-body 65536 */
    size_t big = 70000;
    char *b = malloc(big + 64);
    memset(b, 'a', big + 64);
    memcpy(b, "{\"prompt\": \"", 12);
    memcpy(b + big, "\"}", 3);
    st = http("POST", url, "/v1/completions", b, NULL, &resp);
    check_error(st, resp, 413, NULL, "body over --max-body"); free(resp);
    free(b);
    /* a prompt longer than the context */
    size_t n;
    char *ev = tl_read(tl_shared("models/docllama-58m/eval.txt"), &n);
    if (ev && n > 6000) {
        ev[6000] = 0;
        char *q = jquote(ev);
        char *body = malloc(strlen(q) + 64);
        sprintf(body, "{\"prompt\": %s}", q);
        st = http("POST", url, "/v1/completions", body, NULL, &resp);
        check_error(st, resp, 400, "prompt", "prompt over the context");
        CHECK(strstr(resp, "context_length_exceeded") && strstr(resp, "maximum context length is 512"), "%s", resp);
        free(resp);
        free(body);
        free(q);
    }
    free(ev);
    st = http("GET", url, "/v1/nope", NULL, NULL, &resp);
    check_error(st, resp, 404, NULL, "unknown path"); free(resp);
    st = http("GET", url, "/v1/completions", NULL, NULL, &resp);
    check_error(st, resp, 405, NULL, "GET /v1/completions"); free(resp);
    st = http("DELETE", url, "/health", NULL, NULL, &resp);
    check_error(st, resp, 405, NULL, "DELETE /health"); free(resp);
    /* and it keeps serving */
    st = http("POST", url, "/v1/completions", "{\"prompt\": \"Hello\", \"max_tokens\": 2, \"temperature\": 0}", NULL, &resp);
    CHECK(st == 200 && strstr(resp, "\"completion_tokens\":2"), "after the bad inputs: %d %s", st, resp);
    free(resp);
}

/* A raw client that reads two events of a long stream and hangs up. */
static void disconnect_case(void) {
    int port = 0;
    const char *c = strrchr(url, ':');
    if (c) port = atoi(c + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s", strerror(errno));
    const char *body = "{\"prompt\": \"The Linux kernel\", \"max_tokens\": 400, \"temperature\": 0, \"stream\": true}";
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
    CHECK(write(fd, req, (size_t)n) == n, "write");
    char buf[8192];
    size_t got = 0;
    int events = 0;
    double t0 = now_s();
    while (events < 2 && now_s() - t0 < 60) {
        ssize_t k = read(fd, buf + got, sizeof buf - 1 - got);
        if (k <= 0) break;
        got += (size_t)k;
        buf[got] = 0;
        events = 0;
        for (const char *p = buf; (p = strstr(p, "data: ")); p += 6) events++;
        if (got > sizeof buf - 100) got = 0;
    }
    CHECK(events >= 2, "the stream sent %d events", events);
    close(fd);
    /* the scheduler frees the session: no session active, one cancelled */
    char *m = NULL;
    long cancelled = -1, active = -1;
    t0 = now_s();
    while (now_s() - t0 < 30) {
        free(m);
        http("GET", url, "/metrics", NULL, NULL, &m);
        cancelled = metric(m, "spectra_requests_cancelled_total");
        active = metric(m, "spectra_active_sessions");
        if (cancelled >= 1 && active == 0) break;
        sleep_ms(100);
    }
    CHECK(cancelled >= 1 && active == 0, "after the hang-up: cancelled %ld, active %ld", cancelled, active);
    long gen = metric(m, "spectra_generated_tokens_total");
    free(m);
    char *resp;
    int st = http("POST", url, "/v1/completions", "{\"prompt\": \"Hello\", \"max_tokens\": 3, \"temperature\": 0}", NULL, &resp);
    CHECK(st == 200 && strstr(resp, "\"completion_tokens\":3"), "after the hang-up: %d %s", st, resp);
    free(resp);
    /* the cancelled stream stopped well before its 400 tokens */
    CHECK(gen >= 0 && gen < 2000, "generated tokens so far: %ld", gen);
}

static void metrics_case(void) {
    char *m;
    int st = http("GET", url, "/metrics", NULL, NULL, &m);
    CHECK(st == 200, "/metrics: %d", st);
    const char *names[] = {"spectra_requests_total{endpoint=\"/v1/completions\",status=\"200\"}",
                           "spectra_requests_total{endpoint=\"/v1/completions\",status=\"400\"}",
                           "spectra_requests_total{endpoint=\"/v1/completions\",status=\"413\"}",
                           "spectra_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}",
                           "spectra_requests_total{endpoint=\"other\",status=\"404\"}",
                           "spectra_requests_total{endpoint=\"/v1/completions\",status=\"405\"}",
                           "spectra_prompt_tokens_total",
                           "spectra_generated_tokens_total",
                           "spectra_queue_depth",
                           "spectra_active_sessions",
                           "spectra_decode_seconds_total",
                           "spectra_tokens_per_second",
                           "# TYPE spectra_requests_total counter"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        CHECK(strstr(m, names[i]) != NULL, "/metrics lacks %s:\n%s", names[i], m);
    CHECK(metric(m, "spectra_generated_tokens_total") > 50 && metric(m, "spectra_prompt_tokens_total") > 50 &&
              metric(m, "spectra_queue_depth") == 0,
          "/metrics values:\n%s", m);
    free(m);
}

static int have_node(char *dir, size_t cap) {
    const char *d = getenv("SPECTRA_NODE_DIR");
    snprintf(dir, cap, "%s", d && *d ? d : ".dev/node");
    char p[1200];
    snprintf(p, sizeof p, "%s/node_modules/openai/package.json", dir);
    struct stat st;
    CHECK(stat(p, &st) == 0, "the openai npm client is not installed (%s): run make setup", p);
    CHECK(sh("command -v node >/dev/null 2>&1", NULL) == 0, "node is not installed: run make setup");
    return stat(p, &st) == 0;
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", tl_tmpdir());
    CHECK(sh("command -v curl >/dev/null 2>&1", NULL) == 0, "curl is not installed: run make setup");
    /* the model, compressed once per build */
    const char *b = bin();
    const char *slash = strrchr(b, '/');
    snprintf(model, sizeof model, "%.*s/tests/serve-doc.trdc", slash ? (int)(slash - b) : 1, slash ? b : ".");
    struct stat stt;
    if (stat(model, &stt) != 0) {
        char cmd[6000], part[1100];
        snprintf(part, sizeof part, "%s.part.trdc", model);
        snprintf(cmd, sizeof cmd, "%s compress -m %s -o %s -q --threads 2 >/dev/null 2>&1 && mv %s %s", b,
                 tl_shared("models/docllama-58m"), part, part, model);
        CHECK(sh(cmd, NULL) == 0, "%s", cmd);
    }
    char *help;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s serve --help", b);
    CHECK(sh(cmd, &help) == 0 && strstr(help, "--parallel N") && strstr(help, "--api-key KEY"), "serve --help:\n%s", help);
    free(help);
    snprintf(cmd, sizeof cmd, "%s serve -m %s --bogus 2>&1", b, model);
    CHECK(sh(cmd, NULL) == 2, "serve --bogus: exit 2");
    snprintf(cmd, sizeof cmd, "%s serve -m %s/none.trdc --port 0 2>&1", b, tmp);
    char *o;
    CHECK(sh(cmd, &o) == 1 && strstr(o, "none.trdc"), "serve with a missing model: %s", o);
    free(o);

    /* the chat template and the prompt it renders */
    char tpl[700], log[700];
    snprintf(tpl, sizeof tpl, "%s/chat.jinja", tmp);
    const char *tsrc = "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
                       "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    tl_write(tpl, tsrc, strlen(tsrc));
    const char *messages = "[{\"role\": \"system\", \"content\": \"You are terse.\"}, "
                           "{\"role\": \"user\", \"content\": \"What does the scheduler do?\"}]";
    const char *rendered = "system: You are terse.\nuser: What does the scheduler do?\nassistant:";
    char rfile[700];
    snprintf(rfile, sizeof rfile, "%s/rendered.txt", tmp);
    tl_write(rfile, rendered, strlen(rendered));

    snprintf(log, sizeof log, "%s/serve.log", tmp);
    char args[2000];
    snprintf(args, sizeof args, "--port 0 --parallel 4 --threads 2 --ctx %d -q --max-body 65536 --chat-template %s", CTX,
             tpl);
    double t0 = now_s();
    pid_t pid = serve_start(args, log, url, sizeof url);
    if (pid < 0) return tl_finish("test_serve");
    fprintf(stderr, "server at %s (%.1f s)\n", url, now_s() - t0);

    /* completions: equal to run, whole and streamed; a prompt of more than one prefill piece */
    char *want1 = run_text("-p 'The Linux kernel' -n 24 --temp 0");
    completion_equals_run("The Linux kernel", 24, want1);
    size_t n;
    char *ev = tl_read(tl_shared("models/docllama-58m/eval.txt"), &n);
    if (ev && n > 520) { /* about 170 tokens: two prefill pieces */
        ev[520] = 0;
        char pf[700], a[1000];
        snprintf(pf, sizeof pf, "%s/long.txt", tmp);
        tl_write(pf, ev, strlen(ev));
        snprintf(a, sizeof a, "-f %s -n 12 --temp 0", pf);
        char *want2 = run_text(a);
        completion_equals_run(ev, 12, want2);
        free(want2);
    }
    free(ev);
    fprintf(stderr, "completions done (%.1f s)\n", now_s() - t0);

    /* chat: the rendered prompt through run */
    char a[1000], *resp;
    snprintf(a, sizeof a, "-f %s -n 16 --temp 0", rfile);
    char *want_chat = run_text(a), body[4096];
    snprintf(body, sizeof body, "{\"messages\": %s, \"max_tokens\": 16, \"temperature\": 0}", messages);
    int st = http("POST", url, "/v1/chat/completions", body, NULL, &resp);
    cJSON *j = json_of(resp);
    CHECK(st == 200 && streq(jstr(j, "choices.0.message.content"), want_chat) &&
              streq(jstr(j, "choices.0.message.role"), "assistant") && streq(jstr(j, "object"), "chat.completion"),
          "chat: %d %s\n want [%s]", st, resp, want_chat);
    cJSON_Delete(j);
    free(resp);
    snprintf(body, sizeof body, "{\"messages\": %s, \"max_tokens\": 16, \"temperature\": 0, \"stream\": true}", messages);
    st = http("POST", url, "/v1/chat/completions", body, NULL, &resp);
    sse_result r;
    parse_sse(resp, 1, &r);
    CHECK(st == 200 && r.done && r.role_first && !strcmp(r.text, want_chat) && !strcmp(r.finish, "length") &&
              r.usage_total == -1,
          "streamed chat: [%s] finish %s role %d\n want [%s]", r.text, r.finish, r.role_first, want_chat);
    free(resp);

    stop_cases(want1);
    logprob_cases();
    seed_cases();
    fprintf(stderr, "chat, stop, logprobs, seed done (%.1f s)\n", now_s() - t0);

    /* the openai client: the same answers; 8 clients at once */
    char nd[1024];
    if (have_node(nd, sizeof nd)) {
        char *q = jquote(messages);
        char *out;
        snprintf(cmd, sizeof cmd, "SPECTRA_NODE_DIR=%s node tests/serve/basic.mjs %s/v1 none 'The Linux kernel' 24 '%s'",
                 nd, url, messages);
        int rc = sh(cmd, &out);
        j = json_of(out);
        CHECK(rc == 0 && j, "basic.mjs: %d %s", rc, out);
        char want16[4096];
        snprintf(want16, sizeof want16, "%s", want_chat);
        CHECK(streq(jstr(j, "completion"), want1) && streq(jstr(j, "completion_stream"), want1) &&
                  streq(jstr(j, "completion_finish"), "length") && streq(jstr(j, "completion_stream_finish"), "length") &&
                  jnum(j, "completion_stream_usage.completion_tokens") == 24,
              "openai completions: %s", out);
        CHECK(jstr(j, "chat") && jstr(j, "chat_stream") && streq(jstr(j, "chat"), jstr(j, "chat_stream")) &&
                  !strncmp(jstr(j, "chat"), want_chat, strlen(want_chat)) && streq(jstr(j, "chat_role"), "assistant") &&
                  streq(jstr(j, "chat_stream_role"), "assistant"),
              "openai chat (24 tokens, run's 16 a prefix): %s\n want [%s]", out, want_chat);
        CHECK(streq(jstr(j, "models.0"), "serve-doc.trdc") && jnum(j, "n2.status") == 400, "openai models/n2: %s", out);
        cJSON_Delete(j);
        free(out);
        free(q);
        /* the sanitizer pass (SPECTRA_TEST_QUICK): 8 tokens each */
        const int nc = getenv("SPECTRA_TEST_QUICK") ? 8 : 16;
        snprintf(cmd, sizeof cmd, "SPECTRA_NODE_DIR=%s node tests/serve/concurrent.mjs %s/v1 none 8 %d", nd, url, nc);
        rc = sh(cmd, &out);
        j = json_of(out);
        CHECK(rc == 0 && j && jnum(j, "clients") == 8 && jnum(j, "distinct") == 8 &&
                  cJSON_GetArraySize(jget(j, "mismatches")) == 0,
              "8 concurrent clients: %d %s", rc, out);
        /* the solo answers are run's */
        char wa[100];
        snprintf(wa, sizeof wa, "-p 'The scheduler' -n %d --temp 0", nc);
        char *w = run_text(wa);
        CHECK(streq(jstr(j, "solo.2"), w), "'The scheduler': [%s] vs run [%s]", jstr(j, "solo.2"), w);
        free(w);
        cJSON_Delete(j);
        free(out);
    }
    fprintf(stderr, "openai client done (%.1f s)\n", now_s() - t0);

    bad_inputs();
    disconnect_case();
    metrics_case();
    fprintf(stderr, "bad inputs, disconnect, metrics done (%.1f s)\n", now_s() - t0);

    /* another server on the same port: a clear error */
    char *pc = strrchr(url, ':');
    snprintf(cmd, sizeof cmd, "%s serve -m %s --port %s -q 2>&1", b, model, pc ? pc + 1 : "1");
    CHECK(sh(cmd, &o) == 1 && strstr(o, "in use"), "a second server on the port: %s", o);
    free(o);

    /* SIGTERM with a stream running: it ends with an error event and [DONE]; exit 0 */
    char sf[700];
    snprintf(sf, sizeof sf, "%s/long_stream.txt", tmp);
    snprintf(cmd, sizeof cmd, "curl -s -N --max-time 120 -o %s -H 'Content-Type: application/json' -d '{\"prompt\": "
             "\"The Linux kernel\", \"max_tokens\": 400, \"temperature\": 0, \"stream\": true}' %s/v1/completions "
             "</dev/null >/dev/null 2>&1 &",
             sf, url);
    sh(cmd, NULL);
    double ts = now_s();
    while (now_s() - ts < 30) {
        struct stat sts;
        char *s = stat(sf, &sts) == 0 ? tl_read(sf, &n) : NULL;
        int started = s && strstr(s, "data: ") != NULL;
        free(s);
        if (started) break;
        sleep_ms(50);
    }
    int rc = serve_stop(pid, 60);
    CHECK(rc == 0, "serve after SIGTERM: exit %d; log:\n%s", rc, tl_read(log, &n));
    sleep_ms(300);
    char *s = tl_read(sf, &n);
    CHECK(s && strstr(s, "shutting down") && strstr(s, "data: [DONE]"), "the stream cut by SIGTERM:\n%.2000s", s ? s : "");
    free(s);

    /* --api-key */
    char url2[256];
    snprintf(log, sizeof log, "%s/serve2.log", tmp);
    pid = serve_start("--port 0 --parallel 1 --threads 2 --ctx 256 -q --api-key sekret", log, url2, sizeof url2);
    if (pid > 0) {
        st = http("GET", url2, "/v1/models", NULL, NULL, &resp);
        check_error(st, resp, 401, NULL, "no key"); free(resp);
        st = http("GET", url2, "/v1/models", NULL, "-H 'Authorization: Bearer wrong'", &resp);
        check_error(st, resp, 401, NULL, "a wrong key"); free(resp);
        st = http("POST", url2, "/v1/completions", "{\"prompt\": \"Hi\", \"max_tokens\": 2}", NULL, &resp);
        check_error(st, resp, 401, NULL, "completion without the key"); free(resp);
        st = http("POST", url2, "/v1/completions", "{\"prompt\": \"Hi\", \"max_tokens\": 2}",
                  "-H 'Authorization: Bearer sekret'", &resp);
        CHECK(st == 200 && strstr(resp, "text_completion"), "with the key: %d %s", st, resp); free(resp);
        st = http("GET", url2, "/health", NULL, NULL, &resp);
        CHECK(st == 200, "/health needs no key: %d", st); free(resp);
        rc = serve_stop(pid, 60);
        CHECK(rc == 0, "the second server's exit: %d\n%s", rc, tl_read(log, &n));
    }
    fprintf(stderr, "all done (%.1f s)\n", now_s() - t0);
    free(want1);
    free(want_chat);
    return tl_finish("test_serve");
}
