/* gemm_q4.cu: the tensor-core W4A16 GEMM (see gemm_q4.cuh).
 *
 * Block tile: GM_BN = 128 rows of W x BM tokens (64 or 128), K in tiles of
 * 64 columns (two groups). 8 warps as 4 (W rows, 32 each) x 2 (tokens,
 * BM/2 each); each warp issues mma.sync m16n8k16 (A = W tile, row-major
 * [rows][k]; B = x tile stored [tokens][k], i.e. "col"), fragments loaded
 * with ldmatrix from rows padded to 72 halves (conflict-free).
 *
 * Pipeline: the next K tile's codes and activations are loaded into
 * registers while the tensor cores work on the current one from shared
 * memory, then dequantized into the other of two shared buffers (one
 * barrier per tile; 72 KB of dynamic shared memory at BM = 128). After the quantized
 * tiles come ceil(n_out / 64) outlier tiles: A[r][j] = oval[r, j0 + j],
 * B[t][j] = x[t, idx[j0 + j]] (zero past n_out).
 *
 * Numerics: W^ = (q - z) * s rounded once to fp16 (relative 2^-11), x in
 * fp16, products and sums in float32 on the tensor cores. */
#include "cuda/gemm_q4.cuh"

#define GM_BN 128
#define GM_BK 64
#define GM_LD 72 /* halves per shared row: 64 + 8 padding */

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const __half *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

