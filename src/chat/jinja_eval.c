/* jinja_eval.c: rendering: statements, expressions, scopes, calls, and
 * spx_template_render.
 *
 * Scopes follow jinja2: the template's top level is one frame; every for
 * loop iteration gets a fresh frame (a {% set %} inside a loop body is gone
 * at the next iteration and after the loop, which is why templates use
 * namespace()); a macro call gets a frame whose parent is the scope the
 * macro was defined in, read when the macro runs; {% if %} opens none.
 * Names not found in the frames come from the render context, then the
 * globals (range, namespace, dict, raise_exception, strftime_now).
 *
 * Attribute and item access follow jinja2's sandbox: `x.name` tries
 * Python attributes (methods) first, then the item; `x['name']` the item
 * first. A miss is an undefined value, which prints as "", is false,
 * iterates as empty and fails when used otherwise. */
#include "chat/jinja.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define J_MAX_RECURSION 2000 /* C recursion of eval/exec, whatever the template */

static spx_status eval(jrt *r, const jnode *n, jframe *f, jv **out);
static spx_status exec(jrt *r, const jnode *n, jframe *f, jbuf *o);

static spx_status step(jrt *r, const jnode *at) {
    if (++r->steps > J_MAX_STEPS)
        return jfail(r, at, SPX_ERR_RANGE, "rendering takes more than %llu loop iterations and calls",
                     (unsigned long long)J_MAX_STEPS);
    return SPX_OK;
}

/* ---- frames ---------------------------------------------------------- */

static jframe *frame_new(jrt *r, jframe *parent) {
    jframe *f = ja_alloc(&r->arena, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

static bool frame_set(jrt *r, jframe *f, jstr name, jv *v) {
    for (size_t i = 0; i < f->n; i++)
        if (f->names[i].n == name.n && !memcmp(f->names[i].p, name.p, name.n)) {
            f->vals[i] = v;
            return true;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        jstr *nn = ja_alloc(&r->arena, cap * sizeof *nn);
        jv **nv = ja_alloc(&r->arena, cap * sizeof *nv);
        if (!nn || !nv) return false;
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(nv, f->vals, f->n * sizeof *nv);
        }
        f->names = nn;
        f->vals = nv;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
    return true;
}

static spx_status lookup(jrt *r, const jnode *at, jframe *f, jstr name, jv **out) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->names[i].n == name.n && !memcmp(f->names[i].p, name.p, name.n)) {
                *out = f->vals[i];
                return SPX_OK;
            }
    jv *v = jv_dict_gets(r->ctx, name.p, name.n);
    if (v) {
        *out = v;
        return SPX_OK;
    }
    const jbuiltin *b = jb_find(JB_GLOBAL, name.p, name.n);
    if (!b) b = jb_find(JB_UNSUPPORTED, name.p, name.n);
    if (b) {
        jv *g = jv_new(r, JV_FUNC);
        if (!g) return joom(r, at);
        g->fn.fn = b;
        *out = g;
        return SPX_OK;
    }
    *out = jv_undef(r, "'%.*s' is undefined", (int)(name.n > 100 ? 100 : name.n), name.p);
    return *out ? SPX_OK : joom(r, at);
}

/* ---- access ---------------------------------------------------------- */

static jv *method_value(jrt *r, jv *obj, jstr name, bool *found) {
    bool unsafe = false;
    const jbuiltin *b = jb_method(obj, name, &unsafe);
    *found = b || unsafe;
    if (unsafe)
        return jv_undef(r, "access to attribute '%.*s' of '%s' object is unsafe (the sandbox forbids changing values)",
                        (int)name.n, name.p, jv_typename(obj));
    if (!b) return NULL;
    jv *m = jv_new(r, JV_FUNC);
    if (m) {
        m->fn.fn = b;
        m->fn.self = obj;
    }
    return m;
}

static spx_status loop_attr(jrt *r, const jnode *at, jv *obj, jstr name, jv **out) {
    jloop *l = obj->loop;
    int64_t i = l->index0, n = l->length;
#define IS(s) (name.n == strlen(s) && !memcmp(name.p, s, name.n))
    if (IS("index")) *out = jv_int(r, i + 1);
    else if (IS("index0")) *out = jv_int(r, i);
    else if (IS("revindex")) *out = jv_int(r, n - i);
    else if (IS("revindex0")) *out = jv_int(r, n - i - 1);
    else if (IS("first")) *out = jv_bool(i == 0);
    else if (IS("last")) *out = jv_bool(i == n - 1);
    else if (IS("length")) *out = jv_int(r, n);
    else if (IS("depth")) *out = jv_int(r, 1);
    else if (IS("depth0")) *out = jv_int(r, 0);
    else if (IS("previtem")) *out = i > 0 ? l->items->l.v[i - 1] : jv_undef(r, "there is no previous item");
    else if (IS("nextitem")) *out = i + 1 < n ? l->items->l.v[i + 1] : jv_undef(r, "there is no next item");
    else {
        bool found;
        *out = method_value(r, obj, name, &found);
        if (!found) *out = jv_undef(r, "'LoopContext object' has no attribute '%.*s'", (int)name.n, name.p);
    }
#undef IS
    return *out ? SPX_OK : joom(r, at);
}

