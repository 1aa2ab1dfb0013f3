/* bench_gemv.cu: the decode GEMV alone against the device's copy bandwidth.
 *
 *   bench_gemv [--json]
 *
 * First a device-to-device copy of 2 GiB (bytes read + written per second,
 * the ceiling a memory-bound kernel is measured against), then the fused
 * W4A16 GEMV on Llama-3.1-8B shapes: random codes, fp16 scales, zero
 * nibbles and 1% fp16 outlier columns, as many copies of each matrix as
 * make > 400 MB (so L2 holds none of them between launches), launched
 * back to back inside a CUDA graph and timed with events (median of 7
 * replays): first the row-major kernel (impl 0; the backend runs it only
 * for widths the tiled layout cannot hold), then, for the one-matrix and
 * SwiGLU cases, the tiled layout the backend runs (impl 100 + v: tiled
 * form v, checked against the rows). Weight bytes per launch (codes +
 * scales + zeros + outliers) over the time give GB/s.
 * Prints a table (or one JSON line per row); --ncu: one plain launch per
 * case, for ncu.
 *
 *   bench_gemv --mtok
 *
 * instead: the M-token products of decode-sized passes on the same shapes
 * (tiled, as the backend runs them; the same > 400 MB rotation and timing):
 * the GEMV (M = 1, float input) against spx_gemm_q4 (the prefill GEMM) and
 * spx_gemm_q4_mtok (gemm_mtok.cuh; rows per warp forced to 1 and 2, and
 * the default) at M = 1, 2, 4, 8, 16 (fp16 input [M, cols]), each as time,
 * ratio to the GEMV and GB/s of weights; the mtok results checked against
 * the prefill GEMM's on the first matrix (same numerics: only the order of
 * the float32 sums differs). */
#include "cuda/gemv_q4.cuh"
#include "cuda/gemm_mtok.cuh"
extern "C" {
#include "quant/g32.h"
}

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(call)                                                                                            \
    do {                                                                                                    \
        cudaError_t err_ = (call);                                                                          \
        if (err_ != cudaSuccess) {                                                                          \
            fprintf(stderr, "bench_gemv: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            exit(1);                                                                                        \
        }                                                                                                   \
    } while (0)

__global__ void fill_random(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 29;
        p[i] = (uint8_t)x;
    }
}

__global__ void fill_scales(__half *p, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 7) * 0x9E3779B97F4A7C15ull ^ seed;
        x ^= x >> 29;
        p[i] = __float2half_rn(0.002f + 0.004f * (float)(x & 0xffff) / 65536.0f);
    }
}

__global__ void fill_idx(int32_t *p, int n, int cols) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = (int32_t)((int64_t)i * cols / n);
}

static spx_dqmat make_mat(int64_t rows, int64_t cols, int n_out, uint64_t seed, size_t *bytes) {
    spx_dqmat d;
    memset(&d, 0, sizeof d);
    d.rows = rows;
    d.cols = cols;
    d.n_groups = (int)(cols / 32);
    d.zrow = (d.n_groups + 1) / 2;
    d.n_out = n_out;
    size_t cb = (size_t)rows * cols / 2, sb = (size_t)rows * d.n_groups * 2, zb = (size_t)rows * d.zrow;
    size_t ob = (size_t)rows * n_out * 2, ib = (size_t)n_out * 4;
    uint8_t *c, *z;
    __half *s, *ov;
    int32_t *oi;
    CK(cudaMalloc(&c, cb));
    CK(cudaMalloc(&s, sb + 16));
    CK(cudaMalloc(&z, zb + 16));
    CK(cudaMalloc(&ov, ob ? ob : 2));
    CK(cudaMalloc(&oi, ib ? ib : 4));
    fill_random<<<1024, 256>>>(c, cb, seed);
    fill_random<<<1024, 256>>>(z, zb, seed ^ 0x55);
    fill_scales<<<1024, 256>>>(s, sb / 2, seed);
    fill_scales<<<1024, 256>>>(ov, ob / 2, seed ^ 0x77);
    if (n_out) fill_idx<<<16, 256>>>(oi, n_out, (int)cols);
    CK(cudaGetLastError());
    d.codes = c;
    d.scales = s;
    d.zeros = z;
    d.oidx = n_out ? oi : NULL;
    d.oval = n_out ? ov : NULL;
    *bytes = cb + sb + zb + ob + ib;
    return d;
}

