/* tok_internal.h: internals shared by the tokenizer's source files.
 *
 *   tok_util.c   buffers, UTF-8, character classes, the byte-level alphabet,
 *                PCRE2 helpers, transformers' clean_up_tokenization
 *   tok_bpe.c    the BPE model: vocabulary hash table, merge-rank table,
 *                the per-word merge loop (a heap ordered by merge rank)
 *   tok_pipe.c   normalizers and pre-tokenizers (JSON parsing and running)
 *   tokenizer.c  loading, added tokens, post-processor, encode, decode,
 *                the streaming decoder and the public API
 *
 * Not a public header: nothing here is stable. */
#ifndef SPX_TOK_INTERNAL_H
#define SPX_TOK_INTERNAL_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <cjson/cJSON.h>
#include <pcre2.h>

#include "format/tokenizer.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOK_MAX_ID (1 << 22)      /* every token id must be below this */
#define TOK_MAX_PIECE 65536       /* longest vocabulary/added-token string, bytes */
#define TOK_MAX_STEPS 32          /* normalizer / pre-tokenizer / decoder steps */
#define TOK_MAX_DEPTH 8           /* nesting of "Sequence" objects */

/* ------------------------------------------------------------------ */
/* Growable buffers                                                    */
/* ------------------------------------------------------------------ */

/* Byte buffer; always NUL-terminated after a successful put. */
typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;

bool tok_buf_grow(tok_buf *b, size_t extra); /* room for extra bytes + NUL */
bool tok_buf_put(tok_buf *b, const void *s, size_t n);
void tok_buf_free(tok_buf *b);

typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;

bool tok_ids_push(tok_ids *a, int32_t id);

/* Appends s with every non-overlapping occurrence of pat (left to right)
 * replaced by with. */
bool tok_replace_all(const char *s, size_t n, const char *pat, size_t pl, const char *with,
                     size_t wl, tok_buf *out);

/* ------------------------------------------------------------------ */
/* UTF-8 and character classes                                         */
/* ------------------------------------------------------------------ */

/* Examines the character at s[0] (n >= 1). Returns its length (1..4) and
 * its code point if valid; 0 if s[0..n) is a valid but truncated prefix;
 * -k if the first k bytes are a maximal invalid subpart (Unicode's
 * "substitution of maximal subparts", as TextDecoder and Rust's
 * from_utf8_lossy replace them with one U+FFFD each). */
int tok_utf8_scan(const char *s, size_t n, uint32_t *cp);
/* Offset of the first byte that is not part of a valid character, or n. */
size_t tok_utf8_check(const char *s, size_t n);
/* Encodes cp (<= 0x10FFFF) into out, returns 1..4. */
size_t tok_utf8_put(uint32_t cp, char out[4]);
/* Decodes the character ending right before s[end] (s valid UTF-8). */
uint32_t tok_utf8_prev(const char *s, size_t end, size_t *start);
/* Lossy conversion appended to out. When hold is not NULL a trailing
 * incomplete sequence is left unconverted and its length stored there. */
bool tok_utf8_lossy(const char *s, size_t n, tok_buf *out, size_t *hold);

bool tok_is_space(uint32_t cp);   /* Unicode White_Space (regex \s)   */
bool tok_is_word(uint32_t cp);    /* regex \w                         */
bool tok_is_numeric(uint32_t cp); /* general category N* (is_numeric) */

/* GPT-2's byte <-> printable character table (bytes_to_unicode). */
typedef struct tok_bytelevel {
    char enc[256][2];     /* UTF-8 of the character standing for byte b */
    uint8_t enc_len[256];
    int16_t dec[324];     /* code point -> byte, -1 if not in the table */
} tok_bytelevel;

void tok_bytelevel_init(tok_bytelevel *bl);

/* transformers' clean_up_tokenization: the ten str.replace passes
 * (" ." -> "." ... " 're" -> "'re"), applied in order to s, into out. */
bool tok_cleanup_spaces(const char *s, size_t n, tok_buf *out);

/* ------------------------------------------------------------------ */
/* Regexes (PCRE2, UTF + UCP, JIT when available)                      */
/* ------------------------------------------------------------------ */

typedef struct tok_span {
    size_t s, e;
    bool match;
} tok_span;

typedef struct tok_spans {
    tok_span *v;
    size_t n, cap;
} tok_spans;

bool tok_spans_push(tok_spans *a, size_t s, size_t e, bool match);

/* Compiles pat (literal: match the string as is). field names the JSON
 * place in messages. */
spx_status tok_regex_compile(const char *pat, size_t len, bool literal, const char *label,
                             const char *field, pcre2_code **out, spx_err *e);
/* Covers s[0..n) with spans: the matches of re and the gaps between them,
 * in order (like tokenizers' Pattern::find_matches). s must be valid UTF-8. */
spx_status tok_regex_spans(const pcre2_code *re, const char *s, size_t n,
                           pcre2_match_data *md, tok_spans *out, spx_err *e);

/* ------------------------------------------------------------------ */
/* BPE model                                                           */
/* ------------------------------------------------------------------ */

/* String -> int32 hash table; owns copies of its keys. */
typedef struct tok_strmap {
    tok_buf keys;
    uint64_t *off;
    uint32_t *len;
    int32_t *val;
    size_t n, cap;
    uint32_t *slots; /* entry index + 1; 0 = empty */
    size_t mask;
} tok_strmap;

