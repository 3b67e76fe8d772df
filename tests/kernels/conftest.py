"""The kernel tests run on two sets of handlers: the C++ CPU kernels ("cpu") and the CUDA
kernels' sources under the SIMT emulator ("simt": tests/emulator/, every check on). A module
opts in with `pytestmark = pytest.mark.usefixtures("kernels")`; a test taking `cuda_device`
runs the CUDA handlers: emulated, and on a real GPU where there is one.

Every kernel test runs with the CPU as the default device, also where a GPU is the default
(the CPU handlers and the emulated ones are CPU targets); a CUDA test puts its operands on the
GPU itself (`cuda_device`)."""

import jax
import pytest

from tests.conftest import _has_gpu
from tests.emulator import simt


@pytest.fixture(autouse=True)
def on_the_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture(params=["cpu", "simt"])
def kernels(request, monkeypatch) -> str:
    if request.param == "simt":
        simt.route(monkeypatch)
    return request.param


@pytest.fixture
def cuda_device(kernels):
    """The device a CUDA test runs on: None (the CPU's, under the emulator) or the GPU."""
    if kernels == "simt":
        return None
    if not _has_gpu():
        pytest.skip("needs a CUDA device and jgsess built with CUDA (ran emulated)")
    return jax.devices("gpu")[0]
