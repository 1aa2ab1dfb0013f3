/* arch.h: an architecture as data.
 *
 * A model is embedding -> n_layers layers -> final norm -> LM head. A
 * layer is a token-mixing block (attention, short convolution, Mamba-2, or
 * none) and a feed-forward block (SwiGLU, ReLU^2, or none), each fed by
 * its own RMSNorm and added to the residual stream (cfg->mixer[l],
 * cfg->ffn[l]). Every tensor a layer can hold is a slot of this table;
 * which slots a layer has, their shapes, their names in each family's
 * checkpoints and the norm whose gain feeds each matrix are answered here
 * and nowhere else: loading, planning, upload, offload images, freeing,
 * `spectra plan` / `inspect` and the compressor's saliency loop over
 * slots. The forward passes name the slots they use (L->w[SPX_SL_Q]).
 *
 * Mixture of experts (SPX_FFN_MOE): the router is a small float32 tensor
 * [E, H] (routing stays exact); each expert slot is a stack of E matrices
 * (mat == 2, shape [E, rows, cols]) held as E spx_wmat in
 * spx_layer.xw[slot]; a shared expert, when the family has one, takes the
 * dense FFN slots. A family names an expert slot either per expert (a
 * "%lld" in the name: Qwen3-MoE's experts.E.gate_proj) or as one 3-D
 * stacked tensor (Granite's input_linear [E, 2I, H]), whose expert e a
 * .trdc stores quantized as the 2-D tensor "NAME.e" (spx_expert_tensor_name). */
#ifndef SPX_ARCH_H
#define SPX_ARCH_H

#include "format/hf_config.h"
#include <stddef.h>
#include <stdint.h>

typedef enum spx_slot {
    /* the norms that feed the two blocks */
    SPX_SL_MIX_NORM,
    SPX_SL_FFN_NORM,
    /* attention */
    SPX_SL_Q, SPX_SL_K, SPX_SL_V, SPX_SL_O,
    SPX_SL_Q_NORM, SPX_SL_K_NORM,   /* per-head RMSNorm gains [head_dim] (Qwen3, LFM2) */
    SPX_SL_BQ, SPX_SL_BK, SPX_SL_BV, SPX_SL_BO,
    /* short convolution (LFM2): in_proj -> B, C, x; conv over B*x; C * conv -> out_proj */
    SPX_SL_CONV_IN, SPX_SL_CONV_IN_B, SPX_SL_CONV_W, SPX_SL_CONV_B, SPX_SL_CONV_OUT, SPX_SL_CONV_OUT_B,
    /* Mamba-2: in_proj -> z, xBC, dt; conv + silu over xBC; SSD; gated norm; out_proj */
    SPX_SL_SSM_IN, SPX_SL_SSM_IN_B, SPX_SL_SSM_CONV_W, SPX_SL_SSM_CONV_B,
    SPX_SL_SSM_DT_BIAS, SPX_SL_SSM_A_LOG, SPX_SL_SSM_D, SPX_SL_SSM_NORM, SPX_SL_SSM_OUT, SPX_SL_SSM_OUT_B,
    /* feed-forward */
    SPX_SL_GATE, SPX_SL_UP, SPX_SL_GATE_UP, SPX_SL_DOWN,
    SPX_SL_B_GATE, SPX_SL_B_UP, SPX_SL_B_DOWN,
    /* mixture of experts: router [E, H]; expert stacks [E, rows, cols] */
    SPX_SL_ROUTER, SPX_SL_EXP_GATE, SPX_SL_EXP_UP, SPX_SL_EXP_GATE_UP, SPX_SL_EXP_DOWN,
    SPX_SL_COUNT
} spx_slot;

enum { SPX_BLOCK_MIXER = 0, SPX_BLOCK_FFN = 1 };

/* The refinement budget sets (StrataFlux-W, refine/rmat.h): a matrix's
 * selected channels per chunk come from its set's budget. A mixer's input
 * projections (q/k/v, short-conv and Mamba-2 in_proj) share one set and,
 * reading one input, one selection; so do gate/up. */
enum { SPX_RSET_QKV = 0, SPX_RSET_O = 1, SPX_RSET_GATE_UP = 2, SPX_RSET_DOWN = 3, SPX_RSET_COUNT = 4 };

