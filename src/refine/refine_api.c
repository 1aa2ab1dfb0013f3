/* refine_api.c: spx_model_refine / spx_model_refine_info (spectra.h): a
 * .refine file (docs/trdc.md, "refine4" tensors) bound to the model's
 * layer matrices by name, mapped in RAM or read through the tier; its
 * "bundle4" tensors (named "<down tensor>.bundles") to the gated MLP
 * layers. Neuron mode: the gate/up and down budgets become 0 (the bundles
 * replace them) and kn defaults to the paper's round(3 k / 4) of the
 * gate/up budget k as given (its setting in Table/Appendix B.7 tuples:
 * fewer neurons than channels, each neuron costing about twice a column). */
#include "core/pool.h"
#include "cpu/qkernels.h"
#include "engine/backend.h"
#include "engine/probe.h"
#include "format/trdc.h"
#include "model/arch.h"
#include "refine/attach.h"
#include "refine/tier.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_LOADERS 2

void spx_refine_platform(const spx_model *m, const spx_refine_params *p, char *buf, size_t cap) {
    char tier[96], cpu[128];
    if (p->cache_mb > 0)
        snprintf(tier, sizeof tier, "disk-%lldMiB-%s-%dl", (long long)p->cache_mb, p->miss_wait ? "wait" : "skip",
                 (int)(p->n_loaders > 0 ? p->n_loaders : DEFAULT_LOADERS));
    else snprintf(tier, sizeof tier, "ram");
    spx_hw_cpu_name(cpu, sizeof cpu);
    snprintf(buf, cap, "%s/%s/%dt/%s/%s", spx_model_backend(m), spx_qkernels_best()->name, spx_pool_size(m->pool), tier,
             cpu);
}

/* The tuned entry for this binding (spx_refine_params.tuned), or NULL; an
 * explicit level with no entry at or below it is an error. */
static spx_status pick_tuned(spx_refine_model *rm, const spx_refine_params *p, spx_err *e) {
    rm->tuned = NULL;
    if (p->tuned < 0) return SPX_OK;
    const double level = p->tuned > 0 ? p->tuned : SPX_REFINE_TUNED_DEFAULT;
    rm->tuned = spx_trdc_tuned_pick(rm->file, rm->platform, level);
    if (rm->tuned) return SPX_OK;
    const spx_trdc_tuned *low = NULL;
    char have[512] = "";
    size_t n = 0;
    for (size_t i = 0; i < spx_trdc_tuned_count(rm->file); i++) {
        const spx_trdc_tuned *t = spx_trdc_tuned_at(rm->file, i);
        if (strcmp(t->platform, rm->platform) != 0) continue;
        if (!low || t->budget < low->budget) low = t;
        n += (size_t)snprintf(have + n, n < sizeof have ? sizeof have - n : 0, "%s%g%%", n ? ", " : "", 100 * t->budget);
        if (n >= sizeof have) n = sizeof have - 1;
    }
    if (p->tuned == 0) {
        rm->tuned = low; /* every entry above the default level: the nearest one */
        return SPX_OK;
    }
    if (low)
        return spx_fail(e, SPX_ERR_ARG, "%s: no budgets tuned at or below %g%% for platform '%s' (tuned: %s)", p->path,
                        100 * p->tuned, rm->platform, have);
    return spx_fail(e, SPX_ERR_ARG, "%s: no tuned budgets for platform '%s' (%zu entries for others): run spectra tune",
                    p->path, rm->platform, spx_trdc_tuned_count(rm->file));
}

static spx_status fail_m(spx_model *m, spx_err *e) {
    m->err = *e;
    return e->code;
}

/* The base matrix's codes checksum, as the .refine's writer recorded it
 * (0 and no check when the model was not opened from a .trdc). */
static int base_crc(const spx_model *m, const char *name, uint32_t *crc) {
    const spx_trdc_tensor *t = m->trdc ? spx_trdc_find(m->trdc, name) : NULL;
    if (!t || t->kind != SPX_TRDC_QUANT || !t->comp[SPX_TRDC_C_CODES].present) return 0;
    *crc = t->comp[SPX_TRDC_C_CODES].crc32;
    return 1;
}

/* quantization.refine.fit.k of a fitted .refine (compress --fit) into
 * k[4]; zeros when the file is calibration-free or the entry is not four
 * numbers. */
static void fit_ks(const spx_trdc *f, int64_t k[4]) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(spx_trdc_quant_settings(f), "refine");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "fit"), "k");
    memset(k, 0, 4 * sizeof *k);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 4) return;
    for (int i = 0; i < 4; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > SPX_REFINE_CHUNK) {
            memset(k, 0, 4 * sizeof *k);
            return;
        }
        k[i] = (int64_t)v->valuedouble;
    }
}

