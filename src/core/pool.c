/* pool.c: pthread pool with a generation counter barrier. */
#define _POSIX_C_SOURCE 200809L
#include "core/pool.h"
#include "core/util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct spx_pool {
    int n;                 /* threads including the caller */
    pthread_t *threads;    /* n - 1 workers */
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    uint64_t generation;   /* bumped per run */
    int pending;           /* workers still running the current job */
    int quit;
    spx_pool_fn fn;
    void *ctx;
};

typedef struct { spx_pool *p; int tid; } worker_arg;

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    spx_pool *p = wa.p;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->start_cv, &p->mu);
        if (p->quit) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        spx_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, wa.tid, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
        pthread_mutex_unlock(&p->mu);
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
    p->quit = 1;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
