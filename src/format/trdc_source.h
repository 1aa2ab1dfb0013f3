/* trdc_source.h: a .trdc file as a model's weight, config and tokenizer
 * source (the model loader's view of src/format/trdc.h). */
#ifndef SPX_TRDC_SOURCE_H
#define SPX_TRDC_SOURCE_H

#include "core/dtype.h"
#include "core/err.h"
#include "quant/qtensor.h"

struct spx_model;
struct spx_trdc;

typedef struct spx_trdc_ref {
    int quant;
    spx_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;
    spx_qtensor q;
} spx_trdc_ref;

/* Opens path as a .trdc: validates it, parses the embedded config and
 * tokenizer into m (m->cfg, m->tok, m->trdc). */
spx_status spx_trdc_source_open(struct spx_model *m, const char *path, spx_err *e);
void spx_trdc_source_close(struct spx_model *m);
int spx_trdc_source_find(const struct spx_trdc *f, const char *name, spx_trdc_ref *out);

#endif
