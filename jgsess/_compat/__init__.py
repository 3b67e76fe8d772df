"""The one place that knows jax's vocabulary and how jax versions differ.

Everything jgsess needs from jax's jaxpr machinery goes through here, so a jax release that moves
or renames something means one edit: the classes, the names of the call-like primitives and
of their params (nested `jit`, custom derivatives), the params that change between releases
(`out_dtype`, `sharding`, ...). Sub-jaxprs are found by type. No other module names these
(tests/test_vocabulary.py). The modules used are public (`jax.extend.core`, `jax.ffi`,
`jax.interpreters.{ad,batching,mlir}`) but for five uses of private names jax offers no
public form of, each with its reason and what jgsess does where a jax release moved them
(never an error at `import jgsess` or in a user's `jax.jit`):

    use                                  private names                       where moved
    primitives that need devices when    dispatch.prim_requires_devices_     several devices lower
      lowering (custom_partitioning)       during_lowering                     the reference
    jax.jit's step from a call to its    pjit._infer_params, a jitted        the public road
      traced program (jit_hook.py)         function's _fun and _jit_info,      (jgsess/_replay.py)
                                           its params' NamedTuple _replace
    tracing a program jgsess made        api_util.debug_info, linear_util.   jax.make_jaxpr
      (trace_closed_jaxpr)                 wrap_init, partial_eval.trace_to_
                                           jaxpr_dynamic
    the current trace                    core.trace_ctx, core.EvalTrace      planned as top-level
      (outside_any_trace)
    frames hidden from tracebacks        traceback_util.register_exclusion   the frames are shown
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

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


def _shard_alike() -> Callable | None:
    """jax's shard_alike (ties two arrays' shardings in propagation); None in jax 0.11+,
    which removed it."""
    try:
        from jax.experimental.shard_alike import shard_alike as tie
    except ImportError:
        return None
    return tie


shard_alike = _shard_alike()


def _private(module: str, name: str):
    """jax's private `module.name` (every use of one goes through here); ImportError or
    AttributeError where this jax has none."""
    return getattr(importlib.import_module(module), name)


def require_devices_when_lowering(primitive) -> bool:
    """Mark `primitive` as needing the program's devices at lowering time; False where this
    jax has no such registry.

    jax lowers without devices unless the program holds a primitive from this registry, and
    a lowering that wraps `custom_partitioning` needs them (jax's CHANGELOG, 0.4.24). jax offers
    no public hook (TransformerEngine touches the same registry). Without it a program over
    several devices lowers each kernel to its reference (kernels/partition.py: how_to_lower
    sees no device assignment), which is never wrong."""
    try:
        _private("jax._src.dispatch", "prim_requires_devices_during_lowering").add(primitive)
    except (ImportError, AttributeError):
        return False
    return True


# the FFI registration platform of each kernel platform (jgsess/platforms.py)
_FFI_PLATFORM = {"cpu": "cpu", "cuda": "CUDA", "rocm": "ROCM"}


def ffi_targets(platform: str) -> frozenset[str] | None:
    """The FFI targets registered with jax for the kernel `platform` ("cpu", "cuda"), or None
    where this jax cannot tell (a check that needs it is then skipped: the target's absence
    shows when a program calling it compiles). jax offers no public listing: jaxlib's
    `xla_client` lists those its platform's client took, and keeps the ones registered before
    that client was made in a queue of its own."""
    try:
        client = _private("jax._src.lib", "xla_client")
        name = client.xla_platform_names.get(_FFI_PLATFORM.get(platform, platform), platform)
        taken = client.custom_call_targets(name)
        with client._custom_callback_lock:
            queued = [entry[0] for entry in client._custom_callback.get(name, ())]
        return frozenset(taken) | frozenset(queued)
    except (ImportError, AttributeError, TypeError, RuntimeError):
        return None


# jax's all-reduce primitives: psum, and the psum of a shard_map body that checks which values
# vary over its axes
_ALL_REDUCES = ("psum", "psum_invariant", "psum2")


def is_all_reduce(primitive, params: dict) -> bool:
    """An all-reduce (sum) over named mesh axes, over all the devices of each axis."""
    axes = params.get("axes")
    return (
        getattr(primitive, "name", None) in _ALL_REDUCES
        and params.get("axis_index_groups") is None
        and isinstance(axes, tuple)
        and all(isinstance(a, str) for a in axes)
    )


def all_reduce_axes(params: dict) -> tuple:
    return tuple(params["axes"])


def shard_map_mesh(params: dict):
    """The mesh of a `shard_map` equation (a Mesh, or an AbstractMesh without devices)."""
    return params["mesh"]


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


def hide_from_tracebacks(path: str) -> bool:
    """Hide `path`'s frames from the tracebacks of errors raised through jax.jit, as jax hides
    its own (flax does the same): an error in user code shows the user's frames only.
    JAX_TRACEBACK_FILTERING=off shows every frame. False where this jax has no such registry
    (the frames are then shown)."""
    try:
        _private("jax._src.traceback_util", "register_exclusion")(path)
    except (ImportError, AttributeError):
        return False
    return True


def trace_closed_jaxpr(fun: Callable, avals, debug_info=None):
    """`fun`'s ClosedJaxpr on inputs of types `avals` (weak types kept), traced in a trace of
    its own as `jax.make_jaxpr` would, but outside jax's trace cache: jgsess traces programs
    it made, which are never traced twice, and jax counts (and caches) only the user's traces.
    `debug_info`: jax's description of the function, for its error messages (default: one
    made from `fun`). Where jax's tracing functions moved, `jax.make_jaxpr` itself."""
    avals = list(avals)
    try:
        if debug_info is None:
            describe = _private("jax._src.api_util", "debug_info")
            debug_info = describe("jgsess", fun, tuple(avals), {})
        wrapped = _private("jax._src.linear_util", "wrap_init")(fun, debug_info=debug_info)
        trace = _private("jax._src.interpreters.partial_eval", "trace_to_jaxpr_dynamic")
    except (ImportError, AttributeError, TypeError):
        return jax.make_jaxpr(fun)(*map(shape_struct, avals))
    jaxpr, _, consts = trace(wrapped, avals)
    return jex.ClosedJaxpr(jaxpr, consts)


