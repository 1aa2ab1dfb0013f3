/* qkernels_avx512.c: the AVX-512 (F/BW/VL/DQ + VNNI) variant of the
 * quantized GEMV / GEMM kernels (qkernels.h), with int8 activations, and
 * the amx table built on it (products of many tokens on the AMX tiles:
 * qkernels_amx.c; the attention steps of both tables: attn_avx512.c).
 *
 * Every function that uses these instructions carries the target
 * attribute, so the file builds without -mavx512f and nothing here runs
 * unless dispatch (qkernels.c) found the features. Non-x86 builds compile
 * the getters only (they return NULL).
 *
 * Fast path: as the avx2 table's, bits 2, 3 and 4, group 32, 64 or 128,
 * row-major, and tiled 4-bit G32 read in place; other group sizes take
 * the scalar table on the float x (act_bytes() is 0 for them). The same
 * quantization of x as the avx2 table (qkernels_avx2.c: per block of 32
 * columns dx_b = max|x| / 127, x8 = round_even(x * 127 / max|x|)), so the
 * same error bound; only the layout and the order of the float sums
 * differ.
 *
 * Quads. Four consecutive blocks of a row (a quad: 128 columns) are 64
 * code bytes in every 4-bit layout (row-major: the blocks' 16 bytes in
 * order; tiled: one row's line of an item) and one item for bits 2 and 3
 * (qtensor.h). A quad unpacks to two 64-byte code vectors, one code per
 * byte: lo = the four blocks' lo halves, hi = their hi halves (4-bit: one
 * load, a shift, two masks; 2-bit: a 32-byte broadcast, two variable
 * shifts, two masks; 3-bit: also the 16-byte Y part, blended).
 *
 * Activation format, per token (act_layout.stride bytes, 64-aligned in
 * the buffer when the buffer is):
 *     q8[128 nq]  int8, nq = ceil(nb / 4) quads; quad j is
 *                 [lo(4j) lo(4j+1) lo(4j+2) lo(4j+3) | hi(4j) .. hi(4j+3)]
 *                 (16 bytes each), the blocks of a last partial quad 0;
 *     dx[nb16]    float per block, nb16 = blocks rounded up to 16, 0 past nb;
 *     xsb[nb16]   float per block: dx_b * sum(x8 of the block);
 *                 both in "slot order" within each chunk of 16 blocks:
 *                 slot 4L + e holds block 4e + L (a 4 x 4 transpose).
 *
 * Arithmetic. Per row, chunk of 16 blocks (4 quads) and token: for quad e,
 * two vpdpbusd (codes u8 x x8 s8, four products per int32 lane, exact)
 * give A_e, whose 128-bit lane L holds block 4e + L's partial sums in its
 * four int32s. Two levels of unpack + add over A_0..A_3 (the transpose)
 * give one vector R whose lane 4L + e is block 4e + L's exact dot: slot
 * order, in which dx, xsb (act) and the row's scales and zero points
 * (permuted once per row and chunk) are laid out. Then in float, as the
 * avx2 table: y += s * dx * R - s * z * xsb, 16 lanes, one horizontal sum
 * per row and token at the end, after the fp16 outlier columns (fp16
 * value x float x, added to the same accumulators). |R| <= 32 * 15 * 127:
 * no int32 overflow anywhere.
 *
 * Loops. The avx2 table's, with chunks of 16 blocks (512 columns): GEMV
 * (T = 1) 4 rows x 1 token over whole rows; tiled GEMV and tiled
 * products of 2..16 tokens the 16 rows of a tile chunk by chunk (tile16),
 * so a tile's bytes stream forward; GEMM row blocks of 64 rows x column
 * chunks of 4096 x token blocks of 8, 1 row x 8 tokens per micro-kernel
 * (8 code vectors and 8 accumulators in registers). Whole rows below
 * MTOK_MAX tokens, so a tiled matrix and its row-major copy sum every y in
 * the same order (bit-identical results, as tests/test_kernels.c checks). */
#include "cpu/qkernels.h"
#include "cpu/qkernels_avx512.h"
#include "quant/g32.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

const spx_qkernels *spx_qkernels_avx512_table(void);
const spx_qkernels *spx_qkernels_amx_table(void);

#if defined(__x86_64__) || defined(__i386__)

enum {
    BLK = 32,      /* columns per activation block */
    CHUNK = 16,    /* blocks per chunk (scale vectors are 16 lanes) */
    GEMV_NR = 4,   /* rows per GEMV micro-kernel */
    GEMM_TB = 8,   /* tokens per GEMM micro-kernel */
    GEMM_RB = 64,  /* rows per GEMM row block (its weights of a column chunk stay in L2) */
    GEMM_KB = 128, /* blocks per GEMM column chunk (multiple of CHUNK): 4096 columns */
    MTOK_MAX = 16  /* products of 2..16 tokens: whole rows; tiled ones by tile16 */
};

static int fast_ok(const spx_qtensor *q) {
    return spx_qk_int8_group(q->group) && (q->bits == 4 || ((q->bits == 2 || q->bits == 3) && q->layout == SPX_Q_ROWS));
}

/* ======================================================================
 * Activation layout
 * ==================================================================== */

typedef struct act_layout {
    int64_t nb;     /* blocks per token: cols / 32 */
    int64_t nq;     /* quads: ceil(nb / 4) */
    int64_t nb16;   /* nb rounded up to 16 */
    int64_t q8b;    /* bytes of q8: 128 nq */
    int64_t stride; /* bytes per token, a multiple of 64 */
} act_layout;

