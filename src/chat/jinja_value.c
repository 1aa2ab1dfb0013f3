/* jinja_value.c: values of the chat template engine: the arena they live
 * in, text buffers, UTF-8 helpers, the JSON reader for the render
 * context, Python's str()/repr() of values, json.dumps (transformers'
 * tojson), equality, ordering, iteration and len().
 *
 * Python semantics throughout: bool is an int (True == 1), 1 == 1.0, a
 * list never equals a tuple, strings order by code point (byte order of
 * UTF-8), floats print as repr() does (shortest round-trip digits).
 * Integers are 64-bit here (Python's are unbounded): overflow is an error,
 * never a wrapped value. Nesting of values is capped at J_VALUE_DEPTH in
 * the recursive operations. json.dumps and the JSON reader are in
 * jinja_json.c. */
#include "chat/jinja.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define J_BLK_SIZE ((size_t)64 << 10)

jv jv_undef_plain = {.type = JV_UNDEF};
jv jv_none = {.type = JV_NONE};
jv jv_true = {.type = JV_BOOL, .b = true};
jv jv_false = {.type = JV_BOOL, .b = false};

/* ---- arena ---------------------------------------------------------- */

struct jblk {
    jblk *next;
    size_t used, cap;
    max_align_t data[];
};

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    jblk *h = a->head;
    if (h && h->cap - h->used >= n) {
        void *p = (char *)h->data + h->used;
        h->used += n;
        return p;
    }
    size_t cap = n > J_BLK_SIZE / 4 ? n : J_BLK_SIZE;
    if (a->cap && (a->total + cap > a->cap)) return NULL;
    jblk *b = calloc(1, sizeof *b + cap);
    if (!b) return NULL;
    a->total += cap;
    b->cap = cap;
    b->used = n;
    if (h && cap != J_BLK_SIZE) {
        /* a big one-off block goes behind the current one, which stays in use */
        b->next = h->next;
        h->next = b;
    } else {
        b->next = h;
        a->head = b;
    }
    return b->data;
}

void ja_free(jarena *a) {
    for (jblk *b = a->head, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- buffers -------------------------------------------------------- */

bool jbuf_put(jbuf *b, const void *s, size_t n) {
    if (!n) return true;
    if (n > J_OUT_MAX || b->n > J_OUT_MAX - n) {
        b->over = true;
        return false;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool jbuf_putc(jbuf *b, char c) { return jbuf_put(b, &c, 1); }
bool jbuf_puts(jbuf *b, const char *s) { return jbuf_put(b, s, strlen(s)); }

bool jbuf_printf(jbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return k >= 0 && (size_t)k < sizeof tmp && jbuf_put(b, tmp, (size_t)k);
}

void jbuf_free(jbuf *b) {
    free(b->p);
    *b = (jbuf){0};
}

/* ---- UTF-8 ---------------------------------------------------------- */

size_t ju_next(const char *s, size_t n, int32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned c = u[0];
    if (c < 0x80) {
        *cp = (int32_t)c;
        return 1;
    }
    size_t k = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
    if (c > 0xF4) k = 0;
    if (k && k <= n) {
        uint32_t v = c & (0xFF >> (k + 1));
        size_t i = 1;
        for (; i < k && (u[i] & 0xC0) == 0x80; i++) v = (v << 6) | (u[i] & 0x3F);
        if (i == k && !(k == 3 && (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF))) && !(k == 4 && (v < 0x10000 || v > 0x10FFFF))) {
            *cp = (int32_t)v;
            return k;
        }
    }
    *cp = 0xDC00 + (int32_t)c; /* a stray byte, kept as it is */
    return 1;
}

size_t ju_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; k++) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        int32_t cp;
        i += ju_next(s + i, n - i, &cp);
    }
    return k;
}

size_t ju_offset(const char *s, size_t n, size_t k) {
    size_t i = 0;
    while (k-- && i < n) {
        int32_t cp;
        i += (unsigned char)s[i] < 0x80 ? 1 : ju_next(s + i, n - i, &cp);
    }
    return i;
}

