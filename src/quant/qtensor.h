/* qtensor.h: the in-memory view of a Group-quantized matrix, as stored in
 * a .trdc file (pointers into the map; nothing owned).
 *
 * Logical matrix W: [rows, cols] = [out_features, in_features]. Groups of
 * `group` consecutive input columns of one row share an fp16 scale s and a
 * `bits`-bit zero point z; w_hat = (q - z) * s. cols is a multiple of group.
 *
 * Outlier input channels: n_outliers columns (sorted int32 indices) are
 * kept exactly as fp16 in outlier_val[rows, n_outliers] (row-major, so a
 * row's outliers are contiguous). They are excluded from their groups'
 * min/max, and their dense slot holds the code q = z, which dequantizes to
 * exactly 0, so   W x = dense(W) x + sum_j outlier_val[r, j] * x[idx[j]]
 * with groups still aligned to `group` columns (no gather of x needed).
 *
 * Packing for bits = 4 (the default): each group is group/2 bytes; byte k of
 * a group holds code k in the low nibble and code k + group/2 in the high
 * nibble (for G32: codes k and k+16). Zero points: two per byte, group 2i
 * in the low nibble and group 2i+1 in the high nibble of byte i of the row
 * (rows padded to a whole byte). Scales: fp16 [rows, n_groups].
 * For bits 2 and 3 (experiments): codes are stored in 4 / 2 per byte as
 * given by spx_q_codes_per_byte(); see src/quant/g32.h. */
#ifndef SPX_QTENSOR_H
#define SPX_QTENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef struct spx_qtensor {
    int64_t rows, cols;
    int32_t bits, group;
    int64_t n_outliers;
    const uint8_t *codes;        /* rows * codes_row_bytes */
    const uint16_t *scales;      /* fp16 [rows, n_groups] */
    const uint8_t *zeros;        /* rows * zeros_row_bytes */
    const int32_t *outlier_idx;  /* [n_outliers], strictly increasing, < cols */
    const uint16_t *outlier_val; /* fp16 [rows, n_outliers] */
} spx_qtensor;

/* Codes per byte: 4 bits -> 2, 3 bits -> 2 (a nibble each), 2 bits -> 4. */
static inline int spx_q_codes_per_byte(int bits) { return bits <= 2 ? 4 : 2; }
static inline int64_t spx_q_groups(int64_t cols, int group) { return cols / group; }
static inline int64_t spx_q_codes_row_bytes(int64_t cols, int bits) {
    return cols / spx_q_codes_per_byte(bits);
}
static inline int64_t spx_q_zeros_row_bytes(int64_t cols, int group) {
    return (spx_q_groups(cols, group) + 1) / 2;
}

#endif
