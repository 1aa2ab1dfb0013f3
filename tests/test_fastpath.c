/* test_fastpath.c: end to end, each fast CPU kernel table this CPU runs
 * (int8 activations: avx2, avx512, amx) against the scalar reference
 * kernels on a real model: docllama-58m compressed with the defaults, the
 * same 128 tokens of its eval text, all tables in one process: the first
 * 120 tokens as one prompt (the GEMM paths; amx: its tiles), the last 8
 * one at a time (the GEMV paths). Skips (with a note) only when this CPU
 * has no fast kernel table. */
#include "testlib.h"
#include "cpu/qkernels.h"
#include "engine/session.h"
#include "quant/compress.h"
#include "quant/g32.h"
#include "quant/saliency.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* int8 activations per block of 32 (max |x| / 127) move each product by a
 * relative ~0.5-1 %; through 8 layers and a 32k-vocab head (logits span
 * about +-20) measured: max 0.40, mean 0.039, top-1 126/128. Bounds with
 * ~2x headroom; a wrong scale, zero or nibble order gives errors of whole
 * logits and fails them. (KL cost: bench/results, +0.7 %.) */
#define FAST_MAX_ABS 1.0
#define FAST_MEAN_ABS 0.08
#define FAST_MIN_TOP1 0.95

int main(void) {
    const spx_qkernels *fast = spx_qkernels_best();
    if (fast == spx_qkernels_scalar()) {
        printf("no fast kernel table on this CPU: nothing to compare\n");
        return tl_finish("test_fastpath");
    }
    char out[600];
    snprintf(out, sizeof out, "%s/doc.trdc", tl_tmpdir());
    spx_compress_opts o = {.src_dir = tl_shared("models/docllama-58m"), .out_path = out, .bits = 4, .group = 32,
                           .outlier_mode = SPX_OUTLIERS_AUTO, .method = SPX_Q_MSE, .n_threads = 2};
    spx_compress_stats st;
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_compress(&o, &st, &e) == SPX_OK, "%s", e.msg);
    spx_model *m = NULL;
    spx_model_params mp = {.n_threads = 2};
    CHECK(spx_model_open(out, &mp, &m) == SPX_OK, "%s", spx_last_error());
    if (!m) return tl_finish("test_fastpath");
    char *text = tl_read(tl_shared("models/docllama-58m/eval.txt"), NULL);
    static int32_t ids[4096];
    size_t n = 4096;
    CHECK(text && spx_tokenize(m, text, 3000, 1, ids, &n) == SPX_OK && n >= 128, "tokenize");
    n = 128;
    int64_t V = spx_model_vocab_size(m);
    enum { PROMPT = 120 };
    static const char *const names[] = {"scalar", "avx2", "avx512", "amx"};
    float *lg[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < 4; k++) {
        const spx_qkernels *qk = spx_qkernels_get(names[k]);
        if (!qk) {
            printf("note: no %s table on this CPU: not compared\n", names[k]);
            continue;
        }
        m->qk = qk; /* sessions take the model's table when created */
        lg[k] = malloc(n * (size_t)V * sizeof(float));
        spx_session *s = NULL;
        spx_session_params sp = {.kv = SPX_KV_F32};
        CHECK(spx_session_new(m, &sp, &s) == SPX_OK, "session");
        CHECK(s && spx_session_eval(s, ids, PROMPT, lg[k], 1) == SPX_OK, "eval");
        for (size_t t = PROMPT; s && t < n; t++)
            CHECK(spx_session_eval(s, ids + t, 1, lg[k] + t * (size_t)V, 1) == SPX_OK, "eval token %zu", t);
        spx_session_free(s);
    }
    for (int k = 1; k < 4; k++) {
        if (!lg[k]) continue;
        double mx = 0, sum = 0;
        int same = 0;
        for (size_t t = 0; t < n; t++) {
            int64_t a = 0, b = 0;
            for (int64_t v = 0; v < V; v++) {
                double d = fabs((double)lg[k][t * V + v] - lg[0][t * V + v]);
                mx = d > mx ? d : mx;
                sum += d;
                if (lg[0][t * V + v] > lg[0][t * V + a]) a = v;
                if (lg[k][t * V + v] > lg[k][t * V + b]) b = v;
            }
            same += a == b;
        }
        double mean = sum / (double)(n * (size_t)V);
        printf("docllama-58m .trdc, %zu tokens: %s vs scalar kernels: max |dlogit| %.4f, mean %.5f, top-1 %d/%zu\n",
               n, names[k], mx, mean, same, n);
        CHECK(mx <= FAST_MAX_ABS, "%s: max %g > %g", names[k], mx, FAST_MAX_ABS);
        CHECK(mean <= FAST_MEAN_ABS, "%s: mean %g > %g", names[k], mean, FAST_MEAN_ABS);
        CHECK(same >= FAST_MIN_TOP1 * (double)n, "%s: top-1 %d/%zu", names[k], same, n);
    }
    for (int k = 0; k < 4; k++) free(lg[k]);
    free(text);
    spx_model_free(m);
    return tl_finish("test_fastpath");
}
