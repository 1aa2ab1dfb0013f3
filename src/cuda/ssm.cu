/* ssm.cu: the recurrent blocks' device operations and the hybrids'
 * elementwise steps (see ssm.cuh for meanings, layouts and limits).
 *
 * Arithmetic follows the CPU reference (cpu/ssm.c, engine/forward.c):
 * expf / log1pf (CUDA's, within 2 and 1 ulp; no fast-math intrinsics),
 * IEEE divisions. Where the CPU's result is a fixed sequence of products
 * and sums (conv, axpy, scale), the kernels use __fmul_rn / __fadd_rn so
 * that nvcc cannot contract them into FMAs, and the results equal the
 * CPU's bit for bit; the SSD and the norm reduce in another order (and
 * fuse), and match within the bounds that tests/cuda/test_cuda_ssm.cu
 * names.
 *
 * Launch shapes:
 *   conv_causal      one thread per channel, 128 per block, walking the n
 *                    tokens with the K-1 window in registers
 *   ssd_step / scan  grid (ceil(P / rows per block), H), 128 threads; W
 *                    lanes per state row (h, p) (W = 32, or the power of
 *                    two >= N below 32), each lane holding the row's
 *                    values n = lane, lane + W, ... in registers
 *   rmsnorm_gated    one block per (token, group), min(256, gs rounded up
 *                    to 32) threads
 *   elementwise      grid-stride loops, 256 threads, <= 65535 blocks */
#include "cuda/ssm.cuh"

#include <limits.h>

__device__ __forceinline__ float spx_silu_f(float v) { return v / (1.0f + expf(-v)); }

static unsigned ew_grid(int64_t n) {
    const int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* ======================================================================
 * Causal convolution
 * ==================================================================== */

/* Channel c's thread: its K weights and the K-1 history values in
 * registers (the window shifts by one register per token), token by token
 * as the CPU: acc = sum_{j<K-1} w[j] win[j] in index order, then + w[K-1]
 * x_t, then + b. x_t is read before y_t is written and no other thread
 * touches channel c, so y == x (same stride) is safe; x and y are
 * therefore not __restrict__ and not read through the read-only cache.
 * Consecutive threads take consecutive channels: each token's row is read
 * and written coalesced. */
template <int K>
__global__ void conv_causal_kernel(const float *x, int64_t ldx, int n, int C, const float *w, const float *b,
                                   float *state, int silu, float *y, int64_t ldy) {
    constexpr int Hk = K - 1;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float wr[K];
#pragma unroll
    for (int j = 0; j < K; j++) wr[j] = w[(int64_t)c * K + j];
    const float bc = b ? b[c] : 0.0f;
    float win[Hk > 0 ? Hk : 1];
#pragma unroll
    for (int j = 0; j < Hk; j++) win[j] = state[(int64_t)c * Hk + j];
    for (int t = 0; t < n; t++) {
        const float v = x[(int64_t)t * ldx + c];
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < Hk; j++) acc = __fadd_rn(acc, __fmul_rn(wr[j], win[j]));
#pragma unroll
        for (int j = 0; j + 1 < Hk; j++) win[j] = win[j + 1];
        if constexpr (Hk > 0) win[Hk - 1] = v;
        acc = __fadd_rn(acc, __fmul_rn(wr[Hk], v));
        if (b) acc = __fadd_rn(acc, bc);
        y[(int64_t)t * ldy + c] = silu ? spx_silu_f(acc) : acc;
    }
#pragma unroll
    for (int j = 0; j < Hk; j++) state[(int64_t)c * Hk + j] = win[j];
}

template <int K>
static cudaError_t conv_launch(const float *x, int64_t ldx, int n, int C, const float *w, const float *b,
                               float *state, int silu, float *y, int64_t ldy, cudaStream_t st) {
    const int threads = 128;
    conv_causal_kernel<K><<<(unsigned)((C + threads - 1) / threads), threads, 0, st>>>(x, ldx, n, C, w, b, state,
                                                                                       silu, y, ldy);
    return cudaGetLastError();
}

