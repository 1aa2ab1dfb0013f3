/* gemv_q4.cu: the fused W4A16 GEMV (see gemv_q4.cuh).
 *
 * Layout of the work: a block first builds an image of the input vector in
 * shared memory (optionally RMS-normalised), then each warp computes R
 * rows at a time ("tile"), grid-striding over tiles. In a tile, lane l
 * takes groups l, l+32, ... (one "chunk" = 32 groups): a 16-byte load of
 * codes (a whole group of 32 weights) per row, its fp16 scale and zero
 * nibble.
 *
 * Default kernel (gemv_q4_pipe): each warp streams its chunks through a
 * private S-stage cp.async pipeline in shared memory (codes 16 B, and the
 * aligned 4-byte words holding the scale and the zero nibble), S - 1
 * chunks ahead of the one it computes, continuing across tiles; every lane
 * only reads back what it copied itself, so no barrier is needed. The
 * first chunks are issued before the input image is built, so the weight
 * stream starts at once. A decode GEMV is bound by the bytes in flight:
 * 8 warps x (S - 1) x R x 512 B per block. gemv_q4_regs is the first
 * version (loads into registers, U groups ahead), kept as impl 1 for
 * comparison in bench_gemv.
 *
 * Nibble unpack without conversions: a 4-bit code q at bit offset 4p of a
 * 32-bit word w, masked in place (w & (15 << 4p)) and read as a float, is
 * the denormal (or smallest-normal) number q * 2^(4p - 149) exactly, since
 * the IEEE encoding is linear below 2^24 as an integer. So one AND and one
 * FFMA per weight suffice when the activation it meets was pre-scaled by
 * 2^(XE - 4p): the product is q * x * 2^(XE - 149) for every p. Bits 24..31
 * are shifted down by 8 first (p = 6, 7 use the scales of p = 4, 5). The
 * zero point leaves the inner loop: per group
 *     sum_k (q_k - z) x_k = sum_k q_k x_k - z * X_g,   X_g = sum_k x_k,
 * with X_g precomputed in the same scaled units. (Needs denormals to be
 * kept: never build this file with -ftz=true / --use_fast_math. Measured
 * on the H200: FFMA with a denormal operand runs at full rate.)
 *
 * Shared-memory image: per group 8 float4 = 32 floats, float4 f = 2j + h
 * holding the activations of nibbles p = 4h..4h+3 of word j, stored at
 * f ^ (g & 7) so that the 8 lanes of an LDS.128 phase (8 consecutive
 * groups) hit 8 different 16-byte bank slots; then n_groups floats X_g.
 * Each x load serves R rows. */
#include "cuda/gemv_q4.cuh"

#define GEMV_XE 100 /* x is pre-scaled by up to 2^XE: |x| < 2^27 stays finite */
#define GP_WARPS 8  /* warps per block, pipelined kernel */
#define GP_STAGE_ROW 768 /* bytes per (stage, row): 512 codes + 128 scale words + 128 zero words */
#define GR_WARPS 16 /* warps per block, register kernel */

struct gemv_kargs {
    spx_gemv_args a;
    int64_t start[SPX_GEMV_MAX_MATS + 1]; /* first global row of each matrix; unused: INT64_MAX */
    int64_t total;
    int64_t n_tiles;
    int cols;
};

__device__ __forceinline__ float pow2f(int e) { return __int_as_float((127 + e) << 23); }

__device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

/* x[col] back from the image (outlier columns). */
__device__ __forceinline__ float gemv_x_at(const float4 *xs4, int col) {
    int g = col >> 5, k = col & 31, hi = k >> 4, kk = k & 15, j = kk >> 2, b = kk & 3;
    int p = 2 * b + hi, f = 2 * j + (p >> 2), e = p & 3, pp = p < 6 ? p : p - 2;
    const float *q = reinterpret_cast<const float *>(xs4 + g * 8 + (f ^ (g & 7)));
    return q[e] * pow2f(4 * pp - GEMV_XE);
}

__device__ __forceinline__ uint32_t word_of(const uint4 &c, int j) {
    return j == 0 ? c.x : j == 1 ? c.y : j == 2 ? c.z : c.w;
}

