"""Calls every registered FFI target directly, well formed and malformed; run as a script.

`python -m tests.kernels.bad_calls` prints one line per call: `ok <case>` where the call ran,
`error <case>: <message>` where it raised. A handler that wrote out of bounds would crash the
process instead (tests/kernels/test_operand_checks.py runs this in a subprocess). Sizes are
large enough (1M elements) that an unchecked write past a small result lands outside its heap
block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jgsess.kernels import _native

N = 1 << 20
F32, BF16, F16, I32, U8, U32 = (
    jnp.float32,
    jnp.bfloat16,
    jnp.float16,
    jnp.int32,
    jnp.uint8,
    jnp.uint32,
)


def array(shape, dtype):
    return jnp.ones(shape, dtype)


def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def call(target, operands, results, **attrs):
    """A thunk running target(*operands) -> results."""
    fn = jax.ffi.ffi_call(target, results, has_side_effect=True)  # runs even with no results
    attrs = {k: np.int64(v) for k, v in attrs.items()}
    return lambda: jax.block_until_ready(fn(*operands, **attrs))


def multi_tensor(target, hyper, kin, kout, f32_in, f32_out, flags):
    """Well-formed and malformed calls of a multi-tensor kernel: `hyper` rank-0 f32 operands,
    kin operands and kout results per tensor, f32 in the slots `f32_in` / `f32_out`."""
    scalars = [jnp.float32(0.5)] * hyper

    def tensor(n=N, bad_in=None, bad_out=None):
        ins = [array((n,), F32 if k in f32_in else BF16) for k in range(kin)]
        outs = [spec((n,), F32 if k in f32_out else BF16) for k in range(kout)]
        if bad_in:
            ins[bad_in[0]] = bad_in[1]
        if bad_out:
            outs[bad_out[0]] = bad_out[1]
        return ins, outs

    def case(*tensors, scalars=scalars, extra_in=(), extra_out=(), **attrs):
        ins = [x for t in tensors for x in t[0]]
        outs = [o for t in tensors for o in t[1]]
        attrs = attrs or ({"flags": flags} if flags is not None else {})
        return call(target, [*scalars, *ins, *extra_in], [*outs, *extra_out], **attrs)

    no_operands = call(target, [], [], **({"flags": flags} if flags is not None else {}))
    good = {"well formed": case(tensor(), tensor(7))}
    bad = {
        "an operand short": case(tensor(), extra_in=[array((N,), F32)]),
        "a result short": case(tensor(), extra_out=[spec((N,), F32)]),
        "a result too small": case(tensor(bad_out=(0, spec((1,), F32)))),
        "a later result too small": case(tensor(7), tensor(bad_out=(kout - 1, spec((1,), F32)))),
        "an operand too small": case(tensor(bad_in=(kin - 1, array((1,), F32)))),
        "an integer operand": case(tensor(bad_in=(0, array((N,), I32)))),
        "an integer result": case(tensor(bad_out=(0, spec((N,), I32)))),
    }
    if f32_in:
        bad["bf16 state"] = case(tensor(bad_in=(max(f32_in), array((N,), BF16))))
        bad["bf16 new state"] = case(tensor(bad_out=(max(f32_out), spec((N,), BF16))))
    if hyper:
        bad["no operands"] = no_operands
        bad["hyper-parameters missing"] = case(scalars=scalars[:-1])
        bad["an f16 hyper-parameter"] = case(tensor(), scalars=[*scalars[:-1], jnp.float16(1)])
        bad["a rank-1 hyper-parameter"] = case(tensor(), scalars=[*scalars[:-1], jnp.ones(2)])
    else:
        good["no operands"] = no_operands
    if flags is not None:
        bad["unknown flags"] = case(tensor(), flags=1 << 20)
    return good, bad


def global_norm():
    xs = [array((N,), BF16), array((7,), F32)]
    items = (N >> 16) + 1
    arena = array((64 + 8 * items,), U8)

    def case(xs=xs, arena=arena, arena_out=None, offset=64, norm=None):
        out = spec(arena.shape, U8) if arena_out is None else arena_out
        norm = spec((), F32) if norm is None else norm
        return call("jgsess_global_norm", [arena, *xs], [norm, out], workspace_offset=offset)

    good = {"well formed": case(), "no tensors": case(xs=[])}
    bad = {
        "no operands": call("jgsess_global_norm", [], [spec((), F32), spec((8,), U8)]),
        "a negative offset": case(offset=-64),
        "an unaligned offset": case(offset=62),
        "an offset past the arena": case(offset=1 << 40),
        "a workspace too large": case(offset=64 + 4 * items + 8),  # 4 bytes per chunk on CPUs
        "an arena result smaller than the arena": case(arena_out=spec((8,), U8)),
        "an integer tensor": case(xs=[array((N,), I32)]),
        "an f16 norm": case(norm=spec((), F16)),
        "a rank-1 norm": case(norm=spec((1,), F32)),
        "a result short": call("jgsess_global_norm", [arena, *xs], [spec((), F32)]),
    }
    return good, bad


def relu_mask():
    words = N // 32

    def fwd(ins, y=None, mask=None):
        y = spec((N,), BF16) if y is None else y
        mask = spec((words,), U32) if mask is None else mask
        return call("jgsess_relu_mask", ins, [y, mask])

    def bwd(mask, grads, dx=None):
        dx = spec((N,), BF16) if dx is None else dx
        return call("jgsess_relu_mask_grad", [mask, *grads], [dx])

    x = array((N,), BF16)
    m = array((words,), U32)
    forward = (
        {"well formed": fwd([x]), "two operands": fwd([x, x])},
        {
            "no operands": fwd([]),
            "three operands": fwd([x, x, x]),
            "a 1-element result": fwd([x], y=spec((1,), BF16)),
            "an f32 result": fwd([x], y=spec((N,), F32)),
            "a short mask": fwd([x], mask=spec((1,), U32)),
            "an f32 mask": fwd([x], mask=spec((words,), F32)),
            "operands differ in size": fwd([x, array((1,), BF16)]),
            "operands differ in dtype": fwd([x, array((N,), F16)]),
            "an integer operand": fwd([array((N,), I32)], y=spec((N,), I32)),
            "a result short": call("jgsess_relu_mask", [x], [spec((N,), BF16)]),
        },
    )
    backward = (
        {"well formed": bwd(m, [x]), "two gradients": bwd(m, [x, x])},
        {
            "no gradients": bwd(m, []),
            "no operands": call("jgsess_relu_mask_grad", [], [spec((N,), BF16)]),
            "a 1-element dx": bwd(m, [x], dx=spec((1,), BF16)),
            "an f32 dx": bwd(m, [x], dx=spec((N,), F32)),
            "a short mask": bwd(array((1,), U32), [x]),
            "an f32 mask": bwd(array((words,), F32), [x]),
            "gradients differ in size": bwd(m, [x, array((1,), BF16)]),
        },
    )
    return {"jgsess_relu_mask": forward, "jgsess_relu_mask_grad": backward}


def batch_norm():
    """The four BatchNorm targets: x (N / 64, 64), features on axis 1."""
    rows, channels = N // 64, 64
    words = N // 32
    work = 16 * 2 * channels * 8 + 16 * channels  # csrc/kernels/batch_norm/batch_norm.h
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


def cases() -> dict[str, tuple[dict, dict]]:
    """target -> (well-formed calls, malformed calls), each {name: thunk}."""
    return {
        "jgsess_adamw": multi_tensor("jgsess_adamw", 13, 4, 3, {2, 3}, {1, 2}, flags=7),
        "jgsess_momentum": multi_tensor("jgsess_momentum", 4, 3, 2, {2}, {1}, flags=3),
        "jgsess_cast_all": multi_tensor("jgsess_cast_all", 0, 1, 1, set(), set(), flags=None),
        "jgsess_global_norm": global_norm(),
        **relu_mask(),
        **batch_norm(),
    }


def main() -> None:
    registered = set(_native.targets())
    table = cases()
    missing = registered - set(table)
    print(f"targets {sorted(registered)}", flush=True)
    if missing:
        print(f"untested {sorted(missing)}", flush=True)
    for target in sorted(registered & set(table)):
        good, bad = table[target]
        for name, thunk in [*good.items(), *bad.items()]:
            label = f"{target}: {name}"
            try:
                thunk()
            except Exception as err:  # noqa: BLE001 - every error is reported, typed
                message = str(err).splitlines()[0][:200] if str(err) else ""
                print(f"error {type(err).__name__} {label}: {message}", flush=True)
            else:
                print(f"ok {label}", flush=True)


if __name__ == "__main__":
    main()
