/* qkernels_avx2.c: the AVX2 + FMA + F16C variant of the quantized GEMV /
 * GEMM kernels (qkernels.h), with int8 activations.
 *
 * Every function that uses these instructions carries the target attribute,
 * so the file builds without -mavx2 and nothing here runs unless dispatch
 * (qkernels.c) found the features. Non-x86 builds compile the getter only
 * (it returns NULL).
 *
 * Fast path: bits 2, 3 and 4, group 32, 64 or 128. Other group sizes
 * fall back to the scalar reference on the float x (by design, not an
 * error): rows() calls the scalar table's rows(); prepare() does nothing
 * for them (act_bytes() is 0 then). The activations do not depend on the
 * width: one prepare() serves matrices of every width.
 *
 * Widths. Every width yields the same code vectors, one code per byte, 32
 * per vector: a pair of blocks' low halves and their high halves
 * (lo[p], hi[p] below), and from there the arithmetic is shared. 4-bit:
 * one 32-byte load per pair, a shift and two masks. 2 and 3 bits: one
 * item (qtensor.h: 4 blocks, both pairs of a half chunk) at a time,
 * unpack_item: 2-bit one load, 3 shifts, 4 masks; 3-bit a load and a
 * 16-byte broadcast, 4 shifts, 6 masks and an or. The codes of bits 2
 * and 3 are row-major only (no tiled form).
 *
 * Layouts: SPX_Q_ROWS, and SPX_Q_TILED (qtensor.h; 4-bit G32 only) read in
 * place. A chunk of 8 blocks is 2 whole items and a pair's 32-byte code
 * load lies inside one item, so only the row pointers, the pair offsets and
 * the scale / zero gathers differ (tiled_scales, tiled_zeros; a
 * compile-time flag TL): the arithmetic, and y, are bit-identical to the
 * row-major copy's. A tiled matrix of another group size (never stored)
 * takes the scalar table.
 *
 * Activation format. A row's 4-bit codes are cut into 16-byte pieces; the
 * 32 codes of piece b (both nibbles) form block b (for every width, the
 * blocks of qtensor.h). With bpg = G / 32 blocks per group, block b = bpg
 * * g + i covers the columns
 *     g*G + 16i + [0,16)  (low nibbles)  and  g*G + G/2 + 16i + [0,16)  (high)
 * (for G32: the group's 32 columns). Each block of x gets its own scale:
 *     dx_b = max|x| over the block / 127,   x8 = round_even(x * 127 / max|x|)
 * in [-127, 127], so |x - dx_b * x8| <= dx_b / 2 (+ the float rounding of
 * x * (127 / max)). Per token (act_layout.stride bytes):
 *     q8[cols]   int8; block pairs (2p, 2p+1) as 64 bytes
 *                [lo(2p) | lo(2p+1) | hi(2p) | hi(2p+1)] (16 each), so the
 *                32-byte code load of blocks 2p, 2p+1 meets its x in two
 *                loads; an odd last block (G32, odd group count) is [lo | hi].
 *     dx[nb8]    float per block, nb8 = blocks rounded up to 8, zero padded;
 *     xsb[nb8]   float per block: dx_b * sum(x8 of the block);
 *                both in "tree order" within each chunk of 8 blocks: slot k
 *                holds block TREE[k], TREE = [0 2 4 6 1 3 5 7] (below).
 *
 * Arithmetic. Per block, in integers, dot = sum_k q_k x8_k: maddubs of the
 * codes (u8) by x8 (s8) for the low and high halves, added in int16
 * (|.| <= 7620 for 4-bit codes), two levels of int16 hadds across the
 * chunk's four pairs (|.| <= 30480, no wrap), then madd with ones to
 * int32 (the exact block sums). Then in float
 *     y += s * dx * dot - s * z * xsb  =  s * dx * sum_k (q_k - z) x8_k,
 * so an outlier slot (q = z) adds exactly 0; the fp16 outlier columns are
 * added as float (fp16 value x float x) to the same accumulators.
 * Why int8 activations: on two cores the kernels run at the rate of
 * instructions per weight, and one maddubs does 32 multiplies where a float
 * FMA does 8 (and would need every nibble converted to float first).
 * Accuracy: |y - y_exact| <= sum_blocks s * sum_k |q_k - z| * dx_b / 2 plus
 * float rounding; tests/test_kernels.c checks this bound.
 *
 * Loops. A micro-kernel of NR rows x TB tokens walks the blocks in chunks
 * of 8 (256 columns). Per row and chunk it unpacks the chunk's codes once
 * (to bytes: four pairs' lo and hi) and reuses them for the TB tokens; per row,
 * token and chunk the four pair sums are reduced by a tree of hadds to one
 * vector whose lane k is block TREE[k], which then takes one convert, one
 * multiply (row scales x token dx, both in tree order) and two FMAs. GEMV
 * (T = 1): 4 rows x 1 token over the whole row; outliers added before the
 * horizontal sum, y written once. GEMM (T > 1): row blocks of 64 rows x
 * column chunks of 4096 (a row block's weights of one chunk stay in L2)
 * x token blocks of 8 (their activations stay in L1); 1 row x 8 tokens per
 * micro-kernel (8 code vectors + 8 accumulators in registers); the last
 * column chunk adds the outliers. Tiled GEMV runs the 4-row micro-kernel
 * over all 16 rows of a tile per chunk (tile16), so the tile's bytes
 * stream forward; so do tiled products of 2..16 tokens (gemm_tl16),
 * 8 tokens at most per pass over a tile. The sizes below were tuned on a 2-core AVX2 Xeon
 * (bench/results/). There the kernels are bound by instructions, not
 * memory, and most of them are per token (the int8 dot and reduction,
 * the same at every width), so 2- and 3-bit matrices take about the time
 * of 4-bit ones per weight: fewer bytes, not fewer cycles, until the
 * weights come from DRAM. */
#include "cpu/qkernels.h"
#include "quant/g32.h"

#include <stdint.h>
#include <math.h>
#include <string.h>

const spx_qkernels *spx_qkernels_avx2_table(void);

#if defined(__x86_64__) || defined(__i386__)
#include "cpu/qkernels_avx2.h"

