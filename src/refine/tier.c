/* tier.c: the disk backing tier of weight refinement (see tier.h for the
 * contract: requests, pinning, budget, miss policies, errors).
 *
 * State, all guarded by t->mu:
 * - ents[]: the entry pool, addressed by int32 index (never by pointer
 *   across an unlock, so the pool may be reallocated). A free entry is on
 *   the free list (linked through .next). A live entry is in the hash
 *   table and in one state:
 *     QUEUED   on the loader FIFO (linked through .qnext), no data;
 *     LOADING  taken by a loader, no data;
 *     READY    data holds its len bytes (malloc'd, owned).
 *   and on at most one list (.list, linked through .prev/.next):
 *     L_PIN    used in the current step (READY, or QUEUED/LOADING for a
 *              WAIT caller); never evicted;
 *     L_LRU    READY and not pinned: head = most recently used, eviction
 *              takes the tail;
 *     L_NONE   QUEUED/LOADING and not pinned.
 *   So eviction is O(1) (the LRU list holds only evictable entries) and
 *   step_end walks the pin list once, pushing its READY entries onto the
 *   LRU head from its tail, which keeps their order of last use.
 * - table[]: open addressing, linear probing, int32 entry indices (-1
 *   empty), keyed by hash(off, len); capacity a power of two kept at
 *   least twice the live entries; deletion by backward shift (no
 *   tombstones).
 * - counters: cur_bytes = sum of READY entries' len; q_bytes = sum of
 *   QUEUED entries' len (the SKIP queue limit); pending = QUEUED +
 *   LOADING entries.
 * - fail / ferr: the first loader error, latched (sticky).
 *
 * Condition variables: cv_work (loaders wait for the queue), cv_done
 * (broadcast when a load completes: WAIT callers and drain wait on it). */
#include "refine/tier.h"

#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BOUNCE_BYTES (256u * 1024u) /* a loader's aligned read buffer */
#define ALIGN_MAX (1u << 20)        /* larger dio alignments: use buffered reads */

enum { ENT_FREE, ENT_QUEUED, ENT_LOADING, ENT_READY };
enum { L_NONE, L_LRU, L_PIN };

typedef struct tier_ent {
    uint64_t off;
    uint32_t len;
    uint8_t state, list;
    int32_t prev, next; /* list links; .next is the free-list link when free */
    int32_t qnext;      /* loader FIFO link */
    uint8_t *data;      /* READY: len bytes */
} tier_ent;

typedef struct tier_list {
    int32_t head, tail;
} tier_list;

typedef struct tier_loader {
    struct spx_tier *t;
    pthread_t th;
    uint8_t *bounce; /* BOUNCE_BYTES, aligned to t->align (direct reads only) */
} tier_loader;

struct spx_tier {
    char *path;
    int fd;
    int wfd; /* a scratch tier's read-write descriptor (buffered); -1 otherwise */
    int direct;
    uint32_t align; /* 0 when buffered */
    int wait_mode;
    uint64_t size, budget;

    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    int stop;

    tier_ent *ents;
    int32_t ents_cap, ents_hi; /* ents[0, ents_hi) have been handed out once */
    int32_t free_head, n_free;
    int32_t *table;
    uint32_t tcap, tcount; /* tcap a power of two, tcount <= tcap / 2 */

    tier_list lru, pin;
    int32_t q_head, q_tail;
    uint64_t q_bytes, pending;

    spx_status fail;
    spx_err ferr;

    int n_loaders, n_started;
    tier_loader *loaders;
    spx_tier_stats st; /* counters only; the gauges are filled by stats_get */
};

/* ======================================================================
 * Hash table */

static uint32_t tier_hash(uint64_t off, uint32_t len) {
    uint64_t x = off * 0x9E3779B97F4A7C15ULL ^ ((uint64_t)len << 40 | len);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 29;
    return (uint32_t)x;
}

static int32_t table_find(const spx_tier *t, uint64_t off, uint32_t len) {
    uint32_t mask = t->tcap - 1;
    for (uint32_t s = tier_hash(off, len) & mask;; s = (s + 1) & mask) {
        int32_t i = t->table[s];
        if (i < 0) return -1;
        if (t->ents[i].off == off && t->ents[i].len == len) return i;
    }
}

