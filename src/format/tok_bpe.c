/* tok_bpe.c: the BPE model of tokenizer.json ("model": {"type": "BPE"}).
 *
 * Vocabulary: an open-addressing hash table string -> id. Merges: a hash
 * table (left id, right id) -> (rank, merged id), built once at load (the
 * merged string must be in the vocabulary, as tokenizers requires).
 *
 * A word is first split into characters (looked up in the vocabulary, with
 * continuing_subword_prefix / end_of_word_suffix; else byte fallback
 * "<0xXX>" tokens; else unk, fused when fuse_unk), then merged the way
 * tokenizers' Word::merge_all does: a binary heap of candidate merges
 * ordered by (rank, position), stale entries skipped when popped. That is
 * O(n log n) per word, so a whole SentencePiece-style text (which has no
 * pre-tokenizer and is one "word") or a 300-character run stays cheap.
 * ignore_merges: a word that is itself in the vocabulary is one token. */
#include "format/tok_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* String hash table                                                   */
/* ------------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 31);
}

static bool strmap_rehash(tok_strmap *m, size_t nslots) {
    uint32_t *slots = calloc(nslots, sizeof *slots);
    if (!slots) return false;
    size_t mask = nslots - 1;
    for (size_t i = 0; i < m->n; i++) {
        size_t h = (size_t)hash_bytes(m->keys.p + m->off[i], m->len[i]) & mask;
        while (slots[h]) h = (h + 1) & mask;
        slots[h] = (uint32_t)(i + 1);
    }
    free(m->slots);
    m->slots = slots;
    m->mask = mask;
    return true;
}

bool tok_strmap_put(tok_strmap *m, const char *s, size_t n, int32_t val, int32_t *old) {
    *old = -1;
    if (m->n >= UINT32_MAX - 1) return false;
    if (!m->slots || (m->n + 1) * 2 > m->mask + 1) {
        size_t ns = m->slots ? (m->mask + 1) * 2 : 1024;
        if (!strmap_rehash(m, ns)) return false;
    }
    size_t h = (size_t)hash_bytes(s, n) & m->mask;
    while (m->slots[h]) {
        size_t i = m->slots[h] - 1;
        if (m->len[i] == n && !memcmp(m->keys.p + m->off[i], s, n)) {
            *old = m->val[i];
            m->val[i] = val; /* later entries win, like serde's map */
            return true;
        }
        h = (h + 1) & m->mask;
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        uint64_t *off = realloc(m->off, cap * sizeof *off);
        if (!off) return false;
        m->off = off;
        uint32_t *len = realloc(m->len, cap * sizeof *len);
        if (!len) return false;
        m->len = len;
        int32_t *v = realloc(m->val, cap * sizeof *v);
        if (!v) return false;
        m->val = v;
        m->cap = cap;
    }
    m->off[m->n] = m->keys.n;
    m->len[m->n] = (uint32_t)n;
    m->val[m->n] = val;
    if (!tok_buf_put(&m->keys, s, n)) return false;
    m->slots[h] = (uint32_t)(m->n + 1);
    m->n++;
    return true;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    size_t h = (size_t)hash_bytes(s, n) & m->mask;
    while (m->slots[h]) {
        size_t i = m->slots[h] - 1;
        if (m->len[i] == n && !memcmp(m->keys.p + m->off[i], s, n)) return m->val[i];
        h = (h + 1) & m->mask;
    }
    return -1;
}

void tok_strmap_free(tok_strmap *m) {
    tok_buf_free(&m->keys);
    free(m->off);
    free(m->len);
    free(m->val);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------ */
/* Pair table                                                          */
/* ------------------------------------------------------------------ */

#define PAIR_EMPTY UINT64_MAX

static size_t pair_hash(uint64_t k, size_t mask) {
    k *= 0x9E3779B97F4A7C15ull;
    return (size_t)(k ^ (k >> 29)) & mask;
}

static bool pairmap_init(tok_pairmap *m, size_t n) {
    size_t cap = 64;
    while (cap < 2 * n + 16) cap *= 2;
    m->key = malloc(cap * sizeof *m->key);
    m->rank = malloc(cap * sizeof *m->rank);
    m->out = malloc(cap * sizeof *m->out);
    if (!m->key || !m->rank || !m->out) return false;
    for (size_t i = 0; i < cap; i++) m->key[i] = PAIR_EMPTY;
    m->mask = cap - 1;
    return true;
}

/* Inserts or overwrites (a later duplicate merge wins, like tokenizers). */
static void pairmap_set(tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t out) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t h = pair_hash(k, m->mask);
    while (m->key[h] != PAIR_EMPTY && m->key[h] != k) h = (h + 1) & m->mask;
    m->key[h] = k;
    m->rank[h] = rank;
    m->out[h] = out;
}

