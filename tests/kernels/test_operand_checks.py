"""Every registered FFI target, called directly with malformed operands, returns an error (the
operand checkers run before any write) and never crashes the process; every target but the
CPU-only async hint (which takes any operand) has a kernel spec and a compiled CPU handler (and
a CUDA one where the CUDA kernels are built)."""

import importlib
import os
import pkgutil
import subprocess
import sys

import jax.numpy as jnp
import pytest

import jgsess.kernels
from jgsess.kernels import _native
from jgsess.kernels.spec import ASYNC_HINT_TARGET, KernelSpec
from tests.emulator import simt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def specs() -> dict[str, KernelSpec]:
    """target -> spec, over every module of jgsess.kernels."""
    found = {}
    for info in pkgutil.iter_modules(jgsess.kernels.__path__):
        module = importlib.import_module(f"jgsess.kernels.{info.name}")
        for value in vars(module).values():
            if isinstance(value, KernelSpec):
                found[value.target] = value
    return found


def test_every_target_has_a_spec_and_every_spec_a_registration():
    from jgsess import _C

    assert set(specs()) | {ASYNC_HINT_TARGET} == set(_native.targets())
    for target, platforms in _native.targets().items():
        assert "cpu" in platforms, target
        assert ("cuda" in platforms) == (_C.has_cuda() and target != ASYNC_HINT_TARGET), target


def run_bad_calls(platform: str, kernels: str = "native") -> list[str]:
    """The lines `python -m tests.kernels.bad_calls` prints on `platform`, calling the native
    handlers or ("simt") the CUDA handlers under the SIMT emulator."""
    env = dict(os.environ, JAX_PLATFORMS=platform, JGSESS_TEST_KERNELS=kernels)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kernels.bad_calls"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"crashed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.splitlines()


def check_lines(lines: list[str], targets=None) -> None:
    """Every well-formed call of `targets` (default: all) ran, every malformed one raised."""
    from tests.kernels import bad_calls

    assert not any(line.startswith("untested") for line in lines), lines
    for target, (good, bad) in bad_calls.cases().items():
        if targets is not None and target not in targets:
            continue
        for name in good:
            assert f"ok {target}: {name}" in lines, (target, name, lines)
        for name in bad:
            hits = [
                line
                for line in lines
                if line.endswith(f"{target}: {name}") or f" {target}: {name}:" in line
            ]
            assert hits and all(
                h.startswith("error JaxRuntimeError") or h.startswith("error XlaRuntimeError")
                for h in hits
            ), (target, name, hits)


def test_malformed_calls_are_errors_not_crashes():
    check_lines(run_bad_calls("cpu"))


def test_malformed_calls_of_the_cuda_handlers_are_errors_under_the_emulator():
    emulated = {f"jgsess_{name}" for name in simt.kernels()}
    assert emulated == set(_native.targets()) - {ASYNC_HINT_TARGET}  # every CUDA handler
    check_lines(run_bad_calls("cpu", "simt"), emulated)


@pytest.mark.gpu
def test_malformed_calls_are_errors_not_crashes_on_cuda():
    check_lines(run_bad_calls("cuda"))


@pytest.mark.parametrize(
    "case, message",
    [
        (
            "a gradient of another size",
            r"adamw: tensor 1's operand 1 \(call operand 18\) is bfloat16\[6\]; expected "
            r"float32, bfloat16 or float16 of 7 elements",
        ),
        ("an int result", r"tensor 0's result 2 \(call result 2\) is int32\[5\]"),
        ("an int hyper-parameter", r"hyper-parameter 3 is int32\[\]; expected float32"),
        ("a missing result", r"8 tensor operands and 5 results do not pair up; expected 4 "),
    ],
)
def test_a_malformed_call_says_which_operand_and_what_was_expected(case, message):
    from tests.kernels.bad_calls import BF16, array, call, spec

    hyper = [jnp.float32(0.5)] * 13
    ins = [array((5,), BF16)] * 4 + [array((7,), BF16)] * 4
    outs = [spec((5,), BF16)] * 3 + [spec((7,), BF16)] * 3
    if case == "a gradient of another size":
        ins[5] = array((6,), BF16)
    elif case == "an int result":
        outs[2] = spec((5,), jnp.int32)
    elif case == "an int hyper-parameter":
        hyper[3] = jnp.int32(1)
    else:
        outs = outs[:5]
    with pytest.raises(Exception, match=message):
        call("jgsess_adamw", [*hyper, *ins], outs, flags=0)()


@pytest.mark.parametrize(
    "target, case, message",
    [
        (
            "jgsess_batch_norm_relu",
            "a short scale",
            r"batch_norm_relu: scale is float32\[3\]; expected float32 of 64 elements \(x's "
            r"channels\)",
        ),
        (
            "jgsess_batch_norm_relu_grad",
            "an f32 dx for a bf16 x",
            r"dx is float32\[\d+,64\]; expected bfloat16 \(x's dtype\) of \d+ elements \(as x\)",
        ),
        ("jgsess_batch_norm_relu", "a short mask", r"the mask is uint32\[1\]; expected uint32 of"),
        ("jgsess_batch_norm_relu", "a bad axis", r"axis 2 is outside x \(bfloat16\[\d+,64\]\)"),
        (
            "jgsess_batch_norm_relu",
            "a workspace past the arena",
            r"the workspace \(\d+ bytes at offset 64\) does not fit the arena \(\d+ bytes\)",
        ),
        (
            "jgsess_global_norm",
            "a workspace too large",
            r"global_norm: the workspace \(\d+ bytes for \d+ chunks, at offset \d+, 4-byte "
            r"aligned\) does not fit the arena \(\d+ bytes\)",
        ),
    ],
)
def test_a_malformed_workspace_kernel_call_says_what_is_wrong(target, case, message):
    from tests.kernels import test_batch_norm, test_global_norm

    calls = {**test_batch_norm.malformed_calls(), **test_global_norm.malformed_calls()}
    _, bad = calls[target]
    with pytest.raises(Exception, match=message):
        bad[case]()
