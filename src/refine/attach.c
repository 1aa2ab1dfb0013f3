/* attach.c: a model's weight refinement (attach.h). */
#include "refine/attach.h"
#include "engine/backend.h"
#include "format/trdc.h"
#include "model/arch.h"
#include "refine/tier.h"

#include <stdlib.h>
#include <string.h>

spx_refine_rt *spx_refine_runtime(spx_model *m) { return m && m->refine ? &m->refine->rt : NULL; }

void spx_refine_detach(spx_model *m) {
    spx_refine_model *rm = m ? m->refine : NULL;
    if (!rm) return;
    if (m->be && m->be->refine_detach) m->be->refine_detach(m);
    m->refine_epoch++;
    for (int64_t l = 0; m->layers && l < m->cfg.n_layers; l++)
        for (int s = 0; s < SPX_SL_COUNT; s++) m->layers[l].w[s].ref = NULL;
    for (int64_t i = 0; i < rm->n_mats; i++) {
        if (rm->f32s) spx_refine_f32_free(&rm->f32s[i]);
        if (rm->q4s) spx_refine_q4buf_free(&rm->q4s[i]);
    }
    free(rm->f32s);
    free(rm->q4s);
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        if (rm->bq4s) spx_bundle_buf_free(&rm->bq4s[l]);
        if (rm->bf32s) spx_bundle_f32_free(&rm->bf32s[l]);
    }
    free(rm->bq4s);
    free(rm->bf32s);
    free(rm->bundles);
    free(rm->mats);
    spx_tier_close(rm->rt.tier);
    spx_trdc_close(rm->file);
    free(rm);
    m->refine = NULL;
}

static int refinable(const spx_wmat *w) { return w->rows > 0 && w->kind == SPX_WM_QUANT; }

/* Refinement runs in the CPU backend's matmul, or in a device backend
 * that implements it (refine_attach); any other device backend's passes
 * would ignore it. */
spx_status spx_refine_host_check(const spx_model *m, spx_err *e) {
    if (m->be && m->be->device && !m->be->refine_attach)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: weight refinement is not built for the %s backend (use --backend cpu)", m->path,
                        m->be->name);
    return SPX_OK;
}

spx_status spx_refine_device_attach(spx_model *m, spx_err *e) {
    m->refine_epoch++;
    if (!m->be || !m->be->device || !m->be->refine_attach) return SPX_OK;
    return m->be->refine_attach(m, e);
}

spx_status spx_refine_build(spx_model *m, const spx_model *src, int exact, spx_err *e) {
    spx_refine_detach(m);
    SPX_TRY(spx_refine_host_check(m, e));
    if (!m->layers || !src->layers || m->cfg.n_layers != src->cfg.n_layers)
        return spx_fail(e, SPX_ERR_ARG, "refine: the model and its source have different layer counts");
    int64_t n = 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int s = 0; s < SPX_SL_COUNT; s++)
            if (spx_slots[s].mat && refinable(&m->layers[l].w[s])) {
                const spx_wmat *a = &m->layers[l].w[s], *b = &src->layers[l].w[s];
                if (a->rows != b->rows || a->cols != b->cols)
                    return spx_fail(e, SPX_ERR_ARG, "refine: layer %lld %s is [%lld, %lld], the source's [%lld, %lld]",
                                    (long long)l, spx_slots[s].key, (long long)a->rows, (long long)a->cols,
                                    (long long)b->rows, (long long)b->cols);
                n++;
            }
    spx_refine_model *rm = calloc(1, sizeof *rm);
    if (!rm) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    rm->mats = calloc((size_t)(n ? n : 1), sizeof *rm->mats);
    if (exact) rm->f32s = calloc((size_t)(n ? n : 1), sizeof *rm->f32s);
    else rm->q4s = calloc((size_t)(n ? n : 1), sizeof *rm->q4s);
    rm->rt.kern = spx_refine_kernels_best();
    m->refine = rm;
    if (!rm->mats || (exact ? !rm->f32s : !rm->q4s)) {
        spx_refine_detach(m);
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    }
    spx_status st = SPX_OK;
    float *w = NULL;
    size_t w_cap = 0;
    for (int64_t l = 0; l < m->cfg.n_layers && st == SPX_OK; l++)
        for (int s = 0; s < SPX_SL_COUNT && st == SPX_OK; s++) {
            spx_wmat *a = &m->layers[l].w[s];
            if (!spx_slots[s].mat || !refinable(a)) continue;
            const spx_wmat *b = &src->layers[l].w[s];
            const size_t need = (size_t)a->rows * (size_t)a->cols;
            if (need > w_cap) {
                free(w);
                w = malloc(need * sizeof *w);
                w_cap = w ? need : 0;
                if (!w) {
                    st = spx_fail(e, SPX_ERR_NOMEM, "out of memory for a %lld x %lld source matrix", (long long)a->rows,
                                  (long long)a->cols);
                    break;
                }
            }
            for (int64_t r = 0; r < a->rows; r++) spx_wmat_row_f32(b, r, w + (size_t)r * (size_t)a->cols);
            const int64_t i = rm->n_mats;
            spx_wmat_refine *ref = &rm->mats[i];
            ref->set = spx_slots[s].rset;
            if (exact) {
                st = spx_refine_f32_build(&rm->f32s[i], &a->q, w, e);
                ref->f32 = &rm->f32s[i];
            } else {
                st = spx_refine_q4_build(&rm->q4s[i], &a->q, w, e);
                ref->q4 = rm->q4s[i].v;
            }
            rm->n_mats++; /* counted once built or failed: detach frees either */
            if (st == SPX_OK) a->ref = ref;
        }
    free(w);
    if (st == SPX_OK) st = spx_refine_device_attach(m, e);
    if (st != SPX_OK) spx_refine_detach(m);
    return st;
}

