/* attention_decode.cu: one token over the fp16 cache (attn_decode_kernel,
 * below), the decode dispatch over either cache (spx_attn_decode; the
 * 4-bit kernel is in attention_q4.cu) and the attention settings
 * (spx_attention_setup, spx_attention_force_adapt,
 * spx_attention_decode_fast; see attention.cuh). */
#include "cuda/attention_internal.cuh"

/* ---- decode: one token over the fp16 cache -----------------------------
 * attn_decode_kernel, for n_tok == 1 and hd = 32 * ND, ND in {1, 2, 4, 8}.
 * Here latency, not bandwidth, is the cost: a few hundred keys of a few
 * KV heads are little memory traffic, while attention.cu's split kernel waits
 * through each warp's chain of dependent loads over several tiles, plus a
 * combine launch. So:
 *  - one 32-key tile per warp and pass (AD_WARPS warps: 128 keys per pass),
 *    splits sized so that one pass is the usual case (the backend's
 *    splits_for, SPX_ATTN_DECODE_KEYS), and of a launch's splits only
 *    those position p needs run (ad_active_splits);
 *  - each warp's first K and V tile is copied into shared memory
 *    (cp.async) before the PDL wait, i.e. under the previous kernel: rows
 *    before position p were written by earlier steps. Row p is never read
 *    from the cache here: with a.k_new set (rope fused) the block computes
 *    it from the raw k and v rows as rope_store does (q/k RMSNorm, RoPE,
 *    fp16 rounding) and the block of the group's first q heads stores it;
 *    without, it is copied from the cache after the wait;
 *  - q (RMSNorm and RoPE when fused) is prepared one warp per head;
 *  - scores: lane i owns key k0 + i and reads its K row from shared memory
 *    in 16-byte chunks, XOR-swizzled by row (conflict-free), q broadcast;
 *    values: lane l owns dimensions ND l .. ND l + ND - 1 (one contiguous
 *    load per key), the probabilities broadcast from shared memory;
 *  - splits meet in the last block of their head group to finish (an
 *    atomic counter per group, a.cnt, which that block resets), not in a
 *    second kernel;
 *  - the next launch (the O GEMV) is triggered after the key loop, not at
 *    the start: its blocks then fill the free SMs and fetch their weights
 *    while this block merges and stores, not while it waits and loads q
 *    (measured faster on both Llama shapes: bench/gpu/NOTES.md 43). */
static bool g_split_only = false; /* SPECTRA_CUDA_ATTN_SPLIT_KERNEL, read by spx_attention_setup */

template <int ND> struct ad_layout {
    static constexpr int HD = 32 * ND, CPR = HD / 8 /* 16-byte chunks per row */, SWM = (CPR < 8 ? CPR : 8) - 1;
    static constexpr int TILE_H = 32 * HD;                           /* halfs in one K (or V) tile */
    static constexpr int TILES = 0;                                  /* [AD_WARPS][K, V][32][HD] halfs */
    static constexpr int Q = TILES + AD_WARPS * 2 * TILE_H * 2;      /* [AT_HB][HD] floats */
    static constexpr int KP = Q + AT_HB * HD * 4;                    /* [K, V][HD] halfs: row p */
    static constexpr int PR = KP + 2 * HD * 2;                       /* [AD_WARPS][32] float4 */
    static constexpr int FLAG = PR + AD_WARPS * 32 * 16;
    static constexpr int BYTES = FLAG + 16;
    static_assert(AT_HB * (128 + 1) * 4 <= Q, "the last block's split weights (n_splits <= 128)");
    /* attn_merge's scratch (after the key loop) reuses the tiles */
    static_assert((2 * AD_WARPS * AT_HB + AD_WARPS * AT_HB * HD) * 4 <= Q, "merge scratch");
};

