"""Sharded programs on 4 CPU devices, under Shardy and GSPMD: each kernel runs per shard.

Run by tests/test_multi_device.py in a subprocess with 4 forced host devices (the flag must be
set before jax starts, and must not leak into the other tests). Every case compares jgsess.jit
with jax.jit: the same numbers and output shardings, the `jgsess_*` custom calls in the compiled
module, and no collective beyond jax.jit's.
"""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jgsess
from tests.helpers import assert_trees_close

COLLECTIVES = ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter")

pytestmark = pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices")


@pytest.fixture(params=["shardy", "gspmd"], autouse=True)
def partitioner(request):
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
    yield request.param
    jax.config.update("jax_use_shardy_partitioner", before)


def collectives(text: str) -> dict[str, int]:
    return {c: len(re.findall(rf"\b{c}(?:-start)?\(", text)) for c in COLLECTIVES}


def kernels(text: str) -> set[str]:
    return set(re.findall(r'custom_call_target="(jgsess_\w+)"', text))


def check(step, args, want_kernels, donate=(), rtol=2e-6, atol=1e-6, added=None):
    """jgsess.jit(step) against jax.jit(step) on `args`: numbers, shardings, kernels, and no
    collective of any kind beyond jax.jit's (`added`: the ones a case is known to add).
    Returns jgsess's compiled text."""
    fused = jgsess.jit(step, donate_argnums=donate)
    plain = jax.jit(step, donate_argnums=donate)
    plain_text = plain.lower(*args).compile().as_text()
    fused_text = fused.lower(*args).compile().as_text()
    copies = [jax.tree.map(jnp.copy, args) for _ in range(2)]
    want, got = plain(*copies[0]), fused(*copies[1])
    assert_trees_close(got, want, rtol=rtol, atol=atol)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        assert b.sharding.is_equivalent_to(a.sharding, a.ndim), (a.shape, a.sharding, b.sharding)
    assert want_kernels <= kernels(fused_text), kernels(fused_text)
    fused_count, plain_count = collectives(fused_text), collectives(plain_text)
    extra = {c: fused_count[c] - plain_count[c] for c in COLLECTIVES}
    assert {c: n for c, n in extra.items() if n > 0} == (added or {}), (fused_count, plain_count)
    return fused_text


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(64)(x))
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(10)(x)


OPT = optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 100), weight_decay=1e-2),
)


