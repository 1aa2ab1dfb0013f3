/* compress.h: the SPECTRA compressor: HF folder -> .trdc, no calibration.
 *
 * Tensor by tensor (bounded memory: one tensor's codes at a time, source
 * pages released after use), rows in parallel on the thread pool:
 *   - every 2-D float weight whose input dimension is a multiple of the
 *     group becomes group-quantized (projections, LM head, embedding);
 *   - saliency S_j = |gamma_j| * ||W[:, j]||_2 with gamma the gain of the
 *     norm feeding the projection (spx_arch_feeding_norm; 1 if none);
 *   - outlier channels by the kurtosis-adaptive ratio, a fixed ratio, or
 *     none; kept as fp16 columns;
 *   - everything else (norm gains, biases, odd shapes) kept as stored.
 * The output is written to a temporary name and renamed when complete. */
#ifndef SPX_COMPRESS_H
#define SPX_COMPRESS_H

#include "core/err.h"
#include <stdint.h>

/* Column importance for the MSE search (see compress.c). */
typedef enum spx_importance {
    SPX_IMP_NONE = 0,  /* unweighted squared error (default) */
    SPX_IMP_GAMMA = 1  /* weighted by the feeding norm's gain squared */
} spx_importance;

typedef struct spx_compress_opts {
    const char *src_dir;     /* HF folder */
    const char *out_path;    /* .trdc */
    int bits;                /* 2, 3, 4 */
    int group;               /* 32, 64, 128 */
    int outlier_mode;        /* spx_outlier_mode */
    double outlier_ratio;    /* for SPX_OUTLIERS_FIXED */
    int method;              /* spx_q_method */
    int importance;          /* spx_importance (mse only) */
    int magnitude;           /* mse: also weight by |w| (K-quant style) */
    int n_threads;           /* 0: all CPUs */
    int row_major;           /* 1: every matrix row-major (a version 1 .trdc); 0 (default): 4-bit G32
                              * matrices with cols % 128 == 0 tiled (SPX_Q_TILED, version 2) */
    const char *refine_path; /* NULL, or a .refine to write in the same pass: every quantized layer
                              * matrix's 4-bit residual (refine/refine.h; not the embedding or LM head) */
    int refine_bundles;      /* with refine_path: also each gated MLP layer's neuron bundles (refine/bundle.h) */
    const char *keep[8];     /* tensors whose name contains one of these stay at source precision */
    int n_keep;
    /* progress: called after each tensor (may be NULL) */
    void (*progress)(void *user, int64_t done, int64_t total, const char *name, uint64_t bytes_done,
                     uint64_t bytes_total);
    void *user;
} spx_compress_opts;

typedef struct spx_compress_stats {
    int64_t n_tensors, n_quant;
    int64_t params, params_quant;
    uint64_t source_bytes, out_bytes;
    int64_t n_outlier_cols;
    /* bytes stored for the quantized tensors, by component: codes, fp16
     * scales, zero points, outliers (indices and values); their sum over
     * params_quant is the quantized tensors' honest bits per weight */
    uint64_t quant_codes_bytes, quant_scales_bytes, quant_zeros_bytes, quant_outlier_bytes;
    int64_t n_refine;        /* residuals written to the .refine */
    uint64_t refine_bytes;   /* their bytes (codes and scales) */
    int64_t n_bundle_layers; /* layers whose neuron bundles were written */
    uint64_t bundle_bytes;   /* their bytes (bundles and shared scales) */
    double seconds;
} spx_compress_stats;

spx_status spx_compress(const spx_compress_opts *o, spx_compress_stats *stats, spx_err *e);

/* Rewrites a .trdc with its matrices in another layout, no recompression:
 * row_major 0 tiles every 4-bit G32 matrix the tiled layout can hold
 * (version 2 when one is), 1 makes every matrix row-major (version 1).
 * Dense tensors, codes, scales, zero points and outliers, the config,
 * tokenizer, settings and source facts are kept. The input's checksums
 * are verified first (a bad file is refused, not copied); the output is
 * written to a temporary name and renamed when complete. progress (may be
 * NULL): after each tensor. *n_changed: matrices whose layout changed. */
spx_status spx_relayout(const char *in_path, const char *out_path, int row_major,
                        void (*progress)(void *user, size_t done, size_t total, const char *name), void *user,
                        size_t *n_changed, spx_err *e);

#endif
