"""The optimizer kernels' `flags` bits are named once per language: Python's `Flag` enums
(jgsess/kernels/adamw.py, momentum.py) must be the C++ enums the extension reports."""

from jgsess import _C
from jgsess.kernels import adamw, momentum


def test_python_flags_are_the_kernels_flags():
    reported = _C.kernel_flags()
    assert set(reported) == {"adamw", "momentum"}
    for kernel in (adamw, momentum):
        assert {flag.name: int(flag) for flag in kernel.Flag} == reported[kernel.SPEC.name]


def test_the_presets_are_made_of_flags():
    assert adamw.OPTAX_ADAMW == adamw.Flag.BIAS_CORRECTION | adamw.Flag.EPS_ROOT | (
        adamw.Flag.WEIGHT_DECAY
    )
    assert adamw.OPTAX_ADAM & adamw.Flag.WEIGHT_DECAY == 0
