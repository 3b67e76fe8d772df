"""ClosedJaxpr -> Graph.

    { lambda ; a:f32[3]. let                                graph(a):
        b = custom_jvp_call[relu]{ jit{ max a 0.0 } } a        b = max a 0.0  (region: relu)
        c = cond[...] i b                                     c = cond i b   (sub-graphs)
      in (c,) }                                              -> (c,)

Nested `jit` calls are inlined when they carry no sharding, layout or compiler options;
`custom_jvp_call` / `custom_vjp_call` bodies are inlined as regions (see `graph.Region`) when
every output is computed inside them.
Sub-jaxprs (params holding ClosedJaxprs, found by type: `cond`, `while`, `scan`, a `jit` kept
whole, ...) become sub-graphs that the passes optimize too; the bodies of custom-derivative
calls that are not inlined, and composites' decompositions, pass through untouched. `_compat`
knows which primitive is which.
"""

from __future__ import annotations

from .. import _compat
from .graph import Graph, Node, Region, Value


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
        jit_body = _compat.plain_jit_body(name, eqn.params)
        body = _compat.region_body(name, eqn.params)
        if jit_body is not None:
            outputs = _inline(graph, jit_body, inputs, region)
        elif body is not None and _all_outputs_computed(body):
            inner = Region(eqn.primitive, eqn.params, inputs, region)
            outputs = _inline(graph, body, inputs, inner)
            inner.outputs = list(outputs)
            graph.add_region(inner)
        else:
            kept = body is not None or _compat.keeps_body(name)
            subjaxprs = {} if kept else _compat.sub_jaxprs(name, eqn.params)
            subgraphs = {key: _subgraphs(sub) for key, sub in subjaxprs.items()}
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
        return tuple(_subgraph(closed) for closed in param)
    if isinstance(param, _compat.Jaxpr):
        return _subgraph(_compat.ClosedJaxpr(param, []))
    return _subgraph(param)


def _subgraph(closed) -> Graph:
    graph = from_jaxpr(closed)
    graph.outermost = False
    return graph


def _inline(graph: Graph, closed, inputs: list[Value], region: Region | None) -> list[Value]:
    jaxpr = closed.jaxpr
    env = dict(zip(jaxpr.invars, inputs))
    for var, const in zip(jaxpr.constvars, closed.consts):
        env[var] = Value(var.aval, const=const)
    _build_eqns(graph, jaxpr.eqns, env, region)
    return [_read(env, atom) for atom in jaxpr.outvars]
