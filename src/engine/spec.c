/* spec.c: speculative decoding on a session (spectra.h, docs/spec.md):
 * draft (engine/lookup.h or a caller's drafter), verify the last token
 * and the draft in one forward pass, keep the longest agreeing prefix,
 * rewind the rest, adapt the draft length.
 *
 * Exactness rests on the forward pass: the logits of a token are the same
 * whether it is fed alone or among others in one call (the CPU kernels'
 * results for a row do not depend on the token count; tests/test_spec.c
 * checks the decoded tokens against plain steps). Rollback: an
 * attention-only model truncates to the kept tokens; a model with
 * recurrent layers checkpoints its state before the verification,
 * truncates to the checkpoint and feeds the kept tokens again (a second,
 * shorter pass: stats.refeeds). */
#include "engine/lookup.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "refine/attach.h"

#include <stdlib.h>
#include <string.h>

struct spx_spec {
    spx_session *s;
    spx_spec_params p;
    spx_lookup *lk;      /* the history (every drafter's) and the lookup index */
    spx_draft_fn fn;     /* NULL: the lookup */
    void *fn_user;
    float *rows;         /* [draft_max + 1, vocab]: a verification's logits (sampling) */
    int32_t best[SPX_SPEC_DRAFT_LIMIT + 1]; /* a greedy verification's argmax per row */
    spx_cand *cand;      /* [vocab] */
    int32_t *feed;       /* [draft_max + 1]: the fed token and the draft */
    int32_t k_cur;       /* the adaptive draft cap, 1..draft_max */
    double acc;          /* running acceptance of drafted tokens */
    int32_t pause_left;  /* plain tokens still to go before a probe */
    int32_t pause_cur;   /* the current pause length */
    int probing;         /* the next verification is a probe after a pause */
    spx_spec_stats st;
};

void spx_spec_params_default(spx_spec_params *p) {
    static const spx_spec_params d = {
        .kind = SPX_SPEC_LOOKUP,
        .draft_max = 8,
        .draft_min = 2,
        .ngram_min = 1,
        .ngram_max = 4,
        .min_count = {2, 2, 1, 1},
        .min_percent = {50, 50, 50, 50},
        .stop_below = 0.25f,
        .pause = 16,
    };
    *p = d;
}

const char *spx_spec_kind_name(spx_spec_kind k) { return k == SPX_SPEC_LOOKUP ? "lookup" : k == SPX_SPEC_OFF ? "off" : "?"; }

int spx_spec_kind_parse(const char *name) {
    if (!strcmp(name, "lookup")) return SPX_SPEC_LOOKUP;
    if (!strcmp(name, "off")) return SPX_SPEC_OFF;
    return -1;
}

static spx_status check_params(const spx_spec_params *p, spx_err *e) {
    if (p->kind != SPX_SPEC_OFF && p->kind != SPX_SPEC_LOOKUP)
        return spx_fail(e, SPX_ERR_ARG, "spec: kind %d is neither off (0) nor lookup (1)", (int)p->kind);
    if (p->draft_max < 1 || p->draft_max > SPX_SPEC_DRAFT_LIMIT)
        return spx_fail(e, SPX_ERR_ARG, "spec: draft_max %d is outside 1..%d", p->draft_max, SPX_SPEC_DRAFT_LIMIT);
    if (p->draft_min < 1 || p->draft_min > p->draft_max)
        return spx_fail(e, SPX_ERR_ARG, "spec: draft_min %d is outside 1..draft_max (%d)", p->draft_min, p->draft_max);
    if (p->ngram_min < 1 || p->ngram_max > SPX_SPEC_NGRAM_LIMIT || p->ngram_min > p->ngram_max)
        return spx_fail(e, SPX_ERR_ARG, "spec: n-gram range %d..%d is not within 1..%d", p->ngram_min, p->ngram_max,
                        SPX_SPEC_NGRAM_LIMIT);
    for (int i = 0; i < SPX_SPEC_NGRAM_LIMIT; i++) {
        if (p->min_count[i] < 1)
            return spx_fail(e, SPX_ERR_ARG, "spec: min_count[%d] is %d, expected >= 1", i, p->min_count[i]);
        if (p->min_percent[i] < 0 || p->min_percent[i] > 100)
            return spx_fail(e, SPX_ERR_ARG, "spec: min_percent[%d] is %d, expected 0..100", i, p->min_percent[i]);
    }
    if (!(p->stop_below >= 0 && p->stop_below <= 1))
        return spx_fail(e, SPX_ERR_ARG, "spec: stop_below %g is outside 0..1", (double)p->stop_below);
    if (p->pause < 1) return spx_fail(e, SPX_ERR_ARG, "spec: pause %d, expected >= 1", p->pause);
    return SPX_OK;
}

