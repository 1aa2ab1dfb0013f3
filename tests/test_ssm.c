/* test_ssm.c: the recurrent blocks' CPU operations (cpu/ssm.h) and the
 * SSD kernel tables behind them (cpu/ssm_internal.h).
 *
 * conv: against a direct double-precision evaluation of the definition
 * over the whole sequence from a zero history; the final state must be the
 * last K-1 inputs; the same sequence split into calls of 1, 3 and the rest
 * tokens, and computed in place (y == x), must give bit-identical outputs
 * and state; padding between rows must stay untouched. K = 1..4, with and
 * without bias and silu.
 *
 * SSD: inputs laid out as one projection row per token ([x | B | C | dt]
 * plus padding, the engine's views), a nonzero incoming state. The scalar
 * token loop against a double-precision evaluation of ssm.h's definition;
 * the chunked form of every table (scalar, avx2 where the CPU has it)
 * against the scalar token loop, outputs and final state, over T, chunk,
 * G, P and N; the avx2 token loop against the scalar one. Shapes that are
 * not multiples of 8 exercise the avx2 fallbacks and tails. The clamp of
 * the step (dt_lo, dt_hi) is checked on heads built to fall below / above
 * it, and must leave the other heads bit-identical; softplus's threshold
 * on a head whose dt_bias is 95. The public functions must equal the
 * best table bit for bit, and the best table follow the quantized
 * kernels' choice (SPECTRA_KERNELS).
 *
 * Error measure for the SSD: |got - ref| / (ssd_tol(...) * mag) must be
 * <= 1, where mag is the same recurrence run in double on |x|, |B|, |C|,
 * |D| and |S0| (the decays and dt are positive, so mag is the sum of the
 * absolute values of every term that makes up the value: the scale float
 * rounding is relative to, even where the value itself cancels).
 *
 * gated norm: against a double-precision evaluation, gs = n and n / 4,
 * and in place (out == y) bit-identical. */
#include "testlib.h"

#include "cpu/qkernels.h"
#include "cpu/ssm.h"
#include "cpu/ssm_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* SSD bound: ssd_tol(N, L, T) * mag, a first-order forward-error bound of
 * one float evaluation (either order, fused or not) in units of 2^-24:
 * N roundings for a dot over N, L for a sum over a chunk of L tokens, and
 * per step of the recurrence up to 4 relative to the state's magnitude
 * (the products dt x B and a S, their sum, the rounding of a = exp(dt A)
 * and of dt itself), carried forward by decays <= 1; 16 for the constant
 * parts (softplus, the final D x). Comparing two float evaluations allows
 * the sum of their bounds (2x the larger). Random-walk growth keeps the
 * observed error well under it (the worst seen is printed). */
#define SSD_ULP 5.9604644775390625e-08 /* 2^-24 */
static double ssd_tol(int64_t N, int64_t L, int64_t T) { return SSD_ULP * (double)(N + L + 4 * T + 16); }
/* conv: at most K + 1 <= 5 float additions relative to mag = |b| +
 * sum |w u| plus silu's expf and division relative to |y|: 16 ulps. */
#define CONV_TOL_REL 1e-6
/* gated norm: silu (expf, a division), two products, the float rsqrt
 * factor and the final two products: under 10 roundings relative to
 * |out|; 2e-6 is ~32 ulps. */
#define NORM_TOL_REL 2e-6

static float urand(uint64_t *s, float lo, float hi) { return lo + (hi - lo) * tl_rand_uniform(s); }

static float *falloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static double silu_d(double v) { return v / (1.0 + exp(-v)); }

/* ======================================================================
 * conv
 * ==================================================================== */

