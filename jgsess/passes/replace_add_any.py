"""replace-add-any: `add_any` (how autodiff sums cotangents) becomes a plain `add`
[ReplaceAddNFusion], so patterns written with `add` see gradient sums too.

    c = add_any a b          ->   c = add a b
"""

from __future__ import annotations

import numpy as np

from ..ir import ops
from ..ir.graph import Graph
from ..patterns import Pat, Var, rewrite
from .manager import Context, Pass


def _to_add(graph: Graph, m):
    a, b = m["a"], m["b"]
    numeric = a.dtype is not None and np.issubdtype(a.dtype, np.number)
    if not numeric or a.aval != b.aval or a.aval != m.root.aval:
        return None
    node = ops.make("add", [a, b], m.root.aval)
    graph.insert(node, before=m.root.producer)
    return node.outputs[0]


RULES = [(Pat("add_any", [Var("a"), Var("b")]), _to_add)]


def run(graph: Graph, ctx: Context | None) -> int:
    return rewrite(graph, RULES)


PASS = Pass("replace-add-any", run, doc=__doc__)
