/* gemm_cublas.cu: see gemm_cublas.cuh. */
#include "cuda/gemm_cublas.cuh"

#include <cublas_v2.h> /* types and prototypes only: the library is opened with dlopen */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cublas_api {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                              const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t); /* the C entry point */
    bool ok;
};
static cublas_api g_cb;
static pthread_once_t g_cb_once = PTHREAD_ONCE_INIT;

static void cublas_load(void) {
    if (!spx_tuning_get()->cublas) return; /* SPECTRA_CUBLAS=0, at the first use, as before */
    void *lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { /* the toolkit's own folder, when not on the loader's path */
        char path[4096];
        const char *home = getenv("CUDA_HOME");
        snprintf(path, sizeof path, "%s/lib64/libcublas.so.13", home && *home ? home : "/usr/local/cuda");
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!lib) return;
    g_cb.create = (decltype(g_cb.create))dlsym(lib, "cublasCreate_v2");
    g_cb.destroy = (decltype(g_cb.destroy))dlsym(lib, "cublasDestroy_v2");
    g_cb.set_stream = (decltype(g_cb.set_stream))dlsym(lib, "cublasSetStream_v2");
    g_cb.gemm_ex = (decltype(g_cb.gemm_ex))dlsym(lib, "cublasGemmEx");
    if (!g_cb.create || !g_cb.destroy || !g_cb.set_stream || !g_cb.gemm_ex) return;
    g_cb.ok = true;
}

void *spx_gemm_cublas_create(void) {
    if (!spx_gemm_cublas_ready()) return NULL;
    cublasHandle_t h = NULL;
    return g_cb.create(&h) == CUBLAS_STATUS_SUCCESS ? (void *)h : NULL;
}

void spx_gemm_cublas_destroy(void *h) {
    if (h && g_cb.ok) g_cb.destroy((cublasHandle_t)h);
}

bool spx_gemm_cublas_ready(void) {
    pthread_once(&g_cb_once, cublas_load);
    return g_cb.ok;
}

int spx_gemm_cublas_min_m(void) {
    return spx_tuning_get()->cublas_min_m; /* SPECTRA_CUBLAS_MIN_M: n >= 2, else 64 */
}

/* W^ of rows [r0, r0 + n) into w16 [n, cols]: one thread per group of 32
 * (16 code bytes in, 64 bytes out), the fp16 magic-number dequantization
 * of gemm_q4.cu (bit-identical W^). */
__global__ void dequant_rows(const spx_dqmat w, int64_t r0, int64_t n, __half *w16) {
    const int ng = w.n_groups;
    const int64_t total = n * ng;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t rr = i / ng, r = r0 + rr;
        const int g = (int)(i - rr * ng);
        uint4 c;
        float s;
        int zi;
        spx_dq_group(w, r, g, c, s, zi);
        const float z = (float)zi;
        const __half2 zz = __float2half2_rn(1024.0f + z), ss = __float2half2_rn(s);
        auto deq = [&](uint32_t v) {
            const uint32_t m = (v & 0x000f000fu) | 0x64006400u;
            const __half2 h = __hmul2(__hsub2(*reinterpret_cast<const __half2 *>(&m), zz), ss);
            return *reinterpret_cast<const uint32_t *>(&h);
        };
        const uint32_t wd[4] = {c.x, c.y, c.z, c.w};
        uint32_t lo[8], hi[8]; /* codes 0..15 and 16..31 as 8 half2 each */
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t t = __byte_perm(wd[q], 0, 0x3120); /* bytes b0 b2 b1 b3 */
            lo[2 * q] = deq(t);
            hi[2 * q] = deq(t >> 4);
            lo[2 * q + 1] = deq(t >> 8);
            hi[2 * q + 1] = deq(t >> 12);
        }
        uint4 *dst = reinterpret_cast<uint4 *>(w16 + rr * w.cols + (int64_t)g * 32);
        dst[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        dst[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
        dst[2] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        dst[3] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
    }
}

/* The fp16 outlier values into their columns (the dense slot is exactly 0). */
__global__ void scatter_outliers(const spx_dqmat w, int64_t r0, int64_t n, __half *w16) {
    const int64_t total = n * w.n_out;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t rr = i / w.n_out;
        const int j = (int)(i - rr * w.n_out);
        w16[rr * w.cols + w.oidx[j]] = w.oval[(r0 + rr) * w.n_out + j];
    }
}

__global__ void add_bias(float *y, int64_t ldy, const float *bias, int64_t r0, int64_t n, int M) {
    const int64_t total = n * M;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / n, rr = i - t * n;
        y[t * ldy + r0 + rr] += bias[r0 + rr];
    }
}

static unsigned grid_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 8192 ? (b < 1 ? 1 : b) : 8192);
}

cudaError_t spx_gemm_q4_cublas(void *handle, const spx_gemm_args &a, __half *w16, size_t w16_elems, cudaStream_t st) {
    if (!spx_gemm_cublas_ready() || !handle) return cudaErrorNotSupported;
    cublasHandle_t h = (cublasHandle_t)handle;
    const spx_dqmat &w = a.w;
    if (a.M <= 0 || w.cols % 32 || w.rows <= 0 || !w16 || w16_elems < (size_t)w.cols) return cudaErrorInvalidValue;
    if (w.cols > INT32_MAX || w.rows > INT32_MAX || a.ldx > INT32_MAX || a.ldy > INT32_MAX) return cudaErrorInvalidValue;
    int64_t chunk = (int64_t)(w16_elems / (size_t)w.cols);
    if (chunk > w.rows) chunk = w.rows;
    if (g_cb.set_stream(h, st) != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < w.rows; r0 += chunk) {
        const int64_t n = w.rows - r0 < chunk ? w.rows - r0 : chunk;
        dequant_rows<<<grid_for(n * w.n_groups), 256, 0, st>>>(w, r0, n, w16);
        if (w.n_out > 0) scatter_outliers<<<grid_for(n * w.n_out), 256, 0, st>>>(w, r0, n, w16);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
        /* column-major view: C [n, M] (ldc = ldy) = W16^T' [n, cols] x X [cols, M] (ldb = ldx) */
        cublasStatus_t cs = g_cb.gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, a.M, (int)w.cols, &one, w16, CUDA_R_16F,
                                         (int)w.cols, a.x, CUDA_R_16F, (int)a.ldx, a.accumulate ? &one : &zero,
                                         a.y + r0, CUDA_R_32F, (int)a.ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (cs != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
        if (a.bias) add_bias<<<grid_for(n * a.M), 256, 0, st>>>(a.y, a.ldy, a.bias, r0, n, a.M);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
    return cudaSuccess;
}
