/* jinja_parse.c: the parser of the chat template engine, and
 * spx_template_parse / spx_template_free.
 *
 * A recursive-descent copy of jinja2 3.1's Parser for the subset the engine
 * runs: statements for/if/elif/else/set (also block set)/macro/print/
 * break/continue/generation; expressions with jinja2's precedence (note
 * '**' is left-associative there, and '~' binds tighter than '+').
 * Filter and test names are resolved here, so an unknown one fails at
 * parse time (SPX_ERR_UNSUPPORTED), as do the jinja2 statements the engine
 * does not run (include, import, extends, block, call, filter, with, ...).
 * Expression nesting is capped at J_MAX_DEPTH. spx_template_parse (source
 * normalization, then jlex, then jparse) is in jinja_lex.c. */
#include "chat/jinja.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct jp {
    spx_template *t;
    const jtok *tk;
    size_t i, n;
    spx_err *e;
    int depth, loops;
} jp;

typedef struct nvec {
    jnode **v;
    size_t n, cap;
} nvec;

static const jtok *cur(jp *p) { return &p->tk[p->i]; }
static const jtok *peek(jp *p, size_t k) { return &p->tk[p->i + k < p->n ? p->i + k : p->n - 1]; }
static bool tok_is(const jtok *t, jtok_kind k, const char *s) {
    return t->kind == k && (!s || (t->s.n == strlen(s) && !memcmp(t->s.p, s, t->s.n)));
}
static bool is_op(jp *p, const char *s) { return tok_is(cur(p), T_OP, s); }
static bool is_name(jp *p, const char *s) { return tok_is(cur(p), T_NAME, s); }

static const char *describe(const jtok *t, char *buf, size_t cap) {
    switch (t->kind) {
    case T_EOF: return "end of template";
    case T_TEXT: return "template text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_STRING: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    default: snprintf(buf, cap, "'%.*s'", (int)(t->s.n > 40 ? 40 : t->s.n), t->s.p); return buf;
    }
}

static spx_status perr(jp *p, const jtok *t, const char *what) {
    char b[64];
    return jfail_at(p->e, p->t, t->pos, SPX_ERR_FORMAT, "syntax error: expected %s, got %s", what,
                    describe(t, b, sizeof b));
}
static spx_status poom(jp *p) {
    return jfail_at(p->e, p->t, cur(p)->pos, SPX_ERR_NOMEM, "out of memory parsing the template");
}

static spx_status expect_op(jp *p, const char *s) {
    if (!is_op(p, s)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", s);
        return perr(p, cur(p), w);
    }
    p->i++;
    return SPX_OK;
}

static spx_status expect_kind(jp *p, jtok_kind k, const char *what) {
    if (cur(p)->kind != k) return perr(p, cur(p), what);
    p->i++;
    return SPX_OK;
}

static jnode *node(jp *p, jnode_kind k, size_t pos) {
    jnode *n = ja_alloc(&p->t->arena, sizeof *n);
    if (n) {
        n->kind = k;
        n->pos = pos;
    }
    return n;
}

static bool nv_push(nvec *v, jnode *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        jnode **nv = realloc(v->v, cap * sizeof *nv);
        if (!nv) return false;
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return true;
}

/* Moves v into the arena (freeing v); false when out of memory. */
static bool nv_done(jp *p, nvec *v, jnode ***out, size_t *n) {
    *n = v->n;
    *out = NULL;
    bool ok = true;
    if (v->n) {
        *out = ja_alloc(&p->t->arena, v->n * sizeof **out);
        if (*out) memcpy(*out, v->v, v->n * sizeof **out);
        else ok = false;
    }
    free(v->v);
    *v = (nvec){0};
    return ok;
}

static jv *const_val(jp *p, jv_type t) {
    jv *v = ja_alloc(&p->t->arena, sizeof *v);
    if (v) v->type = (uint8_t)t;
    return v;
}

static spx_status parse_expr(jp *p, bool with_cond, jnode **out);
static spx_status parse_tuple(jp *p, bool simplified, bool with_cond, const char *extra_end, bool explicit_parens,
                              jnode **out);
static spx_status parse_unary(jp *p, bool with_filter, jnode **out);
static spx_status parse_primary(jp *p, jnode **out);
static spx_status parse_postfix(jp *p, jnode **node_io);
static spx_status parse_filters(jp *p, jnode **node_io, bool start_inline);

/* ---- calls ------------------------------------------------------------ */

