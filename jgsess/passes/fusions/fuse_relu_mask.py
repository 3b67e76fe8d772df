"""fuse-relu-mask: a ReLU whose backward keeps a mask keeps one bit per element instead
[ReluV2Pass, AddReluV2Fusion, AddReluGradV2Fusion]. A hardware pass: it runs after kernel
selection and only where the platform has the kernels and the cost model takes them (on the CPU
only with JGSESS_PREFER=memory: it saves memory but costs speed there; the report counts the
ReLUs it would have taken).

In a differentiated step, after canonicalize and replace-add-any:

    y  = max s 0.0                                y m = jgsess.relu_mask s
    b  = gt s 0.0                           ->
    ...                                           ...
    dx = select_n b 0.0 dy                        dx = jgsess.relu_mask_grad m dy

With `s = add a c` (same shapes, used by nothing else) the add moves into the forward kernel;
with `dy = add d1 d2` (a gradient sum, used by nothing else) into the backward one. The mask
`b` must be read by nothing but such selects.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ...ir.graph import Graph, Node, Value
from ...kernels import relu_mask
from ...patterns import Lit, Pat, Var, match
from ..manager import Context
from .engine import Fusion, Rewrite

_S = Var("s")
RELU = Pat("max", [_S, Lit(0.0)])
MASK = Pat("gt", [_S, Lit(0.0)])


def _is_zero(value: Value) -> bool:
    if value.is_const:
        return value.scalar_value() == 0.0
    node = value.producer
    return node is not None and node.name == "broadcast_in_dim" and _is_zero(node.inputs[0])


def _backward_selects(graph: Graph, mask: Value) -> list[Node] | None:
    """The selects `select_n(mask, 0, dy)` that are the mask's only readers, else None."""
    if graph.output_uses(mask) or not mask.users:
        return None
    for user in mask.users:
        if user.name != "select_n" or len(user.inputs) != 3 or user.inputs[0] is not mask:
            return None
        if not _is_zero(user.inputs[1]) or mask in user.inputs[1:]:
            return None
    return list(dict.fromkeys(mask.users))


def _absorbed_add(graph: Graph, value: Value, readers: set[Node]) -> list[Value] | None:
    """[a, c] if `value` = add a c, same shapes, read by nothing but `readers`."""
    node = value.producer
    if node is None or node.name != "add" or not graph.is_rewritable(node):
        return None
    a, c = node.inputs
    if a.aval != value.aval or c.aval != value.aval or graph.output_uses(value):
        return None
    return [a, c] if set(value.users) <= readers else None


def find(graph: Graph, gt: Node, ctx: Context, memo: dict) -> Iterator[Rewrite]:
    """The fused ReLU whose mask `gt` computes."""
    m = next(match(MASK, gt.outputs[0]), None)
    if m is None or not np.issubdtype(m["s"].dtype, np.floating):
        return
    s = m["s"]
    relus = [u for u in s.users if next(match(RELU, u.outputs[0]), None) is not None]
    selects = _backward_selects(graph, gt.outputs[0])
    if not relus or selects is None:
        return
    relu = relus[0]
    operands = _absorbed_add(graph, s, {relu, gt}) or [s]
    avals = relu_mask.forward_avals([s.aval], {})
    forward = Node(relu_mask.FORWARD, operands, avals, {"impl": "kernel"})
    added = [(forward, relu)]
    replaced = [(relu.outputs[0], forward.outputs[0])]
    for select in selects:
        dy = select.inputs[2]
        grads = _absorbed_add(graph, dy, {select}) or [dy]
        backward = Node(
            relu_mask.BACKWARD,
            [forward.outputs[1], *grads],
            [select.outputs[0].aval],
            {"impl": "kernel"},
        )
        added.append((backward, select))
        replaced.append((select.outputs[0], backward.outputs[0]))
    yield Rewrite("relu_mask", added, replaced, [relu, gt, *selects])


PASS = Fusion(
    "fuse-relu-mask",
    frozenset({"gt"}),
    find,
    __doc__,
    hardware=(relu_mask.FORWARD, relu_mask.BACKWARD),
).as_pass()
