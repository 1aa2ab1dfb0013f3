/* attn_avx512.c: the avx512 table's attention steps over the KV cache
 * (qkernels.h: scores_f16, wv_f16 for the fp16 cache, dot_q4g, axpy_q4g
 * for the 4-bit cache's groups, and softmax); the quantized GEMV / GEMM
 * of the same table is qkernels_avx512.c. Same invariants as the AVX2
 * ones (attn_avx2.c): a head's numbers do not depend on G, nor on where
 * its rows fall in a block; tails go through masked loads and stores of
 * the same arithmetic, never through a different order. */
#include "cpu/qkernels_avx512.h"

#if defined(__x86_64__) || defined(__i386__)
#include <math.h>
#include <stdint.h>

/* Lanes [0, r) of a 16-lane mask, r in 0..16. */
AVX512_INLINE __mmask16 lanes16(int64_t r) { return (__mmask16)(r >= 16 ? 0xffffu : (1u << r) - 1u); }

/* 16 halves converted: a whole chunk (the load folds into the convert),
 * or the first lanes of m (the others read nothing and are 0). */
AVX512_INLINE __m512 cvt16(const uint16_t *h) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)); }
AVX512_INLINE __m512 cvt16m(__mmask16 m, const uint16_t *h) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h)); }

/* The sixteen lanes of each of a[0..15] summed, in one transposing tree:
 * lane k of the result is a[k]'s sum, and every a[k], whatever slot it is
 * in, goes through the same pairing: lane e of a[k] meets e + 8, then
 * e + 4, e + 2, e + 1, i.e.
 * (((x0 + x8) + (x4 + x12)) + ((x2 + x10) + (x6 + x14))) +
 * (((x1 + x9) + (x5 + x13)) + ((x3 + x11) + (x7 + x15))).
 * No lane of one slot is ever added to another slot's, so unused (zero)
 * slots change nothing. The tree leaves slot 4m + k's sum in lane 4k + m,
 * so the inputs are taken in that transposed order: b[s] = a[T(s)] with
 * T(4m + k) = 4k + m (T is its own inverse). */
AVX512_INLINE __m512 hsum16x16(const __m512 *a) {
    __m512 t[8], v[4];
    #pragma GCC unroll 8
    for (int s = 0; s < 8; s++) { /* 256-bit halves: [b(2s) 8 partials | b(2s+1) 8 partials] */
        const __m512 x = a[4 * ((2 * s) % 4) + (2 * s) / 4], y = a[4 * ((2 * s + 1) % 4) + (2 * s + 1) / 4];
        t[s] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xee));
    }
    #pragma GCC unroll 4
    for (int u = 0; u < 4; u++) /* 128-bit lane m: b(4u + m)'s 4 partials */
        v[u] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * u], t[2 * u + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * u], t[2 * u + 1], 0xdd));
    /* 64-bit pairs within each lane: w0 lane m = [b(m) x2, b(4 + m) x2], w1 the same for b(8 + m), b(12 + m) */
    const __m512d v0 = _mm512_castps_pd(v[0]), v1 = _mm512_castps_pd(v[1]);
    const __m512d v2 = _mm512_castps_pd(v[2]), v3 = _mm512_castps_pd(v[3]);
    const __m512 w0 = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(v0, v1)), _mm512_castpd_ps(_mm512_unpackhi_pd(v0, v1)));
    const __m512 w1 = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(v2, v3)), _mm512_castpd_ps(_mm512_unpackhi_pd(v2, v3)));
    /* lane m, element k: b(4k + m) */
    return _mm512_add_ps(_mm512_shuffle_ps(w0, w1, 0x88), _mm512_shuffle_ps(w0, w1, 0xdd));
}

/* Scores of GC heads (1..4) over R rows (GC R <= 16) from row i: slot
 * g R + r accumulates head g's products with row i + r, lane e holding
 * columns e, e + 16, ... in column order (d % 16 columns last, through a
 * masked chunk: the missing lanes add 0 q times 0 k); each row's 16
 * halves are converted once for the GC heads; hsum16x16 reduces all
 * slots at once. A block past the last row (n - i < R) reads row n - 1
 * in the missing slots and stores only the real ones. So a score is one
 * fixed sequence of operations on its head's q and its row, whatever GC,
 * R and the row's place in the block. Head g's lanes g R .. g R + R - 1
 * are moved down to 0 .. R - 1 by one permute and stored under the mask
 * of the real rows. */
