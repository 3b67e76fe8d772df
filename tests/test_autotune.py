"""Kernel selection by measurement: decisions measured once, cached on disk, shown in the
report; the choice taken (kernel or XLA's code) gives jax.jit's numbers either way."""

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jgsess
from jgsess import autotune
from jgsess.kernels import adamw
from jgsess.platforms import Target
from tests.helpers import assert_trees_close
from tests.optax_steps import update_step
from tests.passes.test_fuse_batch_norm_relu import Block, X, linen_step


def fake_times(monkeypatch, kernel_s, xla_s, calls):
    def measure(sides, target):
        calls.append((sides.kernel, sides.xla))
        return kernel_s, xla_s

    monkeypatch.setattr(autotune, "measure", measure)


def batch_norm_fusions(report):
    return {k: v for k, v in report.fusions.items() if k.startswith("batch_norm")}


def test_measured_once_then_cached_on_disk(tuning):
    step, args = linen_step(Block(), X)
    report = jgsess.jit(step).report(*args)
    (decision,) = report.selection
    assert decision.kernel == "batch_norm_relu+batch_norm_relu_grad" and not decision.cached
    assert decision.kernel_s > 0 and decision.xla_s > 0
    fused = batch_norm_fusions(report)
    assert bool(fused) == decision.kernel_wins
    assert "measured selection" in str(report)
    stored = json.loads(tuning.read_text())
    assert stored[decision.key] == {"kernel_s": decision.kernel_s, "xla_s": decision.xla_s}
    autotune._cache = None  # a new process reads the file
    again = jgsess.jit(step).report(*args)
    assert [m.cached for m in again.selection] == [True]
    assert batch_norm_fusions(again) == fused
    assert_trees_close(jgsess.jit(step)(*args), jax.jit(step)(*args), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("kernel_s, xla_s", [(1.0, 2.0), (2.0, 1.0)])
def test_the_faster_side_is_taken_and_numbers_match(tuning, monkeypatch, kernel_s, xla_s):
    calls = []
    fake_times(monkeypatch, kernel_s, xla_s, calls)
    step, args = linen_step(Block(residual="left"), X, X * 0.5)
    compiled = jgsess.jit(step)
    report = compiled.report(*args)
    assert len(calls) == 1
    expected = {"batch_norm_add_relu": 1, "batch_norm_add_relu_grad": 1} if kernel_s < xla_s else {}
    assert batch_norm_fusions(report) == expected
    if not expected:
        assert "not taken: 1 batch_norm_add_relu fusion(s): measured" in str(report)
    assert_trees_close(compiled(*args), jax.jit(step)(*args), rtol=2e-5, atol=2e-5)


def test_clear_cache_and_the_switches(tuning, monkeypatch):
    calls = []
    fake_times(monkeypatch, 1.0, 2.0, calls)
    step, args = linen_step(Block(), X)
    jgsess.jit(step).report(*args)
    assert tuning.exists() and len(calls) == 1
    autotune.clear_cache()
    assert not tuning.exists()
    jgsess.jit(step).report(*args)
    assert len(calls) == 2
    monkeypatch.setenv("JGSESS_AUTOTUNE", "0")
    report = jgsess.jit(step).report(*args)
    assert report.selection == [] and len(calls) == 2
    monkeypatch.setenv("JGSESS_AUTOTUNE", "1")
    monkeypatch.setenv("JGSESS_AUTOTUNE_BUDGET", "0")
    autotune.clear_cache()
    add, add_args = linen_step(Block(residual="left"), X, X * 0.5)
    report = jgsess.jit(lambda a, b: (step(*a), add(*b))).report(args, add_args)
    # the first measurement always runs; past the budget the cost model's choice (the
    # kernels), and the report says so
    assert len(report.selection) == 1 and len(calls) == 3
    assert sum(batch_norm_fusions(report).values()) == 4
    (left,) = report.unmeasured
    assert left[1] == "kernel" and left[0] != report.selection[0].kernel
    assert "not measured yet" in str(report)


def test_cached_mode_uses_cached_decisions_and_never_measures(tuning, monkeypatch):
    calls = []
    fake_times(monkeypatch, 2.0, 1.0, calls)  # XLA's code measures faster
    step, args = linen_step(Block(), X)
    monkeypatch.setenv("JGSESS_AUTOTUNE", "cached")
    report = jgsess.jit(step).report(*args)  # nothing cached: the cost model, no measuring
    assert not calls and report.selection == [] and report.unmeasured == []
    assert batch_norm_fusions(report) == {"batch_norm_relu": 1, "batch_norm_relu_grad": 1}
    monkeypatch.setenv("JGSESS_AUTOTUNE", "1")
    jgsess.jit(step).report(*args)  # measured: XLA's code
    monkeypatch.setenv("JGSESS_AUTOTUNE", "cached")
    report = jgsess.jit(step).report(*args)
    assert len(calls) == 1 and [m.cached for m in report.selection] == [True]
    assert batch_norm_fusions(report) == {}


def test_the_report_of_a_compiled_step_shows_its_decisions_and_measures_nothing(
    tuning, monkeypatch
):
    calls = []
    fake_times(monkeypatch, 1.0, 2.0, calls)
    measure = autotune.measure
    monkeypatch.setattr(autotune, "measure", lambda *a: (time.sleep(0.1), measure(*a))[1])
    monkeypatch.setenv("JGSESS_AUTOTUNE_BUDGET", "0.05")  # one measurement per compilation
    relu, relu_args = linen_step(Block(), X)
    add, add_args = linen_step(Block(residual="left"), X, X * 0.5)

    def step(a, b):
        return relu(*a), add(*b)

    compiled = jgsess.jit(step)
    jax.block_until_ready(compiled(relu_args, add_args))
    assert len(calls) == 1
    report = compiled.report(relu_args, add_args)
    assert len(calls) == 1  # the program compiled with one of the two measured
    # the first compile decides both pairs: one measured, the other by the cost model
    assert sum(batch_norm_fusions(report).values()) == 4
    (left,) = report.unmeasured
    assert left[1] == "kernel" and left[0] != report.selection[0].kernel
    assert "not measured yet" in str(report)
    other = (relu_args[:2] + (X * 2,) + relu_args[3:], add_args)
    compiled.report(*other)  # other arguments, same shapes: still that program
    assert len(calls) == 1
    small = (relu_args[:2] + (X[:2],) + relu_args[3:], add_args[:2] + (X[:2], X[:2]))
    compiled.report(*small)
    assert len(calls) == 2  # new shapes, never compiled: the report measures as a call would


def test_the_budget_is_a_share_of_the_trace_unless_set(monkeypatch):
    monkeypatch.delenv("JGSESS_AUTOTUNE_BUDGET", raising=False)
    assert autotune.budget(2.0, 100) == pytest.approx(0.5)
    # a trace of 10,000 equations jax's cache served: what tracing them takes
    floor = autotune.TRACE_SECONDS_PER_EQUATION * 10_000
    assert autotune.budget(1e-5, 10_000) == pytest.approx(0.25 * floor)
    monkeypatch.setenv("JGSESS_AUTOTUNE_BUDGET", "3")
    assert autotune.budget(2.0, 100) == 3.0


def test_the_key_names_what_the_decision_depends_on():
    aval = jax.ShapeDtypeStruct((2, 3), jnp.bfloat16)
    key = autotune.key("momentum", Target.of(platform="cpu"), [aval], {"flags": 3})
    for part in ("momentum", "cpu", "bfloat16[2, 3]", "flags", jax.__version__, jgsess.__version__):
        assert part in key


def test_measuring_a_node_against_its_reference(tuning):
    """The generic path (select-kernels): nodes whose spec has a cost model are measured."""
    tree = [
        jnp.asarray(np.random.default_rng(i).standard_normal((300,)), jnp.float32) for i in range(5)
    ]
    report = jgsess.jit(optax.global_norm).report(tree)
    assert [m.kernel for m in report.selection] == ["global_norm"]
    (choice,) = [k for k in report.kernels if k.kernel == "global_norm"]
    (measured,) = report.selection
    assert (choice.impl == "kernel") == measured.kernel_wins and "measured" in choice.reason
    assert_trees_close(jgsess.jit(optax.global_norm)(tree), jax.jit(optax.global_norm)(tree))


def test_the_optimizer_kernels_are_not_measured(tuning):
    # adamw and momentum run as fast as XLA's loops or faster, and their programs compile much
    # faster than XLA's per-leaf updates: measuring would only cost compile time
    def sgd(params, grads, acc):
        acc = [0.9 * a + g for a, g in zip(acc, grads)]
        return [p - 0.1 * a for p, a in zip(params, acc)], acc

    tree = [jnp.full((300,), 0.5 + i, jnp.float32) for i in range(3)]
    report = jgsess.jit(sgd).report(tree, tree, tree)
    assert report.selection == [] and [k.impl for k in report.kernels] == ["kernel"]
    opt = optax.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.float32)
    narrow = [t.astype(jnp.bfloat16) for t in tree]  # bf16 parameters too
    report = jgsess.jit(update_step(opt)).report(narrow, opt.init(narrow), narrow)
    assert report.selection == [] and [k.impl for k in report.kernels] == ["kernel"]


