/* qkernels_avx2.c: the AVX2 + FMA + F16C variant of the quantized GEMV /
 * GEMM kernels (qkernels.h), with int8 activations.
 *
 * Every function that uses these instructions carries the target attribute,
 * so the file builds without -mavx2 and nothing here runs unless dispatch
 * (qkernels.c) found the features. Non-x86 builds compile the getter only
 * (it returns NULL).
 *
 * Fast path: bits = 4, group 32, 64 or 128. Other widths (2, 3) and group
 * sizes fall back to the scalar reference on the float x (by design, not an
 * error): rows() calls the scalar table's rows(); prepare() does nothing
 * for unsupported group sizes (act_bytes() is 0 then) and its int8 output
 * is simply unused for bits 2 and 3.
 *
 * Layouts: SPX_Q_ROWS, and SPX_Q_TILED (qtensor.h; 4-bit G32 only) read in
 * place. A chunk of 8 blocks is 2 whole items and a pair's 32-byte code
 * load lies inside one item, so only the row pointers, the pair offsets and
 * the scale / zero gathers differ (tiled_scales, tiled_zeros; a
 * compile-time flag TL): the arithmetic, and y, are bit-identical to the
 * row-major copy's. A tiled matrix of another group size (never stored)
 * takes the scalar table.
 *
 * Activation format. A row's packed codes are cut into 16-byte pieces; the
 * 32 codes of piece b (both nibbles) form block b. With bpg = G / 32 blocks
 * per group, block b = bpg * g + i covers the columns
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
 * codes (u8) by x8 (s8) for the low- and high-nibble halves, added in int16
 * (|.| <= 7620), then madd with ones to int32. Then in float
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
 * of 8 (256 columns). Per row and chunk it unpacks the four 32-byte code
 * loads once (nibbles to bytes) and reuses them for the TB tokens; per row,
 * token and chunk the four pair sums are reduced by a tree of hadds to one
 * vector whose lane k is block TREE[k], which then takes one convert, one
 * multiply (row scales x token dx, both in tree order) and two FMAs. GEMV
 * (T = 1): 4 rows x 1 token over the whole row; outliers added before the
 * horizontal sum, y written once. GEMM (T > 1): row blocks of 64 rows x
 * column chunks of 4096 (a row block's weights of one chunk stay in L2)
 * x token blocks of 8 (their activations stay in L1); 1 row x 8 tokens per
 * micro-kernel (8 code vectors + 8 accumulators in registers); the last
 * column chunk adds the outliers. Tiled GEMV runs the 4-row micro-kernel
 * over all 16 rows of a tile per chunk (gemv_tile16), so the tile's bytes
 * stream forward. Tuned on a 2-core AVX2 Xeon: about 4.6 cycles per 64
 * weights for GEMV and 3.3-3.9 per 64 weights and token for GEMM (the
 * sizes below). */
#include "cpu/qkernels.h"
#include "quant/g32.h"

#include <stdint.h>
#include <math.h>
#include <string.h>

const spx_qkernels *spx_qkernels_avx2_table(void);

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

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
    GEMM_KB = 128    /* blocks per GEMM column chunk (multiple of CHUNK): 4096 cols */
};

#define ACC_N 8 /* max(GEMM_TB, 1): inner size of accumulator arrays */

static int fast_group(int group) { return group == 32 || group == 64 || group == 128; }
static int fast_ok(const spx_qtensor *q) { return q->bits == 4 && fast_group(q->group); }

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
    if (!fast_group(group) || cols <= 0 || cols % group) return 0;
    return (size_t)T * (size_t)layout_of(cols).stride;
}

/* x at the outlier columns, gathered for up to GEMM_TB tokens (n_outliers
 * <= cols, each token's row padded to 8); also covers the scalar
 * fallback's cols floats. */
static size_t avx2_scratch_bytes(int64_t T, int64_t cols, int group) {
    return (size_t)(T == 1 ? 1 : GEMM_TB) * ((size_t)cols + 8) * sizeof(float);
}

