"""adamw: the multi-tensor Adam / AdamW update, optax's and MindSpore's forms.

Operands: ten rank-0 f32 hyper-parameters, then (p, g, m, v) per tensor. Results: (p', m', v')
per tensor, each written over its operand when the memory planner allows. Static param `flags`
picks the form; with UPDATE the first result is optax's update -(lr*u) instead of p'. p and g
may be bf16/f16 (widened exactly, p' rounded back to p's dtype); m and v are f32. The C++
handlers (csrc/kernels/adamw/) compute the same formula in the same order as `update` below.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _compat
from .spec import KernelSpec

SCALARS = (
    "b1",
    "omb1",
    "b2",
    "omb2",
    "bc1",
    "bc2",
    "eps",
    "eps_root",
    "wd",
    "lr",
    "keep",
    "norm",
    "clip",
)
BIAS_CORRECTION, EPS_ROOT, WEIGHT_DECAY, UPDATE, CLIP = 1, 2, 4, 8, 16
OPTAX_ADAMW = BIAS_CORRECTION | EPS_ROOT | WEIGHT_DECAY
OPTAX_ADAM = BIAS_CORRECTION | EPS_ROOT
MINDSPORE_ADAM_WEIGHT_DECAY = WEIGHT_DECAY
MINDSPORE_ADAM = 0


def update(
    p,
    g,
    m,
    v,
    b1,
    omb1,
    b2,
    omb2,
    bc1,
    bc2,
    eps,
    eps_root,
    wd,
    lr,
    keep=None,
    norm=None,
    clip=None,
    *,
    flags,
):
    """One tensor's update (the formula every form shares; `flags` switches its parts off).

    With CLIP, g is first clipped as optax.clip_by_global_norm does: where `keep` (1.0 when the
    global norm is within `clip`) it stays, else it becomes (g / norm) * clip.
    """
    if flags & CLIP:
        g = jnp.where(keep != 0, g, (g / norm) * clip)
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
    if flags & UPDATE:
        return -(lr * u), m2, v2
    return p - lr * u, m2, v2


def reference(*operands, flags):
    """Ten scalars, then (p, g, m, v) per tensor -> (p', m', v') per tensor."""
    scalars, tensors = operands[: len(SCALARS)], operands[len(SCALARS) :]
    outs = []
    for i in range(0, len(tensors), 4):
        p, g, m, v = tensors[i : i + 4]
        f32 = [x.astype(jnp.float32) for x in (p, g)]
        p2, m2, v2 = update(*f32, m, v, *scalars, flags=flags)
        outs += [p2 if flags & UPDATE else p2.astype(p.dtype), m2, v2]
    return tuple(outs)


def _inplace(static, num_operands: int) -> dict[int, int]:
    # operand -> result: p -> p', m -> m', v -> v' for every tensor
    base = len(SCALARS)
    return {
        base + 4 * t + operand: 3 * t + k
        for t in range((num_operands - base) // 4)
        for k, operand in enumerate((0, 2, 3))
    }


def _result_avals(avals, static) -> list:
    tensors = avals[len(SCALARS) :]
    first = (lambda a: np.dtype(np.float32)) if static["flags"] & UPDATE else (lambda a: a.dtype)
    return [
        _compat.ShapedArray(a.shape, first(a) if k == 0 else a.dtype)
        for i in range(0, len(tensors), 4)
        for k, a in ((k, tensors[i + k]) for k in (0, 2, 3))
    ]


SPEC = KernelSpec(
    name="adamw",
    reference=reference,
    inplace=_inplace,
    attrs=lambda static: {"flags": np.int64(static["flags"])},
    layout=(len(SCALARS), 4, 3),
    # p folds with p' (not with an update result, whose dtype does not follow p's); g alone
    narrowable=lambda static: ((1, None),) if static["flags"] & UPDATE else ((0, 0), (1, None)),
    result_avals=_result_avals,
    doc="multi-tensor Adam/AdamW update (optax and MindSpore forms)",
)
