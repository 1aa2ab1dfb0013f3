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
 *   (sequential)     lanes per state row (h, p) (W = 32, or the power of
 *                    two >= N below 32), each lane holding the row's
 *                    values n = lane, lane + W, ... in registers
 *   chunked scan     step 1: grid (row blocks, H, chunks), up to 128
 *                    threads, a lane holding 4 or 8 rows' shares of the
 *                    state; step 2: the elementwise shape over H P N;
 *                    step 3: grid (ceil(P / 64), H, chunks - 1), 256
 *                    threads, 4 x 4 outputs each
 *   rmsnorm_gated    one block per (token, group), min(256, gs rounded up
 *                    to 32) threads
 *   elementwise      grid-stride loops, 256 threads, <= 65535 blocks */
#include "cuda/ssm.cuh"

#include <limits.h>

extern "C" {
#include "engine/memory.h" /* SPX_MEM_SSD_CHUNK, spx_mem_ssd_work_floats: the scratch, defined once */
}

__device__ __forceinline__ float spx_silu_f(float v) { return spx_silu_dev(v); }

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
 * SSD: step, sequential scan, chunked scan
 * ==================================================================== */

/* Two forms of one recurrence (per head h, row p, state value n):
 *   s = exp(dt A) * S + (dt x_p) * B_n;  y_p = sum_n s * C_n + D * x_p
 *
 * Sequential scan (ssd_scan_kernel): the decode step (T = 1) and prompts
 * of at most L = SPX_MEM_SSD_CHUNK tokens. The state, H P N floats, lives
 * in registers for the whole call (read and written once), so the work
 * per token is the 2 P N multiply-adds of the definition plus one
 * reduction over N per (h, p). Its limit is the chain of T dependent
 * steps per block, and a work split (a warp per row, each loading all of
 * B_t and C_t and reducing over 32 lanes) whose loads and shuffles
 * outnumber the multiply-adds, which matters once the grid outgrows the
 * device.
 *
 * Chunked scan (T > L, with the caller's scratch): state passing over
 * chunks of L tokens, exact in real arithmetic:
 *   1. ssd_chunk_scan_kernel, grid row blocks x heads x chunks: each chunk
 *      runs the recurrence by itself, chunk 0 from the session's state,
 *      the others from zero, writing its outputs (local ones for c > 0) to
 *      y and its end state E[c]; for c > 0 also cum_t, the running product
 *      of the chunk's exp(dt A) up to token t, per head.
 *   2. ssd_chunk_carry_kernel, parallel over (h, p, n), chunks in order:
 *      E[c] = cum_last(c) E[c-1] + E[c] turns each local end state into
 *      the true state after chunk c (E[0] already is one); the last one is
 *      the final state, written to `state`.
 *   3. ssd_chunk_fix_kernel, every token t of every chunk c > 0:
 *      y_t[p] += cum_t sum_n C_t[n] E[c-1][p, n]
 *      (the incoming state's share of the output, which step 1 left out),
 *      as a register-tiled product C_chunk [L, N] x E[c-1]^T [N, P]
 *      through shared memory.
 * Why this form and not the SSD matrix form on tensor cores (the Mamba-2
 * paper's, which the CPU uses): float32 accuracy. The tensor cores'
 * float32 inputs are TF32 (10-bit mantissas), about 1e-3 relative, far
 * outside the float32 bound the recurrence meets (three-way TF32 splits
 * would recover it at three times the products and much complexity); and
 * on the FMA units the matrix form does no less arithmetic than the
 * recurrence (the CPU's cost model in cpu/ssm.c), so its gain there would
 * only be the shape of the work. State passing keeps the recurrence's
 * own arithmetic inside a chunk, with L dependent steps per block instead
 * of T and n_chunks times the blocks, and adds P N multiply-adds per
 * token and head in step 3 (tiled products, no shuffles) and one read
 * and write of the n_chunks states in step 2. Step 1 is not
 * ssd_scan_kernel: with the whole grid being work, the instructions per
 * state value decide, so it groups rows to share each B, C value it reads
 * (its comment); the decode step keeps its kernel, bit for bit.
 * cum_t is the product of the same rounded factors the recurrence applies
 * to an incoming state, in the same order (not exp of a summed dt A), so
 * its rounding matches the recurrence's decays; it underflows to zero only
 * where the true product is below float's range.
 *
 * The cut and L. T <= L is one chunk: the sequential kernel, bit-identical
 * to T decode steps, no scratch, no extra launches. Above it the chunked
 * scan; just above L (two chunks, the second short) it costs about a
 * chunk's latency plus steps 2 and 3, which pays on the Mamba-2 shapes in
 * use (tens of heads and more, where the sequential grid outgrows the
 * device) but not on toy shapes of a few heads; the cut does not look at
 * the shape, so a prompt's numerics depend on T alone. L = 64 gives the
 * 512-token batch 8 chunks: 8 states of scratch (spx_mem_ssd_work_floats)
 * and 8 dependent steps in step 2; a shorter chunk would buy parallelism
 * those shapes do not need with more scratch and step-2 traffic, a longer
 * one would lengthen every block's dependent chain and leave short
 * prompts sequential. Step 3's tile is built for L = 64.
 *
 * Results depend only on the inputs and T (no atomics, no device-dependent
 * choice): the same call gives the same bits on every run.
 *
 * ssd_scan_kernel's work split: block (blockIdx.x, h = blockIdx.y) owns
 * rows p of head h, W lanes per row (W divides 32, so a row never
 * straddles warps); the lane ln of a row holds S[p, ln + k W], k < NPL
 * (NPL = ceil(N / W), rounded up to the instance). All 32 lanes of every
 * warp run the whole loop (rows p >= P and values n >= N are predicated
 * off, never branched around), so the full-mask shuffles are legal. dt
 * and exp(dt A) of a tile of tokens are computed once per block into
 * shared memory (the CPU's formula, ssd_dt in cpu/ssm.c). Per token, as
 * the CPU's step:
 *   s = da * S + (dt * x_p) * B_n;  y = sum_n s * C_n + D * x_p
 * (the sum over n as a per-lane partial sum then a butterfly over the W
 * lanes). Each token is processed identically whatever T is, so T calls
 * of one token and any split of a prompt into sequential scans give
 * bit-identical results. */
