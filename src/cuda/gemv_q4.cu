/* gemv_q4.cu: the fused W4A16 GEMV (see gemv_q4.cuh).
 *
 * The arithmetic: int8 tensor cores (mma.sync m16n8k32, s8 x s8 -> s32).
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
 * Two kernels share this arithmetic: gemv_q4_tiled (SPX_Q_TILED, the one
 * decode runs on every matrix the tiled layout holds; the backend tiles a
 * row-major file's matrices at upload) and gemv_q4_mma, the same items
 * gathered from row-major storage, kept for matrices whose width is not a
 * multiple of 128 columns (the tiled layout cannot hold them) and for the
 * fused SwiGLU of row-major gate/up. The float32 kernel that came before,
 * the bulk-copy (cp.async.bulk) tiled kernel and the one-item-at-a-time
 * variant were measured and dropped (bench/gpu/NOTES.md). Denormals: the
 * arithmetic is integer then float32; the file needs no -ftz setting. */
#include "cuda/gemv_q4.cuh"

#include <stdlib.h>
#include <string.h>

#define GM_WARPS 8  /* warps per block, tensor-core kernel */

struct gemv_kargs {
    spx_gemv_args a;
    int64_t start[SPX_GEMV_MAX_MATS + 1]; /* first global row of each matrix; unused: INT64_MAX */
    int64_t total;
    int64_t n_tiles;
    int cols;
    int n_items;                     /* 4-group items per row: ceil(n_groups / 4) */
    int niw;                         /* items per warp per tile: ceil(n_items / GM_WARPS), rounded up to even */
    int out_off[SPX_GEMV_MAX_MATS];  /* each matrix's first slot in the outlier input table */
    int n_out_tot;                   /* slots in that table */
    int n_out_max;                   /* most outliers of one matrix */
    int64_t tstart[SPX_GEMV_MAX_MATS + 1]; /* tiled: first tile of each matrix; unused: INT64_MAX */
    int early_oidx; /* tiled: each thread's first outlier index of every matrix loaded before the PDL wait */
    int pair;       /* tiled gate/up (spx_gemv_args.pair): group 0 of a block gate tiles, group 1 the same rows' up */
    int early_store; /* tiled, P = 4: the first tile's bias before the PDL wait, its old y (ADD) right after it */
};

__device__ __forceinline__ uint2 ld_stream8(const void *p) {
    uint2 r;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

__device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}


/* ---- the int8 tensor-core arithmetic (see the top of this file) ----------- */

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
__device__ __forceinline__ float gm_silu(float g) { return spx_silu_dev(g); }

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
/* BITS 4: c0, c1 are the two rows' 16-byte groups; BITS 2 and 3: c0 holds
 * W0, W1 of row r then of row r + 8, c1.x and c1.y their W2 (bits 3;
 * lowbit.cuh), unpacked into the same fragments. */
template <int BITS = 4>
__device__ __forceinline__ void gm_item_dot(const uint4 &c0, const uint4 &c1, const uint4 &bA, const uint4 &bB, int &s0,
                                            int &s1) {
    int d[4] = {0, 0, 0, 0}, e[4] = {0, 0, 0, 0};
    if (BITS == 4) {
        mma_s8(d, c0.x & 0x0f0f0f0fu, c1.x & 0x0f0f0f0fu, (c0.x >> 4) & 0x0f0f0f0fu, (c1.x >> 4) & 0x0f0f0f0fu, bA.x, bA.y);
        mma_s8(e, c0.z & 0x0f0f0f0fu, c1.z & 0x0f0f0f0fu, (c0.z >> 4) & 0x0f0f0f0fu, (c1.z >> 4) & 0x0f0f0f0fu, bB.x, bB.y);
        mma_s8(d, c0.y & 0x0f0f0f0fu, c1.y & 0x0f0f0f0fu, (c0.y >> 4) & 0x0f0f0f0fu, (c1.y >> 4) & 0x0f0f0f0fu, bA.z, bA.w);
        mma_s8(e, c0.w & 0x0f0f0f0fu, c1.w & 0x0f0f0f0fu, (c0.w >> 4) & 0x0f0f0f0fu, (c1.w >> 4) & 0x0f0f0f0fu, bB.z, bB.w);
    } else {
        auto F = [&](int row, int m, int h) {
            return row ? spx_lb_frag<BITS>(c0.z, c0.w, c1.y, m, h) : spx_lb_frag<BITS>(c0.x, c0.y, c1.x, m, h);
        };
        mma_s8(d, F(0, 0, 0), F(1, 0, 0), F(0, 0, 1), F(1, 0, 1), bA.x, bA.y);
        mma_s8(e, F(0, 2, 0), F(1, 2, 0), F(0, 2, 1), F(1, 2, 1), bB.x, bB.y);
        mma_s8(d, F(0, 1, 0), F(1, 1, 0), F(0, 1, 1), F(1, 1, 1), bA.z, bA.w);
        mma_s8(e, F(0, 3, 0), F(1, 3, 0), F(0, 3, 1), F(1, 3, 1), bB.z, bB.w);
    }
    s0 = (d[0] + e[0]) + (d[1] + e[1]) * 256;
    s1 = (d[2] + e[2]) + (d[3] + e[3]) * 256;
}

