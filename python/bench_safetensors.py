"""Loads one multi-GiB safetensors checkpoint onto the GPU three ways, in one run, and
compares them (issue #18: hipfile's loader against safetensors' own and torch.load):

- ``safetensors.torch.load_file(path, device="cuda:0")``
- ``torch.load(path.pt, map_location="cuda:0")`` (the same tensors saved with torch.save)
- ``hipfile.safetensors.load_file(path, device="cuda:0")``

each page-cache hot (after one untimed load) and cold (``posix_fadvise(DONTNEED)`` on the
file before each run, plus ``/proc/sys/vm/drop_caches`` where permitted), ``--reps``
times, median reported; every tensor of ours is checked bit-identical to safetensors'.

    python3 python/bench_safetensors.py [--gib 4] [--reps 3] [--dir /tmp]

Needs torch with CUDA, safetensors and the hipfile package installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def make_checkpoint(path: str, pt_path: str, gib: float) -> int:
    import torch
    from safetensors.torch import save_file

    total = int(gib * (1 << 30))
    tensors = {}
    made, index = 0, 0
    # A transformer-like mix: large bf16 matrices, some fp32 norms, odd shapes.
    shapes = [(8192, 8192), (8192, 2048), (4096, 11008), (11008, 4096), (8192,), (151936, 1024)]
    gen = torch.Generator().manual_seed(7)
    while made < total:
        shape = shapes[index % len(shapes)]
        dtype = torch.float32 if len(shape) == 1 else torch.bfloat16
        t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
        tensors[f"layer{index // len(shapes)}.w{index % len(shapes)}"] = t
        made += t.numel() * t.element_size()
        index += 1
    save_file(tensors, path)
    torch.save(tensors, pt_path)
    return made


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError:
        pass


def timed(load, path: str, cold: bool, reps: int):
    import torch

    times = []
    result = None
    if not cold:
        result = load(path)
        torch.cuda.synchronize()
    for _ in range(reps):
        del result
        result = None
        torch.cuda.empty_cache()
        if cold:
            drop_cache(path)
        start = time.perf_counter()
        result = load(path)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args()

    import torch
    import safetensors.torch as st

    import hipfile.safetensors as hst

    path = os.path.join(args.dir, "hipfile-bench-checkpoint.safetensors")
    pt_path = os.path.join(args.dir, "hipfile-bench-checkpoint.pt")
    nbytes = make_checkpoint(path, pt_path, args.gib)
    gib = nbytes / (1 << 30)
    print(f"checkpoint: {path}, {gib:.2f} GiB of tensors, torch {torch.__version__}, "
          f"GPU {torch.cuda.get_device_name(0)}")

    loaders = [
        ("safetensors.torch.load_file", lambda p: st.load_file(p, device="cuda:0")),
        ("torch.load(map_location=cuda)",
         lambda p: torch.load(pt_path, map_location="cuda:0", weights_only=True)),
        ("hipfile.safetensors.load_file", lambda p: hst.load_file(p, device="cuda:0")),
    ]
    for cold in (False, True):
        label = "cold" if cold else "hot"
        rows = []
        reference = None
        for name, load in loaders:
            target = pt_path if name.startswith("torch.load") else path
            seconds, result = timed(load, target, cold, args.reps)
            if name.startswith("safetensors"):
                reference = result
            elif name.startswith("hipfile") and reference is not None:
                assert result.keys() == reference.keys(), "tensor names differ"
                for key in reference:
                    a, b = result[key], reference[key]
                    assert a.dtype == b.dtype and a.shape == b.shape, key
                    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), key
            rows.append((name, seconds))
            del result
        reference = None
        base = rows[0][1]
        print(f"\n{label} page cache, median of {args.reps}:")
        for name, seconds in rows:
            print(f"  {name:<32} {seconds:8.3f} s {gib / seconds:7.2f} GiB/s "
                  f"{base / seconds:5.2f}x safetensors")
    print("\nhipfile tensors: bit-identical to safetensors' (checked every run)")
    os.remove(path)
    os.remove(pt_path)


if __name__ == "__main__":
    main()
