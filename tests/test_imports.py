"""The package's module graph has no cycles, counting every import statement (module level or
inside a function) between jgsess's modules."""

import ast
import os

import jgsess

PACKAGE = os.path.dirname(jgsess.__file__)


def modules() -> dict[str, str]:
    """Dotted module name -> file, for every module of jgsess (and its compiled extension)."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".so"):
                found[f"jgsess.{name.split('.')[0]}"] = ""
            elif name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), os.path.dirname(PACKAGE))
                dotted = rel[: -len(".py")].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = os.path.join(folder, name)
    return found


def parsed(path: str) -> ast.Module:
    with open(path) as f:
        return ast.parse(f.read())


def imports(module: str, path: str, known: set[str]) -> set[str]:
    """The jgsess modules `module` imports: `from a import b` counts a.b if it is a module,
    else a; `import a.b` counts a.b."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    if not path:
        return set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = ".".join(filter(None, [base if node.level else "", node.module or ""]))
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in known else source)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in known and m != module}


def test_no_import_cycles():
    files = modules()
    graph = {m: imports(m, path, set(files)) for m, path in files.items()}
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n) :] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_settings_are_read_in_one_place():
    """Only jgsess/_config.py reads the environment: every JGSESS_* setting is listed there."""
    readers = []
    for module, path in modules().items():
        if not path or module == "jgsess._config":
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                readers.append(f"{module}:{node.lineno}")
    assert readers == []
    csrc = os.path.join(os.path.dirname(PACKAGE), "csrc")
    assert os.path.isdir(csrc)
    for folder, _, files in os.walk(csrc):  # the shipped C++ takes its settings from Python
        if os.path.relpath(folder, csrc).split(os.sep)[0] == "testing":
            continue
        for name in files:
            with open(os.path.join(folder, name)) as f:
                assert "getenv" not in f.read(), os.path.join(folder, name)
    with open(os.path.join(PACKAGE, "_config.py")) as f:
        listed = f.read()
    for name in (
        "JGSESS_AUTOTUNE",
        "JGSESS_AUTOTUNE_CACHE",
        "JGSESS_AUTOTUNE_BUDGET",
        "JGSESS_SIMD",
    ):
        assert name in listed


def test_one_module_decides_kernel_or_xla():
    """The passes ask jgsess.selection, which measures through jgsess.autotune: no pass imports
    autotune, and selection imports no pass (no arrow back up)."""
    files = modules()
    graph = {m: imports(m, path, set(files)) for m, path in files.items()}
    passes = [m for m in graph if m.startswith("jgsess.passes")]
    assert [m for m in passes if "jgsess.autotune" in graph[m]] == []
    assert {"jgsess.passes.select_kernels", "jgsess.passes.bucket_all_reduce"} <= {
        m for m in passes if "jgsess.selection" in graph[m]
    }
    assert not any(m.startswith("jgsess.passes") for m in graph["jgsess.selection"])
