"""The clean-ups, in order: the device-independent rewrites every program gets before the
fusions, one list. The pipeline runs it first (passes/pipeline.py); pattern examples
(fusions/by_example.py) and the BatchNorm fusion's traced formulas are cleaned by it too, so
that a pattern is spelled exactly as the programs it is matched against."""

from __future__ import annotations

from ..ir.graph import Graph
from . import canonicalize, dce, dedup, remove_cast_round_trip, replace_add_any, transposes
from .manager import Context

CLEANUPS = (
    canonicalize.PASS,
    remove_cast_round_trip.PASS,
    dedup.CONVERT_PASS,
    transposes.PAIR_PASS,
    dedup.TRANSPOSE_PASS,
    replace_add_any.PASS,
    dce.PASS,
)


def clean(graph: Graph, ctx: Context) -> None:
    """Runs CLEANUPS over `graph`'s top level (an example's), settling it after each."""
    for cleanup in CLEANUPS:
        cleanup.run(graph, ctx)
        graph.settle()
