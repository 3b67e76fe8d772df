"""adamw: the multi-tensor Adam / AdamW update, optax's and MindSpore's forms.

Operands: thirteen rank-0 f32 hyper-parameters, then (p, g, m, v) per tensor. Results: (p', m',
v') per tensor, each written over its operand when the memory planner allows. Static param
`flags` picks the form; with UPDATE the first result is optax's update -(lr*u) instead of p'.
Each of p, g, m and v may be bf16/f16 (widened exactly; p', m', v' rounded back to their
dtypes). With NARROW the update is written in the tensors' one bf16/f16 dtype (optax's default
state for narrow parameters): `update` runs in that dtype, each operation rounded to it. The C++
handlers (csrc/kernels/adamw/) compute `update` below in the same order, except that they
multiply by per-call reciprocals where it divides by bc1, bc2 and norm, as XLA's CPU code does
for `x / scalar` (bit for bit with `update` under XLA: benchmarks/optimizer_ulp.py); under
JGSESS_NUMERICS=exact they divide (IEEE division, as numpy does).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .optimizer import update_kernel

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
EXACT = 32  # C++ only: IEEE division where `update` divides (JGSESS_NUMERICS=exact)
NARROW = 64  # the update in the tensors' bf16/f16, every operation rounded to it
OPTAX_ADAMW = BIAS_CORRECTION | EPS_ROOT | WEIGHT_DECAY
OPTAX_ADAM = BIAS_CORRECTION | EPS_ROOT
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
    v2 = omb2 * lax.square(g) + (v if b2 is None else b2 * v)  # None: a pattern's b2 of 1.0
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
    """Thirteen scalars, then (p, g, m, v) per tensor -> (p', m', v') per tensor."""
    scalars, tensors = operands[: len(SCALARS)], operands[len(SCALARS) :]
    outs = []
    for i in range(0, len(tensors), 4):
        p, g, m, v = tensors[i : i + 4]
        if flags & NARROW:
            outs += update(p, g, m, v, *[s.astype(p.dtype) for s in scalars], flags=flags)
            continue
        f32 = [x.astype(jnp.float32) for x in (p, g, m, v)]
        p2, m2, v2 = update(*f32, *scalars, flags=flags)
        outs += [
            p2 if flags & UPDATE else p2.astype(p.dtype),
            m2.astype(m.dtype),
            v2.astype(v.dtype),
        ]
    return tuple(outs)


SPEC = update_kernel(
    "adamw",
    reference,
    SCALARS,
    per_tensor=4,
    state=(2, 3),
    update_flag=UPDATE,
    doc="multi-tensor Adam/AdamW update (optax and MindSpore forms)",
    exact_flag=EXACT,
    narrow_flag=NARROW,
)
