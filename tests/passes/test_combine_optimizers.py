"""combine-optimizers: per-parameter updates sharing hyper-parameters become one call."""

import jax
import jax.numpy as jnp
import optax

import jgsess
from tests.helpers import assert_trees_close, rand
from tests.optax_steps import compare


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
    assert report.session.graph.count("jgsess.adamw") == 1  # inside the branch
    assert_trees_close(fused(params, state, grads, True), jax.jit(step)(params, state, grads, True))
