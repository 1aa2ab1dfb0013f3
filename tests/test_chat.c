/* test_chat.c: the chat side of the model and the CLI, on docllama-58m
 * (a base model without a chat template, given one here):
 *   - spx_model_chat_template and the BOS/EOS texts: none in the fixture;
 *     a folder whose tokenizer_config.json has one; chat_template.jinja
 *     beside it (which wins); a .trdc compressed from that folder (the
 *     .jinja travels inside);
 *   - spx_chat_render with the model's template, with another, and with
 *     the built-in ChatML when the model has none;
 *   - `spectra chat` fed from a pipe, greedy: each reply equals the greedy
 *     continuation (library calls) of the conversation rendered so far,
 *     over three turns (the session reuses the earlier turns' tokens), a
 *     system prompt, /reset; a bad template is refused naming its position;
 *   - `spectra run -p -` and `-f -` read standard input. */
#include "model/model.h"
#include "testlib.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* stdout only (stderr: with_err) */
static int sh(const char *cmd, char **out, int with_err) {
    char full[8192];
    snprintf(full, sizeof full, "%s %s", cmd, with_err ? "2>&1" : "2>/dev/null");
    FILE *p = popen(full, "r");
    size_t cap = 1 << 16, n = 0, k;
    char *buf = malloc(cap);
    while (p && buf && (k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    if (buf) buf[n] = 0;
    int st = p ? pclose(p) : -1;
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *bin(void) {
    const char *b = getenv("SPECTRA_BIN");
    return b && *b ? b : "build/spectra";
}

#define TURN_TMPL                                                                                                   \
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + '\\n\\n' }}"             \
    "{% elif m['role'] == 'user' %}{{ 'Question: ' + m['content'] + '\\n' }}{% else %}"                            \
    "{{ 'Answer: ' + m['content'] + eos_token + '\\n' }}{% endif %}{% endfor %}"                                    \
    "{% if add_generation_prompt %}{{ 'Answer:' }}{% endif %}"

/* The greedy reply (text) to a conversation: rendered, tokenized without
 * the tokenizer's BOS rule (the template writes it), n tokens at most, up
 * to EOS, decoded. */
static char *greedy_reply(spx_model *m, const spx_template *t, const char *msgs, int n) {
    char *prompt = NULL, err[512], *text = NULL;
    size_t plen = 0, tlen = 0;
    CHECK(spx_chat_render(m, t, msgs, NULL, 1, &prompt, &plen, err, sizeof err) == SPX_OK, "render: %s", err);
    if (!prompt) return NULL;
    int32_t ids[4096], out[512];
    size_t ni = 4096;
    CHECK(spx_tokenize(m, prompt, plen, 0, ids, &ni) == SPX_OK, "tokenize: %s", spx_last_error());
    free(prompt);
    spx_session_params sp = {.n_ctx = 1024};
    spx_session *s = NULL;
    CHECK(spx_session_new(m, &sp, &s) == SPX_OK, "session");
    const int64_t V = spx_model_vocab_size(m);
    float *lg = malloc((size_t)V * sizeof(float));
    int k = 0;
    if (s && lg && spx_session_eval(s, ids, ni, lg, 0) == SPX_OK) {
        int32_t id = spx_sample(lg, V, NULL, NULL);
        while (k < n && id != spx_model_eos_id(m)) {
            out[k++] = id;
            if (k == n || spx_session_step_greedy(s, id, &id) != SPX_OK) break;
        }
    }
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_tok_decode(m->tok, out, (size_t)k, 1, &text, &tlen, &e) == SPX_OK, "decode: %s", e.msg);
    free(lg);
    spx_session_free(s);
    return text;
}

/* cJSON-free message list building for the test: [{"role":..,"content":..}, ...] */
static void msgs_add(char *buf, size_t cap, const char *role, const char *content) {
    size_t n = strlen(buf);
    if (n == 0) snprintf(buf, cap, "[]"), n = 2;
    buf[n - 1] = 0; /* drop ']' */
    snprintf(buf + n - 1, cap - n + 1, "%s{\"role\": \"%s\", \"content\": \"%s\"}]", n > 2 ? ", " : "", role, content);
}

