/* kvlow_attend.cu: attention over the device low-bit cache (kvlow_dev.cuh
 * gives the regions and the algorithm; the CPU's is engine/kvlow_attend.c).
 *
 * kvl_attn_kernel<ND, KB, ROT>: head_dim 32 ND, KB-bit keys, layout. Block
 * = 4 warps, one (KV head, up to 4 of its q heads, split, token); warps
 * take aligned 32-key tiles in turn; lane i owns key k0 + i for the
 * scores, then lane l owns dimensions ND l .. ND l + ND - 1 for the
 * values (attention_internal.cuh's online softmax and warp merge). A tile
 * is fp16 (sinks or ring: the row read as halves) or codes:
 *   KIVI: the block's per-channel (m, s) folded into the query once per
 *         128-key block and warp (qk = q s, cst = q . m), then
 *         score = cst + qk . c on the lane's key's codes;
 *   ROT:  score = sum over groups of s_g (qr . c)_g + m_g sum(qr)_g with
 *         the rotated query qr and the token's own (m, s).
 * Values: v = m + s c per lane dimension (group of the lane's dims:
 * ND <= 4 <= group). ROT sums rotated values (fp16 rows rotated as read)
 * and rotates the output back. Decode steps run only the splits their
 * position needs (SPX_KVL_SPLIT_KEYS keys each, up to the launch's);
 * splits meet in the last block of their head group (a.cnt). */
#include "cuda/attention_internal.cuh"
#include "cuda/kvlow_dev.cuh"

template <int ND> struct kvl_layout {
    static constexpr int HD = 32 * ND;
    static constexpr int QS = 0;                                         /* [AT_HB][HD] q, model coordinates */
    static constexpr int QR = QS + AT_HB * HD * 4;                       /* [AT_HB][HD] q in codes' coordinates */
    static constexpr int QK = QR + AT_HB * HD * 4;                       /* [AD_WARPS][AT_HB][HD] KIVI q s */
    static constexpr int CST = QK + AD_WARPS * AT_HB * HD * 4;           /* [AD_WARPS][AT_HB] KIVI q . m */
    static constexpr int QGS = CST + AD_WARPS * AT_HB * 4;               /* [AT_HB][HD / 8] ROT group sums of qr */
    static constexpr int MRG = QGS + AT_HB * (HD / 8) * 4;               /* attn_merge scratch, then [AT_HB][HD] output */
    static constexpr int MRG_F = 2 * AT_WARPS * AT_HB + AT_WARPS * AT_HB * HD;
    static constexpr int OUT = MRG + MRG_F * 4;                          /* [AT_HB][HD] */
    /* [AD_WARPS] staging of a tile's values: fp16 rows [32][HD] halves, or
     * codes [32][16] words then (m, s) pairs [32][16] words */
    static constexpr int VST_WARP = (32 * HD * 2 > 32 * 32 * 4 ? 32 * HD * 2 : 32 * 32 * 4);
    static constexpr int VST = OUT + AT_HB * HD * 4;
    static constexpr int FLAG = VST + AD_WARPS * VST_WARP;
    static constexpr int BYTES = FLAG + 16;
};

/* Code e of a head's key codes in w (words, little-endian; w[NW] = 0) as
 * a float: the bits OR'ed into 2^23's mantissa, minus 2^23 (exact; no
 * integer conversion). */
template <int KB> __device__ __forceinline__ float kvl_code(const uint32_t *w, int e) {
    const int bit = e * KB;
    const unsigned cd = __funnelshift_r(w[bit >> 5], w[(bit >> 5) + 1], bit & 31) & ((1u << KB) - 1);
    return __uint_as_float(0x4B000000u | cd) - 8388608.0f;
}

/* ND contiguous halves of a staged V row as floats */
template <int ND> __device__ __forceinline__ void ad_load_v_kvl(const __half *src, float (&v)[ND]) {
#pragma unroll
    for (int e = 0; e < ND; e += 2) {
        if (e + 1 < ND) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(src + e));
            v[e] = f.x;
            v[e + 1] = f.y;
        } else
            v[e] = __half2float(src[e]);
    }
}

