/* embed.cu: embedding gather-dequantize (see embed.cuh). One block per
 * token; a thread per group (16 code bytes -> 32 floats), then the
 * outlier columns are added after a barrier. */
#include "cuda/embed.cuh"

__global__ void embed_q4_kernel(const __grid_constant__ spx_dqmat w, const int32_t *ids, float *h) {
    spx_pdl_trigger();
    spx_pdl_wait();
    const int t = blockIdx.x;
    const int64_t cols = w.cols;
    float *out = h + (int64_t)t * cols;
    const int32_t id = ids[t];
    if (id < 0 || id >= w.rows) {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = __int_as_float(0x7fc00000);
        return;
    }
    const int64_t row = id;
    for (int g = threadIdx.x; g < w.n_groups; g += blockDim.x) {
        uint4 c;
        float s;
        int z;
        spx_dq_group(w, row, g, c, s, z);
        const uint32_t wd[4] = {c.x, c.y, c.z, c.w};
        float *o = out + (int64_t)g * 32;
#pragma unroll
        for (int b = 0; b < 16; b++) {
            uint32_t byte = (wd[b >> 2] >> (8 * (b & 3))) & 0xff;
            o[b] = (float)((int)(byte & 15) - z) * s;
            o[b + 16] = (float)((int)(byte >> 4) - z) * s;
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < w.n_out; j += blockDim.x) out[w.oidx[j]] += __half2float(w.oval[row * w.n_out + j]);
}

cudaError_t spx_embed_q4(const spx_dqmat &w, const int32_t *ids, int n_tok, float *h, cudaStream_t st, bool pdl) {
    if (n_tok <= 0) return cudaSuccess;
    cudaError_t err = spx_launch(embed_q4_kernel, dim3(n_tok), dim3(128), 0, st, pdl, w, ids, h);
    return err != cudaSuccess ? err : cudaGetLastError();
}
