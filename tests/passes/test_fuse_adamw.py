"""fuse-adamw: fires on unmodified optax and MindSpore-style code, never on near misses,
and the fused step equals the unfused one."""

import jax
import jax.numpy as jnp
import optax
import pytest

import jgsess
from tests.helpers import assert_trees_close, rand
from tests.optax_steps import SHAPES, compare, tree

N = len(SHAPES)


@pytest.mark.parametrize(
    "opt, fused",
    [
        (optax.adamw(1e-3, weight_decay=1e-4), N),
        (optax.adamw(3e-4, b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.1), N),
        (optax.adam(1e-2), N),
        (optax.adam(1e-2, eps_root=1e-8), N),
        (optax.adamw(optax.cosine_decay_schedule(1e-3, 100), weight_decay=1e-2), N),
        (optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3, b1=0.9, weight_decay=1e-3), N),
        (optax.adamw(1e-3, weight_decay=1e-2, mask=lambda p: {k: k.startswith("w") for k in p}), N),
        (optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)), N),
    ],
    ids=["adamw", "adamw-hparams", "adam", "adam-eps-root", "schedule", "inject", "mask", "clip"],
)
def test_fires_on_unmodified_optax(opt, fused):
    report = compare(opt)
    assert report.fusions["adamw"] == fused


@pytest.mark.parametrize(
    "opt",
    [
        optax.adamax(1e-3),
        optax.nadam(1e-3),
        optax.adamw(1e-3, nesterov=True),
        optax.amsgrad(1e-3),
        optax.adabelief(1e-3),
        optax.yogi(1e-3),
        optax.lamb(1e-3),
        optax.lion(1e-4),
        optax.rmsprop(1e-3),
        optax.radam(1e-3),
        optax.novograd(1e-3),
    ],
    ids=[
        "adamax",
        "nadam",
        "adamw-nesterov",
        "amsgrad",
        "adabelief",
        "yogi",
        "lamb",
        "lion",
        "rmsprop",
        "radam",
        "novograd",
    ],
)
def test_near_misses_do_not_fire_and_stay_correct(opt):
    report = compare(opt, rtol=1e-5, atol=1e-6)
    assert report.fusions["adamw"] == 0


def ms_adam_weight_decay(p, m, v, g, lr=1e-3, b1=0.9, b2=0.999, eps=1e-6, wd=1e-2):
    # MindSpore's nn.AdamWeightDecay update, written by hand
    next_m = b1 * m + (1 - b1) * g
    next_v = b2 * v + (1 - b2) * jnp.square(g)
    update = next_m / (eps + jnp.sqrt(next_v))
    update = wd * p + update
    return p - lr * update, next_m, next_v


def ms_adam(p, m, v, g, lr=1e-3, b1=0.9, b2=0.999, eps=1e-6):
    next_m = b1 * m + (1 - b1) * g
    next_v = b2 * v + (1 - b2) * (g * g)
    return p - lr * (next_m / (eps + jnp.sqrt(next_v))), next_m, next_v


@pytest.mark.parametrize("fn", [ms_adam_weight_decay, ms_adam])
def test_fires_on_mindspore_forms(fn):
    args = [rand((37, 3), s) for s in range(3)] + [0.1 * rand((37, 3), 3)]
    args[2] = jnp.abs(args[2])
    fused = jgsess.jit(fn)
    assert fused.report(*args).fusions["adamw"] == 1
    assert_trees_close(fused(*args), jax.jit(fn)(*args), rtol=2e-6, atol=1e-7)


def test_mindspore_form_with_the_decay_on_the_wrong_tensor_does_not_fire():
    def near(p, m, v, g, lr=1e-3, b1=0.9, b2=0.999, eps=1e-6, wd=1e-2):
        next_m = b1 * m + (1 - b1) * g
        next_v = b2 * v + (1 - b2) * jnp.square(g)
        update = wd * g + next_m / (eps + jnp.sqrt(next_v))  # decays g, not p
        return p - lr * update, next_m, next_v

    args = [rand((5,), s) for s in range(4)]
    args[2] = jnp.abs(args[2])
    fused = jgsess.jit(near)
    assert fused.report(*args).fusions["adamw"] == 0
    assert_trees_close(fused(*args), jax.jit(near)(*args))


