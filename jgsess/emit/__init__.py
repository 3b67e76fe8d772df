"""Emission: run the optimized graph as jax operations, re-traced into a jaxpr."""

from .interpreter import emit, to_closed_jaxpr

__all__ = ["emit", "to_closed_jaxpr"]
