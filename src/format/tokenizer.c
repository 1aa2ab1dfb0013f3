/* tokenizer.c: Hugging Face tokenizer.json (+ tokenizer_config.json)
 * tokenizers: loading, encode, decode, streaming decode.
 *
 * Encode follows tokenizers' TokenizerImpl::encode: added tokens that are
 * not "normalized" are cut out of the raw text (leftmost-longest match,
 * lstrip/rstrip/single_word honoured); each remaining piece is normalized,
 * "normalized" added tokens are cut out of the normalized text, the rest
 * is pre-tokenized and run through BPE (tok_bpe.c); the post-processor
 * (TemplateProcessing, Roberta/Bert, ByteLevel, Sequence, null) adds
 * special tokens when asked. That per-piece normalization is what gives
 * Llama-2-style files their "legacy" behaviour: each piece between special
 * tokens gets its own "▁" from Prepend, and empty text gets none.
 *
 * tokenizer_config.json: transformers' LlamaTokenizerFast (and CodeLlama,
 * Gemma) rebuild the post-processor from add_bos_token (default true) and
 * add_eos_token (default false); other classes use tokenizer.json's. bos/eos
 * ids come from bos_token/eos_token, else from the post-processor.
 * clean_up_tokenization_spaces (default false) is applied after decoding,
 * and split_special_tokens turns special-token matching off.
 *
 * Decode: a supported decoder chain is run token by token (Replace,
 * ByteLevel, Metaspace, per-token Strip before any Fuse; ByteFallback;
 * Fuse; Strip of leading characters of the fused text). Byte runs are
 * turned into text with one U+FFFD per maximal invalid subpart, as
 * transformers.js (TextDecoder) does; tokenizers (Rust) instead turns a
 * whole invalid run into one U+FFFD per byte. The two agree on valid text.
 * The streaming decoder runs the same per-token code and holds back an
 * incomplete UTF-8 character, and (with clean-up on) text too close to a
 * space for the clean-up rules to be settled; its output concatenated
 * equals spx_tok_decode of the same ids. */
#include "format/tok_internal.h"
#include "format/chat_info.h"

#include "core/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_F_ADDED 1u
#define TOK_F_SPECIAL 2u
#define TOK_JSON_MAX ((size_t)512 << 20)  /* tokenizer.json size cap */
#define TOK_CFG_MAX ((size_t)64 << 20)    /* tokenizer_config.json size cap */
#define NO_PIECE UINT64_MAX

typedef struct tok_added {
    int32_t id;
    size_t pat_off, pat_len; /* match pattern in added_text (normalized if normalized) */
    bool lstrip, rstrip, single_word, normalized, special;
} tok_added;

/* Added tokens to match, grouped by first byte, longest first. */
typedef struct tok_addset {
    uint32_t *idx;
    size_t n;
    uint32_t start[257];
} tok_addset;

typedef enum { DEC_REPLACE, DEC_BYTELEVEL, DEC_METASPACE, DEC_STRIP } tok_dstep_kind;

typedef struct tok_dstep {
    tok_dstep_kind kind;
    char *pat, *with;        /* Replace; Metaspace: pat = replacement */
    size_t pat_len, with_len;
    bool drop_first;         /* Metaspace: prepend_scheme != never */
    uint32_t ch;             /* Strip */
    size_t start, stop;
} tok_dstep;

typedef struct tok_dec {
    bool present;            /* false: tokens joined with " " */
    tok_dstep step[TOK_MAX_STEPS];
    size_t n_step;           /* per-token steps, in chain order */
    bool byte_fallback;
    uint32_t strip_ch;       /* Strip after Fuse/ByteLevel: leading chars */
    size_t strip_start;
} tok_dec;

struct spx_tokenizer {
    char *label;
    tok_bpe bpe;
    tok_pipe pipe;
    int64_t n_ids;           /* largest id + 1 */
    tok_buf pieces;          /* NUL-terminated token strings */
    uint64_t *piece_off;     /* per id, NO_PIECE for holes */
    uint32_t *piece_len;
    uint8_t *flags;          /* TOK_F_* per id */
    tok_added *added;
    size_t n_added;
    tok_buf added_text;
    tok_addset raw_set, norm_set;
    bool split_special;
    tok_ids pre_ids, post_ids; /* added around the text when add_special */
    int32_t bos, eos;
    tok_dec dec;
    bool cleanup;
};

#define OOM(t) spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", (t)->label)

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

static spx_status parse_json(const char *buf, size_t len, const char *label, const char *what,
                             cJSON **out, spx_err *e) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!j) {
        size_t at = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: %s is not valid JSON (error near byte %zu of %zu; nesting deeper "
                        "than %d levels is refused too)",
                        label, what, at, len, CJSON_NESTING_LIMIT);
    }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s: expected a JSON object at the top level",
                        label, what);
    }
    *out = j;
    return SPX_OK;
}

static bool get_id(const cJSON *j, int32_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d < TOK_MAX_ID) || d != floor(d)) return false;
    *out = (int32_t)d;
    return true;
}

static bool has_piece(const spx_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->piece_off[id] != NO_PIECE;
}

/* Id of a token by its text: added tokens first, then the vocabulary. */
static int32_t find_token(const spx_tokenizer *t, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < t->n_added; i++) {
        int32_t id = t->added[i].id;
        if (t->piece_len[id] == n && !memcmp(t->pieces.p + t->piece_off[id], s, n)) return id;
    }
    return tok_strmap_get(&t->bpe.vocab, s, n);
}

/* ------------------------------------------------------------------ */
/* Added tokens                                                        */
/* ------------------------------------------------------------------ */

