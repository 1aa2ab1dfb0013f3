#!/bin/sh
# Seeds for fuzz_trdc: fuzz/seeds_trdc.sh CORPUS_DIR [SHARED_DIR]
# Builds fuzz/fuzz_trdc.c as a small seed generator (-DSPX_TRDC_SEEDGEN,
# plain cc, linked with only the writer and core sources it needs) and runs
# it: valid .trdc files made by the real writer (manifest only; dense +
# quantized with outliers + tokenizer; bits 2/3 with groups 64/128 and
# F16/BF16; a version 2 file with a tiled matrix; a version 3 file with a
# partial 3-bit item beside a tiled matrix; a version 1 file with 3-bit
# nibbles, which the reader repacks). Works from any directory. If the
# generator cannot be built the corpus simply starts empty (a warning, not
# a failure): libFuzzer still finds its way from the format's magic.
set -u
corpus=${1:?usage: fuzz/seeds_trdc.sh CORPUS_DIR [SHARED_DIR]}
mkdir -p "$corpus" || exit 1
corpus=$(cd "$corpus" && pwd) || exit 1
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/seeds_trdc.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
CC=${SEED_CC:-cc}
if $CC -std=c11 -O1 -D_GNU_SOURCE -DSPX_TRDC_SEEDGEN -Iinclude -Isrc \
        fuzz/fuzz_trdc.c src/format/trdc.c src/format/trdc_common.c src/format/trdc_tuned.c src/format/trdc_write.c \
        src/quant/qpack.c \
        src/core/err.c src/core/util.c src/core/mapfile.c \
        -o "$tmp/seedgen" -lcjson -lz -lm 2>"$tmp/cc.log"; then
    "$tmp/seedgen" "$corpus" || { echo "seeds_trdc: generator failed" >&2; exit 1; }
else
    # a fuzzer started from an empty corpus would pass without reaching the
    # manifest parser: a failure, not a warning
    echo "seeds_trdc: could not build the seed generator" >&2
    sed 's/^/    /' "$tmp/cc.log" | head -n 20 >&2
    exit 1
fi
exit 0