/* The same matrix tiled as the .trdc stores it (spx_q_tile on the host,
 * the writer's function); outliers shared with d. */
static spx_dqmat tile_mat(const spx_dqmat &d) {
    const size_t cb = (size_t)d.rows * d.cols / 2, sb = (size_t)d.rows * d.n_groups * 2, zb = (size_t)d.rows * d.zrow;
    std::vector<uint8_t> c(cb), z(zb);
    std::vector<uint16_t> sc(sb / 2);
    CK(cudaMemcpy(c.data(), d.codes, cb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(sc.data(), d.scales, sb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(z.data(), d.zeros, zb, cudaMemcpyDeviceToHost));
    spx_qtensor q;
    memset(&q, 0, sizeof q);
    q.rows = d.rows;
    q.cols = d.cols;
    q.bits = 4;
    q.group = 32;
    q.codes = c.data();
    q.scales = sc.data();
    q.zeros = z.data();
    q.layout = SPX_Q_ROWS;
    spx_qtensor tq;
    void *mem;
    spx_err e;
    spx_err_clear(&e);
    if (spx_q_tile_alloc(&q, &tq, &mem, &e) != SPX_OK) {
        fprintf(stderr, "tile: %s\n", e.msg);
        exit(1);
    }
    spx_dqmat t = d;
    t.tiled = 1;
    const size_t tcb = (size_t)spx_q_codes_bytes(d.rows, d.cols, 4, SPX_Q_TILED),
                 tsb = (size_t)spx_q_scales_bytes(d.rows, d.cols, 32, SPX_Q_TILED),
                 tzb = (size_t)spx_q_zeros_bytes(d.rows, d.cols, 32, SPX_Q_TILED);
    uint8_t *dc, *dz;
    __half *ds;
    CK(cudaMalloc(&dc, tcb));
    CK(cudaMalloc(&ds, tsb));
    CK(cudaMalloc(&dz, tzb));
    CK(cudaMemcpy(dc, tq.codes, tcb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, tq.scales, tsb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dz, tq.zeros, tzb, cudaMemcpyHostToDevice));
    free(mem);
    t.codes = dc;
    t.scales = ds;
    t.zeros = dz;
    return t;
}

static void free_mat(spx_dqmat &d) {
    cudaFree((void *)d.codes);
    cudaFree((void *)d.scales);
    cudaFree((void *)d.zeros);
    cudaFree((void *)d.oval);
    cudaFree((void *)d.oidx);
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* Seconds per launch: enqueue(i) for i < 64 captured in one graph, the
 * graph replayed 7 times after a warm-up, the median replay / 64. */
template <typename F> static double time_launches(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, F enqueue) {
    const int launches = 64;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < launches; i++) enqueue(i);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st));
    std::vector<double> t;
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1e-3 / launches);
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return median(t);
}

