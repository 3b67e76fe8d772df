"""jgsess.jit beside jax.jit: every keyword argument, attribute, cache and error, side by side."""

import functools
import gc
import inspect
import logging
import traceback
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jgsess
from tests.helpers import assert_trees_close, rand

# Every parameter of the installed jax.jit, each exercised below. A jax release that adds one
# fails here first: check what it means under jgsess, add a test, then add it to this list.
CHECKED = {
    "fun": "test_non_callables_and_generators_are_rejected_alike",
    "in_shardings": "test_shardings",
    "out_shardings": "test_shardings",
    "static_argnums": "test_explicit_empty_static_arguments_trace_everything",
    "static_argnames": "test_explicit_empty_static_arguments_trace_everything",
    "donate_argnums": "test_donation",
    "donate_argnames": "test_donation",
    "keep_unused": "test_keep_unused",
    "device": "test_device_and_backend",
    "backend": "test_device_and_backend",
    "inline": "test_inline",
    "compiler_options": "test_compiler_options",
    # jax 0.7 only (experimental dynamic shapes, removed later): passed to jax.jit as given
    "abstracted_axes": "test_the_signature_is_jax_jits",
}


def both(fun, **options):
    return jax.jit(fun, **options), jgsess.jit(fun, **options)


def test_the_signature_is_jax_jits():
    theirs = inspect.signature(jax.jit).parameters
    ours = inspect.signature(jgsess.jit).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in theirs.values()
    ]
    assert set(theirs) <= set(CHECKED), "a jax.jit argument nobody has checked under jgsess"


def test_unknown_keywords_raise_as_jax_does():
    for fun in (lambda x: x, None):
        args = () if fun is None else (fun,)
        with pytest.raises(TypeError) as theirs:
            jax.jit(*args, not_an_option=1)
        with pytest.raises(TypeError) as ours:
            jgsess.jit(*args, not_an_option=1)
        assert "not_an_option" in str(theirs.value) and "not_an_option" in str(ours.value)


def test_explicit_empty_static_arguments_trace_everything():
    def g(x, n):
        return x * n

    x, n = rand((3,)), jnp.float32(2.0)
    for options in ({"static_argnums": ()}, {"static_argnames": ()}):
        plain, fused = both(g, **options)
        assert_trees_close(fused(x, n), plain(x, n))
        assert_trees_close(fused(x, n=n), plain(x, n=n))  # an array: it must be traced


def test_static_arguments_inferred_from_names_and_numbers():
    def g(x, n, *, mode="sin"):
        return (jnp.sin(x) if mode == "sin" else jnp.cos(x)) * n

    x = rand((4,))
    for options in ({"static_argnums": 1}, {"static_argnames": "n"}):
        plain, fused = both(g, **options)
        assert_trees_close(fused(x, 3), plain(x, 3))
        assert_trees_close(fused(x, n=4), plain(x, n=4))
    plain, fused = both(g, static_argnames=("n", "mode"))
    assert_trees_close(fused(x, 3, mode="cos"), plain(x, 3, mode="cos"))


def test_donation():
    def g(a, b):
        return a * 2 + b, b - 1

    for options in ({"donate_argnums": 0}, {"donate_argnames": "a"}, {"donate_argnames": "b"}):
        for call in (lambda f, a, b: f(a, b), lambda f, a, b: f(a=a, b=b)):
            deleted = []
            for f in both(g, **options):
                a, b = rand((8,)), rand((8,), 1)
                call(f, a, b)
                deleted.append((a.is_deleted(), b.is_deleted()))
            assert deleted[0] == deleted[1], (options, deleted)
            assert any(deleted[0]), options


def test_shardings():
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    x = rand((4, 3))
    plain, fused = both(lambda x: x.T @ x, in_shardings=sharding, out_shardings=sharding)
    got, want = fused(x), plain(x)
    assert_trees_close(got, want, rtol=1e-5)
    assert got.sharding == want.sharding == sharding


def test_keep_unused():
    def g(x, unused):
        return x + 1

    x = rand((3,))
    for keep in (False, True):
        plain, fused = both(g, keep_unused=keep)
        texts = [f.lower(x, x).as_text() for f in (plain, fused)]
        assert [t.count("%arg1") > 0 for t in texts] == [keep, keep]


