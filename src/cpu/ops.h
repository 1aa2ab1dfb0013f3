/* ops.h: the scalar CPU reference operations. Every faster kernel (SIMD,
 * CUDA) is checked against these. Shapes are given as comments:
 * x[T, n] means T rows of n floats, row-major. */
#ifndef SPX_CPU_OPS_H
#define SPX_CPU_OPS_H

#include "core/pool.h"
#include "model/wmat.h"
#include <stdint.h>

/* y[T, W.rows] = x[T, W.cols] * W^T (+ bias[W.rows] if non-NULL).
 * scratch: spx_pool_size(pool) * W.cols floats (one converted row per
 * thread; a matrix is never dequantized whole). Split across threads by
 * output rows. */
void spx_cpu_matmul(spx_pool *pool, const spx_wmat *w, const float *x, int64_t T,
                    float *y, const float *bias, float *scratch);

/* out[n] = x[n] / sqrt(mean(x^2) + eps) * gain[n]; out may alias x. */
void spx_cpu_rmsnorm(float *out, const float *x, const float *gain, int64_t n, float eps);

/* RoPE, HF rotate_half convention: element i pairs with i + d/2, angle
 * pos * inv_freq[i]. x[n_heads, d] rotated in place. */
void spx_cpu_rope(float *x, int64_t n_heads, int64_t d, int64_t pos, const float *inv_freq);

/* gate[n] = silu(gate[n]) * up[n] */
void spx_cpu_silu_mul(float *gate, const float *up, int64_t n);

/* In-place softmax of x[n]. */
void spx_cpu_softmax(float *x, int64_t n);

float spx_cpu_dot(const float *a, const float *b, int64_t n);

#endif
