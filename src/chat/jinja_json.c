/* jinja_json.c: JSON for the chat template engine: Python's json.dumps
 * (transformers' tojson filter: ensure_ascii, indent, separators,
 * sort_keys, floats as repr(), NaN/Infinity as Python writes them, non-str
 * keys turned into strings as json.dumps does) and the reader of the render
 * context (JSON integers become ints, numbers with a fraction or an
 * exponent floats; NaN/Infinity accepted as Python's json does; nesting
 * capped at 256). Recursion over values is capped at J_VALUE_DEPTH. */
#include "chat/jinja.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- json.dumps ----------------------------------------------------- */

typedef struct jjson {
    const char *indent, *item_sep, *key_sep;
    bool sort_keys, ascii;
} jjson;

static bool json_str(jbuf *b, jstr s, bool ascii) {
    if (!jbuf_putc(b, '"')) return false;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        size_t k = ju_next(s.p + i, s.n - i, &cp);
        bool ok;
        switch (cp) {
        case '"': ok = jbuf_puts(b, "\\\""); break;
        case '\\': ok = jbuf_puts(b, "\\\\"); break;
        case '\n': ok = jbuf_puts(b, "\\n"); break;
        case '\r': ok = jbuf_puts(b, "\\r"); break;
        case '\t': ok = jbuf_puts(b, "\\t"); break;
        case '\b': ok = jbuf_puts(b, "\\b"); break;
        case '\f': ok = jbuf_puts(b, "\\f"); break;
        default:
            if (cp < 0x20) ok = jbuf_printf(b, "\\u%04x", (unsigned)cp);
            else if (!ascii || cp < 0x80) ok = jbuf_put(b, s.p + i, k);
            else if (cp < 0x10000) ok = jbuf_printf(b, "\\u%04x", (unsigned)cp);
            else ok = jbuf_printf(b, "\\u%04x\\u%04x", (unsigned)(0xD800 + ((cp - 0x10000) >> 10)),
                                  (unsigned)(0xDC00 + ((cp - 0x10000) & 0x3FF)));
        }
        if (!ok) return false;
        i += k;
    }
    return jbuf_putc(b, '"');
}

static bool json_nl(jbuf *b, const jjson *o, int level) {
    if (!o->indent) return true;
    if (!jbuf_putc(b, '\n')) return false;
    for (int i = 0; i < level; i++)
        if (!jbuf_puts(b, o->indent)) return false;
    return true;
}

static spx_status json_val(jrt *r, const jnode *at, const jv *v, const jjson *o, jbuf *b, int level);

static int cmp_keys(const void *x, const void *y) {
    const jv *a = *(jv *const *)x, *c = *(jv *const *)y;
    size_t n = a->s.n < c->s.n ? a->s.n : c->s.n;
    int k = n ? memcmp(a->s.p, c->s.p, n) : 0;
    return k ? k : (a->s.n > c->s.n) - (a->s.n < c->s.n);
}

