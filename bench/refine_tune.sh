#!/bin/sh
# refine_tune.sh: StrataFlux-W's tuner on this CPU (issue 20's evidence
# rows): for each resident width, `spectra tune` under each slowdown budget
# with the tier in RAM and on disk behind each cache size, then each tuned
# configuration's quality on held-out windows and its slowdown, measured
# again in one interleaved run.
#
#   sh bench/refine_tune.sh [OUT_DIR]
#
# Held-out split (explicit): MODEL's eval.txt cut into windows of CTX
# tokens (--llama-compat). Windows 0 .. CHUNKS-1 (default 8) are the
# evaluation; tuning uses TUNE_CHUNKS windows (default 2) starting at
# window CHUNKS (`spectra tune --skip CHUNKS`), so no tuning window is
# scored.
#
# Steps, for each width of BITS (default "4 3 2"):
#   1. compress MODEL with --refine (kept if OUT_DIR already has it);
#   2. for each tier of TIERS (default "ram 8 32": RAM, or from disk behind
#      an LRU cache of that many MiB, skip on a miss) and each budget of
#      BUDGETS (default "2.5 5 10", percent): spectra tune (TOKENS decoded
#      tokens per timing, TROUNDS rounds, THREADS threads); each run adds
#      its entry to the .refine for its platform key;
#   3. quality: one `spectra kl` per tier over the evaluation windows with
#      the base and each budget's tuned entry (--refine-tuned B%);
#   4. speed: ROUNDS (default 3) interleaved rounds of `spectra bench -p 0
#      -n NGEN -r 3` over the base and every tuned configuration of the
#      width; the table gives each one's median tokens/s and its slowdown
#      against the base's median of the same rounds.
# Writes OUT_DIR/{tune_*.json, tune_*.err, kl_*.json, bench.jsonl, table.md}.
# TUNE=0 skips step 2 (the entries already in the .refine files are used).
set -u
OUT=${1:-/tmp/spx-refine-tune}
MODEL=${MODEL:-../shared/models/docllama-58m}
BIN=${BIN:-build/spectra}
BITS=${BITS:-4 3 2}
BUDGETS=${BUDGETS:-2.5 5 10}
TIERS=${TIERS:-ram 8 32}
CTX=${CTX:-512}
CHUNKS=${CHUNKS:-8}
TUNE_CHUNKS=${TUNE_CHUNKS:-2}
TOKENS=${TOKENS:-64}
TROUNDS=${TROUNDS:-5}
NGEN=${NGEN:-64}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
TEXT=${TEXT:-$MODEL/eval.txt}
mkdir -p "$OUT" || exit 1
[ -x "$BIN" ] || { echo "refine_tune: $BIN not built (make)"; exit 1; }
start=$(date +%s)
tier_args() { [ "$1" = ram ] && echo "" || echo "--refine-cache $1"; }
tier_name() { [ "$1" = ram ] && echo "ram" || echo "disk $1 MiB"; }
{
    echo "# refine_tune.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit $(git log -1 --format=%h 2>/dev/null)$(git status --short 2>/dev/null | grep -q . && echo ' (plus uncommitted changes)')"
    echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "MODEL=$MODEL BITS='$BITS' BUDGETS='$BUDGETS' TIERS='$TIERS' CTX=$CTX CHUNKS=$CHUNKS TUNE_CHUNKS=$TUNE_CHUNKS"
    echo "TOKENS=$TOKENS TROUNDS=$TROUNDS NGEN=$NGEN ROUNDS=$ROUNDS THREADS=$THREADS"
    echo "evaluation: windows 0..$((CHUNKS - 1)) of $TEXT (ctx $CTX, llama-compat); tuning: windows $CHUNKS..$((CHUNKS + TUNE_CHUNKS - 1))"
} > "$OUT/table.md"
for b in $BITS; do
    [ -f "$OUT/m$b.trdc" ] && [ -f "$OUT/m$b.refine" ] ||
        "$BIN" compress -m "$MODEL" -o "$OUT/m$b.trdc" --refine "$OUT/m$b.refine" --bits "$b" -q \
            --threads "$THREADS" 2>> "$OUT/compress.log" || exit 1
    if [ "${TUNE:-1}" != 0 ]; then
        for t in $TIERS; do
            for p in $BUDGETS; do
                echo "refine_tune: tuning $b-bit, $(tier_name "$t"), $p% ($(( $(date +%s) - start )) s so far)" >&2
                "$BIN" tune -m "$OUT/m$b.trdc" --refine "$OUT/m$b.refine" --ref "$MODEL" -f "$TEXT" --llama-compat \
                    --ctx "$CTX" --chunks "$TUNE_CHUNKS" --skip "$CHUNKS" --budget "$p%" --tokens "$TOKENS" \
                    --rounds "$TROUNDS" --threads "$THREADS" $(tier_args "$t") --json \
                    > "$OUT/tune_${b}_${t}_$p.json" 2> "$OUT/tune_${b}_${t}_$p.err" ||
                    { cat "$OUT/tune_${b}_${t}_$p.err"; exit 1; }
            done
        done
    fi
    for t in $TIERS; do
        args=""
        [ "$t" = ram ] && args="-m $OUT/m$b.trdc"
        for p in $BUDGETS; do args="$args -m $OUT/m$b.trdc --refine $OUT/m$b.refine --refine-tuned $p% $(tier_args "$t")"; done
        echo "refine_tune: quality $b-bit, $(tier_name "$t") ($(( $(date +%s) - start )) s so far)" >&2
        "$BIN" kl --ref "$MODEL" -f "$TEXT" --llama-compat --ctx "$CTX" --chunks "$CHUNKS" --threads "$THREADS" $args \
            --json > "$OUT/kl_${b}_$t.json" 2> "$OUT/kl_${b}_$t.err" || { cat "$OUT/kl_${b}_$t.err"; exit 1; }
    done