/* --mtok: see the top. */
static void run_mtok(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int n_sm, double copy_gbs) {
    struct { const char *name; int64_t rows, cols; } cases[] = {
        {"q 4096x4096", 4096, 4096},           {"k/v 1024x4096", 1024, 4096}, {"gate/up 14336x4096", 14336, 4096},
        {"down 4096x14336", 4096, 14336},      {"lm_head 128256x4096", 128256, 4096},
    };
    const int Ms[] = {1, 2, 4, 8, 16};
    const int maxM = 16;
    float *xf, *y, *ws;
    __half *xh;
    CK(cudaMalloc(&xf, 14336 * 4));
    CK(cudaMalloc(&xh, (size_t)maxM * 14336 * 2));
    CK(cudaMalloc(&y, (size_t)maxM * 128256 * 4 * 2));
    const size_t ws_floats = (size_t)16 * maxM * 128256;
    CK(cudaMalloc(&ws, ws_floats * 4));
    fill_scales<<<64, 256>>>((__half *)xf, 14336 * 2, 3);
    fill_scales<<<64, 256>>>(xh, (size_t)maxM * 14336, 5);
    printf("%-22s %-16s %3s %9s %9s %8s %9s\n", "mtok shape", "kernel", "M", "MB", "us", "x GEMV", "GB/s");
    for (auto &c : cases) {
        size_t per = 0;
        std::vector<spx_dqmat> mats;
        while (mats.size() < 2 || per * mats.size() < ((size_t)400 << 20)) {
            spx_dqmat d = make_mat(c.rows, c.cols, (int)(c.cols / 100), 7000 + mats.size(), &per);
            CK(cudaDeviceSynchronize());
            mats.push_back(tile_mat(d));
            cudaFree((void *)d.codes); /* the outliers stay: the tiled copy shares them */
            cudaFree((void *)d.scales);
            cudaFree((void *)d.zeros);
        }
        const size_t nm = mats.size();
        auto gemm = [&](size_t i, int M, float *out) {
            spx_gemm_args g;
            memset(&g, 0, sizeof g);
            g.w = mats[i % nm];
            g.x = xh;
            g.ldx = c.cols;
            g.y = out;
            g.ldy = c.rows;
            g.M = M;
            g.ws = ws;
            g.ws_floats = ws_floats;
            return g;
        };
        const double t1 = time_launches(st, e0, e1, [&](int i) {
            spx_gemv_args ga;
            memset(&ga, 0, sizeof ga);
            ga.w[0] = mats[i % nm];
            ga.o[0].y = y;
            ga.n_mats = 1;
            ga.mode = SPX_GEMV_STORE;
            ga.x = xf;
            CK(spx_gemv_q4(ga, n_sm, st));
        });
        auto row = [&](const char *kern, int M, double tm) {
            printf("%-22s %-16s %3d %9.1f %9.2f %8.2f %9.1f\n", c.name, kern, M, (double)per / 1e6, tm * 1e6, tm / t1,
                   (double)per / tm / 1e9);
        };
        row("gemv", 1, t1);
        for (int M : Ms) {
            const double tg = time_launches(st, e0, e1, [&](int i) { CK(spx_gemm_q4(gemm(i, M, y), n_sm, st)); });
            row("gemm_q4", M, tg);
        }
        for (int R = 0; R < 3; R++) {
            spx_gemm_q4_mtok_force_rows(R);
            for (int M : Ms) {
                const double tm = time_launches(st, e0, e1, [&](int i) { CK(spx_gemm_q4_mtok(gemm(i, M, y), n_sm, st)); });
                /* check against the prefill GEMM on matrix 0 */
                CK(spx_gemm_q4(gemm(0, M, y), n_sm, st));
                CK(spx_gemm_q4_mtok(gemm(0, M, y + (size_t)maxM * 128256), n_sm, st));
                CK(cudaStreamSynchronize(st));
                const size_t ny = (size_t)M * c.rows;
                std::vector<float> y0(ny), y1(ny);
                CK(cudaMemcpy(y0.data(), y, ny * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(y1.data(), y + (size_t)maxM * 128256, ny * 4, cudaMemcpyDeviceToHost));
                double md = 0, mx = 0;
                for (size_t j = 0; j < ny; j++) {
                    md = fmax(md, fabs((double)y0[j] - y1[j]));
                    mx = fmax(mx, fabs((double)y0[j]));
                }
                char kn[32];
                snprintf(kn, sizeof kn, R ? "mtok R=%d" : "mtok default", R);
                row(kn, M, tm);
                printf("%-22s   (max |d| vs gemm_q4 %.3g of max |y| %.3g%s)\n", "", md, mx,
                       md <= 1e-3 * mx ? "" : "  MISMATCH");
            }
        }
        spx_gemm_q4_mtok_force_rows(0);
        for (auto &m : mats) free_mat(m);
        CK(cudaDeviceSynchronize());
    }
    cudaFree(xf);
    cudaFree(xh);
    cudaFree(y);
    cudaFree(ws);
    (void)copy_gbs;
}

int main(int argc, char **argv) {
    int json = argc > 1 && !strcmp(argv[1], "--json");  /* [--json] [--ncu] */
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int n_sm = prop.multiProcessorCount;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    /* copy bandwidth */
    size_t cbytes = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, cbytes));
    CK(cudaMalloc(&b, cbytes));
    fill_random<<<4096, 256>>>((uint8_t *)a, cbytes, 1);
    CK(cudaMemcpyAsync(b, a, cbytes, cudaMemcpyDeviceToDevice, st));
    std::vector<double> ct;
    for (int r = 0; r < 9; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(r & 1 ? a : b, r & 1 ? b : a, cbytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ct.push_back(ms * 1e-3);
    }
    double copy_gbs = 2.0 * (double)cbytes / median(ct) / 1e9;
    CK(cudaFree(a));
    CK(cudaFree(b));
    if (json) printf("{\"what\": \"copy\", \"bytes\": %zu, \"gbps\": %.1f}\n", cbytes, copy_gbs);
    else printf("device %s (%d SMs): device-to-device copy %.1f GB/s (read + write)\n\n", prop.name, n_sm, copy_gbs);

    CK(spx_gemv_q4_setup(SPX_GEMV_MAX_COLS));
    if (argc > 1 && !strcmp(argv[1], "--mtok")) {
        run_mtok(st, e0, e1, n_sm, copy_gbs);
        return 0;
    }
    const int ncu = argc > 1 && !strcmp(argv[argc - 1], "--ncu");
    struct { const char *name; int64_t rows, cols; int mode; } cases[] = {
        {"down 4096x14336", 4096, 14336, SPX_GEMV_STORE},
        {"up 14336x4096", 14336, 4096, SPX_GEMV_STORE},
        {"gate+up swiglu 2x14336x4096", 14336, 4096, SPX_GEMV_SWIGLU},
        {"q 4096x4096", 4096, 4096, SPX_GEMV_STORE},
        {"qkv 6144x4096 (3 mats)", 4096, 4096, -1},
        {"lm_head 128256x4096 argmax", 128256, 4096, SPX_GEMV_ARGMAX},
    };
    if (!json) printf("%-30s %4s %9s %9s %9s %8s\n", "gemv", "impl", "MB", "us", "GB/s", "of copy");
    float *x, *y;
    CK(cudaMalloc(&x, 14336 * 4));
    CK(cudaMalloc(&y, 128256 * 4 * 4));
    fill_scales<<<64, 256>>>((__half *)x, 14336 * 2, 3); /* any finite values */
    unsigned long long *best;
    CK(cudaMalloc(&best, 8));
    for (auto &c : cases) {
        int n_mats = c.mode == SPX_GEMV_SWIGLU ? 2 : c.mode == -1 ? 3 : 1;
        int64_t rows[3] = {c.rows, c.mode == -1 ? 1024 : c.rows, 1024};
        size_t per = 0;
        std::vector<std::vector<spx_dqmat>> sets;
        while (sets.size() < 2 || per * sets.size() < ((size_t)400 << 20)) {
            std::vector<spx_dqmat> s;
            size_t tot = 0;
            for (int i = 0; i < n_mats; i++) {
                size_t bb;
                s.push_back(make_mat(rows[i], c.cols, (int)(c.cols / 100), 1000 * sets.size() + i, &bb));
                tot += bb;
            }
            per = tot;
            sets.push_back(s);
        }
        CK(cudaDeviceSynchronize());
        /* one launch over the matrices of set s: outputs from out (k and v
         * rows after q's), the input x (times x2 when with_x2) */
        auto args = [&](const std::vector<spx_dqmat> &s, float *out, int mode, bool with_x2) {
            spx_gemv_args ga;
            memset(&ga, 0, sizeof ga);
            for (int kk = 0; kk < n_mats; kk++) {
                ga.w[kk] = s[kk];
                ga.o[kk].y = out + (kk == 2 ? 4096 + 1024 : kk * rows[0]);
            }
            ga.n_mats = n_mats;
            ga.mode = mode;
            ga.x = x;
            ga.x2 = with_x2 ? x : NULL;
            ga.best = best;
            return ga;
        };
        const int mode = c.mode == -1 ? SPX_GEMV_STORE : c.mode;
        if (ncu) { /* one plain launch per case for the profiler, and one of the tiled layout (the default kernel) */
            CK(spx_gemv_q4(args(sets[0], y, mode, false), n_sm, st));
            if (c.cols % 128 == 0) {
                std::vector<spx_dqmat> t;
                for (auto &m : sets[0]) t.push_back(tile_mat(m));
                CK(spx_gemv_q4(args(t, y, mode == SPX_GEMV_SWIGLU ? SPX_GEMV_STORE : mode, false), n_sm, st));
            }
            CK(cudaStreamSynchronize(st));
            continue;
        }
        const int impl = 0;
        const double tm = time_launches(st, e0, e1, [&](int i) {
            CK(spx_gemv_q4(args(sets[i % sets.size()], y, mode, false), n_sm, st));
        });
        const double gbs = (double)per / tm / 1e9;
        if (json)
            printf("{\"what\": \"gemv\", \"case\": \"%s\", \"impl\": %d, \"bytes\": %zu, \"us\": %.2f, \"gbps\": %.1f, "
                   "\"of_copy\": %.3f}\n",
                   c.name, impl, per, tm * 1e6, gbs, gbs / copy_gbs);
        else
            printf("%-30s %4d %9.1f %9.2f %9.1f %7.1f%%\n", c.name, impl, (double)per / 1e6, tm * 1e6, gbs, 100 * gbs / copy_gbs);
        /* the tiled layout (the .trdc's, qtensor.h) of the same matrices: each
         * tiled variant, plain launches and with programmatic dependent launch
         * (as the decode graph runs them); gate+up as the backend runs it on
         * tiled matrices (two-matrix STORE), and the down projection with the
         * silu(gate) * up input. Checked against the row-major kernel on set 0
         * where the modes agree. */
        if (!ncu && c.cols % 128 == 0) {
            std::vector<std::vector<spx_dqmat>> tsets;
            for (auto &s : sets) {
                std::vector<spx_dqmat> t;
                for (auto &m : s) t.push_back(tile_mat(m));
                tsets.push_back(t);
            }
            const int tmode = c.mode == SPX_GEMV_SWIGLU || c.mode == -1 ? SPX_GEMV_STORE : c.mode;
            /* one result row of a tiled launch; md, mx: its max |difference| to the row-major kernel and the
             * largest |y| (NaN: not compared) */
            auto tiled_row = [&](const char *nm, int impl, double tm, bool pdl, double md, double mx) {
                const double gbs = (double)per / tm / 1e9;
                char dj[64] = "null, \"max_abs\": null"; /* JSON has no NaN: null where the modes differ */
                if (!isnan(md)) snprintf(dj, sizeof dj, "%.3g, \"max_abs\": %.3g", md, mx);
                if (json)
                    printf("{\"what\": \"gemv\", \"case\": \"%s\", \"impl\": %d, \"bytes\": %zu, \"us\": %.2f, "
                           "\"gbps\": %.1f, \"of_copy\": %.3f, \"pdl\": %s, \"max_diff_vs_rows\": %s}\n",
                           nm, impl, per, tm * 1e6, gbs, gbs / copy_gbs, pdl ? "true" : "false", dj);
                else
                    printf("%-30s %4d %9.1f %9.2f %9.1f %7.1f%%  (max |d| vs rows %.3g of %.3g)\n", nm, impl,
                           (double)per / 1e6, tm * 1e6, gbs, 100 * gbs / copy_gbs, md, mx);
            };
            const bool x2 = c.cols == 14336; /* the down projection: also with x2 */
            /* (form, PDL, x2 input): 0 and 1 two or three blocks per SM, 2 two
             * groups of 8 warps per block sharing one image */
            static const int runs[][3] = {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {0, 1, 0}, {1, 1, 0},
                                          {2, 1, 0}, {0, 1, 1}, {2, 1, 1}};
            for (int run = 0; run < (x2 ? 8 : 6); run++) {
                const int v = runs[run][0];
                const bool pdl = runs[run][1], wx2 = runs[run][2];
                spx_gemv_q4_force_tiled_variant(v);
                double md = NAN, mx = NAN;
                if (c.mode != SPX_GEMV_SWIGLU) {
                    CK(spx_gemv_q4(args(sets[0], y, tmode, wx2), n_sm, st));
                    CK(spx_gemv_q4(args(tsets[0], y + 2 * 128256, tmode, wx2), n_sm, st));
                    CK(cudaStreamSynchronize(st));
                    const size_t ny = (size_t)rows[0] + (n_mats == 3 ? 2048 : 0);
                    std::vector<float> y0(ny), y1(ny);
                    CK(cudaMemcpy(y0.data(), y, ny * 4, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(y1.data(), y + 2 * 128256, ny * 4, cudaMemcpyDeviceToHost));
                    md = 0, mx = 0;
                    for (size_t i = 0; i < ny; i++) {
                        md = fmax(md, fabs((double)y0[i] - y1[i]));
                        mx = fmax(mx, fabs((double)y0[i]));
                    }
                }
                const double tm = time_launches(st, e0, e1, [&](int i) {
                    CK(spx_gemv_q4(args(tsets[i % tsets.size()], y, tmode, wx2), n_sm, st, pdl));
                });
                char nm[160];
                if (v < 2) snprintf(nm, sizeof nm, "%s, tiled %d blocks/SM%s%s", c.name, 2 + v, pdl ? ", PDL" : "",
                                    wx2 ? ", x2 input" : "");
                else snprintf(nm, sizeof nm, "%s, tiled 2 groups/block%s%s", c.name, pdl ? ", PDL" : "",
                              wx2 ? ", x2 input" : "");
                tiled_row(nm, 100 + v, tm, pdl, md, mx);
            }
            spx_gemv_q4_force_tiled_variant(-1);
            if (c.mode == SPX_GEMV_SWIGLU) { /* gate/up paired: silu(gate) * up stored by the launch (two groups) */
                const double tm = time_launches(st, e0, e1, [&](int i) {
                    spx_gemv_args ga = args(tsets[i % tsets.size()], y, SPX_GEMV_STORE, false);
                    ga.pair = 1;
                    CK(spx_gemv_q4(ga, n_sm, st, true));
                });
                char nm[160];
                snprintf(nm, sizeof nm, "%s, tiled paired (2 groups/block), PDL", c.name);
                tiled_row(nm, 103, tm, true, NAN, NAN); /* no row-major twin to compare with */
            }
            for (auto &t : tsets)
                for (auto &m : t) {
                    cudaFree((void *)m.codes);
                    cudaFree((void *)m.scales);
                    cudaFree((void *)m.zeros);
                }
        }
        for (auto &s : sets)
            for (auto &m : s) free_mat(m);
    }
    return 0;
}
