"""Weakly typed parameters, gradients and hyper-parameters fuse: parameters made with `jnp.full`
or from Python scalars are weakly typed, and the convert that makes each strong where optax
mixes them with its state goes where the program reads the value (passes/canonicalize.py);
every result keeps the weak type jax.jit gives it (emit)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import jgsess
from tests.helpers import assert_trees_close
from tests.optax_steps import update_step


def weak_tree() -> dict:
    return {"w": jnp.full((13, 7), 0.1), "b": jnp.full((7,), -0.2), "s": jnp.full((1023,), 0.3)}


def scalar_tree() -> dict:  # what a hand-written model's scalars are
    return {"gain": jnp.asarray(1.5), "bias": jnp.asarray(-0.5), "t": 2.0 * jnp.ones(()) + 1}


def mixed_tree() -> dict:
    strong = jax.random.normal(jax.random.PRNGKey(0), (7, 3, 5))
    return {**weak_tree(), "k": strong, "c": jnp.asarray(0.25)}


TREES = {"jnp.full": weak_tree, "Python scalars": scalar_tree, "weak and strong": mixed_tree}
OPTIMIZERS = {
    "adamw": (optax.adamw(1e-3, weight_decay=1e-4), "adamw"),
    "adam, schedule": (optax.adam(optax.cosine_decay_schedule(1e-2, 100)), "adamw"),
    "weak hyper-parameters": (optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3), "adamw"),
    "nesterov": (optax.sgd(0.1, momentum=0.9, nesterov=True), "momentum"),
}


def grads_like(params, seed: int):
    # a weakly typed gradient too where the parameter is (0.5 * p + a Python scalar)
    return jax.tree.map(lambda p: p * 0.5 + 0.01 * (seed + 1), params)


def weak_types(tree) -> list:
    return [x.weak_type for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_weakly_typed_trees_fuse(tree, name):
    opt, kernel = OPTIMIZERS[name]
    params = TREES[tree]()
    assert any(weak_types(params))
    state = opt.init(params)
    step = update_step(opt)
    fused, plain = jgsess.jit(step), jax.jit(step)
    grads = grads_like(params, 0)
    report = fused.report(params, state, grads)
    assert report.fusions[kernel] == len(jax.tree.leaves(params))
    assert (
        f'custom_call_target="jgsess_{kernel}"'
        in fused.lower(params, state, grads).compile().as_text()
    )
    theirs = (params, state)
    for i in range(3):  # each step from jax.jit's last (as tests/optax_steps.py's compare)
        ours, theirs = fused(*theirs, grads_like(params, i)), plain(*theirs, grads_like(params, i))
        assert weak_types(ours) == weak_types(theirs)
        assert_trees_close(ours, theirs, rtol=2e-6, atol=1e-7)


def test_a_near_miss_with_weak_parameters_keeps_xlas_code():
    opt = optax.adamax(1e-3)
    params = weak_tree()
    state = opt.init(params)
    fused = jgsess.jit(update_step(opt))
    report = fused.report(params, state, grads_like(params, 0))
    assert not report.fusions and not report.kernels


def test_each_result_keeps_its_weak_type():
    # a convert that makes a weak value strong is kept where it is a result, and a value the
    # passes rewrote is given the weak type jax.jit gives the result
    def fn(x, y):
        strong = lax.convert_element_type(x, jnp.float32)
        return strong, strong * 2, x * 3.0, (x - (-y)) * 1.0

    args = (jnp.asarray(1.5), jnp.asarray(np.float32(2.0)))
    ours, theirs = jgsess.jit(fn)(*args), jax.jit(fn)(*args)
    assert weak_types(ours) == weak_types(theirs) == [False, False, True, False]
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)
