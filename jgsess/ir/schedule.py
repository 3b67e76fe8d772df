"""The execution order of a graph's nodes after a pass has edited them (`Graph.settle`).

Rewrites insert each new node before its first user, so the order a pass leaves is usually
valid already (`in_order`). Where it is not, `restored` sorts it again topologically, as close
to the old order as the dependencies allow: a region that is still intact (a custom-derivative
call whose nodes all remain) moves as one block, and effectful nodes keep their relative order.
Units are a node, or the outermost intact region holding it (`unit_of`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar


class Node(Protocol):
    """What ordering reads of a node (graph.Node; this module, which graph.py imports, does not
    import it back): its operands, whose `producer` is a node or None, and its effects."""

    inputs: list[Any]
    effects: Any


# node -> its unit: the node, or the outermost intact graph.Region holding it
UnitOf = Callable[[Any], object]
N = TypeVar("N", bound=Node)


def in_order(nodes: Sequence[Node], unit_of: UnitOf) -> bool:
    """Whether `nodes` is a valid execution order: every node after the producers of its
    operands, and every intact region in one piece (effectful nodes keep their relative order
    in any order `Graph.settle` sorts by position)."""
    members = set(nodes)
    seen: set = set()
    done: set = set()
    current = None
    for node in nodes:
        for value in node.inputs:
            producer = value.producer
            if producer is not None and producer in members and producer not in seen:
                return False
        unit = unit_of(node)
        if unit is not current:
            if unit in done:
                return False
            done.add(current)
            current = unit
        seen.add(node)
    return True


def restored(nodes: Sequence[N], unit_of: UnitOf) -> list[N] | None:
    """`nodes` in a valid execution order, each unit as early as its dependencies and its old
    position allow; None if the nodes depend on each other in a cycle."""
    position = {node: i for i, node in enumerate(nodes)}
    units: dict[object, list[N]] = {}
    for node in nodes:
        units.setdefault(unit_of(node), []).append(node)
    owner = {node: unit for unit, members in units.items() for node in members}
    deps: dict[object, set] = {unit: set() for unit in units}
    last_effect = None
    for unit, members in sorted(units.items(), key=lambda kv: position[kv[1][0]]):
        for node in members:
            for value in node.inputs:
                producer = value.producer
                if producer is not None and producer in owner and owner[producer] is not unit:
                    deps[unit].add(owner[producer])
        if any(node.effects for node in members):
            if last_effect is not None:
                deps[unit].add(last_effect)
            last_effect = unit
    users: dict[object, list] = {unit: [] for unit in units}
    for unit, needs in deps.items():
        for need in needs:
            users[need].append(unit)
    pending = {unit: len(needs) for unit, needs in deps.items()}
    key = {unit: min(position[n] for n in members) for unit, members in units.items()}
    heap = [(key[u], id(u), u) for u, n in pending.items() if n == 0]
    heapq.heapify(heap)
    order: list[N] = []
    while heap:
        _, _, unit = heapq.heappop(heap)
        order.extend(units[unit])
        for user in users[unit]:
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(heap, (key[user], id(user), user))
    return order if len(order) == len(nodes) else None
