/* hf_config.c: config.json parsing and validation (see hf_config.h). */
#include "format/hf_config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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
    case SPX_ARCH_LFM2: return "lfm2";
    case SPX_ARCH_GRANITE4: return "granite4";
    case SPX_ARCH_QWEN3_MOE: return "qwen3moe";
    case SPX_ARCH_NEMOTRON_H: return "nemotron_h";
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
    cfg->rope_theta = cfg->arch == SPX_ARCH_LFM2 ? 1e6 : 10000.0; /* Lfm2Config's default is 1e6 */
    SPX_TRY(get_num(c, root, "rope_theta", false, 1e-3, 1e12, &cfg->rope_theta));
    if (cfg->arch == SPX_ARCH_LFM2) /* the original LFM2 configs' name; Lfm2Config prefers it to rope_theta */
        SPX_TRY(get_num(c, root, "theta", false, 1e-3, 1e12, &cfg->rope_theta));
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

/* ---- per-layer structure ------------------------------------------------ */

/* Reads a list of per-layer kind names (layer_types / layers_block_type)
 * into mixer/ffn kinds through `map`; NULL list: *found = 0. A kind the
 * family has but Spectra does not run yet (mixture-of-experts) is an entry
 * with `unsupported` set: refused with that reason, not as unknown. `code`
 * is the kind's letter in an older pattern string (0: none). */
typedef struct { const char *name; uint8_t mixer, ffn; char code; const char *unsupported; } kind_name;

static spx_status kind_refused(ctx *c, const char *key, int64_t l, const kind_name *k) {
    return spx_fail(c->e, SPX_ERR_UNSUPPORTED, "%s: '%s[%lld]' is '%s': %s", c->label, key, (long long)l, k->name,
                    k->unsupported);
}

static spx_status parse_kind_list(ctx *c, spx_config *cfg, const char *key, const kind_name *map, int *found) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(c->root, key);
    *found = 0;
    if (!lt || cJSON_IsNull(lt)) return SPX_OK;
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != cfg->n_layers)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: '%s' must be a list of %lld layer kinds", c->label, key,
                        (long long)cfg->n_layers);
    int64_t l = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, lt) {
        const kind_name *k = map;
        if (cJSON_IsString(it))
            while (k->name && strcmp(k->name, it->valuestring)) k++;
        if (!cJSON_IsString(it) || !k->name) {
            char known[256] = "";
            for (const kind_name *q = map; q->name; q++)
                if (!q->unsupported)
                    snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", known[0] ? ", " : "", q->name);
            return spx_fail(c->e, SPX_ERR_UNSUPPORTED, "%s: '%s[%lld]' is '%s'; supported: %s", c->label, key,
                            (long long)l, cJSON_IsString(it) ? it->valuestring : "(not a string)", known);
        }
        if (k->unsupported) return kind_refused(c, key, l, k);
        cfg->mixer[l] = k->mixer;
        cfg->ffn[l] = k->ffn;
        l++;
    }
    *found = 1;
    return SPX_OK;
}

static spx_status need_act(ctx *c, const char *key, const char *want, bool required) {
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!act || cJSON_IsNull(act)) {
        if (required) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: missing required field '%s'", c->label, key);
        return SPX_OK;
    }
    if (!cJSON_IsString(act) || strcmp(act->valuestring, want))
        return spx_fail(c->e, SPX_ERR_UNSUPPORTED, "%s: '%s' is '%s'; only %s is supported", c->label, key,
                        cJSON_IsString(act) ? act->valuestring : "(not a string)", want);
    return SPX_OK;
}

/* A number that transformers may write as {"__float__": "Infinity"}
 * (its JSON encoder's form for non-finite floats). */
static spx_status get_num_or_inf(ctx *c, const cJSON *v, const char *what, double *out) {
    if (cJSON_IsNumber(v)) {
        *out = v->valuedouble;
        return SPX_OK;
    }
    const cJSON *f = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "__float__") : NULL;
    if (f && cJSON_IsString(f) && !strcmp(f->valuestring, "Infinity")) {
        *out = INFINITY;
        return SPX_OK;
    }
    return spx_fail(c->e, SPX_ERR_FORMAT, "%s: '%s' must be a number", c->label, what);
}

