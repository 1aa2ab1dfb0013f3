/* jinja_str.c: Python's str, list, dict methods and the loop object's
 * methods, as a sandboxed jinja2 exposes them (jb_method), and the string
 * helpers the filters share.
 *
 * Strings are UTF-8; indices and lengths count code points as Python does
 * (a stray invalid byte counts as one). Case mapping uses utf8proc's
 * simple mappings (Python's full mappings differ for a few characters such
 * as 'ß'.upper() == 'SS'). The sandbox forbids the mutating list and dict
 * methods: they resolve to an "unsafe" undefined value that fails when
 * called, as jinja2's ImmutableSandboxedEnvironment does. */
#include "chat/jinja.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define FN(name) static spx_status name(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out)
#define RET(x)                               \
    do {                                     \
        *out = (x);                          \
        return *out ? SPX_OK : joom(r, at);  \
    } while (0)

static bool is_cased(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

jv *js_case(jrt *r, jstr s, char mode) {
    jbuf b = {0};
    bool prev_cased = false, first = true, after_sep = true;
    for (size_t i = 0; i < s.n;) {
        int32_t cp, o;
        i += ju_next(s.p + i, s.n - i, &cp);
        bool stray = cp >= 0xDC80 && cp <= 0xDCFF;
        switch (mode) {
        case 'u': o = stray ? cp : utf8proc_toupper(cp); break;
        case 'l': o = stray ? cp : utf8proc_tolower(cp); break;
        case 't':
            o = stray ? cp : prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
            prev_cased = !stray && is_cased(cp);
            break;
        case 'c': o = stray ? cp : first ? utf8proc_totitle(cp) : utf8proc_tolower(cp); break;
        default: { /* jinja2's do_title: upper after a run of [-\s({[<] (and at the start) */
            bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ju_isspace(cp);
            o = stray ? cp : after_sep && !sep ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            after_sep = sep;
        }
        }
        first = false;
        if (!ju_put(&b, o)) {
            jbuf_free(&b);
            return NULL;
        }
    }
    return jv_strbuf(r, &b);
}

static bool in_chars(int32_t cp, const jstr *chars) {
    for (size_t i = 0; i < chars->n;) {
        int32_t c;
        i += ju_next(chars->p + i, chars->n - i, &c);
        if (c == cp) return true;
    }
    return false;
}

jv *js_strip(jrt *r, jstr s, const jstr *chars, int which) {
    size_t lo = 0, hi = s.n;
    if (which & 1)
        while (lo < hi) {
            int32_t cp;
            size_t k = ju_next(s.p + lo, hi - lo, &cp);
            if (chars ? !in_chars(cp, chars) : !ju_isspace(cp)) break;
            lo += k;
        }
    if (which & 2)
        while (hi > lo) {
            /* the code point ending at hi */
            size_t k = 1;
            while (k < 4 && hi - k > lo && ((unsigned char)s.p[hi - k] & 0xC0) == 0x80) k++;
            int32_t cp;
            if (ju_next(s.p + hi - k, k, &cp) != k) {
                k = 1;
                ju_next(s.p + hi - 1, 1, &cp);
            }
            if (chars ? !in_chars(cp, chars) : !ju_isspace(cp)) break;
            hi -= k;
        }
    return jv_str(r, s.p + lo, hi - lo);
}

spx_status js_replace(jrt *r, const jnode *at, jstr s, jstr old, jstr rep, int64_t count, jv **out) {
    jbuf b = {0};
    bool ok = true;
    int64_t done = 0;
    if (!old.n) {
        /* '' matches between every character and at both ends */
        size_t i = 0;
        while (ok) {
            if (count < 0 || done < count) ok = jbuf_put(&b, rep.p, rep.n), done++;
            if (i >= s.n) break;
            int32_t cp;
            size_t k = ju_next(s.p + i, s.n - i, &cp);
            ok = ok && jbuf_put(&b, s.p + i, k);
            i += k;
        }
    } else {
        size_t i = 0;
        while (ok && i < s.n) {
            const char *hit = (count < 0 || done < count) ? memmem(s.p + i, s.n - i, old.p, old.n) : NULL;
            if (!hit) {
                ok = jbuf_put(&b, s.p + i, s.n - i);
                break;
            }
            size_t h = (size_t)(hit - s.p);
            ok = jbuf_put(&b, s.p + i, h - i) && jbuf_put(&b, rep.p, rep.n);
            i = h + old.n;
            done++;
        }
    }
    if (!ok) {
        bool over = b.over;
        jbuf_free(&b);
        return over ? jfail(r, at, SPX_ERR_RANGE, "string longer than %zu MiB", J_OUT_MAX >> 20) : joom(r, at);
    }
    RET(jv_strbuf(r, &b));
}

/* Python's line boundaries for str.splitlines */
static size_t line_break(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\r') return i + 1 < n && s[i + 1] == '\n' ? 2 : 1;
    if (c == '\n' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E) return 1;
    if (c >= 0x80) {
        int32_t cp;
        size_t k = ju_next(s + i, n - i, &cp);
        if (cp == 0x85 || cp == 0x2028 || cp == 0x2029) return k;
    }
    return 0;
}

spx_status js_splitlines(jrt *r, const jnode *at, jstr s, bool keepends, jv **out) {
    jv *l = jv_list(r, 0);
    if (!l) return joom(r, at);
    size_t start = 0, i = 0;
    while (i < s.n) {
        size_t k = line_break(s.p, s.n, i);
        if (!k) {
            int32_t cp;
            i += ju_next(s.p + i, s.n - i, &cp);
            continue;
        }
        jv *x = jv_str(r, s.p + start, (keepends ? i + k : i) - start);
        if (!x || !jv_push(r, l, x)) return joom(r, at);
        i += k;
        start = i;
    }
    if (start < s.n) {
        jv *x = jv_str(r, s.p + start, s.n - start);
        if (!x || !jv_push(r, l, x)) return joom(r, at);
    }
    *out = l;
    return SPX_OK;
}

bool js_islower(jstr s, bool upper) {
    bool any = false;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        i += ju_next(s.p + i, s.n - i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        if (c == UTF8PROC_CATEGORY_LT) return false;
        if (c == UTF8PROC_CATEGORY_LU) {
            if (!upper) return false;
            any = true;
        } else if (c == UTF8PROC_CATEGORY_LL) {
            if (upper) return false;
            any = true;
        }
    }
    return any;
}

/* ---- argument helpers ------------------------------------------------ */

static spx_status want_str(jrt *r, const jnode *at, const char *fname, const jv *v, jstr *out) {
    if (v->type != JV_STR) {
        if (v->type == JV_UNDEF) return jv_undef_fail(r, at, v);
        return jfail(r, at, SPX_ERR_ARG, "%s: expected a string argument, got %s", fname, jv_typename(v));
    }
    *out = v->s;
    return SPX_OK;
}

/* optional int argument (None = absent) */
static spx_status want_int(jrt *r, const jnode *at, const char *fname, const jv *v, int64_t *out, bool *given) {
    *given = v && v->type != JV_NONE;
    if (!*given) return SPX_OK;
    if (v->type == JV_INT || v->type == JV_BOOL) {
        *out = v->type == JV_BOOL ? v->b : v->i;
        return SPX_OK;
    }
    if (v->type == JV_UNDEF) return jv_undef_fail(r, at, v);
    return jfail(r, at, SPX_ERR_ARG, "%s: expected an integer argument, got %s", fname, jv_typename(v));
}

/* Python's slice bounds of [start:end] over n code points, as byte offsets */
static spx_status sub_range(jrt *r, const jnode *at, const char *fname, jstr s, jv *vs, jv *ve, size_t *lo, size_t *hi,
                            size_t *lo_cp) {
    int64_t n = (int64_t)ju_len(s.p, s.n), st = 0, en = n;
    bool g;
    SPX_TRY(want_int(r, at, fname, vs, &st, &g));
    if (!g) st = 0;
    SPX_TRY(want_int(r, at, fname, ve, &en, &g));
    if (!g) en = n;
    if (st < 0) st = st + n < 0 ? 0 : st + n;
    if (en < 0) en = en + n < 0 ? 0 : en + n;
    if (st > n) st = n + 1; /* an empty, impossible range */
    if (en > n) en = n;
    *lo_cp = (size_t)st;
    *lo = st > n ? s.n + 1 : ju_offset(s.p, s.n, (size_t)st);
    *hi = ju_offset(s.p, s.n, (size_t)en);
    return SPX_OK;
}

/* ---- str methods ----------------------------------------------------- */

static spx_status prefix_test(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out, bool suffix) {
    const char *fname = suffix ? "str.endswith" : "str.startswith";
    jv *p[3];
    SPX_TRY(jbind(r, at, fname, a, "prefix,start,end", p, 3));
    if (!p[0]) return jfail(r, at, SPX_ERR_ARG, "%s() takes at least 1 argument", fname);
    size_t lo, hi, lc;
    SPX_TRY(sub_range(r, at, fname, self->s, p[1], p[2], &lo, &hi, &lc));
    size_t np = p[0]->type == JV_LIST && (p[0]->flags & JV_F_TUPLE) ? p[0]->l.n : 1;
    for (size_t i = 0; i < np; i++) {
        jv *x = p[0]->type == JV_LIST && (p[0]->flags & JV_F_TUPLE) ? p[0]->l.v[i] : p[0];
        jstr q;
        SPX_TRY(want_str(r, at, fname, x, &q));
        if (lo > hi) continue;
        if (q.n <= hi - lo && !memcmp(self->s.p + (suffix ? hi - q.n : lo), q.p, q.n)) RET(&jv_true);
    }
    RET(&jv_false);
}

FN(m_startswith) { return prefix_test(r, at, self, a, out, false); }
FN(m_endswith) { return prefix_test(r, at, self, a, out, true); }

static spx_status strip_m(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out, int which) {
    jv *p[1];
    SPX_TRY(jbind(r, at, "str.strip", a, "chars", p, 1));
    jstr chars;
    if (p[0] && p[0]->type != JV_NONE) {
        SPX_TRY(want_str(r, at, "str.strip", p[0], &chars));
        RET(js_strip(r, self->s, &chars, which));
    }
    RET(js_strip(r, self->s, NULL, which));
}
FN(m_strip) { return strip_m(r, at, self, a, out, 3); }
FN(m_lstrip) { return strip_m(r, at, self, a, out, 1); }
FN(m_rstrip) { return strip_m(r, at, self, a, out, 2); }

FN(m_upper) { SPX_TRY(jbind(r, at, "str.upper", a, "", NULL, 0)); RET(js_case(r, self->s, 'u')); }
FN(m_lower) { SPX_TRY(jbind(r, at, "str.lower", a, "", NULL, 0)); RET(js_case(r, self->s, 'l')); }
FN(m_title) { SPX_TRY(jbind(r, at, "str.title", a, "", NULL, 0)); RET(js_case(r, self->s, 't')); }
FN(m_capitalize) { SPX_TRY(jbind(r, at, "str.capitalize", a, "", NULL, 0)); RET(js_case(r, self->s, 'c')); }

static spx_status push_str(jrt *r, const jnode *at, jv *l, const char *p, size_t n) {
    jv *x = jv_str(r, p, n);
    return x && jv_push(r, l, x) ? SPX_OK : joom(r, at);
}

static spx_status split_m(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out, bool right) {
    const char *fname = right ? "str.rsplit" : "str.split";
    jv *p[2];
    SPX_TRY(jbind(r, at, fname, a, "sep,maxsplit", p, 2));
    int64_t maxs = -1;
    bool g;
    SPX_TRY(want_int(r, at, fname, p[1], &maxs, &g));
    if (!g || maxs < 0) maxs = INT64_MAX;
    jstr s = self->s, sep;
    jv *l = jv_list(r, 0);
    if (!l) return joom(r, at);
    if (p[0] && p[0]->type != JV_NONE) {
        SPX_TRY(want_str(r, at, fname, p[0], &sep));
        if (!sep.n) return jfail(r, at, SPX_ERR_ARG, "%s: empty separator", fname);
        /* pieces collected left to right, or right to left then reversed */
        size_t end = s.n, start = 0;
        int64_t k = 0;
        if (!right) {
            while (k < maxs) {
                const char *h = memmem(s.p + start, s.n - start, sep.p, sep.n);
                if (!h) break;
                SPX_TRY(push_str(r, at, l, s.p + start, (size_t)(h - s.p) - start));
                start = (size_t)(h - s.p) + sep.n;
                k++;
            }
            SPX_TRY(push_str(r, at, l, s.p + start, s.n - start));
        } else {
            while (k < maxs && end >= sep.n) {
                size_t q = end - sep.n;
                for (;;) {
                    if (!memcmp(s.p + q, sep.p, sep.n)) break;
                    if (q == 0) { q = SIZE_MAX; break; }
                    q--;
                }
                if (q == SIZE_MAX) break;
                SPX_TRY(push_str(r, at, l, s.p + q + sep.n, end - q - sep.n));
                end = q;
                k++;
            }
            SPX_TRY(push_str(r, at, l, s.p, end));
        }
        if (right) /* pieces were collected right to left */
            for (size_t i = 0, j = l->l.n ? l->l.n - 1 : 0; i < j; i++, j--) {
                jv *x = l->l.v[i];
                l->l.v[i] = l->l.v[j];
                l->l.v[j] = x;
            }
    } else {
        /* runs of whitespace: words; with maxsplit, split keeps the rest
         * from the next word to the end, rsplit from the start to the word */
        size_t nw = 0, cap = 16;
        size_t *ws = malloc(cap * 2 * sizeof *ws);
        if (!ws) return joom(r, at);
        for (size_t i = 0;;) {
            int32_t cp;
            while (i < s.n) {
                size_t c = ju_next(s.p + i, s.n - i, &cp);
                if (!ju_isspace(cp)) break;
                i += c;
            }
            if (i >= s.n) break;
            size_t j = i;
            while (j < s.n) {
                size_t c = ju_next(s.p + j, s.n - j, &cp);
                if (ju_isspace(cp)) break;
                j += c;
            }
            if (nw == cap) {
                size_t *nws = realloc(ws, cap * 4 * sizeof *ws);
                if (!nws) { free(ws); return joom(r, at); }
                ws = nws;
                cap *= 2;
            }
            ws[2 * nw] = i;
            ws[2 * nw + 1] = j;
            nw++;
            i = j;
        }
        spx_status st = SPX_OK;
        if (!nw || (uint64_t)maxs >= nw - 1) {
            for (size_t k = 0; k < nw && !st; k++) st = push_str(r, at, l, s.p + ws[2 * k], ws[2 * k + 1] - ws[2 * k]);
        } else if (!right) {
            size_t m = (size_t)maxs;
            for (size_t k = 0; k < m && !st; k++) st = push_str(r, at, l, s.p + ws[2 * k], ws[2 * k + 1] - ws[2 * k]);
            if (!st) st = push_str(r, at, l, s.p + ws[2 * m], s.n - ws[2 * m]);
        } else {
            size_t first = nw - (size_t)maxs;
            st = push_str(r, at, l, s.p, ws[2 * (first - 1) + 1]);
            for (size_t k = first; k < nw && !st; k++) st = push_str(r, at, l, s.p + ws[2 * k], ws[2 * k + 1] - ws[2 * k]);
        }
        free(ws);
        if (st) return st;
    }
    *out = l;
    return SPX_OK;
}
FN(m_split) { return split_m(r, at, self, a, out, false); }
FN(m_rsplit) { return split_m(r, at, self, a, out, true); }

FN(m_replace) {
    jv *p[3];
    SPX_TRY(jbind(r, at, "str.replace", a, "old,new,count", p, 3));
    jstr o, n;
    if (!p[0] || !p[1]) return jfail(r, at, SPX_ERR_ARG, "str.replace() takes at least 2 arguments");
    SPX_TRY(want_str(r, at, "str.replace", p[0], &o));
    SPX_TRY(want_str(r, at, "str.replace", p[1], &n));
    int64_t c = -1;
    bool g;
    SPX_TRY(want_int(r, at, "str.replace", p[2], &c, &g));
    return js_replace(r, at, self->s, o, n, g ? c : -1, out);
}

static spx_status find_m(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out, bool right, bool strict) {
    const char *fname = right ? "str.rfind" : "str.find";
    jv *p[3];
    SPX_TRY(jbind(r, at, fname, a, "sub,start,end", p, 3));
    if (!p[0]) return jfail(r, at, SPX_ERR_ARG, "%s() takes at least 1 argument", fname);
    jstr sub;
    SPX_TRY(want_str(r, at, fname, p[0], &sub));
    size_t lo, hi, lc;
    SPX_TRY(sub_range(r, at, fname, self->s, p[1], p[2], &lo, &hi, &lc));
    int64_t res = -1;
    if (lo <= hi && sub.n <= hi - lo) {
        const char *s = self->s.p;
        if (!right) {
            const char *h = sub.n ? memmem(s + lo, hi - lo, sub.p, sub.n) : s + lo;
            if (h) res = (int64_t)(lc + ju_len(s + lo, (size_t)(h - s) - lo));
        } else {
            for (size_t q = hi - sub.n + 1; q-- > lo;)
                if (!memcmp(s + q, sub.p, sub.n) && (q == lo || ((unsigned char)s[q] & 0xC0) != 0x80)) {
                    res = (int64_t)(lc + ju_len(s + lo, q - lo));
                    break;
                }
        }
    }
    if (strict && res < 0) return jfail(r, at, SPX_ERR_ARG, "substring not found");
    RET(jv_int(r, res));
}
FN(m_find) { return find_m(r, at, self, a, out, false, false); }
FN(m_rfind) { return find_m(r, at, self, a, out, true, false); }
FN(m_index) { return find_m(r, at, self, a, out, false, true); }
FN(m_rindex) { return find_m(r, at, self, a, out, true, true); }

FN(m_count) {
    jv *p[3];
    SPX_TRY(jbind(r, at, "str.count", a, "sub,start,end", p, 3));
    if (!p[0]) return jfail(r, at, SPX_ERR_ARG, "str.count() takes at least 1 argument");
    jstr sub;
    SPX_TRY(want_str(r, at, "str.count", p[0], &sub));
    size_t lo, hi, lc;
    SPX_TRY(sub_range(r, at, "str.count", self->s, p[1], p[2], &lo, &hi, &lc));
    int64_t c = 0;
    if (lo > hi) RET(jv_int(r, 0));
    if (!sub.n) RET(jv_int(r, (int64_t)ju_len(self->s.p + lo, hi - lo) + 1));
    for (size_t i = lo; i + sub.n <= hi;) {
        const char *h = memmem(self->s.p + i, hi - i, sub.p, sub.n);
        if (!h) break;
        c++;
        i = (size_t)(h - self->s.p) + sub.n;
    }
    RET(jv_int(r, c));
}

FN(m_join) {
    jv *p[1], *items;
    SPX_TRY(jbind(r, at, "str.join", a, "iterable", p, 1));
    if (!p[0]) return jfail(r, at, SPX_ERR_ARG, "str.join() takes exactly one argument");
    SPX_TRY(jv_iter(r, at, p[0], &items));
    jbuf b = {0};
    for (size_t i = 0; i < items->l.n; i++) {
        jv *x = items->l.v[i];
        if (x->type != JV_STR) {
            jbuf_free(&b);
            return jfail(r, at, SPX_ERR_ARG, "sequence item %zu: expected str instance, %s found", i, jv_typename(x));
        }
        if ((i && !jbuf_put(&b, self->s.p, self->s.n)) || !jbuf_put(&b, x->s.p, x->s.n)) {
            jbuf_free(&b);
            return joom(r, at);
        }
    }
    RET(jv_strbuf(r, &b));
}

FN(m_splitlines) {
    jv *p[1];
    SPX_TRY(jbind(r, at, "str.splitlines", a, "keepends", p, 1));
    return js_splitlines(r, at, self->s, p[0] && jv_truthy(p[0]), out);
}

/* str.isX(): every character in the class, and at least one */
static spx_status is_class(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out, char cls) {
    SPX_TRY(jbind(r, at, "str.is...", a, "", NULL, 0));
    if (cls == 'l' || cls == 'u') RET(jv_bool(js_islower(self->s, cls == 'u')));
    bool ok = self->s.n > 0;
    for (size_t i = 0; i < self->s.n && ok;) {
        int32_t cp;
        i += ju_next(self->s.p + i, self->s.n - i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        bool alpha = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        bool digit = c == UTF8PROC_CATEGORY_ND;
        bool numeric = digit || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
        switch (cls) {
        case 'd': ok = digit; break;
        case 'n': ok = numeric; break;
        case 'a': ok = alpha; break;
        case 'A': ok = alpha || numeric; break;
        case 's': ok = ju_isspace(cp); break;
        }
    }
    RET(jv_bool(ok));
}
FN(m_isdigit) { return is_class(r, at, self, a, out, 'd'); }
FN(m_isnumeric) { return is_class(r, at, self, a, out, 'n'); }
FN(m_isalpha) { return is_class(r, at, self, a, out, 'a'); }
FN(m_isalnum) { return is_class(r, at, self, a, out, 'A'); }
FN(m_isspace) { return is_class(r, at, self, a, out, 's'); }
FN(m_islower) { return is_class(r, at, self, a, out, 'l'); }
FN(m_isupper) { return is_class(r, at, self, a, out, 'u'); }

/* ---- list, dict, loop methods ---------------------------------------- */

FN(m_list_index) {
    jv *p[1];
    SPX_TRY(jbind(r, at, "list.index", a, "value", p, 1));
    if (!p[0]) return jfail(r, at, SPX_ERR_ARG, "list.index() takes at least 1 argument");
    for (size_t i = 0; i < self->l.n; i++)
        if (jv_eq(self->l.v[i], p[0])) RET(jv_int(r, (int64_t)i));
    return jfail(r, at, SPX_ERR_ARG, "list.index(x): x not in list");
}

FN(m_list_count) {
    jv *p[1];
    SPX_TRY(jbind(r, at, "list.count", a, "value", p, 1));
    if (!p[0]) return jfail(r, at, SPX_ERR_ARG, "list.count() takes exactly one argument");
    int64_t c = 0;
    for (size_t i = 0; i < self->l.n; i++) c += jv_eq(self->l.v[i], p[0]);
    RET(jv_int(r, c));
}

static spx_status dict_view(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out, int what) {
    SPX_TRY(jbind(r, at, what == 0 ? "dict.keys" : what == 1 ? "dict.values" : "dict.items", a, "", NULL, 0));
    jv *l = jv_list(r, self->d.n);
    if (!l) return joom(r, at);
    for (size_t i = 0; i < self->d.n; i++) {
        jv *x = what == 0 ? self->d.k[i] : self->d.v[i];
        if (what == 2) {
            if (!(x = jv_list(r, 2))) return joom(r, at);
            x->flags = JV_F_TUPLE;
            x->l.v[0] = self->d.k[i];
            x->l.v[1] = self->d.v[i];
            x->l.n = 2;
        }
        l->l.v[l->l.n++] = x;
    }
    *out = l;
    return SPX_OK;
}
FN(m_keys) { return dict_view(r, at, self, a, out, 0); }
FN(m_values) { return dict_view(r, at, self, a, out, 1); }
FN(m_items) { return dict_view(r, at, self, a, out, 2); }

FN(m_get) {
    jv *p[2];
    SPX_TRY(jbind(r, at, "dict.get", a, "key,default", p, 2));
    if (!p[0]) return jfail(r, at, SPX_ERR_ARG, "dict.get() takes at least 1 argument");
    jv *v = jv_dict_get(self, p[0]);
    *out = v ? v : p[1] ? p[1] : &jv_none;
    return SPX_OK;
}

FN(m_cycle) {
    if (a->nkw) return jfail(r, at, SPX_ERR_ARG, "loop.cycle() takes no keyword arguments");
    if (!a->npos) return jfail(r, at, SPX_ERR_ARG, "no items for cycling given");
    *out = a->pos[self->loop->index0 % (int64_t)a->npos];
    return SPX_OK;
}

typedef struct jmeth {
    jv_type type;
    jbuiltin b;
} jmeth;

#define M(t, name, fn) {t, {name, JB_STR, fn}}
#define UNSAFE(t, name) {t, {name, JB_UNSAFE, NULL}}
#define NOPE(t, name) {t, {name, JB_UNSUPPORTED, NULL}}

/* NOPE: a real Python method the engine does not run (calling it is
 * SPX_ERR_UNSUPPORTED); UNSAFE: forbidden by the sandbox */
static const jmeth METHODS[] = {
    M(JV_STR, "startswith", m_startswith), M(JV_STR, "endswith", m_endswith), M(JV_STR, "strip", m_strip),
    M(JV_STR, "lstrip", m_lstrip), M(JV_STR, "rstrip", m_rstrip), M(JV_STR, "split", m_split),
    M(JV_STR, "rsplit", m_rsplit), M(JV_STR, "upper", m_upper), M(JV_STR, "lower", m_lower),
    M(JV_STR, "title", m_title), M(JV_STR, "capitalize", m_capitalize), M(JV_STR, "replace", m_replace),
    M(JV_STR, "find", m_find), M(JV_STR, "rfind", m_rfind), M(JV_STR, "index", m_index), M(JV_STR, "rindex", m_rindex),
    M(JV_STR, "count", m_count), M(JV_STR, "join", m_join), M(JV_STR, "splitlines", m_splitlines),
    M(JV_STR, "isdigit", m_isdigit), M(JV_STR, "isdecimal", m_isdigit), M(JV_STR, "isnumeric", m_isnumeric),
    M(JV_STR, "isalpha", m_isalpha), M(JV_STR, "isalnum", m_isalnum), M(JV_STR, "isspace", m_isspace),
    M(JV_STR, "islower", m_islower), M(JV_STR, "isupper", m_isupper),
    NOPE(JV_STR, "format"), NOPE(JV_STR, "format_map"), NOPE(JV_STR, "casefold"), NOPE(JV_STR, "center"),
    NOPE(JV_STR, "ljust"), NOPE(JV_STR, "rjust"), NOPE(JV_STR, "zfill"), NOPE(JV_STR, "partition"),
    NOPE(JV_STR, "rpartition"), NOPE(JV_STR, "swapcase"), NOPE(JV_STR, "expandtabs"), NOPE(JV_STR, "encode"),
    NOPE(JV_STR, "istitle"), NOPE(JV_STR, "isidentifier"), NOPE(JV_STR, "isprintable"), NOPE(JV_STR, "isascii"),
    NOPE(JV_STR, "removeprefix"), NOPE(JV_STR, "removesuffix"), NOPE(JV_STR, "translate"), NOPE(JV_STR, "maketrans"),
    M(JV_LIST, "index", m_list_index), M(JV_LIST, "count", m_list_count), NOPE(JV_LIST, "copy"),
    UNSAFE(JV_LIST, "append"), UNSAFE(JV_LIST, "clear"), UNSAFE(JV_LIST, "extend"), UNSAFE(JV_LIST, "insert"),
    UNSAFE(JV_LIST, "pop"), UNSAFE(JV_LIST, "remove"), UNSAFE(JV_LIST, "reverse"), UNSAFE(JV_LIST, "sort"),
    M(JV_DICT, "items", m_items), M(JV_DICT, "keys", m_keys), M(JV_DICT, "values", m_values),
    M(JV_DICT, "get", m_get), NOPE(JV_DICT, "copy"), NOPE(JV_DICT, "fromkeys"), UNSAFE(JV_DICT, "clear"),
    UNSAFE(JV_DICT, "pop"), UNSAFE(JV_DICT, "popitem"), UNSAFE(JV_DICT, "setdefault"), UNSAFE(JV_DICT, "update"),
    M(JV_LOOP, "cycle", m_cycle), NOPE(JV_LOOP, "changed"),
};

const jbuiltin *jb_method(const jv *v, jstr name, bool *unsafe) {
    *unsafe = false;
    jv_type t = (jv_type)v->type;
    if (t == JV_LIST && (v->flags & JV_F_ITER)) return NULL; /* a generator has none of these */
    for (size_t i = 0; i < sizeof METHODS / sizeof *METHODS; i++) {
        const jmeth *m = &METHODS[i];
        if (m->type == t && strlen(m->b.name) == name.n && !memcmp(m->b.name, name.p, name.n)) {
            if (m->b.kind == JB_UNSAFE) {
                *unsafe = true;
                return NULL;
            }
            return &m->b;
        }
    }
    return NULL;
}
