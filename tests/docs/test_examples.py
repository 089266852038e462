"""Every code example of README.md and docs/ runs, page by page.

One test per page (id: the page's path relative to the repository).  In a fresh
temporary directory, with one Python namespace per page, the page's pieces run in order:

* fenced blocks with info string ``python`` are ``exec``'d (compiled with the filename
  ``<page>:<line>``, so a traceback points at the doc line);
* fenced blocks with info string ``sh`` run under ``bash -euo pipefail -c`` with the
  virtual environment's ``bin`` first on ``PATH``; a non-zero exit fails the test;
* hidden setup, an HTML comment ``<!-- setup`` ... ``-->``, is exec'd as Python;
* ``<!-- skip: REASON -->`` on the line right before a fence skips that block (a reason is
  required; the skipped blocks are printed);
* ``<!-- fixtures: a, b -->`` requests those pytest fixtures and puts them in the
  namespace as the dict ``fixtures``; a page that asks for ``spark`` is marked ``spark``.

Other blocks (``text``, ``console``, ``toml``, ...) are not run.  ``os.environ`` and the
working directory are restored after each page.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
VENV_BIN = Path(sys.executable).parent  # .venv/bin (not resolved: a venv's python is a symlink)

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_SKIP = re.compile(r"^<!--\s*skip:(?P<reason>.*?)-->\s*$")
_FIXTURES = re.compile(r"<!--\s*fixtures:(?P<names>[^>]*?)-->")
_SETUP_START = re.compile(r"^<!--\s*setup\s*$")
SH_TIMEOUT = 300


@dataclasses.dataclass
class Block:
    kind: str  # "python", "sh", "setup" or "other"
    line: int  # 1-based line of the first line of code
    code: str
    info: str = ""
    skip: str | None = None  # the reason, when skipped


@dataclasses.dataclass
class Page:
    path: Path
    blocks: list[Block]
    fixtures: list[str]
    skip_comments: list[tuple[int, str]]  # (line, reason) of every skip comment

    @property
    def name(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    def runnable(self) -> list[Block]:
        return [b for b in self.blocks if b.kind in ("python", "sh", "setup") and b.skip is None]


def parse_page(path: Path) -> Page:
    """The blocks, hidden setup and fixtures of one Markdown page, in document order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    skips: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            marker = fence["fence"]
            info = fence["info"].strip()
            close = re.compile(rf"^ {{0,3}}{marker[0]}{{{len(marker)},}}\s*$")
            j = i + 1
            while j < len(lines) and not close.match(lines[j]):
                j += 1
            word = info.split()[0] if info else ""
            kind = word if word in ("python", "sh") else "other"
            skip = None
            previous = _SKIP.match(lines[i - 1].strip()) if i > 0 else None
            if previous:
                skip = previous["reason"].strip()
            blocks.append(Block(kind, i + 2, "\n".join(lines[i + 1 : j]) + "\n", info, skip))
            i = j + 1
            continue
        stripped = line.strip()
        skip = _SKIP.match(stripped)
        if skip:
            skips.append((i + 1, skip["reason"].strip()))
        elif stripped.startswith("<!--") and "skip:" in stripped:
            skips.append((i + 1, ""))  # malformed: reported by test_collection
        if _SETUP_START.match(stripped):
            j = i + 1
            while j < len(lines) and lines[j].strip() != "-->":
                j += 1
            blocks.append(Block("setup", i + 2, "\n".join(lines[i + 1 : j]) + "\n"))
            i = j + 1
            continue
        i += 1
    text = "\n".join(lines)
    fixtures = [n.strip() for m in _FIXTURES.finditer(text) for n in m["names"].split(",") if n.strip()]
    return Page(path, blocks, fixtures, skips)


def pages() -> list[Page]:
    found = [ROOT / "README.md"]
    if DOCS.is_dir():
        found += sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)
    return [parse_page(p) for p in found]


PAGES = pages()


def _params() -> list:
    params = []
    for page in PAGES:
        # every page together takes minutes: `make test` runs them, `make test-quick` does not
        marks = [pytest.mark.slow] + ([pytest.mark.spark] if "spark" in page.fixtures else [])
        params.append(pytest.param(page, marks=marks, id=page.name))
    return params


def _run_sh(page: Page, block: Block, cwd: Path) -> None:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=SH_TIMEOUT,
    )  # fmt: skip
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        pytest.fail(
            f"{page.name}:{block.line}: sh block exited with status {proc.returncode}\n"
            f"--- block ---\n{block.code}--- output ---\n{proc.stdout}",
            pytrace=False,
        )


def _exec_python(page: Page, block: Block, namespace: dict) -> None:
    # Leading newlines keep the doc's line numbers in tracebacks.
    source = "\n" * (block.line - 1) + block.code
    filename = f"{page.name}:{block.line}"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec")
    exec(code, namespace)  # noqa: S102 - the examples are this repository's own documentation


@pytest.mark.parametrize("page", _params())
def test_page(page: Page, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    fixtures = {name: request.getfixturevalue(name) for name in page.fixtures}
    skipped = [b for b in page.blocks if b.skip is not None]
    for block in skipped:
        print(f"skipped {page.name}:{block.line} ({block.kind}): {block.skip}")
    environ = dict(os.environ)
    cwd = os.getcwd()
    namespace: dict = {"__name__": "__doc_example__", "fixtures": fixtures}
    os.chdir(tmp_path)
    try:
        for block in page.runnable():
            if block.kind == "sh":
                _run_sh(page, block, tmp_path)
            else:
                _exec_python(page, block, namespace)
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)


def test_collection() -> None:
    """The collection itself: pages and blocks are found, skips carry reasons."""
    names = [p.name for p in PAGES]
    assert "README.md" in names
    readme = next(p for p in PAGES if p.name == "README.md")
    runnable = [b for b in readme.runnable() if b.kind in ("python", "sh")]
    assert len(runnable) >= 5, f"README.md: only {len(runnable)} example blocks would run"
    assert any(n.startswith("docs/") for n in names), "no docs/**/*.md page found"
    for page in PAGES:
        for line, reason in page.skip_comments:
            assert reason, f"{page.name}:{line}: '<!-- skip: REASON -->' needs a reason"
        dangling = {line for line, _ in page.skip_comments} - {b.line - 2 for b in page.blocks if b.skip is not None}
        assert not dangling, f"{page.name}: skip comment(s) at line(s) {sorted(dangling)} not directly before a fence"
    total = sum(len(p.runnable()) for p in PAGES)
    assert total >= 20, f"only {total} blocks would run in {len(PAGES)} pages"
