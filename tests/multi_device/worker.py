"""One process of a two-process data-parallel train step (tests/test_multi_process.py).

    python tests/multi_device/worker.py PROCESS_ID NUM_PROCESSES PORT

Each process has 2 CPU devices and joins a jax.distributed job on 127.0.0.1 with gloo
collectives; the global mesh spans all 4 devices. The step (a flax MLP, optax adamw with
clip_by_global_norm and a warmup-cosine schedule) runs under jax.jit and jgsess.jit; the process
prints `ok` and the kernels in jgsess's compiled module if both agree.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JGSESS_STRICT"] = "1"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process_id, processes, port = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(f"127.0.0.1:{port}", processes, process_id, initialization_timeout=60)

import re  # noqa: E402

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jgsess  # noqa: E402
from tests.multi_device.cases import MLP, OPT, batch, train_step  # noqa: E402


def global_array(value, sharding):
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def main():
    assert jax.device_count() == 2 * processes and jax.local_device_count() == 2
    mesh = Mesh(np.array(jax.devices()), ("data",))
    x, y = batch()
    params = MLP().init(jax.random.PRNGKey(0), x)
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    params = jax.tree.map(lambda p: global_array(p, replicated), params)
    state = jax.tree.map(lambda s: global_array(s, replicated), OPT.init(params))
    x, y = global_array(x, split), global_array(y, split)
    step = train_step(OPT)
    fused, plain = jgsess.jit(step), jax.jit(step)
    want = got = (params, state)
    for _ in range(3):
        *want, loss_want = plain(*want, x, y)
        *got, loss_got = fused(*got, x, y)
        np.testing.assert_allclose(float(loss_got), float(loss_want), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        assert b.sharding.is_equivalent_to(a.sharding, a.ndim)
        np.testing.assert_allclose(
            np.asarray(b.addressable_data(0)),
            np.asarray(a.addressable_data(0)),
            rtol=2e-6,
            atol=1e-6,
        )
    text = fused.lower(*got, x, y).compile().as_text()
    found = sorted(set(re.findall(r'custom_call_target="(jgsess_\w+)"', text)))
    print("ok", " ".join(found), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
