"""`jgsess.jit`: a drop-in for `jax.jit` that runs the session pipeline on the traced program.

`jgsess.jit(fun, **options)` returns `jax.jit(_Body(fun), **options)`: jax's own compiled
function, so every option, attribute, cache and error is jax's. `_Body` runs inside jax.jit's
trace: it traces `fun` to a jaxpr on jax.jit's tracers, optimizes it and evaluates the result.

    jgsess.jit(f) -> PjitFunction(_Body(f)) + .report / .plain, __wrapped__ = f
                                   |  one _Body per (f, donation), shared by every jgsess.jit(f)
                                   v  so jax's trace and executable caches are shared too
                     make_jaxpr(f)(*tracers) -> compile_jaxpr -> bind into jax.jit's trace

The body holds `f` weakly (the jitted function holds it strongly): no reference cycles, and
`f`'s closure is freed when the last jitted function of it goes.
"""

from __future__ import annotations

import functools
import gc
import inspect
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax

from . import _compat, _config, platforms
from .report import Report
from .session import Session, compile_jaxpr

# the body's frames (its call and its trace of the user's function) stay out of the tracebacks
# of errors raised in user code, as jax.jit's own frames do
_compat.hide_from_tracebacks(__file__)

# jax.jit's parameters. jgsess reads the donation and static ones itself (to know which leaves
# are donated); the others only concern jax.jit, which gets every option as given.
_SIGNATURE = inspect.signature(jax.jit)
READ = frozenset({"static_argnums", "static_argnames", "donate_argnums", "donate_argnames"})


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


def _index_tuple(x) -> tuple:
    return (x,) if isinstance(x, (int, str)) else tuple(x)


def _donation(fun: Callable, options: dict) -> tuple[frozenset, frozenset]:
    """Donated positions and keyword names, completed from the signature as jax.jit does:
    given only numbers, the names follow, and the other way round."""
    nums, names = options.get("donate_argnums"), options.get("donate_argnames")
    if nums is None and names is None:
        return frozenset(), frozenset()
    nums = () if nums is None else _index_tuple(nums)
    names = () if names is None else _index_tuple(names)
    if options.get("donate_argnums") is None or options.get("donate_argnames") is None:
        try:
            params = list(inspect.signature(fun).parameters.values())
        except (TypeError, ValueError):  # builtins: jax.jit takes numbers only, as is
            params = []
        either = [(i, p.name) for i, p in enumerate(params) if p.kind is p.POSITIONAL_OR_KEYWORD]
        if options.get("donate_argnums") is None:
            nums = tuple(i for i, name in either if name in names)
        else:
            names = tuple(name for i, name in either if i in nums)
    return frozenset(nums), frozenset(names)