/* The nibble at bits `mask` of w as q * 2^(4p - 149). */
__device__ __forceinline__ float nib(uint32_t w, uint32_t mask) { return __uint_as_float(w & mask); }

/* sum_k q_k x_k of one group in units 2^(XE-149): codes c, image xg. */
template <int R>
__device__ __forceinline__ void group_dots(const uint4 (&c)[R], const float4 *xg, int sw, float (&part)[R]) {
#pragma unroll
    for (int r = 0; r < R; r++) part[r] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float4 xa = xg[(2 * j) ^ sw], xb = xg[(2 * j + 1) ^ sw];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t w = word_of(c[r], j), w8 = w >> 8;
            float t = part[r];
            t = fmaf(nib(w, 0x0000000fu), xa.x, t);
            t = fmaf(nib(w, 0x000000f0u), xa.y, t);
            t = fmaf(nib(w, 0x00000f00u), xa.z, t);
            t = fmaf(nib(w, 0x0000f000u), xa.w, t);
            t = fmaf(nib(w, 0x000f0000u), xb.x, t);
            t = fmaf(nib(w, 0x00f00000u), xb.y, t);
            t = fmaf(nib(w8, 0x000f0000u), xb.z, t);
            t = fmaf(nib(w8, 0x00f00000u), xb.w, t);
            part[r] = t;
        }
    }
}

/* Builds the input image in shared memory (all threads; ends with a
 * barrier). Threads take (group, word j) slots: two float4 loads (columns
 * 4j..4j+3 and 4j+16..4j+19) make the two image float4s of word j. */
__device__ __forceinline__ void build_image(const spx_gemv_args &a, int cols, float4 *xs4, float *xsum,
                                            double *red) {
    const int ng = cols >> 5, tid = threadIdx.x;
    const float4 *x4 = reinterpret_cast<const float4 *>(a.x);
    const float4 *g4 = reinterpret_cast<const float4 *>(a.gain);
    float inv = 1.0f;
    if (a.gain) {
        double ss = 0;
#pragma unroll 4
        for (int i = tid; i < cols / 4; i += blockDim.x) {
            float4 v = __ldg(x4 + i);
            ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        }
        ss = spx_block_sum_d(ss, red);
        inv = (float)(1.0 / sqrt(ss / (double)cols + (double)a.eps));
    }
    const float P0 = pow2f(GEMV_XE), P1 = pow2f(GEMV_XE - 4), P2 = pow2f(GEMV_XE - 8), P3 = pow2f(GEMV_XE - 12),
                P4 = pow2f(GEMV_XE - 16), P5 = pow2f(GEMV_XE - 20);
    const int nslots = ng * 4;
#pragma unroll 2
    for (int base = 0; base < nslots; base += blockDim.x) {
        const int i = base + tid, g = i >> 2, j = i & 3;
        const bool valid = i < nslots;
        float4 lo = make_float4(0, 0, 0, 0), hi = lo;
        if (valid) {
            lo = __ldg(x4 + g * 8 + j);
            hi = __ldg(x4 + g * 8 + 4 + j);
            if (a.gain) {
                float4 gl = __ldg(g4 + g * 8 + j), gh = __ldg(g4 + g * 8 + 4 + j);
                lo = make_float4(lo.x * inv * gl.x, lo.y * inv * gl.y, lo.z * inv * gl.z, lo.w * inv * gl.w);
                hi = make_float4(hi.x * inv * gh.x, hi.y * inv * gh.y, hi.z * inv * gh.z, hi.w * inv * gh.w);
            }
        }
        float s = ((lo.x + lo.y) + (lo.z + lo.w)) + ((hi.x + hi.y) + (hi.z + hi.w));
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (valid) {
            const int sw = g & 7;
            /* word j: p = 0..7 are columns 4j, 4j+16, 4j+1, 4j+17 | 4j+2, 4j+18, 4j+3, 4j+19 */
            xs4[g * 8 + ((2 * j) ^ sw)] = make_float4(lo.x * P0, hi.x * P1, lo.y * P2, hi.y * P3);
            xs4[g * 8 + ((2 * j + 1) ^ sw)] = make_float4(lo.z * P4, hi.z * P5, lo.w * P4, hi.w * P5);
            if (j == 0) xsum[g] = s * pow2f(GEMV_XE - 149);
        }
    }
    __syncthreads();
}

