"""Stable text and Graphviz forms of a graph.

Names are given at print time (a, b, ..., z, ba, ...), as jax prints jaxprs, so two prints of
equal graphs are equal text:

    graph(a:f32[4], b:f32[4]) {
      c:f32[4] = mul 0.1 b
      d:f32[4] = add a c
    } -> (d)
"""

from __future__ import annotations

import csv
import io

import numpy as np

from .. import _compat
from .graph import Graph, Node, Value


class _Names:
    def __init__(self):
        self.names: dict[Value, str] = {}

    def __call__(self, value: Value) -> str:
        if value.is_const:
            return _const_text(value)
        if value not in self.names:
            self.names[value] = _letters(len(self.names))
        return self.names[value]


def _letters(n: int) -> str:
    text = ""
    while True:
        text = chr(ord("a") + n % 26) + text
        n //= 26
        if n == 0:
            return text


def aval_text(aval) -> str:
    shape = getattr(aval, "shape", None)
    if shape is None:
        return str(aval)
    dtype = getattr(aval, "dtype", "?")
    short = getattr(dtype, "str", "")[1:] if hasattr(dtype, "str") else ""
    name = {"f4": "f32", "f8": "f64", "f2": "f16", "i4": "i32", "i8": "i64", "b1": "bool"}.get(
        short, str(dtype)
    )
    if str(dtype) == "bfloat16":
        name = "bf16"
    return f"{name}[{','.join(str(d) for d in shape)}]"


def _const_text(value: Value) -> str:
    number = value.scalar_value()
    if number is not None:
        return repr(number)
    return f"const{aval_text(value.aval)}"


def _param_text(value) -> str:
    if isinstance(value, np.ndarray) and value.size > 8:
        return f"array{value.shape}"
    text = repr(value) if not isinstance(value, str) else value
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:77] + "..."


def node_text(node: Node, names: _Names) -> str:
    outs = " ".join(f"{names(v)}:{aval_text(v.aval)}" for v in node.outputs) or "_"
    shown = {
        k: v
        for k, v in sorted(node.params.items())
        if k not in node.subgraphs and not _compat.is_opaque_param(v)
    }
    params = ", ".join(f"{k}={_param_text(v)}" for k, v in shown.items())
    op = f"jgsess.{node.name}" if node.is_fused else node.name
    head = f"{outs} = {op}[{params}]" if params else f"{outs} = {op}"
    args = " ".join(names(v) for v in node.inputs)
    region = (
        f"  # in {_compat.call_name(node.region.primitive, node.region.params)}"
        if node.region
        else ""
    )
    return f"{head} {args}{region}".rstrip()


def graph_text(graph: Graph, indent: str = "", names: _Names | None = None) -> str:
    names = names or _Names()
    ins = ", ".join(f"{names(v)}:{aval_text(v.aval)}" for v in graph.inputs)
    lines = [f"{indent}graph({ins}) {{"]
    for node in graph.live():
        lines.append(f"{indent}  {node_text(node, names)}")
        for key, sub in node.subgraphs.items():
            for i, g in enumerate(sub if isinstance(sub, tuple) else (sub,)):
                lines.append(f"{indent}    {key}[{i}]:")
                lines.append(graph_text(g, indent + "      ", _Names()))
    outs = ", ".join(names(v) for v in graph.outputs)
    lines.append(f"{indent}}} -> ({outs})")
    return "\n".join(lines)


def graph_dot(graph: Graph) -> str:
    """Graphviz source: one box per node, one edge per value use; fused nodes filled."""
    names = _Names()
    lines = ["digraph jgsess {", "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    for i, value in enumerate(graph.inputs):
        lines.append(f'  in{i} [label="{names(value)}:{aval_text(value.aval)}", shape=ellipse];')
    source = {value: f"in{i}" for i, value in enumerate(graph.inputs)}
    for node in graph.live():
        style = ", style=filled, fillcolor=lightblue" if node.is_fused else ""
        label = ("jgsess." if node.is_fused else "") + node.name
        lines.append(f'  n{node.id} [label="{label}"{style}];')
        for value in node.inputs:
            if value in source:
                lines.append(f'  {source[value]} -> n{node.id} [label="{names(value)}"];')
        for value in node.outputs:
            source[value] = f"n{node.id}"
    for i, value in enumerate(graph.outputs):
        lines.append(f'  out{i} [label="out{i}", shape=ellipse];')
        if value in source:
            lines.append(f"  {source[value]} -> out{i};")
    lines.append("}")
    return "\n".join(lines)


def order_csv(graph: Graph) -> str:
    """The execution order as CSV: position, node, op, output avals."""
    names = _Names()
    for value in graph.inputs:
        names(value)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["position", "outputs", "op", "inputs"])
    for i, node in enumerate(graph.live()):
        outs = " ".join(f"{names(v)}:{aval_text(v.aval)}" for v in node.outputs)
        ins = " ".join(names(v) for v in node.inputs)
        writer.writerow([i, outs, ("jgsess." if node.is_fused else "") + node.name, ins])
    return out.getvalue()
