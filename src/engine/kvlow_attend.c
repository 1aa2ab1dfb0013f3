/* kvlow_attend.c: attention over the low-bit KV cache with the selection
 * of token groups (paper eq. 7) and the exact update for the refined ones
 * (eq. 8), fused into the value pass (kvlow.h gives the algorithm).
 *
 * The fp16 parts (sinks, ring) go through the kernel table's fp16 entries;
 * the encoded part decodes each head's row of codes into floats (a lookup
 * per byte) and runs the products on them. */
#include "engine/kvlow.h"
#include "engine/kvcache.h"
#include "engine/kvlow_internal.h"
#include "refine/tier.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* n codes of b bits from p (a head's first byte) into out[n] as floats */
static void unpack_c(const uint8_t *p, int b, int64_t n, float *out) {
    if (b == 2) {
        for (int64_t i = 0; i < n; i += 4) {
            unsigned x = p[i / 4];
            out[i] = (float)(x & 3);
            out[i + 1] = (float)((x >> 2) & 3);
            out[i + 2] = (float)((x >> 4) & 3);
            out[i + 3] = (float)(x >> 6);
        }
    } else if (b == 4) {
        for (int64_t i = 0; i < n; i += 2) {
            unsigned x = p[i / 2];
            out[i] = (float)(x & 15);
            out[i + 1] = (float)(x >> 4);
        }
    } else if (b == 3) {
        for (int64_t i = 0; i < n; i += 8) {
            const uint8_t *q = p + i / 8 * 3;
            unsigned x = (unsigned)q[0] | (unsigned)q[1] << 8 | (unsigned)q[2] << 16;
            for (int k = 0; k < 8; k++) out[i + k] = (float)((x >> (3 * k)) & 7);
        }
    } else
        for (int64_t i = 0; i < n; i++) out[i] = (float)kvl_get_bits(p, i, b);
}

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Over the positions of [start, end) outside the refined groups (idx
 * ascending; a group whose record is NULL counts as not refined): their
 * largest sg[p] before scaling, and sg[p] *= f when f != 1. */
static float nonref_runs(float *sg, int64_t start, int64_t end, const int64_t *idx, const uint8_t *const *recs,
                         int64_t n_sel, int64_t gA, int64_t gt, float f) {
    float mx = 0;
    int64_t at = start;
    for (int64_t si = 0; si <= n_sel; si++) { /* the run [at, next refined group) */
        if (si < n_sel && !recs[si]) continue;
        const int64_t p0 = si < n_sel ? SPX_KVL_BLOCK + (gA + idx[si]) * gt : end;
        for (int64_t p = at; p < p0; p++) {
            mx = fmaxf(mx, sg[p]);
            if (f != 1.0f) sg[p] *= f;
        }
        at = p0 + gt;
    }
    return mx;
}

static float dotf_c(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* a[i] += x * r[i] + y */
static void axpb_c(float *a, float x, const float *r, float y, int64_t n) {
    for (int64_t i = 0; i < n; i++) a[i] += x * r[i] + y;
}

#if defined(__x86_64__)
#include <immintrin.h>
#define KVL_AVX2 __attribute__((target("avx2,fma")))
/* 8 codes of b <= 4 bits (b bytes, little-endian) per step: the b-byte
 * word broadcast, each lane shifted by its code's bit offset */
KVL_AVX2 static void unpack_avx2(const uint8_t *p, int b, int64_t n, float *out) {
    if (b > 4 || n % 8) {
        unpack_c(p, b, n, out);
        return;
    }
    const __m256i sh = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(b));
    const __m256i mask = _mm256_set1_epi32((1 << b) - 1);
    for (int64_t i = 0; i < n; i += 8) {
        uint32_t w; /* 4 bytes read for b <= 4: the code arrays carry 8 bytes of slack */
        memcpy(&w, p + i / 8 * b, 4);
        __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), mask);
        _mm256_storeu_ps(out + i, _mm256_cvtepi32_ps(v));
    }
}
KVL_AVX2 static float dotf_avx2(const float *a, const float *b, int64_t n) {
    if (n % 8) return dotf_c(a, b, n);
    __m256 s = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}