/* "(" args ")" into n->items / n->kw / n->kwn. */
static spx_status parse_call_args(jp *p, jnode *n) {
    size_t at = cur(p)->pos;
    SPX_TRY(expect_op(p, "("));
    nvec args = {0}, kwv = {0};
    jstr *kwn = NULL;
    size_t nkwn = 0, capkw = 0;
    spx_status st = SPX_OK;
    bool need_comma = false;
    while (!is_op(p, ")")) {
        if (need_comma) {
            if ((st = expect_op(p, ","))) goto done;
            if (is_op(p, ")")) break;
        }
        if (is_op(p, "*") || is_op(p, "**")) {
            st = jfail_at(p->e, p->t, cur(p)->pos, SPX_ERR_UNSUPPORTED, "unsupported *args / **kwargs in a call");
            goto done;
        }
        jnode *x;
        if (cur(p)->kind == T_NAME && tok_is(peek(p, 1), T_OP, "=")) {
            jstr key = cur(p)->s;
            p->i += 2;
            if ((st = parse_expr(p, true, &x))) goto done;
            if (nkwn == capkw) {
                capkw = capkw ? capkw * 2 : 4;
                jstr *nk = realloc(kwn, capkw * sizeof *nk);
                if (!nk) { st = poom(p); goto done; }
                kwn = nk;
            }
            kwn[nkwn++] = key;
            if (!nv_push(&kwv, x)) { st = poom(p); goto done; }
        } else {
            if (kwv.n) {
                st = jfail_at(p->e, p->t, cur(p)->pos, SPX_ERR_FORMAT,
                              "syntax error: positional argument after a keyword argument");
                goto done;
            }
            if ((st = parse_expr(p, true, &x))) goto done;
            if (!nv_push(&args, x)) { st = poom(p); goto done; }
        }
        need_comma = true;
    }
    if (cur(p)->kind == T_EOF) { st = perr(p, cur(p), "')'"); goto done; }
    p->i++;
    (void)at;
    if (!nv_done(p, &args, &n->items, &n->n)) { st = poom(p); goto done; }
    if (!nv_done(p, &kwv, &n->kw, &n->nkw)) { st = poom(p); goto done; }
    if (nkwn) {
        n->kwn = ja_alloc(&p->t->arena, nkwn * sizeof *n->kwn);
        if (!n->kwn) { st = poom(p); goto done; }
        memcpy(n->kwn, kwn, nkwn * sizeof *kwn);
    }
done:
    free(args.v);
    free(kwv.v);
    free(kwn);
    return st;
}

static spx_status parse_filters(jp *p, jnode **node_io, bool start_inline) {
    while (is_op(p, "|") || start_inline) {
        if (!start_inline) p->i++;
        start_inline = false;
        const jtok *nt = cur(p);
        if (nt->kind != T_NAME) return perr(p, nt, "a filter name");
        p->i++;
        if (is_op(p, "."))
            return jfail_at(p->e, p->t, nt->pos, SPX_ERR_UNSUPPORTED, "unsupported dotted filter name '%.*s.'",
                            (int)nt->s.n, nt->s.p);
        const jbuiltin *b = jb_find(JB_FILTER, nt->s.p, nt->s.n);
        if (!b)
            return jfail_at(p->e, p->t, nt->pos, SPX_ERR_UNSUPPORTED, "unsupported filter '%.*s'", (int)nt->s.n,
                            nt->s.p);
        jnode *f = node(p, N_FILTER, nt->pos);
        if (!f) return poom(p);
        f->a = *node_io;
        f->fn = b;
        f->name = nt->s;
        if (is_op(p, "(")) SPX_TRY(parse_call_args(p, f));
        *node_io = f;
    }
    return SPX_OK;
}

static spx_status parse_test(jp *p, jnode **node_io) {
    size_t at = cur(p)->pos;
    p->i++; /* is */
    bool neg = false;
    if (is_name(p, "not")) neg = true, p->i++;
    const jtok *nt = cur(p);
    if (nt->kind != T_NAME) return perr(p, nt, "a test name");
    p->i++;
    const jbuiltin *b = jb_find(JB_TEST, nt->s.p, nt->s.n);
    if (!b)
        return jfail_at(p->e, p->t, nt->pos, SPX_ERR_UNSUPPORTED, "unsupported test '%.*s'", (int)nt->s.n, nt->s.p);
    jnode *tn = node(p, N_TEST, at);
    if (!tn) return poom(p);
    tn->a = *node_io;
    tn->fn = b;
    tn->op = neg;
    tn->name = nt->s;
    const jtok *c = cur(p);
    if (is_op(p, "(")) {
        SPX_TRY(parse_call_args(p, tn));
    } else if ((c->kind == T_NAME || c->kind == T_STRING || c->kind == T_INT || c->kind == T_FLOAT ||
                tok_is(c, T_OP, "[") || tok_is(c, T_OP, "{")) &&
               !tok_is(c, T_NAME, "else") && !tok_is(c, T_NAME, "or") && !tok_is(c, T_NAME, "and")) {
        if (tok_is(c, T_NAME, "is"))
            return jfail_at(p->e, p->t, c->pos, SPX_ERR_FORMAT, "syntax error: tests cannot be chained with 'is'");
        jnode *arg;
        SPX_TRY(parse_primary(p, &arg));
        SPX_TRY(parse_postfix(p, &arg));
        tn->items = ja_alloc(&p->t->arena, sizeof *tn->items);
        if (!tn->items) return poom(p);
        tn->items[0] = arg;
        tn->n = 1;
    }
    *node_io = tn;
    return SPX_OK;
}

static spx_status parse_filter_expr(jp *p, jnode **node_io) {
    for (;;) {
        if (is_op(p, "|")) {
            SPX_TRY(parse_filters(p, node_io, false));
        } else if (is_name(p, "is")) {
            SPX_TRY(parse_test(p, node_io));
        } else if (is_op(p, "(")) {
            jnode *c = node(p, N_CALL, cur(p)->pos);
            if (!c) return poom(p);
            c->a = *node_io;
            SPX_TRY(parse_call_args(p, c));
            *node_io = c;
        } else {
            return SPX_OK;
        }
    }
}

