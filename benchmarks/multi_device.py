"""AdamW and momentum steps over 4 CPU devices: jax.jit vs jgsess.jit, interleaved, one process.

    python benchmarks/multi_device.py [--runs 7] [--sets resnet50,bert-base]

Each parameter set (benchmarks/param_sets.py) is updated in three layouts: on one device (the
single-device ratio, for comparison), data-parallel (parameters and state replicated over the 4
devices) and FSDP (each array split on its first dimension 4 divides, replicated otherwise).
Parameters and state are donated; the two compiled steps run alternately and the medians are
compared. The device count is forced before jax starts (4 host devices sharing this machine's
cores, so a step's time is that of the whole mesh).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import param_sets  # noqa: E402

import jgsess  # noqa: E402

OPTIMIZERS = {
    "adamw": lambda: optax.adamw(1e-3, weight_decay=1e-2),
    "momentum": lambda: optax.sgd(0.1, momentum=0.9),
}
SETS = {"resnet50": param_sets.resnet50, "bert-base": param_sets.bert_base}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def layouts(mesh: Mesh) -> dict:
    n = mesh.devices.size

    def fsdp(shape):
        for d, size in enumerate(shape):
            if size % n == 0:
                return NamedSharding(mesh, P(*([None] * d), "d"))
        return NamedSharding(mesh, P())

    return {
        "one device": lambda shape: jax.devices()[0],
        "data-parallel": lambda shape: NamedSharding(mesh, P()),
        "fsdp": fsdp,
    }


def step_of(opt):
    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


def time_pair(shapes, place, optimizer: str, runs: int) -> tuple[float, float]:
    """Median ms per step of jax.jit and jgsess.jit, run alternately."""
    opt = OPTIMIZERS[optimizer]()
    key = jax.random.PRNGKey(0)
    grads = [jax.device_put(0.01 * jnp.ones(s), place(s)) for s in shapes]
    step = step_of(opt)
    fns = [jax.jit(step, donate_argnums=(0, 1)), jgsess.jit(step, donate_argnums=(0, 1))]
    states = []
    for _ in fns:  # one copy of the parameters and state per variant, nothing more
        p = [
            jax.device_put(0.1 * jax.random.normal(jax.random.fold_in(key, i), s), place(s))
            for i, s in enumerate(shapes)
        ]
        states.append((p, opt.init(p)))
    times: list[list[float]] = [[], []]
    for r in range(runs + 2):
        for k, fn in enumerate(fns):
            start = time.perf_counter()
            states[k] = jax.block_until_ready(fn(*states[k], grads))
            if r >= 2:  # compile and one warm-up
                times[k].append(1e3 * (time.perf_counter() - start))
    return statistics.median(times[0]), statistics.median(times[1])


def bucketing(shapes, mesh: Mesh, runs: int) -> tuple[float, float, object]:
    """A shard_map body that pmeans each gradient leaf: median ms of jax.jit and of jgsess.jit
    with the leaves bucketed (JGSESS_BUCKETS=on), and the pass's own measured choice."""

    def body(*grads):
        return tuple(jax.lax.pmean(g, "d") for g in grads)

    fn = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P())
    grads = [jax.device_put(jnp.ones(s), NamedSharding(mesh, P())) for s in shapes]
    choice = jgsess.jit(fn).report(*grads).buckets
    os.environ["JGSESS_BUCKETS"] = "on"
    fns = [jax.jit(fn), jgsess.jit(fn)]
    times: list[list[float]] = [[], []]
    for r in range(runs + 2):
        for k, f in enumerate(fns):
            start = time.perf_counter()
            jax.block_until_ready(f(*grads))
            if r >= 2:
                times[k].append(1e3 * (time.perf_counter() - start))
    del os.environ["JGSESS_BUCKETS"]
    return statistics.median(times[0]), statistics.median(times[1]), choice


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sets", default=",".join(SETS))
    args = parser.parse_args()
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    rows = []
    for name in args.sets.split(","):
        shapes = SETS[name]()
        for optimizer in OPTIMIZERS:
            for layout, place in layouts(mesh).items():
                log(f"{name} {optimizer} {layout} ...")
                plain, fused = time_pair(shapes, place, optimizer, args.runs)
                rows.append((name, optimizer, layout, plain, fused))
    print(
        "| set | optimizer | layout | jax.jit ms | jgsess.jit ms | speedup | of 1-device speedup |"
    )
    print("|---|---|---|---|---|---|---|")
    single = {(r[0], r[1]): r[3] / r[4] for r in rows if r[2] == "one device"}
    for name, optimizer, layout, plain, fused in rows:
        share = (plain / fused) / single[(name, optimizer)]
        print(
            f"| {name} | {optimizer} | {layout} | {plain:.2f} | {fused:.2f} | "
            f"{plain / fused:.2f}x | {share:.2f} |"
        )
    print()
    print(
        "| gradients pmean'd per leaf in shard_map | jax.jit ms | bucketed ms | pass measured "
        "(as written / bucketed) | pass chose |"
    )
    print("|---|---|---|---|---|")
    for name in args.sets.split(","):
        log(f"{name} bucketing ...")
        plain, fused, choices = bucketing(SETS[name](), mesh, args.runs)
        measured = "; ".join(
            f"{c.written_ms:.2f} / {c.bucketed_ms:.2f} ms in {len(c.buckets)} bucket(s)"
            for c in choices
        )
        chose = "; ".join("bucketed" if c.taken else "as written" for c in choices)
        print(f"| {name} | {plain:.2f} | {fused:.2f} | {measured} | {chose} |")


if __name__ == "__main__":
    main()
