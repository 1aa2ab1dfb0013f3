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

#include <stdlib.h>

#define AT_WARPS 4
#define AT_HB 4 /* q heads per block */

/* ---- what the fp16 and the 4-bit kernels share ---------------------------- */

/* The keys token t attends to, [*start, *end) (causal, sliding window). */
__device__ __forceinline__ void attn_span(const spx_attn_args &a, int t, int64_t *start, int64_t *end) {
    const int64_t p = (int64_t)a.pos[0] + t;
    int64_t s = 0;
    if (a.window > 0 && p - a.window + 1 > 0) s = p - a.window + 1;
    *start = s;
    *end = p + 1;
}

/* Keys [*k_begin, *k_end) of this split for token t. */
__device__ __forceinline__ void attn_keys(const spx_attn_args &a, int t, int split, int64_t *k_begin, int64_t *k_end,
                                          int n_splits = 0 /* 0: a.n_splits */) {
    int64_t start, end;
    attn_span(a, t, &start, &end);
    const int64_t len = end - start;
    const int64_t ntiles = (len + 31) / 32;
    const int S = n_splits > 0 ? n_splits : a.n_splits;
    const int64_t per = (ntiles + S - 1) / S; /* tiles per split */
    *k_begin = start + (int64_t)split * per * 32;
    *k_end = min(end, *k_begin + per * 32);
}

/* The online softmax's empty state: no maximum yet, nothing summed. */
template <int ND>
__device__ __forceinline__ void attn_state_init(float (&m)[AT_HB], float (&l)[AT_HB], float (&acc)[AT_HB][ND]) {
#pragma unroll
    for (int hh = 0; hh < AT_HB; hh++) {
        m[hh] = -INFINITY;
        l[hh] = 0.0f;
#pragma unroll
        for (int dd = 0; dd < ND; dd++) acc[hh][dd] = 0.0f;
    }
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
template <int ND, bool CONTIG = false, typename F>
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
            int d = CONTIG ? ND * lane + dd : lane + 32 * dd; /* CONTIG: lane l owns ND * l .. ND * l + ND - 1 */
            if (d < hd) wacc[(warp * AT_HB + hh) * hd + d] = acc[hh][dd];
        }
    __syncthreads();
    /* Each head's weights once (thread hh of the first AT_HB, in its own
     * column of wm and wl): wm[w][hh] becomes warp w's factor exp(m_w - M),
     * or -1 for a warp that saw no key (skipped); wl[0][hh] the sum L and
     * wl[1][hh] the maximum M. The same operations in the same order as
     * when every output computed them itself (so the same values), but 4
     * expf per head instead of per output, which measured faster
     * (bench/gpu/NOTES.md 46). */
    static_assert(AT_WARPS >= 2, "L and M go in wl's first two rows");
    if (threadIdx.x < AT_HB) {
        const int hh = threadIdx.x;
        float mw[AT_WARPS], lw[AT_WARPS];
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < AT_WARPS; w++) {
            mw[w] = wm[w * AT_HB + hh];
            lw[w] = wl[w * AT_HB + hh];
            M = fmaxf(M, mw[w]);
        }
        float L = 0.0f;
#pragma unroll
        for (int w = 0; w < AT_WARPS; w++) {
            float f = -1.0f;
            if (mw[w] != -INFINITY) {
                f = expf(mw[w] - M);
                L += lw[w] * f;
            }
            wm[w * AT_HB + hh] = f;
        }
        wl[hh] = L;
        wl[AT_HB + hh] = M;
    }
    __syncthreads();
