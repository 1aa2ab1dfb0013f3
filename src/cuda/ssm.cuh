/* ssm.cuh: the recurrent blocks' device operations, the CUDA counterparts
 * of cpu/ssm.h (same meaning, same layouts) plus the small elementwise
 * steps of the hybrid models' forward pass (engine/forward.c):
 *
 *   conv_causal     depthwise causal convolution with its rolling state
 *                   (LFM2 short conv, Mamba-2's conv before the SSD)
 *   shortconv_gates B *= u inside LFM2's in_proj rows [B | C | u]
 *   mul_rows        out = a * b over rows (LFM2: C * conv(B u))
 *   ssd_step        Mamba-2 selective state update, one token
 *   ssd_scan        the same over T tokens of a prompt, state carried:
 *                   sequential, or chunked for long prompts
 *   rmsnorm_gated   w * groupnorm(y * silu(z))
 *   relu2, swiglu_fused, axpy, scale: the FFN activations, the residual
 *                   add with a multiplier, embed_mult / logits_div
 *
 * Float32 activations and state, device pointers. Every function only
 * enqueues kernels on `st` (no allocation, no synchronization, no host
 * reads of device data), so all of them can be captured in a CUDA graph;
 * each returns cudaGetLastError() after its launch, or
 * cudaErrorInvalidValue (nothing launched) for arguments outside the
 * stated limits. Empty work (n, T, C, ... == 0) launches nothing.
 *
 * Layouts as in cpu/ssm.h: a token's values are contiguous, rows `ld*`
 * floats apart; conv state [C, K-1] oldest first; SSM state [H, P, N]. */
#ifndef SPX_CUDA_SSM_CUH
#define SPX_CUDA_SSM_CUH

#include "cuda/common.cuh"

/* Largest conv kernel width (the window lives in registers, one template
 * instance per width). The models in use have K = 3 (LFM2) or 4 (Mamba-2). */
#define SPX_CU_CONV_MAX_K 8
/* Largest SSM state size N (a lane holds N / 32 state values of a row in
 * registers, 8 at most). Mamba-2 models use 64 or 128. */
#define SPX_CU_SSD_MAX_N 256

/* Depthwise causal convolution, the semantics of spx_cpu_conv_causal:
 * x[t * ldx + c] (t < n, c < C) in, y[t * ldy + c] out, w[C, K], b[C] or
 * NULL, state[C, K-1] (oldest first) updated to the last K-1 inputs;
 * silu != 0 applies silu to each output. y may alias x when ldy == ldx
 * (each channel's input is read before its output is written, by the same
 * thread). Other overlaps (state or w with x / y) are not allowed.
 * 1 <= K <= SPX_CU_CONV_MAX_K. Without silu the outputs equal the CPU's
 * bit for bit (same products and sums, same order, no contraction). */
cudaError_t spx_cu_conv_causal(const float *x, int64_t ldx, int n, int C, const float *w, const float *b, int K,
                               float *state, int silu, float *y, int64_t ldy, cudaStream_t st);

/* LFM2 before the conv: proj rows [B | C | u] of 3H floats (dense, n
 * rows); B[t, i] *= u[t, i] in place. Exact (one product). */
cudaError_t spx_cu_shortconv_gates(float *proj, int n, int H, cudaStream_t st);

/* out[t * ldo + i] = a[t * lda + i] * b[t * ldb + i], t < n, i < H. out may
 * alias a or b with the same stride (each element is read, then written,
 * by one thread). Exact. */
cudaError_t spx_cu_mul_rows(const float *a, int64_t lda, const float *b, int64_t ldb, int n, int H, float *out,
                            int64_t ldo, cudaStream_t st);

/* The SSD's parameters (spx_ssd_args' fields; device pointers [H] each):
 * heads H, head_dim P, state size N, B/C groups G (H % G == 0, head h reads
 * group h / (H / G)); dt = clamp(softplus(dt_raw + dt_bias), dt_lo, dt_hi)
 * (0 and +inf: no clamp). 1 <= N <= SPX_CU_SSD_MAX_N. */
