/* bench_kernels.c: speed of the quantized GEMV / GEMM kernel tables
 * (cpu/qkernels.h) on Llama-like shapes. A program, not a test: prints a
 * table.
 *
 * Per shape (rows x cols = out x in features, 4-bit (--bits 2, 3 or 4),
 * G32 by default, 1% outlier columns) and per kernel table and thread count: GEMV (T = 1)
 * median time per call over --runs calls after warm-up, and the weight
 * bytes read per call (codes + scales + zeros + outlier values and
 * indices) over that time; GEMM (T = --tokens, default 512) in GFLOP/s
 * (2 * rows * cols * T per call), median of --gemm-runs calls. A call is
 * prepare() on the calling thread, then rows() split by row ranges over
 * the pool (spx_pool_range, rows aligned to 32), as the engine does.
 * The matrices are random bytes (codes, zero points, fp16 scales in
 * [1e-3, 1e-2)): speed does not depend on the values. The scalar table's
 * GEMM is slow (double sums over a dequantized row) and runs only with
 * --scalar-gemm.
 *
 * Layouts (--layout): the row-major matrix (SPX_Q_ROWS) and its SPX_Q_TILED
 * copy (spx_q_tile_alloc; G32 and cols % 128 == 0 only). With both, each
 * measurement is taken in --rounds rounds that alternate the layouts in
 * ABBA order (rows, tiled, tiled, rows, ...), each block with its own
 * warm-up, and the median is over all rounds' calls: on a noisy machine
 * both layouts see the same drift, and each block still runs with its own
 * matrix warm in the caches as a single-layout run would. The tiled line
 * adds the ratio of its median time to the row-major one (< 1: faster).
 *
 * --mtok: instead, the decode-sized products (speculation's verification,
 * a batch of sessions): the avx2 table's time for M = 1, 2, 4, 8, 16
 * tokens per shape, layout and thread count, the M values interleaved
 * within each round (ABBA), with the ratio to M = 1 and the time per
 * token. */
#include "core/half.h"
#include "core/pool.h"
#include "core/util.h"
#include "cpu/qkernels.h"
#include "quant/g32.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float next_unit(void) { return (float)(next_u64() >> 40) / 16777216.0f; }

typedef struct bmat {
    spx_qtensor q;
    uint8_t *codes, *zeros;
    uint16_t *scales, *ov;
    int32_t *oi;
    size_t bytes; /* weight bytes a matmul reads */
} bmat;

static int bmat_init(bmat *m, int64_t rows, int64_t cols, int bits, int group, double out_frac) {
    memset(m, 0, sizeof *m);
    int64_t ng = cols / group, crb = spx_q_codes_row_bytes(cols, bits), zrb = (ng + 1) / 2;
    int64_t no = (int64_t)(out_frac * (double)cols);
    m->codes = malloc((size_t)(rows * crb));
    m->zeros = malloc((size_t)(rows * zrb));
    m->scales = malloc((size_t)(rows * ng) * 2);
    m->ov = malloc((size_t)(rows * (no ? no : 1)) * 2);
    m->oi = malloc((size_t)(no ? no : 1) * 4);
    if (!m->codes || !m->zeros || !m->scales || !m->ov || !m->oi) return 0;
    for (int64_t i = 0; i < rows * crb; i++) m->codes[i] = (uint8_t)next_u64();
    for (int64_t i = 0; i < rows * zrb; i++) m->zeros[i] = (uint8_t)next_u64();
    for (int64_t i = 0; i < rows * ng; i++) m->scales[i] = spx_f32_to_f16(1e-3f + 9e-3f * next_unit());
    for (int64_t i = 0; i < rows * no; i++) m->ov[i] = spx_f32_to_f16(next_unit() - 0.5f);
    for (int64_t j = 0; j < no; j++) m->oi[j] = (int32_t)(j * (cols / no) + (cols / no) / 2);
    m->q = (spx_qtensor){rows, cols, bits, group, no, m->codes, m->scales, m->zeros, m->oi, m->ov, SPX_Q_ROWS};
    m->bytes = (size_t)(rows * crb + rows * zrb + rows * ng * 2 + rows * no * 2 + no * 4);
    return 1;
}

