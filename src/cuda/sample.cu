/* sample.cu: device argmax and sampling (see sample.cuh). */
#include "cuda/sample.cuh"

/* the block's largest key b (every thread's own), valid in thread 0 */
static __device__ unsigned long long block_max_key(unsigned long long b) {
    __shared__ unsigned long long wb[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long v = __shfl_xor_sync(0xffffffffu, b, o);
        b = v > b ? v : b;
    }
    if ((threadIdx.x & 31) == 0) wb[threadIdx.x >> 5] = b;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) b = wb[w] > b ? wb[w] : b;
    return b;
}

__global__ void argmax_kernel(const float *x, int64_t n, unsigned long long *best) {
    unsigned long long b = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        unsigned long long k = spx_argmax_key(x[i], (int)i);
        b = k > b ? k : b;
    }
    b = block_max_key(b);
    if (threadIdx.x == 0) {
        atomicMax(best, b);
    }
}

/* The end of a decode step (one thread): id becomes the next input, the
 * position advances, and with ring (mapped host memory, read by the host
 * once an event after this kernel completes) the token is reported there;
 * rng: also the sampler's state after its draw. */
__device__ __forceinline__ void step_publish(int32_t id, int32_t *ids, int32_t *pos, unsigned long long *ring,
                                             const unsigned long long *rng) {
    const int32_t p = pos[0];
    ids[0] = id;
    pos[0] = p + 1;
    if (ring) {
        if (rng) ring[SPX_TOKEN_RING + (uint32_t)p % SPX_TOKEN_RING] = *rng;
        ring[(uint32_t)p % SPX_TOKEN_RING] = spx_token_ring_entry(p, id);
        __threadfence_system();
    }
}

__global__ void argmax_finish_kernel(unsigned long long *best, int32_t *ids, int32_t *pos, unsigned long long *ring) {
    spx_pdl_wait();
    const int32_t id = spx_argmax_key_index(*best);
    *best = 0;
    step_publish(id, ids, pos, ring, nullptr);
}

cudaError_t spx_argmax(const float *x, int64_t n, unsigned long long *best, int n_sm, cudaStream_t st) {
    if (n <= 0) return cudaErrorInvalidValue;
    int64_t blocks = (n + 255) / 256, cap = (int64_t)(n_sm > 0 ? n_sm : 1) * 2;
    if (blocks > cap) blocks = cap;
    argmax_kernel<<<(unsigned)blocks, 256, 0, st>>>(x, n, best);
    return cudaGetLastError();
}

/* one block per row: the row's packed maximum, then its index */
__global__ void argmax_rows_kernel(const float *x, int64_t n, int32_t *out) {
    const float *row = x + (size_t)blockIdx.x * (size_t)n;
    unsigned long long b = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        unsigned long long k = spx_argmax_key(row[i], (int)i);
        b = k > b ? k : b;
    }
    b = block_max_key(b);
    if (threadIdx.x == 0) out[blockIdx.x] = spx_argmax_key_index(b);
}

cudaError_t spx_argmax_rows(const float *x, int rows, int64_t n, int32_t *out, cudaStream_t st) {
    if (rows <= 0 || n <= 0) return cudaErrorInvalidValue;
    argmax_rows_kernel<<<(unsigned)rows, 1024, 0, st>>>(x, n, out);
    return cudaGetLastError();
}

cudaError_t spx_argmax_finish(unsigned long long *best, int32_t *ids, int32_t *pos, cudaStream_t st, bool pdl,
                              unsigned long long *ring) {
    cudaError_t err = spx_launch(argmax_finish_kernel, dim3(1), dim3(1), 0, st, pdl, best, ids, pos, ring);
    return err != cudaSuccess ? err : cudaGetLastError();
}

/* ---- temperature / top-k / top-p ------------------------------------------------ */

#define SM_THREADS 1024

