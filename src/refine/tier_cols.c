/* tier_cols.c: a matrix's selected residual columns through the tier
 * (rmat.h spx_tier_get_cols): one tier batch per matrix and launch. */
#include "refine/rmat.h"
#include "refine/tier.h"

#include <stdlib.h>

#define STACK_COLS 2048 /* batches up to this many columns need no allocation */

spx_status spx_tier_get_cols(struct spx_tier *t, uint64_t file_off, uint64_t col_stride, uint32_t col_bytes,
                             const int32_t *sel, int64_t n, const uint8_t **out, spx_err *e) {
    if (n <= 0) return SPX_OK;
    uint64_t off_s[STACK_COLS];
    uint32_t len_s[STACK_COLS];
    uint64_t *off = off_s;
    uint32_t *len = len_s;
    if (n > STACK_COLS) {
        off = malloc((size_t)n * sizeof *off);
        len = malloc((size_t)n * sizeof *len);
        if (!off || !len) {
            free(off == off_s ? NULL : off);
            free(len == len_s ? NULL : len);
            return spx_fail(e, SPX_ERR_NOMEM, "out of memory for %lld column requests", (long long)n);
        }
    }
    for (int64_t j = 0; j < n; j++) {
        off[j] = file_off + (uint64_t)sel[j] * col_stride;
        len[j] = col_bytes;
    }
    spx_status st = spx_tier_get_many(t, (size_t)n, off, len, out, e);
    if (off != off_s) free(off);
    if (len != len_s) free(len);
    return st;
}