bool ju_put(jbuf *b, int32_t cp) {
    char o[4];
    size_t k;
    if (cp >= 0xDC80 && cp <= 0xDCFF) {
        o[0] = (char)(cp - 0xDC00); /* a stray byte from ju_next */
        k = 1;
    } else if (cp < 0x80) {
        o[0] = (char)cp;
        k = 1;
    } else if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        o[0] = (char)(0xF0 | (cp >> 18));
        o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[3] = (char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    return jbuf_put(b, o, k);
}

bool ju_isspace(int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Python str.isprintable for one code point */
static bool ju_printable(int32_t cp) {
    if (cp == ' ') return true;
    if (cp >= 0xDC80 && cp <= 0xDCFF) return false;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

/* ---- constructors --------------------------------------------------- */

spx_status jfail(jrt *r, const jnode *at, spx_status code, const char *fmt, ...) {
    char msg[SPX_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return jfail_at(r->e, r->t, at ? at->pos : 0, code, "%s", msg);
}

spx_status joom(jrt *r, const jnode *at) {
    if (r->arena.total + J_BLK_SIZE > r->arena.cap)
        return jfail(r, at, SPX_ERR_RANGE, "rendering needs more than %zu MiB of memory", J_ARENA_MAX >> 20);
    return jfail(r, at, SPX_ERR_NOMEM, "out of memory rendering the template");
}

jv *jv_new(jrt *r, jv_type t) {
    jv *v = ja_alloc(&r->arena, sizeof *v);
    if (v) v->type = (uint8_t)t;
    return v;
}

jv *jv_int(jrt *r, int64_t i) {
    jv *v = jv_new(r, JV_INT);
    if (v) v->i = i;
    return v;
}

jv *jv_float(jrt *r, double f) {
    jv *v = jv_new(r, JV_FLOAT);
    if (v) v->f = f;
    return v;
}

jv *jv_bool(bool b) { return b ? &jv_true : &jv_false; }

jv *jv_str(jrt *r, const char *s, size_t n) {
    jv *v = jv_new(r, JV_STR);
    char *p = v ? ja_alloc(&r->arena, n + 1) : NULL;
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    v->s = (jstr){p, n};
    return v;
}

jv *jv_strbuf(jrt *r, jbuf *b) {
    jv *v = jv_str(r, b->p ? b->p : "", b->n);
    jbuf_free(b);
    return v;
}

jv *jv_undef(jrt *r, const char *fmt, ...) {
    jv *v = jv_new(r, JV_UNDEF);
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    size_t n = strlen(tmp);
    char *h = v ? ja_alloc(&r->arena, n + 1) : NULL;
    if (!h) return NULL;
    memcpy(h, tmp, n + 1);
    v->u.hint = h;
    return v;
}

jv *jv_list(jrt *r, size_t cap) {
    jv *v = jv_new(r, JV_LIST);
    if (!v) return NULL;
    if (cap) {
        v->l.v = ja_alloc(&r->arena, cap * sizeof *v->l.v);
        if (!v->l.v) return NULL;
        v->l.cap = cap;
    }
    return v;
}

bool jv_push(jrt *r, jv *l, jv *x) {
    if (l->l.n == l->l.cap) {
        size_t cap = l->l.cap ? l->l.cap * 2 : 4;
        jv **nv = ja_alloc(&r->arena, cap * sizeof *nv);
        if (!nv) return false;
        if (l->l.n) memcpy(nv, l->l.v, l->l.n * sizeof *nv);
        l->l.v = nv;
        l->l.cap = cap;
    }
    l->l.v[l->l.n++] = x;
    return true;
}

static uint64_t hash_str(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

jv *jv_dict_gets(const jv *d, const char *k, size_t n) {
    if (d->d.h) {
        size_t mask = d->d.hcap - 1;
        for (size_t i = (size_t)hash_str(k, n) & mask;; i = (i + 1) & mask) {
            uint32_t e = d->d.h[i];
            if (!e) return NULL;
            const jv *key = d->d.k[e - 1];
            if (key->s.n == n && !memcmp(key->s.p, k, n)) return d->d.v[e - 1];
        }
    }
    for (size_t i = 0; i < d->d.n; i++) {
        const jv *key = d->d.k[i];
        if (key->type == JV_STR && key->s.n == n && !memcmp(key->s.p, k, n)) return d->d.v[i];
    }
    return NULL;
}

jv *jv_dict_get(const jv *d, const jv *k) {
    if (k->type == JV_STR) return jv_dict_gets(d, k->s.p, k->s.n);
    for (size_t i = 0; i < d->d.n; i++)
        if (jv_eq(d->d.k[i], k)) return d->d.v[i];
    return NULL;
}

static void hash_put(jv *d, size_t entry) {
    const jv *key = d->d.k[entry];
    size_t mask = d->d.hcap - 1, i = (size_t)hash_str(key->s.p, key->s.n) & mask;
    while (d->d.h[i]) i = (i + 1) & mask;
    d->d.h[i] = (uint32_t)(entry + 1);
}

/* Dicts of more than 8 keys get a hash index of their string keys, so
 * building and reading big JSON objects stays linear. */
static bool hash_index(jrt *r, jv *d) {
    if (d->d.n < 8 || d->d.n > UINT32_MAX / 4) return true;
    if (d->d.h && d->d.n * 2 <= d->d.hcap) {
        if (d->d.k[d->d.n - 1]->type == JV_STR) hash_put(d, d->d.n - 1);
        return true;
    }
    size_t cap = 16;
    while (cap < d->d.n * 4) cap *= 2;
    uint32_t *h = ja_alloc(&r->arena, cap * sizeof *h);
    if (!h) return false;
    d->d.h = h;
    d->d.hcap = cap;
    for (size_t i = 0; i < d->d.n; i++)
        if (d->d.k[i]->type == JV_STR) hash_put(d, i);
    return true;
}

bool jv_dict_set(jrt *r, jv *d, jv *k, jv *v) {
    if (k->type == JV_STR && d->d.h) {
        size_t mask = d->d.hcap - 1;
        for (size_t i = (size_t)hash_str(k->s.p, k->s.n) & mask; d->d.h[i]; i = (i + 1) & mask) {
            uint32_t e = d->d.h[i];
            const jv *key = d->d.k[e - 1];
            if (key->s.n == k->s.n && !memcmp(key->s.p, k->s.p, k->s.n)) {
                d->d.v[e - 1] = v;
                return true;
            }
        }
    } else {
        for (size_t i = 0; i < d->d.n; i++)
            if (jv_eq(d->d.k[i], k)) {
                d->d.v[i] = v;
                return true;
            }
    }
    if (d->d.n == d->d.cap) {
        size_t cap = d->d.cap ? d->d.cap * 2 : 4;
        jv **nk = ja_alloc(&r->arena, cap * sizeof *nk), **nv = ja_alloc(&r->arena, cap * sizeof *nv);
        if (!nk || !nv) return false;
        if (d->d.n) {
            memcpy(nk, d->d.k, d->d.n * sizeof *nk);
            memcpy(nv, d->d.v, d->d.n * sizeof *nv);
        }
        d->d.k = nk;
        d->d.v = nv;
        d->d.cap = cap;
    }
    d->d.k[d->d.n] = k;
    d->d.v[d->d.n++] = v;
    return hash_index(r, d);
}

/* ---- predicates ----------------------------------------------------- */

bool jv_truthy(const jv *v) {
    switch (v->type) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v->b;
    case JV_INT: return v->i != 0;
    case JV_FLOAT: return v->f != 0;
    case JV_STR: return v->s.n != 0;
    case JV_LIST: return v->l.n != 0 || (v->flags & JV_F_ITER);
    case JV_DICT: return v->d.n != 0;
    default: return true;
    }
}

bool jv_is_num(const jv *v) { return v->type == JV_INT || v->type == JV_FLOAT || v->type == JV_BOOL; }

double jv_num(const jv *v) {
    return v->type == JV_FLOAT ? v->f : v->type == JV_INT ? (double)v->i : v->type == JV_BOOL ? v->b : 0;
}

static int64_t jv_ival(const jv *v) { return v->type == JV_BOOL ? v->b : v->i; }

const char *jv_typename(const jv *v) {
    switch (v->type) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v->flags & JV_F_ITER ? "generator" : v->flags & JV_F_TUPLE ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "builtin_function_or_method";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

static bool eq_depth(const jv *a, const jv *b, int depth) {
    if (a == b) return true;
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT) return jv_ival(a) == jv_ival(b);
        return jv_num(a) == jv_num(b);
    }
    if (a->type != b->type || depth > J_VALUE_DEPTH) return false;
    switch (a->type) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a->s.n == b->s.n && !memcmp(a->s.p, b->s.p, a->s.n);
    case JV_LIST:
        if ((a->flags | b->flags) & JV_F_ITER) return false; /* a generator equals only itself */
        if ((a->flags & JV_F_TUPLE) != (b->flags & JV_F_TUPLE) || a->l.n != b->l.n) return false;
        for (size_t i = 0; i < a->l.n; i++)
            if (!eq_depth(a->l.v[i], b->l.v[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a->d.n != b->d.n) return false;
        for (size_t i = 0; i < a->d.n; i++) {
            const jv *o = jv_dict_get(b, a->d.k[i]);
            if (!o || !eq_depth(a->d.v[i], o, depth + 1)) return false;
        }
        return true;
    case JV_MACRO: return a->m.node == b->m.node && a->m.scope == b->m.scope;
    case JV_FUNC: return a->fn.fn == b->fn.fn && a->fn.self == b->fn.self;
    default: return false;
    }
}

bool jv_eq(const jv *a, const jv *b) { return eq_depth(a, b, 0); }

static spx_status cmp_depth(jrt *r, const jnode *at, const jv *a, const jv *b, int *out, int depth) {
    if (a->type == JV_UNDEF) return jv_undef_fail(r, at, a);
    if (b->type == JV_UNDEF) return jv_undef_fail(r, at, b);
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT) {
            int64_t x = jv_ival(a), y = jv_ival(b);
            *out = (x > y) - (x < y);
        } else {
            double x = jv_num(a), y = jv_num(b);
            *out = (x > y) - (x < y); /* NaN: 0, as no ordering holds */
        }
        return SPX_OK;
    }
    if (a->type == JV_STR && b->type == JV_STR) {
        size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
        int c = n ? memcmp(a->s.p, b->s.p, n) : 0;
        *out = c ? (c > 0) - (c < 0) : (a->s.n > b->s.n) - (a->s.n < b->s.n);
        return SPX_OK;
    }
    if (a->type == JV_LIST && b->type == JV_LIST && (a->flags & JV_F_TUPLE) == (b->flags & JV_F_TUPLE)) {
        if (depth > J_VALUE_DEPTH) return jfail(r, at, SPX_ERR_RANGE, "values nested deeper than %d levels", J_VALUE_DEPTH);
        for (size_t i = 0; i < a->l.n && i < b->l.n; i++) {
            if (jv_eq(a->l.v[i], b->l.v[i])) continue;
            return cmp_depth(r, at, a->l.v[i], b->l.v[i], out, depth + 1);
        }
        *out = (a->l.n > b->l.n) - (a->l.n < b->l.n);
        return SPX_OK;
    }
    return jfail(r, at, SPX_ERR_ARG, "ordering not supported between instances of '%s' and '%s'", jv_typename(a),
                 jv_typename(b));
}

spx_status jv_cmp(jrt *r, const jnode *at, const jv *a, const jv *b, int *out) {
    return cmp_depth(r, at, a, b, out, 0);
}

spx_status jv_undef_fail(jrt *r, const jnode *at, const jv *v) {
    return jfail(r, at, SPX_ERR_ARG, "%s", v->u.hint ? v->u.hint : "a value is undefined");
}

spx_status jv_iter(jrt *r, const jnode *at, jv *v, jv **out) {
    switch (v->type) {
    case JV_LIST: *out = v; return SPX_OK;
    case JV_UNDEF: *out = jv_list(r, 0); break;
    case JV_DICT: {
        jv *l = jv_list(r, v->d.n);
        if (!l) return joom(r, at);
        for (size_t i = 0; i < v->d.n; i++) l->l.v[i] = v->d.k[i];
        l->l.n = v->d.n;
        *out = l;
        break;
    }
    case JV_STR: {
        jv *l = jv_list(r, v->s.n);
        if (!l) return joom(r, at);
        for (size_t i = 0; i < v->s.n;) {
            int32_t cp;
            size_t k = ju_next(v->s.p + i, v->s.n - i, &cp);
            jv *c = jv_str(r, v->s.p + i, k);
            if (!c) return joom(r, at);
            l->l.v[l->l.n++] = c;
            i += k;
        }
        *out = l;
        break;
    }
    default:
        return jfail(r, at, SPX_ERR_ARG, "'%s' object is not iterable", jv_typename(v));
    }
    return *out ? SPX_OK : joom(r, at);
}

spx_status jv_len(jrt *r, const jnode *at, const jv *v, int64_t *out) {
    switch (v->type) {
    case JV_STR: *out = (int64_t)ju_len(v->s.p, v->s.n); return SPX_OK;
    case JV_LIST:
        if (v->flags & JV_F_ITER) break;
        *out = (int64_t)v->l.n;
        return SPX_OK;
    case JV_DICT: *out = (int64_t)v->d.n; return SPX_OK;
    case JV_UNDEF: *out = 0; return SPX_OK;
    default: break;
    }
    return jfail(r, at, SPX_ERR_ARG, "object of type '%s' has no len()", jv_typename(v));
}
/* ---- printing ------------------------------------------------------- */

void jfmt_float(double f, char *out, size_t cap) {
    if (isnan(f)) { snprintf(out, cap, "nan"); return; }
    if (isinf(f)) { snprintf(out, cap, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { snprintf(out, cap, signbit(f) ? "-0.0" : "0.0"); return; }
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    const char *s = buf;
    bool neg = *s == '-';
    if (neg) s++;
    char dig[24];
    size_t nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') dig[nd++] = *s;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    dig[nd] = 0;
    int exp10 = atoi(s + 1);
    int decpt = exp10 + 1;
    char *o = out;
    size_t left = cap;
#define EMIT(...)                                            \
    do {                                                     \
        int k_ = snprintf(o, left, __VA_ARGS__);             \
        if (k_ < 0 || (size_t)k_ >= left) return;            \
        o += k_, left -= (size_t)k_;                         \
    } while (0)
    if (neg) EMIT("-");
    if (decpt > 16 || decpt <= -4) {
        EMIT("%c", dig[0]);
        if (nd > 1) EMIT(".%s", dig + 1);
        int x = decpt - 1;
        EMIT("e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    } else if (decpt <= 0) {
        EMIT("0.");
        for (int i = 0; i < -decpt; i++) EMIT("0");
        EMIT("%s", dig);
    } else if ((size_t)decpt >= nd) {
        EMIT("%s", dig);
        for (size_t i = nd; i < (size_t)decpt; i++) EMIT("0");
        EMIT(".0");
    } else {
        EMIT("%.*s.%s", decpt, dig, dig + decpt);
    }
#undef EMIT
}

static bool put_repr_str(jbuf *b, jstr s) {
    bool has_sq = memchr(s.p, '\'', s.n) != NULL, has_dq = memchr(s.p, '"', s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    if (!jbuf_putc(b, q)) return false;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        size_t k = ju_next(s.p + i, s.n - i, &cp);
        bool ok;
        if (cp == q || cp == '\\') ok = jbuf_putc(b, '\\') && jbuf_putc(b, (char)cp);
        else if (cp == '\t') ok = jbuf_puts(b, "\\t");
        else if (cp == '\n') ok = jbuf_puts(b, "\\n");
        else if (cp == '\r') ok = jbuf_puts(b, "\\r");
        else if (cp < 0x20 || cp == 0x7F) ok = jbuf_printf(b, "\\x%02x", (unsigned)cp);
        else if (cp < 0x7F || ju_printable(cp)) ok = jbuf_put(b, s.p + i, k);
        else if (cp <= 0xFF) ok = jbuf_printf(b, "\\x%02x", (unsigned)cp);
        else if (cp <= 0xFFFF) ok = jbuf_printf(b, "\\u%04x", (unsigned)cp);
        else ok = jbuf_printf(b, "\\U%08x", (unsigned)cp);
        if (!ok) return false;
        i += k;
    }
    return jbuf_putc(b, q);
}

spx_status jbuf_fail(jrt *r, const jnode *at, const jbuf *b) {
    if (b->over) return jfail(r, at, SPX_ERR_RANGE, "rendered text longer than %zu MiB", J_OUT_MAX >> 20);
    return jfail(r, at, SPX_ERR_NOMEM, "out of memory rendering the template");
}

static spx_status repr_depth(jrt *r, const jnode *at, const jv *v, jbuf *b, bool top, int depth);

static spx_status repr_dict(jrt *r, const jnode *at, const jv *v, jbuf *b, int depth) {
    if (!jbuf_putc(b, '{')) return jbuf_fail(r, at, b);
    for (size_t i = 0; i < v->d.n; i++) {
        if (i && !jbuf_puts(b, ", ")) return jbuf_fail(r, at, b);
        SPX_TRY(repr_depth(r, at, v->d.k[i], b, false, depth + 1));
        if (!jbuf_puts(b, ": ")) return jbuf_fail(r, at, b);
        SPX_TRY(repr_depth(r, at, v->d.v[i], b, false, depth + 1));
    }
    return jbuf_putc(b, '}') ? SPX_OK : jbuf_fail(r, at, b);
}

/* top: str() of v, else repr() */
static spx_status repr_depth(jrt *r, const jnode *at, const jv *v, jbuf *b, bool top, int depth) {
    if (depth > J_VALUE_DEPTH) return jfail(r, at, SPX_ERR_RANGE, "values nested deeper than %d levels", J_VALUE_DEPTH);
    bool ok = true;
    char num[64];
    switch (v->type) {
    case JV_UNDEF: ok = top ? true : jbuf_puts(b, "Undefined"); break;
    case JV_NONE: ok = jbuf_puts(b, "None"); break;
    case JV_BOOL: ok = jbuf_puts(b, v->b ? "True" : "False"); break;
    case JV_INT: ok = jbuf_printf(b, "%lld", (long long)v->i); break;
    case JV_FLOAT: jfmt_float(v->f, num, sizeof num); ok = jbuf_puts(b, num); break;
    case JV_STR:
        if (top) ok = jbuf_put(b, v->s.p, v->s.n);
        else if (v->flags & JV_F_SAFE) ok = jbuf_puts(b, "Markup(") && put_repr_str(b, v->s) && jbuf_putc(b, ')');
        else ok = put_repr_str(b, v->s);
        break;
    case JV_LIST: {
        bool tup = v->flags & JV_F_TUPLE;
        if (v->flags & JV_F_RANGE)
            return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported: printing a range() (use |list)");
        if (v->flags & JV_F_ITER)
            return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported: printing a generator (Python prints its address; use |list)");
        if (!jbuf_putc(b, tup ? '(' : '[')) return jbuf_fail(r, at, b);
        for (size_t i = 0; i < v->l.n; i++) {
            if (i && !jbuf_puts(b, ", ")) return jbuf_fail(r, at, b);
            SPX_TRY(repr_depth(r, at, v->l.v[i], b, false, depth + 1));
        }
        ok = (!tup || v->l.n != 1 || jbuf_putc(b, ',')) && jbuf_putc(b, tup ? ')' : ']');
        break;
    }
    case JV_DICT: return repr_dict(r, at, v, b, depth);
    case JV_NS:
        if (!jbuf_puts(b, "<Namespace ")) return jbuf_fail(r, at, b);
        SPX_TRY(repr_dict(r, at, v, b, depth));
        ok = jbuf_putc(b, '>');
        break;
    default:
        return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported: printing a %s object (Python prints its address)",
                     jv_typename(v));
    }
    return ok ? SPX_OK : jbuf_fail(r, at, b);
}

spx_status jv_to_str(jrt *r, const jnode *at, const jv *v, jbuf *b) { return repr_depth(r, at, v, b, true, 0); }
spx_status jv_repr(jrt *r, const jnode *at, const jv *v, jbuf *b) { return repr_depth(r, at, v, b, false, 0); }

spx_status jv_str_of(jrt *r, const jnode *at, jv *v, jv **out) {
    if (v->type == JV_STR) {
        *out = v;
        return SPX_OK;
    }
    jbuf b = {0};
    spx_status st = jv_to_str(r, at, v, &b);
    if (st) {
        jbuf_free(&b);
        return st;
    }
    *out = jv_strbuf(r, &b);
    return *out ? SPX_OK : joom(r, at);
}