struct spx_cu_ssd {
    int H, P, N, G;
    const float *A_log, *D, *dt_bias;
    float dt_lo, dt_hi;
};

/* One token: x[H*P], dt_raw[H], B[G*N], C[G*N] -> y[H*P]; state[H, P, N]
 * updated in place. y must not overlap the inputs or the state. The same
 * kernel as the sequential spx_cu_ssd_scan, so a prompt fed as steps and
 * as one sequential scan gives bit-identical outputs and state. */
cudaError_t spx_cu_ssd_step(const spx_cu_ssd &a, const float *x, const float *dt_raw, const float *B, const float *C,
                            float *state, float *y, cudaStream_t st);

/* T tokens (a prompt; any T >= 0, the engine calls it with <= 512): token
 * t's x at x + t*ldx, dt at dt_raw + t*ldx, B at B + t*ldx, C at C + t*ldx
 * (views into one in_proj row, as spx_cpu_ssd_chunked), y[t * ldy + h*P +
 * p]; state[H, P, N] carried in and out. y must not overlap the inputs,
 * the state or work.
 *   Sequential (T <= SPX_MEM_SSD_CHUNK of engine/memory.h, or work ==
 *   NULL): one kernel, equal to T calls of spx_cu_ssd_step bit for bit,
 *   and so to any split of the tokens into sequential calls.
 *   Chunked (T > SPX_MEM_SSD_CHUNK and work != NULL): work is device
 *   scratch of work_floats >= spx_mem_ssd_work_floats(H, P, N, T) floats
 *   (else cudaErrorInvalidValue, nothing launched); three kernels, state
 *   passing over chunks (ssm.cu says how and why). Equals T steps within
 *   float32 rounding (tests/cuda/test_cuda_ssm.cu names the bound), the
 *   same bits on every run of the same call.
 * work's contents need not survive between calls. */
cudaError_t spx_cu_ssd_scan(const spx_cu_ssd &a, const float *x, const float *dt_raw, const float *B, const float *C,
                            int64_t ldx, int T, float *state, float *y, int64_t ldy, float *work, size_t work_floats,
                            cudaStream_t st);

/* out[t * n + i] (rows dense) = w[i] * groupnorm(v)[i], v = y[t * ldy + i]
 * * silu(z[t * ldz + i]), groups of gs values (n % gs == 0): v / sqrt(
 * mean(v^2) + eps), the sum of squares in double as the CPU's
 * spx_cpu_rmsnorm_gated. out may alias y when ldy == n; it must not
 * overlap z. */
cudaError_t spx_cu_rmsnorm_gated(float *out, const float *y, int64_t ldy, const float *z, int64_t ldz, const float *w,
                                 int n_tok, int n, int gs, float eps, cudaStream_t st);

/* x = relu(x)^2 in place (x > 0 ? x : 0, squared: a NaN becomes 0, as the
 * CPU's). Exact. */
cudaError_t spx_cu_relu2(float *x, int64_t n, cudaStream_t st);

/* gu rows [gate (I) | up (I)], 2I floats per token -> out[t * I + i] =
 * silu(g) * u, silu(g) = g / (1 + expf(-g)) (the CPU's fused gate_up
 * path). out dense [n_tok, I]; out must not overlap gu. */
cudaError_t spx_cu_swiglu_fused(const float *gu, int n_tok, int I, float *out, cudaStream_t st);

/* h += r * x (the residual add with residual_mult), one product and one
 * sum each, rounded separately as the CPU's (no FMA): bit-identical. */
cudaError_t spx_cu_axpy(float *h, const float *x, int64_t n, float r, cudaStream_t st);

/* x *= s, or x /= s when divide != 0 (logits_div: an IEEE division, not a
 * product with 1/s, so it equals the CPU's bit for bit). */
cudaError_t spx_cu_scale(float *x, int64_t n, float s, int divide, cudaStream_t st);

#endif
