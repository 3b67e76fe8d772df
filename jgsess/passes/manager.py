"""The pass manager: runs named passes in order, times them, counts rewrites, checks, dumps.

A pass is a name (kebab-case) and a function `run(graph, ctx) -> int` that returns how many
rewrites it made. Passes marked `recursive` also run on every sub-graph (cond branches, loop
bodies). After each pass the manager settles the graph (drops removed nodes, restores the
execution order), verifies it when asked, and writes it to `JGSESS_DUMP` when set.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import _config
from ..ir import Graph, graph_dot, graph_text, interface_of, order_csv, verify
from ..memory.plan import MemoryPlan
from ..platforms import Target


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Graph, Context], int]
    recursive: bool = True
    doc: str = ""


@dataclass
class PassRecord:
    name: str
    seconds: float
    rewrites: int
    skipped: bool = False


@dataclass
class CompileRecord:
    """What the passes decided, for the report (`Session.record`); each pass fills its field."""

    # (pass, kernel) per fused node: the fusion driver (passes/fusions/engine.py)
    fusions: list[tuple[str, str]] = field(default_factory=list)
    # (pass, kernel, why not) per fusion a hardware pass found but did not take
    declined: list[tuple[str, str, str]] = field(default_factory=list)
    # (kernel, nodes merged into one): combine-optimizers
    combined: list[tuple[str, int]] = field(default_factory=list)
    # select_kernels.KernelChoice per fused node: select-kernels
    kernels: list = field(default_factory=list)
    # graph inputs a kernel could have overwritten had they been donated: plan-memory
    undonated: list[tuple[int, ...]] = field(default_factory=list)
    # the program's memory plan: plan-memory
    memory_plan: MemoryPlan | None = None
    # autotune.Measurements behind decisions (jgsess/selection.py): select-kernels,
    # fuse-batch-norm, bucket-all-reduce
    autotune: list = field(default_factory=list)
    # (kernel, "kernel" or "xla") per choice the cost model made because this compilation's
    # measuring budget was spent (a later compilation measures it): the same passes
    unmeasured: list[tuple[str, str]] = field(default_factory=list)
    # (kernel, residual bytes kept, fused) per BatchNorm fusion: fuse-batch-norm
    residuals: list = field(default_factory=list)
    # bucket_all_reduce.BucketChoice per group of all-reduces: bucket-all-reduce
    buckets: list = field(default_factory=list)

    # registration name -> its FFI target, per user kernel registered when the program was
    # compiled: fuse-registered (a name with no fusion shows as "registered, no match")
    registered: dict[str, str] = field(default_factory=dict)

    def fused(self, pass_name: str, kernel: str) -> None:
        self.fusions.append((pass_name, kernel))

    def decline(self, pass_name: str, kernel: str, reason: str) -> None:
        self.declined.append((pass_name, kernel, reason))


@dataclass
class Context:
    """What passes may know about the compilation besides the graph, and their record."""

    # where the program runs: its platform, device, compiler options, measuring budget
    target: Target = field(default_factory=Target.of)
    verify: bool = False
    dump_dir: str | None = None
    # compute the whole-program memory plan (only the report and dumps read it)
    plan: bool = False
    # the program is traced inside another one's trace: code jgsess does not see reads its
    # results (an optimizer's update, read by the user's `apply_updates`)
    nested: bool = False
    record: CompileRecord = field(default_factory=CompileRecord)


def run_pipeline(graph: Graph, passes: list[Pass], ctx: Context) -> list[PassRecord]:
    """Run `passes` over `graph` in order; returns one record per pass."""
    disabled = _config.disabled_passes()
    interface = interface_of(graph)
    records = []
    if ctx.dump_dir:
        os.makedirs(ctx.dump_dir, exist_ok=True)
        _dump(graph, ctx.dump_dir, "00-input")
    for i, p in enumerate(passes, start=1):
        if p.name in disabled:
            records.append(PassRecord(p.name, 0.0, 0, skipped=True))
            continue
        start = time.perf_counter()
        rewrites = 0
        graphs = list(graph.walk()) if p.recursive else [graph]
        for g in graphs:
            rewrites += p.run(g, ctx)
            g.settle()
        seconds = time.perf_counter() - start
        records.append(PassRecord(p.name, seconds, rewrites))
        if ctx.verify:
            verify(graph, interface)
        if ctx.dump_dir:
            _dump(graph, ctx.dump_dir, f"{i:02d}-{p.name}")
    if ctx.dump_dir:
        with open(os.path.join(ctx.dump_dir, "order.csv"), "w") as f:
            f.write(order_csv(graph))
    return records


def _dump(graph: Graph, directory: str, stem: str) -> None:
    with open(os.path.join(directory, stem + ".txt"), "w") as f:
        f.write(graph_text(graph) + "\n")
    with open(os.path.join(directory, stem + ".dot"), "w") as f:
        f.write(graph_dot(graph) + "\n")