def outside_any_trace() -> bool:
    """Whether nothing is being traced: a program worked out now runs as it is, on the
    caller's arrays, rather than inside another program's trace or a transformation (grad,
    vmap). Where jax's trace state moved, True: the program is planned as a top-level one,
    which is right inside another trace too (its inputs are then copied where written)."""
    try:
        current = _private("jax._src.core", "trace_ctx").trace
        return isinstance(current, _private("jax._src.core", "EvalTrace"))
    except (ImportError, AttributeError):
        return True


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


# ---- equations that call other jaxprs -------------------------------------------------------

_JIT = frozenset({"jit", "pjit"})  # nested jax.jit calls ("pjit" in older releases)
JIT_BODY = "jaxpr"  # the param holding a nested jit's ClosedJaxpr
COND_BRANCHES = "branches"  # the param holding cond's branches (operand 0 is the index)
# custom-derivative calls -> the param holding the body they call
_REGION_BODIES = {
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}
# the placeholder a nested jit's params hold for a sharding it leaves unspecified, by type
_UNSPECIFIED = type(
    jax.make_jaxpr(jax.jit(lambda x: x))(np.float32(0)).eqns[0].params["in_shardings"][0]
)


def is_jit(name: str) -> bool:
    return name in _JIT


def plain_jit_body(name: str, params: dict):
    """The body of a nested jit that carries no sharding, layout or compiler options (it can
    be inlined), else None."""
    if name not in _JIT:
        return None
    plain = (
        all(is_unspecified(s) for s in params.get("in_shardings", ()))
        and all(is_unspecified(s) for s in params.get("out_shardings", ()))
        and all(layout is None for layout in params.get("in_layouts", ()))
        and all(layout is None for layout in params.get("out_layouts", ()))
        and not params.get("compiler_options_kvs")
    )
    return params[JIT_BODY] if plain else None


