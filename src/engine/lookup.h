/* lookup.h: the prompt-lookup proposer. It keeps a token history (the
 * prompt plus every token decoded since) and drafts the tokens that
 * followed the latest earlier occurrence of the history's last n tokens,
 * for the longest n in [ngram_min, ngram_max] whose occurrence passes the
 * thresholds (below). No model is involved.
 *
 * Index: one open-addressing hash table of 64-bit keys, two kinds of entry:
 *   n-gram g (n tokens)        -> count(g): occurrences of g that have a
 *                                 next token; last(g): the end index of the
 *                                 latest of them
 *   pair (g, t)                -> count(g, t): those followed by t
 * Pushing token t at index i adds, for every n in range with i >= n, the
 * n-gram hist[i-n .. i-1] with its continuation t: O(ngram_max) per token
 * (amortised: the table doubles at half load). The history's own suffix
 * has no continuation yet, so a look-up of it finds earlier occurrences
 * only. Keys are hashes; an n-gram found is checked against the history
 * (a collision drafts nothing), a pair count can be off by a collision,
 * which changes what is drafted, never what is decoded.
 *
 * Thresholds (llama.cpp's ngram-cache idea on counts): an n-gram g whose
 * latest continuation is t drafts only if count(g) >= min_count[n-1] and
 * 100 count(g, t) >= min_percent[n-1] count(g); otherwise the next shorter
 * n is tried. The draft is hist[last(g) + 1 ..], up to max tokens and the
 * end of the history. */
#ifndef SPX_ENGINE_LOOKUP_H
#define SPX_ENGINE_LOOKUP_H

#include "spectra.h"
#include <stdint.h>

typedef struct spx_lookup spx_lookup;

/* p: the n-gram range and thresholds (spx_spec_params' fields, checked by
 * the caller). NULL on out of memory. */
spx_lookup *spx_lookup_new(const spx_spec_params *p);
void spx_lookup_free(spx_lookup *lk);
/* Appends a token; SPX_ERR_NOMEM leaves the history as it was. */
spx_status spx_lookup_push(spx_lookup *lk, int32_t tok);
/* Drafts up to max tokens into draft[]; returns how many (0: none). */
int32_t spx_lookup_draft(const spx_lookup *lk, int32_t *draft, int32_t max);
const int32_t *spx_lookup_history(const spx_lookup *lk, int64_t *n);
/* Forgets the history (the table is kept, emptied). */
void spx_lookup_clear(spx_lookup *lk);

#endif
