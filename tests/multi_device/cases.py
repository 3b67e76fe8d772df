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
from jgsess.kernels import spec
from tests.helpers import assert_trees_close, needs_shard_map_bodies

PRNG = jax.random.PRNGKey(0)
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
    collective of any kind beyond jax.jit's (`added`: at most these, where a case is known to).
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
    assert all(n <= (added or {}).get(c, 0) for c, n in extra.items()), (fused_count, plain_count)
    return fused_text


def assert_dispatched_asynchronously(step, args):
    """Each device's program carries the async hint, in the per-shard bodies too (manual
    sharding), and so is estimated at jax.jit's side of XLA:CPU's synchronous-run threshold."""
    program = jgsess.jit(step).lower(*args).compile()
    assert f'custom_call_target="{spec.ASYNC_HINT_TARGET}"' in program.as_text()
    assert program.cost_analysis()["flops"] >= spec.CHEAP_FLOPS
    assert jax.jit(step).lower(*args).compile().cost_analysis()["flops"] >= spec.CHEAP_FLOPS


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


def update_step(opt):
    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

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

    step = update_step(OPT)

    text = check(step, (params, state, grads), {"jgsess_adamw", "jgsess_global_norm"}, (0, 1))
    # in place per shard: the kernel's results alias its parameter and state operands
    assert re.search(r'"jgsess_adamw"[^\n]*output_to_operand_aliasing=\{\{', text), text
    assert_dispatched_asynchronously(step, (params, state, grads))


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
    # the gradients of the split kernels come out of their dots split as the kernels are (the
    # optimizer ties them, shard_alike): nothing is resharded at the update call
    check(train_step(OPT), (params, state, x, y), {"jgsess_adamw", "jgsess_global_norm"})


def per_leaf_pmean_step(mesh):
    model = MLP()

    def local_step(params, state, x, y):
        def loss(p):
            logits = model.apply(p, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        grads = jax.tree.map(lambda g: jax.lax.pmean(g, "data"), jax.grad(loss)(params))
        updates, state = OPT.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    rep, split = P(), P("data")
    return jax.shard_map(local_step, mesh=mesh, in_specs=(rep, rep, split, split), out_specs=rep)


@needs_shard_map_bodies
def test_shard_map_with_pmean():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    x, y = batch()
    params = MLP().init(jax.random.PRNGKey(0), x)
    args = (params, OPT.init(params), x, y)
    step = per_leaf_pmean_step(mesh)
    text = check(step, args, {"jgsess_adamw", "jgsess_global_norm"})
    # inside the body the kernels see local blocks: no partitioning around them
    assert "CustomSPMDPartitioning" not in text
    assert_dispatched_asynchronously(step, args)


def test_one_device_program_in_a_four_device_process():
    device = jax.devices()[2]
    params = jax.device_put({"w": jax.random.normal(jax.random.PRNGKey(0), (33, 7))}, device)
    opt = optax.adamw(1e-3)
    state = opt.init(params)
    grads = jax.tree.map(lambda p: 0.1 * p, params)

    step = update_step(opt)

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

    step = update_step(opt)

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


@needs_shard_map_bodies
@pytest.mark.parametrize("setting", ["on", "measure"])
def test_gradient_all_reduces_in_buckets(monkeypatch, request, setting):
    if setting == "on":
        monkeypatch.setenv("JGSESS_BUCKETS", "on")
    else:
        request.getfixturevalue("tuning")  # measuring on, with a cache of its own
        monkeypatch.setenv("JGSESS_AUTOTUNE_BUDGET", "60")  # global_norm is measured first
    mesh = Mesh(np.array(jax.devices()), ("data",))
    x, y = batch()
    params = MLP().init(jax.random.PRNGKey(0), x)
    state = OPT.init(params)
    step = per_leaf_pmean_step(mesh)
    args = (params, state, x, y)
    fused = jgsess.jit(step)
    (choice,) = fused.report(*args).buckets
    # the 6 gradients' pmeans, and the psums that transpose the replicated parameters' use
    assert choice.operands == 12 and len(choice.buckets) == 2
    if setting == "on":
        assert choice.taken
        text = fused.lower(*args).as_text()
        assert len(re.findall(r"stablehlo\.all_reduce", text)) == 2  # 2 buckets for 12 psums
    else:
        assert choice.written_ms > 0 and choice.bucketed_ms > 0
        assert choice.taken == (choice.bucketed_ms < choice.written_ms)
    check(step, args, {"jgsess_adamw"})


def test_a_split_that_does_not_divide_a_leaf():
    mesh = Mesh(np.array(jax.devices()), ("d",))
    uneven = NamedSharding(mesh, P("d"))
    params = {"odd": jax.random.normal(jax.random.PRNGKey(0), (1001,))}
    with pytest.raises(ValueError):  # jax refuses it outside a program
        jax.device_put(params["odd"], uneven)
    opt = optax.adamw(1e-3)
    state = opt.init(params)

    def step(p, s, g):
        # inside the program jax allows it (XLA pads the last shard): the kernel's rule does
        # not split a dimension unevenly, it runs on the whole leaf
        g = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, uneven), g)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    grads = jax.tree.map(lambda p: 0.1 * p, params)
    check(step, (params, state, grads), {"jgsess_adamw"}, added={"all-gather": 1})


