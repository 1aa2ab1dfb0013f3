#!/bin/sh
# run.sh: the CUDA backend's checks and benchmarks, in one go on the GPU
# machine (which has no compiler packages: everything is built here and
# carried in a git-ignored folder, .dev/gpu by default).
#
#   sh bench/gpu/run.sh pack     here: build (BUILD, default build-cuda), fill $D
#                                with the binaries, libcjson/libutf8proc and
#                                the test models (.trdc of the fixtures;
#                                MODELS=0: none). LLAMA_BENCH=/path/llama-bench
#                                GGUF_PY=/path/llama.cpp/gguf-py: the peer
#                                (built by you outside this repository, never
#                                committed) travels xz-compressed in $D/peer.
#   sh bench/gpu/run.sh [full]   there, from the repository root: checks
#                                (tests/cuda/test_cuda on the fixtures, greedy
#                                text CPU vs CUDA, resident vs ping-pong), GEMV
#                                vs copy bandwidth, then end to end on
#                                synthetic Llama-3 1B and 8B .trdc files made
#                                there: pp512/tg128 with fp16 and 4-bit KV, a
#                                long context (pp8192), the 8B with
#                                --vram-budget 2048 (ping-pong, telemetry),
#                                and, when $D/peer exists, llama.cpp's
#                                llama-bench on Q4_0 GGUFs of the same shapes
#                                (../shared/tools/make_random_gguf.py). A
#                                table at the end.
#   sh bench/gpu/run.sh quick    checks and GEMV only.
#   sh bench/gpu/run.sh batch    checks, GEMV, then decode-sized products:
#                                bench_gemv --mtok, bench --parallel 2..16
#                                on synthetic 8B and 1B (PSHAPES, PARS,
#                                ROUNDS), speculation on docllama-58m
#                                (bench/spec_bench.sh) and the 8B shape.
#   sh bench/gpu/run.sh ab       checks, GEMV, then an A/B of decode settings:
#                                AB="VAR=a VAR=b ..." (one environment setting
#                                per variant, "-" for none), the 1B and 8B
#                                tg128 per variant, rounds interleaved (ROUNDS,
#                                default 3) so that drift hits all alike;
#                                AB_KV="f16 q4": each with these KV caches
#                                (default f16); a variant BIN=name runs
#                                $D/bin/name instead of spectra (another
#                                build, staged there by hand). GEMV_AB: the
#                                same for bench_gemv (BIN=name another
#                                bench_gemv), medians per case in the table.
#   sh bench/gpu/run.sh peer     checks, GEMV, then tg128 of Spectra and of
#                                llama.cpp (needs $D/peer) on the 1B and 8B
#                                shapes in ROUNDS (default 3) interleaved
#                                rounds, each of 3 repetitions: the table has
#                                every round and the ratio of the medians, so
#                                drift on the shared machine hits both alike.
#   sh bench/gpu/run.sh hybrid   checks, GEMV, then real-shape hybrids
#                                (HYBRID_SHAPES, default lfm2-1.2b
#                                granite4-micro nemotronh-4b) made by
#                                transformers there (bench/gpu/hybrid_ref.py),
#                                compressed, their CUDA and CPU logits against
#                                transformers' (KL, top-1; hybrid.jsonl),
#                                pp512/tg128 beside transformers' bf16 speed.
#                                AB_P=512 in ab mode: the bench's prompt too.
#   sh bench/gpu/run.sh ncu      no checks, no GEMV: the decode step's kernels
#                                one by one under Nsight Compute (8B, 3 tokens;
#                                NCU_KV=q4: the 4-bit KV cache), time per
#                                kernel name (ncu.txt).
#   sh bench/gpu/run.sh ncu-gemv bench_gemv's single launches of the tiled GEMV
#                                (KERNEL: a name regex) under ncu's speed-of-
#                                light, scheduler, warp-state, instruction,
#                                memory and occupancy sections (ncu_gemv.txt),
#                                and its SASS by cuobjdump (sass.txt; SASS_FUN:
#                                the mangled name).
#   sh bench/gpu/run.sh pack-serve   here: a staging folder for the serve mode ($D,
#                                default .dev/gpus): spectra, libmicrohttpd and its
#                                libraries, the Llama-3 tokenizer of ../shared,
#                                docllama-58m compressed.
#   sh bench/gpu/run.sh serve        (SPX_GPU_DIR=.dev/gpus) a synthetic SSHAPE (default
#                                llama3-8b) carrying that tokenizer, then
#                                bench/serve_load.py against spectra serve --backend
#                                cuda (SPAR sessions, default 16; SCLIENTS, SREQ, SMAX;
#                                SMEM=N: one more level of N requests for memory), and
#                                on docllama-58m.
#   sh bench/gpu/run.sh pack-refine  here: a staging folder of its own for the
#                                refine mode ($D, default .dev/gpur: the 64 MiB
#                                carry holds no more): spectra, test_cuda_refine,
#                                bench_refine (stripped), tiny-llama3 and
#                                docllama-58m compressed with --refine.
#   sh bench/gpu/run.sh refine   (SPX_GPU_DIR=.dev/gpur) test_cuda_refine on the
#                                two models, bench_refine (the kernels alone,
#                                host GB/s), then a synthetic RSHAPE (default
#                                llama3-8b) .trdc with a .refine of random
#                                residuals (spectra synth --refine): tg128 without and with refinement at
#                                each k of RKS (default "1 2 4 8 16 32") and
#                                RBLOCKS thread blocks (default 16), each fetch
#                                lag of RLAGS (blocks; default "0"), ROUNDS
#                                interleaved rounds; with DOCLLAMA_HF (a folder
#                                holding docllama-58m's HF files, carried
#                                separately) also its KL on eval.txt windows,
#                                refined on cpu and on cuda (kl.txt).
#   sh bench/gpu/run.sh pack-lowbit  here: a staging folder for the lowbit
#                                mode ($D, default .dev/gpul): spectra,
#                                test_cuda, test_cuda_lowbit (stripped) and
#                                fixtures compressed at 3 and 2 bits.
#   sh bench/gpu/run.sh lowbit   (SPX_GPU_DIR=.dev/gpul) test_cuda_lowbit, test_cuda
#                                end to end on those fixtures, greedy text cpu vs
#                                cuda, then synthetic LSHAPES (default llama3-8b)
#                                at each width of LBITS (default "4 3 2"): tg128
#                                in ROUNDS interleaved rounds, and the weight bytes
#                                read per token over the time (lowbit.txt).
#   sh bench/gpu/run.sh pack-kv  here: a staging folder for the kv mode ($D,
#                                default .dev/gpuk): spectra, test_cuda_kvlow
#                                (stripped) and tiny-llama3, docllama-58m .trdc.
#   sh bench/gpu/run.sh kv       (SPX_GPU_DIR=.dev/gpuk) test_cuda_kvlow on those
#                                models, then the synthetic KSHAPE (default
#                                llama3-8b) decode (tg KN tokens, default 64) at
#                                each depth of KDEPTHS (default "8192 32768
#                                131072"; spectra bench -d --seek: no prefill) for each
#                                KV setting of KSETS (';'-separated, default f16;
#                                q4; k2v2; k2v2 --kv-refine 4; the same at frac
#                                1/32; k3v3 --kv-refine 4), settings interleaved
#                                in ROUNDS rounds (default 3): medians and the
#                                ratio to f16 at each depth (kv.txt). KSEEK=
#                                (empty): prefill each depth for real instead.
# CHECKS=0 skips the checks (a staging folder without models).
# Logs and the table go to $OUT (the device tool's folder) or /tmp/spx-gpu.
# SPX_GPU_DIR (default .dev/gpu) names the staging folder, here and there.
set -u
D=${SPX_GPU_DIR:-.dev/gpu}
BUILD=${BUILD:-build-cuda}
SHARED=${SHARED:-../shared}
# the build, then the named binaries (stripped) and the libraries the device lacks into $D
pack_bins() {
    make BUILD="$BUILD" all -j"$(nproc)" >/dev/null || exit 1
    mkdir -p $D/bin $D/lib $D/models
    for b in "$@"; do cp "$BUILD/$b" $D/bin/ || exit 1; done
    strip $D/bin/* || exit 1
    cp -L /usr/lib/x86_64-linux-gnu/libcjson.so.1 /usr/lib/x86_64-linux-gnu/libutf8proc.so.2 $D/lib/ || exit 1
}
if [ "${1:-}" = pack-refine ]; then
    D=${SPX_GPU_DIR:-.dev/gpur}
    pack_bins spectra tests/cuda/test_cuda_refine bench/gpu/bench_refine
    for m in tiny-llama3 docllama-58m; do
        [ $D/models/$m.refine -nt "$BUILD"/spectra ] ||
            "$BUILD"/spectra compress -m "$SHARED/models/$m" -o $D/models/$m.trdc --refine $D/models/$m.refine -q || exit 1
    done
    cp "$SHARED/models/docllama-58m/eval.txt" $D/models/ || exit 1
    git log -1 --format='commit %h %cd' > $D/commit 2>/dev/null; git status --short | grep -q . && echo "(plus uncommitted changes)" >> $D/commit
    du -sh $D
    exit 0
fi

if [ "${1:-}" = pack-serve ]; then
    D=${SPX_GPU_DIR:-.dev/gpus}
    rm -rf $D/bin
    pack_bins spectra
    # libmicrohttpd and what it links (the GPU machine has no -dev packages), libc's own family excepted
    for l in /usr/lib/x86_64-linux-gnu/libmicrohttpd.so.12 $(ldd /usr/lib/x86_64-linux-gnu/libmicrohttpd.so.12 |
        awk '$3 ~ /^\// && $1 !~ /^(libc|libm|libpthread|libdl|librt|ld-linux)/ {print $3}'); do
        cp -L "$l" $D/lib/ || exit 1
    done
    mkdir -p $D/tok && cp "$SHARED/tokenizers/llama3/tokenizer_config.json" $D/tok/ &&
        xz -T2 -6 -c "$SHARED/tokenizers/llama3/tokenizer.json" > $D/tok/tokenizer.json.xz || exit 1
    mkdir -p $D/models
    [ $D/models/docllama-58m.trdc -nt "$BUILD"/spectra ] ||
        "$BUILD"/spectra compress -m "$SHARED/models/docllama-58m" -o $D/models/docllama-58m.trdc -q || exit 1
    xz -T2 -6 -f $D/bin/spectra || exit 1
    git log -1 --format='commit %h %cd' > $D/commit 2>/dev/null; git status --short | grep -q . && echo "(plus uncommitted changes)" >> $D/commit
    du -sh $D
    exit 0
fi

if [ "${1:-}" = pack-lowbit ]; then
    D=${SPX_GPU_DIR:-.dev/gpul}
    pack_bins spectra tests/cuda/test_cuda tests/cuda/test_cuda_lowbit
    # widths the device takes (every matrix's cols a multiple of 128)
    for mb in docllama-58m:3 docllama-long:2 tiny-lfm2:3 tiny-nemotronh:2; do
        m=${mb%:*} b=${mb#*:}
        [ $D/models/$m-b$b.trdc -nt "$BUILD"/spectra ] ||
            "$BUILD"/spectra compress -m "$SHARED/models/$m" -o $D/models/$m-b$b.trdc --bits $b -q || exit 1
    done
    git log -1 --format='commit %h %cd' > $D/commit 2>/dev/null; git status --short | grep -q . && echo "(plus uncommitted changes)" >> $D/commit
    du -sh $D
    exit 0
fi

if [ "${1:-}" = pack-kv ]; then
    D=${SPX_GPU_DIR:-.dev/gpuk}
    pack_bins spectra tests/cuda/test_cuda_kvlow
    for m in tiny-llama3 docllama-58m; do
        [ $D/models/$m.trdc -nt "$BUILD"/spectra ] ||
            "$BUILD"/spectra compress -m "$SHARED/models/$m" -o $D/models/$m.trdc -q || exit 1
    done
    git log -1 --format='commit %h %cd' > $D/commit 2>/dev/null; git status --short | grep -q . && echo "(plus uncommitted changes)" >> $D/commit
    du -sh $D
    exit 0
fi

if [ "${1:-}" = pack ]; then
    make BUILD="$BUILD" all -j"$(nproc)" >/dev/null || exit 1
    rm -rf $D/bin && mkdir -p $D/bin $D/lib $D/models
    cp "$BUILD"/spectra "$BUILD"/tests/cuda/test_cuda "$BUILD"/tests/cuda/test_cuda_ssm "$BUILD"/tests/cuda/test_cuda_batch \
        "$BUILD"/bench/gpu/bench_gemv $D/bin/ || exit 1
    strip $D/bin/* || exit 1
    # xz: the kernels' code compresses ~3x, so the binaries and docllama-58m fit the 64 MiB carry (unpacked there)
    xz -T2 -6 $D/bin/* || exit 1
    cp -L /usr/lib/x86_64-linux-gnu/libcjson.so.1 /usr/lib/x86_64-linux-gnu/libutf8proc.so.2 $D/lib/ || exit 1
    if [ "${MODELS:-1}" != 0 ]; then
        # tiny-llama3 also row-major (--layout rows): both layouts end to end
        for m in tiny-llama3 tiny-qwen2 tiny-qwen3 tiny-mistral tiny-lfm2 tiny-granite4 tiny-nemotronh docllama-58m; do
            [ $D/models/$m.trdc -nt "$BUILD"/spectra ] || "$BUILD"/spectra compress -m "$SHARED/models/$m" -o $D/models/$m.trdc -q || exit 1
        done
        rm -f $D/models/docllama-58m-rows.trdc
        [ $D/models/tiny-llama3-rows.trdc -nt "$BUILD"/spectra ] ||
            "$BUILD"/spectra compress -m "$SHARED/models/tiny-llama3" -o $D/models/tiny-llama3-rows.trdc --layout rows -q || exit 1
    fi
    cp "$SHARED/tools/make_random_gguf.py" $D/ || exit 1
    git log -1 --format='commit %h %cd' > $D/commit 2>/dev/null; git status --short | grep -q . && echo "(plus uncommitted changes)" >> $D/commit
    if [ -n "${LLAMA_BENCH:-}" ]; then
        mkdir -p $D/peer
        if [ ! -f $D/peer/llama-bench.xz ] || [ "$LLAMA_BENCH" -nt $D/peer/llama-bench.xz ]; then
            cp "$LLAMA_BENCH" $D/peer/llama-bench && strip $D/peer/llama-bench && xz -9 -T2 -f $D/peer/llama-bench || exit 1
        fi
        rm -rf $D/peer/gguf-py && mkdir -p $D/peer/gguf-py && cp -r "${GGUF_PY:?set GGUF_PY}/gguf" $D/peer/gguf-py/ || exit 1
    fi
    du -sh $D
    exit 0
fi

OUT=${OUT:-/tmp/spx-gpu}
T=/tmp/spx-gpu-work   # intermediates (the device tool brings back at most 8 files)
W=/tmp/spx-models
mkdir -p "$OUT" $T $W
export LD_LIBRARY_PATH="$PWD/$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SPECTRA_EXPECT_CUBLAS=1 # test_cuda: the cuBLAS prefill path must load here
B=$D/bin
MODE=${1:-full}
for f in $B/*.xz; do # pack's compressed binaries
    [ -f "$f" ] || continue
    xz -dc "$f" > "${f%.xz}" 2>/dev/null || python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$f" > "${f%.xz}"
    chmod +x "${f%.xz}" && rm -f "$f"
done
# tag TEXT: a bench's JSON line with " (TEXT)" appended to its model name (variants and rounds told apart)
tag() { sed "s/\"model\": \"\\([^\"]*\\)\"/\"model\": \"\\1 ($1)\"/"; }
exec 3>&1 > "$OUT/log.txt" 2>&1
# everything below into log.txt; summaries also to the terminal (fd 3)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,pcie.link.gen.max,pcie.link.width.max --format=csv 2>&1 | tee /dev/fd/3
cat $D/commit 2>/dev/null | tee /dev/fd/3 # written by pack (the device's copy of the tree may carry an older .git)

if [ "$MODE" = ncu ]; then
    NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    [ -n "$NCU" ] || { echo "ncu: not found" | tee /dev/fd/3; exit 1; }
    [ -f $W/llama3-8b.trdc ] || $B/spectra synth --shape llama3-8b -o $W/llama3-8b.trdc 2>&1 | tail -n 1
    timeout 400 "$NCU" --cache-control none --clock-control none --metrics gpu__time_duration.sum --csv \
        $B/spectra bench -m $W/llama3-8b.trdc --backend cuda --kv "${NCU_KV:-f16}" -p 0 -n 3 -r 1 > $T/ncu.csv 2> $T/ncu.err ||
        { echo "ncu failed:"; tail -n 5 $T/ncu.err; } | tee /dev/fd/3
    python3 - $T/ncu.csv <<'PY' | tee "$OUT/ncu.txt" >&3
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h, rows = rows[0], rows[1:]
ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
agg = collections.OrderedDict()
for r in rows:
    a = agg.setdefault(r[ki].split("(")[0][:60], [])
    a.append(float(r[vi].replace(",", "")) * scale.get(r[ui], 1.0))
tot = sum(sum(v) for v in agg.values())
print("%d kernels, %.1f us in all (the bench's decode passes, each kernel alone)" % (sum(len(v) for v in agg.values()), tot))
for n, v in sorted(agg.items(), key=lambda x: -sum(x[1])):
    v.sort()
    print("%-60s %5d launches %8.2f us median %5.1f %%" % (n, len(v), v[len(v) // 2], 100 * sum(v) / tot))
PY
    exec 1>&3
    exit 0
fi

if [ "$MODE" = serve ]; then # (SPX_GPU_DIR=.dev/gpus) spectra serve on a synthetic shape with the Llama-3 tokenizer
    xz -dc $D/tok/tokenizer.json.xz > $D/tok/tokenizer.json || exit 1
    s=${SSHAPE:-llama3-8b}
    [ -f $W/$s-tok.trdc ] || $B/spectra synth --shape $s -o $W/$s-tok.trdc --tokenizer $D/tok > $T/synth.log 2>&1 ||
        { echo "synth $s failed:"; tail -n 3 $T/synth.log; } | tee /dev/fd/3
    echo "== serve_load $s: --parallel ${SPAR:-16}, clients ${SCLIENTS:-1,4,16,64}, ${SREQ:-64} requests each" | tee /dev/fd/3
    timeout "${STIME:-300}" python3 bench/serve_load.py --spectra $B/spectra --model $W/$s-tok.trdc --backend cuda \
        --parallel "${SPAR:-16}" --ctx 1024 --clients "${SCLIENTS:-1,4,16,64}" --requests "${SREQ:-64}" \
        --max-tokens "${SMAX:-64}" --out "$OUT/serve_load.md" 2>&1 | tee /dev/fd/3
    if [ -f $D/models/docllama-58m.trdc ]; then # a real model (its greedy answers rarely tie)
        echo "== serve_load docllama-58m: --parallel ${SPAR:-16}" | tee /dev/fd/3
        timeout "${STIME:-300}" python3 bench/serve_load.py --spectra $B/spectra --model $D/models/docllama-58m.trdc \
            --backend cuda --parallel "${SPAR:-16}" --ctx 1024 --clients "${SCLIENTS:-1,4,16,64}" \
            --requests "${SREQ:-64}" --max-tokens "${SMAX:-64}" --out "$OUT/serve_load_docllama.md" 2>&1 | tee /dev/fd/3
    fi
    if [ -n "${SMEM:-}" ]; then # memory across many requests: one level of SMEM requests
        echo "== serve_load memory: $SMEM requests at ${SMEMC:-16} clients, 16 tokens each" | tee /dev/fd/3
        timeout "${STIME:-300}" python3 bench/serve_load.py --spectra $B/spectra --model $W/$s-tok.trdc --backend cuda \
            --parallel "${SPAR:-16}" --ctx 1024 --clients "${SMEMC:-16}" --requests "$SMEM" --max-tokens 16 \
            --out "$OUT/serve_mem.md" 2>&1 | tee /dev/fd/3
    fi
    exec 1>&3
    exit 0
fi

if [ "$MODE" = ncu-gemv ]; then # the GEMV kernels alone under ncu (scheduler, warp states, memory), and their SASS
    NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    [ -n "$NCU" ] || { echo "ncu: not found" | tee /dev/fd/3; exit 1; }
    timeout 500 "$NCU" --clock-control none -k "regex:${KERNEL:-gemv_q4_tiled}" --section SpeedOfLight --section SchedulerStats \
        --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis --section LaunchStats \
        --section Occupancy $B/bench_gemv --json --ncu > "$OUT/ncu_gemv.txt" 2>&1
    echo "ncu exit $?" | tee /dev/fd/3
    grep -E '^  [a-z_]+.*\(|Duration|Executed Ipc A|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Instructions  |DRAM Throughput|Achieved Occupancy|Registers Per|Memory Throughput|L2 Hit|L1/TEX Hit|Active Warps Per' "$OUT/ncu_gemv.txt" | head -n 150 >&3
    CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -n 1)
    [ -n "$CUOBJ" ] && "$CUOBJ" -sass -fun "${SASS_FUN:-_Z13gemv_q4_tiledILi4ELi2EEv10gemv_kargs}" $B/bench_gemv > "$OUT/sass.txt" 2>&1
    echo "cuobjdump: ${CUOBJ:-none}" | tee /dev/fd/3
    exit 0
fi

if [ "$MODE" = kv ]; then # the low-bit KV cache: its test, then decode at depth per KV setting
    echo "== test_cuda_kvlow" | tee /dev/fd/3
    timeout 300 $B/test_cuda_kvlow $D/models/*.trdc > "$OUT/test_kvlow.log" 2>&1
    echo "test_cuda_kvlow exit $?" >> "$OUT/test_kvlow.log"
    { grep -v '^FAIL' "$OUT/test_kvlow.log" | tail -n 8; grep '^FAIL' "$OUT/test_kvlow.log" | head -n 20; } | tee /dev/fd/3
    s=${KSHAPE:-llama3-8b}
    [ -f $W/$s.trdc ] || $B/spectra synth --shape $s -o $W/$s.trdc > $T/synth.log 2>&1 ||
        { echo "synth $s failed:"; tail -n 3 $T/synth.log; } | tee /dev/fd/3
    KSETS=${KSETS:-"f16;q4;k2v2;k2v2 --kv-refine 4;k2v2 --kv-refine 4 --kv-refine-frac 0.03125;k3v3 --kv-refine 4"}
    : > "$OUT/kv.jsonl"
    for round in $(seq 1 "${ROUNDS:-3}"); do
        for d in ${KDEPTHS:-8192 32768 131072}; do
            echo "$KSETS" | tr ';' '\n' | while read -r kset; do
                # shellcheck disable=SC2086
                timeout 200 $B/spectra bench -m $W/$s.trdc --backend cuda --kv $kset -p 0 -n "${KN:-64}" -r 1 -d $d ${KSEEK---seek} --json 2> $T/kb.err < /dev/null |
                    tag "kv $kset, depth $d, round $round" >> "$OUT/kv.jsonl" ||
                    { echo "bench $kset depth $d failed:"; tail -n 3 $T/kb.err; } | tee /dev/fd/3
            done
        done
        echo "round $round done" | tee /dev/fd/3
    done
    python3 - "$OUT/kv.jsonl" <<'PY' | tee "$OUT/kv.txt" >&3
import json, re, statistics, sys
runs = {}
for l in open(sys.argv[1]):
    if not l.strip().startswith("{"): continue
    r = json.loads(l)
    m = re.search(r"\(kv (.*), depth (\d+), round (\d+)\)$", r["model"])
    if m: runs.setdefault((int(m.group(2)), m.group(1)), []).append(r["tg_tps_median"])
print("%-8s %-46s %-24s %8s %8s" % ("depth", "kv", "tg tok/s per round", "median", "vs f16"))
for d in sorted({k[0] for k in runs}):
    base = statistics.median(runs[(d, "f16")]) if (d, "f16") in runs else None
    for (dd, kv), v in runs.items():
        if dd != d: continue
        med = statistics.median(v)
        print("%-8d %-46s %-24s %8.2f %8s" % (d, kv, " ".join("%.2f" % x for x in v), med,
              "%.2fx" % (med / base) if base else "-"))
PY
    exec 1>&3
    exit 0
fi

if [ "${CHECKS:-1}" != 0 ]; then
    echo "== checks"
    timeout 60 $B/test_cuda_ssm > "$OUT/test_ssm.log" 2>&1
    echo "test_cuda_ssm exit $?" >> "$OUT/test_ssm.log"
    { grep -v '^FAIL' "$OUT/test_ssm.log" | tail -n 4; grep '^FAIL' "$OUT/test_ssm.log" | head -n 20; } | tee /dev/fd/3
    timeout 400 $B/test_cuda $D/models/*.trdc > "$OUT/test.log" 2>&1
    echo "test_cuda exit $?" >> "$OUT/test.log"
    { grep -v '^FAIL' "$OUT/test.log" | tail -n 16; grep '^FAIL' "$OUT/test.log" | head -n 20; } | tee /dev/fd/3
    if [ -x $B/test_cuda_batch ]; then
        timeout 300 $B/test_cuda_batch $D/models/*.trdc > "$OUT/test_batch.log" 2>&1
        echo "test_cuda_batch exit $?" >> "$OUT/test_batch.log"
        echo "(ping-pong: 0 resident layers)" >> "$OUT/test_batch.log"
        SPECTRA_CUDA_RESIDENT_LAYERS=0 timeout 200 $B/test_cuda_batch $D/models/tiny-llama3.trdc $D/models/tiny-lfm2.trdc \
            $D/models/docllama-58m.trdc >> "$OUT/test_batch.log" 2>&1
        echo "test_cuda_batch (ping-pong) exit $?" >> "$OUT/test_batch.log"
        { grep -v '^FAIL' "$OUT/test_batch.log" | tail -n 3; grep '^FAIL' "$OUT/test_batch.log" | head -n 20; } | tee /dev/fd/3
    fi

    if [ -f $D/models/docllama-58m.trdc ]; then
        echo "== text: docllama-58m greedy, cpu (scalar kernels, then avx2) vs cuda: resident, ping-pong (0 layers resident)" | tee /dev/fd/3
        SPECTRA_KERNELS=scalar timeout 60 $B/spectra run -m $D/models/docllama-58m.trdc --backend cpu -p "The Linux kernel" -n 48 --temp 0 -q > $T/run_cpu.txt 2> $T/run_cpu.err
        timeout 60 $B/spectra run -m $D/models/docllama-58m.trdc --backend cuda -p "The Linux kernel" -n 48 --temp 0 -q > $T/run_cuda.txt 2> $T/run_cuda.err
        SPECTRA_CUDA_RESIDENT_LAYERS=0 timeout 60 $B/spectra run -m $D/models/docllama-58m.trdc --backend cuda -p "The Linux kernel" -n 48 --temp 0 -q > $T/run_pp.txt 2> $T/run_pp.err
        timeout 60 $B/spectra run -m $D/models/docllama-58m.trdc --backend cpu -p "The Linux kernel" -n 48 --temp 0 -q > $T/run_avx2.txt 2> $T/run_avx2.err
        for v in cuda pp avx2; do
            if cmp -s $T/run_cpu.txt $T/run_$v.txt; then echo "cpu vs $v: same text" | tee /dev/fd/3; else
                { echo "cpu vs $v: texts differ:"; cat $T/run_cpu.txt $T/run_cpu.err; echo; cat $T/run_$v.txt $T/run_$v.err; } | tee /dev/fd/3; fi
        done
        # (avx2 rounds activations to int8 per block of 32 and sums attention in
        # another order: its text may leave the scalar one at a near-tie; test_fastpath
        # bounds its logits. The scalar and CUDA texts are expected to agree.)
    fi
fi

if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
    echo "== compute-sanitizer (memcheck): an 80-token prefill (cuBLAS GEMM), ping-pong with 0 resident layers, 4-bit KV, device sampling" | tee /dev/fd/3
    ids=$(seq -s, 1 80)
    : > "$OUT/sanitizer.txt"
    for v in "" "SPECTRA_CUDA_RESIDENT_LAYERS=0" "KV" "SAMPLE"; do
        kv=f16 temp=0; [ "$v" = KV ] && kv=q4 && v=""; [ "$v" = SAMPLE ] && temp=0.8 && v=""
        env $v timeout 300 compute-sanitizer --tool memcheck --leak-check full $B/spectra run -m $D/models/tiny-llama3.trdc \
            --backend cuda --kv $kv --ids "$ids" -n 8 --temp $temp --seed 1 -q > $T/san.txt 2>&1
        echo "[$v kv $kv temp $temp] exit $?: $(grep -E 'ERROR SUMMARY|LEAK SUMMARY' $T/san.txt | tr '\n' ' ')" | tee -a "$OUT/sanitizer.txt" | tee /dev/fd/3
    done
fi

echo "== GEMV" | tee /dev/fd/3
[ ! -x $B/bench_gemv ] || timeout 120 $B/bench_gemv --json > "$OUT/gemv.jsonl" 2> $T/gemv.err || cat $T/gemv.err | tee /dev/fd/3

if [ "$MODE" = batch ]; then
    # the M-token kernels (bench_gemv --mtok where it has it), bench
    # --parallel B on the synthetic shapes (PSHAPES, default llama3-8b
    # llama3-1b) in ROUNDS interleaved rounds, speculation on docllama-58m
    # (bench/spec_bench.sh on the committed prompts) and on the 8B shape
    echo "== M-token kernels" | tee /dev/fd/3
    timeout 120 $B/bench_gemv --mtok > "$OUT/mtok.txt" 2>&1 || echo "(bench_gemv --mtok: exit $?)" >> "$OUT/mtok.txt"
    grep -A40 -i "mtok\|M=" "$OUT/mtok.txt" | head -n 40 | tee /dev/fd/3
    echo "== bench --parallel" | tee /dev/fd/3
    : > $T/par.jsonl
    for s in ${PSHAPES:-llama3-8b llama3-1b}; do
        [ -f $W/$s.trdc ] || $B/spectra synth --shape $s -o $W/$s.trdc > $T/synth.log 2>&1 ||
            { echo "synth $s failed:"; tail -n 3 $T/synth.log; } | tee /dev/fd/3
    done
    for r in $(seq 1 "${ROUNDS:-2}"); do
        for s in ${PSHAPES:-llama3-8b llama3-1b}; do
            for p in ${PARS:-2 4 8 16}; do
                timeout 300 $B/spectra bench -m $W/$s.trdc --backend cuda --parallel $p -p 64 -n 64 -r 3 --json 2>> $T/par.err |
                    tag "$s round $r" >> $T/par.jsonl
            done
        done
    done
    python3 - $T/par.jsonl <<'PY' | tee "$OUT/parallel.txt" >&3
import json, sys, statistics, collections
runs = collections.defaultdict(lambda: ([], []))
for line in open(sys.argv[1]):
    try: j = json.loads(line)
    except ValueError: continue
    shape = j["model"].split("(")[1].split(" round")[0]
    t, o = runs[(shape, j["parallel"])]
    t.extend(j["total_tps"]); o.extend(j["single_tps"])
print("%-10s %3s %12s %12s %8s" % ("shape", "B", "total tok/s", "single tok/s", "ratio"))
for (shape, b), (t, o) in sorted(runs.items()):
    print("%-10s %3d %12.1f %12.1f %7.2fx" % (shape, b, statistics.median(t), statistics.median(o), statistics.median(t) / statistics.median(o)))
PY
    echo "== speculation: docllama-58m (cuda)" | tee /dev/fd/3
    SPECTRA=$B/spectra MODEL=$D/models/docllama-58m.trdc BACKEND=cuda PROMPTS=bench/results/spec-prompts EVAL=/nonexistent \
        timeout 400 sh bench/spec_bench.sh "${SROUNDS:-3}" 1 128 > "$OUT/spec.txt" 2> $T/spec.err || tail -n 5 $T/spec.err | tee /dev/fd/3
    tail -n 16 "$OUT/spec.txt" | tee /dev/fd/3
    echo "== speculation: llama3-8b synthetic, random prompt (-p 256), off vs lookup" | tee /dev/fd/3
    for r in 1 2 3; do for sp in off lookup; do
        timeout 120 $B/spectra bench -m $W/llama3-8b.trdc --backend cuda -p 256 -n 128 -r 1 --spec $sp --json 2>/dev/null |
            python3 -c "import json,sys; j=json.load(sys.stdin); print('round $r $sp tg %.2f tok/s, accepted %d of %d drafted, %.3f tokens/pass' % (j['tg_tps_median'], j['spec']['accepted'], j['spec']['drafted'], j['spec']['tokens_per_pass']))"
    done; done | tee "$OUT/spec8b.txt" >&3
    exec 1>&3
    exit 0
fi

# llama.cpp CUDA (built outside this repository, carried xz-compressed in $D/peer) ready in $T, and the
# Q4_0 GGUFs of the shapes in $W; sets CUDA_LIBS (llama.cpp's cuBLAS); false without $D/peer
peer_prep() {
    [ -f $D/peer/llama-bench.xz ] || return 1
    xz -dc $D/peer/llama-bench.xz > $T/llama-bench 2>/dev/null || python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" $D/peer/llama-bench.xz > $T/llama-bench
    chmod +x $T/llama-bench
    CUDA_LIBS=$(python3 -c 'import glob,os; print(":".join(sorted({os.path.dirname(p) for p in glob.glob("/usr/local/cuda*/lib*/libcublas.so.13*") + glob.glob("/usr/local/cuda*/targets/*/lib/libcublas.so.13*") + glob.glob("/opt/torch/.venv/lib/python3*/site-packages/nvidia/**/libcublas.so.13*", recursive=True)})))' 2>/dev/null)
    echo "cuBLAS from: $CUDA_LIBS"
    for s in llama3-1b llama3-8b; do
        [ -f $W/$s-q4_0.gguf ] || GGUF_PY=$D/peer/gguf-py python3 $D/make_random_gguf.py --preset $s --type q4_0 -o $W/$s-q4_0.gguf > $T/gguf_$s.log 2>&1 ||
            { echo "gguf $s failed:"; tail -n 5 $T/gguf_$s.log; } | tee /dev/fd/3
        [ -f $W/$s.trdc ] || $B/spectra synth --shape $s -o $W/$s.trdc 2>&1 | tail -n 1
    done
}

