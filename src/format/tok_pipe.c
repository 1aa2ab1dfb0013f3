/* tok_pipe.c: the "normalizer" and "pre_tokenizer" stages of tokenizer.json.
 *
 * Normalizers (run on each piece of text between added tokens): NFC, NFD,
 * NFKC, NFKD (utf8proc), Lowercase (per code point, utf8proc_tolower),
 * Prepend (only to non-empty text), Replace (String or Regex pattern),
 * Strip, and Sequence of these.
 *
 * Pre-tokenizers: Split (String or Regex pattern, the five delimiter
 * behaviours, invert), ByteLevel (add_prefix_space, use_regex with GPT-2's
 * regex, then bytes -> printable characters), Metaspace (replacement,
 * prepend_scheme always/first/never, split), Digits, and Sequence. Pieces
 * that come out empty are dropped, as tokenizers does. Anything else is
 * SPX_ERR_UNSUPPORTED naming the field.
 *
 * Regexes are PCRE2 with UTF+UCP. Known difference from tokenizers'
 * Oniguruma: PCRE2's \s also matches U+180E (MONGOLIAN VOWEL SEPARATOR,
 * no longer White_Space since Unicode 6.3). */
#include "format/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ------------------------------------------------------------------ */
/* Parsing                                                             */
/* ------------------------------------------------------------------ */

static spx_status get_string(const cJSON *obj, const char *key, const char *label,
                             const char *path, const char **out, spx_err *e) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(j))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.%s: expected a string, got %s", label, path,
                        key, tok_json_type(j));
    *out = j->valuestring;
    return SPX_OK;
}

static spx_status dup_string(const char *s, const char *label, char **out, size_t *len,
                             spx_err *e) {
    size_t n = strlen(s);
    *out = malloc(n + 1);
    if (!*out) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
    memcpy(*out, s, n + 1);
    *len = n;
    return SPX_OK;
}

/* "pattern": {"String": "..."} or {"Regex": "..."} */
static spx_status get_pattern(const cJSON *obj, const char *label, const char *path,
                              const char **pat, bool *literal, spx_err *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "pattern");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(p, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(p, "Regex");
    if (!cJSON_IsObject(p) || (cJSON_IsString(s) == cJSON_IsString(r)))
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: %s.pattern: expected {\"String\": ...} or {\"Regex\": ...}", label, path);
    *literal = cJSON_IsString(s);
    *pat = *literal ? s->valuestring : r->valuestring;
    return SPX_OK;
}

typedef spx_status (*step_parser)(tok_pipe *p, const cJSON *j, const char *label, const char *path, int depth,
                                  spx_err *e);

/* What a normalizer and a pre-tokenizer share: null is no step; an object
 * with a string "type"; a "Sequence" holds the steps under list_key, each
 * parsed by fn one level deeper. *type: the step's type, or NULL when it
 * was fully handled here (null, or a Sequence). */
static spx_status step_head(tok_pipe *p, const cJSON *j, const char *label, const char *path, int depth,
                            const char *list_key, step_parser fn, const char **type, spx_err *e) {
    *type = NULL;
    if (!j || cJSON_IsNull(j)) return SPX_OK;
    if (!cJSON_IsObject(j))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s: expected an object or null, got %s", label,
                        path, tok_json_type(j));
    const char *t;
    SPX_TRY(get_string(j, "type", label, path, &t, e));
    if (strcmp(t, "Sequence")) {
        *type = t;
        return SPX_OK;
    }
    if (depth >= TOK_MAX_DEPTH)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s: Sequence nested deeper than %d", label, path,
                        TOK_MAX_DEPTH);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, list_key);
    if (!cJSON_IsArray(list))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.%s: expected an array, got %s", label, path,
                        list_key, tok_json_type(list));
    int i = 0;
    for (const cJSON *it = list->child; it; it = it->next, i++) {
        char sub[160];
        snprintf(sub, sizeof sub, "%s.%s[%d]", path, list_key, i);
        SPX_TRY(fn(p, it, label, sub, depth + 1, e));
    }
    return SPX_OK;
}

