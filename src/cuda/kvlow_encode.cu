/* kvlow_encode.cu: the device cache's sizes and the encoder of whole
 * 128-token blocks (kvlow_dev.cuh), bit for bit the CPU's encode_block
 * (engine/kvlow.c): the same min/max, the fp16 rounding of (m, s), codes
 * and refinement indices from the rounded pair with the same float
 * operations in the same order (IEEE ops written as intrinsics so that no
 * contraction changes them), the same Walsh-Hadamard butterflies for ROT.
 * Also the decode-back of truncate (spx_kvlow_dequant_row's arithmetic). */
#include "cuda/kvlow_dev.cuh"

static int64_t ring_rows(int64_t batch) { return SPX_KVL_BLOCK * ((batch + SPX_KVL_BLOCK - 1) / SPX_KVL_BLOCK + 1); }

void spx_kvl_plan(const spx_kvlow_cfg *c, int64_t n_layers, int64_t n_ctx, int64_t kvd, int64_t hd, int64_t batch,
                  spx_kvl_dev *d, spx_kvl_sizes *z) {
    memset(d, 0, sizeof *d);
    d->n_layers = (int)n_layers;
    d->kvd = (int)kvd;
    d->hd = (int)hd;
    d->nkv = (int)(kvd / hd);
    d->kb = c->kb;
    d->vb = c->vb;
    d->layout = c->layout;
    d->group = (int)c->group;
    d->rb = c->rb;
    d->gt = (int)c->gt;
    d->frac = c->frac;
    int64_t r = 1;
    while (r < 256 && hd % (r * 2) == 0) r *= 2; /* spx_kv_rot_block */
    d->rot = (int)r;
    d->n_ctx = n_ctx;
    d->ring = ring_rows(batch);
    d->n_blocks = (n_ctx + SPX_KVL_BLOCK - 1) / SPX_KVL_BLOCK;
    d->n_groups = n_ctx > SPX_KVL_BLOCK ? (n_ctx - SPX_KVL_BLOCK) / c->gt + 1 : 0;
    d->krow = kvd * c->kb / 8;
    d->vrow = kvd * c->vb / 8;
    d->gbytes = (c->gt * hd * c->rb / 8) * 2;
    const size_t L = (size_t)n_layers, D = (size_t)kvd, T = (size_t)n_ctx, ng = (size_t)(kvd / c->group);
    z->sink = L * SPX_KVL_BLOCK * D * 2 + 16;
    z->ring = L * (size_t)d->ring * D * 2 + 16;
    z->ck = L * T * (size_t)d->krow + 16;
    z->cv = L * T * (size_t)d->vrow + 16;
    z->mk = (c->layout == SPX_KV_LAYOUT_KIVI ? L * (size_t)d->n_blocks * D : L * T * ng) * 4 + 16;
    z->mv = L * T * ng * 4 + 16;
    z->tier = c->rb ? L * (size_t)d->n_groups * (size_t)d->nkv * (size_t)d->gbytes + 16 : 0;
}

bool spx_kvl_supported(const spx_kvlow_cfg *c, int64_t hd, int window, char *why, size_t n) {
    if (hd != 32 && hd != 64 && hd != 128) {
        snprintf(why, n, "a low-bit KV cache on the cuda backend needs head_dim 32, 64 or 128; this model has %lld",
                 (long long)hd);
        return false;
    }
    if (c->rb && c->gt > 32) {
        snprintf(why, n, "--kv-refine-group %lld: the cuda backend takes refinement groups of at most 32 tokens",
                 (long long)c->gt);
        return false;
    }
    if (c->rb && window > 0) {
        snprintf(why, n, "--kv-refine on the cuda backend does not take a sliding-window model (window %d)", window);
        return false;
    }
    return true;
}

/* ---- encode ---------------------------------------------------------------- */

/* One CUDA block per (KV head, K or V, layer, block slot): 128 tokens of
 * one head. Shared memory: x [128][hd] floats, codes and refinement
 * indices [128][hd] bytes. */
