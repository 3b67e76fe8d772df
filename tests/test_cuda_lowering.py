"""On an NVIDIA machine jax names the platform "gpu" and jgsess's kernels are "cuda" kernels:
the one mapping (jgsess/platforms.py) makes every fusion's step lower to the CUDA custom calls,
with the operands it has on the CPU; ROCm and platforms without kernels keep XLA's code. The
GPU is faked (tests/cuda_lowering.py) and each program is lowered for "cuda", not run."""

from __future__ import annotations

import types

import jax
import pytest

import jgsess
from jgsess import platforms
from jgsess.kernels import _native
from tests import cuda_lowering as cl

STEPS = cl.steps()


@pytest.fixture(autouse=True)
def prefer_memory(monkeypatch):  # the relu_mask kernels are taken where memory is preferred
    monkeypatch.setenv("JGSESS_PREFER", "memory")


@pytest.mark.parametrize(
    "platform, version, want",
    [
        ("cpu", "", "cpu"),
        ("gpu", "cuda 13000", "cuda"),
        ("gpu", "PJRT C API\ncuda 12030", "cuda"),
        ("gpu", "rocm 60200", "rocm"),
        ("tpu", "TFRT TPU v5 lite", "tpu"),
        ("gpu", "some other runtime", "gpu"),
    ],
)
def test_one_mapping_from_what_jax_reports(platform, version, want):
    device = types.SimpleNamespace(
        platform=platform, client=types.SimpleNamespace(platform_version=version)
    )
    assert platforms.kernel_platform(device) == want


def test_a_program_runs_where_its_options_place_it(monkeypatch):
    cpu = jax.devices("cpu")[0]
    monkeypatch.setattr(platforms, "default_device", cl.fake_device)
    assert platforms.program_platform() == "cuda"
    for options in (
        {"device": cpu},
        {"backend": "cpu"},
        {"in_shardings": jax.sharding.SingleDeviceSharding(cpu)},
        {"out_shardings": (None, jax.sharding.SingleDeviceSharding(cpu))},
    ):
        assert platforms.program_platform(platforms.pinned_device(options)) == "cpu", options
    assert platforms.pinned_device({"in_shardings": None, "donate_argnums": 0}) is None


@pytest.mark.parametrize("name", sorted(STEPS))
def test_every_fusion_lowers_to_its_cuda_kernels_on_an_nvidia_gpu(monkeypatch, name):
    make, want = STEPS[name]
    if name in cl.GPU_ONLY:
        assert cl.kernel_calls(cl.lowered(*make(), "cpu")) == []
        cl.fake_gpu(monkeypatch)
        on_cuda = cl.kernel_calls(cl.lowered(*make(), "cuda"))
    else:  # the same calls, on the same operands
        on_cuda = cl.assert_same_calls_for_cuda(monkeypatch, make)
    assert {target for target, _ in on_cuda} == want, on_cuda


@pytest.mark.parametrize("name", ["adamw", "global_norm", "batch_norm_add_relu_grad"])
def test_rocm_selects_no_cuda_kernel(monkeypatch, name):
    make, _ = STEPS[name]
    fn, args = make()
    cl.fake_gpu(monkeypatch, "rocm 60200")
    compiled = jgsess.jit(fn)
    assert cl.kernel_calls(cl.lowered(fn, args, "rocm")) == []
    report = compiled.report(*args)
    assert report.session.platform == "rocm"
    assert all(k.impl == "xla" for k in report.session.record.kernels), report


@pytest.mark.parametrize(
    "capability, sm, ptx, runs",
    [
        ((9, 0), [80, 90], 90, True),
        ((8, 6), [80, 90], 90, True),  # the sm_80 binary runs on later 8.x GPUs
        ((8, 0), [90], 90, False),
        ((10, 0), [80, 90], 90, True),  # the PTX, compiled by the driver
        ((10, 0), [80, 90], 0, False),
        ((7, 5), [80, 90], 90, False),  # T4
        ((7, 0), [80, 90], 90, False),  # V100
    ],
)
def test_which_gpus_run_the_built_code(capability, sm, ptx, runs):
    assert _native.runnable(capability, sm, ptx) == runs


