/* attention.cuh: causal GQA attention of n_tok queries over the fp16 KV
 * cache, split-K over the keys (flash-decoding): the keys [start, p] of a
 * query at position p (start > 0 only with a sliding window) are cut into
 * n_splits chunks of whole 32-key tiles; each block runs an online softmax
 * over its chunk for up to 4 query heads sharing one KV head (K and V rows
 * are read once for all of them), and a second kernel merges the chunks
 * (max, sum, weighted values). Positions come from device memory (*pos is
 * the position of query 0), so the launch shape depends only on n_tok and
 * n_splits and a decode graph replays at any context length.
 *
 * Matches the CPU's spx_kv_scores / softmax / spx_kv_weighted_v (f16):
 * scores q.k * (1/sqrt(hd)) in float32. Limits: hd <= 256; nh a multiple
 * of nkv; part holds n_tok * nh * n_splits * (hd + 2) floats when
 * n_splits > 1. */
#ifndef SPX_CUDA_ATTENTION_CUH
#define SPX_CUDA_ATTENTION_CUH

#include "cuda/common.cuh"

#define SPX_ATTN_MAX_HD 256

struct spx_attn_args {
    const float *q;             /* [n_tok, nh * hd] (rotated) */
    const __half *kc, *vc;      /* this layer's cache [n_ctx, nkv * hd] */
    float *out;                 /* [n_tok, nh * hd] */
    float *part;                /* scratch, see above */
    int n_tok, nh, nkv, hd;
    int window;                 /* sliding window (0: none) */
    int n_splits;               /* >= 1 */
    const int32_t *pos;         /* device: position of query 0 */
};

cudaError_t spx_attention(const spx_attn_args &a, cudaStream_t st, bool pdl = false);
/* Blocks of the split kernel per split (for choosing n_splits). */
int spx_attention_blocks_per_split(int n_tok, int nh, int nkv);

#endif