static act_layout layout_of(int64_t cols) {
    act_layout l;
    l.nb = cols / BLK;
    l.nq = (l.nb + 3) / 4;
    l.nb16 = (l.nb + CHUNK - 1) / CHUNK * CHUNK;
    l.q8b = 128 * l.nq;
    l.stride = (l.q8b + 2 * l.nb16 * (int64_t)sizeof(float) + 63) / 64 * 64;
    return l;
}

static size_t v_act_bytes(int64_t T, int64_t cols, int group) {
    if (!spx_qk_int8_group(group) || cols <= 0 || cols % group) return 0;
    return (size_t)T * (size_t)layout_of(cols).stride;
}

/* x at the outlier columns for up to MTOK_MAX tokens (each token's row
 * padded to 16); also covers the scalar fallback's cols floats. */
static size_t v_scratch_bytes(int64_t T, int64_t cols, int group) {
    (void)group;
    int64_t nt = T == 1 ? 1 : T <= MTOK_MAX && T > GEMM_TB ? T : GEMM_TB;
    return (size_t)nt * ((size_t)cols + 16) * sizeof(float);
}

/* The sum of v's lanes, wrapping: the epi32 intrinsics add as unsigned
 * (GCC's _mm512_reduce_add_epi32 adds as signed int, undefined behaviour
 * on the 0x80000000 that cvtps gives for a NaN or inf input). */
AVX512_FN static inline int hsum_epi32(__m512i v) {
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Slot of block j (0..15) of a chunk: 4 (j % 4) + j / 4 (its own inverse). */
static inline int64_t slot_of(int64_t j) { return 4 * (j & 3) + (j >> 2); }

AVX512_FN static void v_prepare(const float *x, int64_t T, int64_t cols, int group, void *act) {
    if (!spx_qk_int8_group(group) || cols <= 0 || cols % group) return;
    const act_layout l = layout_of(cols);
    const int64_t half = group / 2, bpg = group / BLK;
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * cols;
        uint8_t *base = (uint8_t *)act + t * l.stride;
        int8_t *q8 = (int8_t *)base;
        float *dx = (float *)(base + l.q8b), *xsb = dx + l.nb16;
        for (int64_t b = 0; b < l.nb; b++) {
            const int64_t g = b / bpg, i = b % bpg;
            const float *lo = xt + g * group + 16 * i, *hi = lo + half;
            const __m512 v0 = _mm512_loadu_ps(lo), v1 = _mm512_loadu_ps(hi);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
            const __m512 vid = _mm512_set1_ps(id);
            /* round to nearest even (MXCSR default); |x * id| <= 127 */
            const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
            const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
            const int sum = hsum_epi32(_mm512_add_epi32(i0, i1));
            int8_t *qb = q8 + 128 * (b >> 2) + 16 * (b & 3);
            _mm_storeu_si128((__m128i *)qb, _mm512_cvtsepi32_epi8(i0));
            _mm_storeu_si128((__m128i *)(qb + 64), _mm512_cvtsepi32_epi8(i1));
            const int64_t k = (b & ~(int64_t)15) + slot_of(b & 15);
            dx[k] = d;
            xsb[k] = d * (float)sum;
        }
        for (int64_t b = l.nb; b < 4 * l.nq; b++) { /* the last quad's absent blocks */
            int8_t *qb = q8 + 128 * (b >> 2) + 16 * (b & 3);
            memset(qb, 0, 16);
            memset(qb + 64, 0, 16);
        }
        for (int64_t b = l.nb; b < l.nb16; b++) {
            const int64_t k = (b & ~(int64_t)15) + slot_of(b & 15);
            dx[k] = xsb[k] = 0.0f;
        }
    }
}

/* ======================================================================
 * Scales and zero points of a chunk, in slot order
 * ==================================================================== */

/* lane s: block 4 (s % 4) + s / 4 of the chunk, divided by bpg (its group) */
AVX512_INLINE __m512i slot_groups(const int bpg) {
    const __m512i blk = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return bpg == 1 ? blk : _mm512_srli_epi32(blk, bpg == 2 ? 1 : 2);
}

/* Row-major: the row's fp16 scales of chunk [b0, b0 + nbc) (b0 % 16 == 0)
 * at srow (all groups of the row), as floats in slot order, 0 for absent
 * blocks (masked load: nothing past the chunk's groups is read). */
AVX512_INLINE __m512 chunk_scales(const uint16_t *srow, int64_t b0, int nbc, const int bpg) {
    const int n = (nbc + bpg - 1) / bpg;
    const __m256i h = _mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1), srow + b0 / bpg);
    return _mm512_permutexvar_ps(slot_groups(bpg), _mm512_cvtph_ps(h));
}

/* Row-major: the zero points as floats in slot order: nibble g of the
 * row's zero bytes (group 2i low, 2i + 1 high nibble of byte i); g0 =
 * b0 / bpg is even. */
AVX512_INLINE __m512 chunk_zeros(const uint8_t *zrow, int64_t b0, int nbc, const int bpg) {
    const int ng = (nbc + bpg - 1) / bpg, nz = (ng + 1) / 2;
    const __m128i zb = _mm_maskz_loadu_epi8((__mmask16)((1u << nz) - 1), zrow + b0 / bpg / 2);
    const __m512i g = slot_groups(bpg);
    __m512i v = _mm512_permutexvar_epi32(_mm512_srli_epi32(g, 1), _mm512_cvtepu8_epi32(zb));
    v = _mm512_srlv_epi32(v, _mm512_slli_epi32(_mm512_and_si512(g, _mm512_set1_epi32(1)), 2));
    return _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
}

/* SPX_Q_TILED (G32, bpg 1): a chunk of 16 blocks = items k0 .. k0 + 3 (k0
 * = b0 / 4; a tail chunk has nbc / 4 items). Row rt of a tile, lr = rt %
 * 8, h = rt / 8, has per item 4 scale words of 32 bits (fp16 half h is
 * its own) at fp16 offset 64 k + 8 lr of the tile's scales and 4 zero
 * bytes (nibble h) at 32 k + 4 lr of its zeros. sb, zb: the tile's item
 * k0 (the chunk's first), already offset by lr. */
