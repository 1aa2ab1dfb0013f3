/* ssm.c: the recurrent blocks' CPU operations (cpu/ssm.h): the depthwise
 * causal convolution, the Mamba-2 SSD step and its chunked form, the gated
 * grouped RMSNorm; plus the scalar reference of the SSD kernel table
 * (ssm_internal.h) and the run-time choice of the table.
 *
 * Float32 everywhere except where a comment says double. The scalar
 * kernels add in index order with one rounding per operation (the default
 * flags target no FMA, and GCC's ISO C mode does not contract) and are the
 * documented reference; ssm_avx2.c fuses and blocks the same sums
 * (tests/test_ssm.c bounds the difference).
 *
 * Chunked scan, per chunk of L tokens and per group g (heads of g share
 * B_s, C_t):
 *   CB[t, s] = C_t . B_s                         once per group: L^2 N / 2
 * then per head, with cum_t = sum_{k<=t} dt_k A:
 *   M[t, s]  = exp(cum_t - cum_s) dt_s CB[t, s]  (s <= t)        L^2 / 2
 *   y_t      = exp(cum_t) S_prev C_t + sum_s M[t, s] x_s + D x_t L P N + L^2 P / 2
 *   S        = exp(cum_{L-1}) S_prev + sum_s exp(cum_{L-1} - cum_s) dt_s
 *              x_s (outer) B_s                                   L P N
 * Cost model, per token and head: the token loop does 2 P N multiply-adds
 * and P N multiplies (a S) and reads and writes the whole [H, P, N] state
 * once per token, so it runs at the speed of the cache level that holds
 * the state (H P N floats: beyond L1, often beyond L2). The chunked form
 * does 2 P N + L P / 2 + (L N / 2) / (H / G) multiply-adds, a little less
 * arithmetic, as small matrix products whose operands stay in L1 / L2
 * (one head's S, the chunk's x, B, C rows and M), touching the state once
 * per chunk, so it runs near the FMA rate; per chunk and head it adds
 * O(L) exps and O(L^2) products for M. Its gain is thus what the state
 * traffic costs the token loop plus at most 3 / 2 from the vector op
 * count (3 per state value and token against 2 + L / (4 N)). The
 * quadratic term's share is L / (4 N): chunks up to about N tokens (64 is
 * a good default) keep it small while amortising the per-chunk costs.
 *
 * The exponentials: cum is summed in double (a float cum of a few hundred
 * would lose ~1e-5 relative in exp(cum_t - cum_s)). exp(cum_t - cum_s) is
 * factored as E_t F_s with E_t = exp(cum_t - r), F_s = exp(r - cum_s) for
 * a reference r = cum_(first row of a band): rows are cut into bands
 * within which cum falls by at most SSD_BAND_SPAN, so E >= exp(-SPAN) and
 * F <= exp(SPAN) stay in float range (for s before the band F only
 * shrinks: the product underflows only where the true value is far below
 * float's range). Each factor is a double exp rounded to float once (or
 * one float product more for s before the band), so M[t, s] carries a few
 * float roundings, at L + 3 exps per band instead of L^2 / 2. */
#include "cpu/ssm.h"

#include "cpu/qkernels.h"
#include "cpu/ssm_internal.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#define SSD_BAND_SPAN 64.0

static inline float silu_f(float v) { return v / (1.0f + expf(-v)); }

/* ======================================================================
 * Causal convolution
 * ==================================================================== */

/* Token by token, channel by channel, with the state itself as the window:
 * y[t, c] reads x[t, c] once before it is written (so y == x is safe) and
 * the K-1 previous inputs from the state, which then shifts by one. The
 * same operations in the same order for every token whatever the split
 * into calls, so split calls give bit-identical results. */
