"""What jax.jit compiles for `jgsess.jit(fun)`: the body, on one of jgsess.jit's two roads.

`jgsess.jit(fun, **options)` is `jax.jit(body, **options)` (jgsess/_api.py). On the first road
(`Body`, jgsess/_compat/jit_hook.py) jax never traces the body: when jax.jit works out the
program for a call, it traces `fun` itself, as `jax.jit(fun, **options)` would, and compiles
what `Body.rewrite` makes of that jaxpr:

    jax traces fun (the trace jax.eval_shape(fun) and jax.jit(fun) share)
    -> Body.rewrite: compile_jaxpr -> the optimized ClosedJaxpr, same inputs and outputs
    -> jax.jit compiles and runs it (C++ dispatch from the second call)

On the public road (`Replay`, jgsess/_replay.py: jax's public API alone, where the hook's probe
fails or JGSESS_ROAD=public) jax traces the body, which traces `fun`, rewrites it the same way
and replays the program; where neither works, the body is `Plain`: it calls `fun`, as jax.jit
would. `Roads` chooses, once per process, and warns where it leaves the first road.

The body holds `fun` weakly (the jitted function holds it strongly): no reference cycles, and
`fun`'s closure is freed when the last jitted function of it goes.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax

from . import _compat, _config, _replay, platforms
from ._compat import jit_hook
from ._warnings import JgsessFallbackWarning
from .session import Session, compile_jaxpr

# the body's frames (its call under jax.disable_jit(), its rewrite, the public road's trace
# and replay) stay out of the tracebacks of errors raised in user code, as jax.jit's own do
_compat.hide_from_tracebacks(__file__)
_compat.hide_from_tracebacks(_replay.__file__)


class Body:
    """What jax.jit compiles for `jgsess.jit(fun)`: jax traces `fun` for it and compiles the
    jaxpr `rewrite` makes of that trace (`_compat.install_jit_hook`).

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
        "_lock",
        "__dict__",
        "__weakref__",
    )
    __name__: str  # copied from `fun` (_copy_names), as jax.jit copies them from the body
    __qualname__: str

    def __init__(
        self, fun: Callable, options: dict, plan: bool = False, reports: Body | None = None
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
        # held while a trace is made and rewritten: two threads tracing one new signature at
        # once run the pipeline once (the second finds jax's trace and its rewrite cached)
        self._lock = threading.RLock()
        copy_names(fun, self)

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
        # call; otherwise it traces the user's function (jit_hook.install_jit_hook)
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

    def tracing(self):
        """Held while jax traces `fun` for a call and the trace is rewritten."""
        return self._lock

    def unexpected(self, why: str) -> None:
        """jax.jit's step is not as the hook expects (`why`): this call runs as jax.jit traced
        it; jgsess.jit functions made from now on take the public road."""
        ROADS.hook_failed(why)
        self._fall_back(RuntimeError(why), "jax.jit's step changed")

    def rewrite(self, closed, donated, traced: float, outermost: bool):
        """The program jax.jit compiles in place of `fun`'s jaxpr `closed` (inputs: the
        enclosing traces' tracers `fun` closes over, then its arrays; `donated`: which inputs
        are donated): `closed`, optimized, with the same inputs and outputs. `traced`: the
        trace's seconds; `outermost`: no other trace is running (the program runs on the
        caller's arrays). A pipeline failure gives `closed` itself, as jax.jit would run it.
        The programs made are kept per trace, donation, nesting and JGSESS_* settings: a
        setting changed since gives a new program for the next trace.

        The cycle collector is off meanwhile: the pipeline makes many small objects, and the
        collections they triggered (each walking every object jax holds) took a large share
        of its time on large programs (benchmarks/compile_time.py)."""
        with self._lock:
            done = self._rewritten.setdefault(closed, {})
            key = (tuple(donated), outermost, _config.fingerprint())
            if key in done:
                return done[key] or closed
            reported = self._reports is not None and closed in self._reports._rewritten
            with collector_paused():
                program, session = self._optimize(
                    closed, donated, outermost, None if reported else traced
                )
            done[key] = None if program is closed else program  # no value holds its key
        session.seconds = {"trace": traced, **session.seconds}
        record(session.seconds)
        if self.sessions is not None:
            self.sessions.append(session)
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
            self._fall_back(err, "the pipeline failed")
            fallback = f"{type(err).__name__}: {err}"
            platform = platforms.program_platform(self._pinned)
            return closed, Session(self.__name__, platform, fallback=fallback)

    def _fall_back(self, err: Exception, what: str) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"jgsess: {what} on {self.__name__} ({type(err).__name__}: {err}); "
            "running it as plain jax.jit",
            JgsessFallbackWarning,
            stacklevel=3,
        )