#pragma unroll 4
    for (int i = threadIdx.x; i < nhb * hd; i += blockDim.x) {
        const int hh = i / hd, d = i - hh * hd;
        float O = 0.0f;
#pragma unroll
        for (int w = 0; w < AT_WARPS; w++) {
            const float f = wm[w * AT_HB + hh];
            if (!(f < 0.0f)) O += wacc[(w * AT_HB + hh) * hd + d] * f; /* NaN too, as before */
        }
        emit(hh, d, i, wl[AT_HB + hh], wl[hh], O);
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

/* The splits of (token t, head h) combined: dimension d of the output.
 * Loads through L2 (__ldcg): the decode kernel's last block reads what
 * other blocks of its own grid wrote. */
__device__ __forceinline__ float attn_combine_d(const spx_attn_args &a, int t, int h, int d) {
    const int hd = a.hd, S = a.n_splits;
    const float *pp = a.part + ((int64_t)t * a.nh + h) * S * (hd + 2);
    float M = -INFINITY;
#pragma unroll 4
    for (int s = 0; s < S; s++) M = fmaxf(M, __ldcg(pp + s * (hd + 2)));
    float L = 0.0f, O = 0.0f;
#pragma unroll 4
    for (int s = 0; s < S; s++) {
        float ms = __ldcg(pp + s * (hd + 2));
        if (ms != -INFINITY) {
            float f = expf(ms - M);
            L += __ldcg(pp + s * (hd + 2) + 1) * f;
            O += __ldcg(pp + s * (hd + 2) + 2 + d) * f;
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
    attn_state_init<ND>(m, l, acc);
}

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

/* ---- decode: one token over the fp16 cache -----------------------------
 * attn_decode_kernel, for n_tok == 1 and hd = 32 * ND, ND in {1, 2, 4, 8}.
 * Here latency, not bandwidth, is the cost: a few hundred keys of a few
 * KV heads are little memory traffic, while the split kernel above waits
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
#define AD_WARPS 4
static bool g_split_only = false; /* SPECTRA_CUDA_ATTN_SPLIT_KERNEL, read by spx_attention_setup */
static_assert(AD_WARPS * 32 == SPX_ATTN_DECODE_KEYS, "keys per block pass");
static_assert(AT_HB == 4, "the probabilities travel as float4");

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

/* RoPE's cos and sin at position p for lane l's ND elements (element i
 * pairs with i + HD/2, i.e. lane l with lane l ^ 16). Weights and a
 * position written before the forward pass: computed before the PDL wait,
 * off the chain (measured faster: bench/results, 2026-11-30). */
template <int ND>
__device__ __forceinline__ void ad_rope_cs(const float *inv_freq, int64_t p, float (&c)[ND], float (&sn)[ND]) {
    constexpr int HD = 32 * ND;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < ND; e++) {
        const float ang = (float)p * inv_freq[ND * lane + e - (lane < 16 ? 0 : HD / 2)];
        c[e] = cosf(ang);
        sn[e] = sinf(ang);
    }
}

/* One head's row in lane l's ND elements v (ND l ..), in place: with
 * gain, the RMSNorm of rope_store (double sum); then RoPE with
 * ad_rope_cs's c and sn. */
template <int ND>
__device__ __forceinline__ void ad_row(const float *gain, float eps, const float (&c)[ND], const float (&sn)[ND],
                                       float (&v)[ND]) {
    constexpr int HD = 32 * ND;
    const int lane = threadIdx.x & 31;
    if (gain) {
        double ss = 0;
#pragma unroll
        for (int e = 0; e < ND; e++) ss += (double)v[e] * v[e];
        ss = spx_warp_sum_d(ss);
        const float inv = (float)(1.0 / sqrt(ss / (double)HD + (double)eps));
#pragma unroll
        for (int e = 0; e < ND; e++) v[e] = v[e] * inv * gain[ND * lane + e];
    }
    const bool lo = lane < 16;
#pragma unroll
    for (int e = 0; e < ND; e++) {
        const float o = __shfl_xor_sync(0xffffffffu, v[e], 16);
        v[e] = lo ? v[e] * c[e] - o * sn[e] : v[e] * c[e] + o * sn[e];
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

/* The decode kernels' first work after the wait, a warp a row (every
 * row's loads issued before any is worked on): warp w < nhb (qjob) loads
 * q head h0 + w into vq (zeros past nhb); when the block's keys include p
 * (has_p), warp nhb % AD_WARPS (pjob: a free one, or warp 0) loads row p
 * into vk, vv: the token's raw k and v (FUSE), else the fp16 cache's row.
 * FUSE: q and the token's k then get their norms and RoPE (ad_row with
 * ad_rope_cs's rc, rs). Lane l: elements ND l .. ND l + ND - 1. */
template <int ND, bool FUSE>
__device__ __forceinline__ void ad_rows(const spx_attn_args &a, const attn_block &b, bool has_p, int64_t p,
                                        const float (&rc)[ND], const float (&rs)[ND], bool &qjob, bool &pjob,
                                        float (&vq)[ND], float (&vk)[ND], float (&vv)[ND]) {
    constexpr int HD = 32 * ND;
    static_assert(AT_HB == AD_WARPS, "a warp per q head");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d0 = ND * lane;
    const int64_t kvd = (int64_t)a.nkv * HD;
    const __half *kg = a.kc + (int64_t)b.kvh * HD, *vg = a.vc + (int64_t)b.kvh * HD;
    qjob = warp < b.nhb;
    pjob = has_p && warp == b.nhb % AD_WARPS;
#pragma unroll
    for (int e = 0; e < ND; e++) {
        vq[e] = qjob ? a.q[(int64_t)(b.h0 + warp) * HD + d0 + e] : 0.0f;
        vk[e] = vv[e] = 0.0f;
        if (pjob && FUSE) {
            vk[e] = a.k_new[(int64_t)b.kvh * HD + d0 + e];
            vv[e] = a.v_new[(int64_t)b.kvh * HD + d0 + e];
        } else if (pjob) {
            vk[e] = __half2float(kg[p * kvd + d0 + e]);
            vv[e] = __half2float(vg[p * kvd + d0 + e]);
        }
    }
    if (qjob && FUSE) ad_row<ND>(a.q_norm, a.eps, rc, rs, vq);
    if (pjob && FUSE) ad_row<ND>(a.k_norm, a.eps, rc, rs, vk);
}

/* The splits a decode step uses: the launch has a.n_splits (gridDim.y),
 * sized for the session's context; at position p only enough of them
 * for one pass (SPX_ATTN_DECODE_KEYS keys) each run, the rest return at
 * once (a.adapt_splits; else all of them). At short contexts that is one
 * split and no merge at all (the tg128 regime); from 8 passes of keys on,
 * all of them. */
__device__ __forceinline__ int ad_active_splits(const spx_attn_args &a) {
    if (!a.adapt_splits) return (int)gridDim.y;
    int64_t start, end;
    attn_span(a, 0, &start, &end);
    const int64_t need = (end - start + SPX_ATTN_DECODE_KEYS - 1) / SPX_ATTN_DECODE_KEYS;
    return (int)max((int64_t)1, min((int64_t)gridDim.y, need));
}

/* After a split's partial store: whether this block is the last of its
 * head group to get here (flag: a shared int). The block barrier orders
 * every thread's partial stores before thread 0's counter increment, which
 * is acq_rel at device scope (release: the block's partials are visible to
 * whoever sees the increment; acquire: the last block sees every other
 * block's), and the second barrier passes that on to the block's threads;
 * no separate fences (the threadFenceReduction form cost two more round
 * trips on the decode chain). */
__device__ __forceinline__ bool ad_last_block(const spx_attn_args &a, int *flag, int S) {
    __syncthreads();
    if (threadIdx.x == 0) {
        int old;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(a.cnt + blockIdx.x) : "memory");
        *flag = old == S - 1;
    }
    __syncthreads();
    return *flag != 0;
}

/* The last block: its group's splits merged, emit(i, value) for output i
 * < nhb * HD (head i / HD). One warp per head: the splits' weights
 * exp(M_s - M) into shared memory (w: AT_HB * (n_splits + 1) floats) and
 * the total sum; then every thread sums the splits for its outputs, 4 at
 * a time (independent loads: a few L2 round trips, not n_splits of them),
 * the first AD_PRE splits' values loaded under the weights' round trip.
 * Resets the group's counter for the next layer (which runs after this
 * grid completes). */
template <int HD, typename F>
__device__ __forceinline__ void ad_merge_splits(const spx_attn_args &a, const attn_block &b, float *w, int S, F emit) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int SS = gridDim.y, n_out = b.nhb * HD; /* S splits active of the SS the partials are laid out for */
    float *lt = w + AT_HB * S;
    const float *part = a.part + (int64_t)b.h0 * SS * (HD + 2);
    constexpr int AD_PRE = 8, NT = AD_WARPS * 32;
    const float *pp[4];
    float po[4][AD_PRE];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int i = min((int)threadIdx.x + u * NT, n_out - 1), hh = i / HD;
        pp[u] = part + (int64_t)hh * SS * (HD + 2) + 2 + (i - hh * HD);
#pragma unroll
        for (int sp = 0; sp < AD_PRE; sp++) po[u][sp] = sp < S ? __ldcg(pp[u] + (int64_t)sp * (HD + 2)) : 0.0f;
    }
    for (int hh = warp; hh < b.nhb; hh += AD_WARPS) {
        const float *ph = part + (int64_t)hh * SS * (HD + 2);
        float mx = -INFINITY;
        for (int sp = lane; sp < S; sp += 32) mx = fmaxf(mx, __ldcg(ph + (int64_t)sp * (HD + 2)));
        mx = spx_warp_max(mx);
        float ls = 0.0f;
        for (int sp = lane; sp < S; sp += 32) {
            const float ms = __ldcg(ph + (int64_t)sp * (HD + 2));
            const float f = ms == -INFINITY ? 0.0f : expf(ms - mx);
            w[hh * S + sp] = f;
            ls += f * __ldcg(ph + (int64_t)sp * (HD + 2) + 1);
        }
        ls = spx_warp_sum(ls);
        if (lane == 0) lt[hh] = ls;
    }
    __syncthreads();
    for (int i0 = threadIdx.x; i0 < n_out; i0 += 4 * NT) {
        float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const float *wr[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int i = min(i0 + u * NT, n_out - 1), hh = i / HD;
            pp[u] = part + (int64_t)hh * SS * (HD + 2) + 2 + (i - hh * HD);
            wr[u] = w + hh * S;
        }
        int sp = 0;
        if (i0 == (int)threadIdx.x) { /* the preloaded splits (fully unrolled: po stays in registers) */
#pragma unroll
            for (int q = 0; q < AD_PRE; q++)
                if (q < S)
#pragma unroll
                    for (int u = 0; u < 4; u++) o[u] = fmaf(wr[u][q], po[u][q], o[u]);
            sp = min(S, AD_PRE);
        }
#pragma unroll 4
        for (; sp < S; sp++)
#pragma unroll
            for (int u = 0; u < 4; u++) o[u] = fmaf(wr[u][sp], __ldcg(pp[u] + (int64_t)sp * (HD + 2)), o[u]);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int i = i0 + u * NT;
            if (i < n_out) emit(i, o[u] / lt[i / HD]);
        }
    }
    if (threadIdx.x == 0) a.cnt[blockIdx.x] = 0;
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

/* One 4-bit K group of a lane's key against the block's AT_HB rotated q
 * rows: its 16 code bytes u (code k in the low nibble of byte k, k + 16 in
 * the high one), scale sc and zero z; head hh's 32 q values of the group at
 * qg + hh * q_stride (16-byte aligned: read as float4) and their sum at
 * qsg[hh * qs_stride]. s[hh] += sc * (sum_k c_k q_k - z qsum), in the CPU's
 * order (spx_kv_scores). The codes become floats by one byte permute each
 * (spx_kvq4_nib_at), not by shifts, masks and an OR (NOTES 51). */
__device__ __forceinline__ void kq4_group_scores(const uint4 &u, float sc, float z, const float *qg, int q_stride,
                                                 const float *qsg, int qs_stride, float (&s)[AT_HB]) {
    const unsigned wd[4] = {u.x, u.y, u.z, u.w};
    float c[32];
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const unsigned lo = wd[w] & 0x0f0f0f0fu, hi = (wd[w] >> 4) & 0x0f0f0f0fu;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            c[4 * w + j] = spx_kvq4_nib_at(lo, j);
            c[4 * w + j + 16] = spx_kvq4_nib_at(hi, j);
        }
    }