void spx_cpu_conv_causal(const float *x, int64_t ldx, int64_t n, int64_t C, const float *w, const float *b,
                         int64_t K, float *state, int silu, float *y, int64_t ldy) {
    const int64_t Hk = K - 1; /* history length */
    for (int64_t t = 0; t < n; t++) {
        const float *xr = x + t * ldx;
        float *yr = y + t * ldy;
        for (int64_t c = 0; c < C; c++) {
            const float *wc = w + c * K;
            const float v = xr[c];
            float acc = 0.0f;
            if (Hk > 0) {
                float *st = state + c * Hk;
                for (int64_t j = 0; j < Hk; j++) acc += wc[j] * st[j];
                for (int64_t j = 0; j + 1 < Hk; j++) st[j] = st[j + 1];
                st[Hk - 1] = v;
            }
            acc += wc[Hk] * v;
            if (b) acc += b[c];
            yr[c] = silu ? silu_f(acc) : acc;
        }
    }
}

/* ======================================================================
 * Scalar kernels (the reference)
 * ==================================================================== */

static void scalar_step_head(float *S, const float *x, const float *B, const float *C, int64_t P, int64_t N,
                             float da, float dt, float D, float *y) {
    for (int64_t p = 0; p < P; p++) {
        float *Sp = S + p * N;
        const float dtx = dt * x[p];
        float acc = 0.0f;
        for (int64_t n = 0; n < N; n++) {
            const float s = da * Sp[n] + dtx * B[n];
            Sp[n] = s;
            acc += s * C[n];
        }
        y[p] = acc + D * x[p];
    }
}

static void scalar_chunk_cb(const float *C, const float *B, int64_t ld, int64_t L, int64_t N, float *CB) {
    for (int64_t t = 0; t < L; t++) {
        const float *Ct = C + t * ld;
        float *row = CB + t * L;
        for (int64_t s = 0; s <= t; s++) {
            const float *Bs = B + s * ld;
            float acc = 0.0f;
            for (int64_t n = 0; n < N; n++) acc += Ct[n] * Bs[n];
            row[s] = acc;
        }
        for (int64_t s = t + 1; s < L; s++) row[s] = 0.0f;
    }
}

static void scalar_chunk_m(const float *E, const float *F, const float *dt, const float *CB, int64_t L, int64_t t0,
                           int64_t t1, float *M) {
    for (int64_t t = t0; t < t1; t++) {
        float *Mt = M + t * L;
        const float *CBt = CB + t * L;
        for (int64_t s = 0; s <= t; s++) Mt[s] = E[t] * F[s] * dt[s] * CBt[s];
        for (int64_t s = t + 1; s < L; s++) Mt[s] = 0.0f;
    }
}

/* The chunk kernels keep SB independent sums (SB consecutive p of y, or n
 * of S) in a local array: every sum is still taken in the reference order
 * (n, then s ascending), but a fixed count of independent accumulators is
 * what a compiler can keep in registers and vectorize without being told
 * (nb < SB only at a row's end). */
#define SB 8

static inline void scalar_out_block(const spx_ssd_chunk_head *c, int64_t t, int64_t p0, int64_t nb) {
    const int64_t P = c->P, N = c->N, ld = c->ld;
    const float *Ct = c->C + t * ld, *xt = c->x + t * ld + p0, *Mt = c->M + t * c->L;
    float acc[SB] = {0};
    for (int64_t n = 0; n < N; n++) {
        const float cn = Ct[n], *Sn = c->St + n * P + p0;
        for (int64_t j = 0; j < nb; j++) acc[j] += Sn[j] * cn;
    }
    for (int64_t j = 0; j < nb; j++) acc[j] *= c->e[t];
    for (int64_t s = 0; s <= t; s++) {
        const float m = Mt[s], *xs = c->x + s * ld + p0;
        for (int64_t j = 0; j < nb; j++) acc[j] += m * xs[j];
    }
    float *yt = c->y + t * c->ldy + p0;
    for (int64_t j = 0; j < nb; j++) yt[j] = acc[j] + c->D * xt[j];
}

