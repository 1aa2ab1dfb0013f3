/* tok_util.c: small pieces the tokenizer is built from: growable buffers,
 * UTF-8 scanning (strict validation, lossy conversion by maximal invalid
 * subparts), the Unicode classes the HF code uses (\s, \w, is_numeric,
 * through utf8proc), GPT-2's byte-level alphabet, PCRE2 compile/find-all,
 * and transformers' clean_up_tokenization. */
#include "format/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------ */
/* Buffers                                                             */
/* ------------------------------------------------------------------ */

bool tok_buf_grow(tok_buf *b, size_t extra) {
    size_t need;
    if (__builtin_add_overflow(b->n, extra, &need) || __builtin_add_overflow(need, 1, &need))
        return false;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return false;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool tok_buf_put(tok_buf *b, const void *s, size_t n) {
    if (!tok_buf_grow(b, n)) return false;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

void tok_buf_free(tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

bool tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof *a->v) return false;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return true;
}

bool tok_spans_push(tok_spans *a, size_t s, size_t e, bool match) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof *a->v) return false;
        tok_span *v = realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (tok_span){s, e, match};
    return true;
}

bool tok_replace_all(const char *s, size_t n, const char *pat, size_t pl, const char *with,
                     size_t wl, tok_buf *out) {
    size_t i = 0;
    while (pl > 0 && i < n) {
        const char *hit = pl <= n - i ? memmem(s + i, n - i, pat, pl) : NULL;
        if (!hit) break;
        size_t j = (size_t)(hit - s);
        if (!tok_buf_put(out, s + i, j - i) || !tok_buf_put(out, with, wl)) return false;
        i = j + pl;
    }
    return tok_buf_put(out, s + i, n - i);
}

/* ------------------------------------------------------------------ */
/* UTF-8                                                               */
/* ------------------------------------------------------------------ */

int tok_utf8_scan(const char *s, size_t n, uint32_t *cp) {
    const uint8_t *u = (const uint8_t *)s;
    uint8_t b = u[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int need;
    uint32_t c;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
        c = b & 0x1Fu;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        c = b & 0x0Fu;
        if (b == 0xE0) lo = 0xA0;      /* no overlongs */
        else if (b == 0xED) hi = 0x9F; /* no surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        c = b & 0x07u;
        if (b == 0xF0) lo = 0x90;      /* no overlongs */
        else if (b == 0xF4) hi = 0x8F; /* <= U+10FFFF */
    } else {
        return -1;
    }
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return 0;
        uint8_t x = u[i];
        if (x < lo || x > hi) return -i;
        lo = 0x80;
        hi = 0xBF;
        c = (c << 6) | (x & 0x3Fu);
    }
    *cp = c;
    return need + 1;
}