spx_status jgetattr(jrt *r, const jnode *at, jv *obj, jstr name, jv **out) {
    if (obj->type == JV_UNDEF) return jv_undef_fail(r, at, obj);
    if (obj->type == JV_LOOP) return loop_attr(r, at, obj, name, out);
    if (name.n && name.p[0] == '_') {
        /* Python's own attributes (__class__, ...) are unsafe; a dict key is not one */
        jv *v = obj->type == JV_DICT || obj->type == JV_NS ? jv_dict_gets(obj, name.p, name.n) : NULL;
        *out = v ? v : jv_undef(r, "access to attribute '%.*s' is unsafe", (int)name.n, name.p);
        return *out ? SPX_OK : joom(r, at);
    }
    bool found = false;
    if (obj->type != JV_NS) {
        *out = method_value(r, obj, name, &found);
        if (found) return *out ? SPX_OK : joom(r, at);
    }
    if (obj->type == JV_DICT || obj->type == JV_NS) {
        jv *v = jv_dict_gets(obj, name.p, name.n);
        if (v) {
            *out = v;
            return SPX_OK;
        }
    }
    *out = jv_undef(r, "'%s object' has no attribute '%.*s'", obj->type == JV_NS ? "Namespace" : jv_typename(obj),
                    (int)(name.n > 100 ? 100 : name.n), name.p);
    return *out ? SPX_OK : joom(r, at);
}

spx_status jgetitem(jrt *r, const jnode *at, jv *obj, jv *key, jv **out) {
    if (obj->type == JV_UNDEF) return jv_undef_fail(r, at, obj);
    if (obj->type == JV_DICT) {
        jv *v = jv_dict_get(obj, key);
        if (v) {
            *out = v;
            return SPX_OK;
        }
    } else if (obj->type == JV_LIST && (obj->flags & JV_F_ITER)) {
        *out = jv_undef(r, "'generator' object is not subscriptable");
        return *out ? SPX_OK : joom(r, at);
    } else if ((obj->type == JV_LIST || obj->type == JV_STR) && (key->type == JV_INT || key->type == JV_BOOL)) {
        int64_t i = key->type == JV_BOOL ? key->b : key->i;
        if (obj->type == JV_LIST) {
            int64_t n = (int64_t)obj->l.n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                *out = obj->l.v[i];
                return SPX_OK;
            }
        } else {
            int64_t n = (int64_t)ju_len(obj->s.p, obj->s.n);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                size_t s = ju_offset(obj->s.p, obj->s.n, (size_t)i);
                int32_t cp;
                size_t k = ju_next(obj->s.p + s, obj->s.n - s, &cp);
                *out = jv_str(r, obj->s.p + s, k);
                return *out ? SPX_OK : joom(r, at);
            }
        }
        *out = jv_undef(r, "'%s object' has no element %lld", jv_typename(obj), (long long)i);
        return *out ? SPX_OK : joom(r, at);
    }
    if (key->type == JV_STR) {
        if (obj->type == JV_NS) {
            jv *v = jv_dict_get(obj, key);
            if (v) {
                *out = v;
                return SPX_OK;
            }
        } else if (obj->type != JV_DICT || key->s.n == 0 || key->s.p[0] != '_') {
            bool found = false;
            if (obj->type == JV_LOOP) return loop_attr(r, at, obj, key->s, out);
            *out = method_value(r, obj, key->s, &found);
            if (found) return *out ? SPX_OK : joom(r, at);
        }
        *out = jv_undef(r, "'%s object' has no attribute '%.*s'", jv_typename(obj), (int)(key->s.n > 100 ? 100 : key->s.n),
                        key->s.p);
    } else {
        *out = jv_undef(r, "'%s object' has no such element", jv_typename(obj));
    }
    return *out ? SPX_OK : joom(r, at);
}

/* Python slice indices (start, stop, step) over n items: the positions */
static spx_status slice_of(jrt *r, const jnode *at, jv *obj, jv *vs[3], jv **out) {
    int64_t v[3];
    bool given[3];
    for (int k = 0; k < 3; k++) {
        given[k] = vs[k] && vs[k]->type != JV_NONE;
        if (given[k] && vs[k]->type != JV_INT && vs[k]->type != JV_BOOL) {
            *out = jv_undef(r, "slice indices must be integers or None");
            return *out ? SPX_OK : joom(r, at);
        }
        v[k] = given[k] ? (vs[k]->type == JV_BOOL ? vs[k]->b : vs[k]->i) : 0;
    }
    int64_t st = given[2] ? v[2] : 1;
    if (st == 0) return jfail(r, at, SPX_ERR_ARG, "slice step cannot be zero");
    bool is_str = obj->type == JV_STR;
    int64_t n = is_str ? (int64_t)ju_len(obj->s.p, obj->s.n) : (int64_t)obj->l.n;
    int64_t lo, hi;
    if (st > 0) {
        lo = given[0] ? (v[0] < 0 ? (v[0] + n < 0 ? 0 : v[0] + n) : (v[0] > n ? n : v[0])) : 0;
        hi = given[1] ? (v[1] < 0 ? (v[1] + n < 0 ? 0 : v[1] + n) : (v[1] > n ? n : v[1])) : n;
    } else {
        lo = given[0] ? (v[0] < 0 ? (v[0] + n < 0 ? -1 : v[0] + n) : (v[0] >= n ? n - 1 : v[0])) : n - 1;
        hi = given[1] ? (v[1] < 0 ? (v[1] + n < 0 ? -1 : v[1] + n) : (v[1] >= n ? n - 1 : v[1])) : -1;
    }
    if (!is_str) {
        jv *l = jv_list(r, 0);
        if (!l) return joom(r, at);
        l->flags = obj->flags & JV_F_TUPLE;
        for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st)
            if (!jv_push(r, l, obj->l.v[i])) return joom(r, at);
        *out = l;
        return SPX_OK;
    }
    /* strings: code point offsets */
    size_t *off = malloc(((size_t)n + 1) * sizeof *off);
    if (!off) return joom(r, at);
    size_t p = 0;
    for (int64_t i = 0; i < n; i++) {
        off[i] = p;
        int32_t cp;
        p += ju_next(obj->s.p + p, obj->s.n - p, &cp);
    }
    off[n] = p;
    jbuf b = {0};
    bool ok = true;
    if (st == 1 && lo < hi) ok = jbuf_put(&b, obj->s.p + off[lo], off[hi] - off[lo]);
    else
        for (int64_t i = lo; ok && (st > 0 ? i < hi : i > hi); i += st) ok = jbuf_put(&b, obj->s.p + off[i], off[i + 1] - off[i]);
    free(off);
    if (!ok) {
        spx_status s = jbuf_fail(r, at, &b);
        jbuf_free(&b);
        return s;
    }
    *out = jv_strbuf(r, &b);
    return *out ? SPX_OK : joom(r, at);
}