static spx_status load_added(spx_tokenizer *t, const cJSON *list, spx_err *e) {
    if (!list || cJSON_IsNull(list)) return SPX_OK;
    if (!cJSON_IsArray(list))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: added_tokens: expected an array, got %s", t->label,
                        tok_json_type(list));
    size_t n = 0;
    for (const cJSON *it = list->child; it; it = it->next) n++;
    if (n > TOK_MAX_ID)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: added_tokens: %zu entries, more than %d", t->label,
                        n, TOK_MAX_ID);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return OOM(t);
    size_t i = 0;
    for (const cJSON *it = list->child; it; it = it->next, i++) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (!cJSON_IsObject(it))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: %s: expected an object, got %s", t->label,
                            where, tok_json_type(it));
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        tok_added *a = &t->added[t->n_added];
        if (!get_id(id, &a->id))
            return spx_fail(e, SPX_ERR_RANGE, "%s: %s.id: expected an integer in [0, %d), got %s",
                            t->label, where, TOK_MAX_ID, tok_json_type(id));
        if (!cJSON_IsString(content))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.content: expected a string, got %s",
                            t->label, where, tok_json_type(content));
        size_t cl = strlen(content->valuestring);
        if (cl > TOK_MAX_PIECE || tok_utf8_check(content->valuestring, cl) != cl)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.content: longer than %d bytes or not UTF-8",
                            t->label, where, TOK_MAX_PIECE);
        SPX_TRY(tok_json_bool(it, "lstrip", false, t->label, where, &a->lstrip, e));
        SPX_TRY(tok_json_bool(it, "rstrip", false, t->label, where, &a->rstrip, e));
        SPX_TRY(tok_json_bool(it, "single_word", false, t->label, where, &a->single_word, e));
        SPX_TRY(tok_json_bool(it, "special", false, t->label, where, &a->special, e));
        SPX_TRY(tok_json_bool(it, "normalized", !a->special, t->label, where, &a->normalized, e));
        if (cl == 0) {
            spx_log(SPX_LOG_WARN, "%s: %s has empty content; ignored", t->label, where);
            continue;
        }
        int32_t vid = tok_strmap_get(&t->bpe.vocab, content->valuestring, cl);
        if (vid >= 0 && vid != a->id)
            spx_log(SPX_LOG_WARN, "%s: %s '%.40s' has id %d but the vocabulary gives it %d; using %d",
                    t->label, where, content->valuestring, a->id, vid, a->id);
        a->pat_off = t->added_text.n;
        a->pat_len = cl;
        if (!tok_buf_put(&t->added_text, content->valuestring, cl)) return OOM(t);
        t->n_added++;
    }
    return SPX_OK;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Builds the match set of the added tokens whose normalized flag is want.
 * Patterns of normalized tokens are normalized first, as tokenizers does. */
static spx_status build_addset(spx_tokenizer *t, bool want, tok_addset *set, tok_work *w,
                               spx_err *e) {
    set->n = 0;
    size_t cap = t->n_added ? t->n_added : 1;
    set->idx = malloc(cap * sizeof *set->idx);
    uint64_t *keys = malloc(cap * sizeof *keys);
    tok_buf norm = {0};
    spx_status st = SPX_OK;
    if (!set->idx || !keys) {
        st = OOM(t);
        goto done;
    }
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (a->normalized != want) continue;
        if (want && t->pipe.n_norm) {
            st = tok_normalize(&t->pipe, t->added_text.p + a->pat_off, a->pat_len, &norm, w, e);
            if (st) goto done;
            if (norm.n == 0 || norm.n > TOK_MAX_PIECE) continue;
            a->pat_off = t->added_text.n;
            a->pat_len = norm.n;
            if (!tok_buf_put(&t->added_text, norm.p, norm.n)) {
                st = OOM(t);
                goto done;
            }
        }
        /* sort key: first byte, then longest first, then file order */
        uint64_t fb = (uint8_t)t->added_text.p[a->pat_off];
        uint64_t inv_len = (uint64_t)(TOK_MAX_PIECE - a->pat_len);
        keys[set->n++] = (fb << 56) | (inv_len << 32) | (uint64_t)i;
    }
    qsort(keys, set->n, sizeof *keys, cmp_u64);
    for (size_t i = 0; i < set->n; i++) set->idx[i] = (uint32_t)(keys[i] & 0xFFFFFFFFu);
    /* start[b] .. start[b+1]: the tokens beginning with byte b */
    size_t k = 0;
    for (int b = 0; b < 256; b++) {
        set->start[b] = (uint32_t)k;
        while (k < set->n && (keys[k] >> 56) == (uint64_t)b) k++;
    }
    set->start[256] = (uint32_t)k;
done:
    free(keys);
    tok_buf_free(&norm);
    return st;
}

/* A piece of text (id < 0) or an added token, from split_added. */
typedef struct tok_aspan {
    size_t s, e;
    int32_t id;
} tok_aspan;

typedef struct tok_aspans {
    tok_aspan *v;
    size_t n, cap;
} tok_aspans;

static bool aspans_push(tok_aspans *a, size_t s, size_t e, int32_t id) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        tok_aspan *v = realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (tok_aspan){s, e, id};
    return true;
}

/* Leftmost-longest match of the set at or after pos; SIZE_MAX if none. */
static size_t find_added(const spx_tokenizer *t, const tok_addset *set, const char *s, size_t n,
                         size_t pos, size_t *which) {
    for (size_t i = pos; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        for (uint32_t k = set->start[b]; k < set->start[b + 1]; k++) {
            const tok_added *a = &t->added[set->idx[k]];
            if (a->pat_len <= n - i && !memcmp(s + i, t->added_text.p + a->pat_off, a->pat_len)) {
                *which = set->idx[k];
                return i;
            }
        }
    }
    return SIZE_MAX;
}

/* tokenizers' AddedVocabulary::find_matches: covers s[0..n) with text
 * spans and added-token spans. */
