"""Your own kernel in code you did not write: `Kernel` and `register_replacement`.

    jax.ffi.register_ffi_target("rms_norm", jax.ffi.pycapsule(lib.RmsNorm), platform="cpu")
    kernel = jgsess.Kernel("rms_norm", tolerance=(1e-5, 1e-6))

    def rms_norm(x, scale, eps):                        # the code, as the model writes it
        return nn.RMSNorm(epsilon=eps).apply({"params": {"scale": scale}}, x)

    jgsess.register_replacement(rms_norm, kernel, (x, scale, 1e-6), attrs=("eps",))
    step = jgsess.jit(train_step)                        # the model's RMSNorm runs the kernel

The search function is traced on the example arguments into a pattern (pattern by example); in
every program `jgsess.jit` compiles afterwards, wherever the program computes that function (the
same operations, parameters and constants, traced again at the program's shapes), its outputs
come from one call of the kernel: operands the search function's array (and traced scalar)
arguments in order, FFI attributes those named in `attrs` (which must be literals there),
results its outputs. The kernel runs where it agrees with the program's code within its
tolerance on random operands and measures faster (decided per shape, cached like jgsess's own
kernels); elsewhere the program keeps its code. From the search function alone the call gets
abstract evaluation, JVP and transpose (through the search function), vmap (the search
function, vmapped), `jax.export` (the search function's code: artifacts need neither jgsess nor
the kernel), donation (`Kernel.inplace`) and, with `Kernel.sharding`, a sharding rule.

A registration is in effect until `remove()`d, or for a `with` block:

    with jgsess.register_replacement(rms_norm, kernel, (x, scale, 1e-6), attrs=("eps",)):
        ...
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import jax
import numpy as np

from . import _compat, _config
from .ir.graph import Graph
from .kernels._native import KERNEL_PLATFORMS
from .kernels.partition import Factors
from .kernels.user import UserKernelSpec
from .passes.fusions import fuse_registered
from .passes.fusions.by_example import Exactness, to_pattern, traced
from .patterns import Var

__all__ = ["Factors", "Kernel", "Registration", "register_replacement"]


@dataclass(frozen=True)
class Kernel:
    """An FFI kernel of yours, registered with `jax.ffi.register_ffi_target` for `platforms`.

    Args:
      target: the FFI target's name.
      platforms: the kernel platforms it is registered for ("cpu", "cuda").
      results: `(*operands, **attrs) -> ShapeDtypeStruct or tuple of them`, the results the
        kernel declares for operands of these types (checked against the search function's
        outputs at registration and at each match); None: the search function's outputs.
      inplace: {operand index: result index} pairs the kernel may compute in place (the
        result aliases the operand's buffer where the memory planner finds it dead after).
      tolerance: (rtol, atol): how close the kernel's results must come to the program's code
        on random operands before it is taken for a shape.
      sharding: `(attrs, operand avals) -> jgsess.Factors`, its sharding rule (one factor name
        per dimension, as in Shardy's rules; `replicated` for factors it cannot split). None:
        where XLA partitions a program over several devices, the search function's code runs
        in the kernel's place.
      workspace: `(attrs, operand avals) -> bytes` of scratch the kernel takes as an extra
        first operand (the program's workspace arena, planned by jgsess) and returns as its last
        result; its `workspace_offset` attribute says where its part starts.
    """

    target: str
    platforms: Sequence[str] = ("cpu",)
    results: Callable | None = None
    inplace: Mapping[int, int] = field(default_factory=dict)
    tolerance: tuple[float, float] = (1e-5, 1e-6)
    sharding: Callable[[dict, list], Factors] | None = None
    workspace: Callable[[dict, list], int] | None = None


class Registration:
    """A registration in effect (`register_replacement`'s result): `remove()` ends it, and so
    does the end of a `with` block over it. Programs compiled after either no longer take it;
    programs compiled before keep what they were compiled with."""

    def __init__(self, replacement: fuse_registered.Replacement):
        self._replacement = replacement

    @property
    def name(self) -> str:
        return self._replacement.name

    @property
    def active(self) -> bool:
        return any(r is self._replacement for r in fuse_registered.REGISTERED)

    def remove(self) -> None:
        """End the registration (again: nothing)."""
        if self.active:
            fuse_registered.REGISTERED.remove(self._replacement)
            _config.registrations_changed()

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return f"Registration({self.name!r} -> {self._replacement.spec.target!r}, {state})"


def _struct(x):
    """An example argument's type; a Python number stays a number (an attribute's example)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return x
    return jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x))


def _scalar(x) -> jax.ShapeDtypeStruct:
    """How an attribute is traced for the candidate pattern: a weakly typed rank-0 value, as a
    Python number in the program is."""
    dtype = jax.numpy.result_type(x)
    return jax.ShapeDtypeStruct((), dtype, weak_type=isinstance(x, (int, float)))


def _ffi_attributes(static: dict) -> dict:
    """The FFI attributes of a fused node's attribute numbers: a float as f32, an int as i64."""
    return {k: np.float32(v) if isinstance(v, float) else np.int64(v) for k, v in static.items()}


def _unmeasured(node, platform: str) -> tuple[bool, str]:
    """A user's kernel without a measurement (the budget spent, JGSESS_AUTOTUNE=0): XLA's code."""
    return False, "a registered kernel runs where it measures faster"


def _tolerance(kernel: Kernel) -> tuple[float, float]:
    rtol, atol = (float(t) for t in kernel.tolerance)
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"Kernel {kernel.target!r}: a tolerance is (rtol >= 0, atol >= 0)")
    return rtol, atol


