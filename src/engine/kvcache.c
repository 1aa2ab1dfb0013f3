/* kvcache.c: KV cache storage and attention over it (see kvcache.h). */
#include "engine/kvcache.h"
#include "core/half.h"
#include "cpu/ops.h"
#include "quant/g32.h"
#include "refine/tier.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_GROUP 32

/* q4 rows are stored rotated by an orthonormal Walsh-Hadamard transform
 * over blocks of `rot` values (the largest power of two dividing head_dim,
 * at most 256). Scores use the rotated query, since (Hq).(Hk) = q.k; the
 * weighted sum of rotated values is rotated back, since H is its own
 * inverse. The rotation spreads the few large channels of K over the
 * block, so 4-bit groups lose far less (QuaRot-style; docs/numerics.md). */
static void fwht(float *x, int64_t n) {
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float sc = 1.0f / sqrtf((float)n);
    for (int64_t i = 0; i < n; i++) x[i] *= sc;
}

void spx_kv_rotate(float *x, int64_t len, int64_t rot) {
    for (int64_t i = 0; i < len; i += rot) fwht(x + i, rot);
}

const char *spx_kv_type_name(spx_kv_type t) {
    switch (t) {
    case SPX_KV_F32: return "f32";
    case SPX_KV_Q4: return "q4";
    case SPX_KV_K2V2: return "k2v2";
    case SPX_KV_K3V2: return "k3v2";
    case SPX_KV_K3V3: return "k3v3";
    case SPX_KV_K4V4: return "k4v4";
    default: return "f16";
    }
}

int64_t spx_kv_rot_block(int64_t head_dim) {
    int64_t r = 1;
    while (r < 256 && head_dim % (r * 2) == 0) r *= 2;
    return r;
}

size_t spx_kv_bytes_per_token(spx_kv_type t, int64_t n_layers, int64_t kvd) {
    size_t row;
    switch (t) {
    case SPX_KV_F32: row = (size_t)kvd * 4; break;
    case SPX_KV_Q4: row = (size_t)kvd / 2 + (size_t)kvd / KV_GROUP * 2 + (size_t)(kvd / KV_GROUP + 1) / 2; break;
    case SPX_KV_K2V2: case SPX_KV_K3V2: case SPX_KV_K3V3: case SPX_KV_K4V4: {
        spx_kvlow_cfg lc; /* the default layout and group (the plan's estimate; sinks and ring not counted) */
        spx_err e;
        if (spx_kvlow_config(t, NULL, 0, 64, &lc, &e) != SPX_OK) return 0;
        return (size_t)ceil(spx_kvlow_bytes_per_token(&lc, n_layers, kvd));
    }
    default: row = (size_t)kvd * 2; break;
    }
    return 2 * (size_t)n_layers * row;
}

spx_status spx_kv_init(spx_kvcache *c, spx_kv_type t, int64_t n_layers, int64_t n_ctx, int64_t kvd,
                       int64_t head_dim, spx_err *e) {
    memset(c, 0, sizeof *c);
    if (t == SPX_KV_DEFAULT) t = SPX_KV_F16;
    if (t != SPX_KV_F32 && t != SPX_KV_F16 && t != SPX_KV_Q4)
        return spx_fail(e, SPX_ERR_ARG, "KV cache type %d is not one of f32, f16, q4", (int)t);
    if (t == SPX_KV_Q4 && head_dim % KV_GROUP)
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "--kv q4 needs head_dim to be a multiple of %d; this model has %lld",
                        KV_GROUP, (long long)head_dim);
    if (t == SPX_KV_Q4 && head_dim / KV_GROUP > 64)
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "--kv q4 supports head_dim up to 2048; this model has %lld",
                        (long long)head_dim);
    c->type = t;
    c->rot = spx_kv_rot_block(head_dim);
    c->n_layers = n_layers;
    c->n_ctx = n_ctx;
    c->kvd = kvd;
    c->head_dim = head_dim;
    c->row_bytes = spx_kv_bytes_per_token(t, 1, kvd) / 2;
    c->row_bytes = (c->row_bytes + 3) & ~(size_t)3; /* q4 rows of an odd byte count: keep each row's fp16 scales
                                                     * 2-byte aligned (they are read and written in place) */
    c->codes_b = (size_t)kvd / 2;
    c->scales_b = c->codes_b + (size_t)kvd / KV_GROUP * 2;
    size_t total;
    if (__builtin_mul_overflow((size_t)n_layers * (size_t)n_ctx, c->row_bytes, &total))
        return spx_fail(e, SPX_ERR_ARG, "KV cache size overflows");
    c->k = calloc(total ? total : 1, 1);
    c->v = calloc(total ? total : 1, 1);
    if (!c->k || !c->v) {
        spx_kv_free(c);
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory for a %.1f MiB KV cache", 2.0 * (double)total / (1 << 20));
    }
    return SPX_OK;
}

