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
 *           silu(g + bg) * (u + bu), the CPU's spx_cpu_silu_mul (rows
 *           layout only; for tiled matrices store silu(gate) (o[0].silu)
 *           and up with one two-matrix launch and give the next GEMV
 *           x = silu(gate), x2 = up; or set pair: the product, stored by
 *           the launch)
 *   ARGMAX  STORE, and the packed (value, index) maximum of y is
 *           max-reduced into *best (the caller zeroes it first)
 * Arithmetic: the input is written per group of 32
 * columns as integers X (x ~= 2^(E-14) X, 2^E > the group's max |x|: steps
 * of 2^-15 of the group's largest |x|, finer than fp16 activations for the
 * group's sum), split into two signed 8-bit digits; int8 tensor cores
 * form the exact integer sums of codes x digits per (row, group), and the
 * zero point, group scale and everything after it are float32 (the sum
 * over groups is accumulated in float32). Layouts: a launch's matrices
 * are all row-major or all tiled (SPX_Q_TILED, qtensor.h: its own kernel,
 * the fast one; the backend tiles every matrix the layout holds and keeps
 * row-major only those whose cols are not a multiple of 128). Limits: all matrices of a launch
 * have the same cols, cols <= SPX_GEMV_MAX_COLS; rows < 2^31; x and gain
 * 16-byte aligned. Reads up to 3 bytes past the end of the scale and zero
 * arrays (whole aligned words): allocate them with a little slack. */
#ifndef SPX_CUDA_GEMV_Q4_CUH
#define SPX_CUDA_GEMV_Q4_CUH

#include "cuda/common.cuh"

#define SPX_GEMV_MAX_MATS 3
#define SPX_GEMV_MAX_COLS 32768 /* shared memory: the input image, 2.25 bytes per column, and outlier inputs */

enum { SPX_GEMV_STORE = 0, SPX_GEMV_ADD = 1, SPX_GEMV_SWIGLU = 2, SPX_GEMV_ARGMAX = 3 };

struct spx_gemv_out {
    float *y;           /* [rows] (SWIGLU: o[0].y only) */
    const float *bias;  /* [rows] or NULL */
    int silu;           /* STORE: y = silu(dot + bias) (the gate of a tiled gate/up launch) */
};

struct spx_gemv_args {
    spx_dqmat w[SPX_GEMV_MAX_MATS];
    spx_gemv_out o[SPX_GEMV_MAX_MATS];
    int n_mats;                 /* 1..3 (SWIGLU: 2) */
    int mode;                   /* SPX_GEMV_* */
    const float *x;             /* [cols] */
    const float *gain;          /* [cols]: fuse rmsnorm(x) * gain; NULL: x as is */
    const float *x2;            /* [cols] or NULL: the input is x * x2 (x = silu(gate) stored by a tiled
                                 * gate/up launch, x2 = up: the CPU's silu_mul; not with gain;
                                 * 16-byte aligned) */
    float eps;                  /* rmsnorm epsilon */
    unsigned long long *best;   /* ARGMAX only */
    int groups;                 /* tiled: blocks of two 8-warp groups, one per SM, sharing one input
                                 * image (the backend sets it for every decode launch of a model whose
                                 * launches all have >= 1.9 tiles per SM; mixed with the default form in one
                                 * step it loses: bench/gpu/NOTES.md 28) */
    int pair;                   /* tiled gate/up (2 matrices, same rows, STORE, no o[].silu): o[0].y =
                                 * silu(gate + bg) * (up + bu), the CPU's spx_cpu_silu_mul; o[1].y unused.
                                 * Runs in the two-group form (group 0 gate tiles, group 1 the same tiles
                                 * of up), whatever groups says; the next GEMV's input is then one vector */
};

/* Benchmarks and tests: run tiled launches in form v (0: 2 blocks/SM,
 * 1: 3, 2: one block of two warp groups sharing the input image), -1: the
 * default choice (SPECTRA_GEMV_TILED_VARIANT=v at setup does the same). */
void spx_gemv_q4_force_tiled_variant(int v);
/* Tests: on = 0 has the register-fed tiled kernels (2 blocks or 1 of two
 * groups per SM) load their outlier indices after the PDL wait, 1 before
 * it (the default; SPECTRA_GEMV_EARLY_OIDX=0 at setup turns it off), -1
 * back to the setup's choice. The two give the same bits. */
void spx_gemv_q4_force_early_oidx(int on);
/* Tests: the register-fed tiled kernel's preferred shared-memory carveout
 * (percent; set at its first launch, common.cuh spx_apply_carveout). */
int spx_gemv_q4_carveout(void);
/* Whether the kernels take a launch of this width with n_out_total outlier
 * columns over all its matrices (shared memory; the backend checks every
 * launch at load). */
bool spx_gemv_q4_fits(int64_t cols, int64_t n_out_total);

/* Once per process and device, before the first launch (raises the
 * kernels' shared-memory limit for cols up to max_cols; reads the GEMV
 * fields of engine/tuning.h's record). */
cudaError_t spx_gemv_q4_setup(int64_t max_cols);
/* Enqueues the GEMV on st. n_sm: multiprocessors of the device; pdl: see
 * spx_launch (the first weight chunks are fetched before the wait). */
cudaError_t spx_gemv_q4(const spx_gemv_args &a, int n_sm, cudaStream_t st, bool pdl = false);

#endif
