#!/usr/bin/env python3
"""hybrid_ref.py: real-shape hybrid models for the CUDA backend's checks
against transformers, on the GPU machine (transformers 5 with the Lfm2,
GraniteMoeHybrid and NemotronH classes).

  hybrid_ref.py make SHAPE DIR   random weights of SHAPE's configuration
                                 (AutoModelForCausalLM.from_config), made a
                                 little more like trained ones (norm gains
                                 around 1 with a few 4x channels; 1 % of each
                                 projection's input channels scaled 8x),
                                 saved as a bf16 Hugging Face folder; then
                                 transformers' float32 logits of the bf16
                                 weights for IDS ids (DIR/ref_logits.f32,
                                 DIR/ref_ids.txt) and its own bf16 speed
                                 (DIR/hf_speed.json: pp512 = one 512-token
                                 forward, tg128 = generate 128 new tokens
                                 greedily with its cache)
  hybrid_ref.py compare DIR F32  KL(transformers || Spectra) per position
                                 (mean, median, max), top-1 agreement, max
                                 |logit diff|; Spectra's logits in F32
                                 (spectra logits -o F32 --ids DIR/ref_ids.txt)
SHAPE: lfm2-1.2b, granite4-micro, nemotronh-4b (the published models'
shapes as this file spells them; "-like": random weights)."""
import json
import sys
import time

import torch

IDS = 96


def shapes():
    lfm2_attn = {2, 5, 8, 10, 12, 14}
    granite_attn = {9, 17, 27, 35}
    nem = []
    for i in range(52):  # Mamba-2 and MLP alternating, 4 attention layers
        nem.append("mlp" if i % 2 else ("attention" if i in (12, 24, 36, 48) else "mamba"))
    return {
        "lfm2-1.2b": dict(model_type="lfm2", architectures=["Lfm2ForCausalLM"], vocab_size=65536, hidden_size=2048,
                          intermediate_size=12288, block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0,
                          block_multiple_of=256, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                          conv_L_cache=3, conv_bias=False, norm_eps=1e-5, max_position_embeddings=128000,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
                          layer_types=["full_attention" if i in lfm2_attn else "conv" for i in range(16)]),
        "granite4-micro": dict(model_type="granitemoehybrid", architectures=["GraniteMoeHybridForCausalLM"],
                               vocab_size=100352, hidden_size=2048, intermediate_size=8192,
                               shared_intermediate_size=8192, num_hidden_layers=40, num_attention_heads=32,
                               num_key_value_heads=8, num_local_experts=0, num_experts_per_tok=0,
                               mamba_n_heads=64, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, mamba_expand=2,
                               mamba_d_conv=4, mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False,
                               position_embedding_type="nope", attention_multiplier=0.0078125,
                               embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=8.0,
                               rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=True,
                               layer_types=["full_attention" if i in granite_attn else "linear_attention"
                                            for i in range(40)]),
        "nemotronh-4b": dict(model_type="nemotron_h", architectures=["NemotronHForCausalLM"], vocab_size=131072,
                             hidden_size=3072, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                             head_dim=128, mamba_num_heads=112, mamba_head_dim=64, ssm_state_size=128, n_groups=8,
                             conv_kernel=4, chunk_size=128, mlp_hidden_act="relu2", layer_norm_epsilon=1e-5,
                             max_position_embeddings=8192, tie_word_embeddings=False, use_conv_bias=True,
                             use_bias=False, mlp_bias=False, layers_block_type=nem, num_hidden_layers=52),
    }


def trained_like(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                v = 1 + 0.1 * torch.randn(p.shape, generator=g)
                hot = torch.randperm(p.shape[0], generator=g)[: max(1, p.shape[0] // 256)]
                v[hot] *= 4
                p.copy_(v.to(p.dtype))
            elif p.ndim == 2 and "embed" not in name and "lm_head" not in name:
                cols = torch.randperm(p.shape[1], generator=g)[: max(1, p.shape[1] // 100)]
                p[:, cols] *= 8


def make(shape, out):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = shapes()[shape]
    mt = cfg.pop("model_type")
    config = AutoConfig.for_model(mt, **cfg)
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    trained_like(model)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"{shape}: {n / 1e9:.3f} B parameters, made and saved in {time.time() - t0:.1f} s", flush=True)
    ids = torch.randint(0, config.vocab_size, (1, IDS), generator=torch.Generator().manual_seed(1)).cuda()
    with open(f"{out}/ref_ids.txt", "w") as f:
        f.write(",".join(str(int(i)) for i in ids[0]))
    # the reference: float32 arithmetic on the bf16 weights, eager attention
    ref = model.to(torch.float32)
    ref.config._attn_implementation = "eager"
    with torch.no_grad():
        logits = ref(ids).logits[0].float().cpu().numpy()
    logits.tofile(f"{out}/ref_logits.f32")
    # transformers' own bf16 speed
    m16 = ref.to(torch.bfloat16)
    m16.config._attn_implementation = "sdpa"
    speed = {}
    with torch.no_grad():
        p = torch.randint(0, config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(2)).cuda()
        m16(p)  # warm-up
        torch.cuda.synchronize()
        ts = []
        for _ in range(3):
            t = time.time()
            m16(p)
            torch.cuda.synchronize()
            ts.append(time.time() - t)
        speed["pp512"] = 512 / sorted(ts)[1]
        p1 = p[:, :1]
        m16.generate(p1, max_new_tokens=8, do_sample=False, min_new_tokens=8)
        torch.cuda.synchronize()
        ts = []
        for _ in range(3):
            t = time.time()
            m16.generate(p1, max_new_tokens=128, min_new_tokens=128, do_sample=False)
            torch.cuda.synchronize()
            ts.append(time.time() - t)
        speed["tg128"] = 128 / sorted(ts)[1]
    speed["note"] = "transformers %s bf16, sdpa attention, no mamba_ssm/causal_conv1d kernels unless installed" % (
        __import__("transformers").__version__)
    json.dump(speed, open(f"{out}/hf_speed.json", "w"))
    print(f"{shape}: transformers bf16 pp512 {speed['pp512']:.1f} tok/s, tg128 {speed['tg128']:.1f} tok/s", flush=True)


def compare(d, f32):
    import numpy as np
    ref = np.fromfile(f"{d}/ref_logits.f32", dtype=np.float32)
    got = np.fromfile(f32, dtype=np.float32)
    n = IDS
    ref = ref.reshape(n, -1).astype(np.float64)
    got = got.reshape(n, -1).astype(np.float64)

    def logsm(x):
        m = x.max(axis=1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))

    lp, lq = logsm(ref), logsm(got)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    top1 = (ref.argmax(axis=1) == got.argmax(axis=1)).mean()
    r = {"kl_mean": float(kl.mean()), "kl_median": float(np.median(kl)), "kl_max": float(kl.max()),
         "top1": float(top1), "max_abs": float(np.abs(ref - got).max()), "positions": n}
    print(json.dumps(r))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        print(__doc__)
        sys.exit(2)
