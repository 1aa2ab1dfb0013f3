#!/bin/sh
# refine_fit.sh: calibration-free vs fitted weight refinement (paper eqs.
# 3-4, `spectra compress --refine --fit`) on one model, quality only.
#
#   sh bench/refine_fit.sh [OUT_DIR]
#
# The model's eval.txt is split at the first newline after its middle
# byte: the second half (FIT_TEXT, written to OUT_DIR/fit.txt) calibrates,
# the first windows of the whole file evaluate (`kl --llama-compat
# --chunks CHUNKS` reads tokens 0 .. CHUNKS*512 of eval.txt, which lie in
# its first half for docllama-58m: see the results file). For each width
# of BITS (default "4 3") it compresses once with the calibration-free
# .refine, then for each K of KS (default "8 32 128") fits a .refine at
# K (--fit-k K, FIT_TOKENS tokens in windows of FIT_CTX) against the same
# base (checked by the .refine's base checksums) and runs one `spectra
# kl` with the base, the unfitted and the fitted refinement at K.
# Writes OUT_DIR/{kl_B_K.txt, fit_B_K.log, table.md}; needs BIN.
set -u
OUT=${1:-/tmp/spx-refine-fit}
MODEL=${MODEL:-../shared/models/docllama-58m}
BIN=${BIN:-build/spectra}
BITS=${BITS:-4 3}
KS=${KS:-8 32 128}
CHUNKS=${CHUNKS:-4}
FIT_TOKENS=${FIT_TOKENS:-8192}
FIT_CTX=${FIT_CTX:-512}
THREADS=${THREADS:-2}
mkdir -p "$OUT" || exit 1
[ -x "$BIN" ] || { echo "refine_fit: $BIN not built (make)"; exit 1; }
python3 - "$MODEL/eval.txt" "$OUT/fit.txt" <<'PY' || exit 1
import sys
d = open(sys.argv[1], 'rb').read()
i = d.index(b'\n', len(d) // 2) + 1
open(sys.argv[2], 'wb').write(d[i:])
print("fit text: bytes %d..%d of %d" % (i, len(d), len(d)))
PY
{
    echo "# refine_fit.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit $(git log -1 --format=%h 2>/dev/null)$(git status --short 2>/dev/null | grep -q . && echo ' (plus uncommitted changes)')"
    echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
    echo "MODEL=$MODEL BITS='$BITS' KS='$KS' CHUNKS=$CHUNKS FIT_TOKENS=$FIT_TOKENS FIT_CTX=$FIT_CTX THREADS=$THREADS"
    echo
    echo "| resident | k | variant | PPL | mean KL | p99 KL | top-1 % | fit s |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
} > "$OUT/table.md"
for b in $BITS; do
    [ -f "$OUT/m$b.trdc" ] && [ -f "$OUT/m$b.refine" ] ||
        "$BIN" compress -m "$MODEL" -o "$OUT/m$b.trdc" --refine "$OUT/m$b.refine" --bits "$b" -q --threads "$THREADS" \
            2>> "$OUT/compress.log" || exit 1
    for k in $KS; do
        # the fit recompresses into a scratch model (the same deterministic base) and keeps only its .refine
        t0=$(date +%s.%N)
        "$BIN" compress -m "$MODEL" -o "$OUT/fitbase$b.trdc" --refine "$OUT/m${b}_fit$k.refine" --bits "$b" -q \
            --threads "$THREADS" --fit "$OUT/fit.txt" --fit-k "$k" --fit-tokens "$FIT_TOKENS" --fit-ctx "$FIT_CTX" \
            > "$OUT/fit_${b}_$k.log" 2>&1 || { cat "$OUT/fit_${b}_$k.log"; exit 1; }
        t1=$(date +%s.%N)
        cmp -s "$OUT/fitbase$b.trdc" "$OUT/m$b.trdc" || { echo "refine_fit: the fitted run's base differs from m$b.trdc"; exit 1; }
        "$BIN" kl --ref "$MODEL" -f "$MODEL/eval.txt" --llama-compat --chunks "$CHUNKS" --threads "$THREADS" \
            -m "$OUT/m$b.trdc" -m "$OUT/m$b.trdc" --refine "$OUT/m$b.refine" --refine-k "$k" \
            -m "$OUT/m$b.trdc" --refine "$OUT/m${b}_fit$k.refine" --refine-k "$k" \
            > "$OUT/kl_${b}_$k.txt" 2> "$OUT/kl_${b}_$k.err" || { cat "$OUT/kl_${b}_$k.err"; exit 1; }
        python3 - "$OUT/kl_${b}_$k.txt" "$b" "$k" "$(echo "$t1 - $t0" | bc)" "$OUT/fit_${b}_$k.log" <<'PY' >> "$OUT/table.md"
import sys, re
txt = open(sys.argv[1]).read()
b, k, fit_s = sys.argv[2], sys.argv[3], float(sys.argv[4])
log = open(sys.argv[5]).read()
m = re.search(r"([0-9.]+) s collecting, ([0-9.]+) s solving", log)
fit = "%.0f (collect %s, solve %s; incl. compress)" % (fit_s, m.group(1), m.group(2)) if m else "%.0f" % fit_s
rows = [l.split() for l in txt.splitlines() if l.startswith("/") or l.startswith(".")]
names = ["base", "unfitted", "fitted"]
for i, c in enumerate(rows[-3:]):
    ppl, kl, med, p99, top1 = c[-5:]
    print("| %s-bit | %s | %s | %s | %s | %s | %s | %s |" % (b, k, names[i], ppl, kl, p99, top1, fit if i == 2 else ""))
PY
    done
done
cat "$OUT/table.md"
