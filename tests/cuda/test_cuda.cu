/* test_cuda.cu: the CUDA backend against the CPU reference.
 *
 *   test_cuda [MODEL.trdc ...]
 *
 * Kernels: every op family (GEMV in all modes, GEMM, embedding, RMSNorm,
 * q/k-norm + RoPE + KV store, SwiGLU, attention with and without split-K
 * and sliding window, argmax) on fresh random inputs across shapes, the
 * outputs poisoned with NaN before each launch, against the scalar C
 * references (quant/g32.c, cpu/ops.c) or double-precision loops.
 * End to end, for each .trdc given: logits of the cuda backend against the
 * cpu backend with the scalar kernels (SPECTRA_KERNELS=scalar) for a
 * 150-token prefill (two GEMM chunks), eager single-token steps (GEMV
 * path), then greedy steps through the captured graph (step_greedy), and
 * a replay of the prefill that must give bit-identical logits.
 * --kv q4: the device store against spx_kv_store byte for byte and q4
 * attention against the CPU-dequantized cache (test_kvq4), the decode
 * kernel that also does rope_store's work and stores the token's row
 * (test_kvq4_fused), and the same
 * end-to-end sequence with q4 caches on both backends, bounded relative to
 * q4's own error (test_model_q4; the derivation is at E2E_Q4_MEAN_RATIO).
 * Prints every measured error; exits 0 with a note when no CUDA device is
 * present (CI machines). Tolerances are the named constants below. */
#include "cuda/act.cuh"
#include "cuda/attention.cuh"
#include "cuda/embed.cuh"
#include "cuda/gemm_cublas.cuh"
#include "cuda/gemm_mtok.cuh"
#include "cuda/gemm_q4.cuh"
#include "cuda/gemv_q4.cuh"
#include "cuda/norm.cuh"
#include "cuda/rope.cuh"
#include "cuda/sample.cuh"

#include "cuda/cutest.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "core/half.h"
#include "cpu/ops.h"
#include "engine/backend.h"
#include "engine/session.h"
#include "quant/g32.h"
#include "testlib.h"
}

/* GEMV: the error scales with sum_c s (q + z) |x| rather than |y| (the zero
 * point is taken out per group). The int8 tensor-core kernels: x rounded
 * to 2^-15 of its group's largest |x|, exact integer sums per group,
 * float32 across groups; a CPU model of that kernel stays within 0.2 of
 * this bound on these shapes. */
#define GEMV_TOL_REL 3e-5
/* GEMM: W^ and x rounded to fp16 (2^-11 relative each) before exact
 * products and float32 sums on the tensor cores. */
#define GEMM_TOL_REL 1.5e-3
/* Elementwise float32 ops (norm, rope, silu): a few ulps. */
#define ELEM_TOL_REL 2e-6
/* Attention: float32 online softmax vs a double reference. */
#define ATTN_TOL_ABS 2e-5
/* End to end, max |logit_cuda - logit_cpu| / max(1, max |logit_cpu|) per
 * token: prefill runs fp16 GEMMs (tensor cores or cuBLAS; its K/V stay in
 * the cache for the steps after it); a sequence fed one token at a time
 * runs the GEMV (activations as two int8 digits, 2^-15 of each group's
 * largest |x|) with fp16 K/V. Seen on the H200 over the fixtures and the
 * random inputs of 7 runs: prefill 1.1e-3 .. 1.9e-3, token by token
 * 1.7e-4 .. 1.65e-3 (tiny-qwen3, whose 48-wide heads and qk-norm amplify
 * most), hence 4e-3 for the latter. */
#define E2E_PREFILL_TOL 2e-2
#define E2E_GEMV_TOL 4e-3

static uint64_t g_rng = 0xc0da5eedULL;

static void poison(void *d, size_t bytes) { CK(cudaMemset(d, 0xff, bytes)); } /* NaN floats / halves */
static std::vector<float> down(const float *d, size_t n) {
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}

static std::vector<float> rand_vec(size_t n, float scale) {
    std::vector<float> v(n);
    for (auto &x : v) x = scale * tl_rand_normal(&g_rng);
    return v;
}

/* ---- quantized test matrices ------------------------------------------ */

struct qmat {
    spx_qbuf b;
    spx_dqmat d;             /* row-major, on the device */
    spx_dqmat dt;            /* the same matrix tiled (spx_q_tile, as the .trdc stores it); dt.codes NULL
                              * when cols % 128 != 0 */
    void *tmem;              /* host arrays of the tiled copy */
    std::vector<float> wabs; /* per (row, col): s (q + z) for the GEMV bound, |W^| otherwise */
};

static void make_qmat(qmat &m, int64_t rows, int64_t cols, int64_t n_out) {
    std::vector<int32_t> idx;
    for (int64_t c = 0; c < cols && (int64_t)idx.size() < n_out; c++)
        if ((int64_t)(tl_rand_u64(&g_rng) % (uint64_t)cols) < n_out * 2 || cols - c <= n_out - (int64_t)idx.size())
            idx.push_back((int32_t)c);
    n_out = (int64_t)idx.size();
    spx_err e;
    spx_err_clear(&e);
    if (spx_qbuf_init(&m.b, rows, cols, 4, 32, n_out ? idx.data() : NULL, n_out, &e) != SPX_OK) {
        fprintf(stderr, "FAIL qbuf: %s\n", e.msg);
        exit(1);
    }
    std::vector<float> w(cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) w[c] = 0.05f * tl_rand_normal(&g_rng) + (c % 7 == 0 ? 0.02f : 0.0f);
        for (int64_t j = 0; j < n_out; j++) w[idx[j]] = 0.8f * tl_rand_normal(&g_rng);
        spx_qbuf_set_row(&m.b, r, w.data(), SPX_Q_MINMAX, NULL);
    }
    const spx_qtensor *q = &m.b.q;
    spx_dqmat &d = m.d;
    memset(&d, 0, sizeof d);
    d.rows = rows;
    d.cols = cols;
    d.n_groups = (int)(cols / 32);
    d.zrow = (d.n_groups + 1) / 2;
    d.n_out = (int)n_out;
    d.codes = dev_up(q->codes, (size_t)(rows * cols / 2));
    d.scales = (const __half *)dev_up(q->scales, (size_t)(rows * d.n_groups));
    d.zeros = dev_up(q->zeros, (size_t)(rows * d.zrow));
    if (n_out) {
        d.oidx = dev_up(q->outlier_idx, (size_t)n_out);
        d.oval = (const __half *)dev_up(q->outlier_val, (size_t)(rows * n_out));
    }
    m.dt = d;
    m.dt.codes = NULL;
    m.tmem = NULL;
    if (spx_q_tiled_ok(4, 32, cols)) { /* the file's tiled layout, made by the writer's function */
        spx_qtensor tq;
        if (spx_q_tile_alloc(q, &tq, &m.tmem, &e) != SPX_OK) {
            fprintf(stderr, "FAIL tile: %s\n", e.msg);
            exit(1);
        }
        m.dt.tiled = 1;
        m.dt.codes = dev_up(tq.codes, (size_t)spx_q_codes_bytes(rows, cols, 4, SPX_Q_TILED));
        m.dt.scales = (const __half *)dev_up(tq.scales, (size_t)spx_q_scales_bytes(rows, cols, 32, SPX_Q_TILED) / 2);
        m.dt.zeros = dev_up(tq.zeros, (size_t)spx_q_zeros_bytes(rows, cols, 32, SPX_Q_TILED));
    }
    m.wabs.resize((size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *cr = q->codes + r * (cols / 2), *zr = q->zeros + r * d.zrow;
        const uint16_t *sr = q->scales + r * d.n_groups;
        for (int64_t c = 0; c < cols; c++) {
            int g = (int)(c / 32);
            float s = spx_f16_to_f32(sr[g]);
            m.wabs[r * cols + c] = s * (float)(spx_q_code_get(cr, c, 4, 32) + spx_q_zero_get(zr, g));
        }
        for (int64_t j = 0; j < n_out; j++)
            m.wabs[r * cols + idx[j]] += fabsf(spx_f16_to_f32(q->outlier_val[r * n_out + j]));
    }
}

static void free_qmat(qmat &m) {
    spx_qbuf_free(&m.b);
    free(m.tmem);
}

/* ---- GEMV ----------------------------------------------------------------- */

/* Reference of one matrix: y[r] = W^ x + bias; bound[r] for the tolerance. */
static void gemv_ref(const qmat &m, const float *x, const float *bias, std::vector<double> &y,
                     std::vector<double> &bound) {
    int64_t rows = m.b.q.rows, cols = m.b.q.cols;
    y.assign((size_t)rows, 0.0);
    bound.assign((size_t)rows, 0.0);
    for (int64_t r = 0; r < rows; r++) {
        y[r] = (double)spx_q_dot_row(&m.b.q, r, x) + (bias ? bias[r] : 0.0);
        double b = 0;
        for (int64_t c = 0; c < cols; c++) b += (double)m.wabs[r * cols + c] * fabs(x[c]);
        bound[r] = GEMV_TOL_REL * b + 1e-6 + (bias ? 1e-7 * fabs(bias[r]) : 0.0);
    }
}

static int check_close(const char *what, const float *got, const double *ref, const double *tol, size_t n) {
    double worst = 0;
    size_t wi = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= tol[i])) bad++;
        double ratio = isnan(got[i]) ? INFINITY : d / tol[i];
        if (ratio > worst || isnan(got[i])) {
            worst = ratio;
            wi = i;
        }
    }
    CHECK(bad == 0, "%s: %d of %zu outside tolerance; worst [%zu] got %.8g ref %.8g (%.2f x tol)", what, bad, n, wi,
          (double)got[wi], ref[wi], worst);
    return bad == 0;
}

