/* refine.cu: selection and application kernels of weight refinement
 * (refine.cuh has the meaning, layouts and limits). */
#include "cuda/refine.cuh"

#define SEL_THREADS SPX_RF_CHUNK /* one thread per channel of a chunk */
#define APPLY_THREADS 256        /* words per tile: 2,048 rows */
#define STAGE 2048               /* selected channels staged in shared memory at a time */
#define UNROLL 8                 /* column loads in flight per thread */

/* Exclusive prefix count of flag over the block (blockDim.x == 1,024) and
 * the total, via warp ballots. ws: 32 ints of shared memory. */
__device__ __forceinline__ int block_prefix(int flag, int *ws, int *total) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const unsigned b = __ballot_sync(0xffffffffu, flag);
    const int before = __popc(b & ((1u << lane) - 1u));
    __syncthreads(); /* ws may still be read by a previous call */
    if (lane == 0) ws[wid] = __popc(b);
    __syncthreads();
    int base = 0, tot = 0;
    for (int w = 0; w < 32; w++) {
        const int v = ws[w];
        base += w < wid ? v : 0;
        tot += v;
    }
    *total = tot;
    return base + before;
}

/* The rmsnorm factor of the launch's input (1 without a gain), over the
 * whole input: every block of SEL_THREADS threads recomputes it, in the
 * same order in every kernel (rf_select, rf_select_x). red: 32 floats. */
__device__ __forceinline__ float input_inv(const spx_rf_select_args &a, float *red) {
    if (!a.gain) return 1.0f;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < a.cols; j += SEL_THREADS) ss = fmaf(a.x[j], a.x[j], ss);
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < 32; w++) t += red[w];
    return rsqrtf(t / (float)a.cols + a.eps);
}

/* channel i of the launch's input (i < cols) */
__device__ __forceinline__ float input_at(const spx_rf_select_args &a, int64_t i, float inv) {
    float xi = a.x[i];
    if (a.gain) xi = xi * inv * a.gain[i];
    else if (a.x2) xi = xi * a.x2[i];
    return xi;
}

__global__ void __launch_bounds__(SEL_THREADS) rf_select(spx_rf_select_args a) {
    __shared__ int ws[32];
    __shared__ float red[32];
    const int64_t c0 = (int64_t)blockIdx.x * SPX_RF_CHUNK, i = c0 + threadIdx.x;
    const bool in = i < a.cols;
    const float inv = input_inv(a, red);
    const float xi = in ? input_at(a, i, inv) : 0.0f;
    /* key: 0 never chosen (outside, skipped), 1 a NaN, else 2 + the bits of |x| */
    unsigned key = 0;
    if (in && !(a.skip && a.skip[i])) key = isnan(xi) ? 1u : 2u + (__float_as_uint(xi) & 0x7fffffffu);
    const int n_cand = __syncthreads_count(key != 0);
    const int kc = a.k < SPX_RF_CHUNK ? a.k : SPX_RF_CHUNK;
    bool take;
    if (n_cand <= a.k) take = key != 0;
    else { /* T = the k-th largest key: the largest T with count(key >= T) >= k */
        unsigned T = 0;
        for (int b = 31; b >= 0; b--) {
            const unsigned cand = T | (1u << b);
            if (__syncthreads_count(key >= cand) >= a.k) T = cand;
        }
        const int n_gt = __syncthreads_count(key > T);
        int n_eq;
        const int r_eq = block_prefix(key == T, ws, &n_eq);
        take = key > T || (key == T && r_eq < a.k - n_gt);
    }
    int n_take;
    const int pos = block_prefix(take, ws, &n_take);
    if (take) {
        a.sel[(int64_t)blockIdx.x * kc + pos] = (int32_t)i;
        a.selx[(int64_t)blockIdx.x * kc + pos] = xi;
    }
    if (threadIdx.x == 0) a.cnt[blockIdx.x] = n_take;
}

/* one block per chunk: its chosen channels' values of the current input */
__global__ void __launch_bounds__(SEL_THREADS) rf_select_x(spx_rf_select_args a) {
    __shared__ float red[32];
    const float inv = input_inv(a, red);
    const int kc = a.k < SPX_RF_CHUNK ? a.k : SPX_RF_CHUNK;
    const int64_t e = (int64_t)blockIdx.x * kc + threadIdx.x;
    if ((int)threadIdx.x < kc && (int)threadIdx.x < a.cnt[blockIdx.x]) a.selx[e] = input_at(a, a.sel[e], inv);
}

