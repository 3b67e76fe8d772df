"""ResNet train-step benchmark: a flax ResNet-18 / ResNet-50 step under jax.jit and jgsess.jit.

Each workload is the unmodified training step of a flax.linen ResNet (BatchNorm in training
mode, batch statistics in the state; SGD with momentum 0.9), with params, optimizer state and
statistics donated. Both variants run in one process, interleaved round after round after
warm-up; each reports the median step time. jgsess.jit selects its kernels by measurement
(JGSESS_AUTOTUNE=1, a fresh cache unless JGSESS_AUTOTUNE_CACHE is set); the fusions it took and
what selection chose are printed.

    python benchmarks/train_resnet.py [--workloads resnet18,resnet50] [--batch 8] [--image 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jgsess  # noqa: E402

# training-mode BatchNorm: batch statistics, running averages with momentum 0.9
norm = partial(nn.BatchNorm, use_running_average=False, momentum=0.9)


class Block(nn.Module):
    """A residual block of `filters` channels (four times as many out of a bottleneck), its
    first spatial convolution strided by `strides`."""

    filters: int
    strides: int = 1

    def join(self, x, y):
        """relu(x + y), x projected (1x1 convolution + BatchNorm) where its shape is not y's."""
        if x.shape != y.shape:
            x = norm()(nn.Conv(y.shape[-1], (1, 1), self.strides, use_bias=False)(x))
        return nn.relu(x + y)


class BasicBlock(Block):
    @nn.compact
    def __call__(self, x):
        y = nn.Conv(self.filters, (3, 3), self.strides, use_bias=False)(x)
        y = nn.relu(norm()(y))
        y = nn.Conv(self.filters, (3, 3), use_bias=False)(y)
        y = norm(scale_init=nn.initializers.zeros)(y)
        return self.join(x, y)


class Bottleneck(Block):
    @nn.compact
    def __call__(self, x):
        y = nn.relu(norm()(nn.Conv(self.filters, (1, 1), use_bias=False)(x)))
        y = nn.relu(norm()(nn.Conv(self.filters, (3, 3), self.strides, use_bias=False)(y)))
        y = norm(scale_init=nn.initializers.zeros)(
            nn.Conv(self.filters * 4, (1, 1), use_bias=False)(y)
        )
        return self.join(x, y)


class ResNet(nn.Module):
    """flax's examples/imagenet ResNet, NHWC, with a small-image stem."""

    stages: tuple
    block: type
    classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(64, (3, 3), use_bias=False)(x)
        x = nn.relu(norm()(x))
        for i, count in enumerate(self.stages):
            for b in range(count):
                x = self.block(64 * 2**i, 2 if b == 0 and i > 0 else 1)(x)
        return nn.Dense(self.classes)(x.mean(axis=(1, 2)))


MODELS = {
    "resnet18": ResNet((2, 2, 2, 2), BasicBlock),
    "resnet50": ResNet((3, 4, 6, 3), Bottleneck),
}


def workload(name: str, batch: int, image: int):
    model = MODELS[name]
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((batch, image, image, 3)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 10, batch))
    variables = model.init(jax.random.PRNGKey(0), x)
    opt = optax.sgd(0.1, momentum=0.9)

    def step(params, opt_state, stats, x, labels):
        def loss_fn(p):
            logits, updates = model.apply(
                {"params": p, "batch_stats": stats}, x, mutable=["batch_stats"]
            )
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, updates["batch_stats"]

        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, stats, loss

    params = variables["params"]
    return step, [params, opt.init(params), variables["batch_stats"]], [x, labels]


def timed(fn, state, inputs) -> tuple[float, list]:
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*state, *inputs))
    return time.perf_counter() - start, list(out[:3])


def run(name: str, batch: int, image: int, runs: int) -> dict:
    step, state, inputs = workload(name, batch, image)
    fused = jgsess.jit(step, donate_argnums=(0, 1, 2))
    report = fused.report(*state, *inputs)
    variants = {"jax.jit": jax.jit(step, donate_argnums=(0, 1, 2)), "jgsess.jit": fused}
    states = {k: jax.tree.map(jnp.copy, state) for k in variants}
    times = {k: [] for k in variants}
    for i in range(runs + 2):
        for k, fn in variants.items():
            seconds, states[k] = timed(fn, states[k], inputs)
            if i >= 2:  # two warm-up rounds
                times[k].append(seconds)
    medians = {k: statistics.median(t) for k, t in times.items()}
    return {"name": name, **medians, "report": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="resnet18,resnet50")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    os.environ.setdefault("JGSESS_AUTOTUNE", "1")
    os.environ.setdefault("JGSESS_AUTOTUNE_CACHE", os.path.join(tempfile.mkdtemp(), "at.json"))
    print(f"{jax.devices()[0].device_kind}, batch {args.batch}, {args.image}x{args.image} images")
    for name in args.workloads.split(","):
        r = run(name, args.batch, args.image, args.runs)
        report = r["report"]
        fusions = {k: v for k, v in report.fusions.items() if k.startswith("batch_norm")}
        print(
            f"{name:<10} jax.jit {r['jax.jit'] * 1e3:8.2f} ms  jgsess.jit "
            f"{r['jgsess.jit'] * 1e3:8.2f} ms  speedup {r['jax.jit'] / r['jgsess.jit']:.3f}x",
            flush=True,
        )
        print(f"    fused: {fusions}")
        for m in report.selection:
            print(
                f"    selection: {m.kernel:<46} -> {m.impl:<6} kernel {m.kernel_s * 1e3:.3f} ms,"
                f" xla {m.xla_s * 1e3:.3f} ms"
            )
        declined = report.session.record.declined
        if declined:
            print(f"    not taken: {len(declined)} ({declined[0][2]} ...)")


if __name__ == "__main__":
    main()
