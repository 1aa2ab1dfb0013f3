/* kvlow_refine.cu: the refinement pass of the device low-bit cache
 * (kvlow_dev.cuh): eq. 7's selection and eq. 8's exact update, after
 * spx_kvl_attention wrote the resident outputs, the groups' log-sum-exps
 * (lse) and each head's (stat).
 *
 * Selection, in two levels of 1024-thread blocks (kvl_select1_kernel per
 * (KV head, chunk of KS_CHUNK groups, token), kvl_select2_kernel per (KV
 * head, token) over the chunks' winners). The candidates are the groups
 * of [128, enc); score = max over the KV head's q heads of exp(lse -
 * stat) (the group's share of the softmax), as its float bits
 * (non-negative floats order as their bits). In each block the n-th
 * largest key T comes from a radix select (four 8-bit digits, shared
 * histograms with warp-aggregated increments); the selected set is every
 * key > T and the first (lowest position) keys == T that complete n: the
 * CPU's total order. It is written in ascending group order (each thread
 * owns a contiguous run; two block scans place the runs).
 *
 * kvl_update_kernel: blocks of 4 warps per (KV head, chunk of selected
 * groups, token), a warp per group, lane l on dimensions ND l ..: per
 * token of the group the resident key and value from the codes, the
 * deltas dk, dv from the group's tier record (mapped host memory, copied
 * once into the warp's shared staging by 8-byte loads), per q head p = exp(scale q.k - stat), p' = p exp(scale q.dk),
 * dz += p' - p, dO += (p' - p) v + p' dv (codes' coordinates) into
 * shared, then global accumulators; the last block of the (KV head,
 * token) writes out = (out + R dO) / (1 + dz) (R: the rotation back for
 * ROT) and clears the accumulators and its counter for the next layer. */
#include "cuda/attention_internal.cuh"
#include "cuda/kvlow_dev.cuh"

#include <cub/block/block_scan.cuh>

#define KS_THREADS 1024
#define KS_BATCH 8 /* keys per thread in flight in the select's passes */
#define KS_CHUNK 4096 /* groups per level-1 select block */
#define KU_WARPS 4
#define KU_GROUPS_PER_WARP 2

size_t spx_kvl_ref_words_per_token(const spx_kvl_dev &d, int nh) {
    /* lse [nh][ng], stat [nh], keys, sel, ckey, cidx [nkv][ng], nsel [nkv], acc [nh][hd + 1], cnt2 [nkv] */
    const size_t ng = (size_t)d.n_groups;
    return (size_t)nh * ng + (size_t)nh + 4 * (size_t)d.nkv * ng + (size_t)d.nkv + (size_t)nh * (size_t)(d.hd + 1) +
           (size_t)d.nkv;
}

__device__ __forceinline__ int64_t kvl_n_sel(double frac, int64_t cand) { /* spx_kvlow_n_sel */
    if (cand <= 0 || frac <= 0) return 0;
    if (frac >= 1) return cand;
    const int64_t n = (int64_t)floor(frac * (double)cand + 0.5);
    return n < 1 ? 1 : n > cand ? cand : n;
}

/* candidates of a query at p in a call starting at p0: groups [0, nc) */
__device__ __forceinline__ int64_t kvl_cands(const spx_kvl_dev &c, int64_t p0) {
    const int64_t enc = spx_kvl_enc(p0);
    return enc > SPX_KVL_BLOCK ? (enc - SPX_KVL_BLOCK) / c.gt : 0;
}

/* The block's selection of the n_sel best of keys[0, n) (descending, ties
 * to the lower position) as positions, ascending: out_idx[o] = idx[g] (or
 * base + g without idx) and out_key[o] = keys[g] (when given). Every
 * thread of the block calls it; 0 < n_sel < n. */