static void table_put(spx_tier *t, int32_t idx) {
    uint32_t mask = t->tcap - 1;
    uint32_t s = tier_hash(t->ents[idx].off, t->ents[idx].len) & mask;
    while (t->table[s] >= 0) s = (s + 1) & mask;
    t->table[s] = idx;
    t->tcount++;
}

static void table_del(spx_tier *t, int32_t idx) {
    uint32_t mask = t->tcap - 1;
    uint32_t i = tier_hash(t->ents[idx].off, t->ents[idx].len) & mask;
    while (t->table[i] != idx) i = (i + 1) & mask; /* present by invariant */
    /* Backward shift: move later members of the probe run into the hole
     * unless their home slot lies cyclically in (hole, slot]. */
    for (uint32_t j = i;;) {
        j = (j + 1) & mask;
        int32_t m = t->table[j];
        if (m < 0) break;
        uint32_t k = tier_hash(t->ents[m].off, t->ents[m].len) & mask;
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        t->table[i] = m;
        i = j;
    }
    t->table[i] = -1;
    t->tcount--;
}

static int table_grow(spx_tier *t, uint32_t need) {
    uint32_t cap = t->tcap;
    while ((uint64_t)need * 2 > cap) {
        if (cap >= (1u << 30)) return -1;
        cap *= 2;
    }
    if (cap == t->tcap) return 0;
    int32_t *nt = malloc((size_t)cap * sizeof *nt);
    if (!nt) return -1;
    for (uint32_t s = 0; s < cap; s++) nt[s] = -1;
    int32_t *old = t->table;
    uint32_t oldcap = t->tcap;
    t->table = nt;
    t->tcap = cap;
    t->tcount = 0;
    for (uint32_t s = 0; s < oldcap; s++)
        if (old[s] >= 0) table_put(t, old[s]);
    free(old);
    return 0;
}

/* ======================================================================
 * Entry pool and lists */

/* Makes room for n more live entries (pool and table); -1 on OOM. */
static int tier_reserve(spx_tier *t, size_t n) {
    if (n > (size_t)INT32_MAX / 2) return -1;
    int64_t avail = (int64_t)t->ents_cap - t->ents_hi + t->n_free;
    if (avail < (int64_t)n) {
        int64_t cap = (int64_t)t->ents_cap * 2;
        if (cap < (int64_t)t->ents_hi + (int64_t)n + 64) cap = (int64_t)t->ents_hi + (int64_t)n + 64;
        if (cap > INT32_MAX / 2) return -1;
        tier_ent *ne = realloc(t->ents, (size_t)cap * sizeof *ne);
        if (!ne) return -1;
        t->ents = ne;
        t->ents_cap = (int32_t)cap;
    }
    uint64_t need = (uint64_t)t->tcount + n;
    if (need > UINT32_MAX / 4) return -1;
    return table_grow(t, (uint32_t)need);
}

static int32_t ent_new(spx_tier *t, uint64_t off, uint32_t len) {
    int32_t i;
    if (t->free_head >= 0) {
        i = t->free_head;
        t->free_head = t->ents[i].next;
        t->n_free--;
    } else {
        i = t->ents_hi++; /* room guaranteed by tier_reserve */
    }
    tier_ent *x = &t->ents[i];
    memset(x, 0, sizeof *x);
    x->off = off;
    x->len = len;
    x->prev = x->next = x->qnext = -1;
    x->list = L_NONE;
    table_put(t, i);
    return i;
}

static void ent_free(spx_tier *t, int32_t i) {
    table_del(t, i);
    tier_ent *x = &t->ents[i];
    free(x->data);
    x->data = NULL;
    x->state = ENT_FREE;
    x->next = t->free_head;
    t->free_head = i;
    t->n_free++;
}

static tier_list *list_of(spx_tier *t, int which) { return which == L_PIN ? &t->pin : &t->lru; }

static void list_unlink(spx_tier *t, int32_t i) {
    tier_ent *x = &t->ents[i];
    if (x->list == L_NONE) return;
    tier_list *l = list_of(t, x->list);
    if (x->prev >= 0) t->ents[x->prev].next = x->next;
    else l->head = x->next;
    if (x->next >= 0) t->ents[x->next].prev = x->prev;
    else l->tail = x->prev;
    x->prev = x->next = -1;
    x->list = L_NONE;
}

