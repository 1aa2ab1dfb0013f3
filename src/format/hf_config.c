/* hf_config.c: config.json parsing and validation (see hf_config.h). */
#include "format/hf_config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Caps that keep a hostile config from asking for absurd allocations. */
#define CAP_DIM ((int64_t)1 << 20)      /* hidden, intermediate, head_dim */
#define CAP_VOCAB ((int64_t)1 << 24)
#define CAP_HEADS 4096
#define CAP_POS ((int64_t)1 << 24)

const char *spx_arch_name(spx_arch a) {
    switch (a) {
    case SPX_ARCH_LLAMA: return "llama";
    case SPX_ARCH_QWEN2: return "qwen2";
    case SPX_ARCH_QWEN3: return "qwen3";
    case SPX_ARCH_MISTRAL: return "mistral";
    }
    return "?";
}

typedef struct {
    const cJSON *root;
    const char *label;
    spx_err *e;
} ctx;

/* Reads an integer field. required: missing is an error; else *out keeps
 * its default. null counts as missing. */
static spx_status get_int(ctx *c, const cJSON *obj, const char *key, bool required,
                          int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: missing required field '%s'", c->label, key);
        return SPX_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: field '%s' must be an integer", c->label, key);
    double d = v->valuedouble;
    if (d < (double)lo || d > (double)hi)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: field '%s' is %.0f, expected %lld..%lld", c->label,
                        key, d, (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return SPX_OK;
}

static spx_status get_num(ctx *c, const cJSON *obj, const char *key, bool required, double lo,
                          double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: missing required field '%s'", c->label, key);
        return SPX_OK;
    }
    if (!cJSON_IsNumber(v)) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: field '%s' must be a number", c->label, key);
    double d = v->valuedouble;
    if (!(d >= lo && d <= hi))
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: field '%s' is %g, expected %g..%g", c->label, key, d, lo, hi);
    *out = d;
    return SPX_OK;
}

static spx_status get_bool(ctx *c, const cJSON *obj, const char *key, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return SPX_OK;
    if (!cJSON_IsBool(v)) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: field '%s' must be true or false", c->label, key);
    *out = cJSON_IsTrue(v);
    return SPX_OK;
}

/* RoPE: transformers 5 `rope_parameters` or older `rope_theta` + `rope_scaling`. */
static spx_status parse_rope(ctx *c, spx_config *cfg) {
    const cJSON *root = c->root;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const char *where = "rope_parameters";
    cfg->rope_theta = 10000.0;
    SPX_TRY(get_num(c, root, "rope_theta", false, 1e-3, 1e12, &cfg->rope_theta));
    const cJSON *params = NULL;
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp)) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'rope_parameters' must be an object", c->label);
        SPX_TRY(get_num(c, rp, "rope_theta", false, 1e-3, 1e12, &cfg->rope_theta));
        params = rp;
    } else if (rs && !cJSON_IsNull(rs)) {
        if (!cJSON_IsObject(rs)) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'rope_scaling' must be an object or null", c->label);
        params = rs;
        where = "rope_scaling";
    }
    cfg->rope_type = SPX_ROPE_DEFAULT;
    cfg->rope_factor = 1.0;
    if (!params) return SPX_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(params, "rope_type");
    if (!t || cJSON_IsNull(t)) t = cJSON_GetObjectItemCaseSensitive(params, "type");
    const char *type = "default";
    if (t && !cJSON_IsNull(t)) {
        if (!cJSON_IsString(t)) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: '%s.rope_type' must be a string", c->label, where);
        type = t->valuestring;
    }
    if (!strcmp(type, "default")) {
        cfg->rope_type = SPX_ROPE_DEFAULT;
    } else if (!strcmp(type, "linear")) {
        cfg->rope_type = SPX_ROPE_LINEAR;
        SPX_TRY(get_num(c, params, "factor", true, 1e-6, 1e6, &cfg->rope_factor));
    } else if (!strcmp(type, "llama3")) {
        cfg->rope_type = SPX_ROPE_LLAMA3;
        SPX_TRY(get_num(c, params, "factor", true, 1e-6, 1e6, &cfg->rope_factor));
        SPX_TRY(get_num(c, params, "low_freq_factor", true, 1e-6, 1e6, &cfg->rope_low_freq_factor));
        SPX_TRY(get_num(c, params, "high_freq_factor", true, 1e-6, 1e6, &cfg->rope_high_freq_factor));
        SPX_TRY(get_int(c, params, "original_max_position_embeddings", true, 1, CAP_POS, &cfg->rope_orig_max_pos));
        if (cfg->rope_high_freq_factor <= cfg->rope_low_freq_factor)
            return spx_fail(c->e, SPX_ERR_FORMAT, "%s: '%s': high_freq_factor (%g) must exceed low_freq_factor (%g)",
                            c->label, where, cfg->rope_high_freq_factor, cfg->rope_low_freq_factor);
    } else {
        return spx_fail(c->e, SPX_ERR_UNSUPPORTED,
                        "%s: '%s.rope_type' is '%s'; supported: default, linear, llama3", c->label, where, type);
    }
    const cJSON *prf = cJSON_GetObjectItemCaseSensitive(root, "partial_rotary_factor");
    if (prf && cJSON_IsNumber(prf) && prf->valuedouble != 1.0)
        return spx_fail(c->e, SPX_ERR_UNSUPPORTED, "%s: 'partial_rotary_factor' %g is not supported (only 1)",
                        c->label, prf->valuedouble);
    return SPX_OK;
}

