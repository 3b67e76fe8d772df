"""ClosedJaxpr -> Graph.

    { lambda ; a:f32[3]. let                                graph(a):
        b = custom_jvp_call[relu]{ jit{ max a 0.0 } } a        b = max a 0.0  (region: relu)
        c = cond[...] i b                                     c = cond i b   (sub-graphs)
      in (c,) }                                              -> (c,)

Nested `jit` calls are inlined when they carry no sharding, layout or compiler options;
`custom_jvp_call` / `custom_vjp_call` bodies are inlined as regions (see `graph.Region`) when
every output is computed inside them.
Sub-jaxprs of `cond`, `while`, `scan` and of a `jit` kept whole become sub-graphs that the passes
optimize too. Other primitives with sub-jaxprs pass through untouched.
"""

from __future__ import annotations

from .. import _compat
from .graph import Graph, Node, Region, Value

# primitive name -> params holding ClosedJaxprs that become sub-graphs
SUBGRAPH_PARAMS = {
    "cond": ("branches",),
    "while": ("cond_jaxpr", "body_jaxpr"),
    "scan": ("jaxpr",),
    "jit": ("jaxpr",),
    "pjit": ("jaxpr",),
    "shard_map": ("jaxpr",),  # an open Jaxpr; only where _compat can rebuild the call
}
# primitive name -> the param holding the body that is inlined as a region
REGION_BODIES = {
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}


def _inlinable_jit(params: dict) -> bool:
    return (
        all(_compat.is_unspecified(s) for s in params.get("in_shardings", ()))
        and all(_compat.is_unspecified(s) for s in params.get("out_shardings", ()))
        and all(layout is None for layout in params.get("in_layouts", ()))
        and all(layout is None for layout in params.get("out_layouts", ()))
        and not params.get("compiler_options_kvs")
    )


def from_jaxpr(closed) -> Graph:
    """Build the kernel graph of a ClosedJaxpr."""
    jaxpr = closed.jaxpr
    graph = Graph([Value(v.aval) for v in jaxpr.invars], source=closed)
    env = {var: value for var, value in zip(jaxpr.invars, graph.inputs)}
    for var, const in zip(jaxpr.constvars, closed.consts):
        env[var] = Value(var.aval, const=const)
    _build_eqns(graph, jaxpr.eqns, env, region=None)
    graph.outputs = [_read(env, atom) for atom in jaxpr.outvars]
    graph.changed = False
    return graph


def _read(env: dict, atom) -> Value:
    if _compat.is_literal(atom):
        return Value(atom.aval, const=_compat.literal_value(atom))
    return env[atom]


def _build_eqns(graph: Graph, eqns, env: dict, region: Region | None) -> None:
    for eqn in eqns:
        inputs = [_read(env, atom) for atom in eqn.invars]
        name = eqn.primitive.name
        if name in ("jit", "pjit") and _inlinable_jit(eqn.params):
            outputs = _inline(graph, eqn.params["jaxpr"], inputs, region)
        elif name in REGION_BODIES and _all_outputs_computed(eqn.params[REGION_BODIES[name]]):
            inner = Region(eqn.primitive, eqn.params, inputs, region)
            outputs = _inline(graph, eqn.params[REGION_BODIES[name]], inputs, inner)
            inner.outputs = list(outputs)
            graph.add_region(inner)
        else:
            keys = SUBGRAPH_PARAMS.get(name, ())
            if name == "shard_map" and not _compat.can_rebuild_shard_map(eqn.params):
                keys = ()
            subgraphs = {key: _subgraphs(eqn.params[key]) for key in keys}
            node = Node(
                eqn.primitive,
                inputs,
                [v.aval for v in eqn.outvars],
                eqn.params,
                subgraphs,
                eqn.effects,
            )
            node.region = region
            for enclosing in region.chain() if region else ():
                enclosing.nodes.append(node)
            graph.append(node)
            outputs = node.outputs
        for var, value in zip(eqn.outvars, outputs):
            if not _compat.is_drop_var(var):
                env[var] = value


def _all_outputs_computed(closed) -> bool:
    # A region is re-emitted from its nodes; a body that only forwards inputs has none to
    # anchor it, so such calls stay whole.
    produced = {var for eqn in closed.jaxpr.eqns for var in eqn.outvars}
    return all(var in produced for var in closed.jaxpr.outvars)


def _subgraphs(param):
    if isinstance(param, tuple):
        return tuple(from_jaxpr(closed) for closed in param)
    if isinstance(param, _compat.Jaxpr):
        return from_jaxpr(_compat.ClosedJaxpr(param, []))
    return from_jaxpr(param)


def _inline(graph: Graph, closed, inputs: list[Value], region: Region | None) -> list[Value]:
    jaxpr = closed.jaxpr
    env = dict(zip(jaxpr.invars, inputs))
    for var, const in zip(jaxpr.constvars, closed.consts):
        env[var] = Value(var.aval, const=const)
    _build_eqns(graph, jaxpr.eqns, env, region)
    return [_read(env, atom) for atom in jaxpr.outvars]
