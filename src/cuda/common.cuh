/* common.cuh: what every CUDA op family shares: the device view of a
 * quantized matrix (spx_dqmat, the .trdc layout of qtensor.h copied
 * component by component, or tiled at upload), warp/block reductions and the
 * packed (value, index) key of the device argmax.
 *
 * Limits: 4-bit codes in groups of 32 (the .trdc default), and 2 and 3
 * bits in groups of 32 with cols % 128 == 0 (tiled: lowbit.cuh); the
 * backend rejects other widths and group sizes at model load with a
 * message. */
#ifndef SPX_CUDA_COMMON_CUH
#define SPX_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include "engine/tuning.h" /* the SPECTRA_* settings */
#include "cuda/lowbit.cuh"

#define SPX_CUDA_GROUP 32 /* columns per quantization group */

/* A Group-32 matrix [rows, cols] in device memory, 4-bit laid out as in
 * the .trdc (qtensor.h), in either layout, or 2/3-bit tiled (lowbit.cuh):
 *   rows (tiled == 0): row r's codes at codes + r*cols/2, scales at
 *       scales + r*n_groups, zero nibbles at zeros + r*zrow;
 *   tiled (SPX_Q_TILED): 16-row tiles x 128-column items in the int8 MMA
 *       fragments' order (qtensor.h; the decode GEMV's fast path).
 * Outlier values are row-major [rows, n_out] in both. spx_dq_group reads
 * one group of either layout (the GEMM, the dequantization, the gather). */
struct spx_dqmat {
    int64_t rows, cols;
    int n_groups;             /* cols / 32 */
    int zrow;                 /* rows layout: bytes of zero points per row, (n_groups + 1) / 2 */
    int n_out;                /* outlier columns */
    int tiled;                /* 1: SPX_Q_TILED */
    int bits;                 /* 4, or 2 / 3 (always tiled: cuda/lowbit.cuh); 0 reads as 4 */
    const uint8_t *codes;
    const __half *scales;
    const uint8_t *zeros;
    const int32_t *oidx;      /* [n_out] strictly increasing, or NULL */
    const __half *oval;       /* [rows, n_out], or NULL */
};

/* Group g of row r: its 16 code bytes, scale and zero point. */
__device__ __forceinline__ void spx_dq_group(const spx_dqmat &w, int64_t r, int g, uint4 &c, float &s, int &z) {
    if (w.tiled) {
        const int64_t ti = (r >> 4) * (w.cols >> 7) + (g >> 2);
        const int lane = (int)((r & 7) << 2) + (g & 3), hi = (int)(r >> 3) & 1;
        if (w.bits == 2 || w.bits == 3) { /* lowbit.cuh: a lane-row's words, as nibbles */
            const uint8_t *base = w.codes + ti * 256 * w.bits;
            const uint2 ab = __ldg(reinterpret_cast<const uint2 *>(base + 16 * lane + 8 * hi));
            c = w.bits == 2 ? spx_lb_nibbles<2>(ab.x, ab.y, 0)
                            : spx_lb_nibbles<3>(ab.x, ab.y, __ldg(reinterpret_cast<const uint32_t *>(base + 512 + 8 * lane + 4 * hi)));
        } else {
            c = __ldg(reinterpret_cast<const uint4 *>(w.codes + (ti << 10) + (hi << 9) + (lane << 4)));
        }
        s = __half2float(w.scales[(ti << 6) + 2 * lane + hi]);
        z = (w.zeros[(ti << 5) + lane] >> (hi << 2)) & 15;
    } else {
        c = __ldg(reinterpret_cast<const uint4 *>(w.codes + r * (w.cols / 2) + (int64_t)g * 16));
        s = __half2float(w.scales[r * w.n_groups + g]);
        z = (w.zeros[r * w.zrow + (g >> 1)] >> ((g & 1) << 2)) & 15;
    }
}

/* silu(g) = g / (1 + e^-g), as the CPU's spx_cpu_silu_mul: the one
 * definition every CUDA kernel uses (SwiGLU launches, Mamba-2 gates). */
__device__ __forceinline__ float spx_silu_dev(float g) { return g / (1.0f + expf(-g)); }

__device__ __forceinline__ float spx_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float spx_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double spx_warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (every thread gets it). red: >= 32 doubles of shared
 * memory; blockDim.x a multiple of 32. Contains __syncthreads(). */
__device__ __forceinline__ double spx_block_sum_d(double v, double *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = spx_warp_sum_d(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    double t = lane < nw ? red[lane] : 0.0;
    return spx_warp_sum_d(t);
}

/* Argmax key: larger key = larger value, and for equal values the smaller
 * index (the CPU's first maximum). NaN orders above +inf (never expected). */
__device__ __forceinline__ unsigned long long spx_argmax_key(float v, int idx) {
    unsigned u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (unsigned long long)(0xffffffffu - (unsigned)idx);
}
__device__ __forceinline__ int spx_argmax_key_index(unsigned long long k) {
    return (int)(0xffffffffu - (unsigned)(k & 0xffffffffu));
}

/* Programmatic dependent launch (sm_90): a kernel launched with
 * spx_launch(..., pdl = true) may start while the previous kernel of the
 * stream still runs. It may only read data that no earlier kernel writes
 * (weights) before spx_pdl_wait(), which returns once the previous grid
 * has completed and its writes are visible; it must write nothing before
 * it. spx_pdl_trigger() lets the next kernel launch early (safe at any
 * point: the next one waits in turn). Both are no-ops without PDL. */
__device__ __forceinline__ void spx_pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void spx_pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" :::); }

/* Asynchronous global -> shared copies (sm_80+): 16 bytes through L2 only,
 * 4 bytes through L1; commit closes a group, cp_wait<N> waits until at
 * most N groups are in flight. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

/* One shared-memory carveout (percent of the unified L1 / shared memory)
 * for every kernel launched through spx_launch. Left to the driver, each
 * kernel of the decode chain gets the split its own needs suggest, and
 * (likely: an SM changes its split only once drained) the next kernel's
 * blocks cannot start early on an SM of another split, which undoes the
 * overlap of programmatic dependent launch at kernel boundaries. 50 %
 * (132 KB of shared memory on the H100/H200, enough for every decode
 * kernel at its occupancy) measured best against the driver's choice and
 * 100 % (bench/gpu/NOTES.md 33). SPECTRA_CUDA_CARVEOUT=n (0..100; engine/tuning.h) sets another,
 * -1 leaves it to the driver. Set once per kernel, at its first launch. */
inline int spx_carveout() {
    static const int v = spx_tuning_get()->cuda_carveout; /* once per process, as before */
    return v;
}
inline void spx_apply_carveout(const void *fn) {
    static std::mutex mu; /* sessions may launch from several threads */
    static const void *done[256];
    static int n_done = 0;
    const int v = spx_carveout();
    if (v < 0 || v > 100) return;
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < n_done; i++)
        if (done[i] == fn) return;
    if (n_done < 256) done[n_done++] = fn;
    cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, v);
}

template <typename... Params, typename... Args>
static inline cudaError_t spx_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                     bool pdl, Args... args) {
    spx_apply_carveout(reinterpret_cast<const void *>(kernel));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

#endif
