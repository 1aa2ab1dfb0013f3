/* test_refine_model.c: weight refinement in the forward pass (refine/rmat.h)
 * on real fixtures: a compressed model plus the exact residual of every
 * layer matrix, every channel selected, decodes what the compressed model
 * gives with its layer matrices replaced by the dense source's (the
 * embedding and LM head stay quantized: they are not refined); a budget of 0 is the compressed model bit for bit; the 4-bit
 * residual with every channel brings the logits much closer to the dense
 * ones; a budget per set leaves the other sets' launches alone; prompts
 * (T > 1) run the base weights. The scalar kernel table throughout, so
 * the base product is a float sum and the exactness bound is rounding. */
#include "testlib.h"
#include "engine/session.h"
#include "quant/compress.h"
#include "quant/g32.h"
#include "quant/saliency.h"
#include "refine/attach.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* dense layers vs base + exact residual: the float32 rounding of two sums
 * (base, then residual in double) per projection instead of one, through
 * every layer (the fixtures' logits are O(1-10); seen: under 1e-6) */
#define EXACT_TOL 1e-5
#define N_TOK 12

static spx_model *open_model(const char *path) {
    spx_model *m = NULL;
    spx_model_params mp = {.n_threads = 2};
    CHECK(spx_model_open(path, &mp, &m) == SPX_OK, "%s: %s", path, spx_last_error());
    if (m) m->qk = spx_qkernels_scalar();
    return m;
}


static void run_fixture(const char *name) {
    char dir[256], out[600];
    snprintf(dir, sizeof dir, "models/%s", name);
    snprintf(out, sizeof out, "%s/%s.trdc", tl_tmpdir(), name);
    char rpath[640];
    snprintf(rpath, sizeof rpath, "%s/%s.refine", tl_tmpdir(), name);
    spx_compress_opts o = {.src_dir = tl_shared(dir), .out_path = out, .bits = 4, .group = 32,
                           .outlier_mode = SPX_OUTLIERS_AUTO, .method = SPX_Q_MSE, .n_threads = 2,
                           .refine_path = rpath};
    spx_compress_stats st;
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_compress(&o, &st, &e) == SPX_OK, "%s: compress: %s", name, e.msg);
    spx_model *dense = open_model(tl_shared(dir)), *m = open_model(out);
    if (!dense || !m) goto done;
    const int64_t V = spx_model_vocab_size(m);
    const size_t nv = (size_t)N_TOK * (size_t)V;
    int32_t ids[N_TOK];
    for (int t = 0; t < N_TOK; t++) ids[t] = (int32_t)((7 + 37 * t) % V);

    /* the reference: m's embedding and head, the source's layer matrices */
    spx_model *mix = open_model(out);
    if (!mix) goto done;
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int sl = 0; sl < SPX_SL_COUNT; sl++)
            if (spx_slots[sl].mat && m->layers[l].w[sl].rows) mix->layers[l].w[sl] = dense->layers[l].w[sl];
    float *ref = tl_decode_steps(mix, ids, N_TOK), *base = tl_decode_steps(m, ids, N_TOK);
    spx_model_free(mix);
    const double base_err = tl_mean_diff(base, ref, nv);

    /* exact residual, every channel: the dense logits */
    CHECK(spx_refine_build(m, dense, 1, &e) == SPX_OK, "%s: build: %s", name, e.msg);
    const int64_t all[SPX_RSET_COUNT] = {SPX_REFINE_CHUNK, SPX_REFINE_CHUNK, SPX_REFINE_CHUNK, SPX_REFINE_CHUNK};
    const int64_t none[SPX_RSET_COUNT] = {0, 0, 0, 0};
    CHECK(spx_refine_set_budget(m, all, &e) == SPX_OK, "%s", e.msg);
    float *ex = tl_decode_steps(m, ids, N_TOK);
    const double ex_err = tl_max_diff(ex, ref, nv);
    printf("%s: base vs dense layers mean |dlogit| %.4f; exact residual, every channel: max %.2e (tol %g), %llu launches\n",
           name, base_err, ex_err, EXACT_TOL, (unsigned long long)m->refine->rt.st.launches);
    CHECK(ex_err <= EXACT_TOL, "%s: exact refinement max |d| %g > %g", name, ex_err, EXACT_TOL);
    CHECK(m->refine->rt.st.launches > 0 && m->refine->rt.st.applied == m->refine->rt.st.selected,
          "%s: launches %llu", name, (unsigned long long)m->refine->rt.st.launches);

    /* budget 0: the compressed model's bits */
    CHECK(spx_refine_set_budget(m, none, &e) == SPX_OK, "%s", e.msg);
    float *z = tl_decode_steps(m, ids, N_TOK);
    CHECK(memcmp(z, base, nv * sizeof(float)) == 0, "%s: budget 0 differs from the base", name);

    /* a prompt (T > 1) runs the base weights even with a budget */
    CHECK(spx_refine_set_budget(m, all, &e) == SPX_OK, "%s", e.msg);
    {
        float *p0 = malloc(nv * sizeof(float)), *p1 = malloc(nv * sizeof(float));
        spx_session *s = NULL;
        spx_session_params sp = {.kv = SPX_KV_F32};
        CHECK(spx_session_new(m, &sp, &s) == SPX_OK && spx_session_eval(s, ids, N_TOK, p1, 1) == SPX_OK, "prompt");
        spx_session_free(s);
        spx_refine_detach(m);
        s = NULL;
        CHECK(spx_session_new(m, &sp, &s) == SPX_OK && spx_session_eval(s, ids, N_TOK, p0, 1) == SPX_OK, "prompt");
        spx_session_free(s);
        CHECK(memcmp(p0, p1, nv * sizeof(float)) == 0, "%s: a prompt with refinement differs from the base", name);
        free(p0), free(p1);
    }

    /* 4-bit residual, every channel: much closer to the dense model */
    CHECK(spx_refine_build(m, dense, 0, &e) == SPX_OK, "%s: build q4: %s", name, e.msg);
    CHECK(spx_refine_set_budget(m, all, &e) == SPX_OK, "%s", e.msg);
    float *q4 = tl_decode_steps(m, ids, N_TOK);
    const double q4_err = tl_mean_diff(q4, ref, nv);
    /* only the down projections: the others' launches untouched, so the
     * result lies between base and every set refined */
    const int64_t down[SPX_RSET_COUNT] = {0, 0, 0, SPX_REFINE_CHUNK};
    CHECK(spx_refine_set_budget(m, down, &e) == SPX_OK, "%s", e.msg);
    float *dn = tl_decode_steps(m, ids, N_TOK);
    const double dn_err = tl_mean_diff(dn, ref, nv);
    printf("%s: 4-bit residual, every channel: mean |dlogit| %.4f (base %.4f); down projections only %.4f\n", name,
           q4_err, base_err, dn_err);
    CHECK(q4_err < 0.35 * base_err, "%s: 4-bit refinement %g, base %g", name, q4_err, base_err);

    /* the same residuals from the .refine compress wrote: mapped, and from
     * disk through the tier (wait on a miss), give the in-memory bits */
    spx_refine_detach(m);
    spx_refine_params rp = {.path = rpath, .k = {SPX_REFINE_CHUNK, SPX_REFINE_CHUNK, SPX_REFINE_CHUNK, SPX_REFINE_CHUNK}};
    CHECK(spx_model_refine(m, &rp) == SPX_OK, "%s: refine file: %s", name, spx_model_error(m));
    float *fq = tl_decode_steps(m, ids, N_TOK);
    CHECK(memcmp(fq, q4, nv * sizeof(float)) == 0, "%s: the .refine (mapped) differs from the in-memory residual: max %g",
          name, tl_max_diff(fq, q4, nv));
    rp.cache_mb = 64;
    rp.miss_wait = 1;
    CHECK(spx_model_refine(m, &rp) == SPX_OK, "%s: refine file on disk: %s", name, spx_model_error(m));
    float *fd = tl_decode_steps(m, ids, N_TOK);
    CHECK(memcmp(fd, q4, nv * sizeof(float)) == 0, "%s: the .refine (disk, wait) differs from the in-memory residual",
          name);
    spx_refine_info ri;
    spx_model_refine_info(m, &ri);
    CHECK(ri.on_disk && ri.requests > 0 && ri.applied == ri.selected, "%s: disk tier requests %llu", name,
          (unsigned long long)ri.requests);
    /* skip mode, cold cache: the first step misses every column, so it is
     * the base's first step bit for bit (the misses load in the background) */
    rp.miss_wait = 0;
    CHECK(spx_model_refine(m, &rp) == SPX_OK, "%s: refine file, skip: %s", name, spx_model_error(m));
    {
        float *l1 = malloc((size_t)V * sizeof(float));
        spx_session *s1 = NULL;
        spx_session_params sp = {.kv = SPX_KV_F32};
        CHECK(spx_session_new(m, &sp, &s1) == SPX_OK && spx_session_eval(s1, ids, 1, l1, 0) == SPX_OK, "skip step");
        CHECK(memcmp(l1, base, (size_t)V * sizeof(float)) == 0, "%s: a step whose columns all missed is not the base",
              name);
        spx_model_refine_info(m, &ri);
        CHECK(ri.hits == 0 && ri.applied == 0 && ri.requests > 0, "%s: cold skip step: hits %llu applied %llu", name,
              (unsigned long long)ri.hits, (unsigned long long)ri.applied);
        spx_session_free(s1);
        free(l1);
    }
    /* a model file is not a .refine */
    rp.path = out;
    CHECK(spx_model_refine(m, &rp) == SPX_ERR_FORMAT && strstr(spx_model_error(m), "not a .refine"), "%s: %s", name,
          spx_model_error(m));
    free(fq), free(fd);
    CHECK(dn_err < base_err && dn_err > q4_err, "%s: down only %g not between %g and %g", name, dn_err, q4_err, base_err);
    free(ref), free(base), free(ex), free(z), free(q4), free(dn);
done:
    spx_model_free(m);
    spx_model_free(dense);
}

int main(void) {
    run_fixture("tiny-llama3");
    run_fixture("tiny-nemotronh"); /* Mamba-2 in/out projections, ReLU^2 MLPs */
    run_fixture("tiny-lfm2");      /* short-convolution projections */
    return tl_finish("test_refine_model");
}
