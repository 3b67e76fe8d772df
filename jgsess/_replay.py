"""jgsess.jit's public road: the rewrite put into jax.jit with jax's public API alone.

jgsess's first road into jax.jit wraps one private jax function (_compat/jit_hook.py).
Where that function is not as jgsess expects (a jax release changed it), or where
`JGSESS_ROAD=public` asks, `jgsess.jit(fun, **options)` is `jax.jit` of a body that does the
work itself while jax traces it, once per signature; jax compiles and dispatches the result
as it does any function's, from C++ from the second call on:

    jax.jit(body, **options)(*args)   jax traces body(*tracers):
      jax.jit(fun, **options).trace(*tracers)     -> fun's ClosedJaxpr, which inputs are
                                                     donated (jax's trace cache, shared with
                                                     jax.jit(fun) and jax.eval_shape(fun))
      rewrite(closed, donated, seconds)           -> the optimized ClosedJaxpr
      jax.extend.core.jaxpr_as_fun(program)(*tracers)   bound into body's trace

Where `fun` closes over tracers of an enclosing trace, jax's trace takes them as leading
inputs this module cannot name; `fun` is then traced again with `jax.make_jaxpr`, which keeps
them as constants, and they become the program's leading inputs.

What differs from the first road (README's limits): jax counts the body's trace beside
`fun`'s, a Python stack inside `fun` is deeper by the body's frames, and a program is planned
as a top-level one also where it is traced inside another trace (jax shares the body's trace
between the two), so it takes no decision measured with an enclosing step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.extend.core as jex
import numpy as np

Rewrite = Callable[[jex.ClosedJaxpr, tuple, float], jex.ClosedJaxpr]


def replay(fun: Callable, plain, args: tuple, kwargs: dict, rewrite: Rewrite):
    """What `fun(*args, **kwargs)` returns, computed by `rewrite`'s program for its trace; to
    be called while jax traces a body (every array in `args` and `kwargs` a tracer). `plain`:
    `jax.jit(fun, **options)`, whose trace gives the program and its donated inputs;
    `rewrite(closed, donated, seconds)`: the program to run in place of the ClosedJaxpr
    `closed` (`donated`: per input; `seconds`: how long the trace took)."""
    dynamic = [x for x in jax.tree.leaves((args, kwargs)) if isinstance(x, jax.core.Tracer)]
    start = time.perf_counter()
    with jax.explain_cache_misses(False):  # jax explains the body's miss, which is fun's
        traced = plain.trace(*args, **kwargs)
    seconds = time.perf_counter() - start
    closed = traced.jaxpr
    donated = tuple(info.donated for info in jax.tree.leaves(traced.args_info))
    consts: list = []
    if [x.aval for x in dynamic] != list(closed.in_avals):  # tracers fun closes over
        start = time.perf_counter()
        closed, consts = _lifted(fun, args, kwargs, dynamic)
        seconds += time.perf_counter() - start
        for tracer in consts:  # one that escaped a finished trace raises, used or not, as
            jax.lax.stop_gradient(tracer)  # under jax.jit (the rewrite may drop its use)
        donated = (False,) * len(consts) + donated
    program = rewrite(closed, donated, seconds)
    outs = jex.jaxpr_as_fun(program)(*consts, *dynamic)
    return jax.tree.unflatten(jax.tree.structure(traced.out_info), outs)


def _lifted(fun: Callable, args: tuple, kwargs: dict, dynamic: list):
    """`fun`'s ClosedJaxpr on the tracers `dynamic` (the other leaves of `args` and `kwargs`
    fixed), the tracers of enclosing traces it closes over as leading inputs, and those
    tracers."""
    leaves, tree = jax.tree.flatten((args, kwargs))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, jax.core.Tracer)]

    def flat(*xs):
        filled = list(leaves)
        for i, x in zip(slots, xs):
            filled[i] = x
        a, k = jax.tree.unflatten(tree, filled)
        return jax.tree.leaves(fun(*a, **k))

    closed = jax.make_jaxpr(flat)(*dynamic)
    jaxpr = closed.jaxpr
    outer = [isinstance(c, jax.core.Tracer) for c in closed.consts]
    lifted = [v for v, o in zip(jaxpr.constvars, outer) if o]
    kept = [v for v, o in zip(jaxpr.constvars, outer) if not o]
    opened = jex.Jaxpr(
        kept,
        [*lifted, *jaxpr.invars],
        jaxpr.outvars,
        jaxpr.eqns,
        jaxpr.effects,
        _with_leading_args(jaxpr.debug_info, len(lifted)),
    )
    values = [c for c, o in zip(closed.consts, outer) if not o]
    return jex.ClosedJaxpr(opened, values), [c for c, o in zip(closed.consts, outer) if o]


def _with_leading_args(debug_info, count: int):
    """jax's description of a function (a NamedTuple: its names, its arguments' names, ...)
    with `count` unnamed arguments before the others; None where it has another form."""
    names = getattr(debug_info, "arg_names", None)
    if names is None or not hasattr(debug_info, "_replace"):
        return None
    return debug_info._replace(arg_names=("",) * count + tuple(names))


def check() -> str | None:
    """None where this road works with the installed jax, else what failed: a probe's trace
    through `replay`, rewritten to another program."""
    program = jax.make_jaxpr(lambda x: x * 3.0)(np.float32(0))

    def fun(x):
        return x + 1.0

    def body(x):
        return replay(fun, jax.jit(fun), (x,), {}, lambda closed, donated, seconds: program)

    try:
        got = jax.make_jaxpr(body)(np.float32(0))
    except Exception as err:  # noqa: BLE001 - whatever jax did, this road is not open
        return f"the public road's probe raised {type(err).__name__}: {err}"
    names = [eqn.primitive.name for eqn in got.eqns]
    if names != [program.eqns[0].primitive.name]:
        return f"the public road's probe gave {got}"
    return None