typedef struct spx_slot_info {
    const char *key;  /* short name for plan / inspect ("q", "ssm_in") */
    uint8_t mat;      /* 1: a 2-D matrix [rows, cols] held as spx_wmat (quantizable);
                       * 2: a stack of n_experts such matrices [E, rows, cols] (spx_layer.xw);
                       * 0: a small tensor held as owned float32 (norms, biases, conv kernels, A_log, D, router) */
    uint8_t block;    /* SPX_BLOCK_MIXER or SPX_BLOCK_FFN */
    int8_t feed;      /* the norm slot whose gain multiplies this matrix's input, or -1 */
    int8_t rset;      /* matrices: the refinement budget set (SPX_RSET_*); vectors: -1 */
} spx_slot_info;

extern const spx_slot_info spx_slots[SPX_SL_COUNT];

/* The expected source shape of slot s in layer l: returns its number of
 * dimensions (1..3) and fills dims, or 0 when layer l has no such tensor.
 * Matrices are [rows, cols] = [out, in]; conv kernels [channels, 1, K]. */
int spx_slot_shape(const spx_config *c, int64_t l, spx_slot s, int64_t dims[3]);
/* Elements of slot s in layer l (0: absent). */
int64_t spx_slot_numel(const spx_config *c, int64_t l, spx_slot s);
/* The tensor name of slot s of layer l in this family's checkpoints (an
 * expert slot: its stacked tensor, or its per-expert pattern with "%lld"). */
void spx_slot_tensor_name(const spx_config *c, int64_t l, spx_slot s, char *buf, size_t cap);
/* Expert e of expert slot s in layer l: the 2-D tensor's name (the
 * family's per-expert name, or "STACKED.e" for a stacked family) into
 * buf; returns 1 when the family stores a stacked 3-D tensor (whose name
 * spx_slot_tensor_name gives), 0 when it names each expert. */
int spx_expert_tensor_name(const spx_config *c, int64_t l, spx_slot s, int64_t e, char *buf, size_t cap);
/* The layer slot a layer tensor's name belongs to (per-expert and
 * "STACKED.e" names included), or -1; *layer gets its layer. */
int spx_arch_tensor_slot(const spx_config *c, const char *tensor, int64_t *layer);

/* Names of the model-level tensors. */
const char *spx_arch_embed_name(const spx_config *c);
const char *spx_arch_final_norm_name(const spx_config *c);
const char *spx_arch_lm_head_name(const spx_config *c);

/* Mamba-2 widths: d_inner = heads * head_dim; conv channels (x, B, C) =
 * d_inner + 2 * groups * state; in_proj rows = d_inner (z) + conv + heads (dt). */
int64_t spx_ssm_d_inner(const spx_config *c);
int64_t spx_ssm_conv_dim(const spx_config *c);
int64_t spx_ssm_in_rows(const spx_config *c);

/* Over every layer: the widest recurrent in_proj output (short conv 3 H,
 * Mamba-2 spx_ssm_in_rows) and the Mamba-2 out_proj input (d_inner); 0
 * when no layer has one. Scratch sizing for every backend. */
int64_t spx_arch_max_proj(const spx_config *c);
int64_t spx_arch_max_d_inner(const spx_config *c);

/* Recurrent state floats of layer l (conv history + SSM state; 0 for
 * attention and FFN-only layers). */
int64_t spx_layer_state_floats(const spx_config *c, int64_t l);
/* "attn+swiglu", "conv+swiglu", "mamba2+swiglu", "relu2", ...: layer l's kinds. */
const char *spx_layer_kind_name(const spx_config *c, int64_t l, char *buf, size_t cap);

/* One line on the layer structure: counts per kind and, for up to 128
 * layers, the pattern (C short conv, * attention, M Mamba-2, - FFN only),
 * e.g. "4 layers: 2 conv+swiglu, 2 attn+swiglu; pattern C*C*". */
void spx_arch_layers_summary(const spx_config *c, char *buf, size_t cap);

/* Name of the normalization whose gain feeds layer tensor `tensor` (for
 * saliency), from the slot table; NULL when none does (gamma = 1) and for
 * model-level tensors (the compressor weighs the LM head by the final norm
 * itself, spx_arch_final_norm_name). */
const char *spx_arch_feeding_norm(const spx_config *cfg, const char *tensor, char *buf, size_t cap);

#endif
