"""The compiled kernels (`jgsess._C`): which FFI targets exist, for which platforms.

Every target is registered with `jax.ffi.register_ffi_target` when jgsess is imported, so a
program carrying `jgsess_*` custom calls (a deserialized `jax.export` artifact, say) runs in any
process that has imported jgsess. Without the extension (a source checkout that was never
built) every fused node runs its pure-JAX reference.
"""

from __future__ import annotations

import functools
import warnings

import jax

# FFI registration platform -> jax lowering platform (the kernel platform, jgsess/platforms.py)
_LOWERING_PLATFORM = {"cpu": "cpu", "CUDA": "cuda"}
KERNEL_PLATFORMS = frozenset(_LOWERING_PLATFORM.values())


@functools.cache
def _module():
    try:
        from .. import _C
    except ImportError as err:
        warnings.warn(
            f"jgsess._C is not built ({err}); fused nodes will run their pure-JAX references. "
            "Build it with `pip install --no-build-isolation -e .`",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return _C


@functools.cache
def targets() -> dict[str, frozenset[str]]:
    """FFI target name -> the jax lowering platforms it has a compiled kernel for."""
    module = _module()
    if module is None:
        return {}
    found: dict[str, frozenset[str]] = {}
    for name, platforms in module.registrations().items():
        lowered = set()
        for platform, capsule in platforms.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
            lowered.add(_LOWERING_PLATFORM[platform])
        found[name] = frozenset(lowered)
    return found


targets()  # register every FFI target at import