spx_status spx_refine_set_budget(spx_model *m, const int64_t k[SPX_RSET_COUNT], spx_err *e) {
    if (!m->refine) return spx_fail(e, SPX_ERR_ARG, "%s: no refinement is attached", m->path);
    for (int i = 0; i < SPX_RSET_COUNT; i++) {
        if (k[i] < 0) return spx_fail(e, SPX_ERR_ARG, "refinement budget %lld: must be >= 0", (long long)k[i]);
        m->refine->rt.k[i] = k[i];
    }
    m->refine_epoch++;
    return SPX_OK;
}

spx_status spx_refine_build_bundles(spx_model *m, const spx_model *src, spx_err *e) {
    spx_refine_model *rm = m->refine;
    if (!rm) return spx_fail(e, SPX_ERR_ARG, "%s: no refinement is attached", m->path);
    const int64_t NL = m->cfg.n_layers;
    const int exact = rm->f32s != NULL;
    if (!rm->bundles) rm->bundles = calloc((size_t)(NL ? NL : 1), sizeof *rm->bundles);
    if (exact && !rm->bf32s) rm->bf32s = calloc((size_t)(NL ? NL : 1), sizeof *rm->bf32s);
    if (!exact && !rm->bq4s) rm->bq4s = calloc((size_t)(NL ? NL : 1), sizeof *rm->bq4s);
    if (!rm->bundles || (exact ? !rm->bf32s : !rm->bq4s)) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    rm->rt.bundles = rm->bundles;
    spx_status st = SPX_OK;
    for (int64_t l = 0; l < NL && st == SPX_OK; l++) {
        spx_layer *L = &m->layers[l];
        if (m->cfg.ffn[l] != SPX_FFN_SWIGLU) continue;
        const int fused = m->cfg.gate_up_fused;
        const spx_wmat_refine *g = L->w[fused ? SPX_SL_GATE_UP : SPX_SL_GATE].ref;
        const spx_wmat_refine *u = L->w[fused ? SPX_SL_GATE_UP : SPX_SL_UP].ref, *d = L->w[SPX_SL_DOWN].ref;
        if (!g || !u || !d) continue; /* a matrix without a residual (kept dense): no bundles */
        const spx_wmat *sd = &src->layers[l].w[SPX_SL_DOWN];
        const int64_t H = sd->rows, I = sd->cols;
        float *w = malloc((size_t)H * (size_t)I * sizeof *w);
        if (!w) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
        for (int64_t r = 0; r < H; r++) spx_wmat_row_f32(sd, r, w + (size_t)r * (size_t)I);
        if (exact) {
            st = spx_bundle_f32_build(&rm->bf32s[l], g->f32, 0, u->f32, fused ? I : 0, d->f32, w, e);
            if (st == SPX_OK) rm->bundles[l].f32 = &rm->bf32s[l];
        } else {
            st = spx_bundle_build(&rm->bq4s[l], &g->q4, 0, &u->q4, fused ? I : 0, &d->q4, w, 0, e);
            if (st == SPX_OK) rm->bundles[l].q4 = rm->bq4s[l].v;
        }
        free(w);
        if (st == SPX_OK) rm->n_bundle_layers++;
    }
    if (st == SPX_OK && rm->n_bundle_layers == 0)
        st = spx_fail(e, SPX_ERR_ARG, "%s: no layer has a gated MLP with residuals: no neuron bundles", m->path);
    return st;
}