AVX512_INLINE __m512 tiled_scales(const uint16_t *sb, int h, int nbc) {
    __m512i w = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)sb));
    if (nbc > 4) w = _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(sb + 64)), 1);
    if (nbc > 8) w = _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(sb + 128)), 2);
    if (nbc > 12) w = _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(sb + 192)), 3);
    if (nbc <= 4) w = _mm512_zextsi128_si512(_mm512_castsi512_si128(w));
    else if (nbc <= 8) w = _mm512_maskz_mov_epi32(0x00ff, w);
    else if (nbc <= 12) w = _mm512_maskz_mov_epi32(0x0fff, w);
    /* lane 4k + t: item k's word t (block 4k + t), its half h */
    const __m256i f = _mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16 * h));
    return _mm512_permutexvar_ps(slot_groups(1), _mm512_cvtph_ps(f));
}

AVX512_INLINE __m512 tiled_zeros(const uint8_t *zb, int h, int nbc) {
    /* the items' 4 zero bytes as the 4 dwords of one vector (loads and
     * inserts: a round trip through memory would stall on forwarding) */
    int32_t w0, w1 = 0, w2 = 0, w3 = 0;
    memcpy(&w0, zb, 4);
    if (nbc > 4) memcpy(&w1, zb + 32, 4);
    if (nbc > 8) memcpy(&w2, zb + 64, 4);
    if (nbc > 12) memcpy(&w3, zb + 96, 4);
    const __m512i v = _mm512_cvtepu8_epi32(_mm_setr_epi32(w0, w1, w2, w3)); /* lane 4k + t: block 4k + t */
    const __m512i z = _mm512_and_si512(_mm512_srli_epi32(v, 4 * h), _mm512_set1_epi32(15));
    return _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(slot_groups(1), z));
}

/* tile16's scales and zero points of one chunk for all 16 rows of a
 * tile at once (s, z: the tile's arrays at the chunk's first item, nbc /
 * 4 items present): pre[32 rt .. + 16) = row rt's scales in slot order,
 * pre[32 rt + 16 .. + 16) = scales x zero points; the same numbers
 * tiled_scales and tiled_zeros give one row at a time (exact converts,
 * the same product), in about half the instructions per row: one
 * convert per 16 scales of the tile, two permutes and a blend per row;
 * one permute and a byte transpose per pair of rows for the zeros. Slot
 * 4L + e is item e's group L: row (lr, h)'s scale is fp16 8 lr + 2 L + h
 * of item e, i.e. element 8 (lr % 2) + h + 2 L of F[e][lr / 2] (the
 * item's fp16 16 m .. 16 m + 15); its zero is nibble h of byte 4 lr + L
 * of item e's 32 zero bytes. */
AVX512_INLINE void tile_chunk_prep(const uint16_t *s, const uint8_t *z, int nbc, float *pre) {
    const int ni = nbc / 4;
    __m512 F[4][4];
    #pragma GCC unroll 4
    for (int e = 0; e < 4; e++)
        #pragma GCC unroll 4
        for (int m = 0; m < 4; m++)
            F[e][m] = e < ni ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 64 * e + 16 * m)))
                             : _mm512_setzero_ps();
    const __m512i Z01 = ni >= 2 ? _mm512_loadu_si512(z) : _mm512_maskz_loadu_epi8(0xffffffffull, z);
    const __m512i Z23 = ni >= 4   ? _mm512_loadu_si512(z + 64)
                        : ni == 3 ? _mm512_maskz_loadu_epi8(0xffffffffull, z + 64)
                                  : _mm512_setzero_si512();
    /* byte 4 L + e <- byte 4 e + L: the 4 items' dwords transposed */
    const __m128i tr = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    /* lane 4 L + e: (e % 2) 16 + 2 L: F[e or e - 2][m] element 2 L (+ base) */
    const __m512i sel = _mm512_setr_epi32(0, 16, 0, 16, 2, 18, 2, 18, 4, 20, 4, 20, 6, 22, 6, 22);
    #pragma GCC unroll 8
    for (int lr = 0; lr < 8; lr++) {
        const __m512i w = _mm512_permutex2var_epi32(Z01, _mm512_setr_epi32(lr, 8 + lr, 16 + lr, 24 + lr, 0, 0, 0, 0, 0,
                                                                           0, 0, 0, 0, 0, 0, 0),
                                                    Z23);
        const __m512i zb = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(_mm512_castsi512_si128(w), tr));
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i idx = _mm512_add_epi32(sel, _mm512_set1_epi32(8 * (lr & 1) + h));
            const __m512 p01 = _mm512_permutex2var_ps(F[0][lr >> 1], idx, F[1][lr >> 1]);
            const __m512 p23 = _mm512_permutex2var_ps(F[2][lr >> 1], idx, F[3][lr >> 1]);
            const __m512 sv = _mm512_mask_blend_ps(0xcccc, p01, p23);
            const __m512 zf = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(zb, 4 * h), _mm512_set1_epi32(15)));
            float *o = pre + 32 * (lr + 8 * h);
            _mm512_storeu_ps(o, sv);
            _mm512_storeu_ps(o + 16, _mm512_mul_ps(sv, zf));
        }
    }
}

/* ======================================================================
 * Code unpacking and the micro-kernel
 * ==================================================================== */

/* The code vectors of quad q of a row (crow: the row's codes, or for a
 * tiled row its line in item 0 of the tile), nbq = blocks present (1..4;
 * absent blocks of a row-major 4-bit quad are not read: masked load). */
