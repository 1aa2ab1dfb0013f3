/* kvq4_math.h: the numbers of the 4-bit KV cache (engine/kvcache.c, the
 * MINMAX rule of quant/g32.h with 4 bits, groups of 32, and a Walsh-Hadamard
 * rotation) written once for the C compiler and for nvcc (host + device),
 * so the CUDA store and attention (src/cuda/kvq4.cuh, rope.cu,
 * attention_q4.cu) compute exactly what the CPU computes, and
 * tests/test_kvcache.c checks this very code against kvcache.c on the CPU.
 *
 * Per group of 32 values w (after the rotation):
 *   s32 = max((wmax - wmin) / 15, 1e-8)   float32, then fp16 (RNE), inf ->
 *         65504, 0 -> 2^-24 (g32.h)
 *   z   = clamp(round(-wmin / s), 0, 15), q = clamp(round(w / s + z), 0, 15)
 * round = half away from zero, as g32.c's round_clamp. On the device the
 * divisions, sums and products are the _rn intrinsics, so nvcc cannot fuse
 * or reorder them: the same float operations in the same order as the CPU,
 * hence bit-identical codes, scales and zeros for bit-identical inputs.
 *
 * Rotation: an orthonormal FWHT over blocks of `rot` values, rot = the
 * largest power of two dividing head_dim, at most 256; rows with kvd > 8192
 * are stored unrotated (kvcache.c), which is rot = 1 here. Stage h = 1, 2,
 * .., rot/2 pairs x[i0] and x[i0 + h], i0 = spx_kvq4_pair(j, h) for every
 * j < len/2 (the pairs of a stage are independent: any order, or all in
 * parallel, gives the CPU's loop nest's result bit for bit), then every
 * value is multiplied by 1/sqrtf(rot).
 *
 * Device layout of one layer's K (or V) cache, spx_kvq4_layout: the CPU
 * row (kvd/2 code bytes, kvd/32 fp16 scales, (kvd/32 + 1)/2 zero bytes)
 * split into three planes, codes [n_ctx, kvd/2], scales [n_ctx, kvd/32],
 * zeros [n_ctx, zrow], each 256-byte aligned: the same bytes per token as
 * spx_kv_bytes_per_token (plus < 1 KiB per layer of alignment), with 16-byte
 * aligned code groups (a CPU row is only byte aligned: 37 bytes per 64
 * values). The contents of row p of the three planes are byte for byte the
 * CPU's row p. */
#ifndef SPX_CUDA_KVQ4_MATH_H
#define SPX_CUDA_KVQ4_MATH_H

#include "core/half.h"
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define SPX_KQ_FN static __host__ __device__ __forceinline__
#else
#define SPX_KQ_FN static inline
#endif

#ifdef __CUDA_ARCH__
#define SPX_KQ_ADD(a, b) __fadd_rn((a), (b))
#define SPX_KQ_SUB(a, b) __fsub_rn((a), (b))
#define SPX_KQ_MUL(a, b) __fmul_rn((a), (b))
#define SPX_KQ_DIV(a, b) __fdiv_rn((a), (b))
#define SPX_KQ_SQRT(a) __fsqrt_rn(a)
#else
#define SPX_KQ_ADD(a, b) ((a) + (b))
#define SPX_KQ_SUB(a, b) ((a) - (b))
#define SPX_KQ_MUL(a, b) ((a) * (b))
#define SPX_KQ_DIV(a, b) ((a) / (b))
#define SPX_KQ_SQRT(a) sqrtf(a)
#endif

#define SPX_KVQ4_GROUP 32        /* values per group */
#define SPX_KVQ4_ROT_MAX 256     /* largest Hadamard block */
#define SPX_KVQ4_ROT_KVD_MAX 8192 /* wider rows are stored unrotated */

/* The Hadamard block length kvcache.c uses for this shape (1: none). */
SPX_KQ_FN int spx_kvq4_rot(int64_t head_dim, int64_t kvd) {
    if (kvd > SPX_KVQ4_ROT_KVD_MAX) return 1;
    int r = 1;
    while (r < SPX_KVQ4_ROT_MAX && head_dim % (r * 2) == 0) r *= 2;
    return r;
}

/* First index of pair j (< len/2) in FWHT stage h (a power of two). */
SPX_KQ_FN int spx_kvq4_pair(int j, int h) { return ((j & ~(h - 1)) << 1) | (j & (h - 1)); }

