/* load.c: binds a model's weights from its tensor source (safetensors or
 * .trdc) into spx_model, checking every name, shape and dtype first, and
 * holds the per-architecture data (tensor roles, norm routing, RoPE). */
#include "model/model.h"
#include "core/half.h"
#include "format/trdc_source.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- architecture data ------------------------------------------------ */

/* The normalization that feeds each projection, by name suffix within a
 * layer. Same for every supported architecture (all are pre-norm Llama
 * blocks); a new architecture adds its own table here. o_proj, down_proj
 * and lm_head are fed by no norm (gamma = 1). */
typedef struct { const char *proj, *norm; } norm_route;
static const norm_route llama_routes[] = {
    {"self_attn.q_proj.weight", "input_layernorm.weight"},
    {"self_attn.k_proj.weight", "input_layernorm.weight"},
    {"self_attn.v_proj.weight", "input_layernorm.weight"},
    {"mlp.gate_proj.weight", "post_attention_layernorm.weight"},
    {"mlp.up_proj.weight", "post_attention_layernorm.weight"},
    {NULL, NULL},
};

static const norm_route *routes_for(spx_arch a) {
    switch (a) {
    case SPX_ARCH_LLAMA:
    case SPX_ARCH_QWEN2:
    case SPX_ARCH_QWEN3:
    case SPX_ARCH_MISTRAL: return llama_routes;
    }
    return NULL;
}

const char *spx_arch_feeding_norm(const spx_config *cfg, const char *tensor, char *buf, size_t cap) {
    const norm_route *r = routes_for(cfg->arch);
    static const char pre[] = "model.layers.";
    if (!r || strncmp(tensor, pre, sizeof pre - 1)) return NULL;
    const char *p = tensor + sizeof pre - 1;
    char *end;
    long layer = strtol(p, &end, 10);
    if (end == p || *end != '.') return NULL;
    for (; r->proj; r++)
        if (!strcmp(end + 1, r->proj)) {
            snprintf(buf, cap, "model.layers.%ld.%s", layer, r->norm);
            return buf;
        }
    return NULL;
}

void spx_rope_inv_freq(const spx_config *c, float *out) {
    int64_t half = c->head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        /* transformers: 1 / base ** (arange(0, d, 2).float() / d), float32 */
        float expo = (float)(2 * i) / (float)c->head_dim;
        float f = (float)(1.0 / pow(c->rope_theta, (double)expo));
        if (c->rope_type == SPX_ROPE_LINEAR) {
            f = (float)(f / c->rope_factor);
        } else if (c->rope_type == SPX_ROPE_LLAMA3) {
            double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
            double old = (double)c->rope_orig_max_pos;
            double low_wavelen = old / lo, high_wavelen = old / hi;
            double wavelen = 2.0 * M_PI / f;
            double v = f;
            if (wavelen > low_wavelen) v = f / factor;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                double smooth = (old / wavelen - lo) / (hi - lo);
                v = (1 - smooth) * f / factor + smooth * f;
            }
            f = (float)v;
        }
        /* transformers keeps inv_freq as a floating buffer, so loading a
         * bf16/fp16 checkpoint in its own dtype rounds it; the model was
         * trained and evaluated that way (docllama-58m's reference logits
         * match to 3e-5 with this rounding and 4e-2 without). */
        if (c->source_dtype == 'b') f = spx_bf16_to_f32(spx_f32_to_bf16(f));
        else if (c->source_dtype == 16) f = spx_f16_to_f32(spx_f32_to_f16(f));
        out[i] = f;
    }
}

/* ---- tensor lookup over either source ---------------------------------- */

typedef struct tref {
    int quant;
    spx_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;
    spx_qtensor q;
    const char *file;
} tref;

static int find_tensor(const spx_model *m, const char *name, tref *t) {
    memset(t, 0, sizeof *t);
    if (m->st) {
        const spx_st_tensor *s = spx_st_find(m->st, name);
        if (!s) return 0;
        t->dtype = s->dtype;
        t->ndim = s->ndim;
        memcpy(t->shape, s->shape, sizeof(int64_t) * (size_t)s->ndim);
        t->data = s->data;
        t->file = s->file;
        return 1;
    }
    if (m->trdc) {
        spx_trdc_ref r;
        if (!spx_trdc_source_find(m->trdc, name, &r)) return 0;
        t->quant = r.quant;
        t->dtype = r.dtype;
        t->ndim = r.ndim;
        memcpy(t->shape, r.shape, sizeof(int64_t) * (size_t)r.ndim);
        t->data = r.data;
        t->q = r.q;
        t->file = m->path;
        return 1;
    }
    return 0;
}

static int is_float_dtype(spx_dtype d) { return d == SPX_DT_F32 || d == SPX_DT_F16 || d == SPX_DT_BF16; }

static spx_status bind_mat(spx_model *m, const char *name, int64_t rows, int64_t cols, spx_wmat *w,
                           spx_err *e) {
    tref t;
    if (!find_tensor(m, name, &t))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s' is missing", m->path, name);
    if (t.ndim != 2 || t.shape[0] != rows || t.shape[1] != cols)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld] (%d dims), expected [%lld, %lld]",
                        t.file, name, (long long)t.shape[0], (long long)(t.ndim > 1 ? t.shape[1] : 0), t.ndim,
                        (long long)rows, (long long)cols);
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    if (t.quant) {
        w->kind = SPX_WM_QUANT;
        w->q = t.q;
    } else {
        if (!is_float_dtype(t.dtype))
            return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; expected F32, F16 or BF16", t.file,
                            name, spx_dtype_name(t.dtype));
        w->kind = SPX_WM_DENSE;
        w->dtype = t.dtype;
        w->data = t.data;
    }
    if (cols > m->max_cols) m->max_cols = cols;
    return SPX_OK;
}

