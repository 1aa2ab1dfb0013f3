/* pool.c: persistent pthread pool.
 *
 * Decoding runs a few hundred short parallel sections per token, so the
 * hand-off must cost microseconds: workers spin on a generation counter
 * for a short while before sleeping on a
 * condition variable, and the caller spins on the pending count the same
 * way (SPIN_ITERS). Sleeping paths take the mutex, so no wake-up is lost. */
#define _POSIX_C_SOURCE 200809L
#include "core/pool.h"
#include "core/util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* ~10-30 us of pausing: long enough to cover the gap between two
 * parallel sections of a decode step, short enough not to steal a core
 * for long when the machine is oversubscribed. */
#define SPIN_ITERS 4000

struct spx_pool {
    int n;                       /* threads including the caller */
    pthread_t *threads;          /* n - 1 workers */
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    _Atomic uint64_t generation; /* bumped per run */
    _Atomic int pending;         /* workers still running the current job */
    _Atomic int quit;
    spx_pool_fn fn;              /* written before generation is bumped */
    void *ctx;
};

typedef struct { spx_pool *p; int tid; } worker_arg;

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    spx_pool *p = wa.p;
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&p->generation, memory_order_acquire) == seen &&
               !atomic_load_explicit(&p->quit, memory_order_relaxed) && spins < SPIN_ITERS) {
            CPU_RELAX();
            spins++;
        }
        if (atomic_load_explicit(&p->generation, memory_order_acquire) == seen) {
            pthread_mutex_lock(&p->mu);
            while (!atomic_load(&p->quit) && atomic_load(&p->generation) == seen)
                pthread_cond_wait(&p->start_cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        p->fn(p->ctx, wa.tid, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

spx_status spx_pool_new(int n_threads, spx_pool **out, spx_err *e) {
    *out = NULL;
    if (n_threads <= 0) n_threads = spx_num_cpus();
    if (n_threads > 1024) return spx_fail(e, SPX_ERR_ARG, "--threads %d: at most 1024", n_threads);
    spx_pool *p = calloc(1, sizeof *p);
    if (!p) return spx_fail(e, SPX_ERR_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->quit, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            free(p);
            return spx_fail(e, SPX_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->p = p; /* filled before the thread can read it */
            wa->tid = i;
        }
        if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n = i; /* shut down the ones we made */
            spx_pool_free(p);
            return spx_fail(e, SPX_ERR_NOMEM, "thread pool: cannot start thread %d", i);
        }
    }
    *out = p;
    return SPX_OK;
}

void spx_pool_free(spx_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    free(p);
}

int spx_pool_size(const spx_pool *p) { return p ? p->n : 1; }

void spx_pool_run(spx_pool *p, spx_pool_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu); /* sleepers re-check under the lock */
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0 && spins < SPIN_ITERS) {
        CPU_RELAX();
        spins++;
    }
    if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
