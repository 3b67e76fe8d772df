"""combine-optimizers: per-parameter updates sharing hyper-parameters become one call."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jgsess
from tests.helpers import assert_trees_close, count, rand
from tests.optax_steps import compare, tree, update_step


def test_a_whole_tree_becomes_one_call():
    report = compare(optax.adamw(1e-3))
    assert report.session.record.combined == [("adamw", 5)]
    assert len(report.kernels) == 1 and report.kernels[0].operands == 13 + 4 * 5


def test_different_hyper_parameters_stay_apart():
    opt = optax.multi_transform(
        {"a": optax.adamw(1e-3), "b": optax.adamw(1e-2)},
        lambda params: {k: "a" if k.startswith("w") else "b" for k in params},
    )
    report = compare(opt)
    assert sorted(n for _, n in report.session.record.combined) == [2, 3]
    assert len(report.kernels) == 2


def test_updates_that_depend_on_each_other_are_not_merged():
    def chained(p, m, v, g, q, n, w):
        from tests.passes.test_fuse_adamw import ms_adam

        p2, m2, v2 = ms_adam(p, m, v, g)
        q2, n2, w2 = ms_adam(q, n, w, p2 * 0.5)  # the second's gradient is the first's result
        return p2, m2, v2, q2, n2, w2

    args = [rand((9,), s) for s in range(7)]
    args[2], args[6] = jnp.abs(args[2]), jnp.abs(args[6])
    fused = jgsess.jit(chained)
    report = fused.report(*args)
    assert report.fusions["adamw"] == 2 and not report.session.record.combined
    assert_trees_close(fused(*args), jax.jit(chained)(*args), rtol=2e-6, atol=1e-7)


def test_updates_inside_a_cond_are_combined_there():
    opt = optax.adam(1e-3)

    def step(params, state, grads, go):
        def update(operands):
            p, s, g = operands
            u, s = opt.update(g, s, p)
            return optax.apply_updates(p, u), s

        return jax.lax.cond(go, update, lambda ops: ops[:2], (params, state, grads))

    params = {"a": rand((3,)), "b": rand((4, 2), 1)}
    state = opt.init(params)
    grads = {"a": rand((3,), 2), "b": rand((4, 2), 3)}
    fused = jgsess.jit(step)
    report = fused.report(params, state, grads, True)
    assert report.session.record.combined == [("adamw", 2)]
    assert count(report.session.graph, "adamw") == 1  # inside the branch
    assert_trees_close(fused(params, state, grads, True), jax.jit(step)(params, state, grads, True))


SCHEDULES = {
    "constant": lambda: optax.constant_schedule(0.1),
    "linear": lambda: optax.linear_schedule(0.1, 0.01, 100),
    "cosine": lambda: optax.cosine_decay_schedule(0.1, 1000),
    "warmup_cosine": lambda: optax.warmup_cosine_decay_schedule(0.0, 0.1, 10, 1000),
    "exponential": lambda: optax.exponential_decay(0.1, 100, 0.5),
    "piecewise": lambda: optax.piecewise_constant_schedule(0.1, {2: 0.5, 50: 0.1}),
    "join": lambda: optax.join_schedules(
        [optax.linear_schedule(0.0, 0.1, 2), optax.cosine_decay_schedule(0.1, 100)], [2]
    ),
    "lambda": lambda: lambda count: 0.1 / (1.0 + count),
}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("kernel", ["adamw", "momentum"])
def test_every_optax_schedule_combines_into_one_call(schedule, kernel):
    lr = SCHEDULES[schedule]()
    opt = optax.adamw(lr, weight_decay=1e-4) if kernel == "adamw" else optax.sgd(lr, 0.9)
    report = compare(opt, steps=4)
    assert report.session.record.combined == [(kernel, 5)]
    assert report.fusions[kernel] == 5


def test_two_schedules_with_the_same_formula_but_other_constants_stay_apart():
    opt = optax.multi_transform(
        {
            "a": optax.sgd(optax.cosine_decay_schedule(0.1, 1000), 0.9),
            "b": optax.sgd(optax.cosine_decay_schedule(0.2, 1000), 0.9),
        },
        lambda params: {k: "a" if k.startswith("w") else "b" for k in params},
    )
    report = compare(opt)
    assert sorted(n for _, n in report.session.record.combined) == [2, 3]


def test_per_leaf_copies_of_one_random_draw_stay_one_operand_but_two_draws_do_not():
    def step(params, accs, grads, key):
        lr = jax.random.uniform(key)  # the same draw, converted per leaf
        lrs = [lr.astype(jnp.float32) for _ in params]
        other = jax.random.uniform(jax.random.fold_in(key, 1))
        lrs[-1] = other  # a different draw: a different hyper-parameter
        out = []
        for p, a, g, lr_i in zip(params, accs, grads, lrs):
            a2 = g + 0.9 * a
            out.append((p - lr_i * a2, a2))
        return out

    params = [rand((5,), s) for s in range(3)]
    accs = [rand((5,), 10 + s) for s in range(3)]
    grads = [rand((5,), 20 + s) for s in range(3)]
    key = jax.random.PRNGKey(3)
    fused = jgsess.jit(step)
    report = fused.report(params, accs, grads, key)
    assert report.session.record.combined == [("momentum", 2)]
    assert len(report.kernels) == 2
    assert_trees_close(fused(params, accs, grads, key), jax.jit(step)(params, accs, grads, key))


@pytest.fixture
def x64():
    # jax.config, not jax.enable_x64: that context manager is newer than jax 0.7
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def test_x64_bias_corrections_converted_per_leaf_still_combine(x64):
    opt = optax.adamw(1e-3, weight_decay=1e-4)
    f32 = lambda t: jax.tree.map(lambda x: x.astype(jnp.float32), t)  # noqa: E731
    params, grads = f32(tree(0)), f32(tree(1, 0.1))
    state = opt.init(params)
    step = update_step(opt)
    fused = jgsess.jit(step)
    report = fused.report(params, state, grads)
    assert report.session.record.combined == [("adamw", 5)]
    assert len(report.kernels) == 1
    dtypes = {v.dtype for g in report.session.graph.walk() for n in g.live() for v in n.outputs}
    assert np.dtype(np.float64) in dtypes  # the bias corrections are computed in f64
    assert_trees_close(fused(params, state, grads), jax.jit(step)(params, state, grads))


def frozen_mask(params):
    return {k: not k.startswith("b") for k in params}  # biases frozen


def trained_mask(params):
    return {k: not f for k, f in frozen_mask(params).items()}


@pytest.mark.parametrize(
    "opt",
    [
        optax.masked(optax.adamw(1e-3), frozen_mask),
        optax.chain(
            optax.masked(optax.set_to_zero(), trained_mask),
            optax.masked(optax.sgd(0.1, 0.9), frozen_mask),
        ),
        optax.multi_transform(
            {"train": optax.adamw(1e-3), "frozen": optax.set_to_zero()},
            lambda p: {k: "train" if v else "frozen" for k, v in frozen_mask(p).items()},
        ),
    ],
    ids=["masked", "masked-sgd-set-to-zero", "multi_transform-frozen"],
)
def test_trained_leaves_combine_and_frozen_leaves_stay_put(opt):
    report = compare(opt)
    (kernel,) = {k for k, _ in report.session.record.combined}
    assert report.session.record.combined == [(kernel, 3)]  # w1, w2, scale; not b1, b2
    assert report.fusions[kernel] == 3


def test_multi_steps_over_an_optimizer_outside_the_patterns_does_not_fuse():
    report = compare(optax.MultiSteps(optax.adabelief(1e-3), every_k_schedule=2), steps=4)
    assert not report.fusions and not report.session.record.combined


@pytest.mark.parametrize(
    "inner",
    [
        lambda: optax.adamw(optax.cosine_decay_schedule(1e-3, 100), weight_decay=1e-4),
        lambda: optax.sgd(0.1, momentum=0.9, nesterov=True),
    ],
    ids=["adamw-cosine", "sgd-nesterov"],
)
def test_multi_steps_accumulation_fuses_the_inner_update(inner):
    # optax.MultiSteps computes the inner update every step and multiplies it by whether this
    # step applies it: the scaled step `lr*u` is matched and negated back after the kernel
    report = compare(optax.MultiSteps(inner(), every_k_schedule=3), steps=7)
    (kernel,) = {k for k, _ in report.session.record.combined}
    assert report.session.record.combined == [(kernel, 5)]
    assert report.fusions[kernel] == 5


def test_a_large_tree_is_combined_in_calls_of_at_most_max_tensors():
    # one call per MAX_TENSORS tensors: XLA compiles many aliased operands of one call slowly
    params = [jnp.full((3,), 0.5 + i, jnp.float32) for i in range(300)]
    grads = [p * 0.01 for p in params]
    opt = optax.adamw(1e-3)

    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    fused = jgsess.jit(step, donate_argnums=(0, 1))
    report = fused.report(params, opt.init(params), grads)
    assert sorted(n for _, n in report.session.record.combined) == [44, 128, 128]
    got = fused([jnp.copy(p) for p in params], opt.init(params), grads)
    assert_trees_close(got, jax.jit(step)(params, opt.init(params), grads))
