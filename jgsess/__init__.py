"""jgsess: MindSpore's GPU-session graph optimizations for JAX.

`jgsess.jit(fn)` is a drop-in for `jax.jit` that rewrites the traced program (fused optimizer
updates as XLA FFI custom calls, cast and transpose cleanups, ...) and falls back to plain
`jax.jit` behaviour wherever it cannot help.
"""

from . import optim
from ._api import JgsessFallbackWarning, Jitted, jit
from ._version import __version__  # noqa: F401 - the public attribute
from .kernels import KernelSpec
from .report import Report
from .user_kernels import Factors, Kernel, Registration, register_replacement

__all__ = [
    "Factors",
    "JgsessFallbackWarning",
    "Jitted",
    "Kernel",
    "KernelSpec",
    "Registration",
    "Report",
    "jit",
    "optim",
    "register_replacement",
]
