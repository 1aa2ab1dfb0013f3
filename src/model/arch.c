/* arch.c: the slot table, shapes and per-family tensor names (arch.h). */
#include "model/arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define M 1 /* matrix */
#define X 2 /* expert stack */
#define V 0 /* small tensor kept in float32 */
#define MIX SPX_BLOCK_MIXER
#define FFN SPX_BLOCK_FFN

const spx_slot_info spx_slots[SPX_SL_COUNT] = {
    [SPX_SL_MIX_NORM] = {"mix_norm", V, MIX, -1, -1},
    [SPX_SL_FFN_NORM] = {"ffn_norm", V, FFN, -1, -1},
    [SPX_SL_Q] = {"q", M, MIX, SPX_SL_MIX_NORM, SPX_RSET_QKV},
    [SPX_SL_K] = {"k", M, MIX, SPX_SL_MIX_NORM, SPX_RSET_QKV},
    [SPX_SL_V] = {"v", M, MIX, SPX_SL_MIX_NORM, SPX_RSET_QKV},
    [SPX_SL_O] = {"o", M, MIX, -1, SPX_RSET_O},
    [SPX_SL_Q_NORM] = {"q_norm", V, MIX, -1, -1},
    [SPX_SL_K_NORM] = {"k_norm", V, MIX, -1, -1},
    [SPX_SL_BQ] = {"bq", V, MIX, -1, -1},
    [SPX_SL_BK] = {"bk", V, MIX, -1, -1},
    [SPX_SL_BV] = {"bv", V, MIX, -1, -1},
    [SPX_SL_BO] = {"bo", V, MIX, -1, -1},
    [SPX_SL_CONV_IN] = {"conv_in", M, MIX, SPX_SL_MIX_NORM, SPX_RSET_QKV},
    [SPX_SL_CONV_IN_B] = {"conv_in_b", V, MIX, -1, -1},
    [SPX_SL_CONV_W] = {"conv_w", V, MIX, -1, -1},
    [SPX_SL_CONV_B] = {"conv_b", V, MIX, -1, -1},
    [SPX_SL_CONV_OUT] = {"conv_out", M, MIX, -1, SPX_RSET_O},
    [SPX_SL_CONV_OUT_B] = {"conv_out_b", V, MIX, -1, -1},
    [SPX_SL_SSM_IN] = {"ssm_in", M, MIX, SPX_SL_MIX_NORM, SPX_RSET_QKV},
    [SPX_SL_SSM_IN_B] = {"ssm_in_b", V, MIX, -1, -1},
    [SPX_SL_SSM_CONV_W] = {"ssm_conv_w", V, MIX, -1, -1},
    [SPX_SL_SSM_CONV_B] = {"ssm_conv_b", V, MIX, -1, -1},
    [SPX_SL_SSM_DT_BIAS] = {"ssm_dt_bias", V, MIX, -1, -1},
    [SPX_SL_SSM_A_LOG] = {"ssm_a_log", V, MIX, -1, -1},
    [SPX_SL_SSM_D] = {"ssm_d", V, MIX, -1, -1},
    [SPX_SL_SSM_NORM] = {"ssm_norm", V, MIX, -1, -1},
    /* the gated norm's gain scales out_proj's input */
    [SPX_SL_SSM_OUT] = {"ssm_out", M, MIX, SPX_SL_SSM_NORM, SPX_RSET_O},
    [SPX_SL_SSM_OUT_B] = {"ssm_out_b", V, MIX, -1, -1},
    [SPX_SL_GATE] = {"gate", M, FFN, SPX_SL_FFN_NORM, SPX_RSET_GATE_UP},
    [SPX_SL_UP] = {"up", M, FFN, SPX_SL_FFN_NORM, SPX_RSET_GATE_UP},
    [SPX_SL_GATE_UP] = {"gate_up", M, FFN, SPX_SL_FFN_NORM, SPX_RSET_GATE_UP},
    [SPX_SL_DOWN] = {"down", M, FFN, -1, SPX_RSET_DOWN},
    [SPX_SL_B_GATE] = {"b_gate", V, FFN, -1, -1},
    [SPX_SL_B_UP] = {"b_up", V, FFN, -1, -1},
    [SPX_SL_B_DOWN] = {"b_down", V, FFN, -1, -1},
    /* the router stays float32 (exact routing); expert stacks are not
     * refined (no budget set) */
    [SPX_SL_ROUTER] = {"router", V, FFN, -1, -1},
    [SPX_SL_EXP_GATE] = {"exp_gate", X, FFN, SPX_SL_FFN_NORM, -1},
    [SPX_SL_EXP_UP] = {"exp_up", X, FFN, SPX_SL_FFN_NORM, -1},
    [SPX_SL_EXP_GATE_UP] = {"exp_gate_up", X, FFN, SPX_SL_FFN_NORM, -1},
    [SPX_SL_EXP_DOWN] = {"exp_down", X, FFN, -1, -1},
};

