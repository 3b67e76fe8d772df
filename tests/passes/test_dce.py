"""dce: dead nodes go, effects and whole regions stay, forwarded outputs are short-cut."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgsess.passes import dce
from tests.helpers import count, evaluate, graph_of, rand, run_passes


def test_dead_nodes_are_removed_effects_kept():
    def f(x):
        jnp.cos(x)  # dead
        jax.debug.print("kept {}", x[0])
        return jnp.sin(x)

    graph = graph_of(f, rand((3,)))
    assert count(graph, "cos") == 1
    run_passes(graph, [dce.PASS])
    # jax.debug.print binds `debug_print` from jax 0.7.2, `debug_callback` before
    printed = count(graph, "debug_print") + count(graph, "debug_callback")
    assert count(graph, "cos") == 0 and printed == 1


def test_a_live_region_keeps_all_its_nodes():
    graph = graph_of(lambda x: jax.nn.softplus(x), rand((3,)))
    before = len(graph.live())
    run_passes(graph, [dce.PASS])
    assert len(graph.live()) == before


def test_a_dead_region_goes_whole():
    graph = graph_of(lambda x: (jax.nn.softplus(x), x * 2)[1], rand((3,)))
    run_passes(graph, [dce.PASS])
    assert [n.name for n in graph.live()] == ["mul"]


def test_outputs_forwarded_by_a_kept_jit_are_short_cut():
    sharded = jax.jit(lambda a, b: (b, jnp.sin(a)), out_shardings=None)
    x, y = rand((3,)), rand((3,), 1)

    def f(x, y):
        b, s = sharded(x, y)
        return b * 2, s

    graph = graph_of(f, x, y)
    run_passes(graph, [dce.PASS])
    (mul,) = [n for n in graph.live() if n.name == "mul"]
    assert mul.inputs[0] is graph.inputs[1]
    np.testing.assert_array_equal(evaluate(graph, x, y)[0], jax.jit(f)(x, y)[0])


def test_cond_that_forwards_the_same_operand_is_short_cut():
    def f(i, x, y):
        a, b = lax.cond(i > 0, lambda x, y: (x, y * 2), lambda x, y: (x, y + 1), x, y)
        return a * 3, b

    args = (jnp.int32(1), rand((3,)), rand((3,), 1))
    graph = graph_of(f, *args)
    run_passes(graph, [dce.PASS])
    (mul,) = [n for n in graph.live() if n.name == "mul"]
    assert mul.inputs[0] is graph.inputs[1]
    for got, want in zip(evaluate(graph, *args), jax.jit(f)(*args)):
        np.testing.assert_array_equal(got, want)