/* time_step_limit [lo, hi] (absent: no clamp). */
static spx_status parse_dt_limit(ctx *c, spx_config *cfg) {
    cfg->ssm_dt_lo = 0.0f;
    cfg->ssm_dt_hi = INFINITY;
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(c->root, "time_step_limit");
    if (!tl || cJSON_IsNull(tl)) return SPX_OK;
    if (!cJSON_IsArray(tl) || cJSON_GetArraySize(tl) != 2)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'time_step_limit' must be a list [min, max]", c->label);
    double lo, hi;
    SPX_TRY(get_num_or_inf(c, cJSON_GetArrayItem(tl, 0), "time_step_limit[0]", &lo));
    SPX_TRY(get_num_or_inf(c, cJSON_GetArrayItem(tl, 1), "time_step_limit[1]", &hi));
    if (!(lo >= 0 && hi > lo))
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'time_step_limit' [%g, %g] must satisfy 0 <= min < max", c->label,
                        lo, hi);
    cfg->ssm_dt_lo = (float)lo;
    cfg->ssm_dt_hi = (float)hi;
    return SPX_OK;
}

/* The Mamba-2 shape, from each family's field names; d_inner =
 * heads * head_dim. The *_alias names (NULL: none) are older spellings
 * the config class still accepts and prefers when given. */
typedef struct {
    const char *heads, *head_dim, *state, *groups, *conv, *chunk;
    int64_t groups_default; /* the family's config class default */
    const char *groups_alias, *conv_alias, *chunk_alias;
} ssm_keys;

static spx_status parse_ssm(ctx *c, spx_config *cfg, const ssm_keys *k) {
    const cJSON *r = c->root;
    SPX_TRY(get_int(c, r, k->heads, true, 1, CAP_HEADS, &cfg->ssm_heads));
    SPX_TRY(get_int(c, r, k->head_dim, true, 1, CAP_DIM, &cfg->ssm_head_dim));
    SPX_TRY(get_int(c, r, k->state, true, 1, 4096, &cfg->ssm_state));
    cfg->ssm_groups = k->groups_default;
    SPX_TRY(get_int(c, r, k->groups, false, 1, CAP_HEADS, &cfg->ssm_groups));
    if (k->groups_alias) SPX_TRY(get_int(c, r, k->groups_alias, false, 1, CAP_HEADS, &cfg->ssm_groups));
    cfg->ssm_conv_kernel = 4;
    SPX_TRY(get_int(c, r, k->conv, false, 1, 64, &cfg->ssm_conv_kernel));
    if (k->conv_alias) SPX_TRY(get_int(c, r, k->conv_alias, false, 1, 64, &cfg->ssm_conv_kernel));
    cfg->ssm_chunk = 256;
    SPX_TRY(get_int(c, r, k->chunk, false, 1, 4096, &cfg->ssm_chunk));
    if (k->chunk_alias) SPX_TRY(get_int(c, r, k->chunk_alias, false, 1, 4096, &cfg->ssm_chunk));
    if (cfg->ssm_heads % cfg->ssm_groups)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: '%s' %lld is not a multiple of '%s' %lld", c->label, k->heads,
                        (long long)cfg->ssm_heads, k->groups, (long long)cfg->ssm_groups);
    if (cfg->ssm_heads * cfg->ssm_head_dim > CAP_DIM)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: '%s' * '%s' is too large", c->label, k->heads, k->head_dim);
    return parse_dt_limit(c, cfg);
}

static int any_kind(const spx_config *cfg, int mixer, int ffn) {
    for (int64_t l = 0; l < cfg->n_layers; l++)
        if ((mixer >= 0 && cfg->mixer[l] == mixer) || (ffn >= 0 && cfg->ffn[l] == ffn)) return 1;
    return 0;
}

static void all_layers(spx_config *cfg, spx_mixer_kind m, spx_ffn_kind f) {
    for (int64_t l = 0; l < cfg->n_layers; l++) cfg->mixer[l] = (uint8_t)m, cfg->ffn[l] = (uint8_t)f;
}

/* ---- families ------------------------------------------------------------ */

/* The routed experts' counts, shared by the MoE families: n_experts from
 * the first of keys present (transformers renamed them across versions). */
