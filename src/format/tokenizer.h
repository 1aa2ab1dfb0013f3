/* tokenizer.h: Hugging Face tokenizer.json tokenizers.
 *
 * Supports the BPE model in its two common families:
 *  - byte-level BPE with a regex pre-tokenizer (GPT-2/Llama 3/Qwen: the
 *    ByteLevel pre-tokenizer and decoder, `Split` with a Unicode regex run
 *    by PCRE2, `ignore_merges`);
 *  - SentencePiece-style BPE (Llama 2/Mistral/stories260K/docllama: the
 *    Prepend("▁")+Replace(" ","▁") normalizer or Metaspace pre-tokenizer,
 *    byte_fallback <0xXX> tokens, the Replace/ByteFallback/Fuse/Strip
 *    decoder).
 * Added tokens (special or not) are matched in raw text before
 * normalization, honouring lstrip/rstrip/single_word/normalized; NFC and
 * other normalizers run through utf8proc; the post-processor
 * (TemplateProcessing / ByteLevel / none) and tokenizer_config.json's
 * add_bos_token/add_eos_token decide BOS/EOS exactly as transformers'
 * encode() does. Anything else is rejected with a message naming the
 * field. */
#ifndef SPX_TOKENIZER_H
#define SPX_TOKENIZER_H

#include "core/err.h"
#include <stddef.h>
#include <stdint.h>

typedef struct spx_tokenizer spx_tokenizer;

/* tok_json: contents of tokenizer.json; cfg_json: tokenizer_config.json
 * contents or NULL. label names the source in messages. */
spx_status spx_tok_load(const char *tok_json, size_t tok_len, const char *cfg_json,
                        size_t cfg_len, const char *label, spx_tokenizer **out,
                        spx_err *e);
/* Loads dir/tokenizer.json (+ dir/tokenizer_config.json if present).
 * cfg_text (may be NULL): gets the tokenizer_config.json text read (the
 * caller frees it; NULL when the folder has none), so that other readers
 * of the config (the chat template) need not read it again. */
spx_status spx_tok_load_dir(const char *dir, spx_tokenizer **out, char **cfg_text, spx_err *e);
void spx_tok_free(spx_tokenizer *t);

int64_t spx_tok_vocab_size(const spx_tokenizer *t); /* largest id + 1 */
int32_t spx_tok_bos(const spx_tokenizer *t);        /* -1 if none */
int32_t spx_tok_eos(const spx_tokenizer *t);        /* -1 if none */
/* The token string as stored in the vocabulary (NULL if out of range). */
const char *spx_tok_piece(const spx_tokenizer *t, int32_t id);
int spx_tok_is_special(const spx_tokenizer *t, int32_t id);

/* Encodes text (UTF-8; invalid UTF-8 is an error). add_special: apply the
 * tokenizer's post-processor / BOS-EOS rules, like encode()'s default.
 * *ids is malloc'd; caller frees. */
spx_status spx_tok_encode(const spx_tokenizer *t, const char *text, size_t len,
                          int add_special, int32_t **ids, size_t *n_ids, spx_err *e);
/* Decodes like transformers decode(ids, skip_special_tokens=skip_special).
 * *out is malloc'd and NUL-terminated. */
spx_status spx_tok_decode(const spx_tokenizer *t, const int32_t *ids, size_t n,
                          int skip_special, char **out, size_t *out_len, spx_err *e);

/* Streaming decoder for generation: feed ids one by one, get back the new
 * text that is complete (never a partial UTF-8 character; the `▁`/Strip
 * rules applied as in a whole decode of the ids fed so far). */
typedef struct spx_tok_stream spx_tok_stream;
spx_status spx_tok_stream_new(const spx_tokenizer *t, int skip_special,
                              spx_tok_stream **out, spx_err *e);
/* *text points into the stream's buffer, valid until the next call. */
spx_status spx_tok_stream_push(spx_tok_stream *s, int32_t id, const char **text,
                               size_t *len, spx_err *e);
/* Whatever is still held back (e.g. an incomplete character at the end). */
spx_status spx_tok_stream_flush(spx_tok_stream *s, const char **text, size_t *len,
                                spx_err *e);
void spx_tok_stream_free(spx_tok_stream *s);

#endif
