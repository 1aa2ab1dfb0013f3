/* test_config.c: config.json parsing (both config styles, every supported
 * architecture and RoPE type) and hostile configs/model folders, each of
 * which must fail with a message naming the field or tensor. */
#include "testlib.h"
#include "format/hf_config.h"
#include "model/model.h"
#include "spectra.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static spx_status parse(const char *json, spx_config *c, spx_err *e) {
    spx_err_clear(e);
    return spx_config_parse(json, strlen(json), "config.json", c, e);
}

#define BASE "\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128," \
             "\"intermediate_size\":352,\"num_hidden_layers\":2,\"num_attention_heads\":4,"     \
             "\"num_key_value_heads\":2,\"rms_norm_eps\":1e-5"

static void test_styles(void) {
    spx_config a, b;
    spx_err e;
    /* transformers 5 style vs the older top-level style: same result */
    const char *new_style = "{" BASE ",\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":500000.0,"
                            "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                            "\"original_max_position_embeddings\":256}}";
    const char *old_style = "{" BASE ",\"rope_theta\":500000.0,\"rope_scaling\":{\"type\":\"llama3\","
                            "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                            "\"original_max_position_embeddings\":256}}";
    CHECK(parse(new_style, &a, &e) == SPX_OK, "%s", e.msg);
    CHECK(parse(old_style, &b, &e) == SPX_OK, "%s", e.msg);
    CHECK(a.rope_type == SPX_ROPE_LLAMA3 && b.rope_type == SPX_ROPE_LLAMA3, "rope type");
    CHECK(a.rope_theta == 500000.0 && b.rope_theta == 500000.0, "theta %g %g", a.rope_theta, b.rope_theta);
    CHECK(a.rope_factor == 8 && b.rope_factor == 8 && b.rope_orig_max_pos == 256, "factor");
    float fa[16], fb[16];
    spx_rope_inv_freq(&a, fa);
    spx_rope_inv_freq(&b, fb);
    CHECK(!memcmp(fa, fb, sizeof fa), "inv_freq differs between styles");
    /* llama3 scaling: the highest frequency untouched, the lowest divided by factor */
    spx_config d = a;
    d.rope_type = SPX_ROPE_DEFAULT;
    float fd[16];
    spx_rope_inv_freq(&d, fd);
    CHECK(fa[0] == fd[0], "llama3 keeps high frequencies: %g vs %g", fa[0], fd[0]);
    CHECK(fabsf(fa[15] - fd[15] / 8) <= 1e-6f * fd[15], "llama3 divides low frequencies: %g vs %g", fa[15], fd[15] / 8);
    const char *lin = "{" BASE ",\"rope_theta\":10000,\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4}}";
    CHECK(parse(lin, &a, &e) == SPX_OK && a.rope_type == SPX_ROPE_LINEAR && a.rope_factor == 4, "%s", e.msg);
    spx_rope_inv_freq(&a, fa);
    a.rope_type = SPX_ROPE_DEFAULT;
    spx_rope_inv_freq(&a, fd);
    CHECK(fabsf(fa[3] - fd[3] / 4) <= 1e-7f, "linear rope divides by factor");
    const char *nulls = "{" BASE ",\"rope_theta\":10000,\"rope_scaling\":null,\"head_dim\":null}";
    CHECK(parse(nulls, &a, &e) == SPX_OK && a.head_dim == 32 && a.rope_type == SPX_ROPE_DEFAULT, "%s", e.msg);
    const char *q3 = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128,"
                     "\"intermediate_size\":384,\"num_hidden_layers\":3,\"num_attention_heads\":4,"
                     "\"num_key_value_heads\":2,\"head_dim\":48,\"eos_token_id\":[2,7]}";
    CHECK(parse(q3, &a, &e) == SPX_OK && a.qk_norm && a.head_dim == 48 && a.n_eos == 2 && a.eos_ids[1] == 7, "%s", e.msg);
    const char *q2 = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128,"
                     "\"intermediate_size\":384,\"num_hidden_layers\":3,\"num_attention_heads\":4}";
    CHECK(parse(q2, &a, &e) == SPX_OK && a.qkv_bias && !a.o_bias && a.n_kv_heads == 4, "%s", e.msg);
}

typedef struct { const char *json, *word; } bad_case;

