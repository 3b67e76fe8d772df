"""The momentum kernel against its pure-JAX reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgsess.kernels import global_norm, momentum
from tests.kernels.bad_calls import multi_tensor
from tests.kernels.common import SIZES, assert_custom_call, bits, check, kernel_fn

pytestmark = pytest.mark.usefixtures("kernels")


def operands(sizes, seed=0, p_dtype=jnp.float32, g_dtype=jnp.float32, acc_dtype=jnp.float32):
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 3 * len(sizes)))
    scalars = [jnp.float32(s) for s in (0.05, 0.9, 1e-3, 1 / 512)]
    tensors = []
    for shape in sizes:
        tensors += [
            jax.random.normal(next(keys), shape).astype(p_dtype),
            (0.1 * jax.random.normal(next(keys), shape)).astype(g_dtype),
            (0.01 * jax.random.normal(next(keys), shape)).astype(acc_dtype),
        ]
    return scalars + tensors


@pytest.mark.parametrize("flags", range(16))
def test_kernel_matches_reference_on_odd_sizes(flags):
    check(momentum.SPEC, operands(SIZES, seed=flags), flags=flags)


@pytest.mark.parametrize("p_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("g_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_mixed_precision(p_dtype, g_dtype):
    ops = operands([(3,), (33_333,), (70_001,)], 5, p_dtype, g_dtype)  # one over a chunk
    check(momentum.SPEC, ops, flags=momentum.Flag.WEIGHT_DECAY | momentum.Flag.SCALE)


@pytest.mark.parametrize("acc_dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("p_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_narrow_accumulator(acc_dtype, p_dtype):
    # optax.sgd(accumulator_dtype=...): read widened, acc' rounded to the accumulator's dtype;
    # with p of its type, jgsess.optim.f32_math's update (in registers)
    ops = operands([(3,), (33_333,), (70_001,)], 6, p_dtype, p_dtype, acc_dtype)
    for flags in (0, momentum.Flag.NESTEROV, momentum.Flag.UPDATE):
        check(momentum.SPEC, ops, flags=flags)


def narrow_operands(sizes, dtype, seed=0):
    """An update written in `dtype`: every buffer of it, the hyper-parameters values of it."""
    ops = operands(sizes, seed, dtype, dtype, dtype)
    return [jnp.float32(s.astype(dtype)) for s in ops[:4]] + ops[4:]


@pytest.mark.parametrize("flags", [flags | momentum.Flag.NARROW for flags in range(16)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_narrow_math_gives_the_bits_of_the_update_written_in_its_dtype(flags, dtype):
    # every operation rounded to the tensors' dtype, one at a time, as XLA's CPU code computes
    # optax's sgd with a narrow parameter's accumulator where it has no native f16 arithmetic
    ops = narrow_operands(SIZES, dtype, flags)
    check(momentum.SPEC, ops, exact=True, op_by_op=True, flags=flags)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_cuda_narrow_math_rounds_as_the_cpus_on_every_bit_pattern(dtype, cuda_device, monkeypatch):
    """The CUDA kernel's rounding (common/optimizer.h's InBf16/InF16 as compiled for a GPU, the
    emulator included, and the stores' conversions) gives the CPU kernel's bits on operands
    that take each of the 65,536 bit patterns of `dtype`, NaNs with payloads and infinities
    included (a NaN result is any NaN: `bits`)."""
    patterns = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    tensors = [jnp.asarray(np.roll(patterns, shift)) for shift in (0, 12_345, 777)]
    scalars = [jnp.float32(jnp.asarray(s, dtype)) for s in (0.05, 0.9, 1e-3, 1 / 512)]
    flags = momentum.Flag.NARROW | momentum.Flag.NESTEROV | momentum.Flag.WEIGHT_DECAY
    ops = scalars + tensors
    fn = kernel_fn(momentum.SPEC, flags=flags)
    assert_custom_call(momentum.SPEC, fn, *ops, device=cuda_device)
    got = fn(*jax.device_put(ops, cuda_device))
    monkeypatch.undo()  # the CPU kernel, where the emulated one ran
    cpu_fn = kernel_fn(momentum.SPEC, flags=flags)
    assert_custom_call(momentum.SPEC, cpu_fn, *ops, device=jax.devices("cpu")[0])
    want = cpu_fn(*jax.device_put(ops, jax.devices("cpu")[0]))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(bits(g), bits(w))


def test_non_finite_values_propagate():
    ops = operands([(4,)])
    ops[5] = ops[5].at[0].set(jnp.nan).at[1].set(jnp.inf)
    check(momentum.SPEC, ops, flags=momentum.Flag.NESTEROV)


def test_inplace_pairs():
    assert momentum.SPEC.inplace({}, 4 + 6) == {4: 0, 6: 1, 7: 2, 9: 3}


@pytest.mark.parametrize("flags", [0, momentum.Flag.NESTEROV | momentum.Flag.WEIGHT_DECAY, 15])
def test_cuda_kernel_matches_reference(flags, cuda_device):
    sizes = SIZES + [(1 << 20,)] + [(33,)] * 200
    for acc_dtype in (jnp.float32, jnp.bfloat16):
        ops = operands(sizes, flags, jnp.bfloat16, jnp.float16, acc_dtype)
        check(momentum.SPEC, ops, rtol=2e-6, device=cuda_device, flags=flags)


def test_a_tensor_longer_than_a_launch_continues_in_the_next(cuda_device):
    """A CUDA launch covers at most 320 chunks of 64K elements: a tensor of 330 chunks fills one
    launch partway through and is carried into the next (common/multi_tensor_cuda.cuh)."""
    ops = operands([(7,), (330 * global_norm.CHUNK + 5,), (9,)], seed=3)
    check(momentum.SPEC, ops, rtol=2e-6, device=cuda_device, flags=momentum.Flag.NESTEROV)


def malformed_calls():
    """Direct calls (tests/kernels/test_operand_checks.py): hyper-parameters, operands and
    results per tensor, flags."""
    narrow = momentum.Flag.NARROW
    return {"jgsess_momentum": multi_tensor("jgsess_momentum", 4, 3, 2, flags=3, narrow=narrow)}