SPX_KQ_FN void spx_kvq4_butterfly(float *x, int i0, int h) {
    float a = x[i0], b = x[i0 + h];
    x[i0] = SPX_KQ_ADD(a, b);
    x[i0 + h] = SPX_KQ_SUB(a, b);
}

/* The final factor 1/sqrtf(rot). */
SPX_KQ_FN float spx_kvq4_rot_scale(int rot) { return SPX_KQ_DIV(1.0f, SPX_KQ_SQRT((float)rot)); }

/* Sequential FWHT of x[len] in blocks of rot (len a multiple of rot): the
 * host reference of the device's parallel version (same pairs, same ops). */
SPX_KQ_FN void spx_kvq4_fwht(float *x, int len, int rot) {
    for (int h = 1; h < rot; h *= 2)
        for (int j = 0; j < len / 2; j++) spx_kvq4_butterfly(x, spx_kvq4_pair(j, h), h);
    float sc = spx_kvq4_rot_scale(rot);
    for (int i = 0; i < len; i++) x[i] = SPX_KQ_MUL(x[i], sc);
}

SPX_KQ_FN uint16_t spx_kvq4_f16_bits(float f) {
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(f));
#else
    return spx_f32_to_f16(f);
#endif
}

SPX_KQ_FN float spx_kvq4_f16_val(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    return spx_f16_to_f32(h);
#endif
}

/* fp16 bits of the group's scale (g32.c: spx_q_scale32 + scale_to_f16). */
SPX_KQ_FN uint16_t spx_kvq4_scale_bits(float wmin, float wmax) {
    float s32 = SPX_KQ_DIV(SPX_KQ_SUB(wmax, wmin), 15.0f);
    if (!(s32 >= 1e-8f)) s32 = 1e-8f;
    uint16_t h = spx_kvq4_f16_bits(s32);
    if (h >= 0x7c00u) h = 0x7bffu;
    if (h == 0) h = 0x0001u;
    return h;
}

/* clamp(round(u), 0, 15), half away from zero; NaN -> 0 (g32.c). */
SPX_KQ_FN int spx_kvq4_round_clamp(float u) {
    if (!(u >= 0.0f)) return 0;
    if (u >= 15.0f) return 15;
    int i = (int)u;
    return i + (SPX_KQ_SUB(u, (float)i) >= 0.5f);
}

SPX_KQ_FN int spx_kvq4_zero(float wmin, float s) { return spx_kvq4_round_clamp(SPX_KQ_DIV(-wmin, s)); }

SPX_KQ_FN int spx_kvq4_code(float w, float s, int z) {
    return spx_kvq4_round_clamp(SPX_KQ_ADD(SPX_KQ_DIV(w, s), (float)z));
}

/* Zero nibbles: group G's byte is byte ofs (= its address % 4) of a 32-bit
 * little-endian word; the store clears the returned bits of that word and
 * ORs in z << *shift. The last group of an odd count also clears the
 * unused high nibble (the CPU memsets the zeros before setting them). */
SPX_KQ_FN unsigned spx_kvq4_zero_clear(int G, int n_groups, int ofs, int *shift) {
    *shift = ofs * 8 + (G & 1) * 4;
    return (!(G & 1) && G == n_groups - 1 ? 0xffu : 0xfu) << *shift;
}

/* Where the planes of one layer's K (or V) cache lie (bytes from its base). */
typedef struct spx_kvq4_layout {
    size_t codes_off, scales_off, zeros_off, layer_bytes;
    int64_t code_row, scale_row, zero_row; /* bytes, halves, bytes per position */
} spx_kvq4_layout;

SPX_KQ_FN size_t spx_kvq4_align(size_t n) { return (n + 255) & ~(size_t)255; }

SPX_KQ_FN spx_kvq4_layout spx_kvq4_layout_of(int64_t n_ctx, int64_t kvd) {
    spx_kvq4_layout l;
    l.code_row = kvd / 2;
    l.scale_row = kvd / SPX_KVQ4_GROUP;
    l.zero_row = (kvd / SPX_KVQ4_GROUP + 1) / 2;
    l.codes_off = 0;
    l.scales_off = spx_kvq4_align((size_t)n_ctx * (size_t)l.code_row);
    l.zeros_off = l.scales_off + spx_kvq4_align((size_t)n_ctx * (size_t)l.scale_row * 2);
    /* + 4: the device sets zero nibbles with 32-bit atomics on the word
     * holding them, which may end past the last byte */
    l.layer_bytes = l.zeros_off + spx_kvq4_align((size_t)n_ctx * (size_t)l.zero_row + 4);
    return l;
}

#endif
