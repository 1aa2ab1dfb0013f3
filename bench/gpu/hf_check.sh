#!/bin/sh
# hf_check.sh: on the GPU machine, real shapes against transformers.
# For each shape: transformers builds a random bf16 model from its config
# (hf_reference.py) and computes float32 logits; Spectra's CPU reference
# runs the same HF folder; Spectra compresses it and runs the .trdc on the
# CPU and on CUDA. Prints max |d logit| (CPU ref vs transformers, CUDA vs CPU
# on the .trdc) and the quantized model's KL / top-1 against transformers.
# Then a short compute-sanitizer run of the CUDA backend.
#   SPX_GPU_DIR=.dev/gpu-gemv sh bench/gpu/hf_check.sh      (output in $OUT)
set -u
D=${SPX_GPU_DIR:-.dev/gpu}
OUT=${OUT:-/tmp/spx-hf}
T=/tmp/spx-hf-work
mkdir -p "$OUT" $T
export LD_LIBRARY_PATH="$PWD/$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$D/bin/spectra
log="$OUT/hf_check.txt"
: > "$log"
for shape in llama3.2-1b qwen2.5-1.5b; do
    m=$T/$shape
    python3 bench/gpu/hf_reference.py --shape $shape --out $m >> "$log" 2>&1 || { echo "$shape: transformers failed" >> "$log"; continue; }
    ids=$(cat $m/ids.txt)
    $B logits -m $m --ids "$ids" -o $T/ref_cpu.f32 --kv f32 --threads 16 >> "$log" 2>&1
    $B compress -m $m -o $T/$shape.trdc --threads 16 -q >> "$log" 2>&1
    $B logits -m $T/$shape.trdc --ids "$ids" -o $T/q_cpu.f32 --kv f32 --threads 16 >> "$log" 2>&1
    $B logits -m $T/$shape.trdc --ids "$ids" -o $T/q_cuda.f32 --backend cuda >> "$log" 2>&1
    python3 - $m/logits.f32 $T/ref_cpu.f32 $T/q_cpu.f32 $T/q_cuda.f32 $shape $m/logits_rope_bf16.f32 >> "$log" 2>&1 <<'PY'
import sys, numpy as np, torch
hf, ref, qc, qg, shape, hf_r = sys.argv[1:]
a = np.fromfile(hf, "<f4"); T = 32; a = a.reshape(T, -1)
def load(p):
    try: return np.fromfile(p, "<f4").reshape(T, -1)
    except Exception as e: return None
r, c, g = load(ref), load(qc), load(qg)
def kl(p, q):
    lp = torch.log_softmax(torch.tensor(p, dtype=torch.float64), -1); lq = torch.log_softmax(torch.tensor(q, dtype=torch.float64), -1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())
print(f"{shape}: logit range {a.min():.3f}..{a.max():.3f}")
if r is not None: print(f"  spectra CPU reference (bf16 HF folder) vs transformers: max |d| {np.abs(r-a).max():.3e}, top-1 {np.mean(r.argmax(1)==a.argmax(1))*100:.1f}%")
try: ar = np.fromfile(hf_r, "<f4").reshape(T, -1)
except Exception: ar = None
if r is not None and ar is not None: print(f"  spectra CPU reference vs transformers with inv_freq rounded to bf16: max |d| {np.abs(r-ar).max():.3e}")
if c is not None and g is not None: print(f"  .trdc CUDA vs .trdc CPU: max |d| {np.abs(g-c).max():.3e}, top-1 {np.mean(g.argmax(1)==c.argmax(1))*100:.1f}%")
for name, q in (("CPU", c), ("CUDA", g)):
    if q is not None: print(f"  .trdc ({name}) vs transformers: KL {kl(a, q):.5f}, rms(d)/std {np.sqrt(np.mean((q-a)**2))/a.std():.4f}, top-1 {np.mean(q.argmax(1)==a.argmax(1))*100:.1f}%")
PY
done
if command -v compute-sanitizer >/dev/null 2>&1; then
    timeout 200 compute-sanitizer --tool memcheck --leak-check full $B run -m $D/models/tiny-llama3.trdc --backend cuda \
        --ids 1,2,3,4,5,6,7,8 -n 8 --temp 0 -q > "$OUT/sanitizer.txt" 2>&1
    echo "compute-sanitizer exit $?" >> "$log"
    tail -3 "$OUT/sanitizer.txt" >> "$log"
else
    echo "compute-sanitizer not found" >> "$log"
fi
cat "$log"
