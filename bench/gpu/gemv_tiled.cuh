/* gemv_tiled.cuh: a measurement, not a product path. The tensor-core GEMV
 * of src/cuda/gemv_q4.cu (gemv_q4_mma, pairs) on a tile-interleaved layout
 * instead of the .trdc's row-major one, to learn whether a GPU-friendlier
 * file layout would pay (the issue: "if a GPU-friendlier layout wins, make
 * it the file format's").
 *
 * Layout: rows in tiles of 16 (zero-padded), columns in items of 4 groups
 * (128 columns); per (tile, item), in the order the MMA fragments want
 * them (lane l = 4 r + t takes rows r and r + 8 of group t):
 *   codes  [tile][item][1024]: bytes 16 l.. of row r, then 512 + 16 l.. of row r + 8
 *   scales [tile][item][32] u32: fp16 scale of row r (low half), row r + 8 (high)
 *   zeros  [tile][item][32] u8: zero of row r (low nibble), row r + 8 (high)
 * so a warp's item is two 512-byte loads plus 128 + 32 bytes, all
 * coalesced, with no per-row addressing. Included by bench_gemv.cu after
 * src/cuda/gemv_q4.cu (it reuses that file's image builder and MMA). */

struct tiled_mat {
    const uint8_t *codes;
    const uint32_t *scales;
    const uint8_t *zeros;
    int64_t rows;
    int n_items, n_tiles;
    size_t bytes;
};

__global__ void tiled_repack(const spx_dqmat w, uint8_t *tc, uint32_t *ts, uint8_t *tz, int n_items, int n_tiles) {
    const int64_t total = (int64_t)n_tiles * n_items * 32;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int lane = (int)(i & 31);
        const int64_t ti = i >> 5; /* tile * n_items + item */
        const int64_t tile = ti / n_items;
        const int item = (int)(ti - tile * n_items), t = lane & 3, r = lane >> 2, g = item * 4 + t;
        const int64_t r0 = tile * 16 + r, r1 = r0 + 8;
        uint4 c0 = make_uint4(0, 0, 0, 0), c1 = c0;
        unsigned s0 = 0, s1 = 0, z0 = 0, z1 = 0;
        if (r0 < w.rows) {
            c0 = *reinterpret_cast<const uint4 *>(w.codes + r0 * (w.cols / 2) + (int64_t)g * 16);
            s0 = __half_as_ushort(w.scales[r0 * w.n_groups + g]);
            z0 = (w.zeros[r0 * w.zrow + (g >> 1)] >> ((g & 1) * 4)) & 15;
        }
        if (r1 < w.rows) {
            c1 = *reinterpret_cast<const uint4 *>(w.codes + r1 * (w.cols / 2) + (int64_t)g * 16);
            s1 = __half_as_ushort(w.scales[r1 * w.n_groups + g]);
            z1 = (w.zeros[r1 * w.zrow + (g >> 1)] >> ((g & 1) * 4)) & 15;
        }
        *reinterpret_cast<uint4 *>(tc + ti * 1024 + lane * 16) = c0;
        *reinterpret_cast<uint4 *>(tc + ti * 1024 + 512 + lane * 16) = c1;
        ts[ti * 32 + lane] = s0 | (s1 << 16);
        tz[ti * 32 + lane] = (uint8_t)(z0 | (z1 << 4));
    }
}

/* STORE mode, one matrix, outliers as in gemv_q4_mma (row-major oval).
 * P items per warp in registers (even), MINB blocks per multiprocessor. */
