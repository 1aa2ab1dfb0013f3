/* bundle_write.c: neuron bundles into a .refine during compression
 * (bundle_write.h). */
#include "refine/bundle_write.h"
#include "format/trdc.h"
#include "model/arch.h"
#include "refine/bundle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the parts a layer's bundles are built from */
enum { P_GATE, P_UP, P_GATE_UP, P_DOWN, P_COUNT };
static const spx_slot part_slot[P_COUNT] = {SPX_SL_GATE, SPX_SL_UP, SPX_SL_GATE_UP, SPX_SL_DOWN};

typedef struct {
    char name[P_COUNT][256];  /* "" for a part this layer does not have */
    spx_refine_q4buf res[P_COUNT];
    uint8_t have[P_COUNT];
    uint8_t done;
} layer_parts;

struct spx_bundle_collect {
    const spx_config *cfg;
    layer_parts *L; /* [n_layers] */
    int64_t written;
};

spx_status spx_bundle_collect_new(const spx_config *cfg, spx_bundle_collect **out, spx_err *e) {
    *out = NULL;
    spx_bundle_collect *c = calloc(1, sizeof *c);
    if (c) c->L = calloc((size_t)(cfg->n_layers ? cfg->n_layers : 1), sizeof *c->L);
    if (!c || !c->L) {
        free(c);
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    }
    c->cfg = cfg;
    for (int64_t l = 0; l < cfg->n_layers; l++) {
        if (cfg->ffn[l] != SPX_FFN_SWIGLU) continue;
        for (int p = 0; p < P_COUNT; p++)
            if (spx_slot_numel(cfg, l, part_slot[p]) > 0)
                spx_slot_tensor_name(cfg, l, part_slot[p], c->L[l].name[p], sizeof c->L[l].name[p]);
    }
    *out = c;
    return SPX_OK;
}

void spx_bundle_collect_free(spx_bundle_collect *c) {
    if (!c) return;
    for (int64_t l = 0; l < c->cfg->n_layers; l++)
        for (int p = 0; p < P_COUNT; p++) spx_refine_q4buf_free(&c->L[l].res[p]);
    free(c->L);
    free(c);
}

static int find(const spx_bundle_collect *c, const char *name, int64_t *layer, int *part) {
    for (int64_t l = 0; l < c->cfg->n_layers; l++)
        for (int p = 0; p < P_COUNT; p++)
            if (c->L[l].name[p][0] && !strcmp(c->L[l].name[p], name)) {
                *layer = l;
                *part = p;
                return 1;
            }
    return 0;
}

int spx_bundle_collect_wants(const spx_bundle_collect *c, const char *name) {
    int64_t l;
    int p;
    return c && find(c, name, &l, &p);
}

int64_t spx_bundle_collect_layers(const spx_bundle_collect *c) { return c ? c->written : 0; }

static spx_status write_layer(spx_bundle_collect *c, struct spx_trdc_writer *wr, const spx_st *st, int64_t l,
                              uint64_t *bytes, spx_err *e) {
    layer_parts *P = &c->L[l];
    const int fused = P->name[P_GATE_UP][0] != 0;
    const spx_refine_q4 *down = &P->res[P_DOWN].v;
    const spx_refine_q4 *gate = fused ? &P->res[P_GATE_UP].v : &P->res[P_GATE].v;
    const spx_refine_q4 *up = fused ? &P->res[P_GATE_UP].v : &P->res[P_UP].v;
    const int64_t H = down->rows, I = down->cols;
    const spx_st_tensor *td = spx_st_find(st, P->name[P_DOWN]);
    if (!td || td->numel != H * I)
        return spx_fail(e, SPX_ERR_FORMAT, "bundles: the source's '%s' is missing or not [%lld, %lld]", P->name[P_DOWN],
                        (long long)H, (long long)I);
    float *w = malloc((size_t)H * (size_t)I * sizeof *w);
    if (!w) return spx_fail(e, SPX_ERR_NOMEM, "bundles: out of memory for '%s'", P->name[P_DOWN]);
    spx_st_row_f32(td, 0, H * I, w);
    spx_bundle_buf b;
    spx_status s = spx_bundle_build(&b, gate, 0, up, fused ? I : 0, down, w, 0, e);
    free(w);
    if (s != SPX_OK) return s;
    char name[300];
    snprintf(name, sizeof name, "%s.bundles", P->name[P_DOWN]);
    s = spx_trdc_writer_add_bundles(wr, name, I, H, b.v.stride, b.data, b.scales, e);
    if (s == SPX_OK) {
        if (bytes) *bytes += (uint64_t)I * (uint64_t)b.v.stride + (uint64_t)H * 8;
        c->written++;
    }
    spx_bundle_buf_free(&b);
    return s;
}

spx_status spx_bundle_collect_add(spx_bundle_collect *c, struct spx_trdc_writer *wr, const spx_st *st, const char *name,
                                  spx_refine_q4buf *res, uint64_t *bytes, spx_err *e) {
    int64_t l;
    int p;
    if (!find(c, name, &l, &p)) {
        spx_refine_q4buf_free(res);
        return SPX_OK;
    }
    layer_parts *P = &c->L[l];
    spx_refine_q4buf_free(&P->res[p]);
    P->res[p] = *res;
    memset(res, 0, sizeof *res);
    P->have[p] = 1;
    int complete = !P->done;
    for (int k = 0; k < P_COUNT; k++) complete &= !P->name[k][0] || P->have[k];
    if (!complete) return SPX_OK;
    P->done = 1;
    spx_status s = write_layer(c, wr, st, l, bytes, e);
    for (int k = 0; k < P_COUNT; k++) spx_refine_q4buf_free(&P->res[k]);
    return s;
}
