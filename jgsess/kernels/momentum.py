"""momentum: the multi-tensor SGD-with-momentum update, optax's and MindSpore's forms
[ApplyMomentum{WeightDecay,Scale,WeightDecayScale}Fusion].

Operands: four rank-0 f32 hyper-parameters (lr, mu, wd, scale), then (p, g, acc) per tensor.
Results: (p', acc') per tensor. Static param `flags` adds weight decay (p*wd + g), a gradient
scale (a loss scale's reciprocal) and Nesterov's look-ahead; with UPDATE the first result is
optax's update -(lr*d) instead of p'. p and g may be bf16/f16; acc is
f32. The C++ handlers (csrc/kernels/momentum/) compute `update` below in the same order.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import _compat
from .spec import KernelSpec

SCALARS = ("lr", "mu", "wd", "scale")
WEIGHT_DECAY, SCALE, NESTEROV, UPDATE = 1, 2, 4, 8


def update(p, g, acc, lr, mu, wd, scale, *, flags):
    """One tensor's update."""
    gt = g
    if flags & WEIGHT_DECAY:
        gt = p * wd + gt
    if flags & SCALE:
        gt = gt * scale
    acc2 = mu * acc + gt
    d = gt + mu * acc2 if flags & NESTEROV else acc2
    if flags & UPDATE:
        return -(lr * d), acc2
    return p - lr * d, acc2


def reference(*operands, flags):
    """Four scalars, then (p, g, acc) per tensor -> (p', acc') per tensor."""
    scalars, tensors = operands[: len(SCALARS)], operands[len(SCALARS) :]
    outs = []
    for i in range(0, len(tensors), 3):
        p, g, acc = tensors[i : i + 3]
        p2, acc2 = update(p.astype(jnp.float32), g.astype(jnp.float32), acc, *scalars, flags=flags)
        outs += [p2 if flags & UPDATE else p2.astype(p.dtype), acc2]
    return tuple(outs)


def _inplace(static, num_operands: int) -> dict[int, int]:
    # p -> p', acc -> acc' for every tensor
    base = len(SCALARS)
    return {
        base + 3 * t + operand: 2 * t + k
        for t in range((num_operands - base) // 3)
        for k, operand in enumerate((0, 2))
    }


def _result_avals(avals, static) -> list:
    tensors = avals[len(SCALARS) :]
    first = (lambda a: np.dtype(np.float32)) if static["flags"] & UPDATE else (lambda a: a.dtype)
    return [
        _compat.ShapedArray(a.shape, first(a) if k == 0 else a.dtype)
        for i in range(0, len(tensors), 3)
        for k, a in ((k, tensors[i + k]) for k in (0, 2))
    ]


SPEC = KernelSpec(
    name="momentum",
    reference=reference,
    inplace=_inplace,
    attrs=lambda static: {"flags": np.int64(static["flags"])},
    layout=(len(SCALARS), 3, 2),
    narrowable=lambda static: ((1, None),) if static["flags"] & UPDATE else ((0, 0), (1, None)),
    result_avals=_result_avals,
    doc="multi-tensor SGD with momentum (optax and MindSpore forms)",
)