/* ---- names per family ------------------------------------------------------ */

typedef struct {
    const char *layer_fmt; /* printf format of a layer's prefix */
    const char *embed, *final_norm, *lm_head;
    const char *slot[SPX_SL_COUNT];
} family_names;

#define LLAMA_ATTN                                                                                          \
    [SPX_SL_Q] = "self_attn.q_proj.weight", [SPX_SL_K] = "self_attn.k_proj.weight",                         \
    [SPX_SL_V] = "self_attn.v_proj.weight", [SPX_SL_O] = "self_attn.o_proj.weight",                         \
    [SPX_SL_BQ] = "self_attn.q_proj.bias", [SPX_SL_BK] = "self_attn.k_proj.bias",                           \
    [SPX_SL_BV] = "self_attn.v_proj.bias", [SPX_SL_BO] = "self_attn.o_proj.bias"

/* the norms, attention (with Qwen3's q/k norms) and dense MLP of the
 * Llama-style families */
#define LLAMA_LAYER                                                                                         \
    [SPX_SL_MIX_NORM] = "input_layernorm.weight", [SPX_SL_FFN_NORM] = "post_attention_layernorm.weight",    \
    LLAMA_ATTN, [SPX_SL_Q_NORM] = "self_attn.q_norm.weight", [SPX_SL_K_NORM] = "self_attn.k_norm.weight"
#define LLAMA_MLP                                                                                           \
    [SPX_SL_GATE] = "mlp.gate_proj.weight", [SPX_SL_UP] = "mlp.up_proj.weight",                             \
    [SPX_SL_DOWN] = "mlp.down_proj.weight"

static const family_names llama_names = {
    "model.layers.%lld.", "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    {
        LLAMA_LAYER,
        LLAMA_MLP,
        [SPX_SL_B_GATE] = "mlp.gate_proj.bias",
        [SPX_SL_B_UP] = "mlp.up_proj.bias",
        [SPX_SL_B_DOWN] = "mlp.down_proj.bias",
    },
};

static const family_names qwen3_moe_names = {
    "model.layers.%lld.", "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    {
        LLAMA_LAYER,
        LLAMA_MLP, /* the dense layers (mlp_only_layers) */
        [SPX_SL_ROUTER] = "mlp.gate.weight",
        [SPX_SL_EXP_GATE] = "mlp.experts.%lld.gate_proj.weight",
        [SPX_SL_EXP_UP] = "mlp.experts.%lld.up_proj.weight",
        [SPX_SL_EXP_DOWN] = "mlp.experts.%lld.down_proj.weight",
    },
};

