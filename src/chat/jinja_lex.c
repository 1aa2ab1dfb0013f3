/* jinja_lex.c: the lexer of the chat template engine.
 *
 * Follows jinja2 3.1's Lexer with trim_blocks and lstrip_blocks on:
 *   - the source has its newlines normalized and one trailing newline
 *     dropped (keep_trailing_newline=False) before lexing (spx_template_parse);
 *   - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}",
 *     "-#}" all whitespace after it;
 *   - lstrip_blocks: before "{%" and "{#" (not "{{", not "{%+"), spaces and
 *     tabs between the start of the line and the tag are removed;
 *   - trim_blocks: one "\n" right after "%}" or "#}" (not "+%}") is removed;
 *   - {% raw %}...{% endraw %} is text (no newline trim after raw's "%}");
 *   - comments vanish.
 * Inside tags: names, strings (Python escapes), integers and floats
 * (with '_' separators), operators; jinja2 looks for a tag's end only
 * outside brackets. Also here: error positions (jfail_at) and
 * spx_template_parse / spx_template_free. */
#include "chat/jinja.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

spx_status jfail_at(spx_err *e, const spx_template *t, size_t pos, spx_status code, const char *fmt, ...) {
    if (!e || e->code != SPX_OK) return code;
    size_t line = 1, ls = 0;
    if (pos > t->len) pos = t->len;
    for (size_t i = 0; i < pos; i++)
        if (t->src[i] == '\n') line++, ls = i + 1;
    size_t col = 1 + ju_len(t->src + ls, pos - ls);
    char msg[SPX_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return spx_fail(e, code, "%s:%zu:%zu: %s", t->name, line, col, msg);
}

/* Length of the whitespace character (Python str.isspace) that ends at
 * s[end), 0 if none. */
static size_t ws_ending_at(const char *s, size_t start, size_t end) {
    unsigned char last = (unsigned char)s[end - 1];
    if (last < 0x80) return ju_isspace(last) ? 1 : 0;
    for (size_t k = 2; k <= 4 && k <= end - start; k++) {
        int32_t cp;
        if (ju_next(s + end - k, k, &cp) == k && cp >= 0x80) return ju_isspace(cp) ? k : 0;
    }
    return 0;
}

static size_t skip_ws(const char *s, size_t n, size_t pos) {
    while (pos < n) {
        int32_t cp;
        size_t l = ju_next(s + pos, n - pos, &cp);
        if (!ju_isspace(cp)) break;
        pos += l;
    }
    return pos;
}

static bool push_tok(jtoks *ts, jtok t) {
    if (ts->n == ts->cap) {
        size_t cap = ts->cap ? ts->cap * 2 : 256;
        jtok *v = realloc(ts->v, cap * sizeof *v);
        if (!v) return false;
        ts->v = v;
        ts->cap = cap;
    }
    ts->v[ts->n++] = t;
    return true;
}

#define PUSH(...)                                                                 \
    do {                                                                          \
        if (!push_tok(out, (jtok){__VA_ARGS__}))                                  \
            return jfail_at(e, t, pos, SPX_ERR_NOMEM, "out of memory lexing the template"); \
    } while (0)

/* Emits src[start, end) as text after the whitespace control of the tag
 * that follows it (sign '-', '+' or 0; lstrip: a block or comment tag). */
static spx_status emit_text(spx_template *t, jtoks *out, size_t start, size_t end, char sign, bool lstrip,
                            spx_err *e) {
    const char *s = t->src;
    size_t pos = start;
    if (sign == '-') {
        size_t k;
        while (end > start && (k = ws_ending_at(s, start, end)) > 0) end -= k;
    } else if (sign != '+' && lstrip) {
        size_t l = end;
        while (l > start && s[l - 1] != '\n') l--;
        bool line_starting = start == 0 || s[start - 1] == '\n';
        if ((l > start || line_starting) && l < end) {
            size_t w = skip_ws(s, end, l);
            if (w == end) end = l;
        }
    }
    if (end > start) PUSH(.kind = T_TEXT, .pos = start, .s = {s + start, end - start});
    return SPX_OK;
}

static bool starts(const char *s, size_t n, size_t pos, const char *w) {
    size_t k = strlen(w);
    return pos + k <= n && !memcmp(s + pos, w, k);
}

/* "{%" [-+]? ws "raw" ws ("-%}" | "%}") at pos: the end of that tag (after
 * the whitespace "-%}" strips), 0 if not one. Same with "endraw" (trim:
 * "%}" also eats one newline; "+%}" accepted). */
static size_t raw_tag(const char *s, size_t n, size_t pos, const char *word, bool is_end) {
    size_t p = pos + 2;
    if (p < n && (s[p] == '-' || s[p] == '+')) p++;
    p = skip_ws(s, n, p);
    if (!starts(s, n, p, word)) return 0;
    p = skip_ws(s, n, p + strlen(word));
    if (is_end && starts(s, n, p, "+%}")) return p + 3;
    if (starts(s, n, p, "-%}")) return skip_ws(s, n, p + 3);
    if (starts(s, n, p, "%}")) return p + 2 + (is_end && p + 2 < n && s[p + 2] == '\n');
    return 0;
}

/* Python's unicode-escape decoding of a string literal's body. */
static spx_status decode_string(spx_template *t, size_t pos, const char *s, size_t n, jstr *out, spx_err *e) {
    jbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c != '\\' || i + 1 == n) {
            if (!jbuf_putc(&b, c)) goto oom;
            continue;
        }
        char x = s[++i];
        int32_t cp = -1;
        switch (x) {
        case '\n': continue;
        case '\\': cp = '\\'; break;
        case '\'': cp = '\''; break;
        case '"': cp = '"'; break;
        case 'a': cp = 7; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'v': cp = 11; break;
        case 'x': case 'u': case 'U': {
            int want = x == 'x' ? 2 : x == 'u' ? 4 : 8;
            cp = 0;
            for (int k = 0; k < want; k++) {
                char h = i + 1 < n ? s[i + 1] : 0;
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0) {
                    jbuf_free(&b);
                    return jfail_at(e, t, pos, SPX_ERR_FORMAT, "truncated \\%c escape in a string literal", x);
                }
                cp = cp * 16 + d;
                i++;
            }
            if (cp > 0x10FFFF) {
                jbuf_free(&b);
                return jfail_at(e, t, pos, SPX_ERR_FORMAT, "\\U escape beyond U+10FFFF in a string literal");
            }
            break;
        }
        case 'N':
            jbuf_free(&b);
            return jfail_at(e, t, pos, SPX_ERR_UNSUPPORTED, "unsupported \\N{...} escape in a string literal");
        default:
            if (x >= '0' && x <= '7') {
                cp = x - '0';
                for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++) cp = cp * 8 + (s[++i] - '0');
            } else {
                /* unknown escapes stay as they are */
                if (!jbuf_putc(&b, '\\') || !jbuf_putc(&b, x)) goto oom;
                continue;
            }
        }
        if (!ju_put(&b, cp)) goto oom;
    }
    char *p = ja_alloc(&t->arena, b.n + 1);
    if (!p) goto oom;
    if (b.n) memcpy(p, b.p, b.n);
    *out = (jstr){p, b.n};
    jbuf_free(&b);
    return SPX_OK;
