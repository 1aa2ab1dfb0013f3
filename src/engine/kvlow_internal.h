/* kvlow_internal.h: addressing of the low-bit KV cache's arrays and its
 * bit packing (layouts in kvlow.h), shared by kvlow.c and kvlow_attend.c. */
#ifndef SPX_KVLOW_INTERNAL_H
#define SPX_KVLOW_INTERNAL_H

#include "core/half.h"
#include "engine/kvlow.h"

static inline uint16_t *kvl_sink(const spx_kvlow *k, uint16_t *base, int64_t layer, int64_t pos) {
    return base + ((size_t)layer * SPX_KVL_BLOCK + (size_t)pos) * (size_t)k->kvd;
}
static inline uint16_t *kvl_ring(const spx_kvlow *k, uint16_t *base, int64_t layer, int64_t pos) {
    return base + ((size_t)layer * (size_t)k->ring + (size_t)(pos % k->ring)) * (size_t)k->kvd;
}
static inline uint8_t *kvl_codes(const spx_kvlow *k, int value, int64_t layer, int64_t pos) {
    size_t row = value ? k->vrow : k->krow;
    return (value ? k->cv : k->ck) + ((size_t)layer * (size_t)k->n_ctx + (size_t)pos) * row;
}
/* KIVI keys: the block's [kvd] (m, s) pairs */
static inline uint16_t *kvl_kmeta_kivi(const spx_kvlow *k, int64_t layer, int64_t blk) {
    return k->mk + ((size_t)layer * (size_t)k->n_blocks + (size_t)blk) * (size_t)k->kvd * 2;
}
/* per-token (m, s) pairs of a row: [kvd / group] */
static inline uint16_t *kvl_meta_tok(const spx_kvlow *k, int value, int64_t layer, int64_t pos) {
    size_t ng = (size_t)(k->kvd / k->cfg.group);
    return (value ? k->mv : k->mk) + ((size_t)layer * (size_t)k->n_ctx + (size_t)pos) * ng * 2;
}
/* byte offset of a record in the tier: host RAM (kvl_tier) or the file tier */
static inline uint64_t kvl_rec_off(const spx_kvlow *k, int64_t layer, int64_t group, int64_t kvh) {
    return (((uint64_t)layer * (uint64_t)k->n_groups + (uint64_t)group) * (uint64_t)k->nkv + (uint64_t)kvh) * k->gbytes;
}
static inline uint8_t *kvl_tier(const spx_kvlow *k, int64_t layer, int64_t group, int64_t kvh) {
    return k->tier + kvl_rec_off(k, layer, group, kvh);
}
/* (m, s) of channel ch (0 .. kvd) of (layer, pos) */
static inline void kvl_bin(const spx_kvlow *k, int value, int64_t layer, int64_t pos, int64_t ch, float *m, float *s) {
    const uint16_t *p = !value && k->cfg.layout == SPX_KV_LAYOUT_KIVI
                            ? kvl_kmeta_kivi(k, layer, pos / SPX_KVL_BLOCK) + 2 * ch
                            : kvl_meta_tok(k, value, layer, pos) + 2 * (ch / k->cfg.group);
    *m = spx_f16_to_f32(p[0]);
    *s = spx_f16_to_f32(p[1]);
}

/* element e of b bits (b <= 8) at bit e b, little-endian; reads two bytes
 * (allocations carry 8 bytes of slack, the file tier's records SPX_TIER_SLACK) */
static inline unsigned kvl_get_bits(const uint8_t *p, int64_t e, int b) {
    size_t bit = (size_t)e * (size_t)b;
    unsigned w = (unsigned)p[bit >> 3] | (unsigned)p[(bit >> 3) + 1] << 8;
    return (w >> (bit & 7)) & ((1u << b) - 1);
}
/* overwrites element e */
static inline void kvl_put_bits(uint8_t *p, int64_t e, int b, unsigned v) {
    size_t bit = (size_t)e * (size_t)b;
    unsigned mask = ((1u << b) - 1) << (bit & 7), w = (v << (bit & 7));
    p[bit >> 3] = (uint8_t)((p[bit >> 3] & ~mask) | (w & mask));
    if ((bit & 7) + (size_t)b > 8) {
        unsigned m2 = mask >> 8, w2 = w >> 8;
        p[(bit >> 3) + 1] = (uint8_t)((p[(bit >> 3) + 1] & ~m2) | (w2 & m2));
    }
}

#endif
