"""Parquet files with native (modular) encryption, as Apache Iceberg writes them.

Iceberg does not wrap Parquet data and delete files in AGS1; it hands the file's
:class:`~icecrypt.keys.StandardKeyMetadata` to parquet-mr (SPEC.md section 5):

* algorithm ``AES_GCM_V1``, the DEK of the key metadata as *footer key*, used for the
  footer and every column (uniform encryption: no column keys, no footer key metadata);
* the key metadata's ``aad_prefix`` as AAD prefix, **not stored** in the file, so that a
  reader needs the key metadata and not just the key; the file AAD is that prefix
  followed by 8 random bytes (``aad_file_unique``) that are stored;
* an encrypted footer, so the file starts and ends with the magic ``PARE``.

This module does the same with pyarrow's direct-key encryption properties, so files
written here are read by Iceberg Java (parquet-mr) and the other way round.

Reading fails closed.  A GCM tag that does not verify (wrong key, wrong or missing AAD
prefix, tampered bytes) raises :class:`~icecrypt.AuthenticationError`; a file that cannot
be an encrypted Parquet file (a plaintext ``PAR1`` file, truncated or structurally
damaged bytes, a size other than the key metadata's ``file_length``) raises
:class:`~icecrypt.FormatError`.  Both name the file; neither contains key bytes.  Other
errors (missing file, permissions, network) propagate unchanged.

Data pages are always version 1.0 (Iceberg's default): Arrow and parquet-mr frame
encrypted version 2.0 pages differently (Arrow encrypts the levels with the values,
parquet-mr leaves the levels in clear), so such pages written by one cannot be read by
the other.  Writing them is refused; reading a parquet-mr file that has them fails with
a :class:`~icecrypt.FormatError` (the framing does not add up), never with wrong rows.

Writing is atomic: the file is written under a temporary name in the target directory and
renamed to its final name only once the footer is written, so a failed write leaves no
file that looks valid.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import secrets
import tempfile
import warnings
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pqe

from icecrypt._atomic import fsync_directory, renames_atomically
from icecrypt._encrypting import is_encrypted_filesystem
from icecrypt.errors import AuthenticationError, FormatError
from icecrypt.keys import StandardKeyMetadata
from icecrypt.keys.manager import AAD_PREFIX_LENGTH, DEFAULT_DATA_KEY_LENGTH

if TYPE_CHECKING:
    from icecrypt.keys import EncryptionManager

__all__ = [
    "DEFAULT_COMPRESSION",
    "DEFAULT_KEY_LENGTH",
    "EncryptedParquetFile",
    "EncryptedParquetWriter",
    "decryption_properties",
    "encryption_properties",
    "open_file",
    "open_writer",
    "read_table",
    "write_table",
]

#: Iceberg's ``write.parquet.compression-codec`` default
DEFAULT_COMPRESSION = "zstd"
#: Iceberg's ``encryption.data-key-length`` default (TableProperties.ENCRYPTION_DEK_LENGTH_DEFAULT)
DEFAULT_KEY_LENGTH = DEFAULT_DATA_KEY_LENGTH
_KEY_LENGTHS = (16, 24, 32)

KeyMetadataLike = StandardKeyMetadata | bytes | bytearray | memoryview
PathLike = str | os.PathLike[str]

# What pyarrow (Arrow C++ 26) reports, mapped to icecrypt errors.  Only these messages
# are translated: anything else (a missing file, a network error) is not a statement
# about the file's bytes and propagates as it is.  Authentication failures are checked
# first (a page whose tag fails also reports "Deserializing page header failed").
_AUTHENTICATION_FAILURES = (
    ("Failed decryption finalization", "GCM tag check failed: wrong key or AAD prefix, or tampered data"),
    # a plaintext (signed) footer, which Iceberg does not write but parquet-mr reads
    ("Parquet crypto signature verification failed", "footer signature check failed: wrong key or AAD prefix, or tampered data"),
    (
        "not stored in file and not supplied in decryption properties",
        "the file was encrypted with an AAD prefix and the key metadata has none",
    ),
    (
        "AAD Prefix set in decryption properties, but was not used for file encryption",
        "the key metadata has an AAD prefix but the file was encrypted without one",
    ),
    ("AAD Prefix in file and in properties is not the same", "the AAD prefix stored in the file is not the key metadata's"),
)
# pyarrow.parquet.read_table's prefix, which names our already opened file "<Buffer>"
_SOURCE_PREFIX = re.compile(r"^Could not open Parquet input source '[^']*': ")
_PLAINTEXT_FILE = "Applying decryption properties on plaintext file"
# Structural damage: the plaintext parts of an encrypted-footer file (magic, footer
# length, FileCryptoMetaData, the length prefix of each encrypted module) do not add up.
# Matched case-insensitively against Arrow's messages for these conditions.
_DAMAGE_MARKERS = (
    "magic bytes not found",
    "parquet file size is",
    "ciphertext",  # "Serialized ciphertext length ...", "Invalid ciphertext length ...", ...
    "plaintext buffer length",
    "encrypted metadata buffer",
    "deserialize thrift",
    "page header",
    "corrupt",
    "unsupported algorithm",
    "invalid footer encryption signature",  # too short to hold nonce and tag
    "failed decryption update",
)


# --- key metadata and encryption properties ------------------------------------------


def _key_metadata(key_metadata: Any, name: str | None = None) -> StandardKeyMetadata:
    """``key_metadata`` as a StandardKeyMetadata with a usable AES key."""
    where = f"{name}: " if name else ""
    if key_metadata is None:
        raise ValueError(f"{where}key metadata is required for an encrypted Parquet file")
    if not isinstance(key_metadata, StandardKeyMetadata):
        if isinstance(key_metadata, str):
            raise TypeError(f"{where}key metadata must be StandardKeyMetadata or bytes, not str")
        try:
            key_metadata = StandardKeyMetadata.decode(key_metadata)
        except FormatError as exc:
            raise FormatError(f"{where}malformed key metadata: {exc}") from None
    if key_metadata.key_length not in _KEY_LENGTHS:
        raise ValueError(
            f"{where}invalid encryption key length in key metadata: {key_metadata.key_length} "
            "(must be 16, 24, or 32 bytes)"
        )
    return key_metadata


def _reject_option(options: dict[str, Any], name: str) -> None:
    if name in options:
        raise TypeError(f"icecrypt.parquet sets {name} itself; it cannot be passed as an option")


def encryption_properties(key_metadata: KeyMetadataLike) -> pq.FileEncryptionProperties:
    """pyarrow encryption properties that write a file the way Iceberg Java does:
    AES_GCM_V1, footer key = DEK, AAD prefix not stored, encrypted footer."""
    km = _key_metadata(key_metadata)
    return pqe.create_encryption_properties(
        km.encryption_key,
        aad_prefix=km.aad_prefix or None,
        store_aad_prefix=False,
        encryption_algorithm="AES_GCM_V1",
        plaintext_footer=False,
    )


def decryption_properties(key_metadata: KeyMetadataLike) -> pq.FileDecryptionProperties:
    """pyarrow decryption properties for a file written with ``key_metadata``: footer
    key = DEK, AAD prefix supplied, footer integrity checked, plaintext files refused."""
    km = _key_metadata(key_metadata)
    return pqe.create_decryption_properties(
        km.encryption_key,
        aad_prefix=km.aad_prefix or None,
        check_footer_integrity=True,
        allow_plaintext_files=False,
    )


# --- errors ----------------------------------------------------------------------------


def _translate(exc: BaseException, name: str) -> BaseException | None:
    """The icecrypt error for a pyarrow exception raised while decrypting ``name``,
    or None when the exception says nothing about the file's bytes."""
    if type(exc) not in (OSError, pa.ArrowInvalid):
        return None
    message = str(exc)
    for needle, what in _AUTHENTICATION_FAILURES:
        if needle in message:
            return AuthenticationError(f"{name}: {what}")
    if _PLAINTEXT_FILE in message:
        return FormatError(f"{name}: plaintext Parquet file (PAR1) where an encrypted one (PARE) is expected")
    lowered = message.lower()
    if any(marker in lowered for marker in _DAMAGE_MARKERS):
        detail = _SOURCE_PREFIX.sub("", message).strip()
        return FormatError(f"{name}: not an intact encrypted Parquet file: {detail}")
    return None


