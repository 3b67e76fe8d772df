"""Kernel specs: one module per fused operation (its pure-JAX reference and its `KernelSpec`),
found by the fusions that create its nodes; nothing lists them here."""

from .spec import KernelSpec

__all__ = ["KernelSpec"]
