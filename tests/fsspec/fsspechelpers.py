"""Helpers of the icecrypt.fsspec tests (a module of its own: test directories share the
module name ``conftest``)."""

from __future__ import annotations

from fsspec.implementations.memory import MemoryFileSystem


class CountingMemoryFileSystem(MemoryFileSystem):
    """fsspec's memory filesystem with a store of its own that records every ranged
    ``cat_file`` (how the encrypted filesystem fetches ciphertext) and every ``open``."""

    cachable = False
    store: dict = {}  # noqa: RUF012 - fsspec's memory filesystem keeps its files on the class
    pseudo_dirs = [""]  # noqa: RUF012

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reset()

    def reset(self) -> None:
        self.ranges: list[tuple[int | None, int | None]] = []
        self.opens = 0

    def cat_file(self, path, start=None, end=None, **kwargs):
        self.ranges.append((start, end))
        return super().cat_file(path, start=start, end=end, **kwargs)

    def _open(self, path, mode="rb", *args, **kwargs):
        self.opens += 1
        return super()._open(path, mode, *args, **kwargs)

    @property
    def bytes_read(self) -> int:
        return sum(end - start for start, end in self.ranges)