static spx_status parse_norm(tok_pipe *p, const cJSON *j, const char *label, const char *path,
                             int depth, spx_err *e) {
    const char *type;
    SPX_TRY(step_head(p, j, label, path, depth, "normalizers", parse_norm, &type, e));
    if (!type) return SPX_OK;
    if (p->n_norm >= TOK_MAX_STEPS)
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s: more than %d normalizers", label, path,
                        TOK_MAX_STEPS);
    tok_norm *n = &p->norm[p->n_norm];
    memset(n, 0, sizeof *n);
    if (!strcmp(type, "NFC")) n->kind = TOK_NORM_NFC;
    else if (!strcmp(type, "NFD")) n->kind = TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) n->kind = TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) n->kind = TOK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) n->kind = TOK_NORM_LOWERCASE;
    else if (!strcmp(type, "Prepend")) {
        const char *s;
        SPX_TRY(get_string(j, "prepend", label, path, &s, e));
        n->kind = TOK_NORM_PREPEND;
        p->n_norm++; /* owned from here on: freed by tok_pipe_free */
        return dup_string(s, label, &n->a, &n->a_len, e);
    } else if (!strcmp(type, "Replace")) {
        const char *pat, *content;
        bool literal;
        SPX_TRY(get_pattern(j, label, path, &pat, &literal, e));
        SPX_TRY(get_string(j, "content", label, path, &content, e));
        n->kind = TOK_NORM_REPLACE;
        p->n_norm++;
        SPX_TRY(dup_string(content, label, &n->b, &n->b_len, e));
        if (literal) {
            if (!*pat)
                return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.pattern: empty String pattern", label,
                                path);
            return dup_string(pat, label, &n->a, &n->a_len, e);
        }
        char field[200];
        snprintf(field, sizeof field, "%s.pattern.Regex", path);
        return tok_regex_compile(pat, strlen(pat), false, label, field, &n->re, e);
    } else if (!strcmp(type, "Strip")) {
        n->kind = TOK_NORM_STRIP;
        SPX_TRY(tok_json_bool(j, "strip_left", true, label, path, &n->left, e));
        SPX_TRY(tok_json_bool(j, "strip_right", true, label, path, &n->right, e));
    } else {
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s.type '%.40s' is not a supported normalizer",
                        label, path, type);
    }
    p->n_norm++;
    return SPX_OK;
}

