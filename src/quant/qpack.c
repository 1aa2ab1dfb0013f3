/* qpack.c: where each code of a quantized row lives (the packing that
 * qtensor.h and docs/trdc.md define), the repack of the version 1 and 2
 * 2-/3-bit packing, and the tiled layout's repack (spx_q_tile / untile).
 * Every reader of codes goes through these definitions: spx_q_code_get /
 * spx_q_code_set for one code, spx_q_unpack_group / spx_q_pack_group for
 * a group; the SIMD kernels read the same bytes (qkernels_avx2.c) and
 * tests/test_qpack.c pins them with hand-written bytes. */
#include "quant/g32.h"

#include <stdlib.h>
#include <string.h>

/* ======================================================================
 * One code
 * ==================================================================== */

/* Bits 2 and 3: code vector v (0..3) at position p (0..31) of an item. */
static inline int item_get(const uint8_t *it, int bits, int v, int p) {
    if (bits == 2) return (it[p] >> (2 * v)) & 3;
    const uint8_t x = it[p], nib = (uint8_t)((it[32 + (p & 15)] >> (p & 16 ? 4 : 0)) & 15);
    switch (v) {
    case 0: return x & 7;
    case 1: return (x >> 3) & 7;
    case 2: return ((x >> 6) << 1) | (nib & 1);
    default: return nib >> 1;
    }
}

static inline void item_set(uint8_t *it, int bits, int v, int p, int q) {
    if (bits == 2) {
        it[p] = (uint8_t)((it[p] & ~(3 << (2 * v))) | ((q & 3) << (2 * v)));
        return;
    }
    uint8_t *y = &it[32 + (p & 15)];
    const int sh = p & 16 ? 4 : 0;
    switch (v) {
    case 0: it[p] = (uint8_t)((it[p] & ~7) | (q & 7)); break;
    case 1: it[p] = (uint8_t)((it[p] & ~0x38) | ((q & 7) << 3)); break;
    case 2:
        it[p] = (uint8_t)((it[p] & 0x3f) | (((q >> 1) & 3) << 6));
        *y = (uint8_t)((*y & ~(1 << sh)) | ((q & 1) << sh));
        break;
    default: *y = (uint8_t)((*y & ~(14 << sh)) | ((q & 7) << (sh + 1))); break;
    }
}

int spx_q_code_get(const uint8_t *codes_row, int64_t col, int bits, int group) {
    if (bits == 4) {
        const int half = group / 2, k = (int)(col % group);
        const uint8_t byte = codes_row[(col / group) * half + k % half];
        return k < half ? byte & 15 : byte >> 4;
    }
    int64_t item;
    int v, p;
    spx_q_item_pos(col, group, &item, &v, &p);
    return item_get(codes_row + item * spx_q_item_bytes(bits), bits, v, p);
}

void spx_q_code_set(uint8_t *codes_row, int64_t col, int bits, int group, int q) {
    if (bits == 4) {
        const int half = group / 2, k = (int)(col % group);
        uint8_t *b = &codes_row[(col / group) * half + k % half];
        *b = k < half ? (uint8_t)((*b & 0xf0) | (q & 15)) : (uint8_t)((*b & 0x0f) | (q << 4));
        return;
    }
    int64_t item;
    int v, p;
    spx_q_item_pos(col, group, &item, &v, &p);
    item_set(codes_row + item * spx_q_item_bytes(bits), bits, v, p, q);
}

/* ======================================================================
 * One group
 * ==================================================================== */

/* Block i of group g (bits 2, 3): its item and the two code vectors and
 * first position of its halves (qtensor.h). */
static inline const uint8_t *block_at(const uint8_t *codes_row, int64_t g, int i, int bits, int group, int *v0,
                                      int *p0) {
    const int64_t b = g * (group / 32) + i;
    *v0 = 2 * (int)((b & 3) >> 1);
    *p0 = 16 * (int)(b & 1);
    return codes_row + (b >> 2) * spx_q_item_bytes(bits);
}

