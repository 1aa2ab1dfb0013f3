/* kvlow.c: the low-bit KV cache's configuration, storage, encoding and
 * decoding (kvlow.h; attention over it is kvlow_attend.c). */
#include "engine/kvlow.h"
#include "engine/kvcache.h"
#include "engine/kvlow_internal.h"
#include "core/half.h"
#include "refine/tier.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int spx_kv_type_lowbit(spx_kv_type t) { return t >= SPX_KV_K2V2 && t <= SPX_KV_K4V4; }

spx_status spx_kvlow_config(spx_kv_type t, const spx_session_params *p, int gpu, int64_t head_dim,
                            spx_kvlow_cfg *out, spx_err *e) {
    static const int bits[4][2] = {{2, 2}, {3, 2}, {3, 3}, {4, 4}};
    if (!spx_kv_type_lowbit(t)) return spx_fail(e, SPX_ERR_ARG, "KV type %d is not a low-bit type", (int)t);
    spx_kvlow_cfg c = {0};
    c.kb = bits[t - SPX_KV_K2V2][0];
    c.vb = bits[t - SPX_KV_K2V2][1];
    c.layout = SPX_KV_LAYOUT_KIVI;
    c.group = 32;
    c.frac = 1.0 / 128;
    c.gt = gpu ? 2 : 4;
    if (p) {
        if (p->kv_layout) c.layout = p->kv_layout;
        if (p->kv_group) c.group = p->kv_group;
        c.rb = p->kv_refine;
        if (p->kv_refine_frac > 0) c.frac = p->kv_refine_frac;
        if (p->kv_refine_tokens) c.gt = p->kv_refine_tokens;
        if (p->kv_tier_dir) {
            if (gpu)
                return spx_fail(e, SPX_ERR_UNSUPPORTED,
                                "--kv-tier %s: a file tier is for the CPU backend; a GPU keeps the refinement bits in "
                                "pinned host RAM (leave --kv-tier out, or use --backend cpu)", p->kv_tier_dir);
            c.tier_dir = p->kv_tier_dir;
            if (!p->kv_refine) c.rb = 4;
            if (p->kv_tier_cache_mb < 0 || p->kv_tier_cache_mb > ((int64_t)1 << 30))
                return spx_fail(e, SPX_ERR_ARG, "--kv-tier-cache %lld MiB is out of range", (long long)p->kv_tier_cache_mb);
            c.tier_cache = (uint64_t)(p->kv_tier_cache_mb ? p->kv_tier_cache_mb : 256) << 20;
            c.tier_wait = p->kv_tier_wait != 0;
        }
    }
    if (c.layout != SPX_KV_LAYOUT_KIVI && c.layout != SPX_KV_LAYOUT_ROT)
        return spx_fail(e, SPX_ERR_ARG, "KV layout %d is not kivi (1) or rot (2)", c.layout);
    if (head_dim % 8)
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "a low-bit KV cache needs head_dim to be a multiple of 8; this model has %lld",
                        (long long)head_dim);
    if (head_dim > 2048)
        return spx_fail(e, SPX_ERR_UNSUPPORTED, "a low-bit KV cache supports head_dim up to 2048; this model has %lld",
                        (long long)head_dim);
    if (c.group < 8 || head_dim % c.group)
        return spx_fail(e, SPX_ERR_ARG, "--kv-group %lld must be at least 8 and divide head_dim %lld", (long long)c.group,
                        (long long)head_dim);
    if (c.rb < 0 || c.rb > 8) return spx_fail(e, SPX_ERR_ARG, "--kv-refine %d is not in 0..8 bits", c.rb);
    if (c.tier_dir && !c.rb)
        return spx_fail(e, SPX_ERR_ARG, "--kv-tier %s holds refinement bits: --kv-refine must be 1..8", c.tier_dir);
    if (c.gt < 1 || SPX_KVL_BLOCK % c.gt)
        return spx_fail(e, SPX_ERR_ARG, "--kv-refine-group %lld tokens must divide %d", (long long)c.gt, SPX_KVL_BLOCK);
    if (!(c.frac > 0 && c.frac <= 1))
        return spx_fail(e, SPX_ERR_ARG, "--kv-refine-frac %g is not in (0, 1]", c.frac);
    *out = c;
    return SPX_OK;
}

