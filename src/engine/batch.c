/* batch.c: batched decode (spx_batch_step): one forward pass over several
 * sessions of one model, each fed one token at its own position.
 *
 * Why: at batch 1 a decode step is bound by the bytes of weights it reads;
 * B sessions in one pass read them once for all (the kernels' products of
 * 2..16 tokens cost far less than B one-token products: bench/results/),
 * while attention, the KV rows and the recurrent state stay per session.
 * The backend's batch_forward runs the pass (the CPU's spx_forward_batch);
 * without one, or while weight refinement is attached (it applies to
 * one-token steps only), the sessions step one by one through
 * spx_session_step_greedy / spx_session_step_sample: the same tokens,
 * without the shared pass. */
#include "engine/backend.h"
#include "engine/session.h"
#include "refine/attach.h"

#include <stdlib.h>
#include <string.h>

/* The arguments of a batch, every check before anything runs (a failed
 * batch leaves every session as it was). */
static spx_status check(spx_session *const *ss, size_t n, const int32_t *ids, const spx_sampler_params *smp,
                        const uint64_t *rng, const int32_t *next) {
    spx_session *s0 = ss[0];
    if (!ids || !next) return spx_fail(&s0->err, SPX_ERR_ARG, "batch step: no ids or no output");
    if (smp && !rng) return spx_fail(&s0->err, SPX_ERR_ARG, "batch step: sampler parameters without RNG states");
    const int64_t V = s0->m->cfg.vocab_size;
    for (size_t i = 0; i < n; i++) {
        spx_session *s = ss[i];
        if (!s) return spx_fail(&s0->err, SPX_ERR_ARG, "batch step: session %zu is NULL", i);
        if (s->m != s0->m)
            return spx_fail(&s0->err, SPX_ERR_ARG, "batch step: session %zu is of another model than session 0", i);
        for (size_t j = 0; j < i; j++)
            if (ss[j] == s)
                return spx_fail(&s0->err, SPX_ERR_ARG, "batch step: sessions %zu and %zu are the same session", j, i);
        if (s->pos >= s->n_ctx)
            return spx_fail(&s0->err, SPX_ERR_RANGE, "batch step: session %zu: context full: %lld tokens", i,
                            (long long)s->n_ctx);
        if (ids[i] < 0 || ids[i] >= V)
            return spx_fail(&s0->err, SPX_ERR_RANGE, "batch step: session %zu: token id %d out of range (vocabulary %lld)",
                            i, ids[i], (long long)V);
    }
    return SPX_OK;
}

/* Sessions one by one (no shared pass). */
static spx_status one_by_one(spx_session *const *ss, size_t n, const int32_t *ids, const spx_sampler_params *smp,
                             uint64_t *rng, int32_t *next, float *logits) {
    const int64_t V = ss[0]->m->cfg.vocab_size;
    for (size_t i = 0; i < n; i++) {
        spx_session *s = ss[i];
        spx_status st;
        if (logits) {
            st = spx_session_eval(s, &ids[i], 1, logits + i * (size_t)V, 0);
            if (st == SPX_OK) next[i] = spx_sample(logits + i * (size_t)V, V, smp ? &smp[i] : NULL, smp ? &rng[i] : NULL);
        } else if (smp) {
            st = spx_session_step_sample(s, ids[i], &smp[i], &rng[i], &next[i]);
        } else {
            st = spx_session_step_greedy(s, ids[i], &next[i]);
        }
        if (st != SPX_OK) {
            if (i) spx_fail(&ss[0]->err, st, "batch step: session %zu: %s", i, s->err.msg);
            return st;
        }
    }
    return SPX_OK;
}

static spx_status batch_step(spx_session *const *ss, size_t n, const int32_t *ids, const spx_sampler_params *smp,
                             uint64_t *rng, int32_t *next, float *logits) {
    if (!ss || n == 0 || !ss[0]) return SPX_ERR_ARG;
    spx_session *s0 = ss[0];
    spx_err_clear(&s0->err);
    SPX_TRY(check(ss, n, ids, smp, rng, next));
    const spx_backend *be = s0->m->be;
    if (!be->batch_forward || be->batch_rows < 2 || spx_refine_runtime(s0->m) || n == 1)
        return one_by_one(ss, n, ids, smp, rng, next, logits);
    const int64_t V = s0->m->cfg.vocab_size;
    const size_t B = (size_t)be->batch_rows;
    for (size_t i0 = 0; i0 < n; i0 += B) {
        size_t k = n - i0 < B ? n - i0 : B;
        if (k == 1) {
            SPX_TRY(one_by_one(ss + i0, 1, ids + i0, smp ? smp + i0 : NULL, smp ? rng + i0 : NULL, next + i0,
                               logits ? logits + i0 * (size_t)V : NULL));
            continue;
        }
        spx_session *lead = ss[i0];
        /* greedy without logits: only each row's argmax comes back */
        const int argmax_only = !smp && !logits;
        spx_status st = be->batch_forward(ss + i0, ids + i0, (int64_t)k, argmax_only ? next + i0 : NULL, &lead->err);
        if (st == SPX_ERR_UNSUPPORTED) { /* refused before it ran (backend.h): these sessions one by one */
            spx_err_clear(&lead->err);
            SPX_TRY(one_by_one(ss + i0, k, ids + i0, smp ? smp + i0 : NULL, smp ? rng + i0 : NULL, next + i0,
                               logits ? logits + i0 * (size_t)V : NULL));
            continue;
        }
        if (st != SPX_OK) {
            if (lead != s0) spx_fail(&s0->err, st, "batch step: %s", lead->err.msg);
            return st;
        }
        for (size_t i = 0; i < k && !argmax_only; i++) {
            const float *row = lead->logits + i * (size_t)V;
            if (logits) memcpy(logits + (i0 + i) * (size_t)V, row, (size_t)V * sizeof(float));
            next[i0 + i] = spx_sample(row, V, smp ? &smp[i0 + i] : NULL, smp ? &rng[i0 + i] : NULL);
        }
    }
    return SPX_OK;
}

/* Under the model's lock (api.c's entry points: the pass is the model's). */
spx_status spx_batch_step(spx_session *const *ss, size_t n, const int32_t *ids, const spx_sampler_params *smp,
                          uint64_t *rng, int32_t *next, float *logits) {
    if (!ss || n == 0 || !ss[0]) return SPX_ERR_ARG;
    spx_model *m = ss[0]->m;
    spx_model_lock(m);
    spx_status st = batch_step(ss, n, ids, smp, rng, next, logits);
    spx_model_unlock(m);
    return st;
}
