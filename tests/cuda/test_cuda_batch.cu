/* test_cuda_batch.cu: batched decode, speculation and rewind on the CUDA
 * backend, per fixture (.trdc paths as arguments):
 *   - spx_batch_step over B sessions (fp16 and q4 KV mixed, prompts of
 *     different lengths): each row's logits within E2E_PREFILL_TOL of its
 *     twin session stepped alone on CUDA (the batch runs the few-token
 *     products, whose rounding is the prompt path's, not the GEMV's), each
 *     token equal to the twin's or, where the twin's top two are within
 *     that tolerance, a near tie (rows with the 4-bit cache: cutest.cuh's
 *     q4 bounds, relative to q4's own error); the distance to a CPU twin
 *     is printed;
 *   - greedy speculation (prompt lookup, a prompt that repeats) returns
 *     plain greedy decoding's tokens (spx_session_step_greedy_ahead: the
 *     queued-ahead decode loop), near ties as above;
 *   - rewind with a step queued ahead: steps queued one ahead, a truncate
 *     back past them and a re-feed give a fresh session's logits (the
 *     queued step's KV row is rewritten before it is read). */
#include "cutest.cuh"

extern "C" {
#include "spectra.h"
#include "testlib.h"
}

#include <string.h>
#include <vector>

#define E2E_PREFILL_TOL 2e-2 /* as test_cuda.cu: the prompt path's logits against another path's */

static uint64_t g_rng = 7;

/* ng equals nc, or is a near tie (within tol) in the reference row c */
static int same_or_near(int32_t ng, int32_t nc, const float *c, int64_t V, double tol = E2E_PREFILL_TOL) {
    if (ng == nc) return 1;
    return ng >= 0 && ng < V && fabs(c[ng] - c[nc]) <= tol * fmax(1.0, fabs(c[nc])) ? 2 : 0;
}

static spx_model *open_cuda(const char *path) {
    spx_model_params p = {0, "cuda", 0};
    spx_model *m = NULL;
    CHECK(spx_model_open(path, &p, &m) == SPX_OK, "%s: %s", path, spx_last_error());
    return m;
}

/* B sessions on CUDA in batch steps; twins: the same sessions stepped
 * alone on CUDA (the reference: a batch gives each session what it would
 * get alone, up to the few-token products' rounding, which is the prompt
 * path's) and on the CPU (reported). q4: odd sessions have the 4-bit
 * cache (only where the model's head_dim takes it); their rows are held
 * to cutest.cuh's err_acc bounds against the twin alone, with a third twin
 * (alone, fp16 cache) for q4's own error: a code flipped by the rounding
 * difference moves later K/V by a quantization step, so q4 rows differ
 * more than fp16 rows without anything being wrong. */
