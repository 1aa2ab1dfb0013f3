#!/bin/sh
# refine_neuron.sh: channel-wise against neuron-wise MLP refinement
# (StrataFlux-W, refine/bundle.h) on this CPU, quality and speed in one run.
#
#   sh bench/refine_neuron.sh [OUT_DIR]
#
# Compresses MODEL (default ../shared/models/docllama-58m) at BITS (default
# "4 3") with --refine --refine-bundles, then for each width:
#   quality: one `spectra kl --llama-compat` over CHUNKS windows (default 4)
#            of eval.txt against the float reference: the base, channel-wise
#            at each K of KS (every set at K) and neuron-wise at each pair of
#            PAIRS "K:KN" (q/k/v and o at K, the MLP by KN neurons per 1,024
#            from the bundles), residuals mapped in RAM;
#   speed:   `spectra bench -p 0 -n NGEN -r 3 --threads THREADS` of the
#            same variants in ROUNDS interleaved rounds; median tg per variant.
# Writes OUT_DIR/{kl_BITS.txt, bench.jsonl, table.md}; needs BIN.
set -u
OUT=${1:-/tmp/spx-refine-neuron}
MODEL=${MODEL:-../shared/models/docllama-58m}
BIN=${BIN:-build/spectra}
BITS=${BITS:-4 3}
PAIRS=${PAIRS:-32:24 128:96}
CHUNKS=${CHUNKS:-4}
NGEN=${NGEN:-128}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
mkdir -p "$OUT" || exit 1
[ -x "$BIN" ] || { echo "refine_neuron: $BIN not built (make)"; exit 1; }
{
    echo "# refine_neuron.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit $(git log -1 --format=%h 2>/dev/null)$(git status --short 2>/dev/null | grep -q . && echo ' (plus uncommitted changes)')"
    echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
    echo "MODEL=$MODEL BITS='$BITS' PAIRS='$PAIRS' CHUNKS=$CHUNKS NGEN=$NGEN ROUNDS=$ROUNDS THREADS=$THREADS"
} > "$OUT/table.md"
: > "$OUT/bench.jsonl"
# variant arguments, one per line: "label|args after -m M.trdc"
variants() {
    echo "base|"
    for p in $PAIRS; do echo "channel k $p|--refine $OUT/m$1.refine --refine-k ${p%%:*}" | sed 's/:[0-9]*|/|/'; done
    for p in $PAIRS; do echo "neuron k ${p%%:*} kn ${p##*:}|--refine $OUT/m$1.refine --refine-k ${p%%:*} --refine-mlp neuron --refine-kn ${p##*:}"; done
}
for b in $BITS; do
    [ -f "$OUT/m$b.trdc" ] && [ -f "$OUT/m$b.refine" ] ||
        "$BIN" compress -m "$MODEL" -o "$OUT/m$b.trdc" --refine "$OUT/m$b.refine" --refine-bundles --bits "$b" -q \
            --threads "$THREADS" 2>> "$OUT/compress.log" || exit 1
    [ "${KL:-1}" = 0 ] && continue
    args=$(variants "$b" | while IFS='|' read -r l a; do printf -- '-m %s %s ' "$OUT/m$b.trdc" "$a"; done)
    "$BIN" kl --ref "$MODEL" -f "$MODEL/eval.txt" --llama-compat --chunks "$CHUNKS" --threads "$THREADS" $args \
        > "$OUT/kl_$b.txt" 2> "$OUT/kl_$b.err" || { cat "$OUT/kl_$b.err"; exit 1; }
done
for r in $(seq 1 "$ROUNDS"); do
    for b in $BITS; do
        variants "$b" | while IFS='|' read -r l a; do
            "$BIN" bench -m "$OUT/m$b.trdc" --backend cpu $a -p 0 -n "$NGEN" -r 3 --threads "$THREADS" --json |
                sed "s/^{/{\"variant\": \"$b-bit $l\", \"round\": $r, /" >> "$OUT/bench.jsonl"
        done
    done
done
python3 - "$OUT" <<'PY' >> "$OUT/table.md"
import json, sys, statistics, collections
out = sys.argv[1]
tg = collections.OrderedDict()
bpt = {}
for l in open(out + "/bench.jsonl"):
    r = json.loads(l)
    tg.setdefault(r["variant"], []).append(r["tg_tps_median"])
    if r.get("refine"): bpt[r["variant"]] = r["refine"]["bytes_per_token"]
print("\n## decode speed (tg, tokens/s, median of rounds)\n")
print("| variant | rounds | median tok/s | ratio to base | refinement bytes/token |")
print("| --- | --- | --- | --- | --- |")
for v, xs in tg.items():
    base = statistics.median(tg[v.split(" ")[0] + " base"])
    m = statistics.median(xs)
    print(f"| {v} | {len(xs)} | {m:.1f} | {m / base:.3f} | {bpt.get(v, 0)} |")
PY
for b in $BITS; do [ -f "$OUT/kl_$b.txt" ] && { echo; echo "## kl, $b-bit"; echo; echo '```'; grep -v '^\[' "$OUT/kl_$b.txt"; echo '```'; }; done >> "$OUT/table.md"