static void test_conv(void) {
    uint64_t seed = 1001;
    const int64_t C = 37, n = 23, ldx = C + 3, ldy = C + 2;
    int cases = 0;
    for (int64_t K = 1; K <= 4; K++)
        for (int with_b = 0; with_b < 2; with_b++)
            for (int silu = 0; silu < 2; silu++) {
                cases++;
                const int64_t Hk = K - 1;
                float *x = falloc((size_t)(n * ldx)), *w = falloc((size_t)(C * K)), *b = falloc((size_t)C);
                float *y = falloc((size_t)(n * ldy)), *y2 = falloc((size_t)(n * ldy)), *xy = falloc((size_t)(n * ldx));
                float *st = falloc((size_t)(C * Hk)), *st2 = falloc((size_t)(C * Hk)), *st3 = falloc((size_t)(C * Hk));
                for (int64_t i = 0; i < n * ldx; i++) x[i] = tl_rand_normal(&seed);
                for (int64_t i = 0; i < C * K; i++) w[i] = 0.5f * tl_rand_normal(&seed);
                for (int64_t i = 0; i < C; i++) b[i] = 0.3f * tl_rand_normal(&seed);
                const float *bp = with_b ? b : NULL;
                const float SENT = 12345.0f;
                for (int64_t i = 0; i < n * ldy; i++) y[i] = y2[i] = SENT;
                for (int64_t i = 0; i < C * Hk; i++) st[i] = st2[i] = st3[i] = 0.0f;

                spx_cpu_conv_causal(x, ldx, n, C, w, bp, K, st, silu, y, ldy);

                int bad = 0, pad = 0;
                double worst = 0;
                for (int64_t t = 0; t < n; t++) {
                    for (int64_t c = 0; c < C; c++) {
                        double acc = bp ? bp[c] : 0.0, mag = bp ? fabs(bp[c]) : 0.0;
                        for (int64_t j = 0; j < K; j++) {
                            const int64_t ti = t - Hk + j;
                            const double u = ti >= 0 ? x[ti * ldx + c] : 0.0;
                            acc += (double)w[c * K + j] * u;
                            mag += fabs((double)w[c * K + j] * u);
                        }
                        const double ref = silu ? silu_d(acc) : acc;
                        const double got = y[t * ldy + c];
                        const double r = fabs(got - ref) / (CONV_TOL_REL * (mag + fabs(ref)) + 1e-30);
                        if (!(r <= 1.0)) bad++;
                        if (r > worst) worst = r;
                    }
                    for (int64_t c = C; c < ldy; c++) pad += y[t * ldy + c] != SENT;
                }
                CHECK(bad == 0, "conv K=%lld b=%d silu=%d: %d values off the reference (worst %.3g of bound)",
                      (long long)K, with_b, silu, bad, worst);
                CHECK(pad == 0, "conv K=%lld: %d padding values written", (long long)K, pad);
                int bad_st = 0;
                for (int64_t c = 0; c < C; c++)
                    for (int64_t j = 0; j < Hk; j++) bad_st += st[c * Hk + j] != x[(n - Hk + j) * ldx + c];
                CHECK(bad_st == 0, "conv K=%lld: state is not the last K-1 inputs (%d values)", (long long)K, bad_st);

                /* split 1 + 3 + rest */
                spx_cpu_conv_causal(x, ldx, 1, C, w, bp, K, st2, silu, y2, ldy);
                spx_cpu_conv_causal(x + ldx, ldx, 3, C, w, bp, K, st2, silu, y2 + ldy, ldy);
                spx_cpu_conv_causal(x + 4 * ldx, ldx, n - 4, C, w, bp, K, st2, silu, y2 + 4 * ldy, ldy);
                CHECK(memcmp(y, y2, (size_t)(n * ldy) * sizeof(float)) == 0, "conv K=%lld: split calls differ",
                      (long long)K);
                CHECK(Hk == 0 || memcmp(st, st2, (size_t)(C * Hk) * sizeof(float)) == 0,
                      "conv K=%lld: split calls' state differs", (long long)K);

                /* in place: y == x, ldy == ldx */
                memcpy(xy, x, (size_t)(n * ldx) * sizeof(float));
                spx_cpu_conv_causal(xy, ldx, n, C, w, bp, K, st3, silu, xy, ldx);
                int bad_al = 0;
                for (int64_t t = 0; t < n; t++) {
                    bad_al += memcmp(xy + t * ldx, y + t * ldy, (size_t)C * sizeof(float)) != 0;
                    bad_al += memcmp(xy + t * ldx + C, x + t * ldx + C, (size_t)(ldx - C) * sizeof(float)) != 0;
                }
                CHECK(bad_al == 0, "conv K=%lld: in-place differs in %d rows", (long long)K, bad_al);
                CHECK(Hk == 0 || memcmp(st, st3, (size_t)(C * Hk) * sizeof(float)) == 0,
                      "conv K=%lld: in-place state differs", (long long)K);
                free(x), free(w), free(b), free(y), free(y2), free(xy), free(st), free(st2), free(st3);
            }
    printf("conv: %d cases (K 1..4, bias, silu; split, in place)\n", cases);
}

