"""fuse-batch-norm-relu: training-mode BatchNorm (flax.linen, flax.nnx, plain jnp) + ReLU, or +
add + ReLU, fuses forward and, in a step, backward; near misses keep XLA's code. Numbers match
jax.jit in every case."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jgsess
from tests.helpers import assert_trees_close


def rand(shape, seed, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


class Block(nn.Module):
    """BatchNorm + ReLU, or + residual + ReLU (either order), or a near miss."""

    axis: int = -1
    dtype: object = None
    residual: str = ""  # "", "left" (z + bn), "right" (bn + z)
    act: object = nn.relu
    fast_variance: bool = True
    train: bool = True
    eps: float = 1e-5

    @nn.compact
    def __call__(self, x, z=None):
        y = nn.BatchNorm(
            use_running_average=not self.train,
            axis=self.axis,
            momentum=0.9,
            epsilon=self.eps,
            dtype=self.dtype,
            use_fast_variance=self.fast_variance,
        )(x)
        if self.residual == "left":
            y = z + y
        elif self.residual == "right":
            y = y + z
        return self.act(y)


def linen_step(block, x, z=None):
    """(loss, (grads, new batch stats)) of a linen block, and its variables."""
    variables = block.init(jax.random.PRNGKey(0), x, z)

    def loss(params, stats, x, z):
        y, updates = block.apply(
            {"params": params, "batch_stats": stats}, x, z, mutable=["batch_stats"]
        )
        return jnp.sum(jnp.sin(y.astype(jnp.float32))), updates

    step = jax.value_and_grad(loss, argnums=(0, 2), has_aux=True)
    return step, (variables["params"], variables["batch_stats"], x, z)


def check(fn, args, fused, rtol=2e-5, atol=2e-5):
    """`fused`: fusion name -> count; the custom calls are emitted; numbers match jax.jit."""
    compiled = jgsess.jit(fn)
    report = compiled.report(*args)
    assert report.fallback is None
    got = {k: v for k, v in report.fusions.items() if k.startswith("batch_norm")}
    assert got == fused, got
    text = compiled.lower(*args).as_text()
    for name in fused:
        assert f"jgsess_{name}" in text
    assert_trees_close(compiled(*args), jax.jit(fn)(*args), rtol=rtol, atol=atol)


X = rand((4, 5, 5, 8), 1)
Z = rand((4, 5, 5, 8), 2)
FWD = {"batch_norm_relu": 1}
STEP = {"batch_norm_relu": 1, "batch_norm_relu_grad": 1}
ADD_STEP = {"batch_norm_add_relu": 1, "batch_norm_add_relu_grad": 1}


def test_linen_forward_fires_and_keeps_the_running_statistics_exact():
    block = Block()
    variables = block.init(jax.random.PRNGKey(0), X)

    def forward(variables, x):
        return block.apply(variables, x, mutable=["batch_stats"])

    check(forward, (variables, X), FWD, rtol=1e-5, atol=1e-6)


def test_linen_step_fires_forward_and_backward():
    step, args = linen_step(Block(), X)
    check(step, args, STEP)


def test_residuals_are_reported_beside_xla_memory_analysis():
    step, args = linen_step(Block(), X)
    memory = jgsess.jit(step).report(*args).memory
    ((kind, kept, fused),) = memory.residuals
    assert kind == "batch_norm_relu_grad"
    # the program kept full-size values (x - mean, the ReLU's bool mask, ...); the kernels keep
    # one bit per element and two per-channel vectors
    assert fused == X.size // 32 * 4 + 2 * 8 * 4 and kept >= X.size * 4
    assert "residuals for the backward" in str(memory)


@pytest.mark.parametrize("residual", ["left", "right"])
def test_linen_residual_add_either_order(residual):
    step, args = linen_step(Block(residual=residual), X, Z)
    check(step, args, ADD_STEP)


def test_nchw_two_pass_variance_and_another_rank():
    step, args = linen_step(Block(axis=1, fast_variance=False), rand((4, 6, 3, 5), 3))
    check(step, args, STEP)
    step, args = linen_step(Block(), rand((7, 10), 4))
    check(step, args, STEP)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_narrow_activations_with_f32_statistics(dtype):
    step, args = linen_step(Block(dtype=dtype, residual="left"), X.astype(dtype), Z.astype(dtype))
    check(step, args, ADD_STEP, rtol=2e-2, atol=2e-2)


class NnxBlock(nnx.Module):
    def __init__(self, channels, residual):
        self.bn = nnx.BatchNorm(channels, momentum=0.9, epsilon=1e-5, rngs=nnx.Rngs(0))
        self.residual = residual

    def __call__(self, x, z):
        y = self.bn(x)
        return nnx.relu(y + z if self.residual else y)


@pytest.mark.parametrize("residual", [False, True])
def test_nnx_step(residual):
    graphdef, params, stats = nnx.split(NnxBlock(8, residual), nnx.Param, nnx.BatchStat)

    def loss(params, stats, x, z):
        block = nnx.merge(graphdef, params, stats, copy=True)
        y = block(x, z)
        return jnp.sum(jnp.sin(y)), nnx.state(block, nnx.BatchStat)

    step = jax.value_and_grad(loss, argnums=(0, 2), has_aux=True)
    check(step, (params, stats, X, Z), ADD_STEP if residual else STEP)


def plain_batch_norm(x, gamma, beta, eps=1e-5):
    mean = jnp.mean(x, axis=(0, 1, 2))
    var = jnp.var(x, axis=(0, 1, 2))
    return (x - mean) / jnp.sqrt(var + eps) * gamma + beta, mean, var


def test_plain_jnp_version():
    gamma, beta = rand((8,), 5) + 1.0, rand((8,), 6)

    def loss(gamma, beta, x):
        y, mean, var = plain_batch_norm(x, gamma, beta)
        return jnp.sum(jnp.sin(jax.nn.relu(y))), (mean, var)

    step = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
    check(step, (gamma, beta, X), STEP)


@pytest.mark.parametrize(
    "block",
    [
        Block(train=False),  # eval mode: running statistics, nothing to fuse
        Block(act=nn.gelu),  # another activation
        Block(act=nn.relu6),
    ],
    ids=["eval", "gelu", "relu6"],
)
def test_near_misses_keep_xla_code(block):
    step, args = linen_step(block, X)
    check(step, args, {})


def test_a_second_user_of_the_pre_activation_value_keeps_xla_code():
    bn = nn.BatchNorm(use_running_average=False, momentum=0.9)
    variables = bn.init(jax.random.PRNGKey(0), X)

    def loss(params, stats, x):
        y, updates = bn.apply({"params": params, "batch_stats": stats}, x, mutable=["batch_stats"])
        return jnp.sum(jnp.sin(jax.nn.relu(y))) + jnp.sum(y**2), updates

    step = jax.value_and_grad(loss, argnums=(0, 2), has_aux=True)
    check(step, (variables["params"], variables["batch_stats"], X), {})


def test_epsilon_outside_the_square_root_keeps_xla_code():
    gamma, beta = rand((8,), 5) + 1.0, rand((8,), 6)

    def loss(gamma, beta, x):
        mean, var = jnp.mean(x, axis=(0, 1, 2)), jnp.var(x, axis=(0, 1, 2))
        y = (x - mean) / (jnp.sqrt(var) + 1e-5) * gamma + beta
        return jnp.sum(jnp.sin(jax.nn.relu(y)))

    check(jax.grad(loss, argnums=(0, 1, 2)), (gamma, beta, X), {})


class DeepNet(nn.Module):
    """`blocks` conv + BatchNorm + ReLU blocks: a backward pass thousands of nodes deep."""

    blocks: int

    @nn.compact
    def __call__(self, x, z=None):
        for _ in range(self.blocks):
            x = Block()(nn.Conv(8, (1, 1), use_bias=False)(x))
        return x


def test_a_deep_network_fuses_every_block():
    # the constant-operand walk of the rewrite recursed through the whole backward pass and ran
    # out of stack at about 100 blocks, so the pipeline fell back to jax.jit
    blocks = 120
    step, args = linen_step(DeepNet(blocks), X)
    report = jgsess.jit(step).report(*args)
    assert report.fallback is None
    fused = {k: v for k, v in report.fusions.items() if k.startswith("batch_norm")}
    assert fused == {"batch_norm_relu": blocks, "batch_norm_relu_grad": blocks}


class Bottleneck(nn.Module):
    """A ResNet-50 bottleneck block (flax examples' ResNet, channels last)."""

    filters: int

    @nn.compact
    def __call__(self, x):
        norm = functools.partial(nn.BatchNorm, use_running_average=False, momentum=0.9)
        y = nn.relu(norm()(nn.Conv(self.filters, (1, 1), use_bias=False)(x)))
        y = nn.relu(norm()(nn.Conv(self.filters, (3, 3), use_bias=False)(y)))
        y = norm(scale_init=nn.initializers.zeros_init())(
            nn.Conv(self.filters * 4, (1, 1), use_bias=False)(y)
        )
        residual = norm()(nn.Conv(self.filters * 4, (1, 1), use_bias=False)(x))
        return nn.relu(residual + y)


def test_resnet_bottleneck_step():
    block = Bottleneck(4)
    x = rand((2, 6, 6, 8), 7)
    variables = block.init(jax.random.PRNGKey(0), x)

    def loss(params, stats, x):
        y, updates = block.apply(
            {"params": params, "batch_stats": stats}, x, mutable=["batch_stats"]
        )
        return jnp.mean(y**2), updates

    step = jax.value_and_grad(loss, has_aux=True)
    fused = {**STEP, **ADD_STEP}
    fused["batch_norm_relu"] = fused["batch_norm_relu_grad"] = 2
    check(step, (variables["params"], variables["batch_stats"], x), fused, rtol=1e-4, atol=1e-5)
