/* attention_q4.cu: attention over the --kv q4 cache (kvq4.cuh; see
 * attention.cuh): one token (attn_decode_q4_kernel, the 4-bit
 * attn_decode_kernel of attention_decode.cu) and the split-K kernels
 * (attn_split_q4_kernel, attn_combine_q4_kernel, the 4-bit
 * attn_split_kernel and attn_combine_kernel of attention.cu). */
#include "cuda/attention_internal.cuh"

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

template <int ND, bool FUSE> static cudaError_t adq_launch(const spx_attn_args &a, cudaStream_t st, bool pdl) {
    const int G = a.nh / a.nkv, HBn = (G + AT_HB - 1) / AT_HB;
    cudaError_t err = spx_launch(attn_decode_q4_kernel<ND, FUSE>, dim3((unsigned)(a.nkv * HBn), (unsigned)a.n_splits),
                                 dim3(AD_WARPS * 32), (size_t)adq_layout<ND>::BYTES, st, pdl, a);
    return err != cudaSuccess ? err : cudaGetLastError();
}

template <int ND> static cudaError_t adq_setup(void) {
    cudaError_t err = cudaFuncSetAttribute(attn_decode_q4_kernel<ND, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           adq_layout<ND>::BYTES);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(attn_decode_q4_kernel<ND, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   adq_layout<ND>::BYTES);
    return err;
}

cudaError_t spx_attn_decode_q4_setup(void) {
    cudaError_t err = adq_setup<1>();
    if (err == cudaSuccess) err = adq_setup<2>();
    if (err == cudaSuccess) err = adq_setup<4>();
    if (err == cudaSuccess) err = adq_setup<8>();
    return err;
}

cudaError_t spx_attn_decode_q4(const spx_attn_args &a, cudaStream_t st, bool pdl) {
    const bool f = a.k_new != nullptr;
    if (!a.vq.codes || a.rot < 1 || (a.rot & (a.rot - 1)) || a.hd % a.rot) return cudaErrorInvalidValue;
    switch (a.hd) {
    case 32: return f ? adq_launch<1, true>(a, st, pdl) : adq_launch<1, false>(a, st, pdl);
    case 64: return f ? adq_launch<2, true>(a, st, pdl) : adq_launch<2, false>(a, st, pdl);
    case 128: return f ? adq_launch<4, true>(a, st, pdl) : adq_launch<4, false>(a, st, pdl);
    default: return f ? adq_launch<8, true>(a, st, pdl) : adq_launch<8, false>(a, st, pdl);
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

cudaError_t spx_attn_q4(const spx_attn_args &a, cudaStream_t st, bool pdl) {
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