/* Order-preserving unsigned key of a float (larger float, larger key). */
__device__ __forceinline__ unsigned sm_key(float f) {
    const unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Exclusive prefix sum over the block's threads (blockDim.x = SM_THREADS);
 * *total gets the sum. Contains barriers. */
__device__ __forceinline__ int sm_scan(int v, int *ws, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) ws[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < SM_THREADS / 32 ? ws[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        ws[lane] = w; /* inclusive */
    }
    __syncthreads();
    *total = ws[SM_THREADS / 32 - 1];
    return x - v + (warp ? ws[warp - 1] : 0);
}

__device__ __forceinline__ unsigned long long sm_splitmix(unsigned long long *s) {
    unsigned long long z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void __launch_bounds__(SM_THREADS) sample_topk_kernel(const float *logits, int64_t V, spx_sample_dev *sp,
                                                                 int32_t *ids, int32_t *pos, unsigned long long *ring) {
    __shared__ unsigned hist[256];
    __shared__ float cp[SPX_SAMPLE_MAX_K];
    __shared__ int cid[SPX_SAMPLE_MAX_K];
    __shared__ int ws[32];
    __shared__ float wmax[32];
    __shared__ unsigned s_prefix;
    __shared__ int s_rem;
    spx_pdl_trigger();
    spx_pdl_wait(); /* the logits come from the previous kernel */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float T = sp->temperature;
    const int K = sp->top_k;
    /* 1. the maximum logit */
    float mx = -INFINITY;
    for (int64_t i = tid; i < V; i += SM_THREADS) mx = fmaxf(mx, logits[i]);
    mx = spx_warp_max(mx);
    if (lane == 0) wmax[warp] = mx;
    __syncthreads();
    mx = wmax[0];
    for (int w = 1; w < SM_THREADS / 32; w++) mx = fmaxf(mx, wmax[w]);
    /* 2. the key of the K-th largest p by radix select, 8 bits a pass */
    unsigned prefix = 0, mask = 0;
    int rem = K; /* rank sought among the keys that match prefix on mask */
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (tid < 256) hist[tid] = 0;
        __syncthreads();
        for (int64_t i = tid; i < V; i += SM_THREADS) {
            const unsigned u = sm_key((logits[i] - mx) / T);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            int cum = 0, d = 255;
            for (; d > 0; d--) {
                if (cum + (int)hist[d] >= rem) break;
                cum += (int)hist[d];
            }
            s_prefix = prefix | ((unsigned)d << shift);
            s_rem = rem - cum;
        }
        __syncthreads();
        prefix = s_prefix;
        rem = s_rem;
        mask |= 255u << shift;
    }
    const unsigned thr = prefix; /* the K-th largest key; K - rem keys lie above it */
    const int need = rem, above = K - rem;
    /* 3. the candidates: every key above thr, then the need lowest-id ties
     * (threads take contiguous chunks, so their order is the id order) */
    const int64_t chunk = (V + SM_THREADS - 1) / SM_THREADS, lo = (int64_t)tid * chunk;
    const int64_t hi = lo + chunk < V ? lo + chunk : V;
    int na = 0, nt = 0;
    for (int64_t i = lo; i < hi; i++) {
        const unsigned u = sm_key((logits[i] - mx) / T);
        na += u > thr;
        nt += u == thr;
    }
    int tot_a, tot_t;
    int pa = sm_scan(na, ws, &tot_a);
    int pt = sm_scan(nt, ws, &tot_t);
    for (int i = tid; i < SPX_SAMPLE_MAX_K; i += SM_THREADS) {
        cp[i] = -INFINITY;
        cid[i] = 0x7fffffff;
    }
    __syncthreads();
    for (int64_t i = lo; i < hi; i++) {
        const float p = (logits[i] - mx) / T;
        const unsigned u = sm_key(p);
        if (u > thr) {
            cp[pa] = p;
            cid[pa] = (int)i;
            pa++;
        } else if (u == thr) {
            if (pt < need) {
                cp[above + pt] = p;
                cid[above + pt] = (int)i;
            }
            pt++;
        }
    }
    __syncthreads();
    /* 4. bitonic sort of the SPX_SAMPLE_MAX_K slots: p desc, then id asc */
    for (int k = 2; k <= SPX_SAMPLE_MAX_K; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < SPX_SAMPLE_MAX_K; i += SM_THREADS) {
                const int l = i ^ j;
                if (l > i) {
                    const bool before = cp[i] > cp[l] || (cp[i] == cp[l] && cid[i] < cid[l]); /* i first in order */
                    const bool up = (i & k) == 0;
                    if (up != before) {
                        const float tp = cp[i];
                        cp[i] = cp[l];
                        cp[l] = tp;
                        const int ti = cid[i];
                        cid[i] = cid[l];
                        cid[l] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
    /* 5. the draw, as engine/sampler.c */
    if (tid == 0) {
        int n = K;
        double sum = 0;
        for (int i = 0; i < n; i++) sum += (cp[i] = expf(cp[i]));
        const float top_p = sp->top_p;
        if (top_p > 0 && top_p < 1) {
            double cum = 0;
            int keep = n;
            for (int i = 0; i < n; i++) {
                cum += cp[i] / sum;
                if (cum >= top_p) {
                    keep = i + 1;
                    break;
                }
            }
            n = keep;
            sum = 0;
            for (int i = 0; i < n; i++) sum += cp[i];
        }
        unsigned long long st = sp->rng;
        const double r = (double)(sm_splitmix(&st) >> 11) * (1.0 / 9007199254740992.0) * sum;
        sp->rng = st;
        int id = cid[n - 1];
        double acc = 0;
        for (int i = 0; i < n; i++) {
            acc += cp[i];
            if (r < acc) {
                id = cid[i];
                break;
            }
        }
        step_publish(id, ids, pos, ring, &st);
    }
}

bool spx_sample_on_device(float temperature, int32_t top_k, int64_t vocab) {
    return temperature > 0 && top_k >= 2 && top_k <= SPX_SAMPLE_MAX_K && top_k < vocab && vocab < ((int64_t)1 << 31);
}

cudaError_t spx_sample_topk(const float *logits, int64_t vocab, spx_sample_dev *sp, int32_t *ids, int32_t *pos,
                            cudaStream_t st, bool pdl, unsigned long long *ring) {
    if (vocab <= 0) return cudaErrorInvalidValue;
    cudaError_t err =
        spx_launch(sample_topk_kernel, dim3(1), dim3(SM_THREADS), 0, st, pdl, logits, vocab, sp, ids, pos, ring);
    return err != cudaSuccess ? err : cudaGetLastError();
}
