/* compress.c: HF safetensors folder -> .trdc (see compress.h). */
#include "quant/compress.h"
#include "core/mapfile.h"
#include "core/pool.h"
#include "core/util.h"
#include "format/chat_info.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "format/trdc.h"
#include "model/model.h"
#include "quant/g32.h"
#include "quant/saliency.h"
#include "refine/bundle_write.h"
#include "refine/refine_write.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define TEXT_MAX ((size_t)256 << 20) /* config / tokenizer files */

typedef struct {
    const spx_st_tensor *t;
    int64_t rows, cols;
    double *acc;        /* [threads, cols] column sums of squares */
    float *rowbuf;      /* [threads, cols] */
    int *bad_row;       /* [threads]: first non-finite row, or -1 */
    spx_qbuf *qb;
    int method;
    const float *imp;
    int magnitude;      /* weight each element's error by (group rms + |w|) */
    int group;
    float *elemw;       /* [threads, cols] */
} qjob;

static void colnorm_task(void *arg, int tid, int nth) {
    qjob *j = arg;
    int64_t r0, r1;
    spx_pool_range(j->rows, tid, nth, 1, &r0, &r1);
    double *acc = j->acc + (size_t)tid * (size_t)j->cols;
    float *row = j->rowbuf + (size_t)tid * (size_t)j->cols;
    memset(acc, 0, (size_t)j->cols * sizeof *acc);
    j->bad_row[tid] = -1;
    for (int64_t r = r0; r < r1; r++) {
        spx_st_row_f32(j->t, r * j->cols, j->cols, row);
        for (int64_t c = 0; c < j->cols; c++)
            if (!isfinite(row[c]) && j->bad_row[tid] < 0) j->bad_row[tid] = (int)(r < INT_MAX ? r : INT_MAX);
        spx_colnorm_accum(acc, row, j->cols);
    }
}

static void quant_task(void *arg, int tid, int nth) {
    qjob *j = arg;
    int64_t r0, r1;
    spx_pool_range(j->rows, tid, nth, 1, &r0, &r1);
    float *row = j->rowbuf + (size_t)tid * (size_t)j->cols;
    float *ew = j->magnitude ? j->elemw + (size_t)tid * (size_t)j->cols : NULL;
    for (int64_t r = r0; r < r1; r++) {
        spx_st_row_f32(j->t, r * j->cols, j->cols, row);
        if (ew) {
            /* K-quant style: big weights matter more (ggml make_qkx2_quants
             * weights av_x + |x|), times the column importance */
            for (int64_t g0 = 0; g0 < j->cols; g0 += j->group) {
                double ss = 0;
                for (int k = 0; k < j->group; k++) ss += (double)row[g0 + k] * row[g0 + k];
                float rms = (float)sqrt(ss / j->group);
                for (int k = 0; k < j->group; k++)
                    ew[g0 + k] = (j->imp ? j->imp[g0 + k] : 1.0f) * (rms + fabsf(row[g0 + k]));
            }
        }
        spx_qbuf_set_row(j->qb, r, row, j->method, ew ? ew : j->imp);
    }
}

static int is_float(spx_dtype d) { return d == SPX_DT_F32 || d == SPX_DT_F16 || d == SPX_DT_BF16; }

typedef struct {
    spx_pool *pool;
    double *acc;
    float *rowbuf, *S, *gamma, *imp, *elemw;
    int32_t *idx;
    int *bad;
    int64_t cap_cols;
} workspace;

