"""remove-transpose-pair [RemoveFormatTransformPair] (its sibling RemoveRedundantFormatTransform
is dedup-transpose: passes/dedup.py).

    b = transpose[permutation=(1,0)] a
    c = transpose[permutation=(1,0)] b            ->   c is a
"""

from __future__ import annotations

from ..ir.graph import Graph
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


PAIR_PASS = Pass("remove-transpose-pair", remove_pairs, doc=__doc__)