static spx_status parse_pre(tok_pipe *p, const cJSON *j, const char *label, const char *path,
                            int depth, spx_err *e) {
    const char *type;
    SPX_TRY(step_head(p, j, label, path, depth, "pretokenizers", parse_pre, &type, e));
    if (!type) return SPX_OK;
    if (p->n_pre >= TOK_MAX_STEPS)
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s: more than %d pre-tokenizers", label,
                        path, TOK_MAX_STEPS);
    tok_pre *t = &p->pre[p->n_pre];
    memset(t, 0, sizeof *t);
    char field[200];
    if (!strcmp(type, "Split")) {
        const char *pat, *beh;
        bool literal;
        SPX_TRY(get_pattern(j, label, path, &pat, &literal, e));
        SPX_TRY(get_string(j, "behavior", label, path, &beh, e));
        SPX_TRY(tok_json_bool(j, "invert", false, label, path, &t->invert, e));
        if (!strcmp(beh, "Removed")) t->behavior = TOK_SPLIT_REMOVED;
        else if (!strcmp(beh, "Isolated")) t->behavior = TOK_SPLIT_ISOLATED;
        else if (!strcmp(beh, "MergedWithPrevious")) t->behavior = TOK_SPLIT_MERGED_PREV;
        else if (!strcmp(beh, "MergedWithNext")) t->behavior = TOK_SPLIT_MERGED_NEXT;
        else if (!strcmp(beh, "Contiguous")) t->behavior = TOK_SPLIT_CONTIGUOUS;
        else
            return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s.behavior '%.40s' is not supported",
                            label, path, beh);
        t->kind = TOK_PRE_SPLIT;
        snprintf(field, sizeof field, "%s.pattern", path);
        p->n_pre++;
        return tok_regex_compile(pat, strlen(pat), literal, label, field, &t->re, e);
    }
    if (!strcmp(type, "ByteLevel")) {
        bool use_regex;
        t->kind = TOK_PRE_BYTELEVEL;
        SPX_TRY(tok_json_bool(j, "add_prefix_space", true, label, path, &t->add_prefix_space, e));
        SPX_TRY(tok_json_bool(j, "use_regex", true, label, path, &use_regex, e));
        p->n_pre++;
        if (!use_regex) return SPX_OK;
        snprintf(field, sizeof field, "%s (GPT-2 regex)", path);
        return tok_regex_compile(GPT2_REGEX, strlen(GPT2_REGEX), false, label, field, &t->re, e);
    }
    if (!strcmp(type, "Metaspace")) {
        const char *repl;
        SPX_TRY(get_string(j, "replacement", label, path, &repl, e));
        uint32_t cp;
        size_t rl = strlen(repl);
        int k = rl ? tok_utf8_scan(repl, rl, &cp) : 0;
        if (k <= 0 || (size_t)k != rl)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.replacement: expected one character", label,
                            path);
        memcpy(t->repl, repl, rl);
        t->repl_len = rl;
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
        bool aps;
        SPX_TRY(tok_json_bool(j, "add_prefix_space", true, label, path, &aps, e));
        t->prepend = TOK_PREPEND_ALWAYS;
        if (!aps) t->prepend = TOK_PREPEND_NEVER;
        if (ps && !cJSON_IsNull(ps)) {
            if (!cJSON_IsString(ps))
                return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.prepend_scheme: expected a string",
                                label, path);
            if (!strcmp(ps->valuestring, "always")) t->prepend = TOK_PREPEND_ALWAYS;
            else if (!strcmp(ps->valuestring, "first")) t->prepend = TOK_PREPEND_FIRST;
            else if (!strcmp(ps->valuestring, "never")) t->prepend = TOK_PREPEND_NEVER;
            else
                return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s.prepend_scheme '%.20s' is not supported",
                                label, path, ps->valuestring);
        }
        SPX_TRY(tok_json_bool(j, "split", true, label, path, &t->split, e));
        t->kind = TOK_PRE_METASPACE;
        p->n_pre++;
        return SPX_OK;
    }
    if (!strcmp(type, "Digits")) {
        t->kind = TOK_PRE_DIGITS;
        SPX_TRY(tok_json_bool(j, "individual_digits", false, label, path, &t->individual_digits, e));
        p->n_pre++;
        return SPX_OK;
    }
    return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s.type '%.40s' is not a supported pre-tokenizer",
                    label, path, type);
}

spx_status tok_pipe_load(tok_pipe *p, const cJSON *normalizer, const cJSON *pre_tokenizer,
                         const char *label, spx_err *e) {
    tok_bytelevel_init(&p->bl);
    SPX_TRY(parse_norm(p, normalizer, label, "normalizer", 0, e));
    return parse_pre(p, pre_tokenizer, label, "pre_tokenizer", 0, e);
}

void tok_pipe_free(tok_pipe *p) {
    for (size_t i = 0; i < p->n_norm; i++) {
        free(p->norm[i].a);
        free(p->norm[i].b);
        pcre2_code_free(p->norm[i].re);
    }
    for (size_t i = 0; i < p->n_pre; i++) pcre2_code_free(p->pre[i].re);
    p->n_norm = p->n_pre = 0;
}

void tok_work_free(tok_work *w) {
    pcre2_match_data_free(w->md);
    tok_buf_free(&w->arena);
    free(w->cur.v);
    free(w->nxt.v);
    free(w->spans.v);
    tok_buf_free(&w->t1);
    tok_buf_free(&w->t2);
    tok_bpe_ws_free(&w->bpe);
    memset(w, 0, sizeof *w);
}

/* ------------------------------------------------------------------ */
/* Normalizing                                                         */
/* ------------------------------------------------------------------ */

#define OOM() spx_fail(e, SPX_ERR_NOMEM, "tokenizer: out of memory")

