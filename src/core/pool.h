/* pool.h: a persistent thread pool.
 *
 * Threads are created once; spx_pool_run() hands every worker (and the
 * calling thread, as worker 0) the same function with its index and waits
 * for all to finish. Work is split by the callee (spx_pool_range) so every
 * thread gets a contiguous share of rows. No allocation per call. */
#ifndef SPX_POOL_H
#define SPX_POOL_H

#include "core/err.h"
#include <stdint.h>

typedef struct spx_pool spx_pool;
typedef void (*spx_pool_fn)(void *ctx, int tid, int nthreads);

/* n_threads <= 0: all online CPUs. */
spx_status spx_pool_new(int n_threads, spx_pool **out, spx_err *e);
void spx_pool_free(spx_pool *p);
int spx_pool_size(const spx_pool *p);
/* Runs fn(ctx, tid, n) on n threads (tid 0 is the caller). Not reentrant. */
void spx_pool_run(spx_pool *p, spx_pool_fn fn, void *ctx);

/* The [begin, end) share of `total` items for thread tid of n, in chunks
 * aligned to `align` items (except the last). */
static inline void spx_pool_range(int64_t total, int tid, int n, int64_t align,
                                  int64_t *begin, int64_t *end) {
    if (align < 1) align = 1;
    int64_t blocks = (total + align - 1) / align;
    int64_t b0 = blocks * tid / n, b1 = blocks * (tid + 1) / n;
    int64_t s = b0 * align, t = b1 * align;
    *begin = s < total ? s : total;
    *end = t < total ? t : total;
}

#endif