AVX512_INLINE void unpack_quad(const uint8_t *crow, int64_t q, int nbq, const int TL, const int BITS, __m512i *lo,
                               __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (BITS == 4) {
        const uint8_t *p = TL ? crow + 1024 * q : crow + 64 * q;
        const __m512i c = nbq == 4 ? _mm512_loadu_si512(p)
                                   : _mm512_maskz_loadu_epi8(((__mmask64)1 << (16 * nbq)) - 1, p);
        *lo = _mm512_and_si512(c, m4);
        *hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
    } else if (BITS == 2) {
        /* item: byte p holds code vector V at bits 2V; lo = [V0 | V2], hi = [V1 | V3] */
        const __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(crow + 32 * q)));
        const __m512i m3 = _mm512_set1_epi8(3);
        const __m512i slo = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(4), 1);
        *lo = _mm512_and_si512(_mm512_srlv_epi16(x, slo), m3);
        *hi = _mm512_and_si512(_mm512_srlv_epi16(x, _mm512_add_epi16(slo, _mm512_set1_epi16(2))), m3);
    } else {
        /* X[32]: V0 bits 0-2, V1 bits 3-5, V2 >> 1 bits 6-7; nibble p of
         * Y[16]: V2 & 1 bit 0, V3 bits 1-3 (qtensor.h). y: byte p's low
         * nibble is nibble p (the high 16 bytes shifted by 4). */
        const uint8_t *it = crow + 48 * q;
        const __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)it));
        const __m256i y2 = _mm256_srlv_epi64(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(it + 32))),
                                             _mm256_setr_epi64x(0, 0, 4, 4));
        const __m512i y = _mm512_broadcast_i64x4(y2);
        const __m512i m7 = _mm512_set1_epi8(7);
        const __m512i v0 = _mm512_and_si512(x, m7), v1 = _mm512_and_si512(_mm512_srli_epi16(x, 3), m7);
        const __m512i v2 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(x, 5), _mm512_set1_epi8(6)),
                                           _mm512_and_si512(y, _mm512_set1_epi8(1)));
        const __m512i v3 = _mm512_and_si512(_mm512_srli_epi16(y, 1), m7);
        *lo = _mm512_mask_blend_epi64(0xf0, v0, v2);
        *hi = _mm512_mask_blend_epi64(0xf0, v1, v3);
    }
}

/* Four quads' int32 partial sums (A[e]: 128-bit lane L = block 4e + L)
 * to one vector of exact block dots in slot order (lane 4L + e). */
AVX512_INLINE __m512i reduce4(const __m512i *A) {
    const __m512i p = _mm512_add_epi32(_mm512_unpacklo_epi32(A[0], A[1]), _mm512_unpackhi_epi32(A[0], A[1]));
    const __m512i q = _mm512_add_epi32(_mm512_unpacklo_epi32(A[2], A[3]), _mm512_unpackhi_epi32(A[2], A[3]));
    /* p per 128-bit lane: [a02 b02 a13 b13] (a = A0, b = A1, digits: int32s summed) */
    return _mm512_add_epi32(_mm512_unpacklo_epi64(p, q), _mm512_unpackhi_epi64(p, q));
}

/* A row's per-chunk view: where its codes, scales and zeros are. */
typedef struct rowp {
    const uint8_t *c;  /* row-major: the row's codes; tiled: its line in item 0 */
    const uint16_t *s; /* row-major: its scales; tiled: item 0's words + 8 lr */
    const uint8_t *z;  /* row-major: its zero bytes; tiled: item 0's bytes + 4 lr */
    int h;             /* tiled: the row's half of the tile */
    const float *pre;  /* TL == 2 (tile16): its chunk's scales and scales x zeros (tile_chunk_prep) */
} rowp;

/* One chunk [b0, b0 + nbc) for NR rows x TB tokens: acc[i][t] += its
 * share. Each row's codes are unpacked once for the TB tokens. nbc ==
 * CHUNK is a constant at the main call (everything folds). TL, BITS,
 * bpg: compile-time constants; TL 1: tiled, TL 2: tiled with the scales
 * prepared (rowp.pre). */
AVX512_INLINE void micro_chunk(const rowp *rp, const uint8_t *const *act, int64_t q8b, int64_t nb16, int64_t b0,
                               int nbc, const int NR, const int TB, const int bpg, const int TL, const int BITS,
                               __m512 acc[][GEMM_TB]) {
    const int nqc = (nbc + 3) / 4;
    const int64_t q0 = b0 >> 2;
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        __m512 sv, sz;
        if (TL == 2) {
            sv = _mm512_loadu_ps(rp[i].pre);
            sz = _mm512_loadu_ps(rp[i].pre + 16);
        } else if (TL) {
            sv = tiled_scales(rp[i].s + 16 * b0, rp[i].h, nbc);
            sz = _mm512_mul_ps(sv, tiled_zeros(rp[i].z + 8 * b0, rp[i].h, nbc));
        } else {
            sv = chunk_scales(rp[i].s, b0, nbc, bpg);
            sz = _mm512_mul_ps(sv, chunk_zeros(rp[i].z, b0, nbc, bpg));
        }
        __m512i lo[4], hi[4];
        #pragma GCC unroll 4
        for (int e = 0; e < 4; e++) {
            if (e < nqc) {
                const int nbq = nbc - 4 * e >= 4 ? 4 : nbc - 4 * e;
                unpack_quad(rp[i].c, q0 + e, nbq, TL, BITS, &lo[e], &hi[e]);
            } else {
                lo[e] = hi[e] = _mm512_setzero_si512();
            }
        }
        #pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            const int8_t *q8 = (const int8_t *)act[t] + 128 * q0;
            __m512i A[4];
            #pragma GCC unroll 4
            for (int e = 0; e < 4; e++) {
                if (e < nqc) {
                    A[e] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[e], _mm512_loadu_si512(q8 + 128 * e));
                    A[e] = _mm512_dpbusd_epi32(A[e], hi[e], _mm512_loadu_si512(q8 + 128 * e + 64));
                } else {
                    A[e] = _mm512_setzero_si512();
                }
            }
            const float *dx = (const float *)(act[t] + q8b) + b0;
            const __m512 d = _mm512_mul_ps(sv, _mm512_loadu_ps(dx));
            acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(reduce4(A)), d, acc[i][t]);
            acc[i][t] = _mm512_fnmadd_ps(sz, _mm512_loadu_ps(dx + nb16), acc[i][t]);
        }
    }
}

