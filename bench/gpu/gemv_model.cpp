/* gemv_model.cpp: a CPU model of the tensor-core GEMV (gemv_q4_mma in
 * src/cuda/gemv_q4.cu) for machines without a GPU: the same input image
 * (digits, steps, sums), the same lane/item/tile walk, the int8 MMA
 * evaluated from the PTX m16n8k32 fragment layout (A: a[0] = A[gid][4 tig..],
 * a[1] = A[gid+8][..], a[2] = A[gid][16 + 4 tig..], a[3] = A[gid+8][16 + ..];
 * B: b[0] = B[4 tig..][gid], b[1] = B[16 + 4 tig..][gid]; C: c[0..1] =
 * C[gid][2 tig..], c[2..3] = C[gid+8][..]) and the same float32 operation
 * order, checked against test_cuda's reference and tolerance on its GEMV
 * shapes (smaller row counts). Keep it in step with the kernel when either
 * changes; it caught mapping mistakes (a wrong B lane or zero nibble fails
 * by 100x the tolerance) before any device time was spent.
 *
 *   make BUILD=build-x all   # for libspectra.a and testlib.o
 *   g++ -O2 -std=c++17 -Iinclude -Isrc -Itests -o /tmp/gemv_model bench/gpu/gemv_model.cpp \
 *       build-x/tests/testlib.o build-x/libspectra.a -lcjson -lpcre2-8 -lutf8proc -lz -lm -lpthread -ldl
 */
extern "C" {
#include "core/half.h"
#include "cpu/ops.h"
#include "quant/g32.h"
#include "testlib.h"
}
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

static uint64_t g_rng = 0xc0da5eedULL;
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    uint64_t v = ((uint64_t)y << 32) | x; uint32_t r = 0;
    for (int i = 0; i < 4; i++) { int sel = (s >> (4 * i)) & 7; r |= (uint32_t)((v >> (8 * sel)) & 0xff) << (8 * i); }
    return r;
}
static uint32_t dig_lo(uint32_t u0, uint32_t u1, uint32_t u2, uint32_t u3) {
    uint32_t t01 = byte_perm(u0, u1, 0x5140), t23 = byte_perm(u2, u3, 0x5140);
    return byte_perm(t01, t23, 0x5410) ^ 0x80808080u;
}
static uint32_t dig_hi(uint32_t u0, uint32_t u1, uint32_t u2, uint32_t u3) {
    uint32_t t01 = byte_perm(u0, u1, 0x5140), t23 = byte_perm(u2, u3, 0x5140);
    return byte_perm(t01, t23, 0x7632);
}
static float h2f(uint16_t h) { return spx_f16_to_f32(h); }

struct Mat { int64_t rows, cols; int ng, zrow, n_out; const uint8_t *codes; const uint16_t *scales; const uint8_t *zeros; const int32_t *oidx; const uint16_t *oval; };
enum { STORE = 0, SWIGLU = 2 };

