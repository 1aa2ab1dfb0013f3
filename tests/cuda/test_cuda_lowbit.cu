/* test_cuda_lowbit.cu: the CUDA backend's 2- and 3-bit matrices
 * (cuda/lowbit.cuh) against the CPU's scalar reference (quant/g32.c).
 *
 *   test_cuda_lowbit
 *
 * Layout: every group of random matrices, tiled for the device by
 * spx_cu_tile_lowbit and read back through spx_dq_group (what the GEMM,
 * the embedding and the dequantization read), must give the codes,
 * scales and zero points of spx_q_unpack_group on the .trdc's row-major
 * packing, exactly. GEMV: every mode (STORE with and without rmsnorm,
 * ADD, ARGMAX, three matrices in one launch, x * x2 input, the paired
 * gate/up launch) in each of the tiled kernel's three forms, outputs
 * poisoned with NaN first, against spx_q_dot_row within test_cuda.cu's
 * bound (GEMV_TOL_REL of sum_c s (q + z) |x|; the same arithmetic as 4
 * bits after the unpacking). GEMM (prefill): the tensor-core kernel on
 * the same matrices against a double loop over the dequantized weights.
 * End to end (whole models at 2 and 3 bits against the CPU) is
 * test_cuda's, given .trdc files of those widths (bench/gpu/run.sh).
 * Exits 0 with a note when no CUDA device is present. */
#include "cuda/gemm_q4.cuh"
#include "cuda/gemv_q4.cuh"
#include "cuda/lowbit.cuh"

#include "cuda/cutest.cuh"

#include <math.h>
#include <string.h>
#include <vector>

extern "C" {
#include "core/half.h"
#include "cpu/ops.h"
#include "quant/g32.h"
#include "testlib.h"
}

#define GEMV_TOL_REL 3e-5 /* test_cuda.cu's, derived there */
#define GEMM_TOL_REL 1.5e-3

static uint64_t g_rng = 0x10b175eedULL;

static std::vector<float> rand_vec(size_t n, float scale) {
    std::vector<float> v(n);
    for (auto &x : v) x = scale * tl_rand_normal(&g_rng);
    return v;
}
static std::vector<float> down(const float *d, size_t n) {
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}
static void poison(void *d, size_t bytes) { CK(cudaMemset(d, 0xff, bytes)); }

struct lbmat {
    spx_qbuf b;
    spx_dqmat d;             /* tiled on the device */
    std::vector<float> wabs; /* s (q + z) (+ |outlier|) per weight: the GEMV's bound */
};

static void make_lb(lbmat &m, int bits, int64_t rows, int64_t cols, int64_t n_out) {
    std::vector<int32_t> idx;
    for (int64_t c = 0; c < cols && (int64_t)idx.size() < n_out; c += cols / (n_out + 1) + 1) idx.push_back((int32_t)c);
    n_out = (int64_t)idx.size();
    spx_err e;
    spx_err_clear(&e);
    if (spx_qbuf_init(&m.b, rows, cols, bits, 32, n_out ? idx.data() : NULL, n_out, &e) != SPX_OK) {
        fprintf(stderr, "FAIL qbuf: %s\n", e.msg);
        exit(1);
    }
    std::vector<float> w((size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) w[c] = 0.05f * tl_rand_normal(&g_rng) + (c % 5 == 0 ? 0.03f : 0.0f);
        for (int64_t j = 0; j < n_out; j++) w[idx[j]] = 0.8f * tl_rand_normal(&g_rng);
        spx_qbuf_set_row(&m.b, r, w.data(), SPX_Q_MSE, NULL);
    }
    spx_qtensor t;
    void *mem = NULL;
    if (spx_cu_tile_lowbit(&m.b.q, &t, &mem, &e) != SPX_OK) {
        fprintf(stderr, "FAIL tile: %s\n", e.msg);
        exit(1);
    }
    spx_dqmat &d = m.d;
    memset(&d, 0, sizeof d);
    d.rows = rows, d.cols = cols, d.n_groups = (int)(cols / 32), d.zrow = (d.n_groups + 1) / 2;
    d.n_out = (int)n_out, d.tiled = 1, d.bits = bits;
    d.codes = dev_up((const uint8_t *)t.codes, (size_t)spx_q_codes_bytes(rows, cols, bits, SPX_Q_TILED));
    d.scales = (const __half *)dev_up(t.scales, (size_t)spx_q_scales_bytes(rows, cols, 32, SPX_Q_TILED) / 2);
    d.zeros = dev_up(t.zeros, (size_t)spx_q_zeros_bytes(rows, cols, 32, SPX_Q_TILED));
    if (n_out) {
        d.oidx = dev_up(m.b.q.outlier_idx, (size_t)n_out);
        d.oval = (const __half *)dev_up(m.b.q.outlier_val, (size_t)(rows * n_out));
    }
    free(mem);
    m.wabs.assign((size_t)(rows * cols), 0.0f);
    uint8_t q[32];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t g = 0; g < cols / 32; g++) {
            spx_q_unpack_group(spx_q_row_codes(&m.b.q, r), g, bits, 32, q);
            const float s = spx_f16_to_f32(spx_q_group_scale(&m.b.q, r, g));
            const int z = spx_q_group_zero(&m.b.q, r, g);
            for (int k = 0; k < 32; k++) m.wabs[r * cols + 32 * g + k] = s * (float)(q[k] + z);
        }
        for (int64_t j = 0; j < n_out; j++)
            m.wabs[r * cols + idx[j]] += fabsf(spx_f16_to_f32(m.b.q.outlier_val[r * n_out + j]));
    }
}

