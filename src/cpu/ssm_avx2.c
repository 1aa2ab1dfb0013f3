/* ssm_avx2.c: the AVX2 + FMA variant of the SSD kernel table
 * (ssm_internal.h): the one-token state update and the chunked scan's
 * loops over P and N.
 *
 * Every function that uses these instructions carries the target
 * attribute, so the file builds without -mavx2 and nothing here runs
 * unless ssm.c's dispatch found AVX2 and FMA. Non-x86 builds compile the
 * getter only (it returns NULL).
 *
 * Differences from the scalar reference (bounded by tests/test_ssm.c):
 * products and sums are fused (FMA); the dot products over N of the step
 * and of CB are summed in 8 lanes and then reduced; chunk_out and
 * chunk_state add in the scalar order per output element (n, then s
 * ascending) but fused; chunk_m and the Xw products are bit-identical.
 * chunk_out needs P and N multiples of 8 (the 8 x 8 transpose) and
 * chunk_state N; other shapes take the scalar kernel.
 *
 * Blocking: chunk_out holds a tile of up to 6 tokens x 16 head values in
 * 12 accumulators and walks n (the carried term, against S transposed into
 * the scratch so that p is contiguous) and then s (the intra-chunk term);
 * chunk_state holds up to 6 rows p x 16 state values and walks s. Each
 * step loads 2 vectors and broadcasts 6 scalars for 12 FMAs. The tile
 * sizes are compile-time constants of always-inlined helpers so the
 * accumulators live in registers. */
#include "cpu/ssm_internal.h"

#include <stddef.h>

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define SPX_AVX2 __attribute__((target("avx2,fma")))
#define SPX_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline

/* Tile height of the chunk kernels: 6 x 2 accumulators, 2 loaded vectors
 * and a broadcast fill 15 of the 16 ymm registers; 12 independent FMA
 * chains cover the FMA latency on two ports. */
#define TILE_R 6

SPX_AVX2_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- one token ----------------------------------------------------------
 * R rows of S at once (B and C loaded once per 8 n for all of them), one
 * accumulator per row; the N % 8 tail in scalar code. */
SPX_AVX2_INLINE void step_rows(const int R, float *S, const float *x, const float *B, const float *C, int64_t N,
                               float da, float dt, float D, float *y) {
    const int64_t N8 = N & ~(int64_t)7;
    const __m256 vda = _mm256_set1_ps(da);
    __m256 vd[4], acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        vd[r] = _mm256_set1_ps(dt * x[r]);
        acc[r] = _mm256_setzero_ps();
    }
    for (int64_t n = 0; n < N8; n += 8) {
        const __m256 b = _mm256_loadu_ps(B + n), c = _mm256_loadu_ps(C + n);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            float *Sr = S + r * N + n;
            const __m256 s = _mm256_fmadd_ps(vd[r], b, _mm256_mul_ps(vda, _mm256_loadu_ps(Sr)));
            _mm256_storeu_ps(Sr, s);
            acc[r] = _mm256_fmadd_ps(s, c, acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float sum = hsum8(acc[r]);
        const float dtx = dt * x[r];
        for (int64_t n = N8; n < N; n++) {
            float *Sr = S + r * N + n;
            *Sr = da * *Sr + dtx * B[n];
            sum += *Sr * C[n];
        }
        y[r] = sum + D * x[r];
    }
}

SPX_AVX2 static void avx2_step_head(float *S, const float *x, const float *B, const float *C, int64_t P, int64_t N,
                                    float da, float dt, float D, float *y) {
    int64_t p = 0;
    for (; p + 4 <= P; p += 4) step_rows(4, S + p * N, x + p, B, C, N, da, dt, D, y + p);
    for (; p < P; p++) step_rows(1, S + p * N, x + p, B, C, N, da, dt, D, y + p);
}

/* ---- CB = C B^T (lower triangle) ------------------------------------------
 * 4 columns s per pass against one row C_t (loaded once per 8 n). */
SPX_AVX2_INLINE void cb_cols(const int R, const float *Ct, const float *B, int64_t ld, int64_t N, float *out) {
    const int64_t N8 = N & ~(int64_t)7;
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t n = 0; n < N8; n += 8) {
        const __m256 c = _mm256_loadu_ps(Ct + n);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(c, _mm256_loadu_ps(B + r * ld + n), acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float sum = hsum8(acc[r]);
        for (int64_t n = N8; n < N; n++) sum += Ct[n] * B[r * ld + n];
        out[r] = sum;
    }
}

