/* test_cuda_ssm.cu: the recurrent blocks' device operations (cuda/ssm.cuh)
 * against the CPU reference (cpu/ssm.h with the scalar kernels, and
 * engine/forward.c's loops written out here).
 *
 *   test_cuda_ssm
 *
 * Every function on fresh random inputs (fixed seeds), outputs poisoned
 * with NaN before each launch, rows with padding that must stay untouched:
 *   conv_causal: K 1, 2, 3, 4, 8, with and without bias and silu, n = 1
 *       and 37 tokens from a random incoming state, C = 300 (not a multiple
 *       of the block); outputs and final state against spx_cpu_conv_causal
 *       (bit-identical without silu), in place (y == x), and split into
 *       calls of 1 + 5 + 31 tokens (bit-identical to one call).
 *   ssd_step / ssd_scan: H 8 and 48, P 32 and 64, N 16 and 128, G 1 and 2,
 *       T 1, 5, 64, 300, plus shapes that leave lanes and rows idle (N 1, 8,
 *       20, 33, 256; P 7, 12, 20) and T = 600 (three shared-memory tiles);
 *       inputs laid out as one projection row per token [x | B | C | dt |
 *       NaN pad] (the engine's views), a random incoming state, the dt
 *       clamp exercised (dt_lo 1e-3 on heads built to fall under it, the
 *       softplus threshold, dt_hi 0.1). The sequential scan (no scratch):
 *       one call against T calls of spx_cpu_ssd_step and against
 *       spx_cpu_ssd_chunked, outputs and final state; T calls of
 *       spx_cu_ssd_step and the scan split into T1 + T2 tokens must equal
 *       one call bit for bit. The scan with scratch (chunked for T > L =
 *       SPX_MEM_SSD_CHUNK, scratch poisoned): bit-identical to the
 *       sequential one for T <= L; above, against the CPU's step chain and
 *       the device's T steps, outputs and final state, the same bits on a
 *       second run, and split into T1 + T2 chunked calls.
 *   ssd chunked: T L-1, L, L+1, 3L+5, 512 (the engine's batch) for N 16, 64,
 *       128 with G 2, 3, 4, and shapes whose tiles are partial (P 80: a
 *       second, partial block of rows; N 48: a partial step of 32 state
 *       values in the correction; N 1, 20, 33, 200, 256: every instance of
 *       the chunk kernel with idle lanes; P 7, 9, 12: idle rows).
 *   rmsnorm_gated: gs = n and n / 4, n 1536 and 200, strided y and z, in
 *       place (out == y) and not, against spx_cpu_rmsnorm_gated.
 *   shortconv_gates, mul_rows, relu2, axpy, scale: bit-identical to the
 *       CPU's loops; swiglu_fused within a few ulps.
 *   graph: one CUDA graph capturing every function, replayed: bit-identical
 *       to the same calls launched directly.
 * Prints every measured error; exits 0 with a note when no CUDA device is
 * present. Tolerances are the named constants below. */
#include "cuda/ssm.cuh"

#include "cuda/cutest.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "cpu/ssm.h"
#include "cpu/ssm_internal.h"
#include "engine/memory.h"
#include "engine/session.h" /* SPX_BATCH_MAX_CUDA */
#include "testlib.h"
}

#define ULP 5.9604644775390625e-08 /* 2^-24 */

/* conv with silu: the pre-activation equals the CPU's bit for bit (same
 * products and sums in the same order, no FMA), so only silu differs:
 * CUDA's expf is within 2 ulps (glibc's within 1), then 1 + e and the
 * division: under 6 ulps of |y| on either side; 16 allowed. */
#define CONV_SILU_TOL_REL (16 * ULP)

/* SSD: errors are measured against mag, the same recurrence run in double
 * on |x|, |B|, |C|, |D|, |S0| (the sum of the absolute values of every term
 * of a value: the scale its rounding errors are relative to, even where
 * the value cancels), as tests/test_ssm.c does. One CPU evaluation stays
 * within ssd_cpu_tol (test_ssm.c's bound: N roundings of the dot, L of a
 * chunk's sums, 4 per step of the recurrence, 16 for the constant parts).
 * The device: at most N roundings for the dot as well (N / W partial sums
 * per lane, then log2 W butterfly steps), and up to 8 per step: its dt is
 * within ~4 ulps (CUDA's expf 2, log1pf 1, against glibc's < 1 each), its
 * a = exp(dt A) within ~4 more relative to the decayed state, the fused
 * a S + dt x B one rounding. Comparing two evaluations allows the sum of
 * their bounds. Random-walk growth keeps the observed error far below
 * (the worst is printed). */
static double ssd_cpu_tol(int64_t N, int64_t L, int64_t T) { return ULP * (double)(N + L + 4 * T + 16); }
static double ssd_gpu_tol(int64_t N, int64_t T) { return ULP * (double)(N + 8 * T + 16); }
/* The chunked scan (ssm.cu): token t of chunk c > 0 is y_loc_t (the
 * sequential scan from zero over the chunk: within ssd_gpu_tol(N, L) of
 * its own magnitude, which the total's bounds) plus cum_t (C_t . E), the
 * incoming state E within the chained bound of the t0 tokens before it
 * (8 per step as the sequential scan, and per chunk one rounding of the
 * fused carry d E + E_c and up to L of the running product d), cum_t
 * within L more roundings, the dot over N N more, the product and the
 * add 2 more. So N + 8 T + 16 as the sequential bound, plus N (the second
 * dot), L (cum), 2 + L per chunk; n_chunks counted with one to spare
 * (a split into two calls cuts one chunk in two). */
static double ssd_gpu_chunked_tol(int64_t N, int64_t T) {
    const int64_t L = SPX_MEM_SSD_CHUNK, nc = (T + L - 1) / L + 1;
    return ULP * (double)(2 * N + 8 * T + L + (L + 2) * nc + 16);
}

/* gated norm: each side within tests/test_ssm.c's NORM_TOL_REL (2e-6, ~32
 * ulps of |out|) of the exact value (CUDA's expf adds at most 2 ulps to the
 * silu, inside that bound; the double sums of squares differ only by
 * reordering), so their difference within the sum of the two. */
#define NORM_TOL_REL 4e-6
/* swiglu: expf (2 ulps on the device, 1 on the CPU), the sum, the division
 * and the product: a few ulps each side; 2e-6 is ~32 ulps (test_cuda.cu's
 * ELEM_TOL_REL). */
#define SWIGLU_TOL_REL 2e-6

static uint64_t g_rng = 0x55d5eed0ULL;
static cudaStream_t g_st;

