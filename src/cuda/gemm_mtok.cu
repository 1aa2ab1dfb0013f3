/* gemm_mtok.cu: the few-token W4A16 product (see gemm_mtok.cuh).
 *
 * Why not the prefill GEMM (gemm_q4.cu) at small M: its 128-row tiles are
 * dequantized into shared memory behind one 16-byte load per thread per K
 * tile, with a barrier per tile, so at M <= 16 it is latency-bound (few
 * bytes in flight) and runs several times slower than the GEMV on the
 * same matrix (bench/results/2026-12-03-cuda-mtok-kernels.md).
 *
 * This kernel walks the matrix as the tiled GEMV does (gemv_q4.cu): a unit
 * of R x 16 rows (R = 1 or 2 16-row tiles), one unit per block at a time
 * (grid-stride), the block's 8 warps splitting the unit's 128-column items
 * (K) and meeting in shared memory in a fixed order (deterministic). Lane
 * l (t = l % 4, r = l / 4) loads for rows r and r + 8 of a tile the whole
 * group g = 4 * item + t (16 bytes each, the tiled layout's order: one
 * coalesced 1 KB per warp and item), the two fp16 scales and the zero
 * byte, two items ahead in registers.
 *
 * The fp16 MMA m16n8k16 takes k-slots {2t, 2t+1} (a0/a1, b0) and {2t+8,
 * 2t+9} (a2/a3, b1) from lane t of each quad, in A and in B alike, so the
 * k-slots may stand for any columns as long as A and B agree: here lane
 * t's slots are 4 columns of its OWN group g (one MMA covers 4 columns of
 * each of the 4 groups of an item; 8 MMAs cover the item). Word m of a
 * group holds codes 4m + j (low nibbles of byte j) and 4m + j + 16 (high
 * nibbles); after the byte permute (b0, b2, b1, b3) a mask takes two
 * adjacent codes into the two halves, and 0x6400 | q is the fp16 number
 * 1024 + q, so (1024 + q) - (1024 + z) = q - z exactly (HSUB2) and one HMUL2
 * rounds (q - z) * s to fp16 once: the prefill GEMM's W^ bit for bit, with
 * no conversion instruction. MMA (m, h) of an item takes columns 4m + 16h
 * .. + 3 of the group: A = the pairs (t >> 4h) and (t >> 8 + 4h), B = the
 * same four columns of x for token r (n8 tile nt: token 8 nt + r), which
 * the lane loads as 64 contiguous bytes of x per group and token (four
 * 16-byte loads, L1/L2 hits: x is small and every unit rereads it). The
 * D fragment gives rows r, r + 8 x tokens 2t, 2t + 1 of the n8 tile.
 * Per weight and lane: ~2 instructions of dequantization whatever M is,
 * and one MMA per 256 weights per 8 tokens, so the cost grows with M only
 * through the MMAs and the x loads. R = 2 halves the x loads per weight
 * (both tiles' A fragments against each B fragment).
 *
 * Outlier columns: chunks of 16 (oval row-major [rows, n_out] as A, x
 * gathered through oidx as B) through the same MMA, chunks spread over
 * the warps before the block's reduction; zeros past n_out.
 *
 * The rows layout (gemm_mtok.cuh) loads the same per-lane groups from
 * row-major storage (any cols % 32: groups past the width read as zero):
 * correct, not tuned; the backend tiles every matrix whose width allows.
 *
 * Forms and the choice: NT = 1 for M <= 8, 2 for M <= 16 (n8 token tiles);
 * R = 2 where the matrix has >= 4 16-row tiles per multiprocessor (8B
 * gate/up and LM head: R = 2 keeps twice the bytes in flight per warp and
 * won there by 10-20 %), else R = 1 (q, k/v, down: R = 2 leaves SMs idle
 * and lost by 10-60 %). Two blocks of 8 warps per SM (128 registers).
 *
 * Measured (H200, bench_gemv --mtok, time relative to the tiled GEMV at
 * M = 1; bench/results/2026-12-03-cuda-mtok-kernels.md): M = 8 1.14 (q,
 * k/v), 1.21 (down), 1.41 (gate/up), 1.72 (LM head); M = 16 1.42-1.65
 * (q, k/v, down), 2.18 (gate/up), 2.73 (LM head); the prefill GEMM at M =
 * 2..16 was 2.7-4.8x. What limits it: on the large matrices even M = 1
 * runs at 1.35x (gate/up) and 1.6x (LM head) of the GEMV (~2.5 of ~4.1
 * TB/s), so the cost is the weight stream, not M: two items in flight per
 * warp and tile in registers are too few bytes in flight for those, and
 * the fp16 dequantization (~2 instructions per weight and lane, a chain of
 * 4 dependent ones before each MMA) is longer than the GEMV's int8 path.
 * Tried and dropped (same bench, same day): one item sequence per warp
 * across unit ends (prefetch over the reduction): within 4 % at M <= 8,
 * and NT = 2 spilled (M = 16 up to 1.3x slower); 4 items in flight in
 * registers: spills, 1.1-1.25x slower; the codes of 4 items in a cp.async
 * shared-memory ring per warp: 1.17x slower on q (the large shapes were
 * not measured). What would likely close it: the GEMV's int8
 * arithmetic with tokens in the MMA's N (4 tokens x 2 digits, needing the
 * group's words spread over the quad), no fp16 dequantization, and the
 * GEMV's deeper register ring. */
