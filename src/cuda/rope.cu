/* rope.cu: q/k norm + RoPE + KV store (see rope.cuh). One block of 128
 * threads per (head, token); heads 0..nh-1 are q heads, nh.. k heads (the
 * latter also store their k and v rows). */
#include "cuda/rope.cuh"

__global__ void rope_store_kernel(const __grid_constant__ spx_rope_args a) {
    __shared__ double red[32];
    spx_pdl_trigger();
    spx_pdl_wait();
    const int h = blockIdx.x, t = blockIdx.y, hd = a.hd, half = hd / 2;
    const bool isq = h < a.nh;
    const int kh = h - a.nh;
    float *vec = isq ? a.q + ((int64_t)t * a.nh + h) * hd : a.k + ((int64_t)t * a.nkv + kh) * hd;
    const float *gain = isq ? a.q_norm : a.k_norm;
    const int64_t p = (int64_t)a.pos[0] + t;
    if (gain) {
        double ss = 0;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += (double)vec[i] * vec[i];
        ss = spx_block_sum_d(ss, red);
        const float inv = (float)(1.0 / sqrt(ss / (double)hd + (double)a.eps));
        for (int i = threadIdx.x; i < hd; i += blockDim.x) vec[i] = vec[i] * inv * gain[i];
        __syncthreads();
    }
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float ang = (float)p * a.inv_freq[i];
        float c = cosf(ang), s = sinf(ang);
        float x0 = vec[i], x1 = vec[i + half];
        vec[i] = x0 * c - x1 * s;
        vec[i + half] = x1 * c + x0 * s;
    }
    if (!isq) {
        __syncthreads();
        const int64_t kvd = (int64_t)a.nkv * hd;
        __half *kd = a.kc + p * kvd + (int64_t)kh * hd;
        __half *vd = a.vc + p * kvd + (int64_t)kh * hd;
        const float *vs = a.v + (int64_t)t * kvd + (int64_t)kh * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            kd[i] = __float2half_rn(vec[i]);
            vd[i] = __float2half_rn(vs[i]);
        }
    }
}

cudaError_t spx_rope_store(const spx_rope_args &a, cudaStream_t st, bool pdl) {
    if (a.n_tok <= 0) return cudaSuccess;
    if (a.hd <= 0 || a.hd % 2) return cudaErrorInvalidValue;
    cudaError_t err =
        spx_launch(rope_store_kernel, dim3((unsigned)(a.nh + a.nkv), (unsigned)a.n_tok), dim3(128), 0, st, pdl, a);
    return err != cudaSuccess ? err : cudaGetLastError();
}
