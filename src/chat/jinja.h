/* jinja.h: internals of the chat template engine (a Jinja subset).
 *
 * Pipeline: jinja_lex.c turns the source into tokens (newline
 * normalization, whitespace control, trim_blocks, lstrip_blocks, raw
 * blocks, comments); jinja_parse.c builds an immutable AST in the
 * template's arena; jinja_eval.c walks it with a render state whose values
 * (jinja_value.c, jinja_json.c) all live in one per-render arena that is dropped at the
 * end, so no value is ever freed on its own and every error path frees
 * everything by dropping the arena. jinja_builtins.c and jinja_str.c hold
 * the filters, tests, methods and globals.
 *
 * The semantics are jinja2 3.1's in transformers' environment
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
 * loopcontrols, its tojson/raise_exception/strftime_now) and Python 3's
 * for values. Limits: J_MAX_DEPTH nested macro calls / expression depth,
 * J_OUT_MAX output bytes, J_ARENA_MAX render memory, J_MAX_STEPS loop
 * iterations + calls per render. */
#ifndef SPX_CHAT_JINJA_H
#define SPX_CHAT_JINJA_H

#include "core/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define J_MAX_DEPTH 200                   /* nesting of macro calls, of parsed expressions */
#define J_OUT_MAX ((size_t)64 << 20)      /* bytes of any rendered text */
#define J_ARENA_MAX ((size_t)1 << 30)     /* bytes of values one render may allocate */
#define J_MAX_STEPS ((uint64_t)10000000)  /* loop iterations + calls one render may run */
#define J_MAX_RANGE 100000                /* range() length, as jinja2's sandbox */
#define J_VALUE_DEPTH 512                 /* nesting of values in repr, tojson, ordering */

/* ---- arena ---------------------------------------------------------- */
typedef struct jblk jblk;
typedef struct jarena {
    jblk *head;
    size_t total, cap; /* bytes held; cap 0: none */
} jarena;
void *ja_alloc(jarena *a, size_t n);  /* zeroed; NULL when out of memory or over cap */
void ja_free(jarena *a);

/* ---- byte strings --------------------------------------------------- */
typedef struct jstr {
    const char *p;
    size_t n;
} jstr;

/* A growing malloc'd byte buffer (outputs, string building); capped at
 * J_OUT_MAX: jbuf_put returns false when over the cap or out of memory
 * (over tells which). */
typedef struct jbuf {
    char *p;
    size_t n, cap;
    bool over;
} jbuf;
bool jbuf_put(jbuf *b, const void *s, size_t n);
bool jbuf_putc(jbuf *b, char c);
bool jbuf_puts(jbuf *b, const char *s);
bool jbuf_printf(jbuf *b, const char *fmt, ...) SPX_PRINTF(2, 3);
void jbuf_free(jbuf *b);

/* UTF-8: one code point at s (n > 0 bytes); an invalid byte is one
 * "character" of its own (cp = 0xDC00 + byte, as Python's surrogateescape). */
size_t ju_next(const char *s, size_t n, int32_t *cp);
size_t ju_len(const char *s, size_t n);          /* code points */
size_t ju_offset(const char *s, size_t n, size_t k); /* byte offset of code point k (n if past) */
bool ju_put(jbuf *b, int32_t cp);
bool ju_isspace(int32_t cp);                     /* Python str.isspace */

/* ---- tokens --------------------------------------------------------- */
typedef enum {
    T_EOF, T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END,
    T_NAME, T_STRING, T_INT, T_FLOAT, T_OP
} jtok_kind;

typedef struct jtok {
    jtok_kind kind;
    size_t pos;  /* byte offset in the normalized source */
    jstr s;      /* TEXT/NAME/OP: the text; STRING: decoded value (arena) */
    int64_t i;
    double f;
} jtok;

typedef struct jtoks {
    jtok *v;
    size_t n, cap;
} jtoks;

/* ---- values --------------------------------------------------------- */
typedef enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS,
    JV_MACRO, JV_FUNC, JV_LOOP
} jv_type;

#define JV_F_TUPLE 1u  /* JV_LIST: a tuple */
#define JV_F_SAFE 2u   /* JV_STR: markupsafe.Markup (|safe, |e) */
#define JV_F_RANGE 4u  /* JV_LIST: made by range() (Python prints it as range(a, b)) */
#define JV_F_ITER 8u   /* JV_LIST: a generator in jinja2 (map, select, reverse...): always true, no len(),
                        * no indexing, prints as an object address */

typedef struct jv jv;
typedef struct jnode jnode;
typedef struct jframe jframe;
typedef struct jbuiltin jbuiltin;
typedef struct jloop jloop;

