"""Checking a kernel against its pure-JAX reference."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tests.helpers import assert_trees_close

# odd sizes: one element, less than a SIMD vector, not a multiple of the CPU chunk (16384) or
# the CUDA chunk (65536), a 2-D tensor, several chunks
SIZES = [(1,), (7,), (1023,), (33, 65), (100_003,)]


def kernel_fn(spec, **static):
    bind = functools.partial(spec.primitive.bind, aliases=(), **static)
    return jax.jit(lambda *ops: bind(*ops))


def reference_fn(spec, **static):
    return jax.jit(functools.partial(spec.reference, **static))


def check(spec, operands, rtol=1e-6, atol=1e-8, device=None, **static):
    """The kernel equals the reference on `operands` (results compared as f32)."""
    if device is not None:
        operands = jax.device_put(operands, device)
        # poison the allocator: results must overwrite every element of a reused buffer
        jax.block_until_ready([jnp.full(o.shape, jnp.nan, o.dtype) for o in operands])
    got = kernel_fn(spec, **static)(*operands)
    want = list(reference_fn(spec, **static)(*operands))
    assert [g.dtype for g in got] == [w.dtype for w in want]
    f32 = lambda xs: [x.astype(jnp.float32) for x in xs]  # noqa: E731
    assert_trees_close(f32(got), f32(want), rtol=rtol, atol=atol)
