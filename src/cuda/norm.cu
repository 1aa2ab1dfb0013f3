/* norm.cu: row-wise RMSNorm (see norm.cuh). One block of 256 threads per
 * row. */
#include "cuda/norm.cuh"

__global__ void rmsnorm_kernel(const float *x, const float *gain, float eps, int64_t n, float *out32, __half *out16) {
    __shared__ double red[32];
    const int64_t r = blockIdx.x;
    const float *xr = x + r * n;
    double ss = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        ss += (double)v * v;
    }
    ss = spx_block_sum_d(ss, red);
    const float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i] * inv * gain[i];
        if (out32) out32[r * n + i] = v;
        if (out16) out16[r * n + i] = __float2half_rn(v);
    }
}

cudaError_t spx_rmsnorm(const float *x, const float *gain, float eps, int n_rows, int64_t n, float *out32,
                        __half *out16, cudaStream_t st) {
    if (n_rows <= 0) return cudaSuccess;
    rmsnorm_kernel<<<n_rows, 256, 0, st>>>(x, gain, eps, n, out32, out16);
    return cudaGetLastError();
}
