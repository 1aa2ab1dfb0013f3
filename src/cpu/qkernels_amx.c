/* qkernels_amx.c: the amx table's prompt products (qkernels_avx512.h) on
 * the AMX tiles: TDPBSSD (signed int8 x signed int8, int32 sums) of int8
 * activations with the weight codes minus their zero points, flushed per
 * block of 32 columns into float accumulators with AVX-512.
 *
 * Arithmetic. The activations are quantized exactly as the AVX2 int8 path
 * (qkernels_avx2.c): per token and block b of 32 columns (qtensor.h's
 * blocks: lo = group columns 16i + m, hi = G/2 + 16i + m),
 *     dx_b = max|x| / 127,  x8 = round_even(x * 127 / max|x|) in [-127, 127],
 * so the error bound of tests/test_kernels.c (A8_HALF / 127 ...) holds
 * unchanged. The weights enter the tiles as w = q - z in [-15, 15] (the
 * repack subtracts the zero point), so a block's int32 dot
 *     C[t][r] = sum_k (q_k - z) x8_k       |C| <= 32 * 15 * 127 < 2^24
 * is exact in int32 and in float, an outlier slot (q = z) adds exactly 0,
 * and there is no separate zero-point term (the AVX2 path's
 * s z dx sum(x8)): per block and token the float work is
 *     acc[t][r] += (float(C[t][r]) * dx[t, b]) * s[r, g]
 * (a convert, a multiply and an FMA per 16 outputs), blocks in column
 * order, then the fp16 outlier columns (fp16 value x float x) in index
 * order. Each y therefore depends on its row, token and the column count
 * only: not on the row range, its split or the layout (the tiled copy
 * repacks to the same bytes). The block is the unit of K (32, not the
 * tiles' 64) because dx changes per block: two blocks in one int32 sum
 * could not be scaled apart.
 *
 * Tiles (palette 1, configured per rows() call, released at its end):
 *     A       16 tokens x 32 bytes: one block of x8 for a token tile
 *     B       8 x 64 bytes: one block of w for 16 weight rows, VNNI order
 *             (B[k4][4 n + j] = w[row n][4 k4 + j])
 *     C       16 x 16 int32 (row t: token t, column n: weight row n)
 * One C tile is one block of one (token tile, row tile): it goes to memory
 * (the only way out of a tile) and comes back as 16 zmm rows into the 16
 * accumulators (one zmm per token, lanes = the 16 weight rows), which stay
 * in registers over a column chunk. The tile steps (zero, two loads, the
 * dot product, the store) of a block take longer than its flush, and a
 * flush that reads a C tile stored just before waits for it, so tile_run
 * is software pipelined: SPX_AMX_NC C tiles (4: with A and B tiles
 * alternating between two each; 6: one A and one B tile) in rotation, the
 * flush SPX_AMX_DEPTH blocks behind the tiles. On a Xeon with AMX, three
 * blocks behind (4 C tiles) ran about twice as fast as one or two behind,
 * and 6 C tiles four or five behind no faster than that. Why one token tile
 * x one row tile: the flush costs 3 vector operations per 16 x 32
 * multiply-adds; sharing A or B tiles between two C tiles (2 x 1, 2 x 2)
 * would need 32 or 64 accumulators, more than the 32 zmm registers, so
 * an accumulator load and store per flush operation, and would leave
 * fewer C tiles for the pipeline.
 *
 * Activation format (prepare(); nt = ceil(T / 16) token tiles, tokens past
 * T are zeros with dx 0, so they add 0 and are never written out):
 *     q8 [nt][nb][16 tokens][32]  int8, block order [lo 16 | hi 16]: the
 *                                 A tile of (tile, block) is 512
 *                                 contiguous bytes
 *     dx [nt][nb][16]             float
 * Weights: per 16-row tile (rows r0 + 16 k, the last one padded with rows
 * of w = 0 and scale 0) and column chunk of KC blocks (a multiple of 4, so
 * a chunk holds whole groups and whole 2-/3-bit items), the repack writes
 * the chunk's B tiles (512 bytes per block) and float scales (16 per
 * block) into scratch once; every token tile then reuses them. The chunk
 * is sized so that the activations of one chunk for all tokens stay in L2
 * (SPX_AMX_ACT_CHUNK) while the row tiles walk over them; the accumulators
 * of all token tiles wait in scratch between chunks.
 *
 * Matrices without a fast path (groups other than 32, 64, 128; a tiled
 * matrix the tiled layout cannot hold) take the scalar table, as in the
 * AVX2 file; act_bytes() is 0 for those groups.
 *
 * SPX_AMX_EMULATE (a development build on a CPU without AMX: make
 * CC='cc -DSPX_AMX_EMULATE') runs the same code with the tile
 * instructions done in C and spx_amx_usable() = 1; never for real use. */
