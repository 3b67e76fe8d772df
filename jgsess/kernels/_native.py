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

from .. import _config
from ..platforms import kernel_platform

# FFI registration platform -> jax lowering platform (the kernel platform, jgsess/platforms.py)
_LOWERING_PLATFORM = {"cpu": "cpu", "CUDA": "cuda"}
KERNEL_PLATFORMS = frozenset(_LOWERING_PLATFORM.values())


@functools.cache
def _module():
    """jgsess._C, or None where it cannot be loaded for any reason: not built, built for another
    system (an OSError naming a missing library symbol), failing in its own init. JGSESS_STRICT=1
    raises the cause instead."""
    try:
        from .. import _C
    except Exception as err:  # noqa: BLE001 - any failure to load falls back to the references
        if _config.strict():
            raise
        warnings.warn(
            f"jgsess._C could not be loaded ({type(err).__name__}: {err}); fused nodes will run "
            "their pure-JAX references. Build it on this system with "
            "`pip install --no-build-isolation -e .` (or `make build`)",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    _C.cap_simd(_config.simd_cap())
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


# The CUDA kernels' tensor tables travel by value, up to 32 KB of kernel arguments: driver 12.1+.
MIN_CUDA_DRIVER = 12010


def driver_floor(build: dict) -> int:
    """The oldest CUDA driver (as cudaDriverGetVersion reports it: 13000 for 13.0) that runs
    the kernels of `build` (cuda_build()): 12.1 for their arguments, and the major version of
    the CUDA runtime the build links statically (a 13.x runtime needs a 13.x driver, 580+)."""
    return max(MIN_CUDA_DRIVER, build.get("runtime", 0) // 1000 * 1000)


def _version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def runnable(capability: tuple[int, int], sm: list[int], ptx: int) -> bool:
    """Whether a GPU of `capability` (major, minor) runs code built as binaries for the compute
    capabilities `sm` (x10: 80, 90) and PTX for `ptx`: a binary runs on its major version from
    its minor on; the PTX, compiled by the driver, on its capability and later ones."""
    cc = 10 * capability[0] + capability[1]
    return any(a // 10 == cc // 10 and a <= cc for a in sm) or (ptx > 0 and ptx <= cc)


def cuda_driver_version() -> int:
    module = _module()
    return module.cuda_driver_version() if module is not None else 0


def cuda_build() -> dict:
    """The GPU code the CUDA kernels carry and the CUDA runtime they link: {"sm": [80, 90],
    "ptx": 90, "runtime": 13000} (empty, 0, without them)."""
    module = _module()
    return module.cuda_build() if module is not None else {"sm": [], "ptx": 0, "runtime": 0}


def _major_minor(capability: str) -> tuple[int, int]:
    major, minor = capability.split(".")
    return int(major), int(minor)


@functools.cache  # once per GPU kind: its warning comes once
def _cuda_usable(capability: str, driver: int) -> tuple[bool, str]:
    build = cuda_build()
    carried = ", ".join(f"sm_{a}" for a in build["sm"]) + f" (+PTX compute_{build['ptx']})"
    floor = driver_floor(build)
    if driver < floor:
        reason = f"driver {_version(driver)} is older than {_version(floor)}"
        if floor > MIN_CUDA_DRIVER:
            reason += f", which the CUDA {_version(build['runtime'])} runtime built in needs"
    elif not runnable(_major_minor(capability), build["sm"], build["ptx"]):
        reason = f"this GPU is sm_{capability.replace('.', '')}; the kernels carry {carried}"
    else:
        return True, ""
    warnings.warn(
        f"jgsess: the CUDA kernels cannot run here ({reason}); fused nodes on the GPU run "
        "XLA's code. Rebuild jgsess with a newer CUDA toolkit or driver.",
        RuntimeWarning,
        stacklevel=2,
    )
    return False, reason


@functools.cache  # once per process: jax's client and its devices are made once
def use_cuda_devices() -> tuple[int, ...]:
    """Tell the CUDA handlers which GPUs this process's jax client uses (their CUDA runtime
    ordinals, jax's `local_hardware_id`): they load their kernels into those devices' contexts
    alone (csrc/common/cuda_devices.h), so a process that selected its GPU with jax's
    `local_device_ids` creates no context on the others. Asked before a program with a CUDA
    kernel lowers; the devices told."""
    module = _module()
    try:
        gpus = jax.local_devices(backend="gpu")
    except RuntimeError:  # no GPU backend in this process
        return ()
    ordinals = tuple(d.local_hardware_id for d in gpus if kernel_platform(d) == "cuda")
    if module is not None and ordinals:
        module.use_cuda_devices(list(ordinals))
    return ordinals


def cuda_usable(device) -> tuple[bool, str]:
    """Whether jgsess's CUDA kernels run on `device` (an NVIDIA GPU): the driver is new enough
    and the build carries code for its compute capability; if not, why (warned once)."""
    return _cuda_usable(str(getattr(device, "compute_capability", "0.0")), cuda_driver_version())


targets()  # register every FFI target at import
