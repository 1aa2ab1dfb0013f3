/* refine_avx2.c: the AVX2 + FMA apply of 4-bit refinement columns
 * (refine.h), bit-identical to the scalar reference in refine.c.
 *
 * Arithmetic. A block is 64 rows: 32 bytes of a column, loaded as eight
 * little-endian 32-bit words, word m holding rows 8m .. 8m + 7 (row 8m + k
 * in nibble k). Accumulator k (8 float lanes) takes nibble k of every
 * word, so lane m of accumulator k is row 8m + k of the block: the nibble
 * is shifted down, masked and has 8 subtracted in 32-bit integers,
 * converted to float (exact) and accumulated with one FMA by the
 * broadcast x value. So each row's numbers are the scalar chain
 * acc = fma(x, q, acc) over the available columns in sel order, then
 * y + s * acc as a separate multiply and add: the same operations in the
 * same order as the scalar table (this relies on the compiler not fusing
 * that multiply and add, as C11 mode does not; test_refine checks bits).
 * Per 8 rows and column: a shift, an and, a subtract, a convert and an
 * FMA, no shuffles; after the columns the accumulators go back to row
 * order once.
 *
 * Loops. Rows go in tiles of up to 4,096 (TILE) whose accumulators live in
 * a 16 KiB buffer (L1). Per tile, the selected columns are compacted in
 * batches of 256 (the available ones, in sel order: pointer and x value),
 * then passed over in groups of 4: each pass walks the tile's blocks,
 * loading the 8 accumulators of a block once for the 4 columns, so every
 * column is read forward from its first byte to its last (4 streams), with
 * a software prefetch PF bytes ahead in each and of the first PF bytes of
 * the next group's columns (a column is a new stream at an unrelated
 * address; the hardware prefetcher alone leaves its first lines as
 * misses). An earlier form walked 64-row blocks over all selected
 * columns, touching a new cache line of a different column at every load,
 * and ran at a fraction of this speed.
 *
 * Rows outside whole blocks (an odd first row, a tail of fewer than 64
 * rows) go to the scalar table, which gives the same bits. Every function
 * that uses AVX2 carries the target attribute, so the file builds without
 * -mavx2; non-x86 builds compile the getter only (NULL). */
#include "refine/refine.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

const spx_refine_kernels *spx_refine_avx2_table(void);

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2,fma")))

#define RB 64      /* rows per block: 32 bytes of each column */
#define TILE 4096  /* rows per tile: their accumulators (16 KiB) stay in L1 */
#define BATCH 256  /* selected columns compacted at a time */
#define PF 512     /* prefetch distance within a column, bytes (a prefetch past
                      the column's end is harmless: prefetches never fault) */
#define NC 4       /* columns per pass over a tile */

/* Nibble k of every 32-bit word of v, minus 8, as floats, times xv, added
 * to accumulator a. */
#define NIB(k, a)                                                                                          \
    a = _mm256_fmadd_ps(                                                                                   \
        xv, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(v, 4 * (k)), m4), z8)), a)

/* acc[64 b .. 64 b + 64) (nibble-major: acc[64 b + 8 k + m] is row
 * 64 b + 8 m + k of the tile) += the nc columns p[0..nc) (bytes of the
 * tile's first row pair at p[c]) times xs[c], in column order, over nb
 * blocks. One pass reads each column's bytes forward (nc streams) and
 * loads and stores the accumulators once per nc columns; next[0..n_next)
 * are the following group's columns, whose first PF bytes it prefetches. */
AVX2_FN static void pass(float *acc, int64_t nb, const uint8_t *const *p, const float *xs, int nc,
                         const uint8_t *const *next, int n_next) {
    const __m256i m4 = _mm256_set1_epi32(0xf), z8 = _mm256_set1_epi32(SPX_REFINE_ZERO);
    for (int64_t b = 0; b < nb; b++) {
        float *ab = acc + 64 * b;
        __m256 a0 = _mm256_load_ps(ab), a1 = _mm256_load_ps(ab + 8), a2 = _mm256_load_ps(ab + 16),
               a3 = _mm256_load_ps(ab + 24), a4 = _mm256_load_ps(ab + 32), a5 = _mm256_load_ps(ab + 40),
               a6 = _mm256_load_ps(ab + 48), a7 = _mm256_load_ps(ab + 56);
        if (!(b & 1) && 32 * b < PF)
            for (int c = 0; c < n_next; c++) _mm_prefetch((const char *)(next[c] + 32 * b), _MM_HINT_T0);
        for (int c = 0; c < nc; c++) {
            if (!(b & 1)) _mm_prefetch((const char *)(p[c] + 32 * b + PF), _MM_HINT_T0);
            __m256i v = _mm256_loadu_si256((const __m256i *)(p[c] + 32 * b));
            __m256 xv = _mm256_broadcast_ss(xs + c);
            NIB(0, a0);
            NIB(1, a1);
            NIB(2, a2);
            NIB(3, a3);
            NIB(4, a4);
            NIB(5, a5);
            NIB(6, a6);
            NIB(7, a7);
        }
        _mm256_store_ps(ab, a0);
        _mm256_store_ps(ab + 8, a1);
        _mm256_store_ps(ab + 16, a2);
        _mm256_store_ps(ab + 24, a3);
        _mm256_store_ps(ab + 32, a4);
        _mm256_store_ps(ab + 40, a5);
        _mm256_store_ps(ab + 48, a6);
        _mm256_store_ps(ab + 56, a7);
    }
}

