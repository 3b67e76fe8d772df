"""Constants named once per language: Python's must be the values the extension reports (the
optimizer kernels' `flags` bits, the chunk of multi-tensor work)."""

from jgsess import _C
from jgsess.kernels import adamw, global_norm, momentum


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


def test_the_chunk_is_the_kernels_chunk():
    assert global_norm.CHUNK == _C.CHUNK
