"""relu_mask / relu_mask_grad: ReLU whose backward keeps a 1-bit mask [ReluV2, AddReluV2,
AddReluGradV2].

relu_mask(x) or relu_mask(a, b): s = x (or a + b) -> (relu(s), mask), where bit i % 32 of the
u32 word i // 32 of `mask` (in row-major order) is s_i > 0. Where the last dimension is a
multiple of 32 the mask keeps the leading dimensions, s[..., c] -> mask[..., c // 32], so a
sharded activation has a mask sharded alike; elsewhere the mask is flat and a sharded
activation is gathered first. relu_mask_grad(mask, dy) or (mask, dy1, dy2): the
gradient (or the sum of two) where the bit is set, 0 elsewhere. The references use
`jax.nn.relu`, so the fused forward keeps relu's derivative.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat, _config
from .partition import Factors, dims
from .spec import KernelSpec


def mask_shape(shape: tuple) -> tuple:
    """The mask's shape for an activation of `shape`: [..., c / 32] or [ceil(n / 32)]."""
    if shape and shape[-1] % 32 == 0:
        return (*shape[:-1], shape[-1] // 32)
    return (-(-int(np.prod(shape, dtype=np.int64)) // 32),)


def pack(bits):
    """bool[...] -> the uint32 mask, bit i % 32 of word i // 32."""
    flat = bits.reshape(-1)
    flat = jnp.pad(flat, (0, -flat.size % 32)).reshape(-1, 32).astype(jnp.uint32)
    words = jnp.sum(flat << jnp.arange(32, dtype=jnp.uint32), axis=1, dtype=jnp.uint32)
    return words.reshape(mask_shape(bits.shape))


def unpack(mask, shape):
    size = int(np.prod(shape, dtype=np.int64))
    bits = (mask.reshape(-1)[:, None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
    return bits.reshape(-1)[:size].reshape(shape).astype(bool)


def forward(*operands):
    s = operands[0] if len(operands) == 1 else operands[0] + operands[1]
    return jax.nn.relu(s), pack(s > 0)


def backward(mask, *grads):
    g = grads[0] if len(grads) == 1 else grads[0] + grads[1]
    return (jnp.where(unpack(mask, g.shape), g, jnp.zeros((), g.dtype)),)


def memory_preferred(platform: str) -> tuple[bool, str]:
    # The masks lower XLA's temp memory, but the bias add no longer fuses with the ReLU, so the
    # step is slower on the CPU (flax MLP and CNN steps: report.memory and
    # benchmarks/train_step.py show both). Not measured on a GPU.
    if _config.prefer_memory():
        return True, "JGSESS_PREFER=memory: 1 bit per element kept for the backward"
    return False, "saves memory but costs some speed (set JGSESS_PREFER=memory to take it)"


def mask_factors(shape: tuple) -> tuple:
    """(factors of an activation of `shape`, of its mask, compound sizes, replicated factors):
    the mask splits with the activation's leading dimensions where it keeps them (the last
    dimension, a multiple of 32, splits in whole words); a flat mask splits with nothing."""
    lead = dims("x", len(shape) - 1)
    if len(mask_shape(shape)) == len(shape) and shape[-1] > 32:
        return (*lead, ("x_w", "x_bit")), (*lead, "x_w"), (("x_bit", 32),), ()
    if len(mask_shape(shape)) == len(shape):  # one word per row: the rows may split
        return (*lead, "x_c"), (*lead, "x_w"), (), ("x_c", "x_w")
    x = dims("x", len(shape))
    return x, ("mask",), (), (*x, "mask")


def _factors(forward: bool):
    def factors(static, avals) -> Factors:
        shape = avals[0 if forward else 1].shape
        inputs = len(avals) if forward else len(avals) - 1
        x, mask, sizes, replicated = mask_factors(shape)
        if forward:
            return Factors((x,) * inputs, (x, mask), sizes, replicated)
        return Factors((mask, *(x,) * inputs), (x,), sizes, replicated)

    return factors


def forward_avals(avals, static) -> list:
    """y (as s) and the mask's u32 words, for s (or a, b)."""
    return [
        _compat.ShapedArray(avals[0].shape, avals[0].dtype),
        _compat.ShapedArray(mask_shape(avals[0].shape), np.dtype(np.uint32)),
    ]


FORWARD = KernelSpec(
    name="relu_mask",
    reference=forward,
    result_avals=forward_avals,
    policy=memory_preferred,
    factors=_factors(forward=True),
    doc="ReLU keeping a 1-bit mask for its backward",
)

BACKWARD = KernelSpec(
    name="relu_mask_grad",
    reference=backward,
    result_avals=lambda avals, static: [_compat.ShapedArray(avals[1].shape, avals[1].dtype)],
    factors=_factors(forward=False),
    doc="ReLU's backward from a 1-bit mask",
)