if [ "$MODE" = peer ]; then
    echo "== tg128, Spectra and llama.cpp in interleaved rounds" | tee /dev/fd/3
    peer_prep || { echo "peer: no $D/peer/llama-bench.xz" | tee /dev/fd/3; exit 1; }
    : > "$OUT/bench.jsonl"
    : > "$OUT/peer.jsonl"
    for round in $(seq 1 "${ROUNDS:-3}"); do
        for s in llama3-1b llama3-8b; do
            timeout 120 $B/spectra bench -m $W/$s.trdc --backend cuda -p 0 -n 128 -r 3 --json 2> $T/pb.err |
                tag "round $round" >> "$OUT/bench.jsonl" ||
                { echo "bench $s failed:"; cat $T/pb.err; } | tee /dev/fd/3
            LD_LIBRARY_PATH="$CUDA_LIBS:$LD_LIBRARY_PATH" timeout 300 $T/llama-bench -m $W/$s-q4_0.gguf -ngl 99 -p 0 -n 128 -fa 0,1 -r 3 -o jsonl \
                2> $T/peer_$s.err | sed "s/^{/{\"spx_round\": $round, /" >> "$OUT/peer.jsonl" ||
                { echo "llama-bench $s failed:"; tail -n 20 $T/peer_$s.err; } | tee /dev/fd/3
        done
    done
