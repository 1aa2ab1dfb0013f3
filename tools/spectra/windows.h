/* windows.h: the evaluation windows shared by `perplexity` and `kl`.
 *
 * Default protocol (docllama-58m/README.md): tokenize the whole file with
 * no BOS/EOS from the tokenizer (special-token strings in the text still
 * become their ids), prepend BOS once, keep the first C*N+1 tokens; window
 * k feeds tokens kN .. kN+N-1 with no earlier context and scores the
 * predictions of tokens kN+1 .. kN+N (all N positions).
 *
 * --llama-compat (llama-perplexity): the stream is tokenized with the
 * tokenizer's own BOS rule (llama.cpp's add_bos); window k feeds tokens kN .. kN+N-1 with its first token replaced by BOS,
 * and scores only the second half: positions N/2 .. N-2 predicting tokens
 * kN+N/2+1 .. kN+N-1 (N/2 - 1 predictions per window).
 *
 * --score-last L (default protocol only; 1 <= L < N): the long-context
 * protocol of StrataFlux's evaluation. Window k's input is the same
 * (tokens kN .. kN+N-1); positions 0 .. N-L-1 are fed as one prompt
 * (their logits unused), then positions N-L .. N-1 one token per step with
 * the cache, and only those L steps' predictions are scored: position
 * N-L+i predicts token kN+N-L+i+1, i = 0 .. L-1, i.e. the last L of the
 * window's targets kN+1 .. kN+N (L predictions per window). Every scored
 * prediction is thus a decode step after a prompt, as in generation,
 * with refinement or without (the prompt part is a prompt either way).
 * Decision: the prompt's own last logits (position N-L-1, predicting
 * token kN+N-L) are not scored, so that the scored targets are exactly
 * the last L targets, the ones the whole-window protocol scores last.
 *
 * skip S (--skip): the windows used are S .. S+C-1 of the same stream
 * (window k above is then k + S), so two runs can use disjoint windows of
 * one text: `spectra tune --skip 8 --chunks 4` tunes on windows 8-11
 * while `spectra kl --chunks 8` evaluates on 0-7. */
#ifndef SPX_CLI_WINDOWS_H
#define SPX_CLI_WINDOWS_H

#include "spectra.h"
#include <stddef.h>
#include <stdint.h>

typedef struct eval_windows {
    int32_t *tokens;   /* the stream */
    size_t n_tokens;
    int64_t ctx, chunks, skip;
    int llama_compat;
    int64_t score_last; /* --score-last L; 0: the protocol's positions from one prompt */
    int32_t bos;
} eval_windows;

/* Tokenizes `path` with model m's tokenizer and prepares `chunks` windows
 * (chunks <= 0: as many as fit). score_last: 0, or 1 .. ctx-1 without
 * llama_compat (cli_eval_check has refused the rest). Prints an error and
 * returns 0 on failure. */
int eval_windows_init(eval_windows *w, spx_model *m, const char *path, int64_t ctx, int64_t chunks, int64_t skip,
                      int llama_compat, int64_t score_last);
void eval_windows_free(eval_windows *w);
/* Input ids of window k (0 .. chunks-1, after the skipped ones) into in[ctx]; first scored position and count;
 * targets[i] is the token predicted at position first+i. */
void eval_windows_get(const eval_windows *w, int64_t k, int32_t *in, int64_t *first, int64_t *count,
                      int32_t *targets);
/* The first position whose logits eval_window gives for these windows:
 * 0, or ctx - score_last (the rows hold positions lo .. ctx-1, and
 * eval_windows_get's first >= lo). */
int64_t eval_windows_lo(const eval_windows *w);
/* Feeds window in[ctx] to a reset session, the logits of positions
 * lo .. ctx-1 into logits[ctx - lo, V] (row r: position lo + r).
 * lo 0: as one prompt, or, when the model has weight refinement (which
 * decode steps apply and prompts do not), one token per step, so the
 * scores are those of generation. lo > 0 (--score-last): positions
 * 0 .. lo-1 as one prompt without logits, then lo .. ctx-1 one token per
 * step, refinement or not. The library's status. */
spx_status eval_window(spx_session *s, const spx_model *m, const int32_t *in, int64_t ctx, int64_t lo,
                       float *logits);
/* log-softmax helper: returns log p(target) for a logits row. Also writes
 * the row's log-probabilities to logp (if non-NULL), in double. */
double eval_logprob(const float *logits, int64_t vocab, int32_t target, double *logp);
int32_t eval_argmax(const float *x, int64_t n); /* first index of the largest */
/* One scored position against a reference (kl and tune): pr[V] the
 * reference's log-probabilities (eval_logprob), top_ref its argmax, b[V]
 * the model's logits. Returns KL(ref || model) = sum exp(pr) (pr - pm),
 * clamped at 0 (rounding gives -1e-12); adds -log p_model(target) to *nll
 * and 1 to *same when the two argmaxes agree. pm[V]: scratch. */
double eval_kl_row(const double *pr, int32_t top_ref, const float *b, int64_t V, int32_t target, double *pm,
                   double *nll, int64_t *same);

#endif
