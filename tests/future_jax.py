"""Simulated jax releases that change jax.jit's private step, and what a user sees under them.

jgsess wraps `jax._src.pjit._infer_params` (jgsess/_compat/jit_hook.py). Each
scenario is a jax release that changes it: jax's own `jax/_src/pjit.py`, edited as the release
would edit it, is what `import jax` loads (every jax.jit function, jax's own included, is made
by the edited module):

    fifth-argument   the step takes a fifth argument, and its two callers pass it
    renamed          the step is renamed (`_infer_params` is gone)
    three-values     the step returns three values, and its callers unpack three
    not-called       the callers call a copy of the step under another name;
                     `_infer_params` is kept, never called
    no-public-road   renamed, and `jax.extend.core.jaxpr_as_fun` is gone too

`python -m tests.future_jax SCENARIO` runs, under one, what a user runs: `import jgsess`, plain
`jax.jit` and optax's init (never jgsess's), and an optax AdamW step under `jgsess.jit`
against `jax.jit`; it prints what happened as one JSON line.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import warnings

SCENARIOS = ("fifth-argument", "renamed", "three-values", "not-called", "no-public-road")

# the step's definition, and its callers' calls (cache_miss in _cpp_pjit, jit_trace), as jax
# 0.7 to 0.11 write them
_DEFINITION = "def _infer_params("
_CALLS = (
    "p, args_flat = _infer_params(fun, jit_info, args, kwargs)",
    "p, args_flat = _infer_params(jit_func._fun, jit_func._jit_info, args, kwargs)",
)


def _edit(source: str, scenario: str) -> str:
    """jax's pjit.py as `scenario`'s release would have it."""
    if source.count(_DEFINITION) != 1 or not all(source.count(call) == 1 for call in _CALLS):
        raise RuntimeError("this jax's pjit.py does not define and call _infer_params as expected")
    calls = {call: call for call in _CALLS}
    added = ""
    if scenario == "fifth-argument":
        source = source.replace(_DEFINITION, "def _infer_params_four(")
        calls = {call: call.replace("args, kwargs)", "args, kwargs, None)") for call in _CALLS}
        added = (
            "def _infer_params(fun, ji, args, kwargs, options):\n"
            "    assert options is None\n"
            "    return _infer_params_four(fun, ji, args, kwargs)\n"
        )
    elif scenario in ("renamed", "no-public-road"):
        source = source.replace(_DEFINITION, "def _infer_params_v2(")
        calls = {call: call.replace("_infer_params(", "_infer_params_v2(") for call in _CALLS}
    elif scenario == "three-values":
        source = source.replace(_DEFINITION, "def _infer_params_two(")
        calls = {call: call.replace("p, args_flat =", "p, args_flat, _ =") for call in _CALLS}
        added = "def _infer_params(*args):\n    return (*_infer_params_two(*args), None)\n"
    elif scenario == "not-called":
        calls = {call: call.replace("_infer_params(", "_infer_params_v2(") for call in _CALLS}
        added = "_infer_params_v2 = _infer_params\n"
    else:
        raise ValueError(f"unknown scenario {scenario!r}; one of {SCENARIOS}")
    for call, edited in calls.items():
        source = source.replace(call, edited)
    return source + "\n\n" + added


class _Release(importlib.abc.MetaPathFinder):
    """Loads jax._src.pjit from its source, edited (never from its cached bytecode)."""

    def __init__(self, scenario: str):
        self.scenario = scenario

    def find_spec(self, name, path, target=None):
        if name != "jax._src.pjit":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = _EditedLoader(name, spec.origin, self.scenario)
        return spec


class _EditedLoader(importlib.machinery.SourceFileLoader):
    def __init__(self, name: str, path: str, scenario: str):
        super().__init__(name, path)
        self.scenario = scenario

    def get_code(self, fullname):
        source = _edit(self.get_source(fullname), self.scenario)
        return compile(source, self.path, "exec", dont_inherit=True)


def simulate(scenario: str) -> None:
    """Make the next `import jax` load `scenario`'s release (before jax is imported)."""
    if "jax" in sys.modules:
        raise RuntimeError("simulate() must run before jax is imported")
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {SCENARIOS}")
    sys.meta_path.insert(0, _Release(scenario))
    if scenario == "no-public-road":
        import jax.extend.core

        del jax.extend.core.jaxpr_as_fun


def what_a_user_sees() -> dict:
    """Import jgsess and run what a user runs; each outcome, or the error it raised."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    seen: dict = {}

    def attempt(name, fn):
        try:
            seen[name] = fn()
        except Exception as err:  # noqa: BLE001 - the outcome reported, whatever it is
            seen[name] = f"{type(err).__name__}: {err}"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attempt("import", lambda: __import__("jgsess") and "ok")
        attempt("plain jax.jit", lambda: float(jax.jit(lambda x: x + 1)(1.0)))
        params = {"w": jnp.linspace(-1.0, 1.0, 4097).reshape(17, 241), "b": jnp.ones(33)}
        grads = jax.tree.map(lambda p: jnp.cos(p) * 0.1, params)
        opt = optax.adamw(1e-3, weight_decay=1e-2)
        attempt("optax init", lambda: opt.init(params) and "ok")

        def step(params, state, grads):
            updates, state = opt.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        def fused():
            import jgsess

            fn = jgsess.jit(step)
            state = opt.init(params)
            got, want = fn(params, state, grads), jax.jit(step)(params, state, grads)
            close = all(
                np.allclose(a, b, rtol=1e-6, atol=1e-7)
                for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))
            )
            seen["road"] = type(fn._jgsess_body).__name__
            seen["adamw kernel"] = "jgsess_adamw" in fn.lower(params, state, grads).as_text()
            return "jax.jit's numbers" if close else "other numbers"

        attempt("jgsess.jit step", fused)
    seen["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    return seen


if __name__ == "__main__":
    simulate(sys.argv[1])
    print(json.dumps(what_a_user_sees()))
