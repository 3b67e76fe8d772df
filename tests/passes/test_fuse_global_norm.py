"""fuse-global-norm and fold-clip: optax's clip_by_global_norm becomes a norm call and a flag
of the fused AdamW; the norm's partial sums live in the workspace arena."""

import jax
import jax.numpy as jnp
import optax
import pytest

import jgsess
from jgsess.kernels import adamw
from tests.helpers import assert_trees_close, count, nodes, rand
from tests.optax_steps import compare, tree


def test_global_norm_fires_on_optax_and_matches():
    grads = tree(3)
    fused = jgsess.jit(optax.global_norm)
    report = fused.report(grads)
    assert report.fusions["global_norm"] == 1
    (choice,) = report.kernels
    assert choice.impl == "kernel"
    (node,) = nodes(report.session.graph, "global_norm")
    assert node.params["workspace"] == (0, 40)  # 5 tensors, one chunk each, 8 bytes
    assert_trees_close(fused(grads), jax.jit(optax.global_norm)(grads), rtol=2e-6)


def test_near_misses_do_not_fire():
    def tree_of_sums(t):  # a sum of squares, but summed as a tree, not a left-to-right chain
        a, b, c, d = (jnp.sum(jnp.square(x)) for x in jax.tree.leaves(t)[:4])
        return jnp.sqrt((a + b) + (c + d))

    def sum_of_abs(t):  # not squares
        return jnp.sqrt(sum(jnp.sum(jnp.abs(x)) for x in jax.tree.leaves(t)))

    def partial_axes(t):  # a norm per row, not of the whole tensor
        return jnp.sqrt(jnp.sum(jnp.square(t["w1"]), axis=0))

    for fn in (tree_of_sums, sum_of_abs, partial_axes):
        fused = jgsess.jit(fn)
        assert fused.report(tree(3)).fusions["global_norm"] == 0, fn.__name__
        assert_trees_close(fused(tree(3)), jax.jit(fn)(tree(3)), rtol=1e-6)


def test_half_precision_gradients_keep_xla_s_norm():
    grads = jax.tree.map(lambda x: x.astype(jnp.bfloat16), tree(3))
    assert jgsess.jit(optax.global_norm).report(grads).fusions["global_norm"] == 0


@pytest.mark.parametrize("max_norm", [1.0, 0.05, 1e3])
def test_clip_then_adamw_is_a_norm_call_and_one_fused_update(max_norm):
    opt = optax.chain(optax.clip_by_global_norm(max_norm), optax.adamw(1e-3))
    report = compare(opt)  # numbers equal to optax under jax.jit, step after step
    assert [k.kernel for k in report.kernels] == ["global_norm", "adamw"]
    (node,) = nodes(report.session.graph, "adamw")
    assert node.params["flags"] == adamw.OPTAX_ADAMW | adamw.Flag.CLIP  # the clip folded in
    assert count(report.session.graph, "select_n") == 1  # the step count's, no per-leaf select


def test_the_arena_is_shared_by_two_norm_calls():
    def two_norms(a, b):
        return optax.global_norm(a), optax.global_norm(b)

    a, b = tree(1), {k: v * 2 for k, v in tree(2).items()}
    fused = jgsess.jit(two_norms)
    report = fused.report(a, b)
    workspaces = [n.params["workspace"] for n in nodes(report.session.graph, "global_norm")]
    assert workspaces == [(0, 40)] * 2  # lifetimes never overlap
    assert_trees_close(fused(a, b), jax.jit(two_norms)(a, b), rtol=2e-6)
    text = fused.lower(a, b).as_text()
    assert text.count("stablehlo.custom_call @jgsess_global_norm") == 2
    assert text.count("tensor<64xui8>") >= 1  # one arena of 64 bytes (40, aligned), threaded


def test_norm_under_grad_and_vmap():
    def loss(w):
        return optax.global_norm({"a": w, "b": w * 2, "c": jnp.sin(w), "d": w**2})

    w = rand((300,))
    fused = jgsess.jit(loss)
    assert_trees_close(jax.grad(fused)(w), jax.grad(loss)(w), rtol=1e-5)
    ws = jnp.stack([w, -w, w * 3])
    assert_trees_close(jax.vmap(fused)(ws), jax.vmap(loss)(ws), rtol=2e-6)


def test_a_norm_over_thousands_of_leaves_fires():
    """Python's `sum` over 1,500 leaves is a chain of 1,500 additions: matched in a loop, not
    by recursion (which ran out of stack and fell back)."""
    grads = [jnp.full((3,), 0.5 + i * 1e-3, jnp.float32) for i in range(1500)]
    fused = jgsess.jit(optax.global_norm)
    assert fused.report(grads).fusions["global_norm"] == 1
    assert_trees_close(fused(grads), jax.jit(optax.global_norm)(grads), rtol=2e-6)


def test_weakly_typed_leaves_fire():
    # `jnp.full` of a Python float is weakly typed: a convert to f32 between square and sum
    grads = [jnp.full((3, 4), 0.5 + i, None if i % 2 else jnp.float32) for i in range(4)]
    fused = jgsess.jit(optax.global_norm)
    assert fused.report(grads).fusions["global_norm"] == 1
    assert_trees_close(fused(grads), jax.jit(optax.global_norm)(grads), rtol=2e-6)