static spx_status parse_ids(ctx *c, spx_config *cfg) {
    int64_t bos = -1;
    SPX_TRY(get_int(c, c->root, "bos_token_id", false, 0, CAP_VOCAB, &bos));
    cfg->bos_id = (int32_t)bos;
    cfg->n_eos = 0;
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(c->root, "eos_token_id");
    if (!eos || cJSON_IsNull(eos)) return SPX_OK;
    if (cJSON_IsNumber(eos)) {
        int64_t v = -1;
        SPX_TRY(get_int(c, c->root, "eos_token_id", false, 0, CAP_VOCAB, &v));
        cfg->eos_ids[cfg->n_eos++] = (int32_t)v;
        return SPX_OK;
    }
    if (!cJSON_IsArray(eos)) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'eos_token_id' must be an integer or a list", c->label);
    const cJSON *it;
    cJSON_ArrayForEach(it, eos) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (double)CAP_VOCAB ||
            it->valuedouble != floor(it->valuedouble))
            return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'eos_token_id' entries must be token ids", c->label);
        if (cfg->n_eos < SPX_MAX_EOS) cfg->eos_ids[cfg->n_eos++] = (int32_t)it->valuedouble;
    }
    return SPX_OK;
}

static spx_status parse_root(ctx *c, spx_config *cfg) {
    const cJSON *root = c->root;
    if (!cJSON_IsObject(root)) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: not a JSON object", c->label);
    /* A key given twice is ambiguous (Python keeps the last, cJSON finds
     * the first): refuse it rather than guess. */
    for (const cJSON *a = root->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (a->string && b->string && !strcmp(a->string, b->string))
                return spx_fail(c->e, SPX_ERR_FORMAT, "%s: key '%s' appears more than once", c->label, a->string);
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!a0 || !cJSON_IsString(a0))
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: missing 'architectures' (a list naming the model class)", c->label);
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", a0->valuestring);
    const char *an = a0->valuestring;
    if (!strcmp(an, "LlamaForCausalLM")) cfg->arch = SPX_ARCH_LLAMA;
    else if (!strcmp(an, "Qwen2ForCausalLM")) cfg->arch = SPX_ARCH_QWEN2;
    else if (!strcmp(an, "Qwen3ForCausalLM")) cfg->arch = SPX_ARCH_QWEN3;
    else if (!strcmp(an, "MistralForCausalLM")) cfg->arch = SPX_ARCH_MISTRAL;
    else
        return spx_fail(c->e, SPX_ERR_UNSUPPORTED,
                        "%s: 'architectures' is '%s'; supported: LlamaForCausalLM, Qwen2ForCausalLM, "
                        "Qwen3ForCausalLM, MistralForCausalLM", c->label, an);

    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !cJSON_IsNull(act) && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        return spx_fail(c->e, SPX_ERR_UNSUPPORTED, "%s: 'hidden_act' is '%s'; only silu is supported", c->label,
                        cJSON_IsString(act) ? act->valuestring : "(not a string)");

    SPX_TRY(get_int(c, root, "vocab_size", true, 1, CAP_VOCAB, &cfg->vocab_size));
    SPX_TRY(get_int(c, root, "hidden_size", true, 1, CAP_DIM, &cfg->hidden_size));
    SPX_TRY(get_int(c, root, "intermediate_size", true, 1, CAP_DIM, &cfg->intermediate_size));
    SPX_TRY(get_int(c, root, "num_hidden_layers", true, 1, SPX_MAX_LAYERS, &cfg->n_layers));
    SPX_TRY(get_int(c, root, "num_attention_heads", true, 1, CAP_HEADS, &cfg->n_heads));
    cfg->n_kv_heads = cfg->n_heads;
    SPX_TRY(get_int(c, root, "num_key_value_heads", false, 1, CAP_HEADS, &cfg->n_kv_heads));
    if (cfg->n_heads % cfg->n_kv_heads)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: num_attention_heads (%lld) is not a multiple of num_key_value_heads (%lld)",
                        c->label, (long long)cfg->n_heads, (long long)cfg->n_kv_heads);
    if (cfg->hidden_size % cfg->n_heads == 0) cfg->head_dim = cfg->hidden_size / cfg->n_heads;
    else cfg->head_dim = 0;
    SPX_TRY(get_int(c, root, "head_dim", false, 2, CAP_DIM, &cfg->head_dim));
    if (cfg->head_dim <= 0)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: hidden_size %lld is not divisible by num_attention_heads %lld and no 'head_dim' is given",
                        c->label, (long long)cfg->hidden_size, (long long)cfg->n_heads);
    if (cfg->head_dim % 2) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'head_dim' %lld must be even for RoPE", c->label, (long long)cfg->head_dim);
    if (cfg->n_heads * cfg->head_dim > CAP_DIM)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: num_attention_heads * head_dim is too large", c->label);
    cfg->max_pos = 2048;
    SPX_TRY(get_int(c, root, "max_position_embeddings", false, 1, CAP_POS, &cfg->max_pos));
    double eps = 1e-6;
    SPX_TRY(get_num(c, root, "rms_norm_eps", false, 0, 1, &eps));
    cfg->rms_eps = (float)eps;

    cfg->tie_embeddings = false;
    SPX_TRY(get_bool(c, root, "tie_word_embeddings", &cfg->tie_embeddings));
    bool attn_bias = false, mlp_bias = false;
    SPX_TRY(get_bool(c, root, "attention_bias", &attn_bias));
    SPX_TRY(get_bool(c, root, "mlp_bias", &mlp_bias));
    cfg->qkv_bias = cfg->o_bias = false;
    cfg->mlp_bias = false;
    cfg->qk_norm = false;
    switch (cfg->arch) {
    case SPX_ARCH_LLAMA:
        cfg->qkv_bias = cfg->o_bias = attn_bias;
        cfg->mlp_bias = mlp_bias;
        break;
    case SPX_ARCH_QWEN2:
        cfg->qkv_bias = true; /* Qwen2 always has q/k/v bias, never o bias */
        break;
    case SPX_ARCH_QWEN3:
        cfg->qkv_bias = cfg->o_bias = attn_bias;
        cfg->qk_norm = true;
        break;
    case SPX_ARCH_MISTRAL:
        break;
    }
    if (cfg->arch == SPX_ARCH_QWEN2 || cfg->arch == SPX_ARCH_QWEN3) {
        bool use_sw = false;
        SPX_TRY(get_bool(c, root, "use_sliding_window", &use_sw));
        if (use_sw)
            return spx_fail(c->e, SPX_ERR_UNSUPPORTED, "%s: 'use_sliding_window' true is not supported", c->label);
    } else {
        cfg->sliding_window = 0;
        SPX_TRY(get_int(c, root, "sliding_window", false, 1, CAP_POS, &cfg->sliding_window));
    }
    cfg->source_dtype = 32;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (!dt || cJSON_IsNull(dt)) dt = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
    if (dt && cJSON_IsString(dt)) {
        if (!strcmp(dt->valuestring, "bfloat16")) cfg->source_dtype = 'b';
        else if (!strcmp(dt->valuestring, "float16")) cfg->source_dtype = 16;
    }
    SPX_TRY(parse_rope(c, cfg));
    SPX_TRY(parse_ids(c, cfg));
    return SPX_OK;
}

spx_status spx_config_parse(const char *json, size_t len, const char *label, spx_config *cfg,
                            spx_err *e) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = -1;
    /* cJSON recurses per nesting level; it caps depth at CJSON_NESTING_LIMIT
     * (1000), which is safe on our stacks. */
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return spx_fail(e, SPX_ERR_FORMAT, "%s: not valid JSON (near byte %td)", label,
                               cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - json : (ptrdiff_t)-1);
    ctx c = {root, label, e};
    spx_status s = parse_root(&c, cfg);
    cJSON_Delete(root);
    return s;
}