static spx_status split_added(const spx_tokenizer *t, const tok_addset *set, const char *s,
                              size_t n, tok_aspans *out, spx_err *e) {
    out->n = 0;
    size_t start_offset = 0, pos = 0, k;
    while (set->n && pos < n) {
        size_t ms = find_added(t, set, s, n, pos, &k);
        if (ms == SIZE_MAX) break;
        const tok_added *a = &t->added[k];
        size_t me = ms + a->pat_len;
        pos = me; /* matches never overlap, kept or not */
        if (t->split_special && a->special) continue;
        if (a->single_word) {
            bool word_before = ms > 0 && tok_is_word(tok_utf8_prev(s, ms, NULL));
            uint32_t cp = 0;
            bool word_after = me < n && tok_utf8_scan(s + me, n - me, &cp) > 0 && tok_is_word(cp);
            if (word_before || word_after) continue;
        }
        size_t st = ms, sp = me;
        if (a->lstrip) {
            size_t b = ms;
            while (b > 0) {
                size_t prev;
                uint32_t cp = tok_utf8_prev(s, b, &prev);
                if (!tok_is_space(cp)) break;
                b = prev;
            }
            st = b > start_offset ? b : start_offset;
        }
        if (a->rstrip) {
            while (sp < n) {
                uint32_t cp;
                int c = tok_utf8_scan(s + sp, n - sp, &cp);
                if (c <= 0 || !tok_is_space(cp)) break;
                sp += (size_t)c;
            }
        }
        if (st < start_offset) continue; /* inside the previous token's rstrip */
        if (start_offset < st && !aspans_push(out, start_offset, st, -1)) return OOM(t);
        if (!aspans_push(out, st, sp, a->id)) return OOM(t);
        start_offset = sp;
        if (pos < sp) pos = sp;
    }
    if (start_offset < n && !aspans_push(out, start_offset, n, -1)) return OOM(t);
    return SPX_OK;
}

/* ------------------------------------------------------------------ */
/* Post-processor                                                      */
/* ------------------------------------------------------------------ */

static spx_status push_checked(spx_tokenizer *t, tok_ids *dst, int32_t id, const char *where,
                               spx_err *e) {
    if (!has_piece(t, id))
        return spx_fail(e, SPX_ERR_RANGE, "%s: %s: id %d is not a token of the vocabulary",
                        t->label, where, id);
    return tok_ids_push(dst, id) ? SPX_OK : OOM(t);
}

/* Template (pre, post) wraps the current (pre, post): pre' = tpre + pre,
 * post' = post + tpost, as chained processors do. */
static spx_status wrap_ids(spx_tokenizer *t, const tok_ids *tpre, const tok_ids *tpost, spx_err *e) {
    tok_ids np = {0};
    for (size_t i = 0; i < tpre->n; i++)
        if (!tok_ids_push(&np, tpre->v[i])) goto oom;
    for (size_t i = 0; i < t->pre_ids.n; i++)
        if (!tok_ids_push(&np, t->pre_ids.v[i])) goto oom;
    for (size_t i = 0; i < tpost->n; i++)
        if (!tok_ids_push(&t->post_ids, tpost->v[i])) goto oom;
    free(t->pre_ids.v);
    t->pre_ids = np;
    return SPX_OK;
oom:
    free(np.v);
    return OOM(t);
}

static spx_status parse_template(spx_tokenizer *t, const cJSON *j, const char *path,
                                 tok_ids *pre, tok_ids *post, spx_err *e) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
    if (!cJSON_IsArray(single))
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s.single: expected an array of pieces, got %s",
                        t->label, path, tok_json_type(single));
    bool seen_seq = false;
    int i = 0;
    for (const cJSON *it = single->child; it; it = it->next, i++) {
        char where[160];
        snprintf(where, sizeof where, "%s.single[%d]", path, i);
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        if (cJSON_IsObject(seq)) {
            const cJSON *sid = cJSON_GetObjectItemCaseSensitive(seq, "id");
            if (seen_seq || !cJSON_IsString(sid) || strcmp(sid->valuestring, "A"))
                return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s: only one $A sequence is supported",
                                t->label, where);
            seen_seq = true;
            continue;
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
        if (!cJSON_IsObject(sp) || !cJSON_IsString(name))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: %s: expected {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}",
                            t->label, where);
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids");
        if (!cJSON_IsArray(ids))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.special_tokens['%.40s'].ids: expected an array, got %s",
                            t->label, path, name->valuestring, tok_json_type(ids));
        for (const cJSON *x = ids->child; x; x = x->next) {
            int32_t id;
            if (!get_id(x, &id))
                return spx_fail(e, SPX_ERR_RANGE, "%s: %s.special_tokens['%.40s'].ids: bad id (%s)",
                                t->label, path, name->valuestring, tok_json_type(x));
            SPX_TRY(push_checked(t, seen_seq ? post : pre, id, where, e));
        }
    }
    return SPX_OK;
}

/* "cls"/"sep": ["<s>", 0] */
static spx_status pair_token(spx_tokenizer *t, const cJSON *j, const char *key, const char *path,
                             tok_ids *dst, spx_err *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, key);
    int32_t id;
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) != 2 || !get_id(p->child->next, &id))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.%s: expected [\"token\", id]", t->label, path, key);
    char where[160];
    snprintf(where, sizeof where, "%s.%s", path, key);
    return push_checked(t, dst, id, where, e);
}

static spx_status parse_post(spx_tokenizer *t, const cJSON *j, const char *path, int depth,
                             spx_err *e) {
    if (!j || cJSON_IsNull(j)) return SPX_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsObject(j) || !cJSON_IsString(type))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s: expected an object with a \"type\"", t->label,
                        path);
    const char *ty = type->valuestring;
    if (!strcmp(ty, "ByteLevel")) return SPX_OK; /* only touches offsets */
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "processors");
        if (depth >= TOK_MAX_DEPTH || !cJSON_IsArray(list))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.processors: expected an array (nesting <= %d)",
                            t->label, path, TOK_MAX_DEPTH);
        int i = 0;
        for (const cJSON *it = list->child; it; it = it->next, i++) {
            char sub[160];
            snprintf(sub, sizeof sub, "%s.processors[%d]", path, i);
            SPX_TRY(parse_post(t, it, sub, depth + 1, e));
        }
        return SPX_OK;
    }
    tok_ids pre = {0}, post = {0};
    spx_status st;
    if (!strcmp(ty, "TemplateProcessing")) {
        st = parse_template(t, j, path, &pre, &post, e);
    } else if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        st = pair_token(t, j, "cls", path, &pre, e);
        if (!st) st = pair_token(t, j, "sep", path, &post, e);
    } else {
        st = spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s.type '%.40s' is not a supported post-processor",
                      t->label, path, ty);
    }
    if (!st) st = wrap_ids(t, &pre, &post, e);
    free(pre.v);
    free(post.v);
    return st;
}