elif [ "$MODE" = ab ]; then
    # variant V of an A/B list ("-": none; BIN=name: $D/bin/name, another build staged beside it, instead
    # of PROGRAM): sets v (the environment setting, empty for none) and bin
    variant() {
        v=$1
        [ "$v" = - ] && v=
        bin=$B/$2
        case "$v" in BIN=*) bin=$B/${v#BIN=} ;; esac
    }
    if [ -n "${GEMV_AB:-}" ]; then # bench_gemv per variant (BIN=name: another bench_gemv build), rounds interleaved
        echo "== GEMV A/B: $GEMV_AB" | tee /dev/fd/3
        : > "$OUT/gemv_ab.jsonl"
        for round in $(seq 1 "${ROUNDS:-3}"); do
            for var in $GEMV_AB; do
                variant "$var" bench_gemv
                env $v timeout 120 $bin --json 2> $T/gab.err | sed "s/\"case\": \"\([^\"]*\)\"/\"case\": \"\1 (${v:-default}, round $round)\"/" \
                    >> "$OUT/gemv_ab.jsonl" || { echo "bench_gemv $v failed:"; cat $T/gab.err; } | tee /dev/fd/3
            done
        done
    fi
    echo "== A/B: ${AB:-}" | tee /dev/fd/3
    : > "$OUT/bench.jsonl"
    for s in llama3-1b llama3-8b; do
        [ -f $W/$s.trdc ] || $B/spectra synth --shape $s -o $W/$s.trdc 2>&1 | tail -n 1
    done
    for round in $(seq 1 "${ROUNDS:-3}"); do
        for s in llama3-1b llama3-8b; do
            for kv in ${AB_KV:-f16}; do
                for var in ${AB:--}; do
                    variant "$var" spectra
                    env $v timeout 120 $bin bench -m $W/$s.trdc --backend cuda --kv $kv -p "${AB_P:-0}" -n 128 -r 3 --json 2> $T/ab.err |
                        tag "kv $kv, ${v:-default}, round $round" >> "$OUT/bench.jsonl" ||
                        { echo "bench $s $kv $v failed:"; cat $T/ab.err; } | tee /dev/fd/3
                done
            done
        done
    done
