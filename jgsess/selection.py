"""Kernel or XLA's code: every such decision of a compilation, made here [GPUSession::SelectKernel].

A compilation has one `platforms.Target` (its kernel platform, device, compiler options and
measuring budget), worked out once from the program's pinned device. The passes ask this
module, and apply its `Decision`s (an `Impl` and the reason, which the report prints):

    decide(target, node, record, nested)   select-kernels: each fused node, kernel or reference
    decide_fusion(target, specs)           a hardware fusion (relu-mask), before it matches
    decide_program(target, record, ...)    a fusion whose kernels replace a program of
                                           the user's (BatchNorm+ReLU), measured against it
    numerics_match(target, spec, ...)      an optimizer's narrow form: the kernel's bits equal
                                           XLA's for it on the platform
    decide_buckets(target, record, ...)    bucket-all-reduce: one all-reduce per bucket, or
                                           XLA's own all-reduces

For a fused node, in this order:

    1. available: JGSESS_KERNELS lets the kernel run, one is compiled for the platform, and (on
       an NVIDIA GPU) the driver and the build can run it on the target's device;
    2. JGSESS_KERNELS=on forces it;
    3. a policy of the spec (KernelSpec.policy: relu_mask's JGSESS_PREFER=memory);
    4. in a program traced inside another, a kernel whose results the enclosing program reads
       next in a known way (KernelSpec.followed_by): measured with that step on both sides;
       unmeasured, XLA's code (XLA fuses the reference with the step);
    5. a node the spec's cost model answers for (KernelSpec.cost_model): measured against
       its reference (jgsess.autotune), cached on disk; unmeasured, the cost model's answer;
    6. otherwise the compiled kernel.

Measurements are made on the target's device, counted against its budget and kept in the
compilation's record (`record.autotune`; `record.unmeasured` for choices the cost model made
because the budget was spent), whatever asked for them: nodes, BatchNorm programs, buckets.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np

from . import _config, autotune
from ._warnings import warn_once
from .kernels import _native
from .kernels.spec import KernelSpec
from .platforms import Target, has_devices


class Impl(str, enum.Enum):
    """What runs a fused node: its compiled kernel, or XLA's code for its reference."""

    KERNEL = "kernel"
    XLA = "xla"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass(frozen=True)
class Decision:
    impl: Impl
    reason: str

    @classmethod
    def of(cls, kernel: bool, reason: str) -> Decision:
        return cls(Impl.KERNEL if kernel else Impl.XLA, reason)

    @property
    def kernel(self) -> bool:
        return self.impl is Impl.KERNEL


def available(target: Target, spec: KernelSpec) -> Decision:
    """Whether `spec`'s kernel may run on the target at all (cost aside), and if not, why:
    JGSESS_KERNELS turns it off, none is compiled for the platform, or the target's GPU cannot
    run the code built."""
    if not _config.kernel_enabled(spec.name):
        return Decision(Impl.XLA, "JGSESS_KERNELS turns it off")
    if target.platform not in spec.platforms():
        return Decision(Impl.XLA, f"no compiled {target.platform} kernel")
    if target.platform == "cuda":
        return Decision.of(*_native.cuda_usable(target.device))
    return Decision(Impl.KERNEL, "")


def _ruled(target: Target, spec: KernelSpec) -> Decision | None:
    """Steps 1 to 3: the decision where availability, JGSESS_KERNELS=on or the spec's policy
    makes one, else None."""
    found = available(target, spec)
    if not found.kernel:
        return found
    if _config.kernel_forced(spec.name):
        return Decision(Impl.KERNEL, "JGSESS_KERNELS=on")
    if spec.policy is not None:
        return Decision.of(*spec.policy(target.platform))
    return None


def decide(target: Target, node, record, nested: bool = False) -> Decision:
    """The kernel or XLA's code for the fused `node` (see the module's doc); `nested`: the
    program is traced inside another one's trace."""
    spec = node.op
    ruled = _ruled(target, spec)
    if spec.tolerance is not None and (ruled is None or ruled.kernel):
        close = agrees(target, node)
        if not close.kernel:
            return close
    if ruled is not None:
        return ruled
    then = spec.followed_by(spec.static(node.params)) if nested else None
    guess: tuple[bool, str] | None
    if then is not None:
        guess = (False, "XLA fuses the reference with the enclosing program's next step")
    else:
        guess = spec.cost_model(node, target.platform) if spec.cost_model else None
        if guess is None:
            return Decision(Impl.KERNEL, f"compiled {target.platform} kernel")
    key = autotune.key_of(node, target)  # only for a node that may be measured
    if then is not None:
        key += "|followed by the enclosing program's step"
    sides = functools.partial(autotune.node_sides, node, then)
    return _by_measurement(target, record, spec.name, key, sides, lambda: guess)


