"""The batching rule of the multi-tensor kernels: under jax.vmap the batch axis folds into the
tensors and the kernel runs; a hyper-parameter that differs across the batch falls back to the
reference under vmap."""

import jax
import jax.numpy as jnp
import optax
import pytest

import jgsess
from jgsess.kernels import adamw, momentum
from tests.helpers import assert_trees_close
from tests.optax_steps import tree, update_step

pytestmark = pytest.mark.usefixtures("kernels")

ENSEMBLE = 3
SPECS = {"adamw": adamw.SPEC, "momentum": momentum.SPEC}


def ensemble(seed, scale=1.0):
    members = [tree(seed + 100 * i, scale) for i in range(ENSEMBLE)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *members)


OPTIMIZERS = {
    "adamw": lambda: optax.adamw(1e-3, weight_decay=1e-4),
    "momentum": lambda: optax.sgd(optax.cosine_decay_schedule(0.1, 100), 0.9, nesterov=True),
}


@pytest.mark.parametrize("kernel", OPTIMIZERS)
def test_vmap_of_a_jgsess_step_runs_the_kernel(kernel):
    opt = OPTIMIZERS[kernel]()
    step = update_step(opt)
    params = ensemble(0)
    state = jax.vmap(opt.init)(params)
    grads = ensemble(1, 0.1)
    batched = jax.jit(jax.vmap(jgsess.jit(step)))
    text = batched.lower(params, state, grads).as_text()
    assert text.count(SPECS[kernel].target) == 1  # one call, every member and leaf in it
    expected = jax.jit(jax.vmap(step))(params, state, grads)
    assert_trees_close(batched(params, state, grads), expected, rtol=2e-6, atol=1e-7)


def test_unbatched_state_is_broadcast_into_the_kernel():
    opt = optax.sgd(0.1, momentum=0.9)
    step = update_step(opt)
    params = tree(0)
    state = opt.init(params)
    state = jax.tree.map(lambda x: x + 0.5, state)
    grads = ensemble(1, 0.1)  # one gradient per member, one shared starting point
    batched = jax.vmap(jgsess.jit(step), in_axes=(None, None, 0))
    assert momentum.SPEC.target in jax.jit(batched).lower(params, state, grads).as_text()
    expected = jax.vmap(step, in_axes=(None, None, 0))(params, state, grads)
    assert_trees_close(batched(params, state, grads), expected, rtol=2e-6, atol=1e-7)


def test_a_learning_rate_per_member_runs_in_the_kernel():
    def step(params, state, grads, lr):
        updates, state = optax.sgd(lr, momentum=0.9).update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params = ensemble(0)
    state = jax.vmap(optax.sgd(0.1, momentum=0.9).init)(params)
    grads = ensemble(1, 0.1)
    lrs = jnp.array([0.1, 0.01, 0.001])
    batched = jax.jit(jax.vmap(jgsess.jit(step)))
    assert batched.lower(params, state, grads, lrs).as_text().count(momentum.SPEC.target) == 1
    expected = jax.jit(jax.vmap(step))(params, state, grads, lrs)
    assert_trees_close(batched(params, state, grads, lrs), expected, rtol=2e-6, atol=1e-7)


def test_nested_vmap_gives_each_member_its_own_hyper_parameters():
    opt = optax.adamw(optax.cosine_decay_schedule(1e-2, 10), weight_decay=1e-4)
    step = update_step(opt)
    params = jax.tree.map(lambda x: jnp.stack([x, 2 * x]), ensemble(0))
    state = jax.vmap(jax.vmap(opt.init))(params)
    grads = jax.tree.map(lambda x: jnp.stack([x, -x]), ensemble(1, 0.1))
    counts = jnp.array([[0, 1, 2], [3, 4, 5]], jnp.int32)
    state = jax.tree.map(
        lambda x: counts if x.dtype == jnp.int32 and x.shape == counts.shape else x, state
    )
    batched = jax.jit(jax.vmap(jax.vmap(jgsess.jit(step))))
    assert adamw.SPEC.target in batched.lower(params, state, grads).as_text()
    expected = jax.jit(jax.vmap(jax.vmap(step)))(params, state, grads)
    assert_trees_close(batched(params, state, grads), expected, rtol=2e-6, atol=1e-7)


def test_a_learning_rate_per_element_is_not_an_optimizer_step_under_vmap_either():
    def step(params, accs, grads, lrs):
        out = jax.tree.map(
            lambda p, a, g, lr: (p - lr * (g + 0.9 * a), g + 0.9 * a), params, accs, grads, lrs
        )
        return out

    params, accs, grads = ensemble(0), ensemble(1), ensemble(2, 0.1)
    lrs = jax.tree.map(jnp.abs, ensemble(3, 0.01))
    batched = jax.jit(jax.vmap(jgsess.jit(step)))
    assert momentum.SPEC.target not in batched.lower(params, accs, grads, lrs).as_text()
    expected = jax.jit(jax.vmap(step))(params, accs, grads, lrs)
    assert_trees_close(batched(params, accs, grads, lrs), expected)


def test_per_member_hyper_parameters_keep_whole_members_on_each_device():
    from jgsess.kernels import momentum

    f32 = jnp.float32
    hyper = [jax.ShapeDtypeStruct((3,), f32)] * 4
    tensors = [jax.ShapeDtypeStruct((3, 5), f32)] * 3 + [jax.ShapeDtypeStruct((3, 2, 2), f32)] * 3
    rules = momentum.SPEC.factors({"flags": 0}, hyper + tensors)
    assert all(dims == ("member_0",) for dims in rules.operands[:4])
    assert all(dims[0] == "member_0" for dims in rules.operands[4:] + rules.results)
    assert "member_0" in rules.replicated
    scalars = momentum.SPEC.factors({"flags": 0}, [jax.ShapeDtypeStruct((), f32)] * 4 + tensors)
    assert "member_0" not in scalars.replicated  # unbatched: tensors split as the rule says