/* Slot r of a tile -> (matrix m, row rr); false past the end. */
template <int R>
__device__ __forceinline__ bool tile_row(const gemv_kargs &k, bool swiglu, int64_t tile, int r, int &m, int64_t &rr) {
    if (swiglu) {
        int64_t gr = tile * (R / 2) + (r >> 1);
        m = r & 1;
        rr = gr;
        bool ok = gr < k.a.w[0].rows;
        if (!ok) rr = 0;
        return ok;
    }
    int64_t gr = tile * R + r;
    m = (gr >= k.start[1]) + (gr >= k.start[2]);
    bool ok = gr < k.total;
    if (!ok) m = 0;
    rr = ok ? gr - k.start[m] : 0;
    return ok;
}

/* After the last chunk of a tile: outliers, scale back, warp reduce, and
 * the mode's epilogue (lane 0). */
template <int R>
__device__ __forceinline__ void finish_tile(const gemv_kargs &k, bool swiglu, const float4 *xs4, const float (&acc)[R],
                                            const int (&mi)[R], const int64_t (&row)[R], const bool (&ok)[R],
                                            unsigned long long &best) {
    const spx_gemv_args &a = k.a;
    const int lane = threadIdx.x & 31;
    float tot[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        float o = 0.0f;
        if (ok[r]) {
            const spx_dqmat &w = a.w[mi[r]];
            const __half *ov = w.oval + row[r] * w.n_out;
            for (int j = lane; j < w.n_out; j += 32)
                o = fmaf(__half2float(__ldg(ov + j)), gemv_x_at(xs4, __ldg(w.oidx + j)), o);
        }
        tot[r] = spx_warp_sum(fmaf(acc[r], pow2f(149 - GEMV_XE), o));
    }
    if (lane != 0) return;
    if (swiglu) {
#pragma unroll
        for (int r = 0; r < R; r += 2) {
            if (!ok[r]) continue;
            float gt = tot[r], up = tot[r + 1];
            if (a.o[0].bias) gt += a.o[0].bias[row[r]];
            if (a.o[1].bias) up += a.o[1].bias[row[r]];
            a.o[0].y[row[r]] = gt / (1.0f + expf(-gt)) * up;
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (!ok[r]) continue;
        const spx_gemv_out &o = a.o[mi[r]];
        float v = tot[r];
        if (o.bias) v += o.bias[row[r]];
        if (a.mode == SPX_GEMV_ADD) {
            o.y[row[r]] += v;
        } else {
            if (o.y) o.y[row[r]] = v;
            if (a.mode == SPX_GEMV_ARGMAX) {
                unsigned long long key = spx_argmax_key(v, (int)(k.start[mi[r]] + row[r]));
                best = key > best ? key : best;
            }
        }
    }
}

__device__ __forceinline__ void argmax_block(const spx_gemv_args &a, unsigned long long best, unsigned long long *bb,
                                             int nwarps) {
    if (a.mode != SPX_GEMV_ARGMAX) return;
    if ((threadIdx.x & 31) == 0) bb[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long b = 0;
        for (int w = 0; w < nwarps; w++) b = bb[w] > b ? bb[w] : b;
        atomicMax(a.best, b);
    }
}

__host__ __device__ static inline size_t image_bytes(int64_t cols) { return ((size_t)(cols / 32) * (8 * 16 + 4) + 15) / 16 * 16; }

/* ---- default: per-warp cp.async pipeline ----------------------------------- */

template <int R, int S>
__global__ void __launch_bounds__(GP_WARPS * 32, 2) gemv_q4_pipe(const __grid_constant__ gemv_kargs k) {
    extern __shared__ float4 gemv_sm[];
    __shared__ double red[32];
    __shared__ unsigned long long bbest[GP_WARPS];
    const spx_gemv_args &a = k.a;
    const int cols = k.cols, ng = cols >> 5, cpt = (ng + 31) >> 5;
    float4 *xs4 = gemv_sm;
    float *xsum = reinterpret_cast<float *>(gemv_sm + ng * 8);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint8_t *stages = reinterpret_cast<uint8_t *>(gemv_sm) + image_bytes(cols) + (size_t)warp * S * R * GP_STAGE_ROW;
    const bool swiglu = a.mode == SPX_GEMV_SWIGLU;
    const int64_t gw = (int64_t)warp * gridDim.x + blockIdx.x, nw = (int64_t)gridDim.x * GP_WARPS;
    const int64_t my_tiles = gw < k.n_tiles ? (k.n_tiles - gw + nw - 1) / nw : 0;
    const int64_t n_chunks = my_tiles * cpt;
    const int64_t cstride = cols >> 1;

    /* Issue side: walks (tile, chunk) incrementally, the tile's row
     * addresses computed once per tile. No divisions in the loop. */
    int64_t itile = gw, ichunk = 0;
    int igi = 0, ist = 0;
    const uint8_t *icp[R], *isp[R], *izp[R];
    bool iok[R];
    auto issue_next = [&]() {
        if (ichunk < n_chunks) {
            if (igi == 0) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int m;
                    int64_t rr;
                    iok[r] = tile_row<R>(k, swiglu, itile, r, m, rr);
                    const spx_dqmat &w = a.w[m];
                    icp[r] = w.codes + rr * cstride;
                    isp[r] = reinterpret_cast<const uint8_t *>(w.scales + rr * ng);
                    izp[r] = w.zeros + rr * w.zrow;
                }
            }
            const int g = igi * 32 + lane;
            uint8_t *st = stages + ist * (R * GP_STAGE_ROW) + lane * 16;
            if (g < ng) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (!iok[r]) continue;
                    cp_async16(st + r * GP_STAGE_ROW, icp[r] + g * 16);
                    cp_async4(st + r * GP_STAGE_ROW + 512 - lane * 12,
                              reinterpret_cast<const void *>(reinterpret_cast<uintptr_t>(isp[r] + g * 2) & ~(uintptr_t)3));
                    cp_async4(st + r * GP_STAGE_ROW + 640 - lane * 12,
                              reinterpret_cast<const void *>(reinterpret_cast<uintptr_t>(izp[r] + (g >> 1)) & ~(uintptr_t)3));
                }
            }
            if (++igi == cpt) {
                igi = 0;
                itile += nw;
            }
            if (++ist == S) ist = 0;
            ichunk++;
        }
        cp_commit();
    };

    spx_pdl_trigger();
