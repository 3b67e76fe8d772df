"""Calls every registered FFI target directly, well formed and malformed; run as a script.

Each kernel's test module (tests/kernels/test_<name>.py) lists its calls in `malformed_calls()`,
built with the helpers here.

`python -m tests.kernels.bad_calls` prints one line per call (with JGSESS_TEST_KERNELS=simt,
of the CUDA handlers under the SIMT emulator, tests/emulator/): `ok <case>` where the call ran,
`error <case>: <message>` where it raised. A handler that wrote out of bounds would crash the
process instead (tests/kernels/test_operand_checks.py runs this in a subprocess). Sizes are
large enough (1M elements) that an unchecked write past a small result lands outside its heap
block.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np

import tests.kernels
from jgsess import platforms
from jgsess.kernels import _native
from tests.emulator import simt

EMULATED = os.environ.get("JGSESS_TEST_KERNELS") == "simt"

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
    """A thunk running target(*operands) -> results (its emulated CUDA handler, EMULATED)."""
    if EMULATED:
        target = simt.target(target.removeprefix("jgsess_"))
    fn = jax.ffi.ffi_call(target, results, has_side_effect=True)  # runs even with no results
    attrs = {k: np.int64(v) for k, v in attrs.items()}
    return lambda: jax.block_until_ready(fn(*operands, **attrs))


def multi_tensor(target, hyper, kin, kout, flags, narrow=None):
    """Well-formed and malformed calls of a multi-tensor kernel: `hyper` rank-0 f32 operands,
    kin operands and kout results per tensor (bf16; f32 and f16 in the second well-formed
    call). `narrow`: the kernel's narrow-math flag (every buffer of a tensor one of bf16,
    f16)."""
    scalars = [jnp.float32(0.5)] * hyper

    def tensor(n=N, bad_in=None, bad_out=None, dtype=BF16):
        ins = [array((n,), dtype) for _ in range(kin)]
        outs = [spec((n,), dtype) for _ in range(kout)]
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
    good = {
        "well formed": case(tensor(), tensor(7)),
        "f32 and f16 tensors": case(tensor(dtype=F32), tensor(7, dtype=F16)),
    }
    bad = {
        "an operand short": case(tensor(), extra_in=[array((N,), F32)]),
        "a result short": case(tensor(), extra_out=[spec((N,), F32)]),
        "a result too small": case(tensor(bad_out=(0, spec((1,), F32)))),
        "a later result too small": case(tensor(7), tensor(bad_out=(kout - 1, spec((1,), F32)))),
        "an operand too small": case(tensor(bad_in=(kin - 1, array((1,), F32)))),
        "an integer operand": case(tensor(bad_in=(0, array((N,), I32)))),
        "an integer result": case(tensor(bad_out=(0, spec((N,), I32)))),
    }
    if hyper:
        bad["no operands"] = no_operands
        bad["hyper-parameters missing"] = case(scalars=scalars[:-1])
        bad["an f16 hyper-parameter"] = case(tensor(), scalars=[*scalars[:-1], jnp.float16(1)])
        bad["a rank-1 hyper-parameter"] = case(tensor(), scalars=[*scalars[:-1], jnp.ones(2)])
    else:
        good["no operands"] = no_operands
    if flags is not None:
        bad["unknown flags"] = case(tensor(), flags=1 << 20)
    if narrow is not None:
        good["narrow math"] = case(tensor(), tensor(7, dtype=F16), flags=flags | narrow)
        bad["narrow math over f32 tensors"] = case(tensor(dtype=F32), flags=flags | narrow)
        bad["narrow math over an f32 operand"] = case(
            tensor(bad_in=(kin - 1, array((N,), F32))), flags=flags | narrow
        )
        bad["narrow math with an f16 result"] = case(
            tensor(bad_out=(0, spec((N,), F16))), flags=flags | narrow
        )
    return good, bad


def cases() -> dict[str, tuple[dict, dict]]:
    """target -> (well-formed calls, malformed calls), each {name: thunk}, from every kernel
    test module's `malformed_calls()`."""
    found = {}
    for info in pkgutil.iter_modules(tests.kernels.__path__):
        module = importlib.import_module(f"tests.kernels.{info.name}")
        if info.name.startswith("test_") and hasattr(module, "malformed_calls"):
            found.update(module.malformed_calls())
    return found


def main() -> None:
    platform = platforms.program_platform()
    registered = {t for t, platforms in _native.targets().items() if platform in platforms}
    if EMULATED:
        registered = {f"jgsess_{name}" for name in simt.kernels()}
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