static spx_status parse_moe_counts(ctx *c, spx_config *cfg, const char *const *keys, int64_t experts, int64_t top_k) {
    const cJSON *root = c->root;
    for (int i = 0; keys[i]; i++)
        if (cJSON_GetObjectItemCaseSensitive(root, keys[i])) {
            SPX_TRY(get_int(c, root, keys[i], true, 0, 1 << 16, &experts));
            break;
        }
    cfg->n_experts = experts;
    if (experts == 0) return SPX_OK;
    cfg->moe_top_k = top_k < experts ? top_k : experts;
    SPX_TRY(get_int(c, root, "num_experts_per_tok", false, 1, experts, &cfg->moe_top_k));
    return SPX_OK;
}

/* Qwen3-MoE: layer l is a MoE layer when (l + 1) % decoder_sparse_step
 * == 0 and l is not in mlp_only_layers (Qwen3MoeDecoderLayer), else a
 * dense SwiGLU of intermediate_size; no shared expert. */
static spx_status parse_qwen3_moe(ctx *c, spx_config *cfg) {
    const cJSON *root = c->root;
    static const char *const keys[] = {"num_experts", "num_local_experts", NULL};
    SPX_TRY(parse_moe_counts(c, cfg, keys, 128, 8)); /* Qwen3MoeConfig's defaults */
    if (cfg->n_experts == 0) return SPX_OK;
    cfg->moe_intermediate = 768;
    SPX_TRY(get_int(c, root, "moe_intermediate_size", false, 1, CAP_DIM, &cfg->moe_intermediate));
    int64_t step = 1;
    SPX_TRY(get_int(c, root, "decoder_sparse_step", false, 1, SPX_MAX_LAYERS, &step));
    cfg->moe_norm_topk = false; /* Qwen3MoeConfig's default */
    SPX_TRY(get_bool(c, root, "norm_topk_prob", &cfg->moe_norm_topk));
    for (int64_t l = 0; l < cfg->n_layers; l++)
        if ((l + 1) % step == 0) cfg->ffn[l] = SPX_FFN_MOE;
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers"), *it;
    if (only && !cJSON_IsNull(only) && !cJSON_IsArray(only))
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'mlp_only_layers' must be a list of layer indices", c->label);
    cJSON_ArrayForEach(it, only) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (double)cfg->n_layers ||
            it->valuedouble != floor(it->valuedouble))
            return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'mlp_only_layers' entries must be layer indices below %lld",
                            c->label, (long long)cfg->n_layers);
        cfg->ffn[(int64_t)it->valuedouble] = SPX_FFN_SWIGLU;
    }
    return SPX_OK;
}

static spx_status parse_llama_family(ctx *c, spx_config *cfg) {
    const cJSON *root = c->root;
    SPX_TRY(need_act(c, "hidden_act", "silu", false));
    SPX_TRY(get_int(c, root, "intermediate_size", true, 1, CAP_DIM, &cfg->intermediate_size));
    double eps = 1e-6;
    SPX_TRY(get_num(c, root, "rms_norm_eps", false, 0, 1, &eps));
    cfg->rms_eps = (float)eps;
    all_layers(cfg, SPX_MIX_ATTN, SPX_FFN_SWIGLU);
    bool attn_bias = false, mlp_bias = false;
    SPX_TRY(get_bool(c, root, "attention_bias", &attn_bias));
    SPX_TRY(get_bool(c, root, "mlp_bias", &mlp_bias));
    switch (cfg->arch) {
    case SPX_ARCH_LLAMA:
        cfg->qkv_bias = cfg->o_bias = attn_bias;
        cfg->mlp_bias = mlp_bias;
        break;
    case SPX_ARCH_QWEN2:
        cfg->qkv_bias = true; /* Qwen2 always has q/k/v bias, never o bias */
        break;
    case SPX_ARCH_QWEN3:
    case SPX_ARCH_QWEN3_MOE:
        cfg->qkv_bias = cfg->o_bias = attn_bias;
        cfg->qk_norm = true;
        break;
    default: break;
    }
    if (cfg->arch == SPX_ARCH_QWEN3_MOE) SPX_TRY(parse_qwen3_moe(c, cfg));
    if (cfg->arch == SPX_ARCH_QWEN2 || cfg->arch == SPX_ARCH_QWEN3 || cfg->arch == SPX_ARCH_QWEN3_MOE) {
        bool use_sw = false;
        SPX_TRY(get_bool(c, root, "use_sliding_window", &use_sw));
        if (use_sw)
            return spx_fail(c->e, SPX_ERR_UNSUPPORTED, "%s: 'use_sliding_window' true is not supported", c->label);
    } else {
        SPX_TRY(get_int(c, root, "sliding_window", false, 1, CAP_POS, &cfg->sliding_window));
    }
    return SPX_OK;
}

