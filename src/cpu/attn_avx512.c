/* attn_avx512.c: the avx512 table's attention steps (qkernels.h).
 * PLACEHOLDER while the AVX-512 versions are written: the AVX2 ones. */
#include "cpu/qkernels_avx512.h"
#include "cpu/qkernels_avx2.h"

#if defined(__x86_64__) || defined(__i386__)
void spx_avx512_scores_f16(const float *q, int64_t qs, int G, const uint16_t *h, int64_t stride, int64_t n,
                           int64_t d, float scale, float *out, int64_t os) {
    spx_avx2_scores_f16(q, qs, G, h, stride, n, d, scale, out, os);
}
void spx_avx512_wv_f16(float *out, int64_t os, const float *p, int64_t ps, int G, const uint16_t *h,
                       int64_t stride, int64_t n, int64_t d) {
    spx_avx2_wv_f16(out, os, p, ps, G, h, stride, n, d);
}
void spx_avx512_dot_q4g(const float *q, int64_t qs, int G, const uint8_t *codes, float *out) {
    spx_avx2_dot_q4g(q, qs, G, codes, out);
}
void spx_avx512_axpy_q4g(float *o, int64_t os, const float *a, int G, int z, const uint8_t *codes) {
    spx_avx2_axpy_q4g(o, os, a, G, z, codes);
}
void spx_avx512_softmax(float *x, int64_t n) { spx_avx2_softmax(x, n); }
#endif
