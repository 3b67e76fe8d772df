"""KernelSpec, and the one factory that turns a spec into a JAX primitive.

A spec names a fused operation and carries its pure-JAX reference, which is at once the fallback
(platforms with no compiled kernel, `JGSESS_KERNELS=off`), the differentiation and batching
rule, and the test oracle. The primitive `jgsess_<name>`:

  abstract eval   from the reference (`jax.eval_shape`)
  lowering        XLA FFI custom call `jgsess_<name>` on platforms with a compiled kernel, with
                  the in-place aliases the memory planner chose; the reference elsewhere and
                  under `jax.export` (portable artifacts, no jgsess needed to run them). In a
                  program XLA partitions over several devices the call is wrapped in
                  custom_partitioning with the spec's sharding rule (partition.py)
  jvp             primal through the primitive, tangent through `jax.jvp` of the reference
  batching        multi-tensor kernels batch through the kernel (the batch axis folded into
                  the tensors); others vmap the reference

A fused node's params are the spec's static params plus `impl` ("kernel" or "xla", set by
selection), `aliases` (pairs (operand, result)) and, for kernels with scratch, `workspace`
((offset, bytes) in the program's workspace arena), both set by the memory planner. A kernel
with a workspace takes the arena as an extra first operand and gives it back as an extra last
result, written in place: the program allocates the arena once and threads it through.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from .. import _compat
from . import _native, partition

NODE_ONLY_PARAMS = frozenset({"impl"})
PRIMITIVE_ONLY_PARAMS = frozenset({"aliases", "workspace", "local"})


class TensorLists(NamedTuple):
    """How a multi-tensor kernel's operands and results are laid out: `shared` operands (the
    hyper-parameters) first, then `operands` per tensor; `results` per tensor."""

    shared: int
    operands: int
    results: int


class Followed(NamedTuple):
    """What an enclosing program does next with a kernel's results (KernelSpec.followed_by):
    `apply(operands, results) -> results`, and `writes(number of operands) -> positions` of
    the operands it writes those results over (donated to it, as a training step's parameters
    and optimizer state are)."""

    apply: Callable
    writes: Callable[[int], tuple[int, ...]]


@dataclass(frozen=True, eq=False)
class KernelSpec:
    """A fused operation with a compiled kernel and a pure-JAX reference.

    Args:
      name: short name; the FFI target is `jgsess_<name>`, the C++ handlers `<Name>Cpu` /
        `<Name>Cuda`, the pass `fuse-<name>`.
      reference: `(*operands, **static) -> tuple of arrays`, the meaning of the operation.
      inplace: `(static, number of operands) -> {operand: result}` pairs that may share a
        buffer.
      attrs: `static -> dict` of FFI attributes (numpy scalars) for the C++ handler.
      tensors: for a multi-tensor kernel, its `TensorLists` (shared operands, operands and
        results per tensor): the combine pass merges nodes with the same shared operands.
      narrowable: `static -> ((operand slot, result slot or None), ...)`, per-tensor slots the
        kernel may read and write as bf16/f16 while computing in f32 (used by fold-casts).
      workspace: `(static, operand avals) -> bytes` of scratch the kernel needs during its call;
        the memory planner places it in the program's workspace arena.
      result_avals: `(operand avals, static) -> result avals`, a shortcut for abstract
        evaluation (the default traces the reference, slow for calls with many tensors).
      cost_model: `(node, platform) -> (bool, reason)`, whether the kernel beats XLA's code for
        the node's shapes where it is not measured; a node it answers for is measured (see
        jgsess/selection.py). Where it answers None, or the spec has none, the kernel is taken
        where one is compiled.
      policy: `platform -> (bool, reason)`, whether the kernel is wanted at all, whatever the
        shapes (a user's preference between memory and speed): asked before its fusion
        matches and again at selection.
      followed_by: `static -> Followed or None`: what the program that encloses the kernel's
        own does next with its results, where that is known and the kernel's program is
        traced inside another (an optimizer's update, which the enclosing step applies:
        `apply_updates`). There XLA fuses the reference with it, and the kernel's results are
        read again: the kernel is measured with it on both sides, in place as in that step,
        and without a measurement XLA's code is taken.
      factors: `(static, operand avals) -> partition.Factors`, how the operands' and results'
        dimensions line up: the sharding rule under which XLA partitions the kernel (None for
        shapes it has no rule for: XLA then partitions the reference).
      sharded_like_first: per-tensor operand slots of a multi-tensor kernel that sharding
        propagation ties to the tensor's first operand (`shard_alike`) where the tensor is a
        matrix: an optimizer's gradient then comes out of its dot split as its parameter is, as
        XLA's own elementwise update would make it (see partition.lower).
      per_shard: `(bind, local operands, mesh axes per operand, static) -> results`, for
        kernels whose factors include reductions or summed factors: combines the per-shard
        partial results (the mesh axes are those of each operand's reduced factors).
      tolerance: (rtol, atol) for a kernel whose results are only close to its reference's (a
        user's kernel, jgsess.register_replacement): before selection takes it for a node, it
        is run beside the reference on random operands of the node's shapes and must agree
        within these. None: the kernel computes the reference's bits (jgsess's own, tested so).
      doc: one line for reports.
    """

    name: str
    reference: Callable
    inplace: Callable[[dict, int], dict[int, int]] = field(default=lambda static, n: {})
    attrs: Callable[[dict], dict] = field(default=lambda static: {})
    tensors: TensorLists | None = None
    narrowable: Callable[[dict], tuple] = field(default=lambda static: ())
    result_avals: Callable | None = None
    workspace: Callable | None = None
    cost_model: Callable[..., tuple[bool, str] | None] | None = None
    policy: Callable[[str], tuple[bool, str]] | None = None
    followed_by: Callable[[dict], Followed | None] = field(default=lambda static: None)
    factors: Callable | None = None
    sharded_like_first: tuple[int, ...] = ()
    per_shard: Callable | None = None
    tolerance: tuple[float, float] | None = None
    doc: str = ""

    is_kernel_spec = True

    @property
    def target(self) -> str:
        return f"jgsess_{self.name}"

    def platforms(self) -> frozenset[str]:
        """The jax platforms with a compiled kernel for this spec."""
        return _native.targets().get(self.target, frozenset())

    @functools.cached_property
    def primitive(self):
        return _make_primitive(self)

    def static(self, params: dict) -> dict:
        return {
            k: v for k, v in params.items() if k not in NODE_ONLY_PARAMS | PRIMITIVE_ONLY_PARAMS
        }

    def run_reference(self, operands, params: dict) -> list:
        return list(self.reference(*operands, **self.static(params)))

    def apply(self, operands, params: dict, arena=None) -> tuple[list, object]:
        """Emit the node: bind the kernel's primitive (with the workspace arena, if it has a
        workspace), or trace the reference (XLA's own code). Returns (results, arena)."""
        if params.get("impl") != "kernel":
            return self.run_reference(operands, params), arena
        bound = {k: v for k, v in params.items() if k not in NODE_ONLY_PARAMS}
        if self.tensors is not None:
            # a multi-tensor kernel's hyper-parameters are f32 in C++; an update written in
            # bf16/f16 has them in its dtype: widened, exactly
            shared = self.tensors.shared
            operands = [jnp.asarray(x, jnp.float32) for x in operands[:shared]] + list(
                operands[shared:]
            )
        bound.setdefault("aliases", ())
        bound.setdefault("workspace", None)
        bound.setdefault("local", False)
        if bound["workspace"] is None:
            return list(self.primitive.bind(*operands, **bound)), arena
        *outs, arena = self.primitive.bind(arena, *operands, **bound)
        return outs, arena


def _split(args, params) -> tuple[object, tuple]:
    """(the workspace arena or None, the operands proper)."""
    return (args[0], tuple(args[1:])) if params.get("workspace") else (None, tuple(args))


def _exporting(ctx) -> bool:
    """True while `jax.export` lowers: its artifacts must not depend on jgsess's kernels."""
    params = getattr(ctx.module_context, "lowering_parameters", None)
    return bool(getattr(params, "for_export", False))


# XLA's CPU runtime runs a program it estimates under CHEAP_FLOPS flops synchronously, on the
# calling thread, and counts a custom call as -1 flop (csrc/async_hint.h). A kernel call that
# writes CHEAP_FLOPS elements or more (its plain program's flops at least) carries a kept no-op
# custom call on the result of HINT_FLOPS additions (one fusion, however many calls carry it,
# and enough to outweigh their -1s), so its program is dispatched asynchronously where jax.jit's
# would be.
CHEAP_FLOPS = 1000
HINT_FLOPS = 4096
ASYNC_HINT_TARGET = "jgsess_async_hint"


def _async_hint(ctx) -> None:
    if sum(int(np.prod(a.shape)) for a in ctx.avals_out) < CHEAP_FLOPS:
        return
    aval = _compat.ShapedArray((HINT_FLOPS,), jnp.float32)
    work = mlir.lower_fun(
        lambda: (jax.lax.iota(jnp.float32, HINT_FLOPS) + 1.0,), multiple_results=True
    )(ctx.replace(avals_in=[], avals_out=[aval]))
    extra: dict[str, Any] = {}
    if partition.in_shard_map(ctx):  # SPMD wants a side-effecting op's sharding: per device
        extra = {"extra_attributes": {"mhlo.sharding": mlir.ir.StringAttr.get("{manual}")}}
        if jax.config.jax_use_shardy_partitioner:  # type: ignore[attr-defined]
            shardings = mlir.ir.Attribute.parse("#sdy.sharding_per_value<[<mesh<[]>, []>]>")
            extra = {"extra_attributes": {"sdy.sharding": shardings}}
    hint = jax.ffi.ffi_lowering(ASYNC_HINT_TARGET, has_side_effect=True, **extra)
    hint(ctx.replace(avals_in=[aval], avals_out=[]), *work)


def _reference(spec: KernelSpec, *args, **params) -> list:
    """The primitive's meaning: the spec's reference (the arena passed through)."""
    arena, operands = _split(args, params)
    outs = list(spec.reference(*operands, **spec.static(params)))
    return outs if arena is None else [*outs, arena]


def _abstract_eval(spec: KernelSpec, *avals, **params) -> list:
    arena, operands = _split(avals, params)
    if spec.result_avals is not None:
        outs = list(spec.result_avals(operands, spec.static(params)))
    else:
        structs = [_compat.shape_struct(a) for a in operands]
        shapes = jax.eval_shape(functools.partial(spec.reference, **spec.static(params)), *structs)
        outs = [_compat.ShapedArray(o.shape, o.dtype) for o in shapes]
    return outs if arena is None else [*outs, arena]


def _impl(prim, *args, **params):
    return jax.jit(functools.partial(prim.bind, **params))(*args)


def _jvp(spec: KernelSpec, prim, primals, tangents, **params):
    """The primal through the primitive, the tangent through `jax.jvp` of the reference."""
    tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
    outs = prim.bind(*primals, **params)
    reference = functools.partial(_reference, spec, **params)
    _, tangent_outs = jax.jvp(reference, tuple(primals), tangents)
    return outs, list(tangent_outs)


def _batch(spec: KernelSpec, prim, args, dims, **params):
    """A multi-tensor kernel runs on the batched tensors, the batch axis folded into them
    (moved first). Its shared operands (hyper-parameters) stay scalars where no member's
    differs; else each becomes one value per member (an ensemble's step counts), which the
    kernel applies to each member's part of every tensor. Other kernels vmap the reference."""
    unmapped = _compat.NOT_MAPPED
    if spec.tensors is not None and not params.get("workspace"):
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not unmapped)
        shared = spec.tensors.shared
        per_member = any(d is not unmapped for d in dims[:shared])
        moved = [
            jnp.moveaxis(a, d, 0)
            if d is not unmapped
            else (jnp.broadcast_to(a, (size, *a.shape)) if i >= shared or per_member else a)
            for i, (a, d) in enumerate(zip(args, dims))
        ]
        return prim.bind(*moved, **params), [0] * len(_abstract_eval(spec, *moved, **params))
    arena, _ = _split(args, params)
    in_axes = [None if d is unmapped else d for d in dims]
    one = [
        jax.ShapeDtypeStruct(a.shape if d is None else a.shape[:d] + a.shape[d + 1 :], a.dtype)
        for a, d in zip(args, in_axes)
    ]
    reference = functools.partial(_reference, spec, **params)
    n = len(jax.eval_shape(reference, *one))
    out_axes = [0] * n if arena is None else [0] * (n - 1) + [None]
    outs = jax.vmap(reference, in_axes, out_axes)(*args)
    return list(outs), [unmapped if a is None else a for a in out_axes]


