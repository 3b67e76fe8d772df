"""The adamw kernel against its pure-JAX reference: random inputs, odd sizes, every form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgsess.kernels import adamw
from jgsess.kernels.spec import KernelSpec
from jgsess.platforms import Target
from jgsess.selection import numerics_match
from tests.helpers import assert_trees_close
from tests.kernels.bad_calls import BF16, F16, F32, N, array, call, multi_tensor, spec
from tests.kernels.common import SIZES, check, kernel_fn, reference_fn

pytestmark = pytest.mark.usefixtures("kernels")


def operands(
    sizes,
    seed=0,
    p_dtype=jnp.float32,
    g_dtype=jnp.float32,
    keep=0.0,
    m_dtype=jnp.float32,
    v_dtype=jnp.float32,
):
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 4 * len(sizes)))
    step, b1, b2 = 3, 0.9, 0.999
    scalars = [b1, 1 - b1, b2, 1 - b2, 1 - b1**step, 1 - b2**step, 1e-8, 1e-12, 1e-2, 1e-3]
    scalars += [keep, 3.7, 0.5]  # keep (1: no clipping), global norm, clip
    tensors = []
    for shape in sizes:
        p = jax.random.normal(next(keys), shape).astype(p_dtype)
        g = (0.1 * jax.random.normal(next(keys), shape)).astype(g_dtype)
        m = (0.01 * jax.random.normal(next(keys), shape)).astype(m_dtype)
        v = (1e-4 * jax.random.uniform(next(keys), shape)).astype(v_dtype)
        tensors += [p, g, m, v]
    return [jnp.float32(s) for s in scalars] + tensors


@pytest.mark.parametrize("flags", range(32))
def test_kernel_matches_reference_on_odd_sizes(flags):
    check(adamw.SPEC, operands(SIZES, seed=flags), flags=flags)


def test_clipping_off_where_the_norm_is_within_the_clip():
    ops = operands([(1023,)], seed=5, keep=1.0)
    check(adamw.SPEC, ops, flags=adamw.OPTAX_ADAMW | adamw.Flag.CLIP)
    unclipped = reference_fn(adamw.SPEC, flags=adamw.OPTAX_ADAMW)(*ops)
    assert_trees_close(
        kernel_fn(adamw.SPEC, flags=adamw.OPTAX_ADAMW | adamw.Flag.CLIP)(*ops), list(unclipped)
    )


@pytest.mark.parametrize("p_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("g_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_mixed_precision_parameters_and_gradients(p_dtype, g_dtype):
    ops = operands([(5,), (20_001,)], seed=3, p_dtype=p_dtype, g_dtype=g_dtype)
    check(adamw.SPEC, ops, flags=adamw.OPTAX_ADAMW)
    check(adamw.SPEC, ops, flags=adamw.OPTAX_ADAMW | adamw.Flag.UPDATE)


@pytest.mark.parametrize("state_dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("p_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_narrow_moments(state_dtype, p_dtype):
    # optax's mu_dtype (m narrow: in registers where p is f32), and both moments narrow (every
    # buffer in one narrow type: in registers, jgsess.optim.f32_math's update)
    sizes = [(5,), (20_001,), (70_001,)]
    for v_dtype in (jnp.float32, state_dtype):
        ops = operands(sizes, 4, p_dtype, p_dtype, m_dtype=state_dtype, v_dtype=v_dtype)
        check(adamw.SPEC, ops, flags=adamw.OPTAX_ADAMW)
        check(adamw.SPEC, ops, flags=adamw.OPTAX_ADAM | adamw.Flag.UPDATE)


def narrow_operands(sizes, dtype, seed=0):
    """An update written in `dtype`: every buffer of it, the hyper-parameters values of it."""
    ops = operands(sizes, seed, dtype, dtype, m_dtype=dtype, v_dtype=dtype)
    return [jnp.float32(s.astype(dtype)) for s in ops[:13]] + ops[13:]


# the narrow forms: no clipping, never exact
NARROW_FORMS = [flags | adamw.Flag.NARROW for flags in range(16)]


@pytest.mark.parametrize("flags", NARROW_FORMS)
def test_narrow_math_gives_the_bits_of_the_update_written_in_bf16(flags):
    # every operation rounded to bf16, as XLA's CPU code computes optax's bf16 update
    check(adamw.SPEC, narrow_operands(SIZES, jnp.bfloat16, seed=flags), exact=True, flags=flags)


@pytest.mark.parametrize("flags", NARROW_FORMS[::5])
def test_cuda_narrow_math_is_ieees_and_xlas_where_the_probe_says_so(flags, cuda_device):
    # bit for bit against the CPU's bf16 code; against XLA's on the GPU, bit for bit where
    # fuse-adamw's probe found them equal there (it fuses only then), else within an ulp
    probed = cuda_device is not None and numerics_match(
        Target.of(cuda_device), adamw.SPEC, flags, BF16
    )
    ops = narrow_operands(SIZES + [(1 << 20,)], jnp.bfloat16, seed=flags)
    check(adamw.SPEC, ops, exact=True, device=cuda_device, exact_on_device=probed, flags=flags)


@pytest.mark.parametrize("flags", [f for f in NARROW_FORMS if not f & adamw.Flag.BIAS_CORRECTION])
def test_narrow_math_in_f16(flags):
    # every operation rounded to f16, one at a time (XLA's CPU code divides an f16 array by a
    # scalar through an f16 reciprocal, the kernel through an f32 one: fuse-adamw leaves f16
    # updates with bias correction to XLA there)
    ops = narrow_operands(SIZES, jnp.float16, seed=flags)
    check(adamw.SPEC, ops, exact=True, op_by_op=True, flags=flags)


def test_narrow_math_rounds_each_tensor_to_its_own_dtype():
    ops = narrow_operands([(9,), (70_001,)], jnp.bfloat16, seed=7)
    ops += narrow_operands([(40_000,)], jnp.float16, seed=8)[13:]
    check(adamw.SPEC, ops, exact=True, op_by_op=True, flags=adamw.Flag.EPS_ROOT | adamw.Flag.NARROW)


def mixed_operands(sizes, dtype, seed=0):
    """optax's adamw with mu_dtype=float32 on `dtype` parameters: p, g, v in `dtype`, m f32;
    the hyper-parameters of MIXED_NARROW values of `dtype`, omb1 and wd too (Python floats that
    jnp rounds to the parameters' dtype before XLA widens their products)."""
    ops = operands(sizes, seed, dtype, dtype, m_dtype=jnp.float32, v_dtype=dtype)
    narrow = set(adamw.MIXED_NARROW) | {"omb1", "wd"}
    return [
        jnp.float32(s.astype(dtype)) if name in narrow else s
        for name, s in zip(adamw.SCALARS, ops[:13])
    ] + ops[13:]


# the mixed forms: no clipping, never exact
MIXED_FORMS = [flags | adamw.Flag.MIXED for flags in range(16)]


def check_mixed(ops, flags):
    # p' and m' within an ulp (XLA contracts some f32 multiply-adds, by the array's size; the
    # kernel fuses two), the bf16 second moment bit for bit
    check(adamw.SPEC, ops, flags=flags)
    got = kernel_fn(adamw.SPEC, flags=flags)(*ops)
    want = reference_fn(adamw.SPEC, flags=flags)(*ops)
    for v_got, v_want in zip(got[2::3], want[2::3]):
        assert v_got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(v_got), np.asarray(v_want))