template <int P, int MINB>
__global__ void __launch_bounds__(GM_WARPS * 32, MINB) gemv_tiled_kernel(const __grid_constant__ gemv_kargs k,
                                                                         const tiled_mat tm) {
    extern __shared__ float4 gemv_sm[];
    __shared__ float red[2][GM_WARPS][16];
    __shared__ double redd[32];
    const spx_gemv_args &a = k.a;
    const spx_dqmat &w = a.w[0];
    const int n_items = k.n_items, niw = k.niw;
    uint8_t *img = reinterpret_cast<uint8_t *>(gemv_sm);
    int2 *meta = reinterpret_cast<int2 *>(img + (size_t)n_items * 4 * GM_IMG_GROUP);
    uint4 *zero = reinterpret_cast<uint4 *>(meta + n_items * 4);
    float *xo = reinterpret_cast<float *>(zero + 2);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3, r = lane >> 2;
    const int64_t G = gridDim.x;
    const int ntl = (int)((k.n_tiles - 1 - blockIdx.x) / G) + 1;
    const int total = ntl * niw;
    const int iw0 = warp * niw;
    const int no = w.n_out;
    const unsigned short *oval = reinterpret_cast<const unsigned short *>(w.oval);

    int is_n = 0, is_j = 0;
    int64_t is_tile = blockIdx.x;
    auto issue = [&](gm_item &it) {
        if (is_n < total) {
            const int item = iw0 + is_j, g = item * 4 + t;
            it.c0 = make_uint4(0, 0, 0, 0);
            it.c1 = it.c0;
            it.s0 = it.z0 = it.o0 = it.o1 = 0;
            if (item < n_items) {
                const int64_t ti = is_tile * n_items + item;
                it.c0 = ld_stream16(tm.codes + ti * 1024 + lane * 16);
                it.c1 = ld_stream16(tm.codes + ti * 1024 + 512 + lane * 16);
                it.s0 = __ldg(tm.scales + ti * 32 + lane);
                it.z0 = __ldg(tm.zeros + ti * 32 + lane);
            }
            const int64_t r0 = is_tile * 16 + r, r1 = r0 + 8;
            if (g < no && r0 < tm.rows) it.o0 = __ldg(oval + r0 * no + g);
            if (g < no && r1 < tm.rows) it.o1 = __ldg(oval + r1 * no + g);
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
    for (int s = 0; s < P; s++) issue(buf[s]);
    spx_pdl_wait();
    if (threadIdx.x < 2) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
    const float inv = gm_build(k, img, meta, xo, redd);
    const bool bval = t == (r >> 1);
    const uint8_t *bbase = bval ? img + t * GM_IMG_GROUP + (r & 1) * 32 : reinterpret_cast<const uint8_t *>(zero);
    const int bstride = bval ? 4 * GM_IMG_GROUP : 0;
    int ck = 0, cj = 0;
    int64_t ctile = blockIdx.x;
    float tot0 = 0.0f, tot1 = 0.0f;
    auto consume = [&](const gm_item &it, int h) {
        const int item = iw0 + cj + h, bi = item < n_items ? item : n_items - 1, g = item * 4 + t;
        const uint4 *bp = reinterpret_cast<const uint4 *>(bbase + bi * bstride);
        const uint4 bA = bp[0], bB = bp[1];
        int d[4] = {0, 0, 0, 0}, e[4] = {0, 0, 0, 0};
        mma_s8(d, it.c0.x & 0x0f0f0f0fu, it.c1.x & 0x0f0f0f0fu, (it.c0.x >> 4) & 0x0f0f0f0fu, (it.c1.x >> 4) & 0x0f0f0f0fu,
               bA.x, bA.y);
        mma_s8(e, it.c0.z & 0x0f0f0f0fu, it.c1.z & 0x0f0f0f0fu, (it.c0.z >> 4) & 0x0f0f0f0fu, (it.c1.z >> 4) & 0x0f0f0f0fu,
               bB.x, bB.y);
        mma_s8(d, it.c0.y & 0x0f0f0f0fu, it.c1.y & 0x0f0f0f0fu, (it.c0.y >> 4) & 0x0f0f0f0fu, (it.c1.y >> 4) & 0x0f0f0f0fu,
               bA.z, bA.w);
        mma_s8(e, it.c0.w & 0x0f0f0f0fu, it.c1.w & 0x0f0f0f0fu, (it.c0.w >> 4) & 0x0f0f0f0fu, (it.c1.w >> 4) & 0x0f0f0f0fu,
               bB.z, bB.w);
        const int2 mt = meta[bi * 4 + t];
        const int i0 = (d[0] + e[0]) + (d[1] + e[1]) * 256 + (int)(it.z0 & 15u) * mt.y;
        const int i1 = (d[2] + e[2]) + (d[3] + e[3]) * 256 + (int)((it.z0 >> 4) & 15u) * mt.y;
        const float S = __int_as_float(mt.x);
        tot0 = fmaf(__half2float(__ushort_as_half((unsigned short)(it.s0 & 0xffffu))) * S, (float)i0, tot0);
        tot1 = fmaf(__half2float(__ushort_as_half((unsigned short)(it.s0 >> 16))) * S, (float)i1, tot1);
        if (g < no) {
            tot0 = fmaf(__half2float(__ushort_as_half((unsigned short)it.o0)), xo[g], tot0);
            tot1 = fmaf(__half2float(__ushort_as_half((unsigned short)it.o1)), xo[g], tot1);
        }
    };
    auto finish = [&]() {
        tot0 += __shfl_xor_sync(0xffffffffu, tot0, 1);
        tot1 += __shfl_xor_sync(0xffffffffu, tot1, 1);
        tot0 += __shfl_xor_sync(0xffffffffu, tot0, 2);
        tot1 += __shfl_xor_sync(0xffffffffu, tot1, 2);
        const int kb = ck & 1;
        if (t == 0) {
            red[kb][warp][r] = tot0;
            red[kb][warp][r + 8] = tot1;
        }
        __syncthreads();
        if (warp == 0 && lane < 16) {
            float v = 0.0f;
#pragma unroll
            for (int ww = 0; ww < GM_WARPS; ww++) v += red[kb][ww][lane];
            const int64_t row = ctile * 16 + lane;
            if (row < tm.rows) a.o[0].y[row] = v * inv;
        }
    };
    for (int base = 0; base < total; base += P) {
#pragma unroll
        for (int s = 0; s < P; s += 2) {
            if (base + s < total) {
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
                }
            }
        }
    }
}

/* Repacks w (cols a multiple of 128, outliers fewer than n_groups) into a
 * new tiled_mat (device memory owned by the caller: cudaFree the three
 * pointers). */
static tiled_mat tiled_make(const spx_dqmat &w) {
    tiled_mat tm;
    memset(&tm, 0, sizeof tm);
    tm.rows = w.rows;
    tm.n_items = w.n_groups / 4;
    tm.n_tiles = (int)((w.rows + 15) / 16);
    size_t n = (size_t)tm.n_tiles * tm.n_items;
    uint8_t *c, *z;
    uint32_t *s;
    CK(cudaMalloc(&c, n * 1024));
    CK(cudaMalloc(&s, n * 128));
    CK(cudaMalloc(&z, n * 32));
    tiled_repack<<<4096, 256>>>(w, c, s, z, tm.n_items, tm.n_tiles);
    CK(cudaGetLastError());
    tm.codes = c;
    tm.scales = s;
    tm.zeros = z;
    tm.bytes = n * (1024 + 128 + 32) + (size_t)w.rows * w.n_out * 2 + (size_t)w.n_out * 4;
    return tm;
}

static void tiled_free(tiled_mat &tm) {
    cudaFree((void *)tm.codes);
    cudaFree((void *)tm.scales);
    cudaFree((void *)tm.zeros);
}

typedef void (*tiled_fn)(const gemv_kargs, const tiled_mat);
static const tiled_fn g_tiled[] = {gemv_tiled_kernel<4, 2>, gemv_tiled_kernel<4, 3>, gemv_tiled_kernel<6, 2>};
static const int g_tiled_minb[] = {2, 3, 2};
static const char *g_tiled_name[] = {"tile P4 x2", "tile P4 x3", "tile P6 x2"};
#define N_TILED 3

static cudaError_t tiled_gemv(int v, const spx_dqmat &w, const tiled_mat &tm, const float *x, float *y, int n_sm,
                              cudaStream_t st) {
    gemv_kargs k;
    memset(&k, 0, sizeof k);
    k.a.w[0] = w;
    k.a.o[0].y = y;
    k.a.n_mats = 1;
    k.a.mode = SPX_GEMV_STORE;
    k.a.x = x;
    k.cols = (int)w.cols;
    k.start[0] = 0;
    k.start[1] = w.rows;
    k.start[2] = k.start[3] = INT64_MAX;
    k.total = w.rows;
    k.n_out_tot = w.n_out;
    k.n_out_max = w.n_out;
    k.n_items = tm.n_items;
    k.niw = (k.n_items + GM_WARPS - 1) / GM_WARPS;
    k.niw += k.niw & 1;
    k.n_tiles = tm.n_tiles;
    const size_t smem = (size_t)k.n_items * 4 * (GM_IMG_GROUP + 8) + 32 + (size_t)((k.n_out_tot + 3) & ~3) * 4;
    static bool attr;
    if (!attr) {
        for (int i = 0; i < N_TILED; i++)
            CK(cudaFuncSetAttribute(g_tiled[i], cudaFuncAttributeMaxDynamicSharedMemorySize, GM_SMEM_MAX));
        attr = true;
    }
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, g_tiled[v], GM_WARPS * 32, smem) != cudaSuccess || occ < 1)
        occ = 1;
    if (occ > g_tiled_minb[v]) occ = g_tiled_minb[v];
    int64_t blocks = (int64_t)n_sm * occ;
    if (blocks > k.n_tiles) blocks = k.n_tiles;
    return spx_launch(g_tiled[v], dim3((unsigned)blocks), dim3(GM_WARPS * 32), smem, st, true, k, tm);
}
