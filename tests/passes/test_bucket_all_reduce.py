"""bucket-all-reduce: per-leaf all-reduces of a shard_map body become one per bucket.

On one device here (a mesh of size 1 still has the collectives); tests/multi_device/cases.py
runs the pass on 4 devices.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jgsess
from jgsess import platforms
from jgsess.passes import bucket_all_reduce
from tests.helpers import assert_trees_close, needs_shard_map_bodies

SHAPES = [(13, 7), (7,), (300,), (2, 3, 5)]


def tree(seed=0):
    key = jax.random.PRNGKey(seed)
    return [jax.random.normal(jax.random.fold_in(key, i), s) for i, s in enumerate(SHAPES)]


def per_leaf_pmean(xs, ints):
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))

    def body(xs, ints):
        grads = [jnp.sin(x) * 2 for x in xs]
        return [jax.lax.pmean(g, "data") for g in grads], jax.lax.psum(ints, "data")

    return jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P())(xs, ints)


def all_reduces(fn, *args) -> int:
    return len(re.findall(r"stablehlo\.all_reduce|all-reduce\(", fn.lower(*args).as_text()))


@needs_shard_map_bodies
def test_fires_numbers_match_and_fewer_all_reduces(monkeypatch):
    monkeypatch.setenv("JGSESS_BUCKETS", "on")
    xs, ints = tree(), jnp.arange(3)
    fused = jgsess.jit(per_leaf_pmean)
    assert_trees_close(fused(xs, ints), jax.jit(per_leaf_pmean)(xs, ints))
    (choice,) = [c for c in fused.report(xs, ints).buckets if c.dtype == "float32"]
    assert choice.taken and choice.operands == 4 and len(choice.buckets) == 1
    assert all_reduces(fused, xs, ints) == 2  # the f32 bucket and the int32 psum
    assert all_reduces(jax.jit(per_leaf_pmean), xs, ints) == 5


@needs_shard_map_bodies
def test_bucket_size_cuts_in_ready_order(monkeypatch):
    monkeypatch.setenv("JGSESS_BUCKETS", "on")
    monkeypatch.setenv("JGSESS_BUCKET_MB", str(400 / 2**20))  # 400 bytes
    xs, ints = tree(1), jnp.arange(3)
    fused = jgsess.jit(per_leaf_pmean)
    assert_trees_close(fused(xs, ints), jax.jit(per_leaf_pmean)(xs, ints))
    (choice,) = [c for c in fused.report(xs, ints).buckets if c.dtype == "float32"]
    # 364 bytes + 28 bytes, then 1200 bytes alone, then 120 bytes
    assert choice.buckets == (392, 1200, 120)


@needs_shard_map_bodies
def test_near_misses_stay_as_written(monkeypatch):
    monkeypatch.setenv("JGSESS_BUCKETS", "on")
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))

    def body(a, b, n):
        # different axes, and a lone int psum: nothing to put together
        return jax.lax.psum(a, "data"), jax.lax.psum(b, "model"), jax.lax.psum(n, "data")

    fn = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P())
    args = (jnp.ones(5), jnp.ones(6), jnp.arange(3))
    fused = jgsess.jit(fn)
    assert_trees_close(fused(*args), jax.jit(fn)(*args))
    assert fused.report(*args).buckets == []


@needs_shard_map_bodies
def test_off_and_measured(monkeypatch, tuning, default_platform):
    xs, ints = tree(2), jnp.arange(3)
    monkeypatch.setenv("JGSESS_BUCKETS", "off")
    assert jgsess.jit(per_leaf_pmean).report(xs, ints).buckets == []
    monkeypatch.delenv("JGSESS_BUCKETS")
    monkeypatch.setenv("JGSESS_AUTOTUNE_BUDGET", "60")
    # a function of its own: jax.jit's cache holds the program other tests compiled unmeasured
    fused = jgsess.jit(lambda xs, ints: per_leaf_pmean(xs, ints))
    assert_trees_close(fused(xs, ints), jax.jit(per_leaf_pmean)(xs, ints))
    (choice,) = [c for c in fused.report(xs, ints).buckets if c.dtype == "float32"]
    if not platforms.has_devices(default_platform):  # --default-platform=cuda: a faked GPU
        # planned for a GPU this process has not: nothing measured, the all-reduces as written
        assert not choice.taken and f"no {default_platform} device" in choice.reason
        return
    assert choice.written_ms > 0 and choice.bucketed_ms > 0, choice.reason
    assert choice.taken == (choice.bucketed_ms < choice.written_ms)
    assert "all-reduce axes" in str(fused.report(xs, ints))


@needs_shard_map_bodies
def test_a_gradient_behind_a_reduced_value_starts_a_new_bucket(monkeypatch):
    monkeypatch.setenv("JGSESS_BUCKETS", "on")
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))

    def body(a, b):
        a2 = jax.lax.psum(a, "data")
        return a2, jax.lax.psum(b * a2.sum(), "data")

    fn = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P())
    args = (jnp.arange(5.0), jnp.arange(6.0))
    fused = jgsess.jit(fn)
    assert_trees_close(fused(*args), jax.jit(fn)(*args))
    assert fused.report(*args).buckets == []  # two buckets of one: as written


@pytest.mark.parametrize(
    ("sizes", "cap", "want"),
    [([4, 4, 4], 8, [[0, 1], [2]]), ([10, 1, 1], 8, [[0], [1, 2]]), ([1], 8, [[0]])],
)
def test_cut(sizes, cap, want):
    class V:
        def __init__(self, n):
            self.aval = jax.core.ShapedArray((n,), jnp.uint8)

    operands = [(V(n), None, i) for i, n in enumerate(sizes)]
    got = bucket_all_reduce._cut(operands, cap, lambda value, nodes: False)
    assert [[i for _, _, i in b] for b in got] == want


@needs_shard_map_bodies
def test_buckets_the_budget_left_over_are_listed_as_not_measured_yet(monkeypatch, tuning):
    """The compilation's first measurement (global_norm's) spends its budget: the buckets keep
    the all-reduces as written, and the report lists them as not measured yet."""
    import time

    import optax

    from jgsess import autotune

    def measure(sides, target):
        time.sleep(0.02)
        return 1.0, 2.0

    monkeypatch.setattr(autotune, "measure", measure)
    monkeypatch.setenv("JGSESS_AUTOTUNE_BUDGET", "0.001")

    def step(xs, ints):
        return per_leaf_pmean(xs, ints), optax.global_norm(xs)

    xs, ints = tree(3), jnp.arange(3)
    with jax.default_device(jax.devices("cpu")[0]):  # measured where it runs, whatever the default
        report = jgsess.jit(step).report(xs, ints)
    assert [m.kernel for m in report.selection] == ["global_norm"]
    (choice,) = [c for c in report.buckets if c.dtype == "float32"]
    assert not choice.taken and "not measured yet" in choice.reason
    assert ("all_reduce_bucket", "as written") in report.unmeasured
