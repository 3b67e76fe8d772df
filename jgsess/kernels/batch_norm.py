"""batch_norm_relu, batch_norm_add_relu and their gradients: training-mode BatchNorm fused with
ReLU (and a residual add) [BatchNormWithActivation, BatchNormWithAddAndActivation,
BatchNormGradWithActivation, BatchNormGradWithAddAndActivation].

Forward: (x, scale, bias[, z]) -> (y, mean, var, mask). Over every axis but `axis` (the
features): mean, biased var, t = (x - mean) * (rsqrt(var + eps) * scale) + bias rounded to
`dtype`, s = t (+ z, in `dtype`), y = relu(s), and bit i of `mask` is s_i > 0 (packed as
`relu_mask` packs it, in its shape). mean and var come out in `stats_shape`, the program's
shape with the channel dimension written -1 (`stats_layout`).

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
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _compat, autotune
from .partition import Factors
from .relu_mask import mask_factors, mask_shape, pack, unpack
from .spec import KernelSpec

# csrc/kernels/batch_norm/batch_norm.h: BnSplits (one split per SPLIT_ELEMENTS elements, at
# most SPLITS_MAX and SPLIT_BYTES of f64 pairs)
SPLITS_MAX, SPLIT_ELEMENTS, SPLIT_BYTES = 256, 16384, 1 << 20


def _expand(v, ndim: int, axis: int):
    """A per-channel vector shaped to broadcast against x (unit dimensions elsewhere)."""
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def _reduced(ndim: int, axis: int) -> tuple[int, ...]:
    return tuple(d for d in range(ndim) if d != axis)


def _mean(v, axes: tuple, split: tuple):
    """v's mean over `axes`; with `split` (inside a partitioned call, the mesh axes x is split
    over), the mean over the whole array: the local sums added across those devices."""
    if not split:
        return v.mean(axes)
    return lax.psum(v.sum(axes), split) / _count(v.shape, axes, split)


def _count(shape, axes, split):
    return math.prod(shape[a] for a in axes) * lax.psum(1, split)


def flax_form(x, scale, bias, *residual, eps, axis, dtype, fast=True, split=()):
    """flax.linen / flax.nnx BatchNorm in training mode (their `_compute_stats` and
    `_normalize`), then the residual add: (s, mean, var), s before the ReLU. `split`: see
    `_mean`."""
    axes = _reduced(x.ndim, axis)
    xs = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    if fast:  # flax squares x before it takes the means: the backward's sums follow that order
        square = lax.square(xs)
        mean = _mean(xs, axes, split)
        var = jnp.maximum(0.0, _mean(square, axes, split) - lax.square(mean))
    else:
        mean = _mean(xs, axes, split)
        var = _mean(lax.square(xs - jnp.expand_dims(mean, axes)), axes, split)
    y = x - jnp.expand_dims(mean, axes)
    mul = lax.rsqrt(jnp.expand_dims(var, axes) + eps)
    mul = mul * _expand(scale, x.ndim, axis)
    y = y * mul
    y = y + _expand(bias, x.ndim, axis)
    s = jnp.asarray(y, dtype)
    return (s + residual[0] if residual else s), mean, var


def plain_form(x, scale, bias, *residual, eps, axis, dtype, split=()):
    """The textbook version in jnp: (x - mean) / sqrt(var + eps) * scale + bias."""
    axes = _reduced(x.ndim, axis)
    if split:
        mean = _mean(x, axes, split)
        var = _mean(lax.square(x - _expand(mean, x.ndim, axis)), axes, split)
    else:
        mean = jnp.mean(x, axes)
        var = jnp.var(x, axes)
    y = (x - _expand(mean, x.ndim, axis)) / _expand(jnp.sqrt(var + eps), x.ndim, axis)
    s = jnp.asarray(y * _expand(scale, x.ndim, axis) + _expand(bias, x.ndim, axis), dtype)
    return (s + residual[0] if residual else s), mean, var


# name -> (x, scale, bias, *residual, eps, axis, dtype) -> (s, mean, var)
FORMS: dict[str, Callable] = {
    "flax": flax_form,
    "flax_two_pass": functools.partial(flax_form, fast=False),
    "plain": plain_form,
}


def forward(x, scale, bias, *residual, eps, axis, form, dtype, stats_shape, split=()):
    """`split`: see `_mean` (the mask is x's part of the whole mask)."""
    s, mean, var = FORMS[form](
        x, scale, bias, *residual, eps=eps, axis=axis, dtype=dtype, split=split
    )
    return jax.nn.relu(s), mean.reshape(stats_shape), var.reshape(stats_shape), pack(s > 0)


def backward(dy, x, scale, mean, var, mask, *, eps, axis, form, dtype, add, split=()):
    """The derivative of `form` as jax differentiates it (the program's own backward), with
    the ReLU's gate from the mask. mean and var are recomputed (the kernel reads them).
    `split`: see `_split_backward`."""
    g = jnp.where(unpack(mask, dy.shape), dy, jnp.zeros((), dy.dtype))
    if split:
        grads = _split_backward(g, x, scale, mean, var, eps=eps, axis=axis, split=split)
        return (*grads, g) if add else grads

    def pre_activation(x, scale, bias):
        return FORMS[form](x, scale, bias, eps=eps, axis=axis, dtype=dtype)[0]

    _, vjp = jax.vjp(pre_activation, x, scale, jnp.zeros_like(scale))
    grads = vjp(g)
    return (*grads, g) if add else grads


def _split_backward(g, x, scale, mean, var, *, eps, axis, split):
    """The backward on one device's part of x (split over the mesh axes `split`), from the
    forward's (whole-array) mean and var: the kernel's closed form, whose two per-channel sums
    are added across the devices in one all-reduce."""
    axes = _reduced(x.ndim, axis)
    g32 = g.astype(jnp.float32)
    xc = x.astype(jnp.float32) - _expand(mean, x.ndim, axis)
    sum_g, sum_gxc = lax.psum((g32.sum(axes), (g32 * xc).sum(axes)), split)
    count = _count(x.shape, axes, split)
    inv = lax.rsqrt(var.reshape(-1) + eps)
    a, b, c = (_expand(v, x.ndim, axis) for v in (scale * inv, sum_g / count, sum_gxc / count))
    dx = a * (g32 - b - xc * (_expand(inv * inv, x.ndim, axis) * c))
    return dx.astype(x.dtype), inv * sum_gxc, sum_g


def _splits(x_aval, axis: int) -> int:
    size = int(np.prod(x_aval.shape, dtype=np.int64))
    by_bytes = SPLIT_BYTES // (16 * max(1, x_aval.shape[axis]))
    return max(1, min(-(-size // SPLIT_ELEMENTS), by_bytes, SPLITS_MAX))


def _workspace(x_index: int):
    def bytes_(static, avals) -> int:
        x = avals[x_index]
        channels = x.shape[static["axis"]]
        return _splits(x, static["axis"]) * 2 * channels * 8 + 16 * channels

    return bytes_


def stats_layout(shape: tuple, channels: int) -> tuple:
    """The static `stats_shape` of statistics of `shape`: their channel dimension (the last
    of `channels` values) as -1, so that a per-device call on part of the channels keeps it."""
    last = max(i for i, n in enumerate(shape) if n == channels)
    return tuple(-1 if i == last else n for i, n in enumerate(shape))


def _stats_shape(stats_layout: tuple, channels: int) -> tuple:
    return tuple(channels if n == -1 else n for n in stats_layout)


def _forward_avals(avals, static):
    x = avals[0]
    shape = _stats_shape(static["stats_shape"], x.shape[static["axis"]])
    stats = _compat.ShapedArray(shape, np.dtype(np.float32))
    return [
        _compat.ShapedArray(x.shape, np.dtype(static["dtype"])),
        stats,
        stats,
        _compat.ShapedArray(mask_shape(x.shape), np.dtype(np.uint32)),
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


def _factors(x_index: int):
    """The sharding rule: x (and dy, z, and their gradients) split alike with the mask, the
    per-channel vectors with x's feature dimension; the statistics sum over every other
    factor. None where the mask is flat (it cannot follow a split)."""

    def factors(static, avals) -> Factors | None:
        shape = avals[x_index].shape
        if len(mask_shape(shape)) != len(shape):
            return None
        x, mask, sizes, replicated = mask_factors(shape)
        axis = static["axis"]
        feature = x[axis]
        layout = static.get("stats_shape") or stats_layout(avals[3].shape, shape[axis])
        units = {i: f"stat{i}" for i, n in enumerate(layout) if n != -1}  # size-1 dimensions
        stats = tuple(units.get(i, feature) for i in range(len(layout)))
        replicated = (*replicated, *units.values())
        summed = tuple(d if isinstance(d, str) else d[0] for i, d in enumerate(x) if i != axis)
        channel = (feature,)
        if x_index == 0:  # (x, scale, bias[, z]) -> (y, mean, var, mask)
            operands = (x, channel, channel, *(x,) * (len(avals) - 3))
            results = (x, stats, stats, mask)
        else:  # (dy, x, scale, mean, var, mask) -> (dx, dscale, dbias[, dz])
            operands = (x, x, channel, stats, stats, mask)
            results = (x, channel, channel, *(x,) * static["add"])
        return Factors(operands, results, sizes, replicated, summed)

    return factors


def _per_shard(reference, x_index: int):
    """Per device: the kernel where each device holds every element of its channels; where x
    is split over mesh axes the statistics need all devices' sums, so the reference runs with
    them added across those axes (one all-reduce, as XLA partitions the program's own code)."""

    def per_shard(bind, operands, axes, static) -> list:
        split = tuple(dict.fromkeys(axes[1 + x_index]))  # operand 0 is the arena
        if not split:
            return bind(*operands)
        return [*reference(*operands[1:], **static, split=split), operands[0]]

    return per_shard


def _spec(name: str, reference, avals, x_index: int, doc: str) -> KernelSpec:
    return KernelSpec(
        name=name,
        reference=reference,
        attrs=_attrs,
        result_avals=avals,
        workspace=_workspace(x_index),
        factors=_factors(x_index),
        per_shard=_per_shard(reference, x_index),
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


def program_fn(form: str, train: bool, eps: float, axis: int, dtype):
    """The program the kernels replace (the BatchNorm fusion's example, autotune's XLA side):
    `FORMS[form]` + ReLU (forward: -> y, mean, var), with `jax.vjp` (train: the last argument is
    dy; -> y, mean, var and the input gradients)."""
    formula = functools.partial(FORMS[form], eps=eps, axis=axis, dtype=dtype)

    def with_relu(*primals):
        s, mean, var = formula(*primals)
        return jax.nn.relu(s), (mean, var)

    def fn(*args):
        if not train:
            y, (mean, var) = with_relu(*args)
            return y, mean, var
        y, vjp, (mean, var) = jax.vjp(with_relu, *args[:-1], has_aux=True)
        return (y, mean, var, *vjp(args[-1]))

    return fn


def measured_sides(specs, params, avals, train: bool) -> autotune.Sides:
    """For jgsess.autotune: the kernels `specs` (forward, and backward in training) with these
    static `params` per spec, and the program they replace, on operands of `avals`."""
    rng = np.random.default_rng(0)
    operands = [autotune.random_operand(a, rng) for a in avals]
    static = params[0]
    fn = program_fn(static["form"], train, static["eps"], static["axis"], np.dtype(static["dtype"]))
    sizes = [spec.workspace(p, [avals[0], avals[0]]) for spec, p in zip(specs, params)]
    count = len(avals) - int(train)

    def kernels(arenas, *ops):
        first = {**params[0], "impl": "kernel", "aliases": (), "workspace": (0, sizes[0])}
        outs, _ = specs[0].apply(ops[:count], first, arenas[0])
        if not train:
            return outs[:3]
        grad = {**params[1], "impl": "kernel", "aliases": (), "workspace": (0, sizes[-1])}
        grads, _ = specs[1].apply([ops[-1], *ops[:2], *outs[1:4]], grad, arenas[1])
        return (*outs[:3], *grads)

    def program(arenas, *ops):
        return fn(*ops)

    arenas = tuple(np.zeros((size,), np.uint8) for size in sizes)
    return autotune.Sides(kernels, program, [arenas, *operands])
