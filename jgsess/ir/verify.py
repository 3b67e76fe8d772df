"""Invariants of a graph, checked between passes (always in tests, on request elsewhere)."""

from __future__ import annotations

from collections import Counter

from .graph import Graph, GraphError


def verify(graph: Graph, interface: tuple | None = None) -> None:
    """Raise GraphError if `graph` (or a sub-graph) breaks an invariant.

    `interface` is the (input avals, output avals) the graph had when it was built; passes must
    never change it.
    """
    defined = set(graph.inputs)
    live = graph.live()
    live_set = set(live)
    for node in live:
        for value in node.inputs:
            if not (value.is_const or value in defined):
                raise GraphError(f"{node} reads {value} before it is defined")
            if value.producer is not None and value.producer not in live_set:
                raise GraphError(f"{node} reads {value} of a removed node")
        for value in node.outputs:
            if value.producer is not node:
                raise GraphError(f"{value} does not name {node} as its producer")
            defined.add(value)
        for sub in node.sub_graphs():
            verify(sub)
    for value in graph.outputs:
        if not (value.is_const or value in defined):
            raise GraphError(f"graph output {value} is never defined")
    uses = Counter((id(v), id(n)) for n in live for v in n.inputs)
    for node in live:
        for value in set(node.inputs):
            if value.users.count(node) != uses[id(value), id(node)]:
                raise GraphError(f"users of {value} are out of date for {node}")
    if interface is not None:
        ins, outs = interface
        if [v.aval for v in graph.inputs] != list(ins) or [v.aval for v in graph.outputs] != list(
            outs
        ):
            raise GraphError("a pass changed the graph's input or output avals")


def interface_of(graph: Graph) -> tuple:
    return tuple(v.aval for v in graph.inputs), tuple(v.aval for v in graph.outputs)