enum {
    BLK = 32,        /* columns per activation block */
    CHUNK = 8,       /* blocks per chunk (scale vectors are 8 lanes) */
    GEMV_NR = 4,     /* rows per GEMV micro-kernel */
    GEMM_TB = 8,     /* tokens per GEMM micro-kernel (one row: the chunk's
                      * unpacked codes stay in registers for 8 tokens) */
    GEMM_RB = 64,    /* rows per GEMM row block: its weights of one column chunk
                      * (128 KB at 4096 columns) stay in L2 while the
                      * activations stream through once per row block. 256
                      * was 3-8% faster on one thread but 10-20% slower on
                      * two (pp512 shapes, 2-core Xeon VMs) */
    GEMM_KB = 128,   /* blocks per GEMM column chunk (multiple of CHUNK): 4096 cols */
    MTOK_MAX = 16    /* tiled products of 2..16 tokens (decode-sized: speculation's
                      * verification, a batch of sessions) take gemm_tl16 */
};

#define ACC_N 8 /* max(GEMM_TB, 1): inner size of accumulator arrays */

static int fast_ok(const spx_qtensor *q) {
    return spx_qk_int8_group(q->group) && (q->bits == 4 || ((q->bits == 2 || q->bits == 3) && q->layout == SPX_Q_ROWS));
}

/* ======================================================================
 * Activation layout
 * ==================================================================== */

typedef struct act_layout {
    int64_t nb;     /* blocks per token: cols / 32 */
    int64_t nb8;    /* nb rounded up to 8 */
    int64_t stride; /* bytes per token, a multiple of 32 */
} act_layout;

static act_layout layout_of(int64_t cols) {
    act_layout l;
    l.nb = cols / BLK;
    l.nb8 = (l.nb + CHUNK - 1) / CHUNK * CHUNK;
    l.stride = (cols + 2 * l.nb8 * (int64_t)sizeof(float) + 31) / 32 * 32;
    return l;
}

static size_t avx2_act_bytes(int64_t T, int64_t cols, int group) {
    if (!spx_qk_int8_group(group) || cols <= 0 || cols % group) return 0;
    return (size_t)T * (size_t)layout_of(cols).stride;
}

/* x at the outlier columns, gathered for up to GEMM_TB tokens (n_outliers
 * <= cols, each token's row padded to 8); also covers the scalar
 * fallback's cols floats. */
static size_t avx2_scratch_bytes(int64_t T, int64_t cols, int group) {
    (void)group;
    int64_t nt = T == 1 ? 1 : T <= MTOK_MAX && T > GEMM_TB ? T : GEMM_TB; /* gemm_tl16: all T tokens at once */
    return (size_t)nt * ((size_t)cols + 8) * sizeof(float);
}

/* Byte offsets of block b's low / high 16 x8 values in a token's q8. */
static inline int64_t q8_lo_off(int64_t b) { return 32 * (b & ~(int64_t)1) + 16 * (b & 1); }
static inline int64_t q8_hi_off(int64_t b, int64_t nb) {
    if ((nb & 1) && b == nb - 1) return 32 * b + 16;
    return 32 * (b & ~(int64_t)1) + 32 + 16 * (b & 1);
}

AVX2_INLINE int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Position of block j of a chunk in tree order: TREE[tree_pos[j]] = j. */
static const int8_t tree_pos[CHUNK] = {0, 4, 1, 5, 2, 6, 3, 7};

AVX2_FN static void avx2_prepare(const float *x, int64_t T, int64_t cols, int group, void *act) {
    if (!spx_qk_int8_group(group) || cols <= 0 || cols % group) return;
    act_layout l = layout_of(cols);
    const int64_t half = group / 2, bpg = group / BLK;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * cols;
        uint8_t *base = (uint8_t *)act + t * l.stride;
        int8_t *q8 = (int8_t *)base;
        float *dx = (float *)(base + cols), *xsb = dx + l.nb8;
        for (int64_t b = 0; b < l.nb; b++) {
            int64_t g = b / bpg, i = b % bpg;
            const float *lo = xt + g * group + 16 * i, *hi = lo + half;
            __m256 v0 = _mm256_loadu_ps(lo), v1 = _mm256_loadu_ps(lo + 8);
            __m256 v2 = _mm256_loadu_ps(hi), v3 = _mm256_loadu_ps(hi + 8);
            __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
                                     _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
            float amax = hmax_ps(m);
            float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
            __m256 vid = _mm256_set1_ps(id);
            /* round to nearest even (MXCSR default); |x * id| <= 127 */
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));
            __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
            __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
            int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            p = _mm256_permutevar8x32_epi32(p, perm); /* [lo 16 | hi 16] in column order */
            _mm_storeu_si128((__m128i *)(q8 + q8_lo_off(b)), _mm256_castsi256_si128(p));
            _mm_storeu_si128((__m128i *)(q8 + q8_hi_off(b, l.nb)), _mm256_extracti128_si256(p, 1));
            int64_t k = (b & ~(int64_t)7) + tree_pos[b & 7];
            dx[k] = d;
            xsb[k] = d * (float)sum;
        }
        for (int64_t b = l.nb; b < l.nb8; b++) {
            int64_t k = (b & ~(int64_t)7) + tree_pos[b & 7];
            dx[k] = xsb[k] = 0.0f;
        }
    }
}

/* ======================================================================
 * Micro-kernel
 * ==================================================================== */

typedef struct kmat {
    const uint8_t *codes;
    const uint16_t *scales;
    const uint8_t *zeros;
    int64_t crb, ng, zrb; /* codes bytes, groups, zero bytes per row */
    int64_t items;        /* SPX_Q_TILED: 128-column items per row */
} kmat;

/* Per-block scales of chunk [b0, b0 + nbc) of one row in tree order (lane
 * k: block b0 + TREE[k]; 0 past nbc). bpg is a compile-time constant at
 * every call. */
