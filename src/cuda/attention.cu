/* attention.cu: spx_attention and its split-K GQA kernels over the fp16
 * cache (see attention.cuh). The one-token decode path and the attention
 * settings are in attention_decode.cu, the 4-bit cache's kernels in
 * attention_q4.cu, what they share in attention_internal.cuh.
 *
 * Block = 4 warps, one (KV head, group of <= 4 q heads, split, token).
 * Warps take 32-key tiles in turn; in a tile lane i owns key k0 + i: it
 * computes its scores for every head (K row read with 16-byte loads, q
 * broadcast from shared memory), the warp updates its running max / sum,
 * then for each of the 32 keys the probability is broadcast by shuffle
 * and every lane accumulates its hd/32 output dimensions from the V row
 * (coalesced across lanes). The 4 warps merge through shared memory. */
#include "cuda/attention.cuh"
#include "cuda/attention_internal.cuh"

#include <stdlib.h>

template <int ND>
__global__ void __launch_bounds__(AT_WARPS * 32) attn_split_kernel(const __grid_constant__ spx_attn_args a) {
    extern __shared__ float at_sm[];
    spx_pdl_trigger();
    const attn_block b = attn_block_of(a); /* from the launch's shape only */
    if (a.n_tok == 1) {
        /* One token (decode): this block's K and V rows are fetched into L2
         * before the wait, under the previous kernels (qkv GEMV, RoPE): the
         * key loop then waits on L2 instead of DRAM. Only a hint (a prefetch
         * changes no result); *pos was written before this forward began.
         * Faster decode on the H200; not for prompts, whose blocks cover
         * many keys and lost a little (bench/results, 2026-11-30). */
        int64_t kb, ke;
        attn_keys(a, b.t, b.split, &kb, &ke);
        const int64_t kvd0 = (int64_t)a.nkv * a.hd;
        const int lpr = (a.hd + 63) / 64; /* 128-byte lines of a head's row */
        for (int64_t i = threadIdx.x; i < (ke - kb) * 2 * lpr; i += blockDim.x) {
            const int64_t key = kb + i / (2 * lpr);
            const int r = (int)(i % (2 * lpr));
            const __half *line = (r >= lpr ? a.vc : a.kc) + key * kvd0 + (int64_t)b.kvh * a.hd + (r % lpr) * 64;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
        }
    }
    spx_pdl_wait();
    const int kvh = b.kvh, h0 = b.h0, nhb = b.nhb, split = b.split, t = b.t;
    const int hd = a.hd, qd = a.nh * hd;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t kvd = (int64_t)a.nkv * hd;
    int64_t k_begin, k_end;
    attn_keys(a, t, split, &k_begin, &k_end);
    const float scale = a.scale > 0 ? a.scale : 1.0f / sqrtf((float)hd);

    float *qs = at_sm; /* [AT_HB][hd] */
    float m[AT_HB], l[AT_HB], acc[AT_HB][ND];
    attn_start<ND>(a, b, qs, m, l, acc);
    const __half *kbase = a.kc + (int64_t)kvh * hd, *vbase = a.vc + (int64_t)kvh * hd;
    const bool vec8 = (hd & 7) == 0;

    for (int64_t k0 = k_begin + warp * 32; k0 < k_end; k0 += AT_WARPS * 32) {
        const int64_t key = k0 + lane;
        const bool valid = key < k_end;
        float s[AT_HB];
#pragma unroll
        for (int hh = 0; hh < AT_HB; hh++) s[hh] = 0.0f;
        if (valid) {
            const __half *kr = kbase + key * kvd;
            if (vec8) {
                for (int d = 0; d < hd; d += 8) {
                    uint4 u = *reinterpret_cast<const uint4 *>(kr + d);
                    const __half2 *h2 = reinterpret_cast<const __half2 *>(&u);
                    float kf[8];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float2 f = __half22float2(h2[e]);
                        kf[2 * e] = f.x;
                        kf[2 * e + 1] = f.y;
                    }
#pragma unroll
                    for (int hh = 0; hh < AT_HB; hh++) {
                        const float *qq = qs + hh * hd + d;
#pragma unroll
                        for (int e = 0; e < 8; e++) s[hh] = fmaf(qq[e], kf[e], s[hh]);
                    }
                }
            } else {
                for (int d = 0; d < hd; d++) {
                    float kv = __half2float(kr[d]);
#pragma unroll
                    for (int hh = 0; hh < AT_HB; hh++) s[hh] = fmaf(qs[hh * hd + d], kv, s[hh]);
                }
            }
        }
        float ps[AT_HB];
        attn_softmax_tile<ND>(valid, s, scale, m, l, acc, ps);
        const int nvalid = (int)min((int64_t)32, k_end - k0);
        for (int j = 0; j < nvalid; j++) {
            const __half *vr = vbase + (k0 + j) * kvd;
            float vv[ND];
#pragma unroll
            for (int dd = 0; dd < ND; dd++) {
                int d = lane + 32 * dd;
                vv[dd] = d < hd ? __half2float(vr[d]) : 0.0f;
            }
#pragma unroll
            for (int hh = 0; hh < AT_HB; hh++) {
                float pj = __shfl_sync(0xffffffffu, ps[hh], j);
#pragma unroll
                for (int dd = 0; dd < ND; dd++) acc[hh][dd] = fmaf(pj, vv[dd], acc[hh][dd]);
            }
        }
    }

    attn_merge<ND>(at_sm, m, l, acc, hd, nhb, [&](int hh, int d, int i, float M, float L, float O) {
        if (gridDim.y == 1) a.out[(int64_t)t * qd + (int64_t)(h0 + hh) * hd + d] = O / L;
        else attn_part_store(a, t, h0 + hh, split, d, M, L, O);
    });
}

