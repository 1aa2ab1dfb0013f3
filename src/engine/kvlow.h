/* kvlow.h: StrataFlux-KV, the resident low-bit KV cache with nested
 * refinement bits (../shared/spec/strataflux-paper.txt sections 3.1, 3.3
 * and 3.4; docs/kv.md says what was measured and why these defaults).
 *
 * Positions of one layer fall in three regions:
 *   [0, 128)          sinks: fp16 forever (sink_k/v);
 *   [128, enc[l])     encoded: kb-bit key and vb-bit value codes, in whole
 *                     blocks of 128 tokens (enc[l] is a multiple of 128);
 *   [enc[l], pos)     the newest tokens, fp16 in a ring of `ring` rows
 *                     (row pos % ring), fewer than 128 + one forward
 *                     call's tokens. spx_kvlow_commit encodes every block
 *                     that is complete after a call's attention, so a
 *                     block is encoded when complete and a prompt in bulk.
 *
 * Codes. Element x of a bin (min m, step s) has the resident code
 * c = clamp(round((x - m) / s), 0, 2^b - 1) and the value m + s c. Layouts
 * (spx_kv_layout):
 *   KIVI: a key's (m, s) is per channel over its 128-token block (m = the
 *         block's minimum of that channel, s = range / (2^kb - 1)); a
 *         value's is per token over `group` consecutive channels.
 *   ROT:  every head's key and value are first rotated by the orthonormal
 *         Walsh-Hadamard transform of kvcache.h (blocks of `rot`); both then
 *         per token over `group` channels. Scores use the rotated query;
 *         the weighted sum of rotated values is rotated back.
 * m and s are stored fp16 and the codes computed from the stored (rounded)
 * pair, so encoder and decoder agree on every bin. Codes are packed per
 * row (one token, all kvd channels): element e at bit e b, little-endian;
 * head_dim % 8 == 0 makes every head start on a byte.
 *
 * Nested refinement (rb > 0): the bin of code c, [m + s (c - 1/2),
 * m + s (c + 1/2)), is cut into 2^rb equal parts; the refinement index of
 * x is j = clamp(floor(((x - m) / s - c + 1/2) 2^rb), 0, 2^rb - 1) and the
 * refined value m + s (c - 1/2 + (j + 1/2) / 2^rb), i.e. the resident value
 * plus s ((j + 1/2) / 2^rb - 1/2). The same rb for keys and values (+b/+b).
 * Tier layout: per layer, per token group of `gt` tokens (from position
 * 128 on), per KV head one contiguous record of gbytes: the keys' indices
 * [gt][head_dim] then the values', rb bits each, packed like the codes.
 * The tier is host memory (spx_kvlow.tier; a device backend reads it
 * pinned) or, on the CPU with cfg.tier_dir, a scratch file behind the LRU
 * RAM cache of refine/tier.h (spx_kvlow.ft), one cache entry per record:
 * commit writes each record as its block is encoded (so a prompt's records
 * go to the file and its newest stay cached, a decode step's new ones
 * enter the cache directly); attend asks for its selected records in one
 * batch per query and KV head; with the skip policy a record not cached
 * leaves its group at the resident value for that query (stats.
 * groups_missed) while the loaders fetch it for later steps.
 *
 * Selection and update (paper eq. 7 and 8), per query, per KV head: the
 * softmax p over all positions from resident keys; every group wholly in
 * the encoded region scores max over the KV head's query heads of the sum
 * of p over its tokens; the n_sel best (score descending, then group index
 * ascending: a total order, so the set is unique) are refined, n_sel =
 * all when frac >= 1, else max(1, round(frac * candidates)). For a refined
 * token, p' = p exp(scale q . dk) (dk the key's refinement delta) and the
 * output becomes (sum_{i not refined} p_i v_i + sum_{refined} p'_i v'_i) /
 * Z', Z' = sum_{i not refined} p_i + sum_{refined} p'_i: eq. 8 in
 * normalised form (p = e^l/Z). Z' is summed term by term, never as
 * 1 + sum (p'_i - p_i), which cancels to 0 when the refined groups held
 * nearly all the probability and refinement lowers their logits; p' is
 * formed as e^(log p + scale q.dk - M) with the row rescaled by e^-M only
 * when the new maximum log-probability M leaves [-20, 20]. The records'
 * key halves give p' first, their value halves p' dv, then the value pass
 * runs once with p' in place of p: the update is fused into it.
 *
 * Prompts take the same path as decode steps: a prompt's queries attend
 * to the blocks encoded before its call through their codes (+refinement),
 * to its own call's tokens in fp16. */
#ifndef SPX_KVLOW_H
#define SPX_KVLOW_H

#include "core/err.h"
#include "cpu/qkernels.h"
#include "spectra.h"
#include <stddef.h>
#include <stdint.h>

#define SPX_KVL_BLOCK 128 /* tokens per encoded block; also the sink count */

typedef struct spx_kvlow_cfg {
    int kb, vb;          /* resident bits per key / value element, 2..4 */
    int layout;          /* SPX_KV_LAYOUT_KIVI or SPX_KV_LAYOUT_ROT (resolved) */
    int64_t group;       /* channels per per-token (m, s) pair; divides head_dim */
    int rb;              /* refinement bits per element, 0 (off) .. 8 */
    int64_t gt;          /* tokens per refinement group; divides 128 */
    double frac;         /* fraction of candidate groups refined per query */
    /* where the records live (rb > 0): tier_dir NULL, host RAM (spx_kvlow.tier);
     * else a scratch file tier (refine/tier.h) made in that folder by init
     * (the pointer is not kept), with an LRU cache of tier_cache bytes */
    const char *tier_dir;
    uint64_t tier_cache;
    int tier_wait;       /* a missed record: 0 skip (resident value), 1 wait */
} spx_kvlow_cfg;