# primitives whose bodies are a contract with backends that match the call by name (a
# `jax.lax.composite`'s decomposition): they pass through as the user wrote them
_KEPT_BODIES = frozenset({"composite"})


def keeps_body(name: str) -> bool:
    """Whether an equation's sub-jaxprs must reach XLA untouched."""
    return name in _KEPT_BODIES


def region_body(name: str, params: dict):
    """The body a custom_jvp / custom_vjp call calls, else None."""
    key = _REGION_BODIES.get(name)
    return params[key] if key else None


def sub_jaxprs(name: str, params: dict) -> dict:
    """param -> ClosedJaxpr or tuple of ClosedJaxprs, for the params that hold them (by type),
    and a `shard_map` body (an open Jaxpr) where `shard_map_call` can rebuild the call."""
    found: dict = {}
    for key, value in params.items():
        if isinstance(value, ClosedJaxpr):
            found[key] = value
        elif isinstance(value, tuple) and value and all(isinstance(v, ClosedJaxpr) for v in value):
            found[key] = value
        elif isinstance(value, Jaxpr) and is_shard_map(name) and can_rebuild_shard_map(params):
            found[key] = value
    return found


def is_shard_map(name: str) -> bool:
    return name == "shard_map"


SHARD_MAP_BODY = "jaxpr"


def call_name(primitive, params: dict) -> str:
    """The user's name for a custom-derivative call (the function's), else the primitive's."""
    return params.get("name", primitive.name)


def is_opaque_param(value) -> bool:
    """Params that are functions (custom rules, jax's wrapped functions): not worth printing."""
    return callable(value) or hasattr(value, "call_wrapped")


def jit_shardings(options: dict) -> tuple:
    """The shardings jax.jit's options give the program's inputs and outputs (trees, or None)."""
    return options.get("in_shardings"), options.get("out_shardings")


def is_unspecified(sharding) -> bool:
    """True where a nested jit leaves a sharding unspecified."""
    return sharding is None or isinstance(sharding, _UNSPECIFIED)


# ---- params that differ between releases --------------------------------------------------------

SAME_DTYPE = {"out_dtype": None}  # match an op that keeps its operands' dtype (newer jax)
# params that say where an op's result is placed, not what it computes (jax's transposes
# write them where a mesh is in context)
PLACEMENT_PARAMS = frozenset({"sharding", "out_sharding"})
# params that depend on the shapes an op was traced with, not on what it computes
SHAPE_PARAMS = frozenset({"shape", "broadcast_dimensions"}) | PLACEMENT_PARAMS


def convert_dtype(params: dict):
    """The dtype a convert_element_type converts to."""
    return params.get("new_dtype")


def with_weak_type(x, weak: bool):
    """`x` (a tracer or an array) with `weak` as its weak type, its dtype and values kept: a
    convert_element_type to its own dtype with the params' `weak_type` (lax's public convert
    only makes values strong)."""
    if x.aval.weak_type == weak:
        return x
    if not weak:
        return jax.lax.convert_element_type(x, x.dtype)
    primitive, params = _a_convert()
    (out,) = bind(primitive, {**params, "new_dtype": np.dtype(x.dtype), "weak_type": True}, [x])
    return out


@functools.cache
def _a_convert() -> tuple:
    """convert_element_type's primitive and the params of one of its equations."""
    template = jax.make_jaxpr(lambda v: jax.lax.convert_element_type(v, np.float32))
    (eqn,) = template(jax.ShapeDtypeStruct((), np.int32)).jaxpr.eqns
    return eqn.primitive, dict(eqn.params)


def convert_is_plain(params: dict) -> bool:
    """A convert_element_type that does not also place its result on a sharding."""
    return params.get("sharding") is None


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