#include "cpu/qkernels_avx512.h"
#include "cpu/qkernels.h"
#include "quant/qtensor.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <pthread.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define AMX_TARGET "amx-tile,amx-int8," AVX512_TARGET
#define AMX_FN __attribute__((target(AMX_TARGET)))
#define AMX_INLINE static inline __attribute__((always_inline, target(AMX_TARGET)))

enum {
    BLK = 32,               /* columns per block (K of one TDPBSSD) */
    TOK = 16,               /* tokens per tile (A rows, C rows) */
    ROWS = 16,              /* weight rows per tile (B and C columns) */
    TILE_BYTES = TOK * BLK, /* one A tile = one B tile = 512 bytes */
    OJ = 64                 /* outlier columns converted to float per pass */
};

/* Bytes of activations (all tokens) per column chunk: they stay in L2
 * while the row tiles walk over them. */
#ifndef SPX_AMX_ACT_CHUNK
#define SPX_AMX_ACT_CHUNK (1 << 20)
#endif

/* Tile numbers (immediates of the tile instructions). */
/* The pipeline of tile_run: SPX_AMX_NC C tiles (4 or 6), the flush
 * SPX_AMX_DEPTH (< NC) blocks behind the tiles (header comment). */
#ifndef SPX_AMX_NC
#define SPX_AMX_NC 4
#endif
#ifndef SPX_AMX_DEPTH
#define SPX_AMX_DEPTH 3
#endif
#if SPX_AMX_NC != 4 && SPX_AMX_NC != 6
#error "SPX_AMX_NC: 4 or 6"
#endif
#if SPX_AMX_DEPTH < 1 || SPX_AMX_DEPTH >= SPX_AMX_NC
#error "SPX_AMX_DEPTH: 1 .. SPX_AMX_NC - 1"
#endif
#define TC0 0
#define TC1 1
#define TC2 2
#define TC3 3
#if SPX_AMX_NC == 6
#define TC4 4
#define TC5 5
#define TA0 6
#define TA1 6
#define TB0 7
#define TB1 7
#else
#define TA0 4
#define TA1 5
#define TB0 6
#define TB1 7
#endif

/* ======================================================================
 * Tile instructions, or their emulation
 * ==================================================================== */

/* Palette 1 configuration: 64 bytes, ldtilecfg's layout. */
typedef struct tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

#ifdef SPX_AMX_EMULATE
/* The tile registers of this thread, and the instructions' meaning as in
 * the Intel SDM (rows x colsb bytes each; a load zeroes what the
 * configuration leaves out). */
static _Thread_local struct {
    int rows[8], colsb[8];
    int8_t d[8][16][64];
} emu;
static void emu_cfg(const tilecfg *c) {
    memset(&emu, 0, sizeof emu);
    for (int t = 0; t < 8; t++) emu.rows[t] = c->rows[t], emu.colsb[t] = c->colsb[t];
}
static void emu_zero(int t) { memset(emu.d[t], 0, sizeof emu.d[t]); }
static void emu_load(int t, const void *p, int64_t s) {
    emu_zero(t);
    for (int r = 0; r < emu.rows[t]; r++) memcpy(emu.d[t][r], (const uint8_t *)p + r * s, (size_t)emu.colsb[t]);
}
static void emu_store(int t, void *p, int64_t s) {
    for (int r = 0; r < emu.rows[t]; r++) memcpy((uint8_t *)p + r * s, emu.d[t][r], (size_t)emu.colsb[t]);
}
static void emu_dp(int c, int a, int b) {
    for (int m = 0; m < emu.rows[c]; m++)
        for (int n = 0; n < emu.colsb[c] / 4; n++) {
            int32_t acc;
            memcpy(&acc, &emu.d[c][m][4 * n], 4);
            for (int k = 0; k < emu.colsb[a]; k++) acc += emu.d[a][m][k] * emu.d[b][k / 4][4 * n + k % 4];
            memcpy(&emu.d[c][m][4 * n], &acc, 4);
        }
}
#define T_CFG(p) emu_cfg(p)
#define T_RELEASE() ((void)0)
#define T_ZERO(t) emu_zero(t)
#define T_LOAD(t, p, s) emu_load(t, p, s)
#define T_STORE(t, p, s) emu_store(t, p, s)
#define T_DP(c, a, b) emu_dp(c, a, b)
#else
#define T_CFG(p) _tile_loadconfig(p)
#define T_RELEASE() _tile_release()
#define T_ZERO(t) _tile_zero(t)
#define T_LOAD(t, p, s) _tile_loadd(t, p, s)
#define T_STORE(t, p, s) _tile_stored(t, p, s)
#define T_DP(c, a, b) _tile_dpbssd(c, a, b)
#endif

