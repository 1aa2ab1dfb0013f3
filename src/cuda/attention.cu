/* attention.cu: split-K GQA attention over the fp16 or 4-bit cache (see
 * attention.cuh).
 *
 * Block = 4 warps, one (KV head, group of <= 4 q heads, split, token).
 * Warps take 32-key tiles in turn; in a tile lane i owns key k0 + i: it
 * computes its scores for every head (K row read with 16-byte loads, q
 * broadcast from shared memory), the warp updates its running max / sum,
 * then for each of the 32 keys the probability is broadcast by shuffle
 * and every lane accumulates its hd/32 output dimensions from the V row
 * (coalesced across lanes). The 4 warps merge through shared memory. */
#include "cuda/attention.cuh"

#define AT_WARPS 4
#define AT_HB 4 /* q heads per block */

/* ---- what the fp16 and the 4-bit kernels share ---------------------------- */

/* Keys [*k_begin, *k_end) of this split for token t (causal, sliding window). */
__device__ __forceinline__ void attn_keys(const spx_attn_args &a, int t, int split, int64_t *k_begin, int64_t *k_end) {
    const int64_t p = (int64_t)a.pos[0] + t;
    int64_t start = 0;
    if (a.window > 0 && p - a.window + 1 > 0) start = p - a.window + 1;
    const int64_t end = p + 1, len = end - start;
    const int64_t ntiles = (len + 31) / 32;
    const int64_t per = (ntiles + a.n_splits - 1) / a.n_splits; /* tiles per split */
    *k_begin = start + (int64_t)split * per * 32;
    *k_end = min(end, *k_begin + per * 32);
}

/* One 32-key tile of the online softmax: lane i's scores s (valid: its key
 * exists) update the warp's running max m and sum l, rescale acc, and leave
 * lane i's probabilities in ps. */
template <int ND>
__device__ __forceinline__ void attn_softmax_tile(bool valid, const float (&s)[AT_HB], float scale, float (&m)[AT_HB],
                                                  float (&l)[AT_HB], float (&acc)[AT_HB][ND], float (&ps)[AT_HB]) {
#pragma unroll
    for (int hh = 0; hh < AT_HB; hh++) {
        float sc = valid ? s[hh] * scale : -INFINITY;
        float mn = fmaxf(m[hh], spx_warp_max(sc)); /* finite: lane 0's key is valid */
        float corr = expf(m[hh] - mn);
        float pr = valid ? expf(sc - mn) : 0.0f;
        l[hh] = l[hh] * corr + spx_warp_sum(pr);
        m[hh] = mn;
#pragma unroll
        for (int dd = 0; dd < ND; dd++) acc[hh][dd] *= corr;
        ps[hh] = pr;
    }
}

/* After the key loop: the warps' (m, l, acc) meet in shared memory sm
 * (2 * AT_WARPS * AT_HB + AT_WARPS * AT_HB * hd floats), then for every
 * (head hh < nhb, dimension d), i = hh * hd + d, emit(hh, d, i, M, L, O)
 * gets the block's max, sum and output sum. Starts with a barrier (the
 * caller's q in shared memory may be overwritten). */
template <int ND, typename F>
__device__ __forceinline__ void attn_merge(float *sm, const float (&m)[AT_HB], const float (&l)[AT_HB],
                                           const float (&acc)[AT_HB][ND], int hd, int nhb, F emit) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    float *wm = sm, *wl = wm + AT_WARPS * AT_HB, *wacc = wl + AT_WARPS * AT_HB;
    if (lane == 0)
#pragma unroll
        for (int hh = 0; hh < AT_HB; hh++) {
            wm[warp * AT_HB + hh] = m[hh];
            wl[warp * AT_HB + hh] = l[hh];
        }
#pragma unroll
    for (int hh = 0; hh < AT_HB; hh++)