/* ---- subscripts -------------------------------------------------------- */

static spx_status parse_subscribed(jp *p, jnode **out) {
    size_t at = cur(p)->pos;
    jnode *parts[3] = {0};
    if (is_op(p, ":")) {
        p->i++;
    } else {
        jnode *x;
        SPX_TRY(parse_expr(p, true, &x));
        if (!is_op(p, ":")) {
            *out = x;
            return SPX_OK;
        }
        p->i++;
        parts[0] = x;
    }
    if (!is_op(p, ":") && !is_op(p, "]") && !is_op(p, ",")) SPX_TRY(parse_expr(p, true, &parts[1]));
    if (is_op(p, ":")) {
        p->i++;
        if (!is_op(p, "]") && !is_op(p, ",")) SPX_TRY(parse_expr(p, true, &parts[2]));
    }
    jnode *s = node(p, N_SLICE, at);
    if (!s) return poom(p);
    s->b = parts[0];
    s->c = parts[1];
    s->d = parts[2];
    *out = s;
    return SPX_OK;
}

static spx_status parse_postfix(jp *p, jnode **node_io) {
    for (;;) {
        if (is_op(p, ".")) {
            size_t at = cur(p)->pos;
            p->i++;
            const jtok *a = cur(p);
            p->i++;
            if (a->kind == T_NAME) {
                jnode *g = node(p, N_ATTR, at);
                if (!g) return poom(p);
                g->a = *node_io;
                g->name = a->s;
                *node_io = g;
            } else if (a->kind == T_INT) {
                jnode *k = node(p, N_CONST, a->pos), *g = node(p, N_ITEM, at);
                if (!k || !g || !(k->val = const_val(p, JV_INT))) return poom(p);
                k->val->i = a->i;
                g->a = *node_io;
                g->b = k;
                *node_io = g;
            } else {
                return perr(p, a, "an attribute name or number after '.'");
            }
        } else if (is_op(p, "[")) {
            size_t at = cur(p)->pos;
            p->i++;
            nvec v = {0};
            spx_status st = SPX_OK;
            while (!is_op(p, "]")) {
                jnode *x = NULL;
                if (v.n && (st = expect_op(p, ","))) break;
                if ((st = parse_subscribed(p, &x))) break;
                if (!nv_push(&v, x)) { st = poom(p); break; }
            }
            if (!st && v.n != 1)
                st = v.n ? jfail_at(p->e, p->t, at, SPX_ERR_UNSUPPORTED, "unsupported tuple subscript")
                         : perr(p, cur(p), "an expression");
            jnode *x = v.n ? v.v[0] : NULL;
            free(v.v);
            if (st) return st;
            p->i++;
            jnode *g = node(p, x->kind == N_SLICE ? N_SLICE : N_ITEM, at);
            if (!g) return poom(p);
            if (x->kind == N_SLICE) {
                *g = *x;
                g->pos = at;
            } else {
                g->b = x;
            }
            g->a = *node_io;
            *node_io = g;
        } else if (is_op(p, "(")) {
            jnode *c = node(p, N_CALL, cur(p)->pos);
            if (!c) return poom(p);
            c->a = *node_io;
            SPX_TRY(parse_call_args(p, c));
            *node_io = c;
        } else {
            return SPX_OK;
        }
    }
}

/* ---- primaries --------------------------------------------------------- */

static spx_status parse_seq(jp *p, jnode_kind kind, const char *close, jnode **out) {
    size_t at = cur(p)->pos;
    p->i++;
    nvec keys = {0}, vals = {0};
    spx_status st = SPX_OK;
    while (!is_op(p, close)) {
        if (keys.n && (st = expect_op(p, ","))) goto done;
        if (is_op(p, close)) break;
        jnode *k, *v = NULL;
        if ((st = parse_expr(p, true, &k))) goto done;
        if (kind == N_DICT) {
            if ((st = expect_op(p, ":")) || (st = parse_expr(p, true, &v))) goto done;
            if (!nv_push(&vals, v)) { st = poom(p); goto done; }
        }
        if (!nv_push(&keys, k)) { st = poom(p); goto done; }
    }
    p->i++;
    jnode *n = node(p, kind, at);
    if (!n || !nv_done(p, &keys, &n->items, &n->n)) { st = poom(p); goto done; }
    size_t nv;
    if (!nv_done(p, &vals, &n->kw, &nv)) { st = poom(p); goto done; }
    *out = n;
done:
    free(keys.v);
    free(vals.v);
    return st;
}

