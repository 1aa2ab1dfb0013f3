/* tier.h: the CPU backing tier of StrataFlux weight refinement (issue 20,
 * "Delivery / CPU and unified memory"; ../shared/spec/strataflux-paper.txt
 * sections 3.3-3.4), and of the KV cache's refinement records (scratch
 * tiers, below; engine/kvlow.h): refinement bits live in a file on disk and are read
 * into an LRU RAM cache with a byte budget. A step asks for the byte
 * ranges it wants (one residual column of one matrix is one contiguous
 * range, refine.h); what is cached is handed out as pointers, what is not
 * is either skipped (the step keeps the resident weights' value for it,
 * refine.h's col[j] == NULL) and queued for background loader threads, or
 * waited for (the paper's two miss policies).
 *
 * Requests. A request is a byte range (off, len) of the file, 1 <= len,
 * off + len <= the file's size at open. An entry is identified by the
 * pair (off, len): a residual file's columns do not overlap and are always
 * asked for whole, so two requests for one column are the same pair. Two
 * different pairs are two entries even if their bytes overlap (nothing is
 * shared between them); that only costs memory, never correctness.
 *
 * What is cached: exactly the requested bytes, in a buffer of its own.
 * Reads with O_DIRECT must start, end and land on the device's alignment
 * (4096 bytes here, or the file system's larger dio alignment), so a
 * loader reads the aligned span covering the range into its own aligned
 * bounce buffer and copies out the wanted bytes. Caching whole aligned
 * pages instead was rejected: a residual column is 1-8 KiB and rarely
 * page-aligned (col_bytes = rows / 2, packed back to back), so a page
 * cache would spend up to twice the budget on the neighbours' bytes and
 * evict by pages the step did not ask for. stats.bytes_read counts what
 * the disk delivered (the aligned spans), stats.bytes_loaded the wanted
 * bytes, so the read amplification is visible.
 *
 * Lifetime of a pointer. A pointer handed out by spx_tier_get(_many) stays
 * valid until the next spx_tier_step_end: every entry used in the current
 * step is pinned and is never evicted or freed before then. step_end
 * unpins them (they become the most recently used, in the order of their
 * last use) and evicts least recently used entries until the cached bytes
 * fit the budget.
 *
 * Budget invariant: stats.cur_bytes (the bytes of loaded entries) <=
 * cache_bytes whenever no entry is pinned, in particular right after every
 * step_end. Within a step, pinned bytes alone may exceed it (WAIT mode,
 * or many hits, can pin more than the budget in one step); a load that
 * completes then first evicts unpinned entries and is itself evicted at
 * the next step_end if it still does not fit. A request longer than
 * cache_bytes is never cached and never read: it always misses (both
 * modes; stats.oversize), so the step uses the resident weights.
 *
 * Miss policies (spx_tier_mode):
 * - SPX_TIER_SKIP: a miss returns NULL at once; the range is queued for
 *   the loaders once (a range already queued or being loaded is not queued
 *   again). The queue holds at most cache_bytes of pending ranges: loading
 *   more than the cache can keep would only evict what was just loaded, so
 *   beyond that a miss is dropped (stats.dropped) and asked again by a
 *   later step. FIFO order.
 * - SPX_TIER_WAIT: the batch's misses are queued (past the queue limit)
 *   and the call blocks until all of them are loaded, so the loaders read
 *   a batch's columns concurrently; every non-oversize request then
 *   returns its bytes. Each call that blocked is one stall
 *   (stats.waits, stats.wait_s).
 * SPX_TIER_BUFFERED may be OR-ed into the mode to skip O_DIRECT and read
 * through the page cache (tests, and file systems where that is faster);
 * without it the tier tries O_DIRECT and falls back to buffered reads
 * where the file system refuses it (stats.direct says which).
 *
 * Threads and locking: one mutex guards the table, the lists, the queue
 * and the stats; the loaders hold it only to take a job and to publish its
 * result (the pread and the copy run unlocked). spx_tier_get_many takes
 * it once per batch (a WAIT batch releases it while it sleeps on a
 * condition variable). get and get_many may be called from several
 * threads at once; step_end must not run concurrently with a get of the
 * same step, nor may a pointer of the step be used after it.
 *
 * Errors. Bad requests (len 0, past the end of the file) fail the call
 * that made them with SPX_ERR_ARG / SPX_ERR_RANGE and a message naming the
 * file, the offset and the length; nothing of that batch is pinned or
 * queued. An I/O error or short read in a loader is latched: its message
 * (file, offset, length, cause) is returned with its status by every later
 * get, get_many, step_end and drain; a tier that could not read its file
 * stays failed (close it).
 *
 * Limits: n_loader_threads in [1, SPX_TIER_MAX_LOADERS]; lengths are
 * uint32; the file is read only (its size is taken at open; a file that
 * shrinks afterwards shows up as a loader's short read), except a scratch
 * tier's (spx_tier_create: the KV cache's refinement bits), which its
 * owner writes. */
#ifndef SPX_TIER_H
#define SPX_TIER_H

#include "core/err.h"
#include <stddef.h>
#include <stdint.h>

#define SPX_TIER_MAX_LOADERS 64
#define SPX_TIER_ALIGN 4096 /* O_DIRECT span and buffer alignment (at least) */