/* Inserts s -> val. If s is present, keeps the old value and stores it in
 * *old (else *old = -1). Returns false when out of memory. */
bool tok_strmap_put(tok_strmap *m, const char *s, size_t n, int32_t val, int32_t *old);
int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t n); /* -1: absent */
void tok_strmap_free(tok_strmap *m);

/* (left id, right id) -> (rank, merged id). */
typedef struct tok_pairmap {
    uint64_t *key;
    uint32_t *rank;
    int32_t *out;
    size_t mask;
} tok_pairmap;

typedef struct tok_bpe {
    tok_strmap vocab;
    tok_pairmap merges;
    int32_t unk_id;          /* -1: no unk token */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *prefix;            /* continuing_subword_prefix (NULL: none) */
    size_t prefix_len;
    char *suffix;            /* end_of_word_suffix (NULL: none) */
    size_t suffix_len;
    int32_t byte_id[256];    /* id of "<0xXX>", -1 if absent */
    int64_t max_id;          /* largest id in the vocabulary, -1 if empty */
    size_t n_merges;
} tok_bpe;

/* Scratch space of the merge loop (one per encode call). */
typedef struct tok_merge {
    uint32_t rank;
    uint32_t pos;
    int32_t out;
} tok_merge;

typedef struct tok_bpe_ws {
    int32_t *id;
    int32_t *prev, *next;
    size_t cap;
    tok_merge *heap;
    size_t heap_n, heap_cap;
    tok_buf tmp;
} tok_bpe_ws;

/* Parses the "model" object (type BPE). */
spx_status tok_bpe_load(tok_bpe *m, const cJSON *model, const char *label, spx_err *e);
void tok_bpe_free(tok_bpe *m);
/* Appends the ids of one pre-tokenized word w[0..n) to out. */
spx_status tok_bpe_word(const tok_bpe *m, const char *w, size_t n, tok_bpe_ws *ws, tok_ids *out,
                        spx_err *e);
void tok_bpe_ws_free(tok_bpe_ws *ws);

/* ------------------------------------------------------------------ */
/* Normalizers and pre-tokenizers                                      */
/* ------------------------------------------------------------------ */

typedef enum {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_PREPEND,
    TOK_NORM_REPLACE,
    TOK_NORM_STRIP
} tok_norm_kind;

typedef struct tok_norm {
    tok_norm_kind kind;
    char *a;           /* Prepend: text; Replace: literal pattern (re NULL) */
    size_t a_len;
    char *b;           /* Replace: content */
    size_t b_len;
    pcre2_code *re;    /* Replace: regex pattern */
    bool left, right;  /* Strip */
} tok_norm;

typedef enum { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE, TOK_PRE_DIGITS } tok_pre_kind;

typedef enum {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS
} tok_split_behavior;

typedef enum { TOK_PREPEND_NEVER, TOK_PREPEND_FIRST, TOK_PREPEND_ALWAYS } tok_prepend;

typedef struct tok_pre {
    tok_pre_kind kind;
    pcre2_code *re;               /* Split pattern; ByteLevel's regex if use_regex */
    tok_split_behavior behavior;  /* Split */
    bool invert;                  /* Split */
    bool add_prefix_space;        /* ByteLevel */
    char repl[4];                 /* Metaspace replacement character */
    size_t repl_len;
    tok_prepend prepend;          /* Metaspace */
    bool split;                   /* Metaspace */
    bool individual_digits;       /* Digits */
} tok_pre;

typedef struct tok_pipe {
    tok_norm norm[TOK_MAX_STEPS];
    size_t n_norm;
    tok_pre pre[TOK_MAX_STEPS];
    size_t n_pre;
    tok_bytelevel bl;
} tok_pipe;

/* A pre-tokenized piece: bytes [off, off+len) of tok_work.arena. first:
 * the piece starts at offset 0 of the original text (Metaspace "first"). */
typedef struct tok_piece {
    size_t off, len;
    bool first;
} tok_piece;

typedef struct tok_pieces {
    tok_piece *v;
    size_t n, cap;
} tok_pieces;

/* Scratch state of one encode call: nothing in it outlives the call, so a
 * const tokenizer can encode from many threads at once. */
typedef struct tok_work {
    pcre2_match_data *md;
    tok_buf arena;         /* contents of the pieces */
    tok_pieces cur, nxt;
    tok_spans spans;
    tok_buf t1, t2;        /* normalizer scratch */
    tok_bpe_ws bpe;
} tok_work;

void tok_work_free(tok_work *w);

spx_status tok_pipe_load(tok_pipe *p, const cJSON *normalizer, const cJSON *pre_tokenizer,
                         const char *label, spx_err *e);
void tok_pipe_free(tok_pipe *p);
/* Runs the normalizers on s[0..n); the result replaces out's contents. */
spx_status tok_normalize(const tok_pipe *p, const char *s, size_t n, tok_buf *out, tok_work *w,
                         spx_err *e);
/* Runs the pre-tokenizers on s[0..n) (normalized text, no added tokens);
 * the pieces land in w->cur. */
spx_status tok_pretokenize(const tok_pipe *p, const char *s, size_t n, bool first, tok_work *w,
                           spx_err *e);

/* JSON helpers shared by the loaders. */
const char *tok_json_type(const cJSON *j); /* "string", "number", ... */
/* Reads an optional boolean member: absent or null -> def; else must be a bool. */
spx_status tok_json_bool(const cJSON *obj, const char *key, bool def, const char *label,
                         const char *where, bool *out, spx_err *e);

#endif
