"""The batch_norm_relu kernels (forward, with a residual, and their gradients) against their
references: odd shapes, NHWC / NCHW / other ranks, f32 / bf16 / f16, JVP and vmap."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgsess.kernels import batch_norm
from jgsess.kernels.relu_mask import unpack
from tests.emulator import simt
from tests.helpers import assert_trees_close
from tests.kernels.bad_calls import BF16, F32, I32, U8, U32, N, array, spec

pytestmark = pytest.mark.usefixtures("kernels")

CASES = [  # (x shape, feature axis)
    ((3, 5, 7, 12), 3),  # NHWC
    ((3, 6, 5, 7), 1),  # NCHW
    ((33, 5), 1),  # (batch, features)
    ((40, 41, 9), 2),  # more than one task, rows not a multiple of 32
    ((4, 3, 3, 64), 3),  # channels a multiple of 32: the mask keeps x's leading dimensions
    ((3, 4, 30, 30), 1),  # NCHW, few channels: a CUDA thread steps over rows of 900
]


def rand(shape, seed):
    """Normal samples from numpy (jax.random compiles once per shape: slow here)."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def forward_ref(*operands, **params):
    return jax.jit(functools.partial(batch_norm.forward, **params))(*operands)


def backward_ref(*operands, **params):
    return jax.jit(functools.partial(batch_norm.backward, **params))(*operands)


def static(x, axis, dtype, form="flax"):
    return {"eps": 1e-3, "axis": axis, "form": form, "dtype": np.dtype(dtype).name}


def bind(spec, *operands, offset=64, device=None, **params):
    """Run `spec`'s kernel with its workspace at `offset` in a garbage-filled arena."""
    x = operands[0 if spec in (batch_norm.FORWARD, batch_norm.ADD_FORWARD) else 1]
    size = spec.workspace(params, [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in operands])
    arena = jnp.full((offset + size + 64,), 255, jnp.uint8)
    assert x.shape[params["axis"]] * 16 <= size
    if device is not None:
        operands, arena = jax.device_put((operands, arena), device)
    call = functools.partial(spec.primitive.bind, aliases=(), workspace=(offset, size), **params)
    lowered = jax.jit(lambda a, *o: call(a, *o)).lower(arena, *operands)
    assert spec.target in lowered.as_text()
    *outs, arena_out = lowered.compile()(arena, *operands)
    arena_out = np.asarray(arena_out)
    assert (arena_out[:offset] == 255).all() and (arena_out[offset + size :] == 255).all()
    return outs


def inputs(shape, axis, x_dtype=jnp.float32, seed=0):
    channels = shape[axis]
    x = (rand(shape, seed) * 3.0 + 2.0).astype(x_dtype)  # mean far from 0: stats must be stable
    scale = rand((channels,), seed + 1) + 1.0
    bias = rand((channels,), seed + 2) * 0.5
    return x, scale, bias


def forward_case(shape, axis, x_dtype, y_dtype, add, form="flax"):
    x, scale, bias = inputs(shape, axis, x_dtype)
    operands = [x, scale, bias] + ([rand(shape, 7).astype(y_dtype)] if add else [])
    params = {**static(x, axis, y_dtype, form), "stats_shape": (shape[axis],)}
    spec = batch_norm.ADD_FORWARD if add else batch_norm.FORWARD
    return spec, operands, params


TOL = {jnp.float32: 2e-5, jnp.bfloat16: 1e-2, jnp.float16: 2e-3}


@pytest.mark.parametrize("shape, axis", CASES)
def test_forward_matches_the_reference(shape, axis):
    for add in (False, True):
        spec, operands, params = forward_case(shape, axis, jnp.float32, jnp.float32, add)
        y, mean, var, mask = bind(spec, *operands, **params)
        ref = forward_ref(*operands, **params)
        assert_trees_close((y, mean, var), tuple(ref[:3]), rtol=2e-5, atol=2e-5)
        # the mask is s > 0: wherever y is not 0
        np.testing.assert_array_equal(unpack(mask, shape), np.asarray(y) > 0)


