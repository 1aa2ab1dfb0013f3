/* fit_model.c: a fitted .refine for a compressed model (fit_model.h):
 * calibration windows through the CPU forward pass with an observer on
 * the matmul, then eq. 4 per matrix and the 4-bit writer. */
#include "refine/fit_model.h"
#include "core/util.h"
#include "engine/session.h"
#include "format/safetensors.h"
#include "format/trdc.h"
#include "model/arch.h"
#include "model/model.h"
#include "quant/g32.h"
#include "refine/fit.h"
#include "refine/refine.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEXT_MAX ((size_t)1 << 30) /* calibration text bytes */

typedef struct {
    spx_model *m;
    const int64_t *k;
    spx_refine_fit_stats *stats; /* [n_layers * SPX_SL_COUNT], by the launch's first matrix */
    int8_t *head;                /* [n_layers * SPX_SL_COUNT]: each matrix's launch head slot, -1: not seen */
    uint8_t *skip;               /* [max cols] */
    uint64_t bytes;
    int64_t n_inputs;
    spx_status st;
    spx_err err;
} fit_state;

static void say(const spx_refine_fit_opts *o, const char *fmt, ...) SPX_PRINTF(2, 3);
static void say(const spx_refine_fit_opts *o, const char *fmt, ...) {
    if (!o->progress) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    o->progress(o->user, buf);
}

/* The layer and slot of a layer matrix, or 0 (the LM head, ...). */
static int locate(const spx_model *m, const spx_wmat *w, int64_t *l, int *s) {
    for (int64_t i = 0; i < m->cfg.n_layers; i++) {
        const spx_wmat *b = m->layers[i].w;
        if (w >= b && w < b + SPX_SL_COUNT) {
            *l = i;
            *s = (int)(w - b);
            return 1;
        }
    }
    return 0;
}

static void observe(void *user, int n, const spx_wmat *const *w, const float *x, int64_t T) {
    fit_state *f = user;
    int64_t l;
    int s0;
    if (f->st != SPX_OK || w[0]->kind != SPX_WM_QUANT || !locate(f->m, w[0], &l, &s0)) return;
    int8_t *head = f->head + l * SPX_SL_COUNT;
    for (int k = 0; k < n; k++) {
        int64_t lk;
        int sk;
        if (!locate(f->m, w[k], &lk, &sk) || lk != l || (head[sk] >= 0 && head[sk] != s0)) {
            f->st = spx_fail(&f->err, SPX_ERR_INTERNAL, "refinement fit: layer %lld's %s matrix is fed by two different "
                             "launches", (long long)l, spx_slots[s0].key);
            return;
        }
        head[sk] = (int8_t)s0;
    }
    spx_refine_fit_stats *st = &f->stats[l * SPX_SL_COUNT + s0];
    if (!st->gt) {
        const spx_qtensor *q = &w[0]->q;
        if (q->n_outliers > 0) spx_refine_skip_outliers(q, f->skip);
        f->st = spx_refine_fit_stats_init(st, w[0]->cols, f->k[spx_slots[s0].rset], q->n_outliers > 0 ? f->skip : NULL,
                                          &f->err);
        if (f->st != SPX_OK) return;
        f->bytes += spx_refine_fit_stats_bytes(w[0]->cols);
        f->n_inputs++;
    }
    f->st = spx_refine_fit_stats_add(st, f->m->pool, x, T, &f->err);
}

/* MemAvailable from /proc/meminfo in bytes, 0 if unknown. */
static uint64_t mem_available(void) {
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(fp);
    return (uint64_t)kb * 1024;
}

/* The statistics' bytes before running: one input per layer and set (the
 * first quantized matrix of the set gives its width), and the widest. */
