"""fuse-adamw: fires on unmodified optax and MindSpore-style code, never on near misses,
and the fused step equals the unfused one."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import jgsess
from jgsess.kernels import adamw
from jgsess.platforms import Target
from jgsess.selection import numerics_match
from tests.helpers import assert_trees_close, rand, xla_fuses_f16_multiply_adds
from tests.optax_steps import (
    SHAPES,
    assert_bit_equal,
    assert_within_ulp,
    compare,
    narrow_fused,
    run_steps,
    tree,
)

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)

N = len(SHAPES)
CPU = Target.of(platform="cpu")


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
    from jgsess.passes.fusions.engine import pattern_fusion
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

    probe = pattern_fusion("probe", rules, needs=fuse_adamw.NEEDS).as_pass()
    params = tree(0)

    def sgd(p, g):
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    probe.run(from_jaxpr(jax.make_jaxpr(sgd)(params, params)), Context())
    assert traced == []
    opt = optax.adamw(1e-3)
    step = jax.make_jaxpr(lambda p, g, s: opt.update(g, s, p))(params, params, opt.init(params))
    probe.run(from_jaxpr(step), Context())
    assert traced == [True]


# updates written in bf16 (optax keeps a bf16 parameter's mu and nu in bf16): the kernel's
# narrow form, every operation rounded to bf16 as XLA's CPU code computes it (elsewhere, as the
# probe finds XLA's code there)
NARROW = {
    "adamw": optax.adamw(1e-3, weight_decay=1e-4),  # b2 = 0.999 is 1.0 in bf16
    "adam-b2": optax.adam(1e-2, b2=0.99),
    "adam-eps-root": optax.adam(1e-3, eps_root=1e-8),
    "warmup-cosine": optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 50)),
    "update-only": optax.chain(optax.scale_by_adam(), optax.scale(-1e-3)),
}


@pytest.mark.parametrize("name", NARROW)
def test_an_update_written_in_bf16_fuses_bit_for_bit(name):
    report, text, pairs = run_steps(NARROW[name], dtype=jnp.bfloat16)
    fused = narrow_fused(report, "adamw", N)
    assert [k.kernel for k in report.kernels] == (["adamw"] if fused else [])  # one call
    assert ('custom_call_target="jgsess_adamw"' in text) == fused
    assert_bit_equal(pairs)


def test_the_probe_reads_how_xla_rounds_narrow_updates_on_the_cpu():
    flags = adamw.OPTAX_ADAMW | adamw.Flag.NARROW
    assert numerics_match(CPU, adamw.SPEC, flags, BF16)
    # XLA's CPU code divides an f16 array by a scalar through an f16 reciprocal
    assert not numerics_match(CPU, adamw.SPEC, flags, F16)
    # and where it has native f16 arithmetic, computes a * b + c with one rounding
    plain = flags & ~adamw.Flag.BIAS_CORRECTION
    assert numerics_match(CPU, adamw.SPEC, plain, F16) != xla_fuses_f16_multiply_adds()


@pytest.mark.parametrize(
    "opt, dtype",
    [
        (optax.adamw(1e-3, eps=1e-4), jnp.float16),  # the probe: XLA's f16 rounds otherwise
        (optax.adamw(1e-3), jnp.float16),  # eps = 1e-8 is 0.0 in f16: no form without eps
        (optax.nadam(1e-3), jnp.bfloat16),
        (optax.adamw(1e-3, mu_dtype=jnp.float16), jnp.bfloat16),  # mu neither bf16 nor f32
        (optax.adamw(1e-3, mu_dtype=jnp.float32), jnp.float16),  # mixed forms are bf16's
    ],
    ids=["f16", "f16-eps", "nadam", "f16-mu", "f16-f32-mu"],
)
def test_narrow_near_misses_keep_xlas_code(opt, dtype):
    report, text, pairs = run_steps(opt, dtype=dtype)
    assert report.fusions["adamw"] == 0 and "jgsess_adamw" not in text
    assert_bit_equal(pairs)


# bf16 parameters with an f32 first moment (optax keeps nu in bf16): the kernel's mixed form
MIXED = {
    "adamw": optax.adamw(1e-3, weight_decay=1e-4, mu_dtype=jnp.float32),
    "adam-b2": optax.adam(1e-2, b2=0.99, mu_dtype=jnp.float32),
    "adam-eps-root": optax.adam(1e-3, eps_root=1e-8, mu_dtype=jnp.float32),
    "cosine": optax.adamw(optax.cosine_decay_schedule(1e-2, 100), mu_dtype=jnp.float32),
    "warmup-cosine": optax.adamw(
        optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 50), mu_dtype=jnp.float32
    ),
    "chain": optax.chain(optax.scale_by_adam(mu_dtype=jnp.float32), optax.scale(-1e-3)),
}


def mixed_fuses_on_the_cpu() -> bool:
    """Whether XLA's CPU code computes the mixed update as the kernel does (rounding the second
    moment to bf16, leaving narrow results read only in f32 unrounded): the fusion's probe."""
    flags = adamw.OPTAX_ADAMW | adamw.Flag.MIXED
    return numerics_match(CPU, adamw.SPEC, flags, BF16, wide_slots=(2,))


