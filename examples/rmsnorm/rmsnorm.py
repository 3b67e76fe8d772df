"""A fused RMSNorm kernel of your own, put into unmodified flax and jnp models by jgsess.

    build()      compiles rmsnorm.cc against jax's FFI headers (once; again when it changes)
    load()       builds it and registers its two FFI targets with jax (once per process)
    register()   registers with jgsess the code they replace: flax.linen's and flax.nnx's
                 RMSNorm and a jnp one, forward and, for the gradient with respect to x,
                 backward; returns the registrations (each a context manager)

Nothing here is jgsess's own code: a user's kernel, built the user's way.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
import sysconfig

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

import jgsess

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "rmsnorm.cc")
EPS = 1e-6  # flax's default epsilon: the example's attribute; any literal eps matches
# the kernel sums a row in another order than XLA's code: a few ulps apart
TOLERANCE = (1e-5, 1e-5)


def build(out_dir: str = HERE) -> str:
    """Compile rmsnorm.cc into `out_dir`/_rmsnorm.so (skipped when newer than its source)."""
    library = os.path.join(out_dir, "_rmsnorm" + sysconfig.get_config_var("SHLIB_SUFFIX"))
    if os.path.exists(library) and os.path.getmtime(library) >= os.path.getmtime(SOURCE):
        return library
    command = [
        os.environ.get("CXX", "g++"),
        "-O3",
        "-march=native",
        "-fopenmp-simd",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-isystem",
        jax.ffi.include_dir(),
        SOURCE,
        "-o",
        library,
    ]
    print("building:", " ".join(command), file=sys.stderr)
    subprocess.run(command, check=True)
    return library


# ---- the code the kernels replace: each spelling the models use ----------------------------


def linen_rms_norm(x, scale, eps):
    return nn.RMSNorm(epsilon=eps).apply({"params": {"scale": scale}}, x)


def nnx_rms_norm(x, scale, eps):
    norm = nnx.RMSNorm(x.shape[-1], epsilon=eps, rngs=nnx.Rngs(0))
    norm.scale.value = scale
    return norm(x)


def jnp_rms_norm(x, scale, eps):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * scale


FORMS = {"linen": linen_rms_norm, "nnx": nnx_rms_norm, "jnp": jnp_rms_norm}


def dx_of(forward):
    """The gradient with respect to x of `forward`, as jax's transpose writes it."""

    def dx(x, scale, dy, eps):
        return jax.vjp(lambda x: forward(x, scale, eps), x)[1](dy)[0]

    dx.__name__ = f"{forward.__name__}_dx"
    return dx


@functools.cache
def load(out_dir: str = HERE) -> ctypes.CDLL:
    """Build the kernels and register their FFI targets with jax (once per process)."""
    library = ctypes.cdll.LoadLibrary(build(out_dir))
    jax.ffi.register_ffi_target("rms_norm", jax.ffi.pycapsule(library.RmsNorm), platform="cpu")
    jax.ffi.register_ffi_target("rms_norm_dx", jax.ffi.pycapsule(library.RmsNormDx), platform="cpu")
    return library


def register(forms=tuple(FORMS), backward: bool = True) -> list[jgsess.Registration]:
    """Register the kernels with jgsess for the RMSNorm spellings `forms` (keys of FORMS), the
    backward too unless told not to (after `load()`); the registrations."""
    forward = jgsess.Kernel("rms_norm", tolerance=TOLERANCE, sharding=row_wise)
    dx = jgsess.Kernel("rms_norm_dx", tolerance=TOLERANCE, sharding=row_wise)
    x, scale = jnp.ones((4, 32)), jnp.ones((32,))
    found = []
    for form in forms:
        fn = FORMS[form]
        found.append(
            jgsess.register_replacement(
                fn,
                forward,
                (x, scale, EPS),
                attrs=("eps",),
                extra_check=takes,
                name=f"rms_norm_{form}",
            )
        )
        if backward:
            found.append(
                jgsess.register_replacement(
                    dx_of(fn),
                    dx,
                    (x, scale, x, EPS),
                    attrs=("eps",),
                    extra_check=takes,
                    name=f"rms_norm_dx_{form}",
                )
            )
    return found


def takes(found: dict) -> bool:
    """What the kernels compute on: f32 rows of x, one scale per feature. The search functions
    match more (a scale broadcast by an enclosing vmap, bf16 activations): not for this kernel."""
    x, scale = found["x"], found["scale"]
    arrays = [a for a in found.values() if hasattr(a, "dtype")]
    return (
        scale.ndim == 1
        and x.ndim >= 1
        and x.shape[-1] == scale.shape[0]
        and all(a.dtype == jnp.float32 for a in arrays)
    )


def row_wise(attrs: dict, avals: list) -> jgsess.Factors:
    """The kernels' sharding rule: rows split as x's leading dimensions are, each row whole
    (a row's features are summed: that factor is never split)."""
    lead = tuple(f"b{i}" for i in range(len(avals[0].shape) - 1))
    row = (*lead, "d")
    operands = tuple(row if len(a.shape) > 1 else ("d",) for a in avals)
    return jgsess.Factors(operands, (row,), replicated=("d",))