/* The file's bundle4 tensors, one per gated MLP layer that has them. */
static spx_status bind_bundles(spx_model *m, spx_refine_model *rm, const spx_trdc *f, const spx_refine_params *p,
                               spx_err *e) {
    char name[300];
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const spx_wmat *d = &m->layers[l].w[SPX_SL_DOWN];
        if (m->cfg.ffn[l] != SPX_FFN_SWIGLU || !d->rows) continue;
        spx_slot_tensor_name(&m->cfg, l, SPX_SL_DOWN, name, 256);
        strcat(name, ".bundles");
        const spx_trdc_tensor *t = spx_trdc_find(f, name);
        if (!t) continue;
        if (t->kind != SPX_TRDC_BUNDLE)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s' is not a bundle4 tensor", p->path, name);
        if (t->shape[0] != d->cols || t->shape[1] != d->rows)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: '%s' holds %lld neurons of hidden %lld; the model's MLP has %lld of %lld",
                            p->path, name, (long long)t->shape[0], (long long)t->shape[1], (long long)d->cols,
                            (long long)d->rows);
        if (!rm->bundles && !(rm->bundles = calloc((size_t)m->cfg.n_layers, sizeof *rm->bundles)))
            return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
        const int64_t H = t->shape[1];
        if (p->cache_mb > 0 && spx_bundle_bytes(H) > (int64_t)1 << 30)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: '%s': bundles of %lld bytes are beyond the tier's requests", p->path,
                            name, (long long)spx_bundle_bytes(H));
        rm->bundles[l].q4 = (spx_bundle_q4){t->shape[0], H, t->refine.col_stride,
                                            p->cache_mb > 0 ? NULL : t->refine.codes, t->refine.scales,
                                            t->refine.scales + H, t->comp[SPX_TRDC_C_CODES].offset};
        rm->n_bundle_layers++;
    }
    rm->rt.bundles = rm->bundles;
    return SPX_OK;
}