/* ======================================================================
 * SSD
 * ==================================================================== */

typedef struct ssd_data {
    spx_ssd_args a;
    int64_t ld, T;
    float *proj; /* T rows of ld: x [H P] | B [G N] | C [G N] | dt [H] | pad */
    float *A_log, *D, *dt_bias, *S0;
} ssd_data;

static const float *d_x(const ssd_data *d) { return d->proj; }
static const float *d_B(const ssd_data *d) { return d->proj + d->a.H * d->a.P; }
static const float *d_C(const ssd_data *d) { return d_B(d) + d->a.G * d->a.N; }
static const float *d_dt(const ssd_data *d) { return d_C(d) + d->a.G * d->a.N; }
static int64_t d_hpn(const ssd_data *d) { return d->a.H * d->a.P * d->a.N; }

static void ssd_make(ssd_data *d, int64_t H, int64_t P, int64_t N, int64_t G, int64_t T, uint64_t seed) {
    memset(d, 0, sizeof *d);
    d->a.H = H, d->a.P = P, d->a.N = N, d->a.G = G;
    d->a.dt_lo = 0.0f, d->a.dt_hi = INFINITY;
    d->T = T;
    d->ld = H * P + 2 * G * N + H + 3;
    d->proj = falloc((size_t)(T * d->ld));
    d->A_log = falloc((size_t)H), d->D = falloc((size_t)H), d->dt_bias = falloc((size_t)H);
    d->S0 = falloc((size_t)(H * P * N));
    for (int64_t t = 0; t < T; t++) {
        float *row = d->proj + t * d->ld;
        for (int64_t i = 0; i < H * P + 2 * G * N; i++) row[i] = tl_rand_normal(&seed);
        for (int64_t h = 0; h < H; h++) row[H * P + 2 * G * N + h] = urand(&seed, -4.0f, 1.0f);
        for (int64_t i = H * P + 2 * G * N + H; i < d->ld; i++) row[i] = NAN; /* never read */
    }
    for (int64_t h = 0; h < H; h++) {
        d->A_log[h] = urand(&seed, -1.0f, 2.0f);
        d->D[h] = tl_rand_normal(&seed);
        d->dt_bias[h] = urand(&seed, -2.0f, 2.0f);
    }
    for (int64_t i = 0; i < H * P * N; i++) d->S0[i] = 0.5f * tl_rand_normal(&seed);
    d->a.A_log = d->A_log, d->a.D = d->D, d->a.dt_bias = d->dt_bias;
}

static void ssd_free(ssd_data *d) { free(d->proj), free(d->A_log), free(d->D), free(d->dt_bias), free(d->S0); }

/* ssm.h's definition in double; absolute = 1: on |x|, |B|, |C|, |D|, |S0|
 * (the magnitudes). S [H P N] out, Y [T, H P] dense. */
static void ssd_ref(const ssd_data *d, int absolute, double *S, double *Y) {
    const int64_t H = d->a.H, P = d->a.P, N = d->a.N, hpg = H / d->a.G;
#define AB(v) (absolute ? fabs((double)(v)) : (double)(v))
    for (int64_t i = 0; i < d_hpn(d); i++) S[i] = AB(d->S0[i]);
    for (int64_t t = 0; t < d->T; t++) {
        const float *x = d_x(d) + t * d->ld, *dr = d_dt(d) + t * d->ld;
        for (int64_t h = 0; h < H; h++) {
            const float *B = d_B(d) + t * d->ld + (h / hpg) * N, *C = d_C(d) + t * d->ld + (h / hpg) * N;
            const double v = (double)dr[h] + d->dt_bias[h];
            double dt = v > 20.0 ? v : log1p(exp(v));
            if (dt < d->a.dt_lo) dt = d->a.dt_lo;
            if (dt > d->a.dt_hi) dt = d->a.dt_hi;
            const double da = exp(dt * -exp((double)d->A_log[h]));
            for (int64_t p = 0; p < P; p++) {
                double *Sp = S + (h * P + p) * N, acc = 0.0;
                const double xv = AB(x[h * P + p]);
                for (int64_t n = 0; n < N; n++) {
                    Sp[n] = da * Sp[n] + dt * xv * AB(B[n]);
                    acc += Sp[n] * AB(C[n]);
                }
                Y[t * H * P + h * P + p] = acc + AB(d->D[h]) * xv;
            }
        }
    }
#undef AB
}

