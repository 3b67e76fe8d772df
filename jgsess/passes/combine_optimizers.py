"""combine-optimizers: per-parameter updates that share their hyper-parameters become one
multi-tensor node [CombineMomentumFusion, for every multi-tensor kernel].

    p2 m2 v2 = jgsess.adamw[flags=7] b1 ... lr  p g m v
    q2 n2 w2 = jgsess.adamw[flags=7] b1 ... lr  q h n w
  ->
    p2 m2 v2 q2 n2 w2 = jgsess.adamw[flags=7] b1 ... lr  p g m v  q h n w

Nodes merge when they run the same kernel with the same static params and the same shared
operands, and no member's inputs are computed from another member's results. Shared operands
are the same when they are the same traced value, equal constants, or one effect-free
computation of the same operands: optax converts a schedule's learning rate
(`jnp.array(lr, dtype=g.dtype)`) and, with x64 on, the bias correction (`.astype(t.dtype)`)
once per leaf, and those per-leaf copies are one hyper-parameter. A whole parameter tree
becomes one call per MAX_TENSORS tensors, or a few more when dependencies force it (gradient
accumulation inside the step, say).
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from .manager import Context, Pass

# Tensors per call at most. XLA's compile time grows faster than linearly with the aliased
# operands of one custom call (each result written over its donated operand), so hundreds of
# leaves compile faster as several calls, while the steps run as fast; smaller calls made the
# steps slower (benchmarks/compile_time.py's adamw-500 and adamw-1000 show the first call).
MAX_TENSORS = 128


def _params_key(node: Node):
    """The node's params as a hashable key, or None where one is not hashable."""
    key = tuple(sorted(node.params.items()))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _operand_key(value: Value, memo: dict):
    """Equal keys for values known to be equal: equal constants, or rank-0 results of one
    effect-free primitive applied to operands with equal keys."""
    if value.is_const:
        const = np.asarray(value.const)
        return ("const", const.dtype.str, const.shape, const.tobytes())
    if value.id in memo:
        return memo[value.id]
    node = value.producer
    key: tuple = ("value", value.id)
    if value.ndim == 0 and node is not None and not (node.is_fused or node.effects):
        params = _params_key(node) if not node.subgraphs else None
        if params is not None:
            operands = tuple(_operand_key(v, memo) for v in node.inputs)
            key = ("computed", node.name, params, node.outputs.index(value), operands)
    memo[value.id] = key
    return key


def _group_key(node: Node, memo: dict) -> tuple:
    spec = node.op
    static = tuple(sorted(spec.static(node.params).items()))
    shared = tuple(_operand_key(v, memo) for v in node.inputs[: spec.tensors.shared])
    return spec.name, static, shared


def _merge(graph: Graph, group: list[Node]) -> Node:
    spec = group[0].op
    shared = spec.tensors.shared
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
    memo: dict = {}
    for node in graph.live():
        if not node.is_fused or node.op.tensors is None:
            continue
        candidates = groups.setdefault(_group_key(node, memo), [])
        for members, member_set in candidates:
            if len(members) == MAX_TENSORS:
                continue
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