class _Body:
    """The function jax.jit traces: `fun`'s jaxpr, optimized, evaluated on jax.jit's tracers.

    `__wrapped__` is `fun` (jax takes the signature, name and source line from it), held weakly.

    The body's own state lives in slots, so that its `__dict__` holds only what it copies from
    `fun` (and jax.jit copies on to the compiled function). A function made by wrapping another
    jitted one (`jax.grad(jgsess.jit(f))`) carries that one's attributes in its `__dict__`;
    copied into a `__dict__` that also held the state, they would make this body run `f`.
    """

    __slots__ = (
        "_ref",
        "_weakly_referenceable",
        "_options",
        "_donate_nums",
        "_donate_names",
        "_plan",
        "_compiler_options",
        "_pinned",
        "_warned",
        "sessions",
        "compiled",
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
        self._weakly_referenceable = True
        try:
            self._ref = weakref.ref(fun)
        except TypeError:  # held strongly, never cached; jax.jit raises when it is called
            self._ref = lambda: fun
            self._weakly_referenceable = False
        self._options = options  # jax.jit's, as given: `fun` is traced under them
        self._donate_nums, self._donate_names = _donation(fun, options)
        self._plan = plan  # compute the whole-program memory plan (report, dumps)
        # jax.jit's compiler options, as sorted (name, value) pairs
        self._compiler_options = tuple(sorted((options.get("compiler_options") or {}).items()))
        # the device jax.jit's options place the program on, or None
        self._pinned = platforms.pinned_device(options)
        self._warned = plan  # a report states a fallback itself
        self.sessions: list[Session] | None = [] if plan else None
        # signatures (see _signature) this body has compiled; a report's body (`reports`: the
        # body it reports on) measures no kernel for a signature that body compiled, so it shows
        # the decisions that program was compiled with
        self.compiled: set[tuple] = set()
        self._reports = reports
        _copy_names(fun, self)

    @property
    def __wrapped__(self):
        return self._ref()

    def __repr__(self) -> str:  # jax's error messages name the user's function
        return repr(self._ref())

    def __call__(self, *args, **kwargs):
        # the cycle collector is off while the program is traced and optimized: the pipeline
        # makes many small objects, and the collections they triggered (each walking every
        # object jax holds) took a large share of its time on large programs
        # (benchmarks/compile_time.py)
        if not self._weakly_referenceable:
            weakref.ref(self._ref())  # jax.jit's TypeError: "cannot create weak reference ..."
        if jax.config.jax_disable_jit:  # jax.jit calls the body op by op: so does the body
            return self._ref()(*args, **kwargs)
        collecting = gc.isenabled()
        gc.disable()
        try:
            flat, treedef = jax.tree.flatten((args, kwargs))
            dynamic = [i for i, leaf in enumerate(flat) if isinstance(leaf, jax.Array)]
            donated = self._donated(args, kwargs)
            signature = _signature(treedef, flat, dynamic)
            start = time.perf_counter()
            closed, lifted, out_tree = self._trace(args, kwargs, flat, treedef, dynamic)
            traced = time.perf_counter() - start
            outs, session = self._run(
                closed,
                [False] * len(lifted) + [donated[i] for i in dynamic],
                None
                if self._reports is not None and _contains(self._reports.compiled, signature)
                else traced,
                lifted + [flat[i] for i in dynamic],
            )
            _add(self.compiled, signature)
            session.seconds = {"trace": traced, **session.seconds}
            _record(session.seconds)
            if self.sessions is not None:
                self.sessions.append(session)
            return jax.tree.unflatten(out_tree, outs)
        finally:
            if collecting:
                gc.enable()

    def _trace(self, args: tuple, kwargs: dict, flat: list, treedef, dynamic: list[int]):
        """`fun`'s jaxpr on these arguments, traced as `jax.jit(fun, **options)` traces it: a
        trace jax already holds (from `jax.eval_shape(fun)`, `jax.jit(fun)` or an earlier
        jgsess.jit body) is reused, and one made here serves them. Returns the ClosedJaxpr
        (inputs: the enclosing traces' tracers it closes over, then the arrays), those tracers
        and the results' tree.

        Static arguments whose `__eq__` raises are closed over instead: jax's caches would
        compare them with jax.jit's own entry for this call (equal hashes) and raise, where
        jax.jit, looking them up once, runs."""
        fun, arrays = self._ref(), set(dynamic)
        if all(_comparable(leaf) for i, leaf in enumerate(flat) if i not in arrays):
            with warnings.catch_warnings():  # jax.jit's option warnings came with jgsess.jit
                warnings.simplefilter("ignore")
                traceable = jax.jit(fun, **self._options)
        else:

            def flat_fun(*values):
                leaves = list(flat)
                for i, value in zip(dynamic, values):
                    leaves[i] = value
                a, k = jax.tree.unflatten(treedef, leaves)
                return fun(*a, **k)

            traceable = jax.jit(flat_fun)
            args, kwargs = tuple(flat[i] for i in dynamic), {}
        # jax explains cache misses of the traced function (this body, named as fun), not of
        # the pipeline's own traces
        with jax.explain_cache_misses(False):
            traced = traceable.trace(*args, **kwargs)
        lifted = _compat.traced_consts(traced)
        _compat.reject_escaped_tracers(lifted)
        return traced.jaxpr, lifted, jax.tree.structure(traced.out_info)

    def _donated(self, args: tuple, kwargs: dict) -> list[bool]:
        """Per leaf of (args, kwargs): whether it is donated."""
        marks = (
            [jax.tree.map(lambda _, i=i: i in self._donate_nums, a) for i, a in enumerate(args)],
            {k: jax.tree.map(lambda _, k=k: k in self._donate_names, v) for k, v in kwargs.items()},
        )
        return [bool(m) for m in jax.tree.leaves(marks)]

    def _run(self, closed, donated: list[bool], traced: float | None, args: list):
        """The optimized program's results on `args` (bound into jax.jit's trace) and its
        Session; on a pipeline failure, `closed`'s own results. `traced`: the trace's seconds,
        None where no kernel may be measured."""
        try:
            with jax.explain_cache_misses(False):
                program, session = compile_jaxpr(
                    closed,
                    name=self.__name__,
                    donated=donated,
                    pinned=self._pinned,
                    plan=self._plan,
                    traced=traced,
                    compiler_options=self._compiler_options,
                    outermost=_compat.traced_at_top_level(),
                )
            emitting = time.perf_counter()
            outs = program(args)
            session.seconds["emit"] = time.perf_counter() - emitting
            return outs, session
        except Exception as err:  # noqa: BLE001 - any pipeline failure falls back
            if _config.strict():
                raise
            self._fall_back(err)
            fallback = f"{type(err).__name__}: {err}"
            platform = platforms.program_platform(self._pinned)
            session = Session(self.__name__, platform, fallback=fallback)
            return _compat.jaxpr_as_fun(closed)(*args), session

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


def _signature(treedef, flat: list, dynamic: list[int]) -> tuple:
    """What tells one compilation of a body from another: the tree, the arrays' types, and the
    other leaves (static arguments; by identity where they are not hashable)."""
    arrays = set(dynamic)
    return (
        treedef,
        tuple(jax.typeof(x) if i in arrays else _hashable(x) for i, x in enumerate(flat)),
    )


def _add(compiled: set, signature: tuple) -> None:
    """Records a compiled signature; one whose static arguments cannot be compared (their
    __eq__ raises) is not recorded: jax.jit's own cache raises its error for them."""
    try:
        compiled.add(signature)
    except Exception:  # noqa: BLE001 - the user's __eq__, whatever it raises
        pass


def _contains(compiled: set, signature: tuple) -> bool:
    try:
        return signature in compiled
    except Exception:  # noqa: BLE001 - the user's __eq__, whatever it raises
        return False


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


def _comparable(leaf) -> bool:
    try:
        leaf == leaf  # noqa: B015, PLR0124 - whether the user's __eq__ raises
    except Exception:  # noqa: BLE001 - the user's __eq__, whatever it raises
        return False
    return True


def _hashable(leaf):
    try:
        hash(leaf)
    except TypeError:
        return id(leaf)
    return leaf


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
    jitted = jax.jit(body, **options)
    jitted.__wrapped__ = fun
    jitted._jgsess_body = body
    jitted.plain = lambda: plain
    jitted.plain.__doc__ = "`jax.jit` of the same function and options: the baseline."
    jitted.report = functools.partial(_report, fun, body, options, plain)
    return jitted


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
