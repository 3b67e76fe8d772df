"""Tests run strict: pipeline failures raise, graphs are verified after every pass; kernel
selection uses the cost models, not measurements (tests/test_autotune.py turns them on)."""

import os

os.environ.setdefault("JGSESS_STRICT", "1")
os.environ.setdefault("JGSESS_VERIFY", "1")
os.environ.setdefault("JGSESS_AUTOTUNE", "0")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", False)


def _has_gpu() -> bool:
    try:
        import jgsess._C as native

        return native.has_cuda() and bool(jax.devices("gpu"))
    except Exception:  # noqa: BLE001 - no GPU backend, or no CUDA build
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device and jgsess built with CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