double spx_kvlow_bytes_per_token(const spx_kvlow_cfg *c, int64_t n_layers, int64_t kvd) {
    double kmeta = c->layout == SPX_KV_LAYOUT_KIVI ? 4.0 * (double)kvd / SPX_KVL_BLOCK : 4.0 * (double)(kvd / c->group);
    double row = (double)kvd * (c->kb + c->vb) / 8.0 + kmeta + 4.0 * (double)(kvd / c->group);
    return row * (double)n_layers;
}

static int64_t ring_rows(int64_t batch) {
    return SPX_KVL_BLOCK * ((batch + SPX_KVL_BLOCK - 1) / SPX_KVL_BLOCK + 1);
}

size_t spx_kvlow_fixed_bytes(int64_t n_layers, int64_t kvd, int64_t batch) {
    return (size_t)n_layers * (size_t)(SPX_KVL_BLOCK + ring_rows(batch)) * (size_t)kvd * 2 * 2;
}

double spx_kvlow_tier_bytes_per_token(const spx_kvlow_cfg *c, int64_t n_layers, int64_t kvd) {
    return c->rb ? (double)kvd * 2.0 * c->rb / 8.0 * (double)n_layers : 0;
}

void spx_kvlow_free(spx_kvlow *k) {
    void *p[] = {k->sink_k, k->sink_v, k->ring_k, k->ring_v, k->ck,   k->cv,
                 k->mk,     k->mv,     k->enc,    k->tier,   k->enc_x, k->enc_ref, k->enc_rec};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    spx_tier_close(k->ft);
    memset(k, 0, sizeof *k);
}

/* calloc of a product, + 8 bytes: bit readers load two bytes at a time */
static void *zalloc(size_t a, size_t b, int *fail) {
    size_t n;
    if (__builtin_mul_overflow(a, b, &n) || n > SIZE_MAX - 8) { *fail = 1; return NULL; }
    void *p = calloc(n + 8, 1);
    if (!p) *fail = 1;
    return p;
}

