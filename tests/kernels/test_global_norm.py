"""The global_norm kernel against its reference, its workspace in the arena."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgsess.kernels import global_norm
from tests.emulator import simt
from tests.helpers import assert_trees_close
from tests.kernels.bad_calls import BF16, F16, F32, I32, U8, N, array, call, spec
from tests.kernels.common import SIZES, assert_custom_call

pytestmark = pytest.mark.usefixtures("kernels")


def tensors(shapes, seed=0, dtype=jnp.float32):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
    return [
        (jax.random.normal(k, s) * (i + 1)).astype(dtype)
        for i, (k, s) in enumerate(zip(keys, shapes))
    ]


def kernel_norm(xs, offset=128, device=None):
    avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]
    size = global_norm.SPEC.workspace({}, avals)
    arena = jnp.full((offset + size + 64,), 255, jnp.uint8)  # garbage: partials must be written
    if device is not None:
        xs, arena = jax.device_put((xs, arena), device)
    bind = functools.partial(global_norm.SPEC.primitive.bind, aliases=(), workspace=(offset, size))
    fn = jax.jit(lambda a, *x: bind(a, *x))
    assert_custom_call(global_norm.SPEC, fn, arena, *xs, device=device)
    norm, arena_out = fn(arena, *xs)
    return norm, arena_out, offset, size


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_matches_the_reference_on_odd_sizes(dtype):
    xs = tensors(SIZES + [(0,), (3, 80_001)], dtype=dtype)  # last chunk past a part
    norm, *_ = kernel_norm(xs)
    # XLA groups the additions as it likes: float32 rounding of a 2M-element sum
    assert_trees_close(norm, global_norm.reference(*xs)[0], rtol=1e-5, atol=0)


def test_partials_live_in_the_arena_and_the_rest_is_untouched(kernels):
    xs = tensors([(5,), (200_000,)])
    norm, arena, offset, size = kernel_norm(xs)
    arena = np.asarray(arena)
    assert (arena[:offset] == 255).all() and (arena[offset + size :] == 255).all()
    # a partial per chunk on the CPU, per block (two per chunk) on CUDA: 8 bytes per chunk
    per_chunk = 1 if kernels == "cpu" else 2
    partials = arena[offset : offset + size].view(np.float32)[: size // 8 * per_chunk]
    assert partials.size == (1 + 4) * per_chunk  # one chunk of the small tensor, four of the large
    np.testing.assert_allclose(np.sqrt(partials.sum()), norm, rtol=1e-6)


def test_no_tensors_and_the_workspace_size():
    avals = [jax.ShapeDtypeStruct((65_537,), jnp.float32), jax.ShapeDtypeStruct((3,), jnp.bfloat16)]
    assert global_norm.SPEC.workspace({}, avals) == 8 * (2 + 1)
    norm, *_ = kernel_norm([])
    assert float(norm) == 0.0


def test_cuda_kernel_matches_reference(cuda_device):
    xs = tensors(SIZES + [(1 << 22,)] + [(129,)] * 300, seed=4)
    norm, *_ = kernel_norm(xs, device=cuda_device)
    assert_trees_close(norm, global_norm.reference(*xs)[0], rtol=5e-6, atol=0)


def test_the_cuda_finish_adds_the_partials_in_parallel_and_in_a_fixed_order(kernels):
    if kernels != "simt":
        pytest.skip("the CUDA handler's launches, emulated")
    xs = tensors([(5,), (200_000,), (3,)] + [(70_001,)] * 40)
    simt.module().launches()
    norms = [kernel_norm(xs)[0] for _ in range(3)]  # each run in another thread order
    jax.block_until_ready(norms)  # the launches are done (jax 0.11 dispatches asynchronously)
    kernel, _, block = simt.module().launches()[-1]
    assert kernel == "Finish" and block[0] >= 256, (kernel, block)
    assert len({np.asarray(n).tobytes() for n in norms}) == 1


def malformed_calls():
    """Direct calls of jgsess_global_norm (tests/kernels/test_operand_checks.py)."""
    xs = [array((N,), BF16), array((7,), F32)]
    items = (N >> 16) + 1
    arena = array((64 + 8 * items,), U8)

    def case(xs=xs, arena=arena, arena_out=None, offset=64, norm=None):
        out = spec(arena.shape, U8) if arena_out is None else arena_out
        norm = spec((), F32) if norm is None else norm
        return call("jgsess_global_norm", [arena, *xs], [norm, out], workspace_offset=offset)

    good = {"well formed": case(), "no tensors": case(xs=[])}
    bad = {
        "no operands": call("jgsess_global_norm", [], [spec((), F32), spec((8,), U8)]),
        "a negative offset": case(offset=-64),
        "an unaligned offset": case(offset=62),
        "an offset past the arena": case(offset=1 << 40),
        "a workspace too large": case(offset=64 + 4 * items + 8),  # 4 bytes per chunk on CPUs
        "an arena result smaller than the arena": case(arena_out=spec((8,), U8)),
        "an integer tensor": case(xs=[array((N,), I32)]),
        "an f16 norm": case(norm=spec((), F16)),
        "a rank-1 norm": case(norm=spec((1,), F32)),
        "a result short": call("jgsess_global_norm", [arena, *xs], [spec((), F32)]),
    }
    return {"jgsess_global_norm": (good, bad)}
