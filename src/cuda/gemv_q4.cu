/* gemv_q4.cu: the fused W4A16 GEMV (see gemv_q4.cuh).
 *
 * impl 0 (default): int8 tensor cores (mma.sync m16n8k32, s8 x s8 -> s32).
 *
 * Input image. Each block first writes the input vector into shared memory
 * as, per group of 32 columns, a power-of-two step S = 2^(E-14) (2^E > max
 * |x| of the group) and the integers X = rint(x / S), |X| <= 2^14, each
 * split into two signed 8-bit digits X = d0 + 256 d1 (rounding and digit
 * split with one FFMA against the magic 1.5*2^23 + 128 and byte permutes),
 * plus -sum_k X_k for the zero point. Precision: 2^-15 of the group's
 * largest |x|, finer than fp16 activations. rmsnorm(x) * gain: the image is
 * of x * gain, the 1/rms factor is applied to each row's sum.
 *
 * Tiles of 16 rows (SWIGLU: 8 gate rows over the same 8 up rows), one tile
 * per block at a time (grid-stride over tiles); the block's 8 warps split
 * the columns (K) of a tile, and their sums meet in shared memory (a fixed
 * order: deterministic). A warp works in "items" of 4 groups x 16 rows.
 * Lane l (t = l % 4, r = l / 4) loads, for rows r and r + 8 of the tile,
 * the whole group g = 4 * item + t (16 bytes), its fp16 scale and zero
 * nibble (and the outlier value of column index g, see below), into a
 * ring of P = 4 items in registers (128 registers: two blocks of 8 warps
 * per multiprocessor); the first items are loaded before the input exists,
 * under programmatic dependent launch. Items are consumed two at a time
 * (their MMA chains side by side, each item's 4 MMAs as two chains of 2),
 * then the two freed slots are refilled 4 items ahead.
 *
 * Why this is cheap: in the A fragment of m16n8k32 lane (t, r) holds, for
 * rows r and r + 8, the 8 k-slots 4t..4t+3 and 4t+16..4t+19, and byte j of
 * 32-bit word m of a group holds codes 4m + j (low nibble) and 4m + j + 16
 * (high nibble): so word m of lane t's group, masked (w & 0x0f0f0f0f) and
 * shifted ((w >> 4) & 0x0f0f0f0f), IS the A fragment of the item's m-th
 * MMA, with the k-slots of lane t standing for lane t's own group. The
 * B columns 2t and 2t + 1 carry the digits d0, d1 of group t's inputs (zero
 * in the other groups' k-slots), so after 4 MMAs D[row][2t + p] = sum over
 * the 32 columns of group t of q * d_p, exactly, in the very lane that
 * loaded that group, with its scale and zero point at hand:
 *     sum_k (q_k - z) x_k = S * (D0 + 256 D1 - z * sum_k X_k)   (exact integer)
 * then one I2F and one FFMA with the fp16 scale (float32 from there on).
 * The arithmetic is about 0.8 instructions per weight; with addressing,
 * loads, walkers and the tile epilogue ncu put the whole (unpaired) kernel
 * at roughly 3.8 (the previous kernel: 4.8). What limits it (ncu, H200):
 * each warp's dependency chain (~13 cycles between its instructions), not
 * bytes in flight: 8 warps per multiprocessor with 9 items in flight each
 * ran 20-40% slower than 16 warps with 3 (bench/gpu/NOTES.md).
 *
 * Outliers ride in the same stream: lane (t, r) also loads outlier value
 * j = g of its rows (j < 32 * items per warp; the rest, only when a matrix
 * has more outliers than n_groups, after the tile), times x[idx[j]] * gain
 * from a table in shared memory.
 *
 * impl 1: the previous float32 kernel (per-warp cp.async pipeline), kept
 * for comparison and for launches the first one does not take (shared
 * memory over the limit: huge outlier counts). Its notes follow.
 *
 * Layout of the work: a block first builds an image of the input vector in
 * shared memory (optionally RMS-normalised), then each warp computes R
 * rows at a time ("tile"), grid-striding over tiles. In a tile, lane l
 * takes groups l, l+32, ... (one "chunk" = 32 groups): a 16-byte load of
 * codes (a whole group of 32 weights) per row, its fp16 scale and zero
 * nibble.
 *
 * gemv_q4_pipe: each warp streams its chunks through a
 * private S-stage cp.async pipeline in shared memory (codes 16 B, and the
 * aligned 4-byte words holding the scale and the zero nibble), S - 1
 * chunks ahead of the one it computes, continuing across tiles; every lane
 * only reads back what it copied itself, so no barrier is needed. The
 * first chunks are issued before the input image is built, so the weight
 * stream starts at once. A decode GEMV is bound by the bytes in flight:
 * 8 warps x (S - 1) x R x 512 B per block. (Its first version, loads into
 * registers, was removed with the tensor-core kernel: see bench/gpu/NOTES.md.)
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

#include <stdlib.h>
#include <string.h>

#define GEMV_XE 100 /* x is pre-scaled by up to 2^XE: |x| < 2^27 stays finite */
#define GP_WARPS 8  /* warps per block, pipelined kernel */
#define GP_STAGE_ROW 768 /* bytes per (stage, row): 512 codes + 128 scale words + 128 zero words */
#define GM_WARPS 8  /* warps per block, tensor-core kernel */

struct gemv_kargs {
    spx_gemv_args a;
    int64_t start[SPX_GEMV_MAX_MATS + 1]; /* first global row of each matrix; unused: INT64_MAX */
    int64_t total;
    int64_t n_tiles;
    int cols;
    /* impl 0 only */
    int n_items;                     /* 4-group items per row: ceil(n_groups / 4) */
    int niw;                         /* items per warp per tile: ceil(n_items / GM_WARPS), rounded up to even */
    int out_off[SPX_GEMV_MAX_MATS];  /* each matrix's first slot in the outlier input table */
    int n_out_tot;                   /* slots in that table */
    int n_out_max;                   /* most outliers of one matrix */
    int64_t tstart[SPX_GEMV_MAX_MATS + 1]; /* tiled: first tile of each matrix; unused: INT64_MAX */
    int early_oidx; /* tiled: each thread's first outlier index of every matrix loaded before the PDL wait */
    int pair;       /* tiled gate/up (spx_gemv_args.pair): group 0 of a block gate tiles, group 1 the same rows' up */
    int early_store; /* tiled, P = 4: the first tile's bias before the PDL wait, its old y (ADD) right after it */
#ifdef SPX_GEMV_DIAG
    int diag; /* diagnostic builds only (SPECTRA_GEMV_DIAG): 1 no image, 2 no arithmetic, 4 no weight loads */
#endif
};
#ifdef SPX_GEMV_DIAG
#define GM_DIAG(k, b) ((k).diag & (b))
#else
#define GM_DIAG(k, b) 0
#endif

__device__ __forceinline__ float pow2f(int e) { return __int_as_float((127 + e) << 23); }

__device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}


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


/* ---- impl 0: int8 tensor cores (see the top of this file) --------------- */

#define GM_IMG_GROUP 64   /* image bytes per group: 2 digit planes x 4 words x (4 low + 4 high k-slots) */
#define GM_MAGIC 12583040.0f /* 1.5 * 2^23 + 128: fma(x, c, GM_MAGIC) has the bits 0x4B400000 + X + 128 */

/* One item of a lane: rows r and r + 8 of the tile, group g = 4 * item + t. */
struct gm_item {
    uint4 c0, c1;       /* codes */
    unsigned s0, s1;    /* fp16 scales */
    unsigned z0, z1;    /* zero-point bytes */
    unsigned o0, o1;    /* fp16 outlier values, column index g */
};

__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Slot i (0..15) of tile -> (matrix m, row rr); false past the end. */
__device__ __forceinline__ bool gm_row(const gemv_kargs &k, bool swiglu, int64_t tile, int i, int &m, int64_t &rr) {
    if (swiglu) {
        rr = tile * 8 + (i & 7);
        m = i >> 3;
        const bool ok = rr < k.a.w[0].rows;
        if (!ok) rr = 0;
        return ok;
    }
    const int64_t gr = tile * 16 + i;
    const bool ok = gr < k.total;
    m = ok ? (int)(gr >= k.start[1]) + (int)(gr >= k.start[2]) : 0;
    rr = ok ? gr - k.start[m] : 0;
    return ok;
}