// y per matrix
static void emu(const std::vector<Mat> &w, int mode, const float *x, const float *gain, float eps,
                const std::vector<const float *> &bias, std::vector<std::vector<float>> &y, int n_sm, int P) {
    const int WARPS = 8;
    const int cols = (int)w[0].cols, ng = cols / 32, n_items = (ng + 3) / 4, niw = (n_items + WARPS - 1) / WARPS + ((n_items + WARPS - 1) / WARPS & 1);
    int64_t start[4] = {0, 0, 0, 0};
    int n_mats = (int)w.size();
    for (int i = 0; i < 3; i++) start[i + 1] = i < n_mats ? start[i] + w[i].rows : INT64_MAX;
    int64_t total = start[n_mats];
    int out_off[3] = {0, 0, 0}, n_out_tot = 0, n_out_max = 0;
    for (int i = 0; i < n_mats; i++) { out_off[i] = n_out_tot; n_out_tot += w[i].n_out; n_out_max = std::max(n_out_max, w[i].n_out); }
    bool swiglu = mode == SWIGLU;
    int64_t n_tiles = swiglu ? (w[0].rows + 7) / 8 : (total + 15) / 16;
    int64_t G = std::min<int64_t>(n_tiles, (int64_t)n_sm * 2);
    auto gm_row = [&](int64_t tile, int i, int &m, int64_t &rr) -> bool {
        if (swiglu) { rr = tile * 8 + (i & 7); m = i >> 3; bool ok = rr < w[0].rows; if (!ok) rr = 0; return ok; }
        int64_t gr = tile * 16 + i; bool ok = gr < total;
        m = ok ? (int)(gr >= start[1]) + (int)(gr >= start[2]) : 0; rr = ok ? gr - start[m] : 0; return ok;
    };
    y.assign(n_mats, {});
    for (int i = 0; i < n_mats; i++) y[i].assign(w[i].rows, NAN);
    // image (identical in every block)
    std::vector<uint8_t> img((size_t)n_items * 4 * 64, 0xcd);
    std::vector<int32_t> metaS(n_items * 4), metaB(n_items * 4);
    double ss = 0;
    for (int g = 0; g < n_items * 4; g++) {
        float v[4][8];
        uint32_t mb = 0;
        for (int ww = 0; ww < 4; ww++) for (int e = 0; e < 8; e++) {
            int c = 32 * g + (e < 4 ? 4 * ww + e : 16 + 4 * ww + e - 4);
            float xv = 0;
            if (g < ng) { xv = x[c]; if (gain) { ss += (double)xv * xv; xv = xv * gain[c]; } }
            v[ww][e] = xv; mb = std::max(mb, f2u(xv) & 0x7fffffffu);
        }
        int E = std::max((int)(mb >> 23) - 126, -100);
        float c = u2f((uint32_t)(141 - E) << 23), S = u2f((uint32_t)(113 + E) << 23);
        if (mb >= 0x7f800000u) S = NAN;
        int sx = 0;
        for (int ww = 0; ww < 4; ww++) {
            uint32_t u[8];
            for (int e = 0; e < 8; e++) u[e] = f2u(fmaf(v[ww][e], c, 12583040.0f));
            uint32_t su = 0; for (int e = 0; e < 8; e++) su += u[e];
            sx += (int)(su - 8u * 0x4B400080u);
            uint32_t *gi = (uint32_t *)(img.data() + g * 64 + ww * 8);
            gi[0] = dig_lo(u[0], u[1], u[2], u[3]); gi[1] = dig_lo(u[4], u[5], u[6], u[7]);
            gi[8] = dig_hi(u[0], u[1], u[2], u[3]); gi[9] = dig_hi(u[4], u[5], u[6], u[7]);
        }
        metaS[g] = (int32_t)f2u(S); metaB[g] = -sx;
    }
    std::vector<float> xo(n_out_tot);
    for (int m = 0; m < n_mats; m++) for (int j = 0; j < w[m].n_out; j++) { int c = w[m].oidx[j]; float v = x[c]; if (gain) v *= gain[c]; xo[out_off[m] + j] = v; }
    float inv = gain ? (float)(1.0 / sqrt(ss / cols + (double)eps)) : 1.0f;
    const int sl = 32 * niw;
    for (int64_t b = 0; b < G; b++) {
        for (int64_t tile = b; tile < n_tiles; tile += G) {
            float red[8][16];
            for (int wp = 0; wp < WARPS; wp++) {
                float tot0[32], tot1[32];
                for (int l = 0; l < 32; l++) tot0[l] = tot1[l] = 0;
                for (int cj = 0; cj < niw; cj++) {
                    int item = wp * niw + cj, bi = item < n_items ? item : n_items - 1;
                    uint32_t A[32][4], B[32][2];
                    uint32_t C0[32][4], C1[32][4], S0[32], S1[32], Z0[32], Z1[32], O0[32], O1[32];
                    for (int l = 0; l < 32; l++) {
                        int t = l & 3, r = l >> 2, g = item * 4 + t;
                        // issue
                        int m0, m1; int64_t rr0, rr1;
                        bool ok0 = gm_row(tile, r, m0, rr0), ok1 = gm_row(tile, r + 8, m1, rr1);
                        int no0 = ok0 ? w[m0].n_out : 0, no1 = ok1 ? w[m1].n_out : 0;
                        memset(C0[l], 0, 16); memset(C1[l], 0, 16); S0[l] = S1[l] = Z0[l] = Z1[l] = O0[l] = O1[l] = 0;
                        bool in = g < ng;
                        if (in && ok0) { memcpy(C0[l], w[m0].codes + rr0 * (cols / 2) + g * 16, 16); S0[l] = w[m0].scales[rr0 * ng + g]; Z0[l] = w[m0].zeros[rr0 * w[m0].zrow + (g >> 1)]; }
                        if (in && ok1) { memcpy(C1[l], w[m1].codes + rr1 * (cols / 2) + g * 16, 16); S1[l] = w[m1].scales[rr1 * ng + g]; Z1[l] = w[m1].zeros[rr1 * w[m1].zrow + (g >> 1)]; }
                        if (g < no0) O0[l] = w[m0].oval[rr0 * w[m0].n_out + g];
                        if (g < no1) O1[l] = w[m1].oval[rr1 * w[m1].n_out + g];
                    }
                    int D[32][4];
                    for (int l = 0; l < 32; l++) memset(D[l], 0, 16);
                    for (int mm = 0; mm < 4; mm++) {
                        for (int l = 0; l < 32; l++) {
                            int t = l & 3, r = l >> 2;
                            A[l][0] = C0[l][mm] & 0x0f0f0f0fu; A[l][1] = C1[l][mm] & 0x0f0f0f0fu;
                            A[l][2] = (C0[l][mm] >> 4) & 0x0f0f0f0fu; A[l][3] = (C1[l][mm] >> 4) & 0x0f0f0f0fu;
                            bool bval = t == (r >> 1);
                            const uint32_t *bp = bval ? (const uint32_t *)(img.data() + (bi * 4 + t) * 64 + (r & 1) * 32) : nullptr;
                            B[l][0] = bp ? bp[mm * 2] : 0; B[l][1] = bp ? bp[mm * 2 + 1] : 0;
                        }
                        // full matrices per PTX layout
                        int Am[16][32], Bm[32][8];
                        for (int l = 0; l < 32; l++) {
                            int gid = l >> 2, tig = l & 3;
                            for (int i = 0; i < 16; i++) {
                                int reg = i >> 2, byte = i & 3;
                                int8_t v = (int8_t)((A[l][reg] >> (8 * byte)) & 0xff);
                                int row = (i < 4 || (i >= 8 && i < 12)) ? gid : gid + 8;
                                int col = tig * 4 + (i & 3) + (i >= 8 ? 16 : 0);
                                Am[row][col] = v;
                            }
                            for (int i = 0; i < 8; i++) {
                                int8_t v = (int8_t)((B[l][i >> 2] >> (8 * (i & 3))) & 0xff);
                                int row = tig * 4 + (i & 3) + (i >= 4 ? 16 : 0);
                                Bm[row][gid] = v;
                            }
                        }
                        for (int l = 0; l < 32; l++) {
                            int gid = l >> 2, tig = l & 3;
                            for (int q = 0; q < 4; q++) {
                                int row = q < 2 ? gid : gid + 8, col = tig * 2 + (q & 1);
                                int acc = 0; for (int kk = 0; kk < 32; kk++) acc += Am[row][kk] * Bm[kk][col];
                                D[l][q] += acc;
                            }
                        }
                    }
                    for (int l = 0; l < 32; l++) {
                        int t = l & 3, r = l >> 2, g = item * 4 + t, zsh = (t & 1) * 4;
                        int32_t mS = metaS[bi * 4 + t], mB = metaB[bi * 4 + t];
                        int i0 = D[l][0] + D[l][1] * 256 + (int)((Z0[l] >> zsh) & 15u) * mB;
                        int i1 = D[l][2] + D[l][3] * 256 + (int)((Z1[l] >> zsh) & 15u) * mB;
                        float S = u2f((uint32_t)mS);
                        tot0[l] = fmaf(h2f((uint16_t)S0[l]) * S, (float)i0, tot0[l]);
                        tot1[l] = fmaf(h2f((uint16_t)S1[l]) * S, (float)i1, tot1[l]);
                        int m0, m1; int64_t rr0, rr1;
                        bool ok0 = gm_row(tile, r, m0, rr0), ok1 = gm_row(tile, r + 8, m1, rr1);
                        int no0 = ok0 ? w[m0].n_out : 0, no1 = ok1 ? w[m1].n_out : 0;
                        if (g < no0) tot0[l] = fmaf(h2f((uint16_t)O0[l]), xo[out_off[m0] + g], tot0[l]);
                        if (g < no1) tot1[l] = fmaf(h2f((uint16_t)O1[l]), xo[out_off[m1] + g], tot1[l]);
                    }
                }
                // finish
                for (int l = 0; l < 32; l++) {
                    int t = l & 3, r = l >> 2;
                    if (n_out_max > sl) {
                        int m0, m1; int64_t rr0, rr1;
                        bool ok0 = gm_row(tile, r, m0, rr0), ok1 = gm_row(tile, r + 8, m1, rr1);
                        int no0 = ok0 ? w[m0].n_out : 0, no1 = ok1 ? w[m1].n_out : 0;
                        for (int j = sl + wp * 4 + t; j < no0; j += 32) tot0[l] = fmaf(h2f(w[m0].oval[rr0 * w[m0].n_out + j]), xo[out_off[m0] + j], tot0[l]);
                        for (int j = sl + wp * 4 + t; j < no1; j += 32) tot1[l] = fmaf(h2f(w[m1].oval[rr1 * w[m1].n_out + j]), xo[out_off[m1] + j], tot1[l]);
                    }
                }
                for (int o = 1; o <= 2; o <<= 1) {
                    float n0[32], n1[32];
                    for (int l = 0; l < 32; l++) { n0[l] = tot0[l] + tot0[l ^ o]; n1[l] = tot1[l] + tot1[l ^ o]; }
                    memcpy(tot0, n0, sizeof n0); memcpy(tot1, n1, sizeof n1);
                }
                for (int l = 0; l < 32; l += 4) { red[wp][l >> 2] = tot0[l]; red[wp][(l >> 2) + 8] = tot1[l]; }
            }
            float v[16];
            for (int i = 0; i < 16; i++) { float s = 0; for (int wp = 0; wp < WARPS; wp++) s += red[wp][i]; v[i] = s * inv; }
            for (int i = 0; i < 16; i++) {
                int m; int64_t rr;
                bool ok = gm_row(tile, i, m, rr);
                if (!ok) continue;
                if (swiglu) {
                    if (i >= 8) continue;
                    float gt = v[i], up = v[i + 8];
                    if (bias[0]) gt += bias[0][rr];
                    if (bias[1]) up += bias[1][rr];
                    y[0][rr] = gt / (1.0f + expf(-gt)) * up;
                } else {
                    float vv = v[i];
                    if (bias[m]) vv += bias[m][rr];
                    y[m][rr] = vv;
                }
            }
        }
    }
}