def test_device_and_backend():
    x = rand((3,))
    for options in ({"backend": "cpu"}, {"device": jax.devices()[0]}):
        outcomes = []
        for make in (jax.jit, jgsess.jit):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = make(jnp.sin, **options)(x)
            outcomes.append(([type(w.message) for w in caught], out))
        assert outcomes[0][0] == outcomes[1][0]  # the same deprecation warnings, or none
        assert_trees_close(outcomes[1][1], outcomes[0][1])


def test_inline():
    for inline in (False, True):
        jaxprs = [
            jax.make_jaxpr(lambda x, f=f: f(x) + 1)(1.0) for f in both(jnp.sin, inline=inline)
        ]
        calls = [[e.primitive.name for e in j.eqns].count("jit") for j in jaxprs]
        assert calls[0] == calls[1] == (0 if inline else 1)


def test_compiler_options():
    x = rand((3,))
    plain, fused = both(jnp.sin, compiler_options={"xla_cpu_enable_fast_math": False})
    assert_trees_close(fused(x), plain(x))
    errors = []
    for f in both(jnp.sin, compiler_options={"no_such_xla_option": 1}):
        with pytest.raises(Exception) as err:
            f(x)
        errors.append(type(err.value))
    assert errors[0] is errors[1]


@pytest.mark.parametrize("fun", [3, "f"])
def test_non_callables_and_generators_are_rejected_alike(fun):
    def gen(x):
        yield x

    for bad in (fun, gen):
        with pytest.raises(TypeError) as theirs:
            jax.jit(bad)
        with pytest.raises(TypeError) as ours:
            jgsess.jit(bad)
        assert str(ours.value) == str(theirs.value)


def test_bad_static_argnums_raise_as_jax_does():
    def g(x):
        return x

    with pytest.raises(ValueError) as theirs:
        jax.jit(g, static_argnames="nope", donate_argnames="nope")
    with pytest.raises(ValueError) as ours:
        jgsess.jit(g, static_argnames="nope", donate_argnames="nope")
    assert str(ours.value) == str(theirs.value)


def test_attributes_and_methods():
    def g(x, y=2.0):
        """Doc of g."""
        return jnp.sin(x) * y

    plain, fused = both(g)
    x = rand((5,))
    public = {a for a in dir(plain) if not a.startswith("__") or a == "__wrapped__"}
    assert public <= set(dir(fused))
    assert fused.__wrapped__ is g and fused.__name__ == "g" and fused.__doc__ == g.__doc__
    assert inspect.signature(fused) == inspect.signature(g)
    assert repr(fused) == repr(plain)
    assert fused.eval_shape(x) == plain.eval_shape(x)
    assert fused.trace(x).jaxpr.out_avals == plain.trace(x).jaxpr.out_avals
    assert_trees_close(fused.lower(x).compile()(x), plain(x))
    fused(x)
    assert fused._cache_size() == 1
    fused.clear_cache()
    assert fused._cache_size() == 0
    assert isinstance(fused, jgsess.Jitted) and not isinstance(plain, jgsess.Jitted)


WRAPPED = ("__name__", "__qualname__", "__module__", "__doc__", "__annotations__")


def annotated(x: jax.Array, scale: float = 2.0) -> jax.Array:
    """Doc of annotated."""
    return x * scale


annotated.note = "copied from the function's __dict__"


@pytest.mark.parametrize(
    "fun",
    [
        annotated,
        functools.partial(annotated, scale=3.0),
        functools.partial(functools.partial(annotated, scale=3.0)),
    ],
    ids=["function", "partial", "partial of a partial"],
)
def test_names_and_wrapped_attributes_are_jax_jits(fun):
    """A partial's compiled function is named after the function it wraps (repr, logs,
    profiles, cache-miss explanations show it); annotations and __dict__ are copied."""
    plain, fused = both(fun)
    for attr in WRAPPED:
        assert getattr(fused, attr) == getattr(plain, attr), attr
    assert getattr(fused, "note", None) == getattr(plain, "note", None)
    assert repr(fused) == repr(plain)
    x = rand((3,))
    assert_trees_close(fused(x), plain(x))


