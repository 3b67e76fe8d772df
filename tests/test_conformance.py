"""Conformance: jgsess.jit(f) equals jax.jit(f) on a corpus of real programs."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import jgsess
from tests.helpers import assert_trees_close, rand

CASES: dict[str, tuple] = {}


def case(*args, static=(), rtol=1e-6, atol=1e-6):
    def register(fn):
        CASES[fn.__name__] = (fn, args, static, rtol, atol)
        return fn

    return register


X, Y = rand((8, 5)), rand((8, 5), 1)
W = rand((5, 3), 2)


@case(X, Y)
def elementwise_math(x, y):
    return jnp.exp(-jnp.abs(x)) * jnp.log1p(jnp.abs(y)) - jnp.tanh(x) / (1 + y**2)


@case(X, W)
def matmul_softmax(x, w):
    return jax.nn.softmax(x @ w, axis=-1)


@case(X)
def reductions(x):
    return x.mean(0), x.var(1), x.max(), jnp.argmax(x, axis=1), jnp.linalg.norm(x)


@case({"a": X, "b": (Y, W)})
def pytrees_in_and_out(tree):
    return {"sum": tree["a"] + tree["b"][0], "pair": [tree["b"][1].T, None]}


@case(X, 2, static=(1,))
def static_argument(x, k):
    return jnp.reshape(x, (k, -1)) * k


@case(X)
def cond_branches(x):
    return lax.cond(x.sum() > 0, lambda a: a * 2, lambda a: -a, x)


@case(jnp.float32(1.5))
def while_loop(x):
    return lax.while_loop(lambda s: s[0] < 10, lambda s: (s[0] + 1, s[1] * 1.1), (0, x))


@case(X)
def scan_cumulative(x):
    return lax.scan(lambda c, row: (c + row, c * row), jnp.zeros(5), x)


@case(X)
def fori_loop(x):
    return lax.fori_loop(0, 4, lambda i, a: a + jnp.sin(a) * i, x)


@case(W, X)
def grad_inside(w, x):
    return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)


@case(X, W)
def vmap_inside(x, w):
    return jax.vmap(lambda row: jnp.dot(row, w) + row.sum())(x)


@case(X)
def activations(x):
    return jax.nn.relu(x), jax.nn.gelu(x), jax.nn.softplus(x), jax.nn.silu(x)


@case(jnp.arange(12, dtype=jnp.int32).reshape(3, 4))
def integers(i):
    return i // 3, i % 5, i << 1, jnp.bitwise_xor(i, 7), i.sum(), -i


@case(X > 0, Y > 0)
def booleans(a, b):
    return a & ~b, jnp.logical_xor(a, b), jnp.where(a, 1, 2), a.all(), b.any(0)


@case(X.astype(jnp.float16), Y.astype(jnp.float16))
def float16(a, b):
    return a * b + jnp.float16(1), (a @ b.T).astype(jnp.float32)


@case(X.astype(jnp.bfloat16), Y)
def bfloat16_mixed(a, y):
    return (
        a * 2,
        (a.astype(jnp.float32) + y).astype(jnp.bfloat16),
        a.astype(jnp.float32).astype(jnp.bfloat16),
    )


@case(jnp.zeros((0, 4)), jnp.zeros((3, 0)))
def zero_size(a, b):
    return a.sum(0), b * 2, jnp.concatenate([a, a]), b.T @ jnp.zeros((3, 2))


@case(2.5, 3)
def python_scalars(a, n):
    return a * n + 1, jnp.sin(a)


@case(jax.random.PRNGKey(0))
def random_raw_keys(key):
    k1, k2 = jax.random.split(key)
    return jax.random.normal(k1, (4,)), jax.random.uniform(k2, (2, 2)), k2


@case(jax.random.key(3))
def random_typed_keys(key):
    keys = jax.random.split(key, 3)
    return jax.random.bernoulli(keys[0], 0.3, (5,)), keys[1:]


@case(X, W)
def transposes_and_reshapes(x, w):
    t = jnp.transpose(jnp.transpose(x.reshape(2, 4, 5), (0, 2, 1)), (0, 2, 1))
    return t.reshape(8, 5) @ w, x.T.T + x.T.T


@case(X.astype(jnp.bfloat16))
def cast_round_trips(a):
    return a.astype(jnp.float32).astype(jnp.bfloat16) * 2, a.astype(jnp.float16).astype(
        jnp.bfloat16
    )


@case(X, jnp.array([0, 2, 2, 7]))
def gather_scatter(x, idx):
    return x[idx], x.at[idx].add(1.0), x.at[idx, 1].set(-1.0), jnp.take(x, idx, axis=0)


@case(X)
def sorting(x):
    return jnp.sort(x, axis=1), jnp.argsort(x[:, 0]), lax.top_k(x, 2)


@case(X)
def cumulative(x):
    return jnp.cumsum(x, 0), jnp.cumprod(x * 0.1 + 1, 1), lax.cummax(x, 1)


@case(rand((2, 3, 4)), rand((4, 5), 1))
def einsum(a, b):
    return jnp.einsum("ijk,kl->ijl", a, b), jnp.einsum("ijk->k", a)


@case(X)
def effects_in_order(x):
    jax.debug.print("mean={m}", m=x.mean())
    y = jnp.sin(x)
    jax.debug.callback(lambda v: None, y.sum())
    return y


@jax.custom_jvp
def safe_log(x):
    return jnp.log(jnp.maximum(x, 1e-6))


safe_log.defjvp(lambda p, t: (safe_log(p[0]), t[0] / jnp.maximum(p[0], 1e-6)))


@case(jnp.abs(X))
def custom_jvp_and_grad(x):
    return safe_log(x), jax.grad(lambda a: safe_log(a).sum())(x)


@jax.custom_vjp
def clip_gradient(x):
    return x


clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))


@case(X)
def custom_vjp_and_grad(x):
    return jax.grad(lambda a: (clip_gradient(a) * 3).sum())(x)


@case(jnp.array([1.0, jnp.inf, -jnp.inf, jnp.nan, 0.0, -0.0]))
def non_finite_values(x):
    return jnp.where(jnp.isfinite(x), x, 0.0), 1 / x, x * 0.0, jnp.nan_to_num(x), x + 0.0


@case(X + 1j * Y)
def complex_numbers(z):
    return jnp.abs(z), z * z.conj(), jnp.fft.fft(z, axis=0).real


@case(W, X)
def remat_in_grad(w, x):
    block = jax.checkpoint(lambda w: jnp.sin(x @ w))
    return jax.grad(lambda w: block(w).sum())(w)


@case(X, Y)
def nested_jit(x, y):
    inner = jax.jit(lambda a, b: a * b + 1)
    return inner(x, y) + inner(y, x)


@case(X, jnp.arange(8) % 3)
def cross_entropy_grad(logits, labels):
    def loss(lg):
        return optax.softmax_cross_entropy_with_integer_labels(lg[:, :3], labels).mean()

    return jax.value_and_grad(loss)(logits)


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(16)(x))
        return nn.Dense(3)(x)


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.Conv(8, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.relu(x)
        return nn.Dense(4)(x.mean((1, 2)))


def _mlp_state():
    model = MLP()
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 5)))
    opt = optax.adamw(1e-3, weight_decay=1e-4)
    return model, params, opt, opt.init(params)


_MLP = _mlp_state()


@case(_MLP[1], _MLP[3], X, jnp.arange(8) % 3)
def flax_mlp_adamw_step(params, opt_state, x, y):
    model, _, opt, _ = _MLP

    def loss(p):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value


def _cnn_state():
    model = CNN()
    variables = model.init(jax.random.PRNGKey(1), jnp.ones((2, 6, 6, 3)))
    opt = optax.sgd(0.05, momentum=0.9)
    return model, variables, opt, opt.init(variables["params"])


_CNN = _cnn_state()


@case(_CNN[1], _CNN[3], rand((2, 6, 6, 3), 5), jnp.array([1, 3]), rtol=1e-5, atol=1e-6)
def flax_cnn_batchnorm_momentum_step(variables, opt_state, x, y):
    model, _, opt, _ = _CNN

    def loss(p):
        logits, updates = model.apply(
            {"params": p, "batch_stats": variables["batch_stats"]}, x, mutable=["batch_stats"]
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), updates

    (value, updates), grads = jax.value_and_grad(loss, has_aux=True)(variables["params"])
    deltas, opt_state = opt.update(grads, opt_state, variables["params"])
    params = optax.apply_updates(variables["params"], deltas)
    return {"params": params, **updates}, opt_state, value


@case({"w": W, "b": jnp.zeros(3)}, X)
def optax_adam_chain_step(params, x):
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    state = opt.init(params)

    def loss(p):
        return jnp.mean((x @ p["w"] + p["b"]) ** 2)

    grads = jax.grad(loss)(params)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state


def test_corpus_is_large_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_jgsess_jit_equals_jax_jit(name):
    fn, args, static, rtol, atol = CASES[name]
    want = jax.jit(fn, static_argnums=static)(*args)
    got = jgsess.jit(fn, static_argnums=static)(*args)
    assert_trees_close(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "name", ["elementwise_math", "matmul_softmax", "activations", "scan_cumulative"]
)
def test_grad_of_jgsess_jit_equals_grad_of_jax_jit(name):
    fn, args, static, rtol, atol = CASES[name]

    def scalar(f):
        return lambda a, *rest: sum(
            jnp.sum(leaf)
            for leaf in jax.tree.leaves(f(a, *rest))
            if jnp.issubdtype(leaf.dtype, jnp.floating)
        )

    got = jax.grad(scalar(jgsess.jit(fn)))(*args)
    want = jax.grad(scalar(jax.jit(fn)))(*args)
    assert_trees_close(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_equal(np.isfinite(np.asarray(got)).all(), True)


def test_flax_train_step_fuses_every_parameter_update():
    fn, args, *_ = CASES["flax_mlp_adamw_step"]
    assert jgsess.jit(fn).report(*args).fusions["adamw"] == len(jax.tree.leaves(args[0]))
