/* gemv_q4.cuh: fused W4A16 GEMV (one token) over Group-32 4-bit matrices
 * as mapped from a .trdc (spx_dqmat), with the fp16 outlier columns added
 * in the same kernel.
 *
 *   y[r] = sum_c W^[r, c] x'[c] (+ bias[r])        x' = x, or rmsnorm(x) * gain
 *
 * One launch may cover up to SPX_GEMV_MAX_MATS matrices that read the same
 * input (merged Q/K/V: each with its own rows, outlier set, output and
 * bias), so a decode layer needs one launch per input vector. Modes:
 *   STORE   y = dot + bias
 *   ADD     y += dot + bias                (residual add: h += W x)
 *   SWIGLU  mats[0] = gate, mats[1] = up (same rows); o[0].y =
 *           silu(g + bg) * (u + bu), the CPU's spx_cpu_silu_mul
 *   ARGMAX  STORE, and the packed (value, index) maximum of y is
 *           max-reduced into *best (the caller zeroes it first)
 * Arithmetic (impl 0, the default): the input is written per group of 32
 * columns as integers X (x ~= 2^(E-14) X, 2^E > the group's max |x|: steps
 * of 2^-15 of the group's largest |x|, finer than fp16 activations for the
 * group's sum), split into two signed 8-bit digits; int8 tensor cores
 * form the exact integer sums of codes x digits per (row, group), and the
 * zero point, group scale and everything after it are float32 (the sum
 * over groups is accumulated in float32). impl 1 (the previous kernel)
 * keeps float32 activations throughout. Limits: all matrices of a launch
 * have the same cols, cols <= SPX_GEMV_MAX_COLS; rows < 2^31; x and gain
 * 16-byte aligned. Reads up to 3 bytes past the end of the scale and zero
 * arrays (whole aligned words): allocate them with a little slack. */
#ifndef SPX_CUDA_GEMV_Q4_CUH
#define SPX_CUDA_GEMV_Q4_CUH

#include "cuda/common.cuh"

#define SPX_GEMV_MAX_MATS 3
#define SPX_GEMV_MAX_COLS 32768 /* shared memory: 4.125 bytes per column + pipeline stages */

enum { SPX_GEMV_STORE = 0, SPX_GEMV_ADD = 1, SPX_GEMV_SWIGLU = 2, SPX_GEMV_ARGMAX = 3 };

struct spx_gemv_out {
    float *y;           /* [rows] (SWIGLU: o[0].y only) */
    const float *bias;  /* [rows] or NULL */
};

struct spx_gemv_args {
    spx_dqmat w[SPX_GEMV_MAX_MATS];
    spx_gemv_out o[SPX_GEMV_MAX_MATS];
    int n_mats;                 /* 1..3 (SWIGLU: 2) */
    int mode;                   /* SPX_GEMV_* */
    const float *x;             /* [cols] */
    const float *gain;          /* [cols]: fuse rmsnorm(x) * gain; NULL: x as is */
    float eps;                  /* rmsnorm epsilon */
    unsigned long long *best;   /* ARGMAX only */
    int impl;                   /* 0: the int8 tensor-core kernel (default); 1: the previous float32 one;
                                 * 2..: each tensor-core variant (benchmarks; see gemv_q4.cu) */
};

/* Tiled layout (made on the device at load from the .trdc's rows; the GEMV
 * reads it when every matrix of a launch has it). A matrix [rows, cols],
 * cols a multiple of 128, in tiles of 16 rows (zero-padded) and items of 4
 * groups (128 columns); per (tile, item), in the order the int8 MMA
 * fragments want them (lane l = 4 r + t takes rows r and r + 8, group t):
 *   codes  [1024]: 16 bytes of row r at 16 l, of row r + 8 at 512 + 16 l
 *   scales [32] u32: fp16 scale of row r (low half), of row r + 8 (high)
 *   zeros  [32] u8: zero of row r (low nibble), of row r + 8 (high)
 * so a warp's item is two coalesced 512-byte loads plus 160 bytes, with no
 * per-row addressing. For a SwiGLU pair, tile T holds gate rows 8T..8T+7
 * as rows 0..7 and the same up rows as rows 8..15. Outliers stay row-major
 * (oval). Measured on the H200: bench/gpu/NOTES.md. */
bool spx_gemv_tiled_ok(const spx_dqmat &w);                   /* cols % 128 == 0 */
size_t spx_gemv_tiled_bytes(int64_t rows, int64_t cols);       /* codes + scales + zeros, 256-aligned parts */
/* Repacks w (row-major, on the device) into dst (spx_gemv_tiled_bytes of
 * w.rows, or of 2 * up.rows for a pair) and sets w's tiled pointers;
 * up != NULL: the SwiGLU pair (gate w, up: same shape). */
cudaError_t spx_gemv_tiled_make(spx_dqmat &w, const spx_dqmat *up, uint8_t *dst, cudaStream_t st);
/* Benchmarks: run tiled launches with variant v (0: 2 blocks/SM, 1: 3),
 * -1: the default choice by width. */
void spx_gemv_q4_force_tiled_variant(int v);

/* Number of kernel variants (benchmarks compare them; 0 is the default). */
int spx_gemv_q4_impls(void);

/* Once per process and device, before the first launch (raises the
 * kernel's shared-memory limit for cols up to max_cols). Benchmarks:
 * SPECTRA_GEMV_VARIANT=i in the environment makes impl 0 run tensor-core
 * variant i (impl 2 + i). */
cudaError_t spx_gemv_q4_setup(int64_t max_cols);
/* Enqueues the GEMV on st. n_sm: multiprocessors of the device; pdl: see
 * spx_launch (the first weight chunks are fetched before the wait). */
cudaError_t spx_gemv_q4(const spx_gemv_args &a, int n_sm, cudaStream_t st, bool pdl = false);

#endif