static const family_names lfm2_names = {
    "model.layers.%lld.", "model.embed_tokens.weight", "model.embedding_norm.weight", "lm_head.weight",
    {
        [SPX_SL_MIX_NORM] = "operator_norm.weight",
        [SPX_SL_FFN_NORM] = "ffn_norm.weight",
        [SPX_SL_Q] = "self_attn.q_proj.weight",
        [SPX_SL_K] = "self_attn.k_proj.weight",
        [SPX_SL_V] = "self_attn.v_proj.weight",
        [SPX_SL_O] = "self_attn.out_proj.weight",
        [SPX_SL_Q_NORM] = "self_attn.q_layernorm.weight",
        [SPX_SL_K_NORM] = "self_attn.k_layernorm.weight",
        [SPX_SL_CONV_IN] = "conv.in_proj.weight",
        [SPX_SL_CONV_IN_B] = "conv.in_proj.bias",
        [SPX_SL_CONV_W] = "conv.conv.weight",
        [SPX_SL_CONV_B] = "conv.conv.bias",
        [SPX_SL_CONV_OUT] = "conv.out_proj.weight",
        [SPX_SL_CONV_OUT_B] = "conv.out_proj.bias",
        [SPX_SL_GATE] = "feed_forward.w1.weight",
        [SPX_SL_UP] = "feed_forward.w3.weight",
        [SPX_SL_DOWN] = "feed_forward.w2.weight",
    },
};

#define MAMBA2(p)                                                                                           \
    [SPX_SL_SSM_IN] = p "in_proj.weight", [SPX_SL_SSM_IN_B] = p "in_proj.bias",                             \
    [SPX_SL_SSM_CONV_W] = p "conv1d.weight", [SPX_SL_SSM_CONV_B] = p "conv1d.bias",                         \
    [SPX_SL_SSM_DT_BIAS] = p "dt_bias", [SPX_SL_SSM_A_LOG] = p "A_log", [SPX_SL_SSM_D] = p "D",             \
    [SPX_SL_SSM_NORM] = p "norm.weight", [SPX_SL_SSM_OUT] = p "out_proj.weight",                            \
    [SPX_SL_SSM_OUT_B] = p "out_proj.bias"

static const family_names granite4_names = {
    "model.layers.%lld.", "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    {
        [SPX_SL_MIX_NORM] = "input_layernorm.weight",
        [SPX_SL_FFN_NORM] = "post_attention_layernorm.weight",
        LLAMA_ATTN,
        MAMBA2("mamba."),
        [SPX_SL_GATE_UP] = "shared_mlp.input_linear.weight",
        [SPX_SL_DOWN] = "shared_mlp.output_linear.weight",
        [SPX_SL_ROUTER] = "block_sparse_moe.router.layer.weight",
        [SPX_SL_EXP_GATE_UP] = "block_sparse_moe.input_linear.weight",
        [SPX_SL_EXP_DOWN] = "block_sparse_moe.output_linear.weight",
    },
};

/* One block per layer, so its single norm feeds whichever block it has. */
static const family_names nemotron_h_names = {
    "backbone.layers.%lld.", "backbone.embeddings.weight", "backbone.norm_f.weight", "lm_head.weight",
    {
        [SPX_SL_MIX_NORM] = "norm.weight",
        [SPX_SL_FFN_NORM] = "norm.weight",
        [SPX_SL_Q] = "mixer.q_proj.weight",
        [SPX_SL_K] = "mixer.k_proj.weight",
        [SPX_SL_V] = "mixer.v_proj.weight",
        [SPX_SL_O] = "mixer.o_proj.weight",
        MAMBA2("mixer."),
        [SPX_SL_UP] = "mixer.up_proj.weight",
        [SPX_SL_DOWN] = "mixer.down_proj.weight",
        [SPX_SL_B_UP] = "mixer.up_proj.bias",
        [SPX_SL_B_DOWN] = "mixer.down_proj.bias",
    },
};

static const family_names *names_of(const spx_config *c) {
    switch (c->arch) {
    case SPX_ARCH_LFM2: return &lfm2_names;
    case SPX_ARCH_GRANITE4: return &granite4_names;
    case SPX_ARCH_NEMOTRON_H: return &nemotron_h_names;
    case SPX_ARCH_QWEN3_MOE: return &qwen3_moe_names;
    default: return &llama_names;
    }
}

const char *spx_arch_embed_name(const spx_config *c) { return names_of(c)->embed; }
const char *spx_arch_final_norm_name(const spx_config *c) { return names_of(c)->final_norm; }
const char *spx_arch_lm_head_name(const spx_config *c) { return names_of(c)->lm_head; }

