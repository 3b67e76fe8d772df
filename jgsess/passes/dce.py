"""dce: dead code and forwarding cleanup [GetitemTuple].

    b = cos a                         (b unused, no effects)      -> removed
    c d = jit[...]{ graph(x, y) -> (y, sin x) } a e              -> c uses e directly
    f = cond i a { -> (x) } { -> (x) }                           -> f uses a directly

Nodes with effects (`debug_print`, callbacks) always stay. An intact custom_jvp/vjp region lives
or dies as a whole, so emission can still bind the original call.
"""

from __future__ import annotations

from .. import _compat
from ..ir.graph import Graph, Node, Region, Value
from .manager import Context, Pass


def _forwarded(node: Node) -> dict[int, Value]:
    """Outputs of a call-like node that are just one of its inputs, by output index."""
    if _compat.is_jit(node.name) and _compat.JIT_BODY in node.subgraphs:
        sub = node.body(_compat.JIT_BODY)
        positions = {v: i for i, v in enumerate(sub.inputs)}
        return {
            k: node.inputs[positions[out]] for k, out in enumerate(sub.outputs) if out in positions
        }
    if node.name == "cond":
        branches = node.bodies(_compat.COND_BRANCHES)
        found = {}
        for k in range(len(node.outputs)):
            picks: set[int | None] = set()
            for sub in branches:
                out = sub.outputs[k]
                picks.add(sub.inputs.index(out) if out in sub.inputs else None)
            pick = picks.pop() if len(picks) == 1 else None
            if pick is not None:
                found[k] = node.inputs[1 + pick]  # operand 0 is the branch index
        return found
    return {}


def forward(graph: Graph) -> int:
    count = 0
    for node in graph.live():
        if not graph.is_rewritable(node):
            continue
        for k, source in _forwarded(node).items():
            out = node.outputs[k]
            if source.aval == out.aval and graph.num_uses(out):
                count += graph.replace_uses(out, source) > 0
    return count


def eliminate(graph: Graph) -> int:
    units: dict[Node | Region, list[Node]] = {}
    for node in graph.live():
        units.setdefault(graph.unit_of(node), []).append(node)
    used: set[Value] = set(graph.outputs)
    removed = 0
    for members in reversed(list(units.values())):
        live = any(n.effects for n in members) or any(v in used for n in members for v in n.outputs)
        if live:
            used.update(v for n in members for v in n.inputs)
        else:
            for n in members:
                graph.remove(n, dead=True)
            removed += len(members)
    return removed


def run(graph: Graph, ctx: Context | None) -> int:
    return forward(graph) + eliminate(graph)


PASS = Pass("dce", run, doc=__doc__)