#define SSD_THREADS 128
#define SSD_TT 256 /* tokens per shared-memory tile of dt, exp(dt A) */
#define SSD_L SPX_MEM_SSD_CHUNK

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

/* Step 1 of the chunked scan: block (row block, h, chunk c = blockIdx.z)
 * runs the recurrence over the chunk's tokens [c L, c L + Tc), from the
 * session's state for c = 0 and from zero after, and writes the end state
 * to ends[c] [H, P, N]; for c > 0 the blocks of blockIdx.x == 0 write cum
 * [T, H]. The work split is made for issue throughput (see above): a
 * lane holds SR rows of one head for the same 4 J state values n =
 * 4 (ln + W j) + i (j < J, i < 4; W lanes per row group), so each B, C
 * value it reads serves SR rows. Per tile of TT tokens the block stages
 * B's and C's rows (zero past N up to the padded row NP = 4 W J) and its
 * rows' x in shared memory, coalesced; per token a lane reads them as
 * float4s, does 3 x 4 J x SR float ops (s = da S + dtx B_n; acc_r += s
 * C_n, one sum per row in n order), and the W lanes of a group reduce
 * their SR row sums by halving: log2(SR) exchange steps leave lane ln
 * the sum of row ln / (W / SR) over SR lanes, a butterfly over the
 * remaining log2(W / SR) steps completes it. The instances (W, J, SR):
 * W the power of two >= N / 4 in [4, 32], J = 2 only past N = 128; SR = 8
 * where the registers allow (J = 1, W >= 8), else 4. */
