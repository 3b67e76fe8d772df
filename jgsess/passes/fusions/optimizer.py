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
bits equal XLA's for the form on the platform (`narrow_math_matches`, asked once per process),
and left to XLA's code elsewhere. The new optimizer state (every result after the first) must be
used, as an update's state always is: `p - 0.1*(g + s*noise)` has the shape of a momentum step,
but with nothing keeping its "accumulator" it is not one, and a kernel would only spend bandwidth
writing it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import numpy as np

from ... import autotune
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


@functools.cache
def narrow_math_matches(
    spec: KernelSpec,
    flags: int,
    dtype: np.dtype,
    platform: str,
    compiler_options: tuple = (),
    wide_slots: tuple = (),
) -> bool:
    """Whether the kernel's narrow (or mixed) form `flags` gives the bits XLA's code gives for
    the update written in `dtype` on `platform` (jax.jit's `compiler_options`): both compiled
    alone and run on the same random operands (two tensors, one of them a vector's odd tail;
    the per-tensor slots `wide_slots` in f32)."""
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

    def run(impl):
        return lambda *ops: spec.apply(list(ops), {"flags": flags, "impl": impl})[0]

    try:
        compiled, device = autotune.compile_alone(
            [run("kernel"), run("xla")], operands, platform, compiler_options
        )
    except RuntimeError:  # a platform this process has no device of: XLA cannot be asked
        return False
    with jax.ensure_compile_time_eval():
        args = jax.device_put(operands, device)
        kernel, xla = ([np.asarray(x, np.float32) for x in fn(*args)] for fn in compiled)
    return all(np.array_equal(a, b, equal_nan=True) for a, b in zip(kernel, xla))


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
    dtypes = {n: np.dtype(NARROW[0]) for n in narrow_names}  # bf16

    def builder(flags: int):
        def build(graph: Graph, m: Match, outputs: list[Value]) -> Node | None:
            given = [m.get(k) for k in tensors]
            stand_in = next(a for a in given if a is not None)
            arrays = [stand_in if a is None else a for a in given]
            dtype, shape = arrays[0].dtype, arrays[0].shape
            narrow = dtype in NARROW and not mixed_flag

            def expected(name: str) -> np.dtype:
                return dtypes.get(name, np.dtype(np.float32)) if mixed_flag else dtype

            if not (dtype == np.float32 or dtype in NARROW) or not all(
                a.dtype == expected(k) and a.shape == shape for k, a in zip(tensors, arrays)
            ):
                return None
            operands = []
            for name in scalars:
                value = m.get(name)
                if value is None:
                    f32 = arrays[0].aval.update(shape=(), dtype=np.dtype(np.float32))
                    value = Value(f32, const=np.float32(unused[name]))
                elif value.ndim != 0 or value.dtype != expected(name):
                    return None
                operands.append(value)
            avals = [v.aval for v in outputs]
            extra = mixed_flag or (narrow_flag if narrow else 0)
            return Node(spec, [*operands, *arrays], avals, {"flags": int(flags | extra)})

        return build

    wide_slots = tuple(i for i, k in enumerate(tensors) if mixed_flag and k not in narrow_names)
    rounded = narrow_flag | mixed_flag

    def would_select(node: Node, ctx: Context) -> tuple[bool, str]:
        flags = node.params["flags"]
        if not flags & rounded or not spec.available(ctx.platform)[0]:
            return True, ""  # f32, or XLA's code runs it anyway (the same operations)
        dtype = node.inputs[len(scalars)].dtype
        options = ctx.compiler_options
        if narrow_math_matches(spec, flags, dtype, ctx.platform, options, wide_slots):
            return True, ""
        return False, f"XLA's {dtype} arithmetic on {ctx.platform} rounds unlike the kernel's"

    return [
        FusionRule(
            from_function(fn, scalars=scalars, dtypes=dtypes, names=names),
            builder(flags),
            results_used=True,
            negated=negated,
            root_guard=_scaled_by_scalars if negated else None,
            would_select=would_select,
        )
        for fn, flags, names, negated in forms
    ]