KVL_AVX2 static void axpb_avx2(float *a, float x, const float *r, float y, int64_t n) {
    if (n % 8) {
        axpb_c(a, x, r, y, n);
        return;
    }
    const __m256 vx = _mm256_set1_ps(x), vy = _mm256_set1_ps(y);
    for (int64_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_fmadd_ps(vx, _mm256_loadu_ps(r + i), vy)));
}
#endif

/* The encoded part's three steps, chosen once: AVX2+FMA where the CPU has
 * it and the kernel table is not the scalar reference (a variant sums in
 * another order: rounding only), else the plain loops. */
typedef struct {
    void (*unpack)(const uint8_t *, int, int64_t, float *);
    float (*dot)(const float *, const float *, int64_t);
    void (*axpb)(float *, float, const float *, float, int64_t);
} kvl_ops;

static kvl_ops pick_ops(const spx_qkernels *kt) {
    const kvl_ops plain = {unpack_c, dotf_c, axpb_c};
#if defined(__x86_64__)
    static int avx2 = -1; /* racing first calls store the same value */
    if (avx2 < 0) avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (kt != spx_qkernels_scalar() && avx2) return (kvl_ops){unpack_avx2, dotf_avx2, axpb_avx2};
#endif
    return plain;
}

int64_t spx_kvlow_n_sel(double frac, int64_t candidates) {
    if (candidates <= 0 || frac <= 0) return 0; /* frac 0: none (the tests' resident-path check) */
    if (frac >= 1) return candidates;
    int64_t n = (int64_t)floor(frac * (double)candidates + 0.5);
    return n < 1 ? 1 : n > candidates ? candidates : n;
}

/* a before b: higher score, ties by lower index */
static inline int better(const float *s, int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); }

void spx_kvlow_select(const float *score, int64_t n, int64_t n_sel, int64_t *idx) {
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    if (n_sel >= n) return;
    int64_t lo = 0, hi = n; /* the first n_sel of the order lie in idx[0 .. n_sel) once [lo, hi) shrinks to them */
    while (hi - lo > 1) {
        /* median of three as pivot, moved to hi - 1; Lomuto partition */
        int64_t mid = lo + (hi - lo) / 2, a = idx[lo], b = idx[mid], c = idx[hi - 1], pv;
        if (better(score, a, b) == better(score, b, c)) pv = mid;
        else if (better(score, b, a) == better(score, a, c)) pv = lo;
        else pv = hi - 1;
        int64_t t = idx[pv];
        idx[pv] = idx[hi - 1];
        idx[hi - 1] = t;
        const int64_t p = idx[hi - 1];
        int64_t st = lo;
        for (int64_t i = lo; i < hi - 1; i++)
            if (better(score, idx[i], p)) {
                t = idx[i];
                idx[i] = idx[st];
                idx[st] = t;
                st++;
            }
        idx[hi - 1] = idx[st];
        idx[st] = p; /* idx[st] is the (st+1)-th best of [lo, hi) */
        if (st == n_sel || st + 1 == n_sel) return;
        if (st < n_sel) lo = st + 1;
        else hi = st;
    }
}

/* work layout: [idx: n_groups int64][recs: n_groups pointers][offs: n_groups uint64][gscore: n_groups]
 *              [lens: n_groups uint32][qx: G hd][qk: G hd][acc: G hd][row: hd][cst: G][zn: G][qgs: G hd / group] */
size_t spx_kvlow_work_floats(const spx_kvlow *k, int G) {
    size_t n = (size_t)k->n_groups * 8 + (size_t)G * (size_t)k->hd * 4 + (size_t)k->hd + 2 * (size_t)G;
    return (n + 15) / 16 * 16; /* per-thread slices of one array stay 64-byte aligned: idx is int64 */
}