#define CH_TILE 2048 /* floats of B (and of C) staged per tile */
#define CH_XTILE 1024 /* floats of x staged per tile */

template <int W, int J, int SR>
__global__ void __launch_bounds__(SSD_THREADS) ssd_chunk_scan_kernel(spx_cu_ssd a, const float *__restrict__ x,
                                                                     const float *__restrict__ dt_raw,
                                                                     const float *__restrict__ B,
                                                                     const float *__restrict__ C, int64_t ldx, int T,
                                                                     const float *__restrict__ state, float *y,
                                                                     int64_t ldy, int lg_rows, float *ends,
                                                                     float *cum) {
    static_assert(SR <= W && SR % 4 == 0 && 32 % W == 0, "a row group's lanes end with one row each");
    constexpr int NP = 4 * W * J, LG_NP = NP == 16 ? 4 : NP == 32 ? 5 : NP == 64 ? 6 : NP == 128 ? 7 : 8;
    static_assert(1 << LG_NP == NP, "NP is a power of two <= 256");
    __shared__ __align__(16) float sB[CH_TILE];
    __shared__ __align__(16) float sC[CH_TILE];
    __shared__ __align__(16) float sX[CH_XTILE];
    __shared__ float s_dt[SSD_L], s_da[SSD_L];
    const int h = blockIdx.y, c = blockIdx.z;
    const int tb = c * SSD_L, Tc = T - tb < SSD_L ? T - tb : SSD_L;
    const int rows_pb = 1 << lg_rows; /* blockDim.x / W * SR, a power of two */
    int TT = CH_TILE / NP < CH_XTILE / rows_pb ? CH_TILE / NP : CH_XTILE / rows_pb;
    if (TT > SSD_L) TT = SSD_L;
    const int ln = threadIdx.x % W, rg = threadIdx.x / W; /* lane in its group, group in the block */
    const int p0 = blockIdx.x * rows_pb;                  /* the block's first row */
    const int N = a.N, P = a.P;
    const int g = h / (a.H / a.G);
    const float A = -expf(__ldg(a.A_log + h));
    const float Dh = __ldg(a.D + h), bias = __ldg(a.dt_bias + h);
    const int64_t ob = (int64_t)tb * ldx, h0 = (int64_t)h * P;
    const float *Bg = B + ob + (int64_t)g * N, *Cg = C + ob + (int64_t)g * N, *xh = x + ob + h0;

    for (int i = threadIdx.x; i < Tc; i += blockDim.x) {
        const float dt = ssd_dt_dev(__ldg(dt_raw + ob + (int64_t)i * ldx + h), bias, a.dt_lo, a.dt_hi);
        s_dt[i] = dt;
        s_da[i] = expf(dt * A);
    }
    float S[SR][4 * J];
#pragma unroll
    for (int r = 0; r < SR; r++) {
        const int p = p0 + rg * SR + r;
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int n = 4 * (ln + W * j) + i;
                S[r][4 * j + i] = c == 0 && p < P && n < N ? state[(h0 + p) * N + n] : 0.0f; /* later chunks: zero */
            }
    }
    __syncthreads();
    if (c > 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        float run = 1.0f;
        float *ch = cum + (int64_t)tb * a.H + h;
        for (int i = 0; i < Tc; i++) {
            run *= s_da[i];
            ch[(int64_t)i * a.H] = run;
        }
    }
    const int q = ln / (W / SR); /* the row (of the group's SR) whose sum this lane ends with */
    const int ro = rg * SR + q;
    const bool out = ln % (W / SR) == 0 && p0 + ro < P;
    for (int t0 = 0; t0 < Tc; t0 += TT) {
        const int nt = Tc - t0 < TT ? Tc - t0 : TT;
        __syncthreads(); /* every thread is done reading the previous tile */
        /* unrolled so that several loads are in flight before their stores */
#pragma unroll 8
        for (int k = threadIdx.x; k < nt * NP; k += blockDim.x) {
            const int t = k >> LG_NP, n = k & (NP - 1);
            const int64_t o = (int64_t)(t0 + t) * ldx + n;
            sB[k] = n < N ? __ldg(Bg + o) : 0.0f;
            sC[k] = n < N ? __ldg(Cg + o) : 0.0f;
        }
#pragma unroll 4
        for (int k = threadIdx.x; k < nt * rows_pb; k += blockDim.x) {
            const int t = k >> lg_rows, r = k & (rows_pb - 1);
            sX[k] = p0 + r < P ? __ldg(xh + (int64_t)(t0 + t) * ldx + p0 + r) : 0.0f;
        }
        __syncthreads();
        for (int i = 0; i < nt; i++) {
            const int t = t0 + i;
            const float da = s_da[t], dt = s_dt[t];
            const float *xt = sX + i * rows_pb + rg * SR;
            float dtx[SR], acc[SR];
#pragma unroll
            for (int r4 = 0; r4 < SR / 4; r4++) {
                const float4 x4 = *(const float4 *)(xt + 4 * r4);
                dtx[4 * r4 + 0] = dt * x4.x, dtx[4 * r4 + 1] = dt * x4.y;
                dtx[4 * r4 + 2] = dt * x4.z, dtx[4 * r4 + 3] = dt * x4.w;
            }
#pragma unroll
            for (int r = 0; r < SR; r++) acc[r] = 0.0f;
#pragma unroll
            for (int j = 0; j < J; j++) {
                const float4 b4 = *(const float4 *)(sB + i * NP + 4 * (ln + W * j));
                const float4 c4 = *(const float4 *)(sC + i * NP + 4 * (ln + W * j));
                const float bv[4] = {b4.x, b4.y, b4.z, b4.w}, cv[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
                for (int r = 0; r < SR; r++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float sv = da * S[r][4 * j + e] + dtx[r] * bv[e];
                        S[r][4 * j + e] = sv;
                        acc[r] += sv * cv[e];
                    }
            }
            /* halving: the upper lanes of each exchange keep the upper rows */
#pragma unroll
            for (int m = SR, o = W / 2; m > 1; m >>= 1, o >>= 1) {
                const bool up = ln & o;
#pragma unroll
                for (int r = 0; r < m / 2; r++) {
                    const float send = up ? acc[r] : acc[r + m / 2];
                    acc[r] = (up ? acc[r + m / 2] : acc[r]) + __shfl_xor_sync(0xffffffffu, send, o);
                }
            }
#pragma unroll
            for (int o = W / SR / 2; o > 0; o >>= 1) acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
            if (out) y[(int64_t)(tb + t) * ldy + h0 + p0 + ro] = acc[0] + Dh * xt[q];
        }
    }
#pragma unroll
    for (int r = 0; r < SR; r++) {
        const int p = p0 + rg * SR + r;
        if (p >= P) continue;
        float *Erow = ends + (int64_t)c * a.H * P * N + (h0 + p) * N;
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int n = 4 * (ln + W * j) + i;
                if (n < N) Erow[n] = S[r][4 * j + i];
            }
    }
}