/* Byte offsets of block b's low / high 16 x8 values in a token's q8. */
static inline int64_t q8_lo_off(int64_t b) { return 32 * (b & ~(int64_t)1) + 16 * (b & 1); }
static inline int64_t q8_hi_off(int64_t b, int64_t nb) {
    if ((nb & 1) && b == nb - 1) return 32 * b + 16;
    return 32 * (b & ~(int64_t)1) + 32 + 16 * (b & 1);
}

AVX2_INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_INLINE float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
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
    if (!fast_group(group) || cols <= 0 || cols % group) return;
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

/* int32 sums of one 32-byte code load (blocks b, b + 1: lanes [4 x b |
 * 4 x b+1]) against x: the low- and high-nibble products added in int16
 * (|sum| <= 2 * 2 * 15 * 127 = 7620), then pairs of int16 in int32. */
AVX2_INLINE __m256i pair_dot(__m256i lo, __m256i hi, const int8_t *xlo, const int8_t *xhi) {
    __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xlo)),
                                   _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)xhi)));
    return _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
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
 * (b / 4) + 16 (b % 4), so a pair's 32 bytes stay inside one item. */
AVX2_INLINE void micro_chunk(const uint8_t *const *crow, const uint16_t *const *srow,
                             const uint8_t *const *zrow, const int *hs, const __m256i *zsh,
                             const int8_t *const *q8,
                             const float *const *dx, const float *const *xs, int64_t b0, int nbc,
                             const int NR, const int TB, const int bpg, const int TL,
                             __m256 acc[][ACC_N]) {
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const int np = (nbc + 1) / 2; /* pairs, counting an odd last block (G32) as one */
    #pragma GCC unroll 8
    for (int i = 0; i < NR; i++) {
        __m256 sv = TL ? tiled_scales(srow[i], hs[i], b0, nbc) : chunk_scales(srow[i], b0, nbc, bpg);
        __m256 sz = _mm256_mul_ps(sv, TL ? tiled_zeros(zrow[i], zsh[i], b0, nbc)
                                         : chunk_zeros(zrow[i], b0, nbc, bpg));
        __m256i lo[CHUNK / 2], hi[CHUNK / 2];
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
            __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(ps[0], ps[1]), _mm256_hadd_epi32(ps[2], ps[3]));
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
                       const int TB, const int bpg, const int TL, __m256 acc[][ACC_N]) {
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
        micro_chunk(crow, srow, zrow, hs, zsh, q8, dx, xs, b0, CHUNK, NR, TB, bpg, TL, acc);
    if (kfull < kb1)
        micro_chunk(crow, srow, zrow, hs, zsh, q8, dx, xs, kfull, (int)(kb1 - kfull), NR, TB, bpg, TL, acc);
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
AVX2_INLINE void gemv_tile(const kargs *a, int64_t r, const int NR, const int bpg, const int TL) {
    ACC_T;
    #pragma GCC unroll 8
    for (int i = 0; i < NR; i++) acc[i][0] = _mm256_setzero_ps();
    micro(&a->m, r, a->act, a->l.stride, a->q->cols, a->l.nb8, 0, a->l.nb, NR, 1, bpg, TL, acc);
    int64_t no = a->q->n_outliers;
    #pragma GCC unroll 8
    for (int i = 0; i < NR; i++) {
        if (no)
            acc[i][0] = outlier_dot8(a->q->outlier_val + (r + i) * no, a->scratch, no, acc[i][0],
                                     a->q->outlier_val + a->q->rows * no);
        a->y[r + i] = hsum_ps(acc[i][0]);
    }
}

AVX2_INLINE void gemv(const kargs *a, int64_t r0, int64_t r1, const int bpg, const int TL) {
    int64_t no = a->q->n_outliers;
    for (int64_t j = 0; j < no; j++) a->scratch[j] = a->x[a->q->outlier_idx[j]];
    for (int64_t j = no; j < ((no + 7) & ~(int64_t)7); j++) a->scratch[j] = 0.0f;
    int64_t r = r0;
    for (; r + GEMV_NR <= r1; r += GEMV_NR) gemv_tile(a, r, GEMV_NR, bpg, TL);
    switch (r1 - r) {
    case 3: gemv_tile(a, r, 3, bpg, TL); break;
    case 2: gemv_tile(a, r, 2, bpg, TL); break;
    case 1: gemv_tile(a, r, 1, bpg, TL); break;
    default: break;
    }
}

/* One chunk [b0, b0 + nbc) of the 16 rows of a tile (bases cb, sb, zb
 * of its item 0) for one token: the 4 micro-kernels of 4 rows. Every
 * pointer is rebased to the chunk (micro_chunk sees b0 = 0), so each
 * address is one base plus a constant: no per-row pointers to keep. */
AVX2_INLINE void tile16_chunk(const uint8_t *cb, const uint16_t *sb, const uint8_t *zb, const int8_t *q8,
                              const float *dx, const float *xs, int64_t b0, int nbc,
                              __m256 acc[][ACC_N]) {
    const int8_t *q8c[1] = {q8 + 32 * b0};
    const float *dxc[1] = {dx + b0}, *xsc[1] = {xs + b0};
    #pragma GCC unroll 4
    for (int g = 0; g < SPX_Q_TILE_ROWS; g += GEMV_NR) {
        const uint8_t *crow[GEMV_NR], *zrow[GEMV_NR];
        const uint16_t *srow[GEMV_NR];
        int hs[GEMV_NR];
        __m256i zsh[GEMV_NR];
        #pragma GCC unroll 4
        for (int i = 0; i < GEMV_NR; i++)
            tiled_row(cb + 256 * b0, sb + 16 * b0, zb + 8 * b0, g + i, &crow[i], &srow[i], &zrow[i], &hs[i], &zsh[i]);
        micro_chunk(crow, srow, zrow, hs, zsh, q8c, dxc, xsc, 0, nbc, GEMV_NR, 1, 1, 1, acc + g);
    }
}

/* GEMV of the 16 rows of tile T (all inside the matrix), chunk by chunk:
 * per chunk the 16 rows read 2 whole items (16 rows x 64 bytes each), so
 * the tile streams forward like a row-major row. gemv()'s 4-row passes
 * would each read 256 of every 1024 bytes: 7% slower than row-major in L2
 * (more instructions) and 15-25% from L3 (the prefetchers follow them
 * poorly); this is as fast in L2 and 5-20% faster from L3 (bench/results/
 * 2026-11-30-cpu-tiled-layout.md). The accumulators live in memory, but
 * the rows need no pointers of their own. */
AVX2_INLINE void gemv_tile16(const kargs *a, int64_t T) {
    const int64_t ti = T * a->m.items, nb = a->l.nb, no = a->q->n_outliers;
    const uint8_t *cb = a->m.codes + 1024 * ti, *zb = a->m.zeros + 32 * ti;
    const uint16_t *sb = a->m.scales + 64 * ti;
    const int8_t *q8 = (const int8_t *)a->act;
    const float *dx = (const float *)(a->act + a->q->cols), *xs = dx + a->l.nb8;
    __m256 acc[SPX_Q_TILE_ROWS][ACC_N];
    #pragma GCC unroll 16
    for (int i = 0; i < SPX_Q_TILE_ROWS; i++) acc[i][0] = _mm256_setzero_ps();
    int64_t b0 = 0;
    for (; b0 + CHUNK <= nb; b0 += CHUNK) tile16_chunk(cb, sb, zb, q8, dx, xs, b0, CHUNK, acc);
    if (b0 < nb) tile16_chunk(cb, sb, zb, q8, dx, xs, b0, (int)(nb - b0), acc);
    const int64_t r = T * SPX_Q_TILE_ROWS;
    for (int i = 0; i < SPX_Q_TILE_ROWS; i++) {
        if (no)
            acc[i][0] = outlier_dot8(a->q->outlier_val + (r + i) * no, a->scratch, no, acc[i][0],
                                     a->q->outlier_val + a->q->rows * no);
        a->y[r + i] = hsum_ps(acc[i][0]);
    }
}

/* One GEMM micro-tile: NR rows x TB tokens over blocks [kb0, kb1); the
 * partial sums replace y (first chunk) or are added to it. The last chunk
 * also adds the outlier columns (x gathered into scratch, a->xg_stride
 * floats per token) before the horizontal sums. */
AVX2_INLINE void gemm_tile(const kargs *a, int64_t r, int64_t t0, int64_t kb0, int64_t kb1,
                           const int NR, const int TB, const int bpg, const int TL) {
    ACC_T;
    #pragma GCC unroll 8
    for (int i = 0; i < NR; i++)
        #pragma GCC unroll 8
        for (int t = 0; t < TB; t++) acc[i][t] = _mm256_setzero_ps();
    micro(&a->m, r, a->act + t0 * a->l.stride, a->l.stride, a->q->cols, a->l.nb8, kb0, kb1, NR, TB,
          bpg, TL, acc);
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

/* One function per (tokens, bpg, layout); V names the variant: 1, 2, 4
 * row-major with that bpg, t tiled (bpg 1). */
#define GEMM_TILE_FN(TB, V, BPG, TL)                                                            \
    AVX2_FN __attribute__((noinline)) static void gemm_tile_##TB##_##V(                         \
        const kargs *a, int64_t r, int64_t t0, int64_t kb0, int64_t kb1) {                      \
        gemm_tile(a, r, t0, kb0, kb1, 1, TB, BPG, TL);                                          \
    }
#define GEMM_TILE_FNS(V, BPG, TL)                                                               \
    GEMM_TILE_FN(1, V, BPG, TL) GEMM_TILE_FN(2, V, BPG, TL) GEMM_TILE_FN(3, V, BPG, TL)         \
    GEMM_TILE_FN(4, V, BPG, TL) GEMM_TILE_FN(5, V, BPG, TL) GEMM_TILE_FN(6, V, BPG, TL)         \
    GEMM_TILE_FN(7, V, BPG, TL) GEMM_TILE_FN(8, V, BPG, TL)
GEMM_TILE_FNS(1, 1, 0)
GEMM_TILE_FNS(2, 2, 0)
GEMM_TILE_FNS(4, 4, 0)
GEMM_TILE_FNS(t, 1, 1)

typedef void (*gemm_tile_fn)(const kargs *, int64_t, int64_t, int64_t, int64_t);
#define GEMM_TILE_ROW(V)                                                                        \
    {gemm_tile_1_##V, gemm_tile_2_##V, gemm_tile_3_##V, gemm_tile_4_##V,                        \
     gemm_tile_5_##V, gemm_tile_6_##V, gemm_tile_7_##V, gemm_tile_8_##V}
/* [variant index: bpg 1, 2, 4, tiled][tokens - 1] */
static const gemm_tile_fn g_gemm_tiles[4][GEMM_TB] = {GEMM_TILE_ROW(1), GEMM_TILE_ROW(2),
                                                       GEMM_TILE_ROW(4), GEMM_TILE_ROW(t)};

AVX2_FN static void gemm(const kargs *a, int64_t r0, int64_t r1, int bpi) {
    const int64_t nb = a->l.nb, no = a->q->n_outliers;
    for (int64_t rb0 = r0; rb0 < r1; rb0 += GEMM_RB) {
        int64_t rb1 = rb0 + GEMM_RB < r1 ? rb0 + GEMM_RB : r1;
        for (int64_t kb0 = 0; kb0 < nb; kb0 += GEMM_KB) {
            int64_t kb1 = kb0 + GEMM_KB < nb ? kb0 + GEMM_KB : nb;
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

AVX2_FN __attribute__((noinline)) static void gemv_b1(const kargs *a, int64_t r0, int64_t r1) {
    gemv(a, r0, r1, 1, 0);
}
AVX2_FN __attribute__((noinline)) static void gemv_b2(const kargs *a, int64_t r0, int64_t r1) {
    gemv(a, r0, r1, 2, 0);
}
AVX2_FN __attribute__((noinline)) static void gemv_b4(const kargs *a, int64_t r0, int64_t r1) {
    gemv(a, r0, r1, 4, 0);
}

/* Tiled GEMV: whole tiles by gemv_tile16, the rows of partial tiles (a
 * range starting or ending mid-tile, the last tile of the matrix) by the
 * 4-row micro-kernels. */
AVX2_FN __attribute__((noinline)) static void gemv_tl(const kargs *a, int64_t r0, int64_t r1) {
    const int64_t tr = SPX_Q_TILE_ROWS;
    int64_t t0 = (r0 + tr - 1) / tr, t1 = r1 / tr;
    if (t0 >= t1) {
        gemv(a, r0, r1, 1, 1);
        return;
    }
    gemv(a, r0, t0 * tr, 1, 1); /* also gathers the outlier x */
    for (int64_t T = t0; T < t1; T++) gemv_tile16(a, T);
    if (t1 * tr < r1) gemv(a, t1 * tr, r1, 1, 1);
}

static void avx2_rows(const spx_qtensor *q, const void *act, const float *x, int64_t T, float *y,
                      int64_t y_stride, int64_t r0, int64_t r1, void *scratch) {
    /* a tiled matrix is always 4-bit G32 with cols % 128 == 0 (the format
     * checks it); anything else tiled takes the scalar table, which reads
     * through the qtensor.h accessors */
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
    int bpg = q->group / BLK, bpi = tl ? 3 : bpg == 1 ? 0 : bpg == 2 ? 1 : 2;
    if (T == 1) {
        if (tl) gemv_tl(&a, r0, r1);
        else if (bpg == 1) gemv_b1(&a, r0, r1);
        else if (bpg == 2) gemv_b2(&a, r0, r1);
        else gemv_b4(&a, r0, r1);
    } else {
        gemm(&a, r0, r1, bpi);
    }
}

/* The fp16 KV cache's attention steps: 8 halves per F16C convert, four
 * FMA chains for the dot (one horizontal sum per row), one FMA per 8 for
 * the axpy; a short tail as the scalar table does it. */
AVX2_FN static float avx2_dot_f16(const float *q, const uint16_t *h, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j))), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 8), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j + 8))), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 16), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j + 16))), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 24), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j + 24))), a3);
    }
    for (; j + 8 <= n; j += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j))), a0);
    float d = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; j < n; j++) d += q[j] * _cvtsh_ss(h[j]);
    return d;
}