static uint64_t stats_need(const spx_model *m, int64_t *widest) {
    uint64_t need = 0;
    *widest = 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        int seen[SPX_RSET_COUNT] = {0};
        for (int s = 0; s < SPX_SL_COUNT; s++) {
            const spx_wmat *w = &m->layers[l].w[s];
            if (!spx_slots[s].mat || w->kind != SPX_WM_QUANT || !w->rows || seen[spx_slots[s].rset]) continue;
            seen[spx_slots[s].rset] = 1;
            need += spx_refine_fit_stats_bytes(w->cols);
            if (w->cols > *widest) *widest = w->cols;
        }
    }
    return need;
}

static spx_status collect(const spx_refine_fit_opts *o, spx_model *m, fit_state *f, const int32_t *ids,
                          spx_refine_fit_result *r, spx_err *e) {
    const int32_t bos = spx_model_bos_id(m);
    const int64_t per = bos >= 0 ? o->ctx - 1 : o->ctx; /* text tokens a window */
    spx_session *s = NULL;
    spx_session_params sp = {.n_ctx = o->ctx, .kv = SPX_KV_DEFAULT};
    if (spx_session_new(m, &sp, &s) != SPX_OK) return spx_fail(e, SPX_ERR_ARG, "%s", spx_model_error(m));
    s->cpu.observe = observe;
    s->cpu.observe_user = f;
    int32_t *win = malloc((size_t)o->ctx * sizeof *win);
    spx_status st = win ? SPX_OK : spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    const double t0 = spx_now();
    for (int64_t w = 0; w < r->windows && st == SPX_OK; w++) {
        int64_t i = 0;
        if (bos >= 0) win[i++] = bos;
        memcpy(win + i, ids + w * per, (size_t)per * sizeof *win);
        spx_session_reset(s);
        if (spx_session_eval(s, win, (size_t)o->ctx, NULL, 0) != SPX_OK)
            st = spx_fail(e, SPX_ERR_ARG, "refinement fit: window %lld: %s", (long long)w, spx_session_error(s));
        else if (f->st != SPX_OK) {
            *e = f->err;
            st = f->st;
        }
        say(o, "fit: window %lld/%lld (%.1f s)", (long long)(w + 1), (long long)r->windows, spx_now() - t0);
    }
    r->collect_s = spx_now() - t0;
    free(win);
    spx_session_free(s);
    return st;
}

/* R = W - W^ for matrix w from the source tensor named `name`. */
static spx_status residual(const spx_st *src, const char *src_dir, const char *name, const spx_wmat *w, float *R,
                           float *row, spx_err *e) {
    const spx_st_tensor *t = spx_st_find(src, name);
    if (!t || t->ndim != 2 || t->shape[0] != w->rows || t->shape[1] != w->cols ||
        !(t->dtype == SPX_DT_F32 || t->dtype == SPX_DT_F16 || t->dtype == SPX_DT_BF16))
        return spx_fail(e, SPX_ERR_ARG, "%s: no float tensor '%s' of [%lld, %lld] (is it the folder the model was "
                        "compressed from?)", src_dir, name, (long long)w->rows, (long long)w->cols);
    for (int64_t r = 0; r < w->rows; r++) {
        float *Rr = R + r * w->cols;
        spx_st_row_f32(t, r * w->cols, w->cols, Rr);
        spx_q_dequant_row_f32(&w->q, r, row);
        for (int64_t c = 0; c < w->cols; c++) Rr[c] -= row[c]; /* float subtraction, as refine.h's residual */
    }
    return SPX_OK;
}

/* The checksum of the model file's codes for `name` (0 when absent). */
static uint32_t base_crc(const spx_model *m, const char *name) {
    const spx_trdc_tensor *t = spx_trdc_find(m->trdc, name);
    return t && t->kind == SPX_TRDC_QUANT && t->comp[SPX_TRDC_C_CODES].present ? t->comp[SPX_TRDC_C_CODES].crc32 : 0;
}