/* ------------------------------------------------------------------ */
/* Decoder                                                             */
/* ------------------------------------------------------------------ */

static spx_status dup_str(spx_tokenizer *t, const char *s, char **out, size_t *len, spx_err *e) {
    *len = strlen(s);
    *out = malloc(*len + 1);
    if (!*out) return OOM(t);
    memcpy(*out, s, *len + 1);
    return SPX_OK;
}

static spx_status one_char(spx_tokenizer *t, const cJSON *j, const char *key, const char *path,
                           uint32_t *cp, spx_err *e) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, key);
    size_t n = cJSON_IsString(c) ? strlen(c->valuestring) : 0;
    int k = n ? tok_utf8_scan(c->valuestring, n, cp) : 0;
    if (k <= 0 || (size_t)k != n)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.%s: expected a one-character string", t->label,
                        path, key);
    return SPX_OK;
}

static spx_status get_count(spx_tokenizer *t, const cJSON *j, const char *key, const char *path,
                            size_t *out, spx_err *e) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!c) {
        *out = 0;
        return SPX_OK;
    }
    if (!cJSON_IsNumber(c) || !(c->valuedouble >= 0 && c->valuedouble <= 1e6) ||
        c->valuedouble != floor(c->valuedouble))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.%s: expected a small non-negative integer",
                        t->label, path, key);
    *out = (size_t)c->valuedouble;
    return SPX_OK;
}

/* Parses the decoder chain. State: bf = ByteFallback seen, fused = the
 * tokens have been joined into one string (Fuse or ByteLevel). */
static spx_status parse_dec(spx_tokenizer *t, const cJSON *j, const char *path, int depth,
                            bool *bf, bool *fused, spx_err *e) {
    tok_dec *d = &t->dec;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsObject(j) || !cJSON_IsString(type))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: %s: expected an object with a \"type\"", t->label,
                        path);
    const char *ty = type->valuestring;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "decoders");
        if (depth >= TOK_MAX_DEPTH || !cJSON_IsArray(list))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.decoders: expected an array (nesting <= %d)",
                            t->label, path, TOK_MAX_DEPTH);
        int i = 0;
        for (const cJSON *it = list->child; it; it = it->next, i++) {
            char sub[160];
            snprintf(sub, sizeof sub, "%s.decoders[%d]", path, i);
            SPX_TRY(parse_dec(t, it, sub, depth + 1, bf, fused, e));
        }
        return SPX_OK;
    }
    if (!strcmp(ty, "Fuse")) {
        *fused = true;
        return SPX_OK;
    }
    if (!strcmp(ty, "ByteFallback")) {
        if (*fused || *bf)
            return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s: ByteFallback after Fuse/ByteLevel is not supported",
                            t->label, path);
        *bf = d->byte_fallback = true;
        return SPX_OK;
    }
    bool whole_strip = !strcmp(ty, "Strip") && *fused;
    if (whole_strip) {
        size_t stop;
        SPX_TRY(one_char(t, j, "content", path, &d->strip_ch, e));
        SPX_TRY(get_count(t, j, "start", path, &d->strip_start, e));
        SPX_TRY(get_count(t, j, "stop", path, &stop, e));
        if (stop)
            return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s: Strip with stop > 0 after Fuse is not supported",
                            t->label, path);
        return SPX_OK;
    }
    /* the rest are per-token steps: they must come before ByteFallback/Fuse */
    if (*fused || *bf)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: %s: decoder '%.40s' after Fuse/ByteFallback/ByteLevel is not supported",
                        t->label, path, ty);
    if (d->n_step >= TOK_MAX_STEPS)
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s: more than %d decoders", t->label, path,
                        TOK_MAX_STEPS);
    tok_dstep *s = &d->step[d->n_step];
    memset(s, 0, sizeof *s);
    if (!strcmp(ty, "Replace")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *with = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (!cJSON_IsString(str) || !str->valuestring[0])
            return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s.pattern: only a non-empty {\"String\": ...} is supported",
                            t->label, path);
        if (!cJSON_IsString(with))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: %s.content: expected a string", t->label, path);
        s->kind = DEC_REPLACE;
        d->n_step++;
        SPX_TRY(dup_str(t, str->valuestring, &s->pat, &s->pat_len, e));
        return dup_str(t, with->valuestring, &s->with, &s->with_len, e);
    }
    if (!strcmp(ty, "ByteLevel")) {
        s->kind = DEC_BYTELEVEL;
        d->n_step++;
        *fused = true; /* ByteLevel returns one string */
        return SPX_OK;
    }
    if (!strcmp(ty, "Metaspace")) {
        uint32_t cp;
        SPX_TRY(one_char(t, j, "replacement", path, &cp, e));
        bool aps;
        SPX_TRY(tok_json_bool(j, "add_prefix_space", true, t->label, path, &aps, e));
        s->drop_first = aps;
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
        if (cJSON_IsString(ps)) s->drop_first = strcmp(ps->valuestring, "never") != 0;
        s->kind = DEC_METASPACE;
        d->n_step++;
        return dup_str(t, cJSON_GetObjectItemCaseSensitive(j, "replacement")->valuestring, &s->pat,
                       &s->pat_len, e);
    }
    if (!strcmp(ty, "Strip")) {
        SPX_TRY(one_char(t, j, "content", path, &s->ch, e));
        SPX_TRY(get_count(t, j, "start", path, &s->start, e));
        SPX_TRY(get_count(t, j, "stop", path, &s->stop, e));
        s->kind = DEC_STRIP;
        d->n_step++;
        return SPX_OK;
    }
    return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: %s.type '%.40s' is not a supported decoder",
                    t->label, path, ty);
}

static bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int hex_val(char c) {
    return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}

/* Runs the per-token decoder steps on token id (index-th token given to
 * the decoder) and appends its bytes to out. a, b: scratch. */
