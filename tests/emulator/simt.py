"""The SIMT emulator (csrc/testing/emulator/) from Python: jgsess's CUDA handlers, compiled as
C++ into the test-only extension tests/native/_testing (built by `make test`:
tests/native/build.py), registered as CPU FFI targets `jgsess_simt_<name>`, and kernel specs
routed to them."""

from __future__ import annotations

import contextlib
import functools

import jax

from jgsess.kernels import _native
from jgsess.kernels.spec import KernelSpec
from tests.native import module

PREFIX = "jgsess_simt_"


@functools.cache
def kernels() -> frozenset[str]:
    """The kernels with an emulated CUDA handler, registered as CPU targets `jgsess_simt_<name>`."""
    for name, capsule in module().handlers().items():
        jax.ffi.register_ffi_target(PREFIX + name, capsule, platform="cpu")
    return frozenset(module().handlers())


@functools.cache
def broken() -> frozenset[str]:
    """The emulator's deliberately broken handlers, registered as `jgsess_simt_broken_<check>`."""
    for name, capsule in module().broken().items():
        jax.ffi.register_ffi_target(f"{PREFIX}broken_{name}", capsule, platform="cpu")
    return frozenset(module().broken())


def target(name: str) -> str:
    """The emulated target standing for `jgsess_<name>` (unchanged where none is emulated)."""
    return PREFIX + name if name in kernels() else f"jgsess_{name}"


def route(monkeypatch) -> None:
    """Kernel specs lower to their emulated CUDA handlers on the CPU until the test ends."""
    emulated = kernels()
    built = _native.targets()
    routed = {PREFIX + name: frozenset({"cpu"}) for name in emulated}
    monkeypatch.setattr(KernelSpec, "target", property(lambda spec: target(spec.name)))
    monkeypatch.setattr(_native, "targets", lambda: {**built, **routed})


@contextlib.contextmanager
def devices(count: int, launch_device: int):
    """`count` emulated devices, each a context of its own, launches running on `launch_device`
    (as XLA's threads for that device run a program's thunks), nothing loaded yet and jax's
    executables dropped (their instantiate stages, which load the kernels, run again)."""
    module().set_devices(count, launch_device)
    jax.clear_caches()
    try:
        yield
    finally:
        module().set_devices(1)
        jax.clear_caches()