__device__ void kvl_select_core(const unsigned *keys, const int *idx, int64_t base, int64_t n, int64_t n_sel,
                                int *out_idx, unsigned *out_key) {
    typedef cub::BlockScan<int, KS_THREADS> scan_t;
    __shared__ typename scan_t::TempStorage tmp;
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix, s_k;
    const int lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < 256; i += KS_THREADS) hist[i] = 0;
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_k = (unsigned)n_sel;
    }
    __syncthreads();
    unsigned prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        /* KS_BATCH keys per thread loaded before any is counted; whole warps iterate (match_any) */
        for (int64_t g0 = 0; g0 < n; g0 += (int64_t)KS_THREADS * KS_BATCH) {
            unsigned key[KS_BATCH];
#pragma unroll
            for (int u = 0; u < KS_BATCH; u++) {
                const int64_t g = g0 + (int64_t)u * KS_THREADS + threadIdx.x;
                key[u] = g < n ? keys[g] : 0u;
            }
#pragma unroll
            for (int u = 0; u < KS_BATCH; u++) {
                const int64_t g = g0 + (int64_t)u * KS_THREADS + threadIdx.x;
                const int bin = g < n && (key[u] & mask) == prefix ? (int)((key[u] >> shift) & 255u) : -1;
                const unsigned peers = __match_any_sync(0xffffffffu, bin);
                if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) { /* warp 0: the digit holding the k-th largest; lane l sums bins 255 - 8 l .. 248 - 8 l */
            unsigned hv[8], loc = 0;
#pragma unroll
            for (int u = 0; u < 8; u++) {
                hv[u] = hist[255 - 8 * lane - u];
                loc += hv[u];
            }
            unsigned inc = loc; /* inclusive prefix over lanes (lane 0: the top bins) */
#pragma unroll
            for (int o = 1; o < 32; o *= 2) {
                const unsigned v = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += v;
            }
            const unsigned k = s_k, before = inc - loc;
            if (before < k && inc >= k) {
                unsigned cum = before;
                int dg = 255 - 8 * lane;
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    if (cum + hv[u] >= k) {
                        dg = 255 - 8 * lane - u;
                        break;
                    }
                    cum += hv[u];
                }
                s_k = k - cum;
                s_prefix |= (unsigned)dg << shift;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        mask |= 255u << shift;
        for (int i = threadIdx.x; i < 256; i += KS_THREADS) hist[i] = 0;
        __syncthreads();
    }
    const unsigned T = prefix;
    const int need_eq = (int)s_k; /* keys == T to take, lowest positions first */
    /* each thread a contiguous run: counts, two scans, then the writes */
    const int64_t run = (n + KS_THREADS - 1) / KS_THREADS, b0 = (int64_t)threadIdx.x * run, b1 = min(n, b0 + run);
    int n_eq = 0, n_gt = 0;
#pragma unroll 8
    for (int64_t g = b0; g < b1; g++) {
        const unsigned k = keys[g];
        n_eq += k == T;
        n_gt += k > T;
    }
    int eq_before;
    scan_t(tmp).ExclusiveSum(n_eq, eq_before);
    __syncthreads();
    const int take_eq = max(0, min(n_eq, need_eq - eq_before));
    int out_before;
    scan_t(tmp).ExclusiveSum(n_gt + take_eq, out_before);
    int o = out_before, taken = 0;
#pragma unroll 8
    for (int64_t g = b0; g < b1; g++) {
        const unsigned k = keys[g];
        if (k > T || (k == T && taken++ < take_eq)) {
            out_idx[o] = idx ? idx[g] : (int)(base + g);
            if (out_key) out_key[o] = k;
            o++;
        }
    }
    __syncthreads(); /* the shared state is reused by a next call */
}

/* Level 1: grid (KV head, chunk of KS_CHUNK groups, token). The chunk's
 * keys, then its best min(n_sel, chunk) into the candidate list at chunk
 * b min(n_sel, KS_CHUNK) (ascending: chunks in order), or with one chunk
 * straight into the selection. The global best n_sel lie among the
 * chunks' best n_sel under the same total order, so level 2 selects
 * exactly the CPU's set from the candidates. */