#pragma unroll
        for (int dd = 0; dd < ND; dd++) {
            int d = lane + 32 * dd;
            if (d < hd) wacc[(warp * AT_HB + hh) * hd + d] = acc[hh][dd];
        }
    __syncthreads();
    for (int i = threadIdx.x; i < nhb * hd; i += blockDim.x) {
        int hh = i / hd, d = i - hh * hd;
        float M = -INFINITY;
        for (int w = 0; w < AT_WARPS; w++) M = fmaxf(M, wm[w * AT_HB + hh]);
        float L = 0.0f, O = 0.0f;
        for (int w = 0; w < AT_WARPS; w++) {
            float mw = wm[w * AT_HB + hh];
            if (mw != -INFINITY) {
                float f = expf(mw - M);
                L += wl[w * AT_HB + hh] * f;
                O += wacc[(w * AT_HB + hh) * hd + d] * f;
            }
        }
        emit(hh, d, i, M, L, O);
    }
}

/* A split's partial result for (token t, head h, dimension d). */
__device__ __forceinline__ void attn_part_store(const spx_attn_args &a, int t, int h, int split, int d, float M, float L,
                                                float O) {
    float *pp = a.part + (((int64_t)t * a.nh + h) * a.n_splits + split) * (a.hd + 2);
    if (d == 0) {
        pp[0] = M;
        pp[1] = L;
    }
    pp[2 + d] = O;
}

/* The splits of (token t, head h) combined: dimension d of the output. */
__device__ __forceinline__ float attn_combine_d(const spx_attn_args &a, int t, int h, int d) {
    const int hd = a.hd, S = a.n_splits;
    const float *pp = a.part + ((int64_t)t * a.nh + h) * S * (hd + 2);
    float M = -INFINITY;
#pragma unroll 4
    for (int s = 0; s < S; s++) M = fmaxf(M, pp[s * (hd + 2)]);
    float L = 0.0f, O = 0.0f;
#pragma unroll 4
    for (int s = 0; s < S; s++) {
        float ms = pp[s * (hd + 2)];
        if (ms != -INFINITY) {
            float f = expf(ms - M);
            L += pp[s * (hd + 2) + 1] * f;
            O += pp[s * (hd + 2) + 2 + d] * f;
        }
    }
    return O / L;
}

/* The block's share of the work: KV head kvh, its q heads h0 .. h0 + nhb
 * (at most AT_HB of the group), the split and the token. */
struct attn_block {
    int kvh, h0, nhb, split, t;
};
__device__ __forceinline__ attn_block attn_block_of(const spx_attn_args &a) {
    const int G = a.nh / a.nkv, HBn = (G + AT_HB - 1) / AT_HB;
    const int hb = blockIdx.x % HBn;
    attn_block b;
    b.kvh = blockIdx.x / HBn;
    b.h0 = b.kvh * G + hb * AT_HB;
    b.nhb = min(AT_HB, G - hb * AT_HB);
    b.split = blockIdx.y;
    b.t = blockIdx.z;
    return b;
}

/* The block's q rows into qs [AT_HB][hd] (zero past nhb), then a barrier;
 * and the running max, sum and output of every head cleared. */
template <int ND>
__device__ __forceinline__ void attn_start(const spx_attn_args &a, const attn_block &b, float *qs, float (&m)[AT_HB],
                                           float (&l)[AT_HB], float (&acc)[AT_HB][ND]) {
    const int hd = a.hd, qd = a.nh * hd;
    for (int i = threadIdx.x; i < AT_HB * hd; i += blockDim.x) {
        int hh = i / hd, d = i - hh * hd;
        qs[i] = hh < b.nhb ? a.q[(int64_t)b.t * qd + (int64_t)(b.h0 + hh) * hd + d] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < AT_HB; hh++) {
        m[hh] = -INFINITY;
        l[hh] = 0.0f;
#pragma unroll
        for (int dd = 0; dd < ND; dd++) acc[hh][dd] = 0.0f;
    }
}