__device__ __forceinline__ uint32_t gm_digits_lo(uint32_t u0, uint32_t u1, uint32_t u2, uint32_t u3) {
    const uint32_t t01 = __byte_perm(u0, u1, 0x5140), t23 = __byte_perm(u2, u3, 0x5140);
    return __byte_perm(t01, t23, 0x5410) ^ 0x80808080u; /* d0 = (X + 128) mod 256 - 128 */
}
__device__ __forceinline__ uint32_t gm_digits_hi(uint32_t u0, uint32_t u1, uint32_t u2, uint32_t u3) {
    const uint32_t t01 = __byte_perm(u0, u1, 0x5140), t23 = __byte_perm(u2, u3, 0x5140);
    return __byte_perm(t01, t23, 0x7632); /* d1 = (X + 128) >> 8 */
}
__device__ __forceinline__ unsigned gm_absbits(float v) { return __float_as_uint(v) & 0x7fffffffu; }
/* silu(g) * u with the CPU's operations in its order (spx_cpu_silu_mul) */
__device__ __forceinline__ float gm_silu(float g) { return g / (1.0f + expf(-g)); }

/* The input image (see the top), the outlier input table, and the rmsnorm
 * factor (1 without gain). Threads take (group g, word w) slots: columns
 * 32g + 4w..+3 (low k-slots) and 32g + 16 + 4w..+3 (high). HAVE_OI:
 * oi0..oi2 hold outlier index threadIdx.x of matrices 0..2 (where it
 * exists), loaded before the PDL wait: the first pass over the outlier
 * table waits one L2 round trip (x[index]) instead of two, the first of
 * them a DRAM miss (bench/gpu/NOTES.md 32). Ends with a barrier. */
template <bool HAVE_OI = false>
__device__ __forceinline__ float gm_build(const gemv_kargs &k, uint8_t *img, int2 *meta, float *xo, double *redd,
                                          int oi0 = 0, int oi1 = 0, int oi2 = 0) {
    const spx_gemv_args &a = k.a;
    const int ng = k.cols >> 5, nslots = k.n_items * 16, tid = threadIdx.x;
    const float4 *x4 = reinterpret_cast<const float4 *>(a.x);
    const float4 *g4 = reinterpret_cast<const float4 *>(a.gain);
    double ss = 0;
    for (int base = 0; base < nslots; base += blockDim.x) { /* the same trip count in every thread */
        const int i = base + tid, g = i >> 2, w = i & 3;
        float4 lo = make_float4(0, 0, 0, 0), hi = lo;
        if (i < nslots && g < ng) {
            lo = __ldg(x4 + g * 8 + w);
            hi = __ldg(x4 + g * 8 + 4 + w);
            if (a.x2) { /* silu(gate) * up, as spx_cpu_silu_mul (silu applied by the gate's GEMV) */
                const float4 *u4 = reinterpret_cast<const float4 *>(a.x2);
                const float4 ul = __ldg(u4 + g * 8 + w), uh = __ldg(u4 + g * 8 + 4 + w);
                lo = make_float4(lo.x * ul.x, lo.y * ul.y, lo.z * ul.z, lo.w * ul.w);
                hi = make_float4(hi.x * uh.x, hi.y * uh.y, hi.z * uh.z, hi.w * uh.w);
            }
            if (a.gain) {
                ss += (double)lo.x * lo.x + (double)lo.y * lo.y + (double)lo.z * lo.z + (double)lo.w * lo.w;
                ss += (double)hi.x * hi.x + (double)hi.y * hi.y + (double)hi.z * hi.z + (double)hi.w * hi.w;
                const float4 gl = __ldg(g4 + g * 8 + w), gh = __ldg(g4 + g * 8 + 4 + w);
                lo = make_float4(lo.x * gl.x, lo.y * gl.y, lo.z * gl.z, lo.w * gl.w);
                hi = make_float4(hi.x * gh.x, hi.y * gh.y, hi.z * gh.z, hi.w * gh.w);
            }
        }
        /* max |x| of the group as bits (NaN and inf order above every finite value) */
        unsigned mb = max(max(max(gm_absbits(lo.x), gm_absbits(lo.y)), max(gm_absbits(lo.z), gm_absbits(lo.w))),
                          max(max(gm_absbits(hi.x), gm_absbits(hi.y)), max(gm_absbits(hi.z), gm_absbits(hi.w))));
        mb = max(mb, __shfl_xor_sync(0xffffffffu, mb, 1));
        mb = max(mb, __shfl_xor_sync(0xffffffffu, mb, 2));
        const int E = max((int)(mb >> 23) - 126, -100); /* max |x| < 2^E; tiny groups: step 2^-114 */
        const float c = __int_as_float((141 - E) << 23); /* 2^(14 - E): |x c| < 2^14 */
        float S = __int_as_float((113 + E) << 23);       /* 2^(E - 14) */
        if (mb >= 0x7f800000u) S = __int_as_float(0x7fc00000); /* inf / NaN in: NaN out */
        const uint32_t u0 = __float_as_uint(fmaf(lo.x, c, GM_MAGIC)), u1 = __float_as_uint(fmaf(lo.y, c, GM_MAGIC)),
                       u2 = __float_as_uint(fmaf(lo.z, c, GM_MAGIC)), u3 = __float_as_uint(fmaf(lo.w, c, GM_MAGIC)),
                       u4 = __float_as_uint(fmaf(hi.x, c, GM_MAGIC)), u5 = __float_as_uint(fmaf(hi.y, c, GM_MAGIC)),
                       u6 = __float_as_uint(fmaf(hi.z, c, GM_MAGIC)), u7 = __float_as_uint(fmaf(hi.w, c, GM_MAGIC));
        int sx = (int)(((u0 + u1) + (u2 + u3)) + ((u4 + u5) + (u6 + u7)) - 8u * 0x4B400080u); /* sum of X */
        sx += __shfl_xor_sync(0xffffffffu, sx, 1);
        sx += __shfl_xor_sync(0xffffffffu, sx, 2);
        if (i < nslots) {
            uint8_t *gi = img + g * GM_IMG_GROUP + w * 8;
            *reinterpret_cast<uint2 *>(gi) = make_uint2(gm_digits_lo(u0, u1, u2, u3), gm_digits_lo(u4, u5, u6, u7));
            *reinterpret_cast<uint2 *>(gi + 32) = make_uint2(gm_digits_hi(u0, u1, u2, u3), gm_digits_hi(u4, u5, u6, u7));
            if (w == 0) meta[g] = make_int2(__float_as_int(S), -sx);
        }
    }
    for (int m = 0; m < a.n_mats; m++) {
        const spx_dqmat &wm = a.w[m];
        const int pre = m == 0 ? oi0 : m == 1 ? oi1 : oi2;
        for (int j = tid; j < wm.n_out; j += blockDim.x) {
            const int c = HAVE_OI && j == tid ? pre : __ldg(wm.oidx + j);
            float v = __ldg(a.x + c);
            if (a.x2) v *= __ldg(a.x2 + c);
            if (a.gain) v *= __ldg(a.gain + c);
            xo[k.out_off[m] + j] = v;
        }
    }
    float inv = 1.0f;
    if (a.gain) {
        ss = spx_block_sum_d(ss, redd);
        inv = (float)(1.0 / sqrt(ss / (double)k.cols + (double)a.eps));
    }
    __syncthreads();
    return inv;
}

/* The four MMAs of one item: per lane, for rows r and r + 8 of the tile and
 * the lane's group, the exact integer sums D0 + 256 D1 of codes times the
 * input's two digit planes (the zero point's term is the caller's). */
__device__ __forceinline__ void gm_item_dot(const uint4 &c0, const uint4 &c1, const uint4 &bA, const uint4 &bB, int &s0,
                                            int &s1) {
    int d[4] = {0, 0, 0, 0}, e[4] = {0, 0, 0, 0};
    mma_s8(d, c0.x & 0x0f0f0f0fu, c1.x & 0x0f0f0f0fu, (c0.x >> 4) & 0x0f0f0f0fu, (c1.x >> 4) & 0x0f0f0f0fu, bA.x, bA.y);
    mma_s8(e, c0.z & 0x0f0f0f0fu, c1.z & 0x0f0f0f0fu, (c0.z >> 4) & 0x0f0f0f0fu, (c1.z >> 4) & 0x0f0f0f0fu, bB.x, bB.y);
    mma_s8(d, c0.y & 0x0f0f0f0fu, c1.y & 0x0f0f0f0fu, (c0.y >> 4) & 0x0f0f0f0fu, (c1.y >> 4) & 0x0f0f0f0fu, bA.z, bA.w);
    mma_s8(e, c0.w & 0x0f0f0f0fu, c1.w & 0x0f0f0f0fu, (c0.w >> 4) & 0x0f0f0f0fu, (c1.w >> 4) & 0x0f0f0f0fu, bB.z, bB.w);
    s0 = (d[0] + e[0]) + (d[1] + e[1]) * 256;
    s1 = (d[2] + e[2]) + (d[3] + e[3]) * 256;
}