__global__ void attn_combine_kernel(const __grid_constant__ spx_attn_args a) {
    spx_pdl_trigger();
    spx_pdl_wait();
    const int h = blockIdx.x, t = blockIdx.y, hd = a.hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) a.out[(int64_t)t * a.nh * hd + (int64_t)h * hd + d] = attn_combine_d(a, t, h, d);
}

int spx_attention_blocks_per_split(int n_tok, int nh, int nkv) {
    int G = nkv > 0 ? nh / nkv : 1;
    return n_tok * nkv * ((G + AT_HB - 1) / AT_HB);
}

cudaError_t spx_attention(const spx_attn_args &a, cudaStream_t st, bool pdl) {
    if (a.n_tok <= 0) return cudaSuccess;
    if (a.hd <= 0 || a.hd > SPX_ATTN_MAX_HD || a.nkv <= 0 || a.nh % a.nkv || a.n_splits < 1)
        return cudaErrorInvalidValue;
    const bool fast = a.n_tok == 1 && spx_attention_decode_fast(a.hd);
    if (a.k_new && !fast) return cudaErrorInvalidValue; /* rope is fused only there */
    if (fast) return spx_attn_decode(a, st, pdl);
    if (a.kq.codes) return spx_attn_q4(a, st, pdl);
    const int G = a.nh / a.nkv, HBn = (G + AT_HB - 1) / AT_HB;
    int q_f = AT_HB * a.hd, m_f = 2 * AT_WARPS * AT_HB + AT_WARPS * AT_HB * a.hd;
    size_t smem = (size_t)(q_f > m_f ? q_f : m_f) * sizeof(float);
    dim3 grid((unsigned)(a.nkv * HBn), (unsigned)a.n_splits, (unsigned)a.n_tok);
    int nd = (a.hd + 31) / 32;
    void (*kern)(const spx_attn_args) = nd <= 1 ? attn_split_kernel<1>
                                       : nd <= 2 ? attn_split_kernel<2>
                                       : nd <= 4 ? attn_split_kernel<4>
                                                 : attn_split_kernel<8>;
    cudaError_t err = spx_launch(kern, grid, dim3(AT_WARPS * 32), smem, st, pdl, a);
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess || a.n_splits == 1) return err;
    err = spx_launch(attn_combine_kernel, dim3((unsigned)a.nh, (unsigned)a.n_tok), dim3(128), 0, st, pdl, a);
    return err != cudaSuccess ? err : cudaGetLastError();
}
