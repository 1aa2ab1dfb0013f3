/* norm.cuh: RMSNorm over rows, out = x / sqrt(mean(x^2) + eps) * gain,
 * as the CPU's spx_cpu_rmsnorm (sum of squares in double), writing float32
 * and/or fp16 (the tensor-core GEMM's input). The decode path fuses its
 * norms into the GEMV prologue instead (gemv_q4.cuh). */
#ifndef SPX_CUDA_NORM_CUH
#define SPX_CUDA_NORM_CUH

#include "cuda/common.cuh"

/* x[n_rows, n] -> out32 and/or out16 (either may be NULL), rows dense. */
cudaError_t spx_rmsnorm(const float *x, const float *gain, float eps, int n_rows, int64_t n, float *out32,
                        __half *out16, cudaStream_t st);

#endif
