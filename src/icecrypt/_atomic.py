"""Files that appear under their final name complete, or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any

# pyarrow filesystem types whose ``move`` is an atomic rename (of a file within its
# directory, or of a whole directory)
_RENAMING_TYPES = frozenset({"local", "hdfs", "mock"})


def renames_atomically(filesystem: Any) -> bool:
    """Whether ``filesystem.move`` (a pyarrow filesystem, or a SubTree view of one) is a
    rename: object stores copy and delete instead."""
    import pyarrow.fs as pafs

    while isinstance(filesystem, pafs.SubTreeFileSystem):
        filesystem = filesystem.base_fs
    return filesystem.type_name in _RENAMING_TYPES


def fsync_directory(directory: str) -> None:
    """Make a rename or link in ``directory`` durable (best effort: not every file
    system can open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        # best effort to the end: the rename already happened, so a failed close must
        # not turn a published file into a reported failure
        with contextlib.suppress(OSError):
            os.close(fd)


class AtomicFile:
    """A temporary file beside ``path`` that becomes ``path`` on :meth:`commit` and is
    removed on :meth:`discard`.

    The temporary file is created exclusively with mode 0600 in the target's directory
    (so the final rename never crosses file systems); ``file`` is an unbuffered binary
    file.  As a context manager, a clean exit commits with the defaults and an exception
    discards.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.path.abspath(os.fspath(path))
        directory, base = os.path.split(self.path)
        fd, self._tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
        self.file = open(fd, "wb", buffering=0)
        self._done = False

    def commit(self, *, fsync: bool = True, overwrite: bool = True) -> None:
        """Move the data to ``path``: replacing what is there, or with ``overwrite=False``
        raising FileExistsError instead.  ``fsync`` makes data and name durable first.
        On any failure the temporary file is removed."""
        try:
            if fsync:
                os.fsync(self.file.fileno())
            self.file.close()
            if overwrite:
                os.replace(self._tmp, self.path)
            else:
                os.link(self._tmp, self.path)
                os.unlink(self._tmp)
            self._tmp = None
            if fsync:
                fsync_directory(os.path.dirname(self.path))
        except BaseException:
            self.discard()
            raise
        self._done = True

    def discard(self) -> None:
        """Remove the temporary file; ``path`` is left as it was.  Idempotent."""
        self._done = True
        self.file.close()
        if self._tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = None

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.discard()
        elif not self._done:
            self.commit()
