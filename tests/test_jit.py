"""jgsess.jit as a drop-in for jax.jit: arguments, caching, transformations, lower, report."""

import jax
import jax.numpy as jnp
import optax
import pytest

import jgsess
from jgsess.passes import pipeline
from jgsess.passes.manager import Pass
from tests.helpers import assert_trees_close, rand
from tests.optax_steps import tree, update_step


def f(x, y, *, scale=2.0):
    return {"sum": x + y * scale, "parts": (jnp.sin(x), y.sum())}


def test_pytrees_and_keyword_arguments():
    x, y = rand((3, 4)), rand((3, 4), 1)
    assert_trees_close(jgsess.jit(f)(x, y, scale=3.0), jax.jit(f)(x, y, scale=3.0))


def test_static_argnums_and_argnames():
    def g(x, n, mode="sin"):
        fn = jnp.sin if mode == "sin" else jnp.cos
        return fn(x) * n

    x = rand((5,))
    a = jgsess.jit(g, static_argnums=1, static_argnames="mode")
    assert_trees_close(
        a(x, 3, mode="cos"), jax.jit(g, static_argnums=1, static_argnames="mode")(x, 3, mode="cos")
    )
    assert_trees_close(a(x, 4, mode="sin"), jnp.sin(x) * 4)


def test_one_trace_per_input_signature():
    traces = []

    def g(x):
        traces.append(x.shape)
        return x * 2

    h = jgsess.jit(g)
    h(jnp.ones(3))
    h(jnp.ones(3) * 5)
    h(jnp.ones(4))
    assert traces == [(3,), (4,)]


def test_donated_arguments_are_consumed():
    opt = optax.adamw(1e-3)
    params = tree(0)
    state = opt.init(params)
    step = jgsess.jit(update_step(opt), donate_argnums=(0, 1))
    new_params, _ = step(params, state, tree(1))
    assert all(p.is_deleted() for p in jax.tree.leaves(params))
    assert not any(p.is_deleted() for p in jax.tree.leaves(new_params))


def test_under_grad_vmap_and_jit():
    def loss(w, x):
        return jnp.sum(jax.nn.relu(x @ w) ** 2)

    w, x = rand((4, 3)), rand((5, 4), 1)
    fused = jgsess.jit(loss)
    assert_trees_close(jax.grad(fused)(w, x), jax.grad(loss)(w, x), rtol=1e-5)
    xs = jnp.stack([x, x * 2])
    assert_trees_close(
        jax.vmap(fused, in_axes=(None, 0))(w, xs),
        jax.vmap(loss, in_axes=(None, 0))(w, xs),
        rtol=1e-5,
    )
    assert_trees_close(jax.jit(fused)(w, x), loss(w, x), rtol=1e-5)


def test_fused_optimizer_under_grad_and_vmap():
    opt = optax.adamw(1e-3)
    step = update_step(opt)
    params = {"w": rand((3, 2))}
    state = opt.init(params)
    grads = {"w": rand((3, 2), 1)}

    def loss(step_fn, g):
        new, _ = step_fn(params, state, {"w": g})
        return (new["w"] ** 2).sum()

    got = jax.grad(lambda g: loss(jgsess.jit(step), g))(grads["w"])
    want = jax.grad(lambda g: loss(step, g))(grads["w"])
    assert_trees_close(got, want, rtol=1e-4, atol=1e-6)
    gs = jnp.stack([grads["w"], -grads["w"]])
    got = jax.vmap(lambda g: jgsess.jit(step)(params, state, {"w": g})[0])(gs)
    want = jax.vmap(lambda g: step(params, state, {"w": g})[0])(gs)
    assert_trees_close(got, want, rtol=1e-6)


def test_lower_shows_the_custom_call():
    opt = optax.adamw(1e-3)
    params = tree(0)
    lowered = jgsess.jit(update_step(opt)).lower(params, opt.init(params), tree(1))
    assert "jgsess_adamw" in lowered.as_text()
    assert lowered.compile() is not None


def test_report_is_a_readable_table():
    opt = optax.adamw(1e-3)
    params = tree(0)
    report = jgsess.jit(update_step(opt)).report(params, opt.init(params), tree(1))
    text = str(report)
    assert "pass" in text and "fuse-adamw" in text and "canonicalize" in text
    assert report.fusions == {"adamw": len(params)}
    assert {k.impl for k in report.kernels} == {"kernel"}
    assert "donate" in text  # nothing was donated: the report says donation would help


def test_kernels_off_keeps_the_fusion_as_xla_code(monkeypatch):
    monkeypatch.setenv("JGSESS_KERNELS", "off")
    opt = optax.adamw(1e-3)
    params = tree(0)
    fused = jgsess.jit(update_step(opt))
    assert "jgsess_adamw" not in fused.lower(params, opt.init(params), tree(1)).as_text()
    assert {k.impl for k in fused.report(params, opt.init(params), tree(1)).kernels} == {"xla"}


def _broken_pipeline():
    def boom(graph, ctx):
        raise RuntimeError("boom")

    return [Pass("boom", boom)]


def test_pipeline_failure_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setenv("JGSESS_STRICT", "0")
    monkeypatch.setattr(pipeline, "default_pipeline", _broken_pipeline)
    monkeypatch.setattr("jgsess.session.default_pipeline", _broken_pipeline)
    g = jgsess.jit(lambda x: jnp.sin(x) + 1)
    with pytest.warns(jgsess.JgsessFallbackWarning, match="boom"):
        out = g(jnp.ones(3))
    assert_trees_close(out, jnp.sin(jnp.ones(3)) + 1)
    assert "FELL BACK" in str(g.report(jnp.ones(3)))


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setattr("jgsess.session.default_pipeline", _broken_pipeline)
    with pytest.raises(RuntimeError, match="boom"):
        jgsess.jit(lambda x: x + 1)(jnp.ones(2))


def test_decorator_form():
    @jgsess.jit(static_argnums=1)
    def h(x, k):
        return x * k

    assert_trees_close(h(jnp.ones(2), 3), jnp.ones(2) * 3)
    assert h.__name__ == "h"
