"""Which kernel platform a program runs on: the one mapping from what jax reports to jgsess's.

jax names a device's platform "cpu", "gpu" (NVIDIA and AMD alike) or "tpu"; its client's
platform version says which GPU runtime it is ("cuda 12030", "rocm 60200"). Kernels are
registered, lowered and cached per kernel platform, which is also a name `jax.devices` takes:

    device.platform   client.platform_version   kernel platform
    cpu               (any)                     cpu
    gpu               ... cuda ...              cuda
    gpu               ... rocm ...              rocm   (no jgsess kernel: XLA's code)
    tpu               (any)                     tpu    (no jgsess kernel: XLA's code)

A program's platform is that of the devices it runs on, as far as they are known while jax.jit
traces it: the devices of its `in_shardings`/`out_shardings`, its `device` or `backend`
option, the default device (`jax.default_device`), else the default backend's first device.
"""

from __future__ import annotations

import jax

from . import _compat


def kernel_platform(device) -> str:
    """The kernel platform of a jax device: "cpu", "cuda", "rocm", or its own platform name."""
    platform = device.platform.lower()
    if platform != "gpu":
        return platform
    version = device.client.platform_version.lower()
    if "rocm" in version:
        return "rocm"
    if "cuda" in version:
        return "cuda"
    return platform  # a GPU runtime jgsess has no kernels for


def _sharding_device(shardings):
    for sharding in jax.tree.leaves(shardings):
        devices = getattr(sharding, "device_set", None)
        if devices:
            return min(devices, key=lambda d: d.id)
    return None


def pinned_device(options: dict):
    """The device jax.jit's `options` place the program on (a device of its shardings, its
    `device` or `backend`), or None where they leave it to the default device."""
    for shardings in _compat.jit_shardings(options):
        device = _sharding_device(shardings)
        if device is not None:
            return device
    if options.get("device") is not None:
        return options["device"]
    if options.get("backend"):
        return jax.devices(options["backend"])[0]
    return None


def default_device():
    """The device a program with no placement of its own runs on: `jax.default_device`'s, else
    the default backend's first."""
    default = jax.config.jax_default_device
    if isinstance(default, str):
        return jax.devices(default)[0]
    return default if default is not None else jax.devices()[0]


def program_platform(pinned=None) -> str:
    """The kernel platform of a program placed on `pinned` (see pinned_device), else on the
    default device."""
    return kernel_platform(pinned if pinned is not None else default_device())


def cuda_device():
    """The NVIDIA GPU CUDA kernels would run on: the default device, if it is one, else the
    first CUDA device."""
    device = default_device()
    return device if kernel_platform(device) == "cuda" else jax.devices("cuda")[0]


def has_devices(platform: str) -> bool:
    """Whether this process has a device of the kernel platform (to measure or probe on)."""
    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False
