"""The SIMT emulator's own tests: each check fires on a kernel broken for it (csrc/testing/emulator/
broken.cu) and on no correct kernel; the emulated hardware's arithmetic is the GPU's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgsess.kernels import adamw
from tests.emulator import simt
from tests.kernels.common import check
from tests.kernels.test_adamw import operands as adamw_operands

N = 1000  # four blocks of 256 threads, the last one partly past the end


def neighbors(x: np.ndarray) -> np.ndarray:
    """What the correct kernel computes (broken.cu)."""
    n, y = x.size, np.zeros_like(x)
    for i in range(n):
        block, t, lane = i // 256 * 256, i % 256, i % 32
        right = block + (t + 1) % 256
        down = x[i + 1] if lane < 31 and i + 1 < n else (x[i] if lane == 31 else 0.0)
        first = x[i // 32 * 32]
        y[i] = x[i] + (x[right] if right < n else 0.0) + down + (1.0 if first > 0 else 0.0)
    return y


def run(check: str, x):
    simt.broken()
    call = jax.ffi.ffi_call(f"{simt.PREFIX}broken_{check}", jax.ShapeDtypeStruct(x.shape, x.dtype))
    return jax.jit(call)(x)


X = np.random.default_rng(0).standard_normal(N).astype(np.float32)


def test_a_correct_kernel_passes_every_check():
    np.testing.assert_allclose(run("correct", X), neighbors(X), rtol=1e-6)


@pytest.mark.parametrize(
    "check, message",
    [
        (
            "global_read_past_end",
            "invalid global read at 0x[0-9a-f]+, 0 bytes past the end of "
            "operand 0 \\(4000 bytes\\) by Neighbors block \\(3,0,0\\) thread \\(231,0,0\\)",
        ),
        ("global_write_before_start", "result 0 written 4 bytes before its start"),
        (
            "shared_race",
            # which access comes first depends on the launch's shuffled order (seeded by the
            # process's launches so far)
            "shared-memory race at offset \\d+: (read and written|written and read) by "
            "Neighbors block "
            "\\(\\d,0,0\\) thread \\(\\d+,0,0\\) and .* between the same two barriers",
        ),
        (
            "barrier_divergence",
            "__syncthreads reached by 232 of 256 threads \\(Neighbors block "
            "\\(3,0,0\\) thread \\(232,0,0\\) exited without it\\)",
        ),
        ("shuffle_exited_lane", "__shfl_down_sync mask names lane 8, which has exited"),
        (
            "shuffle_outside_mask",
            "__shfl_down_sync at Neighbors block \\(\\d,0,0\\) thread \\(\\d+,0,0\\) reads "
            "lane 16, which its mask does not name",
        ),
        (
            "misaligned_vector_access",
            "misaligned 16-byte access at 0x[0-9a-f]+, .*operand 0.* by Neighbors block "
            "\\(0,0,0\\) thread \\(0,0,0\\)",
        ),
        ("ballot_exited_lane", "__ballot_sync mask names lane 8, which has exited"),
        ("result_unwritten", "result 0 element 1 was never written"),
        ("operand_written", "operand 0 changed, though no result aliases it"),
        ("unloaded_kernel", "Unloaded: launched before its code was loaded"),
    ],
)
def test_each_check_fires_on_the_kernel_broken_for_it(check, message):
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(run(check, X))


def test_kernels_are_loaded_into_every_devices_context():
    # one process driving two GPUs: the executable is built (its kernels loaded) once, with
    # device 0 current, and its first launch is on device 1
    with simt.devices(2, launch_device=1):
        np.testing.assert_allclose(run("correct", X), neighbors(X), rtol=1e-6)
    with simt.devices(2, launch_device=1):  # loaded into device 0's alone
        with pytest.raises(Exception, match="loaded into device 1's context"):
            jax.block_until_ready(run("loaded_on_one_device", X))


def test_a_kernels_handler_runs_on_a_second_device_first(monkeypatch):
    # every CUDA handler loads its kernels into each device's context (common/
    # multi_tensor_cuda.cuh: LoadKernels): adamw's, emulated, first launched on device 1
    simt.route(monkeypatch)
    ops = adamw_operands([(9,), (70_001,)], seed=3)
    with jax.default_device(jax.devices("cpu")[0]), simt.devices(2, launch_device=1):
        check(adamw.SPEC, ops, rtol=2e-6, flags=adamw.OPTAX_ADAMW)
        assert simt.module().loaded_on(0) > 0 and simt.module().loaded_on(1) > 0


def test_a_process_that_uses_one_gpu_of_two_loads_nothing_on_the_other(monkeypatch):
    # one process per GPU (jax's local_device_ids): the handlers load their kernels into the
    # contexts of the devices the process's jax uses alone (common/cuda_devices.h), which
    # jgsess/kernels/_native.py: use_cuda_devices names
    simt.route(monkeypatch)
    ops = adamw_operands([(9,), (70_001,)], seed=3)
    with jax.default_device(jax.devices("cpu")[0]), simt.devices(2, launch_device=1):
        simt.module().use_cuda_devices([1])
        check(adamw.SPEC, ops, rtol=2e-6, flags=adamw.OPTAX_ADAMW)
        assert simt.module().loaded_on(0) == 0 and simt.module().loaded_on(1) > 0


def test_a_failed_launch_leaves_the_next_call_clean():
    with pytest.raises(Exception, match="shared-memory race"):
        jax.block_until_ready(run("shared_race", X))
    np.testing.assert_allclose(run("correct", X), neighbors(X), rtol=1e-6)


def test_an_empty_buffer_launches_nothing():
    assert run("correct", np.zeros(0, np.float32)).shape == (0,)


def test_conversions_round_like_the_gpu_and_canonicalize_nan():
    """The emulated __float2bfloat16_rn / __float2half_rn: to nearest even (ties, the largest
    values, subnormals) as numpy rounds; every NaN becomes 0x7fff, as the GPU's cvt.rn does."""
    finite = np.array(
        [
            1 + 2**-8,
            1 + 3 * 2**-8,
            -(1 + 2**-8),
            65504.0,
            65520.0,
            1e-7,
            6e-8,
            3.4e38,
            -0.0,
            np.inf,
        ],
        np.float32,
    )
    nans = np.array([0x7FC00001, 0xFFC00000, 0x7F800001], np.uint32).view(np.float32)
    got = np.array(
        simt.module().gpu_conversions([float(v) for v in np.concatenate([finite, nans])])
    )
    with np.errstate(over="ignore"):
        want_bf16 = finite.astype(jnp.bfloat16).view(np.uint16)
        want_f16 = finite.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(got[: finite.size, 0], want_bf16)
    np.testing.assert_array_equal(got[: finite.size, 1], want_f16)
    assert (got[finite.size :] == 0x7FFF).all()


def test_launches_are_logged_with_their_shapes():
    simt.module().launches()
    run("correct", X)
    assert simt.module().launches() == [("Neighbors", (4, 1, 1), (256, 1, 1))]
