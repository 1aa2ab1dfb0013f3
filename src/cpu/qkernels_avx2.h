/* qkernels_avx2.h: what the AVX2 kernel files share, private to
 * src/cpu: the target attributes, two horizontal reductions, and the
 * attention steps of the AVX2 table that live in attn_avx2.c (their
 * meaning: qkernels.h). x86 only; every function carries the target
 * attribute, so the files build without -mavx2 and nothing here runs
 * unless dispatch (qkernels.c) found AVX2, FMA and F16C. */
#ifndef SPX_QKERNELS_AVX2_H
#define SPX_QKERNELS_AVX2_H

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stdint.h>

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

AVX2_INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_INLINE float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

void spx_avx2_scores_f16(const float *q, int64_t qs, int G, const uint16_t *h, int64_t stride, int64_t n,
                         int64_t d, float scale, float *out, int64_t os);
void spx_avx2_wv_f16(float *out, int64_t os, const float *p, int64_t ps, int G, const uint16_t *h,
                     int64_t stride, int64_t n, int64_t d);
void spx_avx2_dot_q4g(const float *q, int64_t qs, int G, const uint8_t *codes, float *out);
void spx_avx2_axpy_q4g(float *o, int64_t os, const float *a, int G, int z, const uint8_t *codes);
void spx_avx2_softmax(float *x, int64_t n);

#endif
#endif
