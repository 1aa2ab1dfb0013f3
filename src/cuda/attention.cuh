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
 * n_splits > 1.
 *
 * With kq.codes set (--kv q4, kvq4.cuh) the same split-K structure reads
 * the 4-bit cache and matches spx_kv_scores / spx_kv_weighted_v's q4
 * branch: q is rotated (FWHT over blocks of rot, in shared memory) and the
 * scores are taken on the codes, per group s * (sum_k q_k c_k - z sum_k
 * q_k); the values are dequantized in registers, s * (c - z), and the
 * merged output is rotated back (H is its own inverse) before it is
 * written. q4 needs hd a multiple of 32 and rot = spx_kvq4_rot(hd, nkv * hd). */
#ifndef SPX_CUDA_ATTENTION_CUH
#define SPX_CUDA_ATTENTION_CUH

#include "cuda/common.cuh"
#include "cuda/kvq4.cuh"

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
    spx_kvq4 kq, vq;            /* --kv q4: this layer's caches instead (kq.codes NULL: fp16) */
    int rot;                    /* q4: Hadamard block, spx_kvq4_rot(hd, nkv * hd) */
};

cudaError_t spx_attention(const spx_attn_args &a, cudaStream_t st, bool pdl = false);
/* Blocks of the split kernel per split (for choosing n_splits). */
int spx_attention_blocks_per_split(int n_tok, int nh, int nkv);

#endif