AVX2_FN static void avx2_axpy_f16(float *out, float a, const uint16_t *h, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(out + j, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j))),
                                                  _mm256_loadu_ps(out + j)));
    for (; j < n; j++) out[j] += a * _cvtsh_ss(h[j]);
}

/* The eight lanes of each of a[0..7] summed, in one transposing hadd
 * tree: lane k = ((a_k[0] + a_k[1]) + (a_k[2] + a_k[3])) + ((a_k[4] +
 * a_k[5]) + (a_k[6] + a_k[7])), whatever a_k stands for (a single row's
 * horizontal sum costs as much as its whole dot product at d = 64). */
AVX2_INLINE __m256 hsum8x8(const __m256 *a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    /* u0 = [sums 0-3, lanes 0-3 | sums 0-3, lanes 4-7], u1 the same for 4-7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Scores of up to 4 heads (gc) over rows in pairs: each row's 8 halves
 * converted once for all heads, accumulators a[2 g + r] (head g, row i +
 * r) with each lane's products in column order, then hsum8x8: the same
 * numbers as one head's 8-row blocks. Rows past the last whole block of 8
 * (and every row when d % 8 != 0) go through avx2_dot_f16, as one head's
 * would, so a head's scores do not depend on G. */
AVX2_FN static void avx2_scores_f16(const float *q, int64_t qs, int G, const uint16_t *h, int64_t stride, int64_t n,
                                    int64_t d, float scale, float *out, int64_t os) {
    const int64_t n8 = d % 8 == 0 ? n / 8 * 8 : 0;
    const __m256 vs = _mm256_set1_ps(scale);
    for (int g0 = 0; g0 < G; g0 += 4) {
        const int gc = G - g0 < 4 ? G - g0 : 4;
        const float *qg = q + g0 * qs;
        float *og = out + g0 * os;
        for (int64_t i = 0; i < n8; i += 2) {
            __m256 a[8];
            for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
            const uint16_t *r0 = h + i * stride, *r1 = r0 + stride;
            for (int64_t j = 0; j < d; j += 8) {
                const __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r0 + j)));
                const __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r1 + j)));
                #pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    if (g >= gc) break;
                    const __m256 qv = _mm256_loadu_ps(qg + g * qs + j);
                    a[2 * g] = _mm256_fmadd_ps(qv, k0, a[2 * g]);
                    a[2 * g + 1] = _mm256_fmadd_ps(qv, k1, a[2 * g + 1]);
                }
            }
            float t[8];
            _mm256_storeu_ps(t, _mm256_mul_ps(hsum8x8(a), vs));
            for (int g = 0; g < gc; g++) {
                og[g * os + i] = t[2 * g];
                og[g * os + i + 1] = t[2 * g + 1];
            }
        }
        for (int g = 0; g < gc; g++)
            for (int64_t i = n8; i < n; i++) og[g * os + i] = avx2_dot_f16(qg + g * qs, h + i * stride, d) * scale;
    }
}

