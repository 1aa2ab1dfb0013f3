/* bench_refine.c: speed of the weight-refinement building blocks
 * (src/refine/refine.h) on one thread. A program, not a test: prints a
 * table.
 *
 * apply: per kernel table and budget k per 1,024-channel chunk (32, 64,
 * 128 by default), the median time of one apply over all rows of a
 * rows x cols residual (4096 x 4096 by default) with a fresh selection
 * per call (spx_refine_topk of one of 64 random activation vectors, with
 * a few large channels), and the residual bytes it reads (selected
 * columns x col_bytes) over that time in GB/s. Two placements: "hot", one
 * matrix (its selected columns partly in the caches from earlier calls),
 * and "rotating", --mats matrices in turn (64 MiB at the default shape),
 * so most columns come from outside the private caches. The codes are
 * random bytes: the speed does not depend on the values.
 * base: the median time of the engine's best GEMV (spx_qkernels_best, one
 * thread, 4-bit G32 row-major) on a matrix of the same shape, so each
 * apply line also shows its time as a share of one base GEMV.
 * topk: median time of spx_refine_topk over cols channels per k.
 * build: seconds to build one residual (spx_refine_q4_build) from a
 * random W and its MINMAX-quantized base.
 * Options: --rows N --cols N --runs N --mats N --scalar-runs N. */
#include "core/util.h"
#include "cpu/qkernels.h"
#include "quant/g32.h"
#include "refine/refine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545f4914f6cdd1dULL;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float next_unit(void) { return (float)(next_u64() >> 40) * (1.0f / 16777216.0f); }
static float next_normal(void) {
    float u1 = next_unit() + 1e-7f, u2 = next_unit();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return t[n / 2];
}

enum { NX = 64 };