static void test_gemv(int n_sm) {
    struct { int64_t rows, cols, n_out; } shapes[] = {
        {64, 128, 0}, {100, 352, 5}, {333, 4096, 41}, {4096, 4096, 41}, {1000, 14336, 143}, {5, 64, 3}, {2049, 2048, 20},
        {77, 3072, 9}, {40, 1024, 100}, /* outliers past the stream's share */
        {1024, 14336, 143}, {48, 2176, 7}, /* 17 items a row: a pair's second item past the end */
        {48, 1024, 600}, /* more outliers than a block has threads (the tiled kernels' early indices cover the first 256 / 512) */
    };
    int n_cases = 0;
    for (auto &sh : shapes) {
        for (int norm = 0; norm < 2; norm++) {
            qmat m;
            make_qmat(m, sh.rows, sh.cols, sh.n_out);
            std::vector<float> x = rand_vec((size_t)sh.cols, 1.5f), bias = rand_vec((size_t)sh.rows, 0.1f);
            std::vector<float> gain = rand_vec((size_t)sh.cols, 0.3f);
            for (auto &g : gain) g += 1.0f;
            std::vector<float> xr = x;
            if (norm) spx_cpu_rmsnorm(xr.data(), x.data(), gain.data(), sh.cols, 1e-5f);
            float *dx = dev_up(x.data(), x.size()), *dg = dev_up(gain.data(), gain.size());
            float *db = dev_up(bias.data(), bias.size());
            float *dy = dev_alloc<float>((size_t)sh.rows);
            std::vector<double> ref, tol;
            gemv_ref(m, xr.data(), bias.data(), ref, tol);
            char what[128];

            /* STORE with bias */
            spx_gemv_args a;
            memset(&a, 0, sizeof a);
            a.w[0] = m.d;
            a.o[0].y = dy;
            a.o[0].bias = db;
            a.n_mats = 1;
            a.mode = SPX_GEMV_STORE;
            a.x = dx;
            a.gain = norm ? dg : NULL;
            a.eps = 1e-5f;
            poison(dy, (size_t)sh.rows * 4);
            CK(spx_gemv_q4(a, n_sm, 0));
            CK(cudaDeviceSynchronize());
            snprintf(what, sizeof what, "gemv store %lldx%lld out %lld norm %d", (long long)sh.rows, (long long)sh.cols,
                     (long long)sh.n_out, norm);
            check_close(what, down(dy, (size_t)sh.rows).data(), ref.data(), tol.data(), (size_t)sh.rows);

            /* the tiled layout (cols % 128 == 0): STORE and ADD in each tiled
             * form, ARGMAX; a row-major partner is refused */
            if (m.dt.codes) {
                spx_gemv_args at = a;
                at.w[0] = m.dt;
                std::vector<float> y0 = rand_vec((size_t)sh.rows, 1.0f);
                std::vector<double> ref2(ref), tol2(tol);
                for (size_t i = 0; i < ref2.size(); i++) {
                    ref2[i] += y0[i];
                    tol2[i] += 2e-7 * fabs(ref2[i]);
                }
                std::vector<float> yv[3];
                for (int v = 0; v < 3; v++) { /* 0, 1: 2 or 3 blocks/SM; 2: two groups of 8 warps per block */
                    spx_gemv_q4_force_tiled_variant(v);
                    at.mode = SPX_GEMV_STORE;
                    poison(dy, (size_t)sh.rows * 4);
                    CK(spx_gemv_q4(at, n_sm, 0));
                    CK(cudaDeviceSynchronize());
                    snprintf(what, sizeof what, "gemv tiled store %lldx%lld out %lld norm %d variant %d", (long long)sh.rows,
                             (long long)sh.cols, (long long)sh.n_out, norm, v);
                    yv[v] = down(dy, (size_t)sh.rows);
                    check_close(what, yv[v].data(), ref.data(), tol.data(), (size_t)sh.rows);
                    /* the forms sum in one order: the same bits */
                    CHECK(v == 0 || memcmp(yv[v].data(), yv[0].data(), yv[0].size() * 4) == 0,
                          "%s: rows differ from variant 0's", what);
                    { /* the outlier indices loaded after the PDL wait instead of before: the same bits */
                        spx_gemv_q4_force_early_oidx(0);
                        poison(dy, (size_t)sh.rows * 4);
                        CK(spx_gemv_q4(at, n_sm, 0));
                        CK(cudaDeviceSynchronize());
                        spx_gemv_q4_force_early_oidx(-1);
                        CHECK(memcmp(down(dy, (size_t)sh.rows).data(), yv[v].data(), yv[v].size() * 4) == 0,
                              "%s: rows differ with the outlier indices loaded late", what);
                    }
                    at.mode = SPX_GEMV_ADD;
                    CK(cudaMemcpy(dy, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice));
                    CK(spx_gemv_q4(at, n_sm, 0));
                    CK(cudaDeviceSynchronize());
                    snprintf(what, sizeof what, "gemv tiled add %lldx%lld norm %d variant %d", (long long)sh.rows,
                             (long long)sh.cols, norm, v);
                    check_close(what, down(dy, (size_t)sh.rows).data(), ref2.data(), tol2.data(), (size_t)sh.rows);
                }
                /* ARGMAX through the tiled path (the default variant, then the
                 * two-group one, whose groups each flush a maximum): the same
                 * index as the host's argmax of its logits */
                for (int av : {-1, 2}) {
                    spx_gemv_q4_force_tiled_variant(av);
                    unsigned long long *tb2 = dev_alloc<unsigned long long>(1);
                    CK(cudaMemset(tb2, 0, 8));
                    at.mode = SPX_GEMV_ARGMAX;
                    at.o[0].bias = NULL;
                    at.best = tb2;
                    CK(spx_gemv_q4(at, n_sm, 0));
                    CK(cudaDeviceSynchronize());
                    std::vector<float> yl = down(dy, (size_t)sh.rows);
                    unsigned long long key = 0;
                    CK(cudaMemcpy(&key, tb2, 8, cudaMemcpyDeviceToHost));
                    int64_t bi = 0;
                    for (int64_t rr = 1; rr < sh.rows; rr++)
                        if (yl[rr] > yl[bi]) bi = rr;
                    CHECK(key && (int64_t)(0xffffffffu - (unsigned)(key & 0xffffffffu)) == bi,
                          "gemv tiled argmax %lldx%lld variant %d: key index %lld, host argmax %lld", (long long)sh.rows,
                          (long long)sh.cols, av, (long long)(0xffffffffu - (unsigned)(key & 0xffffffffu)), (long long)bi);
                }
                spx_gemv_q4_force_tiled_variant(-1);
                at.mode = SPX_GEMV_STORE;
                at.w[1] = m.d;
                at.o[1].y = dy;
                at.n_mats = 2;
                CHECK(spx_gemv_q4(at, n_sm, 0) == cudaErrorInvalidValue, "gemv tiled + row-major launch not refused");
            }

            /* ADD onto random y0 */
            std::vector<float> y0 = rand_vec((size_t)sh.rows, 1.0f);
            CK(cudaMemcpy(dy, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice));
            a.mode = SPX_GEMV_ADD;
            CK(spx_gemv_q4(a, n_sm, 0));
            CK(cudaDeviceSynchronize());
            std::vector<double> ref2(ref), tol2(tol);
            for (size_t i = 0; i < ref2.size(); i++) {
                ref2[i] += y0[i];
                tol2[i] += 2e-7 * fabs(ref2[i]);
            }
            snprintf(what, sizeof what, "gemv add %lldx%lld norm %d", (long long)sh.rows, (long long)sh.cols, norm);
            check_close(what, down(dy, (size_t)sh.rows).data(), ref2.data(), tol2.data(), (size_t)sh.rows);

            /* ARGMAX (no bias, as the LM head) */
            unsigned long long *dbest = dev_alloc<unsigned long long>(1);
            CK(cudaMemset(dbest, 0, 8));
            a.mode = SPX_GEMV_ARGMAX;
            a.o[0].bias = NULL;
            a.best = dbest;
            poison(dy, (size_t)sh.rows * 4);
            CK(spx_gemv_q4(a, n_sm, 0));
            int32_t *dids = dev_alloc<int32_t>(1), *dpos = dev_alloc<int32_t>(1);
            const int32_t pos0 = 13; /* the token ring's slot 13 % 8 */
            CK(cudaMemcpy(dpos, &pos0, 4, cudaMemcpyHostToDevice));
            unsigned long long *ring = NULL, *ring_d = NULL;
            CK(cudaHostAlloc((void **)&ring, SPX_TOKEN_RING * 8, cudaHostAllocMapped));
            memset(ring, 0xff, SPX_TOKEN_RING * 8);
            CK(cudaHostGetDevicePointer((void **)&ring_d, ring, 0));
            CK(spx_argmax_finish(dbest, dids, dpos, 0, false, ring_d));
            CK(cudaDeviceSynchronize());
            std::vector<float> yl = down(dy, (size_t)sh.rows);
            int64_t bi = 0;
            for (int64_t r = 1; r < sh.rows; r++)
                if (yl[r] > yl[bi]) bi = r;
            int32_t gid = -1, gpos = -1;
            unsigned long long bz = 1;
            CK(cudaMemcpy(&gid, dids, 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&gpos, dpos, 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&bz, dbest, 8, cudaMemcpyDeviceToHost));
            CHECK(gid == bi && gpos == pos0 + 1 && bz == 0,
                  "gemv argmax %lldx%lld: device %d, host argmax of its logits %lld, pos %d, key %llu", (long long)sh.rows,
                  (long long)sh.cols, gid, (long long)bi, gpos, bz);
            int ring_ok = ring[pos0 % SPX_TOKEN_RING] == spx_token_ring_entry(pos0, (int32_t)bi);
            for (int i = 0; i < SPX_TOKEN_RING; i++) ring_ok &= i == pos0 % SPX_TOKEN_RING || ring[i] == ~0ull;
            CHECK(ring_ok, "gemv argmax %lldx%lld: token ring slot %d holds %#llx, want %#llx (the others untouched)",
                  (long long)sh.rows, (long long)sh.cols, pos0 % SPX_TOKEN_RING, ring[pos0 % SPX_TOKEN_RING],
                  spx_token_ring_entry(pos0, (int32_t)bi));
            CK(cudaFreeHost(ring));
            free_qmat(m);
            n_cases++;
        }
    }
    /* merged launch: three matrices with their own rows, outliers, outputs, biases */
    {
        int64_t cols = 4096, rows[3] = {4096, 1024, 1000}, nout[3] = {41, 0, 17};
        qmat m[3];
        std::vector<float> x = rand_vec((size_t)cols, 1.0f), gain = rand_vec((size_t)cols, 0.2f);
        for (auto &g : gain) g += 1.0f;
        std::vector<float> xr(x);
        spx_cpu_rmsnorm(xr.data(), x.data(), gain.data(), cols, 1e-6f);
        spx_gemv_args a;
        memset(&a, 0, sizeof a);
        float *dys[3];
        std::vector<float> bias[3];
        for (int i = 0; i < 3; i++) {
            make_qmat(m[i], rows[i], cols, nout[i]);
            bias[i] = rand_vec((size_t)rows[i], 0.1f);
            dys[i] = dev_alloc<float>((size_t)rows[i]);
            poison(dys[i], (size_t)rows[i] * 4);
            a.w[i] = m[i].d;
            a.o[i].y = dys[i];
            a.o[i].bias = i == 1 ? NULL : dev_up(bias[i].data(), bias[i].size());
        }
        a.n_mats = 3;
        a.mode = SPX_GEMV_STORE;
        a.x = dev_up(x.data(), x.size());
        a.gain = dev_up(gain.data(), gain.size());
        a.eps = 1e-6f;
        for (int tl = 0; tl < 2; tl++) { /* row-major, then tiled (tiles of the three numbered in turn) */
            for (int i = 0; i < 3; i++) {
                a.w[i] = tl ? m[i].dt : m[i].d;
                poison(dys[i], (size_t)rows[i] * 4);
            }
            CK(spx_gemv_q4(a, n_sm, 0));
            CK(cudaDeviceSynchronize());
            for (int i = 0; i < 3; i++) {
                std::vector<double> ref, tol;
                gemv_ref(m[i], xr.data(), i == 1 ? NULL : bias[i].data(), ref, tol);
                char what[64];
                snprintf(what, sizeof what, "gemv merged qkv%s, matrix %d", tl ? " tiled" : "", i);
                check_close(what, down(dys[i], (size_t)rows[i]).data(), ref.data(), tol.data(), (size_t)rows[i]);
            }
            n_cases++;
        }
        for (int i = 0; i < 3; i++) free_qmat(m[i]);
    }
    /* SWIGLU: gate and up in one launch (row-major); the tiled pair is a
     * two-matrix STORE (refused as SWIGLU) */
    for (int tc = 0; tc < 4; tc++) {
        const int64_t rows = tc & 1 ? 353 : 14336;
        const bool tiled = tc >= 2;
        int64_t cols = 4096;
        qmat g, u;
        make_qmat(g, rows, cols, 41);
        make_qmat(u, rows, cols, 7);
        std::vector<float> x = rand_vec((size_t)cols, 1.0f), bg = rand_vec((size_t)rows, 0.1f),
                           bu = rand_vec((size_t)rows, 0.1f);
        spx_gemv_args a;
        memset(&a, 0, sizeof a);
        float *dy = dev_alloc<float>((size_t)rows), *dy2 = dev_alloc<float>((size_t)rows);
        poison(dy, (size_t)rows * 4);
        poison(dy2, (size_t)rows * 4);
        a.w[0] = tiled ? g.dt : g.d;
        a.w[1] = tiled ? u.dt : u.d;
        a.o[0].y = dy;
        a.o[0].bias = dev_up(bg.data(), bg.size());
        a.o[1].bias = dev_up(bu.data(), bu.size());
        a.n_mats = 2;
        a.mode = SPX_GEMV_SWIGLU;
        a.x = dev_up(x.data(), x.size());
        if (tiled) {
            CHECK(spx_gemv_q4(a, n_sm, 0) == cudaErrorInvalidValue, "gemv tiled SWIGLU not refused");
            a.mode = SPX_GEMV_STORE;
            a.o[0].silu = 1; /* as the backend: silu(gate), up */
            a.o[1].y = dy2;
        }
        CK(spx_gemv_q4(a, n_sm, 0));
        CK(cudaDeviceSynchronize());
        std::vector<double> rg, tg, ru, tu, ref((size_t)rows), tol((size_t)rows);
        gemv_ref(g, x.data(), bg.data(), rg, tg);
        gemv_ref(u, x.data(), bu.data(), ru, tu);
        if (tiled) {
            for (int64_t r = 0; r < rows; r++) { /* silu(g) moves by at most 1.1 dg */
                rg[r] = rg[r] / (1 + exp(-rg[r]));
                tg[r] = 1.1 * tg[r] + 1e-7 * fabs(rg[r]);
            }
            check_close("gemv gate+up tiled, silu(gate)", down(dy, (size_t)rows).data(), rg.data(), tg.data(), (size_t)rows);
            check_close("gemv gate+up tiled, up", down(dy2, (size_t)rows).data(), ru.data(), tu.data(), (size_t)rows);
            /* pair: silu(gate) * up stored by the launch (two groups per block, in step), bit for bit the
             * product of the two stored apart (the same float operations); also with rmsnorm (gain), both
             * with and without PDL's early start */
            std::vector<float> gn = rand_vec((size_t)cols, 0.3f);
            for (auto &v : gn) v += 1.0f;
            for (int with_gain = 0; with_gain < 2; with_gain++) {
                spx_gemv_args b = a;
                b.gain = with_gain ? dev_up(gn.data(), gn.size()) : NULL;
                b.eps = 1e-5f;
                if (with_gain) {
                    poison(dy, (size_t)rows * 4);
                    CK(spx_gemv_q4(b, n_sm, 0));
                }
                const std::vector<float> sg = down(dy, (size_t)rows), up = down(dy2, (size_t)rows);
                float *dp = dev_alloc<float>((size_t)rows);
                poison(dp, (size_t)rows * 4);
                b.o[0].silu = 0;
                b.o[0].y = dp;
                b.o[1].y = NULL;
                b.pair = 1;
                CK(spx_gemv_q4(b, n_sm, 0, with_gain == 1));
                CK(cudaDeviceSynchronize());
                const std::vector<float> got = down(dp, (size_t)rows);
                int64_t diff = 0;
                for (int64_t r = 0; r < rows; r++) {
                    const float want = sg[(size_t)r] * up[(size_t)r];
                    diff += memcmp(&want, &got[(size_t)r], 4) != 0;
                }
                CHECK(diff == 0, "gemv gate+up paired (rows %lld, gain %d): %lld rows differ from silu(gate) * up",
                      (long long)rows, with_gain, (long long)diff);
                b.o[0].silu = 1;
                CHECK(spx_gemv_q4(b, n_sm, 0) == cudaErrorInvalidValue, "gemv pair with o[0].silu not refused");
                b.o[0].silu = 0;
                b.mode = SPX_GEMV_ADD;
                CHECK(spx_gemv_q4(b, n_sm, 0) == cudaErrorInvalidValue, "gemv pair in ADD mode not refused");
                cudaGetLastError();
            }
        } else {
            for (int64_t r = 0; r < rows; r++) {
                double gg = rg[r], sg = gg / (1 + exp(-gg));
                ref[r] = sg * ru[r];
                /* d(silu(g) u) = silu'(g) u dg + silu(g) du, silu' <= 1.1 */
                tol[r] = 1.1 * fabs(ru[r]) * tg[r] + fabs(sg) * tu[r] + 1e-6 * fabs(ref[r]) + 1e-7;
            }
            check_close("gemv swiglu", down(dy, (size_t)rows).data(), ref.data(), tol.data(), (size_t)rows);
        }
        free_qmat(g);
        free_qmat(u);
        n_cases++;
    }
    /* x2: the down projection's input x * x2 = silu(gate) * up (after a
     * tiled gate/up launch), both layouts, with outliers, against the CPU's
     * silu_mul (whose silu(g) * u has the same float operations) */
    for (int tl = 0; tl < 2; tl++) {
        const int64_t rows = 1000, cols = 2048;
        qmat d;
        make_qmat(d, rows, cols, 30);
        std::vector<float> gv = rand_vec((size_t)cols, 2.0f), uv = rand_vec((size_t)cols, 1.0f), xs(gv);
        spx_cpu_silu_mul(xs.data(), uv.data(), cols);
        for (auto &v : gv) v = v / (1.0f + expf(-v)); /* silu(gate) as the gate's GEMV stores it */
        std::vector<float> bias = rand_vec((size_t)rows, 0.1f);
        spx_gemv_args a;
        memset(&a, 0, sizeof a);
        float *dy = dev_alloc<float>((size_t)rows);
        poison(dy, (size_t)rows * 4);
        a.w[0] = tl ? d.dt : d.d;
        a.o[0].y = dy;
        a.o[0].bias = dev_up(bias.data(), bias.size());
        a.n_mats = 1;
        a.mode = SPX_GEMV_STORE;
        a.x = dev_up(gv.data(), gv.size());
        a.x2 = dev_up(uv.data(), uv.size());
        CK(spx_gemv_q4(a, n_sm, 0));
        CK(cudaDeviceSynchronize());
        std::vector<double> ref, tol;
        gemv_ref(d, xs.data(), bias.data(), ref, tol);
        check_close(tl ? "gemv x2 (silu(gate) * up) tiled" : "gemv x2 (silu(gate) * up)", down(dy, (size_t)rows).data(),
                    ref.data(), tol.data(), (size_t)rows);
        a.x2 = a.x + 1; /* not 16-byte aligned */
        CHECK(spx_gemv_q4(a, n_sm, 0) == cudaErrorInvalidValue, "gemv x2 misaligned not refused");
        free_qmat(d);
        n_cases++;
    }
    if (!getenv("SPECTRA_CUDA_CARVEOUT")) /* one carveout for every kernel (common.cuh) */
        CHECK(spx_gemv_q4_carveout() == 50, "gemv: the tiled kernel's carveout is %d, not 50", spx_gemv_q4_carveout());
    printf("gemv: %d cases\n", n_cases);
}

/* ---- GEMM ----------------------------------------------------------------- */

