/* refine.h: the CPU building blocks of StrataFlux weight refinement
 * (issue 20; ../shared/spec/strataflux-paper.txt sections 2.2, 3.2.1;
 * DecDEC, OSDI '25): the residual of a quantized matrix stored as 4-bit
 * columns, the exact per-chunk top-k channel selection, and the
 * application of the selected columns to a base GEMV's output.
 *
 * Meaning. W [rows, cols] is the source float matrix (out x in), W^ its
 * dequantized spx_qtensor exactly as the engine computes it
 * (spx_q_dequant_row_f32: dense codes (q - z) s plus the fp16 outlier
 * columns), and R = W - W^ (float32 subtraction). For one token x[cols]
 * and a set S of selected input channels,
 *     y[r] = (W^ x)[r] + sum_{i in S} x[i] C[r, i]                (eq. 2)
 * where C is the stored refinement: C = R exactly in the float variant
 * (spx_refine_f32, for tests and references), C[r, i] = scale[r] * q[r, i]
 * in the 4-bit variant (spx_refine_q4).
 *
 * 4-bit layout (DecDEC's, column-contiguous). Codes are symmetric signed
 * integers q in [-7, 7] stored as the nibble q + 8 (so 8 is zero; 0,
 * i.e. -8, is never written but decodes as -8). Input channel i's column
 * holds all rows' codes in one contiguous run of col_bytes = ceil(rows/2)
 * bytes at codes + i * col_stride: byte b holds row 2b in its low nibble
 * and row 2b + 1 in its high nibble (read as little-endian 32-bit words,
 * word m holds rows 8m .. 8m + 7, row 8m + k in nibble k: DecDEC's uint32
 * packing). An odd row count's last high nibble, and any bytes between
 * col_bytes and col_stride, hold 8 (zero). So fetching a channel is one
 * read of col_bytes bytes, from a file, an LRU cache or memory.
 * Scales: one float32 per output row, stored once per matrix (rows * 4
 * bytes, against rows * cols / 2 of codes). float32 rather than fp16
 * because a residual's step is small: the residual of a 4-bit G32 base is
 * at most half the base's step, and its own step 1/7 of that, so for
 * weights of rms 1e-2 it is around 3e-4, and for quiet rows (rms 1e-3)
 * below fp16's normal range (6.1e-5), where fp16 keeps only a few bits.
 *
 * Scale choice (per row, spx_refine_q4_row_scale): with a = max_c |R[r,c]|
 * and s0 = a / 7, a small MSE search over s = s0 * t / 16: t = 16, 14,
 * ..., 2 first, then t_best + 1 and t_best - 1, then the best + 1/2 and
 * - 1/2 (12 candidates; 0 < t <= 16, so the scale never exceeds a / 7,
 * and large entries are clipped to +-7 s when that lowers the error).
 * For each candidate q = clamp(roundf(R * (1 / s)), -7, 7) and the error
 * is sum (R - s q)^2 (double); a strictly smaller error replaces the
 * best, so ties keep the earlier candidate. a == 0 gives s = 0 and all
 * codes 0. DecDEC's grid is 32 points s0 * t / 32, t = 1..32; this search
 * reaches the same resolution near the optimum with 12 passes over the
 * row instead of 32.
 *
 * Selection (spx_refine_topk): for each chunk of `chunk` consecutive
 * channels (SPX_REFINE_CHUNK = 1024; the last chunk may be shorter), the
 * exact min(k, candidates) channels of largest |x|, where candidates are
 * the chunk's channels not flagged in `skip`. Order: larger |x| first,
 * NaN below every number (below 0), ties to the lower index; -0 equals 0.
 * Output: the indices, ascending (chunk by chunk, so ascending overall).
 * Method: radix select on a 31-bit order-preserving key of |x|: a
 * histogram of its top 11 bits over the chunk, one pass that writes the
 * indices above the k-th key's bin and lists the keys in it, then two
 * 10-bit digit passes over that (short) list and a merge: two passes over
 * the chunk, O(chunk), no sort, no allocation. Outlier input
 * channels of the base (stored exactly in fp16) have a residual of fp16
 * rounding only; pass spx_refine_skip_outliers' flags as `skip` so the
 * budget goes to channels with a real residual.
 *
 * Application (spx_refine_kernels.apply): the scalar table defines the
 * numbers: for each row r of [r0, r1), over the selected columns in the
 * order given whose column is available,
 *     acc = fmaf(x[sel[j]], (float)q[r, sel[j]], acc)     acc starts at +0
 * then y[r] = y[r] + scale[r] * acc (a float multiply, then a float add).
 * If no column is available (n_sel == 0, or all missing) y is not written
 * at all, so it stays bit for bit (even -0 and NaN). The avx2 table does
 * the same operations in the same order for each row (8 rows per vector
 * lane set, FMA), so its y is bit-identical to the scalar table's;
 * tests/test_refine.c checks the bits. Row ranges may be split across
 * threads anywhere (each row's numbers do not depend on the split).
 *
 * Missing columns: `col` is NULL when every column is resident at
 * R->codes, or an array of n_sel pointers, col[j] being column sel[j]'s
 * col_bytes bytes (anywhere: a cache slot) or NULL when the tier missed;
 * a missing column is skipped (the step keeps the resident weights' value
 * for it).
 *
 * Limits: rows, cols >= 1, cols <= INT32_MAX (int32 indices). Only the
 * builders allocate; spx_refine_topk uses about 40 KiB of stack and the
 * avx2 apply about 20 KiB. The f32 variant's apply sums in double (it is
 * the exactness reference, not a kernel).
 *
 * Elsewhere: the .refine container (format/trdc.h refine4), the tier
 * (tier.h), the engine's use (rmat.h, attach.h), the neuron-wise MLP
 * alternative built from these residuals (bundle.h). Refinement fitting
 * (eqs. 3-4): fit.h. */