/* For up to 4 heads at a time: 16 output columns per head held in
 * registers across all rows, each row's 16 halves converted once for the
 * heads; every output's multiply-adds in row order, as one head's
 * 64-column blocks (the columns past the last whole 64, d % 64, go
 * through avx2_axpy_f16 row by row, as one head's), so a head's output
 * does not depend on G. */
AVX2_FN static void avx2_wv_f16(float *out, int64_t os, const float *p, int64_t ps, int G, const uint16_t *h,
                                int64_t stride, int64_t n, int64_t d) {
    const int64_t d64 = d / 64 * 64;
    for (int g0 = 0; g0 < G; g0 += 4) {
        const int gc = G - g0 < 4 ? G - g0 : 4;
        float *og = out + g0 * os;
        const float *pg = p + g0 * ps;
        for (int64_t c0 = 0; c0 < d64; c0 += 16) {
            __m256 a[4][2];
            for (int g = 0; g < gc; g++) {
                a[g][0] = _mm256_loadu_ps(og + g * os + c0);
                a[g][1] = _mm256_loadu_ps(og + g * os + c0 + 8);
            }
            for (int64_t i = 0; i < n; i++) {
                const uint16_t *r = h + i * stride + c0;
                const __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)r));
                const __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 8)));
                #pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    if (g >= gc) break;
                    const __m256 pb = _mm256_set1_ps(pg[g * ps + i]);
                    a[g][0] = _mm256_fmadd_ps(pb, v0, a[g][0]);
                    a[g][1] = _mm256_fmadd_ps(pb, v1, a[g][1]);
                }
            }
            for (int g = 0; g < gc; g++) {
                _mm256_storeu_ps(og + g * os + c0, a[g][0]);
                _mm256_storeu_ps(og + g * os + c0 + 8, a[g][1]);
            }
        }
        if (d64 < d)
            for (int g = 0; g < gc; g++)
                for (int64_t i = 0; i < n; i++) avx2_axpy_f16(og + g * os + d64, pg[g * ps + i], h + i * stride + d64, d - d64);
    }
}