/* Step 2: element i of [H, P, N], chunks in order; E[nc-1] is not needed
 * afterwards (step 3 reads E[0 .. nc-2]), so the final state goes straight
 * to `state`. */
__global__ void ssd_chunk_carry_kernel(float *ends, const float *__restrict__ cum, int T, int nc, int H, int64_t PN,
                                       float *state) {
    const int64_t hpn = (int64_t)H * PN;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < hpn; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t h = i / PN;
        float s = ends[i];
        for (int c = 1; c < nc; c++) {
            const int te = ((c + 1) * SSD_L < T ? (c + 1) * SSD_L : T) - 1; /* chunk c's last token */
            s = __ldg(cum + (int64_t)te * H + h) * s + ends[(int64_t)c * hpn + i];
            if (c + 1 < nc) ends[(int64_t)c * hpn + i] = s;
        }
        state[i] = s;
    }
}

/* Step 3: block (p block, h, chunk blockIdx.z + 1), 16 x 16 threads, each
 * a 4 x 4 tile of (token, row): t = 4 ty + i, p = p0 + 4 tx + j. Per step
 * of FIX_NK state values, C's rows [L, FIX_NK] and E's rows [FIX_TP,
 * FIX_NK] are staged transposed in shared memory (n-major, rows padded by
 * 4 floats: float4 reads stay aligned), zero-filled past T, P and N; each
 * thread then reads a float4 of each per n and does 16 multiply-adds. */
