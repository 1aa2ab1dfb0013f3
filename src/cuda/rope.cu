/* rope.cu: q/k norm + RoPE + KV store (see rope.cuh). One block of 128
 * threads per (head, token); heads 0..nh-1 are q heads, nh.. k heads (the
 * latter also store their k and v rows, fp16 or q4). */
#include "cuda/rope.cuh"

__global__ void rope_store_kernel(const __grid_constant__ spx_rope_args a) {
    __shared__ double red[32];
    spx_pdl_trigger();
    const int h = blockIdx.x, t = blockIdx.y, hd = a.hd, half = hd / 2;
    /* RoPE's cos and sin for pair i = threadIdx.x (half <= blockDim.x): the
     * position and inv_freq are written before the forward pass, so before
     * the wait, off the dependent chain */
    float rc = 1.0f, rs = 0.0f;
    if ((int)threadIdx.x < half) {
        const float ang = (float)((int64_t)a.pos[0] + t) * a.inv_freq[threadIdx.x];
        rc = cosf(ang);
        rs = sinf(ang);
    }
    spx_pdl_wait();
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
    if ((int)threadIdx.x < half) {
        const int i = threadIdx.x;
        const float x0 = vec[i], x1 = vec[i + half];
        vec[i] = x0 * rc - x1 * rs;
        vec[i + half] = x1 * rc + x0 * rs;
    }
    if (!isq && a.kq.codes) { /* block-uniform: the syncs inside are safe */
        __shared__ float xs[2 * SPX_KVQ4_MAX_HD]; /* this head's k then v row */
        __syncthreads();
        const int kvd = a.nkv * hd, ng = hd / SPX_KVQ4_GROUP;
        const float *vs = a.v + (int64_t)t * kvd + (int64_t)kh * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            xs[i] = vec[i];
            xs[hd + i] = vs[i];
        }
        __syncthreads();
        spx_kvq4_fwht_smem(xs, 2 * hd, a.rot);
        const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int gi = threadIdx.x >> 5; gi < 2 * ng; gi += nw) {
            const int val = gi >= ng, g = gi - val * ng;
            spx_kvq4_store_group(val ? a.vq : a.kq, p, kvd, kh * ng + g, xs[val * hd + g * SPX_KVQ4_GROUP + lane],
                                 lane);
        }
    } else if (!isq) {
        __syncthreads();
        const int64_t kvd = (int64_t)a.nkv * hd;
        const bool rg = a.ring > 0 && p >= 128; /* low-bit: the fp16 ring */
        __half *kd = (rg ? a.kr + (p % a.ring) * kvd : a.kc + p * kvd) + (int64_t)kh * hd;
        __half *vd = (rg ? a.vr + (p % a.ring) * kvd : a.vc + p * kvd) + (int64_t)kh * hd;
        const float *vs = a.v + (int64_t)t * kvd + (int64_t)kh * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            kd[i] = __float2half_rn(vec[i]);
            vd[i] = __float2half_rn(vs[i]);
        }
    }
}

cudaError_t spx_rope_store(const spx_rope_args &a, cudaStream_t st, bool pdl) {
    if (a.n_tok <= 0) return cudaSuccess;
    if (a.hd <= 0 || a.hd % 2 || a.hd > 2 * 128) return cudaErrorInvalidValue; /* a pair per thread */
    if (a.kq.codes && (!a.vq.codes || a.hd % SPX_KVQ4_GROUP || a.hd > SPX_KVQ4_MAX_HD || a.rot < 1 ||
                       (a.rot & (a.rot - 1)) || a.hd % a.rot))
        return cudaErrorInvalidValue;
    cudaError_t err =
        spx_launch(rope_store_kernel, dim3((unsigned)(a.nh + a.nkv), (unsigned)a.n_tok), dim3(128), 0, st, pdl, a);
    return err != cudaSuccess ? err : cudaGetLastError();
}
