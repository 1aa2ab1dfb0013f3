/* test_tier.c: the refinement backing tier (src/refine/tier.h).
 *
 * A temporary file of known random bytes, whose size is not a multiple of
 * 4 KiB, is read through the tier:
 * - WAIT mode returns the exact bytes of every range asked for: random
 *   ranges of 1 byte to 9 KiB, ranges straddling 4 KiB boundaries, the
 *   first and last bytes and ranges ending at the file's end; single gets
 *   and batches (all pointers of a batch checked after the batch, so a
 *   slot freed or reused mid-step shows); with O_DIRECT where the file
 *   system allows it and forced buffered reads.
 * - SKIP mode: a miss returns NULL and is queued once; after
 *   spx_tier_drain the same request returns the bytes; the queue holds at
 *   most a budget's worth (the rest are dropped, counted).
 * - Budget and order: current bytes <= budget after every step_end; LRU
 *   evicts the least recently used entry (a touched entry survives, the
 *   untouched one goes); a step may pin more than the budget, trimmed at
 *   step_end to the most recent entries; a range longer than the budget is
 *   never cached or read.
 * - Errors: a missing file fails at open naming it; a range past the end
 *   of the file, a zero length and a bad batch fail naming the file (and
 *   leave every out[] NULL and nothing counted); a loader's short read of
 *   a file truncated after open is latched: drain, get and step_end return
 *   it, naming the file and the offset.
 * - Concurrency: two loader threads and two caller threads issuing
 *   batches at once (SKIP and WAIT), every returned byte checked, the
 *   counters consistent at the end (hits + misses = requests; after a
 *   drain every queued range was loaded). Run under ASan/UBSan by the
 *   SAN=1 build.
 * - Scratch tiers (spx_tier_create): the file is gone from its folder at
 *   once; put ranges are returned at once from the cache (hits) and, once
 *   evicted, from the file (O_DIRECT where allowed, buffered forced);
 *   a put over a cached range replaces its bytes; read_now returns the
 *   current bytes whether cached or not; a missing folder and a size no
 *   file system can reserve fail naming the folder; put/read_now on a
 *   read-only tier and past the end fail naming the file. */
#include "testlib.h"

#include "refine/tier.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FILE_BYTES (3u * 65536u + 1234u) /* not a multiple of 4096 */

static uint8_t *g_ref; /* the file's bytes */
static char g_path[512];

static int range_ok(const uint8_t *p, uint64_t off, uint32_t len) {
    return p && memcmp(p, g_ref + off, len) == 0;
}
static int range_ok_in(const uint8_t *p, const uint8_t *ref, uint64_t off, uint32_t len) {
    return p && memcmp(p, ref + off, len) == 0;
}

static void rand_range(uint64_t *rng, uint32_t max_len, uint64_t *off, uint32_t *len) {
    *len = 1 + (uint32_t)(tl_rand_u64(rng) % max_len);
    *off = tl_rand_u64(rng) % (FILE_BYTES - *len + 1);
}

static spx_tier *open_ok(const char *path, uint64_t budget, int mode, int loaders) {
    spx_err e;
    spx_err_clear(&e);
    spx_tier *t = NULL;
    spx_status s = spx_tier_open(path, budget, mode, loaders, &t, &e);
    CHECK(s == SPX_OK && t, "open %s: %s", path, e.msg);
    return s == SPX_OK ? t : NULL;
}

static void check_budget(spx_tier *t, const char *what) {
    spx_tier_stats s;
    spx_tier_stats_get(t, &s);
    CHECK(s.cur_bytes <= s.budget, "%s: %llu cached bytes over the %llu budget after step_end", what,
          (unsigned long long)s.cur_bytes, (unsigned long long)s.budget);
}

/* ======================================================================
 * WAIT mode: exact bytes */