AVX2_INLINE __m256 chunk_scales(const uint16_t *srow, int64_t b0, int nbc, const int bpg) {
    int64_t g0 = b0 / bpg;
    __m128i h;
    if (nbc == CHUNK) {
        if (bpg == 1) {
            h = _mm_loadu_si128((const __m128i *)(srow + g0));
        } else if (bpg == 2) {
            h = _mm_loadl_epi64((const __m128i *)(srow + g0));
        } else {
            int32_t u;
            memcpy(&u, srow + g0, 4);
            h = _mm_cvtsi32_si128(u);
        }
    } else {
        uint16_t tmp[8];
        int n = (nbc + bpg - 1) / bpg;
        for (int k = 0; k < 8; k++) tmp[k] = k < n ? srow[g0 + k] : 0;
        h = _mm_loadu_si128((const __m128i *)tmp);
    }
    /* lane k holds block TREE[k]'s group: TREE / bpg */
    const __m256i idx = bpg == 1   ? _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)
                        : bpg == 2 ? _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3)
                                   : _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1);
    return _mm256_permutevar8x32_ps(_mm256_cvtph_ps(h), idx);
}

/* Per-block zero points of the chunk as floats, tree order: nibble g of
 * the row's zero bytes is bits 4g.. of the little-endian bytes (group 2i
 * low, 2i+1 high). */
AVX2_INLINE __m256 chunk_zeros(const uint8_t *zrow, int64_t b0, int nbc, const int bpg) {
    int64_t g0 = b0 / bpg; /* even: a chunk spans 256 columns, G <= 128 */
    uint32_t u = 0;
    if (nbc == CHUNK) { /* constant sizes: plain loads, no memcpy call */
        if (bpg == 1) {
            memcpy(&u, zrow + g0 / 2, 4);
        } else if (bpg == 2) {
            uint16_t h;
            memcpy(&h, zrow + g0 / 2, 2);
            u = h;
        } else {
            u = zrow[g0 / 2];
        }
    } else {
        for (int k = 0; k < ((nbc + bpg - 1) / bpg + 1) / 2; k++) u |= (uint32_t)zrow[g0 / 2 + k] << (8 * k);
    }
    /* lane k: the nibble of block TREE[k]'s group, 4 * (TREE[k] / bpg) */
    const __m256i sh = bpg == 1   ? _mm256_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28)
                       : bpg == 2 ? _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12)
                                  : _mm256_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4);
    __m256i z = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)u), sh),
                                 _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(z);
}

/* SPX_Q_TILED (G32): a chunk of 8 blocks = groups 4k .. 4k + 7 = items k
 * and k + 1 (b0 = 4k; b0 is a multiple of 8, so a chunk never starts
 * mid-item; a tail chunk is one item: nbc = 4). Row R of a tile, h =
 * (R >> 3) & 1, has per item 4 scale words (32-bit, one per group; fp16
 * half h is row R's) and 4 zero bytes (one per group; nibble h is row R's).
 * srow = its words in item 0 plus h (fp16 units: 64 per item), zrow = its
 * zero bytes in item 0 (32 per item). */

/* The chunk's scales in tree order. A 16-byte load at srow (+ h) has the
 * row's 4 scales of item k in its even fp16 slots; one at 63 fp16 further
 * has item k + 1's in its odd slots; one blend interleaves them (groups 0
 * 4 1 5 2 6 3 7), the permute puts them in tree order. For h = 1 the
 * first load reads one fp16 past item k's words, which after the last item
 * could be past the array: the tail chunk (one item, the row's last)
 * shifts the word-aligned load instead. */
AVX2_INLINE __m256 tiled_scales(const uint16_t *srow, int h, int64_t b0, int nbc) {
    const uint16_t *s = srow + 16 * b0; /* 64 fp16 per item, 4 blocks per item */
    /* lane k: group TREE[k] = [0 2 4 6 1 3 5 7][k], in slot 2g (g < 4) or 2 (g - 4) + 1 */
    const __m256i idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    if (nbc == CHUNK)
        return _mm256_permutevar8x32_ps(
            _mm256_cvtph_ps(_mm_blend_epi16(_mm_loadu_si128((const __m128i *)s),
                                            _mm_loadu_si128((const __m128i *)(s + 63)), 0xaa)),
            idx);
    __m128i v = _mm_srl_epi32(_mm_loadu_si128((const __m128i *)(s - h)), _mm_cvtsi32_si128(16 * h));
    return _mm256_permutevar8x32_ps(_mm256_cvtph_ps(_mm_and_si128(v, _mm_set1_epi32(0xffff))), idx);
}

/* Per-lane shifts for tiled_zeros: lane k holds the zero word of group
 * TREE[k]'s item; its byte is TREE[k] % 4, its nibble h. */
AVX2_INLINE __m256i tiled_zshift(int h) {
    return _mm256_add_epi32(_mm256_setr_epi32(0, 16, 0, 16, 8, 24, 8, 24), _mm256_set1_epi32(4 * h));
}

/* The chunk's zero points in tree order: each item's 4 zero bytes
 * broadcast (a load-port broadcast each), lanes 2, 3, 6, 7 (groups 4 .. 7)
 * from item k + 1, then shifted per lane (zsh = tiled_zshift(h)). */
AVX2_INLINE __m256 tiled_zeros(const uint8_t *zrow, __m256i zsh, int64_t b0, int nbc) {
    const uint8_t *z = zrow + 8 * b0; /* 32 bytes per item */
    int32_t w0, w1 = 0;
    memcpy(&w0, z, 4);
    if (nbc == CHUNK) memcpy(&w1, z + 32, 4);
    __m256i v = _mm256_blend_epi32(_mm256_set1_epi32(w0), _mm256_set1_epi32(w1), 0xcc);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(v, zsh), _mm256_set1_epi32(15)));
}

/* Row rt (0..15) of a tile whose item 0 (or, rebased, the current chunk)
 * starts at codes c, scales s, zero bytes z: its pointers for micro_chunk
 * (crow into the item's 1024 code bytes, srow to its scale words plus its
 * half h, zrow to its zero bytes), h and tiled_zshift(h). */
AVX2_INLINE void tiled_row(const uint8_t *c, const uint16_t *s, const uint8_t *z, int rt, const uint8_t **crow,
                           const uint16_t **srow, const uint8_t **zrow, int *h, __m256i *zsh) {
    const int lr = rt & 7;
    *h = rt >> 3;
    *crow = c + 64 * rt;
    *srow = s + 8 * lr + *h;
    *zrow = z + 4 * lr;
    *zsh = tiled_zshift(*h);
}

/* int16 sums of one pair's codes (blocks b, b + 1: lanes [8 x b | 8 x
 * b+1]) against x: the low- and high-half products added in int16
 * (|sum| <= 2 * 2 * 15 * 127 = 7620 for 4-bit codes, less for 2 and 3). */