static spx_status parse_primary(jp *p, jnode **out) {
    const jtok *t = cur(p);
    if (++p->depth > J_MAX_DEPTH)
        return jfail_at(p->e, p->t, t->pos, SPX_ERR_RANGE, "expression nested deeper than %d levels", J_MAX_DEPTH);
    spx_status st = SPX_OK;
    jnode *n = NULL;
    if (t->kind == T_NAME) {
        p->i++;
        n = node(p, N_CONST, t->pos);
        if (!n) return poom(p);
        if (tok_is(t, T_NAME, "true") || tok_is(t, T_NAME, "True")) n->val = &jv_true;
        else if (tok_is(t, T_NAME, "false") || tok_is(t, T_NAME, "False")) n->val = &jv_false;
        else if (tok_is(t, T_NAME, "none") || tok_is(t, T_NAME, "None")) n->val = &jv_none;
        else n->kind = N_NAME, n->name = t->s;
    } else if (t->kind == T_STRING) {
        jbuf b = {0};
        while (cur(p)->kind == T_STRING) {
            if (!jbuf_put(&b, cur(p)->s.p, cur(p)->s.n)) { jbuf_free(&b); return poom(p); }
            p->i++;
        }
        n = node(p, N_CONST, t->pos);
        char *s = ja_alloc(&p->t->arena, b.n + 1);
        if (!n || !s || !(n->val = const_val(p, JV_STR))) { jbuf_free(&b); return poom(p); }
        if (b.n) memcpy(s, b.p, b.n);
        n->val->s = (jstr){s, b.n};
        jbuf_free(&b);
    } else if (t->kind == T_INT || t->kind == T_FLOAT) {
        p->i++;
        n = node(p, N_CONST, t->pos);
        if (!n || !(n->val = const_val(p, t->kind == T_INT ? JV_INT : JV_FLOAT))) return poom(p);
        if (t->kind == T_INT) n->val->i = t->i;
        else n->val->f = t->f;
    } else if (tok_is(t, T_OP, "(")) {
        p->i++;
        if ((st = parse_tuple(p, false, true, NULL, true, &n))) return st;
        SPX_TRY(expect_op(p, ")"));
    } else if (tok_is(t, T_OP, "[")) {
        SPX_TRY(parse_seq(p, N_LIST, "]", &n));
    } else if (tok_is(t, T_OP, "{")) {
        SPX_TRY(parse_seq(p, N_DICT, "}", &n));
    } else {
        return perr(p, t, "an expression");
    }
    p->depth--;
    *out = n;
    return SPX_OK;
}

/* ---- operators --------------------------------------------------------- */

static spx_status parse_unary(jp *p, bool with_filter, jnode **out) {
    const jtok *t = cur(p);
    jnode *n;
    if (tok_is(t, T_OP, "-") || tok_is(t, T_OP, "+")) {
        p->i++;
        if (++p->depth > J_MAX_DEPTH)
            return jfail_at(p->e, p->t, t->pos, SPX_ERR_RANGE, "expression nested deeper than %d levels", J_MAX_DEPTH);
        jnode *x;
        SPX_TRY(parse_unary(p, false, &x));
        p->depth--;
        n = node(p, t->s.p[0] == '-' ? N_NEG : N_POS, t->pos);
        if (!n) return poom(p);
        n->a = x;
    } else {
        SPX_TRY(parse_primary(p, &n));
    }
    SPX_TRY(parse_postfix(p, &n));
    if (with_filter) SPX_TRY(parse_filter_expr(p, &n));
    *out = n;
    return SPX_OK;
}

static spx_status bin(jp *p, jnode_kind k, int op, size_t pos, jnode *a, jnode *b, jnode **out) {
    jnode *n = node(p, k, pos);
    if (!n) return poom(p);
    n->op = op;
    n->a = a;
    n->b = b;
    *out = n;
    return SPX_OK;
}

static spx_status parse_pow(jp *p, jnode **out) {
    jnode *l, *r;
    SPX_TRY(parse_unary(p, true, &l));
    while (is_op(p, "**")) {
        size_t at = cur(p)->pos;
        p->i++;
        SPX_TRY(parse_unary(p, true, &r));
        SPX_TRY(bin(p, N_BIN, OP_POW, at, l, r, &l));
    }
    *out = l;
    return SPX_OK;
}

static spx_status parse_math2(jp *p, jnode **out) {
    jnode *l, *r;
    SPX_TRY(parse_pow(p, &l));
    for (;;) {
        int op = is_op(p, "*") ? OP_MUL : is_op(p, "/") ? OP_DIV : is_op(p, "//") ? OP_FLOORDIV
               : is_op(p, "%") ? OP_MOD : -1;
        if (op < 0) break;
        size_t at = cur(p)->pos;
        p->i++;
        SPX_TRY(parse_pow(p, &r));
        SPX_TRY(bin(p, N_BIN, op, at, l, r, &l));
    }
    *out = l;
    return SPX_OK;
}

static spx_status parse_concat(jp *p, jnode **out) {
    jnode *l;
    SPX_TRY(parse_math2(p, &l));
    if (!is_op(p, "~")) {
        *out = l;
        return SPX_OK;
    }
    nvec v = {0};
    spx_status st = SPX_OK;
    size_t at = cur(p)->pos;
    if (!nv_push(&v, l)) return poom(p);
    while (is_op(p, "~")) {
        p->i++;
        jnode *r;
        if ((st = parse_math2(p, &r))) goto done;
        if (!nv_push(&v, r)) { st = poom(p); goto done; }
    }
    jnode *n = node(p, N_CONCAT, at);
    if (!n || !nv_done(p, &v, &n->items, &n->n)) { st = poom(p); goto done; }
    *out = n;
done:
    free(v.v);
    return st;
}