/* One tiled item of a lane into its two row sums: codes c0, c1 (rows r and
 * r + 8), the packed fp16 scale pair s0, the zero byte z0 (low nibble row
 * r), the B fragments at bp and the group's (S, -sum X) meta. */
__device__ __forceinline__ void gm_tiled_item(const uint4 &c0, const uint4 &c1, unsigned s0, unsigned z0, const uint4 *bp,
                                              int2 mt, float &tot0, float &tot1) {
    const uint4 bA = bp[0], bB = bp[1]; /* two 16-byte shared loads */
    int i0, i1;
    gm_item_dot(c0, c1, bA, bB, i0, i1);
    i0 += (int)(z0 & 15u) * mt.y;
    i1 += (int)((z0 >> 4) & 15u) * mt.y;
    const float S = __int_as_float(mt.x);
    tot0 = fmaf(__half2float(__ushort_as_half((unsigned short)(s0 & 0xffffu))) * S, (float)i0, tot0);
    tot1 = fmaf(__half2float(__ushort_as_half((unsigned short)(s0 >> 16))) * S, (float)i1, tot1);
}

__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/* End of a tile: the lanes' sums (rows r and r + 8) meet in red[kb] (a
 * block barrier; NAMED: named barrier bar_id of one group of GM_WARPS
 * warps only, for a kernel with a producer warp or a second group beside
 * them) and the group's warp 0 adds the warps' parts: returns true in that
 * warp, where lane i < 16 then holds slot i's sum times inv in v (lanes
 * 16..31: the same as lane i - 16). */
template <bool NAMED = false>
__device__ __forceinline__ bool gm_tile_reduce(float tot0, float tot1, float (&red)[2][GM_WARPS][16], int kb, float inv,
                                               float &v, int bar_id = 1) {
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % GM_WARPS, t = lane & 3, r = lane >> 2;
    tot0 += __shfl_xor_sync(0xffffffffu, tot0, 1);
    tot1 += __shfl_xor_sync(0xffffffffu, tot1, 1);
    tot0 += __shfl_xor_sync(0xffffffffu, tot0, 2);
    tot1 += __shfl_xor_sync(0xffffffffu, tot1, 2);
    if (t == 0) {
        red[kb][warp][r] = tot0;
        red[kb][warp][r + 8] = tot1;
    }
    if (NAMED) named_sync(bar_id, GM_WARPS * 32);
    else __syncthreads();
    if (warp != 0) return false;
    const int i = lane & 15;
    v = 0.0f;
#pragma unroll
    for (int w = 0; w < GM_WARPS; w++) v += red[kb][w][i];
    v *= inv;
    return true;
}

/* Row rr of matrix m gets v as the mode says (STORE, ADD, ARGMAX). With
 * have_pre, pre holds what the caller loaded earlier (gm_tiled_run's first
 * tile): with ADD the row's old y, else its bias; the rest loads here. */
__device__ __forceinline__ void gm_store(const gemv_kargs &k, int m, int64_t rr, float v, unsigned long long &best,
                                         bool have_pre = false, float pre = 0.0f) {
    const spx_gemv_args &a = k.a;
    const spx_gemv_out &o = a.o[m];
    const bool add = a.mode == SPX_GEMV_ADD;
    if (o.bias) v += have_pre && !add ? pre : o.bias[rr];
    if (add) {
        o.y[rr] = (have_pre ? pre : o.y[rr]) + v;
    } else {
        if (o.y) o.y[rr] = o.silu ? gm_silu(v) : v;
        if (a.mode == SPX_GEMV_ARGMAX) {
            const unsigned long long key = spx_argmax_key(v, (int)(k.start[m] + rr));
            best = key > best ? key : best;
        }
    }
}

/* End of a tile of the row-major kernel: each row as the mode says
 * (SwiGLU: slots i and i + 8 are gate and up of one row); ARGMAX keys go
 * into best. */
__device__ __forceinline__ void gm_tile_out(const gemv_kargs &k, bool swiglu, int64_t tile, float tot0, float tot1,
                                            float (&red)[2][GM_WARPS][16], int kb, float inv,
                                            unsigned long long &best) {
    const spx_gemv_args &a = k.a;
    float v;
    if (!gm_tile_reduce(tot0, tot1, red, kb, inv, v)) return;
    const int lane = threadIdx.x & 31, i = lane & 15;
    int m;
    int64_t rr;
    const bool ok = gm_row(k, swiglu, tile, i, m, rr) && lane < 16;
    if (swiglu) {
        float up = __shfl_down_sync(0xffffffffu, v, 8);
        if (ok && i < 8) {
            float gt = v;
            if (a.o[0].bias) gt += a.o[0].bias[rr];
            if (a.o[1].bias) up += a.o[1].bias[rr];
            a.o[0].y[rr] = gm_silu(gt) * up;
        }
    } else if (ok) {
        gm_store(k, m, rr, v, best);
    }
}

/* After the last tile: warp 0's ARGMAX keys into *a.best. */
__device__ __forceinline__ void gm_argmax_flush(const spx_gemv_args &a, unsigned long long best) {
    if (a.mode != SPX_GEMV_ARGMAX || (threadIdx.x >> 5) % GM_WARPS != 0) return; /* warp 0 of each group */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long b = __shfl_xor_sync(0xffffffffu, best, o);
        best = b > best ? b : best;
    }
    if ((threadIdx.x & 31) == 0 && best) atomicMax(a.best, best);
}

/* P: items per warp in registers; MINB: blocks per multiprocessor (register
 * budget); PAIR: consume items two at a time (P - 2 in flight meanwhile),
 * else one at a time (P - 1 in flight). */
