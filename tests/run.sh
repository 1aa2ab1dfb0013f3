#!/bin/sh
# Runs every test program of a build: tests/run.sh BUILD_DIR SHARED_DIR MODE
# MODE quick skips the tests listed in tests/slow.txt (they run in the full
# pass of the same `make check`), for the sanitizer build, and sets
# SPECTRA_TEST_QUICK (tests that honour it run fewer random cases).
build=$1; shared=$2; mode=${3:-full}
export SPECTRA_SHARED="$shared"
export SPECTRA_BIN="$(pwd)/$build/spectra"
# quick (the sanitizer pass): tests that honour it run fewer random cases
[ "$mode" = quick ] && export SPECTRA_TEST_QUICK=1
[ -d "$shared/models" ] || { echo "tests: fixtures not found at $shared (set SHARED=...)"; exit 1; }
fail=0; n=0
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    if [ "$mode" = quick ] && grep -qx "$name" tests/slow.txt 2>/dev/null; then
        echo "[skip] $name (slow: runs in the non-sanitizer pass)"; continue
    fi
    n=$((n+1))
    start=$(date +%s)
    if "$t" > "$build/tests/$name.log" 2>&1; then
        echo "[ ok ] $name ($(( $(date +%s) - start ))s): $(tail -n 1 "$build/tests/$name.log")"
    else
        echo "[FAIL] $name ($(( $(date +%s) - start ))s)"; sed 's/^/    /' "$build/tests/$name.log" | tail -n 40
        fail=$((fail+1))
    fi
done
echo "$build: $n test programs, $fail failed"
[ $fail -eq 0 ]
