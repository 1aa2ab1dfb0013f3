/* sample.cuh: sampling on the device. Greedy decoding keeps the chosen
 * token on the GPU: the argmax is max-reduced into a packed 64-bit key
 * (spx_argmax_key: value, then lowest index on ties, as the CPU's first
 * maximum), and spx_argmax_finish turns the key into the next input id,
 * advances the device position and re-arms the key, so a captured decode
 * graph can be replayed step after step with only the id crossing PCIe. */
#ifndef SPX_CUDA_SAMPLE_CUH
#define SPX_CUDA_SAMPLE_CUH

#include "cuda/common.cuh"

/* *best = max(*best, key of max_i x[i]) (zero *best first). */
cudaError_t spx_argmax(const float *x, int64_t n, unsigned long long *best, int n_sm, cudaStream_t st);
/* out[r] = the index of row r's maximum (lowest on ties), x [rows, n]:
 * speculation's verification reads only these (one block per row). */
cudaError_t spx_argmax_rows(const float *x, int rows, int64_t n, int32_t *out, cudaStream_t st);
/* ids[0] = index of *best; pos[0] += 1; *best = 0. One thread. With ring
 * (host memory mapped into the device's address space) also
 * ring[p % SPX_TOKEN_RING] = spx_token_ring_entry(p, id), p the position
 * before the advance: the host reads a step's token there without a copy
 * in the stream, so the next step can be queued behind this one. */
#define SPX_TOKEN_RING 8
__host__ __device__ inline unsigned long long spx_token_ring_entry(int32_t pos, int32_t id) {
    return (unsigned long long)(uint32_t)pos << 32 | (uint32_t)id;
}
cudaError_t spx_argmax_finish(unsigned long long *best, int32_t *ids, int32_t *pos, cudaStream_t st, bool pdl = false,
                              unsigned long long *ring = nullptr);

/* Temperature + top-k + top-p sampling on the device, the CPU's
 * spx_sample (engine/sampler.c) step for step: p = (logit - max) / T,
 * the top_k largest p ordered by (p desc, id asc), exp, the top-p cut over
 * their normalised cumulative sum, and one splitmix64 draw scaled by the
 * kept sum (double sums, as the CPU). Only expf can differ from the host's
 * by an ulp or two, which moves a draw only when it falls that close to a
 * boundary. One block of 1024 threads: the k-th largest key by a 4-pass
 * radix select over the order-preserving bits of p, the candidates
 * gathered (ties by lowest id), bitonic-sorted in shared memory, then one
 * thread draws. Then, as spx_argmax_finish: ids[0] = the draw, pos[0] +=
 * 1, and the RNG state in *sp advances, so a graph can replay it. */
#define SPX_SAMPLE_MAX_K 1024
struct spx_sample_dev {
    float temperature;  /* > 0 */
    int32_t top_k;      /* 2 .. min(SPX_SAMPLE_MAX_K, vocab - 1) */
    float top_p;        /* (0, 1): the nucleus; otherwise off */
    int32_t pad;
    unsigned long long rng; /* splitmix64 state, as spx_sample's *rng_state */
};
/* Whether spx_sample_topk takes these parameters (else: logits to the host). */
bool spx_sample_on_device(float temperature, int32_t top_k, int64_t vocab);
/* ring (as spx_argmax_finish's, 2 * SPX_TOKEN_RING entries): also
 * ring[SPX_TOKEN_RING + p % SPX_TOKEN_RING] = the RNG state after the draw. */
cudaError_t spx_sample_topk(const float *logits, int64_t vocab, spx_sample_dev *sp, int32_t *ids, int32_t *pos,
                            cudaStream_t st, bool pdl = false, unsigned long long *ring = nullptr);

#endif