static void test_gemm(int n_sm) {
    struct { int64_t rows, cols, n_out; } shapes[] = {{100, 352, 5}, {300, 4096, 41}, {1000, 1536, 20}, {129, 64, 0}, {256, 2048, 100},
                                                      {37, 384, 3}};
    /* 2 and 5: every path; 3 .. 16: the few-token kernel (gemm_mtok.cuh) only; 64 and up: the prefill paths */
    int Ms[] = {2, 3, 4, 5, 8, 9, 16, 64, 65, 128};
    int n_cases = 0, n_mtok = 0;
    double worst_rel = 0;
    for (auto &sh : shapes) {
        qmat m;
        make_qmat(m, sh.rows, sh.cols, sh.n_out);
        std::vector<float> deq((size_t)sh.cols);
        std::vector<float> W((size_t)(sh.rows * sh.cols));
        for (int64_t r = 0; r < sh.rows; r++) spx_q_dequant_row_f32(&m.b.q, r, W.data() + r * sh.cols);
        for (int M : Ms) {
          for (int tl = 0; tl < (m.dt.codes ? 2 : 1); tl++) { /* the row-major, then the tiled matrix */
            /* 4, 5: through cuBLAS, rows in chunks of 64; 6 .. 9: spx_gemm_q4_mtok with 1 (6, 7) and 2 (8, 9)
             * 16-row tiles per warp */
            for (int variant = 0; variant < 10; variant++) {
                int accumulate = variant & 1, split = (variant >> 1) == 1, cublas = (variant >> 1) == 2;
                int mtok = variant >= 6 ? 1 + (variant >= 8) : 0;
                if (cublas && !spx_gemm_cublas_ready()) continue;
                if (mtok ? M > SPX_MTOK_MAX_M : (M != 2 && M != 5 && M < 64)) continue;
                std::vector<float> x = rand_vec((size_t)(M * sh.cols), 1.0f), bias = rand_vec((size_t)sh.rows, 0.1f);
                std::vector<uint16_t> xh(x.size());
                for (size_t i = 0; i < x.size(); i++) {
                    xh[i] = spx_f32_to_f16(x[i]);
                    x[i] = spx_f16_to_f32(xh[i]);
                }
                std::vector<float> y0 = rand_vec((size_t)(M * sh.rows), 1.0f);
                float *dy = dev_alloc<float>(y0.size());
                if (accumulate) CK(cudaMemcpy(dy, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice));
                else poison(dy, y0.size() * 4);
                spx_gemm_args a;
                memset(&a, 0, sizeof a);
                a.w = tl ? m.dt : m.d;
                a.x = (const __half *)dev_up(xh.data(), xh.size());
                a.ldx = sh.cols;
                a.y = dy;
                a.ldy = sh.rows;
                a.bias = dev_up(bias.data(), bias.size());
                a.M = M;
                a.accumulate = accumulate;
                if (split) {
                    a.ws_floats = (size_t)16 * M * sh.rows;
                    a.ws = dev_alloc<float>(a.ws_floats);
                    poison(a.ws, a.ws_floats * 4);
                }
                if (cublas) {
                    const size_t w16_elems = (size_t)sh.cols * 64;
                    __half *w16 = dev_alloc<__half>(w16_elems);
                    poison(w16, w16_elems * 2);
                    static void *handle = spx_gemm_cublas_create();
                    CHECK(handle != NULL, "cuBLAS loaded but no handle");
                    CK(spx_gemm_q4_cublas(handle, a, w16, w16_elems, 0));
                } else if (mtok) {
                    CHECK(spx_gemm_q4_mtok_ok(a), "gemm_mtok refused M %d tiled %d", M, tl);
                    spx_gemm_q4_mtok_force_rows(mtok);
                    CK(spx_gemm_q4_mtok(a, n_sm, 0));
                    spx_gemm_q4_mtok_force_rows(0);
                    n_mtok++;
                } else {
                    CK(spx_gemm_q4(a, n_sm, 0));
                }
                CK(cudaDeviceSynchronize());
                std::vector<float> y = down(dy, y0.size());
                std::vector<double> ref(y.size()), tol(y.size());
                for (int t = 0; t < M; t++)
                    for (int64_t r = 0; r < sh.rows; r++) {
                        double s = 0, b = 0;
                        for (int64_t c = 0; c < sh.cols; c++) {
                            double p = (double)W[r * sh.cols + c] * x[t * sh.cols + c];
                            s += p;
                            b += fabs(p);
                        }
                        size_t i = (size_t)t * sh.rows + r;
                        ref[i] = s + bias[r] + (accumulate ? y0[i] : 0.0);
                        tol[i] = GEMM_TOL_REL * b + 1e-5;
                        double rel = fabs(y[i] - ref[i]) / (b + 1e-30);
                        if (rel > worst_rel) worst_rel = rel;
                    }
                char what[128];
                snprintf(what, sizeof what, "gemm %lldx%lld out %lld M %d acc %d split-K %d cublas %d mtok %d tiled %d",
                         (long long)sh.rows, (long long)sh.cols, (long long)sh.n_out, M, accumulate, split, cublas, mtok, tl);
                check_close(what, y.data(), ref.data(), tol.data(), y.size());
                n_cases++;
            }
          }
        }
        free_qmat(m);
    }
    printf("gemm: %d cases (%d through gemm_mtok), worst |err| / sum|w x| = %.3g (tolerance %.3g); cuBLAS path %s\n", n_cases, n_mtok,
           worst_rel, GEMM_TOL_REL, spx_gemm_cublas_ready() ? "tested" : "not available (libcublas not found)");
    const char *want = getenv("SPECTRA_EXPECT_CUBLAS"); /* the GPU script sets it: a missing cuBLAS is then a failure */
    CHECK(!(want && !strcmp(want, "1")) || spx_gemm_cublas_ready(), "SPECTRA_EXPECT_CUBLAS=1 but libcublas was not loaded");
}

/* ---- embedding, norm, rope, silu, argmax ---------------------------------- */

/* The device sampler against engine/sampler.c on the same logits and RNG
 * states: the RNG must advance identically every time, and the drawn id may
 * differ only where expf's last ulp moves a boundary (rare: <= 2 of 64). */
static void test_sampler(void) {
    struct { int64_t V; float T; int K; float P; int ties; } cs[] = {
        {1000, 0.8f, 40, 0.95f, 0},   {1000, 1.3f, 2, 1.0f, 0},     {1000, 1.0f, 999, 1.0f, 0},
        {1000, 0.7f, 64, 0.9f, 1},    {128256, 0.8f, 40, 0.95f, 0}, {128256, 0.5f, 1024, 0.9f, 0},
        {128256, 1.0f, 300, 1.0f, 1}, {5000, 2.0f, 1000, 0.5f, 1},
    };
    int n_cases = 0;
    for (auto &c : cs) {
        std::vector<float> lg = rand_vec((size_t)c.V, 3.0f);
        if (c.ties)
            for (auto &v : lg) v = roundf(v * 2.0f) / 2.0f; /* many equal logits: ties go by id */
        float *dl = dev_up(lg.data(), lg.size());
        spx_sample_dev *dsp = dev_alloc<spx_sample_dev>(1);
        int32_t *dids = dev_alloc<int32_t>(1), *dpos = dev_alloc<int32_t>(1);
        int same = 0, rng_same = 0, pos_ok = 0;
        const int N = 64;
        for (int k = 0; k < N; k++) {
            const uint64_t seed = 0x1234567ull * (uint64_t)(k + 1) + (uint64_t)c.V;
            spx_sample_dev h = {c.T, c.K, c.P, 0, seed};
            CK(cudaMemcpy(dsp, &h, sizeof h, cudaMemcpyHostToDevice));
            CK(cudaMemset(dpos, 0, 4));
            CK(cudaMemset(dids, 0xff, 4));
            CK(spx_sample_topk(dl, c.V, dsp, dids, dpos, 0));
            CK(cudaDeviceSynchronize());
            int32_t gid = -1, gpos = -1;
            spx_sample_dev back;
            CK(cudaMemcpy(&gid, dids, 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&gpos, dpos, 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&back, dsp, sizeof back, cudaMemcpyDeviceToHost));
            spx_sampler_params sp = {c.T, c.K, c.P, 0};
            uint64_t rng = seed;
            const int32_t cid = spx_sample(lg.data(), c.V, &sp, &rng);
            same += gid == cid;
            rng_same += back.rng == rng;
            pos_ok += gpos == 1;
        }
        CHECK(same >= N - 2 && rng_same == N && pos_ok == N,
              "sampler V %lld T %.2f top-k %d top-p %.2f ties %d: %d/%d ids as the CPU's, RNG %d/%d, pos %d/%d",
              (long long)c.V, c.T, c.K, c.P, c.ties, same, N, rng_same, N, pos_ok, N);
        printf("sampler V %lld T %.2f top-k %d top-p %.2f ties %d: %d/%d draws identical to spx_sample\n", (long long)c.V,
               c.T, c.K, c.P, c.ties, same, N);
        n_cases++;
    }
    CHECK(!spx_sample_on_device(0.8f, 0, 1000) && !spx_sample_on_device(0.8f, 1025, 5000) &&
              !spx_sample_on_device(0.0f, 40, 1000) && spx_sample_on_device(0.8f, 40, 1000),
          "spx_sample_on_device limits");
    printf("sampler: %d cases\n", n_cases);
}

static void test_small_ops(int n_sm) {
    /* embedding: bit-exact */
    {
        for (int64_t C : {352, 384}) { /* 384: also tiled */
            qmat m;
            make_qmat(m, 300, C, 9);
            int32_t ids[5] = {0, 299, 17, 17, 150};
            float *dh = dev_alloc<float>(5 * C);
            for (int tl = 0; tl < (m.dt.codes ? 2 : 1); tl++) {
                poison(dh, 5 * C * 4);
                CK(spx_embed_q4(tl ? m.dt : m.d, dev_up(ids, 5), 5, dh, 0));
                CK(cudaDeviceSynchronize());
                std::vector<float> h = down(dh, 5 * C), r(C);
                int bad = 0;
                for (int t = 0; t < 5; t++) {
                    spx_q_dequant_row_f32(&m.b.q, ids[t], r.data());
                    for (int64_t c = 0; c < C; c++) bad += memcmp(&h[t * C + c], &r[c], 4) != 0;
                }
                CHECK(bad == 0, "embed cols %lld tiled %d: %d elements differ from spx_q_dequant_row_f32", (long long)C, tl,
                      bad);
            }
            free_qmat(m);
        }
    }
    /* rmsnorm f32 + f16 */
    {
        int rows = 7;
        int64_t n = 4096;
        std::vector<float> x = rand_vec((size_t)(rows * n), 3.0f), g = rand_vec((size_t)n, 1.0f);
        float *d32 = dev_alloc<float>(x.size());
        __half *d16 = dev_alloc<__half>(x.size());
        poison(d32, x.size() * 4);
        poison(d16, x.size() * 2);
        CK(spx_rmsnorm(dev_up(x.data(), x.size()), dev_up(g.data(), g.size()), 1e-5f, rows, n, d32, d16, 0));
        CK(cudaDeviceSynchronize());
        std::vector<float> y = down(d32, x.size()), ref(x.size());
        std::vector<uint16_t> y16(x.size());
        CK(cudaMemcpy(y16.data(), d16, x.size() * 2, cudaMemcpyDeviceToHost));
        int bad = 0, bad16 = 0;
        for (int r = 0; r < rows; r++) spx_cpu_rmsnorm(ref.data() + r * n, x.data() + r * n, g.data(), n, 1e-5f);
        for (size_t i = 0; i < x.size(); i++) {
            bad += !(fabs(y[i] - ref[i]) <= ELEM_TOL_REL * fabs(ref[i]) + 1e-12);
            float h = spx_f16_to_f32(y16[i]);
            bad16 += !(fabs(h - ref[i]) <= 1e-3 * fabs(ref[i]) + 1e-7);
        }
        CHECK(bad == 0 && bad16 == 0, "rmsnorm: %d float32 and %d fp16 elements out of tolerance", bad, bad16);
    }
    /* q/k norm + rope + KV store */
    for (int qkn = 0; qkn < 2; qkn++) {
        int nt = 3, nh = 8, nkv = 2, hd = qkn ? 48 : 128, nctx = 64, pos0 = 37;
        int qd = nh * hd, kvd = nkv * hd;
        std::vector<float> q = rand_vec((size_t)(nt * qd), 1.0f), k = rand_vec((size_t)(nt * kvd), 1.0f),
                           v = rand_vec((size_t)(nt * kvd), 1.0f), qn = rand_vec((size_t)hd, 0.2f),
                           kn = rand_vec((size_t)hd, 0.2f), inv((size_t)(hd / 2));
        for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(500000.0, 2.0 * i / hd));
        spx_rope_args a;
        memset(&a, 0, sizeof a);
        float *dq = dev_up(q.data(), q.size()), *dk = dev_up(k.data(), k.size());
        __half *kc = dev_alloc<__half>((size_t)(nctx * kvd)), *vc = dev_alloc<__half>((size_t)(nctx * kvd));
        poison(kc, (size_t)(nctx * kvd) * 2);
        poison(vc, (size_t)(nctx * kvd) * 2);
        int32_t p0 = pos0;
        a.q = dq;
        a.k = dk;
        a.v = dev_up(v.data(), v.size());
        a.n_tok = nt;
        a.nh = nh;
        a.nkv = nkv;
        a.hd = hd;
        a.inv_freq = dev_up(inv.data(), inv.size());
        a.q_norm = qkn ? dev_up(qn.data(), qn.size()) : NULL;
        a.k_norm = qkn ? dev_up(kn.data(), kn.size()) : NULL;
        a.eps = 1e-6f;
        a.pos = dev_up(&p0, 1);
        a.kc = kc;
        a.vc = vc;
        CK(spx_rope_store(a, 0));
        CK(cudaDeviceSynchronize());
        std::vector<float> gq = down(dq, q.size()), gk = down(dk, k.size());
        std::vector<uint16_t> gkc((size_t)(nctx * kvd)), gvc((size_t)(nctx * kvd));
        CK(cudaMemcpy(gkc.data(), kc, gkc.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gvc.data(), vc, gvc.size() * 2, cudaMemcpyDeviceToHost));
        int bad = 0, badc = 0, unwritten = 0;
        for (int t = 0; t < nt; t++) {
            float *qt = q.data() + t * qd, *kt = k.data() + t * kvd;
            if (qkn) {
                for (int h = 0; h < nh; h++) spx_cpu_rmsnorm(qt + h * hd, qt + h * hd, qn.data(), hd, 1e-6f);
                for (int h = 0; h < nkv; h++) spx_cpu_rmsnorm(kt + h * hd, kt + h * hd, kn.data(), hd, 1e-6f);
            }
            spx_cpu_rope(qt, nh, hd, pos0 + t, inv.data());
            spx_cpu_rope(kt, nkv, hd, pos0 + t, inv.data());
            for (int i = 0; i < kvd; i++) {
                float kr = spx_f16_to_f32(gkc[(size_t)(pos0 + t) * kvd + i]), vr = spx_f16_to_f32(gvc[(size_t)(pos0 + t) * kvd + i]);
                badc += !(fabs(kr - kt[i]) <= 1e-3 * fabs(kt[i]) + 1e-4) || vr != spx_f16_to_f32(spx_f32_to_f16(v[t * kvd + i]));
            }
        }
        for (int p = 0; p < nctx; p++)
            if (p < pos0 || p >= pos0 + nt)
                for (int i = 0; i < kvd; i++) unwritten += gkc[(size_t)p * kvd + i] != 0xffff;
        /* angles up to 40 rad: cosf/sinf agree to ~1 ulp, the products to a few */
        for (size_t i = 0; i < q.size(); i++) bad += !(fabs(gq[i] - q[i]) <= 1e-5 * (fabs(q[i]) + 1));
        for (size_t i = 0; i < k.size(); i++) bad += !(fabs(gk[i] - k[i]) <= 1e-5 * (fabs(k[i]) + 1));
        CHECK(bad == 0 && badc == 0 && unwritten == 0,
              "rope (qk-norm %d, hd %d): %d q/k values, %d cache values off, %d cache values written outside the tokens", qkn,
              hd, bad, badc, unwritten);
    }
    /* silu * up, to_half */
    {
        int64_t n = 100003;
        std::vector<float> g = rand_vec((size_t)n, 3.0f), u = rand_vec((size_t)n, 1.0f), ref(g);
        spx_cpu_silu_mul(ref.data(), u.data(), n);
        float *d32 = dev_alloc<float>((size_t)n);
        __half *d16 = dev_alloc<__half>((size_t)n);
        poison(d32, (size_t)n * 4);
        CK(spx_silu_mul(dev_up(g.data(), g.size()), dev_up(u.data(), u.size()), n, d32, d16, 0));
        __half *d16b = dev_alloc<__half>((size_t)n);
        CK(spx_to_half(d32, n, d16b, 0));
        CK(cudaDeviceSynchronize());
        std::vector<float> y = down(d32, (size_t)n);
        std::vector<uint16_t> h((size_t)n), hb((size_t)n);
        CK(cudaMemcpy(h.data(), d16, (size_t)n * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hb.data(), d16b, (size_t)n * 2, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            bad += !(fabs(y[i] - ref[i]) <= ELEM_TOL_REL * fabs(ref[i]) + 1e-30);
            bad += h[i] != spx_f32_to_f16(y[i]) || hb[i] != h[i];
        }
        CHECK(bad == 0, "silu_mul / to_half: %d elements off", bad);
    }
    /* argmax kernel */
    for (int64_t n : {1, 1000, 128256}) {
        std::vector<float> x = rand_vec((size_t)n, 5.0f);
        int64_t bi = 0;
        for (int64_t i = 1; i < n; i++)
            if (x[i] > x[bi]) bi = i;
        if (n > 2) x[n - 1] = x[bi]; /* a tie later in the array: the first index wins */
        unsigned long long *db = dev_alloc<unsigned long long>(1);
        int32_t *di = dev_alloc<int32_t>(1), *dp = dev_alloc<int32_t>(1);
        CK(cudaMemset(db, 0, 8));
        CK(cudaMemset(dp, 0, 4));
        CK(spx_argmax(dev_up(x.data(), x.size()), n, db, n_sm, 0));
        CK(spx_argmax_finish(db, di, dp, 0));
        int32_t got = -1;
        CK(cudaMemcpy(&got, di, 4, cudaMemcpyDeviceToHost));
        CHECK(got == bi, "argmax of %lld: got %d, expected %lld", (long long)n, got, (long long)bi);
    }
    printf("small ops: done\n");
}