static bool dec_token(const spx_tokenizer *t, int32_t id, size_t index, tok_buf *a, tok_buf *b,
                      tok_buf *out) {
    const char *s = t->pieces.p + t->piece_off[id];
    size_t n = t->piece_len[id];
    const tok_dec *d = &t->dec;
    if (!d->present) return (index == 0 || tok_buf_put(out, " ", 1)) && tok_buf_put(out, s, n);
    a->n = 0;
    if (!tok_buf_put(a, s, n)) return false;
    for (size_t k = 0; k < d->n_step; k++) {
        const tok_dstep *st = &d->step[k];
        b->n = 0;
        if (!tok_buf_grow(b, a->n)) return false;
        switch (st->kind) {
        case DEC_REPLACE:
            if (!tok_replace_all(a->p, a->n, st->pat, st->pat_len, st->with, st->with_len, b))
                return false;
            break;
        case DEC_BYTELEVEL: {
            bool raw = (t->flags[id] & TOK_F_ADDED) != 0; /* added tokens pass as they are */
            for (size_t i = 0; !raw && i < a->n;) {
                uint32_t cp;
                int c = tok_utf8_scan(a->p + i, a->n - i, &cp);
                if (c <= 0 || cp >= 324 || t->pipe.bl.dec[cp] < 0) {
                    raw = true; /* a character outside the table: the token's own bytes */
                    break;
                }
                char by = (char)t->pipe.bl.dec[cp];
                if (!tok_buf_put(b, &by, 1)) return false;
                i += (size_t)c;
            }
            if (raw) {
                b->n = 0;
                if (!tok_buf_put(b, a->p, a->n)) return false;
            }
            break;
        }
        case DEC_METASPACE:
            for (size_t i = 0; i < a->n;) {
                if (a->n - i >= st->pat_len && !memcmp(a->p + i, st->pat, st->pat_len)) {
                    if (!(index == 0 && st->drop_first) && !tok_buf_put(b, " ", 1)) return false;
                    i += st->pat_len;
                } else {
                    if (!tok_buf_put(b, a->p + i, 1)) return false;
                    i++;
                }
            }
            break;
        case DEC_STRIP: {
            char enc[4];
            size_t el = tok_utf8_put(st->ch, enc), lo = 0, hi = a->n;
            for (size_t i = 0; i < st->start && hi - lo >= el && !memcmp(a->p + lo, enc, el); i++)
                lo += el;
            for (size_t i = 0; i < st->stop && hi - lo >= el && !memcmp(a->p + hi - el, enc, el); i++)
                hi -= el;
            if (!tok_buf_put(b, a->p + lo, hi - lo)) return false;
            break;
        }
        }
        tok_buf x = *a;
        *a = *b;
        *b = x;
    }
    if (d->byte_fallback && a->n == 6 && !memcmp(a->p, "<0x", 3) && a->p[5] == '>' &&
        is_hex(a->p[3]) && is_hex(a->p[4])) {
        char by = (char)(hex_val(a->p[3]) * 16 + hex_val(a->p[4]));
        return tok_buf_put(out, &by, 1);
    }
    return tok_buf_put(out, a->p, a->n);
}

/* ------------------------------------------------------------------ */
/* tokenizer_config.json                                               */
/* ------------------------------------------------------------------ */

static spx_status load_config(spx_tokenizer *t, const cJSON *cfg, spx_err *e) {
    /* bos/eos defaults: the post-processor's first/last special token */
    if (t->pre_ids.n) t->bos = t->pre_ids.v[0];
    if (t->post_ids.n) t->eos = t->post_ids.v[t->post_ids.n - 1];
    if (!cfg) return SPX_OK;
    char where[32] = "tokenizer_config";
    const char *names[2] = {"bos_token", "eos_token"};
    int32_t *dst[2] = {&t->bos, &t->eos};
    for (int i = 0; i < 2; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, names[i]);
        if (!j) continue;
        const char *s = spx_cfg_token_text(j);
        *dst[i] = s ? find_token(t, s) : -1;
        if (s && *dst[i] < 0)
            spx_log(SPX_LOG_WARN, "%s: tokenizer_config.json: %s '%.40s' is not a token", t->label,
                    names[i], s);
    }
    SPX_TRY(tok_json_bool(cfg, "clean_up_tokenization_spaces", false, t->label, where, &t->cleanup, e));
    SPX_TRY(tok_json_bool(cfg, "split_special_tokens", false, t->label, where, &t->split_special, e));

    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer_class");
    static const char *const llama_like[] = {"LlamaTokenizer", "LlamaTokenizerFast",
                                             "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
                                             "GemmaTokenizer", "GemmaTokenizerFast"};
    bool llama = false;
    for (size_t i = 0; cJSON_IsString(cls) && i < sizeof llama_like / sizeof llama_like[0]; i++)
        llama = llama || !strcmp(cls->valuestring, llama_like[i]);
    if (!llama) return SPX_OK;
    bool add_bos, add_eos;
    SPX_TRY(tok_json_bool(cfg, "add_bos_token", true, t->label, where, &add_bos, e));
    SPX_TRY(tok_json_bool(cfg, "add_eos_token", false, t->label, where, &add_eos, e));
    if ((add_bos && t->bos < 0) || (add_eos && t->eos < 0)) {
        spx_log(SPX_LOG_WARN, "%s: tokenizer_config.json asks for a BOS/EOS token it does not name; "
                "keeping tokenizer.json's post-processor", t->label);
        return SPX_OK;
    }
    t->pre_ids.n = t->post_ids.n = 0;
    if (add_bos && !tok_ids_push(&t->pre_ids, t->bos)) return OOM(t);
    if (add_eos && !tok_ids_push(&t->post_ids, t->eos)) return OOM(t);
    return SPX_OK;
}

/* ------------------------------------------------------------------ */
/* Loading                                                             */
/* ------------------------------------------------------------------ */