cudaError_t spx_cu_conv_causal(const float *x, int64_t ldx, int n, int C, const float *w, const float *b, int K,
                               float *state, int silu, float *y, int64_t ldy, cudaStream_t st) {
    if (n < 0 || C < 0 || K < 1 || K > SPX_CU_CONV_MAX_K) return cudaErrorInvalidValue;
    if (n == 0 || C == 0) return cudaSuccess;
    switch (K) {
    case 1: return conv_launch<1>(x, ldx, n, C, w, b, state, silu, y, ldy, st);
    case 2: return conv_launch<2>(x, ldx, n, C, w, b, state, silu, y, ldy, st);
    case 3: return conv_launch<3>(x, ldx, n, C, w, b, state, silu, y, ldy, st);
    case 4: return conv_launch<4>(x, ldx, n, C, w, b, state, silu, y, ldy, st);
    case 5: return conv_launch<5>(x, ldx, n, C, w, b, state, silu, y, ldy, st);
    case 6: return conv_launch<6>(x, ldx, n, C, w, b, state, silu, y, ldy, st);
    case 7: return conv_launch<7>(x, ldx, n, C, w, b, state, silu, y, ldy, st);
    default: return conv_launch<8>(x, ldx, n, C, w, b, state, silu, y, ldy, st);
    }
}

/* ======================================================================
 * LFM2 gates, row products
 * ==================================================================== */

__global__ void shortconv_gates_kernel(float *proj, int64_t total, int H) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / H, j = i - t * H;
        float *row = proj + t * 3 * (int64_t)H;
        row[j] = row[j] * row[2 * (int64_t)H + j];
    }
}

cudaError_t spx_cu_shortconv_gates(float *proj, int n, int H, cudaStream_t st) {
    if (n < 0 || H < 0) return cudaErrorInvalidValue;
    const int64_t total = (int64_t)n * H;
    if (total == 0) return cudaSuccess;
    shortconv_gates_kernel<<<ew_grid(total), 256, 0, st>>>(proj, total, H);
    return cudaGetLastError();
}

__global__ void mul_rows_kernel(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t total, int H,
                                float *out, int64_t ldo) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / H, j = i - t * H;
        out[t * ldo + j] = a[t * lda + j] * b[t * ldb + j];
    }
}

cudaError_t spx_cu_mul_rows(const float *a, int64_t lda, const float *b, int64_t ldb, int n, int H, float *out,
                            int64_t ldo, cudaStream_t st) {
    if (n < 0 || H < 0) return cudaErrorInvalidValue;
    const int64_t total = (int64_t)n * H;
    if (total == 0) return cudaSuccess;
    mul_rows_kernel<<<ew_grid(total), 256, 0, st>>>(a, lda, b, ldb, total, H, out, ldo);
    return cudaGetLastError();
}

/* ======================================================================
 * SSD: step and scan (one kernel)
 * ==================================================================== */