static void list_push_head(spx_tier *t, int which, int32_t i) {
    tier_list *l = list_of(t, which);
    tier_ent *x = &t->ents[i];
    x->list = (uint8_t)which;
    x->prev = -1;
    x->next = l->head;
    if (l->head >= 0) t->ents[l->head].prev = i;
    else l->tail = i;
    l->head = i;
}

/* Pins entry i for this step (moves it to the pin list's head). */
static void ent_pin(spx_tier *t, int32_t i) {
    list_unlink(t, i);
    list_push_head(t, L_PIN, i);
}

/* Evicts least recently used unpinned entries while over budget. */
static void tier_trim(spx_tier *t) {
    while (t->st.cur_bytes > t->budget && t->lru.tail >= 0) {
        int32_t i = t->lru.tail;
        list_unlink(t, i);
        t->st.cur_bytes -= t->ents[i].len;
        t->st.entries--;
        t->st.evictions++;
        ent_free(t, i);
    }
}

static void queue_push(spx_tier *t, int32_t i) {
    tier_ent *x = &t->ents[i];
    x->state = ENT_QUEUED;
    x->qnext = -1;
    if (t->q_tail >= 0) t->ents[t->q_tail].qnext = i;
    else t->q_head = i;
    t->q_tail = i;
    t->q_bytes += x->len;
    t->pending++;
    t->st.queued++;
}

static int32_t queue_pop(spx_tier *t) {
    int32_t i = t->q_head;
    if (i < 0) return -1;
    t->q_head = t->ents[i].qnext;
    if (t->q_head < 0) t->q_tail = -1;
    t->ents[i].qnext = -1;
    t->ents[i].state = ENT_LOADING;
    t->q_bytes -= t->ents[i].len;
    return i;
}

/* ======================================================================
 * Reading */

static const char *err_text(int err, char *buf, size_t n) {
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
    return strerror_r(err, buf, n); /* GNU variant: returns the text */
#else
    if (strerror_r(err, buf, n) != 0) snprintf(buf, n, "errno %d", err);
    return buf;
#endif
}

typedef struct read_count {
    uint64_t bytes, preads;
} read_count;

/* Reads [off, off + len) of the file into dst. Buffered: straight into
 * dst. Direct: the covering aligned span, through `bounce`, in pieces of
 * at most BOUNCE_BYTES; a short read is fine only where the file ends
 * past the wanted bytes (the last, partial block). */
static spx_status tier_read(spx_tier *t, uint8_t *bounce, uint64_t off, uint32_t len, uint8_t *dst, read_count *rc,
                            spx_err *e) {
    char eb[128];
    uint64_t end = off + len;
    if (!t->direct) {
        uint64_t done = 0;
        while (done < len) {
            ssize_t r = pread(t->fd, dst + done, len - done, (off_t)(off + done));
            rc->preads++;
            if (r < 0 && errno == EINTR) continue;
            if (r < 0)
                return spx_fail(e, SPX_ERR_IO, "%s: read of %u bytes at offset %llu failed: %s", t->path, len,
                                (unsigned long long)off, err_text(errno, eb, sizeof eb));
            if (r == 0)
                return spx_fail(e, SPX_ERR_IO,
                                "%s: short read of %u bytes at offset %llu: the file ends at %llu "
                                "(it was %llu bytes at open; was it truncated?)",
                                t->path, len, (unsigned long long)off, (unsigned long long)(off + done),
                                (unsigned long long)t->size);
            rc->bytes += (uint64_t)r;
            done += (uint64_t)r;
        }
        return SPX_OK;
    }
    uint64_t A = t->align;
    uint64_t pos = off & ~(A - 1), a1 = (end + A - 1) & ~(A - 1);
    while (pos < end) {
        size_t want = (size_t)(a1 - pos < BOUNCE_BYTES ? a1 - pos : BOUNCE_BYTES);
        ssize_t r = pread(t->fd, bounce, want, (off_t)pos);
        rc->preads++;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return spx_fail(e, SPX_ERR_IO, "%s: direct read of %zu bytes at offset %llu (for %u bytes at %llu) failed: %s",
                            t->path, want, (unsigned long long)pos, len, (unsigned long long)off,
                            err_text(errno, eb, sizeof eb));
        rc->bytes += (uint64_t)r;
        uint64_t got_end = pos + (uint64_t)r;
        uint64_t lo = pos > off ? pos : off, hi = got_end < end ? got_end : end;
        if (hi > lo) memcpy(dst + (lo - off), bounce + (lo - pos), (size_t)(hi - lo));
        if (got_end >= end) break;
        if (r == 0 || (uint64_t)r % A != 0)
            return spx_fail(e, SPX_ERR_IO,
                            "%s: short read of %u bytes at offset %llu: the file ends at %llu "
                            "(it was %llu bytes at open; was it truncated?)",
                            t->path, len, (unsigned long long)off, (unsigned long long)got_end,
                            (unsigned long long)t->size);
        pos = got_end;
    }
    return SPX_OK;
}