template <int ND, int KB, bool ROT>
__global__ void __launch_bounds__(AD_WARPS * 32) kvl_attn_kernel(const __grid_constant__ spx_kvl_attn_args a) {
    typedef kvl_layout<ND> LY;
    constexpr int HD = LY::HD, NW = HD * KB / 32; /* 32-bit words of a head's key codes */
    extern __shared__ __align__(16) unsigned char kv_sm[];
    const spx_kvl_dev &c = a.c;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int G = a.nh / c.nkv, HBn = (G + AT_HB - 1) / AT_HB, hb = blockIdx.x % HBn, kvh = blockIdx.x / HBn;
    const int h0 = kvh * G + hb * AT_HB, nhb = min(AT_HB, G - hb * AT_HB), split = blockIdx.y, t = blockIdx.z;
    const int64_t p0 = a.pos[0], p = p0 + a.t0 + t, enc = spx_kvl_enc(p0);
    const int64_t start = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0, end = p + 1;
    const int S = a.n_tok == 1 ? (int)max((int64_t)1, min((int64_t)gridDim.y, (end - start + SPX_KVL_SPLIT_KEYS - 1) /
                                                                                   SPX_KVL_SPLIT_KEYS))
                               : (int)gridDim.y;
    if (split >= S) return; /* block-uniform */
    const int64_t a0 = start / 32 * 32, ntiles = (end - a0 + 31) / 32, per = (ntiles + S - 1) / S;
    const int64_t kb = a0 + (int64_t)split * per * 32, ke = min(end, kb + per * 32);
    const int kvd = c.kvd, L = a.layer, grp = c.group;
    float *qs = reinterpret_cast<float *>(kv_sm + LY::QS), *qr = reinterpret_cast<float *>(kv_sm + LY::QR);
    float *qk = reinterpret_cast<float *>(kv_sm + LY::QK) + warp * AT_HB * HD;
    float *cst = reinterpret_cast<float *>(kv_sm + LY::CST) + warp * AT_HB;
    float *qgs = reinterpret_cast<float *>(kv_sm + LY::QGS);
    const float rsc = 1.0f / sqrtf((float)HD);
    /* q rows (warp w: head h0 + w) and, ROT, their rotation and group sums */
    {
        float v[ND];
#pragma unroll
        for (int e = 0; e < ND; e++)
            v[e] = warp < nhb ? a.q[((int64_t)t * a.nh + h0 + warp) * HD + ND * lane + e] : 0.0f;
#pragma unroll
        for (int e = 0; e < ND; e++) qs[warp * HD + ND * lane + e] = v[e];
        if (ROT) {
            spx_kvq4_fwht_warp<ND>(v, rsc);
            float gs = 0.0f;
#pragma unroll
            for (int e = 0; e < ND; e++) gs += v[e];
            for (int o = ND; o < grp; o *= 2) gs += __shfl_xor_sync(0xffffffffu, gs, o / ND);
            if ((ND * lane) % grp == 0) qgs[warp * (HD / 8) + ND * lane / grp] = gs;
        }
#pragma unroll
        for (int e = 0; e < ND; e++) qr[warp * HD + ND * lane + e] = v[e];
    }
    __syncthreads();

    float m[AT_HB], l[AT_HB], acc[AT_HB][ND];
    attn_state_init<ND>(m, l, acc);
    const float scale = a.scale > 0 ? a.scale : rsc;
    const __half *sk = c.sink_k + (size_t)L * SPX_KVL_BLOCK * kvd + kvh * HD, *sv = c.sink_v + (size_t)L * SPX_KVL_BLOCK * kvd + kvh * HD;
    const __half *rk = c.ring_k + (size_t)L * c.ring * kvd + kvh * HD, *rv = c.ring_v + (size_t)L * c.ring * kvd + kvh * HD;
    const uint8_t *ck = c.ck + (size_t)L * c.n_ctx * c.krow + kvh * HD * KB / 8;
    const uint8_t *cv = c.cv + (size_t)L * c.n_ctx * c.vrow;
    const int ngr = kvd / grp;
    const __half *mv = c.mv + (size_t)L * c.n_ctx * ngr * 2;
    __half *vst = reinterpret_cast<__half *>(kv_sm + LY::VST + warp * LY::VST_WARP);
    int64_t blk_seen = -1;
    for (int64_t k0 = kb + warp * 32; k0 < ke; k0 += AD_WARPS * 32) {
        const int64_t key = k0 + lane;
        const bool valid = key >= start && key < ke;
        const bool codes = k0 >= SPX_KVL_BLOCK && k0 < enc; /* tile-uniform (aligned tiles) */
        const int j0 = (int)max((int64_t)0, start - k0), j1 = (int)min((int64_t)32, ke - k0);
        /* the tile's values into the warp's staging, under the scores (one round trip) */
        __syncwarp(); /* the previous tile's values are consumed */
        if (!codes) {
            constexpr int CPR = HD / 8; /* 16-byte chunks per row */
            for (int i = lane; i < 32 * CPR; i += 32) {
                const int r = i / CPR, cc = i - r * CPR;
                const int64_t kj = k0 + r;
                if (r >= j0 && r < j1)
                    cp_async16(vst + r * HD + cc * 8, (kj < SPX_KVL_BLOCK ? sv + kj * kvd : rv + (kj % c.ring) * kvd) + cc * 8);
            }
        } else {
            const int vw = HD * c.vb / 32, nm = HD / grp;
            uint32_t *sc_w = reinterpret_cast<uint32_t *>(vst), *sm_w = sc_w + 32 * 16;
            for (int i = lane; i < 32 * vw; i += 32) {
                const int r = i / vw, w = i - r * vw;
                if (r >= j0 && r < j1) cp_async4(sc_w + r * 16 + w, cv + (k0 + r) * c.vrow + kvh * HD * c.vb / 8 + 4 * w);
            }
            for (int i = lane; i < 32 * nm; i += 32) {
                const int r = i / nm, w = i - r * nm;
                if (r >= j0 && r < j1) cp_async4(sm_w + r * 16 + w, mv + ((k0 + r) * ngr + kvh * nm + w) * 2);
            }
        }
        cp_commit();
        float s[AT_HB];
#pragma unroll
        for (int hh = 0; hh < AT_HB; hh++) s[hh] = 0.0f;
        if (!codes) {
            if (valid) {
                const __half *kr = key < SPX_KVL_BLOCK ? sk + key * kvd : rk + (key % c.ring) * kvd;
#pragma unroll
                for (int d = 0; d < HD; d += 8) {
                    const uint4 u = *reinterpret_cast<const uint4 *>(kr + d);
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
                        const float4 q0 = *reinterpret_cast<const float4 *>(qs + hh * HD + d);
                        const float4 q1 = *reinterpret_cast<const float4 *>(qs + hh * HD + d + 4);
                        float x = s[hh];
                        x = fmaf(q0.x, kf[0], x);
                        x = fmaf(q0.y, kf[1], x);
                        x = fmaf(q0.z, kf[2], x);
                        x = fmaf(q0.w, kf[3], x);
                        x = fmaf(q1.x, kf[4], x);
                        x = fmaf(q1.y, kf[5], x);
                        x = fmaf(q1.z, kf[6], x);
                        x = fmaf(q1.w, kf[7], x);
                        s[hh] = x;
                    }
                }
            }
        } else {
            if (!ROT && k0 / SPX_KVL_BLOCK != blk_seen) { /* fold the block's (m, s) into the query */
                blk_seen = k0 / SPX_KVL_BLOCK;
                const __half *mp = c.mk + (((size_t)L * c.n_blocks + blk_seen) * kvd + kvh * HD) * 2;
                float cs[AT_HB];
#pragma unroll
                for (int hh = 0; hh < AT_HB; hh++) cs[hh] = 0.0f;
                __syncwarp();
#pragma unroll
                for (int e = 0; e < ND; e++) {
                    const int i = lane + 32 * e;
                    const float2 ms = __half22float2(*reinterpret_cast<const __half2 *>(mp + 2 * i));
#pragma unroll
                    for (int hh = 0; hh < AT_HB; hh++) {
                        qk[hh * HD + i] = qr[hh * HD + i] * ms.y;
                        cs[hh] = fmaf(qr[hh * HD + i], ms.x, cs[hh]);
                    }
                }
#pragma unroll
                for (int hh = 0; hh < AT_HB; hh++) {
                    const float v = spx_warp_sum(cs[hh]);
                    if (lane == 0) cst[hh] = v;
                }
                __syncwarp();
            }
            uint32_t w[NW + 1];
            const uint32_t *src = reinterpret_cast<const uint32_t *>(ck + key * c.krow);
#pragma unroll
            for (int i = 0; i < NW; i++) w[i] = valid ? src[i] : 0u; /* past ke: maybe past n_ctx */
            w[NW] = 0;
            if (!ROT) {
#pragma unroll
                for (int i = 0; i < HD; i += 4) {
                    float cf[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) cf[e] = kvl_code<KB>(w, i + e);
#pragma unroll
                    for (int hh = 0; hh < AT_HB; hh++) {
                        const float4 qv = *reinterpret_cast<const float4 *>(qk + hh * HD + i);
                        s[hh] = fmaf(qv.w, cf[3], fmaf(qv.z, cf[2], fmaf(qv.y, cf[1], fmaf(qv.x, cf[0], s[hh]))));
                    }
                }
#pragma unroll
                for (int hh = 0; hh < AT_HB; hh++) s[hh] += cst[hh];
            } else {
                const __half *mp = c.mk + (((size_t)L * c.n_ctx + key) * ngr + kvh * HD / grp) * 2;
                float pt[AT_HB];
#pragma unroll
                for (int hh = 0; hh < AT_HB; hh++) pt[hh] = 0.0f;
#pragma unroll
                for (int i = 0; i < HD; i += 4) {
                    float cf[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) cf[e] = kvl_code<KB>(w, i + e);
#pragma unroll
                    for (int hh = 0; hh < AT_HB; hh++) {
                        const float4 qv = *reinterpret_cast<const float4 *>(qr + hh * HD + i);
                        pt[hh] = fmaf(qv.w, cf[3], fmaf(qv.z, cf[2], fmaf(qv.y, cf[1], fmaf(qv.x, cf[0], pt[hh]))));
                    }
                    if (((i + 4) & (grp - 1)) == 0) { /* group ends after element i + 3 (group >= 8) */
                        const int g = (i + 3) / grp;
                        const float2 ms = __half22float2(*reinterpret_cast<const __half2 *>(mp + 2 * g));
#pragma unroll
                        for (int hh = 0; hh < AT_HB; hh++) {
                            s[hh] = fmaf(ms.y, pt[hh], fmaf(ms.x, qgs[hh * (HD / 8) + g], s[hh]));
                            pt[hh] = 0.0f;
                        }
                    }
                }
            }
        }
        float ps[AT_HB];
        attn_softmax_tile<ND>(valid, s, scale, m, l, acc, ps);
        if (codes && a.lse) { /* eq. 7's group sums as log-sum-exp (gt divides 32: groups within the tile) */
            const int gt = c.gt;
#pragma unroll
            for (int hh = 0; hh < AT_HB; hh++) {
                float gs = ps[hh];
                for (int o = 1; o < gt; o *= 2) gs += __shfl_xor_sync(0xffffffffu, gs, o);
                if ((lane & (gt - 1)) == 0 && hh < nhb && valid)
                    a.lse[((int64_t)t * a.nh + h0 + hh) * c.n_groups + (key - SPX_KVL_BLOCK) / gt] = m[hh] + logf(gs);
            }
        }
        /* values, from the staging */
        cp_wait<0>();
        __syncwarp();
        const uint32_t *sc_w = reinterpret_cast<const uint32_t *>(vst), *sm_w = sc_w + 32 * 16;
        const int vbit = ND * lane * c.vb, vsh = vbit & 31, vwd = vbit >> 5, mgi = ND * lane / grp;
        const unsigned vmask = (1u << c.vb) - 1;
        for (int j = j0; j < j1; j++) {
            float v[ND];
            if (!codes) {
                ad_load_v_kvl<ND>(vst + j * HD + ND * lane, v);
                if (ROT) spx_kvq4_fwht_warp<ND>(v, rsc);
            } else {
                const unsigned cd = __funnelshift_r(sc_w[j * 16 + vwd], sc_w[j * 16 + vwd + 1], vsh);
                const uint32_t mw = sm_w[j * 16 + mgi];
                const float2 ms = __half22float2(*reinterpret_cast<const __half2 *>(&mw));
#pragma unroll
                for (int e = 0; e < ND; e++)
                    v[e] = fmaf(ms.y, __uint_as_float(0x4B000000u | ((cd >> (e * c.vb)) & vmask)) - 8388608.0f, ms.x);
            }
#pragma unroll
            for (int hh = 0; hh < AT_HB; hh++) {
                const float pj = __shfl_sync(0xffffffffu, ps[hh], j);
#pragma unroll
                for (int e = 0; e < ND; e++) acc[hh][e] = fmaf(pj, v[e], acc[hh][e]);
            }
        }
    }

    float *ob = reinterpret_cast<float *>(kv_sm + LY::OUT);
    const int SS = gridDim.y;
    attn_merge<ND, true>(reinterpret_cast<float *>(kv_sm + LY::MRG), m, l, acc, HD, nhb,
                         [&](int hh, int d, int i, float M, float Ls, float O) {
                             if (S == 1) {
                                 ob[i] = O / Ls;
                                 if (d == 0 && a.stat) a.stat[(int64_t)t * a.nh + h0 + hh] = M + logf(Ls);
                             } else {
                                 float *pp = a.part + (((int64_t)t * a.nh + h0 + hh) * SS + split) * (HD + 2);
                                 if (d == 0) {
                                     pp[0] = M;
                                     pp[1] = Ls;
                                 }
                                 pp[2 + d] = O;
                             }
                         });
    if (S > 1) {
        int *flag = reinterpret_cast<int *>(kv_sm + LY::FLAG);
        __syncthreads();
        if (threadIdx.x == 0) {
            int old;
            asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(a.cnt + blockIdx.x) : "memory");
            *flag = old == S - 1;
        }
        __syncthreads();
        if (!*flag) return;
        /* the last block: warp hh merges head hh's splits */
        if (warp < nhb) {
            const float *ph = a.part + ((int64_t)t * a.nh + h0 + warp) * SS * (HD + 2);
            float M = -INFINITY;
            for (int sp = 0; sp < S; sp++) M = fmaxf(M, __ldcg(ph + sp * (HD + 2)));
            float Ls = 0.0f, O[ND];
#pragma unroll
            for (int e = 0; e < ND; e++) O[e] = 0.0f;
            for (int sp = 0; sp < S; sp++) {
                const float ms = __ldcg(ph + sp * (HD + 2));
                if (ms == -INFINITY) continue;
                const float f = expf(ms - M);
                Ls += __ldcg(ph + sp * (HD + 2) + 1) * f;
#pragma unroll
                for (int e = 0; e < ND; e++) O[e] = fmaf(__ldcg(ph + sp * (HD + 2) + 2 + ND * lane + e), f, O[e]);
            }
#pragma unroll
            for (int e = 0; e < ND; e++) ob[warp * HD + ND * lane + e] = O[e] / Ls;
            if (lane == 0 && a.stat) a.stat[(int64_t)t * a.nh + h0 + warp] = M + logf(Ls);
        }
        if (threadIdx.x == 0) a.cnt[blockIdx.x] = 0;
    }
    __syncthreads();
    if (warp < nhb) { /* the output, rotated back for ROT */
        float v[ND];
#pragma unroll
        for (int e = 0; e < ND; e++) v[e] = ob[warp * HD + ND * lane + e];
        if (ROT) spx_kvq4_fwht_warp<ND>(v, rsc);
#pragma unroll
        for (int e = 0; e < ND; e++) a.out[((int64_t)t * a.nh + h0 + warp) * HD + ND * lane + e] = v[e];
    }
}

