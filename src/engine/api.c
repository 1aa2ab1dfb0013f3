/* api.c: the public API (spectra.h): model open/free, sessions, tokenize. */
#include "engine/session.h"
#include "core/util.h"
#include "engine/backend.h"
#include "cpu/ssm.h"
#include "format/trdc.h"
#include "format/trdc_source.h"
#include "refine/attach.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char g_last_error[SPX_ERR_MSG_MAX];

const char *spx_last_error(void) { return g_last_error; }

static spx_status set_last(spx_err *e) {
    snprintf(g_last_error, sizeof g_last_error, "%s", e->msg);
    return e->code;
}

#define CONFIG_MAX_BYTES (16u << 20)

static spx_status load_chat_info(spx_model *m, const char *folder_cfg, spx_err *e);

static spx_status open_hf_dir(spx_model *m, const char *dir, spx_err *e) {
    char *cfg_path = spx_path_join(dir, "config.json");
    if (!cfg_path) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    char *json = NULL;
    size_t len = 0;
    spx_status st = spx_read_file(cfg_path, CONFIG_MAX_BYTES, &json, &len, e);
    if (st == SPX_OK) st = spx_config_parse(json, len, cfg_path, &m->cfg, e);
    free(json);
    free(cfg_path);
    if (st != SPX_OK) return st;
    SPX_TRY(spx_st_open(dir, &m->st, e));
    char *tok_path = spx_path_join(dir, "tokenizer.json");
    if (!tok_path) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    int has_tok = spx_file_exists(tok_path);
    free(tok_path);
    char *tok_cfg = NULL; /* tokenizer_config.json, read once for the tokenizer and the chat template */
    if (has_tok) SPX_TRY(spx_tok_load_dir(dir, &m->tok, &tok_cfg, e));
    st = load_chat_info(m, tok_cfg, e);
    free(tok_cfg);
    return st;
}

/* The chat template and BOS/EOS texts: a folder's tokenizer_config.json
 * (folder_cfg: its text, as the tokenizer read it; NULL for none) and
 * chat_template.jinja, or what a .trdc carries (compress puts the .jinja
 * inside its tokenizer_config.json). A config without bos_token /
 * eos_token keys: the tokenizer's own BOS/EOS pieces. */
static spx_status load_chat_info(spx_model *m, const char *folder_cfg, spx_err *e) {
    char *jinja = NULL;
    const char *cj = folder_cfg;
    spx_status st = SPX_OK;
    if (m->trdc) {
        cj = spx_trdc_tokenizer_config_json(m->trdc);
    } else {
        char *fp = spx_path_join(m->path, "chat_template.jinja");
        if (!fp) st = spx_fail(e, SPX_ERR_NOMEM, "out of memory");
        else if (spx_file_exists(fp)) st = spx_read_file(fp, CONFIG_MAX_BYTES, &jinja, NULL, e);
        free(fp);
    }
    if (st == SPX_OK) st = spx_chat_info_parse(cj, jinja, m->path, &m->chat, e);
    free(jinja);
    if (st != SPX_OK || !m->tok) return st;
    int32_t id[2] = {spx_tok_bos(m->tok), spx_tok_eos(m->tok)};
    char **dst[2] = {&m->chat.bos, &m->chat.eos};
    int has[2] = {m->chat.has_bos, m->chat.has_eos};
    for (int i = 0; i < 2; i++) {
        const char *piece = id[i] >= 0 ? spx_tok_piece(m->tok, id[i]) : NULL;
        if (!has[i] && piece && !(*dst[i] = spx_strdup(piece))) return spx_fail(e, SPX_ERR_NOMEM, "out of memory");
    }
    return SPX_OK;
}

const char *spx_model_chat_template(const spx_model *m) { return m->chat.tmpl; }
const char *spx_model_cpu_kernels(const spx_model *m) { return m->qk ? m->qk->name : "scalar"; }
const char *spx_model_bos_text(const spx_model *m) { return m->chat.bos ? m->chat.bos : ""; }
const char *spx_model_eos_text(const spx_model *m) { return m->chat.eos ? m->chat.eos : ""; }

