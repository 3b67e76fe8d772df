"""The fusion driver (passes/fusions/engine.py): a rewrite's own selection is asked only for a
rewrite the driver would take, and declines it with its reason; further kernels are counted
beside the first; `taken` runs once per applied rewrite."""

import jax.numpy as jnp

from jgsess.ir import ops
from jgsess.passes.fusions.engine import Fusion, Rewrite
from jgsess.passes.manager import Context, run_pipeline
from tests.helpers import graph_of, rand


def negate_sines(answer):
    """A fusion replacing each `sin x` by `neg x`, counted as kernels "fwd" and "bwd", whose
    selection gives `answer`; each root first offers a candidate that is not self-contained
    (it removes the sin without replacing its result). Returns the pass, the selection's
    calls and the `taken` calls."""
    asked, taken = [], []

    def selected(ctx):
        asked.append(ctx)
        return answer

    def find(graph, node, ctx, memo):
        new = ops.make("neg", node.inputs, node.outputs[0].aval)
        yield Rewrite("fwd", [(new, node)], [], [node], would_select=selected)
        replaced = [(node.outputs[0], new.outputs[0])]
        yield Rewrite("fwd", [(new, node)], replaced, [node], ("bwd",), selected, taken.append)

    return Fusion("negate-sines", frozenset({"sin"}), find).as_pass(), asked, taken


def two_sines():
    return graph_of(lambda x: jnp.sin(x) + jnp.sin(2 * x), rand((3,)))


def names(graph):
    return [node.name for node in graph.live()]


def test_a_selected_rewrite_is_applied_and_counts_every_kernel():
    fusion, asked, taken = negate_sines((True, ""))
    graph, ctx = two_sines(), Context(verify=True)
    (record,) = run_pipeline(graph, [fusion], ctx)
    assert record.rewrites == 2 and "sin" not in names(graph) and names(graph).count("neg") == 2
    assert ctx.record.fusions == [("negate-sines", "fwd"), ("negate-sines", "bwd")] * 2
    assert len(asked) == 2 and taken == [ctx, ctx]


def test_a_rewrite_its_selection_refuses_is_declined_with_the_reason():
    fusion, asked, taken = negate_sines((False, "measured slower"))
    graph, ctx = two_sines(), Context(verify=True)
    (record,) = run_pipeline(graph, [fusion], ctx)
    assert record.rewrites == 0 and names(graph).count("sin") == 2
    assert ctx.record.fusions == [] and taken == []
    assert ctx.record.declined == [("negate-sines", "fwd", "measured slower")] * 2
    assert len(asked) == 2
