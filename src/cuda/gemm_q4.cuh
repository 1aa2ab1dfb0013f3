/* gemm_q4.cuh: W4A16 GEMM on tensor cores for M >= 2 tokens (prefill):
 *
 *   y[t, r] (+)= sum_c W^[r, c] x[t, c] + bias[r]      t < M, r < W.rows
 *
 * W is a Group-32 4-bit matrix as mapped from the .trdc (spx_dqmat); tiles
 * of it are dequantized to fp16 in shared memory ((q - z) * s rounded to
 * fp16) and multiplied with fp16 activations by mma.sync m16n8k16 with
 * float32 accumulation. The fp16 outlier columns run through the same
 * tensor-core loop as extra K tiles (values straight from oval, x gathered
 * by index), so the result includes them. M is a run-time argument.
 * Split-K (see spx_gemm_q4) keeps the device busy on short matrices.
 * Limits: x rows 16-byte aligned (ldx % 8 == 0), cols % 32 == 0. */
#ifndef SPX_CUDA_GEMM_Q4_CUH
#define SPX_CUDA_GEMM_Q4_CUH

#include "cuda/common.cuh"

struct spx_gemm_args {
    spx_dqmat w;
    const __half *x;    /* [M, ldx] fp16 activations */
    int64_t ldx;
    float *y;           /* [M, ldy] */
    int64_t ldy;
    const float *bias;  /* [rows] or NULL */
    int M;
    int accumulate;     /* 1: y += ..., 0: y = ... */
    float *ws;          /* split-K workspace (NULL: no split) */
    size_t ws_floats;   /* its size; splits s need s * M * rows floats */
};

/* n_sm: multiprocessors; when the output tiles alone would leave the
 * device idle, K is split over several blocks whose partial sums go to ws
 * and are added in a fixed order by a second kernel (deterministic). */
cudaError_t spx_gemm_q4(const spx_gemm_args &a, int n_sm, cudaStream_t st);

#endif