static inline bool pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, uint32_t *rank,
                               int32_t *out) {
    if (!m->key) return false;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t h = pair_hash(k, m->mask);
    while (m->key[h] != PAIR_EMPTY) {
        if (m->key[h] == k) {
            *rank = m->rank[h];
            *out = m->out[h];
            return true;
        }
        h = (h + 1) & m->mask;
    }
    return false;
}

/* ------------------------------------------------------------------ */
/* Loading                                                             */
/* ------------------------------------------------------------------ */

static spx_status opt_string(const cJSON *model, const char *key, const char *label, char **out,
                             size_t *len, spx_err *e) {
    *out = NULL;
    *len = 0;
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(model, key);
    if (!j || cJSON_IsNull(j)) return SPX_OK;
    if (!cJSON_IsString(j))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: model.%s: expected a string or null, got %s",
                        label, key, tok_json_type(j));
    size_t n = strlen(j->valuestring);
    if (n == 0) return SPX_OK; /* "" behaves like no prefix/suffix */
    *out = malloc(n + 1);
    if (!*out) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
    memcpy(*out, j->valuestring, n + 1);
    *len = n;
    return SPX_OK;
}

static spx_status lookup_merge_part(const tok_bpe *m, const char *s, size_t n, size_t rank,
                                    const char *label, int32_t *id, spx_err *e) {
    *id = tok_strmap_get(&m->vocab, s, n);
    if (*id < 0)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: model.merges[%zu]: token '%.*s' is not in the vocabulary", label,
                        rank, (int)(n > 60 ? 60 : n), s);
    return SPX_OK;
}

static spx_status load_merges(tok_bpe *m, const cJSON *merges, const char *label, spx_err *e) {
    if (!cJSON_IsArray(merges))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: model.merges: expected an array, got %s", label,
                        tok_json_type(merges));
    size_t n = 0;
    for (const cJSON *it = merges->child; it; it = it->next) n++;
    if (n > (size_t)TOK_MAX_ID * 4)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: model.merges: %zu merges, more than the %d allowed",
                        label, n, TOK_MAX_ID * 4);
    if (!pairmap_init(&m->merges, n)) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
    tok_buf cat = {0};
    size_t idx = 0, rank = 0;
    spx_status st = SPX_OK;
    for (const cJSON *it = merges->child; it; it = it->next, idx++) {
        const char *a, *b;
        size_t al, bl;
        if (cJSON_IsString(it)) {
            const char *s = it->valuestring;
            if (!strncmp(s, "#version", 8)) continue; /* merges.txt header, skipped */
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = spx_fail(e, SPX_ERR_FORMAT,
                              "%s: model.merges[%zu]: '%.60s' is not two tokens separated by one space",
                              label, idx, s);
                break;
            }
            a = s;
            al = (size_t)(sp - s);
            b = sp + 1;
            bl = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(it->child) && cJSON_IsString(it->child->next)) {
            a = it->child->valuestring;
            al = strlen(a);
            b = it->child->next->valuestring;
            bl = strlen(b);
        } else {
            st = spx_fail(e, SPX_ERR_FORMAT,
                          "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"], got %s", label,
                          idx, tok_json_type(it));
            break;
        }
        int32_t ia, ib, io;
        if ((st = lookup_merge_part(m, a, al, idx, label, &ia, e)) != SPX_OK) break;
        if ((st = lookup_merge_part(m, b, bl, idx, label, &ib, e)) != SPX_OK) break;
        /* merged = a + b without its continuing_subword_prefix */
        const char *bb = b;
        size_t bbl = bl;
        if (m->prefix && bl >= m->prefix_len && !memcmp(b, m->prefix, m->prefix_len)) {
            bb += m->prefix_len;
            bbl -= m->prefix_len;
        }
        cat.n = 0;
        if (!tok_buf_put(&cat, a, al) || !tok_buf_put(&cat, bb, bbl)) {
            st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
            break;
        }
        io = tok_strmap_get(&m->vocab, cat.p, cat.n);
        if (io < 0) {
            st = spx_fail(e, SPX_ERR_FORMAT,
                          "%s: model.merges[%zu]: merged token '%.60s' is not in the vocabulary",
                          label, idx, cat.p);
            break;
        }
        pairmap_set(&m->merges, ia, ib, (uint32_t)rank, io);
        rank++;
    }
    tok_buf_free(&cat);
    m->n_merges = rank;
    return st;
}

