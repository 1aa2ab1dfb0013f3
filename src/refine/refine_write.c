/* refine_write.c: one matrix's residual into a .refine (compress
 * --refine): built from the source rows in parallel and written as a
 * refine4 tensor (format/trdc.h). */
#include "refine/refine_write.h"
#include "format/trdc.h"

#include <stdlib.h>

#define BLOCK_ROWS 32 /* rows a thread reads and encodes at a time (even: rows 2b, 2b+1 share bytes) */

typedef struct {
    const spx_st_tensor *t;
    const spx_qtensor *q;
    spx_refine_q4buf *b;
    float *rows;      /* [threads][BLOCK_ROWS * cols] */
    spx_status *st;   /* [threads] */
    spx_err *errs;    /* [threads] */
} build_job;

static void build_task(void *arg, int tid, int nth) {
    build_job *j = arg;
    const int64_t R = j->q->rows, C = j->q->cols, nb = (R + BLOCK_ROWS - 1) / BLOCK_ROWS;
    float *w = j->rows + (size_t)tid * BLOCK_ROWS * (size_t)C;
    j->st[tid] = SPX_OK;
    for (int64_t k = tid; k < nb && j->st[tid] == SPX_OK; k += nth) {
        const int64_t r0 = k * BLOCK_ROWS, n = R - r0 < BLOCK_ROWS ? R - r0 : BLOCK_ROWS;
        spx_st_row_f32(j->t, r0 * C, n * C, w); /* rows r0 .. r0 + n - 1: consecutive elements */
        j->st[tid] = spx_refine_q4_set_rows(j->b, j->q, w, C, r0, n, &j->errs[tid]);
    }
}

spx_status spx_refine_write_tensor(spx_trdc_writer *wr, spx_pool *pool, const spx_st_tensor *t,
                                   const spx_qtensor *q, uint32_t base_crc32, uint64_t *bytes, spx_refine_q4buf *keep,
                                   spx_err *e) {
    spx_refine_q4buf b;
    SPX_TRY(spx_refine_q4buf_init(&b, q->rows, q->cols, 0, e));
    const int nth = spx_pool_size(pool);
    build_job j = {t, q, &b, malloc((size_t)nth * BLOCK_ROWS * (size_t)q->cols * sizeof(float)),
                   calloc((size_t)nth, sizeof(spx_status)), calloc((size_t)nth, sizeof(spx_err))};
    spx_status st = SPX_OK;
    if (!j.rows || !j.st || !j.errs) st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory for its residual", t->name);
    if (st == SPX_OK) {
        spx_pool_run(pool, build_task, &j);
        for (int k = 0; k < nth && st == SPX_OK; k++)
            if (j.st[k] != SPX_OK) {
                *e = j.errs[k];
                st = j.st[k];
            }
    }
    if (st == SPX_OK)
        st = spx_trdc_writer_add_refine(wr, t->name, q->rows, q->cols, b.v.col_stride, b.codes, b.scales, base_crc32, e);
    if (st == SPX_OK && bytes) *bytes += (uint64_t)q->cols * (uint64_t)b.v.col_stride + (uint64_t)q->rows * 4;
    free(j.rows);
    free(j.st);
    free(j.errs);
    if (st == SPX_OK && keep) *keep = b; /* the caller's now (bundles are built from it) */
    else spx_refine_q4buf_free(&b);
    return st;
}