#include "cuda/gemm_mtok.cuh"

#define MT_WARPS 8

struct mt_kargs {
    spx_gemm_args a;
    int n_items;    /* 128-column items per row: ceil(n_groups / 4) */
    int niw;        /* items per warp per unit, even */
    int n_oc;       /* outlier chunks of 16 */
    int64_t n_units;
};

/* One lane's share of an item: rows r and r + 8 of group 4 * item + t. */
struct mt_a {
    uint4 c0, c1; /* codes of row r, row r + 8 */
    uint32_t s;   /* fp16 scales: low half row r, high half row r + 8 */
    uint32_t z;   /* zero nibbles: bits 0-3 row r, 4-7 row r + 8 */
};

__device__ __forceinline__ uint4 mt_ld16(const void *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

__device__ __forceinline__ void mt_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* (q - z) * s for the two codes in bits 0-3 and 16-19 of v, as fp16x2. */
__device__ __forceinline__ uint32_t mt_deq(uint32_t v, __half2 zz, __half2 ss) {
    const uint32_t m = (v & 0x000f000fu) | 0x64006400u;
    const __half2 h = __hmul2(__hsub2(*reinterpret_cast<const __half2 *>(&m), zz), ss);
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* Item `item` of 16-row tile rt for this lane (zeros past the width). */
template <bool TL>
__device__ __forceinline__ void mt_load(const spx_dqmat &w, int64_t rt, int item, int n_items, int lane, mt_a &A) {
    A.c0 = A.c1 = make_uint4(0, 0, 0, 0);
    A.s = 0;
    A.z = 0;
    if (item >= n_items || rt * 16 >= w.rows) return; /* past the last tile (R = 2) */
    if (TL) {
        const int64_t ti = rt * (w.cols >> 7) + item;
        const uint8_t *cb = w.codes + (ti << 10) + (lane << 4);
        A.c0 = mt_ld16(cb);
        A.c1 = mt_ld16(cb + 512);
        A.s = __ldg(reinterpret_cast<const uint32_t *>(w.scales + (ti << 6) + 2 * lane));
        A.z = __ldg(w.zeros + (ti << 5) + lane);
    } else {
        const int t = lane & 3, g = item * 4 + t;
        if (g >= w.n_groups) return;
        const int64_t r0 = rt * 16 + (lane >> 2);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t row = r0 + 8 * h;
            if (row >= w.rows) continue;
            const uint4 c = mt_ld16(w.codes + row * (w.cols / 2) + (int64_t)g * 16);
            if (h) A.c1 = c;
            else A.c0 = c;
            A.s |= (uint32_t)__half_as_ushort(w.scales[row * w.n_groups + g]) << (16 * h);
            A.z |= (uint32_t)((w.zeros[row * w.zrow + (g >> 1)] >> ((g & 1) << 2)) & 15) << (4 * h);
        }
    }
}

/* x of group 4 * item + t for token r + 8 nt (zero past M or the width). */
template <int NT>
__device__ __forceinline__ void mt_load_x(const spx_gemm_args &a, int item, int n_items, int lane, uint4 (&xb)[NT][4]) {
    const int g = item * 4 + (lane & 3);
    const bool gok = item < n_items && g < a.w.n_groups;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int tok = nt * 8 + (lane >> 2);
        if (gok && tok < a.M) {
            const uint4 *p = reinterpret_cast<const uint4 *>(a.x + tok * a.ldx + (int64_t)g * 32);
#pragma unroll
            for (int v = 0; v < 4; v++) xb[nt][v] = __ldg(p + v);
        } else {
#pragma unroll
            for (int v = 0; v < 4; v++) xb[nt][v] = make_uint4(0, 0, 0, 0);
        }
    }
}