def _side_by_side(target: Target, fns, operands, dtype) -> list[list[np.ndarray]]:
    """Each of `fns` compiled alone for the target and run there on `operands`: its results as
    numpy arrays of `dtype`."""
    compiled = target.compile(fns, operands)
    args = target.put(operands)
    with jax.ensure_compile_time_eval():
        return [[np.asarray(x, dtype) for x in fn(*args)] for fn in compiled]


def _failed(err: Exception, what: str, text: str, instead: str) -> str:
    """A probe or check that raised: re-raised under JGSESS_STRICT, else warned once (`text`,
    the cause, `instead`); the cause."""
    if _config.strict():
        raise err
    cause = f"{type(err).__name__}: {err}"
    warn_once(f"{what}: {cause}", f"jgsess: {text} ({cause}); {instead}", stacklevel=4)
    return cause


_AGREED: dict[tuple[KernelSpec, str], Decision] = {}  # per spec: a new registration is asked anew


def agrees(target: Target, node) -> Decision:
    """Whether the kernel of `node` (a spec with a tolerance: a user's kernel) agrees with its
    reference within (rtol, atol) on random operands of the node's shapes, both compiled for
    the target; asked once per process, kernel, shapes and attributes. A kernel that disagrees
    or fails is not taken (the failure warned; raised under JGSESS_STRICT)."""
    spec = node.op
    key = autotune.key_of(node, target)
    if (spec, key) in _AGREED:
        return _AGREED[spec, key]
    if not has_devices(target.platform):
        return Decision(Impl.XLA, "not checked against its reference: no device here")
    rtol, atol = spec.tolerance
    sides = autotune.node_sides(node)
    try:
        kernel, xla = _side_by_side(target, [sides.kernel, sides.xla], sides.operands, np.float64)
    except Exception as err:  # noqa: BLE001 - a failing kernel declines itself alone
        cause = _failed(
            err,
            f"checking {key}",
            f"running the kernel {spec.name} ({spec.target}) failed",
            "XLA's code runs in its place",
        )
        decision = Decision(Impl.XLA, f"the kernel failed: {cause}")
    else:
        worst = max(
            (float(np.nanmax(np.abs(k - x) - rtol * np.abs(x))) if k.size else 0.0)
            for k, x in zip(kernel, xla)
        )
        close = all(
            k.shape == x.shape and np.allclose(k, x, rtol, atol, equal_nan=True)
            for k, x in zip(kernel, xla)
        )
        decision = Decision.of(
            close,
            f"agrees with its reference within rtol {rtol:g}, atol {atol:g}"
            if close
            else f"differs from its reference by {worst:.3g} beyond rtol {rtol:g} (atol {atol:g})",
        )
    _AGREED[spec, key] = decision
    return decision


def decide_fusion(target: Target, specs) -> Decision:
    """Whether a hardware fusion (its kernels `specs`) may fire here, before it matches: each
    kernel available, and not declined by its policy."""
    for spec in specs:
        ruled = _ruled(target, spec)
        if ruled is not None and not ruled.kernel:
            return ruled
    return Decision(Impl.KERNEL, "")


def decide_program(
    target: Target, record, specs, avals, static: dict, sides: Callable, cost_model: Callable
) -> Decision:
    """The kernels `specs` in place of a program of the user's (not one fused node), on
    operands of `avals`, by the rules a fused node's decision follows: each available,
    JGSESS_KERNELS=on or the specs' policies where they decide (all of them), else measured
    (or cached) faster with `sides()` (an autotune.Sides; `static` keys the measurement), else
    as `cost_model()` -> (kernels win, why) says."""
    ruled = [_ruled(target, spec) for spec in specs]
    for found in ruled:
        if found is not None and not found.kernel:
            return found
    if all(found is not None for found in ruled):
        return Decision(Impl.KERNEL, "; ".join(dict.fromkeys(f.reason for f in ruled if f)))
    name = "+".join(spec.name for spec in specs)
    key = autotune.key(name, target, avals, static)
    return _by_measurement(target, record, name, key, sides, cost_model)


