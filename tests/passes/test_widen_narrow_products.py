"""widen-narrow-products: optax's bf16 optimizer state (accumulator_dtype, mu_dtype) reaches the
optimizer kernels; the rewrite alone never changes what jax.jit's program computes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import jgsess
from jgsess.passes import dce, widen_narrow_products
from jgsess.platforms import Target
from tests.helpers import assert_trees_close, evaluate, graph_of, rand, run_passes
from tests.optax_steps import SHAPES, assert_bit_equal, narrow_fused, run_steps

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
STRICT = {"xla_allow_excess_precision": False}
CPU = Target.of(platform="cpu")


def test_the_probe_reads_what_xla_computes_on_the_cpu():
    # the bf16 product in f32, its rounding dropped
    assert widen_narrow_products.xla_widens(CPU, BF16)
    assert not widen_narrow_products.xla_widens(CPU, F16)  # an f16 product is rounded
    assert not widen_narrow_products.xla_widens(
        Target.of(platform="cpu", compiler_options=sorted(STRICT.items())), BF16
    )


def decay(acc, g):  # optax's trace update with a bf16 accumulator: g + f32(0.9 * acc)
    return g + (0.9 * acc).astype(jnp.float32)


def test_the_rewritten_program_equals_jax_jit_bit_for_bit():
    acc, g = rand((4099,), 0).astype(jnp.bfloat16), rand((4099,), 1)
    graph = graph_of(decay, acc, g)
    _, (record, _) = run_passes(graph, [widen_narrow_products.PASS, dce.PASS])
    assert record.rewrites == 1
    (mul,) = [n for n in graph.live() if n.name == "mul"]
    assert mul.outputs[0].dtype == np.float32 and mul.inputs[0].const == np.float32(0.8984375)
    np.testing.assert_array_equal(evaluate(graph, acc, g)[0], jax.jit(decay)(acc, g))


@pytest.mark.parametrize(
    "fn, dtype",
    [
        (decay, jnp.float16),  # XLA rounds the f16 product: widening it would change the numbers
        (lambda acc, g: (lambda d: (g + d.astype(jnp.float32), d))(0.9 * acc), jnp.bfloat16),
        (lambda acc, g: g + (acc * acc).astype(jnp.float32), jnp.bfloat16),  # not a scaling
    ],
    ids=["f16", "product-read-twice", "square"],
)
def test_near_misses_are_not_rewritten(fn, dtype):
    acc, g = rand((37,), 0).astype(dtype), rand((37,), 1)
    graph = graph_of(fn, acc, g)
    _, (record,) = run_passes(graph, [widen_narrow_products.PASS])
    assert record.rewrites == 0


OPTIMIZERS = {
    "sgd-momentum": (optax.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.bfloat16), "momentum"),
    "sgd-cosine": (
        optax.sgd(
            optax.cosine_decay_schedule(0.1, 100), momentum=0.9, accumulator_dtype=jnp.bfloat16
        ),
        "momentum",
    ),
    "adamw": (optax.adamw(1e-3, weight_decay=1e-2, mu_dtype=jnp.bfloat16), "adamw"),
    "adam-warmup-cosine": (
        optax.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 5, 100), mu_dtype=jnp.bfloat16),
        "adamw",
    ),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_bf16_state_is_fused_and_keeps_jax_jits_numbers(name):
    # on the CPU XLA computes the bf16 product in f32 (the probe, above); elsewhere the probe
    # decides on the device, and without the widening the update matches no fusion
    opt, kernel = OPTIMIZERS[name]
    report, text, pairs = run_steps(opt)
    fused = narrow_fused(report, kernel, len(SHAPES), reason=None)
    assert (f'custom_call_target="jgsess_{kernel}"' in text) == fused
    for ours, theirs in pairs:
        # dtypes kept (the state stays bf16); a bf16 value may land one ulp over where the
        # kernel's f32 value is an ulp from XLA's
        assert_trees_close(ours, theirs, rtol=2**-8, atol=1e-7)
        assert_trees_close(ours[0], theirs[0], rtol=1e-5, atol=1e-7)  # the parameters


def test_bf16_nesterov_is_not_fused():
    # the trace decays by bf16(0.9) = 0.8984375, the look-ahead by f32 0.9: no one momentum
    opt = optax.sgd(0.1, momentum=0.9, nesterov=True, accumulator_dtype=jnp.bfloat16)
    report, text, pairs = run_steps(opt)
    assert report.fusions["momentum"] == 0 and "jgsess_momentum" not in text
    assert_bit_equal(pairs)


def test_without_excess_precision_xla_rounds_and_nothing_fuses():
    opt, _ = OPTIMIZERS["sgd-momentum"]
    report, text, pairs = run_steps(opt, compiler_options=STRICT)
    assert report.fusions["momentum"] == 0 and "jgsess_momentum" not in text
    assert_bit_equal(pairs)


def test_a_flax_step_with_a_bf16_first_moment_is_fused():
    # what users write: clipping, a warmup-cosine schedule, weight decay, bf16 mu
    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(5)(nn.relu(nn.Dense(37)(x)))

    model = MLP()
    x, y = rand((16, 11), 0), rand((16, 5), 1)
    params = model.init(jax.random.PRNGKey(2), x)
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 5, 100)
    opt = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, weight_decay=1e-2, mu_dtype=jnp.bfloat16),
    )

    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    state = opt.init(params)
    fused = jgsess.jit(step)
    report = fused.report(params, state, x, y)
    updates_fused = narrow_fused(report, "adamw", 4, reason=None)
    # the norm's clip is folded into the fused updates: with them, or not at all
    assert report.fusions["clip_by_global_norm"] == 4 * updates_fused
    # the norm's own kernel either way; one combined call each
    assert [k.kernel for k in report.kernels] == ["global_norm"] + ["adamw"] * updates_fused
    ours, theirs = fused(params, state, x, y), jax.jit(step)(params, state, x, y)
    assert_trees_close(ours, theirs, rtol=2**-8, atol=1e-7)