/* ---- the layout, through spx_dq_group ---------------------------------------- */

__global__ void read_groups(const spx_dqmat w, uint4 *codes, float *scales, int *zeros) {
    const int64_t n = w.rows * w.n_groups;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint4 c;
        float s;
        int z;
        spx_dq_group(w, i / w.n_groups, (int)(i % w.n_groups), c, s, z);
        codes[i] = c, scales[i] = s, zeros[i] = z;
    }
}

static void test_layout(int bits, int64_t rows, int64_t cols) {
    lbmat m;
    make_lb(m, bits, rows, cols, 0);
    const int64_t ng = cols / 32, n = rows * ng;
    uint4 *dc = dev_alloc<uint4>((size_t)n);
    float *ds = dev_alloc<float>((size_t)n);
    int *dz = dev_alloc<int>((size_t)n);
    read_groups<<<64, 256>>>(m.d, dc, ds, dz);
    CK(cudaDeviceSynchronize());
    std::vector<uint4> c((size_t)n);
    std::vector<float> s((size_t)n);
    std::vector<int> z((size_t)n);
    CK(cudaMemcpy(c.data(), dc, (size_t)n * 16, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(s.data(), ds, (size_t)n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(z.data(), dz, (size_t)n * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    uint8_t q[32];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < ng; g++) {
            spx_q_unpack_group(spx_q_row_codes(&m.b.q, r), g, bits, 32, q);
            uint8_t want[16];
            for (int k = 0; k < 16; k++) want[k] = (uint8_t)(q[k] | q[k + 16] << 4);
            const int64_t i = r * ng + g;
            const bool ok = !memcmp(want, &c[i], 16) && s[i] == spx_f16_to_f32(spx_q_group_scale(&m.b.q, r, g)) &&
                            z[i] == spx_q_group_zero(&m.b.q, r, g);
            if (!ok && bad++ < 3)
                fprintf(stderr, "  bits %d [%lld x %lld] row %lld group %lld differs\n", bits, (long long)rows,
                        (long long)cols, (long long)r, (long long)g);
        }
    CHECK(bad == 0, "layout bits %d [%lld x %lld]: %d of %lld groups read back wrong", bits, (long long)rows,
          (long long)cols, bad, (long long)n);
    spx_qbuf_free(&m.b);
}

/* ---- GEMV -------------------------------------------------------------------- */

/* y = W^ x' + bias in double, and its bound; x' the launch's effective input. */
static void ref_gemv(const lbmat &m, const float *x, const float *bias, std::vector<double> &y, std::vector<double> &tol) {
    const int64_t rows = m.b.q.rows, cols = m.b.q.cols;
    y.assign((size_t)rows, 0), tol.assign((size_t)rows, 0);
    for (int64_t r = 0; r < rows; r++) {
        y[r] = (double)spx_q_dot_row(&m.b.q, r, x) + (bias ? bias[r] : 0);
        double b = 0;
        for (int64_t c = 0; c < cols; c++) b += (double)m.wabs[r * cols + c] * fabs(x[c]);
        tol[r] = GEMV_TOL_REL * b + 1e-6;
    }
}

static int check(const char *what, const std::vector<float> &got, const std::vector<double> &ref,
                 const std::vector<double> &tol) {
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const double d = fabs((double)got[i] - ref[i]);
        if (!(d <= tol[i])) bad++;
        worst = fmax(worst, isnan(got[i]) ? INFINITY : d / tol[i]);
    }
    CHECK(bad == 0, "%s: %d of %zu outside tolerance (worst %.2f x tol)", what, bad, got.size(), worst);
    return bad == 0;
}

static float silu(float g) { return g / (1.0f + expf(-g)); }

static void test_gemv(int bits, int n_sm) {
    struct { int64_t rows, cols, n_out; } shapes[] = {{64, 128, 0}, {100, 384, 5}, {333, 4096, 41}, {1024, 14336, 143},
                                                      {48, 2176, 7}, {40, 1024, 100}};
    int n_cases = 0;
    for (auto &sh : shapes) {
        lbmat m[3];
        make_lb(m[0], bits, sh.rows, sh.cols, sh.n_out);
        make_lb(m[1], bits, sh.rows, sh.cols, sh.n_out / 2); /* same rows: the pair's up */
        make_lb(m[2], bits, sh.rows / 3 + 1, sh.cols, 0);
        const std::vector<float> x = rand_vec((size_t)sh.cols, 1.5f), x2 = rand_vec((size_t)sh.cols, 1.0f);
        std::vector<float> gain = rand_vec((size_t)sh.cols, 0.3f);
        for (auto &g : gain) g += 1.0f;
        std::vector<float> xn((size_t)sh.cols), xx2((size_t)sh.cols);
        spx_cpu_rmsnorm(xn.data(), x.data(), gain.data(), sh.cols, 1e-5f);
        for (int64_t c = 0; c < sh.cols; c++) xx2[c] = x[c] * x2[c];
        std::vector<float> bias[3];
        float *db[3], *dy[3];
        for (int i = 0; i < 3; i++) {
            bias[i] = rand_vec((size_t)m[i].b.q.rows, 0.1f);
            db[i] = dev_up(bias[i].data(), bias[i].size());
            dy[i] = dev_alloc<float>(bias[i].size());
        }
        const float *dx = dev_up(x.data(), x.size()), *dx2 = dev_up(x2.data(), x2.size()),
                    *dg = dev_up(gain.data(), gain.size());
        unsigned long long *dbest = dev_alloc<unsigned long long>(1);
        std::vector<double> ref[3], tol[3];
        for (int form = 0; form < 3; form++) {
            spx_gemv_q4_force_tiled_variant(form);
            for (int mode = 0; mode < 6; mode++) { /* store, store+norm, add, argmax, three mats with x * x2, pair */
                spx_gemv_args a;
                memset(&a, 0, sizeof a);
                const int nm = mode == 4 ? 3 : mode == 5 ? 2 : 1;
                a.n_mats = nm;
                a.mode = mode == 2 ? SPX_GEMV_ADD : mode == 3 ? SPX_GEMV_ARGMAX : SPX_GEMV_STORE;
                a.x = dx;
                a.gain = mode == 1 || mode == 5 ? dg : NULL;
                a.x2 = mode == 4 ? dx2 : NULL;
                a.eps = 1e-5f;
                a.pair = mode == 5;
                a.best = mode == 3 ? dbest : NULL;
                const std::vector<float> &xe = mode == 1 || mode == 5 ? xn : mode == 4 ? xx2 : x;
                std::vector<float> y0 = rand_vec(bias[0].size(), 1.0f);
                for (int i = 0; i < nm; i++) {
                    a.w[i] = m[i].d;
                    a.o[i].y = dy[i];
                    a.o[i].bias = db[i];
                    poison(dy[i], bias[i].size() * 4);
                    ref_gemv(m[i], xe.data(), bias[i].data(), ref[i], tol[i]);
                }
                if (mode == 2) {
                    CK(cudaMemcpy(dy[0], y0.data(), y0.size() * 4, cudaMemcpyHostToDevice));
                    for (size_t r = 0; r < y0.size(); r++) ref[0][r] += y0[r];
                }
                if (mode == 3) CK(cudaMemset(dbest, 0, 8));
                CK(spx_gemv_q4(a, n_sm, 0));
                CK(cudaDeviceSynchronize());
                char what[160];
                snprintf(what, sizeof what, "gemv bits %d %lldx%lld out %lld form %d mode %d", bits, (long long)sh.rows,
                         (long long)sh.cols, (long long)sh.n_out, form, mode);
                if (mode == 5) { /* o[0].y = silu(gate) * up: the bound through the product */
                    std::vector<double> pr(ref[0].size()), pt(ref[0].size());
                    for (size_t r = 0; r < pr.size(); r++) {
                        const double g = ref[0][r], u = ref[1][r], sg = silu((float)g);
                        pr[r] = sg * u;
                        pt[r] = fabs(sg) * tol[1][r] + fabs(u) * 1.1 * tol[0][r] + 1e-6;
                    }
                    check(what, down(dy[0], pr.size()), pr, pt);
                } else {
                    for (int i = 0; i < nm; i++) check(what, down(dy[i], ref[i].size()), ref[i], tol[i]);
                }
                if (mode == 3) { /* the argmax's row must be a maximum within the tolerance */
                    unsigned long long best = 0;
                    CK(cudaMemcpy(&best, dbest, 8, cudaMemcpyDeviceToHost));
                    const int64_t bi = (int64_t)(0xffffffffu - (unsigned)(best & 0xffffffffu)); /* spx_argmax_key */
                    int64_t ri = 0;
                    for (size_t r = 1; r < ref[0].size(); r++)
                        if (ref[0][r] > ref[0][ri]) ri = (int64_t)r;
                    const bool ok = bi >= 0 && bi < (int64_t)ref[0].size() && ref[0][bi] >= ref[0][ri] - 2 * tol[0][ri];
                    CHECK(ok, "%s: argmax %lld (ref %lld)", what, (long long)bi, (long long)ri);
                }
                n_cases++;
            }
        }
        spx_gemv_q4_force_tiled_variant(-1);
        for (auto &mm : m) spx_qbuf_free(&mm.b);
        dev_free_all();
    }
    printf("gemv bits %d: %d cases\n", bits, n_cases);
}

/* ---- GEMM (prefill) ---------------------------------------------------------- */

static void test_gemm(int bits, int n_sm) {
    struct { int64_t rows, cols, n_out; } shapes[] = {{100, 384, 5}, {300, 4096, 41}, {37, 1024, 0}};
    const int Ms[] = {2, 37, 128};
    int n_cases = 0;
    for (auto &sh : shapes) {
        lbmat m;
        make_lb(m, bits, sh.rows, sh.cols, sh.n_out);
        std::vector<float> W((size_t)(sh.rows * sh.cols));
        for (int64_t r = 0; r < sh.rows; r++) spx_q_dequant_row_f32(&m.b.q, r, W.data() + r * sh.cols);
        for (int M : Ms) {
            std::vector<float> x = rand_vec((size_t)(M * sh.cols), 1.0f);
            std::vector<uint16_t> xh(x.size());
            for (size_t i = 0; i < x.size(); i++) x[i] = spx_f16_to_f32(xh[i] = spx_f32_to_f16(x[i]));
            float *dy = dev_alloc<float>((size_t)(M * sh.rows));
            poison(dy, (size_t)(M * sh.rows) * 4);
            spx_gemm_args a;
            memset(&a, 0, sizeof a);
            a.w = m.d;
            a.x = (const __half *)dev_up(xh.data(), xh.size());
            a.ldx = sh.cols, a.y = dy, a.ldy = sh.rows, a.M = M;
            CK(spx_gemm_q4(a, n_sm, 0));
            CK(cudaDeviceSynchronize());
            std::vector<float> y = down(dy, (size_t)(M * sh.rows));
            std::vector<double> ref(y.size()), tol(y.size());
            for (int t = 0; t < M; t++)
                for (int64_t r = 0; r < sh.rows; r++) {
                    double s = 0, b = 0;
                    for (int64_t c = 0; c < sh.cols; c++) {
                        const double p = (double)W[r * sh.cols + c] * x[t * sh.cols + c];
                        s += p, b += fabs(p);
                    }
                    ref[(size_t)t * sh.rows + r] = s;
                    tol[(size_t)t * sh.rows + r] = GEMM_TOL_REL * b + 1e-5;
                }
            char what[96];
            snprintf(what, sizeof what, "gemm bits %d %lldx%lld out %lld M %d", bits, (long long)sh.rows,
                     (long long)sh.cols, (long long)sh.n_out, M);
            check(what, y, ref, tol);
            n_cases++;
        }
        spx_qbuf_free(&m.b);
        dev_free_all();
    }
    printf("gemm bits %d: %d cases\n", bits, n_cases);
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("test_cuda_lowbit: no CUDA device; skipped\n");
        return 0;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    CK(spx_gemv_q4_setup(SPX_GEMV_MAX_COLS));
    for (int bits = 2; bits <= 3; bits++) {
        test_layout(bits, 16, 128);
        test_layout(bits, 45, 384);
        test_layout(bits, 300, 4096);
        test_gemv(bits, prop.multiProcessorCount);
        test_gemm(bits, prop.multiProcessorCount);
    }
    return tl_finish("test_cuda_lowbit");
}
