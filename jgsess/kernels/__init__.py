"""Kernel specs: one per fused operation, each with a pure-JAX reference beside it."""

from . import adamw
from .spec import KernelSpec

SPECS: dict[str, KernelSpec] = {spec.name: spec for spec in (adamw.SPEC,)}

__all__ = ["SPECS", "KernelSpec", "adamw"]
