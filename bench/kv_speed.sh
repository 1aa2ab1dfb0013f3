#!/bin/sh
# bench/kv_speed.sh: prompt speed of ctx - GEN tokens, then decode speed of
# GEN tokens after them (bench -p P -d P: at that depth), for each KV setting,
# interleaved (round r runs every setting once before round r + 1, so a
# noisy machine hits all of them alike). One JSON line per run (bench
# --json plus the setting); take medians per (ctx, setting) over rounds.
# Usage: bench/kv_speed.sh [MODEL]   (env: BIN, CTXS, CONFIGS ("kv[:flags]"
# separated by ';'), ROUNDS, GEN, THREADS)
set -eu
M=${1:-../shared/models/docllama-long}
BIN=${BIN:-build/spectra}
CTXS=${CTXS:-"2048 8192"}
ROUNDS=${ROUNDS:-2}
GEN=${GEN:-64}
THREADS=${THREADS:-2}
CONFIGS=${CONFIGS:-"f16;q4;k2v2;k2v2:--kv-refine 4;k2v2:--kv-refine 4 --kv-refine-frac 0.03125;k3v3;k3v3:--kv-refine 4"}
r=0
while [ "$r" -lt "$ROUNDS" ]; do
    for ctx in $CTXS; do
        echo "$CONFIGS" | tr ';' '\n' | while IFS= read -r cfg; do
            kv=${cfg%%:*}
            flags=""
            [ "$kv" = "$cfg" ] || flags=${cfg#*:}
            # shellcheck disable=SC2086
            out=$("$BIN" bench -m "$M" -p $((ctx - GEN)) -d $((ctx - GEN)) -n "$GEN" -r 1 --threads "$THREADS" --backend cpu \
                  --kv "$kv" $flags --json 2>/dev/null)
            printf '{"round": %s, "ctx": %s, "kv": "%s", "flags": "%s", "bench": %s}\n' "$r" "$ctx" "$kv" "$flags" "$out"
        done
    done
    r=$((r + 1))
done
