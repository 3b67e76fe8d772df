"""`jgsess.jit`: a drop-in for `jax.jit` that runs the session pipeline on the traced program.

`jgsess.jit(fun, **options)` returns `jax.jit(_Body(fun), **options)`: jax's own compiled
function, so every option, attribute, cache and error is jax's. When jax.jit works out the
program for a call (`_compat.rewrite_jit_traces`), it traces `fun` itself, as
`jax.jit(fun, **options)` would, and compiles what `_Body.rewrite` makes of that jaxpr:

    jgsess.jit(f) -> PjitFunction(_Body(f)) + .report / .plain, __wrapped__ = f
                        |  one _Body per (f, options), shared by every jgsess.jit(f), so
                        v  jax's dispatch and executable caches are shared too
        jax traces f (the trace jax.eval_shape(f) and jax.jit(f) share)
        -> _Body.rewrite: compile_jaxpr -> the optimized ClosedJaxpr, same inputs and outputs
        -> jax.jit compiles and runs it (C++ dispatch from the second call)

The body holds `f` weakly (the jitted function holds it strongly): no reference cycles, and
`f`'s closure is freed when the last jitted function of it goes.
"""

from __future__ import annotations

import functools
import gc
import inspect
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax

from . import _compat, _config, platforms
from .report import Report
from .session import Session, compile_jaxpr

# the body's frames (its call under jax.disable_jit(), its rewrite) stay out of the tracebacks
# of errors raised in user code, as jax.jit's own frames do
_compat.hide_from_tracebacks(__file__)

# jax.jit's parameters: jgsess.jit takes the same, and hands every option to jax.jit as given
_SIGNATURE = inspect.signature(jax.jit)


class JgsessFallbackWarning(RuntimeWarning):
    """The pipeline failed on a program; jgsess ran it as plain `jax.jit` would."""


class _JittedType(type):
    def __instancecheck__(cls, obj) -> bool:
        # a function made from a jgsess.jit one by functools-style wrapping (jax.grad, ...)
        # carries its __dict__, body included, but wraps the jitted function, not its body's
        body = getattr(obj, "_jgsess_body", None)
        return isinstance(body, _Body) and getattr(obj, "__wrapped__", None) is body.__wrapped__


class Jitted(metaclass=_JittedType):
    """What `jgsess.jit` returns: `jax.jit`'s compiled function, plus `report` and `plain`.

    `isinstance(f, jgsess.Jitted)` tells a `jgsess.jit` function from a `jax.jit` one; both have
    `lower`, `trace`, `eval_shape`, `clear_cache`, `__wrapped__` and bind as methods.
    """


