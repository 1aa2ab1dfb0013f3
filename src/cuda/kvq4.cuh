/* kvq4.cuh: the 4-bit KV cache on the device (--kv q4 with --backend cuda).
 * Numbers and layout: kvq4_math.h (the CPU's kvcache.c q4 format, rows
 * split into code / scale / zero planes). This header has the device view
 * of one layer's cache and the block- and warp-level pieces that rope.cu
 * (the store) and attention_q4.cu (the reads) share. */
#ifndef SPX_CUDA_KVQ4_CUH
#define SPX_CUDA_KVQ4_CUH

#include "cuda/common.cuh"
#include "cuda/kvq4_math.h"

#define SPX_KVQ4_MAX_HD 256 /* the backend's head_dim limit (SPX_ATTN_MAX_HD) */

/* One layer's K (or V) cache in q4; codes == NULL: not a q4 cache. */
struct spx_kvq4 {
    uint8_t *codes;  /* [n_ctx, kvd / 2]: group g of a row at byte 16 g, code k low nibble of byte k, k + 16 high */
    __half *scales;  /* [n_ctx, kvd / 32] */
    uint8_t *zeros;  /* [n_ctx, (kvd / 32 + 1) / 2]: group g in nibble g & 1 of byte g >> 1 */
};

/* The view of layer `layer` in a cache of n_layers * layout.layer_bytes
 * bytes at base (cudaMalloc'd: 256-byte aligned). */
static inline spx_kvq4 spx_kvq4_at(void *base, int64_t layer, int64_t n_ctx, int64_t kvd) {
    spx_kvq4_layout lo = spx_kvq4_layout_of(n_ctx, kvd);
    uint8_t *b = (uint8_t *)base + (size_t)layer * lo.layer_bytes;
    spx_kvq4 v;
    v.codes = b + lo.codes_off;
    v.scales = (__half *)(b + lo.scales_off);
    v.zeros = b + lo.zeros_off;
    return v;
}

/* In-place FWHT (kvq4_math.h) of x[total] in shared memory, blocks of rot
 * (total a multiple of rot). Every thread of the block must call it; it
 * starts and ends with the data visible to the whole block (the caller
 * syncs before). */
__device__ __forceinline__ void spx_kvq4_fwht_smem(float *x, int total, int rot) {
    for (int h = 1; h < rot; h *= 2) {
        for (int j = threadIdx.x; j < total / 2; j += blockDim.x) spx_kvq4_butterfly(x, spx_kvq4_pair(j, h), h);
        __syncthreads();
    }
    const float sc = spx_kvq4_rot_scale(rot);
    for (int i = threadIdx.x; i < total; i += blockDim.x) x[i] = SPX_KQ_MUL(x[i], sc);
    __syncthreads();
}

/* The same FWHT of one row of 32 ND values held by a warp, lane l owning
 * values ND l .. ND l + ND - 1 (v), for rot == 32 ND: stages h < ND inside
 * the lane, then h = ND d across lanes l and l ^ d by shuffles; the lower
 * lane of a pair keeps a + b, the upper a - b, with a the lower value, as
 * spx_kvq4_butterfly does, and the same final factor: the CPU's values bit
 * for bit, with no shared memory and no block barrier (the smem form costs
 * log2(rot) + 1 of them per call). */
template <int ND> __device__ __forceinline__ void spx_kvq4_fwht_warp(float (&v)[ND], float sc) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int h = 1; h < ND; h *= 2)
#pragma unroll
        for (int e = 0; e < ND; e++)
            if (!(e & h)) {
                const float a = v[e], b = v[e + h];
                v[e] = SPX_KQ_ADD(a, b);
                v[e + h] = SPX_KQ_SUB(a, b);
            }
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
        const bool up = (lane & d) != 0;
#pragma unroll
        for (int e = 0; e < ND; e++) {
            const float o = __shfl_xor_sync(0xffffffffu, v[e], d);
            v[e] = up ? SPX_KQ_SUB(o, v[e]) : SPX_KQ_ADD(v[e], o);
        }
    }
#pragma unroll
    for (int e = 0; e < ND; e++) v[e] = SPX_KQ_MUL(v[e], sc);
}

/* Sets group G's zero nibble in one position's zero bytes (other groups'
 * nibbles, possibly another head's, written by other blocks, are left as
 * they are: 32-bit atomics on the word holding the byte). The last group
 * of an odd count also clears the unused high nibble, as the CPU's memset. */
__device__ __forceinline__ void spx_kvq4_put_zero(uint8_t *zrow, int G, int n_groups, int z) {
    const uintptr_t ad = (uintptr_t)(zrow + (G >> 1));
    unsigned *w = (unsigned *)(ad & ~(uintptr_t)3);
    int sh;
    const unsigned clear = spx_kvq4_zero_clear(G, n_groups, (int)(ad & 3), &sh);
    atomicAnd(w, ~clear);
    atomicOr(w, (unsigned)z << sh);
}

/* One warp quantizes a group by kvq4_math.h's rule: lane i holds value i
 * (already rotated); min/max by shuffles (exact). Returns, in lanes < 16,
 * the code byte of values i (low nibble) and i + 16 (high), as the cache
 * stores it; *sb and *z get the scale's fp16 bits and the zero point
 * (every lane). */
__device__ __forceinline__ unsigned spx_kvq4_quant_group(float w, uint16_t *sb, int *z) {
    float mn = w, mx = w;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
    *sb = spx_kvq4_scale_bits(mn, mx);
    const float s = spx_kvq4_f16_val(*sb);
    *z = spx_kvq4_zero(mn, s);
    const int q = spx_kvq4_code(w, s, *z);
    const int qh = __shfl_down_sync(0xffffffffu, q, 16);
    return (unsigned)(q | (qh << 4)) & 0xffu;
}

/* Group G of row `pos` of the cache: the code bytes (lanes < 16: byte
 * `lane` of the group), the scale bits and the zero point. */
__device__ __forceinline__ void spx_kvq4_put_group(const spx_kvq4 &c, int64_t pos, int kvd, int G, unsigned byte,
                                                   uint16_t sb, int z, int lane) {
    const int ng = kvd / SPX_KVQ4_GROUP;
    if (lane < 16) c.codes[pos * (kvd / 2) + (int64_t)G * 16 + lane] = (uint8_t)byte;
    if (lane == 0) {
        c.scales[pos * ng + G] = __ushort_as_half(sb);
        spx_kvq4_put_zero(c.zeros + pos * ((ng + 1) / 2), G, ng, z);
    }
}

/* One warp quantizes group G of row `pos` (lane i holds value i, already
 * rotated) and stores it. */
__device__ __forceinline__ void spx_kvq4_store_group(const spx_kvq4 &c, int64_t pos, int kvd, int G, float w,
                                                     int lane) {
    uint16_t sb;
    int z;
    const unsigned byte = spx_kvq4_quant_group(w, &sb, &z);
    spx_kvq4_put_group(c, pos, kvd, G, byte, sb, z, lane);
}

/* A 4-bit code (0..15) as float without an I2F: 2^23 + n - 2^23, exact. */
__device__ __forceinline__ float spx_kvq4_nib(unsigned n) {
    return __uint_as_float(0x4b000000u | n) - 8388608.0f;
}

/* Byte j of n (a code, 0..15, in each byte) the same way, by one byte
 * permute into 0x4b0000nn: four codes from one word without shifts. */
__device__ __forceinline__ float spx_kvq4_nib_at(unsigned n, int j) {
    return __uint_as_float(__byte_perm(n, 0x4b000000u, 0x7540 | j)) - 8388608.0f;
}

#endif