class Incomparable:
    """A static argument whose __eq__ raises (hash collisions make jax compare)."""

    def __hash__(self):
        return 1

    def __eq__(self, other):
        raise RuntimeError("cannot compare")


@pytest.mark.hook_road(
    "the public road traces the function inside the body's trace: one more of jax's caches "
    "compares the static argument"
)
def test_a_static_argument_whose_eq_raises_is_a_value_error_as_with_jax_jit():
    """jax's caches compare static arguments and turn the user's exception into a ValueError
    (which of its caches compares first depends on what ran before); jgsess's record of what
    it compiled lets jax's behaviour through, not the user's error: also after
    jax.clear_caches(), where jax 0.10 compares nothing and jax 0.7 raises the user's error."""

    def outcome(jit) -> str:
        fun = jit(lambda x, s: x * 2, static_argnums=1)
        with pytest.raises(ValueError):
            fun(rand((3,)), Incomparable())
            fun(rand((3,)), Incomparable())
        jax.clear_caches()
        try:
            assert_trees_close(fun(rand((3,)), Incomparable()), rand((3,)) * 2)
        except Exception as err:  # noqa: BLE001 - the behaviour compared, whatever it is
            return type(err).__name__
        return "ran"

    assert outcome(jgsess.jit) == outcome(jax.jit)


def test_methods_bind_self():
    class Model:
        def __init__(self, scale):
            self.scale = scale

        def __hash__(self):
            return hash(self.scale)

        def __eq__(self, other):
            return self.scale == other.scale

        def power(self, x, n):
            return x**n * self.scale

    x = rand((3,))
    m = Model(3.0)
    results = []
    for make in (jax.jit, jgsess.jit):
        Model.jitted = make(Model.power, static_argnums=(0, 2))
        results.append((m.jitted(x, 2), Model.jitted(m, x, 3)))
        assert Model.__dict__["jitted"].__get__(m, Model).__self__ is m
    assert_trees_close(results[1], results[0])


def _counted():
    traces = []

    def g(x):
        traces.append(1)
        return jnp.sin(x) + 1

    return g, traces


def test_jitting_a_function_twice_traces_it_once():
    counts = []
    for make in (jax.jit, jgsess.jit):
        g, traces = _counted()
        for _ in range(3):
            make(g)(jnp.ones(3))
        counts.append(len(traces))
    assert counts == [1, 1]


def test_clear_cache_traces_the_function_again_as_with_jax_jit():
    counts = []
    for make in (jax.jit, jgsess.jit):
        g, traces = _counted()
        f = make(g)
        f(jnp.ones(3))
        f.clear_cache()
        f(jnp.ones(3))
        counts.append(len(traces))
    assert counts == [2, 2]


@pytest.mark.parametrize(
    "first",
    [
        lambda g, x: jax.eval_shape(g, x),
        lambda g, x: jax.jit(g).trace(x),
        lambda g, x: jax.jit(g)(x),
        lambda g, x: jax.jit(g).eval_shape(x),
    ],
    ids=["eval_shape", "jax.jit.trace", "jax.jit", "jit.eval_shape"],
)
def test_traces_are_shared_with_eval_shape_and_jax_jit(first):
    """flax's `jax.eval_shape(init, ...)` then `jit(init)(...)`: the second call reuses the
    trace of the first, under jgsess.jit as under jax.jit."""
    counts = []
    for make in (jax.jit, jgsess.jit):
        g, traces = _counted()
        x = rand((4,))
        first(g, x)
        assert_trees_close(make(g)(x), jnp.sin(x) + 1)
        make(g).eval_shape(x)
        counts.append(len(traces))
    assert counts[1] == counts[0] == 1


@pytest.mark.skipif(not hasattr(jax, "make_user_context"), reason="jax >= 0.9")
def test_user_contexts_trace_once_per_value():
    counts = []
    for make in (jax.jit, jgsess.jit):
        context = jax.make_user_context(default_value=0)
        g, traces = _counted()
        f = make(g)
        for value in (0, 1, 2, 3, 1):
            with context(value):
                f(jnp.ones(3))
        counts.append(len(traces))
    assert counts[1] == counts[0]


