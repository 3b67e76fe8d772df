"""The adamw kernel against its pure-JAX reference: random inputs, odd sizes, every form."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgsess.kernels import adamw
from jgsess.kernels.spec import KernelSpec
from tests.helpers import assert_trees_close

SIZES = [(1,), (7,), (1023,), (33, 65), (100_003,)]


def operands(sizes, seed=0):
    key = jax.random.PRNGKey(seed)
    k = iter(jax.random.split(key, 64))
    step = 3
    b1, b2 = 0.9, 0.999
    scalars = [b1, 1 - b1, b2, 1 - b2, 1 - b1**step, 1 - b2**step, 1e-8, 1e-12, 1e-2, 1e-3]
    scalars = [jnp.float32(s) for s in scalars]
    tensors = []
    for shape in sizes:
        p = jax.random.normal(next(k), shape)
        g = 0.1 * jax.random.normal(next(k), shape)
        m = 0.01 * jax.random.normal(next(k), shape)
        v = 1e-4 * jax.random.uniform(next(k), shape)
        tensors += [p, g, m, v]
    return scalars + tensors


def kernel(flags, aliases=()):
    bind = functools.partial(adamw.SPEC.primitive.bind, flags=flags, aliases=aliases)
    return jax.jit(lambda *ops: bind(*ops))


def reference(flags):
    return jax.jit(functools.partial(adamw.reference, flags=flags))


@pytest.mark.parametrize("flags", range(8))
def test_kernel_matches_reference_on_odd_sizes(flags):
    ops = operands(SIZES, seed=flags)
    assert_trees_close(kernel(flags)(*ops), list(reference(flags)(*ops)), rtol=1e-6, atol=1e-8)


def test_every_element_is_written_in_place():
    ops = operands([(5,), (70_001,)], seed=11)
    expected = list(reference(adamw.OPTAX_ADAMW)(*ops))
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
    assert adamw.SPEC.inplace({}, 10 + 8) == {10: 0, 12: 1, 13: 2, 14: 3, 16: 4, 17: 5}


def test_lowers_to_the_ffi_target_with_aliases():
    ops = operands([(4,)])
    pairs = ((10, 0), (12, 1), (13, 2))
    text = (
        jax.jit(lambda *o: adamw.SPEC.primitive.bind(*o, flags=7, aliases=pairs))
        .lower(*ops)
        .as_text()
    )
    assert "stablehlo.custom_call @jgsess_adamw" in text
    assert "output_operand_aliases" in text and "flags = 7" in text


def test_jvp_and_grad_through_the_reference():
    ops = operands([(6,)])
    prim = kernel(adamw.OPTAX_ADAMW)
    ref = reference(adamw.OPTAX_ADAMW)
    tangents = [jnp.ones_like(o) * 0.1 for o in ops]
    (out, tan), (rout, rtan) = jax.jvp(prim, ops, tangents), jax.jvp(ref, ops, tangents)
    assert_trees_close((out, tan), (list(rout), list(rtan)), rtol=1e-5, atol=1e-7)
    g = jax.grad(lambda p: prim(*ops[:10], p, *ops[11:])[0].sum())(ops[10])
    rg = jax.grad(lambda p: ref(*ops[:10], p, *ops[11:])[0].sum())(ops[10])
    assert_trees_close(g, rg, rtol=1e-5)


def test_vmap_through_the_reference():
    ops = operands([(3, 4)])
    batched = [jnp.stack([o, o * 1.5]) if o.ndim else o for o in ops]
    in_axes = [0 if o.ndim else None for o in ops]
    got = jax.vmap(kernel(adamw.OPTAX_ADAMW), in_axes=in_axes)(*batched)
    want = jax.vmap(reference(adamw.OPTAX_ADAMW), in_axes=in_axes)(*batched)
    assert_trees_close(got, list(want), rtol=1e-6)


def test_a_spec_without_a_compiled_kernel_lowers_to_its_reference():
    spec = KernelSpec("no_such_kernel", reference=lambda x, y: (x * y + 1,))
    text = (
        jax.jit(lambda x, y: spec.primitive.bind(x, y, aliases=()))
        .lower(jnp.ones(3), jnp.ones(3))
        .as_text()
    )
    assert "custom_call" not in text and "stablehlo.multiply" in text
    np.testing.assert_array_equal(
        spec.primitive.bind(jnp.ones(3), jnp.full(3, 2.0), aliases=())[0], 3.0
    )


@pytest.mark.gpu
@pytest.mark.parametrize("flags", [adamw.OPTAX_ADAMW, adamw.MINDSPORE_ADAM])
def test_cuda_kernel_matches_reference(flags):
    gpu = jax.devices("gpu")[0]
    ops = jax.device_put(operands(SIZES + [(1 << 20,), (3, 70_001)], seed=flags), gpu)
    # poison the allocator: results must overwrite every element of a reused buffer
    jax.block_until_ready([jnp.full(s.shape, jnp.nan) for s in ops])
    assert_trees_close(kernel(flags)(*ops), list(reference(flags)(*ops)), rtol=2e-6, atol=1e-8)