done
: > "$OUT/bench.jsonl"
echo "refine_tune: speed, $ROUNDS rounds ($(( $(date +%s) - start )) s so far)" >&2
for r in $(seq 1 "$ROUNDS"); do
    for b in $BITS; do
        "$BIN" bench -m "$OUT/m$b.trdc" --backend cpu -p 0 -n "$NGEN" -r 3 --threads "$THREADS" --json |
            sed "s/^{/{\"bits\": $b, \"tier\": \"base\", \"budget\": 0, \"round\": $r, /" >> "$OUT/bench.jsonl"
        for t in $TIERS; do
            for p in $BUDGETS; do
                "$BIN" bench -m "$OUT/m$b.trdc" --refine "$OUT/m$b.refine" --refine-tuned "$p%" $(tier_args "$t") -p 0 \
                    -n "$NGEN" -r 3 --threads "$THREADS" --json 2>/dev/null |
                    sed "s/^{/{\"bits\": $b, \"tier\": \"$t\", \"budget\": $p, \"round\": $r, /" >> "$OUT/bench.jsonl"
            done
        done
    done
done
python3 - "$OUT" "$BITS" "$TIERS" "$BUDGETS" <<'PY' >> "$OUT/table.md"
import json, sys, statistics, os
out, bits, tiers, budgets = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
rows = [json.loads(l) for l in open(out + "/bench.jsonl")]
tps, ks, hit = {}, {}, {}
for r in rows:
    key = (str(r["bits"]), r["tier"], float(r["budget"]))
    tps.setdefault(key, []).append(r["tg_tps_median"])
    rf = r.get("refine")
    if rf:
        ks[key] = ",".join(str(k) for k in rf["k"])
        if rf.get("requests"): hit.setdefault(key, []).append(rf["hits"] / rf["requests"])
print("\n| resident | tier | budget | k (q/k/v,o,gate/up,down) | tune's slowdown | slowdown here | tg tokens/s | PPL | mean KL | p99 KL | top-1 % | hit rate |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for b in bits:
    base = statistics.median(tps[(b, "base", 0.0)])
    for t in tiers:
        kl = json.load(open("%s/kl_%s_%s.json" % (out, b, t)))
        models = kl["models"]
        i = 0
        if t == "ram":
            m = models[0]; i = 1
            print("| %s-bit | - | none | - | - | - | %.1f | %.3f | %.4f | %.3f | %.2f | - |" % (
                b, base, m["ppl"], m["kl_mean"], m["kl_p99"], 100 * m["top1"]))
        for p in budgets:
            m = models[i]; i += 1
            key = (b, t, float(p))
            tj = "%s/tune_%s_%s_%s.json" % (out, b, t, p)
            ts = "%.2f%%" % (100 * json.load(open(tj))["slowdown"]) if os.path.exists(tj) else "-"
            med = statistics.median(tps[key])
            h = "%.3f" % statistics.median(hit[key]) if key in hit else "-"
            print("| %s-bit | %s | %s%% | %s | %s | %.2f%% | %.1f | %.3f | %.4f | %.3f | %.2f | %s |" % (
                b, "ram" if t == "ram" else "disk %s MiB" % t, p, ks.get(key, "?"), ts, 100 * (base / med - 1), med,
                m["ppl"], m["kl_mean"], m["kl_p99"], 100 * m["top1"], h))
print("\nreference PPL %.4f over %d scored tokens (%d windows)" % (kl["ppl_ref"], kl["tokens_scored"], kl["chunks"]))
PY
echo "total $(( $(date +%s) - start )) s" >> "$OUT/table.md"
cat "$OUT/table.md"
