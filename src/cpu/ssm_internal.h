/* ssm_internal.h: the kernel table behind cpu/ssm.h (the loops over P and
 * N of the SSD step and of the chunked scan), shared by ssm.c (scalar
 * reference, dispatch, the parts common to all variants) and ssm_avx2.c,
 * and exposed to tests/test_ssm.c so that it can run each variant
 * explicitly. Not part of the engine's interface.
 *
 * One chunk of one head, as the kernels see it (L tokens, rows s, t < L):
 *   x_s[p]  = x[s * ld + p]       this head's slice of token s's x
 *   B_s[n]  = B[s * ld + n]       this head's group's B (C likewise)
 *   M[t * L + s]                  exp(cum_t - cum_s) dt_s (C_t . B_s) for
 *                                 s <= t, exactly 0 for s > t
 *   e[t]    = exp(cum_t)          decay of the carried state up to token t
 *   w[s]    = exp(cum_{L-1} - cum_s) dt_s   token s's weight in the new state
 *   decay   = exp(cum_{L-1})
 * where cum_t = sum_{k<=t} dt_k A (inclusive). The kernels compute
 *   chunk_out:   y_t[p] = e[t] (S[p, :] . C_t) + sum_{s<=t} M[t, s] x_s[p]
 *                         + D x_t[p]                       (S not changed)
 *   chunk_state: S[p, n] = decay S[p, n] + sum_s (w[s] x_s[p]) B_s[n]
 *                (the product w[s] x_s[p] rounded first, in Xw[s * P + p])
 * and, once per group, chunk_cb: CB[t * L + s] = C_t . B_s (s <= t; 0 above);
 * chunk_m rows of M from the factors of ssm.c's bands (E_t F_s =
 * exp(cum_t - cum_s)): M[t L + s] = ((E[t] F[s]) dt[s]) CB[t L + s]. */
#ifndef SPX_CPU_SSM_INTERNAL_H
#define SPX_CPU_SSM_INTERNAL_H

#include "cpu/ssm.h"

#include <stdint.h>

typedef struct spx_ssd_chunk_head {
    int64_t L, P, N, ld;
    const float *x, *B, *C; /* token 0 of the chunk; rows ld apart */
    const float *M, *e, *w;  /* [L, L], [L], [L] */
    float D, decay;
    float *S;                /* [P, N], this head's state */
    float *y;                /* token 0's output for this head */
    int64_t ldy;
    float *Xw;               /* [L * P] scratch of chunk_state */
    float *St;               /* [P * N] scratch of chunk_out (S transposed) */
} spx_ssd_chunk_head;

typedef struct spx_ssm_kernels {
    const char *name; /* "scalar", "avx2" */
    /* One head, one token: S[p, n] = da S[p, n] + (dt x[p]) B[n];
     * y[p] = S[p, :] . C + D x[p] (the updated S). */
    void (*step_head)(float *S, const float *x, const float *B, const float *C, int64_t P, int64_t N, float da,
                      float dt, float D, float *y);
    void (*chunk_cb)(const float *C, const float *B, int64_t ld, int64_t L, int64_t N, float *CB);
    /* rows t0 <= t < t1 of M (s <= t; exactly 0 for t < s < L) */
    void (*chunk_m)(const float *E, const float *F, const float *dt, const float *CB, int64_t L, int64_t t0,
                    int64_t t1, float *M);
    void (*chunk_out)(const spx_ssd_chunk_head *c);
    void (*chunk_state)(const spx_ssd_chunk_head *c);
} spx_ssm_kernels;

/* The scalar reference (always there). */
const spx_ssm_kernels *spx_ssm_kernels_scalar(void);
/* The AVX2 + FMA table if compiled in and the CPU has both, else NULL. */
const spx_ssm_kernels *spx_ssm_kernels_avx2(void);
/* The table the public functions use: chosen once (scalar when
 * spx_qkernels_best() is the scalar table, i.e. SPECTRA_KERNELS=scalar or
 * no AVX2; else avx2 where available). */
const spx_ssm_kernels *spx_ssm_kernels_best(void);

/* ssm_avx2.c's table, NULL on non-x86 builds (no CPU check: use
 * spx_ssm_kernels_avx2). */
const spx_ssm_kernels *spx_ssm_avx2_table(void);

/* The public functions with an explicit table. */
void spx_ssd_step_with(const spx_ssm_kernels *k, const spx_ssd_args *a, const float *x, const float *dt_raw,
                       const float *B, const float *C, float *state, float *y);
void spx_ssd_chunked_with(const spx_ssm_kernels *k, const spx_ssd_args *a, const float *x, const float *dt_raw,
                          const float *B, const float *C, int64_t ldx, int64_t T, int64_t chunk, float *state,
                          float *y, int64_t ldy, float *work);

#endif