spx_status tok_bpe_load(tok_bpe *m, const cJSON *model, const char *label, spx_err *e) {
    m->unk_id = -1;
    m->max_id = -1;
    for (int i = 0; i < 256; i++) m->byte_id[i] = -1;
    if (!cJSON_IsObject(model))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: model: expected an object, got %s", label,
                        tok_json_type(model));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (type && !cJSON_IsString(type))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: model.type: expected a string, got %s", label,
                        tok_json_type(type));
    if (type && strcmp(type->valuestring, "BPE"))
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: model.type '%.40s' is not supported (only BPE models are)", label,
                        type->valuestring);
    if (!type && !merges)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: model.type is missing and there are no merges: only BPE is supported",
                        label);
    if (!merges)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: model.merges is missing", label);

    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout)) {
        if (!cJSON_IsNumber(dropout) || !(dropout->valuedouble >= 0 && dropout->valuedouble <= 1))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: model.dropout: expected null or a number in [0, 1]",
                            label);
        if (dropout->valuedouble > 0)
            return spx_fail(e, SPX_ERR_UNSUPPORTED,
                            "%s: model.dropout %g: BPE dropout (random merges) is not supported",
                            label, dropout->valuedouble);
    }
    SPX_TRY(tok_json_bool(model, "fuse_unk", false, label, "model", &m->fuse_unk, e));
    SPX_TRY(tok_json_bool(model, "byte_fallback", false, label, "model", &m->byte_fallback, e));
    SPX_TRY(tok_json_bool(model, "ignore_merges", false, label, "model", &m->ignore_merges, e));
    SPX_TRY(opt_string(model, "continuing_subword_prefix", label, &m->prefix, &m->prefix_len, e));
    SPX_TRY(opt_string(model, "end_of_word_suffix", label, &m->suffix, &m->suffix_len, e));

    /* vocabulary */
    if (!cJSON_IsObject(vocab))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: model.vocab: expected an object, got %s", label,
                        tok_json_type(vocab));
    size_t count = 0, slots = 1024;
    for (const cJSON *it = vocab->child; it && count <= TOK_MAX_ID; it = it->next) count++;
    while (slots < 2 * count + 2) slots *= 2;
    if (!strmap_rehash(&m->vocab, slots))
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory reading model.vocab", label);
    count = 0;
    for (const cJSON *it = vocab->child; it; it = it->next) {
        if (++count > TOK_MAX_ID)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: model.vocab: more than %d entries", label,
                            TOK_MAX_ID);
        const char *k = it->string ? it->string : "";
        size_t kl = strlen(k);
        if (!cJSON_IsNumber(it))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: model.vocab['%.60s']: expected an integer id, got %s",
                            label, k, tok_json_type(it));
        double d = it->valuedouble;
        if (!(d >= 0 && d < TOK_MAX_ID) || d != floor(d))
            return spx_fail(e, SPX_ERR_RANGE,
                            "%s: model.vocab['%.60s']: id %g is not an integer in [0, %d)", label, k,
                            d, TOK_MAX_ID);
        if (kl == 0 || kl > TOK_MAX_PIECE)
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: model.vocab: token of id %d has length %zu, expected 1..%d", label,
                            (int)d, kl, TOK_MAX_PIECE);
        if (tok_utf8_check(k, kl) != kl)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: model.vocab: token of id %d is not valid UTF-8",
                            label, (int)d);
        int32_t id = (int32_t)d, old;
        if (!tok_strmap_put(&m->vocab, k, kl, id, &old))
            return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory reading model.vocab", label);
        if (id > m->max_id) m->max_id = id;
    }

    /* unk and byte-fallback tokens */
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (unk && !cJSON_IsNull(unk)) {
        if (!cJSON_IsString(unk))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: model.unk_token: expected a string or null, got %s",
                            label, tok_json_type(unk));
        m->unk_id = tok_strmap_get(&m->vocab, unk->valuestring, strlen(unk->valuestring));
        if (m->unk_id < 0)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: model.unk_token '%.60s' is not in model.vocab",
                            label, unk->valuestring);
    }
    if (m->byte_fallback) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            m->byte_id[b] = tok_strmap_get(&m->vocab, name, 6);
        }
    }
    return load_merges(m, merges, label, e);
}