@pytest.mark.parametrize(
    "x_dtype, y_dtype",
    [
        (jnp.bfloat16, jnp.bfloat16),
        (jnp.bfloat16, jnp.float32),
        (jnp.float16, jnp.float16),
    ],
)
def test_forward_narrow_dtypes(x_dtype, y_dtype):
    spec, operands, params = forward_case((4, 6, 5, 16), 3, x_dtype, y_dtype, True)
    y, mean, var, _ = bind(spec, *operands, **params)
    ref = forward_ref(*operands, **params)
    assert y.dtype == ref[0].dtype == y_dtype
    tol = max(TOL[x_dtype], TOL[y_dtype]) * 4
    assert_trees_close((y, mean, var), tuple(ref[:3]), rtol=tol, atol=tol)


def test_forward_statistics_are_stable():
    # x = 3000 + small noise: flax's E[x^2] - E[x]^2 in f32 loses the variance, the kernel not
    x = 3000.0 + rand((8, 4, 4, 8), 3) * 0.01
    scale, bias = jnp.ones((8,)), jnp.zeros((8,))
    params = {**static(x, 3, jnp.float32, "flax_two_pass"), "stats_shape": (8,)}
    _, _, var, _ = bind(batch_norm.FORWARD, x, scale, bias, **params)
    exact = np.var(np.asarray(x, np.float64), axis=(0, 1, 2))
    np.testing.assert_allclose(var, exact, rtol=1e-3)


def backward_case(shape, axis, x_dtype, y_dtype, add, seed=0):
    spec, operands, params = forward_case(shape, axis, x_dtype, y_dtype, add)
    _, mean, var, mask = forward_ref(*operands, **params)
    dy = rand(shape, seed + 11).astype(y_dtype)
    grad_params = {k: v for k, v in params.items() if k != "stats_shape"} | {"add": add}
    spec = batch_norm.ADD_BACKWARD if add else batch_norm.BACKWARD
    return spec, [dy, operands[0], operands[1], mean, var, mask], grad_params, operands


@pytest.mark.parametrize("shape, axis", CASES)
def test_backward_matches_the_reference(shape, axis):
    for add in (False, True):
        spec, operands, params, _ = backward_case(shape, axis, jnp.float32, jnp.float32, add)
        got = bind(spec, *operands, **params)
        ref = backward_ref(*operands, **params)
        assert_trees_close(tuple(got), tuple(ref), rtol=5e-4, atol=5e-5)


@pytest.mark.parametrize("shape, axis", [((0, 5, 5, 8), 3), ((0, 8, 3, 3), 1), ((4, 3, 0), 1)])
@pytest.mark.parametrize("add", [False, True])
def test_an_empty_batch_gives_the_references_statistics(shape, axis, add):
    """mean and var are 0 / 0 (NaN) and dbias 0, every channel's written, and no kernel reads x."""
    spec, operands, params = forward_case(shape, axis, jnp.float32, jnp.float32, add)
    assert_trees_close(
        tuple(bind(spec, *operands, **params)), tuple(forward_ref(*operands, **params))
    )
    spec, operands, params, _ = backward_case(shape, axis, jnp.float32, jnp.float32, add)
    got = bind(spec, *operands, **params)
    assert_trees_close(tuple(got), tuple(backward_ref(*operands, **params)))


@pytest.mark.parametrize("shape, axis", [((4, 5, 5, 8), 3), ((4, 8, 3, 3), 1)])
def test_a_nan_passes_the_relu_as_in_the_reference(shape, axis):
    """A NaN in one channel makes its statistics and outputs NaN; the ReLU keeps NaN (as
    jax.nn.relu does), and the mask bit stays 0."""
    spec, operands, params = forward_case(shape, axis, jnp.float32, jnp.float32, False)
    x = np.asarray(operands[0]).copy()
    x[(0,) * axis + (1,)] = np.nan  # channel 1
    operands[0] = jnp.asarray(x)
    got = bind(spec, *operands, **params)
    assert_trees_close(tuple(got[:3]), tuple(forward_ref(*operands, **params)[:3]))
    assert np.isnan(np.moveaxis(np.asarray(got[0]), axis, 0)[1]).all()


def test_backward_narrow_dtypes():
    spec, operands, params, _ = backward_case((4, 6, 5, 16), 3, jnp.bfloat16, jnp.bfloat16, True)
    got = bind(spec, *operands, **params)
    ref = backward_ref(*operands, **params)
    assert [g.dtype for g in got] == [r.dtype for r in ref]
    assert_trees_close(tuple(got), tuple(ref), rtol=3e-2, atol=3e-2)


