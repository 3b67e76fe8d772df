"""canonicalize: one spelling per computation, so each fusion needs one pattern.

    b = integer_pow[y=2] g          b = square g
    c = mul -0.001 u          ->    c = mul 0.001 u
    d = add p c                     d = sub p c

A convert to a value's own dtype (a weakly typed value made strong: parameters made by
`jnp.full`) goes where the program reads the value, so patterns see the value itself.

The learning rate of a schedule arrives as `convert[weak_type=False] (copy (neg lr))` (to bf16
or f16 in a narrow program); the copy goes and the convert moves below the neg, so the same
`sub p (mul lr u)` form results.

Every rule is exact in IEEE arithmetic (signed zeros and NaNs included): a fusion may then match
the canonical form without changing a single bit of what the program computes. Rules that
change signs apply to real floating-point values only, bf16 and f16 included (never to complex
ones, whose products mix real and imaginary parts).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from .. import _compat
from ..ir import ops
from ..ir.graph import Graph, Node, Value
from ..patterns import Lit, Match, Pat, Var, rewrite
from .manager import Context, Pass


def _floating(value: Value) -> bool:
    # real floating point only (bf16 and f16 too, which numpy's own floating does not count):
    # complex products mix the parts, so sign rules are not exact
    return value.dtype is not None and jnp.issubdtype(value.dtype, jnp.floating)


def _new(graph: Graph, m: Match, name: str, *inputs: Value) -> Value:
    node = ops.make(name, list(inputs), m.root.aval)
    graph.insert(node, before=m.node)
    return node.outputs[0]


def _negative_literal(value: Value) -> bool:
    number = value.scalar_value()
    return number is not None and _floating(value) and math.copysign(1.0, number) < 0


def _never_negative_zero(value: Value, depth: int = 4) -> bool:
    """True if `value` can never hold -0.0 (so `value + 0.0` is exactly `value`)."""
    if value.is_const:
        return bool(np.all(~np.signbit(np.asarray(value.const))))
    node = value.producer
    if node is None or depth == 0:
        return False
    if node.name in ("square", "exp", "abs") or (
        node.name == "integer_pow" and node.params.get("y", 1) % 2 == 0
    ):
        return True
    if node.name == "add":
        # in round-to-nearest a sum is -0.0 only when both operands are -0.0
        return any(_never_negative_zero(v, depth - 1) for v in node.inputs)
    if node.name in ("reduce_sum", "sqrt", "broadcast_in_dim") or ops.is_same_dtype_convert(node):
        return _never_negative_zero(node.inputs[0], depth - 1)
    return False


def _square_of_constant(graph: Graph, m: Match) -> Value | None:
    # square (broadcast_in_dim c) -> broadcast_in_dim (c*c): IEEE multiplication, as XLA's
    broadcast = m.node_of(BROADCAST)
    c = m["c"]
    if not _floating(c) or c.scalar_value() is None:
        return None
    node = Node(
        broadcast.op,
        [ops.const(np.square(np.asarray(c.const)), c)],
        [m.root.aval],
        broadcast.params,
    )
    graph.insert(node, before=m.node)
    return node.outputs[0]


def _drop_scalar_broadcasts(graph: Graph, m: Match) -> Value | None:
    # add x (broadcast_in_dim s) -> add x s   (jax broadcasts a rank-0 operand itself)
    node = m.node
    for i, operand in enumerate(node.inputs):
        other = node.inputs[1 - i]
        producer = operand.producer
        if (
            producer is not None
            and producer.name == "broadcast_in_dim"
            and producer.inputs[0].ndim == 0
            and producer.inputs[0].dtype == operand.dtype
            and other.shape == m.root.shape
            and graph.is_rewritable(producer)
        ):
            graph.set_input(node, i, producer.inputs[0])
            return m.root
    return None


def _sink_convert(graph: Graph, m: Match) -> Value | None:
    # rounding to nearest even (and a weak-type-only convert) is symmetric in the sign
    convert = m.node
    if not (_floating(m["x"]) and _floating(m.root)):
        return None
    moved = Node(convert.op, [m["x"]], [m.root.aval], convert.params)
    graph.insert(moved, before=convert)
    return _new(graph, m, "neg", moved.outputs[0])


def _same_aval(m: Match) -> bool:
    return m["x"].aval == m.root.aval


def _own_dtype(graph: Graph, m: Match) -> Value | None:
    # the values pass unchanged. A convert that only makes a weakly typed x strong goes too
    # where the program uses its value (a weak type decides dtype promotion while jax traces,
    # which is over: jnp.full's parameters, a Python scalar's products): what a result of the
    # program (or of a loop's body) is keeps the type jax.jit gives it
    if m["x"].aval == m.root.aval:
        return m["x"]
    if m["x"].dtype == m.root.dtype and not graph.output_uses(m.root):
        return m["x"]
    return None


x, y = Var("x"), Var("y")
PLAIN = _compat.SAME_DTYPE  # a mul that does not change dtype
BROADCAST = Pat("broadcast_in_dim", [Var("c", lambda v: v.is_const and v.ndim == 0)])
RULES = [
    # integer_pow[y=1] x -> x
    (Pat("integer_pow", [x], params={"y": 1}), lambda g, m: m["x"]),
    # integer_pow[y=2] x -> square x ; mul x x -> square x
    (
        Pat("integer_pow", [x], params={"y": 2}),
        lambda g, m: _new(g, m, "square", m["x"]) if _floating(m["x"]) else None,
    ),
    (
        Pat("mul", [x, x], params=PLAIN),
        lambda g, m: _new(g, m, "square", m["x"]) if _floating(m["x"]) else None,
    ),
    # mul 1.0 x -> x
    (Pat("mul", [Lit(1.0), x], params=PLAIN), lambda g, m: m["x"] if _same_aval(m) else None),
    # mul -1.0 x -> neg x
    (
        Pat("mul", [Lit(-1.0), x], params=PLAIN),
        lambda g, m: _new(g, m, "neg", m["x"]) if _floating(m["x"]) and _same_aval(m) else None,
    ),
    # neg (neg x) -> x
    (Pat("neg", [Pat("neg", [x])]), lambda g, m: m["x"]),
    # square (broadcast_in_dim c) -> broadcast_in_dim (c*c)  (optax's |x|^2 of a real x)
    (Pat("square", [BROADCAST]), _square_of_constant),
    # mul c x (c < 0 literal) -> neg (mul -c x)
    (
        Pat("mul", [Var("c", _negative_literal), x], params=PLAIN),
        lambda g, m: _new(
            g, m, "neg", _new(g, m, "mul", ops.const(-m["c"].scalar_value(), m["c"]), m["x"])
        ),
    ),
    # mul (neg a) b -> neg (mul a b)
    (
        Pat("mul", [Pat("neg", [x]), y], params=PLAIN),
        lambda g, m: (
            _new(g, m, "neg", _new(g, m, "mul", m["x"], m["y"])) if _floating(m.root) else None
        ),
    ),
    # add a (neg b) -> sub a b ; sub a (neg b) -> add a b
    (Pat("add", [x, Pat("neg", [y])]), lambda g, m: _new(g, m, "sub", m["x"], m["y"])),
    (Pat("sub", [x, Pat("neg", [y])]), lambda g, m: _new(g, m, "add", m["x"], m["y"])),
    # add x -0.0 -> x ; sub x 0.0 -> x ; add x 0.0 -> x where x is never -0.0
    (Pat("add", [x, Lit(-0.0)]), lambda g, m: m["x"] if _same_aval(m) else None),
    (Pat("sub", [x, Lit(0.0)]), lambda g, m: m["x"] if _same_aval(m) else None),
    (
        Pat("add", [x, Lit(0.0)]),
        lambda g, m: m["x"] if _same_aval(m) and _never_negative_zero(m["x"]) else None,
    ),
    # convert_element_type x to its own dtype -> x ; copy x -> x
    (Pat("convert_element_type", [x]), _own_dtype),
    (Pat("copy", [x]), lambda g, m: m["x"] if _same_aval(m) else None),
    # a float-to-float convert of (neg x) -> neg (convert x), so the neg can meet its add
    (Pat("convert_element_type", [Pat("neg", [x])]), _sink_convert),
]
if _compat.SCALAR_OPERANDS:
    # a broadcast operand in either place (add, mul, max and min match either order)
    SCALAR = Pat("broadcast_in_dim", [y])
    RULES += [
        (Pat(("add", "mul", "max", "min"), [SCALAR, x]), _drop_scalar_broadcasts),
        (Pat(("sub", "div"), [SCALAR, x]), _drop_scalar_broadcasts),
        (Pat(("sub", "div"), [x, SCALAR]), _drop_scalar_broadcasts),
    ]


def run(graph: Graph, ctx: Context) -> int:
    return rewrite(graph, RULES)


PASS = Pass("canonicalize", run, doc=__doc__)