template <int BM>
__global__ void __launch_bounds__(256) gemm_q4_kernel(const __grid_constant__ spx_gemm_args a) {
    constexpr int WN = BM / 2;             /* tokens per warp */
    constexpr int NT = WN / 8;             /* n8 tiles per warp */
    constexpr int TPT = 256 / BM;          /* loader threads per token row */
    constexpr int XH = GM_BK / TPT;        /* halves of x per loader thread */
    constexpr int XV = XH / 8;             /* uint4 per loader thread */
    extern __shared__ __align__(16) __half gemm_sm[]; /* two buffers of [W tile | x tile] */
    __half *const Ws = gemm_sm, *const Xs = gemm_sm + GM_BN * GM_LD;
    constexpr int BUF = (GM_BN + BM) * GM_LD;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp & 3, wn = warp >> 2;
    const spx_dqmat &w = a.w;
    const int64_t n0 = (int64_t)blockIdx.x * GM_BN;
    const int m0 = blockIdx.y * BM;
    const int ng = w.n_groups, cols = (int)w.cols;
    const int n_kt = (ng + 1) / 2, n_ot = (w.n_out + GM_BK - 1) / GM_BK, n_all = n_kt + n_ot;
    /* split-K: this block runs tiles [t_begin, t_end) of the n_all */
    const int S = gridDim.z, per = (n_all + S - 1) / S;
    const int t_begin = min(n_all, (int)blockIdx.z * per), t_end = min(n_all, t_begin + per);

    /* loader roles */
    const int lr = tid >> 1, lgs = tid & 1;       /* W: row in tile, group of the K tile */
    const int64_t wrow = n0 + lr;
    const bool wrow_ok = wrow < w.rows;
    const int xt = tid / TPT, xc = (tid % TPT) * XH; /* x: token in tile, first k */
    const int64_t xtok = m0 + xt;
    const bool xtok_ok = xtok < a.M;

    uint4 rc = make_uint4(0, 0, 0, 0);
    float rs = 0.0f, rz = 0.0f;
    uint4 rx[XV];

    auto load_q = [&](int kt) {
        int g = 2 * kt + lgs;
        if (wrow_ok && g < ng) {
            int z;
            spx_dq_group(w, wrow, g, rc, rs, z);
            rz = (float)z;
        } else {
            rc = make_uint4(0, 0, 0, 0);
            rs = 0.0f;
            rz = 0.0f;
        }
        int c = kt * GM_BK + xc;
#pragma unroll
        for (int v = 0; v < XV; v++) {
            if (xtok_ok && c + 8 * v < cols)
                rx[v] = __ldg(reinterpret_cast<const uint4 *>(a.x + xtok * a.ldx + c + 8 * v));
            else
                rx[v] = make_uint4(0, 0, 0, 0);
        }
    };

    /* Dequantization without conversions: a nibble q OR'ed into the fp16
     * pattern 0x6400 is the fp16 number 1024 + q exactly, so (1024 + q) -
     * (1024 + z) = q - z exactly (HSUB2) and one HMUL2 by the scale rounds
     * (q - z) * s to fp16 once, as (float)(q - z) * s rounded would. Bytes
     * are permuted (b0, b2, b1, b3) first so that each 32-bit mask takes
     * two adjacent codes: nibbles of bytes 0 and 1 are codes k, k + 1
     * (low) and k + 16, k + 17 (high). */
    auto store_q = [&](int b) {
        const uint32_t wd[4] = {rc.x, rc.y, rc.z, rc.w};
        const __half2 zz = __float2half2_rn(1024.0f + rz), ss = __float2half2_rn(rs);
        __half *dst = Ws + b * BUF + lr * GM_LD + lgs * 32;
        auto deq = [&](uint32_t v) {
            const uint32_t m = (v & 0x000f000fu) | 0x64006400u;
            const __half2 h = __hmul2(__hsub2(*reinterpret_cast<const __half2 *>(&m), zz), ss);
            return *reinterpret_cast<const uint32_t *>(&h);
        };
#pragma unroll
        for (int part = 0; part < 2; part++) { /* bytes 8*part .. 8*part+7 */
            uint32_t lo[4], hi[4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t t = __byte_perm(wd[2 * part + h], 0, 0x3120);
                lo[2 * h] = deq(t);
                hi[2 * h] = deq(t >> 4);
                lo[2 * h + 1] = deq(t >> 8);
                hi[2 * h + 1] = deq(t >> 12);
            }
            *reinterpret_cast<uint4 *>(dst + 8 * part) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            *reinterpret_cast<uint4 *>(dst + 16 + 8 * part) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        }
#pragma unroll
        for (int v = 0; v < XV; v++) *reinterpret_cast<uint4 *>(Xs + b * BUF + xt * GM_LD + xc + 8 * v) = rx[v];
    };

    auto store_outliers = [&](int ot, int b) {
        int j0 = ot * GM_BK;
        __half *dw = Ws + b * BUF + lr * GM_LD + lgs * 32;
        for (int i = 0; i < 32; i++) {
            int j = j0 + lgs * 32 + i;
            dw[i] = (wrow_ok && j < w.n_out) ? w.oval[wrow * w.n_out + j] : __float2half_rn(0.0f);
        }
        __half *dx = Xs + b * BUF + xt * GM_LD + xc;
        for (int i = 0; i < XH; i++) {
            int j = j0 + xc + i;
            dx[i] = (xtok_ok && j < w.n_out) ? a.x[xtok * a.ldx + w.oidx[j]] : __float2half_rn(0.0f);
        }
    };

    float acc[2][NT][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    /* Two shared buffers, one barrier per K tile: tile t + 1 is loaded into
     * registers before the tensor cores work on tile t, and stored into the
     * other buffer after (its last readers finished before the barrier
     * that ended tile t - 1). */
    auto stage = [&](int t, int b) {
        if (t < n_kt) store_q(b);
        else store_outliers(t - n_kt, b);
    };
    if (t_begin < n_kt) load_q(t_begin);
    if (t_begin < t_end) stage(t_begin, 0);
    __syncthreads();
    for (int t = t_begin; t < t_end; t++) {
        const int b = (t - t_begin) & 1;
        const __half *Wb = Ws + b * BUF, *Xb = Xs + b * BUF;
        if (t + 1 < n_kt && t + 1 < t_end) load_q(t + 1);
#pragma unroll
        for (int ks = 0; ks < GM_BK / 16; ks++) {
            uint32_t af[2][4], bfr[NT][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ldsm_x4(af[mt], Wb + (wm * 32 + mt * 16 + (lane & 15)) * GM_LD + ks * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t r[4];
                ldsm_x4(r, Xb + (wn * WN + np * 16 + (lane & 7) + ((lane >> 4) << 3)) * GM_LD + ks * 16 +
                               ((lane >> 3) & 1) * 8);
                bfr[2 * np][0] = r[0];
                bfr[2 * np][1] = r[1];
                bfr[2 * np + 1][0] = r[2];
                bfr[2 * np + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma16816(acc[mt][nt], af[mt], bfr[nt]);
        }
        if (t + 1 < t_end) stage(t + 1, b ^ 1);
        __syncthreads();
    }

#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int64_t r = n0 + wm * 32 + mt * 16 + (lane >> 2) + (e >> 1) * 8;
                int64_t t = m0 + wn * WN + nt * 8 + (lane & 3) * 2 + (e & 1);
                if (r < w.rows && t < a.M) {
                    float v = acc[mt][nt][e];
                    if (S > 1) { /* partial sums: [split][token][row] */
                        a.ws[((int64_t)blockIdx.z * a.M + t) * w.rows + r] = v;
                        continue;
                    }
                    if (a.bias) v += a.bias[r];
                    float *p = a.y + t * a.ldy + r;
                    *p = a.accumulate ? *p + v : v;
                }
            }
}

/* y[t, r] (+)= sum_s ws[s, t, r] + bias[r], the splits in order. */
__global__ void gemm_splitk_reduce(const __grid_constant__ spx_gemm_args a, int S) {
    const int64_t rows = a.w.rows, n = rows * a.M;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / rows, r = i - t * rows;
        float v = 0.0f;
        for (int s = 0; s < S; s++) v += a.ws[(int64_t)s * n + i];
        if (a.bias) v += a.bias[r];
        float *p = a.y + t * a.ldy + r;
        *p = a.accumulate ? *p + v : v;
    }
}

cudaError_t spx_gemm_q4(const spx_gemm_args &a, int n_sm, cudaStream_t st) {
    if (a.M <= 0 || a.w.cols % 32 || a.ldx % 8 || a.w.rows <= 0) return cudaErrorInvalidValue;
    const int bm = a.M > 64 ? 128 : 64;
    const int64_t gx = (a.w.rows + GM_BN - 1) / GM_BN, gy = (a.M + bm - 1) / bm;
    const int64_t n_all = (a.w.n_groups + 1) / 2 + (a.w.n_out + GM_BK - 1) / GM_BK;
    /* enough blocks for ~2 per multiprocessor, >= 4 K tiles each */
    int64_t S = (2 * (int64_t)(n_sm > 0 ? n_sm : 1) + gx * gy - 1) / (gx * gy);
    if (S > n_all / 4) S = n_all / 4;
    if (S > 16) S = 16;
    int64_t fit = a.ws ? (int64_t)(a.ws_floats / ((size_t)a.M * (size_t)a.w.rows)) : 1;
    if (S > fit) S = fit;
    if (S < 1) S = 1;
    dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)S);
    const size_t smem = (size_t)2 * (GM_BN + bm) * GM_LD * sizeof(__half);
    static int attr_set; /* both variants take more than the default 48 KB; per process and device (one device) */
    if (!attr_set) {
        cudaError_t e1 = cudaFuncSetAttribute(gemm_q4_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              2 * (GM_BN + 128) * GM_LD * (int)sizeof(__half));
        cudaError_t e2 = cudaFuncSetAttribute(gemm_q4_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              2 * (GM_BN + 64) * GM_LD * (int)sizeof(__half));
        if (e1 != cudaSuccess) return e1;
        if (e2 != cudaSuccess) return e2;
        attr_set = 1;
    }
    if (bm == 128) gemm_q4_kernel<128><<<grid, 256, smem, st>>>(a);
    else gemm_q4_kernel<64><<<grid, 256, smem, st>>>(a);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || S == 1) return err;
    int64_t n = a.w.rows * a.M, blocks = (n + 255) / 256;
    gemm_splitk_reduce<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, st>>>(a, (int)S);
    return cudaGetLastError();
}