/* y_t[p] = e_t (sum_n S[p, n] C_t[n]) + sum_{s<=t} M[t, s] x_s[p] + D x_t[p],
 * S read through its transpose St (p contiguous). */
static void scalar_chunk_out(const spx_ssd_chunk_head *c) {
    const int64_t P = c->P, N = c->N;
    for (int64_t p = 0; p < P; p++)
        for (int64_t n = 0; n < N; n++) c->St[n * P + p] = c->S[p * N + n];
    for (int64_t t = 0; t < c->L; t++)
        for (int64_t p0 = 0; p0 < P; p0 += SB) {
            if (P - p0 >= SB) scalar_out_block(c, t, p0, SB);
            else scalar_out_block(c, t, p0, P - p0);
        }
}

static inline void scalar_state_block(const spx_ssd_chunk_head *c, int64_t p, int64_t n0, int64_t nb) {
    const int64_t P = c->P, ld = c->ld;
    float *Sp = c->S + p * c->N + n0;
    float acc[SB] = {0};
    for (int64_t j = 0; j < nb; j++) acc[j] = Sp[j] * c->decay;
    for (int64_t s = 0; s < c->L; s++) {
        const float xw = c->Xw[s * P + p], *Bs = c->B + s * ld + n0;
        for (int64_t j = 0; j < nb; j++) acc[j] += xw * Bs[j];
    }
    for (int64_t j = 0; j < nb; j++) Sp[j] = acc[j];
}

/* S[p, n] = decay S[p, n] + sum_s (w_s x_s[p]) B_s[n] */
static void scalar_chunk_state(const spx_ssd_chunk_head *c) {
    const int64_t L = c->L, P = c->P, N = c->N, ld = c->ld;
    for (int64_t s = 0; s < L; s++)
        for (int64_t p = 0; p < P; p++) c->Xw[s * P + p] = c->w[s] * c->x[s * ld + p];
    for (int64_t p = 0; p < P; p++)
        for (int64_t n0 = 0; n0 < N; n0 += SB) {
            if (N - n0 >= SB) scalar_state_block(c, p, n0, SB);
            else scalar_state_block(c, p, n0, N - n0);
        }
}

static const spx_ssm_kernels g_scalar = {
    .name = "scalar",
    .step_head = scalar_step_head,
    .chunk_cb = scalar_chunk_cb,
    .chunk_m = scalar_chunk_m,
    .chunk_out = scalar_chunk_out,
    .chunk_state = scalar_chunk_state,
};

const spx_ssm_kernels *spx_ssm_kernels_scalar(void) { return &g_scalar; }

/* ======================================================================
 * Dispatch
 * ==================================================================== */