static spx_status ws_reserve(workspace *w, int64_t cols, spx_err *e) {
    if (cols <= w->cap_cols) return SPX_OK;
    size_t th = (size_t)spx_pool_size(w->pool), c = (size_t)cols;
    free(w->acc); free(w->rowbuf); free(w->S); free(w->gamma); free(w->imp); free(w->idx); free(w->elemw);
    w->elemw = malloc(th * c * sizeof(float));
    w->acc = malloc(th * c * sizeof(double));
    w->rowbuf = malloc(th * c * sizeof(float));
    w->S = malloc(c * sizeof(float));
    w->gamma = malloc(c * sizeof(float));
    w->imp = malloc(c * sizeof(float));
    w->idx = malloc(c * sizeof(int32_t));
    if (!w->acc || !w->rowbuf || !w->S || !w->gamma || !w->imp || !w->idx || !w->elemw)
        return spx_fail(e, SPX_ERR_NOMEM, "compress: out of memory for a %lld-column workspace", (long long)cols);
    w->cap_cols = cols;
    return SPX_OK;
}

/* ---- calibration-free importance of input channels (--importance gamma) --
 *
 * The MSE search can weight each column's squared error by an estimate of
 * E[x_j^2] of the activations that multiply it, from the weights alone:
 * projections fed by a norm (q/k/v/gate/up) see x = normalized * gamma, so
 * E[x_j^2] ~ gamma_j^2; the LM head reads the final norm's output, same
 * rule. Other tensors are unweighted. On docllama-58m this moved KL by
 * under 1 % either way (bench/results), so the CLI default is none. */
static const float *norm_gain(const spx_st *st, const char *name, int64_t n, float *buf) {
    const spx_st_tensor *g = spx_st_find(st, name);
    if (!g || g->ndim != 1 || g->shape[0] != n || !is_float(g->dtype)) return NULL;
    spx_st_row_f32(g, 0, n, buf);
    return buf;
}

static void importance(const spx_config *cfg, const spx_st *st, const spx_st_tensor *t, const float *gamma,
                       workspace *w, int *have) {
    int64_t cols = t->shape[1];
    *have = 0;
    if (!gamma && (!strcmp(t->name, spx_arch_lm_head_name(cfg)) ||
                   (cfg->tie_embeddings && !strcmp(t->name, spx_arch_embed_name(cfg)))))
        gamma = norm_gain(st, spx_arch_final_norm_name(cfg), cols, w->gamma);
    if (!gamma) return;
    for (int64_t c = 0; c < cols; c++) w->imp[c] = gamma[c] * gamma[c];
    *have = 1;
}

