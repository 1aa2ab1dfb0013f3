/* test_batch.c: batched decode (spx_batch_step, engine/batch.c).
 *   - B sessions at different positions (prompts of different lengths),
 *     with different KV cache types in one batch, stepped together: each
 *     session's tokens and logits equal, bit for bit, those of a twin
 *     session stepped alone (spx_session_step_greedy / eval), for several
 *     steps; greedy and sampled (per-session parameters and RNG states);
 *     attention models (the f32 folder and its 4-bit .trdc, whose products
 *     of 2..16 rows take the decode-sized kernels) and hybrids (short
 *     convolution, Mamba-2: each session's recurrent state);
 *   - more sessions than one pass takes (18 > 16: passes of 16 and 2);
 *   - refused batches (a session twice, another model's session, a full
 *     context, a bad id) name the session and leave every session as it
 *     was. */
#include "testlib.h"
#include "quant/compress.h"
#include "quant/g32.h"
#include "quant/saliency.h"
#include "spectra.h"

#include <stdlib.h>
#include <string.h>

static int quick(void) { return getenv("SPECTRA_TEST_QUICK") != NULL; }

static spx_model *open_path(const char *path) {
    spx_model_params mp = {.n_threads = 2};
    spx_model *m = NULL;
    CHECK(spx_model_open(path, &mp, &m) == SPX_OK, "%s: %s", path, spx_last_error());
    return m;
}

/* The fixture's folder, or its 4-bit compression in the temporary folder. */
static const char *fixture(const char *name, int q4, char *buf, size_t cap) {
    char src[512];
    snprintf(src, sizeof src, "%s", tl_shared("models/"));
    strncat(src, name, sizeof src - strlen(src) - 1);
    if (!q4) {
        snprintf(buf, cap, "%s", src);
        return buf;
    }
    snprintf(buf, cap, "%s/%s-batch.trdc", tl_tmpdir(), name);
    spx_compress_opts o = {.src_dir = src, .out_path = buf, .bits = 4, .group = 32,
                           .outlier_mode = SPX_OUTLIERS_AUTO, .method = SPX_Q_MSE, .n_threads = 2};
    spx_compress_stats st;
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_compress(&o, &st, &e) == SPX_OK, "%s: compress: %s", name, e.msg);
    return e.code ? NULL : buf;
}

enum { MAXB = 18, STEPS = 6 };

/* B sessions (and B twins) with prompts of 3 + 5i tokens, KV types in
 * turn from kvs[]; then STEPS batch steps against the twins' single steps.
 * smp: sample with per-session temperatures and seeds (else greedy). */
static void check_batch(spx_model *m, const char *what, int B, const spx_kv_type *kvs, int nkv, int smp) {
    const int64_t V = spx_model_vocab_size(m);
    spx_session *s[MAXB] = {0}, *t[MAXB] = {0};
    int32_t ids[MAXB], next[MAXB], tnext[MAXB];
    uint64_t rng[MAXB], trng[MAXB];
    spx_sampler_params sp[MAXB];
    float *lg = malloc((size_t)(B * V) * sizeof *lg), *tl = malloc((size_t)V * sizeof *tl);
    uint64_t r = 99;
    int ok = 1;
    for (int i = 0; i < B && ok; i++) {
        spx_session_params p = {.n_ctx = 160, .kv = kvs[i % nkv]};
        ok = spx_session_new(m, &p, &s[i]) == SPX_OK && spx_session_new(m, &p, &t[i]) == SPX_OK;
        CHECK(ok, "%s: session %d: %s", what, i, spx_last_error());
        int np = 3 + 5 * i % 40;
        int32_t prompt[64];
        for (int k = 0; k < np; k++) prompt[k] = (int32_t)(tl_rand_u64(&r) % (uint64_t)V);
        ok = ok && spx_session_eval(s[i], prompt, (size_t)np, NULL, 0) == SPX_OK &&
             spx_session_eval(t[i], prompt, (size_t)np, NULL, 0) == SPX_OK;
        ids[i] = (int32_t)(tl_rand_u64(&r) % (uint64_t)V);
        sp[i] = (spx_sampler_params){.temperature = 0.7f + 0.1f * (float)(i % 4), .top_k = i % 3 ? 40 : 0,
                                     .top_p = i % 2 ? 0.9f : 1.0f, .seed = 0};
        rng[i] = trng[i] = 1000 + (uint64_t)i;
    }
    int64_t tok_diff = 0, logit_diff = 0;
    for (int st = 0; st < STEPS && ok; st++) {
        ok = spx_batch_step(s, (size_t)B, ids, smp ? sp : NULL, smp ? rng : NULL, next, lg) == SPX_OK;
        CHECK(ok, "%s: batch step %d: %s", what, st, spx_session_error(s[0]));
        for (int i = 0; i < B && ok; i++) {
            ok = spx_session_eval(t[i], &ids[i], 1, tl, 0) == SPX_OK;
            tnext[i] = spx_sample(tl, V, smp ? &sp[i] : NULL, smp ? &trng[i] : NULL);
            tok_diff += tnext[i] != next[i] || (smp && trng[i] != rng[i]);
            logit_diff += memcmp(tl, lg + (size_t)i * (size_t)V, (size_t)V * sizeof *tl) != 0;
            CHECK(spx_session_pos(s[i]) == spx_session_pos(t[i]), "%s: session %d at %lld, twin at %lld", what, i,
                  (long long)spx_session_pos(s[i]), (long long)spx_session_pos(t[i]));
            ids[i] = next[i];
        }
    }
    CHECK(ok && tok_diff == 0, "%s: B=%d %s: %lld tokens differ from single-session steps", what, B,
          smp ? "sampled" : "greedy", (long long)tok_diff);
    CHECK(ok && logit_diff == 0, "%s: B=%d: %lld rows' logits differ from single-session steps", what, B,
          (long long)logit_diff);
    /* and greedy through spx_session_step_greedy (the API's plain step) */
    if (ok && !smp) {
        int32_t a[MAXB], b[MAXB];
        CHECK(spx_batch_step(s, (size_t)B, ids, NULL, NULL, a, NULL) == SPX_OK, "%s: batch step without logits", what);
        for (int i = 0; i < B; i++) {
            CHECK(spx_session_step_greedy(t[i], ids[i], &b[i]) == SPX_OK, "step_greedy");
            CHECK(a[i] == b[i], "%s: session %d: batch %d, step_greedy %d", what, i, a[i], b[i]);
        }
    }
    printf("%s: B=%d %s, %d steps: tokens and logits as single-session steps\n", what, B, smp ? "sampled" : "greedy",
           STEPS);
    for (int i = 0; i < B; i++) {
        spx_session_free(s[i]);
        spx_session_free(t[i]);
    }
    free(lg);
    free(tl);
}

