"""plan-memory: decide what each kernel may compute in place [KernelRuntime::AssignMemory].

    p2 m2 v2 = jgsess.adamw[impl=kernel] ... p g m v
 -> p2 m2 v2 = jgsess.adamw[impl=kernel, aliases=((10, 0), (12, 1), (13, 2))] ... p g m v

With `donate_argnums` covering params and optimizer state, the update then runs in place.
"""

from __future__ import annotations

from ..ir.graph import Graph
from ..memory import choose_aliases
from .manager import Context, Pass


def run(graph: Graph, ctx: Context) -> int:
    order = {node: i for i, node in enumerate(graph.nodes)}
    count = 0
    for node in graph.live():
        if not node.is_fused or node.params.get("impl") != "kernel":
            continue
        decision = choose_aliases(graph, node, order)
        node.params["aliases"] = decision.pairs
        count += len(decision.pairs)
        if graph.inputs and decision.undonated:
            ctx.note("undonated", decision.undonated)
    return count


PASS = Pass("plan-memory", run, recursive=True, doc=__doc__)
