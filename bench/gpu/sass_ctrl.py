#!/usr/bin/env python3
"""sass_ctrl.py: the scheduling control bits of one kernel in a cubin, here,
without cuobjdump (this machine has nvcc and ptxas but no disassembler).

    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude \\
         -DSPX_HAVE_CUDA -cubin -o /tmp/g.cubin src/cuda/gemv_q4.cu
    python3 bench/gpu/sass_ctrl.py /tmp/g.cubin                # the kernels
    python3 bench/gpu/sass_ctrl.py /tmp/g.cubin KERNEL [--all]  # one kernel

Every sm_70+ instruction is 128 bits; its top 23 bits are the control code
the compiler chose: stall cycles, yield, the scoreboard (0-5) a variable-
latency instruction (a load) releases when its result lands ("wb"), the one
that releases its source registers ("rb"), and the mask of scoreboards the
instruction waits on before it issues ("wait"). A wait on a scoreboard waits
for every instruction that set it, so loads that share a scoreboard are
waited for together. The report lists the global loads per scoreboard and,
for one kernel, the loads, tensor-core MMAs, branches, barriers and every
instruction that waits on a load's scoreboard (--all: every instruction).
Opcodes are named from the low 12 bits for the few classes that matter
here (learned from cuobjdump -sass on the GPU machine, CUDA 13.0, sm_90a);
the rest print as hex. bench/gpu/NOTES.md 55 is what it was made for;
tests/test_sass_ctrl.sh checks it on a probe kernel in every CUDA build.
"""
import collections
import struct
import sys

OPS = {0x237: "IMMA", 0x388: "STS", 0x988: "STS", 0x51D: "BAR", 0xB1D: "BAR", 0x947: "BRA", 0x94D: "EXIT",
       0x981: "LDG", 0x984: "LDS"}


def sections(path):
    """{name: bytes} of an ELF64 little-endian file (a cubin)."""
    with open(path, "rb") as f:
        d = f.read()
    if d[:4] != b"\x7fELF" or d[4] != 2 or d[5] != 1:
        raise ValueError("%s: not a 64-bit little-endian ELF file (a cubin from nvcc -cubin)" % path)
    shoff, = struct.unpack_from("<Q", d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    if shoff + shnum * shentsize > len(d) or shstrndx >= shnum:
        raise ValueError("%s: truncated section table" % path)
    secs = [struct.unpack_from("<IIQQQQ", d, shoff + i * shentsize) for i in range(shnum)]
    stro = secs[shstrndx][4]
    out = {}
    for name, _typ, _flags, _addr, off, size in secs:
        end = d.find(b"\0", stro + name)
        out[d[stro + name:end].decode(errors="replace")] = d[off:off + size]
    return out


def decode(text):
    ins = []
    for a in range(0, len(text) - 15, 16):
        lo, hi = struct.unpack_from("<QQ", text, a)
        c = hi >> 41
        ins.append(dict(addr=a, op=OPS.get(lo & 0xFFF, "%03x" % (lo & 0xFFF)), stall=c & 15, yld=(c >> 4) & 1,
                        wb=(c >> 5) & 7, rb=(c >> 8) & 7, wait=(c >> 11) & 63))
    return ins


def fmt(x):
    bar = lambda v: "-" if v == 7 else str(v)
    w = "".join(str(b) for b in range(6) if x["wait"] >> b & 1)
    return "%05x  %-5s wb %s  rb %s  wait [%s]  stall %d" % (x["addr"], x["op"], bar(x["wb"]), bar(x["rb"]), w, x["stall"])


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    try:
        secs = sections(argv[1])
    except (OSError, ValueError) as e:
        print("sass_ctrl: %s" % e, file=sys.stderr)
        return 1
    kernels = sorted(n[len(".text."):] for n in secs if n.startswith(".text.") and secs[n])
    if len(argv) < 3:
        for k in kernels:
            ins = decode(secs[".text." + k])
            ldg = collections.Counter(x["wb"] for x in ins if x["op"] == "LDG")
            print("%-60s %6d instructions, global loads per scoreboard %s" % (k, len(ins), dict(sorted(ldg.items()))))
        return 0
    name = argv[2]
    if ".text." + name not in secs:
        print("sass_ctrl: %s: no kernel %s (it has: %s)" % (argv[1], name, ", ".join(kernels)), file=sys.stderr)
        return 1
    ins = decode(secs[".text." + name])
    load_sb = {x["wb"] for x in ins if x["op"] == "LDG" and x["wb"] != 7}
    mask = sum(1 << b for b in load_sb)
    for x in ins:
        if "--all" in argv or x["op"] in ("LDG", "IMMA", "BRA", "BAR", "EXIT") or x["wait"] & mask:
            print(fmt(x))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
