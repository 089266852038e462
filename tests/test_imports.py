"""The package's import graph has no circle, and every module imports on its own.

An import circle ties modules that should sit one above the other (docs/architecture.md
says which may import which); it also makes the outcome of an import depend on which
module was imported first.  The graph is read from the source: every ``import`` of an
icecrypt module, at module level or inside a function (a deferred import is still an
arrow), except under ``if TYPE_CHECKING:``.  ``from package import name`` counts as an
arrow to ``package.name`` when that is a module, else to the package.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import icecrypt

SRC = Path(icecrypt.__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "icecrypt").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _module_of(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_only(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return ids


def _imports(name: str, path: Path) -> dict[str, int]:
    """The icecrypt modules ``name`` imports, each with the line of its first import."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = _type_checking_only(tree)
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_module_of(a.name) for a in node.names if a.name.split(".")[0] == "icecrypt"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base.split(".")[0] == "icecrypt":
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else _module_of(base) for a in node.names]
        for target in targets:
            if target is not None and target != name:
                found.setdefault(target, node.lineno)
    return found


def _circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_import_circle():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    circles = _circles(graph)
    lines = []
    for circle in circles:
        members = set(circle)
        lines.append(" <-> ".join(circle))
        for name in circle:
            for target, line in sorted(graph[name].items()):
                if target in members:
                    lines.append(f"    {MODULES[name].relative_to(SRC)}:{line} imports {target}")
    assert not circles, "import circles (docs/architecture.md: what each layer may import):\n" + "\n".join(lines)


def test_the_circle_finder_finds_circles():
    """The check itself: a circle through a deferred import is found, a chain is not."""
    assert _circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) == []
    source = "def f():\n    from icecrypt.ags1 import encrypt\n"
    tree = ast.parse(source)
    assert not _type_checking_only(tree)


#: What the forking server below imports before it forks a child per module: the
#: third-party modules that make up most of the import time of icecrypt's modules (Arrow,
#: Spark's Python API, PyIceberg with pandas and pydantic under it: seconds per child
#: otherwise).  This check is about icecrypt's own order: a child has loaded nothing of
#: icecrypt's when it imports the module.  What preloading could hide is a module that
#: reaches a third-party submodule as an attribute (``pa.dataset``) without importing it;
#: icecrypt imports what it uses by name (``import pyarrow.dataset as ds``), and
#: test_no_bare_submodule_attribute below checks that.
PRELOAD = ("pyarrow", "pyarrow.dataset", "pyarrow.parquet", "pyarrow.compute", "pyspark", "pyspark.sql",
           "pyiceberg.table", "pyiceberg.io.pyarrow", "pyiceberg.expressions")

_SERVER = r"""
import json, os, sys, traceback
assert not [m for m in sys.modules if m.split(".")[0] == "icecrypt"], "icecrypt loaded before the fork"
for _name in sys.argv[1:]:
    __import__(_name)
assert not [m for m in sys.modules if m.split(".")[0] == "icecrypt"], "a preloaded module loaded icecrypt"
print("ready", flush=True)
for line in sys.stdin:
    name = line.strip()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a fresh start as far as icecrypt is concerned: the module is its first import
        os.close(r)
        os.dup2(w, 2)
        code = 1
        try:
            __import__(name)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    err = b"".join(chunks).decode("utf-8", "replace")[-2000:]
    print(json.dumps([name, os.waitstatus_to_exitcode(status), err]), flush=True)
"""


def _import_each(names: list[str], preload: tuple[str, ...] = PRELOAD) -> list[tuple[str, int, str]]:
    """Each of ``names`` imported first in a child forked from a server that has loaded
    only ``preload`` (never icecrypt), one child per module."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, *preload], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        results = []
        for name in names:
            proc.stdin.write(name + "\n")
            proc.stdin.flush()
            results.append(tuple(json.loads(proc.stdout.readline())))
        return results
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_module_imports_in_a_fresh_interpreter():
    """Each module imported first, alone, in an interpreter that has imported nothing of
    icecrypt's (what a Spark worker or a user's script does): an import that only works
    after another module was imported first fails here."""
    modules = [name for name in MODULES if not name.endswith("__main__")]
    workers = max(1, min(2, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        shares = list(pool.map(_import_each, [modules[i::workers] for i in range(workers)]))
    results = [r for share in shares for r in share]
    assert sorted(name for name, _, _ in results) == sorted(modules)
    failed = [f"{name} (exit {rc}):\n{err}" for name, rc, err in results if rc != 0]
    assert not failed, "\n".join(failed)


def test_the_import_check_fails_on_a_module_that_needs_another_first(tmp_path, monkeypatch):
    """The check itself: a module that only imports after another was imported fails in
    its child, with the traceback (each child starts from the server, not from the child
    before it); the module it needs imports."""
    package = tmp_path / "needsfirst"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text("import sys\nsys.modules[__package__].ready = True\n")
    (package / "user.py").write_text("import sys\nassert sys.modules[__package__].ready\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (_, rc_alone, err), (_, rc_base, _), = _import_each(["needsfirst.user", "needsfirst.base"], preload=())
    assert rc_alone == 1 and "has no attribute 'ready'" in err
    assert rc_base == 0


def _loaded_by_import(package: str) -> set[str]:
    """The modules a fresh interpreter has after ``import package``."""
    out = subprocess.run([sys.executable, "-c", f"import sys, {package}; print(*sorted(sys.modules))"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return set(out.split())


@pytest.mark.slow
def test_no_bare_submodule_attribute():
    """What the preloading server could hide: ``import pyarrow as pa`` then ``pa.dataset``
    in a module that never imports ``pyarrow.dataset`` (it works only when something else
    loaded it first).  Every attribute chain on a name bound by ``import <package>`` that
    names a submodule of a preloaded package must name one the module imports itself or
    one that importing the package loads anyway."""
    roots = sorted({name.split(".")[0] for name in PRELOAD})
    loaded = {root: _loaded_by_import(root) for root in roots}
    problems = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        bound: dict[str, str] = {}  # local name -> package it is bound to
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    imported.add(alias.name)
                    if alias.name.split(".")[0] in roots:
                        bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound):
                continue
            package = bound[node.value.id]
            target = f"{package}.{node.attr}"
            if target in imported or target in loaded[package.split(".")[0]]:
                continue
            if importlib.util.find_spec(package) and _is_module(target):
                problems.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value.id}.{node.attr} is the module "
                                f"{target}, which this module does not import")
    assert not problems, "\n".join(problems)


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def test_lazy_exports_match_their_type_checking_imports():
    """A package that imports its public names on first use (``_EXPORTS`` and a module
    ``__getattr__``) names the same modules under ``if TYPE_CHECKING:``, for type checkers,
    and every name resolves."""
    import importlib

    checked = 0
    for name, path in MODULES.items():
        if path.name != "__init__.py" or "_EXPORTS = {" not in path.read_text(encoding="utf-8"):
            continue
        package = importlib.import_module(name)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typed = {alias.asname or alias.name: node.module for block in tree.body
                 if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                 for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
        assert typed == package._EXPORTS, f"{name}: _EXPORTS and the TYPE_CHECKING imports differ"
        assert sorted(package.__all__) == sorted(package._EXPORTS)
        for attr, module in package._EXPORTS.items():
            assert getattr(package, attr) is getattr(importlib.import_module(module), attr)
        checked += 1
    assert checked, "no package with _EXPORTS found"
