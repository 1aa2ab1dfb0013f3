/* cutest.cuh: what the CUDA test programs share: a checked call that
 * stops the program on a CUDA error, and device buffers that live until
 * dev_free_all() (each allocated with 16 bytes of slack, as the backend's
 * arena: gemv_q4.cuh). */
#ifndef SPX_TESTS_CUTEST_CUH
#define SPX_TESTS_CUTEST_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CK(call)                                                                                            \
    do {                                                                                                    \
        cudaError_t err_ = (call);                                                                          \
        if (err_ != cudaSuccess) {                                                                          \
            fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            exit(1);                                                                                        \
        }                                                                                                   \
    } while (0)

static std::vector<void *> g_dev;

template <typename T> static T *dev_alloc(size_t n) {
    void *p = NULL;
    CK(cudaMalloc(&p, n * sizeof(T) + 16));
    g_dev.push_back(p);
    return (T *)p;
}
template <typename T> static T *dev_up(const T *h, size_t n) {
    T *d = dev_alloc<T>(n);
    if (n) CK(cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
static inline void dev_free_all(void) {
    for (void *p : g_dev) cudaFree(p);
    g_dev.clear();
}

/* End-to-end logit checks: max |g - c| over the row relative to its
 * largest |c| (floor 1), infinite for a NaN; and the argmax. */
static inline double row_err(const float *g, const float *c, int64_t V) {
    double d = 0, mx = 1;
    for (int64_t i = 0; i < V; i++) {
        if (isnan(g[i])) return INFINITY;
        d = fmax(d, fabs((double)g[i] - c[i]));
        mx = fmax(mx, fabs((double)c[i]));
    }
    return d / mx;
}

static inline int32_t argmax_f(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

#endif