/* ---- calls ----------------------------------------------------------- */

spx_status jbind(jrt *r, const jnode *at, const char *fname, const jargs *a, const char *params, jv **out,
                 size_t nout) {
    for (size_t i = 0; i < nout; i++) out[i] = NULL;
    if (a->npos > nout) return jfail(r, at, SPX_ERR_ARG, "%s() takes at most %zu arguments (%zu given)", fname, nout, a->npos);
    for (size_t i = 0; i < a->npos; i++) out[i] = a->pos[i];
    for (size_t k = 0; k < a->nkw; k++) {
        const char *p = params;
        size_t idx = 0;
        bool hit = false;
        while (*p) {
            size_t l = strcspn(p, ",");
            if (l == a->kwn[k].n && !memcmp(p, a->kwn[k].p, l)) {
                hit = true;
                break;
            }
            p += l + (p[l] == ',');
            idx++;
        }
        if (!hit || idx >= nout)
            return jfail(r, at, SPX_ERR_ARG, "%s() got an unexpected keyword argument '%.*s'", fname, (int)a->kwn[k].n,
                         a->kwn[k].p);
        if (out[idx]) return jfail(r, at, SPX_ERR_ARG, "%s() got multiple values for argument '%.*s'", fname,
                                   (int)a->kwn[k].n, a->kwn[k].p);
        out[idx] = a->kwv[k];
    }
    return SPX_OK;
}

static spx_status call_macro(jrt *r, const jnode *at, jv *m, const jargs *a, jv **out) {
    const jnode *mn = m->m.node;
    if (r->depth >= J_MAX_DEPTH)
        return jfail(r, at, SPX_ERR_RANGE, "macro calls nested deeper than %d (runaway recursion?)", J_MAX_DEPTH);
    SPX_TRY(step(r, at));
    bool varargs = mn->op & 1, kwargs = mn->op & 2;
    if (a->npos > mn->nkw && !varargs)
        return jfail(r, at, SPX_ERR_ARG, "macro '%.*s' takes not more than %zu argument(s)", (int)mn->name.n, mn->name.p,
                     mn->nkw);
    jframe *f = frame_new(r, m->m.scope);
    jv *extra_pos = varargs ? jv_list(r, 0) : NULL, *extra_kw = kwargs ? jv_new(r, JV_DICT) : NULL;
    if (!f || (varargs && !extra_pos) || (kwargs && !extra_kw)) return joom(r, at);
    if (varargs) {
        extra_pos->flags = JV_F_TUPLE;
        for (size_t i = mn->nkw; i < a->npos; i++)
            if (!jv_push(r, extra_pos, a->pos[i])) return joom(r, at);
        static const jstr vn = {"varargs", 7};
        if (!frame_set(r, f, vn, extra_pos)) return joom(r, at);
    }
    if (kwargs) {
        static const jstr kn = {"kwargs", 6};
        if (!frame_set(r, f, kn, extra_kw)) return joom(r, at);
    }
    for (size_t k = 0; k < a->nkw; k++) {
        bool hit = false;
        for (size_t i = 0; i < mn->nkw; i++)
            if (mn->kwn[i].n == a->kwn[k].n && !memcmp(mn->kwn[i].p, a->kwn[k].p, a->kwn[k].n)) {
                hit = true;
                if (i < a->npos)
                    return jfail(r, at, SPX_ERR_ARG, "macro '%.*s' got multiple values for argument '%.*s'",
                                 (int)mn->name.n, mn->name.p, (int)a->kwn[k].n, a->kwn[k].p);
            }
        if (!hit && kwargs) {
            jv *key = jv_str(r, a->kwn[k].p, a->kwn[k].n);
            if (!key || !jv_dict_set(r, extra_kw, key, a->kwv[k])) return joom(r, at);
        } else if (!hit) {
            return jfail(r, at, SPX_ERR_ARG, "macro '%.*s' takes no keyword argument '%.*s'", (int)mn->name.n,
                         mn->name.p, (int)a->kwn[k].n, a->kwn[k].p);
        }
    }
    r->depth++;
    spx_status st = SPX_OK;
    for (size_t i = 0; i < mn->nkw && !st; i++) {
        jv *v = i < a->npos ? a->pos[i] : NULL;
        for (size_t k = 0; !v && k < a->nkw; k++)
            if (mn->kwn[i].n == a->kwn[k].n && !memcmp(mn->kwn[i].p, a->kwn[k].p, a->kwn[k].n)) v = a->kwv[k];
        if (!v && mn->items[i]) st = eval(r, mn->items[i], f, &v);
        if (!st && !v) v = jv_undef(r, "parameter '%.*s' was not provided", (int)mn->kwn[i].n, mn->kwn[i].p);
        if (!st && (!v || !frame_set(r, f, mn->kwn[i], v))) st = joom(r, at);
    }
    jbuf b = {0};
    if (!st) st = exec(r, mn->b, f, &b);
    r->depth--;
    if (st) {
        jbuf_free(&b);
        return st;
    }
    *out = jv_strbuf(r, &b);
    return *out ? SPX_OK : joom(r, at);
}

