"""AdamW and momentum steps over 4 CPU devices: jax.jit vs jgsess.jit, interleaved, one process.

    python benchmarks/multi_device.py [--runs 7] [--sets resnet50,bert-base]

Each parameter set (benchmarks/param_sets.py) is updated in three layouts: on one device (the
single-device ratio, for comparison), data-parallel (parameters and state replicated over the 4
devices) and FSDP (each array split on its first dimension 4 divides, replicated otherwise).
Parameters and state are donated. Each multi-device layout is timed together with the one-device
layout: every round runs the four compiled steps in turn, each three steps back to back (the
next dispatched while the last runs, as a training loop does; one wait at the end) and then
three steps waiting for each (one timing each: a single step's time on a shared machine varies
by 30% and more), so the two speed-ups see the same machine; the share is the median over
rounds of (multi-device speed-up / one-device speed-up).
FSDP rounds also time a donated step that computes nothing, on one device and under FSDP: its
extra time under FSDP is what jax's runtime alone costs for four shards of every array, which
both jits pay and no kernel removes. "runtime bound" is the share jgsess.jit would keep if its
FSDP step took its one-device time plus only that extra (per round, median over rounds).
The device count is forced before jax starts (4 host devices sharing this machine's cores, so a
step's time is that of the whole mesh).
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
import record  # noqa: E402

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


MODES = ("back to back", "waited for")


def nothing_computed(params, state, grads):
    return params, state


def time_layouts(
    shapes, places: dict, optimizer: str, runs: int, steps: int = 3
) -> dict[str, dict[str, list]]:
    """Per mode (MODES) and layout, the ms per step of jax.jit, of jgsess.jit and (where FSDP is
    timed) of a donated step computing nothing, in each round; every round runs `steps` steps of
    each layout's variants in each mode, layouts and variants in turn."""
    opt = OPTIMIZERS[optimizer]()
    key = jax.random.PRNGKey(0)
    step = step_of(opt)
    variants = [(jax.jit, step), (jgsess.jit, step)]
    if "fsdp" in places:  # one more copy of a replicated set would not fit BERT-base in 24 GB
        variants.append((jax.jit, nothing_computed))
    runners = []
    for layout, place in places.items():
        grads = [jax.device_put(0.01 * jnp.ones(s), place(s)) for s in shapes]
        for variant, (jit, step) in enumerate(variants):
            p = [  # one copy of the parameters and state per variant, nothing more
                jax.device_put(0.1 * jax.random.normal(jax.random.fold_in(key, i), s), place(s))
                for i, s in enumerate(shapes)
            ]
            fn = jit(step, donate_argnums=(0, 1))
            runners.append(
                {"key": (layout, variant), "fn": fn, "state": (p, opt.init(p)), "grads": grads}
            )
    times = {mode: {layout: [[] for _ in variants] for layout in places} for mode in MODES}
    for r in range(runs + 2):
        for runner in runners[r % 2 :] + runners[: r % 2]:
            for mode in MODES:
                start = time.perf_counter()
                for _ in range(steps):
                    runner["state"] = runner["fn"](*runner["state"], runner["grads"])
                    if mode == "waited for":
                        jax.block_until_ready(runner["state"])
                jax.block_until_ready(runner["state"])
                if r >= 2:  # compile and one warm-up
                    layout, variant = runner["key"]
                    elapsed = 1e3 * (time.perf_counter() - start) / steps
                    times[mode][layout][variant].append(elapsed)
    return times


def row(times: dict[str, list], layout: str) -> str:
    """The table's timing cells of one layout and mode: per round, (jax.jit ms, jgsess.jit ms
    and, under FSDP, nothing-computed ms) on one device and on `layout`."""
    (plain1, fused1, *nothing1), (plain, fused, *nothing) = times["one device"], times[layout]
    single = [a / b for a, b in zip(plain1, fused1)]
    speedups = [a / b for a, b in zip(plain, fused)]
    shares = [m / s for m, s in zip(speedups, single)]
    bound = ""
    if nothing:  # jgsess.jit's one-device time plus the runtime's extra for four shards
        extra = [max(0.0, n - n1) for n, n1 in zip(nothing[0], nothing1[0])]
        share = statistics.median(
            a / (b1 + e) / s for a, b1, e, s in zip(plain, fused1, extra, single)
        )
        bound = f"{share:.2f} (+{statistics.median(extra):.2f} ms)"
    return (
        f"{statistics.median(single):.2f}x | {statistics.median(plain):.2f} | "
        f"{statistics.median(fused):.2f} | {statistics.median(speedups):.2f}x | "
        f"{statistics.median(shares):.2f} | {bound}"
    )


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
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    lines: list[str] = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    emit(
        "| set | optimizer | layout | steps | 1-device speedup | jax.jit ms | jgsess.jit ms | "
        "speedup | of 1-device speedup (same rounds) | runtime bound |"
    )
    emit("|---|---|---|---|---|---|---|---|---|---|")
    places = layouts(mesh)
    single = places.pop("one device")
    for name in args.sets.split(","):
        shapes = SETS[name]()
        for optimizer in OPTIMIZERS:
            for layout, place in places.items():
                log(f"{name} {optimizer} {layout} (with one device) ...")
                times = time_layouts(
                    shapes, {"one device": single, layout: place}, optimizer, args.runs
                )
                for mode, by_layout in times.items():
                    emit(f"| {name} | {optimizer} | {layout} | {mode} | {row(by_layout, layout)} |")
    emit("")
    emit(
        "| gradients pmean'd per leaf in shard_map | jax.jit ms | bucketed ms | pass measured "
        "(as written / bucketed) | pass chose |"
    )
    emit("|---|---|---|---|---|")
    for name in args.sets.split(","):
        log(f"{name} bucketing ...")
        plain, fused, choices = bucketing(SETS[name](), mesh, args.runs)
        measured = "; ".join(
            f"{c.written_ms:.2f} / {c.bucketed_ms:.2f} ms in {len(c.buckets)} bucket(s)"
            for c in choices
        )
        chose = "; ".join("bucketed" if c.taken else "as written" for c in choices)
        emit(f"| {name} | {plain:.2f} | {fused:.2f} | {measured} | {chose} |")
    notes = f"4 forced CPU devices, medians of {args.runs} rounds"
    record.save(args.out, "multi_device", "\n".join(lines), None, notes)


if __name__ == "__main__":
    main()