static void test_wait_exact(int mode_flags) {
    spx_tier *t = open_ok(g_path, 256 * 1024, SPX_TIER_WAIT | mode_flags, 2);
    if (!t) return;
    spx_err e;
    spx_err_clear(&e);
    uint64_t rng = 0x1234 + (uint64_t)mode_flags;
    uint64_t n_req = 0, n_dup = 0;

    /* Edges: around every 4 KiB boundary, the file's first and last bytes,
     * ranges ending exactly at the end, the whole last partial block. */
    uint64_t offs[256];
    uint32_t lens[256];
    int ne = 0;
    for (uint64_t b = 4096; b < FILE_BYTES && ne < 200; b += 4096 * 5) {
        offs[ne] = b - 1, lens[ne++] = 2;
        offs[ne] = b - 100, lens[ne++] = 4196 + 50;
    }
    offs[ne] = 0, lens[ne++] = 1;
    offs[ne] = FILE_BYTES - 1, lens[ne++] = 1;
    offs[ne] = FILE_BYTES - 5000, lens[ne++] = 5000;
    offs[ne] = FILE_BYTES - (FILE_BYTES % 4096), lens[ne++] = FILE_BYTES % 4096;
    offs[ne] = FILE_BYTES - 4097, lens[ne++] = 4097;
    offs[ne] = 0, lens[ne++] = 8192;
    for (int i = 0; i < ne; i++) {
        const uint8_t *p = (const uint8_t *)1;
        spx_status s = spx_tier_get(t, offs[i], lens[i], &p, &e);
        n_req++;
        CHECK(s == SPX_OK && range_ok(p, offs[i], lens[i]), "edge range %llu+%u: status %d, %s",
              (unsigned long long)offs[i], lens[i], (int)s, e.msg);
        if (i % 4 == 3) {
            CHECK(spx_tier_step_end(t, &e) == SPX_OK, "step_end: %s", e.msg);
            check_budget(t, "edges");
        }
    }
    CHECK(spx_tier_step_end(t, &e) == SPX_OK, "step_end: %s", e.msg);

    /* Random single gets, a step every 8. */
    for (int i = 0; i < 1500; i++) {
        uint64_t off;
        uint32_t len;
        rand_range(&rng, 9000, &off, &len);
        const uint8_t *p = (const uint8_t *)1;
        spx_status s = spx_tier_get(t, off, len, &p, &e);
        n_req++;
        CHECK(s == SPX_OK && range_ok(p, off, len), "range %llu+%u: status %d, %s", (unsigned long long)off, len,
              (int)s, e.msg);
        if (i % 8 == 7) {
            CHECK(spx_tier_step_end(t, &e) == SPX_OK, "step_end: %s", e.msg);
            check_budget(t, "random gets");
        }
    }
    CHECK(spx_tier_step_end(t, &e) == SPX_OK, "step_end: %s", e.msg);

    /* Batches of 40, checked after the whole batch. */
    for (int b = 0; b < 40; b++) {
        uint64_t off[40];
        uint32_t len[40];
        const uint8_t *out[40];
        for (int i = 0; i < 40; i++) {
            rand_range(&rng, 8192, &off[i], &len[i]);
            out[i] = (const uint8_t *)1;
        }
        if (b % 5 == 0) off[7] = off[3], len[7] = len[3], n_dup++; /* a duplicate in the batch */
        spx_status s = spx_tier_get_many(t, 40, off, len, out, &e);
        n_req += 40;
        CHECK(s == SPX_OK, "batch %d: %s", b, e.msg);
        for (int i = 0; i < 40; i++)
            CHECK(range_ok(out[i], off[i], len[i]), "batch %d item %d: %llu+%u wrong or NULL", b, i,
                  (unsigned long long)off[i], len[i]);
        CHECK(spx_tier_step_end(t, &e) == SPX_OK, "step_end: %s", e.msg);
        check_budget(t, "batches");
    }

    spx_tier_stats s;
    spx_tier_stats_get(t, &s);
    CHECK(s.requests == n_req && s.hits + s.misses == s.requests, "requests %llu (expected %llu), hits %llu + misses %llu",
          (unsigned long long)s.requests, (unsigned long long)n_req, (unsigned long long)s.hits,
          (unsigned long long)s.misses);
    CHECK(s.loads == s.queued && s.loads > 0 && s.pending == 0, "loads %llu, queued %llu, pending %llu",
          (unsigned long long)s.loads, (unsigned long long)s.queued, (unsigned long long)s.pending);
    /* Random ranges do not recur: every request misses; each loads once,
     * a duplicate within a batch waits for its twin's load. */
    CHECK(s.misses == s.loads + n_dup, "WAIT: %llu misses, %llu loads, %llu duplicates", (unsigned long long)s.misses,
          (unsigned long long)s.loads, (unsigned long long)n_dup);
    CHECK(s.waits > 0 && s.wait_s > 0, "WAIT stalls counted: %llu, %.6f s", (unsigned long long)s.waits, s.wait_s);
    CHECK(s.evictions > 0 && s.peak_bytes <= s.budget + 8 * 9000 * 40, "evictions %llu peak %llu",
          (unsigned long long)s.evictions, (unsigned long long)s.peak_bytes);
    if (mode_flags & SPX_TIER_BUFFERED)
        CHECK(!s.direct && s.bytes_read == s.bytes_loaded, "buffered: direct %d, read %llu, loaded %llu", s.direct,
              (unsigned long long)s.bytes_read, (unsigned long long)s.bytes_loaded);
    else if (s.direct)
        CHECK(s.align >= 4096 && s.bytes_read >= s.bytes_loaded, "direct: align %u, read %llu < loaded %llu",
              s.align, (unsigned long long)s.bytes_read, (unsigned long long)s.bytes_loaded);
    printf("wait_exact(%s): reads %s (align %u), %llu requests, hit rate %.3f, %llu bytes read for %llu wanted\n",
           mode_flags ? "buffered" : "default", s.direct ? "O_DIRECT" : "buffered", s.align,
           (unsigned long long)s.requests, (double)s.hits / (double)s.requests, (unsigned long long)s.bytes_read,
           (unsigned long long)s.bytes_loaded);
    spx_tier_close(t);
}