spx_status spx_model_open(const char *path, const spx_model_params *p, spx_model **out) {
    spx_err e;
    spx_err_clear(&e);
    *out = NULL;
    g_last_error[0] = 0;
    spx_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = spx_strdup(path)) || spx_model_lock_init(m) != 0) {
        if (m) free(m->path);
        free(m);
        spx_fail(&e, SPX_ERR_NOMEM, "%s: out of memory", path);
        return set_last(&e);
    }
    spx_status st;
    if (spx_is_dir(path)) {
        st = open_hf_dir(m, path, &e);
    } else if (spx_file_exists(path)) {
        st = spx_trdc_source_open(m, path, &e);
        if (st == SPX_OK) st = load_chat_info(m, NULL, &e);
    } else {
        st = spx_fail(&e, SPX_ERR_IO, "%s: no such file or folder (expected a Hugging Face model folder or a .trdc file)", path);
    }
    if (st == SPX_OK) st = spx_model_bind_weights(m, &e);
    if (st == SPX_OK) st = spx_pool_new(p ? p->n_threads : 0, &m->pool, &e);
    m->qk = spx_qkernels_best();
    if (st == SPX_OK) {
        const char *bn = p && p->backend ? p->backend : "cpu";
        m->be = spx_backend_find(bn);
        m->vram_budget_mb = p ? p->vram_budget_mb : 0;
        m->plan_n_ctx = p ? p->n_ctx : 0;
        m->plan_kv = p ? p->kv : SPX_KV_DEFAULT;
        m->pingpong = p ? p->pingpong : 0;
        m->n_layers_resident = p ? p->n_layers_resident : 0;
        if (!m->be)
            st = spx_fail(&e, SPX_ERR_UNSUPPORTED, "backend '%s' is not available in this build (built: cpu%s)", bn,
#ifdef SPX_HAVE_CUDA
                          ", cuda"
#else
                          ""
#endif
            );
        else
            st = m->be->model_init(m, &e);
        if (st != SPX_OK) m->be = NULL;
    }
    if (st != SPX_OK) {
        spx_model_free(m);
        return set_last(&e);
    }
    *out = m;
    return SPX_OK;
}

void spx_model_free(spx_model *m) {
    if (!m) return;
    spx_refine_detach(m);
    spx_model_free_layers(m);
    if (m->be) m->be->model_free(m);
    free(m->layers);
    free(m->final_norm);
    free(m->rope_inv_freq);
    spx_tok_free(m->tok);
    spx_st_free(m->st);
    spx_trdc_source_close(m);
    spx_pool_free(m->pool);
    spx_chat_info_free(&m->chat);
    pthread_mutex_destroy(&m->lock);
    free(m->path);
    free(m);
}

const char *spx_model_error(const spx_model *m) { return m ? m->err.msg : g_last_error; }

/* Tiled matrices are repacked row-major (the CPU tables stream those
 * faster, with the same sums); a file without any is copied whole. */
spx_status spx_model_make_resident(spx_model *m) {
    if (!m->trdc || m->be->device || m->weights_private) return SPX_OK;
    spx_model_lock(m);
    spx_err_clear(&m->err);
    int64_t n = 0;
    spx_status st = spx_model_untile_weights(m, &n, &m->err);
    if (st == SPX_OK && n == 0) st = spx_trdc_make_resident(m->trdc, &m->err);
    if (st == SPX_OK) m->weights_private = n ? 2 : 1;
    spx_model_unlock(m);
    return st;
}

int spx_model_weights_private(const spx_model *m) { return m->weights_private; }
int64_t spx_model_vocab_size(const spx_model *m) { return m->cfg.vocab_size; }
int64_t spx_model_max_context(const spx_model *m) { return m->cfg.max_pos; }
int spx_model_has_tokenizer(const spx_model *m) { return m->tok != NULL; }

int32_t spx_model_bos_id(const spx_model *m) {
    if (m->tok && spx_tok_bos(m->tok) >= 0) return spx_tok_bos(m->tok);
    return m->cfg.bos_id;
}

int32_t spx_model_eos_id(const spx_model *m) {
    if (m->tok && spx_tok_eos(m->tok) >= 0) return spx_tok_eos(m->tok);
    return m->cfg.n_eos > 0 ? m->cfg.eos_ids[0] : -1;
}

