"""The memory plan of a graph: lifetimes -> allocator -> offsets [KernelRuntime::AssignMemory].

    plan = plan_memory(graph)
    plan.peak          bytes of one arena holding every buffer at its offset
    plan.lower_bound   the most bytes live at one step (no plan can do better)
    plan.naive         every buffer its own memory (no reuse at all)

`groups` lists values to be laid out back to back (all-reduce buckets, say): each group is
placed as one block. Sub-graphs (cond branches, loop bodies) are planned on their own; their
peak is their node's workspace.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..ir.graph import Graph, Node, Value
from .allocator import allocate
from .lifetimes import Buffer, buffers, live_bytes


@dataclass
class MemoryPlan:
    buffers: list[Buffer]
    offsets: list[int]  # parallel to buffers
    peak: int
    lower_bound: int
    naive: int
    steps: int
    order: str

    def offset_of(self, value: Value) -> int:
        for b, at in zip(self.buffers, self.offsets):
            if any(v is value for v in b.values):
                return at
        raise KeyError(value)

    def largest(self, k: int = 5) -> list[tuple[Buffer, int]]:
        ranked = sorted(zip(self.buffers, self.offsets), key=lambda bo: -bo[0].size)
        return ranked[:k]

    def to_json(self) -> str:
        return json.dumps(
            {
                "peak": self.peak,
                "lower_bound": self.lower_bound,
                "naive": self.naive,
                "steps": self.steps,
                "order": self.order,
                "buffers": [
                    {
                        "name": b.name,
                        "kind": b.kind,
                        "size": b.size,
                        "start": b.start,
                        "end": b.end,
                        "offset": at,
                    }
                    for b, at in zip(self.buffers, self.offsets)
                ],
            },
            indent=1,
        )

    def timeline(self, path: str, title: str = "memory plan") -> None:
        """A PNG: each buffer a rectangle over its steps (x) and its bytes in the arena (y)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle

        colors = {
            "input": "#9e9e9e",
            "constant": "#bdbdbd",
            "output": "#e07b39",
            "intermediate": "#3b7dd8",
            "workspace": "#6a3d9a",
        }
        fig, ax = plt.subplots(figsize=(10, 5))
        for b, at in zip(self.buffers, self.offsets):
            ax.add_patch(
                Rectangle(
                    (b.start, at / 2**20),
                    b.end - b.start + 1,
                    b.size / 2**20,
                    facecolor=colors[b.kind],
                    edgecolor="black",
                    linewidth=0.2,
                )
            )
        ax.axhline(
            self.lower_bound / 2**20,
            color="red",
            linestyle="--",
            linewidth=1,
            label=f"lower bound {self.lower_bound / 2**20:.2f} MB",
        )
        ax.set_xlim(0, self.steps)
        ax.set_ylim(0, max(self.peak, 1) / 2**20 * 1.05)
        ax.set_xlabel("step (node in execution order)")
        ax.set_ylabel("offset (MB)")
        handles = [Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
        ax.legend(
            [*handles, ax.lines[0]],
            [*colors, str(ax.lines[0].get_label())],
            fontsize=8,
            loc="upper right",
        )
        ax.set_title(f"{title}: peak {self.peak / 2**20:.2f} MB, naive {self.naive / 2**20:.2f} MB")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def workspace_bytes(node: Node) -> int:
    """Scratch a node needs at its step: its kernel's workspace, or its sub-graphs' plans."""
    if node.is_fused and node.params.get("impl") == "kernel" and node.op.workspace is not None:
        avals = [v.aval for v in node.inputs]
        return node.op.workspace(node.op.static(node.params), avals)
    subs = list(node.sub_graphs())
    return max((plan_memory(g, static=False).peak for g in subs), default=0)


def plan_memory(graph: Graph, groups=(), static: bool = True) -> MemoryPlan:
    """Plan every buffer of `graph` (with `static=False`, its intermediates and workspaces only:
    a sub-graph's inputs and outputs belong to the graph around it)."""
    bufs, steps = buffers(graph, workspace_bytes)
    if not static:
        bufs = [b for b in bufs if not b.lifelong]
    blocks, where = _merge_groups(bufs, groups)
    placed, peak, order = allocate(blocks)
    offsets = [placed[id(where[id(b)][0])] + where[id(b)][1] for b in bufs]
    lower = max(live_bytes(bufs, steps), default=0)
    naive = sum(b.size for b in bufs)
    return MemoryPlan(bufs, offsets, peak, lower, naive, steps, order)


def _merge_groups(bufs: list[Buffer], groups) -> tuple[list[Buffer], dict[int, tuple]]:
    """Blocks to place (a group's members as one), and id(buffer) -> (its block, offset in it)."""
    by_value = {id(v): b for b in bufs for v in b.values}
    where: dict[int, tuple[Buffer, int]] = {}
    blocks = []
    for group in groups:
        members = list(dict.fromkeys(by_value[id(v)] for v in group if id(v) in by_value))
        if not members:
            continue
        names = ",".join(m.name for m in members)
        block = Buffer(
            f"group:{names}",
            sum(m.size for m in members),
            min(m.start for m in members),
            max(m.end for m in members),
            "intermediate",
        )
        within = 0
        for m in members:
            where[id(m)] = (block, within)
            within += m.size
        blocks.append(block)
    for b in bufs:
        if id(b) not in where:
            where[id(b)] = (b, 0)
            blocks.append(b)
    return blocks, where