@contextlib.contextmanager
def _decrypting(name: str) -> Iterator[None]:
    """Raise the icecrypt error for what pyarrow reports about an encrypted file."""
    try:
        yield
    except (OSError, pa.ArrowInvalid) as exc:
        translated = _translate(exc, name)
        if translated is None:
            raise
        raise translated from exc


# --- file systems ----------------------------------------------------------------------


def _resolve(path: PathLike, filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path to use; None means the local file system."""
    if filesystem is None:
        return pafs.LocalFileSystem(), os.path.abspath(os.fspath(path))
    if not isinstance(filesystem, pafs.FileSystem):
        raise TypeError(f"filesystem must be a pyarrow.fs.FileSystem, not {type(filesystem).__name__}")
    if is_encrypted_filesystem(filesystem):
        raise ValueError(
            "icecrypt.parquet encrypts natively: pass the EncryptedFileSystem's base filesystem "
            "(the handler's .base), not the EncryptedFileSystem itself"
        )
    if not isinstance(path, str):
        path = os.fspath(path)
    return filesystem, path


def _display_name(path: PathLike) -> str:
    return os.fsdecode(os.fspath(path))


def _open_input(path: PathLike, filesystem: pafs.FileSystem | None, km: StandardKeyMetadata) -> pa.NativeFile:
    """Open the stored file, checking its size against the key metadata's file_length."""
    fs, resolved = _resolve(path, filesystem)
    source = fs.open_input_file(resolved)
    expected = km.file_length
    if expected is not None:
        size = source.size()
        if size != expected:
            source.close()
            state = "truncated" if size < expected else "longer than written"
            raise FormatError(
                f"{_display_name(path)}: encrypted Parquet file is {state}: "
                f"{size} bytes, key metadata file_length is {expected}"
            )
    return source


# --- reading ---------------------------------------------------------------------------


class EncryptedParquetFile(pq.ParquetFile):
    """A :class:`pyarrow.parquet.ParquetFile` over an encrypted file.

    The footer has been decrypted and authenticated when the object exists; every read
    decrypts and authenticates the pages it touches, and reports failures as
    :class:`~icecrypt.AuthenticationError` / :class:`~icecrypt.FormatError` naming the
    file.  Closing it closes the underlying file.
    """

    def __init__(self, source: pa.NativeFile, name: str, km: StandardKeyMetadata, **read_options: Any):
        self.name = name
        self._source = source
        with _decrypting(name):
            super().__init__(source, decryption_properties=decryption_properties(km), **read_options)
        self._close_source = True

    def close(self, force: bool = False) -> None:
        super().close(force=True)
        self._source.close()

    def read_row_group(self, *args: Any, **kwargs: Any) -> pa.Table:
        with _decrypting(self.name):
            return super().read_row_group(*args, **kwargs)

    def read_row_groups(self, *args: Any, **kwargs: Any) -> pa.Table:
        with _decrypting(self.name):
            return super().read_row_groups(*args, **kwargs)

    def read(self, *args: Any, **kwargs: Any) -> pa.Table:
        with _decrypting(self.name):
            return super().read(*args, **kwargs)

    def scan_contents(self, *args: Any, **kwargs: Any) -> int:
        with _decrypting(self.name):
            return super().scan_contents(*args, **kwargs)

    def iter_batches(self, *args: Any, **kwargs: Any) -> Iterator[pa.RecordBatch]:
        with _decrypting(self.name):
            batches = super().iter_batches(*args, **kwargs)
        while True:
            with _decrypting(self.name):
                try:
                    batch = next(batches)
                except StopIteration:
                    return
            yield batch

    def __repr__(self) -> str:
        return f"<EncryptedParquetFile name={self.name!r}>"


def open_file(
    path: PathLike,
    key_metadata: KeyMetadataLike,
    *,
    filesystem: pafs.FileSystem | None = None,
    **read_options: Any,
) -> EncryptedParquetFile:
    """Open an encrypted Parquet file for metadata and row-group reads.

    ``read_options`` go to :class:`pyarrow.parquet.ParquetFile` (``read_dictionary``,
    ``pre_buffer``, ``buffer_size``, ...).  The footer is decrypted and authenticated
    here; a wrong key or AAD prefix fails now, not at the first read.
    """
    name = _display_name(path)
    km = _key_metadata(key_metadata, name)
    _reject_option(read_options, "decryption_properties")
    source = _open_input(path, filesystem, km)
    try:
        return EncryptedParquetFile(source, name, km, **read_options)
    except BaseException:
        source.close()
        raise


def read_table(
    path: PathLike,
    key_metadata: KeyMetadataLike,
    *,
    filesystem: pafs.FileSystem | None = None,
    columns: list[str] | None = None,
    filters: Any = None,
    **read_options: Any,
) -> pa.Table:
    """Read a whole encrypted Parquet file into a table.

    ``columns`` selects columns; ``filters`` is a :class:`pyarrow.compute.Expression` or
    the DNF list form of :func:`pyarrow.parquet.read_table` (row groups whose statistics
    exclude the filter are not read).  Further ``read_options`` go to
    :func:`pyarrow.parquet.read_table` (``use_threads``, ``read_dictionary``, ...).
    """
    name = _display_name(path)
    km = _key_metadata(key_metadata, name)
    _reject_option(read_options, "decryption_properties")
    props = decryption_properties(km)
    with _open_input(path, filesystem, km) as source, _decrypting(name):
        return pq.read_table(source, columns=columns, filters=filters, decryption_properties=props, **read_options)


# --- writing ---------------------------------------------------------------------------


def _new_key_metadata(
    key_metadata: KeyMetadataLike | None, key_length: int | None, manager: EncryptionManager | None
) -> StandardKeyMetadata:
    """The key metadata of a file about to be written (fresh keys unless given)."""
    given = [n for n, v in (("key_metadata", key_metadata), ("key_length", key_length), ("manager", manager)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"pass at most one of key_metadata, key_length and manager (got {', '.join(given)})")
    if key_metadata is not None:
        return _key_metadata(key_metadata).with_file_length(None)
    if manager is not None:
        return _key_metadata(manager.new_file_key())
    length = DEFAULT_KEY_LENGTH if key_length is None else key_length
    if length not in _KEY_LENGTHS:
        raise ValueError(f"invalid key_length {length} (must be 16, 24, or 32)")
    return StandardKeyMetadata(secrets.token_bytes(length), secrets.token_bytes(AAD_PREFIX_LENGTH))


_WRITE_BUFFER = 1 << 20


class _AtomicTarget:
    """The output stream of one file being written, published by :meth:`commit` and
    removed by :meth:`discard`.

    Locally (``filesystem=None``) the data goes to a temporary file created exclusively
    beside the target (mode 0600, like every icecrypt writer) and is made durable before
    the rename.  On a filesystem whose ``move`` is a rename (local, HDFS, and SubTree views
    of them) the data goes to a hidden temporary name that is moved into place.  Object
    stores publish an object only when its upload completes, so there the stream writes
    the target directly; pyarrow cannot abort an upload (closing or dropping the stream
    completes it), so a failed write is first made invalid (it ends with zero bytes where
    Parquet needs its magic) and the object is then deleted.  Unlike the renaming cases,
    a failed write on an object store therefore removes an object that was already there.
    """

    def __init__(self, path: PathLike, filesystem: pafs.FileSystem | None):
        self.name = _display_name(path)
        self._local = filesystem is None
        self._fs, self.path = _resolve(path, filesystem)
        self._tmp: str | None = None
        if self._local:
            directory, base = os.path.split(self.path)
            fd, self._tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
            os.close(fd)
        elif renames_atomically(self._fs):
            directory, base = posixpath.split(self.path)
            self._tmp = posixpath.join(directory, f".{base}.{secrets.token_hex(8)}.tmp")
        self._target = self._tmp or self.path
        try:
            # Arrow's writer hands the stream each page and footer part: buffered, they reach
            # the filesystem in MiB writes (a local file: few syscalls; a store: whole parts)
            self.stream = self._fs.open_output_stream(self._target, buffer_size=_WRITE_BUFFER)
        except BaseException:
            self._remove_tmp()
            raise

    def commit(self) -> int:
        """Close the stream and publish the file; returns its length.  On failure the
        caller must :meth:`discard`."""
        length = self.stream.tell()
        self.stream.close()
        if self._local:
            fd = os.open(self._tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self._tmp, self.path)
            self._tmp = None
            fsync_directory(os.path.dirname(self.path))
        elif self._tmp is not None:
            self._fs.move(self._tmp, self.path)
            self._tmp = None
        return length

    def discard(self) -> None:
        """Leave nothing that looks like a valid file.  Idempotent."""
        if self._tmp is not None:
            with contextlib.suppress(Exception):
                self.stream.close()
            self._remove_tmp()
            return
        if self.stream.closed:
            return
        try:
            self.stream.write(b"\0\0\0\0")
            self.stream.close()
        except (OSError, pa.ArrowException):
            return  # nothing was published
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_file(self.path)

    def _remove_tmp(self) -> None:
        if self._tmp is None:
            return
        with contextlib.suppress(FileNotFoundError):
            if self._local:
                os.unlink(self._tmp)
            else:
                self._fs.delete_file(self._tmp)
        self._tmp = None


class EncryptedParquetWriter:
    """Writes one encrypted Parquet file, row group by row group.

    Like :class:`pyarrow.parquet.ParquetWriter` (``write_table``, ``write_batch``,
    ``write``), except that :meth:`close` returns the file's key metadata with
    ``file_length`` set, and that the file only appears under its name after a clean
    close.  Any exception while writing, or leaving a ``with`` block with one, removes
    the partial file (:meth:`abort`).
    """

    def __init__(self, target: _AtomicTarget, schema: pa.Schema, km: StandardKeyMetadata, options: dict[str, Any]):
        self._target = target
        self._key_metadata = km
        self._result: StandardKeyMetadata | None = None
        self._aborted = False
        try:
            self._writer = pq.ParquetWriter(
                target.stream, schema, encryption_properties=encryption_properties(km), **options
            )
        except BaseException:
            target.discard()
            raise

    @property
    def name(self) -> str:
        return self._target.name

    @property
    def schema(self) -> pa.Schema:
        return self._writer.schema

    @property
    def key_metadata(self) -> StandardKeyMetadata:
        """The file's key metadata (``file_length`` is set once closed)."""
        return self._result or self._key_metadata

    @property
    def closed(self) -> bool:
        return self._result is not None or self._aborted

    def _check_open(self) -> None:
        if self._aborted:
            raise ValueError(f"{self.name}: the writer was aborted")
        if self._result is not None:
            raise ValueError(f"{self.name}: the writer is closed")

    def write_table(self, table: pa.Table, row_group_size: int | None = None) -> None:
        """Write ``table`` as one or more row groups."""
        self._check_open()
        try:
            self._writer.write_table(table, row_group_size=row_group_size)
        except BaseException:
            self.abort()
            raise

    def write_batch(self, batch: pa.RecordBatch, row_group_size: int | None = None) -> None:
        """Write ``batch`` as one or more row groups."""
        self.write_table(pa.Table.from_batches([batch], batch.schema), row_group_size)

    def write(self, table_or_batch: pa.Table | pa.RecordBatch, row_group_size: int | None = None) -> None:
        """Write a Table or a RecordBatch."""
        if isinstance(table_or_batch, pa.RecordBatch):
            self.write_batch(table_or_batch, row_group_size)
        elif isinstance(table_or_batch, pa.Table):
            self.write_table(table_or_batch, row_group_size)
        else:
            raise TypeError(f"expected a pyarrow Table or RecordBatch, not {type(table_or_batch).__name__}")

    def close(self) -> StandardKeyMetadata:
        """Write the footer, move the file into place and return its key metadata
        (with ``file_length``).  Closing again returns the same key metadata."""
        if self._result is not None:
            return self._result
        self._check_open()
        try:
            self._writer.close()
            length = self._target.commit()
        except BaseException:
            self.abort()
            raise
        self._result = self._key_metadata.with_file_length(length)
        return self._result

    def abort(self) -> None:
        """Give up: nothing appears under the file's name.  Idempotent."""
        if self._result is not None or self._aborted:
            return
        self._aborted = True
        with contextlib.suppress(Exception):
            self._writer.close()
        self._target.discard()

    def __del__(self) -> None:
        if getattr(self, "_result", True) is None and not getattr(self, "_aborted", True):
            warnings.warn(f"unclosed encrypted Parquet writer {self.name!r}: output discarded", ResourceWarning)
            self.abort()

    def __enter__(self) -> EncryptedParquetWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._result is not None else "aborted" if self._aborted else "open"
        return f"<EncryptedParquetWriter name={self.name!r} {state}>"


def _writer_options(options: dict[str, Any]) -> dict[str, Any]:
    _reject_option(options, "encryption_properties")
    if str(options.get("data_page_version", "1.0")) != "1.0":
        # Arrow encrypts a whole V2 data page (levels and values) as one module, while
        # parquet-mr leaves the levels in clear and encrypts only the values: neither
        # can read the other's encrypted V2 pages of nullable or repeated columns.
        raise ValueError(
            "encrypted Parquet files are written with data_page_version='1.0': Iceberg Java "
            "(parquet-mr) cannot read pyarrow's encrypted version 2.0 data pages"
        )
    options.setdefault("compression", DEFAULT_COMPRESSION)
    return options


def open_writer(
    path: PathLike,
    schema: pa.Schema,
    *,
    filesystem: pafs.FileSystem | None = None,
    key_metadata: KeyMetadataLike | None = None,
    key_length: int | None = None,
    manager: EncryptionManager | None = None,
    **writer_options: Any,
) -> EncryptedParquetWriter:
    """A writer of one encrypted Parquet file at ``path``.

    Keys: ``key_metadata`` if given (its ``file_length`` is replaced), else
    ``manager.new_file_key()`` of an :class:`~icecrypt.keys.EncryptionManager` (keys of
    the table's ``encryption.data-key-length``), else a fresh random DEK of
    ``key_length`` bytes (default 16) and a fresh 16-byte AAD prefix.
    ``writer_options`` go to :class:`pyarrow.parquet.ParquetWriter` (``compression``,
    default zstd like Iceberg; ``compression_level``, ``data_page_size``,
    ``use_dictionary``, ...).
    """
    km = _new_key_metadata(key_metadata, key_length, manager)
    options = _writer_options(dict(writer_options))
    return EncryptedParquetWriter(_AtomicTarget(path, filesystem), schema, km, options)


def write_table(
    table: pa.Table | pa.RecordBatch,
    path: PathLike,
    *,
    filesystem: pafs.FileSystem | None = None,
    key_metadata: KeyMetadataLike | None = None,
    key_length: int | None = None,
    manager: EncryptionManager | None = None,
    **writer_options: Any,
) -> StandardKeyMetadata:
    """Write ``table`` to an encrypted Parquet file and return its key metadata, with
    ``file_length`` set to the size of the written file.

    Keys and ``writer_options`` as for :func:`open_writer`; ``row_group_size`` (rows per
    row group) is accepted too, as by :func:`pyarrow.parquet.write_table`.
    """
    options = dict(writer_options)
    row_group_size = options.pop("row_group_size", None)
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table], table.schema)
    elif not isinstance(table, pa.Table):
        raise TypeError(f"expected a pyarrow Table or RecordBatch, not {type(table).__name__}")
    with open_writer(
        path, table.schema, filesystem=filesystem, key_metadata=key_metadata,
        key_length=key_length, manager=manager, **options,
    ) as writer:
        writer.write_table(table, row_group_size=row_group_size)
    return writer.key_metadata