/* ======================================================================
 * SKIP mode */
static void test_skip(void) {
    spx_tier *t = open_ok(g_path, 64 * 1024, SPX_TIER_SKIP, 1);
    if (!t) return;
    spx_err e;
    spx_err_clear(&e);
    const uint8_t *p = (const uint8_t *)1;
    CHECK(spx_tier_get(t, 5000, 3000, &p, &e) == SPX_OK && p == NULL, "first get is a miss (p=%p) %s", (void *)p,
          e.msg);
    const uint8_t *p2 = (const uint8_t *)1;
    CHECK(spx_tier_get(t, 5000, 3000, &p2, &e) == SPX_OK, "second get: %s", e.msg);
    CHECK(p2 == NULL || range_ok(p2, 5000, 3000), "second get: NULL or the bytes");
    spx_tier_stats s;
    spx_tier_stats_get(t, &s);
    CHECK(s.queued == 1, "a missed range is queued once (queued %llu)", (unsigned long long)s.queued);
    CHECK(spx_tier_drain(t, &e) == SPX_OK, "drain: %s", e.msg);
    p = NULL;
    CHECK(spx_tier_get(t, 5000, 3000, &p, &e) == SPX_OK && range_ok(p, 5000, 3000), "after drain: the bytes");
    spx_tier_stats_get(t, &s);
    CHECK(s.loads == 1 && s.hits >= 1 && s.pending == 0 && s.cur_bytes == 3000, "loads %llu hits %llu cur %llu",
          (unsigned long long)s.loads, (unsigned long long)s.hits, (unsigned long long)s.cur_bytes);
    CHECK(spx_tier_step_end(t, &e) == SPX_OK, "step_end: %s", e.msg);
    spx_tier_close(t);

    /* Queue limit: budget 8192; one batch of four 3000-byte misses queues
     * two (6000 <= 8192) and drops two (the batch holds the lock, so no
     * loader can take one in between). */
    t = open_ok(g_path, 8192, SPX_TIER_SKIP, 2);
    if (!t) return;
    uint64_t off[4] = {0, 10000, 20000, 30000};
    uint32_t len[4] = {3000, 3000, 3000, 3000};
    const uint8_t *out[4];
    CHECK(spx_tier_get_many(t, 4, off, len, out, &e) == SPX_OK, "batch: %s", e.msg);
    CHECK(!out[0] && !out[1] && !out[2] && !out[3], "all four miss");
    spx_tier_stats_get(t, &s);
    CHECK(s.queued == 2 && s.dropped == 2 && s.misses == 4, "queued %llu dropped %llu misses %llu",
          (unsigned long long)s.queued, (unsigned long long)s.dropped, (unsigned long long)s.misses);
    CHECK(spx_tier_drain(t, &e) == SPX_OK && spx_tier_step_end(t, &e) == SPX_OK, "drain: %s", e.msg);
    CHECK(spx_tier_get_many(t, 4, off, len, out, &e) == SPX_OK, "batch: %s", e.msg);
    CHECK(range_ok(out[0], 0, 3000) && range_ok(out[1], 10000, 3000) && !out[2] && !out[3],
          "the two loaded hit, the dropped two miss");
    spx_tier_close(t);
}

