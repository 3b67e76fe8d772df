"""BatchNorm + ReLU microbenchmark: forward + backward on the ResNet-50 BatchNorm shapes.

For each BatchNorm of ResNet-50 (224x224 inputs, NHWC, batch 32 by default) the step
`(x, scale, bias[, z], dy) -> (y, mean, var, dx, dscale, dbias[, dz])` is flax.linen's
training-mode BatchNorm + ReLU (+ the residual add for the blocks' last BatchNorm) and its
`jax.vjp`, compiled three ways and run interleaved in one process:

  jax.jit              XLA's code
  jgsess kernel        jgsess.jit with the fused kernels forced (JGSESS_AUTOTUNE=0)
  jgsess selected      jgsess.jit with selection by measurement (JGSESS_AUTOTUNE=1)

It prints median times, the kernel's ratio to XLA, and what selection chose for each fused node
with the two times it measured.

    python benchmarks/batch_norm.py [--batch 32] [--runs 9] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jgsess  # noqa: E402
from jgsess.kernels.batch_norm import flax_form  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402

# (spatial size, channels, residual add): ResNet-50's distinct BatchNorm shapes
RESNET50_BN = [
    (112, 64, False),  # stem
    (56, 64, False),
    (56, 256, True),
    (28, 128, False),
    (28, 512, True),
    (14, 256, False),
    (14, 1024, True),
    (7, 512, False),
    (7, 2048, True),
]


def step_fn(add: bool, dtype):
    def forward(*primals):
        s, mean, var = flax_form(*primals, eps=1e-5, axis=3, dtype=dtype)
        return jax.nn.relu(s), (mean, var)

    def step(*args):
        y, vjp, stats = jax.vjp(forward, *args[:-1], has_aux=True)
        return y, stats, vjp(args[-1])

    return step


def inputs(batch, size, channels, add, dtype, seed=0):
    rng = np.random.default_rng(seed)
    shape = (batch, size, size, channels)
    x = jnp.asarray(rng.standard_normal(shape) * 2 + 1, dtype)
    scale = jnp.asarray(rng.standard_normal(channels) + 1, jnp.float32)
    bias = jnp.asarray(rng.standard_normal(channels), jnp.float32)
    extra = [jnp.asarray(rng.standard_normal(shape), dtype)] if add else []
    dy = jnp.asarray(rng.standard_normal(shape), dtype)
    return [x, scale, bias, *extra, dy]


def timed(fn, args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def run_shape(batch, size, channels, add, dtype, runs) -> dict:
    args = inputs(batch, size, channels, add, dtype)
    # a function object per variant: jgsess.jit of one function shares jax's caches, whatever
    # the environment says when it is called again
    os.environ["JGSESS_AUTOTUNE"] = "0"  # compiled now, while selection is off
    forced = jgsess.jit(step_fn(add, dtype))
    forced_report = forced.report(*args)
    timed(forced, args)
    os.environ["JGSESS_AUTOTUNE"] = "1"
    selected = jgsess.jit(step_fn(add, dtype))
    selected_report = selected.report(*args)
    variants = {"jax.jit": jax.jit(step_fn(add, dtype)), "kernel": forced, "selected": selected}
    for fn in variants.values():  # compiled (selected measures), then warm
        timed(fn, args)
    times = {name: [] for name in variants}
    for _ in range(runs):
        for name, fn in variants.items():
            times[name].append(timed(fn, args))
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {
        "shape": f"{batch}x{size}x{size}x{channels}" + (" +add" if add else ""),
        **medians,
        "fused": dict(forced_report.fusions),
        "choices": [
            (m.kernel, m.impl, f"kernel {m.kernel_s * 1e3:.2f} ms, xla {m.xla_s * 1e3:.2f} ms")
            for m in selected_report.selection
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--shapes", type=int, default=len(RESNET50_BN), help="first N shapes")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    os.environ.setdefault("JGSESS_AUTOTUNE_CACHE", os.path.join(tempfile.mkdtemp(), "at.json"))
    dtype = np.dtype(jnp.dtype(args.dtype))
    print(f"{jax.devices()[0].device_kind}, batch {args.batch}, {args.dtype}, {args.runs} runs")
    print(f"{'shape':<22} {'jax.jit':>9} {'kernel':>9} {'selected':>9} {'kernel/xla':>10}")
    rows = []
    for size, channels, add in RESNET50_BN[: args.shapes]:
        r = run_shape(args.batch, size, channels, add, dtype, args.runs)
        rows.append(r)
        print(
            f"{r['shape']:<22} {r['jax.jit'] * 1e3:8.2f}ms {r['kernel'] * 1e3:8.2f}ms "
            f"{r['selected'] * 1e3:8.2f}ms {r['jax.jit'] / r['kernel']:9.2f}x",
            flush=True,
        )
        for kernel, impl, reason in r["choices"]:
            print(f"    selection: {kernel:<46} -> {impl:<6} ({reason})", flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("jax.jit", "kernel", "selected")}
    print(
        f"{'total':<22} {total['jax.jit'] * 1e3:8.2f}ms {total['kernel'] * 1e3:8.2f}ms "
        f"{total['selected'] * 1e3:8.2f}ms {total['jax.jit'] / total['kernel']:9.2f}x"
    )
    notes = f"batch {args.batch}, {args.dtype}, medians of {args.runs} runs"
    record.save(args.out, "batch_norm", table(rows, total), rows, notes)


def table(rows: list[dict], total: dict) -> str:
    """Markdown: per shape, the three times, the kernels' speed-up and what selection chose."""
    out = [
        "| shape | jax.jit | kernel | selected | jax.jit / kernel | selection chose (measured) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in [*rows, {**total, "shape": "total", "choices": []}]:
        chose = "; ".join(f"{impl} ({reason})" for _, impl, reason in r["choices"])
        out.append(
            f"| {r['shape']} | {r['jax.jit'] * 1e3:.2f} ms | {r['kernel'] * 1e3:.2f} ms | "
            f"{r['selected'] * 1e3:.2f} ms | {r['jax.jit'] / r['kernel']:.2f}x | {chose} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    main()