class Replay(Body):
    """The body of jgsess.jit's public road (jgsess/_replay.py): jax traces it, and it traces
    `fun`, rewrites the trace and replays the program in its place."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        if jax.config.jax_disable_jit:  # jax.jit calls its function op by op
            return self._ref()(*args, **kwargs)
        # the methods looked up on the type, as the hook does: the body's __dict__ holds what
        # it copied from the user's function (another jitted function's `plain`, say)
        with self._lock:
            plain = Body.plain(self)
            return _replay.replay(self._ref(), plain, args, kwargs, self._rewrite_top)

    def _rewrite_top(self, closed, donated, traced: float):
        # jax shares the body's trace between calls at the top and inside another trace
        return Body.rewrite(self, closed, donated, traced, outermost=True)


class Plain(Body):
    """The body where neither road works: jax traces it, and it calls `fun`, as jax.jit."""

    __slots__ = ()


class Roads:
    """Which road each new jgsess.jit function takes (README's Limits):

    - "hook": jax.jit's private step wrapped (jit_hook.install_jit_hook), where its probe
      passed: one trace per signature, as jax.jit;
    - "public": jax's public API only (jgsess/_replay.py), where the hook is not in place or
      JGSESS_ROAD=public asks;
    - "plain": where neither works, plain jax.jit.

    The hook is installed and probed, and the public road probed, once per process, on the
    first jgsess.jit; a change of road warns once (JgsessFallbackWarning), naming the road and
    why, or raises under JGSESS_STRICT=1."""

    def __init__(self):
        self._lock = threading.Lock()
        self._hook: list[str | None] = []  # [None] once installed, [why not] otherwise
        self._public: list[str | None] = []
        self._warned: set[str] = set()

    def hook_failed(self, why: str) -> None:
        with self._lock:
            self._hook[:] = [why]

    def body_type(self) -> type[Body]:
        with self._lock:
            forced = _config.road() == "public"
            if not forced and not self._hook:
                self._hook.append(jit_hook.install_jit_hook(Body))
            why = "JGSESS_ROAD=public" if forced else self._hook[0]
            if why is None:
                return Body
            if not self._public:
                self._public.append(_replay.check())
            chosen: type[Body] = Replay if self._public[0] is None else Plain
            if chosen is Plain:
                self._warn(f"jgsess.jit is plain jax.jit: {why}; {self._public[0]}")
            elif not forced:
                self._warn(f"jgsess.jit takes its public road: {why}")
            return chosen

    def _warn(self, text: str) -> None:
        if _config.strict():
            raise RuntimeError(f"{text} (JGSESS_STRICT=1)")
        if text not in self._warned:
            self._warned.add(text)
            warnings.warn(text, JgsessFallbackWarning, stacklevel=4)


ROADS = Roads()

# the cycle collector, paused while any thread runs the pipeline
_collector = {"pausers": 0, "was_enabled": False}
_collector_lock = threading.Lock()


@contextlib.contextmanager
def collector_paused():
    with _collector_lock:
        if _collector["pausers"] == 0:
            _collector["was_enabled"] = gc.isenabled()
            gc.disable()
        _collector["pausers"] += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector["pausers"] -= 1
            if _collector["pausers"] == 0 and _collector["was_enabled"]:
                gc.enable()


def named(fun: Callable, attr: str):
    """`fun`'s attribute, or that of the function a partial (of a partial...) wraps."""
    while not hasattr(fun, attr) and isinstance(fun, functools.partial):
        fun = fun.func
    return getattr(fun, attr, None)


def copy_names(fun: Callable, body) -> None:
    """What jax.jit copies from a function to its compiled one (its __dict__, name, qualified
    name, module, doc and annotations; a partial's named after the function it wraps), onto the
    body, from which jax.jit copies them."""
    body.__dict__.update(
        {k: v for k, v in getattr(fun, "__dict__", {}).items() if k != "__wrapped__"}
    )
    body.__name__ = named(fun, "__name__") or "<unnamed function>"
    body.__qualname__ = named(fun, "__qualname__") or body.__name__
    body.__module__ = getattr(fun, "__module__", "<unknown module>")
    body.__doc__ = getattr(fun, "__doc__", "") or ""
    body.__annotations__ = getattr(fun, "__annotations__", {})


def record(seconds: dict[str, float]) -> None:
    """The pipeline's time as jax.monitoring events: /jgsess/pipeline_duration (all of it) and
    /jgsess/{trace,passes,emit}_duration."""
    for part, duration in seconds.items():
        jax.monitoring.record_event_duration_secs(f"/jgsess/{part}_duration", duration)
    jax.monitoring.record_event_duration_secs("/jgsess/pipeline_duration", sum(seconds.values()))