__global__ void __launch_bounds__(KS_THREADS) kvl_select1_kernel(const __grid_constant__ spx_kvl_ref_args r) {
    const spx_kvl_attn_args &a = r.a;
    const spx_kvl_dev &c = a.c;
    const int kvh = blockIdx.x, b = blockIdx.y, t = blockIdx.z, G = a.nh / c.nkv;
    const int64_t nc = kvl_cands(c, a.pos[0]), n_sel = kvl_n_sel(c.frac, nc), ng = c.n_groups;
    const int64_t c0 = (int64_t)b * KS_CHUNK, c1 = min(nc, c0 + KS_CHUNK), nb = (nc + KS_CHUNK - 1) / KS_CHUNK;
    const int64_t row = ((int64_t)t * c.nkv + kvh) * ng;
    if (b == 0 && threadIdx.x == 0) {
        r.nsel[(int64_t)t * c.nkv + kvh] = (int)n_sel;
        if (c.stats && n_sel) {
            atomicAdd(c.stats, (unsigned long long)n_sel);
            atomicAdd(c.stats + 1, (unsigned long long)n_sel * (unsigned long long)c.gbytes);
        }
    }
    if (n_sel == 0 || c0 >= nc) return; /* block-uniform */
    if (n_sel >= nc) { /* all */
        for (int64_t g = c0 + threadIdx.x; g < c1; g += KS_THREADS) r.sel[row + g] = (int)g;
        return;
    }
    const float *lse = a.lse + ((int64_t)t * a.nh + (int64_t)kvh * G) * ng, *stat = a.stat + (int64_t)t * a.nh + kvh * G;
    unsigned *keys = r.keys + row;
    for (int64_t g = c0 + threadIdx.x; g < c1; g += KS_THREADS) {
        float sc = 0.0f; /* eq. 7: the group's largest share of a q head's softmax */
        for (int h = 0; h < G; h++) sc = fmaxf(sc, expf(lse[(int64_t)h * ng + g] - stat[h]));
        keys[g] = __float_as_uint(sc);
    }
    __syncthreads();
    const int64_t len = c1 - c0, m = min(n_sel, (int64_t)KS_CHUNK), take = min(n_sel, len);
    if (nb == 1) {
        kvl_select_core(keys, NULL, 0, len, n_sel, r.sel + row, NULL);
        return;
    }
    if (take == len) { /* the whole chunk */
        for (int64_t g = threadIdx.x; g < len; g += KS_THREADS) {
            r.cidx[row + b * m + g] = (int)(c0 + g);
            r.ckey[row + b * m + g] = keys[c0 + g];
        }
        return;
    }
    kvl_select_core(keys + c0, NULL, c0, len, take, r.cidx + row + b * m, r.ckey + row + b * m);
}

/* Level 2: one block per (KV head, token) over the candidates. */
__global__ void __launch_bounds__(KS_THREADS) kvl_select2_kernel(const __grid_constant__ spx_kvl_ref_args r) {
    const spx_kvl_attn_args &a = r.a;
    const spx_kvl_dev &c = a.c;
    const int kvh = blockIdx.x, t = blockIdx.y;
    const int64_t nc = kvl_cands(c, a.pos[0]), n_sel = kvl_n_sel(c.frac, nc), ng = c.n_groups;
    const int64_t nb = (nc + KS_CHUNK - 1) / KS_CHUNK, m = min(n_sel, (int64_t)KS_CHUNK);
    if (n_sel == 0 || n_sel >= nc || nb <= 1) return; /* level 1 wrote the selection */
    const int64_t row = ((int64_t)t * c.nkv + kvh) * ng;
    const int64_t n = (nb - 1) * m + min(n_sel, nc - (nb - 1) * KS_CHUNK); /* only the last chunk is short */
    kvl_select_core(r.ckey + row, r.cidx + row, 0, n, n_sel, r.sel + row, NULL);
}