/* ---- attention -------------------------------------------------------------- */

/* The decode attention's split counters are back at zero after a launch
 * (its last block of each head group resets them for the next). */
static void check_split_counters(const char *what, const int *d_cnt, int n) {
    std::vector<int> cnt((size_t)n);
    CK(cudaMemcpy(cnt.data(), d_cnt, cnt.size() * 4, cudaMemcpyDeviceToHost));
    int nz = 0;
    for (int x : cnt) nz += x != 0;
    CHECK(nz == 0, "%s: %d split counters left non-zero", what, nz);
}

/* One head's attention in double over rows dk, dv (dequantized or fp16 as floats) [.., kvd]
 * (KV head kvh of hd values), keys start..p: out[hd]. */
static void ref_head_attention(const float *qh, const float *dk, const float *dv, int kvd, int kvh, int hd, int start,
                               int p, double scale, double *out) {
    std::vector<double> s((size_t)(p + 1 - start));
    double mx = -1e300, sum = 0;
    for (int i = start; i <= p; i++) {
        double dd = 0;
        for (int j = 0; j < hd; j++) dd += (double)qh[j] * dk[(size_t)i * kvd + kvh * hd + j];
        s[i - start] = dd * scale;
        mx = fmax(mx, s[i - start]);
    }
    for (auto &x : s) sum += (x = exp(x - mx));
    for (int j = 0; j < hd; j++) {
        double o = 0;
        for (int i = start; i <= p; i++) o += s[i - start] * dv[(size_t)i * kvd + kvh * hd + j];
        out[j] = o / sum;
    }
}

/* One attention launch into dout (n floats, poisoned first), back on the
 * host; all_splits: every split of a decode launch runs, not only those
 * the position needs. */
static std::vector<float> attn_run(const spx_attn_args &a, float *dout, size_t n, bool all_splits) {
    if (all_splits) spx_attention_force_adapt(0);
    poison(dout, n * 4);
    CK(spx_attention(a, 0));
    CK(cudaDeviceSynchronize());
    spx_attention_force_adapt(-1);
    return down(dout, n);
}

/* A decode attention with rope_store's work fused (a.k_new set): the raw
 * k and v rows of the token, RoPE's frequencies, the q/k norm gains (qkn).
 * Then q and kn become what rope_store leaves (the CPU's rmsnorm and rope
 * at position pos), the reference's inputs. */
static void fuse_rope_args(spx_attn_args &a, std::vector<float> &q, std::vector<float> &kn, const std::vector<float> &vn,
                           const std::vector<float> &inv, const std::vector<float> &qg, const std::vector<float> &kg,
                           int qkn, int pos) {
    const int hd = a.hd;
    a.k_new = dev_up(kn.data(), kn.size());
    a.v_new = dev_up(vn.data(), vn.size());
    a.inv_freq = dev_up(inv.data(), inv.size());
    a.q_norm = qkn ? dev_up(qg.data(), qg.size()) : NULL;
    a.k_norm = qkn ? dev_up(kg.data(), kg.size()) : NULL;
    a.eps = 1e-6f;
    for (int h = 0; h < a.nh && qkn; h++) spx_cpu_rmsnorm(&q[(size_t)h * hd], &q[(size_t)h * hd], qg.data(), hd, 1e-6f);
    for (int h = 0; h < a.nkv && qkn; h++) spx_cpu_rmsnorm(&kn[(size_t)h * hd], &kn[(size_t)h * hd], kg.data(), hd, 1e-6f);
    spx_cpu_rope(q.data(), a.nh, hd, pos, inv.data());
    spx_cpu_rope(kn.data(), a.nkv, hd, pos, inv.data());
}

/* Cases with n_tok == 1 and hd 32/64/128/256 take the decode kernel
 * (spx_attention_decode_fast); fuse: it also does rope_store's work (q
 * and k_new raw; RMSNorm when qkn, RoPE, row pos0 stored), checked against
 * the CPU's rmsnorm/rope, the stored row and the rows around it. Every
 * case runs twice (the split counters must be back at zero for the
 * second), then once with every split of a decode launch running
 * (spx_attention_force_adapt(0): by default only those position p needs). */
static void test_attention(void) {
    struct { int n_tok, nh, nkv, hd, window, splits, pos0, fuse, qkn; } cs[] = {
        {1, 32, 8, 128, 0, 1, 700, 0, 0},  {1, 32, 8, 128, 0, 33, 700, 0, 0}, {1, 32, 8, 128, 0, 33, 3, 0, 0},
        {1, 4, 2, 48, 0, 5, 90, 0, 0},     {5, 8, 2, 64, 0, 1, 40, 0, 0},     {5, 8, 2, 64, 0, 7, 40, 0, 0},
        {3, 12, 2, 64, 50, 4, 300, 0, 0},  {128, 8, 8, 32, 0, 1, 0, 0, 0},    {2, 16, 1, 256, 0, 3, 130, 0, 0},
        {1, 6, 6, 96, 0, 2, 64, 0, 0},     {1, 32, 8, 128, 0, 6, 700, 1, 0},  {1, 32, 8, 128, 0, 1, 100, 1, 0},
        {1, 32, 8, 128, 0, 49, 8000, 1, 0}, {1, 12, 2, 64, 0, 3, 300, 1, 1},  {1, 12, 2, 64, 40, 2, 300, 1, 0},
        {1, 16, 2, 256, 0, 4, 129, 1, 1},  {1, 4, 4, 32, 0, 2, 33, 1, 0},     {1, 8, 8, 64, 0, 3, 0, 1, 1},
        {1, 32, 8, 128, 0, 4, 700, 0, 0},  {1, 16, 2, 64, 0, 2, 500, 0, 0},
    };
    int n_cases = 0;
    for (auto &c : cs) {
        int qd = c.nh * c.hd, kvd = c.nkv * c.hd, nctx = c.pos0 + c.n_tok + 5, G = c.nh / c.nkv;
        std::vector<float> q = rand_vec((size_t)(c.n_tok * qd), 1.0f), kn = rand_vec((size_t)kvd, 1.0f),
                           vn = rand_vec((size_t)kvd, 1.0f), qg = rand_vec((size_t)c.hd, 0.2f),
                           kg = rand_vec((size_t)c.hd, 0.2f), inv((size_t)(c.hd / 2));
        for (int i = 0; i < c.hd / 2; i++) inv[i] = (float)(1.0 / pow(10000.0, 2.0 * i / c.hd));
        std::vector<uint16_t> kc((size_t)(nctx * kvd)), vc((size_t)(nctx * kvd));
        for (auto &x : kc) x = spx_f32_to_f16(tl_rand_normal(&g_rng));
        for (auto &x : vc) x = spx_f32_to_f16(tl_rand_normal(&g_rng));
        std::vector<uint16_t> kc0(kc), vc0(vc);
        float *dout = dev_alloc<float>(q.size());
        spx_attn_args a;
        memset(&a, 0, sizeof a);
        int32_t p0 = c.pos0;
        a.q = dev_up(q.data(), q.size());
        a.kc = (__half *)dev_up(kc.data(), kc.size());
        a.vc = (__half *)dev_up(vc.data(), vc.size());
        a.out = dout;
        a.part = dev_alloc<float>((size_t)(c.n_tok * c.nh * c.splits * (c.hd + 2)));
        a.n_tok = c.n_tok;
        a.nh = c.nh;
        a.nkv = c.nkv;
        a.hd = c.hd;
        a.window = c.window;
        a.n_splits = c.splits;
        a.pos = dev_up(&p0, 1);
        a.cnt = dev_alloc<int>((size_t)c.nh);
        CK(cudaMemset(a.cnt, 0, (size_t)c.nh * 4));
        if (c.fuse) fuse_rope_args(a, q, kn, vn, inv, qg, kg, c.qkn, c.pos0); /* the reference: row pos0 in the cache */
        std::vector<float> outs[3];
        const size_t part_n = (size_t)(c.n_tok * c.nh * c.splits * (c.hd + 2));
        poison(a.part, part_n * 4);
        for (int run = 0; run < 3; run++) { /* run 2: every split of a decode launch, not just those p needs */
            outs[run] = attn_run(a, dout, q.size(), run == 2);
            if (run == 0 && c.n_tok == 1 && c.splits > 1 && spx_attention_decode_fast(c.hd)) {
                /* one pass of keys needed: one split ran and wrote the output itself, no partials */
                const int len = c.window > 0 && c.window < c.pos0 + 1 ? c.window : c.pos0 + 1;
                const std::vector<float> part = down(a.part, part_n);
                size_t touched = 0;
                for (float v : part) touched += !isnan(v);
                CHECK((len <= SPX_ATTN_DECODE_KEYS) == (touched == 0),
                      "attention splits %d pos %d: %zu partial values written (%d keys)", c.splits, c.pos0, touched, len);
            }
        }
        char what[160];
        snprintf(what, sizeof what, "attention n_tok %d nh %d nkv %d hd %d window %d splits %d pos %d fuse %d qkn %d",
                 c.n_tok, c.nh, c.nkv, c.hd, c.window, c.splits, c.pos0, c.fuse, c.qkn);
        if (c.fuse) { /* row pos0 written (k within the rope test's tolerance, v exact), every other row as it was;
                       * the reference then reads the device's row pos0 (fp16 rounding of a last-ulp difference) */
            std::vector<uint16_t> gk(kc.size()), gv(vc.size());
            CK(cudaMemcpy(gk.data(), a.kc, gk.size() * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(gv.data(), a.vc, gv.size() * 2, cudaMemcpyDeviceToHost));
            int badrow = 0, other = 0;
            for (int r = 0; r < nctx; r++)
                for (int i = 0; i < kvd; i++) {
                    size_t o = (size_t)r * kvd + i;
                    if (r == c.pos0) {
                        float kr = spx_f16_to_f32(gk[o]);
                        badrow += !(fabs(kr - kn[i]) <= 1e-3 * fabs(kn[i]) + 1e-4) || gv[o] != spx_f32_to_f16(vn[i]);
                        kc[o] = gk[o];
                        vc[o] = gv[o];
                    } else
                        other += gk[o] != kc0[o] || gv[o] != vc0[o];
                }
            CHECK(badrow == 0 && other == 0, "%s: row %d: %d values off, %d values changed in other rows", what, c.pos0,
                  badrow, other);
        }
        std::vector<double> ref(q.size()), tol(q.size(), ATTN_TOL_ABS);
        std::vector<float> fk(kc.size()), fv(vc.size());
        for (size_t i = 0; i < kc.size(); i++) {
            fk[i] = spx_f16_to_f32(kc[i]);
            fv[i] = spx_f16_to_f32(vc[i]);
        }
        double scale = 1.0 / sqrt((double)c.hd);
        for (int t = 0; t < c.n_tok; t++)
            for (int h = 0; h < c.nh; h++) {
                int p = c.pos0 + t, kvh = h / G, start = 0;
                if (c.window > 0 && p - c.window + 1 > 0) start = p - c.window + 1;
                ref_head_attention(&q[(size_t)t * qd + (size_t)h * c.hd], fk.data(), fv.data(), kvd, kvh, c.hd, start, p,
                                   scale, &ref[(size_t)t * qd + (size_t)h * c.hd]);
            }
        for (int run = 0; run < 3; run++) {
            char w2[200];
            snprintf(w2, sizeof w2, "%s run %d%s", what, run, run == 2 ? " (all splits)" : "");
            check_close(w2, outs[run].data(), ref.data(), tol.data(), outs[run].size());
        }
        check_split_counters(what, a.cnt, c.nh);
        n_cases++;
    }
    /* rope fused where the decode kernel does not apply: refused */
    {
        spx_attn_args a;
        memset(&a, 0, sizeof a);
        a.n_tok = 2;
        a.nh = a.nkv = 1;
        a.hd = 64;
        a.n_splits = 1;
        a.k_new = a.v_new = (const float *)&a; /* never read */
        CHECK(spx_attention(a, 0) == cudaErrorInvalidValue, "attention: rope fused with 2 tokens accepted");
        cudaGetLastError();
    }
    printf("attention: %d cases\n", n_cases);
}

/* ---- end to end --------------------------------------------------------- */


/* The model on the cpu and on the cuda backend; false (a failed check)
 * if either will not open. */
static bool open_cpu_cuda(const char *path, spx_model **mc, spx_model **mg) {
    spx_model_params pc = {0, "cpu", 0}, pg = {0, "cuda", 0};
    *mc = *mg = NULL;
    if (spx_model_open(path, &pc, mc) != SPX_OK) {
        CHECK(0, "%s: cpu open: %s", path, spx_last_error());
        return false;
    }
    if (spx_model_open(path, &pg, mg) != SPX_OK) {
        CHECK(0, "%s: cuda open: %s", path, spx_last_error());
        spx_model_free(*mc);
        *mc = NULL;
        return false;
    }
    return true;
}

/* Whether a greedy step's token ng is the CPU's nc, or a near-tie: their
 * CPU logits c within tol of each other (relative, floor 1): 1 same, 2
 * near, 0 neither. */
static int same_or_near(int32_t ng, int32_t nc, const float *c, int64_t V, double tol = E2E_PREFILL_TOL) {
    if (ng == nc) return 1;
    return ng >= 0 && ng < V && fabs(c[ng] - c[nc]) <= tol * fmax(1.0, fabs(c[nc])) ? 2 : 0;
}

static void test_model(const char *path) {
    spx_model *mc = NULL, *mg = NULL;
    if (!open_cpu_cuda(path, &mc, &mg)) return;
    int64_t V = spx_model_vocab_size(mc);
    spx_session_params sp = {320, SPX_KV_F16};
    spx_session *sc = NULL, *sg = NULL;
    CHECK(spx_session_new(mc, &sp, &sc) == SPX_OK, "%s: cpu session: %s", path, spx_model_error(mc));
    CHECK(spx_session_new(mg, &sp, &sg) == SPX_OK, "%s: cuda session: %s", path, spx_model_error(mg));
    if (!sc || !sg) goto done;
    {
        const int T = 150;
        std::vector<int32_t> ids(T);
        for (auto &id : ids) id = (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)V);
        std::vector<float> lc((size_t)T * V), lg((size_t)T * V), lg2((size_t)T * V);
        CHECK(spx_session_eval(sc, ids.data(), T, lc.data(), 1) == SPX_OK, "cpu eval: %s", spx_session_error(sc));
        CHECK(spx_session_eval(sg, ids.data(), T, lg.data(), 1) == SPX_OK, "cuda eval: %s", spx_session_error(sg));
        double wp = 0;
        int agree = 0;
        for (int t = 0; t < T; t++) {
            wp = fmax(wp, row_err(lg.data() + (size_t)t * V, lc.data() + (size_t)t * V, V));
            agree += argmax_f(lg.data() + (size_t)t * V, V) == argmax_f(lc.data() + (size_t)t * V, V);
        }
        CHECK(wp <= E2E_PREFILL_TOL, "%s: prefill logits error %.3g > %.3g", path, wp, E2E_PREFILL_TOL);
        /* replay: bit-identical */
        spx_session_reset(sg);
        CHECK(spx_session_eval(sg, ids.data(), T, lg2.data(), 1) == SPX_OK, "cuda eval: %s", spx_session_error(sg));
        CHECK(memcmp(lg.data(), lg2.data(), lg.size() * 4) == 0, "%s: a second prefill gave different logits", path);

        /* eager single-token steps (GEMV path), the CPU's greedy tokens fed to both */
        double wd = 0;
        int32_t id = argmax_f(lc.data() + (size_t)(T - 1) * V, V);
        std::vector<float> c1((size_t)V), g1((size_t)V);
        for (int i = 0; i < 8; i++) {
            CHECK(spx_session_eval(sc, &id, 1, c1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sc));
            CHECK(spx_session_eval(sg, &id, 1, g1.data(), 0) == SPX_OK, "cuda step: %s", spx_session_error(sg));
            wd = fmax(wd, row_err(g1.data(), c1.data(), V));
            id = argmax_f(c1.data(), V);
        }
        CHECK(wd <= E2E_PREFILL_TOL, "%s: decode logits error %.3g > %.3g", path, wd, E2E_PREFILL_TOL);

        /* greedy steps through the captured graph */
        int same = 0, near = 0, n_steps = 24;
        for (int i = 0; i < n_steps; i++) {
            int32_t ng = -1;
            CHECK(spx_session_eval(sc, &id, 1, c1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sc));
            CHECK(spx_session_step_greedy(sg, id, &ng) == SPX_OK, "cuda step_greedy: %s", spx_session_error(sg));
            int32_t nc = argmax_f(c1.data(), V);
            const int sn = same_or_near(ng, nc, c1.data(), V);
            same += sn == 1;
            near += sn == 2;
            id = nc;
        }
        CHECK(same + near == n_steps, "%s: step_greedy chose the CPU's token %d times of %d (%d near-ties)", path, same,
              n_steps, near);
        /* greedy steps fed other tokens than the ones they returned (the device's token and position,
         * which the previous step's argmax left, are rewritten every time) */
        int same_r = 0, near_r = 0;
        for (int i = 0; i < 8; i++) {
            int32_t ng = -1, t1 = (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)V);
            CHECK(spx_session_eval(sc, &t1, 1, c1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sc));
            CHECK(spx_session_step_greedy(sg, t1, &ng) == SPX_OK, "cuda step_greedy: %s", spx_session_error(sg));
            const int sn = same_or_near(ng, argmax_f(c1.data(), V), c1.data(), V);
            same_r += sn == 1;
            near_r += sn == 2;
        }
        CHECK(same_r + near_r == 8, "%s: step_greedy fed other tokens chose the CPU's %d times of 8 (%d near-ties)",
              path, same_r, near_r);
        /* then an eager step, then greedy again: the CPU's token */
        {
            int32_t t1 = (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)V), ng = -1;
            CHECK(spx_session_eval(sc, &t1, 1, c1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sc));
            CHECK(spx_session_eval(sg, &t1, 1, g1.data(), 0) == SPX_OK, "cuda step: %s", spx_session_error(sg));
            const int32_t nc = argmax_f(c1.data(), V);
            CHECK(row_err(g1.data(), c1.data(), V) <= E2E_PREFILL_TOL, "%s: eager step after greedy ones off", path);
            CHECK(spx_session_eval(sc, &nc, 1, c1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sc));
            CHECK(spx_session_step_greedy(sg, nc, &ng) == SPX_OK, "cuda step_greedy: %s", spx_session_error(sg));
            const int32_t nc2 = argmax_f(c1.data(), V);
            CHECK(same_or_near(ng, nc2, c1.data(), V), "%s: greedy step after an eager one chose %d, the CPU %d", path,
                  ng, nc2);
        }
        CHECK(spx_session_pos(sg) == spx_session_pos(sc), "%s: positions differ: cuda %lld cpu %lld", path,
              (long long)spx_session_pos(sg), (long long)spx_session_pos(sc));
        /* a fresh sequence one token at a time: the float32 GEMV path only */
        spx_session_reset(sc);
        spx_session_reset(sg);
        double wg = 0;
        for (int i = 0; i < 12; i++) {
            int32_t t1 = ids[i];
            CHECK(spx_session_eval(sc, &t1, 1, c1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sc));
            CHECK(spx_session_eval(sg, &t1, 1, g1.data(), 0) == SPX_OK, "cuda step: %s", spx_session_error(sg));
            wg = fmax(wg, row_err(g1.data(), c1.data(), V));
        }
        CHECK(wg <= E2E_GEMV_TOL, "%s: token-by-token logits error %.3g > %.3g", path, wg, E2E_GEMV_TOL);
        printf("e2e %s: prefill err %.3g, top-1 agree %d/%d; steps after it %.3g (tol %.3g); token-by-token %.3g (tol "
               "%.3g); greedy graph %d/%d same (+%d near-ties)\n",
               path, wp, agree, T, wd, E2E_PREFILL_TOL, wg, E2E_GEMV_TOL, same, n_steps, near);
    }
