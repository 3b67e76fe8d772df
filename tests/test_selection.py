"""jgsess.selection: one target per compilation, and the order in which a fused node's decision
is made (available, forced, policy, measured or cost model, compiled kernel)."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgsess import platforms, selection
from jgsess.kernels import adamw, global_norm, momentum, relu_mask
from jgsess.passes.manager import CompileRecord
from jgsess.platforms import Target
from jgsess.selection import Impl

CPU = Target.of(platform="cpu")


def node(spec, tensors: int, dtype=np.float32, flags: int = 0, scalars: int = 0):
    """A fused node of `spec` with `scalars` rank-0 f32 operands, then `tensors` operands of 300
    elements of `dtype`."""
    avals = [jax.ShapeDtypeStruct((), np.float32)] * scalars
    avals += [jax.ShapeDtypeStruct((300,), dtype)] * tensors
    inputs = [types.SimpleNamespace(aval=a, shape=a.shape, dtype=a.dtype) for a in avals]
    return types.SimpleNamespace(op=spec, params={"flags": flags}, inputs=inputs)


def test_the_target_is_the_pinned_device_else_the_default():
    device = jax.devices("cpu")[-1]
    target = Target.of(device, compiler_options=[("b", 1), ("a", 2)], budget=0.5)
    assert (target.platform, target.device, target.budget) == ("cpu", device, 0.5)
    assert target.runner() is device
    assert Target.of().device == platforms.default_device()
    elsewhere = Target.of(platform="rocm")  # planned for a machine this process is not
    assert elsewhere.platform == "rocm" and elsewhere.device is None
    with pytest.raises(RuntimeError, match="no rocm device"):
        elsewhere.runner()
    assert not selection.numerics_match(elsewhere, adamw.SPEC, adamw.Flag.NARROW, np.float16)


def test_a_node_is_decided_in_order(monkeypatch):
    record = CompileRecord()
    few, many = node(global_norm.SPEC, 2), node(global_norm.SPEC, 6)
    # 5: the cost model, measuring off (the suite's JGSESS_AUTOTUNE=0)
    decision = selection.decide(CPU, few, record)
    assert decision == selection.Decision(Impl.XLA, decision.reason)
    assert "JGSESS_AUTOTUNE=0" in decision.reason and "a few tensors" in decision.reason
    assert selection.decide(CPU, many, record).kernel
    # 1: not compiled for the platform
    rocm = selection.decide(Target.of(platform="rocm"), many, record)
    assert rocm == selection.Decision(Impl.XLA, "no compiled rocm kernel")
    # 1: turned off, before 2: forced
    monkeypatch.setenv("JGSESS_KERNELS", "off:global_norm")
    assert selection.decide(CPU, many, record).reason == "JGSESS_KERNELS turns it off"
    monkeypatch.setenv("JGSESS_KERNELS", "on:global_norm")
    assert selection.decide(CPU, few, record) == selection.Decision(
        Impl.KERNEL, "JGSESS_KERNELS=on"
    )
    monkeypatch.delenv("JGSESS_KERNELS")
    # 6: no cost model, no enclosing step: the compiled kernel
    plain = dataclasses.replace(global_norm.SPEC, cost_model=None)
    assert selection.decide(CPU, few, record) != selection.decide(CPU, node(plain, 2), record)
    assert selection.decide(CPU, node(plain, 2), record).reason == "compiled cpu kernel"
    assert record.autotune == [] and record.unmeasured == []


def test_an_optimizer_is_measured_only_where_it_rounds_through_f16():
    """f16 narrow math converts to f16 and back after every operation, as XLA's code does: the
    form is measured, and unmeasured XLA's code stays; every other form computes in f32 and is
    the kernel unmeasured (the suite's JGSESS_AUTOTUNE=0)."""
    record = CompileRecord()
    narrow = momentum.Flag.NARROW | momentum.Flag.NESTEROV
    scalars = len(momentum.SCALARS)
    for dtype, flags in [(np.float32, 0), (np.float16, 0), (jnp.bfloat16, narrow)]:
        found = selection.decide(CPU, node(momentum.SPEC, 3, dtype, flags, scalars), record)
        assert found == selection.Decision(Impl.KERNEL, "compiled cpu kernel")
    found = selection.decide(CPU, node(momentum.SPEC, 3, np.float16, narrow, scalars), record)
    assert not found.kernel and "f16 narrow math" in found.reason
    assert "JGSESS_AUTOTUNE=0" in found.reason


def test_a_policy_rules_the_fusion_and_the_node(monkeypatch):
    specs = (relu_mask.FORWARD, relu_mask.BACKWARD)
    declined = selection.decide_fusion(CPU, specs)
    assert not declined.kernel and "JGSESS_PREFER=memory" in declined.reason
    assert selection.decide(CPU, node(relu_mask.FORWARD, 1), CompileRecord()) == declined
    monkeypatch.setenv("JGSESS_PREFER", "memory")
    assert selection.decide_fusion(CPU, specs).kernel
    monkeypatch.setenv("JGSESS_KERNELS", "off:relu_mask_grad")
    assert selection.decide_fusion(CPU, specs).reason == "JGSESS_KERNELS turns it off"


def test_a_decision_prints_as_its_implementation():
    assert f"{Impl.KERNEL}" == str(Impl.KERNEL) == "kernel" and Impl.XLA == "xla"
    assert f"{Impl.XLA:>5}" == "  xla"