oom:
    jbuf_free(&b);
    return jfail_at(e, t, pos, SPX_ERR_NOMEM, "out of memory lexing the template");
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

/* digits with single '_' separators: (\d+_)*\d+ ; returns the end or p */
static size_t digits(const char *s, size_t n, size_t p) {
    size_t q = p;
    while (q < n && is_digit(s[q])) {
        q++;
        if (q + 1 < n && s[q] == '_' && is_digit(s[q + 1])) q++;
    }
    return q;
}

/* One number token at p (s[p] is a digit). */
static spx_status lex_number(spx_template *t, jtoks *out, size_t pos, size_t *endp, spx_err *e) {
    const char *s = t->src;
    size_t n = t->len;
    size_t q = digits(s, n, pos);
    size_t f = q;
    bool is_float = false;
    if (f + 1 < n && s[f] == '.' && is_digit(s[f + 1])) {
        f = digits(s, n, f + 1);
        is_float = true;
    }
    if (f < n && (s[f] == 'e' || s[f] == 'E')) {
        size_t g = f + 1;
        if (g < n && (s[g] == '+' || s[g] == '-')) g++;
        if (g < n && is_digit(s[g])) {
            f = digits(s, n, g);
            is_float = true;
        }
    }
    char tmp[400];
    size_t k = 0;
    size_t end = is_float ? f : q;
    for (size_t i = pos; i < end && k + 1 < sizeof tmp; i++)
        if (s[i] != '_') tmp[k++] = s[i];
    tmp[k] = 0;
    if (end - pos >= sizeof tmp - 1)
        return jfail_at(e, t, pos, SPX_ERR_UNSUPPORTED, "unsupported number literal longer than %zu characters",
                        sizeof tmp - 2);
    if (is_float) {
        PUSH(.kind = T_FLOAT, .pos = pos, .f = strtod(tmp, NULL), .s = {s + pos, end - pos});
    } else {
        int64_t v = 0;
        for (size_t i = 0; tmp[i]; i++) {
            int d = tmp[i] - '0';
            if (v > (INT64_MAX - d) / 10)
                return jfail_at(e, t, pos, SPX_ERR_UNSUPPORTED,
                                "unsupported integer literal %s: beyond 64-bit integers", tmp);
            v = v * 10 + d;
        }
        PUSH(.kind = T_INT, .pos = pos, .i = v, .s = {s + pos, end - pos});
    }
    *endp = end;
    return SPX_OK;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", ">=", "<="};
static const char OPS1[] = "+-/*%~[](){}><=.:|,;";

/* Tokens of one tag's inside from pos; stops after the end delimiter. */
static spx_status lex_tag(spx_template *t, jtoks *out, size_t pos, bool is_block, size_t tag_pos, size_t *endp,
                          spx_err *e) {
    const char *s = t->src;
    size_t n = t->len;
    int depth = 0; /* open ( [ {: jinja2 does not look for the end delimiter inside them */
    for (;;) {
        pos = skip_ws(s, n, pos);
        if (pos >= n)
            return jfail_at(e, t, tag_pos, SPX_ERR_FORMAT, "unexpected end of template: this %s has no '%s'",
                            is_block ? "'{%'" : "'{{'", is_block ? "%}" : "}}");
        if (depth > 0) {
            /* no end delimiter here */
        } else if (is_block) {
            if (starts(s, n, pos, "+%}") || starts(s, n, pos, "-%}") || starts(s, n, pos, "%}")) {
                size_t p = pos;
                PUSH(.kind = T_BLOCK_END, .pos = pos);
                if (s[p] == '+') p += 3;
                else if (s[p] == '-') p = skip_ws(s, n, p + 3);
                else p += 2 + (p + 2 < n && s[p + 2] == '\n');
                *endp = p;
                return SPX_OK;
            }
        } else if (starts(s, n, pos, "-}}") || starts(s, n, pos, "}}")) {
            PUSH(.kind = T_VAR_END, .pos = pos);
            *endp = s[pos] == '-' ? skip_ws(s, n, pos + 3) : pos + 2;
            return SPX_OK;
        }
        char c = s[pos];
        if (is_name0(c)) {
            size_t q = pos + 1;
            while (q < n && (is_name0(s[q]) || is_digit(s[q]))) q++;
            PUSH(.kind = T_NAME, .pos = pos, .s = {s + pos, q - pos});
            pos = q;
        } else if (is_digit(c)) {
            SPX_TRY(lex_number(t, out, pos, &pos, e));
        } else if (c == '\'' || c == '"') {
            size_t q = pos + 1;
            while (q < n && s[q] != c) q += s[q] == '\\' ? 2 : 1;
            if (q >= n) return jfail_at(e, t, pos, SPX_ERR_FORMAT, "unterminated string literal");
            jstr v;
            SPX_TRY(decode_string(t, pos, s + pos + 1, q - pos - 1, &v, e));
            PUSH(.kind = T_STRING, .pos = pos, .s = v);
            pos = q + 1;
        } else {
            size_t k = 0;
            for (size_t i = 0; i < sizeof OPS2 / sizeof *OPS2; i++)
                if (starts(s, n, pos, OPS2[i])) k = 2;
            if (!k && c && strchr(OPS1, c)) k = 1;
            if (!k) {
                int32_t cp;
                ju_next(s + pos, n - pos, &cp);
                return jfail_at(e, t, pos, SPX_ERR_FORMAT, "unexpected character '%.*s' in a tag",
                                (int)ju_next(s + pos, n - pos, &cp), s + pos);
            }
            if (k == 1 && (c == '(' || c == '[' || c == '{')) depth++;
            if (k == 1 && (c == ')' || c == ']' || c == '}')) {
                if (depth == 0) return jfail_at(e, t, pos, SPX_ERR_FORMAT, "syntax error: unexpected '%c'", c);
                depth--;
            }
            PUSH(.kind = T_OP, .pos = pos, .s = {s + pos, k});
            pos += k;
        }
    }
}

spx_status jlex(spx_template *t, jtoks *out, spx_err *e) {
    const char *s = t->src;
    size_t n = t->len, pos = 0;
    while (pos < n) {
        size_t m = pos;
        while (m + 1 < n && !(s[m] == '{' && (s[m + 1] == '{' || s[m + 1] == '%' || s[m + 1] == '#'))) m++;
        if (m + 1 >= n) {
            SPX_TRY(emit_text(t, out, pos, n, 0, false, e));
            break;
        }
        char k = s[m + 1];
        char sign = m + 2 < n && (s[m + 2] == '-' || s[m + 2] == '+') ? s[m + 2] : 0;
        size_t after = m + 2 + (sign != 0);
        SPX_TRY(emit_text(t, out, pos, m, sign, k != '{', e));
        if (k == '#') {
            size_t q = after;
            while (q + 1 < n && !(s[q] == '#' && s[q + 1] == '}')) q++;
            if (q + 1 >= n) return jfail_at(e, t, m, SPX_ERR_FORMAT, "unclosed comment: '{#' without '#}'");
            char es = q > after && (s[q - 1] == '-' || s[q - 1] == '+') ? s[q - 1] : 0;
            pos = q + 2;
            if (es == '-') pos = skip_ws(s, n, pos);
            else if (es != '+' && pos < n && s[pos] == '\n') pos++;
            continue;
        }
        size_t raw_end = k == '%' ? raw_tag(s, n, m, "raw", false) : 0;
        if (raw_end) {
            size_t q = raw_end, close = 0;
            for (; q + 1 < n; q++)
                if (s[q] == '{' && s[q + 1] == '%' && (close = raw_tag(s, n, q, "endraw", true))) break;
            if (!close) return jfail_at(e, t, m, SPX_ERR_FORMAT, "unclosed raw block: '{%% raw %%}' without '{%% endraw %%}'");
            char rs = q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
            SPX_TRY(emit_text(t, out, raw_end, q, rs, true, e));
            pos = close;
            continue;
        }
        pos = m;
        PUSH(.kind = k == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, .pos = m);
        SPX_TRY(lex_tag(t, out, after, k == '%', m, &pos, e));
    }
    PUSH(.kind = T_EOF, .pos = n);
    return SPX_OK;
}

/* ---- API --------------------------------------------------------------- */

static void copy_err(const spx_err *e, char *err, size_t errcap) {
    if (!err || !errcap) return;
    snprintf(err, errcap, "%s", e->msg);
}

spx_status spx_template_parse(const char *src, size_t len, const char *name, spx_template **out, char *err,
                              size_t errcap) {
    spx_err e;
    spx_err_clear(&e);
    if (err && errcap) err[0] = 0;
    if (!out || (!src && len)) {
        spx_fail(&e, SPX_ERR_ARG, "spx_template_parse: NULL %s", out ? "src" : "out");
        copy_err(&e, err, errcap);
        return SPX_ERR_ARG;
    }
    *out = NULL;
    if (!name) name = "template";
    spx_template *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(name)) || !(t->src = malloc(len + 1))) {
        if (t) free(t->name);
        free(t);
        spx_fail(&e, SPX_ERR_NOMEM, "%s: out of memory", name);
        copy_err(&e, err, errcap);
        return SPX_ERR_NOMEM;
    }
    /* jinja2: newlines normalized, one trailing newline dropped */
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            t->src[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            t->src[k++] = src[i];
        }
    }
    if (k && t->src[k - 1] == '\n') k--;
    t->src[k] = 0;
    t->len = k;
    jtoks toks = {0};
    spx_status st = jlex(t, &toks, &e);
    if (!st) st = jparse(t, &toks, &e);
    free(toks.v);
    if (st) {
        copy_err(&e, err, errcap);
        spx_template_free(t);
        return st;
    }
    *out = t;
    return SPX_OK;
}

void spx_template_free(spx_template *t) {
    if (!t) return;
    ja_free(&t->arena);
    free(t->src);
    free(t->name);
    free(t);
}
