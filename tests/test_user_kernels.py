"""A user's own kernel, registered from outside the package (jgsess.register_replacement): the
example's RMSNorm (examples/rmsnorm/), built here against jax's FFI headers, in code written as
users write it: where it fires, where it must not, its numbers, under grad, vmap, scan, nested
jits, jax.export and 4 forced CPU devices, and the registration errors."""

import contextlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jgsess

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rmsnorm"
RTOL, ATOL = 2e-5, 2e-5  # the kernel sums a row in another order than XLA's code


@pytest.fixture(scope="module")
def rmsnorm(tmp_path_factory):
    """The example's module, its kernels built into a temporary folder and loaded."""
    spec = importlib.util.spec_from_file_location("rmsnorm_example", EXAMPLE / "rmsnorm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.load(str(tmp_path_factory.mktemp("rmsnorm")))
    return module


@pytest.fixture
def registered(rmsnorm, monkeypatch):
    """Every form registered for the test alone; the kernels taken wherever they agree with the
    program's code (JGSESS_KERNELS=on: no timing decides in a test)."""
    monkeypatch.setenv("JGSESS_KERNELS", "on")
    with contextlib.ExitStack() as stack:
        for registration in rmsnorm.register():
            stack.enter_context(registration)
        yield rmsnorm


def operands(rows=37, d=67, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, d)).astype(np.float32)
    scale = (rng.standard_normal(d) * 0.5 + 1.0).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(scale)


def custom_calls(fn, *args) -> list[str]:
    """The example's FFI targets that `fn`'s compiled program calls."""
    text = fn.lower(*args).as_text()
    return [t for t in ("rms_norm_dx", "rms_norm") if f"@{t}(" in text]


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("form", ["linen", "nnx", "jnp"])
def test_each_form_fires_and_matches_jax_jit(registered, form):
    fn = registered.FORMS[form]
    x, scale = operands()

    def model(x, scale):
        return jnp.tanh(fn(x, scale, 1e-6)) * 3.0

    fused = jgsess.jit(model)
    assert fused.report(x, scale).fusions == {f"rms_norm_{form}": 1}
    assert custom_calls(fused, x, scale) == ["rms_norm"]
    close(fused(x, scale), jax.jit(model)(x, scale))


def test_the_epsilon_is_the_programs_own(registered):
    x, scale = operands()
    for eps in (1e-5, 0.25):
        fused = jgsess.jit(lambda x, s, eps=eps: registered.jnp_rms_norm(x, s, eps))
        assert custom_calls(fused, x, scale) == ["rms_norm"]
        close(fused(x, scale), registered.jnp_rms_norm(x, scale, eps))


def near_misses(m):
    def other_axis(x, s):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=0, keepdims=True) + 1e-6) * s[None, :]

    def other_order(x, s):  # (x * r) * s of linen's spelling is jnp's; x * (s * r) is neither
        return x * (s * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6))

    def traced_eps(x, s):
        return m.jnp_rms_norm(x, s, jnp.float32(1e-6) * jnp.sum(s) / jnp.sum(s))

    def mean_of_abs(x, s):
        return x * jax.lax.rsqrt(jnp.mean(jnp.abs(x), axis=-1, keepdims=True) + 1e-6) * s

    return [other_axis, other_order, traced_eps, mean_of_abs]


@pytest.mark.parametrize("which", range(4))
def test_near_misses_keep_the_programs_code(registered, which):
    fn = near_misses(registered)[which]
    x, scale = operands(rows=67)
    fused = jgsess.jit(fn)
    report = fused.report(x, scale)
    assert not [k for k in report.fusions if k.startswith("rms")], report.fusions
    assert custom_calls(fused, x, scale) == []
    assert set(report.registered.values()) == {"registered, no match"}
    np.testing.assert_array_equal(fused(x, scale), jax.jit(fn)(x, scale))


def flax_mlp(width=48):
    import flax.linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(2):
                x = nn.relu(nn.RMSNorm()(nn.Dense(width)(x)))
            return nn.Dense(3)(x)

    return MLP()


def test_a_flax_train_step_takes_the_forward_and_backward_kernels(registered):
    import optax

    model = flax_mlp()
    x, _ = operands(rows=19, d=11)
    y = jnp.ones((19, 3))
    params = model.init(jax.random.key(0), x)
    tx = optax.adamw(1e-3)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    fused = jgsess.jit(step)
    state = tx.init(params)
    report = fused.report(params, state, x, y)
    assert report.fusions["rms_norm_linen"] == 2 and report.fusions["rms_norm_dx_linen"] == 2
    assert report.registered["rms_norm_linen"] == "fused 2 -> rms_norm"
    assert report.registered["rms_norm_nnx"] == "registered, no match"
    assert custom_calls(fused, params, state, x, y) == ["rms_norm_dx", "rms_norm"]
    *_, loss, grads = fused(params, state, x, y)
    *_, want_loss, want_grads = jax.jit(step)(params, state, x, y)
    close(loss, want_loss)
    jax.tree.map(close, grads, want_grads)