/* Why a sequential-in-time scan and not the chunked SSD (the Mamba-2
 * matrix form the CPU uses for prompts): correctness first, and it fits
 * the sizes: a call has T <= 512 tokens, and the state, H P N floats, lives
 * in registers for the whole call (read and written once per call, like
 * the chunked form's), so the work per token is the 2 P N multiply-adds
 * of the definition plus one reduction over N per (h, p), with no L^2
 * intra-chunk terms. What it gives up: the T steps are a dependent chain
 * (latency per token: a few FMAs, a log2(W)-step shuffle reduction and
 * the next token's loads, which are prefetched one token ahead), and the
 * arithmetic runs on the FMA units. A chunked form would turn the
 * intra-chunk work (C B^T, the masked decay matrix times x, and the state
 * update sum_s x_s B_s^T) into tensor-core matrix products over chunks of
 * L tokens, with only T / L dependent steps; worth it once prefill of long
 * prompts through Mamba-2 layers is measured to matter.
 *
 * Work split: block (blockIdx.x, h = blockIdx.y) owns rows p of head h,
 * W lanes per row (W divides 32, so a row never straddles warps); the
 * lane ln of a row holds S[p, ln + k W], k < NPL (NPL = ceil(N / W),
 * rounded up to the instance). All 32 lanes of every warp run the whole
 * loop (rows p >= P and values n >= N are predicated off, never branched
 * around), so the full-mask shuffles are legal. dt and exp(dt A) of a
 * tile of tokens are computed once per block into shared memory (the
 * CPU's formula, ssd_dt in cpu/ssm.c). Per token, as the CPU's step:
 *   s = da * S + (dt * x_p) * B_n;  y = sum_n s * C_n + D * x_p
 * (the sum over n as a per-lane partial sum then a butterfly over the W
 * lanes). Each token is processed identically whatever T is, so T calls
 * of one token and any split of a prompt give bit-identical results. */
#define SSD_THREADS 128
#define SSD_TT 256 /* tokens per shared-memory tile of dt, exp(dt A) */

__device__ __forceinline__ float ssd_dt_dev(float raw, float bias, float lo, float hi) {
    const float v = raw + bias;
    float dt = v > 20.0f ? v : log1pf(expf(v));
    if (dt < lo) dt = lo; /* comparisons, not fminf/fmaxf: a NaN stays a NaN, as on the CPU */
    if (dt > hi) dt = hi;
    return dt;
}

template <int NPL>
__global__ void __launch_bounds__(SSD_THREADS) ssd_scan_kernel(spx_cu_ssd a, const float *__restrict__ x,
                                                               const float *__restrict__ dt_raw,
                                                               const float *__restrict__ B,
                                                               const float *__restrict__ C, int64_t ldx, int T,
                                                               float *state, float *y, int64_t ldy, int W) {
    __shared__ float s_dt[SSD_TT], s_da[SSD_TT];
    const int h = blockIdx.y;
    const int rows_pb = SSD_THREADS / W;
    const int ln = threadIdx.x % W;
    const int p = blockIdx.x * rows_pb + threadIdx.x / W;
    const bool row_ok = p < a.P;
    const int N = a.N;
    const int g = h / (a.H / a.G);
    const float A = -expf(__ldg(a.A_log + h));
    const float Dh = __ldg(a.D + h), bias = __ldg(a.dt_bias + h);
    const int64_t hp = (int64_t)h * a.P + (row_ok ? p : 0);
    float *Srow = state + hp * N;
    const float *xr = x + hp, *Bg = B + (int64_t)g * N, *Cg = C + (int64_t)g * N;

    float S[NPL];
#pragma unroll
    for (int k = 0; k < NPL; k++) {
        const int n = ln + k * W;
        S[k] = row_ok && n < N ? Srow[n] : 0.0f;
    }
    /* the next token's inputs, loaded one token ahead */
    float xn = 0.0f, Bn[NPL], Cn[NPL];
#pragma unroll
    for (int k = 0; k < NPL; k++) Bn[k] = Cn[k] = 0.0f;
    auto load = [&](int t) {
        const int64_t o = (int64_t)t * ldx;
        xn = row_ok ? __ldg(xr + o) : 0.0f;
#pragma unroll
        for (int k = 0; k < NPL; k++) {
            const int n = ln + k * W;
            Bn[k] = n < N ? __ldg(Bg + o + n) : 0.0f;
            Cn[k] = n < N ? __ldg(Cg + o + n) : 0.0f;
        }
    };
    load(0);

    for (int t0 = 0; t0 < T; t0 += SSD_TT) {
        const int L = T - t0 < SSD_TT ? T - t0 : SSD_TT;
        __syncthreads(); /* every thread is done reading the previous tile */
        for (int i = threadIdx.x; i < L; i += SSD_THREADS) {
            const float dt = ssd_dt_dev(__ldg(dt_raw + (int64_t)(t0 + i) * ldx + h), bias, a.dt_lo, a.dt_hi);
            s_dt[i] = dt;
            s_da[i] = expf(dt * A);
        }
        __syncthreads();
        for (int i = 0; i < L; i++) {
            const int t = t0 + i;
            const float xv = xn;
            float Bv[NPL], Cv[NPL];
#pragma unroll
            for (int k = 0; k < NPL; k++) Bv[k] = Bn[k], Cv[k] = Cn[k];
            if (t + 1 < T) load(t + 1);
            const float dt = s_dt[i], da = s_da[i];
            const float dtx = dt * xv;
            float acc = 0.0f;
#pragma unroll
            for (int k = 0; k < NPL; k++) {
                if (ln + k * W < N) {
                    const float s = da * S[k] + dtx * Bv[k];
                    S[k] = s;
                    acc += s * Cv[k];
                }
            }
            for (int o = W >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (row_ok && ln == 0) y[(int64_t)t * ldy + hp] = acc + Dh * xv;
        }
    }
#pragma unroll
    for (int k = 0; k < NPL; k++) {
        const int n = ln + k * W;
        if (row_ok && n < N) Srow[n] = S[k];
    }
}

template <int NPL>
static cudaError_t ssd_launch(const spx_cu_ssd &a, const float *x, const float *dt_raw, const float *B,
                              const float *C, int64_t ldx, int T, float *state, float *y, int64_t ldy, int W,
                              cudaStream_t st) {
    const int rows_pb = SSD_THREADS / W;
    const dim3 grid((unsigned)((a.P + rows_pb - 1) / rows_pb), (unsigned)a.H);
    ssd_scan_kernel<NPL><<<grid, SSD_THREADS, 0, st>>>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, W);
    return cudaGetLastError();
}

