#!/bin/sh
# Seeds for fuzz_template: fuzz/seeds_template.sh CORPUS_DIR SHARED_DIR
# The chat templates of the tests (tests/data/templates/*.jinja) and the
# templates of cases.json, one file each, under stable names.
set -u
corpus=${1:?usage: fuzz/seeds_template.sh CORPUS_DIR SHARED_DIR}
mkdir -p "$corpus" || exit 1
for f in tests/data/templates/*.jinja; do
    [ -f "$f" ] || continue
    cp "$f" "$corpus/seed_$(basename "$f")" || exit 1
done
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$py" - "$corpus" <<'PY' || exit 1
import json, sys
for i, c in enumerate(json.load(open("tests/data/templates/cases.json", encoding="utf-8"))):
    with open("%s/seed_case_%03d.jinja" % (sys.argv[1], i), "w", encoding="utf-8") as f:
        f.write(c["template"])
PY
exit 0