def test_under_grad_vmap_and_the_users_jit(registered):
    x, scale = operands()
    fn = jgsess.jit(lambda x, s: registered.jnp_rms_norm(x, s, 1e-6))

    def loss(x, s):
        return jnp.sum(jnp.sin(fn(x, s)))

    def want_loss(x, s):
        return jnp.sum(jnp.sin(registered.jnp_rms_norm(x, s, 1e-6)))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))
    assert "rms_norm" in custom_calls(grads, x, scale)  # the primal runs the kernel
    jax.tree.map(close, grads(x, scale), jax.grad(want_loss, argnums=(0, 1))(x, scale))
    batched = jnp.stack([x, x * 2.0 + 1.0])
    want = jax.vmap(lambda x: registered.jnp_rms_norm(x, scale, 1e-6))(batched)
    close(jax.vmap(fn, (0, None))(batched, scale), want)
    nested = jax.jit(lambda x, s: fn(x, s) * 2.0)
    assert custom_calls(nested, x, scale) == ["rms_norm"]
    close(nested(x, scale), registered.jnp_rms_norm(x, scale, 1e-6) * 2.0)


def test_inside_scan_and_the_programs_vmap(registered):
    x, scale = operands(rows=8, d=33)
    xs = jnp.stack([x, x + 1.0, x * 0.5])

    def body(carry, x):
        y = registered.jnp_rms_norm(x + carry, scale, 1e-6)
        return y.mean(axis=0), y

    def scanned(xs):
        return jax.lax.scan(body, jnp.zeros(33), xs)

    def vmapped(xs):
        return jax.vmap(lambda x: registered.jnp_rms_norm(x, scale, 1e-6))(xs)

    fused = jgsess.jit(scanned)
    assert custom_calls(fused, xs) == ["rms_norm"]
    jax.tree.map(close, fused(xs), jax.jit(scanned)(xs))
    # under the program's own vmap the scale reaches the code broadcast to (1, 33): the search
    # function matches, the example's extra_check declines (its kernel takes one scale per row)
    fused = jgsess.jit(vmapped)
    report = fused.report(xs)
    assert ("fuse-registered", "rms_norm_jnp", "its extra_check declined the match") in (
        report.session.record.declined
    )
    assert custom_calls(fused, xs) == []
    np.testing.assert_array_equal(fused(xs), jax.jit(vmapped)(xs))


def test_export_carries_the_search_functions_code(registered):
    x, scale = operands()
    fused = jgsess.jit(lambda x, s: registered.jnp_rms_norm(x, s, 1e-6))
    exported = jax.export.export(fused)(x, scale)
    assert "@rms_norm(" not in exported.mlir_module()
    close(exported.call(x, scale), registered.jnp_rms_norm(x, scale, 1e-6))


def test_a_kernel_that_disagrees_is_not_taken(rmsnorm, monkeypatch):
    """The dx kernel registered for the forward's code (declared results alike, numbers not):
    selection finds it off and keeps the program's code."""
    monkeypatch.setenv("JGSESS_KERNELS", "on")
    dx = jgsess.Kernel("rms_norm_dx")
    x, scale = operands()

    def forward_times_x(x, scale, dy, eps):
        return rmsnorm.jnp_rms_norm(x, scale, eps) * dy

    with jgsess.register_replacement(forward_times_x, dx, (x, scale, x, 1e-6), attrs=("eps",)):
        fused = jgsess.jit(lambda x, s: forward_times_x(x, s, x + 1.0, 1e-6))
        report = fused.report(x, scale)
        (choice,) = report.kernels
        assert choice.impl == "xla" and "differs from its reference" in choice.reason
        assert custom_calls(fused, x, scale) == []


def test_a_kernel_registered_again_under_a_name_is_checked_again(rmsnorm, monkeypatch):
    """What one registration's kernel showed is not taken for another's of the same name: the
    dx kernel registered for the forward's code fails there (it takes three operands), is
    declined with a warning, and the forward kernel is taken again after it."""
    monkeypatch.setenv("JGSESS_KERNELS", "on")
    monkeypatch.setenv("JGSESS_STRICT", "0")
    x, scale = operands()

    def model(x, s):
        return rmsnorm.jnp_rms_norm(x, s, 1e-6)

    example = (x, scale, 1e-6)
    for target, taken in (("rms_norm", "kernel"), ("rms_norm_dx", "xla"), ("rms_norm", "kernel")):
        kernel = jgsess.Kernel(target)
        with jgsess.register_replacement(model_eps, kernel, example, attrs=("eps",), name="same"):
            failing = pytest.warns(jgsess.JgsessFallbackWarning, match="running the kernel same")
            with failing if taken == "xla" else contextlib.nullcontext():
                (choice,) = jgsess.jit(model).report(x, scale).kernels
            assert choice.impl == taken, (target, choice.reason)


def model_eps(x, scale, eps):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * scale


def test_measured_against_xla_and_cached(registered, tuning, monkeypatch):
    monkeypatch.delenv("JGSESS_KERNELS")
    x, scale = operands(rows=256, d=256)
    fused = jgsess.jit(lambda x, s: registered.jnp_rms_norm(x, s, 1e-6))
    (choice,) = fused.report(x, scale).kernels
    assert choice.reason.startswith("measured: kernel"), choice.reason
    assert "rms_norm_jnp" in tuning.read_text()