static spx_status tokenize(spx_model *m, const char *text, size_t len, int add_special, int32_t *ids,
                        size_t *n_ids) {
    spx_err_clear(&m->err);
    if (!m->tok) return spx_fail(&m->err, SPX_ERR_ARG, "%s: the model carries no tokenizer (no tokenizer.json)", m->path);
    int32_t *tmp = NULL;
    size_t n = 0;
    SPX_TRY(spx_tok_encode(m->tok, text, len, add_special, &tmp, &n, &m->err));
    size_t cap = *n_ids;
    *n_ids = n;
    if (n > cap) {
        free(tmp);
        return spx_fail(&m->err, SPX_ERR_RANGE, "tokenize: %zu ids do not fit in %zu", n, cap);
    }
    memcpy(ids, tmp, n * sizeof *ids);
    free(tmp);
    return SPX_OK;
}

/* ---- sessions --------------------------------------------------------- */

static float *alloc_f(size_t n, int *fail) {
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) *fail = 1;
    return p;
}

static void session_free(spx_session *s);

static spx_status session_new(spx_model *m, const spx_session_params *p, spx_session **out) {
    *out = NULL;
    spx_err_clear(&m->err);
    const spx_config *c = &m->cfg;
    int64_t n_ctx = p && p->n_ctx > 0 ? p->n_ctx : (c->max_pos < 4096 ? c->max_pos : 4096);
    if (n_ctx > ((int64_t)1 << 24))
        return spx_fail(&m->err, SPX_ERR_ARG, "context %lld is too large", (long long)n_ctx);
    spx_session *s = calloc(1, sizeof *s);
    if (!s) return spx_fail(&m->err, SPX_ERR_NOMEM, "out of memory for a session");
    s->m = m;
    s->n_ctx = n_ctx;
    size_t B = (size_t)spx_batch_max(m), H = (size_t)c->hidden_size;
    size_t I = (size_t)c->intermediate_size * (c->gate_up_fused ? 2 : 1); /* the fused gate+up output */
    const int host = !m->be->device; /* the CPU backend computes in these buffers; a device backend has its own */
    size_t qd = (size_t)(c->n_heads * c->head_dim), kvd = (size_t)(c->n_kv_heads * c->head_dim);
    size_t th = (size_t)spx_pool_size(m->pool);
    int fail = 0;
    /* widest recurrent projection (short conv: 3 H; Mamba-2: its in_proj) and
     * widest input of an output projection (attention q width, Mamba-2 d_inner) */
    size_t proj = (size_t)spx_arch_max_proj(c), di = (size_t)spx_arch_max_d_inner(c), att = qd;
    if (di > att) att = di;
    if (H > att) att = H;
    s->ckpt_pos = -1;
    const spx_kv_type kvt = p ? p->kv : SPX_KV_DEFAULT;
    spx_kvlow_cfg lc = {0};
    spx_status kst;
    if (spx_kv_type_lowbit(kvt)) {
        kst = spx_kvlow_config(kvt, p, !host, c->head_dim, &lc, &m->err);
        if (kst == SPX_OK)
            kst = spx_kv_init_low(&s->kv, kvt, &lc, c->n_attn_layers, host ? n_ctx : 0, (int64_t)kvd, c->head_dim,
                                  (int64_t)B, &m->err);
    } else
        kst = spx_kv_init(&s->kv, kvt, c->n_attn_layers, host ? n_ctx : 0, (int64_t)kvd, c->head_dim, &m->err);
    if (kst != SPX_OK) {
        spx_kv_free(&s->kv);
        free(s);
        return m->err.code;
    }
    if (host) {
        s->h = alloc_f(B * H, &fail);
        s->x = alloc_f(B * (H > qd ? H : qd), &fail);
        s->q = alloc_f(B * qd, &fail);
        s->k = alloc_f(B * kvd, &fail);
        s->v = alloc_f(B * kvd, &fail);
        s->att = alloc_f(B * att, &fail);
        if (proj) s->proj = alloc_f(B * proj, &fail);
        if (di) {
            spx_ssd_args a = {c->ssm_heads, c->ssm_head_dim, c->ssm_state, c->ssm_groups, 0, 0, 0, 0, 0};
            s->ssd_work = alloc_f((size_t)spx_ssd_chunked_work(&a, c->ssm_chunk), &fail);
        }
        s->gate = alloc_f(B * I, &fail);
        s->up = alloc_f(B * I, &fail);
        if (c->n_experts > 0) {
            const size_t E = (size_t)c->n_experts, Ie = (size_t)c->moe_intermediate, k = (size_t)c->moe_top_k;
            s->moe = alloc_f(B * (E + 3 * H + 3 * Ie) + k * (3 * Ie + H), &fail); /* + forward.c moe_one's */
            s->moe_w = alloc_f(B * k, &fail);
            if (!(s->moe_idx = calloc(B * (k + 1), sizeof *s->moe_idx))) fail = 1;
        }
        /* up to 4 heads of a GQA group per attention job (what the avx2
         * table shares a row among), no more buffer than one row per head */
        int64_t gs = c->n_heads / c->n_kv_heads, cap = c->n_heads / (int64_t)th;
        if (gs > 4) gs = 4;
        if (gs > cap) gs = cap;
        s->attn_gs = gs < 1 ? 1 : (int)gs;
        /* KV refinement selects per KV head from all its query heads' weights: one job takes them all */
        if (lc.rb) s->attn_gs = (int)(c->n_heads / c->n_kv_heads);
        s->scores = alloc_f(th * (size_t)s->attn_gs * (size_t)n_ctx, &fail);
        size_t kw = spx_kv_work_floats(&s->kv, s->attn_gs);
        if (kw) s->kv_work = alloc_f(th * kw, &fail);
        s->kv_work_floats = kw;
    }
    spx_cpu_ctx_init(&s->cpu, m->pool, m->qk);
    s->cpu.refine = spx_refine_runtime(m);
    s->logits = alloc_f(B * (size_t)c->vocab_size, &fail);
    if (m->state_floats) {
        s->state = alloc_f((size_t)m->state_floats, &fail);
        s->state_ckpt = alloc_f((size_t)m->state_floats, &fail);
    }
    if (fail) {
        session_free(s);
        return spx_fail(&m->err, SPX_ERR_NOMEM, "out of memory for a %lld-token session", (long long)n_ctx);
    }
    if (m->be->session_init(s, &m->err) != SPX_OK) {
        session_free(s);
        return m->err.code;
    }
    s->be_ready = 1;
    *out = s;
    return SPX_OK;
}

