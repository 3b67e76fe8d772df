"""The CPU kernels' vector loops (csrc/common/simd.h) give the same bits on every instruction
set: each JGSESS_SIMD path runs the elementwise kernels in a process of its own, on random
operands of odd sizes and mixed dtypes, and the results must be equal byte for byte."""

import hashlib
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np

from jgsess import _C
from jgsess.kernels import adamw, cast_all, momentum

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ISAS = ["baseline", "avx2", "avx512"]


def digest_of_results() -> dict:
    """What one process computes: the SIMD path it took and a hash of each kernel's results."""
    from tests.kernels.common import kernel_fn
    from tests.kernels.test_adamw import operands as adamw_operands
    from tests.kernels.test_cast_all import PAIRS
    from tests.kernels.test_cast_all import operands as cast_operands
    from tests.kernels.test_momentum import operands as momentum_operands

    sizes = [(1,), (15,), (17,), (1023,), (33, 65), (100_003,)]
    cases = {}
    forms = (adamw.OPTAX_ADAMW, adamw.OPTAX_ADAMW | adamw.CLIP, adamw.OPTAX_ADAM | adamw.EXACT)
    for flags in forms:
        for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
            ops = adamw_operands(sizes, seed=flags, p_dtype=dtype, g_dtype=dtype)
            cases[f"adamw {flags} {dtype.__name__}"] = kernel_fn(adamw.SPEC, flags=flags)(*ops)
    for flags in range(16):
        ops = momentum_operands(sizes, flags, jnp.bfloat16, jnp.float16)
        cases[f"momentum {flags}"] = kernel_fn(momentum.SPEC, flags=flags)(*ops)
    sources = [(shape, PAIRS[i % len(PAIRS)][0]) for i, shape in enumerate(sizes * 2)]
    dtypes = tuple(PAIRS[i % len(PAIRS)][1] for i in range(len(sources)))
    cases["cast_all"] = kernel_fn(cast_all.SPEC, dtypes=dtypes)(*cast_operands(3, sources))
    hashes = {}
    for name, results in cases.items():
        h = hashlib.sha256()
        for r in results:
            h.update(np.asarray(r).tobytes())
        hashes[name] = h.hexdigest()
    return {"isa": _C.simd_isa(), "hashes": hashes}


def run_with(isa: str) -> dict:
    code = "import json; from tests.kernels.test_simd import digest_of_results as d; "
    code += "print(json.dumps(d()))"
    env = {**os.environ, "JGSESS_SIMD": isa, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_instruction_set_gives_the_same_bits():
    best = _C.simd_isa()  # this process: the CPU's widest (JGSESS_SIMD unset in the tests)
    runs = {isa: run_with(isa) for isa in ISAS[: ISAS.index(best) + 1]}
    for isa, run in runs.items():
        assert run["isa"] == isa  # the cap took effect
    baseline = runs["baseline"]["hashes"]
    for isa, run in runs.items():
        differ = [name for name, h in run["hashes"].items() if h != baseline[name]]
        assert not differ, f"{isa} differs from the baseline loop on {differ}"
