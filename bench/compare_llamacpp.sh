#!/bin/sh
# Spectra vs llama.cpp on the same shapes, same machine, same run.
#
#   LLAMA_BENCH=/path/to/llama-bench  LLAMA_MODEL=/path/to/llama3-1b-q4_0.gguf \
#   SPECTRA_MODEL=/path/to/llama3-1b.trdc  sh bench/compare_llamacpp.sh [ROUNDS] [THREADS]
#
# llama.cpp is built by you outside this repository; the .gguf comes from
# ../shared/tools/make_random_gguf.py (--preset llama3-1b --type q4_0), the
# .trdc from `spectra synth --shape llama3-1b -o ...` (same shapes: 2048
# hidden, 8192 FFN, 16 layers, 32/8 heads, 128256 vocab, tied embeddings).
# The two programs alternate ROUNDS times (default 3), each measuring pp512
# (PROMPT=n: ppn) and tg128 with 3 repetitions (REPS); the table gives the medians over rounds and
# the ratios Spectra / llama.cpp. Also runs the bandwidth probe so decode
# can be stated as a fraction of what the machine moves.
set -eu
prompt=${PROMPT:-512}
reps=${REPS:-3}
rounds=${1:-3}
threads=${2:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
spx=${SPECTRA_BIN:-$here/build/spectra}
probe=${SPECTRA_PROBE:-$here/build/bench/bench_bandwidth}
: "${LLAMA_BENCH:?set LLAMA_BENCH to llama.cpp's llama-bench}"
: "${LLAMA_MODEL:?set LLAMA_MODEL to the .gguf}"
: "${SPECTRA_MODEL:?set SPECTRA_MODEL to the .trdc}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for r in $(seq 1 "$rounds"); do
    "$spx" bench -m "$SPECTRA_MODEL" -p "$prompt" -n 128 -r "$reps" --threads "$threads" --json > "$tmp/spx.$r.json"
    "$LLAMA_BENCH" -m "$LLAMA_MODEL" -t "$threads" -p "$prompt" -n 128 -r "$reps" -o json > "$tmp/llama.$r.json" 2>/dev/null
    echo "round $r/$rounds done" >&2
done
"$probe" --threads "$threads" --reps 10 --json > "$tmp/bw.json"

/usr/bin/env python3 - "$tmp" "$rounds" "$prompt" <<'PY'
import json, sys, statistics as st
tmp, rounds, prompt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spp, stg, lpp, ltg = [], [], [], []
for r in range(1, rounds + 1):
    s = json.load(open(f"{tmp}/spx.{r}.json"))
    spp.append(s["pp_tps_median"]); stg.append(s["tg_tps_median"])
    bpt = s["weight_bytes_per_token"]
    for e in json.load(open(f"{tmp}/llama.{r}.json")):
        if e.get("n_prompt", 0) > 0 and e.get("n_gen", 0) == 0: lpp.append(e["avg_ts"])
        if e.get("n_gen", 0) > 0 and e.get("n_prompt", 0) == 0: ltg.append(e["avg_ts"])
bw = json.load(open(f"{tmp}/bw.json"))["read_gbps_median"]
m = st.median
print(f"| test | Spectra tok/s (median of {rounds}) | llama.cpp tok/s | ratio |")
print("|---|---|---|---|")
print(f"| pp{prompt} | {m(spp):.2f} ({min(spp):.2f}..{max(spp):.2f}) | {m(lpp):.2f} ({min(lpp):.2f}..{max(lpp):.2f}) | {m(spp)/m(lpp):.2f}x |")
print(f"| tg128 | {m(stg):.2f} ({min(stg):.2f}..{max(stg):.2f}) | {m(ltg):.2f} ({min(ltg):.2f}..{max(ltg):.2f}) | {m(stg)/m(ltg):.2f}x |")
gbs = bpt * m(stg) / 1e9
print(f"\nSpectra decode reads {bpt/1e6:.1f} MB of weights per token: {gbs:.2f} GB/s = {100*gbs/bw:.0f}% of the probe's {bw:.2f} GB/s read bandwidth")
PY