__device__ __forceinline__ void enc_pair(const float *x, int n, int stride, int b, __half *dst, float *m, float *s) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        const float v = x[i * stride];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    const __half hm = __float2half_rn(lo), hs = __float2half_rn(__fdiv_rn(__fsub_rn(hi, lo), (float)((1 << b) - 1)));
    dst[0] = hm;
    dst[1] = hs;
    *m = __half2float(hm);
    *s = __half2float(hs);
}

/* enc_one of kvlow.c */
__device__ __forceinline__ void enc_code(float x, float m, float s, int b, int rb, uint8_t *code, uint8_t *ref) {
    const int top = (1 << b) - 1;
    if (!(s > 0)) {
        *code = 0;
        *ref = 0;
        return;
    }
    const float u = __fdiv_rn(__fsub_rn(x, m), s);
    float c = rintf(u);
    c = c < 0.0f ? 0.0f : c > (float)top ? (float)top : c;
    *code = (uint8_t)(int)c;
    if (rb) {
        float j = floorf(__fmul_rn(__fadd_rn(__fsub_rn(u, c), 0.5f), (float)(1 << rb)));
        const float jt = (float)((1 << rb) - 1);
        j = j < 0.0f ? 0.0f : j > jt ? jt : j;
        *ref = (uint8_t)(int)j;
    } else
        *ref = 0;
}

/* Byte k of the packing of v[0 .. n) at b bits each (element e at bit e b). */
__device__ __forceinline__ uint8_t pack_byte(const uint8_t *v, int64_t n, int b, int64_t k) {
    unsigned w = 0;
    const int64_t bit0 = 8 * k;
    for (int64_t e = bit0 / b; e < n && e * b < bit0 + 8; e++) {
        const int64_t sh = e * b - bit0;
        w |= sh >= 0 ? (unsigned)v[e] << sh : (unsigned)v[e] >> -sh;
    }
    return (uint8_t)w;
}