def _check_target(kernel: Kernel) -> frozenset[str]:
    platforms = frozenset(kernel.platforms)
    unknown = platforms - KERNEL_PLATFORMS
    if unknown:
        raise ValueError(
            f"Kernel {kernel.target!r}: unknown platforms {sorted(unknown)}; kernels run on "
            f"{sorted(KERNEL_PLATFORMS)}"
        )
    for platform in sorted(platforms):
        listed = _compat.ffi_targets(platform)
        if listed is not None and kernel.target not in listed:
            raise ValueError(
                f"no FFI target {kernel.target!r} is registered for {platform}: register it "
                f"first, jax.ffi.register_ffi_target({kernel.target!r}, ..., "
                f"platform={_compat._FFI_PLATFORM[platform]!r})"
            )
    return platforms


def _example_graph(search, name, names, attrs: dict, operands) -> Graph:
    """The search function traced on its example (attributes as their numbers), cleaned up as
    programs are: its outputs' types, and the code other registrations must not take."""
    try:
        graph = traced(lambda *ops: fuse_registered.call(search, names, attrs, ops), operands)
    except Exception as err:
        raise ValueError(
            f"the search function {name} does not trace on its example: {err}"
        ) from err
    if not graph.outputs:
        raise ValueError(f"the search function {name} returns no arrays")
    return graph


def _claims(rep: fuse_registered.Replacement, graph: Graph) -> bool:
    """Whether `rep` takes the code of an example graph (its first output's node)."""
    root = graph.outputs[0]
    return root.producer is not None and fuse_registered.exact_match(rep, root) is not None