spx_status jcall_builtin(jrt *r, const jnode *at, const jbuiltin *b, jv *self, const jargs *a, jv **out) {
    if (b->kind == JB_UNSUPPORTED || !b->fn)
        return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported %s '%s'", self ? "method" : "function", b->name);
    return b->fn(r, at, self, a, out);
}

spx_status jcall_value(jrt *r, const jnode *at, jv *callee, const jargs *a, jv **out) {
    switch (callee->type) {
    case JV_MACRO: return call_macro(r, at, callee, a, out);
    case JV_FUNC: return jcall_builtin(r, at, callee->fn.fn, callee->fn.self, a, out);
    case JV_UNDEF: return jv_undef_fail(r, at, callee);
    default: return jfail(r, at, SPX_ERR_ARG, "'%s' object is not callable", jv_typename(callee));
    }
}

/* Evaluates a call node's arguments. */
static spx_status eval_args(jrt *r, const jnode *n, jframe *f, jargs *a) {
    a->npos = n->n;
    a->nkw = n->nkw;
    a->kwn = n->kwn;
    a->pos = n->n ? ja_alloc(&r->arena, n->n * sizeof *a->pos) : NULL;
    a->kwv = n->nkw ? ja_alloc(&r->arena, n->nkw * sizeof *a->kwv) : NULL;
    if ((n->n && !a->pos) || (n->nkw && !a->kwv)) return joom(r, n);
    for (size_t i = 0; i < n->n; i++) SPX_TRY(eval(r, n->items[i], f, &a->pos[i]));
    for (size_t i = 0; i < n->nkw; i++) SPX_TRY(eval(r, n->kw[i], f, &a->kwv[i]));
    return SPX_OK;
}

/* ---- arithmetic ------------------------------------------------------ */

static spx_status type_err(jrt *r, const jnode *at, const char *op, const jv *a, const jv *b) {
    if (a->type == JV_UNDEF) return jv_undef_fail(r, at, a);
    if (b && b->type == JV_UNDEF) return jv_undef_fail(r, at, b);
    if (!b) return jfail(r, at, SPX_ERR_ARG, "bad operand type for unary %s: '%s'", op, jv_typename(a));
    if (a->type == JV_STR && !strcmp(op, "+"))
        return jfail(r, at, SPX_ERR_ARG, "can only concatenate str (not \"%s\") to str", jv_typename(b));
    return jfail(r, at, SPX_ERR_ARG, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_typename(a),
                 jv_typename(b));
}

static int64_t ival(const jv *v) { return v->type == JV_BOOL ? v->b : v->i; }

static spx_status repeat(jrt *r, const jnode *at, jv *seq, int64_t k, jv **out) {
    if (k < 0) k = 0;
    if (seq->type == JV_STR) {
        if (seq->s.n && (uint64_t)k > J_OUT_MAX / seq->s.n)
            return jfail(r, at, SPX_ERR_RANGE, "string repetition longer than %zu MiB", J_OUT_MAX >> 20);
        jbuf b = {0};
        for (int64_t i = 0; i < k; i++)
            if (!jbuf_put(&b, seq->s.p, seq->s.n)) {
                jbuf_free(&b);
                return joom(r, at);
            }
        *out = jv_strbuf(r, &b);
        return *out ? SPX_OK : joom(r, at);
    }
    if (seq->l.n && (uint64_t)k > (J_OUT_MAX / 8) / seq->l.n)
        return jfail(r, at, SPX_ERR_RANGE, "list repetition of more than %zu items", J_OUT_MAX / 8);
    jv *l = jv_list(r, (size_t)k * seq->l.n);
    if (!l) return joom(r, at);
    l->flags = seq->flags & JV_F_TUPLE;
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq->l.n; j++) l->l.v[l->l.n++] = seq->l.v[j];
    *out = l;
    return SPX_OK;
}

/* Python's float divmod */
static void fdivmod(double vx, double wx, double *fdiv, double *fmodv) {
    double mod = fmod(vx, wx), div = (vx - mod) / wx, floordiv;
    if (mod) {
        if ((wx < 0) != (mod < 0)) {
            mod += wx;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, wx);
    }
    if (div) {
        floordiv = floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
        floordiv = copysign(0.0, vx / wx);
    }
    *fdiv = floordiv;
    *fmodv = mod;
}

