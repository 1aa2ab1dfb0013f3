#!/bin/sh
# cpu_host.sh: the CPU kernel tables on the GPU machine's host CPU, whose
# AMX tiles this development machine lacks (a CPU-only build, carried).
#
#   sh bench/gpu/cpu_host.sh pack   here: a CPU-only build (BUILD, default
#                                   build-cpu) into $D (default .dev/cpuh):
#                                   spectra, test_kernels, bench_kernels,
#                                   bench_bandwidth, libcjson / libutf8proc /
#                                   libpcre2 / libmicrohttpd (the machine has
#                                   no -dev packages) and docllama-58m's .trdc
#                                   with a prompt from its eval text.
#   sh bench/gpu/cpu_host.sh        there: test_kernels (every table the CPU
#                                   has, amx included, against the scalar
#                                   reference); docllama-58m logits of a
#                                   128-token prompt per table against
#                                   scalar (max |dlogit|, top-1);
#                                   bench_kernels on the 1B and 8B matrix
#                                   shapes; `spectra bench` pp512 / tg128 on
#                                   a synthetic Llama-3.2-1B per table and
#                                   thread count (THREADS, default "4 8"),
#                                   ROUNDS (default 2) interleaved. A table.
set -u
D=${SPX_CPU_DIR:-.dev/cpuh}
BUILD=${BUILD:-build-cpu}
SHARED=${SHARED:-../shared}
if [ "${1:-}" = pack ]; then
    CUDA=0 make BUILD="$BUILD" all -j"$(nproc)" >/dev/null || exit 1
    rm -rf $D && mkdir -p $D/bin $D/lib $D/models
    cp "$BUILD"/spectra "$BUILD"/tests/test_kernels "$BUILD"/bench/bench_kernels "$BUILD"/bench/bench_bandwidth $D/bin/ || exit 1
    strip $D/bin/* && xz -T2 -6 $D/bin/* || exit 1
    for l in libcjson.so.1 libutf8proc.so.2 libpcre2-8.so.0 libmicrohttpd.so.12; do
        cp -L /usr/lib/x86_64-linux-gnu/$l $D/lib/ || exit 1
    done
    for l in $(ldd /usr/lib/x86_64-linux-gnu/libmicrohttpd.so.12 |
        awk '$3 ~ /^\// && $1 !~ /^(libc|libm|libpthread|libdl|librt|ld-linux)/ {print $3}'); do
        cp -L "$l" $D/lib/ || exit 1
    done
    "$BUILD"/spectra compress -m "$SHARED/models/docllama-58m" -o $D/models/doc.trdc -q || exit 1
    xz -T2 -6 $D/models/doc.trdc || exit 1
    "$BUILD"/spectra tokenize -m "$SHARED/models/docllama-58m" "$(head -c 3000 "$SHARED/models/docllama-58m/eval.txt")" |
        tr ' ' '\n' | head -128 | paste -sd, > $D/models/ids.txt || exit 1
    git log -1 --format='commit %h %cd' > $D/commit 2>/dev/null; git status --short | grep -q . && echo "(plus uncommitted changes)" >> $D/commit
    du -sh $D
    exit 0
fi

out=${OUT:-/tmp/spx-cpuh}
mkdir -p "$out" /tmp/cpuh
export LD_LIBRARY_PATH="$PWD/$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for f in $D/bin/*.xz $D/models/*.xz; do [ -f "$f" ] && xz -d -k -f "$f"; done
B=$D/bin
cat $D/commit 2>/dev/null
lscpu | grep -E "Model name|^CPU\(s\)"
echo "== test_kernels"
SPECTRA_SHARED=/nonexistent $B/test_kernels > "$out/test_kernels.log" 2>&1
echo "rc $?"; grep -v "^  " "$out/test_kernels.log" | tail -14

echo "== docllama-58m logits per table vs scalar (a 128-token prompt: the products of many tokens, amx's tiles)"
for t in scalar avx2 avx512 amx; do
    SPECTRA_KERNELS=$t $B/spectra logits -m $D/models/doc.trdc --ids "$(cat $D/models/ids.txt)" --kv f32 \
        -o /tmp/cpuh/logits.$t.f32 > "$out/logits.$t.log" 2>&1 || { echo "$t: logits failed"; tail -3 "$out/logits.$t.log"; }
done
python3 - <<'PY'
import array, os
def load(t):
    a = array.array('f'); p = f"/tmp/cpuh/logits.{t}.f32"
    if not os.path.exists(p): return None
    with open(p, 'rb') as f: a.frombytes(f.read())
    return a
ref = load("scalar")
for t in ["avx2", "avx512", "amx"]:
    a = load(t)
    if a is None or ref is None or len(a) != len(ref): print(t, "missing"); continue
    V = 32000; n = len(a) // V
    mx = max(abs(x - y) for x, y in zip(a, ref))
    top = sum(max(range(V), key=lambda v: a[i*V+v]) == max(range(V), key=lambda v: ref[i*V+v]) for i in range(n))
    print(f"{t}: {n} positions, max |dlogit| {mx:.4f}, top-1 {top}/{n}")
PY

echo "== bench_kernels (4-bit G32, 1B and 8B matrix shapes)"
$B/bench_kernels --kernels avx2,avx512,amx --threads 1 --runs 20 --gemm-runs 3 --tokens 512 --rounds 2 \
    --shape 2048x8192 2>&1 | tee "$out/bench_kernels.log" | tail -8
$B/bench_kernels --kernels avx2,avx512,amx --threads 1 --runs 10 --gemm-runs 2 --tokens 512 --rounds 2 \
    --shape 14336x4096 2>&1 | tee -a "$out/bench_kernels.log" | tail -8

echo "== spectra bench, synthetic Llama-3.2-1B"
$B/spectra synth --shape llama3-1b -o /tmp/cpuh/l1b.trdc > /dev/null || exit 1
for th in ${THREADS:-4 8}; do $B/bench_bandwidth --threads $th --reps 5 2>&1 | tail -1; done
for r in $(seq 1 "${ROUNDS:-2}"); do
    for th in ${THREADS:-4 8}; do
        for t in avx2 avx512 amx; do
            SPECTRA_KERNELS=$t $B/spectra bench -m /tmp/cpuh/l1b.trdc -p 512 -n 128 -r 1 --threads $th --json \
                > "$out/bench.$t.$th.$r.json" 2>/dev/null
        done
    done
done
python3 - "$out" "${ROUNDS:-2}" "${THREADS:-4 8}" <<'PY'
import json, sys, statistics as st
out, rounds, ths = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
print("| threads | table | pp512 tok/s | tg128 tok/s | decode GB/s |")
print("|---|---|---|---|---|")
for th in ths:
    for t in ["avx2", "avx512", "amx"]:
        pp, tg, bpt = [], [], 0
        for r in range(1, rounds + 1):
            try: s = json.load(open(f"{out}/bench.{t}.{th}.{r}.json"))
            except Exception: continue
            pp.append(s["pp_tps_median"]); tg.append(s["tg_tps_median"]); bpt = s["weight_bytes_per_token"]
        if pp: print(f"| {th} | {t} | {st.median(pp):.1f} | {st.median(tg):.2f} | {bpt * st.median(tg) / 1e9:.1f} |")
PY
