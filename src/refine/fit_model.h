/* fit_model.h: a fitted .refine for a compressed model (`spectra compress
 * --refine OUT.refine --fit TEXT`; the math is fit.h's).
 *
 * What runs: the compressed model (its quantized weights, no refinement)
 * on the CPU over windows of the calibration text, each window a prompt
 * from a reset session ([BOS] + ctx - 1 text tokens, or ctx tokens for a
 * model without BOS). A causal model's prompt pass gives every position
 * the input x of the decode step at that position (the CPU kernels compute
 * each token's row alike; tests/test_refine_fit.c compares a prompt's
 * inputs with decode steps'), and runs far faster than one token a step. An observer in the CPU matmul (cpu/ops.h) adds each launch's x to
 * the statistics of that launch's input: q/k/v share one, gate/up one, o
 * and down one each (keyed by the launch's first matrix: the engine's
 * selection is per launch too, with that matrix's outlier channels
 * skipped). Then per input one factorization and per matrix the fitted C
 * against R = W - W^ (W from the source checkpoint, W^ the model's
 * matrix as the engine dequantizes it), quantized to the same 4-bit
 * columns and row scales as the calibration-free residual (refine.h), so
 * the runtime reads either file alike.
 *
 * The fit is for one budget per set (k channels per 1,024: fitted values
 * depend on k); the .refine's manifest records it, with the text, tokens
 * and lambda rule, under quantization.refine.fit (docs/trdc.md).
 *
 * Limits: every input's statistics are held at once (fit.h: 16 cols^2
 * bytes per input, e.g. 4 inputs a layer); the fit fails before running
 * when that plus one factor exceeds what /proc/meminfo reports available.
 * CPU only. */
#ifndef SPX_REFINE_FIT_MODEL_H
#define SPX_REFINE_FIT_MODEL_H

#include "core/err.h"
#include <stdint.h>

typedef struct spx_refine_fit_opts {
    const char *src_dir;     /* the Hugging Face folder the model was compressed from */
    const char *model_path;  /* the compressed model (.trdc) */
    const char *refine_path; /* the .refine to write (temporary name, renamed when complete) */
    const char *text_path;   /* calibration text (UTF-8) */
    int64_t ctx;             /* tokens per window, >= 2 and <= the model's context */
    int64_t tokens;          /* tokens wanted in all (whole windows; fewer if the text is shorter) */
    int64_t k[4];            /* channels per 1,024 for each SPX_RSET_*, each in [1, SPX_REFINE_CHUNK] */
    int n_threads;           /* 0: all CPUs */
    void (*progress)(void *user, const char *msg); /* may be NULL */
    void *user;
} spx_refine_fit_opts;

typedef struct spx_refine_fit_result {
    int64_t text_tokens;     /* the text's tokens */
    int64_t windows, tokens; /* fed */
    int64_t n_inputs, n_mats;
    uint64_t stats_bytes;    /* the statistics held */
    uint64_t refine_bytes;   /* codes and scales written */
    double collect_s, solve_s;
} spx_refine_fit_result;

spx_status spx_refine_fit_write(const spx_refine_fit_opts *o, spx_refine_fit_result *r, spx_err *e);

#endif
