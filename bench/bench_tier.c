/* bench_tier.c: throughput of the refinement backing tier
 * (src/refine/tier.h). A program, not a test: prints a table.
 *
 * A file of --mib MiB (256 by default) in $TMPDIR (or /tmp) stands for a
 * .refine tier: --mats matrices of --rows x --cols 4-bit residual
 * columns, packed back to back (col_bytes = rows / 2 = 2048 bytes at the
 * default 4096 rows, so 8 MiB per matrix and 32 matrices). One step asks
 * every matrix for k columns (--k, 64 by default: 16 per 1,024-channel
 * chunk) in one spx_tier_get_many, then calls spx_tier_step_end. Column
 * choice: with probability `reuse` a column of that matrix's previous
 * selection, else a uniformly random column (reuse 0 is fully random;
 * real selections recur across steps, the paper's Figure 5).
 *
 * Per row: miss mode (skip, wait), reads (direct, or buffered: through
 * the page cache, which after writing the file holds it, so buffered rows
 * measure the cache and lookup path, not the disk), cache MiB, reuse;
 * then steps measured, lookups per second (requests over the time spent
 * in get_many alone), microseconds per get_many call (one matrix's
 * batch), hit rate, MB/s the file delivered over the wall time, the WAIT
 * stalls in ms per step, and the wall ms per step. A step also "computes"
 * for --step-ms milliseconds (a sleep after its lookups; 5 by default,
 * the order of a CPU decode step), during which the loaders run: a SKIP
 * step's hit rate depends on how much they load in that time. Each row
 * runs 20 warm-up steps, then --steps (200) measured ones.
 * Options: --mib N --rows N --k N --loaders N --steps N --step-ms N
 * --file PATH (reuse an existing file of at least --mib MiB). */
#include "core/util.h"
#include "refine/tier.h"

#include <fcntl.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng = 0x2545f4914f6cdd1dULL;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

typedef struct cfg {
    int64_t mib, rows, k, loaders, steps, step_ms;
    const char *file;
} cfg;

static int write_file(const char *path, uint64_t bytes) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t chunk = 1 << 20;
    uint64_t *buf = malloc(chunk);
    if (!buf) {
        fclose(f);
        return -1;
    }
    for (uint64_t done = 0; done < bytes; done += chunk) {
        for (size_t i = 0; i < chunk / 8; i++) buf[i] = next_u64();
        size_t n = bytes - done < chunk ? (size_t)(bytes - done) : chunk;
        if (fwrite(buf, 1, n, f) != n) {
            free(buf);
            fclose(f);
            return -1;
        }
    }
    free(buf);
    return fclose(f);
}

static void run_row(const cfg *c, const char *path, int mode, uint64_t cache_mib, double reuse) {
    uint64_t col_bytes = (uint64_t)(c->rows / 2);
    uint64_t mat_bytes = col_bytes * (uint64_t)c->rows; /* square: cols = rows */
    int64_t mats = (int64_t)((uint64_t)c->mib * 1048576 / mat_bytes);
    int64_t k = c->k, ncols = c->rows;
    spx_err e;
    spx_err_clear(&e);
    spx_tier *t = NULL;
    if (spx_tier_open(path, cache_mib << 20, mode, (int)c->loaders, &t, &e) != SPX_OK) {
        fprintf(stderr, "bench_tier: %s\n", e.msg);
        return;
    }
    int64_t *prev = malloc((size_t)(mats * k) * sizeof *prev);
    uint64_t *off = malloc((size_t)k * sizeof *off);
    uint32_t *len = malloc((size_t)k * sizeof *len);
    const uint8_t **out = malloc((size_t)k * sizeof *out);
    for (int64_t i = 0; i < mats * k; i++) prev[i] = (int64_t)(next_u64() % (uint64_t)ncols);
    int wait = (mode & SPX_TIER_WAIT) != 0;
    int64_t warm = 20, steps = c->steps;
    double t_get = 0, t_wall = 0;
    struct timespec nap = {(time_t)(c->step_ms / 1000), (long)(c->step_ms % 1000) * 1000000L};
    spx_tier_stats s0, s1;
    uint64_t sink = 0;
    for (int64_t step = 0; step < warm + steps; step++) {
        if (step == warm) {
            if (!wait) spx_tier_drain(t, &e);
            spx_tier_stats_get(t, &s0);
            t_get = 0;
            t_wall = spx_now();
        }
        for (int64_t m = 0; m < mats; m++) {
            int64_t *sel = prev + m * k;
            for (int64_t j = 0; j < k; j++) {
                double u = (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0);
                if (u >= reuse) sel[j] = (int64_t)(next_u64() % (uint64_t)ncols);
                off[j] = (uint64_t)m * mat_bytes + (uint64_t)sel[j] * col_bytes;
                len[j] = (uint32_t)col_bytes;
            }
            double t0 = spx_now();
            if (spx_tier_get_many(t, (size_t)k, off, len, out, &e) != SPX_OK) {
                fprintf(stderr, "bench_tier: %s\n", e.msg);
                goto done;
            }
            t_get += spx_now() - t0;
            for (int64_t j = 0; j < k; j++)
                if (out[j]) sink += out[j][0];
        }
        if (c->step_ms > 0) nanosleep(&nap, NULL);
        if (spx_tier_step_end(t, &e) != SPX_OK) {
            fprintf(stderr, "bench_tier: %s\n", e.msg);
            goto done;
        }
    }
    t_wall = spx_now() - t_wall;
    spx_tier_stats_get(t, &s1);
    {
        double req = (double)(s1.requests - s0.requests), hits = (double)(s1.hits - s0.hits);
        double rd = (double)(s1.bytes_read - s0.bytes_read);
        double calls = (double)(steps * mats);
        printf("%-5s %-8s %5llu %5.2f %6lld %10.2f %9.2f %6.3f %9.1f %9.2f %8.2f\n", wait ? "wait" : "skip",
               s1.direct ? "direct" : "buffered", (unsigned long long)cache_mib, reuse, (long long)steps,
               req / t_get / 1e6, t_get / calls * 1e6, hits / req, rd / t_wall / 1e6,
               (s1.wait_s - s0.wait_s) / (double)steps * 1e3, t_wall / (double)steps * 1e3);
    }
done:
    if (sink == 0xdeadbeef) printf(" ");
    free(prev);
    free(off);
    free(len);
    free(out);
    spx_tier_close(t);
}