void spx_slot_tensor_name(const spx_config *c, int64_t l, spx_slot s, char *buf, size_t cap) {
    const family_names *f = names_of(c);
    int n = snprintf(buf, cap, f->layer_fmt, (long long)l);
    if (n >= 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "%s", f->slot[s] ? f->slot[s] : "?");
}

int spx_expert_tensor_name(const spx_config *c, int64_t l, spx_slot s, int64_t e, char *buf, size_t cap) {
    const family_names *f = names_of(c);
    const char *pat = f->slot[s] ? f->slot[s] : "?";
    int n = snprintf(buf, cap, f->layer_fmt, (long long)l);
    if (n < 0 || (size_t)n >= cap) return 0;
    if (strstr(pat, "%lld")) {
        snprintf(buf + n, cap - (size_t)n, pat, (long long)e);
        return 0;
    }
    snprintf(buf + n, cap - (size_t)n, "%s.%lld", pat, (long long)e);
    return 1;
}

/* rest matches pattern pat, whose "%lld" (if any) stands for a number;
 * a pattern without one also matches "pat.NUMBER" when stack_ok */
static int name_matches(const char *rest, const char *pat, int stack_ok) {
    const char *pc = strstr(pat, "%lld");
    if (!pc) {
        size_t pl = strlen(pat);
        if (!strcmp(rest, pat)) return 1;
        if (!stack_ok || strncmp(rest, pat, pl) || rest[pl] != '.') return 0;
        const char *d = rest + pl + 1;
        if (!*d) return 0;
        while (*d >= '0' && *d <= '9') d++;
        return *d == 0;
    }
    size_t pre = (size_t)(pc - pat);
    if (strncmp(rest, pat, pre)) return 0;
    const char *d = rest + pre, *d0 = d;
    while (*d >= '0' && *d <= '9') d++;
    return d > d0 && !strcmp(d, pc + 4);
}

int spx_arch_tensor_slot(const spx_config *c, const char *tensor, int64_t *layer) {
    const family_names *f = names_of(c);
    const char *pct = strchr(f->layer_fmt, '%');
    size_t pl = (size_t)(pct - f->layer_fmt);
    if (strncmp(tensor, f->layer_fmt, pl)) return -1;
    const char *p = tensor + pl;
    char *end;
    long long l = strtoll(p, &end, 10);
    if (end == p || *end != '.' || l < 0 || l >= c->n_layers) return -1;
    for (int s = 0; s < SPX_SL_COUNT; s++) {
        int64_t d[3];
        if (!f->slot[s] || !name_matches(end + 1, f->slot[s], spx_slots[s].mat == X)) continue;
        if (!spx_slot_shape(c, l, (spx_slot)s, d)) continue;
        *layer = l;
        return s;
    }
    return -1;
}

/* ---- shapes -------------------------------------------------------------- */

int64_t spx_ssm_d_inner(const spx_config *c) { return c->ssm_heads * c->ssm_head_dim; }
int64_t spx_ssm_conv_dim(const spx_config *c) { return spx_ssm_d_inner(c) + 2 * c->ssm_groups * c->ssm_state; }
int64_t spx_ssm_in_rows(const spx_config *c) { return spx_ssm_d_inner(c) + spx_ssm_conv_dim(c) + c->ssm_heads; }

static int d1(int64_t dims[3], int64_t a) { dims[0] = a; return 1; }
static int d2(int64_t dims[3], int64_t a, int64_t b) { dims[0] = a, dims[1] = b; return 2; }
static int d3(int64_t dims[3], int64_t a, int64_t b, int64_t e) { dims[0] = a, dims[1] = b, dims[2] = e; return 3; }

