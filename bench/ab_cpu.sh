#!/bin/sh
# Two Spectra builds on the same CPU, same model, interleaved rounds: the
# before/after check of a change (no regression means B/A within noise).
#
#   A=/path/to/old/spectra B=/path/to/new/spectra MODEL=model.trdc \
#   sh bench/ab_cpu.sh [ROUNDS] [THREADS]
#
# Each round runs `spectra bench -p PROMPT -n 128 -r REPS` (defaults 512
# and 3) with A then B; the table gives every round, the medians over
# rounds and the ratios B / A for pp and tg.
set -eu
rounds=${1:-3}
threads=${2:-2}
prompt=${PROMPT:-512}
reps=${REPS:-3}
: "${A:?set A to the first spectra binary}"
: "${B:?set B to the second spectra binary}"
: "${MODEL:?set MODEL to a .trdc}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
    for v in A B; do
        eval bin=\$$v
        "$bin" bench -m "$MODEL" --backend cpu -p "$prompt" -n 128 -r "$reps" --threads "$threads" --json > "$tmp/$v.$r.json"
    done
    echo "round $r/$rounds done" >&2
done
/usr/bin/env python3 - "$tmp" "$rounds" <<'PY'
import json, sys, statistics as st
tmp, rounds = sys.argv[1], int(sys.argv[2])
rows = {"A": [], "B": []}
for r in range(1, rounds + 1):
    for v in "AB":
        j = json.load(open(f"{tmp}/{v}.{r}.json"))
        rows[v].append((j["pp_tps_median"], j["tg_tps_median"]))
print("| round | A pp | B pp | A tg | B tg |")
print("| --- | --- | --- | --- | --- |")
for r in range(rounds):
    a, b = rows["A"][r], rows["B"][r]
    print(f"| {r + 1} | {a[0]:.2f} | {b[0]:.2f} | {a[1]:.2f} | {b[1]:.2f} |")
ma = [st.median(x[i] for x in rows["A"]) for i in (0, 1)]
mb = [st.median(x[i] for x in rows["B"]) for i in (0, 1)]
print(f"| median | {ma[0]:.2f} | {mb[0]:.2f} | {ma[1]:.2f} | {mb[1]:.2f} |")
ratio = lambda b, a: f"{b / a:.4f}" if a > 0 else "-"
print(f"\nB / A: pp {ratio(mb[0], ma[0])}, tg {ratio(mb[1], ma[1])}")
PY