spx_status spx_kv_init_low(spx_kvcache *c, spx_kv_type t, const spx_kvlow_cfg *lc, int64_t n_layers, int64_t n_ctx,
                           int64_t kvd, int64_t head_dim, int64_t batch, spx_err *e) {
    memset(c, 0, sizeof *c);
    c->type = t;
    c->n_layers = n_layers;
    c->n_ctx = n_ctx;
    c->kvd = kvd;
    c->head_dim = head_dim;
    c->lowbit = 1;
    return spx_kvlow_init(&c->low, lc, n_layers, n_ctx, kvd, head_dim, batch, e);
}

void spx_kv_reset(spx_kvcache *c) {
    if (c->lowbit) spx_kvlow_reset(&c->low);
}

spx_status spx_kv_truncate(spx_kvcache *c, int64_t pos, spx_err *e) {
    return c->lowbit ? spx_kvlow_truncate(&c->low, pos, e) : SPX_OK;
}

void spx_kv_seek(spx_kvcache *c, int64_t pos) {
    if (!c->lowbit) return;
    for (int64_t l = 0; l < c->low.n_layers; l++) {
        const int64_t e = pos / SPX_KVL_BLOCK * SPX_KVL_BLOCK;
        c->low.enc[l] = e < SPX_KVL_BLOCK ? SPX_KVL_BLOCK : e;
    }
}

spx_status spx_kv_commit(spx_kvcache *c, int64_t layer, int64_t pos_end, spx_err *e) {
    return c->lowbit ? spx_kvlow_commit(&c->low, layer, pos_end, e) : SPX_OK;
}

spx_status spx_kv_step_end(spx_kvcache *c, spx_err *e) { return c->lowbit ? spx_kvlow_step_end(&c->low, e) : SPX_OK; }

double spx_kv_cache_bytes_per_token(const spx_kvcache *c) {
    if (c->lowbit) return spx_kvlow_bytes_per_token(&c->low.cfg, c->n_layers, c->kvd);
    return (double)spx_kv_bytes_per_token(c->type, c->n_layers, c->kvd);
}

void spx_kv_describe(const spx_kvcache *c, char *buf, size_t n) {
    const char *nm = spx_kv_type_name(c->type);
    if (!c->lowbit) {
        snprintf(buf, n, "kv %s, %.0f bytes per token", nm, spx_kv_cache_bytes_per_token(c));
        return;
    }
    const spx_kvlow_cfg *k = &c->low.cfg;
    int w = snprintf(buf, n, "kv %s (%s, group %lld, fp16 sinks %d + ring %lld), %.1f bytes per token", nm,
                     k->layout == SPX_KV_LAYOUT_ROT ? "rot" : "kivi", (long long)k->group, SPX_KVL_BLOCK,
                     (long long)c->low.ring, spx_kv_cache_bytes_per_token(c));
    if (w < 0 || (size_t)w >= n) return;
    if (!k->rb) {
        snprintf(buf + w, n - (size_t)w, "; no refinement");
        return;
    }
    char where[160] = "host RAM";
    if (c->low.ft) {
        spx_tier_stats ts;
        spx_tier_stats_get(c->low.ft, &ts);
        snprintf(where, sizeof where, "a file (%s) with a %.0f MiB RAM cache (%s misses, %s reads; %llu hits, %llu misses, %.1f MiB read from disk)",
                 spx_tier_path(c->low.ft), (double)ts.budget / (1 << 20), k->tier_wait ? "wait for" : "skip",
                 ts.direct ? "direct" : "buffered", (unsigned long long)ts.hits, (unsigned long long)ts.misses,
                 (double)ts.bytes_read / (1 << 20));
    }
    snprintf(buf + w, n - (size_t)w,
             "; refine +%d/+%d bits, %g of %lld-token groups, tier %.1f bytes per token in %s; %llu group "
             "refinements read %.1f MiB, %llu selected groups not cached",
             k->rb, k->rb, k->frac, (long long)k->gt, spx_kvlow_tier_bytes_per_token(k, c->n_layers, c->kvd), where,
             (unsigned long long)c->low.stats.groups_refined, (double)c->low.stats.bytes_read / (1 << 20),
             (unsigned long long)c->low.stats.groups_missed);
}

size_t spx_kv_work_floats(const spx_kvcache *c, int G) { return c->lowbit ? spx_kvlow_work_floats(&c->low, G) : 0; }

