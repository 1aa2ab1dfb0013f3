#!/bin/sh
# run.sh: the CUDA backend's checks and benchmarks, in one go on the GPU
# machine (which has no compiler packages: everything is built here and
# carried in the git-ignored folder .dev/gpu).
#
#   sh bench/gpu/run.sh pack     here: build (BUILD, default build-cuda), fill $D
#                                with the binaries, libcjson/libutf8proc and
#                                the test models (.trdc of the fixtures)
#   sh bench/gpu/run.sh [quick]  there, from the repository root: checks
#                                (tests/cuda/test_cuda), GEMV vs copy
#                                bandwidth, then `spectra bench --backend cuda
#                                -p 512 -n 128` on synthetic Llama-3 1B and 8B
#                                .trdc files made there; a table at the end.
#                                quick: checks and GEMV only. e2e: the end-to-
#                                end part only, after a quick run in the same
#                                $OUT (its log is appended to, its GEMV rows
#                                are reused for the table).
# Logs and the table go to $OUT (the device tool's folder) or /tmp/spx-gpu.
# SPX_GPU_DIR (default .dev/gpu) names the staging folder, here and there.
set -u
D=${SPX_GPU_DIR:-.dev/gpu}
BUILD=${BUILD:-build-cuda}
SHARED=${SHARED:-../shared}
if [ "${1:-}" = pack ]; then
    make BUILD="$BUILD" all -j"$(nproc)" >/dev/null || exit 1
    mkdir -p $D/bin $D/lib $D/models
    cp "$BUILD"/spectra "$BUILD"/tests/cuda/test_cuda "$BUILD"/bench/gpu/bench_gemv $D/bin/ || exit 1
    cp -L /usr/lib/x86_64-linux-gnu/libcjson.so.1 /usr/lib/x86_64-linux-gnu/libutf8proc.so.2 $D/lib/ || exit 1
    for m in tiny-llama3 tiny-qwen2 tiny-qwen3 tiny-mistral docllama-58m; do
        [ -f $D/models/$m.trdc ] || "$BUILD"/spectra compress -m "$SHARED/models/$m" -o $D/models/$m.trdc || exit 1
    done
    cp "$SHARED/tools/make_random_gguf.py" $D/ || exit 1
    # the peer, built by you outside this repository (never committed):
    # LLAMA_BENCH=/path/to/llama-bench (a CUDA build for sm_90a) and
    # GGUF_PY=/path/to/llama.cpp/gguf-py travel in $D/peer
    if [ -n "${LLAMA_BENCH:-}" ]; then
        mkdir -p $D/peer
        cp "$LLAMA_BENCH" $D/peer/llama-bench && strip $D/peer/llama-bench || exit 1
        rm -rf $D/peer/gguf-py && mkdir -p $D/peer/gguf-py && cp -r "${GGUF_PY:?set GGUF_PY}/gguf" $D/peer/gguf-py/ || exit 1
    fi
    du -sh $D
    exit 0
fi

OUT=${OUT:-/tmp/spx-gpu}
T=/tmp/spx-gpu-work   # intermediates (the device tool brings back at most 8 files)
mkdir -p "$OUT" $T
export LD_LIBRARY_PATH="$PWD/$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$D/bin
MODE=${1:-full}
if [ "$MODE" = e2e ]; then exec 3>&1 >> "$OUT/log.txt" 2>&1; else exec 3>&1 > "$OUT/log.txt" 2>&1; fi
# everything below into log.txt; summaries also to the terminal (fd 3)
if [ "$MODE" != e2e ]; then
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv 2>&1 | tee /dev/fd/3