/* ======================================================================
 * Whether the tiles may be used
 * ==================================================================== */

static int g_amx_ok;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;

/* CPUID.7.0:EDX bit 24 AMX-TILE, bit 25 AMX-INT8; the OS manages the tile
 * state (XCR0 bits 17 XTILECFG and 18 XTILEDATA); Linux gives a process
 * the tile data (a dynamically enabled, 8 KB XSAVE component) only after
 * arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once per process
 * for all its threads. */
static void amx_init(void) {
#ifdef SPX_AMX_EMULATE
    g_amx_ok = 1;
#elif defined(__linux__) && defined(SYS_arch_prctl)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return; /* OSXSAVE */
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & (3u << 17)) != (3u << 17)) return;
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
    g_amx_ok = 1;
#endif
}

int spx_amx_usable(void) {
    pthread_once(&g_amx_once, amx_init);
    return g_amx_ok;
}

/* ======================================================================
 * Shapes and sizes
 * ==================================================================== */

static int fast_ok(const spx_qtensor *q) {
    if (!spx_qk_int8_group(q->group) || q->cols <= 0 || q->cols % q->group) return 0;
    if (q->layout == SPX_Q_TILED) return spx_q_tiled_ok(q->bits, q->group, q->cols);
    return q->bits == 4 || q->bits == 2 || q->bits == 3;
}

static int64_t n_tiles(int64_t T) { return (T + TOK - 1) / TOK; }

/* Blocks per column chunk: a multiple of 4 (whole groups of 128 columns,
 * whole 2-/3-bit items), the chunk's activations of all tokens about
 * SPX_AMX_ACT_CHUNK bytes, at most the row rounded up to 4 blocks. */
static int64_t chunk_blocks(int64_t nt, int64_t nb) {
    int64_t kc = SPX_AMX_ACT_CHUNK / (nt * (TILE_BYTES + TOK * (int64_t)sizeof(float)));
    kc &= ~(int64_t)3;
    if (kc < 4) kc = 4;
    const int64_t nb4 = (nb + 3) & ~(int64_t)3;
    return kc < nb4 ? kc : nb4;
}

/* Scratch of one thread, offsets from a 64-byte aligned base (every part a
 * multiple of 64 bytes). */
typedef struct scr_layout {
    int64_t kc;                           /* blocks per column chunk */
    size_t cfg, cb, wb, tmp, sv, ovt, acc; /* offsets */
    size_t total;
} scr_layout;

static scr_layout scr_of(int64_t T, int64_t cols) {
    scr_layout l;
    const int64_t nt = n_tiles(T), nb = cols / BLK;
    l.kc = chunk_blocks(nt, nb);
    size_t o = 0;
    l.cfg = o, o += 64;                                     /* tilecfg */
    l.cb = o, o += SPX_AMX_NC * TOK * ROWS * sizeof(int32_t); /* the C tiles as stored */
    l.wb = o, o += (size_t)l.kc * TILE_BYTES;               /* B tiles of the chunk */
    l.tmp = o, o += (size_t)l.kc * TILE_BYTES;              /* the repack's rows */
    l.sv = o, o += (size_t)l.kc * ROWS * sizeof(float);     /* scales per block */
    l.ovt = o, o += (size_t)OJ * ROWS * sizeof(float);      /* outlier values */
    l.acc = o, o += (size_t)(nt * TOK) * ROWS * sizeof(float); /* accumulators */
    l.total = o;
    return l;
}

size_t spx_amx_act_bytes(int64_t T, int64_t cols, int group) {
    if (!spx_qk_int8_group(group) || cols <= 0 || cols % group || T <= 0) return 0;
    return (size_t)(n_tiles(T) * (cols / BLK)) * (TILE_BYTES + TOK * sizeof(float));
}

