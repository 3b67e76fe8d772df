"""jgsess.optim: optax's numbers and state, fused; MindSpore's forms; clear errors."""

import inspect

import jax
import jax.numpy as jnp
import optax
import pytest

import jgsess
from tests.helpers import assert_trees_close
from tests.optax_steps import assert_within_ulp, tree, update_step

PAIRS = [
    (jgsess.optim.adamw(1e-3, weight_decay=1e-2), optax.adamw(1e-3, weight_decay=1e-2)),
    (
        jgsess.optim.adamw(
            optax.linear_schedule(1e-3, 1e-4, 10),
            b1=0.8,
            eps_root=1e-10,
            mask=lambda p: {k: k[0] == "w" for k in p},
        ),
        optax.adamw(
            optax.linear_schedule(1e-3, 1e-4, 10),
            b1=0.8,
            eps_root=1e-10,
            mask=lambda p: {k: k[0] == "w" for k in p},
        ),
    ),
    (jgsess.optim.adam(3e-4), optax.adam(3e-4)),
    (jgsess.optim.sgd(0.1), optax.sgd(0.1)),
    (jgsess.optim.sgd(0.1, momentum=0.9), optax.sgd(0.1, momentum=0.9)),
    (
        jgsess.optim.sgd(0.1, momentum=0.9, nesterov=True),
        optax.sgd(0.1, momentum=0.9, nesterov=True),
    ),
]
IDS = ["adamw", "adamw-schedule-mask", "adam", "sgd", "momentum", "nesterov"]


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_same_state_and_numbers_as_optax(pair):
    fused, plain = pair
    params = tree(0)
    s1, s2 = fused.init(params), plain.init(params)
    assert jax.tree.structure(s1) == jax.tree.structure(s2)
    p1 = p2 = params
    update = jax.jit(fused.update)
    for i in range(3):
        grads = tree(10 + i, 0.1)
        u1, s1 = update(grads, s1, p1)
        u2, s2 = plain.update(grads, s2, p2)
        assert_trees_close((u1, s1), (u2, s2), rtol=2e-6, atol=1e-8)
        p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_fused_step_updates_in_place(pair):
    fused, plain = pair
    params, grads = tree(0), tree(1, 0.1)
    state = fused.init(params)
    step = jgsess.optim.fused_step(fused)
    updates, want_state = plain.update(grads, plain.init(params), params)
    want_params = optax.apply_updates(params, updates)
    assert step.report(params, grads, state).donation_hint() is None  # nothing left to donate
    new_params, new_state = step(params, grads, state)
    assert all(p.is_deleted() for p in jax.tree.leaves(params))
    assert_trees_close((new_params, new_state), (want_params, want_state), rtol=2e-6, atol=1e-8)


def test_fused_step_runs_one_kernel_with_everything_aliased():
    tx = jgsess.optim.adamw(1e-3)
    params, grads = tree(0), tree(1, 0.1)
    state = tx.init(params)
    step = jgsess.optim.fused_step(tx)
    report = step.report(params, grads, state)
    assert report.fusions["adamw"] == 5 and len(report.kernels) == 1
    text = step.lower(params, grads, state).as_text()
    assert text.count("#stablehlo.output_operand_alias") == 15  # p, m, v of 5 tensors


def mindspore_adam_weight_decay(params, grads, m, v, lr=1e-3, b1=0.9, b2=0.999, eps=1e-6, wd=1e-2):
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
    p = jax.tree.map(lambda p, m, v: p - lr * (m / (eps + jnp.sqrt(v)) + wd * p), params, m, v)
    return p, m, v


def test_mindspore_adam_weight_decay():
    tx = jgsess.optim.adam_weight_decay(1e-3, eps=1e-6, weight_decay=1e-2)
    params, grads = tree(0), tree(1, 0.1)
    state = tx.init(params)
    assert jgsess.jit(tx.update.__wrapped__).report(grads, state, params).fusions["adamw"] == 5
    p, state = jgsess.optim.fused_step(tx)(params, grads, state)
    zeros = jax.tree.map(jnp.zeros_like, tree(0))
    want = mindspore_adam_weight_decay(tree(0), grads, zeros, zeros)
    assert_trees_close((p, state.m, state.v), want, rtol=2e-6, atol=1e-9)


def test_mindspore_momentum_with_weight_decay_and_loss_scale():
    tx = jgsess.optim.momentum(0.1, 0.9, weight_decay=1e-4, loss_scale=128.0)
    params, grads = tree(0), tree(1, 12.8)
    state = tx.init(params)
    assert jgsess.jit(tx.update.__wrapped__).report(grads, state, params).fusions["momentum"] == 5
    p, state = jgsess.optim.fused_step(tx)(params, grads, state)
    acc = jax.tree.map(lambda p, g: (p * 1e-4 + g) * (1 / 128.0), tree(0), grads)
    want = jax.tree.map(lambda p, a: p - 0.1 * a, tree(0), acc)
    assert_trees_close((p, state.acc), (want, acc), rtol=2e-6, atol=1e-9)