cudaError_t spx_cu_ssd_scan(const spx_cu_ssd &a, const float *x, const float *dt_raw, const float *B, const float *C,
                            int64_t ldx, int T, float *state, float *y, int64_t ldy, cudaStream_t st) {
    if (a.H < 1 || a.P < 1 || a.N < 1 || a.G < 1 || a.H % a.G != 0 || a.N > SPX_CU_SSD_MAX_N || a.H > 65535 || T < 0)
        return cudaErrorInvalidValue;
    if (T == 0) return cudaSuccess;
    int W = 32; /* lanes per row: 32, or the smallest power of two >= N */
    while (W > 1 && W / 2 >= a.N) W /= 2;
    const int npl = (a.N + W - 1) / W; /* <= 8 by the N limit */
    if (npl <= 1) return ssd_launch<1>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, W, st);
    if (npl <= 2) return ssd_launch<2>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, W, st);
    if (npl <= 4) return ssd_launch<4>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, W, st);
    return ssd_launch<8>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, W, st);
}

cudaError_t spx_cu_ssd_step(const spx_cu_ssd &a, const float *x, const float *dt_raw, const float *B, const float *C,
                            float *state, float *y, cudaStream_t st) {
    /* one token: the row stride is never applied (t = 0 only) */
    return spx_cu_ssd_scan(a, x, dt_raw, B, C, 0, 1, state, y, 0, st);
}

/* ======================================================================
 * Gated RMSNorm
 * ==================================================================== */

/* Block (t, group): pass 1 stores v = y silu(z) into out (read then
 * written by the same thread, so out == y is safe) and sums v^2 in double
 * (the CPU's choice: more accurate than torch's float, and the CPU and
 * device sums then differ only by the double rounding of reordering);
 * r = 1 / sqrt(mean + eps) rounded to float once; pass 2 rereads each
 * thread's own v (program order makes its own writes visible) and stores
 * w (v r) in the CPU's order. */
