"""What the optimizer fusions share: the forms of an update, and turning a match into a node.

Each form of an update (optax's adamw, MindSpore's AdamWeightDecay, ..., and each as optax's
update alone, `-(lr*u)`, or applied, `p - lr*u`, or scaled, `lr*u`) is the kernel's reference
with some `flags`, traced into a pattern. A match becomes one node of the kernel's spec with
operands (hyper-parameters in the kernel's order, then the tensors) and the form's `flags`.
Hyper-parameters a form does not use are passed as constants the kernel ignores; a tensor it
does not read (p, in an update without weight decay) is passed as the gradient, whose second
read the kernel's compiler drops with the unused value.

Guard: every tensor is of one shape and dtype, and every hyper-parameter a scalar of that dtype.
f32 is the kernels' arithmetic (narrower tensors come later, from fold-casts). An update written
in bf16 or f16 (optax keeps a narrow parameter's state in its dtype) is the kernel's narrow form:
each operation rounded to that dtype. XLA's code computes it so on the CPU, but how a compiler
rounds narrow arithmetic is its own choice, so the narrow form is taken only where the kernel's
bits equal XLA's for the form on the platform (`selection.numerics_match`, asked once per process),
and left to XLA's code elsewhere. The new optimizer state (every result after the first) must be
used, as an update's state always is: `p - 0.1*(g + s*noise)` has the shape of a momentum step,
but with nothing keeping its "accumulator" it is not one, and a kernel would only spend bandwidth
writing it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ... import selection
from ...ir.dtypes import NARROW
from ...ir.graph import Graph, Node, Value
from ...kernels.spec import KernelSpec
from ...patterns import Match
from ..manager import Context
from .by_example import from_function
from .engine import FusionRule


def form(update: Callable, tensors: tuple, scalars: tuple, used: tuple, flags: int, negated=False):
    """One form: `update(<tensors>, <scalars>, flags=flags)` given the tensors and the `used`
    hyper-parameters (the others are None), its first result `negated` if asked. Returns
    (reference, flags, argument names, negated)."""
    names = tensors + used

    def reference(*args):
        given = dict(zip(names, args))
        first, *state = update(**{n: given.get(n) for n in tensors + scalars}, flags=flags)
        return (-first if negated else first, *state)

    return reference, flags, names, negated


def _scaled_by_scalars(graph: Graph, value: Value) -> bool:
    """Whether `value` is only read by multiplications by a rank-0 value. Elsewhere (`p - s`,
    a sum of the step) the whole step or XLA's own code is the better program."""
    return graph.output_uses(value) == 0 and all(
        user.name == "mul" and any(v is not value and v.ndim == 0 for v in user.inputs)
        for user in value.users
    )