struct qmat { spx_qbuf b; Mat d; std::vector<float> wabs; };
static std::vector<float> rand_vec(size_t n, float scale) { std::vector<float> v(n); for (auto &x : v) x = scale * tl_rand_normal(&g_rng); return v; }
static void make_qmat(qmat &m, int64_t rows, int64_t cols, int64_t n_out) {
    std::vector<int32_t> idx;
    for (int64_t c = 0; c < cols && (int64_t)idx.size() < n_out; c++)
        if ((int64_t)(tl_rand_u64(&g_rng) % (uint64_t)cols) < n_out * 2 || cols - c <= n_out - (int64_t)idx.size()) idx.push_back((int32_t)c);
    n_out = (int64_t)idx.size();
    spx_err e; spx_err_clear(&e);
    if (spx_qbuf_init(&m.b, rows, cols, 4, 32, n_out ? idx.data() : NULL, n_out, &e) != SPX_OK) { fprintf(stderr, "qbuf\n"); exit(1); }
    std::vector<float> w(cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) w[c] = 0.05f * tl_rand_normal(&g_rng) + (c % 7 == 0 ? 0.02f : 0.0f);
        for (int64_t j = 0; j < n_out; j++) w[idx[j]] = 0.8f * tl_rand_normal(&g_rng);
        spx_qbuf_set_row(&m.b, r, w.data(), SPX_Q_MINMAX, NULL);
    }
    const spx_qtensor *q = &m.b.q;
    Mat &d = m.d; d.rows = rows; d.cols = cols; d.ng = (int)(cols / 32); d.zrow = (d.ng + 1) / 2; d.n_out = (int)n_out;
    d.codes = q->codes; d.scales = q->scales; d.zeros = q->zeros; d.oidx = q->outlier_idx; d.oval = q->outlier_val;
    m.wabs.resize((size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *cr = q->codes + r * (cols / 2), *zr = q->zeros + r * d.zrow;
        const uint16_t *sr = q->scales + r * d.ng;
        for (int64_t c = 0; c < cols; c++) { int g = (int)(c / 32); float s = spx_f16_to_f32(sr[g]); m.wabs[r * cols + c] = s * (float)(spx_q_code_get(cr, c, 4, 32) + spx_q_zero_get(zr, g)); }
        for (int64_t j = 0; j < n_out; j++) m.wabs[r * cols + idx[j]] += fabsf(spx_f16_to_f32(q->outlier_val[r * n_out + j]));
    }
}
static void gemv_ref(const qmat &m, const float *x, const float *bias, std::vector<double> &y, std::vector<double> &bound) {
    int64_t rows = m.b.q.rows, cols = m.b.q.cols;
    y.assign(rows, 0); bound.assign(rows, 0);
    for (int64_t r = 0; r < rows; r++) {
        y[r] = (double)spx_q_dot_row(&m.b.q, r, x) + (bias ? bias[r] : 0.0);
        double b = 0; for (int64_t c = 0; c < cols; c++) b += (double)m.wabs[r * cols + c] * fabs(x[c]);
        bound[r] = 3e-5 * b + 1e-6 + (bias ? 1e-7 * fabs(bias[r]) : 0.0);
    }
}
static int check(const char *what, const float *got, const double *ref, const double *tol, size_t n) {
    double worst = 0; size_t wi = 0; int bad = 0;
    for (size_t i = 0; i < n; i++) { double d = fabs((double)got[i] - ref[i]); if (!(d <= tol[i])) bad++; double ratio = isnan(got[i]) ? INFINITY : d / tol[i]; if (ratio > worst || isnan(got[i])) { worst = ratio; wi = i; } }
    printf("%-40s bad %d/%zu worst %.3f x tol (got %.7g ref %.7g)\n", what, bad, n, worst, got[wi], ref[wi]);
    return bad;
}
int main(int argc, char **argv) {
    int fails = 0;
    struct { int64_t rows, cols, n_out; } shapes[] = {{64, 128, 0}, {100, 352, 5}, {333, 4096, 41}, {512, 4096, 41}, {200, 14336, 143}, {5, 64, 3}, {300, 2048, 20}, {40, 1024, 200}};
    for (auto &sh : shapes) for (int norm = 0; norm < 2; norm++) {
        qmat m; make_qmat(m, sh.rows, sh.cols, sh.n_out);
        std::vector<float> x = rand_vec(sh.cols, 1.5f), bias = rand_vec(sh.rows, 0.1f), gain = rand_vec(sh.cols, 0.3f);
        for (auto &g : gain) g += 1.0f;
        std::vector<float> xr = x;
        if (norm) spx_cpu_rmsnorm(xr.data(), x.data(), gain.data(), sh.cols, 1e-5f);
        std::vector<double> ref, tol; gemv_ref(m, xr.data(), bias.data(), ref, tol);
        std::vector<std::vector<float>> y;
        emu({m.d}, STORE, x.data(), norm ? gain.data() : NULL, 1e-5f, {bias.data()}, y, 132, 4);
        char what[128]; snprintf(what, sizeof what, "store %lldx%lld out %lld norm %d", (long long)sh.rows, (long long)sh.cols, (long long)sh.n_out, norm);
        fails += check(what, y[0].data(), ref.data(), tol.data(), sh.rows);
    }
    { // merged
        int64_t cols = 4096, rows[3] = {520, 136, 100}, nout[3] = {41, 0, 17};
        qmat m[3]; std::vector<float> x = rand_vec(cols, 1.0f), gain = rand_vec(cols, 0.2f); for (auto &g : gain) g += 1.0f;
        std::vector<float> xr(x); spx_cpu_rmsnorm(xr.data(), x.data(), gain.data(), cols, 1e-6f);
        std::vector<Mat> ws; std::vector<std::vector<float>> bias(3); std::vector<const float *> bp;
        for (int i = 0; i < 3; i++) { make_qmat(m[i], rows[i], cols, nout[i]); bias[i] = rand_vec(rows[i], 0.1f); ws.push_back(m[i].d); bp.push_back(i == 1 ? NULL : bias[i].data()); }
        std::vector<std::vector<float>> y; emu(ws, STORE, x.data(), gain.data(), 1e-6f, bp, y, 132, 4);
        for (int i = 0; i < 3; i++) { std::vector<double> ref, tol; gemv_ref(m[i], xr.data(), bp[i], ref, tol); char w[64]; snprintf(w, 64, "merged %d", i); fails += check(w, y[i].data(), ref.data(), tol.data(), rows[i]); }
    }
    for (int64_t rows : {1000, 353}) { // swiglu
        int64_t cols = 4096; qmat g, u; make_qmat(g, rows, cols, 41); make_qmat(u, rows, cols, 7);
        std::vector<float> x = rand_vec(cols, 1.0f), bg = rand_vec(rows, 0.1f), bu = rand_vec(rows, 0.1f);
        std::vector<std::vector<float>> y; emu({g.d, u.d}, SWIGLU, x.data(), NULL, 0, {bg.data(), bu.data()}, y, 132, 4);
        std::vector<double> rg, tg, ru, tu, ref(rows), tol(rows);
        gemv_ref(g, x.data(), bg.data(), rg, tg); gemv_ref(u, x.data(), bu.data(), ru, tu);
        for (int64_t r = 0; r < rows; r++) { double gg = rg[r], sg = gg / (1 + exp(-gg)); ref[r] = sg * ru[r]; tol[r] = 1.1 * fabs(ru[r]) * tg[r] + fabs(sg) * tu[r] + 1e-6 * fabs(ref[r]) + 1e-7; }
        fails += check("swiglu", y[0].data(), ref.data(), tol.data(), rows);
    }
    printf("fails %d\n", fails);
    return fails != 0;
}
