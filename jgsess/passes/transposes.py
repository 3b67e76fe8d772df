"""Transpose cleanups [RemoveFormatTransformPair, RemoveRedundantFormatTransform].

remove-transpose-pair:
    b = transpose[permutation=(1,0)] a
    c = transpose[permutation=(1,0)] b            ->   c is a

dedup-transpose:
    b = transpose[permutation=(0,2,1)] a
    c = transpose[permutation=(0,2,1)] a          ->   c is b
"""

from __future__ import annotations

from ..ir.graph import Graph, Value
from ..patterns import Pat, Var, rewrite
from .manager import Context, Pass


def _cancel(graph: Graph, m):
    inner = m.value_of(INNER).producer.params["permutation"]
    outer = m.root.producer.params["permutation"]
    if all(inner[outer[i]] == i for i in range(len(outer))) and m["x"].aval == m.root.aval:
        return m["x"]
    return None


INNER = Pat("transpose", [Var("x")])
RULES = [(Pat("transpose", [INNER]), _cancel)]


def remove_pairs(graph: Graph, ctx: Context | None) -> int:
    return rewrite(graph, RULES)


def dedup(graph: Graph, ctx: Context | None) -> int:
    count = 0
    first: dict[tuple, Value] = {}
    for node in graph.live():
        if node.name != "transpose" or not graph.is_rewritable(node):
            continue
        key = (node.inputs[0], tuple(node.params["permutation"]))
        if key in first:
            count += graph.replace_uses(node.outputs[0], first[key]) > 0
        else:
            first[key] = node.outputs[0]
    return count


PAIR_PASS = Pass("remove-transpose-pair", remove_pairs, doc=__doc__)
DEDUP_PASS = Pass("dedup-transpose", dedup, doc=__doc__)
