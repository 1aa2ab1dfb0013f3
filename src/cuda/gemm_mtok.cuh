/* gemm_mtok.cuh: the W4A16 product for a few tokens (M = 2..16: the
 * decode-sized passes, speculative verification of 1 + K drafted tokens or
 * B sessions of one row each):
 *
 *   y[t, r] (+)= sum_c W^[r, c] x[t, c] + bias[r]      t < M, r < W.rows
 *
 * the same contract and numerics as spx_gemm_q4 (gemm_q4.cuh: W^ = (q - z)
 * * s rounded once to fp16, fp16 x, float32 sums on the tensor cores), but
 * each weight is read once from DRAM straight into registers, dequantized
 * there and fed to mma.sync m16n8k16 as the A fragment (no shared-memory
 * tile, no split-K workspace), so M tokens cost little more than the
 * one-token GEMV (gemv_q4.cuh). See gemm_mtok.cu for the layout and the
 * measurements. Both layouts of spx_dqmat (tiled: the fast one; rows);
 * 4-bit only. Limits: 1 <= M <= SPX_MTOK_MAX_M, cols % 32 == 0 (tiled:
 * cols % 128 == 0, as the layout requires), ldx % 8 == 0 and x 16-byte
 * aligned. a.ws is not used. */
#ifndef SPX_CUDA_GEMM_MTOK_CUH
#define SPX_CUDA_GEMM_MTOK_CUH

#include "cuda/gemm_q4.cuh"

#define SPX_MTOK_MAX_M 16

/* Whether spx_gemm_q4_mtok takes this product (M, layout, width, bits). */
bool spx_gemm_q4_mtok_ok(const spx_gemm_args &a);
cudaError_t spx_gemm_q4_mtok(const spx_gemm_args &a, int n_sm, cudaStream_t st);
/* Benchmarks and tests: rows per warp (1: one 16-row tile, 2: two tiles
 * sharing each activation fragment), 0: the default choice. */
void spx_gemm_q4_mtok_force_rows(int r);

#endif
