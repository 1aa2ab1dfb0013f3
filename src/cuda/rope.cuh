/* rope.cuh: per-head q/k RMSNorm (Qwen3, optional), RoPE (HF rotate_half:
 * element i pairs with i + d/2, angle pos * inv_freq[i] in float32) and
 * the store of k and v into the fp16 KV cache, in one launch for n_tok
 * tokens at positions *pos .. *pos + n_tok - 1 (pos read from device
 * memory, so a captured decode graph can replay it). q and k are rotated
 * in place (float32). Matches spx_cpu_rmsnorm / spx_cpu_rope / the f16
 * branch of spx_kv_store.
 *
 * With kq.codes set (--kv q4) the k and v rows go to the 4-bit cache
 * instead (kvq4.cuh): per head, the FWHT over blocks of rot, then one warp
 * per group of 32 quantizes it with the CPU's rule (bit-identical to
 * spx_kv_store's q4 branch for the same float inputs). q4 needs hd a
 * multiple of 32, hd <= 256 and rot = spx_kvq4_rot(hd, nkv * hd). */
#ifndef SPX_CUDA_ROPE_CUH
#define SPX_CUDA_ROPE_CUH

#include "cuda/common.cuh"
#include "cuda/kvq4.cuh"

struct spx_rope_args {
    float *q;              /* [n_tok, nh * hd] */
    float *k;              /* [n_tok, nkv * hd] */
    const float *v;        /* [n_tok, nkv * hd] */
    int n_tok, nh, nkv, hd;
    const float *inv_freq; /* [hd / 2] */
    const float *q_norm, *k_norm; /* [hd] or NULL */
    float eps;
    const int32_t *pos;    /* device: position of token 0 */
    __half *kc, *vc;       /* this layer's cache rows [n_ctx, nkv * hd] */
    spx_kvq4 kq, vq;       /* --kv q4: this layer's caches instead (kq.codes NULL: fp16) */
    int rot;               /* q4: Hadamard block, spx_kvq4_rot(hd, nkv * hd) */
    /* low-bit cache (kvlow_dev.cuh): ring > 0 stores rows p < 128 at kc/vc
     * (the layer's sinks) and later rows at kr/vr + (p % ring) kvd */
    __half *kr, *vr;
    int ring;
};

cudaError_t spx_rope_store(const spx_rope_args &a, cudaStream_t st, bool pdl = false);

#endif
