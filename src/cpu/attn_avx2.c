/* attn_avx2.c: the AVX2 table's attention steps over the KV cache
 * (qkernels.h: scores_f16, wv_f16 for the fp16 cache, dot_q4g, axpy_q4g
 * for the 4-bit cache's groups, and softmax); the quantized GEMV / GEMM
 * of the same table is qkernels_avx2.c. */
#include "cpu/qkernels_avx2.h"

#if defined(__x86_64__) || defined(__i386__)
#include <math.h>
#include <stdint.h>

/* The fp16 KV cache's attention steps: 8 halves per F16C convert, four
 * FMA chains for the dot (one horizontal sum per row), one FMA per 8 for
 * the axpy; a short tail as the scalar table does it. */
AVX2_FN static float avx2_dot_f16(const float *q, const uint16_t *h, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j))), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 8), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j + 8))), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 16), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j + 16))), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 24), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j + 24))), a3);
    }
    for (; j + 8 <= n; j += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j))), a0);
    float d = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; j < n; j++) d += q[j] * _cvtsh_ss(h[j]);
    return d;
}

AVX2_FN static void avx2_axpy_f16(float *out, float a, const uint16_t *h, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(out + j, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j))),
                                                  _mm256_loadu_ps(out + j)));
    for (; j < n; j++) out[j] += a * _cvtsh_ss(h[j]);
}

/* The eight lanes of each of a[0..7] summed, in one transposing hadd
 * tree: lane k = ((a_k[0] + a_k[1]) + (a_k[2] + a_k[3])) + ((a_k[4] +
 * a_k[5]) + (a_k[6] + a_k[7])), whatever a_k stands for (a single row's
 * horizontal sum costs as much as its whole dot product at d = 64). */
AVX2_INLINE __m256 hsum8x8(const __m256 *a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    /* u0 = [sums 0-3, lanes 0-3 | sums 0-3, lanes 4-7], u1 the same for 4-7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Scores of up to 4 heads (gc) over rows in pairs: each row's 8 halves
 * converted once for all heads, accumulators a[2 g + r] (head g, row i +
 * r) with each lane's products in column order, then hsum8x8: the same
 * numbers as one head's 8-row blocks. Rows past the last whole block of 8
 * (and every row when d % 8 != 0) go through avx2_dot_f16, as one head's
 * would, so a head's scores do not depend on G. */
AVX2_FN void spx_avx2_scores_f16(const float *q, int64_t qs, int G, const uint16_t *h, int64_t stride, int64_t n,
                                    int64_t d, float scale, float *out, int64_t os) {
    const int64_t n8 = d % 8 == 0 ? n / 8 * 8 : 0;
    const __m256 vs = _mm256_set1_ps(scale);
    for (int g0 = 0; g0 < G; g0 += 4) {
        const int gc = G - g0 < 4 ? G - g0 : 4;
        const float *qg = q + g0 * qs;
        float *og = out + g0 * os;
        for (int64_t i = 0; i < n8; i += 2) {
            __m256 a[8];
            for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
            const uint16_t *r0 = h + i * stride, *r1 = r0 + stride;
            for (int64_t j = 0; j < d; j += 8) {
                const __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r0 + j)));
                const __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r1 + j)));
                #pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    if (g >= gc) break;
                    const __m256 qv = _mm256_loadu_ps(qg + g * qs + j);
                    a[2 * g] = _mm256_fmadd_ps(qv, k0, a[2 * g]);
                    a[2 * g + 1] = _mm256_fmadd_ps(qv, k1, a[2 * g + 1]);
                }
            }
            float t[8];
            _mm256_storeu_ps(t, _mm256_mul_ps(hsum8x8(a), vs));
            for (int g = 0; g < gc; g++) {
                og[g * os + i] = t[2 * g];
                og[g * os + i + 1] = t[2 * g + 1];
            }
        }
        for (int g = 0; g < gc; g++)
            for (int64_t i = n8; i < n; i++) og[g * os + i] = avx2_dot_f16(qg + g * qs, h + i * stride, d) * scale;
    }
}

/* For up to 4 heads at a time: 16 output columns per head held in
 * registers across all rows, each row's 16 halves converted once for the
 * heads; every output's multiply-adds in row order, as one head's
 * 64-column blocks (the columns past the last whole 64, d % 64, go
 * through avx2_axpy_f16 row by row, as one head's), so a head's output
 * does not depend on G. */