static spx_status json_dict(jrt *r, const jnode *at, const jv *v, const jjson *o, jbuf *b, int level) {
    if (!v->d.n) return jbuf_puts(b, "{}") ? SPX_OK : jbuf_fail(r, at, b);
    /* keys as json.dumps turns them into strings */
    jv **keys = ja_alloc(&r->arena, v->d.n * sizeof *keys);
    size_t *order = ja_alloc(&r->arena, v->d.n * sizeof *order);
    if (!keys || !order) return joom(r, at);
    for (size_t i = 0; i < v->d.n; i++) {
        const jv *k = v->d.k[i];
        char num[64];
        const char *s = NULL;
        switch (k->type) {
        case JV_STR: keys[i] = (jv *)k; continue;
        case JV_INT: snprintf(num, sizeof num, "%lld", (long long)k->i); s = num; break;
        case JV_FLOAT: jfmt_float(k->f, num, sizeof num); s = isnan(k->f) ? "NaN" : isinf(k->f) ? (k->f > 0 ? "Infinity" : "-Infinity") : num; break;
        case JV_BOOL: s = k->b ? "true" : "false"; break;
        case JV_NONE: s = "null"; break;
        default:
            return jfail(r, at, SPX_ERR_ARG, "tojson: keys must be str, int, float, bool or None, not %s", jv_typename(k));
        }
        if (!(keys[i] = jv_str(r, s, strlen(s)))) return joom(r, at);
    }
    for (size_t i = 0; i < v->d.n; i++) order[i] = i;
    if (o->sort_keys) {
        for (size_t i = 0; i < v->d.n; i++)
            if (v->d.k[i]->type != JV_STR)
                return jfail(r, at, SPX_ERR_ARG, "tojson(sort_keys=true): keys of mixed types cannot be sorted");
        /* stable insertion sort by key text (keys are unique) */
        for (size_t i = 1; i < v->d.n; i++) {
            size_t x = order[i], j = i;
            while (j > 0 && cmp_keys(&keys[order[j - 1]], &keys[x]) > 0) {
                order[j] = order[j - 1];
                j--;
            }
            order[j] = x;
        }
    }
    if (!jbuf_putc(b, '{')) return jbuf_fail(r, at, b);
    for (size_t i = 0; i < v->d.n; i++) {
        size_t k = order[i];
        if (i && !jbuf_puts(b, o->item_sep)) return jbuf_fail(r, at, b);
        if (!json_nl(b, o, level + 1) || !json_str(b, keys[k]->s, o->ascii) || !jbuf_puts(b, o->key_sep))
            return jbuf_fail(r, at, b);
        SPX_TRY(json_val(r, at, v->d.v[k], o, b, level + 1));
    }
    if (!json_nl(b, o, level) || !jbuf_putc(b, '}')) return jbuf_fail(r, at, b);
    return SPX_OK;
}

static spx_status json_val(jrt *r, const jnode *at, const jv *v, const jjson *o, jbuf *b, int level) {
    if (level > J_VALUE_DEPTH) return jfail(r, at, SPX_ERR_RANGE, "tojson: values nested deeper than %d levels", J_VALUE_DEPTH);
    bool ok = true;
    char num[64];
    switch (v->type) {
    case JV_NONE: ok = jbuf_puts(b, "null"); break;
    case JV_BOOL: ok = jbuf_puts(b, v->b ? "true" : "false"); break;
    case JV_INT: ok = jbuf_printf(b, "%lld", (long long)v->i); break;
    case JV_FLOAT:
        if (isnan(v->f)) ok = jbuf_puts(b, "NaN");
        else if (isinf(v->f)) ok = jbuf_puts(b, v->f > 0 ? "Infinity" : "-Infinity");
        else jfmt_float(v->f, num, sizeof num), ok = jbuf_puts(b, num);
        break;
    case JV_STR: ok = json_str(b, v->s, o->ascii); break;
    case JV_LIST:
        if (v->flags & JV_F_ITER)
            return jfail(r, at, SPX_ERR_ARG, "tojson: Object of type generator is not JSON serializable");
        if (!v->l.n) {
            ok = jbuf_puts(b, "[]");
            break;
        }
        if (!jbuf_putc(b, '[')) return jbuf_fail(r, at, b);
        for (size_t i = 0; i < v->l.n; i++) {
            if (i && !jbuf_puts(b, o->item_sep)) return jbuf_fail(r, at, b);
            if (!json_nl(b, o, level + 1)) return jbuf_fail(r, at, b);
            SPX_TRY(json_val(r, at, v->l.v[i], o, b, level + 1));
        }
        ok = json_nl(b, o, level) && jbuf_putc(b, ']');
        break;
    case JV_DICT: return json_dict(r, at, v, o, b, level);
    case JV_UNDEF:
        if (v->u.hint) return jfail(r, at, SPX_ERR_ARG, "tojson: %s", v->u.hint);
        return jfail(r, at, SPX_ERR_ARG, "tojson: Object of type Undefined is not JSON serializable");
    default:
        return jfail(r, at, SPX_ERR_ARG, "tojson: Object of type %s is not JSON serializable", jv_typename(v));
    }
    return ok ? SPX_OK : jbuf_fail(r, at, b);
}