#pragma unroll
    for (int c = 0; c < S - 1; c++) issue_next(); /* the weight stream starts before the image is built */
    spx_pdl_wait();                               /* x comes from the previous kernel */
    build_image(a, cols, xs4, xsum, red);

    /* Consume side: the same walk, S - 1 chunks behind. */
    unsigned long long best = 0;
    float acc[R];
    int mi[R], spar[R], zb[R];
    int64_t row[R];
    bool ok[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    int64_t ctile = gw;
    int cgi = 0, cst = 0;
    for (int64_t c = 0; c < n_chunks; c++) {
        issue_next();
        cp_wait<S - 1>(); /* chunk c has landed (this lane's copies) */
        if (cgi == 0) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                ok[r] = tile_row<R>(k, swiglu, ctile, r, mi[r], row[r]);
                spar[r] = (int)((row[r] * ng) & 1);
                zb[r] = (int)((row[r] * a.w[mi[r]].zrow) & 3);
            }
        }
        const int g = cgi * 32 + lane;
        if (g < ng) {
            const uint8_t *st = stages + cst * (R * GP_STAGE_ROW) + lane * 16;
            uint4 cw[R];
            float sc[R], zf[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (ok[r]) {
                    cw[r] = *reinterpret_cast<const uint4 *>(st + r * GP_STAGE_ROW);
                    const uint32_t sword = *reinterpret_cast<const uint32_t *>(st + r * GP_STAGE_ROW + 512 - lane * 12);
                    const uint32_t zword = *reinterpret_cast<const uint32_t *>(st + r * GP_STAGE_ROW + 640 - lane * 12);
                    sc[r] = __half2float(__ushort_as_half((unsigned short)(sword >> (((spar[r] + g) & 1) * 16))));
                    zf[r] = (float)((zword >> (((zb[r] + (g >> 1)) & 3) * 8 + (g & 1) * 4)) & 15);
                } else {
                    cw[r] = make_uint4(0, 0, 0, 0);
                    sc[r] = 0.0f;
                    zf[r] = 0.0f;
                }
            }
            float part[R];
            group_dots<R>(cw, xs4 + g * 8, g & 7, part);
            const float xsg = xsum[g];
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = fmaf(sc[r], fmaf(-zf[r], xsg, part[r]), acc[r]);
        }
        if (++cgi == cpt) {
            finish_tile<R>(k, swiglu, xs4, acc, mi, row, ok, best);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = 0.0f;
            cgi = 0;
            ctile += nw;
        }
        if (++cst == S) cst = 0;
    }
    cp_wait<0>();
    argmax_block(a, best, bbest, GP_WARPS);
}