__global__ void kvl_encode_kernel(const __grid_constant__ spx_kvl_dev d, const int32_t *pos, int n_tok, int slots) {
    const int h = blockIdx.x, val = blockIdx.y, layer = blockIdx.z / slots, slot = blockIdx.z % slots;
    const int64_t p0 = pos[0], blk = spx_kvl_enc(p0) / SPX_KVL_BLOCK + slot, P0 = blk * SPX_KVL_BLOCK;
    if (P0 + SPX_KVL_BLOCK > p0 + n_tok) return; /* block-uniform: not complete after this pass */
    extern __shared__ __align__(16) unsigned char ke_sm[];
    const int hd = d.hd, kvd = d.kvd, b = val ? d.vb : d.kb, G = d.group;
    float *x = reinterpret_cast<float *>(ke_sm);
    uint8_t *code = ke_sm + SPX_KVL_BLOCK * hd * 4, *ref = code + SPX_KVL_BLOCK * hd;
    const __half *ring = (val ? d.ring_v : d.ring_k) + (size_t)layer * d.ring * kvd + (size_t)h * hd;
    for (int i = threadIdx.x; i < SPX_KVL_BLOCK * hd; i += blockDim.x) {
        const int t = i / hd, c = i - t * hd;
        x[i] = __half2float(ring[((P0 + t) % d.ring) * kvd + c]);
    }
    __syncthreads();
    const bool rot = d.layout == SPX_KV_LAYOUT_ROT;
    if (rot) { /* kvcache.c fwht per row, blocks of rot: the same butterflies, then the same factor */
        for (int hh = 1; hh < d.rot; hh *= 2) {
            for (int j = threadIdx.x; j < SPX_KVL_BLOCK * hd / 2; j += blockDim.x) {
                const int i = (j / hh) * 2 * hh + (j % hh); /* pair (i, i + hh) within its 2 hh block */
                const float a0 = x[i], b0 = x[i + hh];
                x[i] = __fadd_rn(a0, b0);
                x[i + hh] = __fsub_rn(a0, b0);
            }
            __syncthreads();
        }
        const float sc = __fdiv_rn(1.0f, __fsqrt_rn((float)d.rot));
        for (int i = threadIdx.x; i < SPX_KVL_BLOCK * hd; i += blockDim.x) x[i] = __fmul_rn(x[i], sc);
        __syncthreads();
    }
    if (!val && !rot) { /* KIVI keys: per channel over the block */
        __half *mp = d.mk + (((size_t)layer * d.n_blocks + blk) * kvd + (size_t)h * hd) * 2;
        for (int c = threadIdx.x; c < hd; c += blockDim.x) {
            float m, s;
            enc_pair(x + c, SPX_KVL_BLOCK, hd, b, mp + 2 * c, &m, &s);
            for (int t = 0; t < SPX_KVL_BLOCK; t++) enc_code(x[t * hd + c], m, s, b, d.rb, &code[t * hd + c], &ref[t * hd + c]);
        }
    } else { /* per token over groups of G channels */
        const int ngh = hd / G, ngr = kvd / G;
        __half *meta = val ? d.mv : d.mk;
        for (int j = threadIdx.x; j < SPX_KVL_BLOCK * ngh; j += blockDim.x) {
            const int t = j / ngh, g = j - t * ngh;
            __half *mp = meta + (((size_t)layer * d.n_ctx + P0 + t) * ngr + (size_t)h * ngh + g) * 2;
            float m, s;
            const float *xs = x + t * hd + g * G;
            enc_pair(xs, G, 1, b, mp, &m, &s);
            for (int i = 0; i < G; i++) enc_code(xs[i], m, s, b, d.rb, &code[t * hd + g * G + i], &ref[t * hd + g * G + i]);
        }
    }
    __syncthreads();
    /* codes: the head's bytes of each row */
    const int hb = hd * b / 8;
    const int64_t row = val ? d.vrow : d.krow;
    uint8_t *cb = (val ? d.cv : d.ck) + ((size_t)layer * d.n_ctx + P0) * row + (size_t)h * hb;
    for (int i = threadIdx.x; i < SPX_KVL_BLOCK * hb; i += blockDim.x) {
        const int t = i / hb, k = i - t * hb;
        cb[(size_t)t * row + k] = pack_byte(code + t * hd, hd, b, k);
    }
    if (!d.rb) return;
    /* refinement records: this half (keys first, then values) of each group's record */
    const int n = d.gt * hd, half_b = n * d.rb / 8, ngb = SPX_KVL_BLOCK / d.gt;
    const int64_t g0 = (P0 - SPX_KVL_BLOCK) / d.gt;
    for (int i = threadIdx.x; i < ngb * half_b; i += blockDim.x) {
        const int gi = i / half_b, k = i - gi * half_b;
        uint8_t *rec = d.tier + (((size_t)layer * d.n_groups + g0 + gi) * d.nkv + h) * d.gbytes + (size_t)val * half_b;
        rec[k] = pack_byte(ref + gi * n, n, d.rb, k);
    }
}

cudaError_t spx_kvl_encode(const spx_kvl_dev &d, const int32_t *pos, int n_tok, cudaStream_t st) {
    if (n_tok <= 0) return cudaSuccess;
    const int slots = (n_tok + SPX_KVL_BLOCK - 1) / SPX_KVL_BLOCK + 1; /* blocks a pass can complete, at most */
    const size_t smem = (size_t)SPX_KVL_BLOCK * d.hd * 6;
    static bool set = false;
    if (!set) {
        cudaError_t err = cudaFuncSetAttribute(kvl_encode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)(SPX_KVL_BLOCK * 128 * 6));
        if (err != cudaSuccess) return err;
        set = true;
    }
    kvl_encode_kernel<<<dim3((unsigned)d.nkv, 2, (unsigned)(d.n_layers * slots)), 256, smem, st>>>(d, pos, n_tok, slots);
    return cudaGetLastError();
}

