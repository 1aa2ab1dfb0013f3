/* act.cuh: elementwise activations: SwiGLU out = silu(gate) * up (the
 * CPU's spx_cpu_silu_mul: g / (1 + exp(-g)) * u) and float32 -> fp16
 * conversion of activations for the tensor-core GEMM. The decode path
 * fuses SwiGLU into the gate/up GEMV (gemv_q4.cuh, mode SWIGLU). */
#ifndef SPX_CUDA_ACT_CUH
#define SPX_CUDA_ACT_CUH

#include "cuda/common.cuh"

/* out32 and/or out16 (either may be NULL; out32 may alias gate). */
cudaError_t spx_silu_mul(const float *gate, const float *up, int64_t n, float *out32, __half *out16, cudaStream_t st);
cudaError_t spx_to_half(const float *x, int64_t n, __half *out, cudaStream_t st);

#endif
