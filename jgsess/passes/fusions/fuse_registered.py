"""fuse-registered: the users' kernels, each where the program computes its search function.

`jgsess.register_replacement(search, kernel, example_args)` (jgsess/user_kernels.py) puts a
`Replacement` in `REGISTERED`; this pass tries each at every node, in registration order:

    search(x, scale, eps) = x * rsqrt(mean(x*x) + eps) * scale        (traced on the example)

    candidate  the example's ops and how they connect (STRUCTURE: no params, any literal)
               match at the root, binding the search function's arguments to program values
    exact      the search function traced again on the bound values' types (attributes: the
               bound literals' values) matches at the same root with the same bindings, every
               param and literal equal: the program computes the search function there
    guard      attributes are literals; the user's `extra_check` on the bindings
    rewrite    one node of the registration's spec (its reference: the search function) in
               place of the outputs; the matched nodes whose values the program reads nowhere
               else are removed, the others kept (a training step's backward reads the forward's
               intermediate values)

The exact patterns are kept per registration, bound types and attribute values. Whether the
kernel runs is select-kernels' decision (measured against the search function's code, after the
kernel agrees with it within the kernel's tolerance on random operands: jgsess/selection.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import jax
import numpy as np

from ... import _compat
from ...ir.graph import Graph, Node, Value
from ...kernels.user import UserKernelSpec
from ...patterns import Match, match, same_value
from ..manager import Context, Pass
from . import engine
from .by_example import Exactness, ExamplePattern, to_pattern, traced

NAME = "fuse-registered"


@dataclass(eq=False)
class Replacement:
    """One registration: the search function, its arguments (`names`: the kernel's operands in
    order, then `attrs`, the FFI attributes, in the function's own order otherwise), the
    candidate pattern traced on the example, the kernel's spec."""

    name: str
    search: Callable
    names: tuple[str, ...]
    attrs: tuple[str, ...]
    candidate: ExamplePattern
    spec: UserKernelSpec
    extra_check: Callable[[dict], bool] | None = None
    results: Callable | None = None  # the kernel's declared results, (*operands, **attrs)
    _exact: dict = field(default_factory=dict)

    @property
    def operands(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n not in self.attrs)

    def exact(self, bound: dict[str, object]) -> ExamplePattern:
        """The search function traced on `bound` (name -> ShapeDtypeStruct, or an attribute's
        number), as a pattern keeping every param and literal."""
        key = tuple(
            (n, (b.shape, str(b.dtype), b.weak_type))
            if isinstance(b, jax.ShapeDtypeStruct)
            else (n, repr(b))
            for n, b in bound.items()
        )
        if key not in self._exact:
            operands = [bound[n] for n in self.operands]

            def fn(*arrays):
                return self.call(arrays, {n: bound[n] for n in self.attrs})

            graph = traced(fn, operands)
            self._exact[key] = to_pattern(graph, self.operands, (), self.name, Exactness.EXACT)
        return self._exact[key]

    def call(self, operands, attrs: dict):
        """The search function on the kernel's operands and attributes."""
        return call(self.search, self.names, attrs, operands)


def call(search: Callable, names, attrs: dict, operands):
    """`search` on its arguments `names`: those in `attrs` from there, the others `operands`
    in order."""
    rest = iter(operands)
    return search(*(attrs[n] if n in attrs else next(rest) for n in names))


# every registration in effect, in registration order (jgsess/user_kernels.py edits it)
REGISTERED: list[Replacement] = []


def _struct(value: Value):
    return _compat.shape_struct(value.aval)


def _removable(graph: Graph, nodes: list[Node], replaced: list[Value]) -> list[Node]:
    """The nodes of a match that nothing outside it reads once `replaced` are rewired (a
    value read elsewhere keeps its node, and that node's operands theirs)."""
    removed = dict.fromkeys(nodes)
    outputs = set(replaced)
    changed = True
    while changed:
        changed = False
        for node in list(removed):
            if any(
                v not in outputs
                and (graph.output_uses(v) or any(u not in removed for u in v.users))
                for v in node.outputs
            ):
                del removed[node]
                changed = True
    return list(removed)


def bindings(rep: Replacement, candidate: Match) -> tuple[dict, dict] | None:
    """(name -> bound value, attribute name -> its number) of a candidate match; None where an
    attribute is not a literal (a traced one: a near miss)."""
    bound = {n: candidate.captures[n] for n in rep.names}
    attrs = {}
    for name in rep.attrs:
        number = bound[name].scalar_value()
        if number is None:
            return None
        attrs[name] = np.asarray(number, bound[name].dtype).item()
    return bound, attrs


@dataclass
class Found:
    """An exact match: the pattern that matched, the match, each argument's bound value, the
    attributes' numbers, and what the extra check sees (name -> ShapeDtypeStruct or number)."""

    pattern: ExamplePattern
    match: Match
    bound: dict[str, Value]
    attrs: dict[str, object]
    types: dict[str, object]


def exact_match(rep: Replacement, root: Value) -> Found | None:
    """The exact match of `rep` at `root`, or None."""
    for candidate in match(rep.candidate.root, root):
        found = bindings(rep, candidate)
        if found is None:
            continue
        bound, attrs = found
        types = {n: attrs[n] if n in attrs else _struct(bound[n]) for n in rep.names}
        exact = rep.exact(types)
        for m in match(exact.root, root):
            if all(same_value(m.captures[n], bound[n]) for n in rep.operands):
                return Found(exact, m, bound, attrs, types)
    return None


def _as_declared(rep: Replacement, found: Found, outputs: list[Value]) -> bool:
    """Whether the kernel's declared results, for these operands, are the outputs' types."""
    assert rep.results is not None
    operands = [found.types[n] for n in rep.operands]
    declared = rep.results(*operands, **found.attrs)
    declared = declared if isinstance(declared, (tuple, list)) else (declared,)
    return [(tuple(d.shape), np.dtype(d.dtype)) for d in declared] == [
        (v.shape, np.dtype(v.dtype)) for v in outputs
    ]


def _find(graph: Graph, root: Node, ctx: Context, memo: dict) -> Iterator[engine.Rewrite]:
    for rep in memo.setdefault("registered", list(REGISTERED)):
        if root.name not in rep.candidate.root.ops:
            continue
        found = exact_match(rep, root.outputs[rep.candidate.root.index])
        if found is None:
            continue
        if rep.extra_check is not None and not rep.extra_check(dict(found.types)):
            ctx.record.decline(NAME, rep.name, "its extra_check declined the match")
            continue
        outputs = [found.match.value_of(p) for p in found.pattern.outputs]
        if rep.results is not None and not _as_declared(rep, found, outputs):
            ctx.record.decline(NAME, rep.name, "the kernel's declared results differ here")
            continue
        operands = [found.bound[n] for n in rep.operands]
        node = Node(rep.spec, operands, [v.aval for v in outputs], found.attrs)
        removed = _removable(graph, found.match.nodes(found.pattern.nodes()), outputs)
        yield engine.Rewrite(rep.name, [(node, root)], list(zip(outputs, node.outputs)), removed)


_FUSION = engine.Fusion(NAME, None, _find, doc=__doc__)


def run(graph: Graph, ctx: Context) -> int:
    if not REGISTERED:
        return 0
    for rep in REGISTERED:
        ctx.record.registered.setdefault(rep.name, rep.spec.target)
    return engine.run(_FUSION, graph, ctx)


PASS = Pass(NAME, run, doc=__doc__)