/* n bits (<= 16) at bit `bit` of p, reading 3 bytes */
__device__ __forceinline__ unsigned ku_bits(const uint8_t *p, int64_t bit, int n) {
    const uint8_t *q = p + (bit >> 3);
    const unsigned w = (unsigned)q[0] | (unsigned)q[1] << 8 | (unsigned)q[2] << 16;
    return (w >> (bit & 7)) & ((1u << n) - 1);
}

template <int ND, bool ROT>
__global__ void __launch_bounds__(KU_WARPS * 32) kvl_update_kernel(const __grid_constant__ spx_kvl_ref_args r) {
    constexpr int HD = 32 * ND;
    extern __shared__ __align__(16) float ku_sm[]; /* qr [G][HD], sacc [G][HD], sdz [G], flag */
    const spx_kvl_attn_args &a = r.a;
    const spx_kvl_dev &c = a.c;
    const int kvh = blockIdx.x, t = blockIdx.z, G = a.nh / c.nkv, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int L = a.layer, kvd = c.kvd, grp = c.group, ngr = kvd / grp;
    float *qr = ku_sm, *sacc = qr + G * HD, *sdz = sacc + G * HD;
    int *flag = reinterpret_cast<int *>(sdz + G);
    uint8_t *recs = reinterpret_cast<uint8_t *>(ku_sm + ((2 * G * HD + G + 1 + 3) & ~3)); /* [KU_WARPS][gbytes] */
    const float rsc = 1.0f / sqrtf((float)HD), scale = a.scale > 0 ? a.scale : rsc;
    const int nsel = r.nsel[(int64_t)t * c.nkv + kvh];
    const int per_blk = KU_WARPS * KU_GROUPS_PER_WARP, first = blockIdx.y * per_blk;
    const float *stat = a.stat + (int64_t)t * a.nh + kvh * G;
    if (first < nsel) {
        for (int h = warp; h < G; h += KU_WARPS) { /* q in the codes' coordinates */
            float v[ND];
#pragma unroll
            for (int e = 0; e < ND; e++) v[e] = a.q[((int64_t)t * a.nh + kvh * G + h) * HD + ND * lane + e];
            if (ROT) spx_kvq4_fwht_warp<ND>(v, rsc);
#pragma unroll
            for (int e = 0; e < ND; e++) {
                qr[h * HD + ND * lane + e] = v[e];
                sacc[h * HD + ND * lane + e] = 0.0f;
            }
            if (lane == 0) sdz[h] = 0.0f;
        }
        __syncthreads();
        const int *sel = r.sel + ((int64_t)t * c.nkv + kvh) * c.n_groups;
        const int ch = kvh * HD + ND * lane;
        const float step = 1.0f / (float)(1 << c.rb);
        const uint8_t *ck = c.ck + (size_t)L * c.n_ctx * c.krow, *cv = c.cv + (size_t)L * c.n_ctx * c.vrow;
        for (int si = first + warp; si < min(nsel, first + per_blk); si += KU_WARPS) {
            const int64_t g = sel[si];
            /* the record into the warp's staging: 8-byte loads over the bus (gbytes % 8 == 0 for hd >= 32) */
            const uint2 *rs = reinterpret_cast<const uint2 *>(c.tier + (((size_t)L * c.n_groups + g) * c.nkv + kvh) * c.gbytes);
            uint2 *rd = reinterpret_cast<uint2 *>(recs + warp * c.gbytes);
            __syncwarp();
            for (int i = lane; i < (int)(c.gbytes / 8); i += 32) rd[i] = rs[i];
            __syncwarp();
            const uint8_t *rec = recs + warp * c.gbytes;
            for (int tg = 0; tg < c.gt; tg++) {
                const int64_t k = SPX_KVL_BLOCK + g * c.gt + tg;
                const unsigned kc = ku_bits(ck + k * c.krow, (int64_t)ch * c.kb, ND * c.kb);
                const unsigned vc = ku_bits(cv + k * c.vrow, (int64_t)ch * c.vb, ND * c.vb);
                const unsigned jk = ku_bits(rec, ((int64_t)tg * HD + ND * lane) * c.rb, ND * c.rb <= 16 ? ND * c.rb : 16);
                const unsigned jv = ku_bits(rec, ((int64_t)(c.gt + tg) * HD + ND * lane) * c.rb, ND * c.rb <= 16 ? ND * c.rb : 16);
                float kh[ND], dk[ND], vh[ND], dv[ND];
                const float2 vms = __half22float2(*reinterpret_cast<const __half2 *>(c.mv + (((size_t)L * c.n_ctx + k) * ngr + ch / grp) * 2));
                float2 kms = make_float2(0.0f, 0.0f);
                if (ROT) kms = __half22float2(*reinterpret_cast<const __half2 *>(c.mk + (((size_t)L * c.n_ctx + k) * ngr + ch / grp) * 2));
#pragma unroll
                for (int e = 0; e < ND; e++) {
                    if (!ROT) kms = __half22float2(*reinterpret_cast<const __half2 *>(c.mk + (((size_t)L * c.n_blocks + k / SPX_KVL_BLOCK) * kvd + ch + e) * 2));
                    const unsigned rk = ND * c.rb <= 16 ? (jk >> (e * c.rb)) & ((1u << c.rb) - 1)
                                                        : ku_bits(rec, ((int64_t)tg * HD + ND * lane + e) * c.rb, c.rb);
                    const unsigned rv = ND * c.rb <= 16 ? (jv >> (e * c.rb)) & ((1u << c.rb) - 1)
                                                        : ku_bits(rec, ((int64_t)(c.gt + tg) * HD + ND * lane + e) * c.rb, c.rb);
                    kh[e] = fmaf(kms.y, (float)((kc >> (e * c.kb)) & ((1u << c.kb) - 1)), kms.x);
                    dk[e] = kms.y * (((float)rk + 0.5f) * step - 0.5f);
                    vh[e] = fmaf(vms.y, (float)((vc >> (e * c.vb)) & ((1u << c.vb) - 1)), vms.x);
                    dv[e] = vms.y * (((float)rv + 0.5f) * step - 0.5f);
                }
                for (int h = 0; h < G; h++) {
                    float d1 = 0.0f, d2 = 0.0f;
#pragma unroll
                    for (int e = 0; e < ND; e++) {
                        const float qv = qr[h * HD + ND * lane + e];
                        d1 = fmaf(qv, kh[e], d1);
                        d2 = fmaf(qv, dk[e], d2);
                    }
                    d1 = spx_warp_sum(d1);
                    d2 = spx_warp_sum(d2);
                    const float pr = expf(scale * d1 - stat[h]), pp = pr * expf(scale * d2), dp = pp - pr;
#pragma unroll
                    for (int e = 0; e < ND; e++) atomicAdd(&sacc[h * HD + ND * lane + e], fmaf(dp, vh[e], pp * dv[e]));
                    if (lane == 0) atomicAdd(&sdz[h], dp);
                }
            }
        }
        __syncthreads();
        float *gacc = r.acc + ((int64_t)t * a.nh + kvh * G) * (HD + 1);
        for (int i = threadIdx.x; i < G * (HD + 1); i += blockDim.x) {
            const int h = i / (HD + 1), d = i - h * (HD + 1);
            atomicAdd(&gacc[i], d < HD ? sacc[h * HD + d] : sdz[h]);
        }
    }
    /* every block of the (KV head, token) counts in; the last applies */
    __syncthreads();
    if (threadIdx.x == 0) {
        int old;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;"
                     : "=r"(old)
                     : "l"(r.cnt2 + (int64_t)t * c.nkv + kvh)
                     : "memory");
        *flag = old == (int)gridDim.y - 1;
    }
    __syncthreads();
    if (!*flag) return;
    float *gacc = r.acc + ((int64_t)t * a.nh + kvh * G) * (HD + 1);
    for (int h = warp; h < G; h += KU_WARPS) {
        float v[ND];
#pragma unroll
        for (int e = 0; e < ND; e++) {
            v[e] = __ldcg(gacc + h * (HD + 1) + ND * lane + e);
            gacc[h * (HD + 1) + ND * lane + e] = 0.0f;
        }
        const float dz = __ldcg(gacc + h * (HD + 1) + HD);
        __syncwarp();
        if (lane == 0) gacc[h * (HD + 1) + HD] = 0.0f;
        if (ROT) spx_kvq4_fwht_warp<ND>(v, rsc);
        float *o = a.out + ((int64_t)t * a.nh + kvh * G + h) * HD + ND * lane;
        const float inv = 1.0f / (1.0f + dz);
#pragma unroll
        for (int e = 0; e < ND; e++) o[e] = (o[e] + v[e]) * inv;
    }
    if (threadIdx.x == 0) r.cnt2[(int64_t)t * c.nkv + kvh] = 0;
}