#pragma unroll
    for (int hh = 0; hh < AT_HB; hh++) {
        const float4 *qq = reinterpret_cast<const float4 *>(qg + hh * q_stride);
        float dot = 0.0f;
#pragma unroll
        for (int k4 = 0; k4 < 8; k4++) {
            const float4 q = qq[k4];
            dot = fmaf(c[4 * k4], q.x, dot);
            dot = fmaf(c[4 * k4 + 1], q.y, dot);
            dot = fmaf(c[4 * k4 + 2], q.z, dot);
            dot = fmaf(c[4 * k4 + 3], q.w, dot);
        }
        s[hh] = fmaf(sc, dot - z * qsg[hh * qs_stride], s[hh]);
    }
}

/* ---- decode over the 4-bit cache: attn_decode_q4_kernel --------------------
 * attn_decode_kernel's structure (a tile per warp and pass, the rows
 * before p copied in before the PDL wait, the last block merging) on the
 * --kv q4 cache with attn_split_q4_kernel's arithmetic (kvq4.cuh): q
 * rotated (FUSE with rot == HD: in registers by each warp,
 * spx_kvq4_fwht_warp; else in shared memory), scores per group
 * s * (sum_k c_k q~_k - z qsum)
 * in the CPU's order, values s * (c - z), the merged output rotated back.
 * FUSE (a.k_new set): rope_store's work too, as attn_decode_kernel does
 * it: q (raw in a.q) and the token's k get the q/k RMSNorm and RoPE, the
 * k and v rows are rotated as q is and quantized here
 * (a warp per group, spx_kvq4_quant_group), the group's first block stores
 * them in cache row p, and every block with p in its keys takes them from
 * shared memory, never from the cache. Without FUSE rope_store has stored
 * row p and it is read after the wait. Per warp, shared memory holds the K and V
 * codes of 32 keys (HD / 2 bytes a row; K's 16-byte chunks XOR-swizzled
 * by row); each lane keeps its key's K scales and zeros in registers and
 * publishes its V scales and zeros for the value loop. */
