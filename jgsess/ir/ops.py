"""New elementwise nodes for rewrites, with the params this jax version binds them with.

Primitive params change between jax releases (`mul` gained `out_dtype`, `sqrt` `accuracy`), so
the defaults are read off a traced example instead of being written down here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .graph import Node, Value

_EXAMPLES = {
    "neg": lambda x, y: lax.neg(x),
    "square": lambda x, y: lax.square(x),
    "add": lax.add,
    "sub": lax.sub,
    "mul": lax.mul,
}


@functools.cache
def _template(name: str):
    x = jax.ShapeDtypeStruct((2,), jnp.float32)
    (eqn,) = jax.make_jaxpr(_EXAMPLES[name])(x, x).jaxpr.eqns
    return eqn.primitive, dict(eqn.params)


def make(name: str, inputs: list[Value], aval) -> Node:
    """A node `name(*inputs)` with output aval `aval` (elementwise ops only)."""
    primitive, params = _template(name)
    return Node(primitive, inputs, [aval], params)


def const(value, like: Value) -> Value:
    """A rank-0 constant of `like`'s dtype and weak type."""
    return Value(like.aval.update(shape=()), const=np.asarray(value, dtype=like.dtype))


def is_same_dtype_convert(node: Node | None) -> bool:
    """Whether `node` converts a value to its own dtype (a weakly typed value made strong):
    the values pass through unchanged."""
    return (
        node is not None
        and node.name == "convert_element_type"
        and node.inputs[0].dtype == node.outputs[0].dtype
    )


def convert(value: Value, dtype) -> Node:
    """A node `convert_element_type[dtype](value)`, with this jax version's params."""
    struct = jax.ShapeDtypeStruct(value.shape, value.dtype)
    (eqn,) = jax.make_jaxpr(lambda x: lax.convert_element_type(x, dtype))(struct).jaxpr.eqns
    return Node(eqn.primitive, [value], [eqn.outvars[0].aval], eqn.params)
