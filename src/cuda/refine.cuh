/* refine.cuh: the CUDA kernels of StrataFlux weight refinement (issue 20;
 * ../shared/spec/strataflux-paper.txt sections 2.2, 3.2.1, Appendix G):
 * the exact per-chunk top-k selection of a decode launch's input channels
 * and the selected residual columns' contribution, read zero-copy from
 * pinned, mapped host memory (the backing tier of a dedicated GPU).
 *
 * Meaning: refine/refine.h. For one token x[cols] and the selection S,
 *     delta[r] = scale[r] * sum_{i in S, ascending} x[i] q[r, i]
 * where q[r, i] is nibble r of column i (DecDEC's column-contiguous 4-bit
 * layout: word m of a column holds rows 8m .. 8m + 7, row 8m + k in
 * nibble k, nibble = q + 8). The caller adds delta to the base output
 * (spx_rf_add*). The accumulation is the CPU table's chain per row
 * (acc = fmaf(x_i, q, acc) over ascending i, then scale * acc), so each
 * delta equals the CPU's bit for bit given the same x values; x differs
 * from the CPU's in the last bits where the launch normalizes its input
 * (rmsnorm in float here, in double there).
 *
 * Selection (spx_rf_select): one block of 1,024 threads per chunk of
 * SPX_REFINE_CHUNK channels, the same rule as spx_refine_topk: the
 * min(k, candidates) channels of largest |x|, ties to the lower index, a
 * NaN below every number, skipped channels (outliers of the first matrix,
 * when k < the chunk) never chosen. Method: a 32-step bitwise search for
 * the k-th largest key with __syncthreads_count, then a block prefix count
 * of the ties and of the chosen (so the output is ascending). Chunk c's
 * choices are written at sel[c * kcap ..], their count at cnt[c]
 * (kcap = min(k, SPX_REFINE_CHUNK)), with their x values in selx.
 *
 * Application (spx_rf_apply): each thread owns one 32-bit word (8 rows)
 * of one matrix and walks the selection in order; blocks take 2,048-row
 * tiles of the launch's matrices in a grid-stride loop over at most
 * `blocks` blocks: the thread-block budget that keeps the refinement from
 * taking the SMs the base GEMV runs on (paper Appendix G, DecDEC). A warp
 * reads 128 contiguous bytes of a column per load; eight columns' loads
 * are issued before their FMAs so that enough host reads are in flight.
 *
 * Fetch lead (cu_refine.cu): the selection is made earlier, from another
 * vector (spx_rf_select on a snapshot of the residual stream), and
 * spx_rf_fetch copies the selected columns of every matrix of the launch
 * from the host tier into a device staging buffer, one per matrix:
 *     stage[e * col_stride ..] = column sel[e] (col_stride bytes, the
 *     residual's own stride), e = c * kcap + j for chunk c's j-th choice,
 * the selection array's own index (entries j >= cnt[c] are left as they
 * are and never read). When the launch's input exists, spx_rf_select_x
 * rewrites selx with its values at the chosen channels (the same
 * arithmetic as spx_rf_select, so with the same channels the same bits),
 * and the one apply kernel reads the staging with staged = 1: entry e's
 * column at codes + e * col_stride instead of codes + sel[e] * col_stride.
 * Everything else (order, fmaf chain) is the same, so a staged apply
 * equals the direct one bit for bit given the same selection and x.
 *
 * Limits: cols <= SPX_RF_MAX_COLS (the chunk count of the selection
 * buffers); up to SPX_RF_MAX_MATS matrices a launch; col_stride a multiple
 * of 4 with 4 * ceil(rows / 8) <= col_stride (the .refine writer rounds
 * to 64). */
#ifndef SPX_CUDA_REFINE_CUH
#define SPX_CUDA_REFINE_CUH

#include "cuda/common.cuh"

#define SPX_RF_MAX_MATS 3
#define SPX_RF_CHUNK 1024
#define SPX_RF_MAX_COLS 65536

struct spx_rf_mat {
    const uint8_t *codes;  /* device address of column 0 ([cols][col_stride], mapped host memory) */
    const float *scales;   /* [rows], device */
    float *delta;          /* [rows] output */
    int64_t rows, col_stride;
};

struct spx_rf_select_args {
    const float *x;        /* [cols] the launch's input (see gain, x2) */
    const float *gain;     /* non-NULL: the input is rmsnorm(x) * gain (eps) */
    const float *x2;       /* non-NULL: the input is x * x2 */
    float eps;
    int64_t cols;
    int k;                 /* channels per chunk, >= 1 */
    const uint8_t *skip;   /* [cols] non-zero: never chosen; NULL: none */
    int32_t *sel;          /* [n_chunks * kcap] */
    float *selx;           /* [n_chunks * kcap] */
    int *cnt;              /* [n_chunks] */
};

struct spx_rf_apply_args {
    spx_rf_mat m[SPX_RF_MAX_MATS];
    int n_mats;
    const int32_t *sel;
    const float *selx;
    const int *cnt;
    int n_chunks, kcap;
    int staged;            /* 0: m[].codes are the model's columns (channel sel[e] at sel[e] * col_stride);
                            * 1: staging buffers of spx_rf_fetch (entry e at e * col_stride) */
};

/* Fetch lead's copy of the selected columns into staging (see above):
 * m[i].codes the source columns (mapped host memory), stage[i] its
 * [n_chunks * kcap][m[i].col_stride] device buffer; scales, delta unused. */
struct spx_rf_fetch_args {
    spx_rf_mat m[SPX_RF_MAX_MATS];
    uint8_t *stage[SPX_RF_MAX_MATS];
    int n_mats;
    const int32_t *sel;
    const int *cnt;
    int n_chunks, kcap;
};

/* Enqueues the selection of one launch's input (n_chunks blocks). */
cudaError_t spx_rf_select(const spx_rf_select_args &a, cudaStream_t st);
/* Enqueues the application on at most `blocks` blocks (>= 1). */
cudaError_t spx_rf_apply(const spx_rf_apply_args &a, int blocks, cudaStream_t st);
/* Rewrites a.selx at the selection in a.sel / a.cnt (made by spx_rf_select
 * with the same cols and k, from any vector) with the values of a.x's
 * input (x, gain, x2, eps as for spx_rf_select; skip is not read). */
cudaError_t spx_rf_select_x(const spx_rf_select_args &a, cudaStream_t st);
/* Enqueues the copy of the selected columns into staging on at most
 * `blocks` blocks (>= 1). */
cudaError_t spx_rf_fetch(const spx_rf_fetch_args &a, int blocks, cudaStream_t st);
/* dst[i] = src[i] for i < n (a kernel, so that a PDL launch may follow). */
cudaError_t spx_rf_copy(float *dst, const float *src, int64_t n, cudaStream_t st);
/* y[i] += mult * d[i] for i < n. */
cudaError_t spx_rf_add(float *y, const float *d, int64_t n, float mult, cudaStream_t st);
/* gate[i] = silu(gate[i] + dg[i]) * (up[i] + du[i]) for i < n: the
 * refined SwiGLU of a gate/up launch whose outputs were stored raw. */
cudaError_t spx_rf_add_swiglu(float *gate, const float *up, const float *dg, const float *du, int64_t n, cudaStream_t st);

#endif
