"""jax's vocabulary lives in jgsess/_compat/: no other module names the call-like primitives,
their params, the params that change between releases, or jax's private classes and modules."""

import ast
import os

import jgsess

PACKAGE = os.path.dirname(jgsess.__file__)
VOCABULARY = frozenset(
    {
        # nested jit and custom-derivative calls, their params
        "jit",
        "pjit",
        "custom_jvp_call",
        "custom_vjp_call",
        "custom_vjp_call_jaxpr",
        "call_jaxpr",
        "fun_jaxpr",
        "jaxpr",
        "branches",
        "cond_jaxpr",
        "body_jaxpr",
        "in_shardings",
        "out_shardings",
        "in_layouts",
        "out_layouts",
        "compiler_options_kvs",
        "jvp_jaxpr_fun",
        "jvp_jaxpr_thunk",
        "fwd_jaxpr_thunk",
        "bwd",
        "out_trees",
        # params that differ between releases
        "out_dtype",
        "new_dtype",
        "sharding",
        "out_sharding",
        "accuracy",
        # private classes
        "UnspecifiedValue",
        "DropVar",
    }
)


def strings(tree: ast.AST):
    """String constants that are not docstrings or `__all__` entries, with their lines."""
    skip = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            skip.update(id(n) for n in ast.walk(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in skip:
                yield node.lineno, node.value


def test_only_compat_names_jax_vocabulary():
    found = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or folder == os.path.join(PACKAGE, "_compat"):
                continue
            with open(path) as f:
                source = f.read()
            tree = ast.parse(source)
            rel = os.path.relpath(path, PACKAGE)
            found += [f"{rel}:{line}: {s!r}" for line, s in strings(tree) if s in VOCABULARY]
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr == "_src":
                    found.append(f"{rel}:{node.lineno}: ._src")
                if isinstance(node, ast.Compare) and any(  # a class recognised by its name
                    isinstance(n, ast.Attribute) and n.attr == "__name__"
                    for n in [node.left, *node.comparators]
                ):
                    found.append(f"{rel}:{node.lineno}: compares a __name__")
                if isinstance(node, ast.ImportFrom) and "_src" in (node.module or ""):
                    found.append(f"{rel}:{node.lineno}: imports {node.module}")
    assert not found, "jax vocabulary outside _compat:\n" + "\n".join(found)