def _lower_call(spec: KernelSpec, reference_rule, ctx, *args, **params):
    """The kernel's custom call, or custom_partitioning around it, or the reference, as
    partition.how_to_lower says for where the program runs."""
    if _exporting(ctx):  # jax.export: the reference, so the artifact runs anywhere
        return reference_rule(ctx, *args, **params)
    how = partition.Lowering.KERNEL if params.get("local") else partition.how_to_lower(ctx)
    if how is partition.Lowering.PARTITION and not partition.has_rule(spec, ctx.avals_in, params):
        how = partition.Lowering.REFERENCE  # no sharding rule: XLA partitions the reference
    if how is partition.Lowering.PARTITION:
        return partition.lower(spec, ctx, args, params)
    if how is partition.Lowering.REFERENCE:
        return reference_rule(ctx, *args, **params)
    aliases = dict(params["aliases"])
    attrs = spec.attrs(spec.static(params))
    if params.get("workspace"):
        arena = len(ctx.avals_out) - 1  # the last result
        aliases = {0: arena, **{i + 1: o for i, o in aliases.items()}}
        attrs["workspace_offset"] = np.int64(params["workspace"][0])
    lowering = jax.ffi.ffi_lowering(spec.target, operand_output_aliases=aliases)
    results = lowering(ctx, *args, **attrs)
    if ctx.module_context.platforms == ("cpu",):
        _async_hint(ctx)
    return results