/* LFM2: layer_types "conv" / "full_attention" (older: full_attn_idxs);
 * SwiGLU w1/w3/w2 whose width transformers may adjust
 * (block_auto_adjust_ff_dim: 2/3, the multiplier, rounded up to
 * block_multiple_of). */
static spx_status parse_lfm2(ctx *c, spx_config *cfg) {
    const cJSON *root = c->root;
    static const kind_name kinds[] = {{"conv", SPX_MIX_CONV, SPX_FFN_SWIGLU, 0, NULL},
                                      {"full_attention", SPX_MIX_ATTN, SPX_FFN_SWIGLU, 0, NULL},
                                      {NULL, 0, 0, 0, NULL}};
    int found = 0;
    SPX_TRY(parse_kind_list(c, cfg, "layer_types", kinds, &found));
    if (!found) { /* Lfm2Config: full_attn_idxs, absent = every layer attends */
        const cJSON *fa = cJSON_GetObjectItemCaseSensitive(root, "full_attn_idxs");
        if (!fa || cJSON_IsNull(fa)) all_layers(cfg, SPX_MIX_ATTN, SPX_FFN_SWIGLU);
        else if (!cJSON_IsArray(fa))
            return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'full_attn_idxs' must be a list of layer indices", c->label);
        else all_layers(cfg, SPX_MIX_CONV, SPX_FFN_SWIGLU);
        const cJSON *it;
        cJSON_ArrayForEach(it, fa) {
            if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (double)cfg->n_layers ||
                it->valuedouble != floor(it->valuedouble))
                return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'full_attn_idxs' entries must be layer indices below %lld",
                                c->label, (long long)cfg->n_layers);
            cfg->mixer[(int64_t)it->valuedouble] = SPX_MIX_ATTN;
        }
    }
    double eps = 1e-5;
    SPX_TRY(get_num(c, root, "norm_eps", false, 0, 1, &eps));
    cfg->rms_eps = (float)eps;
    int64_t ff = 0; /* Lfm2Config: the original configs' block_ff_dim wins over intermediate_size */
    SPX_TRY(get_int(c, root, "block_ff_dim", false, 1, CAP_DIM, &ff));
    if (ff == 0) SPX_TRY(get_int(c, root, "intermediate_size", true, 1, CAP_DIM, &ff));
    bool adjust = true; /* Lfm2Config's default */
    SPX_TRY(get_bool(c, root, "block_auto_adjust_ff_dim", &adjust));
    if (adjust) {
        double mult = 1.0;
        int64_t multiple = 256;
        SPX_TRY(get_num(c, root, "block_ffn_dim_multiplier", false, 1e-3, 1e3, &mult));
        SPX_TRY(get_int(c, root, "block_multiple_of", false, 1, CAP_DIM, &multiple));
        ff = (int64_t)(2 * ff / 3);
        ff = (int64_t)(mult * (double)ff);
        ff = multiple * ((ff + multiple - 1) / multiple);
        if (ff < 1 || ff > CAP_DIM) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: the adjusted ff width is out of range", c->label);
    }
    cfg->intermediate_size = ff;
    cfg->qk_norm = true;
    cfg->conv_kernel = 3;
    SPX_TRY(get_int(c, root, "conv_L_cache", false, 1, 64, &cfg->conv_kernel));
    SPX_TRY(get_bool(c, root, "conv_bias", &cfg->conv_bias));
    /* older configs spell the tie "tie_embedding", which Lfm2Config prefers;
     * transformers ties by default */
    cfg->tie_embeddings = true;
    SPX_TRY(get_bool(c, root, "tie_word_embeddings", &cfg->tie_embeddings));
    SPX_TRY(get_bool(c, root, "tie_embedding", &cfg->tie_embeddings));
    return SPX_OK;
}

/* Granite 4.0 hybrid (GraniteMoeHybrid): layer_types (older:
 * layers_block_type) "mamba"/"linear_attention" or "attention"/
 * "full_attention"; every layer then has the shared SwiGLU MLP. */