static void ssd_loop(const spx_ssm_kernels *k, const ssd_data *d, float *S, float *y, int64_t ldy) {
    memcpy(S, d->S0, (size_t)d_hpn(d) * sizeof(float));
    for (int64_t t = 0; t < d->T; t++)
        spx_ssd_step_with(k, &d->a, d_x(d) + t * d->ld, d_dt(d) + t * d->ld, d_B(d) + t * d->ld,
                          d_C(d) + t * d->ld, S, y + t * ldy);
}

/* The work buffer is an allocation of exactly the stated size (ASan sees
 * a read or write past it). */
static void ssd_chunk(const spx_ssm_kernels *k, const ssd_data *d, int64_t chunk, float *S, float *y, int64_t ldy) {
    memcpy(S, d->S0, (size_t)d_hpn(d) * sizeof(float));
    float *work = malloc((size_t)spx_ssd_chunked_work(&d->a, chunk) * sizeof(float));
    spx_ssd_chunked_with(k, &d->a, d_x(d), d_dt(d), d_B(d), d_C(d), d->ld, d->T, chunk, S, y, ldy, work);
    free(work);
}

/* worst |got - ref| / (tol mag) over rows x cols; got rows ldg apart, ref
 * and mag dense; NaN counts as infinitely bad. */
static double ssd_ratio(const float *got, int64_t ldg, const double *ref, const double *mag, int64_t rows,
                        int64_t cols, double tol) {
    double worst = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const double e = fabs((double)got[r * ldg + c] - ref[r * cols + c]);
            const double q = e / (tol * mag[r * cols + c] + 1e-30);
            if (!(q <= worst)) worst = isnan(q) ? INFINITY : q;
        }
    return worst;
}

static void to_double(const float *f, int64_t ld, int64_t rows, int64_t cols, double *out) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) out[r * cols + c] = f[r * ld + c];
}

static int pad_untouched(const float *y, int64_t ldy, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = cols; c < ldy; c++)
            if (!isnan(y[r * ldy + c])) return 0;
    return 1;
}

typedef struct ssd_stats {
    int cases;
    double loop_vs_ref, chunk_vs_loop[2], avx2_loop;
} ssd_stats;

static void ssd_case(const spx_ssm_kernels *tabs[2], int64_t H, int64_t P, int64_t N, int64_t G, int64_t T,
                     const int64_t *chunks, int nchunks, uint64_t seed, ssd_stats *st) {
    ssd_data d;
    ssd_make(&d, H, P, N, G, T, seed);
    const int64_t HP = H * P, hpn = d_hpn(&d), ldy = HP + 5;
    double *Sref = malloc((size_t)hpn * sizeof(double)), *Yref = malloc((size_t)(T * HP) * sizeof(double));
    double *Smag = malloc((size_t)hpn * sizeof(double)), *Ymag = malloc((size_t)(T * HP) * sizeof(double));
    double *Sl = malloc((size_t)hpn * sizeof(double)), *Yl = malloc((size_t)(T * HP) * sizeof(double));
    float *S = falloc((size_t)hpn), *y = falloc((size_t)(T * ldy));
    ssd_ref(&d, 0, Sref, Yref);
    ssd_ref(&d, 1, Smag, Ymag);
    char what[160];
    snprintf(what, sizeof what, "H%lld P%lld N%lld G%lld T%lld", (long long)H, (long long)P, (long long)N,
             (long long)G, (long long)T);

    /* scalar token loop: the reference of the rest */
    for (int64_t i = 0; i < T * ldy; i++) y[i] = NAN;
    ssd_loop(tabs[0], &d, S, y, ldy);
    double tol = ssd_tol(N, 0, T);
    double r = ssd_ratio(y, ldy, Yref, Ymag, T, HP, tol), rs = ssd_ratio(S, 0, Sref, Smag, 1, hpn, tol);
    CHECK(r <= 1 && rs <= 1, "%s: scalar loop vs double definition: y %.3g, state %.3g of the bound", what, r, rs);
    CHECK(pad_untouched(y, ldy, T, HP), "%s: step wrote padding", what);
    if (r > st->loop_vs_ref) st->loop_vs_ref = r;
    if (rs > st->loop_vs_ref) st->loop_vs_ref = rs;
    to_double(y, ldy, T, HP, Yl);
    to_double(S, 0, 1, hpn, Sl);

    if (tabs[1]) {
        ssd_loop(tabs[1], &d, S, y, ldy);
        tol = 2 * ssd_tol(N, 0, T);
        r = ssd_ratio(y, ldy, Yl, Ymag, T, HP, tol), rs = ssd_ratio(S, 0, Sl, Smag, 1, hpn, tol);
        CHECK(r <= 1 && rs <= 1, "%s: avx2 loop vs scalar loop: y %.3g, state %.3g of the bound", what, r, rs);
        if (r > st->avx2_loop) st->avx2_loop = r;
        if (rs > st->avx2_loop) st->avx2_loop = rs;
    }
    for (int ti = 0; ti < 2; ti++) {
        if (!tabs[ti]) continue;
        for (int ci = 0; ci < nchunks; ci++) {
            for (int64_t i = 0; i < T * ldy; i++) y[i] = NAN;
            ssd_chunk(tabs[ti], &d, chunks[ci], S, y, ldy);
            tol = 2 * ssd_tol(N, chunks[ci] < T ? chunks[ci] : T, T);
            r = ssd_ratio(y, ldy, Yl, Ymag, T, HP, tol), rs = ssd_ratio(S, 0, Sl, Smag, 1, hpn, tol);
            CHECK(r <= 1 && rs <= 1, "%s chunk %lld %s: chunked vs loop: y %.3g, state %.3g of the bound", what,
                  (long long)chunks[ci], tabs[ti]->name, r, rs);
            CHECK(pad_untouched(y, ldy, T, HP), "%s chunk %lld %s: padding written", what, (long long)chunks[ci],
                  tabs[ti]->name);
            if (r > st->chunk_vs_loop[ti]) st->chunk_vs_loop[ti] = r;
            if (rs > st->chunk_vs_loop[ti]) st->chunk_vs_loop[ti] = rs;
            st->cases++;
        }
    }
    free(Sref), free(Yref), free(Smag), free(Ymag), free(Sl), free(Yl), free(S), free(y);
    ssd_free(&d);
}

