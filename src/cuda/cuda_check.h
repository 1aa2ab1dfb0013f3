/* cuda_check.h: checked CUDA runtime calls for the library (host code of
 * src/cuda/ and tests/cuda/ only; C++ through nvcc).
 *
 * SPX_CUDA_TRY(e, call) evaluates a cudaError_t expression and, when it is
 * not cudaSuccess, records "file:line: call failed: name (text)" in e and
 * returns the matching spx_status from the enclosing function. Kernel
 * launches are checked with SPX_CUDA_TRY(e, cudaGetLastError()) or through
 * the launch wrappers of the .cuh files, which return cudaGetLastError().
 * Nothing here exits or aborts. */
#ifndef SPX_CUDA_CHECK_H
#define SPX_CUDA_CHECK_H

#include <cuda_runtime.h>

extern "C" {
#include "core/err.h"
}

static inline spx_status spx_cuda_fail(spx_err *e, cudaError_t err, const char *what, const char *file, int line) {
    spx_status code = SPX_ERR_INTERNAL;
    if (err == cudaErrorMemoryAllocation) code = SPX_ERR_NOMEM;
    else if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorNoKernelImageForDevice ||
             err == cudaErrorUnsupportedPtxVersion)
        code = SPX_ERR_UNSUPPORTED;
    return spx_fail(e, code, "%s:%d: %s failed: %s (%s)", file, line, what, cudaGetErrorName(err),
                    cudaGetErrorString(err));
}

#define SPX_CUDA_TRY(e, call)                                                        \
    do {                                                                             \
        cudaError_t spx_cuda_err_ = (call);                                          \
        if (spx_cuda_err_ != cudaSuccess)                                            \
            return spx_cuda_fail((e), spx_cuda_err_, #call, __FILE__, __LINE__);     \
    } while (0)

#endif