echo "== checks"
timeout 300 $B/test_cuda $D/models/*.trdc > "$OUT/test.log" 2>&1
echo "test_cuda exit $?" >> "$OUT/test.log"
{ grep -v '^FAIL' "$OUT/test.log" | tail -n 12; grep '^FAIL' "$OUT/test.log" | head -n 20; } | tee /dev/fd/3

echo "== text: docllama-58m greedy, cpu (scalar kernels) vs cuda" | tee /dev/fd/3
for be in cpu cuda; do
    SPECTRA_KERNELS=scalar timeout 60 $B/spectra run -m $D/models/docllama-58m.trdc --backend $be -p "The Linux kernel" \
        -n 48 --temp 0 -q > $T/run_$be.txt 2> $T/run_$be.err
done
if cmp -s $T/run_cpu.txt $T/run_cuda.txt; then echo "same text" | tee /dev/fd/3; else
    { echo "texts differ:"; cat $T/run_cpu.txt $T/run_cpu.err; echo; cat $T/run_cuda.txt $T/run_cuda.err; } | tee /dev/fd/3; fi

echo "== GEMV" | tee /dev/fd/3
timeout 120 $B/bench_gemv --json > "$OUT/gemv.jsonl" 2> $T/gemv.err || cat $T/gemv.err | tee /dev/fd/3
fi

if [ "$MODE" != quick ]; then
    echo "== end to end" | tee /dev/fd/3
    W=/tmp/spx-models
    mkdir -p $W
    : > "$OUT/bench.jsonl"
    for s in llama3-1b llama3-8b; do
        [ -f $W/$s.trdc ] || $B/spectra synth --shape $s -o $W/$s.trdc 2>&1 | tail -n 1
        timeout 240 $B/spectra bench -m $W/$s.trdc --backend cuda -p 512 -n 128 -r 5 --json >> "$OUT/bench.jsonl" 2> $T/bench_$s.err ||
            { echo "bench $s failed:"; cat $T/bench_$s.err; } | tee /dev/fd/3
    done
    # the same 8B decode without programmatic dependent launch, for comparison
    SPECTRA_CUDA_PDL=0 timeout 240 $B/spectra bench -m $W/llama3-8b.trdc --backend cuda -p 0 -n 128 -r 3 --json 2> $T/nopdl.err |
        sed 's/"model": "\([^"]*\)"/"model": "\1 (no PDL)"/' >> "$OUT/bench.jsonl"
    # llama.cpp CUDA on the same shapes, same run (Q4_0, all layers on the GPU)
    if [ -x $D/peer/llama-bench ]; then
        echo "== llama.cpp" | tee /dev/fd/3
        CUDA_LIBS=$(python3 -c 'import glob,os; print(":".join(sorted({os.path.dirname(p) for p in glob.glob("/usr/local/cuda*/lib64/libcublas.so*") + glob.glob("/opt/torch/.venv/lib/python3*/site-packages/nvidia/**/libcublas.so*", recursive=True)})))' 2>/dev/null)
        : > "$OUT/peer.jsonl"
        for s in llama3-1b llama3-8b; do
            [ -f $W/$s-q4_0.gguf ] || GGUF_PY=$D/peer/gguf-py python3 $D/make_random_gguf.py --preset $s --type q4_0 -o $W/$s-q4_0.gguf > $T/gguf_$s.log 2>&1 ||
                { echo "gguf $s failed:"; tail -n 5 $T/gguf_$s.log; } | tee /dev/fd/3
            LD_LIBRARY_PATH="$CUDA_LIBS:$LD_LIBRARY_PATH" timeout 300 $D/peer/llama-bench -m $W/$s-q4_0.gguf -ngl 99 -p 512 -n 128 -fa 0,1 -r 5 -o jsonl \
                >> "$OUT/peer.jsonl" 2> $T/peer_$s.err || { echo "llama-bench $s failed:"; tail -n 20 $T/peer_$s.err; } | tee /dev/fd/3
        done
    fi
fi
exec 1>&3

python3 - "$OUT" <<'EOF' | tee "$OUT/table.txt"
import json, sys, os
out = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(out, "gemv.jsonl")) if l.strip()]
copy = next((r["gbps"] for r in rows if r["what"] == "copy"), None)
print("copy bandwidth (device-to-device, read + write): %s GB/s" % (copy and "%.1f" % copy))
for r in rows:
    if r["what"] == "ffma_probe": print("FFMA probe: normal operand %.0f G/s, denormal operand %.0f G/s" % (r["normal_gflops"], r["denormal_gflops"]))
print("%-32s %4s %9s %9s %9s %8s" % ("GEMV", "impl", "MB", "us", "GB/s", "of copy"))
for r in rows:
    if r["what"] == "gemv":
        print("%-32s %4d %9.1f %9.2f %9.1f %7.1f%%" % (r["case"], r.get("impl", 0), r["bytes"] / 1e6, r["us"], r["gbps"], 100 * r["of_copy"]))
p = os.path.join(out, "bench.jsonl")
if os.path.exists(p):
    print()
    print("%-26s %10s %10s %12s %9s %8s" % ("model (cuda, kv f16)", "pp512 t/s", "tg128 t/s", "MB/token", "GB/s", "of copy"))
    for l in open(p):
        if not l.strip() or not l.startswith("{"): continue
        r = json.loads(l)
        frac = r["tg_gbps"] / copy if copy else float("nan")
        print("%-26s %10.1f %10.1f %12.1f %9.1f %7.1f%%" % (os.path.basename(r["model"]), r.get("pp_tps_median", 0), r["tg_tps_median"],
              r["weight_bytes_per_token"] / 1e6, r["tg_gbps"], 100 * frac))
p = os.path.join(out, "peer.jsonl")
if os.path.exists(p):
    print()
    print("%-26s %4s %6s %10s %10s" % ("llama.cpp (cuda, Q4_0)", "fa", "test", "t/s", "stdev"))
    for l in open(p):
        if not l.strip().startswith("{"): continue
        r = json.loads(l)
        test = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
        print("%-26s %4d %6s %10.1f %10.1f" % (os.path.basename(r["model_filename"]), r.get("flash_attn", 0), test, r["avg_ts"], r["stddev_ts"]))
EOF
