"""fuse-momentum: optax sgd (momentum, nesterov, chained weight decay) and MindSpore's
ApplyMomentum forms fire; near misses do not; numbers match."""

import jax
import jax.numpy as jnp
import optax
import pytest

import jgsess
from jgsess.kernels import momentum
from tests.helpers import assert_trees_close, count, nodes, rand, xla_fuses_f16_multiply_adds
from tests.optax_steps import SHAPES, assert_bit_equal, compare, narrow_fused, run_steps

N = len(SHAPES)


@pytest.mark.parametrize(
    "opt",
    [
        optax.sgd(0.1, momentum=0.9),
        optax.sgd(0.05, momentum=0.5, nesterov=True),
        optax.chain(optax.add_decayed_weights(1e-4), optax.sgd(0.1, momentum=0.9)),
        optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(0.1, momentum=0.9, nesterov=True)),
        optax.sgd(optax.exponential_decay(0.1, 10, 0.5), momentum=0.9),
        optax.inject_hyperparams(optax.sgd)(learning_rate=0.1, momentum=0.9),
    ],
    ids=["momentum", "nesterov", "decay", "decay-nesterov", "schedule", "inject"],
)
def test_fires_on_unmodified_optax(opt):
    report = compare(opt)
    assert report.fusions["momentum"] == N
    assert [k.kernel for k in report.kernels] == ["momentum"]  # one multi-tensor call


def test_nesterov_is_recognized_as_nesterov():
    # p - lr*(g + mu*acc2) also has the shape of a plain momentum step whose "accumulator" is
    # acc2; the Nesterov form must win, keeping acc2 as the state
    report = compare(optax.sgd(0.05, momentum=0.5, nesterov=True))
    flags = [n.params["flags"] for n in nodes(report.session.graph, "momentum")]
    assert flags == [momentum.Flag.NESTEROV]


@pytest.mark.parametrize(
    "opt",
    [
        optax.sgd(0.1),
        # XLA's CPU compiler rounds the f16 decay product
        # (tests/passes/test_widen_narrow_products.py)
        optax.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.float16),
        optax.noisy_sgd(0.1, key=0),
    ],
    ids=["no-momentum", "f16-accumulator", "noisy"],
)
def test_near_misses_do_not_fire(opt):
    assert compare(opt).fusions["momentum"] == 0


def apply_momentum(p, acc, g, lr=0.1, mu=0.9):  # MindSpore ApplyMomentum, by hand
    acc = acc * mu + g
    return p - lr * acc, acc


def weight_decay_scale(p, acc, g, lr=0.1, mu=0.9, wd=1e-4, scale=1 / 1024):
    # ApplyMomentum(var, acc, lr, Mul(AddN(Mul(var, wd), Cast(g)), scale), mu)
    g = (p * wd + g.astype(jnp.float32)) * scale
    return apply_momentum(p, acc, g, lr, mu)


def scale_only(p, acc, g, lr=0.1, mu=0.9, scale=1 / 1024):
    return apply_momentum(p, acc, g * scale, lr, mu)


@pytest.mark.parametrize("fn", [apply_momentum, weight_decay_scale, scale_only])
def test_fires_on_mindspore_forms(fn):
    args = [rand((37, 3), s) for s in range(3)]
    fused = jgsess.jit(fn)
    assert fused.report(*args).fusions["momentum"] == 1
    assert_trees_close(fused(*args), jax.jit(fn)(*args), rtol=2e-6, atol=1e-7)


def test_half_precision_loss_scaled_gradient_is_read_as_is():
    # the f16 gradient's cast is folded into the kernel [ReplaceMomentumCastFusion]
    args = [rand((50,), 0), rand((50,), 1), rand((50,), 2).astype(jnp.float16)]
    fused = jgsess.jit(weight_decay_scale)
    report = fused.report(*args)
    assert report.fusions["momentum"] == 1
    assert count(report.session.graph, "convert_element_type") == 0
    assert_trees_close(fused(*args), jax.jit(weight_decay_scale)(*args), rtol=2e-6, atol=1e-7)


def test_momentum_on_a_value_used_elsewhere_does_not_fire():
    def leaky(p, acc, g):
        acc2 = acc * 0.9 + g
        step = 0.1 * acc2
        return p - step, acc2, step.sum()  # the step escapes

    args = [rand((8,), s) for s in range(3)]
    fused = jgsess.jit(leaky)
    assert fused.report(*args).fusions["momentum"] == 0
    assert_trees_close(fused(*args), jax.jit(leaky)(*args))


def test_kernel_for_large_and_small_tensors_alike():
    # the CPU kernel stages narrow operands in L1-sized blocks and splits work by bytes across
    # tensor boundaries, so small tensors no longer need XLA's loops (benchmarks/optimizer_step.py)
    opt = optax.sgd(0.1, momentum=0.9, nesterov=True)
    large = compare(opt, params={"w": rand((300, 300)), "b": rand((70_000,), 1)})
    small = compare(opt)
    for report in (large, small):
        (choice,) = report.kernels
        assert choice.impl == "kernel"


@pytest.mark.parametrize(
    "opt, dtype",
    [
        (optax.sgd(0.1, momentum=0.9), jnp.bfloat16),
        (optax.sgd(optax.cosine_decay_schedule(0.1, 100), momentum=0.9), jnp.bfloat16),
        (optax.sgd(0.05, momentum=0.5, nesterov=True), jnp.bfloat16),
        (optax.chain(optax.add_decayed_weights(1e-4), optax.sgd(0.1, momentum=0.9)), jnp.bfloat16),
        (optax.sgd(0.1, momentum=0.9), jnp.float16),
    ],
    ids=["momentum", "cosine", "nesterov", "decay", "f16"],
)
def test_an_update_written_in_its_narrow_dtype_fuses_bit_for_bit(opt, dtype, monkeypatch):
    # optax keeps a narrow parameter's accumulator in its dtype: the kernel's narrow form,
    # every operation rounded as XLA's CPU code rounds it; where XLA's f16 code contracts
    # multiply-adds (native f16 arithmetic) the kernel's bits would differ, and XLA's code stays.
    # The kernel taken wherever it fuses (f16's is measured: test_selection)
    monkeypatch.setenv("JGSESS_KERNELS", "on:momentum")
    on_the_cpu = dtype != jnp.float16 or not xla_fuses_f16_multiply_adds()
    report, text, pairs = run_steps(opt, dtype=dtype)
    fuses = narrow_fused(report, "momentum", N, on_the_cpu)
    assert ('custom_call_target="jgsess_momentum"' in text) == fuses
    assert_bit_equal(pairs)


@pytest.mark.parametrize(
    "opt", [optax.sgd(0.1), optax.noisy_sgd(0.1, key=0)], ids=["no-momentum", "noisy"]
)
def test_narrow_near_misses_keep_xlas_code(opt):
    report, text, pairs = run_steps(opt, dtype=jnp.bfloat16)
    assert report.fusions["momentum"] == 0 and "jgsess_momentum" not in text
    assert_bit_equal(pairs)
