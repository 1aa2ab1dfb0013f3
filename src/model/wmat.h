/* wmat.h: a weight matrix as the forward pass sees it: [rows, cols] =
 * [out_features, in_features], either dense (F32/F16/BF16, row-major, a
 * view into a mapped file) or Group-quantized (spx_qtensor view). */
#ifndef SPX_WMAT_H
#define SPX_WMAT_H

#include "core/dtype.h"
#include "quant/qtensor.h"
#include <stdint.h>

typedef enum spx_wmat_kind { SPX_WM_DENSE = 0, SPX_WM_QUANT = 1 } spx_wmat_kind;

typedef struct spx_wmat {
    int64_t rows, cols;
    spx_wmat_kind kind;
    spx_dtype dtype;      /* DENSE: F32, F16 or BF16 */
    const void *data;     /* DENSE: rows * cols elements */
    spx_qtensor q;        /* QUANT */
    const struct spx_wmat_refine *ref; /* QUANT: its residual (refine/rmat.h), or NULL */
} spx_wmat;

/* Row r as float32 (dense: converted; quant: dequantized with outliers). */
void spx_wmat_row_f32(const spx_wmat *w, int64_t r, float *out);

/* Bytes the matrix occupies as stored (all components). */
uint64_t spx_wmat_bytes(const spx_wmat *w);

#endif