@pytest.mark.parametrize(("kernel_s", "xla_s"), [(1.0, 2.0), (2.0, 1.0)], ids=["kernel", "xla"])
def test_an_update_read_by_the_enclosing_step_is_measured_with_it(
    tuning, monkeypatch, kernel_s, xla_s
):
    """jgsess.optim's update inside the user's jax.jit step: the step applies the update next
    (`apply_updates`), which XLA fuses with its own update. Both measured sides include it:
    their first results are the new parameters, p + update, not the update."""
    measured = []

    def measure(sides, target):
        measured.append((sides.kernel, sides.xla, sides.operands, sides.donate))
        return kernel_s, xla_s

    monkeypatch.setattr(autotune, "measure", measure)
    spied, sides = [], autotune.node_sides

    def node_sides(node, then=None):
        spied.append((node, then))
        return sides(node, then)

    monkeypatch.setattr(autotune, "node_sides", node_sides)
    tx = jgsess.optim.adamw(1e-3, weight_decay=1e-2)
    params = [jnp.full((300,), 0.5 + i, jnp.float32) for i in range(3)]
    grads = [jnp.full((300,), 0.1 * (i + 1), jnp.float32) for i in range(3)]
    step = jax.jit(update_step(tx))
    text = step.lower(params, tx.init(params), grads).as_text()
    assert ("jgsess_adamw" in text) == (kernel_s < xla_s)
    (key,) = json.loads(tuning.read_text())
    assert key.endswith("followed by the enclosing program's step")
    ((kernel, xla, operands, donate),) = measured
    assert len(donate) == 3 * len(params)  # p, mu and nu: the step writes them in place
    ((node, then),) = spied
    assert then is not None
    *_, p = operands[: 1 + adamw.SPEC.tensors.shared + 1]  # the arena, hyper-parameters, p
    update = node.op.run_reference(operands[1:], node.params)[0]
    for side in (kernel, xla):
        first = jax.jit(side)(*operands)[0]
        np.testing.assert_allclose(first, (p + update).astype(p.dtype), rtol=1e-5, atol=1e-6)
    step(params, tx.init(params), grads)  # runs, the choice taken