/* ======================================================================
 * GEMV (one token) and GEMM (many)
 * ==================================================================== */

typedef struct kargs {
    const spx_qtensor *q;
    const uint8_t *act;
    act_layout l;
    const float *x;
    int64_t T;
    float *y;
    int64_t ys;
    float *scratch;    /* gathered outlier x, xg_stride floats per token */
    int64_t xg_stride; /* n_outliers rounded up to 16 */
    int64_t crb, ng, zrb, items;
} kargs;

/* Row rt (0..15) of the tile whose item 0 is at cb, sb, zb: its line,
 * its scale words and zero bytes, its half. */
AVX512_INLINE rowp tile_row(const uint8_t *cb, const uint16_t *sb, const uint8_t *zb, int rt) {
    rowp p;
    p.h = rt >> 3;
    p.c = cb + 64 * rt;
    p.s = sb + 8 * (rt & 7);
    p.z = zb + 4 * (rt & 7);
    p.pre = NULL;
    return p;
}

/* Row-major row r's pointers; tiled row r's (its tile, its line). */
AVX512_INLINE rowp row_of(const kargs *a, int64_t r, const int TL) {
    if (TL) {
        const int64_t ti = (r >> 4) * a->items;
        return tile_row(a->q->codes + 1024 * ti, a->q->scales + 64 * ti, a->q->zeros + 32 * ti, (int)(r & 15));
    }
    rowp p;
    p.h = 0;
    p.c = a->q->codes + r * a->crb;
    p.s = a->q->scales + r * a->ng;
    p.z = a->q->zeros + r * a->zrb;
    p.pre = NULL;
    return p;
}

/* a + sum_j fp16(ov[j]) * xg[j], j < n (xg zero padded to 16). */
AVX512_INLINE __m512 outlier_dot16(const uint16_t *ov, const float *xg, int64_t n, __m512 a) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        a = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ov + j))), _mm512_loadu_ps(xg + j), a);
    if (j < n) {
        const __m256i h = _mm256_maskz_loadu_epi16((__mmask16)((1u << (n - j)) - 1), ov + j);
        a = _mm512_fmadd_ps(_mm512_cvtph_ps(h), _mm512_loadu_ps(xg + j), a);
    }
    return a;
}

/* x at the outlier columns of tokens t0 .. t0 + tn into scratch. */
static void gather_outliers(const kargs *a, int64_t t0, int64_t tn) {
    const int64_t no = a->q->n_outliers;
    for (int64_t t = 0; t < tn && no; t++) {
        const float *xt = a->x + (t0 + t) * a->q->cols;
        float *g = a->scratch + t * a->xg_stride;
        for (int64_t j = 0; j < no; j++) g[j] = xt[a->q->outlier_idx[j]];
        for (int64_t j = no; j < a->xg_stride; j++) g[j] = 0.0f;
    }
}

/* NR rows of one token over the whole row (chunks in order), outliers
 * added, y written. */
AVX512_INLINE void gemv_tile(const kargs *a, int64_t r, const int NR, const int bpg, const int TL, const int BITS) {
    rowp rp[GEMV_NR];
    __m512 acc[GEMV_NR][GEMM_TB];
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        rp[i] = row_of(a, r + i, TL);
        acc[i][0] = _mm512_setzero_ps();
    }
    const int64_t nb = a->l.nb;
    int64_t b0 = 0;
    for (; b0 + CHUNK <= nb; b0 += CHUNK)
        micro_chunk(rp, &a->act, a->l.q8b, a->l.nb16, b0, CHUNK, NR, 1, bpg, TL, BITS, acc);
    if (b0 < nb) micro_chunk(rp, &a->act, a->l.q8b, a->l.nb16, b0, (int)(nb - b0), NR, 1, bpg, TL, BITS, acc);
    const int64_t no = a->q->n_outliers;
    #pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        if (no) acc[i][0] = outlier_dot16(a->q->outlier_val + (r + i) * no, a->scratch, no, acc[i][0]);
        a->y[r + i] = _mm512_reduce_add_ps(acc[i][0]);
    }
}

AVX512_INLINE void gemv(const kargs *a, int64_t r0, int64_t r1, const int bpg, const int TL, const int BITS) {
    gather_outliers(a, 0, 1);
    int64_t r = r0;
    for (; r + GEMV_NR <= r1; r += GEMV_NR) gemv_tile(a, r, GEMV_NR, bpg, TL, BITS);
    switch (r1 - r) {
    case 3: gemv_tile(a, r, 3, bpg, TL, BITS); break;
    case 2: gemv_tile(a, r, 2, bpg, TL, BITS); break;
    case 1: gemv_tile(a, r, 1, bpg, TL, BITS); break;
    default: break;
    }
}

/* The 16 rows of tile T (all inside the matrix) for tokens t0 .. t0 + TB,
 * chunk by chunk (the tile's bytes stream forward), 4 rows per
 * micro-kernel for one token, 1 row for more; each row's sums in the
 * order gemv_tile sums them. Outlier x of token t at scratch + t *
 * xg_stride. */