def _by_measurement(target: Target, record, name: str, key: str, sides, cost_model) -> Decision:
    found = autotune.measured(name, key, sides, target, record.autotune)
    if isinstance(found, autotune.Measurement):
        return Decision.of(found.kernel_wins, found.reason())
    wins, why = cost_model()
    if found.later:
        record.unmeasured.append((name, str(Impl.KERNEL if wins else Impl.XLA)))
    return Decision.of(wins, f"{found.reason}; cost model: {why}")


@functools.cache
def numerics_match(
    target: Target, spec: KernelSpec, flags: int, dtype: np.dtype, wide_slots: tuple = ()
) -> bool:
    """Whether the kernel's narrow (or mixed) form `flags` gives the bits XLA's code gives for
    the update written in `dtype` on the target (with its compiler options): both compiled
    alone and run on the same random operands (two tensors, one of them a vector's odd tail;
    the per-tensor slots `wide_slots` in f32). Asked once per process and target."""
    if spec.tensors is None:
        raise ValueError(f"{spec.name} is not a multi-tensor kernel")
    shared, per_tensor, _ = spec.tensors
    rng = np.random.default_rng(0)
    scalars = [np.float32(np.asarray(x, dtype)) for x in rng.uniform(0.05, 1.0, shared)]
    tensors = []
    for size in (4099, 33):
        for slot in range(per_tensor):  # p, g, then the state (positive, as a second moment)
            x = rng.standard_normal(size)
            x = np.abs(x) if slot >= 2 else x
            tensors.append(x.astype(np.float32 if slot in wide_slots else dtype))
    operands = [*scalars, *tensors]

    def run(impl: Impl):
        return lambda *ops: spec.apply(list(ops), {"flags": flags, "impl": impl.value})[0]

    if not has_devices(target.platform):  # a program for another machine: XLA cannot be asked
        return False
    try:
        kernel, xla = _side_by_side(target, [run(Impl.KERNEL), run(Impl.XLA)], operands, np.float32)
    except Exception as err:  # noqa: BLE001 - one probe's failure declines its form alone
        _failed(
            err,
            f"probing {spec.name} {flags} {dtype}",
            f"probing {spec.name}'s {np.dtype(dtype).name} form against XLA's code failed",
            "XLA's code runs that update",
        )
        return False
    return all(np.array_equal(a, b, equal_nan=True) for a, b in zip(kernel, xla))


@dataclass(frozen=True)
class BucketDecision:
    """bucket-all-reduce's decision for one group: the all-reduces as buckets or as written,
    why, and the two times (ms) where they were measured (or cached)."""

    bucketed: bool
    reason: str
    written_ms: float | None = None
    bucketed_ms: float | None = None


def decide_buckets(
    target: Target, record, mesh, avals, static: dict, programs: Callable
) -> BucketDecision:
    """One all-reduce per bucket, or the program's all-reduces as written (XLA combines them
    itself): JGSESS_BUCKETS=on takes the buckets; otherwise both are measured on the `mesh`'s
    devices (`programs()` -> (bucketed, written), each taking its operands of `avals`
    replicated; `static` keys the measurement), under the target's budget and cache, and the
    buckets taken where faster. A mesh spanning several processes is not measured (they could
    decide differently and run different programs)."""
    if _config.buckets() == "on":
        return BucketDecision(True, "JGSESS_BUCKETS=on")
    devices = getattr(mesh, "devices", None)
    if devices is None:
        return BucketDecision(False, "an abstract mesh: no devices to measure on")
    if any(d.process_index != jax.process_index() for d in np.ravel(devices)):
        return BucketDecision(False, "the mesh spans several processes: not measured")

    def sides() -> autotune.Sides:
        rng = np.random.default_rng(0)
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        with jax.ensure_compile_time_eval():
            xs = [jax.device_put(autotune.random_operand(a, rng), replicated) for a in avals]
        bucketed, written = programs()
        return autotune.Sides(bucketed, written, xs, placed=True)

    key = autotune.key("all_reduce_bucket", target, avals, static)
    found = autotune.measured("all_reduce_bucket", key, sides, target, record.autotune)
    if not isinstance(found, autotune.Measurement):
        if found.later:
            record.unmeasured.append(("all_reduce_bucket", "as written"))
        return BucketDecision(False, f"{found.reason}; as written: XLA combines all-reduces")
    written, bucketed = found.xla_s * 1e3, found.kernel_s * 1e3
    if found.kernel_wins:
        return BucketDecision(True, f"{found.reason()}: buckets faster", written, bucketed)
    return BucketDecision(False, f"{found.reason()}: XLA's own as fast", written, bucketed)