def clipped_adamw():
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=1e-2))
    params = [
        jnp.asarray(np.random.default_rng(i).standard_normal(n), jnp.float32)
        for i, n in enumerate((300, 77, 1024))
    ]
    grads = [p * 0.5 for p in params]
    return update_step(opt), (params, opt.init(params), grads)


def fallbacks(monkeypatch):
    """The warnings said from here on, each cause once (as in a fresh process)."""
    from jgsess import _warnings

    monkeypatch.setattr(_warnings, "_said", set())
    monkeypatch.delenv("JGSESS_STRICT")


def fused_with_one_warning(step, args, match: str):
    """`jgsess.jit(step)` runs the adamw kernel and gives jax.jit's numbers, warning once."""
    with pytest.warns(jgsess.JgsessFallbackWarning, match=match) as caught:
        fused = jgsess.jit(step)
        text = fused.lower(*args).as_text()
        got = fused(*args)
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "jgsess_adamw" in text
    assert_trees_close(got, jax.jit(step)(*args), rtol=2e-6, atol=1e-7)
    return fused


def test_an_unwritable_cache_keeps_every_fusion_with_one_warning(tuning, monkeypatch, tmp_path):
    fallbacks(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("JGSESS_AUTOTUNE_CACHE", str(blocker / "autotune.json"))
    step, args = clipped_adamw()
    fused = fused_with_one_warning(step, args, "autotune.json cannot be read")
    (measured,) = fused.report(*args).selection  # kept in this process's memory
    assert measured.kernel == "global_norm" and measured.cached


def test_a_corrupt_cache_is_ignored_and_replaced(tuning, monkeypatch):
    fallbacks(monkeypatch)
    tuning.parent.mkdir(parents=True)
    tuning.write_text('{"half a cache": ')
    step, args = clipped_adamw()
    fused_with_one_warning(step, args, "is not a cache jgsess wrote")
    (key,) = json.loads(tuning.read_text())
    assert key.startswith("global_norm|")


def test_a_measurement_that_raises_leaves_its_decision_to_the_cost_model(tuning, monkeypatch):
    fallbacks(monkeypatch)

    def measure(sides, target):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while measuring")

    monkeypatch.setattr(autotune, "measure", measure)
    step, args = clipped_adamw()
    fused_with_one_warning(step, args, "measuring global_norm against XLA's code failed")
    report = jgsess.jit(lambda *a: step(*a)).report(*args)  # a new trace: measured again
    (norm,) = [k for k in report.kernels if k.kernel == "global_norm"]
    assert "measuring failed" in norm.reason and "cost model" in norm.reason
    assert not tuning.exists()


@pytest.mark.parametrize("traced_before", ["eval_shape", "flax init"])
def test_a_trace_jaxs_cache_served_still_gets_a_budget(monkeypatch, traced_before):
    """jax.eval_shape(f) (or flax's eval_shape of init) before jgsess.jit(f): jax's trace
    cache serves jgsess's trace in microseconds; the budget counts what a trace of that many
    equations takes."""
    import flax.linen as nn

    monkeypatch.delenv("JGSESS_AUTOTUNE_BUDGET", raising=False)
    seen = []
    budget = autotune.budget
    monkeypatch.setattr(
        autotune, "budget", lambda t, n: seen.append((t, n, budget(t, n))) or budget(t, n)
    )
    if traced_before == "eval_shape":
        fn, args = clipped_adamw()
    else:
        model = nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(8)])
        fn, args = model.init, (jax.random.PRNGKey(0), jnp.ones((4, 16)))
    jax.eval_shape(fn, *args)
    jgsess.jit(fn)(*args)
    ((traced, equations, given),) = seen
    floor = autotune.TRACE_SECONDS_PER_EQUATION * equations
    assert equations > 0 and given == pytest.approx(0.25 * max(traced, floor))
    if jax.__version_info__ >= (0, 10):  # jax shares eval_shape's trace with jax.jit's
        assert traced < floor


