/* bundle.c: neuron bundles, packing and building (bundle.h). */
#include "refine/bundle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

float spx_bundle_row_scale(const uint8_t *b, int64_t H, int k) {
    float s;
    memcpy(&s, b + 4 * spx_bundle_part_bytes(H) + 4 * k, 4);
    return s;
}

static void pack_part(const int8_t *q, int64_t H, int64_t P, uint8_t *out) {
    memset(out, 0x88, (size_t)P);
    for (int64_t c = 0; c < H; c++) {
        const uint8_t nib = (uint8_t)(q[c] + SPX_REFINE_ZERO) & 0xf;
        uint8_t *byte = out + (c >> 1);
        *byte = (c & 1) ? (uint8_t)((*byte & 0x0f) | (nib << 4)) : (uint8_t)((*byte & 0xf0) | nib);
    }
}

void spx_bundle_pack(int64_t H, int64_t stride, const int8_t *gate, const int8_t *up, const int8_t *cd,
                     const int8_t *d, float gate_scale, float up_scale, uint8_t *out) {
    const int64_t P = spx_bundle_part_bytes(H);
    const int8_t *parts[4] = {gate, up, cd, d};
    for (int k = 0; k < 4; k++) pack_part(parts[k], H, P, out + k * P);
    memset(out + 4 * P, 0, (size_t)(stride - 4 * P));
    memcpy(out + 4 * P, &gate_scale, 4);
    memcpy(out + 4 * P + 4, &up_scale, 4);
}

void spx_bundle_buf_free(spx_bundle_buf *b) {
    if (!b) return;
    free(b->data);
    free(b->scales);
    memset(b, 0, sizeof *b);
}

static spx_status check_shapes(int64_t gr, int64_t gc, int64_t gate_row0, int64_t ur, int64_t uc, int64_t up_row0,
                               int64_t dr, int64_t dc, spx_err *e) {
    const int64_t H = dr, I = dc;
    if (H < 1 || I < 1 || H > INT32_MAX || I > INT32_MAX || gc != H || uc != H || gate_row0 < 0 || up_row0 < 0 ||
        gate_row0 + I > gr || up_row0 + I > ur)
        return spx_fail(e, SPX_ERR_ARG,
                        "bundles: gate [%lld, %lld] rows from %lld, up [%lld, %lld] rows from %lld and down [%lld, %lld] "
                        "do not form one MLP (expected gate/up [>= I, H], down [H, I])",
                        (long long)gr, (long long)gc, (long long)gate_row0, (long long)ur, (long long)uc,
                        (long long)up_row0, (long long)dr, (long long)dc);
    return SPX_OK;
}

spx_status spx_bundle_build(spx_bundle_buf *b, const spx_refine_q4 *gate, int64_t gate_row0, const spx_refine_q4 *up,
                            int64_t up_row0, const spx_refine_q4 *down, const float *wdown, int64_t stride, spx_err *e) {
    memset(b, 0, sizeof *b);
    SPX_TRY(check_shapes(gate->rows, gate->cols, gate_row0, up->rows, up->cols, up_row0, down->rows, down->cols, e));
    const int64_t H = down->rows, I = down->cols;
    if (stride == 0) stride = spx_bundle_stride(H);
    if (stride < spx_bundle_bytes(H))
        return spx_fail(e, SPX_ERR_ARG, "bundles: stride %lld below the %lld bytes of a bundle", (long long)stride,
                        (long long)spx_bundle_bytes(H));
    for (int64_t i = 0; i < H * I; i++)
        if (!isfinite(wdown[i]))
            return spx_fail(e, SPX_ERR_ARG, "bundles: the down weight [%lld, %lld] is not finite", (long long)(i / I),
                            (long long)(i % I));
    int8_t *dq = malloc((size_t)H * (size_t)I), *rowq = malloc((size_t)I), *tmp = malloc(4 * (size_t)H);
    b->data = malloc((size_t)I * (size_t)stride);
    b->scales = malloc(2 * (size_t)H * sizeof(float));
    if (!dq || !rowq || !tmp || !b->data || !b->scales) {
        free(dq), free(rowq), free(tmp);
        spx_bundle_buf_free(b);
        return spx_fail(e, SPX_ERR_NOMEM, "bundles: out of memory for %lld neurons of %lld", (long long)I, (long long)H);
    }
    /* d: row r's scale by the MSE search over W_down[r, :], codes to [j][r] */
    for (int64_t r = 0; r < H; r++) {
        const float *w = wdown + (size_t)r * (size_t)I;
        const float s = spx_refine_q4_row_scale(w, I);
        spx_refine_q4_row_codes(w, I, s, rowq);
        b->scales[r] = s;
        for (int64_t j = 0; j < I; j++) dq[(size_t)j * (size_t)H + (size_t)r] = rowq[j];
    }
    memcpy(b->scales + H, down->scales, (size_t)H * sizeof(float));
    int8_t *qg = tmp, *qu = tmp + H, *qc = tmp + 2 * H;
    for (int64_t j = 0; j < I; j++) {
        for (int64_t c = 0; c < H; c++) {
            qg[c] = (int8_t)spx_refine_code(spx_refine_q4_col(gate, c), gate_row0 + j);
            qu[c] = (int8_t)spx_refine_code(spx_refine_q4_col(up, c), up_row0 + j);
        }
        const uint8_t *dcol = spx_refine_q4_col(down, j);
        for (int64_t r = 0; r < H; r++) qc[r] = (int8_t)spx_refine_code(dcol, r);
        spx_bundle_pack(H, stride, qg, qu, qc, dq + (size_t)j * (size_t)H, gate->scales[gate_row0 + j],
                        up->scales[up_row0 + j], b->data + (size_t)j * (size_t)stride);
    }
    free(dq), free(rowq), free(tmp);
    b->v = (spx_bundle_q4){I, H, stride, b->data, b->scales, b->scales + H, 0};
    return SPX_OK;
}

void spx_bundle_f32_free(spx_bundle_f32 *b) {
    if (!b) return;
    free(b->gate);
    free(b->up);
    free(b->cd);
    free(b->d);
    memset(b, 0, sizeof *b);
}

spx_status spx_bundle_f32_build(spx_bundle_f32 *b, const spx_refine_f32 *gate, int64_t gate_row0,
                                const spx_refine_f32 *up, int64_t up_row0, const spx_refine_f32 *down,
                                const float *wdown, spx_err *e) {
    memset(b, 0, sizeof *b);
    SPX_TRY(check_shapes(gate->rows, gate->cols, gate_row0, up->rows, up->cols, up_row0, down->rows, down->cols, e));
    const int64_t H = down->rows, I = down->cols;
    const size_t n = (size_t)H * (size_t)I * sizeof(float);
    b->n = I;
    b->hidden = H;
    b->gate = malloc(n), b->up = malloc(n), b->cd = malloc(n), b->d = malloc(n);
    if (!b->gate || !b->up || !b->cd || !b->d) {
        spx_bundle_f32_free(b);
        return spx_fail(e, SPX_ERR_NOMEM, "bundles: out of memory for %lld exact neurons", (long long)I);
    }
    /* spx_refine_f32 is column-major: R[r, i] at data[i * rows + r] */
    for (int64_t j = 0; j < I; j++)
        for (int64_t c = 0; c < H; c++) {
            b->gate[j * H + c] = gate->data[c * gate->rows + gate_row0 + j];
            b->up[j * H + c] = up->data[c * up->rows + up_row0 + j];
            b->cd[j * H + c] = down->data[j * H + c];
            b->d[j * H + c] = wdown[c * I + j];
        }
    return SPX_OK;
}