template <int ND>
__global__ void __launch_bounds__(AT_WARPS * 32) attn_split_kernel(const __grid_constant__ spx_attn_args a) {
    extern __shared__ float at_sm[];
    spx_pdl_trigger();
    if (a.n_tok == 1) {
        /* One token (decode): this block's K and V rows are fetched into L2
         * before the wait, under the previous kernels (qkv GEMV, RoPE): the
         * key loop then waits on L2 instead of DRAM. Only a hint (a prefetch
         * changes no result); *pos was written before this forward began.
         * 8B tg128 on the H200: 435 vs 403 tok/s; not for prompts (their
         * blocks cover many keys: pp512 -1 %). */
        const attn_block b0 = attn_block_of(a);
        int64_t kb, ke;
        attn_keys(a, b0.t, b0.split, &kb, &ke);
        const int64_t kvd0 = (int64_t)a.nkv * a.hd;
        const int lpr = (a.hd + 63) / 64; /* 128-byte lines of a head's row */
        for (int64_t i = threadIdx.x; i < (ke - kb) * 2 * lpr; i += blockDim.x) {
            const int64_t key = kb + i / (2 * lpr);
            const int r = (int)(i % (2 * lpr));
            const __half *line = (r >= lpr ? a.vc : a.kc) + key * kvd0 + (int64_t)b0.kvh * a.hd + (r % lpr) * 64;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
        }
    }
    spx_pdl_wait();
    const attn_block b = attn_block_of(a);
    const int kvh = b.kvh, h0 = b.h0, nhb = b.nhb, split = b.split, t = b.t;
    const int hd = a.hd, qd = a.nh * hd;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t kvd = (int64_t)a.nkv * hd;
    int64_t k_begin, k_end;
    attn_keys(a, t, split, &k_begin, &k_end);
    const float scale = 1.0f / sqrtf((float)hd);

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

/* ---- --kv q4 (kvq4.cuh) ------------------------------------------------
 * The same blocks, warps, tiles and merges as attn_split_kernel. Scores:
 * lane i owns key k0 + i and reads its K row's code groups (16-byte loads,
 * 32 codes), its fp16 scale and zero nibble, and per group adds
 * s * (sum_k c_k q~_k - z qsum), q~ the rotated q and qsum its per-group
 * sums (both in shared memory, computed once per block). Values: lane i
 * also loads its key's V scales and zeros; for each key j of the tile they
 * are broadcast by shuffle, and lane l dequantizes dimension l + 32 dd
 * (byte l % 16, nibble l / 16 of group dd). The merged output is rotated
 * back in shared memory (no split) or by the combine kernel. */
template <int ND>
__global__ void __launch_bounds__(AT_WARPS * 32) attn_split_q4_kernel(const __grid_constant__ spx_attn_args a) {
    extern __shared__ float at_sm[];
    spx_pdl_trigger();
    spx_pdl_wait();
    const attn_block b = attn_block_of(a);
    const int kvh = b.kvh, h0 = b.h0, nhb = b.nhb, split = b.split, t = b.t;
    const int hd = a.hd, qd = a.nh * hd, ng = hd / SPX_KVQ4_GROUP;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvd = a.nkv * hd;
    const int64_t crow = kvd / 2, srow = kvd / SPX_KVQ4_GROUP, zrow = (srow + 1) / 2;
    const int G0 = kvh * ng; /* this head's first group in a row */
    int64_t k_begin, k_end;
    attn_keys(a, t, split, &k_begin, &k_end);
    const float scale = 1.0f / sqrtf((float)hd);

    float *qs = at_sm;               /* [AT_HB][hd], rotated */
    float *qsum = qs + AT_HB * hd;   /* [AT_HB][ng] */
    float m[AT_HB], l[AT_HB], acc[AT_HB][ND];
    attn_start<ND>(a, b, qs, m, l, acc);
    spx_kvq4_fwht_smem(qs, AT_HB * hd, a.rot);
    for (int i = threadIdx.x; i < AT_HB * ng; i += blockDim.x) {
        const float *qq = qs + (i / ng) * hd + (i % ng) * SPX_KVQ4_GROUP;
        float s = 0.0f;
        for (int k = 0; k < SPX_KVQ4_GROUP; k++) s = SPX_KQ_ADD(s, qq[k]); /* the CPU's order */
        qsum[i] = s;
    }
    __syncthreads();
    const uint8_t *kcodes = a.kq.codes + (int64_t)kvh * (hd / 2), *vcodes = a.vq.codes + (int64_t)kvh * (hd / 2);
    const __half *kscales = a.kq.scales + G0, *vscales = a.vq.scales + G0;
    const uint8_t *kzeros = a.kq.zeros, *vzeros = a.vq.zeros;

    for (int64_t k0 = k_begin + warp * 32; k0 < k_end; k0 += AT_WARPS * 32) {
        const int64_t key = k0 + lane;
        const bool valid = key < k_end;
        float s[AT_HB], vsc[ND], vz[ND];
#pragma unroll
        for (int hh = 0; hh < AT_HB; hh++) s[hh] = 0.0f;
#pragma unroll
        for (int dd = 0; dd < ND; dd++) vsc[dd] = vz[dd] = 0.0f;
        if (valid) {
            const uint8_t *kr = kcodes + key * crow;
#pragma unroll
            for (int g = 0; g < ND; g++) {
                if (g < ng) {
                    const uint4 u = *reinterpret_cast<const uint4 *>(kr + g * 16);
                    const float sc = __half2float(kscales[key * srow + g]);
                    const int Gz = G0 + g;
                    const float z = (float)((kzeros[key * zrow + (Gz >> 1)] >> ((Gz & 1) * 4)) & 15);
                    const unsigned wd[4] = {u.x, u.y, u.z, u.w};
                    float c[32];
#pragma unroll
                    for (int b = 0; b < 16; b++) {
                        const unsigned byte = (wd[b >> 2] >> ((b & 3) * 8)) & 0xffu;
                        c[b] = spx_kvq4_nib(byte & 15u);
                        c[b + 16] = spx_kvq4_nib(byte >> 4);
                    }
#pragma unroll
                    for (int hh = 0; hh < AT_HB; hh++) {
                        const float *qq = qs + hh * hd + g * SPX_KVQ4_GROUP;
                        float dot = 0.0f;
#pragma unroll
                        for (int k = 0; k < 32; k++) dot = fmaf(c[k], qq[k], dot);
                        s[hh] = fmaf(sc, dot - z * qsum[hh * ng + g], s[hh]);
                    }
                }
            }
#pragma unroll
            for (int dd = 0; dd < ND; dd++) {
                if (dd < ng) {
                    const int Gz = G0 + dd;
                    vsc[dd] = __half2float(vscales[key * srow + dd]);
                    vz[dd] = (float)((vzeros[key * zrow + (Gz >> 1)] >> ((Gz & 1) * 4)) & 15);
                }
            }
        }
        float ps[AT_HB];
        attn_softmax_tile<ND>(valid, s, scale, m, l, acc, ps);
        const int nvalid = (int)min((int64_t)32, k_end - k0);
        const int nsh = (lane >> 4) * 4;
        for (int j = 0; j < nvalid; j++) {
            const uint8_t *vr = vcodes + (k0 + j) * crow + (lane & 15);
            float vv[ND];
#pragma unroll
            for (int dd = 0; dd < ND; dd++) {
                const float sj = __shfl_sync(0xffffffffu, vsc[dd], j), zj = __shfl_sync(0xffffffffu, vz[dd], j);
                vv[dd] = dd < ng ? sj * (spx_kvq4_nib(((unsigned)vr[dd * 16] >> nsh) & 15u) - zj) : 0.0f;
            }
#pragma unroll
            for (int hh = 0; hh < AT_HB; hh++) {
                float pj = __shfl_sync(0xffffffffu, ps[hh], j);
#pragma unroll
                for (int dd = 0; dd < ND; dd++) acc[hh][dd] = fmaf(pj, vv[dd], acc[hh][dd]);
            }
        }
    }

    float *ob = at_sm + 2 * AT_WARPS * AT_HB + AT_WARPS * AT_HB * hd; /* [nhb][hd]: the merged output, rotated */
    attn_merge<ND>(at_sm, m, l, acc, hd, nhb, [&](int hh, int d, int i, float M, float L, float O) {
        if (gridDim.y == 1) ob[i] = O / L;
        else attn_part_store(a, t, h0 + hh, split, d, M, L, O);
    });
    if (gridDim.y == 1) { /* block-uniform */
        __syncthreads();
        spx_kvq4_fwht_smem(ob, nhb * hd, a.rot);
        for (int i = threadIdx.x; i < nhb * hd; i += blockDim.x) {
            int hh = i / hd, d = i - hh * hd;
            a.out[(int64_t)t * qd + (int64_t)(h0 + hh) * hd + d] = ob[i];
        }
    }
}

/* The combine of attn_combine_kernel, then the rotation back. */
__global__ void attn_combine_q4_kernel(const __grid_constant__ spx_attn_args a) {
    __shared__ float ob[SPX_ATTN_MAX_HD];
    spx_pdl_trigger();
    spx_pdl_wait();
    const int h = blockIdx.x, t = blockIdx.y, hd = a.hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) ob[d] = attn_combine_d(a, t, h, d);
    __syncthreads();
    spx_kvq4_fwht_smem(ob, hd, a.rot);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) a.out[(int64_t)t * a.nh * hd + (int64_t)h * hd + d] = ob[d];
}

