/* jinja_builtins.c: jinja2's filters and tests, the globals of
 * transformers' chat template environment, and the name tables.
 *
 * Each follows jinja2 3.1's implementation (jinja2/filters.py, tests.py)
 * with autoescape off; tojson is transformers' (json.dumps with
 * ensure_ascii=False and its indent/separators/sort_keys arguments), not
 * jinja2's HTML-safe one. Filters that jinja2 implements as generators
 * (map, select, reject, selectattr, rejectattr, reverse of a list) return
 * a list marked JV_F_ITER, which keeps the generator's behaviour where it
 * shows: always true, no len(), no indexing, not printable. Filters and
 * tests not listed here fail at parse time. */
#include "chat/jinja.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#define FN(name) static spx_status name(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out)
#define RET(x)                               \
    do {                                     \
        *out = (x);                          \
        return *out ? SPX_OK : joom(r, at);  \
    } while (0)

static spx_status str_arg(jrt *r, const jnode *at, const char *fname, const jv *v, jstr *out) {
    if (v->type == JV_STR) {
        *out = v->s;
        return SPX_OK;
    }
    if (v->type == JV_UNDEF) return jv_undef_fail(r, at, v);
    return jfail(r, at, SPX_ERR_ARG, "%s: expected a string, got %s", fname, jv_typename(v));
}

static bool int_like(const jv *v) { return v->type == JV_INT || v->type == JV_BOOL; }
static int64_t ival(const jv *v) { return v->type == JV_BOOL ? v->b : v->i; }

/* str(v) */
static spx_status soft_str(jrt *r, const jnode *at, jv *v, jstr *out) {
    jv *s;
    SPX_TRY(jv_str_of(r, at, v, &s));
    *out = s->s;
    return SPX_OK;
}

static jv *as_iter(jrt *r, jv *list) {
    if (list) list->flags |= JV_F_ITER;
    return list;
}

/* jinja2's make_attrgetter: a dotted path of items (integer parts index) */
static spx_status attr_path(jrt *r, const jnode *at, jv *item, const jv *path, jv **out) {
    if (path->type == JV_INT) return jgetitem(r, at, item, (jv *)path, out);
    jstr p;
    SPX_TRY(str_arg(r, at, "attribute", path, &p));
    jv *cur = item;
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < p.n && p.p[j] != '.') j++;
        jv *key;
        bool digits = j > i;
        for (size_t k = i; k < j; k++) digits = digits && p.p[k] >= '0' && p.p[k] <= '9';
        if (digits && j - i < 18) {
            int64_t x = 0;
            for (size_t k = i; k < j; k++) x = x * 10 + (p.p[k] - '0');
            key = jv_int(r, x);
        } else {
            key = jv_str(r, p.p + i, j - i);
        }
        if (!key) return joom(r, at);
        SPX_TRY(jgetitem(r, at, cur, key, &cur));
        if (j >= p.n) break;
        i = j + 1;
    }
    *out = cur;
    return SPX_OK;
}

/* ---- filters ---------------------------------------------------------- */

FN(f_default) {
    jv *p[2];
    SPX_TRY(jbind(r, at, "default", a, "default_value,boolean", p, 2));
    jv *dv = p[0] ? p[0] : NULL;
    bool boolean = p[1] && jv_truthy(p[1]);
    if (self->type == JV_UNDEF || (boolean && !jv_truthy(self))) {
        if (dv) RET(dv);
        RET(jv_str(r, "", 0));
    }
    RET(self);
}

FN(f_length) {
    SPX_TRY(jbind(r, at, "length", a, "", NULL, 0));
    if (self->type == JV_LIST && (self->flags & JV_F_ITER))
        return jfail(r, at, SPX_ERR_ARG, "object of type 'generator' has no len() (use |list first)");
    int64_t n;
    SPX_TRY(jv_len(r, at, self, &n));
    RET(jv_int(r, n));
}

static spx_status indent_str(jrt *r, const jnode *at, const jv *v, const char **out) {
    char buf[32];
    if (!v || v->type == JV_NONE) {
        *out = NULL;
        return SPX_OK;
    }
    if (v->type == JV_STR) {
        char *s = ja_alloc(&r->arena, v->s.n + 1);
        if (!s) return joom(r, at);
        memcpy(s, v->s.p, v->s.n);
        *out = s;
        return SPX_OK;
    }
    if (!int_like(v)) return jfail(r, at, SPX_ERR_ARG, "tojson: indent must be an integer, a string or None");
    int64_t k = ival(v);
    if (k > 64) return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported: tojson indent above 64");
    if (k < 0) k = 0;
    memset(buf, ' ', (size_t)k);
    buf[k] = 0;
    char *s = ja_alloc(&r->arena, (size_t)k + 1);
    if (!s) return joom(r, at);
    memcpy(s, buf, (size_t)k + 1);
    *out = s;
    return SPX_OK;
}

static const char *arena_cstr(jrt *r, jstr s) {
    char *p = ja_alloc(&r->arena, s.n + 1);
    if (p && s.n) memcpy(p, s.p, s.n);
    return p;
}

FN(f_tojson) {
    jv *p[4];
    SPX_TRY(jbind(r, at, "tojson", a, "ensure_ascii,indent,separators,sort_keys", p, 4));
    const char *indent = NULL, *isep = NULL, *ksep = NULL;
    SPX_TRY(indent_str(r, at, p[1], &indent));
    if (p[2] && p[2]->type != JV_NONE) {
        if (p[2]->type != JV_LIST || p[2]->l.n != 2 || p[2]->l.v[0]->type != JV_STR || p[2]->l.v[1]->type != JV_STR)
            return jfail(r, at, SPX_ERR_ARG, "tojson: separators must be a pair of strings");
        isep = arena_cstr(r, p[2]->l.v[0]->s);
        ksep = arena_cstr(r, p[2]->l.v[1]->s);
        if (!isep || !ksep) return joom(r, at);
    }
    jbuf b = {0};
    spx_status st = jv_tojson(r, at, self, indent, isep, ksep, p[3] && jv_truthy(p[3]), p[0] && jv_truthy(p[0]), &b);
    if (st) {
        jbuf_free(&b);
        return st;
    }
    RET(jv_strbuf(r, &b));
}

