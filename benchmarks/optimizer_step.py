"""Optimizer-step benchmark: the same optax update under jax.jit and under jgsess.

For each parameter set (real model shapes, benchmarks/param_sets.py) and optimizer (AdamW,
SGD with momentum), four variants run the step `(params, state, grads) -> (params, state)`
with params and state donated:

  jax.jit            optax's update + apply_updates, compiled by XLA
  jgsess.jit         the same unmodified function, compiled by jgsess.jit
  jgsess.optim       jgsess.optim's fused step (update and apply in the kernel)
  optax.flatten      optax.flatten(optimizer) under jax.jit (one concatenated vector)

All variants live in one process and run interleaved, round after round, after warm-up; each
reports the median of its runs. A STREAM triad (a = b + s*c, donated) measured in the same run
on the CPU, a device-to-device copy on a GPU, measured in the same run, gives the machine's
bandwidth ceiling; each variant's bandwidth counts the bytes an optimizer must move per f32
parameter (AdamW 28: p, g, m, v in, p, m, v out; momentum 20).

    python benchmarks/optimizer_step.py [--sets resnet50,bert-base] [--runs 9] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from param_sets import SETS  # noqa: E402

import jgsess  # noqa: E402

OPTIMIZERS = {
    # name: (optax transformation, jgsess.optim transformation, bytes moved per parameter)
    "adamw": (
        lambda: optax.adamw(1e-3, weight_decay=1e-4),
        lambda: jgsess.optim.adamw(1e-3, weight_decay=1e-4),
        28,
    ),
    "momentum": (
        lambda: optax.sgd(1e-2, momentum=0.9),
        lambda: jgsess.optim.sgd(1e-2, momentum=0.9),
        20,
    ),
}


def log(message: str) -> None:
    print(message, flush=True)


def ceiling_gbps(n: int = 1 << 26, runs: int = 9) -> tuple[str, float]:
    """The bandwidth ceiling: (what was measured, GB/s).

    CPU: STREAM triad a = b + s*c in C++ on every core, 12 bytes per element (XLA's own CPU
    triad runs on one thread and would understate it). GPU: a device-to-device copy of n f32
    (CuPy's memcpy), 8 bytes per element counted; XLA's copy-like `scale` where CuPy is missing.
    """
    if jax.default_backend() == "cpu":
        from jgsess import _C

        return "STREAM triad", _C.stream_triad_gbps(n // 2, runs)
    try:
        import cupy

        src, dst = cupy.ones(n, cupy.float32), cupy.empty(n, cupy.float32)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        best = 1e30
        for _ in range(runs + 2):
            start.record()
            dst.data.copy_from_device(src.data, 4 * n)
            stop.record()
            stop.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, stop) / 1e3)
        return "device-to-device copy", 8 * n / best / 1e9
    except ImportError:
        scale = jax.jit(lambda a, b: b * 1.0001, donate_argnums=0)
        a, b = jnp.zeros((n,)), jnp.ones((n,))
        a = scale(a, b).block_until_ready()
        times = []
        for _ in range(runs):
            begin = time.perf_counter()
            a = scale(a, b).block_until_ready()
            times.append(time.perf_counter() - begin)
        return "XLA scale (copy-like)", 8 * n / min(times) / 1e9


def make_variants(optimizer: str):
    make_optax, make_fused, _ = OPTIMIZERS[optimizer]
    opt = make_optax()

    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    flat = optax.flatten(make_optax())

    def flat_step(params, state, grads):
        updates, state = flat.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    fused_step = jgsess.optim.fused_step(make_fused())
    return {
        "jax.jit": (jax.jit(step, donate_argnums=(0, 1)), opt.init),
        "jgsess.jit": (jgsess.jit(step, donate_argnums=(0, 1)), opt.init),
        "jgsess.optim": (lambda p, s, g: fused_step(p, g, s), make_fused().init),
        "optax.flatten": (jax.jit(flat_step, donate_argnums=(0, 1)), flat.init),
    }


def run_set(name: str, optimizer: str, runs: int, warmup: int) -> dict:
    shapes = SETS[name]()
    count = sum(int(jnp.prod(jnp.array(s))) for s in shapes)
    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(jax.random.fold_in(key, i), s) * 0.1 for i, s in enumerate(shapes)]
    grads = [p * 0.01 + 1e-3 for p in params]
    variants = make_variants(optimizer)
    states = {}
    for variant, (fn, init) in variants.items():
        start = time.perf_counter()
        p = [jnp.copy(x) for x in params]
        s = init(p)
        for _ in range(warmup):
            p, s = fn(p, s, grads)
        jax.block_until_ready((p, s))
        states[variant] = (p, s)
        log(
            f"  {name}/{optimizer}: {variant:13s} compiled and warmed up in "
            f"{time.perf_counter() - start:5.1f} s"
        )
    del params
    times = {v: [] for v in variants}
    order = list(variants)
    for r in range(runs):
        for variant in order[r % len(order) :] + order[: r % len(order)]:
            fn, _ = variants[variant]
            p, s = states[variant]
            start = time.perf_counter()
            p, s = fn(p, s, grads)
            jax.block_until_ready((p, s))
            times[variant].append(time.perf_counter() - start)
            states[variant] = (p, s)
    medians = {v: statistics.median(t) for v, t in times.items()}
    log(f"  {name}/{optimizer}: " + ", ".join(f"{v} {t * 1e3:.2f} ms" for v, t in medians.items()))
    return {
        "set": name,
        "optimizer": optimizer,
        "leaves": len(shapes),
        "params": count,
        "bytes_per_param": OPTIMIZERS[optimizer][2],
        "ms": {v: t * 1e3 for v, t in medians.items()},
    }


def table(results: list[dict], ceiling: float) -> str:
    from jgsess.report import table as render

    rows = []
    for r in results:
        base = r["ms"]["jax.jit"]
        moved = r["params"] * r["bytes_per_param"]
        for variant, ms in r["ms"].items():
            gbps = moved / (ms / 1e3) / 1e9
            rows.append(
                [
                    f"{r['set']} ({r['leaves']} arrays, {r['params'] / 1e6:.1f}M)",
                    r["optimizer"],
                    variant,
                    f"{ms:.2f}",
                    f"{base / ms:.2f}x",
                    f"{gbps:.1f}",
                    f"{gbps / ceiling:.0%}",
                ]
            )
    headers = [
        "parameter set",
        "optimizer",
        "variant",
        "ms/step",
        "vs jax.jit",
        "GB/s",
        "of ceiling",
    ]
    return render(headers, rows)


def plot(results: list[dict], ceiling: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(dict.fromkeys(r["set"] for r in results))
    optimizers = list(dict.fromkeys(r["optimizer"] for r in results))
    fig, axes = plt.subplots(
        len(optimizers), len(sets), figsize=(4.2 * len(sets), 3.6 * len(optimizers)), squeeze=False
    )
    for r in results:
        ax = axes[optimizers.index(r["optimizer"])][sets.index(r["set"])]
        variants = list(r["ms"])
        moved = r["params"] * r["bytes_per_param"]
        gbps = [moved / (r["ms"][v] / 1e3) / 1e9 for v in variants]
        bars = ax.bar(variants, gbps, color=["#999999", "#3b7dd8", "#1b4f9c", "#c9a227"])
        ax.axhline(ceiling, color="red", linestyle="--", label=f"ceiling {ceiling:.1f} GB/s")
        for bar, v in zip(bars, variants):
            ax.text(
                bar.get_x() + bar.get_width() / 2,
                bar.get_height(),
                f"{r['ms'][v]:.1f} ms",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_title(f"{r['set']} / {r['optimizer']}", fontsize=10)
        ax.set_ylabel("GB/s moved")
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"optimizer step on {jax.default_backend()} ({jax.devices()[0].device_kind})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log(
        f"jax {jax.__version__}, {jax.default_backend()} ({jax.devices()[0].device_kind}), "
        f"{os.cpu_count()} CPUs"
    )
    kind, ceiling = ceiling_gbps()
    log(f"bandwidth ceiling ({kind}): {ceiling:.1f} GB/s")
    results = []
    for name in args.sets.split(","):
        for optimizer in args.optimizers.split(","):
            results.append(run_set(name, optimizer, args.runs, args.warmup))
    ceiling = max(ceiling, ceiling_gbps()[1])  # measured again at the end: the better of the two
    text = table(results, ceiling)
    with open(os.path.join(args.out, "optimizer_step.json"), "w") as f:
        json.dump({"ceiling": kind, "ceiling_gbps": ceiling, "results": results}, f, indent=1)
    plot(results, ceiling, os.path.join(args.out, "optimizer_step.png"))
    log("")
    log(f"ceiling ({kind}) {ceiling:.1f} GB/s; median of {args.runs} interleaved runs each")
    log(text)
    log(f"chart: {os.path.join(args.out, 'optimizer_step.png')}")


if __name__ == "__main__":
    main()