/* Grid-stride over (matrix, selection entry, 16- or 4-byte unit of the
 * column's 4 * ceil(rows / 8) code bytes): consecutive threads copy
 * consecutive units of one column, so a warp reads contiguous host bytes. */
__global__ void __launch_bounds__(APPLY_THREADS) rf_fetch(spx_rf_fetch_args a) {
    const int64_t E = (int64_t)a.n_chunks * a.kcap;
    int64_t units[SPX_RF_MAX_MATS], start[SPX_RF_MAX_MATS + 1];
    bool wide[SPX_RF_MAX_MATS];
    start[0] = 0;
    for (int m = 0; m < a.n_mats; m++) {
        const int64_t bytes = 4 * ((a.m[m].rows + 7) / 8);
        wide[m] = (((uintptr_t)a.m[m].codes | (uintptr_t)a.stage[m] | (uintptr_t)a.m[m].col_stride) & 15) == 0;
        units[m] = wide[m] ? (bytes + 15) / 16 : bytes / 4;
        start[m + 1] = start[m] + E * units[m];
    }
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < start[a.n_mats]; t += step) {
        int m = 0;
        while (t >= start[m + 1]) m++;
        const int64_t r = t - start[m], e = r / units[m], u = r - e * units[m];
        const int c = (int)(e / a.kcap), j = (int)(e - (int64_t)c * a.kcap);
        if (j >= a.cnt[c]) continue;
        const spx_rf_mat &M = a.m[m];
        const uint8_t *src = M.codes + (int64_t)a.sel[e] * M.col_stride;
        uint8_t *dst = a.stage[m] + e * M.col_stride;
        if (wide[m]) /* 16-byte units stay inside the column: col_stride >= 16 * units */
            reinterpret_cast<uint4 *>(dst)[u] = reinterpret_cast<const uint4 *>(src)[u];
        else
            reinterpret_cast<uint32_t *>(dst)[u] = reinterpret_cast<const uint32_t *>(src)[u];
    }
}

__global__ void rf_copy(float *dst, const float *src, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

__global__ void __launch_bounds__(APPLY_THREADS) rf_apply(spx_rf_apply_args a) {
    __shared__ int32_t s_idx[STAGE];
    __shared__ float s_x[STAGE];
    __shared__ int s_pre[SPX_RF_MAX_COLS / SPX_RF_CHUNK + 1];
    if (threadIdx.x == 0) { /* where each chunk's choices start in the flattened order */
        int p = 0;
        for (int c = 0; c < a.n_chunks; c++) {
            s_pre[c] = p;
            p += a.cnt[c];
        }
        s_pre[a.n_chunks] = p;
    }
    __syncthreads();
    const int n_sel = s_pre[a.n_chunks];
    int64_t tiles[SPX_RF_MAX_MATS + 1];
    tiles[0] = 0;
    for (int m = 0; m < a.n_mats; m++) tiles[m + 1] = tiles[m] + (a.m[m].rows + 8 * APPLY_THREADS - 1) / (8 * APPLY_THREADS);
    for (int64_t t = blockIdx.x; t < tiles[a.n_mats]; t += gridDim.x) {
        int m = 0;
        while (t >= tiles[m + 1]) m++;
        const spx_rf_mat &M = a.m[m];
        const int64_t w = (t - tiles[m]) * APPLY_THREADS + threadIdx.x; /* rows 8w .. 8w + 7 */
        const bool live = 8 * w < M.rows;
        const uint8_t *base = M.codes + 4 * w;
        float acc[8];
#pragma unroll
        for (int k = 0; k < 8; k++) acc[k] = 0.0f;
        for (int j0 = 0; j0 < n_sel; j0 += STAGE) {
            const int nb = n_sel - j0 < STAGE ? n_sel - j0 : STAGE;
            __syncthreads(); /* the previous batch's readers are done */
            for (int e = threadIdx.x; e < nb; e += APPLY_THREADS) {
                const int g = j0 + e;
                int c = 0;
                while (g >= s_pre[c + 1]) c++;
                const int64_t src = (int64_t)c * a.kcap + (g - s_pre[c]);
                s_idx[e] = a.staged ? (int32_t)src : a.sel[src]; /* the column's index in m[].codes */
                s_x[e] = a.selx[src];
            }
            __syncthreads();
            if (!live) continue;
            /* UNROLL loads issued before their FMAs (a partial group too: one
             * host round trip per group, not per column) */
            for (int j = 0; j < nb; j += UNROLL) {
                const int nu = nb - j < UNROLL ? nb - j : UNROLL;
                uint32_t v[UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; u++)
                    v[u] = u < nu ? *reinterpret_cast<const uint32_t *>(base + (int64_t)s_idx[j + u] * M.col_stride) : 0u;
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    if (u >= nu) break;
                    const float xv = s_x[j + u];
#pragma unroll
                    for (int k = 0; k < 8; k++) acc[k] = fmaf(xv, (float)((int)((v[u] >> (4 * k)) & 15u) - 8), acc[k]);
                }
            }
        }
        if (live)
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int64_t r = 8 * w + k;
                if (r < M.rows) M.delta[r] = M.scales[r] * acc[k];
            }
    }
}

