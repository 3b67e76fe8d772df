"""Pattern by example: trace a reference function and turn its jaxpr into a pattern.

    def momentum(p, g, acc, lr, mu):        ->   root  = sub(p, mul(lr, acc2))
        acc2 = mu * acc + g                      acc2  = add(mul(mu, acc), g)
        return p - lr * acc2, acc2               outputs (root, acc2); inputs p, g, acc, lr, mu

Array arguments become `Var`s, rank-0 arguments `Scalar`s (literal or traced hyper-parameters),
literals inside the function `Lit`s. The traced graph is canonicalized first, exactly as the
programs it will be matched against are (so this lives beside the passes, not in patterns/,
which the passes import).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ... import _compat
from ...ir import from_jaxpr
from ...ir.graph import Value
from ...patterns import Lit, Pat, Pattern, Scalar, Var, pattern_nodes
from ..cleanups import clean
from ..manager import Context

_EXAMPLE_SIZE = 7


@dataclass(frozen=True)
class ExamplePattern:
    """A traced pattern: `root` to match, `outputs` the fused node defines, `inputs` it reads."""

    root: Pat
    outputs: tuple[Pattern, ...]
    inputs: tuple[str, ...]

    def nodes(self) -> dict[int, Pattern]:
        return pattern_nodes(self.root)


def from_function(fn, scalars=(), dtypes=None, names=None) -> ExamplePattern:
    """Trace `fn` into a pattern.

    Args:
      fn: the reference computation; every argument is an array unless named in `scalars`.
      scalars: names of rank-0 arguments (hyper-parameters).
      dtypes: argument name -> dtype (float32 by default).
      names: the arguments' names, when `fn`'s signature does not give them (`*args`).

    Returns:
      An ExamplePattern whose root is the function's first output; every other output must be
      computed on the way to it.
    """
    names = tuple(names or inspect.signature(fn).parameters)
    dtypes = dtypes or {}
    structs = [
        jax.ShapeDtypeStruct(() if n in scalars else (_EXAMPLE_SIZE,), dtypes.get(n, jnp.float32))
        for n in names
    ]
    graph = from_jaxpr(jax.make_jaxpr(fn)(*structs))
    clean(graph, Context())
    memo: dict[Value, Pattern] = {}
    for name, value in zip(names, graph.inputs):
        memo[value] = Scalar(name) if name in scalars else Var(name)

    def convert(value: Value) -> Pattern:
        if value in memo:
            return memo[value]
        if value.is_const:
            number = value.scalar_value()
            if number is None:
                raise ValueError("pattern examples may only hold scalar constants")
            return Lit(number)
        node = value.producer
        if node is None:
            raise ValueError(f"{value} is neither an input nor computed in the example")
        params = {k: v for k, v in node.params.items() if k not in _compat.SHAPE_PARAMS}
        pattern = Pat(
            node.name,
            [convert(v) for v in node.inputs],
            params=params,
            index=node.outputs.index(value),
        )
        memo[value] = pattern
        return pattern

    outputs = tuple(convert(v) for v in graph.outputs)
    if not isinstance(outputs[0], Pat):
        raise ValueError(f"the first output of {fn.__name__} is not computed")
    reachable = pattern_nodes(outputs[0])
    for out in outputs[1:]:
        if id(out) not in reachable:
            raise ValueError(
                f"output {out} of {fn.__name__} is not computed on the way to its first"
            )
    return ExamplePattern(outputs[0], outputs, names)