template <int ND> struct adq_layout {
    static constexpr int HD = 32 * ND, RB = HD / 2 /* code bytes a row */, RPL = 8 / ND /* rows per 128 bytes */;
    static constexpr int TILE_B = 32 * RB;
    static constexpr int TILES = 0;                           /* [AD_WARPS][K, V][32][RB] bytes */
    static constexpr int VSZ = TILES + AD_WARPS * 2 * TILE_B; /* [AD_WARPS][32][ND] float2: V scale, zero */
    static constexpr int Q = VSZ + AD_WARPS * 32 * ND * 8;    /* [AT_HB][HD] floats: q~, later the output */
    static constexpr int XS = Q + AT_HB * HD * 4;             /* [K, V][HD] floats: row p (FUSE), rotated with q */
    static constexpr int QS = XS + 2 * HD * 4;                /* [AT_HB][ND] floats: q~'s group sums */
    static constexpr int PC = QS + AT_HB * ND * 4;            /* [K, V][RB] bytes: row p's codes (FUSE) */
    static constexpr int PSZ = PC + 2 * RB;                   /* [K, V][ND] float2: row p's scales, zeros */
    static constexpr int PR = PSZ + 2 * ND * 8;               /* [AD_WARPS][32] float4 */
    static constexpr int FLAG = PR + AD_WARPS * 32 * 16;
    static constexpr int BYTES = FLAG + 16;
    static_assert((2 * AD_WARPS * AT_HB + AD_WARPS * AT_HB * HD) * 4 <= Q, "merge scratch");
    static_assert(AT_HB * (128 + 1) * 4 <= Q, "the last block's split weights (n_splits <= 128)");
};

