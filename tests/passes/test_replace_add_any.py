"""replace-add-any: gradient sums become plain adds."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad

from jgsess.passes import dce, replace_add_any
from tests.helpers import count, evaluate, graph_of, rand, run_passes


def grad_with_fanout(x):
    # x is used twice, so its cotangents meet in an add_any
    return jax.grad(lambda x: (jnp.sin(x) * jnp.cos(x)).sum())(x)


def test_add_any_becomes_add():
    x = rand((5,))
    graph = graph_of(grad_with_fanout, x)
    before = count(graph, "add_any")
    assert before >= 1
    run_passes(graph, [replace_add_any.PASS, dce.PASS])
    assert count(graph, "add_any") == 0
    np.testing.assert_array_equal(evaluate(graph, x)[0], jax.jit(grad_with_fanout)(x))


def test_boolean_add_any_is_left_alone():
    # `add` has no boolean form, so the guard declines (the graph is only rewritten, not run)
    a = jnp.array([True, False, False])
    graph = graph_of(lambda a, b: ad.add_jaxvals_p.bind(a, b), a, a)
    run_passes(graph, [replace_add_any.PASS])
    assert count(graph, "add_any") == 1
