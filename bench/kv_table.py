#!/usr/bin/env python3
"""bench/kv_table.py: the markdown tables of bench/kv_sweep.sh's JSON lines
(quality: PPL, KL, bytes) or bench/kv_speed.sh's (speed: medians over
rounds, ratio to the f16 row of the same context).
Usage: kv_table.py sweep FILE... | kv_table.py speed FILE..."""
import json
import re
import statistics
import sys


def rows(files):
    for f in files:
        for line in open(f):
            line = line.strip()
            if line.startswith("{"):
                yield json.loads(line)


def tier_bytes(rec):
    m = re.search(r"tier ([0-9.]+) bytes per token", rec)
    return m.group(1) if m else "-"


def sweep(files):
    print("| ctx | windows | KV | flags | PPL (last 256) | ref PPL (f16 KV) | mean KL | top-1 % | KV bytes/token | tier bytes/token | s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for d in sorted(rows(files), key=lambda d: d["ctx"]):
        r, m = d["result"], d["result"]["models"][0]
        kvb = re.search(r"([0-9.]+) bytes per token", d["record"])
        print(f"| {d['ctx']} | {d['windows']} | {d['kv']} | {d['flags'] or '-'} | {m['ppl']:.4f} | {r['ppl_ref']:.4f} | "
              f"{m['kl_mean']:.5f} | {100 * m['top1']:.1f} | {kvb.group(1) if kvb else '-'} | {tier_bytes(d['record'])} | "
              f"{r['seconds']:.0f} |")


def speed(files):
    groups = {}
    for d in rows(files):
        groups.setdefault((d["ctx"], d["kv"], d["flags"]), []).append(d["bench"])
    print("| ctx | KV | flags | runs | pp tok/s (median) | tg tok/s at depth (median) | tg / f16 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (ctx, kv, flags), b in sorted(groups.items(), key=lambda x: x[0][0]):
        pp = statistics.median(x["pp_tps_median"] for x in b)
        tg = statistics.median(x["tg_tps_median"] for x in b)
        ref = groups.get((ctx, "f16", ""))
        ratio = tg / statistics.median(x["tg_tps_median"] for x in ref) if ref else float("nan")
        print(f"| {ctx} | {kv} | {flags or '-'} | {len(b)} | {pp:.1f} | {tg:.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("sweep", "speed"):
        sys.exit(__doc__)
    (sweep if sys.argv[1] == "sweep" else speed)(sys.argv[2:])
