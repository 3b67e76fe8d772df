"""Optimizer-step benchmark: the same optax update under jax.jit, jgsess and torch's fused
optimizers, and the jgsess kernels alone against the machine's in-place ceiling.

For each parameter set (real model shapes, benchmarks/param_sets.py), optimizer (AdamW, SGD
with momentum 0.9) and dtypes (`f32`; `bf16`, `f16`: narrow parameters and optax's default
state, in their dtype too, as torch keeps it; `bf16-f32-state`: bf16 parameters, f32 mu /
accumulator (optax's mu_dtype / accumulator_dtype; AdamW's nu stays bf16); `bf16-state`: f32
parameters with a bf16 mu / accumulator), these variants run one step `(params, state, grads)
-> (params, state)` with params and state donated:

  jax.jit            optax's update + apply_updates, compiled by XLA
  jgsess.jit         the same unmodified function, compiled by jgsess.jit
  jgsess.optim       jgsess.optim's fused step (update and apply in the kernel)
  jgsess.optim in your jax.jit
                     the jax.jit step with optax's transformation swapped for jgsess.optim's:
                     its update is a program nested in the step, whose apply_updates reads it
  flax TrainState    `TrainState.apply_gradients` with jgsess.optim's transformation, in the
                     user's jax.jit
  ..., scan of 4     jax.jit, jgsess.jit and jgsess.optim in your jax.jit over a `lax.scan` of
                     4 steps (the gradients a loop constant), timed per step
  optax.flatten      optax.flatten(optimizer) under jax.jit (one concatenated vector)
  torch fused        torch.optim.AdamW(fused=True) / torch.optim.SGD(momentum=0.9,
                     fused=True), when torch is installed (`pip install .[bench]`), where its
                     state has optax's dtypes (f32, bf16): it computes in f32 and rounds what
                     it stores, where optax's bf16 update rounds every operation
  jgsess.optim f32_math, kernel, f32 math
                     (bf16 and f16) jgsess.optim.f32_math's fused step, and its kernel alone:
                     the update computed in f32 and rounded once when stored, as torch's fused
                     optimizers do (a change of numbers; the other variants keep optax's)
  kernel             the jgsess kernel alone (its primitive under jax.jit, in place, one call
                     over every tensor where jgsess.jit makes calls of at most 128): what the
                     CPU kernel itself reaches. It computes what jgsess.jit's program computes,
                     and as fast: timed beside jgsess.jit alone it was within 3% of it (resnet50
                     AdamW f32 24.7 / 24.1 ms, bert-base 90.0 / 92.8 ms), and so it was beside
                     every variant over 7 rounds (momentum f32: resnet50 14.81 / 14.45 ms,
                     bert-base 58.70 / 57.08 ms). Where a table shows it slower, the rounds'
                     order put it right after other variants' steps: in the published run, after
                     jax.jit (twice), optax.flatten and torch in 4 of 5 rounds (a step right
                     after optax.flatten's measured ~11% slower, jgsess.jit's too)
  nothing computed   a donated step that returns its parameters and state as they are: what
                     JAX's runtime alone costs for the step's arrays (every JAX variant pays it)

All variants of a parameter set, optimizer and dtype live in one process (a fresh one for each
such row: XLA's compilations of earlier rows would otherwise pile up, and the 1,000-leaf set ran
out of LLVM memory after the others) and run interleaved, round after round, after warm-up (each
round times `--steps` consecutive steps of each variant, 1 by default, in an order shuffled each
round: a step that follows optax.flatten's runs cold, ~11% slower on resnet50 AdamW f32, and a
fixed order had the kernel variant follow it every round); each reports the median of its runs.
The ceiling is an in-place stream in C++ with exactly the optimizer's traffic
(AdamW: read p, g, m, v and write p, m, v in place; momentum: read p, g, acc and write p, acc),
measured in the same run on one large tensor, at the start and at the end (the better of the
two); every variant reports its share of it, and of the STREAM triad (a = b + s*c, which also
pays write-allocate traffic) as a second column. Bytes counted per parameter: AdamW 28 (f32), 14
(bf16, f16), 18 (bf16-f32-state) or 24 (bf16-state), momentum 20, 10, 14 or 16.

`--cpus 2,1` also times the kernels alone on one CPU (each row, and the ceilings, in a process
pinned to the first N CPUs before jax makes its thread pool): what one core does, against the
ceiling one core reaches; the log says how the CPUs map to cores. The `kernel` row of `f16` is
the kernel whatever jgsess.jit takes: on a CPU, XLA's code for an f16 AdamW with bias
correction (its probe finds XLA's f16 rounding unlike the kernel's) and for any f16 update
where the CPU has f16 arithmetic, and the faster measured for f16 momentum.

    python benchmarks/optimizer_step.py [--sets resnet50,bert-base] [--dtypes f32,bf16,bf16-state]
        [--optimizers adamw,momentum] [--cpus 2,1] [--runs 9] [--steps 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import random
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import record  # noqa: E402
import roofline  # noqa: E402
from param_sets import SETS  # noqa: E402

import jgsess  # noqa: E402
from jgsess import _C  # noqa: E402
from jgsess.kernels import adamw, momentum  # noqa: E402
from tests.native import module as probes  # noqa: E402  (the bandwidth probes: make bench)

# name -> (parameter and gradient dtype, dtype of the first state array: m or acc, None for
# optax's default: the parameters'); AdamW's second moment always has the parameters' dtype
DTYPES = {
    "f32": (jnp.float32, None),
    "bf16": (jnp.bfloat16, None),
    "f16": (jnp.float16, None),
    "bf16-f32-state": (jnp.bfloat16, jnp.float32),
    "bf16-state": (jnp.float32, jnp.bfloat16),
}
TRAFFIC = {"adamw": (4, 3), "momentum": (3, 2)}  # arrays read, arrays written back in place
NOTHING = "nothing computed"
IN_YOUR_JIT = "jgsess.optim in your jax.jit"
F32_MATH = "jgsess.optim f32_math"
F32_MATH_KERNEL = "f32 math"
KERNELS = ("kernel", f"kernel, {F32_MATH_KERNEL}")  # the variants timed on fewer CPUs
SCAN = 4  # steps in the scanned variants' one program


def optimizers(state_dtype):
    """name -> (optax transformation, jgsess.optim transformation), the first moment or the
    accumulator in `state_dtype` (optax's mu_dtype / accumulator_dtype)."""
    return {
        "adamw": (
            lambda: optax.adamw(1e-3, weight_decay=1e-4, mu_dtype=state_dtype),
            lambda: jgsess.optim.adamw(1e-3, weight_decay=1e-4, mu_dtype=state_dtype),
        ),
        "momentum": (
            lambda: optax.sgd(1e-2, momentum=0.9, accumulator_dtype=state_dtype),
            lambda: jgsess.optim.sgd(1e-2, momentum=0.9, accumulator_dtype=state_dtype),
        ),
    }


def itemsizes(dtype_name: str) -> tuple[int, int]:
    """Bytes per element of (p and g, the first state array); a second moment has p's."""
    param, state = DTYPES[dtype_name]
    return jnp.dtype(param).itemsize, jnp.dtype(state or param).itemsize


def bytes_per_param(optimizer: str, dtype_name: str) -> int:
    return roofline.bytes_per_element(optimizer, *itemsizes(dtype_name))


def log(message: str) -> None:
    print(message, flush=True)


def ceilings(n: int = 1 << 24, runs: int = 7) -> dict:
    """(optimizer, dtype name) -> in-place GB/s, and "triad" -> STREAM triad GB/s. On a GPU:
    a device-to-device copy for all of them."""
    if jax.default_backend() != "cpu":
        copy = device_copy_gbps(n, runs)
        return {"triad": copy, **{(o, d): copy for o in TRAFFIC for d in DTYPES}}
    out = {"triad": probes().stream_triad_gbps(n, runs)}
    for optimizer, (reads, writes) in TRAFFIC.items():
        for name in DTYPES:
            param, state = itemsizes(name)
            out[optimizer, name] = probes().stream_inplace_gbps(
                n, reads, writes, param, state, runs, rest_bytes=param
            )
    return out


def device_copy_gbps(n: int, runs: int) -> float:
    """A device-to-device copy of n f32 (CuPy's memcpy), 8 bytes per element counted; XLA's
    copy-like `scale` where CuPy is missing."""
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
        return 8 * n / best / 1e9
    except ImportError:
        scale = jax.jit(lambda a, b: b * 1.0001, donate_argnums=0)
        a, b = jnp.zeros((n,)), jnp.ones((n,))
        a = scale(a, b).block_until_ready()
        times = []
        for _ in range(runs):
            begin = time.perf_counter()
            a = scale(a, b).block_until_ready()
            times.append(time.perf_counter() - begin)
        return 8 * n / min(times) / 1e9


class JaxVariant:
    """A step `(params, state, grads) -> (params, state)` on its own copy of the state."""

    steps_per_call = 1

    def __init__(self, fn, init, params, grads):
        self.fn, self.grads = fn, grads
        self.params = [jnp.copy(x) for x in params]
        self.state = init(self.params)

    def step(self) -> None:
        self.params, self.state = self.fn(self.params, self.state, self.grads)
        jax.block_until_ready((self.params, self.state))


class ScanVariant(JaxVariant):
    """SCAN steps in one program (`lax.scan`, the gradients a loop constant), timed per step."""

    steps_per_call = SCAN

    @staticmethod
    def of(step):
        def steps(params, state, grads):
            def body(carry, _):
                return step(*carry, grads), None

            return jax.lax.scan(body, (params, state), None, length=SCAN)[0]

        return steps


class TrainStateVariant:
    """flax's TrainState: `state.apply_gradients(grads=...)` in the user's jax.jit, donated."""

    def __init__(self, tx, params, grads):
        from flax.training import train_state

        params = [jnp.copy(x) for x in params]
        self.state = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
        self.fn = jax.jit(lambda state, g: state.apply_gradients(grads=g), donate_argnums=0)
        self.grads = grads

    def step(self) -> None:
        self.state = self.fn(self.state, self.grads)
        jax.block_until_ready(self.state)


class KernelVariant(JaxVariant):
    """The jgsess kernel alone: its primitive, every result written over its operand. Narrow
    parameters with their state in their dtype run the narrow form (each operation rounded, its
    hyper-parameters values of that dtype, as jgsess.jit's node has them), or with `f32_math`
    the f32 form on the narrow buffers (jgsess.optim.f32_math's)."""

    def __init__(self, optimizer, params, grads, state_dtype, f32_math=False):
        spec, flags = (
            (adamw.SPEC, adamw.OPTAX_ADAMW) if optimizer == "adamw" else (momentum.SPEC, 0)
        )
        dtype = params[0].dtype
        narrow = dtype != jnp.float32 and state_dtype is None and not f32_math
        if narrow:  # the update written in bf16 / f16
            flags |= adamw.Flag.NARROW if optimizer == "adamw" else momentum.Flag.NARROW
        elif dtype != jnp.float32 and optimizer == "adamw" and state_dtype is not None:
            flags |= adamw.Flag.MIXED  # f32 mu, bf16 nu
        scalars = [0.9, 0.1, 0.999, 0.001, 0.5, 0.25, 1e-8, 0.0, 1e-4, 1e-3, 1.0, 1.0, 1.0]
        if optimizer == "momentum":
            scalars = [1e-2, 0.9, 0.0, 1.0]
        self.scalars = [jnp.float32(jnp.asarray(s, dtype) if narrow else s) for s in scalars]
        per_tensor = spec.tensors.operands
        state = per_tensor - 2
        base = len(scalars)
        pairs = spec.inplace({"flags": flags}, base + per_tensor * len(params))
        aliases = tuple(sorted(pairs.items()))
        donate = tuple(sorted({i for i, _ in aliases}))
        bind = jax.jit(
            lambda *ops: spec.primitive.bind(*ops, flags=flags, aliases=aliases, workspace=None),
            donate_argnums=donate,
        )
        self.fn = bind
        self.grads = grads
        self.operands = list(self.scalars)
        for p, g in zip(params, grads):
            moments = [jnp.full(p.shape, 1e-3, p.dtype)] * state  # v: the parameters' dtype
            moments[0] = moments[0].astype(state_dtype or p.dtype)
            self.operands += [jnp.copy(p), g, *moments]
        self.operands = [jnp.copy(x) for x in self.operands]
        self.base, self.per_tensor = base, per_tensor

    def step(self) -> None:
        outs = self.fn(*self.operands)
        jax.block_until_ready(outs)
        results = len(outs) // ((len(self.operands) - self.base) // self.per_tensor)
        tensors = []
        for t, g in enumerate(self.grads):
            out = outs[t * results : (t + 1) * results]
            tensors += [out[0], g, *out[1:]]
        self.operands = self.scalars + tensors


class TorchVariant:
    """torch's fused optimizer step over the same shapes and dtype (grads set once): on the CPU,
    or on the GPU (its fused CUDA kernels) where the benchmark runs on one."""

    def __init__(self, optimizer, params, grads):
        import numpy as np
        import torch

        as_torch = {jnp.float32: torch.float32, jnp.bfloat16: torch.bfloat16}
        as_torch[jnp.float16] = torch.float16
        self.device = "cpu" if jax.default_backend() == "cpu" else "cuda"

        def tensor(x):
            dtype = as_torch[jnp.dtype(x.dtype).type]
            return torch.from_numpy(np.asarray(x, np.float32)).to(self.device, dtype)

        self.params = [torch.nn.Parameter(tensor(p)) for p in params]
        for p, g in zip(self.params, grads):
            p.grad = tensor(g)
        if optimizer == "adamw":
            self.opt = torch.optim.AdamW(self.params, lr=1e-3, weight_decay=1e-4, fused=True)
        else:
            self.opt = torch.optim.SGD(self.params, lr=1e-2, momentum=0.9, fused=True)
        self.sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        # torch's OpenMP threads can thrash on a busy machine (seen: 1.6 s with 2 threads, 8 ms
        # with 1, same step): torch gets the faster of all cores and one thread, timed here
        self.threads = min((os.cpu_count(), 1), key=lambda n: self._time(torch, n))
        torch.set_num_threads(self.threads)

    def _time(self, torch, threads: int) -> float:
        torch.set_num_threads(threads)
        self.step()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            self.step()
            times.append(time.perf_counter() - start)
        return min(times)

    def step(self) -> None:
        self.opt.step()
        self.sync()


def torch_available() -> bool:
    """torch is installed, with CUDA where the benchmark runs on a GPU."""
    try:
        import torch
    except ImportError:
        return False
    return jax.default_backend() == "cpu" or torch.cuda.is_available()


def make_variants(optimizer: str, dtype_name: str, params, grads) -> dict:
    param_dtype, state_dtype = DTYPES[dtype_name]
    make_optax, make_fused = optimizers(state_dtype)[optimizer]
    opt = make_optax()

    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    flat = optax.flatten(make_optax())

    def flat_step(params, state, grads):
        updates, state = flat.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    fused_step = jgsess.optim.fused_step(make_fused())
    fused = make_fused()

    def fused_in_jit(params, state, grads):  # the user's step, optax swapped for jgsess.optim
        updates, state = fused.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    variants = {
        "jax.jit": lambda: JaxVariant(
            jax.jit(step, donate_argnums=(0, 1)), opt.init, params, grads
        ),
        "jgsess.jit": lambda: JaxVariant(
            jgsess.jit(step, donate_argnums=(0, 1)), opt.init, params, grads
        ),
        "jgsess.optim": lambda: JaxVariant(
            lambda p, s, g: fused_step(p, g, s), make_fused().init, params, grads
        ),
        IN_YOUR_JIT: lambda: JaxVariant(
            jax.jit(fused_in_jit, donate_argnums=(0, 1)), fused.init, params, grads
        ),
        "flax TrainState": lambda: TrainStateVariant(make_fused(), params, grads),
        f"jax.jit, scan of {SCAN}": lambda: ScanVariant(
            jax.jit(ScanVariant.of(step), donate_argnums=(0, 1)), opt.init, params, grads
        ),
        f"jgsess.jit, scan of {SCAN}": lambda: ScanVariant(
            jgsess.jit(ScanVariant.of(step), donate_argnums=(0, 1)), opt.init, params, grads
        ),
        f"{IN_YOUR_JIT}, scan of {SCAN}": lambda: ScanVariant(
            jax.jit(ScanVariant.of(fused_in_jit), donate_argnums=(0, 1)), fused.init, params, grads
        ),
        "optax.flatten": lambda: JaxVariant(
            jax.jit(flat_step, donate_argnums=(0, 1)), flat.init, params, grads
        ),
        "kernel": lambda: KernelVariant(optimizer, params, grads, state_dtype),
        NOTHING: lambda: JaxVariant(
            jax.jit(lambda p, s, g: (p, s), donate_argnums=(0, 1)), opt.init, params, grads
        ),
    }
    if state_dtype is not None:
        del variants["optax.flatten"]  # its one vector is one dtype
    if param_dtype != jnp.float32 and state_dtype is not None:
        del variants["jgsess.optim"]  # f32 state of bf16 params
    if param_dtype != jnp.float32 and state_dtype is None:  # the choice of f32 math
        f32_tx = jgsess.optim.f32_math(make_fused())
        f32_step = jgsess.optim.fused_step(f32_tx)
        variants[F32_MATH] = lambda: JaxVariant(
            lambda p, s, g: f32_step(p, g, s), f32_tx.init, params, grads
        )
        variants[f"kernel, {F32_MATH_KERNEL}"] = lambda: KernelVariant(
            optimizer, params, grads, state_dtype, f32_math=True
        )
    if torch_available() and state_dtype is None:  # torch's state has p's dtype
        variants["torch fused"] = lambda: TorchVariant(optimizer, params, grads)
    return variants


def pin(cpus: int) -> None:
    """This process on its first `cpus` CPUs (before jax makes its CPU client, whose thread
    pool, which the kernels share their work with, takes the CPUs it may run on)."""
    if cpus < os.cpu_count():
        os.sched_setaffinity(0, set(range(cpus)))


def run_set(
    name: str,
    optimizer: str,
    dtype_name: str,
    runs: int,
    warmup: int,
    steps: int = 1,
    cpus: int | None = None,
) -> dict:
    cpus = cpus or os.cpu_count()
    pin(cpus)
    dtype = DTYPES[dtype_name][0]
    shapes = SETS[name]()
    count = sum(math.prod(s) for s in shapes)
    key = jax.random.PRNGKey(0)
    params = [
        (jax.random.normal(jax.random.fold_in(key, i), s) * 0.1).astype(dtype)
        for i, s in enumerate(shapes)
    ]
    grads = [(p * 0.01 + 1e-3).astype(dtype) for p in params]
    variants = {}
    for variant, make in make_variants(optimizer, dtype_name, params, grads).items():
        if cpus < os.cpu_count() and variant not in KERNELS:
            continue  # on fewer CPUs: the kernels alone
        start = time.perf_counter()
        variants[variant] = make()
        for _ in range(warmup):
            variants[variant].step()
        log(
            f"  {name}/{optimizer}/{dtype_name}: {variant:13s} compiled and warmed up in "
            f"{time.perf_counter() - start:5.1f} s"
        )
    del params
    times = {v: [] for v in variants}
    order, shuffle = list(variants), random.Random(0).shuffle
    for _ in range(runs):
        shuffle(order)
        for variant in order:
            start = time.perf_counter()
            for _ in range(steps):
                variants[variant].step()
            calls = steps * getattr(variants[variant], "steps_per_call", 1)
            times[variant].append((time.perf_counter() - start) / calls)
    medians = {v: statistics.median(t) for v, t in times.items()}
    log(
        f"  {name}/{optimizer}/{dtype_name}: "
        + ", ".join(f"{v} {t * 1e3:.2f} ms" for v, t in medians.items())
    )
    return {
        "set": name,
        "optimizer": optimizer,
        "dtype": dtype_name,
        "cpus": cpus,
        "leaves": len(shapes),
        "params": count,
        "bytes_per_param": bytes_per_param(optimizer, dtype_name),
        "ms": {v: t * 1e3 for v, t in medians.items()},
    }


def table(results: list[dict], ceiling: dict) -> str:
    from jgsess.report import table as render

    rows = []
    for r in results:
        base, torch_ms = r["ms"].get("jax.jit"), r["ms"].get("torch fused")
        moved = r["params"] * r["bytes_per_param"]
        ceilings_here = ceiling[r["cpus"]]
        inplace = ceilings_here[r["optimizer"], r["dtype"]]
        for variant, ms in r["ms"].items():
            gbps = moved / (ms / 1e3) / 1e9
            rates = [
                f"{base / ms:.2f}x" if base else "-",
                f"{torch_ms / ms:.2f}x" if torch_ms else "-",
                f"{gbps:.1f}",
                f"{gbps / inplace:.0%}",
                f"{gbps / ceilings_here['triad']:.0%}",
            ]
            rows.append(
                [
                    f"{r['set']} ({r['leaves']} arrays, {r['params'] / 1e6:.1f}M)",
                    f"{r['optimizer']} {r['dtype']}, {r['cpus']} CPU",
                    variant,
                    f"{ms:.2f}",
                    *(["-"] * len(rates) if variant == NOTHING else rates),
                ]
            )
    headers = [
        "parameter set",
        "optimizer",
        "variant",
        "ms/step",
        "vs jax.jit",
        "vs torch",
        "GB/s",
        "of in-place",
        "of triad",
    ]
    return render(headers, rows)


def plot(results: list[dict], ceiling: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["optimizer"], r["dtype"], r["cpus"]) for r in results))
    sets = list(dict.fromkeys(r["set"] for r in results))
    fig, axes = plt.subplots(
        len(panels), len(sets), figsize=(4.4 * len(sets), 3.8 * len(panels)), squeeze=False
    )
    colors = [plt.get_cmap("tab20")(i) for i in range(20)]
    for r in results:
        ax = axes[panels.index((r["optimizer"], r["dtype"], r["cpus"]))][sets.index(r["set"])]
        variants = [v for v in r["ms"] if v != NOTHING]
        moved = r["params"] * r["bytes_per_param"]
        gbps = [moved / (r["ms"][v] / 1e3) / 1e9 for v in variants]
        bars = ax.bar(variants, gbps, color=colors[: len(variants)])
        inplace = ceiling[r["cpus"]][r["optimizer"], r["dtype"]]
        ax.axhline(inplace, color="red", linestyle="--", label=f"in-place {inplace:.1f} GB/s")
        ax.axhline(ceiling[r["cpus"]]["triad"], color="gray", linestyle=":", label="triad")
        for bar, v in zip(bars, variants):
            ax.text(
                bar.get_x() + bar.get_width() / 2,
                bar.get_height(),
                f"{r['ms'][v]:.1f} ms",
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ax.set_title(f"{r['set']} / {r['optimizer']} {r['dtype']}, {r['cpus']} CPU", fontsize=10)
        ax.set_ylabel("GB/s moved")
        ax.tick_params(axis="x", labelrotation=60, labelsize=6)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"optimizer step on {jax.default_backend()} ({jax.devices()[0].device_kind})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cores() -> str:
    """How the CPUs this process may run on map to cores (Linux's topology)."""
    try:
        cores = {
            open(f"/sys/devices/system/cpu/cpu{c}/topology/core_id").read().strip()
            + "/"
            + open(f"/sys/devices/system/cpu/cpu{c}/topology/physical_package_id").read().strip()
            for c in sorted(os.sched_getaffinity(0))
        }
    except OSError:
        return f"{os.cpu_count()} CPUs"
    return f"{os.cpu_count()} CPUs on {len(cores)} cores (as the kernel reports the topology)"


def pinned_ceilings(cpus: int) -> dict:
    pin(cpus)
    return ceilings()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--optimizers", default=",".join(TRAFFIC))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument(
        "--cpus", default=str(os.cpu_count()), help="e.g. 2,1: the kernels alone on 1"
    )
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    counts = [int(c) for c in args.cpus.split(",")]
    log(
        f"jax {jax.__version__}, {jax.default_backend()} ({jax.devices()[0].device_kind}), "
        f"{cores()}, CPU kernels' vectors: {_C.simd_isa()}"
        + (", torch fused columns" if torch_available() else "")
    )
    spawn = multiprocessing.get_context("spawn")

    def measure_ceilings() -> dict:
        out = {}
        for cpus in counts:
            with spawn.Pool(1) as pool:  # pinned before it measures
                out[cpus] = pool.apply(pinned_ceilings, (cpus,))
        return out

    ceiling = measure_ceilings()
    log(f"ceilings (GB/s): {ceiling}")
    results = []
    for name in args.sets.split(","):
        for optimizer in args.optimizers.split(","):
            for dtype in args.dtypes.split(","):
                for cpus in counts:
                    row = (name, optimizer, dtype, args.runs, args.warmup, args.steps, cpus)
                    with spawn.Pool(1) as pool:  # a fresh process per row
                        results.append(pool.apply(run_set, row))
    again = measure_ceilings()
    ceiling = {
        cpus: {k: max(v, again[cpus][k]) for k, v in values.items()}
        for cpus, values in ceiling.items()
    }
    text = table(results, ceiling)
    plot(results, ceiling, os.path.join(args.out, "optimizer_step.png"))
    notes = (
        f"ms per step, medians of {args.runs} interleaved runs; {cores()}; ceilings (GB/s, best "
        "of start and end): "
        + "; ".join(
            f"{cpus} CPU: "
            + ", ".join(
                f"{k if isinstance(k, str) else ' '.join(k)} {v:.1f}" for k, v in values.items()
            )
            for cpus, values in ceiling.items()
        )
    )
    raw = {
        "ceilings": {
            str(cpus): {str(k): v for k, v in values.items()} for cpus, values in ceiling.items()
        },
        "results": results,
    }
    record.save(args.out, "optimizer_step", text, raw, notes)
    log("")
    log(notes)
    log(text)
    log(f"chart: {os.path.join(args.out, 'optimizer_step.png')}")


if __name__ == "__main__":
    main()
