"""fuse-global-norm: optax's global norm of a gradient tree becomes one `global_norm` node.

optax.global_norm, after canonicalize:

    s0 = reduce_sum[axes=all] (square g0)
    s1 = reduce_sum[axes=all] (square g1)          n = jgsess.global_norm g0 g1 g2
    t  = add (add s0 s1) s2                  ->
    n  = sqrt t

The sums must form one chain, added left to right (in either operand order: addition commutes
exactly), as Python's `sum` over the leaves does; the kernel adds the tensors' sums in that
order. Interior values may have no other users. Guard: every tensor is f32 (XLA squares and sums
narrower ones in their own precision).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ...ir import ops
from ...ir.graph import Graph, Node, Value
from ...kernels import global_norm
from ..manager import Context
from .engine import Fusion, Rewrite


def _only_use(graph: Graph, value: Value, user: Node) -> bool:
    return graph.output_uses(value) == 0 and value.users == [user]


def _term(graph: Graph, value: Value) -> tuple[Value, list[Node]] | None:
    """(x, nodes) if `value` is reduce_sum[all axes](square x) used only where it is; a convert
    to the same dtype between them (a weakly typed leaf made strong) goes with them."""
    reduce = value.producer
    if reduce is None or reduce.name != "reduce_sum" or not graph.is_rewritable(reduce):
        return None
    (squared,) = reduce.inputs
    nodes, user = [reduce], reduce  # the nodes from the square on, and the square's one user
    convert = squared.producer
    if (
        convert is not None
        and ops.is_same_dtype_convert(convert)
        and graph.is_rewritable(convert)
        and _only_use(graph, squared, reduce)
    ):
        nodes, user = [convert, reduce], convert
        (squared,) = convert.inputs
    square = squared.producer
    if square is None or square.name != "square" or not graph.is_rewritable(square):
        return None
    x = square.inputs[0]
    if tuple(reduce.params.get("axes", ())) != tuple(range(x.ndim)) or x.dtype != np.float32:
        return None
    return (x, [square, *nodes]) if _only_use(graph, squared, user) else None


def _chain(graph: Graph, value: Value) -> tuple[list[Value], list[Node]] | None:
    """The tensors whose sums of squares add up to `value`, in order, and the nodes doing it.

    Walked from the last addition down (a loop: a chain has one addition per leaf, thousands
    for a large model): each addition adds one term to the chain before it."""
    pieces = []  # (tensor, its nodes), last term first
    while (term := _term(graph, value)) is None:
        node = value.producer
        if node is None or node.name != "add" or not graph.is_rewritable(node):
            return None
        for rest, last in (node.inputs, node.inputs[::-1]):
            tail = _term(graph, last)
            if tail and _only_use(graph, rest, node) and _only_use(graph, last, node):
                break
        else:
            return None
        pieces.append((tail[0], [*tail[1], node]))
        value = rest
    pieces.append(term)
    pieces.reverse()
    return [x for x, _ in pieces], [n for _, nodes in pieces for n in nodes]


def find(graph: Graph, node: Node, ctx: Context, memo: dict) -> Iterator[Rewrite]:
    if not graph.is_rewritable(node):
        return
    found = _chain(graph, node.inputs[0])
    if found is not None:
        tensors, matched = found
        fused = Node(global_norm.SPEC, tensors, [node.outputs[0].aval], {})
        yield Rewrite(
            "global_norm", [(fused, node)], [(node.outputs[0], fused.outputs[0])], [*matched, node]
        )


PASS = Fusion("fuse-global-norm", frozenset({"sqrt"}), find, doc=__doc__).as_pass()
