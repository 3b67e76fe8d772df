"""The fusion driver: find a traced pattern, check it may be fused, swap in one fused node.

A fusion file lists `FusionRule(pattern, build)`s; `build(graph, match, outputs)` checks the
match's semantics (dtypes, shapes: the guard) and returns the fused node, whose results replace
`outputs` (the values the pattern's outputs matched), or None to decline. The driver
supplies what every fusion needs:

  - nodes are visited consumers first (as MindSpore does), each root tried against each rule;
  - values inside the match may have no users outside it, unless they are results of the fused
    node (the pattern's outputs);
  - no input of the fused node may be computed from one of its results (that would be a cycle);
  - the pattern's outputs are replaced by the fused node's results, the matched nodes removed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ...ir.graph import Graph, Node
from ...patterns import ExamplePattern, Match, match
from ..manager import Context, Pass


@dataclass(frozen=True)
class FusionRule:
    pattern: ExamplePattern
    build: Callable[[Graph, Match, list], Node | None]
    # every output but the root must be read outside the match (an optimizer's new state)
    results_used: bool = False


def _self_contained(graph: Graph, nodes: list[Node], outputs: list) -> bool:
    inside = set(nodes)
    keep = set(outputs)
    for node in nodes:
        for value in node.outputs:
            if value in keep:
                continue
            if graph.output_uses(value) or any(user not in inside for user in value.users):
                return False
    return True


def _used_outside(graph: Graph, value, nodes: list[Node]) -> bool:
    inside = set(nodes)
    return graph.output_uses(value) > 0 or any(user not in inside for user in value.users)


def _try(graph: Graph, rule: FusionRule, root_node: Node, order: dict) -> Node | None:
    pattern = rule.pattern
    patterns = pattern.nodes()
    root = root_node.outputs[pattern.root.index]
    for m in match(pattern.root, root):
        nodes = m.nodes(patterns)
        outputs = [m.value_of(p) for p in pattern.outputs]
        if not all(graph.is_live(n) for n in nodes) or not _self_contained(graph, nodes, outputs):
            continue
        if rule.results_used and not all(_used_outside(graph, v, nodes) for v in outputs[1:]):
            continue
        fused = rule.build(graph, m, outputs)
        if fused is None or graph.depends_on(fused.inputs, set(nodes), order):
            continue
        graph.insert(fused, before=root_node)
        for old, new in zip(outputs, fused.outputs):
            graph.replace_uses(old, new)
        for node in nodes:
            graph.remove(node)
        return fused
    return None


def fuse(graph: Graph, rules: list[FusionRule], ctx: Context | None, name: str) -> int:
    count = 0
    order = {node: i for i, node in enumerate(graph.nodes)}
    for node in reversed(graph.live()):
        if not graph.is_live(node):
            continue
        for rule in rules:
            if node.name not in rule.pattern.root.ops:
                continue
            fused = _try(graph, rule, node, order)
            if fused is not None:
                count += 1
                if ctx is not None:
                    ctx.note("fusions", (name, fused.op.name))
                break
    return count


def fusion_pass(name: str, rules: Callable[[], list[FusionRule]], doc: str = "") -> Pass:
    """A pass applying `rules()` (traced once, on first use)."""
    cached = functools.cache(rules)
    return Pass(name, lambda graph, ctx: fuse(graph, cached(), ctx, name), doc=doc)
