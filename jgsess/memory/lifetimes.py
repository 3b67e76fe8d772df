"""Buffers and their lifetimes over a graph's execution order [KernelRuntime's reference counts].

Step i is the i-th node. A node's outputs are buffers from its step to the step of their last
reader. Graph inputs, constants and graph outputs are lifelong (static memory in MindSpore). A
result computed in place shares its operand's buffer, as do the results of no-op reshapes.
A kernel's declared workspace lives for its node's step only, and so does a sub-graph's own
plan (the peak of a cond branch or loop body), seen from the outside as its node's workspace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .. import _compat
from ..ir.graph import Graph, Node, Value

ALIGN = 64
# ops XLA turns into views of their operand (MindSpore's HideNopNode)
NO_OP_VIEWS = frozenset({"reshape", "squeeze", "expand_dims"})


def aligned(nbytes: int, align: int = ALIGN) -> int:
    return (nbytes + align - 1) // align * align


@dataclass(eq=False)
class Buffer:
    name: str
    size: int  # bytes, aligned
    start: int  # the first step it holds data
    end: int  # the last step that reads it
    kind: str  # "input" | "constant" | "output" | "intermediate" | "workspace"
    values: list = field(default_factory=list)

    @property
    def lifelong(self) -> bool:
        return self.kind in ("input", "constant", "output")


def buffers(
    graph: Graph, workspace: Callable[[Node], int] = lambda node: 0
) -> tuple[list[Buffer], int]:
    """The buffers of `graph` and the number of steps. `workspace(node)` gives scratch bytes."""
    nodes = graph.live()
    steps = max(len(nodes), 1)
    last = steps - 1
    root: dict[Value, Value] = {}  # alias -> the value owning the buffer

    def owner(value: Value) -> Value:
        while value in root:
            value = root[value]
        return value

    for node in nodes:
        if node.name in NO_OP_VIEWS and not node.inputs[0].is_const:
            root[node.outputs[0]] = node.inputs[0]
        if node.is_fused:
            for operand, result in node.params.get("aliases", ()):
                root[node.outputs[result]] = node.inputs[operand]
    found: dict[Value | Node, Buffer] = {}  # a value's buffer, or a node's workspace

    def buffer(value: Value, kind: str, start: int) -> Buffer:
        key = owner(value)
        if key not in found:
            size = aligned(_compat.aval_nbytes(key.aval))
            found[key] = Buffer(names.get(key) or _name(key), size, start, start, kind, [])
        if not any(v is value for v in found[key].values):
            found[key].values.append(value)
        return found[key]

    names = {value: f"input {i}" for i, value in enumerate(graph.inputs)}
    for value in graph.inputs:
        buffer(value, "input", 0).end = last
    for step, node in enumerate(nodes):
        for value in node.inputs:
            if value.is_const and value.ndim:
                buffer(value, "constant", 0).end = last
            elif not value.is_const:
                b = buffer(value, "intermediate", step)
                b.end = max(b.end, step)
        for value in node.outputs:
            buffer(value, "intermediate", step)
        scratch = workspace(node)
        if scratch:
            found[node] = Buffer(
                f"{node.name}#{node.id}:workspace", aligned(scratch), step, step, "workspace"
            )
    for value in graph.outputs:
        if not value.is_const:
            b = buffer(value, "output", 0)
            b.end = last
            if b.kind == "intermediate":
                b.kind = "output"
    return [b for b in found.values() if b.size], steps


def _name(value: Value) -> str:
    node = value.producer
    if node is None:
        return f"constant {value.id}"
    op = f"jgsess.{node.name}" if node.is_fused else node.name
    return f"{op} #{node.id}" + (
        f" out {node.outputs.index(value)}" if len(node.outputs) > 1 else ""
    )


def live_bytes(bufs: list[Buffer], steps: int) -> list[int]:
    """Bytes live at each step."""
    delta = [0] * (steps + 1)
    for b in bufs:
        delta[b.start] += b.size
        delta[b.end + 1] -= b.size
    live, total = [], 0
    for d in delta[:-1]:
        total += d
        live.append(total)
    return live