template <int ND> static cudaError_t ku_launch(const spx_kvl_ref_args &r, unsigned chunks, cudaStream_t st) {
    const int G = r.a.nh / r.a.c.nkv;
    const size_t smem = (((size_t)2 * G * 32 * ND + G + 1 + 3) & ~(size_t)3) * 4 + (size_t)KU_WARPS * r.a.c.gbytes + 16;
    static bool set = false;
    if (!set) { /* 2 G hd floats plus 4 records: past the default 48 KB for wide groups */
        cudaError_t err = cudaFuncSetAttribute(kvl_update_kernel<ND, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
        if (err == cudaSuccess)
            err = cudaFuncSetAttribute(kvl_update_kernel<ND, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
        if (err != cudaSuccess) return err;
        set = true;
    }
    if (smem > 200 * 1024) return cudaErrorInvalidValue;
    if (r.a.c.layout == SPX_KV_LAYOUT_ROT)
        kvl_update_kernel<ND, true><<<dim3((unsigned)r.a.c.nkv, chunks, (unsigned)r.a.n_tok), KU_WARPS * 32, smem, st>>>(r);
    else
        kvl_update_kernel<ND, false><<<dim3((unsigned)r.a.c.nkv, chunks, (unsigned)r.a.n_tok), KU_WARPS * 32, smem, st>>>(r);
    return cudaGetLastError();
}

cudaError_t spx_kvl_refine(const spx_kvl_ref_args &r, cudaStream_t st) {
    const spx_kvl_attn_args &a = r.a;
    if (a.n_tok <= 0 || !a.c.tier || r.max_sel <= 0) return cudaSuccess;
    if (!a.lse || !a.stat || a.c.gt > 32) return cudaErrorInvalidValue;
    const int64_t maxc = a.c.n_groups; /* candidates at most (the grid's chunks; blocks past nc return) */
    const unsigned nb = (unsigned)((maxc + KS_CHUNK - 1) / KS_CHUNK);
    kvl_select1_kernel<<<dim3((unsigned)a.c.nkv, nb > 0 ? nb : 1, (unsigned)a.n_tok), KS_THREADS, 0, st>>>(r);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    if (nb > 1) kvl_select2_kernel<<<dim3((unsigned)a.c.nkv, (unsigned)a.n_tok), KS_THREADS, 0, st>>>(r);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const unsigned chunks = (unsigned)((r.max_sel + KU_WARPS * KU_GROUPS_PER_WARP - 1) / (KU_WARPS * KU_GROUPS_PER_WARP));
    switch (a.c.hd) {
    case 32: return ku_launch<1>(r, chunks, st);
    case 64: return ku_launch<2>(r, chunks, st);
    case 128: return ku_launch<4>(r, chunks, st);
    default: return cudaErrorInvalidValue;
    }
}