static spx_status binop(jrt *r, const jnode *at, int op, jv *a, jv *b, jv **out) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    const char *nm = names[op];
    bool num = jv_is_num(a) && jv_is_num(b);
    bool ints = num && a->type != JV_FLOAT && b->type != JV_FLOAT;
    if (op == OP_ADD && !num) {
        if (a->type == JV_STR && b->type == JV_STR) {
            if ((a->flags ^ b->flags) & JV_F_SAFE)
                return jfail(r, at, SPX_ERR_UNSUPPORTED,
                             "unsupported: '+' of a |safe (Markup) string and a plain string (Markup escapes it)");
            if (b->s.n > J_OUT_MAX || a->s.n > J_OUT_MAX - b->s.n)
                return jfail(r, at, SPX_ERR_RANGE, "string longer than %zu MiB", J_OUT_MAX >> 20);
            jv *v = jv_new(r, JV_STR);
            char *p = v ? ja_alloc(&r->arena, a->s.n + b->s.n + 1) : NULL;
            if (!p) return joom(r, at);
            if (a->s.n) memcpy(p, a->s.p, a->s.n);
            if (b->s.n) memcpy(p + a->s.n, b->s.p, b->s.n);
            v->s = (jstr){p, a->s.n + b->s.n};
            v->flags = a->flags & JV_F_SAFE;
            *out = v;
            return SPX_OK;
        }
        if (a->type == JV_LIST && b->type == JV_LIST && (a->flags & JV_F_TUPLE) == (b->flags & JV_F_TUPLE)) {
            jv *l = jv_list(r, a->l.n + b->l.n);
            if (!l) return joom(r, at);
            l->flags = a->flags & JV_F_TUPLE;
            for (size_t i = 0; i < a->l.n; i++) l->l.v[l->l.n++] = a->l.v[i];
            for (size_t i = 0; i < b->l.n; i++) l->l.v[l->l.n++] = b->l.v[i];
            *out = l;
            return SPX_OK;
        }
        return type_err(r, at, nm, a, b);
    }
    if (op == OP_MUL && !num) {
        if ((a->type == JV_STR || a->type == JV_LIST) && (b->type == JV_INT || b->type == JV_BOOL))
            return repeat(r, at, a, ival(b), out);
        if ((b->type == JV_STR || b->type == JV_LIST) && (a->type == JV_INT || a->type == JV_BOOL))
            return repeat(r, at, b, ival(a), out);
        return type_err(r, at, nm, a, b);
    }
    if (op == OP_MOD && a->type == JV_STR)
        return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported: printf-style string formatting with '%%'");
    if (!num) return type_err(r, at, nm, a, b);
    if (ints) {
        int64_t x = ival(a), y = ival(b), z = 0;
        bool ovf = false;
        switch (op) {
        case OP_ADD: ovf = __builtin_add_overflow(x, y, &z); break;
        case OP_SUB: ovf = __builtin_sub_overflow(x, y, &z); break;
        case OP_MUL: ovf = __builtin_mul_overflow(x, y, &z); break;
        case OP_DIV:
            if (!y) return jfail(r, at, SPX_ERR_ARG, "division by zero");
            *out = jv_float(r, (double)x / (double)y);
            return *out ? SPX_OK : joom(r, at);
        case OP_FLOORDIV: case OP_MOD:
            if (!y) return jfail(r, at, SPX_ERR_ARG, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) {
                ovf = op == OP_FLOORDIV;
                z = 0;
                break;
            }
            {
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                z = op == OP_FLOORDIV ? q : m;
            }
            break;
        case OP_POW:
            if (y < 0) {
                if (!x) return jfail(r, at, SPX_ERR_ARG, "0 cannot be raised to a negative power");
                *out = jv_float(r, pow((double)x, (double)y));
                return *out ? SPX_OK : joom(r, at);
            }
            z = 1;
            for (int64_t i = 0; i < y && !ovf; i++) {
                ovf = __builtin_mul_overflow(z, x, &z);
                if (z == 0 || z == 1) break;
                if (z == -1) { z = (y % 2) ? -1 : 1; break; }
            }
            break;
        }
        if (ovf) return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported: integer result beyond 64 bits (%s)", nm);
        *out = jv_int(r, z);
        return *out ? SPX_OK : joom(r, at);
    }
    double x = jv_num(a), y = jv_num(b), z = 0, d;
    switch (op) {
    case OP_ADD: z = x + y; break;
    case OP_SUB: z = x - y; break;
    case OP_MUL: z = x * y; break;
    case OP_DIV:
        if (y == 0) return jfail(r, at, SPX_ERR_ARG, "float division by zero");
        z = x / y;
        break;
    case OP_FLOORDIV: case OP_MOD:
        if (y == 0) return jfail(r, at, SPX_ERR_ARG, "float floor division or modulo by zero");
        if (op == OP_FLOORDIV) fdivmod(x, y, &z, &d);
        else fdivmod(x, y, &d, &z);
        break;
    case OP_POW:
        if (x == 0 && y < 0) return jfail(r, at, SPX_ERR_ARG, "0.0 cannot be raised to a negative power");
        if (x < 0 && y != floor(y))
            return jfail(r, at, SPX_ERR_UNSUPPORTED, "unsupported: a negative number to a fractional power (complex)");
        z = pow(x, y);
        if (isinf(z) && !isinf(x) && !isinf(y)) return jfail(r, at, SPX_ERR_ARG, "numerical result out of range");
        break;
    }
    *out = jv_float(r, z);
    return *out ? SPX_OK : joom(r, at);
}

