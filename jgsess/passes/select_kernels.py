"""select-kernels: for each fused node, its compiled kernel or XLA's own code
[GPUSession::SelectKernel].

    p2 m2 v2 = jgsess.adamw[flags=7] ...    ->   jgsess.adamw[flags=7, impl=kernel] ...

The pass applies jgsess/selection.py's decision for each node (XLA's code is the node's pure-JAX
reference, traced inline so XLA fuses it with its neighbours) and records it with its reason.
How many devices the process sees does not matter: a program partitioned over several devices
runs each kernel per shard (its spec's sharding rule, kernels/partition.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _compat, selection
from ..ir.graph import Graph
from .manager import Context, Pass


@dataclass(frozen=True)
class KernelChoice:
    kernel: str
    impl: selection.Impl
    reason: str
    operands: int
    nbytes: int


def run(graph: Graph, ctx: Context) -> int:
    count = 0
    for node in graph.live():
        if not node.is_fused:
            continue
        decision = selection.decide(ctx.target, node, ctx.record, ctx.nested)
        node.params["impl"] = decision.impl.value
        graph.changed = True
        count += decision.kernel
        nbytes = sum(_compat.aval_nbytes(v.aval) for v in node.inputs)
        choice = KernelChoice(
            node.op.name, decision.impl, decision.reason, len(node.inputs), nbytes
        )
        ctx.record.kernels.append(choice)
    return count


PASS = Pass("select-kernels", run, doc=__doc__)
