#!/bin/sh
# test_sass_ctrl: bench/gpu/sass_ctrl.py against a cubin of
# tests/cuda/sass_probe.cu (built by the Makefile when nvcc is present):
# the kernel is listed, its global load carries a write scoreboard that a
# later instruction waits on, the MMA and the exit are named, and bad input
# (a truncated cubin, an unknown kernel) fails with a message naming it.
dir=$(dirname "$0")
cubin="$dir/cuda/sass_probe.cubin"
tool="bench/gpu/sass_ctrl.py"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
n=0; fail=0
check() { # check DESCRIPTION COMMAND...
    what=$1; shift
    n=$((n+1))
    if "$@"; then :; else echo "FAIL: $what"; fail=$((fail+1)); fi
}
python3 "$tool" "$cubin" > "$tmp/list" 2> "$tmp/err"
check "listing exits 0" [ $? -eq 0 ]
check "listing names sass_probe with its loads per scoreboard" grep -Eq '^sass_probe +[0-9]+ instructions, global loads per scoreboard \{[0-5]: [0-9]+' "$tmp/list"
python3 "$tool" "$cubin" sass_probe > "$tmp/k" 2> "$tmp/err"
check "kernel report exits 0" [ $? -eq 0 ]
check "a global load with a write scoreboard" grep -Eq '^[0-9a-f]{5}  LDG   wb [0-5] ' "$tmp/k"
check "the MMA is named" grep -Eq '^[0-9a-f]{5}  IMMA ' "$tmp/k"
check "the exit is named" grep -Eq '^[0-9a-f]{5}  EXIT ' "$tmp/k"
sb=$(grep -Eo 'LDG   wb [0-5]' "$tmp/k" | head -n 1 | cut -c10)
check "an instruction waits on the load's scoreboard ($sb)" grep -Eq "wait \[[0-5]*$sb[0-5]*\]" "$tmp/k"
python3 "$tool" "$cubin" sass_probe --all > "$tmp/all"
check "--all lists every instruction (16 bytes each)" [ "$(wc -l < "$tmp/all")" -eq $(( $(python3 -c "import sys; sys.path.insert(0, 'bench/gpu'); import sass_ctrl as s; print(len(s.sections(sys.argv[1])['.text.sass_probe']))" "$cubin") / 16 )) ]
head -c 100 "$cubin" > "$tmp/short.cubin"
python3 "$tool" "$tmp/short.cubin" > /dev/null 2> "$tmp/err"
check "a truncated cubin exits 1" [ $? -eq 1 ]
check "and names the file" grep -q "short.cubin" "$tmp/err"
python3 "$tool" "$cubin" no_such_kernel > /dev/null 2> "$tmp/err"
check "an unknown kernel exits 1" [ $? -eq 1 ]
check "and lists the kernels" grep -q "sass_probe" "$tmp/err"
echo "test_sass_ctrl: $n checks, $fail failures"
[ $fail -eq 0 ]