@pytest.mark.parametrize("flags", MIXED_FORMS)
def test_mixed_math_matches_optax_with_an_f32_first_moment(flags):
    check_mixed(mixed_operands(SIZES, jnp.bfloat16, seed=flags), flags)


def test_mixed_math_on_many_tensors_in_one_call():
    ops = mixed_operands([(9,), (70_001,), (40_000,), (3,)], jnp.bfloat16, seed=7)
    check_mixed(ops, adamw.Flag.EPS_ROOT | adamw.Flag.WEIGHT_DECAY | adamw.Flag.MIXED)


def test_mixed_dtypes_in_one_call():
    ops = operands([(9,)], 1) + operands([(40_000,)], 2, jnp.bfloat16)[13:]
    check(adamw.SPEC, ops, flags=adamw.OPTAX_ADAM)


def test_zero_size_tensors_and_no_tensors():
    check(adamw.SPEC, operands([(0,), (4,), (0, 3)]), flags=adamw.OPTAX_ADAMW)
    assert kernel_fn(adamw.SPEC, flags=7)(*operands([])) == []


def test_every_element_is_written_in_place():
    ops = operands([(5,), (70_001,)], seed=11)
    expected = list(reference_fn(adamw.SPEC, flags=adamw.OPTAX_ADAMW)(*ops))
    pairs = tuple(sorted(adamw.SPEC.inplace({}, len(ops)).items()))
    donate = tuple(i for i, _ in pairs)
    fn = jax.jit(
        lambda *o: adamw.SPEC.primitive.bind(*o, flags=adamw.OPTAX_ADAMW, aliases=pairs),
        donate_argnums=donate,
    )
    copies = [jnp.copy(x) for x in ops]
    assert_trees_close(fn(*copies), expected, rtol=1e-6, atol=1e-8)
    assert all(copies[i].is_deleted() for i in donate)


def test_inplace_pairs():
    assert adamw.SPEC.inplace({}, 13 + 8) == {13: 0, 15: 1, 16: 2, 17: 3, 19: 4, 20: 5}
    # the update (result 0 of each tensor) gets a buffer of its own
    update = {"flags": adamw.Flag.UPDATE}
    assert adamw.SPEC.inplace(update, 13 + 8) == {15: 1, 16: 2, 19: 4, 20: 5}


def test_lowers_to_the_ffi_target_with_aliases():
    ops = operands([(4,)])
    pairs = ((13, 0), (15, 1), (16, 2))
    lowered = jax.jit(lambda *o: adamw.SPEC.primitive.bind(*o, flags=7, aliases=pairs)).lower(*ops)
    text = lowered.as_text()
    assert f"stablehlo.custom_call @{adamw.SPEC.target}" in text
    assert "output_operand_aliases" in text and "flags = 7" in text


