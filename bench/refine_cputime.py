#!/usr/bin/env python3
"""refine_cputime.py: CPU seconds of `spectra bench` per variant, for a
machine too loaded for wall-clock tokens/s (bench/refine_neuron.sh's
variants, one thread, 5 interleaved rounds; each run decodes 3 x 128 tokens
after bench's warm-up, plus the model's open).

    python3 bench/refine_cputime.py BIN DIR   # DIR: refine_neuron.sh's OUT (mB.trdc, mB.refine)

CPU time (user + sys of the child) counts the work done whatever else runs,
though cache and core sharing still move it; the table gives the median
per variant and its ratio to the same width's base."""
import resource, subprocess, sys, json, statistics, collections
BIN, OUT = sys.argv[1], sys.argv[2]
V = [("base", "")]
for k, kn in ((32, 24), (128, 96)):
    V.append((f"channel k {k}", f"--refine {{r}} --refine-k {k}"))
for k, kn in ((32, 24), (128, 96)):
    V.append((f"neuron k {k} kn {kn}", f"--refine {{r}} --refine-k {k} --refine-mlp neuron --refine-kn {kn}"))
res = collections.defaultdict(list)
for rnd in range(5):
    for b in (4, 3):
        for name, a in V:
            args = [BIN, "bench", "-m", f"{OUT}/m{b}.trdc", "--backend", "cpu"] + a.format(r=f"{OUT}/m{b}.refine").split() + \
                   ["-p", "0", "-n", "128", "-r", "3", "--threads", "1", "--json"]
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            p = subprocess.run(args, capture_output=True, text=True)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            j = json.loads(p.stdout)
            cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
            res[f"{b}-bit {name}"].append((cpu, j["tg_tps_median"]))
print("| variant | CPU s per run (median of 5) | ratio to base | tg tok/s (1 thread, median) |")
print("| --- | --- | --- | --- |")
for v, xs in res.items():
    base = statistics.median(c for c, _ in res[v.split(" ")[0] + " base"])
    c = statistics.median(c for c, _ in xs)
    print(f"| {v} | {c:.2f} | {c / base:.3f} | {statistics.median(t for _, t in xs):.1f} |")