FN(f_trim) {
    jv *p[1];
    jstr s, chars;
    SPX_TRY(jbind(r, at, "trim", a, "chars", p, 1));
    SPX_TRY(soft_str(r, at, self, &s));
    if (p[0] && p[0]->type != JV_NONE) {
        SPX_TRY(str_arg(r, at, "trim", p[0], &chars));
        RET(js_strip(r, s, &chars, 3));
    }
    RET(js_strip(r, s, NULL, 3));
}

static spx_status case_filter(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out, char mode) {
    jstr s;
    SPX_TRY(jbind(r, at, "case filter", a, "", NULL, 0));
    SPX_TRY(soft_str(r, at, self, &s));
    RET(js_case(r, s, mode));
}
FN(f_upper) { return case_filter(r, at, self, a, out, 'u'); }
FN(f_lower) { return case_filter(r, at, self, a, out, 'l'); }
FN(f_title) { return case_filter(r, at, self, a, out, 'j'); }
FN(f_capitalize) { return case_filter(r, at, self, a, out, 'c'); }

FN(f_join) {
    jv *p[2], *items;
    jstr d = {"", 0};
    SPX_TRY(jbind(r, at, "join", a, "d,attribute", p, 2));
    if (p[0]) SPX_TRY(soft_str(r, at, p[0], &d));
    SPX_TRY(jv_iter(r, at, self, &items));
    jbuf b = {0};
    spx_status st = SPX_OK;
    for (size_t i = 0; i < items->l.n && !st; i++) {
        jv *x = items->l.v[i];
        if (p[1] && p[1]->type != JV_NONE) st = attr_path(r, at, x, p[1], &x);
        if (!st && i && !jbuf_put(&b, d.p, d.n)) st = joom(r, at);
        if (!st) st = jv_to_str(r, at, x, &b);
    }
    if (st) {
        jbuf_free(&b);
        return st;
    }
    RET(jv_strbuf(r, &b));
}

FN(f_replace) {
    jv *p[3];
    jstr s, o, n;
    SPX_TRY(jbind(r, at, "replace", a, "old,new,count", p, 3));
    if (!p[0] || !p[1]) return jfail(r, at, SPX_ERR_ARG, "replace() takes at least 2 arguments");
    SPX_TRY(soft_str(r, at, self, &s));
    SPX_TRY(soft_str(r, at, p[0], &o));
    SPX_TRY(soft_str(r, at, p[1], &n));
    int64_t c = -1;
    if (p[2] && p[2]->type != JV_NONE) {
        if (!int_like(p[2])) return jfail(r, at, SPX_ERR_ARG, "replace: count must be an integer");
        c = ival(p[2]);
    }
    return js_replace(r, at, s, o, n, c, out);
}

FN(f_first) {
    jv *items;
    SPX_TRY(jbind(r, at, "first", a, "", NULL, 0));
    SPX_TRY(jv_iter(r, at, self, &items));
    if (items->l.n) RET(items->l.v[0]);
    RET(jv_undef(r, "No first item, sequence was empty."));
}

FN(f_last) {
    jv *items;
    SPX_TRY(jbind(r, at, "last", a, "", NULL, 0));
    if (self->type == JV_UNDEF || (self->flags & JV_F_ITER && self->type == JV_LIST))
        return jfail(r, at, SPX_ERR_ARG, "last: '%s' object is not reversible", self->type == JV_UNDEF ? "Undefined" : "generator");
    SPX_TRY(jv_iter(r, at, self, &items));
    if (items->l.n) RET(items->l.v[items->l.n - 1]);
    RET(jv_undef(r, "No last item, sequence was empty."));
}

FN(f_list) {
    jv *items;
    SPX_TRY(jbind(r, at, "list", a, "", NULL, 0));
    SPX_TRY(jv_iter(r, at, self, &items));
    jv *l = jv_list(r, items->l.n);
    if (!l) return joom(r, at);
    if (items->l.n) memcpy(l->l.v, items->l.v, items->l.n * sizeof *l->l.v);
    l->l.n = items->l.n;
    RET(l);
}

FN(f_string) {
    jv *s;
    SPX_TRY(jbind(r, at, "string", a, "", NULL, 0));
    SPX_TRY(jv_str_of(r, at, self, &s));
    RET(s);
}

/* Python float(str): surrounding whitespace allowed, the whole text a number */
static bool parse_float(jstr s, double *out) {
    char tmp[128];
    size_t lo = 0, hi = s.n;
    while (lo < hi && ju_isspace((unsigned char)s.p[lo])) lo++;
    while (hi > lo && ju_isspace((unsigned char)s.p[hi - 1])) hi--;
    if (hi == lo || hi - lo >= sizeof tmp) return false;
    size_t k = 0;
    for (size_t i = lo; i < hi; i++) {
        char c = s.p[i];
        if (c == '_') {
            if (i == lo || i + 1 == hi || !(s.p[i - 1] >= '0' && s.p[i - 1] <= '9') || !(s.p[i + 1] >= '0' && s.p[i + 1] <= '9'))
                return false;
            continue;
        }
        if (c == 'x' || c == 'X' || c == 'p' || c == 'P') return false; /* no hex floats in Python */
        tmp[k++] = c;
    }
    tmp[k] = 0;
    char *end;
    *out = strtod(tmp, &end);
    return end != tmp && *end == 0;
}