/* One tiled item of a lane into its two row sums: codes c0, c1 (rows r and
 * r + 8), the packed fp16 scale pair s0, the zero byte z0 (low nibble row
 * r), the B fragments at bp and the group's (S, -sum X) meta. */
template <int BITS>
__device__ __forceinline__ void gm_tiled_item(const uint4 &c0, const uint4 &c1, unsigned s0, unsigned z0, const uint4 *bp,
                                              int2 mt, float &tot0, float &tot1) {
    const uint4 bA = bp[0], bB = bp[1]; /* two 16-byte shared loads */
    int i0, i1;
    gm_item_dot<BITS>(c0, c1, bA, bB, i0, i1);
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

/* P: items per warp in registers (even; consumed two at a time, P - 2 in
 * flight meanwhile); MINB: blocks per multiprocessor (register budget). */
template <int P, int MINB>
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

    /* items two at a time (niw is even), two items' chains side by side
     * with no control flow between them. */
    static_assert(P % 2 == 0, "P must be even");
    constexpr int STEP = 2;
    for (int base = 0; base < total; base += P) {
#pragma unroll
        for (int s = 0; s < P; s += STEP) {
            if (base + s < total) { /* uniform over the block */
                if (cj == 0) {
                    crow(r, cno0, cxo0, cop0);
                    crow(r + 8, cno1, cxo1, cop1);
                }
                consume(buf[s], 0);
                consume(buf[s + 1], 1);
                issue(buf[s]); /* P items ahead, in the slots just freed */
                issue(buf[s + 1]);
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
template <int P, int GR, int BITS>
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
    constexpr int TB = 256 * BITS; /* code bytes per (tile, item): qtensor.h, lowbit.cuh */
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
        ic = w.codes + ti * TB + lane * 16;
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
            if (item < n_items) {
                it.c0 = ld_stream16(ic + item * TB);
                if (BITS == 4) it.c1 = ld_stream16(ic + item * TB + 512);
                if (BITS == 3) { /* the W2 words: 512 + 8 lane of the item */
                    const uint2 w2 = ld_stream8(ic + item * TB + 512 - 8 * lane);
                    it.c1.x = w2.x;
                    it.c1.y = w2.y;
                }
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
    const float inv = ROOM && k.early_oidx ? gm_build<true>(k, img, meta, xo, redd, oi[0], oi[1], oi[2])
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
        gm_tiled_item<BITS>(it.c0, it.c1, it.s0, it.z0, reinterpret_cast<const uint4 *>(bbase + bi * bstride),
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
template <int P, int MINB, int GR = 1, int BITS = 4>
__global__ void __launch_bounds__(GR * GM_WARPS * 32, MINB) gemv_q4_tiled(const __grid_constant__ gemv_kargs k) {
    __shared__ float red[GR][2][GM_WARPS][16];
    __shared__ double redd[32];
    __shared__ float pxg[2][16]; /* pair: a tile's silu(gate), double-buffered by tile parity */
    spx_pdl_trigger();
    const int grp = GR > 1 ? (int)(threadIdx.x >> 5) / GM_WARPS : 0;
    const bool pr = GR == 2 && k.pair; /* group g: matrix g's tiles, the same ones in both groups */
    const int64_t G = pr ? (int64_t)gridDim.x : (int64_t)gridDim.x * GR;
    const int64_t bid = pr ? blockIdx.x + (grp ? k.tstart[1] : 0) : (int64_t)blockIdx.x * GR + grp;
    gm_tiled_run<P, GR, BITS>(k, G, bid, pr ? k.tstart[grp + 1] : k.n_tiles, red[grp], redd, pxg);
}

/* ---- dispatch ------------------------------------------------------------------ */

typedef void (*gemv_fn)(const gemv_kargs);

/* Row-major: 4 items of 1 KB of codes per warp in registers, two blocks of
 * 8 warps per multiprocessor (128 registers). */
#define GM_SMEM_MAX (160 * 1024)
static const gemv_fn g_mma_rows = gemv_q4_mma<4, 2>;
#define G_MMA_ROWS_MAXB 2
/* The tiled kernel's forms: (items in flight, blocks/SM, warp groups per
 * block): two blocks per multiprocessor with 4 items in flight per warp
 * (128 registers), three with 2 (80; <4, 3> spilled), or one block of two
 * 8-warp groups sharing one input image; the launch picks by its tile count
 * (or spx_gemv_args.groups / pair). A tile's columns over 4 or 2 warps
 * instead of 8 lost everywhere and is gone (NOTES 28). */
/* per width (g_mma_tl[0] 4 bits, [1] 3, [2] 2: cuda/lowbit.cuh), the same forms */
static const gemv_fn g_mma_tl[3][3] = {
    {gemv_q4_tiled<4, 2, 1, 4>, gemv_q4_tiled<2, 3, 1, 4>, gemv_q4_tiled<4, 1, 2, 4>},
    {gemv_q4_tiled<4, 2, 1, 3>, gemv_q4_tiled<2, 3, 1, 3>, gemv_q4_tiled<4, 1, 2, 3>},
    {gemv_q4_tiled<4, 2, 1, 2>, gemv_q4_tiled<2, 3, 1, 2>, gemv_q4_tiled<4, 1, 2, 2>}};
static const int g_mma_tl_maxb[] = {2, 3, 1};
static const int g_mma_tl_groups[] = {1, 1, 2};
#define N_TL 3
static int g_tl_force = -1; /* benchmarks: spx_gemv_q4_force_tiled_variant */
static int g_tl_env = -1;   /* SPECTRA_GEMV_TILED_VARIANT, what force(-1) returns to */

void spx_gemv_q4_force_tiled_variant(int v) { g_tl_force = v >= 0 && v < N_TL ? v : g_tl_env; }
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

cudaError_t spx_gemv_q4_setup(int64_t max_cols) {
    /* Always for the largest supported width: the attribute is per process,
     * a second model must not lower it under the first one's needs, and a
     * high limit costs nothing (occupancy follows each launch's size). */
    if (max_cols > SPX_GEMV_MAX_COLS) return cudaErrorInvalidValue;
    cudaError_t err = cudaFuncSetAttribute(g_mma_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, GM_SMEM_MAX);
    if (err != cudaSuccess) return err;
    for (int b = 0; b < 3; b++)
        for (int i = 0; i < N_TL; i++) {
            err = cudaFuncSetAttribute(g_mma_tl[b][i], cudaFuncAttributeMaxDynamicSharedMemorySize, GM_SMEM_MAX);
            if (err != cudaSuccess) return err;
        }
    /* engine/tuning.h's record, read at each setup; a field at its default
     * leaves the current value (a variant forced by a test included) */
    static_assert(SPX_TUNING_TILED_FORMS == N_TL && SPX_TUNING_GEMV_LAUNCH_KINDS == 5,
                  "engine/tuning.h validates against these ranges");
    const spx_tuning *t = spx_tuning_get();
    if (t->gemv_groups >= 0) g_groups = t->gemv_groups;
    for (int i = 0; i < t->gemv_forms_n; i++) g_forms[i] = t->gemv_forms[i];
    if (t->gemv_early_store >= 0) g_early_store = t->gemv_early_store;
    if (t->gemv_early_oidx >= 0) g_early_oidx = g_early_oidx_env = t->gemv_early_oidx;
    if (t->gemv_tiled_variant >= 0) g_tl_force = g_tl_env = t->gemv_tiled_variant; /* benchmarks, as force_tiled_variant */
    return cudaSuccess;
}

/* Shared memory of the tensor-core kernels: the input image (64 bytes and
 * an (S, -sum X) pair per group, in whole items), 32 bytes of zeros and
 * the outlier input table. */
static size_t tc_smem(int64_t cols, int64_t n_out_tot) {
    const int64_t n_items = (cols / 32 + 3) / 4;
    return (size_t)n_items * 4 * (GM_IMG_GROUP + 8) + 32 + (size_t)((n_out_tot + 3) & ~(int64_t)3) * 4;
}

/* Checks a launch and fills k; *smem: the kernels' shared memory. */
static cudaError_t prep_kargs(const spx_gemv_args &a, gemv_kargs &k, size_t *smem, bool *tl_out, bool *silu_out) {
    if (a.n_mats < 1 || a.n_mats > SPX_GEMV_MAX_MATS || (a.mode == SPX_GEMV_SWIGLU && a.n_mats != 2))
        return cudaErrorInvalidValue;
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
    if (a.mode == SPX_GEMV_SWIGLU && a.w[1].rows != a.w[0].rows) return cudaErrorInvalidValue;
    /* the tiled layout: every matrix of the launch has it, no fused SwiGLU */
    const bool tl = a.w[0].tiled != 0;
    for (int i = 1; i < a.n_mats; i++)
        if ((a.w[i].tiled != 0) != tl) return cudaErrorInvalidValue;
    if (tl && (a.mode == SPX_GEMV_SWIGLU || k.cols % 128)) return cudaErrorInvalidValue;
    /* one width per launch; bits 2 and 3 only tiled (cuda/lowbit.cuh) */
    const int bits = a.w[0].bits ? a.w[0].bits : 4;
    for (int i = 0; i < a.n_mats; i++)
        if ((a.w[i].bits ? a.w[i].bits : 4) != bits) return cudaErrorInvalidValue;
    if ((bits != 4 && !tl) || (bits != 2 && bits != 3 && bits != 4)) return cudaErrorInvalidValue;
    if (a.x2 && (a.gain || (reinterpret_cast<uintptr_t>(a.x2) & 15))) return cudaErrorInvalidValue;
    bool silu = false; /* STORE only */
    for (int i = 0; i < a.n_mats; i++) silu |= a.o[i].silu != 0;
    if (silu && a.mode != SPX_GEMV_STORE) return cudaErrorInvalidValue;
    if (a.pair && (!tl || a.n_mats != 2 || a.mode != SPX_GEMV_STORE || silu || a.w[1].rows != a.w[0].rows ||
                   !a.o[0].y))
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
    if (*smem > GM_SMEM_MAX) return cudaErrorInvalidValue; /* see spx_gemv_q4_fits */
    k.n_tiles = tl ? k.tstart[a.n_mats] : a.mode == SPX_GEMV_SWIGLU ? (a.w[0].rows + 7) / 8 : (k.total + 15) / 16;
    *tl_out = tl;
    *silu_out = silu;
    return cudaSuccess;
}

cudaError_t spx_gemv_q4(const spx_gemv_args &a, int n_sm, cudaStream_t st, bool pdl) {
    gemv_kargs k;
    size_t smem = 0;
    bool tl = false, silu = false;
    cudaError_t err = prep_kargs(a, k, &smem, &tl, &silu);
    if (err != cudaSuccess) return err;
    /* tiled: three blocks per SM with 2 items in flight where each block
     * has very many tiles (the 128k-vocabulary LM head), else two with 4
     * (the 8B down); the 8B gate/up is about even alone but two won in the
     * decode step, and so did two for the merged q/k/v (bench/gpu/NOTES.md).
     * a.groups: two groups of 8 warps per block (one block and one input
     * image per SM; form 2), for every decode launch of a model or none (the
     * backend's choice; SPECTRA_GEMV_GROUPS=0: never) */
    const int64_t nsm1 = n_sm > 0 ? n_sm : 1;
    const bool groups = a.groups && g_groups;
    const int forced = g_forms[launch_kind(a)];
    const int tv = k.pair ? 2
                   : g_tl_force >= 0 ? g_tl_force
                   : forced >= 0 ? forced
                   : groups ? 2
                   : k.n_tiles >= 48 * nsm1 ? 1
                            : 0;
    const int wb = a.w[0].bits == 3 ? 1 : a.w[0].bits == 2 ? 2 : 0;
    const gemv_fn fn = tl ? g_mma_tl[wb][tv] : g_mma_rows;
    const int maxb = tl ? g_mma_tl_maxb[tv] : G_MMA_ROWS_MAXB, gr = tl ? g_mma_tl_groups[tv] : 1;
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, gr * GM_WARPS * 32, smem) != cudaSuccess || occ < 1)
        occ = 1;
    if (occ > maxb) occ = maxb;
    int64_t blocks = nsm1 * occ;
    if (blocks > (k.n_tiles + gr - 1) / gr) blocks = (k.n_tiles + gr - 1) / gr;
    if (blocks < 1) blocks = 1;
    err = spx_launch(fn, dim3((unsigned)blocks), dim3(gr * GM_WARPS * 32), smem, st, pdl, k);
    return err != cudaSuccess ? err : cudaGetLastError();
}

int spx_gemv_q4_carveout(void) {
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, g_mma_tl[0][0]) == cudaSuccess ? fa.preferredShmemCarveout : -2;
}

bool spx_gemv_q4_fits(int64_t cols, int64_t n_out_total) {
    if (cols <= 0 || cols % 32 || cols > SPX_GEMV_MAX_COLS || n_out_total < 0 || n_out_total > 3 * cols) return false;
    return tc_smem(cols, n_out_total) <= GM_SMEM_MAX;
}
