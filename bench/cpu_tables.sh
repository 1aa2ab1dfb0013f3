#!/bin/sh
# Spectra's CPU kernel tables against llama.cpp builds on the same shapes,
# same machine, same run, interleaved.
#
#   SHAPES="1b=/x/l1b.trdc,/x/l1b-q4_0.gguf,0 8b=/x/l8b.trdc,/x/l8b-q4_0.gguf,295501824" \
#   LLAMA="native=/peer/build/bin/llama-bench avx512=/peer/build-avx512/bin/llama-bench" \
#   sh bench/cpu_tables.sh [ROUNDS] [THREADS...]
#
# SHAPES: name=TRDC,GGUF,UNREAD per shape (UNREAD: bytes of the .gguf a
# decode step does not read, i.e. an untied token-embedding matrix, of
# which it reads one row; 0 for tied embeddings), the .trdc from `spectra
# synth --shape NAME`, the .gguf from ../shared/tools/make_random_gguf.py
# (--preset NAME --type q4_0): the same shapes, random weights. SHAPE_THREADS_<name>
# restricts a shape's thread counts (e.g. SHAPE_THREADS_8b=2).
# LLAMA: name=llama-bench pairs, llama.cpp built by you outside this
# repository (its default GGML_NATIVE=ON build as users get it, and, for
# prompt speed, one with AVX-512 but without AMX, whose Q4_0 prompt path
# is wrong at the 2025-02-20 commit). TABLES: Spectra's tables to run
# (default: avx2 avx512 amx, those this CPU has); a table named with a
# +mmap suffix (avx512+mmap) runs with --mmap, its weights left in the
# page cache's pages instead of the default private copy. PROMPT (512),
# GEN (128), REPS (1) per program call.
#
# Each round runs, per shape and thread count, every Spectra table
# (SPECTRA_KERNELS=name) and every llama.cpp build once, in that order;
# the table gives the medians over rounds, the ratios to each llama.cpp
# build, and decode's weight bytes per token over the median time against
# bench_bandwidth's read bandwidth at the same thread count.
set -eu
rounds=${1:-3}
shift 2>/dev/null || true
threads_all=${*:-"1 2"}
prompt=${PROMPT:-512}
gen=${GEN:-128}
reps=${REPS:-1}
here=$(cd "$(dirname "$0")/.." && pwd)
spx=${SPECTRA_BIN:-$here/build/spectra}
probe=${SPECTRA_PROBE:-$here/build/bench/bench_bandwidth}
: "${SHAPES:?set SHAPES (see the header)}"
: "${LLAMA:?set LLAMA to name=llama-bench pairs}"
tables=${TABLES:-}
if [ -z "$tables" ]; then
    for t in avx2 avx512 amx; do
        # a table this CPU lacks warns and runs scalar: keep only those that run as named
        if SPECTRA_KERNELS=$t "$spx" bench -m "$(echo "$SHAPES" | cut -d= -f2 | cut -d, -f1)" -p 0 -n 1 -r 1 --json 2>/dev/null |
            grep -q "\"cpu_kernels\": \"$t\""; then tables="$tables $t"; fi
    done
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "tables:$tables; llama.cpp: $LLAMA; shapes: $SHAPES; threads: $threads_all; rounds $rounds" >&2