done:
    spx_session_free(sc);
    spx_session_free(sg);
    spx_model_free(mc);
    spx_model_free(mg);
}

/* ---- --kv q4: device store + attention against engine/kvcache.c ---------- */

/* Attention over the q4 cache vs a double loop over the CPU-dequantized
 * rows (spx_kv_dequant_row, model coordinates) with the unrotated q. The
 * device scores on codes in the rotated frame, per group s (sum c q~ -
 * z sum q~): terms up to ~15 |q~| s each, a few tens in all, cancel to a
 * score of order 1, so float32 rounding there is ~1e-5 of the score
 * (before the 1/sqrt(hd)); the rotations of q and of the output add
 * log2(256) = 8 roundings of sums of up to 256 terms (~1e-6). Outputs are
 * weighted means of |v| <~ 5 values: 2.5x the fp16 bound. The CPU's own
 * q4 attention (spx_kv_scores etc.) is held to the same bound. */
#define ATTN_Q4_TOL_ABS 5e-5

struct kvq4_dev {
    spx_kvq4_layout lo;
    uint8_t *kb, *vb; /* layer bases */
    spx_kvq4 k, v;
};

static void kvq4_dev_init(kvq4_dev &d, int64_t nctx, int64_t kvd) {
    d.lo = spx_kvq4_layout_of(nctx, kvd);
    d.kb = dev_alloc<uint8_t>(d.lo.layer_bytes);
    d.vb = dev_alloc<uint8_t>(d.lo.layer_bytes);
    poison(d.kb, d.lo.layer_bytes);
    poison(d.vb, d.lo.layer_bytes);
    d.k = spx_kvq4_at(d.kb, 0, nctx, kvd);
    d.v = spx_kvq4_at(d.vb, 0, nctx, kvd);
}

/* A CPU q4 cache of nctx rows (one layer) with rows 0 .. nrows - 1 stored
 * from random K (a few large channels: what the rotation is for) and V
 * (shifted), kept in *K, *V; false (a failed check) if it cannot be made. */
static bool kvq4_cpu_cache(spx_kvcache *kc, int nctx, int kvd, int hd, int nrows, std::vector<float> *K,
                           std::vector<float> *V) {
    spx_err e;
    spx_err_clear(&e);
    if (spx_kv_init(kc, SPX_KV_Q4, 1, nctx, kvd, hd, &e) != SPX_OK) {
        CHECK(0, "kv init: %s", e.msg);
        return false;
    }
    *K = rand_vec((size_t)nrows * kvd, 1.0f);
    *V = rand_vec((size_t)nrows * kvd, 1.0f);
    for (size_t i = 0; i < K->size(); i++) {
        if (i % (size_t)hd == 3 || i % (size_t)hd == 17) (*K)[i] *= 8.0f;
        (*V)[i] = 0.7f * (*V)[i] + 0.2f;
    }
    for (int p = 0; p < nrows; p++) spx_kv_store(kc, 0, p, &(*K)[(size_t)p * kvd], &(*V)[(size_t)p * kvd]);
    return true;
}

/* Attention arguments over d's q4 cache (split counters zeroed, the
 * partials sized for the launch); q already on the device. */
static spx_attn_args kvq4_attn_args(const kvq4_dev &d, const float *dq, float *dout, int n_tok, int nh, int nkv, int hd,
                                    int window, int splits, int32_t pos0, int rot) {
    spx_attn_args a;
    memset(&a, 0, sizeof a);
    a.q = dq;
    a.out = dout;
    a.part = dev_alloc<float>((size_t)n_tok * nh * splits * (hd + 2));
    a.n_tok = n_tok;
    a.nh = nh;
    a.nkv = nkv;
    a.hd = hd;
    a.window = window;
    a.n_splits = splits;
    a.pos = dev_up(&pos0, 1);
    a.kq = d.k;
    a.vq = d.v;
    a.rot = rot;
    a.cnt = dev_alloc<int>((size_t)nh);
    CK(cudaMemset(a.cnt, 0, (size_t)nh * 4));
    return a;
}

/* Bytes of one q4 row (the host cache pads its rows to 4: kvcache.c). */
static size_t kvq4_rb(const spx_kvq4_layout &lo) { return (size_t)(lo.code_row + 2 * lo.scale_row + lo.zero_row); }

/* The device planes as CPU rows [nctx][stride] (codes, scales, zeros; the
 * padding past kvq4_rb is 0xff and never compared). */
static std::vector<uint8_t> kvq4_rows(const uint8_t *base, const spx_kvq4_layout &lo, int64_t nctx, size_t stride) {
    std::vector<uint8_t> all(lo.layer_bytes), rows;
    CK(cudaMemcpy(all.data(), base, lo.layer_bytes, cudaMemcpyDeviceToHost));
    size_t cr = (size_t)lo.code_row, sr = (size_t)lo.scale_row * 2, zr = (size_t)lo.zero_row, rb = stride;
    rows.assign((size_t)nctx * rb, 0xff);
    for (int64_t p = 0; p < nctx; p++) {
        memcpy(&rows[p * rb], &all[lo.codes_off + p * cr], cr);
        memcpy(&rows[p * rb + cr], &all[lo.scales_off + p * sr], sr);
        memcpy(&rows[p * rb + cr + sr], &all[lo.zeros_off + p * zr], zr);
    }
    return rows;
}

/* A cache's rows p in [p0, p1) vs the device's: bytes that differ; rows
 * outside [w0, w1) of the device must still be the 0xff poison. */
static void kvq4_cmp_rows(const spx_kvcache *c, int value, const std::vector<uint8_t> &dev, size_t rb, int64_t p0,
                          int64_t p1, int64_t w0, int64_t w1, int64_t nctx, int *bad, int *stray) {
    const uint8_t *cpu = value ? c->v : c->k;
    for (int64_t p = 0; p < nctx; p++)
        for (size_t b = 0; b < rb; b++) {
            uint8_t g = dev[p * c->row_bytes + b];
            if (p >= p0 && p < p1) *bad += g != cpu[p * c->row_bytes + b];
            if (p < w0 || p >= w1) *stray += g != 0xff;
        }
}

/* Values of K row p of two caches' rows rc (CPU) and rg (device, same
 * layout) more than one code step apart (the larger scale of the group);
 * *codes_diff += codes that differ. Float rounding of the device's
 * cosf/sinf/norm moves a value across a rounding boundary now and then,
 * never by more than a step. */
static int kvq4_k_row_off(const spx_kvcache &kc, const uint8_t *rc, const uint8_t *rg, int *codes_diff) {
    const int64_t kvd = kc.kvd;
    std::vector<float> wc((size_t)kvd), wg((size_t)kvd);
    spx_q_dequantize_row(rc, (const uint16_t *)(rc + kc.codes_b), rc + kc.scales_b, kvd, 4, 32, wc.data());
    spx_q_dequantize_row(rg, (const uint16_t *)(rg + kc.codes_b), rg + kc.scales_b, kvd, 4, 32, wg.data());
    int bad = 0;
    for (int64_t i = 0; i < kvd; i++) {
        const int64_t g = i / 32;
        uint16_t sc, sg;
        memcpy(&sc, rc + kc.codes_b + 2 * g, 2);
        memcpy(&sg, rg + kc.codes_b + 2 * g, 2);
        const double step = fmax(spx_f16_to_f32(sc), spx_f16_to_f32(sg));
        bad += !(fabs((double)wg[i] - wc[i]) <= 1.02 * step + 1e-7);
        *codes_diff += spx_q_code_get(rc, i, 4, 32) != spx_q_code_get(rg, i, 4, 32);
    }
    return bad;
}