AVX2_INLINE __m256i pair_dot(__m256i lo, __m256i hi, const int8_t *xlo, const int8_t *xhi) {
    return _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xlo)),
                            _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)xhi)));
}

/* One item of 2- or 3-bit codes (qtensor.h: 4 blocks, 128 codes) at it,
 * as the code vectors of its two pairs: lo0 / hi0 for blocks 0 and 1
 * (code vectors V0, V1), lo1 / hi1 for blocks 2 and 3 (V2, V3), one code
 * per byte in the order the activation pairs want (lane 0 the even block,
 * lane 1 the odd one). 2 bits: byte p holds V at bits 2V; 3 bits: X[p]
 * holds V0, V1 and V2's two high bits, the 16-byte Y (broadcast to both
 * lanes, then shifted by 4 in lane 1 to bring down its high nibbles)
 * V2's low bit and V3. */
AVX2_INLINE void unpack_item(const uint8_t *it, const int BITS, __m256i *lo0, __m256i *hi0, __m256i *lo1,
                             __m256i *hi1) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)it);
    if (BITS == 2) {
        const __m256i m3 = _mm256_set1_epi8(3);
        *lo0 = _mm256_and_si256(x, m3);
        *hi0 = _mm256_and_si256(_mm256_srli_epi16(x, 2), m3);
        *lo1 = _mm256_and_si256(_mm256_srli_epi16(x, 4), m3);
        *hi1 = _mm256_and_si256(_mm256_srli_epi16(x, 6), m3);
    } else {
        const __m256i m7 = _mm256_set1_epi8(7);
        const __m256i y = _mm256_srlv_epi64(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(it + 32))),
                                            _mm256_setr_epi64x(0, 0, 4, 4));
        *lo0 = _mm256_and_si256(x, m7);
        *hi0 = _mm256_and_si256(_mm256_srli_epi16(x, 3), m7);
        *lo1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 5), _mm256_set1_epi8(6)),
                               _mm256_and_si256(y, _mm256_set1_epi8(1)));
        *hi1 = _mm256_and_si256(_mm256_srli_epi16(y, 1), m7);
    }
}

/* One chunk [b0, b0 + nbc) for NR rows x TB tokens. Called with nbc ==
 * CHUNK (a constant: everything folds) for full chunks and once with the
 * variable tail. The four pair sums of a chunk are reduced by a tree of
 * hadds to one vector with lane k = block TREE[k] = [0 2 4 6 1 3 5 7][k],
 * the order in which dx, xsb (act) and the row's scales and zero points
 * (chunk_scales, chunk_zeros) are laid out, so a chunk costs one convert,
 * one multiply and two FMAs per row and token. TL (a constant): the matrix
 * is SPX_Q_TILED (bpg 1); srow, zrow as for tiled_scales, hs[i] = h,
 * zsh[i] = tiled_zshift(h); block b's 16 code bytes are at crow + 1024
 * (b / 4) + 16 (b % 4), so a pair's 32 bytes stay inside one item. BITS
 * (a constant): 4, or 2 and 3, whose codes come an item (two pairs) at a
 * time from unpack_item; an odd last block's partner lane holds the
 * item's padding, whose dot product meets the absent block's dx = 0 and
 * scale 0 (act and chunk_scales pad with zeros): it adds exactly 0,
 * whatever the padding holds. */
AVX2_INLINE void micro_chunk(const uint8_t *const *crow, const uint16_t *const *srow,
                             const uint8_t *const *zrow, const int *hs, const __m256i *zsh,
                             const int8_t *const *q8,
                             const float *const *dx, const float *const *xs, int64_t b0, int nbc,
                             const int NR, const int TB, const int bpg, const int TL, const int BITS,
                             __m256 acc[][ACC_N]) {
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const int np = (nbc + 1) / 2; /* pairs, counting an odd last block (G32) as one */
    #pragma GCC unroll 8
    for (int i = 0; i < NR; i++) {
        __m256 sv = TL ? tiled_scales(srow[i], hs[i], b0, nbc) : chunk_scales(srow[i], b0, nbc, bpg);
        __m256 sz = _mm256_mul_ps(sv, TL ? tiled_zeros(zrow[i], zsh[i], b0, nbc)
                                         : chunk_zeros(zrow[i], b0, nbc, bpg));
        __m256i lo[CHUNK / 2], hi[CHUNK / 2];
        if (BITS != 4) {
            #pragma GCC unroll 2
            for (int j = 0; j < CHUNK / 4; j++) {
                if (2 * j >= np) {
                    lo[2 * j] = hi[2 * j] = lo[2 * j + 1] = hi[2 * j + 1] = _mm256_setzero_si256();
                    continue;
                }
                unpack_item(crow[i] + 16 * BITS * ((b0 >> 2) + j), BITS, &lo[2 * j], &hi[2 * j], &lo[2 * j + 1],
                            &hi[2 * j + 1]);
            }
        } else {
            #pragma GCC unroll 4
            for (int p = 0; p < CHUNK / 2; p++) {
                if (p >= np) {
                    lo[p] = hi[p] = _mm256_setzero_si256();
                    continue;
                }
                /* tiled: blocks b0 + 2p, b0 + 2p + 1 (b0 % 8 == 0) are item
                 * b0 / 4 + p / 2, bytes 32 (p % 2) .. + 32 */
                const uint8_t *cp = TL ? crow[i] + 256 * b0 + 1024 * (p >> 1) + 32 * (p & 1)
                                       : crow[i] + 16 * (b0 + 2 * p);
                /* an odd last block loads 16 bytes: its upper lanes are 0 codes */
                __m256i c = 2 * p + 1 < nbc ? _mm256_loadu_si256((const __m256i *)cp)
                                            : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)cp));
                lo[p] = _mm256_and_si256(c, mask);
                hi[p] = _mm256_and_si256(_mm256_srli_epi16(c, 4), mask);
            }
        }
        #pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            __m256i ps[CHUNK / 2];
            #pragma GCC unroll 4
            for (int p = 0; p < CHUNK / 2; p++) {
                if (p >= np) {
                    ps[p] = _mm256_setzero_si256();
                    continue;
                }
                const int8_t *xq = q8[t] + 32 * (b0 + 2 * p);
                /* an odd last block's x is [lo | hi]; the 16 bytes read past
                 * it stay inside the token (dx follows) and meet 0 codes */
                ps[p] = pair_dot(lo[p], hi[p], xq, xq + (2 * p + 1 < nbc ? 32 : 16));
            }
            /* two levels of int16 hadds (|.| <= 4 * 7620 = 30480: no wrap)
             * then int16 pairs to int32: the exact sums a tree of int32
             * hadds would give, lane k = block TREE[k], in one multiply
             * instead of four */
            __m256i h = _mm256_madd_epi16(
                _mm256_hadd_epi16(_mm256_hadd_epi16(ps[0], ps[1]), _mm256_hadd_epi16(ps[2], ps[3])),
                _mm256_set1_epi16(1));
            __m256 d = _mm256_mul_ps(sv, _mm256_loadu_ps(dx[t] + b0));
            acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), d, acc[i][t]);
            acc[i][t] = _mm256_fnmadd_ps(sz, _mm256_loadu_ps(xs[t] + b0), acc[i][t]);
        }
    }
}

