"""The one place that knows how jax versions differ.

Everything jgsess needs from jax's jaxpr machinery goes through here, so a jax release that moves
a name means one edit. Only public modules are used: `jax.extend.core`, `jax.ffi`,
`jax.interpreters.{ad,batching,mlir}`.
"""

from __future__ import annotations

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching

ClosedJaxpr = jex.ClosedJaxpr
Jaxpr = jex.Jaxpr
Literal = jex.Literal
Primitive = jex.Primitive
# jax.extend.core.DropVar is new in jax 0.10, which deprecated jax.core.DropVar
DropVar = jex.DropVar if hasattr(jex, "DropVar") else jax.core.DropVar
Tracer = jax.core.Tracer
ShapedArray = jax.core.ShapedArray
# how batching rules mark an operand that is not batched (None in newer jax)
NOT_MAPPED = getattr(batching, "not_mapped", None)


def require_devices_when_lowering(primitive) -> None:
    """Mark `primitive` as needing the program's devices at lowering time.

    jax lowers without devices unless the program holds a primitive from this registry, and
    a lowering that wraps `custom_partitioning` needs them (jax's CHANGELOG, 0.4.24). jax offers
    no public hook, so this is the one private name jgsess touches (TransformerEngine does the
    same)."""
    from jax._src import dispatch

    dispatch.prim_requires_devices_during_lowering.add(primitive)


_SHARD_MAP_PARAMS = {"mesh", "in_specs", "out_specs", "check_vma", "newly_manual_axes"}


def can_rebuild_shard_map(params: dict) -> bool:
    """Whether `shard_map_call` can rebuild a `shard_map` equation with these params (the
    names of jax >= 0.8); elsewhere its body stays opaque."""
    return _SHARD_MAP_PARAMS <= set(params) and hasattr(jax, "shard_map")


def shard_map_call(params: dict, body, args) -> list:
    """Bind a `shard_map` equation's params around a new `body` (flat args -> flat results),
    letting jax trace the body in the mesh's manual context."""
    mapped = jax.shard_map(
        lambda *xs: tuple(body(*xs)),
        mesh=params["mesh"],
        in_specs=tuple(params["in_specs"]),
        out_specs=tuple(params["out_specs"]),
        axis_names=frozenset(params["newly_manual_axes"]),
        check_vma=params["check_vma"],
    )
    return list(mapped(*args))


def jaxpr_as_fun(closed):
    """A callable that evaluates `closed` by binding its equations."""
    return jex.jaxpr_as_fun(closed)


def bind(primitive, params: dict, invals) -> list:
    """Bind `primitive` as an equation with `params` would be bound; always a list of results.

    `get_bind_params` returns (sub-functions, params) before jax 0.9.2, and later a dict that
    carries the sub-functions under "subfuns" for `bind` itself.
    """
    got = primitive.get_bind_params(params)
    if isinstance(got, tuple):
        subfuns, rest = got
        outs = primitive.bind(*subfuns, *invals, **rest)
    else:
        outs = primitive.bind(*invals, **got)
    return list(outs) if primitive.multiple_results else [outs]


def is_unspecified(sharding) -> bool:
    """True for the placeholder jax uses when a nested jit leaves a sharding unspecified."""
    return sharding is None or type(sharding).__name__ == "UnspecifiedValue"


def literal_value(lit):
    return lit.val


def is_literal(atom) -> bool:
    return isinstance(atom, Literal)


def is_drop_var(var) -> bool:
    return isinstance(var, DropVar)


def shape_struct(aval) -> jax.ShapeDtypeStruct:
    """A ShapeDtypeStruct carrying the aval's weak type, for re-tracing with the same avals."""
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))


def _scalar_operands_allowed() -> bool:
    # Newer jax lets elementwise binary primitives take a rank-0 operand next to an array;
    # canonicalization may only drop broadcasts of scalars where this holds.
    try:
        jax.eval_shape(
            lambda x, s: jax.lax.mul_p.bind(x, s),
            jax.ShapeDtypeStruct((2,), jnp.float32),
            jax.ShapeDtypeStruct((), jnp.float32),
        )
    except Exception:  # noqa: BLE001 - any refusal means "not allowed"
        return False
    return True


SCALAR_OPERANDS = _scalar_operands_allowed()


def aval_nbytes(aval) -> int:
    """Bytes of an array of this aval (PRNG keys count their key data); 0 for tokens."""
    shape = getattr(aval, "shape", None)
    if shape is None:
        return 0
    # numpy dtypes and jax's extended ones (PRNG keys: their key data) both know their size
    return int(np.prod(shape, dtype=np.int64)) * aval.dtype.itemsize