static spx_status parse_granite4(ctx *c, spx_config *cfg) {
    const cJSON *root = c->root;
    static const kind_name kinds[] = {{"mamba", SPX_MIX_MAMBA2, SPX_FFN_SWIGLU, 0, NULL},
                                      {"linear_attention", SPX_MIX_MAMBA2, SPX_FFN_SWIGLU, 0, NULL},
                                      {"attention", SPX_MIX_ATTN, SPX_FFN_SWIGLU, 0, NULL},
                                      {"full_attention", SPX_MIX_ATTN, SPX_FFN_SWIGLU, 0, NULL},
                                      {NULL, 0, 0, 0, NULL}};
    int found = 0;
    SPX_TRY(parse_kind_list(c, cfg, "layer_types", kinds, &found));
    if (!found) SPX_TRY(parse_kind_list(c, cfg, "layers_block_type", kinds, &found));
    if (!found) all_layers(cfg, SPX_MIX_MAMBA2, SPX_FFN_SWIGLU);
    /* GraniteMoeHybridConfig's default is 8 routed experts (a dense model's
     * config says 0); with experts every layer's MLP is the MoE block
     * (block_sparse_moe, experts of width intermediate_size) plus the
     * shared MLP (shared_intermediate_size); its gating takes the softmax
     * of the top-k logits */
    static const char *const keys[] = {"num_local_experts", NULL};
    SPX_TRY(parse_moe_counts(c, cfg, keys, 8, 2)); /* GraniteMoeHybridConfig's defaults */
    SPX_TRY(need_act(c, "hidden_act", "silu", false));
    if (cfg->n_experts > 0) {
        cfg->moe_intermediate = 1024;
        SPX_TRY(get_int(c, root, "intermediate_size", false, 1, CAP_DIM, &cfg->moe_intermediate));
        cfg->moe_norm_topk = cfg->moe_shared = true;
        for (int64_t l = 0; l < cfg->n_layers; l++) cfg->ffn[l] = SPX_FFN_MOE;
    }
    SPX_TRY(get_int(c, root, "shared_intermediate_size", true, 1, CAP_DIM, &cfg->intermediate_size));
    cfg->gate_up_fused = true;
    double eps = 1e-6, v;
    SPX_TRY(get_num(c, root, "rms_norm_eps", false, 0, 1, &eps));
    cfg->rms_eps = (float)eps;
    bool attn_bias = false;
    SPX_TRY(get_bool(c, root, "attention_bias", &attn_bias));
    cfg->qkv_bias = cfg->o_bias = attn_bias;
    v = 1; /* the softmax scale is attention_multiplier, default 1.0, never 1/sqrt(head_dim) */
    SPX_TRY(get_num(c, root, "attention_multiplier", false, 0, 1e6, &v));
    cfg->attn_scale = (float)v;
    v = 1;
    SPX_TRY(get_num(c, root, "embedding_multiplier", false, 0, 1e6, &v));
    cfg->embed_mult = (float)v;
    v = 1;
    SPX_TRY(get_num(c, root, "residual_multiplier", false, 0, 1e6, &v));
    cfg->residual_mult = (float)v;
    v = 1;
    SPX_TRY(get_num(c, root, "logits_scaling", false, 1e-6, 1e6, &v));
    cfg->logits_div = (float)v;
    /* transformers rotates only when position_embedding_type is "rope"
     * (absent or null: no positions) */
    const cJSON *pe = cJSON_GetObjectItemCaseSensitive(root, "position_embedding_type");
    cfg->rope = false;
    if (pe && !cJSON_IsNull(pe)) {
        if (cJSON_IsString(pe) && !strcmp(pe->valuestring, "rope")) cfg->rope = true;
        else if (!cJSON_IsString(pe) || strcmp(pe->valuestring, "nope"))
            return spx_fail(c->e, SPX_ERR_UNSUPPORTED, "%s: 'position_embedding_type' must be \"rope\" or \"nope\"", c->label);
    }
    static const ssm_keys k = {"mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv",
                               "mamba_chunk_size", 1, NULL, NULL, NULL};
    SPX_TRY(parse_ssm(c, cfg, &k));
    int64_t expand = 2;
    SPX_TRY(get_int(c, root, "mamba_expand", false, 1, 64, &expand));
    if (any_kind(cfg, SPX_MIX_MAMBA2, -1) && expand * cfg->hidden_size != cfg->ssm_heads * cfg->ssm_head_dim)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: mamba_expand * hidden_size (%lld) != mamba_n_heads * mamba_d_head (%lld)",
                        c->label, (long long)(expand * cfg->hidden_size), (long long)(cfg->ssm_heads * cfg->ssm_head_dim));
    cfg->ssm_norm_group = cfg->ssm_heads * cfg->ssm_head_dim; /* GraniteMoeHybridRMSNormGated: one group */
    cfg->ssm_conv_bias = true;
    SPX_TRY(get_bool(c, root, "mamba_conv_bias", &cfg->ssm_conv_bias));
    SPX_TRY(get_bool(c, root, "mamba_proj_bias", &cfg->ssm_proj_bias));
    return SPX_OK;
}