static void up(float *d, const std::vector<float> &h) {
    if (!h.empty()) CK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
}
/* NaN floats (all bits set). g_st is a blocking stream: it is ordered
 * after these legacy-stream memsets and copies. */
static void poison(float *d, size_t n) { CK(cudaMemset(d, 0xff, n * 4)); }
static std::vector<float> down(const float *d, size_t n) {
    std::vector<float> h(n);
    CK(cudaStreamSynchronize(g_st));
    if (n) CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}
static void sync_check(void) {
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(g_st));
}

static std::vector<float> rand_vec(size_t n, float scale) {
    std::vector<float> v(n);
    for (auto &x : v) x = scale * tl_rand_normal(&g_rng);
    return v;
}
static float urand(float lo, float hi) { return lo + (hi - lo) * tl_rand_uniform(&g_rng); }

static int same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }
static int n_diff_bits(const float *a, const float *b, size_t n) {
    int d = 0;
    for (size_t i = 0; i < n; i++) d += !same_bits(a[i], b[i]);
    return d;
}
static int is_poison(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u == 0xffffffffu;
}
/* elements [cols, ld) of each of `rows` rows that are no longer poison */
static int pad_written(const float *v, int64_t ld, int64_t rows, int64_t cols) {
    int n = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = cols; c < ld; c++) n += !is_poison(v[r * ld + c]);
    return n;
}

/* ======================================================================
 * conv
 * ==================================================================== */

static void test_conv(void) {
    const int C = 300;
    const int64_t ldx = C + 3, ldy = C + 2;
    const int Ks[] = {1, 2, 3, 4, 8};
    int cases = 0;
    double worst = 0;
    for (int K : Ks)
        for (int with_b = 0; with_b < 2; with_b++)
            for (int silu = 0; silu < 2; silu++)
                for (int n : {1, 37}) {
                    cases++;
                    const int Hk = K - 1;
                    std::vector<float> x = rand_vec((size_t)(n * ldx), 1.0f), w = rand_vec((size_t)C * K, 0.5f),
                                       b = rand_vec((size_t)C, 0.3f), s0 = rand_vec((size_t)C * Hk, 1.0f);
                    const float *bp = with_b ? b.data() : NULL;
                    /* CPU */
                    std::vector<float> yc((size_t)(n * ldy), 0.0f), sc = s0;
                    spx_cpu_conv_causal(x.data(), ldx, n, C, w.data(), bp, K, sc.data(), silu, yc.data(), ldy);
                    /* device, y separate */
                    float *dx = dev_up(x.data(), x.size()), *dw = dev_up(w.data(), w.size());
                    float *db = with_b ? dev_up(b.data(), b.size()) : NULL;
                    float *ds = dev_up(s0.data(), s0.size()), *dy = dev_alloc<float>((size_t)(n * ldy));
                    poison(dy, (size_t)(n * ldy));
                    CK(spx_cu_conv_causal(dx, ldx, n, C, dw, db, K, ds, silu, dy, ldy, g_st));
                    std::vector<float> yg = down(dy, (size_t)(n * ldy)), sg = down(ds, s0.size());
                    int bad = 0;
                    for (int t = 0; t < n; t++)
                        for (int c = 0; c < C; c++) {
                            const float g = yg[t * ldy + c], r = yc[t * ldy + c];
                            if (!silu) {
                                bad += !same_bits(g, r);
                                continue;
                            }
                            const double q = fabs((double)g - r) / (CONV_SILU_TOL_REL * fabs((double)r) + 1e-30);
                            if (!(q <= 1)) bad++;
                            if (q > worst || q != q) worst = q != q ? INFINITY : q;
                        }
                    char what[96];
                    snprintf(what, sizeof what, "conv K=%d b=%d silu=%d n=%d", K, with_b, silu, n);
                    CHECK(bad == 0, "%s: %d outputs off the CPU's (%s)", what, bad, silu ? "tolerance" : "bit-exact");
                    CHECK(pad_written(yg.data(), ldy, n, C) == 0, "%s: padding of y written", what);
                    CHECK(n_diff_bits(sg.data(), sc.data(), sc.size()) == 0, "%s: final state differs from the CPU's",
                          what);
                    /* in place: y == x, ldy == ldx */
                    float *dxy = dev_up(x.data(), x.size()), *ds2 = dev_up(s0.data(), s0.size());
                    CK(spx_cu_conv_causal(dxy, ldx, n, C, dw, db, K, ds2, silu, dxy, ldx, g_st));
                    std::vector<float> xy = down(dxy, x.size()), s2 = down(ds2, s0.size());
                    int bad_al = 0, pad_al = 0;
                    for (int t = 0; t < n; t++) {
                        bad_al += n_diff_bits(xy.data() + t * ldx, yg.data() + t * ldy, (size_t)C);
                        pad_al += n_diff_bits(xy.data() + t * ldx + C, x.data() + t * ldx + C, (size_t)(ldx - C));
                    }
                    CHECK(bad_al == 0 && pad_al == 0, "%s: in place: %d outputs differ, %d padding values changed",
                          what, bad_al, pad_al);
                    CHECK(n_diff_bits(s2.data(), sc.data(), sc.size()) == 0, "%s: in place: final state differs", what);
                    /* split into calls of 1 + 5 + 31 tokens */
                    if (n == 37) {
                        float *ds3 = dev_up(s0.data(), s0.size()), *dy3 = dev_alloc<float>((size_t)(n * ldy));
                        poison(dy3, (size_t)(n * ldy));
                        const int parts[3][2] = {{0, 1}, {1, 5}, {6, 31}};
                        for (auto &pt : parts)
                            CK(spx_cu_conv_causal(dx + pt[0] * ldx, ldx, pt[1], C, dw, db, K, ds3, silu,
                                                  dy3 + pt[0] * ldy, ldy, g_st));
                        std::vector<float> y3 = down(dy3, (size_t)(n * ldy)), s3 = down(ds3, s0.size());
                        CHECK(n_diff_bits(y3.data(), yg.data(), y3.size()) == 0 &&
                                  n_diff_bits(s3.data(), sg.data(), sg.size()) == 0,
                              "%s: split calls 1 + 5 + 31 differ from one call", what);
                    }
                    dev_free_all();
                }
    printf("conv: %d cases (K 1,2,3,4,8; bias; silu; n 1, 37 from a random state; in place; split); without silu "
           "bit-exact, with silu worst err / bound %.3f\n",
           cases, worst);
}

/* ======================================================================
 * SSD
 * ==================================================================== */