void tok_bpe_free(tok_bpe *m) {
    tok_strmap_free(&m->vocab);
    free(m->merges.key);
    free(m->merges.rank);
    free(m->merges.out);
    free(m->prefix);
    free(m->suffix);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------ */
/* Merging one word                                                    */
/* ------------------------------------------------------------------ */

static inline bool merge_less(const tok_merge *x, const tok_merge *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static bool heap_push(tok_bpe_ws *ws, tok_merge it) {
    if (ws->heap_n == ws->heap_cap) {
        size_t cap = ws->heap_cap ? ws->heap_cap * 2 : 256;
        tok_merge *h = realloc(ws->heap, cap * sizeof *h);
        if (!h) return false;
        ws->heap = h;
        ws->heap_cap = cap;
    }
    size_t i = ws->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&it, &ws->heap[p])) break;
        ws->heap[i] = ws->heap[p];
        i = p;
    }
    ws->heap[i] = it;
    return true;
}

static tok_merge heap_pop(tok_bpe_ws *ws) {
    tok_merge top = ws->heap[0], last = ws->heap[--ws->heap_n];
    size_t i = 0, n = ws->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && merge_less(&ws->heap[c + 1], &ws->heap[c])) c++;
        if (!merge_less(&ws->heap[c], &last)) break;
        ws->heap[i] = ws->heap[c];
        i = c;
    }
    if (n) ws->heap[i] = last;
    return top;
}

static bool ws_reserve(tok_bpe_ws *ws, size_t n) {
    if (n <= ws->cap) return true;
    size_t cap = ws->cap ? ws->cap : 256;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(ws->id, cap * sizeof *a);
    if (!a) return false;
    ws->id = a;
    a = realloc(ws->prev, cap * sizeof *a);
    if (!a) return false;
    ws->prev = a;
    a = realloc(ws->next, cap * sizeof *a);
    if (!a) return false;
    ws->next = a;
    ws->cap = cap;
    return true;
}

#define SYM_REMOVED (-2)