void spx_kvlow_attend(spx_kvlow *k, const spx_qkernels *kt, int64_t layer, int64_t kvh, int G, const float *q,
                      int64_t qs, int64_t start, int64_t end, float scale, float *sc, int64_t scs, float *out,
                      int64_t os, float *work) {
    const spx_kvlow_cfg *c = &k->cfg;
    const int64_t hd = k->hd, off = kvh * hd, D = k->kvd, enc = k->enc[layer], gr = c->group, ngr = hd / gr;
    const int rot = c->layout == SPX_KV_LAYOUT_ROT;
    if (!kt) kt = spx_qkernels_scalar();
    const kvl_ops ops = pick_ops(kt);
    int64_t *idx = (int64_t *)work;
    const uint8_t **recs = (const uint8_t **)(work + 2 * k->n_groups);
    uint64_t *offs = (uint64_t *)(work + 4 * k->n_groups);
    float *gscore = work + 6 * k->n_groups;
    uint32_t *lens = (uint32_t *)(gscore + k->n_groups);
    float *qx = gscore + 2 * k->n_groups, *qk = qx + G * hd, *acc = qk + G * hd;
    float *row = acc + G * hd, *cst = row + hd, *zn = cst + G, *qgs = zn + G;
    /* regions within [start, end) */
    const int64_t s_end = end < SPX_KVL_BLOCK ? end : SPX_KVL_BLOCK;
    const int64_t l0 = start > SPX_KVL_BLOCK ? start : SPX_KVL_BLOCK, l1 = end < enc ? end : enc;
    const int64_t ring0 = start > enc ? start : enc; /* the ring: [ring0, end) */
    /* query in the codes' coordinates */
    for (int g = 0; g < G; g++) {
        memcpy(qx + g * hd, q + g * qs, (size_t)hd * sizeof *qx);
        if (rot) spx_kv_rotate(qx + g * hd, hd, k->rot);
        for (int64_t j = 0; j < ngr; j++) {
            float sm = 0;
            for (int64_t i = 0; i < gr; i++) sm += qx[g * hd + j * gr + i];
            qgs[g * ngr + j] = sm;
        }
        zn[g] = 1; /* the resident probabilities sum to 1 */
    }
    /* scores: sinks, encoded, ring */
    if (s_end > start)
        kt->scores_f16(q, qs, G, kvl_sink(k, k->sink_k, layer, start) + off, D, s_end - start, hd, scale, sc, scs);
    int64_t blk_seen = -1;
    for (int64_t p = l0; p < l1; p++) {
        if (!rot && p / SPX_KVL_BLOCK != blk_seen) { /* KIVI: fold the block's per-channel (m, s) into the query */
            blk_seen = p / SPX_KVL_BLOCK;
            const uint16_t *mp = kvl_kmeta_kivi(k, layer, blk_seen) + 2 * off;
            for (int g = 0; g < G; g++) {
                float cs = 0;
                for (int64_t i = 0; i < hd; i++) {
                    float m = spx_f16_to_f32(mp[2 * i]), s = spx_f16_to_f32(mp[2 * i + 1]);
                    qk[g * hd + i] = qx[g * hd + i] * s;
                    cs += qx[g * hd + i] * m;
                }
                cst[g] = cs;
            }
        }
        ops.unpack(kvl_codes(k, 0, layer, p) + (size_t)off * (size_t)c->kb / 8, c->kb, hd, row);
        if (!rot) {
            for (int g = 0; g < G; g++) sc[g * scs + p - start] = scale * (cst[g] + ops.dot(qk + g * hd, row, hd));
        } else {
            const uint16_t *mp = kvl_meta_tok(k, 0, layer, p) + 2 * (off / gr);
            for (int g = 0; g < G; g++) {
                float d = 0;
                for (int64_t j = 0; j < ngr; j++)
                    d += spx_f16_to_f32(mp[2 * j + 1]) * ops.dot(qx + g * hd + j * gr, row + j * gr, gr) +
                         spx_f16_to_f32(mp[2 * j]) * qgs[g * ngr + j];
                sc[g * scs + p - start] = scale * d;
            }
        }
    }
    for (int64_t p = ring0; p < end;) {
        int64_t n = end - p, room = k->ring - p % k->ring;
        if (n > room) n = room;
        kt->scores_f16(q, qs, G, kvl_ring(k, k->ring_k, layer, p) + off, D, n, hd, scale, sc + (p - start), scs);
        p += n;
    }
    for (int g = 0; g < G; g++) kt->softmax(sc + g * scs, end - start);

    /* selection (eq. 7) and the refined probabilities (eq. 8's numerators) */
    int64_t n_sel = 0;
    const int64_t gt = c->gt, gA = (l0 - SPX_KVL_BLOCK + gt - 1) / gt, gB = l1 > l0 ? (l1 - SPX_KVL_BLOCK) / gt : gA;
    for (int g = 0; g < G; g++) { /* outputs: fp16 parts into out, encoded part into acc (codes' coordinates) */
        memset(out + g * os, 0, (size_t)hd * sizeof *out);
        memset(acc + g * hd, 0, (size_t)hd * sizeof *acc);
    }
    if ((k->tier || k->ft) && gB > gA) {
        const int64_t nc = gB - gA;
        for (int64_t gi = 0; gi < nc; gi++) {
            const int64_t p0 = SPX_KVL_BLOCK + (gA + gi) * gt;
            float best = 0;
            for (int g = 0; g < G; g++) {
                float sm = 0;
                for (int64_t t = 0; t < gt; t++) sm += sc[g * scs + p0 + t - start];
                best = g == 0 || sm > best ? sm : best;
            }
            gscore[gi] = best;
        }
        n_sel = spx_kvlow_n_sel(c->frac, nc);
        spx_kvlow_select(gscore, nc, n_sel, idx);
        qsort(idx, (size_t)n_sel, sizeof *idx, cmp_i64); /* ascending: the sweeps below skip refined runs in order */
        const float step = 1.0f / (float)(1 << c->rb);
        int64_t n_got = n_sel;
        if (k->ft) { /* the records in one batch: a miss (skip policy) is NULL and its group stays resident */
            for (int64_t si = 0; si < n_sel; si++) {
                offs[si] = kvl_rec_off(k, layer, gA + idx[si], kvh);
                lens[si] = (uint32_t)k->gbytes;
            }
            spx_err le;
            spx_err_clear(&le);
            if (spx_tier_get_many(k->ft, (size_t)n_sel, offs, lens, recs, &le) != SPX_OK) {
                int expect = 0; /* the first error is kept; the step fails in commit */
                if (__atomic_compare_exchange_n(&k->failed, &expect, 2, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
                    k->ferr = le;
                    __atomic_store_n(&k->failed, 1, __ATOMIC_RELEASE);
                }
            }
            n_got = 0;
            for (int64_t si = 0; si < n_sel; si++) n_got += recs[si] != NULL;
            __atomic_fetch_add(&k->stats.groups_missed, (uint64_t)(n_sel - n_got), __ATOMIC_RELAXED);
        } else
            for (int64_t si = 0; si < n_sel; si++) recs[si] = kvl_tier(k, layer, gA + idx[si], kvh);
        if (n_got > 0) {
            /* 1. refined tokens' log p' = log p + scale q.dk, in place, and
             *    their max per head (cst: free after the scores) */
            for (int g = 0; g < G; g++) cst[g] = -INFINITY;
            for (int64_t si = 0; si < n_sel; si++) {
                const int64_t p0 = SPX_KVL_BLOCK + (gA + idx[si]) * gt;
                const uint8_t *rec = recs[si];
                if (!rec) continue;
                for (int64_t t = 0; t < gt; t++) {
                    const int64_t p = p0 + t;
                    for (int64_t i = 0; i < hd; i++) { /* dk in the codes' coordinates */
                        float m, s;
                        kvl_bin(k, 0, layer, p, off + i, &m, &s);
                        row[i] = s * (((float)kvl_get_bits(rec, t * hd + i, c->rb) + 0.5f) * step - 0.5f);
                    }
                    for (int g = 0; g < G; g++) {
                        float *pp = sc + g * scs + p - start;
                        *pp = *pp > 0 ? logf(*pp) + scale * ops.dot(qx + g * hd, row, hd) : -INFINITY;
                        cst[g] = fmaxf(cst[g], *pp);
                    }
                }
            }
            /* 2. the new maximum over every token; the row is rescaled by
             *    e^-M only where M leaves [-20, 20] (p' could overflow, or
             *    the whole row underflow); otherwise it keeps p as is */
            for (int g = 0; g < G; g++) {
                float *sg = sc + g * scs - start;
                const float mx = nonref_runs(sg, start, end, idx, recs, n_sel, gA, gt, 1.0f);
                const float M = fmaxf(cst[g], mx > 0 ? logf(mx) : -INFINITY);
                const float shift = M >= -20.0f && M <= 20.0f ? 0.0f : M;
                if (shift != 0) nonref_runs(sg, start, end, idx, recs, n_sel, gA, gt, expf(-shift));
                for (int64_t si = 0; si < n_sel; si++)
                    if (recs[si])
                        for (int64_t t = 0, p0 = SPX_KVL_BLOCK + (gA + idx[si]) * gt; t < gt; t++)
                            sg[p0 + t] = expf(sg[p0 + t] - shift);
            }
            /* 3. p' dv from the records' value halves; the value pass below
             *    adds p' v for every token */
            for (int64_t si = 0; si < n_sel; si++) {
                const int64_t p0 = SPX_KVL_BLOCK + (gA + idx[si]) * gt;
                const uint8_t *rec = recs[si];
                if (!rec) continue;
                for (int64_t t = 0; t < gt; t++) {
                    const int64_t p = p0 + t;
                    const uint16_t *mp = kvl_meta_tok(k, 1, layer, p) + 2 * (off / gr);
                    for (int64_t i = 0; i < hd; i++)
                        row[i] = spx_f16_to_f32(mp[2 * (i / gr) + 1]) *
                                 (((float)kvl_get_bits(rec, (gt + t) * hd + i, c->rb) + 0.5f) * step - 0.5f);
                    for (int g = 0; g < G; g++) ops.axpb(acc + g * hd, sc[g * scs + p - start], row, 0, hd);
                }
            }
            /* 4. the normaliser summed directly (all terms >= 0): as
             *    1 + sum (p' - p) it cancels when the refined groups held
             *    nearly all the probability and refinement lowered them */
            for (int g = 0; g < G; g++) {
                float z = 0;
                for (int64_t p = 0; p < end - start; p++) z += sc[g * scs + p];
                zn[g] = z;
            }
        }
        __atomic_fetch_add(&k->stats.groups_refined, (uint64_t)n_got, __ATOMIC_RELAXED);
        __atomic_fetch_add(&k->stats.bytes_read, (uint64_t)n_got * k->gbytes, __ATOMIC_RELAXED);
    }

    /* value pass, with p' in place of p for the refined tokens */
    if (s_end > start)
        kt->wv_f16(out, os, sc, scs, G, kvl_sink(k, k->sink_v, layer, start) + off, D, s_end - start, hd);
    for (int64_t p = ring0; p < end;) {
        int64_t n = end - p, room = k->ring - p % k->ring;
        if (n > room) n = room;
        kt->wv_f16(out, os, sc + (p - start), scs, G, kvl_ring(k, k->ring_v, layer, p) + off, D, n, hd);
        p += n;
    }
    for (int64_t p = l0; p < l1; p++) {
        ops.unpack(kvl_codes(k, 1, layer, p) + (size_t)off * (size_t)c->vb / 8, c->vb, hd, row);
        const uint16_t *mp = kvl_meta_tok(k, 1, layer, p) + 2 * (off / gr);
        for (int g = 0; g < G; g++) {
            const float pr = sc[g * scs + p - start];
            float *a = acc + g * hd;
            for (int64_t j = 0; j < ngr; j++) {
                const float as = pr * spx_f16_to_f32(mp[2 * j + 1]), am = pr * spx_f16_to_f32(mp[2 * j]);
                ops.axpb(a + j * gr, as, row + j * gr, am, gr);
            }
        }
    }
    for (int g = 0; g < G; g++) {
        float *a = acc + g * hd, *o = out + g * os;
        if (rot && l1 > l0) spx_kv_rotate(a, hd, k->rot);
        const float inv = 1.0f / zn[g];
        for (int64_t i = 0; i < hd; i++) o[i] = (o[i] + a[i]) * inv;
    }
}
