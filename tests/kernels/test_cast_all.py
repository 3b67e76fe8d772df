"""The cast_all kernel against its reference: every pair of f32, bf16 and f16."""

import itertools

import jax
import jax.numpy as jnp
import pytest

from jgsess.kernels import cast_all
from tests.kernels.bad_calls import multi_tensor
from tests.kernels.common import SIZES, check

PAIRS = [(a, b) for a, b in itertools.product(cast_all.FLOATS, repeat=2) if a != b]


def operands(seed, sources):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(sources))
    # values spread over many binades, with ties for rounding and non-finite ones
    special = jnp.array([jnp.nan, jnp.inf, -jnp.inf, 0.0, -0.0, 1 + 2**-8, 65504.0, 1e-8])
    out = []
    for k, (shape, dtype) in zip(keys, sources):
        x = jax.random.normal(k, shape) * jnp.exp(jax.random.normal(k, shape) * 4)
        x = x.reshape(-1).at[: special.size].set(special[: x.size]).reshape(shape)
        out.append(x.astype(dtype))
    return out


@pytest.mark.parametrize("src, dst", PAIRS)
def test_each_pair_rounds_like_xla(src, dst):
    ops = operands(0, [(s, src) for s in SIZES])
    check(cast_all.SPEC, ops, rtol=0, atol=0, dtypes=(dst,) * len(ops))


def test_many_tensors_of_mixed_pairs_in_one_call():
    sources = [((5 + i * 997,), PAIRS[i % len(PAIRS)][0]) for i in range(24)]
    dtypes = tuple(PAIRS[i % len(PAIRS)][1] for i in range(24))
    check(cast_all.SPEC, operands(1, sources), rtol=0, atol=0, dtypes=dtypes)


@pytest.mark.gpu
def test_cuda_kernel_matches_reference():
    sources = [((70_001 + i,), PAIRS[i % len(PAIRS)][0]) for i in range(300)]
    dtypes = tuple(PAIRS[i % len(PAIRS)][1] for i in range(300))
    check(
        cast_all.SPEC,
        operands(2, sources),
        rtol=0,
        atol=0,
        device=jax.devices("gpu")[0],
        dtypes=dtypes,
    )


def malformed_calls():
    """Direct calls (tests/kernels/test_operand_checks.py): hyper-parameters, operands and
    results per tensor, the f32 slots, flags."""
    return {"jgsess_cast_all": multi_tensor("jgsess_cast_all", 0, 1, 1, flags=None)}
