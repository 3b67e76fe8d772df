"""What the multi-tensor optimizer kernels (adamw, momentum) share: their operand layout.

Operands: the hyper-parameters (rank-0 f32, shared by every tensor of a call), then per tensor
the parameter, the gradient and the optimizer state. Results per tensor: the new parameter (or
optax's update, under the kernel's UPDATE flag) and the new state, each over its operand's
buffer. The parameter and gradient may be bf16/f16; the state is f32.
"""

from __future__ import annotations

import numpy as np

from .. import _compat
from .partition import multi_tensor
from .spec import KernelSpec


def update_kernel(
    name: str,
    reference,
    scalars: tuple,
    per_tensor: int,
    state: tuple,
    update_flag: int,
    doc: str,
    prefer_kernel=None,
) -> KernelSpec:
    """The spec of a kernel with `per_tensor` operands per tensor (p, g, then the state slots
    `state`) and results (p' or the update, then the new state)."""
    base = len(scalars)
    sources = (0, *state)  # the operand each result is computed over

    def inplace(static, num_operands: int) -> dict[int, int]:
        tensors = (num_operands - base) // per_tensor
        return {
            base + per_tensor * t + operand: len(sources) * t + k
            for t in range(tensors)
            for k, operand in enumerate(sources)
        }

    def result_avals(avals, static) -> list:
        update = static["flags"] & update_flag
        out = []
        for i in range(base, len(avals), per_tensor):
            for k, operand in enumerate(sources):
                a = avals[i + operand]
                dtype = np.dtype(np.float32) if k == 0 and update else a.dtype
                out.append(_compat.ShapedArray(a.shape, dtype))
        return out

    def narrowable(static) -> tuple:
        # p folds with p' (not with an update, whose dtype does not follow p's); g on its own
        return ((1, None),) if static["flags"] & update_flag else ((0, 0), (1, None))

    return KernelSpec(
        name=name,
        reference=reference,
        inplace=inplace,
        attrs=lambda static: {"flags": np.int64(static["flags"])},
        layout=(base, per_tensor, len(sources)),
        narrowable=narrowable,
        result_avals=result_avals,
        prefer_kernel=prefer_kernel,
        factors=multi_tensor((base, per_tensor, len(sources))),
        doc=doc,
    )


def mean_tensor_size(node) -> float:
    """Elements per tensor of a multi-tensor node, on average."""
    base, per_tensor, _ = node.op.layout
    sizes = [int(np.prod(v.shape)) for v in node.inputs[base::per_tensor]]
    return sum(sizes) / max(len(sizes), 1)