/* ======================================================================
 * LRU order, pinning over budget, oversize */
static int get_hit(spx_tier *t, uint64_t off, uint32_t len) {
    spx_err e;
    spx_err_clear(&e);
    spx_tier_stats a, b;
    spx_tier_stats_get(t, &a);
    const uint8_t *p = NULL;
    spx_status s = spx_tier_get(t, off, len, &p, &e);
    CHECK(s == SPX_OK && range_ok(p, off, len), "get %llu+%u: %s", (unsigned long long)off, len, e.msg);
    CHECK(spx_tier_step_end(t, &e) == SPX_OK, "step_end: %s", e.msg);
    check_budget(t, "lru");
    spx_tier_stats_get(t, &b);
    return b.hits == a.hits + 1;
}

static void test_lru(void) {
    /* Budget of four 1000-byte entries A..E (offsets 0, 1000, ...; not
     * aligned). After A B C D, touching A makes B the least recent, so
     * loading E evicts B; then A C D E hit (in that order, so A becomes
     * the least recent), and reloading B evicts A. */
    spx_tier *t = open_ok(g_path, 4000, SPX_TIER_WAIT, 1);
    if (!t) return;
    const uint32_t L = 1000;
    uint64_t A = 0, B = 1000, C = 2000, D = 3000, E = 4000;
    CHECK(!get_hit(t, A, L), "A loads");
    CHECK(!get_hit(t, B, L), "B loads");
    CHECK(!get_hit(t, C, L), "C loads");
    CHECK(!get_hit(t, D, L), "D loads");
    CHECK(get_hit(t, A, L), "A hits");
    CHECK(!get_hit(t, E, L), "E loads");
    spx_tier_stats s;
    spx_tier_stats_get(t, &s);
    CHECK(s.evictions == 1 && s.entries == 4 && s.cur_bytes == 4000, "one eviction (%llu), 4 entries (%llu)",
          (unsigned long long)s.evictions, (unsigned long long)s.entries);
    CHECK(get_hit(t, A, L), "A survived (it was touched)");
    CHECK(get_hit(t, C, L), "C hits");
    CHECK(get_hit(t, D, L), "D hits");
    CHECK(get_hit(t, E, L), "E hits");
    CHECK(!get_hit(t, B, L), "B was the one evicted");
    CHECK(!get_hit(t, A, L), "reloading B evicted A, the least recent");
    CHECK(get_hit(t, B, L), "B cached again");
    spx_tier_close(t);

    /* One step pins eight entries, twice the budget: all stay valid until
     * step_end, which keeps the four most recently used (the last four). */
    t = open_ok(g_path, 4000, SPX_TIER_WAIT, 2);
    if (!t) return;
    spx_err e;
    spx_err_clear(&e);
    uint64_t off[8];
    uint32_t len[8];
    const uint8_t *out[8];
    for (int i = 0; i < 8; i++) off[i] = 777 + (uint64_t)i * 9001, len[i] = L;
    CHECK(spx_tier_get_many(t, 8, off, len, out, &e) == SPX_OK, "batch: %s", e.msg);
    spx_tier_stats_get(t, &s);
    CHECK(s.cur_bytes == 8000 && s.evictions == 0, "pinned bytes may exceed the budget in a step (%llu, %llu evicted)",
          (unsigned long long)s.cur_bytes, (unsigned long long)s.evictions);
    for (int i = 0; i < 8; i++) CHECK(range_ok(out[i], off[i], len[i]), "pinned entry %d intact", i);
    CHECK(spx_tier_step_end(t, &e) == SPX_OK, "step_end: %s", e.msg);
    check_budget(t, "pinned");
    CHECK(get_hit(t, off[7], L), "the last one is kept");
    CHECK(get_hit(t, off[4], L), "the fourth from last is kept");
    CHECK(!get_hit(t, off[0], L), "the first one was evicted");
    spx_tier_close(t);

    /* Oversize: never cached, never read, in either mode. */
    for (int m = 0; m < 2; m++) {
        t = open_ok(g_path, 1000, m ? SPX_TIER_WAIT : SPX_TIER_SKIP, 1);
        if (!t) return;
        const uint8_t *p = (const uint8_t *)1;
        CHECK(spx_tier_get(t, 100, 2000, &p, &e) == SPX_OK && p == NULL, "oversize misses: %s", e.msg);
        CHECK(spx_tier_drain(t, &e) == SPX_OK, "drain");
        spx_tier_stats_get(t, &s);
        CHECK(s.oversize == 1 && s.misses == 1 && s.queued == 0 && s.loads == 0 && s.preads == 0,
              "oversize %llu, queued %llu, preads %llu", (unsigned long long)s.oversize, (unsigned long long)s.queued,
              (unsigned long long)s.preads);
        spx_tier_close(t);
    }
}

