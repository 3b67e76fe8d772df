"""Pattern by example at exact shapes: find a traced example graph inside a program.

`from_function` makes a tree pattern with one root, shapes left out. Some computations need
more: a training-mode BatchNorm's backward has several outputs (dx, dscale, dbias) that no one
root reaches, and its reductions' axes depend on the rank and layout. `embed` traces nothing
itself; it takes an example graph traced at the program's own shapes (canonicalized as the
program was) and finds a one-to-one image of every example node in the program, starting from
one anchor pair and spreading along values in both directions:

    example: t = sub x m ; y = max t 0.0        program: q = sub a k ; r = max q 0.0
    anchor (max, max)  ->  sub's image is q's producer; x -> a, m -> k

Nodes correspond when their op, params (shardings aside), input count and output avals agree;
`add`/`mul`/`max`/`min` may swap their operands. Ops that only insert or drop unit
dimensions (`reshape`, `broadcast_in_dim`, `squeeze`, `expand_dims`, a `reduce_sum` over unit
axes) count as one op: flax.linen and flax.nnx differ there, and so do their transposes. An
example input binds any program value of its aval; an example literal matches an equal program
literal, except `wildcards` (literal value -> name), which bind any rank-0 program constant of
their dtype (an epsilon the example cannot know in advance).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..ir.graph import Graph, Node, Value
from .matcher import same_value
from .pat import COMMUTATIVE

_RESHAPES = frozenset({"reshape", "broadcast_in_dim", "squeeze", "expand_dims", "reduce_sum"})
_MAX_STEPS = 20000


@dataclass
class Embedding:
    """Example value -> program value, example node -> program node, bound wildcards."""

    values: dict[Value, Value] = field(default_factory=dict)
    nodes: dict[Node, Node] = field(default_factory=dict)
    wildcards: dict[str, Value] = field(default_factory=dict)

    def copy(self) -> Embedding:
        return Embedding(dict(self.values), dict(self.nodes), dict(self.wildcards))


def _same_aval(a: Value, b: Value) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype


def _unit_reshape(node: Node) -> bool:
    """Whether `node` only inserts or drops unit dimensions (a reshape in effect)."""
    if node.name not in _RESHAPES or len(node.inputs) != 1 or len(node.outputs) != 1:
        return False
    x, out = node.inputs[0], node.outputs[0]
    if node.name == "reduce_sum" and any(x.shape[a] != 1 for a in node.params.get("axes", ())):
        return False
    return out.dtype == x.dtype and [d for d in out.shape if d != 1] == [
        d for d in x.shape if d != 1
    ]


def _same_op(e: Node, p: Node) -> bool:
    if p.is_fused:
        return False
    if e.name != p.name or e.name in _RESHAPES:
        if _unit_reshape(e) and _unit_reshape(p):
            return True
        if e.name != p.name:
            return False
    keys = {k for k in (*e.params, *p.params) if "shard" not in k}  # shardings aside
    return all(_same_param(e.params.get(k), p.params.get(k)) for k in keys)


def _same_param(a, b) -> bool:
    try:
        return bool(a == b) if not isinstance(a, np.ndarray) else np.array_equal(a, b)
    except (TypeError, ValueError):
        return a is b


def _order(example: Graph, anchor: Node) -> list[tuple[Node, Value | None]]:
    """Example nodes in the order they are matched, each with the value linking it to an
    earlier one (the anchor has none)."""
    seen = {anchor}
    order: list[tuple[Node, Value | None]] = [(anchor, None)]
    for node, _ in order:
        for value in [*node.inputs, *node.outputs]:
            if value.is_const:
                continue
            linked = [value.producer] if value.producer is not None else []
            for other in [*linked, *value.users]:
                if other not in seen:
                    seen.add(other)
                    order.append((other, value))
    return order


def _same_const(a, b, dtype) -> bool:
    x, y = np.asarray(a, dtype), np.asarray(b, dtype)
    return x.shape == y.shape and x.tobytes() == y.tobytes()


def _bind_input(ex: Value, prog: Value, state: Embedding, wildcards: dict, images: set) -> bool:
    if ex in state.values:
        return same_value(state.values[ex], prog)
    if ex.is_const:
        number = ex.scalar_value()
        name = wildcards.get(number) if number is not None else None
        if name is not None:
            if prog.ndim != 0 or not prog.is_const or prog.dtype != ex.dtype:
                return False
            state.wildcards[name] = prog
            return True
        return (
            prog.is_const and prog.dtype == ex.dtype and _same_const(ex.const, prog.const, ex.dtype)
        )
    if not _same_aval(ex, prog) or prog in images:
        return False
    state.values[ex] = prog
    images.add(prog)
    return True


def _bind(e: Node, p: Node, state: Embedding, wildcards: dict) -> Iterator[Embedding]:
    if not _same_op(e, p) or len(e.inputs) != len(p.inputs) or len(e.outputs) != len(p.outputs):
        return
    if not all(_same_aval(a, b) for a, b in zip(e.outputs, p.outputs)):
        return
    orders = [list(p.inputs)]
    if e.name in COMMUTATIVE and len(p.inputs) == 2:
        orders.append(orders[0][::-1])
    for inputs in orders:
        new = state.copy()
        images = set(new.values.values())
        new.nodes[e] = p
        ok = all(_bind_input(a, b, new, wildcards, images) for a, b in zip(e.inputs, inputs))
        for a, b in zip(e.outputs, p.outputs):
            if not ok:
                break
            if a in new.values:
                ok = new.values[a] is b
            elif b in images:
                ok = False
            else:
                new.values[a] = b
                images.add(b)
        if ok:
            yield new


def embed(
    example: Graph, anchor: Node, target: Node, wildcards: dict | None = None
) -> Embedding | None:
    """The first embedding of `example` in `target`'s graph with `anchor` -> `target`, or None.

    Args:
      example: a graph traced from a reference function at the program's shapes.
      anchor: a node of `example`; `target`: the program node it must map to.
      wildcards: example literal value -> name, for literals that bind any program constant.
    """
    wildcards = wildcards or {}
    order = _order(example, anchor)
    steps = [0]

    def search(i: int, state: Embedding) -> Embedding | None:
        if i == len(order):
            return state
        steps[0] += 1
        if steps[0] > _MAX_STEPS:
            return None
        node, link = order[i]
        if link is None:
            candidates = [target]
        else:
            image = state.values.get(link)
            if image is None:
                return None
            if link.producer is node:
                candidates = [image.producer] if image.producer is not None else []
            else:
                candidates = list(dict.fromkeys(image.users))
        used = set(state.nodes.values())
        for candidate in candidates:
            if candidate is None or candidate in used:
                continue
            for extended in _bind(node, candidate, state, wildcards):
                found = search(i + 1, extended)
                if found is not None:
                    return found
        return None

    return search(0, Embedding())
