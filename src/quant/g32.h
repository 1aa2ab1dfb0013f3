/* g32.h: Group-wise asymmetric b-bit quantization (SPECTRA section 3.4),
 * the scalar reference that defines the stored format's numbers.
 *
 * One row of W (in_features = cols floats) is cut into groups of `group`
 * consecutive columns. Per group, over the entries that are NOT outlier
 * columns (n = 2^bits - 1):
 *
 *   wmin, wmax  min / max of the non-outlier entries (both 0 when there are
 *               none, which gives the floor scale below and z = 0)
 *   s32  = max((wmax - wmin) / n, 1e-8)        float32 arithmetic
 *   s    = fp16(s32)                            round to nearest even; then
 *          inf (s32 >= 65520) -> 65504 (0x7bff) and 0 -> 2^-24 (0x0001), so
 *          0 < s <= 65504 always (1e-8 itself rounds to 0 in fp16)
 *   z    = clamp(round(-wmin / s), 0, n)        uses the fp16 s
 *   q    = clamp(round(w / s + z), 0, n)        float32: u = fl(fl(w/s) + z)
 *   w^   = (q - z) * s                          exact in float32
 *
 * round() is round-half-away-from-zero (C roundf), not banker's rounding;
 * a NaN argument gives code 0. Outlier slots get q = z (w^ = 0 exactly).
 * This is SPX_Q_MINMAX, the paper's rule. Its weakness: a group whose
 * entries all have one sign has z clamped to 0 or n and the grid covers
 * [0, range] instead of [wmin, wmax] (the paper's rule as written; such
 * groups are rare in weights, and SPX_Q_MSE handles them).
 *
 * SPX_Q_MSE searches (s, z) per group for the smallest squared error, with
 * the error measured exactly as stored (fp16 s, integer z in [0, n]); its
 * first candidate is the MINMAX result, so it is never worse per group.
 *
 * Proposition 2, exactly: for a group spanning zero (wmin <= 0 <= wmax),
 * |w - w^| / s <= 1/2 + n * delta + eps, where delta = max(0, s32/s - 1)
 * is the relative amount by which fp16 rounding shrank the scale (<= 2^-11
 * for normal s) and eps (< 2^-18 for |u| <= 16) covers the float32 w/s and
 * + z. When fp16 rounds s up (delta = 0) the bound is 1/2 + eps. See
 * spx_q_prop2_slack().
 *
 * Packing (normative; qtensor.h and docs/trdc.md): 4-bit codes by group,
 * G/2 bytes each, code k in the low nibble of byte k % (G/2) for k < G/2
 * and the high nibble otherwise (G32: codes k and k + 16 in byte k); bits
 * 2 and 3 in items of 128 columns (4 blocks of 32), 32 or 48 bytes each,
 * the last item padded with code 0. Zero points are nibbles for every bit
 * width: group 2i in the low nibble, 2i + 1 in the high nibble of byte i;
 * the unused high nibble of an odd count is written 0. The functions in
 * src/quant/qpack.c are the one definition every consumer uses.
 *
 * Limits: bits in {2, 3, 4}; group a multiple of 8 (of 32 for bits 2 and
 * 3: their packing is in blocks of 32) dividing cols, at most
 * SPX_Q_GROUP_MAX for quantization. The TRDC format stores 32, 64 and 128
 * (spx_q_group_stored_ok); other sizes, e.g. one group per row, are for
 * experiments. Dequantization and the dot products trust the qtensor's
 * fields and pointers: the file reader validates them first. Weights are
 * expected to be finite (the compressor rejects others; NaN gives code 0
 * and no UB); huge finite weights saturate the scale at 65504 and clip.
 * Rounding of a stored 0.5 tie uses half away from zero, i.e. half up, as
 * u >= 0 after the clamp. Nothing here allocates except spx_qbuf.
 *
 * Cost (one core, scalar): MSE is about 10x MINMAX (2 bits a little more:
 * its grid is longer). */
#ifndef SPX_G32_H
#define SPX_G32_H

#include "core/err.h"
#include "quant/qtensor.h"
#include <stdint.h>

typedef enum spx_q_method {
    SPX_Q_MINMAX = 0, /* the paper's rule above */
    SPX_Q_MSE = 1     /* per-group search for the least squared error */
} spx_q_method;

