"""The kernel graph IR: build it from a jaxpr, edit it, print it, check it."""

from .build import from_jaxpr
from .graph import Graph, GraphError, Node, Region, Value
from .printer import graph_dot, graph_text, order_csv
from .verify import interface_of, verify

__all__ = [
    "Graph",
    "GraphError",
    "Node",
    "Region",
    "Value",
    "from_jaxpr",
    "graph_dot",
    "graph_text",
    "interface_of",
    "order_csv",
    "verify",
]