void spx_kv_attend_g(spx_kvcache *c, const spx_qkernels *kt, int64_t layer, int64_t kvh, int G, const float *q,
                     int64_t qs, int64_t start, int64_t end, float scale, float *sc, int64_t scs, float *out,
                     int64_t os, float *work) {
    if (!kt) kt = spx_qkernels_scalar();
    if (c->lowbit) {
        spx_kvlow_attend(&c->low, kt, layer, kvh, G, q, qs, start, end, scale, sc, scs, out, os, work);
        return;
    }
    spx_kv_scores_g(c, kt, layer, kvh, G, q, qs, start, end, scale, sc, scs);
    for (int g = 0; g < G; g++) kt->softmax(sc + (size_t)g * (size_t)scs, end - start);
    spx_kv_weighted_v_g(c, kt, layer, kvh, G, sc, scs, start, end, out, os);
}

void spx_kv_free(spx_kvcache *c) {
    if (c->lowbit) spx_kvlow_free(&c->low);
    free(c->k);
    free(c->v);
    c->k = c->v = NULL;
}

static uint8_t *row_at(const spx_kvcache *c, uint8_t *base, int64_t layer, int64_t pos) {
    return base + ((size_t)layer * (size_t)c->n_ctx + (size_t)pos) * c->row_bytes;
}

static void store_row(const spx_kvcache *c, uint8_t *dst, const float *x) {
    switch (c->type) {
    case SPX_KV_F32: memcpy(dst, x, (size_t)c->kvd * 4); break;
    case SPX_KV_Q4: {
        float tmp[8192];
        const float *src = x;
        if (c->kvd <= 8192) { /* kvd is capped at load; larger rows are stored unrotated */
            memcpy(tmp, x, (size_t)c->kvd * sizeof *tmp);
            spx_kv_rotate(tmp, c->kvd, c->rot);
            src = tmp;
        }
        spx_q_quantize_row(src, c->kvd, NULL, 4, KV_GROUP, SPX_Q_MINMAX, dst, (uint16_t *)(dst + c->codes_b),
                           dst + c->scales_b);
        break;
    }
    default: {
        uint16_t *h = (uint16_t *)dst;
        for (int64_t i = 0; i < c->kvd; i++) h[i] = spx_f32_to_f16(x[i]);
    }
    }
}

void spx_kv_store(spx_kvcache *c, int64_t layer, int64_t pos, const float *k, const float *v) {
    if (c->lowbit) {
        spx_kvlow_store(&c->low, layer, pos, k, v);
        return;
    }
    store_row(c, row_at(c, c->k, layer, pos), k);
    store_row(c, row_at(c, c->v, layer, pos), v);
}

/* q4 group g of a row: codes (16 bytes: k and k+16 nibbles), scale, zero */
static inline void q4_group(const spx_kvcache *c, const uint8_t *row, int64_t g, const uint8_t **codes, float *s,
                            int *z) {
    *codes = row + g * (KV_GROUP / 2);
    *s = spx_f16_to_f32(((const uint16_t *)(row + c->codes_b))[g]);
    *z = spx_q_zero_get(row + c->scales_b, g);
}

/* Heads are taken up to KV_GMAX at a time (q4: each head's rotated q and
 * group sums on the stack); per head the arithmetic is the one-head
 * call's, in its order. */
#define KV_GMAX 4

void spx_kv_scores_g(const spx_kvcache *c, const spx_qkernels *kt, int64_t layer, int64_t kvh, int G, const float *q,
                     int64_t qs, int64_t start, int64_t end, float scale, float *out, int64_t os) {
    int64_t hd = c->head_dim, off = kvh * hd;
    if (!kt) kt = spx_qkernels_scalar();
    if (c->type == SPX_KV_F16) { /* rows are row_bytes apart: the table takes them all, for all G heads */
        if (end > start)
            kt->scores_f16(q, qs, G, (const uint16_t *)row_at(c, c->k, layer, start) + off,
                           (int64_t)(c->row_bytes / 2), end - start, hd, scale, out, os);
        return;
    }
    if (c->type == SPX_KV_F32) {
        for (int g = 0; g < G; g++)
            for (int64_t i = start; i < end; i++)
                out[g * os + i - start] = spx_cpu_dot(q + g * qs, (const float *)row_at(c, c->k, layer, i) + off, hd) * scale;
        return;
    }
    float qr[KV_GMAX][2048], qsum[KV_GMAX][64]; /* head_dim <= 2048 checked at init; 33 KB of stack */
    for (int g0 = 0; g0 < G; g0 += KV_GMAX) {
        const int gc = G - g0 < KV_GMAX ? G - g0 : KV_GMAX;
        for (int g = 0; g < gc; g++) {
            memcpy(qr[g], q + (g0 + g) * qs, (size_t)hd * sizeof(float));
            if (c->kvd <= 8192) spx_kv_rotate(qr[g], hd, c->rot);
            for (int64_t b = 0; b < hd / KV_GROUP; b++) {
                float sm = 0;
                for (int k = 0; k < KV_GROUP; k++) sm += qr[g][b * KV_GROUP + k];
                qsum[g][b] = sm;
            }
        }
        for (int64_t i = start; i < end; i++) {
            const uint8_t *row = row_at(c, c->k, layer, i);
            float d[KV_GMAX] = {0}, dots[KV_GMAX];
            /* sum_k (code_k - z) s q_k = s (sum_k code_k q_k - z qsum) */
            for (int64_t b = 0; b < hd / KV_GROUP; b++) {
                const uint8_t *cd;
                float sc;
                int z;
                q4_group(c, row, off / KV_GROUP + b, &cd, &sc, &z);
                kt->dot_q4g(qr[0] + b * KV_GROUP, 2048, gc, cd, dots);
                for (int g = 0; g < gc; g++) d[g] += sc * (dots[g] - (float)z * qsum[g][b]);
            }
            for (int g = 0; g < gc; g++) out[(g0 + g) * os + i - start] = d[g] * scale;
        }
    }
}

