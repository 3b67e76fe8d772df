"""Kernel selection by measurement, cached on disk [GPUSession::SelectKernel].

For a fused node whose choice is not obvious (its spec has a cost model, `prefer_kernel`),
`choose` times the compiled kernel against XLA's code for the node's reference, on the current
device, with the node's shapes, dtypes and static params, and keeps the faster:

    jgsess.batch_norm_relu x g b    kernel 0.4 ms, xla 0.8 ms   ->   impl=kernel

Each side is compiled alone and run on random operands, interleaved, 5 to 51 times (about
50 ms each; the median counts). A compilation starts no new measurement once it has measured
for a quarter of the time its function took to trace (or `JGSESS_AUTOTUNE_BUDGET` seconds); the
first always runs. Past it, the cost model decides every node left over (the report lists them
as "not measured yet"), and later compilations measure them. Decisions are cached in memory
and in a JSON file keyed by the kernel, operand shapes and dtypes, static params, platform, device
kind and the jgsess and jax versions, so the next process does not measure again.

JGSESS_AUTOTUNE=1|0|cached   1 (default): measure; 0: the cost model decides; cached: decisions
                             cached earlier, else the cost model, never measuring (runs that
                             must be the same bit for bit from the first compile on)
JGSESS_AUTOTUNE_CACHE=path   the cache file (default ~/.cache/jgsess/autotune.json)
JGSESS_AUTOTUNE_BUDGET=s     seconds of measuring per compiled function (default: a quarter of
                             its trace time)

`clear_cache()` (or `python -m jgsess.autotune --clear`) forgets every decision.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from . import _config, platforms

_MIN_REPS, _MAX_REPS = 5, 51
_TRACE_SHARE = 0.25  # of a function's trace time, spent measuring at most
_cache: dict[str, dict] | None = None


@dataclass(frozen=True)
class Measurement:
    """One decision: the two median times (seconds), and whether it came from the cache."""

    kernel: str
    key: str
    kernel_s: float
    xla_s: float
    cached: bool
    seconds: float = 0.0  # spent measuring (compiling and running both sides)

    @property
    def impl(self) -> str:
        return "kernel" if self.kernel_s < self.xla_s else "xla"

    def reason(self) -> str:
        source = "cached" if self.cached else "measured"
        return f"{source}: kernel {self.kernel_s * 1e3:.3f} ms, xla {self.xla_s * 1e3:.3f} ms"


def budget(traced: float) -> float:
    """Seconds of measuring for a compilation whose function took `traced` seconds to trace."""
    setting = _config.autotune_budget()
    return setting if setting is not None else _TRACE_SHARE * traced


def clear_cache() -> None:
    """Forget every measured decision, in this process and on disk."""
    global _cache
    _cache = {}
    try:
        os.remove(_config.autotune_cache())
    except FileNotFoundError:
        pass


def _load() -> dict[str, dict]:
    global _cache
    if _cache is None:
        try:
            with open(_config.autotune_cache()) as f:
                _cache = json.load(f)
        except (OSError, ValueError):
            _cache = {}
    return _cache


def _store(key: str, entry: dict) -> None:
    cache = _load()
    cache[key] = entry
    path = _config.autotune_cache()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    # merge with what other processes wrote meanwhile, then replace the file atomically
    try:
        with open(path) as f:
            cache = {**json.load(f), **cache}
    except (OSError, ValueError):
        pass
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(cache, f, indent=0, sort_keys=True)
    os.replace(tmp, path)


def _device_kind(platform: str) -> str:
    return jax.devices(platform)[0].device_kind if platforms.has_devices(platform) else "unknown"


def key(kernel: str, platform: str, avals, static: dict) -> str:
    """The cache key of a decision: kernel, operand shapes and dtypes, static params, platform,
    device kind, jgsess and jax versions."""
    from ._version import __version__

    operands = ",".join(f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in avals)
    params = repr(sorted((k, repr(v)) for k, v in static.items()))
    device = _device_kind(platform)
    versions = f"jgsess {__version__}, jax {jax.__version__}"
    return "|".join([kernel, platform, device, versions, operands, params])


def key_of(node, platform: str) -> str:
    return key(node.op.name, platform, [v.aval for v in node.inputs], node.op.static(node.params))


def random_operand(aval, rng) -> np.ndarray:
    dtype = np.dtype(aval.dtype)
    if np.issubdtype(dtype, np.floating) or dtype.name in ("bfloat16", "float16"):
        return (rng.standard_normal(aval.shape) * 0.5 + 0.5).astype(dtype)
    if dtype == np.bool_:
        return rng.random(aval.shape) < 0.5
    if np.issubdtype(dtype, np.unsignedinteger):
        return rng.integers(0, np.iinfo(dtype).max, aval.shape, dtype=dtype, endpoint=True)
    return np.zeros(aval.shape, dtype)


def _time(fn, args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def _node_sides(node, platform: str, then=None):
    """(kernel function, XLA function, operands, donated operand positions): the node's
    kernel and its reference. Where `then` (KernelSpec.Followed: the enclosing program's next
    step) is given, each side is followed by it and runs in place as in that program: the
    operands it writes over are donated, and the kernel writes its in-place results over
    theirs."""
    spec = node.op
    static = spec.static(node.params)
    rng = np.random.default_rng(0)
    avals = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in node.inputs]
    size = spec.workspace(static, avals) if spec.workspace is not None else 0
    aliases: tuple = ()
    donated: tuple = ()
    if then is not None:
        aliases = tuple(sorted(spec.inplace(static, len(avals)).items()))
        donated = tuple(1 + i for i in then.writes(len(avals)))  # after the arena
    workspace = (0, size) if size else None
    params = {**static, "impl": "kernel", "aliases": aliases, "workspace": workspace}
    apply = then.apply if then is not None else (lambda ops, results: results)

    def kernel(arena, *ops):
        return apply(ops, spec.apply(ops, params, arena)[0])

    def xla(arena, *ops):
        return apply(ops, spec.run_reference(ops, static))

    operands = [np.zeros((size,), np.uint8), *(random_operand(a, rng) for a in avals)]
    return kernel, xla, operands, donated


def compile_alone(fns, operands, platform: str, compiler_options: tuple = (), donate=()):
    """([each of `fns` compiled for the types of `operands`, arrays or trees of them], the
    device): top-level programs for `platform`'s first device, which the pipeline (running
    inside the user's jax.jit trace) calls under `jax.ensure_compile_time_eval`. Traced at top
    level, not under it: there a function's constant computations (zeros, broadcasts) would
    run eagerly, each compiled on its own. `compiler_options`: jax.jit's, as (name, value)
    pairs; `donate`: the positions of the operands donated to each."""
    device = jax.devices(platform)[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    structs = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), list(operands)
    )
    options = dict(compiler_options) or None
    compiled = [jax.jit(f, donate_argnums=tuple(donate)).lower(*structs) for f in fns]
    return [lowered.compile(options) for lowered in compiled], device


def measure(kernel, xla, operands, platform: str, donate=()) -> tuple[float, float]:
    """(kernel seconds, XLA seconds): medians of interleaved runs of the two functions, each
    compiled alone for `platform`'s first device. The operands at positions `donate` are
    donated: each run gets fresh copies of them (made untimed), which it updates in place."""
    sides, device = compile_alone((kernel, xla), operands, platform, donate=donate)
    with jax.ensure_compile_time_eval():  # the pipeline runs inside the user's jax.jit trace
        args = jax.device_put(list(operands), device)

        def run(fn) -> float:
            if not donate:
                return _time(fn, args)
            fresh = [jnp.copy(a) if i in donate else a for i, a in enumerate(args)]
            return _time(fn, jax.block_until_ready(fresh))

        first = max(run(fn) for fn in sides)  # also warms up
        # enough rounds for ~50 ms per side (short calls are noisy), 5 to 51
        reps = int(min(_MAX_REPS, max(_MIN_REPS, 0.05 // max(first, 1e-6))))
        times: list[list[float]] = [[], []]
        for _ in range(reps):
            for i, fn in enumerate(sides):
                times[i].append(run(fn))
    return statistics.median(times[0]), statistics.median(times[1])


def _measured(kernel: str, key: str, sides, platform: str, log: list, budget: float):
    """The cached decision under `key`, else one measured now with `sides()` (-> kernel
    function, XLA function, operands[, the positions of those donated]), appended to `log`;
    else why there is none (with whether a later compilation will measure it)."""
    setting = _config.autotune_mode()
    if setting == "off":
        return "not measured (JGSESS_AUTOTUNE=0)", False
    if not platforms.has_devices(platform):  # a program lowered for another machine
        return f"not measured (no {platform} device in this process)", False
    entry = _load().get(key)
    if entry is not None:
        found = Measurement(kernel, key, entry["kernel_s"], entry["xla_s"], cached=True)
    elif setting == "cached":
        return "not measured (JGSESS_AUTOTUNE=cached, none cached)", False
    elif sum(m.seconds for m in log) >= budget:
        return "not measured yet (this compilation's measuring budget was spent)", True
    else:
        start = time.perf_counter()
        kernel_fn, xla_fn, operands, *donate = sides()
        kernel_s, xla_s = measure(kernel_fn, xla_fn, operands, platform, *donate)
        found = Measurement(kernel, key, kernel_s, xla_s, False, time.perf_counter() - start)
        _store(key, {"kernel_s": kernel_s, "xla_s": xla_s})
    log.append(found)
    return found, False


def decide(
    kernel: str, key: str, sides, platform: str, record, budget: float, cost_model
) -> tuple[bool, str]:
    """Whether to take `kernel` here, and why: its measured (or cached) decision under `key`,
    else the cost model's, `cost_model()` -> (kernel wins, why). Measurements go to
    `record.autotune` (the report prints them, and they count against this compilation's
    `budget`, in seconds); a choice the cost model made because the budget was spent goes to
    `record.unmeasured` (a later compilation measures it)."""
    found, later = _measured(kernel, key, sides, platform, record.autotune, budget)
    if isinstance(found, Measurement):
        return found.impl == "kernel", found.reason()
    wins, why = cost_model()
    if later:
        record.unmeasured.append((kernel, "kernel" if wins else "xla"))
    return wins, f"{found}; cost model: {why}"


def choose(node, platform: str, record, budget: float, then=None) -> tuple[bool, str]:
    """`decide` for a fused node whose spec has a cost model (`prefer_kernel`), or whose
    results the program enclosing its own reads next in a known way (`then`: its spec's
    KernelSpec.followed_by, in a program traced inside another): both sides are then measured
    with that step, and the cost model is XLA's fusion of the two."""
    spec = node.op
    sides = functools.partial(_node_sides, node, platform, then)
    key = key_of(node, platform)
    if then is not None:
        key += "|followed by the enclosing program's step"

        def cost_model():
            return False, "XLA fuses the reference with the enclosing program's next step"

    else:
        cost_model = functools.partial(spec.prefer_kernel, node, platform)
    return decide(spec.name, key, sides, platform, record, budget, cost_model)


def _main(argv: list[str]) -> int:
    if argv == ["--clear"]:
        clear_cache()
        print(f"cleared {_config.autotune_cache()}")
        return 0
    for key, entry in sorted(_load().items()):
        print(f"{key}: kernel {entry['kernel_s'] * 1e3:.3f} ms, xla {entry['xla_s'] * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_main(sys.argv[1:]))
