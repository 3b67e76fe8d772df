"""What the optimizer fusions share: the forms of an update, and turning a match into a node.

Each form of an update (optax's adamw, MindSpore's AdamWeightDecay, ..., and each as optax's
update alone, `-(lr*u)`, or applied, `p - lr*u`, or scaled, `lr*u`) is the kernel's reference
with some `flags`, traced into a pattern. A match becomes one node of the kernel's spec with
operands (hyper-parameters in the kernel's order, then the tensors) and the form's `flags`.
Hyper-parameters a form does not use are passed as constants the kernel ignores; a tensor it
does not read (p, in an update without weight decay) is passed as the gradient, whose second
read the kernel's compiler drops with the unused value.

Guard: every tensor is f32 and of one shape (narrower dtypes come later, from fold-casts);
every hyper-parameter is an f32 scalar; the new optimizer state (every result after the first)
is used, as an update's state always is: `p - 0.1*(g + s*noise)` has the shape of a momentum
step, but with nothing keeping its "accumulator" it is not one, and a kernel would only spend
bandwidth writing it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...ir.graph import Graph, Node, Value
from ...kernels.spec import KernelSpec
from ...patterns import Match
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


def _f32(value: Value) -> bool:
    return value.dtype == np.float32


def _scaled_by_scalars(graph: Graph, value: Value) -> bool:
    """Whether `value` is only read by multiplications by a rank-0 value. Elsewhere (`p - s`,
    a sum of the step) the whole step or XLA's own code is the better program."""
    return graph.output_uses(value) == 0 and all(
        user.name == "mul" and any(v is not value and v.ndim == 0 for v in user.inputs)
        for user in value.users
    )


def update_rules(
    spec: KernelSpec,
    update: Callable,
    tensors: tuple,
    scalars: tuple,
    used: Callable,
    unused: dict,
    update_flag: int,
) -> list[FusionRule]:
    """FusionRules for every form of `update`: each of its three optional parts (flags 1, 2,
    4) on or off, forms with more parts first; each as the whole step, as optax's update alone
    (`update_flag`: `-(lr*u)`), and as the scaled step `lr*u` that only a multiplication by a
    scalar reads before its sign is taken (optax.MultiSteps: by whether this step applies):
    the kernel's update, negated back, exactly. `used(flags)` names the hyper-parameters a
    form reads; `unused` gives the values passed to the kernel for the others."""
    by_parts = sorted(range(8), key=lambda flags: -bin(flags).count("1"))
    forms = [
        form(update, tensors, scalars, used(flags), flags | mode, negated)
        for mode, negated in ((0, False), (update_flag, False), (update_flag, True))
        for flags in by_parts
    ]

    def builder(flags: int):
        def build(graph: Graph, m: Match, outputs: list[Value]) -> Node | None:
            given = [m.get(k) for k in tensors]
            stand_in = next(a for a in given if a is not None)
            arrays = [stand_in if a is None else a for a in given]
            if not all(_f32(a) and a.shape == arrays[0].shape for a in arrays):
                return None
            operands = []
            for name in scalars:
                value = m.get(name)
                if value is None:
                    value = Value(arrays[0].aval.update(shape=()), const=np.float32(unused[name]))
                if value.ndim != 0 or not _f32(value):
                    return None
                operands.append(value)
            avals = [v.aval for v in outputs]
            return Node(spec, [*operands, *arrays], avals, {"flags": flags})

        return build

    return [
        FusionRule(
            from_function(fn, scalars=scalars, names=names),
            builder(flags),
            results_used=True,
            negated=negated,
            root_guard=_scaled_by_scalars if negated else None,
        )
        for fn, flags, names, negated in forms
    ]