static void test_kvq4(void) {
    struct { int n_tok, nh, nkv, hd, window, splits, pos0; } cs[] = {
        {1, 32, 8, 128, 0, 1, 700}, {1, 32, 8, 128, 0, 33, 700}, {1, 32, 8, 128, 0, 33, 3}, {1, 16, 2, 64, 0, 7, 1000},
        {5, 8, 2, 64, 0, 1, 40},    {5, 8, 2, 64, 0, 7, 40},     {3, 12, 2, 64, 50, 4, 300}, {128, 8, 8, 32, 0, 1, 0},
        {2, 16, 1, 256, 0, 3, 130}, {1, 6, 6, 96, 0, 2, 64},     {1, 6, 3, 96, 0, 1, 33},   {1, 4, 1, 32, 0, 1, 10},
        {4, 10, 5, 32, 20, 3, 77},  {1, 64, 8, 128, 0, 16, 4095}, {1, 40, 40, 256, 0, 2, 20}, {17, 8, 4, 160, 0, 2, 45},
    };
    int n_cases = 0;
    for (auto &c : cs) {
        const int qd = c.nh * c.hd, kvd = c.nkv * c.hd, npos = c.pos0 + c.n_tok, nctx = npos + 5, G = c.nh / c.nkv;
        const int rot = spx_kvq4_rot(c.hd, kvd);
        spx_kvcache kc;
        std::vector<float> K, V;
        if (!kvq4_cpu_cache(&kc, nctx, kvd, c.hd, npos, &K, &V)) continue;
        /* the device store: spx_rope_store of k heads only, with zero
         * frequencies (RoPE is then exactly the identity: cos 0 = 1, sin 0 = 0) */
        kvq4_dev d;
        kvq4_dev_init(d, nctx, kvd);
        std::vector<float> zf((size_t)c.hd / 2, 0.0f);
        int32_t zero = 0, p0 = c.pos0;
        spx_rope_args ra;
        memset(&ra, 0, sizeof ra);
        ra.k = dev_up(K.data(), K.size());
        ra.v = dev_up(V.data(), V.size());
        ra.n_tok = npos;
        ra.nh = 0;
        ra.nkv = c.nkv;
        ra.hd = c.hd;
        ra.inv_freq = dev_up(zf.data(), zf.size());
        ra.eps = 1e-6f;
        ra.pos = dev_up(&zero, 1);
        ra.kq = d.k;
        ra.vq = d.v;
        ra.rot = rot;
        CK(spx_rope_store(ra, 0));
        CK(cudaDeviceSynchronize());
        int badk = 0, badv = 0, stray = 0;
        kvq4_cmp_rows(&kc, 0, kvq4_rows(d.kb, d.lo, nctx, kc.row_bytes), kvq4_rb(d.lo), 0, npos, 0, npos, nctx, &badk,
                      &stray);
        kvq4_cmp_rows(&kc, 1, kvq4_rows(d.vb, d.lo, nctx, kc.row_bytes), kvq4_rb(d.lo), 0, npos, 0, npos, nctx, &badv,
                      &stray);

        /* attention */
        std::vector<float> q = rand_vec((size_t)c.n_tok * qd, 1.0f);
        float *dout = dev_alloc<float>(q.size());
        spx_attn_args a = kvq4_attn_args(d, dev_up(q.data(), q.size()), dout, c.n_tok, c.nh, c.nkv, c.hd, c.window,
                                         c.splits, p0, rot);
        std::vector<float> out = attn_run(a, dout, q.size(), false);
        { /* again: the same bits (the decode kernel's split counters were reset) */
            std::vector<float> again = attn_run(a, dout, q.size(), false);
            CHECK(memcmp(again.data(), out.data(), out.size() * 4) == 0,
                  "q4 attention n_tok %d nh %d hd %d splits %d: a second run differs", c.n_tok, c.nh, c.hd, c.splits);
        }
        std::vector<float> dk((size_t)npos * kvd), dv((size_t)npos * kvd);
        for (int p = 0; p < npos; p++) {
            spx_kv_dequant_row(&kc, 0, p, 0, &dk[(size_t)p * kvd]);
            spx_kv_dequant_row(&kc, 0, p, 1, &dv[(size_t)p * kvd]);
        }
        std::vector<double> ref(q.size()), tol(q.size(), ATTN_Q4_TOL_ABS);
        std::vector<float> cpu(q.size()), sc((size_t)npos);
        const double scale = 1.0 / sqrt((double)c.hd);
        for (int t = 0; t < c.n_tok; t++)
            for (int h = 0; h < c.nh; h++) {
                int p = c.pos0 + t, kvh = h / G, start = 0;
                if (c.window > 0 && p - c.window + 1 > 0) start = p - c.window + 1;
                const float *qh = &q[(size_t)t * qd + (size_t)h * c.hd];
                ref_head_attention(qh, dk.data(), dv.data(), kvd, kvh, c.hd, start, p, scale,
                                   &ref[(size_t)t * qd + (size_t)h * c.hd]);
                /* the CPU backend's own q4 attention (engine/forward.c) */
                spx_kv_scores(&kc, NULL, 0, kvh, qh, start, p + 1, (float)scale, sc.data());
                spx_cpu_softmax(sc.data(), p + 1 - start);
                spx_kv_weighted_v(&kc, NULL, 0, kvh, sc.data(), start, p + 1, &cpu[(size_t)t * qd + (size_t)h * c.hd]);
            }
        char what[160];
        snprintf(what, sizeof what, "q4 attention n_tok %d nh %d nkv %d hd %d (rot %d) window %d splits %d pos %d",
                 c.n_tok, c.nh, c.nkv, c.hd, rot, c.window, c.splits, c.pos0);
        int ok = check_close(what, out.data(), ref.data(), tol.data(), out.size());
        { /* every split of a decode launch running, not just those the position needs */
            char w2[200];
            snprintf(w2, sizeof w2, "%s (all splits)", what);
            ok &= check_close(w2, attn_run(a, dout, q.size(), true).data(), ref.data(), tol.data(), out.size());
            check_split_counters(w2, a.cnt, c.nh);
        }
        double dcpu = 0;
        for (size_t i = 0; i < out.size(); i++) dcpu = fmax(dcpu, fabs((double)cpu[i] - ref[i]));
        CHECK(dcpu <= ATTN_Q4_TOL_ABS, "%s: the CPU's q4 attention is %.3g from the reference", what, dcpu);
        CHECK(badk == 0 && badv == 0 && stray == 0,
              "q4 store nkv %d hd %d (rot %d), %d rows: %d K and %d V bytes differ from spx_kv_store, %d bytes written "
              "outside the rows",
              c.nkv, c.hd, rot, npos, badk, badv, stray);
        if (ok && n_cases < 3) printf("%s: cpu q4 attention %.2g from the reference\n", what, dcpu);
        spx_kv_free(&kc);
        n_cases++;
    }

    /* the store after real q/k-norm + RoPE at positions pos0.., as in the
     * forward pass: V rows byte-identical; K rows within one code step,
     * since the device's cosf/sinf/norm differ from the CPU's by ulps */
    struct { int nh, nkv, hd, qkn; } rs[] = {{8, 2, 64, 0}, {32, 8, 128, 1}, {6, 3, 96, 1}, {4, 1, 32, 0}};
    for (auto &r : rs) {
        const int nt = 3, nctx = 64, pos0 = 37, qd = r.nh * r.hd, kvd = r.nkv * r.hd;
        const int rot = spx_kvq4_rot(r.hd, kvd);
        std::vector<float> q = rand_vec((size_t)nt * qd, 1.0f), k = rand_vec((size_t)nt * kvd, 1.0f),
                           v = rand_vec((size_t)nt * kvd, 1.0f), qn = rand_vec((size_t)r.hd, 0.2f),
                           kn = rand_vec((size_t)r.hd, 0.2f), inv((size_t)r.hd / 2);
        for (int i = 0; i < r.hd / 2; i++) inv[i] = (float)(1.0 / pow(500000.0, 2.0 * i / r.hd));
        for (auto &g : qn) g += 1.0f;
        for (auto &g : kn) g += 1.0f;
        kvq4_dev d;
        kvq4_dev_init(d, nctx, kvd);
        int32_t p0 = pos0;
        spx_rope_args a;
        memset(&a, 0, sizeof a);
        float *dq = dev_up(q.data(), q.size()), *dk = dev_up(k.data(), k.size());
        a.q = dq;
        a.k = dk;
        a.v = dev_up(v.data(), v.size());
        a.n_tok = nt;
        a.nh = r.nh;
        a.nkv = r.nkv;
        a.hd = r.hd;
        a.inv_freq = dev_up(inv.data(), inv.size());
        a.q_norm = r.qkn ? dev_up(qn.data(), qn.size()) : NULL;
        a.k_norm = r.qkn ? dev_up(kn.data(), kn.size()) : NULL;
        a.eps = 1e-6f;
        a.pos = dev_up(&p0, 1);
        a.kq = d.k;
        a.vq = d.v;
        a.rot = rot;
        CK(spx_rope_store(a, 0));
        CK(cudaDeviceSynchronize());
        std::vector<float> gq = down(dq, q.size());
        spx_kvcache kc;
        spx_err e;
        spx_err_clear(&e);
        if (spx_kv_init(&kc, SPX_KV_Q4, 1, nctx, kvd, r.hd, &e) != SPX_OK) {
            CHECK(0, "kv init: %s", e.msg);
            continue;
        }
        int badq = 0;
        for (int t = 0; t < nt; t++) {
            float *qt = &q[(size_t)t * qd], *kt = &k[(size_t)t * kvd];
            if (r.qkn) {
                for (int h = 0; h < r.nh; h++) spx_cpu_rmsnorm(qt + h * r.hd, qt + h * r.hd, qn.data(), r.hd, 1e-6f);
                for (int h = 0; h < r.nkv; h++) spx_cpu_rmsnorm(kt + h * r.hd, kt + h * r.hd, kn.data(), r.hd, 1e-6f);
            }
            spx_cpu_rope(qt, r.nh, r.hd, pos0 + t, inv.data());
            spx_cpu_rope(kt, r.nkv, r.hd, pos0 + t, inv.data());
            spx_kv_store(&kc, 0, pos0 + t, kt, &v[(size_t)t * kvd]);
        }
        for (size_t i = 0; i < q.size(); i++) badq += !(fabs(gq[i] - q[i]) <= 1e-5 * (fabs(q[i]) + 1));
        int badv = 0, stray = 0, badk = 0, codes_diff = 0;
        std::vector<uint8_t> rk = kvq4_rows(d.kb, d.lo, nctx, kc.row_bytes);
        kvq4_cmp_rows(&kc, 1, kvq4_rows(d.vb, d.lo, nctx, kc.row_bytes), kvq4_rb(d.lo), pos0, pos0 + nt, pos0, pos0 + nt,
                      nctx, &badv, &stray);
        kvq4_cmp_rows(&kc, 0, rk, kvq4_rb(d.lo), pos0, pos0, pos0, pos0 + nt, nctx, &badk, &stray); /* stray bytes only */
        /* K: dequantized in the rotated frame, per element within one step */
        for (int t = 0; t < nt; t++)
            badk += kvq4_k_row_off(kc, kc.k + (size_t)(pos0 + t) * kc.row_bytes, &rk[(size_t)(pos0 + t) * kc.row_bytes],
                                   &codes_diff);
        CHECK(badq == 0 && badv == 0 && badk == 0 && stray == 0,
              "q4 rope store (qk-norm %d, nkv %d, hd %d): %d q values off, %d V bytes differ, %d K values more than a "
              "step apart, %d bytes written outside the tokens",
              r.qkn, r.nkv, r.hd, badq, badv, badk, stray);
        printf("q4 rope store (qk-norm %d, nkv %d, hd %d): K codes differing from the CPU's: %d of %d\n", r.qkn, r.nkv,
               r.hd, codes_diff, nt * kvd);
        spx_kv_free(&kc);
        n_cases++;
    }
    printf("q4 KV store + attention: %d cases\n", n_cases);
}

/* The 4-bit decode kernel with rope_store's work fused (a.k_new set):
 * raw q, k_new and v_new at position pos0, rows before it uploaded from
 * spx_kv_store's cache. Checked: row pos0 in the cache (V bytes equal to
 * spx_kv_store's of the CPU's normed, roped k and v; K within one code
 * step, as the q4 rope store test above), every other row as it was, and
 * the output against the double reference over the device's own cache
 * (dequantized on the CPU) with the CPU's normed, roped q. Twice (the same
 * bits), then with every split of the launch running. */
static void test_kvq4_fused(void) {
    struct { int nh, nkv, hd, window, splits, pos0, qkn; } cs[] = {
        {32, 8, 128, 0, 1, 700, 0},  /* one split: p in a later pass of its warps */
        {32, 8, 128, 0, 8, 700, 1},  /* 6 splits run, merged */
        {32, 8, 128, 0, 33, 3, 1},   {16, 2, 64, 0, 7, 1000, 1}, {16, 2, 256, 0, 4, 129, 1},
        {4, 1, 32, 0, 1, 10, 0},     {8, 8, 64, 0, 3, 0, 1},     /* p = 0: the first key */
        {12, 2, 64, 40, 2, 300, 0},  /* sliding window */
        {16, 2, 128, 0, 2, 200, 0},  /* 8 q heads a KV head: two blocks, one stores */
        {64, 8, 128, 0, 16, 4095, 0},
    };
    int n_cases = 0;
    for (auto &c : cs) {
        const int qd = c.nh * c.hd, kvd = c.nkv * c.hd, nctx = c.pos0 + 6, G = c.nh / c.nkv;
        const int rot = spx_kvq4_rot(c.hd, kvd);
        spx_kvcache kc;
        std::vector<float> K, V;
        if (!kvq4_cpu_cache(&kc, nctx, kvd, c.hd, c.pos0, &K, &V)) continue;
        /* the device cache: rows < pos0 as the CPU stored them, the rest poison */
        kvq4_dev d;
        kvq4_dev_init(d, nctx, kvd);
        {
            const uint8_t *src[2] = {kc.k, kc.v};
            uint8_t *dst[2] = {d.kb, d.vb};
            const size_t cr = (size_t)d.lo.code_row, sr = (size_t)d.lo.scale_row * 2, zr = (size_t)d.lo.zero_row;
            for (int kv = 0; kv < 2; kv++) {
                std::vector<uint8_t> planes(d.lo.layer_bytes, 0xff);
                for (int p = 0; p < c.pos0; p++) {
                    const uint8_t *r = src[kv] + (size_t)p * kc.row_bytes;
                    memcpy(&planes[d.lo.codes_off + p * cr], r, cr);
                    memcpy(&planes[d.lo.scales_off + p * sr], r + cr, sr);
                    memcpy(&planes[d.lo.zeros_off + p * zr], r + cr + sr, zr);
                }
                CK(cudaMemcpy(dst[kv], planes.data(), planes.size(), cudaMemcpyHostToDevice));
            }
        }
        std::vector<float> q = rand_vec((size_t)qd, 1.0f), kn = rand_vec((size_t)kvd, 1.0f),
                           vn = rand_vec((size_t)kvd, 1.0f), qg = rand_vec((size_t)c.hd, 0.2f),
                           kg = rand_vec((size_t)c.hd, 0.2f), inv((size_t)c.hd / 2);
        for (int i = 0; i < c.hd / 2; i++) inv[i] = (float)(1.0 / pow(500000.0, 2.0 * i / c.hd));
        for (auto &g : qg) g += 1.0f;
        for (auto &g : kg) g += 1.0f;
        float *dout = dev_alloc<float>(q.size());
        spx_attn_args a = kvq4_attn_args(d, dev_up(q.data(), q.size()), dout, 1, c.nh, c.nkv, c.hd, c.window, c.splits,
                                         c.pos0, rot);
        fuse_rope_args(a, q, kn, vn, inv, qg, kg, c.qkn, c.pos0); /* (the device gets the raw rows first) */
        std::vector<float> outs[3];
        for (int run = 0; run < 3; run++) outs[run] = attn_run(a, dout, q.size(), run == 2); /* run 2: every split */
        spx_kv_store(&kc, 0, c.pos0, kn.data(), vn.data()); /* the CPU's row pos0 (q, kn as rope_store leaves them) */
        const std::vector<uint8_t> rk = kvq4_rows(d.kb, d.lo, nctx, kc.row_bytes), rv = kvq4_rows(d.vb, d.lo, nctx, kc.row_bytes);
        int badk = 0, badv = 0, stray = 0, koff = 0, codes_diff = 0;
        kvq4_cmp_rows(&kc, 1, rv, kvq4_rb(d.lo), 0, c.pos0 + 1, 0, c.pos0 + 1, nctx, &badv, &stray);
        kvq4_cmp_rows(&kc, 0, rk, kvq4_rb(d.lo), 0, c.pos0, 0, c.pos0 + 1, nctx, &badk, &stray);
        koff = kvq4_k_row_off(kc, kc.k + (size_t)c.pos0 * kc.row_bytes, &rk[(size_t)c.pos0 * kc.row_bytes], &codes_diff);
        char what[200];
        snprintf(what, sizeof what, "q4 attention, rope fused: nh %d nkv %d hd %d (rot %d) window %d splits %d pos %d qkn %d",
                 c.nh, c.nkv, c.hd, rot, c.window, c.splits, c.pos0, c.qkn);
        CHECK(badk == 0 && badv == 0 && stray == 0 && koff == 0,
              "%s: %d K and %d V bytes of rows before or at pos differ from spx_kv_store, %d K values of row pos more "
              "than a step apart, %d bytes written past pos",
              what, badk, badv, koff, stray);
        /* the reference over the device's cache */
        memcpy(kc.k + (size_t)c.pos0 * kc.row_bytes, &rk[(size_t)c.pos0 * kc.row_bytes], kvq4_rb(d.lo));
        std::vector<float> dk((size_t)(c.pos0 + 1) * kvd), dv((size_t)(c.pos0 + 1) * kvd);
        for (int p = 0; p <= c.pos0; p++) {
            spx_kv_dequant_row(&kc, 0, p, 0, &dk[(size_t)p * kvd]);
            spx_kv_dequant_row(&kc, 0, p, 1, &dv[(size_t)p * kvd]);
        }
        std::vector<double> ref(q.size()), tol(q.size(), ATTN_Q4_TOL_ABS);
        const double scale = 1.0 / sqrt((double)c.hd);
        const int p = c.pos0, start = c.window > 0 && p - c.window + 1 > 0 ? p - c.window + 1 : 0;
        for (int h = 0; h < c.nh; h++)
            ref_head_attention(&q[(size_t)h * c.hd], dk.data(), dv.data(), kvd, h / G, c.hd, start, p, scale,
                               &ref[(size_t)h * c.hd]);
        check_close(what, outs[0].data(), ref.data(), tol.data(), q.size());
        CHECK(memcmp(outs[1].data(), outs[0].data(), q.size() * 4) == 0, "%s: a second run differs", what);
        char w2[240];
        snprintf(w2, sizeof w2, "%s (all splits)", what);
        check_close(w2, outs[2].data(), ref.data(), tol.data(), q.size());
        check_split_counters(what, a.cnt, c.nh);
        if (n_cases < 2) printf("%s: K codes of row pos differing from the CPU's: %d of %d\n", what, codes_diff, kvd);
        spx_kv_free(&kc);
        n_cases++;
    }
    printf("q4 attention with rope fused: %d cases\n", n_cases);
}