static void test_info(const char *tmp) {
    spx_model *m = NULL;
    const char *doc = tl_shared("models/docllama-58m");
    spx_model_params mp = {.n_threads = 2};
    CHECK(spx_model_open(doc, &mp, &m) == SPX_OK, "%s: %s", doc, spx_last_error());
    if (!m) return;
    CHECK(spx_model_chat_template(m) == NULL, "docllama-58m has no chat template");
    CHECK(!strcmp(spx_model_bos_text(m), "<s>") && !strcmp(spx_model_eos_text(m), "</s>"), "bos/eos texts: %s %s",
          spx_model_bos_text(m), spx_model_eos_text(m));
    char *out = NULL, err[512];
    CHECK(spx_chat_render(m, NULL, "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, 1, &out, NULL, err, sizeof err) ==
              SPX_OK && out && !strcmp(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
          "ChatML fallback: %s", out ? out : err);
    free(out);
    out = NULL;
    CHECK(spx_chat_render(m, NULL, "{\"role\": 1}", NULL, 1, &out, NULL, err, sizeof err) == SPX_ERR_ARG &&
              strstr(err, "messages"), "messages not an array: %s", err);
    spx_model_free(m);

    /* a folder with a template in tokenizer_config.json, then chat_template.jinja beside it (its links absolute) */
    char dir[1024], cmd[24576], abs[4096];
    if (!realpath(doc, abs)) snprintf(abs, sizeof abs, "%s", doc);
    doc = abs;
    snprintf(dir, sizeof dir, "%s/withtmpl", tmp);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && for f in config.json model-00001-of-00002.safetensors model-00002-of-00002.safetensors "
             "model.safetensors.index.json tokenizer.json; do ln -sf %s/$f %s/$f; done && "
             "sed '0,/{/s//{\"chat_template\": \"CFG{{ messages[0][\\x27content\\x27] }}\",/' %s/tokenizer_config.json > "
             "%s/tokenizer_config.json",
             dir, doc, dir, doc, dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    CHECK(spx_model_open(dir, &mp, &m) == SPX_OK, "%s: %s", dir, spx_last_error());
    if (m) {
        CHECK(spx_model_chat_template(m) && !strcmp(spx_model_chat_template(m), "CFG{{ messages[0]['content'] }}"),
              "template from tokenizer_config.json: %s", spx_model_chat_template(m));
        spx_model_free(m);
    }
    snprintf(cmd, sizeof cmd, "printf '%%s' \"JINJA{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}\" > "
             "%s/chat_template.jinja", dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    char trdc[1100];
    snprintf(trdc, sizeof trdc, "%s/withtmpl.trdc", tmp);
    snprintf(cmd, sizeof cmd, "%s compress -m %s -o %s -q --threads 2", bin(), dir, trdc);
    CHECK(system(cmd) == 0, "%s", cmd);
    const char *paths[2] = {dir, trdc};
    for (int i = 0; i < 2; i++) {
        m = NULL;
        CHECK(spx_model_open(paths[i], &mp, &m) == SPX_OK, "%s: %s", paths[i], spx_last_error());
        if (!m) continue;
        out = NULL;
        CHECK(spx_chat_render(m, NULL, "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, 0, &out, NULL, err,
                              sizeof err) == SPX_OK && out && !strcmp(out, "JINJA<s>hi</s>"),
              "%s: chat_template.jinja wins: %s", paths[i], out ? out : err);
        free(out);
        spx_model_free(m);
    }
}

static void test_cli_chat(const char *tmp) {
    char trdc[1100], tf[1100], cmd[8192], *out = NULL;
    snprintf(trdc, sizeof trdc, "%s/doc.trdc", tmp);
    snprintf(cmd, sizeof cmd, "%s compress -m %s -o %s -q --threads 2", bin(), tl_shared("models/docllama-58m"), trdc);
    CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(tf, sizeof tf, "%s/turn.jinja", tmp);
    CHECK(tl_write(tf, TURN_TMPL, strlen(TURN_TMPL)) == 0, "write %s", tf);
    spx_model *m = NULL;
    spx_model_params mp = {.n_threads = 2};
    CHECK(spx_model_open(trdc, &mp, &m) == SPX_OK, "%s: %s", trdc, spx_last_error());
    spx_template *t = NULL;
    char err[512];
    CHECK(spx_template_parse(TURN_TMPL, strlen(TURN_TMPL), "turn.jinja", &t, err, sizeof err) == SPX_OK, "%s", err);
    if (!m || !t) {
        spx_model_free(m);
        spx_template_free(t);
        return;
    }
    /* three turns and a system prompt; then /reset and the first question again */
    const char *qs[3] = {"What does the kernel do?", "And the scheduler?", "Why?"};
    const int N = 20;
    snprintf(cmd, sizeof cmd,
             "printf '%s\\n%s\\n%s\\n/reset\\n%s\\n' | %s chat -m %s --chat-template %s --system 'You answer.' --temp 0 "
             "-n %d --threads 2",
             qs[0], qs[1], qs[2], qs[0], bin(), trdc, tf, N);
    int rc = sh(cmd, &out, 0);
    CHECK(rc == 0, "`%s` exited %d", cmd, rc);
    char msgs[8192] = "";
    msgs_add(msgs, sizeof msgs, "system", "You answer.");
    /* the output is each reply followed by a newline (replies may hold newlines themselves) */
    size_t pos = 0;
    const char *p = out ? out : "";
    for (int i = 0; i < 4; i++) {
        msgs_add(msgs, sizeof msgs, "user", qs[i % 3]);
        char *want = greedy_reply(m, t, msgs, N);
        size_t wl = want ? strlen(want) : 0;
        CHECK(want && !strncmp(p + pos, want, wl) && p[pos + wl] == '\n',
              "turn %d: chat replied '%.*s...', the library's greedy continuation of the conversation is '%s'", i,
              (int)(wl + 8), p + pos, want ? want : "(none)");
        if (want && !strncmp(p + pos, want, wl) && p[pos + wl] == '\n') pos += wl + 1;
        if (i == 2) { /* /reset: the system prompt stays, the turns go */
            msgs[0] = 0;
            msgs_add(msgs, sizeof msgs, "system", "You answer.");
        } else {
            char esc[2048];
            size_t k = 0;
            for (const char *q = want ? want : ""; *q && k + 8 < sizeof esc; q++) { /* a JSON string */
                if (*q == '"' || *q == '\\') esc[k++] = '\\', esc[k++] = *q;
                else if ((unsigned char)*q < 0x20) k += (size_t)snprintf(esc + k, sizeof esc - k, "\\u%04x", *q);
                else esc[k++] = *q;
            }
            esc[k] = 0;
            msgs_add(msgs, sizeof msgs, "assistant", esc);
        }
        free(want);
    }
    CHECK(p[pos] == 0, "chat printed more than the four replies: '%s'", p + pos);
    free(out);
    /* a bad template: refused at start, its position named */
    CHECK(tl_write(tf, "{% for x in y %}{{ x | nosuchfilter }}{% endfor %}", 50) == 0, "write");
    snprintf(cmd, sizeof cmd, "echo hi | %s chat -m %s --chat-template %s --temp 0 -n 2", bin(), trdc, tf);
    rc = sh(cmd, &out, 1);
    CHECK(rc == 1 && out && strstr(out, "turn.jinja:1:"), "bad template: rc %d: %s", rc, out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s chat --help", bin());
    rc = sh(cmd, &out, 1);
    CHECK(rc == 0 && out && strstr(out, "usage: spectra chat"), "chat --help");
    free(out);
    /* run -p - / -f -: standard input gives what -p TEXT gives */
    char *o[3] = {NULL, NULL, NULL};
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'The Linux kernel' -n 12 --temp 0 -q --threads 2", bin(), trdc);
    CHECK(sh(cmd, &o[0], 0) == 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "printf 'The Linux kernel' | %s run -m %s -p - -n 12 --temp 0 -q --threads 2", bin(), trdc);
    CHECK(sh(cmd, &o[1], 0) == 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "printf 'The Linux kernel' | %s run -m %s -f - -n 12 --temp 0 -q --threads 2", bin(), trdc);
    CHECK(sh(cmd, &o[2], 0) == 0, "%s", cmd);
    CHECK(o[0] && o[1] && o[2] && strlen(o[0]) > 4 && !strcmp(o[0], o[1]) && !strcmp(o[0], o[2]),
          "run from standard input differs:\n%s\n%s\n%s", o[0], o[1], o[2]);
    for (int i = 0; i < 3; i++) free(o[i]);
    spx_template_free(t);
    spx_model_free(m);
}

int main(void) {
    const char *tmp = tl_tmpdir();
    test_info(tmp);
    test_cli_chat(tmp);
    return tl_finish("test_chat");
}