def register_replacement(
    search: Callable,
    kernel: Kernel,
    example_args: Sequence,
    *,
    attrs: Sequence[str] = (),
    extra_check: Callable[[dict], bool] | None = None,
    name: str | None = None,
) -> Registration:
    """Register "the code `search` computes -> `kernel`" for every program `jgsess.jit`
    compiles from now on (see the module's doc).

    Args:
      search: the code to replace, a function of arrays (and numbers) returning an array or a
        tuple of arrays: the first its root, the others computed on the way to it. Write it as
        the code to be replaced is written (call the same library function): it is traced.
      kernel: the Kernel that computes it.
      example_args: one per argument of `search`: arrays (or ShapeDtypeStructs) for the
        kernel's operands, Python numbers for the arguments in `attrs`.
      attrs: arguments passed to the kernel as FFI attributes (their dtype's numbers), matched
        to any literal where the program has one; the others are the kernel's operands, in order.
      extra_check: `(name -> ShapeDtypeStruct or attribute number) -> bool`, asked at each
        match; False leaves the program's code there.
      name: the registration's name (the fused node's, the report's, JGSESS_KERNELS's);
        default the target's.

    Returns:
      The Registration (a context manager).

    Raises:
      ValueError, before anything runs: the target is not registered for a platform; `attrs`
      names no argument, or an example does not fit; `search` does not trace on its example,
      disagrees with the kernel's declared results, or its pattern does not find itself in
      its own example; another registration claims the same code or name.
    """
    platforms = _check_target(kernel)
    what = getattr(search, "__name__", repr(search))
    name = name or kernel.target
    names = tuple(inspect.signature(search).parameters)
    if len(example_args) != len(names):
        raise ValueError(
            f"{what} takes {len(names)} arguments ({', '.join(names)}); "
            f"{len(example_args)} examples given"
        )
    attrs = tuple(attrs)
    if not set(attrs) <= set(names):
        raise ValueError(f"attrs {sorted(set(attrs) - set(names))} are not arguments of {what}")
    structs = [_struct(x) for x in example_args]
    attr_values = {}
    for n, s in zip(names, structs):
        if n in attrs:
            if not isinstance(s, (int, float)):
                raise ValueError(f"the example of the attribute {n} must be a Python number")
            attr_values[n] = s
        elif not isinstance(s, jax.ShapeDtypeStruct):
            raise ValueError(f"the example of the operand {n} must be an array")
    operands = [s for n, s in zip(names, structs) if n not in attrs]
    exact_graph = _example_graph(search, what, names, attr_values, operands)
    if kernel.results is not None:
        declared = kernel.results(*operands, **attr_values)
        declared = declared if isinstance(declared, (tuple, list)) else (declared,)
        got = [(tuple(o.shape), np.dtype(o.dtype)) for o in exact_graph.outputs]
        want = [(tuple(d.shape), np.dtype(d.dtype)) for d in declared]
        if got != want:
            raise ValueError(
                f"{what}'s outputs {got} on its example disagree with the results kernel "
                f"{kernel.target!r} declares {want}"
            )
    in_order = (*(n for n in names if n not in attrs), *attrs)  # operands, then attributes

    def example(*args):  # the attributes traced too: they bind the program's literals
        return fuse_registered.call(search, names, dict(zip(attrs, args[len(operands) :])), args)

    try:
        graph = traced(example, [*operands, *(_scalar(attr_values[n]) for n in attrs)])
        candidate = to_pattern(graph, in_order, attrs, what, Exactness.STRUCTURE)
    except Exception as err:
        raise ValueError(f"the search function {what} gives no pattern: {err}") from err
    read = {p.name for p in candidate.nodes().values() if isinstance(p, Var)}
    unread = [n for n in names if n not in read]
    if unread:
        raise ValueError(
            f"the pattern of {what} does not find itself in its own example: its outputs do "
            f"not read {', '.join(unread)}"
        )
    if name in {r.name for r in fuse_registered.REGISTERED}:
        raise ValueError(f"a registration named {name!r} is in effect")
    spec = UserKernelSpec(
        name=name,
        reference=lambda *ops, **static: tuple(jax.tree.leaves(rep.call(ops, static))),
        inplace=lambda static, n: dict(kernel.inplace),
        attrs=_ffi_attributes,
        cost_model=_unmeasured,
        factors=kernel.sharding,
        workspace=kernel.workspace,
        tolerance=_tolerance(kernel),
        doc=f"{what} -> {kernel.target}",
        ffi_target=kernel.target,
        registered_on=platforms,
    )
    rep = fuse_registered.Replacement(
        name, search, names, attrs, candidate, spec, extra_check, kernel.results
    )
    if not _claims(rep, exact_graph):
        raise ValueError(
            f"the pattern of {what} does not find itself in its own example (an argument the "
            "outputs do not read, or an attribute that is not a literal there)"
        )
    for other in fuse_registered.REGISTERED:
        if _claims(other, exact_graph):
            raise ValueError(
                f"{what} claims the code registration {other.name!r} claims (its example "
                f"matches {other.name!r}'s pattern)"
            )
    fuse_registered.REGISTERED.append(rep)
    _config.registrations_changed()
    return Registration(rep)
