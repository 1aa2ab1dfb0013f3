#!/bin/sh
# refine_cpu.sh: weight refinement (StrataFlux-W) on this CPU, quality and
# speed in one run.
#
#   sh bench/refine_cpu.sh [OUT_DIR]
#
# Compresses MODEL (default ../shared/models/docllama-58m) at BITS (default
# "4 3 2") with --refine, then for each width:
#   quality: one `spectra kl --llama-compat` over CHUNKS windows (default 8)
#            of the model's eval.txt against the float reference, the base
#            and the base with refinement at each K of KS (default "8 32 128
#            1024"; channels per 1,024, every projection set), the residual
#            mapped in RAM (refined windows are fed one token a step, as
#            generation runs);
#   speed:   `spectra bench -p 0 -n NGEN -r 3` (tg, greedy, THREADS threads)
#            of the base and of each K, mapped and from disk behind CACHES
#            (default "8 32" MiB; skip on a miss), in ROUNDS (default 3)
#            interleaved rounds so that drift on the shared machine hits
#            every variant alike; the table gives each variant's median and
#            its ratio to the base's median of the same width.
# KL=0 skips the quality part (an earlier run's kl_*.txt files are kept).
# Writes OUT_DIR/{kl_BITS.txt, bench.jsonl, table.md}; needs build/spectra.
set -u
OUT=${1:-/tmp/spx-refine}
MODEL=${MODEL:-../shared/models/docllama-58m}
BIN=${BIN:-build/spectra}
BITS=${BITS:-4 3 2}
KS=${KS:-8 32 128 1024}
CACHES=${CACHES:-8 32}
CHUNKS=${CHUNKS:-8}
NGEN=${NGEN:-64}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
mkdir -p "$OUT" || exit 1
[ -x "$BIN" ] || { echo "refine_cpu: $BIN not built (make)"; exit 1; }
{
    echo "# refine_cpu.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit $(git log -1 --format=%h 2>/dev/null)$(git status --short 2>/dev/null | grep -q . && echo ' (plus uncommitted changes)')"
    echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
    echo "MODEL=$MODEL BITS='$BITS' KS='$KS' CACHES='$CACHES' CHUNKS=$CHUNKS NGEN=$NGEN ROUNDS=$ROUNDS THREADS=$THREADS"
} > "$OUT/table.md"
: > "$OUT/bench.jsonl"
for b in $BITS; do
    [ -f "$OUT/m$b.trdc" ] && [ -f "$OUT/m$b.refine" ] ||
        "$BIN" compress -m "$MODEL" -o "$OUT/m$b.trdc" --refine "$OUT/m$b.refine" --bits "$b" -q 2>> "$OUT/compress.log" || exit 1
    [ "${KL:-1}" = 0 ] && continue
    args="-m $OUT/m$b.trdc"
    for k in $KS; do args="$args -m $OUT/m$b.trdc --refine $OUT/m$b.refine --refine-k $k"; done
    "$BIN" kl --ref "$MODEL" -f "$MODEL/eval.txt" --llama-compat --chunks "$CHUNKS" --threads "$THREADS" $args \
        > "$OUT/kl_$b.txt" 2> "$OUT/kl_$b.err" || { cat "$OUT/kl_$b.err"; exit 1; }
done
for r in $(seq 1 "$ROUNDS"); do
    for b in $BITS; do
        "$BIN" bench -m "$OUT/m$b.trdc" --backend cpu -p 0 -n "$NGEN" -r 3 --threads "$THREADS" --json |
            sed "s/^{/{\"variant\": \"$b-bit base\", \"round\": $r, /" >> "$OUT/bench.jsonl"
        for k in $KS; do
            "$BIN" bench -m "$OUT/m$b.trdc" --refine "$OUT/m$b.refine" --refine-k "$k" -p 0 -n "$NGEN" -r 3 \
                --threads "$THREADS" --json | sed "s/^{/{\"variant\": \"$b-bit k $k ram\", \"round\": $r, /" >> "$OUT/bench.jsonl"
            for c in $CACHES; do
                "$BIN" bench -m "$OUT/m$b.trdc" --refine "$OUT/m$b.refine" --refine-k "$k" --refine-cache "$c" -p 0 \
                    -n "$NGEN" -r 3 --threads "$THREADS" --json |
                    sed "s/^{/{\"variant\": \"$b-bit k $k disk $c MiB\", \"round\": $r, /" >> "$OUT/bench.jsonl"
            done
        done
    done
done
python3 - "$OUT" <<'PY' >> "$OUT/table.md"
import json, sys, statistics, collections, re
out = sys.argv[1]
rows = [json.loads(l) for l in open(out + "/bench.jsonl")]
tg = collections.OrderedDict()
hit = {}
for r in rows:
    tg.setdefault(r["variant"], []).append(r["tg_tps_median"])
    rf = r.get("refine")
    if rf and rf.get("requests"):
        hit.setdefault(r["variant"], []).append(rf["hits"] / rf["requests"])
print("\n## decode speed (tg, tokens/s, median of rounds; ratio to the same width's base)\n")
print("| variant | rounds | median | ratio | cache hit rate |")
print("| --- | --- | --- | --- | --- |")
for v, xs in tg.items():
    b = v.split("-bit")[0]
    base = statistics.median(tg[b + "-bit base"])
    h = "%.3f" % statistics.median(hit[v]) if v in hit else "-"
    print("| %s | %s | %.1f | %.3f | %s |" % (v, " ".join("%.1f" % x for x in xs), statistics.median(xs),
                                         statistics.median(xs) / base, h))
import glob
print("\n## quality (kl --llama-compat against the float reference)\n")
for f in sorted(glob.glob(out + "/kl_*.txt")):
    print("```")
    print(open(f).read().strip())
    print("```")
PY
cat "$OUT/table.md"
