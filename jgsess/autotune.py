"""Measuring a kernel against XLA's code, cached on disk [GPUSession::SelectKernel].

jgsess/selection.py decides, for a fused node whose choice is not obvious, by a measurement
made here: the compiled kernel and XLA's code for the node's reference, on the program's device
(its `platforms.Target`), with the node's shapes, dtypes and static params:

    jgsess.batch_norm_relu x g b    kernel 0.4 ms, xla 0.8 ms   ->   impl=kernel

Each side is compiled alone and run on random operands, interleaved, 5 to 51 times (about
50 ms each; the median counts). A compilation starts no new measurement once it has measured
for a quarter of the time its function took to trace (or `JGSESS_AUTOTUNE_BUDGET` seconds); the
first always runs. A trace jax's cache served (after `jax.eval_shape(f)`, flax's `init`) took
no time: a trace counts as at least `TRACE_SECONDS_PER_EQUATION` a top-level equation, what jax
takes to trace one. Past the budget, the cost model decides every node left over (the report
lists them as "not measured yet"), and later compilations measure them. Measurements are cached
in memory and in a JSON file keyed by the kernel, operand shapes and dtypes, static params,
platform, device kind and the jgsess and jax versions, so the next process does not measure
again.

A failure stays with the decision it belongs to, with one warning naming its cause: a cache
file that cannot be read or written (a read-only home, a path under a file) keeps the
measurements in this process's memory; a corrupt one is ignored and replaced; a measurement
that raises leaves that decision to the cost model (under JGSESS_STRICT=1 it raises).

JGSESS_AUTOTUNE=1|0|cached   1 (default): measure; 0: the cost model decides; cached: decisions
                             cached earlier, else the cost model, never measuring (runs that
                             must be the same bit for bit from the first compile on)
JGSESS_AUTOTUNE_CACHE=path   the cache file (default ~/.cache/jgsess/autotune.json)
JGSESS_AUTOTUNE_BUDGET=s     seconds of measuring per compiled function (default: a quarter of
                             its trace time)

`clear_cache()` (or `python -m jgsess.autotune --clear`) forgets every measurement.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from . import _config, platforms
from ._warnings import warn_once

_MIN_REPS, _MAX_REPS = 5, 51
_TRACE_SHARE = 0.25  # of a function's trace time, spent measuring at most
# jax traces an optax AdamW step at 58-99 us a top-level equation on a 2-core AMD EPYC (250 to
# 4,000 leaves; a flax MLP's gradient at 540): a floor below any real trace
TRACE_SECONDS_PER_EQUATION = 40e-6
_cache: dict[str, dict] | None = None


@dataclass(frozen=True)
class Measurement:
    """One measurement: the two median times (seconds), and whether it came from the cache."""

    kernel: str
    key: str
    kernel_s: float
    xla_s: float
    cached: bool
    seconds: float = 0.0  # spent measuring (compiling and running both sides)

    @property
    def kernel_wins(self) -> bool:
        return self.kernel_s < self.xla_s

    def reason(self) -> str:
        source = "cached" if self.cached else "measured"
        return f"{source}: kernel {self.kernel_s * 1e3:.3f} ms, xla {self.xla_s * 1e3:.3f} ms"


@dataclass(frozen=True)
class Unmeasured:
    """Why there is no measurement, and whether a later compilation will make it (this one's
    budget was spent)."""

    reason: str
    later: bool = False


@dataclass(frozen=True)
class Sides:
    """What a measurement runs: the kernel's function and XLA's, on `operands`, the operands
    at positions `donate` donated to each. `placed`: the functions are programs that place
    their operands themselves (over a mesh), run as they are rather than compiled alone on the
    target's device."""

    kernel: Callable
    xla: Callable
    operands: list
    donate: tuple = ()
    placed: bool = False


def budget(traced: float, equations: int) -> float:
    """Seconds of measuring for a compilation whose function took `traced` seconds to trace to
    `equations` top-level equations (at least TRACE_SECONDS_PER_EQUATION each: jax's cache
    may have served the trace)."""
    setting = _config.autotune_budget()
    if setting is not None:
        return setting
    return _TRACE_SHARE * max(traced, TRACE_SECONDS_PER_EQUATION * equations)


def clear_cache() -> None:
    """Forget every measured decision, in this process and on disk."""
    global _cache
    _cache = {}
    try:
        os.remove(_config.autotune_cache())
    except FileNotFoundError:
        pass


def _unusable(path: str, what: str, err: Exception) -> None:
    warn_once(
        f"autotune cache {path}",
        f"jgsess: the autotune cache {path} {what} ({type(err).__name__}: {err}); measured "
        "decisions are kept in this process's memory (JGSESS_AUTOTUNE_CACHE names another file)",
        stacklevel=4,
    )


