"""The CPU kernels' vector loops (csrc/common/simd.h, vec.h) give the same bits on every
instruction set: each JGSESS_SIMD path runs the optimizer (narrow math too), cast, ReLU-mask and
BatchNorm kernels in a process of its own, on random operands of odd sizes and mixed dtypes, and
the optimizers on every bf16 and f16 bit pattern; the results must be equal bit for bit, a NaN
any NaN (tests/kernels/common.py: bits)."""

import hashlib
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jgsess import _C
from jgsess.kernels import adamw, cast_all, momentum, relu_mask
from tests.kernels.common import bits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ISAS = ["baseline", "avx2", "avx512"]


def digest_of_results() -> dict:
    """What one process computes: the SIMD path it took and a hash of each kernel's results."""
    from tests.kernels.common import kernel_fn
    from tests.kernels.test_adamw import narrow_operands as adamw_narrow
    from tests.kernels.test_adamw import operands as adamw_operands
    from tests.kernels.test_batch_norm import backward_case, bind, forward_case
    from tests.kernels.test_cast_all import PAIRS
    from tests.kernels.test_cast_all import operands as cast_operands
    from tests.kernels.test_momentum import narrow_operands as momentum_narrow
    from tests.kernels.test_momentum import operands as momentum_operands
    from tests.kernels.test_relu_mask import values as relu_values

    sizes = [(1,), (15,), (17,), (1023,), (33, 65), (100_003,)]
    cases = {}
    forms = (
        adamw.OPTAX_ADAMW,
        adamw.OPTAX_ADAMW | adamw.Flag.CLIP,
        adamw.OPTAX_ADAM | adamw.Flag.EXACT,
    )
    for flags in forms:
        for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
            ops = adamw_operands(sizes, seed=flags, p_dtype=dtype, g_dtype=dtype)
            cases[f"adamw {flags} {dtype.__name__}"] = kernel_fn(adamw.SPEC, flags=flags)(*ops)
        # bf16 moments of f32 parameters: converted in registers
        ops = adamw_operands(sizes, seed=flags, m_dtype=jnp.bfloat16)
        cases[f"adamw {flags} bf16 state"] = kernel_fn(adamw.SPEC, flags=flags)(*ops)
    for flags in (0, momentum.Flag.NESTEROV | momentum.Flag.WEIGHT_DECAY, 15):
        for g_dtype in (jnp.float16, jnp.bfloat16):  # staged; bf16 p and g converted in registers
            ops = momentum_operands(sizes, flags, jnp.bfloat16, g_dtype)
            name = f"momentum {flags} {g_dtype.__name__}"
            cases[name] = kernel_fn(momentum.SPEC, flags=flags)(*ops)
        ops = momentum_operands(sizes, flags, acc_dtype=jnp.bfloat16)  # in registers too
        cases[f"momentum {flags} bf16 accumulator"] = kernel_fn(momentum.SPEC, flags=flags)(*ops)
    for dtype in (jnp.bfloat16, jnp.float16):  # narrow math: every operation rounded
        flags = adamw.OPTAX_ADAMW | adamw.Flag.NARROW
        ops = adamw_narrow(sizes, dtype, seed=1)
        cases[f"adamw narrow {dtype.__name__}"] = kernel_fn(adamw.SPEC, flags=flags)(*ops)
        flags = momentum.Flag.NESTEROV | momentum.Flag.WEIGHT_DECAY | momentum.Flag.NARROW
        ops = momentum_narrow(sizes, dtype, seed=2)
        cases[f"momentum narrow {dtype.__name__}"] = kernel_fn(momentum.SPEC, flags=flags)(*ops)
    norms = [((3, 6, 5, 7), 1, jnp.float32), ((40, 41, 9), 2, jnp.float32)]  # NCHW, rank 3
    norms += [((16, 9, 9, 48), 3, dtype) for dtype in (jnp.float32, jnp.bfloat16)]  # NHWC
    for shape, axis, dtype in norms:
        for add in (False, True):
            spec, ops, params = forward_case(shape, axis, dtype, dtype, add)
            cases[f"{spec.name} {shape} {dtype.__name__}"] = bind(spec, *ops, **params)
            spec, ops, params, _ = backward_case(shape, axis, dtype, dtype, add)
            cases[f"{spec.name} {shape} {dtype.__name__}"] = bind(spec, *ops, **params)
    for i, shape in enumerate(sizes):
        xs = [relu_values(shape, i, jnp.bfloat16), relu_values(shape, i + 1, jnp.bfloat16)]
        cases[f"relu_mask {shape}"] = kernel_fn(relu_mask.FORWARD)(*xs)
        mask = relu_mask.pack(relu_values(shape, i) > 0)
        cases[f"relu_mask_grad {shape}"] = kernel_fn(relu_mask.BACKWARD)(mask, *xs)
    sources = [(shape, PAIRS[i % len(PAIRS)][0]) for i, shape in enumerate(sizes * 2)]
    dtypes = tuple(PAIRS[i % len(PAIRS)][1] for i in range(len(sources)))
    cases["cast_all"] = kernel_fn(cast_all.SPEC, dtypes=dtypes)(*cast_operands(3, sources))
    return {"isa": _C.simd_isa(), "hashes": _hashed(cases), "patterns": _hashed(pattern_cases())}