/* ---- impl 1: the first version, loads into registers ---------------------- */

template <int R, int U>
__global__ void __launch_bounds__(GR_WARPS * 32, 1) gemv_q4_regs(const __grid_constant__ gemv_kargs k) {
    extern __shared__ float4 gemv_sm[];
    __shared__ double red[32];
    __shared__ unsigned long long bbest[GR_WARPS];
    const spx_gemv_args &a = k.a;
    const int cols = k.cols, ng = cols >> 5;
    float4 *xs4 = gemv_sm;
    float *xsum = reinterpret_cast<float *>(gemv_sm + ng * 8);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    spx_pdl_trigger();
    spx_pdl_wait();
    build_image(a, cols, xs4, xsum, red);
    const int64_t cstride = cols >> 1;
    const bool swiglu = a.mode == SPX_GEMV_SWIGLU;
    unsigned long long best = 0;
    for (int64_t tile = (int64_t)warp * gridDim.x + blockIdx.x; tile < k.n_tiles; tile += (int64_t)gridDim.x * GR_WARPS) {
        int mi[R];
        int64_t row[R];
        bool ok[R];
#pragma unroll
        for (int r = 0; r < R; r++) ok[r] = tile_row<R>(k, swiglu, tile, r, mi[r], row[r]);
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        for (int g0 = 0; g0 < ng; g0 += 32 * U) {
            uint4 c[U][R];
            float sc[U][R], zf[U][R];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int g = g0 + 32 * u + lane;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const spx_dqmat &w = a.w[mi[r]];
                    if (g < ng && ok[r]) {
                        c[u][r] = ld_stream16(w.codes + row[r] * cstride + (int64_t)g * 16);
                        sc[u][r] = __half2float(__ldg(w.scales + row[r] * ng + g));
                        zf[u][r] = (float)((__ldg(w.zeros + row[r] * w.zrow + (g >> 1)) >> ((g & 1) << 2)) & 15);
                    } else {
                        c[u][r] = make_uint4(0, 0, 0, 0);
                        sc[u][r] = 0.0f;
                        zf[u][r] = 0.0f;
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                int g = g0 + 32 * u + lane;
                if (g < ng) {
                    float part[R];
                    group_dots<R>(c[u], xs4 + g * 8, g & 7, part);
                    const float xsg = xsum[g];
#pragma unroll
                    for (int r = 0; r < R; r++) acc[r] = fmaf(sc[u][r], fmaf(-zf[u][r], xsg, part[r]), acc[r]);
                }
            }
        }
        finish_tile<R>(k, swiglu, xs4, acc, mi, row, ok, best);
    }
    argmax_block(a, best, bbest, GR_WARPS);
}

/* ---- dispatch ------------------------------------------------------------------ */

typedef void (*gemv_fn)(const gemv_kargs);
struct gemv_impl {
    gemv_fn fn;
    int R, warps;
    size_t stage_bytes; /* per block, beside the image */
    int64_t max_cols;   /* widest input it takes */
};

