"""Kernel specs: one per fused operation, each with a pure-JAX reference beside it."""

from . import adamw, cast_all, global_norm, momentum, relu_mask
from .spec import KernelSpec

SPECS: dict[str, KernelSpec] = {
    s.name: s
    for s in (
        adamw.SPEC,
        momentum.SPEC,
        cast_all.SPEC,
        global_norm.SPEC,
        relu_mask.FORWARD,
        relu_mask.BACKWARD,
    )
}

__all__ = ["SPECS", "KernelSpec", "adamw", "cast_all", "global_norm", "momentum", "relu_mask"]
