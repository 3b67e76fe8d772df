"""fuse-cast-all: the parameter casts of a mixed-precision step become one `cast_all` node
[CastAllFusion].

    a16 = convert_element_type[bfloat16] a           a16 b16 c16 = jgsess.cast_all a b c
    b16 = convert_element_type[bfloat16] b     ->
    c16 = convert_element_type[bfloat16] c

Candidates are casts between f32, bf16 and f16 whose operand is a graph input (a parameter, so
no cycle can arise), as in MindSpore; at least two are needed. Unlike MindSpore, casts in both
directions share one call (the kernel takes each tensor's dtypes as they come).
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ...kernels import cast_all
from ..manager import Context, Pass

_FLOATS = {np.dtype(d) for d in ("float32", "float16")} | {np.dtype("bfloat16")}


def _candidate(graph: Graph, node: Node, inputs: set) -> bool:
    if node.name != "convert_element_type" or not graph.is_rewritable(node):
        return False
    x, y = node.inputs[0], node.outputs[0]
    return (
        x in inputs
        and x.dtype in _FLOATS
        and y.dtype in _FLOATS
        and x.dtype != y.dtype
        and x.shape == y.shape
        and node.params.get("sharding") is None
        and not getattr(y.aval, "weak_type", False)
    )


def run(graph: Graph, ctx: Context | None) -> int:
    inputs = set(graph.inputs)
    casts = [n for n in graph.live() if _candidate(graph, n, inputs)]
    if len(casts) < 2:
        return 0
    dtypes = tuple(str(c.outputs[0].dtype) for c in casts)
    node = Node(
        cast_all.SPEC,
        [c.inputs[0] for c in casts],
        [c.outputs[0].aval for c in casts],
        {"dtypes": dtypes},
    )
    graph.insert(node, before=casts[0])
    for cast, result in zip(casts, node.outputs):
        graph.replace_uses(cast.outputs[0], result)
        graph.remove(cast)
    if ctx is not None:
        ctx.note("fusions", ("fuse-cast-all", "cast_all"))
    return len(casts)


PASS = Pass("fuse-cast-all", run, recursive=False, doc=__doc__)