spx_status spx_kvlow_init(spx_kvlow *k, const spx_kvlow_cfg *c, int64_t n_layers, int64_t n_ctx, int64_t kvd,
                          int64_t head_dim, int64_t batch, spx_err *e) {
    memset(k, 0, sizeof *k);
    k->cfg = *c;
    k->n_layers = n_layers;
    k->n_ctx = n_ctx;
    k->kvd = kvd;
    k->hd = head_dim;
    k->nkv = kvd / head_dim;
    k->rot = spx_kv_rot_block(head_dim);
    k->ring = ring_rows(batch);
    k->krow = (size_t)kvd * (size_t)c->kb / 8;
    k->vrow = (size_t)kvd * (size_t)c->vb / 8;
    k->n_blocks = (n_ctx + SPX_KVL_BLOCK - 1) / SPX_KVL_BLOCK;
    k->n_groups = n_ctx > SPX_KVL_BLOCK ? (n_ctx - SPX_KVL_BLOCK) / c->gt + 1 : 0;
    k->gbytes = (size_t)(c->gt * head_dim * c->rb / 8) * 2;
    const size_t L = (size_t)n_layers, D = (size_t)kvd, T = (size_t)n_ctx, ng = (size_t)(kvd / c->group);
    int fail = 0;
    k->sink_k = zalloc(L * SPX_KVL_BLOCK * D, 2, &fail);
    k->sink_v = zalloc(L * SPX_KVL_BLOCK * D, 2, &fail);
    k->ring_k = zalloc(L * (size_t)k->ring * D, 2, &fail);
    k->ring_v = zalloc(L * (size_t)k->ring * D, 2, &fail);
    k->ck = zalloc(L * T, k->krow, &fail);
    k->cv = zalloc(L * T, k->vrow, &fail);
    if (c->layout == SPX_KV_LAYOUT_KIVI) k->mk = zalloc(L * (size_t)k->n_blocks * D, 4, &fail);
    else k->mk = zalloc(L * T * ng, 4, &fail);
    k->mv = zalloc(L * T * ng, 4, &fail);
    k->enc = zalloc(L, sizeof *k->enc, &fail);
    const size_t n_rec = L * (size_t)k->n_groups * (size_t)k->nkv;
    if (c->rb && !c->tier_dir) k->tier = zalloc(n_rec, k->gbytes, &fail);
    if (c->rb) k->enc_rec = zalloc(1, k->gbytes, &fail);
    const size_t blk = (size_t)SPX_KVL_BLOCK * (size_t)head_dim;
    k->enc_x = zalloc(blk > 2 * D ? blk : 2 * D, sizeof *k->enc_x, &fail);
    k->enc_ref = zalloc(2 * blk, sizeof *k->enc_ref, &fail);
    if (fail) {
        double mib = (spx_kvlow_bytes_per_token(c, n_layers, kvd) + spx_kvlow_tier_bytes_per_token(c, n_layers, kvd)) *
                         (double)n_ctx / (1 << 20);
        spx_kvlow_free(k);
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory for a %.1f MiB low-bit KV cache (and its refinement tier)", mib);
    }
    k->cfg.tier_dir = NULL; /* the caller's string: not kept */
    if (c->rb && c->tier_dir) { /* also for a context within the sinks (no record): the folder is checked */
        spx_status st = spx_tier_create(c->tier_dir, n_rec ? (uint64_t)n_rec * k->gbytes : 1, c->tier_cache,
                                        c->tier_wait ? SPX_TIER_WAIT : SPX_TIER_SKIP, 2, &k->ft, e);
        if (st != SPX_OK) {
            spx_kvlow_free(k);
            return st;
        }
    }
    spx_kvlow_reset(k);
    return SPX_OK;
}

void spx_kvlow_reset(spx_kvlow *k) {
    for (int64_t l = 0; l < k->n_layers; l++) k->enc[l] = SPX_KVL_BLOCK; /* stats count since init */
}

void spx_kvlow_store(spx_kvlow *k, int64_t layer, int64_t pos, const float *kr, const float *vr) {
    uint16_t *dk, *dv;
    if (pos < SPX_KVL_BLOCK) {
        dk = kvl_sink(k, k->sink_k, layer, pos);
        dv = kvl_sink(k, k->sink_v, layer, pos);
    } else {
        dk = kvl_ring(k, k->ring_k, layer, pos);
        dv = kvl_ring(k, k->ring_v, layer, pos);
    }
    for (int64_t i = 0; i < k->kvd; i++) {
        dk[i] = spx_f32_to_f16(kr[i]);
        dv[i] = spx_f32_to_f16(vr[i]);
    }
}

/* x in a bin of (m, s): the code and the refinement index */
static inline void enc_one(float x, float m, float s, int b, int rb, unsigned *code, unsigned *ref) {
    const int top = (1 << b) - 1;
    if (!(s > 0)) {
        *code = 0;
        *ref = 0;
        return;
    }
    float u = (x - m) / s;
    long c = lrintf(u);
    if (c < 0) c = 0;
    if (c > top) c = top;
    *code = (unsigned)c;
    if (rb) {
        long j = (long)floorf((u - (float)c + 0.5f) * (float)(1 << rb));
        if (j < 0) j = 0;
        if (j > (1 << rb) - 1) j = (1 << rb) - 1;
        *ref = (unsigned)j;
    } else *ref = 0;
}

