"""Building graphs from jaxprs and emitting them back: a round trip changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jgsess.emit import emit, to_closed_jaxpr
from jgsess.ir import Region, from_jaxpr, verify
from tests.helpers import assert_trees_close, count, graph_of, jaxpr_structure, rand


def _round_trip(fn, *args):
    graph = graph_of(fn, *args)
    verify(graph)
    for g in graph.walk():
        g.changed = True  # force re-tracing every sub-graph
    return graph, jax.jit(lambda *a: emit(graph, a))(*args)


def _clip_grad():
    @jax.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1, 1),))
    return clip_grad


def _control_flow(x):
    y = lax.cond(x.sum() > 0, lambda a: a * 2, lambda a: a - 1, x)
    c, ys = lax.scan(lambda c, v: (c + v, c * v), y[0], y)
    i, z = lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * 1.5), (0, c))
    return ys, i, z


@pytest.mark.parametrize(
    "fn, args",
    [
        (_control_flow, (rand((6,)),)),
        (lambda x, y: (x + np.arange(4, dtype=np.float32), y, 2.0), (rand((4,)), rand((2,)))),
        (lambda x: jax.nn.relu(x) * 3, (rand((4,)),)),
        (lambda x: _clip_grad()(jnp.sin(x)) * 5, (rand((3,)),)),
    ],
    ids=["control-flow", "consts-literals-forwarding", "custom-jvp-region", "custom-vjp"],
)
def test_round_trip_is_structurally_equal(fn, args):
    closed = jax.make_jaxpr(fn)(*args)
    graph = from_jaxpr(closed)
    for g in graph.walk():
        g.changed = True  # force re-tracing every sub-graph
    assert jaxpr_structure(to_closed_jaxpr(graph)) == jaxpr_structure(closed)


def test_structure_tells_programs_apart():
    base = jaxpr_structure(jax.make_jaxpr(lambda x: x * 2 + 1)(rand((3,))))
    assert base == jaxpr_structure(jax.make_jaxpr(lambda y: y * 2 + 1)(rand((3,), 1)))
    assert base != jaxpr_structure(jax.make_jaxpr(lambda x: x * 2 - 1)(rand((3,))))
    assert base != jaxpr_structure(jax.make_jaxpr(lambda x: x * 3 + 1)(rand((3,))))
    assert base != jaxpr_structure(jax.make_jaxpr(lambda x: x * 2 + 1)(rand((4,))))


def test_unchanged_graph_gives_back_its_source():
    closed = jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(jnp.ones(3))
    assert to_closed_jaxpr(from_jaxpr(closed)) is closed


def test_relu_body_is_inlined_as_a_region():
    graph = graph_of(jax.nn.relu, rand((5,)))
    (node,) = graph.live()
    assert node.name == "max" and isinstance(node.region, Region)
    assert node.inputs[1].scalar_value() == 0.0


def test_region_keeps_custom_derivative():
    # relu's custom JVP gives 0 at 0; max(x, 0) differentiated alone would give 0.5
    graph = graph_of(jax.nn.relu, jnp.zeros(3))
    grad = jax.grad(lambda x: emit(graph, [x])[0].sum())(jnp.zeros(3))
    np.testing.assert_array_equal(grad, jax.grad(lambda x: jax.nn.relu(x).sum())(jnp.zeros(3)))


def test_broken_region_emits_its_nodes():
    graph = graph_of(jax.nn.relu, rand((4,)))
    graph.regions[0].break_()
    out = jax.jit(lambda x: emit(graph, [x]))(rand((4,)))
    assert_trees_close(out, [jax.nn.relu(rand((4,)))])


def test_nested_jit_is_inlined_unless_it_carries_shardings():
    @jax.jit
    def inner(x):
        return x * 3

    graph = graph_of(lambda x: inner(x) + 1, rand((3,)))
    assert count(graph, "jit") == 0 and count(graph, "mul") == 1


def test_control_flow_bodies_become_subgraphs():
    x = rand((6,))
    graph, out = _round_trip(_control_flow, x)
    assert [n.name for n in graph.live() if n.subgraphs] == ["cond", "scan", "while"]
    assert_trees_close(out, jax.tree.leaves(jax.jit(_control_flow)(x)))


def test_effects_keep_their_order(capfd):
    def f(x):
        jax.debug.print("first {}", x[0])
        y = x * 2
        jax.debug.print("second {}", y[0])
        return y

    graph, out = _round_trip(f, jnp.arange(3.0))
    jax.effects_barrier()
    printed = capfd.readouterr().out.split("\n")
    assert [line.split()[0] for line in printed if line] == ["first", "second"]
    assert_trees_close(out, [jnp.arange(3.0) * 2])


def test_literals_consts_and_forwarded_inputs():
    table = np.arange(4, dtype=np.float32)

    def f(x, y):
        return x + table, y, 2.0

    x, y = rand((4,)), rand((2,), 1)
    graph, out = _round_trip(f, x, y)
    assert graph.outputs[1] is graph.inputs[1]
    assert_trees_close(out, list(jax.jit(f)(x, y)))


def test_custom_vjp_round_trip_keeps_its_backward():
    clip_grad = _clip_grad()
    graph = graph_of(lambda x: clip_grad(x) * 5, rand((3,)))
    grad = jax.grad(lambda x: emit(graph, [x])[0].sum())(rand((3,)))
    np.testing.assert_array_equal(grad, jnp.ones(3))