/* acc[i][t] (8 lanes each) += rows r..r+NR-1 of the matrix times tokens
 * t of act (base, stride) over blocks [kb0, kb1) (kb0 a multiple of 8).
 * TL: the matrix is SPX_Q_TILED; row R's pointers are tiled_row's for
 * row R % 16 of its tile, whose item 0 is at codes + 1024 ti, scales + 64
 * ti, zeros + 32 ti (ti = (R / 16) * items). */
AVX2_INLINE void micro(const kmat *m, int64_t r, const uint8_t *abase, int64_t astride,
                       int64_t cols, int64_t nb8, int64_t kb0, int64_t kb1, const int NR,
                       const int TB, const int bpg, const int TL, const int BITS, __m256 acc[][ACC_N]) {
    const uint8_t *crow[GEMV_NR], *zrow[GEMV_NR];
    const uint16_t *srow[GEMV_NR];
    int hs[GEMV_NR];
    __m256i zsh[GEMV_NR];
    #pragma GCC unroll 8
    for (int i = 0; i < NR; i++) {
        int64_t R = r + i;
        if (TL) {
            const int64_t ti = (R >> 4) * m->items;
            tiled_row(m->codes + 1024 * ti, m->scales + 64 * ti, m->zeros + 32 * ti, (int)(R & 15), &crow[i], &srow[i],
                      &zrow[i], &hs[i], &zsh[i]);
        } else {
            hs[i] = 0;
            zsh[i] = _mm256_setzero_si256();
            crow[i] = m->codes + R * m->crb;
            srow[i] = m->scales + R * m->ng;
            zrow[i] = m->zeros + R * m->zrb;
        }
    }
    const int8_t *q8[ACC_N];
    const float *dx[ACC_N], *xs[ACC_N];
    #pragma GCC unroll 8
    for (int t = 0; t < TB; t++) {
        q8[t] = (const int8_t *)(abase + t * astride);
        dx[t] = (const float *)(abase + t * astride + cols);
        xs[t] = dx[t] + nb8;
    }
    int64_t kfull = kb0 + (kb1 - kb0) / CHUNK * CHUNK;
    for (int64_t b0 = kb0; b0 < kfull; b0 += CHUNK)
        micro_chunk(crow, srow, zrow, hs, zsh, q8, dx, xs, b0, CHUNK, NR, TB, bpg, TL, BITS, acc);
    if (kfull < kb1)
        micro_chunk(crow, srow, zrow, hs, zsh, q8, dx, xs, kfull, (int)(kb1 - kfull), NR, TB, bpg, TL, BITS, acc);
}

/* fp16 p[0..n) as floats, 0 < n < 8, zeros after. When the 16-byte read
 * stays below `end` (the end of the outlier array) it reads directly and
 * masks; otherwise (the last row) through a small buffer, element by
 * element (no memcpy call: a call would spill every ymm register). */
AVX2_INLINE __m256 f16_partial(const uint16_t *p, int n, const uint16_t *end) {
    if (end - p >= 8) {
        __m256 keep = _mm256_castsi256_ps(
            _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
        return _mm256_and_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), keep);
    }
    uint16_t tmp[8];
    for (int k = 0; k < 8; k++) tmp[k] = k < n ? p[k] : 0;
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tmp));
}

/* a + sum_j fp16(ov[j]) * xg[j] (8 lanes), j < n; xg is zero padded to a
 * multiple of 8; end as for f16_partial. */
AVX2_INLINE __m256 outlier_dot8(const uint16_t *ov, const float *xg, int64_t n, __m256 a,
                                const uint16_t *end) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        a = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ov + j))),
                            _mm256_loadu_ps(xg + j), a);
    if (j < n) a = _mm256_fmadd_ps(f16_partial(ov + j, (int)(n - j), end), _mm256_loadu_ps(xg + j), a);
    return a;
}

/* ======================================================================
 * GEMV (one token) and GEMM (many)
 * ==================================================================== */

typedef struct kargs {
    kmat m;
    const spx_qtensor *q;
    const uint8_t *act;
    act_layout l;
    const float *x;
    int64_t T;
    float *y;
    int64_t ys;
    float *scratch;
    int64_t xg_stride; /* floats per token of gathered outlier x: n_outliers rounded up to 8 */
} kargs;

#define ACC_T __m256 acc[GEMV_NR][ACC_N] /* [rows][tokens] */

/* NR rows of one token over the whole row, outliers added, y written. */
AVX2_INLINE void gemv_tile(const kargs *a, int64_t r, const int NR, const int bpg, const int TL, const int BITS) {
    ACC_T;
    #pragma GCC unroll 8
    for (int i = 0; i < NR; i++) acc[i][0] = _mm256_setzero_ps();
    micro(&a->m, r, a->act, a->l.stride, a->q->cols, a->l.nb8, 0, a->l.nb, NR, 1, bpg, TL, BITS, acc);
    int64_t no = a->q->n_outliers;
    #pragma GCC unroll 8
    for (int i = 0; i < NR; i++) {
        if (no)
            acc[i][0] = outlier_dot8(a->q->outlier_val + (r + i) * no, a->scratch, no, acc[i][0],
                                     a->q->outlier_val + a->q->rows * no);
        a->y[r + i] = hsum_ps(acc[i][0]);
    }
}