/* (m, s) of x[n] (stride 1) for b bits, stored fp16; the rounded pair back */
static void minmax_pair(const float *x, int64_t n, int64_t stride, int b, uint16_t *dst, float *m, float *s) {
    float lo = x[0], hi = x[0];
    for (int64_t i = 1; i < n; i++) {
        float v = x[i * stride];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    dst[0] = spx_f32_to_f16(lo);
    dst[1] = spx_f32_to_f16((hi - lo) / (float)((1 << b) - 1));
    *m = spx_f16_to_f32(dst[0]);
    *s = spx_f16_to_f32(dst[1]);
}

/* Encodes one block of one layer from the ring. */
static spx_status encode_block(spx_kvlow *k, int64_t layer, int64_t blk, spx_err *e) {
    const spx_kvlow_cfg *c = &k->cfg;
    const int64_t hd = k->hd, P0 = blk * SPX_KVL_BLOCK, G = c->group;
    float *x = k->enc_x; /* one head's block, [token][channel] */
    unsigned *refk = k->enc_ref, *refv = k->enc_ref + SPX_KVL_BLOCK * hd;
    for (int64_t h = 0; h < k->nkv; h++) {
        for (int which = 0; which < 2; which++) {
            const int b = which ? c->vb : c->kb;
            unsigned *ref = which ? refv : refk;
            for (int64_t t = 0; t < SPX_KVL_BLOCK; t++) {
                const uint16_t *src = kvl_ring(k, which ? k->ring_v : k->ring_k, layer, P0 + t) + h * hd;
                for (int64_t i = 0; i < hd; i++) x[t * hd + i] = spx_f16_to_f32(src[i]);
                if (c->layout == SPX_KV_LAYOUT_ROT) spx_kv_rotate(x + t * hd, hd, k->rot);
            }
            if (!which && c->layout == SPX_KV_LAYOUT_KIVI) { /* per channel over the block */
                for (int64_t i = 0; i < hd; i++) {
                    float m, s;
                    uint16_t *mp = kvl_kmeta_kivi(k, layer, blk) + 2 * (h * hd + i);
                    minmax_pair(x + i, SPX_KVL_BLOCK, hd, b, mp, &m, &s);
                    for (int64_t t = 0; t < SPX_KVL_BLOCK; t++) {
                        unsigned code;
                        enc_one(x[t * hd + i], m, s, b, c->rb, &code, &ref[t * hd + i]);
                        kvl_put_bits(kvl_codes(k, 0, layer, P0 + t), h * hd + i, b, code);
                    }
                }
                continue;
            }
            for (int64_t t = 0; t < SPX_KVL_BLOCK; t++)
                for (int64_t g = 0; g < hd; g += G) {
                    float m, s;
                    uint16_t *mp = kvl_meta_tok(k, which, layer, P0 + t) + 2 * ((h * hd + g) / G);
                    minmax_pair(x + t * hd + g, G, 1, b, mp, &m, &s);
                    for (int64_t i = g; i < g + G; i++) {
                        unsigned code;
                        enc_one(x[t * hd + i], m, s, b, c->rb, &code, &ref[t * hd + i]);
                        kvl_put_bits(kvl_codes(k, which, layer, P0 + t), h * hd + i, b, code);
                    }
                }
        }
        if (!c->rb) continue;
        for (int64_t t0 = 0; t0 < SPX_KVL_BLOCK; t0 += c->gt) {
            const int64_t grp = (P0 + t0 - SPX_KVL_BLOCK) / c->gt;
            uint8_t *rec = k->ft ? k->enc_rec : kvl_tier(k, layer, grp, h);
            memset(rec, 0, k->gbytes);
            const int64_t n = c->gt * hd;
            for (int64_t i = 0; i < n; i++) {
                kvl_put_bits(rec, i, c->rb, refk[t0 * hd + i]);
                kvl_put_bits(rec, n + i, c->rb, refv[t0 * hd + i]);
            }
            if (k->ft) SPX_TRY(spx_tier_put(k->ft, kvl_rec_off(k, layer, grp, h), (uint32_t)k->gbytes, rec, e));
        }
    }
    return SPX_OK;
}

spx_status spx_kvlow_error(const spx_kvlow *k, spx_err *e) {
    if (!__atomic_load_n(&k->failed, __ATOMIC_ACQUIRE)) return SPX_OK;
    return spx_fail(e, k->ferr.code, "%s", k->ferr.msg);
}

spx_status spx_kvlow_commit(spx_kvlow *k, int64_t layer, int64_t pos_end, spx_err *e) {
    SPX_TRY(spx_kvlow_error(k, e)); /* this call's attention, just run */
    while (k->enc[layer] + SPX_KVL_BLOCK <= pos_end) {
        SPX_TRY(encode_block(k, layer, k->enc[layer] / SPX_KVL_BLOCK, e));
        k->enc[layer] += SPX_KVL_BLOCK;
    }
    return SPX_OK;
}

spx_status spx_kvlow_step_end(spx_kvlow *k, spx_err *e) { return k->ft ? spx_tier_step_end(k->ft, e) : SPX_OK; }

spx_status spx_kvlow_dequant_row(const spx_kvlow *k, int64_t layer, int64_t pos, int value, int refined, float *out,
                                 spx_err *e) {
    const int64_t hd = k->hd;
    if (pos < SPX_KVL_BLOCK || pos >= k->enc[layer]) {
        const uint16_t *r = pos < SPX_KVL_BLOCK ? kvl_sink(k, value ? k->sink_v : k->sink_k, layer, pos)
                                                : kvl_ring(k, value ? k->ring_v : k->ring_k, layer, pos);
        for (int64_t i = 0; i < k->kvd; i++) out[i] = spx_f16_to_f32(r[i]);
        return SPX_OK;
    }
    const spx_kvlow_cfg *c = &k->cfg;
    const int b = value ? c->vb : c->kb;
    const uint8_t *codes = kvl_codes(k, value, layer, pos);
    const int64_t gi = (pos - SPX_KVL_BLOCK) / c->gt, t = (pos - SPX_KVL_BLOCK) % c->gt;
    for (int64_t h = 0; h < k->nkv; h++) {
        const uint8_t *rec = NULL;
        if (refined && k->tier) rec = kvl_tier(k, layer, gi, h);
        if (refined && k->ft) {
            SPX_TRY(spx_tier_read_now(k->ft, kvl_rec_off(k, layer, gi, h), (uint32_t)k->gbytes, k->enc_rec, e));
            rec = k->enc_rec;
        }
        for (int64_t i = 0; i < hd; i++) {
            float m, s;
            kvl_bin(k, value, layer, pos, h * hd + i, &m, &s);
            float x = m + s * (float)kvl_get_bits(codes, h * hd + i, b);
            if (rec) {
                unsigned j = kvl_get_bits(rec, (value ? c->gt * hd : 0) + t * hd + i, c->rb);
                x += s * (((float)j + 0.5f) / (float)(1 << c->rb) - 0.5f);
            }
            out[h * hd + i] = x;
        }
        if (c->layout == SPX_KV_LAYOUT_ROT) spx_kv_rotate(out + h * hd, hd, k->rot); /* its own inverse */
    }
    return SPX_OK;
}

spx_status spx_kvlow_truncate(spx_kvlow *k, int64_t pos, spx_err *e) {
    float *row = k->enc_x;
    for (int64_t l = 0; l < k->n_layers; l++) {
        if (k->enc[l] <= pos) continue;
        int64_t ne = pos / SPX_KVL_BLOCK * SPX_KVL_BLOCK;
        if (ne < SPX_KVL_BLOCK) ne = SPX_KVL_BLOCK;
        for (int64_t p = ne; p < pos; p++) { /* ring rows of [ne, pos) are free: enc[l] > pos */
            SPX_TRY(spx_kvlow_dequant_row(k, l, p, 0, 1, row, e));
            SPX_TRY(spx_kvlow_dequant_row(k, l, p, 1, 1, row + k->kvd, e));
            uint16_t *dk = kvl_ring(k, k->ring_k, l, p), *dv = kvl_ring(k, k->ring_v, l, p);
            for (int64_t i = 0; i < k->kvd; i++) {
                dk[i] = spx_f32_to_f16(row[i]);
                dv[i] = spx_f32_to_f16(row[k->kvd + i]);
            }
        }
        k->enc[l] = ne;
    }
    return SPX_OK;
}