/* clamp modes: 0 none; 1 dt_lo = 1e-3 with even heads' dt_bias -12
 * (softplus(raw - 12) < e^-11 < 1e-3 for raw <= 1: clamped every token)
 * and head 1's dt_bias 25 (above softplus's threshold of 20); 2 dt_hi =
 * 0.1 (every head with softplus > 0.1 clamped). */
struct ssd_data {
    spx_ssd_args a;
    int64_t ld, T;
    std::vector<float> proj, A_log, D, dt_bias, S0;
    int64_t offB() const { return a.H * a.P; }
    int64_t offC() const { return offB() + a.G * a.N; }
    int64_t offdt() const { return offC() + a.G * a.N; }
};

static void ssd_make(ssd_data &d, int64_t H, int64_t P, int64_t N, int64_t G, int64_t T, int clamp) {
    d.a = spx_ssd_args{};
    d.a.H = H, d.a.P = P, d.a.N = N, d.a.G = G;
    d.a.dt_lo = clamp == 1 ? 1e-3f : 0.0f;
    d.a.dt_hi = clamp == 2 ? 0.1f : INFINITY;
    d.T = T;
    d.ld = H * P + 2 * G * N + H + 3;
    d.proj.assign((size_t)(T * d.ld), NAN); /* the pad is never read: a read spreads NaN */
    for (int64_t t = 0; t < T; t++) {
        float *row = d.proj.data() + t * d.ld;
        for (int64_t i = 0; i < H * P + 2 * G * N; i++) row[i] = tl_rand_normal(&g_rng);
        for (int64_t h = 0; h < H; h++) row[d.offdt() + h] = urand(-4.0f, 1.0f);
    }
    d.A_log.resize((size_t)H), d.D.resize((size_t)H), d.dt_bias.resize((size_t)H);
    for (int64_t h = 0; h < H; h++) {
        d.A_log[h] = urand(-1.0f, 2.0f);
        d.D[h] = tl_rand_normal(&g_rng);
        d.dt_bias[h] = urand(-2.0f, 2.0f);
        if (clamp == 1) d.dt_bias[h] = h % 2 == 0 ? -12.0f : h == 1 ? 25.0f : d.dt_bias[h];
    }
    d.S0 = rand_vec((size_t)(H * P * N), 0.5f);
    d.a.A_log = d.A_log.data(), d.a.D = d.D.data(), d.a.dt_bias = d.dt_bias.data();
}

static double softplus_d(double v) { return v > 20.0 ? v : log1p(exp(v)); }

/* The recurrence in double on absolute values: Smag [H P N], Ymag [T, H
 * P] dense. Also counts the (token, head) steps the clamp changes. */
static void ssd_mag(const ssd_data &d, std::vector<double> &Smag, std::vector<double> &Ymag, int &n_lo, int &n_hi,
                    int &n_thr) {
    const int64_t H = d.a.H, P = d.a.P, N = d.a.N, hpg = H / d.a.G, HP = H * P;
    Smag.resize(d.S0.size());
    Ymag.assign((size_t)(d.T * HP), 0.0);
    for (size_t i = 0; i < d.S0.size(); i++) Smag[i] = fabs((double)d.S0[i]);
    n_lo = n_hi = n_thr = 0;
    for (int64_t t = 0; t < d.T; t++) {
        const float *row = d.proj.data() + t * d.ld;
        for (int64_t h = 0; h < H; h++) {
            const float *B = row + d.offB() + (h / hpg) * N, *C = row + d.offC() + (h / hpg) * N;
            const double v = (double)row[d.offdt() + h] + d.dt_bias[h];
            double dt = softplus_d(v);
            n_thr += v > 20.0;
            if (dt < d.a.dt_lo) dt = d.a.dt_lo, n_lo++;
            if (dt > d.a.dt_hi) dt = d.a.dt_hi, n_hi++;
            const double da = exp(dt * -exp((double)d.A_log[h]));
            for (int64_t p = 0; p < P; p++) {
                double *Sp = Smag.data() + (h * P + p) * N, acc = 0.0;
                const double xv = fabs((double)row[h * P + p]);
                for (int64_t n = 0; n < N; n++) {
                    Sp[n] = da * Sp[n] + dt * xv * fabs((double)B[n]);
                    acc += Sp[n] * fabs((double)C[n]);
                }
                Ymag[t * HP + h * P + p] = acc + fabs((double)d.D[h]) * xv;
            }
        }
    }
}

/* worst |got - ref| / (tol mag) over rows x cols (got and ref rows ld
 * apart, mag dense); NaN is infinitely bad. */
static double ssd_ratio(const float *got, const float *ref, int64_t ld, const double *mag, int64_t rows, int64_t cols,
                        double tol) {
    double worst = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const double e = fabs((double)got[r * ld + c] - (double)ref[r * ld + c]);
            const double q = e / (tol * mag[r * cols + c] + 1e-30);
            if (!(q <= worst)) worst = q != q ? INFINITY : q;
        }
    return worst;
}

struct ssd_dev {
    float *proj, *state, *y;
    spx_cu_ssd a;
};

/* tokens [t0, t0 + n) in one scan call; work NULL: the sequential scan */
static void gpu_scan(const ssd_data &d, const ssd_dev &g, int64_t ldy, int64_t t0, int64_t n, float *work = NULL,
                     size_t work_floats = 0) {
    const float *r = g.proj + t0 * d.ld;
    CK(spx_cu_ssd_scan(g.a, r, r + d.offdt(), r + d.offB(), r + d.offC(), d.ld, (int)n, g.state, g.y + t0 * ldy, ldy,
                       work, work_floats, g_st));
}

struct ssd_stats {
    int cases, chunked;
    double vs_loop, vs_chunk, ch_vs_loop, ch_vs_steps, ch_split;
};

