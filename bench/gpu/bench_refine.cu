/* bench_refine.cu: the refinement kernels alone (cuda/refine.cuh) on
 * Llama-3-8B shapes, the residual in pinned, mapped host memory: time of
 * one selection + application per (shape, k, thread blocks), and the host
 * bytes it read per second against the pinned host-to-device copy rate
 * (cudaMemcpyAsync of the same bytes, measured here).
 *
 *   bench_refine [--json]
 *
 * Bytes read: n_sel columns x ceil(rows / 2) bytes (what the rows need;
 * the last 32-bit word of a column may reach into its padding). Each
 * case runs 20 warm-up and 200 timed launches; the time is the median of
 * 5 groups of 40 (cudaEvent timing). */
#include "cuda/refine.cuh"

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    const bool json = argc > 1 && !strcmp(argv[1], "--json");
    struct shape { const char *name; int64_t rows, cols; } shapes[] = {
        {"8b-qkv", 6144, 4096}, {"8b-gate_up", 28672, 4096}, {"8b-down", 4096, 14336}};
    const int ks[] = {4, 16, 32, 128};
    const int blocks[] = {4, 8, 16, 32, 64, 132};
    uint64_t rng = 12345;
    auto rnd = [&]() { rng = rng * 6364136223846793005ULL + 1442695040888963407ULL; return (uint32_t)(rng >> 33); };
    /* the copy rate: 64 MiB pinned -> device */
    double copy_gbps = 0;
    {
        const size_t n = 64u << 20;
        void *h, *d;
        CK(cudaHostAlloc(&h, n, 0));
        CK(cudaMalloc(&d, n));
        memset(h, 1, n);
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        std::vector<float> ms;
        for (int i = 0; i < 6; i++) {
            CK(cudaEventRecord(a));
            CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice));
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float t;
            CK(cudaEventElapsedTime(&t, a, b));
            if (i) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        copy_gbps = (double)n / (ms[ms.size() / 2] * 1e-3) / 1e9;
        cudaFreeHost(h);
        cudaFree(d);
    }
    if (!json) printf("pinned host-to-device copy: %.1f GB/s\n%-12s %5s %6s %8s %10s %9s %7s\n", copy_gbps, "shape", "k",
                      "blocks", "n_sel", "host MB", "us", "GB/s");
    else printf("{\"copy_gbps\": %.2f, \"cases\": [", copy_gbps);
    int first = 1;
    for (const shape &s : shapes) {
        const int64_t stride = ((s.rows + 1) / 2 + 63) / 64 * 64;
        uint8_t *host, *host_d;
        CK(cudaHostAlloc((void **)&host, (size_t)(s.cols * stride), cudaHostAllocMapped));
        CK(cudaHostGetDevicePointer((void **)&host_d, host, 0));
        for (int64_t i = 0; i < s.cols * stride; i++) host[i] = (uint8_t)rnd();
        std::vector<float> x((size_t)s.cols), sc((size_t)s.rows, 1e-3f);
        for (auto &v : x) v = (float)(rnd() % 2001) / 1000.0f - 1.0f;
        float *dx, *dsc, *dd, *dselx;
        int32_t *dsel;
        int *dcnt;
        CK(cudaMalloc(&dx, x.size() * 4));
        CK(cudaMalloc(&dsc, sc.size() * 4));
        CK(cudaMalloc(&dd, sc.size() * 4));
        CK(cudaMalloc(&dsel, (size_t)s.cols * 4));
        CK(cudaMalloc(&dselx, (size_t)s.cols * 4));
        CK(cudaMalloc(&dcnt, 64 * 4));
        CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dsc, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
        for (int k : ks)
            for (int nb : blocks) {
                spx_rf_select_args sa;
                memset(&sa, 0, sizeof sa);
                sa.x = dx, sa.cols = s.cols, sa.k = k, sa.sel = dsel, sa.selx = dselx, sa.cnt = dcnt;
                spx_rf_apply_args aa;
                memset(&aa, 0, sizeof aa);
                aa.m[0] = {host_d, dsc, dd, s.rows, stride};
                aa.n_mats = 1, aa.sel = dsel, aa.selx = dselx, aa.cnt = dcnt;
                aa.n_chunks = (int)((s.cols + 1023) / 1024), aa.kcap = k;
                cudaEvent_t a, b;
                CK(cudaEventCreate(&a));
                CK(cudaEventCreate(&b));
                for (int i = 0; i < 20; i++) {
                    CK(spx_rf_select(sa, 0));
                    CK(spx_rf_apply(aa, nb, 0));
                }
                std::vector<float> ms;
                for (int g = 0; g < 5; g++) {
                    CK(cudaEventRecord(a));
                    for (int i = 0; i < 40; i++) {
                        CK(spx_rf_select(sa, 0));
                        CK(spx_rf_apply(aa, nb, 0));
                    }
                    CK(cudaEventRecord(b));
                    CK(cudaEventSynchronize(b));
                    float t;
                    CK(cudaEventElapsedTime(&t, a, b));
                    ms.push_back(t / 40);
                }
                std::sort(ms.begin(), ms.end());
                const double us = ms[2] * 1e3;
                const int64_t n_sel = (int64_t)aa.n_chunks * k;
                const double mb = (double)n_sel * (double)((s.rows + 1) / 2) / 1e6;
                const double gbps = mb * 1e6 / (us * 1e-6) / 1e9;
                if (json)
                    printf("%s{\"shape\": \"%s\", \"k\": %d, \"blocks\": %d, \"n_sel\": %lld, \"host_mb\": %.3f, \"us\": %.2f, "
                           "\"gbps\": %.2f}", first ? "" : ", ", s.name, k, nb, (long long)n_sel, mb, us, gbps);
                else printf("%-12s %5d %6d %8lld %10.3f %9.2f %7.2f\n", s.name, k, nb, (long long)n_sel, mb, us, gbps);
                first = 0;
                cudaEventDestroy(a);
                cudaEventDestroy(b);
            }
        cudaFreeHost(host);
        cudaFree(dx), cudaFree(dsc), cudaFree(dd), cudaFree(dsel), cudaFree(dselx), cudaFree(dcnt);
    }
    if (json) printf("]}\n");
    return 0;
}