static spx_status parse_math1(jp *p, jnode **out) {
    jnode *l, *r;
    SPX_TRY(parse_concat(p, &l));
    while (is_op(p, "+") || is_op(p, "-")) {
        int op = is_op(p, "+") ? OP_ADD : OP_SUB;
        size_t at = cur(p)->pos;
        p->i++;
        SPX_TRY(parse_concat(p, &r));
        SPX_TRY(bin(p, N_BIN, op, at, l, r, &l));
    }
    *out = l;
    return SPX_OK;
}

static spx_status parse_compare(jp *p, jnode **out) {
    jnode *l;
    SPX_TRY(parse_math1(p, &l));
    nvec v = {0};
    int ops[64];
    size_t at = cur(p)->pos;
    spx_status st = SPX_OK;
    for (;;) {
        int op = is_op(p, "==") ? OP_EQ : is_op(p, "!=") ? OP_NE : is_op(p, "<") ? OP_LT : is_op(p, "<=") ? OP_LE
               : is_op(p, ">") ? OP_GT : is_op(p, ">=") ? OP_GE : is_name(p, "in") ? OP_IN : -1;
        if (op < 0 && is_name(p, "not") && tok_is(peek(p, 1), T_NAME, "in")) {
            op = OP_NOTIN;
            p->i++;
        }
        if (op < 0) break;
        if (v.n == sizeof ops / sizeof *ops) {
            st = jfail_at(p->e, p->t, cur(p)->pos, SPX_ERR_UNSUPPORTED, "unsupported chain of more than 64 comparisons");
            goto done;
        }
        p->i++;
        jnode *r;
        if ((st = parse_math1(p, &r))) goto done;
        ops[v.n] = op;
        if (!nv_push(&v, r)) { st = poom(p); goto done; }
    }
    if (!v.n) {
        *out = l;
        return SPX_OK;
    }
    jnode *n = node(p, N_CMP, at);
    if (!n || !(n->ops = ja_alloc(&p->t->arena, v.n * sizeof *n->ops))) { st = poom(p); goto done; }
    memcpy(n->ops, ops, v.n * sizeof *ops);
    n->a = l;
    if (!nv_done(p, &v, &n->items, &n->n)) { st = poom(p); goto done; }
    *out = n;
done:
    free(v.v);
    return st;
}

static spx_status parse_not(jp *p, jnode **out) {
    if (is_name(p, "not")) {
        size_t at = cur(p)->pos;
        p->i++;
        if (++p->depth > J_MAX_DEPTH)
            return jfail_at(p->e, p->t, at, SPX_ERR_RANGE, "expression nested deeper than %d levels", J_MAX_DEPTH);
        jnode *x;
        SPX_TRY(parse_not(p, &x));
        p->depth--;
        return bin(p, N_NOT, 0, at, x, NULL, out);
    }
    return parse_compare(p, out);
}

static spx_status parse_and(jp *p, jnode **out) {
    jnode *l, *r;
    SPX_TRY(parse_not(p, &l));
    while (is_name(p, "and")) {
        size_t at = cur(p)->pos;
        p->i++;
        SPX_TRY(parse_not(p, &r));
        SPX_TRY(bin(p, N_AND, 0, at, l, r, &l));
    }
    *out = l;
    return SPX_OK;
}

static spx_status parse_or(jp *p, jnode **out) {
    jnode *l, *r;
    SPX_TRY(parse_and(p, &l));
    while (is_name(p, "or")) {
        size_t at = cur(p)->pos;
        p->i++;
        SPX_TRY(parse_and(p, &r));
        SPX_TRY(bin(p, N_OR, 0, at, l, r, &l));
    }
    *out = l;
    return SPX_OK;
}

static spx_status parse_expr(jp *p, bool with_cond, jnode **out) {
    jnode *x;
    if (++p->depth > J_MAX_DEPTH)
        return jfail_at(p->e, p->t, cur(p)->pos, SPX_ERR_RANGE, "expression nested deeper than %d levels", J_MAX_DEPTH);
    SPX_TRY(parse_or(p, &x));
    while (with_cond && is_name(p, "if")) {
        size_t at = cur(p)->pos;
        p->i++;
        jnode *c, *alt = NULL;
        SPX_TRY(parse_or(p, &c));
        if (is_name(p, "else")) {
            p->i++;
            SPX_TRY(parse_expr(p, true, &alt));
        }
        jnode *n = node(p, N_COND, at);
        if (!n) return poom(p);
        n->a = x;
        n->b = c;
        n->c = alt;
        x = n;
    }
    p->depth--;
    *out = x;
    return SPX_OK;
}

static bool tuple_end(jp *p, const char *extra) {
    const jtok *t = cur(p);
    return t->kind == T_VAR_END || t->kind == T_BLOCK_END || t->kind == T_EOF || tok_is(t, T_OP, ")") ||
           (extra && tok_is(t, T_NAME, extra));
}