size_t spx_amx_scratch_bytes(int64_t T, int64_t cols, int group) {
    const size_t scalar = (size_t)cols * sizeof(float); /* the scalar fallback's */
    if (!spx_qk_int8_group(group) || cols <= 0 || cols % group || T <= 0) return scalar;
    const size_t s = scr_of(T, cols).total + 64; /* + alignment of the base */
    return s > scalar ? s : scalar;
}

/* ======================================================================
 * Activations
 * ==================================================================== */

AMX_FN void spx_amx_prepare(const float *x, int64_t T, int64_t cols, int group, void *act) {
    if (!spx_qk_int8_group(group) || cols <= 0 || cols % group || T <= 0) return;
    const int64_t nb = cols / BLK, nt = n_tiles(T), half = group / 2, bpg = group / BLK;
    int8_t *q8 = (int8_t *)act;
    float *dx = (float *)(q8 + nt * nb * TILE_BYTES);
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * cols;
        const int64_t tile = t / TOK, tt = t % TOK;
        for (int64_t b = 0; b < nb; b++) {
            const int64_t g = b / bpg, i = b % bpg, slot = (tile * nb + b) * TOK + tt;
            const float *lo = xt + g * group + 16 * i;
            const __m512 v0 = _mm512_loadu_ps(lo), v1 = _mm512_loadu_ps(lo + half);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
            const __m512 vid = _mm512_set1_ps(id);
            /* round to nearest even (MXCSR default); |x * id| <= 127 */
            const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
            const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
            _mm_storeu_si128((__m128i *)(q8 + slot * BLK), _mm512_cvtsepi32_epi8(i0));
            _mm_storeu_si128((__m128i *)(q8 + slot * BLK + 16), _mm512_cvtsepi32_epi8(i1));
            dx[slot] = d;
        }
    }
    /* the padding tokens of the last tile: zeros */
    for (int64_t t = T; t < nt * TOK; t++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t slot = ((nt - 1) * nb + b) * TOK + t % TOK;
            memset(q8 + slot * BLK, 0, BLK);
            dx[slot] = 0.0f;
        }
}

/* ======================================================================
 * Weight repack
 * ==================================================================== */

/* One item of 2- or 3-bit codes (qtensor.h: blocks 4j .. 4j + 3) as its
 * four code vectors V0..V3, one code per byte: block beta's lo half is
 * V(2 (beta / 2)) at positions 16 (beta % 2) + m, its hi half V(2 (beta /
 * 2) + 1) there (qkernels_avx2.c's unpack_item). */
AMX_INLINE void unpack_item(const uint8_t *it, const int bits, __m256i v[4]) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)it);
    if (bits == 2) {
        const __m256i m3 = _mm256_set1_epi8(3);
        v[0] = _mm256_and_si256(x, m3);
        v[1] = _mm256_and_si256(_mm256_srli_epi16(x, 2), m3);
        v[2] = _mm256_and_si256(_mm256_srli_epi16(x, 4), m3);
        v[3] = _mm256_and_si256(_mm256_srli_epi16(x, 6), m3);
    } else {
        const __m256i m7 = _mm256_set1_epi8(7);
        /* Y[16] in both lanes, lane 1 shifted down by 4: nibble p of Y */
        const __m256i y = _mm256_srlv_epi64(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(it + 32))),
                                            _mm256_setr_epi64x(0, 0, 4, 4));
        v[0] = _mm256_and_si256(x, m7);
        v[1] = _mm256_and_si256(_mm256_srli_epi16(x, 3), m7);
        v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 5), _mm256_set1_epi8(6)),
                               _mm256_and_si256(y, _mm256_set1_epi8(1)));
        v[3] = _mm256_and_si256(_mm256_srli_epi16(y, 1), m7);
    }
}

/* Zero point and scale (as float) of group g of row R: row-major through
 * the row's arrays (zrow, srow), tiled through the accessors. */
AMX_INLINE void zero_scale(const spx_qtensor *q, int64_t R, int64_t g, const uint8_t *zrow, const uint16_t *srow,
                           const int tl, int *z, float *s) {
    if (tl) {
        *z = spx_q_group_zero(q, R, g);
        *s = _cvtsh_ss(spx_q_group_scale(q, R, g));
    } else {
        *z = (zrow[g >> 1] >> (4 * (g & 1))) & 15;
        *s = _cvtsh_ss(srow[g]);
    }
}

