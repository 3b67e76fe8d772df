"""Compile-time benchmark: time to first result, jax.jit vs jgsess.jit, 10 to 4,000 leaves.

Workloads:

  adamw-N    optax.adamw's update and apply_updates over N parameter leaves of mixed small
             shapes (N = 10 to 4,000); the fusions fire
  adamax-N   the same with optax.adamax, which no kernel computes: nothing fuses
  mlp-N      a flax MLP train step (loss, grad, adamw) with N parameter leaves
  cnn-N      a flax CNN train step (conv, BatchNorm, ReLU, adamw) with N parameter leaves
  resnet18, efficientnet, lora
             benchmarks/train_step.py's flax train steps (ResNet-18 with SGD momentum, an
             EfficientNet-like net with Nesterov and a schedule, 200 LoRA adapter leaves with
             AdamW)

Each round jits a new function object under each compiler (so no cache is shared), calls it
once and waits for the result; the two run interleaved, round after round, in one process, and
each reports its median. For jgsess it also reports the pipeline's own time (trace to a jaxpr,
passes, emission: the `/jgsess/pipeline_duration` event) and XLA's compile time (jax's
`/jax/core/compile/backend_compile_duration` event). The trace to a jaxpr is work jax.jit does
too (inside jgsess.jit it replaces jax.jit's own trace), so each round also times jax.jit's own
trace of the step (`jax.jit(f).trace`): the pipeline minus that is what jgsess adds to jax.jit's
front end.

    python benchmarks/compile_time.py [--rounds 3] [--big-rounds 1] [--only adamw-10,mlp-20]
                                      [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jgsess

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402
import train_step  # noqa: E402

from jgsess import session  # noqa: E402

EVENTS = {
    "/jgsess/trace_duration": "trace",
    "/jgsess/passes_duration": "passes",
    "/jgsess/emit_duration": "emit",
    "/jgsess/pipeline_duration": "pipeline",
    "/jax/core/compile/backend_compile_duration": "xla",
}


def adamw_step(leaves: int, opt=None):
    rng = np.random.default_rng(leaves)
    shapes = [(int(rng.integers(1, 64)), int(rng.integers(1, 17))) for _ in range(leaves)]
    params = {
        f"p{i:04d}": jnp.asarray(rng.standard_normal(s), jnp.float32) for i, s in enumerate(shapes)
    }
    grads = jax.tree.map(lambda p: p * 0.01, params)
    opt = opt or optax.adamw(1e-3, weight_decay=1e-4)

    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step, (params, opt.init(params), grads)


def _train_step(model, variables, x, y, mutable: bool):
    opt = optax.adamw(1e-3)
    state = opt.init(variables["params"])

    def step(variables, state, x, y):
        def loss(params):
            inputs = {**variables, "params": params}
            if mutable:
                logits, new = model.apply(inputs, x, mutable=["batch_stats"])
            else:
                logits, new = model.apply(inputs, x), {}
            one_hot = jax.nn.one_hot(y, logits.shape[-1])
            return optax.softmax_cross_entropy(logits, one_hot).mean(), new

        (_, new), grads = jax.value_and_grad(loss, has_aux=True)(variables["params"])
        updates, state = opt.update(grads, state, variables["params"])
        params = optax.apply_updates(variables["params"], updates)
        return {**variables, **new, "params": params}, state

    return step, (variables, state, x, y)


class MLP(nn.Module):
    depth: int

    @nn.compact
    def __call__(self, x):
        for _ in range(self.depth):
            x = nn.relu(nn.Dense(64)(x))
        return nn.Dense(10)(x)


class CNN(nn.Module):
    blocks: int

    @nn.compact
    def __call__(self, x):
        for _ in range(self.blocks):
            x = nn.Conv(16, (3, 3), use_bias=False)(x)
            x = nn.relu(nn.BatchNorm(use_running_average=False)(x))
        return nn.Dense(10)(x.mean(axis=(1, 2)))


def mlp_step(leaves: int):
    model = MLP(depth=leaves // 2 - 1)
    x, y = jnp.ones((32, 64)), jnp.arange(32) % 10
    return _train_step(model, model.init(jax.random.PRNGKey(0), x), x, y, mutable=False)


def cnn_step(leaves: int):
    model = CNN(blocks=(leaves - 2) // 3)
    x, y = jnp.ones((8, 16, 16, 3)), jnp.arange(8) % 10
    return _train_step(model, model.init(jax.random.PRNGKey(0), x), x, y, mutable=True)


def adamax_step(leaves: int):
    return adamw_step(leaves, optax.adamax(1e-3))


def flax_step(name: str):
    step, state, inputs, _ = train_step.WORKLOADS[name]()
    return step, (*state, *inputs)


SIZES = (10, 100, 250, 500, 1000, 2000, 4000)
WORKLOADS = {
    **{f"adamw-{n}": (adamw_step, n) for n in SIZES},
    **{f"adamax-{n}": (adamax_step, n) for n in SIZES},
    "mlp-20": (mlp_step, 20),
    "mlp-200": (mlp_step, 200),
    "cnn-32": (cnn_step, 32),
    "cnn-302": (cnn_step, 302),
    **{name: (flax_step, name) for name in ("resnet18", "efficientnet", "lora")},
}


class PassTimes:
    """Each pass's seconds (summed over its runs) and whether a kernel was taken, per
    compilation, from the pipeline's own records."""

    def __init__(self):
        self.runs: list[tuple[dict[str, float], bool]] = []
        self._run = session.run_pipeline

    def __enter__(self):
        def run_pipeline(graph, passes, ctx):
            records = self._run(graph, passes, ctx)
            seconds: dict[str, float] = {}
            for r in records:
                seconds[r.name] = seconds.get(r.name, 0.0) + r.seconds
            self.runs.append((seconds, any(k.impl == "kernel" for k in ctx.record.kernels)))
            return records

        session.run_pipeline = run_pipeline
        return self

    def __exit__(self, *exc):
        session.run_pipeline = self._run


