/* hf_config.h: Hugging Face config.json of the supported architectures.
 *
 * Accepts LlamaForCausalLM (Llama 2/3, rope_scaling llama3/linear),
 * Qwen2ForCausalLM (q/k/v bias), Qwen3ForCausalLM (per-head q/k RMSNorm,
 * head_dim != hidden/heads), MistralForCausalLM, and the hybrids
 * Lfm2ForCausalLM (short convolutions and attention),
 * GraniteMoeHybridForCausalLM without routed experts (Mamba-2 and
 * attention) and NemotronHForCausalLM without MoE blocks (Mamba-2,
 * attention and MLP blocks), in both config styles: transformers 5
 * (`rope_parameters`, `layer_types`, `layers_block_type`) and the older
 * top-level `rope_theta` / `rope_scaling`, `full_attn_idxs`,
 * `hybrid_override_pattern`. Anything else is rejected with a message
 * naming the field.
 *
 * The per-layer structure is data: cfg->mixer[l] and cfg->ffn[l] name the
 * kinds of layer l's two blocks (model/arch.h turns them into tensor
 * slots). */
#ifndef SPX_HF_CONFIG_H
#define SPX_HF_CONFIG_H

#include "core/err.h"
#include <stdbool.h>
#include <stdint.h>

typedef enum spx_arch {
    SPX_ARCH_LLAMA = 0,
    SPX_ARCH_QWEN2 = 1,
    SPX_ARCH_QWEN3 = 2,
    SPX_ARCH_MISTRAL = 3,
    SPX_ARCH_LFM2 = 4,
    SPX_ARCH_GRANITE4 = 5,   /* GraniteMoeHybridForCausalLM */
    SPX_ARCH_NEMOTRON_H = 6,
    SPX_ARCH_QWEN3_MOE = 7   /* Qwen3MoeForCausalLM */
} spx_arch;

/* A layer is a token-mixing block then a feed-forward block, each
 * pre-normed with a residual add; either may be absent (a Nemotron-H layer
 * has exactly one). Values are stored in .trdc-independent config only. */
typedef enum spx_mixer_kind {
    SPX_MIX_NONE = 0,
    SPX_MIX_ATTN = 1,     /* causal GQA attention (KV cache) */
    SPX_MIX_CONV = 2,     /* LFM2 gated short convolution (conv state) */
    SPX_MIX_MAMBA2 = 3    /* Mamba-2 SSD mixer (conv state + SSM state) */
} spx_mixer_kind;

typedef enum spx_ffn_kind {
    SPX_FFN_NONE = 0,
    SPX_FFN_SWIGLU = 1,   /* down(silu(gate x) * up x) */
    SPX_FFN_RELU2 = 2,    /* down(relu(up x)^2) (Nemotron-H) */
    SPX_FFN_MOE = 3       /* routed SwiGLU experts (+ a shared SwiGLU expert when moe_shared) */
} spx_ffn_kind;

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
    bool rope;                 /* false: attention without positions (Nemotron-H, Granite "nope") */
    float attn_scale;          /* softmax scale of q.k (1/sqrt(head_dim) unless the config sets it) */
    /* Granite's multipliers (1 elsewhere): h = embed * embed_mult; each
     * block adds residual_mult * its output; logits are divided by
     * logits_div. */
    float embed_mult, residual_mult, logits_div;
    /* layers */
    uint8_t mixer[SPX_MAX_LAYERS];   /* spx_mixer_kind per layer */
    uint8_t ffn[SPX_MAX_LAYERS];     /* spx_ffn_kind per layer */
    int64_t n_attn_layers;     /* layers with an attention mixer (the KV cache's layers) */
    bool gate_up_fused;        /* one [2 I, H] gate-then-up matrix (Granite's input_linear; its experts too) */
    /* mixture of experts (SPX_FFN_MOE layers): n_experts SwiGLU experts of
     * width moe_intermediate, the moe_top_k of highest router logit per
     * token (router in float32), weighted by their softmax probabilities,
     * renormalised over the chosen when moe_norm_topk (Granite always:
     * softmax of the top-k logits); moe_shared: a shared expert of width
     * intermediate_size (the GATE/UP/GATE_UP/DOWN slots) added to every
     * token's output */
    int64_t n_experts, moe_top_k, moe_intermediate;
    bool moe_norm_topk, moe_shared;
    /* short convolution (LFM2) */
    int64_t conv_kernel;       /* conv_L_cache */
    bool conv_bias;            /* bias on conv, in_proj and out_proj */
    /* Mamba-2 */
    int64_t ssm_heads, ssm_head_dim, ssm_state, ssm_groups, ssm_conv_kernel, ssm_chunk;
    int64_t ssm_norm_group;    /* group size of the gated RMSNorm (d_inner / n_groups or d_inner) */
    bool ssm_conv_bias, ssm_proj_bias;
    float ssm_dt_lo, ssm_dt_hi;  /* clamp of softplus(dt + dt_bias) */
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