spx_status tok_bpe_word(const tok_bpe *m, const char *w, size_t n, tok_bpe_ws *ws, tok_ids *out,
                        spx_err *e) {
    if (n == 0) return SPX_OK;
    if (m->ignore_merges) {
        int32_t id = tok_strmap_get(&m->vocab, w, n);
        if (id >= 0) return tok_ids_push(out, id) ? SPX_OK : spx_fail(e, SPX_ERR_NOMEM, "tokenizer: out of memory");
    }
    if (n > INT32_MAX / 2 || !ws_reserve(ws, n))
        return spx_fail(e, SPX_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte word", n);

    /* 1. characters -> initial symbols */
    size_t ns = 0;
    int32_t pending_unk = -1;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tok_utf8_scan(w + i, n - i, &cp);
        if (k <= 0) return spx_fail(e, SPX_ERR_INTERNAL, "tokenizer: invalid UTF-8 reached BPE");
        const char *cs = w + i;
        size_t cl = (size_t)k;
        bool last = i + (size_t)k == n;
        if ((m->prefix && i > 0) || (m->suffix && last)) {
            ws->tmp.n = 0;
            if ((m->prefix && i > 0 && !tok_buf_put(&ws->tmp, m->prefix, m->prefix_len)) ||
                !tok_buf_put(&ws->tmp, cs, cl) ||
                (m->suffix && last && !tok_buf_put(&ws->tmp, m->suffix, m->suffix_len)))
                return spx_fail(e, SPX_ERR_NOMEM, "tokenizer: out of memory");
            cs = ws->tmp.p;
            cl = ws->tmp.n;
        }
        i += (size_t)k;
        if (!ws_reserve(ws, ns + cl + 1))
            return spx_fail(e, SPX_ERR_NOMEM, "tokenizer: out of memory");
        int32_t id = tok_strmap_get(&m->vocab, cs, cl);
        if (id >= 0) {
            if (pending_unk >= 0) ws->id[ns++] = pending_unk, pending_unk = -1;
            ws->id[ns++] = id;
            continue;
        }
        if (m->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < cl; j++) all = all && m->byte_id[(uint8_t)cs[j]] >= 0;
            if (all) {
                if (pending_unk >= 0) ws->id[ns++] = pending_unk, pending_unk = -1;
                for (size_t j = 0; j < cl; j++) ws->id[ns++] = m->byte_id[(uint8_t)cs[j]];
                continue;
            }
        }
        if (m->unk_id >= 0) {
            if (pending_unk >= 0 && !m->fuse_unk) ws->id[ns++] = pending_unk;
            pending_unk = m->unk_id;
        }
        /* no unk token: the character is dropped, as tokenizers does */
    }
    if (pending_unk >= 0) ws->id[ns++] = pending_unk;
    if (ns == 0) return SPX_OK;

    /* 2. merge by rank */
    for (size_t i = 0; i < ns; i++) {
        ws->prev[i] = (int32_t)i - 1;
        ws->next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    ws->heap_n = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        tok_merge mg = {0, (uint32_t)i, 0};
        if (pairmap_get(&m->merges, ws->id[i], ws->id[i + 1], &mg.rank, &mg.out) &&
            !heap_push(ws, mg))
            return spx_fail(e, SPX_ERR_NOMEM, "tokenizer: out of memory");
    }
    while (ws->heap_n) {
        tok_merge top = heap_pop(ws);
        int32_t p = (int32_t)top.pos;
        if (ws->prev[p] == SYM_REMOVED) continue;
        int32_t q = ws->next[p];
        if (q < 0) continue;
        uint32_t rank;
        int32_t o;
        if (!pairmap_get(&m->merges, ws->id[p], ws->id[q], &rank, &o) || o != top.out) continue;
        ws->id[p] = o;
        ws->next[p] = ws->next[q];
        if (ws->next[q] >= 0) ws->prev[ws->next[q]] = p;
        ws->prev[q] = SYM_REMOVED;
        tok_merge mg;
        if (ws->prev[p] >= 0) {
            int32_t l = ws->prev[p];
            if (pairmap_get(&m->merges, ws->id[l], ws->id[p], &mg.rank, &mg.out)) {
                mg.pos = (uint32_t)l;
                if (!heap_push(ws, mg)) return spx_fail(e, SPX_ERR_NOMEM, "tokenizer: out of memory");
            }
        }
        if (ws->next[p] >= 0) {
            if (pairmap_get(&m->merges, ws->id[p], ws->id[ws->next[p]], &mg.rank, &mg.out)) {
                mg.pos = (uint32_t)p;
                if (!heap_push(ws, mg)) return spx_fail(e, SPX_ERR_NOMEM, "tokenizer: out of memory");
            }
        }
    }
    for (int32_t i = 0; i >= 0; i = ws->next[i])
        if (!tok_ids_push(out, ws->id[i])) return spx_fail(e, SPX_ERR_NOMEM, "tokenizer: out of memory");
    return SPX_OK;
}

void tok_bpe_ws_free(tok_bpe_ws *ws) {
    free(ws->id);
    free(ws->prev);
    free(ws->next);
    free(ws->heap);
    tok_buf_free(&ws->tmp);
    memset(ws, 0, sizeof *ws);
}
