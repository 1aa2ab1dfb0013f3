/* gemm_cublas.cuh: the prefill GEMM through cuBLAS, loaded at run time.
 *
 *   y[t, r] (+)= sum_c W^[r, c] x[t, c] + bias[r]     (as spx_gemm_q4)
 *
 * For M tokens at once (M >= spx_gemm_cublas_min_m()) the 4-bit matrix is
 * dequantized into an fp16 scratch, row chunk by row chunk (W^ = (q - z) *
 * s rounded to fp16 once, the fp16 outlier values written into their
 * columns, whose dense slots are exactly 0: the same W^ as the
 * tensor-core kernel of gemm_q4.cu forms in shared memory), then
 * cublasGemmEx multiplies it with the fp16 activations, float32
 * accumulation. The dequantization costs a write and a read of 2 bytes per
 * weight per call, which the GEMM amortizes over M tokens.
 *
 * libcublas is opened with dlopen on first use (libcublas.so.13, then
 * libcublas.so, then $CUDA_HOME or /usr/local/cuda /lib64/libcublas.so.13):
 * no link dependency, and without it (or with
 * SPECTRA_CUBLAS=0) spx_gemm_cublas_ready() is false and the backend keeps
 * gemm_q4.cu's kernel. SPECTRA_CUBLAS_MIN_M=n moves the threshold (for
 * measurements). One device per process. */
#ifndef SPX_CUDA_GEMM_CUBLAS_CUH
#define SPX_CUDA_GEMM_CUBLAS_CUH

#include "cuda/gemm_q4.cuh"

/* True once libcublas is loaded (tries once). */
bool spx_gemm_cublas_ready(void);
/* A cuBLAS handle (NULL without cuBLAS or on failure); one per model,
 * destroyed with spx_gemm_cublas_destroy before the CUDA context goes. */
void *spx_gemm_cublas_create(void);
void spx_gemm_cublas_destroy(void *handle);
/* Smallest M that takes this path (default 64). */
int spx_gemm_cublas_min_m(void);
/* Enqueues the GEMM on st through cuBLAS; w16: fp16 scratch of w16_elems
 * (at least cols: rows are processed in chunks of w16_elems / cols).
 * cudaErrorNotSupported when cuBLAS is not available; a cuBLAS failure is
 * reported as cudaErrorUnknown. */
cudaError_t spx_gemm_q4_cublas(void *handle, const spx_gemm_args &a, __half *w16, size_t w16_elems, cudaStream_t st);

#endif
