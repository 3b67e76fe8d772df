"""jax.jit's step from a call to its traced program, where jgsess puts its rewrite.

jax.jit works a call's program out in one private function, `pjit._infer_params(fun,
jit_info, args, kwargs) -> (params, args_flat)`: on each miss of its C++ dispatch cache
(`cache_miss`) and for `trace`, `lower` and `eval_shape` (`jit_trace`). `params.params` holds
the traced ClosedJaxpr ("jaxpr") beside everything jax.jit compiles it with ("donated_invars",
shardings, ...); `params` is a NamedTuple. The function and its two callers are the same from
jax 0.7 to 0.11. jax offers no public way to hand jax.jit a jaxpr of one's own, so jgsess
wraps this one (`install_jit_hook`), checks with a probe that the wrapper is reached and
receives what it expects, and leaves jax untouched where not: jgsess.jit then takes its public
road (jgsess/_replay.py).
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import jax
import numpy as np

from . import JIT_BODY, ClosedJaxpr, _private, hide_from_tracebacks, is_jit, outside_any_trace

JIT_STEP = "jax._src.pjit._infer_params"


class HookedBody(Protocol):
    """What `install_jit_hook` asks of the type of the functions whose traces it rewrites
    (jgsess.jit's body, and the probe's): class-level methods taking the instance."""

    def plain(self) -> Any:
        """`jax.jit` of the user's function, under the options the body was jitted with."""

    def tracing(self) -> AbstractContextManager:
        """Held while the function is traced and rewritten (one rewrite per new trace)."""

    def rewrite(self, closed, donated, traced: float, outermost: bool):
        """The program to compile in place of the traced ClosedJaxpr `closed`."""

    def unexpected(self, why: str) -> None:
        """jax's step did not have the structure the hook expects (`why`): the function runs
        as jax.jit traced it."""


def install_jit_hook(body_type: type) -> str | None:
    """Put jgsess between jax.jit's trace of a function and its compilation (once per process):
    None where the hook is in place and a probe went through it as expected; otherwise why
    not, with jax as it was.

    For a `fun` of `body_type` (see HookedBody), the wrapper has jax trace `fun.plain()` (`jax.jit`
    of the user's function under the same options) as jax would, through the trace caches jax
    shares with `jax.eval_shape` and `jax.jit`, then compiles `fun.rewrite(closed, donated,
    seconds, outermost)` in place of the traced ClosedJaxpr: one with the same inputs and
    outputs. Dispatch, executables, the C++ fast path, the AOT stages and errors stay
    jax.jit's. Every other function is jax's alone, whatever jax passes and returns."""
    try:
        pjit = importlib.import_module("jax._src.pjit")
        original = _private("jax._src.pjit", "_infer_params")
    except (ImportError, AttributeError) as err:
        return f"{JIT_STEP} is not in jax {jax.__version__} ({type(err).__name__}: {err})"
    if getattr(original, "rewrites", None) is body_type:
        return None
    if not callable(original):
        return f"{JIT_STEP} is not a function in jax {jax.__version__}"
    hooked = (body_type, _Probe)

    def _infer_params(*args, **kwargs):
        if not args or type(args[0]) not in hooked:
            return original(*args, **kwargs)
        return _rewritten(original, args, kwargs)

    _infer_params.rewrites = body_type  # type: ignore[attr-defined]
    pjit._infer_params = _infer_params  # type: ignore[attr-defined]
    try:
        problem = _Probe.check()
    except Exception as err:  # noqa: BLE001 - whatever jax did, the hook stays out of it
        problem = f"the probe raised {type(err).__name__}: {err}"
    if problem is not None:
        pjit._infer_params = original  # type: ignore[attr-defined]
        return problem
    # the wrapper's frame sits between jax.jit's and the user's function: hidden from the
    # tracebacks of errors raised in user code, as jax's own are
    hide_from_tracebacks(__file__)
    return None


def _rewritten(original: Callable, args: tuple, kwargs: dict):
    """jax's step for a hooked body `args[0]`: jax's trace of its plain function, its program
    swapped for the body's rewrite. Where jax's step has another structure than expected,
    jax's own result for the plain function (or the body), and `unexpected` says why."""
    body = args[0]
    kind = type(body)
    try:
        plain = kind.plain(body)
        call = (plain._fun, plain._jit_info, *args[2:])
    except AttributeError as err:  # jax.jit's functions keep no _fun/_jit_info any more
        kind.unexpected(body, f"jax.jit's function has no {err.name}")
        return original(*args, **kwargs)
    with kind.tracing(body):
        start = time.perf_counter()
        result = original(*call, **kwargs)  # the user's errors come from here, as jax.jit's
        traced = time.perf_counter() - start
        try:
            params, args_flat = result
            closed = params.params["jaxpr"]
            donated = tuple(params.params["donated_invars"])
            if not isinstance(closed, ClosedJaxpr) or len(donated) != len(closed.in_avals):
                raise TypeError("the traced program is not a ClosedJaxpr with its donations")
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            kind.unexpected(body, f"{JIT_STEP} returned another structure ({err})")
            return result
        rewritten = kind.rewrite(body, closed, donated, traced, outside_any_trace())
        if rewritten is closed:
            return result
        try:
            return params._replace(params={**params.params, "jaxpr": rewritten}), args_flat
        except (TypeError, ValueError, AttributeError) as err:
            kind.unexpected(body, f"{JIT_STEP}'s params cannot be replaced ({err})")
            return result


class _Probe:
    """A function whose trace the hook rewrites to another program, to check that jax.jit's
    two paths to its step (a call, here inside a trace so that nothing compiles, and `trace`)
    reach the hook and that it receives and returns the structure it expects."""

    def __init__(self):
        self.plain_fun = jax.jit(self._fun)
        self.program = jax.make_jaxpr(lambda x: x * 3.0)(np.float32(0))
        self.problem: str | None = None
        self.rewrites = 0

    @staticmethod
    def _fun(x):
        return x + 1.0

    def __call__(self, x):
        return self._fun(x)

    def plain(self):
        return self.plain_fun

    def tracing(self) -> AbstractContextManager:
        return contextlib.nullcontext()

    def rewrite(self, closed, donated, traced: float, outermost: bool):
        if len(closed.in_avals) != 1 or donated != (False,) or not traced >= 0:
            self.problem = f"{JIT_STEP} traced the probe to {closed} (donated {donated})"
        self.rewrites += 1
        return self.program

    def unexpected(self, why: str) -> None:
        self.problem = why

    @classmethod
    def check(cls) -> str | None:
        """None where the hook works as expected, else what went wrong."""
        probe = cls()
        arg = jax.ShapeDtypeStruct((), np.float32)
        outer = jax.make_jaxpr(jax.jit(probe))(arg)
        calls = [e.params.get(JIT_BODY) for e in outer.eqns if is_jit(e.primitive.name)]
        programs = {"call": calls[0] if calls else None, "trace": jax.jit(probe).trace(arg).jaxpr}
        if probe.problem is not None:
            return probe.problem
        for path, program in programs.items():
            if program is not probe.program:
                return f"jax.jit's {path} does not go through {JIT_STEP} (it gave {program})"
        return None
