"""combine-optimizers: per-parameter updates that share their hyper-parameters become one
multi-tensor node [CombineMomentumFusion, for every multi-tensor kernel].

    p2 m2 v2 = jgsess.adamw[flags=7] b1 ... lr  p g m v
    q2 n2 w2 = jgsess.adamw[flags=7] b1 ... lr  q h n w
  ->
    p2 m2 v2 q2 n2 w2 = jgsess.adamw[flags=7] b1 ... lr  p g m v  q h n w

Nodes merge when they run the same kernel with the same static params and the same shared
operands (the same traced value, or equal constants), and no member's inputs are computed from
another member's results. A whole parameter tree becomes one call, or a few when dependencies
force it (gradient accumulation inside the step, say).
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from .manager import Context, Pass


def _operand_key(value: Value):
    if value.is_const:
        const = np.asarray(value.const)
        return ("const", const.dtype.str, const.shape, const.tobytes())
    return ("value", value.id)


def _group_key(node: Node) -> tuple:
    spec = node.op
    static = tuple(sorted(spec.static(node.params).items()))
    shared = tuple(_operand_key(v) for v in node.inputs[: spec.layout[0]])
    return spec.name, static, shared


def _merge(graph: Graph, group: list[Node]) -> Node:
    spec = group[0].op
    shared = spec.layout[0]
    inputs = list(group[0].inputs[:shared]) + [v for n in group for v in n.inputs[shared:]]
    avals = [v.aval for n in group for v in n.outputs]
    merged = Node(spec, inputs, avals, group[0].params)
    graph.insert(merged, before=group[-1])
    results = iter(merged.outputs)
    for node in group:
        for old in node.outputs:
            graph.replace_uses(old, next(results))
    for node in group:
        graph.remove(node)
    return merged


def run(graph: Graph, ctx: Context | None) -> int:
    order = {node: i for i, node in enumerate(graph.nodes)}
    # key -> groups, each (members in order, the same as a set)
    groups: dict[tuple, list[tuple[list[Node], set[Node]]]] = {}
    for node in graph.live():
        if not node.is_fused or node.op.layout is None:
            continue
        candidates = groups.setdefault(_group_key(node), [])
        for members, member_set in candidates:
            floor = order[members[0]]
            if not graph.depends_on(node.inputs, member_set, order, floor):
                members.append(node)
                member_set.add(node)
                break
        else:
            candidates.append(([node], {node}))
    merged = 0
    for candidates in groups.values():
        for group, _ in candidates:
            if len(group) > 1:
                _merge(graph, group)
                merged += len(group)
                if ctx is not None:
                    ctx.record.combined.append((group[0].op.name, len(group)))
    return merged


PASS = Pass("combine-optimizers", run, doc=__doc__)