static spx_status norm_step(const tok_norm *nm, const char *s, size_t n, tok_buf *out,
                            tok_work *w, spx_err *e) {
    out->n = 0;
    switch (nm->kind) {
    case TOK_NORM_NFC: case TOK_NORM_NFD: case TOK_NORM_NFKC: case TOK_NORM_NFKD: {
        if (n == 0) return tok_buf_put(out, "", 0) ? SPX_OK : OOM();
        int opt = UTF8PROC_STABLE;
        if (nm->kind == TOK_NORM_NFC || nm->kind == TOK_NORM_NFKC) opt |= UTF8PROC_COMPOSE;
        else opt |= UTF8PROC_DECOMPOSE;
        if (nm->kind == TOK_NORM_NFKC || nm->kind == TOK_NORM_NFKD) opt |= UTF8PROC_COMPAT;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                          (utf8proc_option_t)opt);
        if (r < 0) {
            free(dst);
            return spx_fail(e, SPX_ERR_ARG, "tokenizer: Unicode normalization failed: %s",
                            utf8proc_errmsg(r));
        }
        bool ok = tok_buf_put(out, dst, (size_t)r);
        free(dst);
        return ok ? SPX_OK : OOM();
    }
    case TOK_NORM_LOWERCASE:
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int k = tok_utf8_scan(s + i, n - i, &cp);
            if (k <= 0) return spx_fail(e, SPX_ERR_INTERNAL, "tokenizer: invalid UTF-8 in normalizer");
            char c[4];
            size_t cl = tok_utf8_put((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), c);
            /* Rust's char::to_lowercase: U+0130 is the one character that
             * lowercases to two ("i" + U+0307); utf8proc gives just "i" */
            bool ok = cp == 0x130 ? tok_buf_put(out, "i\xCC\x87", 3) : tok_buf_put(out, c, cl);
            if (!ok) return OOM();
            i += (size_t)k;
        }
        return tok_buf_put(out, "", 0) ? SPX_OK : OOM();
    case TOK_NORM_PREPEND:
        if (n > 0 && !tok_buf_put(out, nm->a, nm->a_len)) return OOM();
        return tok_buf_put(out, s, n) ? SPX_OK : OOM();
    case TOK_NORM_REPLACE:
        if (!nm->re)
            return tok_replace_all(s, n, nm->a, nm->a_len, nm->b, nm->b_len, out) ? SPX_OK : OOM();
        SPX_TRY(tok_regex_spans(nm->re, s, n, w->md, &w->spans, e));
        for (size_t i = 0; i < w->spans.n; i++) {
            const tok_span *sp = &w->spans.v[i];
            bool ok = sp->match ? tok_buf_put(out, nm->b, nm->b_len)
                                : tok_buf_put(out, s + sp->s, sp->e - sp->s);
            if (!ok) return OOM();
        }
        return tok_buf_put(out, "", 0) ? SPX_OK : OOM();
    case TOK_NORM_STRIP: {
        size_t a = 0, b = n;
        while (nm->left && a < b) {
            uint32_t cp;
            int k = tok_utf8_scan(s + a, b - a, &cp);
            if (k <= 0 || !tok_is_space(cp)) break;
            a += (size_t)k;
        }
        while (nm->right && b > a) {
            size_t st;
            uint32_t cp = tok_utf8_prev(s, b, &st);
            if (st < a || !tok_is_space(cp)) break;
            b = st;
        }
        return tok_buf_put(out, s + a, b - a) ? SPX_OK : OOM();
    }
    }
    return spx_fail(e, SPX_ERR_INTERNAL, "tokenizer: unknown normalizer");
}

spx_status tok_normalize(const tok_pipe *p, const char *s, size_t n, tok_buf *out, tok_work *w,
                         spx_err *e) {
    out->n = 0;
    if (!tok_buf_put(out, s, n)) return OOM();
    for (size_t i = 0; i < p->n_norm; i++) {
        SPX_TRY(norm_step(&p->norm[i], out->p, out->n, &w->t1, w, e));
        tok_buf t = *out;
        *out = w->t1;
        w->t1 = t;
    }
    return SPX_OK;
}

/* ------------------------------------------------------------------ */
/* Pre-tokenizing                                                      */
/* ------------------------------------------------------------------ */