/* Publishes a finished load of entry i (data, or st != OK with its error). */
static void tier_complete(spx_tier *t, int32_t i, uint8_t *data, spx_status st, const spx_err *le,
                          const read_count *rc) {
    tier_ent *x = &t->ents[i];
    t->pending--;
    t->st.bytes_read += rc->bytes;
    t->st.preads += rc->preads;
    if (st != SPX_OK) {
        if (t->fail == SPX_OK) {
            t->fail = st;
            t->ferr = *le;
        }
        free(data);
        list_unlink(t, i);
        ent_free(t, i);
    } else {
        x->data = data;
        x->state = ENT_READY;
        t->st.cur_bytes += x->len;
        t->st.entries++;
        t->st.loads++;
        t->st.bytes_loaded += x->len;
        if (x->list == L_NONE) list_push_head(t, L_LRU, i);
        tier_trim(t);
        if (t->st.cur_bytes > t->st.peak_bytes) t->st.peak_bytes = t->st.cur_bytes;
    }
    pthread_cond_broadcast(&t->cv_done);
}

static void *tier_loader_main(void *arg) {
    tier_loader *L = arg;
    spx_tier *t = L->t;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->stop && t->q_head < 0) pthread_cond_wait(&t->cv_work, &t->mu);
        if (t->stop) break;
        int32_t i = queue_pop(t);
        uint64_t off = t->ents[i].off;
        uint32_t len = t->ents[i].len;
        pthread_mutex_unlock(&t->mu);

        spx_err le;
        spx_err_clear(&le);
        read_count rc = {0, 0};
        spx_status st;
        uint8_t *data = malloc(len);
        if (!data)
            st = spx_fail(&le, SPX_ERR_NOMEM, "%s: no memory for %u bytes at offset %llu", t->path, len,
                          (unsigned long long)off);
        else
            st = tier_read(t, L->bounce, off, len, data, &rc, &le);

        pthread_mutex_lock(&t->mu);
        tier_complete(t, i, st == SPX_OK ? data : NULL, st, &le, &rc);
        if (st != SPX_OK) free(data);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* ======================================================================
 * Open and close */

/* O_DIRECT alignment of fd: max(SPX_TIER_ALIGN, the file system's dio
 * offset and memory alignment where statx reports them); 0 if the file
 * system says it has no direct I/O for this file. */
static uint32_t tier_dio_align(int fd) {
    uint32_t a = SPX_TIER_ALIGN;
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        if (sx.stx_dio_offset_align == 0) return 0;
        if (sx.stx_dio_offset_align > a) a = sx.stx_dio_offset_align;
        if (sx.stx_dio_mem_align > a) a = sx.stx_dio_mem_align;
        if ((a & (a - 1)) != 0 || a > ALIGN_MAX) return 0;
    }
#else
    (void)fd;
#endif
    return a;
}