size_t tok_utf8_check(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* fast path over ASCII */
        if ((uint8_t)s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = tok_utf8_scan(s + i, n - i, &cp);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return n;
}

size_t tok_utf8_put(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

uint32_t tok_utf8_prev(const char *s, size_t end, size_t *start) {
    size_t i = end;
    while (i > 0 && ((uint8_t)s[i - 1] & 0xC0) == 0x80 && end - i < 3) i--;
    if (i > 0) i--;
    uint32_t cp = 0xFFFD;
    if (tok_utf8_scan(s + i, end - i, &cp) <= 0) cp = 0xFFFD;
    if (start) *start = i;
    return cp;
}

bool tok_utf8_lossy(const char *s, size_t n, tok_buf *out, size_t *hold) {
    static const char repl[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0; /* s[run..i) is valid and not yet copied */
    if (hold) *hold = 0;
    while (i < n) {
        if ((uint8_t)s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = tok_utf8_scan(s + i, n - i, &cp);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (!tok_buf_put(out, s + run, i - run)) return false;
        if (k == 0) { /* truncated at the end */
            if (hold) {
                *hold = n - i;
                return true;
            }
            if (!tok_buf_put(out, repl, 3)) return false;
            return true;
        }
        if (!tok_buf_put(out, repl, 3)) return false;
        i += (size_t)-k;
        run = i;
    }
    return tok_buf_put(out, s + run, n - run);
}

/* ------------------------------------------------------------------ */
/* Character classes                                                   */
/* ------------------------------------------------------------------ */

bool tok_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

bool tok_is_word(uint32_t c) {
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               c == '_';
    if (c == 0x200C || c == 0x200D) return true; /* Join_Control */
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

bool tok_is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* ------------------------------------------------------------------ */
/* Byte-level alphabet                                                 */
/* ------------------------------------------------------------------ */

void tok_bytelevel_init(tok_bytelevel *bl) {
    for (size_t i = 0; i < sizeof bl->dec / sizeof bl->dec[0]; i++) bl->dec[i] = -1;
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cp = printable ? b : 256 + extra++;
        char tmp[4];
        size_t k = tok_utf8_put(cp, tmp); /* cp <= 323: 1 or 2 bytes */
        memcpy(bl->enc[b], tmp, k);
        bl->enc_len[b] = (uint8_t)k;
        bl->dec[cp] = (int16_t)b;
    }
}

/* ------------------------------------------------------------------ */
/* clean_up_tokenization                                               */
/* ------------------------------------------------------------------ */

bool tok_cleanup_spaces(const char *s, size_t n, tok_buf *out) {
    static const struct { const char *from, *to; } rep[10] = {
        {" .", "."},   {" ?", "?"},     {" !", "!"},     {" ,", ","},     {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
    };
    tok_buf a = {0}, b = {0};
    if (!tok_buf_put(&a, s, n)) return false;
    for (int r = 0; r < 10; r++) {
        size_t fl = strlen(rep[r].from), tl = strlen(rep[r].to);
        b.n = 0;
        if (!tok_buf_grow(&b, a.n)) goto oom;
        size_t i = 0;
        while (i < a.n) {
            /* every pattern starts with a space: jump to the next one */
            const char *sp = memchr(a.p + i, ' ', a.n - i);
            if (!sp) break;
            size_t j = (size_t)(sp - a.p);
            if (!tok_buf_put(&b, a.p + i, j - i)) goto oom;
            if (a.n - j >= fl && !memcmp(a.p + j, rep[r].from, fl)) {
                if (!tok_buf_put(&b, rep[r].to, tl)) goto oom;
                i = j + fl;
            } else {
                if (!tok_buf_put(&b, " ", 1)) goto oom;
                i = j + 1;
            }
        }
        if (!tok_buf_put(&b, a.p + i, a.n - i)) goto oom;
        tok_buf t = a;
        a = b;
        b = t;
    }
    bool ok = tok_buf_put(out, a.p, a.n);
    tok_buf_free(&a);
    tok_buf_free(&b);
    return ok;
oom:
    tok_buf_free(&a);
    tok_buf_free(&b);
    return false;
}

/* ------------------------------------------------------------------ */
/* PCRE2                                                               */
/* ------------------------------------------------------------------ */

spx_status tok_regex_compile(const char *pat, size_t len, bool literal, const char *label,
                             const char *field, pcre2_code **out, spx_err *e) {
    *out = NULL;
    if (tok_utf8_check(pat, len) != len)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s: pattern is not valid UTF-8", label, field);
    /* PCRE2_LITERAL refuses PCRE2_UCP (it does not need it) */
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opt, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: %s: cannot compile regex '%.80s' at offset %zu: %s", label, field,
                        pat, (size_t)off, (const char *)msg);
    }
    /* JIT is an optimisation: when it is not available the interpreter runs. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return SPX_OK;
}

static int regex_match(const pcre2_code *re, const char *s, size_t n, size_t pos,
                       pcre2_match_data *md) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    return rc;
}

spx_status tok_regex_spans(const pcre2_code *re, const char *s, size_t n,
                           pcre2_match_data *md, tok_spans *out, spx_err *e) {
    out->n = 0;
    size_t pos = 0, prev = 0;
    while (pos <= n) {
        int rc = regex_match(re, s, n, pos, md);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return spx_fail(e, SPX_ERR_RANGE, "tokenizer: regex match failed at byte %zu: %s",
                            pos, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms || me > n || ms < pos)
            return spx_fail(e, SPX_ERR_UNSUPPORTED,
                            "tokenizer: regex gave a match that ends before it starts (\\K?)");
        if (prev != ms && !tok_spans_push(out, prev, ms, false)) goto oom;
        if (!tok_spans_push(out, ms, me, true)) goto oom;
        prev = me;
        if (me > ms) {
            pos = me;
        } else { /* empty match: step over one character */
            if (ms >= n) break;
            uint32_t cp;
            int k = tok_utf8_scan(s + ms, n - ms, &cp);
            pos = ms + (size_t)(k > 0 ? k : 1);
        }
    }
    if (prev != n && !tok_spans_push(out, prev, n, false)) goto oom;
    return SPX_OK;
oom:
    return spx_fail(e, SPX_ERR_NOMEM, "tokenizer: out of memory splitting text");
}

/* ------------------------------------------------------------------ */
/* JSON helpers                                                        */
/* ------------------------------------------------------------------ */

const char *tok_json_type(const cJSON *j) {
    if (!j) return "missing";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "invalid";
}

spx_status tok_json_bool(const cJSON *obj, const char *key, bool def, const char *label,
                         const char *where, bool *out, spx_err *e) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return SPX_OK;
    }
    if (!cJSON_IsBool(j))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.%s: expected a boolean, got %s", label, where,
                        key, tok_json_type(j));
    *out = cJSON_IsTrue(j);
    return SPX_OK;
}
