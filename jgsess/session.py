"""One compilation: jaxpr -> kernel graph -> pipeline -> optimized jaxpr, and its record.

This is the counterpart of MindSpore's GPUSession::CompileGraphImpl; `jgsess.jit` runs it once
per traced jaxpr, between jax.jit's trace of the function and its compilation.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field

from . import _config, autotune, platforms
from .emit import to_closed_jaxpr
from .ir import from_jaxpr
from .ir.graph import Graph
from .passes.manager import CompileRecord, Context, PassRecord, run_pipeline
from .passes.pipeline import default_pipeline

_dump_counter = itertools.count()


@dataclass
class Session:
    """What happened when one input signature was compiled."""

    name: str
    platform: str
    passes: list[PassRecord] = field(default_factory=list)  # one per pass run, in order
    record: CompileRecord = field(default_factory=CompileRecord)
    fallback: str | None = None
    # the optimized graph, kept where the compilation was asked for a plan (a report's)
    graph: Graph | None = None
    # the pipeline's own time: "trace" (to a jaxpr), "passes", "emit" (the optimized jaxpr)
    seconds: dict = field(default_factory=dict)


def compile_jaxpr(
    closed,
    *,
    name: str,
    donated,
    pinned=None,
    plan: bool = False,
    traced: float | None = 0.0,
    compiler_options: tuple = (),
    outermost: bool = True,
):
    """Optimize `closed`; returns (program, Session), where `program` is the optimized
    ClosedJaxpr, with `closed`'s inputs and outputs (`closed` itself where nothing changed).
    Raises on pipeline failure.

    `pinned`: the device the program is placed on (platforms.pinned_device; None: the default
    device). `plan` asks for the whole-program memory plan (for the report; `JGSESS_DUMP`
    asks too); `traced` is how long the function took to trace (kernel measurements get a
    share of it; None: measure none, decide by the cached measurements alone);
    `compiler_options` are jax.jit's as sorted (name, value) pairs, for what the passes ask
    XLA (see passes/widen_narrow_products.py). `outermost`: whether the program runs as it is,
    its inputs the caller's arrays (not traced inside another program's trace or
    transformation; see memory/inplace.py).
    """
    start = time.perf_counter()
    budget = None if traced is None else autotune.budget(traced, len(closed.jaxpr.eqns))
    target = platforms.Target.of(pinned, compiler_options=compiler_options, budget=budget)
    graph = from_jaxpr(closed)
    graph.donated = list(donated)
    graph.outermost = outermost
    dump = _config.dump_dir()
    ctx = Context(
        target=target,
        verify=_config.verify(),
        dump_dir=os.path.join(dump, f"{name}-{next(_dump_counter)}") if dump else None,
        plan=plan or bool(dump),
        nested=not outermost,
    )
    records = run_pipeline(graph, default_pipeline(), ctx)
    session = Session(
        name,
        target.platform,
        records,
        ctx.record,
        None,
        graph if plan else None,
        {"passes": time.perf_counter() - start},
    )
    if not (_takes_a_kernel(graph) or any(b.taken for b in ctx.record.buckets)):
        # no kernel and no all-reduce bucket taken: the pipeline's other rewrites (clean-ups,
        # fused nodes running their references) compute what the function's own operations
        # compute, and XLA simplifies as well: jax.jit's program, not traced again (emission
        # was a third of the pipeline's time on an unfused 1,000-leaf optax.adamax step;
        # inside another program, the references ran up to 10% slower than the function's
        # own operations: BERT-base momentum bf16, 71.6 against 64.7 ms)
        return closed, session
    emitting = time.perf_counter()
    program = to_closed_jaxpr(graph, closed.in_avals, closed.jaxpr.debug_info)
    session.seconds["emit"] = time.perf_counter() - emitting
    return program, session


def _takes_a_kernel(graph: Graph) -> bool:
    return any(
        node.is_fused and node.params.get("impl") == "kernel"
        for g in graph.walk()
        for node in g.live()
    )
