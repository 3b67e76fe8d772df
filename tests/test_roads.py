"""jgsess.jit's two roads into jax.jit: the hook on jax's private step and its probe, the
public road, simulated jax releases that change the step, settings and threads."""

import json
import os
import subprocess
import sys
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import optax
import pytest

import jgsess
from jgsess import _body, _compat, _replay
from jgsess._compat import jit_hook
from tests.helpers import assert_trees_close, rand
from tests.optax_steps import tree, update_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# scenario -> (the road jgsess.jit takes, what its warning says of why)
RELEASES = {
    "fifth-argument": ("Body", None),
    "renamed": ("Replay", "jax._src.pjit._infer_params is not in jax"),
    "three-values": ("Replay", "returned another structure"),
    "not-called": ("Replay", "jax.jit's call does not go through jax._src.pjit._infer_params"),
}


def _under(scenario: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JGSESS_")}
    env["JGSESS_AUTOTUNE"] = "0"
    run = subprocess.run(
        [sys.executable, "-m", "tests.future_jax", scenario],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scenario", RELEASES)
def test_a_jax_release_that_changes_the_step_degrades_jgsess_never_the_user(scenario):
    """Each simulated release: `import jgsess`, plain jax.jit and optax's init work; an optax
    AdamW step under jgsess.jit gives jax.jit's numbers and still runs the adamw kernel; where
    the hook cannot be used, one warning names the public road and why."""
    road, why = RELEASES[scenario]
    seen = _under(scenario)
    assert seen["import"] == "ok"
    assert seen["plain jax.jit"] == 2.0
    assert seen["optax init"] == "ok"
    assert seen["jgsess.jit step"] == "jax.jit's numbers"
    assert seen["adamw kernel"] is True
    assert seen["road"] == road
    if why is None:
        assert seen["warnings"] == []
    else:
        (warning,) = seen["warnings"]
        assert warning.startswith("JgsessFallbackWarning: jgsess.jit takes its public road: ")
        assert why in warning


def test_where_neither_road_works_jgsess_jit_is_jax_jit_with_one_warning():
    seen = _under("no-public-road")
    assert seen["import"] == "ok" and seen["plain jax.jit"] == 2.0
    assert seen["jgsess.jit step"] == "jax.jit's numbers"
    assert seen["road"] == "Plain" and seen["adamw kernel"] is False
    (warning,) = seen["warnings"]
    assert "jgsess.jit is plain jax.jit" in warning and "jaxpr_as_fun" in warning


def test_the_hook_is_in_place_here_and_its_probe_passes(monkeypatch):
    """The positive control of the simulations: this jax's step is hooked, jgsess.jit takes
    the hook, and the probe finds both of jax.jit's paths to the step."""
    monkeypatch.delenv("JGSESS_ROAD", raising=False)
    assert _body.ROADS.body_type() is _body.Body
    assert jit_hook._Probe.check() is None
    assert _replay.check() is None


class _Fake:
    """A hooked body type (`jit_hook.HookedBody`) that records what the hook did."""

    def __init__(self):
        self.why: list[str] = []
        self.rewrites = 0
        self._plain = jax.jit(lambda x: x + 1.0)

    def plain(self):
        return self._plain

    def tracing(self):
        return threading.Lock()

    def rewrite(self, closed, donated, traced, outermost):
        self.rewrites += 1
        return closed

    def unexpected(self, why):
        self.why.append(why)


@pytest.mark.parametrize("returned", ["three values", "no params", "no jaxpr"])
def test_an_unexpected_structure_in_the_hooks_branch_returns_jaxs_own_result(returned):
    """After the probe, jax's step returning something else gives jax's result unchanged and
    the body's `unexpected` the reason: never an exception plain jax.jit would not raise."""
    body = _Fake()
    results = {
        "three values": ("p", [], None),
        "no params": (object(), []),
        "no jaxpr": (type("P", (), {"params": {}})(), []),
    }

    def step(*args, **kwargs):
        return results[returned]

    got = jit_hook._rewritten(step, (body, None, (1.0,), {}), {})
    assert got is results[returned]
    assert len(body.why) == 1 and body.rewrites == 0


def test_the_public_road_gives_jax_jits_numbers_and_the_kernel(monkeypatch):
    monkeypatch.setenv("JGSESS_ROAD", "public")
    opt = optax.adamw(1e-3, weight_decay=1e-2)
    params = tree(0)
    state = opt.init(params)
    step = update_step(opt)
    fused = jgsess.jit(step, donate_argnums=(0, 1))
    assert type(fused._jgsess_body) is _body.Replay
    args = (params, state, tree(1))
    assert "jgsess_adamw" in fused.lower(*args).as_text()
    want = jax.jit(step)(*args)
    assert_trees_close(fused(*jax.tree.map(jnp.copy, args)), want, rtol=2e-6, atol=1e-7)


def test_the_public_road_lifts_tracers_the_function_closes_over(monkeypatch):
    """A jgsess.jit function inside another trace, closing over its tracers: jax's trace
    takes them as inputs the public road cannot name, so it traces again and lifts them."""
    monkeypatch.setenv("JGSESS_ROAD", "public")

    def outer(x):
        return jgsess.jit(lambda y: jnp.sum(jnp.sin(y) * x))(jnp.ones(3))

    x = rand((3,))
    assert_trees_close(jax.grad(outer)(x), jax.grad(lambda x: jnp.sum(jnp.sin(1.0) * x))(x))
    assert_trees_close(jax.jit(outer)(x), jnp.sum(jnp.sin(1.0) * x), rtol=1e-6)


def test_a_setting_changed_reaches_new_functions_and_cleared_ones(monkeypatch):
    """A JGSESS_* change takes effect for a new jgsess.jit(f) and for the next trace; a
    function already compiled keeps its program until `clear_cache()`."""
    opt = optax.adamw(1e-3)
    step = update_step(opt)
    params = tree(0)
    args = (params, opt.init(params), tree(1))
    first = jgsess.jit(step)
    assert "jgsess_adamw" in first.lower(*args).as_text()
    monkeypatch.setenv("JGSESS_KERNELS", "off")
    assert "jgsess_adamw" not in jgsess.jit(step).lower(*args).as_text()
    first.clear_cache()
    assert "jgsess_adamw" not in first.lower(*args).as_text()
    monkeypatch.delenv("JGSESS_KERNELS")
    assert "jgsess_adamw" in jgsess.jit(step).lower(*args).as_text()


@pytest.mark.parametrize("road", ["hook", "public"])
def test_two_threads_tracing_one_new_signature_run_the_pipeline_once(monkeypatch, road):
    monkeypatch.setenv("JGSESS_ROAD", road)
    runs = []
    compile_jaxpr = _body.compile_jaxpr

    def counted(*args, **kwargs):
        runs.append(threading.get_ident())
        return compile_jaxpr(*args, **kwargs)

    monkeypatch.setattr(_body, "compile_jaxpr", counted)
    both = threading.Barrier(2)

    def f(x):
        time.sleep(0.2)  # while tracing: the other thread arrives meanwhile
        return x * 2.0

    fused = jgsess.jit(f)
    results = []

    def call():
        both.wait()
        results.append(fused(jnp.arange(3.0)))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and len(runs) == 1
    assert_trees_close(results[0], jnp.arange(3.0) * 2.0)


def test_the_collector_stays_paused_until_the_last_pipeline_ends():
    import gc

    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def other():
        with _body.collector_paused():
            inside.set()
            leave.wait()

    thread = threading.Thread(target=other)
    with _body.collector_paused():
        thread.start()
        inside.wait()
    assert not gc.isenabled()  # the other thread's pipeline still runs
    leave.set()
    thread.join()
    assert gc.isenabled()


def test_strict_mode_raises_where_the_road_changes(monkeypatch):
    """JGSESS_STRICT=1 (the tests') makes a road change an error, so CI notices it."""
    monkeypatch.delenv("JGSESS_ROAD", raising=False)
    roads = _body.Roads()
    roads._hook[:] = ["a simulated change"]
    with pytest.raises(RuntimeError, match="public road: a simulated change"):
        roads.body_type()
    monkeypatch.delenv("JGSESS_STRICT")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert roads.body_type() is _body.Replay
        assert roads.body_type() is _body.Replay
    assert len(caught) == 1 and issubclass(caught[0].category, jgsess.JgsessFallbackWarning)


@pytest.mark.parametrize(
    "missing",
    [
        "partial_eval.trace_to_jaxpr_dynamic",
        "core.trace_ctx",
        "traceback_util.register_exclusion",
        "dispatch.prim_requires_devices_during_lowering",
        "lib.xla_client",
    ],
)
def test_each_private_name_has_a_fallback(monkeypatch, missing):
    """A jax release without one of the private names _compat uses: its use degrades (a
    program traced by jax.make_jaxpr, planned as top-level, frames shown, the reference
    lowered over several devices), never raises."""
    private = _compat._private

    def without(module, name):
        if f"{module.rpartition('.')[2]}.{name}" == missing:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return private(module, name)

    monkeypatch.setattr(_compat, "_private", without)
    avals = [_compat.ShapedArray((3,), jnp.float32)]
    closed = _compat.trace_closed_jaxpr(lambda x: [x * 2.0], avals)
    assert [e.primitive.name for e in closed.eqns] == ["mul"]
    inside = []
    jax.make_jaxpr(lambda x: inside.append(_compat.outside_any_trace()) or x)(1.0)
    assert inside == [missing == "core.trace_ctx"]
    assert _compat.hide_from_tracebacks("/nowhere/jgsess-test.py") is (
        missing != "traceback_util.register_exclusion"
    )
    registered = _compat.require_devices_when_lowering(_compat.Primitive("jgsess_test_devices"))
    assert registered is (missing != "dispatch.prim_requires_devices_during_lowering")
    listed = _compat.ffi_targets("cpu")
    assert listed is None if missing == "lib.xla_client" else "jgsess_adamw" in listed