AVX512_INLINE void tile16(const kargs *a, int64_t T, int64_t t0, const int TB) {
    const uint8_t *act[GEMM_TB];
    #pragma GCC unroll 8
    for (int t = 0; t < TB; t++) act[t] = a->act + (t0 + t) * a->l.stride;
    __m512 acc[SPX_Q_TILE_ROWS][GEMM_TB];
    const int64_t r = T * SPX_Q_TILE_ROWS, nb = a->l.nb, no = a->q->n_outliers, ti = T * a->items;
    const uint8_t *cb = a->q->codes + 1024 * ti, *zb = a->q->zeros + 32 * ti;
    const uint16_t *sb = a->q->scales + 64 * ti;
    for (int i = 0; i < SPX_Q_TILE_ROWS; i++)
        #pragma GCC unroll 8
        for (int t = 0; t < TB; t++) acc[i][t] = _mm512_setzero_ps();
    /* each row's pointers are the tile's bases plus constants (the row
     * loops unroll): nothing per row to keep in registers or memory */
    const int NR = TB == 1 ? GEMV_NR : 1;
    const int TLV = TB == 1 ? 1 : 2;
    float pre[32 * SPX_Q_TILE_ROWS] __attribute__((aligned(64)));
    int64_t b0 = 0;
    for (; b0 + CHUNK <= nb; b0 += CHUNK) {
        if (TLV == 2) tile_chunk_prep(sb + 16 * b0, zb + 8 * b0, CHUNK, pre);
        #pragma GCC unroll 16
        for (int g = 0; g < SPX_Q_TILE_ROWS; g += NR) {
            rowp rp[GEMV_NR];
            #pragma GCC unroll 4
            for (int i = 0; i < NR; i++) {
                rp[i] = tile_row(cb, sb, zb, g + i);
                rp[i].pre = pre + 32 * (g + i);
            }
            micro_chunk(rp, act, a->l.q8b, a->l.nb16, b0, CHUNK, NR, TB, 1, TLV, 4, acc + g);
        }
    }
    if (b0 < nb) {
        if (TLV == 2) tile_chunk_prep(sb + 16 * b0, zb + 8 * b0, (int)(nb - b0), pre);
        for (int g = 0; g < SPX_Q_TILE_ROWS; g += NR) {
            rowp rp[GEMV_NR];
            for (int i = 0; i < NR; i++) {
                rp[i] = tile_row(cb, sb, zb, g + i);
                rp[i].pre = pre + 32 * (g + i);
            }
            micro_chunk(rp, act, a->l.q8b, a->l.nb16, b0, (int)(nb - b0), NR, TB, 1, TLV, 4, acc + g);
        }
    }
    for (int i = 0; i < SPX_Q_TILE_ROWS; i++)
        #pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            __m512 v = acc[i][t];
            if (no) v = outlier_dot16(a->q->outlier_val + (r + i) * no, a->scratch + (t0 + t) * a->xg_stride, no, v);
            a->y[(t0 + t) * a->ys + r + i] = _mm512_reduce_add_ps(v);
        }
}

#define TILE16_FN(TB)                                                                                      \
    AVX512_FN __attribute__((noinline)) static void tile16_##TB(const kargs *a, int64_t T, int64_t t0) { \
        tile16(a, T, t0, TB);                                                                              \
    }
TILE16_FN(1) TILE16_FN(2) TILE16_FN(3) TILE16_FN(4) TILE16_FN(5) TILE16_FN(6) TILE16_FN(7) TILE16_FN(8)
typedef void (*tile16_fn)(const kargs *, int64_t, int64_t);
static const tile16_fn g_tile16[GEMM_TB] = {tile16_1, tile16_2, tile16_3, tile16_4,
                                            tile16_5, tile16_6, tile16_7, tile16_8};

/* One GEMM micro-tile: row r x TB tokens over blocks [kb0, kb1); the
 * partial sums replace y (first column chunk) or are added to it; the
 * last chunk also adds the outliers (x gathered into scratch). */
AVX512_INLINE void gemm_tile(const kargs *a, int64_t r, int64_t t0, int64_t kb0, int64_t kb1, const int TB,
                             const int bpg, const int TL, const int BITS) {
    const uint8_t *act[GEMM_TB];
    __m512 acc[1][GEMM_TB];
    #pragma GCC unroll 8
    for (int t = 0; t < TB; t++) {
        act[t] = a->act + (t0 + t) * a->l.stride;
        acc[0][t] = _mm512_setzero_ps();
    }
    const rowp rp = row_of(a, r, TL);
    int64_t b0 = kb0;
    for (; b0 + CHUNK <= kb1; b0 += CHUNK)
        micro_chunk(&rp, act, a->l.q8b, a->l.nb16, b0, CHUNK, 1, TB, bpg, TL, BITS, acc);
    if (b0 < kb1) micro_chunk(&rp, act, a->l.q8b, a->l.nb16, b0, (int)(kb1 - b0), 1, TB, bpg, TL, BITS, acc);
    const int64_t no = a->q->n_outliers;
    #pragma GCC unroll 8
    for (int t = 0; t < TB; t++) {
        __m512 v = acc[0][t];
        if (no && kb1 == a->l.nb) v = outlier_dot16(a->q->outlier_val + r * no, a->scratch + t * a->xg_stride, no, v);
        float *yt = a->y + (t0 + t) * a->ys + r;
        const float s = _mm512_reduce_add_ps(v);
        *yt = kb0 == 0 ? s : *yt + s;
    }
}

/* One function per (tokens, variant); variants: 4-bit bpg 1, 2, 4, tiled,
 * 2-bit bpg 1, 2, 4, 3-bit bpg 1, 2, 4 (index 0..9). */