/* rows [rt, rt + 64 nb) of y, rt even, nb * 64 <= TILE. */
AVX2_FN static void tile_apply(const spx_refine_q4 *R, const int32_t *sel, const uint8_t *const *col,
                               int64_t n_sel, const float *x, float *y, int64_t rt, int64_t nb) {
    _Alignas(32) float acc[TILE];
    const uint8_t *p[BATCH];
    float xs[BATCH];
    const int64_t off = rt >> 1, stride = R->col_stride;
    memset(acc, 0, (size_t)(64 * nb) * sizeof(float));
    for (int64_t j0 = 0; j0 < n_sel; j0 += BATCH) {
        int64_t j1 = j0 + BATCH < n_sel ? j0 + BATCH : n_sel;
        int n = 0; /* the batch's available columns, in sel order */
        for (int64_t j = j0; j < j1; j++) {
            const uint8_t *c = col ? col[j] : R->codes + sel[j] * stride;
            if (!c) continue;
            p[n] = c + off;
            xs[n++] = x[sel[j]];
        }
        for (int c = 0; c < n; c += NC) {
            int nc = n - c < NC ? n - c : NC, nn = n - c - nc < NC ? n - c - nc : NC;
            pass(acc, nb, p + c, xs + c, nc, p + c + nc, nn);
        }
    }
    /* back to row order; y + s * acc as a multiply, then an add */
    for (int64_t b = 0; b < nb; b++) {
        float row[RB];
        const float *ab = acc + 64 * b;
        for (int m = 0; m < 8; m++)
            for (int k = 0; k < 8; k++) row[8 * m + k] = ab[8 * k + m];
        float *yb = y + rt + 64 * b;
        const float *sb = R->scales + rt + 64 * b;
        for (int t = 0; t < RB; t += 8) {
            __m256 pr = _mm256_mul_ps(_mm256_loadu_ps(sb + t), _mm256_loadu_ps(row + t));
            _mm256_storeu_ps(yb + t, _mm256_add_ps(_mm256_loadu_ps(yb + t), pr));
        }
    }
}

static void avx2_apply(const spx_refine_q4 *R, const int32_t *sel, const uint8_t *const *col, int64_t n_sel,
                       const float *x, float *y, int64_t r0, int64_t r1) {
    const spx_refine_kernels *ref = spx_refine_kernels_scalar();
    int any = 0;
    for (int64_t j = 0; j < n_sel && !any; j++) any = !col || col[j];
    if (!any || r0 >= r1) return; /* nothing available: y untouched, bit for bit */
    int64_t r = r0;
    if (r & 1) ref->apply(R, sel, col, n_sel, x, y, r, r + 1), r++;
    while (r + RB <= r1) {
        int64_t nb = (r1 - r) / RB;
        if (nb > TILE / RB) nb = TILE / RB;
        tile_apply(R, sel, col, n_sel, x, y, r, nb);
        r += nb * RB;
    }
    if (r < r1) ref->apply(R, sel, col, n_sel, x, y, r, r1);
}

/* the scalar dot's 8 lanes in one vector: a 32-bit word of codes holds
 * channels 8m .. 8m + 7, nibble k in lane k (refine.h's word packing) */
AVX2_FN static float avx2_dot(const uint8_t *codes, const float *x, int64_t n) {
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), mask = _mm256_set1_epi32(0xf);
    const __m256i zero = _mm256_set1_epi32(SPX_REFINE_ZERO);
    __m256 acc = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        uint32_t w;
        memcpy(&w, codes + c / 2, 4);
        const __m256i q = _mm256_sub_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), mask), zero);
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + c), _mm256_cvtepi32_ps(q), acc);
    }
    float a[8];
    _mm256_storeu_ps(a, acc);
    for (; c < n; c++) a[c & 7] = fmaf(x[c], (float)spx_refine_code(codes, c), a[c & 7]);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

static const spx_refine_kernels g_avx2 = {.name = "avx2", .apply = avx2_apply, .dot = avx2_dot};

const spx_refine_kernels *spx_refine_avx2_table(void) { return &g_avx2; }

#else
const spx_refine_kernels *spx_refine_avx2_table(void) { return NULL; }
#endif