int spx_slot_shape(const spx_config *c, int64_t l, spx_slot s, int64_t dims[3]) {
    const int mix = c->mixer[l], ffn = c->ffn[l];
    const int64_t H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    const int64_t qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    const int64_t di = spx_ssm_d_inner(c), cd = spx_ssm_conv_dim(c), nh = c->ssm_heads;
    const int attn = mix == SPX_MIX_ATTN, conv = mix == SPX_MIX_CONV, ssm = mix == SPX_MIX_MAMBA2;
    const int moe = ffn == SPX_FFN_MOE, E = (int)c->n_experts;
    const int64_t Ie = c->moe_intermediate;
    /* the dense FFN slots: a dense FFN, or a MoE layer's shared expert */
    const int swiglu = ffn == SPX_FFN_SWIGLU || (moe && c->moe_shared), anyffn = ffn == SPX_FFN_RELU2 || swiglu;
    switch (s) {
    case SPX_SL_MIX_NORM: return mix != SPX_MIX_NONE ? d1(dims, H) : 0;
    case SPX_SL_FFN_NORM: return ffn != SPX_FFN_NONE ? d1(dims, H) : 0;
    case SPX_SL_Q: return attn ? d2(dims, qd, H) : 0;
    case SPX_SL_K:
    case SPX_SL_V: return attn ? d2(dims, kvd, H) : 0;
    case SPX_SL_O: return attn ? d2(dims, H, qd) : 0;
    case SPX_SL_Q_NORM:
    case SPX_SL_K_NORM: return attn && c->qk_norm ? d1(dims, hd) : 0;
    case SPX_SL_BQ: return attn && c->qkv_bias ? d1(dims, qd) : 0;
    case SPX_SL_BK:
    case SPX_SL_BV: return attn && c->qkv_bias ? d1(dims, kvd) : 0;
    case SPX_SL_BO: return attn && c->o_bias ? d1(dims, H) : 0;
    case SPX_SL_CONV_IN: return conv ? d2(dims, 3 * H, H) : 0;
    case SPX_SL_CONV_IN_B: return conv && c->conv_bias ? d1(dims, 3 * H) : 0;
    case SPX_SL_CONV_W: return conv ? d3(dims, H, 1, c->conv_kernel) : 0;
    case SPX_SL_CONV_B: return conv && c->conv_bias ? d1(dims, H) : 0;
    case SPX_SL_CONV_OUT: return conv ? d2(dims, H, H) : 0;
    case SPX_SL_CONV_OUT_B: return conv && c->conv_bias ? d1(dims, H) : 0;
    case SPX_SL_SSM_IN: return ssm ? d2(dims, spx_ssm_in_rows(c), H) : 0;
    case SPX_SL_SSM_IN_B: return ssm && c->ssm_proj_bias ? d1(dims, spx_ssm_in_rows(c)) : 0;
    case SPX_SL_SSM_CONV_W: return ssm ? d3(dims, cd, 1, c->ssm_conv_kernel) : 0;
    case SPX_SL_SSM_CONV_B: return ssm && c->ssm_conv_bias ? d1(dims, cd) : 0;
    case SPX_SL_SSM_DT_BIAS:
    case SPX_SL_SSM_A_LOG:
    case SPX_SL_SSM_D: return ssm ? d1(dims, nh) : 0;
    case SPX_SL_SSM_NORM: return ssm ? d1(dims, di) : 0;
    case SPX_SL_SSM_OUT: return ssm ? d2(dims, H, di) : 0;
    case SPX_SL_SSM_OUT_B: return ssm && c->ssm_proj_bias ? d1(dims, H) : 0;
    case SPX_SL_GATE: return swiglu && !c->gate_up_fused ? d2(dims, I, H) : 0;
    case SPX_SL_UP: return anyffn && !c->gate_up_fused ? d2(dims, I, H) : 0;
    case SPX_SL_GATE_UP: return swiglu && c->gate_up_fused ? d2(dims, 2 * I, H) : 0;
    case SPX_SL_DOWN: return anyffn ? d2(dims, H, I) : 0;
    case SPX_SL_B_GATE: return swiglu && c->mlp_bias && !c->gate_up_fused ? d1(dims, I) : 0;
    case SPX_SL_B_UP: return anyffn && c->mlp_bias && !c->gate_up_fused ? d1(dims, I) : 0;
    case SPX_SL_B_DOWN: return anyffn && c->mlp_bias ? d1(dims, H) : 0;
    case SPX_SL_ROUTER: return moe ? d2(dims, E, H) : 0;
    case SPX_SL_EXP_GATE:
    case SPX_SL_EXP_UP: return moe && !c->gate_up_fused ? d3(dims, E, Ie, H) : 0;
    case SPX_SL_EXP_GATE_UP: return moe && c->gate_up_fused ? d3(dims, E, 2 * Ie, H) : 0;
    case SPX_SL_EXP_DOWN: return moe ? d3(dims, E, H, Ie) : 0;
    case SPX_SL_COUNT: break;
    }
    return 0;
}

