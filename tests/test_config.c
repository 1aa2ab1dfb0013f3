/* test_config.c: config.json parsing (both config styles, every supported
 * architecture and RoPE type, the hybrids' per-layer structure and Mamba-2 /
 * short-conv fields) and hostile configs/model folders, each of which must
 * fail with a message naming the field or tensor. */
#include "testlib.h"
#include "format/hf_config.h"
#include "model/model.h"
#include "spectra.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
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

/* ---- hybrid families: Lfm2, GraniteMoeHybrid (dense), Nemotron-H ---------- */

/* Layer l as two letters: mixer (. none, A attention, C short conv, M
 * Mamba-2) then ffn (. none, S SwiGLU, R ReLU^2), layers space-separated. */
static const char *layers_str(const spx_config *c) {
    static char s[3 * SPX_MAX_LAYERS + 1];
    static const char mk[] = ".ACM", fk[] = ".SR";
    size_t o = 0;
    for (int64_t l = 0; l < c->n_layers && l < SPX_MAX_LAYERS; l++) {
        s[o++] = c->mixer[l] < 4 ? mk[c->mixer[l]] : '?';
        s[o++] = c->ffn[l] < 3 ? fk[c->ffn[l]] : '?';
        s[o++] = ' ';
    }
    s[o ? o - 1 : 0] = 0;
    return s;
}

/* The layers a Nemotron-H hybrid_override_pattern spells, as layers_str. */
static const char *pattern_layers(const char *pat) {
    static char s[3 * SPX_MAX_LAYERS + 1];
    size_t o = 0;
    for (const char *p = pat; *p && o + 3 < sizeof s; p++) {
        const char *k = *p == 'M' ? "M." : *p == '*' ? "A." : *p == '-' ? ".R" : "??";
        s[o++] = k[0], s[o++] = k[1], s[o++] = ' ';
    }
    s[o ? o - 1 : 0] = 0;
    return s;
}

static int feq(double got, double want) { return fabs(got - want) <= 1e-6 * fabs(want); }

/* Appends printf output to a NUL-terminated buffer of cap bytes. */
static void app(char *b, size_t cap, const char *fmt, ...) SPX_PRINTF(3, 4);
static void app(char *b, size_t cap, const char *fmt, ...) {
    size_t n = strlen(b);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b + n, cap - n, fmt, ap);
    va_end(ap);
}

/* A JSON list of n layer-kind names: `other` at the indices in at[], else `dflt`. */
static void kind_list(char *b, size_t cap, int n, const char *dflt, const char *other, const int *at, int nat) {
    app(b, cap, "[");
    for (int l = 0; l < n; l++) {
        int hit = 0;
        for (int i = 0; i < nat; i++) hit |= at[i] == l;
        app(b, cap, "%s\"%s\"", l ? "," : "", hit ? other : dflt);
    }
    app(b, cap, "]");
}

static char *fixture(const char *model) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s/config.json", model);
    char *t = tl_read(tl_shared(rel), NULL);
    CHECK(t != NULL, "fixture %s", rel);
    return t;
}

/* text with its one occurrence of `from` replaced by `to` (malloc'd); NULL
 * (and a failed check) if `from` is not there exactly once, so a changed
 * fixture shows up instead of silently testing nothing. */
static char *subst(const char *text, const char *from, const char *to) {
    const char *p = text ? strstr(text, from) : NULL;
    CHECK(p && !strstr(p + 1, from), "'%s' not exactly once in the fixture", from);
    if (!p || strstr(p + 1, from)) return NULL;
    size_t a = (size_t)(p - text), nf = strlen(from), nt = strlen(to), rest = strlen(p + nf);
    char *r = malloc(a + nt + rest + 1);
    memcpy(r, text, a);
    memcpy(r + a, to, nt);
    memcpy(r + a + nt, p + nf, rest + 1);
    return r;
}

/* subst() of each (from, to) pair in turn; pairs ends with NULL. */
static char *subst_all(const char *text, const char *const *pairs) {
    char *cur = text ? strdup(text) : NULL;
    for (; cur && pairs[0]; pairs += 2) {
        char *next = subst(cur, pairs[0], pairs[1]);
        free(cur);
        cur = next;
    }
    return cur;
}

/* Fields both config styles must agree on. */
static void check_same(const spx_config *a, const spx_config *b, const char *what) {
    CHECK(a->arch == b->arch && a->n_layers == b->n_layers && a->hidden_size == b->hidden_size &&
              a->vocab_size == b->vocab_size && a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
              a->head_dim == b->head_dim && a->intermediate_size == b->intermediate_size &&
              a->max_pos == b->max_pos,
          "%s: shapes differ between styles", what);
    CHECK(!memcmp(a->mixer, b->mixer, sizeof a->mixer) && !memcmp(a->ffn, b->ffn, sizeof a->ffn) &&
              a->n_attn_layers == b->n_attn_layers,
          "%s: layers differ: %s", what, layers_str(a));
    CHECK(a->rope == b->rope && a->rope_theta == b->rope_theta && a->rope_type == b->rope_type &&
              a->attn_scale == b->attn_scale && a->rms_eps == b->rms_eps && a->tie_embeddings == b->tie_embeddings,
          "%s: rope %d/%d theta %g/%g scale %g/%g eps %g/%g tie %d/%d", what, a->rope, b->rope, a->rope_theta,
          b->rope_theta, a->attn_scale, b->attn_scale, a->rms_eps, b->rms_eps, a->tie_embeddings, b->tie_embeddings);
    CHECK(a->conv_kernel == b->conv_kernel && a->ssm_heads == b->ssm_heads && a->ssm_head_dim == b->ssm_head_dim &&
              a->ssm_state == b->ssm_state && a->ssm_groups == b->ssm_groups &&
              a->ssm_conv_kernel == b->ssm_conv_kernel && a->ssm_chunk == b->ssm_chunk &&
              a->ssm_norm_group == b->ssm_norm_group && a->ssm_dt_lo == b->ssm_dt_lo && a->ssm_dt_hi == b->ssm_dt_hi,
          "%s: conv/SSM fields differ between styles", what);
    CHECK(a->gate_up_fused == b->gate_up_fused && a->qk_norm == b->qk_norm && a->embed_mult == b->embed_mult &&
              a->residual_mult == b->residual_mult && a->logits_div == b->logits_div,
          "%s: structure flags differ between styles", what);
}