SPX_AVX2 static void avx2_chunk_cb(const float *C, const float *B, int64_t ld, int64_t L, int64_t N, float *CB) {
    for (int64_t t = 0; t < L; t++) {
        const float *Ct = C + t * ld;
        float *row = CB + t * L;
        int64_t s = 0;
        for (; s + 4 <= t + 1; s += 4) cb_cols(4, Ct, B + s * ld, ld, N, row + s);
        for (; s <= t; s++) cb_cols(1, Ct, B + s * ld, ld, N, row + s);
        for (; s < L; s++) row[s] = 0.0f;
    }
}

/* ---- chunk outputs -------------------------------------------------------
 * Tile: tokens t0 .. t0+R-1 x head values p0 .. p0+8W-1. St is S
 * transposed ([N, P]). M is zero above the diagonal, so every row of the
 * tile can run s up to the tile's last token. */
SPX_AVX2_INLINE void out_tile(const int R, const int W, const spx_ssd_chunk_head *c, const float *St, int64_t t0,
                              int64_t p0) {
    const int64_t P = c->P, N = c->N, L = c->L, ld = c->ld;
    __m256 acc[TILE_R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < W; v++) acc[r][v] = _mm256_setzero_ps();
    /* carried: sum_n C_t[n] S[p, n], n ascending */
    for (int64_t n = 0; n < N; n++) {
        __m256 sv[2];
#pragma GCC unroll 2
        for (int v = 0; v < W; v++) sv[v] = _mm256_loadu_ps(St + n * P + p0 + 8 * v);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 cv = _mm256_broadcast_ss(c->C + (t0 + r) * ld + n);
#pragma GCC unroll 2
            for (int v = 0; v < W; v++) acc[r][v] = _mm256_fmadd_ps(cv, sv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        const __m256 ev = _mm256_set1_ps(c->e[t0 + r]);
#pragma GCC unroll 2
        for (int v = 0; v < W; v++) acc[r][v] = _mm256_mul_ps(acc[r][v], ev);
    }
    /* intra-chunk: sum_s M[t, s] x_s[p], s ascending */
    for (int64_t s = 0; s < t0 + R; s++) {
        __m256 xv[2];
#pragma GCC unroll 2
        for (int v = 0; v < W; v++) xv[v] = _mm256_loadu_ps(c->x + s * ld + p0 + 8 * v);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 mv = _mm256_broadcast_ss(c->M + (t0 + r) * L + s);
#pragma GCC unroll 2
            for (int v = 0; v < W; v++) acc[r][v] = _mm256_fmadd_ps(mv, xv[v], acc[r][v]);
        }
    }
    const __m256 vD = _mm256_set1_ps(c->D);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < W; v++) {
            const int64_t off = p0 + 8 * v;
            const __m256 xt = _mm256_loadu_ps(c->x + (t0 + r) * ld + off);
            _mm256_storeu_ps(c->y + (t0 + r) * c->ldy + off, _mm256_fmadd_ps(vD, xt, acc[r][v]));
        }
}

