"""The cast_all kernel against its reference: every pair of f32, bf16 and f16."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from jgsess.kernels import cast_all
from tests.kernels.bad_calls import multi_tensor
from tests.kernels.common import SIZES, assert_custom_call, check, kernel_fn

pytestmark = pytest.mark.usefixtures("kernels")

PAIRS = [(a, b) for a, b in itertools.product(cast_all.FLOATS, repeat=2) if a != b]


def operands(seed, sources):
    """Values spread over many binades, with ties for rounding and non-finite ones (numpy's
    samples: jax.random compiles once per shape)."""
    rng = np.random.default_rng(seed)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1 + 2**-8, 65504.0, 1e-8], np.float32)
    out = []
    for shape, dtype in sources:
        x = rng.standard_normal(shape, np.float32) * np.exp(rng.standard_normal(shape) * 4)
        x = x.astype(np.float32).reshape(-1)
        x[: special.size] = special[: x.size]
        with np.errstate(over="ignore"):  # f32 beyond f16's range: inf, as XLA's convert
            out.append(jnp.asarray(x.reshape(shape).astype(dtype)))
    return out


@pytest.mark.parametrize("src, dst", PAIRS)
def test_each_pair_rounds_like_xla(src, dst):
    ops = operands(0, [(s, src) for s in SIZES])
    check(cast_all.SPEC, ops, rtol=0, atol=0, dtypes=(dst,) * len(ops))


def test_many_tensors_of_mixed_pairs_in_one_call():
    sources = [((5 + i * 997,), PAIRS[i % len(PAIRS)][0]) for i in range(24)]
    dtypes = tuple(PAIRS[i % len(PAIRS)][1] for i in range(24))
    check(cast_all.SPEC, operands(1, sources), rtol=0, atol=0, dtypes=dtypes)


def test_cuda_kernel_matches_reference(cuda_device):
    sources = [((70_001 + i,), PAIRS[i % len(PAIRS)][0]) for i in range(300)]
    dtypes = tuple(PAIRS[i % len(PAIRS)][1] for i in range(300))
    check(
        cast_all.SPEC,
        operands(2, sources),
        rtol=0,
        atol=0,
        device=cuda_device,
        dtypes=dtypes,
    )


def test_a_nan_keeps_its_sign_and_payload():
    """A NaN rounded to bf16 / f16 keeps its sign and the top of its payload, quieted, on every
    kernel (the GPU's own conversions would make every NaN 0x7fff)."""
    nans = np.array([0x7FC00001, 0xFFC12345, 0x7F800001, 0xFFFFFFFF, 0x7FA00000], np.uint32)
    x = jnp.asarray(nans.view(np.float32))
    fn = kernel_fn(cast_all.SPEC, dtypes=("bfloat16", "float16"))
    assert_custom_call(cast_all.SPEC, fn, x, x)
    bf16, f16 = (np.asarray(r).view(np.uint16) for r in fn(x, x))
    np.testing.assert_array_equal(bf16, (nans >> 16) | 0x40)
    np.testing.assert_array_equal(f16, ((nans >> 16) & 0x8000) | 0x7E00 | ((nans >> 13) & 0x3FF))


def malformed_calls():
    """Direct calls (tests/kernels/test_operand_checks.py): hyper-parameters, operands and
    results per tensor, the f32 slots, flags."""
    return {"jgsess_cast_all": multi_tensor("jgsess_cast_all", 0, 1, 1, flags=None)}