/* ---- decode back (truncate) -------------------------------------------------- */

__device__ __forceinline__ unsigned get_bits(const uint8_t *p, int64_t e, int b) {
    const int64_t bit = e * b;
    const unsigned w = (unsigned)p[bit >> 3] | (unsigned)p[(bit >> 3) + 1] << 8;
    return (w >> (bit & 7)) & ((1u << b) - 1);
}

/* One block per (position, layer, K or V): spx_kvlow_dequant_row with
 * refinement, into the position's ring row. */
__global__ void kvl_decode_back_kernel(const __grid_constant__ spx_kvl_dev d, int64_t from) {
    const int64_t p = from + blockIdx.x;
    const int layer = blockIdx.y, val = blockIdx.z, hd = d.hd, kvd = d.kvd, b = val ? d.vb : d.kb;
    extern __shared__ float db_sm[]; /* [kvd] */
    const uint8_t *codes = (val ? d.cv : d.ck) + ((size_t)layer * d.n_ctx + p) * (val ? d.vrow : d.krow);
    const int64_t gi = (p - SPX_KVL_BLOCK) / d.gt, t = (p - SPX_KVL_BLOCK) % d.gt;
    const bool kivi_k = !val && d.layout == SPX_KV_LAYOUT_KIVI;
    for (int ch = threadIdx.x; ch < kvd; ch += blockDim.x) {
        const int h = ch / hd, i = ch - h * hd;
        const __half *mp = kivi_k ? d.mk + (((size_t)layer * d.n_blocks + p / SPX_KVL_BLOCK) * kvd + ch) * 2
                                  : (val ? d.mv : d.mk) + (((size_t)layer * d.n_ctx + p) * (kvd / d.group) + ch / d.group) * 2;
        const float m = __half2float(mp[0]), s = __half2float(mp[1]);
        float x = __fadd_rn(m, __fmul_rn(s, (float)get_bits(codes, ch, b)));
        if (d.tier) {
            const uint8_t *rec = d.tier + (((size_t)layer * d.n_groups + gi) * d.nkv + h) * d.gbytes;
            const unsigned j = get_bits(rec, (val ? (int64_t)d.gt * hd : 0) + t * hd + i, d.rb);
            x = __fadd_rn(x, __fmul_rn(s, __fsub_rn(__fdiv_rn(__fadd_rn((float)j, 0.5f), (float)(1 << d.rb)), 0.5f)));
        }
        db_sm[ch] = x;
    }
    __syncthreads();
    if (d.layout == SPX_KV_LAYOUT_ROT) {
        for (int hh = 1; hh < d.rot; hh *= 2) {
            for (int j = threadIdx.x; j < kvd / 2; j += blockDim.x) {
                const int i = (j / hh) * 2 * hh + (j % hh);
                const float a0 = db_sm[i], b0 = db_sm[i + hh];
                db_sm[i] = __fadd_rn(a0, b0);
                db_sm[i + hh] = __fsub_rn(a0, b0);
            }
            __syncthreads();
        }
        const float sc = __fdiv_rn(1.0f, __fsqrt_rn((float)d.rot));
        for (int i = threadIdx.x; i < kvd; i += blockDim.x) db_sm[i] = __fmul_rn(db_sm[i], sc);
        __syncthreads();
    }
    __half *dst = (val ? d.ring_v : d.ring_k) + ((size_t)layer * d.ring + (size_t)(p % d.ring)) * kvd;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) dst[i] = __float2half_rn(db_sm[i]);
}

cudaError_t spx_kvl_decode_back(const spx_kvl_dev &d, int64_t from, int64_t to, cudaStream_t st) {
    if (to <= from) return cudaSuccess;
    kvl_decode_back_kernel<<<dim3((unsigned)(to - from), (unsigned)d.n_layers, 2), 256, (size_t)d.kvd * 4, st>>>(d, from);
    return cudaGetLastError();
}