#define SPX_Q_GROUP_MAX 4096       /* largest group quantize accepts */
#define SPX_Q_SCALE_F16_MIN 0x0001u /* 2^-24, smallest positive fp16 */
#define SPX_Q_SCALE_F16_MAX 0x7bffu /* 65504, largest finite fp16 */

/* Checks bits, group and cols; the message names the bad value. */
spx_status spx_q_check_params(int bits, int group, int64_t cols, spx_err *e);
/* Group sizes the TRDC container stores: 32, 64, 128. */
static inline int spx_q_group_stored_ok(int group) {
    return group == 32 || group == 64 || group == 128;
}

/* The scale rule alone: s32 = max((wmax - wmin) / n, 1e-8) in float32, and
 * the fp16 bits of s for a group with this min and max. */
float spx_q_scale32(float wmin, float wmax, int bits);
uint16_t spx_q_scale_f16(float wmin, float wmax, int bits);
/* The zero point rule: clamp(round(-wmin / s), 0, 2^bits - 1). */
int spx_q_zero_point(float wmin, float s, int bits);
/* Proposition 2 slack for one group: the bound on |w - w^| / s minus 1/2,
 * given the group's unrounded float32 scale s32 and its stored fp16 s. */
double spx_q_prop2_slack(int bits, float s32, uint16_t s_f16);

/* Quantizes one row w[cols]. is_outlier: NULL or cols flags (non-zero =
 * outlier column, excluded from min/max and given q = z). Writes
 * codes[spx_q_codes_row_bytes(cols, bits)], scales[cols / group] (fp16)
 * and zeros[spx_q_zeros_row_bytes(cols, group)]. method: spx_q_method.
 * Returns SPX_ERR_ARG (and writes nothing) on bad bits/group/cols/method. */
spx_status spx_q_quantize_row(const float *w, int64_t cols, const uint8_t *is_outlier, int bits,
                              int group, int method, uint8_t *codes, uint16_t *scales,
                              uint8_t *zeros);
/* The same with per-column importance weights imp[cols] >= 0 (NULL = all
 * 1) for SPX_Q_MSE's error sum(imp * (w - w^)^2), e.g. E[x_j^2]. MINMAX
 * ignores them. */
spx_status spx_q_quantize_row_imp(const float *w, int64_t cols, const uint8_t *is_outlier,
                                  const float *imp, int bits, int group, int method,
                                  uint8_t *codes, uint16_t *scales, uint8_t *zeros);

/* ---- Packing (qpack.c) --------------------------------------------------
 * Code `col` of one row's codes (spx_q_codes_row_bytes(cols, bits) bytes,
 * SPX_Q_ROWS), for tests, tools and references; kernels unpack whole
 * groups or items. code_set changes only that code's bits. */
int spx_q_code_get(const uint8_t *codes_row, int64_t col, int bits, int group);
void spx_q_code_set(uint8_t *codes_row, int64_t col, int bits, int group, int q);
static inline int spx_q_zero_get(const uint8_t *zeros_row, int64_t g) {
    return (zeros_row[g >> 1] >> ((g & 1) * 4)) & 0xf;
}
/* Group g of a row: its codes to q[group] (unpack) or from q (pack; only
 * the group's own bits change, so a row of bits 2 or 3 is zeroed first
 * for its padding). */
void spx_q_unpack_group(const uint8_t *codes_row, int64_t g, int bits, int group, uint8_t *q);
void spx_q_pack_group(uint8_t *codes_row, int64_t g, int bits, int group, const uint8_t *q);

/* The 2- and 3-bit packing of .trdc versions 1 and 2 (group order: 4 and
 * 2 codes per byte, code k of a group in byte k % B, slot k / B, B = group
 * / codes per byte): its bytes per row, and one row of it repacked into
 * the current packing (row[spx_q_codes_row_bytes]: every code, padding
 * zeroed; a 3-bit nibble's unused top bit is dropped). */
int64_t spx_q_legacy_codes_row_bytes(int64_t cols, int bits);
void spx_q_repack_legacy_row(const uint8_t *old_row, int64_t cols, int bits, int group, uint8_t *row);