static spx_status parse_tuple(jp *p, bool simplified, bool with_cond, const char *extra_end, bool explicit_parens,
                              jnode **out) {
    size_t at = cur(p)->pos;
    nvec v = {0};
    bool is_tuple = false;
    spx_status st = SPX_OK;
    for (;;) {
        if (v.n && (st = expect_op(p, ","))) goto done;
        if (tuple_end(p, extra_end)) break;
        jnode *x;
        if ((st = simplified ? parse_primary(p, &x) : parse_expr(p, with_cond, &x))) goto done;
        if (!nv_push(&v, x)) { st = poom(p); goto done; }
        if (is_op(p, ",")) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (v.n) {
            *out = v.v[0];
            goto done;
        }
        if (!explicit_parens) { st = perr(p, cur(p), "an expression"); goto done; }
    }
    jnode *n = node(p, N_TUPLE, at);
    if (!n || !nv_done(p, &v, &n->items, &n->n)) { st = poom(p); goto done; }
    *out = n;
done:
    free(v.v);
    return st;
}

/* ---- statements -------------------------------------------------------- */

static spx_status subparse(jp *p, const char *const *ends, jnode **body, const char **which, size_t open_pos,
                           const char *opener);

static spx_status block_end(jp *p) {
    if (is_op(p, ":")) p->i++;
    return expect_kind(p, T_BLOCK_END, "'%}'");
}

/* Assignment targets: NAME | NAME, NAME... | (NAME, ...) ; ns: NAME.NAME */
static spx_status parse_targets(jp *p, jnode *n, bool with_ns, const char *ctx) {
    if (with_ns && cur(p)->kind == T_NAME && tok_is(peek(p, 1), T_OP, ".") && peek(p, 2)->kind == T_NAME) {
        n->kwn = ja_alloc(&p->t->arena, sizeof *n->kwn);
        if (!n->kwn) return poom(p);
        n->kwn[0] = cur(p)->s;
        n->nkw = 1;
        n->name = peek(p, 2)->s;
        p->i += 3;
        return SPX_OK;
    }
    bool paren = is_op(p, "(");
    if (paren) p->i++;
    jstr names[32];
    size_t k = 0;
    for (;;) {
        const jtok *t = cur(p);
        if (t->kind != T_NAME) return perr(p, t, "a variable name");
        if (tok_is(t, T_NAME, "true") || tok_is(t, T_NAME, "false") || tok_is(t, T_NAME, "none") ||
            tok_is(t, T_NAME, "True") || tok_is(t, T_NAME, "False") || tok_is(t, T_NAME, "None"))
            return jfail_at(p->e, p->t, t->pos, SPX_ERR_FORMAT, "syntax error: cannot assign to '%.*s'", (int)t->s.n,
                            t->s.p);
        if (k == 32) return jfail_at(p->e, p->t, t->pos, SPX_ERR_UNSUPPORTED, "unsupported: more than 32 %s targets", ctx);
        names[k++] = t->s;
        p->i++;
        if (!is_op(p, ",")) break;
        p->i++;
        if (cur(p)->kind != T_NAME) break; /* trailing comma */
    }
    if (paren) SPX_TRY(expect_op(p, ")"));
    n->kwn = ja_alloc(&p->t->arena, k * sizeof *n->kwn);
    if (!n->kwn) return poom(p);
    memcpy(n->kwn, names, k * sizeof *names);
    n->nkw = k;
    return SPX_OK;
}

static spx_status parse_for(jp *p, size_t at, jnode **out) {
    jnode *n = node(p, N_FOR, at);
    if (!n) return poom(p);
    SPX_TRY(parse_targets(p, n, false, "loop"));
    if (!is_name(p, "in")) return perr(p, cur(p), "'in'");
    p->i++;
    SPX_TRY(parse_tuple(p, false, false, "recursive", false, &n->a));
    if (is_name(p, "if")) {
        p->i++;
        SPX_TRY(parse_expr(p, true, &n->d));
    }
    if (is_name(p, "recursive"))
        return jfail_at(p->e, p->t, cur(p)->pos, SPX_ERR_UNSUPPORTED, "unsupported recursive for loop");
    SPX_TRY(block_end(p));
    static const char *const e1[] = {"endfor", "else", NULL}, *const e2[] = {"endfor", NULL};
    const char *w;
    p->loops++;
    SPX_TRY(subparse(p, e1, &n->b, &w, at, "for"));
    p->loops--;
    SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
    if (!strcmp(w, "else")) {
        SPX_TRY(subparse(p, e2, &n->c, &w, at, "for"));
        SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
    }
    *out = n;
    return SPX_OK;
}

static spx_status parse_if(jp *p, size_t at, jnode **out) {
    jnode *n = node(p, N_IF, at);
    if (!n) return poom(p);
    SPX_TRY(parse_tuple(p, false, false, NULL, false, &n->a));
    SPX_TRY(block_end(p));
    static const char *const e1[] = {"elif", "else", "endif", NULL}, *const e2[] = {"endif", NULL};
    const char *w;
    SPX_TRY(subparse(p, e1, &n->b, &w, at, "if"));
    if (!strcmp(w, "elif")) {
        SPX_TRY(parse_if(p, p->tk[p->i - 1].pos, &n->c));
    } else if (!strcmp(w, "else")) {
        SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
        SPX_TRY(subparse(p, e2, &n->c, &w, at, "if"));
        SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
    } else {
        SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
    }
    *out = n;
    return SPX_OK;
}