elif [ "$MODE" = refine ]; then
  if [ "${RTESTS:-1}" != 0 ]; then
    echo "== test_cuda_refine" | tee /dev/fd/3
    pairs=""
    for m in tiny-llama3 docllama-58m; do [ -f $D/models/$m.refine ] && pairs="$pairs $D/models/$m.trdc $D/models/$m.refine"; done
    timeout 300 $B/test_cuda_refine $pairs > "$OUT/test_refine.log" 2>&1
    echo "test_cuda_refine exit $?" >> "$OUT/test_refine.log"
    { grep -v '^FAIL' "$OUT/test_refine.log" | tail -n 8; grep '^FAIL' "$OUT/test_refine.log" | head -n 20; } | tee /dev/fd/3
    echo "== bench_refine" | tee /dev/fd/3
    timeout 300 $B/bench_refine > "$OUT/bench_refine.txt" 2>&1 || tail -n 5 "$OUT/bench_refine.txt" | tee /dev/fd/3
  fi
    if [ -n "${DOCLLAMA_HF:-}" ] && [ -f "$DOCLLAMA_HF/config.json" ]; then
        KL_CHUNKS=${KL_CHUNKS:-4} # (not := inside the echo: a pipeline's commands run in subshells)
        echo "== docllama-58m KL (eval.txt, llama-compat, $KL_CHUNKS windows), refined on cpu and on cuda" | tee /dev/fd/3
        R="--refine $D/models/docllama-58m.refine"
        for be in cpu cuda; do
            extra=""; [ $be = cuda ] && extra="-m $D/models/docllama-58m.trdc $R --refine-k 32 --refine-lead 1 -m $D/models/docllama-58m.trdc $R --refine-k 32 --refine-lag 1"
            timeout 600 $B/spectra kl --ref "$DOCLLAMA_HF" -f $D/models/eval.txt --llama-compat --chunks $KL_CHUNKS --backend $be \
                -m $D/models/docllama-58m.trdc -m $D/models/docllama-58m.trdc $R --refine-k 32 \
                -m $D/models/docllama-58m.trdc $R --refine-k 128 $extra > $T/kl_$be.txt 2>&1
            { echo "-- backend $be"; cat $T/kl_$be.txt; } | tee -a "$OUT/kl.txt" | tee /dev/fd/3
        done
        if [ "${TUNE:-1}" != 0 ]; then
            TBUDGET=${TBUDGET:-5%}
            echo "== spectra tune --backend cuda (docllama-58m, budget $TBUDGET)" | tee /dev/fd/3
            cp $D/models/docllama-58m.refine $T/tune.refine
            timeout 500 $B/spectra tune -m $D/models/docllama-58m.trdc --refine $T/tune.refine --ref "$DOCLLAMA_HF" \
                -f $D/models/eval.txt --llama-compat --chunks 2 --budget $TBUDGET --backend cuda ${TUNE_ARGS:-} > "$OUT/tune.txt" 2>&1
            echo "tune exit $?" >> "$OUT/tune.txt"
            tail -n 25 "$OUT/tune.txt" | tee /dev/fd/3
        fi
    fi
    # RSCHED: fetch lag/lead pairs in blocks ("LAG/LEAD"); RBITS: the base's widths
    RS=${RSHAPE:-llama3-8b} RKS=${RKS:-1 2 4 8 16 32} RBLOCKS=${RBLOCKS:-16} RSCHED=${RSCHED:-0/0} RBITS=${RBITS:-4}
    echo "== $RS synthetic with a .refine: tg128, k in $RKS, $RBLOCKS blocks, lag/lead $RSCHED, bits $RBITS" | tee /dev/fd/3
    : > "$OUT/bench.jsonl"
    for b in $RBITS; do
        M=$W/r-$RS-b$b
        if [ ! -f $M.refine ]; then
            t0=$(date +%s)
            $B/spectra synth --shape $RS --bits $b -o $M.trdc --refine $M.refine > $T/rsynth.log 2>&1 ||
                { echo "synth failed:"; tail -n 5 $T/rsynth.log; } | tee /dev/fd/3
            echo "made $RS bits $b .trdc + .refine in $(( $(date +%s) - t0 )) s: $(ls -la $M.trdc $M.refine | awk '{print $5, $9}' | tr '\n' ' ')" | tee /dev/fd/3
        fi
    done
    for round in $(seq 1 "${ROUNDS:-3}"); do
        for b in $RBITS; do
            M=$W/r-$RS-b$b
            for k in 0 $RKS; do
                for sc in $RSCHED; do
                    lag=${sc%/*} lead=${sc#*/}
                    [ "$k" = 0 ] && [ "$sc" != "$(echo $RSCHED | cut -d' ' -f1)" ] && continue
                    a=""; [ "$k" = 0 ] || a="--refine $M.refine --refine-k $k --refine-blocks $RBLOCKS --refine-lag $lag --refine-lead $lead"
                    timeout 120 $B/spectra bench -m $M.trdc --backend cuda -p 0 -n 128 -r 3 --json $a 2> $T/rb.err |
                        tag "refine k $k, blocks $RBLOCKS, lag $lag, lead $lead, round $round" >> "$OUT/bench.jsonl" ||
                        { echo "bench bits $b k $k lag $lag lead $lead failed:"; cat $T/rb.err; } | tee /dev/fd/3
                done
            done
        done
    done