AVX512_INLINE void scores_block(const int GC, const int R, const float *qg, int64_t qs, const uint16_t *h,
                                int64_t stride, int64_t i, int64_t n, int64_t d, __m512 vs, float *og, int64_t os) {
    __m512 a[16];
    const uint16_t *r[16];
    #pragma GCC unroll 16
    for (int k = 0; k < 16; k++) a[k] = _mm512_setzero_ps();
    #pragma GCC unroll 16
    for (int k = 0; k < R; k++) r[k] = h + (i + k < n ? i + k : n - 1) * stride;
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
        __m512 qv[4];
        #pragma GCC unroll 4
        for (int g = 0; g < GC; g++) qv[g] = _mm512_loadu_ps(qg + g * qs + j);
        #pragma GCC unroll 16
        for (int k = 0; k < R; k++) {
            const __m512 kv = cvt16(r[k] + j);
            #pragma GCC unroll 4
            for (int g = 0; g < GC; g++) a[g * R + k] = _mm512_fmadd_ps(qv[g], kv, a[g * R + k]);
        }
    }
    if (j < d) {
        const __mmask16 m = lanes16(d - j);
        __m512 qv[4];
        #pragma GCC unroll 4
        for (int g = 0; g < GC; g++) qv[g] = _mm512_maskz_loadu_ps(m, qg + g * qs + j);
        #pragma GCC unroll 16
        for (int k = 0; k < R; k++) {
            const __m512 kv = cvt16m(m, r[k] + j);
            #pragma GCC unroll 4
            for (int g = 0; g < GC; g++) a[g * R + k] = _mm512_fmadd_ps(qv[g], kv, a[g * R + k]);
        }
    }
    const __m512 s = _mm512_mul_ps(hsum16x16(a), vs);
    const __mmask16 mv = lanes16(n - i < R ? n - i : R);
    _mm512_mask_storeu_ps(og + i, mv, s);
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    #pragma GCC unroll 4
    for (int g = 1; g < GC; g++) {
        const __m512 sg = _mm512_permutexvar_ps(_mm512_add_epi32(iota, _mm512_set1_epi32(g * R)), s);
        _mm512_mask_storeu_ps(og + g * os + i, mv, sg);
    }
}

/* Heads in groups of up to 4 (the rows converted once per group); the
 * block height fills the 16 slots: 16 rows for one head, 8 for two, 5
 * for three, 4 for four. The rows past the last whole block go in blocks
 * of 4 rows for one head, 2 for two, 1 for three or four, so the last
 * block repeats at most 3 rows' work (its slots past row n - 1). */
AVX512_FN void spx_avx512_scores_f16(const float *q, int64_t qs, int G, const uint16_t *h, int64_t stride,
                                     int64_t n, int64_t d, float scale, float *out, int64_t os) {
    const __m512 vs = _mm512_set1_ps(scale);
    for (int g0 = 0; g0 < G; g0 += 4) {
        const int gc = G - g0 < 4 ? G - g0 : 4;
        const float *qg = q + g0 * qs;
        float *og = out + g0 * os;
        int64_t i = 0;
        switch (gc) {
        case 1:
            for (; i + 16 <= n; i += 16) scores_block(1, 16, qg, qs, h, stride, i, n, d, vs, og, os);
            for (; i < n; i += 4) scores_block(1, 4, qg, qs, h, stride, i, n, d, vs, og, os);
            break;
        case 2:
            for (; i + 8 <= n; i += 8) scores_block(2, 8, qg, qs, h, stride, i, n, d, vs, og, os);
            for (; i < n; i += 2) scores_block(2, 2, qg, qs, h, stride, i, n, d, vs, og, os);
            break;
        case 3:
            for (; i + 5 <= n; i += 5) scores_block(3, 5, qg, qs, h, stride, i, n, d, vs, og, os);
            for (; i < n; i++) scores_block(3, 1, qg, qs, h, stride, i, n, d, vs, og, os);
            break;
        default:
            for (; i + 4 <= n; i += 4) scores_block(4, 4, qg, qs, h, stride, i, n, d, vs, og, os);
            for (; i < n; i++) scores_block(4, 1, qg, qs, h, stride, i, n, d, vs, og, os);
            break;
        }
    }
}

