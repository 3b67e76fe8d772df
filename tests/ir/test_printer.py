"""The printer is stable and readable; the verifier catches broken graphs."""

import jax.numpy as jnp
import pytest
from jax import lax

from jgsess.ir import GraphError, graph_dot, graph_text, order_csv, verify
from tests.helpers import graph_of, rand


def f(x, y):
    return jnp.sin(x) * y + 1.0


def test_text_is_stable_and_names_values_in_order():
    text = graph_text(graph_of(f, rand((3,)), rand((3,))))
    assert text == graph_text(graph_of(f, rand((3,)), rand((3,))))
    assert text.splitlines()[0] == "graph(a:f32[3], b:f32[3]) {"
    assert "c:f32[3] = sin[accuracy=None] a" in text
    assert text.endswith("} -> (e)")


def test_subgraphs_are_printed_nested():
    text = graph_text(graph_of(lambda x: lax.cond(x[0] > 0, jnp.sin, jnp.cos, x), rand((2,))))
    assert "branches[0]:" in text and "branches[1]:" in text


def test_dot_and_csv():
    graph = graph_of(f, rand((3,)), rand((3,)))
    dot = graph_dot(graph)
    assert dot.startswith("digraph jgsess {") and dot.count("->") == 5
    rows = order_csv(graph).splitlines()
    assert rows[0] == "position,outputs,op,inputs" and len(rows) == 4
    assert rows[1].startswith("0,c:f32[3],sin,a")


def test_verify_catches_a_use_before_definition():
    graph = graph_of(f, rand((3,)), rand((3,)))
    graph.nodes.reverse()
    with pytest.raises(GraphError):
        verify(graph)


def test_verify_catches_stale_users():
    graph = graph_of(f, rand((3,)), rand((3,)))
    graph.inputs[0].users.clear()
    with pytest.raises(GraphError, match="users"):
        verify(graph)


def test_verify_catches_a_changed_interface():
    graph = graph_of(f, rand((3,)), rand((3,)))
    interface = ((graph.inputs[0].aval,), ())
    with pytest.raises(GraphError, match="avals"):
        verify(graph, interface)
