"""Unmodified optax train-step updates on a parameter tree of odd shapes, for fusion tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jgsess
from jgsess import platforms
from tests.helpers import assert_trees_close

SHAPES = {"w1": (13, 7), "b1": (7,), "w2": (7, 3, 5), "b2": (1,), "scale": (1023,)}


def tree(seed: int, scale: float = 1.0, shapes=SHAPES):
    key = jax.random.PRNGKey(seed)
    return {
        name: scale * jax.random.normal(jax.random.fold_in(key, i), shape)
        for i, (name, shape) in enumerate(sorted(shapes.items()))
    }


def update_step(opt):
    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


def compare(opt, steps: int = 3, donate: bool = True, params=None, rtol=2e-6, atol=1e-7):
    """Runs `steps` updates with jax.jit and jgsess.jit; returns jgsess's report."""
    params = tree(0) if params is None else params
    state = opt.init(params)
    step = update_step(opt)
    donate_argnums = (0, 1) if donate else None
    fused = jgsess.jit(step, donate_argnums=donate_argnums)
    plain = jax.jit(step)
    report = fused.report(params, state, tree(1, 0.1, {k: v.shape for k, v in params.items()}))
    p1, s1 = params, state
    p2, s2 = jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, state)
    for i in range(steps):
        grads = tree(10 + i, 0.1, {k: v.shape for k, v in params.items()})
        p1, s1 = plain(p1, s1, grads)
        p2, s2 = fused(p2, s2, grads)
        assert_trees_close((p2, s2), (p1, s1), rtol=rtol, atol=atol)
    return report


def run_steps(opt, steps=3, dtype=jnp.float32, **options):
    """jgsess.jit's and jax.jit's steps side by side on parameters and gradients of `dtype`:
    their results after each step, and jgsess's report and compiled text."""
    params = jax.tree.map(lambda x: x.astype(dtype), tree(0))
    step = update_step(opt)
    fused = jgsess.jit(step, donate_argnums=(0, 1), **options)
    plain = jax.jit(step, **options)
    state = opt.init(params)
    grads = [jax.tree.map(lambda x: x.astype(dtype), tree(10 + i, 0.1)) for i in range(steps)]
    report = fused.report(params, state, grads[0])
    text = fused.lower(params, state, grads[0]).compile().as_text()
    ours = theirs = (params, state)
    pairs = []
    for g in grads:
        theirs = plain(*theirs, g)
        ours = fused(*jax.tree.map(jnp.copy, ours), g)
        pairs.append((ours, theirs))
    return report, text, pairs


def narrow_fused(
    report, kernel: str, count: int, on_the_cpu: bool = True, reason: str | None = "rounds unlike"
) -> bool:
    """Whether the narrow (bf16, f16) updates of `report` were fused, checked against the
    platform the programs default to. On the CPU, `on_the_cpu` says whether XLA's code rounds
    the update as the kernel's narrow form does (the probes are tested in test_fuse_adamw and
    test_widen_narrow_products): all `count` updates fuse, or none. Elsewhere the fusion's probe
    decides on the device (on a faked GPU, with no device to ask, it finds no match), and where
    none fused the report names the probe's `reason` (None: a rewrite's probe before the
    fusion, which leaves no pattern to report)."""
    fused = report.fusions[kernel]
    if platforms.program_platform() == "cpu":
        assert fused == (count if on_the_cpu else 0)
    else:
        assert fused in (0, count)
        assert fused or reason is None or reason in str(report)
    return fused == count


def assert_bit_equal(pairs):
    def bits(x):
        return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    for ours, theirs in pairs:
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
            np.testing.assert_array_equal(bits(a), bits(b))


def assert_within_ulp(pairs, ulps: int = 1):
    """Each float leaf of ours within `ulps` units in the last place of theirs, in its dtype
    (an update whose f32 multiply-adds XLA contracts where the kernel rounds twice)."""
    for ours, theirs in pairs:
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
            if not jnp.issubdtype(a.dtype, jnp.floating):
                np.testing.assert_array_equal(a, b)
                continue
            a32, b32 = (np.asarray(x, np.float32) for x in (a, b))
            # the spacing of the dtype at the larger magnitude
            big = np.maximum(np.abs(a32), np.abs(b32)).astype(a.dtype)
            spacing = np.asarray(np.spacing(big), np.float32)
            assert np.all(np.abs(a32 - b32) <= ulps * spacing), np.max(np.abs(a32 - b32) / spacing)
