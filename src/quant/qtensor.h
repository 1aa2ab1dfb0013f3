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
 * given by spx_q_codes_per_byte(); see src/quant/g32.h.
 *
 * Layouts. The above is SPX_Q_ROWS (row-major; .trdc version 1 and any
 * matrix the tiled layout cannot hold). SPX_Q_TILED ("tile16x128" in a
 * .trdc, version 2; docs/trdc.md): for bits 4, group 32, cols a multiple
 * of 128. Rows go in tiles of 16 (the last one zero-padded), columns in
 * items of 128 (4 groups); per (tile T, item k), ti = T * items + k, the
 * bytes are stored in the order the GPU's int8 MMA fragments read them
 * (lane l = 4 r + t takes rows r and r + 8 of the tile, group t):
 *   codes  + 1024 ti: 64 bytes per row: row r < 8 at 64 r, row r + 8 at
 *          512 + 64 r, each its 4 groups' 16 bytes in order (a group's
 *          bytes as above: code k low, code k + 16 high nibble)
 *   scales + 64 ti (fp16): slot 2 (4 r + t) row r, 2 (4 r + t) + 1 row r + 8
 *   zeros  + 32 ti: byte 4 r + t: row r low nibble, row r + 8 high nibble
 * So one row's 128 columns are one 64-byte line, and a tile's item is two
 * coalesced 512-byte reads on the GPU. Outliers stay row-major. Use the
 * accessors below rather than the row formulas when a matrix may be tiled. */
#ifndef SPX_QTENSOR_H
#define SPX_QTENSOR_H

#include <stddef.h>
#include <stdint.h>

enum { SPX_Q_ROWS = 0, SPX_Q_TILED = 1 };
#define SPX_Q_TILE_ROWS 16
#define SPX_Q_TILE_COLS 128

typedef struct spx_qtensor {
    int64_t rows, cols;
    int32_t bits, group;
    int64_t n_outliers;
    const uint8_t *codes;        /* rows * codes_row_bytes */
    const uint16_t *scales;      /* fp16 [rows, n_groups] */
    const uint8_t *zeros;        /* rows * zeros_row_bytes */
    const int32_t *outlier_idx;  /* [n_outliers], strictly increasing, < cols */
    const uint16_t *outlier_val; /* fp16 [rows, n_outliers] */
    int32_t layout;              /* SPX_Q_ROWS (0) or SPX_Q_TILED */
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

/* Whether a matrix of these parameters can be stored SPX_Q_TILED. */
static inline int spx_q_tiled_ok(int bits, int group, int64_t cols) {
    return bits == 4 && group == 32 && cols > 0 && cols % SPX_Q_TILE_COLS == 0;
}
/* Rows as stored: a multiple of 16 when tiled (the padding is zeros). */
static inline int64_t spx_q_stored_rows(int64_t rows, int layout) {
    return layout == SPX_Q_TILED ? (rows + SPX_Q_TILE_ROWS - 1) / SPX_Q_TILE_ROWS * SPX_Q_TILE_ROWS : rows;
}

/* Bytes of the codes, scales and zeros components in a layout. */
static inline int64_t spx_q_codes_bytes(int64_t rows, int64_t cols, int bits, int layout) {
    return spx_q_stored_rows(rows, layout) * spx_q_codes_row_bytes(cols, bits);
}
static inline int64_t spx_q_scales_bytes(int64_t rows, int64_t cols, int group, int layout) {
    return spx_q_stored_rows(rows, layout) * spx_q_groups(cols, group) * 2;
}
static inline int64_t spx_q_zeros_bytes(int64_t rows, int64_t cols, int group, int layout) {
    return spx_q_stored_rows(rows, layout) * spx_q_zeros_row_bytes(cols, group);
}

/* Group g of row r, in either layout: its codes (group / cpb bytes), its
 * fp16 scale and its zero point. */
static inline int64_t spx_q__tiled_item(const spx_qtensor *q, int64_t r, int64_t g) {
    return (r >> 4) * (q->cols / SPX_Q_TILE_COLS) + (g >> 2); /* ti = tile * items + item */
}
static inline int64_t spx_q__tiled_slot(const spx_qtensor *q, int64_t r, int64_t g) {
    return (spx_q__tiled_item(q, r, g) << 5) + ((r & 7) << 2) + (g & 3); /* 32 ti + lane */
}
static inline const uint8_t *spx_q_group_codes(const spx_qtensor *q, int64_t r, int64_t g) {
    if (q->layout == SPX_Q_TILED) /* 1024 ti + 512 (r / 8 % 2) + 64 (r % 8) + 16 (g % 4) */
        return q->codes + (spx_q__tiled_item(q, r, g) << 10) + ((r & 15) << 6) + ((g & 3) << 4);
    return q->codes + r * spx_q_codes_row_bytes(q->cols, q->bits) + g * (q->group / spx_q_codes_per_byte(q->bits));
}
static inline uint16_t spx_q_group_scale(const spx_qtensor *q, int64_t r, int64_t g) {
    if (q->layout == SPX_Q_TILED) return q->scales[2 * spx_q__tiled_slot(q, r, g) + ((r >> 3) & 1)];
    return q->scales[r * spx_q_groups(q->cols, q->group) + g];
}
static inline int spx_q_group_zero(const spx_qtensor *q, int64_t r, int64_t g) {
    if (q->layout == SPX_Q_TILED) return (q->zeros[spx_q__tiled_slot(q, r, g)] >> ((r & 8) >> 1)) & 0xf;
    return (q->zeros[r * spx_q_zeros_row_bytes(q->cols, q->group) + (g >> 1)] >> ((g & 1) * 4)) & 0xf;
}

#endif