def test_the_first_measurement_of_a_compilation_always_runs(tuning, monkeypatch):
    calls = []
    fake_times(monkeypatch, 1.0, 2.0, calls)
    monkeypatch.setenv("JGSESS_AUTOTUNE_BUDGET", "0")
    step, args = clipped_adamw()
    report = jgsess.jit(step).report(*args)
    assert len(calls) == 1 and [m.kernel for m in report.selection] == ["global_norm"]


@pytest.mark.parametrize("setting", ["on", "off:batch_norm_relu"])
def test_batch_norm_follows_the_kernel_switches(tuning, monkeypatch, setting):
    """JGSESS_KERNELS decides the BatchNorm fusion as it does any fused node: on takes the
    kernels unmeasured, off (by name) keeps the program's code."""
    calls = []
    fake_times(monkeypatch, 2.0, 1.0, calls)  # were it measured, XLA's code would win
    monkeypatch.setenv("JGSESS_KERNELS", setting)
    step, args = linen_step(Block(), X)
    report = jgsess.jit(step).report(*args)
    assert calls == []
    if setting == "on":
        assert batch_norm_fusions(report) == {"batch_norm_relu": 1, "batch_norm_relu_grad": 1}
    else:
        assert batch_norm_fusions(report) == {}
        assert "JGSESS_KERNELS turns it off" in str(report)