spx_status spx_tier_open(const char *path, uint64_t cache_bytes, int mode, int n_loader_threads, spx_tier **out,
                         spx_err *e) {
    char eb[128];
    if (!out) return spx_fail(e, SPX_ERR_ARG, "spx_tier_open: out is NULL");
    *out = NULL;
    if (!path) return spx_fail(e, SPX_ERR_ARG, "spx_tier_open: path is NULL");
    if (mode & ~(SPX_TIER_WAIT | SPX_TIER_BUFFERED))
        return spx_fail(e, SPX_ERR_ARG, "%s: tier mode %d has unknown bits (expected SKIP or WAIT, | BUFFERED)", path,
                        mode);
    if (n_loader_threads < 1 || n_loader_threads > SPX_TIER_MAX_LOADERS)
        return spx_fail(e, SPX_ERR_ARG, "%s: %d loader threads (expected 1 to %d)", path, n_loader_threads,
                        SPX_TIER_MAX_LOADERS);

    spx_tier *t = calloc(1, sizeof *t);
    if (!t) return spx_fail(e, SPX_ERR_NOMEM, "%s: no memory for the tier", path);
    t->fd = t->wfd = -1;
    t->n_started = -1; /* no mutex or threads yet: close must not touch them */
    t->path = spx_strdup(path);
    t->wait_mode = (mode & SPX_TIER_WAIT) != 0;
    t->budget = cache_bytes;
    t->free_head = -1;
    t->lru.head = t->lru.tail = t->pin.head = t->pin.tail = -1;
    t->q_head = t->q_tail = -1;
    t->n_loaders = n_loader_threads;
    t->tcap = 64;
    t->table = malloc(t->tcap * sizeof *t->table);
    t->loaders = calloc((size_t)n_loader_threads, sizeof *t->loaders);
    if (!t->path || !t->table || !t->loaders) {
        spx_tier_close(t);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: no memory for the tier", path);
    }
    for (uint32_t s = 0; s < t->tcap; s++) t->table[s] = -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv_work, NULL);
    pthread_cond_init(&t->cv_done, NULL);
    t->n_started = 0; /* the mutex exists; no threads yet */

    /* O_DIRECT first (unless asked not to); EINVAL at open, no dio
     * alignment from statx, or EINVAL on a probe read of the first block
     * mean the file system refuses it: reopen buffered. */
    if (!(mode & SPX_TIER_BUFFERED)) {
        int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (fd < 0 && errno != EINVAL) {
            spx_fail(e, SPX_ERR_IO, "%s: cannot open the refinement tier: %s", path, err_text(errno, eb, sizeof eb));
            spx_tier_close(t);
            return SPX_ERR_IO;
        }
        if (fd >= 0) {
            uint32_t a = tier_dio_align(fd);
            void *probe = NULL;
            int ok = a != 0 && posix_memalign(&probe, a, a) == 0;
            if (ok) {
                ssize_t r;
                do r = pread(fd, probe, a, 0);
                while (r < 0 && errno == EINTR);
                if (r < 0) ok = 0; /* EINVAL (refused) or another error: the buffered open decides */
            }
            free(probe);
            if (ok) {
                t->fd = fd;
                t->direct = 1;
                t->align = a;
            } else {
                close(fd);
            }
        }
    }
    if (t->fd < 0) {
        t->fd = open(path, O_RDONLY | O_CLOEXEC);
        if (t->fd < 0) {
            spx_fail(e, SPX_ERR_IO, "%s: cannot open the refinement tier: %s", path, err_text(errno, eb, sizeof eb));
            spx_tier_close(t);
            return SPX_ERR_IO;
        }
    }
    struct stat sb;
    if (fstat(t->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        spx_fail(e, SPX_ERR_IO, "%s: the refinement tier is not a regular file", path);
        spx_tier_close(t);
        return SPX_ERR_IO;
    }
    t->size = (uint64_t)sb.st_size;

    for (int k = 0; k < n_loader_threads; k++) {
        t->loaders[k].t = t;
        if (t->direct) {
            void *b = NULL;
            if (posix_memalign(&b, t->align, BOUNCE_BYTES) != 0) {
                spx_tier_close(t);
                return spx_fail(e, SPX_ERR_NOMEM, "%s: no memory for the loaders' read buffers", path);
            }
            t->loaders[k].bounce = b;
        }
    }
    for (int k = 0; k < n_loader_threads; k++) {
        int rc = pthread_create(&t->loaders[k].th, NULL, tier_loader_main, &t->loaders[k]);
        if (rc != 0) {
            spx_fail(e, SPX_ERR_NOMEM, "%s: cannot start loader thread %d of %d: %s", path, k + 1, n_loader_threads,
                     err_text(rc, eb, sizeof eb));
            spx_tier_close(t);
            return SPX_ERR_NOMEM;
        }
        t->n_started++;
    }
    *out = t;
    return SPX_OK;
}

