"""remove-cast-round-trip: exact round trips go, rounding ones stay."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jgsess.passes import dce, remove_cast_round_trip
from jgsess.passes.remove_cast_round_trip import holds_exactly
from tests.helpers import count, evaluate, graph_of, run_passes


def trip(via):
    return lambda x: x.astype(via).astype(x.dtype) * 3


def cleaned(fn, x):
    graph = graph_of(fn, x)
    run_passes(graph, [remove_cast_round_trip.PASS, dce.PASS])
    np.testing.assert_array_equal(np.asarray(evaluate(graph, x)[0]), np.asarray(jax.jit(fn)(x)))
    return graph


# values that a rounding round trip changes, for the dtypes that have them; others: small ints
VALUES = {jnp.float32: [0.1, 1e-8, 70000.5, -3.7], jnp.int32: [16777217, -5, 3]}


@pytest.mark.parametrize(
    "dtype, via, converts",
    [
        # exact round trips are removed
        (jnp.bfloat16, jnp.float32, 0),
        (jnp.float16, jnp.float32, 0),
        (jnp.int8, jnp.float16, 0),
        (jnp.int8, jnp.int32, 0),
        (jnp.bool_, jnp.int32, 0),
        # rounding ones stay
        (jnp.float32, jnp.float16, 2),
        (jnp.float32, jnp.bfloat16, 2),
        (jnp.int32, jnp.float32, 2),
        (jnp.float32, jnp.int32, 2),
    ],
)
def test_only_exact_round_trips_are_removed(dtype, via, converts):
    if dtype in VALUES:
        x = jnp.array(VALUES[dtype], dtype)
    else:
        x = (jnp.arange(-6, 7) % 5 - 2).astype(dtype)
    if dtype == jnp.bool_:
        fn = lambda x: x.astype(via).astype(jnp.bool_) & x  # noqa: E731
    else:
        fn = trip(via)
    assert count(cleaned(fn, x), "convert_element_type") == converts


def test_holds_exactly_table():
    assert holds_exactly(np.float32, np.float64)
    assert holds_exactly(ml_dtypes.bfloat16, np.float32)
    assert holds_exactly(np.uint8, ml_dtypes.bfloat16)
    assert not holds_exactly(np.float32, ml_dtypes.bfloat16)
    assert not holds_exactly(np.int16, ml_dtypes.bfloat16)
    assert not holds_exactly(np.int64, np.float64)