static void ssd_case(int64_t H, int64_t P, int64_t N, int64_t G, int64_t T, int clamp, ssd_stats &stt) {
    ssd_data d;
    ssd_make(d, H, P, N, G, T, clamp);
    const int64_t HP = H * P, hpn = HP * N, ldy = HP + 5, chunk = 64;
    char what[128];
    snprintf(what, sizeof what, "ssd H%lld P%lld N%lld G%lld T%lld clamp %d", (long long)H, (long long)P, (long long)N,
             (long long)G, (long long)T, clamp);

    std::vector<double> Smag, Ymag;
    int n_lo, n_hi, n_thr;
    ssd_mag(d, Smag, Ymag, n_lo, n_hi, n_thr);
    if (clamp == 1)
        CHECK(n_lo == (int)(T * ((H + 1) / 2)) && n_thr == (int)T, "%s: the data do not exercise dt_lo (%d) / the threshold (%d)",
              what, n_lo, n_thr);
    if (clamp == 2) CHECK(n_hi > 0, "%s: the data do not exercise dt_hi", what);

    /* CPU: T calls of spx_cpu_ssd_step, and the chunked scan */
    std::vector<float> Sl = d.S0, yl((size_t)(T * ldy), NAN);
    for (int64_t t = 0; t < T; t++) {
        const float *r = d.proj.data() + t * d.ld;
        spx_cpu_ssd_step(&d.a, r, r + d.offdt(), r + d.offB(), r + d.offC(), Sl.data(), yl.data() + t * ldy);
    }
    std::vector<float> Sc = d.S0, yc((size_t)(T * ldy), NAN), work((size_t)spx_ssd_chunked_work(&d.a, chunk));
    spx_cpu_ssd_chunked(&d.a, d.proj.data(), d.proj.data() + d.offdt(), d.proj.data() + d.offB(),
                        d.proj.data() + d.offC(), d.ld, T, chunk, Sc.data(), yc.data(), ldy, work.data());

    /* device: one scan call */
    ssd_dev g;
    g.proj = dev_up(d.proj.data(), d.proj.size());
    g.state = dev_up(d.S0.data(), d.S0.size());
    g.y = dev_alloc<float>((size_t)(T * ldy));
    g.a.H = (int)H, g.a.P = (int)P, g.a.N = (int)N, g.a.G = (int)G;
    g.a.A_log = dev_up(d.A_log.data(), d.A_log.size());
    g.a.D = dev_up(d.D.data(), d.D.size());
    g.a.dt_bias = dev_up(d.dt_bias.data(), d.dt_bias.size());
    g.a.dt_lo = d.a.dt_lo, g.a.dt_hi = d.a.dt_hi;
    poison(g.y, (size_t)(T * ldy));
    gpu_scan(d, g, ldy, 0, T);
    std::vector<float> ys = down(g.y, (size_t)(T * ldy)), Ss = down(g.state, (size_t)hpn);

    const double tl = ssd_gpu_tol(N, T) + ssd_cpu_tol(N, 0, T);
    const double tc = ssd_gpu_tol(N, T) + ssd_cpu_tol(N, chunk < T ? chunk : T, T);
    const double ry = ssd_ratio(ys.data(), yl.data(), ldy, Ymag.data(), T, HP, tl),
                 rs = ssd_ratio(Ss.data(), Sl.data(), 0, Smag.data(), 1, hpn, tl);
    const double cy = ssd_ratio(ys.data(), yc.data(), ldy, Ymag.data(), T, HP, tc),
                 cs = ssd_ratio(Ss.data(), Sc.data(), 0, Smag.data(), 1, hpn, tc);
    CHECK(ry <= 1 && rs <= 1, "%s: scan vs spx_cpu_ssd_step x T: y %.3g, state %.3g of the bound", what, ry, rs);
    CHECK(cy <= 1 && cs <= 1, "%s: scan vs spx_cpu_ssd_chunked (chunk %lld): y %.3g, state %.3g of the bound", what,
          (long long)chunk, cy, cs);
    CHECK(pad_written(ys.data(), ldy, T, HP) == 0, "%s: scan wrote y's padding", what);

    /* device: T calls of spx_cu_ssd_step, bit-identical to the scan */
    up(g.state, d.S0);
    poison(g.y, (size_t)(T * ldy));
    for (int64_t t = 0; t < T; t++) {
        const float *r = g.proj + t * d.ld;
        CK(spx_cu_ssd_step(g.a, r, r + d.offdt(), r + d.offB(), r + d.offC(), g.state, g.y + t * ldy, g_st));
    }
    std::vector<float> yt = down(g.y, (size_t)(T * ldy)), St = down(g.state, (size_t)hpn);
    const int dy = n_diff_bits(yt.data(), ys.data(), yt.size()), ds = n_diff_bits(St.data(), Ss.data(), St.size());
    CHECK(dy == 0 && ds == 0, "%s: T steps differ from one scan in %d outputs, %d state values", what, dy, ds);

    /* device: the scan split into T1 + T2 tokens, state carried */
    int split_ok = -1;
    if (T >= 2) {
        const int64_t T1 = T / 3 > 0 ? T / 3 : 1;
        up(g.state, d.S0);
        poison(g.y, (size_t)(T * ldy));
        gpu_scan(d, g, ldy, 0, T1);
        gpu_scan(d, g, ldy, T1, T - T1);
        std::vector<float> y2 = down(g.y, (size_t)(T * ldy)), S2 = down(g.state, (size_t)hpn);
        const int d2 = n_diff_bits(y2.data(), ys.data(), y2.size()), e2 = n_diff_bits(S2.data(), Ss.data(), S2.size());
        CHECK(d2 == 0 && e2 == 0, "%s: scan of %lld + %lld tokens differs from one call in %d outputs, %d state values",
              what, (long long)T1, (long long)(T - T1), d2, e2);
        split_ok = d2 == 0 && e2 == 0;
    }
    /* device: the scan with scratch, the scratch poisoned (a read of an
     * unwritten value spreads NaN) */
    const int64_t L = SPX_MEM_SSD_CHUNK;
    const size_t wf = spx_mem_ssd_work_floats(H, P, N, T);
    float *dwork = dev_alloc<float>(wf + 1);
    up(g.state, d.S0);
    poison(g.y, (size_t)(T * ldy));
    poison(dwork, wf + 1);
    gpu_scan(d, g, ldy, 0, T, dwork, wf);
    std::vector<float> yw = down(g.y, (size_t)(T * ldy)), Sw = down(g.state, (size_t)hpn);
    char chunked[160];
    if (T <= L) {
        const int dyw = n_diff_bits(yw.data(), ys.data(), yw.size()), dsw = n_diff_bits(Sw.data(), Ss.data(), Sw.size());
        CHECK(dyw == 0 && dsw == 0, "%s: with scratch (one chunk) differs from the sequential scan in %d outputs, %d "
              "state values", what, dyw, dsw);
        snprintf(chunked, sizeof chunked, "with scratch = sequential %s", dyw == 0 && dsw == 0 ? "yes" : "NO");
    } else {
        const double tq = ssd_gpu_chunked_tol(N, T);
        const double qy = ssd_ratio(yw.data(), yl.data(), ldy, Ymag.data(), T, HP, tq + ssd_cpu_tol(N, 0, T)),
                     qs = ssd_ratio(Sw.data(), Sl.data(), 0, Smag.data(), 1, hpn, tq + ssd_cpu_tol(N, 0, T));
        const double gy = ssd_ratio(yw.data(), yt.data(), ldy, Ymag.data(), T, HP, tq + ssd_gpu_tol(N, T)),
                     gs = ssd_ratio(Sw.data(), St.data(), 0, Smag.data(), 1, hpn, tq + ssd_gpu_tol(N, T));
        CHECK(qy <= 1 && qs <= 1, "%s: chunked scan vs spx_cpu_ssd_step x T: y %.3g, state %.3g of the bound", what, qy,
              qs);
        CHECK(gy <= 1 && gs <= 1, "%s: chunked scan vs spx_cu_ssd_step x T: y %.3g, state %.3g of the bound", what, gy,
              gs);
        CHECK(pad_written(yw.data(), ldy, T, HP) == 0, "%s: chunked scan wrote y's padding", what);
        /* the same bits on a second run */
        up(g.state, d.S0);
        poison(g.y, (size_t)(T * ldy));
        poison(dwork, wf + 1);
        gpu_scan(d, g, ldy, 0, T, dwork, wf);
        std::vector<float> yr = down(g.y, (size_t)(T * ldy)), Sr = down(g.state, (size_t)hpn);
        const int dr = n_diff_bits(yr.data(), yw.data(), yr.size()) + n_diff_bits(Sr.data(), Sw.data(), Sr.size());
        CHECK(dr == 0, "%s: a second chunked scan differs from the first in %d values", what, dr);
        /* split into T1 + T2 calls with scratch, state carried (the first
         * part sequential when T1 <= L) */
        const int64_t T1 = T / 3 + 1;
        up(g.state, d.S0);
        poison(g.y, (size_t)(T * ldy));
        poison(dwork, wf + 1);
        gpu_scan(d, g, ldy, 0, T1, dwork, wf);
        gpu_scan(d, g, ldy, T1, T - T1, dwork, wf);
        std::vector<float> y2 = down(g.y, (size_t)(T * ldy)), S2 = down(g.state, (size_t)hpn);
        const double py = ssd_ratio(y2.data(), yl.data(), ldy, Ymag.data(), T, HP, tq + ssd_cpu_tol(N, 0, T)),
                     ps = ssd_ratio(S2.data(), Sl.data(), 0, Smag.data(), 1, hpn, tq + ssd_cpu_tol(N, 0, T));
        CHECK(py <= 1 && ps <= 1, "%s: chunked scan of %lld + %lld tokens vs spx_cpu_ssd_step x T: y %.3g, state %.3g of "
              "the bound", what, (long long)T1, (long long)(T - T1), py, ps);
        snprintf(chunked, sizeof chunked, "chunked vs cpu steps y %.4f state %.4f, vs device steps y %.4f state %.4f, "
                 "split %.4f; rerun same %s", qy, qs, gy, gs, py > ps ? py : ps, dr == 0 ? "yes" : "NO");
        stt.chunked++;
        stt.ch_vs_loop = fmax(stt.ch_vs_loop, fmax(qy, qs));
        stt.ch_vs_steps = fmax(stt.ch_vs_steps, fmax(gy, gs));
        stt.ch_split = fmax(stt.ch_split, fmax(py, ps));
    }
    printf("  %s: vs cpu steps y %.4f state %.4f, vs chunked y %.4f state %.4f of the bound; steps = scan %s; "
           "split %s; %s; clamped lo %d hi %d, threshold %d\n",
           what, ry, rs, cy, cs, dy == 0 && ds == 0 ? "yes" : "NO", split_ok < 0 ? "-" : split_ok ? "yes" : "NO",
           chunked, n_lo, n_hi, n_thr);
    stt.cases++;
    if (ry > stt.vs_loop) stt.vs_loop = ry;
    if (rs > stt.vs_loop) stt.vs_loop = rs;
    if (cy > stt.vs_chunk) stt.vs_chunk = cy;
    if (cs > stt.vs_chunk) stt.vs_chunk = cs;
    dev_free_all();
}

