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

import enum
import inspect
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ... import _compat
from ...ir import from_jaxpr
from ...ir.graph import Graph, Value
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
    graph = traced(fn, structs)
    return to_pattern(graph, names, scalars, fn.__name__, Exactness.SHAPELESS)


def traced(fn, structs) -> Graph:
    """`fn` traced on `structs` and cleaned up as programs are."""
    graph = from_jaxpr(jax.make_jaxpr(fn)(*structs))
    clean(graph, Context())
    return graph


class Exactness(enum.Enum):
    """How much of an example a pattern keeps: every param but where results are placed, and
    every literal (EXACT: the example's own shapes); all but the params that depend on shapes
    (SHAPELESS: every size); the ops and how they connect alone, any literal matching any
    constant (STRUCTURE: a candidate, to be checked against the example traced at its own
    shapes)."""

    EXACT = "exact"
    SHAPELESS = "shapeless"
    STRUCTURE = "structure"


def _is_constant(value: Value) -> bool:
    return value.is_const and value.ndim == 0


def to_pattern(
    graph: Graph, names, scalars, what: str, exactness: Exactness = Exactness.EXACT
) -> ExamplePattern:
    """The pattern of a traced example `graph` whose inputs are the arguments `names` (those in
    `scalars` rank-0), its first output the root; `what` names the example in errors."""
    memo: dict[Value, Pattern] = {}
    for name, value in zip(names, graph.inputs):
        memo[value] = Scalar(name) if name in scalars else Var(name)

    def params_of(node) -> dict:
        if exactness is Exactness.STRUCTURE:
            return {}
        if exactness is Exactness.SHAPELESS:
            return {k: v for k, v in node.params.items() if k not in _compat.SHAPE_PARAMS}
        return {k: v for k, v in node.params.items() if k not in _compat.PLACEMENT_PARAMS}

    def convert(value: Value) -> Pattern:
        if value in memo:
            return memo[value]
        if value.is_const:
            number = value.scalar_value()
            if number is None:
                raise ValueError(f"{what}: pattern examples may only hold scalar constants")
            if exactness is Exactness.STRUCTURE:
                return Var(None, _is_constant)
            return Lit(number)
        node = value.producer
        if node is None:
            raise ValueError(f"{what}: {value} is neither an input nor computed in the example")
        pattern = Pat(
            node.name,
            [convert(v) for v in node.inputs],
            params=params_of(node),
            index=node.outputs.index(value),
        )
        memo[value] = pattern
        return pattern

    outputs = tuple(convert(v) for v in graph.outputs)
    if not isinstance(outputs[0], Pat):
        raise ValueError(f"the first output of {what} is not computed")
    reachable = pattern_nodes(outputs[0])
    for out in outputs[1:]:
        if id(out) not in reachable:
            raise ValueError(f"output {out} of {what} is not computed on the way to its first")
    return ExamplePattern(outputs[0], outputs, tuple(names))