/* Columns [c0, c0 + 16 C) of GC heads held in registers (a[g C + c])
 * across all n rows; each row's C chunks converted once for the heads,
 * one broadcast of each head's probability per row. Every output is
 * fma(p_i, v_ij, out_j) over the rows in order, starting from out_j: the
 * same operations whatever C, GC and the column's block. */
AVX512_INLINE void wv_pass(const int GC, const int C, float *og, int64_t os, const float *pg, int64_t ps,
                           const uint16_t *h, int64_t stride, int64_t n, int64_t c0) {
    __m512 a[16];
    #pragma GCC unroll 4
    for (int g = 0; g < GC; g++)
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++) a[g * C + c] = _mm512_loadu_ps(og + g * os + c0 + 16 * c);
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *r = h + i * stride + c0;
        __m512 v[8];
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++) v[c] = cvt16(r + 16 * c);
        #pragma GCC unroll 4
        for (int g = 0; g < GC; g++) {
            const __m512 pb = _mm512_set1_ps(pg[g * ps + i]);
            #pragma GCC unroll 8
            for (int c = 0; c < C; c++) a[g * C + c] = _mm512_fmadd_ps(pb, v[c], a[g * C + c]);
        }
    }
    #pragma GCC unroll 4
    for (int g = 0; g < GC; g++)
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++) _mm512_storeu_ps(og + g * os + c0 + 16 * c, a[g * C + c]);
}

/* The last d % 16 columns from c0: one masked chunk, the same fma chain
 * per column (the masked lanes load and store nothing). */
AVX512_INLINE void wv_tail(const int GC, float *og, int64_t os, const float *pg, int64_t ps, const uint16_t *h,
                           int64_t stride, int64_t n, int64_t c0, __mmask16 m) {
    __m512 a[4];
    #pragma GCC unroll 4
    for (int g = 0; g < GC; g++) a[g] = _mm512_maskz_loadu_ps(m, og + g * os + c0);
    for (int64_t i = 0; i < n; i++) {
        const __m512 v = cvt16m(m, h + i * stride + c0);
        #pragma GCC unroll 4
        for (int g = 0; g < GC; g++) a[g] = _mm512_fmadd_ps(_mm512_set1_ps(pg[g * ps + i]), v, a[g]);
    }
    #pragma GCC unroll 4
    for (int g = 0; g < GC; g++) _mm512_mask_storeu_ps(og + g * os + c0, m, a[g]);
}

/* One group of GC heads over all columns: passes of CMAX chunks (8 for
 * one or two heads, 4 for three or four: at most 16 accumulators beside
 * the converted row), then what is left of the whole chunks in passes of
 * 4, 2, 1, then the masked tail. */
AVX512_INLINE void wv_heads(const int GC, const int CMAX, float *og, int64_t os, const float *pg, int64_t ps,
                            const uint16_t *h, int64_t stride, int64_t n, int64_t d) {
    const int64_t d16 = d / 16 * 16;
    int64_t c0 = 0;
    for (; c0 + 16 * CMAX <= d16; c0 += 16 * CMAX) wv_pass(GC, CMAX, og, os, pg, ps, h, stride, n, c0);
    if (CMAX > 4 && c0 + 64 <= d16) {
        wv_pass(GC, 4, og, os, pg, ps, h, stride, n, c0);
        c0 += 64;
    }
    if (c0 + 32 <= d16) {
        wv_pass(GC, 2, og, os, pg, ps, h, stride, n, c0);
        c0 += 32;
    }
    if (c0 < d16) {
        wv_pass(GC, 1, og, os, pg, ps, h, stride, n, c0);
        c0 += 16;
    }
    if (d16 < d) wv_tail(GC, og, os, pg, ps, h, stride, n, d16, lanes16(d - d16));
}

AVX512_FN void spx_avx512_wv_f16(float *out, int64_t os, const float *p, int64_t ps, int G, const uint16_t *h,
                                 int64_t stride, int64_t n, int64_t d) {
    for (int g0 = 0; g0 < G; g0 += 4) {
        const int gc = G - g0 < 4 ? G - g0 : 4;
        float *og = out + g0 * os;
        const float *pg = p + g0 * ps;
        switch (gc) {
        case 1: wv_heads(1, 8, og, os, pg, ps, h, stride, n, d); break;
        case 2: wv_heads(2, 8, og, os, pg, ps, h, stride, n, d); break;
        case 3: wv_heads(3, 4, og, os, pg, ps, h, stride, n, d); break;
        default: wv_heads(4, 4, og, os, pg, ps, h, stride, n, d); break;
        }
    }
}

