#!/bin/sh
# Prompt-lookup speculation on the CPU: tokens/s with and without it, on
# prompts that repeat their context and prompts that do not (docs/spec.md).
#
#   SPECTRA=build/spectra MODEL=build/docllama-58m.trdc \
#   sh bench/spec_bench.sh [ROUNDS=5] [THREADS=2] [N=128]
#
# Prompts are cut from the model folder's eval.txt (EVAL, default
# ../shared/models/docllama-58m/eval.txt) and written to PROMPTS (default
# bench/results/spec-prompts/), so a run can be repeated on the same text:
#   rep-*: a document stretch, a blank line, then its first part again
#          (the model continues the quoted document);
#   new-*: a document stretch alone (nothing to copy from but itself).
# Each round runs every prompt with --spec off then lookup (the order
# alternates between rounds), one `spectra bench -f PROMPT -n N -r 1` each;
# greedy generation continues the prompt. The table gives per prompt the
# median tokens/s over rounds, the ratio lookup / off, the acceptance and
# tokens per pass; then the geometric mean of the ratios per group.
# SPEC_ARGS adds flags to the lookup runs (e.g. "--draft-max 12"); BACKEND
# picks the backend (default cpu; cuda on the GPU machine, where EVAL is
# absent and the committed PROMPTS are used as they are).
set -eu
rounds=${1:-5}
threads=${2:-2}
n=${3:-128}
: "${SPECTRA:?set SPECTRA to the spectra binary}"
: "${MODEL:?set MODEL to a model (.trdc or HF folder)}"
eval_txt=${EVAL:-../shared/models/docllama-58m/eval.txt}
prompts=${PROMPTS:-bench/results/spec-prompts}
spec_args=${SPEC_ARGS:-}
backend=${BACKEND:-cpu}
mkdir -p "$prompts"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# name:offset:length:repeat (characters of eval.txt; repeat 0: none)
[ -r "$eval_txt" ] || [ -n "$(ls "$prompts"/*.txt 2>/dev/null)" ] || { echo "spec_bench: no $eval_txt and no prompts in $prompts" >&2; exit 1; }
[ ! -r "$eval_txt" ] || /usr/bin/env python3 - "$eval_txt" "$prompts" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
specs = ["rep-a:0:400:100", "rep-b:3000:800:400", "rep-c:9000:1200:300", "rep-d:15000:1500:400", "rep-e:30000:1000:250",
         "new-a:0:600:0", "new-b:5000:1000:0", "new-c:12000:1500:0", "new-d:20000:800:0", "new-e:40000:1200:0"]
for s in specs:
    name, off, ln, rep = s.split(":")
    off, ln, rep = int(off), int(ln), int(rep)
    doc = text[off:off + ln]
    body = doc + "\n\n" + doc[:rep] if rep else doc
    open(f"{sys.argv[2]}/{name}.txt", "w", encoding="utf-8").write(body)
PY
list=$(ls "$prompts"/*.txt)
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then order="off lookup"; else order="lookup off"; fi
    for p in $list; do
        name=$(basename "$p" .txt)
        for sp in $order; do
            extra=""
            [ "$sp" = lookup ] && extra=$spec_args
            # shellcheck disable=SC2086
            "$SPECTRA" bench -m "$MODEL" --backend "$backend" -f "$p" -n "$n" -r 1 --threads "$threads" --spec "$sp" $extra --json \
                > "$tmp/$name.$sp.$r.json"
        done
    done
    echo "round $r/$rounds done" >&2
done
/usr/bin/env python3 - "$tmp" "$rounds" $list <<'PY'
import json, sys, os, math, statistics as st
tmp, rounds, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
names = [os.path.basename(f)[:-4] for f in files]
print("| prompt | prompt tokens | off tok/s | lookup tok/s | lookup / off | acceptance | tokens per pass |")
print("| --- | --- | --- | --- | --- | --- | --- |")
groups = {}
spec = None
for nm in names:
    off = [json.load(open(f"{tmp}/{nm}.off.{r}.json")) for r in range(1, rounds + 1)]
    lk = [json.load(open(f"{tmp}/{nm}.lookup.{r}.json")) for r in range(1, rounds + 1)]
    mo, ml = st.median(j["tg_tps_median"] for j in off), st.median(j["tg_tps_median"] for j in lk)
    s = lk[0]["spec"]
    spec = s
    acc, tpp = s["acceptance"], s["tokens_per_pass"]
    ratio = ml / mo
    groups.setdefault(nm.split("-")[0], []).append(ratio)
    print(f"| {nm} | {lk[0]['n_prompt']} | {mo:.2f} | {ml:.2f} | {ratio:.3f} | {acc:.3f} | {tpp:.2f} |")
print()
for g, rs in groups.items():
    gm = math.exp(sum(math.log(x) for x in rs) / len(rs))
    print(f"{g}: geometric mean of lookup / off over {len(rs)} prompts: {gm:.3f} (min {min(rs):.3f}, max {max(rs):.3f})")
print("\nlookup settings:", json.dumps({k: v for k, v in spec.items() if k not in
      ("passes", "verifications", "refeeds", "drafted", "accepted", "tokens", "acceptance", "tokens_per_pass")}))
PY