static void session_free(spx_session *s) {
    if (!s) return;
    if (s->be_ready) s->m->be->session_free(s);
    spx_kv_free(&s->kv);
    spx_cpu_ctx_free(&s->cpu);
    float *v[] = {s->h,    s->x,      s->q,      s->k,     s->v,     s->att,        s->gate,
                  s->up,   s->proj,   s->ssd_work, s->scores, s->logits, s->state, s->state_ckpt, s->kv_work,
                  s->moe,  s->moe_w};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) free(v[i]);
    free(s->moe_idx);
    free(s);
}

const char *spx_session_error(const spx_session *s) { return s->err.msg; }
/* The state cache through the backend when it keeps it (a device), else
 * the host copy. */
static spx_status state_op(spx_session *s, int op) {
    if (!s->m->state_floats) return SPX_OK;
    if (s->m->be->state_op) return s->m->be->state_op(s, op, &s->err);
    size_t b = (size_t)s->m->state_floats * sizeof(float);
    if (op == SPX_STATE_RESET) memset(s->state, 0, b);
    else if (op == SPX_STATE_CHECKPOINT) memcpy(s->state_ckpt, s->state, b);
    else memcpy(s->state, s->state_ckpt, b);
    return SPX_OK;
}

static void session_reset(spx_session *s) {
    s->pos = 0;
    spx_kv_reset(&s->kv);
    /* a device failure here shows at the next call on the session */
    if (state_op(s, SPX_STATE_RESET) != SPX_OK) s->ckpt_pos = -1;
}

int64_t spx_session_pos(const spx_session *s) { return s->pos; }

static void session_checkpoint(spx_session *s) {
    spx_err_clear(&s->err);
    s->ckpt_pos = state_op(s, SPX_STATE_CHECKPOINT) == SPX_OK ? s->pos : -1;
}

static spx_status session_seek(spx_session *s, int64_t pos) {
    spx_err_clear(&s->err);
    if (s->pos != 0 || pos < 0 || pos >= s->n_ctx)
        return spx_fail(&s->err, SPX_ERR_RANGE, "seek: the session is at %lld (must be 0) and %lld must be in 0..%lld",
                        (long long)s->pos, (long long)pos, (long long)s->n_ctx - 1);
    if (s->m->state_floats)
        return spx_fail(&s->err, SPX_ERR_UNSUPPORTED, "seek: a model with recurrent layers has no state for skipped tokens");
    spx_kv_seek(&s->kv, pos);
    s->pos = pos;
    return SPX_OK;
}