/* One 4-bit group: its 16 bytes widened to 16 dwords once, then codes
 * 0..15 (low nibbles) and 16..31 (high nibbles) as two float vectors. */
AVX512_INLINE void q4g_codes(const uint8_t *cd, __m512 *lo, __m512 *hi) {
    const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)cd));
    *lo = _mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(15)));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
}

/* Per head lane k holds c_k q_k + c_(k+16) q_(k+16) (one product
 * rounded, the other fused), then the 16 lanes are summed: lane e + lane
 * e + 8, then adjacent lanes, then pairs, then the two 128-bit halves.
 * Each head on its own (the codes widened once for all G), so a head's
 * sum does not depend on G. A transposing tree over 4 heads (as
 * scores_f16's) was tried: its cross-lane shuffles cost more than this
 * whole group's dot. */
AVX512_FN void spx_avx512_dot_q4g(const float *q, int64_t qs, int G, const uint8_t *cd, float *out) {
    __m512 lo, hi;
    q4g_codes(cd, &lo, &hi);
    for (int g = 0; g < G; g++) {
        const float *qg = q + g * qs;
        const __m512 t = _mm512_fmadd_ps(hi, _mm512_loadu_ps(qg + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(qg)));
        __m256 y = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
        y = _mm256_add_ps(y, _mm256_permute_ps(y, 0xb1));
        y = _mm256_add_ps(y, _mm256_permute_ps(y, 0x4e));
        out[g] = _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1)));
    }
}

/* o_g[k] += a[g] (c_k - z): the codes widened once, c - z exact in
 * float, one fused multiply-add per output. */
AVX512_FN void spx_avx512_axpy_q4g(float *o, int64_t os, const float *a, int G, int z, const uint8_t *cd) {
    __m512 lo, hi;
    q4g_codes(cd, &lo, &hi);
    const __m512 vz = _mm512_set1_ps((float)z);
    lo = _mm512_sub_ps(lo, vz);
    hi = _mm512_sub_ps(hi, vz);
    for (int g = 0; g < G; g++) {
        const __m512 va = _mm512_set1_ps(a[g]);
        float *og = o + g * os;
        _mm512_storeu_ps(og, _mm512_fmadd_ps(va, lo, _mm512_loadu_ps(og)));
        _mm512_storeu_ps(og + 16, _mm512_fmadd_ps(va, hi, _mm512_loadu_ps(og + 16)));
    }
}

/* e^x for x <= 0 (attention scores minus their maximum): exp256_nonpos's
 * Cephes expf, n = round(x log2 e), r = x - n ln 2 in two parts, the
 * degree-6 polynomial, then p 2^n by scalef (the same product as AVX2's
 * exponent bits over the range used; larger x overflow to inf rather than
 * being clamped); 0 below -87.33 (expf's normal range ends there: such
 * terms are below 2^-126 of the largest, which is 1), -inf included. A
 * NaN passes through every step (the keep mask is unordered-true). */
AVX512_INLINE __m512 exp512_nonpos(__m512 x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_NLT_UQ);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* spx_cpu_softmax's steps with exp512_nonpos: the maximum, e^(x - max)
 * summed in double (two 8-lane accumulators), one scale by the float
 * reciprocal. The n % 16 tail through masked loads and stores: its
 * missing lanes are -inf for the maximum and e^-inf = 0 for the sum. A
 * NaN input makes the sum NaN, so every output is NaN. */
AVX512_FN void spx_avx512_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const int64_t n16 = n / 16 * 16;
    const __mmask16 mt = lanes16(n - n16);
    __m512 mv = ninf;
    for (int64_t i = 0; i < n16; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
    if (n16 < n) mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(ninf, mt, x + n16));
    const __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < n16; i += 16) {
        const __m512 e = exp512_nonpos(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    if (n16 < n) {
        const __m512 e = exp512_nonpos(_mm512_mask_sub_ps(ninf, mt, _mm512_maskz_loadu_ps(mt, x + n16), vm));
        _mm512_mask_storeu_ps(x + n16, mt, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    const __m512 inv = _mm512_set1_ps((float)(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(s0, s1))));
    for (int64_t i = 0; i < n16; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
    if (n16 < n) _mm512_mask_storeu_ps(x + n16, mt, _mm512_mul_ps(_mm512_maskz_loadu_ps(mt, x + n16), inv));
}

#endif