@pytest.mark.parametrize("name", MIXED)
def test_bf16_parameters_with_an_f32_first_moment_fuse(name):
    report, text, pairs = run_steps(MIXED[name], dtype=jnp.bfloat16)
    # the mixed form's f32 moment meets a bf16 gradient through widen-narrow-products' probe
    fused = narrow_fused(report, "adamw", N, on_the_cpu=mixed_fuses_on_the_cpu(), reason=None)
    assert [k.kernel for k in report.kernels] == (["adamw"] if fused else [])  # one call
    assert ('custom_call_target="jgsess_adamw"' in text) == fused
    # XLA contracts some of the f32 multiply-adds, by the size of the array: an ulp apart at
    # most, as f32 updates are (benchmarks/optimizer_ulp.py)
    assert_within_ulp(pairs)


def test_the_report_says_why_an_f16_update_is_not_fused():
    with jax.default_device(jax.devices("cpu")[0]):  # where XLA's f16 rounds otherwise
        report, _, _ = run_steps(optax.adamw(1e-3, eps=1e-4), steps=1, dtype=jnp.float16)
    assert "float16 arithmetic on cpu rounds unlike the kernel's" in str(report)


@pytest.mark.parametrize("mu_dtype", [None, jnp.float32], ids=["bf16-state", "f32-mu"])
def test_a_flax_model_with_bf16_parameters_fuses_bit_for_bit(mu_dtype):
    # what users write: a flax model in bf16 (optax keeps mu and nu in bf16, or mu in f32 where
    # asked), weight decay, a warmup-cosine schedule; the whole step under jgsess.jit equals
    # jax.jit's, step by step
    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            dense = functools.partial(nn.Dense, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
            return dense(5)(nn.relu(dense(37)(x)))

    model = MLP()
    x, y = rand((16, 11), 0).astype(jnp.bfloat16), rand((16, 5), 1).astype(jnp.bfloat16)
    params = model.init(jax.random.PRNGKey(2), x)
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 100)
    opt = optax.adamw(schedule, weight_decay=1e-2, mu_dtype=mu_dtype)

    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    state = opt.init(params)
    fused, plain = jgsess.jit(step), jax.jit(step)
    report = fused.report(params, state, x, y)
    fuses = narrow_fused(
        report,
        "adamw",
        4,
        on_the_cpu=mu_dtype is None or mixed_fuses_on_the_cpu(),
        reason="rounds unlike" if mu_dtype is None else None,
    )
    assert [k.kernel for k in report.kernels] == (["adamw"] if fuses else [])
    ours = theirs = (params, state)
    for _ in range(3):
        ours, theirs = fused(*ours[:2], x, y), plain(*theirs[:2], x, y)
        if mu_dtype is None:
            assert_bit_equal([(ours, theirs)])
        else:  # f32 multiply-adds: see test_bf16_parameters_with_an_f32_first_moment_fuse
            assert_within_ulp([(ours, theirs)])