template <int ND, bool FUSE>
__global__ void __launch_bounds__(AD_WARPS * 32) attn_decode_q4_kernel(const __grid_constant__ spx_attn_args a) {
    typedef adq_layout<ND> L;
    constexpr int HD = L::HD, RB = L::RB, NT = AD_WARPS * 32;
    extern __shared__ __align__(16) unsigned char ad_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const attn_block b = attn_block_of(a);
    const int64_t p = a.pos[0]; /* written before this forward began */
    const int64_t kvd = (int64_t)a.nkv * HD, crow = kvd / 2, srow = kvd / SPX_KVQ4_GROUP, zrow = (srow + 1) / 2;
    const int G0 = b.kvh * ND; /* the head's first group in a row */
    const int S = ad_active_splits(a);
    if (b.split >= S) return; /* block-uniform: no keys for this split at this position */
    int64_t kb, ke;
    attn_keys(a, 0, b.split, &kb, &ke, S);
    uint8_t *kcs = ad_sm + L::TILES + warp * 2 * L::TILE_B, *vcs = kcs + L::TILE_B;
    float2 *vsz = reinterpret_cast<float2 *>(ad_sm + L::VSZ) + warp * 32 * ND;
    const uint8_t *kcg = a.kq.codes + (int64_t)b.kvh * RB, *vcg = a.vq.codes + (int64_t)b.kvh * RB;
    const int64_t old_end = min(ke, p); /* rows an earlier step wrote */
    const int swz = (lane / L::RPL) & (ND - 1);
    float ksc[ND], kz[ND], vsc[ND], vz[ND]; /* this lane's key */
    auto load_key = [&](int64_t key) {
#pragma unroll
        for (int c = 0; c < ND; c++) {
            cp_async16(kcs + lane * RB + ((c ^ swz) << 4), kcg + key * crow + c * 16);
            cp_async16(vcs + lane * RB + (c << 4), vcg + key * crow + c * 16);
        }
#pragma unroll
        for (int g = 0; g < ND; g++) {
            const int Gz = G0 + g, sh = (Gz & 1) * 4;
            ksc[g] = __half2float(a.kq.scales[key * srow + Gz]);
            vsc[g] = __half2float(a.vq.scales[key * srow + Gz]);
            kz[g] = (float)((a.kq.zeros[key * zrow + (Gz >> 1)] >> sh) & 15);
            vz[g] = (float)((a.vq.zeros[key * zrow + (Gz >> 1)] >> sh) & 15);
        }
    };
    auto publish_v = [&]() {
#pragma unroll
        for (int g = 0; g < ND; g++) vsz[lane * ND + g] = make_float2(vsc[g], vz[g]);
    };
    const float2 *psz = reinterpret_cast<const float2 *>(ad_sm + L::PSZ);
    auto key_p = [&]() { /* FUSE: this lane's key is p, quantized by this block */
#pragma unroll
        for (int g = 0; g < ND; g++) {
            ksc[g] = psz[g].x;
            kz[g] = psz[g].y;
            vsc[g] = psz[ND + g].x;
            vz[g] = psz[ND + g].y;
        }
    };
    const int64_t k0f = kb + warp * 32;
    if (k0f + lane < old_end) load_key(k0f + lane);
    cp_commit();
    { /* the block's later passes (long contexts): into L2 meanwhile */
        const int64_t k1 = kb + AD_WARPS * 32;
        for (int64_t i = threadIdx.x; i < (old_end - k1) * 6; i += blockDim.x) {
            const int64_t key = k1 + i / 6;
            const int r = (int)(i % 6);
            const spx_kvq4 &c = r & 1 ? a.vq : a.kq;
            const void *line = r < 2   ? (const void *)(c.codes + key * crow + (int64_t)b.kvh * RB)
                               : r < 4 ? (const void *)(c.scales + key * srow + G0)
                                       : (const void *)(c.zeros + key * zrow + G0 / 2);
            asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
        }
    }
    float rc[ND], rs[ND];
    if (FUSE) ad_rope_cs<ND>(a.inv_freq, p, rc, rs);
    spx_pdl_wait();
    const bool has_p = kb <= p && p < ke; /* block-uniform */
    if (!FUSE && k0f + lane == p && has_p) load_key(p); /* rope_store wrote it */
    cp_commit();
    if (!FUSE && k0f + lane < ke) publish_v();

    float *qs = reinterpret_cast<float *>(ad_sm + L::Q), *qsum = reinterpret_cast<float *>(ad_sm + L::QS);
    float *xs = reinterpret_cast<float *>(ad_sm + L::XS);
    uint8_t *pc = ad_sm + L::PC;
    /* the rotation in registers where its blocks are whole heads (rot == HD, the usual case): each
     * warp rotates its own rows, no block barriers; else in shared memory (spx_kvq4_fwht_smem) */
    const bool wrot = FUSE && a.rot == HD;
    if (FUSE) { /* attn_decode_kernel's q and row-p jobs, one warp each */
        bool qjob, pjob;
        float vq[ND], vk[ND], vv[ND];
        ad_rows<ND, true>(a, b, has_p, p, rc, rs, qjob, pjob, vq, vk, vv);
        if (wrot) { /* warp-uniform: qjob, pjob */
            const float sc = spx_kvq4_rot_scale(HD);
            if (qjob) spx_kvq4_fwht_warp<ND>(vq, sc);
            if (pjob) {
                spx_kvq4_fwht_warp<ND>(vk, sc);
                spx_kvq4_fwht_warp<ND>(vv, sc);
            }
        }
        const int d0 = ND * lane;
#pragma unroll
        for (int e = 0; e < ND; e++) {
            qs[warp * HD + d0 + e] = vq[e];
            if (pjob) {
                xs[d0 + e] = vk[e];
                xs[HD + d0 + e] = vv[e];
            }
        }
    } else {
        for (int i = threadIdx.x; i < AT_HB * HD; i += NT) {
            const int hh = i / HD;
            qs[i] = hh < b.nhb ? a.q[(int64_t)b.h0 * HD + i] : 0.0f;
        }
    }
    __syncthreads();
    static_assert(L::XS == L::Q + AT_HB * HD * 4, "row p right after q: one rotation for both");
    if (!wrot) spx_kvq4_fwht_smem(qs, (AT_HB + (FUSE && has_p ? 2 : 0)) * HD, a.rot);
    if (FUSE && has_p) { /* row p quantized as rope_store does; the group's first block stores it */
        const bool store = b.h0 == b.kvh * (a.nh / a.nkv);
        float2 *pszw = reinterpret_cast<float2 *>(ad_sm + L::PSZ);
        for (int gi = warp; gi < 2 * ND; gi += AD_WARPS) { /* K groups, then V */
            const int val = gi >= ND, g = gi - val * ND;
            uint16_t sb;
            int z;
            const unsigned byte = spx_kvq4_quant_group(xs[gi * SPX_KVQ4_GROUP + lane], &sb, &z);
            if (lane < 16) pc[gi * 16 + lane] = (uint8_t)byte;
            if (lane == 0) pszw[gi] = make_float2(spx_kvq4_f16_val(sb), (float)z);
            if (store) spx_kvq4_put_group(val ? a.vq : a.kq, p, (int)kvd, G0 + g, byte, sb, z, lane);
        }
    }
    for (int i = threadIdx.x; i < AT_HB * ND; i += NT) {
        const float *qq = qs + (i / ND) * HD + (i % ND) * SPX_KVQ4_GROUP;
        float sm = 0.0f;
        for (int k = 0; k < SPX_KVQ4_GROUP; k++) sm = SPX_KQ_ADD(sm, qq[k]); /* the CPU's order */
        qsum[i] = sm;
    }
    __syncthreads();
    if (FUSE) {
        if (k0f + lane == p && has_p) key_p();
        if (k0f + lane < ke) publish_v();
    }

    float m[AT_HB], l[AT_HB], acc[AT_HB][ND];
    attn_state_init<ND>(m, l, acc);
    float4 *pr = reinterpret_cast<float4 *>(ad_sm + L::PR) + warp * 32;
    const float scale = a.scale > 0 ? a.scale : 1.0f / sqrtf((float)HD);
    /* this lane's value dimensions ND l ..: group gl, bytes from vb, high nibbles or low */
    const int d0 = ND * lane, gl = d0 >> 5, vb = 16 * gl + (d0 & 15), vsh = (d0 & 16) ? 4 : 0;
    for (int64_t k0 = k0f; k0 < ke; k0 += NT) {
        if (k0 != k0f) { /* a later pass: this warp's previous tile is consumed */
            __syncwarp();
            if (k0 + lane < ke) {
                if (FUSE && k0 + lane == p) key_p();
                else load_key(k0 + lane);
                publish_v();
            }
            cp_commit();
        }
        cp_wait<0>();
        if (FUSE && k0 <= p && p < k0 + 32) { /* row p's codes into the tile (warp-uniform) */
            const int r = (int)(p - k0), swr = (r / L::RPL) & (ND - 1);
            for (int c = lane; c < 2 * ND; c += 32) {
                const uint4 u = *reinterpret_cast<const uint4 *>(pc + c * 16);
                if (c < ND) *reinterpret_cast<uint4 *>(kcs + r * RB + ((c ^ swr) << 4)) = u;
                else *reinterpret_cast<uint4 *>(vcs + r * RB + ((c - ND) << 4)) = u;
            }
        }
        __syncwarp();
        const bool valid = k0 + lane < ke;
        float s[AT_HB];
#pragma unroll
        for (int hh = 0; hh < AT_HB; hh++) s[hh] = 0.0f;
        if (valid) {
            const uint8_t *kr = kcs + lane * RB;
#pragma unroll
            for (int g = 0; g < ND; g++)
                kq4_group_scores(*reinterpret_cast<const uint4 *>(kr + ((g ^ swz) << 4)), ksc[g], kz[g],
                                 qs + g * SPX_KVQ4_GROUP, HD, qsum + g, ND, s);
        }
        float ps[AT_HB];
        attn_softmax_tile<ND>(valid, s, scale, m, l, acc, ps);
        pr[lane] = make_float4(ps[0], ps[1], ps[2], ps[3]);
        __syncwarp();
        const int nvalid = (int)min((int64_t)32, ke - k0);
#pragma unroll 4
        for (int j = 0; j < nvalid; j++) {
            const float4 pj = pr[j];
            const float2 sz = vsz[j * ND + gl];
            const uint8_t *vr = vcs + j * RB + vb;
            float vv[ND];
            if constexpr (ND % 4 == 0) { /* the lane's ND bytes as words (4-byte aligned: vb = 16 gl + ND l % 16) */
#pragma unroll
                for (int w = 0; w < ND / 4; w++) {
                    const unsigned n = (reinterpret_cast<const unsigned *>(vr)[w] >> vsh) & 0x0f0f0f0fu;
#pragma unroll
                    for (int e = 0; e < 4; e++) vv[4 * w + e] = sz.x * (spx_kvq4_nib_at(n, e) - sz.y);
                }
            } else {
#pragma unroll
                for (int e = 0; e < ND; e++) vv[e] = sz.x * (spx_kvq4_nib(((unsigned)vr[e] >> vsh) & 15u) - sz.y);
            }
#pragma unroll
            for (int dd = 0; dd < ND; dd++) {
                acc[0][dd] = fmaf(pj.x, vv[dd], acc[0][dd]);
                acc[1][dd] = fmaf(pj.y, vv[dd], acc[1][dd]);
                acc[2][dd] = fmaf(pj.z, vv[dd], acc[2][dd]);
                acc[3][dd] = fmaf(pj.w, vv[dd], acc[3][dd]);
            }
        }
    }

    spx_pdl_trigger(); /* after the keys, as attn_decode_kernel */
    float *ob = qs; /* the merged output, rotated, [nhb][HD] */
    float *out = a.out + (int64_t)b.h0 * HD;
    attn_merge<ND, true>(reinterpret_cast<float *>(ad_sm + L::TILES), m, l, acc, HD, b.nhb,
                         [&](int hh, int d, int i, float M, float Ls, float O) {
                             if (S == 1) ob[i] = O / Ls;
                             else attn_part_store(a, 0, b.h0 + hh, b.split, d, M, Ls, O);
                         });
    if (S > 1) {
        if (!ad_last_block(a, reinterpret_cast<int *>(ad_sm + L::FLAG), S)) return;
        ad_merge_splits<HD>(a, b, reinterpret_cast<float *>(ad_sm + L::TILES), S, [&](int i, float v) { ob[i] = v; });
    }
    __syncthreads();
    if (wrot) { /* a warp per head: its output row rotated back in registers, stored from there */
        if (warp < b.nhb) {
            float v[ND];
#pragma unroll
            for (int e = 0; e < ND; e++) v[e] = ob[warp * HD + ND * lane + e];
            spx_kvq4_fwht_warp<ND>(v, spx_kvq4_rot_scale(HD));
#pragma unroll
            for (int e = 0; e < ND; e++) out[warp * HD + ND * lane + e] = v[e];
        }
        return;
    }
    spx_kvq4_fwht_smem(ob, b.nhb * HD, a.rot);
    for (int i = threadIdx.x; i < b.nhb * HD; i += NT) out[i] = ob[i];
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
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(attn_decode_q4_kernel<ND, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   adq_layout<ND>::BYTES);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(attn_decode_q4_kernel<ND, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   adq_layout<ND>::BYTES);
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
    return err;
}

