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
/* ids[0] = index of *best; pos[0] += 1; *best = 0. One thread. */
cudaError_t spx_argmax_finish(unsigned long long *best, int32_t *ids, int32_t *pos, cudaStream_t st, bool pdl = false);

#endif