/* ======================================================================
 * Errors */
static void test_errors(void) {
    spx_err e;
    spx_tier *t = (spx_tier *)1;
    char missing[600];
    snprintf(missing, sizeof missing, "%s/no-such.refine", tl_tmpdir());
    for (int m = 0; m < 2; m++) {
        spx_err_clear(&e);
        spx_status s = spx_tier_open(missing, 1 << 20, m ? SPX_TIER_BUFFERED : SPX_TIER_SKIP, 1, &t, &e);
        CHECK(s == SPX_ERR_IO && t == NULL && strstr(e.msg, missing), "missing file: %d '%s'", (int)s, e.msg);
    }
    spx_err_clear(&e);
    CHECK(spx_tier_open(g_path, 1 << 20, SPX_TIER_WAIT, 0, &t, &e) == SPX_ERR_ARG, "0 loaders is an error");
    spx_err_clear(&e);
    CHECK(spx_tier_open(g_path, 1 << 20, 8, 1, &t, &e) == SPX_ERR_ARG, "unknown mode bits are an error");
    spx_err_clear(&e);
    CHECK(spx_tier_open(tl_tmpdir(), 1 << 20, SPX_TIER_WAIT, 1, &t, &e) == SPX_ERR_IO && t == NULL,
          "a directory is not a tier: %s", e.msg);

    t = open_ok(g_path, 1 << 20, SPX_TIER_WAIT, 1);
    if (!t) return;
    const uint8_t *p = (const uint8_t *)1;
    spx_err_clear(&e);
    spx_status s = spx_tier_get(t, FILE_BYTES - 10, 20, &p, &e);
    CHECK(s == SPX_ERR_RANGE && p == NULL && strstr(e.msg, g_path), "past EOF: %d '%s'", (int)s, e.msg);
    spx_err_clear(&e);
    s = spx_tier_get(t, (uint64_t)-5, 100, &p, &e);
    CHECK(s == SPX_ERR_RANGE && strstr(e.msg, g_path), "offset overflow: %d '%s'", (int)s, e.msg);
    spx_err_clear(&e);
    s = spx_tier_get(t, 10, 0, &p, &e);
    CHECK(s == SPX_ERR_ARG && strstr(e.msg, g_path), "zero length: %d '%s'", (int)s, e.msg);
    uint64_t off[3] = {0, FILE_BYTES, 100};
    uint32_t len[3] = {10, 1, 10};
    const uint8_t *out[3] = {(const uint8_t *)1, (const uint8_t *)1, (const uint8_t *)1};
    spx_err_clear(&e);
    s = spx_tier_get_many(t, 3, off, len, out, &e);
    CHECK(s == SPX_ERR_RANGE && !out[0] && !out[1] && !out[2] && strstr(e.msg, "request 1"), "bad batch: '%s'",
          e.msg);
    spx_tier_stats st;
    spx_tier_stats_get(t, &st);
    CHECK(st.requests == 0 && st.queued == 0, "a bad batch counts and queues nothing");
    spx_err_clear(&e);
    CHECK(spx_tier_get(t, FILE_BYTES - 1, 1, &p, &e) == SPX_OK && range_ok(p, FILE_BYTES - 1, 1),
          "the tier still works after a bad request");
    spx_tier_close(t);

    /* A loader's short read: the file shrinks after open. */
    char trunc_path[600];
    snprintf(trunc_path, sizeof trunc_path, "%s/trunc.refine", tl_tmpdir());
    for (int m = 0; m < 4; m++) {
        CHECK(tl_write(trunc_path, g_ref, FILE_BYTES) == 0, "write %s", trunc_path);
        int mode = (m & 1 ? SPX_TIER_WAIT : SPX_TIER_SKIP) | (m & 2 ? SPX_TIER_BUFFERED : 0);
        t = open_ok(trunc_path, 1 << 20, mode, 2);
        if (!t) return;
        CHECK(truncate(trunc_path, 8192) == 0, "truncate");
        p = (const uint8_t *)1;
        spx_err_clear(&e);
        s = spx_tier_get(t, 20000, 1000, &p, &e);
        if (m & 1) {
            CHECK(s == SPX_ERR_IO && p == NULL, "WAIT: the short read fails the get (%d)", (int)s);
        } else {
            CHECK(s == SPX_OK && p == NULL, "SKIP: a miss first (%d)", (int)s);
            spx_err_clear(&e);
            s = spx_tier_drain(t, &e);
            CHECK(s == SPX_ERR_IO, "drain returns the loader's error (%d)", (int)s);
        }
        CHECK(strstr(e.msg, trunc_path) && strstr(e.msg, "offset 20000"), "message names file and offset: '%s'",
              e.msg);
        spx_err_clear(&e);
        s = spx_tier_get(t, 0, 100, &p, &e);
        CHECK(s == SPX_ERR_IO && p == NULL && strstr(e.msg, "offset 20000"), "latched for the next get: '%s'", e.msg);
        spx_err_clear(&e);
        s = spx_tier_step_end(t, &e);
        CHECK(s == SPX_ERR_IO && strstr(e.msg, trunc_path), "and for step_end: '%s'", e.msg);
        spx_tier_stats_get(t, &st);
        CHECK(st.pending == 0 && st.entries == 0 && st.cur_bytes == 0, "the failed entry is gone");
        spx_tier_close(t);
    }
}