/* End to end with --kv q4: cuda vs cpu (scalar kernels), both q4; the
 * bounds and their reasons: cutest.cuh (err_acc). */
static void test_model_q4(const char *path) {
    spx_model *mc = NULL, *mg = NULL;
    if (!open_cpu_cuda(path, &mc, &mg)) return;
    int64_t V = spx_model_vocab_size(mc);
    spx_session_params sq = {320, SPX_KV_Q4}, sh = {320, SPX_KV_F16};
    spx_session *sc = NULL, *sf = NULL, *sg = NULL;
    if (spx_session_new(mc, &sq, &sc) != SPX_OK) {
        /* the CPU refuses this shape (head_dim not a multiple of 32): so must cuda */
        char msg[256];
        snprintf(msg, sizeof msg, "%s", spx_model_error(mc));
        CHECK(spx_session_new(mg, &sq, &sg) != SPX_OK, "%s: cuda accepted --kv q4, cpu refused it (%s)", path, msg);
        printf("e2e q4 %s: skipped, refused by both backends (%s)\n", path, msg);
        goto done;
    }
    CHECK(spx_session_new(mc, &sh, &sf) == SPX_OK, "%s: cpu f16 session: %s", path, spx_model_error(mc));
    CHECK(spx_session_new(mg, &sq, &sg) == SPX_OK, "%s: cuda q4 session: %s", path, spx_model_error(mg));
    if (!sf || !sg) goto done;
    {
        const int T = 150;
        std::vector<int32_t> ids(T);
        for (auto &id : ids) id = (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)V);
        std::vector<float> lc((size_t)T * V), lf((size_t)T * V), lg((size_t)T * V), lg2((size_t)T * V);
        CHECK(spx_session_eval(sc, ids.data(), T, lc.data(), 1) == SPX_OK, "cpu eval: %s", spx_session_error(sc));
        CHECK(spx_session_eval(sf, ids.data(), T, lf.data(), 1) == SPX_OK, "cpu eval: %s", spx_session_error(sf));
        CHECK(spx_session_eval(sg, ids.data(), T, lg.data(), 1) == SPX_OK, "cuda eval: %s", spx_session_error(sg));
        err_acc ep;
        int agree = 0;
        for (int t = 0; t < T; t++) {
            size_t o = (size_t)t * V;
            ep.add(&lg[o], &lc[o], &lf[o], V);
            agree += argmax_f(&lg[o], V) == argmax_f(&lc[o], V);
        }
        CHECK(ep.ok(), "%s: q4 prefill: mean |d| %.3g x q4's own, max-rel %.3g (%.3g x q4's own %.3g); bounds %.2g, %.2g",
              path, ep.mean_ratio(), ep.mx, ep.max_ratio(), ep.mx_ref, E2E_Q4_MEAN_RATIO, E2E_Q4_MAX_RATIO);
        spx_session_reset(sg); /* replay: bit-identical (the zero-nibble atomics commute) */
        CHECK(spx_session_eval(sg, ids.data(), T, lg2.data(), 1) == SPX_OK, "cuda eval: %s", spx_session_error(sg));
        CHECK(memcmp(lg.data(), lg2.data(), lg.size() * 4) == 0, "%s: a second q4 prefill gave different logits", path);

        /* eager steps, then greedy graph steps, the CPU q4's tokens fed to all three */
        err_acc ed;
        int32_t id = argmax_f(&lc[(size_t)(T - 1) * V], V);
        std::vector<float> c1((size_t)V), f1((size_t)V), g1((size_t)V);
        for (int i = 0; i < 8; i++) {
            CHECK(spx_session_eval(sc, &id, 1, c1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sc));
            CHECK(spx_session_eval(sf, &id, 1, f1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sf));
            CHECK(spx_session_eval(sg, &id, 1, g1.data(), 0) == SPX_OK, "cuda step: %s", spx_session_error(sg));
            ed.add(g1.data(), c1.data(), f1.data(), V);
            id = argmax_f(c1.data(), V);
        }
        CHECK(ed.ok(), "%s: q4 decode steps: mean |d| %.3g x q4's own, max-rel %.3g x; bounds %.2g, %.2g", path,
              ed.mean_ratio(), ed.max_ratio(), E2E_Q4_MEAN_RATIO, E2E_Q4_MAX_RATIO);
        int same = 0, near = 0, n_steps = 24;
        double tie = 0; /* a near-tie: the CPU's logits of the two tokens closer than q4's own error allows */
        for (int i = 0; i < n_steps; i++) {
            int32_t ng = -1;
            CHECK(spx_session_eval(sc, &id, 1, c1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sc));
            CHECK(spx_session_eval(sf, &id, 1, f1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sf));
            CHECK(spx_session_step_greedy(sg, id, &ng) == SPX_OK, "cuda step_greedy: %s", spx_session_error(sg));
            int32_t nc = argmax_f(c1.data(), V);
            tie = fmax(tie, 2.0 * E2E_Q4_MAX_RATIO * row_err(f1.data(), c1.data(), V));
            const int sn = same_or_near(ng, nc, c1.data(), V, tie);
            same += sn == 1;
            near += sn == 2;
            id = nc;
        }
        CHECK(same + near == n_steps && same * 2 >= n_steps,
              "%s: q4 step_greedy chose the CPU's token %d times of %d (%d near-ties)", path, same, n_steps, near);
        CHECK(spx_session_pos(sg) == spx_session_pos(sc), "%s: positions differ: cuda %lld cpu %lld", path,
              (long long)spx_session_pos(sg), (long long)spx_session_pos(sc));
        /* a fresh sequence one token at a time: the GEMV path */
        spx_session_reset(sc);
        spx_session_reset(sf);
        spx_session_reset(sg);
        err_acc et;
        for (int i = 0; i < 12; i++) {
            int32_t t1 = ids[i];
            CHECK(spx_session_eval(sc, &t1, 1, c1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sc));
            CHECK(spx_session_eval(sf, &t1, 1, f1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sf));
            CHECK(spx_session_eval(sg, &t1, 1, g1.data(), 0) == SPX_OK, "cuda step: %s", spx_session_error(sg));
            et.add(g1.data(), c1.data(), f1.data(), V);
        }
        CHECK(et.ok(), "%s: q4 token-by-token: mean |d| %.3g x q4's own, max-rel %.3g x; bounds %.2g, %.2g", path,
              et.mean_ratio(), et.max_ratio(), E2E_Q4_MEAN_RATIO, E2E_Q4_MAX_RATIO);
        printf("e2e q4 %s: cuda q4 vs cpu q4 as a fraction of q4's own error (cpu q4 vs cpu f16), mean |d| / max-rel: "
               "prefill %.3g / %.3g (max-rel %.3g, q4's %.3g, top-1 agree %d/%d); steps after it %.3g / %.3g; "
               "token-by-token %.3g / %.3g (max-rel %.3g); greedy graph %d/%d same (+%d near-ties); bounds %.2g / %.2g\n",
               path, ep.mean_ratio(), ep.max_ratio(), ep.mx, ep.mx_ref, agree, T, ed.mean_ratio(), ed.max_ratio(),
               et.mean_ratio(), et.max_ratio(), et.mx, same, n_steps, near, E2E_Q4_MEAN_RATIO, E2E_Q4_MAX_RATIO);
    }
done:
    spx_session_free(sc);
    spx_session_free(sf);
    spx_session_free(sg);
    spx_model_free(mc);
    spx_model_free(mg);
}

/* ---- ping-pong layer offload: the same kernels, so the same bits -------- */

/* path on the cuda backend twice: every layer resident, and ping-pong with
 * n_res layers resident (the others stream from pinned host memory through
 * the two device slots). Same kernels on the same data, so everything must
 * be bit-identical: a 150-token prefill with all logits (two GEMM chunks),
 * eager single-token steps (GEMV path), greedy steps through the captured
 * graph (the copy stream forked and joined inside the capture), eager
 * steps after the graph, and a second prefill after a reset. Then the
 * offload measurement runs and must give sane numbers. */
/* The model on the cuda backend (pingpong: its layers streamed) and two
 * fp16-KV sessions of n_ctx tokens on it; false (a failed check) if any
 * will not open (what did is left in the outputs for the caller to free). */
static bool open_two_sessions(const char *path, int pingpong, int64_t n_ctx, spx_model **m, spx_session **s1,
                              spx_session **s2) {
    spx_model_params pp = {0, "cuda", 0};
    pp.pingpong = pingpong;
    spx_session_params sp = {n_ctx, SPX_KV_F16};
    *s1 = *s2 = NULL;
    if (spx_model_open(path, &pp, m) != SPX_OK) {
        CHECK(0, "%s: cuda open: %s", path, spx_last_error());
        *m = NULL;
        return false;
    }
    const bool ok = spx_session_new(*m, &sp, s1) == SPX_OK && spx_session_new(*m, &sp, s2) == SPX_OK;
    CHECK(ok, "%s: sessions: %s", path, spx_model_error(*m));
    return ok;
}

/* spx_session_step_sample on the cuda backend: the device sampler in the
 * captured graph (top-k 40), the host path (top-k off) and the greedy
 * path (top-k 1, which must equal step_greedy). Each draw takes one
 * splitmix64 step, so after n draws the state is seed + n * 0x9e37...15
 * whatever was drawn. */
static void test_model_sample(const char *path) {
    spx_model *m = NULL;
    spx_session *s1 = NULL, *s2 = NULL;
    if (open_two_sessions(path, 0, 128, &m, &s1, &s2)) {
        const int64_t V = m->cfg.vocab_size;
        const int32_t prompt[4] = {1, 2, 3, 4};
        const spx_sampler_params cfgs[2] = {{0.8f, 40, 0.95f, 0}, {0.8f, 0, 0.9f, 0}};
        for (int ci = 0; ci < 2; ci++) {
            spx_session_reset(s1);
            CHECK(spx_session_eval(s1, prompt, 4, NULL, 0) == SPX_OK, "eval: %s", spx_session_error(s1));
            const uint64_t seed = 0xfeedull + (uint64_t)ci;
            uint64_t rng = seed;
            int32_t id = 5, bad = 0;
            const int n = 20;
            for (int i = 0; i < n; i++) {
                CHECK(spx_session_step_sample(s1, id, &cfgs[ci], &rng, &id) == SPX_OK, "step_sample: %s",
                      spx_session_error(s1));
                bad += id < 0 || id >= V;
            }
            CHECK(bad == 0 && rng == seed + (uint64_t)n * 0x9e3779b97f4a7c15ull,
                  "%s: step_sample top-k %d: %d ids out of range, RNG %llx (expected %llx)", path, cfgs[ci].top_k, bad,
                  (unsigned long long)rng, (unsigned long long)(seed + (uint64_t)n * 0x9e3779b97f4a7c15ull));
        }
        /* top-k 1 is greedy */
        spx_session_reset(s1);
        spx_session_reset(s2);
        CHECK(spx_session_eval(s1, prompt, 4, NULL, 0) == SPX_OK && spx_session_eval(s2, prompt, 4, NULL, 0) == SPX_OK,
              "eval");
        const spx_sampler_params g1 = {0.8f, 1, 1.0f, 0};
        uint64_t rng = 7;
        int32_t a = 5, b = 5, diff = 0;
        for (int i = 0; i < 12; i++) {
            CHECK(spx_session_step_sample(s1, a, &g1, &rng, &a) == SPX_OK, "step_sample: %s", spx_session_error(s1));
            CHECK(spx_session_step_greedy(s2, b, &b) == SPX_OK, "step_greedy: %s", spx_session_error(s2));
            diff += a != b;
        }
        CHECK(diff == 0 && rng == 7, "%s: step_sample with top-k 1: %d of 12 ids differ from step_greedy, RNG %llu", path,
              diff, (unsigned long long)rng);
        printf("step_sample %s: device sampler, host path and greedy path checked\n", path);
    }
    spx_session_free(s1);
    spx_session_free(s2);
    spx_model_free(m);
}

/* Greedy steps queued ahead (spx_session_step_greedy_ahead) give exactly
 * the tokens of steps that are not, also where the caller does not follow
 * on: the step queued ahead is then superseded by another token, an eval,
 * a sampled step or a reset, and the context's last position queues none.
 * Two sessions of one model get the same calls, session a with ahead = 0
 * (its steps read the token ring after each step), session b with ahead =
 * 1 (its next step runs while the host reads the token); the device's
 * kernels are deterministic, so every token and logit must be identical.
 * pingpong: the model streams its layers (the step queued ahead then also
 * streams). */