static spx_status parse_set(jp *p, size_t at, jnode **out) {
    jnode *n = node(p, N_SET, at);
    if (!n) return poom(p);
    SPX_TRY(parse_targets(p, n, true, "set"));
    if (is_op(p, "=")) {
        p->i++;
        SPX_TRY(parse_tuple(p, false, true, NULL, false, &n->a));
        SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
        *out = n;
        return SPX_OK;
    }
    if (n->nkw != 1) return perr(p, cur(p), "'='");
    n->kind = N_SETBLOCK;
    if (is_op(p, "|")) {
        SPX_TRY(parse_filters(p, &n->a, false));
    }
    SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
    static const char *const e[] = {"endset", NULL};
    const char *w;
    SPX_TRY(subparse(p, e, &n->b, &w, at, "set"));
    SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
    *out = n;
    return SPX_OK;
}

/* Does n (not looking into nested macros) read the variable name? */
static bool reads_name(const jnode *n, const char *name, int depth) {
    if (!n || depth > 2 * J_MAX_DEPTH) return false;
    if (n->kind == N_NAME && n->name.n == strlen(name) && !memcmp(n->name.p, name, n->name.n)) return true;
    if (n->kind == N_MACRO) return false;
    if (reads_name(n->a, name, depth + 1) || reads_name(n->b, name, depth + 1) || reads_name(n->c, name, depth + 1) ||
        reads_name(n->d, name, depth + 1))
        return true;
    for (size_t i = 0; i < n->n; i++)
        if (n->items && reads_name(n->items[i], name, depth + 1)) return true;
    if (n->kind == N_CALL || n->kind == N_FILTER || n->kind == N_TEST || n->kind == N_DICT)
        for (size_t i = 0; i < (n->kind == N_DICT ? n->n : n->nkw); i++)
            if (n->kw && reads_name(n->kw[i], name, depth + 1)) return true;
    return false;
}

static spx_status parse_macro(jp *p, size_t at, jnode **out) {
    jnode *n = node(p, N_MACRO, at);
    if (!n) return poom(p);
    if (cur(p)->kind != T_NAME) return perr(p, cur(p), "a macro name");
    n->name = cur(p)->s;
    p->i++;
    SPX_TRY(expect_op(p, "("));
    jstr names[64];
    jnode *defs[64];
    size_t k = 0;
    bool any_default = false;
    while (!is_op(p, ")")) {
        if (k) SPX_TRY(expect_op(p, ","));
        if (is_op(p, ")")) break;
        const jtok *t = cur(p);
        if (t->kind != T_NAME) return perr(p, t, "a parameter name");
        if (k == 64) return jfail_at(p->e, p->t, t->pos, SPX_ERR_UNSUPPORTED, "unsupported: more than 64 macro parameters");
        p->i++;
        names[k] = t->s;
        defs[k] = NULL;
        if (is_op(p, "=")) {
            p->i++;
            SPX_TRY(parse_expr(p, true, &defs[k]));
            any_default = true;
        } else if (any_default) {
            return jfail_at(p->e, p->t, t->pos, SPX_ERR_FORMAT, "syntax error: non-default argument follows default argument");
        }
        k++;
    }
    p->i++;
    SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
    if (k) {
        n->kwn = ja_alloc(&p->t->arena, k * sizeof *n->kwn);
        n->items = ja_alloc(&p->t->arena, k * sizeof *n->items);
        if (!n->kwn || !n->items) return poom(p);
        memcpy(n->kwn, names, k * sizeof *names);
        memcpy(n->items, defs, k * sizeof *defs);
    }
    n->nkw = n->n = k;
    static const char *const e[] = {"endmacro", NULL};
    const char *w;
    int loops = p->loops;
    p->loops = 0;
    SPX_TRY(subparse(p, e, &n->b, &w, at, "macro"));
    p->loops = loops;
    if (cur(p)->kind == T_NAME) p->i++; /* {% endmacro name %} */
    /* jinja2: a macro whose body reads varargs / kwargs takes extra arguments */
    n->op = (reads_name(n->b, "varargs", 0) ? 1 : 0) | (reads_name(n->b, "kwargs", 0) ? 2 : 0);
    SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
    *out = n;
    return SPX_OK;
}

static const char *const UNSUPPORTED_TAGS[] = {"block", "extends", "include", "import", "from", "with", "autoescape",
                                               "filter", "call", "trans", "do", NULL};
static const char *const END_TAGS[] = {"endfor", "endif", "elif", "else", "endset", "endmacro", "endgeneration",
                                       "endblock", "endwith", "endfilter", "endcall", "endautoescape", "endraw", NULL};