spx_status spx_spec_new(spx_session *s, const spx_spec_params *p, spx_spec **out) {
    *out = NULL;
    spx_err_clear(&s->err);
    spx_spec_params d;
    if (!p) {
        spx_spec_params_default(&d);
        p = &d;
    }
    SPX_TRY(check_params(p, &s->err));
    spx_spec *sp = calloc(1, sizeof *sp);
    const size_t V = (size_t)s->m->cfg.vocab_size, R = (size_t)p->draft_max + 1;
    if (sp) {
        sp->s = s;
        sp->p = *p;
        sp->lk = spx_lookup_new(p);
        sp->rows = malloc(R * V * sizeof *sp->rows);
        sp->cand = malloc(V * sizeof *sp->cand);
        sp->feed = malloc(R * sizeof *sp->feed);
    }
    if (!sp || !sp->lk || !sp->rows || !sp->cand || !sp->feed) {
        spx_spec_free(sp);
        return spx_fail(&s->err, SPX_ERR_NOMEM, "out of memory for speculation (%zu logit rows)", R);
    }
    sp->k_cur = p->draft_min; /* grows by doubling: a first pass on text that does not repeat costs little */
    sp->acc = 0.5; /* neutral: three passes that keep nothing pause (0.5 * 0.75^3 < 0.25) */
    sp->pause_cur = p->pause;
    *out = sp;
    return SPX_OK;
}

void spx_spec_free(spx_spec *sp) {
    if (!sp) return;
    spx_lookup_free(sp->lk);
    free(sp->rows);
    free(sp->cand);
    free(sp->feed);
    free(sp);
}

spx_status spx_spec_history(spx_spec *sp, const int32_t *ids, size_t n) {
    spx_err_clear(&sp->s->err);
    for (size_t i = 0; i < n; i++)
        if (spx_lookup_push(sp->lk, ids[i]) != SPX_OK)
            return spx_fail(&sp->s->err, SPX_ERR_NOMEM, "out of memory for the speculation history");
    return SPX_OK;
}

void spx_spec_set_drafter(spx_spec *sp, spx_draft_fn fn, void *user) {
    sp->fn = fn;
    sp->fn_user = user;
}

void spx_spec_get_stats(const spx_spec *sp, spx_spec_stats *st) { *st = sp->st; }

/* ---- acceptance ---------------------------------------------------------- */

/* Sampling: row `logits` decides draft token d (d < 0: no draft, the
 * bonus draw). Returns 1 and *tok = d when d is kept; else 0 and *tok the
 * token that replaces it: a draw from p without d, renormalised (with no
 * draft: a draw from p, as spx_sample). (Greedy: d is kept when it is the
 * row's argmax, which replaces it otherwise.) */
static int decide(spx_spec *sp, const float *logits, int32_t d, const spx_sampler_params *smp, uint64_t *rng,
                  int32_t *tok) {
    const int64_t V = sp->s->m->cfg.vocab_size;
    double sum;
    const spx_cand *c = sp->cand;
    int64_t n = spx_sampler_dist(logits, V, smp, sp->cand, &sum);
    double pd = 0; /* weight of d among the candidates (0: outside them) */
    if (d >= 0)
        for (int64_t i = 0; i < n; i++)
            if (c[i].id == d) { pd = c[i].p; break; }
    if (d >= 0 && spx_rng_uniform(rng) * sum < pd) {
        *tok = d;
        return 1;
    }
    /* the residual: p with d's weight removed (pd < sum here: a d holding
     * all the weight is always kept) */
    double r = spx_rng_uniform(rng) * (sum - pd), acc = 0;
    *tok = -1;
    for (int64_t i = 0; i < n; i++) {
        if (c[i].id == d) continue;
        acc += c[i].p;
        if (*tok < 0 || r < acc) *tok = c[i].id; /* the last candidate other than d when rounding runs past */
        if (r < acc) break;
    }
    return 0;
}