def test_an_intermediate_used_elsewhere_blocks_the_fusion():
    def leaky(p, m, v, g, lr=1e-3, b1=0.9, b2=0.999, eps=1e-6):
        next_m = b1 * m + (1 - b1) * g
        next_v = b2 * v + (1 - b2) * (g * g)
        direction = next_m / (eps + jnp.sqrt(next_v))
        return p - lr * direction, next_m, next_v, direction.sum()  # the direction escapes

    args = [rand((6,), s) for s in range(4)]
    args[2] = jnp.abs(args[2])
    fused = jgsess.jit(leaky)
    assert fused.report(*args).fusions["adamw"] == 0
    assert_trees_close(fused(*args), jax.jit(leaky)(*args))


def test_f64_and_mixed_shapes_are_declined():
    def mixed(p, m, v, g):
        return ms_adam(p, m, v, g)

    args = [rand((4, 3), s) for s in range(3)] + [rand((3,), 3)]  # g broadcasts
    args[2] = jnp.abs(args[2])
    fused = jgsess.jit(mixed)
    assert fused.report(*args).fusions["adamw"] == 0
    assert_trees_close(fused(*args), jax.jit(mixed)(*args))


def test_fused_update_runs_as_a_custom_call_in_place():
    opt = optax.adamw(1e-3)
    params = tree(0)
    state = opt.init(params)
    from tests.optax_steps import update_step

    step = jgsess.jit(update_step(opt), donate_argnums=(0, 1))
    text = step.lower(params, state, tree(1)).as_text()
    assert "jgsess_adamw" in text
    assert "tf.aliasing_output" in text or "output_operand_alias" in text


def test_a_scaled_step_whose_moments_are_dropped_does_not_fire():
    # `lr*u` is the scaled form's root, but with nothing keeping the new moments it is not an
    # optimizer step: a kernel would only spend bandwidth writing them
    def direction(p, m, v, g, lr=1e-3, b1=0.9, b2=0.999, eps=1e-6):
        next_m = b1 * m + (1 - b1) * g
        next_v = b2 * v + (1 - b2) * (g * g)
        return lr * (next_m / (jnp.sqrt(next_v) + eps))

    args = [rand((6,), s) for s in range(4)]
    args[2] = jnp.abs(args[2])
    fused = jgsess.jit(direction)
    assert fused.report(*args).fusions["adamw"] == 0
    assert_trees_close(fused(*args), jax.jit(direction)(*args))


def test_every_form_needs_a_sqrt_and_a_graph_without_one_never_traces_them():
    from jgsess.ir.build import from_jaxpr
    from jgsess.passes.fusions import fuse_adamw
    from jgsess.passes.fusions.engine import fusion_pass
    from jgsess.passes.manager import Context
    from jgsess.patterns.matcher import pattern_nodes
    from jgsess.patterns.pat import Pat

    for rule in fuse_adamw._rules():  # the gate is sound: no form matches without a sqrt
        nodes = pattern_nodes(rule.pattern.root).values()
        assert any(isinstance(n, Pat) and n.ops <= fuse_adamw.NEEDS for n in nodes)

    traced = []

    def rules():
        traced.append(True)
        return fuse_adamw._rules()

    probe = fusion_pass("probe", rules, needs=fuse_adamw.NEEDS)
    params = tree(0)

    def sgd(p, g):
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    probe.run(from_jaxpr(jax.make_jaxpr(sgd)(params, params)), Context())
    assert traced == []
    opt = optax.adamw(1e-3)
    step = jax.make_jaxpr(lambda p, g, s: opt.update(g, s, p))(params, params, opt.init(params))
    probe.run(from_jaxpr(step), Context())
    assert traced == [True]