/* The shared fixtures (transformers 5 configs). */
static void test_hybrid_fixtures(void) {
    spx_config c;
    spx_err e;
    char *t = fixture("tiny-lfm2");
    if (t) {
        CHECK(parse(t, &c, &e) == SPX_OK, "tiny-lfm2: %s", e.msg);
        CHECK(c.arch == SPX_ARCH_LFM2 && !strcmp(c.arch_name, "Lfm2ForCausalLM") && !strcmp(spx_arch_name(c.arch), "lfm2"),
              "arch %d %s", c.arch, c.arch_name);
        CHECK(c.n_layers == 4 && !strcmp(layers_str(&c), "CS AS CS AS"), "tiny-lfm2 layers: %lld '%s'",
              (long long)c.n_layers, layers_str(&c));
        CHECK(c.n_attn_layers == 2, "n_attn_layers %lld", (long long)c.n_attn_layers);
        CHECK(c.rope && c.rope_theta == 1e6 && c.rope_type == SPX_ROPE_DEFAULT, "rope %d theta %g", c.rope, c.rope_theta);
        CHECK(c.head_dim == 32 && feq(c.attn_scale, 1 / sqrt(32.0)), "head_dim %lld scale %g", (long long)c.head_dim,
              c.attn_scale);
        CHECK(c.conv_kernel == 3 && !c.conv_bias, "conv_kernel %lld bias %d", (long long)c.conv_kernel, c.conv_bias);
        CHECK(c.intermediate_size == 384, "intermediate %lld (block_auto_adjust_ff_dim false)", (long long)c.intermediate_size);
        CHECK(c.rms_eps == 1e-5f && c.tie_embeddings && c.qk_norm && !c.gate_up_fused, "eps %g tie %d qk_norm %d", c.rms_eps,
              c.tie_embeddings, c.qk_norm);
        CHECK(c.n_heads == 4 && c.n_kv_heads == 2 && c.vocab_size == 512 && c.bos_id == 1 && c.n_eos == 1 &&
                  c.eos_ids[0] == 2,
              "heads/vocab/ids");
        CHECK(c.embed_mult == 1 && c.residual_mult == 1 && c.logits_div == 1, "multipliers");
        /* the fields are read, not defaulted */
        static const char *const lv[] = {"\"norm_eps\": 1e-05", "\"norm_eps\": 2e-06", "\"conv_L_cache\": 3",
                                         "\"conv_L_cache\": 4", "\"conv_bias\": false", "\"conv_bias\": true",
                                         "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false", NULL};
        char *v = subst_all(t, lv);
        if (v) {
            CHECK(parse(v, &c, &e) == SPX_OK && c.rms_eps == 2e-6f && c.conv_kernel == 4 && c.conv_bias && !c.tie_embeddings,
                  "lfm2 variant: eps %g conv %lld bias %d tie %d %s", c.rms_eps, (long long)c.conv_kernel, c.conv_bias,
                  c.tie_embeddings, e.msg);
            free(v);
        }
        free(t);
    }
    t = fixture("tiny-granite4");
    if (t) {
        CHECK(parse(t, &c, &e) == SPX_OK, "tiny-granite4: %s", e.msg);
        CHECK(c.arch == SPX_ARCH_GRANITE4 && !strcmp(spx_arch_name(c.arch), "granite4"), "arch %d", c.arch);
        CHECK(c.n_layers == 4 && !strcmp(layers_str(&c), "MS AS MS AS"), "tiny-granite4 layers: '%s'", layers_str(&c));
        CHECK(c.n_attn_layers == 2 && c.gate_up_fused, "n_attn %lld fused %d", (long long)c.n_attn_layers, c.gate_up_fused);
        CHECK(c.rope && c.rope_theta == 10000, "rope %d theta %g", c.rope, c.rope_theta);
        CHECK(c.attn_scale == 1.0f, "attn_scale %g (attention_multiplier 1.0, not 1/sqrt(head_dim))", c.attn_scale);
        CHECK(c.ssm_heads == 8 && c.ssm_head_dim == 32 && c.ssm_state == 16 && c.ssm_groups == 1 &&
                  c.ssm_conv_kernel == 4 && c.ssm_chunk == 64,
              "ssm %lld %lld %lld %lld %lld %lld", (long long)c.ssm_heads, (long long)c.ssm_head_dim,
              (long long)c.ssm_state, (long long)c.ssm_groups, (long long)c.ssm_conv_kernel, (long long)c.ssm_chunk);
        CHECK(c.ssm_norm_group == 256, "norm group %lld (one group over d_inner)", (long long)c.ssm_norm_group);
        CHECK(c.ssm_dt_lo == 0 && isinf(c.ssm_dt_hi) && c.ssm_dt_hi > 0, "dt [%g, %g] from [0.0, {__float__: Infinity}]",
              c.ssm_dt_lo, c.ssm_dt_hi);
        CHECK(c.ssm_conv_bias && !c.ssm_proj_bias, "ssm biases %d %d", c.ssm_conv_bias, c.ssm_proj_bias);
        CHECK(c.intermediate_size == 256 && c.rms_eps == 1e-6f && c.tie_embeddings, "I %lld eps %g tie %d",
              (long long)c.intermediate_size, c.rms_eps, c.tie_embeddings);
        CHECK(!c.qkv_bias && !c.o_bias && !c.qk_norm, "attention biases");
        /* the width is shared_intermediate_size, not intermediate_size */
        char *v = subst(t, "\"shared_intermediate_size\": 256", "\"shared_intermediate_size\": 320");
        if (v) {
            CHECK(parse(v, &c, &e) == SPX_OK && c.intermediate_size == 320, "shared_intermediate_size: %lld %s",
                  (long long)c.intermediate_size, e.msg);
            free(v);
        }
        /* the multipliers are read */
        v = subst(t, "\"attention_multiplier\": 1.0", "\"attention_multiplier\": 0.015625");
        char *w = v ? subst(v, "\"embedding_multiplier\": 1.0", "\"embedding_multiplier\": 12") : NULL;
        char *x = w ? subst(w, "\"residual_multiplier\": 1.0", "\"residual_multiplier\": 0.22") : NULL;
        char *y = x ? subst(x, "\"logits_scaling\": 1.0", "\"logits_scaling\": 8") : NULL;
        if (y) {
            CHECK(parse(y, &c, &e) == SPX_OK, "%s", e.msg);
            CHECK(c.attn_scale == 0.015625f && c.embed_mult == 12 && c.residual_mult == 0.22f && c.logits_div == 8,
                  "multipliers %g %g %g %g", c.attn_scale, c.embed_mult, c.residual_mult, c.logits_div);
        }
        free(v), free(w), free(x), free(y);
        static const char *const gv[] = {"\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 3e-06", "\"mamba_d_conv\": 4",
                                         "\"mamba_d_conv\": 3", "\"mamba_conv_bias\": true", "\"mamba_conv_bias\": false",
                                         "\"mamba_proj_bias\": false", "\"mamba_proj_bias\": true",
                                         "\"attention_bias\": false", "\"attention_bias\": true",
                                         "\"mamba_d_state\": 16", "\"mamba_d_state\": 24", NULL};
        v = subst_all(t, gv);
        if (v) {
            CHECK(parse(v, &c, &e) == SPX_OK && c.rms_eps == 3e-6f && c.ssm_conv_kernel == 3 && !c.ssm_conv_bias &&
                      c.ssm_proj_bias && c.qkv_bias && c.o_bias && c.ssm_state == 24,
                  "granite variant: eps %g conv %lld biases %d %d %d state %lld %s", c.rms_eps,
                  (long long)c.ssm_conv_kernel, c.ssm_conv_bias, c.ssm_proj_bias, c.qkv_bias, (long long)c.ssm_state, e.msg);
            free(v);
        }
        free(t);
    }
    t = fixture("tiny-nemotronh");
    if (t) {
        CHECK(parse(t, &c, &e) == SPX_OK, "tiny-nemotronh: %s", e.msg);
        CHECK(c.arch == SPX_ARCH_NEMOTRON_H && !strcmp(spx_arch_name(c.arch), "nemotron_h"), "arch %d", c.arch);
        CHECK(c.n_layers == 4 && !strcmp(layers_str(&c), "M. A. M. .R"), "tiny-nemotronh layers (no num_hidden_layers): "
              "%lld '%s'", (long long)c.n_layers, layers_str(&c));
        CHECK(c.n_attn_layers == 1 && !c.rope, "n_attn %lld rope %d", (long long)c.n_attn_layers, c.rope);
        CHECK(c.head_dim == 32 && feq(c.attn_scale, 1 / sqrt(32.0)), "head_dim %lld scale %g", (long long)c.head_dim,
              c.attn_scale);
        CHECK(c.ssm_heads == 8 && c.ssm_head_dim == 32 && c.ssm_state == 16 && c.ssm_groups == 1 &&
                  c.ssm_conv_kernel == 4 && c.ssm_chunk == 64 && c.ssm_norm_group == 256,
              "ssm %lld %lld %lld %lld %lld %lld %lld", (long long)c.ssm_heads, (long long)c.ssm_head_dim,
              (long long)c.ssm_state, (long long)c.ssm_groups, (long long)c.ssm_conv_kernel, (long long)c.ssm_chunk,
              (long long)c.ssm_norm_group);
        CHECK(c.ssm_dt_lo == 0.001f && isinf(c.ssm_dt_hi) && c.ssm_dt_hi > 0, "dt [%g, %g]: time_step_min, +inf",
              c.ssm_dt_lo, c.ssm_dt_hi);
        CHECK(c.ssm_conv_bias && !c.ssm_proj_bias && !c.mlp_bias, "biases");
        CHECK(c.intermediate_size == 256 && c.rms_eps == 1e-5f && !c.tie_embeddings && c.max_pos == 4096,
              "I %lld eps %g tie %d", (long long)c.intermediate_size, c.rms_eps, c.tie_embeddings);
        CHECK(!c.gate_up_fused && !c.qk_norm, "flags");
        /* dt_lo follows time_step_min, whatever time_step_limit says */
        char *v = subst(t, "\"time_step_min\": 0.001", "\"time_step_min\": 0.002");
        if (v) {
            CHECK(parse(v, &c, &e) == SPX_OK && c.ssm_dt_lo == 0.002f, "dt_lo %g %s", c.ssm_dt_lo, e.msg);
            free(v);
        }
        /* n_groups sets the gated norm's group size (d_inner / groups) */
        v = subst(t, "\"n_groups\": 1", "\"n_groups\": 4");
        if (v) {
            CHECK(parse(v, &c, &e) == SPX_OK && c.ssm_groups == 4 && c.ssm_norm_group == 64, "groups %lld norm %lld %s",
                  (long long)c.ssm_groups, (long long)c.ssm_norm_group, e.msg);
            free(v);
        }
        static const char *const nv[] = {"\"layer_norm_epsilon\": 1e-05", "\"layer_norm_epsilon\": 2e-06",
                                         "\"conv_kernel\": 4", "\"conv_kernel\": 3", "\"use_conv_bias\": true",
                                         "\"use_conv_bias\": false", "\"use_bias\": false", "\"use_bias\": true",
                                         "\"mlp_bias\": false", "\"mlp_bias\": true", "\"head_dim\": 32,",
                                         "\"head_dim\": 64,", NULL};
        v = subst_all(t, nv);
        if (v) {
            CHECK(parse(v, &c, &e) == SPX_OK && c.rms_eps == 2e-6f && c.ssm_conv_kernel == 3 && !c.ssm_conv_bias &&
                      c.ssm_proj_bias && c.mlp_bias && c.head_dim == 64 && feq(c.attn_scale, 0.125),
                  "nemotron variant: eps %g conv %lld biases %d %d %d head_dim %lld %s", c.rms_eps,
                  (long long)c.ssm_conv_kernel, c.ssm_conv_bias, c.ssm_proj_bias, c.mlp_bias, (long long)c.head_dim, e.msg);
            free(v);
        }
        free(t);
    }
}