typedef struct spx_kvlow_stats {
    uint64_t groups_refined; /* (layer, KV head, query) group refinements */
    uint64_t bytes_read;     /* tier bytes they read */
    uint64_t groups_missed;  /* selected groups whose record was not cached (file tier, skip): resident values */
} spx_kvlow_stats;

typedef struct spx_kvlow {
    spx_kvlow_cfg cfg;
    int64_t n_layers, n_ctx, kvd, hd, nkv, rot, ring;
    uint16_t *sink_k, *sink_v; /* [L][128][kvd] fp16 */
    uint16_t *ring_k, *ring_v; /* [L][ring][kvd] fp16 */
    uint8_t *ck, *cv;          /* codes [L][n_ctx][krow | vrow] */
    size_t krow, vrow;
    uint16_t *mk, *mv;         /* (m, s) fp16 pairs: KIVI keys [L][blocks][kvd]; otherwise [L][n_ctx][kvd/group] */
    int64_t n_blocks;
    int64_t *enc;              /* [L] */
    uint8_t *tier;             /* [L][n_groups][nkv][gbytes] in host RAM, or NULL */
    struct spx_tier *ft;       /* or the same layout as byte offsets of a scratch file tier */
    uint8_t *enc_rec;          /* a record's bytes on their way to or from ft */
    int64_t n_groups;
    size_t gbytes;
    spx_kvlow_stats stats;     /* updated atomically by attend */
    int failed;                /* attend's first error (a file tier's), set once atomically: ferr */
    spx_err ferr;
    /* commit's and truncate's scratch (one thread runs them): one head's
     * block [128][head_dim] of floats (and a row pair [2 kvd]), and its
     * keys' and values' refinement indices */
    float *enc_x;
    unsigned *enc_ref;
} spx_kvlow;

/* The defaults of p's zero fields for kv type t on a CPU (gpu = 0) or a
 * device; kb/vb from t. Fails on a bad combination (message names it). */
spx_status spx_kvlow_config(spx_kv_type t, const spx_session_params *p, int gpu, int64_t head_dim,
                            spx_kvlow_cfg *out, spx_err *e);
int spx_kv_type_lowbit(spx_kv_type t);
/* Resident bytes per token of context beyond the fixed fp16 part (codes and
 * metadata, K and V, all layers), and the fixed fp16 bytes (sinks + ring). */
double spx_kvlow_bytes_per_token(const spx_kvlow_cfg *c, int64_t n_layers, int64_t kvd);
size_t spx_kvlow_fixed_bytes(int64_t n_layers, int64_t kvd, int64_t batch);
/* Tier bytes per token (refinement bits, K and V, all layers). */
double spx_kvlow_tier_bytes_per_token(const spx_kvlow_cfg *c, int64_t n_layers, int64_t kvd);

/* batch: most tokens one forward call stores (sizes the ring). */
spx_status spx_kvlow_init(spx_kvlow *k, const spx_kvlow_cfg *c, int64_t n_layers, int64_t n_ctx, int64_t kvd,
                          int64_t head_dim, int64_t batch, spx_err *e);
void spx_kvlow_free(spx_kvlow *k);
void spx_kvlow_reset(spx_kvlow *k);
/* Forget positions >= pos: blocks past it are decoded (with refinement when
 * there is a tier) back into the ring, so they are re-encoded later. */
spx_status spx_kvlow_truncate(spx_kvlow *k, int64_t pos, spx_err *e);
/* k[kvd], v[kvd] of (layer, pos); pos >= enc[layer] or < 128. */
void spx_kvlow_store(spx_kvlow *k, int64_t layer, int64_t pos, const float *kr, const float *vr);
/* Encodes the blocks of layer complete below pos_end. */
spx_status spx_kvlow_commit(spx_kvlow *k, int64_t layer, int64_t pos_end, spx_err *e);
/* attend's latched error (a file tier's read or memory failure), if any */
spx_status spx_kvlow_error(const spx_kvlow *k, spx_err *e);
/* Ends a forward call: the file tier's records used in it go back to the
 * LRU cache (refine/tier.h's spx_tier_step_end). */
spx_status spx_kvlow_step_end(spx_kvlow *k, spx_err *e);
/* Floats of scratch attend needs for G heads: a multiple of 16, so that
 * per-thread slices of one malloc'd array keep its alignment. */
size_t spx_kvlow_work_floats(const spx_kvlow *k, int G);
/* Attention of G query heads sharing KV head kvh over positions [start,
 * end): q of head g at q + g qs, its probabilities built in sc + g scs
 * (scs >= end - start), its output at out + g os. */
void spx_kvlow_attend(spx_kvlow *k, const spx_qkernels *kt, int64_t layer, int64_t kvh, int G, const float *q,
                      int64_t qs, int64_t start, int64_t end, float scale, float *sc, int64_t scs, float *out,
                      int64_t os, float *work);
/* The row (key if value == 0) as float32 in model coordinates: fp16 where
 * it is fp16, else the resident value, plus refinement when refined != 0
 * and there is a tier. */
spx_status spx_kvlow_dequant_row(const spx_kvlow *k, int64_t layer, int64_t pos, int value, int refined, float *out,
                                 spx_err *e);

/* Building blocks, exported for the tests' brute-force checks. */
/* Selected groups: the n_sel best of score[n] (descending, ties by lower
 * index) into idx[n_sel] (any order); idx needs n entries of room. */
void spx_kvlow_select(const float *score, int64_t n, int64_t n_sel, int64_t *idx);
int64_t spx_kvlow_n_sel(double frac, int64_t candidates);

#endif