def test_global_norm_reduces_over_the_axes_its_tensors_are_split_on():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
    specs = [P("data"), P(None, "model"), P("data", "model"), P(), P(("data", "model"))]
    shapes = [(6, 5), (3, 8), (4, 6), (7,), (12,)]
    xs = [
        jax.device_put(jax.random.normal(jax.random.PRNGKey(i), s), NamedSharding(mesh, spec))
        for i, (s, spec) in enumerate(zip(shapes, specs))
    ]
    text = check(optax.global_norm, (xs,), {"jgsess_global_norm"}, rtol=1e-5)
    # one psum per set of axes: (data), (model), (data, model) and the replicated one none
    assert len(re.findall(r"\ball-reduce(?:-start)?\(", text)) <= 3


def _spec_calls():
    """(spec, static params, operands builder) for every kernel, on 4-device shardings."""
    from jgsess.kernels import adamw, cast_all, global_norm, momentum, relu_mask

    def tensors(mesh, k):
        specs = [P("d", None), P(None, "d"), P(), P("d")]
        shapes = [(64, 33), (7, 96), (5, 3), (4096,)]
        key = jax.random.PRNGKey(k)
        return [
            jax.device_put(jax.random.normal(jax.random.fold_in(key, i), s), NamedSharding(mesh, p))
            for i, (s, p) in enumerate(zip(shapes, specs))
        ]

    def update(spec, n_scalars, state, flags):
        def operands(mesh):
            scalars = [jnp.float32(0.1 * (i + 1)) for i in range(n_scalars)]
            groups = [tensors(mesh, k) for k in range(2 + state)]
            per_tensor = [
                x for t in zip(*groups) for x in (t[0], t[1], *(jnp.abs(s) for s in t[2:]))
            ]
            return scalars + per_tensor

        return spec, {"flags": flags}, operands

    return {
        "adamw": update(adamw.SPEC, len(adamw.SCALARS), 2, adamw.OPTAX_ADAMW),
        "momentum": update(momentum.SPEC, len(momentum.SCALARS), 1, momentum.Flag.NESTEROV),
        "cast_all": (
            cast_all.SPEC,
            {"dtypes": ("bfloat16", "float16", "bfloat16", "float16")},
            lambda mesh: tensors(mesh, 0),
        ),
        "global_norm": (global_norm.SPEC, {}, lambda mesh: tensors(mesh, 1)),
        "relu_mask": (
            relu_mask.FORWARD,
            {},
            lambda mesh: [
                jax.device_put(
                    jax.random.normal(jax.random.PRNGKey(k), (8, 256)),
                    NamedSharding(mesh, P(None, "d")),
                )
                for k in range(2)
            ],
        ),
    }


@pytest.mark.parametrize("name", ["adamw", "momentum", "cast_all", "global_norm", "relu_mask"])
def test_each_kernel_runs_per_shard(name):
    spec, static, operands = _spec_calls()[name]
    mesh = Mesh(np.array(jax.devices()), ("d",))
    xs = operands(mesh)
    params = {**static, "impl": "kernel"}
    if spec.workspace is not None:
        size = spec.workspace(static, [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs])
        params["workspace"] = (0, size)

    def fused(*xs):
        arena = jnp.zeros((params["workspace"][1],), jnp.uint8) if "workspace" in params else None
        return spec.apply(list(xs), params, arena)[0]

    def reference(*xs):
        return spec.run_reference(list(xs), static)

    rtol = 1e-5 if name == "global_norm" else 2e-6
    got, want = jax.jit(fused)(*xs), jax.jit(reference)(*xs)
    assert_trees_close(got, want, rtol=rtol, atol=1e-6)
    # relu_mask's mask is only read by relu_mask_grad: it splits with the activation by design
    compared = list(zip(want, got))[:1] if name == "relu_mask" else zip(want, got)
    for a, b in compared:
        assert b.sharding.is_equivalent_to(a.sharding, a.ndim), (a.shape, a.sharding, b.sharding)
    if name == "relu_mask":
        assert got[1].sharding.spec == P(None, "d")
    text = jax.jit(fused).lower(*xs).compile().as_text()
    assert spec.target in kernels(text)
    plain = collectives(jax.jit(reference).lower(*xs).compile().as_text())
    assert all(n <= plain[c] for c, n in collectives(text).items()), (collectives(text), plain)


def test_a_kernel_without_a_sharding_rule_runs_its_reference_when_partitioned():
    import dataclasses

    from jgsess.kernels import relu_mask

    spec = dataclasses.replace(relu_mask.FORWARD, factors=None)  # as a spec with no rule
    mesh = Mesh(np.array(jax.devices()), ("d",))
    x = jax.random.normal(jax.random.PRNGKey(0), (8, 64))

    def fused(x):
        return spec.apply([x], {"impl": "kernel"})[0]

    one = jax.device_put(x, jax.devices()[1])
    assert "jgsess_relu_mask" in kernels(jax.jit(fused).lower(one).compile().as_text())
    split = jax.device_put(x, NamedSharding(mesh, P("d")))
    text = jax.jit(fused).lower(split).compile().as_text()
    assert "jgsess_relu_mask" not in kernels(text)
    assert_trees_close(jax.jit(fused)(split), spec.run_reference([x], {}))