static void test_ssd(void) {
    ssd_stats st = {};
    static const int64_t Ts[] = {1, 5, 64, 300};
    struct shape {
        int64_t H, P, N, G;
    };
    static const shape shapes[] = {{8, 32, 16, 1}, {8, 64, 128, 2}, {48, 64, 128, 1}, {48, 32, 16, 2}};
    int k = 0;
    for (const shape &s : shapes)
        for (int64_t T : Ts) ssd_case(s.H, s.P, s.N, s.G, T, k++ % 3, st); /* the clamp modes in turn */
    /* idle lanes and rows: N below 32 and not a power of two (W = 32, 12
     * lanes idle), N = 33 (2 values per lane, 31 lanes idle on the second),
     * N = 8 (W = 8, 16 rows per block, P = 20: 12 idle rows), N = 1 (W = 1),
     * N = 256 (8 per lane); P = 7, 12 (partial blocks); 3 and 5 groups */
    ssd_case(6, 12, 20, 3, 45, 1, st);
    ssd_case(5, 7, 33, 5, 29, 0, st);
    ssd_case(3, 20, 8, 1, 17, 2, st);
    ssd_case(4, 9, 1, 2, 13, 1, st);
    ssd_case(2, 8, 256, 1, 20, 0, st);
    /* three shared-memory tiles of dt (256 + 256 + 88) */
    ssd_case(8, 32, 16, 1, 600, 1, st);
    /* the chunked scan around its chunk length, and the engine's batch */
    const int64_t L = SPX_MEM_SSD_CHUNK;
    const int64_t Tc[] = {L - 1, L, L + 1, 3 * L + 5, SPX_BATCH_MAX_CUDA};
    static const shape cshapes[] = {{8, 64, 16, 2}, {12, 64, 64, 3}, {16, 64, 128, 4}, {4, 80, 48, 2}};
    for (const shape &s : cshapes)
        for (int64_t T : Tc) ssd_case(s.H, s.P, s.N, s.G, T, k++ % 3, st);
    /* every instance of step 1 (N <= 16, 32, 64, 128, 256) with idle rows
     * and lanes: N 20 (P 12 of a warp's 32 rows), 33, 200 (two float4s per
     * lane, the second partial), 256, 1 */
    ssd_case(6, 12, 20, 3, 2 * L + 9, 0, st);
    ssd_case(5, 7, 33, 5, 2 * L + 7, 1, st);
    ssd_case(3, 20, 200, 1, 2 * L + 5, 2, st);
    ssd_case(2, 8, 256, 1, 2 * L + 3, 1, st);
    ssd_case(4, 9, 1, 2, 2 * L + 1, 2, st);
    printf("ssd: %d cases; worst err / bound: sequential scan vs cpu steps %.4f, vs cpu chunked %.4f; %d chunked "
           "cases: vs cpu steps %.4f, vs device steps %.4f, split in two calls %.4f\n",
           st.cases, st.vs_loop, st.vs_chunk, st.chunked, st.ch_vs_loop, st.ch_vs_steps, st.ch_split);
}