spx_status jv_tojson(jrt *r, const jnode *at, const jv *v, const char *indent, const char *item_sep,
                     const char *key_sep, bool sort_keys, bool ascii, jbuf *b) {
    jjson o = {.indent = indent, .item_sep = item_sep ? item_sep : indent ? "," : ", ",
               .key_sep = key_sep ? key_sep : ": ", .sort_keys = sort_keys, .ascii = ascii};
    return json_val(r, at, v, &o, b, 0);
}

/* ---- JSON reader ---------------------------------------------------- */

typedef struct jrd {
    jrt *r;
    const char *s;
    size_t n, i;
} jrd;

static spx_status rd_fail(jrd *d, const char *what) {
    return spx_fail(d->r->e, SPX_ERR_ARG, "%s: render context: invalid JSON at byte %zu: %s", d->r->t->name, d->i, what);
}

static void rd_ws(jrd *d) {
    while (d->i < d->n && (d->s[d->i] == ' ' || d->s[d->i] == '\t' || d->s[d->i] == '\n' || d->s[d->i] == '\r')) d->i++;
}

static int hex4(const char *s) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        char h = s[k];
        int x = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (x < 0) return -1;
        v = v * 16 + x;
    }
    return v;
}

static spx_status rd_string(jrd *d, jv **out) {
    d->i++; /* the quote */
    jbuf b = {0};
    while (d->i < d->n && d->s[d->i] != '"') {
        char c = d->s[d->i];
        if ((unsigned char)c < 0x20) { jbuf_free(&b); return rd_fail(d, "control character in a string"); }
        if (c != '\\') {
            size_t j = d->i;
            while (j < d->n && d->s[j] != '"' && d->s[j] != '\\' && (unsigned char)d->s[j] >= 0x20) j++;
            if (!jbuf_put(&b, d->s + d->i, j - d->i)) goto oom;
            d->i = j;
            continue;
        }
        if (d->i + 1 >= d->n) break;
        char x = d->s[d->i + 1];
        d->i += 2;
        int32_t cp;
        switch (x) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'u': {
            if (d->i + 4 > d->n || (cp = hex4(d->s + d->i)) < 0) { jbuf_free(&b); return rd_fail(d, "bad \\u escape"); }
            d->i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && d->i + 6 <= d->n && d->s[d->i] == '\\' && d->s[d->i + 1] == 'u') {
                int lo = hex4(d->s + d->i + 2);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    d->i += 6;
                }
            }
            break;
        }
        default: jbuf_free(&b); return rd_fail(d, "bad escape in a string");
        }
        if (!ju_put(&b, cp)) goto oom;
    }
    if (d->i >= d->n) { jbuf_free(&b); return rd_fail(d, "unterminated string"); }
    d->i++;
    *out = jv_strbuf(d->r, &b);
    return *out ? SPX_OK : joom(d->r, NULL);
oom:
    jbuf_free(&b);
    return joom(d->r, NULL);
}

