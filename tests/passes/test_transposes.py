"""remove-transpose-pair, dedup-transpose and dedup-convert."""

import jax
import jax.numpy as jnp
import numpy as np

from jgsess.passes import dce, dedup, transposes
from tests.helpers import count, evaluate, graph_of, rand, run_passes


def cleaned(fn, *args):
    graph = graph_of(fn, *args)
    run_passes(graph, [transposes.PAIR_PASS, dedup.TRANSPOSE_PASS, dce.PASS])
    for got, want in zip(evaluate(graph, *args), jax.tree.leaves(jax.jit(fn)(*args))):
        np.testing.assert_array_equal(got, want)
    return graph


def test_pair_that_cancels_is_removed():
    x = rand((2, 3, 4))
    graph = cleaned(lambda x: jnp.transpose(jnp.transpose(x, (0, 2, 1)), (0, 2, 1)) + 1, x)
    assert count(graph, "transpose") == 0


def test_pair_that_does_not_cancel_stays():
    x = rand((2, 3, 4))
    graph = cleaned(lambda x: jnp.transpose(jnp.transpose(x, (1, 2, 0)), (1, 2, 0)) + 1, x)
    assert count(graph, "transpose") == 2


def test_cancelling_pair_with_another_user_keeps_the_inner():
    x = rand((3, 4))
    graph = cleaned(lambda x: (x.T.T + 1, x.T * 2), x)
    assert count(graph, "transpose") == 1


def test_duplicate_transposes_share_one():
    x = rand((3, 4, 5))
    graph = cleaned(lambda x: jnp.transpose(x, (2, 0, 1)) + jnp.transpose(x, (2, 0, 1)) * 2, x)
    assert count(graph, "transpose") == 1


def test_different_permutations_are_not_shared():
    x = rand((3, 3))
    graph = cleaned(lambda x: jnp.transpose(x, (1, 0)) + jnp.transpose(x, (0, 1)), x)
    assert count(graph, "transpose") >= 1 and count(graph, "add") == 1


def test_duplicate_converts_share_one_and_a_near_miss_stays():
    x = rand((3, 4)).astype(jnp.bfloat16)

    def twice(x):
        return x.astype(jnp.float32) * 2 + x.astype(jnp.float32), x.astype(jnp.float16)

    graph = graph_of(twice, x)
    run_passes(graph, [dedup.CONVERT_PASS, dce.PASS])
    assert count(graph, "convert_element_type") == 2  # one to f32, and the f16 one
    for got, want in zip(evaluate(graph, x), jax.jit(twice)(x)):
        np.testing.assert_array_equal(got, want)