/* Nemotron-H: one block per layer, layers_block_type (older:
 * hybrid_override_pattern, M = Mamba-2, * = attention, - = MLP, E = MoE).
 * Attention has no positions. */
static spx_status parse_nemotron_h(ctx *c, spx_config *cfg) {
    const cJSON *root = c->root;
    static const char moe[] = "mixture-of-experts blocks are not supported yet";
    static const kind_name kinds[] = {{"mamba", SPX_MIX_MAMBA2, SPX_FFN_NONE, 'M', NULL},
                                      {"linear_attention", SPX_MIX_MAMBA2, SPX_FFN_NONE, 0, NULL},
                                      {"attention", SPX_MIX_ATTN, SPX_FFN_NONE, '*', NULL},
                                      {"full_attention", SPX_MIX_ATTN, SPX_FFN_NONE, 0, NULL},
                                      {"mlp", SPX_MIX_NONE, SPX_FFN_RELU2, '-', NULL},
                                      {"moe", SPX_MIX_NONE, SPX_FFN_NONE, 'E', moe},
                                      {NULL, 0, 0, 0, NULL}};
    int found = 0;
    SPX_TRY(parse_kind_list(c, cfg, "layers_block_type", kinds, &found));
    if (!found) SPX_TRY(parse_kind_list(c, cfg, "layer_types", kinds, &found)); /* NemotronHConfig's attribute alias */
    if (!found) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(root, "hybrid_override_pattern");
        if (!cJSON_IsString(pat) || (int64_t)strlen(pat->valuestring) != cfg->n_layers)
            return spx_fail(c->e, SPX_ERR_FORMAT,
                            "%s: neither 'layers_block_type' nor a %lld-character 'hybrid_override_pattern' gives the layers",
                            c->label, (long long)cfg->n_layers);
        for (int64_t l = 0; l < cfg->n_layers; l++) {
            const char ch = pat->valuestring[l];
            const kind_name *k = kinds;
            while (k->name && (!k->code || k->code != ch)) k++;
            if (!k->name)
                return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'hybrid_override_pattern'[%lld] is '%c'; expected M, *, - or E",
                                c->label, (long long)l, ch);
            if (k->unsupported)
                return spx_fail(c->e, SPX_ERR_UNSUPPORTED, "%s: 'hybrid_override_pattern'[%lld] is '%c' (%s): %s",
                                c->label, (long long)l, ch, k->name, k->unsupported);
            cfg->mixer[l] = k->mixer;
            cfg->ffn[l] = k->ffn;
        }
    }
    if (any_kind(cfg, -1, SPX_FFN_RELU2)) {
        SPX_TRY(need_act(c, "mlp_hidden_act", "relu2", false));
        SPX_TRY(get_int(c, root, "intermediate_size", true, 1, CAP_DIM, &cfg->intermediate_size));
    }
    SPX_TRY(need_act(c, "mamba_hidden_act", "silu", false));
    double eps = 1e-5;
    SPX_TRY(get_num(c, root, "layer_norm_epsilon", false, 0, 1, &eps));
    cfg->rms_eps = (float)eps;
    SPX_TRY(get_bool(c, root, "mlp_bias", &cfg->mlp_bias));
    cfg->rope = false;
    /* NemotronHConfig's older names: mamba_n_groups, mamba_d_conv,
     * mamba_chunk_size, mamba_dt_min, mamba_conv_bias (preferred when given) */
    static const ssm_keys k = {"mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel",
                               "chunk_size", 8, "mamba_n_groups", "mamba_d_conv", "mamba_chunk_size"};
    if (any_kind(cfg, SPX_MIX_MAMBA2, -1)) {
        SPX_TRY(parse_ssm(c, cfg, &k));
        /* transformers' torch path clamps the step below at time_step_min
         * and ignores time_step_limit (docs/numerics.md) */
        double tmin = 0.001; /* NemotronHConfig's default */
        SPX_TRY(get_num(c, root, "time_step_min", false, 0, 1, &tmin));
        SPX_TRY(get_num(c, root, "mamba_dt_min", false, 0, 1, &tmin));
        cfg->ssm_dt_lo = (float)tmin;
        cfg->ssm_dt_hi = INFINITY;
        cfg->ssm_norm_group = cfg->ssm_heads * cfg->ssm_head_dim / cfg->ssm_groups;
        cfg->ssm_conv_bias = true;
        SPX_TRY(get_bool(c, root, "use_conv_bias", &cfg->ssm_conv_bias));
        SPX_TRY(get_bool(c, root, "mamba_conv_bias", &cfg->ssm_conv_bias));
        SPX_TRY(get_bool(c, root, "use_bias", &cfg->ssm_proj_bias));
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
    static const struct { const char *cls; spx_arch arch; } classes[] = {
        {"LlamaForCausalLM", SPX_ARCH_LLAMA},
        {"Qwen2ForCausalLM", SPX_ARCH_QWEN2},
        {"Qwen3ForCausalLM", SPX_ARCH_QWEN3},
        {"MistralForCausalLM", SPX_ARCH_MISTRAL},
        {"Lfm2ForCausalLM", SPX_ARCH_LFM2},
        {"GraniteMoeHybridForCausalLM", SPX_ARCH_GRANITE4},
        {"NemotronHForCausalLM", SPX_ARCH_NEMOTRON_H},
        {"Qwen3MoeForCausalLM", SPX_ARCH_QWEN3_MOE},
    };
    size_t ci = 0, nc = sizeof classes / sizeof classes[0];
    while (ci < nc && strcmp(classes[ci].cls, a0->valuestring)) ci++;
    if (ci == nc)
        return spx_fail(c->e, SPX_ERR_UNSUPPORTED,
                        "%s: 'architectures' is '%s'; supported: LlamaForCausalLM, Qwen2ForCausalLM, "
                        "Qwen3ForCausalLM, Qwen3MoeForCausalLM, MistralForCausalLM, Lfm2ForCausalLM, "
                        "GraniteMoeHybridForCausalLM, NemotronHForCausalLM", c->label, a0->valuestring);
    cfg->arch = classes[ci].arch;

    SPX_TRY(get_int(c, root, "vocab_size", true, 1, CAP_VOCAB, &cfg->vocab_size));
    SPX_TRY(get_int(c, root, "hidden_size", true, 1, CAP_DIM, &cfg->hidden_size));
    /* Nemotron-H: the layer list (layers_block_type, its alias layer_types,
     * or the older hybrid_override_pattern) gives the count, as in
     * NemotronHConfig, which only warns when num_hidden_layers differs
     * (transformers 5 writes none) */
    int layers_implied = 0;
    if (cfg->arch == SPX_ARCH_NEMOTRON_H) {
        const cJSON *lbt = cJSON_GetObjectItemCaseSensitive(root, "layers_block_type");
        if (!cJSON_IsArray(lbt)) lbt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(root, "hybrid_override_pattern");
        int64_t n = cJSON_IsArray(lbt) ? cJSON_GetArraySize(lbt) : cJSON_IsString(pat) ? (int64_t)strlen(pat->valuestring) : 0;
        if (n > 0 && n <= SPX_MAX_LAYERS) cfg->n_layers = n, layers_implied = 1;
    }
    if (!layers_implied) SPX_TRY(get_int(c, root, "num_hidden_layers", true, 1, SPX_MAX_LAYERS, &cfg->n_layers));
    SPX_TRY(get_int(c, root, "num_attention_heads", true, 1, CAP_HEADS, &cfg->n_heads));
    cfg->n_kv_heads = cfg->n_heads;
    SPX_TRY(get_int(c, root, "num_key_value_heads", false, 1, CAP_HEADS, &cfg->n_kv_heads));
    if (cfg->n_heads % cfg->n_kv_heads)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: num_attention_heads (%lld) is not a multiple of num_key_value_heads (%lld)",
                        c->label, (long long)cfg->n_heads, (long long)cfg->n_kv_heads);
    if (cfg->hidden_size % cfg->n_heads == 0) cfg->head_dim = cfg->hidden_size / cfg->n_heads;
    else cfg->head_dim = 0;
    if (cfg->arch == SPX_ARCH_NEMOTRON_H)
        SPX_TRY(get_int(c, root, "attention_head_dim", false, 2, CAP_DIM, &cfg->head_dim));
    SPX_TRY(get_int(c, root, "head_dim", false, 2, CAP_DIM, &cfg->head_dim));
    if (cfg->head_dim <= 0)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: hidden_size %lld is not divisible by num_attention_heads %lld and no 'head_dim' is given",
                        c->label, (long long)cfg->hidden_size, (long long)cfg->n_heads);
    if (cfg->head_dim % 2) return spx_fail(c->e, SPX_ERR_FORMAT, "%s: 'head_dim' %lld must be even for RoPE", c->label, (long long)cfg->head_dim);
    if (cfg->n_heads * cfg->head_dim > CAP_DIM)
        return spx_fail(c->e, SPX_ERR_FORMAT, "%s: num_attention_heads * head_dim is too large", c->label);
    cfg->max_pos = 2048;
    SPX_TRY(get_int(c, root, "max_position_embeddings", false, 1, CAP_POS, &cfg->max_pos));
    cfg->tie_embeddings = false;
    SPX_TRY(get_bool(c, root, "tie_word_embeddings", &cfg->tie_embeddings));
    cfg->rope = true;
    cfg->attn_scale = 1.0f / sqrtf((float)cfg->head_dim);
    cfg->embed_mult = cfg->residual_mult = cfg->logits_div = 1.0f;
    switch (cfg->arch) {
    case SPX_ARCH_LFM2: SPX_TRY(parse_lfm2(c, cfg)); break;
    case SPX_ARCH_GRANITE4: SPX_TRY(parse_granite4(c, cfg)); break;
    case SPX_ARCH_NEMOTRON_H: SPX_TRY(parse_nemotron_h(c, cfg)); break;
    default: SPX_TRY(parse_llama_family(c, cfg)); break;
    }
    cfg->n_attn_layers = 0;
    for (int64_t l = 0; l < cfg->n_layers; l++) cfg->n_attn_layers += cfg->mixer[l] == SPX_MIX_ATTN;
    if (cfg->rope) SPX_TRY(parse_rope(c, cfg));
    SPX_TRY(parse_ids(c, cfg));
    return SPX_OK;
}