for r in $(seq 1 "$rounds"); do
    for sh in $SHAPES; do
        name=${sh%%=*}; rest=${sh#*=}
        trdc=$(echo "$rest" | cut -d, -f1); gguf=$(echo "$rest" | cut -d, -f2)
        eval "ths=\${SHAPE_THREADS_$name:-\$threads_all}"
        for th in $ths; do
            for t in $tables; do
                k=${t%+mmap}; flag=; [ "$k" = "$t" ] || flag=--mmap
                SPECTRA_KERNELS=$k "$spx" bench -m "$trdc" -p "$prompt" -n "$gen" -r "$reps" --threads "$th" --json $flag \
                    > "$tmp/spx.$name.$th.$t.$r.json" 2>/dev/null
            done
            for lb in $LLAMA; do
                ln=${lb%%=*}; lbin=${lb#*=}
                "$lbin" -m "$gguf" -t "$th" -p "$prompt" -n "$gen" -r "$reps" -o json \
                    > "$tmp/llama.$name.$th.$ln.$r.json" 2>/dev/null
            done
            echo "round $r/$rounds: $name, $th threads done" >&2
        done
    done
done
for th in $threads_all; do "$probe" --threads "$th" --reps 10 --json > "$tmp/bw.$th.json"; done

/usr/bin/env python3 - "$tmp" "$rounds" "$prompt" "$gen" "$SHAPES" "$LLAMA" "$tables" "$threads_all" <<'PY'
import json, os, sys, statistics as st
tmp, rounds, prompt, gen = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
shapes = [s.split("=", 1) for s in sys.argv[5].split()]
llamas = [l.split("=", 1)[0] for l in sys.argv[6].split()]
tables = sys.argv[7].split()
threads_all = sys.argv[8].split()
bw = {th: json.load(open(f"{tmp}/bw.{th}.json"))["read_gbps_median"] for th in threads_all}
m = st.median
print(f"| shape | thr | engine | pp{prompt} tok/s | tg{gen} tok/s | decode GB/s (of probe) | "
      + " | ".join(f"pp / {l} | tg / {l}" for l in llamas) + " |")
print("|---|---|---|---|---|---|" + "---|---|" * len(llamas))
for name, rest in shapes:
    trdc, gguf, unread = rest.split(",")
    lbytes = os.path.getsize(gguf) - int(unread)
    for th in threads_all:
        res = {}
        for t in tables:
            pp, tg, bpt = [], [], 0
            for r in range(1, rounds + 1):
                f = f"{tmp}/spx.{name}.{th}.{t}.{r}.json"
                if not os.path.exists(f) or os.path.getsize(f) == 0: continue
                s = json.load(open(f))
                pp.append(s["pp_tps_median"]); tg.append(s["tg_tps_median"]); bpt = s["weight_bytes_per_token"]
            if pp: res["spectra " + t] = (pp, tg, bpt)
        for l in llamas:
            pp, tg = [], []
            for r in range(1, rounds + 1):
                f = f"{tmp}/llama.{name}.{th}.{l}.{r}.json"
                if not os.path.exists(f) or os.path.getsize(f) == 0: continue
                for e in json.load(open(f)):
                    if e.get("n_prompt", 0) > 0 and e.get("n_gen", 0) == 0: pp.append(e["avg_ts"])
                    if e.get("n_gen", 0) > 0 and e.get("n_prompt", 0) == 0: tg.append(e["avg_ts"])
            if pp: res["llama.cpp " + l] = (pp, tg, lbytes)
        for eng, (pp, tg, bpt) in res.items():
            gbs = bpt * m(tg) / 1e9
            cells = []
            for l in llamas:
                ref = res.get("llama.cpp " + l)
                cells += [f"{m(pp) / m(ref[0]):.2f}x", f"{m(tg) / m(ref[1]):.2f}x"] if ref else ["-", "-"]
            print(f"| {name} | {th} | {eng} | {m(pp):.1f} ({min(pp):.1f}-{max(pp):.1f}) | {m(tg):.2f} ({min(tg):.2f}-{max(tg):.2f}) "
                  f"| {gbs:.1f} ({100 * gbs / bw[th]:.0f}%) | " + " | ".join(cells) + " |")
print("\nprobe read GB/s: " + ", ".join(f"{th} thr {bw[th]:.1f}" for th in threads_all)
      + f"; rounds {rounds}; medians over rounds (min-max); decode GB/s = weight bytes per token"
      " (Spectra: bench's count; llama.cpp: the .gguf less the unread embedding) x median tg")
PY
