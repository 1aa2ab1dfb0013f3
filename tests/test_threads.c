/* test_threads.c: one model shared by sessions on several threads
 * (spectra.h's "Threads" contract). Each thread opens its own session,
 * tokenizes its own prompt, feeds it and decodes greedily (half of the
 * threads through spx_batch_step of two sessions, one through spx_spec_step)
 * while the others do the same; every thread's tokens and last logits must
 * equal those of the same work done alone beforehand, bit for bit (the CPU
 * backend's passes do not depend on what ran before). Also run under
 * ASan/UBSan in CI (on stories260K there). */
#include "spectra.h"
#include "testlib.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_THREADS 6
#define N_GEN 24

typedef struct job {
    spx_model *m;
    int kind; /* 0: step_greedy, 1: a batch of two sessions, 2: speculation */
    char prompt[128];
    int32_t out[2][N_GEN];
    float *last; /* logits after the last step of session 0 */
    int ok;
    char err[256];
} job;

static int run_job(job *j) {
    spx_model *m = j->m;
    const int64_t V = spx_model_vocab_size(m);
    int32_t ids[256];
    size_t n = 256;
    if (spx_tokenize(m, j->prompt, strlen(j->prompt), 1, ids, &n) != SPX_OK) {
        snprintf(j->err, sizeof j->err, "tokenize: %s", spx_last_error());
        return 0;
    }
    spx_session_params sp = {.n_ctx = 128, .kv = SPX_KV_F16};
    spx_session *s[2] = {NULL, NULL};
    const int ns = j->kind == 1 ? 2 : 1;
    int ok = 1;
    for (int i = 0; i < ns && ok; i++) ok = spx_session_new(m, &sp, &s[i]) == SPX_OK;
    if (!ok) snprintf(j->err, sizeof j->err, "session: %s", spx_last_error());
    spx_spec *sx = NULL;
    if (ok && j->kind == 2) {
        spx_spec_params p;
        spx_spec_params_default(&p);
        p.kind = SPX_SPEC_LOOKUP;
        ok = spx_spec_new(s[0], &p, &sx) == SPX_OK && spx_spec_history(sx, ids, n) == SPX_OK;
    }
    for (int i = 0; i < ns && ok; i++) {
        ok = spx_session_eval(s[i], ids, n - (size_t)i, j->last, 0) == SPX_OK; /* the second: one token shorter */
        if (ok) {
            int32_t best = 0;
            for (int64_t v = 1; v < V; v++)
                if (j->last[v] > j->last[best]) best = (int32_t)v;
            j->out[i][0] = best;
        }
    }
    for (int t = 1; t < N_GEN && ok;) {
        if (j->kind == 0) {
            ok = spx_session_step_greedy(s[0], j->out[0][t - 1], &j->out[0][t]) == SPX_OK;
            t++;
        } else if (j->kind == 1) {
            int32_t in[2] = {j->out[0][t - 1], j->out[1][t - 1]}, nx[2];
            ok = spx_batch_step(s, 2, in, NULL, NULL, nx, NULL) == SPX_OK;
            j->out[0][t] = nx[0], j->out[1][t] = nx[1];
            t++;
        } else {
            int32_t got[SPX_SPEC_DRAFT_LIMIT + 1];
            size_t k = 0, room = (size_t)(N_GEN - t);
            ok = spx_spec_step(sx, j->out[0][t - 1], NULL, NULL, got, room, &k) == SPX_OK && k > 0;
            for (size_t q = 0; q < k && ok; q++) j->out[0][t++] = got[q];
        }
    }
    if (!ok && !j->err[0]) snprintf(j->err, sizeof j->err, "decode: %s", s[0] ? spx_session_error(s[0]) : "");
    /* the logits of one more token: what the caches hold is the same too */
    if (ok) ok = spx_session_eval(s[0], &j->out[0][N_GEN - 1], 1, j->last, 0) == SPX_OK;
    spx_spec_free(sx);
    for (int i = 0; i < ns; i++) spx_session_free(s[i]);
    return ok;
}

static void *thread_main(void *p) {
    job *j = p;
    j->ok = run_job(j);
    return NULL;
}

int main(void) {
    /* quick (the sanitizer pass, where docllama-58m's twelve jobs took a
     * minute and a half): stories260K, which has a tokenizer too; the same
     * jobs, threads and checks on a model a hundred times smaller */
    const char *path = tl_shared(getenv("SPECTRA_TEST_QUICK") ? "models/stories260K" : "models/docllama-58m");
    spx_model_params mp = {.n_threads = 2, .backend = "cpu"};
    spx_model *m = NULL;
    if (spx_model_open(path, &mp, &m) != SPX_OK) {
        CHECK(0, "%s: %s", path, spx_last_error());
        return tl_finish("test_threads");
    }
    const int64_t V = spx_model_vocab_size(m);
    static const char *prompts[N_THREADS] = {
        "The Linux kernel", "A file system keeps", "int main(void) { return 0; } int main(void) {",
        "Memory management in", "The scheduler picks the next", "struct page *page = alloc_page(GFP_KERNEL); struct page"};
    job alone[N_THREADS], both[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        memset(&alone[i], 0, sizeof alone[i]);
        alone[i].m = m;
        alone[i].kind = i % 3;
        snprintf(alone[i].prompt, sizeof alone[i].prompt, "%s", prompts[i]);
        both[i] = alone[i];
        alone[i].last = malloc((size_t)V * sizeof(float));
        both[i].last = malloc((size_t)V * sizeof(float));
        CHECK(alone[i].last && both[i].last, "out of memory");
        alone[i].ok = run_job(&alone[i]);
        CHECK(alone[i].ok, "job %d alone: %s", i, alone[i].err);
    }
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) CHECK(pthread_create(&th[i], NULL, thread_main, &both[i]) == 0, "thread %d", i);
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N_THREADS; i++) {
        CHECK(both[i].ok, "job %d on a thread: %s", i, both[i].err);
        const int ns = both[i].kind == 1 ? 2 : 1;
        for (int k = 0; k < ns; k++)
            CHECK(!memcmp(alone[i].out[k], both[i].out[k], sizeof alone[i].out[k]),
                  "job %d (kind %d) session %d: tokens differ between alone and %d threads at once", i, both[i].kind, k,
                  N_THREADS);
        CHECK(!memcmp(alone[i].last, both[i].last, (size_t)V * sizeof(float)),
              "job %d: last logits differ between alone and on a thread", i);
        free(alone[i].last);
        free(both[i].last);
    }
    printf("test_threads: %d threads sharing one model (greedy steps, batches of two, speculation): each thread's "
           "tokens and logits equal its work done alone\n", N_THREADS);
    spx_model_free(m);
    return tl_finish("test_threads");
}
