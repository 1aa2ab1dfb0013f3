#!/usr/bin/env python3
"""hf_reference.py: a random model of a real shape, built by transformers
from its config alone (no download), saved as an HF folder (bf16
safetensors), with transformers' own float32 logits for fixed ids.

    python3 bench/gpu/hf_reference.py --shape llama3.2-1b --out DIR

Writes DIR/config.json, DIR/model.safetensors, DIR/ids.txt and
DIR/logits.f32 ([T, vocab] float32, computed in float32 on the bf16
weights, eager attention, on the GPU when present). Run on the GPU machine,
where transformers and torch are installed."""
import argparse, os, torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

SHAPES = {
    "llama3.2-1b": lambda: LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        bos_token_id=128000, eos_token_id=128001),
    "qwen2.5-1.5b": lambda: Qwen2Config(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        bos_token_id=151643, eos_token_id=151645),
}

ap = argparse.ArgumentParser()
ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
ap.add_argument("--out", required=True)
ap.add_argument("--tokens", type=int, default=32)
a = ap.parse_args()
torch.manual_seed(0)
cfg = SHAPES[a.shape]()
cfg._attn_implementation = "eager"
model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
os.makedirs(a.out, exist_ok=True)
model.save_pretrained(a.out, safe_serialization=True)
dev = "cuda" if torch.cuda.is_available() else "cpu"
# Reload the saved folder as a user would (from_pretrained in bf16), then
# float32 math on the bf16 weights, as the fixtures' references. Whether
# RoPE's inv_freq ends up rounded to bf16 depends on how the model was
# made (from_config keeps it float32 in recent transformers): print it.
del model
model = AutoModelForCausalLM.from_pretrained(a.out, torch_dtype=torch.bfloat16, attn_implementation="eager")
inv = model.model.rotary_emb.inv_freq
print(f"{a.shape}: inv_freq {inv.dtype}, bf16-representable: {bool((inv.float() == inv.to(torch.bfloat16).float()).all())}")
model = model.to(dev).float()
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, cfg.vocab_size, (1, a.tokens), generator=g)
with torch.no_grad():
    logits = model(ids.to(dev)).logits[0].float().cpu()
logits.numpy().astype("<f4").tofile(os.path.join(a.out, "logits.f32"))
# the same with inv_freq rounded to bf16 (what a bf16 buffer would hold)
rot = model.model.rotary_emb
rot.inv_freq = rot.inv_freq.to(torch.bfloat16).float()
if hasattr(rot, "original_inv_freq"): rot.original_inv_freq = rot.inv_freq
with torch.no_grad():
    model(ids.to(dev)).logits[0].float().cpu().numpy().astype("<f4").tofile(os.path.join(a.out, "logits_rope_bf16.f32"))
open(os.path.join(a.out, "ids.txt"), "w").write(",".join(str(int(i)) for i in ids[0]))
print(f"{a.shape}: {sum(p.numel() for p in model.parameters())} params, logits {tuple(logits.shape)}")