/* Keys [k0, min(k0 + 32, lim)) of one KV head into a warp's tiles. */
template <int ND>
__device__ __forceinline__ void ad_load_tile(__half *ks, __half *vs, const __half *kg, const __half *vg, int64_t kvd,
                                             int64_t k0, int64_t lim, int lane) {
    typedef ad_layout<ND> L;
    const int nk = (int)min((int64_t)32, lim - k0);
    for (int c = lane; c < nk * L::CPR; c += 32) {
        const int r = c / L::CPR, cc = c % L::CPR;
        const int64_t off = (k0 + r) * kvd + cc * 8;
        cp_async16(ks + r * L::HD + ((cc ^ (r & L::SWM)) << 3), kg + off);
        cp_async16(vs + r * L::HD + (cc << 3), vg + off);
    }
}

/* ND contiguous halfs (ND l ..) of a V row in shared memory, as floats. */
template <int ND> __device__ __forceinline__ void ad_load_v(const __half *src, float (&v)[ND]) {
    if constexpr (ND == 8) {
        const uint4 u = *reinterpret_cast<const uint4 *>(src);
        const __half2 *h = reinterpret_cast<const __half2 *>(&u);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 f = __half22float2(h[e]);
            v[2 * e] = f.x;
            v[2 * e + 1] = f.y;
        }
    } else if constexpr (ND == 4) {
        const uint2 u = *reinterpret_cast<const uint2 *>(src);
        const __half2 *h = reinterpret_cast<const __half2 *>(&u);
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float2 f = __half22float2(h[e]);
            v[2 * e] = f.x;
            v[2 * e + 1] = f.y;
        }
    } else if constexpr (ND == 2) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(src));
        v[0] = f.x;
        v[1] = f.y;
    } else {
        v[0] = __half2float(src[0]);
    }
}