/* Row R's blocks [b0, b0 + n) as w rows of the repack buffer: block k at
 * tmp + 512 k (the caller offsets tmp by 32 slot, slot = 2 (n % 8) + n / 8
 * for tile row n, so one 64-byte line holds tile rows n and n + 8:
 * transpose_block's input), and its scales as floats at sv + 16 k. b0 % 4
 * == 0. 4-bit: four blocks (64 code bytes, one per 128-bit lane; the
 * row's last ones a masked load, which reads nothing past the blocks) at
 * a time: nibbles masked, zero points subtracted per lane, the lanes'
 * low and high halves interleaved into [lo | hi] blocks. 2 and 3 bits: an
 * item (4 blocks) at a time from unpack_item. */
AMX_INLINE void repack_row(const spx_qtensor *q, int64_t R, int64_t b0, int64_t n, int8_t *tmp, float *sv,
                           const int bits, const int bpg, const int tl) {
    const uint8_t *row = tl ? NULL : spx_q_row_codes(q, R);
    const uint16_t *srow = q->scales + R * spx_q_groups(q->cols, q->group);
    const uint8_t *zrow = q->zeros + R * spx_q_zeros_row_bytes(q->cols, q->group);
    for (int64_t k0 = 0; k0 < n; k0 += 4) {
        const int nk = n - k0 < 4 ? (int)(n - k0) : 4;
        const int64_t b = b0 + k0;
        int8_t *o = tmp + TILE_BYTES * k0;
        uint32_t z4 = 0; /* byte k: block b + k's zero point */
        for (int k = 0; k < nk; k++) {
            int z;
            zero_scale(q, R, (b + k) / bpg, zrow, srow, tl, &z, &sv[ROWS * (k0 + k)]);
            z4 |= (uint32_t)z << (8 * k);
        }
        if (bits == 4) {
            const uint8_t *c = tl ? spx_q_group_codes(q, R, b) : row + 16 * b; /* tiled: b % 4 == 0, one item */
            const __m512i v = _mm512_maskz_loadu_epi8(nk == 4 ? ~(__mmask64)0 : ((__mmask64)1 << (16 * nk)) - 1, c);
            const __m512i m = _mm512_set1_epi8(0x0f);
            const __m512i zv = _mm512_shuffle_epi8(
                _mm512_set1_epi32((int)z4),
                _mm512_set_epi32(0x03030303, 0x03030303, 0x03030303, 0x03030303, 0x02020202, 0x02020202, 0x02020202,
                                 0x02020202, 0x01010101, 0x01010101, 0x01010101, 0x01010101, 0, 0, 0, 0));
            const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(v, m), zv);
            const __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m), zv);
            const __m512i w01 = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi);
            const __m512i w23 = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), hi);
            _mm256_storeu_si256((__m256i *)o, _mm512_castsi512_si256(w01));
            if (nk > 1) _mm256_storeu_si256((__m256i *)(o + TILE_BYTES), _mm512_extracti64x4_epi64(w01, 1));
            if (nk > 2) _mm256_storeu_si256((__m256i *)(o + 2 * TILE_BYTES), _mm512_castsi512_si256(w23));
            if (nk > 3) _mm256_storeu_si256((__m256i *)(o + 3 * TILE_BYTES), _mm512_extracti64x4_epi64(w23, 1));
        } else {
            __m256i v[4];
            unpack_item(row + 16 * bits * (b / 4), bits, v);
            for (int beta = 0; beta < nk; beta++) {
                const __m256i lo = v[2 * (beta >> 1)], hi = v[2 * (beta >> 1) + 1];
                /* [lo half | hi half] of block beta: 128-bit lane beta % 2 of each */
                const __m256i w = (beta & 1) ? _mm256_permute2x128_si256(lo, hi, 0x31)
                                             : _mm256_permute2x128_si256(lo, hi, 0x20);
                _mm256_storeu_si256((__m256i *)(o + TILE_BYTES * beta),
                                    _mm256_sub_epi8(w, _mm256_set1_epi8((char)(z4 >> (8 * beta)))));
            }
        }
    }
}

/* A block's 16 w rows (tmp: line k = rows k and k + 8, 8 dwords each) to
 * the B tile (VNNI: line k4 = dword k4 of rows 0..15): an 8 x 8 dword
 * transpose in each 256-bit half (unpacks within 128-bit lanes), whose
 * halves the last step joins. */