template <int P, int MINB, bool PAIR>
__global__ void __launch_bounds__(GM_WARPS * 32, MINB) gemv_q4_mma(const __grid_constant__ gemv_kargs k) {
    extern __shared__ float4 gemv_sm[];
    __shared__ float red[2][GM_WARPS][16];
    __shared__ double redd[32];
    const spx_gemv_args &a = k.a;
    const int ng = k.cols >> 5, n_items = k.n_items, niw = k.niw;
    uint8_t *img = reinterpret_cast<uint8_t *>(gemv_sm);
    int2 *meta = reinterpret_cast<int2 *>(img + (size_t)n_items * 4 * GM_IMG_GROUP);
    uint4 *zero = reinterpret_cast<uint4 *>(meta + n_items * 4); /* 32 bytes of zeros */
    float *xo = reinterpret_cast<float *>(zero + 2);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3, r = lane >> 2;
    const bool swiglu = a.mode == SPX_GEMV_SWIGLU;
    const int64_t G = gridDim.x;
    const int ntl = (int)((k.n_tiles - 1 - blockIdx.x) / G) + 1; /* tiles of this block (grid <= n_tiles) */
    const int total = ntl * niw;                                 /* items of each warp */
    const int iw0 = warp * niw;                                  /* this warp's first item of a row */
    const int64_t cstride = k.cols >> 1;
    const int sl = 32 * niw; /* outlier indices carried in the item stream */

    /* Issue side: (tile, item) walked incrementally, row addresses once per tile. */
    int is_n = 0, is_j = 0;
    int64_t is_tile = blockIdx.x;
    const uint8_t *ic0 = nullptr, *ic1 = nullptr, *iz0 = nullptr, *iz1 = nullptr;
    const unsigned short *is0 = nullptr, *is1 = nullptr, *io0 = nullptr, *io1 = nullptr;
    int ino0 = 0, ino1 = 0;
    bool iok0 = false, iok1 = false;
    auto set_rows = [&](int i, bool &ok, const uint8_t *&cp, const unsigned short *&sp, const uint8_t *&zp,
                        const unsigned short *&op, int &no) {
        int m;
        int64_t rr;
        ok = gm_row(k, swiglu, is_tile, i, m, rr);
        const spx_dqmat &w = a.w[m];
        cp = w.codes + rr * cstride;
        sp = reinterpret_cast<const unsigned short *>(w.scales) + rr * ng;
        zp = w.zeros + rr * w.zrow;
        op = reinterpret_cast<const unsigned short *>(w.oval) + rr * w.n_out;
        no = ok ? w.n_out : 0;
    };
    auto issue = [&](gm_item &it) {
        if (is_n < total) {
            if (is_j == 0) {
                set_rows(r, iok0, ic0, is0, iz0, io0, ino0);
                set_rows(r + 8, iok1, ic1, is1, iz1, io1, ino1);
            }
            const int g = (iw0 + is_j) * 4 + t;
            const bool in = g < ng;
            it.c0 = make_uint4(0, 0, 0, 0);
            it.c1 = it.c0;
            it.s0 = it.s1 = it.z0 = it.z1 = it.o0 = it.o1 = 0;
            if (in && iok0) {
                it.c0 = ld_stream16(ic0 + (int64_t)g * 16);
                it.s0 = __ldg(is0 + g);
                it.z0 = __ldg(iz0 + (g >> 1));
            }
            if (in && iok1) {
                it.c1 = ld_stream16(ic1 + (int64_t)g * 16);
                it.s1 = __ldg(is1 + g);
                it.z1 = __ldg(iz1 + (g >> 1));
            }
            if (g < ino0) it.o0 = __ldg(io0 + g);
            if (g < ino1) it.o1 = __ldg(io1 + g);
            if (++is_j == niw) {
                is_j = 0;
                is_tile += G;
            }
            is_n++;
        }
    };

    gm_item buf[P];
    spx_pdl_trigger();
#pragma unroll
    for (int s = 0; s < P; s++) issue(buf[s]); /* weights only: before the input exists */
    spx_pdl_wait();
    if (threadIdx.x < 2) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
    const float inv = gm_build(k, img, meta, xo, redd);

    /* B fragment of this lane: column r = (group t' = r / 2, digit plane r % 2),
     * nonzero only in the k-slots of lane t = t'. */
    const bool bval = t == (r >> 1);
    const uint8_t *bbase = bval ? img + t * GM_IMG_GROUP + (r & 1) * 32 : reinterpret_cast<const uint8_t *>(zero);
    const int bstride = bval ? 4 * GM_IMG_GROUP : 0;
    const int zsh = (t & 1) * 4;

    /* Consume side: the same walk, P items behind. */
    int ck = 0, cj = 0;
    int64_t ctile = blockIdx.x;
    float tot0 = 0.0f, tot1 = 0.0f;
    int cno0 = 0, cno1 = 0;
    const float *cxo0 = xo, *cxo1 = xo;
    const unsigned short *cop0 = nullptr, *cop1 = nullptr;
    unsigned long long best = 0;
    auto crow = [&](int i, int &no, const float *&xp, const unsigned short *&op) {
        int m;
        int64_t rr;
        const bool ok = gm_row(k, swiglu, ctile, i, m, rr);
        const spx_dqmat &w = a.w[m];
        no = ok ? w.n_out : 0;
        xp = xo + k.out_off[m];
        op = reinterpret_cast<const unsigned short *>(w.oval) + rr * w.n_out;
    };
    /* Item cj + h of the tile. Two independent MMA chains (words 0-1, 2-3):
     * the kernel is bound by each warp's dependency latency. */
    auto consume = [&](const gm_item &it, int h) {
        const int item = iw0 + cj + h, bi = item < n_items ? item : n_items - 1, g = item * 4 + t;
        const uint4 *bp = reinterpret_cast<const uint4 *>(bbase + bi * bstride);
        const uint4 bA = bp[0], bB = bp[1]; /* two 16-byte shared loads */
        int i0, i1;
        gm_item_dot(it.c0, it.c1, bA, bB, i0, i1);
        const int2 mt = meta[bi * 4 + t]; /* (S, -sum X) of group g */
        i0 += (int)((it.z0 >> zsh) & 15u) * mt.y;
        i1 += (int)((it.z1 >> zsh) & 15u) * mt.y;
        const float S = __int_as_float(mt.x);
        tot0 = fmaf(__half2float(__ushort_as_half((unsigned short)it.s0)) * S, (float)i0, tot0);
        tot1 = fmaf(__half2float(__ushort_as_half((unsigned short)it.s1)) * S, (float)i1, tot1);
        if (g < cno0) tot0 = fmaf(__half2float(__ushort_as_half((unsigned short)it.o0)), cxo0[g], tot0);
        if (g < cno1) tot1 = fmaf(__half2float(__ushort_as_half((unsigned short)it.o1)), cxo1[g], tot1);
    };
    auto finish = [&]() {
        if (k.n_out_max > sl) { /* outliers beyond the stream's share (more than n_groups of them) */
            for (int j = sl + warp * 4 + t; j < cno0; j += GM_WARPS * 4)
                tot0 = fmaf(__half2float(__ushort_as_half(__ldg(cop0 + j))), cxo0[j], tot0);
            for (int j = sl + warp * 4 + t; j < cno1; j += GM_WARPS * 4)
                tot1 = fmaf(__half2float(__ushort_as_half(__ldg(cop1 + j))), cxo1[j], tot1);
        }
        gm_tile_out(k, swiglu, ctile, tot0, tot1, red, ck & 1, inv, best);
    };

    /* PAIR: items two at a time (niw is even), two items' chains side by
     * side with no control flow between them. */
    static_assert(!PAIR || P % 2 == 0, "P must be even");
    constexpr int STEP = PAIR ? 2 : 1;
    for (int base = 0; base < total; base += P) {
#pragma unroll
        for (int s = 0; s < P; s += STEP) {
            if (base + s < total) { /* uniform over the block */
                if (cj == 0) {
                    crow(r, cno0, cxo0, cop0);
                    crow(r + 8, cno1, cxo1, cop1);
                }
                consume(buf[s], 0);
                if (PAIR) consume(buf[s + STEP - 1], 1);
                issue(buf[s]); /* P items ahead, in the slots just freed */
                if (PAIR) issue(buf[s + STEP - 1]);
                cj += STEP;
                if (cj == niw) {
                    finish();
                    tot0 = tot1 = 0.0f;
                    cj = 0;
                    ck++;
                    ctile += G;
                }
            }
        }
    }
    gm_argmax_flush(a, best);
}


/* ---- the tiled layout's kernel (gemv_q4.cuh) ----------------------------------
 * gemv_q4_mma's arithmetic, image, work split and reductions on SPX_Q_TILED
 * matrices: an item is two coalesced 512-byte code loads (rows r and r + 8
 * of the tile), one word of scales and one byte of zeros per lane, with no
 * per-row addressing. A launch is 1..3 matrices (STORE / ADD / ARGMAX)
 * whose tiles are numbered one after the other (matrix m's from
 * k.tstart[m]); a tile's pointers are set once when the walk enters it.
 * SwiGLU is not fused here: gate and up are one two-matrix launch, and
 * the down projection's input is silu(gate) * up (spx_gemv_args.x2), so
 * the tiles stay 16 rows of one matrix and the grid's share stays fine. */
/* One group's work as virtual block bid of G (GR groups of GM_WARPS warps
 * per block, sharing the input image): the first P items of its tiles are
 * issued, then the PDL wait, then the image is built (by the whole block)
 * and the tiles computed. */
