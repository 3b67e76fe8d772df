"""Random compositions of transformations, built once with jax.jit and once with jgsess.jit.

Each transformation below maps a function of a parameter tree to another function of it, so
any sequence of them composes. Hypothesis draws 2 to 4 of them over one of four
functions (a scalar function, a pytree loss, an optax adamw update inside a loss, a BatchNorm
block); the composition is built with `jit` = jax.jit and with `jit` = jgsess.jit, then both are
called on the same parameters: equal results within float tolerance, or the same exception type.
Where a fusion must fire, the jgsess program is checked to run its kernel (a program jgsess left
unchanged is jax.jit's own, and would prove nothing).
"""

from __future__ import annotations

import re
from collections import Counter

import jax
import jax.numpy as jnp
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jgsess
from tests.helpers import assert_trees_close, rand


def _weighted_sum(tree) -> jax.Array:
    """A scalar that depends on every element of `tree` (its leaves' weighted sums)."""
    leaves = jax.tree.leaves(tree)
    return sum(
        jnp.sum(leaf * jnp.linspace(0.5, 1.5, leaf.size).reshape(leaf.shape)) for leaf in leaves
    )


def _scaled(tree, s):
    return jax.tree.map(lambda leaf: leaf * s, tree)


_SCALES = jnp.array([0.5, 1.0, 1.5])


def _to_scalar(f, scalar: bool):
    return f if scalar else lambda p: _weighted_sum(f(p))


# each: (jit, f, whether f returns a scalar) -> (a function of the same parameters, whether it
# returns a scalar). jax's own transformed functions are passed on as jax returns them (not
# wrapped in a lambda), so the next jit gets, say, jax.grad's function itself.
TRANSFORMS = {
    "jit": lambda jit, f, scalar: (jit(f), scalar),
    "checkpoint": lambda jit, f, scalar: (jax.checkpoint(f), scalar),
    "grad": lambda jit, f, scalar: (jax.grad(_to_scalar(f, scalar)), False),
    "hessian": lambda jit, f, scalar: (jax.hessian(_to_scalar(f, scalar)), False),
    "vjp": lambda jit, f, scalar: (
        lambda p: jax.vjp(_to_scalar(f, scalar), p)[1](jnp.ones(()))[0],
        False,
    ),
    "jvp": lambda jit, f, scalar: (
        lambda p: jax.jvp(_to_scalar(f, scalar), (p,), (_scaled(p, 0.25),))[1],
        True,
    ),
    "vmap": lambda jit, f, scalar: (
        lambda p: jnp.sum(jax.vmap(lambda s: _to_scalar(f, scalar)(_scaled(p, s)))(_SCALES)),
        True,
    ),
    "scan": lambda jit, f, scalar: (
        lambda p: jax.lax.scan(
            lambda c, s: (c + _to_scalar(f, scalar)(_scaled(p, s)), None), jnp.zeros(()), _SCALES
        )[0],
        True,
    ),
    "cond": lambda jit, f, scalar: (
        lambda p: jax.lax.cond(
            _weighted_sum(p) > 0, _to_scalar(f, scalar), lambda q: -_to_scalar(f, scalar)(q), p
        ),
        True,
    ),
}


def _scalar(p):
    return jnp.sum(jnp.sin(p["x"]) * p["x"] ** 2)


def _mlp_loss(p):
    h = jnp.tanh(_INPUTS @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] - 1.0) ** 2)


def _loss_after_adamw(p):
    """The loss after an AdamW step, and its new moments (read: fuse-adamw fires)."""
    tx = optax.adamw(1e-2, weight_decay=1e-2)
    updates, state = tx.update(jax.grad(_mlp_loss)(p), tx.init(p), p)
    moments = _weighted_sum((state[0].mu, state[0].nu))
    return _mlp_loss(optax.apply_updates(p, updates)) + 1e-2 * moments


def _batch_norm_block(p):
    """A training-mode BatchNorm, scale and bias, then a ReLU, in jnp (its fusion's textbook
    form)."""
    y = _IMAGES * p["scale"] + p["shift"]
    mean, var = jnp.mean(y, axis=(0, 1, 2)), jnp.var(y, axis=(0, 1, 2))
    z = (y - mean) / jnp.sqrt(var + 1e-5) * p["gamma"] + p["beta"]
    return jnp.mean(jax.nn.relu(z) ** 2)


_INPUTS = rand((5, 4), 7)
_IMAGES = rand((2, 3, 3, 4), 8)
FUNCTIONS = {
    "scalar": (_scalar, {"x": rand((3,), 1)}),
    "pytree-loss": (_mlp_loss, {"w1": rand((4, 3), 2), "b1": rand((3,), 3), "w2": rand((3,), 4)}),
    "optax-inside": (
        _loss_after_adamw,
        {"w1": rand((4, 3), 2), "b1": rand((3,), 3), "w2": rand((3,), 4)},
    ),
    "batch-norm": (
        _batch_norm_block,
        {
            "scale": rand((4,), 5) + 2.0,
            "shift": rand((4,), 6),
            "gamma": rand((4,), 9) + 1.0,
            "beta": rand((4,), 10),
        },
    ),
}


