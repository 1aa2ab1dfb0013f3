/* test_cuda_refine.cu: the CUDA weight refinement (cuda/refine.cuh,
 * cu_refine.cu) against the CPU's (refine/refine.h, cpu/ops.c).
 *
 *   test_cuda_refine [MODEL.trdc MODEL.refine]...
 *
 * Kernels: the selection equals spx_refine_topk index for index (random
 * inputs with ties, zeros, NaNs, skipped channels, partial chunks, k from
 * 1 to every channel); the application equals the CPU's scalar apply bit
 * for bit (same x values, same order of fmaf). Models (each pair given):
 * decode steps one token at a time with refinement at every channel agree
 * with the CPU backend's refined logits within E2E_TOL; at k = 32 within
 * E2E_TOL or a tenth of the unrefined logits' distance to them, whichever
 * is larger (the two backends' inputs differ in their last bits, which
 * can swap channels at the k-th place of a chunk: a different column set,
 * not an error); budget 0 gives the unrefined
 * CUDA logits bit for bit; greedy steps through the captured graph pick
 * the CPU's refined tokens (or a near-tie); a budget change after a
 * capture is seen by the next step. Fetch lag (s = 1: o and down added
 * one block later): closer to the CPU's refined logits than the unrefined
 * are, and the graph's greedy tokens are the eager steps' argmax (the
 * same kernels). Without a device: skipped. */
#include "cuda/refine.cuh"
#include "cuda/cutest.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "engine/tuning.h"
#include "refine/refine.h"
#include "spectra.h"
#include "testlib.h"
}

#define E2E_TOL 4e-3 /* test_cuda's token-by-token bound (E2E_GEMV_TOL) */

static uint64_t g_rng = 0x5eedf00dULL;