template <int ND, bool FUSE>
__global__ void __launch_bounds__(AD_WARPS * 32) attn_decode_kernel(const __grid_constant__ spx_attn_args a) {
    typedef ad_layout<ND> L;
    constexpr int HD = L::HD;
    extern __shared__ __align__(16) unsigned char ad_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const attn_block b = attn_block_of(a);
    const int64_t p = a.pos[0]; /* written before this forward began */
    const int64_t kvd = (int64_t)a.nkv * HD;
    const int S = ad_active_splits(a);
    if (b.split >= S) return; /* block-uniform: no keys for this split at this position */
    int64_t kb, ke;
    attn_keys(a, 0, b.split, &kb, &ke, S);
    __half *ks = reinterpret_cast<__half *>(ad_sm + L::TILES) + warp * 2 * L::TILE_H, *vs = ks + L::TILE_H;
    __half *kg = a.kc + (int64_t)b.kvh * HD, *vg = a.vc + (int64_t)b.kvh * HD;
    const int64_t old_end = min(ke, p); /* rows an earlier step wrote */
    ad_load_tile<ND>(ks, vs, kg, vg, kvd, kb + warp * 32, old_end, lane);
    cp_commit();
    { /* the block's later passes (long contexts): into L2 meanwhile */
        constexpr int LPR = (HD * 2 + 127) / 128; /* 128-byte lines per row */
        const int64_t k1 = kb + AD_WARPS * 32;
        for (int64_t i = threadIdx.x; i < (old_end - k1) * 2 * LPR; i += blockDim.x) {
            const int64_t key = k1 + i / (2 * LPR);
            const int r = (int)(i % (2 * LPR));
            const __half *line = (r >= LPR ? vg : kg) + key * kvd + (r % LPR) * 64;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
        }
    }
    float rc[ND], rs[ND];
    if (FUSE) ad_rope_cs<ND>(a.inv_freq, p, rc, rs);
    spx_pdl_wait();

    float *qs = reinterpret_cast<float *>(ad_sm + L::Q);
    __half *kp = reinterpret_cast<__half *>(ad_sm + L::KP), *vp = kp + HD;
    const bool has_p = kb <= p && p < ke;
    bool qjob, pjob;
    float vq[ND], vk[ND], vv[ND];
    ad_rows<ND, FUSE>(a, b, has_p, p, rc, rs, qjob, pjob, vq, vk, vv);
    const int d0 = ND * lane;
#pragma unroll
    for (int e = 0; e < ND; e++) qs[warp * HD + d0 + e] = vq[e];
    if (pjob) {
        const bool store = FUSE && b.h0 == b.kvh * (a.nh / a.nkv); /* the group's first block stores row p */
#pragma unroll
        for (int e = 0; e < ND; e++) {
            const __half hk = __float2half_rn(vk[e]), hv = __float2half_rn(vv[e]); /* exact for copied fp16 */
            kp[d0 + e] = hk;
            vp[d0 + e] = hv;
            if (store) {
                kg[p * kvd + d0 + e] = hk;
                vg[p * kvd + d0 + e] = hv;
            }
        }
    }
    __syncthreads();

    float m[AT_HB], l[AT_HB], acc[AT_HB][ND];
    attn_state_init<ND>(m, l, acc);
    float4 *pr = reinterpret_cast<float4 *>(ad_sm + L::PR) + warp * 32;
    const float scale = a.scale > 0 ? a.scale : 1.0f / sqrtf((float)HD);
    for (int64_t k0 = kb + warp * 32; k0 < ke; k0 += AD_WARPS * 32) {
        if (k0 != kb + warp * 32) { /* a later pass: this warp's previous tile is consumed */
            __syncwarp();
            ad_load_tile<ND>(ks, vs, kg, vg, kvd, k0, old_end, lane);
            cp_commit();
        }
        cp_wait<0>();
        if (k0 <= p && p < k0 + 32) {
            const int r = (int)(p - k0);
            for (int c = lane; c < L::CPR; c += 32) {
                *reinterpret_cast<uint4 *>(ks + r * HD + ((c ^ (r & L::SWM)) << 3)) = *reinterpret_cast<const uint4 *>(kp + c * 8);
                *reinterpret_cast<uint4 *>(vs + r * HD + (c << 3)) = *reinterpret_cast<const uint4 *>(vp + c * 8);
            }
        }
        __syncwarp();
        const bool valid = k0 + lane < ke;
        float s[AT_HB];
#pragma unroll
        for (int hh = 0; hh < AT_HB; hh++) s[hh] = 0.0f;
        if (valid) {
            const __half *kr = ks + lane * HD;
#pragma unroll
            for (int c = 0; c < L::CPR; c++) {
                const uint4 u = *reinterpret_cast<const uint4 *>(kr + ((c ^ (lane & L::SWM)) << 3));
                const __half2 *h2 = reinterpret_cast<const __half2 *>(&u);
                float kf[8];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 f = __half22float2(h2[e]);
                    kf[2 * e] = f.x;
                    kf[2 * e + 1] = f.y;
                }
#pragma unroll
                for (int hh = 0; hh < AT_HB; hh++) {
                    const float4 q0 = *reinterpret_cast<const float4 *>(qs + hh * HD + c * 8);
                    const float4 q1 = *reinterpret_cast<const float4 *>(qs + hh * HD + c * 8 + 4);
                    float t = s[hh];
                    t = fmaf(q0.x, kf[0], t);
                    t = fmaf(q0.y, kf[1], t);
                    t = fmaf(q0.z, kf[2], t);
                    t = fmaf(q0.w, kf[3], t);
                    t = fmaf(q1.x, kf[4], t);
                    t = fmaf(q1.y, kf[5], t);
                    t = fmaf(q1.z, kf[6], t);
                    t = fmaf(q1.w, kf[7], t);
                    s[hh] = t;
                }
            }
        }
        float ps[AT_HB];
        attn_softmax_tile<ND>(valid, s, scale, m, l, acc, ps);
        pr[lane] = make_float4(ps[0], ps[1], ps[2], ps[3]);
        __syncwarp();
        const int nvalid = (int)min((int64_t)32, ke - k0);
#pragma unroll 4
        for (int j = 0; j < nvalid; j++) {
            const float4 pj = pr[j];
            float vv[ND];
            ad_load_v<ND>(vs + j * HD + ND * lane, vv);
#pragma unroll
            for (int dd = 0; dd < ND; dd++) {
                acc[0][dd] = fmaf(pj.x, vv[dd], acc[0][dd]);
                acc[1][dd] = fmaf(pj.y, vv[dd], acc[1][dd]);
                acc[2][dd] = fmaf(pj.z, vv[dd], acc[2][dd]);
                acc[3][dd] = fmaf(pj.w, vv[dd], acc[3][dd]);
            }
        }
    }

    spx_pdl_trigger(); /* after the keys, not at the start: see the decode kernels' comment above */
    float *out = a.out + (int64_t)b.h0 * HD;
    attn_merge<ND, true>(reinterpret_cast<float *>(ad_sm + L::TILES), m, l, acc, HD, b.nhb,
                         [&](int hh, int d, int i, float M, float Ls, float O) {
                             if (S == 1) out[i] = O / Ls;
                             else attn_part_store(a, 0, b.h0 + hh, b.split, d, M, Ls, O);
                         });
    if (S == 1) return;
    if (ad_last_block(a, reinterpret_cast<int *>(ad_sm + L::FLAG), S))
        ad_merge_splits<HD>(a, b, reinterpret_cast<float *>(ad_sm + L::TILES), S, [&](int i, float v) { out[i] = v; });
}

