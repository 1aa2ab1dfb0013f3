/* lowbit.cu: the host side of the device's 2- and 3-bit tiled layout
 * (lowbit.cuh): the .trdc's row-major items repacked at upload. */
#include "cuda/lowbit.cuh"

#include <stdlib.h>
#include <string.h>

extern "C" {
#include "quant/g32.h"
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

spx_status spx_cu_tile_lowbit(const spx_qtensor *src, spx_qtensor *dst, void **mem, spx_err *e) {
    *mem = NULL;
    const int bits = (int)src->bits;
    if ((bits != 2 && bits != 3) || src->group != 32 || src->cols <= 0 || src->cols % 128 || src->rows < 1 ||
        src->layout != SPX_Q_ROWS)
        return spx_fail(e, SPX_ERR_ARG,
                        "spx_cu_tile_lowbit: a [%lld, %lld] matrix of %d-bit codes in groups of %d (layout %d) "
                        "cannot be tiled for the device (needs bits 2 or 3, groups of 32, cols a multiple of 128, "
                        "row-major)",
                        (long long)src->rows, (long long)src->cols, bits, (int)src->group, (int)src->layout);
    const int64_t rows = src->rows, cols = src->cols, ng = cols / 32, items = cols / 128;
    const size_t cb = (size_t)spx_q_codes_bytes(rows, cols, bits, SPX_Q_TILED);
    const size_t sb = (size_t)spx_q_scales_bytes(rows, cols, 32, SPX_Q_TILED);
    const size_t zb = (size_t)spx_q_zeros_bytes(rows, cols, 32, SPX_Q_TILED);
    uint8_t *m = (uint8_t *)calloc(1, cb + sb + zb); /* zeroed: padding rows, and zero nibbles are or-ed in */
    if (!m)
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory tiling a [%lld, %lld] matrix (%zu bytes)", (long long)rows,
                        (long long)cols, cb + sb + zb);
    uint8_t *codes = m, *zeros = m + cb + sb;
    uint16_t *scales = (uint16_t *)(m + cb);
    const int64_t tb = 256 * bits; /* code bytes per (tile, item) */
    uint8_t q[32];
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = spx_q_row_codes(src, r);
        const int half = (int)((r >> 3) & 1), rw = (int)(r & 7);
        for (int64_t g = 0; g < ng; g++) {
            spx_q_unpack_group(row, g, bits, 32, q);
            const int64_t ti = (r >> 4) * items + (g >> 2);
            const int lane = 4 * rw + (int)(g & 3);
            uint32_t w[3] = {0, 0, 0};
            for (int mm = 0; mm < 4; mm++)
                for (int j = 0; j < 4; j++) {
                    const uint32_t lo = q[4 * mm + j], hi = q[16 + 4 * mm + j];
                    if (bits == 2) {
                        w[0] |= lo << (8 * j + 2 * mm);
                        w[1] |= hi << (8 * j + 2 * mm);
                    } else if (mm < 3) {
                        w[mm] |= (lo | hi << 3) << (8 * j);
                    } else {
                        w[0] |= (lo & 3) << (8 * j + 6);
                        w[1] |= (hi & 3) << (8 * j + 6);
                        w[2] |= (lo >> 2) << (8 * j + 6) | (hi >> 2) << (8 * j + 7);
                    }
                }
            uint8_t *c = codes + ti * tb + 16 * lane + 8 * half;
            put32(c, w[0]);
            put32(c + 4, w[1]);
            if (bits == 3) put32(codes + ti * tb + 512 + 8 * lane + 4 * half, w[2]);
            const int64_t slot = ti * 32 + lane;
            scales[2 * slot + half] = spx_q_group_scale(src, r, g);
            zeros[slot] |= (uint8_t)(spx_q_group_zero(src, r, g) << (4 * half));
        }
    }
    *dst = *src;
    dst->codes = codes;
    dst->scales = scales;
    dst->zeros = zeros;
    dst->layout = SPX_Q_TILED;
    *mem = m;
    return SPX_OK;
}