/* The 8 MMAs of one item of one tile, for each n8 tile of tokens. */
template <int NT>
__device__ __forceinline__ void mt_item(const mt_a &A, const uint4 (&xb)[NT][4], float (&acc)[NT][4]) {
    const __half2 zz0 = __float2half2_rn(1024.0f + (float)(A.z & 15)), zz1 = __float2half2_rn(1024.0f + (float)((A.z >> 4) & 15));
    const __half2 ss0 = __half2half2(__ushort_as_half((unsigned short)(A.s & 0xffffu))),
                  ss1 = __half2half2(__ushort_as_half((unsigned short)(A.s >> 16)));
    const uint32_t w0[4] = {A.c0.x, A.c0.y, A.c0.z, A.c0.w}, w1[4] = {A.c1.x, A.c1.y, A.c1.z, A.c1.w};
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const uint32_t t0 = __byte_perm(w0[m], 0, 0x3120), t1 = __byte_perm(w1[m], 0, 0x3120);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t a0 = mt_deq(t0 >> (4 * h), zz0, ss0), a1 = mt_deq(t1 >> (4 * h), zz1, ss1);
            const uint32_t a2 = mt_deq(t0 >> (8 + 4 * h), zz0, ss0), a3 = mt_deq(t1 >> (8 + 4 * h), zz1, ss1);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint4 &q = xb[nt][2 * h + (m >> 1)];
                mt_mma(acc[nt], a0, a1, a2, a3, (m & 1) ? q.z : q.x, (m & 1) ? q.w : q.y);
            }
        }
    }
}

__device__ __forceinline__ uint32_t mt_pack(__half lo, __half hi) {
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

template <int NT, int R, bool TL>
__global__ void __launch_bounds__(MT_WARPS * 32, 2) gemm_mtok_kernel(const __grid_constant__ mt_kargs k) {
    constexpr int TOK = NT * 8, ROWS = R * 16;
    __shared__ float red[MT_WARPS][ROWS][TOK + 1];
    const spx_gemm_args &a = k.a;
    const spx_dqmat &w = a.w;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3, r = lane >> 2;
    const int iw0 = warp * k.niw, n_items = k.n_items;
    const __half hz = __float2half_rn(0.0f);
    for (int64_t u = blockIdx.x; u < k.n_units; u += gridDim.x) {
        float acc[R][NT][4];
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
        mt_a buf[2][R];
        uint4 xb[2][NT][4];
#pragma unroll
        for (int s = 0; s < 2; s++) {
#pragma unroll
            for (int i = 0; i < R; i++) mt_load<TL>(w, u * R + i, iw0 + s, n_items, lane, buf[s][i]);
            mt_load_x<NT>(a, iw0 + s, n_items, lane, xb[s]);
        }
        for (int j = 0; j < k.niw; j += 2) {
#pragma unroll
            for (int s = 0; s < 2; s++) {
#pragma unroll
                for (int i = 0; i < R; i++) mt_item<NT>(buf[s][i], xb[s], acc[i]);
                if (j + 2 < k.niw) {
#pragma unroll
                    for (int i = 0; i < R; i++) mt_load<TL>(w, u * R + i, iw0 + j + 2 + s, n_items, lane, buf[s][i]);
                    mt_load_x<NT>(a, iw0 + j + 2 + s, n_items, lane, xb[s]);
                }
            }
        }
        /* outlier chunks of 16 columns, spread over the warps */
        for (int c = warp; c < k.n_oc; c += MT_WARPS) {
            const int j0 = c * 16 + 2 * t;
            int idx[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int j = j0 + (q & 1) + 8 * (q >> 1);
                idx[q] = j < w.n_out ? __ldg(w.oidx + j) : -1;
            }
            uint32_t bb[NT][2];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int tok = nt * 8 + r;
                __half xv[4];
#pragma unroll
                for (int q = 0; q < 4; q++) xv[q] = tok < a.M && idx[q] >= 0 ? a.x[tok * a.ldx + idx[q]] : hz;
                bb[nt][0] = mt_pack(xv[0], xv[1]);
                bb[nt][1] = mt_pack(xv[2], xv[3]);
            }
#pragma unroll
            for (int i = 0; i < R; i++) {
                __half ov[2][4];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t row = (u * R + i) * 16 + r + 8 * h;
#pragma unroll
                    for (int q = 0; q < 4; q++)
                        ov[h][q] = row < w.rows && idx[q] >= 0 ? w.oval[row * w.n_out + j0 + (q & 1) + 8 * (q >> 1)] : hz;
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    mt_mma(acc[i][nt], mt_pack(ov[0][0], ov[0][1]), mt_pack(ov[1][0], ov[1][1]), mt_pack(ov[0][2], ov[0][3]),
                           mt_pack(ov[1][2], ov[1][3]), bb[nt][0], bb[nt][1]);
            }
        }
        /* the warps' partial sums, added in warp order */
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) red[warp][i * 16 + r + (e >> 1) * 8][nt * 8 + 2 * t + (e & 1)] = acc[i][nt][e];
        __syncthreads();
        for (int q = threadIdx.x; q < ROWS * TOK; q += MT_WARPS * 32) {
            const int rr = q / TOK, tok = q % TOK; /* consecutive threads: consecutive tokens of a row */
            const int64_t row = u * ROWS + rr;
            if (tok < a.M && row < w.rows) {
                float v = 0.0f;
#pragma unroll
                for (int x = 0; x < MT_WARPS; x++) v += red[x][rr][tok];
                if (a.bias) v += a.bias[row];
                float *p = a.y + tok * a.ldy + row;
                *p = a.accumulate ? *p + v : v;
            }
        }
        __syncthreads();
    }
}

