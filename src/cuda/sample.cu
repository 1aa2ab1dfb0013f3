/* sample.cu: device argmax (see sample.cuh). */
#include "cuda/sample.cuh"

__global__ void argmax_kernel(const float *x, int64_t n, unsigned long long *best) {
    __shared__ unsigned long long wb[32];
    unsigned long long b = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        unsigned long long k = spx_argmax_key(x[i], (int)i);
        b = k > b ? k : b;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long v = __shfl_xor_sync(0xffffffffu, b, o);
        b = v > b ? v : b;
    }
    if ((threadIdx.x & 31) == 0) wb[threadIdx.x >> 5] = b;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) b = wb[w] > b ? wb[w] : b;
        atomicMax(best, b);
    }
}

__global__ void argmax_finish_kernel(unsigned long long *best, int32_t *ids, int32_t *pos) {
    spx_pdl_wait();
    ids[0] = spx_argmax_key_index(*best);
    pos[0] += 1;
    *best = 0;
}

cudaError_t spx_argmax(const float *x, int64_t n, unsigned long long *best, int n_sm, cudaStream_t st) {
    if (n <= 0) return cudaErrorInvalidValue;
    int64_t blocks = (n + 255) / 256, cap = (int64_t)(n_sm > 0 ? n_sm : 1) * 2;
    if (blocks > cap) blocks = cap;
    argmax_kernel<<<(unsigned)blocks, 256, 0, st>>>(x, n, best);
    return cudaGetLastError();
}

cudaError_t spx_argmax_finish(unsigned long long *best, int32_t *ids, int32_t *pos, cudaStream_t st, bool pdl) {
    cudaError_t err = spx_launch(argmax_finish_kernel, dim3(1), dim3(1), 0, st, pdl, best, ids, pos);
    return err != cudaSuccess ? err : cudaGetLastError();
}
