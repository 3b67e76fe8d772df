"""Sharding rules for the kernels: a kernel is a per-device function; XLA partitions around it.

A spec describes its operands and results by *factors*, one name per dimension as in Shardy's
einsum-like rules (a compound dimension is a tuple of factors, major first). A result dimension
with an operand dimension's factor is split the same way. Both partitioners' rules come from
that one description:

  Shardy   an SdyShardingRule for jax.experimental.custom_partitioning
  GSPMD    its infer_sharding_from_operands / partition callbacks

    y = jgsess.adamw[...] hp p g m v          (p: P("d", None), g m v alike)
  ->
    per shard: y_local = jgsess.adamw[..., local=True] hp p_l g_l m_l v_l
               outputs keep p's sharding; nothing gathered, nothing resharded

The per-shard function binds the kernel on the local blocks (`local=True`). Factors that reach
no result (global_norm's) leave a partial result per shard, which the spec's `per_shard`
combines over exactly the mesh axes its operands are split on. The lead operand of each factor
(the first that has it: the parameter of an optimizer tensor) decides how it is split; a split
that does not divide the dimension is dropped (the operand is then gathered, never miscomputed).

The kernel is wrapped in custom_partitioning only where XLA partitions the program: in a
single-device program and inside a `shard_map` body (every axis manual) it lowers directly.
"""

from __future__ import annotations

import enum
import functools
import math
import warnings
from dataclasses import dataclass

import jax
import numpy as np
from jax.experimental.custom_partitioning import (
    ArrayMapping,
    CompoundFactor,
    SdyShardingRule,
    custom_partitioning,
)
from jax.interpreters import mlir
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .. import _compat

Dim = str | tuple[str, ...]

ARENA = "arena"


@dataclass(frozen=True)
class Factors:
    """Per operand and per result, one factor (or a compound, major first) per dimension.

    `sizes`: sizes of the factors used only inside compounds. `replicated`: factors that must
    not be split. Factors of operands that no result has are reductions: the spec's
    `per_shard` combines their partial results. `summed`: factors the kernel also sums over
    though results keep them (BatchNorm's statistics over the batch): `per_shard` gets their
    mesh axes too.
    """

    operands: tuple[tuple[Dim, ...], ...]
    results: tuple[tuple[Dim, ...], ...]
    sizes: tuple[tuple[str, int], ...] = ()
    replicated: tuple[str, ...] = ()
    summed: tuple[str, ...] = ()

    def with_arena(self) -> Factors:
        """The same rule with the workspace arena (replicated) as first operand, last result."""
        arena = ((ARENA,),)
        return Factors(
            arena + self.operands,
            self.results + arena,
            self.sizes,
            (*self.replicated, ARENA),
            self.summed,
        )

    def reductions(self) -> set[str]:
        kept = {_major(d) for dims in self.results for d in dims} | set(self.replicated)
        return {_major(d) for dims in self.operands for d in dims} - kept


def dims(name: str, rank: int) -> tuple[str, ...]:
    """`rank` fresh factors named after `name`."""
    return tuple(f"{name}_{d}" for d in range(rank))


def multi_tensor(tensors: tuple[int, int, int]):
    """The rule of an elementwise multi-tensor kernel whose operands and results are laid out as
    `tensors` (spec.TensorLists: shared operands, operands and results per tensor): a tensor's
    operands and results share its factors."""
    base, per_tensor, results = tensors

    def factors(static, avals) -> Factors:
        shared = tuple(dims(f"s{i}", len(a.shape)) for i, a in enumerate(avals[:base]))
        tensors = [dims(f"t{t}", len(a.shape)) for t, a in enumerate(avals[base::per_tensor])]
        return Factors(
            shared + tuple(t for t in tensors for _ in range(per_tensor)),
            tuple(t for t in tensors for _ in range(results)),
        )

    return factors


def _major(dim: Dim) -> str:
    return dim if isinstance(dim, str) else dim[0]


def _minor_size(dim: Dim, sizes: dict) -> int:
    return 1 if isinstance(dim, str) else math.prod(sizes[f] for f in dim[1:])


# --- where partitioning is needed ------------------------------------------------------------


def in_shard_map(ctx) -> bool:
    """Whether `ctx` lowers a shard_map body (some mesh axes manual)."""
    axis_context = ctx.module_context.axis_context
    return (
        getattr(axis_context, "manual_axes", None) is not None
        and getattr(axis_context, "mesh", None) is not None
    )


class Lowering(enum.Enum):
    """How a kernel's call lowers where it is: the custom call itself, custom_partitioning
    around it (XLA partitions the program), or the reference (XLA partitions that)."""

    KERNEL = "kernel"
    PARTITION = "partition"
    REFERENCE = "reference"