/* One 4-bit group: its 32 codes as two vectors of bytes (low nibbles:
 * codes 0..15, high: 16..31) widened to four float vectors. */
AVX2_INLINE void q4g_codes(const uint8_t *cd, __m256 *c0, __m256 *c1, __m256 *c2, __m256 *c3) {
    const __m128i b = _mm_loadu_si128((const __m128i *)cd), m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    *c0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    *c1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    *c2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    *c3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

/* Per head the one-head arithmetic on codes widened once for all G. */
AVX2_FN static void avx2_dot_q4g(const float *q, int64_t qs, int G, const uint8_t *cd, float *out) {
    __m256 c0, c1, c2, c3;
    q4g_codes(cd, &c0, &c1, &c2, &c3);
    for (int g = 0; g < G; g++) {
        const float *qg = q + g * qs;
        const __m256 a = _mm256_fmadd_ps(c1, _mm256_loadu_ps(qg + 8), _mm256_mul_ps(c0, _mm256_loadu_ps(qg)));
        const __m256 b = _mm256_fmadd_ps(c3, _mm256_loadu_ps(qg + 24), _mm256_mul_ps(c2, _mm256_loadu_ps(qg + 16)));
        out[g] = hsum_ps(_mm256_add_ps(a, b));
    }
}

AVX2_FN static void avx2_axpy_q4g(float *o, int64_t os, const float *a, int G, int z, const uint8_t *cd) {
    __m256 c[4];
    q4g_codes(cd, &c[0], &c[1], &c[2], &c[3]);
    const __m256 vz = _mm256_set1_ps((float)z);
    for (int i = 0; i < 4; i++) c[i] = _mm256_sub_ps(c[i], vz);
    for (int g = 0; g < G; g++) {
        const __m256 va = _mm256_set1_ps(a[g]);
        float *og = o + g * os;
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(og + 8 * i, _mm256_fmadd_ps(va, c[i], _mm256_loadu_ps(og + 8 * i)));
    }
}

/* e^x for x <= 0 (attention scores minus their maximum; larger x are
 * clamped to 88.3): Cephes' expf, n = round(x log2 e), r = x - n ln 2 in
 * two parts, a degree-6 polynomial, 2^n through the exponent bits; 0
 * below -87.33 (where expf leaves the normal range: such terms are below
 * 2^-126 of the largest, which is 1). NaN stays NaN. */
AVX2_INLINE __m256 exp256_nonpos(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ), nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 x0 = x;
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)); /* NaN in x: min returns the constant; restored below */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_andnot_ps(under, y);
    return _mm256_blendv_ps(y, x0, nan);
}

