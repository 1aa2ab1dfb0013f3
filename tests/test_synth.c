/* test_synth.c: the synthetic shapes (model/synth.h). Every shape's
 * config.json parses to the family it names; the small ones (tiny,
 * tiny-moe) are written both ways, and the .trdc and the HF folder hold
 * the same tensors with the same shapes (both come from the architecture
 * table), every tensor the model loader needs is there (the models open
 * and decode to finite logits), and the MoE shape routes as its config
 * says. */
#include "testlib.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "format/trdc.h"
#include "model/synth.h"
#include "spectra.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_configs(void) {
    int n = 0, moe = 0;
    for (const spx_synth_shape *s = spx_synth_shapes(); s->name; s++, n++) {
        char *j = spx_synth_config_json(s);
        spx_config c;
        spx_err e;
        spx_err_clear(&e);
        CHECK(j && spx_config_parse(j, strlen(j), s->name, &c, &e) == SPX_OK, "%s: %s", s->name, e.msg);
        free(j);
        CHECK(c.n_layers == s->layers && c.hidden_size == s->hidden && c.vocab_size == s->vocab, "%s: shape", s->name);
        CHECK(c.n_experts == s->experts, "%s: %lld experts, want %lld", s->name, (long long)c.n_experts,
              (long long)s->experts);
        if (s->experts) {
            moe++;
            CHECK(c.moe_top_k == s->top_k && c.moe_intermediate == s->moe_inter && c.moe_norm_topk == !!s->norm_topk,
                  "%s: routing", s->name);
            for (int64_t l = 0; l < c.n_layers; l++) CHECK(c.ffn[l] == SPX_FFN_MOE, "%s: layer %lld", s->name, (long long)l);
        }
        CHECK(spx_synth_find(s->name) == s, "%s: find", s->name);
    }
    CHECK(n >= 8 && moe >= 2, "%d shapes, %d MoE", n, moe);
    CHECK(spx_synth_find("qwen3-30b-a3b") && spx_synth_find("tiny-moe"), "MoE shapes listed");
    CHECK(!spx_synth_find("no-such-shape"), "unknown shape");
}

/* The two writers agree, and the .trdc decodes. */
static void test_write(const char *shape, int64_t want_experts_tensors) {
    const spx_synth_shape *s = spx_synth_find(shape);
    CHECK(s != NULL, "%s", shape);
    if (!s) return;
    char trdc[512], hf[512], st_path[600];
    snprintf(trdc, sizeof trdc, "%s/%s.trdc", tl_tmpdir(), shape);
    snprintf(hf, sizeof hf, "%s/%s-hf", tl_tmpdir(), shape);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", hf);
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_synth_write_trdc(s, trdc, 4, 0.01, 7, 0, NULL, NULL, NULL, &e) == SPX_OK, "%s: %s", shape, e.msg);
    CHECK(spx_synth_write_hf(s, hf, 7, &e) == SPX_OK, "%s: %s", shape, e.msg);
    spx_trdc *f = NULL;
    spx_st *st = NULL;
    CHECK(spx_trdc_open(trdc, &f, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_st_open(st_path, &st, &e) == SPX_OK, "%s", e.msg);
    if (f && st) {
        CHECK(spx_trdc_count(f) == spx_st_count(st), "%s: %zu tensors in the .trdc, %zu in the HF folder", shape,
              spx_trdc_count(f), spx_st_count(st));
        int64_t experts = 0;
        for (size_t i = 0; i < spx_trdc_count(f); i++) {
            const spx_trdc_tensor *t = spx_trdc_at(f, i);
            const spx_st_tensor *h = spx_st_find(st, t->name);
            CHECK(h != NULL, "%s: '%s' not in the HF folder", shape, t->name);
            if (h) {
                int same = h->ndim == t->ndim;
                for (int d = 0; same && d < t->ndim; d++) same = h->shape[d] == t->shape[d];
                CHECK(same, "%s: '%s' shapes differ", shape, t->name);
            }
            experts += strstr(t->name, ".experts.") != NULL;
            /* the router stays float (exact routing); matrices are quantized */
            if (strstr(t->name, "mlp.gate.weight")) CHECK(t->kind == SPX_TRDC_DENSE && t->ndim == 2, "router dense");
        }
        CHECK(experts == want_experts_tensors, "%s: %lld expert matrices, want %lld", shape, (long long)experts,
              (long long)want_experts_tensors);
    }
    if (f) spx_trdc_close(f);
    if (st) spx_st_free(st);
    const char *paths[2] = {trdc, hf};
    for (int k = 0; k < 2; k++) {
        spx_model_params mp = {.n_threads = 1};
        spx_model *m = NULL;
        CHECK(spx_model_open(paths[k], &mp, &m) == SPX_OK, "open %s: %s", paths[k], spx_last_error());
        if (!m) continue;
        const int32_t ids[4] = {1, 17, 42, 99};
        float *lg = tl_decode_steps(m, ids, 4);
        const int64_t V = spx_model_vocab_size(m);
        int finite = lg != NULL;
        for (int64_t i = 0; finite && i < 4 * V; i++) finite = isfinite(lg[i]);
        CHECK(finite, "%s: logits finite", paths[k]);
        free(lg);
        spx_model_free(m);
    }
}

int main(void) {
    test_configs();
    test_write("tiny", 0);
    test_write("tiny-moe", 2 * 8 * 3); /* layers x experts x (gate, up, down) */
    return tl_finish("test_synth");
}
