#!/bin/sh
# Seeds for fuzz_safetensors: fuzz/seeds_safetensors.sh CORPUS_DIR SHARED_DIR
# The real stories260K checkpoint plus small hand-made files that reach
# every dtype, a scalar, an empty tensor, __metadata__ and padding.
set -e
corpus=$1; shared=$2
mkdir -p "$corpus"

# le64 N: N as 8 little-endian bytes
le64() {
    n=$1; i=0
    while [ $i -lt 8 ]; do
        printf "\\$(printf %03o $((n % 256)))"
        n=$((n / 256)); i=$((i + 1))
    done
}
# mk FILE JSON DATA_BYTES
mk() {
    hl=$(printf '%s' "$2" | wc -c)
    { le64 "$hl"; printf '%s' "$2"; head -c "$3" /dev/zero | tr '\000' '\077'; } > "$corpus/$1"
}

if [ -f "$shared/models/stories260K/model.safetensors" ]; then
    cp "$shared/models/stories260K/model.safetensors" "$corpus/seed_stories260K"
fi
mk seed_mixed '{"__metadata__":{"format":"pt"},"w.f32":{"dtype":"F32","shape":[3,5],"data_offsets":[0,60]},"w.f16":{"dtype":"F16","shape":[4,3],"data_offsets":[60,84]},"w.bf16":{"dtype":"BF16","shape":[2,7],"data_offsets":[84,112]},"s":{"dtype":"F32","shape":[],"data_offsets":[112,116]},"e":{"dtype":"F32","shape":[0,4],"data_offsets":[116,116]}}    ' 116
mk seed_ints '{"a":{"dtype":"I8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"U8","shape":[1,1],"data_offsets":[3,4]},"c":{"dtype":"BOOL","shape":[4],"data_offsets":[4,8]},"d":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},"e":{"dtype":"F64","shape":[1],"data_offsets":[16,24]},"f":{"dtype":"I32","shape":[1],"data_offsets":[24,28]},"g":{"dtype":"I16","shape":[2],"data_offsets":[28,32]}}' 32
mk seed_empty '{}' 0
mk seed_meta '{"__metadata__":{"format":"pt","k":"\u00e9\n"}}' 0
mk seed_unicode '{"w\u00e9\u4e2d":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]}, "v" : {"dtype":"F16","shape":[1],"data_offsets":[0,2]}}  ' 8
