/* attention_internal.cuh: what the attention files share; not an API
 * (that is attention.cuh). The block shape and the split-K helpers of
 * every kernel (attention.cu's fp16 split kernel, attention_decode.cu's
 * fp16 decode kernel, attention_q4.cu's 4-bit kernels), the steps the two
 * decode kernels share, and the host functions one file calls in another.
 * Device helpers only: each kernel is instantiated in the file that
 * launches it. */
#ifndef SPX_CUDA_ATTENTION_INTERNAL_CUH
#define SPX_CUDA_ATTENTION_INTERNAL_CUH

#include "cuda/attention.cuh"

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

/* ---- what the two decode kernels share ---------------------------------
 * attn_decode_kernel (attention_decode.cu, whose comment describes the
 * design) and attn_decode_q4_kernel (attention_q4.cu). */
#define AD_WARPS 4
static_assert(AD_WARPS * 32 == SPX_ATTN_DECODE_KEYS, "keys per block pass");
static_assert(AT_HB == 4, "the probabilities travel as float4");

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

/* ---- host functions one file calls in another ---------------------------- */

/* attention_decode.cu: spx_attention's one-token path (n_tok == 1 and
 * spx_attention_decode_fast), over either cache. */
cudaError_t spx_attn_decode(const spx_attn_args &a, cudaStream_t st, bool pdl);
/* attention_q4.cu: spx_attn_decode over the 4-bit cache (a.kq.codes set),
 * with a as spx_attn_decode prepared and checked it. */
cudaError_t spx_attn_decode_q4(const spx_attn_args &a, cudaStream_t st, bool pdl);
/* attention_q4.cu: the 4-bit decode kernels' shared-memory limits (for
 * spx_attention_setup). */
cudaError_t spx_attn_decode_q4_setup(void);
/* attention_q4.cu: spx_attention over the 4-bit cache otherwise (the split
 * kernel, and the combine when n_splits > 1). */
cudaError_t spx_attn_q4(const spx_attn_args &a, cudaStream_t st, bool pdl);

#endif
