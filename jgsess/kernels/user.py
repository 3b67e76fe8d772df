"""The spec of a user's kernel: an FFI target the user registered with jax, not one of jgsess's.

`jgsess.register_replacement` makes one per registration: its reference is the registration's
search function (the program's own code, so XLA's side of every decision computes what the
program computed), its FFI target and platforms are the user's, and it carries a tolerance
(KernelSpec.tolerance) within which the kernel must agree with that code before it is taken.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import KernelSpec


@dataclass(frozen=True, eq=False)
class UserKernelSpec(KernelSpec):
    """A KernelSpec whose custom call is `ffi_target` (as the user registered it with
    `jax.ffi.register_ffi_target`), compiled for the kernel platforms `registered_on`."""

    ffi_target: str = ""
    registered_on: frozenset[str] = frozenset()

    @property
    def target(self) -> str:
        return self.ffi_target

    def platforms(self) -> frozenset[str]:
        return self.registered_on