static bool pieces_push(tok_pieces *a, size_t off, size_t len, bool first) {
    if (len == 0) return true; /* empty pieces are dropped */
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        tok_piece *v = realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (tok_piece){off, len, first};
    return true;
}

/* Applies a delimiter behaviour to w->spans (offsets relative to base)
 * and pushes the resulting pieces to w->nxt. */
static spx_status emit_spans(tok_work *w, tok_split_behavior beh, bool invert, size_t base,
                             bool first, spx_err *e) {
    tok_spans *sp = &w->spans;
    if (invert)
        for (size_t i = 0; i < sp->n; i++) sp->v[i].match = !sp->v[i].match;
    size_t k = 0; /* compacted in place */
    bool prev = false;
    switch (beh) {
    case TOK_SPLIT_ISOLATED:
        k = sp->n;
        break;
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < sp->n; i++)
            if (!sp->v[i].match) sp->v[k++] = sp->v[i];
        break;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < sp->n; i++) {
            bool m = sp->v[i].match;
            if (k > 0 && m == prev) sp->v[k - 1].e = sp->v[i].e;
            else sp->v[k++] = sp->v[i];
            prev = m;
        }
        break;
    case TOK_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < sp->n; i++) {
            bool m = sp->v[i].match;
            if (m && !prev && k > 0) sp->v[k - 1].e = sp->v[i].e;
            else sp->v[k++] = sp->v[i];
            prev = m;
        }
        break;
    case TOK_SPLIT_MERGED_NEXT: {
        /* walk backwards; results are built from the end of the array */
        size_t top = sp->n; /* sp->v[top..n) holds the output, in order */
        for (size_t i = sp->n; i-- > 0;) {
            tok_span cur = sp->v[i];
            bool m = cur.match;
            if (m && !prev && top < sp->n) sp->v[top].s = cur.s;
            else sp->v[--top] = cur;
            prev = m;
        }
        memmove(sp->v, sp->v + top, (sp->n - top) * sizeof *sp->v);
        k = sp->n - top;
        break;
    }
    }
    for (size_t i = 0; i < k; i++)
        if (!pieces_push(&w->nxt, base + sp->v[i].s, sp->v[i].e - sp->v[i].s,
                         first && sp->v[i].s == 0))
            return OOM();
    return SPX_OK;
}

/* Spans of a per-character predicate: each matching character is its own
 * match; runs of other characters are one non-match span. */
