"""Sharded programs: jgsess keeps jax.jit's results and shardings (its kernels stay out of
programs that span several devices, which they cannot be partitioned over)."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JGSESS_STRICT"] = "1"
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jgsess

    mesh = Mesh(np.array(jax.devices()), ("d",))
    opt = optax.adamw(1e-3)
    params = {"w": jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32) / 1000, "b": jnp.ones(32)}
    layout = {"w": NamedSharding(mesh, P("d", None)), "b": NamedSharding(mesh, P())}
    params = jax.device_put(params, layout)
    state, grads = opt.init(params), jax.tree.map(lambda p: p * 0.1, params)

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    want, got = jax.jit(step)(params, state, grads), jgsess.jit(step)(params, state, grads)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (a.sharding, b.sharding)
    report = jgsess.jit(step).report(params, state, grads)
    assert report.fusions["adamw"] == 2 and {k.impl for k in report.kernels} == {"xla"}
    assert "2 devices" in report.kernels[0].reason
    print("ok")
    """
)


def test_two_devices_keep_results_and_shardings():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