def test_backward_is_the_derivative_of_the_forward():
    spec, operands, params = forward_case((5, 4, 3, 6), 3, jnp.float32, jnp.float32, True)
    dy = rand((5, 4, 3, 6), 5)
    _, vjp = jax.vjp(lambda *o: batch_norm.forward(*o, **params)[0], *operands)
    expected = vjp(dy)
    _, mean, var, mask = forward_ref(*operands, **params)
    grad_params = {k: v for k, v in params.items() if k != "stats_shape"} | {"add": True}
    args = [dy, operands[0], operands[1], mean, var, mask]
    got = bind(batch_norm.ADD_BACKWARD, *args, **grad_params)
    assert_trees_close(tuple(got), tuple(expected), rtol=5e-4, atol=5e-5)


def test_jvp_and_vmap_go_through_the_reference():
    spec, operands, params = forward_case((4, 3, 3, 8), 3, jnp.float32, jnp.float32, False)
    size = spec.workspace(params, operands)
    arena = jnp.zeros((size,), jnp.uint8)
    call = functools.partial(spec.primitive.bind, aliases=(), workspace=(0, size), **params)
    tangents = [rand(o.shape, 20 + i) for i, o in enumerate(operands)]
    (y, *_), (ty, *_) = jax.jvp(lambda *o: call(arena, *o), operands, tangents)
    (ry, *_), (rty, *_) = jax.jvp(lambda *o: batch_norm.forward(*o, **params), operands, tangents)
    assert_trees_close((y, ty), (ry, rty), rtol=2e-5, atol=2e-5)
    xs = jnp.stack([operands[0], operands[0] * 2.0 + 1.0])
    batched = jax.vmap(lambda x: call(arena, x, *operands[1:])[0])(xs)
    expected = jax.vmap(lambda x: batch_norm.forward(x, *operands[1:], **params)[0])(xs)
    assert_trees_close(batched, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("shape, axis", CASES)
def test_the_references_give_the_kernels_result_shapes(shape, axis):
    # where XLA runs the reference in the kernel's place (jax.export, a partitioned program)
    spec, operands, params = forward_case(shape, axis, jnp.float32, jnp.float32, False)
    params["stats_shape"] = (1,) * (len(shape) - 1) + (-1,)  # flax keeps (C,); any rank works
    avals = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in operands]
    want = [(a.shape, a.dtype) for a in spec.result_avals(avals, params)]
    got = jax.eval_shape(functools.partial(batch_norm.forward, **params), *operands)
    assert [(g.shape, g.dtype) for g in got] == want
    assert want[1][0] == (1,) * (len(shape) - 1) + (shape[axis],)


@pytest.mark.parametrize(
    "shape, axis, splits",
    [
        ((32, 56, 56, 64), 3, 256),  # the most splits
        ((32, 7, 7, 2048), 3, 32),  # 1 MB of (sum, sum of squares) pairs
        ((3, 5, 7, 12), 3, 1),
        ((2, 0, 3), 1, 1),  # no channels
    ],
)
def test_workspace_size_mirrors_the_kernel(shape, axis, splits):
    aval = jax.ShapeDtypeStruct(shape, jnp.float32)
    size = batch_norm.FORWARD.workspace({"axis": axis}, [aval])
    assert size == splits * 2 * shape[axis] * 8 + 16 * shape[axis]


def test_the_cuda_statistics_launch_enough_blocks_to_fill_a_gpu(kernels):
    """ResNet-50's first BatchNorm (NHWC, 64 channels): over 2 blocks per SM of an H200."""
    if kernels != "simt":
        pytest.skip("the CUDA handler's launches, emulated")
    spec, operands, params = forward_case((32, 56, 56, 64), 3, jnp.float32, jnp.float32, False)
    simt.module().launches()
    bind(spec, *operands, **params)
    grids = {name: grid for name, grid, _ in simt.module().launches()}
    assert grids["SumsLast"][0] * grids["SumsLast"][1] >= 2 * 132, grids


