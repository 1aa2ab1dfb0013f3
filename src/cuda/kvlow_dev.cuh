/* kvlow_dev.cuh: StrataFlux-KV (the low-bit KV cache of engine/kvlow.h)
 * on the device: its storage, the encoder, attention over it and the
 * refinement pass (paper eq. 7 and 8).
 *
 * Storage mirrors spx_kvlow byte for byte (kvlow.h gives the layouts):
 * sinks [L][128][kvd] and ring [L][ring][kvd] fp16, codes [L][n_ctx][krow]
 * and [L][n_ctx][vrow], (m, s) fp16 pairs (KIVI keys [L][n_blocks][kvd],
 * per-token groups [L][n_ctx][kvd / group]) in device memory, so a test
 * compares the encoded bytes with the CPU's. The refinement tier
 * [L][n_groups][nkv][gbytes] is pinned host memory mapped into the device
 * (cudaHostAlloc, cudaHostAllocMapped): the encoder writes its records and
 * the refinement pass reads the selected ones zero-copy over the bus, a
 * record per selected (group, KV head), ~1/128 of the tier per step at the
 * default fraction; nothing else of the tier moves. Copying selected
 * records would need the selection on the host first (a round trip per
 * layer); zero-copy keeps the decode step one captured graph.
 *
 * Encoded region without state: a call starting at position P0 sees the
 * blocks [128, enc(P0)) encoded, enc(P0) = max(128, floor(P0 / 128) 128),
 * exactly the CPU's enc[l] after every earlier call's spx_kvlow_commit
 * (every layer commits every complete block after its attention). So the
 * kernels derive the regions from the position in device memory, the
 * decode graph is captured once, and a step queued ahead and dropped
 * leaves nothing stale (its rows and codes are rewritten before use). The
 * encoder runs once per forward pass after the last layer, for every
 * layer and every block completed in the pass (a decode step: one block
 * every 128 steps, the other replays return at once): the same codes as
 * the CPU's per-layer commit, since no layer of the same pass reads them.
 *
 * Regions of a query at position p: sinks [0, 128) fp16; codes [128, enc);
 * ring [enc, p] fp16 (row q % ring). Tiles of 32 keys are aligned to
 * absolute positions, so a tile is in one region (128 and enc are
 * multiples of 128) and a refinement group (gt <= 32 tokens, dividing 32)
 * in one tile.
 *
 * Attention (kvlow_attend.cu): split-K over the positions, one block per
 * (KV head, up to 4 query heads, split, token), online softmax; code
 * tiles score on the codes (KIVI: q s per channel and q . m per block
 * folded into the query; ROT: the rotated query, per group s (q . c) +
 * m sum(q)); values are decoded in registers. ROT accumulates in rotated
 * coordinates (fp16 value rows are rotated as they are read) and rotates
 * the output back. With refinement it also writes, per (token, q head,
 * group in the encoded region), lse = log sum of exp(score) over the
 * group, and per (token, q head) the resident softmax's log-sum-exp.
 *
 * Refinement (kvlow_refine.cu), per (layer, token, KV head), after the
 * resident attention: the eq. 7 score of each candidate group, max over
 * the query heads of exp(lse - LSE); the n_sel best by (score descending,
 * group ascending) by a radix select on the scores' bits (ties resolved
 * in index order: the CPU's set when the scores are equal as floats);
 * then per selected token p' = p exp(scale q . dk) and the exact update
 * out = (out Z + sum (p' - p) v + p' dv) / (1 + sum (p' - p)) with Z = 1
 * (the resident output is normalised), the value correction read from the
 * same record. That is the CPU's eq. 8, its value pass split into the
 * resident pass and this one (the same sums, another order).
 *
 * Limits: head_dim 32, 64 or 128; refinement groups of at most 32 tokens;
 * no sliding window with refinement (session_init refuses both with a
 * message). */
#ifndef SPX_CUDA_KVLOW_DEV_CUH
#define SPX_CUDA_KVLOW_DEV_CUH

#include "cuda/common.cuh"

extern "C" {
#include "engine/kvlow.h"
}

