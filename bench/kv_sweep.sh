#!/bin/sh
# bench/kv_sweep.sh: StrataFlux-KV quality on a long-context model with the
# --score-last protocol (prefill all but the last N tokens of each window,
# then N decode steps scored): PPL and mean KL against the same model with
# fp16 KV, and the KV bytes per token, for every KV setting in CONFIGS at
# every context in CTXS. One JSON line per (context, setting) on stdout.
# Usage: bench/kv_sweep.sh [MODEL]   (env: BIN, CTXS, CONFIGS ("kv[:flags]"
# separated by ';'), SCORE_LAST, THREADS, WINDOWS_<ctx>)
set -eu
M=${1:-../shared/models/docllama-long}
BIN=${BIN:-build/spectra}
CTXS=${CTXS:-"2048 4096 8192"}
SCORE_LAST=${SCORE_LAST:-256}
THREADS=${THREADS:-2}
CONFIGS=${CONFIGS:-"f16;q4;k2v2;k2v2:--kv-refine 4;k2v2:--kv-refine 4 --kv-refine-frac 0.03125;k3v2;k3v2:--kv-refine 4;k3v2:--kv-refine 4 --kv-refine-frac 0.03125;k3v3;k3v3:--kv-refine 4;k3v3:--kv-refine 4 --kv-refine-frac 0.03125"}
for ctx in $CTXS; do
    eval "win=\${WINDOWS_$ctx:-}"
    [ -n "$win" ] || win=$(( 8192 / ctx ))
    echo "$CONFIGS" | tr ';' '\n' | while IFS= read -r cfg; do
        kv=${cfg%%:*}
        flags=""
        [ "$kv" = "$cfg" ] || flags=${cfg#*:}
        # shellcheck disable=SC2086
        out=$("$BIN" kl -m "$M" --ref "$M" --ref-kv f16 -f "$M/eval.txt" --ctx "$ctx" --chunks "$win" \
              --score-last "$SCORE_LAST" --threads "$THREADS" --kv "$kv" $flags --json 2>/tmp/kv_sweep.err)
        rec=$(grep "^models' kv" /tmp/kv_sweep.err | sed 's/^models. //' || true)
        printf '{"ctx": %s, "windows": %s, "kv": "%s", "flags": "%s", "record": "%s", "result": %s}\n' \
            "$ctx" "$win" "$kv" "$flags" "$rec" "$out"
    done
done