/* ---- adaptive draft length ------------------------------------------------ */

static void adapt(spx_spec *sp, int32_t drafted, int32_t kept) {
    const spx_spec_params *p = &sp->p;
    double a = (double)kept / drafted;
    sp->k_cur = kept == drafted ? (sp->k_cur * 2 < p->draft_max ? sp->k_cur * 2 : p->draft_max) : kept + 1;
    if (sp->k_cur < p->draft_min) sp->k_cur = p->draft_min; /* a smaller cap would never draft again */
    if (p->stop_below <= 0) return;
    if (sp->probing) {
        sp->probing = 0;
        if (a >= p->stop_below) {
            sp->acc = a;
            sp->pause_cur = p->pause;
        } else {
            sp->pause_cur = sp->pause_cur * 2 < 16 * p->pause ? sp->pause_cur * 2 : 16 * p->pause;
            sp->pause_left = sp->pause_cur;
        }
        return;
    }
    sp->acc = 0.75 * sp->acc + 0.25 * a;
    if (sp->acc < p->stop_below) sp->pause_left = sp->pause_cur;
}

/* ---- the step -------------------------------------------------------------- */

static spx_status plain_step(spx_spec *sp, int32_t id, const spx_sampler_params *smp, uint64_t *rng, int32_t *out) {
    spx_session *s = sp->s;
    /* the next call is a plain step too (speculation off, refinement
     * attached, or drafting paused past it): a GPU backend queues it
     * before returning, as a plain decode loop does; otherwise it may be a
     * verification, which a queued step would only delay */
    const int ahead = sp->p.kind == SPX_SPEC_OFF || sp->pause_left > 1 || spx_refine_runtime(s->m) != NULL;
    SPX_TRY(spx_sampler_greedy(smp) ? spx_session_step_greedy_ahead(s, id, out, ahead)
                                    : spx_session_step_sample_ahead(s, id, smp, rng, out, ahead));
    sp->st.passes++;
    if (sp->pause_left > 0 && --sp->pause_left == 0) { /* the probe: a short draft */
        sp->probing = 1;
        sp->acc = sp->p.stop_below;
        sp->k_cur = sp->p.draft_min;
    }
    return SPX_OK;
}