def first_call(make, step, args, events: dict) -> dict:
    events.clear()
    fresh = make(lambda *a: step(*a))  # a new function object: nothing cached
    start = time.perf_counter()
    jax.block_until_ready(fresh(*args))
    seconds = time.perf_counter() - start
    return {"first": seconds, **{k: sum(v) for k, v in events.items()}}


def jax_trace(step, args) -> float:
    """Seconds of jax.jit's own trace of the step (which jgsess's trace replaces)."""
    start = time.perf_counter()
    jax.jit(lambda *a: step(*a)).trace(*args)
    return time.perf_counter() - start


def measure(name: str, rounds: int) -> dict:
    build, n = WORKLOADS[name]
    step, args = build(n)
    events: dict[str, list[float]] = {}

    def listener(event, duration, **kwargs):
        if event in EVENTS:
            events.setdefault(EVENTS[event], []).append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    runs: dict[str, list[dict]] = {"jax": [], "jgsess": []}
    traces: list[float] = []
    try:
        with PassTimes() as passes:
            for i in range(rounds):  # interleaved, each going first in turn
                for variant in ("jax", "jgsess")[:: 1 if i % 2 == 0 else -1]:
                    make = jax.jit if variant == "jax" else jgsess.jit
                    runs[variant].append(first_call(make, step, args, events))
                traces.append(jax_trace(step, args))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    per_pass = {
        name: statistics.median(seconds.get(name, 0.0) for seconds, _ in passes.runs)
        for name in passes.runs[0][0]
    }
    per_pass["emit"] = median_of(runs["jgsess"], "emit")

    def median(variant: str, key: str) -> float:
        return median_of(runs[variant], key)

    leaves = len(jax.tree.leaves(args[0]["params"] if "params" in args[0] else args[0]))
    own = sum(per_pass.values())
    top = sorted(per_pass.items(), key=lambda kv: -kv[1])[:4]
    return {
        "fused": "yes" if any(kernel for _, kernel in passes.runs) else "no",
        "passes": ", ".join(f"{name} {t / own:.0%}" for name, t in top) if own else "-",
        "per_pass": per_pass,
        "workload": name,
        "rounds": rounds,
        "leaves": leaves,
        "jax": median("jax", "first"),
        "jgsess": median("jgsess", "first"),
        "ratio": statistics.median(
            b["first"] / a["first"] for a, b in zip(runs["jax"], runs["jgsess"])
        ),
        "pipeline": median("jgsess", "pipeline"),
        "trace": median("jgsess", "trace"),
        "own": statistics.median(r.get("passes", 0.0) + r.get("emit", 0.0) for r in runs["jgsess"]),
        "xla_jax": median("jax", "xla"),
        "xla_jgsess": median("jgsess", "xla"),
        "jax_trace": statistics.median(traces),
        # what jgsess adds to jax.jit's own front end: its pipeline minus jax.jit's trace
        "added": statistics.median(
            r.get("pipeline", 0.0) - t for r, t in zip(runs["jgsess"], traces)
        ),
    }


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r.get(key, 0.0) for r in runs)