def test_a_registration_is_scoped(rmsnorm, monkeypatch):
    monkeypatch.setenv("JGSESS_KERNELS", "on")
    x, scale = operands()

    def model(x, s):
        return rmsnorm.jnp_rms_norm(x, s, 1e-6)

    (registration,) = rmsnorm.register(("jnp",), backward=False)
    with registration:
        assert registration.active
        assert custom_calls(jgsess.jit(model), x, scale) == ["rms_norm"]
    assert not registration.active and "removed" in repr(registration)
    assert custom_calls(jgsess.jit(model), x, scale) == []
    registration.remove()  # again: nothing


def test_registration_errors_say_what_is_wrong(rmsnorm):
    x, scale = operands()
    fn = rmsnorm.jnp_rms_norm
    example = (x, scale, 1e-6)
    kernel = jgsess.Kernel("rms_norm")
    with pytest.raises(ValueError, match="no FFI target 'no_such_kernel' is registered for cpu"):
        jgsess.register_replacement(fn, jgsess.Kernel("no_such_kernel"), example, attrs=("eps",))
    with pytest.raises(ValueError, match="unknown platforms \\['tpu'\\]"):
        jgsess.register_replacement(fn, jgsess.Kernel("rms_norm", platforms=("tpu",)), example)

    def declared(x, s, eps):
        return jax.ShapeDtypeStruct(s.shape, s.dtype)

    wrong = jgsess.Kernel("rms_norm", results=declared)
    with pytest.raises(ValueError, match="disagree with the results kernel 'rms_norm' declares"):
        jgsess.register_replacement(fn, wrong, example, attrs=("eps",))
    with pytest.raises(ValueError, match="does not trace on its example"):
        jgsess.register_replacement(lambda x, s, eps: x @ s @ s, kernel, example, attrs=("eps",))
    with pytest.raises(ValueError, match="does not find itself in its own example"):
        jgsess.register_replacement(
            lambda x, s, eps: x * 2.0 + eps, kernel, example, attrs=("eps",)
        )
    with pytest.raises(ValueError, match="attrs \\['epsilon'\\] are not arguments"):
        jgsess.register_replacement(fn, kernel, example, attrs=("epsilon",))
    with pytest.raises(ValueError, match="takes 3 arguments"):
        jgsess.register_replacement(fn, kernel, (x, scale))
    with pytest.raises(ValueError, match="must be a Python number"):
        jgsess.register_replacement(fn, kernel, (x, scale, x), attrs=("eps",))
    with jgsess.register_replacement(fn, kernel, example, attrs=("eps",)):
        again = lambda x, s, eps: rmsnorm.jnp_rms_norm(x, s, eps)  # noqa: E731 - the same code
        with pytest.raises(ValueError, match="claims the code registration 'rms_norm' claims"):
            jgsess.register_replacement(again, kernel, example, attrs=("eps",), name="again")
        with pytest.raises(ValueError, match="a registration named 'rms_norm' is in effect"):
            jgsess.register_replacement(rmsnorm.FORMS["linen"], kernel, example, attrs=("eps",))


FOUR_DEVICES = """
import contextlib, importlib.util, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jgsess
spec = importlib.util.spec_from_file_location("rmsnorm_example", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
m.load(sys.argv[2])
assert jax.device_count() == 4
mesh = Mesh(np.array(jax.devices()), ("data",))
rng = np.random.default_rng(0)
x = jax.device_put(rng.standard_normal((64, 96), np.float32), NamedSharding(mesh, P("data")))
s = jax.device_put(rng.standard_normal(96).astype(np.float32), NamedSharding(mesh, P()))
with contextlib.ExitStack() as stack:
    for r in m.register(("jnp",)):
        stack.enter_context(r)
    def loss(x, s):
        return jnp.sum(jnp.tanh(m.jnp_rms_norm(x, s, 1e-6)))
    step = jax.value_and_grad(loss, argnums=(0, 1))
    fused = jgsess.jit(step)
    text = fused.lower(x, s).compile().as_text()
    assert 'target="rms_norm"' in text and 'target="rms_norm_dx"' in text, "no kernel in it"
    (value, grads), (want, want_grads) = fused(x, s), jax.jit(step)(x, s)
    np.testing.assert_allclose(value, want, rtol=2e-5)
    for a, b in zip(grads, want_grads):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    assert grads[0].sharding.spec == P("data"), grads[0].sharding
print("ok")
"""


def test_four_devices_sharded_rows(rmsnorm, tmp_path):
    """Rows split over 4 forced CPU devices: each device runs both kernels on its rows (their
    sharding rule keeps a row's features whole), and the numbers are jax.jit's."""
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "JGSESS_KERNELS": "on",
    }
    done = subprocess.run(
        [sys.executable, "-c", FOUR_DEVICES, str(EXAMPLE / "rmsnorm.py"), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-4000:]