AVX2_INLINE void gemv(const kargs *a, int64_t r0, int64_t r1, const int bpg, const int TL, const int BITS) {
    int64_t no = a->q->n_outliers;
    for (int64_t j = 0; j < no; j++) a->scratch[j] = a->x[a->q->outlier_idx[j]];
    for (int64_t j = no; j < ((no + 7) & ~(int64_t)7); j++) a->scratch[j] = 0.0f;
    int64_t r = r0;
    for (; r + GEMV_NR <= r1; r += GEMV_NR) gemv_tile(a, r, GEMV_NR, bpg, TL, BITS);
    switch (r1 - r) {
    case 3: gemv_tile(a, r, 3, bpg, TL, BITS); break;
    case 2: gemv_tile(a, r, 2, bpg, TL, BITS); break;
    case 1: gemv_tile(a, r, 1, bpg, TL, BITS); break;
    default: break;
    }
}

/* One chunk [b0, b0 + nbc) of the 16 rows of a tile (bases cb, sb, zb
 * of its item 0) for TB tokens (q8, dx, xs: each token's activations):
 * the 4 micro-kernels of 4 rows, each row's codes unpacked once for the
 * TB tokens. Every pointer is rebased to the chunk (micro_chunk sees b0 =
 * 0), so each address is one base plus a constant: no per-row pointers to
 * keep. */
AVX2_INLINE void tile16_chunk(const uint8_t *cb, const uint16_t *sb, const uint8_t *zb, const int8_t *const *q8,
                              const float *const *dx, const float *const *xs, int64_t b0, int nbc, const int TB,
                              __m256 acc[][ACC_N]) {
    const int8_t *q8c[ACC_N];
    const float *dxc[ACC_N], *xsc[ACC_N];
    #pragma GCC unroll 8
    for (int t = 0; t < TB; t++) {
        q8c[t] = q8[t] + 32 * b0;
        dxc[t] = dx[t] + b0;
        xsc[t] = xs[t] + b0;
    }
    /* one token: 4 rows per micro-kernel; more: one row (its unpacked
     * codes and the tokens' sums fill the registers) */
    const int NR = TB == 1 ? GEMV_NR : 1;
    #pragma GCC unroll 16
    for (int g = 0; g < SPX_Q_TILE_ROWS; g += NR) {
        const uint8_t *crow[GEMV_NR], *zrow[GEMV_NR];
        const uint16_t *srow[GEMV_NR];
        int hs[GEMV_NR];
        __m256i zsh[GEMV_NR];
        #pragma GCC unroll 4
        for (int i = 0; i < NR; i++)
            tiled_row(cb + 256 * b0, sb + 16 * b0, zb + 8 * b0, g + i, &crow[i], &srow[i], &zrow[i], &hs[i], &zsh[i]);
        micro_chunk(crow, srow, zrow, hs, zsh, q8c, dxc, xsc, 0, nbc, NR, TB, 1, 1, 4, acc + g);
    }
}

/* The 16 rows of tile T (all inside the matrix) for tokens t0 .. t0 + TB,
 * chunk by chunk: per chunk the 16 rows read 2 whole items (16 rows x 64
 * bytes each), so the tile streams forward like a row-major row. gemv()'s
 * 4-row passes would each read 256 of every 1024 bytes: 7% slower than
 * row-major in L2 (more instructions) and 15-25% from L3 (the prefetchers
 * follow them poorly); this is as fast in L2 and 5-20% faster from L3
 * (bench/results/2026-11-30-cpu-tiled-layout.md). The accumulators live in
 * memory, but the rows need no pointers of their own. The outlier x of
 * token t is at scratch + t * xg_stride. */
AVX2_INLINE void tile16(const kargs *a, int64_t T, int64_t t0, const int TB) {
    const int64_t ti = T * a->m.items, nb = a->l.nb, no = a->q->n_outliers;
    const uint8_t *cb = a->m.codes + 1024 * ti, *zb = a->m.zeros + 32 * ti;
    const uint16_t *sb = a->m.scales + 64 * ti;
    const int8_t *q8[ACC_N];
    const float *dx[ACC_N], *xs[ACC_N];
    #pragma GCC unroll 8
    for (int t = 0; t < TB; t++) {
        const uint8_t *at = a->act + (t0 + t) * a->l.stride;
        q8[t] = (const int8_t *)at;
        dx[t] = (const float *)(at + a->q->cols);
        xs[t] = dx[t] + a->l.nb8;
    }
    __m256 acc[SPX_Q_TILE_ROWS][ACC_N];
    #pragma GCC unroll 16
    for (int i = 0; i < SPX_Q_TILE_ROWS; i++)
        #pragma GCC unroll 8
        for (int t = 0; t < TB; t++) acc[i][t] = _mm256_setzero_ps();
    int64_t b0 = 0;
    for (; b0 + CHUNK <= nb; b0 += CHUNK) tile16_chunk(cb, sb, zb, q8, dx, xs, b0, CHUNK, TB, acc);
    if (b0 < nb) tile16_chunk(cb, sb, zb, q8, dx, xs, b0, (int)(nb - b0), TB, acc);
    const int64_t r = T * SPX_Q_TILE_ROWS;
    const uint16_t *end = a->q->outlier_val + a->q->rows * no;
    for (int i = 0; i < SPX_Q_TILE_ROWS; i++) {
        #pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            __m256 v = acc[i][t];
            if (no) v = outlier_dot8(a->q->outlier_val + (r + i) * no, a->scratch + (t0 + t) * a->xg_stride, no, v, end);
            a->y[(t0 + t) * a->ys + r + i] = hsum_ps(v);
        }
    }
}

/* One function per token count of a tile16 pass (1: the GEMV). */
#define TILE16_FN(TB)                                                                           \
    AVX2_FN __attribute__((noinline)) static void tile16_##TB(const kargs *a, int64_t T, int64_t t0) { \
        tile16(a, T, t0, TB);                                                                   \
    }
TILE16_FN(1) TILE16_FN(2) TILE16_FN(3) TILE16_FN(4) TILE16_FN(5) TILE16_FN(6) TILE16_FN(7) TILE16_FN(8)
typedef void (*tile16_fn)(const kargs *, int64_t, int64_t);
static const tile16_fn g_tile16[ACC_N] = {tile16_1, tile16_2, tile16_3, tile16_4,
                                          tile16_5, tile16_6, tile16_7, tile16_8};

