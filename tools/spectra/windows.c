/* windows.c: evaluation windows (see windows.h). */
#include "windows.h"
#include "cli.h"
#include "common.h"
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int eval_windows_init(eval_windows *w, spx_model *m, const char *path, int64_t ctx, int64_t chunks, int64_t skip,
                      int llama_compat, int64_t score_last) {
    memset(w, 0, sizeof *w);
    if (!m->tok) { cli_error("%s: the model has no tokenizer", m->path); return 0; }
    int32_t bos = spx_model_bos_id(m);
    if (bos < 0) { cli_error("%s: the model has no BOS token, which the protocol needs", m->path); return 0; }
    size_t len = 0;
    char *text = cli_read_text(path, &len);
    if (!text) return 0;
    spx_err e;
    spx_err_clear(&e);
    int32_t *ids = NULL;
    size_t n = 0;
    /* compat: the tokenizer's own BOS rule, as llama-perplexity's tokenize(add_bos) */
    spx_status st = spx_tok_encode(m->tok, text, len, llama_compat, &ids, &n, &e);
    free(text);
    if (st != SPX_OK) { cli_fail(&e); return 0; }
    int32_t *all = malloc((n + 1) * sizeof *all);
    if (!all) { free(ids); cli_error("out of memory"); return 0; }
    size_t k = 0;
    if (!llama_compat) all[k++] = bos;
    memcpy(all + k, ids, n * sizeof *ids);
    free(ids);
    w->tokens = all;
    w->n_tokens = n + k;
    w->ctx = ctx;
    w->bos = bos;
    w->llama_compat = llama_compat;
    w->score_last = score_last;
    int64_t fit = llama_compat ? (int64_t)(w->n_tokens / (size_t)ctx) : (int64_t)((w->n_tokens - 1) / (size_t)ctx);
    if (chunks <= 0) chunks = fit - skip;
    if (skip < 0 || chunks <= 0 || chunks > fit - skip) {
        cli_error("%s: %zu tokens make only %lld windows of %lld (asked for %lld after skipping %lld)", path, w->n_tokens,
                  (long long)fit, (long long)ctx, (long long)chunks, (long long)skip);
        eval_windows_free(w);
        return 0;
    }
    w->chunks = chunks;
    w->skip = skip;
    return 1;
}

void eval_windows_free(eval_windows *w) {
    free(w->tokens);
    memset(w, 0, sizeof *w);
}

void eval_windows_get(const eval_windows *w, int64_t k, int32_t *in, int64_t *first, int64_t *count,
                      int32_t *targets) {
    int64_t N = w->ctx;
    const int32_t *base = w->tokens + (k + w->skip) * N;
    memcpy(in, base, (size_t)N * sizeof *in);
    if (w->llama_compat) {
        in[0] = w->bos;
        *first = N / 2;
        *count = N - 1 - N / 2;
    } else if (w->score_last) {
        *first = N - w->score_last; /* the last score_last targets: tokens kN+N-L+1 .. kN+N */
        *count = w->score_last;
    } else {
        *first = 0;
        *count = N;
    }
    for (int64_t i = 0; i < *count; i++) targets[i] = base[*first + i + 1];
}

double eval_logprob(const float *logits, int64_t vocab, int32_t target, double *logp) {
    double mx = -INFINITY;
    for (int64_t i = 0; i < vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    if (logp)
        for (int64_t i = 0; i < vocab; i++) logp[i] = (double)logits[i] - lse;
    return (double)logits[target] - lse;
}

int32_t eval_argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

double eval_kl_row(const double *pr, int32_t top_ref, const float *b, int64_t V, int32_t target, double *pm,
                   double *nll, int64_t *same) {
    *nll -= eval_logprob(b, V, target, pm);
    double kl = 0;
    for (int64_t v = 0; v < V; v++) kl += exp(pr[v]) * (pr[v] - pm[v]);
    *same += top_ref == eval_argmax(b, V);
    return kl > 0 ? kl : 0;
}

int64_t eval_windows_lo(const eval_windows *w) { return w->score_last ? w->ctx - w->score_last : 0; }

spx_status eval_window(spx_session *s, const spx_model *m, const int32_t *in, int64_t ctx, int64_t lo,
                       float *logits) {
    spx_refine_info r;
    spx_model_refine_info(m, &r);
    spx_session_reset(s);
    if (lo > 0) {
        spx_status st = spx_session_eval(s, in, (size_t)lo, NULL, 0);
        if (st != SPX_OK) return st;
    } else if (!r.active) return spx_session_eval(s, in, (size_t)ctx, logits, 1);
    const int64_t V = spx_model_vocab_size(m);
    for (int64_t t = lo; t < ctx; t++) {
        spx_status st = spx_session_eval(s, in + t, 1, logits + (t - lo) * V, 0);
        if (st != SPX_OK) return st;
    }
    return SPX_OK;
}
