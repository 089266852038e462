"""Which pyarrow filesystems encrypt, known below every module that must not encrypt twice.

:mod:`icecrypt.arrow` makes encrypting filesystems; key manifests, Avro and Parquet
writers refuse to write through one (their bytes are already encrypted, or hold wrapped
keys).  Those modules sit below :mod:`icecrypt.arrow` in the package, so the test and the
marker it tests for live here, importing nothing of icecrypt.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EncryptingHandler", "is_encrypted_filesystem"]


class EncryptingHandler:
    """Marker base of the :class:`pyarrow.fs.FileSystemHandler` classes whose filesystems
    encrypt what is written through them (``icecrypt.arrow.EncryptedFileSystemHandler``)."""

    __slots__ = ()


def is_encrypted_filesystem(filesystem: Any) -> bool:
    """Whether ``filesystem`` encrypts: a :class:`pyarrow.fs.PyFileSystem` made by
    :meth:`icecrypt.arrow.EncryptedFileSystem.wrap`, or a SubTreeFileSystem view of one (for
    callers that must not encrypt twice)."""
    import pyarrow.fs as pafs

    while isinstance(filesystem, pafs.SubTreeFileSystem):
        filesystem = filesystem.base_fs
    return isinstance(filesystem, pafs.PyFileSystem) and isinstance(filesystem.handler, EncryptingHandler)