static void test_ssd(const spx_ssm_kernels *tabs[2]) {
    static const int64_t Ts[] = {1, 5, 64, 100, 257};
    static const int64_t chunks[] = {1, 16, 64, 256};
    ssd_stats st = {0};
    uint64_t seed = 2024;
    for (int64_t G = 1; G <= 2; G++)
        for (int64_t P = 16; P <= 32; P *= 2)
            for (int64_t N = 16; N <= 64; N *= 4)
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
                    ssd_case(tabs, 8, P, N, G, Ts[ti], chunks, 4, seed++, &st);
    /* no fast path (P or N not a multiple of 8: chunk_out needs both,
     * chunk_state N) and the avx2 tails (N % 16 = 8, P % 6 != 0) */
    static const int64_t odd_chunks[] = {1, 7, 32};
    ssd_case(tabs, 6, 12, 20, 3, 45, odd_chunks, 3, seed++, &st);
    ssd_case(tabs, 6, 24, 12, 3, 45, odd_chunks, 3, seed++, &st);
    ssd_case(tabs, 4, 8, 8, 1, 33, odd_chunks, 3, seed++, &st);
    ssd_case(tabs, 4, 20, 24, 2, 45, odd_chunks, 3, seed++, &st); /* avx2 state with a P tail */
    printf("ssd: %d chunked cases; worst err / bound: scalar loop vs double %.3f, chunked vs loop scalar %.3f",
           st.cases, st.loop_vs_ref, st.chunk_vs_loop[0]);
    if (tabs[1]) printf(", avx2 %.3f, avx2 loop vs scalar loop %.3f", st.chunk_vs_loop[1], st.avx2_loop);
    printf("\n");
}

/* Heads 0..3 get dt_bias -12 (softplus(raw - 12) < e^-11 < 1e-3, under
 * dt_lo), heads 4..7 dt_bias +2 (softplus >= softplus(-2) > 0.12, above
 * dt_lo; raw in [-4, 1]). With dt_lo = 1e-3 the first heads must change
 * and match the clamped definition, the others must not change a bit.
 * Then dt_hi = 0.1: every dt of heads 4..7 is above it (> 0.12), so they
 * change; heads 0..3 must not. Last, no clamp and head 0's dt_bias 95:
 * softplus's threshold (v > 20: v) keeps dt finite where log1p(exp(v))
 * overflows float; only head 0 changes. */