template <int ND, int KB, bool ROT> static cudaError_t kvl_launch(const spx_kvl_attn_args &a, cudaStream_t st) {
    static bool set = false;
    const int bytes = kvl_layout<ND>::BYTES;
    if (!set) {
        cudaError_t err = cudaFuncSetAttribute(kvl_attn_kernel<ND, KB, ROT>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (err != cudaSuccess) return err;
        set = true;
    }
    const int G = a.nh / a.c.nkv, HBn = (G + AT_HB - 1) / AT_HB;
    kvl_attn_kernel<ND, KB, ROT><<<dim3((unsigned)(a.c.nkv * HBn), (unsigned)a.n_splits, (unsigned)a.n_tok), AD_WARPS * 32,
                                   bytes, st>>>(a);
    return cudaGetLastError();
}

template <int ND, int KB> static cudaError_t kvl_launch_l(const spx_kvl_attn_args &a, cudaStream_t st) {
    return a.c.layout == SPX_KV_LAYOUT_ROT ? kvl_launch<ND, KB, true>(a, st) : kvl_launch<ND, KB, false>(a, st);
}
template <int ND> static cudaError_t kvl_launch_k(const spx_kvl_attn_args &a, cudaStream_t st) {
    switch (a.c.kb) {
    case 2: return kvl_launch_l<ND, 2>(a, st);
    case 3: return kvl_launch_l<ND, 3>(a, st);
    default: return kvl_launch_l<ND, 4>(a, st);
    }
}

cudaError_t spx_kvl_attention(const spx_kvl_attn_args &a, cudaStream_t st) {
    if (a.n_tok <= 0) return cudaSuccess;
    if (a.nh % a.c.nkv || a.n_splits < 1 || a.n_splits > 128 || (a.n_splits > 1 && (!a.cnt || a.n_tok != 1)) ||
        a.c.kb < 2 || a.c.kb > 4 || a.c.vb < 2 || a.c.vb > 4 || a.c.group < 8)
        return cudaErrorInvalidValue;
    switch (a.c.hd) {
    case 32: return kvl_launch_k<1>(a, st);
    case 64: return kvl_launch_k<2>(a, st);
    case 128: return kvl_launch_k<4>(a, st);
    default: return cudaErrorInvalidValue;
    }
}
