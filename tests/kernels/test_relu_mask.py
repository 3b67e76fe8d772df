"""relu_mask and relu_mask_grad against their references: bits, NaN, -0, odd sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgsess.kernels import relu_mask
from tests.kernels.bad_calls import BF16, F16, F32, I32, U32, N, array, call, spec
from tests.kernels.common import SIZES, check

pytestmark = pytest.mark.usefixtures("kernels")


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


def test_cuda_kernels_match_references(cuda_device):
    for i, shape in enumerate(SIZES + [(1 << 20, 3)]):
        xs = [values(shape, i), values(shape, i + 1)]
        check(relu_mask.FORWARD, xs, rtol=0, atol=0, device=cuda_device)
        mask = relu_mask.pack(values(shape, i) > 0)
        check(relu_mask.BACKWARD, [mask, values(shape, 20 + i)], rtol=0, atol=0, device=cuda_device)


def malformed_calls():
    """Direct calls of jgsess_relu_mask(_grad) (tests/kernels/test_operand_checks.py)."""
    words = N // 32

    def fwd(ins, y=None, mask=None):
        y = spec((N,), BF16) if y is None else y
        mask = spec((words,), U32) if mask is None else mask
        return call("jgsess_relu_mask", ins, [y, mask])

    def bwd(mask, grads, dx=None):
        dx = spec((N,), BF16) if dx is None else dx
        return call("jgsess_relu_mask_grad", [mask, *grads], [dx])

    x = array((N,), BF16)
    m = array((words,), U32)
    forward = (
        {"well formed": fwd([x]), "two operands": fwd([x, x])},
        {
            "no operands": fwd([]),
            "three operands": fwd([x, x, x]),
            "a 1-element result": fwd([x], y=spec((1,), BF16)),
            "an f32 result": fwd([x], y=spec((N,), F32)),
            "a short mask": fwd([x], mask=spec((1,), U32)),
            "an f32 mask": fwd([x], mask=spec((words,), F32)),
            "operands differ in size": fwd([x, array((1,), BF16)]),
            "operands differ in dtype": fwd([x, array((N,), F16)]),
            "an integer operand": fwd([array((N,), I32)], y=spec((N,), I32)),
            "a result short": call("jgsess_relu_mask", [x], [spec((N,), BF16)]),
        },
    )
    backward = (
        {"well formed": bwd(m, [x]), "two gradients": bwd(m, [x, x])},
        {
            "no gradients": bwd(m, []),
            "no operands": call("jgsess_relu_mask_grad", [], [spec((N,), BF16)]),
            "a 1-element dx": bwd(m, [x], dx=spec((1,), BF16)),
            "an f32 dx": bwd(m, [x], dx=spec((N,), F32)),
            "a short mask": bwd(array((1,), U32), [x]),
            "an f32 mask": bwd(array((words,), F32), [x]),
            "gradients differ in size": bwd(m, [x, array((1,), BF16)]),
        },
    )
    return {"jgsess_relu_mask": forward, "jgsess_relu_mask_grad": backward}
