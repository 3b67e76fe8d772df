"""What the multi-tensor optimizer kernels (adamw, momentum) share: their operand layout.

Operands: the hyper-parameters (rank-0 f32, shared by every tensor of a call), then per tensor
the parameter, the gradient and the optimizer state. Results per tensor: the new parameter (or
optax's update, under the kernel's UPDATE flag) and the new state, each over its operand's
buffer (an update, in a buffer of its own). Under jax.vmap the hyper-parameters may hold one
value per member of the batch (shape (members,)); every tensor then leads with the member axis
and each part gets its member's.
Each of the parameter, the gradient and the state buffers may be bf16/f16: the kernels widen
them exactly, compute in f32, and round the results to their operands' dtypes. Under a kernel's
narrow flag the update is written in bf16/f16 instead (every buffer of a tensor in that dtype,
as optax keeps a narrow parameter's state): each operation's result is rounded to it.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from .. import _compat, _config
from .partition import Factors, dims, multi_tensor
from .spec import Followed, KernelSpec, TensorLists


def update_kernel(
    name: str,
    reference,
    scalars: tuple,
    per_tensor: int,
    state: tuple,
    update_flag: int,
    doc: str,
    prefer_kernel=None,
    exact_flag: int = 0,
    narrow_flag: int = 0,
    mixed_flag: int = 0,
) -> KernelSpec:
    """The spec of a kernel with `per_tensor` operands per tensor (p, g, then the state slots
    `state`) and results (p' or the update, then the new state). `exact_flag`, if the kernel
    has one, is added to the C++ flags under JGSESS_NUMERICS=exact (the kernel then divides,
    IEEE, instead of multiplying by reciprocals as XLA's CPU code does) except in narrow forms
    (`narrow_flag`: the update written in the tensors' bf16/f16, the update result too) and
    mixed ones (`mixed_flag`: some operations in a narrow dtype, every operand in its own)."""
    base = len(scalars)
    sources = (0, *state)  # the operand each result is computed over

    def inplace(static, num_operands: int) -> dict[int, int]:
        # an update gets a buffer of its own: `apply_updates` reads its parameter after the
        # call, and its gradient is often an argument of the step or a loop's constant; over
        # either, XLA copies the operand first (measured: a scan of 4 ResNet-50 AdamW steps
        # in jax.jit, 143 ms with the update in its own buffer, 175 ms over the gradient)
        first = 1 if static.get("flags", 0) & update_flag else 0
        tensors = (num_operands - base) // per_tensor
        return {
            base + per_tensor * t + operand: len(sources) * t + k
            for t in range(tensors)
            for k, operand in enumerate(sources)
            if k >= first
        }

    def result_avals(avals, static) -> list:
        update = static["flags"] & update_flag and not static["flags"] & narrow_flag
        out = []
        for i in range(base, len(avals), per_tensor):
            for k, operand in enumerate(sources):
                a = avals[i + operand]
                dtype = np.dtype(np.float32) if k == 0 and update else a.dtype
                out.append(_compat.ShapedArray(a.shape, dtype))
        return out

    def narrowable(static) -> tuple:
        # p folds with p' (not with an update, whose dtype does not follow p's); g on its own;
        # each state slot with its new state; nothing in a narrow or mixed form (it computes in
        # bf16/f16 and reads every operand in its own dtype)
        if static["flags"] & (narrow_flag | mixed_flag):
            return ()
        first = ((1, None),) if static["flags"] & update_flag else ((0, 0), (1, None))
        return first + tuple((operand, k + 1) for k, operand in enumerate(state))

    def batched_reference(*operands, **static):
        # hyper-parameters with one value per member (see spec.py's batching rule): the
        # tensors' leading axis is the member
        if np.ndim(operands[0]) == 0:
            return reference(*operands, **static)
        return jax.vmap(functools.partial(batched_reference, **static))(*operands)

    def exact(flags: int) -> int:
        rounded = flags & (narrow_flag | mixed_flag)
        return exact_flag if _config.exact_numerics() and not rounded else 0

    def followed_by(static) -> Followed | None:
        if not static["flags"] & update_flag:
            return None

        def apply_updates(operands, results):  # optax.apply_updates on each tensor
            out = list(results)
            for t, i in enumerate(range(base, len(operands), per_tensor)):
                p, k = operands[i], len(sources) * t
                out[k] = (p + out[k]).astype(p.dtype)
            return out

        def writes(num_operands: int) -> tuple[int, ...]:  # p and the state, per tensor
            return tuple(i + s for i in range(base, num_operands, per_tensor) for s in sources)

        return Followed(apply_updates, writes)

    tensors = TensorLists(base, per_tensor, len(sources))
    return KernelSpec(
        name=name,
        reference=batched_reference,
        inplace=inplace,
        attrs=lambda static: {"flags": np.int64(static["flags"] | exact(static["flags"]))},
        tensors=tensors,
        alike=(1,),  # the gradient
        narrowable=narrowable,
        result_avals=result_avals,
        prefer_kernel=prefer_kernel,
        followed_by=followed_by,
        factors=functools.partial(_factors, multi_tensor(tensors), base),
        doc=doc,
    )


def _factors(plain, base: int, static, avals) -> Factors:
    """The sharding rule: the multi-tensor rule, except that with hyper-parameters per member
    (see spec.py's batching rule) one set of member factors leads every operand and result and
    is never split, so each per-device call sees whole members with their own values."""
    rules = plain(static, avals)
    rank = len(avals[0].shape)
    if rank == 0:
        return rules
    member = dims("member", rank)
    operands = tuple(
        member if i < base else member + tuple(d[rank:]) for i, d in enumerate(rules.operands)
    )
    results = tuple(member + tuple(d[rank:]) for d in rules.results)
    return Factors(operands, results, rules.sizes, (*rules.replicated, *member))