static spx_status session_truncate(spx_session *s, int64_t pos) {
    spx_err_clear(&s->err);
    if (pos < 0 || pos > s->pos)
        return spx_fail(&s->err, SPX_ERR_RANGE, "truncate: position %lld is outside 0..%lld", (long long)pos,
                        (long long)s->pos);
    if (pos == s->pos) return SPX_OK;
    if (pos == 0) {
        s->pos = 0;
        spx_kv_reset(&s->kv);
        return state_op(s, SPX_STATE_RESET);
    }
    if (s->m->state_floats) {
        if (s->ckpt_pos < 0)
            return spx_fail(&s->err, SPX_ERR_RANGE,
                            "truncate: the recurrent layers' state can go back only to a checkpoint or 0, and there is "
                            "no checkpoint (spx_session_checkpoint)");
        if (pos != s->ckpt_pos)
            return spx_fail(&s->err, SPX_ERR_RANGE,
                            "truncate: the recurrent layers' state can go back only to the checkpoint (position %lld) "
                            "or 0, not to %lld", (long long)s->ckpt_pos, (long long)pos);
        SPX_TRY(state_op(s, SPX_STATE_RESTORE));
    }
    if (spx_kv_truncate(&s->kv, pos, &s->err) != SPX_OK) {
        /* some layers are cut, some not: nothing is left that can be
         * trusted, so the session starts over (the message says so) */
        spx_status st = s->err.code;
        char msg[sizeof s->err.msg];
        snprintf(msg, sizeof msg, "%s", s->err.msg);
        s->pos = 0;
        spx_kv_reset(&s->kv);
        (void)state_op(s, SPX_STATE_RESET);
        spx_err_clear(&s->err);
        return spx_fail(&s->err, st, "truncate: %s; the session was reset to position 0", msg);
    }
    s->pos = pos;
    return SPX_OK;
}

static spx_status session_eval(spx_session *s, const int32_t *ids, size_t n, float *logits, int all_logits) {
    spx_err_clear(&s->err);
    int64_t V = s->m->cfg.vocab_size;
    if (n == 0) return spx_fail(&s->err, SPX_ERR_ARG, "eval: no tokens");
    if ((int64_t)n > s->n_ctx - s->pos)
        return spx_fail(&s->err, SPX_ERR_RANGE, "context full: %lld + %zu tokens exceed the %lld-token context",
                        (long long)s->pos, n, (long long)s->n_ctx);
    const size_t B = (size_t)spx_batch_max(s->m);
    for (size_t i = 0; i < n; i += B) {
        size_t k = n - i < B ? n - i : B;
        int last = i + k == n;
        int want = !logits ? SPX_LOGITS_NONE : all_logits ? SPX_LOGITS_ALL : last ? SPX_LOGITS_LAST : SPX_LOGITS_NONE;
        SPX_TRY(spx_session_forward(s, ids + i, (int64_t)k, want, &s->err));
        if (want == SPX_LOGITS_ALL) memcpy(logits + i * (size_t)V, s->logits, k * (size_t)V * sizeof(float));
        else if (want == SPX_LOGITS_LAST) memcpy(logits, s->logits, (size_t)V * sizeof(float));
    }
    return SPX_OK;
}

const char *spx_model_backend(const spx_model *m) { return m->be->name; }

/* What a one-token step needs: room in the context and an id in the vocabulary. */
static spx_status step_check(spx_session *s, int32_t id) {
    if (s->pos >= s->n_ctx)
        return spx_fail(&s->err, SPX_ERR_RANGE, "context full: %lld tokens", (long long)s->n_ctx);
    if (id < 0 || id >= s->m->cfg.vocab_size)
        return spx_fail(&s->err, SPX_ERR_RANGE, "token id %d out of range (vocabulary %lld)", id,
                        (long long)s->m->cfg.vocab_size);
    return SPX_OK;
}

spx_status spx_session_step_greedy(spx_session *s, int32_t id, int32_t *next) {
    return spx_session_step_greedy_ahead(s, id, next, 0);
}

