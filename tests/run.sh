#!/bin/sh
# Runs every test program of a build: tests/run.sh BUILD_DIR SHARED_DIR MODE
# MODE quick skips the tests listed in tests/slow.txt (they run in the full
# pass of the same `make check`), for the sanitizer build, and sets
# SPECTRA_TEST_QUICK (tests that honour it run fewer or smaller cases).
#
# TEST_JOBS programs run at a time (default: the online CPUs): most
# programs are single-threaded, and none depends on the machine being
# otherwise idle (their timing checks are loose). Each prints its [ ok ]
# line as it ends, so the lines come in the order the programs finish; the
# logs of the failed ones follow at the end. TEST_JOBS=1: one at a time,
# in name order.
build=$1; shared=$2; mode=${3:-full}
export SPECTRA_SHARED="$shared"
export SPECTRA_BIN="$(pwd)/$build/spectra"
# quick (the sanitizer pass): tests that honour it run fewer random cases
[ "$mode" = quick ] && export SPECTRA_TEST_QUICK=1
[ -d "$shared/models" ] || { echo "tests: fixtures not found at $shared (set SHARED=...)"; exit 1; }
TEST_JOBS=${TEST_JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)}
# the full pass starts the tests of tests/slow.txt first: the longest, so
# the programs after them fill the other queue and both end together
names=""; first=""
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    rm -f "$build/tests/$name.rc"
    if grep -qx "$name" tests/slow.txt 2>/dev/null; then
        if [ "$mode" = quick ]; then
            echo "[skip] $name (slow: runs in the non-sanitizer pass)"; continue
        fi
        [ "$TEST_JOBS" -gt 1 ] && { first="$first $name"; continue; }
    fi
    names="$names $name"
done
names="$first$names"
# one program: its output in NAME.log, its exit status in NAME.rc, one line
printf '%s\n' $names | xargs -P "$TEST_JOBS" -I{} sh -c '
    b=$1; name=$2; start=$(date +%s)
    "$b/tests/$name" > "$b/tests/$name.log" 2>&1
    rc=$?
    echo $rc > "$b/tests/$name.rc"
    if [ $rc -eq 0 ]; then
        echo "[ ok ] $name ($(( $(date +%s) - start ))s): $(tail -n 1 "$b/tests/$name.log")"
    else
        echo "[FAIL] $name ($(( $(date +%s) - start ))s)"
    fi
' sh "$build" {}
fail=0; n=0
for name in $names; do
    n=$((n+1))
    if [ "$(cat "$build/tests/$name.rc" 2>/dev/null)" != 0 ]; then
        echo "[FAIL] $name:"; sed 's/^/    /' "$build/tests/$name.log" | tail -n 40
        fail=$((fail+1))
    fi
done
echo "$build: $n test programs, $fail failed"
[ $fail -eq 0 ]