@pytest.mark.parametrize(
    "capability, driver, built, reason",
    [
        ("7.0", 13000, 13000, "this GPU is sm_70"),
        ("9.0", 12000, 12040, r"driver 12\.0 is older than 12\.1\)"),
        # a CUDA 13 runtime linked in needs a 13.x driver (580+), whatever 12.x it finds
        ("9.0", 12090, 13000, r"driver 12\.9 is older than 13\.0, which the CUDA 13\.0 runtime"),
    ],
)
def test_a_gpu_the_kernels_cannot_run_on_keeps_xla_code(
    monkeypatch, capability, driver, built, reason
):
    make, _ = STEPS["adamw"]
    cl.fake_gpu(monkeypatch, capability=capability, driver=driver, built=built)
    with pytest.warns(RuntimeWarning, match=reason):
        assert cl.kernel_calls(cl.lowered(*make(), "cuda")) == []


@pytest.mark.parametrize(
    "built, floor", [(0, 12010), (12040, 12010), (12090, 12010), (13000, 13000), (13020, 13000)]
)
def test_the_driver_floor_is_the_runtimes_major_and_never_below_12_1(built, floor):
    assert _native.driver_floor({"sm": [90], "ptx": 90, "runtime": built}) == floor


def test_a_driver_of_the_runtimes_major_runs_the_kernels(monkeypatch):
    make, _ = STEPS["adamw"]
    cl.fake_gpu(monkeypatch, driver=13000, built=13020)  # minor-version compatibility
    assert cl.kernel_calls(cl.lowered(*make(), "cuda")) != []


def test_the_build_reports_the_cuda_runtime_it_links():
    build = _native.cuda_build()
    assert (build["runtime"] >= 12000) == bool(build["sm"])


def test_before_the_mapping_a_gpu_named_gpu_had_no_kernel(monkeypatch):
    """What the session did when it took jax's platform name as its own: no kernel."""
    make, _ = STEPS["adamw"]
    fn, args = make()
    cl.fake_gpu(monkeypatch)
    monkeypatch.setattr(platforms, "kernel_platform", lambda device: device.platform)
    assert cl.kernel_calls(cl.lowered(fn, args, "cuda")) == []


def test_an_unusable_gpu_is_warned_about_once(monkeypatch):
    cl.fake_gpu(monkeypatch, capability="6.1")
    device = platforms.default_device()
    with pytest.warns(RuntimeWarning) as caught:
        for _ in range(3):
            usable, _ = _native.cuda_usable(device)
            assert not usable
    assert len(caught) == 1


def test_the_cuda_handlers_are_told_the_gpus_jax_uses(monkeypatch):
    """A process that selected GPUs 2 and 5 of a node (jax's `local_device_ids`) has the CUDA
    handlers load their kernels into those devices' contexts alone: told once, by the CUDA
    runtime ordinals jax reports, before a program with a CUDA kernel lowers; a ROCm GPU is
    not named, and a process without a GPU backend tells nothing."""
    told = []
    module = types.SimpleNamespace(use_cuda_devices=told.append)
    monkeypatch.setattr(_native, "_module", lambda: module)
    gpus = [cl.fake_device(), cl.fake_device(), cl.fake_device("rocm 60200")]
    for gpu, ordinal in zip(gpus, (2, 5, 0)):
        gpu.local_hardware_id = ordinal
    monkeypatch.setattr(jax, "local_devices", lambda backend: gpus)
    _native.use_cuda_devices.cache_clear()
    try:
        assert _native.use_cuda_devices() == (2, 5) and told == [[2, 5]]
        cl.fake_gpu(monkeypatch)
        step, args = STEPS["adamw"][0]()
        assert "jgsess_adamw" in cl.lowered(step, args, "cuda")
        assert told == [[2, 5]]  # once a process
        _native.use_cuda_devices.cache_clear()

        def no_gpu(backend):
            raise RuntimeError("Unknown backend: 'gpu' requested")

        monkeypatch.setattr(jax, "local_devices", no_gpu)
        assert _native.use_cuda_devices() == () and told == [[2, 5]]
    finally:
        _native.use_cuda_devices.cache_clear()