static spx_status parse_statement(jp *p, jnode **out) {
    const jtok *t = cur(p);
    size_t at = p->tk[p->i - 1].pos; /* the '{%' */
    if (t->kind != T_NAME) return perr(p, t, "a statement name");
    if (p->depth + 1 > J_MAX_DEPTH)
        return jfail_at(p->e, p->t, t->pos, SPX_ERR_RANGE, "statements nested deeper than %d levels", J_MAX_DEPTH);
    p->i++;
    if (tok_is(t, T_NAME, "for")) return parse_for(p, at, out);
    if (tok_is(t, T_NAME, "if")) return parse_if(p, at, out);
    if (tok_is(t, T_NAME, "set")) return parse_set(p, at, out);
    if (tok_is(t, T_NAME, "macro")) return parse_macro(p, at, out);
    if (tok_is(t, T_NAME, "print")) {
        jnode *n = node(p, N_OUTPUT, at);
        if (!n) return poom(p);
        SPX_TRY(parse_tuple(p, false, true, NULL, false, &n->a));
        SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
        *out = n;
        return SPX_OK;
    }
    if (tok_is(t, T_NAME, "break") || tok_is(t, T_NAME, "continue")) {
        if (!p->loops)
            return jfail_at(p->e, p->t, t->pos, SPX_ERR_FORMAT, "syntax error: '%.*s' outside of a for loop",
                            (int)t->s.n, t->s.p);
        jnode *n = node(p, t->s.p[0] == 'b' ? N_BREAK : N_CONTINUE, at);
        if (!n) return poom(p);
        SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
        *out = n;
        return SPX_OK;
    }
    if (tok_is(t, T_NAME, "generation")) {
        /* transformers' AssistantTracker: the body renders as it is */
        SPX_TRY(expect_kind(p, T_BLOCK_END, "'%}'"));
        static const char *const e[] = {"endgeneration", NULL};
        const char *w;
        SPX_TRY(subparse(p, e, out, &w, at, "generation"));
        return expect_kind(p, T_BLOCK_END, "'%}'");
    }
    for (size_t i = 0; UNSUPPORTED_TAGS[i]; i++)
        if (tok_is(t, T_NAME, UNSUPPORTED_TAGS[i]))
            return jfail_at(p->e, p->t, t->pos, SPX_ERR_UNSUPPORTED, "unsupported statement '{%% %s %%}'",
                            UNSUPPORTED_TAGS[i]);
    for (size_t i = 0; END_TAGS[i]; i++)
        if (tok_is(t, T_NAME, END_TAGS[i]))
            return jfail_at(p->e, p->t, t->pos, SPX_ERR_FORMAT, "syntax error: unexpected '{%% %s %%}'", END_TAGS[i]);
    return jfail_at(p->e, p->t, t->pos, SPX_ERR_UNSUPPORTED, "unsupported statement '{%% %.*s %%}'",
                    (int)(t->s.n > 40 ? 40 : t->s.n), t->s.p);
}

/* Statements until a block tag named in ends (NULL-terminated; NULL ends:
 * until the end of the template); *which names it, and the parser stands
 * after its name. */
static spx_status subparse(jp *p, const char *const *ends, jnode **body, const char **which, size_t open_pos,
                           const char *opener) {
    nvec v = {0};
    spx_status st = SPX_OK;
    *which = NULL;
    for (;;) {
        const jtok *t = cur(p);
        jnode *n = NULL;
        if (t->kind == T_EOF) {
            if (ends) {
                st = jfail_at(p->e, p->t, open_pos, SPX_ERR_FORMAT,
                              "syntax error: '{%% %s %%}' is never closed (no '{%% end%s %%}' before the end)", opener,
                              opener);
                goto done;
            }
            break;
        }
        if (t->kind == T_TEXT) {
            p->i++;
            n = node(p, N_TEXT, t->pos);
            if (!n || !(n->val = const_val(p, JV_STR))) { st = poom(p); goto done; }
            n->val->s = t->s;
        } else if (t->kind == T_VAR_BEGIN) {
            p->i++;
            n = node(p, N_OUTPUT, t->pos);
            if (!n) { st = poom(p); goto done; }
            if ((st = parse_tuple(p, false, true, NULL, false, &n->a))) goto done;
            if ((st = expect_kind(p, T_VAR_END, "'}}'"))) goto done;
        } else if (t->kind == T_BLOCK_BEGIN) {
            const jtok *nt = peek(p, 1);
            bool is_end = false;
            for (size_t i = 0; ends && ends[i]; i++)
                if (tok_is(nt, T_NAME, ends[i])) {
                    *which = ends[i];
                    is_end = true;
                }
            if (is_end) {
                p->i += 2;
                break;
            }
            p->i++;
            p->depth++;
            st = parse_statement(p, &n);
            p->depth--;
            if (st) goto done;
        } else {
            st = perr(p, t, "template text or a tag");
            goto done;
        }
        if (!nv_push(&v, n)) { st = poom(p); goto done; }
    }
    jnode *b = node(p, N_BODY, open_pos);
    if (!b || !nv_done(p, &v, &b->items, &b->n)) { st = poom(p); goto done; }
    *body = b;
done:
    free(v.v);
    return st;
}

spx_status jparse(spx_template *t, const jtoks *toks, spx_err *e) {
    jp p = {.t = t, .tk = toks->v, .n = toks->n, .e = e};
    const char *w;
    return subparse(&p, NULL, &t->root, &w, 0, "");
}
