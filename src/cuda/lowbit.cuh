/* lowbit.cuh: the device layout of 2- and 3-bit matrices (issue 20,
 * "real 2- and 3-bit resident formats ... CUDA"), and its unpacking into
 * the int8 MMA fragments of the decode GEMV (gemv_q4.cu) and into the
 * 4-bit nibble words every other kernel reads (spx_dq_group).
 *
 * The .trdc stores bits 2 and 3 row-major in items of 128 columns for the
 * CPU's registers (qtensor.h); the device instead tiles them as it tiles
 * 4 bits (tile16x128, qtensor.h): rows in tiles of 16 (the last one zero
 * padded), columns in items of 128 (4 groups of 32), per (tile T, item k)
 * ti = T * items + k, and lane l = 4 r + t of a warp holding rows r and
 * r + 8 of the tile, group t. Scales (fp16, 64 bytes per ti) and zero
 * nibbles (32 bytes per ti) are exactly those of 4-bit tile16x128; only
 * the codes differ, 256 * bits bytes per ti (one row's 128 columns take
 * 16 * bits bytes, no padding when cols % 128 == 0, which the backend
 * requires of bits 2 and 3):
 *
 *   A lane-row (one row, one group of 32 codes q_0 .. q_31) is 2 or 3
 *   32-bit words W0, W1 (, W2). F(m, h), m = 0..3, h = 0..1, is the
 *   fragment word whose byte j is code 16 h + 4 m + j: what the 4-bit
 *   kernel gets by masking nibbles (word m of a 4-bit group, low nibbles
 *   for h = 0, high for h = 1).
 *   bits 2: byte j of Wh holds F(m, h)_j at bits 2m .. 2m + 1.
 *   bits 3: byte j of Wm (m = 0..2) holds F(m, 0)_j at bits 0-2 and
 *     F(m, 1)_j at bits 3-5; bits 6-7 of W0 and W1 hold the low two bits
 *     of F(3, 0)_j and F(3, 1)_j; bit 6 of W2 the high bit of F(3, 0)_j,
 *     bit 7 that of F(3, 1)_j.
 *   Codes of ti:  bits 2: + 16 l: W0, W1 of row r, then W0, W1 of row r + 8
 *                 bits 3: + 16 l: W0, W1 of row r, W0, W1 of row r + 8;
 *                         + 512 + 8 l: W2 of row r, W2 of row r + 8
 * Why: a lane's item is one coalesced 16-byte load (bits 2) or a 16- and
 * an 8-byte load (bits 3), and each fragment is one to four integer
 * operations (4 bits: one or two), so the GEMV's instruction count per
 * weight stays near the 4-bit kernel's while its bytes shrink to bits / 4.
 * Zero points stay below 2^bits, as written (any nibble reads as stored).
 * Which matrices the device tiles: engine/memory.h spx_mem_dev_tiled. */
#ifndef SPX_CUDA_LOWBIT_CUH
#define SPX_CUDA_LOWBIT_CUH

#include <stdint.h>

extern "C" {
#include "core/err.h"
#include "quant/qtensor.h"
}

/* Fragment F(m, h) (see the top) of a lane-row's words; m and h are
 * compile-time after unrolling. */
template <int BITS>
__device__ __forceinline__ uint32_t spx_lb_frag(uint32_t w0, uint32_t w1, uint32_t w2, int m, int h) {
    if (BITS == 2) return ((h ? w1 : w0) >> (2 * m)) & 0x03030303u;
    if (m < 3) {
        const uint32_t w = m == 0 ? w0 : m == 1 ? w1 : w2;
        return h ? (w >> 3) & 0x07070707u : w & 0x07070707u;
    }
    return h ? ((w1 >> 6) & 0x03030303u) | ((w2 >> 5) & 0x04040404u)
             : ((w0 >> 6) & 0x03030303u) | ((w2 >> 4) & 0x04040404u);
}

/* The same group as 4-bit nibble words (word m byte j: code 4 m + j low,
 * 4 m + j + 16 high), what the 4-bit readers take. */
template <int BITS>
__device__ __forceinline__ uint4 spx_lb_nibbles(uint32_t w0, uint32_t w1, uint32_t w2) {
    uint32_t o[4];
#pragma unroll
    for (int m = 0; m < 4; m++) o[m] = spx_lb_frag<BITS>(w0, w1, w2, m, 0) | (spx_lb_frag<BITS>(w0, w1, w2, m, 1) << 4);
    return make_uint4(o[0], o[1], o[2], o[3]);
}

/* Host: src (bits 2 or 3, group 32, cols % 128 == 0, row-major as the
 * .trdc has it) in the device's tiled layout, in one malloc'ed block
 * (*mem; the caller frees it) that dst's arrays point into (dst->layout
 * SPX_Q_TILED; dst is for the device only: the CPU's accessors read
 * tiled 4-bit alone). */
spx_status spx_cu_tile_lowbit(const spx_qtensor *src, spx_qtensor *dst, void **mem, spx_err *e);

#endif