/* ======================================================================
 * Concurrency: two loaders, two callers */
#define COL_LEN 2048
#define COL_STRIDE 2100 /* columns not aligned, some straddle 4 KiB */
#define N_COLS ((FILE_BYTES - COL_LEN) / COL_STRIDE + 1)
#define N_HOT 20
#define BATCH 16

typedef struct conc_ctx {
    spx_tier *t;
    pthread_barrier_t *bar;
    int id, steps, batch, wait_mode;
    int bad, nulls_in_wait, errors;
    uint64_t rng;
} conc_ctx;

static void *conc_main(void *arg) {
    conc_ctx *c = arg;
    uint64_t off[64];
    uint32_t len[64];
    const uint8_t *out[64];
    spx_err e;
    for (int step = 0; step < c->steps; step++) {
        for (int i = 0; i < c->batch; i++) {
            /* A hot set of columns three times in four, else any. */
            uint64_t r = tl_rand_u64(&c->rng);
            uint64_t col = (r & 3) ? (r >> 8) % N_HOT : (r >> 8) % N_COLS;
            off[i] = col * COL_STRIDE;
            len[i] = COL_LEN;
        }
        spx_err_clear(&e);
        if (spx_tier_get_many(c->t, (size_t)c->batch, off, len, out, &e) != SPX_OK) c->errors++;
        for (int i = 0; i < c->batch; i++) {
            if (out[i] && !range_ok(out[i], off[i], len[i])) c->bad++;
            if (!out[i] && c->wait_mode) c->nulls_in_wait++;
        }
        pthread_barrier_wait(c->bar); /* every get of the step is done */
        if (c->id == 0) {
            spx_err_clear(&e);
            if (spx_tier_step_end(c->t, &e) != SPX_OK) c->errors++;
            spx_tier_stats s;
            spx_tier_stats_get(c->t, &s);
            if (s.cur_bytes > s.budget) c->bad++;
            if (step % 64 == 63 && spx_tier_drain(c->t, &e) != SPX_OK) c->errors++;
        }
        pthread_barrier_wait(c->bar); /* step_end is done */
    }
    return NULL;
}

