#!/bin/sh
# Seeds for fuzz_config: fuzz/seeds_config.sh CORPUS_DIR SHARED_DIR
# Every fixture's config.json (all supported families, both config
# styles where the fixtures have them), copied in under a stable name.
set -u
corpus=${1:?usage: fuzz/seeds_config.sh CORPUS_DIR SHARED_DIR}
shared=${2:-../shared}
mkdir -p "$corpus" || exit 1
for f in "$shared"/models/*/config.json; do
    [ -f "$f" ] || continue
    cp "$f" "$corpus/seed_$(basename "$(dirname "$f")").json" || exit 1
done
exit 0