@dataclass(frozen=True)
class _Guard:
    """What every form of one update checks of a match, and how a match becomes the kernel's
    node (see update_rules for the fields)."""

    spec: KernelSpec
    tensors: tuple
    scalars: tuple
    unused: dict
    narrow_flag: int
    mixed_flag: int
    narrow_names: tuple

    @functools.cached_property
    def dtypes(self) -> dict:
        """The dtypes of the mixed forms' narrow tensors and hyper-parameters: bf16."""
        return {n: np.dtype(NARROW[0]) for n in self.narrow_names}

    @functools.cached_property
    def wide_slots(self) -> tuple:
        """The per-tensor slots a mixed form keeps in f32."""
        return tuple(
            i for i, k in enumerate(self.tensors) if self.mixed_flag and k not in self.narrow_names
        )

    def build(self, flags: int, graph: Graph, m: Match, outputs: list[Value]) -> Node | None:
        """The form `flags`'s node for the match `m`, or None where its dtypes or shapes are
        not the kernel's."""
        given = [m.get(k) for k in self.tensors]
        stand_in = next(a for a in given if a is not None)
        arrays = [stand_in if a is None else a for a in given]
        dtype, shape = arrays[0].dtype, arrays[0].shape
        mixed = self.mixed_flag

        def expected(name: str) -> np.dtype:
            return self.dtypes.get(name, np.dtype(np.float32)) if mixed else dtype

        if not (dtype == np.float32 or dtype in NARROW) or not all(
            a.dtype == expected(k) and a.shape == shape for k, a in zip(self.tensors, arrays)
        ):
            return None
        operands = []
        for name in self.scalars:
            value = m.get(name)
            if value is None:
                f32 = arrays[0].aval.update(shape=(), dtype=np.dtype(np.float32))
                value = Value(f32, const=np.float32(self.unused[name]))
            elif value.ndim != 0 or value.dtype != expected(name):
                return None
            operands.append(value)
        avals = [v.aval for v in outputs]
        extra = mixed or (self.narrow_flag if dtype in NARROW else 0)
        return Node(self.spec, [*operands, *arrays], avals, {"flags": int(flags | extra)})

    def would_select(self, node: Node, ctx: Context) -> tuple[bool, str]:
        """Whether selection would take a narrow or mixed form's kernel: where its bits equal
        XLA's on the target (selection.numerics_match)."""
        flags, target, spec = node.params["flags"], ctx.target, self.spec
        if not flags & (self.narrow_flag | self.mixed_flag):
            return True, ""  # f32
        if not selection.available(target, spec).kernel:
            return True, ""  # XLA's code runs it anyway (the same operations)
        dtype = node.inputs[len(self.scalars)].dtype
        if selection.numerics_match(target, spec, flags, dtype, self.wide_slots):
            return True, ""
        return False, f"XLA's {dtype} arithmetic on {target.platform} rounds unlike the kernel's"


def update_rules(
    spec: KernelSpec,
    update: Callable,
    tensors: tuple,
    scalars: tuple,
    used: Callable,
    unused: dict,
    update_flag: int,
    narrow_flag: int,
    absent: tuple = (),
    mixed: tuple[int, tuple] | None = None,
) -> list[FusionRule]:
    """FusionRules for every form of `update`: each of its three optional parts (flags 1, 2,
    4) on or off, forms with more parts first; each as the whole step, as optax's update alone
    (`update_flag`: `-(lr*u)`), and as the scaled step `lr*u` that only a multiplication by a
    scalar reads before its sign is taken (optax.MultiSteps: by whether this step applies):
    the kernel's update, negated back, exactly. `used(flags)` names the hyper-parameters a
    form reads; `unused` gives the values passed to the kernel for the others. `absent`:
    hyper-parameters every form leaves out, their operations with them (`update` gets None;
    `unused` gives 1.0): where a narrow dtype rounds them to 1.0, canonicalize drops the
    multiplication. `mixed`: (flag, narrow names): the whole steps only, traced with the named
    tensors and hyper-parameters in bf16 and the others in f32, each node of such a form read
    in those dtypes and given `flag` (adamw's MIXED)."""
    mixed_flag, narrow_names = mixed or (0, ())
    by_parts = sorted(range(8), key=lambda flags: -bin(flags).count("1"))
    modes = ((0, False),) if mixed_flag else ((0, False), (update_flag, False), (update_flag, True))
    forms = [
        form(
            update,
            tensors,
            scalars,
            tuple(s for s in used(flags) if s not in absent),
            flags | mode,
            negated,
        )
        for mode, negated in modes
        for flags in by_parts
    ]
    guard = _Guard(spec, tensors, scalars, unused, narrow_flag, mixed_flag, narrow_names)
    return [
        FusionRule(
            from_function(fn, scalars=scalars, dtypes=guard.dtypes, names=names),
            functools.partial(guard.build, flags),
            results_used=True,
            negated=negated,
            root_guard=_scaled_by_scalars if negated else None,
            would_select=guard.would_select,
        )
        for fn, flags, names, negated in forms
    ]
