"""relu_mask and relu_mask_grad against their references: bits, NaN, -0, odd sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgsess.kernels import relu_mask
from tests.kernels.common import SIZES, check


def values(shape, seed, dtype=jnp.float32):
    x = jax.random.normal(jax.random.PRNGKey(seed), shape)
    special = jnp.array([jnp.nan, -0.0, 0.0, jnp.inf, -jnp.inf, 1e-30, -1e-30])
    x = x.reshape(-1).at[: special.size].set(special[: x.size]).reshape(shape)
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("operands", [1, 2])
def test_forward_matches_reference(operands, dtype):
    for i, shape in enumerate(SIZES + [(0,), (31,), (33,)]):
        xs = [values(shape, i + k, dtype) for k in range(operands)]
        check(relu_mask.FORWARD, xs, rtol=0, atol=0)


@pytest.mark.parametrize("operands", [1, 2])
def test_backward_matches_reference(operands):
    for i, shape in enumerate(SIZES + [(0,), (31,), (33,)]):
        mask = relu_mask.pack(values(shape, i) > 0)
        grads = [values(shape, 10 + i + k) for k in range(operands)]
        check(relu_mask.BACKWARD, [mask, *grads], rtol=0, atol=0)


def test_pack_layout_and_round_trip():
    bits = jnp.arange(70) % 3 == 0
    words = relu_mask.pack(bits)
    assert words.shape == (3,) and words.dtype == jnp.uint32
    assert int(words[0]) == sum(1 << i for i in range(32) if i % 3 == 0)
    np.testing.assert_array_equal(relu_mask.unpack(words, (70,)), bits)


@pytest.mark.gpu
def test_cuda_kernels_match_references():
    gpu = jax.devices("gpu")[0]
    for i, shape in enumerate(SIZES + [(1 << 20, 3)]):
        check(
            relu_mask.FORWARD, [values(shape, i), values(shape, i + 1)], rtol=0, atol=0, device=gpu
        )
        mask = relu_mask.pack(values(shape, i) > 0)
        check(relu_mask.BACKWARD, [mask, values(shape, 20 + i)], rtol=0, atol=0, device=gpu)