static bool parse_int(jstr s, int base, int64_t *out) {
    size_t lo = 0, hi = s.n;
    while (lo < hi && ju_isspace((unsigned char)s.p[lo])) lo++;
    while (hi > lo && ju_isspace((unsigned char)s.p[hi - 1])) hi--;
    bool neg = false;
    if (lo < hi && (s.p[lo] == '+' || s.p[lo] == '-')) neg = s.p[lo++] == '-';
    if (lo + 1 < hi && s.p[lo] == '0' && base != 10) {
        char x = (char)(s.p[lo + 1] | 0x20);
        if ((base == 16 && x == 'x') || (base == 8 && x == 'o') || (base == 2 && x == 'b')) lo += 2;
    }
    if (lo >= hi) return false;
    uint64_t v = 0;
    for (size_t i = lo; i < hi; i++) {
        char c = s.p[i];
        if (c == '_' && i > lo && i + 1 < hi && s.p[i - 1] != '_') continue;
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    if (v > (uint64_t)INT64_MAX + neg) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

FN(f_int) {
    jv *p[2];
    SPX_TRY(jbind(r, at, "int", a, "default,base", p, 2));
    jv *dflt = p[0] ? p[0] : NULL;
    int64_t base = p[1] && int_like(p[1]) ? ival(p[1]) : 10;
    int64_t v;
    double f;
    switch (self->type) {
    case JV_INT: RET(self);
    case JV_BOOL: RET(jv_int(r, self->b));
    case JV_FLOAT:
        if (isfinite(self->f) && fabs(self->f) < 9.2e18) RET(jv_int(r, (int64_t)self->f));
        break;
    case JV_STR:
        if (base >= 2 && base <= 36 && parse_int(self->s, (int)base, &v)) RET(jv_int(r, v));
        if (parse_float(self->s, &f) && isfinite(f) && fabs(f) < 9.2e18) RET(jv_int(r, (int64_t)f));
        break;
    case JV_UNDEF: return jv_undef_fail(r, at, self);
    default: break;
    }
    if (dflt) RET(dflt);
    RET(jv_int(r, 0));
}

FN(f_float) {
    jv *p[1];
    SPX_TRY(jbind(r, at, "float", a, "default", p, 1));
    double f;
    switch (self->type) {
    case JV_FLOAT: RET(self);
    case JV_INT: case JV_BOOL: RET(jv_float(r, (double)ival(self)));
    case JV_STR:
        if (parse_float(self->s, &f)) RET(jv_float(r, f));
        break;
    case JV_UNDEF: return jv_undef_fail(r, at, self);
    default: break;
    }
    if (p[0]) RET(p[0]);
    RET(jv_float(r, 0.0));
}

FN(f_items) {
    SPX_TRY(jbind(r, at, "items", a, "", NULL, 0));
    if (self->type == JV_UNDEF) RET(jv_list(r, 0));
    if (self->type != JV_DICT) return jfail(r, at, SPX_ERR_ARG, "Can only get item pairs from a mapping.");
    jv *l = jv_list(r, self->d.n);
    if (!l) return joom(r, at);
    for (size_t i = 0; i < self->d.n; i++) {
        jv *t = jv_list(r, 2);
        if (!t) return joom(r, at);
        t->flags = JV_F_TUPLE;
        t->l.v[0] = self->d.k[i];
        t->l.v[1] = self->d.v[i];
        t->l.n = 2;
        l->l.v[l->l.n++] = t;
    }
    RET(l);
}

/* runs the test named by name on x with extra args */
static spx_status run_test(jrt *r, const jnode *at, const jv *name, jv *x, jv **extra, size_t nextra, bool *out) {
    jstr n;
    SPX_TRY(str_arg(r, at, "test name", name, &n));
    const jbuiltin *b = jb_find(JB_TEST, n.p, n.n);
    if (!b) return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported test '%.*s'", (int)n.n, n.p);
    jargs ta = {.pos = extra, .npos = nextra};
    jv *res;
    SPX_TRY(b->fn(r, at, x, &ta, &res));
    *out = jv_truthy(res);
    return SPX_OK;
}

/* select / reject / selectattr / rejectattr */
static spx_status select_common(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out, bool attr, bool keep) {
    const char *fname = attr ? (keep ? "selectattr" : "rejectattr") : (keep ? "select" : "reject");
    if (a->nkw) return jfail(r, at, SPX_ERR_ARG, "%s() takes no keyword arguments", fname);
    size_t k = attr ? 1 : 0;
    if (attr && !a->npos) return jfail(r, at, SPX_ERR_ARG, "%s() needs an attribute name", fname);
    jv *items, *l = jv_list(r, 0);
    if (!l) return joom(r, at);
    SPX_TRY(jv_iter(r, at, self, &items));
    for (size_t i = 0; i < items->l.n; i++) {
        jv *x = items->l.v[i], *v = x;
        if (attr) SPX_TRY(attr_path(r, at, x, a->pos[0], &v));
        bool ok = false;
        if (a->npos > k) SPX_TRY(run_test(r, at, a->pos[k], v, a->pos + k + 1, a->npos - k - 1, &ok));
        else ok = jv_truthy(v);
        if (ok == keep && !jv_push(r, l, x)) return joom(r, at);
    }
    RET(as_iter(r, l));
}
FN(f_select) { return select_common(r, at, self, a, out, false, true); }
FN(f_reject) { return select_common(r, at, self, a, out, false, false); }
FN(f_selectattr) { return select_common(r, at, self, a, out, true, true); }
FN(f_rejectattr) { return select_common(r, at, self, a, out, true, false); }

FN(f_map) {
    jv *items, *l = jv_list(r, 0);
    if (!l) return joom(r, at);
    SPX_TRY(jv_iter(r, at, self, &items));
    jv *attr = NULL, *dflt = NULL;
    for (size_t k = 0; k < a->nkw; k++) {
        jstr n = a->kwn[k];
        if (n.n == 9 && !memcmp(n.p, "attribute", 9)) attr = a->kwv[k];
        else if (n.n == 7 && !memcmp(n.p, "default", 7)) dflt = a->kwv[k];
        else if (!a->npos) return jfail(r, at, SPX_ERR_ARG, "map() got an unexpected keyword argument '%.*s'", (int)n.n, n.p);
    }
    if (attr) {
        if (a->npos) return jfail(r, at, SPX_ERR_ARG, "map(attribute=...) takes no positional arguments");
        for (size_t i = 0; i < items->l.n; i++) {
            jv *v;
            SPX_TRY(attr_path(r, at, items->l.v[i], attr, &v));
            if (v->type == JV_UNDEF && dflt) v = dflt;
            if (!jv_push(r, l, v)) return joom(r, at);
        }
        RET(as_iter(r, l));
    }
    if (!a->npos) return jfail(r, at, SPX_ERR_ARG, "map() needs a filter name or attribute=");
    jstr fname;
    SPX_TRY(str_arg(r, at, "map", a->pos[0], &fname));
    const jbuiltin *b = jb_find(JB_FILTER, fname.p, fname.n);
    if (!b) return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported filter '%.*s' (in map)", (int)fname.n, fname.p);
    jargs fa = {.pos = a->pos + 1, .npos = a->npos - 1, .kwn = a->kwn, .kwv = a->kwv, .nkw = a->nkw};
    for (size_t i = 0; i < items->l.n; i++) {
        jv *v;
        SPX_TRY(b->fn(r, at, items->l.v[i], &fa, &v));
        if (!jv_push(r, l, v)) return joom(r, at);
    }
    RET(as_iter(r, l));
}

/* sort key: the attribute (or the item), lowercased when a string and not case-sensitive */
static spx_status sort_key(jrt *r, const jnode *at, jv *x, const jv *attr, bool cs, jv **out) {
    jv *v = x;
    if (attr && attr->type != JV_NONE) SPX_TRY(attr_path(r, at, x, attr, &v));
    if (!cs && v->type == JV_STR && !(v = js_case(r, v->s, 'l'))) return joom(r, at);
    *out = v;
    return SPX_OK;
}

/* stable merge sort of idx by keys; comparison errors propagate */
static spx_status msort(jrt *r, const jnode *at, jv **keys, size_t *idx, size_t *tmp, size_t n, bool rev) {
    if (n < 2) return SPX_OK;
    size_t h = n / 2;
    SPX_TRY(msort(r, at, keys, idx, tmp, h, rev));
    SPX_TRY(msort(r, at, keys, idx + h, tmp, n - h, rev));
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c;
        SPX_TRY(jv_cmp(r, at, keys[idx[j]], keys[idx[i]], &c));
        /* take the right one only when strictly before (Python's sort is stable, reverse too) */
        bool right = rev ? c > 0 : c < 0;
        tmp[k++] = right ? idx[j++] : idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
    return SPX_OK;
}

static spx_status sorted(jrt *r, const jnode *at, jv *items, jv **keys, bool rev, jv **out) {
    size_t n = items->l.n;
    size_t *idx = ja_alloc(&r->arena, (n ? n : 1) * sizeof *idx), *tmp = ja_alloc(&r->arena, (n ? n : 1) * sizeof *tmp);
    jv *l = jv_list(r, n);
    if (!idx || !tmp || !l) return joom(r, at);
    for (size_t i = 0; i < n; i++) idx[i] = i;
    SPX_TRY(msort(r, at, keys, idx, tmp, n, rev));
    for (size_t i = 0; i < n; i++) l->l.v[i] = items->l.v[idx[i]];
    l->l.n = n;
    *out = l;
    return SPX_OK;
}

FN(f_sort) {
    jv *p[3], *items;
    SPX_TRY(jbind(r, at, "sort", a, "reverse,case_sensitive,attribute", p, 3));
    SPX_TRY(jv_iter(r, at, self, &items));
    jv **keys = ja_alloc(&r->arena, (items->l.n ? items->l.n : 1) * sizeof *keys);
    if (!keys) return joom(r, at);
    if (p[2] && p[2]->type == JV_STR && memchr(p[2]->s.p, ',', p[2]->s.n))
        return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported: sort by several attributes");
    for (size_t i = 0; i < items->l.n; i++)
        SPX_TRY(sort_key(r, at, items->l.v[i], p[2], p[1] && jv_truthy(p[1]), &keys[i]));
    return sorted(r, at, items, keys, p[0] && jv_truthy(p[0]), out);
}

FN(f_dictsort) {
    jv *p[3], *items;
    SPX_TRY(jbind(r, at, "dictsort", a, "case_sensitive,by,reverse", p, 3));
    if (self->type != JV_DICT) return jfail(r, at, SPX_ERR_ARG, "dictsort: expected a mapping, got %s", jv_typename(self));
    bool by_value = false;
    if (p[1]) {
        jstr by;
        SPX_TRY(str_arg(r, at, "dictsort", p[1], &by));
        if (by.n == 5 && !memcmp(by.p, "value", 5)) by_value = true;
        else if (!(by.n == 3 && !memcmp(by.p, "key", 3)))
            return jfail(r, at, SPX_ERR_ARG, "You can only sort by either \"key\" or \"value\"");
    }
    jargs none = {0};
    SPX_TRY(jcall_builtin(r, at, jb_find(JB_FILTER, "items", 5), self, &none, &items));
    jv **keys = ja_alloc(&r->arena, (items->l.n ? items->l.n : 1) * sizeof *keys);
    if (!keys) return joom(r, at);
    for (size_t i = 0; i < items->l.n; i++)
        SPX_TRY(sort_key(r, at, items->l.v[i]->l.v[by_value], NULL, p[0] && jv_truthy(p[0]), &keys[i]));
    return sorted(r, at, items, keys, p[2] && jv_truthy(p[2]), out);
}

FN(f_unique) {
    jv *p[2], *items, *l = jv_list(r, 0);
    SPX_TRY(jbind(r, at, "unique", a, "case_sensitive,attribute", p, 2));
    if (!l) return joom(r, at);
    SPX_TRY(jv_iter(r, at, self, &items));
    jv *seen = jv_list(r, 0);
    if (!seen) return joom(r, at);
    for (size_t i = 0; i < items->l.n; i++) {
        jv *k;
        SPX_TRY(sort_key(r, at, items->l.v[i], p[1], p[0] && jv_truthy(p[0]), &k));
        bool dup = false;
        for (size_t j = 0; j < seen->l.n && !dup; j++) dup = jv_eq(seen->l.v[j], k);
        if (dup) continue;
        if (!jv_push(r, seen, k) || !jv_push(r, l, items->l.v[i])) return joom(r, at);
    }
    RET(as_iter(r, l));
}

FN(f_reverse) {
    SPX_TRY(jbind(r, at, "reverse", a, "", NULL, 0));
    if (self->type == JV_STR) {
        jv *items;
        SPX_TRY(jv_iter(r, at, self, &items));
        jbuf b = {0};
        for (size_t i = items->l.n; i-- > 0;)
            if (!jbuf_put(&b, items->l.v[i]->s.p, items->l.v[i]->s.n)) {
                jbuf_free(&b);
                return joom(r, at);
            }
        RET(jv_strbuf(r, &b));
    }
    if (self->type == JV_UNDEF) return jv_undef_fail(r, at, self);
    jv *items;
    SPX_TRY(jv_iter(r, at, self, &items));
    jv *l = jv_list(r, items->l.n);
    if (!l) return joom(r, at);
    for (size_t i = items->l.n; i-- > 0;) l->l.v[l->l.n++] = items->l.v[i];
    RET(as_iter(r, l));
}

FN(f_indent) {
    jv *p[3];
    SPX_TRY(jbind(r, at, "indent", a, "width,first,blank", p, 3));
    if (self->type == JV_UNDEF) return jv_undef_fail(r, at, self);
    jstr s, ind;
    char sp[256];
    if (p[0] && p[0]->type == JV_STR) {
        ind = p[0]->s;
    } else {
        int64_t w = p[0] ? (int_like(p[0]) ? ival(p[0]) : -1) : 4;
        if (w < 0 || w > 255) return jfail(r, at, SPX_ERR_ARG, "indent: width must be a string or an integer in [0, 255]");
        memset(sp, ' ', (size_t)w);
        ind = (jstr){sp, (size_t)w};
    }
    SPX_TRY(soft_str(r, at, self, &s));
    /* jinja2 appends "\n" before splitlines() so a trailing newline survives */
    jbuf t = {0};
    if (!jbuf_put(&t, s.p, s.n) || !jbuf_putc(&t, '\n')) {
        jbuf_free(&t);
        return joom(r, at);
    }
    jv *lines;
    spx_status st = js_splitlines(r, at, (jstr){t.p, t.n}, false, &lines);
    jbuf_free(&t);
    if (st) return st;
    jbuf b = {0};
    bool ok = true, blank = p[2] && jv_truthy(p[2]);
    if (p[1] && jv_truthy(p[1])) ok = jbuf_put(&b, ind.p, ind.n);
    for (size_t i = 0; i < lines->l.n && ok; i++) {
        jstr ln = lines->l.v[i]->s;
        if (i) ok = jbuf_putc(&b, '\n') && (blank || ln.n ? jbuf_put(&b, ind.p, ind.n) : true);
        ok = ok && jbuf_put(&b, ln.p, ln.n);
    }
    if (!ok) {
        jbuf_free(&b);
        return joom(r, at);
    }
    RET(jv_strbuf(r, &b));
}

FN(f_safe) {
    jstr s;
    SPX_TRY(jbind(r, at, "safe", a, "", NULL, 0));
    SPX_TRY(soft_str(r, at, self, &s));
    jv *v = jv_str(r, s.p, s.n);
    if (v) v->flags |= JV_F_SAFE;
    RET(v);
}

FN(f_escape) {
    jstr s;
    SPX_TRY(jbind(r, at, "escape", a, "", NULL, 0));
    if (self->type == JV_STR && (self->flags & JV_F_SAFE)) RET(self);
    SPX_TRY(soft_str(r, at, self, &s));
    jbuf b = {0};
    bool ok = true;
    for (size_t i = 0; i < s.n && ok; i++) {
        switch (s.p[i]) {
        case '&': ok = jbuf_puts(&b, "&amp;"); break;
        case '<': ok = jbuf_puts(&b, "&lt;"); break;
        case '>': ok = jbuf_puts(&b, "&gt;"); break;
        case '\'': ok = jbuf_puts(&b, "&#39;"); break;
        case '"': ok = jbuf_puts(&b, "&#34;"); break;
        default: ok = jbuf_putc(&b, s.p[i]);
        }
    }
    if (!ok) {
        jbuf_free(&b);
        return joom(r, at);
    }
    jv *v = jv_strbuf(r, &b);
    if (v) v->flags |= JV_F_SAFE;
    RET(v);
}

FN(f_abs) {
    SPX_TRY(jbind(r, at, "abs", a, "", NULL, 0));
    if (self->type == JV_FLOAT) RET(jv_float(r, fabs(self->f)));
    if (int_like(self)) {
        int64_t v = ival(self);
        if (v == INT64_MIN) return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported: integer beyond 64 bits");
        RET(jv_int(r, v < 0 ? -v : v));
    }
    if (self->type == JV_UNDEF) return jv_undef_fail(r, at, self);
    return jfail(r, at, SPX_ERR_ARG, "bad operand type for abs(): '%s'", jv_typename(self));
}

FN(f_round) {
    jv *p[2];
    SPX_TRY(jbind(r, at, "round", a, "precision,method", p, 2));
    int64_t prec = p[0] && int_like(p[0]) ? ival(p[0]) : 0;
    jstr method = {"common", 6};
    if (p[1]) SPX_TRY(str_arg(r, at, "round", p[1], &method));
    if (!jv_is_num(self)) {
        if (self->type == JV_UNDEF) return jv_undef_fail(r, at, self);
        return jfail(r, at, SPX_ERR_ARG, "round: expected a number, got %s", jv_typename(self));
    }
    if (prec < -300 || prec > 300) return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported: round() precision %lld", (long long)prec);
    double x = jv_num(self);
    if (method.n == 6 && !memcmp(method.p, "common", 6)) {
        /* Python round(x, n): correctly rounded, ties to even; ints stay ints */
        if (self->type != JV_FLOAT && prec >= 0) RET(jv_int(r, ival(self)));
        if (!isfinite(x)) RET(jv_float(r, x));
        if (prec >= 0) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            RET(jv_float(r, strtod(buf, NULL)));
        }
        double m = pow(10.0, (double)-prec);
        RET(jv_float(r, nearbyint(x / m) * m));
    }
    bool fl = method.n == 5 && !memcmp(method.p, "floor", 5), ce = method.n == 4 && !memcmp(method.p, "ceil", 4);
    if (!fl && !ce) return jfail(r, at, SPX_ERR_ARG, "method must be 'common', 'ceil' or 'floor'");
    double m = pow(10.0, (double)prec);
    RET(jv_float(r, (fl ? floor(x * m) : ceil(x * m)) / m));
}

FN(f_wordcount) {
    jstr s;
    SPX_TRY(jbind(r, at, "wordcount", a, "", NULL, 0));
    SPX_TRY(soft_str(r, at, self, &s));
    int64_t n = 0;
    bool in = false;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        i += ju_next(s.p + i, s.n - i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        bool w = cp == '_' || (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
                 (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
        if (w && !in) n++;
        in = w;
    }
    RET(jv_int(r, n));
}

static spx_status minmax(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out, bool want_max) {
    jv *p[2], *items;
    SPX_TRY(jbind(r, at, want_max ? "max" : "min", a, "case_sensitive,attribute", p, 2));
    SPX_TRY(jv_iter(r, at, self, &items));
    if (!items->l.n) RET(jv_undef(r, "No aggregated item, sequence was empty."));
    jv *best = items->l.v[0], *bk;
    SPX_TRY(sort_key(r, at, best, p[1], p[0] && jv_truthy(p[0]), &bk));
    for (size_t i = 1; i < items->l.n; i++) {
        jv *k;
        int c;
        SPX_TRY(sort_key(r, at, items->l.v[i], p[1], p[0] && jv_truthy(p[0]), &k));
        SPX_TRY(jv_cmp(r, at, k, bk, &c));
        if (want_max ? c > 0 : c < 0) best = items->l.v[i], bk = k;
    }
    RET(best);
}
FN(f_max) { return minmax(r, at, self, a, out, true); }
FN(f_min) { return minmax(r, at, self, a, out, false); }

/* ---- tests ------------------------------------------------------------ */

static spx_status one_arg(jrt *r, const jnode *at, const char *name, const jargs *a, jv **x) {
    jv *p[1];
    SPX_TRY(jbind(r, at, name, a, "value", p, 1));
    if (!p[0]) return jfail(r, at, SPX_ERR_ARG, "test '%s' needs an argument", name);
    *x = p[0];
    return SPX_OK;
}

#define SIMPLE_TEST(name, expr)                         \
    FN(name) {                                          \
        SPX_TRY(jbind(r, at, #name, a, "", NULL, 0));   \
        *out = jv_bool(expr);                           \
        return SPX_OK;                                  \
    }

SIMPLE_TEST(t_defined, self->type != JV_UNDEF)
SIMPLE_TEST(t_undefined, self->type == JV_UNDEF)
SIMPLE_TEST(t_none, self->type == JV_NONE)
SIMPLE_TEST(t_boolean, self->type == JV_BOOL)
SIMPLE_TEST(t_true, self->type == JV_BOOL && self->b)
SIMPLE_TEST(t_false, self->type == JV_BOOL && !self->b)
SIMPLE_TEST(t_string, self->type == JV_STR)
SIMPLE_TEST(t_number, jv_is_num(self))
SIMPLE_TEST(t_integer, self->type == JV_INT)
SIMPLE_TEST(t_float, self->type == JV_FLOAT)
SIMPLE_TEST(t_mapping, self->type == JV_DICT)
SIMPLE_TEST(t_iterable, self->type == JV_STR || self->type == JV_LIST || self->type == JV_DICT || self->type == JV_UNDEF)
SIMPLE_TEST(t_sequence, self->type == JV_STR || (self->type == JV_LIST && !(self->flags & JV_F_ITER)) ||
                            self->type == JV_DICT || self->type == JV_UNDEF)
SIMPLE_TEST(t_callable, self->type == JV_MACRO || self->type == JV_FUNC || self->type == JV_UNDEF)
SIMPLE_TEST(t_lower, self->type == JV_STR && js_islower(self->s, false))
SIMPLE_TEST(t_upper, self->type == JV_STR && js_islower(self->s, true))

static spx_status mod_test(jrt *r, const jnode *at, jv *x, jv *d, bool *out) {
    if (!jv_is_num(x) || !jv_is_num(d)) {
        if (x->type == JV_UNDEF) return jv_undef_fail(r, at, x);
        return jfail(r, at, SPX_ERR_ARG, "unsupported operand type(s) for %%: '%s' and '%s'", jv_typename(x), jv_typename(d));
    }
    if (x->type != JV_FLOAT && d->type != JV_FLOAT) {
        if (!ival(d)) return jfail(r, at, SPX_ERR_ARG, "integer division or modulo by zero");
        *out = ival(d) == -1 || ival(x) % ival(d) == 0;
    } else {
        if (jv_num(d) == 0) return jfail(r, at, SPX_ERR_ARG, "float modulo");
        *out = fmod(jv_num(x), jv_num(d)) == 0;
    }
    return SPX_OK;
}

FN(t_even) {
    SPX_TRY(jbind(r, at, "even", a, "", NULL, 0));
    bool ok = false;
    jv two = {.type = JV_INT, .i = 2};
    SPX_TRY(mod_test(r, at, self, &two, &ok));
    RET(jv_bool(ok));
}
FN(t_odd) {
    SPX_TRY(jbind(r, at, "odd", a, "", NULL, 0));
    bool ok = false;
    jv two = {.type = JV_INT, .i = 2};
    SPX_TRY(mod_test(r, at, self, &two, &ok));
    RET(jv_bool(!ok));
}
FN(t_divisibleby) {
    jv *d = NULL;
    bool ok = false;
    SPX_TRY(one_arg(r, at, "divisibleby", a, &d));
    SPX_TRY(mod_test(r, at, self, d, &ok));
    RET(jv_bool(ok));
}
FN(t_eq) {
    jv *x = NULL;
    SPX_TRY(one_arg(r, at, "eq", a, &x));
    RET(jv_bool(jv_eq(self, x)));
}
FN(t_ne) {
    jv *x = NULL;
    SPX_TRY(one_arg(r, at, "ne", a, &x));
    RET(jv_bool(!jv_eq(self, x)));
}
static spx_status order_test(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out, int want) {
    jv *x = NULL;
    int c = 0;
    SPX_TRY(one_arg(r, at, "comparison", a, &x));
    SPX_TRY(jv_cmp(r, at, self, x, &c));
    bool ok = want == 0 ? c < 0 : want == 1 ? c <= 0 : want == 2 ? c > 0 : c >= 0;
    if ((jv_is_num(self) && isnan(jv_num(self))) || (jv_is_num(x) && isnan(jv_num(x)))) ok = false;
    RET(jv_bool(ok));
}
FN(t_lt) { return order_test(r, at, self, a, out, 0); }
FN(t_le) { return order_test(r, at, self, a, out, 1); }
FN(t_gt) { return order_test(r, at, self, a, out, 2); }
FN(t_ge) { return order_test(r, at, self, a, out, 3); }
FN(t_in) {
    jv *seq = NULL, *items;
    SPX_TRY(one_arg(r, at, "in", a, &seq));
    if (seq->type == JV_STR) {
        if (self->type != JV_STR) return jfail(r, at, SPX_ERR_ARG, "'in <string>' requires string as left operand, not %s", jv_typename(self));
        RET(jv_bool(!self->s.n || memmem(seq->s.p, seq->s.n, self->s.p, self->s.n)));
    }
    if (seq->type == JV_DICT) RET(jv_bool(jv_dict_get(seq, self) != NULL));
    SPX_TRY(jv_iter(r, at, seq, &items));
    for (size_t i = 0; i < items->l.n; i++)
        if (jv_eq(items->l.v[i], self)) RET(&jv_true);
    RET(&jv_false);
}
FN(t_sameas) {
    jv *x = NULL;
    SPX_TRY(one_arg(r, at, "sameas", a, &x));
    bool same = self == x || (self->type == x->type && (self->type == JV_NONE || (self->type == JV_BOOL && self->b == x->b)));
    RET(jv_bool(same));
}

/* ---- globals ---------------------------------------------------------- */

FN(g_range) {
    if (a->nkw) return jfail(r, at, SPX_ERR_ARG, "range() takes no keyword arguments");
    if (!a->npos || a->npos > 3) return jfail(r, at, SPX_ERR_ARG, "range expected 1 to 3 arguments, got %zu", a->npos);
    int64_t v[3] = {0, 0, 1};
    for (size_t i = 0; i < a->npos; i++) {
        if (!int_like(a->pos[i]))
            return jfail(r, at, SPX_ERR_ARG, "'%s' object cannot be interpreted as an integer", jv_typename(a->pos[i]));
        v[a->npos == 1 ? 1 : i] = ival(a->pos[i]);
    }
    if (!v[2]) return jfail(r, at, SPX_ERR_ARG, "range() arg 3 must not be zero");
    double cnt = v[2] > 0 ? ceil(((double)v[1] - (double)v[0]) / (double)v[2]) : ceil(((double)v[0] - (double)v[1]) / (double)-v[2]);
    if (cnt < 0) cnt = 0;
    if (cnt > J_MAX_RANGE)
        return jfail(r, at, SPX_ERR_RANGE, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", J_MAX_RANGE);
    jv *l = jv_list(r, (size_t)cnt);
    if (!l) return joom(r, at);
    for (int64_t x = v[0]; v[2] > 0 ? x < v[1] : x > v[1]; x += v[2])
        if (!(l->l.v[l->l.n++] = jv_int(r, x))) return joom(r, at);
    l->flags |= JV_F_RANGE;
    RET(l);
}

static spx_status make_dict(jrt *r, const jnode *at, const jargs *a, jv_type t, jv **out) {
    jv *d = jv_new(r, t);
    if (!d) return joom(r, at);
    if (a->npos > 1) return jfail(r, at, SPX_ERR_ARG, "%s expected at most 1 positional argument", t == JV_NS ? "namespace()" : "dict()");
    if (a->npos) {
        jv *src = a->pos[0];
        if (src->type != JV_DICT && src->type != JV_NS)
            return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported: %s from a %s", t == JV_NS ? "namespace()" : "dict()", jv_typename(src));
        for (size_t i = 0; i < src->d.n; i++)
            if (!jv_dict_set(r, d, src->d.k[i], src->d.v[i])) return joom(r, at);
    }
    for (size_t k = 0; k < a->nkw; k++) {
        jv *key = jv_str(r, a->kwn[k].p, a->kwn[k].n);
        if (!key || !jv_dict_set(r, d, key, a->kwv[k])) return joom(r, at);
    }
    RET(d);
}
FN(g_namespace) { return make_dict(r, at, a, JV_NS, out); }
FN(g_dict) { return make_dict(r, at, a, JV_DICT, out); }

FN(g_raise_exception) {
    jv *p[1];
    SPX_TRY(jbind(r, at, "raise_exception", a, "message", p, 1));
    jstr m = {"", 0};
    if (p[0]) SPX_TRY(soft_str(r, at, p[0], &m));
    return jfail(r, at, SPX_ERR_ARG, "raise_exception: %.*s", (int)(m.n > 800 ? 800 : m.n), m.p);
}

FN(g_strftime_now) {
    jv *p[1];
    jstr f;
    SPX_TRY(jbind(r, at, "strftime_now", a, "format", p, 1));
    if (!p[0]) return jfail(r, at, SPX_ERR_ARG, "strftime_now() takes exactly one argument");
    SPX_TRY(str_arg(r, at, "strftime_now", p[0], &f));
    if (f.n > 200 || memchr(f.p, 0, f.n)) return jfail(r, at, SPX_ERR_ARG, "strftime_now: format longer than 200 bytes");
    char fmt[256], buf[1024];
    memcpy(fmt, f.p, f.n);
    fmt[f.n] = 0;
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    size_t k = f.n ? strftime(buf, sizeof buf, fmt, &tmv) : 0;
    if (f.n && !k) return jfail(r, at, SPX_ERR_ARG, "strftime_now: the formatted date is empty or too long");
    RET(jv_str(r, buf, k));
}

/* ---- tables ----------------------------------------------------------- */

static const jbuiltin BUILTINS[] = {
    {"abs", JB_FILTER, f_abs}, {"capitalize", JB_FILTER, f_capitalize}, {"count", JB_FILTER, f_length},
    {"d", JB_FILTER, f_default}, {"default", JB_FILTER, f_default}, {"dictsort", JB_FILTER, f_dictsort},
    {"e", JB_FILTER, f_escape}, {"escape", JB_FILTER, f_escape}, {"first", JB_FILTER, f_first},
    {"float", JB_FILTER, f_float}, {"indent", JB_FILTER, f_indent}, {"int", JB_FILTER, f_int},
    {"items", JB_FILTER, f_items}, {"join", JB_FILTER, f_join}, {"last", JB_FILTER, f_last},
    {"length", JB_FILTER, f_length}, {"list", JB_FILTER, f_list}, {"lower", JB_FILTER, f_lower},
    {"map", JB_FILTER, f_map}, {"max", JB_FILTER, f_max}, {"min", JB_FILTER, f_min},
    {"reject", JB_FILTER, f_reject}, {"rejectattr", JB_FILTER, f_rejectattr}, {"replace", JB_FILTER, f_replace},
    {"reverse", JB_FILTER, f_reverse}, {"round", JB_FILTER, f_round}, {"safe", JB_FILTER, f_safe},
    {"select", JB_FILTER, f_select}, {"selectattr", JB_FILTER, f_selectattr}, {"sort", JB_FILTER, f_sort},
    {"string", JB_FILTER, f_string}, {"title", JB_FILTER, f_title}, {"tojson", JB_FILTER, f_tojson},
    {"trim", JB_FILTER, f_trim}, {"unique", JB_FILTER, f_unique}, {"upper", JB_FILTER, f_upper},
    {"wordcount", JB_FILTER, f_wordcount},
    {"defined", JB_TEST, t_defined}, {"undefined", JB_TEST, t_undefined}, {"none", JB_TEST, t_none},
    {"boolean", JB_TEST, t_boolean}, {"true", JB_TEST, t_true}, {"false", JB_TEST, t_false},
    {"string", JB_TEST, t_string}, {"number", JB_TEST, t_number}, {"integer", JB_TEST, t_integer},
    {"float", JB_TEST, t_float}, {"mapping", JB_TEST, t_mapping}, {"iterable", JB_TEST, t_iterable},
    {"sequence", JB_TEST, t_sequence}, {"callable", JB_TEST, t_callable}, {"lower", JB_TEST, t_lower},
    {"upper", JB_TEST, t_upper}, {"even", JB_TEST, t_even}, {"odd", JB_TEST, t_odd},
    {"divisibleby", JB_TEST, t_divisibleby}, {"eq", JB_TEST, t_eq}, {"equalto", JB_TEST, t_eq},
    {"==", JB_TEST, t_eq}, {"ne", JB_TEST, t_ne}, {"!=", JB_TEST, t_ne}, {"lt", JB_TEST, t_lt},
    {"lessthan", JB_TEST, t_lt}, {"<", JB_TEST, t_lt}, {"le", JB_TEST, t_le}, {"<=", JB_TEST, t_le},
    {"gt", JB_TEST, t_gt}, {"greaterthan", JB_TEST, t_gt}, {">", JB_TEST, t_gt}, {"ge", JB_TEST, t_ge},
    {">=", JB_TEST, t_ge}, {"in", JB_TEST, t_in}, {"sameas", JB_TEST, t_sameas},
    {"range", JB_GLOBAL, g_range}, {"namespace", JB_GLOBAL, g_namespace}, {"dict", JB_GLOBAL, g_dict},
    {"raise_exception", JB_GLOBAL, g_raise_exception}, {"strftime_now", JB_GLOBAL, g_strftime_now},
    {"lipsum", JB_UNSUPPORTED, NULL}, {"cycler", JB_UNSUPPORTED, NULL}, {"joiner", JB_UNSUPPORTED, NULL},
};

const jbuiltin *jb_find(jb_kind kind, const char *name, size_t n) {
    for (size_t i = 0; i < sizeof BUILTINS / sizeof *BUILTINS; i++)
        if (BUILTINS[i].kind == kind && strlen(BUILTINS[i].name) == n && !memcmp(BUILTINS[i].name, name, n))
            return &BUILTINS[i];
    return NULL;
}
