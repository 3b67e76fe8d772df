"""fuse-adamw: the per-parameter Adam / AdamW update becomes one `adamw` node
[AdamWeightDecayFusion, AdamFusion].

optax's adamw (bias correction, eps_root, decoupled weight decay), after canonicalize:

    m2 = add (mul 0.1 g) (mul 0.9 m)          v2 = add (mul 0.001 (square g)) (mul 0.999 v)
    u  = div (div m2 bc1) (add (sqrt (add (div v2 bc2) 0.0)) 1e-8)
    p2 = sub p (mul 0.001 (add u (mul 1e-4 p)))
  ->
    p2 m2 v2 = jgsess.adamw[flags=7] 0.9 0.1 0.999 0.001 bc1 bc2 1e-8 0.0 1e-4 0.001 p g m v

Also optax's adam (no weight decay), and MindSpore's AdamWeightDecay and Adam (no bias
correction, no eps_root). The forms are tried with weight decay first, as MindSpore orders
AdamWeightDecayFusion before AdamFusion. Guard: p, g, m, v share one shape and are f32; the
hyper-parameters are f32 scalars.
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node, Value
from ...kernels import adamw
from ...patterns import Match, from_function
from .engine import FusionRule, fusion_pass

# hyper-parameters a form does not use, passed to the kernel (which ignores them by flags)
_UNUSED = {"bc1": 1.0, "bc2": 1.0, "eps_root": 0.0, "wd": 0.0}


def optax_adamw(p, g, m, v, b1, omb1, b2, omb2, bc1, bc2, eps, eps_root, wd, lr):
    return adamw.update(
        p, g, m, v, b1, omb1, b2, omb2, bc1, bc2, eps, eps_root, wd, lr, flags=adamw.OPTAX_ADAMW
    )


def optax_adam(p, g, m, v, b1, omb1, b2, omb2, bc1, bc2, eps, eps_root, lr):
    return adamw.update(
        p, g, m, v, b1, omb1, b2, omb2, bc1, bc2, eps, eps_root, None, lr, flags=adamw.OPTAX_ADAM
    )


def mindspore_adam_weight_decay(p, g, m, v, b1, omb1, b2, omb2, eps, wd, lr):
    return adamw.update(
        p,
        g,
        m,
        v,
        b1,
        omb1,
        b2,
        omb2,
        None,
        None,
        eps,
        None,
        wd,
        lr,
        flags=adamw.MINDSPORE_ADAM_WEIGHT_DECAY,
    )


def mindspore_adam(p, g, m, v, b1, omb1, b2, omb2, eps, lr):
    return adamw.update(
        p,
        g,
        m,
        v,
        b1,
        omb1,
        b2,
        omb2,
        None,
        None,
        eps,
        None,
        None,
        lr,
        flags=adamw.MINDSPORE_ADAM,
    )


def _f32(value: Value) -> bool:
    return value.dtype == np.float32


def _builder(flags: int):
    def build(graph: Graph, m: Match, outputs: list[Value]) -> Node | None:
        tensors = [m[k] for k in ("p", "g", "m", "v")]
        if not all(_f32(t) and t.shape == tensors[0].shape for t in tensors):
            return None
        scalars = []
        for name in adamw.SCALARS:
            value = m.get(name) or Value(
                tensors[0].aval.update(shape=()), const=np.float32(_UNUSED[name])
            )
            if value.ndim != 0 or not _f32(value):
                return None
            scalars.append(value)
        return Node(adamw.SPEC, [*scalars, *tensors], [v.aval for v in outputs], {"flags": flags})

    return build


def _rules() -> list[FusionRule]:
    rules = []
    for fn, flags in (
        (optax_adamw, adamw.OPTAX_ADAMW),
        (mindspore_adam_weight_decay, adamw.MINDSPORE_ADAM_WEIGHT_DECAY),
        (optax_adam, adamw.OPTAX_ADAM),
        (mindspore_adam, adamw.MINDSPORE_ADAM),
    ):
        rules.append(FusionRule(from_function(fn, scalars=adamw.SCALARS), _builder(flags)))
    return rules


PASS = fusion_pass("fuse-adamw", _rules, doc=__doc__)
