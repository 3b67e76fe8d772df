"""Shared test helpers: tree comparison, running passes, counting ops."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgsess import _compat
from jgsess.emit import emit
from jgsess.ir import from_jaxpr, verify
from jgsess.passes.manager import Context, run_pipeline
from jgsess.platforms import Target


def assert_trees_close(actual, expected, rtol=1e-6, atol=1e-6):
    """Same tree, dtypes, shapes and weak types; values close (NaNs equal)."""
    a_leaves, a_tree = jax.tree.flatten(actual)
    e_leaves, e_tree = jax.tree.flatten(expected)
    assert a_tree == e_tree, f"{a_tree} != {e_tree}"
    for a, e in zip(a_leaves, e_leaves):
        a, e = jnp.asarray(a), jnp.asarray(e)
        assert a.shape == e.shape, (a.shape, e.shape)
        assert a.dtype == e.dtype, (a.dtype, e.dtype)
        assert getattr(a, "weak_type", False) == getattr(e, "weak_type", False)
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, e = jax.random.key_data(a), jax.random.key_data(e)
        np.testing.assert_allclose(
            np.asarray(a, np.float64) if a.dtype == jnp.bfloat16 else np.asarray(a),
            np.asarray(e, np.float64) if e.dtype == jnp.bfloat16 else np.asarray(e),
            rtol=rtol,
            atol=atol,
        )


def graph_of(fn, *args):
    return from_jaxpr(jax.make_jaxpr(fn)(*args))


def run_passes(graph, passes, platform="cpu"):
    ctx = Context(target=Target.of(platform=platform), verify=True)
    records = run_pipeline(graph, passes, ctx)
    verify(graph)
    return ctx, records


def evaluate(graph, *args):
    return jax.jit(lambda *a: emit(graph, a))(*args)


def nodes(graph, name: str) -> list:
    """The nodes named `name` in the graph and its sub-graphs (fused nodes by kernel name)."""
    return [n for g in graph.walk() for n in g.live() if n.name == name]


def count(graph, name: str) -> int:
    """Nodes named `name` in the graph and its sub-graphs (fused nodes by kernel name)."""
    return len(nodes(graph, name))


def rand(shape, seed=0, dtype=jnp.float32):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, dtype)


def jaxpr_structure(closed):
    """A ClosedJaxpr as nested tuples: constants (their bytes), input avals, every equation
    (primitive, operands, result avals, params; sub-jaxprs as their structure) and the outputs.
    Variables become their order of appearance, callables their qualified names (jax wraps
    them anew on every trace), so two
    jaxprs compare equal when they compute the same way."""
    names: dict = {}

    def ref(atom):
        if _compat.is_literal(atom):
            return ("literal", repr(_compat.literal_value(atom)), str(atom.aval))
        return names.setdefault(atom, f"v{len(names)}"), str(atom.aval)

    def param(value):
        if isinstance(value, _compat.ClosedJaxpr):
            return jaxpr_structure(value)
        if isinstance(value, _compat.Jaxpr):
            return jaxpr_structure(_compat.ClosedJaxpr(value, ()))
        if isinstance(value, (tuple, list)):
            return tuple(param(v) for v in value)
        if callable(value) or hasattr(value, "call_wrapped"):  # functions, jax's WrappedFun
            return ("callable", getattr(value, "__qualname__", type(value).__name__))
        return repr(value)

    jaxpr = closed.jaxpr
    return (
        tuple((ref(v), np.asarray(c).tobytes()) for v, c in zip(jaxpr.constvars, closed.consts)),
        tuple(ref(v) for v in jaxpr.invars),
        tuple(
            (
                eqn.primitive.name,
                tuple(ref(a) for a in eqn.invars),
                tuple(ref(v) for v in eqn.outvars),
                tuple(sorted((k, param(v)) for k, v in eqn.params.items())),
            )
            for eqn in jaxpr.eqns
        ),
        tuple(ref(a) for a in jaxpr.outvars),
    )


def shard_map_bodies_rebuilt() -> bool:
    """Whether jgsess optimizes shard_map bodies on this jax (its params as of jax 0.8)."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]), ("d",))
    mapped = jax.shard_map(lambda x: x, mesh=mesh, in_specs=P(), out_specs=P())
    (eqn,) = jax.make_jaxpr(mapped)(jnp.ones(2)).jaxpr.eqns
    return _compat.can_rebuild_shard_map(eqn.params)


@functools.cache
def xla_fuses_f16_multiply_adds() -> bool:
    """Whether XLA's CPU code here computes an f16 `a * b + c` with one rounding (a CPU with
    native f16 arithmetic, AVX512-FP16: LLVM contracts the two into an f16 fused multiply-add)
    rather than rounding the product first, as where f16 is computed in f32. Observed, not
    assumed: optax's f16 updates then differ from the kernels' narrow math, which rounds every
    operation, and their fusions must not fire (the probe, jgsess/passes/fusions/optimizer.py)."""
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(4099).astype(np.float16) for _ in range(3))
    with jax.default_device(jax.devices("cpu")[0]):
        fused = np.asarray(jax.jit(lambda a, b, c: a * b + c)(a, b, c))
    return not np.array_equal(fused, a * b + c)  # numpy rounds each f16 operation


needs_shard_map_bodies = pytest.mark.skipif(
    not shard_map_bodies_rebuilt(), reason="shard_map bodies stay opaque before jax 0.8"
)