AMX_INLINE void transpose_block(const int8_t *tmp, int8_t *wb) {
    __m512i r[8], t[8], u[8];
    for (int k = 0; k < 8; k++) r[k] = _mm512_loadu_si512((const void *)(tmp + 64 * k));
    for (int k = 0; k < 8; k += 2) {
        t[k] = _mm512_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm512_unpackhi_epi32(r[k], r[k + 1]);
    }
    /* u[4 h + d] (h: rows 0-3 / 4-7 of each half): 128-bit lane 0 dword d
     * of its 4 rows, lane 1 dword d + 4; lanes 2, 3 the same of rows + 8 */
    for (int h = 0; h < 2; h++) {
        const __m512i *s = t + 4 * h;
        u[4 * h + 0] = _mm512_unpacklo_epi64(s[0], s[2]);
        u[4 * h + 1] = _mm512_unpackhi_epi64(s[0], s[2]);
        u[4 * h + 2] = _mm512_unpacklo_epi64(s[1], s[3]);
        u[4 * h + 3] = _mm512_unpackhi_epi64(s[1], s[3]);
    }
    const __m512i i0 = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), i1 = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int d = 0; d < 4; d++) {
        _mm512_storeu_si512((void *)(wb + 64 * d), _mm512_permutex2var_epi64(u[d], i0, u[4 + d]));
        _mm512_storeu_si512((void *)(wb + 64 * (d + 4)), _mm512_permutex2var_epi64(u[d], i1, u[4 + d]));
    }
}

/* The B tiles and scales of rows [R0, R0 + nr) (nr <= 16; the other tile
 * rows w = 0, scale 0) for blocks [b0, b0 + n). */
AMX_INLINE void repack(const spx_qtensor *q, int64_t R0, int nr, int64_t b0, int64_t n, int8_t *tmp, int8_t *wb,
                       float *sv, const int bits, const int bpg, const int tl) {
    for (int r = 0; r < ROWS; r++) {
        int8_t *tr = tmp + 32 * (2 * (r & 7) + (r >> 3));
        if (r < nr) {
            repack_row(q, R0 + r, b0, n, tr, sv + r, bits, bpg, tl);
        } else {
            for (int64_t k = 0; k < n; k++) {
                _mm256_storeu_si256((__m256i *)(tr + TILE_BYTES * k), _mm256_setzero_si256());
                sv[ROWS * k + r] = 0.0f;
            }
        }
    }
    for (int64_t k = 0; k < n; k++) transpose_block(tmp + TILE_BYTES * k, wb + TILE_BYTES * k);
}

/* ======================================================================
 * Products
 * ==================================================================== */

/* acc[t] += (float(C[t]) * dx[t]) * s for the 16 tokens of one stored C
 * tile (row t: 16 int32, one per weight row), its block's dx (16 tokens)
 * and scales (16 rows). */
AMX_INLINE void flush(const int32_t *cb, const float *dx, const float *sv, __m512 acc[TOK]) {
    const __m512 s = _mm512_loadu_ps(sv);
    #pragma GCC unroll 16
    for (int t = 0; t < TOK; t++) {
        const __m512 c = _mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)(cb + ROWS * t)));
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(c, _mm512_set1_ps(dx[t])), s, acc[t]);
    }
}

/* Block k of one token tile times one row tile into tile C (a constant),
 * stored to cb: a (the token tile's A tiles, 512 bytes per block), wb (the
 * repacked B tiles). */
#define TILE_BLOCK(C, A, B, k, cbuf)                       \
    do {                                                   \
        T_ZERO(C);                                         \
        T_LOAD(A, a + TILE_BYTES * (k), BLK);              \
        T_LOAD(B, wb + TILE_BYTES * (k), 64);              \
        T_DP(C, A, B);                                     \
        T_STORE(C, cbuf, 64);                              \
    } while (0)

/* Step k of tile_run's pipeline, j = k % NC (a constant): block k goes
 * into tile C(j) and cb(j) (with NC = 4 the A and B tiles alternate by k
 * % 2), block k - D is flushed from cb((j - D) % NC). D < NC: a C tile is
 * reused only after its flush. */