/* Older-style configs as published (LiquidAI/LFM2-1.2B,
 * ibm-granite/granite-4.0-h-micro, nvidia/Nemotron-H-8B-Base), each
 * checked against the transformers-5 spelling of the same model. */
static void test_hybrid_old_styles(void) {
    spx_config a, b;
    spx_err e;
    /* LFM2-1.2B: block_ff_dim adjusted to 8192, full_attn_idxs, tie_embedding, top-level rope_theta */
    const char *lfm2_old =
        "{\"architectures\":[\"Lfm2ForCausalLM\"],\"block_auto_adjust_ff_dim\":true,\"block_dim\":2048,"
        "\"block_ff_dim\":12288,\"block_ffn_dim_multiplier\":1.0,\"block_mlp_init_scale\":1.0,\"block_multiple_of\":256,"
        "\"block_norm_eps\":1e-05,\"block_out_init_scale\":1.0,\"block_use_swiglu\":true,\"block_use_xavier_init\":true,"
        "\"bos_token_id\":1,\"conv_L_cache\":3,\"conv_bias\":false,\"conv_dim\":2048,\"conv_dim_out\":2048,"
        "\"conv_use_xavier_init\":true,\"eos_token_id\":7,\"full_attn_idxs\":[2,5,8,10,12,14],\"hidden_size\":2048,"
        "\"initializer_range\":0.02,\"max_position_embeddings\":128000,\"model_type\":\"lfm2\",\"norm_eps\":1e-05,"
        "\"num_attention_heads\":32,\"num_heads\":32,\"num_hidden_layers\":16,\"num_key_value_heads\":8,"
        "\"pad_token_id\":0,\"rope_theta\":1000000.0,\"tie_embedding\":true,"
        "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.54.0.dev0\",\"use_cache\":true,"
        "\"use_pos_enc\":true,\"vocab_size\":65536}";
    CHECK(parse(lfm2_old, &a, &e) == SPX_OK, "LFM2-1.2B: %s", e.msg);
    CHECK(a.arch == SPX_ARCH_LFM2 && a.n_layers == 16 &&
              !strcmp(layers_str(&a), "CS CS AS CS CS AS CS CS AS CS AS CS AS CS AS CS"),
          "LFM2-1.2B layers '%s'", layers_str(&a));
    CHECK(a.n_attn_layers == 6, "n_attn %lld", (long long)a.n_attn_layers);
    CHECK(a.intermediate_size == 8192, "adjusted ff width %lld, want 8192", (long long)a.intermediate_size);
    CHECK(a.rope && a.rope_theta == 1e6 && a.head_dim == 64 && a.attn_scale == 0.125f && a.rms_eps == 1e-5f,
          "theta %g head_dim %lld scale %g eps %g", a.rope_theta, (long long)a.head_dim, a.attn_scale, a.rms_eps);
    CHECK(a.tie_embeddings && a.conv_kernel == 3 && a.n_kv_heads == 8 && a.max_pos == 128000 && a.eos_ids[0] == 7,
          "tie %d conv %lld", a.tie_embeddings, (long long)a.conv_kernel);
    /* the same model as transformers 5 writes it */
    const char *lfm2_new =
        "{\"architectures\":[\"Lfm2ForCausalLM\"],\"block_auto_adjust_ff_dim\":true,\"block_ffn_dim_multiplier\":1.0,"
        "\"block_multiple_of\":256,\"bos_token_id\":1,\"conv_L_cache\":3,\"conv_bias\":false,\"dtype\":\"bfloat16\","
        "\"eos_token_id\":7,\"full_attn_idxs\":null,\"hidden_size\":2048,\"intermediate_size\":12288,"
        "\"layer_types\":[\"conv\",\"conv\",\"full_attention\",\"conv\",\"conv\",\"full_attention\",\"conv\",\"conv\","
        "\"full_attention\",\"conv\",\"full_attention\",\"conv\",\"full_attention\",\"conv\",\"full_attention\",\"conv\"],"
        "\"max_position_embeddings\":128000,\"model_type\":\"lfm2\",\"norm_eps\":1e-05,\"num_attention_heads\":32,"
        "\"num_hidden_layers\":16,\"num_key_value_heads\":8,\"pad_token_id\":0,"
        "\"rope_parameters\":{\"rope_theta\":1000000.0,\"rope_type\":\"default\"},\"tie_word_embeddings\":true,"
        "\"vocab_size\":65536}";
    CHECK(parse(lfm2_new, &b, &e) == SPX_OK, "LFM2-1.2B (transformers 5): %s", e.msg);
    check_same(&a, &b, "LFM2-1.2B");

#define LFM2_SMALL "\"architectures\":[\"Lfm2ForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128," \
                   "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2"
    /* the adjustment: int(2 ff / 3), times the multiplier, rounded up to multiple_of */
    static const struct { const char *json; int64_t want; } ff[] = {
        {"{" LFM2_SMALL ",\"full_attn_idxs\":[1],\"block_ff_dim\":12288,\"block_auto_adjust_ff_dim\":true,"
         "\"block_ffn_dim_multiplier\":1.0,\"block_multiple_of\":256}", 8192},
        {"{" LFM2_SMALL ",\"full_attn_idxs\":[1],\"block_ff_dim\":10000,\"block_auto_adjust_ff_dim\":true,"
         "\"block_ffn_dim_multiplier\":1.3,\"block_multiple_of\":256}", 8704},  /* 6666 -> 8665 -> 8704 */
        {"{" LFM2_SMALL ",\"full_attn_idxs\":[1],\"block_ff_dim\":1000,\"block_auto_adjust_ff_dim\":true,"
         "\"block_ffn_dim_multiplier\":null,\"block_multiple_of\":100}", 700},   /* 666 -> 700 */
        {"{" LFM2_SMALL ",\"full_attn_idxs\":[1],\"block_ff_dim\":12288,\"block_auto_adjust_ff_dim\":false,"
         "\"block_ffn_dim_multiplier\":1.0,\"block_multiple_of\":256}", 12288},
        /* Lfm2Config adjusts by default, multiple_of 256 */
        {"{" LFM2_SMALL ",\"full_attn_idxs\":[1],\"block_ff_dim\":12288}", 8192},
        {"{" LFM2_SMALL ",\"full_attn_idxs\":[1],\"intermediate_size\":600,\"block_auto_adjust_ff_dim\":true,"
         "\"block_multiple_of\":64}", 448},                                      /* 400 -> 448 */
    };
    for (size_t i = 0; i < sizeof ff / sizeof ff[0]; i++) {
        CHECK(parse(ff[i].json, &a, &e) == SPX_OK && a.intermediate_size == ff[i].want, "ff case %zu: %lld, want %lld %s",
              i, (long long)a.intermediate_size, (long long)ff[i].want, e.msg);
    }
    /* tie spellings; transformers ties LFM2 by default; default theta 1e6 */
    CHECK(parse("{" LFM2_SMALL ",\"full_attn_idxs\":[1],\"intermediate_size\":256,\"block_auto_adjust_ff_dim\":false,"
                "\"tie_embedding\":false}", &a, &e) == SPX_OK && !a.tie_embeddings, "tie_embedding false: %s", e.msg);
    CHECK(parse("{" LFM2_SMALL ",\"full_attn_idxs\":[1],\"intermediate_size\":256,\"block_auto_adjust_ff_dim\":false}",
                &a, &e) == SPX_OK && a.tie_embeddings && a.rope_theta == 1e6 && a.conv_kernel == 3 &&
              !strcmp(layers_str(&a), "CS AS CS CS"),
          "LFM2 defaults: tie %d theta %g conv %lld '%s' %s", a.tie_embeddings, a.rope_theta, (long long)a.conv_kernel,
          layers_str(&a), e.msg);

    /* Lfm2Config's precedence: theta over rope_theta, block_ff_dim over
     * intermediate_size, tie_embedding over tie_word_embeddings; neither
     * layer_types nor full_attn_idxs: every layer attends */
    CHECK(parse("{" LFM2_SMALL ",\"full_attn_idxs\":[1],\"rope_theta\":10000,\"theta\":250000,\"block_ff_dim\":512,"
                "\"intermediate_size\":256,\"block_auto_adjust_ff_dim\":false,\"tie_word_embeddings\":true,"
                "\"tie_embedding\":false}", &a, &e) == SPX_OK && a.rope_theta == 250000 && a.intermediate_size == 512 &&
              !a.tie_embeddings,
          "LFM2 precedence: theta %g ff %lld tie %d %s", a.rope_theta, (long long)a.intermediate_size, a.tie_embeddings,
          e.msg);
    CHECK(parse("{" LFM2_SMALL ",\"intermediate_size\":256,\"block_auto_adjust_ff_dim\":false}", &a, &e) == SPX_OK &&
              !strcmp(layers_str(&a), "AS AS AS AS") && a.n_attn_layers == 4,
          "LFM2 without a layer list: '%s' %s", layers_str(&a), e.msg);

    /* granite-4.0-h-micro: 40 layers, "mamba"/"attention", NoPE, muP multipliers, top-level rope_theta */
    static const int g_attn[] = {9, 17, 27, 35};
    char gl[4096] = "";
    kind_list(gl, sizeof gl, 40, "mamba", "attention", g_attn, 4);
    char g_old[8192] = "";
    app(g_old, sizeof g_old,
        "{\"architectures\":[\"GraniteMoeHybridForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
        "\"attention_multiplier\":0.015625,\"bos_token_id\":100257,\"embedding_multiplier\":12,"
        "\"eos_token_id\":100257,\"hidden_act\":\"silu\",\"hidden_size\":2048,\"init_method\":\"mup\","
        "\"initializer_range\":0.1,\"intermediate_size\":8192,\"layer_types\":%s,\"logits_scaling\":8,"
        "\"mamba_chunk_size\":256,\"mamba_conv_bias\":true,\"mamba_d_conv\":4,\"mamba_d_head\":64,"
        "\"mamba_d_state\":128,\"mamba_expand\":2,\"mamba_n_groups\":1,\"mamba_n_heads\":64,\"mamba_proj_bias\":false,"
        "\"max_position_embeddings\":131072,\"model_type\":\"granitemoehybrid\",\"normalization_function\":\"rmsnorm\","
        "\"num_attention_heads\":32,\"num_experts_per_tok\":0,\"num_hidden_layers\":40,\"num_key_value_heads\":8,"
        "\"num_local_experts\":0,\"output_router_logits\":false,\"pad_token_id\":100256,"
        "\"position_embedding_type\":\"nope\",\"residual_multiplier\":0.22,\"rms_norm_eps\":1e-05,"
        "\"rope_scaling\":null,\"rope_theta\":10000,\"router_aux_loss_coef\":0.01,\"shared_intermediate_size\":8192,"
        "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.56.0\","
        "\"use_cache\":true,\"vocab_size\":100352}", gl);
    CHECK(parse(g_old, &a, &e) == SPX_OK, "granite-4.0-h-micro: %s", e.msg);
    char want[3 * SPX_MAX_LAYERS + 1] = "";
    for (int l = 0; l < 40; l++) app(want, sizeof want, "%s%s", l ? " " : "", l == 9 || l == 17 || l == 27 || l == 35 ? "AS" : "MS");
    CHECK(a.arch == SPX_ARCH_GRANITE4 && a.n_layers == 40 && !strcmp(layers_str(&a), want), "h-micro layers '%s'",
          layers_str(&a));
    CHECK(a.n_attn_layers == 4 && !a.rope && a.gate_up_fused, "n_attn %lld rope %d", (long long)a.n_attn_layers, a.rope);
    CHECK(a.attn_scale == 0.015625f && a.embed_mult == 12 && a.residual_mult == 0.22f && a.logits_div == 8,
          "multipliers %g %g %g %g", a.attn_scale, a.embed_mult, a.residual_mult, a.logits_div);
    CHECK(a.ssm_heads == 64 && a.ssm_head_dim == 64 && a.ssm_state == 128 && a.ssm_groups == 1 && a.ssm_chunk == 256 &&
              a.ssm_conv_kernel == 4 && a.ssm_norm_group == 4096,
          "h-micro ssm");
    CHECK(a.ssm_dt_lo == 0 && isinf(a.ssm_dt_hi), "no time_step_limit: dt [%g, %g]", a.ssm_dt_lo, a.ssm_dt_hi);
    CHECK(a.intermediate_size == 8192 && a.rms_eps == 1e-5f && a.tie_embeddings && a.head_dim == 64 && a.n_kv_heads == 8 &&
              a.bos_id == 100257,
          "h-micro I %lld eps %g", (long long)a.intermediate_size, a.rms_eps);
    /* older attribute name layers_block_type, and the transformers-5 kind names */
    char g_alias[8192] = "";
    char *lt = strstr(g_old, "\"layer_types\":");
    CHECK(lt != NULL, "layer_types in the h-micro text");
    if (lt) {
        app(g_alias, sizeof g_alias, "%.*s\"layers_block_type\":%s", (int)(lt - g_old), g_old, lt + strlen("\"layer_types\":"));
        CHECK(parse(g_alias, &b, &e) == SPX_OK, "layers_block_type: %s", e.msg);
        check_same(&a, &b, "granite layers_block_type");
    }
    gl[0] = 0;
    kind_list(gl, sizeof gl, 40, "linear_attention", "full_attention", g_attn, 4);
    char g_new[8192] = "";
    app(g_new, sizeof g_new,
        "{\"architectures\":[\"GraniteMoeHybridForCausalLM\"],\"attention_bias\":false,\"attention_multiplier\":0.015625,"
        "\"bos_token_id\":100257,\"dtype\":\"bfloat16\",\"embedding_multiplier\":12,\"eos_token_id\":100257,"
        "\"hidden_act\":\"silu\",\"hidden_size\":2048,\"intermediate_size\":8192,\"layer_types\":%s,"
        "\"logits_scaling\":8,\"mamba_chunk_size\":256,\"mamba_conv_bias\":true,\"mamba_d_conv\":4,\"mamba_d_head\":64,"
        "\"mamba_d_state\":128,\"mamba_expand\":2,\"mamba_n_groups\":1,\"mamba_n_heads\":64,\"mamba_proj_bias\":false,"
        "\"max_position_embeddings\":131072,\"num_attention_heads\":32,\"num_hidden_layers\":40,"
        "\"num_key_value_heads\":8,\"num_local_experts\":0,\"position_embedding_type\":\"nope\","
        "\"residual_multiplier\":0.22,\"rms_norm_eps\":1e-05,\"rope_parameters\":{\"rope_theta\":10000.0,"
        "\"rope_type\":\"default\"},\"shared_intermediate_size\":8192,\"tie_word_embeddings\":true,"
        "\"time_step_limit\":[0.0,{\"__float__\":\"Infinity\"}],\"vocab_size\":100352}", gl);
    CHECK(parse(g_new, &b, &e) == SPX_OK, "h-micro (transformers 5): %s", e.msg);
    check_same(&a, &b, "granite-4.0-h-micro");

#define GRANITE_SMALL "\"architectures\":[\"GraniteMoeHybridForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128," \
                      "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"            \
                      "\"num_local_experts\":0,\"shared_intermediate_size\":256,\"mamba_n_heads\":8,\"mamba_d_head\":32,\"mamba_d_state\":16"
#define GRANITE_KINDS ",\"layer_types\":[\"mamba\",\"attention\",\"mamba\",\"attention\"]"
    /* no num_local_experts: transformers' defaults, 8 routed experts of
     * width 1024, top 2, beside the shared MLP, in every layer */
    CHECK(parse("{\"architectures\":[\"GraniteMoeHybridForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128,"
                "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"shared_intermediate_size\":256,\"mamba_n_heads\":8,"
                "\"mamba_d_head\":32,\"mamba_d_state\":16}", &a, &e) == SPX_OK &&
              a.n_experts == 8 && a.moe_top_k == 2 && a.moe_intermediate == 1024 && a.moe_shared && a.moe_norm_topk &&
              a.intermediate_size == 256 && a.ffn[0] == SPX_FFN_MOE && a.ffn[3] == SPX_FFN_MOE,
          "granite without num_local_experts: %s", e.msg);
    /* transformers' defaults: NoPE unless position_embedding_type is "rope",
     * scale = attention_multiplier (1.0), no layer list: all Mamba */
    CHECK(parse("{" GRANITE_SMALL GRANITE_KINDS "}", &a, &e) == SPX_OK, "%s", e.msg);
    CHECK(!a.rope && a.attn_scale == 1.0f && a.rms_eps == 1e-6f && !a.tie_embeddings && a.ssm_groups == 1 &&
              a.ssm_conv_kernel == 4 && a.ssm_chunk == 256 && a.ssm_conv_bias && !a.ssm_proj_bias,
          "granite defaults: rope %d scale %g eps %g", a.rope, a.attn_scale, a.rms_eps);
    CHECK(parse("{" GRANITE_SMALL "}", &a, &e) == SPX_OK && !strcmp(layers_str(&a), "MS MS MS MS") &&
              a.n_attn_layers == 0,
          "no layer_types: '%s' %s", layers_str(&a), e.msg);
    CHECK(parse("{" GRANITE_SMALL GRANITE_KINDS ",\"position_embedding_type\":\"rope\",\"rope_theta\":5e5}", &a, &e) ==
                  SPX_OK && a.rope && a.rope_theta == 5e5,
          "rope %d theta %g %s", a.rope, a.rope_theta, e.msg);
    /* a bare Infinity (Python's json.dumps) and finite limits */
    CHECK(parse("{" GRANITE_SMALL GRANITE_KINDS ",\"time_step_limit\":[0.0, Infinity]}", &a, &e) == SPX_OK &&
              a.ssm_dt_lo == 0 && isinf(a.ssm_dt_hi) && a.ssm_dt_hi > 0,
          "bare Infinity: [%g, %g] %s", a.ssm_dt_lo, a.ssm_dt_hi, e.msg);
    CHECK(parse("{" GRANITE_SMALL GRANITE_KINDS ",\"time_step_limit\":[0.001,0.1]}", &a, &e) == SPX_OK &&
              a.ssm_dt_lo == 0.001f && a.ssm_dt_hi == 0.1f,
          "finite limit: [%g, %g] %s", a.ssm_dt_lo, a.ssm_dt_hi, e.msg);
    /* a string before the Infinity that ends in an escaped backslash */
    CHECK(parse("{\"_comment\":\"C:\\\\\"," GRANITE_SMALL GRANITE_KINDS ",\"time_step_limit\":[0.0,Infinity]}", &a, &e) ==
                  SPX_OK && isinf(a.ssm_dt_hi),
          "Infinity after an escaped backslash: %s", e.msg);

    /* Nemotron-H-8B-Base: hybrid_override_pattern, num_hidden_layers, attention_head_dim, bare Infinity */
    const char *pat = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";
    char n_old[8192] = "";
    app(n_old, sizeof n_old,
        "{\"architectures\":[\"NemotronHForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
        "\"attention_head_dim\":128,\"bos_token_id\":1,\"chunk_size\":128,\"conv_kernel\":4,\"eos_token_id\":2,"
        "\"expand\":2,\"hidden_dropout\":0.0,\"hidden_size\":4096,\"hybrid_override_pattern\":\"%s\","
        "\"initializer_range\":0.02,\"intermediate_size\":21504,\"layer_norm_epsilon\":1e-05,\"mamba_head_dim\":64,"
        "\"mamba_hidden_act\":\"silu\",\"mamba_num_heads\":128,\"mamba_proj_bias\":false,"
        "\"max_position_embeddings\":8192,\"mlp_bias\":false,\"mlp_hidden_act\":\"relu2\",\"model_type\":\"nemotron_h\","
        "\"n_groups\":8,\"num_attention_heads\":32,\"num_hidden_layers\":52,\"num_key_value_heads\":8,"
        "\"num_logits_to_keep\":1,\"pad_token_id\":0,\"rescale_prenorm_residual\":true,\"residual_in_fp32\":false,"
        "\"rms_norm_eps\":1e-05,\"sliding_window\":null,\"ssm_state_size\":128,\"tie_word_embeddings\":false,"
        "\"time_step_floor\":0.0001,\"time_step_limit\":[0.0, Infinity],\"time_step_max\":0.1,\"time_step_min\":0.001,"
        "\"time_step_rank\":256,\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.48.0.dev0\","
        "\"use_bias\":false,\"use_cache\":true,\"use_conv_bias\":true,\"use_mamba_kernels\":true,"
        "\"vocab_size\":131072}", pat);
    CHECK(parse(n_old, &a, &e) == SPX_OK, "Nemotron-H-8B-Base: %s", e.msg);
    snprintf(want, sizeof want, "%s", pattern_layers(pat));
    CHECK(a.arch == SPX_ARCH_NEMOTRON_H && a.n_layers == 52 && !strcmp(layers_str(&a), want), "8B layers '%s'",
          layers_str(&a));
    CHECK(a.n_attn_layers == 4 && !a.rope && a.head_dim == 128 && feq(a.attn_scale, 1 / sqrt(128.0)),
          "n_attn %lld rope %d head_dim %lld scale %g", (long long)a.n_attn_layers, a.rope, (long long)a.head_dim,
          a.attn_scale);
    CHECK(a.ssm_heads == 128 && a.ssm_head_dim == 64 && a.ssm_state == 128 && a.ssm_groups == 8 && a.ssm_chunk == 128 &&
              a.ssm_conv_kernel == 4 && a.ssm_norm_group == 1024,
          "8B ssm groups %lld norm %lld", (long long)a.ssm_groups, (long long)a.ssm_norm_group);
    CHECK(a.ssm_dt_lo == 0.001f && isinf(a.ssm_dt_hi) && a.ssm_dt_hi > 0, "8B dt [%g, %g]", a.ssm_dt_lo, a.ssm_dt_hi);
    CHECK(a.intermediate_size == 21504 && a.rms_eps == 1e-5f && !a.tie_embeddings && a.max_pos == 8192 &&
              a.n_kv_heads == 8 && a.vocab_size == 131072,
          "8B I %lld eps %g tie %d", (long long)a.intermediate_size, a.rms_eps, a.tie_embeddings);
    /* transformers 5 spelling: layers_block_type gives the count, head_dim, {"__float__": "Infinity"} */
    char nl[4096] = "[";
    for (const char *p = pat; *p; p++)
        app(nl, sizeof nl, "%s\"%s\"", p == pat ? "" : ",",
            *p == 'M' ? "linear_attention" : *p == '*' ? "full_attention" : "mlp");
    app(nl, sizeof nl, "]");
    char n_new[8192] = "";
    app(n_new, sizeof n_new,
        "{\"architectures\":[\"NemotronHForCausalLM\"],\"attention_bias\":false,\"bos_token_id\":1,\"chunk_size\":128,"
        "\"conv_kernel\":4,\"dtype\":\"bfloat16\",\"eos_token_id\":2,\"expand\":2,\"head_dim\":128,"
        "\"hidden_size\":4096,\"intermediate_size\":21504,\"layer_norm_epsilon\":1e-05,\"layers_block_type\":%s,"
        "\"mamba_head_dim\":64,\"mamba_hidden_act\":\"silu\",\"mamba_num_heads\":128,\"mamba_proj_bias\":false,"
        "\"max_position_embeddings\":8192,\"mlp_bias\":false,\"mlp_hidden_act\":\"relu2\",\"n_groups\":8,"
        "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"ssm_state_size\":128,\"tie_word_embeddings\":false,"
        "\"time_step_limit\":[0.0,{\"__float__\":\"Infinity\"}],\"time_step_min\":0.001,\"use_bias\":false,"
        "\"use_conv_bias\":true,\"vocab_size\":131072}", nl);
    CHECK(parse(n_new, &b, &e) == SPX_OK, "Nemotron-H-8B (transformers 5): %s", e.msg);
    check_same(&a, &b, "Nemotron-H-8B-Base");

#define NEMO_SMALL "\"architectures\":[\"NemotronHForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128," \
                   "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"intermediate_size\":256," \
                   "\"mamba_num_heads\":8,\"mamba_head_dim\":32,\"ssm_state_size\":16"
    /* a short pattern: the count from the pattern, or num_hidden_layers agreeing with it */
    CHECK(parse("{" NEMO_SMALL ",\"hybrid_override_pattern\":\"M-M*-\"}", &a, &e) == SPX_OK && a.n_layers == 5 &&
              !strcmp(layers_str(&a), "M. .R M. A. .R") && a.n_attn_layers == 1,
          "M-M*-: %lld '%s' %s", (long long)a.n_layers, layers_str(&a), e.msg);
    CHECK(parse("{" NEMO_SMALL ",\"num_hidden_layers\":5,\"hybrid_override_pattern\":\"M-M*-\","
                "\"time_step_limit\":[0.0, Infinity]}", &b, &e) == SPX_OK,
          "M-M*- with num_hidden_layers: %s", e.msg);
    check_same(&a, &b, "M-M*-");
    /* NemotronHConfig's defaults: time_step_min 0.001, layer_norm_epsilon 1e-5 */
    CHECK(a.ssm_dt_lo == 0.001f && isinf(a.ssm_dt_hi) && a.rms_eps == 1e-5f && a.ssm_conv_bias && !a.ssm_proj_bias,
          "nemotron defaults: dt [%g, %g] eps %g", a.ssm_dt_lo, a.ssm_dt_hi, a.rms_eps);
    /* the older kind names map the same */
    CHECK(parse("{" NEMO_SMALL ",\"layers_block_type\":[\"mamba\",\"mlp\",\"mamba\",\"attention\",\"mlp\"]}", &b, &e) ==
              SPX_OK, "older kind names: %s", e.msg);
    check_same(&a, &b, "mamba/attention/mlp");
    /* the older attention_head_dim, where it differs from hidden / heads */
    CHECK(parse("{\"architectures\":[\"NemotronHForCausalLM\"],\"vocab_size\":512,\"hidden_size\":96,"
                "\"num_attention_heads\":4,\"attention_head_dim\":32,\"intermediate_size\":256,"
                "\"hybrid_override_pattern\":\"*-\"}", &a, &e) == SPX_OK && a.head_dim == 32 &&
              feq(a.attn_scale, 1 / sqrt(32.0)),
          "attention_head_dim: %lld %g %s", (long long)a.head_dim, a.attn_scale, e.msg);
    /* NemotronHConfig: the layer list gives the count even where num_hidden_layers says otherwise */
    CHECK(parse("{" NEMO_SMALL ",\"num_hidden_layers\":5,\"layers_block_type\":[\"mamba\",\"attention\",\"mlp\",\"mamba\"]}",
                &a, &e) == SPX_OK && a.n_layers == 4 && !strcmp(layers_str(&a), "M. A. .R M."),
          "list over num_hidden_layers: %lld '%s' %s", (long long)a.n_layers, layers_str(&a), e.msg);
    CHECK(parse("{" NEMO_SMALL ",\"num_hidden_layers\":6,\"hybrid_override_pattern\":\"M-M*-\"}", &a, &e) == SPX_OK &&
              a.n_layers == 5,
          "pattern over num_hidden_layers: %lld %s", (long long)a.n_layers, e.msg);
    /* layer_types, NemotronHConfig's attribute alias of layers_block_type */
    CHECK(parse("{" NEMO_SMALL ",\"layer_types\":[\"mamba\",\"mlp\",\"full_attention\"]}", &a, &e) == SPX_OK &&
              !strcmp(layers_str(&a), "M. .R A."),
          "layer_types alias: '%s' %s", layers_str(&a), e.msg);
    /* the older mamba_* names, preferred by NemotronHConfig when given */
    CHECK(parse("{" NEMO_SMALL ",\"hybrid_override_pattern\":\"M-\",\"n_groups\":2,\"mamba_n_groups\":4,"
                "\"conv_kernel\":4,\"mamba_d_conv\":3,\"chunk_size\":128,\"mamba_chunk_size\":32,"
                "\"time_step_min\":0.001,\"mamba_dt_min\":0.004,\"use_conv_bias\":true,\"mamba_conv_bias\":false}",
                &a, &e) == SPX_OK && a.ssm_groups == 4 && a.ssm_conv_kernel == 3 && a.ssm_chunk == 32 &&
              a.ssm_dt_lo == 0.004f && !a.ssm_conv_bias && a.ssm_norm_group == 64,
          "mamba_* aliases: groups %lld conv %lld chunk %lld dt %g bias %d %s", (long long)a.ssm_groups,
          (long long)a.ssm_conv_kernel, (long long)a.ssm_chunk, a.ssm_dt_lo, a.ssm_conv_bias, e.msg);
    /* attention-only and MLP-only models need no Mamba fields */
    CHECK(parse("{\"architectures\":[\"NemotronHForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128,"
                "\"num_attention_heads\":4,\"intermediate_size\":256,\"hybrid_override_pattern\":\"*-*-\"}", &a, &e) ==
                  SPX_OK && !strcmp(layers_str(&a), "A. .R A. .R"),
          "no Mamba layers: '%s' %s", layers_str(&a), e.msg);

    /* the Infinity rewrite leaves strings alone */
    CHECK(parse("{\"architectures\":[\"Infinity\"]}", &a, &e) == SPX_ERR_UNSUPPORTED &&
              strstr(e.msg, "'Infinity'") && !strstr(e.msg, "1e999"),
          "string 'Infinity' altered: %s", e.msg);
    CHECK(parse("{\"architectures\":[\"x\\\"Infinity\"]}", &a, &e) == SPX_ERR_UNSUPPORTED &&
              strstr(e.msg, "'x\"Infinity'"),
          "escaped quote then Infinity: %s", e.msg);
    CHECK(parse("{" NEMO_SMALL ",\"time_step_limit\":[0.0,Infinity],"
                "\"layers_block_type\":[\"mamba\",\"Infinity\"]}", &a, &e) == SPX_ERR_UNSUPPORTED &&
              strstr(e.msg, "'layers_block_type[1]' is 'Infinity'"),
          "bare and quoted Infinity in one config: %s", e.msg);
}

