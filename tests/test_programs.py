"""Programs through every pass (tests run strict: a pipeline failure raises): complex numbers,
PRNG keys, symbolic shapes, closures over outer tracers, effects; jax.export."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import export
from jax.experimental import io_callback

import jgsess
from jgsess.kernels import _native
from tests.helpers import assert_trees_close, rand
from tests.optax_steps import tree, update_step


def complex_matrix(shape, seed=0):
    return (rand(shape, seed) + 1j * rand(shape, seed + 1)).astype(jnp.complex64)


def same_as_jax_jit(fun, *args, rtol=1e-5, atol=1e-6):
    assert_trees_close(jgsess.jit(fun)(*args), jax.jit(fun)(*args), rtol=rtol, atol=atol)


def test_fft():
    same_as_jax_jit(lambda x: jnp.fft.ifft(jnp.fft.fft(x) * 2.0).real, rand((17,)))
    same_as_jax_jit(lambda x: jnp.fft.rfft2(x) * -1.0, rand((6, 5)))


def test_complex_matmul_and_literals():
    a = complex_matrix((3, 5))
    same_as_jax_jit(lambda a: a @ a.conj().T, a)
    # complex literals equal to 1, -1 and 0 are not real ones: nothing is canonicalized away
    same_as_jax_jit(lambda a: a * (1 + 0j) + (a * (-1 + 0j)) * (-1 + 0j) + 0j, a)
    inf = a.at[0, 0].set(complex(np.inf, 1.0))
    same_as_jax_jit(lambda a: a * (1 + 0j), inf)


def test_complex_grads():
    a = complex_matrix((4, 3), 2)

    def loss(z):
        return jnp.sum(jnp.abs(z @ z.T) ** 2).real

    same_as_jax_jit(jax.grad(loss), a, rtol=1e-4)
    same_as_jax_jit(jax.grad(lambda x: jnp.abs(jnp.fft.fft(x)).sum()), rand((9,)), rtol=1e-4)


def test_complex_parameters_under_adam():
    params = {"w": complex_matrix((5, 3)), "b": complex_matrix((3,), 4)}
    opt = optax.adam(1e-2)
    same_as_jax_jit(update_step(opt), params, opt.init(params), jax.tree.map(jnp.conj, params))


def test_prng_keys_in_and_out():
    key = jax.random.key(0)
    same_as_jax_jit(lambda k: jax.random.normal(jax.random.fold_in(k, 3), (5,)), key)
    same_as_jax_jit(lambda k: jax.random.split(k, 3), key)
    same_as_jax_jit(lambda k: jax.random.uniform(k, (2, 3)), jax.random.PRNGKey(1))


def test_closures_over_outer_tracers():
    x = rand((6,))

    def outer(y):
        return jgsess.jit(lambda x: x * y + jnp.sin(y))(x).sum()

    def plain(y):
        return jax.jit(lambda x: x * y + jnp.sin(y))(x).sum()

    assert_trees_close(jax.grad(outer)(2.0), jax.grad(plain)(2.0), rtol=1e-5)
    ys = rand((3,), 1)
    assert_trees_close(jax.vmap(outer)(ys), jax.vmap(plain)(ys), rtol=1e-5)
    assert_trees_close(jax.jit(outer)(0.5), plain(0.5), rtol=1e-5)


def test_effects_and_tokens(capfd):
    def fun(x):
        jax.debug.print("total {t}", t=x.sum())
        y = io_callback(
            lambda v: np.asarray(v) + 1, jax.ShapeDtypeStruct(x.shape, x.dtype), x, ordered=True
        )
        z = jax.pure_callback(
            lambda v: np.asarray(v) * 3, jax.ShapeDtypeStruct(x.shape, x.dtype), x
        )
        return y * 2 + z

    x = jnp.arange(4.0)
    same_as_jax_jit(fun, x)
    jax.effects_barrier()
    assert capfd.readouterr().out.count("total 6") == 2  # once each, never duplicated


@pytest.mark.parametrize("effects", [True, False])
def test_an_emission_failure_half_way_falls_back_cleanly(monkeypatch, capfd, effects):
    """Emission binds the whole program, then fails: jgsess falls back to jax.jit's program,
    each effect runs once, and the numbers are jax.jit's (pure leftovers are dead code)."""
    from jgsess.emit import interpreter

    def emit_then_fail(graph, args):
        interpreter_emit(graph, args)
        raise RuntimeError("emission failed half way")

    interpreter_emit = interpreter.emit
    monkeypatch.setattr(interpreter, "emit", emit_then_fail)
    monkeypatch.setenv("JGSESS_STRICT", "0")
    monkeypatch.setenv("JGSESS_KERNELS", "on")

    def fun(x):
        if effects:
            jax.debug.print("total {t}", t=x.sum())
        return jnp.sqrt(jnp.sum(jnp.square(x * -1.0)))  # a kernel: the graph is emitted

    x = jnp.arange(4.0)
    with pytest.warns(jgsess.JgsessFallbackWarning, match="emission failed half way"):
        got = jgsess.jit(fun)(x)
    assert_trees_close(got, jax.jit(fun)(x))
    jax.effects_barrier()
    assert capfd.readouterr().out.count("total 6") == (2 if effects else 0)


def test_symbolic_shapes_export_and_run():
    f = jgsess.jit(lambda x: jnp.sin(x) * 2 + x.shape[0])
    exported = export.export(f)(jax.ShapeDtypeStruct(export.symbolic_shape("n"), jnp.float32))
    for n in (3, 8):
        x = rand((n,))
        assert_trees_close(exported.call(x), jnp.sin(x) * 2 + n, rtol=1e-6)


def test_export_emits_the_references_and_runs_anywhere():
    opt = optax.adamw(1e-3)
    params = tree(0)
    args = (params, opt.init(params), tree(1))
    fused = jgsess.jit(update_step(opt))
    assert "jgsess_adamw" in fused.lower(*args).as_text()  # the kernel, when compiling here
    exported = export.export(fused)(*args)
    assert "custom_call" not in exported.mlir_module()  # the reference, when exporting
    assert_trees_close(exported.call(*args), jax.jit(update_step(opt))(*args))


@pytest.mark.skipif(not _native.targets(), reason="jgsess._C is not built")
def test_importing_jgsess_registers_every_ffi_target():
    # a fresh process that only imports jgsess can run a jgsess custom call it never lowered
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp
        import jgsess
        call = jax.ffi.ffi_call("jgsess_cast_all", jax.ShapeDtypeStruct((5,), jnp.bfloat16))
        print(jax.jit(call)(jnp.arange(5, dtype=jnp.float32)).tolist())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[0.0, 1.0, 2.0, 3.0, 4.0]"
