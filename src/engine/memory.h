/* memory.h: what the CUDA backend places in device memory, defined once.
 * The backend allocates exactly these sizes (cu_model.cu uploads matrices
 * with spx_mem_take; cu_session.cu allocates each buffer of
 * spx_cuda_scratch), and the planner (plan.c) budgets with the same
 * functions; so there is no second formula to keep in step. Plain C: a
 * CPU-only build plans for a GPU (tests feed synthetic machines).
 *
 * Device images. Every component (codes, scales, zeros, outlier indices,
 * outlier values, norm gains, biases) starts at a multiple of
 * SPX_MEM_ALIGN and is followed by SPX_MEM_SLACK bytes (the GEMV reads
 * scale and zero words aligned down and up). A quantized matrix is stored
 * tiled (qtensor.h) wherever the tiled layout holds it, whatever the
 * file's layout, so its rows are padded to a multiple of 16 there. A
 * layer's image is its slots' components in slot order (model/arch.h);
 * the global image is the embedding, the LM head unless it is the
 * embedding's own codes, the final norm, the RoPE frequencies. */
#ifndef SPX_ENGINE_MEMORY_H
#define SPX_ENGINE_MEMORY_H

#include "model/model.h"
#include <stddef.h>
#include <stdint.h>

#define SPX_MEM_ALIGN 256
#define SPX_MEM_SLACK 16
/* n_tok * n_splits bound of the attention's split-K partials */
#define SPX_MEM_PART_TOK_SPLITS 128
/* Tokens per chunk of the device's chunked Mamba-2 prompt scan
 * (cuda/ssm.cu says why 64; its intra-chunk kernels are built for it). */
#define SPX_MEM_SSD_CHUNK 64

/* Reserves n bytes at *off (rounded up to SPX_MEM_ALIGN) plus the slack;
 * returns the component's offset. */
size_t spx_mem_take(size_t *off, size_t n);
/* Whether q is tiled on the device: wherever tile16x128 holds it (4 bits,
 * groups of 32, cols % 128 == 0), and bits 2 and 3 under the same
 * conditions in the device's own tiled layout (cuda/lowbit.cuh; the CUDA
 * backend runs those widths tiled only). */
int spx_mem_dev_tiled(const spx_qtensor *q);
/* The five component sizes of q on the device: codes, scales, zeros,
 * outlier indices, outlier values (the last two 0 without outliers). */
void spx_mem_mat_parts(const spx_qtensor *q, size_t parts[5]);
/* Floats of scratch the chunked device SSD scan of T tokens needs
 * (spx_cu_ssd_scan, cuda/ssm.cuh): every chunk's end state [n_chunks, H,
 * P, N] and each token's cumulative decay [T, H], n_chunks = ceil(T /
 * SPX_MEM_SSD_CHUNK); 0 for T <= SPX_MEM_SSD_CHUNK (one chunk: the
 * sequential scan, no scratch). */
size_t spx_mem_ssd_work_floats(int64_t H, int64_t P, int64_t N, int64_t T);
/* Whether the LM head is the embedding's own codes (tied: stored once). */
int spx_mem_head_shared(const spx_model *m);
/* Bytes of a layer's and of the global image, from offset 0. */
size_t spx_mem_layer_image(const spx_model *m, int64_t l);
size_t spx_mem_global_image(const spx_model *m);

/* The session's device buffers besides the KV cache, bytes each (the
 * widths of the widest block a layer has: attention, the recurrent
 * blocks' in/out projections, a fused gate+up). w16: the fp16 weight
 * scratch of the cuBLAS prefill GEMM, counted when with_w16 (the
 * planner counts it whether or not cuBLAS loads at run time). */
typedef struct spx_cuda_scratch {
    size_t h, x, q, k, v, att, gate, proj, state, state_ckpt, up, logits, part, x16, ws, w16, ids, pos, best, attn_cnt;
    size_t ssd;       /* the chunked SSD scan's scratch (0 without Mamba-2 layers) */
    size_t wide;      /* the widest activation row (floats) */
    size_t ws_floats; /* split-K partials */
    size_t w16_elems;
    size_t total;     /* the sum of the above buffers */
} spx_cuda_scratch;
void spx_mem_cuda_scratch(const spx_config *c, int64_t state_floats, int with_w16, spx_cuda_scratch *s);

#endif