static spx_status contains(jrt *r, const jnode *at, jv *needle, jv *hay, bool *out) {
    switch (hay->type) {
    case JV_STR:
        if (needle->type != JV_STR)
            return needle->type == JV_UNDEF ? jv_undef_fail(r, at, needle)
                                            : jfail(r, at, SPX_ERR_ARG, "'in <string>' requires string as left operand, not %s",
                                                    jv_typename(needle));
        *out = !needle->s.n || (needle->s.n <= hay->s.n && memmem(hay->s.p, hay->s.n, needle->s.p, needle->s.n));
        return SPX_OK;
    case JV_LIST:
        *out = false;
        for (size_t i = 0; i < hay->l.n && !*out; i++) *out = jv_eq(hay->l.v[i], needle);
        return SPX_OK;
    case JV_DICT: *out = jv_dict_get(hay, needle) != NULL; return SPX_OK;
    case JV_UNDEF: *out = false; return SPX_OK;
    default: return jfail(r, at, SPX_ERR_ARG, "argument of type '%s' is not iterable", jv_typename(hay));
    }
}

static bool hashable(const jv *v) {
    if (v->type == JV_DICT || v->type == JV_NS || v->type == JV_UNDEF) return false;
    if (v->type == JV_LIST) {
        if (!(v->flags & JV_F_TUPLE)) return false;
        for (size_t i = 0; i < v->l.n; i++)
            if (!hashable(v->l.v[i])) return false;
    }
    return true;
}

/* ---- expressions ----------------------------------------------------- */

static spx_status eval_inner(jrt *r, const jnode *n, jframe *f, jv **out) {
    jv *a, *b;
    switch (n->kind) {
    case N_CONST: *out = n->val; return SPX_OK;
    case N_NAME: return lookup(r, n, f, n->name, out);
    case N_ATTR:
        SPX_TRY(eval(r, n->a, f, &a));
        return jgetattr(r, n, a, n->name, out);
    case N_ITEM:
        SPX_TRY(eval(r, n->a, f, &a));
        SPX_TRY(eval(r, n->b, f, &b));
        return jgetitem(r, n, a, b, out);
    case N_SLICE: {
        jv *parts[3] = {0};
        SPX_TRY(eval(r, n->a, f, &a));
        if (n->b) SPX_TRY(eval(r, n->b, f, &parts[0]));
        if (n->c) SPX_TRY(eval(r, n->c, f, &parts[1]));
        if (n->d) SPX_TRY(eval(r, n->d, f, &parts[2]));
        if (a->type == JV_UNDEF) return jv_undef_fail(r, n, a);
        if ((a->type != JV_LIST && a->type != JV_STR) || (a->flags & JV_F_ITER)) {
            *out = jv_undef(r, "'%s' object cannot be sliced", jv_typename(a));
            return *out ? SPX_OK : joom(r, n);
        }
        return slice_of(r, n, a, parts, out);
    }
    case N_CALL: {
        jargs args;
        SPX_TRY(eval(r, n->a, f, &a));
        SPX_TRY(eval_args(r, n, f, &args));
        return jcall_value(r, n, a, &args, out);
    }
    case N_FILTER: {
        jargs args;
        if (n->a) SPX_TRY(eval(r, n->a, f, &a));
        else a = r->block_in; /* block set: the rendered body */
        SPX_TRY(eval_args(r, n, f, &args));
        SPX_TRY(step(r, n));
        return jcall_builtin(r, n, n->fn, a, &args, out);
    }
    case N_TEST: {
        jargs args;
        SPX_TRY(eval(r, n->a, f, &a));
        SPX_TRY(eval_args(r, n, f, &args));
        SPX_TRY(jcall_builtin(r, n, n->fn, a, &args, &b));
        *out = jv_bool(jv_truthy(b) != (n->op != 0));
        return SPX_OK;
    }
    case N_NEG: case N_POS:
        SPX_TRY(eval(r, n->a, f, &a));
        if (!jv_is_num(a)) return type_err(r, n, n->kind == N_NEG ? "-" : "+", a, NULL);
        if (n->kind == N_POS && a->type != JV_BOOL) *out = a;
        else if (a->type == JV_FLOAT) *out = jv_float(r, n->kind == N_NEG ? -a->f : a->f);
        else if (ival(a) == INT64_MIN) return jfail(r, n, SPX_ERR_UNSUPPORTED, "unsupported: integer beyond 64 bits");
        else *out = jv_int(r, n->kind == N_NEG ? -ival(a) : ival(a));
        return *out ? SPX_OK : joom(r, n);
    case N_NOT:
        SPX_TRY(eval(r, n->a, f, &a));
        *out = jv_bool(!jv_truthy(a));
        return SPX_OK;
    case N_AND: case N_OR:
        SPX_TRY(eval(r, n->a, f, &a));
        if (jv_truthy(a) == (n->kind == N_OR)) {
            *out = a;
            return SPX_OK;
        }
        return eval(r, n->b, f, out);
    case N_BIN:
        SPX_TRY(eval(r, n->a, f, &a));
        SPX_TRY(eval(r, n->b, f, &b));
        return binop(r, n, n->op, a, b, out);
    case N_CMP: {
        SPX_TRY(eval(r, n->a, f, &a));
        for (size_t i = 0; i < n->n; i++) {
            SPX_TRY(eval(r, n->items[i], f, &b));
            bool ok;
            int c;
            switch (n->ops[i]) {
            case OP_EQ: ok = jv_eq(a, b); break;
            case OP_NE: ok = !jv_eq(a, b); break;
            case OP_IN: SPX_TRY(contains(r, n, a, b, &ok)); break;
            case OP_NOTIN: SPX_TRY(contains(r, n, a, b, &ok)); ok = !ok; break;
            default:
                SPX_TRY(jv_cmp(r, n, a, b, &c));
                if ((jv_is_num(a) && isnan(jv_num(a))) || (jv_is_num(b) && isnan(jv_num(b)))) ok = false;
                else ok = n->ops[i] == OP_LT ? c < 0 : n->ops[i] == OP_LE ? c <= 0 : n->ops[i] == OP_GT ? c > 0 : c >= 0;
            }
            if (!ok) {
                *out = &jv_false;
                return SPX_OK;
            }
            a = b;
        }
        *out = &jv_true;
        return SPX_OK;
    }
    case N_COND:
        SPX_TRY(eval(r, n->b, f, &b));
        if (jv_truthy(b)) return eval(r, n->a, f, out);
        if (n->c) return eval(r, n->c, f, out);
        *out = jv_undef(r, "the inline if-expression evaluated to false and has no else section");
        return *out ? SPX_OK : joom(r, n);
    case N_LIST: case N_TUPLE: {
        jv *l = jv_list(r, n->n);
        if (!l) return joom(r, n);
        if (n->kind == N_TUPLE) l->flags = JV_F_TUPLE;
        for (size_t i = 0; i < n->n; i++) SPX_TRY(eval(r, n->items[i], f, &l->l.v[l->l.n++]));
        *out = l;
        return SPX_OK;
    }
    case N_DICT: {
        jv *d = jv_new(r, JV_DICT);
        if (!d) return joom(r, n);
        for (size_t i = 0; i < n->n; i++) {
            SPX_TRY(eval(r, n->items[i], f, &a));
            SPX_TRY(eval(r, n->kw[i], f, &b));
            if (!hashable(a)) return jfail(r, n->items[i], SPX_ERR_ARG, "unhashable type: '%s'", jv_typename(a));
            if (!jv_dict_set(r, d, a, b)) return joom(r, n);
        }
        *out = d;
        return SPX_OK;
    }
    case N_CONCAT: {
        jbuf o = {0};
        for (size_t i = 0; i < n->n; i++) {
            spx_status st = eval(r, n->items[i], f, &a);
            if (!st) st = jv_to_str(r, n, a, &o);
            if (st) {
                jbuf_free(&o);
                return st;
            }
        }
        *out = jv_strbuf(r, &o);
        return *out ? SPX_OK : joom(r, n);
    }
    default:
        return jfail(r, n, SPX_ERR_INTERNAL, "internal error: node %d is not an expression", (int)n->kind);
    }
}

