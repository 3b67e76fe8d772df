"""Fused optimizers: optax transformations whose update runs as one multi-tensor kernel call.

`adamw`, `adam` and `sgd` take exactly optax's arguments and return
`optax.GradientTransformationExtraArgs` with optax's state, numerically equal to optax's:
their update is optax's own, compiled by `jgsess.jit`, whose passes turn the per-parameter
updates into one multi-tensor kernel. They take and ignore optax's extra update arguments.
`adam_weight_decay` and `momentum` are MindSpore's `nn.AdamWeightDecay` and `nn.Momentum`.

`f32_math(tx)` is the one change of numbers: bf16/f16 state computed in f32 and rounded once
when stored, as torch's fused optimizers compute it.

`fused_step(tx)` goes one step further: `(params, grads, state) -> (params, state)` with the
parameters updated inside the kernel (in place when donated), no separate `apply_updates` pass.
It works with any optax transformation; the kernels take over where the update is one of
theirs.

    >>> tx = jgsess.optim.adamw(1e-3, weight_decay=1e-2)
    >>> state = tx.init(params)
    >>> step = jgsess.optim.fused_step(tx)
    >>> params, state = step(params, grads, state)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from ._api import jit

ScalarOrSchedule = float | jax.Array | Callable


def _describe(tree) -> str:
    text = str(jax.tree.structure(tree))
    return text if len(text) < 200 else text[:197] + "..."


def check_trees(name: str, grads, params) -> None:
    """Clear errors for what would otherwise fail deep inside a trace, or not at all."""
    if params is None:
        return
    if jax.tree.structure(grads) != jax.tree.structure(params):  # type: ignore[operator]
        raise ValueError(
            f"{name}: gradients and parameters are different trees:\n"
            f"  gradients:  {_describe(grads)}\n  parameters: {_describe(params)}"
        )
    for (path, g), p in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(params)):
        where = jax.tree_util.keystr(path) or "the parameter"
        if not jnp.issubdtype(jnp.result_type(p), jnp.inexact):
            raise TypeError(
                f"{name}: {where} has dtype {jnp.result_type(p)}; optimizers update "
                "floating-point parameters (keep integer state out of the optimized tree)"
            )
        if jnp.shape(g) != jnp.shape(p):
            raise ValueError(
                f"{name}: gradient {where} has shape {jnp.shape(g)}, parameter {jnp.shape(p)}"
            )


def _fused(name: str, inner: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    compiled = jit(inner.update)

    @functools.wraps(inner.update)
    def update(updates, state, params=None, **extra_args):
        # optax's update takes extra arguments (value, grad, ...); these transformations ignore
        # them, as optax's own do
        del extra_args
        check_trees(name, updates, params)
        return compiled(updates, state, params)

    return optax.GradientTransformationExtraArgs(inner.init, update)


def adamw(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype=None,
    weight_decay: ScalarOrSchedule = 1e-4,
    mask=None,
    *,
    nesterov: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """AdamW as `optax.adamw` (same arguments in the same order, state and numbers), fused.

    Args:
      learning_rate: a float, or a schedule `step -> learning rate`.
      b1, b2: decay rates of the first and second moments.
      eps, eps_root: added outside and inside the square root of the second moment.
      mu_dtype: dtype of the first moment (None: the parameters'). The kernels read and write
        a bf16 moment where XLA computes its decay in f32
        (passes/widen_narrow_products.py); otherwise the update runs as XLA's code.
      weight_decay: decoupled weight decay, multiplied by the learning rate.
      mask: a tree of bools (or a function of the params giving one): where to decay.
      nesterov: Nesterov momentum (runs as XLA's code: no kernel computes it).

    Returns:
      An `optax.GradientTransformationExtraArgs`, as `optax.adamw`.
    """
    inner = optax.adamw(
        learning_rate, b1, b2, eps, eps_root, mu_dtype, weight_decay, mask, nesterov=nesterov
    )
    return _fused("jgsess.optim.adamw", inner)


def adam(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype=None,
    *,
    nesterov: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """Adam as `optax.adam` (same arguments, state and numbers), fused; see `adamw`."""
    inner = optax.adam(learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov)
    return _fused("jgsess.optim.adam", inner)


def sgd(
    learning_rate: ScalarOrSchedule,
    momentum: float | None = None,
    nesterov: bool = False,
    accumulator_dtype=None,
) -> optax.GradientTransformationExtraArgs:
    """SGD as `optax.sgd` (same arguments, state and numbers); with `momentum` (and
    `nesterov`) the update is fused; a bf16 `accumulator_dtype` too (without `nesterov`, whose
    look-ahead uses the unrounded momentum), where XLA computes its decay in f32."""
    inner = optax.sgd(learning_rate, momentum, nesterov, accumulator_dtype)
    return _fused("jgsess.optim.sgd", inner)


class AdamWeightDecayState(NamedTuple):
    count: jax.Array  # type: ignore[assignment]  # optax's field name, shadowing tuple.count
    m: optax.Updates
    v: optax.Updates


def _learning_rate(learning_rate: ScalarOrSchedule, count):
    return learning_rate(count) if callable(learning_rate) else learning_rate


def _f32_zeros(params):
    return jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params)


def _need_params(name: str, weight_decay: float, params) -> None:
    if weight_decay and params is None:
        raise ValueError(f"jgsess.optim.{name}: weight decay needs the params")


def adam_weight_decay(
    learning_rate: ScalarOrSchedule,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.0,
) -> optax.GradientTransformationExtraArgs:
    """MindSpore's `nn.AdamWeightDecay`: Adam without bias correction, eps outside the root.

        m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
        update = -lr * (m / (eps + sqrt(v)) + weight_decay*p)

    Moments are kept in f32 whatever the parameters' dtype.
    """

    def init(params):
        return AdamWeightDecayState(
            jnp.zeros([], jnp.int32), _f32_zeros(params), _f32_zeros(params)
        )

    def update(grads, state, params=None):
        _need_params("adam_weight_decay", weight_decay, params)
        lr = _learning_rate(learning_rate, state.count)
        g32 = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        m = jax.tree.map(lambda m, g: beta1 * m + (1 - beta1) * g, state.m, g32)
        v = jax.tree.map(lambda v, g: beta2 * v + (1 - beta2) * jnp.square(g), state.v, g32)

        def step(m, v, p):
            u = m / (eps + jnp.sqrt(v))
            if weight_decay:
                u = weight_decay * p.astype(jnp.float32) + u
            return -(lr * u)

        updates = jax.tree.map(step, m, v, params if params is not None else m)
        return updates, AdamWeightDecayState(optax.safe_increment(state.count), m, v)

    return _fused("jgsess.optim.adam_weight_decay", optax.GradientTransformation(init, update))


class MomentumState(NamedTuple):
    count: jax.Array  # type: ignore[assignment]  # optax's field name, shadowing tuple.count
    acc: optax.Updates


def momentum(
    learning_rate: ScalarOrSchedule,
    momentum: float,
    weight_decay: float = 0.0,
    loss_scale: float = 1.0,
) -> optax.GradientTransformationExtraArgs:
    """MindSpore's `nn.Momentum` with weight decay and a loss scale [ApplyMomentum...Fusion].

        g~ = (p*weight_decay + g) / loss_scale;  acc = momentum*acc + g~;  update = -lr*acc

    The accumulator is kept in f32 whatever the parameters' dtype.
    """

    def init(params):
        return MomentumState(jnp.zeros([], jnp.int32), _f32_zeros(params))

    def update(grads, state, params=None):
        _need_params("momentum", weight_decay, params)
        lr = _learning_rate(learning_rate, state.count)

        def gradient(g, p):
            g = g.astype(jnp.float32)
            if weight_decay:
                g = p.astype(jnp.float32) * weight_decay + g
            return g * (1.0 / loss_scale) if loss_scale != 1.0 else g

        g = jax.tree.map(gradient, grads, params if params is not None else grads)
        acc = jax.tree.map(lambda a, g: momentum * a + g, state.acc, g)
        updates = jax.tree.map(lambda a: -(lr * a), acc)
        return updates, MomentumState(optax.safe_increment(state.count), acc)

    return _fused("jgsess.optim.momentum", optax.GradientTransformation(init, update))


def _narrow(x) -> bool:
    return jnp.result_type(x) in (jnp.bfloat16, jnp.float16)


def f32_math(tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """`tx` computed in f32 on bf16/f16 parameters, gradients and state: each value rounded once
    to its dtype when stored, as torch's fused optimizers compute (optax, and so `jgsess.jit`
    and the other `jgsess.optim` transformations, compute an update of bf16 state in bf16,
    rounding every operation). A change of numbers, closer to an f32 update; on the CPU the
    kernels run it at the speed of memory rather than of the roundings.

    The state keeps `tx`'s dtypes; the updates are f32, so `optax.apply_updates` (and
    `fused_step`) rounds each new parameter once.

      >>> tx = jgsess.optim.f32_math(jgsess.optim.adamw(1e-3))    # or of optax.adamw(1e-3)
      >>> params, state = jgsess.optim.fused_step(tx)(params, grads, state)
    """
    update = getattr(tx.update, "__wrapped__", tx.update)

    def widen(tree):
        return jax.tree.map(lambda x: x.astype(jnp.float32) if _narrow(x) else x, tree)

    def in_f32(grads, state, params=None):
        updates, new_state = update(widen(grads), widen(state), widen(params))
        stored = jax.tree.map(lambda new, old: new.astype(jnp.result_type(old)), new_state, state)
        return updates, stored

    in_f32.__name__ = getattr(update, "__name__", "update")
    return _fused("jgsess.optim.f32_math", optax.GradientTransformation(tx.init, in_f32))


def fused_step(tx: optax.GradientTransformation, *, donate: bool = True):
    """`(params, grads, state) -> (params, state)`: update and apply in one compiled step.

    With `donate` (the default) params and state are donated, so the fused kernels write them
    in place: no second copy of either, no separate `apply_updates` pass over the parameters.
    """
    update = getattr(tx.update, "__wrapped__", tx.update)

    def step(params, grads, state):
        check_trees("jgsess.optim.fused_step", grads, params)
        updates, state = update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return jit(step, donate_argnums=(0, 2) if donate else None)