/* spx_cpu_softmax's steps with exp256_nonpos: the maximum, e^(x - max)
 * summed in double (two 4-lane accumulators), one scale by the float
 * reciprocal; the tail of n % 8 through a zero-padded vector. */
AVX2_FN static void avx2_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    float mx = hmax_ps(mv);
    for (int64_t k = i; k < n; k++) mx = x[k] > mx ? x[k] : mx;
    const __m256 vm = _mm256_set1_ps(mx);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 e = exp256_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    if (i < n) {
        float t[8];
        const int r = (int)(n - i);
        for (int k = 0; k < 8; k++) t[k] = k < r ? x[i + k] - mx : -INFINITY;
        const __m256 e = exp256_nonpos(_mm256_loadu_ps(t));
        _mm256_storeu_ps(t, e);
        for (int k = 0; k < r; k++) x[i + k] = t[k];
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    const __m256d s = _mm256_add_pd(s0, s1);
    __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    s2 = _mm_add_sd(s2, _mm_unpackhi_pd(s2, s2));
    const __m256 inv = _mm256_set1_ps((float)(1.0 / _mm_cvtsd_f64(s2)));
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; i++) x[i] *= _mm256_cvtss_f32(inv);
}

static const spx_qkernels g_avx2 = {
    .name = "avx2",
    .act_bytes = avx2_act_bytes,
    .scratch_bytes = avx2_scratch_bytes,
    .prepare = avx2_prepare,
    .rows = avx2_rows,
    .scores_f16 = avx2_scores_f16,
    .wv_f16 = avx2_wv_f16,
    .softmax = avx2_softmax,
    .dot_q4g = avx2_dot_q4g,
    .axpy_q4g = avx2_axpy_q4g,
};

const spx_qkernels *spx_qkernels_avx2_table(void) { return &g_avx2; }

#else /* not x86 */

const spx_qkernels *spx_qkernels_avx2_table(void) { return NULL; }

#endif