/* id -> string table: vocabulary entries, then added tokens (which win). */
static spx_status build_pieces(spx_tokenizer *t, spx_err *e) {
    int64_t max_id = t->bpe.max_id;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    t->n_ids = max_id + 1;
    /* real vocabularies are dense; a few ids far apart would only make
     * the id tables huge */
    if (t->n_ids > 4 * (int64_t)(t->bpe.vocab.n + t->n_added) + 65536)
        return spx_fail(e, SPX_ERR_RANGE,
                        "%s: largest token id %lld for only %zu tokens: ids are too sparse",
                        t->label, (long long)max_id, t->bpe.vocab.n + t->n_added);
    size_t n = (size_t)(t->n_ids > 0 ? t->n_ids : 1);
    t->piece_off = malloc(n * sizeof *t->piece_off);
    t->piece_len = calloc(n, sizeof *t->piece_len);
    t->flags = calloc(n, sizeof *t->flags);
    if (!t->piece_off || !t->piece_len || !t->flags) return OOM(t);
    for (size_t i = 0; i < n; i++) t->piece_off[i] = NO_PIECE;
    const tok_strmap *v = &t->bpe.vocab;
    size_t dups = 0;
    for (size_t i = 0; i < v->n; i++) {
        int32_t id = v->val[i];
        if (t->piece_off[id] != NO_PIECE) {
            dups++;
            continue;
        }
        t->piece_off[id] = t->pieces.n;
        t->piece_len[id] = v->len[i];
        if (!tok_buf_put(&t->pieces, v->keys.p + v->off[i], v->len[i]) ||
            !tok_buf_put(&t->pieces, "", 1))
            return OOM(t);
    }
    if (dups)
        spx_log(SPX_LOG_WARN, "%s: model.vocab: %zu tokens share an id with another; the first is kept",
                t->label, dups);
    for (size_t i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        t->piece_off[a->id] = t->pieces.n;
        t->piece_len[a->id] = (uint32_t)a->pat_len;
        t->flags[a->id] |= TOK_F_ADDED | (a->special ? TOK_F_SPECIAL : 0);
        if (!tok_buf_put(&t->pieces, t->added_text.p + a->pat_off, a->pat_len) ||
            !tok_buf_put(&t->pieces, "", 1))
            return OOM(t);
    }
    return SPX_OK;
}

static spx_status load_all(spx_tokenizer *t, const cJSON *root, const cJSON *cfg, spx_err *e) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!model || cJSON_IsNull(model))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: \"model\" is missing (is this a tokenizer.json?)",
                        t->label);
    SPX_TRY(tok_bpe_load(&t->bpe, model, t->label, e));
    SPX_TRY(tok_pipe_load(&t->pipe, cJSON_GetObjectItemCaseSensitive(root, "normalizer"),
                          cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), t->label, e));
    SPX_TRY(load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), e));
    SPX_TRY(build_pieces(t, e));

    tok_work w = {0};
    w.md = pcre2_match_data_create(1, NULL);
    spx_status st = w.md ? SPX_OK : OOM(t);
    if (!st) st = build_addset(t, false, &t->raw_set, &w, e);
    if (!st) st = build_addset(t, true, &t->norm_set, &w, e);
    tok_work_free(&w);
    SPX_TRY(st);

    SPX_TRY(parse_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                       "post_processor", 0, e));
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (dec && !cJSON_IsNull(dec)) {
        bool bf = false, fused = false;
        t->dec.present = true;
        SPX_TRY(parse_dec(t, dec, "decoder", 0, &bf, &fused, e));
    }
    const char *ignored[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, ignored[i]);
        if (j && !cJSON_IsNull(j))
            spx_log(SPX_LOG_INFO, "%s: \"%s\" is ignored", t->label, ignored[i]);
    }
    return load_config(t, cfg, e);
}

spx_status spx_tok_load(const char *tok_json, size_t tok_len, const char *cfg_json,
                        size_t cfg_len, const char *label, spx_tokenizer **out, spx_err *e) {
    if (!out) return spx_fail(e, SPX_ERR_ARG, "spx_tok_load: out is NULL");
    *out = NULL;
    if (!label) label = "tokenizer.json";
    if (!tok_json) return spx_fail(e, SPX_ERR_ARG, "%s: no tokenizer.json contents", label);
    spx_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
    t->bos = t->eos = -1;
    t->label = spx_strdup(label);
    if (!t->label) {
        free(t);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
    }
    cJSON *root = NULL, *cfg = NULL;
    spx_status st = parse_json(tok_json, tok_len, label, "tokenizer.json", &root, e);
    if (!st && cfg_json) st = parse_json(cfg_json, cfg_len, label, "tokenizer_config.json", &cfg, e);
    if (!st) st = load_all(t, root, cfg, e);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (st) {
        spx_tok_free(t);
        return st;
    }
    *out = t;
    return SPX_OK;
}