@pytest.mark.hook_road("jax counts the public road's body's trace beside the function's")
def test_jax_counts_the_same_traces_and_dispatches_in_cpp_from_the_second_call():
    """jax's own counters (those of its jit tests): one trace per signature shared with
    eval_shape, none more per user-context value, and no call after the first leaves jax's C++
    dispatch, under jgsess.jit as under jax.jit."""
    from jax._src import test_util as jtu

    x = rand((5,))
    jgsess.jit(lambda y: jnp.sin(y) + 1)(x)  # jnp.sin, and the pipeline's patterns, traced once
    counts = []
    for make in (jax.jit, jgsess.jit):
        g, _ = _counted()
        with jtu.count_jit_tracing_cache_miss() as traced:
            jax.eval_shape(g, x)
            f = make(g)
            f(x)
        with jtu.count_pjit_cpp_cache_miss() as missed:
            for _ in range(3):
                f(x)
        counts.append((traced(), missed()))
    assert counts[1] == counts[0]
    assert counts[0][1] == 0


def test_trace_hooks_see_one_trace_as_with_jax_jit():
    # jax 0.7 cannot remove a listener: this one records only while the test runs
    seen, listening = [], [True]

    def listener(event, duration, **kwargs):
        if listening[0] and event == "/jax/core/compile/jaxpr_trace_duration":
            seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        counts = []
        for make in (jax.jit, jgsess.jit, jax.jit, jgsess.jit):  # the second round is warm
            seen.clear()
            make(lambda x: jnp.cos(x) + 1)(jnp.ones(7))
            counts.append(len(seen))
    finally:
        listening[0] = False
        if hasattr(jax.monitoring, "unregister_event_duration_listener"):
            jax.monitoring.unregister_event_duration_listener(listener)
    assert counts[2] == counts[3] == 1


def test_no_reference_cycle_keeps_closures_alive():
    class Payload:
        pass

    def make():
        payload = Payload()
        payload.value = jnp.ones(3)

        def g(x):
            return x + payload.value

        return g, weakref.ref(payload)

    for make_jit in (jax.jit, jgsess.jit):
        g, ref = make()
        f = make_jit(g)
        f(jnp.ones(3))
        gc.disable()
        try:
            del f, g
            assert ref() is None, make_jit  # freed by reference counting alone
        finally:
            gc.enable()


def _leaky(make):
    """A jitted function that leaks its tracer into a closure."""
    leaked = []

    def leak(x):
        leaked.append(x)
        return x

    make(leak)(jnp.ones(2))
    return leaked


@pytest.mark.parametrize(
    "use",
    [
        lambda leaked: lambda y: y + leaked[0],
        lambda leaked: (
            lambda y: jax.lax.scan(lambda c, _: (c + leaked[0], None), y, None, length=3)[0]
        ),
    ],
    ids=["add", "scan"],
)
def test_leaked_tracers_are_rejected_alike(use):
    outcomes = []
    for make in (jax.jit, jgsess.jit):
        with pytest.raises(Exception) as err:
            make(use(_leaky(make)))(jnp.ones(2))
        outcomes.append(type(err.value))
    assert outcomes[0] is outcomes[1] is jax.errors.UnexpectedTracerError


def _frames(make) -> list[tuple[str, str]]:
    def bad(x):
        return x @ jnp.ones((5, 5))  # shapes do not match

    try:
        make(bad)(jnp.ones(3))
    except TypeError as err:
        return [(f.filename, f.name) for f in traceback.extract_tb(err.__traceback__)]
    raise AssertionError("no error")


def test_an_error_in_user_code_shows_the_frames_jax_jit_shows():
    """jax hides its own frames from the traceback of an error raised in the traced function;
    jgsess hides the body's frames too, so the traceback is jax.jit's, frame for frame."""
    ours = _frames(jgsess.jit)
    assert ours == _frames(jax.jit)
    assert [name for _, name in ours][:2] == ["_frames", "bad"]


def test_explain_cache_misses_names_the_users_function(caplog):
    def users_step(x):
        return x * 3

    f = jgsess.jit(users_step)
    with jax.explain_cache_misses(True), caplog.at_level(logging.WARNING):
        f(jnp.ones(2))
        f(jnp.ones(3))
    text = caplog.text
    assert "users_step" in text and "test_jit_parity.py" in text
    assert "_api.py" not in text and "_body.py" not in text and "_replay.py" not in text


