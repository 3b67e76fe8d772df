"""widen-narrow-products: a bf16/f16 array scaled by a scalar and read only widened to f32 is
scaled in f32, where XLA computes it so [the narrow-state side of ReplaceMomentumCastFusion].

    d:bf16[n] = mul 0.8984375:bf16[] acc:bf16[n]          a:f32[n] = convert_element_type[f32] acc
    e:f32[n]  = convert_element_type[f32] d          ->   e:f32[n] = mul 0.8984375:f32[] a

This is how a narrow optimizer state decays (`optax.sgd(..., accumulator_dtype=jnp.bfloat16)`,
`optax.adamw(..., mu_dtype=jnp.bfloat16)`): afterwards the update has its f32 form, the
optimizer fusions match it, and fold-casts lets the kernel read and write the narrow state.

The f32 product skips the rounding of the product to bf16 that the jaxpr spells. Under its
default `xla_allow_excess_precision` XLA may skip it too, and whether it does depends on the
compiler: XLA's CPU compiler computes a bf16 product in f32 and drops the round trip before the
convert, but rounds an f16 one. So the rewrite is taken only where XLA, asked once per process
(platform, dtype and jax.jit's compiler_options), computes the probe `g + f32(c * x)` as
`g + f32(c) * f32(x)` on values where the two differ: what jax.jit's program computes does not
change (tests/passes/test_widen_narrow_products.py compares bit for bit). With excess
precision turned off (`--xla_allow_excess_precision=false` in XLA_FLAGS or in
`compiler_options`) XLA rounds, the probe says so, and nothing is rewritten.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat
from ..ir import ops
from ..ir.dtypes import NARROW
from ..ir.graph import Graph, Value
from ..patterns import Match, Pat, Var, rewrite
from ..platforms import Target
from .manager import Context, Pass


@functools.cache
def xla_widens(target: Target, dtype: np.dtype) -> bool:
    """Whether XLA on the target (its platform and compiler options) computes `g + f32(c * x)`,
    for `dtype` scalar c and array x, as `g + f32(c) * f32(x)` (no rounding of the product to
    `dtype`)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(512).astype(dtype)
    g = rng.standard_normal(512).astype(np.float32)
    c = np.asarray(0.9, dtype)
    wide = g + np.float32(c) * x.astype(np.float32)

    def probe(x, g):
        return g + (c * x).astype(jnp.float32)

    try:
        (compiled,) = target.compile([probe], [x, g])
    except RuntimeError:  # a platform this process has no device of: XLA cannot be asked
        return False
    args = target.put([x, g])
    with jax.ensure_compile_time_eval():
        out = np.asarray(compiled(*args))
    return bool(np.array_equal(out, wide))


def _widen(graph: Graph, m: Match, ctx: Context) -> Value | None:
    product, convert = m.value_of(PRODUCT), m.node
    c, x = sorted((m["c"], m["x"]), key=lambda v: v.ndim)  # the scalar, the array
    if not (
        _compat.convert_dtype(convert.params) == np.float32
        and product.dtype in NARROW
        and x.dtype == c.dtype == product.dtype
        and c.ndim == 0
        and x.shape == product.shape
        and graph.num_uses(product) == 1
        and xla_widens(ctx.target, x.dtype)
    ):
        return None
    widened = []
    for value in (c, x):
        if value.is_const:  # exactly: f32 holds every bf16 and f16 value
            f32 = value.aval.update(dtype=np.dtype(np.float32))
            widened.append(Value(f32, const=np.asarray(value.const, np.float32)))
            continue
        node = ops.convert(value, np.float32)
        graph.insert(node, before=convert)
        widened.append(node.outputs[0])
    node = ops.make("mul", widened, m.root.aval)
    graph.insert(node, before=convert)
    return node.outputs[0]


PRODUCT = Pat("mul", [Var("c"), Var("x")], params=_compat.SAME_DTYPE)


def run(graph: Graph, ctx: Context) -> int:
    rule = Pat("convert_element_type", [PRODUCT])
    return rewrite(graph, [(rule, functools.partial(_widen, ctx=ctx))])


PASS = Pass("widen-narrow-products", run, doc=__doc__)
