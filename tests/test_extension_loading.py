"""A jgsess._C that cannot be loaded, for any reason (missing, built for another system, failing
in its own init), leaves jgsess importable: fused nodes run their pure-JAX references, with a
warning naming the cause and the fix; JGSESS_STRICT=1 raises instead."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a finder that makes importing jgsess._C fail as a broken build does
BREAK = """
import importlib.abc, sys
class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "jgsess._C":
            raise {error}
sys.meta_path.insert(0, Broken())
import warnings
warnings.simplefilter("always")
import jax, jax.numpy as jnp, optax, jgsess
opt = optax.sgd(0.1, momentum=0.9)
p = {{"w": jnp.ones(3)}}
step = jgsess.jit(lambda p, s, g: opt.update(g, s, p))
print("result", [round(v, 6) for v in step(p, opt.init(p), p)[0]["w"].tolist()])
"""

ERRORS = {
    "missing": 'ImportError("No module named jgsess._C")',
    "another system": 'OSError("/lib/libstdc++.so.6: version `GLIBCXX_3.4.32\' not found")',
    "failing init": 'RuntimeError("pybind11 init failed")',
}


def run(error: str, strict: str):
    env = {**os.environ, "JGSESS_STRICT": strict, "PYTHONPATH": ROOT}
    code = BREAK.format(error=error)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("cause", sorted(ERRORS))
def test_a_broken_extension_falls_back_with_a_warning_naming_cause_and_fix(cause):
    done = run(ERRORS[cause], "0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "result [-0.1, -0.1, -0.1]" in done.stdout
    assert "jgsess._C could not be loaded" in done.stderr
    assert ERRORS[cause].split("(")[0] in done.stderr  # the cause, by its type
    assert "pip install --no-build-isolation -e ." in done.stderr  # the fix


def test_strict_mode_raises_the_cause():
    done = run(ERRORS["another system"], "1")
    assert done.returncode != 0
    assert "GLIBCXX_3.4.32" in done.stderr