typedef enum spx_tier_mode {
    SPX_TIER_SKIP = 0,    /* a miss returns NULL and is queued for the loaders */
    SPX_TIER_WAIT = 1,    /* a miss is loaded before the call returns */
    SPX_TIER_BUFFERED = 2 /* flag: do not try O_DIRECT */
} spx_tier_mode;

typedef struct spx_tier spx_tier;

typedef struct spx_tier_stats {
    uint64_t requests;     /* ranges asked for (get counts 1, get_many n) */
    uint64_t hits;         /* answered from the cache without waiting */
    uint64_t misses;       /* requests - hits (WAIT: loaded while waiting; oversize included) */
    uint64_t queued;       /* ranges put on the loader queue */
    uint64_t dropped;      /* SKIP misses not queued: the queue held cache_bytes already */
    uint64_t oversize;     /* requests longer than cache_bytes (never cached) */
    uint64_t loads;        /* loader reads completed successfully (ranges) */
    uint64_t bytes_loaded; /* wanted bytes of those reads */
    uint64_t bytes_read;   /* bytes the file delivered (aligned spans under O_DIRECT) */
    uint64_t preads;       /* pread calls */
    uint64_t waits;        /* WAIT calls that had to block */
    double wait_s;         /* total seconds spent blocked in them */
    uint64_t evictions;    /* entries evicted (LRU) */
    uint64_t writes;       /* spx_tier_put calls (scratch tiers) */
    uint64_t bytes_written;/* their bytes */
    uint64_t cur_bytes;    /* bytes of loaded entries now cached */
    uint64_t peak_bytes;   /* largest cur_bytes seen */
    uint64_t entries;      /* loaded entries now cached */
    uint64_t pending;      /* ranges queued or being loaded now */
    uint64_t budget;       /* cache_bytes */
    uint64_t file_bytes;   /* the file's size at open */
    uint32_t align;        /* O_DIRECT alignment used (0 when buffered) */
    int direct;            /* 1: reads use O_DIRECT; 0: buffered */
    int n_loaders;
} spx_tier_stats;

/* Opens `path` read-only and starts n_loader_threads loaders. mode: SKIP
 * or WAIT, optionally | SPX_TIER_BUFFERED. cache_bytes may be 0 (nothing
 * is ever cached: every request misses). SPX_ERR_IO naming the file if it
 * cannot be opened, SPX_ERR_ARG for bad arguments, SPX_ERR_NOMEM. */
spx_status spx_tier_open(const char *path, uint64_t cache_bytes, int mode, int n_loader_threads, spx_tier **out,
                         spx_err *e);
/* Stops the loaders (a queued range is abandoned; a read under way
 * finishes), joins them and frees everything. NULL is a no-op. */
void spx_tier_close(spx_tier *t);

/* One range: *out = its cached bytes or NULL (a miss; see the modes). */
spx_status spx_tier_get(spx_tier *t, uint64_t off, uint32_t len, const uint8_t **out, spx_err *e);
/* n ranges at once, out[i] for (off[i], len[i]); one lock for the batch,
 * the misses queued together. On an error every out[i] is NULL. */
spx_status spx_tier_get_many(spx_tier *t, size_t n, const uint64_t *off, const uint32_t *len,
                             const uint8_t **out, spx_err *e);
/* Ends the step: the pointers handed out since the last step_end become
 * invalid, the pinned entries are unpinned and the cache is trimmed to
 * its budget. Returns a latched loader error, if any. */
spx_status spx_tier_step_end(spx_tier *t, spx_err *e);
/* Blocks until no range is queued or being loaded (tests, benchmarks, a
 * prefetch barrier). Returns a latched loader error, if any. */
spx_status spx_tier_drain(spx_tier *t, spx_err *e);

/* Scratch tiers. spx_tier_create makes a tier on a new file of `size`
 * bytes in folder `dir` (reserved at once with posix_fallocate, so a full
 * disk fails here, naming the folder; removed from the folder at once, so
 * it lives exactly as long as the tier, also after a crash), opened and
 * read as by spx_tier_open. Its owner writes it:
 * - spx_tier_put writes [off, off + len) (pwrite through a second,
 *   buffered descriptor: O_DIRECT reads of the range see it, the kernel
 *   writes dirty pages back before a direct read) and caches the bytes as
 *   the entry (off, len), most recently used (not pinned): a new range
 *   enters the cache directly, as a prefill's oldest ranges leave it. An
 *   entry that exists takes the new bytes; one being loaded is waited
 *   for first, so the old bytes never land after the new ones. The owner
 *   must not put a range it got a pointer to in the current step.
 * - spx_tier_read_now copies a range's current bytes, from the cache or
 *   the file, whatever the miss policy (rare, synchronous reads).
 * A write error (ENOSPC, EIO) names the file, the offset and the length;
 * it is returned, not latched (the caller fails its step). */
spx_status spx_tier_create(const char *dir, uint64_t size, uint64_t cache_bytes, int mode, int n_loader_threads,
                           spx_tier **out, spx_err *e);
spx_status spx_tier_put(spx_tier *t, uint64_t off, uint32_t len, const uint8_t *data, spx_err *e);
spx_status spx_tier_read_now(spx_tier *t, uint64_t off, uint32_t len, uint8_t *dst, spx_err *e);

/* A snapshot of the counters (taken under the lock). The function is not
 * called spx_tier_stats because that is the struct's name. */
void spx_tier_stats_get(spx_tier *t, spx_tier_stats *s);
const char *spx_tier_path(const spx_tier *t);

#endif
