"""`jgsess.jit`: a drop-in for `jax.jit` that runs the session pipeline on the traced program.

`jgsess.jit(fun, **options)` returns `jax.jit(body, **options)`: jax's own compiled function,
so every option, attribute, cache and error is jax's, with `report` and `plain` added. The
body (jgsess/_body.py) is what puts the pipeline between jax's trace of `fun` and its
compilation, on the road `ROADS` chose:

    jgsess.jit(f) -> PjitFunction(body(f)) + .report / .plain, __wrapped__ = f
                        one body per (f, options, road, settings), shared by jgsess.jit(f),
                        so jax's dispatch and executable caches are shared too
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
import weakref
from collections.abc import Callable

import jax

from . import _compat, _config, platforms
from ._body import ROADS, Body
from ._warnings import JgsessFallbackWarning
from .report import Report
from .session import Session

__all__ = ["JgsessFallbackWarning", "Jitted", "jit"]

# the frames of jgsess.jit's own calls into jax (a report's trace) stay out of the tracebacks
# of errors raised in user code, as jax.jit's own do
_compat.hide_from_tracebacks(__file__)

# jax.jit's parameters: jgsess.jit takes the same, and hands every option to jax.jit as given
_SIGNATURE = inspect.signature(jax.jit)


class _JittedType(type):
    def __instancecheck__(cls, obj) -> bool:
        # a function made from a jgsess.jit one by functools-style wrapping (jax.grad, ...)
        # carries its __dict__, body included, but wraps the jitted function, not its body's
        body = getattr(obj, "_jgsess_body", None)
        return isinstance(body, Body) and getattr(obj, "__wrapped__", None) is body.__wrapped__


class Jitted(metaclass=_JittedType):
    """What `jgsess.jit` returns: `jax.jit`'s compiled function, plus `report` and `plain`.

    `isinstance(f, jgsess.Jitted)` tells a `jgsess.jit` function from a `jax.jit` one; both have
    `lower`, `trace`, `eval_shape`, `clear_cache`, `__wrapped__` and bind as methods.
    """


# fun -> {(its jax.jit options frozen, the road, the JGSESS_* settings): its body}; the body
# holds fun weakly
_BODIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BODIES_LOCK = threading.Lock()


def _body(fun: Callable, options: dict) -> Body:
    """The body of `fun` under these options: one per (fun, options, road, settings), so that
    every jgsess.jit(fun, **options) shares jax's trace and executable caches, as jax.jit's
    do, and one made after a JGSESS_* setting changed compiles under the new setting."""
    kind = ROADS.body_type()
    try:
        frozen = tuple(sorted((name, _frozen(value)) for name, value in options.items()))
        key = (frozen, kind, _config.fingerprint())
        with _BODIES_LOCK:
            bodies = _BODIES.setdefault(fun, {})
            body = bodies.get(key)
            if body is None:
                body = bodies[key] = kind(fun, options)
    except TypeError:  # fun or an option not hashable, or fun not weakly referenceable
        return kind(fun, options)
    return body


def _frozen(value):
    leaves, treedef = jax.tree.flatten(value)
    return treedef, tuple(leaves)


def jit(fun=_SIGNATURE.parameters["fun"].default, /, **options):
    """Compile `fun` like `jax.jit`, after running MindSpore's GPU-session passes over it.

    Takes exactly `jax.jit`'s arguments, with their meaning (`static_argnums`,
    `donate_argnums`, `in_shardings`, `keep_unused`, `compiler_options`, ...), and returns
    `jax.jit`'s own kind of function: `lower`, `trace`, `eval_shape`, `clear_cache`, method
    binding, caches and errors are jax's. Each input signature is traced once to a jaxpr,
    turned into a kernel graph, rewritten (canonicalization, cast/transpose cleanups, fused
    optimizer updates, ...), given a compiled kernel or XLA's own code for each fused node, and
    handed to XLA. Results are `jax.jit(fun)`'s (a kernel computes the operations it
    replaced, bit for bit with them run one by one, within an ulp of jax.jit's where XLA
    contracts a multiply-add); if the pipeline fails, jgsess warns once
    (`JgsessFallbackWarning`) and runs `fun` as `jax.jit` would.

    Args:
      fun: the function to compile. Leave it out to get a decorator.
      **options: any keyword argument of `jax.jit`. `donate_argnums`/`donate_argnames` also
        let fused optimizer updates write parameters and state in place.

    Returns:
      `jax.jit`'s compiled function with two more methods: `report(*args)` (what the pipeline
      did for these arguments) and `plain()` (`jax.jit(fun, **options)`, the baseline).

    Example:
      >>> step = jgsess.jit(train_step, donate_argnums=(0, 1))
      >>> params, opt_state = step(params, opt_state, batch)
      >>> print(step.report(params, opt_state, batch))
    """
    if fun is _SIGNATURE.parameters["fun"].default:
        _SIGNATURE.bind_partial(**options)  # jax's TypeError for a keyword jax.jit does not take
        return functools.partial(jit, **options)
    with warnings.catch_warnings():  # jax.jit's errors for a bad function or bad options;
        warnings.simplefilter("ignore")  # its warnings come once, from the jax.jit below
        plain = jax.jit(fun, **options)
    body = _body(fun, options)
    body.keep_plain(plain)
    jitted = jax.jit(body, **options)
    jitted.__wrapped__ = fun
    jitted._jgsess_body = body
    jitted.plain = lambda: plain
    jitted.plain.__doc__ = "`jax.jit` of the same function and options: the baseline."
    jitted.report = functools.partial(_report, fun, body, options, plain)
    # the jitted function held weakly: its own attribute, it would make a reference cycle
    jitted.clear_cache = functools.partial(_clear_cache, weakref.ref(jitted), body, plain)
    return jitted


def _clear_cache(jitted: weakref.ref, body: Body, plain) -> None:
    """What `jax.jit(fun).clear_cache()` clears (the dispatch cache, `fun`'s traces and their
    executables), and the programs the body made of those traces. The body leaves the table of
    bodies: its next traces follow the settings of their time, and a later jgsess.jit(fun)
    gets a body of its own, whose programs follow its settings (on the public road jax caches
    the body's trace, the rewrite in it)."""
    type(plain).clear_cache(jitted())
    plain.clear_cache()
    body.forget()
    with _BODIES_LOCK:
        try:
            bodies = _BODIES.get(body.__wrapped__, {})
        except TypeError:  # a function _BODIES cannot hold (never in it)
            return
        for key in [k for k, b in bodies.items() if b is body]:
            del bodies[key]


jit.__signature__ = _SIGNATURE.replace(  # type: ignore[attr-defined]
    return_annotation="jax.jit's compiled function"
)


def _report(fun, compiled: Body, options, plain, *args, **kwargs) -> Report:
    """What the pipeline did for these arguments: passes, fusions, kernels, memory, times. For
    arguments `compiled` has already compiled, the decisions that program was compiled with:
    kernels it left unmeasured stay unmeasured here (their measurement would change the
    program, not report it)."""
    body = type(compiled)(fun, compiled._options, plan=True, reports=compiled)
    fused = jax.jit(body, **options)
    fused.trace(*args, **kwargs)
    if body.sessions:
        return Report(body.sessions[-1], fused, plain, args, kwargs)
    platform = platforms.program_platform(compiled._pinned)  # neither road: plain jax.jit
    why = "jgsess.jit is plain jax.jit here: neither road works with this jax"
    return Report(Session(body.__name__, platform, fallback=why), fused, plain, args, kwargs)