class _Body:
    """What jax.jit compiles for `jgsess.jit(fun)`: jax traces `fun` for it and compiles the
    jaxpr `rewrite` makes of that trace (`_compat.rewrite_jit_traces`).

    `__wrapped__` is `fun` (jax takes the signature, name and source line from it), held weakly.

    The body's own state lives in slots, so that its `__dict__` holds only what it copies from
    `fun` (and jax.jit copies on to the compiled function). A function made by wrapping another
    jitted one (`jax.grad(jgsess.jit(f))`) carries that one's attributes in its `__dict__`;
    copied into a `__dict__` that also held the state, they would make this body run `f`.
    """

    __slots__ = (
        "_ref",
        "_plain",
        "_options",
        "_plan",
        "_compiler_options",
        "_pinned",
        "_warned",
        "sessions",
        "_rewritten",
        "_reports",
        "__dict__",
        "__weakref__",
    )
    __name__: str  # copied from `fun` (_copy_names), as jax.jit copies them from the body
    __qualname__: str

    def __init__(
        self, fun: Callable, options: dict, plan: bool = False, reports: _Body | None = None
    ):
        self._ref: Callable[[], Any]
        try:
            self._ref = weakref.ref(fun)
        except TypeError:  # held strongly, never cached; jax.jit raises when it traces it
            self._ref = lambda: fun
        self._plain: Callable[[], Any] = lambda: None
        self._options = options  # jax.jit's, as given: `fun` is traced under them
        self._plan = plan  # compute the whole-program memory plan (report, dumps)
        # jax.jit's compiler options, as sorted (name, value) pairs
        self._compiler_options = tuple(sorted((options.get("compiler_options") or {}).items()))
        # the device jax.jit's options place the program on, or None
        self._pinned = platforms.pinned_device(options)
        self._warned = plan  # a report states a fallback itself
        self.sessions: list[Session] | None = [] if plan else None
        # fun's traced jaxprs (jax caches and shares them) -> {(donated inputs, outermost):
        # the program made of it}: one pipeline run per trace, and the same program object
        # each time, whose executable jax caches. A report's body (`reports`: the body it
        # reports on) measures no kernel for a jaxpr that body has compiled, so it shows the
        # decisions that program was compiled with.
        self._rewritten: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._reports = reports
        _copy_names(fun, self)

    def forget(self) -> None:
        """Drop the programs made so far (`clear_cache`): the next trace is rewritten again."""
        self._rewritten.clear()

    @property
    def __wrapped__(self):
        return self._ref()

    def __repr__(self) -> str:  # jax's error messages name the user's function
        return repr(self._ref())

    def __call__(self, *args, **kwargs):
        # jax.jit calls the function it wraps only under jax.disable_jit(), op by op, on every
        # call; otherwise it traces the user's function (_compat.rewrite_jit_traces)
        return self._ref()(*args, **kwargs)

    def plain(self):
        """`jax.jit` of `fun` under the body's options: what jax traces for the body (its trace,
        cached, is shared with `jax.eval_shape(fun)` and `jax.jit(fun)`). The one a
        `jgsess.jit(fun)` still alive holds, so that jax finds its own cached program for it
        (jax tells jit instances apart), else a new one."""
        plain = self._plain()
        if plain is not None:
            return plain
        if not isinstance(self._ref, weakref.ref):  # jax.jit's TypeError, without another
            weakref.ref(self._ref())  # jax.jit of it (jax 0.10.2 crashes on the third)
        with warnings.catch_warnings():  # jax.jit's option warnings came with jgsess.jit
            warnings.simplefilter("ignore")
            return self.keep_plain(jax.jit(self._ref(), **self._options))

    def keep_plain(self, plain):
        """Hold `plain` (a `jax.jit` of `fun` under the body's options) weakly, for `plain()`:
        it holds `fun`, which the body holds weakly."""
        self._plain = weakref.ref(plain)
        return plain

    def rewrite(self, closed, donated, traced: float):
        """The program jax.jit compiles in place of `fun`'s jaxpr `closed` (inputs: the
        enclosing traces' tracers `fun` closes over, then its arrays; `donated`: which inputs
        are donated): `closed`, optimized, with the same inputs and outputs. `traced`: the
        trace's seconds. A pipeline failure gives `closed` itself, as jax.jit would run it.

        The cycle collector is off meanwhile: the pipeline makes many small objects, and the
        collections they triggered (each walking every object jax holds) took a large share
        of its time on large programs (benchmarks/compile_time.py)."""
        outermost = _compat.outside_any_trace()
        done = self._rewritten.setdefault(closed, {})
        key = (tuple(donated), outermost)
        if key in done:
            return done[key] or closed
        reported = self._reports is not None and closed in self._reports._rewritten
        collecting = gc.isenabled()
        gc.disable()
        try:
            program, session = self._optimize(
                closed, donated, outermost, None if reported else traced
            )
        finally:
            if collecting:
                gc.enable()
        session.seconds = {"trace": traced, **session.seconds}
        _record(session.seconds)
        if self.sessions is not None:
            self.sessions.append(session)
        done[key] = None if program is closed else program  # no value holds its key
        return program

    def _optimize(self, closed, donated, outermost: bool, traced: float | None):
        """The optimized program and its Session; on a pipeline failure, `closed` and a Session
        that says why. `traced`: the trace's seconds, None where no kernel may be measured."""
        try:
            with jax.explain_cache_misses(False):
                return compile_jaxpr(
                    closed,
                    name=self.__name__,
                    donated=donated,
                    pinned=self._pinned,
                    plan=self._plan,
                    traced=traced,
                    compiler_options=self._compiler_options,
                    outermost=outermost,
                )
        except Exception as err:  # noqa: BLE001 - any pipeline failure falls back
            if _config.strict():
                raise
            self._fall_back(err)
            fallback = f"{type(err).__name__}: {err}"
            platform = platforms.program_platform(self._pinned)
            return closed, Session(self.__name__, platform, fallback=fallback)

    def _fall_back(self, err: Exception) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"jgsess: the pipeline failed on {self.__name__} ({type(err).__name__}: {err}); "
            "running it as plain jax.jit",
            JgsessFallbackWarning,
            stacklevel=3,
        )


_compat.rewrite_jit_traces(_Body)


def _named(fun: Callable, attr: str):
    """`fun`'s attribute, or that of the function a partial (of a partial...) wraps."""
    while not hasattr(fun, attr) and isinstance(fun, functools.partial):
        fun = fun.func
    return getattr(fun, attr, None)


def _copy_names(fun: Callable, body) -> None:
    """What jax.jit copies from a function to its compiled one (its __dict__, name, qualified
    name, module, doc and annotations; a partial's named after the function it wraps), onto the
    body, from which jax.jit copies them."""
    body.__dict__.update(
        {k: v for k, v in getattr(fun, "__dict__", {}).items() if k != "__wrapped__"}
    )
    body.__name__ = _named(fun, "__name__") or "<unnamed function>"
    body.__qualname__ = _named(fun, "__qualname__") or body.__name__
    body.__module__ = getattr(fun, "__module__", "<unknown module>")
    body.__doc__ = getattr(fun, "__doc__", "") or ""
    body.__annotations__ = getattr(fun, "__annotations__", {})