#define PIPE_STEP(j, Cj, Aj, Bj, k)                                                   \
    do {                                                                              \
        if ((k) < n) TILE_BLOCK(Cj, Aj, Bj, k, cb[j]);                                \
        if ((k) >= D && (k) - D < n)                                                  \
            flush(cb[((j) + NC - D) % NC], dx + TOK * ((k) - D), sv + ROWS * ((k) - D), acc); \
    } while (0)

/* One token tile times one row tile over n >= 1 blocks: dx (16 per
 * block) and sv (the repacked scales, 16 per block) for the flush; acc16
 * holds the 16 accumulators in and out (16 floats each). Software
 * pipelined (header comment): block k is computed in C(k % NC) and
 * stored to cb(k % NC) while block k - D, stored D steps earlier, is
 * flushed. Steps past n do nothing (the last pass flushes the tail). */
AMX_FN __attribute__((noinline)) static void tile_run(const int8_t *a, const float *dx, const int8_t *wb,
                                                      const float *sv, int64_t n, int32_t *cb0, float *acc16) {
    enum { D = SPX_AMX_DEPTH, NC = SPX_AMX_NC };
    __m512 acc[TOK];
    #pragma GCC unroll 16
    for (int t = 0; t < TOK; t++) acc[t] = _mm512_loadu_ps(acc16 + ROWS * t);
    int32_t *cb[NC];
    for (int j = 0; j < NC; j++) cb[j] = cb0 + j * TOK * ROWS;
    for (int64_t k = 0; k < n + D; k += NC) {
        PIPE_STEP(0, TC0, TA0, TB0, k);
        PIPE_STEP(1, TC1, TA1, TB1, k + 1);
        PIPE_STEP(2, TC2, TA0, TB0, k + 2);
        PIPE_STEP(3, TC3, TA1, TB1, k + 3);
#if SPX_AMX_NC == 6
        PIPE_STEP(4, TC4, TA0, TB0, k + 4);
        PIPE_STEP(5, TC5, TA1, TB1, k + 5);
#endif
    }
    #pragma GCC unroll 16
    for (int t = 0; t < TOK; t++) _mm512_storeu_ps(acc16 + ROWS * t, acc[t]);
}

typedef struct kctx {
    const spx_qtensor *q;
    const int8_t *q8; /* act: A tiles */
    const float *dx;  /* act: dx */
    const float *x;
    int64_t T, nt, nb, ys;
    float *y;
    scr_layout l;
    uint8_t *s; /* scratch base, 64-aligned */
} kctx;

/* The outlier columns of rows [R0, R0 + nr) added to the accumulators of
 * tokens < T (index order, OJ columns converted to float per pass), then
 * those tokens' y written (masked to the nr rows). */
AMX_FN static void finish_tile(const kctx *c, int64_t R0, int nr) {
    const spx_qtensor *q = c->q;
    const int64_t no = q->n_outliers, cols = q->cols;
    float *acc = (float *)(c->s + c->l.acc), *ovt = (float *)(c->s + c->l.ovt);
    for (int64_t j0 = 0; j0 < no; j0 += OJ) {
        const int jn = (int)(no - j0 < OJ ? no - j0 : OJ);
        for (int j = 0; j < jn; j++)
            for (int r = 0; r < ROWS; r++)
                ovt[ROWS * j + r] = r < nr ? _cvtsh_ss(q->outlier_val[(R0 + r) * no + j0 + j]) : 0.0f;
        const int32_t *idx = q->outlier_idx + j0;
        for (int64_t t = 0; t < c->T; t++) {
            const float *xt = c->x + t * cols;
            __m512 v = _mm512_loadu_ps(acc + ROWS * t);
            for (int j = 0; j < jn; j++)
                v = _mm512_fmadd_ps(_mm512_loadu_ps(ovt + ROWS * j), _mm512_set1_ps(xt[idx[j]]), v);
            _mm512_storeu_ps(acc + ROWS * t, v);
        }
    }
    const __mmask16 m = (__mmask16)((1u << nr) - 1);
    for (int64_t t = 0; t < c->T; t++) _mm512_mask_storeu_ps(c->y + t * c->ys + R0, m, _mm512_loadu_ps(acc + ROWS * t));
}

/* Rows [r0, r1) in tiles of 16 from r0; per tile, column chunk by chunk:
 * the repack, then every token tile. */