int main(int argc, char **argv) {
    int64_t rows = 4096, cols = 4096;
    int runs = 400, mats = 8, scalar_runs = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows")) rows = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--cols")) cols = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--mats")) mats = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--scalar-runs")) scalar_runs = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--rows N (4096)] [--cols N (4096, a multiple of 32)] [--runs N (400)] "
                            "[--mats N (8)] [--scalar-runs N (20)]\n", argv[0]);
            return 2;
        }
    }
    if (rows < 1 || cols < 32 || cols % 32 || runs < 1 || mats < 1 || scalar_runs < 1) {
        fprintf(stderr, "bench_refine: bad shape or counts\n");
        return 2;
    }
    spx_err e;
    spx_err_clear(&e);

    /* residuals with random codes and scales */
    spx_refine_q4buf *R = calloc((size_t)mats, sizeof *R);
    for (int m = 0; m < mats; m++) {
        if (spx_refine_q4buf_init(&R[m], rows, cols, 0, &e) != SPX_OK) {
            fprintf(stderr, "bench_refine: %s\n", e.msg);
            return 1;
        }
        for (int64_t i = 0; i < cols * R[m].v.col_stride; i++) R[m].codes[i] = (uint8_t)next_u64();
        for (int64_t r = 0; r < rows; r++) R[m].scales[r] = 1e-4f * (1 + next_unit());
    }
    float *x = malloc((size_t)(NX * cols) * sizeof(float)), *y = calloc((size_t)rows, sizeof(float));
    for (int64_t i = 0; i < NX * cols; i++) {
        x[i] = next_normal();
        if (next_u64() % 64 == 0) x[i] *= 12.0f;
    }
    int32_t *sel = malloc((size_t)cols * sizeof(int32_t));
    double *t = malloc((size_t)(runs > scalar_runs ? runs : scalar_runs) * sizeof(double));
    printf("bench_refine: %lld x %lld residual, %lld bytes per column, 1 thread\n", (long long)rows,
           (long long)cols, (long long)R[0].v.col_bytes);

    /* base GEMV for scale */
    double t_base = 0;
    {
        spx_qbuf qb;
        if (spx_qbuf_init(&qb, rows, cols, 4, 32, NULL, 0, &e) != SPX_OK) {
            fprintf(stderr, "bench_refine: %s\n", e.msg);
            return 1;
        }
        for (int64_t i = 0; i < rows * qb.codes_row_bytes; i++) qb.codes[i] = (uint8_t)next_u64();
        for (int64_t i = 0; i < rows * qb.zeros_row_bytes; i++) qb.zeros[i] = (uint8_t)next_u64();
        for (int64_t i = 0; i < rows * qb.n_groups; i++) qb.scales[i] = 0x1c00 + (uint16_t)(next_u64() % 512);
        const spx_qkernels *k = spx_qkernels_best();
        size_t ab = k->act_bytes(1, cols, 32), sb = k->scratch_bytes(1, cols, 32);
        void *act = ab ? malloc(ab) : NULL, *scr = sb ? malloc(sb) : NULL;
        for (int i = 0; i < runs; i++) {
            const float *xi = x + (i % NX) * cols;
            double t0 = spx_now();
            k->prepare(xi, 1, cols, 32, act);
            k->rows(&qb.q, act, xi, 1, y, rows, 0, rows, scr);
            t[i] = spx_now() - t0;
        }
        t_base = median(t, runs);
        printf("base GEMV (%s, 4-bit G32): %.1f us, %.2f GB/s of codes + scales + zeros\n", k->name, t_base * 1e6,
               (double)(rows * (qb.codes_row_bytes + qb.n_groups * 2 + qb.zeros_row_bytes)) / t_base * 1e-9);
        free(act);
        free(scr);
        spx_qbuf_free(&qb);
    }

    /* apply */
    static const int ks[] = {32, 64, 128};
    const spx_refine_kernels *kt[2] = {spx_refine_kernels_scalar(), spx_refine_kernels_avx2()};
    printf("\n%-7s %-9s %5s %7s %10s %9s %8s\n", "table", "placement", "k", "columns", "us/apply", "GB/s", "of base");
    for (int ti = 0; ti < 2; ti++) {
        if (!kt[ti]) {
            printf("(no avx2 + fma on this CPU)\n");
            continue;
        }
        int n_runs = ti == 0 ? scalar_runs : runs;
        for (int place = 0; place < 2; place++)
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
                int64_t n = 0;
                for (int i = -2; i < n_runs; i++) { /* 2 warm-up calls */
                    int j = (i + 2) % NX;
                    const spx_refine_q4 *Rm = &R[place ? (i + 2) % mats : 0].v;
                    n = spx_refine_topk(x + j * cols, cols, SPX_REFINE_CHUNK, ks[ki], NULL, sel);
                    double t0 = spx_now();
                    kt[ti]->apply(Rm, sel, NULL, n, x + j * cols, y, 0, rows);
                    if (i >= 0) t[i] = spx_now() - t0;
                }
                double tm = median(t, n_runs);
                printf("%-7s %-9s %5d %7lld %10.1f %9.2f %7.1f%%\n", kt[ti]->name, place ? "rotating" : "hot", ks[ki],
                       (long long)n, tm * 1e6, (double)(n * R[0].v.col_bytes) / tm * 1e-9, 100.0 * tm / t_base);
            }
    }

    /* topk */
    printf("\n%-22s", "topk over the columns:");
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
        for (int i = 0; i < runs; i++) {
            double t0 = spx_now();
            spx_refine_topk(x + (i % NX) * cols, cols, SPX_REFINE_CHUNK, ks[ki], NULL, sel);
            t[i] = spx_now() - t0;
        }
        printf("  k %d: %.2f us", ks[ki], median(t, runs) * 1e6);
    }
    printf("\n");

    /* build */
    {
        spx_qbuf qb;
        float *w = malloc((size_t)(rows * cols) * sizeof(float));
        if (!w || spx_qbuf_init(&qb, rows, cols, 4, 32, NULL, 0, &e) != SPX_OK) {
            fprintf(stderr, "bench_refine: %s\n", e.msg);
            return 1;
        }
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++) w[r * cols + c] = 0.02f * next_normal();
            spx_qbuf_set_row(&qb, r, w + r * cols, SPX_Q_MINMAX, NULL);
        }
        spx_refine_q4buf b;
        double t0 = spx_now();
        spx_status st = spx_refine_q4_build(&b, &qb.q, w, &e);
        double dt = spx_now() - t0;
        if (st != SPX_OK) {
            fprintf(stderr, "bench_refine: %s\n", e.msg);
            return 1;
        }
        printf("build: %.3f s for %lld x %lld (%.1f ns per weight)\n", dt, (long long)rows, (long long)cols,
               dt / (double)(rows * cols) * 1e9);
        spx_refine_q4buf_free(&b);
        spx_qbuf_free(&qb);
        free(w);
    }
    for (int m = 0; m < mats; m++) spx_refine_q4buf_free(&R[m]);
    free(R);
    free(x);
    free(y);
    free(sel);
    free(t);
    return 0;
}
