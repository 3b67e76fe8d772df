"""cast_all: many casts between f32, bf16 and f16 in one call [CastAllFusion].

Operands x_i, results y_i = x_i.astype(dtypes[i]) (static param `dtypes`, dtype names).
Rounding is to nearest even, as XLA's convert.
"""

from __future__ import annotations

import jax.numpy as jnp

from .. import _compat
from .partition import multi_tensor
from .spec import KernelSpec, TensorLists

FLOATS = ("float32", "bfloat16", "float16")


def reference(*operands, dtypes):
    return tuple(x.astype(jnp.dtype(d)) for x, d in zip(operands, dtypes, strict=True))


def _cost_model(node, platform: str) -> tuple[bool, str]:
    # On the CPU a custom call's per-buffer cost outweighs what one call saves over XLA's own
    # converts (which also fuse with their consumers); on a GPU each convert is a launch of its
    # own, and one launch replaces them all (benchmarks/train_step.py's mixed-precision steps).
    if platform == "cpu":
        return False, "XLA's converts are as fast on the CPU and fuse with their consumers"
    if len(node.inputs) < 8:
        return False, "too few casts to save launches"
    return True, f"one launch instead of {len(node.inputs)}"


def _result_avals(avals, static) -> list:
    return [_compat.ShapedArray(a.shape, jnp.dtype(d)) for a, d in zip(avals, static["dtypes"])]


TENSORS = TensorLists(shared=0, operands=1, results=1)  # x -> y, per tensor

SPEC = KernelSpec(
    name="cast_all",
    reference=reference,
    tensors=TENSORS,
    result_avals=_result_avals,
    cost_model=_cost_model,
    factors=multi_tensor(TENSORS),
    doc="multi-tensor cast between f32, bf16 and f16",
)
