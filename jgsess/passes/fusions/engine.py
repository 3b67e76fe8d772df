"""The fusion driver: every fusion is match, guard, replace, record, done here in one way.

A fusion (one file under passes/fusions/) is a `Fusion`: the op names of the nodes it starts
from and `find(graph, root, ctx, memo)`, which matches the graph around `root`, checks what the
match means (dtypes, shapes, users of the mask, ...: the guard) and yields `Rewrite`s, the
candidate replacements in order of preference. The driver supplies what every fusion needs:

  - nodes are visited consumers first (as MindSpore does; `producers_first` for fusions that
    share a new node between later ones), each tried as a root;
  - a rewrite is taken only if values computed by the nodes it removes have no users outside
    them, unless the rewrite replaces them (the results of the fused node);
  - and only if no new node reads a value computed from a node whose results it replaces (a
    cycle);
  - the new nodes are inserted, the replaced values' users moved over, the old nodes removed;
  - the fusion is recorded for the report; a hardware fusion (`hardware`: its kernels, run
    after selection) is taken only where jgsess/selection.py allows its kernels, and recorded
    as declined otherwise;
    a rewrite whose kernels are chosen for its own shapes (by measurement) says so with
    `Rewrite.would_select`, asked only once the checks above pass, and is declined the same way.

Pattern fusions (the optimizer updates) build their `find` with `pattern_fusion` from
`FusionRule(pattern, build)`s: `build(graph, match, outputs)` is the guard and returns the fused
node, whose results replace `outputs` (the values the pattern's outputs matched), or None. A
rule's `would_select(node, ctx)` is the rewrite's `would_select`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ... import selection
from ...ir import ops
from ...ir.dtypes import NARROW
from ...ir.graph import Graph, Node, Value
from ...patterns import Match, match
from ..manager import Context, Pass
from .by_example import ExamplePattern


@dataclass
class Rewrite:
    """One candidate replacement: `added` nodes, each inserted before a node; the `replaced`
    (old value, new value) pairs; the `removed` nodes; the kernel's name for the record.

    `more_kernels`: kernels the record counts as fused with it (a backward beside its forward).
    `would_select(ctx)`: whether selection would take this rewrite's kernels for its shapes,
    and if not, why; asked only for a rewrite the driver would otherwise take, so it may measure.
    `on_apply(ctx)`: records what only this fusion reports, once the rewrite is applied.
    """

    kernel: str
    added: list[tuple[Node, Node]]
    replaced: list[tuple[Value, Value]]
    removed: list[Node] = field(default_factory=list)
    more_kernels: tuple[str, ...] = ()
    would_select: Callable[[Context], tuple[bool, str]] | None = None
    on_apply: Callable[[Context], None] | None = None


Find = Callable[[Graph, Node, Context, dict], Iterable[Rewrite]]


@dataclass(frozen=True)
class Fusion:
    """A fusion pass. `memo` is a dict that lives for one run over one graph."""

    name: str
    roots: frozenset[str] | None  # op names of the nodes tried as roots; None: every node
    find: Find
    doc: str = ""
    producers_first: bool = False
    recursive: bool = True
    # the kernels of a hardware fusion, run after selection: taken only where
    # selection.decide_fusion allows them
    hardware: tuple = ()

    def as_pass(self) -> Pass:
        return Pass(self.name, functools.partial(run, self), self.recursive, self.doc)


def _contained(graph: Graph, rewrite: Rewrite) -> bool:
    removed = set(rewrite.removed)
    replaced = {old for old, _ in rewrite.replaced}
    for node in rewrite.removed:
        if not graph.is_live(node):
            return False
        for value in node.outputs:
            if value in replaced:
                continue
            if graph.output_uses(value) or any(user not in removed for user in value.users):
                return False
    return True


def _acyclic(graph: Graph, rewrite: Rewrite, order: dict) -> bool:
    """No new node reads a value computed from a node whose results it replaces."""
    new = {value for node, _ in rewrite.added for value in node.outputs}
    for node, _ in rewrite.added:
        mine = set(node.outputs)
        replaced = {
            old.producer
            for old, value in rewrite.replaced
            if value in mine and old.producer is not None
        }
        inputs = [v for v in node.inputs if v not in new]
        if replaced and graph.depends_on(inputs, replaced, order):
            return False
    return True


def apply(graph: Graph, rewrite: Rewrite) -> None:
    for node, before in rewrite.added:
        graph.insert(node, before=before)
    for old, new in rewrite.replaced:
        graph.replace_uses(old, new)
    for node in rewrite.removed:
        graph.remove(node)


def run(fusion: Fusion, graph: Graph, ctx: Context) -> int:
    allowed = selection.decide_fusion(ctx.target, fusion.hardware)
    order = {node: i for i, node in enumerate(graph.nodes)}
    memo: dict = {}
    nodes = graph.live() if fusion.producers_first else graph.live()[::-1]
    count = 0
    for node in nodes:
        if (fusion.roots is not None and node.name not in fusion.roots) or not graph.is_live(node):
            continue
        for rewrite in fusion.find(graph, node, ctx, memo):
            if not (_contained(graph, rewrite) and _acyclic(graph, rewrite, order)):
                continue
            take, why = allowed.kernel, allowed.reason
            if take and rewrite.would_select is not None:
                take, why = rewrite.would_select(ctx)
            if not take:
                ctx.record.decline(fusion.name, rewrite.kernel, why)
                break
            apply(graph, rewrite)
            for kernel in (rewrite.kernel, *rewrite.more_kernels):
                ctx.record.fused(fusion.name, kernel)
            if rewrite.on_apply is not None:
                rewrite.on_apply(ctx)
            count += 1
            break
    return count


@dataclass(frozen=True)
class FusionRule:
    pattern: ExamplePattern
    build: Callable[[Graph, Match, list], Node | None]
    # every output but the root must be read outside the match (an optimizer's new state)
    results_used: bool = False
    # the match computed the fused node's first result negated: a `neg` of it replaces it
    negated: bool = False
    # checked on the root value before matching (how it is read, say); None: any root
    root_guard: Callable[[Graph, Value], bool] | None = None
    # whether selection would take the fused node's kernel (Rewrite.would_select); None: it would
    would_select: Callable[[Node, Context], tuple[bool, str]] | None = None


def _used_outside(graph: Graph, value: Value, nodes: set[Node]) -> bool:
    return graph.output_uses(value) > 0 or any(user not in nodes for user in value.users)


@dataclass
class _RuleTable:
    """A pattern fusion's rules by the op of their patterns' root, traced on first use: the
    `rules()`, and for a bf16/f16 root the `narrow_rules()` after them."""

    rules: Callable[[], list[FusionRule]]
    narrow_rules: Callable[[], list[FusionRule]] | None
    tables: dict = field(default_factory=dict)

    def by_op(self, narrow: bool) -> dict[str, list[FusionRule]]:
        if narrow not in self.tables:
            table: dict[str, list[FusionRule]] = {}
            make = self.narrow_rules if narrow and self.narrow_rules is not None else self.rules
            for rule in make():
                for op in rule.pattern.root.ops:
                    table.setdefault(op, []).append(rule)
            self.tables[narrow] = table
        return self.tables[narrow]

    def candidates(self, root_node: Node) -> Iterator[FusionRule]:
        yield from self.by_op(False).get(root_node.name, ())
        if self.narrow_rules is not None and any(v.dtype in NARROW for v in root_node.outputs):
            yield from self.by_op(True).get(root_node.name, ())


def _rewrites(graph: Graph, rule: FusionRule, root_node: Node) -> Iterator[Rewrite]:
    """The rewrites of `rule`'s matches at `root_node` that its guard (`build`) accepts."""
    pattern = rule.pattern
    root = root_node.outputs[pattern.root.index]
    if rule.root_guard is not None and not rule.root_guard(graph, root):
        return
    for m in match(pattern.root, root):
        nodes = m.nodes(pattern.nodes())
        outputs = [m.value_of(p) for p in pattern.outputs]
        inside = set(nodes)
        if rule.results_used and not all(_used_outside(graph, v, inside) for v in outputs[1:]):
            continue
        fused = rule.build(graph, m, outputs)
        if fused is None:
            continue
        added, results = [(fused, root_node)], list(fused.outputs)
        if rule.negated:
            neg = ops.make("neg", [results[0]], outputs[0].aval)
            added.append((neg, root_node))
            results[0] = neg.outputs[0]
        would_select = rule.would_select and functools.partial(rule.would_select, fused)
        replaced = list(zip(outputs, results))
        yield Rewrite(fused.op.name, added, replaced, nodes, would_select=would_select)


def pattern_fusion(
    name: str,
    rules: Callable[[], list[FusionRule]],
    doc: str = "",
    needs: frozenset = frozenset(),
    narrow_rules: Callable[[], list[FusionRule]] | None = None,
) -> Fusion:
    """A fusion trying `rules()` (traced once, on first use) at every root, in order.

    `needs`: op names of which every rule's pattern has a node matching only these; a graph
    with none of them cannot match, and its rules are not even traced (tracing AdamW's 24
    forms is a visible part of a small program's first compile in every new process, and
    ResNet steps have no `sqrt`: benchmarks/compile_time.py).
    `narrow_rules()`: more rules, tried after them at a bf16/f16 root only (forms a program
    written in a narrow dtype spells differently), traced on the first such root."""
    table = _RuleTable(rules, narrow_rules)

    def find(graph: Graph, root_node: Node, ctx: Context, memo: dict) -> Iterator[Rewrite]:
        if needs:
            if "has_needed_ops" not in memo:
                memo["has_needed_ops"] = not needs.isdisjoint(n.name for n in graph.live())
            if not memo["has_needed_ops"]:
                return
        for rule in table.candidates(root_node):
            yield from _rewrites(graph, rule, root_node)

    return Fusion(name, None, find, doc)
