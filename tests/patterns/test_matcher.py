"""The matcher: commutative operands, shared nodes, named captures, scalars, params."""

import jax.numpy as jnp
from jax import lax

from jgsess.patterns import Lit, Pat, Scalar, Var, match
from tests.helpers import graph_of, rand


def root(graph):
    return graph.outputs[0]


def test_commutative_operands_match_either_order():
    pattern = Pat("add", [Pat("mul", [Scalar("c"), Var("x")]), Var("y")])
    for fn in (lambda x, y: 0.5 * x + y, lambda x, y: y + x * 0.5):
        m = next(match(pattern, root(graph_of(fn, rand((3,)), rand((3,))))))
        assert m["c"].scalar_value() == 0.5 and m["x"].shape == (3,)


def test_ordered_operands_do_not_commute():
    pattern = Pat("sub", [Var("x"), Pat("mul", [Scalar("c"), Var("y")])])
    assert (
        list(match(pattern, root(graph_of(lambda x, y: 2.0 * y - x, rand((3,)), rand((3,)))))) == []
    )


def test_a_name_used_twice_binds_one_value():
    pattern = Pat("mul", [Var("x"), Var("x")])
    assert next(match(pattern, root(graph_of(lambda x: x * x, rand((3,))))), None) is not None
    assert (
        next(match(pattern, root(graph_of(lambda x, y: x * y, rand((3,)), rand((3,))))), None)
        is None
    )


def test_a_shared_pattern_node_matches_one_value():
    inner = Pat("sin", [Var("x")])
    pattern = Pat("add", [inner, Pat("cos", [inner])])
    same = graph_of(lambda x: (s := jnp.sin(x)) + jnp.cos(s), rand((3,)))
    other = graph_of(lambda x: jnp.sin(x) + jnp.cos(jnp.sin(x * 2)), rand((3,)))
    assert next(match(pattern, root(same)), None) is not None
    assert next(match(pattern, root(other)), None) is None


def test_scalar_captures_literals_and_traced_values_but_not_arrays():
    pattern = Pat("mul", [Scalar("s"), Var("x")])
    traced = graph_of(lambda x, s: s * x, rand((3,)), jnp.float32(2))
    assert next(match(pattern, root(traced)))["s"] is traced.inputs[1]
    assert (
        next(match(pattern, root(graph_of(lambda x, y: x * y, rand((3,)), rand((3,))))), None)
        is None
    )


def test_literal_sign_of_zero_matters():
    pattern = Pat("add", [Var("x"), Lit(-0.0)])
    assert next(match(pattern, root(graph_of(lambda x: x + -0.0, rand((3,))))), None) is not None
    assert next(match(pattern, root(graph_of(lambda x: x + 0.0, rand((3,))))), None) is None


def test_params_by_value_and_by_predicate():
    graph = graph_of(lambda x: lax.integer_pow(x, 3), rand((3,)))
    assert next(match(Pat("integer_pow", [Var("x")], params={"y": 3}), root(graph)), None)
    assert next(match(Pat("integer_pow", [Var("x")], params={"y": 2}), root(graph)), None) is None
    odd = Pat("integer_pow", [Var("x")], params={"y": lambda y: y % 2 == 1})
    assert next(match(odd, root(graph)), None) is not None


def test_every_commutative_alternative_is_offered():
    # both operands are muls: the first order binds (x=a, y=b), the second (x=b, y=a)
    pattern = Pat("add", [Pat("mul", [Var("x"), Lit(2.0)]), Pat("mul", [Var("y"), Lit(3.0)])])
    graph = graph_of(lambda a, b: a * 3.0 + b * 2.0, rand((3,)), rand((3,), 1))
    (m,) = list(match(pattern, root(graph)))
    assert m["x"] is graph.inputs[1] and m["y"] is graph.inputs[0]


def test_equal_literals_bind_one_name():
    pattern = Pat("add", [Pat("mul", [Scalar("c"), Var("x")]), Pat("mul", [Scalar("c"), Var("y")])])
    same = graph_of(lambda x, y: 0.5 * x + 0.5 * y, rand((3,)), rand((3,)))
    other = graph_of(lambda x, y: 0.5 * x + 0.25 * y, rand((3,)), rand((3,)))
    assert next(match(pattern, root(same)), None) is not None
    assert next(match(pattern, root(other)), None) is None
