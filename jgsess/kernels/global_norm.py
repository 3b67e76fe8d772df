"""global_norm: sqrt of the sum of squares of many tensors, as optax's clip_by_global_norm
computes it [Apex's multi_tensor_l2norm].

Operands x_i (f32, bf16 or f16); result: the norm, f32. Each tensor is summed chunk by chunk
(CHUNK elements, partial sums in the workspace arena, 8 bytes per chunk). On the CPU the
chunks add up in order and the tensors' sums from left to right, as optax's Python `sum` does;
the CUDA kernel writes two partials per chunk and adds them all in a fixed tree. The additions
are grouped differently from XLA's reduction, which is free to group them as it likes too: the
result agrees with XLA's to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .. import _compat
from .partition import Factors, dims
from .spec import KernelSpec

CHUNK = 65536  # csrc/common/chunk.h: kChunk (tests/kernels/test_constants.py)


def reference(*tensors):
    sums = [jnp.sum(jnp.square(x.astype(jnp.float32))) for x in tensors]
    return (jnp.sqrt(functools.reduce(jnp.add, sums, jnp.float32(0))),)


def _items(avals) -> int:
    return sum(-(-_compat.aval_nbytes(a) // a.dtype.itemsize // CHUNK) for a in avals)


def _cost_model(node, platform: str) -> tuple[bool, str]:
    if len(node.inputs) < 4:
        return False, "XLA reduces a few tensors as fast"
    return True, f"one call for {len(node.inputs)} tensors"


def _factors(static, avals) -> Factors:
    # every operand factor is a reduction: a sharded tensor leaves a partial sum per shard
    return Factors(tuple(dims(f"x{i}", len(a.shape)) for i, a in enumerate(avals)), ((),))


def _per_shard(bind, operands, axes, static) -> list:
    """The norm from the local blocks: one call per set of mesh axes the tensors are split
    over, each call's square summed over its axes. Replicated tensors take the plain call."""
    arena, tensors, axes = operands[0], operands[1:], axes[1:]  # the arena is replicated
    groups: dict[tuple, list] = {}
    for x, names in zip(tensors, axes):
        groups.setdefault(tuple(sorted(set(names))), []).append(x)
    if list(groups) == [()]:
        return bind(*operands)
    total = jnp.float32(0)
    for names, xs in groups.items():
        norm, arena = bind(arena, *xs)
        square = norm * norm
        total = total + (jax.lax.psum(square, names) if names else square)
    return [jnp.sqrt(total), arena]


SPEC = KernelSpec(
    name="global_norm",
    reference=reference,
    result_avals=lambda avals, static: [_compat.ShapedArray((), jnp.float32)],
    # a partial sum and a start-of-tensor flag per chunk, f32 each
    workspace=lambda static, avals: 8 * _items(avals),
    cost_model=_cost_model,
    factors=_factors,
    per_shard=_per_shard,
    doc="global norm of many tensors (optax.clip_by_global_norm)",
)
