"""Matching patterns against a graph, and the rule-table rewrite driver.

`match(pattern, value)` yields every way the pattern matches at `value` (commutative operands
make several). A name, or a pattern node, met twice must match the same value; two literals of
the same value count as one (a jaxpr gives every use of a literal its own). A `Match` holds
the named captures and the value each pattern node matched.

`rewrite(graph, rules)` applies a rule table: each rule is `(pattern, fn)`; `fn(graph, match)`
returns the value that replaces the pattern's root (`match.root`), the root itself after editing
its node in place, or None to decline. Unknown ops pass through.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..ir.graph import Graph, Node, Value
from .pat import Lit, Pat, Pattern, Var


@dataclass
class Match:
    """One way a pattern matched: captures by name, and pattern node -> matched value."""

    root: Value  # the value the pattern's root matched
    captures: dict[str, Value] = field(default_factory=dict)
    values: dict[int, Value] = field(default_factory=dict)

    @property
    def node(self) -> Node:
        """The node whose output the root matched (a `Pat` root's)."""
        return self.node_of_value(self.root)

    def node_of(self, pattern: Pattern) -> Node:
        """The node whose output `pattern` (a `Pat`) matched."""
        return self.node_of_value(self.value_of(pattern))

    @staticmethod
    def node_of_value(value: Value) -> Node:
        node = value.producer
        if node is None:
            raise ValueError("a Pat matches node outputs only")
        return node

    def __getitem__(self, name: str) -> Value:
        return self.captures[name]

    def get(self, name: str, default=None):
        return self.captures.get(name, default)

    def value_of(self, pattern: Pattern) -> Value:
        return self.values[id(pattern)]

    def nodes(self, patterns: dict[int, Pattern]) -> list[Node]:
        """The nodes matched by `Pat`s (in `patterns`, pattern id -> pattern)."""
        seen: dict[Node, None] = {}
        for key, value in self.values.items():
            if isinstance(patterns[key], Pat):
                seen[self.node_of_value(value)] = None
        return list(seen)

    def _with(self, pattern: Pattern, value: Value) -> Match:
        captures = dict(self.captures)
        if pattern.name is not None:
            captures[pattern.name] = value
        values = dict(self.values)
        values[id(pattern)] = value
        return Match(self.root, captures, values)


def same_value(a: Value, b: Value) -> bool:
    """One value, or two constants with the same aval and bits (each literal use is a Value)."""
    if a is b:
        return True
    if not (a.is_const and b.is_const) or a.aval != b.aval:
        return False
    x, y = np.asarray(a.const), np.asarray(b.const)
    return x.shape == y.shape and x.tobytes() == y.tobytes()


def match(pattern: Pattern, value: Value, state: Match | None = None) -> Iterator[Match]:
    """Every way `pattern` matches at `value`, extending `state`."""
    node = None
    if isinstance(pattern, Pat):
        # the node's own checks first, before any state: most attempts end here (a value a
        # Pat matched before is a node's output too, so the order changes no outcome)
        node = value.producer
        if node is None or node.name not in pattern.ops or node.is_fused:
            return
        if node.outputs[pattern.index] is not value or len(node.inputs) != len(pattern.srcs):
            return
        if state is None and not _may_match(pattern, node):
            return
    state = state or Match(root=value)
    seen = state.values.get(id(pattern))
    if seen is not None:
        if same_value(seen, value):
            yield state
        return
    if pattern.name is not None and pattern.name in state.captures:
        if not same_value(state.captures[pattern.name], value):
            return
    if isinstance(pattern, (Var, Lit)):
        if pattern.accepts(value):
            yield state._with(pattern, value)
        return
    assert isinstance(pattern, Pat) and node is not None  # its node, checked above
    if not pattern.params_match(node.params):
        return
    state = state._with(pattern, value)
    orders = [pattern.srcs]
    if pattern.commutative:
        orders.append(pattern.srcs[::-1])
    for srcs in orders:
        yield from _match_all(srcs, node.inputs, state)


def _match_all(patterns, values, state: Match) -> Iterator[Match]:
    if not patterns:
        yield state
        return
    for partial in match(patterns[0], values[0], state):
        yield from _match_all(patterns[1:], values[1:], partial)


def pattern_nodes(*roots: Pattern) -> dict[int, Pattern]:
    """Every pattern node reachable from `roots`, by id."""
    found: dict[int, Pattern] = {}
    stack = list(roots)
    while stack:
        pattern = stack.pop()
        if id(pattern) in found:
            continue
        found[id(pattern)] = pattern
        if isinstance(pattern, Pat):
            stack.extend(pattern.srcs)
    return found


Rule = tuple[Pat, Callable[[Graph, Match], "Value | None"]]


def _may_match(pattern: Pat, node: Node) -> bool:
    """A cheap necessary condition for `pattern` to match at `node`, one level deep: each
    operand pattern finds some operand of `node` it accepts (an op's output, a literal of its
    value, a value its predicate takes), and `op(x, x)` has one value twice."""
    inputs = node.inputs
    for src in pattern.srcs:
        if isinstance(src, Pat):
            if not any(v.producer is not None and v.producer.name in src.ops for v in inputs):
                return False
        elif isinstance(src, Lit) or (isinstance(src, Var) and src.pred is not None):
            if not any(src.accepts(v) for v in inputs):
                return False
    srcs = pattern.srcs
    if len(srcs) == 2 == len(inputs) and srcs[0] is srcs[1] and isinstance(srcs[0], Var):
        return same_value(inputs[0], inputs[1])
    return True


def rewrite(graph: Graph, rules: Sequence[Rule]) -> int:
    """Apply `rules` to the rewritable nodes of `graph` until none fires; returns the count.

    A worklist drives it: every node once, then the users of each replacement (and new nodes),
    since a rewrite can only enable another where its result is read. The replacement value
    takes over every use of the root; the old nodes are left for DCE.
    """
    by_op: dict[str, list[Rule]] = {}
    for rule in rules:
        for op in rule[0].ops:
            by_op.setdefault(op, []).append(rule)
    work = deque(graph.live())
    fired = 0
    while work:
        node = work.popleft()
        if not graph.is_live(node) or not graph.is_rewritable(node):
            continue
        for pattern, fn in by_op.get(node.name, ()):
            root = node.outputs[pattern.index]
            if not graph.num_uses(root):
                break
            new = next((v for m in match(pattern, root) if (v := fn(graph, m)) is not None), None)
            if new is None:
                continue
            fired += 1
            if new is root:  # edited in place: look at it again
                work.append(node)
            else:
                users = list(root.users)
                graph.replace_uses(root, new)
                if new.producer is not None:
                    work.append(new.producer)
                work.extend(users)
            break
    return fired
