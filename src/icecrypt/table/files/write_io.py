"""Where the write path touches storage: one object decides, for a whole table, whether
files are encrypted, and every writer goes through it.

An encrypted table (one with an :class:`~icecrypt.keys.EncryptionManager`) has no code
path that writes plaintext: Avro goes through :func:`icecrypt.avro.write_records` with a
fresh key (AGS1), byte blobs through :func:`icecrypt.ags1.encrypt`, and Parquet through
:mod:`icecrypt.parquet`'s native encryption (see ``_write_data``).  Plaintext writing is
only reachable when the table has no manager, i.e. no ``encryption.key-id``.
"""

from __future__ import annotations

import contextlib
import posixpath
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow.fs as pafs

from icecrypt import ags1
from icecrypt.keys import EncryptionManager, StandardKeyMetadata
from icecrypt.parquet import _AtomicTarget  # the one output target of every table file
from icecrypt.table.files.io import open_plain_avro, read_whole

__all__ = ["TableIO"]


class TableIO:
    """Files of one table on one pyarrow filesystem.

    ``locations`` are paths as recorded in metadata (``<table location>/data/...``);
    ``to_fs_path`` maps them to paths on ``filesystem``.  ``manager`` is the table's
    encryption manager, or ``None`` for a plaintext table.
    """

    def __init__(
        self,
        filesystem: pafs.FileSystem | None,
        to_fs_path: Callable[[str], str],
        manager: EncryptionManager | None,
    ) -> None:
        self.filesystem = filesystem if filesystem is not None else pafs.LocalFileSystem()
        self.to_fs_path = to_fs_path
        self.manager = manager
        self._dirs: set[str] = set()
        self._lock = threading.Lock()

    @property
    def format_filesystem(self) -> pafs.FileSystem | None:
        """``filesystem`` as the format modules take it: None for the local one (they
        then write through a temporary file, fsync and rename)."""
        return None if isinstance(self.filesystem, pafs.LocalFileSystem) else self.filesystem

    @property
    def encrypted(self) -> bool:
        return self.manager is not None

    def new_file_key(self) -> StandardKeyMetadata | None:
        """A fresh DEK and AAD prefix for one file; None for a plaintext table."""
        return self.manager.new_file_key() if self.manager is not None else None

    def ensure_parent(self, location: str) -> str:
        """The filesystem path of ``location``, its directory created (once per process
        and table object; object stores accept the call and do nothing)."""
        path = self.to_fs_path(location)
        parent = posixpath.dirname(path)
        with self._lock:
            known = parent in self._dirs
        if not known:
            self.filesystem.create_dir(parent, recursive=True)
            with self._lock:
                self._dirs.add(parent)
        return path

    # --- Avro container files (manifests, manifest lists) ------------------------------

    def write_avro(
        self, location: str, avro_schema: dict, records: Iterable[dict], metadata: dict[str, str]
    ) -> tuple[int, StandardKeyMetadata | None]:
        """Write an Avro container file; returns (stored length, key metadata with
        file_length, or None for a plaintext table)."""
        from icecrypt.avro._container import DEFAULT_SYNC_INTERVAL, write_container, write_encrypted
        from icecrypt.avro import DEFAULT_DEFLATE_LEVEL

        path = self.ensure_parent(location)

        # the container Java writes (raw deflate, level 9, 64000-byte blocks), for both
        # kinds of table; the schemas are the table writer's own, so no separate check
        def body(sink: Any) -> None:
            write_container(sink, avro_schema, records, codec="deflate", sync_interval=DEFAULT_SYNC_INTERVAL,
                            metadata=dict(metadata), compression_level=DEFAULT_DEFLATE_LEVEL)

        if self.manager is not None:
            key = self.manager.new_file_key()
            key = key.with_file_length(write_encrypted(path, self.format_filesystem, key, body))
            return key.file_length, key
        # the same publication as the encrypted branch and the data files: a temporary
        # file made durable and renamed into place (locally), so both kinds of table
        # leave nothing under a final name unless it is complete, at the same cost
        target = _AtomicTarget(path, self.format_filesystem)
        try:
            body(target.stream)
            length = target.commit()
        except BaseException:
            target.discard()
            raise
        return length, None

    @contextlib.contextmanager
    def read_avro(self, location: str, key_metadata: Any) -> Iterator[Any]:
        """An iterable of the records of an Avro file, with ``.metadata`` (header).

        ``key_metadata`` must be given for an encrypted table: a plaintext Avro file
        there is refused by :func:`icecrypt.avro.read_records` (fail closed)."""
        path = self.to_fs_path(location)
        if self.manager is not None:
            from icecrypt.avro import _records

            if key_metadata is None:
                from icecrypt.errors import FormatError

                raise FormatError(f"{location}: no key metadata for a file of an encrypted table")
            with _records(path, key_metadata, self.filesystem, kind="metadata") as records:
                yield records
            return
        with open_plain_avro("Avro file", location, self.filesystem, path, kind="metadata") as records:
            yield records

    # --- small whole files (Puffin) ------------------------------------------------------

    def write_bytes(self, location: str, data: bytes) -> tuple[int, StandardKeyMetadata | None]:
        """Write ``data`` as one file, in AGS1 for an encrypted table."""
        path = self.ensure_parent(location)
        key = self.new_file_key()
        payload = data if key is None else ags1.encrypt(data, key.encryption_key, key.aad_prefix)
        target = _AtomicTarget(path, self.format_filesystem)  # complete under its name, or absent
        try:
            target.stream.write(payload)
            target.commit()
        except BaseException:
            target.discard()
            raise
        if key is not None:
            key = key.with_file_length(len(payload))
        return len(payload), key

    def read_bytes(self, location: str, key_metadata: StandardKeyMetadata | None) -> bytes:
        """The (decrypted) content of a small file written by :meth:`write_bytes` or Java."""
        path = self.to_fs_path(location)
        if self.manager is not None and key_metadata is None:
            from icecrypt.errors import FormatError

            raise FormatError(f"{location}: no key metadata for a file of an encrypted table")
        with self.filesystem.open_input_file(path) as f:
            data = read_whole(f, location, None if self.manager is None else key_metadata.file_length)
        if self.manager is None:
            return data
        return ags1.decrypt(data, key_metadata.encryption_key, key_metadata.aad_prefix, length=key_metadata.file_length)

    # --- housekeeping ----------------------------------------------------------------------

    def remove(self, location: str) -> None:
        """Delete a file if it exists (cleanup after failures and expiry)."""
        with contextlib.suppress(FileNotFoundError):
            self.filesystem.delete_file(self.to_fs_path(location))

    def exists(self, location: str) -> bool:
        return self.filesystem.get_file_info(self.to_fs_path(location)).type != pafs.FileType.NotFound
