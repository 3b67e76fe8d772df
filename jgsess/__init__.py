"""jgsess: MindSpore's GPU-session graph optimizations for JAX.

`jgsess.jit(fn)` is a drop-in for `jax.jit` that rewrites the traced program (fused optimizer
updates as XLA FFI custom calls, cast and transpose cleanups, ...) and falls back to plain
`jax.jit` behaviour wherever it cannot help.
"""

from . import optim
from ._api import JgsessFallbackWarning, Jitted, jit
from .kernels import KernelSpec
from .report import Report

__version__ = "0.1.0"

__all__ = ["JgsessFallbackWarning", "Jitted", "KernelSpec", "Report", "jit", "optim"]
