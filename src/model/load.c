/* load.c: binds a model's weights from its tensor source (safetensors or
 * .trdc) into spx_model by slot (model/arch.h), checking every name, shape
 * and dtype first; RoPE frequencies. */
#include "model/model.h"
#include "core/half.h"
#include "format/trdc_source.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void spx_rope_inv_freq(const spx_config *c, float *out) {
    int64_t half = c->head_dim / 2;
    if (!c->rope) { /* attention without positions: every angle 0, the identity rotation */
        for (int64_t i = 0; i < half; i++) out[i] = 0.0f;
        return;
    }
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
        out[i] = f; /* float32 whatever the checkpoint's dtype (docs/numerics.md) */
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

/* Small tensors (norm gains, biases, conv kernels, A_log, D) are
 * converted to owned float32; ndim/dims: the expected source shape. */
static spx_status bind_vec(spx_model *m, const char *name, int ndim, const int64_t *dims, int required, float **out,
                           spx_err *e) {
    *out = NULL;
    tref t;
    if (!find_tensor(m, name, &t)) {
        if (!required) return SPX_OK;
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s' is missing", m->path, name);
    }
    int ok = !t.quant && t.ndim == ndim;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) ok = ok && t.shape[i] == dims[i], n *= dims[i];
    if (!ok) {
        char got[96] = "", want[96] = "";
        for (int i = 0; i < t.ndim && i < 8; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t.shape[i]);
        for (int i = 0; i < ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "", (long long)dims[i]);
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s' has shape [%s]%s, expected [%s]", t.file, name, got,
                        t.quant ? " (quantized)" : "", want);
    }
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

/* Expert e of stack slot s: the family's per-expert tensor, or a slice of
 * its stacked 3-D tensor (an HF checkpoint; a dense .trdc copy), or the
 * "STACKED.e" 2-D tensor a .trdc holds (quantized per expert). */
static spx_status bind_expert(spx_model *m, int64_t l, spx_slot s, int64_t ex, const int64_t d[3], spx_wmat *w,
                              spx_err *e) {
    char nm[256], st[256];
    if (spx_expert_tensor_name(&m->cfg, l, s, ex, nm, sizeof nm)) {
        spx_slot_tensor_name(&m->cfg, l, s, st, sizeof st);
        tref t;
        if (find_tensor(m, st, &t)) {
            if (t.quant || t.ndim != 3 || t.shape[0] != d[0] || t.shape[1] != d[1] || t.shape[2] != d[2])
                return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld] (%d dims%s), expected "
                                "[%lld, %lld, %lld]", t.file, st, (long long)t.shape[0], (long long)t.shape[1],
                                (long long)t.shape[2], t.ndim, t.quant ? ", quantized" : "", (long long)d[0],
                                (long long)d[1], (long long)d[2]);
            if (!is_float_dtype(t.dtype))
                return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; expected F32, F16 or BF16",
                                t.file, st, spx_dtype_name(t.dtype));
            memset(w, 0, sizeof *w);
            w->rows = d[1];
            w->cols = d[2];
            w->kind = SPX_WM_DENSE;
            w->dtype = t.dtype;
            w->data = (const uint8_t *)t.data + (size_t)ex * (size_t)(d[1] * d[2]) * spx_dtype_size(t.dtype);
            if (d[2] > m->max_cols) m->max_cols = d[2];
            return SPX_OK;
        }
    }
    return bind_mat(m, nm, d[1], d[2], w, e);
}

spx_status spx_model_bind_weights(spx_model *m, spx_err *e) {
    const spx_config *c = &m->cfg;
    int64_t H = c->hidden_size, hd = c->head_dim;
    char nm[256];
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    m->rope_inv_freq = malloc((size_t)(hd / 2 > 0 ? hd / 2 : 1) * sizeof(float));
    if (!m->layers || !m->rope_inv_freq) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", m->path);
    spx_rope_inv_freq(c, m->rope_inv_freq);

    SPX_TRY(bind_mat(m, spx_arch_embed_name(c), c->vocab_size, H, &m->embed, e));
    SPX_TRY(bind_vec(m, spx_arch_final_norm_name(c), 1, &H, 1, &m->final_norm, e));
    tref t;
    const char *head = spx_arch_lm_head_name(c);
    if (c->tie_embeddings) {
        m->lm_head = m->embed;
    } else if (find_tensor(m, head, &t)) {
        SPX_TRY(bind_mat(m, head, c->vocab_size, H, &m->lm_head, e));
    } else {
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: tensor '%s' is missing and config.json has tie_word_embeddings false", m->path, head);
    }
    int64_t kv = 0, state = 0;
    for (int64_t l = 0; l < c->n_layers; l++) {
        spx_layer *L = &m->layers[l];
        for (int s = 0; s < SPX_SL_COUNT; s++) {
            int64_t d[3];
            int nd = spx_slot_shape(c, l, (spx_slot)s, d);
            if (!nd) continue;
            spx_slot_tensor_name(c, l, (spx_slot)s, nm, sizeof nm);
            if (spx_slots[s].mat == 2) {
                if (!(L->xw[s] = calloc((size_t)d[0], sizeof *L->xw[s])))
                    return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", m->path);
                for (int64_t x = 0; x < d[0]; x++) SPX_TRY(bind_expert(m, l, (spx_slot)s, x, d, &L->xw[s][x], e));
            } else if (spx_slots[s].mat) SPX_TRY(bind_mat(m, nm, d[0], d[1], &L->w[s], e));
            else SPX_TRY(bind_vec(m, nm, nd, d, 1, &L->v[s], e));
        }
        L->kv_index = c->mixer[l] == SPX_MIX_ATTN ? kv++ : -1;
        int64_t sf = spx_layer_state_floats(c, l);
        L->state_off = sf ? state : -1;
        state += sf;
    }
    m->state_floats = state;
    return SPX_OK;
}

void spx_model_free_layers(spx_model *m) {
    if (!m->layers) return;
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int s = 0; s < SPX_SL_COUNT; s++) free(m->layers[l].v[s]), free(m->layers[l].xw[s]);
}

/* ---- accounting ---------------------------------------------------------- */

/* A decode step reads moe_top_k of a MoE layer's n_experts experts: their
 * mean size times k (the experts of one stack are alike in size). */
uint64_t spx_model_bytes_per_token(const spx_model *m) {
    uint64_t b = spx_wmat_bytes(&m->lm_head) + spx_wmat_bytes(&m->embed) / (uint64_t)m->embed.rows;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const spx_layer *L = &m->layers[l];
        b += spx_layer_matrix_bytes(L);
        for (int s = 0; s < SPX_SL_COUNT; s++) {
            if (!L->xw[s]) continue;
            uint64_t all = 0;
            for (int64_t x = 0; x < m->cfg.n_experts; x++) all += spx_wmat_bytes(&L->xw[s][x]);
            b += all * (uint64_t)m->cfg.moe_top_k / (uint64_t)m->cfg.n_experts;
        }
    }
    return b;
}

uint64_t spx_layer_matrix_bytes(const spx_layer *L) {
    uint64_t b = 0;
    for (int s = 0; s < SPX_SL_COUNT; s++)
        if (spx_slots[s].mat && L->w[s].rows) b += spx_wmat_bytes(&L->w[s]);
    return b;
}