static void bmat_free(bmat *m) {
    free(m->codes);
    free(m->zeros);
    free(m->scales);
    free(m->ov);
    free(m->oi);
}

typedef struct job {
    const spx_qkernels *k;
    const spx_qtensor *q;
    const void *act;
    const float *x;
    int64_t T;
    float *y;
    char *scratch; /* nthreads * scratch_bytes */
    size_t sb;
} job;

static void job_fn(void *ctx, int tid, int n) {
    job *j = ctx;
    int64_t r0, r1;
    spx_pool_range(j->q->rows, tid, n, 32, &r0, &r1);
    if (r0 < r1) j->k->rows(j->q, j->act, j->x, j->T, j->y, j->q->rows, r0, r1, j->scratch + (size_t)tid * j->sb);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

/* Seconds per call of prepare + rows over the pool (wall clock) for `runs`
 * calls after `warm`, into ts[runs], and in cs[runs] the process CPU
 * seconds per call divided by the thread count: on a shared machine, the
 * time the call would take if its threads had the cores to themselves
 * (pool wake-up spins count too). */
static void time_matmul(spx_pool *pool, const spx_qkernels *k, const spx_qtensor *q, const float *x,
                        int64_t T, float *y, int runs, int warm, double *ts, double *cs) {
    size_t ab = k->act_bytes(T, q->cols, q->group), sb = k->scratch_bytes(T, q->cols, q->group);
    sb = (sb + 63) / 64 * 64;
    int nt = spx_pool_size(pool);
    void *act = malloc(ab ? ab : 1);
    char *scratch = malloc(sb * (size_t)nt + 1);
    job j = {k, q, act, x, T, y, scratch, sb};
    for (int i = 0; i < warm + runs; i++) {
        double t0 = spx_now(), c0 = cpu_now();
        k->prepare(x, T, q->cols, q->group, act);
        spx_pool_run(pool, job_fn, &j);
        double dt = spx_now() - t0, dc = cpu_now() - c0;
        if (i >= warm) ts[i - warm] = dt, cs[i - warm] = dc / nt;
    }
    free(act);
    free(scratch);
}

/* Median wall and CPU seconds per call for each of the nl matrices qs[],
 * rounds x runs calls each, the layouts alternated ABBA by round. */
static void time_layouts(spx_pool *pool, const spx_qkernels *k, const spx_qtensor *const *qs, int nl,
                         const float *x, int64_t T, float *y, int runs, int warm, int rounds,
                         double *wall, double *cpu) {
    int n = runs * rounds;
    double *ts = malloc((size_t)(2 * nl * n) * sizeof *ts), *cs = ts + nl * n;
    for (int rd = 0; rd < rounds; rd++)
        for (int j = 0; j < nl; j++) {
            int li = rd & 1 ? nl - 1 - j : j;
            time_matmul(pool, k, qs[li], x, T, y, runs, warm, ts + li * n + rd * runs, cs + li * n + rd * runs);
        }
    for (int li = 0; li < nl; li++) {
        wall[li] = median(ts + li * n, n);
        cpu[li] = median(cs + li * n, n);
    }
    free(ts);
}

/* --mtok: one table per (shape, thread count): rows M = 1, 2, 4, 8, 16 per
 * layout. Per round the (M, layout) cells run in order, then reversed. */
enum { MT_N = 5 };
static const int64_t mt_m[MT_N] = {1, 2, 4, 8, 16};
static void mtok_table(spx_pool *pool, const spx_qkernels *k, const spx_qtensor *const *qs, const char *const *names,
                       int nl, const char *shape, const float *x, float *y, int runs, int rounds) {
    int nc = MT_N * nl, n = runs * rounds;
    double *ts = malloc((size_t)(2 * nc * n) * sizeof *ts), *cs = ts + nc * n;
    for (int rd = 0; rd < rounds; rd++)
        for (int j = 0; j < nc; j++) {
            int c = rd & 1 ? nc - 1 - j : j, mi = c / nl, li = c % nl;
            time_matmul(pool, k, qs[li], x, mt_m[mi], y, runs, 2, ts + c * n + rd * runs, cs + c * n + rd * runs);
        }
    for (int li = 0; li < nl; li++) {
        double w1 = 0, c1 = 0;
        for (int mi = 0; mi < MT_N; mi++) {
            int c = mi * nl + li;
            double w = median(ts + c * n, n), cp = median(cs + c * n, n);
            if (mi == 0) w1 = w, c1 = cp;
            printf("%-12s %-7s %3d %-5s | %3lld | %10.1f %9.3f %9.3f | %10.1f\n", shape, k->name, spx_pool_size(pool),
                   names[li], (long long)mt_m[mi], w * 1e6, w / w1, cp / c1, w * 1e6 / (double)mt_m[mi]);
        }
    }
    fflush(stdout);
    free(ts);
}

static void usage(const char *argv0) {
    printf("usage: %s [options]\n"
           "  --runs N        GEMV calls timed per row (int >= 1, default 20)\n"
           "  --gemm-runs N   GEMM calls timed per row (int >= 1, default 5; 0 skips GEMM)\n"
           "  --tokens T      GEMM tokens (int >= 2, default 512)\n"
           "  --bits B        code width (2, 3 or 4, default 4; tiled needs 4)\n"
           "  --group G       group size (32, 64 or 128, default 32)\n"
           "  --outliers F    outlier column fraction (float in [0, 0.5], default 0.01)\n"
           "  --threads N     largest thread count; rows for 1..N (int 1..64, default 2)\n"
           "  --shape RxC     only this shape (default: the five Llama shapes)\n"
           "  --layout L      rows, tiled or both (default both; tiled needs G32)\n"
           "  --rounds N      rounds alternating the layouts (int >= 1, default 2)\n"
           "  --scalar-gemm   also time the scalar table's GEMM (slow)\n"
           "  --kernels LIST  comma-separated tables (scalar,avx2,avx512,amx; default: every one this CPU runs)\n"
           "  --mtok          the table of M = 1, 2, 4, 8, 16 tokens (avx2 only; --runs per cell)\n"
           "  --help          this text\n",
           argv0);
}

int main(int argc, char **argv) {
    int runs = 20, gemm_runs = 5, group = 32, bits = 4, max_threads = 2, scalar_gemm = 0, rounds = 2, mtok = 0;
    int use_rows = 1, use_tiled = 1, layout_set = 0;
    int64_t T = 512;
    double out_frac = 0.01;
    const char *kernels = "scalar,avx2,avx512,amx";
    int64_t shapes[8][2] = {{2048, 2048}, {2048, 8192}, {8192, 2048}, {4096, 14336}, {14336, 4096}};
    int n_shapes = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage(argv[0]);
            return 0;
        } else if (!strcmp(a, "--mtok")) {
            mtok = 1;
        } else if (!strcmp(a, "--scalar-gemm")) {
            scalar_gemm = 1;
        } else if (v && !strcmp(a, "--kernels")) {
            kernels = v, i++;
        } else if (v && !strcmp(a, "--runs")) {
            runs = atoi(v), i++;
        } else if (v && !strcmp(a, "--gemm-runs")) {
            gemm_runs = atoi(v), i++;
        } else if (v && !strcmp(a, "--tokens")) {
            T = atoll(v), i++;
        } else if (v && !strcmp(a, "--bits")) {
            bits = atoi(v), i++;
        } else if (v && !strcmp(a, "--group")) {
            group = atoi(v), i++;
        } else if (v && !strcmp(a, "--outliers")) {
            out_frac = atof(v), i++;
        } else if (v && !strcmp(a, "--rounds")) {
            rounds = atoi(v), i++;
        } else if (v && !strcmp(a, "--layout")) {
            use_rows = !strcmp(v, "rows") || !strcmp(v, "both");
            use_tiled = !strcmp(v, "tiled") || !strcmp(v, "both");
            layout_set = 1;
            if (!use_rows && !use_tiled) {
                fprintf(stderr, "--layout %s: expected rows, tiled or both\n", v);
                return 2;
            }
            i++;
        } else if (v && !strcmp(a, "--threads")) {
            max_threads = atoi(v), i++;
        } else if (v && !strcmp(a, "--shape")) {
            long long r, c;
            if (sscanf(v, "%lldx%lld", &r, &c) != 2 || r <= 0 || c <= 0) {
                fprintf(stderr, "--shape %s: expected ROWSxCOLS\n", v);
                return 2;
            }
            shapes[0][0] = r, shapes[0][1] = c, n_shapes = 1, i++;
        } else {
            fprintf(stderr, "unknown or incomplete option '%s'\n", a);
            usage(argv[0]);
            return 2;
        }
    }
    if (runs < 1 || gemm_runs < 0 || T < 2 || !spx_q_group_stored_ok(group) || bits < 2 || bits > 4 || out_frac < 0 ||
        out_frac > 0.5 || max_threads < 1 || max_threads > 64 || rounds < 1) {
        fprintf(stderr, "bad option value (see --help)\n");
        return 2;
    }
    /* the tables to time, in the order given; a name this CPU lacks is skipped with a note */
    const spx_qkernels *tables[8];
    int n_tables = 0;
    char klist[256];
    snprintf(klist, sizeof klist, "%s", kernels);
    for (char *sv = NULL, *tok = strtok_r(klist, ",", &sv); tok && n_tables < 8; tok = strtok_r(NULL, ",", &sv)) {
        const spx_qkernels *k = spx_qkernels_get(tok);
        if (k) tables[n_tables++] = k;
        else if (strcmp(kernels, "scalar,avx2,avx512,amx")) fprintf(stderr, "--kernels: no %s table on this CPU\n", tok);
    }
    const spx_qkernels *mtok_k = spx_qkernels_get("avx2");
    if (use_tiled && (group != 32 || bits != 4)) {
        if (layout_set) {
            fprintf(stderr, "--layout tiled/both needs --group 32 and --bits 4\n");
            return 2;
        }
        use_tiled = 0; /* the default, both, means rows only here */
    }
    if (mtok && !mtok_k) {
        fprintf(stderr, "--mtok: this CPU has no avx2 table\n");
        return 2;
    }
    if (mtok && T < mt_m[MT_N - 1]) T = mt_m[MT_N - 1]; /* x and y hold the largest M */
    if (mtok) {
        printf("bench_kernels --mtok: %d-bit G%d, %.1f%% outliers, median of %d calls x %d rounds per cell\n", bits,
               group, 100 * out_frac, runs, rounds);
        printf("(r/M1: time / time at M = 1, wall and process cpu; us/tok: time / M)\n");
        printf("%-12s %-7s %3s %-5s | %3s | %10s %9s %9s | %10s\n", "shape", "kernel", "thr", "lay", "M", "us",
               "r/M1", "cpu r/M1", "us/tok");
    } else {
    printf("bench_kernels: %d-bit G%d, %.1f%% outliers, GEMV median of %d x %d rounds, GEMM T=%lld "
           "median of %d x %d rounds\n",
           bits, group, 100 * out_frac, runs, rounds, (long long)T, gemm_runs, rounds);
    printf("(cpu: the same from process CPU time / threads, for a shared machine; t/r: tiled time / "
           "rows time, wall and cpu)\n");
    printf("%-12s %-7s %3s %-5s | %10s %9s %9s %11s | %10s %9s %9s %11s\n", "shape", "kernel", "thr",
           "lay", "GEMV us", "GB/s", "cpu GB/s", "t/r", "GEMM ms", "GFLOP/s", "cpu GF/s",
           "t/r");
    }
    for (int si = 0; si < n_shapes; si++) {
        int64_t rows = shapes[si][0], cols = shapes[si][1];
        if (cols % group) {
            fprintf(stderr, "shape %lldx%lld: cols not a multiple of %d\n", (long long)rows,
                    (long long)cols, group);
            continue;
        }
        bmat m;
        if (!bmat_init(&m, rows, cols, bits, group, out_frac)) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        /* the layouts to time: qs[li], names[li] */
        spx_qtensor tq;
        void *tmem = NULL;
        const spx_qtensor *qs[2];
        const char *names[2];
        int nl = 0;
        if (use_rows) qs[nl] = &m.q, names[nl++] = "rows";
        if (use_tiled) {
            spx_err e;
            spx_err_clear(&e);
            if (spx_q_tile_alloc(&m.q, &tq, &tmem, &e) == SPX_OK)
                qs[nl] = &tq, names[nl++] = "tiled";
            else
                fprintf(stderr, "shape %lldx%lld: no tiled copy: %s\n", (long long)rows, (long long)cols, e.msg);
        }
        if (!nl) {
            bmat_free(&m);
            continue;
        }
        float *x = malloc((size_t)(T * cols) * sizeof *x);
        float *y = malloc((size_t)(T * rows) * sizeof *y);
        for (int64_t i = 0; i < T * cols; i++) x[i] = 2 * next_unit() - 1;
        char shape[32];
        snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
        for (int nt = 1; nt <= max_threads; nt++) {
            spx_pool *pool;
            spx_err e;
            spx_err_clear(&e);
            if (spx_pool_new(nt, &pool, &e) != SPX_OK) {
                fprintf(stderr, "%s\n", e.msg);
                return 1;
            }
            if (mtok) mtok_table(pool, mtok_k, qs, names, nl, shape, x, y, runs, rounds);
            for (int ki = 0; ki < n_tables && !mtok; ki++) {
                const spx_qkernels *k = tables[ki];
                int sc = !strcmp(k->name, "scalar"), gm = gemm_runs && (!sc || scalar_gemm);
                double tv[2], cv[2], tg[2], cg[2];
                time_layouts(pool, k, qs, nl, x, 1, y, runs, sc ? 1 : 3, rounds, tv, cv);
                if (gm) time_layouts(pool, k, qs, nl, x, T, y, gemm_runs, 1, rounds, tg, cg);
                double fl = 2.0 * (double)rows * (double)cols * (double)T;
                for (int li = 0; li < nl; li++) {
                    /* bytes: the row-major count (the default shapes have no tile padding) */
                    printf("%-12s %-7s %3d %-5s | %10.1f %9.2f %9.2f", shape, k->name, nt, names[li],
                           tv[li] * 1e6, (double)m.bytes / tv[li] * 1e-9, (double)m.bytes / cv[li] * 1e-9);
                    if (li) printf(" %5.3f %5.3f |", tv[1] / tv[0], cv[1] / cv[0]);
                    else printf(" %11s |", "");
                    if (gm) {
                        printf(" %10.2f %9.1f %9.1f", tg[li] * 1e3, fl / tg[li] * 1e-9, fl / cg[li] * 1e-9);
                        if (li) printf(" %5.3f %5.3f", tg[1] / tg[0], cg[1] / cg[0]);
                    } else {
                        printf(" %10s %9s %9s", "-", "-", "-");
                    }
                    printf("\n");
                }
                fflush(stdout);
            }
            spx_pool_free(pool);
        }
        free(x);
        free(y);
        free(tmem);
        bmat_free(&m);
    }
    return 0;
}
