/* kvcache.h: the KV cache in float32, fp16 or Group-32 4-bit
 * (SpectraQuantizedCache), with attention computed directly over the
 * stored format (no dequantized copy of the cache).
 *
 * Layout: per layer, per position, one row of kvd = n_kv_heads * head_dim
 * values for K and one for V. q4 rows use the weight format of qtensor.h
 * with 4 bits and groups of 32 along the row (groups never straddle heads
 * since head_dim % 32 == 0 is required): kvd/2 code bytes, kvd/32 fp16
 * scales, kvd/64 zero bytes: 4.625 bits per value, minmax rounding. */
#ifndef SPX_KVCACHE_H
#define SPX_KVCACHE_H

#include "core/err.h"
#include "cpu/qkernels.h"
#include "engine/kvlow.h"
#include "spectra.h"
#include <stddef.h>
#include <stdint.h>

typedef struct spx_kvcache {
    spx_kv_type type;
    int64_t n_layers, n_ctx, kvd, head_dim;
    int64_t rot;             /* q4: Hadamard block length (power of two) */
    size_t row_bytes;        /* bytes of one K (or V) row */
    size_t codes_b, scales_b;/* q4: offsets of scales and zeros within a row */
    uint8_t *k, *v;          /* [n_layers, n_ctx, row_bytes] */
    int lowbit;              /* a StrataFlux-KV type: `low` holds it (kvlow.h), k and v are NULL */
    spx_kvlow low;
} spx_kvcache;

/* "f32", "f16", "q4", "k2v2", ... (SPX_KV_DEFAULT: "f16") */
const char *spx_kv_type_name(spx_kv_type t);
/* Hadamard block of a head's rotation (the q4 cache's and the low-bit
 * rot layout's): the largest power of two dividing head_dim, at most 256. */
int64_t spx_kv_rot_block(int64_t head_dim);
/* Bytes of cache per token of context (K and V, all layers). */
size_t spx_kv_bytes_per_token(spx_kv_type t, int64_t n_layers, int64_t kvd);
spx_status spx_kv_init(spx_kvcache *c, spx_kv_type t, int64_t n_layers, int64_t n_ctx, int64_t kvd,
                       int64_t head_dim, spx_err *e);
/* A low-bit type (SPX_KV_K2V2 ..) with its resolved configuration; batch:
 * most tokens one forward call stores. */
spx_status spx_kv_init_low(spx_kvcache *c, spx_kv_type t, const spx_kvlow_cfg *lc, int64_t n_layers, int64_t n_ctx,
                           int64_t kvd, int64_t head_dim, int64_t batch, spx_err *e);
void spx_kv_free(spx_kvcache *c);
/* Session reset / truncate to pos (the low-bit cache's encoded blocks and
 * ring; a no-op for the other types, whose rows are overwritten). */
void spx_kv_reset(spx_kvcache *c);
spx_status spx_kv_truncate(spx_kvcache *c, int64_t pos, spx_err *e);
/* spx_session_seek from 0 to pos: a low-bit cache counts the blocks below
 * pos as encoded (what the cache holds there is what attention reads). */
void spx_kv_seek(spx_kvcache *c, int64_t pos);
/* After a call's attention in a layer: encode what became complete below
 * pos_end (low-bit types; no-op otherwise). */
spx_status spx_kv_commit(spx_kvcache *c, int64_t layer, int64_t pos_end, spx_err *e);
/* After a forward call (a file tier's records go back to its cache). */
spx_status spx_kv_step_end(spx_kvcache *c, spx_err *e);
/* Attention of G query heads sharing KV head kvh over [start, end), every
 * type: scores into sc + g scs, softmax, weighted values into out + g os
 * (and for a low-bit type with refinement, eq. 7 and 8: kvlow.h). work:
 * spx_kv_work_floats(c, G) floats (0 for the other types). */
size_t spx_kv_work_floats(const spx_kvcache *c, int G);
void spx_kv_attend_g(spx_kvcache *c, const spx_qkernels *kt, int64_t layer, int64_t kvh, int G, const float *q,
                     int64_t qs, int64_t start, int64_t end, float scale, float *sc, int64_t scs, float *out,
                     int64_t os, float *work);
/* Bytes per token of context this cache holds (a low-bit type: codes and
 * metadata, without its fixed fp16 sinks and ring) and a one-line record of
 * every setting that changes its numbers (printed with results), with the
 * refinement counters so far. */
double spx_kv_cache_bytes_per_token(const spx_kvcache *c);
void spx_kv_describe(const spx_kvcache *c, char *buf, size_t n);
/* The q4 cache's rotation, in place: orthonormal Walsh-Hadamard over
 * blocks of rot (a power of two dividing len); its own inverse. */
void spx_kv_rotate(float *x, int64_t len, int64_t rot);
/* Stores k[kvd] and v[kvd] at (layer, pos). */
void spx_kv_store(spx_kvcache *c, int64_t layer, int64_t pos, const float *k, const float *v);
/* out[i - start] = scale * q . K[layer, i, head kvh] for i in [start, end).
 * kt: the kernel table whose scores_f16 / dot_q4g read an fp16 / 4-bit
 * cache (NULL: the scalar reference's); f32 ignores it. */
void spx_kv_scores(const spx_kvcache *c, const spx_qkernels *kt, int64_t layer, int64_t kvh, const float *q,
                   int64_t start, int64_t end, float scale, float *out);
/* out[head_dim] = sum_i p[i - start] * V[layer, i, head kvh] (kt as
 * above, its wv_f16 / axpy_q4g). */
void spx_kv_weighted_v(const spx_kvcache *c, const spx_qkernels *kt, int64_t layer, int64_t kvh, const float *p,
                       int64_t start, int64_t end, float *out);
/* The same for G query heads that share KV head kvh (GQA): head g's q at
 * q + g qs, its scores at out + g os, its probabilities at p + g ps and
 * its output at out + g os; each head's numbers are what the one-head
 * call gives (the fp16 cache reads each row once for all G heads). */
void spx_kv_scores_g(const spx_kvcache *c, const spx_qkernels *kt, int64_t layer, int64_t kvh, int G, const float *q,
                     int64_t qs, int64_t start, int64_t end, float scale, float *out, int64_t os);
void spx_kv_weighted_v_g(const spx_kvcache *c, const spx_qkernels *kt, int64_t layer, int64_t kvh, int G,
                         const float *p, int64_t ps, int64_t start, int64_t end, float *out, int64_t os);
/* The stored row (K if value == 0, else V) as float32 in the model's
 * coordinates (undoing the q4 rotation): the reference for checks. */
void spx_kv_dequant_row(const spx_kvcache *c, int64_t layer, int64_t pos, int value, float *out);

#endif