static void check_refusals(spx_model *m, spx_model *other) {
    spx_session_params p = {.n_ctx = 8};
    spx_session *a = NULL, *b = NULL, *c = NULL;
    CHECK(spx_session_new(m, &p, &a) == SPX_OK && spx_session_new(m, &p, &b) == SPX_OK &&
          spx_session_new(other, &p, &c) == SPX_OK, "sessions");
    if (!a || !b || !c) goto done;
    int32_t ids[2] = {1, 2}, next[2];
    CHECK(spx_session_eval(a, ids, 2, NULL, 0) == SPX_OK, "eval");
    spx_session *twice[2] = {a, a}, *mixed[2] = {b, c}, *pair[2] = {b, a};
    CHECK(spx_batch_step(twice, 2, ids, NULL, NULL, next, NULL) == SPX_ERR_ARG &&
          strstr(spx_session_error(a), "same session"), "a session twice: %s", spx_session_error(a));
    CHECK(spx_batch_step(mixed, 2, ids, NULL, NULL, next, NULL) == SPX_ERR_ARG &&
          strstr(spx_session_error(b), "session 1"), "another model's session: %s", spx_session_error(b));
    int32_t bad[2] = {1, (int32_t)spx_model_vocab_size(m)};
    CHECK(spx_batch_step(pair, 2, bad, NULL, NULL, next, NULL) == SPX_ERR_RANGE &&
          strstr(spx_session_error(b), "session 1"), "bad id: %s", spx_session_error(b));
    CHECK(spx_session_pos(a) == 2 && spx_session_pos(b) == 0, "refused batches moved a session");
    int32_t fill[6] = {3, 4, 5, 6, 7, 8};
    CHECK(spx_session_eval(a, fill, 6, NULL, 0) == SPX_OK, "fill");
    CHECK(spx_batch_step(pair, 2, ids, NULL, NULL, next, NULL) == SPX_ERR_RANGE &&
          strstr(spx_session_error(b), "context full"), "full context: %s", spx_session_error(b));
    CHECK(spx_session_pos(a) == 8 && spx_session_pos(b) == 0, "refused batch moved a session");
done:
    spx_session_free(a);
    spx_session_free(b);
    spx_session_free(c);
}

int main(void) {
    char buf[640];
    const spx_kv_type f16[] = {SPX_KV_F16}, mix[] = {SPX_KV_F16, SPX_KV_Q4, SPX_KV_F32, SPX_KV_K2V2};
    const char *path = fixture("tiny-llama3", 0, buf, sizeof buf);
    spx_model *m = path ? open_path(path) : NULL;
    if (m) {
        check_batch(m, "tiny-llama3 f32", 2, f16, 1, 0);
        check_batch(m, "tiny-llama3 f32 mixed kv", 5, mix, 4, 0);
        check_batch(m, "tiny-llama3 f32 mixed kv", 4, mix, 4, 1);
    }
    path = fixture("tiny-llama3", 1, buf, sizeof buf);
    spx_model *q = path ? open_path(path) : NULL;
    if (q) {
        for (int B = 2; B <= (quick() ? 5 : 16); B += quick() ? 3 : 2)
            check_batch(q, "tiny-llama3 q4", B, mix, 4, 0);
        check_batch(q, "tiny-llama3 q4 18 sessions", 18, mix, 4, 0);
        check_batch(q, "tiny-llama3 q4", 6, mix, 4, 1);
        if (m) check_refusals(q, m);
    }
    spx_model_free(q);
    spx_model_free(m);
    /* and the mixture-of-experts models: a batch row's experts are its own */
    static const char *hybrids[] = {"tiny-lfm2", "tiny-granite4", "tiny-nemotronh", "tiny-qwen3moe", "tiny-granite4moe"};
    for (int h = 0; h < 5; h++) {
        path = fixture(hybrids[h], !quick() && (h == 0 || h >= 3), buf, sizeof buf); /* MoE: quantized experts */
        spx_model *hm = path ? open_path(path) : NULL;
        if (!hm) continue;
        check_batch(hm, hybrids[h], 5, mix, 2, 0);
        check_batch(hm, hybrids[h], 3, mix, 2, 1);
        spx_model_free(hm);
    }
    if (!quick()) {
        path = fixture("docllama-58m", 1, buf, sizeof buf);
        spx_model *d = path ? open_path(path) : NULL;
        if (d) check_batch(d, "docllama-58m q4", 8, mix, 2, 0);
        spx_model_free(d);
    }
    return tl_finish("test_batch");
}