def _hashed(cases: dict) -> dict:
    hashes = {}
    for name, results in cases.items():
        h = hashlib.sha256()
        for r in results:
            h.update(bits(r).tobytes())
        hashes[name] = h.hexdigest()
    return hashes


def pattern_cases() -> dict:
    """Every narrow form, and the f32 math of narrow buffers, on tensors that take each of the
    65,536 bit patterns of bf16 and f16 (NaNs with payloads, infinities, subnormals), each
    tensor of a call the patterns in another order; AdamW with an eps_root of +0 and a b2 that
    is 1.0 in bf16 too (the forms that skip an add or a product)."""
    from tests.kernels.common import kernel_fn

    cases = {}
    for dtype in (jnp.bfloat16, jnp.float16):
        patterns = np.arange(1 << 16, dtype=np.uint16).view(dtype)
        tensors = [jnp.asarray(np.roll(patterns, shift)) for shift in (0, 12_345, 777, 40_001)]
        for eps_root, b2 in ((1e-12, 0.99), (0.0, 0.999)):
            step = 3
            scalars = [0.9, 0.1, b2, 1 - b2, 1 - 0.9**step, 1 - b2**step, 1e-8, eps_root, 1e-2]
            scalars += [1e-3, 1.0, 3.7, 0.5]
            narrow = [jnp.float32(jnp.asarray(x, dtype)) for x in scalars]
            for flags in (adamw.OPTAX_ADAMW, adamw.Flag.EPS_ROOT | adamw.Flag.UPDATE):
                name = f"adamw narrow {flags} {dtype.__name__} b2={b2} eps_root={eps_root}"
                flags |= adamw.Flag.NARROW
                cases[name] = kernel_fn(adamw.SPEC, flags=flags)(*narrow, *tensors)
            wide = [jnp.float32(x) for x in scalars]  # the f32 math of narrow buffers
            name = f"adamw f32 math {dtype.__name__} b2={b2} eps_root={eps_root}"
            cases[name] = kernel_fn(adamw.SPEC, flags=adamw.OPTAX_ADAMW)(*wide, *tensors)
        if dtype == jnp.bfloat16:  # the mixed form: bf16 p, g, v and an f32 m
            m = jnp.asarray(np.random.default_rng(0).standard_normal(1 << 16), jnp.float32)
            mixed = [tensors[0], tensors[1], m, tensors[3]]
            flags = adamw.OPTAX_ADAMW | adamw.Flag.MIXED
            cases["adamw mixed"] = kernel_fn(adamw.SPEC, flags=flags)(*wide, *mixed)
        scalars = [jnp.float32(jnp.asarray(x, dtype)) for x in (0.05, 0.9, 1e-3, 1 / 512)]
        for flags in (15, momentum.Flag.NESTEROV | momentum.Flag.WEIGHT_DECAY):
            name = f"momentum narrow {flags} {dtype.__name__}"
            call = kernel_fn(momentum.SPEC, flags=flags | momentum.Flag.NARROW)
            cases[name] = call(*scalars, *tensors[:3])
    return cases


def start(isa: str) -> subprocess.Popen:
    code = "import json; from tests.kernels.test_simd import digest_of_results as d; "
    code += "print(json.dumps(d()))"
    env = {**os.environ, "JGSESS_SIMD": isa, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(process: subprocess.Popen) -> dict:
    try:
        out, err = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs() -> dict:
    """Each instruction set's digests, in a process of its own, up to the CPU's widest."""
    best = _C.simd_isa()  # this process: the CPU's widest (JGSESS_SIMD unset in the tests)
    processes = {isa: start(isa) for isa in ISAS[: ISAS.index(best) + 1]}
    runs = {isa: result(process) for isa, process in processes.items()}
    for isa, run in runs.items():
        assert run["isa"] == isa  # the cap took effect
    return runs


@pytest.mark.parametrize("part", ["hashes", "patterns"], ids=["random operands", "bit patterns"])
def test_every_instruction_set_gives_the_scalar_paths_bits(runs, part):
    """The baseline loop is the element math one float at a time (common/vec.h's lanes of one
    float); AVX2 and AVX-512 run it 8 and 16 lanes at a time and give its bits."""
    assert len(runs["baseline"][part]) > 10
    baseline = runs["baseline"][part]
    for isa, run in runs.items():
        differ = [name for name, h in run[part].items() if h != baseline[name]]
        assert not differ, f"{isa} differs from the baseline loop on {differ}"