def test_jvp_and_grad_through_the_reference():
    ops = operands([(6,)])
    prim = kernel_fn(adamw.SPEC, flags=adamw.OPTAX_ADAMW)
    ref = reference_fn(adamw.SPEC, flags=adamw.OPTAX_ADAMW)
    tangents = [jnp.ones_like(o) * 0.1 for o in ops]
    (out, tan), (rout, rtan) = jax.jvp(prim, ops, tangents), jax.jvp(ref, ops, tangents)
    assert_trees_close((out, tan), (list(rout), list(rtan)), rtol=1e-5, atol=1e-7)
    g = jax.grad(lambda p: prim(*ops[:13], p, *ops[14:])[0].sum())(ops[13])
    rg = jax.grad(lambda p: ref(*ops[:13], p, *ops[14:])[0].sum())(ops[13])
    assert_trees_close(g, rg, rtol=1e-5)


def test_vmap_through_the_reference():
    ops = operands([(3, 4)])
    batched = [jnp.stack([o, o * 1.5]) if o.ndim else o for o in ops]
    in_axes = [0 if o.ndim else None for o in ops]
    got = jax.vmap(kernel_fn(adamw.SPEC, flags=7), in_axes=in_axes)(*batched)
    want = jax.vmap(reference_fn(adamw.SPEC, flags=7), in_axes=in_axes)(*batched)
    assert_trees_close(got, list(want), rtol=1e-6)


def test_a_spec_without_a_compiled_kernel_lowers_to_its_reference():
    spec = KernelSpec("no_such_kernel", reference=lambda x, y: (x * y + 1,))
    text = (
        jax.jit(lambda x, y: spec.primitive.bind(x, y, aliases=()))
        .lower(jnp.ones(3), jnp.ones(3))
        .as_text()
    )
    assert "custom_call" not in text and "stablehlo.multiply" in text
    out = spec.primitive.bind(jnp.ones(3), jnp.full(3, 2.0), aliases=())[0]
    assert_trees_close(out, jnp.ones(3) * 3)


@pytest.mark.parametrize(
    "flags", [adamw.OPTAX_ADAMW, adamw.MINDSPORE_ADAM, adamw.OPTAX_ADAM | 8, 7 | 16]
)
@pytest.mark.parametrize("p_dtype", [jnp.float32, jnp.bfloat16])
def test_cuda_kernel_matches_reference(flags, p_dtype, cuda_device):
    sizes = SIZES + [(1 << 20,), (3, 70_001)] + [(17,)] * 200  # several launches
    for m_dtype in (jnp.float32, jnp.bfloat16):
        ops = operands(sizes, seed=flags, p_dtype=p_dtype, m_dtype=m_dtype)
        check(adamw.SPEC, ops, rtol=2e-6, device=cuda_device, flags=flags)


def malformed_calls():
    """Direct calls (tests/kernels/test_operand_checks.py): hyper-parameters, operands and
    results per tensor, flags."""
    good, bad = multi_tensor("jgsess_adamw", 13, 4, 3, flags=7, narrow=adamw.Flag.NARROW)
    operands = [jnp.float32(0.5)] * 13 + [array((N,), BF16)] * 4
    flags = (
        adamw.OPTAX_ADAMW | adamw.Flag.NARROW | adamw.Flag.CLIP
    )  # not a form: narrow clips in bf16
    bad["narrow math with clipping"] = call(
        "jgsess_adamw", operands, [spec((N,), BF16)] * 3, flags=flags
    )
    mixed = adamw.OPTAX_ADAMW | adamw.Flag.MIXED
    bad["mixed math with an f32 second moment"] = call(
        "jgsess_adamw",
        operands[:15] + [array((N,), F32)] * 2,
        [spec((N,), BF16), spec((N,), F32), spec((N,), F32)],
        flags=mixed,
    )
    bad["mixed math with a bf16 first moment"] = call(
        "jgsess_adamw", operands, [spec((N,), BF16)] * 3, flags=mixed
    )
    f16 = operands[:13] + [array((N,), F16)] * 2 + [array((N,), F32), array((N,), F16)]
    bad["mixed math in f16"] = call(
        "jgsess_adamw", f16, [spec((N,), F16), spec((N,), F32), spec((N,), F16)], flags=mixed
    )
    bad["mixed and narrow math"] = call(
        "jgsess_adamw", operands, [spec((N,), BF16)] * 3, flags=mixed | adamw.Flag.NARROW
    )
    mixed_operands = operands[:15] + [array((N,), F32), array((N,), BF16)]
    good["mixed math"] = call(
        "jgsess_adamw",
        mixed_operands,
        [spec((N,), BF16), spec((N,), F32), spec((N,), BF16)],
        flags=mixed,
    )
    return {"jgsess_adamw": (good, bad)}