def how_to_lower(ctx) -> Lowering:
    """KERNEL where the program runs on one device or in a fully manual shard_map body,
    PARTITION where XLA partitions it over several devices, and REFERENCE where it spans
    several devices that the lowering does not know (an abstract lowering): XLA partitions the
    reference, which is never wrong."""
    axis_context = ctx.module_context.axis_context
    if in_shard_map(ctx):
        manual, mesh = axis_context.manual_axes, axis_context.mesh
        return Lowering.KERNEL if set(manual) == set(mesh.axis_names) else Lowering.PARTITION
    devices = getattr(axis_context, "device_assignment", None)
    if devices is not None:
        return Lowering.PARTITION if len(devices) > 1 else Lowering.KERNEL
    if getattr(axis_context, "num_devices", 1) > 1:
        return Lowering.REFERENCE
    return Lowering.KERNEL


# --- the custom_partitioning wrapper ---------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """The static part of one partitioned call: the spec's params and the operand avals."""

    params: tuple
    avals: tuple  # (shape, dtype name) per operand, the arena included

    @property
    def kwargs(self) -> dict:
        return dict(self.params)


def _operand_factors(spec, params: dict, avals) -> Factors | None:
    """`spec.factors` on the operands but the workspace arena (the first, if it has one)."""
    if spec.factors is None:
        return None
    return spec.factors(spec.static(params), avals[1:] if params.get("workspace") else avals)


def has_rule(spec, avals, params: dict) -> bool:
    """Whether `spec` has a sharding rule for operands `avals` (the arena first, if it has a
    workspace): `spec.factors` may decline shapes whose results cannot follow a split."""
    return _operand_factors(spec, params, avals) is not None


def _factors(spec, call: _Call) -> Factors:
    kwargs = call.kwargs
    factors = _operand_factors(spec, kwargs, [jax.ShapeDtypeStruct(s, d) for s, d in call.avals])
    if factors is None:
        raise ValueError(f"{spec.name}: no sharding rule for these shapes")
    return factors.with_arena() if kwargs.get("workspace") else factors