template <class T> static T *dev_copy(const T *h, size_t n) {
    T *d = NULL;
    CK(cudaMalloc(&d, n * sizeof(T) + 16));
    CK(cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

static float frand(void) { return (float)((double)(tl_rand_u64(&g_rng) >> 11) / 9007199254740992.0) * 2.0f - 1.0f; }

static void test_select(void) {
    const int64_t cols_list[] = {1, 37, 1024, 1500, 4096, 5000};
    const int ks[] = {1, 3, 32, 100, 1024, 2000};
    int cases = 0;
    for (int64_t cols : cols_list)
        for (int k : ks)
            for (int variant = 0; variant < 3; variant++) {
                std::vector<float> x((size_t)cols);
                std::vector<uint8_t> skip((size_t)cols, 0);
                for (int64_t i = 0; i < cols; i++) {
                    const uint64_t r = tl_rand_u64(&g_rng) % 16;
                    x[i] = variant == 0 ? frand() : (float)((int)(tl_rand_u64(&g_rng) % 7) - 3) * 0.5f; /* ties */
                    if (r == 0) x[i] = 0.0f;
                    if (r == 1) x[i] = -0.0f;
                    if (r == 2 && variant == 2) x[i] = NAN;
                    if (variant == 2) skip[i] = tl_rand_u64(&g_rng) % 5 == 0;
                }
                std::vector<int32_t> want((size_t)spx_refine_topk_max(cols, SPX_REFINE_CHUNK, k) + 1);
                const int64_t nw = spx_refine_topk(x.data(), cols, SPX_REFINE_CHUNK, k, variant == 2 ? skip.data() : NULL,
                                                   want.data());
                const int n_chunks = (int)((cols + 1023) / 1024), kc = k < 1024 ? k : 1024;
                float *dx = dev_copy(x.data(), x.size());
                uint8_t *dskip = dev_copy(skip.data(), skip.size());
                int32_t *dsel;
                float *dselx;
                int *dcnt;
                CK(cudaMalloc(&dsel, (size_t)n_chunks * kc * 4));
                CK(cudaMalloc(&dselx, (size_t)n_chunks * kc * 4));
                CK(cudaMalloc(&dcnt, (size_t)n_chunks * 4));
                spx_rf_select_args a;
                memset(&a, 0, sizeof a);
                a.x = dx, a.cols = cols, a.k = k, a.skip = variant == 2 ? dskip : NULL;
                a.sel = dsel, a.selx = dselx, a.cnt = dcnt;
                CK(spx_rf_select(a, 0));
                CK(cudaDeviceSynchronize());
                std::vector<int32_t> sel((size_t)n_chunks * kc);
                std::vector<float> selx((size_t)n_chunks * kc);
                std::vector<int> cnt((size_t)n_chunks);
                CK(cudaMemcpy(sel.data(), dsel, sel.size() * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(selx.data(), dselx, selx.size() * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(cnt.data(), dcnt, cnt.size() * 4, cudaMemcpyDeviceToHost));
                std::vector<int32_t> got;
                bool xs_ok = true;
                for (int c = 0; c < n_chunks; c++)
                    for (int j = 0; j < cnt[c]; j++) {
                        const int32_t i = sel[(size_t)c * kc + j];
                        got.push_back(i);
                        const float xv = selx[(size_t)c * kc + j];
                        xs_ok &= i >= 0 && i < cols && (memcmp(&xv, &x[i], 4) == 0 || (isnan(xv) && isnan(x[i])));
                    }
                bool same = (int64_t)got.size() == nw;
                for (int64_t j = 0; same && j < nw; j++) same = got[j] == want[j];
                CHECK(same, "select cols %lld k %d variant %d: %zu channels, the CPU %lld (or another set)", (long long)cols,
                      k, variant, got.size(), (long long)nw);
                CHECK(xs_ok, "select cols %lld k %d variant %d: the x values beside the indices", (long long)cols, k, variant);
                cudaFree(dx), cudaFree(dskip), cudaFree(dsel), cudaFree(dselx), cudaFree(dcnt);
                cases++;
            }
    printf("select: %d cases against spx_refine_topk\n", cases);
}

static void test_apply(void) {
    const int64_t shapes[][2] = {{64, 64}, {1000, 1500}, {2048, 512}, {4100, 3000}, {7, 2100}};
    for (auto &sh : shapes) {
        const int64_t rows = sh[0], cols = sh[1];
        spx_err e;
        spx_refine_q4buf b;
        CHECK(spx_refine_q4buf_init(&b, rows, cols, 0, &e) == SPX_OK, "q4buf: %s", e.msg);
        for (int64_t i = 0; i < cols; i++)
            for (int64_t r = 0; r < rows; r += 2) {
                const int lo = (int)(tl_rand_u64(&g_rng) % 15) + 1, hi = r + 1 < rows ? (int)(tl_rand_u64(&g_rng) % 15) + 1 : 8;
                b.codes[i * b.v.col_stride + r / 2] = (uint8_t)(lo | hi << 4);
            }
        for (int64_t r = 0; r < rows; r++) b.scales[r] = 1e-3f * (1.0f + frand());
        std::vector<float> x((size_t)cols);
        for (auto &v : x) v = frand() * 3.0f;
        for (int k : {1, 17, 1024}) {
            std::vector<int32_t> sel((size_t)spx_refine_topk_max(cols, 1024, k));
            const int64_t ns = spx_refine_topk(x.data(), cols, 1024, k, NULL, sel.data());
            std::vector<float> want((size_t)rows, 0.0f);
            spx_refine_kernels_scalar()->apply(&b.v, sel.data(), NULL, ns, x.data(), want.data(), 0, rows);
            /* the device's selection layout: chunk c at c * kcap */
            const int n_chunks = (int)((cols + 1023) / 1024), kc = k < 1024 ? k : 1024;
            std::vector<int32_t> dsel_h((size_t)n_chunks * kc, 0);
            std::vector<float> dselx_h((size_t)n_chunks * kc, 0.0f);
            std::vector<int> cnt((size_t)n_chunks, 0);
            for (int64_t j = 0; j < ns; j++) {
                const int c = sel[j] / 1024;
                dsel_h[(size_t)c * kc + cnt[c]] = sel[j];
                dselx_h[(size_t)c * kc + cnt[c]++] = x[sel[j]];
            }
            uint8_t *host = NULL, *host_d = NULL;
            CK(cudaHostAlloc((void **)&host, (size_t)(cols * b.v.col_stride), cudaHostAllocMapped));
            CK(cudaHostGetDevicePointer((void **)&host_d, host, 0));
            memcpy(host, b.codes, (size_t)(cols * b.v.col_stride));
            float *dsc = dev_copy(b.scales, (size_t)rows), *dd;
            CK(cudaMalloc(&dd, (size_t)rows * 4));
            int32_t *ds = dev_copy(dsel_h.data(), dsel_h.size());
            float *dx = dev_copy(dselx_h.data(), dselx_h.size());
            int *dc = dev_copy(cnt.data(), cnt.size());
            spx_rf_apply_args a;
            memset(&a, 0, sizeof a);
            a.m[0].codes = host_d, a.m[0].scales = dsc, a.m[0].delta = dd, a.m[0].rows = rows, a.m[0].col_stride = b.v.col_stride;
            a.n_mats = 1, a.sel = ds, a.selx = dx, a.cnt = dc, a.n_chunks = n_chunks, a.kcap = kc;
            for (int blocks : {1, 3, 64}) {
                CK(cudaMemset(dd, 0xff, (size_t)rows * 4));
                CK(spx_rf_apply(a, blocks, 0));
                CK(cudaDeviceSynchronize());
                std::vector<float> got((size_t)rows);
                CK(cudaMemcpy(got.data(), dd, (size_t)rows * 4, cudaMemcpyDeviceToHost));
                int64_t bad = -1;
                for (int64_t r = 0; r < rows && bad < 0; r++)
                    if (memcmp(&got[r], &want[r], 4)) bad = r;
                CHECK(bad < 0, "apply %lldx%lld k %d blocks %d: row %lld %.9g, the CPU's %.9g", (long long)rows,
                      (long long)cols, k, blocks, (long long)bad, bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0);
            }
            cudaFreeHost(host), cudaFree(dsc), cudaFree(dd), cudaFree(ds), cudaFree(dx), cudaFree(dc);
        }
        spx_refine_q4buf_free(&b);
    }
    printf("apply: bit-identical to the CPU's scalar table\n");
}

/* The largest row_err over n rows of V logits. */
static double rows_err(const std::vector<float> &g, const std::vector<float> &c, int n, int64_t V) {
    double e = 0;
    for (int t = 0; t < n; t++) e = fmax(e, row_err(g.data() + (size_t)t * V, c.data() + (size_t)t * V, V));
    return e;
}

/* n token-by-token steps of ids on s, logits [n, V]. */
static bool steps(spx_session *s, const std::vector<int32_t> &ids, int n, std::vector<float> &out, int64_t V) {
    spx_session_reset(s);
    out.assign((size_t)n * V, 0.0f);
    for (int t = 0; t < n; t++)
        if (spx_session_eval(s, &ids[t], 1, out.data() + (size_t)t * V, 0) != SPX_OK) return false;
    return true;
}

static spx_refine_params rparams(const char *path, int64_t k) {
    spx_refine_params p;
    memset(&p, 0, sizeof p);
    p.path = path;
    for (int i = 0; i < 4; i++) p.k[i] = k;
    return p;
}

static void test_model(const char *trdc, const char *refine) {
    spx_model_params pc = {0, "cpu", 0}, pg = {0, "cuda", 0};
    spx_model *mc = NULL, *mg = NULL;
    if (spx_model_open(trdc, &pc, &mc) != SPX_OK || spx_model_open(trdc, &pg, &mg) != SPX_OK) {
        CHECK(0, "%s: open: %s", trdc, spx_last_error());
        spx_model_free(mc);
        return;
    }
    const int64_t V = spx_model_vocab_size(mc);
    spx_session_params sp = {128, SPX_KV_F16};
    spx_session *sc = NULL, *sg = NULL;
    const int n = 16;
    std::vector<int32_t> ids(n);
    for (auto &id : ids) id = (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)V);
    std::vector<float> base, b0, lc, lg;
    CHECK(spx_session_new(mg, &sp, &sg) == SPX_OK, "%s: cuda session: %s", trdc, spx_model_error(mg));
    CHECK(spx_session_new(mc, &sp, &sc) == SPX_OK, "%s: cpu session: %s", trdc, spx_model_error(mc));
    if (!sc || !sg) goto done;
    CHECK(steps(sg, ids, n, base, V), "%s: cuda steps: %s", trdc, spx_session_error(sg));
    {
        /* attached after the session exists, budget 0: the base bits */
        spx_refine_params p = rparams(refine, 0);
        CHECK(spx_model_refine(mg, &p) == SPX_OK, "%s: cuda refine: %s", refine, spx_model_error(mg));
        CHECK(steps(sg, ids, n, b0, V), "%s: cuda steps: %s", trdc, spx_session_error(sg));
        CHECK(memcmp(b0.data(), base.data(), base.size() * 4) == 0, "%s: budget 0 changed the cuda logits", refine);
    }
    for (int64_t k : {32, 1024}) {
        spx_refine_params p = rparams(refine, k);
        CHECK(spx_model_refine(mc, &p) == SPX_OK, "%s: cpu refine: %s", refine, spx_model_error(mc));
        CHECK(spx_model_refine(mg, &p) == SPX_OK, "%s: cuda refine: %s", refine, spx_model_error(mg));
        CHECK(steps(sc, ids, n, lc, V), "%s: cpu steps: %s", trdc, spx_session_error(sc));
        CHECK(steps(sg, ids, n, lg, V), "%s: cuda steps: %s", trdc, spx_session_error(sg));
        const double err = rows_err(lg, lc, n, V), err_base = rows_err(base, lc, n, V);
        const double tol = k >= 1024 ? E2E_TOL : fmax(E2E_TOL, 0.1 * err_base);
        CHECK(err <= tol, "%s k %lld: refined cuda logits off the cpu's by %.3g > %.3g (unrefined: %.3g)", refine,
              (long long)k, err, tol, err_base);
        /* greedy graph steps: the CPU's refined tokens */
        spx_session_reset(sc);
        spx_session_reset(sg);
        std::vector<float> c1((size_t)V);
        int32_t id = ids[0];
        int same = 0, near = 0;
        for (int i = 0; i < 12; i++) {
            int32_t ng = -1;
            CHECK(spx_session_eval(sc, &id, 1, c1.data(), 0) == SPX_OK, "cpu step: %s", spx_session_error(sc));
            CHECK(spx_session_step_greedy(sg, id, &ng) == SPX_OK, "cuda greedy: %s", spx_session_error(sg));
            const int32_t nc = argmax_f(c1.data(), V);
            same += ng == nc;
            near += ng != nc && ng >= 0 && ng < V && fabs(c1[ng] - c1[nc]) <= 2e-2 * fmax(1.0, fabs(c1[nc]));
            id = nc;
        }
        CHECK(same + near == 12, "%s k %lld: greedy graph steps chose the cpu's token %d of 12 (%d near)", refine,
              (long long)k, same, near);
        printf("e2e %s k %lld: refined cuda vs cpu %.3g (unrefined cuda vs refined cpu %.3g); greedy %d/12 (+%d near)\n",
               refine, (long long)k, err, err_base, same, near);
    }
    {
        /* fetch lag s = 1 at every channel: the CPU refines at once, so only closer than unrefined */
        spx_refine_params p = rparams(refine, 1024);
        p.cuda_lag = 2;
        CHECK(spx_model_refine(mc, &p) == SPX_OK, "%s: cpu refine: %s", refine, spx_model_error(mc));
        CHECK(spx_model_refine(mg, &p) == SPX_OK, "%s: cuda refine lag: %s", refine, spx_model_error(mg));
        CHECK(steps(sc, ids, n, lc, V), "%s: cpu steps: %s", trdc, spx_session_error(sc));
        CHECK(steps(sg, ids, n, lg, V), "%s: cuda steps: %s", trdc, spx_session_error(sg));
        const double err = rows_err(lg, lc, n, V), err_base = rows_err(base, lc, n, V);
        CHECK(err < err_base, "%s lag 1: cuda logits off the cpu's refined by %.3g, the unrefined by %.3g", refine, err,
              err_base);
        spx_session_reset(sg);
        int same = 0;
        for (int t = 0; t + 1 < n; t++) {
            int32_t ng = -1;
            CHECK(spx_session_step_greedy(sg, ids[t], &ng) == SPX_OK, "cuda greedy: %s", spx_session_error(sg));
            same += ng == argmax_f(lg.data() + (size_t)t * V, V);
        }
        CHECK(same == n - 1, "%s lag 1: graph steps chose the eager steps' token %d of %d", refine, same, n - 1);
        printf("e2e %s lag 1 (every channel): cuda vs cpu refined %.3g (unrefined %.3g); graph = eager %d/%d\n", refine,
               err, err_base, same, n - 1);
    }
    {
        /* a budget change after the graph was captured: the next steps use it (budget 0 again: the base) */
        spx_refine_params p = rparams(refine, 0);
        CHECK(spx_model_refine(mg, &p) == SPX_OK, "%s: cuda refine: %s", refine, spx_model_error(mg));
        spx_session_reset(sg);
        std::vector<float> g1((size_t)V);
        int32_t ng = -1;
        CHECK(spx_session_step_greedy(sg, ids[0], &ng) == SPX_OK, "cuda greedy: %s", spx_session_error(sg));
        CHECK(ng == argmax_f(base.data(), V), "%s: after the budget went to 0 the graph step chose %d, the base %d", refine,
              ng, argmax_f(base.data(), V));
    }
    {
        /* what the cuda path refuses, with a message */
        spx_refine_params p = rparams(refine, 32);
        p.cache_mb = 8;
        CHECK(spx_model_refine(mg, &p) != SPX_OK && strstr(spx_model_error(mg), "pinned"),
              "%s: --refine-cache on cuda: accepted or no message (%s)", refine, spx_model_error(mg));
    }
done:
    spx_session_free(sc);
    spx_session_free(sg);
    spx_model_free(mc);
    spx_model_free(mg);
}

int main(int argc, char **argv) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("test_cuda_refine: no CUDA device; skipped\n");
        return 0;
    }
    setenv("SPECTRA_KERNELS", "scalar", 1); /* the CPU side: the scalar reference */
    spx_tuning_reload();
    test_select();
    test_apply();
    for (int i = 1; i + 1 < argc; i += 2) test_model(argv[i], argv[i + 1]);
    return tl_finish("test_cuda_refine");
}
