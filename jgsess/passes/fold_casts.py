"""fold-casts: a kernel reads bf16/f16 operands and writes bf16/f16 results itself
[ReplaceMomentumCastFusion, with the dtype guard MindSpore meant to write].

    g32 = convert_element_type[float32] g16            p2 acc2 = jgsess.momentum ... p16 g16 acc
    p32 = convert_element_type[float32] p16      ->    (p2 is bf16: the kernel rounds it)
    p2' acc2 = jgsess.momentum ... p32 g32 acc
    p2 = convert_element_type[bfloat16] p2'

Widening bf16/f16 to f32 is exact and the kernel rounds its result to nearest even as XLA's
convert does, so the numbers do not change; the kernel reads and writes half the bytes. An
operand paired with a result (a parameter and its update) folds only together with it.
"""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import NARROW
from ..ir.graph import Graph, Node, Value
from .manager import Context, Pass


def _widened(value: Value) -> Value | None:
    """x16 if `value` is convert_element_type[float32](x16), else None."""
    node = value.producer
    if node is None or node.name != "convert_element_type" or value.dtype != np.float32:
        return None
    source = node.inputs[0]
    return source if source.dtype in NARROW and source.shape == value.shape else None


def _narrowing_use(graph: Graph, value: Value, dtype) -> Value | None:
    """The output of the one convert to `dtype` that is `value`'s only use, else None."""
    if graph.num_uses(value) != 1 or len(value.users) != 1:
        return None
    (user,) = value.users
    if user.name != "convert_element_type" or not graph.is_rewritable(user):
        return None
    out = user.outputs[0]
    return out if out.dtype == dtype and not getattr(out.aval, "weak_type", False) else None


def _fold(graph: Graph, node: Node) -> bool:
    spec = node.op
    shared, per_in, per_out = spec.tensors
    inputs = list(node.inputs)
    avals = [v.aval for v in node.outputs]
    narrowed: dict[int, Value] = {}  # result index -> the convert output it takes over
    for t in range((len(inputs) - shared) // per_in):
        for slot, result in spec.narrowable(spec.static(node.params)):
            i = shared + t * per_in + slot
            source = _widened(inputs[i])
            if source is None:
                continue
            if result is not None:
                r = t * per_out + result
                cast = _narrowing_use(graph, node.outputs[r], source.dtype)
                if cast is None:
                    continue
                avals[r] = cast.aval
                narrowed[r] = cast
            inputs[i] = source
    if inputs == node.inputs:
        return False
    folded = Node(spec, inputs, avals, node.params)
    graph.insert(folded, before=node)
    for r, (old, new) in enumerate(zip(node.outputs, folded.outputs)):
        graph.replace_uses(narrowed.get(r, old), new)
    for cast in narrowed.values():
        if cast.producer is not None:  # its operand, the f32 result, goes with `node`
            graph.remove(cast.producer)
    graph.remove(node)
    return True


def run(graph: Graph, ctx: Context) -> int:
    return sum(_fold(graph, node) for node in graph.live() if node.is_fused and node.op.tensors)


PASS = Pass("fold-casts", run, doc=__doc__)