/* One GEMM micro-tile: NR rows x TB tokens over blocks [kb0, kb1); the
 * partial sums replace y (first chunk) or are added to it. The last chunk
 * also adds the outlier columns (x gathered into scratch, a->xg_stride
 * floats per token) before the horizontal sums. */
AVX2_INLINE void gemm_tile(const kargs *a, int64_t r, int64_t t0, int64_t kb0, int64_t kb1,
                           const int NR, const int TB, const int bpg, const int TL, const int BITS) {
    ACC_T;
    #pragma GCC unroll 8
    for (int i = 0; i < NR; i++)
        #pragma GCC unroll 8
        for (int t = 0; t < TB; t++) acc[i][t] = _mm256_setzero_ps();
    micro(&a->m, r, a->act + t0 * a->l.stride, a->l.stride, a->q->cols, a->l.nb8, kb0, kb1, NR, TB,
          bpg, TL, BITS, acc);
    const int64_t no = a->q->n_outliers;
    if (no && kb1 == a->l.nb) {
        const uint16_t *end = a->q->outlier_val + a->q->rows * no;
        #pragma GCC unroll 8
        for (int i = 0; i < NR; i++) {
            const uint16_t *ov = a->q->outlier_val + (r + i) * no;
            for (int64_t j = 0; j < no; j += 8) {
                __m256 w = j + 8 <= no ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ov + j)))
                                       : f16_partial(ov + j, (int)(no - j), end);
                #pragma GCC unroll 8
                for (int t = 0; t < TB; t++)
                    acc[i][t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(a->scratch + t * a->xg_stride + j), acc[i][t]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < TB; t++) {
        float *yt = a->y + (t0 + t) * a->ys + r;
        #pragma GCC unroll 8
        for (int i = 0; i < NR; i++) {
            float v = hsum_ps(acc[i][t]);
            yt[i] = kb0 == 0 ? v : yt[i] + v;
        }
    }
}

/* One function per (tokens, bits, bpg, layout); V names the variant: 1,
 * 2, 4 row-major 4-bit with that bpg, t tiled (4-bit, bpg 1), 21 .. 34
 * 2- and 3-bit (first digit) with that bpg. */
#define GEMM_TILE_FN(TB, V, BPG, TL, BITS)                                                      \
    AVX2_FN __attribute__((noinline)) static void gemm_tile_##TB##_##V(                         \
        const kargs *a, int64_t r, int64_t t0, int64_t kb0, int64_t kb1) {                      \
        gemm_tile(a, r, t0, kb0, kb1, 1, TB, BPG, TL, BITS);                                    \
    }
#define GEMM_TILE_FNS(V, BPG, TL, BITS)                                                         \
    GEMM_TILE_FN(1, V, BPG, TL, BITS) GEMM_TILE_FN(2, V, BPG, TL, BITS)                         \
    GEMM_TILE_FN(3, V, BPG, TL, BITS) GEMM_TILE_FN(4, V, BPG, TL, BITS)                         \
    GEMM_TILE_FN(5, V, BPG, TL, BITS) GEMM_TILE_FN(6, V, BPG, TL, BITS)                         \
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
#define GEMM_TILE_ROW(V)                                                                        \
    {gemm_tile_1_##V, gemm_tile_2_##V, gemm_tile_3_##V, gemm_tile_4_##V,                        \
     gemm_tile_5_##V, gemm_tile_6_##V, gemm_tile_7_##V, gemm_tile_8_##V}
/* [variant index: 4-bit bpg 1, 2, 4, tiled, 2-bit bpg 1, 2, 4, 3-bit bpg
 * 1, 2, 4][tokens - 1] */
static const gemm_tile_fn g_gemm_tiles[10][GEMM_TB] = {
    GEMM_TILE_ROW(1),  GEMM_TILE_ROW(2),  GEMM_TILE_ROW(4),  GEMM_TILE_ROW(t),  GEMM_TILE_ROW(21),
    GEMM_TILE_ROW(22), GEMM_TILE_ROW(24), GEMM_TILE_ROW(31), GEMM_TILE_ROW(32), GEMM_TILE_ROW(34)};

AVX2_FN static void gemm(const kargs *a, int64_t r0, int64_t r1, int bpi) {
    const int64_t nb = a->l.nb, no = a->q->n_outliers;
    /* up to MTOK_MAX tokens, whole rows: the activations fit in L2 anyway,
     * and each y is summed in the order gemm_tl16 sums it (the tiled and
     * row-major copies give the same bits) */
    const int64_t kbs = a->T <= MTOK_MAX ? nb : GEMM_KB;
    for (int64_t rb0 = r0; rb0 < r1; rb0 += GEMM_RB) {
        int64_t rb1 = rb0 + GEMM_RB < r1 ? rb0 + GEMM_RB : r1;
        for (int64_t kb0 = 0; kb0 < nb; kb0 += kbs) {
            int64_t kb1 = kb0 + kbs < nb ? kb0 + kbs : nb;
            for (int64_t t0 = 0; t0 < a->T; t0 += GEMM_TB) {
                int tn = a->T - t0 < GEMM_TB ? (int)(a->T - t0) : GEMM_TB;
                if (no && kb1 == nb) /* the tiles of the last chunk add the outliers */
                    for (int t = 0; t < tn; t++) {
                        const float *xt = a->x + (t0 + t) * a->q->cols;
                        float *g = a->scratch + t * a->xg_stride;
                        for (int64_t j = 0; j < no; j++) g[j] = xt[a->q->outlier_idx[j]];
                        for (int64_t j = no; j < a->xg_stride; j++) g[j] = 0.0f;
                    }
                for (int64_t r = rb0; r < rb1; r++) g_gemm_tiles[bpi][tn - 1](a, r, t0, kb0, kb1);
            }
        }
    }
}

/* Row-major GEMV, one function per (bits, bpg). */
#define GEMV_FN(BITS, BPG)                                                                      \
    AVX2_FN __attribute__((noinline)) static void gemv_##BITS##_##BPG(const kargs *a, int64_t r0, int64_t r1) { \
        gemv(a, r0, r1, BPG, 0, BITS);                                                          \
    }