def test_mismatched_trees_are_a_clear_error():
    tx = jgsess.optim.adamw(1e-3)
    params = tree(0)
    with pytest.raises(ValueError, match="different trees"):
        tx.update({"w1": params["w1"]}, tx.init(params), params)
    bad = dict(params, w1=params["w1"][:2])
    with pytest.raises(ValueError, match=r"gradient \['w1'\] has shape"):
        tx.update(bad, tx.init(params), params)


def test_integer_parameters_are_a_clear_error():
    tx = jgsess.optim.sgd(0.1, momentum=0.9)
    params = {"w": jnp.ones(3), "steps": jnp.arange(3)}
    with pytest.raises(TypeError, match=r"\['steps'\] has dtype int32"):
        jgsess.optim.fused_step(tx)(params, params, tx.init({"w": jnp.ones(3)}))


def test_nan_and_inf_propagate_as_in_optax():
    fused, plain = jgsess.optim.adamw(1e-3), optax.adamw(1e-3)
    params = tree(0)
    grads = jax.tree.map(
        lambda g: g.reshape(-1).at[0].set(jnp.nan).at[-1].set(jnp.inf).reshape(g.shape), tree(1)
    )
    got = fused.update(grads, fused.init(params), params)
    want = plain.update(grads, plain.init(params), params)
    assert_trees_close(got, want, rtol=2e-6, atol=1e-9)


def test_empty_trees_and_zero_size_leaves():
    tx = jgsess.optim.adamw(1e-3)
    assert tx.update({}, tx.init({}), {})[0] == {}
    params = {"a": jnp.zeros((0, 3)), "b": jnp.ones(4)}
    grads = jax.tree.map(jnp.ones_like, params)
    new, state = jgsess.optim.fused_step(tx)(params, grads, tx.init(params))
    assert new["a"].shape == (0, 3) and new["b"].shape == (4,)


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd"])
def test_signature_is_optaxs(name):
    def shape(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert shape(getattr(jgsess.optim, name)) == shape(getattr(optax, name))
    tx = getattr(jgsess.optim, name)(1e-2)
    assert type(tx) is type(getattr(optax, name)(1e-2))
    assert isinstance(tx, optax.GradientTransformationExtraArgs)


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("adamw", {"mu_dtype": jnp.bfloat16}),
        ("adamw", {"nesterov": True}),
        ("adam", {"mu_dtype": jnp.bfloat16, "nesterov": True}),
        ("sgd", {"momentum": 0.9, "accumulator_dtype": jnp.bfloat16}),
    ],
)
def test_optax_options_give_optaxs_numbers(name, kwargs):
    params, grads = tree(0), tree(1)
    ours, theirs = (getattr(m, name)(1e-2, **kwargs) for m in (jgsess.optim, optax))
    state = ours.init(params)
    assert_trees_close(state, theirs.init(params))
    for _ in range(2):
        got = ours.update(grads, state, params, value=jnp.float32(1.0), grad=grads)
        # beside jax.jit's numbers (eager optax rounds bf16 state at other points)
        want = jax.jit(theirs.update)(grads, state, params, value=jnp.float32(1.0), grad=grads)
        assert_trees_close(got, want, rtol=1e-6, atol=1e-7)
        state = got[1]


F32_MATH = {
    "adamw": (lambda m: m.adamw(3e-2, eps=1e-4, weight_decay=1e-2), "jgsess_adamw"),  # f16 eps
    "sgd": (lambda m: m.sgd(3e-2, momentum=0.9), "jgsess_momentum"),
}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("name", F32_MATH)
def test_f32_math_rounds_an_f32_update_once(name, dtype):
    """f32_math(tx) on narrow parameters and state: one kernel call, tx's state dtypes, and the
    step's new parameters and state are the same step computed in f32 from the same narrow
    values, rounded once to their dtype (within an ulp: XLA contracts some f32 multiply-adds);
    optax's own step, every operation rounded, is further from it."""
    make, target = F32_MATH[name]

    def narrow(tree_):
        return jax.tree.map(lambda x: x.astype(dtype), tree_)

    def wide(tree_):
        return jax.tree.map(lambda x: x.astype(jnp.float32) if x.dtype == dtype else x, tree_)

    opt = make(optax)
    params, grads = narrow(tree(0)), narrow(tree(10, 0.1))
    state = opt.init(params)
    for _ in range(3):  # a state that is not the initial one
        params, state = jax.jit(update_step(opt))(params, state, grads)
    reference = jax.jit(update_step(opt))(wide(params), wide(state), wide(grads))
    optaxs = jax.jit(update_step(opt))(params, state, grads)
    tx = jgsess.optim.f32_math(make(jgsess.optim))
    step = jgsess.optim.fused_step(tx, donate=False)
    assert f"@{target}(" in step.lower(params, grads, state).as_text()
    new_params, new_state = step(params, grads, state)
    ours = (new_params, new_state)
    assert jax.tree.map(lambda x: x.dtype, ours) == jax.tree.map(lambda x: x.dtype, optaxs)
    assert_within_ulp([(ours, jax.tree.map(lambda r, o: r.astype(o.dtype), reference, ours))])

    def error(got):
        pairs = zip(jax.tree.leaves(got[0]), jax.tree.leaves(reference[0]))
        return sum(float(jnp.sum(jnp.abs(g.astype(jnp.float32) - r))) for g, r in pairs)

    assert error(ours) < error(optaxs)
