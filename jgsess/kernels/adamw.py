"""adamw: the multi-tensor Adam / AdamW update, optax's and MindSpore's forms.

Operands: thirteen rank-0 f32 hyper-parameters, then (p, g, m, v) per tensor. Results: (p', m',
v') per tensor, each written over its operand when the memory planner allows. Static param
`flags` picks the form; with UPDATE the first result is optax's update -(lr*u) instead of p'.
Each of p, g, m and v may be bf16/f16 (widened exactly; p', m', v' rounded back to their
dtypes). With NARROW the update is written in the tensors' one bf16/f16 dtype (optax's default
state for narrow parameters): `update` runs in that dtype, each operation rounded to it. With
MIXED it is optax's update of bf16 parameters with an f32 first moment (`mu_dtype=float32`;
optax keeps nu in bf16): p, g, v and the hyper-parameters in MIXED_NARROW in bf16, m and the
others f32 (`mixed_update`). The C++
handlers (csrc/kernels/adamw/) compute `update` below in the same order, except that they
multiply by per-call reciprocals where it divides by bc1, bc2 and norm, as XLA's CPU code does
for `x / scalar` (bit for bit with `update` under XLA: benchmarks/optimizer_ulp.py); under
JGSESS_NUMERICS=exact they divide (IEEE division, as numpy does).
"""

from __future__ import annotations

import enum

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


class Flag(enum.IntFlag):
    """The kernel's `flags` bits: csrc/kernels/adamw/adamw.h's AdamwFlag (tests check that
    they agree with what `_C.kernel_flags()` reports)."""

    BIAS_CORRECTION = 1
    EPS_ROOT = 2
    WEIGHT_DECAY = 4
    UPDATE = 8  # the first result is optax's update -(lr*u), not p'
    CLIP = 16  # optax.clip_by_global_norm folded in
    EXACT = 32  # C++ only: IEEE division where `update` divides (JGSESS_NUMERICS=exact)
    NARROW = 64  # the update in the tensors' bf16/f16, every operation rounded to it
    MIXED = 128  # bf16 p, g, v with an f32 m (optax's mu_dtype=float32)


# under MIXED, the tensors and hyper-parameters in the parameters' dtype (the rest are f32): optax
# casts the second moment's bias correction to its dtype, and jnp makes a Python float (b2, eps,
# ...) the dtype of the narrow array it multiplies or adds
MIXED_NARROW = ("p", "g", "v", "b2", "omb2", "bc2", "eps", "eps_root")
OPTAX_ADAMW = Flag.BIAS_CORRECTION | Flag.EPS_ROOT | Flag.WEIGHT_DECAY
OPTAX_ADAM = Flag.BIAS_CORRECTION | Flag.EPS_ROOT
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
    if flags & Flag.CLIP:
        g = jnp.where(keep != 0, g, (g / norm) * clip)
    m2 = omb1 * g + b1 * m
    v2 = omb2 * lax.square(g) + (v if b2 is None else b2 * v)  # None: a pattern's b2 of 1.0
    mhat, vhat = m2, v2
    if flags & Flag.BIAS_CORRECTION:
        mhat, vhat = m2 / bc1, v2 / bc2
    if flags & Flag.EPS_ROOT:
        vhat = vhat + eps_root
    u = mhat / (lax.sqrt(vhat) + eps)
    if flags & Flag.WEIGHT_DECAY:
        u = u + wd * p
    if flags & Flag.UPDATE:
        return -(lr * u), m2, v2
    return p - lr * u, m2, v2


def _mixed_scalars(scalars, dtype) -> list:
    return [s.astype(dtype) if n in MIXED_NARROW else s for n, s in zip(SCALARS, scalars)]


def mixed_update(p, g, m, v, *scalars, flags, **named):
    """One tensor's update under MIXED (operands in MIXED_NARROW in the parameters' dtype, the
    others f32): optax's adamw with mu_dtype=float32 on narrow parameters as XLA computes it
    where it widens a narrow product read only in f32 (passes/widen_narrow_products.py rewrites
    optax's `f32((1 - b1) * g)` and `f32(wd * p)` so): the first moment, the division, the
    weight decay and the step in f32, the second moment and the denominator in the narrow
    dtype (XLA's CPU code computes `f32(sqrt(v^) + eps)` without rounding the sum; the kernel
    does the same, and fuse-adamw takes it only where the two agree). The new parameter is
    rounded to its dtype; optax's update stays f32. The hyper-parameters as `update` takes them
    (SCALARS)."""
    h = {**dict(zip(SCALARS, scalars)), **named}
    f32 = jnp.float32
    m2 = h["omb1"] * g.astype(f32) + h["b1"] * m
    b2 = h["b2"]  # None: a pattern's b2 of 1.0
    v2 = h["omb2"] * lax.square(g) + (v if b2 is None else b2 * v)
    mhat, vhat = m2, v2
    if flags & Flag.BIAS_CORRECTION:
        mhat, vhat = m2 / h["bc1"], v2 / h["bc2"]
    if flags & Flag.EPS_ROOT:
        vhat = vhat + h["eps_root"]
    u = mhat / (lax.sqrt(vhat) + h["eps"]).astype(f32)
    if flags & Flag.WEIGHT_DECAY:
        u = u + h["wd"] * p.astype(f32)
    if flags & Flag.UPDATE:
        return -(h["lr"] * u), m2, v2
    return (p.astype(f32) - h["lr"] * u).astype(p.dtype), m2, v2


def reference(*operands, flags):
    """Thirteen scalars, then (p, g, m, v) per tensor -> (p', m', v') per tensor."""
    scalars, tensors = operands[: len(SCALARS)], operands[len(SCALARS) :]
    outs = []
    for i in range(0, len(tensors), 4):
        p, g, m, v = tensors[i : i + 4]
        if flags & Flag.NARROW:
            outs += update(p, g, m, v, *[s.astype(p.dtype) for s in scalars], flags=flags)
            continue
        if flags & Flag.MIXED:
            outs += mixed_update(p, g, m, v, *_mixed_scalars(scalars, p.dtype), flags=flags)
            continue
        f32 = [x.astype(jnp.float32) for x in (p, g, m, v)]
        p2, m2, v2 = update(*f32, *scalars, flags=flags)
        outs += [
            p2 if flags & Flag.UPDATE else p2.astype(p.dtype),
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
    update_flag=Flag.UPDATE,
    doc="multi-tensor Adam/AdamW update (optax and MindSpore forms)",
    exact_flag=Flag.EXACT,
    narrow_flag=Flag.NARROW,
    mixed_flag=Flag.MIXED,
)