static spx_status spec_step(spx_spec *sp, int32_t id, const spx_sampler_params *smp, uint64_t *rng, int32_t *out,
                            size_t cap, size_t *n_out) {
    spx_session *s = sp->s;
    spx_err_clear(&s->err);
    *n_out = 0;
    int64_t nh;
    spx_lookup_history(sp->lk, &nh);
    if (nh != s->pos)
        return spx_fail(&s->err, SPX_ERR_ARG,
                        "spec: the history holds %lld tokens but the session %lld (tokens fed around spx_spec_step "
                        "must be given to spx_spec_history)", (long long)nh, (long long)s->pos);
    if (cap < 1) return spx_fail(&s->err, SPX_ERR_ARG, "spec: no room for a token (cap 0)");
    if (!spx_sampler_greedy(smp) && !rng) return spx_fail(&s->err, SPX_ERR_ARG, "spec: sampling without an RNG state");
    if (id < 0 || id >= s->m->cfg.vocab_size)
        return spx_fail(&s->err, SPX_ERR_RANGE, "token id %d out of range (vocabulary %lld)", id,
                        (long long)s->m->cfg.vocab_size);
    /* the longest draft: the cap, the room for the tokens it returns, and
     * the context (the fed token and the draft must fit) */
    int64_t kmax = sp->k_cur;
    if (kmax > (int64_t)cap - 1) kmax = (int64_t)cap - 1;
    if (kmax > s->n_ctx - s->pos - 1) kmax = s->n_ctx - s->pos - 1;
    int32_t nd = 0;
    int32_t *draft = sp->feed + 1;
    /* id follows the history whatever is kept: it goes in first, and the
     * draft continues it */
    if (spx_lookup_push(sp->lk, id) != SPX_OK)
        return spx_fail(&s->err, SPX_ERR_NOMEM, "out of memory for the speculation history");
    if (sp->p.kind == SPX_SPEC_LOOKUP && sp->pause_left == 0 && kmax >= sp->p.draft_min && !spx_refine_runtime(s->m)) {
        const int32_t *hist = spx_lookup_history(sp->lk, &nh);
        nd = sp->fn ? sp->fn(sp->fn_user, hist, nh, draft, (int32_t)kmax) : spx_lookup_draft(sp->lk, draft, (int32_t)kmax);
        if (nd < 0 || nd > kmax) nd = 0; /* a drafter out of contract drafts nothing */
        for (int32_t i = 0; i < nd; i++)
            if (draft[i] < 0 || draft[i] >= s->m->cfg.vocab_size) nd = 0;
        if (nd < sp->p.draft_min) nd = 0;
    }
    if (nd == 0) {
        SPX_TRY(plain_step(sp, id, smp, rng, out));
        *n_out = 1;
        sp->st.tokens++;
        return SPX_OK;
    }
    const int64_t p0 = s->pos, V = s->m->cfg.vocab_size;
    const int recurrent = s->m->state_floats != 0;
    if (recurrent) {
        spx_session_checkpoint(s);
        if (s->ckpt_pos != p0) return s->err.code ? s->err.code : spx_fail(&s->err, SPX_ERR_INTERNAL, "spec: checkpoint failed");
    }
    sp->feed[0] = id;
    /* greedy needs each row's argmax only (a GPU computes them there and
     * sends nd + 1 ids, not the logits); sampling the rows' logits */
    const int greedy = spx_sampler_greedy(smp);
    if (greedy) SPX_TRY(spx_session_forward_argmax(s, sp->feed, (int64_t)nd + 1, sp->best, &s->err));
    else SPX_TRY(spx_session_eval(s, sp->feed, (size_t)nd + 1, sp->rows, 1));
    sp->st.passes++;
    sp->st.verify++;
    int32_t kept = 0;
    for (;;) {
        int32_t tok;
        const int32_t d = kept < nd ? draft[kept] : -1;
        int ok = greedy ? (tok = sp->best[kept]) == d : decide(sp, sp->rows + (size_t)kept * (size_t)V, d, smp, rng, &tok);
        out[kept] = tok;
        if (!ok || kept == nd) break;
        kept++;
    }
    /* fed: id and the draft; valid: id and the kept draft tokens */
    if (kept < nd) {
        if (recurrent) {
            SPX_TRY(spx_session_truncate(s, p0));
            SPX_TRY(spx_session_eval(s, sp->feed, (size_t)kept + 1, NULL, 0));
            sp->st.passes++;
            sp->st.refeeds++;
        } else {
            SPX_TRY(spx_session_truncate(s, p0 + 1 + kept));
        }
    }
    for (int32_t i = 1; i <= kept; i++)
        if (spx_lookup_push(sp->lk, sp->feed[i]) != SPX_OK)
            return spx_fail(&s->err, SPX_ERR_NOMEM, "out of memory for the speculation history");
    sp->st.drafted += nd;
    sp->st.accepted += kept;
    sp->st.tokens += kept + 1;
    *n_out = (size_t)kept + 1;
    adapt(sp, nd, kept);
    return SPX_OK;
}

/* Under the model's lock: a draft's verification and rewind are one unit. */
spx_status spx_spec_step(spx_spec *sp, int32_t id, const spx_sampler_params *smp, uint64_t *rng, int32_t *out,
                         size_t cap, size_t *n_out) {
    spx_model *m = sp->s->m;
    spx_model_lock(m);
    spx_status st = spec_step(sp, id, smp, rng, out, cap, n_out);
    spx_model_unlock(m);
    return st;
}