template <int P, int GR>
__device__ __forceinline__ void gm_tiled_run(const gemv_kargs &k, int64_t G, int64_t bid, int64_t tile_end,
                                             float (&red)[2][GM_WARPS][16], double *redd, float (*pxg)[16]) {
    extern __shared__ float4 gemv_sm[];
    const spx_gemv_args &a = k.a;
    const int n_items = k.n_items, niw = k.niw;
    uint8_t *img = reinterpret_cast<uint8_t *>(gemv_sm);
    int2 *meta = reinterpret_cast<int2 *>(img + (size_t)n_items * 4 * GM_IMG_GROUP);
    uint4 *zero = reinterpret_cast<uint4 *>(meta + n_items * 4);
    float *xo = reinterpret_cast<float *>(zero + 2);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % GM_WARPS, t = lane & 3, r = lane >> 2;
    const int ntl = bid < tile_end ? (int)((tile_end - 1 - bid) / G) + 1 : 0;
    const int total = ntl * niw;
    const int iw0 = warp * niw;
    const int sl = 32 * niw;
    auto mat_of = [&](int64_t T) { return (int)(T >= k.tstart[1]) + (int)(T >= k.tstart[2]); };

    /* Issue side: the tile's code / scale / zero bases for this lane, its
     * first row, and the matrix's outliers. */
    int is_n = 0, is_j = 0;
    int64_t is_tile = bid;
    const uint8_t *ic = nullptr, *iz = nullptr;
    const uint32_t *isc = nullptr;
    const unsigned short *iov0 = nullptr, *iov1 = nullptr; /* outlier values of the lane's rows r, r + 8 (NULL: past the end) */
    int ino = 0;
    auto is_set = [&]() {
        const int m = mat_of(is_tile);
        const spx_dqmat &w = a.w[m];
        const int64_t ti = (is_tile - k.tstart[m]) * n_items;
        ic = w.codes + ti * 1024 + lane * 16;
        isc = reinterpret_cast<const uint32_t *>(w.scales) + ti * 32 + lane;
        iz = w.zeros + ti * 32 + lane;
        ino = w.n_out;
        const int64_t ir0 = (is_tile - k.tstart[m]) * 16 + r;
        const unsigned short *ov = reinterpret_cast<const unsigned short *>(w.oval);
        iov0 = ino && ir0 < w.rows ? ov + ir0 * ino : nullptr;
        iov1 = ino && ir0 + 8 < w.rows ? ov + (ir0 + 8) * ino : nullptr;
    };
    auto issue = [&](gm_item &it) {
        if (is_n < total) {
            const int item = iw0 + is_j, g = item * 4 + t;
            it.c0 = make_uint4(0, 0, 0, 0);
            it.c1 = it.c0;
            it.s0 = it.z0 = it.o0 = it.o1 = 0;
            if (item < n_items && !GM_DIAG(k, 4)) {
                it.c0 = ld_stream16(ic + item * 1024);
                it.c1 = ld_stream16(ic + item * 1024 + 512);
                it.s0 = __ldg(isc + item * 32);
                it.z0 = __ldg(iz + item * 32);
            }
            if (g < ino) {
                if (iov0) it.o0 = __ldg(iov0 + g);
                if (iov1) it.o1 = __ldg(iov1 + g);
            }
            is_n++;
            if (++is_j == niw) {
                is_j = 0;
                is_tile += G;
                if (is_n < total) is_set();
            }
        }
    };
    gm_item buf[P];
    if (ntl > 0) is_set();
#pragma unroll
    for (int s = 0; s < P; s++) issue(buf[s]);
    /* the image's outlier indices (weights) too: after the wait, only the inputs' L2 round trips remain */
    int oi[SPX_GEMV_MAX_MATS] = {0, 0, 0};
    static_assert(SPX_GEMV_MAX_MATS == 3, "gm_build takes three");
    constexpr bool ROOM = P >= 4; /* the 80-register form (P = 2) spills with it */
    if (ROOM && k.early_oidx) {
#pragma unroll
        for (int m = 0; m < SPX_GEMV_MAX_MATS; m++)
            if (m < a.n_mats && (int)threadIdx.x < a.w[m].n_out) oi[m] = __ldg(a.w[m].oidx + threadIdx.x);
    }
    /* the first tile's row of this lane for the store (warp 0, lanes < 16): with ADD its old y, loaded
     * right after the wait, else its bias (a weight), loaded now; that round trip is then not left
     * for the kernel's tail. One register across the loop. The two-group form only: P = 2 spills with
     * it, and the two-block form ran slower with this code in it, used or not (device run 10). */
    constexpr bool ES = ROOM && GR > 1;
    bool have_pre = false;
    float pre = 0.0f;
    const float *pre_p = nullptr;
    if (ES && k.early_store && ntl > 0 && warp == 0 && lane < 16) {
        const int m0 = mat_of(bid);
        const int64_t r0 = (bid - k.tstart[m0]) * 16 + lane;
        if (r0 < a.w[m0].rows) {
            have_pre = true;
            pre_p = a.mode == SPX_GEMV_ADD ? a.o[m0].y + r0 : a.o[m0].bias ? a.o[m0].bias + r0 : nullptr;
            if (pre_p && a.mode != SPX_GEMV_ADD) pre = __ldg(pre_p);
        }
    }
    spx_pdl_wait();
    if (GR == 1 && ntl == 0) return; /* block-uniform (GR > 1: the groups share gm_build's barriers) */
    if (ES && pre_p && a.mode == SPX_GEMV_ADD) pre = *pre_p; /* written before this launch */
    if (threadIdx.x < 2) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
    const float inv = GM_DIAG(k, 1) ? 1.0f
                      : ROOM && k.early_oidx ? gm_build<true>(k, img, meta, xo, redd, oi[0], oi[1], oi[2])
                                             : gm_build(k, img, meta, xo, redd);
    if (ntl == 0) return;
    const bool bval = t == (r >> 1);
    const uint8_t *bbase = bval ? img + t * GM_IMG_GROUP + (r & 1) * 32 : reinterpret_cast<const uint8_t *>(zero);
    const int bstride = bval ? 4 * GM_IMG_GROUP : 0;

    /* Consume side: the same walk, P items behind. */
    int ck = 0, cj = 0;
    int64_t ctile = bid;
    int cm = 0, cno = 0;
    int64_t cr0 = 0;
    const float *cxo = xo;
    auto c_set = [&]() {
        cm = mat_of(ctile);
        cno = a.w[cm].n_out;
        cxo = xo + k.out_off[cm];
        cr0 = (ctile - k.tstart[cm]) * 16;
    };
    c_set();
    float tot0 = 0.0f, tot1 = 0.0f;
    unsigned long long best = 0;
    auto consume = [&](const gm_item &it, int h) {
        const int item = iw0 + cj + h, bi = item < n_items ? item : n_items - 1, g = item * 4 + t;
        if (GM_DIAG(k, 2)) { /* diagnostics: the loads kept alive, no arithmetic */
            tot0 += __uint_as_float((it.c0.x ^ it.c0.y ^ it.c0.z ^ it.c0.w ^ it.c1.x ^ it.c1.y ^ it.c1.z ^ it.c1.w ^ it.s0 ^
                                     it.z0 ^ it.o0 ^ it.o1) & 0x007fffffu);
            return;
        }
        gm_tiled_item(it.c0, it.c1, it.s0, it.z0, reinterpret_cast<const uint4 *>(bbase + bi * bstride),
                      meta[bi * 4 + t], tot0, tot1);
        if (g < cno) {
            tot0 = fmaf(__half2float(__ushort_as_half((unsigned short)it.o0)), cxo[g], tot0);
            tot1 = fmaf(__half2float(__ushort_as_half((unsigned short)it.o1)), cxo[g], tot1);
        }
    };
    auto finish = [&]() {
        if (cno > sl) { /* outliers beyond the stream's share (more than n_groups of them) */
            const spx_dqmat &w = a.w[cm];
            const unsigned short *ov = reinterpret_cast<const unsigned short *>(w.oval);
            const int64_t r0 = cr0 + r, r1 = r0 + 8;
            for (int j = sl + warp * 4 + t; j < cno; j += GM_WARPS * 4) {
                if (r0 < w.rows) tot0 = fmaf(__half2float(__ushort_as_half(__ldg(ov + r0 * cno + j))), cxo[j], tot0);
                if (r1 < w.rows) tot1 = fmaf(__half2float(__ushort_as_half(__ldg(ov + r1 * cno + j))), cxo[j], tot1);
            }
        }
        float v;
        if (gm_tile_reduce<(GR > 1)>(tot0, tot1, red, ck & 1, inv, v, 1 + (int)(threadIdx.x >> 5) / GM_WARPS)) {
            const int i = lane & 15;
            const int64_t rr = cr0 + i;
            const bool ok = lane < 16 && rr < a.w[cm].rows;
            if (GR > 1 && k.pair) { /* warp 0 of each group: silu(gate) through shared memory to the up group */
                float *xg = pxg[ck & 1];
                if (ok && cm == 0) xg[i] = gm_silu(a.o[0].bias ? v + a.o[0].bias[rr] : v);
                named_sync(3, 64);
                if (ok && cm == 1) a.o[0].y[rr] = xg[i] * (a.o[1].bias ? v + a.o[1].bias[rr] : v);
            } else if (ok) {
                gm_store(k, cm, rr, v, best, ES && ck == 0 && have_pre, pre);
            }
        }
    };
    for (int base = 0; base < total; base += P) {
#pragma unroll
        for (int s = 0; s < P; s += 2) {
            if (base + s < total) { /* uniform over the block */
                consume(buf[s], 0);
                consume(buf[s + 1], 1);
                issue(buf[s]);
                issue(buf[s + 1]);
                cj += 2;
                if (cj == niw) {
                    finish();
                    tot0 = tot1 = 0.0f;
                    cj = 0;
                    ck++;
                    ctile += G;
                    if (ck < ntl) c_set();
                }
            }
        }
    }
    gm_argmax_flush(a, best);
}

/* GR groups of GM_WARPS warps per block, each group its own tiles (virtual
 * block blockIdx.x * GR + group of gridDim.x * GR), sharing one input
 * image: GR = 2 builds it once per SM instead of once per block (for the
 * 8B down projection the image is ~20 % of the instructions; see
 * bench/gpu/NOTES.md 27-28). k.pair (GR = 2, a gate/up launch): group 0
 * takes the gate's tiles and group 1 the same tiles of up, so at each
 * tile's end warp 0 of the gate group hands silu(gate) to warp 0 of the up
 * group through shared memory (a 64-thread named barrier; the groups run
 * in step, tile for tile), which stores silu(gate) * up: the down
 * projection's input is then one vector, not x and x2. */
