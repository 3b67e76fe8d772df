"""In-place results: which operands of a kernel may share a buffer with its results.

A kernel declares the pairs it can compute in place (KernelSpec.inplace). A pair is taken when
the operand's buffer is free to be overwritten at that point:

  - it is not a constant and not a graph output (those buffers must survive the call);
  - it is an intermediate value, a donated input of the outermost program, or an input of a
    sub-graph or of a program traced inside another one (an enclosing value: XLA's copy
    insertion copies it first where the enclosing program reads it later, a not-donated
    parameter of the outermost program included);
  - the kernel is its last reader and reads it once (a later reader would force XLA to copy
    it first; read twice, a second result could claim it);
  - operand and result have the same shape and dtype.

Then XLA writes the result over the operand (`input_output_aliases`), with no second copy.
An outermost program's not-donated inputs are not taken: XLA would copy each one first (read
and write it once more) where a fresh result costs nothing extra.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..ir.graph import Graph, Node


@dataclass(frozen=True)
class AliasDecision:
    pairs: tuple[tuple[int, int], ...]
    # graph-input positions that would have been aliased had they been donated
    undonated: tuple[int, ...]


def choose_aliases(graph: Graph, node: Node, order: dict[Node, int]) -> AliasDecision:
    spec = node.op
    candidates = spec.inplace(spec.static(node.params), len(node.inputs))
    inputs = {v: i for i, v in enumerate(graph.inputs)}
    outputs = set(graph.outputs)
    pairs, undonated = [], []
    reads = Counter(node.inputs)
    for operand, result in sorted(candidates.items()):
        value, out = node.inputs[operand], node.outputs[result]
        if value.is_const or value in outputs:
            continue
        if (value.shape, value.dtype) != (out.shape, out.dtype):
            continue
        if reads[value] > 1 or any(order[u] > order[node] for u in value.users):
            continue
        if value in inputs and graph.outermost and not graph.donated[inputs[value]]:
            undonated.append(inputs[value])
            continue
        pairs.append((operand, result))
    return AliasDecision(tuple(pairs), tuple(undonated))