static spx_status quantize_tensor(const spx_compress_opts *o, const spx_config *cfg, const spx_st *st,
                                  const spx_st_tensor *t, workspace *w, spx_trdc_writer *wr, spx_trdc_writer *rw,
                                  spx_bundle_collect *bc, int64_t *n_out, spx_compress_stats *stats, spx_err *e) {
    int64_t rows = t->shape[0], cols = t->shape[1];
    SPX_TRY(ws_reserve(w, cols, e));
    int nth = spx_pool_size(w->pool);
    qjob j = {t, rows, cols, w->acc, w->rowbuf, w->bad, NULL, o->method, NULL,
              o->method == SPX_Q_MSE && o->magnitude, o->group, w->elemw};
    spx_pool_run(w->pool, colnorm_task, &j);
    for (int k = 0; k < nth; k++)
        if (w->bad[k] >= 0)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s' has a non-finite value in row %d", t->file, t->name,
                            w->bad[k]);
    for (int k = 1; k < nth; k++)
        for (int64_t c = 0; c < cols; c++) w->acc[c] += w->acc[(size_t)k * (size_t)cols + (size_t)c];

    /* gamma: the gain of the norm that feeds this projection (data per arch) */
    char nm[512];
    const char *norm = spx_arch_feeding_norm(cfg, t->name, nm, sizeof nm);
    const spx_st_tensor *g = norm ? spx_st_find(st, norm) : NULL;
    const float *gamma = NULL;
    if (g && g->ndim == 1 && g->shape[0] == cols && is_float(g->dtype)) {
        spx_st_row_f32(g, 0, cols, w->gamma);
        gamma = w->gamma;
    }
    spx_saliency_finish(w->acc, gamma, cols, w->S);
    int64_t n = 0;
    double kappa = NAN;
    SPX_TRY(spx_outliers_choose(w->S, cols, o->outlier_mode, o->outlier_ratio, w->idx, &n, &kappa, e));
    double r = (double)n / (double)cols;
    if (o->method == SPX_Q_MSE && o->importance == SPX_IMP_GAMMA) {
        int have = 0;
        importance(cfg, st, t, gamma, w, &have);
        if (have) j.imp = w->imp;
    }
    spx_qbuf qb;
    SPX_TRY(spx_qbuf_init(&qb, rows, cols, o->bits, o->group, n ? w->idx : NULL, n, e));
    j.qb = &qb;
    spx_pool_run(w->pool, quant_task, &j);
    spx_qtensor lq;
    void *mem;
    spx_status s = spx_q_as_layout(&qb.q, o->row_major, &lq, &mem, e);
    if (s == SPX_OK) s = spx_trdc_writer_add_quant(wr, t->name, &lq, kappa, r, e);
    if (s == SPX_OK) { /* what the file holds for it, layout padding included */
        stats->quant_codes_bytes += (uint64_t)spx_q_codes_bytes(rows, cols, lq.bits, lq.layout);
        stats->quant_scales_bytes += (uint64_t)spx_q_scales_bytes(rows, cols, lq.group, lq.layout);
        stats->quant_zeros_bytes += (uint64_t)spx_q_zeros_bytes(rows, cols, lq.group, lq.layout);
        stats->quant_outlier_bytes += (uint64_t)n * (4 + 2 * (uint64_t)rows);
    }
    /* the residual of a layer matrix (the embedding is a gather and the LM
     * head runs once per token unrefined), against the codes as written */
    if (s == SPX_OK && rw && strcmp(t->name, spx_arch_embed_name(cfg)) && strcmp(t->name, spx_arch_lm_head_name(cfg))) {
        const size_t cb = (size_t)spx_q_codes_bytes(rows, cols, lq.bits, lq.layout);
        uLong crc = crc32(0L, Z_NULL, 0);
        for (size_t off = 0; off < cb; off += (size_t)1 << 24) { /* zlib takes uInt lengths */
            const size_t k = cb - off < ((size_t)1 << 24) ? cb - off : ((size_t)1 << 24);
            crc = crc32(crc, lq.codes + off, (uInt)k);
        }
        spx_refine_q4buf kept = {0};
        const int keep = spx_bundle_collect_wants(bc, t->name); /* a gated MLP's matrix: its bundles use it */
        s = spx_refine_write_tensor(rw, w->pool, t, &qb.q, (uint32_t)crc, &stats->refine_bytes, keep ? &kept : NULL, e);
        if (s == SPX_OK) stats->n_refine++;
        if (s == SPX_OK && keep) s = spx_bundle_collect_add(bc, rw, st, t->name, &kept, &stats->bundle_bytes, e);
        spx_refine_q4buf_free(&kept);
    }
    free(mem);
    spx_qbuf_free(&qb);
    *n_out = n;
    return s;
}

static spx_status read_opt_text(const char *dir, const char *name, char **out, spx_err *e) {
    *out = NULL;
    char *p = spx_path_join(dir, name);
    if (!p) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    spx_status s = SPX_OK;
    if (spx_file_exists(p)) s = spx_read_file(p, TEXT_MAX, out, NULL, e);
    free(p);
    return s;
}