def test_decorator_without_arguments_and_with():
    @jgsess.jit
    def a(x):
        return x + 1

    @jgsess.jit(donate_argnums=0)
    def b(x):
        return x + 1

    x = rand((2,))
    assert_trees_close(a(x), x + 1)
    assert_trees_close(b(jnp.array(x)), x + 1)


def test_numpy_and_python_scalars_and_weak_types():
    plain, fused = both(lambda x, s: x * s + 1)
    for args in ((np.ones(3, np.float32), 2.0), (3, 4), (jnp.ones(2), jnp.int32(3))):
        assert_trees_close(fused(*args), plain(*args))


def _adamw_step(size: int):
    opt = optax.adamw(1e-3, weight_decay=1e-2)

    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params = {"w": rand((size,)), "b": rand((7,), 1)}
    grads = jax.tree.map(lambda x: 0.01 * x, params)
    return step, jax.block_until_ready((params, opt.init(params), grads))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's dispatch heuristic")
def test_dispatch_is_asynchronous_where_jax_jits_is():
    # XLA's CPU runtime runs a program it estimates under 1,000 flops synchronously and counts a
    # custom call as -1 flop; kernel calls carry a hint (kernels/spec.py) so that a program is
    # estimated cheap exactly where jax.jit's own program is
    for size in (16, 1001):
        step, args = _adamw_step(size)
        plain, fused = (f(step).lower(*args).compile() for f in (jax.jit, jgsess.jit))
        assert 'custom_call_target="jgsess_adamw"' in fused.as_text()
        cheap = [c.cost_analysis()["flops"] < 1000 for c in (plain, fused)]
        assert cheap == [size == 16] * 2, (size, cheap)

    # and a step that takes milliseconds returns before it is done, as jax.jit's does (inputs
    # ready first: XLA dispatches asynchronously anyway while they are not); five tries, so a
    # thread descheduled between the call and the check does not fail the test
    step, args = _adamw_step(1 << 22)
    fused = jgsess.jit(step).lower(*args).compile().as_text()
    assert 'custom_call_target="jgsess_adamw"' in fused
    for f in both(step):
        pending = 0
        for _ in range(5):
            out = f(*args)
            pending += not all(x.is_ready() for x in jax.tree.leaves(out))
            jax.block_until_ready(out)
        assert pending > 0, f


def _step(p, u):
    return p + -0.001 * u


def test_composite_decompositions_reach_xla_as_written():
    """A composite's decomposition is a contract with backends that match the call by name:
    the passes leave it as the user wrote it (they do rewrite the same code outside one)."""
    p, u = rand((3,)), rand((3,), 1)
    composite = jax.lax.composite(_step, name="jgsess_test.step")
    plain, fused = both(lambda p, u: composite(p, u) * 2.0)
    assert fused.lower(p, u).as_text() == plain.lower(p, u).as_text()
    assert "stablehlo.composite" in fused.lower(p, u).as_text()
    assert_trees_close(fused(p, u), plain(p, u))

    def canonicalized(f) -> int:
        (found,) = [r.rewrites for r in f.report(p, u).passes if r.name == "canonicalize"]
        return found

    assert canonicalized(fused) == 0 and canonicalized(jgsess.jit(_step)) > 0


def test_a_callable_that_cannot_be_weakly_referenced_raises_as_with_jax_jit():
    """jax.jit takes such a callable (a C slot's method-wrapper) and raises jax's TypeError when
    it is called. One of each only: jax 0.10.2 itself crashes on the third jax.jit of one."""
    errors = []
    for make in (jax.jit, jgsess.jit):
        fun = make(np.ones(3, np.float32).__add__)
        with pytest.raises(TypeError) as err:
            fun(jnp.ones(3))
        errors.append(str(err.value))
    assert errors[0] == errors[1] == "cannot create weak reference to 'method-wrapper' object"


def _cube(x):
    return x**3


def _pytree_loss(p):
    return jnp.sum(jnp.tanh(p["w"] @ p["b"]) ** 2) + jnp.sum(p["b"] ** 3)


