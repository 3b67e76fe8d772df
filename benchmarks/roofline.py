"""The memory roofline of jgsess's bandwidth-bound kernels, and gpu_check.sh's table.

Each of adamw, momentum, cast_all and global_norm touches every element a fixed number of
times and does little arithmetic per byte: its least time is the bytes it moves over the
device's bandwidth. The model counts the bytes (each operand read once, each result written
once, in place); the bandwidth is a measured one (the benchmark's own ceiling: a device copy on
a GPU, the same traffic in place on a CPU) or a device's nominal peak.

    python benchmarks/roofline.py [--gbps G]   each kernel's least time on the parameter sets
                                               (default: an H200's nominal 4,800 GB/s)
    python benchmarks/roofline.py --summary OUT
        gpu_check.sh's table: the benchmark rows of OUT/*.json, the optimizer rows beside their
        roofline at the ceiling measured in the same run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import param_sets  # noqa: E402

# nominal peak memory bandwidth, GB/s, by jax's device_kind
NOMINAL_GBPS = {"NVIDIA H100 80GB HBM3": 3350.0, "NVIDIA H200": 4800.0}
ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2}


def bytes_per_element(kernel: str, size: int, state: int | None = None) -> int:
    """Bytes `kernel` moves per element of its tensors of `size`-byte elements, in place: adamw
    reads p, g, m, v and writes p, m, v; momentum reads p, g, the accumulator and writes p and
    it; cast_all reads a source and writes its cast (`state`: the destination's size);
    global_norm reads each element once. `state`: the bytes of the (first) state array's
    elements where they differ from `size`."""
    s = size if state is None else state
    if kernel == "adamw":
        return 2 * size + s + size + (size + s + size)
    if kernel == "momentum":
        return 2 * size + s + (size + s)
    if kernel == "cast_all":
        return size + s
    if kernel == "global_norm":
        return size
    raise ValueError(f"no roofline model for {kernel!r}")


def least_ms(kernel: str, elements: int, gbps: float, size: int, state=None) -> float:
    """The kernel's least time on `elements` elements at `gbps` GB/s, in ms."""
    return elements * bytes_per_element(kernel, size, state) / (gbps * 1e9) * 1e3


def model_table(gbps: float) -> str:
    rows = [f"least time at {gbps:.0f} GB/s (ms)", f"{'set':16s} {'kernel':22s} {'ms':>8s}"]
    cases = [
        ("adamw", "f32", None),
        ("adamw", "bf16", None),
        ("momentum", "f32", None),
        ("momentum", "bf16", None),
        ("cast_all", "f32", "bf16"),
        ("global_norm", "f32", None),
    ]
    for name in ("resnet50", "bert-base"):
        elements = sum(math.prod(shape) for shape in param_sets.SETS[name]())
        for kernel, dtype, state in cases:
            label = f"{kernel} {dtype}" + (f"->{state}" if state else "")
            ms = least_ms(kernel, elements, gbps, ITEMSIZE[dtype], state and ITEMSIZE[state])
            rows.append(f"{name:16s} {label:22s} {ms:8.3f}")
    return "\n".join(rows)


def summary(out: str) -> str:
    """The benchmark rows gpu_check.sh wrote to `out`, as one table."""
    lines = []
    path = os.path.join(out, "train_step.json")
    if os.path.exists(path):
        lines.append(f"{'train step':24s} {'jax.jit ms':>10s} {'jgsess.jit':>10s} {'speedup':>8s}")
        for r in json.load(open(path))["results"]:
            ms = r["ms"]
            lines.append(
                f"{r['workload']:24s} {ms['jax.jit']:10.3f} {ms['jgsess.jit']:10.3f} "
                f"{r['speedup']:7.2f}x"
            )
    path = os.path.join(out, "optimizer_step.json")
    if os.path.exists(path):
        data = json.load(open(path))["results"]  # benchmarks/record.py: the run's record
        by_cpus = data["ceilings"]  # CPUs -> the ceilings measured on that many
        lines.append(
            f"{'set':17s} {'opt':20s} {'jax.jit ms':>10s} {'jgsess.jit':>10s} {'speedup':>8s} "
            f"{'torch':>8s} {'roofline':>9s} {'of it':>6s}"
        )
        for r in data["results"]:
            ms = r["ms"]
            if "jgsess.jit" not in ms:
                continue
            ceilings = by_cpus[str(r["cpus"])]
            ceiling = ceilings[str((r["optimizer"], r["dtype"]))]
            roof = r["params"] * r["bytes_per_param"] / (ceiling * 1e9) * 1e3
            torch = f"{ms['torch fused'] / ms['jgsess.jit']:7.2f}x" if "torch fused" in ms else "-"
            lines.append(
                f"{r['set']:17s} {r['optimizer'] + ' ' + r['dtype']:20s} {ms['jax.jit']:10.3f} "
                f"{ms['jgsess.jit']:10.3f} {ms['jax.jit'] / ms['jgsess.jit']:7.2f}x {torch:>8s} "
                f"{roof:9.3f} {roof / ms['jgsess.jit']:6.0%}"
            )
        triad = max(values["triad"] for values in by_cpus.values())
        lines.append(
            f"roofline: the row's bytes at the ceiling measured in the run (STREAM in place on a "
            f"CPU, a device copy on a GPU: {triad:.0f} GB/s)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gbps", type=float, default=NOMINAL_GBPS["NVIDIA H200"])
    parser.add_argument("--summary", metavar="OUT", help="gpu_check.sh's results folder")
    args = parser.parse_args()
    print(summary(args.summary) if args.summary else model_table(args.gbps))


if __name__ == "__main__":
    main()