__global__ void rf_add(float *y, const float *d, int64_t n, float mult) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += mult == 1.0f ? d[i] : mult * d[i];
}

__global__ void rf_add_swiglu(float *gate, const float *up, const float *dg, const float *du, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = dg ? gate[i] + dg[i] : gate[i], u = du ? up[i] + du[i] : up[i];
    gate[i] = spx_silu_dev(g) * u;
}

cudaError_t spx_rf_select(const spx_rf_select_args &a, cudaStream_t st) {
    if (a.cols < 1 || a.cols > SPX_RF_MAX_COLS || a.k < 1) return cudaErrorInvalidValue;
    const int n_chunks = (int)((a.cols + SPX_RF_CHUNK - 1) / SPX_RF_CHUNK);
    rf_select<<<n_chunks, SEL_THREADS, 0, st>>>(a);
    return cudaGetLastError();
}

cudaError_t spx_rf_apply(const spx_rf_apply_args &a, int blocks, cudaStream_t st) {
    if (a.n_mats < 1 || a.n_mats > SPX_RF_MAX_MATS || a.n_chunks < 1 || a.n_chunks > SPX_RF_MAX_COLS / SPX_RF_CHUNK ||
        blocks < 1)
        return cudaErrorInvalidValue;
    int64_t tiles = 0;
    for (int m = 0; m < a.n_mats; m++) tiles += (a.m[m].rows + 8 * APPLY_THREADS - 1) / (8 * APPLY_THREADS);
    const int grid = (int)(tiles < blocks ? tiles : blocks);
    rf_apply<<<grid, APPLY_THREADS, 0, st>>>(a);
    return cudaGetLastError();
}

cudaError_t spx_rf_select_x(const spx_rf_select_args &a, cudaStream_t st) {
    if (a.cols < 1 || a.cols > SPX_RF_MAX_COLS || a.k < 1) return cudaErrorInvalidValue;
    const int n_chunks = (int)((a.cols + SPX_RF_CHUNK - 1) / SPX_RF_CHUNK);
    rf_select_x<<<n_chunks, SEL_THREADS, 0, st>>>(a);
    return cudaGetLastError();
}

cudaError_t spx_rf_fetch(const spx_rf_fetch_args &a, int blocks, cudaStream_t st) {
    if (a.n_mats < 1 || a.n_mats > SPX_RF_MAX_MATS || a.n_chunks < 1 || a.n_chunks > SPX_RF_MAX_COLS / SPX_RF_CHUNK ||
        a.kcap < 1 || a.kcap > SPX_RF_CHUNK || blocks < 1)
        return cudaErrorInvalidValue;
    int64_t work = 0;
    for (int m = 0; m < a.n_mats; m++) work += (int64_t)a.n_chunks * a.kcap * ((a.m[m].rows + 7) / 8);
    const int64_t need = (work + APPLY_THREADS - 1) / APPLY_THREADS;
    const int grid = (int)(need < blocks ? (need > 0 ? need : 1) : blocks);
    rf_fetch<<<grid, APPLY_THREADS, 0, st>>>(a);
    return cudaGetLastError();
}

cudaError_t spx_rf_copy(float *dst, const float *src, int64_t n, cudaStream_t st) {
    rf_copy<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(dst, src, n);
    return cudaGetLastError();
}

cudaError_t spx_rf_add(float *y, const float *d, int64_t n, float mult, cudaStream_t st) {
    rf_add<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(y, d, n, mult);
    return cudaGetLastError();
}

cudaError_t spx_rf_add_swiglu(float *gate, const float *up, const float *dg, const float *du, int64_t n, cudaStream_t st) {
    rf_add_swiglu<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(gate, up, dg, du, n);
    return cudaGetLastError();
}
