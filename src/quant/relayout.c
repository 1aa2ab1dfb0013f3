/* relayout.c: a .trdc rewritten with its matrices in the other layout
 * (compress.h, spx_relayout). Files compressed before version 2 get the
 * tiled layout, and tiled files can go back to version 1 for older
 * readers, without the source checkpoint. */
#include "core/util.h"
#include "format/trdc.h"
#include "quant/compress.h"
#include "quant/g32.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

spx_status spx_relayout(const char *in_path, const char *out_path, int row_major,
                        void (*progress)(void *user, size_t done, size_t total, const char *name), void *user,
                        size_t *n_changed, spx_err *e) {
    if (n_changed) *n_changed = 0;
    spx_trdc *f = NULL;
    SPX_TRY(spx_trdc_open(in_path, &f, e));
    spx_status st = spx_trdc_verify(f, NULL, NULL, NULL, NULL, e);
    spx_trdc_writer *w = NULL;
    char *cfg = NULL, *qs = NULL, *src = NULL;
    if (st == SPX_OK) st = spx_trdc_writer_open(out_path, &w, e);
    size_t n = spx_trdc_count(f);
    for (size_t i = 0; st == SPX_OK && i < n; i++) {
        const spx_trdc_tensor *t = spx_trdc_at(f, i);
        if (t->kind == SPX_TRDC_DENSE) {
            st = spx_trdc_writer_add_dense(w, t->name, t->dtype, t->ndim, t->shape, t->data, (size_t)t->nbytes, e);
        } else {
            spx_qtensor nq;
            void *mem;
            st = spx_q_as_layout(&t->q, row_major, &nq, &mem, e);
            if (st == SPX_OK && mem && n_changed) ++*n_changed;
            if (st == SPX_OK) st = spx_trdc_writer_add_quant(w, t->name, &nq, t->kappa, t->r, e);
            free(mem);
        }
        if (st == SPX_OK && progress) progress(user, i + 1, n, t->name);
    }
    if (st == SPX_OK) {
        cfg = spx_trdc_config_json(f);
        qs = cJSON_PrintUnformatted(spx_trdc_quant_settings(f));
        src = spx_trdc_source(f) ? cJSON_PrintUnformatted(spx_trdc_source(f)) : NULL;
        if (!cfg || !qs || (spx_trdc_source(f) && !src)) st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", out_path);
    }
    if (st == SPX_OK) {
        st = spx_trdc_writer_finish(w, cfg, spx_trdc_tokenizer_json(f), spx_trdc_tokenizer_config_json(f), qs, src, e);
        w = NULL; /* finish frees the writer, also on failure */
    }
    if (w) spx_trdc_writer_abort(w);
    free(cfg);
    free(qs);
    free(src);
    spx_trdc_close(f);
    return st;
}
