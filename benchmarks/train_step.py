"""Train-step benchmark: real flax train steps under jax.jit and under jgsess.jit.

Workloads (small inputs, so the step fits a 2-core CPU; the optimizer is a real share of it):

  resnet18          flax ResNet-18 with BatchNorm (batch statistics in the state), 32x32
                    images, SGD with momentum 0.9 and weight decay (benchmarks/resnet.py)
  resnet50          flax ResNet-50 (bottlenecks), 32x32 images, SGD with momentum 0.9
  transformer       a 4-layer pre-norm transformer encoder (width 256), AdamW with a
                    warmup-cosine schedule and gradient clipping
  efficientnet      an EfficientNet-like net (strided depthwise convolutions, squeeze-excite,
                    BatchNorm), SGD with Nesterov momentum and a cosine schedule
  lora              a frozen 100-layer MLP with 200 LoRA adapter leaves (rank 4), AdamW on the
                    adapters only

Both variants run the same unmodified step function with params and optimizer state donated,
each jitting its own function object (so neither reuses the other's trace), in one process,
interleaved round after round after warm-up. Each reports the median step time and the first
call's time (trace, compile and run); the speed-up is the median over rounds of the two
variants' ratio in that round, which cancels the machine's drift between rounds. A third
variant jits the step with jax.jit once more: its paired ratio to the first (`jax.jit /
itself`) is what the same program measures against itself, the noise floor of the run.

    python benchmarks/train_step.py [--workloads resnet18,lora] [--runs 31] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import jgsess

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402
from param_sets import EFFICIENTNET_B0_STAGES  # noqa: E402
from resnet import MODELS as RESNETS  # noqa: E402


def log(message: str) -> None:
    print(message, flush=True)


class EfficientBlock(nn.Module):
    cout: int
    expand: int
    kernel: int
    stride: int = 1

    @nn.compact
    def __call__(self, x, train: bool):
        norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9)
        cin = x.shape[-1]
        mid = cin * self.expand
        y = nn.swish(norm()(nn.Conv(mid, (1, 1), use_bias=False)(x))) if self.expand > 1 else x
        y = nn.Conv(mid, (self.kernel,) * 2, self.stride, feature_group_count=mid, use_bias=False)(
            y
        )
        y = nn.swish(norm()(y))
        s = y.mean(axis=(1, 2), keepdims=True)
        s = nn.sigmoid(nn.Conv(mid, (1, 1))(nn.swish(nn.Conv(max(1, cin // 4), (1, 1))(s))))
        y = norm()(nn.Conv(self.cout, (1, 1), use_bias=False)(y * s))
        return x + y if x.shape == y.shape else y


class EfficientNetLike(nn.Module):
    classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.swish(nn.BatchNorm(use_running_average=not train)(nn.Conv(32, (3, 3), 2)(x)))
        for expand, kernel, cout, repeats, stride in EFFICIENTNET_B0_STAGES[:-1]:
            for i in range(repeats):
                x = EfficientBlock(cout, expand, kernel, stride if i == 0 else 1)(x, train)
        x = nn.swish(nn.BatchNorm(use_running_average=not train)(nn.Conv(640, (1, 1))(x)))
        return nn.Dense(self.classes)(x.mean(axis=(1, 2)))


class EncoderLayer(nn.Module):
    width: int = 256
    heads: int = 4

    @nn.compact
    def __call__(self, x):
        y = nn.MultiHeadDotProductAttention(self.heads)(nn.LayerNorm()(x))
        x = x + y
        y = nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(nn.LayerNorm()(x))))
        return x + y


class Transformer(nn.Module):
    vocab: int = 1000
    width: int = 256
    layers: int = 4

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.width)(tokens)
        x = x + self.param("pos", nn.initializers.normal(0.02), (tokens.shape[1], self.width))
        for _ in range(self.layers):
            x = EncoderLayer(self.width)(x)
        return nn.Dense(self.vocab)(nn.LayerNorm()(x))


def batchnorm_workload(model: nn.Module, opt, image: int, batch: int):
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (batch, image, image, 3))
    y = jax.random.randint(jax.random.fold_in(key, 1), (batch,), 0, 10)
    variables = model.init(key, x)
    params, stats = variables["params"], variables["batch_stats"]

    def step(params, opt_state, stats, x, y):
        def loss_fn(p):
            logits, new = model.apply(
                {"params": p, "batch_stats": stats}, x, mutable=["batch_stats"]
            )
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, new["batch_stats"]

        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, stats, loss

    return step, (params, opt.init(params), stats), (x, y), 3


def transformer_workload():
    model = Transformer()
    key = jax.random.PRNGKey(0)
    tokens = jax.random.randint(key, (8, 65), 0, 1000)  # 64 inputs, each predicting the next
    params = model.init(key, tokens[:, :-1])
    opt = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 1000), weight_decay=0.01),
    )

    def step(params, opt_state, tokens):
        def loss_fn(p):
            logits = model.apply(p, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, opt.init(params)), (tokens,), 2


def lora_workload(layers: int = 100, width: int = 256, rank: int = 4):
    key = jax.random.PRNGKey(0)
    keys = iter(jax.random.split(key, 4 * layers + 2))
    base = [jax.random.normal(next(keys), (width, width)) / width**0.5 for _ in range(layers)]
    adapters = {
        f"layer{i:03d}": {
            "a": jax.random.normal(next(keys), (width, rank)) * 0.01,
            "b": jnp.zeros((rank, width)) + 1e-3 * jax.random.normal(next(keys), (rank, width)),
        }
        for i in range(layers)
    }  # 200 adapter leaves
    x = jax.random.normal(next(keys), (32, width))
    target = jax.random.normal(next(keys), (32, width))
    opt = optax.adamw(1e-3, weight_decay=1e-4)

    def step(adapters, opt_state, base, x, target):
        def loss_fn(ad):
            h = x
            for i, w in enumerate(base):
                a = ad[f"layer{i:03d}"]
                h = jnp.tanh(h @ w + (h @ a["a"]) @ a["b"])
            return jnp.mean((h - target) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(adapters)
        updates, opt_state = opt.update(grads, opt_state, adapters)
        return optax.apply_updates(adapters, updates), opt_state, loss

    return step, (adapters, opt.init(adapters)), (base, x, target), 2


WORKLOADS: dict[str, Callable] = {
    "resnet18": lambda: batchnorm_workload(
        RESNETS["resnet18"],
        optax.chain(optax.add_decayed_weights(5e-4), optax.sgd(0.1, 0.9)),
        32,
        8,
    ),
    "resnet50": lambda: batchnorm_workload(RESNETS["resnet50"], optax.sgd(0.1, 0.9), 32, 8),
    "transformer": transformer_workload,
    "efficientnet": lambda: batchnorm_workload(
        EfficientNetLike(),
        optax.sgd(optax.cosine_decay_schedule(0.1, 1000), momentum=0.9, nesterov=True),
        64,
        4,
    ),
    "lora": lora_workload,
}


def run_workload(name: str, runs: int, warmup: int) -> dict:
    step, state, inputs, carried = WORKLOADS[name]()
    donate = tuple(range(carried))
    variants = {  # each its own function object: jax's caches are keyed by the function
        "jax.jit": jax.jit(lambda *a: step(*a), donate_argnums=donate),
        "jgsess.jit": jgsess.jit(lambda *a: step(*a), donate_argnums=donate),
        # the same jax.jit step once more: its ratio to the first is the noise floor
        "jax.jit again": jax.jit(lambda *a: step(*a), donate_argnums=donate),
    }
    states, first = {}, {}
    for variant, fn in variants.items():
        s = jax.tree.map(jnp.copy, state)
        start = time.perf_counter()
        out = fn(*s, *inputs)
        jax.block_until_ready(out)
        first[variant] = time.perf_counter() - start
        for _ in range(warmup):
            out = fn(*out[:carried], *inputs)
        jax.block_until_ready(out)
        states[variant] = out[:carried]
    times = {v: [] for v in variants}
    order = list(variants)
    for r in range(runs):
        for variant in order[r % len(order) :] + order[: r % len(order)]:
            start = time.perf_counter()
            out = variants[variant](*states[variant], *inputs)
            jax.block_until_ready(out)
            times[variant].append(time.perf_counter() - start)
            states[variant] = out[:carried]
    ms = {v: statistics.median(t) * 1e3 for v, t in times.items()}

    def paired(other: str) -> float:
        return statistics.median(a / b for a, b in zip(times["jax.jit"], times[other]))

    report = variants["jgsess.jit"].report(*state, *inputs)
    fusions = dict(report.fusions)
    log(
        f"  {name}: "
        + ", ".join(f"{v} {ms[v]:.2f} ms (first call {first[v]:.1f} s)" for v in variants)
        + f"; fused {fusions}"
    )
    for m in report.selection:  # what measured selection chose, with its two timings
        both = f"kernel {m.kernel_s * 1e3:.3f} ms, xla {m.xla_s * 1e3:.3f} ms"
        log(f"    selection: {m.kernel} -> {m.impl} ({both})")
    leaves = len(jax.tree.leaves(state[0]))
    return {
        "workload": name,
        "leaves": leaves,
        "ms": ms,
        "speedup": paired("jgsess.jit"),
        "noise": paired("jax.jit again"),
        "first_s": first,
        "fusions": fusions,
    }


def table(results: list[dict]) -> str:
    from jgsess.report import table as render

    rows = []
    for r in results:
        base, ours = r["ms"]["jax.jit"], r["ms"]["jgsess.jit"]
        rows.append(
            [
                f"{r['workload']} ({r['leaves']} leaves)",
                f"{base:.2f}",
                f"{ours:.2f}",
                f"{r['speedup']:.2f}x",
                f"{r['noise']:.2f}x",
                f"{r['first_s']['jax.jit']:.1f}",
                f"{r['first_s']['jgsess.jit']:.1f}",
                f"{r['first_s']['jax.jit again']:.1f}",
            ]
        )
    headers = [
        "workload",
        "jax.jit ms",
        "jgsess.jit ms",
        "speed-up (paired)",
        "jax.jit / itself",
        "first call s (jax)",
        "first call s (jgsess)",
        "first call s (jax, again)",
    ]
    return render(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--runs", type=int, default=31)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log(f"jax {jax.__version__}, {jax.default_backend()}, {os.cpu_count()} CPUs")
    results = [run_workload(w, args.runs, args.warmup) for w in args.workloads.split(",")]
    notes = f"medians of {args.runs} interleaved rounds"
    record.save(args.out, "train_step", table(results), results, notes)
    log("")
    log(notes)
    log(table(results))


if __name__ == "__main__":
    main()
