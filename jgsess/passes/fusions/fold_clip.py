"""fold-clip: optax.clip_by_global_norm's per-leaf select moves into the adamw kernel.

    keep = lt norm 1.0
    c    = div g norm                             keep32 = convert_element_type[float32] keep
    g2   = select_n keep c g                ->    p2 m2 v2 = jgsess.adamw[flags=23]
    p2 m2 v2 = jgsess.adamw[flags=7] ... p g2 m v            ... keep32 norm 1.0 p g m v

(with clip norms other than 1.0, `c = mul (div g norm) clip`). The kernel computes
`keep ? g : (g / norm) * clip` element by element, the same operations as the select it
replaces, and reads g once instead of XLA reading it for the select and again for the update.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ...ir import ops
from ...ir.graph import Graph, Node
from ...kernels import adamw
from ...patterns import Pat, Scalar, Var, match
from ..manager import Context
from .engine import Fusion, Rewrite

_G = Var("g")
_SCALED = Pat("div", [_G, Scalar("norm")])
CLIPPED = [
    Pat("select_n", [Scalar("keep"), Pat("mul", [_SCALED, Scalar("clip")]), _G]),
    Pat("select_n", [Scalar("keep"), _SCALED, _G]),
]
_CLIP_SLOTS = [adamw.SCALARS.index(k) for k in ("keep", "norm", "clip")]


def find(graph: Graph, node: Node, ctx: Context, memo: dict) -> Iterator[Rewrite]:
    """`node` (an adamw node) reading its gradient clipped; `memo`: predicate -> its f32 cast,
    one per predicate, so the updates still share scalars after combine-optimizers."""
    if node.op is not adamw.SPEC:
        return
    static = node.op.static(node.params)
    if static["flags"] & (
        adamw.Flag.CLIP | adamw.Flag.NARROW | adamw.Flag.MIXED
    ):  # narrow: clips in bf16
        return
    g = node.inputs[len(adamw.SCALARS) + 1]
    for pattern in CLIPPED:
        m = next(match(pattern, g), None)
        if m is None:
            continue
        keep, norm = m["keep"], m["norm"]
        clip = m.get("clip") or ops.const(1.0, norm)
        if keep.dtype != np.bool_ or norm.dtype != np.float32 or clip.dtype != np.float32:
            continue
        added = []
        created = keep not in memo
        if created:
            cast = ops.convert(keep, np.float32)
            added.append((cast, node))
            memo[keep] = cast.outputs[0]
        inputs = list(node.inputs)
        for slot, value in zip(_CLIP_SLOTS, (memo[keep], norm, clip)):
            inputs[slot] = value
        inputs[len(adamw.SCALARS) + 1] = m["g"]
        params = dict(node.params, flags=int(static["flags"] | adamw.Flag.CLIP))
        folded = Node(node.op, inputs, [v.aval for v in node.outputs], params)
        added.append((folded, node))
        yield Rewrite("clip_by_global_norm", added, list(zip(node.outputs, folded.outputs)), [node])
        if created:  # the driver declined it: the cast was never inserted
            del memo[keep]
        return


# producers first: the cast goes before the first update that reads it
PASS = Fusion("fold-clip", frozenset({"adamw"}), find, __doc__, producers_first=True).as_pass()
