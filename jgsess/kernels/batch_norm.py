"""batch_norm_relu, batch_norm_add_relu and their gradients: training-mode BatchNorm fused with
ReLU (and a residual add) [BatchNormWithActivation, BatchNormWithAddAndActivation,
BatchNormGradWithActivation, BatchNormGradWithAddAndActivation].

Forward: (x, scale, bias[, z]) -> (y, mean, var, mask). Over every axis but `axis` (the
features): mean, biased var, t = (x - mean) * (rsqrt(var + eps) * scale) + bias rounded to
`dtype`, s = t (+ z, in `dtype`), y = relu(s), and bit i of `mask` is s_i > 0 (packed as
`relu_mask` packs it). mean and var come out in `stats_shape`, as the program had them.

Backward: (dy, x, scale, mean, var, mask) -> (dx, dscale, dbias[, dz]): BatchNorm's input and
parameter gradients from g = where(mask, dy, 0); dz = g, the gradient of the residual.

`form` names the formula the program spelled (FORMS: flax's fast or two-pass variance, or the
textbook one); the references compute exactly it, and its derivative as jax takes it, so a node
left to XLA gives the program's own numbers. The kernels compute the statistics from shifted
sums in f64 (stable where flax's E[x^2] - E[x]^2 in f32 is not) and the backward from the
closed form dx = scale * inv * (g - mean(g) - (x - mean) * inv^2 * mean(g * (x - mean))):
they agree with the references to float32 rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _compat
from .relu_mask import pack, unpack
from .spec import KernelSpec

SPLITS_MAX = 64  # csrc/kernels/batch_norm/batch_norm.h: BnSplits


def _expand(v, ndim: int, axis: int):
    """A per-channel vector shaped to broadcast against x (unit dimensions elsewhere)."""
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def _reduced(ndim: int, axis: int) -> tuple[int, ...]:
    return tuple(d for d in range(ndim) if d != axis)


def flax_form(x, scale, bias, *residual, eps, axis, dtype, fast=True):
    """flax.linen / flax.nnx BatchNorm in training mode (their `_compute_stats` and
    `_normalize`), then the residual add: (s, mean, var), s before the ReLU."""
    axes = _reduced(x.ndim, axis)
    xs = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    if fast:  # flax squares x before it takes the means: the backward's sums follow that order
        square = lax.square(xs)
        mean = xs.mean(axes)
        var = jnp.maximum(0.0, square.mean(axes) - lax.square(mean))
    else:
        mean = xs.mean(axes)
        var = lax.square(xs - jnp.expand_dims(mean, axes)).mean(axes)
    y = x - jnp.expand_dims(mean, axes)
    mul = lax.rsqrt(jnp.expand_dims(var, axes) + eps)
    mul = mul * _expand(scale, x.ndim, axis)
    y = y * mul
    y = y + _expand(bias, x.ndim, axis)
    s = jnp.asarray(y, dtype)
    return (s + residual[0] if residual else s), mean, var


def plain_form(x, scale, bias, *residual, eps, axis, dtype):
    """The textbook version in jnp: (x - mean) / sqrt(var + eps) * scale + bias."""
    axes = _reduced(x.ndim, axis)
    mean = jnp.mean(x, axes)
    var = jnp.var(x, axes)
    y = (x - _expand(mean, x.ndim, axis)) / _expand(jnp.sqrt(var + eps), x.ndim, axis)
    s = jnp.asarray(y * _expand(scale, x.ndim, axis) + _expand(bias, x.ndim, axis), dtype)
    return (s + residual[0] if residual else s), mean, var


# name -> (x, scale, bias, *residual, eps, axis, dtype) -> (s, mean, var)
FORMS = {
    "flax": flax_form,
    "flax_two_pass": functools.partial(flax_form, fast=False),
    "plain": plain_form,
}


def forward(x, scale, bias, *residual, eps, axis, form, dtype, stats_shape):
    s, mean, var = FORMS[form](x, scale, bias, *residual, eps=eps, axis=axis, dtype=dtype)
    return jax.nn.relu(s), mean.reshape(stats_shape), var.reshape(stats_shape), pack(s > 0)


def backward(dy, x, scale, mean, var, mask, *, eps, axis, form, dtype, add):
    """The derivative of `form` as jax differentiates it (the program's own backward), with
    the ReLU's gate from the mask. mean and var are recomputed (the kernel reads them)."""
    del mean, var
    g = jnp.where(unpack(mask, dy.shape), dy, jnp.zeros((), dy.dtype))

    def pre_activation(x, scale, bias):
        return FORMS[form](x, scale, bias, eps=eps, axis=axis, dtype=dtype)[0]

    _, vjp = jax.vjp(pre_activation, x, scale, jnp.zeros_like(scale))
    grads = vjp(g)
    return (*grads, g) if add else grads


def _splits(x_aval, axis: int) -> int:
    return min(SPLITS_MAX, max(1, -(-int(np.prod(x_aval.shape, dtype=np.int64)) // 65536)))


def _workspace(x_index: int):
    def bytes_(static, avals) -> int:
        x = avals[x_index]
        channels = x.shape[static["axis"]]
        return _splits(x, static["axis"]) * 2 * channels * 8 + 16 * channels

    return bytes_


def _forward_avals(avals, static):
    x = avals[0]
    stats = _compat.ShapedArray(tuple(static["stats_shape"]), np.dtype(np.float32))
    words = -(-int(np.prod(x.shape, dtype=np.int64)) // 32)
    return [
        _compat.ShapedArray(x.shape, np.dtype(static["dtype"])),
        stats,
        stats,
        _compat.ShapedArray((words,), np.dtype(np.uint32)),
    ]


def _backward_avals(avals, static):
    dy, x, scale = avals[:3]
    grads = [
        _compat.ShapedArray(x.shape, x.dtype),
        _compat.ShapedArray(scale.shape, np.dtype(np.float32)),
        _compat.ShapedArray(scale.shape, np.dtype(np.float32)),
    ]
    if static["add"]:
        grads.append(_compat.ShapedArray(dy.shape, dy.dtype))
    return grads


def _attrs(static) -> dict:
    return {"eps": np.float32(static["eps"]), "axis": np.int64(static["axis"])}


def _spec(name: str, reference, avals, x_index: int, doc: str) -> KernelSpec:
    return KernelSpec(
        name=name,
        reference=reference,
        attrs=_attrs,
        result_avals=avals,
        workspace=_workspace(x_index),
        doc=doc,
    )


FORWARD = _spec("batch_norm_relu", forward, _forward_avals, 0, "BatchNorm (training) + ReLU")
ADD_FORWARD = _spec(
    "batch_norm_add_relu", forward, _forward_avals, 0, "BatchNorm (training) + add + ReLU"
)
BACKWARD = _spec(
    "batch_norm_relu_grad", backward, _backward_avals, 1, "gradient of BatchNorm + ReLU"
)
ADD_BACKWARD = _spec(
    "batch_norm_add_relu_grad", backward, _backward_avals, 1, "gradient of BatchNorm + add + ReLU"
)
