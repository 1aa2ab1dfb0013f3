/* hf_config.h: Hugging Face config.json for the Llama family.
 *
 * Accepts LlamaForCausalLM (Llama 2/3, rope_scaling llama3/linear),
 * Qwen2ForCausalLM (q/k/v bias), Qwen3ForCausalLM (per-head q/k RMSNorm,
 * head_dim != hidden/heads) and MistralForCausalLM, in both config styles:
 * transformers 5 (`rope_parameters`) and the older top-level `rope_theta` /
 * `rope_scaling`. Anything else is rejected with a message naming the
 * field. */
#ifndef SPX_HF_CONFIG_H
#define SPX_HF_CONFIG_H

#include "core/err.h"
#include <stdbool.h>
#include <stdint.h>

typedef enum spx_arch {
    SPX_ARCH_LLAMA = 0,
    SPX_ARCH_QWEN2 = 1,
    SPX_ARCH_QWEN3 = 2,
    SPX_ARCH_MISTRAL = 3
} spx_arch;

typedef enum spx_rope_type {
    SPX_ROPE_DEFAULT = 0,
    SPX_ROPE_LINEAR = 1,
    SPX_ROPE_LLAMA3 = 2
} spx_rope_type;

#define SPX_MAX_EOS 8
#define SPX_MAX_LAYERS 1024

typedef struct spx_config {
    spx_arch arch;
    char arch_name[64];        /* architectures[0] */
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t n_layers;
    int64_t n_heads;
    int64_t n_kv_heads;
    int64_t head_dim;
    int64_t max_pos;           /* max_position_embeddings */
    int64_t sliding_window;    /* 0: none */
    float rms_eps;
    /* RoPE */
    double rope_theta;
    spx_rope_type rope_type;
    double rope_factor;        /* linear / llama3 */
    double rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int64_t rope_orig_max_pos; /* llama3 original_max_position_embeddings */
    /* The checkpoint's declared dtype (`dtype` or `torch_dtype`): 32 for
     * float32/absent, 16 for float16, 'b' for bfloat16. transformers runs a
     * model in that dtype, which rounds the RoPE inv_freq buffer to it;
     * spx_rope_inv_freq() reproduces that (docs/numerics.md). */
    int source_dtype;
    /* structure */
    bool tie_embeddings;
    bool qkv_bias;             /* bias on q/k/v projections */
    bool o_bias;               /* bias on o_proj */
    bool mlp_bias;             /* bias on gate/up/down */
    bool qk_norm;              /* per-head RMSNorm of q and k (Qwen3) */
    /* special ids from config (-1: none) */
    int32_t bos_id;
    int32_t eos_ids[SPX_MAX_EOS];
    int32_t n_eos;
} spx_config;

/* Parses config.json text. label names the file in messages. */
spx_status spx_config_parse(const char *json, size_t len, const char *label,
                            spx_config *c, spx_err *e);
const char *spx_arch_name(spx_arch a);

#endif