static spx_status eval(jrt *r, const jnode *n, jframe *f, jv **out) {
    if (++r->rdepth > J_MAX_RECURSION) {
        r->rdepth--;
        return jfail(r, n, SPX_ERR_RANGE, "template nested too deeply (more than %d levels)", J_MAX_RECURSION);
    }
    spx_status st = eval_inner(r, n, f, out);
    r->rdepth--;
    return st;
}

/* ---- statements ------------------------------------------------------ */

static spx_status assign(jrt *r, const jnode *at, jframe *f, const jstr *names, size_t k, jv *v) {
    if (k == 1) return frame_set(r, f, names[0], v) ? SPX_OK : joom(r, at);
    jv *items;
    if (v->type == JV_UNDEF) return jv_undef_fail(r, at, v);
    SPX_TRY(jv_iter(r, at, v, &items));
    if (items->l.n != k)
        return jfail(r, at, SPX_ERR_ARG, "%s values to unpack (expected %zu, got %zu)",
                     items->l.n < k ? "not enough" : "too many", k, items->l.n);
    for (size_t i = 0; i < k; i++)
        if (!frame_set(r, f, names[i], items->l.v[i])) return joom(r, at);
    return SPX_OK;
}

static spx_status exec_for(jrt *r, const jnode *n, jframe *f, jbuf *o) {
    jv *it, *items;
    SPX_TRY(eval(r, n->a, f, &it));
    SPX_TRY(jv_iter(r, n->a, it, &items));
    jframe *lf = frame_new(r, f);
    if (!lf) return joom(r, n);
    if (n->d) {
        jv *kept = jv_list(r, 0);
        if (!kept) return joom(r, n);
        for (size_t i = 0; i < items->l.n; i++) {
            jv *c;
            lf->n = 0;
            SPX_TRY(step(r, n));
            SPX_TRY(assign(r, n, lf, n->kwn, n->nkw, items->l.v[i]));
            SPX_TRY(eval(r, n->d, lf, &c));
            if (jv_truthy(c) && !jv_push(r, kept, items->l.v[i])) return joom(r, n);
        }
        items = kept;
    }
    if (!items->l.n) {
        if (!n->c) return SPX_OK;
        lf->n = 0;
        return exec(r, n->c, lf, o);
    }
    static const jstr loop_name = {"loop", 4};
    for (size_t i = 0; i < items->l.n; i++) {
        SPX_TRY(step(r, n));
        lf->n = 0;
        jloop *lp = ja_alloc(&r->arena, sizeof *lp);
        jv *lv = jv_new(r, JV_LOOP);
        if (!lp || !lv) return joom(r, n);
        lp->index0 = (int64_t)i;
        lp->length = (int64_t)items->l.n;
        lp->items = items;
        lv->loop = lp;
        if (!frame_set(r, lf, loop_name, lv)) return joom(r, n);
        SPX_TRY(assign(r, n, lf, n->kwn, n->nkw, items->l.v[i]));
        SPX_TRY(exec(r, n->b, lf, o));
        if (r->ctl) {
            int c = r->ctl;
            r->ctl = 0;
            if (c == 1) break;
        }
    }
    return SPX_OK;
}

