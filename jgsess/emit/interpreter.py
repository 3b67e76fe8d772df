"""Graph -> jax operations: an interpreter over the execution order, plus a re-trace.

Ordinary nodes bind their primitive again; fused nodes bind their kernel's primitive (which
lowers to an XLA FFI custom call) or trace their pure-JAX reference, as selection decided;
intact regions bind the original `custom_jvp_call` / `custom_vjp_call`. Sub-graphs that no pass
changed are handed back as the jaxprs they came from; a changed `shard_map` body is traced
again by `jax.shard_map` itself, inside its mesh's manual context.
"""

from __future__ import annotations

import jax.numpy as jnp

from .. import _compat
from ..ir.graph import Graph, Node, Region, Value


def emit(graph: Graph, args) -> list:
    """Evaluate `graph` on `args` (arrays or tracers) by binding jax primitives."""
    env: dict[Value, object] = dict(zip(graph.inputs, args))

    def read(value: Value):
        return value.const if value.is_const else env[value]

    done: set[Region] = set()
    arena = None  # the workspace arena: allocated once, threaded through the kernels using it
    for node in graph.live():
        unit = graph.unit_of(node)
        if isinstance(unit, Region):
            if unit not in done:
                done.add(unit)
                outs = _compat.bind(unit.primitive, unit.params, [read(v) for v in unit.inputs])
                for value, out in zip(unit.outputs, outs):
                    if value.producer is not None and value.producer.region is not None:
                        env[value] = out
            continue
        invals = [read(v) for v in node.inputs]
        if node.is_fused:
            if arena is None and node.params.get("workspace") and node.params["impl"] == "kernel":
                arena = jnp.zeros((graph.arena_bytes,), jnp.uint8)
            outs, arena = node.op.apply(invals, node.params, arena)
        elif _compat.is_shard_map(node.name) and changed_deep(node.body(_compat.SHARD_MAP_BODY)):
            body = node.body(_compat.SHARD_MAP_BODY)
            outs = _compat.shard_map_call(
                node.params,
                lambda *xs: emit(body, xs),  # noqa: B023 - called here, in this iteration
                invals,
            )
        else:
            outs = _compat.bind(node.op, _params_with_subgraphs(node), invals)
        for value, out in zip(node.outputs, outs):
            env[value] = out
    outs = [read(v) for v in graph.outputs]
    if graph.source is None:
        return outs
    # each result with the weak type jax.jit gives it (a kernel's are strong; a value the
    # passes rewrote may be weak where its convert went): a weak type steers the promotion of
    # whatever the user computes from it next
    avals = graph.source.out_avals
    return [
        _compat.with_weak_type(out, aval.weak_type) if hasattr(out, "aval") else out
        for out, aval in zip(outs, avals)
    ]


def changed_deep(graph: Graph) -> bool:
    return any(g.changed for g in graph.walk())


def to_closed_jaxpr(graph: Graph, avals=None, debug_info=None):
    """The ClosedJaxpr computing `graph`: its source if nothing changed, else `emit` traced on
    inputs of types `avals` (default: `graph`'s own). `debug_info`: jax's description of the
    function, for its error messages."""
    if graph.source is not None and not changed_deep(graph):
        return graph.source
    if avals is None:
        avals = [v.aval for v in graph.inputs]
    return _compat.trace_closed_jaxpr(lambda *args: emit(graph, args), avals, debug_info)


def _params_with_subgraphs(node: Node) -> dict:
    if not node.subgraphs:
        return node.params
    params = dict(node.params)
    for key, sub in node.subgraphs.items():
        if isinstance(sub, tuple):
            params[key] = tuple(to_closed_jaxpr(g) for g in sub)
        elif isinstance(params[key], _compat.Jaxpr):  # an open body (shard_map), unchanged
            params[key] = to_closed_jaxpr(sub).jaxpr
        else:
            params[key] = to_closed_jaxpr(sub)
    return params