static void test_clamp(const spx_ssm_kernels *tabs[2]) {
    const int64_t H = 8, P = 16, N = 16, T = 40, HP = H * P;
    ssd_data d;
    ssd_make(&d, H, P, N, 2, T, 777);
    for (int64_t h = 0; h < H; h++) d.dt_bias[h] = h < 4 ? -12.0f : 2.0f;
    const int64_t hpn = d_hpn(&d);
    float *S0 = falloc((size_t)hpn), *y0 = falloc((size_t)(T * HP));
    float *S1 = falloc((size_t)hpn), *y1 = falloc((size_t)(T * HP));
    double *Sref = malloc((size_t)hpn * sizeof(double)), *Yref = malloc((size_t)(T * HP) * sizeof(double));
    double *Smag = malloc((size_t)hpn * sizeof(double)), *Ymag = malloc((size_t)(T * HP) * sizeof(double));
    ssd_loop(tabs[0], &d, S0, y0, HP);
    for (int pass = 0; pass < 3; pass++) {
        d.a.dt_lo = pass == 0 ? 1e-3f : 0.0f;
        d.a.dt_hi = pass == 1 ? 0.1f : INFINITY;
        if (pass == 2) d.dt_bias[0] = 95.0f;
        ssd_loop(tabs[0], &d, S1, y1, HP);
        int same_bad = 0, changed = 0;
        for (int64_t h = 0; h < H; h++) {
            const int clamped = pass == 0 ? h < 4 : pass == 1 ? h >= 4 : h == 0;
            int diff = 0;
            for (int64_t t = 0; t < T; t++)
                diff += memcmp(y0 + t * HP + h * P, y1 + t * HP + h * P, (size_t)P * sizeof(float)) != 0;
            diff += memcmp(S0 + h * P * N, S1 + h * P * N, (size_t)(P * N) * sizeof(float)) != 0;
            if (clamped) changed += diff == T + 1;
            else same_bad += diff;
        }
        CHECK(changed == (pass == 2 ? 1 : 4), "clamp pass %d: %d clamped heads changed in every token", pass,
              changed);
        CHECK(same_bad == 0, "clamp pass %d: unclamped heads changed (%d rows)", pass, same_bad);
        ssd_ref(&d, 0, Sref, Yref);
        ssd_ref(&d, 1, Smag, Ymag);
        double r = ssd_ratio(y1, HP, Yref, Ymag, T, HP, ssd_tol(N, 0, T)),
               rs = ssd_ratio(S1, 0, Sref, Smag, 1, hpn, ssd_tol(N, 0, T));
        CHECK(r <= 1 && rs <= 1, "clamp pass %d: loop vs clamped definition: y %.3g, state %.3g", pass, r, rs);
        for (int ti = 0; ti < 2; ti++) {
            if (!tabs[ti]) continue;
            float *S2 = falloc((size_t)hpn), *y2 = falloc((size_t)(T * HP));
            ssd_chunk(tabs[ti], &d, 16, S2, y2, HP);
            r = ssd_ratio(y2, HP, Yref, Ymag, T, HP, ssd_tol(N, 16, T)),
            rs = ssd_ratio(S2, 0, Sref, Smag, 1, hpn, ssd_tol(N, 16, T));
            CHECK(r <= 1 && rs <= 1, "clamp pass %d %s: chunked vs clamped definition: y %.3g, state %.3g", pass,
                  tabs[ti]->name, r, rs);
            free(S2), free(y2);
        }
    }
    printf("ssd clamp: dt_lo 1e-3 and dt_hi 0.1 change exactly the heads beyond them; softplus threshold\n");
    free(S0), free(y0), free(S1), free(y1), free(Sref), free(Yref), free(Smag), free(Ymag);
    ssd_free(&d);
}

/* The public functions use the best table and match it bit for bit; the
 * best table follows the quantized kernels' (SPECTRA_KERNELS) choice. */