template <int P, int MINB, int GR = 1>
__global__ void __launch_bounds__(GR * GM_WARPS * 32, MINB) gemv_q4_tiled(const __grid_constant__ gemv_kargs k) {
    __shared__ float red[GR][2][GM_WARPS][16];
    __shared__ double redd[32];
    __shared__ float pxg[2][16]; /* pair: a tile's silu(gate), double-buffered by tile parity */
    spx_pdl_trigger();
    const int grp = GR > 1 ? (int)(threadIdx.x >> 5) / GM_WARPS : 0;
    const bool pr = GR == 2 && k.pair; /* group g: matrix g's tiles, the same ones in both groups */
    const int64_t G = pr ? (int64_t)gridDim.x : (int64_t)gridDim.x * GR;
    const int64_t bid = pr ? blockIdx.x + (grp ? k.tstart[1] : 0) : (int64_t)blockIdx.x * GR + grp;
    gm_tiled_run<P, GR>(k, G, bid, pr ? k.tstart[grp + 1] : k.n_tiles, red[grp], redd, pxg);
}

/* ---- the tiled layout through the bulk-copy engine: gemv_q4_tiled_tma ----------
 * The tiled layout makes a tile's next TT_CI items three contiguous runs
 * (codes TT_CI KB, scales TT_CI x 128 B, zero bytes TT_CI x 32 B), and a
 * tile's 16 rows of outlier values one more ([rows, n_out] row-major). So a
 * stage of the ring is 3-4 cp.async.bulk copies issued by one producer
 * lane, completion counted in bytes on the stage's mbarrier; in-flight
 * bytes cost shared memory, not registers. NW consumer warps take items
 * w and w + NW of every stage (gemv_q4_tiled's arithmetic and image; the
 * sums run in another order, so not bit-identical to it, but
 * deterministic), the outliers with the tile's first stage, and meet per
 * tile through a named barrier of the consumers. The producer fills the
 * ring before the PDL wait. Needs: every matrix's rows a multiple of 16,
 * 16-byte aligned arrays, n_out <= TT_MAX_OUT (spx_gemv_q4 checks). (The
 * first bulk-copy kernel, on the row-major layout, copied 48 short row
 * segments per stage and ran at a quarter of copy bandwidth: NOTES.md.) */
#define TT_CI 16
#define TT_MAX_STAGES 8
#define TT_MAX_OUT 512
#define TT_NW 8

__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "TT_W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra TT_W;\n"
                 "}" ::"r"(smem_u32(b)),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
/* Bytes of one stage: codes, scales, zeros of TT_CI items, then a tile's
 * outlier rows (16 x n_out_max fp16), rounded up to 128. */
static __host__ __device__ __forceinline__ int tt_stage_bytes(int n_out_max) {
    return (TT_CI * (1024 + 128 + 32) + 32 * n_out_max + 127) & ~127;
}

