"""fuse-cast-all: the parameter casts of a mixed-precision step become one `cast_all` node
[CastAllFusion].

    a16 = convert_element_type[bfloat16] a           a16 b16 c16 = jgsess.cast_all a b c
    b16 = convert_element_type[bfloat16] b     ->
    c16 = convert_element_type[bfloat16] c

Candidates are casts between f32, bf16 and f16 whose operand is a graph input (a parameter, so
no cycle can arise), as in MindSpore; at least two are needed. Unlike MindSpore, casts in both
directions share one call (the kernel takes each tensor's dtypes as they come). A cast read only
by elementwise operations is no candidate: XLA fuses it into them and never writes the cast
tensor, where a call (a fusion barrier) would write it and read it back (bf16 parameters updated
in f32 by optax: a ResNet-50 AdamW step took about twice as long with the call).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ... import _compat
from ...ir.graph import Graph, Node
from ...kernels import cast_all
from ..manager import Context
from .engine import Fusion, Rewrite

_FLOATS = {np.dtype(d) for d in ("float32", "float16")} | {np.dtype("bfloat16")}
# operations XLA fuses a cast into (it computes the cast where they read it)
_ELEMENTWISE = frozenset(
    "abs add and convert_element_type cos div exp exp2 expm1 integer_pow log log1p logistic max "
    "min mul ne neg eq ge gt le lt or pow rsqrt select_n sign sin sqrt square sub tan tanh".split()
)


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
        and _compat.convert_is_plain(node.params)
        and not getattr(y.aval, "weak_type", False)
        and (graph.output_uses(y) > 0 or any(u.name not in _ELEMENTWISE for u in y.users))
    )


def find(graph: Graph, node: Node, ctx: Context, memo: dict) -> Iterator[Rewrite]:
    inputs = set(graph.inputs)
    if not _candidate(graph, node, inputs):
        return
    casts = [n for n in graph.live() if _candidate(graph, n, inputs)]
    if len(casts) < 2:
        return
    fused = Node(
        cast_all.SPEC,
        [c.inputs[0] for c in casts],
        [c.outputs[0].aval for c in casts],
        {"dtypes": tuple(str(c.outputs[0].dtype) for c in casts)},
    )
    replaced = [(c.outputs[0], result) for c, result in zip(casts, fused.outputs)]
    yield Rewrite("cast_all", [(fused, casts[0])], replaced, casts)


FUSION = Fusion(
    "fuse-cast-all", frozenset({"convert_element_type"}), find, __doc__, recursive=False
)
PASS = FUSION.as_pass()
