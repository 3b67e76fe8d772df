"""Which kernel platform a program runs on: the one mapping from what jax reports to jgsess's.

jax names a device's platform "cpu", "gpu" (NVIDIA and AMD alike) or "tpu"; its client's
platform version says which GPU runtime it is ("cuda 12030", "rocm 60200"). Kernels are
registered, lowered and cached per kernel platform, which is also a name `jax.devices` takes:

    device.platform   client.platform_version   kernel platform
    cpu               (any)                     cpu
    gpu               ... cuda ...              cuda
    gpu               ... rocm ...              rocm   (no jgsess kernel: XLA's code)
    tpu               (any)                     tpu    (no jgsess kernel: XLA's code)

A program's platform is that of the device jax.jit's options place it on (`pinned_device`: a
device of its `in_shardings`/`out_shardings`, its `device` or `backend` option, read when
`jgsess.jit` is called), else of the default device when it is traced (`jax.default_device`,
else the default backend's first device). The arguments' own placement is not read: a program
whose arrays are committed to another platform's device is planned for the default one, and
its kernel calls lower for the platform jax compiles it for (a kernel without a handler there
lowers to its reference: kernels/spec.py), so its numbers are right, its choices the default
platform's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


def has_devices(platform: str) -> bool:
    """Whether this process has a device of the kernel platform (to measure or probe on)."""
    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


@dataclass(frozen=True)
class Target:
    """Where one compilation's program runs, worked out once (`Target.of`) and asked by every
    decision about it (jgsess/selection.py): the kernel `platform`, the `device` (as jax
    reports it: the pinned device, else the default one; None where this process has no
    device of the platform, a program lowered for another machine), jax.jit's
    `compiler_options` as sorted (name, value) pairs, and the seconds the compilation may
    spend measuring kernels against XLA (`budget`; None: none at all, only cached decisions).
    Targets compare (and hash, for the probes cached per process) by platform and compiler
    options."""

    platform: str
    device: object | None = field(compare=False)
    compiler_options: tuple = ()
    budget: float | None = field(default=0.0, compare=False)

    @classmethod
    def of(cls, pinned=None, platform: str | None = None, compiler_options=(), budget=0.0):
        """The target of a program placed on `pinned` (see pinned_device), else on the default
        device; `platform`, where given, names the kernel platform it is planned for."""
        device = pinned if pinned is not None else default_device()
        if platform is not None and kernel_platform(device) != platform:
            device = jax.devices(platform)[0] if has_devices(platform) else None
        return cls(platform or kernel_platform(device), device, tuple(compiler_options), budget)

    def runner(self):
        """The device this process runs probes and measurements for the program on: its own
        where this process has it, else the platform's first. Raises RuntimeError where the
        process has no device of the platform (XLA cannot be asked here)."""
        if not has_devices(self.platform):
            raise RuntimeError(f"no {self.platform} device in this process")
        local = jax.devices(self.platform)
        return self.device if self.device in local else local[0]

    def compile(self, fns, operands, donate=()) -> list:
        """Each of `fns` compiled alone for the types of `operands` (arrays, or trees of them)
        on `runner()`, with the program's compiler options; `donate`: the positions of the
        operands donated to each. Top-level programs, which the pipeline (running inside the
        user's jax.jit trace) calls under `jax.ensure_compile_time_eval`; traced at top level,
        not under it, where a function's constant computations (zeros, broadcasts) would run
        eagerly, each compiled on its own."""
        sharding = jax.sharding.SingleDeviceSharding(self.runner())
        structs = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), list(operands)
        )
        options = dict(self.compiler_options) or None
        lowered = [jax.jit(f, donate_argnums=tuple(donate)).lower(*structs) for f in fns]
        return [each.compile(options) for each in lowered]

    def put(self, arrays) -> list:
        """`arrays` on `runner()`, from inside a trace (the pipeline's)."""
        with jax.ensure_compile_time_eval():
            return jax.device_put(list(arrays), self.runner())
