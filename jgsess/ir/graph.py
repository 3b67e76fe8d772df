"""The kernel graph: values, nodes in execution order, their users, and the edits passes make.

A `Value` is one array in the program (a graph input, a node output, or a constant). A `Node`
applies an operation to values and defines new ones: `op` is a jax primitive, or a `KernelSpec`
for a node a fusion created. A `Graph` owns its nodes in execution order; `cond`, `while`,
`scan` and opaque `jit` nodes own sub-graphs.

Passes change a graph only through `insert`, `replace_uses`, `set_input` and `remove`, which keep
the users lists right and note what they touched. Removal and insertion are cheap marks;
`settle` (run by the pass manager after each pass) drops removed nodes and restores a valid
execution order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from . import schedule

_ids = itertools.count()


class GraphError(Exception):
    """A graph broke one of its invariants (a pass bug, or an unsupported program)."""


class Value:
    """One array: a graph input, a node output, or a constant (`const` is set)."""

    __slots__ = ("aval", "producer", "users", "const", "id")

    def __init__(self, aval, producer: Node | None = None, const=None):
        self.aval = aval
        self.producer = producer
        self.users: list[Node] = []
        self.const = const
        self.id = next(_ids)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self.aval, "shape", ()))

    @property
    def dtype(self):
        return getattr(self.aval, "dtype", None)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def scalar_value(self):
        """The Python number of a rank-0 constant, else None."""
        if self.const is None or np.ndim(self.const) != 0:
            return None
        try:
            return np.asarray(self.const).item()
        except (TypeError, ValueError):
            return None

    def __repr__(self) -> str:
        return f"Value#{self.id}:{self.aval}"


class Region:
    """A `custom_jvp_call` / `custom_vjp_call` that `build` inlined.

    Passes see the body's nodes. If no fusion swallowed one of them, emission binds the original
    call again, so the function keeps its custom derivative rule.
    """

    __slots__ = ("primitive", "params", "inputs", "outputs", "nodes", "parent", "broken")

    def __init__(self, primitive, params: dict, inputs: list[Value], parent: Region | None):
        self.primitive = primitive
        self.params = params
        self.inputs = list(inputs)
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self.parent = parent
        self.broken = False

    def chain(self) -> Iterator[Region]:
        region: Region | None = self
        while region is not None:
            yield region
            region = region.parent

    def break_(self) -> None:
        for region in self.chain():
            region.broken = True


class Node:
    """One operation: `op` applied to `inputs`, defining `outputs`."""

    __slots__ = ("op", "inputs", "outputs", "params", "subgraphs", "effects", "region", "id")

    def __init__(self, op, inputs, out_avals, params=None, subgraphs=None, effects=frozenset()):
        self.op = op
        self.inputs: list[Value] = list(inputs)
        self.outputs = [Value(aval, self) for aval in out_avals]
        self.params = dict(params or {})
        # param name -> Graph or tuple of Graphs (cond branches)
        self.subgraphs: dict[str, Graph | tuple[Graph, ...]] = dict(subgraphs or {})
        self.effects = effects
        self.region: Region | None = None
        self.id = next(_ids)

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def is_fused(self) -> bool:
        return getattr(self.op, "is_kernel_spec", False)

    def sub_graphs(self) -> Iterator[Graph]:
        for sub in self.subgraphs.values():
            yield from (sub if isinstance(sub, tuple) else (sub,))

    def body(self, key: str) -> Graph:
        """The one sub-graph under `key` (a jit's, a shard_map's body)."""
        sub = self.subgraphs[key]
        if not isinstance(sub, Graph):
            raise TypeError(f"{self.name}'s {key} holds several graphs")
        return sub

    def bodies(self, key: str) -> tuple[Graph, ...]:
        """The sub-graphs under `key` (a cond's branches)."""
        sub = self.subgraphs[key]
        return sub if isinstance(sub, tuple) else (sub,)

    def __repr__(self) -> str:
        return f"Node#{self.id}:{self.name}"


class Graph:
    """Inputs, outputs and nodes in execution order."""

    def __init__(self, inputs: list[Value], source=None):
        self.inputs = list(inputs)
        self._outputs: list[Value] = []
        self._output_index: dict[Value, list[int]] = {}
        self.nodes: list[Node] = []
        self.regions: list[Region] = []
        self._region_index: dict[Value, list[Region]] = {}  # boundary value -> regions
        self._removed: set[Node] = set()
        self._anchors: dict[Node, Node] = {}
        self._dirty = False  # edited since the last settle
        self.donated: list[bool] = [False] * len(self.inputs)
        # whether the inputs are the caller's arrays, kept unless donated (the outermost
        # program); else they are values of an enclosing program (a sub-graph's, a program
        # traced inside another's trace), which XLA copies before a kernel writes over one
        # only where the enclosing program reads it later
        self.outermost = True
        # bytes of the workspace arena its kernels share (set by the memory planner)
        self.arena_bytes = 0
        # The ClosedJaxpr this graph was built from; emission reuses it while `changed` is False.
        self.source = source
        self.changed = False

    # ---- reading -------------------------------------------------------------------------

    def live(self) -> list[Node]:
        """The nodes not removed, in order (a snapshot: safe to edit the graph while looping)."""
        return [node for node in self.nodes if node not in self._removed]

    def is_live(self, node: Node) -> bool:
        return node not in self._removed

    def walk(self) -> Iterator[Graph]:
        """This graph and every nested sub-graph (every recursive pass asks, so a node without
        sub-graphs costs one attribute read here)."""
        yield self
        for node in tuple(self.nodes):  # a snapshot, as live() is: passes edit while walking
            if node.subgraphs and node not in self._removed:
                for sub in node.sub_graphs():
                    yield from sub.walk()

    @property
    def outputs(self) -> list[Value]:
        return self._outputs

    @outputs.setter
    def outputs(self, values) -> None:
        self._outputs = list(values)
        self._output_index = {}
        for i, value in enumerate(self._outputs):
            self._output_index.setdefault(value, []).append(i)

    def output_uses(self, value: Value) -> int:
        return len(self._output_index.get(value, ()))

    def num_uses(self, value: Value) -> int:
        return len(value.users) + self.output_uses(value)

    def is_rewritable(self, node: Node) -> bool:
        """Cleanups leave custom_jvp/vjp bodies alone; only fusions may take their nodes."""
        return node.region is None

    # ---- editing -------------------------------------------------------------------------

    def add_region(self, region: Region) -> None:
        """Record an inlined call (after its outputs are known)."""
        self.regions.append(region)
        for value in {*region.inputs, *region.outputs}:
            self._region_index.setdefault(value, []).append(region)

    def append(self, node: Node) -> Node:
        self.nodes.append(node)
        for value in node.inputs:
            value.users.append(node)
        return node

    def insert(self, node: Node, before: Node) -> Node:
        """Add `node` just before `before` in the order; `settle` finds its final place."""
        self.nodes.append(node)
        self._anchors[node] = before
        self._dirty = True
        for value in node.inputs:
            value.users.append(node)
        self.changed = True
        return node

    def set_input(self, node: Node, index: int, value: Value) -> None:
        old = node.inputs[index]
        old.users.remove(node)
        node.inputs[index] = value
        value.users.append(node)
        if node.region is not None:
            node.region.break_()
        self.changed = self._dirty = True

    def replace_uses(self, old: Value, new: Value) -> int:
        """Point every use of `old` (nodes, graph outputs, region inputs) at `new`."""
        if old is new:
            return 0
        count = 0
        for user in list(old.users):
            for i, value in enumerate(user.inputs):
                if value is old:
                    user.inputs[i] = new
                    new.users.append(user)
                    count += 1
        old.users.clear()
        positions = self._output_index.pop(old, [])
        for i in positions:
            self._outputs[i] = new
        self._output_index.setdefault(new, []).extend(positions)
        count += len(positions)
        regions = self._region_index.pop(old, [])
        for region in regions:
            region.inputs = [new if v is old else v for v in region.inputs]
            if any(v is old for v in region.outputs):
                region.break_()
        self._region_index.setdefault(new, []).extend(regions)
        self.changed = self.changed or count > 0
        self._dirty = self._dirty or count > 0
        return count

    def remove(self, node: Node, *, dead: bool = False) -> None:
        """Drop `node`. `dead=True` is dead-code removal, which keeps its region intact."""
        self._removed.add(node)
        for value in node.inputs:
            value.users.remove(node)
        if node.region is not None and not dead:
            node.region.break_()
        self.changed = self._dirty = True

    # ---- ordering ------------------------------------------------------------------------

    def unit_of(self, node: Node) -> Node | Region:
        """The outermost intact region holding `node`, else the node: the unit `settle` moves."""
        unit: Node | Region = node
        if node.region is not None:
            for region in node.region.chain():
                if not region.broken:
                    unit = region
        return unit

    def _positions(self) -> dict[Node, float]:
        index = {node: float(i) for i, node in enumerate(self.nodes) if node not in self._anchors}

        def place(node: Node) -> float:
            if node not in index:
                index[node] = place(self._anchors[node]) - 0.5 + 1e-6 * len(index)
            return index[node]

        return {node: place(node) for node in self.nodes}

    def settle(self) -> None:
        """Drop removed nodes and restore a valid execution order, as close to the old as can be.

        Intact regions move as one block, and effectful nodes keep their relative order.
        """
        if not self._dirty:
            return
        self._dirty = False
        position = self._positions()
        self.nodes = sorted(
            (node for node in self.nodes if node not in self._removed), key=position.__getitem__
        )
        self._removed.clear()
        self._anchors.clear()
        if schedule.in_order(self.nodes, self.unit_of):  # most rewrites insert each new node
            return  # before its first user
        order = schedule.restored(self.nodes, self.unit_of)
        if order is None:
            raise GraphError("the graph has a cycle")
        self.nodes = order

    def depends_on(
        self, values: Iterable[Value], nodes: set[Node], order: dict | None = None, floor=None
    ) -> bool:
        """Whether any of `values` is computed from an output of one of `nodes`.

        `order` (node -> position in a valid execution order) prunes the search: a node placed
        before all of `nodes` (before `floor`, if given) cannot depend on them. Nodes missing
        from `order` are searched.
        """
        if floor is None:
            floor = min((order[n] for n in nodes if n in order), default=-1) if order else -1
        stack = [v.producer for v in values if v.producer is not None]
        seen: set[Node] = set()
        while stack:
            node = stack.pop()
            if node in nodes:
                return True
            if node in seen or (order is not None and order.get(node, floor + 1) < floor):
                continue
            seen.add(node)
            stack.extend(v.producer for v in node.inputs if v.producer is not None)
        return False
