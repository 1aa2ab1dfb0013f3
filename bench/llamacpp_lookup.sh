#!/bin/sh
# llama.cpp's prompt-lookup decoding (examples/lookup) against plain decoding
# on the prompts Spectra's speculation was measured on (bench/spec_bench.sh,
# bench/results/spec-prompts/), so the two can be put side by side.
#
# Needs binaries of a llama.cpp build made elsewhere (this script builds
# nothing) and a GGUF of the model:
#   LLAMA_LOOKUP=/path/llama-lookup LLAMA_CLI=/path/llama-cli GGUF=model.gguf \
#     sh bench/llamacpp_lookup.sh [ROUNDS [THREADS [N]]]
# (LLAMA_CLI may be empty: then the llama-cli cross-check is skipped.)
#
# Per round and prompt (order of the configurations alternates per round):
#   plain   llama-lookup --draft 0    (the same loop and timer, no drafts)
#   lk16    llama-lookup              (default draft: --draft 16)
#   lk8     llama-lookup --draft 8    (Spectra's draft_max)
#   cli     llama-cli -no-cnv         (plain decoding; "eval time" line)
# all greedy (--temp 0), --ignore-eos, -c 1024, THREADS threads, N tokens
# generated (llama-lookup -n N-1 samples N tokens; its first comes from the
# prompt pass). tok/s = (tokens sampled - 1) / seconds of llama-lookup's
# decode loop, i.e. tokens after the first per second, as Spectra's bench
# counts; llama-cli: its eval runs per second. Medians over the rounds.
# Logs go to OUTDIR (default /tmp/llamacpp-lookup-logs).
set -eu
rounds=${1:-3}
threads=${2:-2}
n=${3:-128}
prompts=${PROMPTS:-bench/results/spec-prompts}
out=${OUTDIR:-/tmp/llamacpp-lookup-logs}
: "${LLAMA_LOOKUP:?set LLAMA_LOOKUP}" "${GGUF:?set GGUF}"
cli=${LLAMA_CLI:-}
mkdir -p "$out"
common="-m $GGUF -t $threads -tb $threads -c 1024 --temp 0 --ignore-eos"
cfgs="plain lk16 lk8"
[ -z "$cli" ] || cfgs="$cfgs cli"
rev() { for x in "$@"; do echo "$x"; done | tac | tr '\n' ' '; }

echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$out/load.txt"
r=0
while [ "$r" -lt "$rounds" ]; do
    order=$cfgs
    [ $((r % 2)) -eq 0 ] || order=$(rev $cfgs)
    for p in "$prompts"/*.txt; do
        nm=$(basename "$p" .txt)
        for c in $order; do
            f="$out/$nm.$c.r$r"
            case $c in
                plain) "$LLAMA_LOOKUP" $common -f "$p" -n $((n - 1)) --draft 0 >"$f.out" 2>"$f.err" ;;
                lk16)  "$LLAMA_LOOKUP" $common -f "$p" -n $((n - 1)) >"$f.out" 2>"$f.err" ;;
                lk8)   "$LLAMA_LOOKUP" $common -f "$p" -n $((n - 1)) --draft 8 >"$f.out" 2>"$f.err" ;;
                cli)   "$cli" $common -f "$p" -n "$n" -no-cnv </dev/null >"$f.out" 2>"$f.err" ;;
            esac
        done
    done
    echo "round $r done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/load.txt"
    r=$((r + 1))
done

/usr/bin/env python3 - "$out" "$rounds" "$cfgs" <<'PY'
import math, os, re, statistics, sys
out, rounds, cfgs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def lookup(path):
    t = open(path + ".err", errors="replace").read()
    enc = re.search(r"encoded\s+(\d+) tokens", t)
    dec = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", t)
    dr = re.search(r"n_drafted\s+=\s+(\d+)", t)
    ac = re.search(r"n_accept\s+=\s+(\d+)", t)
    npred, sec = int(dec.group(1)), float(dec.group(2))
    ndr, nac = int(dr.group(1)), int(ac.group(1))
    passes = max(1, npred - 1 - nac)
    return dict(np=int(enc.group(1)), n=npred, tps=(npred - 1) / sec, dr=ndr, ac=nac,
                tpp=(npred - 1) / passes,
                # this commit LOG()s " - draft candidate: token=N" to stdout: drop it
                text=re.sub(r"( - )?draft candidate: token=-?\d+\n", "", open(path + ".out", errors="replace").read()))
def cli(path):
    t = open(path + ".err", errors="replace").read()
    m = re.search(r"\n[^\n]*?\s+eval time =\s+([\d.]+) ms /\s+(\d+) runs", t)
    return dict(tps=int(m.group(2)) / (float(m.group(1)) / 1e3))
names = sorted({f.split(".")[0] for f in os.listdir(out) if f.endswith(".err")})
res = {}
for nm in names:
    for c in cfgs:
        rs = [(cli if c == "cli" else lookup)(f"{out}/{nm}.{c}.r{r}") for r in range(rounds)]
        res[nm, c] = rs
med = lambda nm, c, k: statistics.median(x[k] for x in res[nm, c])
hdr = "| prompt | prompt tokens | plain tok/s | lookup16 tok/s | x plain | accept16 | tok/pass16 | lookup8 tok/s | x plain | accept8 | tok/pass8 |"
if "cli" in cfgs: hdr += " llama-cli tok/s |"
print(hdr); print("|" + " --- |" * (hdr.count("|") - 1))
ratios = {}
for nm in names:
    p = med(nm, "plain", "tps"); row = [nm, str(res[nm, "plain"][0]["np"]), f"{p:.2f}"]
    for c in ("lk16", "lk8"):
        l = med(nm, c, "tps"); ratios.setdefault((nm[:3], c), []).append(l / p)
        r0 = res[nm, c][0]
        acc = r0["ac"] / r0["dr"] if r0["dr"] else float("nan")
        row += [f"{l:.2f}", f"{l / p:.3f}", f"{acc:.3f} ({r0['ac']}/{r0['dr']})", f"{r0['tpp']:.2f}"]
    if "cli" in cfgs: row.append(f"{med(nm, 'cli', 'tps'):.2f}")
    print("| " + " | ".join(row) + " |")
print()
for g in ("new", "rep"):
    for c in ("lk16", "lk8"):
        rs = ratios[g, c]; gm = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"{g} {c}: geometric mean of lookup / plain over {len(rs)} prompts: {gm:.3f} (min {min(rs):.3f}, max {max(rs):.3f})")
print()
# greedy text of lookup equal to plain? (first round; prompt echo included)
for nm in names:
    base = res[nm, "plain"][0]["text"]
    same = [c for c in ("lk16", "lk8") if res[nm, c][0]["text"].startswith(base.rstrip())]
    spread = {c: f"{min(x['tps'] for x in res[nm, c]):.1f}-{max(x['tps'] for x in res[nm, c]):.1f}" for c in cfgs}
    print(f"{nm}: tokens sampled plain {res[nm, 'plain'][0]['n']}, lk16 {res[nm, 'lk16'][0]['n']}, lk8 {res[nm, 'lk8'][0]['n']}; "
          f"text as plain: {' '.join(same) or 'none'}; tok/s range over rounds {spread}")
PY
