/* act.cu: SwiGLU and fp16 conversion (see act.cuh). Grid-stride loops. */
#include "cuda/act.cuh"

__global__ void silu_mul_kernel(const float *gate, const float *up, int64_t n, float *out32, __half *out16) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        float v = spx_silu_dev(g) * up[i];
        if (out32) out32[i] = v;
        if (out16) out16[i] = __float2half_rn(v);
    }
}

__global__ void to_half_kernel(const float *x, int64_t n, __half *out) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2half_rn(x[i]);
}

static unsigned grid_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

cudaError_t spx_silu_mul(const float *gate, const float *up, int64_t n, float *out32, __half *out16, cudaStream_t st) {
    if (n <= 0) return cudaSuccess;
    silu_mul_kernel<<<grid_for(n), 256, 0, st>>>(gate, up, n, out32, out16);
    return cudaGetLastError();
}

cudaError_t spx_to_half(const float *x, int64_t n, __half *out, cudaStream_t st) {
    if (n <= 0) return cudaSuccess;
    to_half_kernel<<<grid_for(n), 256, 0, st>>>(x, n, out);
    return cudaGetLastError();
}