/* Vectors (norm gains, biases) are small: converted to owned float32. */
static spx_status bind_vec(spx_model *m, const char *name, int64_t n, int required, float **out,
                           spx_err *e) {
    *out = NULL;
    tref t;
    if (!find_tensor(m, name, &t)) {
        if (!required) return SPX_OK;
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s' is missing", m->path, name);
    }
    if (t.quant || t.ndim != 1 || t.shape[0] != n)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s' has shape [%lld%s] (%d dims), expected [%lld]", t.file,
                        name, (long long)t.shape[0], t.ndim > 1 ? ", ..." : "", t.ndim, (long long)n);
    if (!is_float_dtype(t.dtype))
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; expected F32, F16 or BF16", t.file,
                        name, spx_dtype_name(t.dtype));
    float *v = malloc((size_t)n * sizeof(float));
    if (!v) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory for '%s'", m->path, name);
    spx_wmat tmp = {.rows = 1, .cols = n, .kind = SPX_WM_DENSE, .dtype = t.dtype, .data = t.data};
    spx_wmat_row_f32(&tmp, 0, v);
    *out = v;
    return SPX_OK;
}

spx_status spx_model_bind_weights(spx_model *m, spx_err *e) {
    const spx_config *c = &m->cfg;
    int64_t H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    int64_t qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    char nm[256];
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    m->rope_inv_freq = malloc((size_t)(hd / 2) * sizeof(float));
    if (!m->layers || !m->rope_inv_freq) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", m->path);
    spx_rope_inv_freq(c, m->rope_inv_freq);

    SPX_TRY(bind_mat(m, "model.embed_tokens.weight", c->vocab_size, H, &m->embed, e));
    SPX_TRY(bind_vec(m, "model.norm.weight", H, 1, &m->final_norm, e));
    tref t;
    if (c->tie_embeddings) {
        m->lm_head = m->embed;
    } else if (find_tensor(m, "lm_head.weight", &t)) {
        SPX_TRY(bind_mat(m, "lm_head.weight", c->vocab_size, H, &m->lm_head, e));
    } else {
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: tensor 'lm_head.weight' is missing and config.json has tie_word_embeddings false",
                        m->path);
    }
    for (int64_t l = 0; l < c->n_layers; l++) {
        spx_layer *L = &m->layers[l];
#define NAME(s) (snprintf(nm, sizeof nm, "model.layers.%lld.%s", (long long)l, s), nm)
        SPX_TRY(bind_vec(m, NAME("input_layernorm.weight"), H, 1, &L->attn_norm, e));
        SPX_TRY(bind_vec(m, NAME("post_attention_layernorm.weight"), H, 1, &L->mlp_norm, e));
        SPX_TRY(bind_mat(m, NAME("self_attn.q_proj.weight"), qd, H, &L->wq, e));
        SPX_TRY(bind_mat(m, NAME("self_attn.k_proj.weight"), kvd, H, &L->wk, e));
        SPX_TRY(bind_mat(m, NAME("self_attn.v_proj.weight"), kvd, H, &L->wv, e));
        SPX_TRY(bind_mat(m, NAME("self_attn.o_proj.weight"), H, qd, &L->wo, e));
        SPX_TRY(bind_mat(m, NAME("mlp.gate_proj.weight"), I, H, &L->w_gate, e));
        SPX_TRY(bind_mat(m, NAME("mlp.up_proj.weight"), I, H, &L->w_up, e));
        SPX_TRY(bind_mat(m, NAME("mlp.down_proj.weight"), H, I, &L->w_down, e));
        if (c->qk_norm) {
            SPX_TRY(bind_vec(m, NAME("self_attn.q_norm.weight"), hd, 1, &L->q_norm, e));
            SPX_TRY(bind_vec(m, NAME("self_attn.k_norm.weight"), hd, 1, &L->k_norm, e));
        }
        if (c->qkv_bias) {
            SPX_TRY(bind_vec(m, NAME("self_attn.q_proj.bias"), qd, 1, &L->bq, e));
            SPX_TRY(bind_vec(m, NAME("self_attn.k_proj.bias"), kvd, 1, &L->bk, e));
            SPX_TRY(bind_vec(m, NAME("self_attn.v_proj.bias"), kvd, 1, &L->bv, e));
        }
        if (c->o_bias) SPX_TRY(bind_vec(m, NAME("self_attn.o_proj.bias"), H, 1, &L->bo, e));
        if (c->mlp_bias) {
            SPX_TRY(bind_vec(m, NAME("mlp.gate_proj.bias"), I, 1, &L->b_gate, e));
            SPX_TRY(bind_vec(m, NAME("mlp.up_proj.bias"), I, 1, &L->b_up, e));
            SPX_TRY(bind_vec(m, NAME("mlp.down_proj.bias"), H, 1, &L->b_down, e));
        }
#undef NAME
    }
    return SPX_OK;
}

/* ---- accounting ---------------------------------------------------------- */

uint64_t spx_model_bytes_per_token(const spx_model *m) {
    uint64_t b = spx_wmat_bytes(&m->lm_head) + spx_wmat_bytes(&m->embed) / (uint64_t)m->embed.rows;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const spx_layer *L = &m->layers[l];
        const spx_wmat *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) b += spx_wmat_bytes(w[i]);
    }
    return b;
}
