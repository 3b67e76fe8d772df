"""jgsess's test-only extension `_testing` (csrc/testing/, built by tests/native/build.py):
the SIMT emulator of the CUDA kernels, the host machinery's test hooks, the bandwidth probes."""

from __future__ import annotations

import functools


@functools.cache
def module():
    """The extension, or a RuntimeError that says how to build it."""
    try:
        from tests.native import _testing
    except ImportError as err:
        raise RuntimeError(
            "the test-only extension is not built: `make test` or `python tests/native/build.py`"
        ) from err
    return _testing
