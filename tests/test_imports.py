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


def _import_alone(name: str) -> tuple[str, int, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, env=env,
                          timeout=300)
    return name, proc.returncode, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~80 interpreters, some importing pyspark: a minute on a quiet machine
def test_every_module_imports_in_a_fresh_interpreter():
    """Each module imported first, alone, in a new interpreter (what a Spark worker or a
    user's script does): an import that only works after another module was imported
    first fails here."""
    modules = [name for name in MODULES if not name.endswith("__main__")]
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        results = list(pool.map(_import_alone, modules))
    failed = [f"{name} (exit {rc}):\n{err}" for name, rc, err in results if rc != 0]
    assert not failed, "\n".join(failed)


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