/* St[n, p] = S[p, n], 8 x 8 blocks through registers (P, N multiples of 8). */
SPX_AVX2 static void transpose_pn(const float *S, int64_t P, int64_t N, float *St) {
    for (int64_t p0 = 0; p0 < P; p0 += 8)
        for (int64_t n0 = 0; n0 < N; n0 += 8) {
            const float *s = S + p0 * N + n0;
            const __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + N), r2 = _mm256_loadu_ps(s + 2 * N),
                         r3 = _mm256_loadu_ps(s + 3 * N), r4 = _mm256_loadu_ps(s + 4 * N),
                         r5 = _mm256_loadu_ps(s + 5 * N), r6 = _mm256_loadu_ps(s + 6 * N),
                         r7 = _mm256_loadu_ps(s + 7 * N);
            const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                         t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
                         t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                         t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                         u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                         u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                         u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *d = St + n0 * P + p0;
            _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(d + P, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(d + 2 * P, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(d + 3 * P, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(d + 4 * P, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(d + 5 * P, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(d + 6 * P, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(d + 7 * P, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
}

/* One tile of height R (1 .. TILE_R, a constant in each case) and width 16
 * (wide) or 8. */
#define TILE_CASE(F, R, ...)                  \
    case R:                                   \
        if (wide) F(R, 2, __VA_ARGS__);       \
        else F(R, 1, __VA_ARGS__);            \
        break;
#define TILE_SWITCH(F, R, ...)                                                                     \
    switch (R) {                                                                                   \
        TILE_CASE(F, 1, __VA_ARGS__) TILE_CASE(F, 2, __VA_ARGS__) TILE_CASE(F, 3, __VA_ARGS__)     \
        TILE_CASE(F, 4, __VA_ARGS__) TILE_CASE(F, 5, __VA_ARGS__) TILE_CASE(F, 6, __VA_ARGS__)     \
    default: break;                                                                                \
    }

SPX_AVX2 static void avx2_chunk_out(const spx_ssd_chunk_head *c) {
    const int64_t P = c->P, L = c->L;
    if (P % 8 != 0 || c->N % 8 != 0) {
        spx_ssm_kernels_scalar()->chunk_out(c);
        return;
    }
    transpose_pn(c->S, P, c->N, c->St);
    for (int64_t p0 = 0; p0 < P; p0 += 16) {
        const int wide = P - p0 >= 16;
        for (int64_t t0 = 0; t0 < L; t0 += TILE_R) {
            const int64_t R = L - t0 < TILE_R ? L - t0 : TILE_R;
            TILE_SWITCH(out_tile, R, c, c->St, t0, p0)
        }
    }
}

/* ---- chunk state ---------------------------------------------------------
 * Tile: rows p0 .. p0+R-1 x state values n0 .. n0+8W-1, s ascending. */
SPX_AVX2_INLINE void state_tile(const int R, const int W, const spx_ssd_chunk_head *c, int64_t p0, int64_t n0) {
    const int64_t P = c->P, N = c->N, L = c->L, ld = c->ld;
    const __m256 vdec = _mm256_set1_ps(c->decay);
    __m256 acc[TILE_R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < W; v++)
            acc[r][v] = _mm256_mul_ps(vdec, _mm256_loadu_ps(c->S + (p0 + r) * N + n0 + 8 * v));
    for (int64_t s = 0; s < L; s++) {
        __m256 bv[2];
#pragma GCC unroll 2
        for (int v = 0; v < W; v++) bv[v] = _mm256_loadu_ps(c->B + s * ld + n0 + 8 * v);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 xw = _mm256_broadcast_ss(c->Xw + s * P + p0 + r);
#pragma GCC unroll 2
            for (int v = 0; v < W; v++) acc[r][v] = _mm256_fmadd_ps(xw, bv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < W; v++) _mm256_storeu_ps(c->S + (p0 + r) * N + n0 + 8 * v, acc[r][v]);
}

SPX_AVX2 static void avx2_chunk_state(const spx_ssd_chunk_head *c) {
    const int64_t P = c->P, N = c->N, L = c->L, P8 = P & ~(int64_t)7;
    if (N % 8 != 0) {
        spx_ssm_kernels_scalar()->chunk_state(c);
        return;
    }
    for (int64_t s = 0; s < L; s++) {
        const float *xs = c->x + s * c->ld;
        float *xw = c->Xw + s * P;
        const __m256 wv = _mm256_set1_ps(c->w[s]);
        for (int64_t p = 0; p < P8; p += 8) _mm256_storeu_ps(xw + p, _mm256_mul_ps(wv, _mm256_loadu_ps(xs + p)));
        for (int64_t p = P8; p < P; p++) xw[p] = c->w[s] * xs[p];
    }
    for (int64_t n0 = 0; n0 < N; n0 += 16) {
        const int wide = N - n0 >= 16;
        for (int64_t p0 = 0; p0 < P; p0 += TILE_R) {
            const int64_t R = P - p0 < TILE_R ? P - p0 : TILE_R;
            TILE_SWITCH(state_tile, R, c, p0, n0)
        }
    }
}

/* ---- decay matrix rows ---------------------------------------------------
 * The scalar kernel's products in its order, 8 columns at a time (no FMA:
 * bit-identical to it). */
SPX_AVX2 static void avx2_chunk_m(const float *E, const float *F, const float *dt, const float *CB, int64_t L,
                                  int64_t t0, int64_t t1, float *M) {
    for (int64_t t = t0; t < t1; t++) {
        float *Mt = M + t * L;
        const float *CBt = CB + t * L;
        const __m256 ev = _mm256_set1_ps(E[t]);
        int64_t s = 0;
        for (; s + 8 <= t + 1; s += 8) {
            const __m256 m = _mm256_mul_ps(_mm256_mul_ps(ev, _mm256_loadu_ps(F + s)), _mm256_loadu_ps(dt + s));
            _mm256_storeu_ps(Mt + s, _mm256_mul_ps(m, _mm256_loadu_ps(CBt + s)));
        }
        for (; s <= t; s++) Mt[s] = E[t] * F[s] * dt[s] * CBt[s];
        for (; s < L; s++) Mt[s] = 0.0f;
    }
}

static const spx_ssm_kernels g_avx2 = {
    .name = "avx2",
    .step_head = avx2_step_head,
    .chunk_cb = avx2_chunk_cb,
    .chunk_m = avx2_chunk_m,
    .chunk_out = avx2_chunk_out,
    .chunk_state = avx2_chunk_state,
};

const spx_ssm_kernels *spx_ssm_avx2_table(void) { return &g_avx2; }

#else /* not x86 */

const spx_ssm_kernels *spx_ssm_avx2_table(void) { return NULL; }

#endif
