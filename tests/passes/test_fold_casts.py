"""fold-casts: kernels read and write bf16/f16 themselves, with unchanged numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jgsess
from tests.helpers import assert_trees_close, count, nodes
from tests.optax_steps import compare, tree, update_step


def bf16(t):
    return jax.tree.map(lambda x: x.astype(jnp.bfloat16), t)


def same_bits_without_the_pass(monkeypatch, fn, *args):
    """The fold changes nothing: results equal those with fold-casts disabled, bit for bit."""
    folded = jgsess.jit(fn)(*args)
    monkeypatch.setenv("JGSESS_DISABLE", "fold-casts")
    unfolded = jgsess.jit(fn)(*args)
    monkeypatch.delenv("JGSESS_DISABLE")
    for a, b in zip(jax.tree.leaves(folded), jax.tree.leaves(unfolded)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_bf16_params_with_f32_momentum_run_in_one_kernel(monkeypatch):
    opt = optax.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.float32)
    params = bf16(tree(0))
    report = compare(opt, params=params, rtol=1e-2, atol=1e-2)
    assert report.fusions["momentum"] == 5
    assert count(report.session.graph, "convert_element_type") == 0
    node = nodes(report.session.graph, "momentum")[0]
    first = [np.dtype(v.dtype).name for v in node.outputs[:2]]
    assert first == ["bfloat16", "float32"]  # p' written as bf16, acc' as f32
    (choice,) = report.kernels
    assert choice.impl == "kernel"
    same_bits_without_the_pass(
        monkeypatch, update_step(opt), params, opt.init(params), tree(1, 0.1)
    )


def test_f32_master_params_with_bf16_gradients_cast_inside_the_kernel(monkeypatch):
    opt = optax.adamw(1e-3)

    def step(params, state, grads16):
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads16)
        return update_step(opt)(params, state, grads)

    params = tree(0)
    state = opt.init(params)
    grads = bf16(tree(1, 0.1))
    fused = jgsess.jit(step)
    report = fused.report(params, state, grads)
    assert report.fusions["adamw"] == 5
    assert count(report.session.graph, "convert_element_type") == 0
    assert_trees_close(fused(params, state, grads), jax.jit(step)(params, state, grads), 2e-6, 1e-7)
    same_bits_without_the_pass(monkeypatch, step, params, state, grads)


def test_a_param_whose_f32_result_is_also_used_does_not_narrow():
    opt = optax.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.float32)

    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        full = jax.tree.map(lambda p, u: p.astype(jnp.float32) + u, params, updates)
        return jax.tree.map(lambda f, p: f.astype(p.dtype), full, params), state, full

    params = bf16(tree(0))
    state = opt.init(params)
    fused = jgsess.jit(step)
    report = fused.report(params, state, tree(1, 0.1))
    assert report.fusions["momentum"] == 5
    assert count(report.session.graph, "convert_element_type") > 0  # p' stays f32: read as f32
    want = jax.jit(step)(params, state, tree(1, 0.1))
    assert_trees_close(fused(params, state, tree(1, 0.1)), want, 1e-2, 1e-2)