@pytest.mark.parametrize("shape, axis", CASES + [((32, 56, 56, 64), 3), ((32, 64, 28, 28), 1)])
@pytest.mark.parametrize("add", [False, True])
def test_cuda_kernels_match_the_references(shape, axis, add, cuda_device):
    spec, operands, params = forward_case(shape, axis, jnp.float32, jnp.float32, add)
    got = bind(spec, *operands, device=cuda_device, **params)
    ref = forward_ref(*operands, **params)
    assert_trees_close(tuple(got[:3]), tuple(ref[:3]), rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(unpack(got[3], shape), np.asarray(got[0]) > 0)
    spec, operands, params, _ = backward_case(shape, axis, jnp.bfloat16, jnp.bfloat16, add)
    got = bind(spec, *operands, device=cuda_device, **params)
    ref = backward_ref(*operands, **params)
    assert_trees_close(tuple(got), tuple(ref), rtol=3e-2, atol=3e-2)


def malformed_calls():
    """Direct calls of the four BatchNorm targets (tests/kernels/test_operand_checks.py): x
    (N / 64, 64), features on axis 1."""
    rows, channels = N // 64, 64
    words = N // 32
    work = 64 * 2 * channels * 8 + 16 * channels  # csrc/kernels/batch_norm/batch_norm.h
    x, z, dy = (
        array((rows, channels), BF16),
        array((rows, channels), F32),
        array((rows, channels), F32),
    )
    c = array((channels,), F32)
    m = array((words,), U32)
    arena = array((work,), U8)

    def bn(target, ins, outs, axis=1, offset=0):
        fn = jax.ffi.ffi_call(target, outs, has_side_effect=True)
        attrs = {
            "eps": np.float32(1e-5),
            "axis": np.int64(axis),
            "workspace_offset": np.int64(offset),
        }
        return lambda: jax.block_until_ready(fn(*ins, **attrs))

    def fwd(add=False, x=x, scale=c, y=None, mean=None, mask=None, arena=arena, **kw):
        target = "jgsess_batch_norm_add_relu" if add else "jgsess_batch_norm_relu"
        y = spec((rows, channels), F32) if y is None else y
        mean = spec((channels,), F32) if mean is None else mean
        mask = spec((words,), U32) if mask is None else mask
        outs = [y, mean, spec((channels,), F32), mask, spec(arena.shape, U8)]
        return bn(target, [arena, x, scale, c, *([z] if add else [])], outs, **kw)

    def bwd(add=False, dy=dy, mask=m, dx=None, dscale=None, arena=arena, **kw):
        target = "jgsess_batch_norm_add_relu_grad" if add else "jgsess_batch_norm_relu_grad"
        dx = spec((rows, channels), BF16) if dx is None else dx
        dscale = spec((channels,), F32) if dscale is None else dscale
        outs = [dx, dscale, spec((channels,), F32), *([spec(dy.shape, dy.dtype)] if add else [])]
        return bn(target, [arena, dy, x, c, c, c, mask], [*outs, spec(arena.shape, U8)], **kw)

    def both(make, add):
        return {
            "a bad axis": make(add, axis=2),
            "a negative offset": make(add, offset=-8),
            "a workspace past the arena": make(add, offset=64),
            "an offset not 8-byte aligned": make(add, offset=4, arena=array((work + 8,), U8)),
            "a short arena": make(add, arena=array((8,), U8)),
            "a short mask": make(add, mask=array((1,), U32))
            if make is bwd
            else make(add, mask=spec((1,), U32)),
        }

    table = {}
    for add, name in ((False, "relu"), (True, "add_relu")):
        table[f"jgsess_batch_norm_{name}"] = (
            {"well formed": fwd(add)},
            {
                **both(fwd, add),
                "an integer x": fwd(add, x=array((rows, channels), I32)),
                "a short scale": fwd(add, scale=array((3,), F32)),
                "a 1-element y": fwd(add, y=spec((1,), F32)),
                "a short mean": fwd(add, mean=spec((1,), F32)),
            },
        )
        table[f"jgsess_batch_norm_{name}_grad"] = (
            {"well formed": bwd(add)},
            {
                **both(bwd, add),
                "a short dy": bwd(add, dy=array((1,), F32)),
                "an f32 dx for a bf16 x": bwd(add, dx=spec((rows, channels), F32)),
                "a short dscale": bwd(add, dscale=spec((1,), F32)),
            },
        )
    return table
