#!/usr/bin/env python3
"""Counts the CPU samples of `HIPFILE_BENCH_CPU_SAMPLES=PATH` (benches/src/cpu_samples.rs)
by thread kind and function.

Usage: cpu-samples.py BINARY SAMPLES [THREAD-PREFIX]
BINARY is a copy of the hipfile-bench that took them (any name), with its symbol table (nm); frames
in shared libraries are named by the exported symbol the bench found below them (dladdr),
else by file and offset. With THREAD-PREFIX only
threads whose name starts with it count. Printed per thread kind (digits folded to N):
its share of the samples; then innermost frames resolved (a frame in a system-call
wrapper is kernel time); then each function of ours counted once per sample in which it
appears (inclusive). With CALLERS_OF=TEXT in the environment, also the nearest function of
ours around the samples whose innermost frame contains TEXT (which of our calls a system
call or library frame was made from).
"""
import bisect
import collections
import re
import subprocess
import sys


def symbols(binary):
    out = subprocess.run(["nm", "-C", "--defined-only", binary], capture_output=True,
                         text=True, check=True).stdout
    table = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            table.append((int(parts[0], 16), parts[2]))
    table.sort()
    return [a for a, _ in table], [n for _, n in table]


def main():
    binary, path = sys.argv[1], sys.argv[2]
    prefix = sys.argv[3] if len(sys.argv) > 3 else ""
    addrs, names = symbols(binary)
    maps, bases, threads, stacks, exported = [], {}, {}, [], {}
    for line in open(path):
        kind, _, rest = line.rstrip("\n").partition(" ")
        if kind == "map":
            span, perms, offset, file = rest.split(" ", 3)
            start, end = (int(x, 16) for x in span.split("-"))
            if int(offset, 16) == 0:
                bases.setdefault(file, start)
            if "x" in perms:
                maps.append((start, end, file))
        elif kind == "sym":
            address, _, symbol = rest.partition(" ")
            exported[int(address, 16)] = symbol
        elif kind == "thread":
            tid, _, name = rest.partition(" ")
            threads[int(tid)] = name
        elif kind == "stack":
            fields = rest.split()
            stacks.append((int(fields[0]), int(fields[1]), [int(f, 16) for f in fields[2:]]))
    maps.sort()
    starts = [m[0] for m in maps]

    def file_of(address):
        i = bisect.bisect_right(starts, address) - 1
        return maps[i][2] if i >= 0 and address < maps[i][1] else None

    # frames[0] of every sample is the bench's own signal handler: the file it lies in
    # is the bench binary, whatever its name on the machine that took the samples.
    ours = next((file_of(frames[0]) for _, _, frames in stacks if frames), None)

    def name_of(address):
        file = file_of(address)
        if file is None:
            return "?", False
        i = bisect.bisect_right(starts, address) - 1
        relative = address - bases.get(file, maps[i][0])
        if file == ours:
            j = bisect.bisect_right(addrs, relative) - 1
            name = names[j] if j >= 0 else "?"
            return re.sub(r"::h[0-9a-f]{16}$", "", name)[:120], True
        library = file.rsplit("/", 1)[-1]
        if address in exported:
            return f"{library}:{exported[address].split('+')[0]}", False
        return f"{library}+{relative:#x}", False

    per_kind = collections.Counter()
    inner = collections.defaultdict(collections.Counter)
    inclusive = collections.defaultdict(collections.Counter)
    callers_of = __import__("os").environ.get("CALLERS_OF")
    callers = collections.defaultdict(collections.Counter)
    for count, tid, frames in stacks:
        name = threads.get(tid, "?")
        if not name.startswith(prefix):
            continue
        kind = re.sub(r"\d+", "N", name)
        per_kind[kind] += count
        # frames[0] is the handler, frames[1] the signal trampoline: the code that ran is
        # frames[2] (innermost) outwards.
        resolved = [name_of(f) for f in frames[2:]]
        if resolved:
            inner[kind][resolved[0][0]] += count
        for function in {n for n, is_ours in resolved if is_ours}:
            inclusive[kind][function] += count
        if callers_of and resolved and callers_of in resolved[0][0]:
            nearest = next((n for n, is_ours in resolved if is_ours), "?")
            callers[kind][nearest] += count
    total = sum(per_kind.values())
    print(f"{total} samples")
    for kind, n in per_kind.most_common():
        print(f"== {kind}: {n} samples ({100 * n / max(total, 1):.1f} %)")
        print("   innermost:")
        for function, c in inner[kind].most_common(12):
            print(f"   {100 * c / n:5.1f} %  {function}")
        print("   ours, inclusive:")
        for function, c in inclusive[kind].most_common(int(__import__("os").environ.get("TOP", "16"))):
            print(f"   {100 * c / n:5.1f} %  {function}")
        if callers[kind]:
            print(f"   nearest function of ours under {callers_of}:")
            for function, c in callers[kind].most_common(12):
                print(f"   {100 * c / n:5.1f} %  {function}")


if __name__ == "__main__":
    main()
