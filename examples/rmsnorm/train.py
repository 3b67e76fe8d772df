"""Train three unmodified models that normalize with RMSNorm (flax.linen's nn.RMSNorm,
flax.nnx's nnx.RMSNorm, and one written in jnp) under jax.jit and under jgsess.jit, with the
example's kernel registered (rmsnorm.py); print what jgsess fused, the losses side by side and
the step times.

    python examples/rmsnorm/train.py [--steps 30] [--batch 256] [--width 512]

(`make example` builds jgsess and runs this.)
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
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# measure every kernel against XLA's code on the first compilation (the default budget is a
# quarter of the trace's time, and leaves the rest to later compilations)
os.environ.setdefault("JGSESS_AUTOTUNE_BUDGET", "30")

import rmsnorm  # noqa: E402

import jgsess  # noqa: E402

DEPTH = 3


class LinenMLP(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
        for _ in range(DEPTH):
            x = nn.relu(nn.RMSNorm()(nn.Dense(self.width)(x)))
        return nn.Dense(10)(x)


class NnxMLP(nnx.Module):
    def __init__(self, features: int, width: int, rngs: nnx.Rngs):
        sizes = [features] + [width] * DEPTH
        self.dense = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes, sizes[1:])])
        self.norm = nnx.List([nnx.RMSNorm(width, rngs=rngs) for _ in range(DEPTH)])
        self.head = nnx.Linear(width, 10, rngs=rngs)

    def __call__(self, x):
        for dense, norm in zip(self.dense, self.norm):
            x = nnx.relu(norm(dense(x)))
        return self.head(x)


def jnp_mlp(params, x):
    for w, b, scale in params["layers"]:
        x = jax.nn.relu(rmsnorm.jnp_rms_norm(x @ w + b, scale, 1e-6))
    return x @ params["head"]


def models(features: int, width: int):
    """name -> (params, apply(params, x))."""
    key = jax.random.key(0)
    x = jnp.zeros((1, features))
    linen = LinenMLP(width)
    graph, state = nnx.split(NnxMLP(features, width, nnx.Rngs(0)))
    keys = jax.random.split(key, DEPTH + 1)
    sizes = [features] + [width] * DEPTH
    layers = [
        (jax.random.normal(k, (a, b)) / np.sqrt(a), jnp.zeros(b), jnp.ones(b))
        for k, a, b in zip(keys, sizes, sizes[1:])
    ]
    head = jax.random.normal(keys[-1], (width, 10)) / np.sqrt(width)
    return {
        "flax.linen nn.RMSNorm": (linen.init(key, x), linen.apply),
        "flax.nnx nnx.RMSNorm": (state, lambda s, x: nnx.merge(graph, s)(x)),
        "jnp rms_norm": ({"layers": layers, "head": head}, jnp_mlp),
    }


def make_step(apply, tx):
    def step(params, opt_state, x, y):
        def loss_fn(p):
            return jnp.mean((apply(p, x) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def train(step, params, opt_state, batches):
    losses = []
    for x, y in batches:
        params, opt_state, loss = step(params, opt_state, x, y)
        losses.append(float(loss))
    return losses


def step_times(steps, params, opt_state, x, y, rounds: int = 30) -> list[float]:
    """Median seconds of each of `steps` on the same state, run interleaved."""
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for i, step in enumerate(steps):
            start = time.perf_counter()
            jax.block_until_ready(step(params, opt_state, x, y))
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args(argv)
    features = 128
    rmsnorm.load()
    registrations = rmsnorm.register()
    print(f"registered: {', '.join(r.name for r in registrations)}")
    rng = np.random.default_rng(0)
    batches = [
        (
            rng.standard_normal((args.batch, features), np.float32),
            rng.standard_normal((args.batch, 10), np.float32),
        )
        for _ in range(args.steps)
    ]
    tx = optax.adamw(1e-3)
    rows = []
    for name, (params, apply) in models(features, args.width).items():
        step = make_step(apply, tx)
        plain, fused = jax.jit(step), jgsess.jit(step)
        opt_state = tx.init(params)
        fused(params, opt_state, *batches[0])  # compiles: the report shows what that decided
        report = fused.report(params, opt_state, *batches[0])
        kernels = {k.kernel: f"{k.impl}" for k in report.kernels if k.kernel.startswith("rms")}
        reference = train(plain, params, opt_state, batches)
        ours = train(fused, params, opt_state, batches)
        t_xla, t_ours = step_times([plain, fused], params, opt_state, *batches[0])
        print(f"\n{name}: {dict(report.fusions)}")
        for kernel in report.kernels:
            if kernel.kernel.startswith("rms"):
                print(f"  {kernel.kernel}: runs as {kernel.impl} ({kernel.reason})")
        for line, what in report.registered.items():
            if not what.startswith("fused"):
                print(f"  {line}: {what}")
        diff = max(abs(a - b) / abs(b) for a, b in zip(ours, reference))
        print(
            f"  loss after {args.steps} steps: jax.jit {reference[-1]:.6f}, "
            f"jgsess.jit {ours[-1]:.6f} (largest relative difference {diff:.1e})"
        )
        rows.append((name, kernels, t_xla, t_ours, diff))
    print("\nmodel                  rms kernels taken   jax.jit     jgsess.jit  speedup  loss diff")
    for name, kernels, t_xla, t_ours, diff in rows:
        taken = sum(v == "kernel" for v in kernels.values())
        print(
            f"{name:22s} {taken} of {len(kernels):<14d} {t_xla * 1e3:7.3f} ms  "
            f"{t_ours * 1e3:7.3f} ms  {t_xla / t_ours:5.2f}x   {diff:.1e}"
        )
    ok = all(diff < 1e-3 for *_, diff in rows)
    print("\nlosses agree within 1e-3 (relative)" if ok else "\nLOSSES DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