static void test_concurrency(int wait_mode) {
    spx_tier *t = open_ok(g_path, 40 * COL_LEN, wait_mode ? SPX_TIER_WAIT : SPX_TIER_SKIP, 2);
    if (!t) return;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    conc_ctx c[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        c[k] = (conc_ctx){t, &bar, k, wait_mode ? 300 : 600, BATCH, wait_mode, 0, 0, 0, 0x9999 + (uint64_t)k * 7};
        pthread_create(&th[k], NULL, conc_main, &c[k]);
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&bar);
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_tier_drain(t, &e) == SPX_OK, "drain: %s", e.msg);
    for (int k = 0; k < 2; k++)
        CHECK(c[k].bad == 0 && c[k].errors == 0 && c[k].nulls_in_wait == 0,
              "caller %d: %d wrong ranges or over budget, %d errors, %d NULLs in WAIT", k, c[k].bad, c[k].errors,
              c[k].nulls_in_wait);
    spx_tier_stats s;
    spx_tier_stats_get(t, &s);
    CHECK(s.requests == (uint64_t)(2 * c[0].steps * BATCH) && s.hits + s.misses == s.requests,
          "requests %llu hits %llu misses %llu", (unsigned long long)s.requests, (unsigned long long)s.hits,
          (unsigned long long)s.misses);
    CHECK(s.loads == s.queued && s.pending == 0 && s.hits > 0 && s.evictions > 0,
          "loads %llu queued %llu hits %llu evictions %llu", (unsigned long long)s.loads,
          (unsigned long long)s.queued, (unsigned long long)s.hits, (unsigned long long)s.evictions);
    printf("concurrency(%s): %llu requests, hit rate %.3f, %llu loads, %llu dropped, %llu evictions\n",
           wait_mode ? "wait" : "skip", (unsigned long long)s.requests, (double)s.hits / (double)s.requests,
           (unsigned long long)s.loads, (unsigned long long)s.dropped, (unsigned long long)s.evictions);
    spx_tier_close(t);
}