__global__ void rmsnorm_gated_kernel(float *out, const float *y, int64_t ldy, const float *z, int64_t ldz,
                                     const float *w, int n, int gs, int n_groups, float eps) {
    __shared__ double red[32];
    const int t = blockIdx.x / n_groups, g = blockIdx.x - t * n_groups;
    const int64_t i0 = (int64_t)g * gs;
    const float *yr = y + (int64_t)t * ldy + i0, *zr = z + (int64_t)t * ldz + i0, *wr = w + i0;
    float *orow = out + (int64_t)t * n + i0;
    double ss = 0.0;
    for (int i = threadIdx.x; i < gs; i += blockDim.x) {
        const float v = yr[i] * spx_silu_f(zr[i]);
        orow[i] = v;
        ss += (double)v * v;
    }
    ss = spx_block_sum_d(ss, red);
    const float r = (float)(1.0 / sqrt(ss / (double)gs + (double)eps));
    for (int i = threadIdx.x; i < gs; i += blockDim.x) orow[i] = wr[i] * (orow[i] * r);
}

cudaError_t spx_cu_rmsnorm_gated(float *out, const float *y, int64_t ldy, const float *z, int64_t ldz, const float *w,
                                 int n_tok, int n, int gs, float eps, cudaStream_t st) {
    if (n_tok < 0 || n < 0 || gs < 1 || n % gs != 0) return cudaErrorInvalidValue;
    const int n_groups = n / gs;
    if (n_tok == 0 || n_groups == 0) return cudaSuccess;
    if ((int64_t)n_tok * n_groups > INT_MAX) return cudaErrorInvalidValue;
    /* a multiple of 32 (spx_block_sum_d), no more threads than values */
    const int threads = gs >= 256 ? 256 : (gs + 31) / 32 * 32;
    rmsnorm_gated_kernel<<<(unsigned)(n_tok * n_groups), threads, 0, st>>>(out, y, ldy, z, ldz, w, n, gs, n_groups,
                                                                          eps);
    return cudaGetLastError();
}

/* ======================================================================
 * Elementwise
 * ==================================================================== */

__global__ void relu2_kernel(float *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        const float r = v > 0.0f ? v : 0.0f;
        x[i] = r * r;
    }
}

cudaError_t spx_cu_relu2(float *x, int64_t n, cudaStream_t st) {
    if (n < 0) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    relu2_kernel<<<ew_grid(n), 256, 0, st>>>(x, n);
    return cudaGetLastError();
}

__global__ void swiglu_fused_kernel(const float *__restrict__ gu, int64_t total, int I, float *__restrict__ out) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / I, j = i - t * I;
        const float *row = gu + t * 2 * (int64_t)I;
        const float g = row[j];
        out[i] = g / (1.0f + expf(-g)) * row[I + j];
    }
}

cudaError_t spx_cu_swiglu_fused(const float *gu, int n_tok, int I, float *out, cudaStream_t st) {
    if (n_tok < 0 || I < 0) return cudaErrorInvalidValue;
    const int64_t total = (int64_t)n_tok * I;
    if (total == 0) return cudaSuccess;
    swiglu_fused_kernel<<<ew_grid(total), 256, 0, st>>>(gu, total, I, out);
    return cudaGetLastError();
}

__global__ void axpy_kernel(float *h, const float *x, int64_t n, float r) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        h[i] = __fadd_rn(h[i], __fmul_rn(r, x[i]));
}

cudaError_t spx_cu_axpy(float *h, const float *x, int64_t n, float r, cudaStream_t st) {
    if (n < 0) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    axpy_kernel<<<ew_grid(n), 256, 0, st>>>(h, x, n, r);
    return cudaGetLastError();
}

__global__ void scale_kernel(float *x, int64_t n, float s, int divide) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = divide ? __fdiv_rn(x[i], s) : __fmul_rn(x[i], s);
}

cudaError_t spx_cu_scale(float *x, int64_t n, float s, int divide, cudaStream_t st) {
    if (n < 0) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    scale_kernel<<<ew_grid(n), 256, 0, st>>>(x, n, s, divide);
    return cudaGetLastError();
}