__global__ void __launch_bounds__((TT_NW + 1) * 32, 1) gemv_q4_tiled_tma(const __grid_constant__ gemv_kargs k, int n_stages) {
    extern __shared__ __align__(128) uint8_t tt_sm[];
    __shared__ uint64_t full[TT_MAX_STAGES], empty[TT_MAX_STAGES];
    __shared__ float red[2][GM_WARPS][16];
    static_assert(TT_NW == GM_WARPS, "gm_tile_reduce's warps");
    __shared__ double redd[32];
    const spx_gemv_args &a = k.a;
    const int n_items = k.n_items, nch = (n_items + TT_CI - 1) / TT_CI; /* stages per tile */
    const int SB = tt_stage_bytes(k.n_out_max);
    uint8_t *ring = tt_sm;
    uint8_t *img = ring + (size_t)n_stages * SB;
    int2 *meta = reinterpret_cast<int2 *>(img + (size_t)n_items * 4 * GM_IMG_GROUP);
    uint4 *zero = reinterpret_cast<uint4 *>(meta + n_items * 4);
    float *xo = reinterpret_cast<float *>(zero + 2);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t G = gridDim.x;
    const int ntl = (int)((k.n_tiles - 1 - blockIdx.x) / G) + 1;
    const int total = ntl * nch;
    auto mat_of = [&](int64_t T) { return (int)(T >= k.tstart[1]) + (int)(T >= k.tstart[2]); };

    if (threadIdx.x == 0) {
        for (int s = 0; s < n_stages; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], TT_NW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (threadIdx.x < 2) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
    __syncthreads();

    /* producer: lane 0 of warp TT_NW */
    const bool prod = warp == TT_NW;
    int p_n = 0;
    auto produce = [&]() {
        const int slot = p_n % n_stages, c = p_n % nch;
        const int64_t T = blockIdx.x + (int64_t)(p_n / nch) * G;
        const int m = mat_of(T);
        const spx_dqmat &w = a.w[m];
        const int64_t ti = (T - k.tstart[m]) * n_items + (int64_t)c * TT_CI;
        const int cnt = min(TT_CI, n_items - c * TT_CI);
        const bool outl = c == 0 && w.n_out > 0;
        if (p_n >= n_stages) mbar_wait(&empty[slot], ((p_n / n_stages) & 1) ^ 1);
        uint8_t *st = ring + (size_t)slot * SB;
        uint64_t *f = &full[slot];
        mbar_expect_tx(f, (unsigned)(cnt * (1024 + 128 + 32) + (outl ? 32 * w.n_out : 0)));
        bulk_g2s(st, w.codes + ti * 1024, (unsigned)cnt * 1024u, f);
        bulk_g2s(st + TT_CI * 1024, reinterpret_cast<const uint8_t *>(w.scales) + ti * 128, (unsigned)cnt * 128u, f);
        bulk_g2s(st + TT_CI * 1152, w.zeros + ti * 32, (unsigned)cnt * 32u, f);
        if (outl)
            bulk_g2s(st + TT_CI * 1184, reinterpret_cast<const uint8_t *>(w.oval) + (T - k.tstart[m]) * 32 * w.n_out,
                     32u * (unsigned)w.n_out, f);
        p_n++;
    };

    spx_pdl_trigger();
    if (prod && lane == 0)
        while (p_n < total && p_n < n_stages) produce();
    spx_pdl_wait();
    const float inv = gm_build(k, img, meta, xo, redd);
    if (prod) {
        if (lane == 0)
            while (p_n < total) produce();
        return;
    }

    /* consumers */
    const int t = lane & 3, r = lane >> 2;
    const bool bval = t == (r >> 1);
    const uint8_t *bbase = bval ? img + t * GM_IMG_GROUP + (r & 1) * 32 : reinterpret_cast<const uint8_t *>(zero);
    const int bstride = bval ? 4 * GM_IMG_GROUP : 0;
    float tot0 = 0.0f, tot1 = 0.0f;
    unsigned long long best = 0;
    int cm = 0, cno = 0, ck = 0;
    int64_t cr0 = 0;
    const float *cxo = xo;
    for (int n = 0; n < total; n++) {
        const int slot = n % n_stages, c = n % nch;
        if (c == 0) {
            const int64_t T = blockIdx.x + (int64_t)ck * G;
            cm = mat_of(T);
            cno = a.w[cm].n_out;
            cxo = xo + k.out_off[cm];
            cr0 = (T - k.tstart[cm]) * 16;
        }
        mbar_wait(&full[slot], (n / n_stages) & 1);
        const uint8_t *st = ring + (size_t)slot * SB;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int li = warp + h * TT_NW, item = c * TT_CI + li;
            if (item < n_items) { /* uniform over the warp */
                const uint4 c0 = *reinterpret_cast<const uint4 *>(st + li * 1024 + lane * 16);
                const uint4 c1 = *reinterpret_cast<const uint4 *>(st + li * 1024 + 512 + lane * 16);
                const unsigned s0 = *reinterpret_cast<const unsigned *>(st + TT_CI * 1024 + li * 128 + lane * 4);
                const unsigned z0 = st[TT_CI * 1152 + li * 32 + lane];
                gm_tiled_item(c0, c1, s0, z0, reinterpret_cast<const uint4 *>(bbase + item * bstride), meta[item * 4 + t],
                              tot0, tot1);
            }
        }
        if (c == 0 && cno > 0) { /* the tile's outlier rows r and r + 8, columns j = 4 warp + t + 32 i */
            const unsigned short *ov = reinterpret_cast<const unsigned short *>(st + TT_CI * 1184);
            for (int j = warp * 4 + t; j < cno; j += TT_NW * 4) {
                tot0 = fmaf(__half2float(__ushort_as_half(ov[r * cno + j])), cxo[j], tot0);
                tot1 = fmaf(__half2float(__ushort_as_half(ov[(r + 8) * cno + j])), cxo[j], tot1);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);
        if (c == nch - 1) { /* the tile's end: the warps' sums meet (consumers only) */
            float v;
            if (gm_tile_reduce<true>(tot0, tot1, red, ck & 1, inv, v)) {
                const int i = lane & 15;
                const int64_t rr = cr0 + i;
                if (lane < 16 && rr < a.w[cm].rows) gm_store(k, cm, rr, v, best);
            }
            tot0 = tot1 = 0.0f;
            ck++;
        }
    }
    gm_argmax_flush(a, best);
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
#define N_PIPE ((int)(sizeof g_pipe / sizeof g_pipe[0]))

/* Tensor-core variants: impl 2 + i runs g_mma[i]; impl 0 runs
 * g_mma[g_default] (SPECTRA_GEMV_VARIANT=i at setup overrides it, for
 * benchmarks). Both: 4 items of 1 KB of codes per warp in registers, two
 * blocks of 8 warps per multiprocessor (128 registers); items consumed in
 * pairs (0) or one at a time (1). */
#define GM_SMEM_MAX (160 * 1024)
static const gemv_fn g_mma[] = {gemv_q4_mma<4, 2, true>, gemv_q4_mma<4, 2, false>};
static const int g_mma_maxb[] = {2, 2};
/* On the tiled layout: two blocks per multiprocessor with 4 items in flight
 * per warp (128 registers), or three with 2 (80; <4, 3> spilled); the
 * launch picks by its tile count. */
/* the tiled kernel's forms: (items in flight, blocks/SM, warp groups per block); variant v < 2 is
 * form v, variant 3 form 2 (variant 2 is the bulk-copy kernel). A tile's columns over 4 or 2 warps
 * instead of 8 lost everywhere and is gone (NOTES 28). */
static const gemv_fn g_mma_tl[] = {gemv_q4_tiled<4, 2>, gemv_q4_tiled<2, 3>, gemv_q4_tiled<4, 1, 2>};
static const int g_mma_tl_maxb[] = {2, 3, 1};
static const int g_mma_tl_groups[] = {1, 1, 2};
#define N_TL 3
static int g_tl_force = -1; /* benchmarks: spx_gemv_q4_force_tiled_variant */

static int g_tma_stages = 3; /* gemv_q4_tiled_tma's ring (SPECTRA_GEMV_TMA_STAGES): 3 gave two blocks per SM on the 8B's down projection */
#define TT_SMEM_MAX (220 * 1024) /* 227 KB per block less the static arrays */

static int g_tl_env = -1;     /* SPECTRA_GEMV_TILED_VARIANT, what force(-1) returns to */

void spx_gemv_q4_force_tiled_variant(int v) { g_tl_force = v >= 0 && v < 2 + N_TL - 1 ? v : g_tl_env; }
#define N_MMA ((int)(sizeof g_mma / sizeof g_mma[0]))
static int g_default = 0;
#ifdef SPX_GEMV_DIAG
static int g_diag = 0;
#endif
static int g_early_oidx = 1;     /* SPECTRA_GEMV_EARLY_OIDX=0: off (measurements) */
static int g_early_store = 1;    /* SPECTRA_GEMV_EARLY_STORE=0: off (measurements) */
static int g_early_oidx_env = 1; /* what spx_gemv_q4_force_early_oidx(-1) returns to */

void spx_gemv_q4_force_early_oidx(int on) { g_early_oidx = on == 0 || on == 1 ? on : g_early_oidx_env; }
/* Measurements: SPECTRA_GEMV_FORMS=abcde forces the tiled form (0, 1, 2;
 * '-': the default choice) of q/k/v, O, gate/up, down and LM-head launches */
static int g_forms[5] = {-1, -1, -1, -1, -1};
static int launch_kind(const spx_gemv_args &a) {
    return a.n_mats == 3 ? 0 : a.n_mats == 2 ? 2 : a.x2 ? 3 : a.mode == SPX_GEMV_ARGMAX ? 4 : 1;
}
static int g_groups = 1; /* SPECTRA_GEMV_GROUPS=0: spx_gemv_args.groups ignored (measurements) */

int spx_gemv_q4_impls(void) { return 2 + N_MMA; }

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
    for (int i = 0; i < N_MMA; i++) {
        cudaError_t err = cudaFuncSetAttribute(g_mma[i], cudaFuncAttributeMaxDynamicSharedMemorySize, GM_SMEM_MAX);
        if (err != cudaSuccess) return err;
    }
    for (int i = 0; i < N_TL; i++) {
        cudaError_t err = cudaFuncSetAttribute(g_mma_tl[i], cudaFuncAttributeMaxDynamicSharedMemorySize, GM_SMEM_MAX);
        if (err != cudaSuccess) return err;
    }
    cudaError_t terr = cudaFuncSetAttribute(gemv_q4_tiled_tma, cudaFuncAttributeMaxDynamicSharedMemorySize, TT_SMEM_MAX);
    if (terr != cudaSuccess) return terr;
    /* engine/tuning.h's record, read at each setup; a field at its default
     * leaves the current value (a variant forced by a test included) */
    static_assert(SPX_TUNING_TMA_STAGES_MAX == TT_MAX_STAGES && SPX_TUNING_GEMV_VARIANTS == N_MMA &&
                      SPX_TUNING_TILED_FORMS == N_TL && SPX_TUNING_TILED_VARIANTS == 2 + N_TL - 1 &&
                      SPX_TUNING_GEMV_LAUNCH_KINDS == 5,
                  "engine/tuning.h validates against these ranges");
    const spx_tuning *t = spx_tuning_get();
    if (t->gemv_tma_stages) g_tma_stages = t->gemv_tma_stages;
    if (t->gemv_groups >= 0) g_groups = t->gemv_groups;
    if (t->gemv_variant >= 0) g_default = t->gemv_variant;
#ifdef SPX_GEMV_DIAG
    g_diag = t->gemv_diag;
#endif
    for (int i = 0; i < t->gemv_forms_n; i++) g_forms[i] = t->gemv_forms[i];
    if (t->gemv_early_store >= 0) g_early_store = t->gemv_early_store;
    if (t->gemv_early_oidx >= 0) g_early_oidx = g_early_oidx_env = t->gemv_early_oidx;
    if (t->gemv_tiled_variant >= 0) g_tl_force = g_tl_env = t->gemv_tiled_variant; /* benchmarks, as force_tiled_variant */
    return cudaSuccess;
}

static cudaError_t launch_pipe(gemv_kargs &k, int n_sm, cudaStream_t st, bool pdl) {
    const spx_gemv_args &a = k.a;
    int i = 0;
    while (k.cols > g_pipe_cols[i]) i++;
    const gemv_impl *im = &g_pipe[i];
    const int R = im->R;
    if (a.mode == SPX_GEMV_SWIGLU) k.n_tiles = (a.w[0].rows + R / 2 - 1) / (R / 2);
    else k.n_tiles = (k.total + R - 1) / R;
    const size_t smem = smem_of(*im, k.cols);
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, im->fn, im->warps * 32, smem) != cudaSuccess || occ < 1)
        occ = 1;
    int64_t blocks = (k.n_tiles + im->warps - 1) / im->warps;
    const int64_t cap = (int64_t)(n_sm > 0 ? n_sm : 1) * occ;
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    return spx_launch(im->fn, dim3((unsigned)blocks), dim3(im->warps * 32), smem, st, pdl, k);
}

/* Shared memory of the tensor-core kernels: the input image (64 bytes and
 * an (S, -sum X) pair per group, in whole items), 32 bytes of zeros and
 * the outlier input table. */
static size_t tc_smem(int64_t cols, int64_t n_out_tot) {
    const int64_t n_items = (cols / 32 + 3) / 4;
    return (size_t)n_items * 4 * (GM_IMG_GROUP + 8) + 32 + (size_t)((n_out_tot + 3) & ~(int64_t)3) * 4;
}

/* Whether gemv_q4_tiled_tma takes a tiled launch (its copies' sizes and
 * alignment, its shared memory). */
static bool tma_ok(const gemv_kargs &k) {
    const spx_gemv_args &a = k.a;
    if (k.n_out_max > TT_MAX_OUT) return false;
    for (int i = 0; i < a.n_mats; i++) {
        const spx_dqmat &w = a.w[i];
        if (w.rows % 16 || ((reinterpret_cast<uintptr_t>(w.codes) | reinterpret_cast<uintptr_t>(w.scales) |
                             reinterpret_cast<uintptr_t>(w.zeros) | reinterpret_cast<uintptr_t>(w.oval)) & 15))
            return false;
    }
    return (size_t)g_tma_stages * tt_stage_bytes(k.n_out_max) + tc_smem(k.cols, k.n_out_tot) <= TT_SMEM_MAX;
}