/* Repacks src (SPX_Q_ROWS, spx_q_tiled_ok) into the SPX_Q_TILED arrays
 * codes[spx_q_codes_bytes], scales[.. / 2], zeros[..] (the caller's;
 * padding rows are written as zeros) and fills *dst: src's fields with
 * the new arrays and layout SPX_Q_TILED (outliers shared with src).
 * SPX_ERR_ARG if src cannot be tiled. */
spx_status spx_q_tile(const spx_qtensor *src, uint8_t *codes, uint16_t *scales, uint8_t *zeros,
                      spx_qtensor *dst, spx_err *e);
/* The same with the arrays allocated in one block (*mem, for free());
 * SPX_ERR_NOMEM on failure. */
spx_status spx_q_tile_alloc(const spx_qtensor *src, spx_qtensor *dst, void **mem, spx_err *e);

/* The inverse: src (SPX_Q_TILED) into row-major arrays allocated in one
 * block (*mem, for free()); *dst as src with them and layout SPX_Q_ROWS. */
spx_status spx_q_untile_alloc(const spx_qtensor *src, spx_qtensor *dst, void **mem, spx_err *e);

/* src in the layout a writer wants: row_major 0 tiles a row-major matrix
 * the tiled layout can hold, 1 untiles a tiled one (into *mem, allocated,
 * for free()); any other matrix is *dst = *src with *mem NULL. So *mem
 * != NULL says the layout changed. */
spx_status spx_q_as_layout(const spx_qtensor *src, int row_major, spx_qtensor *dst, void **mem, spx_err *e);

/* Dense dequantization of one row from raw arrays (outlier slots give 0):
 * out[cols] = (q - z) * s. */
void spx_q_dequantize_row(const uint8_t *codes, const uint16_t *scales, const uint8_t *zeros,
                          int64_t cols, int bits, int group, float *out);
/* Row `row` of q as float32, outlier columns included (embedding gather,
 * reference checks). */
void spx_q_dequant_row_f32(const spx_qtensor *q, int64_t row, float *out);

/* Fused scalar reference: sum_c W^[row, c] x[c] without materialising the
 * row: per group s * sum_k (q_k - z) x_k (float32 inner sum, double across
 * groups), plus sum_j fp16(outlier_val[row, j]) * x[idx[j]]. */
float spx_q_dot_row(const spx_qtensor *q, int64_t row, const float *x);
/* One row against n_tok token vectors (prefill): out[t * out_stride] =
 * W^[row] . x[t * x_stride .. + cols]. The row is dequantized once into
 * scratch[cols] (caller's; not shared between threads); sums in double. */
void spx_q_dot_rows(const spx_qtensor *q, int64_t row, const float *x, int64_t n_tok,
                    int64_t x_stride, float *out, int64_t out_stride, float *scratch);

/* ------------------------------------------------------------------------
 * spx_qbuf: an owned quantized matrix (tests, experiments, tools). The
 * compressor streams rows into its own buffers instead. */
typedef struct spx_qbuf {
    spx_qtensor q;          /* view of the arrays below */
    int64_t codes_row_bytes, zeros_row_bytes, n_groups;
    uint8_t *codes;
    uint16_t *scales;
    uint8_t *zeros;
    int32_t *outlier_idx;   /* [n_outliers] sorted */
    uint16_t *outlier_val;  /* [rows, n_outliers] */
    uint8_t *is_outlier;    /* [cols] flags built from outlier_idx */
} spx_qbuf;

/* Allocates a rows x cols matrix. outlier_idx: n_outliers strictly
 * increasing column indices < cols (copied), or NULL with n_outliers 0. */
spx_status spx_qbuf_init(spx_qbuf *b, int64_t rows, int64_t cols, int bits, int group,
                         const int32_t *outlier_idx, int64_t n_outliers, spx_err *e);
void spx_qbuf_free(spx_qbuf *b);
/* Quantizes w[cols] into row `row`: codes, scales, zeros, and the outlier
 * values as fp16 (saturated to +-65504). Safe to call for different rows
 * from different threads. */
void spx_qbuf_set_row(spx_qbuf *b, int64_t row, const float *w, int method, const float *imp);

#endif