elif [ "$MODE" = lowbit ]; then
  if [ "${LTESTS:-1}" != 0 ]; then
    echo "== test_cuda_lowbit" | tee /dev/fd/3
    timeout 200 $B/test_cuda_lowbit > "$OUT/test_lowbit.log" 2>&1
    echo "test_cuda_lowbit exit $?" >> "$OUT/test_lowbit.log"
    { grep -v '^FAIL' "$OUT/test_lowbit.log" | tail -n 8; grep '^FAIL' "$OUT/test_lowbit.log" | head -n 20; } | tee /dev/fd/3
    echo "== test_cuda end to end at 3 and 2 bits" | tee /dev/fd/3
    timeout 400 $B/test_cuda --e2e-only $D/models/*.trdc > "$OUT/test_e2e.log" 2>&1
    echo "test_cuda exit $?" >> "$OUT/test_e2e.log"
    { grep -v '^FAIL' "$OUT/test_e2e.log" | tail -n 12; grep '^FAIL' "$OUT/test_e2e.log" | head -n 20; } | tee /dev/fd/3
    for m in docllama-58m-b3 docllama-long-b2; do
        SPECTRA_KERNELS=scalar timeout 60 $B/spectra run -m $D/models/$m.trdc --backend cpu -p "The Linux kernel" -n 48 --temp 0 -q > $T/t_cpu.txt 2>&1
        timeout 60 $B/spectra run -m $D/models/$m.trdc --backend cuda -p "The Linux kernel" -n 48 --temp 0 -q > $T/t_cuda.txt 2>&1
        if cmp -s $T/t_cpu.txt $T/t_cuda.txt; then echo "$m greedy: cpu and cuda same text" | tee /dev/fd/3; else
            { echo "$m greedy: texts differ:"; cat $T/t_cpu.txt; echo; cat $T/t_cuda.txt; } | tee /dev/fd/3; fi
    done
  fi
    : > "$OUT/bench.jsonl"
    for s in ${LSHAPES:-llama3-8b}; do
        for b in ${LBITS:-4 3 2}; do
            [ -f $W/$s-b$b.trdc ] || $B/spectra synth --shape $s --bits $b -o $W/$s-b$b.trdc > $T/synth.log 2>&1 ||
                { echo "synth $s bits $b failed:"; tail -n 3 $T/synth.log; } | tee /dev/fd/3
            $B/spectra inspect $W/$s-b$b.trdc --json > $T/$s-b$b.json
        done
        for round in $(seq 1 "${ROUNDS:-3}"); do
            for b in ${LBITS:-4 3 2}; do
              for v in ${LVARIANTS:--}; do # the tiled GEMV's form (SPECTRA_GEMV_TILED_VARIANT; -: the default choice)
                e=""; [ "$v" = - ] || e="SPECTRA_GEMV_TILED_VARIANT=$v"
                env $e timeout 120 $B/spectra bench -m $W/$s-b$b.trdc --backend cuda -p 0 -n 128 -r 3 --json 2> $T/lb.err |
                    tag "variant $v, round $round" >> "$OUT/bench.jsonl" ||
                    { echo "bench $s bits $b failed:"; cat $T/lb.err; } | tee /dev/fd/3
              done
            done
        done
    done
    python3 - "$OUT" $T <<'PY' | tee "$OUT/lowbit.txt" >&3
import json, os, re, statistics, sys
out, tmp = sys.argv[1], sys.argv[2]
tg = {}
for l in open(os.path.join(out, "bench.jsonl")):
    if l.strip().startswith("{"):
        r = json.loads(l)
        m = re.match(r"(.*)\.trdc \(variant (\S+), round (\d+)\)$", os.path.basename(r["model"]))
        if m: tg.setdefault((m.group(1), m.group(2)), []).append(r["tg_tps_median"])
print("%-16s %4s %-26s %8s %12s %9s %8s" % ("model", "form", "tg128 per round (tok/s)", "median", "bytes/token", "GB/s", "vs 4-bit"))
base = {}
for key in sorted(tg, key=lambda n: (n[0].rsplit("-b", 1)[0], n[1], -int(n[0].rsplit("-b", 1)[1]))):
    name, var = key
    meta = json.load(open(os.path.join(tmp, name + ".json")))
    # a token reads every matrix but the embedding (one row of it)
    byt = sum(t["bytes"] for t in meta["tensors"] if "embed_tokens" not in t["name"])
    med = statistics.median(tg[key])
    shape = (name.rsplit("-b", 1)[0], var)
    gbs = byt * med / 1e9
    base.setdefault(shape, (med, gbs))
    print("%-16s %4s %-26s %8.1f %12d %9.0f %7.2fx tok/s, %.2fx GB/s" % (name, var, " ".join("%.1f" % v for v in tg[key]), med, byt,
          gbs, med / base[shape][0], gbs / base[shape][1]))
PY
elif [ "$MODE" = hybrid ]; then
    # real-shape hybrids (random weights of the published shapes, bench/gpu/hybrid_ref.py) made with
    # transformers here, compressed by Spectra, logits against transformers' (KL, top-1), and both speeds
    HYBRID_SHAPES=${HYBRID_SHAPES:-lfm2-1.2b granite4-micro nemotronh-4b}
    echo "== hybrids: $HYBRID_SHAPES" | tee /dev/fd/3
    : > "$OUT/hybrid.jsonl"
    for s in $HYBRID_SHAPES; do
        rm -rf $W/$s
        PYTHONUNBUFFERED=1 timeout 300 python3 bench/gpu/hybrid_ref.py make $s $W/$s 2>&1 | grep -v 'Warning\|falling back' | tail -n 3 | tee /dev/fd/3
        # Spectra's float32 reference path on the bf16 folder itself: the architecture's meaning at this shape
        timeout 300 $B/spectra logits -m $W/$s --backend cpu --threads 16 --kv f32 --ids "$(cat $W/$s/ref_ids.txt)" \
            -o $T/$s.dense.f32 > /dev/null 2> $T/lg.err || { echo "dense logits $s failed:"; cat $T/lg.err; } | tee /dev/fd/3
        timeout 300 $B/spectra compress -m $W/$s -o $W/$s.trdc 2>&1 | tail -n 1 | tee /dev/fd/3
        timeout 120 $B/spectra logits -m $W/$s.trdc --backend cuda --ids "$(cat $W/$s/ref_ids.txt)" -o $T/$s.f32 > /dev/null 2> $T/lg.err ||
            { echo "logits $s failed:"; cat $T/lg.err; } | tee /dev/fd/3
        timeout 120 $B/spectra logits -m $W/$s.trdc --backend cpu --threads 16 --ids "$(cat $W/$s/ref_ids.txt)" -o $T/$s.cpu.f32 > /dev/null 2> $T/lg.err ||
            { echo "cpu logits $s failed:"; cat $T/lg.err; } | tee /dev/fd/3
        { printf '{"shape": "%s", "dense_cpu_vs_hf": ' $s; python3 bench/gpu/hybrid_ref.py compare $W/$s $T/$s.dense.f32 | tr -d '\n'
          printf ', "cuda_vs_hf": '; python3 bench/gpu/hybrid_ref.py compare $W/$s $T/$s.f32 | tr -d '\n'
          printf ', "cpu_vs_hf": '; python3 bench/gpu/hybrid_ref.py compare $W/$s $T/$s.cpu.f32 | tr -d '\n'
          printf ', "hf_speed": '; cat $W/$s/hf_speed.json; echo '}'; } >> "$OUT/hybrid.jsonl"
        tail -n 1 "$OUT/hybrid.jsonl" | tr -d '\000' >&3
        timeout 200 $B/spectra bench -m $W/$s.trdc --backend cuda -p 512 -n 128 -r 3 --json 2> $T/hb.err >> "$OUT/bench.jsonl" ||
            { echo "bench $s failed:"; cat $T/hb.err; } | tee /dev/fd/3
        tail -n 1 "$OUT/bench.jsonl" | cut -c 1-400 >&3
        rm -rf $W/$s $W/$s.trdc
    done
elif [ "$MODE" != quick ]; then
    echo "== end to end" | tee /dev/fd/3
    : > "$OUT/bench.jsonl"
    for s in llama3-1b llama3-8b; do
        [ -f $W/$s.trdc ] || $B/spectra synth --shape $s -o $W/$s.trdc 2>&1 | tail -n 1
        for kv in f16 q4; do
            timeout 240 $B/spectra bench -m $W/$s.trdc --backend cuda --kv $kv -p 512 -n 128 -r 5 --json 2> $T/bench_$s.err |
                tag "kv $kv" >> "$OUT/bench.jsonl" || { echo "bench $s $kv failed:"; cat $T/bench_$s.err; } | tee /dev/fd/3
        done
    done
    # the same 8B with row-major matrices (a version 1 file, --layout rows): the tiled layout's gain
    [ -f $W/llama3-8b-rows.trdc ] || $B/spectra synth --shape llama3-8b --layout rows -o $W/llama3-8b-rows.trdc 2>&1 | tail -n 1
    timeout 240 $B/spectra bench -m $W/llama3-8b-rows.trdc --backend cuda --kv f16 -p 512 -n 128 -r 5 --json 2> $T/rows.err |
        tag "kv f16, row-major file" >> "$OUT/bench.jsonl" || { echo "bench rows failed:"; cat $T/rows.err; } | tee /dev/fd/3
    # the same 8B decode with the split attention kernels of before the decode kernels (and rope_store)
    for kv in f16 q4; do
        SPECTRA_CUDA_ATTN_SPLIT_KERNEL=1 timeout 240 $B/spectra bench -m $W/llama3-8b.trdc --backend cuda --kv $kv -p 512 -n 128 -r 3 --json 2> $T/split.err |
            tag "kv $kv, split attention kernels" >> "$OUT/bench.jsonl"
    done
    # the same 8B decode without programmatic dependent launch
    SPECTRA_CUDA_PDL=0 timeout 240 $B/spectra bench -m $W/llama3-8b.trdc --backend cuda --kv f16 -p 0 -n 128 -r 3 --json 2> $T/nopdl.err |
        tag "kv f16, no PDL" >> "$OUT/bench.jsonl"
    # long context: 8192-token prompt, then 128 tokens, fp16 vs 4-bit KV
    for kv in f16 q4; do
        timeout 300 $B/spectra bench -m $W/llama3-8b.trdc --backend cuda --kv $kv --ctx 8448 -p 8192 -n 128 -r 2 --json 2> $T/long_$kv.err |
            tag "kv $kv, ctx 8192" >> "$OUT/bench.jsonl" || { echo "long $kv failed:"; cat $T/long_$kv.err; } | tee /dev/fd/3
    done
    # the 8B in 2048 MiB of device memory: ping-pong layer offload
    timeout 120 $B/spectra plan -m $W/llama3-8b.trdc --vram-budget 2048 2>&1 | tee /dev/fd/3
    timeout 300 $B/spectra bench -m $W/llama3-8b.trdc --backend cuda --vram-budget 2048 -p 0 -n 32 -r 3 --json --telemetry 2> $T/offload.err |
        tag "vram-budget 2048" >> "$OUT/bench.jsonl" || { echo "offload failed:"; cat $T/offload.err; } | tee /dev/fd/3
    # llama.cpp CUDA on the same shapes, same run (Q4_0, all layers on the GPU)
    if peer_prep; then
        echo "== llama.cpp" | tee /dev/fd/3
        : > "$OUT/peer.jsonl"
        for s in llama3-1b llama3-8b; do
            LD_LIBRARY_PATH="$CUDA_LIBS:$LD_LIBRARY_PATH" timeout 300 $T/llama-bench -m $W/$s-q4_0.gguf -ngl 99 -p 512 -n 128 -fa 0,1 -r 5 -o jsonl \
                >> "$OUT/peer.jsonl" 2> $T/peer_$s.err || { echo "llama-bench $s failed:"; tail -n 20 $T/peer_$s.err; } | tee /dev/fd/3
        done
    fi
fi
exec 1>&3

python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import json, sys, os
out = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(out, "gemv.jsonl")) if l.strip()]
copy = next((r["gbps"] for r in rows if r["what"] == "copy"), None)
print("copy bandwidth (device-to-device, read + write): %s GB/s" % (copy and "%.1f" % copy))
print("%-32s %4s %9s %9s %9s %8s" % ("GEMV", "impl", "MB", "us", "GB/s", "of copy"))
for r in rows:
    if r["what"] == "gemv":
        print("%-32s %4d %9.1f %9.2f %9.1f %7.1f%%" % (r["case"], r.get("impl", 0), r["bytes"] / 1e6, r["us"], r["gbps"], 100 * r["of_copy"]))
p = os.path.join(out, "gemv_ab.jsonl")
if os.path.exists(p): # medians over rounds per (case, variant)
    import re, statistics
    med = {}
    for l in open(p):
        if not l.strip().startswith("{"): continue
        r = json.loads(l)
        if r["what"] != "gemv": continue
        key = re.sub(r", round \d+\)$", ")", r["case"])
        med.setdefault(key, []).append(r["of_copy"])
    print()
    print("%-60s %8s %s" % ("GEMV A/B (median of rounds)", "of copy", "rounds"))
    for key, v in med.items():
        print("%-60s %7.1f%% %s" % (key, 100 * statistics.median(v), " ".join("%.1f" % (100 * x) for x in v)))
p = os.path.join(out, "bench.jsonl")
if os.path.exists(p):
    print()
    print("%-42s %10s %10s %10s %9s %8s" % ("spectra (cuda)", "pp t/s", "tg t/s", "MB/token", "GB/s", "of copy"))
    for l in open(p):
        if not l.strip().startswith("{"): continue
        r = json.loads(l)
        frac = r["tg_gbps"] / copy if copy else float("nan")
        print("%-42s %10.1f %10.1f %10.1f %9.1f %7.1f%%" % (os.path.basename(r["model"]), r.get("pp_tps_median", 0), r.get("tg_tps_median", 0),
              r["weight_bytes_per_token"] / 1e6, r["tg_gbps"], 100 * frac))
        if r.get("residency") == "ping-pong":
            keys = ("n_layers_resident", "stream_bytes_per_token", "h2d_gbps", "t_step_ms", "t_compute_ms", "t_copy_ms",
                    "transfer_hidden_share", "overlap_of_possible", "pcie_bound_tps", "tg_of_pcie_bound")
            print("    " + ", ".join("%s %s" % (k, r.get(k)) for k in keys))
            sb = r.get("stream_bytes_per_token")
            if sb: print("    PCIe bound at 55 GB/s: %.1f tok/s; measured tg %.1f = %.0f%% of it" % (55e9 / sb, r.get("tg_tps_median", 0), 100 * r.get("tg_tps_median", 0) / (55e9 / sb)))
            t = r.get("telemetry") or []
            if t: print("    telemetry: %d samples, keys %s" % (len(t), sorted(t[0].keys())[:12]))
p = os.path.join(out, "peer.jsonl")
if os.path.exists(p):
    print()
    print("%-26s %5s %4s %6s %10s %10s" % ("llama.cpp (cuda, Q4_0)", "round", "fa", "test", "t/s", "stdev"))
    peer = [json.loads(l) for l in open(p) if l.strip().startswith("{")]
    for r in peer:
        test = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
        print("%-26s %5s %4d %6s %10.1f %10.1f" % (os.path.basename(r["model_filename"]), r.get("spx_round", "-"),
              int(r.get("flash_attn", 0)), test, r["avg_ts"], r["stddev_ts"]))
    if any("spx_round" in r for r in peer): # run.sh peer: interleaved rounds, ratio of medians
        import re, statistics
        sp = {}
        for l in open(os.path.join(out, "bench.jsonl")):
            if not l.strip().startswith("{"): continue
            r = json.loads(l)
            m = re.match(r"(.*)\.trdc \(round (\d+)\)$", os.path.basename(r["model"]))
            if m: sp.setdefault(m.group(1), {})[int(m.group(2))] = r["tg_tps_median"]
        print()
        print("%-10s %-24s %-34s %8s %8s" % ("tg128", "Spectra per round", "llama.cpp best of fa 0/1 per round", "median", "ratio"))
        for shape, byr in sorted(sp.items()):
            best = {}
            for r in peer:
                if os.path.basename(r["model_filename"]).startswith(shape + "-") and r["n_gen"] and "spx_round" in r:
                    best[r["spx_round"]] = max(best.get(r["spx_round"], 0), r["avg_ts"])
            rounds = sorted(set(byr) & set(best))
            if not rounds: continue
            ms, mp = statistics.median(byr[k] for k in rounds), statistics.median(best[k] for k in rounds)
            print("%-10s %-24s %-34s %8s %7.2fx" % (shape, " ".join("%.1f" % byr[k] for k in rounds),
                  " ".join("%.1f" % best[k] for k in rounds), "%.1f/%.1f" % (ms, mp), ms / mp))
            print("%-10s per-round ratios %s, median %.2fx" % ("", " ".join("%.2f" % (byr[k] / best[k]) for k in rounds),
                  statistics.median(byr[k] / best[k] for k in rounds)))
PY