static void test_batch(spx_model *m, spx_model *mc, const char *path, int B, int q4) {
    const int64_t V = spx_model_vocab_size(m);
    std::vector<spx_session *> s(B, nullptr), t(B, nullptr), c(B, nullptr), h(B, nullptr);
    std::vector<int32_t> ids(B), next(B);
    std::vector<float> lg((size_t)B * V), tl(V), cl(V), hl(V);
    int ok = 1, near = 0;
    double worst = 0, cpu[2] = {0, 0}, single_cpu[2] = {0, 0}; /* [fp16, q4] */
    err_acc eq;
    for (int i = 0; i < B && ok; i++) {
        const int k = q4 && i % 2;
        spx_session_params sp = {200, k ? SPX_KV_Q4 : SPX_KV_F16}, sf = {200, SPX_KV_F16};
        ok = spx_session_new(m, &sp, &s[i]) == SPX_OK && spx_session_new(m, &sp, &t[i]) == SPX_OK &&
             spx_session_new(mc, &sp, &c[i]) == SPX_OK && (!k || spx_session_new(m, &sf, &h[i]) == SPX_OK);
        CHECK(ok, "%s: session %d: %s / %s", path, i, spx_model_error(m), spx_model_error(mc));
        int np = 2 + 7 * i % 50;
        std::vector<int32_t> pr(np);
        for (auto &x : pr) x = (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)V);
        ok = ok && spx_session_eval(s[i], pr.data(), np, NULL, 0) == SPX_OK &&
             spx_session_eval(t[i], pr.data(), np, NULL, 0) == SPX_OK &&
             spx_session_eval(c[i], pr.data(), np, NULL, 0) == SPX_OK &&
             (!k || spx_session_eval(h[i], pr.data(), np, NULL, 0) == SPX_OK);
        ids[i] = (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)V);
    }
    for (int st = 0; st < 8 && ok; st++) {
        ok = spx_batch_step(s.data(), (size_t)B, ids.data(), NULL, NULL, next.data(), lg.data()) == SPX_OK;
        CHECK(ok, "%s: batch step: %s", path, spx_session_error(s[0]));
        for (int i = 0; i < B && ok; i++) {
            const int k = q4 && i % 2;
            const float *row = lg.data() + (size_t)i * V;
            ok = spx_session_eval(t[i], &ids[i], 1, tl.data(), 0) == SPX_OK &&
                 spx_session_eval(c[i], &ids[i], 1, cl.data(), 0) == SPX_OK &&
                 (!k || spx_session_eval(h[i], &ids[i], 1, hl.data(), 0) == SPX_OK);
            double tie = E2E_PREFILL_TOL;
            if (k) {
                eq.add(row, tl.data(), hl.data(), V);
                tie = fmax(tie, 2.0 * E2E_Q4_MAX_RATIO * row_err(hl.data(), tl.data(), V));
            } else {
                worst = fmax(worst, row_err(row, tl.data(), V));
            }
            cpu[k] = fmax(cpu[k], row_err(row, cl.data(), V));
            single_cpu[k] = fmax(single_cpu[k], row_err(tl.data(), cl.data(), V));
            const int32_t want = argmax_f(tl.data(), V);
            int r = same_or_near(next[i], want, tl.data(), V, tie);
            CHECK(r, "%s: B=%d step %d session %d: batch token %d, alone %d", path, B, st, i, next[i], want);
            near += r == 2;
            ids[i] = want; /* every copy follows the reference's token */
        }
    }
    CHECK(worst <= E2E_PREFILL_TOL, "%s: B=%d: fp16 rows: batch vs alone logits %.3g > %.3g", path, B, worst,
          E2E_PREFILL_TOL);
    if (q4)
        CHECK(eq.ok(), "%s: B=%d: q4 rows: batch vs alone mean |d| %.3g x q4's own, max-rel %.3g x; bounds %.2g, %.2g",
              path, B, eq.mean_ratio(), eq.max_ratio(), E2E_Q4_MEAN_RATIO, E2E_Q4_MAX_RATIO);
    printf("%s: batch of %d, 8 steps: vs alone (cuda): fp16 rows %.3g (tolerance %.3g)", path, B, worst, E2E_PREFILL_TOL);
    if (q4)
        printf(", q4 rows mean %.3g x / max-rel %.3g x q4's own error (bounds %.2g, %.2g)", eq.mean_ratio(),
               eq.max_ratio(), E2E_Q4_MEAN_RATIO, E2E_Q4_MAX_RATIO);
    printf("; %d near ties; vs cpu: fp16 %.3g, q4 %.3g (alone vs cpu: %.3g, %.3g)\n", near, cpu[0], cpu[1],
           single_cpu[0], single_cpu[1]);
    for (int i = 0; i < B; i++) {
        spx_session_free(s[i]);
        spx_session_free(t[i]);
        spx_session_free(c[i]);
        spx_session_free(h[i]);
    }
}

static void test_spec(spx_model *m, const char *path, spx_kv_type kv) {
    const int64_t V = spx_model_vocab_size(m);
    const int np = 64, ng = 60;
    std::vector<int32_t> pr(np), plain(ng), spec(ng);
    for (int i = 0; i < np; i++) pr[i] = i < np / 2 ? (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)V) : pr[i - np / 2];
    spx_session_params sp = {np + ng + 40, kv};
    spx_session *a = NULL, *b = NULL;
    std::vector<float> la(V), lb(V);
    CHECK(spx_session_new(m, &sp, &a) == SPX_OK && spx_session_new(m, &sp, &b) == SPX_OK, "sessions");
    if (!a || !b) return;
    CHECK(spx_session_eval(a, pr.data(), np, la.data(), 0) == SPX_OK &&
          spx_session_eval(b, pr.data(), np, lb.data(), 0) == SPX_OK, "%s: prompt", path);
    int32_t id = argmax_f(la.data(), V);
    plain[0] = id;
    for (int i = 1; i < ng; i++) CHECK(spx_session_step_greedy_ahead(a, plain[i - 1], &plain[i], i + 1 < ng) == SPX_OK, "step");
    spx_spec_params p;
    spx_spec_params_default(&p);
    p.kind = SPX_SPEC_LOOKUP;
    spx_spec *sx = NULL;
    CHECK(spx_spec_new(b, &p, &sx) == SPX_OK && spx_spec_history(sx, pr.data(), np) == SPX_OK, "%s: spec", path);
    int n = 1, diff = -1;
    spec[0] = argmax_f(lb.data(), V);
    while (sx && n < ng) {
        int32_t out[SPX_SPEC_DRAFT_LIMIT + 1];
        size_t got = 0, room = (size_t)(ng - n);
        if (spx_spec_step(sx, spec[n - 1], NULL, NULL, out, room < 33 ? room : 33, &got) != SPX_OK) {
            CHECK(0, "%s: spec step: %s", path, spx_session_error(b));
            break;
        }
        for (size_t k = 0; k < got; k++) spec[n + (int)k] = out[k];
        n += (int)got;
    }
    for (int i = 0; i < ng && diff < 0; i++)
        if (spec[i] != plain[i]) diff = i;
    spx_spec_stats st;
    memset(&st, 0, sizeof st);
    if (sx) spx_spec_get_stats(sx, &st);
    /* a difference must be a near tie of the plain path's logits at that step */
    int near_ok = 1;
    if (diff >= 0) {
        spx_session *c = NULL;
        CHECK(spx_session_new(m, &sp, &c) == SPX_OK, "session");
        std::vector<int32_t> all(pr);
        all.insert(all.end(), plain.begin(), plain.begin() + diff);
        std::vector<float> lc(V);
        CHECK(spx_session_eval(c, all.data(), all.size(), lc.data(), 0) == SPX_OK, "eval");
        near_ok = same_or_near(spec[diff], plain[diff], lc.data(), V) != 0;
        spx_session_free(c);
    }
    CHECK(diff < 0 || near_ok, "%s kv %d: speculation differs from plain greedy at token %d (%d vs %d), not a near tie",
          path, (int)kv, diff, diff >= 0 ? spec[diff] : 0, diff >= 0 ? plain[diff] : 0);
    printf("%s kv %s: spec greedy vs plain greedy: %s (%lld passes, %lld drafted, %lld accepted)\n", path,
           kv == SPX_KV_Q4 ? "q4" : "f16", diff < 0 ? "identical" : "a near tie differs", (long long)st.passes,
           (long long)st.drafted, (long long)st.accepted);
    spx_spec_free(sx);
    spx_session_free(a);
    spx_session_free(b);
}

