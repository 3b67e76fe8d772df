"""Tests run strict: pipeline failures raise, graphs are verified after every pass; kernel
selection uses the cost models, not measurements (tests/test_autotune.py turns them on).

`--default-platform=cuda` rehearses a GPU machine on a CPU: every test's programs default to a
faked NVIDIA GPU (tests/cuda_lowering.py's fake_gpu), so that the passes plan for CUDA as they
would where a GPU is the default device, and a test that assumes the CPU fails here. jax itself
still runs the programs on the CPU."""

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


def pytest_addoption(parser):
    parser.addoption(
        "--default-platform",
        choices=("native", "cuda"),
        default="native",
        help="cuda: plan every program for a faked NVIDIA GPU (a GPU machine's default device)",
    )


@pytest.fixture(autouse=True)
def default_platform(request, monkeypatch):
    """The kernel platform programs default to in this run: "cuda" under
    --default-platform=cuda (faked), else that of jax's default device."""
    if request.config.getoption("--default-platform") == "cuda":
        from tests.cuda_lowering import fake_gpu

        fake_gpu(monkeypatch)
    from jgsess import platforms

    return platforms.program_platform()


@pytest.fixture
def tuning(monkeypatch, tmp_path):
    """Measuring on (jgsess.autotune), with a fresh cache file; yields the cache path."""
    from jgsess import autotune

    path = tmp_path / "cache" / "autotune.json"
    monkeypatch.setenv("JGSESS_AUTOTUNE", "1")
    monkeypatch.setenv("JGSESS_AUTOTUNE_CACHE", str(path))
    monkeypatch.setattr(autotune, "_cache", None)
    yield path
    autotune._cache = None


def pytest_collection_modifyitems(config, items):
    from jgsess import _config

    if _config.road() == "public":
        # jgsess.jit's public road differs from jax.jit where these tests say (README's Limits)
        for item in items:
            for mark in item.iter_markers("hook_road"):
                item.add_marker(pytest.mark.xfail(strict=True, reason=mark.args[0]))
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device and jgsess built with CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
