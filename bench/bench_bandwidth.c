/* bench_bandwidth.c: the machine's read bandwidth, the yardstick for
 * memory-bound decoding. A read-only stream over a buffer far larger than
 * the last-level cache, split over threads, repeated; reports the median
 * and best GB/s (1e9 bytes/s).
 *
 *   build/bench/bench_bandwidth [--mb 1024] [--threads N] [--reps 10] [--json]
 */
#include "core/pool.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct {
    const uint8_t *buf;
    size_t n;
    double sums[1024];
} job;

#if defined(__x86_64__)
__attribute__((target("avx2"))) static double read_avx2(const uint8_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (double)_mm256_extract_epi64(a, 0);
}
#endif

static double read_plain(const uint8_t *p, size_t n) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) {
        a ^= q[i];
        b ^= q[i + 1];
        c ^= q[i + 2];
        d ^= q[i + 3];
    }
    return (double)(a ^ b ^ c ^ d);
}

static void task(void *arg, int tid, int nth) {
    job *j = arg;
    int64_t b, e;
    spx_pool_range((int64_t)(j->n / 4096), tid, nth, 1, &b, &e);
    const uint8_t *p = j->buf + (size_t)b * 4096;
    size_t n = (size_t)(e - b) * 4096;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        j->sums[tid] += read_avx2(p, n);
        return;
    }
#endif
    j->sums[tid] += read_plain(p, n);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    size_t mb = 1024;
    int threads = 0, reps = 10, json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else {
            fprintf(stderr, "usage: bench_bandwidth [--mb MiB (default 1024)] [--threads N] [--reps R] [--json]\n");
            return 2;
        }
    }
    if (mb < 64 || reps < 1 || reps > 1000) { fprintf(stderr, "bench_bandwidth: --mb >= 64, --reps 1..1000\n"); return 2; }
    spx_pool *pool;
    spx_err e;
    spx_err_clear(&e);
    if (spx_pool_new(threads, &pool, &e) != SPX_OK) { fprintf(stderr, "%s\n", e.msg); return 1; }
    size_t n = mb << 20;
    uint8_t *buf = aligned_alloc(4096, n);
    if (!buf) { fprintf(stderr, "bench_bandwidth: cannot allocate %zu MiB\n", mb); return 1; }
    for (size_t i = 0; i < n; i += 64) buf[i] = (uint8_t)i; /* touch every page */
    memset(buf, 1, n);
    job j = {buf, n, {0}};
    spx_pool_run(pool, task, &j); /* warm-up */
    double *gbs = malloc((size_t)reps * sizeof *gbs);
    for (int r = 0; r < reps; r++) {
        double t0 = spx_now();
        spx_pool_run(pool, task, &j);
        gbs[r] = (double)n / (spx_now() - t0) / 1e9;
    }
    qsort(gbs, (size_t)reps, sizeof *gbs, cmp);
    double med = gbs[reps / 2], best = gbs[reps - 1];
    if (json)
        printf("{\"read_gbps_median\": %.3f, \"read_gbps_best\": %.3f, \"threads\": %d, \"buffer_mib\": %zu, \"reps\": %d}\n",
               med, best, spx_pool_size(pool), mb, reps);
    else
        printf("read bandwidth: median %.2f GB/s, best %.2f GB/s (%d threads, %zu MiB buffer, %d reps)\n", med, best,
               spx_pool_size(pool), mb, reps);
    double s = 0;
    for (int t = 0; t < spx_pool_size(pool); t++) s += j.sums[t];
    if (s == 12345.678) puts(""); /* keep the reads alive */
    free(gbs);
    free(buf);
    spx_pool_free(pool);
    return 0;
}
