/* trdc_source.c: binds a .trdc file to a model (see trdc_source.h). */
#include "format/trdc_source.h"
#include "format/trdc.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

spx_status spx_trdc_source_open(spx_model *m, const char *path, spx_err *e) {
    SPX_TRY(spx_trdc_open(path, &m->trdc, e));
    if (spx_trdc_contents(m->trdc) != SPX_TRDC_CONTENTS_MODEL)
        return spx_fail(e, SPX_ERR_ARG, "%s is a .refine file (weight refinement), not a model: give the model with -m "
                                        "and this file with --refine", path);
    char *cfg = spx_trdc_config_json(m->trdc);
    if (!cfg) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", path);
    char label[1100];
    snprintf(label, sizeof label, "%s (embedded config.json)", path);
    spx_status st = spx_config_parse(cfg, strlen(cfg), label, &m->cfg, e);
    free(cfg);
    if (st != SPX_OK) return st;
    const char *tj = spx_trdc_tokenizer_json(m->trdc), *tc = spx_trdc_tokenizer_config_json(m->trdc);
    if (tj) {
        snprintf(label, sizeof label, "%s (embedded tokenizer.json)", path);
        SPX_TRY(spx_tok_load(tj, strlen(tj), tc, tc ? strlen(tc) : 0, label, &m->tok, e));
    }
    return SPX_OK;
}

void spx_trdc_source_close(spx_model *m) {
    spx_trdc_close(m->trdc);
    m->trdc = NULL;
}

int spx_trdc_source_find(const spx_trdc *f, const char *name, spx_trdc_ref *out) {
    const spx_trdc_tensor *t = spx_trdc_find(f, name);
    if (!t) return 0;
    memset(out, 0, sizeof *out);
    out->quant = t->kind == SPX_TRDC_QUANT;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    out->data = t->data;
    out->q = t->q;
    return 1;
}
