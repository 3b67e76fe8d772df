"""A CUDA backend faked on the CPU, and the representative step of every fusion, for lowering
each step for "cuda" without a GPU (tests/test_cuda_lowering.py, and tests/multi_device/cases.py
on 4 devices).

The fake is what jax reports on an NVIDIA (or AMD) machine: a device whose platform is "gpu" and
whose client's platform version names the runtime. Where the extension was built without nvcc,
the fake also lists a CUDA kernel for every target (the lowering only names the custom call) and
a build for sm_80 and sm_90.
"""

from __future__ import annotations

import re
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jgsess
from jgsess import platforms
from jgsess.kernels import _native, spec
from tests.optax_steps import tree, update_step

# a kernel's call, or (in a program XLA partitions) the custom_partitioning call around it,
# whose per-shard body XLA lowers while it compiles
CALL = re.compile(
    r"stablehlo\.custom_call @(jgsess_\w+|CustomSPMDPartitioning)\((.*?)\).*: \((.*?)\) ->"
)


def fake_device(runtime: str = "cuda 13000", capability: str = "9.0"):
    """A device as jax shows an NVIDIA GPU (`runtime` "rocm 60200": an AMD one)."""
    client = types.SimpleNamespace(platform="gpu", platform_version=runtime)
    return types.SimpleNamespace(
        platform="gpu", id=0, device_kind="faked", compute_capability=capability, client=client
    )


def fake_gpu(
    monkeypatch, runtime: str = "cuda 13000", capability="9.0", driver=13000, built=13000
) -> None:
    """Programs traced from now on default to a faked GPU with `runtime`, of compute
    `capability`, under a CUDA `driver`, jgsess's kernels linked with the CUDA runtime
    `built`."""
    device, real = fake_device(runtime, capability), platforms.default_device

    def default_device():  # the GPU, but where `jax.default_device` names another device
        return device if jax.config.jax_default_device is None else real()

    monkeypatch.setattr(platforms, "default_device", default_device)
    monkeypatch.setattr(_native, "cuda_driver_version", lambda: driver)
    build = {"sm": [80, 90], "ptx": 90, "runtime": built}
    monkeypatch.setattr(_native, "cuda_build", lambda: build)
    built = _native.targets()
    with_cuda = {t: p | {"cuda"} for t, p in built.items() if t != spec.ASYNC_HINT_TARGET}
    monkeypatch.setattr(_native, "targets", lambda: {**built, **with_cuda})


def kernel_calls(text: str) -> list[tuple[str, str]]:
    """(target, operand types) of every `jgsess_*` (or custom_partitioning) call of a lowered
    module (the async hint aside: a CPU-only no-op), in order."""
    return [
        (target, types_)
        for target, _, types_ in CALL.findall(text)
        if target != spec.ASYNC_HINT_TARGET
    ]


def lowered(fn, args, platform: str, **options) -> str:
    """`fn` on `args` under jgsess.jit, planned and lowered for `platform` ("cpu": on the CPU
    device, whatever the default device is)."""
    with jax.default_device(jax.devices("cpu")[0] if platform == "cpu" else None):
        traced = jgsess.jit(fn, **options).trace(*args)
    return traced.lower(lowering_platforms=(platform,)).as_text()


def assert_same_calls_for_cuda(monkeypatch, make) -> list[tuple[str, str]]:
    """`make()`'s (function, arguments), lowered for the CPU and, on a faked NVIDIA GPU, for
    CUDA, carry the same kernel calls on the same operands; returns them."""
    on_cpu = kernel_calls(lowered(*make(), "cpu"))
    fake_gpu(monkeypatch)  # a function of its own: jax.jit's trace cache knows no fake
    on_cuda = kernel_calls(lowered(*make(), "cuda"))
    assert on_cuda == on_cpu
    return on_cuda


# --- the representative steps: name -> (function, arguments, the kernels it lowers to) ---


def _optax(opt):
    params = tree(0)
    return update_step(opt), (params, opt.init(params), tree(1, 0.1))


class Block(nn.Module):
    """Conv + BatchNorm + ReLU, with a residual added before the ReLU where `add`."""

    add: bool = False

    @nn.compact
    def __call__(self, x):
        y = nn.BatchNorm(use_running_average=False, momentum=0.9)(nn.Conv(8, (3, 3))(x))
        return nn.relu(y + x if self.add else y)


def _block(add: bool, grad: bool):
    block = Block(add)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((4, 5, 5, 8)), jnp.float32)
    variables = block.init(jax.random.PRNGKey(0), x)

    def forward(params, stats, x):
        y, updates = block.apply(
            {"params": params, "batch_stats": stats}, x, mutable=["batch_stats"]
        )
        return jnp.sum(jnp.sin(y)), updates

    fn = jax.value_and_grad(forward, has_aux=True) if grad else forward
    return fn, (variables["params"], variables["batch_stats"], x)


def _casts():
    params = [jax.random.normal(jax.random.PRNGKey(i), (8, 8)) for i in range(8)]

    def loss(params, x):
        h = x.astype(jnp.bfloat16)
        for w in params:  # f32 master weights, bf16 compute
            h = jnp.tanh(h @ w.astype(jnp.bfloat16))
        return h.astype(jnp.float32).sum()

    return loss, (params, jnp.ones((3, 8)))


def _relus():
    params = [0.3 * jax.random.normal(jax.random.PRNGKey(i), (16, 16)) for i in range(3)]

    def loss(params, x):
        for w in params:
            x = jax.nn.relu(x @ w)
        return jnp.sum(x**2)

    return jax.grad(loss), (params, jnp.ones((40, 16)))


def steps() -> dict:
    """name -> (a zero-argument maker of (function, arguments), the kernels of its program)."""
    clip = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))
    return {
        "adamw": (lambda: _optax(optax.adamw(1e-3, weight_decay=1e-2)), {"jgsess_adamw"}),
        "adam": (lambda: _optax(optax.adam(1e-3)), {"jgsess_adamw"}),
        "momentum": (lambda: _optax(optax.sgd(0.1, momentum=0.9)), {"jgsess_momentum"}),
        "nesterov": (
            lambda: _optax(optax.sgd(0.1, momentum=0.9, nesterov=True)),
            {"jgsess_momentum"},
        ),
        "multi_steps": (lambda: _optax(optax.MultiSteps(optax.adamw(1e-3), 2)), {"jgsess_adamw"}),
        "global_norm": (lambda: _optax(clip), {"jgsess_global_norm", "jgsess_momentum"}),
        "cast_all": (_casts, {"jgsess_cast_all"}),
        "relu_mask": (_relus, {"jgsess_relu_mask", "jgsess_relu_mask_grad"}),
        "batch_norm_relu": (lambda: _block(False, False), {"jgsess_batch_norm_relu"}),
        "batch_norm_relu_grad": (
            lambda: _block(False, True),
            {"jgsess_batch_norm_relu", "jgsess_batch_norm_relu_grad"},
        ),
        "batch_norm_add_relu": (lambda: _block(True, False), {"jgsess_batch_norm_add_relu"}),
        "batch_norm_add_relu_grad": (
            lambda: _block(True, True),
            {"jgsess_batch_norm_add_relu", "jgsess_batch_norm_add_relu_grad"},
        ),
    }


# XLA's converts are as fast on the CPU: the cast_all kernel is taken on a GPU only
GPU_ONLY = {"cast_all"}