/* ======================================================================
 * gated norm
 * ==================================================================== */

static void test_norm(void) {
    double worst = 0;
    int cases = 0;
    for (int n : {1536, 200})
        for (int gs : {n, n / 4})
            for (int in_place = 0; in_place < 2; in_place++) {
                cases++;
                const int n_tok = 5;
                const int64_t ldy = in_place ? n : n + 7, ldz = 3 * (int64_t)n + 11;
                const float eps = gs == n ? 1e-5f : 1e-6f;
                std::vector<float> y = rand_vec((size_t)(n_tok * ldy), 2.0f), z = rand_vec((size_t)(n_tok * ldz), 2.0f),
                                   w((size_t)n);
                for (auto &v : w) v = 1.0f + 0.2f * tl_rand_normal(&g_rng);
                std::vector<float> ref((size_t)(n_tok * n));
                for (int t = 0; t < n_tok; t++)
                    spx_cpu_rmsnorm_gated(ref.data() + t * n, y.data() + t * ldy, z.data() + t * ldz, w.data(), n, gs,
                                          eps);
                float *dy = dev_up(y.data(), y.size()), *dz = dev_up(z.data(), z.size()), *dw = dev_up(w.data(), w.size());
                float *dout = in_place ? dy : dev_alloc<float>((size_t)(n_tok * n));
                if (!in_place) poison(dout, (size_t)(n_tok * n));
                CK(spx_cu_rmsnorm_gated(dout, dy, ldy, dz, ldz, dw, n_tok, n, gs, eps, g_st));
                std::vector<float> out = down(dout, (size_t)(n_tok * n));
                int bad = 0;
                for (size_t i = 0; i < out.size(); i++) {
                    const double q = fabs((double)out[i] - ref[i]) / (NORM_TOL_REL * fabs((double)ref[i]) + 1e-30);
                    if (!(q <= 1)) bad++;
                    if (q > worst || q != q) worst = q != q ? INFINITY : q;
                }
                CHECK(bad == 0, "gated norm n %d gs %d in place %d: %d values off the CPU's", n, gs, in_place, bad);
                dev_free_all();
            }
    printf("gated norm: %d cases (n 1536, 200; gs n, n/4; in place and not), worst err / bound %.3f\n", cases, worst);
}

/* ======================================================================
 * elementwise
 * ==================================================================== */

static void test_elementwise(void) {
    /* shortconv gates: proj [n, 3H], B *= u; C and u untouched */
    {
        const int n = 5, H = 300;
        std::vector<float> p = rand_vec((size_t)n * 3 * H, 1.0f), ref = p;
        for (int t = 0; t < n; t++)
            for (int i = 0; i < H; i++) ref[(size_t)t * 3 * H + i] *= ref[(size_t)t * 3 * H + 2 * H + i];
        float *dp = dev_up(p.data(), p.size());
        CK(spx_cu_shortconv_gates(dp, n, H, g_st));
        std::vector<float> got = down(dp, p.size());
        CHECK(n_diff_bits(got.data(), ref.data(), ref.size()) == 0, "shortconv_gates: differs from the CPU's loop");
    }
    /* mul_rows: out = C * y with C, y views into proj rows (stride 3H), out
     * dense; and out aliasing a */
    {
        const int n = 7, H = 333;
        const int64_t R = 3 * (int64_t)H;
        std::vector<float> p = rand_vec((size_t)(n * R), 1.0f), ref((size_t)n * H);
        for (int t = 0; t < n; t++)
            for (int i = 0; i < H; i++) ref[(size_t)t * H + i] = p[t * R + H + i] * p[t * R + i];
        float *dp = dev_up(p.data(), p.size()), *dout = dev_alloc<float>((size_t)n * H + 64);
        poison(dout, (size_t)n * H + 64);
        CK(spx_cu_mul_rows(dp + H, R, dp, R, n, H, dout, H, g_st));
        std::vector<float> got = down(dout, (size_t)n * H + 64);
        int tail = 0;
        for (int i = 0; i < 64; i++) tail += !is_poison(got[(size_t)n * H + i]);
        CHECK(n_diff_bits(got.data(), ref.data(), ref.size()) == 0 && tail == 0,
              "mul_rows: differs from the CPU's loop (or %d values past the end written)", tail);
        CK(spx_cu_mul_rows(dp + H, R, dp, R, n, H, dp + H, R, g_st)); /* in place into C's slot */
        std::vector<float> got2 = down(dp, p.size());
        int bad = 0;
        for (int t = 0; t < n; t++) {
            bad += n_diff_bits(got2.data() + t * R + H, ref.data() + (size_t)t * H, (size_t)H);
            bad += n_diff_bits(got2.data() + t * R, p.data() + t * R, (size_t)H);
            bad += n_diff_bits(got2.data() + t * R + 2 * H, p.data() + t * R + 2 * H, (size_t)H);
        }
        CHECK(bad == 0, "mul_rows in place: %d values differ", bad);
    }
    /* relu2: bit-exact, NaN -> 0 as the CPU's comparison */
    {
        const int64_t n = 100003;
        std::vector<float> x = rand_vec((size_t)n, 3.0f);
        x[5] = 0.0f, x[6] = -0.0f, x[7] = NAN, x[8] = INFINITY, x[9] = -INFINITY;
        std::vector<float> ref = x;
        for (auto &v : ref) {
            const float r = v > 0 ? v : 0;
            v = r * r;
        }
        float *dx = dev_up(x.data(), x.size());
        CK(spx_cu_relu2(dx, n, g_st));
        std::vector<float> got = down(dx, (size_t)n);
        CHECK(n_diff_bits(got.data(), ref.data(), ref.size()) == 0, "relu2: %d values differ from the CPU's",
              n_diff_bits(got.data(), ref.data(), ref.size()));
    }
    /* swiglu fused: gu [n_tok, 2I] -> out [n_tok, I] */
    {
        const int n_tok = 7, I = 1000;
        std::vector<float> gu = rand_vec((size_t)n_tok * 2 * I, 3.0f), ref((size_t)n_tok * I);
        for (int t = 0; t < n_tok; t++)
            for (int i = 0; i < I; i++) {
                const float g = gu[(size_t)t * 2 * I + i];
                ref[(size_t)t * I + i] = g / (1.0f + expf(-g)) * gu[(size_t)t * 2 * I + I + i];
            }
        float *dgu = dev_up(gu.data(), gu.size()), *dout = dev_alloc<float>((size_t)n_tok * I + 64);
        poison(dout, (size_t)n_tok * I + 64);
        CK(spx_cu_swiglu_fused(dgu, n_tok, I, dout, g_st));
        std::vector<float> got = down(dout, (size_t)n_tok * I + 64);
        int bad = 0, tail = 0, exact = 0;
        double worst = 0;
        for (size_t i = 0; i < ref.size(); i++) {
            const double q = fabs((double)got[i] - ref[i]) / (SWIGLU_TOL_REL * fabs((double)ref[i]) + 1e-30);
            if (!(q <= 1)) bad++;
            if (q > worst || q != q) worst = q != q ? INFINITY : q;
            exact += same_bits(got[i], ref[i]);
        }
        for (int i = 0; i < 64; i++) tail += !is_poison(got[ref.size() + i]);
        CHECK(bad == 0 && tail == 0, "swiglu_fused: %d values off the CPU's, %d past the end written", bad, tail);
        printf("swiglu_fused: worst err / bound %.3f, %d of %zu bit-identical to the CPU's\n", worst, exact,
               ref.size());
    }
    /* axpy: h += r x, r = 1 (the common residual) and r = 0.37 */
    for (float r : {1.0f, 0.37f}) {
        const int64_t n = 70001;
        std::vector<float> h = rand_vec((size_t)n, 2.0f), x = rand_vec((size_t)n, 2.0f), ref = h;
        for (int64_t i = 0; i < n; i++) {
            volatile float prod = r * x[i]; /* one rounding each, never fused */
            ref[i] = ref[i] + prod;
        }
        float *dh = dev_up(h.data(), h.size()), *dx = dev_up(x.data(), x.size());
        CK(spx_cu_axpy(dh, dx, n, r, g_st));
        std::vector<float> got = down(dh, (size_t)n);
        CHECK(n_diff_bits(got.data(), ref.data(), ref.size()) == 0, "axpy r=%g: %d values differ from the CPU's", r,
              n_diff_bits(got.data(), ref.data(), ref.size()));
    }
    /* scale: x *= s and x /= s (a true division: counted where it differs
     * from the product with 1 / s, so the check can tell them apart) */
    for (int divide = 0; divide < 2; divide++) {
        const int64_t n = 65537;
        const float s = 3.7f;
        std::vector<float> x = rand_vec((size_t)n, 10.0f), ref = x;
        int recip_differs = 0;
        for (auto &v : ref) {
            const float q = divide ? v / s : v * s;
            if (divide) {
                volatile float inv = 1.0f / s;
                recip_differs += !same_bits(q, v * inv);
            }
            v = q;
        }
        float *dx = dev_up(x.data(), x.size());
        CK(spx_cu_scale(dx, n, s, divide, g_st));
        std::vector<float> got = down(dx, (size_t)n);
        CHECK(n_diff_bits(got.data(), ref.data(), ref.size()) == 0, "scale divide=%d: %d values differ from the CPU's",
              divide, n_diff_bits(got.data(), ref.data(), ref.size()));
        if (divide) printf("scale: x / %g bit-identical to the CPU's (x * (1/s) would differ in %d of %lld)\n", s,
                           recip_differs, (long long)n);
    }
    dev_free_all();
    printf("elementwise: shortconv_gates, mul_rows, relu2, axpy, scale bit-identical to the CPU's loops\n");
}

