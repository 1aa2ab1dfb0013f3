/* ssm.h: the recurrent blocks' CPU operations: the depthwise causal
 * convolution of short-convolution (LFM2) and Mamba-2 layers, the Mamba-2
 * selective state update (SSD) for one token and its chunked form for a
 * prompt, and the gated grouped RMSNorm that follows it.
 *
 * Meaning (transformers' torch_forward of Mamba2 / GraniteMoeHybrid /
 * NemotronH and Lfm2ShortConv.slow_forward), float32 throughout:
 *
 *   conv: y[t, c] = b[c] + sum_{j<K} w[c, j] * u[t - (K-1) + j, c], where u
 *         is the stored history (the K-1 inputs before this call, zeros
 *         after a reset) followed by this call's inputs; afterwards the
 *         state holds the last K-1 inputs of u.
 *   SSD, per head h (P = head_dim values, N = state size, group g = h /
 *         (H / G) gives B_t, C_t [N]):
 *         dt   = clamp(softplus(dt_raw[t, h] + dt_bias[h]), dt_lo, dt_hi)
 *         a    = exp(dt * A[h]),   A[h] = -exp(A_log[h])
 *         S    = a * S + dt * x_t[h] (outer) B_t         S: [P, N]
 *         y_t[h, p] = sum_n S[p, n] C_t[n] + D[h] x_t[h, p]
 *   chunked: the same outputs and final state for T tokens, computed per
 *         chunk of L tokens as the SSD's quadratic form inside the chunk
 *         plus the carried state across chunks (Mamba-2 paper, section 6).
 *   gated norm: v = y * silu(z); per group of gs values
 *         v = v / sqrt(mean(v^2) + eps); out = w * v.
 *
 * Layouts: a token's values are contiguous; x rows are `ldx` floats apart
 * (so x, B and C may be views into one in_proj output row). The SSM state
 * is [H, P, N] float32, the conv state [C, K-1] float32 (oldest first). */
#ifndef SPX_CPU_SSM_H
#define SPX_CPU_SSM_H

#include <stdint.h>

/* Depthwise causal convolution of n tokens of C channels: x[t * ldx + c]
 * in, y[t * ldy + c] out (y may alias x when ldy == ldx), w[C, K], b[C] or
 * NULL, state[C, K-1] updated. silu != 0 applies silu to each output
 * (Mamba-2's conv is followed by its activation; short conv's is not). */
void spx_cpu_conv_causal(const float *x, int64_t ldx, int64_t n, int64_t C, const float *w, const float *b,
                         int64_t K, float *state, int silu, float *y, int64_t ldy);

typedef struct spx_ssd_args {
    int64_t H, P, N, G;         /* heads, head_dim, state size, B/C groups (H % G == 0) */
    const float *A_log, *D, *dt_bias; /* [H] each */
    float dt_lo, dt_hi;         /* clamp of the softplus'd step (0 and +inf: none) */
} spx_ssd_args;

/* One token: x[H*P], dt_raw[H], B[G*N], C[G*N] -> y[H*P]; state[H, P, N]
 * updated in place. */
void spx_cpu_ssd_step(const spx_ssd_args *a, const float *x, const float *dt_raw, const float *B, const float *C,
                      float *state, float *y);

/* T tokens: token t's x at x + t*ldx, dt at dt + t*ldx, B at B + t*ldx, C at
 * C + t*ldx (one row stride for all four: views into one projection row),
 * y[t * ldy + ...]. chunk: tokens per chunk (>= 1). work: scratch of
 * spx_ssd_chunked_work(a, chunk) floats. Equals T calls of
 * spx_cpu_ssd_step within rounding (tests/test_ssm.c names the bound). */
void spx_cpu_ssd_chunked(const spx_ssd_args *a, const float *x, const float *dt_raw, const float *B, const float *C,
                         int64_t ldx, int64_t T, int64_t chunk, float *state, float *y, int64_t ldy, float *work);
int64_t spx_ssd_chunked_work(const spx_ssd_args *a, int64_t chunk);

/* out[n] = w * groupnorm(y * silu(z)) over groups of gs (n % gs == 0); out
 * may alias y. */
void spx_cpu_rmsnorm_gated(float *out, const float *y, const float *z, const float *w, int64_t n, int64_t gs,
                           float eps);

#endif