spx_status spx_compress(const spx_compress_opts *o, spx_compress_stats *stats, spx_err *e) {
    memset(stats, 0, sizeof *stats);
    double t0 = spx_now();
    if (!spx_q_group_stored_ok(o->group) || o->bits < 2 || o->bits > 4)
        return spx_fail(e, SPX_ERR_ARG, "compress: bits %d / group %d not supported (bits 2..4, group 32/64/128)",
                        o->bits, o->group);
    char *cfg_text = NULL, *tok = NULL, *tokcfg = NULL;
    spx_config cfg;
    spx_st *st = NULL;
    spx_trdc_writer *wr = NULL, *rw = NULL;
    spx_bundle_collect *bc = NULL;
    workspace w = {0};
    w.bad = NULL;
    spx_status s;
    char *cfg_path = spx_path_join(o->src_dir, "config.json");
    if (!cfg_path) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    s = spx_read_file(cfg_path, TEXT_MAX, &cfg_text, NULL, e);
    if (s == SPX_OK) s = spx_config_parse(cfg_text, strlen(cfg_text), cfg_path, &cfg, e);
    free(cfg_path);
    if (s == SPX_OK) s = read_opt_text(o->src_dir, "tokenizer.json", &tok, e);
    if (s == SPX_OK) s = read_opt_text(o->src_dir, "tokenizer_config.json", &tokcfg, e);
    if (s == SPX_OK) { /* a chat_template.jinja (newer transformers) travels inside tokenizer_config.json */
        char *jinja = NULL, *merged = NULL;
        s = read_opt_text(o->src_dir, "chat_template.jinja", &jinja, e);
        if (s == SPX_OK && jinja) s = spx_chat_info_embed(tokcfg, jinja, o->src_dir, &merged, e);
        if (merged) {
            free(tokcfg);
            tokcfg = merged;
        }
        free(jinja);
    }
    if (s == SPX_OK) s = spx_st_open(o->src_dir, &st, e);
    if (s == SPX_OK) s = spx_pool_new(o->n_threads, &w.pool, e);
    if (s == SPX_OK && !(w.bad = calloc((size_t)spx_pool_size(w.pool), sizeof(int))))
        s = spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    if (s == SPX_OK) s = spx_trdc_writer_open(o->out_path, &wr, e);
    if (s == SPX_OK && o->refine_path) s = spx_trdc_writer_open(o->refine_path, &rw, e);
    if (s == SPX_OK && rw && o->refine_bundles) s = spx_bundle_collect_new(&cfg, &bc, e);
    if (s != SPX_OK) goto done;

    size_t n = spx_st_count(st);
    uint64_t bytes_total = 0, bytes_done = 0;
    for (size_t i = 0; i < n; i++) bytes_total += spx_st_at(st, i)->nbytes;
    for (size_t i = 0; i < n && s == SPX_OK; i++) {
        const spx_st_tensor *t = spx_st_at(st, i);
        stats->n_tensors++;
        stats->params += t->numel;
        /* the slot decides: small tensors (norms, the MoE router) stay
         * float; an expert stack is quantized expert by expert, a stacked
         * 3-D tensor as its experts' 2-D "NAME.e" (model/arch.h); experts
         * carry no refinement residuals (StrataFlux-W binds dense slots) */
        int64_t layer = -1;
        const int slot = spx_arch_tensor_slot(&cfg, t->name, &layer);
        const int expert = slot >= 0 && spx_slots[slot].mat == 2;
        const int nd = expert && t->ndim == 3 ? 3 : 2;
        int quant = t->ndim == nd && is_float(t->dtype) && t->shape[nd - 1] % o->group == 0 && t->shape[nd - 2] > 0 &&
                    !(slot >= 0 && !spx_slots[slot].mat);
        for (int k = 0; k < o->n_keep && quant; k++)
            if (strstr(t->name, o->keep[k])) quant = 0;
        if (quant && nd == 3) {
            char en[256];
            for (int64_t x = 0; x < t->shape[0] && s == SPX_OK; x++) {
                spx_st_tensor te = *t;
                spx_expert_tensor_name(&cfg, layer, (spx_slot)slot, x, en, sizeof en);
                te.name = en;
                te.ndim = 2;
                te.shape[0] = t->shape[1];
                te.shape[1] = t->shape[2];
                te.numel = t->shape[1] * t->shape[2];
                te.nbytes = (size_t)te.numel * spx_dtype_size(t->dtype);
                te.data = (const uint8_t *)t->data + (size_t)x * te.nbytes;
                int64_t no = 0;
                s = quantize_tensor(o, &cfg, st, &te, &w, wr, NULL, NULL, &no, stats, e);
                stats->n_outlier_cols += no;
                stats->n_quant++; /* tensors written: the experts one by one */
            }
            stats->n_tensors += t->shape[0] - 1;
            stats->params_quant += t->numel;
        } else if (quant) {
            int64_t no = 0;
            s = quantize_tensor(o, &cfg, st, t, &w, wr, expert ? NULL : rw, expert ? NULL : bc, &no, stats, e);
            stats->n_quant++;
            stats->params_quant += t->numel;
            stats->n_outlier_cols += no;
        } else {
            s = spx_trdc_writer_add_dense(wr, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, e);
        }
        spx_map_release(t->data, t->nbytes);
        bytes_done += t->nbytes;
        if (o->progress && s == SPX_OK) o->progress(o->user, (int64_t)i + 1, (int64_t)n, t->name, bytes_done, bytes_total);
    }
    if (s != SPX_OK) goto done;
    stats->source_bytes = bytes_total;
    stats->n_bundle_layers = spx_bundle_collect_layers(bc);
    char qs[256];
    char outl[64];
    if (o->outlier_mode == SPX_OUTLIERS_AUTO) snprintf(outl, sizeof outl, "\"auto\"");
    else if (o->outlier_mode == SPX_OUTLIERS_OFF) snprintf(outl, sizeof outl, "\"off\"");
    else snprintf(outl, sizeof outl, "%.17g", o->outlier_ratio);
    snprintf(qs, sizeof qs,
             "{\"bits\": %d, \"group\": %d, \"outliers\": %s, \"method\": \"%s\", \"importance\": \"%s\", "
             "\"magnitude\": %s, \"saliency\": \"norm-gain\"}",
             o->bits, o->group, outl, o->method == SPX_Q_MSE ? "mse" : "minmax",
             o->importance == SPX_IMP_GAMMA ? "gamma" : "none",
             o->magnitude ? "true" : "false");
    /* source info: sizes, and where it came from (audit finds it there) */
    char *real = realpath(o->src_dir, NULL);
    cJSON *sj = cJSON_CreateObject();
    cJSON_AddNumberToObject(sj, "bytes", (double)bytes_total);
    cJSON_AddNumberToObject(sj, "params", (double)stats->params);
    cJSON_AddNumberToObject(sj, "tensors", (double)stats->n_tensors);
    cJSON_AddStringToObject(sj, "path", real ? real : o->src_dir);
    char *src = cJSON_PrintUnformatted(sj);
    cJSON_Delete(sj);
    free(real);
    if (!src) { s = spx_fail(e, SPX_ERR_NOMEM, "out of memory"); goto done; }
    /* the .refine first: a failure there leaves no model file that looks paired with a missing one */
    if (rw) {
        char rs[768];
        snprintf(rs, sizeof rs, "{\"refine\": {\"bits\": 4, \"layout\": \"column\", \"scales\": \"float32 per row\", "
                                "\"base\": %s}}", qs);
        s = spx_trdc_writer_finish(rw, cfg_text, NULL, NULL, rs, src, e);
        rw = NULL;
    }
    if (s == SPX_OK) s = spx_trdc_writer_finish(wr, cfg_text, tok, tokcfg, qs, src, e);
    else spx_trdc_writer_abort(wr);
    free(src);
    wr = NULL;
    if (s == SPX_OK) {
        spx_map m;
        spx_err e2;
        spx_err_clear(&e2);
        if (spx_map_open(o->out_path, &m, &e2) == SPX_OK) {
            stats->out_bytes = m.size;
            spx_map_close(&m);
        }
    }
done:
    spx_bundle_collect_free(bc);
    if (wr) spx_trdc_writer_abort(wr);
    if (rw) spx_trdc_writer_abort(rw);
    spx_st_free(st);
    spx_pool_free(w.pool);
    free(w.acc); free(w.rowbuf); free(w.S); free(w.gamma); free(w.imp); free(w.idx); free(w.elemw); free(w.bad);
    free(cfg_text); free(tok); free(tokcfg);
    stats->seconds = spx_now() - t0;
    return s;
}