spx_status spx_config_parse(const char *json, size_t len, const char *label, spx_config *cfg,
                            spx_err *e) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = -1;
    /* cJSON recurses per nesting level; it caps depth at CJSON_NESTING_LIMIT
     * (1000), which is safe on our stacks. */
    /* Python's json writes a non-finite float as a bare Infinity (Nemotron-H
     * and Granite configs: time_step_limit), which is not JSON: outside
     * strings it is read as 1e999 (strtod: +inf). */
    char *fixed = NULL;
    if (len < ((size_t)64 << 20) && memmem(json, len, "Infinity", 8)) {
        fixed = malloc(len + 1);
        if (!fixed) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
        size_t o = 0;
        int in_str = 0;
        for (size_t i = 0; i < len; i++) {
            char ch = json[i];
            if (in_str) {
                if (ch == '\\' && i + 1 < len) fixed[o++] = json[i++];
                else if (ch == '"') in_str = 0;
            } else if (ch == '"') {
                in_str = 1;
            } else if (ch == 'I' && len - i >= 8 && !memcmp(json + i, "Infinity", 8)) {
                memcpy(fixed + o, "1e999", 5);
                o += 5;
                i += 7;
                continue;
            }
            fixed[o++] = json[i];
        }
        json = fixed;
        len = o;
    }
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        ptrdiff_t at = cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - json : (ptrdiff_t)-1;
        free(fixed);
        return spx_fail(e, SPX_ERR_FORMAT, "%s: not valid JSON (near byte %td)", label, at);
    }
    ctx c = {root, label, e};
    spx_status s = parse_root(&c, cfg);
    cJSON_Delete(root);
    free(fixed);
    return s;
}
