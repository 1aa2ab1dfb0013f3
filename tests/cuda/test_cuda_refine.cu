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
 * same kernels). Fetch lead (the q/k/v and gate/up channels chosen d
 * half-blocks early, their columns staged on the device): the staged
 * apply equals the direct one bit for bit for the same selection and
 * input, and select_x gives select's values; at every channel (the
 * selection cannot depend on the input) lead 1 .. 4, and lead 3 with lag
 * 2, give the logits of lead 0 within LEAD_TOL; at k = 32 lead 2 is closer
 * to the every-channel refined logits than the unrefined on average, is
 * not lead 0 (the channels came from elsewhere), and the graph's greedy
 * tokens are the eager steps' argmax. Without a device: skipped. */
#include "cuda/refine.cuh"
#include "cuda/cutest.cuh"

#include <algorithm>
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
#define LEAD_TOL 1e-5 /* lead d vs lead 0 with the same channels: the same kernels on the same values (expected 0) */

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

/* Fetch lead's kernels: select on one vector, fetch the chosen columns
 * of 1 .. 3 matrices into poisoned staging, select_x with another input;
 * the staged apply equals the direct apply (host columns, the same
 * selection and values) bit for bit, and select_x's values are
 * spx_rf_select's for the same input (at k = every channel). Strides with
 * and without 16-byte alignment (the fetch's two copy widths). */