#define PIPE(R, S) {gemv_q4_pipe<R, S>, R, GP_WARPS, (size_t)GP_WARPS * (S) * (R) * GP_STAGE_ROW, 0}
/* The pipelined variants, narrowest first: 3 stages leave room for two
 * blocks per multiprocessor on short rows; long rows get deeper stages
 * (one block); the widest get R = 2. */
static const gemv_impl g_pipe[] = {PIPE(4, 3), PIPE(4, 4), PIPE(2, 4)};
static const int64_t g_pipe_cols[] = {8192, 28672, SPX_GEMV_MAX_COLS};
static const gemv_impl g_regs = {gemv_q4_regs<4, 2>, 4, GR_WARPS, 0, SPX_GEMV_MAX_COLS};
#define N_PIPE ((int)(sizeof g_pipe / sizeof g_pipe[0]))

int spx_gemv_q4_impls(void) { return 2; }

static size_t smem_of(const gemv_impl &im, int64_t cols) { return image_bytes(cols) + im.stage_bytes; }

cudaError_t spx_gemv_q4_setup(int64_t max_cols) {
    /* Always for the largest supported width: the attribute is per process,
     * a second model must not lower it under the first one's needs, and a
     * high limit costs nothing (occupancy follows each launch's size). */
    if (max_cols > SPX_GEMV_MAX_COLS) return cudaErrorInvalidValue;
    for (int i = 0; i < N_PIPE; i++) {
        cudaError_t err = cudaFuncSetAttribute(g_pipe[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem_of(g_pipe[i], g_pipe_cols[i]));
        if (err != cudaSuccess) return err;
    }
    return cudaFuncSetAttribute(g_regs.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem_of(g_regs, SPX_GEMV_MAX_COLS));
}

cudaError_t spx_gemv_q4(const spx_gemv_args &a, int n_sm, cudaStream_t st, bool pdl) {
    if (a.n_mats < 1 || a.n_mats > SPX_GEMV_MAX_MATS || (a.mode == SPX_GEMV_SWIGLU && a.n_mats != 2))
        return cudaErrorInvalidValue;
    gemv_kargs k;
    k.a = a;
    k.cols = (int)a.w[0].cols;
    if (k.cols <= 0 || k.cols % 32 || k.cols > SPX_GEMV_MAX_COLS) return cudaErrorInvalidValue;
    if ((reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(a.gain)) & 15) return cudaErrorInvalidValue;
    const gemv_impl *im = &g_regs;
    if (a.impl == 0) {
        int i = 0;
        while (k.cols > g_pipe_cols[i]) i++;
        im = &g_pipe[i];
    } else if (a.impl != 1) {
        return cudaErrorInvalidValue;
    }
    const int R = im->R;
    k.start[0] = 0;
    for (int i = 0; i < SPX_GEMV_MAX_MATS; i++) {
        if (i < a.n_mats) {
            if (a.w[i].cols != k.cols) return cudaErrorInvalidValue;
            k.start[i + 1] = k.start[i] + a.w[i].rows;
        } else {
            k.start[i + 1] = INT64_MAX;
        }
    }
    k.total = k.start[a.n_mats];
    if (a.mode == SPX_GEMV_SWIGLU) {
        if (a.w[1].rows != a.w[0].rows) return cudaErrorInvalidValue;
        k.n_tiles = (a.w[0].rows + R / 2 - 1) / (R / 2);
    } else {
        k.n_tiles = (k.total + R - 1) / R;
    }
    const size_t smem = smem_of(*im, k.cols);
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, im->fn, im->warps * 32, smem) != cudaSuccess || occ < 1)
        occ = 1;
    int64_t blocks = (k.n_tiles + im->warps - 1) / im->warps;
    const int64_t cap = (int64_t)(n_sm > 0 ? n_sm : 1) * occ;
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    cudaError_t err = spx_launch(im->fn, dim3((unsigned)blocks), dim3(im->warps * 32), smem, st, pdl, k);
    return err != cudaSuccess ? err : cudaGetLastError();
}
