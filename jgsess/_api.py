"""`jgsess.jit`: a drop-in for `jax.jit` that runs the session pipeline on the traced program."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence

import jax

from . import _compat, _config
from .report import Report
from .session import Session, compile_jaxpr


class JgsessFallbackWarning(RuntimeWarning):
    """The pipeline failed on a program; jgsess ran it as plain `jax.jit` would."""


def _as_tuple(x) -> tuple:
    if x is None:
        return ()
    return (x,) if isinstance(x, (int, str)) else tuple(x)


class Jitted:
    """A function compiled by `jgsess.jit`; call it as you would the `jax.jit` version."""

    def __init__(self, fun: Callable, static_argnums, static_argnames, donate_argnums):
        functools.update_wrapper(self, fun)
        self._fun = fun
        self._static_argnums = _as_tuple(static_argnums)
        self._static_argnames = _as_tuple(static_argnames)
        self._donate_argnums = _as_tuple(donate_argnums)
        self._warned = False
        self._jitted = self._jax_jit(sink=None)

    def _jax_jit(self, sink: list | None):
        @functools.wraps(self._fun)
        def body(*args, **kwargs):
            return self._trace(args, kwargs, sink)

        return jax.jit(body, **self._options())

    def _options(self) -> dict:
        return {
            "static_argnums": self._static_argnums or None,
            "static_argnames": self._static_argnames or None,
            "donate_argnums": self._donate_argnums or None,
        }

    def _trace(self, args: tuple, kwargs: dict, sink: list | None):
        """Runs inside jax.jit's trace: args hold tracers (dynamic) and Python values (static)."""
        flat, treedef = jax.tree.flatten((args, kwargs))
        dynamic = [i for i, leaf in enumerate(flat) if isinstance(leaf, jax.Array)]
        donate = {i + len(args) if i < 0 else i for i in self._donate_argnums}
        marks = (
            tuple(jax.tree.map(lambda _, i=i: i in donate, a) for i, a in enumerate(args)),
            jax.tree.map(lambda _: False, kwargs),
        )
        donated_leaves = jax.tree.leaves(marks)
        donated = [bool(donated_leaves[i]) for i in dynamic]

        def flat_fun(*values):
            leaves = list(flat)
            for i, value in zip(dynamic, values):
                leaves[i] = value
            a, k = jax.tree.unflatten(treedef, leaves)
            return self._fun(*a, **k)

        tracers = [flat[i] for i in dynamic]
        closed, out_shape = jax.make_jaxpr(flat_fun, return_shape=True)(*tracers)
        name = getattr(self._fun, "__name__", "fun")
        try:
            program, session = compile_jaxpr(closed, name=name, donated=donated)
        except Exception as err:  # noqa: BLE001 - any pipeline failure falls back
            if _config.strict():
                raise
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"jgsess: the pipeline failed on {name} ({type(err).__name__}: {err}); "
                    "running it as plain jax.jit",
                    JgsessFallbackWarning,
                    stacklevel=4,
                )
            program = closed
            session = Session(name, jax.default_backend(), fallback=f"{type(err).__name__}: {err}")
        if sink is not None:
            sink.append(session)
        outs = _compat.jaxpr_as_fun(program)(*tracers)
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    def __call__(self, *args, **kwargs):
        return self._jitted(*args, **kwargs)

    def plain(self):
        """`jax.jit` of the same function with the same options: the baseline jgsess must match."""
        return jax.jit(self._fun, **self._options())

    def lower(self, *args, **kwargs):
        """As `jax.jit(f).lower`: `lower(...).as_text()` shows the `jgsess_*` custom calls."""
        return self._jitted.lower(*args, **kwargs)

    def trace(self, *args, **kwargs):
        return self._jitted.trace(*args, **kwargs)

    def report(self, *args, **kwargs) -> Report:
        """What the pipeline did for these arguments: passes, fusions, kernels, memory."""
        sink: list[Session] = []
        jitted = self._jax_jit(sink)
        jitted.trace(*args, **kwargs)
        return Report(sink[-1], self, args, kwargs)


def jit(
    fun: Callable | None = None,
    *,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Sequence[str] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
):
    """Compile `fun` like `jax.jit`, after running MindSpore's GPU-session passes over it.

    The function is traced to a jaxpr once per input signature, turned into a kernel graph,
    rewritten (canonicalization, cast/transpose cleanups, fused optimizer updates, ...), given a
    compiled kernel or XLA's own code for each fused node, and handed to XLA. Results equal
    `jax.jit(fun)`'s; if the pipeline fails, jgsess warns once and runs `jax.jit(fun)`.

    Args:
      fun: the function to compile; pytrees and keyword arguments as with `jax.jit`.
      static_argnums, static_argnames: arguments treated as compile-time constants.
      donate_argnums: arguments whose buffers the computation may reuse; fused optimizer
        updates then write parameters and state in place.

    Returns:
      A callable with `.lower(*args)`, `.trace(*args)` and `.report(*args)`.

    Example:
      >>> step = jgsess.jit(train_step, donate_argnums=(0, 1))
      >>> params, opt_state = step(params, opt_state, batch)
      >>> print(step.report(params, opt_state, batch))
    """
    if fun is None:
        return functools.partial(
            jit,
            static_argnums=static_argnums,
            static_argnames=static_argnames,
            donate_argnums=donate_argnums,
        )
    return Jitted(fun, static_argnums, static_argnames, donate_argnums)