@pytest.mark.parametrize("layout", ["batch", "channels"])
def test_batch_norm_relu_per_shard(layout):
    from tests.passes.test_fuse_batch_norm_relu import Block, linen_step

    mesh = Mesh(np.array(jax.devices()), ("d",))
    step, (params, stats, x, z) = linen_step(Block(), jax.random.normal(PRNG, (8, 3, 3, 128)))
    if layout == "batch":  # data parallel: the statistics need every device's sums
        x = jax.device_put(x, NamedSharding(mesh, P("d")))
        want = set()
    else:  # channels split: each device normalizes its own channels, in the kernels
        params, stats = jax.device_put((params, stats), NamedSharding(mesh, P("d")))
        x = jax.device_put(x, NamedSharding(mesh, P(None, None, None, "d")))
        want = {"jgsess_batch_norm_relu", "jgsess_batch_norm_relu_grad"}
    fusions = jgsess.jit(step).report(params, stats, x, z).fusions
    assert fusions["batch_norm_relu"] == fusions["batch_norm_relu_grad"] == 1, fusions
    check(step, (params, stats, x, z), want, rtol=2e-5, atol=2e-5)


def _fsdp_adamw_step():
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    shard = first_divisible(mesh, "fsdp")
    params = {
        "w": jax.random.normal(jax.random.PRNGKey(0), (20, 64)),
        "odd": jax.random.normal(jax.random.PRNGKey(2), (1001,)),
    }
    params = jax.tree.map(lambda p: jax.device_put(p, shard(p)), params)
    state = jax.tree.map(lambda s: jax.device_put(s, shard(s)), OPT.init(params))
    return update_step(OPT), (params, state, jax.tree.map(lambda p: 0.1 * p, params))


def _data_parallel_train_step():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    x, y = jax.device_put(batch(), NamedSharding(mesh, P("data")))
    replicated = NamedSharding(mesh, P())
    params = jax.device_put(MLP().init(PRNG, x), replicated)
    return train_step(OPT), (params, jax.device_put(OPT.init(params), replicated), x, y)


def _channel_split_batch_norm_step():
    from tests.passes.test_fuse_batch_norm_relu import Block, linen_step

    mesh = Mesh(np.array(jax.devices()), ("d",))
    step, (params, stats, x, z) = linen_step(Block(), jax.random.normal(PRNG, (8, 3, 3, 128)))
    params, stats = jax.device_put((params, stats), NamedSharding(mesh, P("d")))
    x = jax.device_put(x, NamedSharding(mesh, P(None, None, None, "d")))
    return step, (params, stats, x, z)


def _every_fusion_step(name: str):
    """tests/cuda_lowering.py's representative step of a fusion, each array split over the mesh
    on its last dimension 4 divides (a BatchNorm's channels, a matrix's columns), replicated
    otherwise."""
    from tests import cuda_lowering

    mesh = Mesh(np.array(jax.devices()), ("d",))

    def shard(a):
        split = [d for d, n in enumerate(a.shape) if n % 4 == 0][-1:]
        spec = [("d" if d in split else None) for d in range(a.ndim)]
        return jax.device_put(a, NamedSharding(mesh, P(*spec)))

    def make():
        fn, args = cuda_lowering.steps()[name][0]()
        return fn, jax.tree.map(shard, args)

    make.__name__ = name
    return make


def _fusion_steps():
    from tests import cuda_lowering

    return [_every_fusion_step(name) for name in sorted(cuda_lowering.steps())]


@pytest.mark.parametrize(
    "make",
    [_fsdp_adamw_step, _data_parallel_train_step, _channel_split_batch_norm_step, *_fusion_steps()],
    ids=lambda make: make.__name__.strip("_"),
)
def test_sharded_steps_lower_to_the_same_calls_for_cuda(monkeypatch, make):
    """On a faked NVIDIA GPU the partitioned kernel calls are those of the CPU program (cast_all:
    on the GPU only, by its cost model; where a kernel's sharding rule declines the split, as
    BatchNorm's for 2 channels per device, XLA partitions the reference on both)."""
    from tests import cuda_lowering

    monkeypatch.setenv("JGSESS_PREFER", "memory")  # the relu_mask kernels are taken
    if make.__name__ in cuda_lowering.GPU_ONLY:
        assert cuda_lowering.kernel_calls(cuda_lowering.lowered(*make(), "cpu")) == []
        cuda_lowering.fake_gpu(monkeypatch)
        calls = cuda_lowering.kernel_calls(cuda_lowering.lowered(*make(), "cuda"))
    else:
        calls = cuda_lowering.assert_same_calls_for_cuda(monkeypatch, make)
    if make.__name__ not in cuda_lowering.steps() or "batch_norm" not in make.__name__:
        assert calls, "no kernel call"