AVX2_FN void spx_avx2_wv_f16(float *out, int64_t os, const float *p, int64_t ps, int G, const uint16_t *h,
                                int64_t stride, int64_t n, int64_t d) {
    const int64_t d64 = d / 64 * 64;
    for (int g0 = 0; g0 < G; g0 += 4) {
        const int gc = G - g0 < 4 ? G - g0 : 4;
        float *og = out + g0 * os;
        const float *pg = p + g0 * ps;
        for (int64_t c0 = 0; c0 < d64; c0 += 16) {
            __m256 a[4][2];
            for (int g = 0; g < gc; g++) {
                a[g][0] = _mm256_loadu_ps(og + g * os + c0);
                a[g][1] = _mm256_loadu_ps(og + g * os + c0 + 8);
            }
            for (int64_t i = 0; i < n; i++) {
                const uint16_t *r = h + i * stride + c0;
                const __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)r));
                const __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 8)));
                #pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    if (g >= gc) break;
                    const __m256 pb = _mm256_set1_ps(pg[g * ps + i]);
                    a[g][0] = _mm256_fmadd_ps(pb, v0, a[g][0]);
                    a[g][1] = _mm256_fmadd_ps(pb, v1, a[g][1]);
                }
            }
            for (int g = 0; g < gc; g++) {
                _mm256_storeu_ps(og + g * os + c0, a[g][0]);
                _mm256_storeu_ps(og + g * os + c0 + 8, a[g][1]);
            }
        }
        if (d64 < d)
            for (int g = 0; g < gc; g++)
                for (int64_t i = 0; i < n; i++) avx2_axpy_f16(og + g * os + d64, pg[g * ps + i], h + i * stride + d64, d - d64);
    }
}

/* One 4-bit group: its 32 codes as two vectors of bytes (low nibbles:
 * codes 0..15, high: 16..31) widened to four float vectors. */
AVX2_INLINE void q4g_codes(const uint8_t *cd, __m256 *c0, __m256 *c1, __m256 *c2, __m256 *c3) {
    const __m128i b = _mm_loadu_si128((const __m128i *)cd), m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    *c0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    *c1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    *c2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    *c3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

/* Per head the one-head arithmetic on codes widened once for all G. */
AVX2_FN void spx_avx2_dot_q4g(const float *q, int64_t qs, int G, const uint8_t *cd, float *out) {
    __m256 c0, c1, c2, c3;
    q4g_codes(cd, &c0, &c1, &c2, &c3);
    for (int g = 0; g < G; g++) {
        const float *qg = q + g * qs;
        const __m256 a = _mm256_fmadd_ps(c1, _mm256_loadu_ps(qg + 8), _mm256_mul_ps(c0, _mm256_loadu_ps(qg)));
        const __m256 b = _mm256_fmadd_ps(c3, _mm256_loadu_ps(qg + 24), _mm256_mul_ps(c2, _mm256_loadu_ps(qg + 16)));
        out[g] = hsum_ps(_mm256_add_ps(a, b));
    }
}

AVX2_FN void spx_avx2_axpy_q4g(float *o, int64_t os, const float *a, int G, int z, const uint8_t *cd) {
    __m256 c[4];
    q4g_codes(cd, &c[0], &c[1], &c[2], &c[3]);
    const __m256 vz = _mm256_set1_ps((float)z);
    for (int i = 0; i < 4; i++) c[i] = _mm256_sub_ps(c[i], vz);
    for (int g = 0; g < G; g++) {
        const __m256 va = _mm256_set1_ps(a[g]);
        float *og = o + g * os;
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(og + 8 * i, _mm256_fmadd_ps(va, c[i], _mm256_loadu_ps(og + 8 * i)));
    }
}

/* e^x for x <= 0 (attention scores minus their maximum; larger x are
 * clamped to 88.3): Cephes' expf, n = round(x log2 e), r = x - n ln 2 in
 * two parts, a degree-6 polynomial, 2^n through the exponent bits; 0
 * below -87.33 (where expf leaves the normal range: such terms are below
 * 2^-126 of the largest, which is 1). NaN stays NaN. */
AVX2_INLINE __m256 exp256_nonpos(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ), nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 x0 = x;
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)); /* NaN in x: min returns the constant; restored below */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_andnot_ps(under, y);
    return _mm256_blendv_ps(y, x0, nan);
}

/* spx_cpu_softmax's steps with exp256_nonpos: the maximum, e^(x - max)
 * summed in double (two 4-lane accumulators), one scale by the float
 * reciprocal; the tail of n % 8 through a zero-padded vector. */
AVX2_FN void spx_avx2_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    float mx = hmax_ps(mv);
    for (int64_t k = i; k < n; k++) mx = x[k] > mx ? x[k] : mx;
    const __m256 vm = _mm256_set1_ps(mx);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 e = exp256_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    if (i < n) {
        float t[8];
        const int r = (int)(n - i);
        for (int k = 0; k < 8; k++) t[k] = k < r ? x[i + k] - mx : -INFINITY;
        const __m256 e = exp256_nonpos(_mm256_loadu_ps(t));
        _mm256_storeu_ps(t, e);
        for (int k = 0; k < r; k++) x[i + k] = t[k];
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    const __m256d s = _mm256_add_pd(s0, s1);
    __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    s2 = _mm_add_sd(s2, _mm_unpackhi_pd(s2, s2));
    const __m256 inv = _mm256_set1_ps((float)(1.0 / _mm_cvtsd_f64(s2)));
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; i++) x[i] *= _mm256_cvtss_f32(inv);
}


#endif