/* The device cache: spx_kvlow's arrays at device addresses. */
struct spx_kvl_dev {
    int n_layers, kvd, hd, nkv, kb, vb, layout, group, rb, gt, rot;
    int64_t n_ctx, ring, n_blocks, n_groups;
    int64_t krow, vrow, gbytes;
    double frac;
    __half *sink_k, *sink_v, *ring_k, *ring_v;
    uint8_t *ck, *cv;
    __half *mk, *mv;
    uint8_t *tier;        /* device address of the mapped tier, or NULL (rb == 0) */
    uint8_t *tier_host;   /* its host address */
    unsigned long long *stats; /* device: [2] groups refined, tier bytes read */
};

/* Sizes of the device arrays (bytes; the CPU's, + 16 bytes of slack for the
 * bit readers), from the same configuration as spx_kvlow_init. */
struct spx_kvl_sizes {
    size_t sink, ring, ck, cv, mk, mv, tier;
};
void spx_kvl_plan(const spx_kvlow_cfg *c, int64_t n_layers, int64_t n_ctx, int64_t kvd, int64_t hd, int64_t batch,
                  spx_kvl_dev *d, spx_kvl_sizes *z);
/* Whether the device kernels take this shape (message in why otherwise). */
bool spx_kvl_supported(const spx_kvlow_cfg *c, int64_t hd, int window, char *why, size_t n);

/* The first position not encoded before a call starting at p0. */
__host__ __device__ __forceinline__ int64_t spx_kvl_enc(int64_t p0) {
    const int64_t e = p0 / SPX_KVL_BLOCK * SPX_KVL_BLOCK;
    return e < SPX_KVL_BLOCK ? SPX_KVL_BLOCK : e;
}

/* Encodes, for every layer, the blocks that become complete in a pass of
 * n_tok tokens at *pos (a no-op launch when none does). */
cudaError_t spx_kvl_encode(const spx_kvl_dev &d, const int32_t *pos, int n_tok, cudaStream_t st);
/* Decodes back into the ring positions [from, to) of every layer (codes +
 * refinement, model coordinates, fp16): spx_kvlow_truncate's rewrite. */
cudaError_t spx_kvl_decode_back(const spx_kvl_dev &d, int64_t from, int64_t to, cudaStream_t st);

/* One layer's attention over the cache. */
struct spx_kvl_attn_args {
    spx_kvl_dev c;
    int layer;
    const float *q;      /* [n_tok, nh * hd], RoPE applied */
    float *out;          /* [n_tok, nh * hd] */
    float *part;         /* split partials: n_tok * nh * n_splits * (hd + 2) floats */
    int *cnt;            /* [gridDim.x] zeroed split counters (n_splits > 1) */
    float *lse;          /* refinement: [n_tok][nh][n_groups], else NULL */
    float *stat;         /* refinement: [n_tok][nh] log-sum-exp of the resident softmax */
    int n_tok, nh, window;
    float scale;         /* 0: 1 / sqrt(hd) */
    int n_splits;        /* the launch's; at most enough for SPX_KVL_SPLIT_KEYS keys each run */
    const int32_t *pos;  /* device: position of the call's first token */
    int t0;              /* tokens [t0, t0 + n_tok) of the call (a prompt's refinement runs in slices) */
};
#define SPX_KVL_SPLIT_KEYS 512 /* keys per split of a decode step before more splits are used */
cudaError_t spx_kvl_attention(const spx_kvl_attn_args &a, cudaStream_t st);

/* The refinement of one layer after spx_kvl_attention with lse and stat:
 * sel/nsel/keys/acc/cnt2 scratch (kvlow_refine.cu sizes them). */
struct spx_kvl_ref_args {
    spx_kvl_attn_args a;
    unsigned *keys;      /* [n_tok][nkv][n_groups] */
    int *sel;            /* [n_tok][nkv][n_groups] selected groups, ascending */
    unsigned *ckey;      /* [n_tok][nkv][n_groups] the level-1 winners' keys and groups */
    int *cidx;
    int *nsel;           /* [n_tok][nkv] */
    float *acc;          /* [n_tok][nh][hd + 1] zeroed (left zeroed) */
    int *cnt2;           /* [n_tok][nkv] zeroed (left zeroed) */
    int max_sel;         /* the most groups any token can select (sizes the grid) */
};
cudaError_t spx_kvl_refine(const spx_kvl_ref_args &r, cudaStream_t st);
/* Scratch floats (4-byte words) of one token's refinement buffers. */
size_t spx_kvl_ref_words_per_token(const spx_kvl_dev &d, int nh);

#endif
