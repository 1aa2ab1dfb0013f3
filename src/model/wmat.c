/* wmat.c: row access for every weight storage kind. */
#include "model/wmat.h"
#include "core/half.h"
#include "quant/g32.h"

#include <string.h>

void spx_wmat_row_f32(const spx_wmat *w, int64_t r, float *out) {
    int64_t n = w->cols;
    if (w->kind == SPX_WM_QUANT) {
        spx_q_dequant_row_f32(&w->q, r, out);
        return;
    }
    switch (w->dtype) {
    case SPX_DT_F32:
        memcpy(out, (const uint8_t *)w->data + (size_t)(r * n) * 4, (size_t)n * sizeof(float));
        break;
    case SPX_DT_F16: { /* safetensors data need not be 2-byte aligned: memcpy loads */
        const uint8_t *p = (const uint8_t *)w->data + (size_t)(r * n) * 2;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = spx_f16_to_f32(h);
        }
        break;
    }
    case SPX_DT_BF16: {
        const uint8_t *p = (const uint8_t *)w->data + (size_t)(r * n) * 2;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = spx_bf16_to_f32(h);
        }
        break;
    }
    default:
        memset(out, 0, (size_t)n * sizeof(float)); /* loader rejects other dtypes */
        break;
    }
}

uint64_t spx_wmat_bytes(const spx_wmat *w) {
    if (w->kind == SPX_WM_DENSE) return (uint64_t)w->rows * (uint64_t)w->cols * spx_dtype_size(w->dtype);
    const spx_qtensor *q = &w->q;
    if (q->bits <= 0 || q->group <= 0) return 0;
    return (uint64_t)spx_q_codes_bytes(q->rows, q->cols, q->bits, q->layout) +
           (uint64_t)spx_q_scales_bytes(q->rows, q->cols, q->group, q->layout) +
           (uint64_t)spx_q_zeros_bytes(q->rows, q->cols, q->group, q->layout) +
           (uint64_t)q->n_outliers * (4 + 2 * (uint64_t)q->rows);
}
