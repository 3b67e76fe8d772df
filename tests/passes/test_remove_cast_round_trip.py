"""remove-cast-round-trip: exact round trips go, rounding ones stay."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jgsess.passes import casts, dce
from jgsess.passes.casts import holds_exactly
from tests.helpers import count, evaluate, graph_of, run_passes


def trip(via):
    return lambda x: x.astype(via).astype(x.dtype) * 3


def cleaned(fn, x):
    graph = graph_of(fn, x)
    run_passes(graph, [casts.PASS, dce.PASS])
    np.testing.assert_array_equal(np.asarray(evaluate(graph, x)[0]), np.asarray(jax.jit(fn)(x)))
    return graph


@pytest.mark.parametrize(
    "dtype, via",
    [
        (jnp.bfloat16, jnp.float32),
        (jnp.float16, jnp.float32),
        (jnp.int8, jnp.float16),
        (jnp.int8, jnp.int32),
        (jnp.bool_, jnp.int32),
    ],
)
def test_exact_round_trip_is_removed(dtype, via):
    x = (jnp.arange(-6, 7) % 5 - 2).astype(dtype)
    if dtype == jnp.bool_:
        fn = lambda x: x.astype(via).astype(jnp.bool_) & x  # noqa: E731
    else:
        fn = trip(via)
    assert count(cleaned(fn, x), "convert_element_type") == 0


@pytest.mark.parametrize(
    "dtype, via",
    [
        (jnp.float32, jnp.float16),
        (jnp.float32, jnp.bfloat16),
        (jnp.int32, jnp.float32),
        (jnp.float32, jnp.int32),
    ],
)
def test_rounding_round_trip_stays(dtype, via):
    x = (
        jnp.array([0.1, 1e-8, 70000.5, -3.7], dtype)
        if dtype == jnp.float32
        else jnp.array([16777217, -5, 3], dtype)
    )
    assert count(cleaned(trip(via), x), "convert_element_type") == 2


def test_holds_exactly_table():
    assert holds_exactly(np.float32, np.float64)
    assert holds_exactly(ml_dtypes.bfloat16, np.float32)
    assert holds_exactly(np.uint8, ml_dtypes.bfloat16)
    assert not holds_exactly(np.float32, ml_dtypes.bfloat16)
    assert not holds_exactly(np.int16, ml_dtypes.bfloat16)
    assert not holds_exactly(np.int64, np.float64)
