"""Kernel specs: one per fused operation, each with a pure-JAX reference beside it."""

from . import adamw, batch_norm, cast_all, global_norm, momentum, relu_mask
from .spec import KernelSpec

__all__ = [
    "KernelSpec",
    "adamw",
    "batch_norm",
    "cast_all",
    "global_norm",
    "momentum",
    "relu_mask",
]
