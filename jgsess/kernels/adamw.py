"""adamw: the multi-tensor Adam / AdamW update, optax's and MindSpore's forms.

Operands: ten rank-0 f32 hyper-parameters, then (p, g, m, v) per tensor. Results: (p', m', v')
per tensor, each written over its operand when the memory planner allows. Static param `flags`
picks the form; the C++ handlers (csrc/kernels/adamw/) compute the same formula in the same
order as `update` below.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from .spec import KernelSpec

SCALARS = ("b1", "omb1", "b2", "omb2", "bc1", "bc2", "eps", "eps_root", "wd", "lr")
BIAS_CORRECTION, EPS_ROOT, WEIGHT_DECAY = 1, 2, 4
OPTAX_ADAMW = BIAS_CORRECTION | EPS_ROOT | WEIGHT_DECAY
OPTAX_ADAM = BIAS_CORRECTION | EPS_ROOT
MINDSPORE_ADAM_WEIGHT_DECAY = WEIGHT_DECAY
MINDSPORE_ADAM = 0


def update(p, g, m, v, b1, omb1, b2, omb2, bc1, bc2, eps, eps_root, wd, lr, *, flags):
    """One tensor's update (the formula every form shares; `flags` switches its parts off)."""
    m2 = omb1 * g + b1 * m
    v2 = omb2 * lax.square(g) + b2 * v
    mhat, vhat = m2, v2
    if flags & BIAS_CORRECTION:
        mhat, vhat = m2 / bc1, v2 / bc2
    if flags & EPS_ROOT:
        vhat = vhat + eps_root
    u = mhat / (lax.sqrt(vhat) + eps)
    if flags & WEIGHT_DECAY:
        u = u + wd * p
    return p - lr * u, m2, v2


def reference(*operands, flags):
    """All tensors of one call: ten scalars, then (p, g, m, v) per tensor -> (p', m', v')*."""
    scalars, tensors = operands[: len(SCALARS)], operands[len(SCALARS) :]
    outs = []
    for i in range(0, len(tensors), 4):
        outs.extend(update(*tensors[i : i + 4], *scalars, flags=flags))
    return tuple(outs)


def _inplace(static, num_operands: int) -> dict[int, int]:
    # operand -> result: p -> p', m -> m', v -> v' for every tensor
    base = len(SCALARS)
    return {
        base + 4 * t + operand: 3 * t + k
        for t in range((num_operands - base) // 4)
        for k, operand in enumerate((0, 2, 3))
    }


SPEC = KernelSpec(
    name="adamw",
    reference=reference,
    inplace=_inplace,
    attrs=lambda static: {"flags": np.int64(static["flags"])},
    elementwise=False,
    doc="multi-tensor Adam/AdamW update (optax and MindSpore forms)",
)