static cudaError_t attention_q4(const spx_attn_args &a, cudaStream_t st, bool pdl) {
    if (!a.vq.codes || a.hd % SPX_KVQ4_GROUP || a.rot < 1 || (a.rot & (a.rot - 1)) || a.hd % a.rot)
        return cudaErrorInvalidValue;
    const int G = a.nh / a.nkv, HBn = (G + AT_HB - 1) / AT_HB, ng = a.hd / SPX_KVQ4_GROUP;
    int q_f = AT_HB * a.hd + AT_HB * ng, m_f = 2 * AT_WARPS * AT_HB + AT_WARPS * AT_HB * a.hd + AT_HB * a.hd;
    size_t smem = (size_t)(q_f > m_f ? q_f : m_f) * sizeof(float);
    dim3 grid((unsigned)(a.nkv * HBn), (unsigned)a.n_splits, (unsigned)a.n_tok);
    void (*kern)(const spx_attn_args) = ng <= 1 ? attn_split_q4_kernel<1>
                                       : ng <= 2 ? attn_split_q4_kernel<2>
                                       : ng <= 4 ? attn_split_q4_kernel<4>
                                                 : attn_split_q4_kernel<8>;
    cudaError_t err = spx_launch(kern, grid, dim3(AT_WARPS * 32), smem, st, pdl, a);
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess || a.n_splits == 1) return err;
    err = spx_launch(attn_combine_q4_kernel, dim3((unsigned)a.nh, (unsigned)a.n_tok), dim3(128), 0, st, pdl, a);
    return err != cudaSuccess ? err : cudaGetLastError();
}

int spx_attention_blocks_per_split(int n_tok, int nh, int nkv) {
    int G = nkv > 0 ? nh / nkv : 1;
    return n_tok * nkv * ((G + AT_HB - 1) / AT_HB);
}

cudaError_t spx_attention(const spx_attn_args &a, cudaStream_t st, bool pdl) {
    if (a.n_tok <= 0) return cudaSuccess;
    if (a.hd <= 0 || a.hd > SPX_ATTN_MAX_HD || a.nkv <= 0 || a.nh % a.nkv || a.n_splits < 1)
        return cudaErrorInvalidValue;
    if (a.kq.codes) return attention_q4(a, st, pdl);
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
