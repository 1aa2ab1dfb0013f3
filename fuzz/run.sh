#!/bin/sh
# fuzz/run.sh SHARED_DIR: builds and runs every libFuzzer target.
#
# Each fuzz/fuzz_NAME.c is linked against all of src/*/*.c (compiled once
# into build-fuzz/libspectra-fuzz.a with coverage, ASan and UBSan; UB is
# fatal) into build-fuzz/fuzz_NAME and run for FUZZ_TIME seconds (default
# 20) on build-fuzz/corpus_NAME/. The corpus is seeded at each run by
# fuzz/seeds_NAME.sh CORPUS_DIR SHARED_DIR when that script exists;
# fuzz/NAME.dict, when present, is passed as a libFuzzer dictionary.
# Crashing inputs land in build-fuzz/crashes_NAME/. Exits non-zero when a
# build fails or any target finds a crash, leak, timeout or out-of-memory.
#
# Environment: FUZZ_TIME (seconds per target), FUZZ_TARGETS (names to run,
# e.g. "safetensors trdc"; default all), CLANG (default clang),
# FUZZ_JOBS (parallel compiles, and targets fuzzing at once; default online
# CPUs), FUZZ_SRC (the source folders compiled for the targets; see below).
set -u
cd "$(dirname "$0")/.." || exit 1
shared=${1:-../shared}
case $shared in /*) ;; *) shared="$(pwd)/$shared" ;; esac
T=${FUZZ_TIME:-20}
CLANG=${CLANG:-clang}
OUT=build-fuzz
JOBS=${FUZZ_JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}

if ! command -v "$CLANG" >/dev/null 2>&1; then
    echo "fuzz: $CLANG not found; run 'make setup' (it installs clang and libclang-rt-dev)" >&2
    exit 1
fi

COMMON="-Iinclude -Isrc -D_GNU_SOURCE -std=c11 -g -O1 -fno-omit-frame-pointer"
SAN="address,undefined -fno-sanitize-recover=undefined"
LIBS="-lcjson -lpcre2-8 -lutf8proc -lz -lm -lpthread"

targets=""
for f in fuzz/fuzz_*.c; do
    [ -f "$f" ] || continue
    name=$(basename "$f" .c); name=${name#fuzz_}
    if [ -n "${FUZZ_TARGETS:-}" ]; then
        case " $FUZZ_TARGETS " in *" $name "*) ;; *) continue ;; esac
    fi
    targets="$targets $name"
done
if [ -z "$targets" ]; then
    echo "fuzz: no targets (fuzz/fuzz_*.c${FUZZ_TARGETS:+ matching '$FUZZ_TARGETS'})"
    exit 0
fi

# ---- library objects: the source folders the targets reach (FUZZ_SRC;
# the parsers and what they call: the engine, the CPU kernels and the
# refinement are never linked into a target, and compiling them with the
# fuzzer's instrumentation was a quarter of CI's time), once, in parallel.
# A target that comes to need another folder fails its link below, which
# fails this step: add the folder here.
SRC_DIRS=${FUZZ_SRC:-src/core src/format src/quant src/model src/chat}
mkdir -p "$OUT/obj"
echo "fuzz: compiling $SRC_DIRS with $CLANG ($JOBS jobs)"
for d in $SRC_DIRS; do ls "$d"/*.c; done | xargs -P "$JOBS" -I{} sh -c '
    o="$1/obj/$(echo "$2" | tr / _ | sed "s/\.c\$/.o/")"
    $3 $4 -fsanitize=fuzzer-no-link,$5 -c "$2" -o "$o" 2>"$o.err" ||
        { cat "$o.err" >&2; rm -f "$o"; exit 1; }
' sh "$OUT" {} "$CLANG" "$COMMON" "$SAN"
if [ $? -ne 0 ]; then
    echo "fuzz: FAILED to compile the library (see above)" >&2
    exit 1
fi
# An archive, as the Makefile links: a target pulls in only the objects it
# needs, so a module still being written elsewhere does not break its link.
lib="$OUT/libspectra-fuzz.a"
rm -f "$lib"
for s in $(for d in $SRC_DIRS; do ls "$d"/*.c; done); do
    ar rcs "$lib" "$OUT/obj/$(echo "$s" | tr / _ | sed 's/\.c$/.o/')" || exit 1
done

# One target: build, seed, fuzz for T seconds; its report (the lines to
# print) in $OUT/fuzz_NAME.report, its outcome (0 clean) in
# $OUT/fuzz_NAME.status.
one() {
    name=$1
    bin="$OUT/fuzz_$name"; rep="$OUT/fuzz_$name.report"
    echo 1 > "$OUT/fuzz_$name.status"
    # shellcheck disable=SC2086
    if ! $CLANG $COMMON -fsanitize=fuzzer,$SAN "fuzz/fuzz_$name.c" "$lib" -o "$bin" $LIBS >"$rep" 2>&1; then
        echo "[FAIL] fuzz_$name: build failed" >>"$rep"
        return
    fi
    corpus="$OUT/corpus_$name"; crashes="$OUT/crashes_$name"
    mkdir -p "$corpus" "$crashes"
    if [ -f "fuzz/seeds_$name.sh" ] && ! sh "fuzz/seeds_$name.sh" "$corpus" "$shared" >>"$rep" 2>&1; then
        echo "[FAIL] fuzz_$name: fuzz/seeds_$name.sh failed" >>"$rep"
        return
    fi
    dict=""
    [ -f "fuzz/$name.dict" ] && dict="-dict=fuzz/$name.dict"
    log="$OUT/fuzz_$name.log"
    # shellcheck disable=SC2086
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
        "$bin" -max_total_time="$T" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$crashes/" $dict "$corpus" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
    if [ $rc -eq 0 ]; then
        n=$(ls "$corpus" | wc -l)
        echo "[ ok ] fuzz_$name: ${execs:-?} runs in ${T}s (${rate:-?}/s), $cov, corpus $n files" >>"$rep"
        echo 0 > "$OUT/fuzz_$name.status"
    else
        {
            echo "[FAIL] fuzz_$name: exit $rc; crashing input in $crashes/, log $log"
            grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$log" | head -n 20
            tail -n 40 "$log"
        } >>"$rep"
    fi
}

# JOBS targets at a time (each fuzzes one process for T seconds, so a batch
# ends together), then the reports in name order
k=0
for name in $targets; do
    one "$name" &
    k=$((k + 1))
    [ $((k % JOBS)) -eq 0 ] && wait
done
wait
fail=0
for name in $targets; do
    if [ "$(cat "$OUT/fuzz_$name.status" 2>/dev/null)" = 0 ]; then
        cat "$OUT/fuzz_$name.report"
    else
        cat "$OUT/fuzz_$name.report" >&2
        fail=$((fail + 1))
    fi
done
[ $fail -eq 0 ] || { echo "fuzz: $fail target(s) failed" >&2; exit 1; }
echo "fuzz: all targets clean"