static spx_status rd_value(jrd *d, jv **out, int depth) {
    if (depth > 256) return rd_fail(d, "nested deeper than 256 levels");
    rd_ws(d);
    if (d->i >= d->n) return rd_fail(d, "unexpected end");
    char c = d->s[d->i];
    jrt *r = d->r;
    if (c == '"') return rd_string(d, out);
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        jv *v = obj ? jv_new(r, JV_DICT) : jv_list(r, 0);
        if (!v) return joom(r, NULL);
        d->i++;
        rd_ws(d);
        if (d->i < d->n && d->s[d->i] == (obj ? '}' : ']')) {
            d->i++;
            *out = v;
            return SPX_OK;
        }
        for (;;) {
            jv *k = NULL, *x;
            rd_ws(d);
            if (obj) {
                if (d->i >= d->n || d->s[d->i] != '"') return rd_fail(d, "expected a string key");
                SPX_TRY(rd_string(d, &k));
                rd_ws(d);
                if (d->i >= d->n || d->s[d->i] != ':') return rd_fail(d, "expected ':'");
                d->i++;
            }
            SPX_TRY(rd_value(d, &x, depth + 1));
            if (obj ? !jv_dict_set(r, v, k, x) : !jv_push(r, v, x)) return joom(r, NULL);
            rd_ws(d);
            if (d->i < d->n && d->s[d->i] == ',') {
                d->i++;
                continue;
            }
            if (d->i < d->n && d->s[d->i] == (obj ? '}' : ']')) {
                d->i++;
                break;
            }
            return rd_fail(d, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        }
        *out = v;
        return SPX_OK;
    }
    static const struct { const char *w; jv *v; } words[] = {{"true", &jv_true}, {"false", &jv_false}, {"null", &jv_none}};
    for (size_t k = 0; k < 3; k++) {
        size_t l = strlen(words[k].w);
        if (d->i + l <= d->n && !memcmp(d->s + d->i, words[k].w, l)) {
            d->i += l;
            *out = words[k].v;
            return SPX_OK;
        }
    }
    /* numbers (Python's json also reads NaN, Infinity, -Infinity) */
    const char *sp[] = {"NaN", "Infinity", "-Infinity"};
    for (size_t k = 0; k < 3; k++) {
        size_t l = strlen(sp[k]);
        if (d->i + l <= d->n && !memcmp(d->s + d->i, sp[k], l)) {
            d->i += l;
            *out = jv_float(r, k == 0 ? NAN : k == 1 ? INFINITY : -INFINITY);
            return *out ? SPX_OK : joom(r, NULL);
        }
    }
    size_t j = d->i;
    if (j < d->n && d->s[j] == '-') j++;
    if (j >= d->n || d->s[j] < '0' || d->s[j] > '9') return rd_fail(d, "unexpected character");
    bool is_int = true;
    while (j < d->n && ((d->s[j] >= '0' && d->s[j] <= '9') || d->s[j] == '.' || d->s[j] == 'e' || d->s[j] == 'E' ||
                        d->s[j] == '+' || d->s[j] == '-')) {
        if (d->s[j] == '.' || d->s[j] == 'e' || d->s[j] == 'E') is_int = false;
        j++;
    }
    char tmp[64];
    if (j - d->i >= sizeof tmp) return rd_fail(d, "number longer than 63 characters");
    memcpy(tmp, d->s + d->i, j - d->i);
    tmp[j - d->i] = 0;
    char *end;
    if (is_int) {
        long long v = strtoll(tmp, &end, 10);
        if (*end) return rd_fail(d, "bad number");
        if ((v == LLONG_MAX || v == LLONG_MIN) && strcmp(tmp, v == LLONG_MAX ? "9223372036854775807" : "-9223372036854775808"))
            return spx_fail(r->e, SPX_ERR_UNSUPPORTED, "%s: render context: integer %s beyond 64 bits", r->t->name, tmp);
        *out = jv_int(r, v);
    } else {
        double f = strtod(tmp, &end);
        if (*end) return rd_fail(d, "bad number");
        *out = jv_float(r, f);
    }
    d->i = j;
    return *out ? SPX_OK : joom(r, NULL);
}

spx_status jv_from_json(jrt *r, const char *s, size_t n, jv **out) {
    jrd d = {.r = r, .s = s, .n = n};
    SPX_TRY(rd_value(&d, out, 0));
    rd_ws(&d);
    if (d.i != n) return rd_fail(&d, "trailing characters after the value");
    return SPX_OK;
}