static void test_model_ahead(const char *path, int pingpong) {
    spx_model *m = NULL;
    spx_session *sa = NULL, *sb = NULL;
    const int64_t n_ctx = 40;
    if (open_two_sessions(path, pingpong, n_ctx, &m, &sa, &sb)) {
        const int64_t V = m->cfg.vocab_size;
        int n_tok = 0, n_diff = 0, first_diff = -1;
        int32_t ta = 0, tb = 0; /* each session's last token */
        /* one greedy step on both; b queues the next one when ahead */
        auto step = [&](int32_t in_a, int32_t in_b, int ahead) {
            int32_t na = -1, nb = -1;
            CHECK(spx_session_step_greedy_ahead(sa, in_a, &na, 0) == SPX_OK, "%s: step a: %s", path,
                  spx_session_error(sa));
            CHECK(spx_session_step_greedy_ahead(sb, in_b, &nb, ahead) == SPX_OK, "%s: step b: %s", path,
                  spx_session_error(sb));
            if (na != nb && first_diff < 0) first_diff = n_tok;
            n_diff += na != nb;
            n_tok++;
            ta = na;
            tb = nb;
        };
        auto chain = [&](int n, int ahead_last) {
            for (int i = 0; i < n; i++) step(ta, tb, i + 1 < n || ahead_last);
        };
        auto eval_both = [&](const int32_t *ids, int n) {
            std::vector<float> la((size_t)V), lb((size_t)V);
            CHECK(spx_session_eval(sa, ids, (size_t)n, la.data(), 0) == SPX_OK, "%s: eval a: %s", path, spx_session_error(sa));
            CHECK(spx_session_eval(sb, ids, (size_t)n, lb.data(), 0) == SPX_OK, "%s: eval b: %s", path, spx_session_error(sb));
            CHECK(memcmp(la.data(), lb.data(), la.size() * 4) == 0, "%s: eval logits after a step queued ahead differ",
                  path);
            ta = tb = argmax_f(la.data(), V);
        };
        int32_t prompt[5];
        for (auto &id : prompt) id = (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)V);
        eval_both(prompt, 5);
        chain(8, 1); /* b's step 9 queued, then fed what it returned */
        const int32_t other = (int32_t)((ta + 1 + tl_rand_u64(&g_rng) % (uint64_t)(V - 1)) % V);
        step(other, other, 1); /* another token than the queued step's input */
        chain(3, 1);
        eval_both(&ta, 1); /* an eval over a queued step */
        chain(3, 1);
        {
            const spx_sampler_params smp = {0.8f, 40, 0.95f, 0};
            uint64_t ra = 99, rb = 99;
            int32_t na = -1, nb = -1;
            CHECK(spx_session_step_sample(sa, ta, &smp, &ra, &na) == SPX_OK &&
                      spx_session_step_sample(sb, tb, &smp, &rb, &nb) == SPX_OK,
                  "%s: sampled step: %s / %s", path, spx_session_error(sa), spx_session_error(sb));
            CHECK(na == nb && ra == rb, "%s: sampled step over a queued step: %d vs %d", path, na, nb);
            ta = na;
            tb = nb;
        }
        chain(2, 1);
        { /* sampled steps: the same draws and RNG states */
            const spx_sampler_params sm1 = {0.9f, 20, 0.9f, 0}, sm2 = {0.7f, 50, 1.0f, 0};
            uint64_t ra = 5, rb = 5;
            int n_sd = 0;
            auto sstep = [&](const spx_sampler_params *q, int ahead) {
                int32_t na = -1, nb = -1;
                CHECK(spx_session_step_sample_ahead(sa, ta, q, &ra, &na, 0) == SPX_OK, "%s: sampled step a: %s", path,
                      spx_session_error(sa));
                CHECK(spx_session_step_sample_ahead(sb, tb, q, &rb, &nb, ahead) == SPX_OK, "%s: sampled step b: %s",
                      path, spx_session_error(sb));
                n_sd += na != nb || ra != rb;
                ta = na;
                tb = nb;
            };
            for (int i = 0; i < 5; i++) sstep(&sm1, 1); /* each queued and taken */
            sstep(&sm2, 1);                              /* other parameters than the queued draw's */
            ra ^= 1;
            rb ^= 1;
            sstep(&sm2, 1); /* another RNG state */
            step(ta, tb, 1); /* a greedy step over a queued draw */
            sstep(&sm1, 1);  /* a draw over a queued greedy step */
            sstep(&sm1, 0);
            CHECK(n_sd == 0, "%s%s: %d of 9 draws or RNG states differ with draws queued ahead", path,
                  pingpong ? " (ping-pong)" : "", n_sd);
        }
        CHECK(spx_session_pos(sa) == spx_session_pos(sb), "%s: positions %lld vs %lld", path,
              (long long)spx_session_pos(sa), (long long)spx_session_pos(sb));
        spx_session_reset(sa); /* a reset over a queued step */
        spx_session_reset(sb);
        eval_both(prompt, 5);
        chain((int)(n_ctx - 5), 1); /* to the context's end, ahead asked for every time */
        CHECK(spx_session_pos(sb) == n_ctx, "%s: position %lld at the end, want %lld", path,
              (long long)spx_session_pos(sb), (long long)n_ctx);
        int32_t nb = -1;
        CHECK(spx_session_step_greedy_ahead(sb, tb, &nb, 1) == SPX_ERR_RANGE, "%s: a step past the context end was taken",
              path);
        CHECK(n_diff == 0, "%s%s: %d of %d greedy tokens differ with steps queued ahead (first at %d)", path,
              pingpong ? " (ping-pong)" : "", n_diff, n_tok, first_diff);
        printf("steps queued ahead %s%s: %d tokens as without\n", path, pingpong ? " (ping-pong)" : "", n_tok);
    }
    spx_session_free(sa);
    spx_session_free(sb);
    spx_model_free(m);
}

static void test_model_pingpong(const char *path, int64_t n_res) {
    unsetenv("SPECTRA_CUDA_RESIDENT_LAYERS");
    spx_tuning_reload();
    spx_model *mr = NULL, *mp = NULL;
    spx_model_params pr = {0, "cuda", 0}, pq = {0, "cuda", 0};
    pq.pingpong = 1;
    pq.n_layers_resident = n_res;
    spx_session *sr = NULL, *sq = NULL;
    spx_session_params sp = {320, SPX_KV_F16};
    spx_offload_stats os;
    spx_err oe;
    spx_err_clear(&oe);
    if (spx_model_open(path, &pr, &mr) != SPX_OK || spx_model_open(path, &pq, &mp) != SPX_OK) {
        CHECK(0, "%s: cuda open (ping-pong, %lld resident): %s", path, (long long)n_res, spx_last_error());
        goto done;
    }
    CHECK(spx_session_new(mr, &sp, &sr) == SPX_OK, "%s: session: %s", path, spx_model_error(mr));
    CHECK(spx_session_new(mp, &sp, &sq) == SPX_OK, "%s: ping-pong session: %s", path, spx_model_error(mp));
    if (!sr || !sq) goto done;
    {
        const int64_t n_layers = mp->cfg.n_layers, k = n_res < n_layers ? n_res : n_layers;
        CHECK(spx_session_offload_stats(sq, 0, &os, &oe) == SPX_OK, "offload stats: %s", oe.msg);
        CHECK(os.n_layers_resident == k && os.pingpong == (k < n_layers) && (os.stream_bytes_per_token > 0) == (k < n_layers),
              "%s: ping-pong with %lld resident: stats say %lld resident, pingpong %d, %llu bytes streamed", path,
              (long long)n_res, (long long)os.n_layers_resident, (int)os.pingpong,
              (unsigned long long)os.stream_bytes_per_token);
        CHECK(spx_session_offload_stats(sr, 0, &os, &oe) == SPX_OK && !os.pingpong && os.n_layers_resident == n_layers,
              "%s: the resident model reports ping-pong", path);
        const int64_t V = spx_model_vocab_size(mr);
        const int T = 150;
        std::vector<int32_t> ids(T);
        for (auto &id : ids) id = (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)V);
        std::vector<float> lr((size_t)T * V), lq((size_t)T * V);
        int diff = 0;
        auto ck = [&diff](bool ok) {
            diff += !ok;
            return ok;
        };
        CHECK(spx_session_eval(sr, ids.data(), T, lr.data(), 1) == SPX_OK, "eval: %s", spx_session_error(sr));
        CHECK(spx_session_eval(sq, ids.data(), T, lq.data(), 1) == SPX_OK, "ping-pong eval: %s", spx_session_error(sq));
        CHECK(ck(memcmp(lr.data(), lq.data(), lr.size() * 4) == 0), "%s (%lld resident): prefill logits differ", path,
                      (long long)n_res);
        int32_t id = argmax_f(lr.data() + (size_t)(T - 1) * V, V);
        std::vector<float> r1((size_t)V), q1((size_t)V);
        for (int i = 0; i < 6; i++) { /* eager GEMV path */
            CHECK(spx_session_eval(sr, &id, 1, r1.data(), 0) == SPX_OK, "step: %s", spx_session_error(sr));
            CHECK(spx_session_eval(sq, &id, 1, q1.data(), 0) == SPX_OK, "ping-pong step: %s", spx_session_error(sq));
            CHECK(ck(memcmp(r1.data(), q1.data(), r1.size() * 4) == 0), "%s (%lld resident): step %d logits differ",
                          path, (long long)n_res, i);
            id = argmax_f(r1.data(), V);
        }
        int32_t ir = id, iq = id;
        for (int i = 0; i < 16; i++) { /* the captured graph */
            CHECK(spx_session_step_greedy(sr, ir, &ir) == SPX_OK, "step_greedy: %s", spx_session_error(sr));
            CHECK(spx_session_step_greedy(sq, iq, &iq) == SPX_OK, "ping-pong step_greedy: %s", spx_session_error(sq));
            CHECK(ck(ir == iq), "%s (%lld resident): greedy step %d: %d vs %d", path, (long long)n_res, i, ir, iq);
            iq = ir;
        }
        CHECK(spx_session_eval(sr, &ir, 1, r1.data(), 0) == SPX_OK, "step: %s", spx_session_error(sr));
        CHECK(spx_session_eval(sq, &ir, 1, q1.data(), 0) == SPX_OK, "ping-pong step: %s", spx_session_error(sq));
        CHECK(ck(memcmp(r1.data(), q1.data(), r1.size() * 4) == 0), "%s (%lld resident): logits after the graph differ",
                      path, (long long)n_res);
        spx_session_reset(sr);
        spx_session_reset(sq);
        CHECK(spx_session_eval(sr, ids.data(), 40, lr.data(), 1) == SPX_OK, "eval: %s", spx_session_error(sr));
        CHECK(spx_session_eval(sq, ids.data(), 40, lq.data(), 1) == SPX_OK, "ping-pong eval: %s", spx_session_error(sq));
        CHECK(ck(memcmp(lr.data(), lq.data(), (size_t)40 * V * 4) == 0), "%s (%lld resident): second prefill differs",
                      path, (long long)n_res);
        /* the measurement (copies alone, compute alone, both) */
        CHECK(spx_session_offload_stats(sq, 8, &os, &oe) == SPX_OK, "offload measurement: %s", oe.msg);
        if (k < n_layers)
            CHECK(os.measured && os.n_steps == 8 && os.t_copy_s > 0 && os.t_step_s > 0 &&
                      (os.t_compute_s > 0) == (os.uniform != 0) && os.h2d_gbps > 0 && os.hidden_share >= 0 &&
                      os.hidden_share <= 1 && (os.uniform || os.hidden_share == 0) &&
                      os.uniform == (strstr(path, "nemotronh") == NULL), /* its streamed layers are M * M - */
                  "%s: offload measurement: measured %d, %d steps, copy %.3g s, step %.3g s, compute %.3g s, %.3g GB/s, "
                  "hidden %.3g",
                  path, (int)os.measured, (int)os.n_steps, os.t_copy_s, os.t_step_s, os.t_compute_s, os.h2d_gbps,
                  os.hidden_share);
        CHECK(spx_session_pos(sq) == 0, "%s: the measurement left position %lld", path, (long long)spx_session_pos(sq));
        printf("ping-pong %s: %lld of %lld layers resident, %.2f MB streamed per token: %s; per step copies %.3f ms "
               "(%.1f GB/s), compute %.3f ms, both %.3f ms, hidden %.0f%%\n",
               path, (long long)k, (long long)n_layers, (double)os.stream_bytes_per_token / 1e6,
               diff ? "DIFFERENT" : "bit-identical to resident", os.t_copy_s * 1e3, os.h2d_gbps, os.t_compute_s * 1e3,
               os.t_step_s * 1e3, 100 * os.hidden_share);
    }
done:
    spx_session_free(sr);
    spx_session_free(sq);
    spx_model_free(mr);
    spx_model_free(mp);
}

int main(int argc, char **argv) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("test_cuda: no CUDA device; skipped\n");
        return 0;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
    CK(spx_gemv_q4_setup(SPX_GEMV_MAX_COLS));
    CK(spx_attention_setup());
    setenv("SPECTRA_KERNELS", "scalar", 1); /* the CPU side of the end-to-end checks: the scalar reference */
    spx_tuning_reload();
    int only_e2e = argc > 1 && !strcmp(argv[1], "--e2e-only");
    if (!only_e2e) {
        test_small_ops(prop.multiProcessorCount);
        test_sampler();
        test_attention();
        test_kvq4();
        test_kvq4_fused();
        test_gemv(prop.multiProcessorCount);
        test_gemm(prop.multiProcessorCount);
        dev_free_all();
    }
    for (int i = 1 + only_e2e; i < argc; i++) test_model(argv[i]);
    /* the decode GEMVs as blocks of two warp groups (spx_gemv_args.groups,
     * which the backend sets only for models with hidden >= ~4096): forced
     * here for every tiled launch of the first fixture's decode graph */
    if (argc > 1 + only_e2e) {
        printf("(tiled GEMVs forced to two warp groups per block:)\n");
        spx_gemv_q4_force_tiled_variant(2);
        test_model(argv[1 + only_e2e]);
        spx_gemv_q4_force_tiled_variant(-1);
        /* gate/up as one paired launch storing silu(gate) * up (spx_gemv_args.pair; the backend's choice
         * with the two-group form, i.e. for large models only): forced at the model's open */
        printf("(gate/up paired, silu(gate) * up stored by their launch:)\n");
        setenv("SPECTRA_GEMV_PAIR", "1", 1);
        spx_tuning_reload();
        for (int i = 1 + only_e2e; i < argc; i++) test_model(argv[i]);
        unsetenv("SPECTRA_GEMV_PAIR");
        spx_tuning_reload();
    }
    for (int i = 1 + only_e2e; i < argc; i++) test_model_q4(argv[i]);
    for (int i = 1 + only_e2e; i < argc; i++) test_model_sample(argv[i]);
    for (int i = 1 + only_e2e; i < argc; i++) {
        test_model_ahead(argv[i], 0);
        test_model_ahead(argv[i], 1);
    }
    for (int i = 1 + only_e2e; i < argc; i++) {
        test_model_pingpong(argv[i], 0); /* every layer streams */
        test_model_pingpong(argv[i], 1); /* layer 0 resident, the rest stream */
    }
    return tl_finish("test_cuda");
}
