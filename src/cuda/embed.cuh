/* embed.cuh: fused embedding gather + dequantize: h[t] = W^[ids[t]] for a
 * Group-32 4-bit embedding matrix, outlier columns included (exactly the
 * CPU's spx_q_dequant_row_f32). Ids are read from device memory (a decode
 * graph replays with the id the previous step's argmax left there); an id
 * out of range gives a row of NaN (the host validates ids first). */
#ifndef SPX_CUDA_EMBED_CUH
#define SPX_CUDA_EMBED_CUH

#include "cuda/common.cuh"

/* h[n_tok, w.cols] */
cudaError_t spx_embed_q4(const spx_dqmat &w, const int32_t *ids, int n_tok, float *h, cudaStream_t st, bool pdl = false);

#endif
