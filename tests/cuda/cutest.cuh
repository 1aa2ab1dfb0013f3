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

/* Comparing two paths that both use the 4-bit KV cache (cuda vs cpu, or a
 * batch row vs the same session alone). The two
 * caches are bit-identical only for bit-identical K/V inputs; the backends'
 * K/V differ by float rounding (fp16 tensor-core GEMM in prefill, ~1e-3
 * relative; the int8 GEMV in decode, ~1e-4), which flips a code wherever
 * w/s + z lies that close to a rounding boundary, and every flip moves the
 * next layers' K/V by more than the rounding did: the difference grows to
 * a fixed fraction of q4's own error. Measured on the CPU (noise of
 * relative size eps added to every K/V row before spx_kv_store, linker
 * --wrap, tiny-llama3/qwen2/mistral and docllama-58m, 150-token prefill):
 * mean |logit difference| / mean |q4 - f16 logits| = 0.04-0.30 at eps 1e-4,
 * 0.09-0.47 at 1e-3, 0.36-0.67 at 3e-3; max-rel error / q4's max-rel error
 * 0.05-0.35, 0.17-0.45, 0.32-0.59. An fp16 cache on the device would give
 * a mean ratio of 1 and an unrelated 4-bit quantizer ~1.4, so: */
#define E2E_Q4_MEAN_RATIO 0.8 /* mean |cuda q4 - cpu q4| <= this x mean |cpu q4 - cpu f16| */
#define E2E_Q4_MAX_RATIO 1.2  /* max-rel error <= this x the cpu q4's max-rel error vs f16 (sanity) */

struct err_acc {
    double sum = 0, sum_ref = 0, mx = 0, mx_ref = 0;
    size_t n = 0;
    /* g: the q4 path checked, c: the reference q4 path, f: the reference with an fp16 cache; one row of V logits */
    void add(const float *g, const float *c, const float *f, int64_t V) {
        for (int64_t i = 0; i < V; i++) {
            sum += isnan(g[i]) ? INFINITY : fabs((double)g[i] - c[i]);
            sum_ref += fabs((double)f[i] - c[i]);
        }
        n += (size_t)V;
        mx = fmax(mx, row_err(g, c, V));
        mx_ref = fmax(mx_ref, row_err(f, c, V));
    }
    double mean_ratio() const { return sum / fmax(sum_ref, 1e-30); }
    double max_ratio() const { return mx / fmax(mx_ref, 1e-30); }
    bool ok() const { return mean_ratio() <= E2E_Q4_MEAN_RATIO && max_ratio() <= E2E_Q4_MAX_RATIO; }
};


#endif
