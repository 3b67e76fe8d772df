"""fuse-relu-mask: in a differentiated step a ReLU's backward keeps 1 bit per element
(taken with JGSESS_PREFER=memory; on the CPU it costs speed, so it is not the default)."""

import jax
import jax.numpy as jnp
import pytest

import jgsess
from tests.helpers import assert_trees_close, count, nodes, rand


@pytest.fixture
def prefer_memory(monkeypatch):
    monkeypatch.setenv("JGSESS_PREFER", "memory")


def mlp_loss(params, x):
    h = x
    for w in params:
        h = jax.nn.relu(h @ w)
    return jnp.sum(h**2)


def residual_loss(params, x):
    a = x @ params[0]
    b = x @ params[1]
    return jnp.sum(jax.nn.relu(a + b) ** 2)  # add + relu: the add moves into the kernel


PARAMS = [rand((16, 16), i) * 0.3 for i in range(3)]
X = rand((40, 16), 9)


@pytest.mark.parametrize("loss, fused", [(mlp_loss, 3), (residual_loss, 1)])
def test_fires_in_a_gradient_and_matches(prefer_memory, loss, fused):
    grad = jgsess.jit(jax.grad(loss))
    report = grad.report(PARAMS, X)
    assert report.fusions["relu_mask"] == fused
    assert count(report.session.graph, "gt") == 0
    assert_trees_close(grad(PARAMS, X), jax.jit(jax.grad(loss))(PARAMS, X), rtol=1e-5, atol=1e-6)


def test_the_residual_add_is_absorbed(prefer_memory):
    report = jgsess.jit(jax.grad(residual_loss)).report(PARAMS, X)
    (node,) = nodes(report.session.graph, "relu_mask")
    assert len(node.inputs) == 2  # a and b


def test_not_taken_by_default_on_the_cpu_and_said_so():
    report = jgsess.jit(jax.grad(mlp_loss)).report(PARAMS, X)
    assert report.fusions["relu_mask"] == 0
    assert "not taken: 3 relu_mask" in str(report)


def test_near_misses(prefer_memory):
    def forward_only(params, x):  # no backward: nothing to keep
        return mlp_loss(params, x)

    def mask_used_elsewhere(params, x):
        s = x @ params[0]
        return jnp.sum(jax.nn.relu(s)), jnp.sum(s > 0)

    def leaky(params, x):
        return jnp.sum(jax.nn.leaky_relu(x @ params[0]) ** 2)

    for fn in (forward_only, jax.grad(mask_used_elsewhere, has_aux=True), jax.grad(leaky)):
        fused = jgsess.jit(fn)
        assert fused.report(PARAMS, X).fusions["relu_mask"] == 0
        assert_trees_close(fused(PARAMS, X), jax.jit(fn)(PARAMS, X), rtol=1e-5, atol=1e-6)


def test_relu_derivative_at_zero_is_kept(prefer_memory):
    x0 = jnp.zeros((40, 16)).at[::2].set(1.0)  # many pre-activations exactly 0
    grad = jgsess.jit(jax.grad(mlp_loss))
    assert grad.report(PARAMS, x0).fusions["relu_mask"] == 3
    assert_trees_close(
        grad(PARAMS, x0), jax.jit(jax.grad(mlp_loss))(PARAMS, x0), rtol=1e-5, atol=1e-6
    )