#define GEMM_TILE_FN(TB, V, BPG, TL, BITS)                                                              \
    AVX512_FN __attribute__((noinline)) static void gemm_tile_##TB##_##V(const kargs *a, int64_t r,   \
                                                                         int64_t t0, int64_t kb0,     \
                                                                         int64_t kb1) {               \
        gemm_tile(a, r, t0, kb0, kb1, TB, BPG, TL, BITS);                                               \
    }
#define GEMM_TILE_FNS(V, BPG, TL, BITS)                                                                 \
    GEMM_TILE_FN(1, V, BPG, TL, BITS) GEMM_TILE_FN(2, V, BPG, TL, BITS) GEMM_TILE_FN(3, V, BPG, TL, BITS) \
    GEMM_TILE_FN(4, V, BPG, TL, BITS) GEMM_TILE_FN(5, V, BPG, TL, BITS) GEMM_TILE_FN(6, V, BPG, TL, BITS) \
    GEMM_TILE_FN(7, V, BPG, TL, BITS) GEMM_TILE_FN(8, V, BPG, TL, BITS)
GEMM_TILE_FNS(1, 1, 0, 4)
GEMM_TILE_FNS(2, 2, 0, 4)
GEMM_TILE_FNS(4, 4, 0, 4)
GEMM_TILE_FNS(t, 1, 1, 4)
GEMM_TILE_FNS(21, 1, 0, 2)
GEMM_TILE_FNS(22, 2, 0, 2)
GEMM_TILE_FNS(24, 4, 0, 2)
GEMM_TILE_FNS(31, 1, 0, 3)
GEMM_TILE_FNS(32, 2, 0, 3)
GEMM_TILE_FNS(34, 4, 0, 3)
typedef void (*gemm_tile_fn)(const kargs *, int64_t, int64_t, int64_t, int64_t);
#define GEMM_TILE_ROW(V)                                                                                \
    {gemm_tile_1_##V, gemm_tile_2_##V, gemm_tile_3_##V, gemm_tile_4_##V,                                \
     gemm_tile_5_##V, gemm_tile_6_##V, gemm_tile_7_##V, gemm_tile_8_##V}
static const gemm_tile_fn g_gemm_tiles[10][GEMM_TB] = {
    GEMM_TILE_ROW(1),  GEMM_TILE_ROW(2),  GEMM_TILE_ROW(4),  GEMM_TILE_ROW(t),  GEMM_TILE_ROW(21),
    GEMM_TILE_ROW(22), GEMM_TILE_ROW(24), GEMM_TILE_ROW(31), GEMM_TILE_ROW(32), GEMM_TILE_ROW(34)};

static void gemm(const kargs *a, int64_t r0, int64_t r1, int vi) {
    const int64_t nb = a->l.nb, no = a->q->n_outliers;
    const int64_t kbs = a->T <= MTOK_MAX ? nb : GEMM_KB; /* whole rows: the order tile16 sums in */
    for (int64_t rb0 = r0; rb0 < r1; rb0 += GEMM_RB) {
        const int64_t rb1 = rb0 + GEMM_RB < r1 ? rb0 + GEMM_RB : r1;
        for (int64_t kb0 = 0; kb0 < nb; kb0 += kbs) {
            const int64_t kb1 = kb0 + kbs < nb ? kb0 + kbs : nb;
            for (int64_t t0 = 0; t0 < a->T; t0 += GEMM_TB) {
                const int tn = a->T - t0 < GEMM_TB ? (int)(a->T - t0) : GEMM_TB;
                if (no && kb1 == nb) gather_outliers(a, t0, tn);
                for (int64_t r = rb0; r < rb1; r++) g_gemm_tiles[vi][tn - 1](a, r, t0, kb0, kb1);
            }
        }
    }
}

#define GEMV_FN(BITS, BPG)                                                                                 \
    AVX512_FN __attribute__((noinline)) static void gemv_##BITS##_##BPG(const kargs *a, int64_t r0, int64_t r1) { \
        gemv(a, r0, r1, BPG, 0, BITS);                                                                     \
    }
GEMV_FN(4, 1) GEMV_FN(4, 2) GEMV_FN(4, 4)
GEMV_FN(2, 1) GEMV_FN(2, 2) GEMV_FN(2, 4)
GEMV_FN(3, 1) GEMV_FN(3, 2) GEMV_FN(3, 4)
typedef void (*gemv_fn)(const kargs *, int64_t, int64_t);
static const gemv_fn g_gemv[3][3] = {{gemv_4_1, gemv_4_2, gemv_4_4}, {gemv_2_1, gemv_2_2, gemv_2_4},
                                     {gemv_3_1, gemv_3_2, gemv_3_4}};

AVX512_FN __attribute__((noinline)) static void gemv_tl_rows(const kargs *a, int64_t r0, int64_t r1) {
    gemv(a, r0, r1, 1, 1, 4);
}

/* Tiled GEMV: whole tiles by tile16, the rows of partial tiles by the
 * 4-row micro-kernels (same sums per row). */
static void gemv_tl(const kargs *a, int64_t r0, int64_t r1) {
    const int64_t tr = SPX_Q_TILE_ROWS, t0 = (r0 + tr - 1) / tr, t1 = r1 / tr;
    if (t0 >= t1) {
        gemv_tl_rows(a, r0, r1);
        return;
    }
    gemv_tl_rows(a, r0, t0 * tr); /* also gathers the outlier x (for an empty range too) */
    for (int64_t T = t0; T < t1; T++) g_tile16[0](a, T, 0);
    if (t1 * tr < r1) gemv_tl_rows(a, t1 * tr, r1);
}