static spx_status char_spans(const char *s, size_t n, bool (*pred)(uint32_t, const void *),
                             const void *arg, tok_spans *out, spx_err *e) {
    out->n = 0;
    size_t prev = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tok_utf8_scan(s + i, n - i, &cp);
        if (k <= 0) return spx_fail(e, SPX_ERR_INTERNAL, "tokenizer: invalid UTF-8 in pre-tokenizer");
        if (pred(cp, arg)) {
            if (prev != i && !tok_spans_push(out, prev, i, false)) return OOM();
            if (!tok_spans_push(out, i, i + (size_t)k, true)) return OOM();
            prev = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (prev != n && !tok_spans_push(out, prev, n, false)) return OOM();
    return SPX_OK;
}

static bool pred_numeric(uint32_t cp, const void *arg) {
    (void)arg;
    return tok_is_numeric(cp);
}

static bool pred_equal(uint32_t cp, const void *arg) { return cp == *(const uint32_t *)arg; }

/* Appends new content for a piece to the arena; returns its offset. */
static bool arena_begin(tok_work *w, size_t *off) {
    *off = w->arena.n;
    return tok_buf_grow(&w->arena, 0);
}

static spx_status pre_bytelevel(const tok_pipe *p, const tok_pre *t, tok_piece pc, tok_work *w,
                                spx_err *e) {
    /* optional prefix space, then optional GPT-2 split, then byte mapping */
    size_t off = pc.off, len = pc.len;
    if (t->add_prefix_space && !(len > 0 && w->arena.p[off] == ' ')) {
        size_t o;
        if (!arena_begin(w, &o) || !tok_buf_put(&w->arena, " ", 1)) return OOM();
        w->t2.n = 0;
        if (!tok_buf_put(&w->t2, w->arena.p + off, len)) return OOM();
        if (!tok_buf_put(&w->arena, w->t2.p, w->t2.n)) return OOM();
        off = o;
        len += 1;
    }
    w->spans.n = 0;
    if (t->re) {
        SPX_TRY(tok_regex_spans(t->re, w->arena.p + off, len, w->md, &w->spans, e));
    } else if (!tok_spans_push(&w->spans, 0, len, false)) {
        return OOM();
    }
    for (size_t i = 0; i < w->spans.n; i++) {
        size_t s = off + w->spans.v[i].s, n = w->spans.v[i].e - w->spans.v[i].s;
        if (n == 0) continue;
        w->t2.n = 0;
        for (size_t j = 0; j < n; j++) {
            uint8_t b = (uint8_t)w->arena.p[s + j];
            if (!tok_buf_put(&w->t2, p->bl.enc[b], p->bl.enc_len[b])) return OOM();
        }
        size_t o;
        if (!arena_begin(w, &o) || !tok_buf_put(&w->arena, w->t2.p, w->t2.n)) return OOM();
        if (!pieces_push(&w->nxt, o, w->t2.n, pc.first && w->spans.v[i].s == 0)) return OOM();
    }
    return SPX_OK;
}

static spx_status pre_metaspace(const tok_pre *t, tok_piece pc, tok_work *w, spx_err *e) {
    w->t2.n = 0;
    bool prepend = t->prepend == TOK_PREPEND_ALWAYS || (t->prepend == TOK_PREPEND_FIRST && pc.first);
    if (!tok_replace_all(w->arena.p + pc.off, pc.len, " ", 1, t->repl, t->repl_len, &w->t2))
        return OOM();
    bool starts = w->t2.n >= t->repl_len && !memcmp(w->t2.p, t->repl, t->repl_len);
    size_t o;
    if (!arena_begin(w, &o)) return OOM();
    if (prepend && !starts && !tok_buf_put(&w->arena, t->repl, t->repl_len)) return OOM();
    if (!tok_buf_put(&w->arena, w->t2.p, w->t2.n)) return OOM();
    size_t len = w->arena.n - o;
    if (!t->split) return pieces_push(&w->nxt, o, len, pc.first) ? SPX_OK : OOM();
    uint32_t cp;
    (void)tok_utf8_scan(t->repl, t->repl_len, &cp);
    SPX_TRY(char_spans(w->arena.p + o, len, pred_equal, &cp, &w->spans, e));
    return emit_spans(w, TOK_SPLIT_MERGED_NEXT, false, o, pc.first, e);
}

spx_status tok_pretokenize(const tok_pipe *p, const char *s, size_t n, bool first, tok_work *w,
                           spx_err *e) {
    w->arena.n = 0;
    w->cur.n = 0;
    if (!tok_buf_put(&w->arena, s, n) || !pieces_push(&w->cur, 0, n, first)) return OOM();
    for (size_t k = 0; k < p->n_pre; k++) {
        const tok_pre *t = &p->pre[k];
        w->nxt.n = 0;
        for (size_t i = 0; i < w->cur.n; i++) {
            tok_piece pc = w->cur.v[i];
            switch (t->kind) {
            case TOK_PRE_SPLIT:
                SPX_TRY(tok_regex_spans(t->re, w->arena.p + pc.off, pc.len, w->md, &w->spans, e));
                SPX_TRY(emit_spans(w, t->behavior, t->invert, pc.off, pc.first, e));
                break;
            case TOK_PRE_DIGITS:
                SPX_TRY(char_spans(w->arena.p + pc.off, pc.len, pred_numeric, NULL, &w->spans, e));
                SPX_TRY(emit_spans(w, t->individual_digits ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS,
                                   false, pc.off, pc.first, e));
                break;
            case TOK_PRE_BYTELEVEL:
                SPX_TRY(pre_bytelevel(p, t, pc, w, e));
                break;
            case TOK_PRE_METASPACE:
                SPX_TRY(pre_metaspace(t, pc, w, e));
                break;
            }
        }
        tok_pieces tmp = w->cur;
        w->cur = w->nxt;
        w->nxt = tmp;
    }
    return SPX_OK;
}