void spx_q_unpack_group(const uint8_t *codes_row, int64_t g, int bits, int group, uint8_t *q) {
    const int half = group / 2;
    if (bits == 4) {
        const uint8_t *gc = codes_row + g * half;
        for (int k = 0; k < half; k++) {
            q[k] = gc[k] & 0xf;
            q[k + half] = gc[k] >> 4;
        }
        return;
    }
    for (int i = 0; i < group / 32; i++) {
        int v0, p0;
        const uint8_t *it = block_at(codes_row, g, i, bits, group, &v0, &p0);
        for (int m = 0; m < 16; m++) {
            q[16 * i + m] = (uint8_t)item_get(it, bits, v0, p0 + m);
            q[half + 16 * i + m] = (uint8_t)item_get(it, bits, v0 + 1, p0 + m);
        }
    }
}

void spx_q_pack_group(uint8_t *codes_row, int64_t g, int bits, int group, const uint8_t *q) {
    const int half = group / 2;
    if (bits == 4) {
        uint8_t *gc = codes_row + g * half;
        for (int k = 0; k < half; k++) gc[k] = (uint8_t)((q[k] & 15) | (q[k + half] << 4));
        return;
    }
    for (int i = 0; i < group / 32; i++) {
        int v0, p0;
        uint8_t *it = (uint8_t *)block_at(codes_row, g, i, bits, group, &v0, &p0);
        for (int m = 0; m < 16; m++) {
            item_set(it, bits, v0, p0 + m, q[16 * i + m]);
            item_set(it, bits, v0 + 1, p0 + m, q[half + 16 * i + m]);
        }
    }
}

/* ======================================================================
 * Versions 1 and 2 of the .trdc format: bits 2 and 3 in group order
 * ==================================================================== */

/* cpb codes per byte (4 for bits 2, 2 for bits 3), B = group / cpb bytes
 * per group: code k of group g in byte g B + k % B at bit (k / B) (8 / cpb). */
static int legacy_cpb(int bits) { return bits == 2 ? 4 : 2; }

int64_t spx_q_legacy_codes_row_bytes(int64_t cols, int bits) { return cols / legacy_cpb(bits); }

void spx_q_repack_legacy_row(const uint8_t *old_row, int64_t cols, int bits, int group, uint8_t *row) {
    const int cpb = legacy_cpb(bits), w = 8 / cpb, B = group / cpb;
    uint8_t q[SPX_Q_GROUP_MAX];
    memset(row, 0, (size_t)spx_q_codes_row_bytes(cols, bits)); /* padding blocks: code 0 */
    for (int64_t g = 0; g < cols / group; g++) {
        const uint8_t *gc = old_row + g * B;
        for (int k = 0; k < group; k++) q[k] = (uint8_t)((gc[k % B] >> ((k / B) * w)) & ((1 << w) - 1) & ((1 << bits) - 1));
        spx_q_pack_group(row, g, bits, group, q);
    }
}

/* ======================================================================
 * The tiled layout (4-bit G32)
 * ==================================================================== */

spx_status spx_q_tile(const spx_qtensor *src, uint8_t *codes, uint16_t *scales, uint8_t *zeros,
                      spx_qtensor *dst, spx_err *e) {
    if (src->layout != SPX_Q_ROWS || !spx_q_tiled_ok(src->bits, src->group, src->cols) || src->rows < 1)
        return spx_fail(e, SPX_ERR_ARG,
                        "spx_q_tile: a [%lld, %lld] matrix of %d-bit codes in groups of %d (layout %d) cannot be "
                        "tiled (needs 4 bits, groups of 32, cols a multiple of 128, row-major)",
                        (long long)src->rows, (long long)src->cols, (int)src->bits, (int)src->group,
                        (int)src->layout);
    int64_t sr = spx_q_stored_rows(src->rows, SPX_Q_TILED), ng = spx_q_groups(src->cols, 32);
    *dst = *src;
    dst->codes = codes;
    dst->scales = scales;
    dst->zeros = zeros;
    dst->layout = SPX_Q_TILED;
    memset(zeros, 0, (size_t)spx_q_zeros_bytes(src->rows, src->cols, 32, SPX_Q_TILED));
    for (int64_t r = 0; r < sr; r++)
        for (int64_t g = 0; g < ng; g++) {
            /* the accessors name each slot; dst's arrays are the caller's (writable) */
            uint8_t *gc = (uint8_t *)spx_q_group_codes(dst, r, g);
            int64_t slot = spx_q__tiled_slot(dst, r, g);
            if (r < src->rows) {
                memcpy(gc, spx_q_group_codes(src, r, g), 16);
                scales[2 * slot + ((r >> 3) & 1)] = spx_q_group_scale(src, r, g);
                zeros[slot] |= (uint8_t)(spx_q_group_zero(src, r, g) << ((r & 8) >> 1));
            } else {
                memset(gc, 0, 16);
                scales[2 * slot + ((r >> 3) & 1)] = 0;
            }
        }
    return SPX_OK;
}