def _loss_after_an_adamw_step(p):
    tx = optax.adamw(1e-2, weight_decay=1e-2)
    updates, _ = tx.update(jax.grad(_pytree_loss)(p), tx.init(p), p)
    return _pytree_loss(optax.apply_updates(p, updates))


_PYTREE = {"w": rand((3, 4)), "b": rand((4,), 1)}


@pytest.mark.parametrize(
    "transform, fun, x",
    [
        (jax.grad, _cube, 4.0),
        (jax.hessian, _cube, 4.0),
        (jax.grad, _pytree_loss, _PYTREE),
        (jax.grad, _loss_after_an_adamw_step, _PYTREE),
    ],
    ids=["grad", "hessian", "pytree-loss", "optax-step-inside"],
)
def test_an_outer_jit_over_a_transformed_inner_jit(transform, fun, x):
    """jit(transform(jit(f))): the transformation's function carries the inner jitted one's
    attributes (functools-style wrapping); the outer jit must still compile the transformation,
    not f (it gave f's value: 64 for the grad of x**3 at 4, where 48 is right)."""
    plain, fused = (make(transform(make(fun))) for make in (jax.jit, jgsess.jit))
    assert_trees_close(fused(x), plain(x), rtol=1e-5, atol=1e-6)
    assert_trees_close(fused(x), transform(fun)(x), rtol=1e-5, atol=1e-6)


def test_a_function_wrapping_a_jitted_one_is_not_jitted():
    f = jgsess.jit(_cube)
    assert isinstance(f, jgsess.Jitted)
    assert not isinstance(jax.grad(f), jgsess.Jitted)
    assert not isinstance(jax.jit(_cube), jgsess.Jitted)


def test_disable_jit_runs_the_function_op_by_op_on_every_call():
    for make in (jax.jit, jgsess.jit):
        effects = []

        def g(x, effects=effects):
            effects.append(type(x))
            return x * 2

        f = make(g)
        with jax.disable_jit():
            assert f(2) == 4
            assert f(2) == 4
        assert effects == [int, int], make
        f(2)
        f(2)
        assert len(effects) == 3, make


def _leaked_in_a_jitted_function(make):
    """A tracer leaked through a nonlocal by a function `make` compiles, as JAX's own test
    (test_escaped_tracer_omnistaging) does it."""
    count = [1]

    def leak():
        count[0] = jnp.add(count[0], 1)

    make(leak)()
    return count


def _leaked_in_remat(make):
    """An intermediate of a remat body kept in a list and used by a second remat (JAX's
    test_escaped_tracer_remat); returns the function that leaks, to compile."""

    def f():
        seq = [jnp.zeros([])]

        def g():
            seq[0] += 1
            return seq[0]

        jax.checkpoint(g)()
        jax.checkpoint(lambda: g())()

    return f


def test_escaped_tracers_are_rejected_even_when_their_result_is_unused():
    """jax.jit raises for a program that closes over an escaped tracer, used or not; the
    pipeline removes the unused use, so jgsess checks the closed-over tracers itself."""
    for make in (jax.jit, jgsess.jit):
        count = _leaked_in_a_jitted_function(make)

        def scan_body(c, _, count=count):
            jnp.add(count[0], 1)  # unused
            return c, None

        with pytest.raises(jax.errors.UnexpectedTracerError):
            make(lambda: jax.lax.scan(scan_body, 0.0, None, length=2))()
        with pytest.raises(jax.errors.UnexpectedTracerError):
            make(_leaked_in_remat(make))()


def test_tracers_of_enclosing_transformations_are_not_escaped():
    """The check above lets through the tracers a jitted function closes over from the grad,
    vmap and jit around it."""

    def outer(x):
        return jgsess.jit(lambda y: jnp.sum(y * x))(jnp.ones(3))

    x = rand((3,))
    assert_trees_close(jax.grad(outer)(x), jnp.ones(3))
    assert_trees_close(jax.jit(jax.grad(outer))(x), jnp.ones(3))
    assert_trees_close(jgsess.jit(jax.grad(outer))(x), jnp.ones(3))
    assert_trees_close(jax.vmap(outer)(jnp.stack([x, 2 * x])), jnp.stack([1, 2]) * jnp.sum(x))
