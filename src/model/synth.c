/* synth.c: synthetic models of real shapes (see synth.h). Random numbers
 * come from splitmix64 so a seed reproduces a file. Weights have std about
 * 0.02, like trained checkpoints at initialisation; norm gains are 1. */
#include "model/synth.h"
#include "model/arch.h"
#include "quant/g32.h"
#include "core/half.h"
#include "core/util.h"
#include "format/trdc.h"
#include "quant/qtensor.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static const spx_synth_shape shapes[] = {
    {"llama3-1b", "LlamaForCausalLM", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 1, 0, 500000.0,
     "{\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
     "\"original_max_position_embeddings\":8192}", 0, 0, 0, 0},
    {"llama3-3b", "LlamaForCausalLM", 3072, 8192, 28, 24, 8, 128, 128256, 131072, 1, 0, 500000.0,
     "{\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
     "\"original_max_position_embeddings\":8192}", 0, 0, 0, 0},
    {"llama3-8b", "LlamaForCausalLM", 4096, 14336, 32, 32, 8, 128, 128256, 131072, 0, 0, 500000.0,
     "{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
     "\"original_max_position_embeddings\":8192}", 0, 0, 0, 0},
    {"qwen2.5-1.5b", "Qwen2ForCausalLM", 1536, 8960, 28, 12, 2, 128, 151936, 32768, 1, 1, 1000000.0, NULL, 0, 0, 0, 0},
    {"qwen3-0.6b", "Qwen3ForCausalLM", 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1, 0, 1000000.0, NULL, 0, 0, 0, 0},
    {"tiny", "LlamaForCausalLM", 256, 768, 2, 4, 2, 64, 512, 2048, 0, 0, 10000.0, NULL, 0, 0, 0, 0},
    /* Qwen3-30B-A3B's config.json: 128 experts of 768, 8 per token, top-k renormalised */
    {"qwen3-30b-a3b", "Qwen3MoeForCausalLM", 2048, 6144, 48, 32, 4, 128, 151936, 40960, 0, 0, 1000000.0, NULL,
     128, 8, 768, 1},
    {"tiny-moe", "Qwen3MoeForCausalLM", 256, 768, 2, 4, 2, 64, 512, 2048, 0, 0, 10000.0, NULL, 8, 2, 128, 1},
    {NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL, 0, 0, 0, 0},
};

const spx_synth_shape *spx_synth_shapes(void) { return shapes; }

const spx_synth_shape *spx_synth_find(const char *name) {
    for (const spx_synth_shape *s = shapes; s->name; s++)
        if (!strcmp(s->name, name)) return s;
    return NULL;
}

char *spx_synth_config_json(const spx_synth_shape *s) {
    cJSON *c = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(s->arch));
    cJSON_AddNumberToObject(c, "vocab_size", (double)s->vocab);
    cJSON_AddNumberToObject(c, "hidden_size", (double)s->hidden);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)s->inter);
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)s->layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", (double)s->heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", (double)s->kv_heads);
    cJSON_AddNumberToObject(c, "head_dim", (double)s->head_dim);
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)s->max_pos);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-5);
    cJSON_AddNumberToObject(c, "rope_theta", s->rope_theta);
    cJSON_AddItemToObject(c, "rope_scaling", s->rope_json ? cJSON_Parse(s->rope_json) : cJSON_CreateNull());
    cJSON_AddBoolToObject(c, "tie_word_embeddings", s->tied);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddStringToObject(c, "torch_dtype", "bfloat16");
    cJSON_AddNumberToObject(c, "bos_token_id", 1);
    cJSON_AddNumberToObject(c, "eos_token_id", 2);
    if (s->experts) {
        cJSON_AddNumberToObject(c, "num_experts", (double)s->experts);
        cJSON_AddNumberToObject(c, "num_experts_per_tok", (double)s->top_k);
        cJSON_AddNumberToObject(c, "moe_intermediate_size", (double)s->moe_inter);
        cJSON_AddBoolToObject(c, "norm_topk_prob", s->norm_topk);
        cJSON_AddNumberToObject(c, "decoder_sparse_step", 1);
        cJSON_AddItemToObject(c, "mlp_only_layers", cJSON_CreateArray());
    }
    char *txt = cJSON_Print(c);
    cJSON_Delete(c);
    return txt;
}