static spx_status solve_all(const spx_refine_fit_opts *o, spx_model *m, fit_state *f, const spx_st *src,
                            spx_trdc_writer *wr, spx_refine_fit_result *r, spx_err *e) {
    const double t0 = spx_now();
    float *R = NULL, *C = NULL, *row = malloc((size_t)m->max_cols * sizeof *row);
    size_t cap = 0;
    spx_status st = row ? SPX_OK : spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    char name[256];
    for (int64_t l = 0; l < m->cfg.n_layers && st == SPX_OK; l++)
        for (int h = 0; h < SPX_SL_COUNT && st == SPX_OK; h++) {
            spx_refine_fit_stats *stt = &f->stats[l * SPX_SL_COUNT + h];
            if (!stt->gt) continue;
            spx_refine_fit_solver fs;
            st = spx_refine_fit_factor(stt, -1, m->pool, &fs, e);
            for (int s = 0; s < SPX_SL_COUNT && st == SPX_OK; s++) {
                const spx_wmat *w = &m->layers[l].w[s];
                if (f->head[l * SPX_SL_COUNT + s] != h) continue;
                const size_t need = (size_t)w->rows * (size_t)w->cols;
                if (need > cap) {
                    free(R);
                    free(C);
                    R = malloc(need * sizeof *R);
                    C = malloc(need * sizeof *C);
                    cap = R && C ? need : 0;
                    if (!cap) {
                        st = spx_fail(e, SPX_ERR_NOMEM, "out of memory for a %lld x %lld matrix", (long long)w->rows,
                                      (long long)w->cols);
                        break;
                    }
                }
                spx_slot_tensor_name(&m->cfg, l, (spx_slot)s, name, sizeof name);
                st = residual(src, o->src_dir, name, w, R, row, e);
                if (st == SPX_OK) st = spx_refine_fit_solve(&fs, stt, m->pool, R, w->rows, C, e);
                spx_refine_q4buf b;
                if (st == SPX_OK) st = spx_refine_q4buf_init(&b, w->rows, w->cols, 0, e);
                if (st != SPX_OK) break;
                st = spx_refine_q4_set_values(&b, C, w->cols, 0, w->rows, e);
                if (st == SPX_OK)
                    st = spx_trdc_writer_add_refine(wr, name, w->rows, w->cols, b.v.col_stride, b.codes, b.scales,
                                                    base_crc(m, name), e);
                if (st == SPX_OK) {
                    r->refine_bytes += (uint64_t)w->cols * (uint64_t)b.v.col_stride + (uint64_t)w->rows * 4;
                    r->n_mats++;
                }
                spx_refine_q4buf_free(&b);
                say(o, "fit: layer %lld %s (input %s, lambda %.3g, %.1f s)", (long long)l, spx_slots[s].key,
                    spx_slots[h].key, fs.lambda, spx_now() - t0);
            }
            spx_refine_fit_solver_free(&fs);
            spx_refine_fit_stats_free(stt); /* the memory goes back as the layers are done */
        }
    free(R);
    free(C);
    free(row);
    r->solve_s = spx_now() - t0;
    return st;
}

/* quantization.refine with the model's settings as "base" and the fit. */
static char *manifest(const spx_refine_fit_opts *o, const spx_model *m, size_t text_bytes,
                      const spx_refine_fit_result *r) {
    cJSON *root = cJSON_CreateObject(), *rf = cJSON_CreateObject(), *fit = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "refine", rf);
    cJSON_AddNumberToObject(rf, "bits", 4);
    cJSON_AddStringToObject(rf, "layout", "column");
    cJSON_AddStringToObject(rf, "scales", "float32 per row");
    cJSON_AddItemToObject(rf, "base", cJSON_Duplicate(spx_trdc_quant_settings(m->trdc), 1));
    cJSON_AddItemToObject(rf, "fit", fit);
    const char *base = strrchr(o->text_path, '/');
    cJSON_AddStringToObject(fit, "text", base ? base + 1 : o->text_path);
    cJSON_AddNumberToObject(fit, "text_bytes", (double)text_bytes);
    cJSON_AddNumberToObject(fit, "tokens", (double)r->tokens);
    cJSON_AddNumberToObject(fit, "windows", (double)r->windows);
    cJSON_AddNumberToObject(fit, "ctx", (double)o->ctx);
    cJSON_AddStringToObject(fit, "pass", "prompt");
    double kd[4];
    for (int i = 0; i < 4; i++) kd[i] = (double)o->k[i];
    cJSON_AddItemToObject(fit, "k", cJSON_CreateDoubleArray(kd, 4));
    cJSON_AddNumberToObject(fit, "chunk", SPX_REFINE_CHUNK);
    cJSON_AddStringToObject(fit, "lambda", "mean diagonal of M_k");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