bool spx_attention_decode_fast(int hd) { return (hd == 32 || hd == 64 || hd == 128 || hd == 256) && !g_split_only; }

template <int ND, bool FUSE> static cudaError_t adq_launch(const spx_attn_args &a, cudaStream_t st, bool pdl) {
    const int G = a.nh / a.nkv, HBn = (G + AT_HB - 1) / AT_HB;
    cudaError_t err = spx_launch(attn_decode_q4_kernel<ND, FUSE>, dim3((unsigned)(a.nkv * HBn), (unsigned)a.n_splits),
                                 dim3(AD_WARPS * 32), (size_t)adq_layout<ND>::BYTES, st, pdl, a);
    return err != cudaSuccess ? err : cudaGetLastError();
}

static cudaError_t attention_decode(const spx_attn_args &a_in, cudaStream_t st, bool pdl) {
    spx_attn_args a = a_in;
    a.adapt_splits = g_adapt;
    const bool f = a.k_new != nullptr;
    if (f && (!a.v_new || !a.inv_freq)) return cudaErrorInvalidValue;
    if ((a.n_splits > 1 && !a.cnt) || a.n_splits > 128) return cudaErrorInvalidValue;
    if (a.kq.codes) {
        if (!a.vq.codes || a.rot < 1 || (a.rot & (a.rot - 1)) || a.hd % a.rot) return cudaErrorInvalidValue;
        switch (a.hd) {
        case 32: return f ? adq_launch<1, true>(a, st, pdl) : adq_launch<1, false>(a, st, pdl);
        case 64: return f ? adq_launch<2, true>(a, st, pdl) : adq_launch<2, false>(a, st, pdl);
        case 128: return f ? adq_launch<4, true>(a, st, pdl) : adq_launch<4, false>(a, st, pdl);
        default: return f ? adq_launch<8, true>(a, st, pdl) : adq_launch<8, false>(a, st, pdl);
        }
    }
    switch (a.hd) {
    case 32: return f ? ad_launch<1, true>(a, st, pdl) : ad_launch<1, false>(a, st, pdl);
    case 64: return f ? ad_launch<2, true>(a, st, pdl) : ad_launch<2, false>(a, st, pdl);
    case 128: return f ? ad_launch<4, true>(a, st, pdl) : ad_launch<4, false>(a, st, pdl);
    default: return f ? ad_launch<8, true>(a, st, pdl) : ad_launch<8, false>(a, st, pdl);
    }
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
    extern __shared__ __align__(16) float at_sm[]; /* q rows read as float4 (kq4_group_scores) */
    spx_pdl_trigger();
    const attn_block b = attn_block_of(a); /* from the launch's shape only */
    if (a.n_tok == 1) {
        /* as attn_split_kernel: the block's rows of earlier steps (codes,
         * scales and zero bytes of K and V) into L2 before the wait */
        int64_t kb, ke;
        attn_keys(a, b.t, b.split, &kb, &ke);
        ke = min(ke, (int64_t)a.pos[0]);
        const int64_t kvd0 = (int64_t)a.nkv * a.hd, crow0 = kvd0 / 2, srow0 = kvd0 / SPX_KVQ4_GROUP;
        const int64_t zrow0 = (srow0 + 1) / 2, g0 = (int64_t)b.kvh * (a.hd / SPX_KVQ4_GROUP);
        for (int64_t i = threadIdx.x; i < (ke - kb) * 6; i += blockDim.x) {
            const int64_t key = kb + i / 6;
            const int r = (int)(i % 6);
            const spx_kvq4 &c = r & 1 ? a.vq : a.kq;
            const void *line = r < 2   ? (const void *)(c.codes + key * crow0 + (int64_t)b.kvh * (a.hd / 2))
                               : r < 4 ? (const void *)(c.scales + key * srow0 + g0)
                                       : (const void *)(c.zeros + key * zrow0 + g0 / 2);
            asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
        }
    }
    spx_pdl_wait();
    const int kvh = b.kvh, h0 = b.h0, nhb = b.nhb, split = b.split, t = b.t;
    const int hd = a.hd, qd = a.nh * hd, ng = hd / SPX_KVQ4_GROUP;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvd = a.nkv * hd;
    const int64_t crow = kvd / 2, srow = kvd / SPX_KVQ4_GROUP, zrow = (srow + 1) / 2;
    const int G0 = kvh * ng; /* this head's first group in a row */
    int64_t k_begin, k_end;
    attn_keys(a, t, split, &k_begin, &k_end);
    const float scale = a.scale > 0 ? a.scale : 1.0f / sqrtf((float)hd);

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
                    kq4_group_scores(u, sc, z, qs + g * SPX_KVQ4_GROUP, hd, qsum + g, ng, s);
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
    const bool fast = a.n_tok == 1 && spx_attention_decode_fast(a.hd);
    if (a.k_new && !fast) return cudaErrorInvalidValue; /* rope is fused only there */
    if (fast) return attention_decode(a, st, pdl);
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