typedef struct { const char *json; spx_status code; const char *w1, *w2; } bad_hybrid;

static void expect_err(const char *what, const char *json, spx_status code, const char *w1, const char *w2) {
    spx_config c;
    spx_err e;
    spx_status st = parse(json, &c, &e);
    CHECK(st == code, "%s: status %d, want %d (%s)", what, (int)st, (int)code, e.msg);
    CHECK(strstr(e.msg, "config.json") && strstr(e.msg, w1) && (!w2 || strstr(e.msg, w2)),
          "%s: message '%s' lacks '%s' / '%s'", what, e.msg, w1, w2 ? w2 : "");
}

static void test_hybrid_errors(void) {
    static const bad_hybrid cases[] = {
        /* mixture-of-experts blocks */
        {"{" NEMO_SMALL ",\"hybrid_override_pattern\":\"M-E*\"}", SPX_ERR_UNSUPPORTED, "'hybrid_override_pattern'[2] is 'E'", "mixture-of-experts"},
        {"{" NEMO_SMALL ",\"layers_block_type\":[\"mamba\",\"moe\",\"attention\"]}", SPX_ERR_UNSUPPORTED, "'layers_block_type[1]' is 'moe'", "mixture-of-experts"},
        {"{" NEMO_SMALL ",\"hybrid_override_pattern\":\"M-X*\"}", SPX_ERR_FORMAT, "hybrid_override_pattern", "'X'"},
        {"{\"architectures\":[\"GraniteMoeHybridForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128,\"num_hidden_layers\":4,"
         "\"num_attention_heads\":4,\"num_local_experts\":4,\"num_experts_per_tok\":5,\"shared_intermediate_size\":256}",
         SPX_ERR_FORMAT, "num_experts_per_tok", "1..4"},
        {"{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128,\"num_hidden_layers\":4,"
         "\"num_attention_heads\":4,\"intermediate_size\":256,\"num_experts\":8,\"mlp_only_layers\":[4]}",
         SPX_ERR_FORMAT, "mlp_only_layers", "below 4"},
        /* unknown layer kinds list the supported names */
        {"{" LFM2_SMALL ",\"intermediate_size\":256,\"layer_types\":[\"conv\",\"sliding_attention\",\"conv\",\"conv\"]}",
         SPX_ERR_UNSUPPORTED, "'layer_types[1]' is 'sliding_attention'", "supported: conv, full_attention"},
        {"{" LFM2_SMALL ",\"intermediate_size\":256,\"layer_types\":[\"conv\",\"conv\",7,\"conv\"]}",
         SPX_ERR_UNSUPPORTED, "'layer_types[2]'", "supported: conv, full_attention"},
        {"{" GRANITE_SMALL ",\"layer_types\":[\"mamba\",\"mamba2\",\"mamba\",\"attention\"]}", SPX_ERR_UNSUPPORTED,
         "'layer_types[1]' is 'mamba2'", "supported: mamba, linear_attention, attention, full_attention"},
        {"{" NEMO_SMALL ",\"layers_block_type\":[\"mamba\",\"ssm\"]}", SPX_ERR_UNSUPPORTED, "'layers_block_type[1]' is 'ssm'",
         "supported: mamba, linear_attention, attention, full_attention, mlp"},
        /* layer lists of the wrong length */
        {"{" LFM2_SMALL ",\"intermediate_size\":256,\"layer_types\":[\"conv\",\"full_attention\",\"conv\"]}",
         SPX_ERR_FORMAT, "'layer_types' must be a list of 4", NULL},
        {"{" GRANITE_SMALL ",\"layers_block_type\":[\"mamba\",\"attention\",\"mamba\",\"attention\",\"mamba\"]}",
         SPX_ERR_FORMAT, "'layers_block_type' must be a list of 4", NULL},
        {"{" GRANITE_SMALL ",\"layer_types\":\"mamba\"}", SPX_ERR_FORMAT, "'layer_types' must be a list", NULL},
        {"{" NEMO_SMALL ",\"num_hidden_layers\":4}", SPX_ERR_FORMAT, "layers_block_type", "hybrid_override_pattern"},
        {"{" NEMO_SMALL "}", SPX_ERR_FORMAT, "num_hidden_layers", NULL},
        /* Mamba-2 shapes */
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"mamba_expand\":3}", SPX_ERR_FORMAT, "mamba_expand * hidden_size (384)",
         "mamba_n_heads * mamba_d_head (256)"},
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"mamba_n_groups\":3}", SPX_ERR_FORMAT, "'mamba_n_heads' 8",
         "'mamba_n_groups' 3"},
        {"{" NEMO_SMALL ",\"hybrid_override_pattern\":\"M*\",\"n_groups\":3}", SPX_ERR_FORMAT, "'mamba_num_heads' 8",
         "'n_groups' 3"},
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"mamba_d_head\":\"auto\"}", SPX_ERR_FORMAT, "mamba_d_head", NULL},
        {"{\"architectures\":[\"GraniteMoeHybridForCausalLM\"],\"vocab_size\":512,\"hidden_size\":128,"
         "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_local_experts\":0,\"shared_intermediate_size\":256,"
         "\"mamba_d_head\":32,\"mamba_d_state\":16}", SPX_ERR_FORMAT, "'mamba_n_heads'", NULL},
        /* time_step_limit */
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"time_step_limit\":[0.1,0.1]}", SPX_ERR_FORMAT, "time_step_limit", "min < max"},
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"time_step_limit\":[0.2,0.1]}", SPX_ERR_FORMAT, "time_step_limit", "min < max"},
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"time_step_limit\":[-Infinity,1]}", SPX_ERR_FORMAT, "time_step_limit", NULL},
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"time_step_limit\":[Infinity,Infinity]}", SPX_ERR_FORMAT, "time_step_limit", NULL},
        {"{" NEMO_SMALL ",\"hybrid_override_pattern\":\"M*\",\"time_step_limit\":[0.5,0.1]}", SPX_ERR_FORMAT,
         "time_step_limit", NULL},
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"time_step_limit\":[0.0]}", SPX_ERR_FORMAT, "'time_step_limit' must be a list", NULL},
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"time_step_limit\":[0.0,\"inf\"]}", SPX_ERR_FORMAT, "time_step_limit[1]", NULL},
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"time_step_limit\":[0.0,{\"__float__\":\"NaN\"}]}", SPX_ERR_FORMAT,
         "time_step_limit[1]", NULL},
        /* activations and positions */
        {"{" NEMO_SMALL ",\"hybrid_override_pattern\":\"M-\",\"mlp_hidden_act\":\"gelu\"}", SPX_ERR_UNSUPPORTED,
         "'mlp_hidden_act' is 'gelu'", "relu2"},
        {"{" NEMO_SMALL ",\"hybrid_override_pattern\":\"M-\",\"mamba_hidden_act\":\"gelu\"}", SPX_ERR_UNSUPPORTED,
         "mamba_hidden_act", NULL},
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"hidden_act\":\"gelu\"}", SPX_ERR_UNSUPPORTED, "hidden_act", NULL},
        {"{" GRANITE_SMALL GRANITE_KINDS ",\"position_embedding_type\":\"alibi\"}", SPX_ERR_UNSUPPORTED,
         "position_embedding_type", NULL},
        /* LFM2's attention layers */
        {"{" LFM2_SMALL ",\"intermediate_size\":256,\"layer_types\":null,\"full_attn_idxs\":\"all\"}", SPX_ERR_FORMAT,
         "'full_attn_idxs' must be a list", NULL},
        {"{" LFM2_SMALL ",\"intermediate_size\":256,\"full_attn_idxs\":[1,4]}", SPX_ERR_FORMAT, "full_attn_idxs", "below 4"},
        {"{" LFM2_SMALL ",\"intermediate_size\":256,\"full_attn_idxs\":[-1]}", SPX_ERR_FORMAT, "full_attn_idxs", NULL},
        {"{" LFM2_SMALL ",\"intermediate_size\":256,\"full_attn_idxs\":[1.5]}", SPX_ERR_FORMAT, "full_attn_idxs", NULL},
        {"{" LFM2_SMALL ",\"intermediate_size\":256,\"full_attn_idxs\":[\"1\"]}", SPX_ERR_FORMAT, "full_attn_idxs", NULL},
        {"{" LFM2_SMALL ",\"full_attn_idxs\":[1]}", SPX_ERR_FORMAT, "intermediate_size", NULL},
        {"{" LFM2_SMALL ",\"full_attn_idxs\":[1],\"block_ff_dim\":256,\"block_auto_adjust_ff_dim\":true,"
         "\"block_ffn_dim_multiplier\":1e-3}",
         SPX_ERR_FORMAT, "adjusted ff width", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[48];
        snprintf(what, sizeof what, "hybrid case %zu", i);
        expect_err(what, cases[i].json, cases[i].code, cases[i].w1, cases[i].w2);
    }
    /* the shared fixtures, broken */
    char *t = fixture("tiny-granite4moe");
    if (t) {
        spx_config g;
        spx_err ge;
        spx_err_clear(&ge);
        CHECK(spx_config_parse(t, strlen(t), "config.json", &g, &ge) == SPX_OK && g.n_experts == 4 &&
                  g.moe_top_k == 2 && g.moe_intermediate == 96 && g.intermediate_size == 256 && g.moe_shared &&
                  g.gate_up_fused && g.ffn[1] == SPX_FFN_MOE,
              "tiny-granite4moe: %s", ge.msg);
        free(t);
    }
    t = fixture("tiny-qwen3moe");
    if (t) {
        spx_config g;
        spx_err ge;
        spx_err_clear(&ge);
        CHECK(spx_config_parse(t, strlen(t), "config.json", &g, &ge) == SPX_OK && g.arch == SPX_ARCH_QWEN3_MOE &&
                  g.n_experts == 8 && g.moe_top_k == 2 && g.moe_intermediate == 96 && g.moe_norm_topk &&
                  !g.moe_shared && g.qk_norm && g.ffn[0] == SPX_FFN_MOE && g.ffn[2] == SPX_FFN_MOE,
              "tiny-qwen3moe: %s", ge.msg);
        char *v = subst(t, "\"mlp_only_layers\": []", "\"mlp_only_layers\": [1]");
        if (v) {
            CHECK(spx_config_parse(v, strlen(v), "config.json", &g, &ge) == SPX_OK && g.ffn[0] == SPX_FFN_MOE &&
                      g.ffn[1] == SPX_FFN_SWIGLU && g.ffn[2] == SPX_FFN_MOE,
                  "qwen3moe mlp_only_layers [1]: %s", ge.msg);
            free(v);
        }
        free(t);
    }
    t = fixture("tiny-granite4");
    if (t) {
        char *v = subst(t, "\"mamba_d_head\": 32", "\"mamba_d_head\": 16");
        if (v) expect_err("granite mamba_d_head 16", v, SPX_ERR_FORMAT, "mamba_expand * hidden_size (256)",
                          "mamba_n_heads * mamba_d_head (128)");
        free(v);
        v = subst(t, "\"mamba_n_groups\": 1", "\"mamba_n_groups\": 3");
        if (v) expect_err("granite mamba_n_groups 3", v, SPX_ERR_FORMAT, "'mamba_n_heads' 8", "'mamba_n_groups' 3");
        free(v);
        v = subst(t, "\"num_local_experts\": 0", "\"num_local_experts\": 2");
        if (v) expect_err("granite num_local_experts 2", v, SPX_ERR_FORMAT, "'num_experts_per_tok' is 0", "1..2");
        free(v);
        v = subst(t, "\"linear_attention\",\n    \"full_attention\",\n    \"linear_attention\"",
                  "\"linear_attention\",\n    \"sliding_attention\",\n    \"linear_attention\"");
        if (v) expect_err("granite sliding_attention", v, SPX_ERR_UNSUPPORTED, "'layer_types[1]' is 'sliding_attention'",
                          "supported:");
        free(v);
        free(t);
    }
    t = fixture("tiny-nemotronh");
    if (t) {
        char *v = subst(t, "\"mlp_hidden_act\": \"relu2\"", "\"mlp_hidden_act\": \"gelu\"");
        if (v) expect_err("nemotron gelu", v, SPX_ERR_UNSUPPORTED, "mlp_hidden_act", "gelu");
        free(v);
        v = subst(t, "\"mlp\"\n", "\"moe\"\n");
        if (v) expect_err("nemotron moe", v, SPX_ERR_UNSUPPORTED, "'layers_block_type[3]' is 'moe'", "mixture-of-experts");
        free(v);
        free(t);
    }
    t = fixture("tiny-lfm2");
    if (t) {
        char *v = subst(t, "\"layer_types\"", "\"layer_kinds\"");
        if (v) { /* Lfm2Config: no layer list, no full_attn_idxs: every layer attends */
            spx_config c;
            spx_err e;
            CHECK(parse(v, &c, &e) == SPX_OK && c.n_attn_layers == c.n_layers, "lfm2 without layer_types: %lld of %lld attend %s",
                  (long long)c.n_attn_layers, (long long)c.n_layers, e.msg);
        }
        free(v);
        free(t);
    }
}

/* A model folder: config + a symlink to real weights. */
static const char *make_dir(const char *name, const char *config, const char *weights) {
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", tl_tmpdir(), name);
    /* the link lives elsewhere: a relative fixture path (../shared) must be made absolute */
    char *abs = realpath(weights, NULL);
    CHECK(abs != NULL, "weights %s", weights);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && ln -sf '%s' '%s/model.safetensors'", dir, abs ? abs : weights, dir);
    free(abs);
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
    test_hybrid_fixtures();
    test_hybrid_old_styles();
    test_hybrid_errors();
    test_bad_models();
    test_bad_calls();
    return tl_finish("test_config");
}
