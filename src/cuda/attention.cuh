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
 * scores q.k * scale in float32 (scale: the model's, cfg->attn_scale; 0
 * means 1/sqrt(hd)). Limits: hd <= 256; nh a multiple
 * of nkv; part holds n_tok * nh * n_splits * (hd + 2) floats when
 * n_splits > 1.
 *
 * With kq.codes set (--kv q4, kvq4.cuh) the same split-K structure reads
 * the 4-bit cache and matches spx_kv_scores / spx_kv_weighted_v's q4
 * branch: q is rotated (FWHT over blocks of rot, in shared memory) and the
 * scores are taken on the codes, per group s * (sum_k q_k c_k - z sum_k
 * q_k); the values are dequantized in registers, s * (c - z), and the
 * merged output is rotated back (H is its own inverse) before it is
 * written. q4 needs hd a multiple of 32 and rot = spx_kvq4_rot(hd, nkv * hd).
 *
 * Decode (n_tok == 1, fp16 cache, spx_attention_decode_fast): one kernel
 * whose blocks read their first keys before the PDL wait and whose last
 * block per head group merges the splits (cnt). With k_new set it also
 * does rope_store's work for the token: q (raw in q) and k_new get the
 * q/k RMSNorm (q_norm, k_norm, eps; NULL: none) and RoPE (inv_freq) at
 * *pos, and k and v_new go to cache row *pos in fp16, so the decode step
 * needs no spx_rope_store. The 4-bit cache has its decode kernel too
 * (same structure; with k_new set it also quantizes row *pos, rotated as
 * rope_store does, and stores it). */
#ifndef SPX_CUDA_ATTENTION_CUH
#define SPX_CUDA_ATTENTION_CUH

#include "cuda/common.cuh"
#include "cuda/kvq4.cuh"

#define SPX_ATTN_MAX_HD 256

struct spx_attn_args {
    const float *q;             /* [n_tok, nh * hd] (rotated; raw when k_new is set) */
    __half *kc, *vc;            /* this layer's cache [n_ctx, nkv * hd] */
    float *out;                 /* [n_tok, nh * hd] */
    float *part;                /* scratch, see above */
    int n_tok, nh, nkv, hd;
    int window;                 /* sliding window (0: none) */
    float scale;                /* softmax scale of q.k; 0: 1/sqrt(hd) */
    int n_splits;               /* >= 1 */
    const int32_t *pos;         /* device: position of query 0 */
    spx_kvq4 kq, vq;            /* --kv q4: this layer's caches instead (kq.codes NULL: fp16) */
    int rot;                    /* q4: Hadamard block, spx_kvq4_rot(hd, nkv * hd) */
    /* decode (spx_attention_decode_fast) only: */
    int *cnt;                   /* [nh] zeroed once; needed when n_splits > 1 (left zeroed) */
    const float *k_new, *v_new; /* set: RoPE fused, see below; [nkv * hd] raw k and v of the token */
    const float *inv_freq;      /* [hd / 2] */
    const float *q_norm, *k_norm; /* [hd] or NULL (Qwen3) */
    float eps;
    int adapt_splits; /* set by spx_attention (callers leave it): only the splits position p needs run */
};

cudaError_t spx_attention(const spx_attn_args &a, cudaStream_t st, bool pdl = false);
/* Shared-memory limits of the decode kernels, SPECTRA_CUDA_ATTN_SPLIT_KERNEL
 * and SPECTRA_CUDA_ATTN_ADAPT=0 (every split of a decode launch runs, for
 * measurements and tests: spx_attention_force_adapt); once per process,
 * before use. */
cudaError_t spx_attention_setup(void);
/* Whether one token (n_tok == 1) takes a decode kernel, over either cache
 * (RoPE fusable with either): hd 32, 64, 128 or 256
 * (SPECTRA_CUDA_ATTN_SPLIT_KERNEL set at setup: never, for measurements).
 * Its blocks cover SPX_ATTN_DECODE_KEYS keys per pass. */
bool spx_attention_decode_fast(int hd);
/* Tests: 0 runs every split of a decode launch, 1 only those the position
 * needs (one pass of SPX_ATTN_DECODE_KEYS keys each; the default), -1
 * back to the setup's choice. */
void spx_attention_force_adapt(int on);
#define SPX_ATTN_DECODE_KEYS 128
/* Blocks of the split kernel per split (for choosing n_splits). */
int spx_attention_blocks_per_split(int n_tok, int nh, int nkv);

#endif