spx_status spx_tok_load_dir(const char *dir, spx_tokenizer **out, char **cfg_text, spx_err *e) {
    if (cfg_text) *cfg_text = NULL;
    if (!out) return spx_fail(e, SPX_ERR_ARG, "spx_tok_load_dir: out is NULL");
    *out = NULL;
    if (!dir) return spx_fail(e, SPX_ERR_ARG, "spx_tok_load_dir: dir is NULL");
    char *tp = spx_path_join(dir, "tokenizer.json");
    char *cp = spx_path_join(dir, "tokenizer_config.json");
    char *tj = NULL, *cj = NULL;
    size_t tl = 0, cl = 0;
    spx_status st = SPX_OK;
    if (!tp || !cp) {
        st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    if (!spx_file_exists(tp)) {
        st = spx_fail(e, SPX_ERR_IO, "%s: no tokenizer.json in this folder", dir);
        goto done;
    }
    st = spx_read_file(tp, TOK_JSON_MAX, &tj, &tl, e);
    if (!st && spx_file_exists(cp)) st = spx_read_file(cp, TOK_CFG_MAX, &cj, &cl, e);
    if (!st) st = spx_tok_load(tj, tl, cj, cl, tp, out, e);
done:
    free(tj);
    if (!st && cfg_text) *cfg_text = cj;
    else free(cj);
    free(tp);
    free(cp);
    return st;
}

void spx_tok_free(spx_tokenizer *t) {
    if (!t) return;
    tok_bpe_free(&t->bpe);
    tok_pipe_free(&t->pipe);
    tok_buf_free(&t->pieces);
    free(t->piece_off);
    free(t->piece_len);
    free(t->flags);
    free(t->added);
    tok_buf_free(&t->added_text);
    free(t->raw_set.idx);
    free(t->norm_set.idx);
    free(t->pre_ids.v);
    free(t->post_ids.v);
    for (size_t i = 0; i < t->dec.n_step; i++) {
        free(t->dec.step[i].pat);
        free(t->dec.step[i].with);
    }
    free(t->label);
    free(t);
}

/* ------------------------------------------------------------------ */
/* Queries                                                             */
/* ------------------------------------------------------------------ */

int64_t spx_tok_vocab_size(const spx_tokenizer *t) { return t ? t->n_ids : 0; }
int32_t spx_tok_bos(const spx_tokenizer *t) { return t ? t->bos : -1; }
int32_t spx_tok_eos(const spx_tokenizer *t) { return t ? t->eos : -1; }

const char *spx_tok_piece(const spx_tokenizer *t, int32_t id) {
    return t && has_piece(t, id) ? t->pieces.p + t->piece_off[id] : NULL;
}

int spx_tok_is_special(const spx_tokenizer *t, int32_t id) {
    return t && has_piece(t, id) && (t->flags[id] & TOK_F_SPECIAL) ? 1 : 0;
}

/* ------------------------------------------------------------------ */
/* Encode                                                              */
/* ------------------------------------------------------------------ */

static spx_status encode_all(const spx_tokenizer *t, const char *text, size_t len, int add_special,
                             tok_work *w, tok_ids *out, spx_err *e) {
    tok_aspans raw = {0}, nsp = {0};
    tok_buf norm = {0};
    spx_status st = SPX_OK;
    for (size_t i = 0; add_special && i < t->pre_ids.n; i++)
        if (!tok_ids_push(out, t->pre_ids.v[i])) goto oom;
    st = split_added(t, &t->raw_set, text, len, &raw, e);
    for (size_t i = 0; !st && i < raw.n; i++) {
        const tok_aspan *r = &raw.v[i];
        if (r->id >= 0) {
            if (!tok_ids_push(out, r->id)) goto oom;
            continue;
        }
        st = tok_normalize(&t->pipe, text + r->s, r->e - r->s, &norm, w, e);
        if (!st) st = split_added(t, &t->norm_set, norm.p, norm.n, &nsp, e);
        for (size_t j = 0; !st && j < nsp.n; j++) {
            const tok_aspan *q = &nsp.v[j];
            if (q->id >= 0) {
                if (!tok_ids_push(out, q->id)) goto oom;
                continue;
            }
            st = tok_pretokenize(&t->pipe, norm.p + q->s, q->e - q->s, r->s == 0 && q->s == 0, w, e);
            for (size_t k = 0; !st && k < w->cur.n; k++)
                st = tok_bpe_word(&t->bpe, w->arena.p + w->cur.v[k].off, w->cur.v[k].len, &w->bpe,
                                  out, e);
        }
    }
    for (size_t i = 0; !st && add_special && i < t->post_ids.n; i++)
        if (!tok_ids_push(out, t->post_ids.v[i])) goto oom;
    free(raw.v);
    free(nsp.v);
    tok_buf_free(&norm);
    return st;
oom:
    free(raw.v);
    free(nsp.v);
    tok_buf_free(&norm);
    return OOM(t);
}

spx_status spx_tok_encode(const spx_tokenizer *t, const char *text, size_t len, int add_special,
                          int32_t **ids, size_t *n_ids, spx_err *e) {
    if (!ids || !n_ids) return spx_fail(e, SPX_ERR_ARG, "spx_tok_encode: ids/n_ids is NULL");
    *ids = NULL;
    *n_ids = 0;
    if (!t || (!text && len)) return spx_fail(e, SPX_ERR_ARG, "spx_tok_encode: NULL tokenizer or text");
    if (!text) text = "";
    size_t bad = tok_utf8_check(text, len);
    if (bad != len)
        return spx_fail(e, SPX_ERR_ARG, "%s: input text is not valid UTF-8 (byte %zu of %zu, 0x%02X)",
                        t->label, bad, len, (unsigned)(uint8_t)text[bad]);
    tok_work w = {0};
    tok_ids out = {0};
    w.md = pcre2_match_data_create(1, NULL);
    spx_status st = w.md ? encode_all(t, text, len, add_special, &w, &out, e) : OOM(t);
    tok_work_free(&w);
    if (st) {
        free(out.v);
        return st;
    }
    if (!out.v && !(out.v = malloc(sizeof *out.v))) return OOM(t);
    *ids = out.v;
    *n_ids = out.n;
    return SPX_OK;
}

/* ------------------------------------------------------------------ */
/* Decode and streaming decode                                         */
/* ------------------------------------------------------------------ */

struct spx_tok_stream {
    const spx_tokenizer *t;
    bool skip_special;
    bool cleanup;            /* clean_up_tokenization_spaces, streamed */
    size_t n_tok;            /* tokens given to the decoder so far */
    char pend[4];            /* incomplete UTF-8 character at the end */
    size_t pend_n;
    size_t strip_left;       /* leading Strip characters still to remove */
    tok_buf raw, chars, hold, out, a, b;
};

static void stream_init(spx_tok_stream *s, const spx_tokenizer *t, int skip_special, bool cleanup) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->skip_special = skip_special != 0;
    s->cleanup = cleanup;
    s->strip_left = t->dec.present ? t->dec.strip_start : 0;
}

static void stream_release(spx_tok_stream *s) {
    tok_buf_free(&s->raw);
    tok_buf_free(&s->chars);
    tok_buf_free(&s->hold);
    tok_buf_free(&s->out);
    tok_buf_free(&s->a);
    tok_buf_free(&s->b);
}

/* Largest k <= n such that the 4 bytes before k hold no space (or there
 * is no space before k at all). Every clean-up pattern starts with a space
 * and is at most 4 bytes and the rules only delete spaces, so the clean-up
 * of text cut at such a k equals the clean-up of the whole. */