static void test_staged(void) {
    struct shape { int64_t cols; int n_mats; int64_t rows[3]; int64_t pad; };
    /* strides 4 * ceil(rows / 8) + pad; {3000, 2, ..} all 16-byte units, {1025, 2, ..} a 16-byte stride
     * whose columns start off 16 (after 1,025 columns of 4 bytes) */
    const shape shapes[] = {{64, 1, {64, 0, 0}, 0},        {1500, 3, {1000, 200, 200}, 4}, {4096, 2, {2048, 700, 0}, 12},
                            {2100, 3, {7, 33, 4100}, 0},   {1024, 1, {96, 0, 0}, 8},       {3000, 2, {512, 256, 0}, 0},
                            {1025, 2, {8, 128, 0}, 0}};
    int cases = 0;
    for (const shape &sh : shapes)
        for (int k : {1, 32, 1024})
            for (int gain : {0, 1}) {
                const int64_t cols = sh.cols;
                const int n_chunks = (int)((cols + 1023) / 1024), kc = k < 1024 ? k : 1024;
                /* the matrices' columns in one mapped allocation, back to back (the second may start off 16 bytes) */
                int64_t stride[3], off[3], host_bytes = 0;
                for (int m = 0; m < sh.n_mats; m++) {
                    stride[m] = 4 * ((sh.rows[m] + 7) / 8) + sh.pad;
                    off[m] = host_bytes;
                    host_bytes += cols * stride[m];
                }
                uint8_t *host = NULL, *host_d = NULL;
                CK(cudaHostAlloc((void **)&host, (size_t)host_bytes, cudaHostAllocMapped));
                CK(cudaHostGetDevicePointer((void **)&host_d, host, 0));
                for (int64_t i = 0; i < host_bytes; i++) host[i] = (uint8_t)tl_rand_u64(&g_rng);
                std::vector<float> x0((size_t)cols), x1((size_t)cols), g((size_t)cols);
                for (int64_t i = 0; i < cols; i++) x0[i] = frand() * 2.0f, x1[i] = frand() * 3.0f, g[i] = 0.5f + frand();
                float *dx0 = dev_copy(x0.data(), x0.size()), *dx1 = dev_copy(x1.data(), x1.size());
                float *dg = dev_copy(g.data(), g.size());
                const size_t E = (size_t)n_chunks * kc;
                int32_t *dsel, *dsel_all;
                float *dselx, *dselx_all, *ddelta[2][3], *dsc[3];
                int *dcnt, *dcnt_all;
                uint8_t *stage[3];
                CK(cudaMalloc(&dsel, E * 4));
                CK(cudaMalloc(&dselx, E * 4));
                CK(cudaMalloc(&dcnt, (size_t)n_chunks * 4));
                CK(cudaMalloc(&dsel_all, (size_t)n_chunks * 1024 * 4));
                CK(cudaMalloc(&dselx_all, (size_t)n_chunks * 1024 * 4));
                CK(cudaMalloc(&dcnt_all, (size_t)n_chunks * 4));
                spx_rf_fetch_args fa;
                spx_rf_apply_args aa[2];
                memset(&fa, 0, sizeof fa);
                memset(aa, 0, sizeof aa);
                for (int m = 0; m < sh.n_mats; m++) {
                    std::vector<float> sc((size_t)sh.rows[m]);
                    for (auto &v : sc) v = 1e-2f * (1.0f + frand());
                    dsc[m] = dev_copy(sc.data(), sc.size());
                    CK(cudaMalloc(&stage[m], E * (size_t)stride[m] + 16));
                    CK(cudaMemset(stage[m], 0xff, E * (size_t)stride[m] + 16)); /* poison: unfetched bytes show */
                    fa.m[m].codes = host_d + off[m], fa.m[m].rows = sh.rows[m], fa.m[m].col_stride = stride[m];
                    fa.stage[m] = stage[m];
                    for (int v = 0; v < 2; v++) {
                        CK(cudaMalloc(&ddelta[v][m], (size_t)sh.rows[m] * 4));
                        CK(cudaMemset(ddelta[v][m], 0xff, (size_t)sh.rows[m] * 4));
                        spx_rf_mat &M = aa[v].m[m];
                        M.codes = v ? stage[m] : host_d + off[m], M.scales = dsc[m], M.delta = ddelta[v][m];
                        M.rows = sh.rows[m], M.col_stride = stride[m];
                    }
                }
                fa.n_mats = sh.n_mats, fa.sel = dsel, fa.cnt = dcnt, fa.n_chunks = n_chunks, fa.kcap = kc;
                for (int v = 0; v < 2; v++) {
                    aa[v].n_mats = sh.n_mats, aa[v].sel = dsel, aa[v].selx = dselx, aa[v].cnt = dcnt;
                    aa[v].n_chunks = n_chunks, aa[v].kcap = kc, aa[v].staged = v;
                }
                spx_rf_select_args sa;
                memset(&sa, 0, sizeof sa);
                sa.x = dx0, sa.gain = gain ? dg : NULL, sa.eps = 1e-5f, sa.cols = cols, sa.k = k;
                sa.sel = dsel, sa.selx = dselx, sa.cnt = dcnt;
                CK(spx_rf_select(sa, 0));           /* the channels, from x0 */
                CK(spx_rf_fetch(fa, 5, 0));         /* their columns */
                sa.x = dx1;
                CK(spx_rf_select_x(sa, 0));         /* the values, from x1 */
                CK(spx_rf_apply(aa[0], 16, 0));     /* host columns */
                CK(spx_rf_apply(aa[1], 3, 0));      /* staged */
                spx_rf_select_args s_all = sa;      /* every channel of x1, as select writes their values */
                s_all.k = 1024, s_all.sel = dsel_all, s_all.selx = dselx_all, s_all.cnt = dcnt_all;
                CK(spx_rf_select(s_all, 0));
                CK(cudaDeviceSynchronize());
                std::vector<int32_t> sel(E);
                std::vector<float> selx(E), selx_all((size_t)n_chunks * 1024);
                std::vector<int> cnt((size_t)n_chunks);
                CK(cudaMemcpy(sel.data(), dsel, E * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(selx.data(), dselx, E * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(cnt.data(), dcnt, (size_t)n_chunks * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(selx_all.data(), dselx_all, selx_all.size() * 4, cudaMemcpyDeviceToHost));
                int64_t bad_x = -1, n_sel = 0;
                for (int c = 0; c < n_chunks; c++)
                    for (int j = 0; j < cnt[c]; j++, n_sel++) {
                        const size_t e = (size_t)c * kc + j;
                        const int32_t i = sel[e]; /* select at every channel: channel i's value at i */
                        if (bad_x < 0 && (i < 0 || i >= cols || memcmp(&selx[e], &selx_all[i], 4))) bad_x = (int64_t)e;
                    }
                CHECK(bad_x < 0, "select_x cols %lld k %d gain %d: entry %lld (channel %d) %.9g, select's %.9g",
                      (long long)cols, k, gain, (long long)bad_x, bad_x >= 0 ? sel[bad_x] : -1,
                      bad_x >= 0 ? selx[bad_x] : 0.0, bad_x >= 0 && sel[bad_x] >= 0 && sel[bad_x] < cols ? selx_all[sel[bad_x]] : 0.0);
                int64_t n_want = 0; /* no skipped channels: min(k, width) per chunk */
                for (int c = 0; c < n_chunks; c++) n_want += std::min<int64_t>(kc, std::min<int64_t>(1024, cols - 1024 * c));
                CHECK(n_sel == n_want, "staged cols %lld k %d: %lld channels chosen, want %lld", (long long)cols, k,
                      (long long)n_sel, (long long)n_want);
                for (int m = 0; m < sh.n_mats; m++) {
                    std::vector<float> want((size_t)sh.rows[m]), got((size_t)sh.rows[m]);
                    CK(cudaMemcpy(want.data(), ddelta[0][m], want.size() * 4, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(got.data(), ddelta[1][m], got.size() * 4, cudaMemcpyDeviceToHost));
                    int64_t bad = -1;
                    for (int64_t r = 0; r < sh.rows[m] && bad < 0; r++)
                        if (memcmp(&got[r], &want[r], 4) || isnan(want[r])) bad = r;
                    CHECK(bad < 0, "staged apply cols %lld k %d gain %d matrix %d (%lld rows, stride %lld): row %lld %.9g, "
                          "the direct apply's %.9g", (long long)cols, k, gain, m, (long long)sh.rows[m], (long long)stride[m],
                          (long long)bad, bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0);
                    for (int v = 0; v < 2; v++) cudaFree(ddelta[v][m]);
                    cudaFree(dsc[m]), cudaFree(stage[m]);
                }
                cudaFreeHost(host), cudaFree(dx0), cudaFree(dx1), cudaFree(dg), cudaFree(dsel), cudaFree(dselx);
                cudaFree(dcnt), cudaFree(dsel_all), cudaFree(dselx_all), cudaFree(dcnt_all);
                cases++;
            }
    printf("staged: %d cases, staged apply = direct apply bit for bit, select_x = select's values\n", cases);
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
        /* fetch lead at every channel: the selection cannot depend on the input, so lead d is lead 0 */
        std::vector<float> ref_all, l0, ld;
        spx_refine_params p = rparams(refine, 1024);
        CHECK(spx_model_refine(mc, &p) == SPX_OK, "%s: cpu refine: %s", refine, spx_model_error(mc));
        CHECK(steps(sc, ids, n, ref_all, V), "%s: cpu steps: %s", trdc, spx_session_error(sc));
        CHECK(spx_model_refine(mg, &p) == SPX_OK, "%s: cuda refine: %s", refine, spx_model_error(mg));
        CHECK(steps(sg, ids, n, l0, V), "%s: cuda steps: %s", trdc, spx_session_error(sg));
        for (int lag : {0, 2})
            for (int d = 1; d <= 4; d++) {
                if (lag && d != 3) continue; /* lead and lag together: lead 3 with lag 2 is lag 2 */
                p.cuda_lag = lag;
                if (lag) {
                    p.cuda_lead = 0;
                    CHECK(spx_model_refine(mg, &p) == SPX_OK, "%s: cuda refine lag %d: %s", refine, lag, spx_model_error(mg));
                    CHECK(steps(sg, ids, n, l0, V), "%s: cuda steps lag %d: %s", trdc, lag, spx_session_error(sg));
                }
                p.cuda_lead = d;
                CHECK(spx_model_refine(mg, &p) == SPX_OK, "%s: cuda refine lead %d: %s", refine, d, spx_model_error(mg));
                CHECK(steps(sg, ids, n, ld, V), "%s: cuda steps lead %d lag %d: %s", trdc, d, lag, spx_session_error(sg));
                const double dmax = tl_max_diff(ld.data(), l0.data(), ld.size()), err = rows_err(ld, ref_all, n, V);
                CHECK(dmax <= LEAD_TOL, "%s lead %d lag %d (every channel): logits off lead 0's by %.3g > %.3g (the staged "
                      "apply or its x values differ from the direct path)", refine, d, lag, dmax, LEAD_TOL);
                CHECK(lag || err <= E2E_TOL, "%s lead %d (every channel): cuda logits off the cpu's refined by %.3g > %.3g",
                      refine, d, err, E2E_TOL);
                printf("e2e %s lead %d lag %d (every channel): vs lead 0 %.3g%s, vs cpu refined %.3g\n", refine, d, lag,
                       dmax, memcmp(ld.data(), l0.data(), ld.size() * 4) ? "" : " (bit-identical)", err);
            }
        /* k = 32, lead 2 (one block): the channels come from h one block earlier, each refined with the
         * launch's own input: still closer to the every-channel refinement than the unrefined on
         * average, and not lead 0's logits */
        std::vector<float> k0, k2, kg;
        p = rparams(refine, 32);
        CHECK(spx_model_refine(mg, &p) == SPX_OK, "%s: cuda refine: %s", refine, spx_model_error(mg));
        CHECK(steps(sg, ids, n, k0, V), "%s: cuda steps: %s", trdc, spx_session_error(sg));
        p.cuda_lead = 2;
        CHECK(spx_model_refine(mg, &p) == SPX_OK, "%s: cuda refine lead 2: %s", refine, spx_model_error(mg));
        CHECK(steps(sg, ids, n, k2, V), "%s: cuda steps lead 2: %s", trdc, spx_session_error(sg));
        const size_t nv = k2.size();
        const double m_base = tl_mean_diff(base.data(), ref_all.data(), nv), m0 = tl_mean_diff(k0.data(), ref_all.data(), nv),
                     m2 = tl_mean_diff(k2.data(), ref_all.data(), nv), d02 = tl_max_diff(k2.data(), k0.data(), nv);
        CHECK(m2 < m_base, "%s lead 2 k 32: mean |logit - every-channel refined cpu logit| %.4g, not below the unrefined "
              "cuda logits' %.4g (lead 0: %.4g): the lead's refinement does not help", refine, m2, m_base, m0);
        CHECK(d02 > LEAD_TOL, "%s lead 2 k 32: logits within %.3g of lead 0's: the launch did not use the lead's "
              "channels", refine, d02);
        /* with lag 2 too, through the captured graph: the eager steps' tokens */
        p.cuda_lag = 2;
        CHECK(spx_model_refine(mg, &p) == SPX_OK, "%s: cuda refine lead 2 lag 2: %s", refine, spx_model_error(mg));
        CHECK(steps(sg, ids, n, kg, V), "%s: cuda steps lead 2 lag 2: %s", trdc, spx_session_error(sg));
        const double mg2 = tl_mean_diff(kg.data(), ref_all.data(), nv);
        CHECK(mg2 < m_base, "%s lead 2 lag 2 k 32: mean |logit - every-channel refined| %.4g, not below the unrefined's "
              "%.4g", refine, mg2, m_base);
        spx_session_reset(sg);
        int same = 0;
        for (int t = 0; t + 1 < n; t++) {
            int32_t ng = -1;
            CHECK(spx_session_step_greedy(sg, ids[t], &ng) == SPX_OK, "cuda greedy lead 2 lag 2: %s", spx_session_error(sg));
            same += ng == argmax_f(kg.data() + (size_t)t * V, V);
        }
        CHECK(same == n - 1, "%s lead 2 lag 2 k 32: graph steps chose the eager steps' token %d of %d", refine, same, n - 1);
        printf("e2e %s k 32 mean |diff| to every-channel refined: unrefined %.4g, lead 0 %.4g, lead 2 %.4g (max vs lead 0 "
               "%.3g), lead 2 lag 2 %.4g; graph = eager %d/%d\n", refine, m_base, m0, m2, d02, mg2, same, n - 1);
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
    test_staged();
    for (int i = 1; i + 1 < argc; i += 2) test_model(argv[i], argv[i + 1]);
    return tl_finish("test_cuda_refine");
}