def train_step(opt, model=MLP()):  # noqa: B008 - one immutable flax module
    def step(params, state, x, y):
        def loss(p):
            logits = model.apply(p, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return step


def batch(n=32):
    x = jax.random.normal(jax.random.PRNGKey(1), (n, 20))
    return x, jax.random.randint(jax.random.PRNGKey(2), (n,), 0, 10)


def first_divisible(mesh, axis: str):
    """FSDP: each leaf split on its first dimension the axis divides, replicated otherwise."""

    def spec(leaf):
        for d, n in enumerate(leaf.shape):
            if n % mesh.shape[axis] == 0 and n >= mesh.shape[axis]:
                return NamedSharding(mesh, P(*([None] * d), axis))
        return NamedSharding(mesh, P())

    return spec


def test_data_parallel_train_step():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    x, y = batch()
    params = MLP().init(jax.random.PRNGKey(0), x)
    replicated = NamedSharding(mesh, P())
    params = jax.device_put(params, replicated)
    state = jax.device_put(OPT.init(params), replicated)
    x, y = jax.device_put((x, y), NamedSharding(mesh, P("data")))
    check(train_step(OPT), (params, state, x, y), {"jgsess_adamw", "jgsess_global_norm"})


def test_fsdp_parameters_and_state_sharded():
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    params = {
        "w": jax.random.normal(jax.random.PRNGKey(0), (20, 64)),
        "b": jax.random.normal(jax.random.PRNGKey(1), (64,)),
        "odd": jax.random.normal(jax.random.PRNGKey(2), (1001,)),
        "t": jax.random.normal(jax.random.PRNGKey(3), (3, 8, 5)),
    }
    shard = first_divisible(mesh, "fsdp")
    params = jax.tree.map(lambda p: jax.device_put(p, shard(p)), params)
    state = jax.tree.map(lambda s: jax.device_put(s, shard(s)), OPT.init(params))
    grads = jax.tree.map(lambda p: jax.device_put(0.1 * p + 0.01, p.sharding), params)

    def step(p, s, g):
        u, s = OPT.update(g, s, p)
        return optax.apply_updates(p, u), s

    text = check(step, (params, state, grads), {"jgsess_adamw", "jgsess_global_norm"}, (0, 1))
    # in place per shard: the kernel's results alias its parameter and state operands
    assert re.search(r'"jgsess_adamw"[^\n]*output_to_operand_aliasing=\{\{', text), text


def test_two_dimensional_mesh():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
    x, y = batch()
    params = MLP().init(jax.random.PRNGKey(0), x)

    def layout(path, p):
        name = jax.tree_util.keystr(path)
        if "kernel" in name and p.shape[1] % 2 == 0:
            return NamedSharding(mesh, P(None, "model"))
        return NamedSharding(mesh, P())

    params = jax.tree_util.tree_map_with_path(lambda k, p: jax.device_put(p, layout(k, p)), params)
    state = OPT.init(params)
    x, y = jax.device_put((x, y), NamedSharding(mesh, P("data")))
    # Shardy and GSPMD propagate through the one update call otherwise than through XLA's
    # elementwise update: two kernel-gradient layouts are resharded (all-to-all) and the
    # logits gathered where jax.jit reduces them (one all-reduce fewer).
    added = {"all-gather": 1, "all-to-all": 2}
    check(
        train_step(OPT), (params, state, x, y), {"jgsess_adamw", "jgsess_global_norm"}, added=added
    )


def test_shard_map_with_pmean():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    x, y = batch()
    model = MLP()
    params = model.init(jax.random.PRNGKey(0), x)
    state = OPT.init(params)

    def local_step(params, state, x, y):
        def loss(p):
            logits = model.apply(p, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        grads = jax.tree.map(lambda g: jax.lax.pmean(g, "data"), jax.grad(loss)(params))
        updates, state = OPT.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    rep, split = P(), P("data")
    step = jax.shard_map(local_step, mesh=mesh, in_specs=(rep, rep, split, split), out_specs=rep)
    text = check(step, (params, state, x, y), {"jgsess_adamw", "jgsess_global_norm"})
    assert "CustomSPMDPartitioning" not in jax.jit(step).lower(params, state, x, y).as_text()
    assert "CustomSPMDPartitioning" not in text


def test_one_device_program_in_a_four_device_process():
    device = jax.devices()[2]
    params = jax.device_put({"w": jax.random.normal(jax.random.PRNGKey(0), (33, 7))}, device)
    opt = optax.adamw(1e-3)
    state = opt.init(params)
    grads = jax.tree.map(lambda p: 0.1 * p, params)

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    check(step, (params, state, grads), {"jgsess_adamw"})
    report = jgsess.jit(step).report(params, state, grads)
    assert [k.impl for k in report.kernels] == ["kernel"]


def test_relu_mask_splits_with_the_batch(monkeypatch):
    monkeypatch.setenv("JGSESS_PREFER", "memory")
    mesh = Mesh(np.array(jax.devices()), ("data",))
    x, y = batch()
    params = jax.device_put(MLP().init(jax.random.PRNGKey(0), x), NamedSharding(mesh, P()))
    x, y = jax.device_put((x, y), NamedSharding(mesh, P("data")))
    opt = optax.sgd(0.1)
    state = opt.init(params)
    text = check(
        train_step(opt), (params, state, x, y), {"jgsess_relu_mask", "jgsess_relu_mask_grad"}
    )
    assert "jgsess_relu_mask" in text


def test_mesh_axis_of_size_one():
    mesh = Mesh(np.array(jax.devices()).reshape(1, 4), ("one", "four"))
    params = {"w": jax.random.normal(jax.random.PRNGKey(0), (8, 12))}
    params = jax.device_put(params, NamedSharding(mesh, P("one", "four")))
    opt = optax.adamw(1e-3)
    state = opt.init(params)
    grads = jax.tree.map(lambda p: 0.1 * p, params)

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    check(step, (params, state, grads), {"jgsess_adamw"})


def test_arguments_on_different_devices_raise_as_jax_jit_does():
    a = jax.device_put(jnp.ones(8), jax.devices()[0])
    b = jax.device_put(jnp.ones(8), jax.devices()[1])

    def f(x, y):
        return x + y

    with pytest.raises(ValueError) as plain:
        jax.jit(f)(a, b)
    with pytest.raises(ValueError) as fused:
        jgsess.jit(f)(a, b)
    assert str(fused.value) == str(plain.value)