def _split_axes(dims, arrays, mesh, factors: Factors) -> dict[str, tuple]:
    """mesh axes per factor, taken whole from one of `arrays` (`dims`: its factors per
    dimension) with a known sharding: the one split most ways (the first of equals), as XLA
    propagates through elementwise operations. A split that does not divide its dimension is
    dropped."""
    sizes = dict(factors.sizes)
    candidates: list = []
    for operand, array in zip(dims, arrays):
        sharding, shape = array.sharding, array.shape
        if not isinstance(sharding, NamedSharding):  # not known yet (GSPMD's propagation)
            continue
        spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
        split = {}
        for d, dim in enumerate(operand):
            names = () if _major(dim) in factors.replicated or spec[d] is None else spec[d]
            names = (names,) if isinstance(names, str) else tuple(names)
            if (shape[d] // _minor_size(dim, sizes)) % math.prod(mesh.shape[a] for a in names):
                names = ()
            split[_major(dim)] = names
        ways = math.prod(mesh.shape[a] for names in split.values() for a in names)
        candidates.append((-ways, len(candidates), split))
    axes: dict[str, tuple] = {}
    for _, _, split in sorted(candidates, key=lambda c: c[:2]):
        for factor, names in split.items():
            axes.setdefault(factor, names)
    return axes


def _sharding(mesh, operand: tuple[Dim, ...], axes: dict) -> NamedSharding:
    parts: list = []
    used: set = set()
    for dim in operand:
        names = axes.get(_major(dim), ())
        names = () if used & set(names) else names  # an axis splits one dimension at most
        used |= set(names)
        parts.append((names if len(names) > 1 else names[0]) if names else None)
    return NamedSharding(mesh, P(*parts))


def _mesh_of(mesh, arg_shapes):
    """The mesh to partition over: jax's, or (shardings without one) a 1-D mesh over the
    operands' devices, over which everything is replicated."""
    if not mesh.empty:
        return mesh
    devices = set().union(*(a.sharding.device_set for a in arg_shapes if a.sharding is not None))
    return Mesh(np.array(sorted(devices, key=lambda d: d.id)), ("replica",))


def _placement(spec, call, mesh, arg_shapes, result_shapes=()):
    """(mesh, factors, mesh axes per factor): as the partitioner chose for the results (where
    it has chosen), else as the operand that splits the factor most (as XLA propagates through
    elementwise operations).

    XLA calls this from its partitioner, where an exception would abort the process: anything
    unexpected replicates the call instead (gathers, never a wrong result), with a warning."""
    factors = _factors(spec, call)
    mesh = _mesh_of(mesh, arg_shapes)
    try:
        axes = _split_axes(factors.operands, arg_shapes, mesh, factors)
        axes.update(_split_axes(factors.results, result_shapes, mesh, factors))
    except Exception as err:  # noqa: BLE001 - see the docstring
        warnings.warn(
            f"jgsess: {spec.target} replicated ({type(err).__name__}: {err})", stacklevel=1
        )
        axes = {}
    return mesh, factors, axes


def _infer(spec, call, mesh, arg_shapes, result_shape):
    mesh, factors, axes = _placement(spec, call, mesh, arg_shapes)
    return [_sharding(mesh, r, axes) for r in factors.results]


def _partition(spec, call, mesh, arg_shapes, result_shape):
    mesh, factors, axes = _placement(spec, call, mesh, arg_shapes, result_shape)
    arg_shardings = tuple(_sharding(mesh, o, axes) for o in factors.operands)
    result_shardings = [_sharding(mesh, r, axes) for r in factors.results]
    reductions = factors.reductions() | set(factors.summed)
    operand_axes = [
        tuple(a for d in o if _major(d) in reductions for a in axes.get(_major(d), ()))
        for o in factors.operands
    ]
    kwargs = {**call.kwargs, "local": True}

    def bind(*operands):
        return list(spec.primitive.bind(*operands, **kwargs))

    def lower_fn(*operands):
        if spec.per_shard is None:
            return bind(*operands)
        return spec.per_shard(bind, operands, operand_axes, spec.static(kwargs))

    return mesh, lower_fn, result_shardings, arg_shardings


def _mapping(operand: tuple[Dim, ...]) -> ArrayMapping:
    return ArrayMapping(*[d if isinstance(d, str) else CompoundFactor(*d) for d in operand])


def _sdy_rule(spec, call, mesh, operand_types, result_types):
    factors = _factors(spec, call)
    order = {}  # Shardy lists special factors in the order the factors first appear
    for array in factors.operands + factors.results:
        for dim in array:
            for factor in (dim,) if isinstance(dim, str) else dim:
                order.setdefault(factor, len(order))
    return SdyShardingRule(
        tuple(_mapping(o) for o in factors.operands),
        tuple(_mapping(r) for r in factors.results),
        reduction_factors=tuple(sorted(factors.reductions(), key=order.get)),
        need_replication_factors=tuple(sorted(factors.replicated, key=order.get)),
        **dict(factors.sizes),
    )


@functools.cache
def _wrapper(spec) -> custom_partitioning:
    def per_device(call, *operands):
        return list(spec.primitive.bind(*operands, **call.kwargs, local=True))

    wrapped = custom_partitioning(per_device, static_argnums=(0,))
    wrapped.def_partition(
        partition=functools.partial(_partition, spec),
        infer_sharding_from_operands=functools.partial(_infer, spec),
        sharding_rule=functools.partial(_sdy_rule, spec),
    )
    return wrapped


def _tied(spec, xs: list, arena: bool) -> list:
    """The operands with each tensor's `spec.sharded_like_first` slots tied to its first operand for
    sharding propagation, where the tensor is a matrix. Without the tie, Shardy settles a dot's
    output before it reaches a custom call (elementwise operations go first), and GSPMD never
    propagates back through one: a gradient split otherwise than its parameter was resharded
    at the call (two all-to-alls in a 2-D mesh MLP step). A vector's gradient is a sum over the
    batch: tied to a replicated parameter it was split and the update gathered again after the
    call (three all-gathers), so vectors stay untied. jax 0.11 has no shard_alike: there
    nothing is tied, and sharding propagation alone places the gradients."""
    if not spec.sharded_like_first or _compat.shard_alike is None:
        return xs
    base, per_tensor, _ = spec.tensors
    for t in range(int(arena) + base, len(xs), per_tensor):
        for slot in spec.sharded_like_first:
            lead, other = xs[t], xs[t + slot]
            if lead.ndim >= 2 and other.shape == lead.shape:
                xs[t], xs[t + slot] = _compat.shard_alike(lead, other)
    return xs


def lower(spec, ctx, operands, params: dict):
    """Lower a kernel call that XLA will partition: custom_partitioning around the kernel."""
    call = _Call(
        tuple(sorted((k, v) for k, v in params.items() if k != "local")),
        tuple((tuple(a.shape), a.dtype) for a in ctx.avals_in),
    )

    def fun(*xs):
        return _wrapper(spec)(call, *_tied(spec, list(xs), bool(params.get("workspace"))))

    return mlir.lower_fun(fun, multiple_results=True)(ctx, *operands)