static void test_bad_configs(void) {
    static const bad_case cases[] = {
        {"not json", "JSON"},
        {"[1,2]", "object"},
        {"{}", "architectures"},
        {"{\"architectures\":[\"GPT2LMHeadModel\"]}", "GPT2LMHeadModel"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":128}", "vocab_size"},
        {"{" BASE ",\"hidden_size\":-5}", "hidden_size"},
        {"{" BASE ",\"hidden_size\":1e30}", "hidden_size"},
        {"{" BASE ",\"hidden_size\":12.5}", "hidden_size"},
        {"{" BASE ",\"num_key_value_heads\":3}", "num_key_value_heads"},
        {"{" BASE ",\"num_hidden_layers\":\"two\"}", "num_hidden_layers"},
        {"{" BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", "yarn"},
        {"{" BASE ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}", "low_freq_factor"},
        {"{" BASE ",\"rope_parameters\":[1]}", "rope_parameters"},
        {"{" BASE ",\"hidden_act\":\"gelu\"}", "hidden_act"},
        {"{" BASE ",\"head_dim\":7}", "head_dim"},
        {"{" BASE ",\"tie_word_embeddings\":\"yes\"}", "tie_word_embeddings"},
        {"{" BASE ",\"eos_token_id\":[\"x\"]}", "eos_token_id"},
        {"{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":5,\"hidden_size\":8,\"intermediate_size\":8,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"use_sliding_window\":true}", "use_sliding_window"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        spx_config c;
        spx_err e;
        spx_status st = parse(cases[i].json, &c, &e);
        CHECK(st != SPX_OK, "case %zu accepted: %s", i, cases[i].json);
        CHECK(strstr(e.msg, "config.json") && strstr(e.msg, cases[i].word), "case %zu: message '%s' lacks '%s'", i,
              e.msg, cases[i].word);
    }
    /* deep nesting must not crash */
    size_t n = 200000;
    char *deep = malloc(2 * n + 3);
    memset(deep, '[', n);
    memset(deep + n, ']', n);
    deep[2 * n] = 0;
    spx_config c;
    spx_err e;
    CHECK(parse(deep, &c, &e) != SPX_OK, "deep nesting accepted");
    free(deep);
}

/* A model folder: config + a symlink to real weights. */
static const char *make_dir(const char *name, const char *config, const char *weights) {
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", tl_tmpdir(), name);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && ln -sf '%s' '%s/model.safetensors'", dir, weights, dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", dir);
    tl_write(p, config, strlen(config));
    return dir;
}

static void expect_open_fail(const char *dir, const char *word) {
    spx_model *m = NULL;
    spx_status st = spx_model_open(dir, NULL, &m);
    CHECK(st != SPX_OK && m == NULL, "%s opened", dir);
    CHECK(strstr(spx_last_error(), word) != NULL, "message '%s' lacks '%s'", spx_last_error(), word);
}

static void test_bad_models(void) {
    char w[512];
    snprintf(w, sizeof w, "%s", tl_shared("models/tiny-llama3/model.safetensors"));
    char *cfg = tl_read(tl_shared("models/tiny-llama3/config.json"), NULL);
    CHECK(cfg != NULL, "tiny config");
    if (!cfg) return;
    /* wrong hidden size: a shape mismatch names the tensor */
    char *bad = malloc(strlen(cfg) + 64);
    char *p = strstr(cfg, "\"hidden_size\": 128");
    CHECK(p != NULL, "hidden_size in fixture");
    if (p) {
        memcpy(bad, cfg, (size_t)(p - cfg));
        sprintf(bad + (p - cfg), "\"hidden_size\": 256%s", p + strlen("\"hidden_size\": 128"));
        expect_open_fail(make_dir("shape", bad, w), "model.embed_tokens.weight");
    }
    /* more layers than the checkpoint has: the missing tensor is named */
    p = strstr(cfg, "\"num_hidden_layers\": 3");
    CHECK(p != NULL, "layers in fixture");
    if (p) {
        memcpy(bad, cfg, (size_t)(p - cfg));
        sprintf(bad + (p - cfg), "\"num_hidden_layers\": 4%s", p + strlen("\"num_hidden_layers\": 3"));
        expect_open_fail(make_dir("layers", bad, w), "model.layers.3.");
    }
    free(bad);
    free(cfg);
    /* untied config over tied weights (no lm_head) */
    char *qcfg = tl_read(tl_shared("models/tiny-qwen2/config.json"), NULL);
    char qw[512];
    snprintf(qw, sizeof qw, "%s", tl_shared("models/tiny-qwen2/model.safetensors"));
    if (qcfg) {
        char *t = strstr(qcfg, "\"tie_word_embeddings\": true");
        CHECK(t != NULL, "tie in fixture");
        if (t) {
            memcpy(t, "\"tie_word_embeddings\":false", strlen("\"tie_word_embeddings\":false"));
            expect_open_fail(make_dir("untied", qcfg, qw), "lm_head.weight");
        }
        free(qcfg);
    }
    expect_open_fail(make_dir("notjson", "{oops", w), "config.json");
    expect_open_fail("/nonexistent/model", "/nonexistent/model");
}

static void test_bad_calls(void) {
    spx_model *m = NULL;
    spx_model_params mp = {.n_threads = 2};
    CHECK(spx_model_open(tl_shared("models/tiny-mistral"), &mp, &m) == SPX_OK, "%s", spx_last_error());
    if (!m) return;
    spx_session *s = NULL;
    spx_session_params sp = {.n_ctx = 8};
    CHECK(spx_session_new(m, &sp, &s) == SPX_OK, "session");
    int32_t bad = 512, ok[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK(spx_session_eval(s, &bad, 1, NULL, 0) == SPX_ERR_RANGE, "token id out of range accepted");
    CHECK(strstr(spx_session_error(s), "512") != NULL, "%s", spx_session_error(s));
    CHECK(spx_session_eval(s, ok, 9, NULL, 0) == SPX_ERR_RANGE, "context overflow accepted");
    CHECK(spx_session_eval(s, ok, 8, NULL, 0) == SPX_OK, "%s", spx_session_error(s));
    CHECK(spx_session_eval(s, ok, 1, NULL, 0) == SPX_ERR_RANGE, "full context accepted");
    size_t n = 4;
    int32_t ids[4];
    CHECK(spx_tokenize(m, "hi", 2, 1, ids, &n) == SPX_ERR_ARG, "tokenize without tokenizer");
    spx_session_free(s);
    spx_model_free(m);
}

int main(void) {
    test_styles();
    test_bad_configs();
    test_bad_models();
    test_bad_calls();
    return tl_finish("test_config");
}
