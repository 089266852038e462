"""A pyarrow filesystem that fails on purpose: a ``FileSystemHandler`` over a real local
filesystem (a ``SubTreeFileSystem`` rooted at a directory) that counts every call that
opens, reads, writes, closes, moves, copies, creates or deletes, and at the Nth call
raises ``OSError(EIO)``, raises ``OSError(ENOSPC)`` or kills the process (SIGKILL).

Use it through :func:`failing_filesystem`, which returns ``(pyarrow.fs.PyFileSystem,
handler)``.  ``handler.plan`` says what happens: ``FaultPlan(at=N, kind=...)``; with
``at=None`` nothing fails and ``handler.plan.calls`` records ``(operation, path)`` of each
counted call (the census a sweep starts from).

Metadata calls (``get_file_info``, listings, ``normalize_path``) are passed through
uncounted: they change nothing and icecrypt treats their failures like any other
``OSError`` of the call that follows.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = ["FaultPlan", "FailingHandler", "InjectedFault", "failing_filesystem", "KINDS"]

#: the three ways a call can fail
KINDS = ("error", "enospc", "kill")


class InjectedFault(OSError):
    """The OSError this filesystem raises (an ``OSError`` subclass, as storage errors are)."""


@dataclass
class FaultPlan:
    """Fail the ``at``-th counted call (1-based) in the way ``kind`` says; None = never."""

    at: int | None = None
    kind: str = "error"
    calls: list[tuple[str, str]] = field(default_factory=list)
    fired: tuple[str, str] | None = None

    def hit(self, operation: str, path: str) -> None:
        self.calls.append((operation, path))
        if self.at is None or len(self.calls) != self.at:
            return
        self.fired = (operation, path)
        n = len(self.calls)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "enospc":
            raise InjectedFault(errno.ENOSPC, f"injected: no space left on device at call {n} ({operation} {path})")
        raise InjectedFault(errno.EIO, f"injected: I/O error at call {n} ({operation} {path})")

    @property
    def count(self) -> int:
        return len(self.calls)


class _CountingOutput:
    """A writable raw file whose ``write`` and ``close`` are counted calls."""

    def __init__(self, stream: pa.NativeFile, plan: FaultPlan, path: str):
        self._stream, self._plan, self._path = stream, plan, path
        self.closed = False

    def write(self, data) -> int:
        self._plan.hit("write", self._path)
        return self._stream.write(data)

    def flush(self) -> None:
        self._stream.flush()

    def tell(self) -> int:
        return self._stream.tell()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True  # a failed close is not retried (the stream is gone, as in Arrow)
        try:
            self._plan.hit("close", self._path)
        finally:
            self._stream.close()


class _CountingInput:
    """A readable, seekable raw file whose ``read`` calls are counted."""

    def __init__(self, stream: pa.NativeFile, plan: FaultPlan, path: str):
        self._stream, self._plan, self._path = stream, plan, path
        self.closed = False

    def read(self, nbytes: int | None = None) -> bytes:
        self._plan.hit("read", self._path)
        return self._stream.read() if nbytes is None or nbytes < 0 else self._stream.read(nbytes)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()

    def seekable(self) -> bool:
        return self._stream.seekable()

    def size(self) -> int:
        return self._stream.size()

    def close(self) -> None:
        self.closed = True
        self._stream.close()


class FailingHandler(pafs.FileSystemHandler):
    """Delegates to ``base`` (any pyarrow filesystem); see the module docstring."""

    def __init__(self, base: pafs.FileSystem, plan: FaultPlan | None = None):
        self.base = base
        self.plan = plan or FaultPlan()

    def __eq__(self, other) -> bool:
        return isinstance(other, FailingHandler) and other.base.equals(self.base)

    def __ne__(self, other) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "failing"

    def normalize_path(self, path: str) -> str:
        return self.base.normalize_path(path)

    # --- uncounted metadata calls ---------------------------------------------------------

    def get_file_info(self, paths):
        return self.base.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.base.get_file_info(selector)

    # --- counted mutating calls ------------------------------------------------------------

    def create_dir(self, path: str, recursive: bool) -> None:
        self.plan.hit("create_dir", path)
        self.base.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.plan.hit("delete_dir", path)
        self.base.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.plan.hit("delete_dir_contents", path)
        self.base.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.plan.hit("delete_root_dir_contents", "/")
        self.base.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self.plan.hit("delete_file", path)
        self.base.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.plan.hit("move", f"{src} -> {dest}")
        self.base.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.plan.hit("copy_file", f"{src} -> {dest}")
        self.base.copy_file(src, dest)

    # --- counted opens; the streams count their own calls ------------------------------------

    def open_input_stream(self, path: str):
        self.plan.hit("open_input_stream", path)
        return pa.PythonFile(_CountingInput(self.base.open_input_file(path), self.plan, path), mode="r")

    def open_input_file(self, path: str):
        self.plan.hit("open_input_file", path)
        return pa.PythonFile(_CountingInput(self.base.open_input_file(path), self.plan, path), mode="r")

    def open_output_stream(self, path: str, metadata):
        self.plan.hit("open_output_stream", path)
        return pa.PythonFile(_CountingOutput(self.base.open_output_stream(path), self.plan, path), mode="w")

    def open_append_stream(self, path: str, metadata):
        self.plan.hit("open_append_stream", path)
        return pa.PythonFile(_CountingOutput(self.base.open_append_stream(path), self.plan, path), mode="w")


def failing_filesystem(root: str | os.PathLike[str], plan: FaultPlan | None = None) -> tuple[pafs.FileSystem, FailingHandler]:
    """A failing filesystem whose ``/`` is the local directory ``root``."""
    handler = FailingHandler(pafs.SubTreeFileSystem(os.fspath(root), pafs.LocalFileSystem()), plan)
    return pafs.PyFileSystem(handler), handler