int main(int argc, char **argv) {
    cfg c = {256, 4096, 64, 4, 200, 5, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *dst = !strcmp(a, "--mib")          ? &c.mib
                       : !strcmp(a, "--rows")       ? &c.rows
                       : !strcmp(a, "--k")          ? &c.k
                       : !strcmp(a, "--loaders")    ? &c.loaders
                       : !strcmp(a, "--steps")      ? &c.steps
                       : !strcmp(a, "--step-ms")    ? &c.step_ms
                                                    : NULL;
        if (dst && v) {
            *dst = atoll(v);
            i++;
        } else if (!strcmp(a, "--file") && v) {
            c.file = v;
            i++;
        } else {
            fprintf(stderr, "usage: bench_tier [--mib 256] [--rows 4096] [--k 64] [--loaders 4] [--steps 200]"
                            " [--step-ms 5] [--file PATH]\n");
            return 2;
        }
    }
    if (c.rows < 2 || c.rows % 2 || c.k < 1 || c.k > c.rows || c.mib < 1 || c.loaders < 1 || c.steps < 1 || c.step_ms < 0) {
        fprintf(stderr, "bench_tier: bad options\n");
        return 2;
    }
    char path[1024];
    int made = 0;
    if (c.file) {
        snprintf(path, sizeof path, "%s", c.file);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/bench_tier.%d.refine", tmp && *tmp ? tmp : "/tmp", (int)getpid());
        if (write_file(path, (uint64_t)c.mib << 20) != 0) {
            fprintf(stderr, "bench_tier: cannot write %s\n", path);
            return 1;
        }
        made = 1;
    }
    printf("bench_tier: %s, %lld MiB, rows %lld (col %lld B), k %lld per matrix, %lld loaders, %lld ms per step\n",
           path, (long long)c.mib, (long long)c.rows, (long long)(c.rows / 2), (long long)c.k, (long long)c.loaders,
           (long long)c.step_ms);
    printf("%-5s %-8s %5s %5s %6s %10s %9s %6s %9s %9s %8s\n", "miss", "reads", "MiB", "reuse", "steps", "Mlookup/s",
           "us/call", "hit", "disk MB/s", "wait ms/st", "ms/step");
    const uint64_t caches[2] = {8, 32};
    const double reuses[2] = {0.0, 0.9};
    for (int m = 0; m < 2; m++)
        for (int ci = 0; ci < 2; ci++)
            for (int ri = 0; ri < 2; ri++) run_row(&c, path, m ? SPX_TIER_WAIT : SPX_TIER_SKIP, caches[ci], reuses[ri]);
    for (int ci = 0; ci < 2; ci++) run_row(&c, path, SPX_TIER_SKIP | SPX_TIER_BUFFERED, caches[ci], 0.9);
    for (int ci = 0; ci < 2; ci++) run_row(&c, path, SPX_TIER_WAIT | SPX_TIER_BUFFERED, caches[ci], 0.9);
    if (made) unlink(path);
    return 0;
}