static size_t cleanup_safe_point(const char *h, size_t n) {
    size_t k = n;
    for (;;) {
        const char *sp = k ? memrchr(h, ' ', k) : NULL;
        if (!sp) return k;
        size_t p = (size_t)(sp - h);
        if (k - (p + 1) >= 4) return k;
        k = p;
    }
}

/* raw holds pend + new bytes: convert what is complete, strip, clean up,
 * append the result to out. final: nothing more will come. */
static spx_status stream_emit(spx_tok_stream *s, bool final, spx_err *e) {
    const spx_tokenizer *t = s->t;
    size_t hold = 0;
    s->chars.n = 0;
    if (!tok_utf8_lossy(s->raw.p, s->raw.n, &s->chars, final ? NULL : &hold)) return OOM(t);
    memcpy(s->pend, s->raw.p + s->raw.n - hold, hold);
    s->pend_n = hold;
    size_t skip = 0;
    while (s->strip_left > 0 && skip < s->chars.n) {
        uint32_t cp;
        int k = tok_utf8_scan(s->chars.p + skip, s->chars.n - skip, &cp);
        if (k <= 0 || cp != t->dec.strip_ch) {
            s->strip_left = 0;
            break;
        }
        skip += (size_t)k;
        s->strip_left--;
    }
    if (!s->cleanup)
        return tok_buf_put(&s->out, s->chars.p + skip, s->chars.n - skip) ? SPX_OK : OOM(t);
    if (!tok_buf_put(&s->hold, s->chars.p + skip, s->chars.n - skip)) return OOM(t);
    size_t k = final ? s->hold.n : cleanup_safe_point(s->hold.p, s->hold.n);
    if (k == 0) return SPX_OK;
    if (!tok_cleanup_spaces(s->hold.p, k, &s->out)) return OOM(t);
    memmove(s->hold.p, s->hold.p + k, s->hold.n - k);
    s->hold.n -= k;
    return SPX_OK;
}

static spx_status stream_push(spx_tok_stream *s, int32_t id, spx_err *e) {
    const spx_tokenizer *t = s->t;
    if (!has_piece(t, id))
        return spx_fail(e, SPX_ERR_RANGE, "%s: token id %d is out of range [0, %lld) or unused",
                        t->label, id, (long long)t->n_ids);
    if (s->skip_special && (t->flags[id] & TOK_F_SPECIAL)) return SPX_OK;
    s->raw.n = 0;
    if (!tok_buf_put(&s->raw, s->pend, s->pend_n) || !dec_token(t, id, s->n_tok, &s->a, &s->b, &s->raw))
        return OOM(t);
    s->n_tok++;
    return stream_emit(s, false, e);
}

static spx_status stream_flush(spx_tok_stream *s, spx_err *e) {
    s->raw.n = 0;
    if (!tok_buf_put(&s->raw, s->pend, s->pend_n)) return OOM(s->t);
    return stream_emit(s, true, e);
}

spx_status spx_tok_decode(const spx_tokenizer *t, const int32_t *ids, size_t n,
                          int skip_special, char **out, size_t *out_len, spx_err *e) {
    if (!out) return spx_fail(e, SPX_ERR_ARG, "spx_tok_decode: out is NULL");
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || (!ids && n)) return spx_fail(e, SPX_ERR_ARG, "spx_tok_decode: NULL tokenizer or ids");
    spx_tok_stream s;
    stream_init(&s, t, skip_special, false);
    spx_status st = tok_buf_put(&s.out, "", 0) ? SPX_OK : OOM(t);
    for (size_t i = 0; !st && i < n; i++) st = stream_push(&s, ids[i], e);
    if (!st) st = stream_flush(&s, e);
    tok_buf res = {0};
    if (!st && t->cleanup) {
        if (!tok_cleanup_spaces(s.out.p, s.out.n, &res) || !tok_buf_put(&res, "", 0)) st = OOM(t);
    } else if (!st) {
        res = s.out;
        s.out = (tok_buf){0};
    }
    stream_release(&s);
    if (st) {
        tok_buf_free(&res);
        return st;
    }
    *out = res.p;
    if (out_len) *out_len = res.n;
    return SPX_OK;
}

spx_status spx_tok_stream_new(const spx_tokenizer *t, int skip_special, spx_tok_stream **out,
                              spx_err *e) {
    if (!out) return spx_fail(e, SPX_ERR_ARG, "spx_tok_stream_new: out is NULL");
    *out = NULL;
    if (!t) return spx_fail(e, SPX_ERR_ARG, "spx_tok_stream_new: NULL tokenizer");
    spx_tok_stream *s = malloc(sizeof *s);
    if (!s) return OOM(t);
    stream_init(s, t, skip_special, t->cleanup);
    *out = s;
    return SPX_OK;
}

spx_status spx_tok_stream_push(spx_tok_stream *s, int32_t id, const char **text, size_t *len,
                               spx_err *e) {
    if (!s || !text || !len) return spx_fail(e, SPX_ERR_ARG, "spx_tok_stream_push: NULL argument");
    *text = "";
    *len = 0;
    s->out.n = 0;
    if (!tok_buf_put(&s->out, "", 0)) return OOM(s->t);
    SPX_TRY(stream_push(s, id, e));
    *text = s->out.p;
    *len = s->out.n;
    return SPX_OK;
}

spx_status spx_tok_stream_flush(spx_tok_stream *s, const char **text, size_t *len, spx_err *e) {
    if (!s || !text || !len) return spx_fail(e, SPX_ERR_ARG, "spx_tok_stream_flush: NULL argument");
    *text = "";
    *len = 0;
    s->out.n = 0;
    if (!tok_buf_put(&s->out, "", 0)) return OOM(s->t);
    SPX_TRY(stream_flush(s, e));
    *text = s->out.p;
    *len = s->out.n;
    return SPX_OK;
}

void spx_tok_stream_free(spx_tok_stream *s) {
    if (!s) return;
    stream_release(s);
    free(s);
}