static spx_status exec_set(jrt *r, const jnode *n, jframe *f, jv *v) {
    if (n->name.p) {
        jv *ns;
        SPX_TRY(lookup(r, n, f, n->kwn[0], &ns));
        if (ns->type != JV_NS)
            return jfail(r, n, SPX_ERR_ARG, "cannot assign attribute on non-namespace object '%.*s'", (int)n->kwn[0].n,
                         n->kwn[0].p);
        jv *k = jv_str(r, n->name.p, n->name.n);
        if (!k || !jv_dict_set(r, ns, k, v)) return joom(r, n);
        return SPX_OK;
    }
    return assign(r, n, f, n->kwn, n->nkw, v);
}

static spx_status exec_inner(jrt *r, const jnode *n, jframe *f, jbuf *o) {
    jv *v;
    switch (n->kind) {
    case N_BODY:
        for (size_t i = 0; i < n->n && !r->ctl; i++) SPX_TRY(exec(r, n->items[i], f, o));
        return SPX_OK;
    case N_TEXT:
        return jbuf_put(o, n->val->s.p, n->val->s.n) ? SPX_OK : jbuf_fail(r, n, o);
    case N_OUTPUT:
        SPX_TRY(eval(r, n->a, f, &v));
        return jv_to_str(r, n->a, v, o);
    case N_IF:
        SPX_TRY(eval(r, n->a, f, &v));
        if (jv_truthy(v)) return exec(r, n->b, f, o);
        return n->c ? exec(r, n->c, f, o) : SPX_OK;
    case N_FOR: return exec_for(r, n, f, o);
    case N_SET:
        SPX_TRY(eval(r, n->a, f, &v));
        return exec_set(r, n, f, v);
    case N_SETBLOCK: {
        jbuf b = {0};
        spx_status st = exec(r, n->b, f, &b);
        if (st) {
            jbuf_free(&b);
            return st;
        }
        if (!(v = jv_strbuf(r, &b))) return joom(r, n);
        r->block_in = v;
        if (n->a) SPX_TRY(eval(r, n->a, f, &v)); /* the chain's first filter reads r->block_in */
        return exec_set(r, n, f, v);
    }
    case N_MACRO:
        if (!(v = jv_new(r, JV_MACRO))) return joom(r, n);
        v->m.node = n;
        v->m.scope = f;
        return frame_set(r, f, n->name, v) ? SPX_OK : joom(r, n);
    case N_BREAK: r->ctl = 1; return SPX_OK;
    case N_CONTINUE: r->ctl = 2; return SPX_OK;
    default:
        return jfail(r, n, SPX_ERR_INTERNAL, "internal error: node %d is not a statement", (int)n->kind);
    }
}

static spx_status exec(jrt *r, const jnode *n, jframe *f, jbuf *o) {
    if (++r->rdepth > J_MAX_RECURSION) {
        r->rdepth--;
        return jfail(r, n, SPX_ERR_RANGE, "template nested too deeply (more than %d levels)", J_MAX_RECURSION);
    }
    spx_status st = exec_inner(r, n, f, o);
    r->rdepth--;
    return st;
}

/* ---- API ------------------------------------------------------------- */

spx_status spx_template_render(const spx_template *t, const char *ctx_json, char **out, size_t *out_len, char *err,
                               size_t errcap) {
    spx_err e;
    spx_err_clear(&e);
    if (err && errcap) err[0] = 0;
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !out) {
        spx_fail(&e, SPX_ERR_ARG, "spx_template_render: NULL %s", t ? "out" : "template");
        if (err && errcap) snprintf(err, errcap, "%s", e.msg);
        return SPX_ERR_ARG;
    }
    jrt r = {.t = t, .e = &e, .arena = {.cap = J_ARENA_MAX}};
    jbuf o = {0};
    spx_status st = SPX_OK;
    if (ctx_json && *ctx_json) {
        st = jv_from_json(&r, ctx_json, strlen(ctx_json), &r.ctx);
        if (!st && r.ctx->type != JV_DICT)
            st = spx_fail(&e, SPX_ERR_ARG, "%s: render context: expected a JSON object, got %s", t->name,
                          jv_typename(r.ctx));
    } else if (!(r.ctx = jv_new(&r, JV_DICT))) {
        st = joom(&r, NULL);
    }
    if (!st && !(r.top = frame_new(&r, NULL))) st = joom(&r, NULL);
    if (!st) st = exec(&r, t->root, r.top, &o);
    ja_free(&r.arena);
    if (!st && !o.p && !jbuf_put(&o, "", 0)) st = spx_fail(&e, SPX_ERR_NOMEM, "%s: out of memory", t->name);
    if (!st && !o.p) {
        o.p = malloc(1);
        if (o.p) o.p[0] = 0;
        else st = spx_fail(&e, SPX_ERR_NOMEM, "%s: out of memory", t->name);
    }
    if (st) {
        jbuf_free(&o);
        if (err && errcap) snprintf(err, errcap, "%s", e.msg);
        return st;
    }
    *out = o.p;
    if (out_len) *out_len = o.n;
    return SPX_OK;
}