static void test_scratch(int mode_flags) {
    enum { REC = 700, N = 40 }; /* 700-byte records: none aligned to 4 KiB */
    spx_tier *t = NULL;
    spx_err e;
    spx_err_clear(&e);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/scratch%d", tl_tmpdir(), mode_flags);
    CHECK(tl_mkdir(dir) == 0, "mkdir %s", dir);
    CHECK(spx_tier_create(dir, (uint64_t)REC * N, 4 * REC, SPX_TIER_WAIT | mode_flags, 2, &t, &e) == SPX_OK, "create: %s",
          e.msg);
    if (!t) return;
    CHECK(tl_dir_entries(dir) == 0, "the scratch file is still in %s", dir);
    uint8_t *want = malloc((size_t)REC * N), buf[REC];
    uint64_t rng = 77 + (uint64_t)mode_flags;
    for (size_t i = 0; i < (size_t)REC * N; i++) want[i] = (uint8_t)(tl_rand_u64(&rng) >> 56);
    for (int r = 0; r < N; r++)
        CHECK(spx_tier_put(t, (uint64_t)r * REC, REC, want + (size_t)r * REC, &e) == SPX_OK, "put %d: %s", r, e.msg);
    spx_tier_stats st;
    spx_tier_stats_get(t, &st);
    CHECK(st.writes == N && st.bytes_written == (uint64_t)REC * N && st.cur_bytes <= 4 * REC && st.entries == 4,
          "after %d puts: %llu writes, %llu cached bytes in %llu entries", N, (unsigned long long)st.writes,
          (unsigned long long)st.cur_bytes, (unsigned long long)st.entries);
    /* the newest four are cached: hits without a read */
    const uint8_t *p = NULL;
    CHECK(spx_tier_get(t, (uint64_t)(N - 1) * REC, REC, &p, &e) == SPX_OK && range_ok_in(p, want, (uint64_t)(N - 1) * REC, REC),
          "newest record");
    spx_tier_stats_get(t, &st);
    CHECK(st.hits == 1 && st.loads == 0, "the newest record was not a cache hit (%llu hits, %llu loads)",
          (unsigned long long)st.hits, (unsigned long long)st.loads);
    CHECK(spx_tier_step_end(t, &e) == SPX_OK, "step_end: %s", e.msg);
    /* every record from the file or the cache, in batches */
    for (int r0 = 0; r0 < N; r0 += 3) {
        uint64_t off[3];
        uint32_t len[3];
        const uint8_t *out[3];
        int n = N - r0 < 3 ? N - r0 : 3;
        for (int j = 0; j < n; j++) off[j] = (uint64_t)(r0 + j) * REC, len[j] = REC;
        CHECK(spx_tier_get_many(t, (size_t)n, off, len, out, &e) == SPX_OK, "get_many: %s", e.msg);
        for (int j = 0; j < n; j++) CHECK(range_ok_in(out[j], want, off[j], REC), "record %d read back", r0 + j);
        CHECK(spx_tier_step_end(t, &e) == SPX_OK, "step_end: %s", e.msg);
    }
    /* a put over a cached range, and over one only on disk */
    memset(buf, 0xA5, REC);
    CHECK(spx_tier_put(t, (uint64_t)(N - 1) * REC, REC, buf, &e) == SPX_OK && spx_tier_put(t, 0, REC, buf, &e) == SPX_OK,
          "re-put: %s", e.msg);
    memcpy(want + (size_t)(N - 1) * REC, buf, REC);
    memcpy(want, buf, REC);
    for (int r = 0; r < N; r++) {
        uint8_t got[REC];
        CHECK(spx_tier_read_now(t, (uint64_t)r * REC, REC, got, &e) == SPX_OK && !memcmp(got, want + (size_t)r * REC, REC),
              "read_now record %d: %s", r, e.msg);
        CHECK(spx_tier_get(t, (uint64_t)r * REC, REC, &p, &e) == SPX_OK && range_ok_in(p, want, (uint64_t)r * REC, REC),
              "record %d after the re-puts", r);
        CHECK(spx_tier_step_end(t, &e) == SPX_OK, "step_end: %s", e.msg);
    }
    spx_err_clear(&e);
    CHECK(spx_tier_put(t, (uint64_t)N * REC - 10, REC, buf, &e) == SPX_ERR_RANGE && strstr(e.msg, "spectra-tier-"),
          "a put past the end: %s", e.msg);
    spx_tier_close(t);
    free(want);
    /* errors */
    char missing[700];
    snprintf(missing, sizeof missing, "%s/no-such-folder", dir);
    spx_err_clear(&e);
    CHECK(spx_tier_create(missing, 4096, 4096, SPX_TIER_SKIP, 1, &t, &e) == SPX_ERR_IO && !t && strstr(e.msg, missing),
          "a missing folder: %s", e.msg);
    spx_err_clear(&e);
    CHECK(spx_tier_create(dir, (uint64_t)1 << 62, 4096, SPX_TIER_SKIP, 1, &t, &e) == SPX_ERR_IO && !t &&
              strstr(e.msg, dir) && strstr(e.msg, "no room"),
          "a tier no disk can hold: %s", e.msg);
    CHECK(tl_dir_entries(dir) == 0, "a failed create left a file in %s", dir);
    spx_tier *ro = NULL;
    spx_err_clear(&e);
    if (spx_tier_open(g_path, 4096, SPX_TIER_WAIT, 1, &ro, &e) == SPX_OK) {
        CHECK(spx_tier_put(ro, 0, 10, buf, &e) == SPX_ERR_ARG && strstr(e.msg, "read-only"), "put on a read-only tier: %s",
              e.msg);
        spx_tier_close(ro);
    }
}

int main(void) {
    g_ref = malloc(FILE_BYTES);
    uint64_t rng = 0xfeedULL;
    for (uint32_t i = 0; i < FILE_BYTES; i++) g_ref[i] = (uint8_t)(tl_rand_u64(&rng) >> 56);
    snprintf(g_path, sizeof g_path, "%s/tier.refine", tl_tmpdir());
    if (tl_write(g_path, g_ref, FILE_BYTES) != 0) {
        fprintf(stderr, "cannot write %s\n", g_path);
        return 1;
    }
    test_wait_exact(0);
    test_wait_exact(SPX_TIER_BUFFERED);
    test_skip();
    test_lru();
    test_errors();
    test_concurrency(0);
    test_concurrency(1);
    test_scratch(0);
    test_scratch(SPX_TIER_BUFFERED);
    free(g_ref);
    return tl_finish("test_tier");
}