static cudaError_t launch_tma(gemv_kargs &k, int n_sm, cudaStream_t st, bool pdl) {
    const size_t smem = (size_t)g_tma_stages * tt_stage_bytes(k.n_out_max) + tc_smem(k.cols, k.n_out_tot);
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_q4_tiled_tma, (TT_NW + 1) * 32, smem) != cudaSuccess ||
        occ < 1)
        occ = 1;
    int64_t blocks = (int64_t)(n_sm > 0 ? n_sm : 1) * occ;
    if (blocks > k.n_tiles) blocks = k.n_tiles;
    if (blocks < 1) blocks = 1;
    cudaError_t err = spx_launch(gemv_q4_tiled_tma, dim3((unsigned)blocks), dim3((TT_NW + 1) * 32), smem, st, pdl, k,
                                 g_tma_stages);
    return err != cudaSuccess ? err : cudaGetLastError();
}

/* Checks a launch and fills k (everything but n_tiles for the row-major
 * kernels); *smem: the tensor-core kernels' shared memory. */
static cudaError_t prep_kargs(const spx_gemv_args &a, gemv_kargs &k, size_t *smem, bool *tl_out, bool *silu_out) {
    if (a.n_mats < 1 || a.n_mats > SPX_GEMV_MAX_MATS || (a.mode == SPX_GEMV_SWIGLU && a.n_mats != 2))
        return cudaErrorInvalidValue;
    if (a.impl < 0 || a.impl >= 2 + N_MMA) return cudaErrorInvalidValue;
    memset(&k, 0, sizeof k);
    k.a = a;
    k.cols = (int)a.w[0].cols;
    if (k.cols <= 0 || k.cols % 32 || k.cols > SPX_GEMV_MAX_COLS) return cudaErrorInvalidValue;
    if ((reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(a.gain)) & 15) return cudaErrorInvalidValue;
    k.start[0] = 0;
    for (int i = 0; i < SPX_GEMV_MAX_MATS; i++) {
        if (i < a.n_mats) {
            if (a.w[i].cols != k.cols) return cudaErrorInvalidValue;
            k.start[i + 1] = k.start[i] + a.w[i].rows;
            k.out_off[i] = k.n_out_tot;
            k.n_out_tot += a.w[i].n_out;
            if (a.w[i].n_out > k.n_out_max) k.n_out_max = a.w[i].n_out;
        } else {
            k.start[i + 1] = INT64_MAX;
        }
    }
    k.total = k.start[a.n_mats];
    k.early_oidx = g_early_oidx;
    k.early_store = g_early_store;
#ifdef SPX_GEMV_DIAG
    k.diag = g_diag;
#endif
    if (a.mode == SPX_GEMV_SWIGLU && a.w[1].rows != a.w[0].rows) return cudaErrorInvalidValue;
    /* the tiled layout: every matrix of the launch has it, impl 0, no fused SwiGLU */
    const bool tl = a.w[0].tiled != 0;
    for (int i = 1; i < a.n_mats; i++)
        if ((a.w[i].tiled != 0) != tl) return cudaErrorInvalidValue;
    if (tl && (a.impl != 0 || a.mode == SPX_GEMV_SWIGLU || k.cols % 128)) return cudaErrorInvalidValue;
    if (a.x2 && (a.impl == 1 || a.gain || (reinterpret_cast<uintptr_t>(a.x2) & 15))) return cudaErrorInvalidValue;
    bool silu = false; /* the tensor-core kernels only, STORE */
    for (int i = 0; i < a.n_mats; i++) silu |= a.o[i].silu != 0;
    if (silu && (a.mode != SPX_GEMV_STORE || a.impl == 1)) return cudaErrorInvalidValue;
    if (a.pair && (!tl || a.n_mats != 2 || a.mode != SPX_GEMV_STORE || silu || a.w[1].rows != a.w[0].rows ||
                   !a.o[0].y || a.impl != 0))
        return cudaErrorInvalidValue;
    k.pair = a.pair != 0;
    for (int i = 0; i <= SPX_GEMV_MAX_MATS; i++) k.tstart[i] = INT64_MAX;
    k.tstart[0] = 0;
    for (int i = 0; i < a.n_mats; i++) k.tstart[i + 1] = k.tstart[i] + (a.w[i].rows + 15) / 16;
    const int ng = k.cols / 32;
    k.n_items = (ng + 3) / 4;
    k.niw = (k.n_items + GM_WARPS - 1) / GM_WARPS;
    k.niw += k.niw & 1; /* the kernel takes items in pairs */
    *smem = tc_smem(k.cols, k.n_out_tot);
    if ((tl || a.x2 || silu) && *smem > GM_SMEM_MAX) return cudaErrorInvalidValue; /* see spx_gemv_q4_fits */
    if (tl) k.n_tiles = k.tstart[a.n_mats];
    *tl_out = tl;
    *silu_out = silu;
    return cudaSuccess;
}

bool spx_gemv_q4_tma_takes(const spx_gemv_args &a) {
    gemv_kargs k;
    size_t smem = 0;
    bool tl = false, silu = false;
    return prep_kargs(a, k, &smem, &tl, &silu) == cudaSuccess && tl && tma_ok(k); /* (tiled: impl 0) */
}

cudaError_t spx_gemv_q4(const spx_gemv_args &a, int n_sm, cudaStream_t st, bool pdl) {
    gemv_kargs k;
    size_t smem = 0;
    bool tl = false, silu = false;
    cudaError_t err = prep_kargs(a, k, &smem, &tl, &silu);
    if (err != cudaSuccess) return err;
    if (a.impl == 1 || smem > GM_SMEM_MAX) {
        err = launch_pipe(k, n_sm, st, pdl);
    } else {
        const int v = a.impl == 0 ? g_default : a.impl - 2;
        k.n_tiles = tl ? k.tstart[a.n_mats] : a.mode == SPX_GEMV_SWIGLU ? (a.w[0].rows + 7) / 8 : (k.total + 15) / 16;
        /* tiled: three blocks per SM with 2 items in flight where each block
         * has very many tiles (the 128k-vocabulary LM head), else two with 4
         * (the 8B down); the 8B gate/up is about even alone but two won in
         * the decode step, and so did two for the merged q/k/v
         * (bench/gpu/NOTES.md). */
        if (tl && g_tl_force == 2 && tma_ok(k) && !k.pair) return launch_tma(k, n_sm, st, pdl);
        /* a.groups: two groups of 8 warps per block (one block and one input
         * image per SM; variant 3), for every decode launch of a model or
         * none (the backend's choice; SPECTRA_GEMV_GROUPS=0: never) */
        const int64_t nsm1 = n_sm > 0 ? n_sm : 1;
        const bool groups = a.groups && g_groups;
        const int forced = g_forms[launch_kind(a)];
        const int tv = k.pair || g_tl_force == 3 ? 2
                       : g_tl_force >= 0 && g_tl_force < 2 ? g_tl_force
                       : forced >= 0 ? forced
                       : groups ? 2
                       : k.n_tiles >= 48 * nsm1 ? 1
                                : 0;
        const gemv_fn fn = tl ? g_mma_tl[tv] : g_mma[v];
        const int maxb = tl ? g_mma_tl_maxb[tv] : g_mma_maxb[v], gr = tl ? g_mma_tl_groups[tv] : 1;
        int occ = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, gr * GM_WARPS * 32, smem) != cudaSuccess || occ < 1)
            occ = 1;
        if (occ > maxb) occ = maxb;
        int64_t blocks = (int64_t)(n_sm > 0 ? n_sm : 1) * occ;
        if (blocks > (k.n_tiles + gr - 1) / gr) blocks = (k.n_tiles + gr - 1) / gr;
        if (blocks < 1) blocks = 1;
        err = spx_launch(fn, dim3((unsigned)blocks), dim3(gr * GM_WARPS * 32), smem, st, pdl, k);
    }
    return err != cudaSuccess ? err : cudaGetLastError();
}

int spx_gemv_q4_carveout(void) {
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, g_mma_tl[0]) == cudaSuccess ? fa.preferredShmemCarveout : -2;
}

bool spx_gemv_q4_fits(int64_t cols, int64_t n_out_total) {
    if (cols <= 0 || cols % 32 || cols > SPX_GEMV_MAX_COLS || n_out_total < 0 || n_out_total > 3 * cols) return false;
    return tc_smem(cols, n_out_total) <= GM_SMEM_MAX;
}