#define FIX_THREADS 256
#define FIX_TP 64 /* rows p per block */
#define FIX_NK 32 /* state values per shared-memory step */
static_assert(SSD_L == 64 && FIX_TP == 64, "the 16 x 16 threads' 4 x 4 tiles cover 64 tokens x 64 rows");

__global__ void __launch_bounds__(FIX_THREADS) ssd_chunk_fix_kernel(spx_cu_ssd a, const float *__restrict__ C,
                                                                    int64_t ldx, int T, const float *__restrict__ ends,
                                                                    const float *__restrict__ cum, float *y,
                                                                    int64_t ldy) {
    __shared__ __align__(16) float Cs[FIX_NK][SSD_L + 4];
    __shared__ __align__(16) float Ss[FIX_NK][FIX_TP + 4];
    const int c = blockIdx.z + 1, h = blockIdx.y, p0 = blockIdx.x * FIX_TP;
    const int t0 = c * SSD_L, Lc = T - t0 < SSD_L ? T - t0 : SSD_L;
    const int N = a.N, P = a.P, g = h / (a.H / a.G);
    const float *Sin = ends + ((int64_t)(c - 1) * a.H + h) * P * N; /* the state after chunk c-1, [P, N] */
    const float *Cg = C + (int64_t)t0 * ldx + (int64_t)g * N;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int n0 = 0; n0 < N; n0 += FIX_NK) {
        __syncthreads(); /* every thread is done reading the previous step's tiles */
#pragma unroll
        for (int i = threadIdx.x; i < SSD_L * FIX_NK; i += FIX_THREADS) {
            const int r = i / FIX_NK, k = i % FIX_NK, n = n0 + k; /* consecutive threads: consecutive n */
            Cs[k][r] = r < Lc && n < N ? __ldg(Cg + (int64_t)r * ldx + n) : 0.0f;
            Ss[k][r] = p0 + r < P && n < N ? __ldg(Sin + (int64_t)(p0 + r) * N + n) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < FIX_NK; k++) {
            const float4 cv = *(const float4 *)&Cs[k][4 * ty];
            const float4 sv = *(const float4 *)&Ss[k][4 * tx];
            const float ca[4] = {cv.x, cv.y, cv.z, cv.w}, sa[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += ca[i] * sa[j];
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int t = 4 * ty + i;
        if (t >= Lc) continue;
        const float cm = __ldg(cum + (int64_t)(t0 + t) * a.H + h);
        float *yr = y + (int64_t)(t0 + t) * ldy + (int64_t)h * P;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int p = p0 + 4 * tx + j;
            if (p < P) yr[p] += cm * acc[i][j];
        }
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

template <int W, int J, int SR>
static cudaError_t chunk_launch(const spx_cu_ssd &a, const float *x, const float *dt_raw, const float *B,
                                const float *C, int64_t ldx, int T, const float *state, float *y, int64_t ldy,
                                float *ends, float *cum, int nc, cudaStream_t st) {
    /* whole warps (full-mask shuffles), a power of two of them (the tile
     * index math shifts), no more than P rows need */
    constexpr int rows_pw = 32 / W * SR;
    int warps = 1;
    while (warps < SSD_THREADS / 32 && warps * rows_pw < a.P) warps *= 2;
    const int rows_pb = warps * rows_pw;
    int lg_rows = 0;
    while ((1 << lg_rows) < rows_pb) lg_rows++;
    const dim3 grid((unsigned)((a.P + rows_pb - 1) / rows_pb), (unsigned)a.H, (unsigned)nc);
    ssd_chunk_scan_kernel<W, J, SR><<<grid, warps * 32, 0, st>>>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, lg_rows,
                                                                ends, cum);
    return cudaGetLastError();
}

cudaError_t spx_cu_ssd_scan(const spx_cu_ssd &a, const float *x, const float *dt_raw, const float *B, const float *C,
                            int64_t ldx, int T, float *state, float *y, int64_t ldy, float *work, size_t work_floats,
                            cudaStream_t st) {
    if (a.H < 1 || a.P < 1 || a.N < 1 || a.G < 1 || a.H % a.G != 0 || a.N > SPX_CU_SSD_MAX_N || a.H > 65535 || T < 0)
        return cudaErrorInvalidValue;
    if (T == 0) return cudaSuccess;
    const int nc = (int)(((int64_t)T + SSD_L - 1) / SSD_L);
    if (nc <= 1 || !work) { /* sequential */
        int W = 32; /* lanes per row: 32, or the smallest power of two >= N */
        while (W > 1 && W / 2 >= a.N) W /= 2;
        const int npl = (a.N + W - 1) / W; /* <= 8 by the N limit */
        if (npl <= 1) return ssd_launch<1>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, W, st);
        if (npl <= 2) return ssd_launch<2>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, W, st);
        if (npl <= 4) return ssd_launch<4>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, W, st);
        return ssd_launch<8>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, W, st);
    }
    if (work_floats < spx_mem_ssd_work_floats(a.H, a.P, a.N, T) || nc > 65535) return cudaErrorInvalidValue;
    float *ends = work, *cum = work + (size_t)nc * (size_t)a.H * (size_t)a.P * (size_t)a.N;
    /* step 1: the instance for N (the kernel's comment) */
    cudaError_t err;
    if (a.N <= 16) err = chunk_launch<4, 1, 4>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, ends, cum, nc, st);
    else if (a.N <= 32) err = chunk_launch<8, 1, 8>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, ends, cum, nc, st);
    else if (a.N <= 64) err = chunk_launch<16, 1, 8>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, ends, cum, nc, st);
    else if (a.N <= 128) err = chunk_launch<32, 1, 8>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, ends, cum, nc, st);
    else err = chunk_launch<32, 2, 4>(a, x, dt_raw, B, C, ldx, T, state, y, ldy, ends, cum, nc, st);
    if (err != cudaSuccess) return err;
    /* step 2 */
    const int64_t PN = (int64_t)a.P * a.N;
    ssd_chunk_carry_kernel<<<ew_grid((int64_t)a.H * PN), 256, 0, st>>>(ends, cum, T, nc, a.H, PN, state);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    /* step 3 */
    const dim3 fgrid((unsigned)((a.P + FIX_TP - 1) / FIX_TP), (unsigned)a.H, (unsigned)(nc - 1));
    ssd_chunk_fix_kernel<<<fgrid, FIX_THREADS, 0, st>>>(a, C, ldx, T, ends, cum, y, ldy);
    return cudaGetLastError();
}

cudaError_t spx_cu_ssd_step(const spx_cu_ssd &a, const float *x, const float *dt_raw, const float *B, const float *C,
                            float *state, float *y, cudaStream_t st) {
    /* one token: the row stride is never applied (t = 0 only) */
    return spx_cu_ssd_scan(a, x, dt_raw, B, C, 0, 1, state, y, 0, NULL, 0, st);
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
        out[i] = spx_silu_dev(g) * row[I + j];
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