static void test_dispatch(const spx_ssm_kernels *tabs[2]) {
    const spx_ssm_kernels *best = spx_ssm_kernels_best();
    const int q_scalar = strcmp(spx_qkernels_best()->name, "scalar") == 0;
    CHECK(best == (q_scalar || !tabs[1] ? tabs[0] : tabs[1]), "best table %s with qkernels %s", best->name,
          spx_qkernels_best()->name);
    ssd_data d;
    ssd_make(&d, 4, 16, 16, 2, 70, 99);
    const int64_t hpn = d_hpn(&d), HP = 4 * 16;
    float *S0 = falloc((size_t)hpn), *y0 = falloc((size_t)(70 * HP)), *S1 = falloc((size_t)hpn),
          *y1 = falloc((size_t)(70 * HP));
    float *work = malloc((size_t)spx_ssd_chunked_work(&d.a, 32) * sizeof(float));
    ssd_chunk(best, &d, 32, S0, y0, HP);
    memcpy(S1, d.S0, (size_t)hpn * sizeof(float));
    spx_cpu_ssd_chunked(&d.a, d_x(&d), d_dt(&d), d_B(&d), d_C(&d), d.ld, 70, 32, S1, y1, HP, work);
    CHECK(memcmp(y0, y1, (size_t)(70 * HP) * sizeof(float)) == 0 && memcmp(S0, S1, (size_t)hpn * sizeof(float)) == 0,
          "spx_cpu_ssd_chunked differs from the best table");
    ssd_loop(best, &d, S0, y0, HP);
    memcpy(S1, d.S0, (size_t)hpn * sizeof(float));
    for (int64_t t = 0; t < 70; t++)
        spx_cpu_ssd_step(&d.a, d_x(&d) + t * d.ld, d_dt(&d) + t * d.ld, d_B(&d) + t * d.ld, d_C(&d) + t * d.ld, S1,
                         y1 + t * HP);
    CHECK(memcmp(y0, y1, (size_t)(70 * HP) * sizeof(float)) == 0 && memcmp(S0, S1, (size_t)hpn * sizeof(float)) == 0,
          "spx_cpu_ssd_step differs from the best table");
    printf("ssd dispatch: %s (qkernels %s)\n", best->name, spx_qkernels_best()->name);
    free(S0), free(y0), free(S1), free(y1), free(work);
    ssd_free(&d);
}

/* ======================================================================
 * gated norm
 * ==================================================================== */

static void test_norm(void) {
    uint64_t seed = 31337;
    const int64_t n = 256;
    float *y = falloc(n), *z = falloc(n), *w = falloc(n), *out = falloc(n), *yy = falloc(n);
    double worst = 0;
    for (int gi = 0; gi < 2; gi++)
        for (int ei = 0; ei < 2; ei++) {
            const int64_t gs = gi == 0 ? n : n / 4;
            const float eps = ei == 0 ? 1e-5f : 1e-6f;
            for (int64_t i = 0; i < n; i++) {
                y[i] = 2.0f * tl_rand_normal(&seed);
                z[i] = 2.0f * tl_rand_normal(&seed);
                w[i] = 1.0f + 0.2f * tl_rand_normal(&seed);
            }
            spx_cpu_rmsnorm_gated(out, y, z, w, n, gs, eps);
            int bad = 0;
            for (int64_t g0 = 0; g0 < n; g0 += gs) {
                double ss = 0;
                for (int64_t i = g0; i < g0 + gs; i++) {
                    const double v = y[i] * silu_d(z[i]);
                    ss += v * v;
                }
                const double r = 1.0 / sqrt(ss / (double)gs + (double)eps);
                for (int64_t i = g0; i < g0 + gs; i++) {
                    const double ref = w[i] * (y[i] * silu_d(z[i])) * r;
                    const double q = fabs(out[i] - ref) / (NORM_TOL_REL * fabs(ref) + 1e-30);
                    if (!(q <= 1)) bad++;
                    if (q > worst) worst = q;
                }
            }
            CHECK(bad == 0, "gated norm gs %lld eps %g: %d values off the reference", (long long)gs, eps, bad);
            memcpy(yy, y, (size_t)n * sizeof(float));
            spx_cpu_rmsnorm_gated(yy, yy, z, w, n, gs, eps);
            CHECK(memcmp(yy, out, (size_t)n * sizeof(float)) == 0, "gated norm gs %lld: in place differs",
                  (long long)gs);
        }
    printf("gated norm: gs n and n/4, worst err / bound %.3f\n", worst);
    free(y), free(z), free(w), free(out), free(yy);
}

int main(void) {
    const spx_ssm_kernels *tabs[2] = {spx_ssm_kernels_scalar(), spx_ssm_kernels_avx2()};
    if (!tabs[1]) printf("note: no AVX2+FMA on this CPU (or build): avx2 table not tested\n");
    test_conv();
    test_ssd(tabs);
    test_clamp(tabs);
    test_dispatch(tabs);
    test_norm();
    return tl_finish("test_ssm");
}