static spx_status step_greedy_ahead(spx_session *s, int32_t id, int32_t *next, int ahead) {
    spx_err_clear(&s->err);
    SPX_TRY(step_check(s, id));
    if (s->m->be->step_greedy) return s->m->be->step_greedy(s, id, next, ahead != 0, &s->err);
    SPX_TRY(spx_session_forward(s, &id, 1, SPX_LOGITS_LAST, &s->err));
    *next = spx_sample(s->logits, s->m->cfg.vocab_size, NULL, NULL); /* no parameters: the first maximum */
    return SPX_OK;
}

spx_status spx_session_step_sample(spx_session *s, int32_t id, const spx_sampler_params *p, uint64_t *rng,
                                   int32_t *next) {
    return spx_session_step_sample_ahead(s, id, p, rng, next, 0);
}

static spx_status step_sample_ahead(spx_session *s, int32_t id, const spx_sampler_params *p, uint64_t *rng,
                                    int32_t *next, int ahead) {
    spx_err_clear(&s->err);
    if (!p || !rng) return spx_fail(&s->err, SPX_ERR_ARG, "step_sample: no sampler parameters or RNG state");
    /* parameters that make spx_sample an argmax (it leaves the RNG alone then): the greedy step */
    if (!(p->temperature > 0) || p->top_k == 1) return step_greedy_ahead(s, id, next, ahead);
    SPX_TRY(step_check(s, id));
    if (s->m->be->step_sample) return s->m->be->step_sample(s, id, p, rng, ahead != 0, next, &s->err);
    SPX_TRY(spx_session_forward(s, &id, 1, SPX_LOGITS_LAST, &s->err));
    *next = spx_sample(s->logits, s->m->cfg.vocab_size, p, rng);
    return SPX_OK;
}

/* ---- the thread-safe entry points -------------------------------------
 * Each holds the model's lock (recursive: spx_spec_step and spx_batch_step
 * call these) around the body above: sessions of one model may be used
 * from different threads at once; their passes take turns, since the
 * pool, the backend's buffers and m->err belong to the model. One
 * session's calls must not overlap. Model-level failures are also copied
 * to the calling thread's spx_last_error(), as m->err is shared. */

static spx_status model_done(spx_model *m, spx_status st) {
    if (st != SPX_OK) set_last(&m->err);
    spx_model_unlock(m);
    return st;
}

spx_status spx_tokenize(spx_model *m, const char *text, size_t len, int add_special, int32_t *ids, size_t *n_ids) {
    spx_model_lock(m);
    return model_done(m, tokenize(m, text, len, add_special, ids, n_ids));
}

spx_status spx_session_new(spx_model *m, const spx_session_params *p, spx_session **out) {
    spx_model_lock(m);
    return model_done(m, session_new(m, p, out));
}

void spx_session_free(spx_session *s) {
    if (!s) return;
    spx_model *m = s->m;
    spx_model_lock(m);
    session_free(s);
    spx_model_unlock(m);
}

void spx_session_reset(spx_session *s) {
    spx_model_lock(s->m);
    session_reset(s);
    spx_model_unlock(s->m);
}

void spx_session_checkpoint(spx_session *s) {
    spx_model_lock(s->m);
    session_checkpoint(s);
    spx_model_unlock(s->m);
}

#define SESSION_LOCKED(call)                                                                                        \
    do {                                                                                                            \
        spx_model_lock(s->m);                                                                                       \
        spx_status st_ = call;                                                                                      \
        spx_model_unlock(s->m);                                                                                     \
        return st_;                                                                                                 \
    } while (0)

spx_status spx_session_seek(spx_session *s, int64_t pos) { SESSION_LOCKED(session_seek(s, pos)); }
spx_status spx_session_truncate(spx_session *s, int64_t pos) { SESSION_LOCKED(session_truncate(s, pos)); }
spx_status spx_session_eval(spx_session *s, const int32_t *ids, size_t n, float *logits, int all_logits) {
    SESSION_LOCKED(session_eval(s, ids, n, logits, all_logits));
}
spx_status spx_session_step_greedy_ahead(spx_session *s, int32_t id, int32_t *next, int ahead) {
    SESSION_LOCKED(step_greedy_ahead(s, id, next, ahead));
}
spx_status spx_session_step_sample_ahead(spx_session *s, int32_t id, const spx_sampler_params *p, uint64_t *rng,
                                         int32_t *next, int ahead) {
    SESSION_LOCKED(step_sample_ahead(s, id, p, rng, next, ahead));
}