/* Tiled product of 2..MTOK_MAX tokens: tile by tile, in balanced passes
 * of at most 8 tokens (the later passes find the tile in L2); rows of
 * partial tiles by gemm() (before the outliers are gathered: gemm uses
 * the same scratch). */
static void gemm_tl16(const kargs *a, int64_t r0, int64_t r1) {
    const int64_t tr = SPX_Q_TILE_ROWS, t0 = (r0 + tr - 1) / tr, t1 = r1 / tr;
    if (t0 >= t1) {
        gemm(a, r0, r1, 3);
        return;
    }
    if (r0 < t0 * tr) gemm(a, r0, t0 * tr, 3);
    gather_outliers(a, 0, a->T);
    const int passes = (int)((a->T + GEMM_TB - 1) / GEMM_TB);
    for (int64_t T = t0; T < t1; T++)
        for (int p = 0, tk = 0; p < passes; p++) {
            int tn = (int)((a->T - tk) / (passes - p));
            if ((a->T - tk) % (passes - p)) tn++;
            g_tile16[tn - 1](a, T, tk);
            tk += tn;
        }
    if (t1 * tr < r1) gemm(a, t1 * tr, r1, 3);
}

static void v_rows(const spx_qtensor *q, const void *act, const float *x, int64_t T, float *y, int64_t y_stride,
                   int64_t r0, int64_t r1, void *scratch) {
    const int tl = q->layout == SPX_Q_TILED;
    if (!fast_ok(q) || (tl && !spx_q_tiled_ok(q->bits, q->group, q->cols))) {
        spx_qkernels_scalar()->rows(q, act, x, T, y, y_stride, r0, r1, scratch);
        return;
    }
    if (r0 >= r1 || T <= 0) return;
    kargs a;
    a.q = q;
    a.act = (const uint8_t *)act;
    a.l = layout_of(q->cols);
    a.x = x;
    a.T = T;
    a.y = y;
    a.ys = y_stride;
    a.scratch = (float *)scratch;
    a.xg_stride = (q->n_outliers + 15) & ~(int64_t)15;
    a.crb = spx_q_codes_row_bytes(q->cols, q->bits);
    a.ng = spx_q_groups(q->cols, q->group);
    a.zrb = spx_q_zeros_row_bytes(q->cols, q->group);
    a.items = q->cols / SPX_Q_TILE_COLS;
    const int bpg = q->group / BLK, gi = bpg == 1 ? 0 : bpg == 2 ? 1 : 2;
    const int wi = q->bits == 4 ? 0 : q->bits == 2 ? 1 : 2;
    if (T == 1) {
        if (tl) gemv_tl(&a, r0, r1);
        else g_gemv[wi][gi](&a, r0, r1);
    } else if (tl && T <= MTOK_MAX) {
        gemm_tl16(&a, r0, r1);
    } else {
        gemm(&a, r0, r1, tl ? 3 : wi == 0 ? gi : 1 + 3 * wi + gi);
    }
}

static const spx_qkernels g_avx512 = {
    .name = "avx512",
    .act_bytes = v_act_bytes,
    .scratch_bytes = v_scratch_bytes,
    .prepare = v_prepare,
    .rows = v_rows,
    .scores_f16 = spx_avx512_scores_f16,
    .wv_f16 = spx_avx512_wv_f16,
    .dot_q4g = spx_avx512_dot_q4g,
    .axpy_q4g = spx_avx512_axpy_q4g,
    .softmax = spx_avx512_softmax,
};

/* ======================================================================
 * The amx table: the avx512 table, except that products of T >=
 * SPX_AMX_MIN_T tokens take the tiles (qkernels_amx.c), with their own
 * activation format; prepare() and rows() both choose by T.
 * ==================================================================== */

static size_t amx_act_bytes(int64_t T, int64_t cols, int group) {
    return T >= SPX_AMX_MIN_T ? spx_amx_act_bytes(T, cols, group) : v_act_bytes(T, cols, group);
}
static size_t amx_scratch_bytes(int64_t T, int64_t cols, int group) {
    return T >= SPX_AMX_MIN_T ? spx_amx_scratch_bytes(T, cols, group) : v_scratch_bytes(T, cols, group);
}
static void amx_prepare(const float *x, int64_t T, int64_t cols, int group, void *act) {
    if (T >= SPX_AMX_MIN_T) spx_amx_prepare(x, T, cols, group, act);
    else v_prepare(x, T, cols, group, act);
}
static void amx_rows(const spx_qtensor *q, const void *act, const float *x, int64_t T, float *y, int64_t y_stride,
                     int64_t r0, int64_t r1, void *scratch) {
    if (T >= SPX_AMX_MIN_T) spx_amx_rows(q, act, x, T, y, y_stride, r0, r1, scratch);
    else v_rows(q, act, x, T, y, y_stride, r0, r1, scratch);
}

static const spx_qkernels g_amx = {
    .name = "amx",
    .act_bytes = amx_act_bytes,
    .scratch_bytes = amx_scratch_bytes,
    .prepare = amx_prepare,
    .rows = amx_rows,
    .scores_f16 = spx_avx512_scores_f16,
    .wv_f16 = spx_avx512_wv_f16,
    .dot_q4g = spx_avx512_dot_q4g,
    .axpy_q4g = spx_avx512_axpy_q4g,
    .softmax = spx_avx512_softmax,
};

const spx_qkernels *spx_qkernels_avx512_table(void) { return &g_avx512; }
const spx_qkernels *spx_qkernels_amx_table(void) { return &g_amx; }

#else /* not x86 */

const spx_qkernels *spx_qkernels_avx512_table(void) { return NULL; }
const spx_qkernels *spx_qkernels_amx_table(void) { return NULL; }

#endif