/* ======================================================================
 * graph capture
 * ==================================================================== */

/* Every function enqueued once on g_st: directly (capture 0) or captured
 * into a graph that is then launched (capture 1); the outputs of both
 * must be bit-identical. Beginning a global-mode capture makes any
 * synchronizing or allocating call inside the functions an error. */
struct chain_bufs {
    float *cx, *cw, *cb, *cs, *cy;              /* conv: in, weights, bias, state, out */
    float *proj, *sstate, *sy, *sy1, *Alog, *D, *bias; /* ssd */
    float *proj2, *sstate2, *sy2, *work2;       /* ssd, chunked: n2 tokens */
    float *z, *nw, *nout;                       /* gated norm */
    float *gu, *go, *h, *lg;                    /* swiglu, axpy, scale, relu2 */
};

#define CHAIN_N2 (2 * SPX_MEM_SSD_CHUNK + 2) /* three chunks */

static std::vector<float> run_chain(const chain_bufs &b, const std::vector<std::vector<float>> &init,
                                    const std::vector<float *> &targets, int capture) {
    const int C = 300, K = 4, n = 9, H = 8, P = 32, N = 16, G = 2, HP = H * P, n2 = CHAIN_N2;
    const int64_t ld = HP + 2 * G * N + H;
    for (size_t i = 0; i < targets.size(); i++) up(targets[i], init[i]);
    spx_cu_ssd a = {H, P, N, G, b.Alog, b.D, b.bias, 1e-3f, INFINITY};
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CK(cudaStreamSynchronize(g_st));
    if (capture) CK(cudaStreamBeginCapture(g_st, cudaStreamCaptureModeGlobal));
    CK(spx_cu_conv_causal(b.cx, C, n, C, b.cw, b.cb, K, b.cs, 1, b.cy, C, g_st));
    CK(spx_cu_ssd_scan(a, b.proj, b.proj + HP + 2 * G * N, b.proj + HP, b.proj + HP + G * N, ld, n - 1, b.sstate, b.sy,
                       HP, NULL, 0, g_st));
    CK(spx_cu_ssd_scan(a, b.proj2, b.proj2 + HP + 2 * G * N, b.proj2 + HP, b.proj2 + HP + G * N, ld, n2, b.sstate2,
                       b.sy2, HP, b.work2, spx_mem_ssd_work_floats(H, P, N, n2), g_st));
    const float *last = b.proj + (n - 1) * ld;
    CK(spx_cu_ssd_step(a, last, last + HP + 2 * G * N, last + HP, last + HP + G * N, b.sstate, b.sy1, g_st));
    CK(spx_cu_rmsnorm_gated(b.nout, b.sy, HP, b.z, HP, b.nw, n - 1, HP, HP / 4, 1e-5f, g_st));
    CK(spx_cu_rmsnorm_gated(b.sy, b.sy, HP, b.z, HP, b.nw, n - 1, HP, HP, 1e-5f, g_st));
    CK(spx_cu_shortconv_gates(b.cx, 3, 100, g_st));
    CK(spx_cu_mul_rows(b.cx, C, b.cy, C, n, C, b.cy, C, g_st));
    CK(spx_cu_swiglu_fused(b.gu, 3, 500, b.go, g_st));
    CK(spx_cu_relu2(b.go, 1500, g_st));
    CK(spx_cu_axpy(b.h, b.go, 1500, 0.5f, g_st));
    CK(spx_cu_scale(b.lg, 1000, 3.0f, 1, g_st));
    CK(spx_cu_scale(b.lg, 1000, 0.7f, 0, g_st));
    if (capture) {
        CK(cudaStreamEndCapture(g_st, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaGraphLaunch(exec, g_st));
    }
    sync_check();
    if (capture) {
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
    }
    std::vector<float> all;
    for (size_t i = 0; i < targets.size(); i++) {
        std::vector<float> v = down(targets[i], init[i].size());
        all.insert(all.end(), v.begin(), v.end());
    }
    return all;
}

static void test_graph(void) {
    const int C = 300, K = 4, n = 9, H = 8, P = 32, N = 16, G = 2, HP = H * P, n2 = CHAIN_N2;
    const int64_t ld = HP + 2 * G * N + H;
    chain_bufs b;
    std::vector<std::vector<float>> init;
    std::vector<float *> targets;
    auto buf = [&](float **p, size_t sz, float scale) {
        init.push_back(rand_vec(sz, scale));
        *p = dev_alloc<float>(sz);
        targets.push_back(*p);
    };
    buf(&b.cx, (size_t)n * C, 1.0f);
    buf(&b.cw, (size_t)C * K, 0.5f);
    buf(&b.cb, (size_t)C, 0.3f);
    buf(&b.cs, (size_t)C * (K - 1), 1.0f);
    buf(&b.cy, (size_t)n * C, 1.0f);
    buf(&b.proj, (size_t)(n * ld), 1.0f);
    buf(&b.sstate, (size_t)HP * N, 0.5f);
    buf(&b.sy, (size_t)(n - 1) * HP, 1.0f);
    buf(&b.sy1, (size_t)HP, 1.0f);
    buf(&b.Alog, (size_t)H, 0.5f);
    buf(&b.D, (size_t)H, 1.0f);
    buf(&b.bias, (size_t)H, 1.0f);
    buf(&b.proj2, (size_t)(n2 * ld), 1.0f);
    buf(&b.sstate2, (size_t)HP * N, 0.5f);
    buf(&b.sy2, (size_t)n2 * HP, 1.0f);
    buf(&b.work2, spx_mem_ssd_work_floats(H, P, N, n2), 1.0f);
    buf(&b.z, (size_t)(n - 1) * HP, 2.0f);
    buf(&b.nw, (size_t)HP, 0.2f);
    buf(&b.nout, (size_t)(n - 1) * HP, 1.0f);
    buf(&b.gu, 3000, 2.0f);
    buf(&b.go, 1500, 1.0f);
    buf(&b.h, 1500, 1.0f);
    buf(&b.lg, 1000, 5.0f);
    std::vector<float> direct = run_chain(b, init, targets, 0), graphed = run_chain(b, init, targets, 1);
    int nan = 0;
    for (float v : direct) nan += v != v;
    CHECK(direct.size() == graphed.size() && n_diff_bits(direct.data(), graphed.data(), direct.size()) == 0,
          "graph: the captured chain differs from direct launches in %d values",
          n_diff_bits(direct.data(), graphed.data(), direct.size()));
    CHECK(nan == 0, "graph: %d NaN values in the chain's results", nan);
    printf("graph: every function captured in one graph; replay bit-identical to direct launches (%zu values)\n",
           direct.size());
    dev_free_all();
}

/* ======================================================================
 * argument checks (nothing launched)
 * ==================================================================== */

static void test_args(void) {
    float *d = dev_alloc<float>(64);
    spx_cu_ssd a = {4, 8, 16, 3, d, d, d, 0.0f, INFINITY}; /* H % G != 0 */
    CHECK(spx_cu_ssd_scan(a, d, d, d, d, 0, 1, d, d, 0, NULL, 0, g_st) == cudaErrorInvalidValue,
          "ssd: H %% G != 0 accepted");
    a.G = 2, a.N = SPX_CU_SSD_MAX_N + 1;
    CHECK(spx_cu_ssd_step(a, d, d, d, d, d, d, g_st) == cudaErrorInvalidValue, "ssd: N too large accepted");
    a.N = 16;
    CHECK(spx_cu_ssd_scan(a, d, d, d, d, 0, 0, d, d, 0, NULL, 0, g_st) == cudaSuccess, "ssd: T = 0 refused");
    /* chunked: scratch smaller than spx_mem_ssd_work_floats refused, nothing launched */
    const int T = SPX_MEM_SSD_CHUNK + 1;
    const size_t need = spx_mem_ssd_work_floats(a.H, a.P, a.N, T);
    CHECK(need > 0 && spx_mem_ssd_work_floats(a.H, a.P, a.N, SPX_MEM_SSD_CHUNK) == 0,
          "ssd: scratch of %zu floats for %d tokens, %zu for one chunk", need, T,
          spx_mem_ssd_work_floats(a.H, a.P, a.N, SPX_MEM_SSD_CHUNK));
    CHECK(spx_cu_ssd_scan(a, d, d, d, d, 0, T, d, d, 0, d, need - 1, g_st) == cudaErrorInvalidValue,
          "ssd: chunked scan with too little scratch accepted");
    CHECK(spx_cu_conv_causal(d, 1, 1, 1, d, NULL, SPX_CU_CONV_MAX_K + 1, d, 0, d, 1, g_st) == cudaErrorInvalidValue,
          "conv: K too large accepted");
    CHECK(spx_cu_conv_causal(d, 1, 1, 1, d, NULL, 0, d, 0, d, 1, g_st) == cudaErrorInvalidValue, "conv: K = 0 accepted");
    CHECK(spx_cu_rmsnorm_gated(d, d, 10, d, 10, d, 1, 10, 3, 1e-5f, g_st) == cudaErrorInvalidValue,
          "gated norm: n %% gs != 0 accepted");
    sync_check();
    dev_free_all();
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("test_cuda_ssm: no CUDA device; skipped\n");
        return 0;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
    setenv("SPECTRA_KERNELS", "scalar", 1); /* the CPU reference: the scalar SSD kernels */
    printf("cpu ssd kernels: %s\n", spx_ssm_kernels_best()->name);
    CK(cudaStreamCreate(&g_st)); /* blocking: ordered with the legacy-stream memsets and copies */
    test_args();
    test_conv();
    test_ssd();
    test_norm();
    test_elementwise();
    test_graph();
    CK(cudaStreamDestroy(g_st));
    return tl_finish("test_cuda_ssm");
}
