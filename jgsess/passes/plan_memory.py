"""plan-memory: in-place results, the memory plan, and the workspace arena
[KernelRuntime::AssignMemory].

    p2 m2 v2 = jgsess.adamw[impl=kernel] ... p g m v
 -> p2 m2 v2 = jgsess.adamw[impl=kernel, aliases=((10, 0), (12, 1), (13, 2))] ... p g m v

Every kernel gets the in-place pairs it may use (with `donate_argnums` covering params and
optimizer state, the update then runs in place); kernels with scratch get their offset in the
program's one workspace arena. The whole graph's memory plan changes nothing in the program, so
it is computed only when asked for: by the report, and for JGSESS_DUMP (JSON, a PNG timeline).
"""

from __future__ import annotations

import importlib.util
import os

from ..ir.graph import Graph
from ..memory import Buffer, choose_aliases, plan_memory
from ..memory.allocator import allocate
from ..memory.lifetimes import aligned
from .manager import Context, Pass


def _aliases(graph: Graph, ctx: Context) -> int:
    order = {node: i for i, node in enumerate(graph.nodes)}
    count = 0
    for node in graph.live():
        if not node.is_fused or node.params.get("impl") != "kernel":
            continue
        decision = choose_aliases(graph, node, order)
        node.params["aliases"] = decision.pairs
        count += len(decision.pairs)
        if graph.inputs and decision.undonated:
            ctx.record.undonated.append(decision.undonated)
    return count


def _workspaces(graph: Graph) -> None:
    """Offsets in the graph's one workspace arena for its kernels' scratch, reused over time."""
    wanted = []
    for step, node in enumerate(graph.live()):
        if node.is_fused and node.params.get("impl") == "kernel" and node.op.workspace:
            size = node.op.workspace(node.op.static(node.params), [v.aval for v in node.inputs])
            if size:
                wanted.append(
                    (node, size, Buffer(node.name, aligned(size), step, step, "workspace"))
                )
    placed, peak, _ = allocate([b for *_, b in wanted]) if wanted else ({}, 0, "")
    for node, size, b in wanted:
        node.params["workspace"] = (placed[id(b)], size)
    graph.arena_bytes = peak


def run(graph: Graph, ctx: Context) -> int:
    count = sum(_aliases(g, ctx) for g in graph.walk())
    for g in graph.walk():
        _workspaces(g)
    if not ctx.plan:
        return count
    plan = plan_memory(graph)
    ctx.record.memory_plan = plan
    if ctx.dump_dir:
        with open(os.path.join(ctx.dump_dir, "memory_plan.json"), "w") as f:
            f.write(plan.to_json())
        if importlib.util.find_spec("matplotlib") is not None:  # the picture is optional
            plan.timeline(os.path.join(ctx.dump_dir, "memory_plan.png"))
    return count


PASS = Pass("plan-memory", run, recursive=False, doc=__doc__)