def _record(seconds: dict[str, float]) -> None:
    """The pipeline's time as jax.monitoring events: /jgsess/pipeline_duration (all of it) and
    /jgsess/{trace,passes,emit}_duration."""
    for part, duration in seconds.items():
        jax.monitoring.record_event_duration_secs(f"/jgsess/{part}_duration", duration)
    jax.monitoring.record_event_duration_secs("/jgsess/pipeline_duration", sum(seconds.values()))


# fun -> {its jax.jit options, frozen: its _Body}; the body holds fun weakly
_BODIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _body(fun: Callable, options: dict) -> _Body:
    """The body of `fun` under these options: one per (fun, options), so that every
    jgsess.jit(fun, **options) shares jax's trace and executable caches, as jax.jit's do."""
    try:
        key = tuple(sorted((name, _frozen(value)) for name, value in options.items()))
        bodies = _BODIES.setdefault(fun, {})
        body = bodies.get(key)
    except TypeError:  # fun or an option not hashable, or fun not weakly referenceable
        return _Body(fun, options)
    if body is None:
        body = bodies[key] = _Body(fun, options)
    return body


def _frozen(value):
    leaves, treedef = jax.tree.flatten(value)
    return treedef, tuple(leaves)


def jit(fun=_SIGNATURE.parameters["fun"].default, /, **options):
    """Compile `fun` like `jax.jit`, after running MindSpore's GPU-session passes over it.

    Takes exactly `jax.jit`'s arguments, with their meaning (`static_argnums`,
    `donate_argnums`, `in_shardings`, `keep_unused`, `compiler_options`, ...), and returns
    `jax.jit`'s own kind of function: `lower`, `trace`, `eval_shape`, `clear_cache`, method
    binding, caches and errors are jax's. Each input signature is traced once to a jaxpr,
    turned into a kernel graph, rewritten (canonicalization, cast/transpose cleanups, fused
    optimizer updates, ...), given a compiled kernel or XLA's own code for each fused node, and
    handed to XLA. Results equal `jax.jit(fun)`'s; if the pipeline fails, jgsess warns once
    (`JgsessFallbackWarning`) and runs `fun` as `jax.jit` would.

    Args:
      fun: the function to compile. Leave it out to get a decorator.
      **options: any keyword argument of `jax.jit`. `donate_argnums`/`donate_argnames` also
        let fused optimizer updates write parameters and state in place.

    Returns:
      `jax.jit`'s compiled function with two more methods: `report(*args)` (what the pipeline
      did for these arguments) and `plain()` (`jax.jit(fun, **options)`, the baseline).

    Example:
      >>> step = jgsess.jit(train_step, donate_argnums=(0, 1))
      >>> params, opt_state = step(params, opt_state, batch)
      >>> print(step.report(params, opt_state, batch))
    """
    if fun is _SIGNATURE.parameters["fun"].default:
        _SIGNATURE.bind_partial(**options)  # jax's TypeError for a keyword jax.jit does not take
        return functools.partial(jit, **options)
    with warnings.catch_warnings():  # jax.jit's errors for a bad function or bad options;
        warnings.simplefilter("ignore")  # its warnings come once, from the jax.jit below
        plain = jax.jit(fun, **options)
    body = _body(fun, options)
    body.keep_plain(plain)
    jitted = jax.jit(body, **options)
    jitted.__wrapped__ = fun
    jitted._jgsess_body = body
    jitted.plain = lambda: plain
    jitted.plain.__doc__ = "`jax.jit` of the same function and options: the baseline."
    jitted.report = functools.partial(_report, fun, body, options, plain)
    # the jitted function held weakly: its own attribute, it would make a reference cycle
    jitted.clear_cache = functools.partial(_clear_cache, weakref.ref(jitted), body, plain)
    return jitted


def _clear_cache(jitted: weakref.ref, body: _Body, plain) -> None:
    """What `jax.jit(fun).clear_cache()` clears (the dispatch cache, `fun`'s traces and their
    executables), and the programs the body made of those traces."""
    type(plain).clear_cache(jitted())
    plain.clear_cache()
    body.forget()


jit.__signature__ = _SIGNATURE.replace(  # type: ignore[attr-defined]
    return_annotation="jax.jit's compiled function"
)


def _report(fun, compiled: _Body, options, plain, *args, **kwargs) -> Report:
    """What the pipeline did for these arguments: passes, fusions, kernels, memory, times. For
    arguments `compiled` has already compiled, the decisions that program was compiled with:
    kernels it left unmeasured stay unmeasured here (their measurement would change the
    program, not report it)."""
    body = _Body(fun, compiled._options, plan=True, reports=compiled)
    fused = jax.jit(body, **options)
    fused.trace(*args, **kwargs)
    assert body.sessions  # a report's body keeps its sessions
    return Report(body.sessions[-1], fused, plain, args, kwargs)