static spx_status bind(spx_model *m, const spx_refine_params *p, spx_err *e) {
    spx_trdc *f = NULL;
    SPX_TRY(spx_trdc_open(p->path, &f, e));
    if (spx_trdc_contents(f) != SPX_TRDC_CONTENTS_REFINE) {
        spx_trdc_close(f);
        return spx_fail(e, SPX_ERR_FORMAT, "%s: not a .refine file (a model file? make one with spectra compress "
                                           "--refine)", p->path);
    }
    spx_refine_model *rm = calloc(1, sizeof *rm);
    int64_t n = 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int s = 0; s < SPX_SL_COUNT; s++) n += spx_slots[s].mat && m->layers[l].w[s].kind == SPX_WM_QUANT;
    if (rm) rm->mats = calloc((size_t)(n ? n : 1), sizeof *rm->mats);
    if (!rm || !rm->mats) {
        free(rm);
        spx_trdc_close(f);
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    }
    rm->file = f;
    rm->rt.kern = spx_refine_kernels_best();
    m->refine = rm;
    char name[256];
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int s = 0; s < SPX_SL_COUNT; s++) {
            spx_wmat *w = &m->layers[l].w[s];
            if (!spx_slots[s].mat || w->kind != SPX_WM_QUANT || !w->rows) continue;
            spx_slot_tensor_name(&m->cfg, l, (spx_slot)s, name, sizeof name);
            const spx_trdc_tensor *t = spx_trdc_find(f, name);
            if (!t) continue; /* a matrix the writer left out runs unrefined */
            if (t->kind != SPX_TRDC_REFINE)
                return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s' is not a refine4 residual", p->path, name);
            if (t->shape[0] != w->rows || t->shape[1] != w->cols)
                return spx_fail(e, SPX_ERR_FORMAT, "%s: '%s' is [%lld, %lld]; the model's matrix is [%lld, %lld]",
                                p->path, name, (long long)t->shape[0], (long long)t->shape[1], (long long)w->rows,
                                (long long)w->cols);
            uint32_t crc;
            if (base_crc(m, name, &crc) && t->refine.has_base_crc && crc != t->refine.base_crc32)
                return spx_fail(e, SPX_ERR_FORMAT,
                                "%s: '%s' was made for another compression of this model (base codes checksum %08x, "
                                "the model's %08x): compress with --refine again",
                                p->path, name, t->refine.base_crc32, crc);
            spx_wmat_refine *r = &rm->mats[rm->n_mats++];
            r->set = spx_slots[s].rset;
            r->q4 = (spx_refine_q4){w->rows, w->cols, spx_refine_col_bytes(w->rows), t->refine.col_stride,
                                    p->cache_mb > 0 ? NULL : t->refine.codes, t->refine.scales};
            r->file_off = t->comp[SPX_TRDC_C_CODES].offset;
            w->ref = r;
            rm->residual_bytes += t->comp[SPX_TRDC_C_CODES].size;
        }
    if (rm->n_mats == 0)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: no residual matches a matrix of %s", p->path, m->path);
    SPX_TRY(bind_bundles(m, rm, f, p, e));
    if (p->cache_mb > 0) {
        const int loaders = p->n_loaders > 0 ? p->n_loaders : DEFAULT_LOADERS;
        SPX_TRY(spx_tier_open(p->path, (uint64_t)p->cache_mb << 20, p->miss_wait ? SPX_TIER_WAIT : SPX_TIER_SKIP,
                              loaders, &rm->rt.tier, e));
    }
    spx_refine_platform(m, p, rm->platform, sizeof rm->platform);
    int any_default = 0;
    for (int i = 0; i < SPX_RSET_COUNT; i++) any_default |= p->k[i] < 0;
    if (any_default) SPX_TRY(pick_tuned(rm, p, e));
    else rm->tuned = NULL;
    for (int i = 0; i < SPX_RSET_COUNT; i++)
        rm->rt.k[i] = p->k[i] >= 0 ? p->k[i] : rm->tuned ? rm->tuned->k[i] : SPX_REFINE_K_DEFAULT;
    /* the tuned entry's mode and schedule where p leaves them at -1 */
    const spx_trdc_tuned *tu = rm->tuned;
    const int32_t mlp = p->mlp >= 0 ? p->mlp : tu ? tu->mlp : SPX_REFINE_MLP_CHANNEL;
    const int64_t kn = p->kn >= 0 ? p->kn : tu && tu->mlp == SPX_REFINE_MLP_NEURON ? tu->kn : -1;
    if (mlp == SPX_REFINE_MLP_NEURON) {
        if (rm->n_bundle_layers == 0)
            return spx_fail(e, SPX_ERR_ARG, "%s: --refine-mlp neuron needs neuron bundles and this .refine has none "
                                            "(write them with spectra compress --refine OUT --refine-bundles)", p->path);
        rm->rt.mlp = SPX_REFINE_MLP_NEURON;
        rm->rt.kn = kn >= 0 ? kn : (3 * rm->rt.k[SPX_RSET_GATE_UP] + 2) / 4;
        rm->rt.k[SPX_RSET_GATE_UP] = rm->rt.k[SPX_RSET_DOWN] = 0;
    }
    rm->rt.cuda_blocks = p->cuda_blocks >= 0 ? p->cuda_blocks : tu ? tu->cuda_blocks : 0;
    rm->rt.cuda_lag = p->cuda_lag >= 0 ? p->cuda_lag : tu ? tu->cuda_lag : 0;
    rm->rt.cuda_lead = p->cuda_lead >= 0 ? p->cuda_lead : tu ? tu->cuda_lead : 0;
    /* fitted values are made for one budget per set (refine/fit.h) */
    fit_ks(f, rm->fit_k);
    int other = 0;
    for (int i = 0; i < SPX_RSET_COUNT; i++) other |= rm->fit_k[i] && rm->rt.k[i] && rm->fit_k[i] != rm->rt.k[i];
    if (other)
        spx_log(SPX_LOG_WARN, "%s: fitted for k %lld,%lld,%lld,%lld per 1024 but run at %lld,%lld,%lld,%lld: fitted "
                "values suit their own budget (compress --fit-k for this one)", p->path, (long long)rm->fit_k[0],
                (long long)rm->fit_k[1], (long long)rm->fit_k[2], (long long)rm->fit_k[3], (long long)rm->rt.k[0],
                (long long)rm->rt.k[1], (long long)rm->rt.k[2], (long long)rm->rt.k[3]);
    return spx_refine_device_attach(m, e);
}

