/* synth.h: synthetic models of real shapes for benchmarking without
 * downloads: a .trdc with random but valid codes, scales, zero points and
 * outlier columns, and on request a Hugging Face folder of random bf16
 * weights of the same shape (config.json + model.safetensors). */
#ifndef SPX_SYNTH_H
#define SPX_SYNTH_H

#include "core/err.h"
#include <stdint.h>

typedef struct spx_synth_shape {
    const char *name;
    const char *arch;       /* architectures[0] */
    int64_t hidden, inter, layers, heads, kv_heads, head_dim, vocab, max_pos;
    int tied, qkv_bias;
    double rope_theta;
    const char *rope_json;  /* rope_scaling object text or NULL */
    /* mixture of experts (experts 0: dense): every layer routes top_k of
     * `experts` SwiGLU experts of moe_inter, renormalised when norm_topk */
    int64_t experts, top_k, moe_inter;
    int norm_topk;
} spx_synth_shape;

/* NULL-terminated list of the known shapes. */
const spx_synth_shape *spx_synth_shapes(void);
const spx_synth_shape *spx_synth_find(const char *name);
/* config.json text for a shape (malloc'd). */
char *spx_synth_config_json(const spx_synth_shape *s);

/* bits: the codes' width, 4, 3 or 2 (bits 2 and 3 need every matrix's
 * cols % 128 == 0 and are stored row-major, as compress stores them).
 * row_major: 0 stores 4-bit matrices tiled (SPX_Q_TILED, as compress does
 * by default), 1 row-major. refine_path: NULL, or also a .refine of random
 * residuals for every layer matrix, bound to these codes (speed only: the
 * residual is noise, not the weights' error). tok_json / tok_cfg_json: a
 * tokenizer.json / tokenizer_config.json to carry (NULL: none), so that
 * text-in, text-out tools (serve, chat) run on the shape (random text). */
spx_status spx_synth_write_trdc(const spx_synth_shape *s, const char *path, int bits, double outlier_ratio,
                                uint64_t seed, int row_major, const char *refine_path, const char *tok_json,
                                const char *tok_cfg_json, spx_err *e);
/* dir is created if missing; writes config.json and model.safetensors. */
spx_status spx_synth_write_hf(const spx_synth_shape *s, const char *dir, uint64_t seed, spx_err *e);

#endif