typedef void (*mt_fn)(const mt_kargs);
/* [NT - 1][R - 1][tiled] */
static const mt_fn g_mt[2][2][2] = {
    {{gemm_mtok_kernel<1, 1, false>, gemm_mtok_kernel<1, 1, true>}, {gemm_mtok_kernel<1, 2, false>, gemm_mtok_kernel<1, 2, true>}},
    {{gemm_mtok_kernel<2, 1, false>, gemm_mtok_kernel<2, 1, true>}, {gemm_mtok_kernel<2, 2, false>, gemm_mtok_kernel<2, 2, true>}}};
static int g_mt_rows = 0; /* spx_gemm_q4_mtok_force_rows */

void spx_gemm_q4_mtok_force_rows(int r) { g_mt_rows = r == 1 || r == 2 ? r : 0; }

bool spx_gemm_q4_mtok_ok(const spx_gemm_args &a) {
    const int bits = a.w.bits ? a.w.bits : 4;
    if (a.M < 1 || a.M > SPX_MTOK_MAX_M || bits != 4 || a.w.rows <= 0 || a.w.cols <= 0 || a.w.cols % 32) return false;
    if (a.w.tiled && a.w.cols % 128) return false;
    if (a.ldx % 8 || (reinterpret_cast<uintptr_t>(a.x) & 15)) return false;
    return true;
}

cudaError_t spx_gemm_q4_mtok(const spx_gemm_args &a, int n_sm, cudaStream_t st) {
    if (!spx_gemm_q4_mtok_ok(a)) return cudaErrorInvalidValue;
    mt_kargs k;
    memset(&k, 0, sizeof k);
    k.a = a;
    k.n_items = (a.w.n_groups + 3) / 4;
    k.niw = (k.n_items + MT_WARPS - 1) / MT_WARPS;
    k.niw += k.niw & 1;
    k.n_oc = (a.w.n_out + 15) / 16;
    const int nt = a.M > 8 ? 2 : 1;
    const int64_t nsm = n_sm > 0 ? n_sm : 1, tiles = (a.w.rows + 15) / 16;
    /* R = 2 where the matrix has enough 32-row units for every block slot */
    int R = g_mt_rows ? g_mt_rows : (tiles >= 4 * nsm ? 2 : 1);
    k.n_units = (tiles + R - 1) / R;
    int64_t blocks = 2 * nsm;
    if (blocks > k.n_units) blocks = k.n_units;
    const mt_fn fn = g_mt[nt - 1][R - 1][a.w.tiled ? 1 : 0];
    cudaError_t err = spx_launch(fn, dim3((unsigned)blocks), dim3(MT_WARPS * 32), 0, st, false, k);
    return err != cudaSuccess ? err : cudaGetLastError();
}