struct jv {
    uint8_t type, flags;
    union {
        bool b;
        int64_t i;
        double f;
        jstr s;
        struct { jv **v; size_t n, cap; } l;
        struct { jv **k, **v; size_t n, cap; uint32_t *h; size_t hcap; } d; /* JV_DICT and JV_NS, insertion
                                          * order; h: open-addressing index (entry + 1) of the string keys */
        struct { const jnode *node; jframe *scope; } m;
        struct { const jbuiltin *fn; jv *self; } fn; /* global (self NULL) or bound method */
        struct { const char *hint; } u;  /* why it is undefined ("'x' is undefined") */
        jloop *loop;
    };
};

struct jloop {
    int64_t index0, length;
    jv *items;  /* JV_LIST being iterated */
};

extern jv jv_undef_plain, jv_none, jv_true, jv_false;

/* ---- AST ------------------------------------------------------------ */
typedef enum {
    /* expressions */
    N_CONST, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NEG, N_POS, N_NOT,
    N_BIN, N_AND, N_OR, N_CMP, N_COND, N_LIST, N_TUPLE, N_DICT, N_CONCAT,
    /* statements */
    N_BODY, N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE
} jnode_kind;

/* N_BIN / N_CMP operators */
typedef enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN
} jop;

struct jnode {
    jnode_kind kind;
    int op;         /* N_BIN: jop; N_TEST: negated */
    size_t pos;     /* byte offset in the normalized source */
    jnode *a, *b, *c, *d;
    /* N_CALL/N_FILTER/N_TEST: positional args; N_LIST/N_TUPLE/N_BODY/N_CONCAT: items;
     * N_DICT: keys; N_CMP: right operands; N_MACRO: defaults (NULL: none) */
    jnode **items;
    size_t n;
    /* N_CALL/N_FILTER/N_TEST: kwarg values; N_DICT: values */
    jnode **kw;
    jstr *kwn;      /* kwarg names; N_FOR/N_SET: target names; N_MACRO: parameter names */
    size_t nkw;     /* kwargs; N_FOR/N_SET/N_MACRO: names */
    int *ops;       /* N_CMP: per right operand */
    jstr name;      /* N_NAME, N_ATTR, N_MACRO, N_SET/N_SETBLOCK ns attribute (with a) */
    const jbuiltin *fn; /* N_FILTER / N_TEST */
    jv *val;        /* N_CONST, N_TEXT */
};
/* Statement shapes:
 *   N_TEXT val; N_OUTPUT a; N_IF a=cond b=body c=else (N_IF for elif, N_BODY, NULL)
 *   N_FOR kwn=targets (nkw>1: unpack) a=iter b=body c=else d=filter
 *   N_SET kwn=targets a=value (name.p set: namespace attribute `kwn[0].name`)
 *   N_SETBLOCK kwn[0] target (name: ns attr) b=body a=filter chain applied (N_FILTER with a=NULL at its root)
 *   N_MACRO name kwn params items defaults b=body op=1: reads varargs, 2: reads kwargs */

/* ---- template ------------------------------------------------------- */
struct spx_template {
    char *name;
    char *src;      /* normalized source (\r\n, \r -> \n; one trailing \n dropped) */
    size_t len;
    jarena arena;   /* AST, constants */
    jnode *root;    /* N_BODY */
    bool uses_time; /* calls strftime_now */
};

/* Formats "NAME:LINE:COL: " + message into e (the first error wins). */
spx_status jfail_at(spx_err *e, const spx_template *t, size_t pos, spx_status code, const char *fmt, ...)
    SPX_PRINTF(5, 6);

spx_status jlex(spx_template *t, jtoks *out, spx_err *e);
spx_status jparse(spx_template *t, const jtoks *toks, spx_err *e);

/* ---- render state --------------------------------------------------- */
struct jframe {
    jframe *parent;
    jstr *names;
    jv **vals;
    size_t n, cap;
};

typedef struct jrt {
    const spx_template *t;
    spx_err *e;
    jarena arena;
    jframe *top;     /* the template's top-level names */
    jv *ctx;         /* JV_DICT of the caller's variables */
    int depth;       /* macro calls in progress */
    uint64_t steps;
    int ctl;         /* 1 break, 2 continue pending */
    int rdepth;      /* C recursion of eval/exec */
    jv *block_in;    /* {% set x | filters %}: the body the first filter reads */
} jrt;

typedef struct jargs {
    jv **pos;
    size_t npos;
    const jstr *kwn;
    jv **kwv;
    size_t nkw;
} jargs;

/* at: the node the call is at (its position names the error) */
typedef spx_status (*jfn)(jrt *r, const jnode *at, jv *self, const jargs *a, jv **out);

typedef enum { JB_FILTER, JB_TEST, JB_GLOBAL, JB_STR, JB_LIST, JB_DICT, JB_LOOP, JB_UNSUPPORTED, JB_UNSAFE } jb_kind;

struct jbuiltin {
    const char *name;
    jb_kind kind;
    jfn fn;
};

const jbuiltin *jb_find(jb_kind kind, const char *name, size_t n);
/* A method of v by name (str, list, dict, loop), NULL if none; *unsafe set
 * for the sandbox's forbidden mutating methods. */
