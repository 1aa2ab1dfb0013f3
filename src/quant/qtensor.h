/* qtensor.h: the in-memory view of a Group-quantized matrix, as stored in
 * a .trdc file (pointers into the map; nothing owned).
 *
 * Logical matrix W: [rows, cols] = [out_features, in_features]. Groups of
 * `group` consecutive input columns of one row share an fp16 scale s and a
 * zero point z (0 <= z < 2^bits); w_hat = (q - z) * s. cols is a multiple
 * of group.
 *
 * Outlier input channels: n_outliers columns (sorted int32 indices) are
 * kept exactly as fp16 in outlier_val[rows, n_outliers] (row-major, so a
 * row's outliers are contiguous). They are excluded from their groups'
 * min/max, and their dense slot holds the code q = z, which dequantizes to
 * exactly 0, so   W x = dense(W) x + sum_j outlier_val[r, j] * x[idx[j]]
 * with groups still aligned to `group` columns (no gather of x needed).
 *
 * Zero points: one nibble each for every width, two per byte, group 2i in
 * the low nibble and group 2i+1 in the high nibble of byte i of the row
 * (rows padded to a whole byte). Scales: fp16 [rows, n_groups].
 *
 * Blocks. A group of G columns (G a multiple of 32; 4-bit experiments
 * also use smaller groups, which have no blocks) is cut into G / 32
 * blocks of 32 codes: block i of group g is block b = g * G / 32 + i of
 * the row, and holds two halves of 16,
 *     lo: group columns 16 i + m,   hi: group columns G/2 + 16 i + m,
 * m = 0..15 (for G32: lo = columns 0..15, hi = 16..31 of the group). This
 * is also the order of the CPU kernels' int8 activation blocks.
 *
 * Codes of a row (SPX_Q_ROWS), by width (docs/trdc.md section 2.3):
 *   bits 4: per group G/2 bytes; byte k holds code k in the low nibble and
 *     code k + G/2 in the high nibble (G32: codes k and k + 16), i.e. the
 *     16 bytes of block i are its lo codes (low nibbles) and hi codes
 *     (high nibbles).
 *   bits 2 and 3 (.trdc version 3): the row's blocks go in items of 4
 *     (item j = blocks 4j .. 4j + 3; a last partial item is padded with
 *     blocks of code 0, which readers never use as weights). In an item,
 *     block beta = 2 pi + lambda (pair pi, lane lambda) half h (0 lo, 1
 *     hi) position m is code V = 2 pi + h at position p = 16 lambda + m
 *     (V, p: 4 x 32 codes), and
 *       bits 2: 32 bytes; byte p holds code V at bits 2V .. 2V+1;
 *       bits 3: 48 bytes, X[32] then Y[16]; X[p] bits 0-2 = code V0, bits
 *         3-5 = code V1, bits 6-7 = code V2 >> 1; nibble p of Y (p < 16:
 *         the low nibble of Y[p], else the high nibble of Y[p - 16]): bit
 *         0 = code V2 & 1, bits 1-3 = code V3.
 *     Why: an AVX2 register of 32 codes pairs the same half of blocks 2 pi
 *     and 2 pi + 1 (the int8 activation layout of qkernels_avx2.c), so an
 *     item unpacks with whole-register shifts and masks: 2-bit, one
 *     32-byte load and 7 operations for 128 codes; 3-bit, a 32-byte and a
 *     16-byte broadcast load and 11 operations (4-bit: two loads and 6).
 *     Versions 1 and 2 of the format stored bits 2 and 3 in the 4-bit
 *     group order (4 and 2 codes per byte); the reader repacks those
 *     (spx_q_repack_legacy).
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
#define SPX_Q_ITEM_COLS 128 /* bits 2 and 3: columns per item (4 blocks of 32) */

typedef struct spx_qtensor {
    int64_t rows, cols;
    int32_t bits, group;
    int64_t n_outliers;
    const uint8_t *codes;        /* stored rows * spx_q_codes_row_bytes */
    const uint16_t *scales;      /* fp16 [rows, n_groups] */
    const uint8_t *zeros;        /* rows * zeros_row_bytes */
    const int32_t *outlier_idx;  /* [n_outliers], strictly increasing, < cols */
    const uint16_t *outlier_val; /* fp16 [rows, n_outliers] */
    int32_t layout;              /* SPX_Q_ROWS (0) or SPX_Q_TILED */
} spx_qtensor;

static inline int64_t spx_q_groups(int64_t cols, int group) { return cols / group; }
/* Items of 128 columns a row of bits 2 or 3 takes (the last may be padded). */
static inline int64_t spx_q_items(int64_t cols) { return (cols + SPX_Q_ITEM_COLS - 1) / SPX_Q_ITEM_COLS; }
/* Bytes of one item: 32 for bits 2, 48 for bits 3. */
static inline int64_t spx_q_item_bytes(int bits) { return 16 * (int64_t)bits; }
/* Bytes of one row's codes: cols / 2 for bits 4; whole items for 2 and 3
 * (cols * bits / 8 when cols % 128 == 0). */
static inline int64_t spx_q_codes_row_bytes(int64_t cols, int bits) {
    return bits == 4 ? cols / 2 : spx_q_items(cols) * spx_q_item_bytes(bits);
}
static inline int64_t spx_q_zeros_row_bytes(int64_t cols, int group) {
    return (spx_q_groups(cols, group) + 1) / 2;
}

/* Where code `col` of a row sits for bits 2 and 3 (the item formulas
 * above): its item, its code vector V (0..3) and its position p (0..31). */
static inline void spx_q_item_pos(int64_t col, int group, int64_t *item, int *v, int *p) {
    const int64_t g = col / group;
    const int k = (int)(col % group), half = group / 2, h = k >= half, r = k - h * half;
    const int64_t b = g * (group / 32) + r / 16; /* block of the row */
    const int beta = (int)(b & 3);
    *item = b >> 2;
    *v = 2 * (beta >> 1) + h;
    *p = 16 * (beta & 1) + (r & 15);
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

/* Row r's codes in SPX_Q_ROWS (any width). */
static inline const uint8_t *spx_q_row_codes(const spx_qtensor *q, int64_t r) {
    return q->codes + r * spx_q_codes_row_bytes(q->cols, q->bits);
}

/* Group g of row r, in either layout: its codes (4-bit only: group / 2
 * bytes; bits 2 and 3 spread a group over an item, see spx_q_code_get and
 * spx_q_unpack_group), its fp16 scale and its zero point. */
static inline int64_t spx_q__tiled_item(const spx_qtensor *q, int64_t r, int64_t g) {
    return (r >> 4) * (q->cols / SPX_Q_TILE_COLS) + (g >> 2); /* ti = tile * items + item */
}
static inline int64_t spx_q__tiled_slot(const spx_qtensor *q, int64_t r, int64_t g) {
    return (spx_q__tiled_item(q, r, g) << 5) + ((r & 7) << 2) + (g & 3); /* 32 ti + lane */
}
static inline const uint8_t *spx_q_group_codes(const spx_qtensor *q, int64_t r, int64_t g) {
    if (q->layout == SPX_Q_TILED) /* 1024 ti + 512 (r / 8 % 2) + 64 (r % 8) + 16 (g % 4) */
        return q->codes + (spx_q__tiled_item(q, r, g) << 10) + ((r & 15) << 6) + ((g & 3) << 4);
    return q->codes + r * (q->cols / 2) + g * (q->group / 2);
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