void spx_tier_close(spx_tier *t) {
    if (!t) return;
    if (t->n_started >= 0) {
        pthread_mutex_lock(&t->mu);
        t->stop = 1;
        pthread_cond_broadcast(&t->cv_work);
        pthread_mutex_unlock(&t->mu);
        for (int k = 0; k < t->n_started; k++) pthread_join(t->loaders[k].th, NULL);
        pthread_cond_destroy(&t->cv_work);
        pthread_cond_destroy(&t->cv_done);
        pthread_mutex_destroy(&t->mu);
    }
    for (int32_t i = 0; i < t->ents_hi; i++)
        if (t->ents[i].state != ENT_FREE) free(t->ents[i].data);
    if (t->loaders)
        for (int k = 0; k < t->n_loaders; k++) free(t->loaders[k].bounce);
    if (t->fd >= 0) close(t->fd);
    if (t->wfd >= 0) close(t->wfd);
    free(t->loaders);
    free(t->ents);
    free(t->table);
    free(t->path);
    free(t);
}

/* ======================================================================
 * Lookups */

static spx_status tier_latched(const spx_tier *t, spx_err *e) {
    if (t->fail == SPX_OK) return SPX_OK;
    return spx_fail(e, t->fail, "%s", t->ferr.msg);
}

spx_status spx_tier_get_many(spx_tier *t, size_t n, const uint64_t *off, const uint32_t *len,
                             const uint8_t **out, spx_err *e) {
    if (n == 0) return SPX_OK;
    if (!t || !off || !len || !out) return spx_fail(e, SPX_ERR_ARG, "spx_tier_get_many: NULL argument");
    for (size_t i = 0; i < n; i++) out[i] = NULL;
    /* Validate the whole batch first, so a bad request leaves nothing
     * pinned or queued. */
    for (size_t i = 0; i < n; i++) {
        if (len[i] == 0)
            return spx_fail(e, SPX_ERR_ARG, "%s: request %zu at offset %llu has length 0", t->path, i,
                            (unsigned long long)off[i]);
        if (off[i] > t->size || len[i] > t->size - off[i])
            return spx_fail(e, SPX_ERR_RANGE,
                            "%s: request %zu: %u bytes at offset %llu end past the file's %llu bytes", t->path, i,
                            len[i], (unsigned long long)off[i], (unsigned long long)t->size);
    }

    pthread_mutex_lock(&t->mu);
    spx_status st = tier_latched(t, e);
    if (st == SPX_OK && tier_reserve(t, n) != 0)
        st = spx_fail(e, SPX_ERR_NOMEM, "%s: no memory for %zu more cache entries", t->path, n);
    if (st != SPX_OK) {
        pthread_mutex_unlock(&t->mu);
        return st;
    }
    t->st.requests += n;
    int queued = 0, any_wait = 0;
    for (size_t k = 0; k < n; k++) {
        if (len[k] > t->budget) {
            t->st.oversize++;
            t->st.misses++;
            continue;
        }
        int32_t i = table_find(t, off[k], len[k]);
        if (i >= 0 && t->ents[i].state == ENT_READY) {
            t->st.hits++;
            ent_pin(t, i);
            out[k] = t->ents[i].data;
            continue;
        }
        t->st.misses++;
        if (i < 0) {
            if (!t->wait_mode && t->q_bytes + len[k] > t->budget) {
                t->st.dropped++;
                continue;
            }
            i = ent_new(t, off[k], len[k]);
            queue_push(t, i);
            queued = 1;
        }
        if (t->wait_mode) {
            if (t->ents[i].list != L_PIN) ent_pin(t, i);
            any_wait = 1;
        }
    }
    if (queued) pthread_cond_broadcast(&t->cv_work);

    if (any_wait) {
        /* Every miss of this batch is pinned and queued or loading; take
         * them in order, sleeping while the current one is not ready. An
         * entry that vanished was removed by a failed load (latched). */
        double t0 = 0;
        int stalled = 0;
        for (size_t k = 0; k < n && t->fail == SPX_OK; k++) {
            if (out[k] || len[k] > t->budget) continue;
            for (;;) {
                int32_t i = table_find(t, off[k], len[k]);
                if (i < 0 || t->fail != SPX_OK) break;
                if (t->ents[i].state == ENT_READY) {
                    if (t->ents[i].list != L_PIN) ent_pin(t, i);
                    out[k] = t->ents[i].data;
                    break;
                }
                if (!stalled) {
                    stalled = 1;
                    t0 = spx_now();
                }
                pthread_cond_wait(&t->cv_done, &t->mu);
            }
        }
        if (stalled) {
            t->st.waits++;
            t->st.wait_s += spx_now() - t0;
        }
        st = tier_latched(t, e);
        if (st != SPX_OK)
            for (size_t k = 0; k < n; k++) out[k] = NULL;
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

spx_status spx_tier_get(spx_tier *t, uint64_t off, uint32_t len, const uint8_t **out, spx_err *e) {
    if (!out) return spx_fail(e, SPX_ERR_ARG, "spx_tier_get: out is NULL");
    return spx_tier_get_many(t, 1, &off, &len, out, e);
}

spx_status spx_tier_step_end(spx_tier *t, spx_err *e) {
    if (!t) return spx_fail(e, SPX_ERR_ARG, "spx_tier_step_end: tier is NULL");
    pthread_mutex_lock(&t->mu);
    /* From the pin list's tail (least recent use) to its head, so the LRU
     * head ends up being the step's most recently used entry. */
    for (int32_t i = t->pin.tail; i >= 0;) {
        int32_t prev = t->ents[i].prev;
        list_unlink(t, i);
        if (t->ents[i].state == ENT_READY) list_push_head(t, L_LRU, i);
        i = prev;
    }
    tier_trim(t);
    spx_status st = tier_latched(t, e);
    pthread_mutex_unlock(&t->mu);
    return st;
}

spx_status spx_tier_drain(spx_tier *t, spx_err *e) {
    if (!t) return spx_fail(e, SPX_ERR_ARG, "spx_tier_drain: tier is NULL");
    pthread_mutex_lock(&t->mu);
    while (t->pending > 0) pthread_cond_wait(&t->cv_done, &t->mu);
    spx_status st = tier_latched(t, e);
    pthread_mutex_unlock(&t->mu);
    return st;
}

void spx_tier_stats_get(spx_tier *t, spx_tier_stats *s) {
    pthread_mutex_lock(&t->mu);
    *s = t->st;
    s->pending = t->pending;
    s->budget = t->budget;
    s->file_bytes = t->size;
    s->align = t->direct ? t->align : 0;
    s->direct = t->direct;
    s->n_loaders = t->n_loaders;
    pthread_mutex_unlock(&t->mu);
}

const char *spx_tier_path(const spx_tier *t) { return t->path; }

/* ======================================================================
 * Scratch tiers: written by their owner, read like any other */

spx_status spx_tier_create(const char *dir, uint64_t size, uint64_t cache_bytes, int mode, int n_loader_threads,
                           spx_tier **out, spx_err *e) {
    char eb[128];
    if (!out) return spx_fail(e, SPX_ERR_ARG, "spx_tier_create: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return spx_fail(e, SPX_ERR_ARG, "spx_tier_create: no folder given");
    if (size == 0 || size > (uint64_t)INT64_MAX)
        return spx_fail(e, SPX_ERR_ARG, "%s: a scratch tier of %llu bytes", dir, (unsigned long long)size);
    size_t n = strlen(dir) + 24;
    char *path = malloc(n);
    if (!path) return spx_fail(e, SPX_ERR_NOMEM, "%s: no memory for the tier's name", dir);
    snprintf(path, n, "%s/spectra-tier-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) {
        spx_fail(e, SPX_ERR_IO, "%s: cannot create a tier file in this folder: %s", dir, err_text(errno, eb, sizeof eb));
        free(path);
        return SPX_ERR_IO;
    }
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    /* the whole size reserved now, so a full disk is one message here and
     * not a failed write in the middle of a generation */
    int rc = posix_fallocate(fd, 0, (off_t)size);
    if (rc == EOPNOTSUPP || rc == EINVAL) rc = ftruncate(fd, (off_t)size) != 0 ? errno : 0;
    spx_status st = SPX_OK;
    if (rc != 0)
        st = spx_fail(e, SPX_ERR_IO, "%s: no room for a %.1f MiB tier file: %s", dir, (double)size / (1 << 20),
                      err_text(rc, eb, sizeof eb));
    else
        st = spx_tier_open(path, cache_bytes, mode, n_loader_threads, out, e);
    unlink(path); /* the file lives while its descriptors are open, and is gone after a crash */
    free(path);
    if (st != SPX_OK) {
        close(fd);
        return st;
    }
    (*out)->wfd = fd;
    return SPX_OK;
}

static spx_status scratch_check(const spx_tier *t, uint64_t off, uint32_t len, const void *buf, const char *what,
                                spx_err *e) {
    if (!t || !buf) return spx_fail(e, SPX_ERR_ARG, "spx_tier_%s: NULL argument", what);
    if (t->wfd < 0) return spx_fail(e, SPX_ERR_ARG, "%s: spx_tier_%s on a read-only tier", t->path, what);
    if (len == 0 || off > t->size || len > t->size - off)
        return spx_fail(e, SPX_ERR_RANGE, "%s: %s of %u bytes at offset %llu: outside the tier's %llu bytes", t->path,
                        what, len, (unsigned long long)off, (unsigned long long)t->size);
    return SPX_OK;
}

/* pwrite (write != 0) or pread of the whole range through the read-write
 * descriptor (buffered: no alignment to keep) */
static spx_status scratch_io(spx_tier *t, int write, uint64_t off, uint32_t len, uint8_t *buf, spx_err *e) {
    char eb[128];
    for (uint64_t done = 0; done < len;) {
        ssize_t r = write ? pwrite(t->wfd, buf + done, len - done, (off_t)(off + done))
                          : pread(t->wfd, buf + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return spx_fail(e, SPX_ERR_IO, "%s: %s of %u bytes at offset %llu failed: %s", t->path,
                            write ? "write" : "read", len, (unsigned long long)off,
                            r < 0 ? err_text(errno, eb, sizeof eb) : write ? "nothing written" : "end of file");
        done += (uint64_t)r;
    }
    return SPX_OK;
}

spx_status spx_tier_put(spx_tier *t, uint64_t off, uint32_t len, const uint8_t *data, spx_err *e) {
    SPX_TRY(scratch_check(t, off, len, data, "put", e));
    SPX_TRY(scratch_io(t, 1, off, len, (uint8_t *)data, e));
    pthread_mutex_lock(&t->mu);
    t->st.writes++;
    t->st.bytes_written += len;
    spx_status st = tier_latched(t, e);
    int32_t i = -1;
    /* a queued or running load of the range's old bytes finishes first,
     * so it cannot land after (and over) the new ones */
    while (st == SPX_OK && (i = table_find(t, off, len)) >= 0 && t->ents[i].state != ENT_READY) {
        pthread_cond_wait(&t->cv_done, &t->mu);
        st = tier_latched(t, e);
    }
    if (st == SPX_OK && i >= 0) {
        memcpy(t->ents[i].data, data, len); /* same (off, len): same size */
        if (t->ents[i].list == L_LRU) {
            list_unlink(t, i);
            list_push_head(t, L_LRU, i);
        }
    } else if (st == SPX_OK && len <= t->budget && tier_reserve(t, 1) == 0) {
        uint8_t *copy = malloc(len); /* no memory: the bytes are on disk, only not cached */
        if (copy) {
            memcpy(copy, data, len);
            i = ent_new(t, off, len);
            t->ents[i].data = copy;
            t->ents[i].state = ENT_READY;
            t->st.cur_bytes += len;
            t->st.entries++;
            list_push_head(t, L_LRU, i);
            tier_trim(t);
            if (t->st.cur_bytes > t->st.peak_bytes) t->st.peak_bytes = t->st.cur_bytes;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

spx_status spx_tier_read_now(spx_tier *t, uint64_t off, uint32_t len, uint8_t *dst, spx_err *e) {
    SPX_TRY(scratch_check(t, off, len, dst, "read_now", e));
    pthread_mutex_lock(&t->mu);
    int32_t i = table_find(t, off, len);
    int hit = i >= 0 && t->ents[i].state == ENT_READY;
    if (hit) memcpy(dst, t->ents[i].data, len);
    spx_status st = tier_latched(t, e);
    pthread_mutex_unlock(&t->mu);
    if (hit || st != SPX_OK) return st;
    return scratch_io(t, 0, off, len, dst, e);
}
