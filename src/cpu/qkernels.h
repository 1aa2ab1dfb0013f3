/* qkernels.h: CPU kernels for group-quantized matrices times activations
 * (W4A16 GEMV for one token, blocked GEMM for many), as a table of
 * function pointers chosen at run time from CPU features.
 *
 * Meaning (the scalar reference, spx_q_dot_row in quant/g32.c):
 *   y[t * y_stride + r] = sum_c W^[r, c] x[t * cols + c]      r in [r0, r1)
 * where W^ = (q - z) * s for dense codes, plus the fp16 outlier columns
 * (qtensor.h). A kernel never materialises a dequantized matrix.
 *
 * Use: once per matmul, prepare() turns x[T, cols] into the kernel's
 * activation format in `act` (act_bytes() bytes, malloc alignment; e.g.
 * int8 blocks with scales and per-block sums; 0 bytes when the kernel
 * reads x directly, then act may be NULL). Then rows() is called by each
 * thread on its own row range with the same prepared activations and the
 * same x. rows() may use `scratch` (scratch_bytes() bytes per thread; the
 * size depends on T). Results for a row do not depend on how the rows are
 * split. Entries may be NULL only where documented (none are, today).
 * Variants (avx2, later avx512/neon) live in their own files beside the
 * scalar one (qkernels.c; qkernels_avx2.c with attn_avx2.c); a variant may hand shapes it
 * has no fast path for (e.g. a group size) to the scalar table. The
 * activation format depends on the group size only, never on the code
 * width, so one prepare() serves matrices of every width. */
#ifndef SPX_QKERNELS_H
#define SPX_QKERNELS_H

#include "quant/qtensor.h"
#include <stddef.h>
#include <stdint.h>

typedef struct spx_qkernels {
    const char *name; /* "scalar", "avx2", ... */
    /* bytes of prepared activations for x[T, cols] with this group size */
    size_t (*act_bytes)(int64_t T, int64_t cols, int group);
    /* per-thread scratch bytes for rows() */
    size_t (*scratch_bytes)(int64_t T, int64_t cols, int group);
    /* x[T, cols] -> act. Called by one thread per matmul. */
    void (*prepare)(const float *x, int64_t T, int64_t cols, int group, void *act);
    /* rows [r0, r1) of y for all T tokens. x is the original float input
     * (for outlier columns / kernels that use floats directly). */
    void (*rows)(const spx_qtensor *q, const void *act, const float *x, int64_t T, float *y,
                 int64_t y_stride, int64_t r0, int64_t r1, void *scratch);
    /* The fp16 KV cache's attention steps (engine/kvcache.c) for G >= 1
     * query heads that share one KV head (GQA), over n rows of d halves,
     * row i at h + i * stride halves; head g's q at q + g qs, its scores
     * at out + g os (scores_f16), its probabilities at p + g ps and its
     * output at out + g os (wv_f16):
     *   scores_f16: out_g[i] = scale * (sum_j q_g[j] f16(row_i[j]));
     *   wv_f16: for every row i in order, out_g[j] += p_g[i] f16(row_i[j]).
     * Each head's numbers do not depend on G: the scalar table sums in
     * index order with separate roundings (the reference); a variant may
     * reorder, fuse and work on several rows and heads at a time (the
     * avx2 table: 8 scores per reduction, each row converted once for up
     * to 4 heads, the output held in registers across rows;
     * tests/test_kernels.c bounds it and checks the G independence). */
    void (*scores_f16)(const float *q, int64_t qs, int G, const uint16_t *h, int64_t stride, int64_t n, int64_t d,
                       float scale, float *out, int64_t os);
    void (*wv_f16)(float *out, int64_t os, const float *p, int64_t ps, int G, const uint16_t *h, int64_t stride,
                   int64_t n, int64_t d);
    /* The same for one group of 32 of the 4-bit cache (16 code bytes: code
     * k in the low nibble of byte k, code k + 16 in its high nibble), for
     * G >= 1 heads (head g's q at q + g qs, its output at o + g os):
     * dot_q4g: out[g] = sum_k (c_k q_k + c_(k+16) q_(k+16)) (the scalar
     * table adds each k's two products, then the pair), and axpy_q4g:
     * o_g[k] += a[g] (c_k - z), k < 32. A head's numbers do not depend on
     * G (the avx2 table widens the codes once for all of them). */
    void (*dot_q4g)(const float *q, int64_t qs, int G, const uint8_t *codes, float *out);
    void (*axpy_q4g)(float *o, int64_t os, const float *a, int G, int z, const uint8_t *codes);
    /* In-place softmax of the attention scores x[0..n): the scalar table's
     * is spx_cpu_softmax (expf per element, the sum in double); a variant
     * may use its own exp (the avx2 table: a polynomial within a few ulp,
     * 0 below expf's normal range; tests/test_kernels.c bounds it). */
    void (*softmax)(float *x, int64_t n);
} spx_qkernels;

/* Group sizes the int8-activation tables (avx2, avx512, amx) run fast:
 * whole 32-column blocks, at most 4 per group; others take the scalar
 * table. */
static inline int spx_qk_int8_group(int group) { return group == 32 || group == 64 || group == 128; }

/* The scalar reference table (always available). */
const spx_qkernels *spx_qkernels_scalar(void);
/* The best table for this CPU (cpuid at first call); environment variable
 * SPECTRA_KERNELS=scalar|avx2 (engine/tuning.h's record, as it is at the
 * first call) overrides (falls back to scalar with a warning if the CPU
 * lacks the named features). */
const spx_qkernels *spx_qkernels_best(void);
/* A named table if compiled in and supported by this CPU, else NULL. */
const spx_qkernels *spx_qkernels_get(const char *name);

#endif