#ifndef SPX_REFINE_H
#define SPX_REFINE_H

#include "core/err.h"
#include "quant/qtensor.h"
#include <stddef.h>
#include <stdint.h>

#define SPX_REFINE_CHUNK 1024     /* channels per selection chunk (the paper's) */
#define SPX_REFINE_CHUNK_MAX 4096 /* largest chunk spx_refine_topk takes */
#define SPX_REFINE_QMAX 7         /* codes in [-QMAX, QMAX] */
#define SPX_REFINE_ZERO 8         /* the nibble of code 0 (nibble = q + 8) */

/* ------------------------------------------------------------------------
 * The 4-bit residual: a view (nothing owned) and an owned builder. */
typedef struct spx_refine_q4 {
    int64_t rows, cols;
    int64_t col_bytes;    /* (rows + 1) / 2: one column's codes */
    int64_t col_stride;   /* bytes from column i to i + 1, >= col_bytes */
    const uint8_t *codes; /* [cols][col_stride]; may be NULL when every apply
                             passes its own column pointers */
    const float *scales;  /* [rows] */
} spx_refine_q4;

static inline int64_t spx_refine_col_bytes(int64_t rows) { return (rows + 1) / 2; }
static inline const uint8_t *spx_refine_q4_col(const spx_refine_q4 *R, int64_t i) {
    return R->codes + i * R->col_stride;
}
/* Code of (r, i), in [-8, 7], from a column's bytes. */
static inline int spx_refine_code(const uint8_t *col, int64_t r) {
    return (int)((col[r >> 1] >> ((r & 1) * 4)) & 0xf) - SPX_REFINE_ZERO;
}

typedef struct spx_refine_q4buf {
    spx_refine_q4 v; /* view of the arrays below */
    uint8_t *codes;  /* [cols][col_stride] */
    float *scales;   /* [rows] */
} spx_refine_q4buf;

/* Allocates a rows x cols residual, every code 0 and scale 0.
 * col_stride: 0 for col_bytes rounded up to 64 (a cache line), else at
 * least col_bytes. SPX_ERR_ARG on bad shapes, SPX_ERR_NOMEM. */
spx_status spx_refine_q4buf_init(spx_refine_q4buf *b, int64_t rows, int64_t cols, int64_t col_stride,
                                 spx_err *e);
void spx_refine_q4buf_free(spx_refine_q4buf *b);

/* The residual of rows [r0, r0 + n) of W against q: w points at row r0 of
 * W (row r0 + t at w + t * ldw floats). Chooses each row's scale
 * (spx_refine_q4_row_scale) and writes its codes into the columns.
 * Threads may fill disjoint ranges at once if each starts at an even row
 * (rows 2b and 2b + 1 share bytes). SPX_ERR_ARG if q's shape differs from
 * b's, or a residual is not finite (the message names row and column). */
spx_status spx_refine_q4_set_rows(spx_refine_q4buf *b, const spx_qtensor *q, const float *w, int64_t ldw,
                                  int64_t r0, int64_t n, spx_err *e);