const spx_ssm_kernels *spx_ssm_kernels_avx2(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    const spx_ssm_kernels *k = spx_ssm_avx2_table();
    if (k && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return k;
#endif
    return NULL;
}

static const spx_ssm_kernels *g_best;
static pthread_once_t g_best_once = PTHREAD_ONCE_INIT;

/* The quantized kernels' choice is the engine's one decision about SIMD
 * (it reads SPECTRA_KERNELS and the CPU): scalar there means scalar here. */
static void best_init(void) {
    const spx_ssm_kernels *k = NULL;
    if (strcmp(spx_qkernels_best()->name, "scalar") != 0) k = spx_ssm_kernels_avx2();
    g_best = k ? k : &g_scalar;
}

const spx_ssm_kernels *spx_ssm_kernels_best(void) {
    pthread_once(&g_best_once, best_init);
    return g_best;
}

/* ======================================================================
 * SSD
 * ==================================================================== */

/* clamp(softplus(raw + bias)) with torch's threshold (v > 20: v). The
 * comparisons keep a NaN a NaN, as torch.clamp does. */
static inline float ssd_dt(const spx_ssd_args *a, int64_t h, float raw) {
    const float v = raw + a->dt_bias[h];
    float dt = v > 20.0f ? v : log1pf(expf(v));
    if (dt < a->dt_lo) dt = a->dt_lo;
    if (dt > a->dt_hi) dt = a->dt_hi;
    return dt;
}

void spx_ssd_step_with(const spx_ssm_kernels *k, const spx_ssd_args *a, const float *x, const float *dt_raw,
                       const float *B, const float *C, float *state, float *y) {
    const int64_t P = a->P, N = a->N, hpg = a->H / a->G;
    for (int64_t h = 0; h < a->H; h++) {
        const int64_t g = h / hpg;
        const float dt = ssd_dt(a, h, dt_raw[h]);
        const float da = expf(dt * -expf(a->A_log[h]));
        k->step_head(state + h * P * N, x + h * P, B + g * N, C + g * N, P, N, da, dt, a->D[h], y + h * P);
    }
}

void spx_cpu_ssd_step(const spx_ssd_args *a, const float *x, const float *dt_raw, const float *B, const float *C,
                      float *state, float *y) {
    spx_ssd_step_with(spx_ssm_kernels_best(), a, x, dt_raw, B, C, state, y);
}

/* Work layout (floats), Lc = chunk:
 *   CB [Lc * Lc] | M [Lc * Lc] | Xw [Lc * P] | St [P * N] |
 *   dt, dtA, E, F, e, w [Lc each]
 * (a short last chunk uses the leading part of each array). */
int64_t spx_ssd_chunked_work(const spx_ssd_args *a, int64_t chunk) {
    const int64_t Lc = chunk < 1 ? 1 : chunk;
    return 2 * Lc * Lc + Lc * (a->P + 6) + a->P * a->N;
}

/* One head's decay factors for a chunk (ssm_internal.h names them) from
 * dt[L] and dtA[L] = dt A, and M from the group's CB (k->chunk_m); returns
 * exp(cum_{L-1}). Sums of dtA in double in index order, so every pass sees
 * the same cum_t. Per band (file comment) with r = cum_tb, each factor
 * computed in double and rounded to float once:
 *   F_s = exp(r - cum_s), E_t = 1 / F_t, e_t = E_t exp(r)   (s, t in the band)
 *   F_s *= exp(r - r_prev)  for the earlier s (<= 1: F only shrinks;
 *                           values under FLT_MIN become 0, no denormals)
 * and the last band (te = L) gives w_s = dt_s F_s exp(cum_{L-1} - r) for
 * every s and the decay exp(cum_{L-1} - r) exp(r). So a chunk costs
 * L + 3 exps per band. The band test fails for a NaN, which then gets a
 * band of one row and spreads into the outputs as the token loop's would. */
static float ssd_chunk_decays(const spx_ssm_kernels *k, int64_t L, const float *dt, const float *dtA,
                              const float *CB, float *M, float *E, float *F, float *e, float *w) {
    float decay = 0.0f;
    double cb = 0.0, rprev = 0.0; /* cum_{tb-1}, the previous band's r */
    for (int64_t tb = 0; tb < L;) {
        const double r = cb + dtA[tb];
        double ce = r;
        int64_t te = tb + 1;
        while (te < L && ce + dtA[te] >= r - SSD_BAND_SPAN) ce += dtA[te++];
        if (tb > 0) {
            const float shift = (float)exp(r - rprev);
            for (int64_t s = 0; s < tb; s++) {
                F[s] *= shift;
                if (!(F[s] >= FLT_MIN)) F[s] = 0.0f;
            }
        }
        const double er = exp(r);
        double c = cb;
        for (int64_t s = tb; s < te; s++) {
            c += dtA[s];
            const double f = exp(r - c); /* r - c in [-SPAN, 0]: f >= 1 */
            F[s] = (float)f;
            E[s] = (float)(1.0 / f);
            e[s] = (float)(er / f);
        }
        if (te == L) {
            const double eL = exp(ce - r);
            for (int64_t s = 0; s < L; s++) w[s] = dt[s] * (float)((double)F[s] * eL);
            decay = (float)(eL * er);
        }
        k->chunk_m(E, F, dt, CB, L, tb, te, M);
        rprev = r;
        cb = ce;
        tb = te;
    }
    return decay;
}

void spx_ssd_chunked_with(const spx_ssm_kernels *k, const spx_ssd_args *a, const float *x, const float *dt_raw,
                          const float *B, const float *C, int64_t ldx, int64_t T, int64_t chunk, float *state,
                          float *y, int64_t ldy, float *work) {
    const int64_t P = a->P, N = a->N, hpg = a->H / a->G;
    const int64_t Lc = chunk < 1 ? 1 : chunk;
    float *CB = work, *M = CB + Lc * Lc, *Xw = M + Lc * Lc, *St = Xw + Lc * P;
    float *dt = St + P * N, *dtA = dt + Lc, *E = dtA + Lc, *F = E + Lc, *e = F + Lc, *w = e + Lc;
    for (int64_t c0 = 0; c0 < T; c0 += Lc) {
        const int64_t L = T - c0 < Lc ? T - c0 : Lc;
        const float *xc = x + c0 * ldx, *dc = dt_raw + c0 * ldx;
        for (int64_t g = 0; g < a->G; g++) {
            const float *Bg = B + c0 * ldx + g * N, *Cg = C + c0 * ldx + g * N;
            k->chunk_cb(Cg, Bg, ldx, L, N, CB);
            for (int64_t h = g * hpg; h < (g + 1) * hpg; h++) {
                const float A = -expf(a->A_log[h]);
                for (int64_t t = 0; t < L; t++) {
                    dt[t] = ssd_dt(a, h, dc[t * ldx + h]);
                    dtA[t] = dt[t] * A;
                }
                const float decay = ssd_chunk_decays(k, L, dt, dtA, CB, M, E, F, e, w);
                const float *xh = xc + h * P;
                const spx_ssd_chunk_head ch = {
                    .L = L, .P = P, .N = N, .ld = ldx,
                    .x = xh, .B = Bg, .C = Cg,
                    .M = M, .e = e, .w = w,
                    .D = a->D[h], .decay = decay,
                    .S = state + h * P * N,
                    .y = y + c0 * ldy + h * P, .ldy = ldy,
                    .Xw = Xw, .St = St,
                };
                /* outputs read the state the chunk started with */
                k->chunk_out(&ch);
                k->chunk_state(&ch);
            }
        }
    }
}

void spx_cpu_ssd_chunked(const spx_ssd_args *a, const float *x, const float *dt_raw, const float *B, const float *C,
                         int64_t ldx, int64_t T, int64_t chunk, float *state, float *y, int64_t ldy, float *work) {
    spx_ssd_chunked_with(spx_ssm_kernels_best(), a, x, dt_raw, B, C, ldx, T, chunk, state, y, ldy, work);
}

/* ======================================================================
 * Gated RMSNorm
 * ==================================================================== */

/* Per group: v = y silu(z) stored in out (out == y is safe: each element
 * is read before it is written), the sum of squares in double (torch
 * reduces float32 in float; double is the more accurate of the two and
 * differs from it at float rounding level), r = 1 / sqrt(mean + eps)
 * rounded to float once, out = w (v r) in torch's order. */
void spx_cpu_rmsnorm_gated(float *out, const float *y, const float *z, const float *w, int64_t n, int64_t gs,
                           float eps) {
    for (int64_t g0 = 0; g0 < n; g0 += gs) {
        double ss = 0.0;
        for (int64_t i = g0; i < g0 + gs; i++) {
            const float v = y[i] * silu_f(z[i]);
            out[i] = v;
            ss += (double)v * v;
        }
        const float r = (float)(1.0 / sqrt(ss / (double)gs + (double)eps));
        for (int64_t i = g0; i < g0 + gs; i++) out[i] = w[i] * (out[i] * r);
    }
}