GEMV_FN(4, 1) GEMV_FN(4, 2) GEMV_FN(4, 4)
GEMV_FN(2, 1) GEMV_FN(2, 2) GEMV_FN(2, 4)
GEMV_FN(3, 1) GEMV_FN(3, 2) GEMV_FN(3, 4)
typedef void (*gemv_fn)(const kargs *, int64_t, int64_t);
/* [bits 4, 2, 3][bpg 1, 2, 4] */
static const gemv_fn g_gemv[3][3] = {{gemv_4_1, gemv_4_2, gemv_4_4}, {gemv_2_1, gemv_2_2, gemv_2_4},
                                     {gemv_3_1, gemv_3_2, gemv_3_4}};

/* Tiled GEMV: whole tiles by tile16, the rows of partial tiles (a
 * range starting or ending mid-tile, the last tile of the matrix) by the
 * 4-row micro-kernels. */
AVX2_FN __attribute__((noinline)) static void gemv_tl(const kargs *a, int64_t r0, int64_t r1) {
    const int64_t tr = SPX_Q_TILE_ROWS;
    int64_t t0 = (r0 + tr - 1) / tr, t1 = r1 / tr;
    if (t0 >= t1) {
        gemv(a, r0, r1, 1, 1, 4);
        return;
    }
    gemv(a, r0, t0 * tr, 1, 1, 4); /* also gathers the outlier x */
    for (int64_t T = t0; T < t1; T++) g_tile16[0](a, T, 0);
    if (t1 * tr < r1) gemv(a, t1 * tr, r1, 1, 1, 4);
}

/* Tiled product of 2..MTOK_MAX tokens: tile by tile, each tile's weights
 * read once from memory for all the tokens (in passes of at most 8 tokens,
 * balanced: 9 = 5 + 4, the later passes finding the tile in L2), where
 * gemm()'s 1-row micro-tiles over 64-row blocks cost 2-4x as much at these
 * token counts (bench/results/2026-12-03-cpu-mtok-kernels.md). Rows of
 * partial tiles take gemm() (before the outliers are gathered: gemm uses
 * the same scratch). */
AVX2_FN __attribute__((noinline)) static void gemm_tl16(const kargs *a, int64_t r0, int64_t r1) {
    const int64_t tr = SPX_Q_TILE_ROWS, no = a->q->n_outliers;
    int64_t t0 = (r0 + tr - 1) / tr, t1 = r1 / tr;
    if (t0 >= t1) {
        gemm(a, r0, r1, 3);
        return;
    }
    if (r0 < t0 * tr) gemm(a, r0, t0 * tr, 3);
    for (int64_t t = 0; t < a->T && no; t++) {
        const float *xt = a->x + t * a->q->cols;
        float *g = a->scratch + t * a->xg_stride;
        for (int64_t j = 0; j < no; j++) g[j] = xt[a->q->outlier_idx[j]];
        for (int64_t j = no; j < a->xg_stride; j++) g[j] = 0.0f;
    }
    const int passes = (int)((a->T + GEMM_TB - 1) / GEMM_TB);
    for (int64_t T = t0; T < t1; T++)
        for (int p = 0, tk = 0; p < passes; p++) {
            int tn = (int)((a->T - tk) / (passes - p)); /* balanced: the first passes take the larger share */
            if ((a->T - tk) % (passes - p)) tn++;
            g_tile16[tn - 1](a, T, tk);
            tk += tn;
        }
    if (t1 * tr < r1) gemm(a, t1 * tr, r1, 3);
}

static void avx2_rows(const spx_qtensor *q, const void *act, const float *x, int64_t T, float *y,
                      int64_t y_stride, int64_t r0, int64_t r1, void *scratch) {
    /* a tiled matrix is always 4-bit G32 with cols % 128 == 0 (the format
     * checks it); anything else tiled takes the scalar table, which reads
     * through the qtensor.h accessors; bits 2 and 3 are row-major only */
    int tl = q->layout == SPX_Q_TILED;
    if (!fast_ok(q) || (tl && !spx_q_tiled_ok(q->bits, q->group, q->cols))) {
        spx_qkernels_scalar()->rows(q, act, x, T, y, y_stride, r0, r1, scratch);
        return;
    }
    if (r0 >= r1 || T <= 0) return;
    kargs a;
    a.q = q;
    a.m.codes = q->codes;
    a.m.scales = q->scales;
    a.m.zeros = q->zeros;
    a.m.crb = spx_q_codes_row_bytes(q->cols, q->bits);
    a.m.ng = spx_q_groups(q->cols, q->group);
    a.m.zrb = spx_q_zeros_row_bytes(q->cols, q->group);
    a.m.items = q->cols / SPX_Q_TILE_COLS;
    a.act = (const uint8_t *)act;
    a.l = layout_of(q->cols);
    a.x = x;
    a.T = T;
    a.y = y;
    a.ys = y_stride;
    a.scratch = (float *)scratch;
    a.xg_stride = (q->n_outliers + 7) & ~(int64_t)7;
    const int bpg = q->group / BLK, gi = bpg == 1 ? 0 : bpg == 2 ? 1 : 2;
    const int wi = q->bits == 4 ? 0 : q->bits == 2 ? 1 : 2; /* width index */
    if (T == 1) {
        if (tl) gemv_tl(&a, r0, r1);
        else g_gemv[wi][gi](&a, r0, r1);
    } else if (tl && T <= MTOK_MAX) {
        gemm_tl16(&a, r0, r1);
    } else {
        gemm(&a, r0, r1, tl ? 3 : wi == 0 ? gi : 1 + 3 * wi + gi);
    }
}

static const spx_qkernels g_avx2 = {
    .name = "avx2",
    .act_bytes = avx2_act_bytes,
    .scratch_bytes = avx2_scratch_bytes,
    .prepare = avx2_prepare,
    .rows = avx2_rows,
    .scores_f16 = spx_avx2_scores_f16,
    .wv_f16 = spx_avx2_wv_f16,
    .softmax = spx_avx2_softmax,
    .dot_q4g = spx_avx2_dot_q4g,
    .axpy_q4g = spx_avx2_axpy_q4g,
};

const spx_qkernels *spx_qkernels_avx2_table(void) { return &g_avx2; }

#else /* not x86 */

const spx_qkernels *spx_qkernels_avx2_table(void) { return NULL; }

#endif

