/* load.c: binds a model's weights from its tensor source (safetensors or
 * .trdc) into spx_model by slot (model/arch.h), checking every name, shape
 * and dtype first; RoPE frequencies. */
#include "model/model.h"
#include "core/half.h"
#include "core/mapfile.h"
#include "format/trdc_source.h"
#include "quant/g32.h"

#include <sys/mman.h>

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
                L->n_xw = d[0];
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

/* One matrix's repack into its own block (mem), the view switched over. */
static spx_status untile_one(spx_wmat *w, void **mem, spx_err *e) {
    spx_qtensor rows;
    SPX_TRY(spx_q_untile_alloc(&w->q, &rows, mem, e));
    const size_t bytes = spx_wmat_bytes(w);
#ifdef MADV_HUGEPAGE
    if (bytes >= ((size_t)2 << 20)) { /* the 2 MiB-aligned interior of the block; a hint */
        uintptr_t b = ((uintptr_t)*mem + ((uintptr_t)2 << 20) - 1) & ~(((uintptr_t)2 << 20) - 1);
        uintptr_t end = ((uintptr_t)*mem + bytes) & ~(((uintptr_t)2 << 20) - 1);
        if (end > b) madvise((void *)b, end - b, MADV_HUGEPAGE);
    }
#endif
    /* the map's pages of the tiled codes leave this process (the file's
     * pages, never a private copy: spx_model_make_resident untiles first) */
    spx_map_release(w->q.codes, (size_t)spx_q_codes_bytes(w->q.rows, w->q.cols, w->q.bits, w->q.layout));
    w->q = rows;
    return SPX_OK;
}

typedef struct {
    spx_wmat **w;
    void **mem;
    spx_status *st;
    spx_err *err;
    size_t n;
} untile_job;

/* matrices dealt to the threads in turn (their sizes vary by 10x) */
static void untile_task(void *arg, int tid, int nth) {
    untile_job *j = arg;
    for (size_t i = (size_t)tid; i < j->n; i += (size_t)nth) {
        spx_err_clear(&j->err[i]);
        j->st[i] = untile_one(j->w[i], &j->mem[i], &j->err[i]);
    }
}

static int tiled_quant(const spx_wmat *w) { return w->kind == SPX_WM_QUANT && w->q.layout == SPX_Q_TILED; }

spx_status spx_model_untile_weights(spx_model *m, int64_t *n_done, spx_err *e) {
    *n_done = 0;
    const int tied = m->lm_head.kind == SPX_WM_QUANT && m->lm_head.q.codes == m->embed.q.codes;
    size_t n = 0, cap = 2;
    for (int pass = 0; pass < 2; pass++) { /* count, then list */
        untile_job j = {0};
        if (pass) {
            if (!cap) return SPX_OK;
            j.w = calloc(cap, sizeof *j.w), j.mem = calloc(cap, sizeof *j.mem);
            j.st = calloc(cap, sizeof *j.st), j.err = calloc(cap, sizeof *j.err);
            void **ow = j.w && j.mem && j.st && j.err ? realloc(m->owned, (m->n_owned + cap) * sizeof *ow) : NULL;
            if (!ow) {
                free(j.w), free(j.mem), free(j.st), free(j.err);
                return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", m->path);
            }
            m->owned = ow;
        }
        n = 0;
#define TAKE(wp) do { if (tiled_quant(wp)) { if (pass) j.w[n] = (wp); n++; } } while (0)
        TAKE(&m->embed);
        if (!tied) TAKE(&m->lm_head);
        for (int64_t l = 0; l < m->cfg.n_layers; l++) {
            spx_layer *L = &m->layers[l];
            for (int s = 0; s < SPX_SL_COUNT; s++) {
                if (spx_slots[s].mat == 1 && L->w[s].rows) TAKE(&L->w[s]);
                for (int64_t x = 0; L->xw[s] && x < L->n_xw; x++) TAKE(&L->xw[s][x]);
            }
        }
#undef TAKE
        if (!pass) {
            cap = n;
            continue;
        }
        j.n = n;
        spx_pool_run(m->pool, untile_task, &j);
        spx_status st = SPX_OK;
        for (size_t i = 0; i < n; i++) {
            if (j.mem[i]) m->owned[m->n_owned++] = j.mem[i], (*n_done)++;
            if (j.st[i] != SPX_OK && st == SPX_OK) *e = j.err[i], st = j.st[i];
        }
        if (tied) m->lm_head = m->embed;
        free(j.w), free(j.mem), free(j.st), free(j.err);
        return st;
    }
    return SPX_OK;
}

void spx_model_free_layers(spx_model *m) {
    for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    m->owned = NULL;
    m->n_owned = 0;
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
        const uint64_t x = spx_layer_expert_bytes(L);
        b += spx_layer_matrix_bytes(L) - x;
        if (x) b += x * (uint64_t)m->cfg.moe_top_k / (uint64_t)L->n_xw;
    }
    return b;
}

uint64_t spx_layer_expert_bytes(const spx_layer *L) {
    uint64_t b = 0;
    for (int s = 0; s < SPX_SL_COUNT; s++)
        for (int64_t x = 0; L->xw[s] && x < L->n_xw; x++) b += spx_wmat_bytes(&L->xw[s][x]);
    return b;
}

uint64_t spx_layer_matrix_bytes(const spx_layer *L) {
    uint64_t b = 0;
    for (int s = 0; s < SPX_SL_COUNT; s++)
        if (spx_slots[s].mat == 1 && L->w[s].rows) b += spx_wmat_bytes(&L->w[s]);
    return b + spx_layer_expert_bytes(L);
}
