"""bucket-all-reduce: a shard_map body's many all-reduces, one per bucket [AllReduceFusion].

In a data-parallel step each gradient leaf is all-reduced on its own (`pmean` per leaf, or one
`pmean` over the tree); their operands over the same mesh axes and of one dtype are taken in the
order they become ready and cut into buckets of at most JGSESS_BUCKET_MB (default 25 MB):

    a2 = psum[axes=('data',)] a                 a2 b2 = jgsess.all_reduce_bucket[axes=('data',)] a b
    b2 = psum[axes=('data',)] b          ->     (one psum of concat(a, b), split back)

XLA combines all-reduces itself, so the rewrite is kept only where jgsess/selection.py measured
it faster: both forms are timed on the mesh's devices under the compilation's measuring budget
and cache (JGSESS_AUTOTUNE), and the report shows the buckets, both timings and the decision.
Unmeasured, the program keeps its all-reduces as written. With JGSESS_BUCKETS=on the rewrite is
taken without measuring, with =off never. A mesh spanning several processes is not measured
(the processes could decide differently and run different programs): it keeps the program as
written unless JGSESS_BUCKETS=on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from .. import _compat, _config, selection
from ..ir.graph import Graph, Node, Value
from ..kernels.spec import KernelSpec
from .manager import Context, Pass


def bucket_reference(*operands, axes):
    """psum(x_i, axes) for every operand, as one psum of them flattened and concatenated."""
    flat = jnp.concatenate([x.reshape(-1) for x in operands])
    total = jax.lax.psum(flat, axes)
    results, start = [], 0
    for x in operands:
        results.append(total[start : start + x.size].reshape(x.shape))
        start += x.size
    return tuple(results)


# A fused node with no kernel to select: it always runs its reference, XLA's all-reduce over one
# contiguous buffer (the bucket).
BUCKET = KernelSpec(
    name="all_reduce_bucket",
    reference=bucket_reference,
    result_avals=lambda avals, static: [_compat.ShapedArray(a.shape, a.dtype) for a in avals],
    doc="one all-reduce for a bucket of gradients",
)


@dataclass(frozen=True)
class BucketChoice:
    """One group of all-reduces (same axes and dtype) and what the pass did with it."""

    axes: tuple
    dtype: str
    operands: int
    calls: int
    buckets: tuple[int, ...]  # bytes per bucket, in order
    written_ms: float | None
    bucketed_ms: float | None
    taken: bool
    reason: str


def run(graph: Graph, ctx: Context) -> int:
    cap = _config.bucket_bytes()
    if _config.buckets() == "off" or cap <= 0:
        return 0
    count = 0
    for g in list(graph.walk()):
        for node in g.live():
            if _compat.is_shard_map(node.name) and _compat.SHARD_MAP_BODY in node.subgraphs:
                mesh = _compat.shard_map_mesh(node.params)
                for body in node.body(_compat.SHARD_MAP_BODY).walk():
                    count += _bucket_body(body, mesh, cap, ctx)
    return count


def _bucket_body(body: Graph, mesh, cap: int, ctx: Context) -> int:
    position = {node: i for i, node in enumerate(body.live())}
    groups: dict[tuple, list[Node]] = {}
    for node in body.live():
        if _compat.is_all_reduce(node.op, node.params) and body.is_rewritable(node):
            dtypes = {v.dtype for v in node.inputs}
            if len(dtypes) == 1:
                key = (_compat.all_reduce_axes(node.params), dtypes.pop())
                groups.setdefault(key, []).append(node)
    count = 0
    for (axes, dtype), nodes in groups.items():
        operands = [(v, node, i) for node in nodes for i, v in enumerate(node.inputs)]
        if len(operands) < 2:
            continue
        operands.sort(key=lambda o: _ready(o[0], position))
        buckets = _cut(operands, cap, lambda v, ns: body.depends_on([v], ns, position))
        if len(buckets) == len(nodes) and all(len(b) == 1 for b in buckets):
            continue  # already one all-reduce per bucket
        decision = _decide(ctx, mesh, axes, nodes, buckets)
        ctx.record.buckets.append(
            BucketChoice(
                axes,
                str(np.dtype(dtype)),
                len(operands),
                len(nodes),
                tuple(sum(_compat.aval_nbytes(v.aval) for v, _, _ in b) for b in buckets),
                decision.written_ms,
                decision.bucketed_ms,
                decision.bucketed,
                decision.reason,
            ),
        )
        if decision.bucketed:
            _rewrite(body, nodes, buckets, axes)
            body.settle()  # a body, which the manager settles only for recursive passes
            count += len(buckets)
    return count


def _ready(value: Value, position: dict) -> float:
    """When `value` becomes ready: its producer's place in the order (inputs first)."""
    return position.get(value.producer, -1)


def _cut(operands: list, cap: int, depends) -> list[list]:
    """Consecutive (value, all-reduce, index) operands into buckets of at most `cap` bytes (a
    larger one alone). An operand computed from an all-reduce of the open bucket (a gradient
    behind a reduced activation) starts a new one: `depends(value, nodes)` says whether it is."""
    buckets: list = []
    size = cap
    for operand in operands:
        nbytes = _compat.aval_nbytes(operand[0].aval)
        if size + nbytes > cap or depends(operand[0], {node for _, node, _ in buckets[-1]}):
            buckets.append([])
            size = 0
        buckets[-1].append(operand)
        size += nbytes
    return buckets


def _rewrite(body: Graph, nodes: list[Node], buckets: list[list], axes: tuple) -> None:
    for bucket in buckets:
        values = [v for v, _, _ in bucket]
        fused = Node(BUCKET, values, [v.aval for v in values], {"axes": axes})
        anchor = max((node for _, node, _ in bucket), key=body.nodes.index)
        body.insert(fused, before=anchor)
        for (_, node, i), out in zip(bucket, fused.outputs):
            body.replace_uses(node.outputs[i], out)
    for node in nodes:
        body.remove(node)


def _decide(ctx: Context, mesh, axes, nodes, buckets) -> selection.BucketDecision:
    calls = tuple(tuple(_struct(v.aval) for v in node.inputs) for node in nodes)
    index = {
        (id(node), i): k
        for k, (node, i) in enumerate((node, i) for node in nodes for i in range(len(node.inputs)))
    }
    cut = tuple(tuple(index[(id(node), i)] for _, node, i in b) for b in buckets)
    avals = [v.aval for node in nodes for v in node.inputs]
    static = {"axes": axes, "calls": calls, "cut": cut, "mesh": tuple(mesh.shape.items())}
    programs = functools.partial(_programs, mesh, axes, calls, cut)
    return selection.decide_buckets(ctx.target, ctx.record, mesh, avals, static, programs)


def _struct(aval) -> tuple:
    return tuple(aval.shape), np.dtype(aval.dtype).name


def _programs(mesh, axes, calls, cut) -> tuple:
    """The all-reduces as buckets and as written, programs over `mesh` taking every operand
    replicated."""

    def written(*xs):
        out, k = [], 0
        for call in calls:
            out.extend(jax.lax.psum(tuple(xs[k : k + len(call)]), axes))
            k += len(call)
        return tuple(out)

    def bucketed(*xs):
        out = [None] * len(xs)
        for bucket in cut:
            for k, y in zip(bucket, bucket_reference(*(xs[k] for k in bucket), axes=axes)):
                out[k] = y
        return tuple(out)

    return tuple(
        jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))
        for f in (bucketed, written)
    )


PASS = Pass("bucket-all-reduce", run, recursive=False, doc=__doc__)