template <int ND, bool FUSE> static cudaError_t ad_launch(const spx_attn_args &a, cudaStream_t st, bool pdl) {
    const int G = a.nh / a.nkv, HBn = (G + AT_HB - 1) / AT_HB;
    cudaError_t err = spx_launch(attn_decode_kernel<ND, FUSE>, dim3((unsigned)(a.nkv * HBn), (unsigned)a.n_splits),
                                 dim3(AD_WARPS * 32), (size_t)ad_layout<ND>::BYTES, st, pdl, a);
    return err != cudaSuccess ? err : cudaGetLastError();
}

template <int ND> static cudaError_t ad_setup(void) {
    cudaError_t err = cudaFuncSetAttribute(attn_decode_kernel<ND, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           ad_layout<ND>::BYTES);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(attn_decode_kernel<ND, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   ad_layout<ND>::BYTES);
    return err;
}

static int g_adapt = 1, g_adapt_env = 1; /* SPECTRA_CUDA_ATTN_ADAPT, spx_attention_force_adapt */

void spx_attention_force_adapt(int on) { g_adapt = on == 0 || on == 1 ? on : g_adapt_env; }

cudaError_t spx_attention_setup(void) {
    const spx_tuning *t = spx_tuning_get();
    g_split_only = t->cuda_attn_split_kernel != 0;
    g_adapt = g_adapt_env = t->cuda_attn_adapt;
    cudaError_t err = ad_setup<1>();
    if (err == cudaSuccess) err = ad_setup<2>();
    if (err == cudaSuccess) err = ad_setup<4>();
    if (err == cudaSuccess) err = ad_setup<8>();
    if (err == cudaSuccess) err = spx_attn_decode_q4_setup(); /* attention_q4.cu */
    return err;
}

bool spx_attention_decode_fast(int hd) { return (hd == 32 || hd == 64 || hd == 128 || hd == 256) && !g_split_only; }

cudaError_t spx_attn_decode(const spx_attn_args &a_in, cudaStream_t st, bool pdl) {
    spx_attn_args a = a_in;
    a.adapt_splits = g_adapt;
    const bool f = a.k_new != nullptr;
    if (f && (!a.v_new || !a.inv_freq)) return cudaErrorInvalidValue;
    if ((a.n_splits > 1 && !a.cnt) || a.n_splits > 128) return cudaErrorInvalidValue;
    if (a.kq.codes) return spx_attn_decode_q4(a, st, pdl);
    switch (a.hd) {
    case 32: return f ? ad_launch<1, true>(a, st, pdl) : ad_launch<1, false>(a, st, pdl);
    case 64: return f ? ad_launch<2, true>(a, st, pdl) : ad_launch<2, false>(a, st, pdl);
    case 128: return f ? ad_launch<4, true>(a, st, pdl) : ad_launch<4, false>(a, st, pdl);
    default: return f ? ad_launch<8, true>(a, st, pdl) : ad_launch<8, false>(a, st, pdl);
    }
}
