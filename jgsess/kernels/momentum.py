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

import jax.numpy as jnp

from .optimizer import update_kernel

SCALARS = ("lr", "mu", "wd", "scale")
WEIGHT_DECAY, SCALE, NESTEROV, UPDATE = 1, 2, 4, 8
NARROW = 16  # the update in the tensors' bf16/f16, every operation rounded to it


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
        if flags & NARROW:
            outs += update(p, g, acc, *[s.astype(p.dtype) for s in scalars], flags=flags)
            continue
        f32 = [x.astype(jnp.float32) for x in (p, g, acc)]
        p2, acc2 = update(*f32, *scalars, flags=flags)
        outs += [p2 if flags & UPDATE else p2.astype(p.dtype), acc2.astype(acc.dtype)]
    return tuple(outs)


SPEC = update_kernel(
    "momentum",
    reference,
    SCALARS,
    per_tensor=3,
    state=(2,),
    update_flag=UPDATE,
    doc="multi-tensor SGD with momentum (optax and MindSpore forms)",
    narrow_flag=NARROW,
)