static void test_rewind_ahead(spx_model *m, const char *path) {
    const int64_t V = spx_model_vocab_size(m);
    spx_session_params sp = {128, SPX_KV_F16};
    spx_session *a = NULL, *b = NULL;
    CHECK(spx_session_new(m, &sp, &a) == SPX_OK && spx_session_new(m, &sp, &b) == SPX_OK, "sessions");
    if (!a || !b) return;
    std::vector<int32_t> pr(20);
    for (auto &x : pr) x = (int32_t)(tl_rand_u64(&g_rng) % (uint64_t)V);
    /* the checkpoint at 17: a hybrid's recurrent state rewinds only there */
    CHECK(spx_session_eval(a, pr.data(), 17, NULL, 0) == SPX_OK, "eval");
    spx_session_checkpoint(a);
    CHECK(spx_session_eval(a, pr.data() + 17, 3, NULL, 0) == SPX_OK, "eval");
    int32_t id = pr[19], nx;
    for (int i = 0; i < 6; i++) { /* each call queues the next step: the last one's is left queued */
        CHECK(spx_session_step_greedy_ahead(a, id, &nx, 1) == SPX_OK, "step");
        id = nx;
    }
    CHECK(spx_session_truncate(a, 17) == SPX_OK, "%s: truncate: %s", path, spx_session_error(a));
    int32_t more[4] = {5 % (int32_t)V, 9 % (int32_t)V, 2 % (int32_t)V, 7 % (int32_t)V};
    std::vector<float> la((size_t)4 * V), lb((size_t)4 * V);
    CHECK(spx_session_eval(a, more, 4, la.data(), 1) == SPX_OK, "re-feed");
    CHECK(spx_session_eval(b, pr.data(), 17, NULL, 0) == SPX_OK && spx_session_eval(b, more, 4, lb.data(), 1) == SPX_OK,
          "fresh");
    CHECK(!memcmp(la.data(), lb.data(), la.size() * sizeof(float)),
          "%s: truncate after queued-ahead steps + re-feed differs from a fresh session (max %g)", path,
          tl_max_diff(la.data(), lb.data(), la.size()));
    printf("%s: truncate past queued-ahead steps then re-feed: a fresh session's logits, bit for bit\n", path);
    spx_session_free(a);
    spx_session_free(b);
}

int main(int argc, char **argv) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("test_cuda_batch: no CUDA device; skipped\n");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        spx_model *m = open_cuda(argv[i]), *mc = NULL;
        spx_model_params pc = {0, "cpu", 0};
        CHECK(spx_model_open(argv[i], &pc, &mc) == SPX_OK, "%s: cpu: %s", argv[i], spx_last_error());
        if (!m || !mc) {
            spx_model_free(m);
            spx_model_free(mc);
            continue;
        }
        /* the 4-bit cache needs head_dim % 32 == 0 */
        spx_session *probe = NULL;
        spx_session_params q4p = {16, SPX_KV_Q4};
        const int q4 = spx_session_new(m, &q4p, &probe) == SPX_OK;
        spx_session_free(probe);
        test_batch(m, mc, argv[i], 2, q4);
        test_batch(m, mc, argv[i], 7, q4);
        test_batch(m, mc, argv[i], 16, q4);
        test_spec(m, argv[i], SPX_KV_F16);
        if (q4) test_spec(m, argv[i], SPX_KV_Q4);
        test_rewind_ahead(m, argv[i]);
        spx_model_free(m);
        spx_model_free(mc);
    }
    return tl_finish("test_cuda_batch");
}