/* Rows [r0, r0 + n) from given values instead of a residual (fitted
 * refinement values, fit.h): c points at row r0 (row r0 + t at c + t *
 * ldc), encoded with the same row rule. Same threading rule as set_rows;
 * SPX_ERR_ARG for a non-finite value or a bad range. */
spx_status spx_refine_q4_set_values(spx_refine_q4buf *b, const float *c, int64_t ldc, int64_t r0, int64_t n,
                                    spx_err *e);
/* init + set_rows over the whole of W [q->rows, q->cols] (row-major). */
spx_status spx_refine_q4_build(spx_refine_q4buf *b, const spx_qtensor *q, const float *w, spx_err *e);

/* The scale rule alone for one row of residuals res[n] (finite), and the
 * row's codes for a scale (code[c] in [-7, 7]; all 0 for s = 0). */
float spx_refine_q4_row_scale(const float *res, int64_t n);
void spx_refine_q4_row_codes(const float *res, int64_t n, float s, int8_t *code);

/* ------------------------------------------------------------------------
 * The unquantized residual (tests, references): C = R exactly. */
typedef struct spx_refine_f32 {
    int64_t rows, cols;
    float *data; /* [cols][rows], column i at data + i * rows (owned) */
} spx_refine_f32;

/* R = W - W^ as floats; W row-major [q->rows, q->cols]. */
spx_status spx_refine_f32_build(spx_refine_f32 *b, const spx_qtensor *q, const float *w, spx_err *e);
void spx_refine_f32_free(spx_refine_f32 *b);
/* y[r] = (float)(y[r] + sum_j x[sel[j]] R[r, sel[j]]) for r in [r0, r1),
 * the sum in double; n_sel == 0 leaves y untouched. */
void spx_refine_f32_apply(const spx_refine_f32 *R, const int32_t *sel, int64_t n_sel, const float *x, float *y,
                          int64_t r0, int64_t r1);

/* ------------------------------------------------------------------------
 * Selection. */

/* Most indices spx_refine_topk writes for n channels: sum over chunks of
 * min(k, chunk length). */
int64_t spx_refine_topk_max(int64_t n, int64_t chunk, int64_t k);
/* Writes the selected indices of x[n] (see the top of this file) to
 * out[spx_refine_topk_max(n, chunk, k)] and returns how many; -1 (and
 * nothing written) if chunk is outside [1, SPX_REFINE_CHUNK_MAX]. k <= 0
 * selects nothing; k >= a chunk's length selects all of its candidates.
 * skip: NULL or n flags (non-zero: never selected). */
int64_t spx_refine_topk(const float *x, int64_t n, int64_t chunk, int64_t k, const uint8_t *skip, int32_t *out);
/* skip[cols] = 1 for q's outlier columns, 0 elsewhere. */
void spx_refine_skip_outliers(const spx_qtensor *q, uint8_t *skip);

/* ------------------------------------------------------------------------
 * Application, as a kernel table chosen from CPU features. */
typedef struct spx_refine_kernels {
    const char *name; /* "scalar", "avx2" */
    /* y[r] += scale[r] * sum_j x[sel[j]] q[r, sel[j]] for r in [r0, r1)
     * over the available columns (see the top of this file for the exact
     * operations, `col` and missing columns). sel[j] in [0, cols). */
    void (*apply)(const spx_refine_q4 *R, const int32_t *sel, const uint8_t *const *col, int64_t n_sel,
                  const float *x, float *y, int64_t r0, int64_t r1);
    /* sum_c x[c] q[c] over one row of n codes packed like a column (code
     * c at byte c / 2, low nibble for even c; a neuron bundle's gate/up
     * row, bundle.h). Numbers: 8 float lanes, lane k = fmaf chain over
     * c = k, k + 8, ... from +0, then ((l0 + l1) + (l2 + l3)) + ((l4 +
     * l5) + (l6 + l7)); the avx2 entry gives the same bits. */
    float (*dot)(const uint8_t *codes, const float *x, int64_t n);
} spx_refine_kernels;

/* The scalar reference table (always available). */
const spx_refine_kernels *spx_refine_kernels_scalar(void);
/* The AVX2 + FMA table if compiled in and this CPU has the features, else NULL. */
const spx_refine_kernels *spx_refine_kernels_avx2(void);
/* The engine's SIMD choice (spx_qkernels_best: SPECTRA_KERNELS and the CPU):
 * scalar there means scalar here, else avx2 where available. */
const spx_refine_kernels *spx_refine_kernels_best(void);

#endif