spx_status spx_refine_set_mlp(spx_model *m, int mlp, int64_t kn, spx_err *e) {
    spx_refine_model *rm = m->refine;
    if (!rm) return spx_fail(e, SPX_ERR_ARG, "%s: no refinement is attached", m->path);
    if (mlp != SPX_REFINE_MLP_CHANNEL && mlp != SPX_REFINE_MLP_NEURON)
        return spx_fail(e, SPX_ERR_ARG, "refinement MLP mode %d: expected channel (0) or neuron (1)", mlp);
    if (mlp == SPX_REFINE_MLP_NEURON && rm->n_bundle_layers == 0)
        return spx_fail(e, SPX_ERR_ARG, "%s: neuron-wise MLP refinement needs neuron bundles, and none are attached",
                        m->path);
    if (kn < 0) return spx_fail(e, SPX_ERR_ARG, "neurons per chunk %lld: must be >= 0", (long long)kn);
    if (rm->rt.mlp != mlp && m->be && m->be->device) { /* a device backend checks the mode at attach */
        const int32_t old_mlp = rm->rt.mlp;
        const int64_t old_kn = rm->rt.kn;
        rm->rt.mlp = mlp;
        rm->rt.kn = kn;
        spx_status st = spx_refine_device_attach(m, e);
        if (st != SPX_OK) {
            rm->rt.mlp = old_mlp;
            rm->rt.kn = old_kn;
            spx_err e2;
            spx_err_clear(&e2);
            if (spx_refine_device_attach(m, &e2) != SPX_OK) spx_refine_detach(m); /* cannot restore: none at all */
        }
        return st;
    }
    rm->rt.mlp = mlp;
    rm->rt.kn = kn;
    m->refine_epoch++;
    return SPX_OK;
}

spx_status spx_refine_set_schedule(spx_model *m, int32_t blocks, int32_t lag, int32_t lead, spx_err *e) {
    spx_refine_model *rm = m->refine;
    if (!rm) return spx_fail(e, SPX_ERR_ARG, "%s: no refinement is attached", m->path);
    if (blocks < 0 || blocks > 4096 || lag < 0 || lag > 4 || lead < 0 || lead > 4)
        return spx_fail(e, SPX_ERR_ARG, "refinement schedule: %d blocks / lag %d / lead %d half-blocks: out of range",
                        (int)blocks, (int)lag, (int)lead);
    spx_refine_rt *rt = &rm->rt;
    if (rt->cuda_lead == lead || !m->be || !m->be->device) {
        rt->cuda_blocks = blocks;
        rt->cuda_lag = lag;
        rt->cuda_lead = lead;
        m->refine_epoch++; /* read when a pass is enqueued: captured graphs are dropped */
        return SPX_OK;
    }
    /* a device backend checks the lead at attach (and may refuse it) */
    const int32_t ob = rt->cuda_blocks, og = rt->cuda_lag, od = rt->cuda_lead;
    rt->cuda_blocks = blocks;
    rt->cuda_lag = lag;
    rt->cuda_lead = lead;
    spx_status st = spx_refine_device_attach(m, e);
    if (st != SPX_OK) {
        rt->cuda_blocks = ob;
        rt->cuda_lag = og;
        rt->cuda_lead = od;
        spx_err e2;
        spx_err_clear(&e2);
        if (spx_refine_device_attach(m, &e2) != SPX_OK) spx_refine_detach(m); /* cannot restore: none at all */
    }
    return st;
}