static spx_status model_refine(spx_model *m, const spx_refine_params *p) {
    spx_err e;
    spx_err_clear(&e);
    spx_refine_detach(m);
    if (!p || !p->path) return SPX_OK;
    if (spx_refine_host_check(m, &e) != SPX_OK) return fail_m(m, &e);
    for (int i = 0; i < 4; i++)
        if (p->k[i] < -1) {
            spx_fail(&e, SPX_ERR_ARG, "refinement budget %lld: expected >= 0 (or -1: the default)", (long long)p->k[i]);
            return fail_m(m, &e);
        }
    if (!(p->tuned < 1) || isnan(p->tuned)) {
        spx_fail(&e, SPX_ERR_ARG, "tuned budget level %g: expected a fraction below 1 (0: the default, < 0: none)",
                 p->tuned);
        return fail_m(m, &e);
    }
    if ((p->mlp != SPX_REFINE_MLP_CHANNEL && p->mlp != SPX_REFINE_MLP_NEURON && p->mlp != -1) || p->kn < -1) {
        spx_fail(&e, SPX_ERR_ARG, "refinement MLP mode %d / %lld neurons per 1024: expected mode channel (0) or neuron "
                                  "(1) (or -1: the tuned one) and neurons >= 0 (or -1: the default)", (int)p->mlp,
                 (long long)p->kn);
        return fail_m(m, &e);
    }
    if (p->cache_mb < 0 || p->n_loaders < 0 || p->n_loaders > SPX_TIER_MAX_LOADERS || p->cuda_blocks < -1 ||
        p->cuda_blocks > 4096 || p->cuda_lag < -1 || p->cuda_lag > 4 || p->cuda_lead < -1 || p->cuda_lead > 4) {
        spx_fail(&e, SPX_ERR_ARG, "refinement cache %lld MiB / %d loaders / %d cuda blocks / lag %d / lead %d "
                 "half-blocks: out of range", (long long)p->cache_mb, (int)p->n_loaders, (int)p->cuda_blocks,
                 (int)p->cuda_lag, (int)p->cuda_lead);
        return fail_m(m, &e);
    }
    if (bind(m, p, &e) != SPX_OK) {
        spx_refine_detach(m);
        return fail_m(m, &e);
    }
    return SPX_OK;
}

void spx_model_refine_info(const spx_model *m, spx_refine_info *out) {
    memset(out, 0, sizeof *out);
    const spx_refine_model *rm = m ? m->refine : NULL;
    if (!rm) return;
    out->active = 1;
    for (int i = 0; i < 4; i++) out->k[i] = rm->rt.k[i];
    out->n_mats = rm->n_mats;
    snprintf(out->platform, sizeof out->platform, "%s", rm->platform);
    if (rm->tuned) {
        out->tuned = 1;
        out->tuned_budget = rm->tuned->budget;
        out->tuned_slowdown = rm->tuned->slowdown;
        out->tuned_kl = rm->tuned->kl;
    }
    out->mlp = rm->rt.mlp;
    out->kn = rm->rt.kn;
    out->n_bundle_layers = rm->n_bundle_layers;
    out->cuda_blocks = rm->rt.cuda_blocks;
    out->cuda_lag = rm->rt.cuda_lag;
    out->cuda_lead = rm->rt.cuda_lead;
    out->device = m->be && m->be->device;
    out->residual_bytes = rm->residual_bytes;
    for (int i = 0; i < 4; i++) out->fit_k[i] = rm->fit_k[i];
    out->launches = rm->rt.st.launches;
    out->selected = rm->rt.st.selected;
    out->applied = rm->rt.st.applied;
    for (int64_t i = 0; i < rm->n_mats; i++) {
        const spx_wmat_refine *r = &rm->mats[i];
        const int64_t k = spx_refine_rt_k(&rm->rt, r->set);
        if (k > 0)
            out->bytes_per_token += (uint64_t)spx_refine_topk_max(r->q4.cols, SPX_REFINE_CHUNK, k) * (uint64_t)r->q4.col_bytes;
    }
    for (int64_t l = 0; rm->bundles && rm->rt.mlp == SPX_REFINE_MLP_NEURON && rm->rt.kn > 0 && l < m->cfg.n_layers; l++) {
        const spx_bundle_layer *b = &rm->bundles[l];
        const int64_t n = b->f32 ? b->f32->n : b->q4.n, H = b->f32 ? b->f32->hidden : b->q4.hidden;
        if (n > 0) out->bytes_per_token += (uint64_t)spx_refine_topk_max(n, SPX_REFINE_CHUNK, rm->rt.kn) * (uint64_t)spx_bundle_bytes(H);
    }
    if (rm->rt.tier) {
        spx_tier_stats ts;
        spx_tier_stats_get(rm->rt.tier, &ts);
        out->on_disk = 1;
        out->direct = ts.direct;
        out->cache_bytes = ts.budget;
        out->requests = ts.requests;
        out->hits = ts.hits;
        out->bytes_read = ts.bytes_read;
        out->waits = ts.waits;
        out->wait_s = ts.wait_s;
    }
}

/* Under the model's lock: no pass runs while the refinement changes. */
spx_status spx_model_refine(spx_model *m, const spx_refine_params *p) {
    spx_model_lock(m);
    spx_status st = model_refine(m, p);
    spx_model_unlock(m);
    return st;
}
