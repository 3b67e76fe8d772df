"""fuse-cast-all: the parameter casts of a mixed-precision step become one call."""

import jax
import jax.numpy as jnp
import numpy as np

import jgsess
from jgsess.passes import dce
from jgsess.passes.fusions import fuse_cast_all
from tests.helpers import assert_trees_close, count, evaluate, graph_of, rand, run_passes


def forward16(params, x):
    h = x.astype(jnp.bfloat16)
    for w in params:  # f32 master weights, bf16 compute
        h = jnp.tanh(h @ w.astype(jnp.bfloat16))
    return h.astype(jnp.float32).sum()


PARAMS = [rand((8, 8), i) for i in range(4)]
X = rand((3, 8), 9)


def test_parameter_casts_become_one_node():
    graph = graph_of(forward16, PARAMS, X)
    run_passes(graph, [fuse_cast_all.PASS, dce.PASS])
    assert count(graph, "cast_all") == 1
    (node,) = [n for n in graph.live() if n.name == "cast_all"]
    assert len(node.inputs) == 5  # four weights and the input batch
    np.testing.assert_array_equal(evaluate(graph, *PARAMS, X)[0], jax.jit(forward16)(PARAMS, X))


def test_a_single_cast_or_casts_of_intermediates_stay():
    one = graph_of(
        lambda w, x: (x @ w.astype(jnp.bfloat16)).sum(), PARAMS[0], X.astype(jnp.bfloat16)
    )
    run_passes(one, [fuse_cast_all.PASS])
    assert count(one, "cast_all") == 0
    inner = graph_of(
        lambda a, b: ((a * 2).astype(jnp.bfloat16), (b * 2).astype(jnp.bfloat16)), X, X
    )
    run_passes(inner, [fuse_cast_all.PASS])
    assert count(inner, "cast_all") == 0


def test_casts_read_only_by_elementwise_operations_stay():
    # bf16 parameters updated in f32 (optax with f32 state): XLA fuses each cast into the update
    def update(params, grads):
        return [
            (p.astype(jnp.float32) - 0.1 * g).astype(jnp.bfloat16) for p, g in zip(params, grads)
        ]

    params = [p.astype(jnp.bfloat16) for p in PARAMS]
    graph = graph_of(update, params, PARAMS)
    run_passes(graph, [fuse_cast_all.PASS])
    assert count(graph, "cast_all") == 0


def test_gradient_of_a_mixed_precision_step_matches():
    grads = jax.grad(forward16)
    fused = jgsess.jit(grads)
    assert fused.report(PARAMS, X).fusions["cast_all"] == 1
    assert_trees_close(fused(PARAMS, X), jax.jit(grads)(PARAMS, X), rtol=1e-2, atol=1e-3)


def test_on_the_cpu_the_casts_stay_with_xla():
    # measured: on the CPU XLA's converts are as fast as one cast_all call (see the spec)
    with jax.default_device(jax.devices("cpu")[0]):
        report = jgsess.jit(forward16).report(PARAMS, X)
    (choice,) = report.kernels
    assert choice.kernel == "cast_all" and choice.impl == "xla" and "CPU" in choice.reason