def _lower_on(platform: str, spec: KernelSpec, reference_rule, ctx, *args, **params):
    # whether `platform` has the kernel is asked when a program lowers, not at registration
    if platform not in spec.platforms():
        return reference_rule(ctx, *args, **params)
    if platform == "cuda":  # the handlers load their kernels on the GPUs jax uses
        _native.use_cuda_devices()
    return _lower_call(spec, reference_rule, ctx, *args, **params)


def _make_primitive(spec: KernelSpec):
    prim = _compat.Primitive(spec.target)
    prim.multiple_results = True
    _compat.require_devices_when_lowering(prim)  # its lowering may wrap custom_partitioning
    prim.def_abstract_eval(functools.partial(_abstract_eval, spec))
    prim.def_impl(functools.partial(_impl, prim))
    ad.primitive_jvps[prim] = functools.partial(_jvp, spec, prim)
    batching.primitive_batchers[prim] = functools.partial(_batch, spec, prim)
    reference_rule = mlir.lower_fun(functools.partial(_reference, spec), multiple_results=True)
    mlir.register_lowering(prim, reference_rule)
    for platform in _native.KERNEL_PLATFORMS:
        rule = functools.partial(_lower_on, platform, spec, reference_rule)
        mlir.register_lowering(prim, rule, platform=platform)
    return prim
