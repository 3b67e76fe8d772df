"""fuse-batch-norm-relu: a training-mode BatchNorm followed by ReLU (or by a residual add and
ReLU) becomes one forward kernel node, and, in a differentiated step, its whole backward one
more [BatchNormReluFusion, BatchNormAddReluFusion, PostBatchNormAddReluFusion,
BatchNormReluGradFusion, BatchNormAddReluGradFusion].

flax.linen.BatchNorm(use_running_average=False) + relu, after canonicalize (NHWC shown):

    m  = div (reduce_sum[0,1,2] x) 18.0
    v  = max 0.0 (sub (div (reduce_sum[0,1,2] (square x)) 18.0) (square m))
    t  = add (mul (sub x (bcast m)) (mul (rsqrt (add (bcast v) 1e-5)) (reshape g))) (reshape b)
    y  = max t 0.0                                   ->   y m v k = jgsess.batch_norm_relu x g b
    ... (the running averages read m and v)
    ... (in a step: ~40 backward ops from gt t 0.0 and dy to dx, dg, db)
                                                     ->   dx dg db = jgsess.batch_norm_relu_grad
                                                                         dy x g m v k

Patterns are examples at exact shapes: for each ReLU `max s 0.0` a cheap probe reads the layout
(feature axis, x's dtype, a residual add) from the ops above it; each formula of
`kernels.batch_norm.FORMS` (flax.linen and flax.nnx, with fast or two-pass variance, and a
textbook jnp one) is traced at those shapes, as a forward or, where the ReLU's mask is read, as
forward plus `jax.vjp`, canonicalized as the program was, and embedded around the ReLU
(`patterns.embed`). eps is a wildcard literal; the residual add matches in either order.

Guard (the fusion driver's, on the nodes the rewrite removes): every value inside the match is
read only inside it, except its results (y, the statistics, the gradients, and the residual's
gradient) — the single-user check the seed lacks: a pre-activation value read elsewhere keeps
XLA's code. Nodes that only compute constants may be shared: they are not removed. Eval mode,
other activations, other formulas (eps outside the square root, say) do not embed. The
running-statistics update is not part of the match and stays exact. A match is taken where the
kernels measure faster than the matched code (`Rewrite.would_select`), and declined otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from ... import _compat, selection
from ...ir import from_jaxpr
from ...ir.graph import Graph, Node, Value
from ...kernels import batch_norm
from ...patterns.embed import Embedding, embed
from ..cleanups import clean
from ..manager import Context
from .engine import Fusion, Rewrite

NAME = "fuse-batch-norm-relu"
# eps stands for any literal: the examples are traced with this one
_EPS = 0.0123456789
_EPS_KEY = float(np.float32(_EPS))
_PROBE_DEPTH = 8


def _structs(shape, axis: int, add: bool, train: bool, x_dtype, y_dtype):
    channels = (shape[axis],)
    structs = [
        jax.ShapeDtypeStruct(shape, x_dtype),
        jax.ShapeDtypeStruct(channels, np.float32),
        jax.ShapeDtypeStruct(channels, np.float32),
    ]
    structs += [jax.ShapeDtypeStruct(shape, y_dtype)] * (int(add) + int(train))
    return structs


class _Example:
    """A traced example: its graph, the ReLU node to anchor on, and its outputs
    (y, mean, var[, dx, dscale, dbias[, dz]])."""

    def __init__(self, form: str, train: bool, add: bool, shape, x_dtype, y_dtype, axis: int):
        fn = batch_norm.program_fn(form, train, _EPS, axis, np.dtype(y_dtype))
        structs = _structs(shape, axis, add, train, x_dtype, y_dtype)
        graph = from_jaxpr(jax.make_jaxpr(fn)(*structs))
        clean(graph, Context())
        self.graph = graph
        self.outputs = list(graph.outputs)
        anchor = self.outputs[0].producer
        assert anchor is not None  # y: the example's ReLU computes it
        self.anchor = anchor
        self.add = add
        self.train = train
        self.residuals = _residuals(graph) if train else []


def _residuals(graph: Graph) -> list[Value]:
    """The values the forward computes and the backward reads (the backward: what depends on
    dy, the last input)."""
    backward: set[Node] = set()
    for node in graph.nodes:
        if any(v is graph.inputs[-1] or v.producer in backward for v in node.inputs):
            backward.add(node)
    return list(
        dict.fromkeys(
            v
            for node in backward
            for v in node.inputs
            if v.producer is not None and v.producer not in backward
        )
    )


@functools.lru_cache(maxsize=512)
def _example(form, train, add, shape, x_dtype, y_dtype, axis) -> _Example | None:
    if form == "plain" and np.dtype(x_dtype) != np.float32:
        return None  # jnp.mean of a narrow x rounds the statistics to it: not this kernel
    return _Example(form, train, add, shape, x_dtype, y_dtype, axis)


def _relu_input(node: Node) -> Value | None:
    """s, for `max s 0.0` (either order) on a float array."""
    if node.name != "max" or len(node.inputs) != 2:
        return None
    for s, zero in (node.inputs, node.inputs[::-1]):
        if zero.is_const and zero.scalar_value() == 0.0 and s.ndim >= 2:
            if jnp.issubdtype(s.dtype, jnp.floating) and s.shape == node.outputs[0].shape:
                return s
    return None


def _probe(s: Value) -> tuple[int, np.dtype, bool] | None:
    """(feature axis, x's dtype, residual add?) read from the ops above s: the first
    `sub x m` whose m is a per-channel vector shaped to broadcast against x."""
    frontier, seen = [s], set()
    for _ in range(_PROBE_DEPTH):
        following = []
        for value in frontier:
            node = value.producer
            if node is None or node in seen or node.is_fused:
                continue
            seen.add(node)
            if node.name == "sub":
                found = _layout(node.inputs[0], node.inputs[1], s)
                if found is not None:
                    add = _residual_add(s)
                    return found[0], found[1], add
            following.extend(node.inputs)
        frontier = following
    return None


def _layout(x: Value, m: Value, s: Value) -> tuple[int, np.dtype] | None:
    if x.shape != s.shape or m.ndim != x.ndim:
        return None
    wide = [d for d in range(x.ndim) if m.shape[d] != 1]
    if len(wide) != 1 or m.shape[wide[0]] != x.shape[wide[0]]:
        return None
    node = x.producer
    if node is not None and node.name == "convert_element_type":
        return wide[0], np.dtype(node.inputs[0].dtype)
    return wide[0], np.dtype(x.dtype)


def _residual_add(s: Value) -> bool:
    node = s.producer
    return node is not None and node.name == "add" and all(v.shape == s.shape for v in node.inputs)


def _trains(graph: Graph, s: Value) -> bool:
    """Whether the ReLU's mask `gt s 0.0` is read (a differentiated step)."""
    return any(u.name == "gt" and u.inputs[0] is s for u in s.users)


def _constant(node: Node, memo: dict) -> bool:
    """Whether `node` computes from constants only (a zeros broadcast, say). A walk over the
    producers with a stack of its own (a deep network's backward pass nests thousands)."""
    stack = [node]
    while stack:
        top = stack[-1]
        if top in memo:
            stack.pop()
            continue
        if top.effects or any(not v.is_const and v.producer is None for v in top.inputs):
            memo[top] = False  # an effect, or a graph input
            stack.pop()
            continue
        producers = [v.producer for v in top.inputs if v.producer is not None]
        waiting = [p for p in producers if p not in memo]
        if waiting:
            stack.extend(waiting)
            continue
        memo[top] = all(memo[p] for p in producers)
        stack.pop()
    return memo[node]


def _removed(graph: Graph, inside: list[Node], results: set[Value]) -> list[Node]:
    """The matched nodes but the constant ones read outside the match (and what they read):
    nodes that only compute constants may be shared, and stay where still read."""
    within = set(inside)
    memo: dict = {}
    keep = {
        node
        for node in inside
        if _constant(node, memo)
        and any(
            value not in results
            and (graph.output_uses(value) or any(u not in within for u in value.users))
            for value in node.outputs
        )
    }
    stack = list(keep)
    while stack:
        for value in stack.pop().inputs:
            if value.producer in within and value.producer not in keep:
                keep.add(value.producer)
                stack.append(value.producer)
    return [node for node in inside if node not in keep]


def _note_residuals(residuals: tuple[str, int, int], ctx: Context) -> None:
    """For the memory report: (backward kernel, bytes the program kept for its backward, bytes
    the kernels keep: statistics and mask bits)."""
    ctx.record.residuals.append(residuals)


def _rewrite(graph: Graph, ex: _Example, emb: Embedding, axis: int, form: str) -> Rewrite:
    """The kernel nodes replacing an embedded example: the forward before the ReLU and, in a
    step, the backward before the first gradient; taken where measured faster."""
    image = [emb.values[v] for v in ex.outputs]
    operands = [emb.values[v] for v in ex.graph.inputs]
    forward_in = operands[: 4 if ex.add else 3]
    y, mean, var = image[:3]
    static = {"eps": float(emb.wildcards["eps"].scalar_value()), "axis": axis, "form": form}
    static["dtype"] = np.dtype(y.dtype).name
    specs = _specs(ex)
    stats = batch_norm.stats_layout(mean.shape, forward_in[0].shape[axis])
    params = [{**static, "stats_shape": stats}, {**static, "add": ex.add}]
    # results that replace program values keep their avals (shardings included)
    avals = specs[0].result_avals([v.aval for v in forward_in], params[0])
    fwd = Node(specs[0], forward_in, [v.aval for v in image[:3]] + avals[3:], params[0])
    added = [(fwd, emb.nodes[ex.anchor])]
    replaced = list(zip(image[:3], fwd.outputs[:3]))
    on_apply = None
    if ex.train:
        inputs = [operands[-1], *forward_in[:2], *fwd.outputs[1:4]]
        bwd = Node(specs[1], inputs, [v.aval for v in image[3:]], params[1])
        first_grad = image[3].producer
        assert first_grad is not None  # the program computes its gradients
        added.append((bwd, first_grad))
        replaced += list(zip(image[3:], bwd.outputs))
        kept = sum(_compat.aval_nbytes(emb.values[v].aval) for v in ex.residuals)
        fused = sum(_compat.aval_nbytes(v.aval) for v in fwd.outputs[1:4])
        on_apply = functools.partial(_note_residuals, (specs[1].name, kept, fused))
    return Rewrite(
        specs[0].name,
        added,
        replaced,
        _removed(graph, list(emb.nodes.values()), set(image)),
        more_kernels=tuple(spec.name for spec in specs[1:]),
        would_select=functools.partial(
            _decide, specs, params, [v.aval for v in operands], ex.train
        ),
        on_apply=on_apply,
    )


def _specs(ex: _Example) -> list:
    if ex.add:
        return [batch_norm.ADD_FORWARD, batch_norm.ADD_BACKWARD][: 1 + ex.train]
    return [batch_norm.FORWARD, batch_norm.BACKWARD][: 1 + ex.train]


def _decide(specs, params, avals, train: bool, ctx) -> tuple[bool, str]:
    """Whether to take the kernels: available here, and (measured, or cached) faster than the
    program's own code for these shapes. Unmeasured (measuring off, or this compilation's
    budget spent: a later compilation measures them), the cost model: take them, the backward
    saves most and the forward about breaks even (on the 2-core CPU the kernels lost at
    ResNet-18's small shapes and won at most of ResNet-50's batch-32 ones)."""
    static = {**params[0], "train": train}
    sides = functools.partial(batch_norm.measured_sides, specs, params, avals, train)
    cost_model = lambda: (True, "the kernels")  # noqa: E731
    decision = selection.decide_program(
        ctx.target, ctx.record, specs, avals, static, sides, cost_model
    )
    return decision.kernel, decision.reason


def find(graph: Graph, node: Node, ctx: Context, memo: dict) -> Iterator[Rewrite]:
    """At a ReLU `node`: one rewrite per formula of `FORMS` that embeds around it."""
    s = _relu_input(node)
    if s is None:
        return
    probe = _probe(s)
    if probe is None:
        return
    axis, x_dtype, add = probe
    train = _trains(graph, s)
    for form in batch_norm.FORMS:
        ex = _example(form, train, add, s.shape, x_dtype, np.dtype(s.dtype), axis)
        if ex is None:
            continue
        emb = embed(ex.graph, ex.anchor, node, {_EPS_KEY: "eps"})
        if emb is not None and "eps" in emb.wildcards:
            yield _rewrite(graph, ex, emb, axis, form)


PASS = Fusion(NAME, frozenset({"max"}), find, __doc__).as_pass()