def table(rows: list[dict]) -> str:
    head = (
        "| workload | leaves | kernel taken | rounds | jax.jit first call | jgsess.jit first call "
        "| ratio | pipeline: trace + passes + emit | largest shares of passes + emit | "
        "XLA compile: jax.jit / jgsess.jit | "
        "pipeline / XLA (jax.jit, jgsess) | jax.jit's trace | pipeline - jax.jit's trace "
        "(/ XLA, jax.jit) |"
    )
    out = [head, "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        xla, ours = max(r["xla_jax"], 1e-9), max(r["xla_jgsess"], 1e-9)
        out.append(
            f"| {r['workload']} | {r['leaves']} | {r['fused']} | {r['rounds']} | "
            f"{r['jax']:.2f} s | {r['jgsess']:.2f} s | {r['ratio']:.2f}x | "
            f"{r['pipeline']:.2f} s = {r['trace']:.2f} + {r['own']:.2f} | {r['passes']} | "
            f"{r['xla_jax']:.2f} s / {r['xla_jgsess']:.2f} s | "
            f"{r['pipeline'] / xla:.0%}, {r['pipeline'] / ours:.0%} | {r['jax_trace']:.2f} s | "
            f"{r['added']:.2f} s ({r['added'] / xla:.0%}) |"
        )
    return "\n".join(out)


def chart(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    groups = ("adamw-", "adamax-", ("mlp-", "cnn-", "resnet18", "efficientnet", "lora"))
    for ax, prefix in zip(axes, groups):
        picked = [r for r in rows if r["workload"].startswith(prefix)]
        if not picked:
            continue
        labels = [r["workload"] for r in picked]
        at = np.arange(len(picked))
        ax.bar(at - 0.27, [r["jax"] for r in picked], 0.27, label="jax.jit first call")
        ax.bar(at, [r["jgsess"] for r in picked], 0.27, label="jgsess.jit first call")
        ax.bar(at + 0.27, [r["pipeline"] for r in picked], 0.27, label="jgsess pipeline")
        ax.set_xticks(at, labels)
        ax.set_ylabel("seconds")
        ax.legend(fontsize=8)
    axes[0].set_title("optax.adamw step (fused), by leaves")
    axes[1].set_title("optax.adamax step (nothing fuses), by leaves")
    axes[2].set_title("flax train steps")
    fig.suptitle(f"time to first result, {jax.default_backend()} ({os.cpu_count()} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--big-rounds", type=int, default=1, help="rounds for 1,000+ leaves")
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    warm_step, warm_args = adamw_step(3)  # one-time work (jax's, patterns traced) out of the way
    for make in (jax.jit, jgsess.jit):
        jax.block_until_ready(make(warm_step)(*warm_args))
    rows = []
    for name in args.only.split(","):
        # XLA takes minutes on the largest unfused steps: one round there unless asked
        size = WORKLOADS[name][1]
        big = isinstance(size, int) and size >= 1000
        rows.append(measure(name, args.big_rounds if big else args.rounds))
        r = rows[-1]
        print(
            f"{name}: jax {r['jax']:.2f} s, jgsess {r['jgsess']:.2f} s ({r['ratio']:.2f}x), "
            f"pipeline {r['pipeline']:.2f} s, XLA {r['xla_jgsess']:.2f} s",
            file=sys.stderr,
            flush=True,
        )
    print(table(rows))
    notes = f"medians of {args.rounds} rounds ({args.big_rounds} for 1,000+ leaves)"
    print(f"record: {record.save(args.out, 'compile_time', table(rows), rows, notes)}")
    chart(rows, os.path.join(args.out, "compile_time.png"))


if __name__ == "__main__":
    main()