spx_status spx_q_tile_alloc(const spx_qtensor *src, spx_qtensor *dst, void **mem, spx_err *e) {
    *mem = NULL;
    if (src->layout != SPX_Q_ROWS || !spx_q_tiled_ok(src->bits, src->group, src->cols) || src->rows < 1)
        return spx_q_tile(src, NULL, NULL, NULL, dst, e); /* its message */
    size_t cb = (size_t)spx_q_codes_bytes(src->rows, src->cols, 4, SPX_Q_TILED);
    size_t sb = (size_t)spx_q_scales_bytes(src->rows, src->cols, 32, SPX_Q_TILED);
    size_t zb = (size_t)spx_q_zeros_bytes(src->rows, src->cols, 32, SPX_Q_TILED);
    uint8_t *m = malloc(cb + sb + zb);
    if (!m)
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory tiling a [%lld, %lld] matrix (%zu bytes)",
                        (long long)src->rows, (long long)src->cols, cb + sb + zb);
    spx_status st = spx_q_tile(src, m, (uint16_t *)(m + cb), m + cb + sb, dst, e);
    if (st != SPX_OK) {
        free(m);
        return st;
    }
    *mem = m;
    return SPX_OK;
}

spx_status spx_q_untile_alloc(const spx_qtensor *src, spx_qtensor *dst, void **mem, spx_err *e) {
    *mem = NULL;
    if (src->layout != SPX_Q_TILED || !spx_q_tiled_ok(src->bits, src->group, src->cols) || src->rows < 1)
        return spx_fail(e, SPX_ERR_ARG, "spx_q_untile_alloc: the [%lld, %lld] matrix is not tiled",
                        (long long)src->rows, (long long)src->cols);
    size_t cb = (size_t)spx_q_codes_bytes(src->rows, src->cols, 4, SPX_Q_ROWS);
    size_t sb = (size_t)spx_q_scales_bytes(src->rows, src->cols, 32, SPX_Q_ROWS);
    size_t zb = (size_t)spx_q_zeros_bytes(src->rows, src->cols, 32, SPX_Q_ROWS);
    uint8_t *m = calloc(1, cb + sb + zb); /* zeroed: the zero nibbles are or-ed in */
    if (!m)
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory untiling a [%lld, %lld] matrix (%zu bytes)",
                        (long long)src->rows, (long long)src->cols, cb + sb + zb);
    *dst = *src;
    dst->codes = m;
    dst->scales = (const uint16_t *)(m + cb);
    dst->zeros = m + cb + sb;
    dst->layout = SPX_Q_ROWS;
    int64_t ng = spx_q_groups(src->cols, 32), zrb = spx_q_zeros_row_bytes(src->cols, 32);
    for (int64_t r = 0; r < src->rows; r++)
        for (int64_t g = 0; g < ng; g++) {
            memcpy(m + r * (src->cols / 2) + g * 16, spx_q_group_codes(src, r, g), 16);
            ((uint16_t *)(m + cb))[r * ng + g] = spx_q_group_scale(src, r, g);
            m[cb + sb + r * zrb + (g >> 1)] |= (uint8_t)(spx_q_group_zero(src, r, g) << ((g & 1) * 4));
        }
    *mem = m;
    return SPX_OK;
}

spx_status spx_q_as_layout(const spx_qtensor *src, int row_major, spx_qtensor *dst, void **mem, spx_err *e) {
    if (!row_major && src->layout == SPX_Q_ROWS && spx_q_tiled_ok(src->bits, src->group, src->cols))
        return spx_q_tile_alloc(src, dst, mem, e);
    if (row_major && src->layout == SPX_Q_TILED) return spx_q_untile_alloc(src, dst, mem, e);
    *dst = *src;
    *mem = NULL;
    return SPX_OK;
}
