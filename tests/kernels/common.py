"""Checking a kernel against its pure-JAX reference, through its real custom call."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from jgsess import platforms
from tests.helpers import assert_trees_close

# odd sizes: one element, less than a SIMD vector, not a multiple of the chunk (65536 elements,
# global_norm.CHUNK), a 2-D tensor, several chunks. The emulator's guard ends each buffer at a
# page, so only buffers of a multiple of 16 bytes start 16-byte aligned and take the CUDA
# kernels' vector path there: (1028,) in f32, with a tail of 4 elements; (4104,) in every
# dtype, two vector steps for some threads of a 512-thread block
SIZES = [(1,), (7,), (1023,), (1028,), (4104,), (33, 65), (100_003,)]


def kernel_fn(spec, **static):
    bind = functools.partial(spec.primitive.bind, aliases=(), **static)
    return jax.jit(lambda *ops: bind(*ops))


def reference_fn(spec, **static):
    return jax.jit(functools.partial(spec.reference, **static))


def assert_custom_call(spec, fn, *args, device=None):
    """`fn(*args)` lowers to the `jgsess_<name>` custom call for `device`'s platform (the
    default backend's without one): the kernel is registered there and really runs, not its
    reference."""
    platform = platforms.program_platform(device)
    assert platform in spec.platforms(), f"{spec.target} has no kernel registered for {platform}"
    text = fn.lower(*args).as_text()
    assert re.search(rf"custom_call @{spec.target}\(", text), f"no {spec.target} custom call"


# XLA's own code on a GPU rounds unlike IEEE's one-operation-at-a-time: NVPTX contracts
# multiply-adds and divides and takes square roots with its approximate instructions (a few
# ulps). A CUDA kernel, compiled without contraction and with IEEE division and square roots,
# is checked bit-wise (or within `rtol`) against the reference on the CPU, and within this
# tolerance of XLA's code on its device (narrow results: one ulp of their dtype, as on the CPU)
XLA_GPU_RTOL, XLA_GPU_ATOL = 1e-5, 1e-6


def check(
    spec,
    operands,
    rtol=1e-6,
    atol=1e-8,
    device=None,
    exact=False,
    op_by_op=False,
    exact_on_device=False,
    **static,
):
    """The kernel equals the reference on `operands` (results compared as f32; a bf16/f16
    result within one unit of its last place, since an f32 value one ulp apart may round the
    other way; `exact`: bit for bit, NaNs equal), and the kernel's custom call is what ran.

    The reference runs on the CPU: XLA's CPU code, or with `op_by_op` one operation at a time,
    each result rounded to its dtype (what a kernel's narrow math computes; XLA's compiled f16
    code contracts multiply-adds on a CPU with native f16 arithmetic). On a GPU `device` the
    kernel is also checked against XLA's code there, within XLA_GPU_RTOL/ATOL (bit for bit with
    `exact_on_device`: where a fusion's probe found XLA's bits there equal to the kernel's)."""
    if device is not None:
        operands = jax.device_put(operands, device)
        # poison the allocator: results must overwrite every element of a reused buffer
        jax.block_until_ready([jnp.full(o.shape, jnp.nan, o.dtype) for o in operands])
    fn = kernel_fn(spec, **static)
    assert_custom_call(spec, fn, *operands, device=device)
    got = fn(*operands)
    cpu = jax.devices("cpu")[0]
    on_cpu = jax.device_put(operands, cpu)
    with jax.default_device(cpu):
        if op_by_op:
            with jax.disable_jit():
                want = list(spec.reference(*on_cpu, **static))
        else:
            want = list(reference_fn(spec, **static)(*on_cpu))
    assert_results_close(got, want, rtol, atol, exact)
    if platforms.program_platform(device) != "cpu":
        there = list(reference_fn(spec, **static)(*operands))
        rtol, atol = max(rtol, XLA_GPU_RTOL), max(atol, XLA_GPU_ATOL)
        assert_results_close(got, there, rtol, atol, exact_on_device)


def assert_results_close(got: list, want: list, rtol: float, atol: float, exact: bool = False):
    """Each of `got` equals `want`'s in dtype, and in value as `check` says."""
    assert [g.dtype for g in got] == [w.dtype for w in want]
    for g, w in zip(got, want):
        narrow = jnp.finfo(g.dtype) if g.dtype in (jnp.bfloat16, jnp.float16) else None
        f32 = [np.asarray(x).astype(np.float32) for x in (g, w)]  # no compile per shape
        if exact:
            assert np.array_equal(*(np.asarray(x) for x in f32), equal_nan=True)
        elif narrow is None:
            assert_trees_close(*f32, rtol=rtol, atol=atol)
        else:  # one ulp, subnormals' too
            ulp, tiny = float(narrow.eps), float(narrow.smallest_subnormal)
            assert_trees_close(*f32, rtol=max(rtol, ulp), atol=max(atol, tiny))


def bits(x) -> np.ndarray:
    """`x`'s bit patterns, every NaN of it made one NaN. Which NaN an operation passes on when
    two operands are NaN is neither IEEE 754's nor XLA's to say, the compiler commutes an add's
    or a product's operands as it likes, and a GPU's arithmetic makes the default NaN: so bit
    equality means every number's bits, and NaN where the other has NaN."""
    a = np.asarray(x)
    out = a.view(f"u{a.dtype.itemsize}").copy()
    if jnp.issubdtype(a.dtype, jnp.floating):
        out[np.isnan(a)] = np.array(np.nan, a.dtype).view(out.dtype)
    return out