def _build(jit, names: list[str], f):
    scalar = True
    for name in names:
        f, scalar = TRANSFORMS[name](jit, f, scalar)
    return jit(f)  # the outermost call is always compiled


def _kernels(f, params) -> Counter:
    """The jgsess kernels `f`'s program calls (its lowered custom calls), counted."""
    text = f.lower(params).as_text()
    return Counter(t for t in re.findall(r"custom_call @(jgsess_\w+)\(", text) if t != _HINT)


_HINT = "jgsess_async_hint"  # a no-op beside CPU kernel calls (kernels/spec.py)
_KEEP_THE_FORWARD = {"cond", "scan"}  # f's forward, as written, in a sub-program


def _fires(function: str, names: list[str]) -> bool:
    """Whether a fusion certainly fires in the composition: f has one (an AdamW update whose
    state is read, a BatchNorm), and a jgsess.jit (the outermost, at the latest) traces its
    forward as written (inside cond and scan bodies, sub-programs the passes optimize)."""
    if function not in ("optax-inside", "batch-norm"):
        return False
    for name in [*names, "jit"]:
        if name == "jit":
            return True
        if name not in _KEEP_THE_FORWARD:
            return False
    return False


def _outcome(f, params):
    try:
        return jax.block_until_ready(f(params)), None
    except Exception as err:  # noqa: BLE001 - compared by type below
        return None, type(err)


def _compositions():
    """2 to 4 transformations: 1 to 3 others, each with or without a jit around it, and f
    itself with or without one (so jit(transform(jit(f))) and its kin come up often)."""
    others = sorted(set(TRANSFORMS) - {"jit"})
    layer = st.tuples(st.sampled_from(others), st.booleans()).map(
        lambda t: [t[0], "jit"] if t[1] else [t[0]]
    )
    return (
        st.tuples(st.booleans(), st.lists(layer, min_size=1, max_size=3))
        .map(lambda t: (["jit"] if t[0] else []) + [n for names in t[1] for n in names])
        .filter(lambda names: 2 <= len(names) <= 4)
        .filter(lambda names: sum(_ORDER.get(n, 0) for n in names) <= 3)
    )


# derivatives' orders: up to the third. jax.jit of a fourth (hessian of hessian) of the
# BatchNorm block crashes jax 0.10.2 itself (a segmentation fault in XLA's CPU code, no jgsess
# imported) on an AMD EPYC machine
_ORDER = {"grad": 1, "vjp": 1, "hessian": 2}


@settings(max_examples=40, deadline=None, derandomize=True)
@given(function=st.sampled_from(sorted(FUNCTIONS)), names=_compositions())
def test_compositions_equal_jax_jits(function, names):
    f, params = FUNCTIONS[function]
    expected, expected_error = _outcome(_build(jax.jit, names, f), params)
    fused = _build(jgsess.jit, names, f)
    actual, actual_error = _outcome(fused, params)
    assert actual_error is expected_error, (names, actual_error, expected_error)
    if expected_error is None:
        assert_trees_close(actual, expected, rtol=2e-5, atol=1e-5)
        if _fires(function, names):  # the positive control: jgsess changed the program
            assert _kernels(fused, params), names


# compositions whose programs run kernels, and how many calls of each (a fusion in f's
# forward as written; BatchNorm's in its backward too; cond's two branches each call f)
BOTH = {"jgsess_batch_norm_relu": 1, "jgsess_batch_norm_relu_grad": 1}
FIRES = {
    ("optax-inside", ("jit",)): {"jgsess_adamw": 1},
    ("optax-inside", ("cond",)): {"jgsess_adamw": 2},
    ("optax-inside", ("scan", "jit")): {"jgsess_adamw": 1},
    ("optax-inside", ("jit", "grad")): {"jgsess_adamw": 1},
    ("batch-norm", ("jit",)): {"jgsess_batch_norm_relu": 1},
    ("batch-norm", ("scan",)): {"jgsess_batch_norm_relu": 1},
    ("batch-norm", ("cond", "jit")): {"jgsess_batch_norm_relu": 2},
    ("batch-norm", ("grad",)): BOTH,
    ("batch-norm", ("vjp", "jit")): BOTH,
}


@pytest.mark.parametrize("function, names", sorted(FIRES))
def test_kernels_run_inside_compositions(function, names):
    f, params = FUNCTIONS[function]
    fused = _build(jgsess.jit, list(names), f)
    assert _kernels(fused, params) == Counter(FIRES[function, names])
    expected = _build(jax.jit, list(names), f)(params)
    assert_trees_close(fused(params), expected, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("function", sorted(FUNCTIONS))
def test_jit_of_grad_of_jit(function):
    """jit(grad(jit(f))), the form that returned f's value, for each function on every run
    (tests/test_jit_parity.py has the hessian and the other forms)."""
    f, params = FUNCTIONS[function]
    names = ["jit", "grad"]
    expected = _build(jax.jit, names, f)(params)
    assert_trees_close(_build(jgsess.jit, names, f)(params), expected, rtol=2e-5, atol=1e-5)
    assert_trees_close(expected, jax.grad(f)(params), rtol=2e-5, atol=1e-5)
