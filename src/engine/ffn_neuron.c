/* ffn_neuron.c: the neuron-wise MLP refinement of a decode step
 * (ffn_neuron.h, refine/bundle.h). */
#include "engine/ffn_neuron.h"
#include "refine/rmat.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int grow(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 1;
    void *n = realloc(*p, need);
    if (!n) return 0;
    *p = n;
    *cap = need;
    return 1;
}

static int64_t layer_n(const spx_bundle_layer *B) { return B->f32 ? B->f32->n : B->q4.n; }
static int64_t layer_h(const spx_bundle_layer *B) { return B->f32 ? B->f32->hidden : B->q4.hidden; }

const spx_bundle_layer *spx_ffn_neuron_layer(const spx_cpu_ctx *c, int64_t l, int64_t T) {
    const spx_refine_rt *rt = c->refine;
    if (T != 1 || !rt || rt->mlp != SPX_REFINE_MLP_NEURON || rt->kn <= 0 || !rt->bundles) return NULL;
    const spx_bundle_layer *B = &rt->bundles[l];
    return layer_n(B) > 0 ? B : NULL;
}

spx_status spx_ffn_neuron_save(spx_cpu_ctx *c, const spx_bundle_layer *B, const float *g, spx_err *e) {
    const int64_t I = layer_n(B);
    if (!grow((void **)&c->nrn, &c->nrn_cap, 2 * (size_t)I * sizeof(float)))
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory for the neuron refinement");
    memcpy(c->nrn, g, (size_t)I * sizeof(float));
    return SPX_OK;
}

/* h' = phi(g') * u' with the block's own SiLU (cpu/ops.c), so that a zero
 * correction gives h' == h exactly */
static float h_of(float g, float u) {
    spx_cpu_silu_mul(&g, &u, 1);
    return g;
}

static double row_dot_f32(const float *r, const float *x, int64_t H) {
    double acc = 0;
    for (int64_t ch = 0; ch < H; ch++) acc += (double)r[ch] * x[ch];
    return acc;
}

spx_status spx_ffn_neuron_select(spx_cpu_ctx *c, const spx_bundle_layer *B, const float *x, const float *u,
                                 const float *h, spx_err *e) {
    spx_refine_rt *rt = c->refine;
    const int64_t I = layer_n(B), H = layer_h(B);
    const int64_t cap = spx_refine_topk_max(I, SPX_REFINE_CHUNK, rt->kn);
    if (!grow((void **)&c->nsel, &c->nsel_cap, (size_t)cap * sizeof *c->nsel) ||
        !grow((void **)&c->nbun, &c->nbun_cap, 2 * (size_t)cap * sizeof *c->nbun))
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory for the neuron refinement");
    const int64_t n = spx_refine_topk(h, I, SPX_REFINE_CHUNK, rt->kn, NULL, c->nsel);
    const float *g = c->nrn;
    float *delta = c->nrn + I;
    const uint8_t **dp = c->nbun, **cdp = c->nbun + cap;
    c->n_nsel = n;
    rt->st.launches++;
    rt->st.selected += (uint64_t)n;
    if (B->f32) {
        const spx_bundle_f32 *F = B->f32;
        for (int64_t t = 0; t < n; t++) {
            const int64_t j = c->nsel[t];
            const float gp = g[j] + (float)row_dot_f32(F->gate + j * H, x, H);
            const float up = u[j] + (float)row_dot_f32(F->up + j * H, x, H);
            delta[j] = h_of(gp, up) - h[j];
        }
        rt->st.applied += (uint64_t)n;
        return SPX_OK;
    }
    const spx_bundle_q4 *Q = &B->q4;
    const uint8_t **bp = dp; /* the bundles first, then each replaced by its d part */
    if (Q->data)
        for (int64_t t = 0; t < n; t++) bp[t] = Q->data + (size_t)c->nsel[t] * (size_t)Q->stride;
    else /* the tier: one range per neuron; NULL where it missed */
        SPX_TRY(spx_tier_get_cols(rt->tier, Q->file_off, (uint64_t)Q->stride, (uint32_t)spx_bundle_bytes(H), c->nsel,
                                  n, bp, e));
    for (int64_t t = 0; t < n; t++) {
        const uint8_t *b = bp[t];
        if (!b) {
            cdp[t] = NULL;
            continue;
        }
        const int64_t j = c->nsel[t];
        const float gp = g[j] + spx_bundle_row_scale(b, H, 0) * rt->kern->dot(spx_bundle_part(b, H, SPX_BUNDLE_GATE), x, H);
        const float up = u[j] + spx_bundle_row_scale(b, H, 1) * rt->kern->dot(spx_bundle_part(b, H, SPX_BUNDLE_UP), x, H);
        delta[j] = h_of(gp, up) - h[j];
        dp[t] = spx_bundle_part(b, H, SPX_BUNDLE_D);
        cdp[t] = spx_bundle_part(b, H, SPX_BUNDLE_CD);
        rt->st.applied++;
    }
    return SPX_OK;
}

typedef struct {
    const spx_cpu_ctx *c;
    const spx_bundle_layer *B;
    const float *h;
    float *y;
} apply_job;

/* y[r] += d_scale[r] * sum_j delta_j d_j[r], then += cd_scale[r] * sum_j
 * h_j c^d_j[r], on this thread's rows (any split gives the same bits) */
static void apply_task(void *arg, int tid, int nth) {
    const apply_job *a = arg;
    const spx_cpu_ctx *c = a->c;
    const spx_bundle_layer *B = a->B;
    const int64_t I = layer_n(B), H = layer_h(B), n = c->n_nsel;
    const float *delta = c->nrn + I;
    int64_t r0, r1;
    spx_pool_range(H, tid, nth, 8, &r0, &r1);
    if (r0 >= r1) return;
    if (B->f32) {
        const spx_refine_f32 d = {H, I, B->f32->d}, cd = {H, I, B->f32->cd};
        spx_refine_f32_apply(&d, c->nsel, n, delta, a->y, r0, r1);
        spx_refine_f32_apply(&cd, c->nsel, n, a->h, a->y, r0, r1);
        return;
    }
    const spx_bundle_q4 *Q = &B->q4;
    const int64_t cap = spx_refine_topk_max(I, SPX_REFINE_CHUNK, c->refine->kn); /* as select laid it out */
    const spx_refine_q4 d = {H, I, spx_refine_col_bytes(H), Q->stride, NULL, Q->d_scales};
    const spx_refine_q4 cd = {H, I, spx_refine_col_bytes(H), Q->stride, NULL, Q->cd_scales};
    c->refine->kern->apply(&d, c->nsel, c->nbun, n, delta, a->y, r0, r1);
    c->refine->kern->apply(&cd, c->nsel, c->nbun + cap, n, a->h, a->y, r0, r1);
}

void spx_ffn_neuron_apply(spx_cpu_ctx *c, const spx_bundle_layer *B, const float *h, float *y) {
    if (c->n_nsel <= 0) return;
    apply_job a = {c, B, h, y};
    spx_pool_run(c->pool, apply_task, &a);
}