def _read(path: str) -> dict:
    """The cache file's decisions; none where it is missing, and none, warned once, where it
    cannot be read or is not a cache jgsess wrote."""
    try:
        with open(path) as f:
            found = json.load(f)
        if not isinstance(found, dict):
            raise ValueError("not a JSON object")
        return found
    except FileNotFoundError:
        return {}
    except OSError as err:
        _unusable(path, "cannot be read", err)
    except ValueError as err:
        _unusable(path, "is not a cache jgsess wrote: it is ignored and replaced", err)
    return {}


def _load() -> dict[str, dict]:
    global _cache
    if _cache is None:
        _cache = _read(_config.autotune_cache())
    return _cache


def _store(key: str, entry: dict) -> None:
    cache = _load()
    cache[key] = entry
    path = _config.autotune_cache()
    folder = os.path.dirname(path) or "."
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        # merge with what other processes wrote meanwhile, then replace the file atomically
        merged = {**_read(path), **cache}
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(merged, f, indent=0, sort_keys=True)
        os.replace(tmp, path)
    except OSError as err:
        _unusable(path, "cannot be written", err)
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def key(kernel: str, target: platforms.Target, avals, static: dict) -> str:
    """The cache key of a measurement: kernel, operand shapes and dtypes, static params,
    platform, device kind, jgsess and jax versions."""
    from ._version import __version__

    operands = ",".join(f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in avals)
    params = repr(sorted((k, repr(v)) for k, v in static.items()))
    device = getattr(target.device, "device_kind", "unknown")
    versions = f"jgsess {__version__}, jax {jax.__version__}"
    return "|".join([kernel, target.platform, device, versions, operands, params])


def key_of(node, target: platforms.Target) -> str:
    return key(node.op.name, target, [v.aval for v in node.inputs], node.op.static(node.params))


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


def node_sides(node, then=None) -> Sides:
    """A fused node's kernel and its reference. Where `then` (KernelSpec.Followed: the
    enclosing program's next step) is given, each side is followed by it and runs in place as
    in that program: the operands it writes over are donated, and the kernel writes its
    in-place results over theirs."""
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
    return Sides(kernel, xla, operands, donated)


def measure(sides: Sides, target: platforms.Target) -> tuple[float, float]:
    """(kernel seconds, XLA seconds): medians of interleaved runs of the two sides, each
    compiled alone for the target's device (unless `sides.placed`). A donated operand is
    copied afresh (untimed) for each run, which updates it in place."""
    donate = sides.donate
    with jax.ensure_compile_time_eval():  # the pipeline runs inside the user's jax.jit trace
        if sides.placed:
            fns, args = [sides.kernel, sides.xla], list(sides.operands)
        else:
            fns = target.compile((sides.kernel, sides.xla), sides.operands, donate)
            args = target.put(sides.operands)

        def run(fn) -> float:
            if not donate:
                return _time(fn, args)
            fresh = [jnp.copy(a) if i in donate else a for i, a in enumerate(args)]
            return _time(fn, jax.block_until_ready(fresh))

        first = max(run(fn) for fn in fns)  # also warms up
        # enough rounds for ~50 ms per side (short calls are noisy), 5 to 51
        reps = int(min(_MAX_REPS, max(_MIN_REPS, 0.05 // max(first, 1e-6))))
        times: list[list[float]] = [[], []]
        for _ in range(reps):
            for i, fn in enumerate(fns):
                times[i].append(run(fn))
    return statistics.median(times[0]), statistics.median(times[1])


def measured(
    kernel: str, key: str, sides: Callable[[], Sides], target: platforms.Target, log: list
) -> Measurement | Unmeasured:
    """The cached measurement under `key`, else one made now of `sides()` and appended to
    `log` (this compilation's, counted against `target.budget`), else why there is none."""
    setting = _config.autotune_mode()
    if setting == "off":
        return Unmeasured("not measured (JGSESS_AUTOTUNE=0)")
    if not platforms.has_devices(target.platform):  # a program lowered for another machine
        return Unmeasured(f"not measured (no {target.platform} device in this process)")
    entry = _load().get(key)
    if entry is not None:
        found = Measurement(kernel, key, entry["kernel_s"], entry["xla_s"], cached=True)
    elif setting == "cached":
        return Unmeasured("not measured (JGSESS_AUTOTUNE=cached, none cached)")
    elif target.budget is None or (log and sum(m.seconds for m in log) >= target.budget):
        # (the first measurement of a compilation always runs)
        return Unmeasured("not measured yet (this compilation's measuring budget was spent)", True)
    else:
        start = time.perf_counter()
        try:
            kernel_s, xla_s = measure(sides(), target)
        except Exception as err:  # noqa: BLE001 - one decision's failure is that decision's
            if _config.strict():
                raise
            cause = f"{type(err).__name__}: {err}"
            warn_once(
                f"measuring {kernel}: {cause}",
                f"jgsess: measuring {kernel} against XLA's code failed ({cause}); its cost "
                "model decides",
                stacklevel=3,
            )
            return Unmeasured(f"not measured (measuring failed: {cause})")
        found = Measurement(kernel, key, kernel_s, xla_s, False, time.perf_counter() - start)
        _store(key, {"kernel_s": kernel_s, "xla_s": xla_s})
    log.append(found)
    return found


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