void spx_kv_weighted_v_g(const spx_kvcache *c, const spx_qkernels *kt, int64_t layer, int64_t kvh, int G,
                         const float *p, int64_t ps, int64_t start, int64_t end, float *out, int64_t os) {
    int64_t hd = c->head_dim, off = kvh * hd;
    if (!kt) kt = spx_qkernels_scalar();
    for (int g = 0; g < G; g++) memset(out + g * os, 0, (size_t)hd * sizeof *out);
    if (c->type == SPX_KV_F16) {
        if (end > start)
            kt->wv_f16(out, os, p, ps, G, (const uint16_t *)row_at(c, c->v, layer, start) + off,
                       (int64_t)(c->row_bytes / 2), end - start, hd);
        return;
    }
    if (c->type == SPX_KV_F32) {
        for (int g = 0; g < G; g++)
            for (int64_t i = start; i < end; i++) {
                const float *v = (const float *)row_at(c, c->v, layer, i) + off, pr = p[g * ps + i - start];
                for (int64_t j = 0; j < hd; j++) out[g * os + j] += pr * v[j];
            }
        return;
    }
    for (int g0 = 0; g0 < G; g0 += KV_GMAX) {
        const int gc = G - g0 < KV_GMAX ? G - g0 : KV_GMAX;
        for (int64_t i = start; i < end; i++) {
            const uint8_t *row = row_at(c, c->v, layer, i);
            for (int64_t b = 0; b < hd / KV_GROUP; b++) {
                const uint8_t *cd;
                float sc, a[KV_GMAX];
                int z;
                q4_group(c, row, off / KV_GROUP + b, &cd, &sc, &z);
                for (int g = 0; g < gc; g++) a[g] = p[(g0 + g) * ps + i - start] * sc;
                kt->axpy_q4g(out + g0 * os + b * KV_GROUP, os, a, gc, z, cd);
            }
        }
    }
    if (c->kvd <= 8192)
        for (int g = 0; g < G; g++) spx_kv_rotate(out + g * os, hd, c->rot);
}

void spx_kv_scores(const spx_kvcache *c, const spx_qkernels *kt, int64_t layer, int64_t kvh, const float *q,
                   int64_t start, int64_t end, float scale, float *out) {
    spx_kv_scores_g(c, kt, layer, kvh, 1, q, c->head_dim, start, end, scale, out, 0);
}

void spx_kv_weighted_v(const spx_kvcache *c, const spx_qkernels *kt, int64_t layer, int64_t kvh, const float *p,
                       int64_t start, int64_t end, float *out) {
    spx_kv_weighted_v_g(c, kt, layer, kvh, 1, p, 0, start, end, out, 0);
}

void spx_kv_dequant_row(const spx_kvcache *c, int64_t layer, int64_t pos, int value, float *out) {
    if (c->lowbit) {
        (void)spx_kvlow_dequant_row(&c->low, layer, pos, value, 0, out, NULL); /* unrefined: cannot fail */
        return;
    }
    const uint8_t *row = row_at(c, value ? c->v : c->k, layer, pos);
    switch (c->type) {
    case SPX_KV_F32: memcpy(out, row, (size_t)c->kvd * 4); break;
    case SPX_KV_Q4:
        spx_q_dequantize_row(row, (const uint16_t *)(row + c->codes_b), row + c->scales_b, c->kvd, 4, KV_GROUP, out);
        if (c->kvd <= 8192) spx_kv_rotate(out, c->kvd, c->rot); /* H is its own inverse */
        break;
    default:
        for (int64_t i = 0; i < c->kvd; i++) out[i] = spx_f16_to_f32(((const uint16_t *)row)[i]);
    }
}