AMX_INLINE void rows_run(const kctx *c, int64_t r0, int64_t r1, const int bits, const int bpg, const int tl) {
    const int64_t nb = c->nb, kc = c->l.kc;
    int8_t *tmp = (int8_t *)(c->s + c->l.tmp), *wb = (int8_t *)(c->s + c->l.wb);
    float *sv = (float *)(c->s + c->l.sv), *acc = (float *)(c->s + c->l.acc);
    int32_t *cb = (int32_t *)(c->s + c->l.cb);
    for (int64_t R0 = r0; R0 < r1; R0 += ROWS) {
        const int nr = (int)(r1 - R0 < ROWS ? r1 - R0 : ROWS);
        memset(acc, 0, (size_t)(c->nt * TOK) * ROWS * sizeof(float));
        for (int64_t b0 = 0; b0 < nb; b0 += kc) {
            const int64_t n = nb - b0 < kc ? nb - b0 : kc;
            repack(c->q, R0, nr, b0, n, tmp, wb, sv, bits, bpg, tl);
            for (int64_t i = 0; i < c->nt; i++)
                tile_run(c->q8 + (i * nb + b0) * TILE_BYTES, c->dx + (i * nb + b0) * TOK, wb, sv, n, cb,
                         acc + i * TOK * ROWS);
        }
        finish_tile(c, R0, nr);
    }
}

/* One function per (bits, blocks per group, layout). */
#define ROWS_FN(NAME, BITS, BPG, TL)                                                                \
    AMX_FN __attribute__((noinline)) static void NAME(const kctx *c, int64_t r0, int64_t r1) { \
        rows_run(c, r0, r1, BITS, BPG, TL);                                                     \
    }
ROWS_FN(rows_4_1, 4, 1, 0)
ROWS_FN(rows_4_2, 4, 2, 0)
ROWS_FN(rows_4_4, 4, 4, 0)
ROWS_FN(rows_4_t, 4, 1, 1)
ROWS_FN(rows_2_1, 2, 1, 0)
ROWS_FN(rows_2_2, 2, 2, 0)
ROWS_FN(rows_2_4, 2, 4, 0)
ROWS_FN(rows_3_1, 3, 1, 0)
ROWS_FN(rows_3_2, 3, 2, 0)
ROWS_FN(rows_3_4, 3, 4, 0)
typedef void (*rows_fn)(const kctx *, int64_t, int64_t);
/* [bits 4, 2, 3][bpg 1, 2, 4] */
static const rows_fn g_rows[3][3] = {
    {rows_4_1, rows_4_2, rows_4_4}, {rows_2_1, rows_2_2, rows_2_4}, {rows_3_1, rows_3_2, rows_3_4}};

AMX_FN void spx_amx_rows(const spx_qtensor *q, const void *act, const float *x, int64_t T, float *y,
                         int64_t y_stride, int64_t r0, int64_t r1, void *scratch) {
    if (!fast_ok(q)) {
        spx_qkernels_scalar()->rows(q, act, x, T, y, y_stride, r0, r1, scratch);
        return;
    }
    if (r0 >= r1 || T <= 0) return;
    kctx c;
    c.q = q;
    c.x = x;
    c.T = T;
    c.nt = n_tiles(T);
    c.nb = q->cols / BLK;
    c.ys = y_stride;
    c.y = y;
    c.q8 = (const int8_t *)act;
    c.dx = (const float *)(c.q8 + c.nt * c.nb * TILE_BYTES);
    c.l = scr_of(T, q->cols);
    c.s = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    tilecfg *cfg = (tilecfg *)(c.s + c.l.cfg);
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int i = 0; i < SPX_AMX_NC; i++) cfg->rows[i] = TOK, cfg->colsb[i] = ROWS * 4;
    const int ab[4] = {TA0, TA1, TB0, TB1}; /* A tiles, then B tiles (the same numbers when NC = 6) */
    for (int i = 0; i < 4; i++) {
        cfg->rows[ab[i]] = i < 2 ? TOK : BLK / 4;
        cfg->colsb[ab[i]] = i < 2 ? BLK : ROWS * 4;
    }
    T_CFG(cfg);
    const int bpg = q->group / BLK, gi = bpg == 1 ? 0 : bpg == 2 ? 1 : 2;
    if (q->layout == SPX_Q_TILED) rows_4_t(&c, r0, r1);
    else g_rows[q->bits == 4 ? 0 : q->bits == 2 ? 1 : 2][gi](&c, r0, r1);
    T_RELEASE();
}
#endif
