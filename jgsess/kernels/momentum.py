"""momentum: the multi-tensor SGD-with-momentum update, optax's and MindSpore's forms
[ApplyMomentum{WeightDecay,Scale,WeightDecayScale}Fusion].

Operands: four rank-0 f32 hyper-parameters (lr, mu, wd, scale), then (p, g, acc) per tensor.
Results: (p', acc') per tensor. Static param `flags` adds weight decay (p*wd + g), a gradient
scale (a loss scale's reciprocal) and Nesterov's look-ahead; with UPDATE the first result is
optax's update -(lr*d) instead of p'. p, g and acc may each be bf16/f16 (widened exactly; p'
and acc' rounded back to their dtypes). With NARROW the update is written in the tensors' one
bf16/f16 dtype (optax's default accumulator for narrow parameters): `update` runs in that dtype,
each operation rounded to it. The C++ handlers (csrc/kernels/momentum/) compute `update` below
in the same order.
"""

from __future__ import annotations

import enum

import jax.numpy as jnp

from .optimizer import update_kernel

SCALARS = ("lr", "mu", "wd", "scale")


class Flag(enum.IntFlag):
    """The kernel's `flags` bits: csrc/kernels/momentum/momentum.h's MomentumFlag (tests check
    that they agree with what `_C.kernel_flags()` reports)."""

    WEIGHT_DECAY = 1  # g + p*wd
    SCALE = 2  # the gradient times `scale` (a loss scale's reciprocal)
    NESTEROV = 4
    UPDATE = 8  # the first result is optax's update -(lr*d), not p'
    NARROW = 16  # the update in the tensors' bf16/f16, every operation rounded to it


def update(p, g, acc, lr, mu, wd, scale, *, flags):
    """One tensor's update."""
    gt = g
    if flags & Flag.WEIGHT_DECAY:
        gt = p * wd + gt
    if flags & Flag.SCALE:
        gt = gt * scale
    acc2 = mu * acc + gt
    d = gt + mu * acc2 if flags & Flag.NESTEROV else acc2
    if flags & Flag.UPDATE:
        return -(lr * d), acc2
    return p - lr * d, acc2


def reference(*operands, flags):
    """Four scalars, then (p, g, acc) per tensor -> (p', acc') per tensor."""
    scalars, tensors = operands[: len(SCALARS)], operands[len(SCALARS) :]
    outs = []
    for i in range(0, len(tensors), 3):
        p, g, acc = tensors[i : i + 3]
        if flags & Flag.NARROW:
            outs += update(p, g, acc, *[s.astype(p.dtype) for s in scalars], flags=flags)
            continue
        f32 = [x.astype(jnp.float32) for x in (p, g, acc)]
        p2, acc2 = update(*f32, *scalars, flags=flags)
        outs += [p2 if flags & Flag.UPDATE else p2.astype(p.dtype), acc2.astype(acc.dtype)]
    return tuple(outs)


SPEC = update_kernel(
    "momentum",
    reference,
    SCALARS,
    per_tensor=3,
    state=(2,),
    update_flag=Flag.UPDATE,
    doc="multi-tensor SGD with momentum (optax and MindSpore forms)",
    narrow_flag=Flag.NARROW,
)
