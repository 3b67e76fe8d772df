"""select-kernels: for each fused node, its compiled kernel or XLA's own code
[GPUSession::SelectKernel].

    p2 m2 v2 = jgsess.adamw[flags=7] ...    ->   jgsess.adamw[flags=7, impl=kernel] ...

XLA's code (the node's pure-JAX reference, traced inline so XLA fuses it with its neighbours) is
chosen when the platform has no compiled kernel, when `JGSESS_KERNELS` turns the kernel off, or
when XLA measured faster for the node's shapes (`jgsess.autotune`, for specs with a cost model;
the cost model itself where measuring is off). In a program traced inside another
(jgsess.optim's update in the user's jax.jit step), a kernel whose results the enclosing program
reads next in a known way (the update, by `apply_updates`) is measured with that step on both
sides: XLA fuses it with the reference, and the kernel's results are read again. How many
devices the process sees does not matter: a program partitioned over several devices runs each
kernel per shard (its spec's sharding rule, kernels/partition.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _compat, _config, autotune
from ..ir.graph import Graph, Node
from .manager import Context, Pass


@dataclass(frozen=True)
class KernelChoice:
    kernel: str
    impl: str  # "kernel" or "xla"
    reason: str
    operands: int
    nbytes: int


def choose(node: Node, ctx: Context) -> tuple[str, str]:
    spec, platform = node.op, ctx.platform
    ok, reason = spec.available(platform)
    if not ok:
        return "xla", reason
    if _config.kernel_forced(spec.name):
        return "kernel", "JGSESS_KERNELS=on"
    then = spec.followed_by(spec.static(node.params)) if ctx.nested else None
    if spec.prefer_kernel is None and then is None:
        return "kernel", f"compiled {platform} kernel"
    wins, reason = autotune.choose(node, platform, ctx.record, ctx.autotune_budget, then)
    return ("kernel" if wins else "xla"), reason


def run(graph: Graph, ctx: Context) -> int:
    count = 0
    for node in graph.live():
        if not node.is_fused:
            continue
        impl, reason = choose(node, ctx)
        node.params["impl"] = impl
        graph.changed = True
        count += impl == "kernel"
        nbytes = sum(_compat.aval_nbytes(v.aval) for v in node.inputs)
        choice = KernelChoice(node.op.name, impl, reason, len(node.inputs), nbytes)
        ctx.record.kernels.append(choice)
    return count


PASS = Pass("select-kernels", run, doc=__doc__)
