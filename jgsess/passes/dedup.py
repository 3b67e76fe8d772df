"""One pure op applied twice to one value, with the same params, computed once.

dedup-transpose:
    b = transpose[permutation=(0,2,1)] a
    c = transpose[permutation=(0,2,1)] a          ->   c is b

dedup-convert (optax's apply_updates widens a bf16 parameter the update widened already):
    b:f32[8] = convert_element_type[new_dtype=float32] a:bf16[8]
    c:f32[8] = convert_element_type[new_dtype=float32] a          ->   c is b

Patterns then see one value where the program named it twice (`p` in `p - lr*u` and in the
update's `wd*p`). Only converts of values no operation computed (a program's or sub-program's
inputs, constants): XLA may skip rounding a computed narrow value for some of its widenings
(excess precision), which one shared widening would change (an f16 AdamW step gave other bits
than jax.jit's). Converts that place their result on a sharding stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import _compat
from ..ir.graph import Graph, Node, Value
from .manager import Context, Pass


def _dedup(graph: Graph, name: str, key: Callable[[Node], object]) -> int:
    """Uses of each `name` node whose input and key() an earlier one has go to that one's
    result (dce removes the node)."""
    count = 0
    first: dict[tuple, Value] = {}
    for node in graph.live():
        if node.name != name or not graph.is_rewritable(node):
            continue
        found = key(node)
        if found is None:
            continue
        at = (node.inputs[0], found)
        if at in first:
            count += graph.replace_uses(node.outputs[0], first[at]) > 0
        else:
            first[at] = node.outputs[0]
    return count


def transposes(graph: Graph, ctx: Context | None) -> int:
    return _dedup(graph, "transpose", lambda node: tuple(node.params["permutation"]))


def converts(graph: Graph, ctx: Context | None) -> int:
    def key(node: Node):
        # only values no operation computed (inputs, constants): XLA may drop the rounding of a
        # computed narrow value before one of its widenings (excess precision), and sharing one
        # widening would change which consumers it drops it for
        if node.inputs[0].producer is not None or not _compat.convert_is_plain(node.params):
            return None
        return node.outputs[0].aval  # the dtype and weak type converted to

    return _dedup(graph, "convert_element_type", key)


TRANSPOSE_PASS = Pass("dedup-transpose", transposes, doc=__doc__)
CONVERT_PASS = Pass("dedup-convert", converts, doc=__doc__)