int64_t spx_slot_numel(const spx_config *c, int64_t l, spx_slot s) {
    int64_t d[3];
    int nd = spx_slot_shape(c, l, s, d);
    int64_t n = nd ? 1 : 0;
    for (int i = 0; i < nd; i++) n *= d[i];
    return n;
}

int64_t spx_arch_max_proj(const spx_config *c) {
    int64_t w = 0;
    for (int64_t l = 0; l < c->n_layers; l++) {
        int64_t r = c->mixer[l] == SPX_MIX_CONV ? 3 * c->hidden_size : c->mixer[l] == SPX_MIX_MAMBA2 ? spx_ssm_in_rows(c) : 0;
        if (r > w) w = r;
    }
    return w;
}

int64_t spx_arch_max_d_inner(const spx_config *c) {
    for (int64_t l = 0; l < c->n_layers; l++)
        if (c->mixer[l] == SPX_MIX_MAMBA2) return spx_ssm_d_inner(c);
    return 0;
}

int64_t spx_layer_state_floats(const spx_config *c, int64_t l) {
    switch (c->mixer[l]) {
    case SPX_MIX_CONV: return c->hidden_size * (c->conv_kernel - 1);
    case SPX_MIX_MAMBA2:
        return spx_ssm_conv_dim(c) * (c->ssm_conv_kernel - 1) + c->ssm_heads * c->ssm_head_dim * c->ssm_state;
    default: return 0;
    }
}

const char *spx_layer_kind_name(const spx_config *c, int64_t l, char *buf, size_t cap) {
    static const char *mix[] = {"", "attn", "conv", "mamba2"}, *ffn[] = {"", "swiglu", "relu2", "moe"};
    const char *a = mix[c->mixer[l] & 3], *b = ffn[c->ffn[l] & 3];
    snprintf(buf, cap, "%s%s%s", a, *a && *b ? "+" : "", b);
    return buf;
}

const char *spx_arch_feeding_norm(const spx_config *cfg, const char *tensor, char *buf, size_t cap) {
    int64_t l;
    const int s = spx_arch_tensor_slot(cfg, tensor, &l);
    if (s < 0 || !spx_slots[s].mat || spx_slots[s].feed < 0) return NULL;
    spx_slot_tensor_name(cfg, l, (spx_slot)spx_slots[s].feed, buf, cap);
    return buf;
}

void spx_arch_layers_summary(const spx_config *c, char *buf, size_t cap) {
    char kinds[8][32];
    int64_t count[8] = {0};
    int nk = 0;
    size_t o = (size_t)snprintf(buf, cap, "%lld layers:", (long long)c->n_layers);
    for (int64_t l = 0; l < c->n_layers; l++) {
        char k[32];
        spx_layer_kind_name(c, l, k, sizeof k);
        int i = 0;
        while (i < nk && strcmp(kinds[i], k)) i++;
        if (i == nk && nk < 8) snprintf(kinds[nk++], sizeof kinds[0], "%s", k);
        if (i < 8) count[i]++;
    }
    for (int i = 0; i < nk && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s %lld %s", i ? "," : "", (long long)count[i], kinds[i]);
    if (c->n_layers > 128 || nk < 2 || o >= cap) return;
    o += (size_t)snprintf(buf + o, cap - o, "; pattern ");
    static const char sym[] = {'-', '*', 'C', 'M'};
    for (int64_t l = 0; l < c->n_layers && o + 1 < cap; l++) buf[o++] = sym[c->mixer[l] & 3];
    buf[o < cap ? o : cap - 1] = 0;
}
