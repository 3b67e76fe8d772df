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
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np

from .. import _compat, _config
from .partition import Factors, dims, multi_tensor
from .spec import Followed, KernelSpec, TensorLists


@dataclass(frozen=True)
class _Layout:
    """One optimizer kernel's operands and results (see update_kernel), and the spec's
    callbacks that follow from them."""

    reference: Callable
    base: int  # hyper-parameters, before the tensors
    per_tensor: int
    sources: tuple  # per result of a tensor, the operand it is computed over: p, then the state
    update_flag: int
    exact_flag: int
    narrow_flag: int
    mixed_flag: int

    def inplace(self, static, num_operands: int) -> dict[int, int]:
        # an update gets a buffer of its own: `apply_updates` reads its parameter after the
        # call, and its gradient is often an argument of the step or a loop's constant; over
        # either, XLA copies the operand first (measured: a scan of 4 ResNet-50 AdamW steps
        # in jax.jit, 143 ms with the update in its own buffer, 175 ms over the gradient)
        first = 1 if static.get("flags", 0) & self.update_flag else 0
        tensors = (num_operands - self.base) // self.per_tensor
        return {
            self.base + self.per_tensor * t + operand: len(self.sources) * t + k
            for t in range(tensors)
            for k, operand in enumerate(self.sources)
            if k >= first
        }

    def result_avals(self, avals, static) -> list:
        flags = static["flags"]
        update = flags & self.update_flag and not flags & self.narrow_flag
        out = []
        for i in range(self.base, len(avals), self.per_tensor):
            for k, operand in enumerate(self.sources):
                a = avals[i + operand]
                dtype = np.dtype(np.float32) if k == 0 and update else a.dtype
                out.append(_compat.ShapedArray(a.shape, dtype))
        return out

    def narrowable(self, static) -> tuple:
        # p folds with p' (not with an update, whose dtype does not follow p's); g on its own;
        # each state slot with its new state; nothing in a narrow or mixed form (it computes in
        # bf16/f16 and reads every operand in its own dtype)
        if static["flags"] & (self.narrow_flag | self.mixed_flag):
            return ()
        first = ((1, None),) if static["flags"] & self.update_flag else ((0, 0), (1, None))
        return first + tuple((operand, k + 1) for k, operand in enumerate(self.sources[1:]))

    def batched_reference(self, *operands, **static):
        # hyper-parameters with one value per member (see spec.py's batching rule): the
        # tensors' leading axis is the member
        if np.ndim(operands[0]) == 0:
            return self.reference(*operands, **static)
        return jax.vmap(functools.partial(self.batched_reference, **static))(*operands)

    def attrs(self, static) -> dict:
        flags = static["flags"]
        rounded = flags & (self.narrow_flag | self.mixed_flag)
        exact = self.exact_flag if _config.exact_numerics() and not rounded else 0
        return {"flags": np.int64(flags | exact)}

    def followed_by(self, static) -> Followed | None:
        if not static["flags"] & self.update_flag:
            return None
        return Followed(self.apply_updates, self.writes)

    def apply_updates(self, operands, results) -> list:  # optax.apply_updates on each tensor
        out = list(results)
        for t, i in enumerate(range(self.base, len(operands), self.per_tensor)):
            p, k = operands[i], len(self.sources) * t
            out[k] = (p + out[k]).astype(p.dtype)
        return out

    def cost_model(self, node, platform: str) -> tuple[bool, str] | None:
        # f16 narrow math rounds each operation by a conversion to f16 and back, as XLA's code
        # for it does on a CPU without f16 arithmetic (where the form fuses): both are bound by
        # the same conversions, so the form is measured (a ResNet-50 SGD-momentum step in f16,
        # 2-core AMD EPYC: 10.5 ms with the kernel, 9.7 with XLA's code); unmeasured, XLA's
        # code. Every other form computes in f32 whatever its buffers, and a GPU converts in
        # a cycle: the kernel, unmeasured
        if platform != "cpu" or not node.params["flags"] & self.narrow_flag:
            return None
        if node.inputs[self.base].aval.dtype != np.float16:
            return None
        return False, "f16 narrow math: XLA's code converts as many times"

    def writes(self, num_operands: int) -> tuple[int, ...]:  # p and the state, per tensor
        starts = range(self.base, num_operands, self.per_tensor)
        return tuple(i + s for i in starts for s in self.sources)


def update_kernel(
    name: str,
    reference,
    scalars: tuple,
    per_tensor: int,
    state: tuple,
    update_flag: int,
    doc: str,
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
    base, sources = len(scalars), (0, *state)
    layout = _Layout(
        reference, base, per_tensor, sources, update_flag, exact_flag, narrow_flag, mixed_flag
    )
    tensors = TensorLists(base, per_tensor, len(sources))
    return KernelSpec(
        name=name,
        reference=layout.batched_reference,
        inplace=layout.inplace,
        attrs=layout.attrs,
        tensors=tensors,
        sharded_like_first=(1,),  # the gradient
        narrowable=layout.narrowable,
        result_avals=layout.result_avals,
        followed_by=layout.followed_by,
        cost_model=layout.cost_model,
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
