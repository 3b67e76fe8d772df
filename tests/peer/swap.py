"""A pytest plugin that runs JAX's own jit tests with `jax.jit` replaced by `jgsess.jit`.

JAX's test files are read in place (never copied): each is executed with an `__import__` of its
own, under which `jax`, `jax._src` and `jax._src.api` are stand-ins whose `jit` (and `api`) is
jgsess's. So every `jax.jit`, `jit` (`from jax import jit`) and `api.jit` the test file writes,
at import time (decorators, parameter lists) and in its tests, is `jgsess.jit`; jax itself,
jax's test utilities and jgsess keep the real `jax.jit`.

    python -m pytest -p tests.peer.swap --jit=jgsess PEER/tests/api_test.py

`--jit=jax` runs the same files through the same importer with nothing replaced: the baseline.

The bar: every test that passes under jax.jit passes under the swap. Tests listed in
`expected.py` are marked xfail: those that fail under plain jax here (not strict), and the few
where jgsess cannot equal jax.jit (strict: one that starts to pass fails the run, so the list
is kept true), on its public road (JGSESS_ROAD=public) a few more.
"""

from __future__ import annotations

import builtins
import importlib
import sys
import types

import pytest

from tests.peer import expected


def pytest_addoption(parser):
    parser.addoption(
        "--jit",
        choices=("jgsess", "jax"),
        default="jgsess",
        help="the jit JAX's test files get: jgsess.jit (the swap) or jax.jit (the baseline)",
    )


class _StandIn(types.ModuleType):
    """`module`, with some attributes replaced; the rest read through to the module."""

    def __init__(self, module: types.ModuleType, replaced: dict):
        super().__init__(module.__name__, module.__doc__)
        self.__dict__.update(replaced)
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)


def _stand_ins() -> dict[str, types.ModuleType]:
    import jax
    from jax._src import api

    import jgsess

    swapped_api = _StandIn(api, {"jit": jgsess.jit})
    return {
        "jax": _StandIn(jax, {"jit": jgsess.jit}),
        "jax._src": _StandIn(importlib.import_module("jax._src"), {"api": swapped_api}),
        "jax._src.api": swapped_api,
    }


def _importer(stand_ins: dict[str, types.ModuleType]):
    real = builtins.__import__

    def swapping_import(name, globals=None, locals=None, fromlist=(), level=0):
        module = real(name, globals, locals, fromlist, level)
        if level:
            return module
        # `import a.b` binds `a` (fromlist empty); `from a.b import c` reads c from `a.b`
        key = name if fromlist else name.partition(".")[0]
        return stand_ins.get(key, module)

    return swapping_import


class _SwappedModule(pytest.Module):
    def _getobj(self):
        name = self.path.stem
        module = types.ModuleType(name)
        module.__file__ = str(self.path)
        stand_ins = _stand_ins() if self.config.getoption("jit") == "jgsess" else {}
        module.__builtins__ = {**builtins.__dict__, "__import__": _importer(stand_ins)}
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        code = compile(self.path.read_text(), str(self.path), "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102 - JAX's test file, executed as an import
        return module


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path, parent):
    if module_path.suffix == ".py":
        return _SwappedModule.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(config, items):
    from jgsess import _config

    swapped = config.getoption("jit") == "jgsess"
    differ = dict(expected.DIFFER_UNDER_JGSESS)
    if _config.road() == "public":
        differ.update(expected.DIFFER_ON_THE_PUBLIC_ROAD)
    for item in items:
        name = item.nodeid.rsplit("/", 1)[-1]
        if name in expected.FAIL_UNDER_JAX:
            item.add_marker(pytest.mark.xfail(reason=expected.FAIL_UNDER_JAX[name], strict=False))
        elif swapped and name in differ:
            item.add_marker(pytest.mark.xfail(reason=differ[name], strict=True))
