"""Pattern by example: a traced reference function matches the programs it describes."""

import numpy as np
import pytest

from jgsess.passes.fusions.by_example import from_function
from jgsess.patterns import match
from tests.helpers import graph_of, rand


def momentum(p, g, acc, lr, mu):
    acc2 = mu * acc + g
    return p - lr * acc2, acc2


def test_inputs_outputs_and_captures():
    pattern = from_function(momentum, scalars=("lr", "mu"))
    assert pattern.inputs == ("p", "g", "acc", "lr", "mu")
    assert len(pattern.outputs) == 2 and pattern.outputs[0] is pattern.root

    def user(p, g, acc):  # optax's spelling: g + mu * acc, then p + (-lr) * acc
        acc2 = g + 0.9 * acc
        return p + (-0.1) * acc2

    graph = graph_of(user, rand((5,)), rand((5,), 1), rand((5,), 2))
    from jgsess.passes import canonicalize

    canonicalize.run(graph, None)
    graph.settle()
    m = next(match(pattern.root, graph.outputs[0]))
    assert m["mu"].scalar_value() == pytest.approx(0.9)
    assert m["lr"].scalar_value() == pytest.approx(0.1)
    assert m["p"] is graph.inputs[0] and m["acc"] is graph.inputs[2]


def test_outputs_must_lie_on_the_way_to_the_first():
    def two_roots(x, y):
        return x * 2, y * 3

    with pytest.raises(ValueError, match="not computed on the way"):
        from_function(two_roots)


def test_array_constants_are_refused():
    with pytest.raises(ValueError, match="scalar constants"):
        from_function(lambda x: x + np.arange(7, dtype=np.float32))