static uint64_t rnd(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rnd_normal(uint64_t *s) {
    double u1 = ((double)(rnd(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(rnd(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* The tensors of a shape, in file order: name, rows, cols (cols 0: 1-D;
 * dense: stored as bf16 rather than quantized: vectors and the float32
 * router). They come from the architecture table (model/arch.h) of the
 * shape's own config.json, so a shape lists no tensor by hand: the
 * embedding, each layer's slots (an expert slot as one 2-D matrix per
 * expert, under the family's per-expert name), the final norm and an
 * untied LM head. *out is malloc'd; returns the count or -1 (e set). */
typedef struct { char name[96]; int64_t rows, cols; int dense; } tdesc;

static int64_t list_tensors(const spx_synth_shape *s, tdesc **out, spx_err *e) {
    char *cj = spx_synth_config_json(s);
    spx_config *c = calloc(1, sizeof *c);
    if (!cj || !c) { free(cj); free(c); spx_fail(e, SPX_ERR_NOMEM, "out of memory"); return -1; }
    spx_status st = spx_config_parse(cj, strlen(cj), s->name, c, e);
    free(cj);
    if (st != SPX_OK) { free(c); return -1; }
    int64_t cap = 2 + c->n_layers * SPX_SL_COUNT, n = 0;
    for (int64_t l = 0; l < c->n_layers; l++)
        if (c->ffn[l] == SPX_FFN_MOE) cap += 4 * c->n_experts;
    tdesc *t = calloc((size_t)cap + 2, sizeof *t);
    if (!t) { free(c); spx_fail(e, SPX_ERR_NOMEM, "out of memory"); return -1; }
#define ADD(r, cl, dn, ...) (snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__), t[n].rows = (r), t[n].cols = (cl), \
                             t[n].dense = (dn), n++)
    ADD(s->vocab, s->hidden, 0, "%s", spx_arch_embed_name(c));
    for (int64_t l = 0; l < c->n_layers; l++)
        for (int sl = 0; sl < SPX_SL_COUNT; sl++) {
            int64_t d[3];
            const int nd = spx_slot_shape(c, l, (spx_slot)sl, d);
            if (!nd) continue;
            char nm[96];
            if (spx_slots[sl].mat == 2) {
                for (int64_t x = 0; x < d[0]; x++)
                    if (spx_expert_tensor_name(c, l, (spx_slot)sl, x, nm, sizeof nm)) {
                        free(t); free(c);
                        spx_fail(e, SPX_ERR_ARG, "synth: shape %s stores its experts stacked; only per-expert "
                                 "families are synthesised", s->name);
                        return -1;
                    } else ADD(d[1], d[2], 0, "%s", nm);
                continue;
            }
            spx_slot_tensor_name(c, l, (spx_slot)sl, nm, sizeof nm);
            if (nd > 2) { free(t); free(c); spx_fail(e, SPX_ERR_ARG, "synth: shape %s: '%s' is %d-D", s->name, nm, nd); return -1; }
            ADD(d[0], nd == 2 ? d[1] : 0, !spx_slots[sl].mat, "%s", nm);
        }
    ADD(s->hidden, 0, 1, "%s", spx_arch_final_norm_name(c));
    if (!c->tie_embeddings) ADD(s->vocab, s->hidden, 0, "%s", spx_arch_lm_head_name(c));
#undef ADD
    free(c);
    *out = t;
    return n;
}

/* A random residual of a layer matrix for the .refine of a synthetic
 * model: codes uniform in [-7, 7], row scales 2e-4 (a residual's size for
 * the base's 0.02-rms weights), against the base codes as written (crc). */
static spx_status add_refine(spx_trdc_writer *rw, const char *name, const spx_qtensor *lq, uint64_t *rng, spx_err *e) {
    const size_t cb = (size_t)spx_q_codes_bytes(lq->rows, lq->cols, lq->bits, lq->layout);
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t off = 0; off < cb; off += (size_t)1 << 24)
        crc = crc32(crc, lq->codes + off, (uInt)(cb - off < ((size_t)1 << 24) ? cb - off : ((size_t)1 << 24)));
    const int64_t rows = lq->rows, cols = lq->cols, stride = ((rows + 1) / 2 + 63) / 64 * 64;
    uint8_t *codes = malloc((size_t)(cols * stride));
    float *scales = malloc((size_t)rows * 4);
    spx_status st = SPX_OK;
    if (!codes || !scales) st = spx_fail(e, SPX_ERR_NOMEM, "out of memory for the residual of '%s'", name);
    if (st == SPX_OK) {
        for (int64_t c = 0; c < cols; c++) {
            uint8_t *col = codes + c * stride;
            for (int64_t b = 0; b < stride; b++) {
                const uint64_t r = rnd(rng);
                const int lo = 1 + (int)(r % 15), hi = 1 + (int)((r >> 8) % 15);
                col[b] = b < rows / 2 ? (uint8_t)(lo | hi << 4) : b == rows / 2 && (rows & 1) ? (uint8_t)(lo | 0x80) : 0x88;
            }
        }
        for (int64_t r = 0; r < rows; r++) scales[r] = 2e-4f;
        st = spx_trdc_writer_add_refine(rw, name, rows, cols, stride, codes, scales, (uint32_t)crc, e);
    }
    free(codes);
    free(scales);
    return st;
}

spx_status spx_synth_write_trdc(const spx_synth_shape *s, const char *path, int bits, double outlier_ratio,
                                uint64_t seed, int row_major, const char *refine_path, const char *tok_json,
                                const char *tok_cfg_json, spx_err *e) {
    if (bits != 2 && bits != 3 && bits != 4) return spx_fail(e, SPX_ERR_ARG, "synth: %d-bit codes: expected 2, 3 or 4", bits);
    tdesc *td = NULL;
    const int64_t nt = list_tensors(s, &td, e);
    if (nt < 0) return e->code;
    for (int64_t i = 0; i < nt; i++)
        if (bits != 4 && !td[i].dense && td[i].cols % 128) { /* a row's last item would need zero padding bits */
            spx_status bad = spx_fail(e, SPX_ERR_ARG, "synth: shape %s: '%s' has %lld columns; %d-bit codes need a "
                                      "multiple of 128", s->name, td[i].name, (long long)td[i].cols, bits);
            free(td);
            return bad;
        }
    spx_trdc_writer *w = NULL, *rw = NULL;
    spx_status st = spx_trdc_writer_open(path, &w, e);
    if (st == SPX_OK && refine_path) st = spx_trdc_writer_open(refine_path, &rw, e);
    uint64_t rng = seed;
    for (int64_t i = 0; i < nt && st == SPX_OK; i++) {
        tdesc *t = &td[i];
        if (t->dense) { /* norm gains 1; biases and routers small */
            const int64_t ne = t->rows * (t->cols ? t->cols : 1);
            uint16_t *v = malloc((size_t)ne * 2);
            if (!v) { st = spx_fail(e, SPX_ERR_NOMEM, "out of memory"); break; }
            const int gain = t->cols == 0 && !strstr(t->name, "bias");
            for (int64_t k = 0; k < ne; k++) v[k] = spx_f32_to_bf16(gain ? 1.0f : 0.02f * rnd_normal(&rng));
            int64_t shape[2] = {t->rows, t->cols};
            st = spx_trdc_writer_add_dense(w, t->name, SPX_DT_BF16, t->cols ? 2 : 1, shape, v, (size_t)ne * 2, e);
            free(v);
            continue;
        }
        int64_t rows = t->rows, cols = t->cols, ng = cols / 32;
        int64_t n_out = (int64_t)floor(outlier_ratio * (double)cols + 0.5);
        size_t cb = (size_t)(rows * spx_q_codes_row_bytes(cols, bits)), sb = (size_t)(rows * ng) * 2,
               zb = (size_t)(rows * spx_q_zeros_row_bytes(cols, 32));
        uint8_t *codes = malloc(cb), *zeros = malloc(zb);
        uint16_t *scales = malloc(sb), *ov = malloc((size_t)(rows * (n_out ? n_out : 1)) * 2);
        int32_t *oi = malloc((size_t)(n_out ? n_out : 1) * 4);
        if (!codes || !zeros || !scales || !ov || !oi) {
            free(codes); free(zeros); free(scales); free(ov); free(oi);
            st = spx_fail(e, SPX_ERR_NOMEM, "out of memory for tensor '%s'", t->name);
            break;
        }
        for (size_t k = 0; k < cb; k += 8) { uint64_t r = rnd(&rng); memcpy(codes + k, &r, cb - k < 8 ? cb - k : 8); }
        /* zero points at the middle of the range (4 bits: 7..8), scales so
         * that the weights' rms is about 0.02: the std of uniform codes is
         * sqrt((4^bits - 1) / 12) */
        const uint8_t zb0 = (uint8_t)(((1 << (bits - 1)) - 1) * 0x11);
        const float s0 = 0.02f / (float)sqrt(((double)(1 << (2 * bits)) - 1) / 12);
        for (size_t k = 0; k < zb; k++) zeros[k] = zb0 + (uint8_t)(rnd(&rng) & 0x11);
        for (int64_t k = 0; k < rows * ng; k++) scales[k] = spx_f32_to_f16(s0 * (0.75f + 0.5f * (float)(rnd(&rng) >> 40) / 16777216.0f));
        for (int64_t k = 0; k < n_out; k++) oi[k] = (int32_t)((k * cols) / n_out + (int64_t)(rnd(&rng) % (uint64_t)(cols / n_out > 1 ? cols / n_out : 1)));
        for (int64_t k = 0; k < rows * n_out; k++) ov[k] = spx_f32_to_f16(0.1f * rnd_normal(&rng));
        spx_qtensor q = {rows, cols, bits, 32, n_out, codes, scales, zeros, n_out ? oi : NULL, n_out ? ov : NULL, SPX_Q_ROWS};
        spx_qtensor lq;
        void *mem;
        st = spx_q_as_layout(&q, row_major, &lq, &mem, e);
        if (st == SPX_OK) st = spx_trdc_writer_add_quant(w, t->name, &lq, NAN, (double)n_out / (double)cols, e);
        if (st == SPX_OK && rw && strstr(t->name, "layers.")) st = add_refine(rw, t->name, &lq, &rng, e);
        free(mem);
        free(codes); free(zeros); free(scales); free(ov); free(oi);
    }
    free(td);
    if (st != SPX_OK) {
        spx_trdc_writer_abort(w);
        if (rw) spx_trdc_writer_abort(rw);
        return st;
    }
    char *cfg = spx_synth_config_json(s);
    char qs[160];
    snprintf(qs, sizeof qs, "{\"bits\": %d, \"group\": 32, \"outliers\": %g, \"method\": \"synthetic\"}", bits,
             outlier_ratio);
    if (rw) { /* as compress: the .refine first */
        char rs[320];
        snprintf(rs, sizeof rs, "{\"refine\": {\"bits\": 4, \"layout\": \"column\", \"scales\": \"float32 per row\", "
                                "\"synthetic\": true, \"base\": %s}}", qs);
        st = cfg ? spx_trdc_writer_finish(rw, cfg, NULL, NULL, rs, "{\"synthetic\": true}", e)
                 : (spx_trdc_writer_abort(rw), spx_fail(e, SPX_ERR_NOMEM, "out of memory"));
        if (st != SPX_OK) {
            free(cfg);
            spx_trdc_writer_abort(w);
            return st;
        }
    }
    st = cfg ? spx_trdc_writer_finish(w, cfg, tok_json, tok_cfg_json, qs, "{\"synthetic\": true}", e)
             : (spx_trdc_writer_abort(w), spx_fail(e, SPX_ERR_NOMEM, "out of memory"));
    free(cfg);
    return st;
}

/* ---- a streaming safetensors writer for the HF folder ------------------ */

static spx_status write_all(FILE *f, const void *p, size_t n, const char *path, spx_err *e) {
    if (fwrite(p, 1, n, f) != n) return spx_fail(e, SPX_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return SPX_OK;
}

spx_status spx_synth_write_hf(const spx_synth_shape *s, const char *dir, uint64_t seed, spx_err *e) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return spx_fail(e, SPX_ERR_IO, "%s: cannot create folder: %s", dir, strerror(errno));
    char *cfg = spx_synth_config_json(s), *cp = spx_path_join(dir, "config.json"),
         *sp = spx_path_join(dir, "model.safetensors");
    tdesc *td = NULL;
    cJSON *hdr = cJSON_CreateObject();
    spx_status st = SPX_OK;
    FILE *f = NULL;
    char *tmp = NULL, *htxt = NULL;
    uint16_t *buf = NULL;
    if (!cfg || !cp || !sp || !hdr) { st = spx_fail(e, SPX_ERR_NOMEM, "out of memory"); goto done; }
    const int64_t nt = list_tensors(s, &td, e);
    if (nt < 0) { st = e->code; goto done; }
    if ((st = spx_write_file_atomic(cp, cfg, strlen(cfg), e)) != SPX_OK) goto done;
    uint64_t off = 0;
    int64_t maxn = 0;
    for (int64_t i = 0; i < nt; i++) {
        int64_t n = td[i].rows * (td[i].cols ? td[i].cols : 1);
        cJSON *o = cJSON_AddObjectToObject(hdr, td[i].name);
        cJSON_AddStringToObject(o, "dtype", "BF16");
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)td[i].rows));
        if (td[i].cols) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)td[i].cols));
        cJSON *of = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        off += (uint64_t)n * 2;
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        if (td[i].cols && td[i].cols > maxn) maxn = td[i].cols;
    }
    htxt = cJSON_PrintUnformatted(hdr);
    tmp = malloc(strlen(sp) + 32);
    buf = malloc((size_t)(maxn > 65536 ? maxn : 65536) * 2);
    if (!htxt || !tmp || !buf) { st = spx_fail(e, SPX_ERR_NOMEM, "out of memory"); goto done; }
    size_t hl = strlen(htxt), pad = (8 - hl % 8) % 8;
    sprintf(tmp, "%s.tmp.%ld", sp, (long)getpid());
    if (!(f = fopen(tmp, "wb"))) { st = spx_fail(e, SPX_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno)); goto done; }
    uint64_t hlen = hl + pad;
    if ((st = write_all(f, &hlen, 8, tmp, e)) || (st = write_all(f, htxt, hl, tmp, e)) ||
        (st = write_all(f, "        ", pad, tmp, e)))
        goto done;
    uint64_t rng = seed;
    for (int64_t i = 0; i < nt && st == SPX_OK; i++) {
        int64_t rows = td[i].rows, cols = td[i].cols ? td[i].cols : 1;
        const int vec = td[i].cols == 0, gain = vec && !strstr(td[i].name, "bias");
        for (int64_t r = 0; r < (vec ? 1 : rows) && st == SPX_OK; r++) {
            int64_t n = vec ? rows : cols;
            for (int64_t k = 0; k < n; k++)
                buf[k] = spx_f32_to_bf16(gain ? 1.0f : 0.02f * rnd_normal(&rng));
            st = write_all(f, buf, (size_t)n * 2, tmp, e);
        }
    }
    if (st == SPX_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        st = spx_fail(e, SPX_ERR_IO, "%s: cannot flush: %s", tmp, strerror(errno));
    if (fclose(f) != 0 && st == SPX_OK) st = spx_fail(e, SPX_ERR_IO, "%s: close failed", tmp);
    f = NULL;
    if (st == SPX_OK && rename(tmp, sp) != 0) st = spx_fail(e, SPX_ERR_IO, "%s: rename failed: %s", sp, strerror(errno));
    if (st != SPX_OK) unlink(tmp);
done:
    if (f) { fclose(f); unlink(tmp); }
    cJSON_Delete(hdr);
    free(htxt); free(tmp); free(buf); free(td); free(cfg); free(cp); free(sp);
    return st;
}