const jbuiltin *jb_method(const jv *v, jstr name, bool *unsafe);

spx_status jfail(jrt *r, const jnode *at, spx_status code, const char *fmt, ...) SPX_PRINTF(4, 5);
spx_status joom(jrt *r, const jnode *at);
/* Binds a to the nout parameters named in params ("name,name2"): out[i]
 * is the value given positionally or by keyword, NULL when not given; too
 * many, unknown or repeated arguments are errors. Builtins taking any
 * number of arguments read a themselves. */
spx_status jbind(jrt *r, const jnode *at, const char *fname, const jargs *a, const char *params, jv **out,
                 size_t nout);

/* values (jinja_value.c) */
jv *jv_new(jrt *r, jv_type t);
jv *jv_int(jrt *r, int64_t i);
jv *jv_float(jrt *r, double f);
jv *jv_bool(bool b);
jv *jv_str(jrt *r, const char *s, size_t n);  /* copies */
jv *jv_strbuf(jrt *r, jbuf *b);               /* copies and frees b */
jv *jv_undef(jrt *r, const char *fmt, ...) SPX_PRINTF(2, 3);
jv *jv_list(jrt *r, size_t cap);
bool jv_push(jrt *r, jv *list, jv *x);
bool jv_dict_set(jrt *r, jv *d, jv *k, jv *v);  /* replaces an equal key */
jv *jv_dict_get(const jv *d, const jv *k);      /* NULL if absent */
jv *jv_dict_gets(const jv *d, const char *k, size_t n);
bool jv_truthy(const jv *v);
bool jv_eq(const jv *a, const jv *b);
/* <0, 0, >0; SPX_ERR_ARG (message in r) when Python would raise TypeError */
spx_status jv_cmp(jrt *r, const jnode *at, const jv *a, const jv *b, int *out);
const char *jv_typename(const jv *v);   /* Python's: 'str', 'int', 'dict', ... */
bool jv_is_num(const jv *v);            /* int, float, bool */
double jv_num(const jv *v);
/* Python str(v) / repr(v) appended to b; false on a value Python would
 * print as an object address (macro, function, namespace) or buffer full */
spx_status jv_to_str(jrt *r, const jnode *at, const jv *v, jbuf *b);
spx_status jv_repr(jrt *r, const jnode *at, const jv *v, jbuf *b);
spx_status jv_str_of(jrt *r, const jnode *at, jv *v, jv **out); /* str(v) as a JV_STR */
/* The error for a jbuf_put that failed: over J_OUT_MAX or out of memory */
spx_status jbuf_fail(jrt *r, const jnode *at, const jbuf *b);
void jfmt_float(double f, char *out, size_t cap); /* Python repr(float) */
/* (jinja_json.c) json.dumps(v, ensure_ascii, indent, separators, sort_keys): indent
 * NULL for none; item_sep/key_sep NULL for the defaults */
spx_status jv_tojson(jrt *r, const jnode *at, const jv *v, const char *indent, const char *item_sep,
                     const char *key_sep, bool sort_keys, bool ascii, jbuf *b);
/* Parses a JSON text into values in r's arena. */
spx_status jv_from_json(jrt *r, const char *s, size_t n, jv **out);
/* Iteration: the items of v as a JV_LIST (lists themselves, dict keys,
 * string characters, undefined: empty); error for other types. */
spx_status jv_iter(jrt *r, const jnode *at, jv *v, jv **out);
/* Python len(); error when v has none */
spx_status jv_len(jrt *r, const jnode *at, const jv *v, int64_t *out);
/* Fails for an undefined v being used (hint in the message). */
spx_status jv_undef_fail(jrt *r, const jnode *at, const jv *v);

/* strings (jinja_str.c) */
jv *js_case(jrt *r, jstr s, char mode); /* 'u' upper, 'l' lower, 't' str.title, 'c' capitalize, 'j' |title */
jv *js_strip(jrt *r, jstr s, const jstr *chars, int which); /* which: 1 left, 2 right, 3 both; chars NULL: whitespace */
spx_status js_replace(jrt *r, const jnode *at, jstr s, jstr old, jstr rep, int64_t count, jv **out);
spx_status js_splitlines(jrt *r, const jnode *at, jstr s, bool keepends, jv **out);
bool js_islower(jstr s, bool upper);   /* str.islower / str.isupper */

/* eval (jinja_eval.c), for builtins that call back (map, select, sort by attribute) */
spx_status jcall_value(jrt *r, const jnode *at, jv *callee, const jargs *a, jv **out);
spx_status jgetattr(jrt *r, const jnode *at, jv *obj, jstr name, jv **out);
spx_status jgetitem(jrt *r, const jnode *at, jv *obj, jv *key, jv **out);
spx_status jcall_builtin(jrt *r, const jnode *at, const jbuiltin *b, jv *self, const jargs *a, jv **out);

#endif