spx_status spx_refine_fit_write(const spx_refine_fit_opts *o, spx_refine_fit_result *r, spx_err *e) {
    memset(r, 0, sizeof *r);
    if (o->ctx < 2 || o->tokens < o->ctx)
        return spx_fail(e, SPX_ERR_ARG, "refinement fit: %lld tokens in windows of %lld (expected ctx >= 2 and tokens "
                        ">= ctx)", (long long)o->tokens, (long long)o->ctx);
    for (int i = 0; i < 4; i++)
        if (o->k[i] < 1 || o->k[i] > SPX_REFINE_CHUNK)
            return spx_fail(e, SPX_ERR_ARG, "refinement fit: k %lld for set %d (expected 1..%d channels per %d)",
                            (long long)o->k[i], i, SPX_REFINE_CHUNK, SPX_REFINE_CHUNK);
    char *text = NULL;
    size_t len = 0;
    SPX_TRY(spx_read_file(o->text_path, TEXT_MAX, &text, &len, e));
    if (len == 0) {
        free(text);
        return spx_fail(e, SPX_ERR_ARG, "%s: the calibration text is empty", o->text_path);
    }
    spx_model *m = NULL;
    spx_st *src = NULL;
    spx_trdc_writer *wr = NULL;
    int32_t *ids = NULL;
    fit_state f = {0};
    spx_status st = SPX_OK;
    spx_model_params mp = {0};
    mp.n_threads = o->n_threads;
    mp.backend = "cpu";
    if (spx_model_open(o->model_path, &mp, &m) != SPX_OK) {
        st = spx_fail(e, SPX_ERR_ARG, "%s", spx_last_error());
        goto done;
    }
    if (!m->trdc || !m->tok) {
        st = spx_fail(e, SPX_ERR_ARG, "%s: refinement fitting needs a compressed model (.trdc) with its tokenizer",
                      o->model_path);
        goto done;
    }
    if (o->ctx > spx_model_max_context(m)) {
        st = spx_fail(e, SPX_ERR_ARG, "refinement fit: windows of %lld tokens exceed %s's context of %lld",
                      (long long)o->ctx, o->model_path, (long long)spx_model_max_context(m));
        goto done;
    }
    size_t n_ids = len + 16;
    ids = malloc(n_ids * sizeof *ids);
    if (!ids) { st = spx_fail(e, SPX_ERR_NOMEM, "out of memory for the calibration tokens"); goto done; }
    st = spx_tokenize(m, text, len, 0, ids, &n_ids);
    if (st == SPX_ERR_RANGE) { /* more tokens than bytes + 16: grow once to the count reported */
        int32_t *n2 = realloc(ids, n_ids * sizeof *ids);
        if (!n2) { st = spx_fail(e, SPX_ERR_NOMEM, "out of memory for the calibration tokens"); goto done; }
        ids = n2;
        st = spx_tokenize(m, text, len, 0, ids, &n_ids);
    }
    if (st != SPX_OK) { st = spx_fail(e, st, "%s: %s", o->text_path, spx_model_error(m)); goto done; }
    r->text_tokens = (int64_t)n_ids;
    const int64_t per = spx_model_bos_id(m) >= 0 ? o->ctx - 1 : o->ctx;
    const int64_t avail = (int64_t)n_ids / per, want = o->tokens / o->ctx;
    if (avail < 1) {
        st = spx_fail(e, SPX_ERR_ARG, "%s: %lld tokens, fewer than one window of --fit-ctx %lld takes (%lld text "
                      "tokens after its BOS)", o->text_path, (long long)n_ids, (long long)o->ctx, (long long)per);
        goto done;
    }
    r->windows = avail < want ? avail : want;
    r->tokens = r->windows * o->ctx;
    if (avail < want)
        say(o, "fit: %s holds %lld tokens: %lld windows of %lld instead of %lld", o->text_path, (long long)n_ids,
            (long long)avail, (long long)o->ctx, (long long)want);
    int64_t widest;
    const uint64_t need = stats_need(m, &widest), have = mem_available();
    const uint64_t factor = (uint64_t)widest * (uint64_t)widest * sizeof(double);
    if (have && need + factor > have) {
        st = spx_fail(e, SPX_ERR_NOMEM, "refinement fit: the statistics need %.0f MiB (two %lld x %lld double "
                      "matrices per projection input, the widest %lld, plus one factor) and %.0f MiB are available",
                      (double)(need + factor) / 1048576.0, (long long)widest, (long long)widest, (long long)widest,
                      (double)have / 1048576.0);
        goto done;
    }
    const size_t ns = (size_t)m->cfg.n_layers * SPX_SL_COUNT;
    f.m = m;
    f.k = o->k;
    f.stats = calloc(ns, sizeof *f.stats);
    f.head = malloc(ns);
    f.skip = malloc((size_t)(m->max_cols > 0 ? m->max_cols : 1));
    if (!f.stats || !f.head || !f.skip) { st = spx_fail(e, SPX_ERR_NOMEM, "out of memory"); goto done; }
    memset(f.head, -1, ns);
    spx_err_clear(&f.err);
    say(o, "fit: %lld windows of %lld tokens from %s (%lld tokens), statistics %.0f MiB", (long long)r->windows,
        (long long)o->ctx, o->text_path, (long long)n_ids, (double)need / 1048576.0);
    st = collect(o, m, &f, ids, r, e);
    r->n_inputs = f.n_inputs;
    r->stats_bytes = f.bytes;
    for (int64_t l = 0; l < m->cfg.n_layers && st == SPX_OK; l++)
        for (int s = 0; s < SPX_SL_COUNT && st == SPX_OK; s++) {
            const spx_wmat *w = &m->layers[l].w[s];
            if (spx_slots[s].mat && w->kind == SPX_WM_QUANT && w->rows && f.head[l * SPX_SL_COUNT + s] < 0)
                st = spx_fail(e, SPX_ERR_INTERNAL, "refinement fit: layer %lld's %s matrix never ran", (long long)l,
                              spx_slots[s].key);
        }
    if (st == SPX_OK) st = spx_st_open(o->src_dir, &src, e);
    if (st == SPX_OK) st = spx_trdc_writer_open(o->refine_path, &wr, e);
    if (st == SPX_OK) st = solve_all(o, m, &f, src, wr, r, e);
    if (st == SPX_OK) {
        char *rs = manifest(o, m, len, r), *cfg = spx_trdc_config_json(m->trdc);
        const cJSON *sj = spx_trdc_source(m->trdc);
        char *srcj = sj ? cJSON_PrintUnformatted((cJSON *)sj) : NULL;
        if (!rs || !cfg) st = spx_fail(e, SPX_ERR_NOMEM, "out of memory");
        if (st == SPX_OK) st = spx_trdc_writer_finish(wr, cfg, NULL, NULL, rs, srcj, e);
        else spx_trdc_writer_abort(wr);
        wr = NULL;
        free(rs);
        free(cfg);
        free(srcj);
    }
done:
    if (wr) spx_trdc_writer_abort(wr);
    if (f.stats)
        for (size_t i = 0; i < (size_t)m->cfg.n_layers * SPX_SL_COUNT; i++) spx_refine_fit_stats_free(&f.stats[i]);
    free(f.stats);
    free(f.head);
    free(f.skip);
    free(ids);
    spx_st_free(src);
    spx_model_free(m);
    free(text);
    return st;
}
